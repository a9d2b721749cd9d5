/* hetmem — IPC, export side: hm_ipc_get/put, the export cache and the holds.
 * SPDX-License-Identifier: MIT
 *
 * EXPORT CACHE (producer side). One entry per exported provider allocation
 * (tracker record), keyed by its base in one process-wide hash and
 * validated by the tracker's allocation id (a new allocation at the same
 * address is a different entry). The entry holds the provider's export
 * (ipc.get once; ipc.put when the entry goes) and one encoded handle per
 * exported offset ("views"). Views of live entries are also indexed by the
 * exported pointer (exports.vb): a repeated hm_ipc_get of a pointer is one probe
 * there (no tracker lookup: an entry is detached, its views leaving the
 * index, before the pool front-end frees, splits or merges its range); a
 * new pointer costs a tracker lookup (lock-free) and a probe of the base
 * hash. hm_ipc_put finds its view by pointer identity (no decode). No
 * system call on either (the exporter identity is cached and refreshed only
 * after fork). Bounded by HM_IPC_EXPORT_CACHE_MAX entries; CLOCK eviction
 * of unused entries. An entry whose allocation is freed
 * (hm__ipc_range_release) is released at once if unused, else at its last
 * put. An entry whose provider put fails is kept, without views, as an
 * orphan (put_retry) and put again after the next put that provider accepts
 * and at its pool's destroy: the provider holds the range for the export
 * until then, not for good. All of it is guarded by exports.lock (short
 * sections, no system call on a hit; the provider's ipc.get/put run under it
 * so that a pool destroy can never race a put into a destroyed provider).
 *
 * HOLDS. An entry counts its outstanding gets (refs); its pool counts its
 * entries with refs > 0 (pi->held). While that count is not 0, the front
 * end's free of a block of the pool asks hm__ipc_free_held: a block whose
 * extent (the pool's usable_size) holds an outstanding view's pointer is
 * not freed but listed in the entry (dfr), and the last put frees the list
 * into the pool with no lock held (pi->flushers keeps the pool alive until
 * then: its destroy waits). Splitting or merging a range with refs > 0 is
 * refused (hm__ipc_range_busy). A forked child moves the parent's lists to
 * exports.due, freed at its next IPC call or checked free. refs, dfr, held's
 * changes and due are guarded by exports.lock; held is read without it.
 *
 *  Lock order: exports.lock -> view_arena.lock, view_arena_big.lock (views are
 *  made and freed under exports.lock); exports.lock -> the provider's own locks
 *  (ipc.get/put run under it); no import-side lock is taken under exports.lock.
 *
 *  Fields and who guards them:
 *   exports (hash, ring, orphans, views    exports.lock
 *   index, due list), xent, xview
 *   exports.count, exports.due_count            written under exports.lock, read relaxed
 *                                     without it (fast "nothing exported")
 *   pi->xhead                         exports.lock
 *   pi->held                          changed under exports.lock, read relaxed
 *   pi->flushers                      atomic; a destroy waits for 0 */
#include "ipc/ipc_core.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* One exported offset of an export entry: the handle given to users.
 * Reference counts and the CLOCK bit live here, not in the entry, so that a
 * get or put hit touches the view's first line only (plus the index
 * bucket). exports.lock guards every field. */
typedef struct xview {
    struct xview *pnext; /* exports.vb, by exported pointer (while its xent is live);
                            arena free list when free */
    uintptr_t ptr;       /* the exported pointer: base + offset */
    uint32_t refs;       /* gets not yet put */
    uint32_t len;        /* of wire */
    uint8_t used;        /* CLOCK reference bit (for the entry) */
    uint8_t gone;        /* its entry is detached: release at the last put */
    uint8_t in_arena;    /* 1: view_arena, 2: view_arena_big */
    struct xview *next;  /* the entry's views */
    struct xent *x;      /* NULL while free (arena) */
    unsigned char wire[]; /* the handle given to the user */
} xview_t;
#define VIEW_SIZE 256 /* arena slot: handles up to 208 bytes (OS: 152) */
/* The other arena's slot: any handle (file and devdax: 664 bytes). Every
 * view lives in one of the two arenas, whose memory is never unmapped, so
 * hm_ipc_put of a stale or foreign pointer never reads freed memory. */
#define VIEW_BIG_SIZE \
    ((offsetof(xview_t, wire) + HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX + 63) & ~(size_t)63)

typedef struct xent {
    struct xent *hnext;        /* exports hash (live entries) */
    struct xent *lprev, *lnext; /* pool's list (while pi is set) */
    struct xent *oprev, *onext; /* exports.orphans: detached, still used */
    struct xent *rprev, *rnext; /* CLOCK ring: live entries with no get outstanding */
    struct hm_ipc_pool *pi;    /* NULL once orphaned (pool destroyed) */
    hm_provider_t *prov;
    uintptr_t base;
    size_t size;
    uint64_t id;
    int fd;
    bool live, put_done, in_ring;
    /* The pool front end freed the provider range while gets were
     * outstanding: the range is the IPC layer's until the last put, which
     * gives it back to the provider (xfinish). opool: the pool whose range
     * it was (only compared once its IPC state is gone). */
    bool free_held;
    hm_pool_t *opool;
    uint32_t refs;             /* gets not yet put, over all views */
    int hslot;                 /* while refs > 0: its pool's hold slot, or -1 (holds_over) */
    /* Blocks the user freed while refs > 0 (hm__ipc_free_held): freed into
     * the pool at the last put. Each holds an exported view's bytes, so
     * the pool cannot hand them out again before then. */
    void **dfr;
    uint32_t ndfr, cdfr;
    bool put_retry; /* the provider refused the put: an orphan without views, put again later */
    xview_t *views;
    uint32_t payload_len;
    unsigned char payload[]; /* the provider's native handle, for put */
} xent_t;

static arena_t view_arena = {.lock = PTHREAD_MUTEX_INITIALIZER,
                             .objsize = VIEW_SIZE,
                             .link_off = offsetof(xview_t, pnext)};
