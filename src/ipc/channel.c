/* hetmem — IPC descriptor transports: pidfd_getfd, and a unix-socket
 * channel that carries a handle with its descriptor (SCM_RIGHTS).
 * SPDX-License-Identifier: MIT
 *
 * pidfd_getfd(2) (Linux 5.6) needs PTRACE_MODE_ATTACH_REALCREDS over the
 * exporter: same user, and where Yama's ptrace_scope is 1 the exporter must
 * name us as a ptracer (hm_ipc_allow_importer: ptrace.c; Documentation/admin-guide/
 * LSM/Yama.rst); container seccomp profiles often refuse it outright. So it
 * is tried first and its refusals (EPERM, ENOSYS) are reported as "use the
 * channel", never as a crash. SCM_RIGHTS: unix(7), cmsg(3).
 *
 * The channel's peers are checked (unix(7), SO_PEERCRED): a listener's
 * socket file is born owner-only (fchmod before bind: the kernel gives the
 * file the socket inode's mode less the umask) and set to exactly 0600 before
 * listen(), so no peer can connect before then; accept refuses a peer of
 * another uid, connect a listener that is neither this uid nor root, unless
 * the program named that uid. */
#include "ipc/ipc_internal.h"
#include "platform/prim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>


/* ---- pidfd transport ---- */

int hm__ipc_pidfd_enabled(void) {
    const char *v = secure_getenv("HM_IPC_PIDFD");
    return !(v && v[0] == '0' && !v[1]);
}

/* Verified pidfds, one per exporter identity (pid, nonce, start time), so
 * that pidfd_open and the /proc start-time check (4 system calls and a
 * parse) run once per exporter instead of once per open miss. A pidfd pins
 * one process: verified once, it names the exporter for the exporter's
 * whole life, and once the exporter exits pidfd_getfd fails with ESRCH and
 * the slot is dropped. Bounded: PC_SLOTS exporters, least recently used
 * replaced; a slot in use by a fetch is never closed under it (`users`). */
#define PC_SLOTS 32
typedef struct pc_slot {
    uint64_t pid, nonce, start, last;
    int fd1;   /* pidfd + 1; 0: empty */
    int users; /* fetches using the pidfd now */
    bool dead; /* exporter gone: closed by the last user */
} pc_slot_t;
static struct {
    pthread_mutex_t lock;
    uint64_t tick;
    pc_slot_t s[PC_SLOTS];
} pc = {.lock = PTHREAD_MUTEX_INITIALIZER};

void hm__ipc_pidfd_cache_atfork(int phase) {
    if (phase == 0) hm__mutex_lock(&pc.lock);
    else if (phase == 1) hm__mutex_unlock(&pc.lock);
    else hm__mutex_unlock(&pc.lock); /* child: the forking thread took it in prepare */
}

/* pidfd_open + start-time check. */
static hm_result_t pidfd_verified(const hm_wire_t *w, int *out) {
    int pidfd = -1;
    hm_result_t r = hm__prim_pidfd_open((pid_t)w->pid, &pidfd);
    if (r != HM_SUCCESS) {
        int64_t e = hm_last_native_error(NULL);
        if (e == ESRCH) {
            HM_LOG_ERROR("hm_ipc_open: the exporter (pid %llu) is not running",
                         (unsigned long long)w->pid);
            return HM_ERROR_STALE_HANDLE;
        }
        HM_LOG_ERROR("hm_ipc_open: pidfd_open(%llu) failed (errno %lld): use the channel",
                     (unsigned long long)w->pid, (long long)e);
        return e == ENOSYS ? HM_ERROR_NOT_SUPPORTED : r;
    }
    /* The pidfd pins one process; if the pid now names another one (reused
     * pid), its start time differs from the handle's. */
    uint64_t start = 0;
    if (hm__prim_process_start_time((pid_t)w->pid, &start) != HM_SUCCESS || !w->start_time ||
        start != w->start_time) {
        (void)hm__prim_close(pidfd);
        HM_LOG_ERROR("hm_ipc_open: pid %llu is not the exporting process any more (exited; "
                     "start time %llu, handle says %llu)", (unsigned long long)w->pid,
                     (unsigned long long)start, (unsigned long long)w->start_time);
        return HM_ERROR_STALE_HANDLE;
    }
    *out = pidfd;
    return HM_SUCCESS;
}

