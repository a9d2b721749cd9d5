/* hetmem tests — who may use a channel: the listener's socket file is 0600
 * whatever the umask (and the umask is left alone); accept refuses a peer
 * of another uid (SO_PEERCRED) unless hm_ipc_channel_allow_uid() admits it;
 * connect refuses a listener of another uid (not root) unless
 * hm_ipc_channel_connect_uid() names it.
 * SPDX-License-Identifier: MIT
 *
 * The other-user cases need root: a forked child drops to uid/gid 54321
 * (setgroups, setresgid, setresuid) and plays the peer; without root they
 * are skipped with a message and the rest still runs. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_UID 54321u
#define THIRD_UID 54322u

static char dir[] = "/tmp/hm-chan-peers-XXXXXX";

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static mode_t file_mode(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return (mode_t)-1;
    if (!S_ISSOCK(st.st_mode)) return (mode_t)-2;
    return st.st_mode & 07777;
}

/* Log lines at error level, the last one kept. */
static char last_line[1024];
static _Atomic int lines;
static void sink(hm_log_level_t level, const char *line, void *arg) {
    (void)level;
    (void)arg;
    atomic_fetch_add(&lines, 1);
    snprintf(last_line, sizeof(last_line), "%s", line);
}

/* Wait for a child for up to HM_TEST_HANG_SECONDS: its exit status,
 * 128+signal, or -1 (hung, killed). */
static int wait_child(pid_t pid) {
    for (int i = 0; i < HM_TEST_HANG_SECONDS * 100; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void become(uid_t uid) {
    if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0)
        _exit(90);
}

/* ---- same user: mode, umask, round trip ---- */

static void test_socket_file_mode(void) {
    char path[256];
    path_in(path, sizeof(path), "mode.sock");
    static const mode_t masks[] = {0, 022, 077, 0277};
    for (size_t i = 0; i < sizeof(masks) / sizeof(masks[0]); i++) {
        mode_t old = umask(masks[i]);
        hm_ipc_channel_t *l = NULL;
        CHECK_OK(hm_ipc_channel_listen(path, &l));
        mode_t still = umask(old);
        CHECK_MSG(still == masks[i], "listen left the umask alone (0%o, now 0%o)",
                  (unsigned)masks[i], (unsigned)still);
        CHECK_MSG(file_mode(path) == 0600, "umask 0%03o: socket file mode 0%o, expected 0600",
                  (unsigned)masks[i], (unsigned)file_mode(path));
        if (!l) continue;
        /* Our own uid is admitted already: the file stays owner-only. */
        CHECK_OK(hm_ipc_channel_allow_uid(l, (uint32_t)geteuid()));
        CHECK_EQ(file_mode(path), 0600);

        hm_ipc_channel_t *c = NULL, *a = NULL;
        CHECK_OK(hm_ipc_channel_connect(path, &c));
        CHECK_OK(hm_ipc_channel_accept(l, &a));
        if (c && a) {
            char buf[8] = "";
            size_t n = 0;
            CHECK_OK(hm_ipc_channel_send_bytes(a, "hi", 2));
            CHECK_OK(hm_ipc_channel_recv_bytes(c, buf, sizeof(buf), &n));
            CHECK(n == 2 && !memcmp(buf, "hi", 2));
        }
        if (c) CHECK_OK(hm_ipc_channel_destroy(c));
        if (a) CHECK_OK(hm_ipc_channel_destroy(a));
        /* Any uid: connectable by all, still checked at accept. */
        if (i == 0) {
            CHECK_OK(hm_ipc_channel_allow_uid(l, HM_IPC_CHANNEL_ANY_UID));
            CHECK_EQ(file_mode(path), 0666);
        }
        CHECK_OK(hm_ipc_channel_destroy(l));
        CHECK_MSG(access(path, F_OK) != 0, "destroy removed the socket file");
    }
    /* Not on a connected channel; not NULL. */
    CHECK_RES(hm_ipc_channel_allow_uid(NULL, 0), HM_ERROR_INVALID_ARGUMENT);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    hm_ipc_channel_t *p = NULL;
    CHECK_OK(hm_ipc_channel_from_fd(sv[0], &p));
    CHECK_RES(hm_ipc_channel_allow_uid(p, OTHER_UID), HM_ERROR_INVALID_ARGUMENT);
    if (p) CHECK_OK(hm_ipc_channel_destroy(p));
    close(sv[1]);
    /* A socket file that is not ours is not replaced. */
    if (geteuid() == 0) {
        hm_ipc_channel_t *l = NULL;
        REQUIRE_OK(hm_ipc_channel_listen(path, &l));
        REQUIRE(chown(path, OTHER_UID, OTHER_UID) == 0);
        hm_ipc_channel_t *l2 = NULL;
        hm_result_t r = hm_ipc_channel_listen(path, &l2);
        CHECK_MSG(r != HM_SUCCESS, "listen replaced another user's socket file");
        if (l2) hm_ipc_channel_destroy(l2);
        /* allow_uid checks the path still names our socket before chmod. */
        CHECK_RES(hm_ipc_channel_allow_uid(l, OTHER_UID), HM_ERROR_PERMISSION);
        CHECK_OK(hm_ipc_channel_destroy(l));
        unlink(path);
    }
}

/* ---- another user: refused at accept, admitted by allow_uid ---- */

/* Child as `uid`: connect, then expect a message ("ok": exit 0) or the
 * channel closed (exit 10); 11: connect refused with `want_connect`. */
static pid_t peer_connect(const char *path, uid_t uid, hm_result_t want_connect) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    alarm(HM_TEST_HANG_SECONDS);
    become(uid);
    hm_ipc_channel_t *c = NULL;
    hm_result_t r = hm_ipc_channel_connect(path, &c);
    if (r != HM_SUCCESS) _exit(r == want_connect ? 11 : 12);
    char buf[8];
    size_t n = 0;
    r = hm_ipc_channel_recv_bytes(c, buf, sizeof(buf), &n);
    if (r == HM_ERROR_NOT_FOUND) _exit(10);
    _exit(r == HM_SUCCESS && n == 2 && !memcmp(buf, "ok", 2) ? 0 : 13);
}

