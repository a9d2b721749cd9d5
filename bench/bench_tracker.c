/* hetmem benchmark: the tracker against a global-mutex balanced tree.
 * SPDX-License-Identifier: MIT
 *
 * Subject  "tracker": src/tracker (lock-free radix tree, urcu-bp readers,
 *          per-thread node cache, per-pool index).
 * Baseline "mutex-rbtree": one pthread mutex around glibc's tsearch/tfind/
 *          tdelete (a red-black tree) keyed by range, with the same per-pool
 *          list for destroy. Both keep the same record fields.
 *
 * Synthetic addresses (nothing is mapped): N ranges of 64 KiB, contiguous
 * from 0x100000000000, so 32 ranges share each 2 MiB region (the deepest,
 * leaf-level case for the radix tree). Cases, for N = 10^3 .. 10^6:
 *   lookup-hit      8 addresses in one 2 MiB region, over and over: the
 *                   per-thread node cache hits.
 *   lookup-miss     one address in each of 32 distinct 2 MiB regions spread
 *                   over all N, visited in address order: every lookup misses
 *                   the per-thread cache (each of its 16 slots sees a new
 *                   region each time) and walks from the root, while the
 *                   working set is the same for every N and stays in the CPU
 *                   caches: the structure's own cost (depth), the figure the
 *                   "miss at 10^6 <= 2x miss at 10^3" target is about.
 *   lookup-miss4k   the same over min(regions, 4096) regions: the walk's
 *                   metadata no longer fits L1/L2 at large N.
 *   lookup-random   uniformly random ranges among all N: also pays DRAM
 *                   misses once the metadata outgrows the CPU caches.
 *   insert+remove   per thread a ring of 256 live ranges: insert one, remove
 *                   the oldest (2 ops), with 1 and 2 threads, each on its own
 *                   pool; and with 1 thread while N = 10^3 .. 10^6 other
 *                   ranges are live (insert and remove must not grow with N).
 *   destroy-1000    fill a pool with 1000 ranges and destroy it (drain),
 *                   while the other pools hold 0 and then 10^6 ranges. The
 *                   drain alone is also timed separately and printed.
 * Options: those of the harness (--csv FILE, --repeats, --quick ...).
 * --quick also caps N at 10^4. */
#include "harness.h"
#include "internal.h"
#include "tracker/tracker.h"

#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POP_BASE 0x100000000000ull
#define POP_SIZE (64u << 10)
#define CHURN_BASE 0x300000000000ull
#define DRAIN_BASE 0x380000000000ull
#define MISS_SET 4096

/* ------------------------------------------------------------------------
 * Baseline: global mutex + tsearch red-black tree + per-pool lists. */
typedef struct brec {
    uintptr_t base;
    size_t size;
    void *pool, *provider;
    uint64_t id;
    uint32_t flags;
    struct brec *prev, *next; /* pool list */
} brec_t;

typedef struct bpool {
    brec_t *head;
    size_t count;
} bpool_t;

static pthread_mutex_t b_lock = PTHREAD_MUTEX_INITIALIZER;
static void *b_root;
static uint64_t b_next_id = 1;

static int b_cmp(const void *x, const void *y) {
    const brec_t *a = x, *b = y;
    if (a->base + a->size <= b->base) return -1;
    if (b->base + b->size <= a->base) return 1;
    return 0; /* overlap: the same for a point key inside a range */
}

static int b_insert(bpool_t *pool, uintptr_t base, size_t size) {
    brec_t *r = malloc(sizeof *r);
    if (!r) return -1;
    *r = (brec_t){.base = base, .size = size, .pool = pool};
    pthread_mutex_lock(&b_lock);
    brec_t **found = tsearch(r, &b_root, b_cmp);
    if (!found || *found != r) {
        pthread_mutex_unlock(&b_lock);
        free(r);
        return -1;
    }
    r->id = b_next_id++;
    r->next = pool->head;
    if (pool->head) pool->head->prev = r;
    pool->head = r;
    pool->count++;
    pthread_mutex_unlock(&b_lock);
    return 0;
}

static int b_remove(uintptr_t base, size_t size) {
    brec_t key = {.base = base, .size = 1};
    pthread_mutex_lock(&b_lock);
    brec_t **found = tfind(&key, &b_root, b_cmp);
    if (!found || (*found)->base != base || (*found)->size != size) {
        pthread_mutex_unlock(&b_lock);
        return -1;
    }
    brec_t *r = *found;
    tdelete(r, &b_root, b_cmp);
    bpool_t *pool = r->pool;
    if (r->prev)
        r->prev->next = r->next;
    else
        pool->head = r->next;
    if (r->next) r->next->prev = r->prev;
    pool->count--;
    pthread_mutex_unlock(&b_lock);
    free(r);
    return 0;
}

