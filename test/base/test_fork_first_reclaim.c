/* hetmem tests — a fork racing the process's first deferred reclamation.
 *
 * The tracker frees removed records through liburcu's call_rcu. In liburcu
 * 0.13 the first call_rcu of a process creates the default call_rcu worker
 * under call_rcu's mutex while the caller is inside a read-side section, and
 * call_rcu_before_fork (our atfork prepare) takes that mutex and then waits
 * for every worker to pause. A worker inside a grace period waits for the
 * reader, the reader waits for the mutex, the forking thread waits for the
 * worker: the parent hung in fork (test_fork caught it about once in 300
 * runs). The tracker now creates the worker before it enters call_rcu, in
 * no read-side section.
 *
 * Each attempt is a fresh process (so its first call_rcu is still ahead):
 * two threads free tracked ranges until their retire shards fill at about
 * the same moment, while the main thread forks in a loop. An attempt that
 * hangs is killed by its alarm and fails the test.
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

/* Without the fix about 1 attempt in 60 deadlocked. */
#define ATTEMPTS 80
/* The sanitizers' runtimes are not fork-safe while other threads are
 * inside them (see test_fork.c), and this test must fork while they are:
 * under ASan and TSan a grandchild hung in the runtime. The race is in
 * liburcu, which they do not change, so the test runs in the plain build. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif
#ifndef UNDER_SANITIZER
#define UNDER_SANITIZER 0
#endif
#define FREES_PER_THREAD 1200 /* several retire batches (256) each */

static hm_pool_t *g_pool;
static _Atomic int g_go, g_done;

static void *churn(void *arg) {
    while (!atomic_load(&g_go)) sched_yield();
    for (int i = 0; i < FREES_PER_THREAD; i++) {
        void *p = hm_pool_malloc(g_pool, 4096); /* proxy pool: one tracked range */
        if (!p || hm_free(p) != HM_SUCCESS) {
            atomic_fetch_add(&g_done, 1000);
            return arg;
        }
    }
    atomic_fetch_add(&g_done, 1);
    return arg;
}

/* One attempt, in a fresh child: returns its exit status. */
static int attempt(void) {
    setpgid(0, 0); /* the parent kills the group: no stray grandchild */
    alarm(HM_TEST_HANG_SECONDS); /* a deadlock ends here, by SIGALRM */
    hm_provider_t *os;
    if (hm_os_provider_create(NULL, &os) ||
        hm_proxy_pool_create(os, HM_POOL_FLAG_OWN_PROVIDER, &g_pool))
        return 2;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, churn, NULL)) return 3;
    atomic_store(&g_go, 1);
    while (atomic_load(&g_done) < 2) {
        pid_t pid = fork();
        if (pid < 0) return 4;
        if (pid == 0) _exit(0);
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 5;
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    if (atomic_load(&g_done) != 2) return 6;
    return hm_pool_destroy(g_pool) == HM_SUCCESS ? 0 : 7;
}

int main(void) {
    if (UNDER_SANITIZER) HM_TEST_SKIP("forks while threads run inside the sanitizer's runtime");
    int hung = 0, failed = 0;
    for (int a = 0; a < ATTEMPTS; a++) {
        pid_t pid = fork(); /* the parent never frees: no call_rcu yet */
        REQUIRE(pid >= 0);
        if (pid == 0) _exit(attempt());
        int st = 0;
        REQUIRE(waitpid(pid, &st, 0) == pid);
        kill(-pid, SIGKILL); /* a grandchild left by a failed attempt */
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) hung++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            failed++;
            fprintf(stderr, "attempt %d: status 0x%x\n", a, st);
        }
    }
    CHECK_MSG(hung == 0, "%d of %d attempts deadlocked in fork", hung, ATTEMPTS);
    CHECK_MSG(failed == 0, "%d of %d attempts failed", failed, ATTEMPTS);
    return hm_test_finish();
}
