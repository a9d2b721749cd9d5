/* hetmem IPC — concurrency: an exporter process whose threads get/put (and
 * free/reallocate) handles while this process's threads open/close the same
 * and different handles through a shared pool and through short-lived pools
 * that are destroyed with mappings open, under a small cache bound (so
 * evictions race with opens, closes and destroys). Meant for TSan.
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NALLOC 32
#define ASIZE (16u * 1024u)
#define THREADS 4

static unsigned char handles[NALLOC][512];
static size_t hlen[NALLOC];
static hm_pool_t *shared;
/* Steps per importer thread (argv[1]): bounded work, whatever the speed. */
#if defined(HM_TSAN)
static long iters = 2000;
#else
static long iters = 5000;
#endif
static _Atomic int importers_left = THREADS;
static _Atomic long opens, hits_stale, failures, destroys;

static uint64_t xs(uint64_t *s) { /* xorshift64 (Marsaglia 2003) */
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static hm_pool_t *make_pool(void) {
    hm_os_params_t *prm;
    hm_provider_t *prov;
    hm_pool_t *pool = NULL;
    hm_os_params_create(&prm);
    hm_os_params_set_visibility(prm, HM_OS_SHARED);
    if (hm_os_provider_create(prm, &prov) == HM_SUCCESS)
        hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool);
    hm_os_params_destroy(prm);
    return pool;
}

/* ---- the exporter (child process) ---- */
static hm_pool_t *xpool;
static void *_Atomic xmem[NALLOC];
static pthread_mutex_t xlock[NALLOC];
static _Atomic int xstop;

static void *exporter_thread(void *arg) {
    uint64_t s = (uint64_t)(uintptr_t)arg * 7919 + 1;
    while (!atomic_load(&xstop)) {
        int i = (int)(xs(&s) % NALLOC);
        pthread_mutex_lock(&xlock[i]);
        void *m = atomic_load(&xmem[i]);
        if (xs(&s) % 50 == 0) { /* free and reallocate: a new allocation id */
            hm_pool_free(xpool, m);
            m = hm_pool_malloc(xpool, ASIZE);
            atomic_store(&xmem[i], m);
        }
        hm_ipc_handle_t *h[3];
        size_t l;
        int got = 0;
        for (int k = 0; k < 3; k++)
            if (m && hm_ipc_get((char *)m + k * 64, &h[got], &l) == HM_SUCCESS) got++;
        pthread_mutex_unlock(&xlock[i]);
        for (int k = 0; k < got; k++) hm_ipc_put(h[k]);
    }
    return NULL;
}

static int exporter(int out, int in) {
    xpool = make_pool();
    if (!xpool) return 2;
    for (int i = 0; i < NALLOC; i++) {
        pthread_mutex_init(&xlock[i], NULL);
        void *m = hm_pool_malloc(xpool, ASIZE);
        if (!m) return 3;
        atomic_store(&xmem[i], m);
        hm_ipc_handle_t *h;
        size_t l;
        if (hm_ipc_get(m, &h, &l) || l > sizeof(handles[0])) return 4;
        uint32_t l32 = (uint32_t)l;
        if (write(out, &l32, 4) != 4 || write(out, h, l) != (ssize_t)l) return 5;
        /* the handle is kept (not put): the importer's first opens of it
         * stay valid even when the allocation is replaced */
    }
    pthread_t t[2];
    for (int k = 0; k < 2; k++) pthread_create(&t[k], NULL, exporter_thread, (void *)(uintptr_t)(k + 1));
    char c;
    (void)!read(in, &c, 1);
    atomic_store(&xstop, 1);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    return 0;
}