static int b_lookup(uintptr_t a, hm_tracker_entry_t *out) {
    brec_t key = {.base = a, .size = 1};
    pthread_mutex_lock(&b_lock);
    brec_t **found = tfind(&key, &b_root, b_cmp);
    if (found) {
        const brec_t *r = *found;
        out->base = r->base;
        out->size = r->size;
        out->pool = r->pool;
        out->provider = r->provider;
        out->id = r->id;
        out->flags = r->flags;
    }
    pthread_mutex_unlock(&b_lock);
    return found != NULL;
}

static void b_drain(bpool_t *pool) {
    pthread_mutex_lock(&b_lock);
    brec_t *r = pool->head;
    pool->head = NULL;
    pool->count = 0;
    while (r) {
        brec_t *next = r->next;
        tdelete(r, &b_root, b_cmp);
        free(r);
        r = next;
    }
    pthread_mutex_unlock(&b_lock);
}

/* ------------------------------------------------------------------------
 * Populations: the same N ranges in both structures, grown step by step. */
static hm_tracker_index_t t_pop_idx;
static bpool_t b_pop_pool;
static size_t pop_n;
static char pop_pool_tag;

static int grow_population(size_t n) {
    for (size_t i = pop_n; i < n; i++) {
        uintptr_t base = POP_BASE + (uintptr_t)i * POP_SIZE;
        if (hm__tracker_insert(&t_pop_idx, (hm_pool_t *)(void *)&pop_pool_tag, NULL, base,
                               POP_SIZE, 0, NULL) != HM_SUCCESS)
            return -1;
        if (b_insert(&b_pop_pool, base, POP_SIZE)) return -1;
    }
    pop_n = n;
    return 0;
}

/* ------------------------------------------------------------------------
 * Lookup workloads. arg: the address list. */
typedef struct addrs {
    uintptr_t *a;
    size_t n;
} addrs_t;

static int t_lookup_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    const addrs_t *as = arg;
    size_t j = 0;
    for (uint64_t i = 0; i < iters; i++) {
        hm_tracker_entry_t e;
        if (!hm__tracker_lookup((const void *)as->a[j], &e)) return 1;
        hm_bench_escape(e.pool);
        if (++j == as->n) j = 0;
    }
    return 0;
}

static int b_lookup_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    const addrs_t *as = arg;
    size_t j = 0;
    for (uint64_t i = 0; i < iters; i++) {
        hm_tracker_entry_t e;
        if (!b_lookup(as->a[j], &e)) return 1;
        hm_bench_escape(e.pool);
        if (++j == as->n) j = 0;
    }
    return 0;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void make_hit(addrs_t *as) {
    as->n = 8;
    for (size_t i = 0; i < 8; i++) /* 8 ranges of one 2 MiB region */
        as->a[i] = POP_BASE + (uintptr_t)(i * 3) * POP_SIZE + 100 * i;
}

static void make_miss(addrs_t *as, size_t n, size_t set) {
    size_t regions = (n * POP_SIZE + (2u << 20) - 1) >> 21;
    size_t k = regions < set ? regions : set;
    as->n = k;
    for (size_t i = 0; i < k; i++) {
        size_t region = i * regions / k;
        uintptr_t a = POP_BASE + ((uintptr_t)region << 21) + (rnd() % (2u << 20));
        if (a >= POP_BASE + n * POP_SIZE) a = POP_BASE + (uintptr_t)region * (2u << 20);
        as->a[i] = a;
    }
}

static void make_random(addrs_t *as, size_t n, size_t count) {
    as->n = count;
    for (size_t i = 0; i < count; i++)
        as->a[i] = POP_BASE + (rnd() % n) * POP_SIZE + rnd() % POP_SIZE;
}

/* ------------------------------------------------------------------------
 * insert+remove with 1 or 2 threads, each on its own pool. */
#define RING 256
typedef struct churn_arg {
    int threads;
} churn_arg_t;

typedef struct churn_thread {
    int impl; /* 0 tracker, 1 baseline */
    int t;
    uint64_t iters;
    int failed;
    hm_tracker_index_t idx;
    bpool_t bpool;
    uint64_t counter;
} churn_thread_t;

static uintptr_t churn_addr(const churn_thread_t *ct, uint64_t k) {
    return CHURN_BASE + ((uintptr_t)ct->t << 36) + (uintptr_t)(k % 65536) * POP_SIZE;
}

