/* hetmem benchmark: the native pool against malloc, in one run.
 * SPDX-License-Identifier: MIT
 *
 * Implementations (the same workload code, only the alloc/free calls differ):
 *   native        hm_pool_malloc/hm_pool_free on a native pool over the OS
 *                 provider (tracked: hm_pool_free checks ownership through
 *                 the tracker, as the API promises).
 *   native-untr   the same pool created with HM_POOL_FLAG_NO_TRACKING: the
 *                 pool's own cost, without the tracker lookup.
 *   native-mutex  (remote cases) remote frees through a mutex-protected list
 *                 per heap instead of the wait-free queue.
 *   native-nobatch (remote cases) the wait-free queue, one free per batch.
 *   native-mutex-nobatch (remote cases) the mutex list, one free per batch:
 *                 with native-nobatch, what the queue buys per remote free.
 *   malloc        malloc/free of this process: glibc, or whatever LD_PRELOAD
 *                 put in front (the name shown is the preloaded library's):
 *                   LD_PRELOAD=libjemalloc.so.2 ./bench_native
 *                   LD_PRELOAD=libmimalloc.so.2 ./bench_native
 *                   LD_PRELOAD=libtcmalloc_minimal.so.4 ./bench_native
 *
 * Cases (one op = one allocation and its free):
 *   pairs S       malloc immediately followed by free, sizes S (cycled from a
 *                 precomputed random list)
 *   random S      10,000 live slots; each op frees a random slot and
 *                 allocates a new block of a random size S into it
 *   remote 64B    one thread allocates 64-byte objects, another frees them
 *                 (handed through a single-producer/single-consumer ring)
 *   xmalloc 2+2   2 producers allocate batches of 4096 objects (16..512 B),
 *                 2 consumers free whole batches (the xmalloc-test pattern)
 * Memory is not touched beyond one byte per block (the allocator is timed,
 * not page faults).
 *
 * Peak RSS: after the timed cases, each remote case runs once more per
 * implementation in a fresh process (this program, re-executed with
 * --rss-child, same environment, so the same LD_PRELOAD), for --rss N
 * objects (default 2,000,000; 0: skip); the table shows that process's
 * VmHWM (/proc/self/status) after set-up and at the end of the run. */
#include "harness.h"

#include <hetmem/hetmem.h>

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HM_ALIGN64 __attribute__((aligned(64)))
#define SLOTS 10000
#define NSIZES 4096 /* power of two */

typedef enum kind { K_MALLOC, K_POOL } kind_t;

typedef struct impl_ctx {
    kind_t kind;
    hm_pool_t *pool;
    void **slot; /* random cases: the live slots (filled in setup) */
} impl_ctx_t;

typedef struct case_arg {
    int random;    /* needs SLOTS live blocks, made in setup */
    size_t lo, hi; /* size range */
    uint32_t sizes[NSIZES];
    uint32_t slots[NSIZES]; /* random slot indices */
} case_arg_t;

static inline void *xalloc(impl_ctx_t *c, size_t n) {
    return c->kind == K_MALLOC ? malloc(n) : hm_pool_malloc(c->pool, n);
}
static inline void xfree(impl_ctx_t *c, void *p) {
    if (c->kind == K_MALLOC) free(p);
    else hm_pool_free(c->pool, p);
}

/* ---- set-up of each implementation ---- */

static int make_pool(impl_ctx_t *c, uint32_t flags, hm_native_remote_queue_t q, unsigned batch) {
    hm_provider_t *prov;
    if (hm_os_provider_create(NULL, &prov) != HM_SUCCESS) return 1;
    hm_native_params_t *np;
    if (hm_native_params_create(&np) != HM_SUCCESS) return 1;
    hm_native_params_set_remote_queue(np, q);
    hm_native_params_set_remote_batch(np, batch);
    hm_result_t r = hm_native_pool_create(prov, np, flags | HM_POOL_FLAG_OWN_PROVIDER, &c->pool);
    hm_native_params_destroy(np);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_native: pool: %s\n", hm_result_string(r));
        hm_provider_destroy(prov);
        return 1;
    }
    c->kind = K_POOL;
    return 0;
}

static void teardown(void *ctx);

