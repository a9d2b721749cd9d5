/* hetmem tests — the CUDA test driver (libcuda.so.1): initialization,
 * devices, cuGetProcAddress_v2, per-thread contexts, allocation kinds and
 * flags, pointer attributes, the device limit, faults on device memory,
 * memset and copies, stream-ordered allocation, streams and events, IPC
 * with an exec'd importer, virtual memory management (cuMemCreate, cuMemMap,
 * shareable descriptors to an exec'd importer), memory pools with IPC
 * (cuMemPoolCreate, cuMemAllocFromPoolAsync, a pool's descriptor and export
 * data to an exec'd importer)
 * and with an exporter that goes away, the old ABIs that abort, failure
 * injection, call counts, threads and fork, and that everything is freed.
 * Every entry point is resolved by its exact versioned name with dlsym on
 * the driver opened by absolute path; the control API by dlopen(RTLD_NOLOAD)
 * of the same file. Modes (argv[1]): "ipc-importer <in> <out>" (the exec'd
 * importer), "vmm-importer <socket>" (the exec'd importer of a VMM
 * allocation's descriptor), "pool-importer <socket>" (the exec'd importer of
 * a memory pool's descriptor and two of its allocations), "no-device" (HM_CUDA_TEST_DEVICES=0), "soname" (found as
 * libcuda.so.1 through LD_LIBRARY_PATH).
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "cuda_test_driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef HM_CUDA_TEST_DRIVER_PATH
#error "HM_CUDA_TEST_DRIVER_PATH: the absolute path of the test libcuda.so.1"
#endif

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GRAN HM_CUDA_TEST_GRANULARITY

/* ---- the entry points, resolved by their exact symbol names ---- */

#define CU_FNS(X)                                                                      \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)              \
    X(cuGetProcAddress_v2) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)       \
    X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDeviceGetAttribute)                   \
    X(cuDeviceTotalMem_v2) X(cuDeviceCanAccessPeer) X(cuDeviceGetDefaultMemPool)       \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxCreate_v2)      \
    X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuCtxGetCurrent) X(cuCtxSetCurrent)         \
    X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetDevice) X(cuCtxGetDevice_v2) \
    X(cuCtxSynchronize) X(cuCtxSynchronize_v2) X(cuMemAlloc_v2) X(cuMemFree_v2)        \
    X(cuMemAllocHost_v2) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemAllocManaged)       \
    X(cuMemHostGetDevicePointer_v2)                                                    \
    X(cuMemGetAddressRange_v2) X(cuMemGetInfo_v2) X(cuMemGetAllocationGranularity)     \
    X(cuMemsetD8_v2) X(cuMemcpy) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2)                 \
    X(cuMemcpyDtoD_v2) X(cuPointerGetAttribute) X(cuPointerGetAttributes)              \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)               \
    X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuStreamSynchronize)                        \
    X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamQuery) X(cuStreamWaitEvent)      \
    X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)            \
    X(cuEventDestroy_v2) X(cuMemsetD8Async) X(cuMemcpyAsync)                          \
    X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree)          \
    X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess)                      \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                  \
    X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle)         \
    X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemAllocFromPoolAsync)                  \
    X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle)          \
    X(cuMemPoolExportPointer) X(cuMemPoolImportPointer)

static struct {
#define X(name) __typeof__(name) *name;
    CU_FNS(X)
#undef X
} cu;

/* The old ABIs, which abort. */
static const struct {
    const char *name, *use;
} old_names[] = {
    {"cuMemAlloc", "cuMemAlloc_v2"},
    {"cuMemFree", "cuMemFree_v2"},
    {"cuMemAllocHost", "cuMemAllocHost_v2"},
    {"cuMemGetAddressRange", "cuMemGetAddressRange_v2"},
    {"cuMemGetInfo", "cuMemGetInfo_v2"},
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2"},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2"},
    {"cuMemcpyDtoD", "cuMemcpyDtoD_v2"},
    {"cuMemsetD8", "cuMemsetD8_v2"},
    {"cuCtxCreate", "cuCtxCreate_v4"},
    {"cuCtxDestroy", "cuCtxDestroy_v2"},
    {"cuCtxPushCurrent", "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", "cuCtxPopCurrent_v2"},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"},
    {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"},
    {"cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2"},
    {"cuGetProcAddress", "cuGetProcAddress_v2"},
    {"cuStreamDestroy", "cuStreamDestroy_v2"},
    {"cuEventDestroy", "cuEventDestroy_v2"},
};
#define NOLD (sizeof old_names / sizeof old_names[0])

static void *lib; /* the driver */

/* ---- the driver's control API ---- */

static struct {
    hm_cuda_test_reset_fn reset;
    hm_cuda_test_get_stats_fn get_stats;
    hm_cuda_test_call_count_fn call_count;
    hm_cuda_test_fail_next_fn fail_next;
    hm_cuda_test_set_mem_limit_fn set_mem_limit;
    hm_cuda_test_set_strict_ipc_fn set_strict_ipc;
    hm_cuda_test_set_peer_access_fn set_peer_access;
    hm_cuda_test_fail_sticky_fn fail_sticky;
    hm_cuda_test_set_lenient_fn set_lenient;
    hm_cuda_test_get_lenient_fn get_lenient;
    hm_cuda_test_teardown_fn teardown;
    hm_cuda_test_va_base_fn va_base;
} ctl;

