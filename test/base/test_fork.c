/* hetmem tests — behaviour after fork (documented in include/hetmem/pool.h):
 * the child keeps using the pools it inherited from its one thread, or
 * destroys them; shared-mode memory stays shared with the parent.
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

static _Atomic int stop;
static hm_pool_t *busy_pool;

/* The sanitizers' runtimes are not fork-safe while other threads are inside
 * them: ASan's allocator (the child can hang in it), and TSan's, which
 * supports a fork with other threads running only with die_after_fork=0
 * and may deadlock then. So under either sanitizer the churn threads park
 * around each fork; the Release build forks while they run, which is the
 * case the pool's fork handling is for. (This test also hung, in TSan and
 * in Release, on a deadlock of our own: a fork racing the process's first
 * call_rcu, fixed in the tracker; test_fork_first_reclaim covers it.) */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PARK_AROUND_FORK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PARK_AROUND_FORK 1
#endif
#endif
#ifndef PARK_AROUND_FORK
#define PARK_AROUND_FORK 0
#endif
static _Atomic int park, parked;

/* Keeps allocating and freeing so that a fork lands while locks are held. */
static void *churn(void *arg) {
    while (!atomic_load(&stop)) {
        if (atomic_load(&park)) {
            atomic_fetch_add(&parked, 1);
            while (atomic_load(&park)) sched_yield();
            atomic_fetch_sub(&parked, 1);
        }
        void *p = hm_pool_malloc(busy_pool, 4096);
        if (p) hm_free(p);
    }
    return arg;
}

static int child_work(hm_pool_t *pool, char *inherited) {
    int bad = 0;
    if (inherited[0] != 'P') bad |= 1;
    if (hm_pool_by_ptr(inherited) != pool) bad |= 2;
    for (int i = 0; i < 200; i++) {
        char *p = hm_pool_malloc(pool, 10000);
        if (!p) return 4;
        memset(p, 'c', 10000);
        if (hm_pool_by_ptr(p + 9999) != pool) bad |= 8;
        if (hm_free(p) != HM_SUCCESS) bad |= 16;
    }
    /* A new pool in the child works too. */
    hm_provider_t *os;
    hm_pool_t *np;
    if (hm_os_provider_create(NULL, &os) || hm_proxy_pool_create(os, HM_POOL_FLAG_OWN_PROVIDER, &np))
        return 32;
    void *q = hm_pool_malloc(np, 100);
    if (!q || hm_pool_by_ptr(q) != np) bad |= 64;
    hm_free(q);
    if (hm_pool_destroy(np) || hm_pool_destroy(pool) || hm_pool_destroy(busy_pool)) bad |= 128;
    return bad;
}

int main(void) {
    hm_provider_t *os, *os2;
    hm_pool_t *pool;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    REQUIRE_OK(hm_proxy_pool_create(os, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    REQUIRE_OK(hm_os_provider_create(NULL, &os2));
    REQUIRE_OK(hm_proxy_pool_create(os2, HM_POOL_FLAG_OWN_PROVIDER, &busy_pool));
    char *inherited = hm_pool_malloc(pool, 64);
    REQUIRE(inherited);
    inherited[0] = 'P';

    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, NULL);
    for (int round = 0; round < 20; round++) {
        if (PARK_AROUND_FORK) {
            atomic_store(&park, 1);
            while (atomic_load(&parked) < 2) sched_yield();
        }
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) _exit(child_work(pool, inherited));
        atomic_store(&park, 0);
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child round %d: status 0x%x", round, st);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);

    /* The parent is unaffected. */
    CHECK(inherited[0] == 'P');
    CHECK(hm_pool_by_ptr(inherited) == pool);
    CHECK_OK(hm_free(inherited));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_OK(hm_pool_destroy(busy_pool));
    return hm_test_finish();
}