hm_result_t hm__ipc_fetch_fd(const hm_wire_t *w, int *fd) {
    *fd = -1;
    if (!hm__ipc_pidfd_enabled()) {
        HM_LOG_ERROR("hm_ipc_open: the handle's memory is a file descriptor and the pidfd "
                     "transport is off (HM_IPC_PIDFD=0): receive it with hm_ipc_channel_recv() "
                     "and open it with hm_ipc_open_fd()");
        return HM_ERROR_NOT_SUPPORTED;
    }
    int pidfd = -1, evicted = -1;
    pc_slot_t *slot = NULL;
    hm__mutex_lock(&pc.lock);
    for (int i = 0; i < PC_SLOTS; i++) {
        pc_slot_t *s = &pc.s[i];
        if (s->fd1 && !s->dead && s->pid == w->pid && s->nonce == w->nonce &&
            s->start == w->start_time) {
            slot = s;
            s->users++;
            s->last = ++pc.tick;
            pidfd = s->fd1 - 1;
            break;
        }
    }
    hm__mutex_unlock(&pc.lock);
    if (!slot) {
        hm_result_t r = pidfd_verified(w, &pidfd);
        if (r != HM_SUCCESS) return r;
        hm__mutex_lock(&pc.lock);
        for (int i = 0; i < PC_SLOTS; i++) { /* empty first, else least recent unused */
            pc_slot_t *s = &pc.s[i];
            if (s->users) continue;
            if (!s->fd1) {
                slot = s;
                break;
            }
            if (!slot || s->last < slot->last) slot = s;
        }
        if (slot) {
            if (slot->fd1) evicted = slot->fd1 - 1;
            *slot = (pc_slot_t){.pid = w->pid, .nonce = w->nonce, .start = w->start_time,
                                .last = ++pc.tick, .fd1 = pidfd + 1, .users = 1};
        }
        hm__mutex_unlock(&pc.lock);
        if (evicted >= 0) (void)hm__prim_close(evicted);
    }
    hm_result_t r = hm__prim_pidfd_getfd(pidfd, w->fd, fd);
    int64_t e = r ? hm_last_native_error(NULL) : 0;
    if (slot) {
        int to_close = -1;
        hm__mutex_lock(&pc.lock);
        slot->users--;
        if (r != HM_SUCCESS && e == ESRCH) slot->dead = true;
        if (slot->dead && !slot->users) {
            to_close = slot->fd1 - 1;
            slot->fd1 = 0;
            slot->dead = false;
        }
        hm__mutex_unlock(&pc.lock);
        if (to_close >= 0) (void)hm__prim_close(to_close);
    } else {
        (void)hm__prim_close(pidfd); /* every slot busy: not cached */
    }
    if (r == HM_SUCCESS) return HM_SUCCESS;
    *fd = -1;
    if (e == ESRCH || e == EBADF) {
        HM_LOG_ERROR("hm_ipc_open: the exporter (pid %llu) %s", (unsigned long long)w->pid,
                     e == ESRCH ? "exited" : "no longer has the descriptor (memory released)");
        return HM_ERROR_STALE_HANDLE;
    }
    HM_LOG_ERROR("hm_ipc_open: pidfd_getfd refused (errno %lld: %s); send the handle over "
                 "hm_ipc_channel_send() instead", (long long)e, strerror((int)e));
    if (e == ENOSYS) return HM_ERROR_NOT_SUPPORTED;
    if (e == EPERM || e == EACCES) return HM_ERROR_PERMISSION;
    return r;
}

/* ---- the channel ---- */

#define CH_ALLOWED 8 /* uids a listener admits besides its own */

struct hm_ipc_channel {
    int fd;
    bool listener;
    /* Listener only: the peer uids hm_ipc_channel_allow_uid() admitted
     * (HM_IPC_CHANNEL_ANY_UID: every uid), and the socket file it bound. */
    unsigned n_allowed;
    uint32_t allowed[CH_ALLOWED];
    dev_t dev;
    ino_t ino;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* The credentials of the socket's peer: for an accepted connection those of
 * the connecting process at connect(), for a connected one those of the
 * listener at listen(). */
static hm_result_t peer_cred(int fd, struct ucred *cr) {
    socklen_t len = sizeof(*cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len) != 0 || len != sizeof(*cr))
        return hm__errno_result(errno ? errno : EPROTO, "getsockopt(SO_PEERCRED)");
    return HM_SUCCESS;
}