#define CU_EXPECT(expr, want)                                                           \
    do {                                                                                \
        CUresult r_ = (expr), w_ = (want);                                              \
        hm_test_record(r_ == w_, __FILE__, __LINE__, "%s -> %d, expected %d (%s)", #expr, \
                       (int)r_, (int)w_, #want);                                        \
    } while (0)
#define CU_OK(expr) CU_EXPECT(expr, CUDA_SUCCESS)
#define CU_REQUIRE_OK(expr)                                                             \
    do {                                                                                \
        CUresult r_ = (expr);                                                           \
        hm_test_record(r_ == CUDA_SUCCESS, __FILE__, __LINE__, "REQUIRE %s -> %d", #expr, \
                       (int)r_);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                       \
            hm_test_finish();                                                           \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* ---- state ---- */

static int ndev;
static CUcontext pc[HM_CUDA_TEST_MAX_DEVICES]; /* primary contexts, retained once */
static uint64_t limit;                         /* the limit at start */
static bool strict_env;                        /* HM_CUDA_TEST_STRICT_IPC=1 */

static hm_cuda_test_stats_t stats(void) {
    hm_cuda_test_stats_t s;
    ctl.get_stats(&s);
    return s;
}

static bool env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

static void *P(CUdeviceptr d) { return (void *)(uintptr_t)d; }
static CUdeviceptr D(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

static int other_dev(void) { return ndev > 1 ? 1 : 0; }

static void set_current(CUcontext c) { CU_REQUIRE_OK(cu.cuCtxSetCurrent(c)); }

static CUcontext get_current(void) {
    CUcontext c = (CUcontext)(uintptr_t)1;
    CU_OK(cu.cuCtxGetCurrent(&c));
    return c;
}

/* All n bytes of driver memory p (read back with cuMemcpyDtoH_v2) equal v. */
static bool all_bytes(CUdeviceptr p, uint8_t v, size_t n) {
    uint8_t *h = malloc(n);
    REQUIRE(h);
    bool ok = cu.cuMemcpyDtoH_v2(h, p, n) == CUDA_SUCCESS;
    for (size_t i = 0; ok && i < n; i++) ok = h[i] == v;
    free(h);
    return ok;
}

static unsigned mem_type(CUdeviceptr p) {
    unsigned t = 0;
    CU_OK(cu.cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
    return t;
}

static unsigned long long buffer_id(CUdeviceptr p) {
    unsigned long long id = 0;
    CU_OK(cu.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    return id;
}

static int ordinal_of(CUdeviceptr p) {
    int o = -1;
    CU_OK(cu.cuPointerGetAttribute(&o, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    return o;
}

static CUcontext context_of(CUdeviceptr p) {
    CUcontext c = NULL;
    CU_OK(cu.cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p));
    return c;
}

/* ---- set-up ---- */

static void resolve_all(void *h) {
#define X(name)                                              \
    *(void **)&cu.name = dlsym(h, #name);                    \
    if (!cu.name) HM_TEST_SKIP("the driver has no %s", #name);
    CU_FNS(X)
#undef X
}

static void load(void) {
    lib = dlopen(HM_CUDA_TEST_DRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) HM_TEST_SKIP("cannot load %s: %s", HM_CUDA_TEST_DRIVER_PATH, dlerror());
    resolve_all(lib);
    ndev = 1;
    const char *s = getenv("HM_CUDA_TEST_DEVICES");
    if (s && *s) ndev = atoi(s);
    strict_env = env_is("HM_CUDA_TEST_STRICT_IPC", "1");
}

static void control(void) {
    void *h = dlopen(HM_CUDA_TEST_DRIVER_PATH, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h); /* the very file loaded above */
    *(void **)&ctl.reset = dlsym(h, "hm_cuda_test_reset");
    *(void **)&ctl.get_stats = dlsym(h, "hm_cuda_test_get_stats");
    *(void **)&ctl.call_count = dlsym(h, "hm_cuda_test_call_count");
    *(void **)&ctl.fail_next = dlsym(h, "hm_cuda_test_fail_next");
    *(void **)&ctl.set_mem_limit = dlsym(h, "hm_cuda_test_set_mem_limit");
    *(void **)&ctl.set_strict_ipc = dlsym(h, "hm_cuda_test_set_strict_ipc");
    *(void **)&ctl.set_peer_access = dlsym(h, "hm_cuda_test_set_peer_access");
    *(void **)&ctl.fail_sticky = dlsym(h, "hm_cuda_test_fail_sticky");
    *(void **)&ctl.set_lenient = dlsym(h, "hm_cuda_test_set_lenient");
    *(void **)&ctl.get_lenient = dlsym(h, "hm_cuda_test_get_lenient");
    *(void **)&ctl.teardown = dlsym(h, "hm_cuda_test_teardown");
    *(void **)&ctl.va_base = dlsym(h, "hm_cuda_test_va_base");
    REQUIRE(ctl.reset && ctl.get_stats && ctl.call_count && ctl.fail_next && ctl.set_mem_limit &&
            ctl.set_strict_ipc && ctl.set_peer_access && ctl.fail_sticky && ctl.set_lenient &&
            ctl.get_lenient && ctl.teardown && ctl.va_base);
    dlclose(h); /* drops the reference NOLOAD took */
}

/* ---- exported symbols ---- */

static void test_symbols(void) {
    hm_test_set_context("symbols");
    for (size_t i = 0; i < NOLD; i++) CHECK_MSG(dlsym(lib, old_names[i].name), "%s", old_names[i].name);
    /* CUDA 13 names that exist next to the plain ones */
    CHECK(dlsym(lib, "cuCtxCreate_v4") && dlsym(lib, "cuCtxGetDevice_v2"));
    /* nothing of the implementation */
    const char *internal[] = {"mem_alloc", "setup", "enter", "leave", "g", "g_lock", "procs",
                              "resolve", "ipc_open", "old_abi", "cuCtxCreate_v3"};
    for (size_t i = 0; i < sizeof internal / sizeof internal[0]; i++)
        CHECK_MSG(dlsym(lib, internal[i]) == NULL, "%s is exported", internal[i]);
    Dl_info info;
    CHECK(dladdr((void *)cu.cuInit, &info) && strstr(info.dli_fname, "libcuda.so.1"));
}

/* ---- initialization ---- */

static void *init_thread(void *arg) {
    (void)arg;
    return (void *)(uintptr_t)cu.cuInit(0);
}

static void test_before_init(void) {
    hm_test_set_context("before cuInit");
    int v = 0, n = 0;
    CU_OK(cu.cuDriverGetVersion(&v));
    CHECK_EQ(v, HM_CUDA_TEST_DRIVER_VERSION);
    CU_EXPECT(cu.cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr d = 0;
    CU_EXPECT(cu.cuMemAlloc_v2(&d, 4096), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext c = NULL;
    CU_EXPECT(cu.cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c, 0), CUDA_ERROR_NOT_INITIALIZED);
    const char *s = NULL;
    CU_OK(cu.cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
    CHECK(s && strcmp(s, "CUDA_ERROR_INVALID_VALUE") == 0);
    void *fn = NULL;
    CU_OK(cu.cuGetProcAddress_v2("cuInit", &fn, 13000, 0, NULL));
    CHECK(fn == (void *)cu.cuInit);

    /* refused and failed inits leave the driver uninitialized */
    CU_EXPECT(cu.cuInit(1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(ctl.fail_next("cuInit", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuInit(0), CUDA_ERROR_UNKNOWN);
    CU_EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);

    /* from several threads at once, then again */
    pthread_t t[4];
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&t[i], NULL, init_thread, NULL) == 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        CHECK_EQ((uintptr_t)r, CUDA_SUCCESS);
    }
    CU_OK(cu.cuInit(0));
    CU_OK(cu.cuDeviceGetCount(&n));
    CHECK_EQ(n, ndev);
}

static void test_errors(void) {
    hm_test_set_context("error names");
    const struct {
        CUresult e;
        const char *name;
    } known[] = {{CUDA_SUCCESS, "CUDA_SUCCESS"},
                 {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
                 {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
                 {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
                 {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
                 {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED"},
                 {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
                 {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
                 {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
                 {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const char *n = NULL, *s = NULL;
        CU_OK(cu.cuGetErrorName(known[i].e, &n));
        CU_OK(cu.cuGetErrorString(known[i].e, &s));
        CHECK_MSG(n && strcmp(n, known[i].name) == 0, "%d: %s", (int)known[i].e, n ? n : "NULL");
        CHECK(s && *s);
    }
    const char *n = "x";
    CU_EXPECT(cu.cuGetErrorName((CUresult)12345, &n), CUDA_ERROR_INVALID_VALUE);
    CHECK(n == NULL);
    CU_EXPECT(cu.cuGetErrorString(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);
}

/* ---- devices ---- */

static void test_devices(void) {
    hm_test_set_context("devices");
    CUdevice d = -1;
    for (int i = 0; i < ndev; i++) {
        CU_OK(cu.cuDeviceGet(&d, i));
        CHECK_EQ(d, i);
    }
    CU_EXPECT(cu.cuDeviceGet(&d, ndev), CUDA_ERROR_INVALID_DEVICE);
    CU_EXPECT(cu.cuDeviceGet(&d, -1), CUDA_ERROR_INVALID_DEVICE);
    CU_EXPECT(cu.cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);

    char name[64], want[64];
    CU_OK(cu.cuDeviceGetName(name, sizeof name, 0));
    CHECK(strcmp(name, "hetmem CUDA test device 0") == 0);
    CU_OK(cu.cuDeviceGetName(name, 8, 0)); /* truncated, terminated */
    CHECK(strcmp(name, "hetmem ") == 0);
    CU_EXPECT(cu.cuDeviceGetName(name, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuDeviceGetName(name, sizeof name, ndev), CUDA_ERROR_INVALID_DEVICE);

    CUuuid u[HM_CUDA_TEST_MAX_DEVICES];
    for (int i = 0; i < ndev; i++) {
        snprintf(want, sizeof want, "hetmem CUDA test device %d", i);
        CU_OK(cu.cuDeviceGetName(name, sizeof name, i));
        CHECK(strcmp(name, want) == 0);
        CUuuid v1;
        CU_OK(cu.cuDeviceGetUuid_v2(&u[i], i));
        CU_OK(cu.cuDeviceGetUuid(&v1, i)); /* the plain name works: same ABI */
        CHECK(memcmp(&u[i], &v1, sizeof v1) == 0);
        for (int j = 0; j < i; j++) CHECK(memcmp(&u[i], &u[j], sizeof u[i]) != 0);
        CHECK(memcmp(u[i].bytes, "hmcudatestdev", 13) == 0 && u[i].bytes[15] == i);

        int a = -1;
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, i));
        CHECK_EQ(a, 1);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, i));
        CHECK_EQ(a, 1);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, i));
        CHECK_EQ(a, 1);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, i));
        CHECK_EQ(a, i + 1);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, i));
        CHECK_EQ(a, 0);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, i));
        CHECK_EQ(a, 0);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, i));
        CHECK_EQ(a, 1);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, i));
        CHECK_EQ(a, 0);
        CU_OK(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i));
        CHECK_EQ(a, 9);
        CU_OK(cu.cuDeviceGetAttribute(&a, (CUdevice_attribute)2, i)); /* valid, not modelled */
        CHECK_EQ(a, 0);
        size_t total = 0;
        CU_OK(cu.cuDeviceTotalMem_v2(&total, i));
        CHECK_EQ(total, limit);
        CUmemoryPool p0 = NULL, pi = NULL;
        CU_OK(cu.cuDeviceGetDefaultMemPool(&p0, 0));
        CU_OK(cu.cuDeviceGetDefaultMemPool(&pi, i));
        CHECK(pi && (i == 0) == (pi == p0));
    }
    int a = 0;
    CU_EXPECT(cu.cuDeviceGetAttribute(&a, (CUdevice_attribute)0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, ndev),
              CUDA_ERROR_INVALID_DEVICE);
    CU_EXPECT(cu.cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0),
              CUDA_ERROR_INVALID_VALUE);

    /* peer access: distinct devices, changeable */
    int can = -1;
    CU_OK(cu.cuDeviceCanAccessPeer(&can, 0, 0));
    CHECK_EQ(can, 0);
    if (ndev > 1) {
        CU_OK(cu.cuDeviceCanAccessPeer(&can, 0, 1));
        CHECK_EQ(can, 1);
        CHECK_EQ(ctl.set_peer_access(0, 1, 0), 0);
        CU_OK(cu.cuDeviceCanAccessPeer(&can, 0, 1));
        CHECK_EQ(can, 0);
        CU_OK(cu.cuDeviceCanAccessPeer(&can, 1, 0));
        CHECK_EQ(can, 1);
        CHECK_EQ(ctl.set_peer_access(0, 1, 1), 0);
    }
    CHECK_EQ(ctl.set_peer_access(0, HM_CUDA_TEST_MAX_DEVICES, 1), -1);
    CU_EXPECT(cu.cuDeviceCanAccessPeer(&can, 0, ndev), CUDA_ERROR_INVALID_DEVICE);

    /* granularity: no context needed */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ndev - 1;
    size_t g = 0;
    CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK_EQ(g, 2 * MIB);
    g = 0;
    CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CHECK_EQ(g, 2 * MIB);
    CU_EXPECT(cu.cuMemGetAllocationGranularity(&g, &prop, (CUmemAllocationGranularity_flags)2),
              CUDA_ERROR_INVALID_VALUE);
    prop.location.id = ndev;
    CU_EXPECT(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_DEVICE);
    prop.location.id = 0;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CU_EXPECT(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_VALUE);
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
    CU_EXPECT(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_VALUE);
}

/* ---- cuGetProcAddress_v2 ---- */

static void *proc(const char *name, int version, CUresult want, CUdriverProcAddressQueryResult want_st) {
    void *fn = (void *)(uintptr_t)1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
    CUresult r = cu.cuGetProcAddress_v2(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    CHECK_MSG(r == want && st == want_st, "cuGetProcAddress_v2(%s, %d) -> %d status %d, expected %d %d",
              name, version, (int)r, (int)st, (int)want, (int)want_st);
    if (want != CUDA_SUCCESS) CHECK_MSG(fn == NULL, "%s: *pfn not NULL", name);
    return fn;
}

static void test_proc_address(void) {
    hm_test_set_context("cuGetProcAddress_v2");
    /* What CUDA 13.0 gets for each base name: the symbol cuda.h maps it to. */
    static const char *const map[][2] = {
        {"cuInit", "cuInit"}, {"cuDriverGetVersion", "cuDriverGetVersion"},
        {"cuGetErrorName", "cuGetErrorName"}, {"cuGetErrorString", "cuGetErrorString"},
        {"cuGetProcAddress", "cuGetProcAddress_v2"}, {"cuDeviceGet", "cuDeviceGet"},
        {"cuDeviceGetCount", "cuDeviceGetCount"}, {"cuDeviceGetName", "cuDeviceGetName"},
        {"cuDeviceGetUuid", "cuDeviceGetUuid_v2"}, {"cuDeviceGetAttribute", "cuDeviceGetAttribute"},
        {"cuDeviceTotalMem", "cuDeviceTotalMem_v2"}, {"cuDeviceCanAccessPeer", "cuDeviceCanAccessPeer"},
        {"cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool"},
        {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"},
        {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"},
        {"cuCtxCreate", "cuCtxCreate_v4"}, {"cuCtxDestroy", "cuCtxDestroy_v2"},
        {"cuCtxGetCurrent", "cuCtxGetCurrent"}, {"cuCtxSetCurrent", "cuCtxSetCurrent"},
        {"cuCtxPushCurrent", "cuCtxPushCurrent_v2"}, {"cuCtxPopCurrent", "cuCtxPopCurrent_v2"},
        {"cuCtxGetDevice", "cuCtxGetDevice_v2"}, {"cuCtxSynchronize", "cuCtxSynchronize_v2"},
        {"cuMemAlloc", "cuMemAlloc_v2"}, {"cuMemFree", "cuMemFree_v2"},
        {"cuMemAllocHost", "cuMemAllocHost_v2"}, {"cuMemHostAlloc", "cuMemHostAlloc"},
        {"cuMemFreeHost", "cuMemFreeHost"}, {"cuMemAllocManaged", "cuMemAllocManaged"},
        {"cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2"},
        {"cuMemGetAddressRange", "cuMemGetAddressRange_v2"}, {"cuMemGetInfo", "cuMemGetInfo_v2"},
        {"cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity"},
        {"cuMemsetD8", "cuMemsetD8_v2"}, {"cuMemcpy", "cuMemcpy"},
        {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"}, {"cuMemcpyDtoH", "cuMemcpyDtoH_v2"},
        {"cuMemcpyDtoD", "cuMemcpyDtoD_v2"}, {"cuPointerGetAttribute", "cuPointerGetAttribute"},
        {"cuPointerGetAttributes", "cuPointerGetAttributes"},
        {"cuIpcGetMemHandle", "cuIpcGetMemHandle"}, {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"},
        {"cuIpcCloseMemHandle", "cuIpcCloseMemHandle"}, {"cuMemAllocAsync", "cuMemAllocAsync"},
        {"cuMemFreeAsync", "cuMemFreeAsync"}, {"cuStreamSynchronize", "cuStreamSynchronize"},
        {"cuStreamCreate", "cuStreamCreate"}, {"cuStreamDestroy", "cuStreamDestroy_v2"},
        {"cuStreamQuery", "cuStreamQuery"}, {"cuStreamWaitEvent", "cuStreamWaitEvent"},
        {"cuEventCreate", "cuEventCreate"}, {"cuEventRecord", "cuEventRecord"},
        {"cuEventQuery", "cuEventQuery"}, {"cuEventSynchronize", "cuEventSynchronize"},
        {"cuEventDestroy", "cuEventDestroy_v2"}, {"cuMemsetD8Async", "cuMemsetD8Async"},
        {"cuMemcpyAsync", "cuMemcpyAsync"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        void *want = dlsym(lib, map[i][1]);
        void *fn = proc(map[i][0], 13000, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS);
        CHECK_MSG(want && fn == want, "%s at 13000 is not %s", map[i][0], map[i][1]);
    }
    /* older versions get the older variants */
    CHECK(proc("cuMemAlloc", 3000, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) == dlsym(lib, "cuMemAlloc"));
    CHECK(proc("cuMemAlloc", 3020, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) == (void *)cu.cuMemAlloc_v2);
    CHECK(proc("cuCtxCreate", 11000, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) == (void *)cu.cuCtxCreate_v2);
    CHECK(proc("cuCtxGetDevice", 12090, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) == (void *)cu.cuCtxGetDevice);
    CHECK(proc("cuDeviceGetUuid", 11000, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) == (void *)cu.cuDeviceGetUuid);
    CHECK(proc("cuIpcOpenMemHandle", 10020, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) ==
          dlsym(lib, "cuIpcOpenMemHandle"));
    CHECK(proc("cuStreamDestroy", 3020, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) ==
          dlsym(lib, "cuStreamDestroy"));
    CHECK(proc("cuEventDestroy", 3020, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS) ==
          dlsym(lib, "cuEventDestroy"));
    proc("cuMemcpyAsync", 3020, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    proc("cuStreamWaitEvent", 3010, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    proc("cuEventDestroy_v2", 13000, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* a variant this driver lacks, versioned names, unknown names, too old */
    proc("cuCtxCreate", 12000, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    proc("cuMemAlloc_v2", 13000, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    proc("cuNoSuchFunction", 13000, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    proc("hm_cuda_test_reset", 13000, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    proc("cuMemAllocAsync", 11010, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    proc("cuInit", 1000, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    /* flags, NULL status, bad arguments */
    void *fn = NULL;
    CU_OK(cu.cuGetProcAddress_v2("cuMemcpy", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
    CHECK(fn == (void *)cu.cuMemcpy);
    CU_OK(cu.cuGetProcAddress_v2("cuMemcpy", &fn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL));
    CHECK(fn == (void *)cu.cuMemcpy);
    CU_EXPECT(cu.cuGetProcAddress_v2("cuMemcpy", &fn, 13000, 4, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuGetProcAddress_v2("cuMemcpy", &fn, 13010, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuGetProcAddress_v2(NULL, &fn, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuGetProcAddress_v2("cuMemcpy", NULL, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
}

/* ---- contexts ---- */

/* With no context current: every call that needs one says so. */
static void expect_no_context(CUresult want) {
    CUdeviceptr d = 0;
    void *h = NULL;
    char buf[16];
    CUdevice dev;
    size_t f, t;
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    CU_EXPECT(cu.cuMemAlloc_v2(&d, 4096), want);
    CU_EXPECT(cu.cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_GLOBAL), want);
    CU_EXPECT(cu.cuMemHostAlloc(&h, 4096, 0), want);
    CU_EXPECT(cu.cuMemAllocHost_v2(&h, 4096), want);
    CU_EXPECT(cu.cuMemAllocAsync(&d, 4096, NULL), want);
    CU_EXPECT(cu.cuMemFree_v2(D(buf)), want);
    CU_EXPECT(cu.cuMemFreeHost(buf), want);
    CU_EXPECT(cu.cuMemsetD8_v2(D(buf), 0, sizeof buf), want);
    CU_EXPECT(cu.cuMemcpy(D(buf), D(buf + 8), 8), want);
    CU_EXPECT(cu.cuMemcpyHtoD_v2(D(buf), buf + 8, 8), want);
    CU_EXPECT(cu.cuMemGetInfo_v2(&f, &t), want);
    CU_EXPECT(cu.cuMemGetAddressRange_v2(NULL, NULL, D(buf)), want);
    CU_EXPECT(cu.cuIpcGetMemHandle(&ih, D(buf)), want);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&d, ih, 0), want);
    CU_EXPECT(cu.cuIpcCloseMemHandle(D(buf)), want);
    CU_EXPECT(cu.cuCtxGetDevice(&dev), want);
    CU_EXPECT(cu.cuCtxGetDevice_v2(&dev, NULL), want);
    CU_EXPECT(cu.cuCtxSynchronize(), want);
    CU_EXPECT(cu.cuCtxSynchronize_v2(NULL), want);
    CU_EXPECT(cu.cuStreamSynchronize(NULL), want);
}

struct barrier_arg {
    pthread_barrier_t *b;
    CUcontext c;
    int fails; /* checks failed in the thread */
};

static void *destroyed_elsewhere(void *arg) {
    struct barrier_arg *a = arg;
    int before = hm_test_failed_count();
    CU_OK(cu.cuCtxSetCurrent(a->c));
    pthread_barrier_wait(a->b); /* main destroys the context now */
    pthread_barrier_wait(a->b);
    CHECK(get_current() == a->c); /* still current here */
    expect_no_context(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CU_EXPECT(cu.cuCtxSetCurrent(a->c), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxPushCurrent_v2(a->c), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cu.cuCtxSetCurrent(NULL));
    CHECK(get_current() == NULL);
    a->fails = hm_test_failed_count() - before;
    return NULL;
}

static void *fresh_thread(void *arg) {
    CUcontext c = arg;
    hm_test_set_context("a second thread");
    /* A new thread has no current context, whatever the others have. */
    CHECK(get_current() == NULL);
    expect_no_context(CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr d = 0;
    CU_OK(cu.cuCtxSetCurrent(c));
    CHECK(get_current() == c);
    CU_OK(cu.cuMemAlloc_v2(&d, 4096));
    CHECK(context_of(d) == c);
    CU_OK(cu.cuMemFree_v2(d));
    return NULL;
}

static void test_contexts(void) {
    hm_test_set_context("contexts");
    CHECK(get_current() == NULL);
    expect_no_context(CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxPopCurrent_v2(NULL), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cu.cuCtxSetCurrent(NULL)); /* nothing to unbind */
    CU_EXPECT(cu.cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT); /* not retained */

    /* primary contexts: one handle per device, reference counted */
    for (int i = 0; i < ndev; i++) {
        CUcontext again = NULL;
        CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&pc[i], i));
        CU_OK(cu.cuDevicePrimaryCtxRetain(&again, i));
        CHECK(again == pc[i]);
        CHECK_EQ(stats().primary_refs[i], 2);
        CU_OK(cu.cuDevicePrimaryCtxRelease_v2(i));
        CHECK_EQ(stats().primary_refs[i], 1);
        for (int j = 0; j < i; j++) CHECK(pc[j] != pc[i]);
    }
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&pc[0], ndev), CUDA_ERROR_INVALID_DEVICE);
    CHECK(get_current() == NULL); /* retain makes nothing current */

    /* the stack: set replaces the top, push and pop */
    CUdevice dev = -1;
    const int o = other_dev();
    set_current(pc[0]);
    CHECK(get_current() == pc[0]);
    CU_OK(cu.cuCtxGetDevice(&dev));
    CHECK_EQ(dev, 0);
    CU_OK(cu.cuCtxGetDevice_v2(&dev, pc[o]));
    CHECK_EQ(dev, o);
    CU_OK(cu.cuCtxGetDevice_v2(&dev, NULL));
    CHECK_EQ(dev, 0);
    CU_OK(cu.cuCtxSynchronize());
    CU_OK(cu.cuCtxSynchronize_v2(pc[o]));
    CU_OK(cu.cuCtxPushCurrent_v2(pc[o]));
    CHECK(get_current() == pc[o]);
    CUcontext popped = NULL;
    CU_OK(cu.cuCtxPopCurrent_v2(&popped));
    CHECK(popped == pc[o]);
    CHECK(get_current() == pc[0]);
    CU_OK(cu.cuCtxPushCurrent_v2(pc[0]));
    CU_OK(cu.cuCtxSetCurrent(pc[o])); /* replaces the top */
    CU_OK(cu.cuCtxPopCurrent_v2(&popped));
    CHECK(popped == pc[o]);
    CHECK(get_current() == pc[0]);
    int bogus;
    CU_EXPECT(cu.cuCtxPushCurrent_v2(NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuCtxPushCurrent_v2((CUcontext)(void *)&bogus), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxSetCurrent((CUcontext)(void *)&bogus), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxGetDevice_v2(&dev, (CUcontext)(void *)&bogus), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxGetCurrent(NULL), CUDA_ERROR_INVALID_VALUE);
    /* 64 deep at most */
    int pushed = 0;
    while (cu.cuCtxPushCurrent_v2(pc[0]) == CUDA_SUCCESS && pushed < 100) pushed++;
    CHECK_EQ(pushed, 63);
    for (int i = 0; i < pushed; i++) CU_OK(cu.cuCtxPopCurrent_v2(NULL));
    CHECK(get_current() == pc[0]);

    /* a second thread sees none until it sets one */
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, fresh_thread, pc[o]) == 0);
    pthread_join(t, NULL);
    hm_test_set_context("contexts");
    CHECK(get_current() == pc[0]);

    /* created contexts: pushed on the caller's stack */
    hm_cuda_test_stats_t s0 = stats();
    CUcontext c2 = NULL, c4 = NULL;
    CU_REQUIRE_OK(cu.cuCtxCreate_v2(&c2, CU_CTX_SCHED_AUTO, 0));
    CHECK(get_current() == c2);
    CHECK(c2 != pc[0]);
    CU_REQUIRE_OK(cu.cuCtxCreate_v4(&c4, NULL, CU_CTX_SCHED_YIELD, ndev - 1));
    CHECK(get_current() == c4);
    CU_OK(cu.cuCtxGetDevice(&dev));
    CHECK_EQ(dev, ndev - 1);
    CHECK_EQ(stats().live_contexts, s0.live_contexts + 2);
    CUcontext x = NULL;
    CUctxCreateParams params;
    memset(&params, 0, sizeof params);
    CU_EXPECT(cu.cuCtxCreate_v4(&x, &params, 0, 0), CUDA_ERROR_INVALID_VALUE);
    params.numExecAffinityParams = 1;
    CU_EXPECT(cu.cuCtxCreate_v4(&x, &params, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
    CU_EXPECT(cu.cuCtxCreate_v2(&x, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuCtxCreate_v2(&x, 0, ndev), CUDA_ERROR_INVALID_DEVICE);
    CU_EXPECT(cu.cuCtxCreate_v2(NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(x == NULL);
    CHECK_EQ(stats().live_contexts, s0.live_contexts + 2);

    /* memory belongs to the context current at allocation; one address
     * space: another context frees it */
    CUdeviceptr d4 = 0;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d4, 4096));
    CHECK(context_of(d4) == c4);
    CHECK_EQ(ordinal_of(d4), ndev - 1);
    CU_OK(cu.cuCtxPushCurrent_v2(pc[0]));
    CHECK(mem_type(d4) == CU_MEMORYTYPE_DEVICE);
    CU_OK(cu.cuMemFree_v2(d4));
    CU_OK(cu.cuCtxPopCurrent_v2(NULL));

    /* destroy: popped when on top */
    CU_OK(cu.cuCtxDestroy_v2(c4));
    CHECK(get_current() == c2);
    CU_EXPECT(cu.cuCtxDestroy_v2(c4), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxDestroy_v2(pc[0]), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuCtxDestroy_v2(NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuCtxSetCurrent(c4), CUDA_ERROR_INVALID_CONTEXT);

    /* destroyed while current to another thread */
    pthread_barrier_t b;
    REQUIRE(pthread_barrier_init(&b, NULL, 2) == 0);
    struct barrier_arg ba = {&b, c2, 0};
    REQUIRE(pthread_create(&t, NULL, destroyed_elsewhere, &ba) == 0);
    pthread_barrier_wait(&b);
    /* its memory goes with it and counts as leaked; async memory stays */
    hm_cuda_test_stats_t s1 = stats();
    CUdeviceptr dd = 0, dm = 0, da = 0;
    void *dh = NULL;
    CU_OK(cu.cuMemAlloc_v2(&dd, 4096));
    CU_OK(cu.cuMemAllocManaged(&dm, 4096, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cu.cuMemHostAlloc(&dh, 4096, 0));
    CU_OK(cu.cuMemAllocAsync(&da, 4096, NULL));
    CHECK_EQ(stats().live_allocs, s1.live_allocs + 4);
    CU_OK(cu.cuCtxDestroy_v2(c2));
    pthread_barrier_wait(&b);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&b);
    CHECK_EQ(ba.fails, 0);
    hm_cuda_test_stats_t s2 = stats();
    CHECK_EQ(s2.leaks, s1.leaks + 3);
    CHECK_EQ(s2.live_allocs, s1.live_allocs + 1);
    CHECK_EQ(s2.live_async_allocs, s1.live_async_allocs + 1);
    CHECK_EQ(s2.live_contexts, s0.live_contexts);
    CHECK(get_current() == pc[0]);
    CU_OK(cu.cuMemFreeAsync(da, NULL));
    CHECK_EQ(stats().live_allocs, s1.live_allocs);
}

/* ---- allocations ---- */

static void test_alloc(void) {
    hm_test_set_context("allocations");
    set_current(pc[0]);
    hm_cuda_test_stats_t s0 = stats();
    const size_t sizes[] = {1, 511, 4096, 2 * MIB, 2 * MIB + 1, 5 * MIB};
    CUdeviceptr d[6];
    uint64_t charged = 0;
    for (int i = 0; i < 6; i++) {
        d[i] = 0;
        CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d[i], sizes[i]));
        const size_t unit = sizes[i] < GRAN ? 4 * KIB : GRAN;
        CHECK_MSG(d[i] % unit == 0, "cuMemAlloc_v2(%zu) -> %#llx is not %zu aligned", sizes[i], d[i], unit);
        CHECK(d[i] >= ctl.va_base() && d[i] < ctl.va_base() + HM_CUDA_TEST_VA_SIZE);
        charged += (sizes[i] + unit - 1) / unit * unit;
        CUdeviceptr base = 0;
        size_t size = 0;
        CU_OK(cu.cuMemGetAddressRange_v2(&base, &size, d[i] + sizes[i] - 1));
        CHECK(base == d[i] && size == sizes[i]);
        CU_OK(cu.cuMemGetAddressRange_v2(NULL, &size, d[i]));
        CU_OK(cu.cuMemGetAddressRange_v2(&base, NULL, d[i]));
        /* the rounding is not part of the allocation (past a multiple of
         * the unit another allocation may start) */
        if (sizes[i] % unit)
            CU_EXPECT(cu.cuMemGetAddressRange_v2(&base, &size, d[i] + sizes[i]), CUDA_ERROR_NOT_FOUND);
    }
    hm_cuda_test_stats_t s1 = stats();
    CHECK_EQ(s1.device_used[0], s0.device_used[0] + charged);
    CHECK_EQ(s1.live_device_allocs, s0.live_device_allocs + 6);
    size_t f = 0, t = 0;
    CU_OK(cu.cuMemGetInfo_v2(&f, &t));
    CHECK_EQ(t, limit);
    CHECK_EQ(f, limit - s1.device_used[0]);
    CU_EXPECT(cu.cuMemGetInfo_v2(NULL, &t), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr z = 7;
    CU_EXPECT(cu.cuMemAlloc_v2(&z, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(z, 7);
    CU_EXPECT(cu.cuMemAlloc_v2(NULL, 4096), CUDA_ERROR_INVALID_VALUE);
    int local = 0;
    CU_EXPECT(cu.cuMemGetAddressRange_v2(NULL, NULL, D(&local)), CUDA_ERROR_NOT_FOUND);

    /* host memory: every flag and their mix, read-write from the host */
    const unsigned flags[] = {0, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP,
                              CU_MEMHOSTALLOC_WRITECOMBINED,
                              CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                  CU_MEMHOSTALLOC_WRITECOMBINED};
    void *h[6];
    for (int i = 0; i < 5; i++) {
        h[i] = NULL;
        CU_REQUIRE_OK(cu.cuMemHostAlloc(&h[i], 10000, flags[i]));
        CHECK((uintptr_t)h[i] % 4096 == 0);
        memset(h[i], i, 10000);
        CHECK(mem_type(D(h[i])) == CU_MEMORYTYPE_HOST);
    }
    h[5] = NULL;
    CU_REQUIRE_OK(cu.cuMemAllocHost_v2(&h[5], 3));
    ((volatile char *)h[5])[2] = 1;
    void *hx = (void *)(uintptr_t)5;
    CU_EXPECT(cu.cuMemHostAlloc(&hx, 4096, 0x8), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemHostAlloc(&hx, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAllocHost_v2(&hx, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemHostAlloc(NULL, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(hx == (void *)(uintptr_t)5);
    CHECK_EQ(stats().live_host_allocs, s0.live_host_allocs + 6);
    CHECK_EQ(stats().device_used[0], s1.device_used[0]); /* not charged */

    /* managed memory */
    CUdeviceptr m[2] = {0, 0};
    CU_REQUIRE_OK(cu.cuMemAllocManaged(&m[0], 5000, CU_MEM_ATTACH_GLOBAL));
    CU_REQUIRE_OK(cu.cuMemAllocManaged(&m[1], 3 * MIB, CU_MEM_ATTACH_HOST));
    CHECK(m[0] % GRAN == 0 && m[1] % GRAN == 0);
    memset(P(m[0]), 0x11, 5000);
    memset(P(m[1]), 0x22, 3 * MIB);
    CU_EXPECT(cu.cuMemAllocManaged(&z, 4096, CU_MEM_ATTACH_SINGLE), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAllocManaged(&z, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAllocManaged(&z, 4096, 3), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAllocManaged(&z, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(z, 7);
    CHECK_EQ(stats().live_managed_allocs, s0.live_managed_allocs + 2);

    /* frees take base pointers of their own kinds only */
    CU_EXPECT(cu.cuMemFree_v2(D(h[0])), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFreeHost(P(d[0])), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFreeHost(P(m[0])), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFree_v2(d[2] + 64), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFreeHost((char *)h[0] + 64), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFree_v2(0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFree_v2(D(&local)), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFreeHost(&local), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_allocs, s0.live_allocs + 14);
    for (int i = 0; i < 6; i++) CU_OK(cu.cuMemFree_v2(d[i]));
    for (int i = 0; i < 6; i++) CU_OK(cu.cuMemFreeHost(h[i]));
    for (int i = 0; i < 2; i++) CU_OK(cu.cuMemFree_v2(m[i]));
    CU_EXPECT(cu.cuMemFree_v2(d[0]), CUDA_ERROR_INVALID_VALUE); /* twice */
    CU_EXPECT(cu.cuMemFreeHost(h[0]), CUDA_ERROR_INVALID_VALUE);
    hm_cuda_test_stats_t s2 = stats();
    CHECK_EQ(s2.live_allocs, s0.live_allocs);
    CHECK_EQ(s2.device_used[0], s0.device_used[0]);
}

/* ---- pointer attributes ---- */

static void *no_context_attrs(void *arg) {
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)arg;
    CUdeviceptr dp = 0;
    /* most attributes need no context; the device pointer does */
    CHECK(mem_type(d) == CU_MEMORYTYPE_DEVICE);
    CU_EXPECT(cu.cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, d),
              CUDA_ERROR_INVALID_CONTEXT);
    return NULL;
}

static void test_attributes(void) {
    hm_test_set_context("pointer attributes");
    set_current(pc[0]);
    const int o = other_dev();
    CUdeviceptr d = 0, d1 = 0, m = 0;
    void *h = NULL;
    const size_t dsize = 3 * MIB + 17;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d, dsize));
    CU_REQUIRE_OK(cu.cuMemAllocManaged(&m, 8192, CU_MEM_ATTACH_GLOBAL));
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&h, 8192, CU_MEMHOSTALLOC_PORTABLE));
    CU_OK(cu.cuCtxPushCurrent_v2(pc[o]));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d1, 4096));
    CU_OK(cu.cuCtxPopCurrent_v2(NULL));

    /* device memory, asked at an interior address */
    const CUdeviceptr in = d + 2 * MIB + 5;
    CUcontext c = NULL;
    unsigned u = 99;
    CUdeviceptr dp = 0, start = 0;
    void *hp = (void *)(uintptr_t)1;
    size_t rs = 0;
    CUmemoryPool pool = (CUmemoryPool)(uintptr_t)1;
    CHECK(mem_type(in) == CU_MEMORYTYPE_DEVICE);
    CHECK(context_of(in) == pc[0]);
    CHECK_EQ(ordinal_of(in), 0);
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, in));
    CHECK_EQ(u, 0);
    CU_OK(cu.cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, in));
    CHECK(dp == in);
    CU_EXPECT(cu.cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, in), CUDA_ERROR_INVALID_VALUE);
    CHECK(hp == (void *)(uintptr_t)1);
    CU_OK(cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, in));
    CHECK(start == d);
    CU_OK(cu.cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, in));
    CHECK_EQ(rs, dsize);
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, in));
    CHECK_EQ(u, 1);
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MAPPED, in));
    CHECK_EQ(u, 1);
    CU_OK(cu.cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, in));
    CHECK(pool == NULL);
    CHECK(buffer_id(in) == buffer_id(d));
    /* another device's memory, asked from this context */
    CHECK(context_of(d1) == pc[o]);
    CHECK_EQ(ordinal_of(d1), o);

    /* managed: device memory that is managed; host: host memory */
    CHECK(mem_type(m + 100) == CU_MEMORYTYPE_DEVICE);
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 100));
    CHECK_EQ(u, 1);
    CU_OK(cu.cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, m + 100));
    CHECK(hp == P(m + 100));
    CHECK(mem_type(D(h) + 8191) == CU_MEMORYTYPE_HOST);
    CU_OK(cu.cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, D(h) + 8));
    CHECK(hp == (char *)h + 8);
    CU_OK(cu.cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, D(h) + 8));
    CHECK(dp == D(h) + 8);
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, D(h)));
    CHECK_EQ(u, 0);
    CHECK(context_of(D(h)) == pc[0]);

    /* buffer ids: distinct, and never reused, even at a reused address */
    unsigned long long ids[4] = {buffer_id(d), buffer_id(d1), buffer_id(m), buffer_id(D(h))};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < i; j++) CHECK(ids[i] != ids[j] && ids[i] != 0);
    unsigned long long last = ids[0];
    bool reused = false;
    for (int i = 0; i < 8; i++) {
        CUdeviceptr x = 0;
        CU_REQUIRE_OK(cu.cuMemAlloc_v2(&x, 4096));
        unsigned long long xid = buffer_id(x);
        for (int j = 0; j < 4; j++) CHECK(xid != ids[j]);
        CHECK(xid > last);
        last = xid;
        CU_OK(cu.cuMemFree_v2(x));
        CUdeviceptr y = 0;
        CU_REQUIRE_OK(cu.cuMemAlloc_v2(&y, 4096));
        reused |= y == x;
        CHECK(buffer_id(y) > xid);
        last = buffer_id(y);
        CU_OK(cu.cuMemFree_v2(y));
    }
    CHECK_MSG(reused, "a freed address never came back for the same size");

    /* several at once: the same values */
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
    CUcontext a_ctx = NULL;
    unsigned a_type = 0, a_managed = 9;
    unsigned long long a_id = 0;
    int a_ord = -1;
    CUdeviceptr a_start = 0, a_dp = 0;
    size_t a_size = 0;
    void *a_hp = (void *)(uintptr_t)1;
    void *data[] = {&a_ctx, &a_type, &a_id, &a_managed, &a_ord, &a_start, &a_size, &a_hp, &a_dp};
    CU_OK(cu.cuPointerGetAttributes(9, at, data, in));
    CHECK(a_ctx == pc[0] && a_type == CU_MEMORYTYPE_DEVICE && a_id == ids[0] && a_managed == 0 &&
          a_ord == 0 && a_start == d && a_size == dsize && a_hp == NULL && a_dp == in);
    /* an address the driver does not know: zeros and SUCCESS here, an
     * error from the single query */
    int local = 0;
    memset(&a_ctx, 0xff, sizeof a_ctx);
    a_type = a_managed = 0xffffffffu;
    a_id = ~0ull;
    a_ord = -5;
    a_start = a_dp = ~0ull;
    a_size = SIZE_MAX;
    a_hp = (void *)(uintptr_t)1;
    CU_OK(cu.cuPointerGetAttributes(9, at, data, D(&local)));
    CHECK(a_ctx == NULL && a_type == 0 && a_id == 0 && a_managed == 0 && a_ord == 0 &&
          a_start == 0 && a_size == 0 && a_hp == NULL && a_dp == 0);
    CU_EXPECT(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, D(&local)),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, D(&local)),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + dsize),
              CUDA_ERROR_INVALID_VALUE); /* the rounding */
    CU_EXPECT(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0), CUDA_ERROR_INVALID_VALUE);
    /* attributes not answered, bad arguments: nothing written */
    CU_EXPECT(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_P2P_TOKENS, d), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute bad[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS};
    void *bdata[] = {&a_type, &u};
    a_type = 77;
    CU_EXPECT(cu.cuPointerGetAttributes(2, bad, bdata, d), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(a_type, 77);
    CU_EXPECT(cu.cuPointerGetAttributes(0, at, data, d), CUDA_ERROR_INVALID_VALUE);
    void *nodata[] = {&a_ctx, NULL};
    CU_EXPECT(cu.cuPointerGetAttributes(2, at, nodata, d), CUDA_ERROR_INVALID_VALUE);

    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, no_context_attrs, (void *)(uintptr_t)d) == 0);
    pthread_join(t, NULL);

    CU_OK(cu.cuMemFree_v2(d));
    CU_OK(cu.cuMemFree_v2(d1));
    CU_OK(cu.cuMemFree_v2(m));
    CU_OK(cu.cuMemFreeHost(h));
}

