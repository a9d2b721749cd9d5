/* hetmem benchmark: pools and IPC over CUDA device memory, against the
 * driver called directly. SPDX-License-Identifier: MIT
 *
 * Cases (ns per op):
 *   alloc+free N      hm_pool_malloc + hm_pool_free of N bytes (64 B .. 64 MiB)
 *                     from a native pool over the CUDA provider's device
 *                     memory; baselines "cuMemAlloc": cuMemAlloc_v2 +
 *                     cuMemFree_v2 of N bytes, and "cuMemAllocAsync":
 *                     cuMemAllocAsync + cuMemFreeAsync on the legacy stream
 *                     from the device's default memory pool (the driver's own
 *                     caching allocator), each followed by cuStreamSynchronize
 *                     every 64 pairs.
 *   stream alloc+free 1 MiB, one stream / two streams
 *                     hm_pool_malloc_async + hm_pool_free_async on one
 *                     created stream, or alternating between two, from the
 *                     same native pool; baseline "cuMemAllocAsync":
 *                     cuMemAllocAsync + cuMemFreeAsync on the same streams
 *                     from the device's default pool with its release
 *                     threshold at the maximum (as RMM sets it; where the
 *                     driver has cuMemPoolSetAttribute); both synchronise
 *                     their streams every 64 pairs.
 *   open+close (hit)  hm_ipc_open + hm_ipc_close of a handle whose mapping is
 *                     cached; baseline: cuIpcOpenMemHandle_v2 +
 *                     cuIpcCloseMemHandle of the same allocation.
 *   open+close (miss) the cache bound at one mapping, two handles in turn.
 * After the table: the driver calls one alloc and one free make through the
 * provider (counted by the project's test driver only; a real driver is not
 * counted).
 *
 * Which driver: the machine's libcuda.so.1, or the project's test driver
 * (HM_CUDA_DRIVER=<build>/test/cuda/driver/libcuda.so.1), whose costs are
 * simulated (a memfd and mmaps per allocation, one lock): the program says
 * which. Without a driver every case is skipped. An exporter process (this
 * program exec'd) makes the IPC handles. */
#include "harness.h"

#include <hetmem/hetmem.h>
#include <hetmem/providers/cuda.h>
#include <hetmem/stream.h>

#include "providers/cuda/cuda_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define IPC_SIZE (2 * MIB)

typedef struct CUmemPoolHandle_st *cu_pool_t;
static struct {
    hm_cu_result_t (*alloc)(hm_cu_ptr_t *, size_t);
    hm_cu_result_t (*free)(hm_cu_ptr_t);
    hm_cu_result_t (*alloc_async)(hm_cu_ptr_t *, size_t, hm_cu_stream_t);
    hm_cu_result_t (*free_async)(hm_cu_ptr_t, hm_cu_stream_t);
    hm_cu_result_t (*sync)(hm_cu_stream_t);
    hm_cu_result_t (*ipc_get)(hm_cu_ipc_handle_t *, hm_cu_ptr_t);
    hm_cu_result_t (*ipc_open)(hm_cu_ptr_t *, hm_cu_ipc_handle_t, unsigned int);
    hm_cu_result_t (*ipc_close)(hm_cu_ptr_t);
    hm_cu_result_t (*retain)(hm_cu_context_t *, hm_cu_device_t);
    hm_cu_result_t (*set)(hm_cu_context_t);
    hm_cu_result_t (*stream_create)(hm_cu_stream_t *, unsigned);
    hm_cu_result_t (*default_pool)(cu_pool_t *, hm_cu_device_t);
    hm_cu_result_t (*pool_set)(cu_pool_t, int, void *);
    uint64_t (*calls)(const char *);   /* the test driver's control API, or NULL */
    void (*reset)(void);
} cu;