static void test_accept_refuses_other_user(void) {
    char path[256];
    path_in(path, sizeof(path), "root.sock");
    hm_ipc_channel_t *l = NULL, *a = NULL;
    REQUIRE_OK(hm_ipc_channel_listen(path, &l));

    /* 0600: the other user cannot even connect. */
    CHECK_EQ(wait_child(peer_connect(path, OTHER_UID, HM_ERROR_PERMISSION)), 11);

    /* The file made connectable by hand (as under umask 000 before): the
     * uid check at accept still refuses, and the peer sees the channel closed. */
    REQUIRE(chmod(path, 0666) == 0);
    pid_t pid = peer_connect(path, OTHER_UID, HM_SUCCESS);
    atomic_store(&lines, 0);
    CHECK_RES(hm_ipc_channel_accept(l, &a), HM_ERROR_PERMISSION);
    CHECK(a == NULL);
    CHECK_EQ(atomic_load(&lines), 1);
    char want[64];
    snprintf(want, sizeof(want), "pid %d, uid %u", (int)pid, OTHER_UID);
    CHECK_MSG(strstr(last_line, want) != NULL, "the log line names the peer (%s): %s", want,
              last_line);
    if (a) { /* the old behaviour: accepted; answer so that the child ends */
        hm_ipc_channel_send_bytes(a, "ok", 2);
        hm_ipc_channel_destroy(a);
        a = NULL;
    }
    CHECK_MSG(wait_child(pid) == 10, "the refused peer saw its channel closed");

    /* Admitted: the file becomes 0666 and the peer gets through. */
    CHECK_OK(hm_ipc_channel_allow_uid(l, OTHER_UID));
    CHECK_EQ(file_mode(path), 0666);
    REQUIRE(chmod(path, 0600) == 0); /* allow_uid sets it again only if needed */
    CHECK_OK(hm_ipc_channel_allow_uid(l, OTHER_UID));
    CHECK_EQ(file_mode(path), 0600); /* already admitted: nothing to do */
    REQUIRE(chmod(path, 0666) == 0);
    pid = peer_connect(path, OTHER_UID, HM_SUCCESS);
    CHECK_OK(hm_ipc_channel_accept(l, &a));
    if (a) {
        CHECK_OK(hm_ipc_channel_send_bytes(a, "ok", 2));
        CHECK_OK(hm_ipc_channel_destroy(a));
        a = NULL;
    }
    CHECK_EQ(wait_child(pid), 0);

    /* A third user is still refused, though the file is open to all. */
    pid = peer_connect(path, THIRD_UID, HM_SUCCESS);
    CHECK_RES(hm_ipc_channel_accept(l, &a), HM_ERROR_PERMISSION);
    if (a) {
        hm_ipc_channel_send_bytes(a, "ok", 2);
        hm_ipc_channel_destroy(a);
        a = NULL;
    }
    CHECK_EQ(wait_child(pid), 10);

    /* Any uid admits the third one too. */
    CHECK_OK(hm_ipc_channel_allow_uid(l, HM_IPC_CHANNEL_ANY_UID));
    pid = peer_connect(path, THIRD_UID, HM_SUCCESS);
    CHECK_OK(hm_ipc_channel_accept(l, &a));
    if (a) {
        CHECK_OK(hm_ipc_channel_send_bytes(a, "ok", 2));
        CHECK_OK(hm_ipc_channel_destroy(a));
    }
    CHECK_EQ(wait_child(pid), 0);
    CHECK_OK(hm_ipc_channel_destroy(l));
}

