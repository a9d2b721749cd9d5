/* hetmem IPC tests — driving an ipc_peer process. SPDX-License-Identifier: MIT */
#ifndef HM_TEST_IPC_UTIL_H
#define HM_TEST_IPC_UTIL_H

#include "harness.h"
#include "ipc_proto.h"
#include "pidfd_probe.h"

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct peer {
    hm_ipc_channel_t *ch;
    int sock; /* the channel's socket (inherited by an exec'd producer) */
    pid_t pid;
    int scm; /* handles travel with their fd (SCM_RIGHTS) */
} peer_t;

extern char **environ;

/* Start a program (posix_spawn: no fork handlers run, so this works from a
 * multi-threaded process under TSan). extra_env: "NAME=value" or NULL;
 * close_fd: a descriptor the child must not inherit (or -1). */
static inline pid_t spawn(char *const argv[], const char *extra_env, int close_fd) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof(char *));
    REQUIRE(env);
    memcpy(env, environ, n * sizeof(char *));
    if (extra_env) env[n++] = (char *)extra_env;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (close_fd >= 0) posix_spawn_file_actions_addclose(&fa, close_fd);
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    REQUIRE(e == 0);
    return pid;
}

/* Start ipc_peer with one end of a SOCK_SEQPACKET socketpair. */
static inline void peer_start(peer_t *p, const char *mode) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    p->scm = !strcmp(mode, "scm");
    char fdarg[16];
    snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
    char *argv[] = {(char *)IPC_PEER_PATH, fdarg, (char *)mode, NULL};
    /* scm: prove that the channel alone works */
    p->pid = spawn(argv, p->scm ? "HM_IPC_PIDFD=0" : NULL, sv[0]);
    close(sv[1]);
    p->sock = sv[0];
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], &p->ch));
}

static inline peer_reply_t peer_cmd(peer_t *p, int op, int pool, int slot, uint64_t a,
                                    uint64_t b, uint64_t c) {
    peer_msg_t m = {.op = op, .pool = pool, .slot = slot, .a = a, .b = b, .c = c};
    peer_reply_t r;
    memset(&r, 0, sizeof(r));
    REQUIRE_OK(hm_ipc_channel_send_bytes(p->ch, &m, sizeof(m)));
    size_t n = 0;
    REQUIRE_OK(hm_ipc_channel_recv_bytes(p->ch, &r, sizeof(r), &n));
    REQUIRE(n == sizeof(r));
    return r;
}

/* Send OPEN (or OPEN_CHECK) and the handle: with its fd in scm mode (when
 * the handle is ours), as plain bytes otherwise. */
static inline peer_reply_t peer_open(peer_t *p, int op, int pool, int slot, const void *h,
                                     size_t len, int with_fd) {
    peer_msg_t m = {.op = op, .pool = pool, .slot = slot};
    REQUIRE_OK(hm_ipc_channel_send_bytes(p->ch, &m, sizeof(m)));
    if (with_fd) REQUIRE_OK(hm_ipc_channel_send(p->ch, (const hm_ipc_handle_t *)h, len));
    else REQUIRE_OK(hm_ipc_channel_send_bytes(p->ch, h, len));
    peer_reply_t r;
    size_t n = 0;
    REQUIRE_OK(hm_ipc_channel_recv_bytes(p->ch, &r, sizeof(r), &n));
    REQUIRE(n == sizeof(r));
    return r;
}

static inline int peer_stop(peer_t *p) {
    peer_cmd(p, PEER_EXIT, 0, 0, 0, 0, 0);
    hm_ipc_channel_destroy(p->ch);
    int st = 0;
    waitpid(p->pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline hm_pool_t *shared_pool(void) {
    hm_os_params_t *prm;
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_os_params_create(&prm));
    REQUIRE_OK(hm_os_params_set_visibility(prm, HM_OS_SHARED));
    REQUIRE_OK(hm_os_provider_create(prm, &prov));
    hm_os_params_destroy(prm);
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    return pool;
}

#endif
