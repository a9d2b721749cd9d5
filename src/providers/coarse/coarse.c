/* hetmem — the coarse layer (see coarse.h for the model and the contract).
 * SPDX-License-Identifier: MIT */
#include "providers/coarse/coarse.h"

#include <stdlib.h>
#include <string.h>

/* ---- treap: Aragon & Seidel, "Randomized Search Trees" (1989/1996) ----
 *
 * A binary search tree by key and a max-heap by a random priority. Insert
 * splits the subtree where the new node's priority wins; delete joins the
 * node's two subtrees. Both walk one root-to-node path: expected O(log n).
 * Nodes are intrusive; the key order is given by a comparison function. */

typedef struct tnode {
    struct tnode *l, *r;
    uint32_t prio;
} tnode_t;

typedef int (*tcmp_fn)(const tnode_t *a, const tnode_t *b);

/* Split t into nodes ordered before k (*l) and the others (*r). */
static void t_split(tnode_t *t, const tnode_t *k, tcmp_fn cmp, tnode_t **l, tnode_t **r) {
    while (t) {
        if (cmp(t, k) < 0) {
            *l = t;
            l = &t->r;
            t = t->r;
        } else {
            *r = t;
            r = &t->l;
            t = t->l;
        }
    }
    *l = *r = NULL;
}

/* Join two treaps, every key of a before every key of b. */
static tnode_t *t_join(tnode_t *a, tnode_t *b) {
    tnode_t *root = NULL, **link = &root;
    while (a && b) {
        if (a->prio >= b->prio) {
            *link = a;
            link = &a->r;
            a = a->r;
        } else {
            *link = b;
            link = &b->l;
            b = b->l;
        }
    }
    *link = a ? a : b;
    return root;
}

static void t_insert(tnode_t **root, tnode_t *n, tcmp_fn cmp) {
    tnode_t **link = root;
    while (*link && (*link)->prio >= n->prio) link = cmp(n, *link) < 0 ? &(*link)->l : &(*link)->r;
    t_split(*link, n, cmp, &n->l, &n->r);
    *link = n;
}

static void t_remove(tnode_t **root, tnode_t *n, tcmp_fn cmp) {
    tnode_t **link = root;
    while (*link != n) {
        if (hm_unlikely(!*link)) HM_DIE("coarse: tree node %p not found", (void *)n);
        link = cmp(n, *link) < 0 ? &(*link)->l : &(*link)->r;
    }
    *link = t_join(n->l, n->r);
    n->l = n->r = NULL;
}

/* ---- blocks and regions ---- */

typedef struct region {
    uintptr_t base;
    size_t size;
    uint64_t tag;
    struct region *next; /* all regions, newest first */
} region_t;

typedef struct block {
    tnode_t by_addr;          /* every block, keyed by base */
    tnode_t by_size;          /* free blocks only, keyed by (size, base) */
    uintptr_t base;
    size_t size;
    struct block *prev, *next; /* address neighbours inside the same region */
    region_t *region;
    bool used;
} block_t;

#define ADDR_BLOCK(n) hm_container_of(n, block_t, by_addr)
#define SIZE_BLOCK(n) hm_container_of(n, block_t, by_size)

static int cmp_addr(const tnode_t *a, const tnode_t *b) {
    uintptr_t x = ADDR_BLOCK(a)->base, y = ADDR_BLOCK(b)->base;
    return x < y ? -1 : x > y;
}

static int cmp_size(const tnode_t *a, const tnode_t *b) {
    const block_t *x = SIZE_BLOCK(a), *y = SIZE_BLOCK(b);
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    return x->base < y->base ? -1 : x->base > y->base;
}

/* Spare block records kept for reuse (bounded). */
#define SPARE_MAX 64

struct hm_coarse {
    pthread_mutex_t lock;
    hm_coarse_ops_t ops;
    void *owner;
    size_t gran;
    /* Guarded by lock: */
    tnode_t *addr_root;
    tnode_t *size_root;
    region_t *regions;
    block_t *spare; /* singly linked through ->next */
    size_t nspare;
    uint64_t rng;   /* xorshift64 state for treap priorities */
    hm_coarse_stats_t st; /* largest_free is computed on read */
};

static uint32_t next_prio(hm_coarse_t *c) {
    /* xorshift64 (Marsaglia, "Xorshift RNGs", J. Stat. Soft. 8(14), 2003). */
    uint64_t x = c->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c->rng = x;
    return (uint32_t)(x >> 32);
}