static arena_t view_arena_big = {.lock = PTHREAD_MUTEX_INITIALIZER,
                                 .objsize = VIEW_BIG_SIZE,
                                 .link_off = offsetof(xview_t, pnext)};

/* CLOCK: whether any view was used since the last visit; clears the bits. */
static bool xused_clear(xent_t *x) {
    bool u = false;
    for (xview_t *v = x->views; v; v = v->next) {
        u |= v->used != 0;
        v->used = 0;
    }
    return u;
}

/* The export cache. */
static struct {
    pthread_mutex_t lock;
    xent_t **b;
    size_t cap, n;
    xent_t *hand;
    xent_t *orphans;
    _Atomic size_t count;
    xview_t **vb; /* views of live entries by exported pointer: a repeated
                     get of a pointer needs no tracker lookup */
    size_t vcap, vn;
    /* A forked child's deferred frees of the parent's exports (the child
     * has no export to wait for): freed at its next IPC call or checked
     * free (xdue_run). */
    struct xdue {
        hm_pool_t *pool;      /* a block to free into pool, or (NULL) */
        hm_provider_t *prov;  /* a range [ptr, +size) to give back to prov */
        void *ptr;
        size_t size;
    } *due;
    _Atomic size_t norphans; /* exports.orphans' length (hm__ipc_range_take's quick test) */
    size_t ndue, cdue;
    _Atomic size_t due_count;
    size_t nretry;                 /* put_retry orphans */
    struct hm_ipc_pool *destroying; /* whose exports exports_pool_destroy is releasing */
    /* Providers whose pools destroyed them while the IPC layer held their
     * ranges (hm__ipc_provider_defer): destroyed after the last such
     * range's put; `reap` those due, destroyed with no lock held by
     * xreap(). */
    hm_provider_t **deferred, **reap;
    size_t ndeferred, cdeferred, nreap, creap;
    _Atomic size_t reap_count;
} exports = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ------------------------------------------------------------------------ */
/* export cache                                                             */

static inline size_t xbucket(uintptr_t base) { return hm__ipc_mix64(base) & (exports.cap - 1); }

static xent_t *export_find(uintptr_t base) {
    if (!exports.cap) return NULL;
    for (xent_t *x = exports.b[xbucket(base)]; x; x = x->hnext)
        if (x->base == base) return x;
    return NULL;
}

static void xview_free(xview_t *v) {
    /* An importer that reads this copy (open_verify) sees it released. */
    memset(v->wire, 0, sizeof(uint32_t));
    v->x = NULL; /* a put naming this slot is refused from now on */
    hm__ipc_arena_free(v->in_arena == 2 ? &view_arena_big : &view_arena, v);
}
static void xent_free(xent_t *x) {
    for (xview_t *v = x->views, *nv; v; v = nv) {
        nv = v->next;
        xview_free(v);
    }
    free(x->dfr);
    free(x);
}

/* ---- holds: frees deferred while an export is outstanding (exports.lock) ---- */

static void xdetach(xent_t *x);

/* ---- the CLOCK ring of unused live entries (exports.lock held) ----
 * An entry with gets outstanding is off the ring, so the evictor visits
 * only what it may evict: a get that must evict costs O(1) amortised
 * however many exports are held. */
static void xring_add(xent_t *x) {
    if (!exports.hand) {
        x->rnext = x->rprev = x;
        exports.hand = x;
    } else { /* just behind the hand: visited last */
        x->rnext = exports.hand;
        x->rprev = exports.hand->rprev;
        x->rprev->rnext = x;
        exports.hand->rprev = x;
    }
    x->in_ring = true;
}
static void xring_del(xent_t *x) {
    if (x->rnext == x) {
        exports.hand = NULL;
    } else {
        if (exports.hand == x) exports.hand = x->rnext;
        x->rprev->rnext = x->rnext;
        x->rnext->rprev = x->rprev;
    }
    x->rprev = x->rnext = NULL;
    x->in_ring = false;
}

/* One more outstanding get of x. */
static void xhold(xent_t *x) {
    if (x->refs++) return;
    if (x->in_ring) xring_del(x);
    if (!x->pi) return;
    hm_pool_t *pool = x->pi->pool;
    x->hslot = -1;
    for (int i = 0; i < HM_POOL_HOLD_SLOTS && x->hslot < 0; i++)
        if (!atomic_load_explicit(&pool->holds[i].base, memory_order_relaxed)) {
            atomic_store_explicit(&pool->holds[i].end, x->base + x->size, memory_order_relaxed);
            atomic_store_explicit(&pool->holds[i].base, x->base, memory_order_release);
            x->hslot = i;
        }
    if (x->hslot < 0) atomic_fetch_add_explicit(&pool->holds_over, 1, memory_order_relaxed);
    if (!atomic_fetch_add_explicit(&x->pi->held, 1, memory_order_relaxed))
        hm__pool_hold_frees(pool, true); /* its first held export */
}

/* x's range leaves its pool's hold slots (its last get was put). */
static void xhold_clear(xent_t *x) {
    hm_pool_t *pool = x->pi->pool;
    if (x->hslot >= 0) {
        atomic_store_explicit(&pool->holds[x->hslot].base, 0, memory_order_relaxed);
        atomic_store_explicit(&pool->holds[x->hslot].end, 0, memory_order_relaxed);
    } else {
        atomic_fetch_sub_explicit(&pool->holds_over, 1, memory_order_relaxed);
    }
    x->hslot = -1;
}

/* Deferred frees taken out of an entry at its last put, done with no lock
 * held (a pool's free may reach hm__ipc_range_release). */
typedef struct xflush {
    hm_ipc_pool_t *pi;
    void **ptrs;
    uint32_t n;
} xflush_t;

/* One outstanding get of x fewer; at the last, x's deferred frees move to
 * *fl (pi->flushers keeps the pool's IPC state, and so the pool, alive
 * until xflush_run). */
