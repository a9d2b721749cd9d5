/* hetmem example: the producer side of IPC.
 * SPDX-License-Identifier: MIT
 *
 *   ipc_producer <socket-path> [buffers]     (then, elsewhere: ipc_consumer <socket-path>)
 *
 * Allocates buffers through a pool over the OS provider in shared (memfd)
 * mode, exports each as an IPC handle, and serves the handles on a unix
 * socket: each handle travels as bytes together with its memfd (SCM_RIGHTS),
 * so the consumer can open it through pidfd_getfd or, where that is refused,
 * through the descriptor that came along. The consumer writes into every
 * buffer and answers; the producer then verifies the bytes in its own memory
 * and prints what moved and how. Exits 0 only if every buffer checks out. */
#include <hetmem/hetmem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF_SIZE (1u << 20)

static int fail(const char *what, hm_result_t r) {
    const char *msg = NULL;
    int64_t code = hm_last_native_error(&msg);
    fprintf(stderr, "ipc_producer: %s: %s", what, hm_result_string(r));
    if (code) fprintf(stderr, " (%s: %lld)", msg ? msg : "native error", (long long)code);
    fprintf(stderr, "\n");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ipc_producer <socket-path> [buffers]\n");
        return 77; /* run as a CTest with no arguments: nothing to serve */
    }
    int n = argc > 2 ? atoi(argv[2]) : 4;
    if (n < 1 || n > 64) n = 4;

    hm_os_params_t *params;
    hm_provider_t *provider;
    hm_pool_t *pool;
    hm_result_t r;
    if ((r = hm_os_params_create(&params))) return fail("params", r);
    hm_os_params_set_visibility(params, HM_OS_SHARED);
    hm_os_params_set_shm_name(params, "hetmem-ipc-demo");
    r = hm_os_provider_create(params, &provider);
    hm_os_params_destroy(params);
    if (r) return fail("OS provider (shared)", r);
    if ((r = hm_proxy_pool_create(provider, HM_POOL_FLAG_OWN_PROVIDER, &pool)))
        return fail("pool", r);

    unsigned char *buf[64];
    for (int i = 0; i < n; i++) {
        if (!(buf[i] = hm_pool_malloc(pool, BUF_SIZE))) return fail("hm_pool_malloc", HM_ERROR_OUT_OF_MEMORY);
        memset(buf[i], 0, BUF_SIZE);
    }

    hm_ipc_channel_t *listener, *ch;
    if ((r = hm_ipc_channel_listen(argv[1], &listener))) return fail("listen", r);
    printf("producer pid %d: %d buffers of %u KiB in a memfd-backed pool; waiting for a "
           "consumer on %s\n", (int)getpid(), n, BUF_SIZE / 1024, argv[1]);
    fflush(stdout);
    if ((r = hm_ipc_channel_accept(listener, &ch))) return fail("accept", r);

    int32_t count = n;
    hm_ipc_channel_send_bytes(ch, &count, sizeof(count));
    hm_ipc_handle_t *h[64];
    for (int i = 0; i < n; i++) {
        size_t len;
        /* an interior pointer: the consumer gets the same offset back */
        if ((r = hm_ipc_get(buf[i] + 64, &h[i], &len))) return fail("hm_ipc_get", r);
        hm_ipc_handle_info_t info;
        hm_ipc_handle_info(h[i], len, &info);
        printf("  export #%d: %p = base 0x%llx + %llu, allocation id %llu, %llu bytes -> "
               "a %zu-byte handle (%zu-byte provider payload)%s\n",
               i, (void *)(buf[i] + 64), (unsigned long long)info.base,
               (unsigned long long)info.offset, (unsigned long long)info.allocation_id,
               (unsigned long long)info.size, len, info.payload_size,
               info.has_fd ? " + its memfd" : "");
        if ((r = hm_ipc_channel_send(ch, h[i], len))) return fail("send", r);
    }
    fflush(stdout);

    /* The consumer writes "consumer <pid> was here: buffer i" and fills the
     * rest of the buffer with (i + 1); then it tells us how it opened. */
    char how[256] = {0};
    size_t got = 0;
    if ((r = hm_ipc_channel_recv_bytes(ch, how, sizeof(how) - 1, &got))) return fail("recv", r);
    printf("consumer reports: %s\n", how);

    int bad = 0;
    for (int i = 0; i < n; i++) {
        char expect[64];
        unsigned char *p = buf[i] + 64;
        size_t at = strlen((const char *)p) + 1;
        snprintf(expect, sizeof(expect), "was here: buffer %d", i);
        int ok = strstr((const char *)p, expect) != NULL;
        for (size_t k = at; k < BUF_SIZE - 64; k++) ok &= p[k] == (unsigned char)(i + 1);
        printf("  verify #%d: \"%s\" + %zu bytes of 0x%02x: %s\n", i, (const char *)p,
               (size_t)(BUF_SIZE - 64 - at), i + 1, ok ? "OK" : "WRONG");
        bad += !ok;
        hm_ipc_put(h[i]);
    }
    int32_t verdict = bad;
    hm_ipc_channel_send_bytes(ch, &verdict, sizeof(verdict));
    hm_ipc_channel_destroy(ch);
    hm_ipc_channel_destroy(listener);
    for (int i = 0; i < n; i++) hm_pool_free(pool, buf[i]);
    hm_pool_destroy(pool);
    printf("producer: %s\n", bad ? "FAILED" : "every byte the consumer wrote is here");
    return bad ? 1 : 0;
}
