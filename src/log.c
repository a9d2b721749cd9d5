/* hetmem — logging. SPDX-License-Identifier: MIT
 *
 * HM_LOG=level[,file] is read once (debug|info|warn|error|off, or 0-4), with
 * secure_getenv: a set-user-ID or set-group-ID program ignores it, so its
 * caller cannot make it create or append to a file of the caller's choosing.
 * Lines are formatted into a fixed stack buffer and written with one write(2):
 * no allocation, no stdio, a per-thread recursion guard, a registrable sink.
 * Every byte below 0x20 and 0x7f in a line's message is written as \xNN, so
 * a logged value (a path, a name from a peer) cannot inject a line or
 * terminal escapes; the sink gets the escaped text too.
 * Silent by default. Never called on the success path of alloc/free.
 * The HM_LOG file is opened O_NOFOLLOW|O_CLOEXEC|O_APPEND, created mode 0600,
 * and used only when it is a regular file owned by the effective uid (not a
 * symlink, device or FIFO, not someone else's file planted in /tmp); otherwise
 * lines stay on stderr and one line says why.
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

/* Open the HM_LOG file: -1 (errno set, *why a reason) when it must not be
 * used. O_NONBLOCK so that a FIFO without a reader cannot hang the program
 * here; it is cleared once the file is known to be a regular one. */
static int log_open(const char *path, const char **why) {
    *why = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY |
                            O_NONBLOCK, 0600);
    if (fd < 0) {
        *why = errno == ELOOP ? "it is a symbolic link" : strerror(errno);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) *why = strerror(errno);
    else if (!S_ISREG(st.st_mode)) *why = "not a regular file";
    else if (st.st_uid != geteuid()) *why = "owned by another user";
    else if (fcntl(fd, F_SETFL, O_WRONLY | O_APPEND) != 0) *why = strerror(errno);
    if (*why) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Called once from hm__init(). */
void hm__log_init(void);
HM_RUN void hm__log_init(void) {
    const char *env = secure_getenv("HM_LOG");
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
    if (!atomic_load(&logs.level_set_by_user)) atomic_store(&hm__log_level, level);
    if (env[n] == ',' && env[n + 1]) {
        const char *why;
        int fd = log_open(env + n + 1, &why);
        if (fd >= 0 && hm__prim_fd_keep(&fd, &logs.fd_id) == HM_SUCCESS)
            atomic_store(&logs.fd, fd);
        else if (why)
            HM_LOG_WARN("HM_LOG: not logging to %s (%s); logging to stderr", env + n + 1, why);
    }
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

/* Copy src into dst (capacity cap >= 2), every byte below 0x20 and 0x7f
 * written as \xNN; stops before an escape that would not fit whole, and
 * keeps room for one '\n' after the NUL-terminated result. Returns its length. */
static size_t escape_into(char *dst, size_t cap, const char *src) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, room = cap - 2; /* '\n' + NUL */
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) {
            if (o + 4 > room) break;
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[*p >> 4];
            dst[o++] = hex[*p & 15];
        } else {
            if (o + 1 > room) break;
            dst[o++] = (char)*p;
        }
    }
    dst[o] = 0;
    return o;
}

void hm__log(hm_log_level_t level, const char *file, int line, const char *fmt, ...) {
    if (in_log) return;
    in_log = 1;
    int saved_errno = errno;
    char msg[512], buf[640];
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(msg, sizeof(msg), fmt, ap) < 0) msg[0] = 0;
    va_end(ap);
    int n = snprintf(buf, sizeof(buf), "hetmem %s %s:%d: ", level_name(level), base, line);
    if (n < 0 || (size_t)n >= sizeof(buf) - 2) n = 0, buf[0] = 0;
    size_t len = (size_t)n + escape_into(buf + n, sizeof(buf) - (size_t)n, msg);
    hm_log_sink_fn sink = atomic_load(&logs.sink);
    if (sink) {
        sink(level, buf, atomic_load(&logs.sink_arg));
    } else {
        buf[len++] = '\n'; /* escape_into kept room for it */
        ssize_t w = write(log_fd(), buf, len);
        (void)w;
    }
    errno = saved_errno;
    in_log = 0;
}