static void xunhold(xent_t *x, xflush_t *fl) {
    if (--x->refs) return;
    if (x->live) xring_add(x);
    if (!x->pi) return; /* pool destroyed: its deferred frees were dropped */
    xhold_clear(x);
    if (atomic_fetch_sub_explicit(&x->pi->held, 1, memory_order_relaxed) == 1)
        hm__pool_hold_frees(x->pi->pool, false); /* its last held export */
    if (!x->ndfr) return;
    fl->pi = x->pi;
    fl->ptrs = x->dfr;
    fl->n = x->ndfr;
    x->dfr = NULL;
    x->ndfr = x->cdfr = 0;
    atomic_fetch_add_explicit(&fl->pi->flushers, 1, memory_order_acquire);
}

static void xflush_run(xflush_t *fl) {
    if (!fl->n) return;
    hm_pool_t *pool = fl->pi->pool;
    for (uint32_t i = 0; i < fl->n; i++) {
        hm_result_t r = pool->ops.free(pool->state, fl->ptrs[i]);
        if (r != HM_SUCCESS)
            HM_LOG_WARN("IPC: pool '%s' refused the free of %p deferred until its last put: %s",
                        pool->ops.name, fl->ptrs[i], hm_result_string(r));
    }
    free(fl->ptrs);
    atomic_fetch_sub_explicit(&fl->pi->flushers, 1, memory_order_release);
}

/* Forked child: x's deferred frees become the child's to do. */
static bool xdue_add(struct xdue d) {
    if (exports.ndue == exports.cdue) {
        size_t c = exports.cdue ? 2 * exports.cdue : 16;
        struct xdue *n = realloc(exports.due, c * sizeof(*n));
        if (!n) return false;
        exports.due = n;
        exports.cdue = c;
    }
    exports.due[exports.ndue++] = d;
    return true;
}
static void xdefer_orphan(xent_t *x) {
    for (uint32_t i = 0; i < x->ndfr && x->pi; i++)
        if (!xdue_add((struct xdue){.pool = x->pi->pool, .ptr = x->dfr[i]})) {
            HM_LOG_WARN("IPC: out of memory: %u blocks freed while the parent exported them "
                        "stay allocated in this child", x->ndfr - i);
            break;
        }
    if (x->free_held &&
        !xdue_add((struct xdue){.prov = x->prov, .ptr = (void *)x->base, .size = x->size}))
        HM_LOG_WARN("IPC: out of memory: [%p, +%zu), freed while the parent exported it, stays "
                    "allocated in this child", (void *)x->base, x->size);
    atomic_store_explicit(&exports.due_count, exports.ndue, memory_order_relaxed);
}

/* Free the due blocks (any thread; no lock held by the caller). */
static HM_NOINLINE void xdue_run(void) {
    hm__mutex_lock(&exports.lock);
    struct xdue *d = exports.due;
    size_t n = exports.ndue;
    exports.due = NULL;
    exports.ndue = exports.cdue = 0;
    atomic_store_explicit(&exports.due_count, 0, memory_order_relaxed);
    hm__mutex_unlock(&exports.lock);
    for (size_t i = 0; i < n; i++) {
        hm_pool_t *pool = d[i].pool;
        hm_result_t r = pool ? pool->ops.free(pool->state, d[i].ptr)
                             : hm_provider_free(d[i].prov, d[i].ptr, d[i].size);
        if (r != HM_SUCCESS)
            HM_LOG_WARN("IPC: %s '%s' refused the free of %p (freed while the parent "
                        "exported it): %s", pool ? "pool" : "provider",
                        pool ? pool->ops.name : d[i].prov->info.name, d[i].ptr,
                        hm_result_string(r));
    }
    free(d);
}
static void xreap(void);
static inline void xdue_check(void) {
    if (hm_unlikely(atomic_load_explicit(&exports.due_count, memory_order_relaxed))) xdue_run();
    xreap();
}

/* Does x have an outstanding view whose pointer lies in the block at p of
 * usable size n (n == 0: the pool cannot tell its blocks: any p)? */
static bool xholds(const xent_t *x, uintptr_t p, size_t n) {
    for (const xview_t *v = x->views; v; v = v->next)
        if (v->refs && (!n || v->ptr - p < n)) return true;
    return false;
}

/* The block's extent, where the pool can tell it (*n; 0: it cannot, any
 * pointer counts), so that only a block holding an exported pointer waits.
 * false: ptr is no block of the pool (the pool's own call refuses it). */
static bool block_extent(hm_pool_t *pool, const void *ptr, size_t *n) {
    *n = pool->ops.usable_size ? pool->ops.usable_size(pool->state, ptr) : 0;
    return *n || !pool->ops.usable_size;
}

/* The live export of pi's range *e with gets outstanding that holds the
 * block [ptr, +n), or NULL (exports.lock held). */
static xent_t *xheld(hm_ipc_pool_t *pi, const void *ptr, size_t n, const hm_tracker_entry_t *e) {
    xent_t *x = export_find(e->base);
    if (x && x->live && x->id == e->id && x->refs && x->pi == pi && xholds(x, (uintptr_t)ptr, n))
        return x;
    return NULL;
}

hm_result_t hm__ipc_free_held(hm_pool_t *pool, void *ptr, const hm_tracker_entry_t *e,
                              bool *done) {
    *done = false;
    xdue_check();
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    size_t n;
    if (!pi || !atomic_load_explicit(&pi->held, memory_order_relaxed) ||
        !block_extent(pool, ptr, &n))
        return HM_SUCCESS;
    hm_result_t r = HM_SUCCESS;
    hm__mutex_lock(&exports.lock);
    xent_t *x = xheld(pi, ptr, n, e);
    if (!x) goto out; /* not held: the pool frees it now */
    *done = true;
    for (uint32_t i = 0; i < x->ndfr; i++)
        if (x->dfr[i] == ptr) {
            HM_LOG_ERROR("hm_pool_free(%s): %p was already freed (its free waits for the last "
                         "hm_ipc_put of its export)", pool->ops.name, ptr);
            r = HM_ERROR_DOUBLE_FREE;
            goto out;
        }
    if (x->ndfr == x->cdfr) {
        uint32_t c = x->cdfr ? 2 * x->cdfr : 4;
        void **d = realloc(x->dfr, c * sizeof(*d));
        if (!d) {
            HM_LOG_ERROR("hm_pool_free(%s): out of host memory to defer the free of exported "
                         "%p; it stays allocated", pool->ops.name, ptr);
            r = HM_ERROR_OUT_OF_HOST_MEMORY;
            goto out;
        }
        x->dfr = d;
        x->cdfr = c;
    }
    x->dfr[x->ndfr++] = ptr;
out:
    hm__mutex_unlock(&exports.lock);
    return r;
}