static bool listener_admits(const hm_ipc_channel_t *l, uint32_t uid) {
    if (uid == (uint32_t)geteuid()) return true;
    for (unsigned i = 0; i < l->n_allowed; i++)
        if (l->allowed[i] == uid || l->allowed[i] == HM_IPC_CHANNEL_ANY_UID) return true;
    return false;
}

/* Give the listener's socket file `mode`, after checking that the path still
 * names the socket this listener bound (the first call records it): opened
 * O_PATH|O_NOFOLLOW, so a symlink is refused, checked to be a socket owned by
 * the effective uid, and changed through /proc/self/fd, so that the chmod
 * acts on exactly the inode checked, never on a file put at the path since. */
static hm_result_t sock_file_mode(hm_ipc_channel_t *l, mode_t mode) {
    int pfd = open(l->path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0) return hm__errno_result(errno, "open(%s, O_PATH|O_NOFOLLOW)", l->path);
    hm_result_t r = HM_SUCCESS;
    struct stat st;
    if (fstat(pfd, &st) != 0) {
        r = hm__errno_result(errno, "fstat(%s)", l->path);
    } else if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid() ||
               (l->ino && (st.st_dev != l->dev || st.st_ino != l->ino))) {
        HM_LOG_ERROR("hm_ipc_channel(%s): the path is no longer this listener's socket (a %s "
                     "owned by uid %u); its mode is left alone", l->path,
                     S_ISSOCK(st.st_mode) ? "socket" : "file", (unsigned)st.st_uid);
        r = HM_ERROR_PERMISSION;
    } else if ((st.st_mode & 07777) != mode) {
        char proc[40];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
        if (chmod(proc, mode) != 0)
            r = hm__errno_result(errno, "chmod(%s, 0%o) through %s", l->path, (unsigned)mode,
                                 proc);
    }
    if (r == HM_SUCCESS && !l->ino) {
        l->dev = st.st_dev;
        l->ino = st.st_ino;
    }
    close(pfd);
    return r;
}

static hm_result_t make_addr(const char *path, struct sockaddr_un *a) {
    if (!path || !*path) {
        HM_LOG_ERROR("hm_ipc_channel: no socket path");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(path) >= sizeof(a->sun_path)) {
        HM_LOG_ERROR("hm_ipc_channel: socket path longer than %zu bytes: %s",
                     sizeof(a->sun_path) - 1, path);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    strcpy(a->sun_path, path);
    return HM_SUCCESS;
}

static hm_result_t channel_wrap(int fd, bool listener, const char *path,
                                hm_ipc_channel_t **out) {
    hm_ipc_channel_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    c->fd = fd;
    c->listener = listener;
    if (path) snprintf(c->path, sizeof(c->path), "%s", path);
    *out = c;
    return HM_SUCCESS;
}

hm_result_t hm_ipc_channel_listen(const char *path, hm_ipc_channel_t **out) {
    if (!out) return HM_ERROR_INVALID_ARGUMENT;
    *out = NULL;
    struct sockaddr_un a;
    hm_result_t r = make_addr(path, &a);
    if (r) return r;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return hm__errno_result(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
    /* The file bind() creates gets the socket inode's mode less the umask:
     * owner-only from its first instant, without touching the umask. */
    if (fchmod(fd, 0600) != 0) {
        r = hm__errno_result(errno, "fchmod(socket, 0600)");
        close(fd);
        return r;
    }
    /* A stale socket of ours is replaced; another user's is not ours to remove. */
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == geteuid())
        (void)unlink(path);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        r = hm__errno_result(errno, "bind(%s)", path);
        close(fd);
        return r;
    }
    hm_ipc_channel_t *l;
    r = channel_wrap(fd, true, path, &l);
    if (r) {
        (void)unlink(path);
        return r;
    }
    /* Exactly 0600 (a stricter umask would keep the owner out), checked to
     * be our socket; only then may peers connect. */
    r = sock_file_mode(l, 0600);
    if (r == HM_SUCCESS && listen(fd, 16) != 0) r = hm__errno_result(errno, "listen(%s)", path);
    if (r) {
        if (l->ino) (void)unlink(path); /* ours: checked above */
        l->path[0] = 0;
        (void)hm_ipc_channel_destroy(l);
        return r;
    }
    *out = l;
    return HM_SUCCESS;
}

