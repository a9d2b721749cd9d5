/* hetmem tests — the native pool's own contract: size classes, alignment,
 * refused frees, statistics, trim, retained memory, params, remote frees,
 * abandoned heaps and provider failures. The pool suite over every provider
 * kind (both remote-free queues) is test/pools/test_pool_matrix.c.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ---- the native pool's own cases ---- */

#define RW (HM_OS_PROT_READ | HM_OS_PROT_WRITE)

static hm_pool_t *os_pool(hm_native_params_t *params, uint32_t flags, unsigned prot) {
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, prot, &prov));
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_native_pool_create(prov, params, HM_POOL_FLAG_OWN_PROVIDER | flags, &pool));
    return pool;
}

/* An RW pool over the OS provider whose remote frees go through `queue`. */
static hm_pool_t *queue_pool(hm_native_remote_queue_t queue) {
    hm_native_params_t *np;
    REQUIRE_OK(hm_native_params_create(&np));
    REQUIRE_OK(hm_native_params_set_remote_queue(np, queue));
    hm_pool_t *pool = os_pool(np, 0, RW);
    hm_native_params_destroy(np);
    return pool;
}

static void test_size_classes(void) {
    hm_test_set_context("size classes");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    size_t prev_us = 0; /* of size - 1 */
    for (size_t size = 1; size <= 40000; size += size < 4096 ? 1 : 37) {
        void *p = hm_pool_malloc(pool, size);
        REQUIRE(p != NULL);
        size_t us = hm_pool_malloc_usable_size(pool, p);
        CHECK_MSG(us >= size, "usable %zu < %zu", us, size);
        /* The smallest class that fits (every size up to 4 KiB, which the
         * allocation fast path classes by table): a size in a new class
         * follows the end of the previous one. */
        if (size <= 4096 && size > 1 && us != prev_us)
            CHECK_MSG(prev_us == size - 1, "size %zu -> block %zu, size %zu -> block %zu",
                      size - 1, prev_us, size, us);
        prev_us = us;
        /* Internal fragmentation: <= 12.5% of the block above 128 B, the
         * 16-byte floor in (64, 128]. */
        if (size > 128)
            CHECK_MSG((us - size) * 8 <= us, "size %zu -> block %zu: %.1f%% waste", size, us,
                      100.0 * (double)(us - size) / (double)us);
        else if (size > 64)
            CHECK_MSG(us - size < 16, "size %zu -> block %zu", size, us);
        CHECK_MSG(((uintptr_t)p & (size > 8 ? 15 : 7)) == 0, "%p misaligned for %zu", p, size);
        memset(p, 0xab, size);
        CHECK_OK(hm_pool_free(pool, p));
    }
    CHECK_OK(hm_pool_destroy(pool));
}

static void test_alignment(void) {
    hm_test_set_context("alignment");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    for (size_t a = 1; a <= 4 * MIB; a <<= 1) {
        const size_t sizes[] = {1, 24, 100, 1000, 5000, 70000};
        for (size_t i = 0; i < 6; i++) {
            void *p[5];
            for (int k = 0; k < 5; k++) {
                p[k] = hm_pool_aligned_malloc(pool, sizes[i], a);
                REQUIRE(p[k] != NULL);
                CHECK_MSG(((uintptr_t)p[k] & (a - 1)) == 0, "%p not aligned to %zu", p[k], a);
                memset(p[k], 1, sizes[i]);
            }
            for (int k = 0; k < 5; k++) CHECK_OK(hm_pool_free(pool, p[k]));
        }
    }
    CHECK_OK(hm_pool_destroy(pool));
}

static void test_bad_frees(void) {
    hm_test_set_context("refused frees");
    /* Untracked, so that the pool itself (not the tracker) must refuse. */
    hm_pool_t *pool = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, RW);
    char *p = hm_pool_malloc(pool, 100);
    char *q = hm_pool_malloc(pool, 100);
    REQUIRE(p && q);
    CHECK_RES(hm_pool_free(pool, p + 8), HM_ERROR_INVALID_ARGUMENT); /* interior */
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_RES(hm_pool_free(pool, p), HM_ERROR_DOUBLE_FREE);
    char *big = hm_pool_malloc(pool, 4 * MIB);
    REQUIRE(big);
    CHECK_RES(hm_pool_free(pool, big + 4096), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_pool_free(pool, big));
    CHECK_RES(hm_pool_free(pool, big), HM_ERROR_INVALID_ARGUMENT);
    int local;
    CHECK_RES(hm_pool_free(pool, &local), HM_ERROR_INVALID_ARGUMENT);
    /* A second pool's block is foreign to the first. */
    hm_pool_t *other = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, RW);
    void *o = hm_pool_malloc(other, 100);
    REQUIRE(o);
    CHECK_RES(hm_pool_free(pool, o), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_pool_free(other, o));
    CHECK_OK(hm_pool_free(pool, q));
    /* Still healthy. */
    void *r = hm_pool_malloc(pool, 100);
    CHECK(r != NULL);
    CHECK_OK(hm_pool_free(pool, r));
    CHECK_OK(hm_pool_destroy(other));
    CHECK_OK(hm_pool_destroy(pool));
}

/* Interior and past-the-end pointers are refused (HM_ERROR_INVALID_ARGUMENT,
 * nothing freed) in every size class up to 64 KiB, by the owner and by
 * another thread, also right after that thread's valid free into the same
 * bitmap word (the remote free it caches, which validates without the page
 * map): one multiply gives the block index and the exact-block test
 * (nv_slab.magic). Past the end: the address one block past a slab's last
 * block, where the slab's span is not a multiple of the block size. */
typedef struct ifree {
    hm_pool_t *pool;
    char *valid;  /* freed first (NULL: none) */
    char *a;      /* interior frees of a, or of a itself with `exact` */
    size_t u;
    int exact;
    int accepted; /* bad frees that were not refused */
} ifree_t;

static int interior_frees(hm_pool_t *pool, char *a, size_t u) {
    const size_t off[] = {1, 8, (u / 2) & ~(size_t)7, u - 8, u - 1};
    int accepted = 0;
    for (size_t k = 0; k < sizeof off / sizeof off[0]; k++) {
        if (!off[k] || off[k] >= u) continue;
        accepted += hm_pool_free(pool, a + off[k]) != HM_ERROR_INVALID_ARGUMENT;
        accepted += hm_pool_malloc_usable_size(pool, a + off[k]) != 0;
    }
    return accepted;
}

static void *ifree_thread(void *arg) {
    ifree_t *f = arg;
    /* A heap of its own, found by thread pointer: its frees take the fast
     * paths (and the cached remote free). */
    void *own = hm_pool_malloc(f->pool, 8);
    CHECK(own != NULL);
    CHECK_OK(hm_pool_free(f->pool, own));
    if (f->valid) CHECK_OK(hm_pool_free(f->pool, f->valid));
    if (f->exact) f->accepted = hm_pool_free(f->pool, f->a) != HM_ERROR_INVALID_ARGUMENT;
    else f->accepted = interior_frees(f->pool, f->a, f->u);
    hm_pool_trim(f->pool); /* publishes this thread's batch */
    return NULL;
}

static void run_ifree(ifree_t *f) {
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, ifree_thread, f) == 0);
    pthread_join(t, NULL);
}

