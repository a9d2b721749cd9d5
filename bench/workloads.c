/* Allocation workloads shared by bench_native and bench_jemalloc (see
 * workloads.h): the local, remote and xmalloc-test cases, run the same way
 * against malloc or any pool.
 * SPDX-License-Identifier: MIT */
#include "workloads.h"

#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define HM_ALIGN64 __attribute__((aligned(64)))

/* ---- set-up and teardown of an implementation context ---- */

int wl_setup_finish(const case_arg_t *a, impl_ctx_t *c, void **ctx) {
    *ctx = c;
    if (a->random) {
        c->slot = calloc(SLOTS, sizeof(void *));
        for (int i = 0; c->slot && i < SLOTS; i++) {
            c->slot[i] = xalloc(c, a->sizes[i & (NSIZES - 1)]);
            if (!c->slot[i]) break;
            *(char *)c->slot[i] = 1;
        }
        if (!c->slot || !c->slot[SLOTS - 1]) {
            wl_teardown(c);
            return 1;
        }
    }
    return 0;
}

void wl_teardown(void *ctx) {
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

int wl_run_pairs(void *ctx, const void *arg, uint64_t iters) {
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

int wl_run_random(void *ctx, const void *arg, uint64_t iters) {
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
    /* For the trace (HM_BENCH_TRACE): the consumer's waits, CPU time and
     * when it started and finished its loop (CLOCK_MONOTONIC, s). */
    uint64_t waits;
    double cpu, t_start, t_done;
} remote_run_t;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Traced (hm_bench_trace_on), the remote workloads print one line per run
 * and per consumer on stderr (the harness prints one per timed run). */
static int wl_trace(void) {
    static int v = -1;
    if (v < 0) v = hm_bench_trace_on();
    return v;
}

static void *remote_consumer(void *arg) {
    remote_run_t *rr = arg;
    rr->t_start = clock_s(CLOCK_MONOTONIC);
    ring_t *r = rr->r;
    int ring_only = rr->c->kind == K_RING;
    uint64_t h = 0, waits = 0;
    while (h < rr->n) {
        uint64_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
        while (h < t) {
            void *p = r->slot[h & (RING - 1)];
            if (ring_only) hm_bench_escape(p);
            else xfree(rr->c, p);
            h++;
        }
        atomic_store_explicit(&r->head, h, memory_order_release);
        if (h == t) {
            sched_yield();
            waits++;
        }
    }
    rr->waits = waits;
    rr->t_done = clock_s(CLOCK_MONOTONIC);
    rr->cpu = clock_s(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

/* The trace of one remote run: t[0..3] = before the threads start, after,
 * when the producer is done, when all are joined. */
static void remote_trace(const char *name, uint64_t iters, const double *t, uint64_t pwaits,
                         const remote_run_t *rr, int n) {
    fprintf(stderr,
            "  %s: %llu objects: start %.6f produce %.6f join %.6f s, producer waits %llu\n",
            name, (unsigned long long)iters, t[1] - t[0], t[2] - t[1], t[3] - t[2],
            (unsigned long long)pwaits);
    for (int k = 0; k < n; k++)
        fprintf(stderr, "    consumer %d: %llu objects, waits %llu, cpu %.6f s, loop %.6f-%.6f s\n",
                k, (unsigned long long)rr[k].n, (unsigned long long)rr[k].waits, rr[k].cpu,
                rr[k].t_start - t[0], rr[k].t_done - t[0]);
}

int wl_run_remote(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    static ring_t ring;
    atomic_store(&ring.head, 0);
    atomic_store(&ring.tail, 0);
    remote_run_t rr = {.c = ctx, .r = &ring, .n = iters};
    double tt[4];
    uint64_t pwaits = 0;
    tt[0] = clock_s(CLOCK_MONOTONIC);
    pthread_t t;
    if (pthread_create(&t, NULL, remote_consumer, &rr)) return 1;
    tt[1] = clock_s(CLOCK_MONOTONIC);
    impl_ctx_t *c = ctx;
    /* K_RING: blocks of a static array stand in for allocations (4x the
     * ring, so none is reused while the consumer may still read its slot). */
    static char fake[4 * RING][64] HM_ALIGN64;
    int ring_only = c->kind == K_RING;
    for (uint64_t i = 0; i < iters; i++) {
        while (i - atomic_load_explicit(&ring.head, memory_order_acquire) >= RING) {
            sched_yield();
            pwaits++;
        }
        void *p = ring_only ? fake[i & (4 * RING - 1)] : xalloc(c, 64);
        if (!p) abort(); /* the consumer waits for every object */
        *(char *)p = 1;
        ring.slot[i & (RING - 1)] = p;
        atomic_store_explicit(&ring.tail, i + 1, memory_order_release);
    }
    tt[2] = clock_s(CLOCK_MONOTONIC);
    pthread_join(t, NULL);
    tt[3] = clock_s(CLOCK_MONOTONIC);
    if (wl_trace()) remote_trace("remote", iters, tt, pwaits, &rr, 1);
    return 0;
}

/* ---- remote fan-in: one allocating thread, FANIN freeing threads ---- */

/* The producer deals objects round robin onto one ring per consumer: every
 * consumer frees into the producer's heap, so FANIN threads publish into
 * one heap's queue at once (with more threads than cores: preemption). */
int wl_run_fanin(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    static ring_t rings[FANIN];
    remote_run_t rr[FANIN];
    pthread_t t[FANIN];
    impl_ctx_t *c = ctx;
    int ring_only = c->kind == K_RING;
    static char fake[4 * RING][64] HM_ALIGN64; /* FANIN * RING < 4 * RING in flight */
    double tt[4];
    uint64_t pwaits = 0;
    tt[0] = clock_s(CLOCK_MONOTONIC);
    for (int k = 0; k < FANIN; k++) {
        atomic_store(&rings[k].head, 0);
        atomic_store(&rings[k].tail, 0);
        rr[k] = (remote_run_t){.c = c, .r = &rings[k],
                               .n = iters / FANIN + ((uint64_t)k < iters % FANIN)};
        if (pthread_create(&t[k], NULL, remote_consumer, &rr[k])) abort();
    }
    tt[1] = clock_s(CLOCK_MONOTONIC);
    for (uint64_t i = 0; i < iters; i++) {
        ring_t *r = &rings[i % FANIN];
        uint64_t j = i / FANIN;
        while (j - atomic_load_explicit(&r->head, memory_order_acquire) >= RING) {
            sched_yield();
            pwaits++;
        }
        void *p = ring_only ? fake[i & (4 * RING - 1)] : xalloc(c, 64);
        if (!p) abort(); /* the consumers wait for every object */
        *(char *)p = 1;
        r->slot[j & (RING - 1)] = p;
        atomic_store_explicit(&r->tail, j + 1, memory_order_release);
    }
    tt[2] = clock_s(CLOCK_MONOTONIC);
    for (int k = 0; k < FANIN; k++) pthread_join(t[k], NULL);
    tt[3] = clock_s(CLOCK_MONOTONIC);
    if (wl_trace()) remote_trace("fanin", iters, tt, pwaits, rr, FANIN);
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

int wl_run_xmalloc(void *ctx, const void *arg, uint64_t iters) {
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

/* ---- case arguments ---- */

static uint64_t rnd(uint64_t *s) { /* xorshift64* (Vigna 2016) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

void wl_fill_arg(case_arg_t *a, int random, size_t lo, size_t hi, uint64_t seed) {
    a->random = random;
    a->lo = lo;
    a->hi = hi;
    for (int i = 0; i < NSIZES; i++) {
        a->sizes[i] = (uint32_t)(lo + (hi > lo ? rnd(&seed) % (hi - lo + 1) : 0));
        a->slots[i] = (uint32_t)(rnd(&seed) % SLOTS);
    }
}

const char *wl_malloc_name(void) {
    static char name[40];
    const char *pre = getenv("LD_PRELOAD");
    if (!pre || !*pre) return "glibc";
    const char *base = strrchr(pre, '/');
    base = base ? base + 1 : pre;
    snprintf(name, sizeof name, "%.*s", (int)strcspn(base, ". :"), base);
    return name;
}

/* ---- the cases, in table order ---- */

void wl_run_cases(hm_bench_t *b, hm_bench_impl_t *local_subject, hm_bench_impl_t *local_base,
                  size_t nlocal, hm_bench_impl_t *remote_subject, hm_bench_impl_t *remote_base,
                  size_t nremote) {
    static case_arg_t arg;
    static const struct {
        const char *name;
        size_t lo, hi;
        int (*run)(void *, const void *, uint64_t);
    } local[] = {
        {"pairs 8-128", 8, 128, wl_run_pairs},     {"pairs 8-4096", 8, 4096, wl_run_pairs},
        {"pairs 4096", 4096, 4096, wl_run_pairs},  {"random 8-128", 8, 128, wl_run_random},
        {"random 8-4096", 8, 4096, wl_run_random}, {"random 4096", 4096, 4096, wl_run_random},
    };
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
        wl_fill_arg(&arg, local[i].run == wl_run_random, local[i].lo, local[i].hi, 42 + i);
        local_subject->run = local[i].run;
        for (size_t k = 0; k < nlocal; k++) local_base[k].run = local[i].run;
        hm_bench_case(b, local[i].name, &arg, 1, local_subject, local_base, nlocal);
    }
    wl_fill_arg(&arg, 0, 64, 64, 7);
    remote_subject->run = wl_run_remote;
    for (size_t k = 0; k < nremote; k++) remote_base[k].run = wl_run_remote;
    hm_bench_case(b, "remote 64B 1->1", &arg, 1, remote_subject, remote_base, nremote);
    wl_fill_arg(&arg, 0, 16, 512, 9);
    remote_subject->run = wl_run_xmalloc;
    for (size_t k = 0; k < nremote; k++) remote_base[k].run = wl_run_xmalloc;
    hm_bench_case(b, "xmalloc 2+2", &arg, 1, remote_subject, remote_base, nremote);
}
