/* hetmem tests — harness implementation. SPDX-License-Identifier: MIT */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

static _Atomic int passed, failed;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *_Atomic context;

void hm_test_set_context(const char *c) { atomic_store(&context, c); }

int hm_test_spawn_importer(const char *self, const char *extra, int *fd) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0); /* sv[1] crosses exec */
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        char fdarg[16];
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        execl(self, self, "importer", fdarg, extra, (char *)NULL);
        _exit(98);
    }
    close(sv[1]);
    *fd = sv[0];
    return (int)pid;
}

void hm_test_record(int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) {
        atomic_fetch_add(&passed, 1);
        return;
    }
    int n = atomic_fetch_add(&failed, 1);
    if (n >= 200) return; /* enough said */
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_lock);
    const char *c = atomic_load(&context);
    fprintf(stderr, "FAIL %s:%d%s%s%s: ", file, line, c ? " [" : "", c ? c : "", c ? "]" : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&out_lock);
    va_end(ap);
}

int hm_test_failed_count(void) { return atomic_load(&failed); }
int hm_test_passed_count(void) { return atomic_load(&passed); }

int hm_test_finish(void) {
    printf("checks: %d passed, %d failed\n", atomic_load(&passed), atomic_load(&failed));
    fflush(stdout);
    return atomic_load(&failed) ? 1 : 0;
}

size_t hm_test_read_all(int fd, char *buf, size_t cap) {
    size_t len = 0;
    ssize_t n;
    while (len + 1 < cap && (n = read(fd, buf + len, cap - 1 - len)) != 0) {
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        len += (size_t)n;
    }
    if (cap) buf[len] = '\0';
    close(fd);
    return len;
}
