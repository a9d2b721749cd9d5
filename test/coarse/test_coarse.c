/* hetmem tests — the coarse layer against a reference model.
 * SPDX-License-Identifier: MIT
 *
 * Random alloc/free/split/merge/align sequences over a few regions; after
 * every step the coarse object's blocks must equal the model's (used ranges
 * exactly; free blocks = the maximal gaps between them inside each region),
 * its invariants must hold, and unaligned allocations must be best fit.
 * Then: error paths, growth through the owner callback, many threads under
 * TSan, and "free everything -> one range per region". */
#include "harness.h"
#include "providers/coarse/coarse.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define G 4096u

/* ---- reference model ---- */

typedef struct mrange {
    uintptr_t base;
    size_t size;
} mrange_t;

#define MAX_USED 4096
#define MAX_REGIONS 8

typedef struct model {
    mrange_t region[MAX_REGIONS];
    int nregion;
    mrange_t used[MAX_USED];
    int nused;
} model_t;

static int cmp_range(const void *a, const void *b) {
    uintptr_t x = ((const mrange_t *)a)->base, y = ((const mrange_t *)b)->base;
    return x < y ? -1 : x > y;
}

typedef struct mblock {
    uintptr_t base;
    size_t size;
    bool used;
} mblock_t;

#define MAX_BLOCKS (2 * MAX_USED + MAX_REGIONS)

/* The blocks the model expects, in address order. */
static int model_blocks(model_t *m, mblock_t *out) {
    mrange_t regs[MAX_REGIONS];
    memcpy(regs, m->region, sizeof(regs));
    qsort(regs, (size_t)m->nregion, sizeof(mrange_t), cmp_range);
    qsort(m->used, (size_t)m->nused, sizeof(mrange_t), cmp_range);
    int n = 0, u = 0;
    for (int r = 0; r < m->nregion; r++) {
        uintptr_t at = regs[r].base, end = regs[r].base + regs[r].size;
        while (u < m->nused && m->used[u].base < end) {
            if (m->used[u].base > at) out[n++] = (mblock_t){at, m->used[u].base - at, false};
            out[n++] = (mblock_t){m->used[u].base, m->used[u].size, true};
            at = m->used[u].base + m->used[u].size;
            u++;
        }
        if (at < end) out[n++] = (mblock_t){at, end - at, false};
    }
    return n;
}

typedef struct collect {
    mblock_t b[MAX_BLOCKS];
    int n;
} collect_t;

static void collect_fn(void *arg, void *base, size_t size, bool used, uint64_t tag) {
    collect_t *c = arg;
    if (c->n < MAX_BLOCKS) c->b[c->n] = (mblock_t){(uintptr_t)base, size, used};
    c->n++;
}

static collect_t got;
static mblock_t want[MAX_BLOCKS];

static int compare_with_model(hm_coarse_t *c, model_t *m, const char *step) {
    const char *err = hm__coarse_check(c);
    CHECK_MSG(!err, "after %s: invariant: %s", step, err ? err : "");
    got.n = 0;
    hm__coarse_foreach(c, collect_fn, &got);
    int nw = model_blocks(m, want);
    int ok = got.n == nw;
    for (int i = 0; ok && i < nw; i++)
        ok = got.b[i].base == want[i].base && got.b[i].size == want[i].size &&
             got.b[i].used == want[i].used;
    CHECK_MSG(ok, "after %s: %d blocks, model expects %d", step, got.n, nw);
    hm_coarse_stats_t st;
    hm__coarse_get_stats(c, &st);
    size_t alloc = 0, mapped = 0, largest = 0;
    for (int i = 0; i < nw; i++) {
        mapped += want[i].size;
        if (want[i].used) alloc += want[i].size;
        else if (want[i].size > largest) largest = want[i].size;
    }
    CHECK_MSG(st.allocated == alloc && st.mapped == mapped && st.free == mapped - alloc &&
                  st.largest_free == largest && st.used_blocks == (size_t)m->nused,
              "after %s: stats disagree with the model", step);
    return !err && ok;
}