/* ---- the importer threads ---- */
static void *importer_thread(void *arg) {
    uint64_t s = (uint64_t)(uintptr_t)arg * 104729 + 3;
    void *held[4] = {0};
    for (long step = 0; step < iters; step++) {
        int i = (int)(xs(&s) % NALLOC);
        if (xs(&s) % 16 == 0) { /* a private pool: open a few, leave some open, destroy */
            hm_pool_t *p = make_pool();
            if (!p) {
                atomic_fetch_add(&failures, 1);
                continue;
            }
            for (int k = 0; k < 6; k++) {
                void *ptr;
                int j = (int)(xs(&s) % NALLOC);
                hm_result_t r = hm_ipc_open(p, (const hm_ipc_handle_t *)handles[j], hlen[j], &ptr);
                if (r == HM_SUCCESS) {
                    __atomic_store_n((unsigned char *)ptr + k, (unsigned char)k, __ATOMIC_RELAXED);
                    if (k & 1) hm_ipc_close(ptr);
                } else if (r != HM_ERROR_STALE_HANDLE) {
                    atomic_fetch_add(&failures, 1);
                }
            }
            if (hm_pool_destroy(p) != HM_SUCCESS) atomic_fetch_add(&failures, 1);
            atomic_fetch_add(&destroys, 1);
            continue;
        }
        void *ptr;
        hm_result_t r = hm_ipc_open(shared, (const hm_ipc_handle_t *)handles[i], hlen[i], &ptr);
        atomic_fetch_add(&opens, 1);
        if (r == HM_ERROR_STALE_HANDLE) {
            atomic_fetch_add(&hits_stale, 1);
            continue;
        }
        if (r != HM_SUCCESS) {
            atomic_fetch_add(&failures, 1);
            continue;
        }
        __atomic_store_n((unsigned char *)ptr + 100, 1, __ATOMIC_RELAXED);
        int slot = (int)(xs(&s) % 4);
        if (held[slot]) {
            if (hm_ipc_close(held[slot]) != HM_SUCCESS) atomic_fetch_add(&failures, 1);
        }
        held[slot] = ptr;
        if (xs(&s) % 3 == 0) {
            if (hm_ipc_close(held[slot]) != HM_SUCCESS) atomic_fetch_add(&failures, 1);
            held[slot] = NULL;
        }
    }
    for (int k = 0; k < 4; k++)
        if (held[k] && hm_ipc_close(held[k]) != HM_SUCCESS) atomic_fetch_add(&failures, 1);
    atomic_fetch_sub(&importers_left, 1);
    return NULL;
}

/* The bound changes under everyone's feet: every 100 opens, until the
 * importers are done. */
static void *limit_thread(void *arg) {
    (void)arg;
    size_t lim[] = {4, 16, 1, 64, 8};
    for (int k = 0; atomic_load(&importers_left) > 0; k++) {
        hm_ipc_set_cache_limits(lim[k % 5], (k % 3) ? 0 : 8 * ASIZE);
        long o = atomic_load(&opens);
        while (atomic_load(&opens) < o + 100 && atomic_load(&importers_left) > 0) usleep(500);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) iters = atol(argv[1]);
    {
        int pfd = (int)syscall(SYS_pidfd_open, getpid(), 0), f = -1;
        if (pfd >= 0) f = (int)syscall(SYS_pidfd_getfd, pfd, 0, 0);
        if (pfd >= 0) close(pfd);
        if (f < 0) HM_TEST_SKIP("pidfd_getfd is refused here");
        close(f);
    }
    int a[2], b[2];
    REQUIRE(pipe(a) == 0 && pipe(b) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        close(a[0]);
        close(b[1]);
        _exit(exporter(a[1], b[0]));
    }
    close(a[1]);
    close(b[0]);
    for (int i = 0; i < NALLOC; i++) {
        uint32_t l32;
        REQUIRE(read(a[0], &l32, 4) == 4 && l32 <= sizeof(handles[0]));
        REQUIRE(read(a[0], handles[i], l32) == (ssize_t)l32);
        hlen[i] = l32;
    }
    REQUIRE_OK(hm_ipc_set_cache_limits(8, 0));
    REQUIRE((shared = make_pool()));
    pthread_t t[THREADS + 1];
    for (int k = 0; k < THREADS; k++)
        pthread_create(&t[k], NULL, importer_thread, (void *)(uintptr_t)(k + 1));
    pthread_create(&t[THREADS], NULL, limit_thread, NULL);
    for (int k = 0; k <= THREADS; k++) pthread_join(t[k], NULL);
    hm_ipc_cache_stats_t st;
    CHECK_OK(hm_ipc_get_cache_stats(&st));
    printf("%ld opens through the shared pool (%ld stale), %ld pools destroyed; cache: %zu "
           "entries, %llu hits, %llu misses, %llu evictions, %llu stale\n",
           atomic_load(&opens), atomic_load(&hits_stale), atomic_load(&destroys), st.entries,
           (unsigned long long)st.hits, (unsigned long long)st.misses,
           (unsigned long long)st.evictions, (unsigned long long)st.stale);
    CHECK_EQ(atomic_load(&failures), 0);
    CHECK_EQ(st.in_use, 0);
    CHECK(atomic_load(&opens) > 0);
    CHECK_OK(hm_pool_destroy(shared));
    CHECK_OK(hm_ipc_get_cache_stats(&st));
    CHECK_EQ(st.entries, 0);
    CHECK(write(b[1], "x", 1) == 1);
    int status;
    waitpid(child, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exporter exit status %d", status);
    return hm_test_finish();
}