static void test_interior_frees(void) {
    hm_test_set_context("interior and past-the-end frees");
    hm_log_level_t old = hm_log_get_level();
    hm_pool_t *pool = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, RW);
    int classes = 0;
    for (size_t size = 1, u; size <= 64 * KIB; size = u + 1, classes++) {
        char *a = hm_pool_malloc(pool, size), *b = hm_pool_malloc(pool, size);
        REQUIRE(a && b);
        u = hm_pool_malloc_usable_size(pool, a);
        REQUIRE(u >= size);
        hm_log_set_level(HM_LOG_OFF);
        int own = interior_frees(pool, a, u);
        ifree_t f = {pool, b, a, u, 0, 0};
        run_ifree(&f);
        hm_log_set_level(old);
        CHECK_MSG(own == 0 && f.accepted == 0, "class %zu: %d (owner) and %d (remote) of the "
                  "interior frees accepted", u, own, f.accepted);
        CHECK_OK(hm_pool_free(pool, a));
    }
    CHECK(classes > 40);
    CHECK_OK(hm_pool_trim(pool)); /* drains the remote frees */
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)0);
    CHECK_OK(hm_pool_destroy(pool));

    /* Past the end: blocks come out of a fresh slab in address order from
     * its base, until the next slab. */
    const size_t sizes[] = {48, 80, 112, 144, 320, 1280, 2304, 3584};
    enum { MAXN = 64 * 1024 / 48 + 2 };
    static char *blk[MAXN];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t u = sizes[k];
        pool = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, RW);
        int n = (int)(64 * KIB / u) + 2, count = 0;
        for (int i = 0; i < n; i++) REQUIRE(blk[i] = hm_pool_malloc(pool, u));
        REQUIRE(hm_pool_malloc_usable_size(pool, blk[0]) == u);
        while (count < n && blk[count] == blk[0] + (size_t)count * u) count++;
        char *end = blk[0] + (size_t)count * u;
        CHECK_MSG(count < n && ((uintptr_t)end & (64 * KIB - 1)) != 0,
                  "class %zu: %d blocks in the first slab", u, count);
        hm_log_set_level(HM_LOG_OFF);
        hm_result_t r = hm_pool_free(pool, end);
        size_t usable = hm_pool_malloc_usable_size(pool, end);
        ifree_t f = {pool, blk[count - 1], end, u, 1, 0}; /* the word's last block first */
        run_ifree(&f);
        hm_log_set_level(old);
        CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT && usable == 0 && !f.accepted,
                  "class %zu: the address past the slab's last block: %s, usable %zu, remote %d",
                  u, hm_result_string(r), usable, f.accepted);
        for (int i = 0; i < n; i++)
            if (i != count - 1) CHECK_OK(hm_pool_free(pool, blk[i]));
        CHECK_OK(hm_pool_trim(pool));
        CHECK_OK(hm_pool_get_stats(pool, &st));
        CHECK_EQ(st.bytes_requested, (size_t)0);
        CHECK_OK(hm_pool_destroy(pool));
    }
}

/* The stack's bound, exactly, beside a neighbour: each class's stack has
 * an area of its own (127 entries, told full and empty by its alignment,
 * nv_cls). 10 frees of 48-byte blocks are stacked, then 200 of 64-byte
 * blocks (the next class, whose area follows): the first 127 are stacked,
 * the rest only set their bits. The 48-byte stack then gives back its own
 * 10 blocks newest first, the 64-byte one its 127 newest first, and the
 * other 73 come back from the bitmap. Each class fills exactly its slab,
 * so that its class word is empty and allocations pop the stack. */
static int cmp_ptr(const void *a, const void *b);

static void test_stack_bound(void) {
    hm_test_set_context("free-block stack bound");
    hm_pool_t *pool = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, RW);
    enum { NA = 65536 / 48, NB = 65536 / 64, FA = 10, FB = 200, CAP = 127 };
    static void *a[NA], *b[NB], *c[FB];
    for (int i = 0; i < NA; i++) REQUIRE(a[i] = hm_pool_malloc(pool, 48));
    for (int i = 0; i < NB; i++) REQUIRE(b[i] = hm_pool_malloc(pool, 64));
    for (int i = 0; i < FA; i++) CHECK_OK(hm_pool_free(pool, a[3 * i]));
    for (int i = 0; i < FB; i++) CHECK_OK(hm_pool_free(pool, b[2 * i + 1]));
    for (int i = FA - 1; i >= 0; i--) {
        void *x = hm_pool_malloc(pool, 48);
        CHECK_MSG(x == a[3 * i], "48 B: got %p, want %p (freed %d-th last)", x, a[3 * i], FA - i);
    }
    for (int i = CAP - 1; i >= 0; i--) {
        void *x = hm_pool_malloc(pool, 64);
        CHECK_MSG(x == b[2 * i + 1], "64 B: got %p, want %p (freed %d-th last)", x, b[2 * i + 1],
                  CAP - i);
    }
    for (int i = 0; i < FB - CAP; i++) REQUIRE(c[i] = hm_pool_malloc(pool, 64));
    qsort(c, FB - CAP, sizeof(void *), cmp_ptr);
    for (int i = 0; i < FB - CAP; i++)
        CHECK_MSG(c[i] == b[2 * (CAP + i) + 1], "64 B from the bitmap: got %p, want %p", c[i],
                  b[2 * (CAP + i) + 1]);
    for (int i = 0; i < NA; i++) CHECK_OK(hm_pool_free(pool, a[i]));
    for (int i = 0; i < NB; i++) CHECK_OK(hm_pool_free(pool, b[i]));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)0);
    CHECK_OK(hm_pool_destroy(pool));
}

static void test_stats_and_trim(void) {
    hm_test_set_context("statistics and trim");
    hm_native_params_t *np;
    REQUIRE_OK(hm_native_params_create(&np));
    REQUIRE_OK(hm_native_params_set_retained_bytes(np, 1 * MIB));
    hm_pool_t *pool = os_pool(np, 0, RW);
    hm_native_params_destroy(np);
    enum { N = 20000 };
    static void *ptr[N];
    for (int i = 0; i < N; i++) {
        ptr[i] = hm_pool_malloc(pool, 100);
        REQUIRE(ptr[i]);
    }
    void *big = hm_pool_malloc(pool, 100 * KIB);
    REQUIRE(big);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, N * 112 + hm_pool_malloc_usable_size(pool, big));
    CHECK(st.bytes_from_provider >= (size_t)N * 112);
    CHECK(st.slabs >= (size_t)N * 112 / (64 * KIB));
    size_t held = st.bytes_from_provider;
    for (int i = 0; i < N; i++) CHECK_OK(hm_pool_free(pool, ptr[i]));
    CHECK_OK(hm_pool_free(pool, big));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    /* Past the retained 1 MiB, empty slabs went back. */
    CHECK_MSG(st.bytes_from_provider <= 1 * MIB + 128 * KIB + 256 * KIB,
              "held %zu after freeing everything (was %zu)", st.bytes_from_provider, held);
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    CHECK_EQ(st.provider_allocs, 0);
    CHECK_OK(hm_pool_destroy(pool));
}

static void test_params(void) {
    hm_test_set_context("params");
    hm_native_params_t *np;
    CHECK_RES(hm_native_params_create(NULL), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_native_params_create(&np));
    CHECK_RES(hm_native_params_set_slab_size(np, 3000), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_slab_size(np, 1024), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_slab_size(np, (size_t)1 << 30), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_size_class_limit(np, 8), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_size_class_limit(np, 4 * MIB), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_remote_batch(np, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_remote_batch(np, 1000), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_remote_queue(np, (hm_native_remote_queue_t)7),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_defaults(np, (hm_native_defaults_t)9),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_native_params_set_slab_size(NULL, 4096), HM_ERROR_INVALID_ARGUMENT);
    /* Large threshold below the size-class limit: refused at creation. */
    REQUIRE_OK(hm_native_params_set_size_class_limit(np, 64 * KIB));
    REQUIRE_OK(hm_native_params_set_large_threshold(np, 16 * KIB));
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, RW, &prov));
    hm_pool_t *pool = NULL;
    CHECK_RES(hm_native_pool_create(prov, np, 0, &pool), HM_ERROR_INVALID_ARGUMENT);
    CHECK(pool == NULL);
    /* A params object of another kind is refused, not misread. */
    hm_os_params_t *osp;
    REQUIRE_OK(hm_os_params_create(&osp));
    CHECK_RES(hm_native_pool_create(prov, (const hm_native_params_t *)osp, 0, &pool),
              HM_ERROR_INVALID_ARGUMENT);
    hm_os_params_destroy(osp);
    /* A valid custom set works. */
    REQUIRE_OK(hm_native_params_set_large_threshold(np, 1 * MIB));
    REQUIRE_OK(hm_native_params_set_slab_size(np, 256 * KIB));
    REQUIRE_OK(hm_native_params_set_remote_batch(np, 1));
    REQUIRE_OK(hm_native_params_set_defaults(np, HM_NATIVE_DEFAULTS_DEVICE));
    CHECK_OK(hm_native_pool_create(prov, np, 0, &pool));
    if (pool) {
        void *p = hm_pool_malloc(pool, 60 * KIB);
        CHECK(p && ((uintptr_t)p & 15) == 0);
        CHECK_EQ(hm_pool_malloc_usable_size(pool, p), 60 * KIB); /* a class of its own */
        CHECK_OK(hm_pool_free(pool, p));
        CHECK_OK(hm_pool_destroy(pool));
    }
    CHECK_OK(hm_native_params_destroy(np));
    CHECK_OK(hm_provider_destroy(prov));
}

