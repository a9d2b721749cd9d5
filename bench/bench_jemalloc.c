/* hetmem benchmark: the jemalloc pool against jemalloc itself, in one run.
 * SPDX-License-Identifier: MIT
 *
 * The workloads are those of bench_native (issue 4), so the figures compare
 * directly. Implementations (the same workload code, only alloc/free differ):
 *   je-pool       hm_pool_malloc/hm_pool_free on a jemalloc pool over the OS
 *                 provider (tracked: hm_pool_free checks ownership through the
 *                 tracker, as the API promises).
 *   je-pool-untr  the same pool with HM_POOL_FLAG_NO_TRACKING: the pool's own
 *                 cost without the tracker lookup.
 *   je-pool-notc  tracked, without thread caches (every call takes the arena's
 *                 locks, as UMF's jemalloc pool does).
 *   malloc        malloc/free of this process, named after the preloaded
 *                 library. Unless --no-reexec is given (or the build is
 *                 sanitized), the program re-executes itself once with
 *                 LD_PRELOAD=libjemalloc.so.2 (Debian's libjemalloc2) when
 *                 that library exists and nothing is preloaded yet, so the
 *                 baseline is plain jemalloc (malloc fast path, automatic
 *                 tcache and arena).
 *
 * Cases (one op = one allocation and its free):
 *   pairs S       malloc immediately followed by free, sizes S
 *   random S      10,000 live slots; each op frees a random slot and
 *                 allocates a block of a random size S into it
 *   remote 64B    one thread allocates 64-byte objects, another frees them
 *   xmalloc 2+2   2 producers allocate batches of 4096 objects (16..512 B),
 *                 2 consumers free whole batches (the xmalloc-test pattern)
 * Target (issue 5): je-pool within 1.3x of plain jemalloc on the local mixes. */
#include "harness.h"

#include <hetmem/hetmem.h>
#include <hetmem/pools/jemalloc.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HM_ALIGN64 __attribute__((aligned(64)))
#define SLOTS 10000
#define NSIZES 4096 /* power of two */
#define JEMALLOC_SO "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"

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

static int make_pool(impl_ctx_t *c, uint32_t flags, bool tcache) {
    hm_provider_t *prov;
    if (hm_os_provider_create(NULL, &prov) != HM_SUCCESS) return 1;
    hm_jemalloc_params_t *jp;
    if (hm_jemalloc_params_create(&jp) != HM_SUCCESS) return 1;
    hm_jemalloc_params_set_tcache(jp, tcache);
    hm_result_t r = hm_jemalloc_pool_create(prov, jp, flags | HM_POOL_FLAG_OWN_PROVIDER, &c->pool);
    hm_jemalloc_params_destroy(jp);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_jemalloc: pool: %s\n", hm_result_string(r));
        hm_provider_destroy(prov);
        return 1;
    }
    c->kind = K_POOL;
    return 0;
}

static void teardown(void *ctx);

static int setup_generic(const void *arg, void **ctx, kind_t kind, uint32_t flags, bool tcache) {
    const case_arg_t *a = arg;
    impl_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->kind = kind;
    if (kind == K_POOL && make_pool(c, flags, tcache)) {
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

static int setup_pool(const void *a, void **ctx) { return setup_generic(a, ctx, K_POOL, 0, true); }
static int setup_untracked(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, HM_POOL_FLAG_NO_TRACKING, true);
}
static int setup_notc(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, false);
}
static int setup_malloc(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_MALLOC, 0, true);
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

/* ---- local workloads (as in bench_native.c) ---- */

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

/* Re-execute once under Debian's jemalloc so that "malloc" is plain jemalloc. */
static void maybe_reexec(int argc, char **argv) {
#if defined(HM_SANITIZE_BUILD)
    (void)argc, (void)argv; /* a sanitizer runtime must come first: no preload */
#else
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--no-reexec")) return;
    const char *pre = getenv("LD_PRELOAD");
    if ((pre && *pre) || getenv("HM_BENCH_REEXECED") || access(JEMALLOC_SO, R_OK) != 0) return;
    setenv("LD_PRELOAD", JEMALLOC_SO, 1);
    setenv("HM_BENCH_REEXECED", "1", 1);
    execv("/proc/self/exe", argv);
    unsetenv("LD_PRELOAD"); /* exec failed: go on with this process's malloc */
#endif
}

int main(int argc, char **argv) {
    maybe_reexec(argc, argv);
    for (int i = 1; i < argc; i++) /* drop our own option before the harness sees it */
        if (!strcmp(argv[i], "--no-reexec")) {
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof(*argv));
            argc--;
            i--;
        }
    int rc;
    hm_bench_t *b = hm_bench_create("jemalloc", &argc, argv, &rc);
    if (!b) return rc;
    if (argc > 1) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[1]);
        hm_bench_finish(b);
        return 2;
    }
    static hm_bench_impl_t subject = {"je-pool", setup_pool, NULL, teardown};
    static hm_bench_impl_t base[] = {
        {"je-pool-untr", setup_untracked, NULL, teardown},
        {"je-pool-notc", setup_notc, NULL, teardown},
        {NULL, setup_malloc, NULL, teardown},
    };
    enum { NBASE = sizeof(base) / sizeof(base[0]) };
    base[NBASE - 1].name = malloc_name();

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
        subject.run = local[i].run;
        for (size_t k = 0; k < NBASE; k++) base[k].run = local[i].run;
        hm_bench_case(b, local[i].name, &arg, 1, &subject, base, NBASE);
    }
    fill_arg(&arg, 0, 64, 64, 7);
    subject.run = run_remote;
    for (size_t k = 0; k < NBASE; k++) base[k].run = run_remote;
    hm_bench_case(b, "remote 64B 1->1", &arg, 1, &subject, base, NBASE);
    fill_arg(&arg, 0, 16, 512, 9);
    subject.run = run_xmalloc;
    for (size_t k = 0; k < NBASE; k++) base[k].run = run_xmalloc;
    hm_bench_case(b, "xmalloc 2+2", &arg, 1, &subject, base, NBASE);
    return hm_bench_finish(b);
}