/* Make sure n block records are at hand, so that an operation never fails
 * half-way. Called with the lock held (malloc is not a system call on the
 * fast path; the bound keeps the spare list small). */
static int reserve_blocks(hm_coarse_t *c, size_t n) {
    while (c->nspare < n) {
        block_t *b = malloc(sizeof(*b));
        if (!b) return 0;
        b->next = c->spare;
        c->spare = b;
        c->nspare++;
    }
    return 1;
}

static block_t *take_block(hm_coarse_t *c) {
    block_t *b = c->spare;
    HM_ASSERT(b);
    c->spare = b->next;
    c->nspare--;
    memset(b, 0, sizeof(*b));
    return b;
}

static void drop_block(hm_coarse_t *c, block_t *b) {
    if (c->nspare >= SPARE_MAX) {
        free(b);
        return;
    }
    b->next = c->spare;
    c->spare = b;
    c->nspare++;
}

static void size_insert(hm_coarse_t *c, block_t *b) {
    b->by_size.prio = next_prio(c);
    t_insert(&c->size_root, &b->by_size, cmp_size);
    c->st.free_blocks++;
}

static void size_remove(hm_coarse_t *c, block_t *b) {
    t_remove(&c->size_root, &b->by_size, cmp_size);
    c->st.free_blocks--;
}

static void addr_insert(hm_coarse_t *c, block_t *b) {
    b->by_addr.prio = next_prio(c);
    t_insert(&c->addr_root, &b->by_addr, cmp_addr);
}

static void addr_remove(hm_coarse_t *c, block_t *b) {
    t_remove(&c->addr_root, &b->by_addr, cmp_addr);
}