/* PROT_NONE: any touch by the pool faults, so surviving is the proof. */
static void test_prot_none(void) {
    hm_test_set_context("PROT_NONE provider");
    hm_pool_t *pool = os_pool(NULL, 0, HM_OS_PROT_NONE);
    CHECK(!hm_provider_cpu_accessible(hm_pool_get_provider(pool)));
    enum { N = 5000 };
    static void *p[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            size_t size = (size_t)1 << (i % 23);
            p[i] = hm_pool_malloc(pool, size);
            REQUIRE(p[i]);
        }
        for (int i = 0; i < N; i += 2) CHECK_OK(hm_pool_free(pool, p[i]));
        for (int i = 1; i < N; i += 2) CHECK_OK(hm_pool_free(pool, p[i]));
    }
    errno = 0;
    CHECK(hm_pool_calloc(pool, 1, 64) == NULL);
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_destroy(pool));
}

/* ---- threads: remote frees, abandoned heaps ---- */

typedef struct handoff {
    hm_pool_t *pool;
    void **ptrs;
    int n;
    size_t size;
} handoff_t;

static void *alloc_thread(void *arg) {
    handoff_t *h = arg;
    for (int i = 0; i < h->n; i++) {
        h->ptrs[i] = hm_pool_malloc(h->pool, h->size);
        if (h->ptrs[i]) memset(h->ptrs[i], (int)(i & 0xff), h->size);
    }
    return NULL; /* exits: its heap is abandoned with every block live */
}

static int free_all(handoff_t *h) {
    for (int i = 0; i < h->n; i++) {
        unsigned char *c = h->ptrs[i];
        if (c[0] != (unsigned char)(i & 0xff) || c[h->size - 1] != (unsigned char)(i & 0xff))
            return 1;
        if (hm_pool_free(h->pool, c) != HM_SUCCESS) return 2;
    }
    return 0;
}

static void test_remote_and_abandoned(hm_native_remote_queue_t queue, const char *label) {
    hm_test_set_context(label);
    hm_pool_t *pool = queue_pool(queue);
    /* The main thread gets a heap of its own first. */
    void *mine = hm_pool_malloc(pool, 64);
    REQUIRE(mine);
    enum { N = 30000 };
    void **ptrs = calloc(N, sizeof(void *));
    REQUIRE(ptrs);
    for (int round = 0; round < 4; round++) {
        handoff_t h = {pool, ptrs, N, (size_t)(16 << (round % 3))};
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, alloc_thread, &h) == 0);
        pthread_join(t, NULL);
        for (int i = 0; i < N; i++) REQUIRE(ptrs[i]);
        /* Remote frees into the abandoned heap (the next round's thread
         * adopts it and drains them). */
        CHECK_EQ(free_all(&h), 0);
    }
    CHECK_OK(hm_pool_free(pool, mine));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK(st.remote_frees_drained >= 3 * N - 126);
    /* Trim publishes this thread's last batch and drains the last round's frees from the abandoned heap. */
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.remote_frees_published, 4 * N);
    CHECK_EQ(st.remote_frees_drained, st.remote_frees_published);
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    free(ptrs);
    CHECK_OK(hm_pool_destroy(pool));
}

/* nv_pool.own, the heap looked at before the by_tp table: the pool's first
 * thread is one that exits, so the slot holds an abandoned heap; the
 * threads after it (glibc reuses a joined thread's stack, so often its
 * thread pointer too) adopt or make heaps and take the slot over, and their
 * blocks, local frees and frees of the previous thread's blocks stay exact
 * (contents intact, statistics back to zero, every slab returned). */
typedef struct own_arg {
    hm_pool_t *pool;
    void **prev, **mine;
    int n;
    unsigned char prev_fill, fill;
} own_arg_t;
static _Atomic int g_own_errors;
static int all_distinct(void **p, size_t n);

static size_t own_size(int i) { return (size_t)(8 + i % 121); }

static int own_check(const unsigned char *c, size_t size, unsigned char fill) {
    for (size_t k = 0; k < size; k++)
        if (c[k] != fill) return 1;
    return 0;
}

static void *own_thread(void *arg) {
    own_arg_t *a = arg;
    for (int i = 0; i < a->n; i++) {
        a->mine[i] = hm_pool_malloc(a->pool, own_size(i));
        if (!a->mine[i]) {
            g_own_errors++;
            return NULL;
        }
        memset(a->mine[i], a->fill, own_size(i));
    }
    /* Local frees (into this thread's heap) and allocations again. */
    for (int i = 0; i < a->n; i += 2) {
        if (own_check(a->mine[i], own_size(i), a->fill)) g_own_errors++;
        if (hm_pool_free(a->pool, a->mine[i]) != HM_SUCCESS) g_own_errors++;
        a->mine[i] = hm_pool_malloc(a->pool, own_size(i));
        if (!a->mine[i]) {
            g_own_errors++;
            return NULL;
        }
        memset(a->mine[i], a->fill, own_size(i));
    }
    /* The previous thread's blocks: its heap was abandoned (this thread
     * may have adopted it, which makes these frees local). */
    for (int i = 0; a->prev && i < a->n; i++) {
        if (own_check(a->prev[i], own_size(i), a->prev_fill)) g_own_errors++;
        if (hm_pool_free(a->pool, a->prev[i]) != HM_SUCCESS) g_own_errors++;
    }
    return NULL;
}

/* A live thread's blocks for the main thread to free (remote frees). */
typedef struct own_live {
    hm_pool_t *pool;
    void *p[64];
    pthread_barrier_t bar;
} own_live_t;

static void *own_live_thread(void *arg) {
    own_live_t *l = arg;
    for (int i = 0; i < 64; i++) l->p[i] = hm_pool_malloc(l->pool, 48);
    pthread_barrier_wait(&l->bar); /* the main thread frees them */
    pthread_barrier_wait(&l->bar);
    return NULL;
}

static void test_own_heap_handover(void) {
    hm_test_set_context("first thread exits: the own heap slot changes hands");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    enum { N = 3000, ROUNDS = 6 };
    void **arr[2] = {calloc(N, sizeof(void *)), calloc(N, sizeof(void *))};
    REQUIRE(arr[0] && arr[1]);
    for (int round = 0; round < ROUNDS; round++) {
        own_arg_t a = {pool, round ? arr[(round + 1) % 2] : NULL, arr[round % 2], N,
                       (unsigned char)(round + 0x40), (unsigned char)(round + 0x41)};
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, own_thread, &a) == 0);
        pthread_join(t, NULL);
        CHECK_EQ(g_own_errors, 0);
        void **sorted = malloc(N * sizeof(void *));
        REQUIRE(sorted);
        memcpy(sorted, a.mine, N * sizeof(void *));
        CHECK(all_distinct(sorted, N));
        free(sorted);
    }
    /* This thread's first use of the pool: its heap comes from the table
     * or the slot, and it frees the last round's blocks. */
    void *mine = hm_pool_malloc(pool, 64);
    REQUIRE(mine);
    CHECK_OK(hm_pool_free(pool, mine));
    void **last = arr[(ROUNDS - 1) % 2];
    for (int i = 0; i < N; i++) {
        CHECK_EQ(own_check(last[i], own_size(i), (unsigned char)(ROUNDS - 1 + 0x41)), 0);
        CHECK_OK(hm_pool_free(pool, last[i]));
    }
    CHECK_OK(hm_pool_trim(pool));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    /* Two live threads, two heaps, whichever of them the slot holds: the
     * main thread's frees of the other's blocks are remote. */
    size_t published = st.remote_frees_published;
    own_live_t l = {.pool = pool};
    REQUIRE(pthread_barrier_init(&l.bar, NULL, 2) == 0);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, own_live_thread, &l) == 0);
    pthread_barrier_wait(&l.bar);
    for (int i = 0; i < 64; i++) {
        REQUIRE(l.p[i]);
        CHECK_OK(hm_pool_free(pool, l.p[i]));
    }
    pthread_barrier_wait(&l.bar);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&l.bar);
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.remote_frees_published - published, 64);
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    free(arr[0]);
    free(arr[1]);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Remote double frees: caught when the owner drains them (logged, skipped),
 * whether both frees sit in one batch or the second comes after the first
 * was drained, and the bitmap stays exact: no block is handed out twice. */