static void *churn_main(void *arg) {
    churn_thread_t *ct = arg;
    const size_t size = 48u << 10;
    for (uint64_t i = 0; i < ct->iters; i++) {
        uint64_t k = ct->counter++;
        if (k >= RING) { /* remove the oldest */
            uintptr_t old = churn_addr(ct, k - RING);
            int bad = ct->impl ? b_remove(old, size) : (hm__tracker_remove(old, size) != 0);
            if (bad) ct->failed = 1;
        }
        uintptr_t a = churn_addr(ct, k);
        int bad = ct->impl ? b_insert(&ct->bpool, a, size)
                           : (hm__tracker_insert(&ct->idx, (hm_pool_t *)(void *)ct, NULL, a, size,
                                                 0, NULL) != HM_SUCCESS);
        if (bad) ct->failed = 1;
    }
    return NULL;
}

static int churn_setup(int impl, const void *arg, void **ctx) {
    (void)arg;
    churn_thread_t *churn = calloc(2, sizeof *churn);
    if (!churn) return 1;
    for (int t = 0; t < 2; t++) {
        memset(&churn[t], 0, sizeof churn[t]);
        churn[t].impl = impl;
        churn[t].t = t;
        hm__tracker_index_init(&churn[t].idx);
    }
    *ctx = churn;
    return 0;
}
static int t_churn_setup(const void *arg, void **ctx) { return churn_setup(0, arg, ctx); }
static int b_churn_setup(const void *arg, void **ctx) { return churn_setup(1, arg, ctx); }

static int churn_run(void *ctx, const void *arg, uint64_t iters) {
    churn_thread_t *churn = ctx;
    int threads = ((const churn_arg_t *)arg)->threads;
    pthread_t th[2];
    for (int t = 0; t < threads; t++) {
        churn[t].iters = iters;
        if (threads == 1) {
            churn_main(&churn[0]);
            break;
        }
        if (pthread_create(&th[t], NULL, churn_main, &churn[t])) return 1;
    }
    if (threads > 1)
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < threads; t++)
        if (churn[t].failed) return 1;
    return 0;
}

static void churn_teardown(void *ctx) {
    churn_thread_t *churn = ctx;
    for (int t = 0; t < 2; t++) {
        if (churn[t].impl) b_drain(&churn[t].bpool);
        hm__tracker_index_drain(&churn[t].idx, NULL, NULL);
        hm__tracker_index_fini(&churn[t].idx);
    }
    free(churn);
}

/* ------------------------------------------------------------------------
 * Destroy (drain) of a pool of 1000 ranges. */
#define DRAIN_N 1000
static char drain_pool_tag;

static int t_fill_drain(void) {
    hm_tracker_index_t idx;
    hm__tracker_index_init(&idx);
    for (int i = 0; i < DRAIN_N; i++)
        if (hm__tracker_insert(&idx, (hm_pool_t *)(void *)&drain_pool_tag, NULL,
                               DRAIN_BASE + (uintptr_t)i * POP_SIZE, POP_SIZE, 0,
                               NULL) != HM_SUCCESS)
            return 1;
    hm__tracker_index_drain(&idx, NULL, NULL);
    hm__tracker_index_fini(&idx);
    return 0;
}

static int b_fill_drain(void) {
    bpool_t pool = {0};
    for (int i = 0; i < DRAIN_N; i++)
        if (b_insert(&pool, DRAIN_BASE + (uintptr_t)i * POP_SIZE, POP_SIZE)) return 1;
    b_drain(&pool);
    return 0;
}

static int t_drain_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    (void)arg;
    for (uint64_t i = 0; i < iters; i++)
        if (t_fill_drain()) return 1;
    return 0;
}
static int b_drain_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    (void)arg;
    for (uint64_t i = 0; i < iters; i++)
        if (b_fill_drain()) return 1;
    return 0;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median time of the drain alone (fill untimed), over `reps` pools. */