bool hm__ipc_is_held(hm_pool_t *pool, const void *ptr, const hm_tracker_entry_t *e) {
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    size_t n;
    if (!pi || !atomic_load_explicit(&pi->held, memory_order_relaxed) ||
        !block_extent(pool, ptr, &n))
        return false;
    hm__mutex_lock(&exports.lock);
    bool held = xheld(pi, ptr, n, e) != NULL;
    hm__mutex_unlock(&exports.lock);
    return held;
}

bool hm__ipc_range_busy(hm_pool_t *pool, void *base) {
    if (hm_likely(!atomic_load_explicit(&exports.count, memory_order_relaxed))) return false;
    hm__mutex_lock(&exports.lock);
    xent_t *x = export_find((uintptr_t)base);
    bool busy = x && x->pi && x->pi->pool == pool && x->refs;
    if (x && !busy && x->pi && x->pi->pool == pool) xdetach(x);
    hm__mutex_unlock(&exports.lock);
    return busy;
}

static void olist_unlink(xent_t *x) {
    atomic_fetch_sub_explicit(&exports.norphans, 1, memory_order_relaxed);
    if (x->oprev) x->oprev->onext = x->onext;
    else exports.orphans = x->onext;
    if (x->onext) x->onext->oprev = x->oprev;
    x->oprev = x->onext = NULL;
}
static void olist_push(xent_t *x) {
    atomic_fetch_add_explicit(&exports.norphans, 1, memory_order_relaxed);
    x->oprev = NULL;
    x->onext = exports.orphans;
    if (exports.orphans) exports.orphans->oprev = x;
    exports.orphans = x;
}

static void xlist_unlink(xent_t **head, xent_t *x) {
    if (x->lprev) x->lprev->lnext = x->lnext;
    else *head = x->lnext;
    if (x->lnext) x->lnext->lprev = x->lprev;
    x->lprev = x->lnext = NULL;
}
static void xlist_push(xent_t **head, xent_t *x) {
    x->lprev = NULL;
    x->lnext = *head;
    if (*head) (*head)->lprev = x;
    *head = x;
}

/* Give x's provider export back, once. false: the provider refused (logged,
 * with `then`: what becomes of the export); it still holds the range. */
static bool xprovider_put(xent_t *x, const char *then) {
    if (x->put_done) return true;
    hm_result_t r = x->prov->ops.ipc.put(x->prov->state, x->payload);
    if (r != HM_SUCCESS) {
        HM_LOG_WARN("IPC: provider '%s' put of the export at %p failed: %s; %s",
                    x->prov->info.name, (void *)x->base, hm_result_string(r), then);
        return false;
    }
    x->put_done = true;
    return true;
}

static bool in_orphans(const xent_t *x) { return x->oprev || exports.orphans == x; }

/* After x's provider put: a range the pool freed while it was exported
 * goes back to its provider now (exports.lock held; the provider's free nests
 * under it as its ipc.put does). */
static bool xholds_range_of(const hm_provider_t *prov, const xent_t *skip) {
    for (xent_t *o = exports.orphans; o; o = o->onext)
        if (o != skip && o->prov == prov && o->free_held) return true;
    return false;
}

static void xfinish(xent_t *x) {
    if (!x->free_held) return;
    x->free_held = false;
    hm_result_t r = hm_provider_free(x->prov, (void *)x->base, x->size);
    if (r != HM_SUCCESS)
        HM_LOG_WARN("IPC: provider '%s' refused [%p, +%zu) back after its last put: %s",
                    x->prov->info.name, (void *)x->base, x->size, hm_result_string(r));
    /* The last held range of a provider its pool destroyed: the provider
     * goes now (after the unlock: xreap). */
    for (size_t i = 0; i < exports.ndeferred; i++) {
        if (exports.deferred[i] != x->prov || xholds_range_of(x->prov, x)) continue;
        exports.deferred[i] = exports.deferred[--exports.ndeferred];
        if (exports.nreap == exports.creap) {
            size_t cap = exports.creap ? 2 * exports.creap : 4;
            hm_provider_t **t = realloc(exports.reap, cap * sizeof(*t));
            if (!t) {
                HM_LOG_ERROR("IPC: no memory to destroy provider '%s' after its last put: left",
                             x->prov->info.name);
                break;
            }
            exports.reap = t;
            exports.creap = cap;
        }
        exports.reap[exports.nreap++] = x->prov;
        atomic_store_explicit(&exports.reap_count, exports.nreap, memory_order_relaxed);
        break;
    }
}

/* Destroy the providers xfinish found due (no lock held). */
static void xreap(void) {
    if (hm_likely(!atomic_load_explicit(&exports.reap_count, memory_order_relaxed))) return;
    hm__mutex_lock(&exports.lock);
    hm_provider_t **r = exports.reap;
    size_t n = exports.nreap;
    exports.reap = NULL;
    exports.nreap = exports.creap = 0;
    atomic_store_explicit(&exports.reap_count, 0, memory_order_relaxed);
    hm__mutex_unlock(&exports.lock);
    for (size_t i = 0; i < n; i++) {
        hm_result_t e = hm_provider_destroy(r[i]);
        if (e != HM_SUCCESS)
            HM_LOG_ERROR("IPC: the deferred destroy of a provider failed: %s",
                         hm_result_string(e));
    }
    free(r);
}