static _Atomic long g_double_logs;
static void double_sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    if (level == HM_LOG_ERROR && strstr(line, "double free")) atomic_fetch_add(&g_double_logs, 1);
}

/* Count "double free" error lines (g_double_logs, from 0) instead of
 * printing them, until stop_counting_logs(the level returned). */
static hm_log_level_t count_double_logs(void) {
    atomic_store(&g_double_logs, 0);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_sink(double_sink, NULL);
    hm_log_set_level(HM_LOG_ERROR);
    return old;
}

static void stop_counting_logs(hm_log_level_t old) {
    hm_log_set_level(old);
    hm_log_set_sink(NULL, NULL);
}

typedef struct dfree {
    hm_pool_t *pool;
    void **ptrs;
    int from, to, step;
} dfree_t;

static void *dfree_thread(void *arg) {
    dfree_t *d = arg;
    for (int i = d->from; i < d->to; i += d->step) hm_pool_free(d->pool, d->ptrs[i]);
    hm_pool_trim(d->pool); /* publishes this thread's batches */
    return NULL;
}

static void run_dfree(hm_pool_t *pool, void **ptrs, int from, int to, int step) {
    dfree_t d = {pool, ptrs, from, to, step};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, dfree_thread, &d) == 0);
    pthread_join(t, NULL);
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

/* 1 if the n pointers are pairwise distinct (sorts them). */
static int all_distinct(void **p, size_t n) {
    qsort(p, n, sizeof(void *), cmp_ptr);
    for (size_t i = 1; i < n; i++)
        if (p[i] == p[i - 1]) return 0;
    return 1;
}

/* Free the n blocks of p: then nothing is requested, and a trim gives every
 * provider byte back. */
static void free_all_trim_to_zero(hm_pool_t *pool, void **p, int n) {
    for (int i = 0; i < n; i++) CHECK_OK(hm_pool_free(pool, p[i]));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
}

