/* hetmem benchmark: pools and IPC over Level Zero device memory, against
 * the driver called directly. SPDX-License-Identifier: MIT
 *
 * Cases (ns per op):
 *   alloc+free N      hm_pool_malloc + hm_pool_free of N bytes (64 B .. 4 MiB)
 *                     from a native pool over the Level Zero provider's
 *                     device memory; baseline "ze-raw": zeMemAllocDevice +
 *                     zeMemFree of N bytes through the loader.
 *   open+close (hit)  hm_ipc_open + hm_ipc_close of a handle whose mapping is
 *                     cached; baseline "ze-raw": zeMemOpenIpcHandle +
 *                     zeMemCloseIpcHandle of the same allocation (what a
 *                     program without a cache does for each use).
 *   open+close (miss) the cache bound at one mapping and two handles used in
 *                     turn: every open maps through the driver (fd fetch,
 *                     zeMemOpenIpcHandle, tracker), every close evicts;
 *                     baseline the same "ze-raw".
 * An exporter process (this program exec'd) allocates the memory, exports it
 * and sends the handles and descriptors.
 *
 * Which driver: the machine's (an Intel GPU), or the project's test driver
 * with ZE_ENABLE_ALT_DRIVERS=<build>/test/level_zero/libze_test.so.1. On the
 * test driver the driver's own costs are simulated (memfd + mmap per
 * allocation, no device), so the ratios show hetmem's overhead against a
 * driver of that cost, not against a GPU's; the program says which it ran on.
 * Without a driver every case is skipped. */
#include "harness.h"

#include <hetmem/hetmem.h>
#include <hetmem/providers/level_zero.h>
#include <level_zero/ze_api.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define IPC_SIZE (2 * MIB)

static struct {
    __typeof__(zeDriverGet) *driver_get;
    __typeof__(zeDeviceGet) *device_get;
    __typeof__(zeContextCreate) *ctx_create;
    __typeof__(zeMemAllocDevice) *alloc;
    __typeof__(zeMemFree) *free;
    __typeof__(zeMemGetIpcHandle) *get_ipc;
    __typeof__(zeMemOpenIpcHandle) *open_ipc;
    __typeof__(zeMemCloseIpcHandle) *close_ipc;
    ze_context_handle_t ctx;
    ze_device_handle_t dev;
} ze;

/* The loader the provider opened, and a context of our own for the raw baselines. */
static int ze_raw_init(void) {
    void *l = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!l) return -1;
    ze.driver_get = (__typeof__(ze.driver_get))dlsym(l, "zeDriverGet");
    ze.device_get = (__typeof__(ze.device_get))dlsym(l, "zeDeviceGet");
    ze.ctx_create = (__typeof__(ze.ctx_create))dlsym(l, "zeContextCreate");
    ze.alloc = (__typeof__(ze.alloc))dlsym(l, "zeMemAllocDevice");
    ze.free = (__typeof__(ze.free))dlsym(l, "zeMemFree");
    ze.get_ipc = (__typeof__(ze.get_ipc))dlsym(l, "zeMemGetIpcHandle");
    ze.open_ipc = (__typeof__(ze.open_ipc))dlsym(l, "zeMemOpenIpcHandle");
    ze.close_ipc = (__typeof__(ze.close_ipc))dlsym(l, "zeMemCloseIpcHandle");
    if (!ze.driver_get || !ze.device_get || !ze.ctx_create || !ze.alloc || !ze.free ||
        !ze.get_ipc || !ze.open_ipc || !ze.close_ipc)
        return -1;
    uint32_t n = 1;
    ze_driver_handle_t drv;
    if (ze.driver_get(&n, &drv) != ZE_RESULT_SUCCESS || !n) return -1;
    n = 1;
    if (ze.device_get(drv, &n, &ze.dev) != ZE_RESULT_SUCCESS || !n) return -1;
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    return ze.ctx_create(drv, &cd, &ze.ctx) == ZE_RESULT_SUCCESS ? 0 : -1;
}

/* ---- alloc + free ---- */

static hm_pool_t *g_pool;
static hm_provider_t *g_prov;

