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
 *   vmm alloc+free N  (2 MiB, 64 MiB) hm_provider_alloc + hm_provider_free of
 *                     a provider in VMM mode (cuMemCreate, cuMemAddressReserve,
 *                     cuMemMap, cuMemSetAccess; cuMemUnmap, cuMemAddressFree);
 *                     baselines: the same through a legacy provider
 *                     (cuMemAlloc_v2), and cuMemAlloc_v2 + cuMemFree_v2 called
 *                     directly.
 *   vmm open+close (hit), (miss)
 *                     hm_ipc_open + hm_ipc_close of an export of a VMM
 *                     provider (an FD handle: the descriptor fetched with
 *                     pidfd_getfd at a miss), cached or with the cache bound
 *                     at one mapping and two handles in turn; baselines:
 *                     hetmem's open of a legacy export (hit or miss alike),
 *                     cuIpcOpenMemHandle_v2 + cuIpcCloseMemHandle, and the
 *                     driver's VMM import as the provider makes it
 *                     (cuMemImportFromShareableHandle of a descriptor
 *                     received once, cuMemAddressReserve, cuMemMap,
 *                     cuMemSetAccess, cuMemRelease; cuMemUnmap,
 *                     cuMemAddressFree), and the driver's import of one
 *                     allocation of a memory pool ("cuMemPoolImport":
 *                     cuMemPoolImportPointer of export data received once,
 *                     from a pool imported once, + cuMemFree_v2, which
 *                     unmaps it: the driver's own per-pointer cost).
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
/* cuda.h 13.0's CUmemPoolProps and CUmemPoolPtrExportData (LP64) */
typedef struct {
    unsigned int alloc_type, handle_types;
    struct {
        unsigned int type;
        int id;
    } location;
    void *win32_security_attributes;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
} cu_pool_props_t;
typedef struct {
    unsigned char reserved[64];
} cu_pool_ptr_data_t;
_Static_assert(sizeof(cu_pool_props_t) == 88, "CUmemPoolProps");
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
    hm_cu_result_t (*vcreate)(hm_cu_mem_handle_t *, size_t, const hm_cu_mem_prop_t *,
                              unsigned long long);
    hm_cu_result_t (*vrelease)(hm_cu_mem_handle_t);
    hm_cu_result_t (*vreserve)(hm_cu_ptr_t *, size_t, size_t, hm_cu_ptr_t, unsigned long long);
    hm_cu_result_t (*vaddr_free)(hm_cu_ptr_t, size_t);
    hm_cu_result_t (*vmap)(hm_cu_ptr_t, size_t, size_t, hm_cu_mem_handle_t, unsigned long long);
    hm_cu_result_t (*vunmap)(hm_cu_ptr_t, size_t);
    hm_cu_result_t (*vaccess)(hm_cu_ptr_t, size_t, const hm_cu_mem_access_t *, size_t);
    hm_cu_result_t (*vexport)(void *, hm_cu_mem_handle_t, unsigned int, unsigned long long);
    hm_cu_result_t (*vimport)(hm_cu_mem_handle_t *, void *, unsigned int);
    hm_cu_result_t (*pool_create)(cu_pool_t *, const cu_pool_props_t *);
    hm_cu_result_t (*pool_alloc)(hm_cu_ptr_t *, size_t, cu_pool_t, hm_cu_stream_t);
    hm_cu_result_t (*pool_export)(void *, cu_pool_t, unsigned int, unsigned long long);
    hm_cu_result_t (*pool_import)(cu_pool_t *, void *, unsigned int, unsigned long long);
    hm_cu_result_t (*pool_export_ptr)(cu_pool_ptr_data_t *, hm_cu_ptr_t);
    hm_cu_result_t (*pool_import_ptr)(hm_cu_ptr_t *, cu_pool_t, cu_pool_ptr_data_t *);
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
    *(void **)&cu.vcreate = dlsym(l, "cuMemCreate");
    *(void **)&cu.vrelease = dlsym(l, "cuMemRelease");
    *(void **)&cu.vreserve = dlsym(l, "cuMemAddressReserve");
    *(void **)&cu.vaddr_free = dlsym(l, "cuMemAddressFree");
    *(void **)&cu.vmap = dlsym(l, "cuMemMap");
    *(void **)&cu.vunmap = dlsym(l, "cuMemUnmap");
    *(void **)&cu.vaccess = dlsym(l, "cuMemSetAccess");
    *(void **)&cu.vexport = dlsym(l, "cuMemExportToShareableHandle");
    *(void **)&cu.vimport = dlsym(l, "cuMemImportFromShareableHandle");
    *(void **)&cu.pool_create = dlsym(l, "cuMemPoolCreate");
    *(void **)&cu.pool_alloc = dlsym(l, "cuMemAllocFromPoolAsync");
    *(void **)&cu.pool_export = dlsym(l, "cuMemPoolExportToShareableHandle");
    *(void **)&cu.pool_import = dlsym(l, "cuMemPoolImportFromShareableHandle");
    *(void **)&cu.pool_export_ptr = dlsym(l, "cuMemPoolExportPointer");
    *(void **)&cu.pool_import_ptr = dlsym(l, "cuMemPoolImportPointer");
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
static hm_provider_t *g_prov, *g_vprov;

static bool have_pool_ipc(void) {
    return cu.pool_create && cu.pool_alloc && cu.pool_export && cu.pool_import &&
           cu.pool_export_ptr && cu.pool_import_ptr;
}
static bool have_raw_vmm(void) {
    return cu.vcreate && cu.vrelease && cu.vreserve && cu.vaddr_free && cu.vmap && cu.vunmap &&
           cu.vaccess && cu.vexport && cu.vimport;
}
static hm_result_t vmm_provider(hm_provider_t **out) {
    hm_cuda_params_t *p;
    hm_result_t r = hm_cuda_params_create(&p);
    if (r != HM_SUCCESS) return r;
    r = hm_cuda_params_set_allocator(p, HM_CUDA_ALLOCATOR_VMM);
    if (r == HM_SUCCESS) r = hm_cuda_provider_create(p, out);
    hm_cuda_params_destroy(p);
    return r;
}

/* ---- provider alloc+free: VMM, legacy ---- */

static int vmm_setup(const void *arg, void **ctx) {
    (void)arg, (void)ctx;
    return g_vprov ? 0 : HM_BENCH_SKIP;
}
/* arg: the size; ctx unused; the provider is the VMM one or the legacy one. */
static int prov_run(hm_provider_t *prov, size_t n, uint64_t iters) {
    for (uint64_t i = 0; i < iters; i++) {
        void *p = NULL;
        if (hm_provider_alloc(prov, n, 0, &p) != HM_SUCCESS) return 1;
        hm_bench_escape(p);
        if (hm_provider_free(prov, p, n) != HM_SUCCESS) return 1;
    }
    return 0;
}
static int vmm_prov_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    return prov_run(g_vprov, *(const size_t *)arg, iters);
}
static int legacy_prov_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    return prov_run(g_prov, *(const size_t *)arg, iters);
}

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
    unsigned char vm[2][4096]; /* exports of a VMM provider */
    size_t vm_len[2];
    int raw_fd; /* a cuMemCreate allocation's POSIX descriptor (SCM_RIGHTS), or -1 */
    int pool_fd; /* a memory pool's POSIX descriptor (SCM_RIGHTS), or -1 */
    cu_pool_ptr_data_t pool_ptr; /* one allocation of that pool, exported */
    cu_pool_t pool;              /* the pool imported here, or NULL */
} g_rx = {.raw_fd = -1, .pool_fd = -1};

