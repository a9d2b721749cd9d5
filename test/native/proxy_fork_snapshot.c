/* hetmem tests — run by test_proxy_malloc under the proxy (HM_PROXY=shared
 * too): a forked child must see its heap as it was at fork(), not the
 * writes its parent makes once fork() has returned there (with the shared
 * heap, the child used to copy it after fork(), while the parent ran on: a
 * shell's child crashed on a word list its parent had freed). Prints
 * "bad=0" on success. SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { NSMALL = 20000, NBIG = 24, BIGSZ = 2 << 20 };

int main(void) {
    static char *s[NSMALL], *b[NBIG];
    for (int i = 0; i < NSMALL; i++) {
        s[i] = malloc(48 + (size_t)(i % 200));
        if (!s[i]) return 2;
        memset(s[i], 'o', 48);
    }
    for (int i = 0; i < NBIG; i++) {
        b[i] = malloc(BIGSZ);
        if (!b[i]) return 2;
        memset(b[i], 'o', BIGSZ);
    }
    int fails = 0;
    for (int round = 0; round < 5; round++) {
        pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) {
            int bad = 0;
            for (int i = 0; i < NSMALL; i++) bad += s[i][0] != 'o' || s[i][47] != 'o';
            for (int i = 0; i < NBIG; i++) bad += b[i][0] != 'o' || b[i][BIGSZ - 1] != 'o';
            _exit(bad ? 1 : 0);
        }
        /* The parent goes on at once, as a shell does after fork(). */
        for (int i = 0; i < NSMALL; i++) memset(s[i], 'P', 48);
        for (int i = 0; i < NBIG; i++) {
            b[i][0] = 'P';
            b[i][BIGSZ - 1] = 'P';
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) fails++;
        for (int i = 0; i < NSMALL; i++) memset(s[i], 'o', 48);
        for (int i = 0; i < NBIG; i++) {
            b[i][0] = 'o';
            b[i][BIGSZ - 1] = 'o';
        }
    }
    printf("bad=%d\n", fails);
    return fails != 0;
}