/* The block with the largest base <= addr, or NULL. */
static block_t *addr_floor(const hm_coarse_t *c, uintptr_t addr) {
    const tnode_t *t = c->addr_root;
    block_t *best = NULL;
    while (t) {
        block_t *b = ADDR_BLOCK(t);
        if (b->base <= addr) {
            best = b;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best;
}

/* The free block with the smallest (size, base) >= (size, base), or NULL. */
static block_t *size_lower_bound(const hm_coarse_t *c, size_t size, uintptr_t base) {
    const tnode_t *t = c->size_root;
    block_t *best = NULL;
    while (t) {
        block_t *b = SIZE_BLOCK(t);
        if (b->size > size || (b->size == size && b->base >= base)) {
            best = b;
            t = t->l;
        } else {
            t = t->r;
        }
    }
    return best;
}

static size_t largest_free(const hm_coarse_t *c) {
    const tnode_t *t = c->size_root;
    if (!t) return 0;
    while (t->r) t = t->r;
    return SIZE_BLOCK(t)->size;
}

/* ---- create / destroy / regions ---- */

hm_result_t hm__coarse_create(const hm_coarse_ops_t *ops, void *owner, size_t granularity,
                              hm_coarse_t **out) {
    *out = NULL;
    if (!hm_is_pow2(granularity)) {
        HM_LOG_ERROR("coarse: granularity %zu is not a power of two", granularity);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_coarse_t *c = calloc(1, sizeof(*c));
    if (!c) return HM_ERROR_OUT_OF_HOST_MEMORY;
    int e = pthread_mutex_init(&c->lock, NULL);
    if (e) {
        free(c);
        return hm__errno_result(e, "pthread_mutex_init");
    }
    if (ops) c->ops = *ops;
    c->owner = owner;
    c->gran = granularity;
    c->rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)c;
    if (!c->rng) c->rng = 1;
    *out = c;
    return HM_SUCCESS;
}

static void free_tree(tnode_t *t) {
    while (t) {
        /* Rotate the left subtree away so that no recursion is needed. */
        if (t->l) {
            tnode_t *l = t->l;
            t->l = l->r;
            l->r = t;
            t = l;
        } else {
            tnode_t *r = t->r;
            free(ADDR_BLOCK(t));
            t = r;
        }
    }
}

void hm__coarse_destroy(hm_coarse_t *c) {
    if (!c) return;
    if (c->st.used_blocks)
        HM_LOG_DEBUG("coarse: destroyed with %zu used blocks (%zu bytes)", c->st.used_blocks,
                     c->st.allocated);
    for (region_t *r = c->regions, *next; r; r = next) {
        next = r->next;
        if (c->ops.release) c->ops.release(c->owner, (void *)r->base, r->size, r->tag);
        free(r);
    }
    free_tree(c->addr_root);
    while (c->spare) {
        block_t *b = c->spare;
        c->spare = b->next;
        free(b);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}


/* Records the region [base, +len) as one free block (*blk, if blk is not
 * NULL). */
static hm_result_t add_region_locked(hm_coarse_t *c, uintptr_t base, size_t len, uint64_t tag,
                                     block_t **blk) {
    uintptr_t last;
    if (!base || !len || (base & (c->gran - 1)) || (len & (c->gran - 1)) ||
        __builtin_add_overflow(base, len - 1, &last)) {
        HM_LOG_ERROR("coarse: region [%#zx, +%zu) is empty, wraps or is not aligned to %zu",
                     (size_t)base, len, c->gran);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    /* Blocks tile the regions, so the block at or below the region's last
     * byte tells whether the new region overlaps one already known. */
    block_t *f = addr_floor(c, last);
    if (f && f->base + f->size > base) {
        HM_LOG_ERROR("coarse: region [%#zx, +%zu) overlaps [%#zx, +%zu)", (size_t)base, len,
                     (size_t)f->region->base, f->region->size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    region_t *r = malloc(sizeof(*r));
    if (!r || !reserve_blocks(c, 1)) {
        free(r);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    r->base = base;
    r->size = len;
    r->tag = tag;
    r->next = c->regions;
    c->regions = r;
    block_t *b = take_block(c);
    b->base = base;
    b->size = len;
    b->region = r;
    addr_insert(c, b);
    size_insert(c, b);
    c->st.mapped += len;
    c->st.free += len;
    c->st.regions++;
    if (blk) *blk = b;
    return HM_SUCCESS;
}

hm_result_t hm__coarse_add_region(hm_coarse_t *c, void *base, size_t len, uint64_t tag) {
    hm__mutex_lock(&c->lock);
    hm_result_t r = add_region_locked(c, (uintptr_t)base, len, tag, NULL);
    hm__mutex_unlock(&c->lock);
    return r;
}

/* ---- alloc ---- */

/* Where an aligned range of sz bytes starts inside b, or 0 if it does not
 * fit. */
static uintptr_t fit_in(const block_t *b, size_t sz, size_t alignment) {
    uintptr_t at = hm_align_up(b->base, alignment);
    if (!at || at < b->base) return 0;
    size_t head = at - b->base;
    if (head > b->size || b->size - head < sz) return 0;
    return at;
}

/* Candidates checked beyond the first before the guaranteed-fit fallback. */
#define ALIGN_PROBES 8

static block_t *find_fit(const hm_coarse_t *c, size_t sz, size_t alignment, uintptr_t *at) {
    block_t *b = size_lower_bound(c, sz, 0);
    if (!b) return NULL;
    if (alignment <= c->gran) {
        *at = b->base;
        return b;
    }
    /* Best fit among the blocks whose aligned start still leaves room. */
    size_t need; /* any block of sz + alignment - gran bytes holds an aligned range */
    if (__builtin_add_overflow(sz, alignment - c->gran, &need)) need = SIZE_MAX;
    for (int i = 0; b; i++) {
        if ((*at = fit_in(b, sz, alignment))) return b;
        if (i >= ALIGN_PROBES && c->ops.grow) {
            /* Enough probing when growing is possible: take the smallest
             * block that surely fits, or grow. */
            b = size_lower_bound(c, need, 0);
            return b && (*at = fit_in(b, sz, alignment)) ? b : NULL;
        }
        b = size_lower_bound(c, b->size, b->base + 1);
    }
    return NULL;
}

static void link_after(block_t *a, block_t *n) {
    n->prev = a;
    n->next = a->next;
    if (a->next) a->next->prev = n;
    a->next = n;
}

static void unlink_block(block_t *b) {
    if (b->prev) b->prev->next = b->next;
    if (b->next) b->next->prev = b->prev;
}

/* Carves [at, +sz) out of the free block b that holds it. */
static hm_result_t carve_locked(hm_coarse_t *c, block_t *b, uintptr_t at, size_t sz, void **ptr) {
    if (!reserve_blocks(c, 2)) return HM_ERROR_OUT_OF_HOST_MEMORY;
    size_t head = at - b->base, tail = b->size - head - sz;
    size_remove(c, b);
    block_t *u = b;
    if (head) {
        u = take_block(c);
        u->base = at;
        u->region = b->region;
        b->size = head;
        link_after(b, u);
        addr_insert(c, u);
        size_insert(c, b);
    }
    u->size = sz;
    u->used = true;
    if (tail) {
        block_t *t = take_block(c);
        t->base = at + sz;
        t->size = tail;
        t->region = u->region;
        link_after(u, t);
        addr_insert(c, t);
        size_insert(c, t);
    }
    c->st.allocated += sz;
    c->st.free -= sz;
    c->st.used_blocks++;
    *ptr = (void *)at;
    return HM_SUCCESS;
}

static hm_result_t alloc_locked(hm_coarse_t *c, size_t sz, size_t alignment, void **ptr) {
    uintptr_t at;
    block_t *b = find_fit(c, sz, alignment, &at);
    if (!b) return HM_ERROR_OUT_OF_MEMORY;
    return carve_locked(c, b, at, sz, ptr);
}

hm_result_t hm__coarse_alloc(hm_coarse_t *c, size_t size, size_t alignment, void **ptr) {
    *ptr = NULL;
    if (!size) return HM_ERROR_INVALID_ARGUMENT;
    if (alignment && !hm_is_pow2(alignment)) return HM_ERROR_INVALID_ALIGNMENT;
    if (alignment < c->gran) alignment = c->gran;
    size_t sz = hm_align_up(size, c->gran);
    if (!sz) return HM_ERROR_OUT_OF_MEMORY;

    hm__mutex_lock(&c->lock);
    hm_result_t r = alloc_locked(c, sz, alignment, ptr);
    hm__mutex_unlock(&c->lock);
    if (r != HM_ERROR_OUT_OF_MEMORY || !c->ops.grow) return r;

    /* Nothing fits: ask the owner for a new region, lock dropped. */
    void *base = NULL;
    size_t len = 0;
    uint64_t tag = 0;
    r = c->ops.grow(c->owner, sz, alignment, &base, &len, &tag);
    if (r != HM_SUCCESS) return r;
    hm__mutex_lock(&c->lock);
    block_t *b;
    r = add_region_locked(c, (uintptr_t)base, len, tag, &b);
    bool recorded = r == HM_SUCCESS; /* kept, free, even if the carve below fails */
    if (recorded) {
        /* Carve from the grown region itself: find_fit may stop probing
         * (ALIGN_PROBES) before it reaches a region that holds the range
         * aligned but is smaller than size + alignment, and other threads
         * may have taken what was free meanwhile. */
        uintptr_t at = fit_in(b, sz, alignment);
        r = at ? carve_locked(c, b, at, sz, ptr) : HM_ERROR_OUT_OF_MEMORY;
        if (r == HM_ERROR_OUT_OF_MEMORY)
            HM_LOG_ERROR("coarse: grown region [%p, +%zu) cannot hold %zu bytes aligned to %zu",
                         base, len, sz, alignment);
    }
    hm__mutex_unlock(&c->lock);
    if (!recorded && c->ops.release) c->ops.release(c->owner, base, len, tag); /* give it back */
    return r;
}

/* ---- free, split, merge, lookup ---- */

/* The used block at exactly ptr whose size is sz, or an error (logged). */
static hm_result_t used_block_at(hm_coarse_t *c, uintptr_t p, size_t size, const char *what,
                                 block_t **out) {
    block_t *b = addr_floor(c, p);
    if (!b || p >= b->base + b->size) {
        HM_LOG_ERROR("coarse %s(%#zx): not inside any region", what, (size_t)p);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!b->used) {
        HM_LOG_ERROR("coarse %s(%#zx): range is free (double free?)", what, (size_t)p);
        return HM_ERROR_DOUBLE_FREE;
    }
    if (b->base != p) {
        HM_LOG_ERROR("coarse %s(%#zx): inside the allocation at %#zx, not its start", what,
                     (size_t)p, (size_t)b->base);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_align_up(size, c->gran) != b->size) {
        HM_LOG_ERROR("coarse %s(%#zx): size %zu does not match the allocation's %zu", what,
                     (size_t)p, size, b->size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *out = b;
    return HM_SUCCESS;
}

hm_result_t hm__coarse_free(hm_coarse_t *c, void *ptr, size_t size) {
    hm__mutex_lock(&c->lock);
    block_t *b;
    hm_result_t r = used_block_at(c, (uintptr_t)ptr, size, "free", &b);
    if (r == HM_SUCCESS) {
        c->st.allocated -= b->size;
        c->st.free += b->size;
        c->st.used_blocks--;
        b->used = false;
        block_t *p = b->prev, *n = b->next;
        if (p && !p->used) { /* absorb b into its free predecessor */
            size_remove(c, p);
            p->size += b->size;
            unlink_block(b);
            addr_remove(c, b);
            drop_block(c, b);
            b = p;
        }
        if (n && !n->used) { /* absorb the free successor */
            size_remove(c, n);
            b->size += n->size;
            unlink_block(n);
            addr_remove(c, n);
            drop_block(c, n);
        }
        size_insert(c, b);
    }
    hm__mutex_unlock(&c->lock);
    return r;
}

hm_result_t hm__coarse_split(hm_coarse_t *c, void *ptr, size_t total, size_t first) {
    if (!first || (first & (c->gran - 1))) {
        HM_LOG_ERROR("coarse split(%p): first %zu is not a multiple of %zu", ptr, first, c->gran);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm__mutex_lock(&c->lock);
    block_t *b;
    hm_result_t r = used_block_at(c, (uintptr_t)ptr, total, "split", &b);
    if (r == HM_SUCCESS && first >= b->size) {
        HM_LOG_ERROR("coarse split(%p): first %zu not inside %zu", ptr, first, b->size);
        r = HM_ERROR_INVALID_ARGUMENT;
    }
    if (r == HM_SUCCESS && !reserve_blocks(c, 1)) r = HM_ERROR_OUT_OF_HOST_MEMORY;
    if (r == HM_SUCCESS) {
        block_t *h = take_block(c);
        h->base = b->base + first;
        h->size = b->size - first;
        h->region = b->region;
        h->used = true;
        b->size = first;
        link_after(b, h);
        addr_insert(c, h);
        c->st.used_blocks++;
    }
    hm__mutex_unlock(&c->lock);
    return r;
}

hm_result_t hm__coarse_merge(hm_coarse_t *c, void *lo, void *hi, size_t total) {
    hm__mutex_lock(&c->lock);
    hm_result_t r = HM_ERROR_INVALID_ARGUMENT;
    block_t *a = addr_floor(c, (uintptr_t)lo);
    block_t *b = a ? a->next : NULL;
    if (!a || a->base != (uintptr_t)lo || !a->used) {
        HM_LOG_ERROR("coarse merge(%p, %p): %p is not the start of an allocation", lo, hi, lo);
    } else if (!b || b->base != (uintptr_t)hi || !b->used) {
        HM_LOG_ERROR("coarse merge(%p, %p): %p is not an allocation directly after %p", lo, hi,
                     hi, lo);
    } else if (hm_align_up(total, c->gran) != a->size + b->size) {
        HM_LOG_ERROR("coarse merge(%p, %p): total %zu does not match %zu + %zu", lo, hi, total,
                     a->size, b->size);
    } else {
        a->size += b->size;
        unlink_block(b);
        addr_remove(c, b);
        drop_block(c, b);
        c->st.used_blocks--;
        r = HM_SUCCESS;
    }
    hm__mutex_unlock(&c->lock);
    return r;
}

hm_result_t hm__coarse_lookup(hm_coarse_t *c, const void *ptr, size_t size,
                              hm_coarse_range_t *out) {
    uintptr_t p = (uintptr_t)ptr, end;
    if (!size || __builtin_add_overflow(p, size, &end)) return HM_ERROR_INVALID_ARGUMENT;
    hm__mutex_lock(&c->lock);
    block_t *b = addr_floor(c, p);
    hm_result_t r = HM_ERROR_INVALID_ARGUMENT;
    if (b && b->used && end <= b->base + b->size) {
        out->block_base = (void *)b->base;
        out->block_size = b->size;
        out->region_base = (void *)b->region->base;
        out->region_size = b->region->size;
        out->region_tag = b->region->tag;
        r = HM_SUCCESS;
    }
    hm__mutex_unlock(&c->lock);
    if (r != HM_SUCCESS)
        HM_LOG_ERROR("coarse: [%p, +%zu) is not inside one allocation", ptr, size);
    return r;
}

/* ---- statistics and checks ---- */

void hm__coarse_get_stats(hm_coarse_t *c, hm_coarse_stats_t *stats) {
    hm__mutex_lock(&c->lock);
    *stats = c->st;
    stats->largest_free = largest_free(c);
    hm__mutex_unlock(&c->lock);
}

typedef struct check_ctx {
    const char *err;
    size_t nodes, used, freeb, used_bytes, free_bytes;
    const block_t *last;
} check_ctx_t;

/* Walks one tree (explicit stack of bounded depth: a treap's expected depth
 * is O(log n); 256 levels means a broken tree or astronomically bad luck).
 * Checks BST order against the in-order predecessor and the heap order. */
static const char *check_tree(const tnode_t *root, tcmp_fn cmp, size_t *count,
                              void (*visit)(check_ctx_t *, const tnode_t *), check_ctx_t *cx) {
    const tnode_t *stack[256];
    int sp = 0;
    const tnode_t *t = root, *prev = NULL;
    *count = 0;
    while (t || sp) {
        while (t) {
            if (sp == 256) return "tree deeper than 256";
            if ((t->l && t->l->prio > t->prio) || (t->r && t->r->prio > t->prio))
                return "heap order broken";
            stack[sp++] = t;
            t = t->l;
        }
        t = stack[--sp];
        if (prev && cmp(prev, t) >= 0) return "search order broken";
        prev = t;
        (*count)++;
        if (visit) visit(cx, t);
        t = t->r;
    }
    return NULL;
}

static void visit_addr(check_ctx_t *cx, const tnode_t *n) {
    const block_t *b = ADDR_BLOCK(n);
    if (cx->err) return;
    if (!b->size) cx->err = "empty block";
    else if (b->base < b->region->base || b->base + b->size > b->region->base + b->region->size)
        cx->err = "block outside its region";
    else if (cx->last && cx->last->base + cx->last->size > b->base) cx->err = "blocks overlap";
    else if (b->prev && (b->prev->next != b || b->prev->base + b->prev->size != b->base ||
                         b->prev->region != b->region))
        cx->err = "prev link broken";
    else if (!b->prev && b->base != b->region->base) cx->err = "first block not at region base";
    else if (b->next && (b->next->prev != b || b->base + b->size != b->next->base))
        cx->err = "next link broken";
    else if (!b->next && b->base + b->size != b->region->base + b->region->size)
        cx->err = "last block not at region end";
    else if (!b->used && b->next && !b->next->used) cx->err = "two free neighbours";
    if (b->used) {
        cx->used++;
        cx->used_bytes += b->size;
    } else {
        cx->freeb++;
        cx->free_bytes += b->size;
    }
    cx->last = b;
}

static void visit_size(check_ctx_t *cx, const tnode_t *n) {
    if (!cx->err && SIZE_BLOCK(n)->used) cx->err = "used block in the size tree";
}

const char *hm__coarse_check(hm_coarse_t *c) {
    check_ctx_t cx = {0};
    size_t naddr = 0, nsize = 0, mapped = 0, nreg = 0;
    hm__mutex_lock(&c->lock);
    const char *err = check_tree(c->addr_root, cmp_addr, &naddr, visit_addr, &cx);
    if (!err) err = cx.err;
    if (!err) err = check_tree(c->size_root, cmp_size, &nsize, visit_size, &cx);
    if (!err) err = cx.err;
    for (region_t *r = c->regions; r; r = r->next) {
        mapped += r->size;
        nreg++;
        if ((r->base | r->size) & (c->gran - 1)) err = err ? err : "region not aligned";
    }
    if (!err && nsize != cx.freeb) err = "size tree does not hold exactly the free blocks";
    if (!err && (mapped != c->st.mapped || nreg != c->st.regions)) err = "mapped stats wrong";
    if (!err && (cx.used != c->st.used_blocks || cx.used_bytes != c->st.allocated))
        err = "allocated stats wrong";
    if (!err && (cx.freeb != c->st.free_blocks || cx.free_bytes != c->st.free))
        err = "free stats wrong";
    if (!err && cx.used_bytes + cx.free_bytes != mapped) err = "blocks do not tile the regions";
    hm__mutex_unlock(&c->lock);
    return err;
}

void hm__coarse_foreach(hm_coarse_t *c,
                        void (*fn)(void *arg, void *base, size_t size, bool used, uint64_t tag),
                        void *arg) {
    hm__mutex_lock(&c->lock);
    const tnode_t *stack[256];
    int sp = 0;
    const tnode_t *t = c->addr_root;
    while (t || sp) {
        while (t && sp < 256) {
            stack[sp++] = t;
            t = t->l;
        }
        if (t) HM_DIE("coarse: tree deeper than 256");
        t = stack[--sp];
        const block_t *b = ADDR_BLOCK(t);
        fn(arg, (void *)b->base, b->size, b->used, b->region->tag);
        t = t->r;
    }
    hm__mutex_unlock(&c->lock);
}