static void test_remote_double_free(void) {
    hm_test_set_context("remote double frees");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    enum { N = 3000, EXTRA = 64 };
    void **ptrs = calloc(N, sizeof(void *));
    void **again = calloc(2 * N, sizeof(void *));
    REQUIRE(ptrs && again);
    for (int i = 0; i < N; i++) REQUIRE(ptrs[i] = hm_pool_malloc(pool, 48));
    /* Blocks 0..63 freed twice in a row (both frees in one batch), blocks
     * 64..127 freed twice far apart (in different batches), then blocks
     * 200..299 again after the owner drained their first frees (block 300
     * stays live meanwhile, so their slab stays mapped and the second frees
     * reach the owner's queue). */
    void **order = calloc(N + 2 * EXTRA, sizeof(void *));
    REQUIRE(order);
    int k = 0;
    for (int i = 0; i < EXTRA; i++) order[k++] = ptrs[i], order[k++] = ptrs[i];
    for (int i = EXTRA; i < N; i++)
        if (i != 300) order[k++] = ptrs[i]; /* block 300 keeps its slab */
    for (int i = EXTRA; i < 2 * EXTRA; i++) order[k++] = ptrs[i];
    hm_log_level_t old = count_double_logs();
    run_dfree(pool, order, 0, k, 1);
    CHECK_OK(hm_pool_trim(pool)); /* the owner drains its queue */
    run_dfree(pool, ptrs, 200, 300, 1); /* freed and drained already */
    CHECK_OK(hm_pool_free(pool, ptrs[300]));
    CHECK_OK(hm_pool_trim(pool));
    stop_counting_logs(old);
    CHECK_MSG(atomic_load(&g_double_logs) == 2 * EXTRA + 100,
              "%ld double frees logged, want %d", atomic_load(&g_double_logs), 2 * EXTRA + 100);
    /* Every block is free exactly once: 2N allocations are all distinct. */
    for (int i = 0; i < 2 * N; i++) REQUIRE(again[i] = hm_pool_malloc(pool, 48));
    CHECK(all_distinct(again, 2 * N));
    for (int i = 0; i < 2 * N; i++) CHECK_OK(hm_pool_free(pool, again[i]));
    free(order);
    free(ptrs);
    free(again);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Remote-free batches of both sizes (nv_batch_t): frees into consecutive
 * blocks share entries (small batches), frees one block per bitmap word
 * outgrow a small batch (its entries move into a large one, and the next
 * batches start large), then consecutive frees again (small ones again).
 * Every block comes back once, the counters agree, and a double free whose
 * two frees straddle the move is still caught: on the freeing side when the
 * second free finds its word's entry in the grown batch through nv_out.ix
 * (a hint: another word may have taken its slot), else by the owner's
 * drain, after it was published. */
static void test_batch_sizes(hm_native_remote_queue_t queue, const char *label) {
    hm_test_set_context(label);
    hm_pool_t *pool = queue_pool(queue);
    enum { WORDS = 400, N = WORDS * 64, DUP = 64 * 20 + 5 };
    void **ptrs = calloc(N, sizeof(void *));
    void **order = calloc(N + 1, sizeof(void *));
    char *done = calloc(N, 1);
    REQUIRE(ptrs && order && done);
    for (int i = 0; i < N; i++) REQUIRE(ptrs[i] = hm_pool_malloc(pool, 48)); /* 64 a word */
    /* 8 batches of 126 consecutive frees; then one block per word: block
     * DUP in the first entry of a fresh small batch, whose 15th entry (word
     * 34) moves it into a large one, where block DUP's second free goes (the
     * 1024th remote free, which publishes the batch: NV_FLUSH_EVERY). */
    int k = 0;
    for (int i = 0; i < 8 * 126; i++) order[k++] = ptrs[i], done[i] = 1;
    for (int w = 20; w < WORDS; w++) {
        int i = w * 64 + 5;
        order[k++] = ptrs[i], done[i] = 1;
        if (w == 34) order[k++] = ptrs[DUP];
    }
    for (int i = 0; i < N; i++)
        if (!done[i]) order[k++] = ptrs[i];
    REQUIRE(k == N + 1);
    hm_log_level_t old = count_double_logs();
    run_dfree(pool, order, 0, k, 1);
    CHECK_OK(hm_pool_trim(pool)); /* the owner drains its queue */
    stop_counting_logs(old);
    CHECK_MSG(atomic_load(&g_double_logs) == 1, "%ld double frees logged, want 1",
              atomic_load(&g_double_logs));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_MSG(st.remote_frees_published == (size_t)N ||
                  st.remote_frees_published == (size_t)N + 1,
              "%zu remote frees published, want %d or %d", st.remote_frees_published, N, N + 1);
    CHECK_EQ(st.remote_frees_drained, st.remote_frees_published);
    /* Every block is free exactly once: N allocations are all distinct. */
    for (int i = 0; i < N; i++) REQUIRE(ptrs[i] = hm_pool_malloc(pool, 48));
    memcpy(order, ptrs, N * sizeof(void *));
    CHECK(all_distinct(order, N));
    free_all_trim_to_zero(pool, ptrs, N);
    free(done);
    free(order);
    free(ptrs);
    CHECK_OK(hm_pool_destroy(pool));
}

/* The flush bound counts a remote free of a block above 1 KiB by its size
 * in KiB (NV_FLUSH_EVERY): a thread frees N blocks of 32 KiB into the main
 * thread's heap, fewer than a batch and far fewer than 1024 frees, and then
 * stops calling the pool without exiting (it waits). Every 1 MiB of them (32
 * blocks) is published at once, so all N are, and the owner gets them back
 * without asking the provider for more; counted one per free, none would
 * be published until the thread called the pool again. */
enum { FB_SIZE = 32 * 1024, FB_N = 64 };
typedef struct flush_bytes_arg {
    hm_pool_t *pool;
    void **blk;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int freed, release;
} flush_bytes_arg_t;

static void *flush_bytes_thread(void *p) {
    flush_bytes_arg_t *a = p;
    for (int i = 0; i < FB_N; i++) CHECK_OK(hm_pool_free(a->pool, a->blk[i]));
    pthread_mutex_lock(&a->lock);
    a->freed = 1;
    pthread_cond_broadcast(&a->cv);
    while (!a->release) pthread_cond_wait(&a->cv, &a->lock);
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

static void test_flush_bytes(hm_native_remote_queue_t queue, const char *label) {
    hm_test_set_context(label);
    hm_pool_t *pool = queue_pool(queue);
    void *blk[FB_N];
    for (int i = 0; i < FB_N; i++) REQUIRE(blk[i] = hm_pool_malloc(pool, FB_SIZE));
    CHECK_EQ(hm_pool_malloc_usable_size(pool, blk[0]), FB_SIZE); /* one class */
    flush_bytes_arg_t a = {.pool = pool, .blk = blk};
    pthread_mutex_init(&a.lock, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, flush_bytes_thread, &a) == 0);
    pthread_mutex_lock(&a.lock);
    while (!a.freed) pthread_cond_wait(&a.cv, &a.lock);
    pthread_mutex_unlock(&a.lock);
    /* The freeing thread is parked, its heap still bound. */
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.remote_frees_published == FB_N, "%zu of %d remote frees published by a parked "
              "thread, want all (1 MiB bound)", st.remote_frees_published, FB_N);
    /* The owner gets them back: its slow path drains the queue, and N more
     * allocations of the class need no more memory from the provider. */
    size_t held = st.bytes_from_provider;
    void *again[FB_N];
    for (int i = 0; i < FB_N; i++) REQUIRE(again[i] = hm_pool_malloc(pool, FB_SIZE));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.remote_frees_drained, (size_t)FB_N);
    CHECK_EQ(st.bytes_from_provider, held);
    CHECK(all_distinct(again, FB_N));
    pthread_mutex_lock(&a.lock);
    a.release = 1;
    pthread_cond_broadcast(&a.cv);
    pthread_mutex_unlock(&a.lock);
    pthread_join(t, NULL);
    for (int i = 0; i < FB_N; i++) CHECK_OK(hm_pool_free(pool, again[i]));
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&a.lock);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Remote frees of mixed sizes, interleaved (class A, B, C, A, B, C...): each
 * word keeps one entry in the outgoing batch, found through nv_out.ix, so a
 * second free of a block whose word's entry is not the batch's last one is
 * refused by the freeing call itself, unless another word took its ix slot
 * (a hint: a hash of the word's address); then the owner's drain catches it.
 * Either way it is logged once, every other block comes back once and the
 * counters agree. Over TRIALS pools (slabs at other addresses, so other
 * slots) at least one refusal must come from the freeing call: a merge into
 * the last entry only never gives one. */
typedef struct mixed_free {
    hm_pool_t *pool;
    void **blk[3];
    int n;
    hm_result_t dup_result;
} mixed_free_t;

static void *mixed_free_thread(void *arg) {
    mixed_free_t *m = arg;
    for (int j = 0; j < m->n; j++) {
        for (int c = 0; c < 3; c++) CHECK_OK(hm_pool_free(m->pool, m->blk[c][j]));
        if (j == 10) m->dup_result = hm_pool_free(m->pool, m->blk[0][5]); /* freed at j == 5 */
    }
    CHECK_OK(hm_pool_trim(m->pool)); /* publishes this thread's batches */
    return NULL;
}

/* One trial in pool; returns 1 if the freeing call refused the double free. */
static int batch_mixed_trial(hm_pool_t *pool) {
    enum { N = 40 }; /* 120 frees: one batch (NV_BATCH_CAP) */
    static const size_t size[3] = {48, 96, 200};
    void *blk[3][N];
    for (int j = 0; j < N; j++)
        for (int c = 0; c < 3; c++) REQUIRE(blk[c][j] = hm_pool_malloc(pool, size[c]));
    mixed_free_t m = {pool, {blk[0], blk[1], blk[2]}, N, HM_SUCCESS};
    hm_log_level_t old = count_double_logs();
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, mixed_free_thread, &m) == 0);
    pthread_join(t, NULL);
    CHECK_OK(hm_pool_trim(pool)); /* the owner drains its queue */
    stop_counting_logs(old);
    int refused = m.dup_result == HM_ERROR_DOUBLE_FREE;
    CHECK_MSG(refused || m.dup_result == HM_SUCCESS, "double free returned %d", m.dup_result);
    CHECK_MSG(atomic_load(&g_double_logs) == 1, "%ld double frees logged, want 1",
              atomic_load(&g_double_logs));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_EQ(st.remote_frees_published, (size_t)3 * N + !refused);
    CHECK_EQ(st.remote_frees_drained, st.remote_frees_published);
    /* Every block is free exactly once: 3N allocations are all distinct. */
    void *again[3 * N];
    for (int j = 0; j < N; j++)
        for (int c = 0; c < 3; c++) REQUIRE(again[j * 3 + c] = hm_pool_malloc(pool, size[c]));
    CHECK(all_distinct(again, 3 * N));
    free_all_trim_to_zero(pool, again, 3 * N);
    return refused;
}

static void test_batch_mixed_words(hm_native_remote_queue_t queue, const char *label) {
    hm_test_set_context(label);
    enum { TRIALS = 8 };
    hm_pool_t *pool[TRIALS]; /* all live: their slabs lie at different addresses */
    int refused = 0;
    for (int i = 0; i < TRIALS; i++) refused += batch_mixed_trial(pool[i] = queue_pool(queue));
    for (int i = 0; i < TRIALS; i++) CHECK_OK(hm_pool_destroy(pool[i]));
    CHECK_MSG(refused > 0, "no double free refused by the freeing call in %d trials", TRIALS);
}

/* The block allocated last is freed without a page-map lookup (nv_heap.last):
 * a double free of it is still refused, also when its first free came from
 * another thread and was drained meanwhile. */
static void test_last_block_double_free(void) {
    hm_test_set_context("double free of the block allocated last");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_OFF);
    void *p = hm_pool_malloc(pool, 48);
    REQUIRE(p);
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_RES(hm_pool_free(pool, p), HM_ERROR_DOUBLE_FREE);
    p = hm_pool_malloc(pool, 48);
    REQUIRE(p);
    void *order[1] = {p};
    run_dfree(pool, order, 0, 1, 1); /* freed by another thread, published */
    void *q = hm_pool_malloc(pool, 3000); /* a first block of another class drains */
    REQUIRE(q);
    CHECK_RES(hm_pool_free(pool, p), HM_ERROR_DOUBLE_FREE);
    CHECK_OK(hm_pool_free(pool, q));
    /* Still consistent: p's block comes back exactly once. */
    void *a = hm_pool_malloc(pool, 48), *b = hm_pool_malloc(pool, 48);
    REQUIRE(a && b);
    CHECK(a != b);
    CHECK_OK(hm_pool_free(pool, a));
    CHECK_OK(hm_pool_free(pool, b));
    hm_log_set_level(old);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    CHECK_OK(hm_pool_destroy(pool));
}

/* hm_pool_free(pool, NULL) and hm_pool_malloc(pool, 0) reach the native
 * pool's own entries (hm_pool.free_entry, malloc_entry: the front end tests
 * neither): NULL is freed as nothing at every state of the thread's heap,
 * in particular while the heap has no block allocated last (nv_heap.last
 * 0, which NULL matches: the class word it names must not change), and
 * size 0 fails with EINVAL. Host and PROT_NONE memory (the two free
 * entries). */
