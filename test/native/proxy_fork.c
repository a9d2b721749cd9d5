/* hetmem tests — run by test_proxy_malloc under the proxy (HM_PROXY=shared
 * too): forked children that keep running write into and free the blocks
 * they inherited (small, large, another thread's), allocate, and fork again;
 * the parent's blocks must keep their contents. Prints "bad=0" on success.
 * SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 2000, T = 1000, BIG = 40 << 20, TOUCH = 1 << 20 };

static void *thread_main(void *arg) {
    char **v = arg;
    for (int i = 0; i < T; i++) {
        free(v[i]);
        v[i] = malloc(100 + (size_t)(i % 700));
        if (!v[i]) abort();
        memset(v[i], 't', 100);
    }
    return NULL;
}

static void child(char **v, char *big, char **tv) {
    for (int i = 0; i < N; i++) {
        memset(v[i], 'c', 16);
        if (i % 2) {
            free(v[i]);
            v[i] = malloc(33);
        }
    }
    memset(big, 'C', TOUCH);
    free(big);
    for (int i = 0; i < T; i++) free(tv[i]);
    pid_t g = fork();
    if (g == 0) {
        char *q = malloc(1000);
        if (q) memset(q, 'g', 1000);
        free(q);
        _exit(0);
    }
    if (g > 0) waitpid(g, NULL, 0);
    char *x = malloc(TOUCH);
    if (!x) _exit(3);
    memset(x, 1, TOUCH);
    free(x);
    _exit(0);
}

int main(void) {
    static char *v[N], *tv[T];
    for (int i = 0; i < N; i++) {
        v[i] = malloc(16 + (size_t)(i * 7 % 5000));
        if (!v[i]) return 2;
        memset(v[i], 'p', 16);
    }
    char *big = malloc(BIG);
    if (!big) return 2;
    memset(big, 'B', TOUCH);
    for (int i = 0; i < T; i++)
        if (!(tv[i] = malloc(50))) return 2;
    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, tv)) return 2;
    pthread_join(t, NULL);
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) child(v, big, tv);
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            printf("child failed (status %d)\n", st);
            return 1;
        }
    }
    int bad = 0;
    for (int i = 0; i < N; i++) bad += v[i][0] != 'p' || v[i][15] != 'p';
    bad += big[0] != 'B' || big[TOUCH - 1] != 'B';
    for (int i = 0; i < T; i++) bad += tv[i][0] != 't';
    printf("bad=%d\n", bad);
    for (int i = 0; i < N; i++) free(v[i]);
    for (int i = 0; i < T; i++) free(tv[i]);
    free(big);
    return bad != 0;
}
