/* hetmem tests — jemalloc pools are isolated: many pools on different
 * providers (OS private, OS shared, fixed host buffer, PROT_NONE), used from
 * many threads at once, pointers freed by other threads; every pointer comes
 * back from hm_pool_by_ptr() as its own pool, and no block is handed out
 * twice (fill patterns on CPU memory, an address set on device memory).
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <hetmem/pools/jemalloc.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define FIXED_SIZE (128 * MIB)
#define RW (HM_OS_PROT_READ | HM_OS_PROT_WRITE)

enum { NPOOLS = 8, NTHREADS = 6, XSLOTS = 256, LOCAL = 32 };

static hm_pool_t *g_pools[NPOOLS];
static int g_cpu[NPOOLS];

typedef struct blk {
    void *p;
    size_t size;
    int pool;
    uint64_t seed;
} blk_t;

/* Blocks handed between threads. */
static pthread_mutex_t g_xlock = PTHREAD_MUTEX_INITIALIZER;
static blk_t g_x[XSLOTS];
static int g_nx;

static uint64_t xorshift(uint64_t *s) {
    /* Marsaglia, "Xorshift RNGs", J. Stat. Softw. 8(14), 2003. */
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void check_owner(const blk_t *b) {
    hm_pool_t *want = g_pools[b->pool];
    const char *c = b->p;
    CHECK_MSG(hm_pool_by_ptr(c) == want, "%p (pool %d) attributed to %p", b->p, b->pool,
              (void *)hm_pool_by_ptr(c));
    CHECK(hm_pool_by_ptr(c + b->size - 1) == want);
}

static void release(blk_t *b) {
    check_owner(b);
    if (g_cpu[b->pool])
        CHECK_MSG(hm_test_verify(b->p, b->size, b->seed), "%p (%zu B, pool %d) clobbered", b->p,
                  b->size, b->pool);
    /* Alternate the two free paths. */
    if (b->seed & 1) CHECK_OK(hm_pool_free(g_pools[b->pool], b->p));
    else CHECK_OK(hm_free(b->p));
    b->p = NULL;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t rng = 0x243f6a8885a308d3ull * (uint64_t)(id + 1);
    blk_t local[LOCAL];
    memset(local, 0, sizeof(local));
    int iters = 20000;
#if defined(HM_TSAN)
    iters = 4000;
#endif
    for (int i = 0; i < iters; i++) {
        uint64_t r = xorshift(&rng);
        int k = (int)(r % LOCAL);
        if (local[k].p) release(&local[k]);
        int pool = (int)((r >> 8) % NPOOLS);
        size_t size = (r >> 16) % 100 < 90 ? (size_t)((r >> 24) % 512) + 1
                                           : (size_t)((r >> 24) % (256 * KIB)) + 1;
        void *p = hm_pool_malloc(g_pools[pool], size);
        CHECK_MSG(p != NULL, "thread %d: malloc(%zu) on pool %d -> NULL errno %d", id, size, pool,
                  errno);
        if (!p) continue;
        blk_t b = {p, size, pool, ((uint64_t)id << 48) ^ (uint64_t)i};
        if (g_cpu[pool]) hm_test_fill(p, size, b.seed);
        check_owner(&b);
        if ((r >> 50) % 4 == 0) { /* hand to another thread */
            pthread_mutex_lock(&g_xlock);
            if (g_nx < XSLOTS) {
                g_x[g_nx++] = b;
                b.p = NULL;
            }
            pthread_mutex_unlock(&g_xlock);
        }
        if (b.p) local[k] = b;
        if ((r >> 54) % 4 == 0) {
            blk_t t = {0};
            pthread_mutex_lock(&g_xlock);
            if (g_nx) t = g_x[--g_nx];
            pthread_mutex_unlock(&g_xlock);
            if (t.p) release(&t);
        }
    }
    for (int k = 0; k < LOCAL; k++)
        if (local[k].p) release(&local[k]);
    return NULL;
}

static hm_provider_t *os_provider(hm_os_visibility_t vis, unsigned prot) {
    hm_os_params_t *params;
    REQUIRE_OK(hm_os_params_create(&params));
    REQUIRE_OK(hm_os_params_set_visibility(params, vis));
    REQUIRE_OK(hm_os_params_set_protection(params, prot));
    hm_provider_t *p;
    REQUIRE_OK(hm_os_provider_create(params, &p));
    hm_os_params_destroy(params);
    return p;
}

int main(void) {
    hm_test_set_context("isolation");
    void *buf = mmap(NULL, FIXED_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(buf != MAP_FAILED);
    hm_provider_t *shared_os = os_provider(HM_OS_PRIVATE, RW); /* two pools on one provider */
    for (int i = 0; i < NPOOLS; i++) {
        hm_provider_t *prov = NULL;
        uint32_t flags = HM_POOL_FLAG_OWN_PROVIDER;
        switch (i % 4) {
        case 0: prov = os_provider(HM_OS_PRIVATE, RW); break;
        case 1: prov = os_provider(HM_OS_SHARED, RW); break;
        case 2:
            if (i == 2) {
                REQUIRE_OK(hm_fixed_provider_create(buf, FIXED_SIZE, &prov));
            } else {
                prov = shared_os;
                flags = 0;
            }
            break;
        case 3: prov = os_provider(HM_OS_PRIVATE, HM_OS_PROT_NONE); break;
        }
        REQUIRE_OK(hm_jemalloc_pool_create(prov, NULL, flags, &g_pools[i]));
        g_cpu[i] = hm_provider_cpu_accessible(prov);
    }
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        REQUIRE(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < g_nx; i++) release(&g_x[i]);
    for (int i = 0; i < NPOOLS; i++) CHECK_OK(hm_pool_destroy(g_pools[i]));
    CHECK_OK(hm_provider_destroy(shared_os));
    munmap(buf, FIXED_SIZE);
    return hm_test_finish();
}