static int cu_raw_init(void) {
    const char *path = getenv("HM_CUDA_DRIVER");
    void *l = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!l) return -1;
    *(void **)&cu.alloc = dlsym(l, "cuMemAlloc_v2");
    *(void **)&cu.free = dlsym(l, "cuMemFree_v2");
    *(void **)&cu.alloc_async = dlsym(l, "cuMemAllocAsync");
    *(void **)&cu.free_async = dlsym(l, "cuMemFreeAsync");
    *(void **)&cu.sync = dlsym(l, "cuStreamSynchronize");
    *(void **)&cu.ipc_get = dlsym(l, "cuIpcGetMemHandle");
    *(void **)&cu.ipc_open = dlsym(l, "cuIpcOpenMemHandle_v2");
    *(void **)&cu.ipc_close = dlsym(l, "cuIpcCloseMemHandle");
    *(void **)&cu.retain = dlsym(l, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.set = dlsym(l, "cuCtxSetCurrent");
    *(void **)&cu.stream_create = dlsym(l, "cuStreamCreate");
    *(void **)&cu.default_pool = dlsym(l, "cuDeviceGetDefaultMemPool");
    *(void **)&cu.pool_set = dlsym(l, "cuMemPoolSetAttribute");
    *(void **)&cu.calls = dlsym(l, "hm_cuda_test_call_count");
    *(void **)&cu.reset = dlsym(l, "hm_cuda_test_reset");
    if (!cu.alloc || !cu.free || !cu.sync || !cu.ipc_get || !cu.ipc_open || !cu.ipc_close ||
        !cu.retain || !cu.set)
        return -1;
    hm_cu_context_t ctx;
    if (cu.retain(&ctx, 0) != HM_CUDA_SUCCESS || cu.set(ctx) != HM_CUDA_SUCCESS) return -1;
    return 0;
}

static hm_pool_t *g_pool, *g_ipool;
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
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_ptr_t p = 0;
        if (cu.alloc(&p, n) != HM_CUDA_SUCCESS) return 1;
        hm_bench_escape((void *)(uintptr_t)p);
        if (cu.free(p) != HM_CUDA_SUCCESS) return 1;
    }
    return 0;
}
static int async_setup(const void *arg, void **ctx) {
    (void)arg, (void)ctx;
    return cu.alloc_async && cu.free_async ? 0 : HM_BENCH_SKIP;
}
static int async_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    size_t n = *(const size_t *)arg;
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_ptr_t p = 0;
        if (cu.alloc_async(&p, n, NULL) != HM_CUDA_SUCCESS) return 1;
        hm_bench_escape((void *)(uintptr_t)p);
        if (cu.free_async(p, NULL) != HM_CUDA_SUCCESS) return 1;
        if ((i & 63) == 63 && cu.sync(NULL) != HM_CUDA_SUCCESS) return 1;
    }
    return cu.sync(NULL) == HM_CUDA_SUCCESS ? 0 : 1;
}

/* ---- stream-ordered ---- */

static hm_cu_stream_t g_streams[2];
static bool g_have_streams;

static int streams_init(void) {
    if (!cu.stream_create || !cu.alloc_async || !cu.free_async) return -1;
    for (int i = 0; i < 2; i++)
        if (cu.stream_create(&g_streams[i], 0x1 /* CU_STREAM_NON_BLOCKING */) != HM_CUDA_SUCCESS)
            return -1;
    /* The driver's pool keeps what it frees (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4). */
    cu_pool_t dp;
    uint64_t max = UINT64_MAX;
    if (cu.default_pool && cu.pool_set && cu.default_pool(&dp, 0) == HM_CUDA_SUCCESS &&
        cu.pool_set(dp, 4, &max) == HM_CUDA_SUCCESS)
        printf("bench_cuda: the default memory pool's release threshold is the maximum\n");
    else
        printf("bench_cuda: the driver has no cuMemPoolSetAttribute: cuMemAllocAsync with its "
               "default threshold\n");
    return 0;
}

