/* hetmem tests — the jemalloc pool's own contract (the pool suite over every
 * provider kind is test/pools/test_pool_matrix.c): params,
 * refused providers, memory the CPU cannot touch, statistics and trim,
 * exact statistics (what users hold, from several threads, with no trim),
 * refusal of foreign, interior and other pools' pointers, region starts of
 * every small class (every region of whole slabs accepted), an arena with
 * more extent descriptors than its first metadata block, the fast paths'
 * thread lines changing hands,
 * thousands of create/destroy cycles (arena reuse), thread-exit tcache
 * clean-up, provider failures, fork.
 * Usage: test_jemalloc_pool [unit|loops|limit|churn|fork|all]   (default: unit)
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <hetmem/pools/jemalloc.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define RW (HM_OS_PROT_READ | HM_OS_PROT_WRITE)

static hm_pool_t *os_pool(const hm_jemalloc_params_t *params, uint32_t flags, unsigned prot) {
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, prot, &prov));
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_jemalloc_pool_create(prov, params, HM_POOL_FLAG_OWN_PROVIDER | flags, &pool));
    return pool;
}

/* ---- a log sink that counts lines at WARN and above ---- */

static _Atomic long g_warnings;
static void count_sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    if (level >= HM_LOG_WARN) {
        atomic_fetch_add(&g_warnings, 1);
        fprintf(stderr, "log: %s\n", line);
    }
}

/* ---- cases ---- */

static void test_params(void) {
    hm_test_set_context("params");
    hm_jemalloc_params_t *p = NULL;
    CHECK_RES(hm_jemalloc_params_create(NULL), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_jemalloc_params_create(&p));
    CHECK_RES(hm_jemalloc_params_set_tcache(NULL, true), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_jemalloc_params_set_decay_ms(NULL, 0, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_jemalloc_params_set_decay_ms(p, -2, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_jemalloc_params_set_decay_ms(p, 0, 3600001), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_jemalloc_params_set_decay_ms(p, 0, 0));
    CHECK_OK(hm_jemalloc_params_set_tcache(p, false));
    hm_pool_t *pool = os_pool(p, 0, RW);
    CHECK_OK(hm_jemalloc_params_destroy(p)); /* copied at creation */
    CHECK(strcmp(hm_pool_name(pool), "jemalloc") == 0);
    void *b[64];
    for (int i = 0; i < 64; i++) {
        b[i] = hm_pool_malloc(pool, (size_t)(i + 1) * 100);
        REQUIRE(b[i] != NULL);
        memset(b[i], i, (size_t)(i + 1) * 100);
    }
    for (int i = 0; i < 64; i++) CHECK_OK(hm_pool_free(pool, b[i]));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_OK(hm_jemalloc_params_destroy(NULL));
}

/* A provider without split/merge (and without purge): the pool needs
 * neither; ranges go back whole. */
static const hm_provider_ops_t *g_inner_ops;
static hm_result_t w_init(const void *params, void **state) {
    return g_inner_ops->init(params, state);
}
static void w_fini(void *state) { g_inner_ops->fini(state); }
static void w_info(void *state, hm_provider_info_t *info) { g_inner_ops->get_info(state, info); }
static hm_result_t w_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    return g_inner_ops->alloc(state, size, alignment, ptr);
}
static hm_result_t w_free(void *state, void *ptr, size_t size) {
    return g_inner_ops->free(state, ptr, size);
}

static void test_minimal_provider(void) {
    hm_test_set_context("provider without split/merge/purge");
    g_inner_ops = hm_os_provider_ops();
    hm_os_params_t *op;
    REQUIRE_OK(hm_os_params_create(&op));
    hm_provider_ops_t minimal = {.version = HM_PROVIDER_OPS_VERSION, .name = "minimal",
                                 .init = w_init, .fini = w_fini, .get_info = w_info,
                                 .alloc = w_alloc, .free = w_free};
    hm_provider_t *prov;
    REQUIRE_OK(hm_provider_create(&minimal, op, &prov));
    hm_os_params_destroy(op);
    CHECK(!(hm_provider_caps(prov) & HM_PROVIDER_CAP_SPLIT_MERGE));
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_jemalloc_pool_create(prov, NULL, 0, &pool));
    for (int round = 0; round < 3; round++) {
        void *p[200];
        for (int i = 0; i < 200; i++) {
            size_t size = (size_t)(i * 7919 % 300000) + 1;
            p[i] = hm_pool_malloc(pool, size);
            REQUIRE(p[i]);
            memset(p[i], i, size);
            CHECK(hm_pool_by_ptr((char *)p[i] + size - 1) == pool);
        }
        for (int i = 0; i < 200; i++) CHECK_OK(hm_pool_free(pool, p[i]));
        CHECK_OK(hm_pool_trim(pool));
    }
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_OK(hm_provider_destroy(prov));
    hm_pool_t *q = (hm_pool_t *)(uintptr_t)1;
    CHECK_RES(hm_jemalloc_pool_create(NULL, NULL, 0, &q), HM_ERROR_INVALID_ARGUMENT);
}

