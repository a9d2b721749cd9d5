/* hetmem — logging. SPDX-License-Identifier: MIT
 *
 * HM_LOG=level[,file] is read once (debug|info|warn|error|off, or 0-4).
 * Lines are formatted into a fixed stack buffer and written with one write(2):
 * no allocation, no stdio, a per-thread recursion guard, a registrable sink.
 * Silent by default. Never called on the success path of alloc/free.
 * The HM_LOG file's descriptor is one hetmem keeps (platform/prim.h): high,
 * close-on-exec, and checked before each line; once the program has closed
 * it or put a file of its own at its number, lines go to stderr instead. */
#include "internal.h"
#include "platform/prim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

_Atomic int hm__log_level = HM_LOG_OFF;

static struct {
    _Atomic(hm_log_sink_fn) sink;
    void *_Atomic sink_arg;
    _Atomic int fd;          /* default sink's destination */
    hm_prim_file_id_t fd_id; /* the HM_LOG file's identity when fd is not 2 (set before fd) */
    _Atomic int level_set_by_user;
} logs = {.fd = 2};

/* The default sink's descriptor: the HM_LOG file while it is still the one
 * opened, else stderr. */
static int log_fd(void) {
    int fd = atomic_load(&logs.fd);
    if (fd == 2) return fd;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != logs.fd_id.dev ||
        (uint64_t)st.st_ino != logs.fd_id.ino)
        return 2;
    return fd;
}

static __thread int in_log; /* recursion guard */

static const char *level_name(hm_log_level_t l) {
    switch (l) {
    case HM_LOG_DEBUG: return "DEBUG";
    case HM_LOG_INFO: return "INFO";
    case HM_LOG_WARN: return "WARN";
    case HM_LOG_ERROR: return "ERROR";
    default: return "?";
    }
}

/* Called once from hm__init(). */
void hm__log_init(void);
HM_RUN void hm__log_init(void) {
    const char *env = getenv("HM_LOG");
    if (!env || !*env) return;
    char lvl[16];
    size_t n = strcspn(env, ",");
    if (n >= sizeof(lvl)) n = sizeof(lvl) - 1;
    memcpy(lvl, env, n);
    lvl[n] = 0;
    int level = HM_LOG_OFF;
    if (!strcasecmp(lvl, "debug") || !strcmp(lvl, "0")) level = HM_LOG_DEBUG;
    else if (!strcasecmp(lvl, "info") || !strcmp(lvl, "1")) level = HM_LOG_INFO;
    else if (!strcasecmp(lvl, "warn") || !strcasecmp(lvl, "warning") || !strcmp(lvl, "2"))
        level = HM_LOG_WARN;
    else if (!strcasecmp(lvl, "error") || !strcmp(lvl, "3")) level = HM_LOG_ERROR;
    if (env[n] == ',' && env[n + 1]) {
        int fd = open(env + n + 1, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0 && hm__prim_fd_keep(&fd, &logs.fd_id) == HM_SUCCESS)
            atomic_store(&logs.fd, fd);
    }
    if (!atomic_load(&logs.level_set_by_user)) atomic_store(&hm__log_level, level);
}

void hm_log_set_sink(hm_log_sink_fn sink, void *arg) {
    atomic_store(&logs.sink_arg, arg);
    atomic_store(&logs.sink, sink);
}

void hm_log_set_level(hm_log_level_t level) {
    if ((int)level < HM_LOG_DEBUG || (int)level > HM_LOG_OFF) level = HM_LOG_OFF;
    atomic_store(&logs.level_set_by_user, 1);
    atomic_store(&hm__log_level, (int)level);
}

hm_log_level_t hm_log_get_level(void) { return (hm_log_level_t)atomic_load(&hm__log_level); }

void hm__log(hm_log_level_t level, const char *file, int line, const char *fmt, ...) {
    if (in_log) return;
    in_log = 1;
    int saved_errno = errno;
    char buf[512];
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof(buf), "hetmem %s %s:%d: ", level_name(level), base, line);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof(buf)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    hm_log_sink_fn sink = atomic_load(&logs.sink);
    if (sink) {
        sink(level, buf, atomic_load(&logs.sink_arg));
    } else {
        size_t len = strlen(buf);
        if (len < sizeof(buf) - 1) buf[len++] = '\n';
        else buf[sizeof(buf) - 2] = '\n', len = sizeof(buf) - 1;
        ssize_t w = write(log_fd(), buf, len);
        (void)w;
    }
    errno = saved_errno;
    in_log = 0;
}