static int pool_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    size_t n = *(const size_t *)arg;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = hm_pool_malloc(g_pool, n);
        if (!p) return 1;
        hm_bench_escape(p);
        if (hm_pool_free(g_pool, p) != HM_SUCCESS) return 1;
    }
    return 0;
}
static int raw_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    size_t n = *(const size_t *)arg;
    ze_device_mem_alloc_desc_t dd = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
    for (uint64_t i = 0; i < iters; i++) {
        void *p = NULL;
        if (ze.alloc(ze.ctx, &dd, n, 0, ze.dev, &p) != ZE_RESULT_SUCCESS) return 1;
        hm_bench_escape(p);
        if (ze.free(ze.ctx, p) != ZE_RESULT_SUCCESS) return 1;
    }
    return 0;
}

/* ---- IPC: the exporter, and what it sent ---- */

typedef struct received {
    unsigned char hm[2][4096]; /* hetmem handles */
    size_t hm_len[2];
    int hm_fd[2];
    ze_ipc_mem_handle_t raw;  /* a raw handle of a third allocation, fd translated */
} received_t;
static received_t g_rx;
static hm_pool_t *g_ipool;

static int send_fd(int sock, const void *bytes, size_t len, int fd) {
    struct iovec iov = {.iov_base = (void *)bytes, .iov_len = len};
    char cbuf[CMSG_SPACE(sizeof(int))] = {0};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &m, 0) == (ssize_t)len ? 0 : -1;
}
static int recv_fd(int sock, void *bytes, size_t cap, int *fd) {
    struct iovec iov = {.iov_base = bytes, .iov_len = cap};
    char cbuf[CMSG_SPACE(sizeof(int))] = {0};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof(cbuf)};
    ssize_t n = recvmsg(sock, &m, 0);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (n <= 0 || !c || c->cmsg_type != SCM_RIGHTS) return -1;
    memcpy(fd, CMSG_DATA(c), sizeof(int));
    return (int)n;
}

static int exporter(int sock) {
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_level_zero_provider_create(NULL, &prov) != HM_SUCCESS) return 10;
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) return 11;
    for (int i = 0; i < 2; i++) {
        void *p = hm_pool_malloc(pool, IPC_SIZE);
        hm_ipc_handle_t *h;
        size_t len;
        if (!p || hm_ipc_get(p, &h, &len) != HM_SUCCESS) return 12;
        /* The channel sends the handle with its descriptor. */
        hm_ipc_channel_t *ch;
        int dupfd = dup(sock);
        if (dupfd < 0 || hm_ipc_channel_from_fd(dupfd, &ch) != HM_SUCCESS) return 13;
        if (hm_ipc_channel_send(ch, h, len) != HM_SUCCESS) return 14;
        hm_ipc_channel_destroy(ch);
    }
    if (ze_raw_init() != 0) return 15;
    ze_device_mem_alloc_desc_t dd = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
    void *raw = NULL;
    ze_ipc_mem_handle_t rh;
    if (ze.alloc(ze.ctx, &dd, IPC_SIZE, 0, ze.dev, &raw) != ZE_RESULT_SUCCESS) return 16;
    if (ze.get_ipc(ze.ctx, raw, &rh) != ZE_RESULT_SUCCESS) return 17;
    int64_t fd;
    memcpy(&fd, rh.data, sizeof(fd));
    if (send_fd(sock, &rh, sizeof(rh), (int)fd) != 0) return 18;
    char done;
    if (read(sock, &done, 1) < 0) return 19; /* until the benchmark is over */
    return 0;
}

static pid_t start_exporter(const char *self, int *sock_out) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        char arg[16];
        snprintf(arg, sizeof(arg), "%d", sv[1]);
        execl(self, self, "--exporter", arg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    hm_ipc_channel_t *ch;
    int dupfd = dup(sv[0]);
    if (dupfd < 0 || hm_ipc_channel_from_fd(dupfd, &ch) != HM_SUCCESS) return -1;
    for (int i = 0; i < 2; i++) {
        g_rx.hm_fd[i] = -1;
        if (hm_ipc_channel_recv(ch, g_rx.hm[i], sizeof(g_rx.hm[i]), &g_rx.hm_len[i],
                                &g_rx.hm_fd[i]) != HM_SUCCESS)
            return -1;
    }
    hm_ipc_channel_destroy(ch);
    int fd = -1;
    if (recv_fd(sv[0], &g_rx.raw, sizeof(g_rx.raw), &fd) != (int)sizeof(g_rx.raw)) return -1;
    int64_t f = fd;
    memcpy(g_rx.raw.data, &f, sizeof(f)); /* the importer's copy of the descriptor */
    *sock_out = sv[0];
    return pid;
}