/* The pinned device memory of device 0 with POSIX descriptors. */
static void raw_vmm_prop(hm_cu_mem_prop_t *prop) {
    memset(prop, 0, sizeof(*prop));
    prop->type = HM_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = HM_CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = 0;
    prop->requestedHandleTypes = HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

static int send_fd(int sock, int fd) {
    char c = 0, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&c, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof(ctl)};
    memset(ctl, 0, sizeof(ctl));
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof(int));
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}
static int recv_fd(int sock) {
    char c, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&c, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof(ctl)};
    if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1) return -1;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (h && h->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(h), sizeof(int));
    return c ? -1 : fd; /* c 1: the exporter has none to send */
}

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
    /* VMM: two exports of a VMM provider (empty messages without one), and
     * one raw cuMemCreate allocation's descriptor (a byte 1 without). */
    hm_provider_t *vprov;
    hm_pool_t *vpool = NULL;
    if (vmm_provider(&vprov) == HM_SUCCESS &&
        hm_proxy_pool_create(vprov, HM_POOL_FLAG_OWN_PROVIDER, &vpool) != HM_SUCCESS)
        return 18;
    for (int i = 0; i < 2; i++) {
        void *p = vpool ? hm_pool_malloc(vpool, IPC_SIZE) : NULL;
        hm_ipc_handle_t *h = NULL;
        size_t len = 0;
        if (vpool && (!p || hm_ipc_get(p, &h, &len) != HM_SUCCESS)) return 19;
        if (send(sock, vpool ? (void *)h : "", len, 0) != (ssize_t)len) return 20;
    }
    int vfd = -1;
    hm_cu_mem_handle_t vh = 0;
    hm_cu_mem_prop_t prop;
    raw_vmm_prop(&prop);
    if (have_raw_vmm() && cu.vcreate(&vh, IPC_SIZE, &prop, 0) == HM_CUDA_SUCCESS &&
        cu.vexport(&vfd, vh, HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != HM_CUDA_SUCCESS)
        vfd = -1;
    if (vfd >= 0 ? send_fd(sock, vfd) != 0 : send(sock, "\1", 1, 0) != 1) return 21;
    /* A memory pool with POSIX descriptors on device 0: its descriptor (a
     * byte 1 without), then one allocation's export data (empty without). */
    cu_pool_props_t pp;
    memset(&pp, 0, sizeof(pp));
    pp.alloc_type = HM_CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.handle_types = HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    pp.location.type = HM_CU_MEM_LOCATION_TYPE_DEVICE;
    cu_pool_t mp = NULL;
    hm_cu_ptr_t pp_ptr = 0;
    cu_pool_ptr_data_t data;
    int pfd = -1;
    if (have_pool_ipc() && cu.pool_create(&mp, &pp) == HM_CUDA_SUCCESS &&
        (cu.pool_alloc(&pp_ptr, IPC_SIZE, mp, NULL) != HM_CUDA_SUCCESS ||
         cu.sync(NULL) != HM_CUDA_SUCCESS || cu.pool_export_ptr(&data, pp_ptr) != HM_CUDA_SUCCESS ||
         cu.pool_export(&pfd, mp, HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != HM_CUDA_SUCCESS))
        pfd = -1;
    if (pfd >= 0 ? send_fd(sock, pfd) != 0 : send(sock, "\1", 1, 0) != 1) return 22;
    if (send(sock, &data, pfd >= 0 ? sizeof(data) : 0, 0) < 0) return 23;
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
    for (int i = 0; i < 2; i++) {
        ssize_t n = recv(sv[0], g_rx.vm[i], sizeof(g_rx.vm[i]), 0);
        if (n < 0) return -1;
        g_rx.vm_len[i] = (size_t)n;
    }
    g_rx.raw_fd = recv_fd(sv[0]);
    g_rx.pool_fd = recv_fd(sv[0]);
    cu_pool_ptr_data_t data;
    if (recv(sv[0], &data, sizeof(data), 0) == (ssize_t)sizeof(data) && g_rx.pool_fd >= 0)
        g_rx.pool_ptr = data;
    else if (g_rx.pool_fd >= 0) {
        close(g_rx.pool_fd);
        g_rx.pool_fd = -1;
    }
    *sock_out = sv[0];
    return pid;
}

static int open_setup(const void *arg, void **ctx) {
    (void)ctx;
    return hm_ipc_set_cache_limits(*(const int *)arg ? 1 : 4096, 0) == HM_SUCCESS ? 0 : 1;
}
static int open_handles(unsigned char (*hs)[4096], const size_t *lens, int two, uint64_t iters) {
    for (uint64_t i = 0; i < iters; i++) {
        int k = two ? (int)(i & 1) : 0;
        void *p = NULL;
        if (hm_ipc_open(g_ipool, (const hm_ipc_handle_t *)hs[k], lens[k], &p) != HM_SUCCESS)
            return 1;
        hm_bench_escape(p);
        if (hm_ipc_close(p) != HM_SUCCESS) return 1;
    }
    return 0;
}
static int open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    return open_handles(g_rx.hm, g_rx.hm_len, *(const int *)arg, iters);
}
static int vmm_open_setup(const void *arg, void **ctx) {
    if (!g_rx.vm_len[0] || !g_rx.vm_len[1]) return HM_BENCH_SKIP;
    return open_setup(arg, ctx);
}
static int vmm_open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    return open_handles(g_rx.vm, g_rx.vm_len, *(const int *)arg, iters);
}
/* The driver's VMM import, as the provider makes it at a miss. */
static int raw_vmm_setup(const void *arg, void **ctx) {
    (void)arg, (void)ctx;
    return g_rx.raw_fd >= 0 && have_raw_vmm() ? 0 : HM_BENCH_SKIP;
}
static int raw_vmm_open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx, (void)arg;
    hm_cu_mem_access_t acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = HM_CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = HM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_mem_handle_t h = 0;
        hm_cu_ptr_t va = 0;
        if (cu.vimport(&h, (void *)(intptr_t)g_rx.raw_fd,
                       HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != HM_CUDA_SUCCESS ||
            cu.vreserve(&va, IPC_SIZE, IPC_SIZE, 0, 0) != HM_CUDA_SUCCESS ||
            cu.vmap(va, IPC_SIZE, 0, h, 0) != HM_CUDA_SUCCESS ||
            cu.vaccess(va, IPC_SIZE, &acc, 1) != HM_CUDA_SUCCESS ||
            cu.vrelease(h) != HM_CUDA_SUCCESS)
            return 1;
        hm_bench_escape((void *)(uintptr_t)va);
        if (cu.vunmap(va, IPC_SIZE) != HM_CUDA_SUCCESS ||
            cu.vaddr_free(va, IPC_SIZE) != HM_CUDA_SUCCESS)
            return 1;
    }
    return 0;
}
/* The driver's import of one pool allocation: the pool imported once (at
 * start), then per open cuMemPoolImportPointer and the free that unmaps. */