HM_RUN bool hm__ipc_provider_defer(hm_provider_t *prov) {
    if (hm_likely(!atomic_load_explicit(&exports.norphans, memory_order_relaxed))) return false;
    hm__mutex_lock(&exports.lock);
    bool held = xholds_range_of(prov, NULL);
    if (held && exports.ndeferred == exports.cdeferred) {
        size_t cap = exports.cdeferred ? 2 * exports.cdeferred : 4;
        hm_provider_t **t = realloc(exports.deferred, cap * sizeof(*t));
        if (t) {
            exports.deferred = t;
            exports.cdeferred = cap;
        } else {
            held = false; /* destroyed now: its held ranges go with it */
        }
    }
    if (held) exports.deferred[exports.ndeferred++] = prov;
    hm__mutex_unlock(&exports.lock);
    if (held)
        HM_LOG_INFO("IPC: provider '%s' is destroyed after the last put of its exported ranges",
                    prov->info.name);
    return held;
}

/* Put again what prov refused before (put_retry orphans), now that it
 * accepted a put; a pool's destroy does its own. exports.lock held. */
static void xretry(hm_provider_t *prov) {
    for (xent_t *o = exports.orphans, *no; o && exports.nretry; o = no) {
        no = o->onext;
        if (!o->put_retry || o->prov != prov || (o->pi && o->pi == exports.destroying) ||
            !xprovider_put(o, "tried again later"))
            continue;
        xfinish(o);
        olist_unlink(o);
        if (o->pi) xlist_unlink(&o->pi->xhead, o);
        exports.nretry--;
        xent_free(o);
    }
}

/* x is out of the hash and the ring and has no user left: its provider
 * export goes back and x is freed. If the provider refuses the put, x stays
 * on its pool's list as an orphan without views (put_retry), put again by
 * xretry or the pool's destroy. exports.lock held. */
static void xrelease(xent_t *x) {
    hm_provider_t *prov = x->prov;
    if (xprovider_put(x, "tried again at a later put or the pool destroy")) {
        xfinish(x);
        if (in_orphans(x)) olist_unlink(x);
        if (x->pi) xlist_unlink(&x->pi->xhead, x);
        xent_free(x);
        if (exports.nretry) xretry(prov);
        return;
    }
    for (xview_t *v = x->views, *nv; v; v = nv) { /* no handle names them any more */
        nv = v->next;
        xview_free(v);
    }
    x->views = NULL;
    if (!in_orphans(x)) olist_push(x);
    if (!x->put_retry) exports.nretry++;
    x->put_retry = true;
}

/* ---- views by exported pointer (exports.lock held) ---- */
static inline size_t vbucket(uintptr_t ptr) { return hm__ipc_mix64(ptr) & (exports.vcap - 1); }
static inline xview_t *view_find(uintptr_t ptr) {
    if (hm_unlikely(!exports.vcap)) return NULL;
    for (xview_t *v = exports.vb[vbucket(ptr)]; v; v = v->pnext)
        if (v->ptr == ptr) return v;
    return NULL;
}
static void vinsert(xview_t *v) {
    if (exports.vn >= exports.vcap) { /* double (best effort: without memory chains grow) */
        size_t cap = exports.vcap ? exports.vcap * 2 : 64;
        xview_t **b = calloc(cap, sizeof(*b));
        if (b) {
            for (size_t i = 0; i < exports.vcap; i++)
                for (xview_t *w = exports.vb[i], *nw; w; w = nw) {
                    nw = w->pnext;
                    size_t k = hm__ipc_mix64(w->ptr) & (cap - 1);
                    w->pnext = b[k];
                    b[k] = w;
                }
            free(exports.vb);
            exports.vb = b;
            exports.vcap = cap;
        } else if (!exports.vcap) {
            return; /* no index at all: gets take the tracker path */
        }
    }
    size_t k = vbucket(v->ptr);
    v->pnext = exports.vb[k];
    exports.vb[k] = v;
    exports.vn++;
}
static void vunlink(xview_t *v) {
    if (!exports.vcap) return;
    xview_t **p = &exports.vb[vbucket(v->ptr)];
    while (*p && *p != v) p = &(*p)->pnext;
    if (*p) {
        *p = v->pnext;
        exports.vn--;
    }
}

/* Take x out of the hash and ring (exports.lock held). Unused: released now.
 * Used: moved to exports.orphans and released at its last put; it also stays in
 * its pool's list so that a pool destroy releases the provider export
 * before the provider goes. */
static void xdetach(xent_t *x) {
    xent_t **p = &exports.b[xbucket(x->base)];
    while (*p != x) p = &(*p)->hnext;
    *p = x->hnext;
    if (x->in_ring) xring_del(x);
    x->live = false;
    for (xview_t *v = x->views; v; v = v->next) {
        vunlink(v);
        v->gone = 1;
    }
    exports.n--;
    atomic_store_explicit(&exports.count, exports.n, memory_order_relaxed);
    if (!exports.n) hm__ipc_ptrace_exporting(false);
    if (!x->refs) xrelease(x);
    else olist_push(x);
}

static hm_result_t xgrow(void) {
    if (exports.n < exports.cap) return HM_SUCCESS;
    size_t cap = exports.cap ? exports.cap * 2 : 64;
    xent_t **b = calloc(cap, sizeof(*b));
    if (!b) return HM_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < exports.cap; i++)
        for (xent_t *x = exports.b[i], *nx; x; x = nx) {
            nx = x->hnext;
            size_t k = hm__ipc_mix64(x->base) & (cap - 1);
            x->hnext = b[k];
            b[k] = x;
        }
    free(exports.b);
    exports.b = b;
    exports.cap = cap;
    return HM_SUCCESS;
}