/* ---- the device limit ---- */

static void test_limits(void) {
    hm_test_set_context("limits");
    set_current(pc[0]);
    const int o = other_dev();
    const uint64_t used0 = stats().device_used[0];
    CHECK_EQ(ctl.set_mem_limit(0, used0 + 8 * MIB), 0);
    size_t total = 0, f = 0;
    CU_OK(cu.cuDeviceTotalMem_v2(&total, 0));
    CHECK_EQ(total, used0 + 8 * MIB);
    CUdeviceptr a = 0, b = 0, c = 7, x = 7;
    CU_OK(cu.cuMemAlloc_v2(&a, 4 * MIB));
    CU_OK(cu.cuMemAlloc_v2(&b, 3 * MIB + 1)); /* charged as 4 MiB */
    CU_OK(cu.cuMemGetInfo_v2(&f, &total));
    CHECK_EQ(f, 0);
    CU_EXPECT(cu.cuMemAlloc_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CU_EXPECT(cu.cuMemAllocAsync(&c, 1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(c, 7);
    /* managed and host memory are not charged; other devices have their own */
    CUdeviceptr m = 0;
    void *h = NULL;
    CU_OK(cu.cuMemAllocManaged(&m, 16 * MIB, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cu.cuMemHostAlloc(&h, 16 * MIB, 0));
    if (o != 0) {
        CU_OK(cu.cuCtxPushCurrent_v2(pc[o]));
        CU_OK(cu.cuMemAlloc_v2(&x, 8 * MIB));
        CU_OK(cu.cuMemFree_v2(x));
        CU_OK(cu.cuCtxPopCurrent_v2(NULL));
    }
    /* room again after a free */
    CU_OK(cu.cuMemFree_v2(b));
    CU_OK(cu.cuMemAlloc_v2(&c, 4 * MIB));
    CU_EXPECT(cu.cuMemAlloc_v2(&x, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cu.cuMemFree_v2(a));
    CU_OK(cu.cuMemFree_v2(c));
    CU_EXPECT(cu.cuMemAlloc_v2(&x, 8 * MIB + 1), CUDA_ERROR_OUT_OF_MEMORY); /* larger than it all */
    CU_OK(cu.cuMemAlloc_v2(&x, 8 * MIB));
    CU_OK(cu.cuMemFree_v2(x));
    CU_OK(cu.cuMemFree_v2(m));
    CU_OK(cu.cuMemFreeHost(h));
    /* a limit below what is live: live memory stays, nothing more fits */
    CU_OK(cu.cuMemAlloc_v2(&a, 2 * MIB));
    CHECK_EQ(ctl.set_mem_limit(0, MIB), 0);
    CU_EXPECT(cu.cuMemAlloc_v2(&x, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cu.cuMemGetInfo_v2(&f, &total));
    CHECK_EQ(f, 0);
    CU_OK(cu.cuMemFree_v2(a));
    CHECK_EQ(ctl.set_mem_limit(0, 0), -1);
    CHECK_EQ(ctl.set_mem_limit(HM_CUDA_TEST_MAX_DEVICES, MIB), -1);
    CHECK_EQ(ctl.set_mem_limit(-1, limit), 0);
    CU_OK(cu.cuDeviceTotalMem_v2(&total, 0));
    CHECK_EQ(total, limit);
    CHECK_EQ(stats().device_used[0], used0);
}

/* ---- a CPU touch of device memory faults ---- */

static void *fault_expected;

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (si->si_addr != fault_expected) _exit(98);
    /* The right address: die of the signal (sanitizers would turn a fatal
     * signal into a report and an exit, so the default comes back here and
     * the access faults again). */
    signal(sig, SIG_DFL);
}

/* How a forked child that reads (or writes) p ends: the signal, or 0 when
 * it returned, -1 otherwise. */
static int touch_in_child(void *p, bool write) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl);
        fault_expected = p;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        if (write)
            *(volatile char *)p = 1;
        else
            (void)*(volatile char *)p;
        _exit(0);
    }
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    if (WIFSIGNALED(st)) return WTERMSIG(st);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void test_faults(void) {
    hm_test_set_context("device faults");
    set_current(pc[0]);
    CUdeviceptr d = 0, a = 0, m = 0;
    void *h = NULL;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d, 3 * MIB));
    CU_REQUIRE_OK(cu.cuMemAllocAsync(&a, 4096, NULL));
    CU_REQUIRE_OK(cu.cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    CU_REQUIRE_OK(cu.cuMemAllocHost_v2(&h, 4096));
    CU_OK(cu.cuMemsetD8_v2(d, 1, 3 * MIB)); /* written through the alias, still no CPU access */
    CHECK_EQ(touch_in_child(P(d), false), SIGSEGV);
    CHECK_EQ(touch_in_child(P(d + 2 * MIB + 7), true), SIGSEGV);
    CHECK_EQ(touch_in_child(P(a), true), SIGSEGV);
    CHECK_EQ(touch_in_child(P(m), true), 0);
    CHECK_EQ(touch_in_child(h, false), 0);
    CU_OK(cu.cuMemFree_v2(d));
    CU_OK(cu.cuMemFreeAsync(a, NULL));
    CU_OK(cu.cuMemFree_v2(m));
    CU_OK(cu.cuMemFreeHost(h));
}

/* ---- memset and copies ---- */

enum kind { K_DEVICE, K_HOST, K_MANAGED, K_PLAIN, K_COUNT };
static const char *const kind_names[K_COUNT] = {"device", "host", "managed", "plain"};

static CUdeviceptr make(enum kind k, size_t n) {
    CUdeviceptr p = 0;
    void *h = NULL;
    switch (k) {
    case K_DEVICE: CU_REQUIRE_OK(cu.cuMemAlloc_v2(&p, n)); break;
    case K_HOST: CU_REQUIRE_OK(cu.cuMemHostAlloc(&h, n, 0)); p = D(h); break;
    case K_MANAGED: CU_REQUIRE_OK(cu.cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL)); break;
    default: h = malloc(n); REQUIRE(h); p = D(h); break;
    }
    return p;
}

static void unmake(enum kind k, CUdeviceptr p) {
    switch (k) {
    case K_DEVICE: case K_MANAGED: CU_OK(cu.cuMemFree_v2(p)); break;
    case K_HOST: CU_OK(cu.cuMemFreeHost(P(p))); break;
    default: free(P(p)); break;
    }
}

static void fill(uint8_t *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 9));
}

static void test_copies(void) {
    hm_test_set_context("memset/memcpy");
    set_current(pc[0]);
    const int o = other_dev();
    const size_t n = MIB + 123;
    uint8_t *src = malloc(n), *back = malloc(n);
    REQUIRE(src && back);

    /* memset and the typed copies */
    CUdeviceptr d0 = 0, d1 = 0;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d0, n));
    CU_OK(cu.cuCtxPushCurrent_v2(pc[o]));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d1, n));
    CU_OK(cu.cuCtxPopCurrent_v2(NULL));
    CU_OK(cu.cuMemsetD8_v2(d0, 0xab, n));
    CHECK(all_bytes(d0, 0xab, n));
    fill(src, n, 1);
    CU_OK(cu.cuMemcpyHtoD_v2(d0, src, n));
    CU_OK(cu.cuMemcpyDtoD_v2(d1, d0, n)); /* across devices */
    memset(back, 0, n);
    CU_OK(cu.cuMemcpyDtoH_v2(back, d1, n));
    CHECK(memcmp(back, src, n) == 0);
    CU_OK(cu.cuMemsetD8_v2(d1 + 1000, 0x5c, 24));
    CU_OK(cu.cuMemcpyDtoH_v2(back, d1 + 990, 40));
    CHECK(memcmp(back, src + 990, 10) == 0 && back[10] == 0x5c && back[33] == 0x5c &&
          memcmp(back + 34, src + 1024, 6) == 0);

    /* cuMemcpy: every pair of kinds */
    for (int s = 0; s < K_COUNT; s++)
        for (int t = 0; t < K_COUNT; t++) {
            CUdeviceptr ps = make((enum kind)s, n), pt = make((enum kind)t, n);
            fill(src, n, (unsigned)(s * 4 + t));
            CU_OK(cu.cuMemcpy(ps, D(src), n));
            if (t == K_PLAIN)
                memset(P(pt), 0, n);
            else
                CU_OK(cu.cuMemsetD8_v2(pt, 0, n));
            CU_OK(cu.cuMemcpy(pt + 7, ps + 3, n - 10));
            memset(back, 0, n);
            CU_OK(cu.cuMemcpy(D(back), pt + 7, n - 10));
            CHECK_MSG(memcmp(back, src + 3, n - 10) == 0, "cuMemcpy %s -> %s", kind_names[s],
                      kind_names[t]);
            if (t != K_DEVICE) CHECK(memcmp(P(pt + 7), src + 3, n - 10) == 0); /* CPU view */
            unmake((enum kind)s, ps);
            unmake((enum kind)t, pt);
        }

    /* host and managed memory work with the typed calls too */
    void *h = NULL;
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&h, 4096, 0));
    CU_OK(cu.cuMemsetD8_v2(D(h), 0x3e, 4096));
    CHECK(((uint8_t *)h)[4095] == 0x3e);
    CU_OK(cu.cuMemcpyDtoD_v2(D(h), d0, 4096));
    fill(back, 4096, 1); /* what d0 holds: the first fill */
    CHECK(memcmp(h, back, 4096) == 0);

    /* ranges past an allocation, plain memory where driver memory is due */
    CU_EXPECT(cu.cuMemcpyDtoH_v2(back, d0 + n - 10, 11), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyHtoD_v2(d0, src, n + 1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyDtoD_v2(d1, d0 + 1, n), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpy(d0 + 5, d1, n), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemsetD8_v2(d0, 0, n + 1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemsetD8_v2(D(h) + 4000, 0, 97), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemsetD8_v2(D(back), 0, 16), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyHtoD_v2(D(back), src, 16), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyDtoH_v2(back, D(src), 16), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyDtoD_v2(d0, D(src), 16), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpy(D(back), d0 + n, 1), CUDA_ERROR_INVALID_VALUE); /* the rounding */
    CU_EXPECT(cu.cuMemcpy(D(back), d0 - 16, 32), CUDA_ERROR_INVALID_VALUE); /* runs into d0 */
    CU_EXPECT(cu.cuMemcpy(D(back), 0, 16), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemcpy(0, 0, 0)); /* nothing to copy */
    CU_OK(cu.cuMemsetD8_v2(0, 0, 0));

    CU_OK(cu.cuMemFreeHost(h));
    CU_OK(cu.cuMemFree_v2(d0));
    CU_OK(cu.cuMemFree_v2(d1));
    free(src);
    free(back);
}

/* ---- queued work: device memsets and copies wait for a synchronising call ---- */

static uint64_t pending(void) { return stats().pending_ops; }

static void test_queue(void) {
    hm_test_set_context("queued work");
    set_current(pc[0]);
    const unsigned lenient = ctl.get_lenient();
    ctl.set_lenient(lenient & ~HM_CUDA_TEST_LENIENT_SYNC);
    CUdeviceptr a = 0, b = 0, m = 0;
    void *hv = NULL;
    uint8_t buf[64];
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&a, 8192));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&b, 8192));
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&hv, 4096, 0));
    CU_REQUIRE_OK(cu.cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    uint8_t *h = hv, *mh = P(m);
    CU_OK(cu.cuCtxSynchronize());
    CHECK_EQ(pending(), 0);
    CU_OK(cu.cuMemsetD8_v2(a, 1, 8192));
    CU_OK(cu.cuMemcpyDtoD_v2(b, a, 8192));
    CU_OK(cu.cuMemcpy(b + 4096, a, 16)); /* device memory on both sides */
    CHECK_EQ(pending(), 3);
    CU_OK(cu.cuStreamSynchronize(NULL));
    CHECK_EQ(pending(), 0);
    CHECK(all_bytes(b, 1, 8192));
    /* in order: the copy sees the memset queued before it, not the one after */
    CU_OK(cu.cuMemsetD8_v2(a, 2, 8192));
    CU_OK(cu.cuMemcpyDtoD_v2(b, a, 8192));
    CU_OK(cu.cuMemsetD8_v2(a, 3, 8192));
    CHECK_EQ(pending(), 3);
    memset(buf, 0, sizeof buf);
    CU_OK(cu.cuMemcpyDtoH_v2(buf, b, sizeof buf)); /* runs the queue, then copies */
    CHECK_EQ(pending(), 0);
    CHECK(buf[0] == 2 && buf[63] == 2);
    CHECK(all_bytes(a, 3, 8192));
    /* memsets of pinned and managed memory and copies with a host side are
     * synchronous, after the queue */
    CU_OK(cu.cuMemsetD8_v2(a, 4, 8192));
    CU_OK(cu.cuMemsetD8_v2(D(h), 5, 4096));
    CHECK_EQ(pending(), 0);
    CHECK(h[0] == 5 && h[4095] == 5);
    CU_OK(cu.cuMemsetD8_v2(a, 6, 8192));
    CU_OK(cu.cuMemsetD8_v2(m, 7, 4096));
    CHECK_EQ(pending(), 0);
    CHECK(mh[0] == 7 && mh[4095] == 7);
    CU_OK(cu.cuMemsetD8_v2(a, 8, 8192));
    CU_OK(cu.cuMemcpyHtoD_v2(b, buf, sizeof buf));
    CHECK_EQ(pending(), 0);
    CU_OK(cu.cuMemsetD8_v2(a, 9, 8192));
    CU_OK(cu.cuMemcpy(D(h), a, 4096)); /* pinned host memory: a host side */
    CHECK_EQ(pending(), 0);
    CHECK(h[0] == 9 && h[4095] == 9);
    CU_OK(cu.cuMemsetD8_v2(a, 10, 8192));
    CU_OK(cu.cuMemcpy(m, a, 4096)); /* managed memory: a host side */
    CHECK_EQ(pending(), 0);
    CHECK(mh[0] == 10);
    CU_OK(cu.cuMemsetD8_v2(a, 11, 8192));
    CU_OK(cu.cuCtxSynchronize_v2(NULL));
    CHECK_EQ(pending(), 0);
    CU_OK(cu.cuMemsetD8_v2(a, 12, 8192));
    CU_OK(cu.cuCtxSynchronize());
    CHECK_EQ(pending(), 0);
    /* cuMemFree_v2 synchronises */
    CU_OK(cu.cuMemsetD8_v2(b, 13, 8192));
    CHECK_EQ(pending(), 1);
    CU_OK(cu.cuMemFree_v2(a));
    CHECK_EQ(pending(), 0);
    CHECK(all_bytes(b, 13, 8192));
    /* a refused memset queues nothing; the queue is bounded */
    CU_EXPECT(cu.cuMemsetD8_v2(b, 1, 8193), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(pending(), 0);
    for (int i = 0; i < 1500; i++) CU_OK(cu.cuMemsetD8_v2(b + (unsigned)i, (unsigned char)i, 1));
    CHECK(pending() > 0 && pending() <= 1024);
    CU_OK(cu.cuMemcpyDtoH_v2(buf, b + 1400, 8));
    CHECK(buf[0] == (uint8_t)1400 && buf[7] == (uint8_t)1407);
    /* LENIENT_SYNC: at once */
    ctl.set_lenient(lenient | HM_CUDA_TEST_LENIENT_SYNC);
    CU_OK(cu.cuMemsetD8_v2(b, 14, 8192));
    CHECK_EQ(pending(), 0);
    ctl.set_lenient(lenient);
    CU_OK(cu.cuMemFree_v2(b));
    CU_OK(cu.cuMemFreeHost(hv));
    CU_OK(cu.cuMemFree_v2(m));
}

/* ---- write-combined host memory: a device address of its own ---- */

static void test_write_combined(void) {
    hm_test_set_context("write-combined");
    set_current(pc[0]);
    const unsigned lenient = ctl.get_lenient();
    ctl.set_lenient(lenient & ~HM_CUDA_TEST_LENIENT_WC);
    const hm_cuda_test_stats_t s0 = stats();
    void *wv = NULL, *hv = NULL;
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&wv, 10000, CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_DEVICEMAP));
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&hv, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    uint8_t *w = wv;
    CUdeviceptr dw = 0, dh = 0, x = 7;
    CU_OK(cu.cuMemHostGetDevicePointer_v2(&dw, wv, 0));
    CHECK(dw != 0 && dw != D(wv));
    CHECK(dw >= ctl.va_base() && dw < ctl.va_base() + HM_CUDA_TEST_VA_SIZE);
    CU_OK(cu.cuMemHostGetDevicePointer_v2(&x, w + 100, 0)); /* an interior pointer */
    CHECK(x == dw + 100);
    CU_OK(cu.cuMemHostGetDevicePointer_v2(&dh, hv, 0));
    CHECK(dh == D(hv)); /* other pinned memory: the same address */
    x = 7;
    CU_EXPECT(cu.cuMemHostGetDevicePointer_v2(&x, wv, 1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemHostGetDevicePointer_v2(NULL, wv, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemHostGetDevicePointer_v2(&x, P(dw), 0), CUDA_ERROR_INVALID_VALUE);
    int local = 0;
    CU_EXPECT(cu.cuMemHostGetDevicePointer_v2(&x, &local, 0), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr d = 0;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_EXPECT(cu.cuMemHostGetDevicePointer_v2(&x, P(d), 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(x, 7);
    /* the device address works where device pointers go; the host pointer
     * does not */
    CU_OK(cu.cuMemsetD8_v2(dw, 0x21, 10000));
    CHECK(w[0] == 0x21 && w[9999] == 0x21); /* pinned: synchronous */
    CU_EXPECT(cu.cuMemsetD8_v2(D(wv), 0, 16), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyHtoD_v2(D(wv), &local, 4), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyDtoH_v2(&local, D(wv), 4), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyDtoD_v2(d, D(wv), 4), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyDtoD_v2(D(wv), d, 4), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemsetD8_v2(d, 0x42, 4096));
    CU_OK(cu.cuMemcpyDtoD_v2(dw + 8, d, 16));
    CHECK(w[8] == 0x42 && w[23] == 0x42 && w[24] == 0x21);
    CU_OK(cu.cuMemcpyHtoD_v2(dw, "abc", 3));
    CHECK(memcmp(w, "abc", 3) == 0);
    char back[4] = {0};
    CU_OK(cu.cuMemcpyDtoH_v2(back, dw, 3));
    CHECK(memcmp(back, "abc", 3) == 0);
    CU_OK(cu.cuMemcpy(D(back), D(wv) + 1, 2)); /* cuMemcpy takes the host pointer as host memory */
    CHECK(back[0] == 'b' && back[1] == 'c');
    /* attributes of either address */
    unsigned u = 0;
    void *hp = NULL;
    CUdeviceptr dp = 0;
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dw + 5));
    CHECK_EQ(u, CU_MEMORYTYPE_HOST);
    CU_OK(cu.cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, dw + 5));
    CHECK(hp == w + 5);
    CU_OK(cu.cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, D(w + 5)));
    CHECK(dp == dw + 5);
    CHECK(buffer_id(dw) == buffer_id(D(wv)));
    CHECK_EQ(touch_in_child(P(dw), false), SIGSEGV);
    CHECK_EQ(stats().live_host_allocs, s0.live_host_allocs + 2);
    /* freed by its host pointer only, both addresses at once */
    CU_EXPECT(cu.cuMemFreeHost(P(dw)), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFree_v2(dw), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemFreeHost(wv));
    CU_EXPECT(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dw), CUDA_ERROR_INVALID_VALUE);
    /* LENIENT_WC: the host pointer on both sides */
    ctl.set_lenient(lenient | HM_CUDA_TEST_LENIENT_WC);
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&wv, 4096, CU_MEMHOSTALLOC_WRITECOMBINED));
    CU_OK(cu.cuMemHostGetDevicePointer_v2(&dw, wv, 0));
    CHECK(dw == D(wv));
    CU_OK(cu.cuMemsetD8_v2(D(wv), 1, 4096));
    CU_OK(cu.cuMemFreeHost(wv));
    ctl.set_lenient(lenient);
    CU_OK(cu.cuMemFreeHost(hv));
    CU_OK(cu.cuMemFree_v2(d));
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
}

/* ---- sticky errors ---- */