static void test_null_and_zero(unsigned prot) {
    hm_test_set_context(prot == RW ? "free(NULL), malloc(0)" : "free(NULL), malloc(0), PROT_NONE");
    hm_pool_t *pool = os_pool(NULL, 0, prot);
    CHECK_OK(hm_pool_free(pool, NULL)); /* no heap yet */
    errno = 0;
    CHECK(hm_pool_malloc(pool, 0) == NULL && errno == EINVAL);
    void *p = hm_pool_malloc(pool, 48); /* the heap's first block: slow path, no `last` */
    REQUIRE(p);
    CHECK_OK(hm_pool_free(pool, NULL));
    errno = 0;
    CHECK(hm_pool_malloc(pool, 0) == NULL && errno == EINVAL); /* with a heap */
    void *q = hm_pool_malloc(pool, 48); /* fast path: q is `last` */
    REQUIRE(q && q != p);
    CHECK_OK(hm_pool_free(pool, NULL));
    CHECK_OK(hm_pool_free(pool, q));
    CHECK_OK(hm_pool_free(pool, NULL));
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_OFF);
    CHECK_RES(hm_pool_free(pool, q), HM_ERROR_DOUBLE_FREE);
    hm_log_set_level(old);
    CHECK_OK(hm_pool_free(pool, p));
    /* trim retires the class's word and forgets `last`: a free of NULL then
     * must not put a bit into the (now empty) class word, whose blocks
     * would be handed out of a slab gone back to the provider. */
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_free(pool, NULL));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_requested == 0, "%zu bytes requested with nothing live",
              st.bytes_requested);
    void *a = hm_pool_malloc(pool, 48), *b = hm_pool_malloc(pool, 48);
    REQUIRE(a && b);
    CHECK(a != b);
    CHECK(hm_pool_malloc_usable_size(pool, a) >= 48 && hm_pool_malloc_usable_size(pool, b) >= 48);
    CHECK_OK(hm_pool_free(pool, a));
    CHECK_OK(hm_pool_free(pool, b));
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    CHECK_OK(hm_pool_destroy(pool));
}

/* A 4 KiB class reuses the blocks freed last first (the heap's free-block
 * stack, kept off the managed memory): a block freed into a full slab comes
 * back at the next allocation of its class; a double free of a stacked
 * block is refused; no block is handed out twice; slabs whose blocks were
 * stacked still go back at trim; the statistics stay exact. Also over
 * PROT_NONE memory. (test_free_stacks covers small classes and the bound.) */
static void test_lifo_reuse(unsigned prot) {
    hm_test_set_context(prot == RW ? "LIFO reuse, 4 KiB" : "LIFO reuse, 4 KiB, PROT_NONE");
    hm_pool_t *pool = os_pool(NULL, 0, prot);
    /* 12 slabs of 16 blocks of 4 KiB, every block handed out: the class
     * word is empty, so the next allocations pop the stack. */
    enum { N = 192 };
    void *p[N];
    for (int i = 0; i < N; i++) REQUIRE(p[i] = hm_pool_malloc(pool, 4096));
    /* Blocks of different slabs; the last one is of the current slab's
     * word, so it goes back into the class word, which serves first. */
    int order[] = {5, 77, 140, 33, 191};
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) CHECK_OK(hm_pool_free(pool, p[order[k]]));
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_OFF);
    CHECK_RES(hm_pool_free(pool, p[140]), HM_ERROR_DOUBLE_FREE); /* stacked */
    hm_log_set_level(old);
    /* Newest first. */
    for (int k = (int)(sizeof order / sizeof order[0]) - 1; k >= 0; k--) {
        void *q = hm_pool_malloc(pool, 4096);
        CHECK_MSG(q == p[order[k]], "got %p, want %p (freed %d-th last)", q, p[order[k]],
                  (int)(sizeof order / sizeof order[0]) - k);
        p[order[k]] = q;
    }
    /* The class word is empty again: a freed block comes straight back. */
    CHECK_OK(hm_pool_free(pool, p[10]));
    void *a = hm_pool_malloc(pool, 4096);
    CHECK(a == p[10]);
    p[10] = a;
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)N * 4096);
    for (int i = 0; i < N; i++) CHECK_OK(hm_pool_free(pool, p[i]));
    /* Every block exactly once: N allocations are distinct. */
    for (int i = 0; i < N; i++) REQUIRE(p[i] = hm_pool_malloc(pool, 4096));
    CHECK(all_distinct(p, N));
    free_all_trim_to_zero(pool, p, N);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Blocks of the word being handed out that the owner frees (other than the
 * block allocated last) go into the slab's bitmap and onto the stack, not
 * back into the class word (nv_cls): a second free of one is still refused,
 * by the owner or from another thread (found when drained), as is the
 * owner's free of a block that a remote free put back into the class word;
 * every block comes back exactly once. */
static void test_current_word_frees(void) {
    hm_test_set_context("frees into the current word");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    enum { N = 10, M = 200 };
    void *a[N], *b[M], *all[N + M];
    /* A fresh slab: the class word holds blocks 10..63 of its word 0. */
    for (int i = 0; i < N; i++) REQUIRE(a[i] = hm_pool_malloc(pool, 48));
    hm_log_level_t old = count_double_logs();
    CHECK_OK(hm_pool_free(pool, a[3])); /* not the block allocated last */
    CHECK_RES(hm_pool_free(pool, a[3]), HM_ERROR_DOUBLE_FREE);
    void *order[1] = {a[3]};
    run_dfree(pool, order, 0, 1, 1); /* the same from another thread */
    void *q = hm_pool_malloc(pool, 3000); /* a first block of another class drains */
    REQUIRE(q);
    order[0] = a[5];
    run_dfree(pool, order, 0, 1, 1); /* a valid remote free: into the class word */
    void *r = hm_pool_malloc(pool, 2000); /* drains */
    REQUIRE(r);
    CHECK_RES(hm_pool_free(pool, a[5]), HM_ERROR_DOUBLE_FREE);
    stop_counting_logs(old);
    CHECK_MSG(atomic_load(&g_double_logs) == 3, "%ld double frees logged, want 3",
              atomic_load(&g_double_logs));
    /* Blocks 3 and 5 come back once each, among blocks distinct from the
     * live ones. */
    int n = 0, got3 = 0, got5 = 0;
    for (int i = 0; i < N; i++)
        if (i != 3 && i != 5) all[n++] = a[i];
    for (int i = 0; i < M; i++) {
        REQUIRE(b[i] = hm_pool_malloc(pool, 48));
        got3 += b[i] == a[3];
        got5 += b[i] == a[5];
        all[n++] = b[i];
    }
    CHECK_EQ(got3, 1);
    CHECK_EQ(got5, 1);
    CHECK(all_distinct(all, (size_t)n));
    CHECK_OK(hm_pool_free(pool, q));
    CHECK_OK(hm_pool_free(pool, r));
    free_all_trim_to_zero(pool, all, n);
    CHECK_OK(hm_pool_destroy(pool));
}

/* The heap's free-block stacks (every class): blocks freed into slab
 * bitmaps come back newest first, across slabs; a stacked block is still
 * free in its bitmap, so freeing it again is refused; past the stack's
 * bound (127 entries) frees only set the bit and those blocks are found by
 * the bitmap later; a slab whose blocks are all free goes back to the
 * provider even while some of them are stacked (no stale entry hands out
 * its memory); a retained slab's descriptor grows when a smaller class
 * reuses it; statistics stay exact. Also over PROT_NONE memory. */
