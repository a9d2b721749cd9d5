/* hetmem tests — what the hostile-peer tests share: a second user, a
 * channel between two forked processes, and re-sealing a handle whose
 * fields a hostile exporter rewrote (its checksum). The OS provider's
 * payload layout is written out here as a hostile peer would learn it.
 * SPDX-License-Identifier: MIT */
#ifndef HM_TEST_HOSTILE_UTIL_H
#define HM_TEST_HOSTILE_UTIL_H

#include "harness.h"
#include "ipc/wire.h"

#include <grp.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* The uid the tests switch to for "another user" (no account needed). */
#define HOSTILE_OTHER_UID 54321u

/* The OS provider's payload (src/providers/os/os.c). */
typedef struct hostile_os_payload {
    uint32_t magic;
    uint16_t version, page_kind;
    int32_t fd;
    uint32_t reserved;
    uint64_t offset, size, base, page_size, dev, ino;
} hostile_os_payload_t;

/* Become another user in this (forked) process: 0 on success. */
static inline int hostile_become(uint32_t uid) {
    if (setgroups(0, NULL) != 0) return -1;
    if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) return -1;
    return 0;
}

/* Recompute the checksum of a handle whose bytes were rewritten. */
static inline void hostile_reseal(unsigned char *h) {
    uint32_t plen = hm__wire_peek32(h, HM__WIRE_OFF_FLAGS + 4);
    uint32_t crc = hm__wire_checksum(h, plen);
    for (int i = 0; i < 4; i++) h[HM__WIRE_CRC_OFF + i] = (unsigned char)(crc >> (8 * i));
}

static inline void hostile_put64(unsigned char *h, unsigned off, uint64_t v) {
    for (int i = 0; i < 8; i++) h[off + i] = (unsigned char)(v >> (8 * i));
}

/* The peer's side of a test: runs in a forked child, as another user when
 * other_user; its result is the child's exit status (0: all well). */
typedef int (*hostile_peer_fn)(hm_ipc_channel_t *c, int other_user);

/* Fork the peer, connected to this process by a channel (SOCK_SEQPACKET):
 * *mine is this side's end. */
static inline pid_t hostile_fork(hostile_peer_fn peer, int other_user, hm_ipc_channel_t **mine) {
    int sv[2];
    hm_ipc_channel_t *theirs;
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], mine));
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[1], &theirs));
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        hm_ipc_channel_destroy(*mine);
        _exit(peer(theirs, other_user));
    }
    hm_ipc_channel_destroy(theirs);
    return pid;
}

/* Close this side's end (the peer sees the channel end) and check that
 * the peer exited 0. */
static inline void hostile_join(pid_t pid, hm_ipc_channel_t *mine) {
    hm_ipc_channel_destroy(mine);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "peer: status %#x", status);
}

/* Send / receive one 64-bit word. */
static inline int hostile_send64(hm_ipc_channel_t *c, uint64_t v) {
    return hm_ipc_channel_send_bytes(c, &v, sizeof v) == HM_SUCCESS ? 0 : -1;
}
static inline int hostile_recv64(hm_ipc_channel_t *c, uint64_t *v) {
    size_t n = 0;
    return hm_ipc_channel_recv_bytes(c, v, sizeof *v, &n) == HM_SUCCESS && n == sizeof *v ? 0
                                                                                         : -1;
}

#endif