/* PROT_NONE memory: any CPU access by the pool or jemalloc would fault. */
static void test_prot_none(void) {
    hm_test_set_context("PROT_NONE provider");
    hm_pool_t *pool = os_pool(NULL, 0, HM_OS_PROT_NONE);
    CHECK(!hm_provider_cpu_accessible(hm_pool_get_provider(pool)));
    enum { N = 3000 };
    static void *p[N];
    for (int i = 0; i < N; i++) {
        size_t size = (size_t)1 << (i % 22); /* 1 B .. 2 MiB */
        size += (size_t)(i % 13);
        p[i] = (i % 5 == 0) ? hm_pool_aligned_malloc(pool, size, (size_t)64 << (i % 8))
                            : hm_pool_malloc(pool, size);
        REQUIRE(p[i] != NULL);
        CHECK(hm_pool_by_ptr(p[i]) == pool);
        CHECK(hm_pool_malloc_usable_size(pool, p[i]) >= size);
    }
    /* calloc would have to write: refused. */
    errno = 0;
    CHECK(hm_pool_calloc(pool, 10, 10) == NULL && errno != 0);
    /* realloc in place only; a move is refused and leaves the block. */
    void *q = hm_pool_malloc(pool, 8 * KIB);
    REQUIRE(q);
    void *r = hm_pool_realloc(pool, q, 8 * KIB - 100); /* same size class: in place */
    CHECK(r == q);
    errno = 0;
    r = hm_pool_realloc(pool, q, 3 * MIB);
    if (r) q = r; /* grown in place: fine */
    else CHECK(errno != 0 && hm_pool_by_ptr(q) == pool);
    CHECK_OK(hm_pool_free(pool, q));
    for (int i = 0; i < N; i += 2) CHECK_OK(hm_pool_free(pool, p[i]));
    CHECK_OK(hm_pool_trim(pool));
    for (int i = 1; i < N; i += 2) CHECK_OK(hm_free(p[i]));
    CHECK_OK(hm_pool_trim(pool));
    /* Reuse after the churn. */
    for (int i = 0; i < 1000; i++) {
        void *x = hm_pool_malloc(pool, (size_t)(i * 37 % 20000) + 1);
        REQUIRE(x);
        CHECK_OK(hm_pool_free(pool, x));
    }
    CHECK_OK(hm_pool_destroy(pool));
}

static void test_stats_and_trim(void) {
    hm_test_set_context("statistics and trim");
    hm_jemalloc_params_t *jp;
    REQUIRE_OK(hm_jemalloc_params_create(&jp));
    REQUIRE_OK(hm_jemalloc_params_set_decay_ms(jp, -1, -1)); /* keep all until trim */
    hm_pool_t *pool = os_pool(jp, 0, RW);
    hm_jemalloc_params_destroy(jp);
    enum { N = 20000 };
    static void *ptr[N];
    for (int i = 0; i < N; i++) {
        ptr[i] = hm_pool_malloc(pool, 100);
        REQUIRE(ptr[i]);
        memset(ptr[i], 0x5a, 100);
    }
    void *big = hm_pool_malloc(pool, 3 * MIB);
    REQUIRE(big);
    memset(big, 1, 3 * MIB);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_requested >= (size_t)N * 100 + 3 * MIB,
              "bytes_requested %zu", st.bytes_requested);
    CHECK(st.bytes_from_provider >= st.bytes_requested);
    CHECK(st.provider_allocs >= 1);
    size_t held = st.bytes_from_provider;
    for (int i = 0; i < N; i++) CHECK_OK(hm_pool_free(pool, ptr[i]));
    CHECK_OK(hm_pool_free(pool, big));
    CHECK_OK(hm_pool_trim(pool));
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_requested < 64 * KIB, "after trim: %zu bytes still allocated",
              st.bytes_requested);
    CHECK_MSG(st.bytes_from_provider < held, "trim returned nothing (%zu of %zu held)",
              st.bytes_from_provider, held);
    CHECK_OK(hm_pool_destroy(pool));
}

/* ---- exact statistics ----
 * bytes_requested is what users hold now, at usable size (pool.h): blocks in
 * the threads' caches of the pool are not counted, whichever thread freed
 * them, with no trim. Threads stop at barriers while the main thread reads
 * the statistics, so no call is in flight and the answer is exact. */

#define STATS_T 4
#define STATS_N 160 /* blocks per thread and round */

typedef struct stats_arg {
    hm_pool_t *pool;
    pthread_barrier_t *bar;
    void **mine;   /* STATS_N blocks this thread allocates */
    void **theirs; /* STATS_N blocks of the next thread, freed here */
    int idx;
} stats_arg_t;

/* Small and large classes, sizes cached by jemalloc's tcaches (up to 32 KiB)
 * and beyond, aligned blocks, calloc and realloc. */
static void *stats_alloc(hm_pool_t *pool, int i) {
    static const size_t sizes[] = {1,    8,    24,    64,    100,   500,    1024,     4000,
                                   4096, 5000, 8192,  16384, 30000, 40000,  200000,   MIB + 1};
    size_t size = sizes[i % (int)(sizeof(sizes) / sizeof(sizes[0]))];
    switch (i % 7) {
    case 3: return hm_pool_aligned_malloc(pool, size, (size_t)256 << (i % 9));
    case 5: return hm_pool_calloc(pool, 1, size);
    case 6: {
        void *p = hm_pool_malloc(pool, 100);
        if (!p) return NULL;
        void *q = hm_pool_realloc(pool, p, size + 100);
        if (!q) hm_pool_free(pool, p);
        return q;
    }
    default: return hm_pool_malloc(pool, size);
    }
}

