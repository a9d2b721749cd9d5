/* hetmem IPC tests — the consumer process: opens handles sent by a test.
 * SPDX-License-Identifier: MIT
 *
 * ipc_peer <socket fd> <pidfd|scm>
 * Owns PEER_POOLS proxy pools over OS providers (any mode opens memfd
 * handles) and PEER_SLOTS opened pointers; executes peer_msg_t commands. */
#include "ipc_proto.h"

#include <hetmem/hetmem.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static hm_pool_t *pools[PEER_POOLS];
static void *slots[PEER_SLOTS];
static unsigned char buf[4096 + 256];

static int file_mode; /* "file": the pools have file providers (file-family handles) */

static hm_pool_t *make_pool(void) {
    if (file_mode) {
        static unsigned seq;
        char path[128];
        snprintf(path, sizeof(path), "/tmp/hm_ipc_peer_%d_%u", (int)getpid(), seq++);
        hm_provider_t *prov;
        hm_pool_t *pool;
        if (hm_file_provider_create(path, &prov)) return NULL;
        unlink(path); /* these pools only import: nothing needs the name */
        if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool)) return NULL;
        return pool;
    }
    hm_os_params_t *p;
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_os_params_create(&p)) return NULL;
    hm_os_params_set_visibility(p, HM_OS_SHARED);
    hm_result_t r = hm_os_provider_create(p, &prov);
    hm_os_params_destroy(p);
    if (r) return NULL;
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool)) return NULL;
    return pool;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: ipc_peer <socket fd> <pidfd|scm>\n");
        return 2;
    }
    int scm = !strcmp(argv[2], "scm");
    file_mode = !strcmp(argv[2], "file");
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(atoi(argv[1]), &ch)) return 3;
    for (int i = 0; i < PEER_POOLS; i++)
        if (!(pools[i] = make_pool())) return 4;
    for (;;) {
        peer_msg_t m;
        size_t n;
        if (hm_ipc_channel_recv_bytes(ch, &m, sizeof(m), &n) || n != sizeof(m)) break;
        peer_reply_t rep;
        memset(&rep, 0, sizeof(rep));
        int slot = m.slot >= 0 && m.slot < PEER_SLOTS ? m.slot : 0;
        int pi = m.pool >= 0 && m.pool < PEER_POOLS ? m.pool : 0;
        switch (m.op) {
        case PEER_OPEN:
        case PEER_OPEN_CHECK: {
            int fd = -1;
            size_t len;
            hm_result_t r = hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd);
            if (r) { /* a malformed handle arrives as bytes */
                rep.result = r;
                break;
            }
            void *p = NULL;
            r = scm ? hm_ipc_open_fd(pools[pi], (const hm_ipc_handle_t *)buf, len, fd, &p)
                    : hm_ipc_open(pools[pi], (const hm_ipc_handle_t *)buf, len, &p);
            if (fd >= 0) close(fd);
            rep.result = r;
            rep.v[0] = (uint64_t)(uintptr_t)p;
            if (r == HM_SUCCESS && m.op == PEER_OPEN) slots[slot] = p;
            else if (r == HM_SUCCESS) hm_ipc_close(p);
            break;
        }
        case PEER_WRITE:
            memset((char *)slots[slot] + m.a, (int)m.b, m.c);
            break;
        case PEER_READ:
            rep.v[0] = ((unsigned char *)slots[slot])[m.a];
            break;
        case PEER_CLOSE:
            rep.result = hm_ipc_close(slots[slot]);
            slots[slot] = NULL;
            break;
        case PEER_STATS: {
            hm_ipc_cache_stats_t st;
            rep.result = hm_ipc_get_cache_stats(&st);
            rep.v[0] = st.entries;
            rep.v[1] = st.bytes;
            rep.v[2] = st.in_use;
            rep.v[3] = st.hits;
            rep.v[4] = st.misses;
            rep.v[5] = st.evictions;
            rep.v[6] = st.stale;
            break;
        }
        case PEER_LIMIT:
            rep.result = hm_ipc_set_cache_limits(m.a, m.b);
            break;
        case PEER_DESTROY:
            rep.result = hm_pool_destroy(pools[pi]);
            /* every pointer opened through it is gone from the tracker */
            for (int s = 0; s < PEER_SLOTS; s++)
                if (slots[s] && !hm_pool_by_ptr(slots[s])) {
                    /* and unmapped: mincore fails with ENOMEM */
                    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
                    unsigned char vec;
                    errno = 0;
                    if (mincore((void *)((uintptr_t)slots[s] & ~(pg - 1)), 1, &vec) == -1 &&
                        errno == ENOMEM)
                        rep.v[1]++;
                    slots[s] = NULL;
                    rep.v[0]++;
                }
            pools[pi] = make_pool();
            if (!pools[pi]) rep.result = HM_ERROR_OUT_OF_HOST_MEMORY;
            break;
        case PEER_INFO: {
            hm_allocation_info_t info;
            rep.result = hm_allocation_info(slots[slot], &info);
            rep.v[0] = (info.flags & HM_ALLOCATION_IMPORTED) != 0;
            rep.v[1] = (uint64_t)-1;
            for (int i = 0; i < PEER_POOLS; i++)
                if (hm_pool_by_ptr(slots[slot]) == pools[i]) rep.v[1] = (uint64_t)i;
            rep.v[2] = info.size;
            rep.v[3] = (uint64_t)hm_free(slots[slot]); /* refused: still mapped */
            rep.v[4] = (uint64_t)hm_pool_free(pools[pi], slots[slot]);
            break;
        }
        case PEER_EXIT:
            hm_ipc_channel_send_bytes(ch, &rep, sizeof(rep));
            goto out;
        default:
            rep.result = HM_ERROR_INVALID_ARGUMENT;
        }
        if (hm_ipc_channel_send_bytes(ch, &rep, sizeof(rep))) break;
    }
out:
    for (int i = 0; i < PEER_POOLS; i++)
        if (pools[i]) hm_pool_destroy(pools[i]);
    hm_ipc_channel_destroy(ch);
    return 0;
}