/* Bound the export cache: CLOCK over the unused entries (F. J. Corbato,
 * "A paging experiment with the Multics system", 1968), at most
 * XEVICT_STEPS visits per call (the hand keeps its place: the next call
 * goes on), so one get costs O(1) whether few or all entries are held; held
 * entries may keep the cache over its bound until they are put. */
#define XEVICT_STEPS 64
static void xevict(void) {
    for (int steps = XEVICT_STEPS; exports.n >= hm__ipc_export_max && exports.hand && steps; steps--) {
        xent_t *x = exports.hand;
        exports.hand = x->rnext;
        if (xused_clear(x)) continue;
        xdetach(x);
    }
}

/* The provider's export of te's range into a fresh entry, made with no
 * lock held: a driver's own locks never nest under exports.lock here (a driver
 * may hold them across fork in handlers of its own, which run before the
 * library's). */
static hm_result_t xmake(const hm_tracker_entry_t *te, xent_t **out) {
    hm_provider_t *prov = te->provider;
    size_t plen = prov->ops.ipc.handle_size(prov->state);
    if (plen > HM_IPC_PAYLOAD_MAX) {
        HM_LOG_ERROR("hm_ipc_get: provider '%s' has a %zu-byte payload (at most %u)",
                     prov->info.name, plen, HM_IPC_PAYLOAD_MAX);
        return HM_ERROR_NOT_SUPPORTED;
    }
    xent_t *x = calloc(1, sizeof(*x) + plen);
    if (!x) return HM_ERROR_OUT_OF_HOST_MEMORY;
    int fd = -1;
    hm_result_t r = prov->ops.ipc.get(prov->state, (void *)te->base, te->size, x->payload, &fd);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("hm_ipc_get: provider '%s' could not export [%p, +%zu): %s",
                     prov->info.name, (void *)te->base, te->size, hm_result_string(r));
        free(x);
        return r;
    }
    x->fd = fd;
    x->payload_len = (uint32_t)plen;
    *out = x;
    return HM_SUCCESS;
}

/* An entry xmake made and nobody else saw: its export back (no lock held). */
static void xunmake(xent_t *x, hm_provider_t *prov) {
    hm_result_t r = prov->ops.ipc.put(prov->state, x->payload);
    if (r != HM_SUCCESS)
        HM_LOG_WARN("IPC: provider '%s' put of an unused export failed: %s", prov->info.name,
                    hm_result_string(r));
    free(x);
}

/* Publish x (from xmake) for te's range in pi (exports.lock held). */
static hm_result_t xlink(xent_t *x, const hm_tracker_entry_t *te, hm_ipc_pool_t *pi) {
    hm_provider_t *prov = te->provider;
    hm_result_t r = xgrow();
    if (r) return r;
    xevict();
    x->pi = pi;
    x->opool = pi->pool;
    x->prov = prov;
    x->base = te->base;
    x->size = te->size;
    x->id = te->id;
    x->live = true;
    size_t k = xbucket(x->base);
    x->hnext = exports.b[k];
    exports.b[k] = x;
    xring_add(x); /* unused until the get that made it takes its reference */
    xlist_push(&pi->xhead, x);
    exports.n++;
    atomic_store_explicit(&exports.count, exports.n, memory_order_relaxed);
    if (exports.n == 1) hm__ipc_ptrace_exporting(true);
    return HM_SUCCESS;
}

static xview_t *xview_make(xent_t *x, uint64_t offset, const hm_ipc_ident_t *me) {
    uint32_t len = HM_IPC_HEADER_SIZE + x->payload_len;
    xview_t *v = NULL;
    bool small = sizeof(*v) + len <= VIEW_SIZE;
    if (!(v = hm__ipc_arena_alloc(small ? &view_arena : &view_arena_big))) return NULL;
    memset(v, 0, small ? VIEW_SIZE : VIEW_BIG_SIZE);
    v->in_arena = small ? 1 : 2;
    v->len = len;
    hm_wire_t w = {
        .family = (uint32_t)x->prov->info.family,
        .flags = x->fd >= 0 ? HM__WIRE_HAS_FD : 0,
        .payload_len = x->payload_len,
        .kind = (uint32_t)x->prov->info.kind,
        .fd = x->fd >= 0 ? x->fd : -1,
        .pid = me->pid,
        .nonce = me->nonce,
        .start_time = me->start,
        .alloc_id = x->id,
        .base = x->base,
        .size = x->size,
        .offset = offset,
        .origin = (uint64_t)(uintptr_t)v->wire,
    };
    memcpy(v->wire + HM_IPC_HEADER_SIZE, x->payload, x->payload_len);
    hm__wire_encode(&w, v->wire);
    v->next = x->views;
    x->views = v;
    v->x = x;
    v->ptr = x->base + offset;
    vinsert(v);
    return v;
}