static void *stats_thread(void *arg) {
    stats_arg_t *a = arg;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < STATS_N; i++) {
            a->mine[i] = stats_alloc(a->pool, i + a->idx + 3 * round);
            REQUIRE(a->mine[i] != NULL);
        }
        pthread_barrier_wait(a->bar); /* main reads: everything live */
        pthread_barrier_wait(a->bar);
        /* Free the next thread's blocks (remote frees into this thread's
         * cache), then make and free a few more of its own (reuse). */
        for (int i = 0; i < STATS_N; i++) CHECK_OK(hm_pool_free(a->pool, a->theirs[i]));
        for (int i = 0; i < 50; i++) {
            void *p = stats_alloc(a->pool, i * 3 + round);
            REQUIRE(p != NULL);
            CHECK_OK(hm_pool_free(a->pool, p));
        }
        pthread_barrier_wait(a->bar); /* main reads: nothing live */
        pthread_barrier_wait(a->bar);
    }
    return NULL;
}

static size_t usable_sum(hm_pool_t *pool, void *const *p, size_t n) {
    size_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += hm_pool_malloc_usable_size(pool, p[i]);
    return sum;
}

static void check_stats_fields(hm_pool_t *pool, size_t live, const char *when) {
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_MSG(st.bytes_requested == live, "%s: bytes_requested %zu, users hold %zu", when,
              st.bytes_requested, live);
    CHECK_MSG(st.bytes_from_provider >= st.bytes_requested, "%s: %zu from the provider < %zu",
              when, st.bytes_from_provider, st.bytes_requested);
    CHECK_MSG(st.bytes_from_provider == 0 || st.provider_allocs >= 1,
              "%s: %zu bytes in %zu provider allocations", when, st.bytes_from_provider,
              st.provider_allocs);
    /* jemalloc has no remote-free queues: a remote free goes to the freeing
     * thread's cache (pools/jemalloc.h). */
    CHECK(st.remote_frees_published == 0 && st.remote_frees_drained == 0);
}

static void test_stats_exact(void) {
    hm_test_set_context("exact statistics");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    hm_pool_stats_t st;
    /* One thread: 100 blocks of 64 bytes, all freed (they stay in the
     * thread's cache). */
    void *b[100];
    for (int i = 0; i < 100; i++) REQUIRE((b[i] = hm_pool_malloc(pool, 64)) != NULL);
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, usable_sum(pool, b, 100));
    CHECK(st.slabs >= 1);
    for (int i = 0; i < 100; i++) CHECK_OK(hm_pool_free(pool, b[i]));
    check_stats_fields(pool, 0, "100 x 64 B freed");

    /* Several threads, a mix of sizes, remote frees. */
    static void *blocks[STATS_T][STATS_N];
    pthread_barrier_t bar;
    REQUIRE(pthread_barrier_init(&bar, NULL, STATS_T + 1) == 0);
    stats_arg_t args[STATS_T];
    pthread_t th[STATS_T];
    for (int t = 0; t < STATS_T; t++) {
        args[t] = (stats_arg_t){pool, &bar, blocks[t], blocks[(t + 1) % STATS_T], t};
        REQUIRE(pthread_create(&th[t], NULL, stats_thread, &args[t]) == 0);
    }
    for (int round = 0; round < 2; round++) {
        pthread_barrier_wait(&bar);
        /* The main thread holds some too. */
        void *own[40];
        for (int i = 0; i < 40; i++) REQUIRE((own[i] = stats_alloc(pool, i * 5 + round)) != NULL);
        size_t own_live = usable_sum(pool, own, 40), live = own_live;
        for (int t = 0; t < STATS_T; t++) live += usable_sum(pool, blocks[t], STATS_N);
        check_stats_fields(pool, live, round ? "all live (round 2)" : "all live");
        CHECK_OK(hm_pool_get_stats(pool, &st));
        CHECK_MSG(st.slabs >= 1, "%zu slabs with small blocks live", st.slabs);
        for (int i = 0; i < 40; i++) CHECK_OK(hm_pool_free(pool, own[i]));
        check_stats_fields(pool, live - own_live, "the main thread's freed");
        pthread_barrier_wait(&bar);
        pthread_barrier_wait(&bar);
        check_stats_fields(pool, 0, round ? "all freed, threads live (round 2)"
                                          : "all freed, threads live");
        pthread_barrier_wait(&bar);
    }
    for (int t = 0; t < STATS_T; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    check_stats_fields(pool, 0, "threads exited");
    CHECK_OK(hm_pool_trim(pool));
    check_stats_fields(pool, 0, "after trim");
    CHECK_OK(hm_pool_destroy(pool));

    /* Without thread caches the count is jemalloc's own. */
    hm_jemalloc_params_t *jp;
    REQUIRE_OK(hm_jemalloc_params_create(&jp));
    REQUIRE_OK(hm_jemalloc_params_set_tcache(jp, false));
    pool = os_pool(jp, 0, RW);
    hm_jemalloc_params_destroy(jp);
    for (int i = 0; i < 100; i++) REQUIRE((b[i] = stats_alloc(pool, i)) != NULL);
    check_stats_fields(pool, usable_sum(pool, b, 100), "no tcache, live");
    for (int i = 0; i < 100; i++) CHECK_OK(hm_pool_free(pool, b[i]));
    check_stats_fields(pool, 0, "no tcache, freed");
    CHECK_OK(hm_pool_destroy(pool));
}

/* Thousands of pools created and destroyed: arena indices are reused (the
 * process could not hold more than 4095 arenas otherwise), nothing leaks. */