static void test_free_stacks(unsigned prot) {
    hm_test_set_context(prot == RW ? "free-block stacks" : "free-block stacks, PROT_NONE");
    hm_native_params_t *np;
    REQUIRE_OK(hm_native_params_create(&np));
    REQUIRE_OK(hm_native_params_set_retained_bytes(np, 0));
    hm_pool_t *pool = os_pool(np, HM_POOL_FLAG_NO_TRACKING, prot);
    hm_native_params_destroy(np);
    hm_log_level_t old = hm_log_get_level();
    /* 64-byte blocks: 1024 per 64 KiB slab; 4 full slabs. */
    enum { PER = 1024, N = 4 * PER, BIG = 300 };
    static void *p[N], *q[N];
    for (int i = 0; i < N; i++) REQUIRE(p[i] = hm_pool_malloc(pool, 64));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    size_t held = st.bytes_from_provider;
    /* Scattered frees in the first three slabs, newest first back. */
    int order[] = {7, 2 * PER + 500, PER + 3, 2 * PER + 1, 640};
    enum { K = sizeof order / sizeof order[0] };
    for (int k = 0; k < K; k++) CHECK_OK(hm_pool_free(pool, p[order[k]]));
    hm_log_set_level(HM_LOG_OFF);
    CHECK_RES(hm_pool_free(pool, p[order[1]]), HM_ERROR_DOUBLE_FREE); /* stacked, still free */
    hm_log_set_level(old);
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)(N - K) * 64);
    for (int k = K - 1; k >= 0; k--) {
        void *a = hm_pool_malloc(pool, 64);
        CHECK_MSG(a == p[order[k]], "got %p, want %p (freed %d-th last)", a, p[order[k]], K - k);
        p[order[k]] = a;
    }
    /* Past the bound: BIG frees of every third block of slab 1 (the first
     * 127 stacked). */
    for (int i = 0; i < BIG; i++) CHECK_OK(hm_pool_free(pool, p[PER + 3 * i]));
    hm_log_set_level(HM_LOG_OFF);
    CHECK_RES(hm_pool_free(pool, p[PER]), HM_ERROR_DOUBLE_FREE);                 /* stacked */
    CHECK_RES(hm_pool_free(pool, p[PER + 3 * (BIG - 1)]), HM_ERROR_DOUBLE_FREE); /* not */
    hm_log_set_level(old);
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)(N - BIG) * 64);
    for (int i = 0; i < BIG; i++) REQUIRE(q[i] = hm_pool_malloc(pool, 64));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)N * 64);
    CHECK_EQ(st.bytes_from_provider, held); /* the freed blocks, not a new slab */
    for (int i = 0; i < BIG; i++) p[PER + 3 * i] = q[i];
    memcpy(q, p, sizeof p);
    CHECK(all_distinct(q, N));
    /* Slab 0 empties while blocks of it are stacked: it goes back (retained
     * bytes 0) and its entries with it; what comes next is live memory. */
    for (int i = 0; i < PER; i += 2) CHECK_OK(hm_pool_free(pool, p[i]));
    for (int i = 1; i < PER; i += 2) CHECK_OK(hm_pool_free(pool, p[i]));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, (size_t)(N - PER) * 64);
    CHECK_MSG(st.bytes_from_provider == held - 64 * KIB, "held %zu, want %zu",
              st.bytes_from_provider, held - 64 * KIB);
    for (int i = 0; i < PER; i++) {
        REQUIRE(p[i] = hm_pool_malloc(pool, 64));
        CHECK(hm_pool_malloc_usable_size(pool, p[i]) == 64);
        if (prot == RW) memset(p[i], 0x3c, 64);
    }
    memcpy(q, p, sizeof p);
    CHECK(all_distinct(q, N));
    free_all_trim_to_zero(pool, p, N);
    CHECK_OK(hm_pool_destroy(pool));

    /* A slab retained from the 4 KiB class (a 2-line descriptor) serves the
     * 8-byte class next (8192 blocks: its descriptor is replaced). */
    hm_test_set_context(prot == RW ? "free-block stacks: descriptor growth"
                                   : "free-block stacks: descriptor growth, PROT_NONE");
    pool = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, prot);
    for (int i = 0; i < 32; i++) REQUIRE(p[i] = hm_pool_malloc(pool, 4096));
    for (int i = 0; i < 16; i++) CHECK_OK(hm_pool_free(pool, p[i])); /* slab 0: retained */
    CHECK_OK(hm_pool_get_stats(pool, &st));
    held = st.bytes_from_provider;
    CHECK_EQ(held, 128 * KIB);
    enum { SMALL = 8192 };
    void **r = malloc(SMALL * sizeof(void *));
    REQUIRE(r);
    for (int i = 0; i < SMALL; i++) REQUIRE(r[i] = hm_pool_malloc(pool, 8));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_from_provider, held); /* the retained slab, reused */
    CHECK_EQ(st.bytes_requested, (size_t)SMALL * 8 + 16 * 4096);
    void *extra = hm_pool_malloc(pool, 8); /* the slab is full: a new one */
    REQUIRE(extra);
    CHECK_OK(hm_pool_free(pool, extra));
    hm_log_set_level(HM_LOG_OFF);
    CHECK_OK(hm_pool_free(pool, r[5000]));
    CHECK_RES(hm_pool_free(pool, r[5000]), HM_ERROR_DOUBLE_FREE); /* a word past the first line */
    hm_log_set_level(old);
    REQUIRE(r[5000] = hm_pool_malloc(pool, 8));
    for (int i = 0; i < SMALL; i++) CHECK_OK(hm_pool_free(pool, r[i]));
    for (int i = 16; i < 32; i++) CHECK_OK(hm_pool_free(pool, p[i]));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    free(r);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Provider failures: a failing alloc reports OUT_OF_MEMORY (a failed slab
 * falls back to a range of its own, so only nth = every call must fail);
 * nothing leaks, nothing is misused, failed frees are retried later. */
static void test_faults(void) {
    hm_test_set_context("provider faults");
    for (long nth = -1; nth <= 8; nth++) {
        if (nth == 0) continue;
        hm_provider_t *os, *fault;
        REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, RW, &os));
        hm_fault_params_t fp = {.inner = os, .own_inner = 1};
        fp.fail_nth[HM_FAULT_ALLOC] = nth;
        fp.fail_nth[HM_FAULT_FREE] = nth > 0 ? nth : 0;
        REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &fault));
        hm_native_params_t *np;
        REQUIRE_OK(hm_native_params_create(&np));
        REQUIRE_OK(hm_native_params_set_retained_bytes(np, 0));
        hm_pool_t *pool;
        REQUIRE_OK(hm_native_pool_create(fault, np, 0, &pool));
        hm_native_params_destroy(np);
        void *p[64];
        int failed = 0;
        for (int i = 0; i < 64; i++) {
            size_t size = (i % 4 == 3) ? 300 * KIB : (size_t)64 << (i % 8);
            errno = 0;
            p[i] = hm_pool_malloc(pool, size);
            if (!p[i]) {
                failed++;
                CHECK_EQ(errno, ENOMEM);
            } else {
                memset(p[i], 0x5a, size);
            }
        }
        if (nth < 0) CHECK_EQ(failed, 64);
        for (int i = 0; i < 64; i++)
            if (p[i]) CHECK_OK(hm_pool_free(pool, p[i]));
        hm_pool_trim(pool);
        CHECK_OK(hm_pool_destroy(pool));
        CHECK_MSG(hm_fault_provider_live(fault) == 0, "nth %ld: %ld provider ranges leaked", nth,
                  hm_fault_provider_live(fault));
        CHECK_EQ(hm_fault_provider_misuse(fault), 0);
        CHECK_OK(hm_provider_destroy(fault));
    }
}

/* The page map across two leaves (native.c, map_leaf: the first leaf
 * installed is in the map's hint alone, the others in its root): a fixed
 * provider over 2 MiB around a 4 GiB boundary (one leaf's span with 64 KiB
 * slabs), used up, so that slabs lie in both leaves; every block's free is
 * found, and interior, double and foreign frees are refused in both. */
