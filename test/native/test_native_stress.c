/* hetmem tests — native pool cross-thread stress: producers allocate and
 * hand blocks through a queue to consumers that verify and free them, while
 * threads start and exit throughout (heaps abandoned and adopted). Each block
 * carries a fill pattern derived from a unique serial, so a block handed out
 * twice (two live owners) or corrupted is caught; at the end every byte has
 * come back (statistics, then trim returns the memory), and the memory held
 * stays bounded throughout. SPDX-License-Identifier: MIT
 *
 * Usage: test_native_stress [waves] (default 60, 10 under sanitizers; the
 * mutex queue runs half as many): bounded work, whatever the speed. */
#include "conformance.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define QCAP 4096

typedef struct item {
    void *p;
    size_t size;
    uint64_t serial;
} item_t;

typedef struct shared {
    hm_pool_t *pool;
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    item_t q[QCAP];
    size_t head, count;
    _Atomic int stop;
    _Atomic uint64_t serial;
    _Atomic long produced, consumed, errors;
    _Atomic size_t max_held;
} shared_t;

static uint64_t rnd(uint64_t *s) { /* xorshift64* (Vigna 2016) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static size_t pick_size(uint64_t *s) {
    uint64_t r = rnd(s) % 1000;
    if (r < 600) return 8 + rnd(s) % 120;      /* tiny */
    if (r < 950) return 128 + rnd(s) % 4000;   /* small */
    if (r < 995) return 4096 + rnd(s) % 60000; /* up to the class limit */
    return 64 * KIB + rnd(s) % (512 * KIB);    /* large */
}

/* Pattern: the serial in every 8-byte word (and a tail byte) — cheap enough
 * to check whole blocks. */
static void fill(void *p, size_t n, uint64_t serial) {
    uint64_t *w = p;
    for (size_t i = 0; i < n / 8; i++) w[i] = serial ^ i;
    if (n & 7) memset((char *)p + (n & ~(size_t)7), (int)(serial & 0xff), n & 7);
}

static int verify(const void *p, size_t n, uint64_t serial) {
    const uint64_t *w = p;
    for (size_t i = 0; i < n / 8; i++)
        if (w[i] != (serial ^ i)) return 0;
    const unsigned char *t = (const unsigned char *)p + (n & ~(size_t)7);
    for (size_t i = 0; i < (n & 7); i++)
        if (t[i] != (unsigned char)(serial & 0xff)) return 0;
    return 1;
}

static void push(shared_t *sh, item_t it) {
    pthread_mutex_lock(&sh->lock);
    while (sh->count == QCAP) pthread_cond_wait(&sh->not_full, &sh->lock);
    sh->q[(sh->head + sh->count++) % QCAP] = it;
    pthread_cond_signal(&sh->not_empty);
    pthread_mutex_unlock(&sh->lock);
}

/* 0: stopped and empty. */
static int pop(shared_t *sh, item_t *it) {
    pthread_mutex_lock(&sh->lock);
    while (sh->count == 0 && !atomic_load(&sh->stop)) pthread_cond_wait(&sh->not_empty, &sh->lock);
    if (sh->count == 0) {
        pthread_mutex_unlock(&sh->lock);
        return 0;
    }
    *it = sh->q[sh->head];
    sh->head = (sh->head + 1) % QCAP;
    sh->count--;
    pthread_cond_signal(&sh->not_full);
    pthread_mutex_unlock(&sh->lock);
    return 1;
}

typedef struct worker {
    shared_t *sh;
    int n;        /* blocks to produce */
    uint64_t seed;
} worker_t;

static void *producer(void *arg) {
    worker_t *w = arg;
    shared_t *sh = w->sh;
    uint64_t s = w->seed;
    /* Some blocks stay local: allocated and freed by this thread. */
    void *keep[16] = {0};
    for (int i = 0; i < w->n; i++) {
        size_t size = pick_size(&s);
        void *p = hm_pool_malloc(sh->pool, size);
        if (!p) {
            atomic_fetch_add(&sh->errors, 1);
            fprintf(stderr, "producer: malloc(%zu) failed\n", size);
            continue;
        }
        uint64_t serial = atomic_fetch_add(&sh->serial, 1);
        fill(p, size, serial);
        if (rnd(&s) % 4 == 0) {
            unsigned k = (unsigned)(rnd(&s) % 16);
            if (keep[k] && hm_pool_free(sh->pool, keep[k]) != HM_SUCCESS)
                atomic_fetch_add(&sh->errors, 1);
            keep[k] = hm_pool_malloc(sh->pool, 1 + rnd(&s) % 200);
        }
        push(sh, (item_t){p, size, serial});
        atomic_fetch_add(&sh->produced, 1);
    }
    for (int k = 0; k < 16; k++)
        if (keep[k] && hm_pool_free(sh->pool, keep[k]) != HM_SUCCESS)
            atomic_fetch_add(&sh->errors, 1);
    return NULL;
}