/* ---- a listener of another user: refused at connect unless named ---- */

static void test_connect_refuses_other_listener(void) {
    char sub[256], path[256];
    path_in(sub, sizeof(sub), "u");
    REQUIRE(mkdir(sub, 0700) == 0);
    REQUIRE(chown(sub, OTHER_UID, OTHER_UID) == 0);
    path_in(path, sizeof(path), "u/user.sock");
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) { /* the other user's listener: admits root, answers 4 peers */
        alarm(HM_TEST_HANG_SECONDS);
        close(ready[0]);
        become(OTHER_UID);
        hm_ipc_channel_t *l = NULL;
        if (hm_ipc_channel_listen(path, &l) != HM_SUCCESS) _exit(20);
        if (hm_ipc_channel_allow_uid(l, 0) != HM_SUCCESS) _exit(21);
        if (write(ready[1], "r", 1) != 1) _exit(22);
        for (int i = 0; i < 4; i++) {
            hm_ipc_channel_t *a = NULL;
            if (hm_ipc_channel_accept(l, &a) != HM_SUCCESS) _exit(23);
            (void)hm_ipc_channel_send_bytes(a, "hi", 2); /* the first two are gone */
            hm_ipc_channel_destroy(a);
        }
        hm_ipc_channel_destroy(l);
        _exit(0);
    }
    close(ready[1]);
    char r;
    REQUIRE(read(ready[0], &r, 1) == 1);
    close(ready[0]);

    hm_ipc_channel_t *c = NULL;
    atomic_store(&lines, 0);
    CHECK_RES(hm_ipc_channel_connect(path, &c), HM_ERROR_PERMISSION);
    CHECK(c == NULL);
    char want[64];
    snprintf(want, sizeof(want), "pid %d, uid %u", (int)pid, OTHER_UID);
    CHECK_MSG(strstr(last_line, want) != NULL, "the log line names the listener (%s): %s",
              want, last_line);
    if (c) hm_ipc_channel_destroy(c); /* the old behaviour */
    c = NULL;
    /* Naming a third uid does not admit this one. */
    CHECK_RES(hm_ipc_channel_connect_uid(path, THIRD_UID, &c), HM_ERROR_PERMISSION);
    if (c) hm_ipc_channel_destroy(c);
    c = NULL;

    const uint32_t named[] = {OTHER_UID, HM_IPC_CHANNEL_ANY_UID};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(hm_ipc_channel_connect_uid(path, named[i], &c));
        if (!c) continue;
        char buf[8];
        size_t n = 0;
        CHECK_OK(hm_ipc_channel_recv_bytes(c, buf, sizeof(buf), &n));
        CHECK(n == 2 && !memcmp(buf, "hi", 2));
        CHECK_OK(hm_ipc_channel_destroy(c));
        c = NULL;
    }
    CHECK_EQ(wait_child(pid), 0);
}

int main(void) {
    REQUIRE(mkdtemp(dir) != NULL);
    REQUIRE(chmod(dir, 0755) == 0); /* the other user's processes reach the sockets */
    hm_log_set_sink(sink, NULL);
    hm_log_set_level(HM_LOG_ERROR);
    test_socket_file_mode();
    if (geteuid() == 0) {
        test_accept_refuses_other_user();
        test_connect_refuses_other_listener();
    } else {
        printf("SKIP part: peers of another uid (needs root to switch a child's uid)\n");
    }
    char p[256];
    path_in(p, sizeof(p), "u/user.sock");
    unlink(p);
    path_in(p, sizeof(p), "u");
    rmdir(p);
    rmdir(dir);
    return hm_test_finish();
}