static void test_create_destroy_loop(void) {
    hm_test_set_context("create/destroy loop");
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, RW, &prov));
    int loops = 4500; /* past 4095: arena indices must be reused */
    for (int i = 0; i < loops; i++) {
        hm_pool_t *pool = NULL;
        hm_result_t r = hm_jemalloc_pool_create(prov, NULL, 0, &pool);
        if (r != HM_SUCCESS) {
            CHECK_MSG(0, "loop %d: create -> %s", i, hm_result_string(r));
            break;
        }
        void *p = hm_pool_malloc(pool, (size_t)(i % 5000) + 1);
        CHECK(p != NULL);
        if (i % 100 == 0) { /* and leak one now and then: destroy reclaims it */
            void *leak = hm_pool_malloc(pool, 70000);
            CHECK(leak != NULL);
        }
        CHECK_OK(hm_pool_free(pool, p));
        CHECK_OK(hm_pool_destroy(pool));
    }
    CHECK_OK(hm_provider_destroy(prov));
}

/* The arena limit: a clear error, and pools work again after destroys. */
static void test_arena_limit(void) {
    hm_test_set_context("arena limit");
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, RW, &prov));
    enum { MAX = 4200 };
    hm_pool_t **pools = calloc(MAX, sizeof(*pools));
    REQUIRE(pools);
    int n = 0;
    hm_result_t r = HM_SUCCESS;
    while (n < MAX && (r = hm_jemalloc_pool_create(prov, NULL, 0, &pools[n])) == HM_SUCCESS) n++;
    CHECK_MSG(r == HM_ERROR_LIMIT, "after %d pools: %s, expected HM_ERROR_LIMIT", n,
              hm_result_string(r));
    CHECK_MSG(n >= 4000 && n < 4095, "%d pools before the limit", n);
    for (int i = 0; i < n; i += 2) CHECK_OK(hm_pool_destroy(pools[i]));
    hm_pool_t *again = NULL;
    CHECK_OK(hm_jemalloc_pool_create(prov, NULL, 0, &again));
    if (again) {
        void *p = hm_pool_malloc(again, 64);
        CHECK(p && hm_pool_by_ptr(p) == again);
        CHECK_OK(hm_pool_free(again, p));
        CHECK_OK(hm_pool_destroy(again));
    }
    for (int i = 1; i < n; i += 2) CHECK_OK(hm_pool_destroy(pools[i]));
    free(pools);
    CHECK_OK(hm_provider_destroy(prov));
}

/* Threads come and go: each exit must destroy the thread's tcaches, or the
 * 4093 explicit tcaches run out (and the pool logs a warning). */
typedef struct churn_arg {
    hm_pool_t **pools;
    int npools;
} churn_arg_t;

static void *churn_thread(void *argp) {
    churn_arg_t *a = argp;
    for (int k = 0; k < a->npools; k++) {
        void *p = hm_pool_malloc(a->pools[k], 48);
        CHECK(p != NULL);
        CHECK(hm_pool_by_ptr(p) == a->pools[k]);
        CHECK_OK(hm_pool_free(a->pools[k], p));
    }
    return NULL;
}

static void test_thread_churn(void) {
    hm_test_set_context("thread exit destroys tcaches");
    enum { P = 6 };
    hm_pool_t *pools[P];
    for (int k = 0; k < P; k++) pools[k] = os_pool(NULL, 0, RW);
    churn_arg_t a = {pools, P};
    int rounds = 720; /* 720 threads x 6 pools = 4320 tcaches made > 4093 */
    atomic_store(&g_warnings, 0);
    hm_log_set_sink(count_sink, NULL);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_WARN);
    for (int i = 0; i < rounds; i += 2) {
        pthread_t t1, t2;
        REQUIRE(pthread_create(&t1, NULL, churn_thread, &a) == 0);
        REQUIRE(pthread_create(&t2, NULL, churn_thread, &a) == 0);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
    }
    hm_log_set_level(old);
    hm_log_set_sink(NULL, NULL);
    CHECK_MSG(atomic_load(&g_warnings) == 0, "%ld warnings (tcaches leaked?)",
              atomic_load(&g_warnings));
    for (int k = 0; k < P; k++) CHECK_OK(hm_pool_destroy(pools[k]));
}

/* ---- pointer validation (HM_POOL_OPS_VALIDATES_POINTERS) ----
 * The pool answers "is this a live block of mine?" from jemalloc's own extent
 * map; every refusal is HM_ERROR_INVALID_ARGUMENT (NULL + EINVAL for
 * realloc, 0 for usable_size) and one log line, and leaves the block alone. */

static _Atomic long g_errors;
static void error_sink(hm_log_level_t level, const char *line, void *arg) {
    (void)line, (void)arg;
    if (level >= HM_LOG_ERROR) atomic_fetch_add(&g_errors, 1);
}

/* Every way `pool` must refuse ptr; each refusal logs. */
static void check_refused(hm_pool_t *pool, void *ptr, const char *what) {
    long before = atomic_load(&g_errors);
    CHECK_MSG(hm_pool_free(pool, ptr) == HM_ERROR_INVALID_ARGUMENT, "free of %s %p accepted",
              what, ptr);
    CHECK_MSG(atomic_load(&g_errors) > before, "free of %s %p: no log line", what, ptr);
    CHECK_MSG(hm_pool_malloc_usable_size(pool, ptr) == 0, "usable_size of %s %p", what, ptr);
    errno = 0;
    void *r = hm_pool_realloc(pool, ptr, 24);
    CHECK_MSG(r == NULL && errno == EINVAL, "realloc of %s %p: %p errno %d", what, ptr, r,
              errno);
}

typedef struct foreign_arg {
    hm_pool_t *a, *b;
    void *mine, *theirs;
} foreign_arg_t;

/* A thread that never used jemalloc (its thread data is not set up yet):
 * validation must work there too. */