static int setup_generic(const void *arg, void **ctx, kind_t kind, uint32_t flags,
                         hm_native_remote_queue_t q, unsigned batch) {
    const case_arg_t *a = arg;
    impl_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->kind = kind;
    if (kind == K_POOL && make_pool(c, flags, q, batch)) {
        free(c);
        return 1;
    }
    *ctx = c;
    if (a->random) {
        c->slot = calloc(SLOTS, sizeof(void *));
        for (int i = 0; c->slot && i < SLOTS; i++) {
            c->slot[i] = xalloc(c, a->sizes[i & (NSIZES - 1)]);
            if (!c->slot[i]) break;
            *(char *)c->slot[i] = 1;
        }
        if (!c->slot || !c->slot[SLOTS - 1]) {
            teardown(c);
            return 1;
        }
    }
    return 0;
}

static int setup_native(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_WFCQ, 126);
}
static int setup_untracked(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, HM_POOL_FLAG_NO_TRACKING, HM_NATIVE_QUEUE_WFCQ, 126);
}
static int setup_mutex(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_MUTEX, 126);
}
static int setup_nobatch(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_WFCQ, 1);
}
static int setup_mutex_nobatch(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_MUTEX, 1);
}
static int setup_malloc(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_MALLOC, 0, HM_NATIVE_QUEUE_WFCQ, 126);
}

static void teardown(void *ctx) {
    impl_ctx_t *c = ctx;
    if (c->slot) {
        for (int i = 0; i < SLOTS; i++)
            if (c->slot[i]) xfree(c, c->slot[i]);
        free(c->slot);
    }
    if (c->kind == K_POOL) hm_pool_destroy(c->pool);
    free(c);
}

/* ---- local workloads ---- */

static int run_pairs(void *ctx, const void *arg, uint64_t iters) {
    impl_ctx_t *c = ctx;
    const case_arg_t *a = arg;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = xalloc(c, a->sizes[i & (NSIZES - 1)]);
        if (!p) return 1;
        hm_bench_escape(p);
        xfree(c, p);
    }
    return 0;
}

static int run_random(void *ctx, const void *arg, uint64_t iters) {
    impl_ctx_t *c = ctx;
    const case_arg_t *a = arg;
    void **slot = c->slot;
    for (uint64_t i = 0; i < iters; i++) {
        uint32_t k = a->slots[i & (NSIZES - 1)] + (uint32_t)(i >> 12) * 7919u;
        k %= SLOTS;
        xfree(c, slot[k]);
        slot[k] = xalloc(c, a->sizes[(i * 31) & (NSIZES - 1)]);
        if (!slot[k]) return 1;
        *(char *)slot[k] = 1;
    }
    return 0;
}

/* ---- remote: one allocating thread, one freeing thread ---- */

#define RING 1024
typedef struct ring {
    _Atomic uint64_t head HM_ALIGN64; /* written by the consumer */
    _Atomic uint64_t tail HM_ALIGN64; /* written by the producer */
    void *slot[RING] HM_ALIGN64;
} ring_t;

typedef struct remote_run {
    impl_ctx_t *c;
    ring_t *r;
    uint64_t n;
} remote_run_t;

static void *remote_consumer(void *arg) {
    remote_run_t *rr = arg;
    ring_t *r = rr->r;
    uint64_t h = 0;
    while (h < rr->n) {
        uint64_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
        while (h < t) {
            xfree(rr->c, r->slot[h & (RING - 1)]);
            h++;
        }
        atomic_store_explicit(&r->head, h, memory_order_release);
        if (h == t) sched_yield();
    }
    return NULL;
}

static int run_remote(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    static ring_t ring;
    atomic_store(&ring.head, 0);
    atomic_store(&ring.tail, 0);
    remote_run_t rr = {ctx, &ring, iters};
    pthread_t t;
    if (pthread_create(&t, NULL, remote_consumer, &rr)) return 1;
    impl_ctx_t *c = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        while (i - atomic_load_explicit(&ring.head, memory_order_acquire) >= RING)
            sched_yield();
        void *p = xalloc(c, 64);
        if (!p) abort(); /* the consumer waits for every object */
        *(char *)p = 1;
        ring.slot[i & (RING - 1)] = p;
        atomic_store_explicit(&ring.tail, i + 1, memory_order_release);
    }
    pthread_join(t, NULL);
    return 0;
}

/* ---- xmalloc-test pattern: 2 producers, 2 consumers, batches of 4096 ---- */

#define XBATCH 4096
typedef struct xbatch {
    struct xbatch *next;
    void *p[XBATCH];
} xbatch_t;

typedef struct xrun {
    impl_ctx_t *c;
    const case_arg_t *a;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    xbatch_t *full; /* batches waiting for a consumer */
    int nfull;
    uint64_t batches_per_producer;
    int producers_left;
} xrun_t;