static int stream_setup(const void *arg, void **ctx) {
    (void)arg, (void)ctx;
    return g_have_streams ? 0 : HM_BENCH_SKIP;
}
/* arg: the number of streams (1 or 2); 1 MiB blocks. */
static int hm_stream_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    int k = *(const int *)arg;
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_stream_t s = g_streams[k == 2 ? (i & 1) : 0];
        void *p = hm_pool_malloc_async(g_pool, MIB, s);
        if (!p) return 1;
        hm_bench_escape(p);
        if (hm_pool_free_async(g_pool, p, s) != HM_SUCCESS) return 1;
        if ((i & 63) == 63)
            for (int j = 0; j < k; j++)
                if (cu.sync(g_streams[j]) != HM_CUDA_SUCCESS) return 1;
    }
    return 0;
}
static int raw_stream_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    int k = *(const int *)arg;
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_stream_t s = g_streams[k == 2 ? (i & 1) : 0];
        hm_cu_ptr_t p = 0;
        if (cu.alloc_async(&p, MIB, s) != HM_CUDA_SUCCESS) return 1;
        hm_bench_escape((void *)(uintptr_t)p);
        if (cu.free_async(p, s) != HM_CUDA_SUCCESS) return 1;
        if ((i & 63) == 63)
            for (int j = 0; j < k; j++)
                if (cu.sync(g_streams[j]) != HM_CUDA_SUCCESS) return 1;
    }
    return 0;
}

/* ---- IPC ---- */

static struct {
    unsigned char hm[2][4096];
    size_t hm_len[2];
    hm_cu_ipc_handle_t raw;
} g_rx;

static int exporter(int sock) {
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_cuda_provider_create(NULL, &prov) != HM_SUCCESS) return 10;
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) return 11;
    for (int i = 0; i < 2; i++) {
        void *p = hm_pool_malloc(pool, IPC_SIZE);
        hm_ipc_handle_t *h;
        size_t len;
        if (!p || hm_ipc_get(p, &h, &len) != HM_SUCCESS) return 12;
        if (send(sock, h, len, 0) != (ssize_t)len) return 13;
    }
    if (cu_raw_init() != 0) return 14;
    hm_cu_ptr_t raw = 0;
    hm_cu_ipc_handle_t rh;
    if (cu.alloc(&raw, IPC_SIZE) != HM_CUDA_SUCCESS || cu.ipc_get(&rh, raw) != HM_CUDA_SUCCESS)
        return 15;
    if (send(sock, &rh, sizeof(rh), 0) != (ssize_t)sizeof(rh)) return 16;
    char done;
    if (read(sock, &done, 1) < 0) return 17;
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
    for (int i = 0; i < 2; i++) {
        ssize_t n = recv(sv[0], g_rx.hm[i], sizeof(g_rx.hm[i]), 0);
        if (n <= 0) return -1;
        g_rx.hm_len[i] = (size_t)n;
    }
    if (recv(sv[0], &g_rx.raw, sizeof(g_rx.raw), 0) != (ssize_t)sizeof(g_rx.raw)) return -1;
    *sock_out = sv[0];
    return pid;
}