static void *foreign_thread(void *argp) {
    foreign_arg_t *a = argp;
    check_refused(a->a, a->theirs, "other pool's block (fresh thread)");
    check_refused(a->a, (char *)a->mine + 16, "interior pointer (fresh thread)");
    CHECK_OK(hm_pool_free(a->a, a->mine));
    return NULL;
}

static void test_foreign_pointers(void) {
    hm_test_set_context("pointer validation");
    hm_pool_t *a = os_pool(NULL, 0, RW);
    hm_pool_t *b = os_pool(NULL, 0, RW);
    hm_pool_t *u = os_pool(NULL, HM_POOL_FLAG_NO_TRACKING, RW); /* validates too */
    hm_pool_t *none = os_pool(NULL, 0, HM_OS_PROT_NONE);
    atomic_store(&g_errors, 0);
    hm_log_set_sink(error_sink, NULL);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_ERROR);
    /* Powers of two, other small classes (slab regions not a divisor of the
     * page), the largest lookup class, small above it, large, huge. */
    static const size_t sizes[] = {8, 16, 48, 80, 100, 112, 640, 4096, 5000, 6144, 8192,
                                   14336, 20000, 64 * KIB, 3 * MIB};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    hm_pool_t *owners[] = {a, u, none};
    for (int o = 0; o < 3; o++) {
        hm_pool_t *own = owners[o];
        hm_pool_t *other = own == a ? b : a;
        for (int i = 0; i < NS; i++) {
            void *p = hm_pool_malloc(own, sizes[i]);
            REQUIRE(p);
            size_t us = hm_pool_malloc_usable_size(own, p);
            CHECK_MSG(us >= sizes[i], "usable %zu < %zu", us, sizes[i]);
            check_refused(other, p, "other pool's block");
            check_refused(b == other ? u : b, p, "other pool's block");
            /* (p + 8 is the next region in the 8-byte class: a block start,
             * possibly in a thread cache, which cannot be told apart.) */
            if (us > 8) check_refused(own, (char *)p + 8, "interior pointer");
            check_refused(own, (char *)p + 1, "unaligned pointer");
            if (us > 64) check_refused(own, (char *)p + (us / 2 & ~(size_t)7), "interior");
            if (us >= 8 * KIB) check_refused(own, (char *)p + 4 * KIB, "next page");
            /* A multiple of the largest power of two dividing the size, but
             * not of the size (48: +16): passes an alignment test, only the
             * division tells. */
            size_t low = us & (0 - us);
            if (low < us) check_refused(own, (char *)p + low, "interior pointer (size's 2^k)");
            CHECK(hm_pool_malloc_usable_size(own, p) == us); /* untouched */
            CHECK_OK(hm_pool_free(own, p));
        }
    }
    /* Every small size class (8 B .. 14 KiB), found by usable size: every
     * 8-aligned offset inside the first region up to 256 B and a spread
     * of larger ones is refused (the free path's divisibility test). */
    for (size_t s = 8; s <= 14 * KIB;) {
        void *p = hm_pool_malloc(a, s);
        REQUIRE(p);
        size_t us = hm_pool_malloc_usable_size(a, p);
        REQUIRE(us >= s);
        for (size_t off = 8; off < us; off += off < 256 ? 8 : off / 4 & ~(size_t)7)
            check_refused(a, (char *)p + off, "interior pointer (every class)");
        CHECK_OK(hm_pool_free(a, p));
        s = us + 1;
    }
    /* Not jemalloc's at all. */
    void *m = malloc(64);
    REQUIRE(m);
    static char in_data[64] __attribute__((aligned(16)));
    char on_stack[64] __attribute__((aligned(16)));
    check_refused(a, m, "malloc() block");
    check_refused(a, in_data, "static data");
    check_refused(a, on_stack, "stack");
    check_refused(a, (void *)(uintptr_t)0x1000, "low address");
    check_refused(a, (void *)(uintptr_t)0xffff800000001000ull, "kernel-half address");
    check_refused(a, (void *)(((uintptr_t)1 << 47) + 4096), "address above 2^47");
    free(m);
    /* A large block freed (its extent is no longer active) is refused. */
    void *big = hm_pool_malloc(a, 3 * MIB);
    REQUIRE(big);
    CHECK_OK(hm_pool_free(a, big));
    if (hm_pool_malloc_usable_size(a, big) == 0) check_refused(a, big, "freed large block");
    /* A fresh thread. */
    foreign_arg_t fa = {a, b, hm_pool_malloc(a, 48), hm_pool_malloc(b, 48)};
    REQUIRE(fa.mine && fa.theirs);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, foreign_thread, &fa) == 0);
    pthread_join(t, NULL);
    CHECK_OK(hm_pool_free(b, fa.theirs));
    /* hm_free still finds the pool through the tracker. */
    void *x = hm_pool_malloc(b, 200);
    REQUIRE(x);
    CHECK(hm_pool_by_ptr(x) == b);
    CHECK_OK(hm_free(x));
    hm_log_set_level(old);
    hm_log_set_sink(NULL, NULL);
    CHECK_OK(hm_pool_destroy(none));
    CHECK_OK(hm_pool_destroy(u));
    CHECK_OK(hm_pool_destroy(b));
    CHECK_OK(hm_pool_destroy(a));
}

static int cmp_ptr(const void *x, const void *y) {
    uintptr_t a = (uintptr_t) * (void *const *)x, b = (uintptr_t) * (void *const *)y;
    return a < b ? -1 : a > b;
}