static void *x_producer(void *arg) {
    xrun_t *x = arg;
    for (uint64_t b = 0; b < x->batches_per_producer; b++) {
        xbatch_t *bt = malloc(sizeof(*bt)); /* harness bookkeeping, same for all */
        if (!bt) abort();
        for (int i = 0; i < XBATCH; i++) {
            bt->p[i] = xalloc(x->c, x->a->sizes[(b * XBATCH + (uint64_t)i) & (NSIZES - 1)]);
            if (!bt->p[i]) abort();
            *(char *)bt->p[i] = 1;
        }
        pthread_mutex_lock(&x->lock);
        while (x->nfull >= 8) pthread_cond_wait(&x->cv, &x->lock); /* bound the live memory */
        bt->next = x->full;
        x->full = bt;
        x->nfull++;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->lock);
    }
    pthread_mutex_lock(&x->lock);
    x->producers_left--;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

static void *x_consumer(void *arg) {
    xrun_t *x = arg;
    for (;;) {
        pthread_mutex_lock(&x->lock);
        while (!x->full && x->producers_left) pthread_cond_wait(&x->cv, &x->lock);
        xbatch_t *bt = x->full;
        if (bt) {
            x->full = bt->next;
            x->nfull--;
            pthread_cond_broadcast(&x->cv);
        }
        pthread_mutex_unlock(&x->lock);
        if (!bt) return NULL;
        for (int i = 0; i < XBATCH; i++) xfree(x->c, bt->p[i]);
        free(bt);
    }
}

static int run_xmalloc(void *ctx, const void *arg, uint64_t iters) {
    xrun_t x = {.c = ctx, .a = arg, .producers_left = 2};
    x.batches_per_producer = (iters + 2 * XBATCH - 1) / (2 * XBATCH);
    pthread_mutex_init(&x.lock, NULL);
    pthread_cond_init(&x.cv, NULL);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        if (pthread_create(&t[i], NULL, i < 2 ? x_producer : x_consumer, &x)) abort();
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    pthread_mutex_destroy(&x.lock);
    pthread_cond_destroy(&x.cv);
    return 0;
}

/* ---- main ---- */