static void *consumer(void *arg) {
    worker_t *w = arg;
    shared_t *sh = w->sh;
    item_t it;
    /* A consumer quits after n blocks (or when told to stop). */
    for (int i = 0; i < w->n && pop(sh, &it); i++) {
        if (!verify(it.p, it.size, it.serial)) {
            atomic_fetch_add(&sh->errors, 1);
            fprintf(stderr, "consumer: block %p (%zu bytes, serial %llu) corrupted: handed out "
                    "twice?\n", it.p, it.size, (unsigned long long)it.serial);
        }
        memset(it.p, 0xdd, it.size < 64 ? it.size : 64); /* the next owner must not care */
        if (hm_pool_free(sh->pool, it.p) != HM_SUCCESS) atomic_fetch_add(&sh->errors, 1);
        atomic_fetch_add(&sh->consumed, 1);
    }
    return NULL;
}

static size_t held(hm_pool_t *pool) {
    hm_pool_stats_t st;
    hm_pool_get_stats(pool, &st);
    return st.bytes_from_provider;
}

static void run(hm_native_remote_queue_t queue, long nwaves) {
    hm_test_set_context(queue == HM_NATIVE_QUEUE_WFCQ ? "stress (wfcq)" : "stress (mutex)");
    static shared_t sh;
    memset(&sh, 0, sizeof(sh));
    pthread_mutex_init(&sh.lock, NULL);
    pthread_cond_init(&sh.not_empty, NULL);
    pthread_cond_init(&sh.not_full, NULL);
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    hm_native_params_t *np;
    REQUIRE_OK(hm_native_params_create(&np));
    REQUIRE_OK(hm_native_params_set_remote_queue(np, queue));
    REQUIRE_OK(hm_native_pool_create(prov, np, HM_POOL_FLAG_OWN_PROVIDER, &sh.pool));
    hm_native_params_destroy(np);

    /* Waves: 2 producers and 2 consumers alive at a time, each living for a
     * short while; a new one starts as soon as one ends. */
    enum { P = 2, C = 2 };
    pthread_t pt[P], ct[C];
    worker_t pw[P], cw[C];
    int p_alive[P] = {0}, c_alive[C] = {0};
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int per_thread = 3000;
    long waves = 0;
    size_t max_held = 0;
    while (waves < nwaves) {
        for (int i = 0; i < P; i++) {
            if (p_alive[i]) pthread_join(pt[i], NULL);
            pw[i] = (worker_t){&sh, per_thread, rnd(&seed)};
            REQUIRE(pthread_create(&pt[i], NULL, producer, &pw[i]) == 0);
            p_alive[i] = 1;
        }
        for (int i = 0; i < C; i++) {
            if (c_alive[i]) pthread_join(ct[i], NULL);
            cw[i] = (worker_t){&sh, per_thread, 0};
            REQUIRE(pthread_create(&ct[i], NULL, consumer, &cw[i]) == 0);
            c_alive[i] = 1;
        }
        size_t h = held(sh.pool);
        if (h > max_held) max_held = h;
        waves++;
    }
    for (int i = 0; i < P; i++)
        if (p_alive[i]) pthread_join(pt[i], NULL);
    /* Consumers finish what producers made. */
    for (int i = 0; i < C; i++)
        if (c_alive[i]) pthread_join(ct[i], NULL);
    atomic_store(&sh.stop, 1);
    pthread_mutex_lock(&sh.lock);
    pthread_cond_broadcast(&sh.not_empty);
    pthread_mutex_unlock(&sh.lock);
    worker_t last = {&sh, 1 << 30, 0};
    pthread_t lt;
    REQUIRE(pthread_create(&lt, NULL, consumer, &last) == 0);
    pthread_join(lt, NULL);

    long produced = atomic_load(&sh.produced), consumed = atomic_load(&sh.consumed);
    printf("%s: %ld waves, %ld blocks through the queue, max held %.1f MiB\n",
           queue == HM_NATIVE_QUEUE_WFCQ ? "wfcq" : "mutex", waves, produced,
           (double)max_held / (double)MIB);
    CHECK_EQ(atomic_load(&sh.errors), 0);
    CHECK_EQ(produced, consumed);
    CHECK(produced > 0);
    /* Bounded: at most QCAP blocks are live (mean ~10 KiB) plus slabs. */
    CHECK_MSG(max_held < 256 * MIB, "held %zu bytes at peak", max_held);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_trim(sh.pool));
    CHECK_OK(hm_pool_get_stats(sh.pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_EQ(st.remote_frees_published, st.remote_frees_drained);
    CHECK_MSG(st.bytes_from_provider == 0, "%zu bytes still held after trim (blocks lost?)",
              st.bytes_from_provider);
    CHECK_OK(hm_pool_destroy(sh.pool));
    pthread_mutex_destroy(&sh.lock);
    pthread_cond_destroy(&sh.not_empty);
    pthread_cond_destroy(&sh.not_full);
}

int main(int argc, char **argv) {
    long waves = 60;
#if defined(HM_SANITIZE_BUILD)
    waves = 10;
#endif
    if (argc > 1) waves = atol(argv[1]);
    if (waves < 2) waves = 2;
    run(HM_NATIVE_QUEUE_WFCQ, waves);
    run(HM_NATIVE_QUEUE_MUTEX, waves / 2);
    return hm_test_finish();
}