static void test_map_two_leaves(void) {
    hm_test_set_context("page map across two leaves");
    const uintptr_t leaf_span = (uintptr_t)1 << 32;
    const size_t half = 1 * MIB, resv = (size_t)leaf_span + 4 * MIB;
    char *r = mmap(NULL, resv, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(r != MAP_FAILED);
    uintptr_t boundary = ((uintptr_t)r + 2 * MIB + leaf_span - 1) & ~(leaf_span - 1);
    char *buf = (char *)boundary - half;
    REQUIRE(mprotect(buf, 2 * half, PROT_READ | PROT_WRITE) == 0);
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_fixed_provider(buf, 2 * half, HM_MEMORY_HOST, true, &prov));
    hm_native_params_t *np;
    REQUIRE_OK(hm_native_params_create(&np));
    REQUIRE_OK(hm_native_params_set_slab_size(np, 64 * KIB));
    hm_pool_t *pool = NULL;
    /* Untracked: the pool itself must find (or refuse) every pointer. */
    REQUIRE_OK(hm_native_pool_create(prov, np, HM_POOL_FLAG_OWN_PROVIDER | HM_POOL_FLAG_NO_TRACKING,
                                     &pool));
    hm_native_params_destroy(np);
    enum { MAX = 2 * MIB / 64 };
    char **p = calloc(MAX, sizeof(*p));
    REQUIRE(p);
    int n = 0, lo = -1, hi = -1;
    while (n < MAX && (p[n] = hm_pool_malloc(pool, 64))) {
        if ((uintptr_t)p[n] < boundary && lo < 0) lo = n;
        if ((uintptr_t)p[n] >= boundary && hi < 0) hi = n;
        n++;
    }
    CHECK_MSG(lo >= 0 && hi >= 0, "%d blocks, first below the boundary %d, above %d", n, lo, hi);
    int side[2] = {lo, hi};
    for (int k = 0; k < 2; k++) {
        if (side[k] < 0) continue;
        char *q = p[side[k]];
        CHECK_RES(hm_pool_free(pool, q + 8), HM_ERROR_INVALID_ARGUMENT); /* interior */
        CHECK_OK(hm_pool_free(pool, q));
        CHECK_RES(hm_pool_free(pool, q), HM_ERROR_DOUBLE_FREE);
        p[side[k]] = NULL;
    }
    /* Foreign: in the reservation, below the buffer (the lower leaf's span
     * or the one before it) and above it (the upper leaf's span). */
    CHECK_RES(hm_pool_free(pool, buf - 64 * KIB), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_pool_free(pool, buf + 2 * half + 64 * KIB), HM_ERROR_INVALID_ARGUMENT);
    int failed = 0;
    for (int i = 0; i < n; i++)
        if (p[i] && hm_pool_free(pool, p[i]) != HM_SUCCESS) failed++;
    CHECK_EQ(failed, 0);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_OK(hm_pool_destroy(pool));
    free(p);
    munmap(r, resv);
}

/* The orphan heap, for threads past the pool's thread-exit destructor, is
 * set up at its first use (native.c, orphan_heap). A thread that used one
 * pool (so the pool's destructor runs for it) has a key destructor of its
 * own, created later (glibc runs destructors in key order; in any order
 * these calls must work), which uses a second pool that no thread has
 * used yet: it allocates (a fresh orphan heap), frees (a double free is
 * refused) and frees one of the main thread's blocks (a remote free from
 * the orphan), and leaves a block for the main thread to free (a remote
 * free into the orphan); trim then drains and returns everything. */
static pthread_key_t g_late_key;
static hm_pool_t *g_late_pool;
static void *g_late_mine, *g_late_theirs;
static _Atomic int g_late_errors;

static void late_destructor(void *arg) {
    (void)arg;
    void *a = hm_pool_malloc(g_late_pool, 40), *b = hm_pool_malloc(g_late_pool, 40);
    if (!a || !b) {
        g_late_errors++;
        return;
    }
    memset(a, 1, 40);
    memset(b, 2, 40);
    if (hm_pool_free(g_late_pool, a) != HM_SUCCESS) g_late_errors++;
    if (hm_pool_free(g_late_pool, a) != HM_ERROR_DOUBLE_FREE) g_late_errors++;
    if (hm_pool_free(g_late_pool, g_late_mine) != HM_SUCCESS) g_late_errors++;
    g_late_theirs = b;
}

static void *late_thread(void *arg) {
    void *p = hm_pool_malloc(arg, 24); /* binds a heap of the first pool */
    if (!p || hm_pool_free(arg, p) != HM_SUCCESS) g_late_errors++;
    pthread_setspecific(g_late_key, (void *)1);
    return NULL;
}

static void test_orphan_first_use(void) {
    hm_test_set_context("orphan heap set up at its first use");
    hm_pool_t *first = os_pool(NULL, 0, RW); /* creates the pool's key first */
    REQUIRE(pthread_key_create(&g_late_key, late_destructor) == 0);
    g_late_pool = os_pool(NULL, 0, RW);
    g_late_mine = hm_pool_malloc(g_late_pool, 40);
    REQUIRE(g_late_mine);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, late_thread, first) == 0);
    pthread_join(t, NULL);
    CHECK_EQ(g_late_errors, 0);
    REQUIRE(g_late_theirs);
    CHECK_OK(hm_pool_free(g_late_pool, g_late_theirs));
    CHECK_OK(hm_pool_trim(g_late_pool));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(g_late_pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_EQ(st.remote_frees_published, 2);
    CHECK_EQ(st.remote_frees_drained, 2);
    CHECK_MSG(st.bytes_from_provider == 0, "held %zu after trim", st.bytes_from_provider);
    CHECK_OK(hm_pool_destroy(g_late_pool));
    CHECK_OK(hm_pool_destroy(first));
    pthread_key_delete(g_late_key);
}

static void test_many_pools(void) {
    hm_test_set_context("many pools, one thread");
    /* Thread-local caches must never confuse a new pool with a dead one. */
    for (int i = 0; i < 300; i++) {
        hm_pool_t *pool = os_pool(NULL, 0, RW);
        void *p = hm_pool_malloc(pool, 48);
        REQUIRE(p);
        CHECK(hm_pool_by_ptr(p) == pool);
        CHECK_OK(hm_pool_free(pool, p));
        CHECK_OK(hm_pool_destroy(pool));
    }
}

/* One CTest entry per part (argv[1]: unit (the default), remote, or all), so
 * that each stays short under the sanitizers. */
int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : "unit";
#define PART(name) (!strcmp(part, "all") || !strcmp(part, name))
    int ran = 0;
    if (PART("unit")) {
        ran++;
        test_size_classes();
        test_alignment();
        test_bad_frees();
        test_interior_frees();
        test_stack_bound();
        test_stats_and_trim();
        test_params();
        test_prot_none();
        test_lifo_reuse(RW);
        test_lifo_reuse(HM_OS_PROT_NONE);
        test_free_stacks(RW);
        test_free_stacks(HM_OS_PROT_NONE);
        test_faults();
        test_many_pools();
        test_map_two_leaves();
    }
    if (PART("remote")) {
        ran++;
        test_remote_and_abandoned(HM_NATIVE_QUEUE_WFCQ, "remote frees, abandoned heaps (wfcq)");
        test_remote_and_abandoned(HM_NATIVE_QUEUE_MUTEX, "remote frees, abandoned heaps (mutex)");
        test_remote_double_free();
        test_batch_sizes(HM_NATIVE_QUEUE_WFCQ, "remote-free batch sizes (wfcq)");
        test_batch_sizes(HM_NATIVE_QUEUE_MUTEX, "remote-free batch sizes (mutex)");
        test_flush_bytes(HM_NATIVE_QUEUE_WFCQ, "remote-free byte bound (wfcq)");
        test_flush_bytes(HM_NATIVE_QUEUE_MUTEX, "remote-free byte bound (mutex)");
        test_batch_mixed_words(HM_NATIVE_QUEUE_WFCQ, "remote frees of mixed sizes (wfcq)");
        test_batch_mixed_words(HM_NATIVE_QUEUE_MUTEX, "remote frees of mixed sizes (mutex)");
        test_last_block_double_free();
        test_null_and_zero(RW);
        test_null_and_zero(HM_OS_PROT_NONE);
        test_current_word_frees();
        test_own_heap_handover();
        test_orphan_first_use();
    }
    if (!ran) {
        fprintf(stderr, "unknown part '%s'\n", part);
        return 2;
    }
    return hm_test_finish();
}