hm_result_t hm_ipc_get(const void *ptr, hm_ipc_handle_t **handle, size_t *size) {
    if (hm_unlikely(!ptr || !handle || !size)) {
        HM_LOG_ERROR("hm_ipc_get: %s is NULL", !ptr ? "ptr" : !handle ? "handle" : "size");
        if (handle) *handle = NULL;
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *handle = NULL;
    *size = 0;
    /* Hit: this very pointer was exported and its allocation is still the
     * same (the pool front-end detaches an export, taking its views out of
     * exports.vb, before it frees, splits or merges the range). */
    xdue_check();
    hm__mutex_lock(&exports.lock);
    xview_t *hv = view_find((uintptr_t)ptr);
    if (hm_likely(hv != NULL)) {
        hv->refs++;
        xhold(hv->x);
        hv->used = 1;
        *handle = (hm_ipc_handle_t *)hv->wire;
        *size = hv->len;
        hm__mutex_unlock(&exports.lock);
        return HM_SUCCESS;
    }
    hm__mutex_unlock(&exports.lock);
    hm_tracker_entry_t te;
    if (hm_unlikely(!hm__tracker_lookup(ptr, &te))) {
        HM_LOG_ERROR("hm_ipc_get(%p): not memory of a tracked hetmem pool", ptr);
        return HM_ERROR_NOT_FOUND;
    }
    if (hm_unlikely(te.flags & HM_TRACK_IMPORTED)) {
        HM_LOG_ERROR("hm_ipc_get(%p): a mapping opened through IPC cannot be re-exported", ptr);
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (hm_unlikely(!te.provider || !(te.provider->info.caps & HM_PROVIDER_CAP_IPC))) {
        HM_LOG_ERROR("hm_ipc_get(%p): provider '%s' cannot export (for the OS provider: "
                     "HM_OS_SHARED)", ptr, te.provider ? te.provider->info.name : "?");
        return HM_ERROR_NOT_SUPPORTED;
    }
    uint64_t offset = (uintptr_t)ptr - te.base;
    hm_ipc_pool_t *pi = hm__ipc_pool_make(te.pool);
    if (hm_unlikely(!pi)) return HM_ERROR_OUT_OF_HOST_MEMORY;
    hm__ipc_lazy_init(); /* the export cache's bound, before its first entry */
    hm_result_t r = HM_SUCCESS;
    xent_t *spare = NULL; /* made here, not needed: given back after the unlock */
    hm__mutex_lock(&exports.lock);
    xent_t *x = export_find(te.base);
    if (hm_unlikely(x && (x->id != te.id || x->size != te.size))) {
        xdetach(x); /* freed and reallocated at the same address */
        x = NULL;
    }
    if (hm_unlikely(!x)) {
        hm__mutex_unlock(&exports.lock);
        xent_t *fresh = NULL;
        r = xmake(&te, &fresh);
        if (r != HM_SUCCESS) return r;
        hm__mutex_lock(&exports.lock);
        hm_tracker_entry_t now;
        x = export_find(te.base);
        if (hm_unlikely(x && (x->id != te.id || x->size != te.size))) {
            xdetach(x);
            x = NULL;
        }
        if (hm_unlikely(x)) { /* another thread exported it meanwhile: use theirs */
            spare = fresh;
        } else if (hm_unlikely(!hm__tracker_lookup(ptr, &now) || now.id != te.id)) {
            spare = fresh; /* freed meanwhile (a caller's race) */
            HM_LOG_ERROR("hm_ipc_get(%p): the allocation was freed during the export", ptr);
            r = HM_ERROR_NOT_FOUND;
            goto out;
        } else if ((r = xlink(fresh, &te, pi)) != HM_SUCCESS) {
            spare = fresh;
            goto out;
        } else {
            x = fresh;
        }
    }
    xview_t *v = x->views;
    while (v && v->ptr != (uintptr_t)ptr) v = v->next;
    if (hm_unlikely(!v) && !(v = xview_make(x, offset, hm__ipc_self_ident()))) {
        r = HM_ERROR_OUT_OF_HOST_MEMORY;
        goto out;
    }
    v->refs++;
    xhold(x);
    v->used = 1;
    *handle = (hm_ipc_handle_t *)v->wire;
    *size = v->len;
out:
    hm__mutex_unlock(&exports.lock);
    if (spare) xunmake(spare, te.provider);
    return r;
}

hm_result_t hm_ipc_put(hm_ipc_handle_t *handle) {
    if (hm_unlikely(!handle)) {
        HM_LOG_ERROR("hm_ipc_put(NULL)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    /* No decode: only a pointer hm_ipc_get returned is accepted, that is a
     * slot of a view arena (recognised by its address, with no read of the
     * caller's bytes) holding a view with gets outstanding: a copy of the
     * bytes, a corrupted or foreign pointer, or a view released since is
     * refused. */
    xdue_check();
    xview_t *v = (xview_t *)(void *)((unsigned char *)handle - offsetof(xview_t, wire));
    if (hm_unlikely(!hm__ipc_arena_owns(&view_arena, v) && !hm__ipc_arena_owns(&view_arena_big, v))) v = NULL;
    hm__mutex_lock(&exports.lock);
    if (hm_unlikely(!v || !v->x || !v->refs)) {
        hm__mutex_unlock(&exports.lock);
        HM_LOG_ERROR("hm_ipc_put(%p): not an outstanding handle from hm_ipc_get (put twice?)",
                     (void *)handle);
        return HM_ERROR_INVALID_HANDLE;
    }
    v->refs--;
    xent_t *x = v->x;
    xflush_t fl = {0};
    xunhold(x, &fl);
    if (hm_unlikely(v->gone) && !x->refs) xrelease(x); /* last user, detached */
    hm__mutex_unlock(&exports.lock);
    xflush_run(&fl);
    xreap();
    return HM_SUCCESS;
}

HM_RUN bool hm__ipc_range_take(hm_pool_t *pool, void *base, size_t size) {
    if (hm_likely(!atomic_load_explicit(&exports.count, memory_order_relaxed) &&
                  !atomic_load_explicit(&exports.norphans, memory_order_relaxed)))
        return false;
    hm__mutex_lock(&exports.lock);
    xent_t *x = export_find((uintptr_t)base);
    if (!x || x->opool != pool || !x->refs) {
        x = NULL;
        for (xent_t *o = exports.orphans; o && !x; o = o->onext)
            if (o->opool == pool && o->base == (uintptr_t)base && o->refs && !o->free_held &&
                !o->put_done)
                x = o;
    }
    bool taken = x && x->size == size;
    if (taken) {
        x->free_held = true;
        if (x->live) xdetach(x); /* used: an orphan until its last put */
    }
    hm__mutex_unlock(&exports.lock);
    return taken;
}

HM_RUN void hm__ipc_provider_gone(hm_provider_t *prov) {
    if (hm_likely(!atomic_load_explicit(&exports.norphans, memory_order_relaxed))) return;
    hm__mutex_lock(&exports.lock);
    for (xent_t *o = exports.orphans; o; o = o->onext) {
        if (o->prov != prov) continue;
        if (!o->put_done) (void)xprovider_put(o, "the provider goes with the range");
        o->put_done = true;
        o->free_held = false; /* its fini takes every range back */
    }
    hm__mutex_unlock(&exports.lock);
}

HM_RUN bool hm__ipc_range_release(hm_pool_t *pool, void *base, size_t size) {
    if (hm_likely(!atomic_load_explicit(&exports.count, memory_order_relaxed))) return false;
    bool taken = false;
    hm__mutex_lock(&exports.lock);
    xent_t *x = export_find((uintptr_t)base);
    if (x && x->pi && x->pi->pool == pool) {
        /* Its provider put comes before the range goes back (xfinish): a
         * provider that refuses the put keeps its export record, and the
         * range waits with the export for the put's retry. */
        taken = !x->refs && x->size == size;
        x->free_held = taken;
        xdetach(x);
    }
    hm__mutex_unlock(&exports.lock);
    return taken;
}

/* ------------------------------------------------------------------------ */
/* pool destroy                                                             */

static void exports_pool_destroy(hm_ipc_pool_t *pi) {
    size_t outstanding = 0;
    hm__mutex_lock(&exports.lock);
    exports.destroying = pi; /* xretry leaves this list to us: we walk it */
    /* Live entries: unused ones are released (or stay, put_retry, where the
     * provider refuses), used ones become orphans. */
    for (xent_t *x = pi->xhead, *nx; x; x = nx) {
        nx = x->lnext;
        /* Blocks freed while exported: the pool's fini takes all its memory back. */
        free(x->dfr);
        x->dfr = NULL;
        x->ndfr = x->cdfr = 0;
        if (x->live) xdetach(x);
    }
    /* The rest are orphans, used or put_retry. A used one stays exported
     * until its last put: its range, which the destroy is about to give
     * back, is the IPC layer's until then (hm__ipc_range_take), so the
     * provider hands those bytes to no other pool meanwhile and an importer
     * keeps them; a provider the pool owns is destroyed after that put
     * (hm__ipc_provider_defer). A put_retry one's provider export goes now
     * (a refusal now is final). */
    bool keep = true;
    for (xent_t *x = pi->xhead, *nx; x; x = nx) {
        nx = x->lnext;
        bool used = x->refs != 0;
        outstanding += used;
        if (!(keep && used)) {
            (void)xprovider_put(x, "the provider keeps the range");
            x->put_done = true;
        }
        x->pi = NULL;
        x->lprev = x->lnext = NULL;
        if (!used) {
            olist_unlink(x);
            exports.nretry -= x->put_retry;
            xent_free(x);
        }
    }
    pi->xhead = NULL;
    exports.destroying = NULL;
    hm__mutex_unlock(&exports.lock);
    if (outstanding)
        HM_LOG_WARN("pool '%s' destroyed with %zu exported allocations whose handles were not "
                    "put; %s", pi->pool->ops.name, outstanding,
                    keep ? "their ranges stay allocated in the provider until their last put"
                         : "their provider exports are released now");
}

void hm__ipc_export_pool_destroy(hm_pool_t *pool, hm_ipc_pool_t *pi) {
    exports_pool_destroy(pi);
    /* A put in flight may still be freeing deferred blocks into the pool;
     * a child's due frees into it are dropped (fini takes the memory). */
    while (atomic_load_explicit(&pi->flushers, memory_order_acquire)) sched_yield();
    hm__mutex_lock(&exports.lock);
    size_t kept = 0;
    for (size_t i = 0; i < exports.ndue; i++)
        if (exports.due[i].pool != pool) exports.due[kept++] = exports.due[i];
    exports.ndue = kept;
    atomic_store_explicit(&exports.due_count, kept, memory_order_relaxed);
    hm__mutex_unlock(&exports.lock);
}

size_t hm__ipc_export_count(void) { return atomic_load(&exports.count); }

/* ------------------------------------------------------------------------ */
/* fork                                                                     */

void hm__ipc_export_atfork(int phase) {
    if (phase == 0) {
        hm__mutex_lock(&exports.lock);
        hm__mutex_lock(&view_arena.lock);
        hm__mutex_lock(&view_arena_big.lock);
    } else {
        hm__mutex_unlock(&view_arena_big.lock);
        hm__mutex_unlock(&view_arena.lock);
        hm__mutex_unlock(&exports.lock);
    }
}

void hm__ipc_export_atfork_child(void) {
    /* The export cache names the parent: drop it (no provider put: the
     * exports are the parent's). Opened mappings are inherited and stay.
     * Blocks and ranges freed while the parent exported them are the
     * child's to give back (xdefer_orphan). */
    hm__mutex_lock(&exports.lock);
    for (size_t i = 0; i < exports.cap; i++) {
        for (xent_t *x = exports.b[i], *nx; x; x = nx) {
            nx = x->hnext;
            xdefer_orphan(x);
            xent_free(x);
        }
        exports.b[i] = NULL;
    }
    if (exports.vb) memset(exports.vb, 0, exports.vcap * sizeof(*exports.vb));
    exports.vn = 0;
    for (xent_t *x = exports.orphans, *nx; x; x = nx) {
        nx = x->onext;
        xdefer_orphan(x);
        xent_free(x);
    }
    for (hm_ipc_pool_t *pi = hm__ipc_pilist; pi; pi = pi->gnext) {
        pi->xhead = NULL;
        if (atomic_exchange_explicit(&pi->held, 0, memory_order_relaxed))
            hm__pool_hold_frees(pi->pool, false);
        for (int i = 0; i < HM_POOL_HOLD_SLOTS; i++) {
            atomic_store_explicit(&pi->pool->holds[i].base, 0, memory_order_relaxed);
            atomic_store_explicit(&pi->pool->holds[i].end, 0, memory_order_relaxed);
        }
        atomic_store_explicit(&pi->pool->holds_over, 0, memory_order_relaxed);
    }
    exports.n = 0;
    exports.hand = NULL;
    exports.orphans = NULL;
    exports.nretry = 0;
    atomic_store(&exports.count, 0);
    hm__mutex_unlock(&exports.lock);
}