static int pool_import_setup(const void *arg, void **ctx) {
    (void)arg, (void)ctx;
    return g_rx.pool ? 0 : HM_BENCH_SKIP;
}
static int pool_import_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx, (void)arg;
    for (uint64_t i = 0; i < iters; i++) {
        hm_cu_ptr_t p = 0;
        if (cu.pool_import_ptr(&p, g_rx.pool, &g_rx.pool_ptr) != HM_CUDA_SUCCESS) return 1;
        hm_bench_escape((void *)(uintptr_t)p);
        if (cu.free(p) != HM_CUDA_SUCCESS) return 1;
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
    r = vmm_provider(&g_vprov);
    if (r != HM_SUCCESS) {
        g_vprov = NULL;
        printf("bench_cuda: no VMM-mode provider (%s): its cases skipped\n", hm_result_string(r));
    }
    static const size_t vsizes[] = {2 * MIB, 64 * MIB};
    static const char *vnames[] = {"vmm alloc+free 2 MiB", "vmm alloc+free 64 MiB"};
    static const hm_bench_impl_t vmm_s = {"hetmem-vmm", vmm_setup, vmm_prov_run, NULL};
    static const hm_bench_impl_t vmm_base[] = {{"hetmem-legacy", NULL, legacy_prov_run, NULL},
                                               {"cuMemAlloc", NULL, raw_run, NULL}};
    for (size_t i = 0; i < 2; i++) hm_bench_case(b, vnames[i], &vsizes[i], 1, &vmm_s, vmm_base, 2);
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
        if (g_rx.pool_fd >= 0 &&
            cu.pool_import(&g_rx.pool, (void *)(intptr_t)g_rx.pool_fd,
                           HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != HM_CUDA_SUCCESS)
            g_rx.pool = NULL;
        if (!g_rx.pool)
            printf("bench_cuda: %s: the cuMemPoolImport baseline skipped\n",
                   !have_pool_ipc() ? "the driver has no memory-pool IPC"
                   : g_rx.pool_fd < 0 ? "the exporter made no pool export"
                                      : "cuMemPoolImportFromShareableHandle failed");
        static const hm_bench_impl_t vo_s = {"hetmem-vmm", vmm_open_setup, vmm_open_run, NULL};
        static const hm_bench_impl_t vo_base[] = {
            {"hetmem-legacy", open_setup, open_run, NULL},
            {"cuIpcOpen", NULL, raw_open_run, NULL},
            {"cuMemImport", raw_vmm_setup, raw_vmm_open_run, NULL},
            {"cuMemPoolImport", pool_import_setup, pool_import_run, NULL}};
        if (!g_rx.vm_len[0]) printf("bench_cuda: the exporter has no VMM provider\n");
        hm_bench_case(b, "vmm open+close (hit)", &hit, 1, &vo_s, vo_base, 4);
        hm_bench_case(b, "vmm open+close (miss)", &miss, 1, &vo_s, vo_base, 4);
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
    if (g_rx.raw_fd >= 0) close(g_rx.raw_fd);
    if (g_rx.pool_fd >= 0) close(g_rx.pool_fd);
    if (g_vprov) hm_provider_destroy(g_vprov);
    hm_pool_destroy(g_pool);
    return rc;
}