/* Every small class, on a fresh pool: blocks enough for several slabs
 * (every region index of a slab, up to the last; the blocks, sorted, must
 * come mostly back to back) are each accepted as what they are by the
 * region test (usable size, then the free path). (jemalloc 5.3.0's slabs
 * hold a whole number of regions, sc.c's slab_size, so a slab has no tail
 * past its last region to test.) */
static void test_region_starts(void) {
    hm_test_set_context("region starts");
    for (size_t s = 8; s <= 14 * KIB;) {
        hm_pool_t *pool = os_pool(NULL, 0, RW);
        void *first = hm_pool_malloc(pool, s);
        REQUIRE(first);
        size_t us = hm_pool_malloc_usable_size(pool, first);
        REQUIRE(us >= s);
        size_t n = 3 * 64 * KIB / us + 16;
        if (n > 8192) n = 8192;
        void **p = malloc(n * sizeof(*p));
        REQUIRE(p);
        p[0] = first;
        for (size_t i = 1; i < n; i++) REQUIRE((p[i] = hm_pool_malloc(pool, us)));
        qsort(p, n, sizeof(*p), cmp_ptr);
        size_t bad = 0, runs = 0;
        for (size_t i = 0; i < n; i++) bad += hm_pool_malloc_usable_size(pool, p[i]) != us;
        CHECK_MSG(bad == 0, "class %zu: %zu of %zu live blocks not accepted", us, bad, n);
        for (size_t i = 0; i < n; i++)
            if (i + 1 == n || (uintptr_t)p[i + 1] - (uintptr_t)p[i] != us) runs++;
        CHECK_MSG(runs < n / 2, "class %zu: %zu runs in %zu blocks (no slab filled?)", us, runs,
                  n);
        for (size_t i = 0; i < n; i++) CHECK_OK(hm_pool_free(pool, p[i]));
        free(p);
        CHECK_OK(hm_pool_destroy(pool));
        s = us + 1;
    }
}

/* An arena with more extent descriptors than its first metadata block holds
 * (2 MiB, about 16,000 descriptors; the free fast path proves the arena
 * from the first block alone and leaves the others to the whole check):
 * 20,000 large blocks (one descriptor each, address space only: nothing is
 * written), then small blocks whose slabs' descriptors come from later
 * blocks. They are used, validated and freed like any other. */
static void test_many_extents(void) {
    hm_test_set_context("many extents");
    enum { NLARGE = 20000, NSMALL = 4096 };
    hm_pool_t *a = os_pool(NULL, 0, RW);
    hm_pool_t *b = os_pool(NULL, 0, RW);
    void **large = malloc(NLARGE * sizeof(*large));
    void **small = malloc(NSMALL * sizeof(*small));
    REQUIRE(large && small);
    for (int i = 0; i < NLARGE; i++) REQUIRE((large[i] = hm_pool_malloc(a, 16 * KIB)));
    static const size_t sizes[] = {8, 48, 64, 112, 640, 4096, 6144};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    for (int i = 0; i < NSMALL; i++) {
        REQUIRE((small[i] = hm_pool_malloc(a, sizes[i % NS])));
        memset(small[i], 0x5a, sizes[i % NS]);
    }
    atomic_store(&g_errors, 0);
    hm_log_set_sink(error_sink, NULL);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_ERROR);
    for (int i = NSMALL - 2 * NS; i < NSMALL; i++) {
        /* (+8 in the 8-byte class is the next region: a block start) */
        if (sizes[i % NS] > 8)
            check_refused(a, (char *)small[i] + 8, "interior pointer (late descriptor)");
        check_refused(a, (char *)small[i] + 1, "unaligned pointer (late descriptor)");
        check_refused(b, small[i], "other pool's block (late descriptor)");
        CHECK(hm_pool_malloc_usable_size(a, small[i]) >= sizes[i % NS]);
    }
    hm_log_set_level(old);
    hm_log_set_sink(NULL, NULL);
    /* Freed and reused through the thread's cache, in a different order. */
    for (int round = 0; round < 3; round++) {
        for (int i = round & 1; i < NSMALL; i += 2) CHECK_OK(hm_pool_free(a, small[i]));
        for (int i = round & 1; i < NSMALL; i += 2) {
            REQUIRE((small[i] = hm_pool_malloc(a, sizes[i % NS])));
            memset(small[i], 0xa5, sizes[i % NS]);
        }
    }
    for (int i = 0; i < NSMALL; i++) CHECK_OK(hm_pool_free(a, small[i]));
    for (int i = 0; i < NLARGE; i++) CHECK_OK(hm_pool_free(a, large[i]));
    free(small);
    free(large);
    CHECK_OK(hm_pool_destroy(b));
    CHECK_OK(hm_pool_destroy(a));
}

/* The fast paths' thread lines (je_fast.h: the pool's first thread, then
 * slots by thread pointer, then a per-thread table) change hands: the first
 * thread exits with blocks still live, the main thread frees them and
 * carries on, threads that came later run side by side and pass blocks to
 * each other, a trim disables the caller's cache in the middle. Every block
 * keeps its contents and its size throughout. */
typedef struct handover_arg {
    hm_pool_t *pool;
    void **out;      /* blocks handed to the next stage */
    int n, seed;
    void **in;       /* blocks received (freed here) */
    int nin;
} handover_arg_t;

static size_t handover_size(int seed, int i) { return 8 + (size_t)((seed * 131 + i * 37) % 600); }