static uint64_t rnd(uint64_t *s) { /* xorshift64* (Vigna 2016) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static void fill_arg(case_arg_t *a, int random, size_t lo, size_t hi, uint64_t seed) {
    a->random = random;
    a->lo = lo;
    a->hi = hi;
    for (int i = 0; i < NSIZES; i++) {
        a->sizes[i] = (uint32_t)(lo + (hi > lo ? rnd(&seed) % (hi - lo + 1) : 0));
        a->slots[i] = (uint32_t)(rnd(&seed) % SLOTS);
    }
}

static const char *malloc_name(void) {
    static char name[40];
    const char *pre = getenv("LD_PRELOAD");
    if (!pre || !*pre) return "glibc";
    const char *base = strrchr(pre, '/');
    base = base ? base + 1 : pre;
    snprintf(name, sizeof name, "%.*s", (int)strcspn(base, ". :"), base);
    return name;
}

/* ---- peak RSS, one fresh process per run ---- */

static long vm_kb(const char *field) { /* from /proc/self/status, -1 if absent */
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') kb = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return kb;
}

typedef struct rss_impl {
    const char *name;
    int (*setup)(const void *, void **);
} rss_impl_t;

static const rss_impl_t rss_impls[] = {
    {"native", setup_native},        {"native-mutex", setup_mutex},
    {"native-nobatch", setup_nobatch}, {"native-mutex-nobatch", setup_mutex_nobatch},
    {"native-untr", setup_untracked},
    {"malloc", setup_malloc},
};
static const char *const rss_cases[] = {"remote", "xmalloc"};

/* --rss-child CASE IMPL N: run once, print "start_kb peak_kb". */
static int rss_child(const char *cs, const char *impl, const char *count) {
    static case_arg_t arg;
    uint64_t n = strtoull(count, NULL, 10);
    int remote = !strcmp(cs, "remote");
    if (remote) fill_arg(&arg, 0, 64, 64, 7);
    else fill_arg(&arg, 0, 16, 512, 9);
    for (size_t i = 0; i < sizeof rss_impls / sizeof rss_impls[0]; i++) {
        if (strcmp(rss_impls[i].name, impl)) continue;
        void *ctx;
        if (rss_impls[i].setup(&arg, &ctx)) return 1;
        long start = vm_kb("VmHWM");
        int r = remote ? run_remote(ctx, &arg, n) : run_xmalloc(ctx, &arg, n);
        long peak = vm_kb("VmHWM");
        teardown(ctx);
        printf("%ld %ld\n", start, peak);
        return r;
    }
    return 2;
}

static void rss_table(uint64_t n) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return;
    self[len] = 0;
    printf("\npeak RSS: one fresh process per run, %llu objects (VmHWM, MiB: after set-up, "
           "at the end)\n", (unsigned long long)n);
    printf("%-17s %-20s %8s %8s\n", "case", "impl", "set-up", "peak");
    for (size_t c = 0; c < 2; c++) {
        for (size_t i = 0; i < sizeof rss_impls / sizeof rss_impls[0]; i++) {
            char cmd[PATH_MAX + 128];
            snprintf(cmd, sizeof cmd, "'%s' --rss-child %s %s %llu", self, rss_cases[c],
                     rss_impls[i].name, (unsigned long long)n);
            FILE *f = popen(cmd, "r");
            long start = -1, peak = -1;
            if (f) {
                if (fscanf(f, "%ld %ld", &start, &peak) != 2) start = peak = -1;
                pclose(f);
            }
            const char *name = strcmp(rss_impls[i].name, "malloc") ? rss_impls[i].name
                                                                     : malloc_name();
            printf("%-17s %-20s %8.1f %8.1f\n",
                   i ? "" : (c ? "xmalloc 2+2" : "remote 64B 1->1"), name, start / 1024.0,
                   peak / 1024.0);
        }
    }
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--rss-child")) return rss_child(argv[2], argv[3], argv[4]);
    uint64_t rss_n = 2000000;
    int quick = 0;
    for (int i = 1; i < argc; i++) { /* take --rss N out before the harness sees it */
        quick |= !strcmp(argv[i], "--quick");
        if (!strcmp(argv[i], "--rss") && i + 1 < argc) {
            rss_n = strtoull(argv[i + 1], NULL, 10);
            for (int k = i; k + 2 <= argc; k++) argv[k] = argv[k + 2];
            argc -= 2;
            i--;
        }
    }
    if (quick && rss_n > 20000) rss_n = 20000;
    int rc;
    hm_bench_t *b = hm_bench_create("native", &argc, argv, &rc);
    if (!b) return rc;
    if (argc > 1) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[1]);
        hm_bench_finish(b);
        return 2;
    }
    static hm_bench_impl_t local_subject = {"native", setup_native, NULL, teardown};
    static hm_bench_impl_t local_base[] = {
        {"native-untr", setup_untracked, NULL, teardown},
        {NULL, setup_malloc, NULL, teardown},
    };
    static hm_bench_impl_t remote_subject = {"native", setup_native, NULL, teardown};
    static hm_bench_impl_t remote_base[] = {
        {"native-mutex", setup_mutex, NULL, teardown},
        {"native-nobatch", setup_nobatch, NULL, teardown},
        {"native-mutex-nobatch", setup_mutex_nobatch, NULL, teardown},
        {"native-untr", setup_untracked, NULL, teardown},
        {NULL, setup_malloc, NULL, teardown},
    };
    local_base[1].name = malloc_name();
    remote_base[4].name = malloc_name();

    static case_arg_t arg;
    static const struct {
        const char *name;
        size_t lo, hi;
        int (*run)(void *, const void *, uint64_t);
    } local[] = {
        {"pairs 8-128", 8, 128, run_pairs},     {"pairs 8-4096", 8, 4096, run_pairs},
        {"pairs 4096", 4096, 4096, run_pairs},  {"random 8-128", 8, 128, run_random},
        {"random 8-4096", 8, 4096, run_random}, {"random 4096", 4096, 4096, run_random},
    };
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
        fill_arg(&arg, local[i].run == run_random, local[i].lo, local[i].hi, 42 + i);
        local_subject.run = local[i].run;
        for (size_t k = 0; k < 2; k++) local_base[k].run = local[i].run;
        hm_bench_case(b, local[i].name, &arg, 1, &local_subject, local_base, 2);
    }
    fill_arg(&arg, 0, 64, 64, 7);
    remote_subject.run = run_remote;
    for (size_t k = 0; k < 5; k++) remote_base[k].run = run_remote;
    hm_bench_case(b, "remote 64B 1->1", &arg, 1, &remote_subject, remote_base, 5);
    fill_arg(&arg, 0, 16, 512, 9);
    remote_subject.run = run_xmalloc;
    for (size_t k = 0; k < 5; k++) remote_base[k].run = run_xmalloc;
    hm_bench_case(b, "xmalloc 2+2", &arg, 1, &remote_subject, remote_base, 5);
    rc = hm_bench_finish(b);
    if (rss_n) rss_table(rss_n);
    return rc;
}
