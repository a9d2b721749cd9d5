/* hetmem example: the consumer side of IPC.
 * SPDX-License-Identifier: MIT
 *
 *   ipc_consumer <socket-path>      (the producer: ipc_producer <socket-path>)
 *
 * Connects to the producer, receives its handles, opens each through a pool
 * of its own (same provider family: the OS provider), writes into the
 * producer's memory, and tells the producer how the memory arrived: through
 * pidfd_getfd (hm_ipc_open) or, where the kernel refuses that, through the
 * memfd that came with the handle (hm_ipc_open_fd). */
#include <hetmem/hetmem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fail(const char *what, hm_result_t r) {
    fprintf(stderr, "ipc_consumer: %s: %s\n", what, hm_result_string(r));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ipc_consumer <socket-path>\n");
        return 77;
    }
    hm_ipc_channel_t *ch = NULL;
    hm_result_t r = HM_ERROR_NOT_FOUND;
    for (int tries = 0; tries < 100 && r; tries++) { /* the producer may start later */
        r = hm_ipc_channel_connect(argv[1], &ch);
        if (r) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    if (r) return fail("connect", r);

    hm_provider_t *provider;
    hm_pool_t *pool;
    /* An IPC-capable OS provider (shared mode) opens memfd handles; the
     * mapping is the producer's memory. */
    hm_os_params_t *params;
    if ((r = hm_os_params_create(&params))) return fail("params", r);
    hm_os_params_set_visibility(params, HM_OS_SHARED);
    r = hm_os_provider_create(params, &provider);
    hm_os_params_destroy(params);
    if (r) return fail("provider", r);
    if ((r = hm_proxy_pool_create(provider, HM_POOL_FLAG_OWN_PROVIDER, &pool)))
        return fail("pool", r);

    int32_t n = 0;
    size_t got;
    if ((r = hm_ipc_channel_recv_bytes(ch, &n, sizeof(n), &got)) || n < 1 || n > 64)
        return fail("recv count", r ? r : HM_ERROR_INVALID_ARGUMENT);
    int via_pidfd = 0, via_scm = 0;
    void *ptr[64];
    size_t size[64];
    for (int i = 0; i < n; i++) {
        unsigned char h[4096];
        size_t len;
        int fd = -1;
        if ((r = hm_ipc_channel_recv(ch, h, sizeof(h), &len, &fd))) return fail("recv handle", r);
        hm_ipc_handle_info_t info;
        hm_ipc_handle_info((const hm_ipc_handle_t *)h, len, &info);
        /* First choice: fetch the descriptor ourselves (pidfd_getfd). */
        r = hm_ipc_open(pool, (const hm_ipc_handle_t *)h, len, &ptr[i]);
        const char *how = "pidfd_getfd";
        if (r == HM_ERROR_PERMISSION || r == HM_ERROR_NOT_SUPPORTED) {
            r = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)h, len, fd, &ptr[i]);
            how = "the memfd received over the socket (SCM_RIGHTS)";
            via_scm++;
        } else {
            via_pidfd++;
        }
        if (fd >= 0) close(fd);
        if (r) return fail("open", r);
        hm_allocation_info_t ai;
        hm_allocation_info(ptr[i], &ai);
        size[i] = (size_t)(info.size - info.offset);
        printf("  open #%d: producer pid %llu's 0x%llx (+%llu) is %p here, via %s; pool %s, "
               "imported=%s\n", i, (unsigned long long)info.exporter_pid,
               (unsigned long long)info.base, (unsigned long long)info.offset, ptr[i], how,
               hm_pool_by_ptr(ptr[i]) == pool ? "ours" : "?",
               (ai.flags & HM_ALLOCATION_IMPORTED) ? "yes" : "no");
        int k = snprintf(ptr[i], 64, "consumer %d was here: buffer %d", (int)getpid(), i);
        memset((char *)ptr[i] + k + 1, i + 1, size[i] - (size_t)k - 1);
    }
    char how[256];
    snprintf(how, sizeof(how), "consumer pid %d opened %d handles: %d via pidfd_getfd, %d via "
             "SCM_RIGHTS, and wrote every byte", (int)getpid(), n, via_pidfd, via_scm);
    hm_ipc_channel_send_bytes(ch, how, strlen(how) + 1);
    int32_t verdict = -1;
    hm_ipc_channel_recv_bytes(ch, &verdict, sizeof(verdict), &got);
    for (int i = 0; i < n; i++) hm_ipc_close(ptr[i]);
    hm_ipc_channel_destroy(ch);
    hm_pool_destroy(pool);
    printf("consumer: the producer %s\n", verdict == 0 ? "verified every buffer" : "found errors");
    return verdict == 0 ? 0 : 1;
}