static void *handover_thread(void *argp) {
    handover_arg_t *a = argp;
    for (int i = 0; i < a->nin; i++) {
        unsigned char *q = a->in[i];
        CHECK_MSG(q[0] == (unsigned char)i, "received block %d: contents lost", i);
        CHECK_OK(hm_pool_free(a->pool, q));
    }
    for (int r = 0; r < 200; r++) {
        void *t[16];
        for (int i = 0; i < 16; i++) REQUIRE((t[i] = hm_pool_malloc(a->pool, handover_size(r, i))));
        for (int i = 0; i < 16; i++) CHECK_OK(hm_pool_free(a->pool, t[i]));
    }
    for (int i = 0; i < a->n; i++) {
        size_t sz = handover_size(a->seed, i);
        unsigned char *q = hm_pool_malloc(a->pool, sz);
        REQUIRE(q);
        CHECK(hm_pool_malloc_usable_size(a->pool, q) >= sz);
        memset(q, i & 0xff, sz);
        a->out[i] = q;
    }
    return NULL;
}

static void test_thread_handover(void) {
    hm_test_set_context("thread lines change hands");
    enum { N = 300 };
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    static void *b1[N], *b2[N], *b3[N];
    /* 1. The pool's first thread leaves N blocks behind and exits. */
    handover_arg_t a1 = {pool, b1, N, 1, NULL, 0};
    pthread_t t1, t2, t3;
    REQUIRE(pthread_create(&t1, NULL, handover_thread, &a1) == 0);
    pthread_join(t1, NULL);
    /* 2. This thread frees them and carries on; a trim between. */
    handover_arg_t a0 = {pool, b2, N, 2, b1, N};
    handover_thread(&a0);
    CHECK_OK(hm_pool_trim(pool));
    handover_arg_t a0b = {pool, b1, N, 5, b2, N}; /* b2 freed, b1 made */
    handover_thread(&a0b);
    /* 3. Two later threads side by side; the first (likely on the first
     * thread's stack and thread pointer, which glibc reuses) starts by
     * freeing this thread's blocks. */
    handover_arg_t a3 = {pool, b2, N, 4, b1, N};
    handover_arg_t a2 = {pool, b3, N, 3, NULL, 0};
    REQUIRE(pthread_create(&t3, NULL, handover_thread, &a3) == 0);
    REQUIRE(pthread_create(&t2, NULL, handover_thread, &a2) == 0);
    pthread_join(t2, NULL);
    pthread_join(t3, NULL);
    for (int i = 0; i < N; i++) {
        CHECK(((unsigned char *)b3[i])[0] == (unsigned char)i);
        CHECK(((unsigned char *)b2[i])[0] == (unsigned char)i);
        CHECK_OK(hm_pool_free(pool, b3[i]));
        CHECK_OK(hm_pool_free(pool, b2[i]));
    }
    /* Every block came back through a live cache: destroy flushes the
     * caches it knows and finds nothing allocated (a block left in a cache
     * of an exited thread, or freed into one, would be reported). */
    atomic_store(&g_warnings, 0);
    hm_log_set_sink(count_sink, NULL);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_WARN);
    CHECK_OK(hm_pool_destroy(pool));
    hm_log_set_level(old);
    hm_log_set_sink(NULL, NULL);
    CHECK_MSG(atomic_load(&g_warnings) == 0, "destroy: %ld warnings (blocks left in a cache?)",
              atomic_load(&g_warnings));
}

/* Provider failures: allocation fails cleanly, the pool recovers. */
static void test_faults(void) {
    hm_test_set_context("provider failures");
    hm_provider_t *fault;
    REQUIRE_OK(hm_test_make_provider(HM_TEST_FAULT, &fault));
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_jemalloc_pool_create(fault, NULL, 0, &pool));
    hm_fault_provider_arm(fault, HM_FAULT_ALLOC, -1);
    errno = 0;
    void *p = hm_pool_malloc(pool, 64 * MIB);
    CHECK(p == NULL && errno == ENOMEM);
    hm_fault_provider_disarm(fault);
    p = hm_pool_malloc(pool, 64 * MIB);
    CHECK(p != NULL);
    CHECK_OK(hm_pool_free(pool, p));
    /* Splits refused: jemalloc copes (takes fresh memory or fails cleanly). */
    hm_fault_provider_arm(fault, HM_FAULT_SPLIT, -1);
    void *q[32];
    for (int i = 0; i < 32; i++) {
        q[i] = hm_pool_malloc(pool, (size_t)(i + 1) * 9000);
        if (q[i]) memset(q[i], 1, (size_t)(i + 1) * 9000);
    }
    hm_fault_provider_disarm(fault);
    for (int i = 0; i < 32; i++)
        if (q[i]) CHECK_OK(hm_pool_free(pool, q[i]));
    /* Frees refused: jemalloc retains the memory. */
    hm_fault_provider_arm(fault, HM_FAULT_FREE, -1);
    CHECK_OK(hm_pool_trim(pool));
    hm_fault_provider_disarm(fault);
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_EQ(hm_fault_provider_misuse(fault), 0);
    CHECK_EQ(hm_fault_provider_live(fault), 0);
    CHECK_OK(hm_provider_destroy(fault));
}

/* Fork: the child keeps using the parent's pool, also when other threads
 * were inside the pool (and its extent hooks) at the fork. */
typedef struct fork_busy {
    hm_pool_t *pool;
    _Atomic int stop;
    _Atomic int park, parked;
} fork_busy_t;

/* ASan's own allocator is not fork-safe while other threads are inside it
 * (the child can hang in it, as in test/base/test_fork.c), so under ASan the
 * busy threads park around each fork; Release and TSan builds fork while
 * they run, inside the pool and its extent hooks. */
#if defined(__SANITIZE_ADDRESS__)
#define PARK_AROUND_FORK 1
#else
#define PARK_AROUND_FORK 0
#endif