static void test_sticky(void) {
    hm_test_set_context("sticky errors");
    set_current(pc[0]);
    const hm_cuda_test_stats_t s0 = stats();
    CUdeviceptr d = 0;
    int n = 0, v = 0;
    const char *s = NULL;
    CHECK_EQ(ctl.fail_sticky("cuMemAlloc_v2", 2, CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    CU_OK(cu.cuMemAlloc_v2(&d, 4096)); /* the first goes through */
    CU_EXPECT(cu.cuMemAlloc_v2(&d, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* from now on, every call */
    CU_EXPECT(cu.cuMemFree_v2(d), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUcontext c = NULL;
    CU_EXPECT(cu.cuCtxGetCurrent(&c), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuInit(0), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* but the error's text and the version */
    CU_OK(cu.cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &s));
    CHECK(s && strcmp(s, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    CU_OK(cu.cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &s));
    CU_OK(cu.cuDriverGetVersion(&v));
    CHECK_EQ(stats().live_device_allocs, s0.live_device_allocs + 1); /* nothing freed */
    ctl.reset();
    CU_OK(cu.cuMemFree_v2(d));
    CU_OK(cu.cuDeviceGetCount(&n));
    /* fail_next is not sticky */
    CHECK_EQ(ctl.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    CU_EXPECT(cu.cuMemAlloc_v2(&d, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_OK(cu.cuDeviceGetCount(&n));
    CHECK_EQ(ctl.fail_sticky("cuNoSuchFunction", 1, CUDA_ERROR_UNKNOWN), -1);
    CHECK_EQ(ctl.fail_sticky("cuMemAlloc_v2", 1, CUDA_SUCCESS), -1);
    CHECK_EQ(ctl.fail_sticky("cuMemAlloc_v2", 1, CUDA_ERROR_UNKNOWN), 0);
    CHECK_EQ(ctl.fail_sticky("cuMemAlloc_v2", 0, CUDA_ERROR_UNKNOWN), 0); /* cancelled */
    CU_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_OK(cu.cuMemFree_v2(d));
}

/* ---- stream-ordered allocation ---- */

static void test_async(void) {
    hm_test_set_context("async");
    set_current(pc[0]);
    hm_cuda_test_stats_t s0 = stats();
    CUmemoryPool pool = NULL, got = NULL;
    CU_OK(cu.cuDeviceGetDefaultMemPool(&pool, 0));
    CUdeviceptr a = 0, b = 0, d = 0;
    CU_REQUIRE_OK(cu.cuMemAllocAsync(&a, MIB, NULL));
    CU_REQUIRE_OK(cu.cuMemAllocAsync(&b, 100, CU_STREAM_PER_THREAD));
    CHECK(a % (4 * KIB) == 0 && b % (4 * KIB) == 0);
    CU_OK(cu.cuStreamSynchronize(NULL));
    CU_OK(cu.cuStreamSynchronize(CU_STREAM_LEGACY));
    CU_OK(cu.cuStreamSynchronize(CU_STREAM_PER_THREAD));
    CU_OK(cu.cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a));
    CHECK(got == pool);
    CHECK(mem_type(a) == CU_MEMORYTYPE_DEVICE);
    unsigned u = 9;
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a));
    CHECK_EQ(u, 0);
    CUipcMemHandle ih;
    CU_EXPECT(cu.cuIpcGetMemHandle(&ih, a), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemsetD8_v2(a, 0x61, MIB));
    CHECK(all_bytes(a, 0x61, MIB));
    CHECK_EQ(stats().live_async_allocs, s0.live_async_allocs + 2);
    CHECK_EQ(stats().device_used[0], s0.device_used[0] + MIB + 4 * KIB);
    CUstream bogus = (CUstream)(uintptr_t)0x1234;
    CU_EXPECT(cu.cuMemAllocAsync(&d, 64, bogus), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuMemFreeAsync(a, bogus), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuMemAllocAsync(&d, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemFreeAsync(a + 1, NULL), CUDA_ERROR_INVALID_VALUE);
    void *h = NULL;
    CU_OK(cu.cuMemAllocHost_v2(&h, 64));
    CU_EXPECT(cu.cuMemFreeAsync(D(h), NULL), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemFreeHost(h));
    /* either free takes either kind of device memory */
    CU_OK(cu.cuMemAlloc_v2(&d, 64));
    CU_OK(cu.cuMemFreeAsync(d, NULL));
    CU_OK(cu.cuMemFreeAsync(a, CU_STREAM_LEGACY));
    CU_OK(cu.cuMemFree_v2(b));
    CU_EXPECT(cu.cuMemFreeAsync(a, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
    CHECK_EQ(stats().device_used[0], s0.device_used[0]);
}

/* ---- streams and events: one queue in stream order ---- */

/* Byte `off` of device memory allocated at `base` (cuMemAlloc_v2) as it
 * is now, past the driver and its queue: read from the allocation's memfd,
 * whose number the IPC handle carries ([8,12), cuda_test_driver.h). */
static int peek(CUdeviceptr base, size_t off) {
    CUipcMemHandle h;
    if (cu.cuIpcGetMemHandle(&h, base) != CUDA_SUCCESS) return -1;
    int32_t fd;
    memcpy(&fd, h.reserved + 8, sizeof fd);
    uint8_t b = 0;
    return pread(fd, &b, 1, (off_t)off) == 1 ? b : -1;
}

struct stream_thread_arg {
    CUstream s;
    CUevent e;
    int fails;
};

/* Another thread: no current context, then the primary one. */
static void *stream_thread(void *arg) {
    struct stream_thread_arg *a = arg;
    const int before = hm_test_failed_count();
    CUstream x = NULL;
    CUevent y = NULL;
    CU_EXPECT(cu.cuStreamCreate(&x, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuEventCreate(&y, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuStreamQuery(NULL), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuEventRecord(a->e, NULL), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cu.cuMemsetD8Async(0, 0, 0, a->s), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(x == NULL && y == NULL);
    /* a created stream and an event name their own context */
    CU_EXPECT(cu.cuStreamQuery(a->s), CUDA_ERROR_NOT_READY);
    CU_EXPECT(cu.cuEventQuery(a->e), CUDA_ERROR_NOT_READY);
    /* the per-thread default stream is this thread's: none of the main
     * thread's work */
    CU_OK(cu.cuCtxSetCurrent(pc[0]));
    CU_OK(cu.cuStreamQuery(CU_STREAM_PER_THREAD));
    CU_OK(cu.cuEventSynchronize(a->e));
    CU_OK(cu.cuEventQuery(a->e));
    CU_OK(cu.cuCtxSetCurrent(NULL));
    a->fails = hm_test_failed_count() - before;
    return NULL;
}

static void test_streams(void) {
    hm_test_set_context("streams and events");
    set_current(pc[0]);
    const unsigned lenient = ctl.get_lenient();
    ctl.set_lenient(lenient & ~HM_CUDA_TEST_LENIENT_SYNC);
    const hm_cuda_test_stats_t s0 = stats();
    CUstream s1 = NULL, s2 = NULL, x = NULL;
    CU_REQUIRE_OK(cu.cuStreamCreate(&s1, CU_STREAM_DEFAULT));
    CU_REQUIRE_OK(cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CHECK(s1 != s2 && s1 != NULL && s1 != CU_STREAM_LEGACY && s1 != CU_STREAM_PER_THREAD);
    CHECK_EQ(stats().live_streams, s0.live_streams + 2);
    CU_EXPECT(cu.cuStreamCreate(&x, 2), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(x == NULL);
    CUevent e = NULL, e2 = NULL, y = NULL;
    CU_REQUIRE_OK(cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CU_REQUIRE_OK(cu.cuEventCreate(&e2, CU_EVENT_DEFAULT));
    CHECK(e != e2 && e != NULL && (void *)e != (void *)s1);
    CHECK_EQ(stats().live_events, s0.live_events + 2);
    CU_EXPECT(cu.cuEventCreate(&y, 8), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuEventCreate(&y, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuEventCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(y == NULL);
    CU_OK(cu.cuEventCreate(&y, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
    CU_OK(cu.cuEventDestroy_v2(y));

    CUdeviceptr a = 0, b = 0;
    void *hv = NULL, *hv2 = NULL;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&a, 8192));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&b, 8192));
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&hv, 4096, 0));
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&hv2, 4096, 0));
    uint8_t *h = hv, *h2 = hv2;
    CU_OK(cu.cuMemsetD8_v2(a, 0, 8192));
    CU_OK(cu.cuMemsetD8_v2(b, 0, 8192));
    memset(h, 0, 4096);
    memset(h2, 0, 4096);
    CU_OK(cu.cuCtxSynchronize());

    /* a memset on a stream waits for a synchronising call */
    CU_EXPECT(cu.cuEventQuery(e), CUDA_SUCCESS); /* never recorded: complete */
    CU_OK(cu.cuMemsetD8Async(a, 0x5a, 4096, s1));
    CHECK_EQ(pending(), 1);
    CHECK_EQ(peek(a, 0), 0);
    CU_EXPECT(cu.cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
    CU_OK(cu.cuStreamQuery(s2));
    CU_OK(cu.cuStreamQuery(NULL));
    const uint64_t rec0 = stats().events_recorded;
    CU_OK(cu.cuEventRecord(e, s1));
    CHECK_EQ(stats().events_recorded, rec0 + 1);
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY); /* a query runs nothing */
    CHECK_EQ(pending(), 1);
    CHECK_EQ(peek(a, 0), 0);
    CU_OK(cu.cuStreamSynchronize(s1));
    CHECK_EQ(pending(), 0);
    CHECK_EQ(peek(a, 0), 0x5a);
    CHECK_EQ(peek(a, 4096), 0);
    CU_OK(cu.cuEventQuery(e));
    CU_OK(cu.cuStreamQuery(s1));

    /* cuEventSynchronize runs up to the record, not what came after */
    CU_OK(cu.cuMemsetD8Async(a + 4096, 0x11, 4096, s2));
    CU_OK(cu.cuEventRecord(e, s2));
    CU_OK(cu.cuMemsetD8Async(a, 0x22, 4096, s1));
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    CU_OK(cu.cuEventSynchronize(e));
    CU_OK(cu.cuEventQuery(e));
    CHECK_EQ(peek(a, 4096), 0x11);
    CHECK_EQ(peek(a, 0), 0x5a);
    CHECK_EQ(pending(), 1);
    CU_EXPECT(cu.cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
    CU_OK(cu.cuStreamQuery(s2));
    CU_OK(cu.cuStreamSynchronize(s2)); /* nothing of s2 queued: runs nothing */
    CHECK_EQ(pending(), 1);
    CU_OK(cu.cuCtxSynchronize());
    CHECK_EQ(pending(), 0);
    CHECK_EQ(peek(a, 0), 0x22);

    /* recording again moves the mark */
    CU_OK(cu.cuEventRecord(e, s1)); /* an empty queue: complete at once */
    CU_OK(cu.cuEventQuery(e));
    CU_OK(cu.cuMemsetD8Async(a, 0x23, 16, s1));
    CU_OK(cu.cuEventQuery(e));
    CU_OK(cu.cuEventRecord(e, s1));
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    /* cuStreamSynchronize of a stream: up to its last op */
    CU_OK(cu.cuMemsetD8Async(a + 4096, 0x24, 16, s2));
    CU_OK(cu.cuStreamSynchronize(s1));
    CHECK_EQ(pending(), 1);
    CHECK(peek(a, 0) == 0x23 && peek(a, 4096) == 0x11);
    CU_OK(cu.cuEventQuery(e));
    CU_OK(cu.cuStreamSynchronize(s2));
    CHECK_EQ(pending(), 0);
    CHECK_EQ(peek(a, 4096), 0x24);

    /* copies on streams, in order with the memsets */
    CU_OK(cu.cuMemsetD8Async(a, 0x33, 8192, s1));
    CU_OK(cu.cuMemcpyAsync(b, a, 8192, s2));
    CHECK_EQ(pending(), 2);
    CHECK_EQ(peek(b, 0), 0);
    CU_OK(cu.cuStreamSynchronize(s2));
    CHECK(peek(b, 0) == 0x33 && peek(b, 8191) == 0x33);
    /* pinned host memory on one side: queued too; the host sees it after */
    CU_OK(cu.cuMemsetD8Async(a, 0x34, 4096, s1));
    CU_OK(cu.cuMemcpyAsync(D(h), a, 4096, s1));
    CU_OK(cu.cuMemsetD8Async(D(h2), 0x35, 4096, s2));
    CHECK_EQ(pending(), 3);
    CHECK(h[0] == 0 && h2[0] == 0);
    CU_OK(cu.cuStreamSynchronize(s1));
    CHECK(h[0] == 0x34 && h[4095] == 0x34 && h2[0] == 0);
    CU_OK(cu.cuStreamSynchronize(s2));
    CHECK(h2[0] == 0x35);
    /* pageable memory on a side, or host memory on both: at once, after the queue */
    uint8_t buf[64];
    memset(buf, 0x36, sizeof buf);
    CU_OK(cu.cuMemsetD8Async(a, 0x37, 8192, s1));
    CU_OK(cu.cuMemcpyAsync(a + 100, D(buf), sizeof buf, s2));
    CHECK_EQ(pending(), 0);
    CHECK(peek(a, 99) == 0x37 && peek(a, 100) == 0x36 && peek(a, 163) == 0x36);
    CU_OK(cu.cuMemsetD8Async(a, 0x38, 16, s1));
    CU_OK(cu.cuMemcpyAsync(D(h2), D(h), 16, s1));
    CHECK_EQ(pending(), 0);
    CHECK_EQ(h2[0], 0x34);
    memset(buf, 0, sizeof buf);
    CU_OK(cu.cuMemcpyAsync(D(buf), a, 16, NULL));
    CHECK_EQ(buf[0], 0x38);
    /* refused arguments queue nothing */
    CU_EXPECT(cu.cuMemsetD8Async(a, 1, 8193, s1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemsetD8Async(D(buf), 1, 16, s1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemcpyAsync(b, a, 8193, s1), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemsetD8Async(a, 1, 0, s1));
    CU_OK(cu.cuMemcpyAsync(b, a, 0, s1));
    CHECK_EQ(pending(), 0);

    /* the default streams: NULL and CU_STREAM_LEGACY are one, with the
     * synchronous calls' work; CU_STREAM_PER_THREAD is this thread's */
    CU_OK(cu.cuMemsetD8Async(a, 0x40, 16, CU_STREAM_PER_THREAD));
    CU_EXPECT(cu.cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
    CU_OK(cu.cuStreamQuery(NULL));
    CU_OK(cu.cuMemsetD8_v2(b, 0x41, 16));
    CU_EXPECT(cu.cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    CU_EXPECT(cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    CU_OK(cu.cuMemsetD8Async(a + 16, 0x42, 16, s1));
    CU_OK(cu.cuEventRecord(e, NULL));
    CU_OK(cu.cuStreamSynchronize(CU_STREAM_LEGACY)); /* a default stream: the whole queue */
    CHECK_EQ(pending(), 0);
    CHECK(peek(a, 0) == 0x40 && peek(b, 0) == 0x41 && peek(a, 16) == 0x42);
    CU_OK(cu.cuEventQuery(e));

    /* cuStreamWaitEvent: accepted, orders nothing more */
    CU_OK(cu.cuStreamWaitEvent(s2, e, 0));
    CU_OK(cu.cuStreamWaitEvent(NULL, e, CU_EVENT_WAIT_DEFAULT));
    CU_EXPECT(cu.cuStreamWaitEvent(s2, e, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuStreamWaitEvent(s2, NULL, 0), CUDA_ERROR_INVALID_HANDLE);

    /* a stream destroyed with work queued: the work still runs */
    CU_OK(cu.cuMemsetD8Async(a, 0x44, 16, s2));
    CU_OK(cu.cuEventRecord(e2, s2));
    CU_OK(cu.cuStreamDestroy_v2(s2));
    CHECK_EQ(stats().live_streams, s0.live_streams + 1);
    CHECK_EQ(pending(), 1);
    CU_EXPECT(cu.cuStreamQuery(s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamSynchronize(s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamDestroy_v2(s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuMemsetD8Async(a, 1, 16, s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuMemcpyAsync(b, a, 16, s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventRecord(e, s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamWaitEvent(s2, e, 0), CUDA_ERROR_INVALID_HANDLE);
    CUdeviceptr z = 0;
    CU_EXPECT(cu.cuMemAllocAsync(&z, 64, s2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventQuery(e2), CUDA_ERROR_NOT_READY);
    CHECK_EQ(peek(a, 0), 0x40);
    /* an event destroyed while pending: what it captured still runs */
    CU_OK(cu.cuEventDestroy_v2(e2));
    CHECK_EQ(stats().live_events, s0.live_events + 1);
    CU_EXPECT(cu.cuEventQuery(e2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventSynchronize(e2), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventRecord(e2, s1), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventDestroy_v2(e2), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(pending(), 1);
    CU_OK(cu.cuCtxSynchronize());
    CHECK_EQ(peek(a, 0), 0x44);
    /* new handles are never old ones */
    CU_REQUIRE_OK(cu.cuStreamCreate(&s2, 0));
    CU_REQUIRE_OK(cu.cuEventCreate(&e2, 0));
    CU_EXPECT(cu.cuStreamDestroy_v2(x = s2), CUDA_SUCCESS);
    CU_OK(cu.cuStreamCreate(&s2, 0));
    CHECK(s2 != x);
    CU_OK(cu.cuStreamDestroy_v2(s2));
    y = e2;
    CU_OK(cu.cuEventDestroy_v2(e2));
    CU_OK(cu.cuEventCreate(&e2, 0));
    CHECK(e2 != y);

    /* bad handles: made up, of the other kind, a default stream destroyed */
    CUstream bogus = (CUstream)(uintptr_t)0x1234;
    CU_EXPECT(cu.cuStreamQuery(bogus), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamSynchronize((CUstream)(void *)e), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuMemsetD8Async(a, 1, 1, bogus), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventQuery(NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventQuery((CUevent)(void *)s1), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventSynchronize((CUevent)(uintptr_t)0x5678), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventRecord(NULL, s1), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventDestroy_v2((CUevent)(void *)s1), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamDestroy_v2(NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamDestroy_v2(CU_STREAM_LEGACY), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamDestroy_v2(CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamDestroy_v2((CUstream)(void *)e), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuStreamWaitEvent(s1, (CUevent)(void *)s1, 0), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(pending(), 0);

    /* another context: its stream takes none of this context's events; a
     * wait may cross; its end destroys its streams and events, and runs
     * the queue */
    CUcontext cx = NULL;
    CU_REQUIRE_OK(cu.cuCtxCreate_v2(&cx, 0, other_dev()));
    CUstream sx = NULL;
    CUevent ex = NULL;
    CU_OK(cu.cuStreamCreate(&sx, 0));
    CU_OK(cu.cuEventCreate(&ex, 0));
    CU_EXPECT(cu.cuEventRecord(e, sx), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventRecord(ex, s1), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuEventRecord(ex, sx));
    CU_EXPECT(cu.cuEventRecord(ex, NULL), CUDA_SUCCESS); /* cx is current */
    CU_OK(cu.cuStreamWaitEvent(s1, ex, 0));
    CU_OK(cu.cuStreamWaitEvent(sx, e, 0));
    CUdeviceptr ax = 0;
    CU_OK(cu.cuMemAllocAsync(&ax, 4096, sx));
    CHECK(context_of(ax) == cx && ordinal_of(ax) == other_dev());
    CU_OK(cu.cuMemFreeAsync(ax, sx));
    CU_OK(cu.cuMemsetD8Async(a, 0x50, 16, sx)); /* memory of any context */
    CU_OK(cu.cuEventRecord(ex, sx));
    set_current(pc[0]);
    CU_EXPECT(cu.cuEventRecord(ex, NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuStreamWaitEvent(NULL, ex, 0));
    CU_REQUIRE_OK(cu.cuCtxPushCurrent_v2(cx));
    CU_OK(cu.cuCtxDestroy_v2(cx));
    CHECK(get_current() == pc[0]);
    CHECK_EQ(pending(), 0);
    CHECK_EQ(peek(a, 0), 0x50);
    CU_EXPECT(cu.cuStreamQuery(sx), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuEventQuery(ex), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(stats().live_streams, s0.live_streams + 1);
    CHECK_EQ(stats().live_events, s0.live_events + 2);

    /* no current context; the per-thread stream of another thread */
    {
        CU_OK(cu.cuMemsetD8Async(a, 0x51, 16, s1));
        CU_OK(cu.cuMemsetD8Async(a, 0x52, 16, CU_STREAM_PER_THREAD));
        CU_OK(cu.cuEventRecord(e, s1));
        struct stream_thread_arg ta = {s1, e, 0};
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, stream_thread, &ta) == 0);
        pthread_join(t, NULL);
        CHECK_EQ(ta.fails, 0);
        CHECK_EQ(pending(), 0); /* the thread synchronised the event */
        CHECK_EQ(peek(a, 0), 0x52);
    }

    /* injected failures change nothing */
    CHECK_EQ(ctl.fail_next("cuStreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    x = NULL;
    CU_EXPECT(cu.cuStreamCreate(&x, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(x == NULL);
    CHECK_EQ(stats().live_streams, s0.live_streams + 1);
    CHECK_EQ(ctl.fail_next("cuEventCreate", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    y = NULL;
    CU_EXPECT(cu.cuEventCreate(&y, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(y == NULL);
    CHECK_EQ(ctl.fail_next("cuMemsetD8Async", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuMemsetD8Async(a, 0x60, 16, s1), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(pending(), 0);
    CHECK_EQ(ctl.fail_next("cuMemcpyAsync", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuMemcpyAsync(b, a, 16, s1), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(pending(), 0);
    CU_OK(cu.cuMemsetD8Async(a, 0x61, 16, s1));
    const uint64_t rec1 = stats().events_recorded;
    CHECK_EQ(ctl.fail_next("cuEventRecord", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuEventRecord(e, s1), CUDA_ERROR_UNKNOWN);
    CHECK_EQ(stats().events_recorded, rec1);
    CU_OK(cu.cuEventQuery(e)); /* the old mark, reached */
    CU_OK(cu.cuEventRecord(e, s1));
    CHECK_EQ(ctl.fail_next("cuEventQuery", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_LAUNCH_FAILED);
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    CHECK_EQ(ctl.fail_next("cuEventSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuEventSynchronize(e), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(pending(), 1);
    CHECK_EQ(ctl.fail_next("cuStreamSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuStreamSynchronize(s1), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(pending(), 1);
    CHECK_EQ(ctl.fail_next("cuStreamQuery", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuStreamQuery(s1), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(ctl.fail_next("cuStreamDestroy_v2", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuStreamDestroy_v2(s1), CUDA_ERROR_UNKNOWN);
    CU_EXPECT(cu.cuStreamQuery(s1), CUDA_ERROR_NOT_READY); /* still there */
    CHECK_EQ(ctl.fail_next("cuEventDestroy_v2", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuEventDestroy_v2(e), CUDA_ERROR_UNKNOWN);
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    CHECK_EQ(ctl.fail_next("cuStreamWaitEvent", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuStreamWaitEvent(s1, e, 0), CUDA_ERROR_UNKNOWN);
    /* a sticky error: every stream and event call returns it */
    CHECK_EQ(ctl.fail_sticky("cuEventSynchronize", 1, CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    CU_EXPECT(cu.cuEventSynchronize(e), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuEventQuery(e), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuStreamQuery(s1), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuStreamCreate(&x, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_EXPECT(cu.cuMemsetD8Async(a, 0, 16, s1), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_EQ(pending(), 1);
    ctl.reset();
    CU_OK(cu.cuEventSynchronize(e));
    CHECK_EQ(pending(), 0);
    CHECK_EQ(peek(a, 0), 0x61);

    /* LENIENT_SYNC: at once, so every event is complete */
    ctl.set_lenient(lenient | HM_CUDA_TEST_LENIENT_SYNC);
    CU_OK(cu.cuMemsetD8Async(a, 0x70, 16, s1));
    CU_OK(cu.cuEventRecord(e, s1));
    CHECK_EQ(pending(), 0);
    CHECK_EQ(peek(a, 0), 0x70);
    CU_OK(cu.cuEventQuery(e));
    CU_OK(cu.cuStreamQuery(s1));
    ctl.set_lenient(lenient & ~HM_CUDA_TEST_LENIENT_SYNC);

    /* the queue is bounded; events recorded before a forced run complete */
    CU_OK(cu.cuMemsetD8Async(a, 0x71, 1, s1));
    CU_OK(cu.cuEventRecord(e, s1));
    for (int i = 0; i < 1100; i++) CU_OK(cu.cuMemsetD8Async(b + (unsigned)i, (unsigned char)i, 1, s1));
    CHECK(pending() > 0 && pending() <= 1024);
    CU_OK(cu.cuEventQuery(e));
    CU_OK(cu.cuStreamSynchronize(s1));
    CHECK(peek(b, 1099) == (uint8_t)1099);

    ctl.set_lenient(lenient);
    CU_OK(cu.cuStreamDestroy_v2(s1));
    CU_OK(cu.cuEventDestroy_v2(e));
    CU_OK(cu.cuEventDestroy_v2(e2));
    CU_OK(cu.cuMemFree_v2(a));
    CU_OK(cu.cuMemFree_v2(b));
    CU_OK(cu.cuMemFreeHost(hv));
    CU_OK(cu.cuMemFreeHost(hv2));
    const hm_cuda_test_stats_t s1s = stats();
    CHECK_EQ(s1s.live_streams, s0.live_streams);
    CHECK_EQ(s1s.live_events, s0.live_events);
    CHECK_EQ(s1s.live_allocs, s0.live_allocs);
}

/* ---- IPC: an exec'd importer ---- */

struct ipc_msg {
    CUipcMemHandle a, b, c; /* b: freed before the importer opens it; c: exported by an interior pointer */
    uint64_t a_size, c_size;
    uint64_t a_base, c_base, va_base; /* in the exporter */
    uint32_t a_dev;
    int32_t ndev;
    CUuuid uuid[HM_CUDA_TEST_MAX_DEVICES];
};

static void write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        REQUIRE(w > 0);
        c += w;
        n -= (size_t)w;
    }
}

static bool read_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}

static CUipcMemHandle patched32(CUipcMemHandle h, size_t at, uint32_t v) {
    memcpy(h.reserved + at, &v, 4);
    return h;
}

static CUipcMemHandle patched64(CUipcMemHandle h, size_t at, uint64_t v) {
    memcpy(h.reserved + at, &v, 8);
    return h;
}

static int ipc_importer(int in, int out) {
    ctl.set_lenient(0); /* the defaults, whatever the environment asks */
    hm_test_set_context("ipc importer");
    struct ipc_msg msg;
    REQUIRE(read_all(in, &msg, sizeof msg));
    CU_REQUIRE_OK(cu.cuInit(0));
    CHECK(ctl.va_base() == msg.va_base); /* the same reservation in every process */
    int n = 0;
    CU_OK(cu.cuDeviceGetCount(&n));
    CHECK_EQ(n, msg.ndev);
    for (int i = 0; i < n && i < msg.ndev; i++) { /* the same UUIDs in every process */
        CUuuid u;
        CU_OK(cu.cuDeviceGetUuid_v2(&u, i));
        CHECK(memcmp(&u, &msg.uuid[i], sizeof u) == 0);
    }
    CUdeviceptr pa = 0, pa2 = 0, pc_ = 0, x = 0;
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&pa, msg.a, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext p0 = NULL;
    CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&p0, 0));
    set_current(p0);
    const hm_cuda_test_stats_t s0 = stats();

    /* malformed handles, refused flags */
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched32(msg.a, 0, 0x12345678), 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched64(msg.a, 56, 1), 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched64(msg.a, 56, 0), 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched64(msg.a, 24, 0), 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, msg.a, 2), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(NULL, msg.a, 0), CUDA_ERROR_INVALID_VALUE);
    /* handles naming nothing alive: another fd number, another file, a freed allocation */
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched32(msg.a, 8, 999999), 0), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched32(msg.a, 8, 0), 0), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, patched64(msg.a, 40, 1), 0), CUDA_ERROR_INVALID_HANDLE);
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, msg.b, 0), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(x, 0);
    /* memory of a device this one has no peer access to */
    if (msg.a_dev != 0) {
        CHECK_EQ(ctl.set_peer_access(0, (int)msg.a_dev, 0), 0);
        CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, msg.a, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        CHECK_EQ(ctl.set_peer_access(0, (int)msg.a_dev, 1), 0);
    }
    CHECK_EQ(stats().live_ipc_mappings, s0.live_ipc_mappings);

    /* the handle's size bytes are not believed: the mapping, and the range
     * the driver reports, are the allocation's */
    {
        CUdeviceptr lie = 0, lb = 0;
        size_t ls = 0;
        CU_REQUIRE_OK(cu.cuIpcOpenMemHandle_v2(&lie, patched64(msg.a, 24, msg.a_size + GRAN), 0));
        CU_OK(cu.cuMemGetAddressRange_v2(&lb, &ls, lie));
        CHECK(lb == lie && ls == msg.a_size);
        CU_EXPECT(cu.cuMemsetD8_v2(lie, 0, msg.a_size + 1), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cu.cuIpcCloseMemHandle(lie));
        CHECK_EQ(stats().live_ipc_mappings, s0.live_ipc_mappings);
    }

    /* opened: device memory of this process's current device */
    CU_REQUIRE_OK(cu.cuIpcOpenMemHandle_v2(&pa, msg.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK_MSG(pa == msg.a_base, "opened at %#llx, exported from %#llx", pa, (unsigned long long)msg.a_base);
    CUdeviceptr start = 0;
    CU_OK(cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, pa + 1000));
    CHECK(start == pa);
    CHECK(mem_type(pa + 10) == CU_MEMORYTYPE_DEVICE);
    CHECK_EQ(ordinal_of(pa), 0);
    CHECK(context_of(pa) == p0);
    unsigned u = 9;
    CU_OK(cu.cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, pa));
    CHECK_EQ(u, 0);
    CUdeviceptr base = 0;
    size_t size = 0;
    CU_OK(cu.cuMemGetAddressRange_v2(&base, &size, pa + msg.a_size - 1));
    CHECK(base == pa && size == msg.a_size);
    CHECK(all_bytes(pa, 0x5a, msg.a_size));
    CHECK_EQ(touch_in_child(P(pa), false), SIGSEGV);
    CUipcMemHandle again;
    CU_EXPECT(cu.cuIpcGetMemHandle(&again, pa), CUDA_ERROR_INVALID_VALUE); /* no re-export */
    CU_EXPECT(cu.cuMemFree_v2(pa), CUDA_ERROR_INVALID_VALUE);
    unsigned long long ida = buffer_id(pa);

    /* a second open in this context: a reference, or ALREADY_MAPPED */
    for (int pass = 0; pass < 2; pass++) {
        const bool strict = pass == 0 ? strict_env : !strict_env;
        ctl.set_strict_ipc(strict);
        const uint64_t rep = stats().ipc_open_repeats;
        pa2 = 0;
        if (strict) {
            CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&pa2, msg.a, 0), CUDA_ERROR_ALREADY_MAPPED);
            CHECK_EQ(pa2, 0);
            CHECK_EQ(stats().live_ipc_refs, s0.live_ipc_refs + 1);
        } else {
            CU_OK(cu.cuIpcOpenMemHandle_v2(&pa2, msg.a, 0));
            CHECK(pa2 == pa);
            CHECK_EQ(stats().live_ipc_refs, s0.live_ipc_refs + 2);
            CU_OK(cu.cuIpcCloseMemHandle(pa2));
        }
        CHECK_EQ(stats().ipc_open_repeats, rep + 1);
        CHECK_EQ(stats().live_ipc_mappings, s0.live_ipc_mappings + 1);
    }
    ctl.set_strict_ipc(strict_env);

    /* one context per device opens this exporter's device's handles */
    CUcontext other = NULL;
    CU_REQUIRE_OK(cu.cuCtxCreate_v2(&other, 0, 0));
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, msg.a, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cu.cuCtxDestroy_v2(other));
    CHECK(get_current() == p0);
    /* a context of another device gets a mapping of its own */
    if (msg.ndev > 1) {
        CUcontext p1 = NULL;
        CUdeviceptr pa1 = 0;
        CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&p1, 1));
        CU_OK(cu.cuCtxPushCurrent_v2(p1));
        CU_OK(cu.cuIpcOpenMemHandle_v2(&pa1, msg.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        CHECK(pa1 != pa && pa1 != 0);
        CHECK_EQ(ordinal_of(pa1), 1);
        CHECK(buffer_id(pa1) != ida);
        CHECK(all_bytes(pa1, 0x5a, 4096));
        CHECK_EQ(stats().live_ipc_mappings, s0.live_ipc_mappings + 2);
        CU_OK(cu.cuIpcCloseMemHandle(pa1));
        CU_OK(cu.cuCtxPopCurrent_v2(NULL));
        CU_OK(cu.cuDevicePrimaryCtxRelease_v2(1));
    }

    /* c: exported by an interior pointer, opened at its base */
    CU_REQUIRE_OK(cu.cuIpcOpenMemHandle_v2(&pc_, msg.c, 0));
    CHECK(pc_ == msg.c_base);
    CU_OK(cu.cuMemGetAddressRange_v2(&base, &size, pc_ + MIB + 3));
    CHECK(base == pc_ && size == msg.c_size);
    CHECK(all_bytes(pc_, 0x33, msg.c_size));

    /* an injected failure maps nothing */
    CHECK_EQ(ctl.fail_next("cuIpcOpenMemHandle_v2", 1, CUDA_ERROR_MAP_FAILED), 0);
    x = 0x4321;
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&x, msg.c, 0), CUDA_ERROR_MAP_FAILED);
    CHECK_EQ(x, 0x4321);
    CHECK_EQ(stats().live_ipc_mappings, s0.live_ipc_mappings + 2);

    /* the importer writes, the exporter checks: only after a synchronising
     * call here */
    char ack = 0;
    CU_OK(cu.cuMemsetD8_v2(pa, 0xc3, msg.a_size));
    CU_EXPECT(cu.cuMemsetD8_v2(pa, 0xc3, msg.a_size + 1), CUDA_ERROR_INVALID_VALUE);
    write_all(out, "m", 1); /* the exporter sees the old bytes */
    CHECK(read_all(in, &ack, 1) && ack == 'k');
    CU_OK(cu.cuCtxSynchronize());
    write_all(out, "n", 1); /* now the new ones */
    CHECK(read_all(in, &ack, 1) && ack == 'k');

    /* closes: one per open; the base only; then unknown */
    CU_EXPECT(cu.cuIpcCloseMemHandle(pa + 64), CUDA_ERROR_INVALID_VALUE);

    /* the exporter frees a and allocates the same size again: the same
     * address, a new allocation; this process still maps the old one there */
    CUipcMemHandle h2;
    write_all(out, "r", 1);
    REQUIRE(read_all(in, &h2, sizeof h2));
    CUdeviceptr p2 = 0;
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&p2, h2, 0), CUDA_ERROR_ALREADY_MAPPED);
    CHECK_EQ(p2, 0);
    /* with LENIENT_IPC_ANYWHERE: elsewhere, never ALREADY_MAPPED */
    ctl.set_lenient(HM_CUDA_TEST_LENIENT_IPC_ANYWHERE);
    CUdeviceptr q1 = 0;
    CU_OK(cu.cuIpcOpenMemHandle_v2(&q1, h2, 0));
    CHECK(q1 != 0 && q1 != pa);
    CU_OK(cu.cuIpcCloseMemHandle(q1));
    ctl.set_lenient(0);
    CU_OK(cu.cuIpcCloseMemHandle(pa));
    CU_EXPECT(cu.cuIpcCloseMemHandle(pa), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuIpcOpenMemHandle_v2(&p2, h2, 0)); /* the stale mapping closed: it opens */
    CHECK(p2 == msg.a_base);
    CHECK(all_bytes(p2, 0x77, msg.a_size));
    CU_OK(cu.cuIpcCloseMemHandle(p2));

    CU_OK(cu.cuIpcCloseMemHandle(pc_));
    CU_EXPECT(cu.cuIpcCloseMemHandle(pc_), CUDA_ERROR_INVALID_VALUE);
    /* the exporter's range taken by memory of this process: the open lands
     * elsewhere (the last range given back, c's, is the first reused) */
    CUdeviceptr own = 0, pf = 0;
    CU_OK(cu.cuMemAlloc_v2(&own, msg.c_size));
    CHECK(own == msg.c_base);
    CU_OK(cu.cuIpcOpenMemHandle_v2(&pf, msg.c, 0));
    CHECK(pf != 0 && pf != msg.c_base);
    CU_OK(cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, pf + 5));
    CHECK(start == pf);
    CHECK(all_bytes(pf, 0x33, msg.c_size));
    CU_OK(cu.cuIpcCloseMemHandle(pf));
    CU_EXPECT(cu.cuIpcCloseMemHandle(own), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemFree_v2(own));
    int local;
    CU_EXPECT(cu.cuIpcCloseMemHandle(D(&local)), CUDA_ERROR_INVALID_VALUE);
    const hm_cuda_test_stats_t s1 = stats();
    CHECK_EQ(s1.live_ipc_mappings, 0);
    CHECK_EQ(s1.live_ipc_refs, 0);
    CHECK_EQ(s1.live_allocs, 0);
    CU_OK(cu.cuDevicePrimaryCtxRelease_v2(0));
    CHECK_EQ(stats().leaks, 0);
    printf("importer: %d checks passed, %d failed\n", hm_test_passed_count(), hm_test_failed_count());
    char done = 'd';
    write_all(out, &done, 1);
    return hm_test_failed_count();
}

/* Runs this program again with `mode` and two descriptors (100: what the
 * child reads, 101: what it writes); *in and *out: the parent's ends. */
static pid_t spawn(const char *mode, int *in, int *out) {
    int to[2], from[2];
    REQUIRE(pipe2(to, O_CLOEXEC) == 0 && pipe2(from, O_CLOEXEC) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (dup2(to[0], 100) < 0 || dup2(from[1], 101) < 0) _exit(90);
        execl("/proc/self/exe", "test_cuda_driver", mode, "100", "101", (char *)NULL);
        _exit(91);
    }
    close(to[0]);
    close(from[1]);
    *out = to[1];
    *in = from[0];
    return pid;
}

static void test_ipc(void) {
    hm_test_set_context("ipc exporter");
    set_current(pc[0]);
    struct ipc_msg msg;
    memset(&msg, 0, sizeof msg);
    msg.a_dev = (uint32_t)other_dev();
    msg.a_size = 3 * MIB + 5;
    msg.c_size = 4 * MIB;
    msg.ndev = ndev;
    for (int i = 0; i < ndev; i++) CU_OK(cu.cuDeviceGetUuid_v2(&msg.uuid[i], i));
    CUdeviceptr a = 0, b = 0, c = 0, m = 0, as = 0;
    void *h = NULL;
    CU_OK(cu.cuCtxPushCurrent_v2(pc[msg.a_dev]));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&a, msg.a_size));
    CU_OK(cu.cuCtxPopCurrent_v2(NULL));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&b, MIB));
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&c, msg.c_size));
    CU_OK(cu.cuMemsetD8_v2(a, 0x5a, msg.a_size));
    CU_OK(cu.cuMemsetD8_v2(b, 0x77, MIB));
    CU_OK(cu.cuMemsetD8_v2(c, 0x33, msg.c_size));
    const uint64_t gets = ctl.call_count("cuIpcGetMemHandle");
    CU_REQUIRE_OK(cu.cuIpcGetMemHandle(&msg.a, a));
    CU_REQUIRE_OK(cu.cuIpcGetMemHandle(&msg.b, b));
    CU_REQUIRE_OK(cu.cuIpcGetMemHandle(&msg.c, c + MIB + 3));
    CHECK_EQ(ctl.call_count("cuIpcGetMemHandle"), gets + 3);
    CUipcMemHandle again, cbase;
    CU_OK(cu.cuIpcGetMemHandle(&again, a));
    CHECK(memcmp(&again, &msg.a, sizeof again) == 0); /* the same allocation, the same handle */
    CU_OK(cu.cuIpcGetMemHandle(&cbase, c));
    CHECK(memcmp(&cbase, &msg.c, sizeof cbase) == 0); /* an interior pointer names it all */
    msg.a_base = a;
    msg.c_base = c;
    msg.va_base = ctl.va_base();

    /* the layout the header documents */
    uint32_t w32[4];
    uint64_t w64[6];
    memcpy(w32, msg.a.reserved, 16);
    memcpy(w64, msg.a.reserved + 16, 48);
    CHECK_EQ(w32[0], 0x55434d48u);
    CHECK_EQ(w32[1], (uint32_t)getpid());
    CHECK_EQ(w32[3], msg.a_dev);
    CHECK(w64[0] == buffer_id(a));
    CHECK_EQ(w64[1], msg.a_size);
    CHECK(w64[5] == a); /* the exporter's address */
    struct stat st;
    CHECK(fstat((int)w32[2], &st) == 0 && st.st_size >= (off_t)msg.a_size &&
          (uint64_t)st.st_ino == w64[3]);

    /* refused exports, and the exporter's own open */
    CU_REQUIRE_OK(cu.cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    CU_REQUIRE_OK(cu.cuMemHostAlloc(&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    CU_REQUIRE_OK(cu.cuMemAllocAsync(&as, 4096, NULL));
    CUipcMemHandle x;
    CU_EXPECT(cu.cuIpcGetMemHandle(&x, m), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcGetMemHandle(&x, D(h)), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcGetMemHandle(&x, as), CUDA_ERROR_INVALID_VALUE);
    int local;
    CU_EXPECT(cu.cuIpcGetMemHandle(&x, D(&local)), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuIpcGetMemHandle(&x, a + msg.a_size), CUDA_ERROR_INVALID_VALUE); /* the rounding */
    CU_EXPECT(cu.cuIpcGetMemHandle(NULL, a), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr self = 0;
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&self, msg.a, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(self, 0);
    CU_OK(cu.cuMemFree_v2(m));
    CU_OK(cu.cuMemFreeHost(h));
    CU_OK(cu.cuMemFreeAsync(as, NULL));
    CU_OK(cu.cuMemFree_v2(b)); /* before the importer opens it */

    CU_OK(cu.cuCtxSynchronize()); /* the memsets done before the importer looks */

    /* the importer: this program again, exec'd, so it inherits no memfd */
    int in, out;
    pid_t pid = spawn("ipc-importer", &in, &out);
    write_all(out, &msg, sizeof msg);
    char cmd = 0;
    while (read_all(in, &cmd, 1) && cmd != 'd') {
        if (cmd == 'm') { /* its memset is queued there: the old bytes here */
            CHECK(all_bytes(a, 0x5a, msg.a_size));
        } else if (cmd == 'n') {
            CHECK(all_bytes(a, 0xc3, msg.a_size));
        } else if (cmd == 'r') { /* free, and the same size again */
            const CUdeviceptr old = a;
            CUipcMemHandle h2;
            CU_OK(cu.cuMemFree_v2(a));
            CU_REQUIRE_OK(cu.cuCtxPushCurrent_v2(pc[msg.a_dev]));
            CU_REQUIRE_OK(cu.cuMemAlloc_v2(&a, msg.a_size));
            CU_OK(cu.cuCtxPopCurrent_v2(NULL));
            CHECK_MSG(a == old, "reallocated at %#llx, freed %#llx", a, old);
            CU_OK(cu.cuMemsetD8_v2(a, 0x77, msg.a_size));
            CU_OK(cu.cuCtxSynchronize());
            CU_OK(cu.cuIpcGetMemHandle(&h2, a));
            write_all(out, &h2, sizeof h2);
            continue;
        } else {
            CHECK_MSG(0, "importer sent '%c'", cmd);
            break;
        }
        write_all(out, "k", 1);
    }
    CHECK(cmd == 'd');
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "importer exit status 0x%x", status);
    close(in);
    close(out);
    /* what the importer left; c as it was */
    CHECK(all_bytes(a, 0x77, msg.a_size));
    CHECK(all_bytes(c, 0x33, msg.c_size));
    CU_OK(cu.cuMemFree_v2(a));
    CU_OK(cu.cuMemFree_v2(c));
}

/* ---- IPC: an exporter that goes away ---- */

/* Mode "ipc-exporter <in> <out>": a fresh process that exports 5000 bytes
 * of 0x42, writes the handle and its address, and exits without a free
 * when told. */
static int ipc_exporter(int in, int out) {
    CUcontext c = NULL;
    CUdeviceptr d = 0;
    CUipcMemHandle hh;
    if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS ||
        cu.cuCtxSetCurrent(c) != CUDA_SUCCESS || cu.cuMemAlloc_v2(&d, 5000) != CUDA_SUCCESS ||
        cu.cuMemsetD8_v2(d, 0x42, 5000) != CUDA_SUCCESS || cu.cuCtxSynchronize() != CUDA_SUCCESS ||
        cu.cuIpcGetMemHandle(&hh, d) != CUDA_SUCCESS)
        return 1;
    write_all(out, &hh, sizeof hh);
    write_all(out, &d, sizeof d);
    char go;
    (void)read_all(in, &go, 1);
    return 0; /* without a free: the process's end frees it */
}

static void test_ipc_exporter_gone(void) {
    hm_test_set_context("ipc exporter gone");
    set_current(pc[0]);
    int in, out;
    pid_t pid = spawn("ipc-exporter", &in, &out);
    CUipcMemHandle hh;
    CUdeviceptr there = 0;
    REQUIRE(read_all(in, &hh, sizeof hh) && read_all(in, &there, sizeof there));
    CHECK(there == ctl.va_base()); /* a fresh process's first allocation: the lowest address */
    CUdeviceptr p = 0;
    CU_OK(cu.cuIpcOpenMemHandle_v2(&p, hh, 0)); /* another process's memory */
    if (p) {
        CHECK(all_bytes(p, 0x42, 5000));
        CU_OK(cu.cuIpcCloseMemHandle(p));
    }
    char go = 'g';
    write_all(out, &go, 1);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    p = 0;
    CU_EXPECT(cu.cuIpcOpenMemHandle_v2(&p, hh, 0), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(p, 0);
    close(in);
    close(out);
    CHECK_EQ(stats().live_ipc_mappings, 0);
}

/* ---- the old ABIs abort ---- */

static void call_old(const char *name) {
    void *f = dlsym(lib, name);
    REQUIRE(f);
    unsigned u = 0;
    CUcontext c = NULL;
    CUdeviceptr d = 0;
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    char buf[16];
    void *pv = NULL;
    if (!strcmp(name, "cuMemAlloc")) ((CUresult(*)(unsigned *, unsigned))f)(&u, 4096);
    else if (!strcmp(name, "cuMemFree")) ((CUresult(*)(unsigned))f)(u);
    else if (!strcmp(name, "cuMemAllocHost")) ((CUresult(*)(void **, unsigned))f)(&pv, 4096);
    else if (!strcmp(name, "cuMemGetAddressRange")) ((CUresult(*)(unsigned *, unsigned *, unsigned))f)(&u, &u, 0);
    else if (!strcmp(name, "cuMemGetInfo")) ((CUresult(*)(unsigned *, unsigned *))f)(&u, &u);
    else if (!strcmp(name, "cuDeviceTotalMem")) ((CUresult(*)(unsigned *, CUdevice))f)(&u, 0);
    else if (!strcmp(name, "cuMemcpyHtoD")) ((CUresult(*)(unsigned, const void *, unsigned))f)(0, buf, 1);
    else if (!strcmp(name, "cuMemcpyDtoH")) ((CUresult(*)(void *, unsigned, unsigned))f)(buf, 0, 1);
    else if (!strcmp(name, "cuMemcpyDtoD")) ((CUresult(*)(unsigned, unsigned, unsigned))f)(0, 0, 1);
    else if (!strcmp(name, "cuMemsetD8")) ((CUresult(*)(unsigned, unsigned char, unsigned))f)(0, 0, 1);
    else if (!strcmp(name, "cuCtxCreate")) ((CUresult(*)(CUcontext *, unsigned, CUdevice))f)(&c, 0, 0);
    else if (!strcmp(name, "cuCtxDestroy")) ((CUresult(*)(CUcontext))f)(pc[0]);
    else if (!strcmp(name, "cuCtxPushCurrent")) ((CUresult(*)(CUcontext))f)(pc[0]);
    else if (!strcmp(name, "cuCtxPopCurrent")) ((CUresult(*)(CUcontext *))f)(&c);
    else if (!strcmp(name, "cuDevicePrimaryCtxRelease")) ((CUresult(*)(CUdevice))f)(0);
    else if (!strcmp(name, "cuIpcOpenMemHandle"))
        ((CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned))f)(&d, h, 0);
    else if (!strcmp(name, "cuGetProcAddress"))
        ((CUresult(*)(const char *, void **, int, cuuint64_t))f)("cuInit", &pv, 13000, 0);
    else if (!strcmp(name, "cuMemHostGetDevicePointer"))
        ((CUresult(*)(unsigned *, void *, unsigned))f)(&u, buf, 0);
    else if (!strcmp(name, "cuStreamDestroy")) ((CUresult(*)(CUstream))f)(NULL);
    else if (!strcmp(name, "cuEventDestroy")) ((CUresult(*)(CUevent))f)(NULL);
}

/* ---- virtual memory management ---- */

static CUmemAllocationProp vmm_prop(int dev, CUmemAllocationHandleType types) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = types;
    return p;
}

static CUresult vmm_access(CUdeviceptr p, size_t n, int dev, CUmemAccess_flags flags) {
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = flags;
    return cu.cuMemSetAccess(p, n, &d, 1);
}

static unsigned long long vmm_get_access(CUdeviceptr p, int dev) {
    CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    unsigned long long f = 99;
    CU_OK(cu.cuMemGetAccess(&f, &l, p));
    return f;
}

/* One descriptor over a Unix socket (SCM_RIGHTS), with one byte. */
static void send_fd(int sock, int fd) {
    char byte = 'f';
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    REQUIRE(sendmsg(sock, &m, 0) == 1);
}

static int recv_fd(int sock) {
    char byte;
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

/* The exec'd importer of test_vmm: receives a descriptor of 2 * GRAN bytes
 * of 0x5a, imports, maps, reads, writes 0xa5, synchronizes, answers 'k'. */
static int vmm_importer(int sock) {
    ctl.set_lenient(0);
    hm_test_set_context("vmm importer");
    CU_REQUIRE_OK(cu.cuInit(0));
    CUcontext p0 = NULL;
    CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&p0, 0));
    set_current(p0);
    int fd = recv_fd(sock);
    REQUIRE(fd >= 0);
    CUmemGenericAllocationHandle h = 0;
    CU_REQUIRE_OK(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd); /* the handle holds the memory */
    CUmemAllocationProp got;
    CU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&got, h));
    CHECK_EQ(got.location.id, 0);
    CHECK_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    CHECK_EQ(stats().device_used[0], 0); /* charged to the exporter */
    CUdeviceptr va = 0;
    CU_REQUIRE_OK(cu.cuMemAddressReserve(&va, 2 * GRAN, 0, 0, 0));
    CU_REQUIRE_OK(cu.cuMemMap(va, 2 * GRAN, 0, h, 0));
    CU_OK(cu.cuMemRelease(h)); /* the mapping holds it */
    CU_OK(vmm_access(va, 2 * GRAN, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CHECK(all_bytes(va, 0x5a, 2 * GRAN));
    CU_OK(cu.cuMemsetD8_v2(va, 0xa5, 2 * GRAN));
    CU_OK(cu.cuCtxSynchronize());
    CU_OK(cu.cuMemUnmap(va, 2 * GRAN));
    CU_OK(cu.cuMemAddressFree(va, 2 * GRAN));
    CHECK_EQ(stats().live_vmm_handles, 0);
    CU_OK(cu.cuDevicePrimaryCtxRelease_v2(0));
    printf("vmm importer: %d checks passed, %d failed\n", hm_test_passed_count(), hm_test_failed_count());
    write_all(sock, "k", 1);
    return hm_test_failed_count();
}

static void test_vmm(void) {
    hm_test_set_context("vmm");
    set_current(pc[0]);
    const hm_cuda_test_stats_t s0 = stats();

    /* granularity: 2 MiB, minimum and recommended */
    CUmemAllocationProp prop = vmm_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), bad;
    size_t g = 0;
    CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK_EQ(g, GRAN);
    CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CHECK_EQ(g, GRAN);

    /* cuMemCreate: sizes in granules, pinned device memory, no fabric */
    CUmemGenericAllocationHandle h = 0, x = 0;
    CU_EXPECT(cu.cuMemCreate(&x, GRAN + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemCreate(&x, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemCreate(&x, GRAN, &prop, 1), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemCreate(NULL, GRAN, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    bad = prop;
    bad.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
    CU_EXPECT(cu.cuMemCreate(&x, GRAN, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    bad = prop;
    bad.location.id = HM_CUDA_TEST_MAX_DEVICES;
    CU_EXPECT(cu.cuMemCreate(&x, GRAN, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
    bad = prop;
    bad.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    CU_EXPECT(cu.cuMemCreate(&x, GRAN, &bad, 0), CUDA_ERROR_NOT_SUPPORTED);
    CHECK(x == 0);
    size_t free_b = 0, total_b = 0;
    CU_OK(cu.cuMemGetInfo_v2(&free_b, &total_b));
    CU_EXPECT(cu.cuMemCreate(&x, (free_b / GRAN + 1) * GRAN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CU_REQUIRE_OK(cu.cuMemCreate(&h, 2 * GRAN, &prop, 0));
    CHECK_EQ(stats().device_used[0], s0.device_used[0] + 2 * GRAN);
    CHECK_EQ(stats().live_vmm_handles, s0.live_vmm_handles + 1);
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    CU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&got, h));
    CHECK_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    CHECK_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    CHECK_EQ(got.location.id, 0);
    CHECK_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

    /* reservations: in the driver's range, aligned, a free hint taken */
    CUdeviceptr va = 0, vb = 0;
    CU_EXPECT(cu.cuMemAddressReserve(&va, 4 * GRAN, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAddressReserve(&va, 4 * GRAN + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAddressReserve(&va, 4 * GRAN, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_OK(cu.cuMemAddressReserve(&va, 4 * GRAN, 0, 0, 0));
    CHECK(va % GRAN == 0 && va >= ctl.va_base() && va < ctl.va_base() + ((uint64_t)64 << 30));
    CU_EXPECT(cu.cuMemAddressFree(va, 2 * GRAN), CUDA_ERROR_INVALID_VALUE); /* not its size */
    CU_OK(cu.cuMemAddressFree(va, 4 * GRAN));
    CU_EXPECT(cu.cuMemAddressFree(va, 4 * GRAN), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_OK(cu.cuMemAddressReserve(&vb, 4 * GRAN, 8 * GRAN, va + 4 * GRAN, 0));
    CHECK(vb == va + 4 * GRAN || vb % (8 * GRAN) == 0); /* the hint, or aligned */
    CU_REQUIRE_OK(cu.cuMemAddressReserve(&va, 4 * GRAN, 0, va, 0));
    CHECK(va != vb);

    /* cuMemMap: granules inside a reservation, offset 0, not mapped yet */
    const CUdeviceptr m = va + GRAN;
    CU_EXPECT(cu.cuMemMap(m + 4096, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemMap(m, GRAN + 4096, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemMap(m, GRAN, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE); /* cuda.h: offset 0 */
    CU_EXPECT(cu.cuMemMap(m, 4 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* past the reservation */
    const CUdeviceptr unreserved = ctl.va_base() + ((uint64_t)60 << 30);
    CU_EXPECT(cu.cuMemMap(unreserved, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemMap(va, 4 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* past the handle */
    CU_EXPECT(cu.cuMemMap(m, 2 * GRAN, 0, h + 16, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemMap(m, 2 * GRAN, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_OK(cu.cuMemMap(m, 2 * GRAN, 0, h, 0));
    CU_EXPECT(cu.cuMemMap(va, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* overlaps */
    CHECK_EQ(stats().live_vmm_mappings, s0.live_vmm_mappings + 1);

    /* no access until cuMemSetAccess */
    CHECK_EQ(vmm_get_access(m, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CU_EXPECT(cu.cuMemsetD8_v2(m, 1, 16), CUDA_ERROR_INVALID_VALUE);
    uint8_t buf[64] = {0};
    CU_EXPECT(cu.cuMemcpyDtoH_v2(buf, m, sizeof buf), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(vmm_access(va, 4 * GRAN, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(vmm_access(m, 2 * GRAN, HM_CUDA_TEST_MAX_DEVICES, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
              CUDA_ERROR_INVALID_DEVICE);
    CU_EXPECT(vmm_access(m, 2 * GRAN, 0, CU_MEM_ACCESS_FLAGS_PROT_READ), CUDA_ERROR_NOT_SUPPORTED);
    CU_OK(vmm_access(m, 2 * GRAN, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CHECK_EQ(vmm_get_access(m + GRAN + 5, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(touch_in_child(P(m), false), SIGSEGV); /* device memory: the CPU faults */

    /* copies and memsets through the mapping */
    CU_OK(cu.cuMemsetD8_v2(m, 0x5a, 2 * GRAN));
    CHECK(all_bytes(m, 0x5a, 2 * GRAN));
    CUdeviceptr d = 0;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_OK(cu.cuMemsetD8_v2(d, 0x11, 4096));
    CU_OK(cu.cuMemcpyDtoD_v2(m + GRAN, d, 4096));
    CHECK(all_bytes(m + GRAN, 0x11, 4096));
    CHECK(all_bytes(m + GRAN + 4096, 0x5a, 64));
    memset(buf, 0x22, sizeof buf);
    CU_OK(cu.cuMemcpyHtoD_v2(m + 100, buf, sizeof buf));
    CU_OK(cu.cuMemcpyDtoD_v2(d, m + 100, sizeof buf));
    CHECK(all_bytes(d, 0x22, sizeof buf));
    CU_EXPECT(cu.cuMemsetD8_v2(m + GRAN, 0, GRAN + 1), CUDA_ERROR_INVALID_VALUE); /* past it */
    CU_OK(cu.cuMemFree_v2(d));
    CU_EXPECT(cu.cuMemFree_v2(m), CUDA_ERROR_INVALID_VALUE);
    CUipcMemHandle ih;
    CU_EXPECT(cu.cuIpcGetMemHandle(&ih, m), CUDA_ERROR_INVALID_VALUE);

    /* the mapping is the range */
    CUdeviceptr base = 0;
    size_t size = 0;
    CU_OK(cu.cuMemGetAddressRange_v2(&base, &size, m + GRAN + 7));
    CHECK(base == m && size == 2 * GRAN);
    CU_EXPECT(cu.cuMemGetAddressRange_v2(&base, &size, va), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(mem_type(m + 3), CU_MEMORYTYPE_DEVICE);
    CHECK_EQ(ordinal_of(m), 0);
    CUdeviceptr start = 0;
    CU_OK(cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, m + 9));
    CHECK(start == va); /* the attributes: the reservation */
    CU_OK(cu.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, m + 9));
    CHECK_EQ(size, 4 * GRAN);

    /* released while mapped: the mapping keeps it; a retain names it again */
    CU_EXPECT(cu.cuMemAddressFree(va, 4 * GRAN), CUDA_ERROR_INVALID_VALUE); /* mapped */
    CU_OK(cu.cuMemRelease(h));
    CU_EXPECT(cu.cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_vmm_handles, s0.live_vmm_handles + 1);
    CHECK(all_bytes(m, 0x5a, 64));
    CUmemGenericAllocationHandle r = 0;
    CU_EXPECT(cu.cuMemRetainAllocationHandle(&r, P(va)), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemRetainAllocationHandle(&r, P(m + GRAN + 1)));
    CHECK(r == h);
    CU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&got, r));

    /* unmap: whole mappings only; then a reservation again, without access */
    CU_EXPECT(cu.cuMemUnmap(m + GRAN, GRAN), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemUnmap(m, 3 * GRAN), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemUnmap(m, 2 * GRAN));
    CU_EXPECT(cu.cuMemUnmap(m, 2 * GRAN), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_vmm_mappings, s0.live_vmm_mappings);
    CHECK_EQ(stats().live_vmm_handles, s0.live_vmm_handles + 1); /* the retain */
    CU_OK(cu.cuMemMap(va, 2 * GRAN, 0, r, 0)); /* elsewhere in the reservation */
    CU_OK(cu.cuMemMap(va + 2 * GRAN, 2 * GRAN, 0, r, 0)); /* twice, adjacent */
    CHECK_EQ(vmm_get_access(va, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CU_OK(vmm_access(va, 4 * GRAN, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)); /* both at once */
    CHECK(all_bytes(va + 2 * GRAN + GRAN, 0x11, 4096)); /* one memory, two addresses */
    CU_OK(cu.cuMemsetD8_v2(va, 0x66, 8));
    CHECK(all_bytes(va + 2 * GRAN, 0x66, 8));
    CU_OK(cu.cuMemRelease(r));
    CU_OK(cu.cuMemUnmap(va, 4 * GRAN)); /* both; the last mapping frees it */
    CHECK_EQ(stats().live_vmm_handles, s0.live_vmm_handles);
    CHECK_EQ(stats().device_used[0], s0.device_used[0]);

    /* export and import: a CLOEXEC descriptor of a memfd of this driver */
    CU_REQUIRE_OK(cu.cuMemCreate(&h, 2 * GRAN, &prop, 0));
    int fd = -1;
    CU_EXPECT(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
              CUDA_ERROR_NOT_SUPPORTED);
    CU_EXPECT(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
              CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_OK(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    CUmemAllocationProp none = vmm_prop(0, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle hn = 0;
    CU_REQUIRE_OK(cu.cuMemCreate(&hn, GRAN, &none, 0));
    int fd2 = -1;
    CU_EXPECT(cu.cuMemExportToShareableHandle(&fd2, hn, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE); /* not requested at creation */
    CU_OK(cu.cuMemRelease(hn));
    int plain = memfd_create("not_the_driver", MFD_CLOEXEC);
    REQUIRE(plain >= 0);
    REQUIRE(ftruncate(plain, (off_t)GRAN) == 0);
    CU_EXPECT(cu.cuMemImportFromShareableHandle(&x, (void *)(uintptr_t)plain,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_ERROR_INVALID_VALUE);
    close(plain);
    CU_EXPECT(cu.cuMemImportFromShareableHandle(&x, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_FABRIC),
              CUDA_ERROR_NOT_SUPPORTED);
    CUmemGenericAllocationHandle hi = 0;
    CU_REQUIRE_OK(cu.cuMemImportFromShareableHandle(&hi, (void *)(uintptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK(hi != h);
    CU_OK(cu.cuMemMap(va, 2 * GRAN, 0, h, 0));
    CU_OK(cu.cuMemMap(va + 2 * GRAN, 2 * GRAN, 0, hi, 0));
    CU_OK(vmm_access(va, 4 * GRAN, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU_OK(cu.cuMemsetD8_v2(va, 0x5a, 2 * GRAN));
    CHECK(all_bytes(va + 2 * GRAN, 0x5a, 2 * GRAN));
    CU_OK(cu.cuMemUnmap(va + 2 * GRAN, 2 * GRAN));
    CU_OK(cu.cuMemRelease(hi));

    /* another process imports it (the descriptor over SCM_RIGHTS) */
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (dup2(sv[1], 100) < 0) _exit(90);
        execl("/proc/self/exe", "test_cuda_driver", "vmm-importer", "100", (char *)NULL);
        _exit(91);
    }
    close(sv[1]);
    send_fd(sv[0], fd);
    close(fd);
    char ack = 0;
    CHECK(read_all(sv[0], &ack, 1) && ack == 'k');
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sv[0]);
    CHECK(all_bytes(va, 0xa5, 2 * GRAN)); /* what the importer wrote */

    /* injected failures, counts, cuGetProcAddress_v2, a fork child */
    const uint64_t calls = ctl.call_count("cuMemMap");
    CHECK_EQ(ctl.fail_next("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    x = 0;
    CU_EXPECT(cu.cuMemCreate(&x, GRAN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(x == 0);
    CHECK_EQ(ctl.fail_next("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE), 0);
    CU_EXPECT(cu.cuMemMap(va + 2 * GRAN, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(ctl.call_count("cuMemMap"), calls + 1);
    CHECK_EQ(stats().live_vmm_mappings, s0.live_vmm_mappings + 1);
    void *fn = NULL;
    CU_OK(cu.cuGetProcAddress_v2("cuMemCreate", &fn, 13000, 0, NULL));
    CHECK(fn == (void *)cu.cuMemCreate);
    CU_OK(cu.cuGetProcAddress_v2("cuMemRetainAllocationHandle", &fn, 13000, 0, NULL));
    CHECK(fn == (void *)cu.cuMemRetainAllocationHandle);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        CUmemGenericAllocationHandle y = 0;
        CUdeviceptr z = 0;
        _exit(cu.cuMemCreate(&y, GRAN, &prop, 0) == CUDA_ERROR_NOT_INITIALIZED &&
                      cu.cuMemAddressReserve(&z, GRAN, 0, 0, 0) == CUDA_ERROR_NOT_INITIALIZED &&
                      cu.cuMemUnmap(va, 2 * GRAN) == CUDA_ERROR_NOT_INITIALIZED
                  ? 0 : 1);
    }
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    CU_OK(cu.cuMemUnmap(va, 2 * GRAN));
    CU_OK(cu.cuMemRelease(h));
    CU_OK(cu.cuMemAddressFree(va, 4 * GRAN));
    CU_OK(cu.cuMemAddressFree(vb, 4 * GRAN));
    const hm_cuda_test_stats_t s1 = stats();
    CHECK_EQ(s1.live_vmm_handles, s0.live_vmm_handles);
    CHECK_EQ(s1.live_vmm_mappings, s0.live_vmm_mappings);
    CHECK_EQ(s1.device_used[0], s0.device_used[0]);
}

/* ---- memory pools with IPC: an exec'd importer ---- */

/* What the exporter sends after the pool's descriptor: the export data of
 * a (2 MiB of 0x5a) and b (4 KiB), and a's address there. */
struct pool_msg {
    CUmemPoolPtrExportData a, b;
    uint64_t a_base;
};

static CUmemPoolProps pool_props(int dev, CUmemAllocationHandleType types) {
    CUmemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.handleTypes = types;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.maxSize = 8 * MIB;
    return p;
}

/* Export data with `n` bytes at `at` replaced by v (the layout:
 * cuda_test_driver.h). */
static CUmemPoolPtrExportData px_patched(CUmemPoolPtrExportData x, size_t at, uint64_t v, size_t n) {
    memcpy(x.reserved + at, &v, n);
    return x;
}

static uint64_t px_field(const CUmemPoolPtrExportData *x, size_t at) {
    uint64_t v;
    memcpy(&v, x->reserved + at, 8);
    return v;
}

/* The exec'd importer of test_pools. Phase 1: imports the pool and a,
 * checks and writes it, frees it; imports b and keeps it; answers 'k'.
 * Phase 2 (after 'f': the exporter freed a, then b while imported here):
 * both export data are refused, the stale b is freed; answers 'k'. */
static int pool_importer(int sock) {
    ctl.set_lenient(0);
    hm_test_set_context("pool importer");
    CU_REQUIRE_OK(cu.cuInit(0));
    CUcontext p0 = NULL;
    CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&p0, 0));
    set_current(p0);
    const hm_cuda_test_stats_t s0 = stats();
    int fd = recv_fd(sock);
    REQUIRE(fd >= 0);
    struct pool_msg m;
    REQUIRE(read_all(sock, &m, sizeof m));

    CUmemoryPool ip = NULL;
    int plain = memfd_create("not_the_driver", MFD_CLOEXEC);
    REQUIRE(plain >= 0 && ftruncate(plain, (off_t)(10 * MIB)) == 0);
    CU_EXPECT(cu.cuMemPoolImportFromShareableHandle(&ip, (void *)(uintptr_t)plain,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);
    close(plain);
    CU_EXPECT(cu.cuMemPoolImportFromShareableHandle(&ip, (void *)(uintptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
              CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(ctl.fail_next("cuMemPoolImportFromShareableHandle", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    CU_EXPECT(cu.cuMemPoolImportFromShareableHandle(&ip, (void *)(uintptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(ip == NULL);
    CU_REQUIRE_OK(cu.cuMemPoolImportFromShareableHandle(&ip, (void *)(uintptr_t)fd,
                                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(fd); /* the pool holds its own */
    CHECK_EQ(stats().live_pools, s0.live_pools + 1);
    CUdeviceptr x = 0;
    /* cuda.h: imported pools "may not be used in ... cuMemAllocFromPoolAsync" */
    CU_EXPECT(cu.cuMemAllocFromPoolAsync(&x, 4096, ip, NULL), CUDA_ERROR_INVALID_VALUE);
    int out = -1;
    CU_EXPECT(cu.cuMemPoolExportToShareableHandle(&out, ip, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);

    /* forged or altered export data: refused, nothing mapped */
    CUmemPoolPtrExportData zero;
    memset(&zero, 0, sizeof zero);
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &zero), CUDA_ERROR_INVALID_VALUE);
    CUmemPoolPtrExportData f = px_patched(m.a, 16, px_field(&m.a, 16) + 1000, 8); /* another id */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &f), CUDA_ERROR_INVALID_VALUE);
    f = px_patched(m.a, 24, px_field(&m.a, 24) + 4096, 8); /* inside a, not its start */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &f), CUDA_ERROR_INVALID_VALUE);
    f = px_patched(m.a, 32, 64 * MIB, 8); /* a larger size */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &f), CUDA_ERROR_INVALID_VALUE);
    f = px_patched(m.a, 24, px_field(&m.b, 24), 8); /* b's offset with a's id */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &f), CUDA_ERROR_INVALID_VALUE);
    f = px_patched(m.a, 40, px_field(&m.a, 40) ^ 1, 8); /* another pool's file */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &f), CUDA_ERROR_INVALID_VALUE);
    f = px_patched(m.a, 0, 0x12345678, 4); /* not export data */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &f), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, NULL, &m.a), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_pool_imports, 0);
    CHECK_EQ(ctl.fail_next("cuMemPoolImportPointer", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    x = 0;
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &m.a), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(x == 0);
    CHECK_EQ(stats().live_pool_imports, 0);

    /* a: at the exporter's address, its bytes, written here */
    CUdeviceptr a = 0, a2 = 0;
    CU_REQUIRE_OK(cu.cuMemPoolImportPointer(&a, ip, &m.a));
    CHECK_EQ(a, m.a_base);
    CHECK(all_bytes(a, 0x5a, 2 * MIB));
    CHECK_EQ(stats().device_used[0], s0.device_used[0]); /* charged to the exporter */
    CUmemoryPool got = NULL;
    CU_OK(cu.cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a));
    CHECK(got == ip);
    CU_OK(cu.cuMemsetD8_v2(a, 0xa5, 2 * MIB));
    CU_OK(cu.cuCtxSynchronize());
    /* imported twice: the same pointer, one free each */
    CU_OK(cu.cuMemPoolImportPointer(&a2, ip, &m.a));
    CHECK_EQ(a2, a);
    CHECK_EQ(stats().live_pool_import_refs, 2);
    CHECK_EQ(ctl.fail_next("cuMemFree_v2", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuMemFree_v2(a), CUDA_ERROR_UNKNOWN);
    CHECK_EQ(stats().live_pool_import_refs, 2);
    CU_OK(cu.cuMemFree_v2(a));
    CHECK_EQ(stats().live_pool_imports, 1);
    CU_OK(cu.cuMemFreeAsync(a, NULL)); /* the last: unmapped */
    CHECK_EQ(stats().live_pool_imports, 0);
    CU_EXPECT(cu.cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr b = 0;
    CU_REQUIRE_OK(cu.cuMemPoolImportPointer(&b, ip, &m.b));
    CHECK_EQ(stats().live_pool_imports, 1);
    printf("pool importer: phase 1 done\n");
    write_all(sock, "k", 1);

    char go = 0;
    REQUIRE(read_all(sock, &go, 1) && go == 'f');
    /* the exporter freed a (after this process) and b (before it): the
     * data of both now name nothing */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &m.a), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, ip, &m.b), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemFree_v2(b)); /* the stale mapping goes all the same */
    CHECK_EQ(stats().live_pool_imports, 0);
    CU_OK(cu.cuMemPoolDestroy(ip));
    CU_EXPECT(cu.cuMemPoolDestroy(ip), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_pools, s0.live_pools);
    CHECK_EQ(stats().pool_early_frees, 0); /* counted where the free was made */
    CU_OK(cu.cuDevicePrimaryCtxRelease_v2(0));
    printf("pool importer: %d checks passed, %d failed\n", hm_test_passed_count(), hm_test_failed_count());
    write_all(sock, "k", 1);
    return hm_test_failed_count();
}

static void test_pools(void) {
    hm_test_set_context("pools");
    set_current(pc[0]);
    const hm_cuda_test_stats_t s0 = stats();
    int attr = -1;
    CU_OK(cu.cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0));
    CHECK_EQ(attr, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

    /* properties: cuda.h's rules */
    CUmemoryPool mp = NULL, np = NULL;
    CUmemPoolProps pp = pool_props(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CU_EXPECT(cu.cuMemPoolCreate(&mp, NULL), CUDA_ERROR_INVALID_VALUE);
    CUmemPoolProps bad = pp;
    bad.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
    CU_EXPECT(cu.cuMemPoolCreate(&mp, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = pp;
    bad.reserved[53] = 1; /* "must be 0" */
    CU_EXPECT(cu.cuMemPoolCreate(&mp, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = pp;
    bad.win32SecurityAttributes = &bad; /* "required to be zero" off Windows */
    CU_EXPECT(cu.cuMemPoolCreate(&mp, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = pp;
    bad.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    CU_EXPECT(cu.cuMemPoolCreate(&mp, &bad), CUDA_ERROR_NOT_SUPPORTED);
    bad = pp;
    bad.location.id = HM_CUDA_TEST_MAX_DEVICES;
    CU_EXPECT(cu.cuMemPoolCreate(&mp, &bad), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(ctl.fail_next("cuMemPoolCreate", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    CU_EXPECT(cu.cuMemPoolCreate(&mp, &pp), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(mp == NULL);
    CHECK_EQ(stats().live_pools, s0.live_pools);
    CU_REQUIRE_OK(cu.cuMemPoolCreate(&mp, &pp));
    CUmemPoolProps none = pool_props(0, CU_MEM_HANDLE_TYPE_NONE);
    CU_REQUIRE_OK(cu.cuMemPoolCreate(&np, &none));
    CHECK(mp != np);
    CHECK_EQ(stats().live_pools, s0.live_pools + 2);
    CUmemoryPool dp = NULL;
    CU_OK(cu.cuDeviceGetDefaultMemPool(&dp, 0));
    CU_EXPECT(cu.cuMemPoolDestroy(dp), CUDA_ERROR_INVALID_VALUE); /* "cannot be destroyed" */

    /* allocations: stream-ordered (synchronous here), charged, bounded */
    CUdeviceptr a = 0, b = 0, n = 0, d = 0, x = 0;
    CU_EXPECT(cu.cuMemAllocFromPoolAsync(&x, 0, mp, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemAllocFromPoolAsync(&x, 16 * MIB, mp, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CU_EXPECT(cu.cuMemAllocFromPoolAsync(&x, 4096, mp, (CUstream)(uintptr_t)0x99), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(ctl.fail_next("cuMemAllocFromPoolAsync", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    CU_EXPECT(cu.cuMemAllocFromPoolAsync(&x, 4096, mp, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(x == 0);
    CHECK_EQ(stats().device_used[0], s0.device_used[0]);
    CU_REQUIRE_OK(cu.cuMemAllocFromPoolAsync(&a, 2 * MIB, mp, NULL));
    CU_REQUIRE_OK(cu.cuMemAllocFromPoolAsync(&b, 4096, mp, CU_STREAM_PER_THREAD));
    CU_REQUIRE_OK(cu.cuMemAllocFromPoolAsync(&n, 4096, np, NULL));
    CU_REQUIRE_OK(cu.cuMemAllocFromPoolAsync(&d, 4096, dp, NULL)); /* the default pool: async memory */
    CHECK_EQ(stats().live_pool_allocs, s0.live_pool_allocs + 3);
    CHECK_EQ(stats().live_async_allocs, s0.live_async_allocs + 1);
    CHECK_EQ(stats().device_used[0], s0.device_used[0] + 2 * MIB + 3 * 4096);
    CHECK_EQ(a % (2 * MIB), 0);
    CHECK_EQ(mem_type(a), CU_MEMORYTYPE_DEVICE);
    CUmemoryPool got = NULL;
    CU_OK(cu.cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a));
    CHECK(got == mp);
    CHECK(context_of(a) == NULL); /* cuda.h: "not associated with any CUDA context" */
    CU_OK(cu.cuMemsetD8_v2(a, 0x5a, 2 * MIB));
    CU_OK(cu.cuStreamSynchronize(NULL));

    /* exports: only of IPC-capable pools and their allocations */
    CUmemPoolPtrExportData xa, xb, xn;
    int fd = -1, fd2 = -1;
    CU_EXPECT(cu.cuMemPoolExportPointer(&xn, n), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolExportPointer(&xn, d), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolExportToShareableHandle(&fd2, np, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolExportToShareableHandle(&fd2, dp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolExportToShareableHandle(&fd2, mp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolExportToShareableHandle(&fd2, mp, CU_MEM_HANDLE_TYPE_FABRIC, 0),
              CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(ctl.fail_next("cuMemPoolExportPointer", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    CU_EXPECT(cu.cuMemPoolExportPointer(&xa, a), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cu.cuMemPoolExportPointer(&xa, a + 4096)); /* interior: the whole allocation */
    CU_OK(cu.cuMemPoolExportPointer(&xb, b));
    CU_REQUIRE_OK(cu.cuMemPoolExportToShareableHandle(&fd, mp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    /* a created pool imports nothing */
    CU_EXPECT(cu.cuMemPoolImportPointer(&x, mp, &xa), CUDA_ERROR_INVALID_VALUE);

    /* the importer: this program again, exec'd */
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (dup2(sv[1], 100) < 0) _exit(90);
        execl("/proc/self/exe", "test_cuda_driver", "pool-importer", "100", (char *)NULL);
        _exit(91);
    }
    close(sv[1]);
    send_fd(sv[0], fd);
    close(fd);
    const struct pool_msg m = {xa, xb, a};
    write_all(sv[0], &m, sizeof m);
    char ack = 0;
    CHECK(read_all(sv[0], &ack, 1) && ack == 'k');
    CHECK(all_bytes(a, 0xa5, 2 * MIB)); /* what the importer wrote */
    /* a: freed here after the importer freed it, as cuda.h asks; b: freed
     * while the importer still maps it, which cuda.h forbids (counted) */
    const uint64_t early = stats().pool_early_frees;
    CU_OK(cu.cuMemFreeAsync(a, NULL));
    CHECK_EQ(stats().pool_early_frees, early);
    CU_OK(cu.cuMemFree_v2(b));
    CHECK_EQ(stats().pool_early_frees, early + 1);
    write_all(sv[0], "f", 1);
    CHECK(read_all(sv[0], &ack, 1) && ack == 'k');
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sv[0]);

    /* destroy with an allocation left: returns at once, the pool goes at
     * the last free; its handle is unknown from the destroy on */
    CU_OK(cu.cuMemPoolDestroy(np));
    CU_EXPECT(cu.cuMemAllocFromPoolAsync(&x, 4096, np, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cu.cuMemPoolDestroy(np), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(stats().live_pools, s0.live_pools + 1);
    CU_OK(cu.cuMemFree_v2(n));
    CU_OK(cu.cuMemFreeAsync(d, NULL));
    CHECK_EQ(ctl.fail_next("cuMemPoolDestroy", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuMemPoolDestroy(mp), CUDA_ERROR_UNKNOWN);
    CU_OK(cu.cuMemPoolDestroy(mp));
    void *fn = NULL;
    CU_OK(cu.cuGetProcAddress_v2("cuMemPoolImportPointer", &fn, 13000, 0, NULL));
    CHECK(fn == (void *)cu.cuMemPoolImportPointer);
    CU_EXPECT(cu.cuGetProcAddress_v2("cuMemPoolCreate", &fn, 11010, 0, NULL), CUDA_ERROR_NOT_FOUND);
    const hm_cuda_test_stats_t s1 = stats();
    CHECK_EQ(s1.live_pools, s0.live_pools);
    CHECK_EQ(s1.live_pool_allocs, s0.live_pool_allocs);
    CHECK_EQ(s1.live_async_allocs, s0.live_async_allocs);
    CHECK_EQ(s1.device_used[0], s0.device_used[0]);
}

static void test_old_names(void) {
    hm_test_set_context("old ABIs");
    for (size_t i = 0; i < NOLD; i++) {
        int err[2];
        REQUIRE(pipe(err) == 0);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            struct rlimit rl = {0, 0};
            setrlimit(RLIMIT_CORE, &rl);
            dup2(err[1], STDERR_FILENO);
            close(err[0]);
            call_old(old_names[i].name);
            _exit(0); /* it returned */
        }
        close(err[1]);
        char text[1024];
        (void)hm_test_read_all(err[0], text, sizeof text);
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s: status 0x%x",
                  old_names[i].name, status);
        CHECK_MSG(strstr(text, old_names[i].use) != NULL, "%s: the message names no %s: %s",
                  old_names[i].name, old_names[i].use, text);
    }
}

/* ---- failure injection ---- */

static void test_injection(void) {
    hm_test_set_context("injection");
    set_current(pc[0]);
    const hm_cuda_test_stats_t s0 = stats();
    const uint64_t calls0 = ctl.call_count("cuMemAlloc_v2");
    CHECK_EQ(ctl.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    CUdeviceptr p = 0x5678;
    CU_EXPECT(cu.cuMemAlloc_v2(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(p, 0x5678);
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
    CHECK_EQ(stats().device_used[0], s0.device_used[0]);
    CHECK_EQ(ctl.call_count("cuMemAlloc_v2"), calls0 + 1);
    CU_OK(cu.cuMemAlloc_v2(&p, 4096)); /* once only */

    /* the second next call */
    CHECK_EQ(ctl.fail_next("cuMemHostAlloc", 2, CUDA_ERROR_ECC_UNCORRECTABLE), 0);
    void *h1 = NULL, *h2 = NULL, *h3 = NULL;
    CU_OK(cu.cuMemHostAlloc(&h1, 4096, 0));
    CU_EXPECT(cu.cuMemHostAlloc(&h2, 4096, 0), CUDA_ERROR_ECC_UNCORRECTABLE);
    CHECK(h2 == NULL);
    CU_OK(cu.cuMemHostAlloc(&h3, 4096, 0));
    /* cancelled; dropped by a reset */
    CHECK_EQ(ctl.fail_next("cuMemHostAlloc", 1, CUDA_ERROR_UNKNOWN), 0);
    CHECK_EQ(ctl.fail_next("cuMemHostAlloc", 0, CUDA_ERROR_UNKNOWN), 0);
    CU_OK(cu.cuMemHostAlloc(&h2, 4096, 0));
    CU_OK(cu.cuMemFreeHost(h2));

    /* a copy that fails copies nothing; a free that fails frees nothing */
    uint8_t buf[64];
    memset(buf, 0xee, sizeof buf);
    CU_OK(cu.cuMemsetD8_v2(p, 1, 64));
    CHECK_EQ(ctl.fail_next("cuMemcpyDtoH_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    CU_EXPECT(cu.cuMemcpyDtoH_v2(buf, p, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(buf[0] == 0xee && buf[63] == 0xee);
    CHECK_EQ(ctl.fail_next("cuMemFree_v2", 1, CUDA_ERROR_LAUNCH_FAILED), 0);
    CU_EXPECT(cu.cuMemFree_v2(p), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(stats().live_device_allocs, s0.live_device_allocs + 1);
    CU_OK(cu.cuMemFree_v2(p));

    /* context calls: nothing changes */
    CHECK_EQ(ctl.fail_next("cuCtxGetCurrent", 1, CUDA_ERROR_INVALID_CONTEXT), 0);
    CUcontext c = (CUcontext)(uintptr_t)3;
    CU_EXPECT(cu.cuCtxGetCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(c == (CUcontext)(uintptr_t)3);
    CHECK_EQ(ctl.fail_next("cuCtxPushCurrent_v2", 1, CUDA_ERROR_UNKNOWN), 0);
    CU_EXPECT(cu.cuCtxPushCurrent_v2(pc[other_dev()]), CUDA_ERROR_UNKNOWN);
    CHECK(get_current() == pc[0]);
    CHECK_EQ(ctl.fail_next("cuDevicePrimaryCtxRetain", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(stats().primary_refs[0], s0.primary_refs[0]);

    CHECK_EQ(ctl.fail_next("cuMemcpy", 1, CUDA_ERROR_UNKNOWN), 0);
    ctl.reset();
    CU_OK(cu.cuMemcpy(D(buf), D(buf + 32), 8));
    CHECK_EQ(ctl.fail_next("cuNoSuchFunction", 1, CUDA_ERROR_UNKNOWN), -1);
    CHECK_EQ(ctl.fail_next("cuMemAlloc_v2", 1, CUDA_SUCCESS), -1);
    CHECK_EQ(ctl.fail_next(NULL, 1, CUDA_ERROR_UNKNOWN), -1);
    CU_OK(cu.cuMemFreeHost(h1));
    CU_OK(cu.cuMemFreeHost(h3));
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
}

/* ---- call counts: every entry point, failures included ---- */

/* One call of the named entry point that changes nothing (bad arguments). */
static void call_harmless(const char *name) {
    int local = 0;
    void *pv = NULL;
    CUdeviceptr d = 0;
    CUcontext c = NULL;
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    const char *s = NULL;
    if (!strcmp(name, "cuInit")) (void)cu.cuInit(1);
    else if (!strcmp(name, "cuDriverGetVersion")) (void)cu.cuDriverGetVersion(NULL);
    else if (!strcmp(name, "cuGetErrorName")) (void)cu.cuGetErrorName(CUDA_SUCCESS, &s);
    else if (!strcmp(name, "cuGetErrorString")) (void)cu.cuGetErrorString(CUDA_SUCCESS, &s);
    else if (!strcmp(name, "cuGetProcAddress_v2")) (void)cu.cuGetProcAddress_v2(NULL, NULL, 0, 0, NULL);
    else if (!strcmp(name, "cuDeviceGet")) (void)cu.cuDeviceGet(NULL, 0);
    else if (!strcmp(name, "cuDeviceGetCount")) (void)cu.cuDeviceGetCount(NULL);
    else if (!strcmp(name, "cuDeviceGetName")) (void)cu.cuDeviceGetName(NULL, 0, 0);
    else if (!strcmp(name, "cuDeviceGetUuid")) (void)cu.cuDeviceGetUuid(NULL, 0);
    else if (!strcmp(name, "cuDeviceGetUuid_v2")) (void)cu.cuDeviceGetUuid_v2(NULL, 0);
    else if (!strcmp(name, "cuDeviceGetAttribute")) (void)cu.cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0);
    else if (!strcmp(name, "cuDeviceTotalMem_v2")) (void)cu.cuDeviceTotalMem_v2(NULL, 0);
    else if (!strcmp(name, "cuDeviceCanAccessPeer")) (void)cu.cuDeviceCanAccessPeer(NULL, 0, 0);
    else if (!strcmp(name, "cuDeviceGetDefaultMemPool")) (void)cu.cuDeviceGetDefaultMemPool(NULL, 0);
    else if (!strcmp(name, "cuDevicePrimaryCtxRetain")) (void)cu.cuDevicePrimaryCtxRetain(NULL, 0);
    else if (!strcmp(name, "cuDevicePrimaryCtxRelease_v2")) (void)cu.cuDevicePrimaryCtxRelease_v2(-1);
    else if (!strcmp(name, "cuCtxCreate_v2")) (void)cu.cuCtxCreate_v2(NULL, 0, 0);
    else if (!strcmp(name, "cuCtxCreate_v4")) (void)cu.cuCtxCreate_v4(NULL, NULL, 0, 0);
    else if (!strcmp(name, "cuCtxDestroy_v2")) (void)cu.cuCtxDestroy_v2(NULL);
    else if (!strcmp(name, "cuCtxGetCurrent")) (void)cu.cuCtxGetCurrent(&c);
    else if (!strcmp(name, "cuCtxSetCurrent")) (void)cu.cuCtxSetCurrent((CUcontext)(void *)&local);
    else if (!strcmp(name, "cuCtxPushCurrent_v2")) (void)cu.cuCtxPushCurrent_v2(NULL);
    else if (!strcmp(name, "cuCtxPopCurrent_v2")) { /* pop and put back */
        (void)cu.cuCtxPopCurrent_v2(&c);
        (void)cu.cuCtxSetCurrent(NULL);
        (void)cu.cuCtxPushCurrent_v2(c);
    } else if (!strcmp(name, "cuCtxGetDevice")) (void)cu.cuCtxGetDevice(NULL);
    else if (!strcmp(name, "cuCtxGetDevice_v2")) (void)cu.cuCtxGetDevice_v2(NULL, NULL);
    else if (!strcmp(name, "cuCtxSynchronize")) (void)cu.cuCtxSynchronize();
    else if (!strcmp(name, "cuCtxSynchronize_v2")) (void)cu.cuCtxSynchronize_v2(NULL);
    else if (!strcmp(name, "cuMemAlloc_v2")) (void)cu.cuMemAlloc_v2(&d, 0);
    else if (!strcmp(name, "cuMemFree_v2")) (void)cu.cuMemFree_v2(0);
    else if (!strcmp(name, "cuMemAllocHost_v2")) (void)cu.cuMemAllocHost_v2(&pv, 0);
    else if (!strcmp(name, "cuMemHostAlloc")) (void)cu.cuMemHostAlloc(&pv, 0, 0);
    else if (!strcmp(name, "cuMemFreeHost")) (void)cu.cuMemFreeHost(&local);
    else if (!strcmp(name, "cuMemAllocManaged")) (void)cu.cuMemAllocManaged(&d, 0, CU_MEM_ATTACH_GLOBAL);
    else if (!strcmp(name, "cuMemHostGetDevicePointer_v2")) (void)cu.cuMemHostGetDevicePointer_v2(&d, NULL, 1);
    else if (!strcmp(name, "cuMemGetAddressRange_v2")) (void)cu.cuMemGetAddressRange_v2(NULL, NULL, D(&local));
    else if (!strcmp(name, "cuMemGetInfo_v2")) (void)cu.cuMemGetInfo_v2(NULL, NULL);
    else if (!strcmp(name, "cuMemGetAllocationGranularity"))
        (void)cu.cuMemGetAllocationGranularity(NULL, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    else if (!strcmp(name, "cuMemsetD8_v2")) (void)cu.cuMemsetD8_v2(0, 0, 0);
    else if (!strcmp(name, "cuMemcpy")) (void)cu.cuMemcpy(0, 0, 0);
    else if (!strcmp(name, "cuMemcpyHtoD_v2")) (void)cu.cuMemcpyHtoD_v2(0, NULL, 0);
    else if (!strcmp(name, "cuMemcpyDtoH_v2")) (void)cu.cuMemcpyDtoH_v2(NULL, 0, 0);
    else if (!strcmp(name, "cuMemcpyDtoD_v2")) (void)cu.cuMemcpyDtoD_v2(0, 0, 0);
    else if (!strcmp(name, "cuPointerGetAttribute")) (void)cu.cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_CONTEXT, 0);
    else if (!strcmp(name, "cuPointerGetAttributes")) (void)cu.cuPointerGetAttributes(0, NULL, NULL, 0);
    else if (!strcmp(name, "cuIpcGetMemHandle")) (void)cu.cuIpcGetMemHandle(NULL, 0);
    else if (!strcmp(name, "cuIpcOpenMemHandle_v2")) (void)cu.cuIpcOpenMemHandle_v2(NULL, h, 0);
    else if (!strcmp(name, "cuIpcCloseMemHandle")) (void)cu.cuIpcCloseMemHandle(0);
    else if (!strcmp(name, "cuMemAllocAsync")) (void)cu.cuMemAllocAsync(&d, 0, NULL);
    else if (!strcmp(name, "cuMemFreeAsync")) (void)cu.cuMemFreeAsync(0, NULL);
    else if (!strcmp(name, "cuStreamSynchronize")) (void)cu.cuStreamSynchronize(NULL);
    else if (!strcmp(name, "cuStreamCreate")) (void)cu.cuStreamCreate(NULL, 0);
    else if (!strcmp(name, "cuStreamDestroy_v2")) (void)cu.cuStreamDestroy_v2(NULL);
    else if (!strcmp(name, "cuStreamQuery")) (void)cu.cuStreamQuery(NULL);
    else if (!strcmp(name, "cuStreamWaitEvent")) (void)cu.cuStreamWaitEvent(NULL, NULL, 0);
    else if (!strcmp(name, "cuEventCreate")) (void)cu.cuEventCreate(NULL, 0);
    else if (!strcmp(name, "cuEventRecord")) (void)cu.cuEventRecord(NULL, NULL);
    else if (!strcmp(name, "cuEventQuery")) (void)cu.cuEventQuery(NULL);
    else if (!strcmp(name, "cuEventSynchronize")) (void)cu.cuEventSynchronize(NULL);
    else if (!strcmp(name, "cuEventDestroy_v2")) (void)cu.cuEventDestroy_v2(NULL);
    else if (!strcmp(name, "cuMemsetD8Async")) (void)cu.cuMemsetD8Async(0, 0, 0, NULL);
    else if (!strcmp(name, "cuMemcpyAsync")) (void)cu.cuMemcpyAsync(0, 0, 0, NULL);
    else if (!strcmp(name, "cuMemCreate")) (void)cu.cuMemCreate(NULL, 0, NULL, 0);
    else if (!strcmp(name, "cuMemRelease")) (void)cu.cuMemRelease(0);
    else if (!strcmp(name, "cuMemAddressReserve")) (void)cu.cuMemAddressReserve(NULL, 0, 0, 0, 0);
    else if (!strcmp(name, "cuMemAddressFree")) (void)cu.cuMemAddressFree(0, 0);
    else if (!strcmp(name, "cuMemMap")) (void)cu.cuMemMap(0, 0, 0, 0, 0);
    else if (!strcmp(name, "cuMemUnmap")) (void)cu.cuMemUnmap(0, 0);
    else if (!strcmp(name, "cuMemSetAccess")) (void)cu.cuMemSetAccess(0, 0, NULL, 0);
    else if (!strcmp(name, "cuMemGetAccess")) (void)cu.cuMemGetAccess(NULL, NULL, 0);
    else if (!strcmp(name, "cuMemExportToShareableHandle"))
        (void)cu.cuMemExportToShareableHandle(NULL, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    else if (!strcmp(name, "cuMemImportFromShareableHandle"))
        (void)cu.cuMemImportFromShareableHandle(NULL, NULL, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    else if (!strcmp(name, "cuMemRetainAllocationHandle")) (void)cu.cuMemRetainAllocationHandle(NULL, NULL);
    else if (!strcmp(name, "cuMemGetAllocationPropertiesFromHandle"))
        (void)cu.cuMemGetAllocationPropertiesFromHandle(NULL, 0);
    else if (!strcmp(name, "cuMemPoolCreate")) (void)cu.cuMemPoolCreate(NULL, NULL);
    else if (!strcmp(name, "cuMemPoolDestroy")) (void)cu.cuMemPoolDestroy(NULL);
    else if (!strcmp(name, "cuMemAllocFromPoolAsync")) (void)cu.cuMemAllocFromPoolAsync(NULL, 0, NULL, NULL);
    else if (!strcmp(name, "cuMemPoolExportToShareableHandle"))
        (void)cu.cuMemPoolExportToShareableHandle(NULL, NULL, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    else if (!strcmp(name, "cuMemPoolImportFromShareableHandle"))
        (void)cu.cuMemPoolImportFromShareableHandle(NULL, NULL, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    else if (!strcmp(name, "cuMemPoolExportPointer")) (void)cu.cuMemPoolExportPointer(NULL, 0);
    else if (!strcmp(name, "cuMemPoolImportPointer")) (void)cu.cuMemPoolImportPointer(NULL, NULL, NULL);
    else CHECK_MSG(0, "no harmless call for %s", name);
}

static void test_counts(void) {
    hm_test_set_context("call counts");
    set_current(pc[0]);
    static const char *const names[] = {
#define X(name) #name,
        CU_FNS(X)
#undef X
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const uint64_t n0 = ctl.call_count(names[i]), all0 = stats().calls;
        CHECK_MSG(n0 != UINT64_MAX, "%s is not counted", names[i]);
        call_harmless(names[i]);
        const uint64_t want = strcmp(names[i], "cuCtxPopCurrent_v2") == 0 ? 3 : 1;
        CHECK_MSG(ctl.call_count(names[i]) == n0 + 1, "%s: %llu calls, expected %llu", names[i],
                  (unsigned long long)ctl.call_count(names[i]), (unsigned long long)n0 + 1);
        CHECK_MSG(stats().calls == all0 + want, "%s: %llu calls in all, expected %llu", names[i],
                  (unsigned long long)stats().calls, (unsigned long long)(all0 + want));
    }
    CHECK(get_current() == pc[0]);
    for (size_t i = 0; i < NOLD; i++) CHECK(ctl.call_count(old_names[i].name) != UINT64_MAX);
    CHECK_EQ(ctl.call_count("cuMemAlloc_v3"), UINT64_MAX);
    CHECK_EQ(ctl.call_count("hm_cuda_test_reset"), UINT64_MAX);
    CHECK_EQ(ctl.call_count(NULL), UINT64_MAX);

    /* what an allocation with the caller's context current costs: itself */
    ctl.reset();
    CHECK_EQ(stats().calls, 0);
    CHECK_EQ(ctl.call_count("cuCtxGetCurrent"), 0);
    CUdeviceptr d = 0;
    CU_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_OK(cu.cuMemFree_v2(d));
    for (int i = 0; i < 3; i++) (void)get_current();
    CU_OK(cu.cuCtxSetCurrent(pc[0]));
    ctl.get_stats(NULL); /* the control API is not counted */
    (void)ctl.call_count("cuMemAlloc_v2");
    const hm_cuda_test_stats_t s = stats();
    CHECK_EQ(s.calls, 6);
    CHECK_EQ(ctl.call_count("cuMemAlloc_v2"), 1);
    CHECK_EQ(ctl.call_count("cuMemFree_v2"), 1);
    CHECK_EQ(ctl.call_count("cuCtxGetCurrent"), 3);
    CHECK_EQ(ctl.call_count("cuCtxSetCurrent"), 1);
}

/* ---- threads and fork ---- */

struct worker {
    int index;
    int fails;
};

static void *work(void *arg) {
    struct worker *w = arg;
    int before = hm_test_failed_count();
    CUcontext c = NULL;
    CU_OK(cu.cuCtxCreate_v2(&c, 0, w->index % ndev));
    uint8_t *buf = malloc(64 * KIB);
    REQUIRE(buf);
    for (int i = 0; i < 150; i++) {
        size_t n = 1 + (size_t)((i * 7919 + w->index * 104729) % (64 * 1024 - 1));
        CUdeviceptr d = 0;
        if (cu.cuMemAlloc_v2(&d, n) != CUDA_SUCCESS) {
            CHECK(0);
            break;
        }
        const uint8_t v = (uint8_t)(i + w->index);
        CU_OK(cu.cuMemsetD8_v2(d, v, n));
        CU_OK(cu.cuMemcpyDtoH_v2(buf, d, n));
        CHECK(buf[0] == v && buf[n - 1] == v);
        CHECK(context_of(d) == c);
        CUipcMemHandle h;
        CU_OK(cu.cuIpcGetMemHandle(&h, d));
        CU_OK(cu.cuMemFree_v2(d));
    }
    free(buf);
    CU_OK(cu.cuCtxDestroy_v2(c));
    CHECK(get_current() == NULL);
    w->fails = hm_test_failed_count() - before;
    return NULL;
}

static void test_threads(void) {
    hm_test_set_context("threads");
    const hm_cuda_test_stats_t s0 = stats();
    pthread_t t[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i].index = i;
        w[i].fails = 0;
        REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].fails, 0);
    }
    const hm_cuda_test_stats_t s1 = stats();
    CHECK_EQ(s1.live_allocs, s0.live_allocs);
    CHECK_EQ(s1.live_contexts, s0.live_contexts);
    CHECK_EQ(s1.leaks, s0.leaks);
}

static _Atomic int busy_stop;

static void *busy(void *arg) {
    (void)arg;
    if (cu.cuCtxSetCurrent(pc[0]) != CUDA_SUCCESS) return NULL;
    while (!busy_stop) {
        CUdeviceptr d = 0;
        if (cu.cuMemAlloc_v2(&d, 8192) == CUDA_SUCCESS) {
            (void)cu.cuMemsetD8_v2(d, 1, 8192);
            (void)cu.cuMemFree_v2(d);
        }
    }
    return NULL;
}

/* What a fork child of this process gets: 0 when every call is
 * CUDA_ERROR_NOT_INITIALIZED and the control API works (or, with
 * LENIENT_FORK, when the driver works). */
static int fork_child_checks(bool lenient) {
    CUdeviceptr d = 0;
    int n = 0, v = 0;
    const char *s = NULL;
    CUcontext c = NULL;
    if (lenient)
        return cu.cuMemAlloc_v2(&d, 4096) == CUDA_SUCCESS &&
                       cu.cuMemsetD8_v2(d, 7, 4096) == CUDA_SUCCESS && all_bytes(d, 7, 4096) &&
                       cu.cuMemFree_v2(d) == CUDA_SUCCESS
                   ? 0
                   : 1;
    const uint64_t allocs = ctl.call_count("cuMemAlloc_v2");
    if (cu.cuMemAlloc_v2(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED) return 2;
    if (cu.cuDeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED) return 3;
    if (cu.cuCtxGetCurrent(&c) != CUDA_ERROR_NOT_INITIALIZED) return 4;
    if (cu.cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) return 5; /* for good */
    if (cu.cuDeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED) return 6;
    if (cu.cuGetErrorName(CUDA_SUCCESS, &s) != CUDA_ERROR_NOT_INITIALIZED) return 7;
    if (cu.cuDriverGetVersion(&v) != CUDA_ERROR_NOT_INITIALIZED) return 8;
    if (cu.cuStreamSynchronize(NULL) != CUDA_ERROR_NOT_INITIALIZED) return 9;
    CUstream sx = NULL;
    CUevent ev = NULL;
    if (cu.cuStreamCreate(&sx, 0) != CUDA_ERROR_NOT_INITIALIZED || sx) return 13;
    if (cu.cuEventCreate(&ev, 0) != CUDA_ERROR_NOT_INITIALIZED || ev) return 14;
    if (cu.cuEventQuery(NULL) != CUDA_ERROR_NOT_INITIALIZED) return 15;
    if (cu.cuMemsetD8Async(0, 0, 0, NULL) != CUDA_ERROR_NOT_INITIALIZED) return 16;
    if (d != 0 || n != 0 || c != NULL || s != NULL) return 10;
    /* the control API works */
    if (ctl.call_count("cuMemAlloc_v2") != allocs + 1) return 11;
    hm_cuda_test_stats_t st;
    ctl.get_stats(&st);
    if (ctl.va_base() == 0) return 12;
    return 0;
}

static void test_fork_busy(void) {
    hm_test_set_context("fork while busy");
    set_current(pc[0]);
    const unsigned lenient = ctl.get_lenient();
    busy_stop = 0;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, busy, NULL) == 0);
    for (int i = 0; i < 20; i++) {
        /* odd rounds with LENIENT_FORK: the child keeps a working driver */
        const bool len = i % 2;
        ctl.set_lenient(len ? lenient | HM_CUDA_TEST_LENIENT_FORK : lenient & ~HM_CUDA_TEST_LENIENT_FORK);
        CUdeviceptr q = 0;
        CU_OK(cu.cuMemAlloc_v2(&q, 4096));
        CU_OK(cu.cuMemsetD8_v2(q, 0x10, 4096)); /* queued here: never run by the child */
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) _exit(fork_child_checks(len));
        int st = 0;
        REQUIRE(waitpid(pid, &st, 0) == pid);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child %d (%s): status 0x%x", i,
                  len ? "lenient" : "strict", st);
        CHECK(all_bytes(q, 0x10, 4096)); /* the parent keeps working */
        CU_OK(cu.cuMemFree_v2(q));
    }
    ctl.set_lenient(lenient);
    busy_stop = 1;
    pthread_join(t, NULL);
}

/* ---- the end of a primary context, and the end ---- */

static void test_primary_reset(void) {
    hm_test_set_context("primary reset");
    set_current(pc[0]);
    const hm_cuda_test_stats_t s0 = stats();
    CUdeviceptr d = 0;
    void *h = NULL;
    CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_REQUIRE_OK(cu.cuMemAllocHost_v2(&h, 4096));
    const unsigned refs = s0.primary_refs[0];
    for (unsigned i = 0; i < refs; i++) CU_OK(cu.cuDevicePrimaryCtxRelease_v2(0));
    const hm_cuda_test_stats_t s1 = stats();
    CHECK_EQ(s1.primary_refs[0], 0);
    CHECK_EQ(s1.leaks, s0.leaks + 2);
    CHECK_EQ(s1.live_allocs, s0.live_allocs);
    CU_EXPECT(cu.cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
    /* still current, but reset: the calls that need it refuse */
    CHECK(get_current() == pc[0]);
    expect_no_context(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CU_OK(cu.cuCtxSetCurrent(pc[0])); /* may be made current */
    /* retained again: the same handle, working */
    for (unsigned i = 0; i < refs; i++) {
        CUcontext c = NULL;
        CU_OK(cu.cuDevicePrimaryCtxRetain(&c, 0));
        CHECK(c == pc[0]);
    }
    CU_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_OK(cu.cuMemFree_v2(d));
}

static void test_end(void) {
    hm_test_set_context("end");
    for (int i = 0; i < ndev; i++) CU_OK(cu.cuDevicePrimaryCtxRelease_v2(i));
    CU_OK(cu.cuCtxSetCurrent(NULL));
    CHECK(get_current() == NULL);
    const hm_cuda_test_stats_t s = stats();
    CHECK_EQ(s.live_allocs, 0);
    CHECK_EQ(s.live_ipc_mappings, 0);
    CHECK_EQ(s.live_ipc_refs, 0);
    CHECK_EQ(s.live_contexts, 0);
    CHECK_EQ(s.live_streams, 0);
    CHECK_EQ(s.live_events, 0);
    for (int i = 0; i < HM_CUDA_TEST_MAX_DEVICES; i++) {
        CHECK_EQ(s.primary_refs[i], 0);
        CHECK_EQ(s.device_used[i], 0);
    }
    printf("calls since the last reset: %llu\n", (unsigned long long)s.calls);
}

/* ---- teardown ---- */

/* Registered before cuInit, so it runs after the driver's exit handler. */
static void exit_probe(void) {
    int n = 0;
    const CUresult r = cu.cuDeviceGetCount(&n);
    const unsigned lenient = ctl.get_lenient();
    const CUresult want = lenient & HM_CUDA_TEST_LENIENT_EXIT ? CUDA_SUCCESS : CUDA_ERROR_DEINITIALIZED;
    _exit(r == want ? 0 : 10);
}

/* Mode "atexit": the driver at exit, as an atexit handler sees it. */
static int at_exit_mode(void) {
    CUcontext c = NULL;
    CUdeviceptr d = 0;
    if (atexit(exit_probe) != 0) return 1;
    if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS ||
        cu.cuCtxSetCurrent(c) != CUDA_SUCCESS || cu.cuMemAlloc_v2(&d, 4096) != CUDA_SUCCESS ||
        cu.cuMemsetD8_v2(d, 1, 4096) != CUDA_SUCCESS)
        return 2;
    return 0; /* exit() runs the handlers */
}

/* Runs `mode` with the environment variable `name` set to `value` (NULL:
 * unset); its exit status. */
static int run_mode(const char *mode, const char *name, const char *value) {
    const char *old = getenv(name);
    char *saved = old ? strdup(old) : NULL;
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    int in, out;
    pid_t pid = spawn(mode, &in, &out);
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
    close(in);
    close(out);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void test_teardown(void) {
    hm_test_set_context("teardown");
    CHECK_EQ(run_mode("atexit", "HM_CUDA_TEST_LENIENT", NULL), 0);
    CHECK_EQ(run_mode("atexit", "HM_CUDA_TEST_LENIENT", "exit"), 0);
    CUcontext c = NULL;
    CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&c, 0));
    set_current(c);
    CUdeviceptr d = 0;
    CU_OK(cu.cuMemAlloc_v2(&d, 4096));
    CU_OK(cu.cuMemsetD8_v2(d, 1, 4096));
    CUstream st = NULL;
    CUevent ev = NULL;
    CU_OK(cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuMemsetD8Async(d, 2, 4096, st));
    CU_OK(cu.cuEventRecord(ev, st));
    CU_EXPECT(cu.cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    CHECK_EQ(stats().pending_ops, 2);
    const uint64_t inits = ctl.call_count("cuInit");
    ctl.teardown();
    CHECK_EQ(stats().pending_ops, 0); /* the queued work ran */
    CU_EXPECT(cu.cuEventQuery(ev), CUDA_ERROR_DEINITIALIZED);
    CU_EXPECT(cu.cuStreamQuery(st), CUDA_ERROR_DEINITIALIZED);
    CU_EXPECT(cu.cuStreamDestroy_v2(st), CUDA_ERROR_DEINITIALIZED);
    int n = 0, v = 0;
    const char *s = NULL;
    CU_EXPECT(cu.cuInit(0), CUDA_ERROR_DEINITIALIZED);
    CU_EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_DEINITIALIZED);
    CU_EXPECT(cu.cuMemFree_v2(d), CUDA_ERROR_DEINITIALIZED);
    CU_EXPECT(cu.cuDriverGetVersion(&v), CUDA_ERROR_DEINITIALIZED);
    CU_EXPECT(cu.cuGetErrorName(CUDA_SUCCESS, &s), CUDA_ERROR_DEINITIALIZED);
    CHECK_EQ(ctl.call_count("cuInit"), inits + 1); /* the control API works */
    CHECK(ctl.va_base() != 0);
}

/* ---- placement in the reservation (a fresh process) ---- */

/* Mappings of the driver's memfds in this process. */
static int memfd_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    REQUIRE(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "memfd:hm_cuda_test")) n++;
    fclose(f);
    return n;
}

static bool reserved(CUdeviceptr p) {
    void *m = mmap(P(p), 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED) return errno == EEXIST;
    munmap(m, 4096);
    return false;
}

/* Mode "placement": where allocations go, in a process with nothing
 * allocated yet. */
static int placement(void) {
    hm_test_set_context("placement");
    CU_REQUIRE_OK(cu.cuInit(0));
    const CUdeviceptr base = ctl.va_base();
    const char *want = getenv("HM_CUDA_TEST_VA_BASE");
    CHECK(base == (want ? strtoull(want, NULL, 0) : 0x7e8000000000ull));
    CHECK(reserved(base) && reserved(base + HM_CUDA_TEST_VA_SIZE - 4096));
    CUcontext c = NULL;
    CU_REQUIRE_OK(cu.cuDevicePrimaryCtxRetain(&c, 0));
    set_current(c);
    CUdeviceptr d[6] = {0};
    if (ctl.get_lenient() == (HM_CUDA_TEST_LENIENT_ALIGN | HM_CUDA_TEST_LENIENT_NO_REUSE)) {
        /* from HM_CUDA_TEST_LENIENT=align,no-reuse: 2 MiB units, no reuse */
        CU_OK(cu.cuMemAlloc_v2(&d[0], 1));
        CU_OK(cu.cuMemAlloc_v2(&d[1], 1));
        CHECK(d[0] == base && d[1] == base + GRAN);
        CU_OK(cu.cuMemFree_v2(d[0]));
        CU_OK(cu.cuMemAlloc_v2(&d[2], 1));
        CHECK(d[2] == base + 2 * GRAN);
        CHECK_EQ(stats().device_used[0], 2 * GRAN);
        CU_OK(cu.cuMemFree_v2(d[1]));
        CU_OK(cu.cuMemFree_v2(d[2]));
        return hm_test_finish();
    }
    CHECK_EQ(ctl.get_lenient(), 0);
    const int maps0 = memfd_mappings();
    /* packed at 4 KiB below 2 MiB, 2 MiB aligned from 2 MiB on */
    const size_t sizes[6] = {1, 1, 4097, 2 * MIB, 100, 3 * MIB};
    const CUdeviceptr at[6] = {base, base + 4 * KIB, base + 8 * KIB, base + 2 * MIB,
                               base + 16 * KIB, base + 4 * MIB};
    for (int i = 0; i < 6; i++) {
        CU_REQUIRE_OK(cu.cuMemAlloc_v2(&d[i], sizes[i]));
        CHECK_MSG(d[i] == at[i], "allocation %d (%zu bytes) at base + %#llx, expected + %#llx", i,
                  sizes[i], d[i] - base, at[i] - base);
    }
    CHECK_EQ(stats().device_used[0], 4 * KIB + 4 * KIB + 8 * KIB + 2 * MIB + 4 * KIB + 4 * MIB);
    CHECK_EQ(memfd_mappings(), maps0 + 12); /* each: its place and the alias */
    /* freed: reserved again, the most recently freed range first */
    CU_OK(cu.cuMemFree_v2(d[1]));
    CHECK_EQ(memfd_mappings(), maps0 + 10);
    CHECK(reserved(at[1]));
    CU_OK(cu.cuMemAlloc_v2(&d[1], 4096));
    CHECK(d[1] == at[1]);
    CU_OK(cu.cuMemFree_v2(d[0]));
    CU_OK(cu.cuMemFree_v2(d[4]));
    CUdeviceptr x = 0, y = 0;
    CU_OK(cu.cuMemAlloc_v2(&x, 1));
    CU_OK(cu.cuMemAlloc_v2(&y, 1));
    CHECK(x == at[4] && y == at[0]);
    CU_OK(cu.cuMemFree_v2(d[5]));
    CU_OK(cu.cuMemAlloc_v2(&d[5], 3 * MIB));
    CHECK(d[5] == at[5]);
    CU_OK(cu.cuMemFree_v2(d[3]));
    CU_OK(cu.cuMemAlloc_v2(&d[3], 2 * MIB));
    CHECK(d[3] == at[3]);
    CUdeviceptr as = 0; /* async memory too */
    CU_OK(cu.cuMemFree_v2(d[3]));
    CU_OK(cu.cuMemAllocAsync(&as, 2 * MIB, NULL));
    CHECK(as == at[3]);
    CU_OK(cu.cuMemFreeAsync(as, NULL));
    /* LENIENT_ALIGN and LENIENT_NO_REUSE by the control call */
    ctl.set_lenient(HM_CUDA_TEST_LENIENT_ALIGN);
    CU_OK(cu.cuMemAlloc_v2(&d[3], 1));
    CHECK(d[3] % GRAN == 0);
    CU_OK(cu.cuMemFree_v2(d[3]));
    ctl.set_lenient(HM_CUDA_TEST_LENIENT_NO_REUSE);
    CU_OK(cu.cuMemAlloc_v2(&d[3], 4096));
    CHECK(d[3] != at[3]);
    CU_OK(cu.cuMemFree_v2(d[3]));
    ctl.set_lenient(0);
    CU_OK(cu.cuMemFree_v2(x));
    CU_OK(cu.cuMemFree_v2(y));
    CU_OK(cu.cuMemFree_v2(d[1]));
    CU_OK(cu.cuMemFree_v2(d[2]));
    CU_OK(cu.cuMemFree_v2(d[5]));
    CHECK_EQ(stats().device_used[0], 0);
    CHECK_EQ(memfd_mappings(), maps0);
    CHECK(reserved(base));
    CU_OK(cu.cuDevicePrimaryCtxRelease_v2(0));
    return hm_test_finish();
}

static void test_placement(void) {
    hm_test_set_context("placement");
    CHECK_EQ(run_mode("placement", "HM_CUDA_TEST_LENIENT", NULL), 0);
    CHECK_EQ(run_mode("placement", "HM_CUDA_TEST_LENIENT", "align,bogus,no-reuse"), 0);
    CHECK_EQ(run_mode("placement", "HM_CUDA_TEST_VA_BASE", "0x7e9000000000"), 0);
}

/* ---- other modes ---- */

static int no_device(void) {
    hm_test_set_context("no device");
    load();
    control();
    int v = 0, n = -1;
    CU_OK(cu.cuDriverGetVersion(&v));
    CU_EXPECT(cu.cuInit(0), CUDA_ERROR_NO_DEVICE);
    CU_EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CU_EXPECT(cu.cuInit(0), CUDA_ERROR_NO_DEVICE);
    CHECK_EQ(n, -1);
    return hm_test_finish();
}

static int soname(void) {
    hm_test_set_context("soname");
    /* LD_LIBRARY_PATH points at the driver's directory: the plain name
     * finds this driver, before any real one. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) HM_TEST_SKIP("dlopen(libcuda.so.1): %s", dlerror());
    CHECK(dlsym(h, "hm_cuda_test_reset") != NULL);
    void *direct = dlopen(HM_CUDA_TEST_DRIVER_PATH, RTLD_NOW | RTLD_NOLOAD);
    CHECK(direct == h); /* the same object */
    if (direct) dlclose(direct);
    resolve_all(h);
    CU_OK(cu.cuInit(0));
    dlclose(h);
    return hm_test_finish();
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "ipc-importer") == 0) {
        load();
        control();
        return ipc_importer(atoi(argv[2]), atoi(argv[3])) ? 1 : 0;
    }
    if (argc == 4 && strcmp(argv[1], "ipc-exporter") == 0) {
        load();
        control();
        return ipc_exporter(atoi(argv[2]), atoi(argv[3]));
    }
    if (argc == 3 && strcmp(argv[1], "pool-importer") == 0) {
        load();
        control();
        return pool_importer(atoi(argv[2])) ? 1 : 0;
    }
    if (argc == 3 && strcmp(argv[1], "vmm-importer") == 0) {
        load();
        control();
        return vmm_importer(atoi(argv[2])) ? 1 : 0;
    }
    if (argc == 4 && strcmp(argv[1], "placement") == 0) {
        load();
        control();
        return placement();
    }
    if (argc == 4 && strcmp(argv[1], "atexit") == 0) {
        load();
        control();
        return at_exit_mode();
    }
    if (argc == 2 && strcmp(argv[1], "no-device") == 0) return no_device();
    if (argc == 2 && strcmp(argv[1], "soname") == 0) return soname();
    load();
    control();
    test_symbols();
    test_before_init();
    size_t total = 0;
    CU_REQUIRE_OK(cu.cuDeviceTotalMem_v2(&total, 0));
    limit = total;
    if (!getenv("HM_CUDA_TEST_DEVICE_MEM")) CHECK_EQ(limit, 256 * MIB);
    printf("driver: %d devices, %llu MiB each, strict IPC %s\n", ndev,
           (unsigned long long)(limit / MIB), strict_env ? "on" : "off");
    test_errors();
    test_devices();
    test_proc_address();
    test_contexts();
    test_alloc();
    test_attributes();
    test_limits();
    test_faults();
    test_placement();
    test_copies();
    test_queue();
    test_write_combined();
    test_sticky();
    test_async();
    test_streams();
    test_ipc();
    test_ipc_exporter_gone();
    test_vmm();
    test_pools();
    test_old_names();
    test_injection();
    test_counts();
    test_threads();
    test_fork_busy();
    test_primary_reset();
    test_end();
    test_teardown();
    return hm_test_finish();
}