static int open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    int two = *(const int *)arg; /* miss case: two handles in turn */
    for (uint64_t i = 0; i < iters; i++) {
        int k = two ? (int)(i & 1) : 0;
        void *p = NULL;
        if (hm_ipc_open_fd(g_ipool, (const hm_ipc_handle_t *)g_rx.hm[k], g_rx.hm_len[k],
                           g_rx.hm_fd[k], &p) != HM_SUCCESS)
            return 1;
        hm_bench_escape(p);
        if (hm_ipc_close(p) != HM_SUCCESS) return 1;
    }
    return 0;
}
static int open_setup(const void *arg, void **ctx) {
    (void)ctx;
    return hm_ipc_set_cache_limits(*(const int *)arg ? 1 : 4096, 0) == HM_SUCCESS ? 0 : 1;
}
static int raw_open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx, (void)arg;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = NULL;
        if (ze.open_ipc(ze.ctx, ze.dev, g_rx.raw, 0, &p) != ZE_RESULT_SUCCESS) return 1;
        hm_bench_escape(p);
        if (ze.close_ipc(ze.ctx, p) != ZE_RESULT_SUCCESS) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--exporter") == 0) return exporter(atoi(argv[2]));
    int code = 0;
    hm_bench_t *b = hm_bench_create("level_zero", &argc, argv, &code);
    if (!b) return code;
    hm_result_t r = hm_level_zero_provider_create(NULL, &g_prov);
    if (r != HM_SUCCESS) {
        printf("bench_level_zero: no Level Zero driver (%s): skipped (set ZE_ENABLE_ALT_DRIVERS "
               "to the test driver to measure hetmem's own overhead)\n", hm_result_string(r));
        hm_bench_finish(b);
        return 77;
    }
    const char *alt = getenv("ZE_ENABLE_ALT_DRIVERS");
    printf("bench_level_zero: driver %s\n",
           alt && *alt ? "= the project's test driver (driver costs simulated: memfd + mmap)"
                       : "= the machine's Level Zero driver");
    if (ze_raw_init() != 0 ||
        hm_native_pool_create(g_prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_pool) != HM_SUCCESS) {
        fprintf(stderr, "bench_level_zero: set-up failed\n");
        return 1;
    }
    static const hm_bench_impl_t subject = {"hetmem-native", NULL, pool_run, NULL};
    static const hm_bench_impl_t raw = {"ze-raw", NULL, raw_run, NULL};
    static const size_t sizes[] = {64, 4096, 65536, MIB, 4 * MIB};
    static const char *names[] = {"alloc+free 64 B", "alloc+free 4 KiB", "alloc+free 64 KiB",
                                  "alloc+free 1 MiB", "alloc+free 4 MiB"};
    for (size_t i = 0; i < 5; i++) hm_bench_case(b, names[i], &sizes[i], 1, &subject, &raw, 1);

    int sock = -1;
    pid_t pid = start_exporter(argv[0], &sock);
    hm_provider_t *ip;
    if (pid > 0 && hm_level_zero_provider_create(NULL, &ip) == HM_SUCCESS &&
        hm_native_pool_create(ip, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_ipool) == HM_SUCCESS) {
        static const int hit = 0, miss = 1;
        static const hm_bench_impl_t open_s = {"hetmem", open_setup, open_run, NULL};
        static const hm_bench_impl_t open_raw = {"ze-raw", NULL, raw_open_run, NULL};
        hm_bench_case(b, "open+close (hit)", &hit, 1, &open_s, &open_raw, 1);
        hm_bench_case(b, "open+close (miss)", &miss, 1, &open_s, &open_raw, 1);
        hm_ipc_set_cache_limits(4096, 0);
        hm_pool_destroy(g_ipool);
    } else {
        fprintf(stderr, "bench_level_zero: no exporter: the IPC cases did not run\n");
    }
    if (sock >= 0) {
        char done = 1;
        (void)!write(sock, &done, 1);
        close(sock);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
    hm_pool_destroy(g_pool);
    return hm_bench_finish(b);
}