static void *fork_busy_thread(void *argp) {
    fork_busy_t *b = argp;
    unsigned i = 0;
    while (!atomic_load(&b->stop)) {
        if (atomic_load(&b->park)) {
            atomic_fetch_add(&b->parked, 1);
            while (atomic_load(&b->park)) sched_yield();
            atomic_fetch_sub(&b->parked, 1);
        }
        size_t size = (i++ % 3) ? 64 : (size_t)(i % 64 + 1) * 64 * KIB; /* hooks run */
        void *p = hm_pool_malloc(b->pool, size);
        CHECK(p != NULL);
        if (p) ((char *)p)[size - 1] = 1;
        CHECK_OK(hm_pool_free(b->pool, p));
        if (i % 64 == 0) CHECK_OK(hm_pool_trim(b->pool));
    }
    return NULL;
}

/* In a forked child: threads that use the inherited pool on its fast paths.
 * glibc gives them the control blocks (thread pointers) of the parent's
 * other threads, which had entries in the pool's thread-pointer table; each
 * keeps 64 live small blocks with its own pattern. */
static void *fork_child_thread(void *argp) {
    hm_pool_t *pool = argp;
    unsigned char tag = (unsigned char)(uintptr_t)pthread_self();
    void *live[64] = {0};
    int ok = 1;
    for (int i = 0; i < 4000 && ok; i++) {
        int k = i % 64;
        if (live[k]) {
            ok = ((unsigned char *)live[k])[47] == tag && hm_pool_free(pool, live[k]) == HM_SUCCESS;
            live[k] = NULL;
        }
        live[k] = hm_pool_malloc(pool, 48);
        if (!live[k]) return NULL;
        memset(live[k], tag, 48);
    }
    for (int k = 0; k < 64; k++)
        if (live[k]) ok = ok && hm_pool_free(pool, live[k]) == HM_SUCCESS;
    return ok ? pool : NULL;
}

#if defined(HM_TSAN)
#define FORK_CHILD_TSAN 1
#else
#define FORK_CHILD_TSAN 0
#endif

static int fork_child_threads(hm_pool_t *pool) {
    pthread_t t[2];
    void *r[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, fork_child_thread, pool) != 0) return 0;
    for (int i = 0; i < 2; i++) pthread_join(t[i], &r[i]);
    return r[0] == pool && r[1] == pool;
}

static void test_fork(void) {
    hm_test_set_context("fork");
    hm_pool_t *pool = os_pool(NULL, 0, RW);
    fork_busy_t busy = {.pool = pool};
    pthread_t bt[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&bt[i], NULL, fork_busy_thread, &busy) == 0);
    for (int round = 0; round < 20; round++) {
        if (PARK_AROUND_FORK) {
            atomic_store(&busy.park, 1);
            while (atomic_load(&busy.parked) < 2) sched_yield();
        }
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            int ok = 1;
            for (int i = 0; i < 200 && ok; i++) {
                size_t size = (size_t)(i % 10 + 1) * 50 * KIB;
                void *x = hm_pool_malloc(pool, size);
                ok = x && hm_pool_by_ptr(x) == pool && hm_pool_free(pool, x) == HM_SUCCESS;
            }
            /* (Not under TSan: it refuses a thread whose pthread_t a
             * parent's thread had, "dup thread with used id".) */
            if (ok && round % 4 == 0 && !FORK_CHILD_TSAN) ok = fork_child_threads(pool);
            _exit(ok ? 0 : 1);
        }
        atomic_store(&busy.park, 0);
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "busy fork %d: status %d",
                  round, status);
    }
    atomic_store(&busy.stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(bt[i], NULL);

    void *p = hm_pool_malloc(pool, 1000);
    REQUIRE(p);
    memset(p, 7, 1000);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int ok = ((unsigned char *)p)[999] == 7 && hm_pool_by_ptr(p) == pool;
        for (int i = 0; i < 1000 && ok; i++) {
            void *x = hm_pool_malloc(pool, (size_t)i + 1);
            ok = x && hm_pool_by_ptr(x) == pool && hm_pool_free(pool, x) == HM_SUCCESS;
        }
        ok = ok && hm_pool_free(pool, p) == HM_SUCCESS && hm_pool_destroy(pool) == HM_SUCCESS;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
}

int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : "unit";
#define PART(name) (!strcmp(part, "all") || !strcmp(part, name))
    int ran = 0;
    if (PART("unit")) {
        ran++;
        test_params();
        test_minimal_provider();
        test_prot_none();
        test_stats_and_trim();
        test_stats_exact();
        test_foreign_pointers();
        test_region_starts();
        test_many_extents();
        test_thread_handover();
        test_faults();
    }
    if (PART("fork")) {
        ran++;
        test_fork();
    }
#if defined(HM_TSAN)
    /* loops and limit are single-threaded (thousands of arenas made and
     * destroyed): nothing for a race detector to find, and most of the TSan
     * run's time. Release and ASan+UBSan run them. */
    if (!strcmp(part, "loops") || !strcmp(part, "limit"))
        HM_TEST_SKIP("single-threaded: run in the Release and ASan builds");
#endif
    if (PART("loops")) {
        ran++;
        test_create_destroy_loop();
    }
    if (PART("limit")) {
        ran++;
        test_arena_limit();
    }
    if (PART("churn")) {
        ran++;
        test_thread_churn();
    }
    if (!ran) {
        fprintf(stderr, "unknown part '%s'\n", part);
        return 2;
    }
    return hm_test_finish();
}