static double drain_only_ns(int impl, int reps) {
    double t[64];
    if (reps > 64) reps = 64;
    for (int k = 0; k < reps; k++) {
        hm_tracker_index_t idx;
        bpool_t pool = {0};
        hm__tracker_index_init(&idx);
        for (int i = 0; i < DRAIN_N; i++) {
            uintptr_t a = DRAIN_BASE + (uintptr_t)i * POP_SIZE;
            if (impl)
                b_insert(&pool, a, POP_SIZE);
            else
                hm__tracker_insert(&idx, (hm_pool_t *)(void *)&drain_pool_tag, NULL, a, POP_SIZE, 0,
                                   NULL);
        }
        double t0 = now_ns();
        if (impl)
            b_drain(&pool);
        else
            hm__tracker_index_drain(&idx, NULL, NULL);
        t[k] = now_ns() - t0;
        hm__tracker_index_fini(&idx);
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--quick")) quick = 1;
    int code = 0;
    hm_bench_t *b = hm_bench_create("tracker", &argc, argv, &code);
    if (!b) return code;
    hm__tracker_index_init(&t_pop_idx);

    const hm_bench_impl_t t_lookup = {.name = "tracker", .run = t_lookup_run};
    const hm_bench_impl_t b_lookup_impl = {.name = "mutex-rbtree", .run = b_lookup_run};
    const hm_bench_impl_t t_churn = {.name = "tracker", .setup = t_churn_setup, .run = churn_run,
                                     .teardown = churn_teardown};
    const hm_bench_impl_t b_churn = {.name = "mutex-rbtree", .setup = b_churn_setup,
                                     .run = churn_run, .teardown = churn_teardown};
    const hm_bench_impl_t t_drain = {.name = "tracker", .run = t_drain_run};
    const hm_bench_impl_t b_drain_impl = {.name = "mutex-rbtree", .run = b_drain_run};

    static uintptr_t buf[1 << 16];
    addrs_t as = {.a = buf};
    double drain_t[2][2]; /* [others: 0, 1e6][impl] */
    int reps = quick ? 3 : 31;

    /* warm-up (first-touch page faults of metadata, urcu registration) so
     * that others=0 is not measured cold */
    for (int i = 0; i < 3; i++)
        if (t_fill_drain() || b_fill_drain()) return 1;
    /* destroy with no other records */
    hm_bench_case(b, "destroy-1000 others=0", NULL, 1, &t_drain, &b_drain_impl, 1);
    drain_t[0][0] = drain_only_ns(0, reps);
    drain_t[0][1] = drain_only_ns(1, reps);

    size_t max_n = quick ? 10000 : 1000000;
    char name[64];
    for (size_t n = 1000; n <= max_n; n *= 10) {
        if (grow_population(n)) {
            fprintf(stderr, "bench_tracker: could not build a population of %zu\n", n);
            return 1;
        }
        make_hit(&as);
        snprintf(name, sizeof name, "lookup-hit N=%zu", n);
        hm_bench_case(b, name, &as, 1, &t_lookup, &b_lookup_impl, 1);
        make_miss(&as, n, 32);
        snprintf(name, sizeof name, "lookup-miss N=%zu", n);
        hm_bench_case(b, name, &as, 1, &t_lookup, &b_lookup_impl, 1);
        make_miss(&as, n, MISS_SET);
        snprintf(name, sizeof name, "lookup-miss4k N=%zu", n);
        hm_bench_case(b, name, &as, 1, &t_lookup, &b_lookup_impl, 1);
        make_random(&as, n, sizeof buf / sizeof buf[0]);
        snprintf(name, sizeof name, "lookup-random N=%zu", n);
        hm_bench_case(b, name, &as, 1, &t_lookup, &b_lookup_impl, 1);
        /* insert and remove with N other ranges live (target: flat in N) */
        static const churn_arg_t one_n = {1};
        snprintf(name, sizeof name, "insert+remove N=%zu", n);
        hm_bench_case(b, name, &one_n, 2, &t_churn, &b_churn, 1);
    }

    static const churn_arg_t one = {1}, two = {2};
    hm_bench_case(b, "insert+remove 1 thread", &one, 2, &t_churn, &b_churn, 1);
    hm_bench_set_threads(b, 2);
    hm_bench_case(b, "insert+remove 2 threads", &two, 4, &t_churn, &b_churn, 1);
    hm_bench_set_threads(b, 1);

    snprintf(name, sizeof name, "destroy-1000 others=%zu", pop_n);
    hm_bench_case(b, name, NULL, 1, &t_drain, &b_drain_impl, 1);
    drain_t[1][0] = drain_only_ns(0, reps);
    drain_t[1][1] = drain_only_ns(1, reps);

    printf("\ndrain alone of a 1000-range pool (median of %d): others=0 / others=%zu\n", reps,
           pop_n);
    printf("  tracker       %9.1f us / %9.1f us  ratio %.2f\n", drain_t[0][0] / 1e3,
           drain_t[1][0] / 1e3, drain_t[1][0] / drain_t[0][0]);
    printf("  mutex-rbtree  %9.1f us / %9.1f us  ratio %.2f\n\n", drain_t[0][1] / 1e3,
           drain_t[1][1] / 1e3, drain_t[1][1] / drain_t[0][1]);

    hm__tracker_index_drain(&t_pop_idx, NULL, NULL);
    hm__tracker_index_fini(&t_pop_idx);
    b_drain(&b_pop_pool);
    return hm_bench_finish(b);
}