hm_result_t hm_ipc_channel_allow_uid(hm_ipc_channel_t *l, uint32_t uid) {
    if (!l || !l->listener) {
        HM_LOG_ERROR("hm_ipc_channel_allow_uid: %s", !l ? "NULL channel"
                                                        : "not a listening channel");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (listener_admits(l, uid)) return HM_SUCCESS; /* ours, or admitted already */
    if (l->n_allowed == CH_ALLOWED) {
        HM_LOG_ERROR("hm_ipc_channel_allow_uid(%s, %u): already %d uids admitted; "
                     "HM_IPC_CHANNEL_ANY_UID admits every one", l->path, (unsigned)uid,
                     CH_ALLOWED);
        return HM_ERROR_LIMIT;
    }
    /* Other users need write permission on the socket file to connect. */
    hm_result_t r = sock_file_mode(l, 0666);
    if (r) return r;
    l->allowed[l->n_allowed++] = uid;
    return HM_SUCCESS;
}

hm_result_t hm_ipc_channel_accept(hm_ipc_channel_t *l, hm_ipc_channel_t **out) {
    if (!l || !out || !l->listener) {
        HM_LOG_ERROR("hm_ipc_channel_accept: %s", !l || !out ? "NULL argument"
                                                             : "not a listening channel");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *out = NULL;
    int fd;
    do {
        fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return hm__errno_result(errno, "accept4(%s)", l->path);
    struct ucred cr;
    hm_result_t r = peer_cred(fd, &cr);
    if (r == HM_SUCCESS && !listener_admits(l, cr.uid)) {
        HM_LOG_ERROR("hm_ipc_channel_accept(%s): refused a peer of another user (pid %d, "
                     "uid %u); hm_ipc_channel_allow_uid() admits one", l->path, (int)cr.pid,
                     (unsigned)cr.uid);
        r = HM_ERROR_PERMISSION;
    }
    if (r) {
        close(fd);
        return r;
    }
    return channel_wrap(fd, false, NULL, out);
}

hm_result_t hm_ipc_channel_connect(const char *path, hm_ipc_channel_t **out) {
    return hm_ipc_channel_connect_uid(path, (uint32_t)geteuid(), out);
}

hm_result_t hm_ipc_channel_connect_uid(const char *path, uint32_t uid, hm_ipc_channel_t **out) {
    if (!out) return HM_ERROR_INVALID_ARGUMENT;
    *out = NULL;
    struct sockaddr_un a;
    hm_result_t r = make_addr(path, &a);
    if (r) return r;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return hm__errno_result(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
    int rc;
    do {
        rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT || e == ECONNREFUSED) {
            HM_LOG_INFO("hm_ipc_channel_connect(%s): nobody listens", path);
            hm__errno_result(e, "connect(%s)", path);
            return HM_ERROR_NOT_FOUND;
        }
        return hm__errno_result(e, "connect(%s)", path);
    }
    struct ucred cr;
    r = peer_cred(fd, &cr);
    if (r == HM_SUCCESS && cr.uid != (uint32_t)geteuid() && cr.uid != 0 && cr.uid != uid &&
        uid != HM_IPC_CHANNEL_ANY_UID) {
        HM_LOG_ERROR("hm_ipc_channel_connect(%s): refused the listener (pid %d, uid %u): "
                     "neither this user nor root; hm_ipc_channel_connect_uid() names it",
                     path, (int)cr.pid, (unsigned)cr.uid);
        r = HM_ERROR_PERMISSION;
    }
    if (r) {
        close(fd);
        return r;
    }
    return channel_wrap(fd, false, NULL, out);
}

hm_result_t hm_ipc_channel_from_fd(int sock, hm_ipc_channel_t **out) {
    if (sock < 0 || !out) {
        HM_LOG_ERROR("hm_ipc_channel_from_fd: %s", sock < 0 ? "bad socket" : "NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
        HM_LOG_ERROR("hm_ipc_channel_from_fd(%d): not a SOCK_SEQPACKET socket", sock);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return channel_wrap(sock, false, NULL, out);
}

static hm_result_t send_msg(hm_ipc_channel_t *c, const void *buf, size_t len, int fd) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t n;
    do {
        n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EPIPE || errno == ECONNRESET) {
            hm__errno_result(errno, "sendmsg");
            HM_LOG_INFO("hm_ipc_channel_send: the peer is gone");
            return HM_ERROR_NOT_FOUND;
        }
        return hm__errno_result(errno, "sendmsg(%zu bytes)", len);
    }
    if ((size_t)n != len) return hm__errno_result(EMSGSIZE, "sendmsg: %zd of %zu bytes", n, len);
    return HM_SUCCESS;
}

/* Receive one message; *fd the first descriptor that came with it (others,
 * which a well-behaved peer never sends, are closed). */
static hm_result_t recv_msg(hm_ipc_channel_t *c, void *buf, size_t cap, size_t *size, int *fd) {
    *fd = -1;
    *size = 0;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = sizeof(ctl.buf)};
    ssize_t n;
    do {
        n = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return hm__errno_result(errno, "recvmsg");
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (*fd < 0) *fd = f;
            else close(f);
        }
    }
    if (n == 0 && !(m.msg_flags & MSG_TRUNC)) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return HM_ERROR_NOT_FOUND; /* orderly shutdown: the peer is gone */
    }
    if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        HM_LOG_ERROR("hm_ipc_channel_recv: message larger than the %zu-byte buffer (or too "
                     "many descriptors); dropped", cap);
        return HM_ERROR_LIMIT;
    }
    *size = (size_t)n;
    return HM_SUCCESS;
}

