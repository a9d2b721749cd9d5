/* hetmem tests — programs that use descriptors by number, run under
 * libhetmem_proxy.so (test_proxy_fds runs them, with HM_PROXY=shared, whose
 * heap lives in a memfd, and without).
 *
 *   proxy_fds closeall FILE   close every descriptor above 2, open FILE (it
 *                             gets the lowest number), then allocate
 *   proxy_fds dup2 FILE       put FILE at the heap memfd's number, allocate
 *   proxy_fds passfds         start `proxy_fds listfds` with stdin, stdout
 *                             and stderr redirected to descriptors also
 *                             passed by number (Python's
 *                             test_pass_fds_redirected); print whether it
 *                             saw exactly 0, 1, 2 and those
 *   proxy_fds listfds         print the open descriptors below 256 (as
 *                             Python's fd_status.py)
 *
 * closeall and dup2 print where the heap's memfd was ("high": at or above
 * 256; "none": no shared heap) and whether every allocation after the change
 * succeeded; the program's FILE must come out unchanged (test_proxy_fds
 * checks it). Output goes through write() from stack buffers: once the heap
 * cannot grow, stdio's buffer might not be had.
 * SPDX-License-Identifier: MIT */
#define _GNU_SOURCE /* pipe2 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void say(const char *s) {
    size_t n = strlen(s);
    if (write(1, s, n) != (ssize_t)n) _exit(5);
}

/* The heap's memfd (the proxy names it hetmem-proxy), or -1. */
static int memfd_of_heap(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d))) {
        char link[300], to[512];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, to, sizeof to - 1);
        if (n <= 0) continue;
        to[n] = 0;
        if (strstr(to, "memfd:hetmem-proxy")) found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}

/* Allocate (and free) what needs new heap memory: large blocks and many
 * small ones. 1 if every allocation succeeded. */
static int allocate(void) {
    enum { BIG = 48, SMALL = 20000 };
    static void *big[BIG], *small[SMALL];
    int ok = 1;
    for (int i = 0; i < BIG; i++) {
        big[i] = malloc((size_t)1 << 20);
        if (big[i]) memset(big[i], i, (size_t)1 << 20);
        else ok = 0;
    }
    for (int i = 0; i < SMALL; i++) {
        small[i] = malloc(100 + (size_t)(i % 7) * 50);
        if (small[i]) memset(small[i], i, 100);
        else ok = 0;
    }
    for (int i = 0; i < BIG; i++) free(big[i]);
    for (int i = 0; i < SMALL; i++) free(small[i]);
    return ok;
}

static void report(int memfd, int ok) {
    char out[128];
    snprintf(out, sizeof out, "memfd %s, allocations after: %s\n",
             memfd < 0 ? "none" : memfd >= 256 ? "high" : "LOW", ok ? "all ok" : "some refused");
    say(out);
}

static int closeall(const char *file) {
    int memfd = memfd_of_heap();
    for (int fd = 3; fd < 1024; fd++) close(fd);
    int u = open(file, O_RDWR);
    if (u < 0) return 3;
    int ok = allocate();
    report(memfd, ok);
    close(u);
    return 0;
}

static int dup2_over(const char *file) {
    int memfd = memfd_of_heap();
    int u = open(file, O_RDWR);
    if (u < 0) return 3;
    if (memfd >= 0) {
        if (dup2(u, memfd) != memfd) return 4;
        close(u);
        u = memfd;
    }
    int ok = allocate();
    report(memfd, ok);
    close(u);
    return 0;
}

static int listfds(void) {
    free(malloc(1000)); /* the heap (and its memfd) exists */
    char out[1024];
    size_t len = 0;
    for (int fd = 0; fd < 256; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0) continue;
        len += (size_t)snprintf(out + len, sizeof out - len, "%s%d", len ? "," : "", fd);
    }
    snprintf(out + len, sizeof out - len, "\n");
    say(out);
    return 0;
}

static int cmp_int(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

static int passfds(const char *self) {
    int pass[3], p[2];
    pass[0] = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (pipe2(p, O_CLOEXEC) != 0) return 3;
    pass[1] = p[1];
    pass[2] = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (pass[0] < 0 || pass[2] < 0) return 3;
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) { /* _posixsubprocess with close_fds and pass_fds */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != pass[0] && fd != pass[1] && fd != pass[2]) close(fd);
        for (int i = 0; i < 3; i++) fcntl(pass[i], F_SETFD, 0);
        dup2(pass[0], 0);
        dup2(pass[1], 1);
        dup2(pass[2], 2);
        execl(self, self, "listfds", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char got[1024];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof got - 1 && (n = read(p[0], got + len, sizeof got - 1 - len)) > 0)
        len += (size_t)n;
    got[len] = 0;
    int status = 0;
    waitpid(pid, &status, 0);
    int want[6] = {0, 1, 2, pass[0], pass[1], pass[2]};
    qsort(want, 6, sizeof want[0], cmp_int);
    char expect[128];
    size_t el = 0;
    for (int i = 0; i < 6; i++)
        if (i == 0 || want[i] != want[i - 1])
            el += (size_t)snprintf(expect + el, sizeof expect - el, "%s%d", el ? "," : "",
                                   want[i]);
    snprintf(expect + el, sizeof expect - el, "\n");
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !strcmp(got, expect)) {
        say("passfds: the child sees exactly 0, 1, 2 and the passed descriptors\n");
        return 0;
    }
    char out[2200];
    snprintf(out, sizeof out, "passfds: the child (status %#x) sees %s expected %s", status,
             got, expect);
    say(out);
    return 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "closeall")) return closeall(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "dup2")) return dup2_over(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "passfds")) return passfds(argv[0]);
    if (argc == 2 && !strcmp(argv[1], "listfds")) return listfds();
    fprintf(stderr, "usage: proxy_fds closeall|dup2 FILE | passfds | listfds\n");
    return 2;
}