static int open_setup(const void *arg, void **ctx) {
    (void)ctx;
    return hm_ipc_set_cache_limits(*(const int *)arg ? 1 : 4096, 0) == HM_SUCCESS ? 0 : 1;
}
static int open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    int two = *(const int *)arg;
    for (uint64_t i = 0; i < iters; i++) {
        int k = two ? (int)(i & 1) : 0;
        void *p = NULL;
        if (hm_ipc_open(g_ipool, (const hm_ipc_handle_t *)g_rx.hm[k], g_rx.hm_len[k], &p) !=
            HM_SUCCESS)
            return 1;
        hm_bench_escape(p);
        if (hm_ipc_close(p) != HM_SUCCESS) return 1;
    }
    return 0;
}
static int raw_open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx, (void)arg;
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_ptr_t p = 0;
        if (cu.ipc_open(&p, g_rx.raw, HM_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != HM_CUDA_SUCCESS)
            return 1;
        hm_bench_escape((void *)(uintptr_t)p);
        if (cu.ipc_close(p) != HM_CUDA_SUCCESS) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--exporter") == 0) return exporter(atoi(argv[2]));
    int code = 0;
    hm_bench_t *b = hm_bench_create("cuda", &argc, argv, &code);
    if (!b) return code;
    hm_result_t r = hm_cuda_provider_create(NULL, &g_prov);
    if (r != HM_SUCCESS) {
        printf("bench_cuda: no CUDA driver (%s): skipped (set HM_CUDA_DRIVER to the test driver "
               "to measure hetmem's own overhead)\n", hm_result_string(r));
        hm_bench_finish(b);
        return 77;
    }
    if (cu_raw_init() != 0 ||
        hm_native_pool_create(g_prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_pool) != HM_SUCCESS) {
        fprintf(stderr, "bench_cuda: set-up failed\n");
        return 1;
    }
    printf("bench_cuda: driver %s\n",
           cu.calls ? "= the project's test driver (driver costs simulated: memfd + mmap)"
                    : "= the machine's libcuda.so.1");
    static const hm_bench_impl_t subject = {"hetmem-native", NULL, pool_run, NULL};
    static const hm_bench_impl_t base[] = {{"cuMemAlloc", NULL, raw_run, NULL},
                                           {"cuMemAllocAsync", async_setup, async_run, NULL}};
    static const size_t sizes[] = {64, 4096, 65536, MIB, 16 * MIB, 64 * MIB};
    static const char *names[] = {"alloc+free 64 B", "alloc+free 4 KiB", "alloc+free 64 KiB",
                                  "alloc+free 1 MiB", "alloc+free 16 MiB", "alloc+free 64 MiB"};
    for (size_t i = 0; i < 6; i++) hm_bench_case(b, names[i], &sizes[i], 1, &subject, base, 2);
    g_have_streams = streams_init() == 0;
    if (!g_have_streams) printf("bench_cuda: the driver has no streams: stream cases skipped\n");
    static const int one = 1, two = 2;
    static const hm_bench_impl_t st_s = {"hetmem-native", stream_setup, hm_stream_run, NULL};
    static const hm_bench_impl_t st_raw = {"cuMemAllocAsync", stream_setup, raw_stream_run, NULL};
    hm_bench_case(b, "stream alloc+free 1 MiB, one stream", &one, 1, &st_s, &st_raw, 1);
    hm_bench_case(b, "stream alloc+free 1 MiB, two streams", &two, 1, &st_s, &st_raw, 1);

    int sock = -1;
    pid_t pid = start_exporter(argv[0], &sock);
    hm_provider_t *ip;
    if (pid > 0 && hm_cuda_provider_create(NULL, &ip) == HM_SUCCESS &&
        hm_native_pool_create(ip, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_ipool) == HM_SUCCESS) {
        static const int hit = 0, miss = 1;
        static const hm_bench_impl_t open_s = {"hetmem", open_setup, open_run, NULL};
        static const hm_bench_impl_t open_raw = {"cuIpcOpen", NULL, raw_open_run, NULL};
        hm_bench_case(b, "open+close (hit)", &hit, 1, &open_s, &open_raw, 1);
        hm_bench_case(b, "open+close (miss)", &miss, 1, &open_s, &open_raw, 1);
        hm_ipc_set_cache_limits(4096, 0);
        hm_pool_destroy(g_ipool);
    } else {
        fprintf(stderr, "bench_cuda: no exporter: the IPC cases did not run\n");
    }
    if (sock >= 0) {
        char done = 1;
        (void)!write(sock, &done, 1);
        close(sock);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
    int rc = hm_bench_finish(b);
    /* Driver calls of one provider alloc and one free (the context current). */
    if (cu.calls && cu.reset) {
        void *p = NULL;
        cu.reset();
        hm_result_t ar = hm_provider_alloc(g_prov, 2 * MIB, 0, &p);
        uint64_t a = cu.calls("cuCtxGetCurrent") + cu.calls("cuMemAlloc_v2") +
                     cu.calls("cuCtxPushCurrent_v2") + cu.calls("cuCtxPopCurrent_v2");
        cu.reset();
        if (ar == HM_SUCCESS) (void)hm_provider_free(g_prov, p, 2 * MIB);
        uint64_t f = cu.calls("cuMemFree_v2") + cu.calls("cuCtxGetCurrent") +
                     cu.calls("cuCtxPushCurrent_v2") + cu.calls("cuCtxPopCurrent_v2");
        printf("driver calls per provider op (context current): alloc %llu, free %llu\n",
               (unsigned long long)a, (unsigned long long)f);
    } else {
        printf("driver calls per provider op: counted on the test driver only\n");
    }
    hm_pool_destroy(g_pool);
    return rc;
}