hm_result_t hm_ipc_channel_send(hm_ipc_channel_t *c, const hm_ipc_handle_t *handle,
                                size_t size) {
    if (!c || !handle || c->listener) {
        HM_LOG_ERROR("hm_ipc_channel_send: %s", c && c->listener ? "listening channel"
                                                                 : "NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_wire_t w;
    hm_result_t r = hm__wire_decode(handle, size, &w);
    if (r) {
        HM_LOG_ERROR("hm_ipc_channel_send: not a valid handle");
        return r;
    }
    if (w.pid != (uint64_t)getpid() || w.nonce != hm__prim_process_nonce()) {
        HM_LOG_ERROR("hm_ipc_channel_send: the handle was not made by this process, so its "
                     "descriptor is not ours to send");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return send_msg(c, handle, w.total_size, (w.flags & HM__WIRE_HAS_FD) ? w.fd : -1);
}

hm_result_t hm_ipc_channel_recv(hm_ipc_channel_t *c, void *buf, size_t cap, size_t *size,
                                int *fd) {
    if (fd) *fd = -1;
    if (size) *size = 0;
    if (!c || !buf || !size || !fd || c->listener) {
        HM_LOG_ERROR("hm_ipc_channel_recv: %s", c && c->listener ? "listening channel"
                                                                 : "NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t r = recv_msg(c, buf, cap, size, fd);
    if (r) return r;
    size_t total;
    r = hm__wire_length(buf, *size, &total);
    if (r == HM_SUCCESS && total != *size) r = HM_ERROR_INVALID_HANDLE;
    if (r) {
        HM_LOG_ERROR("hm_ipc_channel_recv: the %zu-byte message is not a handle", *size);
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return r;
    }
    return HM_SUCCESS;
}

hm_result_t hm_ipc_channel_send_bytes(hm_ipc_channel_t *c, const void *buf, size_t size) {
    if (!c || (!buf && size) || c->listener) return HM_ERROR_INVALID_ARGUMENT;
    return send_msg(c, buf, size, -1);
}

hm_result_t hm_ipc_channel_recv_bytes(hm_ipc_channel_t *c, void *buf, size_t cap, size_t *size) {
    if (!c || !buf || !size || c->listener) return HM_ERROR_INVALID_ARGUMENT;
    int fd;
    hm_result_t r = recv_msg(c, buf, cap, size, &fd);
    if (fd >= 0) close(fd); /* not expected on a plain message */
    return r;
}

hm_result_t hm_ipc_channel_destroy(hm_ipc_channel_t *c) {
    if (!c) return HM_ERROR_INVALID_ARGUMENT;
    close(c->fd);
    /* Remove the socket file only while the path still names it. */
    struct stat st;
    if (c->listener && c->path[0] && c->ino && lstat(c->path, &st) == 0 &&
        S_ISSOCK(st.st_mode) && st.st_dev == c->dev && st.st_ino == c->ino)
        (void)unlink(c->path);
    free(c);
    return HM_SUCCESS;
}
