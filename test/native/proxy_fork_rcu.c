/* hetmem tests — run by test_proxy_malloc under the proxy with
 * HM_PROXY=tracked: forks once the tracker has used call_rcu. The tracker's
 * atfork child handler then calls liburcu's call_rcu_after_fork_child, which
 * calls malloc, and the proxy serves it from a native pool: the pool's own
 * child handler must have run first (it used to run after, so the child
 * waited for a lock its own thread held). A child that has not exited after
 * 5 seconds counts as hung (KEEP_HUNG=1 leaves it for a debugger). Prints
 * "hangs=0" on success. SPDX-License-Identifier: MIT */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* HM_TEST_HANG_SECONDS of test/common/harness.h (this program links no harness). */
#define HANG_SECONDS 300

/* 0 once the child has exited; -1 if it has not within HANG_SECONDS. */
static int wait_child(pid_t pid) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return 0;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > HANG_SECONDS) return -1;
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 20;
    /* The tracker retires the records of the freed large blocks' ranges;
     * every 256 of them go to call_rcu. */
    for (int i = 0; i < 4000; i++) {
        void *p = malloc(((size_t)(1 + i % 61) << 20) + (size_t)i * 4096);
        if (!p) return 2;
        memset(p, 1, 4096);
        free(p);
    }
    int hangs = 0;
    unsigned seed = 1;
    static void *keep[4096];
    size_t nkeep = 0;
    for (int f = 0; f < forks && !hangs; f++) {
        /* Move the class words on, so that the child's malloc sometimes
         * finds its word empty (a refill, which takes locks). */
        int k = rand_r(&seed) % 8;
        for (int j = 0; j < k && nkeep < sizeof keep / sizeof *keep; j++)
            keep[nkeep++] = malloc(16 + (size_t)(rand_r(&seed) % 1024));
        pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) _exit(0);
        if (wait_child(pid)) {
            printf("fork %d: child %d hangs\n", f, (int)pid);
            fflush(stdout);
            if (getenv("KEEP_HUNG")) pause();
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            hangs++;
        }
    }
    for (size_t i = 0; i < nkeep; i++) free(keep[i]);
    printf("hangs=%d\n", hangs);
    return hangs != 0;
}
