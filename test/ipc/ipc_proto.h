/* hetmem IPC tests — the command protocol between a test and ipc_peer.
 * SPDX-License-Identifier: MIT
 *
 * The test (producer) drives ipc_peer (consumer, a separate program started
 * with fork+exec) over a SOCK_SEQPACKET socketpair wrapped in an
 * hm_ipc_channel: one peer_msg_t, then for PEER_OPEN one handle message
 * (hm_ipc_channel_send with its fd in "scm" mode, plain bytes in "pidfd"
 * mode); the peer answers every command with one peer_reply_t. */
#ifndef HM_TEST_IPC_PROTO_H
#define HM_TEST_IPC_PROTO_H

#include <stdint.h>

enum {
    PEER_OPEN = 1,   /* pool, slot: open the handle that follows into slot */
    PEER_WRITE,      /* slot, a = offset, b = byte, c = length */
    PEER_READ,       /* slot, a = offset -> v[0] = byte there */
    PEER_CLOSE,      /* slot */
    PEER_STATS,      /* -> v: entries, bytes, in_use, hits, misses, evictions, stale */
    PEER_LIMIT,      /* a = max entries, b = max bytes */
    PEER_DESTROY,    /* pool: destroy it (open mappings included), then re-create it */
    PEER_INFO,       /* slot -> v[0] = imported flag, v[1] = pool index or -1, v[2] = size */
    PEER_OPEN_CHECK, /* like OPEN but the result is only reported (bad-input tests) */
    PEER_EXIT,
};

#define PEER_POOLS 4
#define PEER_SLOTS 4096

typedef struct peer_msg {
    int32_t op, pool, slot, pad;
    uint64_t a, b, c;
} peer_msg_t;

typedef struct peer_reply {
    int32_t result, pad;
    uint64_t v[8];
} peer_reply_t;

#endif