/* Does some free block of the model hold sz bytes aligned to al? */
static int model_fits(model_t *m, size_t sz, size_t al) {
    int nw = model_blocks(m, want);
    for (int i = 0; i < nw; i++) {
        if (want[i].used) continue;
        uintptr_t at = (want[i].base + al - 1) & ~(uintptr_t)(al - 1);
        if (at - want[i].base <= want[i].size && want[i].size - (at - want[i].base) >= sz)
            return 1;
    }
    return 0;
}

/* The best-fit block for sz (no alignment): smallest, then lowest. */
static uintptr_t model_best_fit(model_t *m, size_t sz) {
    int nw = model_blocks(m, want);
    uintptr_t best = 0;
    size_t bs = SIZE_MAX;
    for (int i = 0; i < nw; i++)
        if (!want[i].used && want[i].size >= sz &&
            (want[i].size < bs || (want[i].size == bs && want[i].base < best))) {
            best = want[i].base;
            bs = want[i].size;
        }
    return best;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void model_remove(model_t *m, int i) { m->used[i] = m->used[--m->nused]; }

/* ---- the random sequence ---- */

static void test_random_model(void) {
    static model_t m;
    memset(&m, 0, sizeof(m));
    hm_coarse_t *c;
    REQUIRE_OK(hm__coarse_create(NULL, NULL, G, &c));
    /* Three regions of 4, 1 and 2 MiB inside one reservation (never
     * touched: the coarse layer only does arithmetic on addresses), with
     * gaps so that regions are not address neighbours. A 4th region directly
     * after the 1st: neighbours by address, never merged. */
    char *res = mmap(NULL, 16u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    REQUIRE(res != MAP_FAILED);
    uintptr_t rb = ((uintptr_t)res + (1u << 20) - 1) & ~(uintptr_t)((1u << 20) - 1);
    mrange_t regs[] = {{rb, 4u << 20}, {rb + (5u << 20), 1u << 20}, {rb + (7u << 20), 2u << 20},
                       {rb + (4u << 20), 256u << 10}};
    for (int i = 0; i < 4; i++) {
        REQUIRE_OK(hm__coarse_add_region(c, (void *)regs[i].base, regs[i].size, (uint64_t)i));
        m.region[m.nregion++] = regs[i];
    }
    compare_with_model(c, &m, "add regions");

    const int steps = 20000;
    char step[96];
    int fails = 0, n_alloc = 0, n_oom = 0, n_free = 0, n_split = 0, n_merge = 0, peak = 0;
    for (int s = 0; s < steps && fails < 5; s++) {
        uint64_t op = rnd() % 100;
        if (op < 45 || m.nused == 0) { /* alloc */
            size_t sz = (size_t)(rnd() % 64 + 1) * G - (size_t)(rnd() % G);
            size_t al = 0;
            uint64_t a = rnd() % 10;
            if (a >= 6) al = (size_t)G << (rnd() % 8); /* up to 512 KiB */
            else if (a == 5) al = 16;                  /* below the granularity */
            size_t sz_r = (sz + G - 1) & ~(size_t)(G - 1);
            size_t al_r = al < G ? G : al;
            int fits = model_fits(&m, sz_r, al_r);
            uintptr_t best = al_r == G ? model_best_fit(&m, sz_r) : 0;
            void *p;
            hm_result_t r = hm__coarse_alloc(c, sz, al, &p);
            snprintf(step, sizeof(step), "step %d alloc(%zu, %zu) -> %s", s, sz, al,
                     hm_result_string(r));
            if (r == HM_SUCCESS) {
                CHECK_MSG(fits, "%s but the model has no room", step);
                CHECK_MSG(((uintptr_t)p & (al_r - 1)) == 0, "%s: %p not aligned", step, p);
                if (al_r == G) CHECK_MSG((uintptr_t)p == best, "%s: not best fit", step);
                REQUIRE(m.nused < MAX_USED);
                m.used[m.nused++] = (mrange_t){(uintptr_t)p, sz_r};
                n_alloc++;
                if (m.nused > peak) peak = m.nused;
            } else {
                n_oom++;
                CHECK_MSG(r == HM_ERROR_OUT_OF_MEMORY && !fits, "%s, model fits=%d", step, fits);
            }
        } else if (op < 85) { /* free */
            int i = (int)(rnd() % (uint64_t)m.nused);
            mrange_t u = m.used[i];
            /* The size as asked may be anything that rounds to the block. */
            size_t sz = u.size - (size_t)(rnd() % G);
            hm_result_t r = hm__coarse_free(c, (void *)u.base, sz);
            snprintf(step, sizeof(step), "step %d free(%#zx, %zu)", s, (size_t)u.base, sz);
            CHECK_MSG(r == HM_SUCCESS, "%s -> %s", step, hm_result_string(r));
            model_remove(&m, i);
            n_free++;
        } else if (op < 93) { /* split */
            int i = (int)(rnd() % (uint64_t)m.nused);
            mrange_t u = m.used[i];
            if (u.size < 2 * G) continue;
            size_t first = (size_t)(rnd() % (u.size / G - 1) + 1) * G;
            hm_result_t r = hm__coarse_split(c, (void *)u.base, u.size, first);
            snprintf(step, sizeof(step), "step %d split(%#zx, %zu, %zu)", s, (size_t)u.base,
                     u.size, first);
            CHECK_MSG(r == HM_SUCCESS, "%s -> %s", step, hm_result_string(r));
            REQUIRE(m.nused < MAX_USED);
            m.used[i].size = first;
            m.used[m.nused++] = (mrange_t){u.base + first, u.size - first};
            n_split++;
        } else { /* merge two used neighbours in one region, if any */
            qsort(m.used, (size_t)m.nused, sizeof(mrange_t), cmp_range);
            int start = (int)(rnd() % (uint64_t)m.nused), done = 0;
            for (int k = 0; k + 1 < m.nused && !done; k++) {
                int i = (start + k) % (m.nused - 1);
                mrange_t a = m.used[i], b = m.used[i + 1];
                if (a.base + a.size != b.base) continue;
                int same = 0;
                for (int r = 0; r < m.nregion; r++)
                    same |= a.base >= m.region[r].base &&
                            b.base + b.size <= m.region[r].base + m.region[r].size;
                hm_result_t r = hm__coarse_merge(c, (void *)a.base, (void *)b.base,
                                                 a.size + b.size);
                snprintf(step, sizeof(step), "step %d merge(%#zx, %#zx)", s, (size_t)a.base,
                         (size_t)b.base);
                if (same) {
                    CHECK_MSG(r == HM_SUCCESS, "%s -> %s", step, hm_result_string(r));
                    m.used[i].size += b.size;
                    model_remove(&m, i + 1);
                    n_merge++;
                } else {
                    /* Neighbours by address only: two regions never merge. */
                    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT, "%s across regions -> %s", step,
                              hm_result_string(r));
                }
                done = 1;
            }
            if (!done) continue;
        }
        if (!compare_with_model(c, &m, step)) fails++;
    }
    printf("model: %d allocs (%d out of memory), %d frees, %d splits, %d merges, peak %d\n",
           n_alloc, n_oom, n_free, n_split, n_merge, peak);
    /* Free everything: exactly one free range per region. */
    while (m.nused) {
        CHECK_OK(hm__coarse_free(c, (void *)m.used[0].base, m.used[0].size));
        model_remove(&m, 0);
    }
    compare_with_model(c, &m, "free all");
    hm_coarse_stats_t st;
    hm__coarse_get_stats(c, &st);
    CHECK_EQ(st.free_blocks, 4);
    CHECK_EQ(st.allocated, 0);
    CHECK_EQ(st.largest_free, 4u << 20);
    hm__coarse_destroy(c);
    munmap(res, 16u << 20);
}

/* ---- error paths ---- */

static void test_errors(void) {
    hm_coarse_t *c;
    CHECK_RES(hm__coarse_create(NULL, NULL, 3000, &c), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm__coarse_create(NULL, NULL, G, &c));
    static char buf[64 * G] __attribute__((aligned(4096)));
    void *p;
    CHECK_RES(hm__coarse_alloc(c, G, 0, &p), HM_ERROR_OUT_OF_MEMORY); /* no region, no grow */
    CHECK_RES(hm__coarse_add_region(c, buf + 1, 8 * G, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_add_region(c, buf, 8 * G + 1, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_add_region(c, buf, 0, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm__coarse_add_region(c, buf + 8 * G, 8 * G, 7));
    CHECK_RES(hm__coarse_add_region(c, buf, 9 * G, 0), HM_ERROR_INVALID_ARGUMENT);  /* overlap */
    CHECK_RES(hm__coarse_add_region(c, buf + 15 * G, 4 * G, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm__coarse_add_region(c, buf, 8 * G, 3)); /* touching below: fine */
    CHECK(!hm__coarse_check(c));

    CHECK_RES(hm__coarse_alloc(c, G, 3, &p), HM_ERROR_INVALID_ALIGNMENT);
    CHECK_RES(hm__coarse_alloc(c, 0, 0, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_alloc(c, SIZE_MAX - 5, 0, &p), HM_ERROR_OUT_OF_MEMORY);
    CHECK_RES(hm__coarse_alloc(c, 9 * G, 0, &p), HM_ERROR_OUT_OF_MEMORY); /* regions never join */
    void *a, *b;
    REQUIRE_OK(hm__coarse_alloc(c, 2 * G, 0, &a));
    REQUIRE_OK(hm__coarse_alloc(c, 2 * G, 0, &b));
    CHECK((char *)b == (char *)a + 2 * G);
    CHECK_RES(hm__coarse_free(c, a, 3 * G), HM_ERROR_INVALID_ARGUMENT);      /* wrong size */
    CHECK_RES(hm__coarse_free(c, (char *)a + G, G), HM_ERROR_INVALID_ARGUMENT); /* interior */
    CHECK_RES(hm__coarse_free(c, buf + 40 * G, G), HM_ERROR_INVALID_ARGUMENT); /* foreign */
    CHECK_RES(hm__coarse_free(c, (char *)b + 2 * G, G), HM_ERROR_DOUBLE_FREE); /* never used */
    CHECK_RES(hm__coarse_split(c, a, 2 * G, G / 2), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_split(c, a, 2 * G, 2 * G), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_split(c, a, 3 * G, G), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_merge(c, b, a, 4 * G), HM_ERROR_INVALID_ARGUMENT);   /* wrong order */
    CHECK_RES(hm__coarse_merge(c, a, b, 3 * G), HM_ERROR_INVALID_ARGUMENT);   /* wrong total */
    hm_coarse_range_t rg;
    CHECK_OK(hm__coarse_lookup(c, (char *)a + 100, G, &rg));
    CHECK(rg.block_base == a && rg.block_size == 2 * G && rg.region_base == buf &&
          rg.region_tag == 3);
    CHECK_RES(hm__coarse_lookup(c, (char *)a + G, 2 * G, &rg), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__coarse_lookup(c, (char *)b + 2 * G, G, &rg), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm__coarse_merge(c, a, b, 4 * G));
    CHECK_OK(hm__coarse_split(c, a, 4 * G, 3 * G));
    CHECK_OK(hm__coarse_free(c, a, 3 * G));
    CHECK_RES(hm__coarse_free(c, a, 3 * G), HM_ERROR_DOUBLE_FREE);
    CHECK_OK(hm__coarse_free(c, (char *)a + 3 * G, G));
    CHECK(!hm__coarse_check(c));
    /* An alignment nothing can satisfy in 8-page regions. */
    CHECK_RES(hm__coarse_alloc(c, G, 1u << 30, &p), HM_ERROR_OUT_OF_MEMORY);
    /* The whole of one region, aligned to its size when it is. */
    REQUIRE_OK(hm__coarse_alloc(c, 8 * G, 0, &a));
    REQUIRE_OK(hm__coarse_alloc(c, 8 * G, 0, &b));
    CHECK_RES(hm__coarse_alloc(c, G, 0, &p), HM_ERROR_OUT_OF_MEMORY);
    hm_coarse_stats_t st;
    hm__coarse_get_stats(c, &st);
    CHECK_EQ(st.free, 0);
    CHECK_EQ(st.largest_free, 0);
    CHECK_EQ(st.regions, 2);
    hm__coarse_destroy(c); /* with live blocks: forgotten, no leak */
}

/* ---- growth through the owner ---- */

typedef struct grower {
    _Atomic int grows, releases, fail_next;
    _Atomic size_t mapped;
} grower_t;

static hm_result_t grow_cb(void *owner, size_t size, size_t alignment, void **base, size_t *len,
                           uint64_t *tag) {
    grower_t *g = owner;
    if (atomic_exchange(&g->fail_next, 0)) return HM_ERROR_DRIVER;
    size_t chunk = 1u << 20;
    size_t need = size + (alignment > G ? alignment - G : 0);
    if (need < chunk) need = chunk;
    void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return HM_ERROR_OUT_OF_MEMORY;
    *base = p;
    *len = need;
    *tag = (uint64_t)atomic_fetch_add(&g->grows, 1);
    atomic_fetch_add(&g->mapped, need);
    return HM_SUCCESS;
}

static void release_cb(void *owner, void *base, size_t len, uint64_t tag) {
    grower_t *g = owner;
    atomic_fetch_add(&g->releases, 1);
    atomic_fetch_sub(&g->mapped, len);
    munmap(base, len);
}

static const hm_coarse_ops_t grow_ops = {.grow = grow_cb, .release = release_cb};

static void test_grow(void) {
    grower_t g = {0};
    hm_coarse_t *c;
    REQUIRE_OK(hm__coarse_create(&grow_ops, &g, G, &c));
    void *a, *b, *d;
    REQUIRE_OK(hm__coarse_alloc(c, 100, 0, &a));
    CHECK_EQ(g.grows, 1);
    REQUIRE_OK(hm__coarse_alloc(c, 100, 0, &b)); /* from the same region */
    CHECK_EQ(g.grows, 1);
    memset(a, 1, 100);
    REQUIRE_OK(hm__coarse_alloc(c, 3u << 20, 2u << 20, &d)); /* bigger than a chunk: grows */
    CHECK_EQ(g.grows, 2);
    CHECK(((uintptr_t)d & ((2u << 20) - 1)) == 0);
    memset(d, 2, 3u << 20);
    atomic_store(&g.fail_next, 1);
    void *e;
    CHECK_RES(hm__coarse_alloc(c, 8u << 20, 0, &e), HM_ERROR_DRIVER); /* owner's error */
    CHECK(!hm__coarse_check(c));
    CHECK_OK(hm__coarse_free(c, a, 100));
    CHECK_OK(hm__coarse_free(c, b, 100));
    CHECK_OK(hm__coarse_free(c, d, 3u << 20));
    hm_coarse_stats_t st;
    hm__coarse_get_stats(c, &st);
    CHECK_EQ(st.regions, 2);
    CHECK_EQ(st.free_blocks, 2); /* free everything: one range per region */
    CHECK_EQ(st.mapped, g.mapped);
    hm__coarse_destroy(c);
    CHECK_EQ(g.releases, 2);
    CHECK_EQ(g.mapped, 0);
}

/* A grower like the file provider's: each region is just what was asked
 * (at least 4 granules), aligned as asked, and otherwise placed one granule
 * past a 64-granule boundary, so no block in it is aligned to more. */
static hm_result_t tight_grow_cb(void *owner, size_t size, size_t alignment, void **base,
                                 size_t *len, uint64_t *tag) {
    grower_t *g = owner;
    size_t rlen = size < 4 * G ? 4 * G : size;
    size_t span = 128 * G + rlen + alignment;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return HM_ERROR_OUT_OF_MEMORY;
    uintptr_t at = (uintptr_t)m;
    if (alignment > G) at = (at + alignment - 1) & ~(uintptr_t)(alignment - 1);
    else at = ((at + 64 * G - 1) & ~(uintptr_t)(64 * G - 1)) + G;
    if (at > (uintptr_t)m) munmap(m, at - (uintptr_t)m);
    if ((uintptr_t)m + span > at + rlen) munmap((void *)(at + rlen), (uintptr_t)m + span - at - rlen);
    *base = (void *)at;
    *len = rlen;
    *tag = (uint64_t)atomic_fetch_add(&g->grows, 1);
    atomic_fetch_add(&g->mapped, rlen);
    return HM_SUCCESS;
}

static const hm_coarse_ops_t tight_ops = {.grow = tight_grow_cb, .release = release_cb};

/* An aligned request that no free block can hold, while more free blocks
 * than the fit search probes are too small for any alignment: the region
 * grown for it must serve it (it is not larger than size + alignment, so a
 * search over all free blocks would stop before reaching it). */
static void test_grow_aligned_past_probes(void) {
    grower_t g = {0};
    hm_coarse_t *c;
    REQUIRE_OK(hm__coarse_create(&tight_ops, &g, G, &c));
    enum { N = 20 };
    void *p[2 * N];
    for (int i = 0; i < 2 * N; i++) REQUIRE_OK(hm__coarse_alloc(c, 2 * G, 0, &p[i]));
    CHECK_EQ(g.grows, N); /* two per region */
    for (int i = 1; i < 2 * N; i += 2) CHECK_OK(hm__coarse_free(c, p[i], 2 * G));
    /* Now N free blocks of 2 granules, none aligned to 16 granules. */
    void *a = NULL;
    CHECK_OK(hm__coarse_alloc(c, 2 * G, 16 * G, &a));
    CHECK_EQ(g.grows, N + 1);
    CHECK(a && ((uintptr_t)a & (16 * G - 1)) == 0);
    CHECK(!hm__coarse_check(c));
    if (a) CHECK_OK(hm__coarse_free(c, a, 2 * G));
    for (int i = 0; i < 2 * N; i += 2) CHECK_OK(hm__coarse_free(c, p[i], 2 * G));
    hm__coarse_destroy(c);
    CHECK_EQ(g.mapped, 0);
}

/* ---- many threads (run under TSan in the sanitizer build) ---- */

#define THREADS 4
#define ITERS 20000

typedef struct worker {
    hm_coarse_t *c;
    int id;
    unsigned seed;
    int errors;
} worker_t;

static void *worker_fn(void *arg) {
    worker_t *w = arg;
    void *live[64] = {0};
    size_t sizes[64] = {0};
    for (int i = 0; i < ITERS; i++) {
        int k = (int)(rand_r(&w->seed) % 64);
        if (live[k]) {
            /* Our tag must still be there: nobody else got our range. */
            uint64_t *p = live[k];
            if (p[0] != (uint64_t)w->id || p[sizes[k] / 8 - 1] != (uint64_t)k) w->errors++;
            if (hm__coarse_free(w->c, live[k], sizes[k]) != HM_SUCCESS) w->errors++;
            live[k] = NULL;
        } else {
            size_t sz = (size_t)(rand_r(&w->seed) % 16 + 1) * G;
            size_t al = (rand_r(&w->seed) % 4 == 0) ? (size_t)G << (rand_r(&w->seed) % 6) : 0;
            if (hm__coarse_alloc(w->c, sz, al, &live[k]) != HM_SUCCESS) {
                w->errors++;
                live[k] = NULL;
                continue;
            }
            if (al && ((uintptr_t)live[k] & (al - 1))) w->errors++;
            uint64_t *p = live[k];
            p[0] = (uint64_t)w->id;
            p[sz / 8 - 1] = (uint64_t)k;
            sizes[k] = sz;
        }
        if (i % 4096 == 0) {
            hm_coarse_stats_t st;
            hm__coarse_get_stats(w->c, &st);
            if (st.allocated + st.free != st.mapped) w->errors++;
        }
    }
    for (int k = 0; k < 64; k++)
        if (live[k] && hm__coarse_free(w->c, live[k], sizes[k]) != HM_SUCCESS) w->errors++;
    return NULL;
}

static void test_threads(void) {
    grower_t g = {0};
    hm_coarse_t *c;
    REQUIRE_OK(hm__coarse_create(&grow_ops, &g, G, &c));
    pthread_t t[THREADS];
    worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker_t){.c = c, .id = i + 1, .seed = 1234u + (unsigned)i};
        REQUIRE(pthread_create(&t[i], NULL, worker_fn, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].errors, 0);
    }
    CHECK(!hm__coarse_check(c));
    hm_coarse_stats_t st;
    hm__coarse_get_stats(c, &st);
    CHECK_EQ(st.allocated, 0);
    CHECK_EQ(st.used_blocks, 0);
    CHECK_EQ(st.free_blocks, st.regions); /* free everything: one range per region */
    CHECK(st.regions >= 1);
    hm__coarse_destroy(c);
    CHECK_EQ(g.mapped, 0);
}

int main(void) {
    test_errors();
    test_random_model();
    test_grow();
    test_grow_aligned_past_probes();
    test_threads();
    return hm_test_finish();
}
