/* hetmem tests — the Level Zero test driver (libze_test.so.1) through Debian's
 * real loader: enumeration, properties, contexts, allocations and their
 * limits, faults on device memory, fill/copy on immediate and regular
 * command lists, events, IPC between two processes (the fd moved with
 * SCM_RIGHTS), failure injection, threads, and that everything is freed.
 * Every call goes through the loader's exported functions; the driver's
 * control API is reached by dlopen(RTLD_NOLOAD) of the very file the loader
 * loaded. Run plain, under the loader's validation layer and with the
 * loader's intercept forced (CTest sets the environment); exit 77 when the
 * loader is missing.
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "ze_test_driver.h"

#include <level_zero/ze_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
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

#ifndef HM_ZE_TEST_DRIVER_PATH
#error "HM_ZE_TEST_DRIVER_PATH: the absolute path of libze_test.so.1"
#endif

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ---- the loader's entry points, resolved by name ---- */

#define ZE_FNS(X)                                                                     \
    X(zeInit) X(zeDriverGet) X(zeDriverGetApiVersion) X(zeDriverGetProperties)        \
    X(zeDriverGetIpcProperties) X(zeDriverGetExtensionProperties) X(zeDeviceGet)      \
    X(zeDeviceGetProperties) X(zeDeviceGetSubDevices) X(zeDeviceGetMemoryProperties)  \
    X(zeDeviceGetCommandQueueGroupProperties) X(zeDeviceGetComputeProperties)         \
    X(zeDeviceCanAccessPeer) X(zeContextCreate) X(zeContextDestroy)                   \
    X(zeContextGetStatus) X(zeMemAllocDevice) X(zeMemAllocHost) X(zeMemAllocShared)   \
    X(zeMemFree) X(zeMemFreeExt) X(zeMemGetAllocProperties) X(zeMemGetAddressRange)   \
    X(zeMemGetIpcHandle) X(zeMemOpenIpcHandle) X(zeMemCloseIpcHandle)                 \
    X(zeCommandListCreateImmediate) X(zeCommandListCreate) X(zeCommandListClose)      \
    X(zeCommandListReset) X(zeCommandListDestroy) X(zeCommandListAppendMemoryFill)    \
    X(zeCommandListAppendMemoryCopy) X(zeCommandListAppendBarrier)                    \
    X(zeCommandQueueCreate) X(zeCommandQueueDestroy)                                  \
    X(zeCommandQueueExecuteCommandLists) X(zeCommandQueueSynchronize)                 \
    X(zeEventPoolCreate) X(zeEventPoolDestroy) X(zeEventCreate) X(zeEventDestroy)     \
    X(zeEventHostSynchronize) X(zeEventQueryStatus) X(zeEventHostReset)               \
    X(zeEventHostSignal) X(zeFenceCreate) X(zeCommandListAppendSignalEvent)            \
    X(zeCommandListAppendWaitOnEvents)

static struct {
#define X(name) __typeof__(name) *name;
    ZE_FNS(X)
#undef X
} ze;

/* ---- the driver's control API ---- */

static struct {
    hm_ze_test_reset_fn reset;
    hm_ze_test_get_stats_fn get_stats;
    hm_ze_test_call_count_fn call_count;
    hm_ze_test_fail_next_fn fail_next;
    hm_ze_test_set_mem_limit_fn set_mem_limit;
    hm_ze_test_set_option_fn set_option;
    hm_ze_test_run_queued_fn run_queued;
} ctl;

#define ZE_EXPECT(expr, want)                                                          \
    do {                                                                               \
        ze_result_t r_ = (expr), w_ = (want);                                          \
        hm_test_record(r_ == w_, __FILE__, __LINE__, "%s -> 0x%x, expected 0x%x (%s)", \
                       #expr, (unsigned)r_, (unsigned)w_, #want);                      \
    } while (0)
#define ZE_OK(expr) ZE_EXPECT(expr, ZE_RESULT_SUCCESS)
#define ZE_REQUIRE_OK(expr)                                                            \
    do {                                                                               \
        ze_result_t r_ = (expr);                                                       \
        hm_test_record(r_ == ZE_RESULT_SUCCESS, __FILE__, __LINE__, "REQUIRE %s -> 0x%x", \
                       #expr, (unsigned)r_);                                           \
        if (r_ != ZE_RESULT_SUCCESS) {                                                 \
            hm_test_finish();                                                          \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* ---- state ---- */

static bool validation; /* ZE_ENABLE_VALIDATION_LAYER=1 */
static bool intercept;  /* ZE_ENABLE_LOADER_INTERCEPT=1: the loader wraps handles and
                           reads through them, so bad handles cannot be tried */
static ze_driver_handle_t drv;
static ze_device_handle_t devs[HM_ZE_TEST_MAX_DEVICES];
static uint32_t ndev;
static uint64_t limit; /* the driver's limit at start */
static ze_context_handle_t ctx;
static ze_command_list_handle_t imm[HM_ZE_TEST_MAX_DEVICES];

static const ze_device_mem_alloc_desc_t ddesc = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0, 0};
static const ze_host_mem_alloc_desc_t hdesc = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, NULL, 0};

/* What a call to a slot the driver left NULL returns: the loader's exported
 * function and the validation layer say UNSUPPORTED_FEATURE when they see
 * the NULL; with the intercept on they see the intercept's function, which
 * says UNINITIALIZED. */
static ze_result_t empty_slot(void) {
    return intercept ? ZE_RESULT_ERROR_UNINITIALIZED : ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
}

static hm_ze_test_stats_t stats(void) {
    hm_ze_test_stats_t s;
    ctl.get_stats(&s);
    return s;
}

static bool env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

static ze_result_t alloc_dev(ze_context_handle_t c, size_t size, size_t align, uint32_t d,
                             void **p) {
    return ze.zeMemAllocDevice(c, &ddesc, size, align, devs[d], p);
}

static ze_result_t alloc_host(ze_context_handle_t c, size_t size, size_t align, void **p) {
    return ze.zeMemAllocHost(c, &hdesc, size, align, p);
}

static ze_result_t alloc_shared(ze_context_handle_t c, size_t size, size_t align, uint32_t d,
                                void **p) {
    return ze.zeMemAllocShared(c, &ddesc, &hdesc, size, align, devs[d], p);
}

static ze_result_t fill(ze_command_list_handle_t l, void *p, const void *pat, size_t psize,
                        size_t size) {
    return ze.zeCommandListAppendMemoryFill(l, p, pat, psize, size, NULL, 0, NULL);
}

static ze_result_t copy(ze_command_list_handle_t l, void *dst, const void *src, size_t size) {
    return ze.zeCommandListAppendMemoryCopy(l, dst, src, size, NULL, 0, NULL);
}

static ze_result_t fill_byte(ze_command_list_handle_t l, void *p, uint8_t v, size_t size) {
    return fill(l, p, &v, 1, size);
}

/* All `size` bytes of driver memory p (read through a copy) equal v. */
static bool all_bytes(ze_command_list_handle_t l, const void *p, uint8_t v, size_t size) {
    uint8_t *h = malloc(size);
    REQUIRE(h);
    bool ok = copy(l, h, p, size) == ZE_RESULT_SUCCESS;
    for (size_t i = 0; ok && i < size; i++) ok = h[i] == v;
    free(h);
    return ok;
}

/* ---- set-up ---- */

static void load(void) {
    /* Before the loader is loaded: it reads the variable at zeInit, but
     * nothing guarantees that it does not read it earlier. */
    setenv("ZE_ENABLE_ALT_DRIVERS", HM_ZE_TEST_DRIVER_PATH, 1);
    void *h = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) HM_TEST_SKIP("no Level Zero loader: %s", dlerror());
#define X(name)                                                         \
    *(void **)&ze.name = dlsym(h, #name);                               \
    if (!ze.name) HM_TEST_SKIP("the loader has no %s", #name);
    ZE_FNS(X)
#undef X
    validation = env_is("ZE_ENABLE_VALIDATION_LAYER", "1");
    intercept = env_is("ZE_ENABLE_LOADER_INTERCEPT", "1");
    printf("loader: validation layer %s, intercept %s\n", validation ? "on" : "off",
           intercept ? "forced" : "default");
}

static void control(void) {
    void *h = dlopen(HM_ZE_TEST_DRIVER_PATH, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h); /* the loader loaded this very file */
    *(void **)&ctl.reset = dlsym(h, "hm_ze_test_reset");
    *(void **)&ctl.get_stats = dlsym(h, "hm_ze_test_get_stats");
    *(void **)&ctl.call_count = dlsym(h, "hm_ze_test_call_count");
    *(void **)&ctl.fail_next = dlsym(h, "hm_ze_test_fail_next");
    *(void **)&ctl.set_mem_limit = dlsym(h, "hm_ze_test_set_mem_limit");
    *(void **)&ctl.set_option = dlsym(h, "hm_ze_test_set_option");
    *(void **)&ctl.run_queued = dlsym(h, "hm_ze_test_run_queued");
    REQUIRE(ctl.reset && ctl.get_stats && ctl.call_count && ctl.fail_next && ctl.set_mem_limit &&
            ctl.set_option && ctl.run_queued);
    CHECK_EQ(ctl.set_option("no_such_option", 1), -1);
    /* Only the getters and the control API are exported. */
    CHECK(dlsym(h, "d_init") == NULL);
    CHECK(dlsym(h, "zeInit") == NULL);
    CHECK(dlsym(h, "zeGetMemProcAddrTable") != NULL);
    dlclose(h); /* drops the reference NOLOAD took; the loader's stays */
}

static void test_init(void) {
    hm_test_set_context("init");
    uint32_t n0 = 0;
    ze_result_t r = ze.zeDriverGet(&n0, NULL);
    printf("zeDriverGet before zeInit: 0x%x\n", (unsigned)r);
    CHECK(r != ZE_RESULT_SUCCESS);
    ZE_REQUIRE_OK(ze.zeInit(0));
    ZE_OK(ze.zeInit(0));
    ZE_OK(ze.zeInit(ZE_INIT_FLAG_GPU_ONLY));
    control();
    uint64_t n = ctl.call_count("zeInit");
    printf("the driver's zeInit ran %llu times for three zeInit calls\n", (unsigned long long)n);
    CHECK(n >= 1);
    CHECK(ctl.call_count("zeNoSuchCall") == UINT64_MAX);
}

static void test_enumeration(void) {
    hm_test_set_context("enumeration");
    uint32_t n = 0;
    ZE_REQUIRE_OK(ze.zeDriverGet(&n, NULL));
    CHECK_EQ(n, 1);
    n = 1;
    ZE_REQUIRE_OK(ze.zeDriverGet(&n, &drv));
    REQUIRE(drv != NULL);

    ze_api_version_t v = 0;
    ZE_OK(ze.zeDriverGetApiVersion(drv, &v));
    CHECK_EQ(ZE_MAJOR_VERSION(v), 1);
    CHECK(ZE_MINOR_VERSION(v) >= 4);

    ze_driver_memory_free_ext_properties_t fp = {ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES,
                                                 NULL, 0};
    ze_driver_properties_t dp = {ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES, &fp, {{0}}, 0};
    ZE_OK(ze.zeDriverGetProperties(drv, &dp));
    CHECK(dp.driverVersion != 0);
    CHECK(dp.uuid.id[0] != 0);
    CHECK_EQ(fp.freePolicies, ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE |
                                  ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE);

    ze_driver_ipc_properties_t ip = {ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES, NULL, 0};
    ZE_OK(ze.zeDriverGetIpcProperties(drv, &ip));
    CHECK(ip.flags & ZE_IPC_PROPERTY_FLAG_MEMORY);

    n = 0;
    ZE_OK(ze.zeDriverGetExtensionProperties(drv, &n, NULL));
    CHECK_EQ(n, 1);
    ze_driver_extension_properties_t ext[2];
    memset(ext, 0, sizeof ext);
    n = 2;
    ZE_OK(ze.zeDriverGetExtensionProperties(drv, &n, ext));
    CHECK_EQ(n, 1);
    CHECK(strcmp(ext[0].name, ZE_MEMORY_FREE_POLICIES_EXT_NAME) == 0);

    const char *env = getenv("HM_ZE_TEST_DEVICES");
    uint32_t want = env ? (uint32_t)atoi(env) : 2;
    n = 0;
    ZE_REQUIRE_OK(ze.zeDeviceGet(drv, &n, NULL));
    CHECK_EQ(n, want);
    REQUIRE(n >= 1 && n <= HM_ZE_TEST_MAX_DEVICES);
    ndev = HM_ZE_TEST_MAX_DEVICES; /* more than there are: set to the count */
    ZE_REQUIRE_OK(ze.zeDeviceGet(drv, &ndev, devs));
    CHECK_EQ(ndev, n);
    printf("%u devices\n", ndev);

    ze_device_properties_t props[HM_ZE_TEST_MAX_DEVICES];
    for (uint32_t i = 0; i < ndev; i++) {
        ze_device_properties_t *p = &props[i];
        memset(p, 0, sizeof *p);
        p->stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
        ZE_OK(ze.zeDeviceGetProperties(devs[i], p));
        CHECK_EQ(p->type, ZE_DEVICE_TYPE_GPU);
        CHECK_EQ(p->vendorId, 0x8086);
        CHECK(p->deviceId != 0);
        CHECK(p->name[0] != '\0');
        if (i == 0) limit = 2 * p->maxMemAllocSize; /* maxMemAllocSize: half the memory */
        CHECK_EQ(p->maxMemAllocSize, limit / 2);
        for (uint32_t k = 0; k < i; k++)
            CHECK_MSG(memcmp(p->uuid.id, props[k].uuid.id, ZE_MAX_DEVICE_UUID_SIZE) != 0,
                      "devices %u and %u have the same UUID", k, i);

        ze_device_memory_properties_t mp[2];
        memset(mp, 0, sizeof mp);
        mp[0].stype = mp[1].stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
        uint32_t m = 0;
        ZE_OK(ze.zeDeviceGetMemoryProperties(devs[i], &m, NULL));
        CHECK_EQ(m, 1);
        m = 2;
        ZE_OK(ze.zeDeviceGetMemoryProperties(devs[i], &m, mp));
        CHECK_EQ(m, 1);
        CHECK_EQ(mp[0].totalSize, limit);

        m = 5;
        ze_device_handle_t sub[1];
        ZE_OK(ze.zeDeviceGetSubDevices(devs[i], &m, sub));
        CHECK_EQ(m, 0);

        ze_command_queue_group_properties_t qg = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES,
                                                  NULL, 0, 0, 0};
        m = 1;
        ZE_OK(ze.zeDeviceGetCommandQueueGroupProperties(devs[i], &m, &qg));
        CHECK_EQ(m, 1);
        CHECK_EQ(qg.maxMemoryFillPatternSize, 128);
        CHECK(qg.flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY);

        ze_bool_t can = 0;
        ZE_OK(ze.zeDeviceCanAccessPeer(devs[i], devs[0], &can));
        CHECK(can);
    }
    const char *mem = getenv("HM_ZE_TEST_DEVICE_MEM");
    if (!mem) CHECK_EQ(limit, 256 * MIB);

    /* A slot the driver leaves empty: the loader (or its layer) answers. */
    ze_device_compute_properties_t cp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES};
    ZE_EXPECT(ze.zeDeviceGetComputeProperties(devs[0], &cp), empty_slot());

    if (!intercept) {
        ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
        ZE_EXPECT(ze.zeDeviceGetProperties(NULL, &p), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
        ZE_EXPECT(ze.zeDeviceGetProperties(devs[0], NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
        uint32_t c = 0;
        ZE_EXPECT(ze.zeDeviceGet(NULL, &c, NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    }
}

static void test_contexts(void) {
    hm_test_set_context("contexts");
    hm_ze_test_stats_t s0 = stats();
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t c = NULL;
    ZE_REQUIRE_OK(ze.zeContextCreate(drv, &cd, &c));
    ZE_OK(ze.zeContextGetStatus(c));
    CHECK_EQ(stats().live_contexts, s0.live_contexts + 1);
    CHECK_EQ(stats().context_create, s0.context_create + 1);
    ZE_OK(ze.zeContextDestroy(c));
    CHECK_EQ(stats().live_contexts, s0.live_contexts);

    ZE_EXPECT(ze.zeContextCreate(drv, NULL, &c), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ZE_EXPECT(ze.zeContextCreate(drv, &cd, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (!intercept) ZE_EXPECT(ze.zeContextCreate(NULL, &cd, &c), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    ZE_REQUIRE_OK(ze.zeContextCreate(drv, &cd, &ctx));
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    for (uint32_t i = 0; i < ndev; i++) ZE_REQUIRE_OK(ze.zeCommandListCreateImmediate(ctx, devs[i], &qd, &imm[i]));
    qd.ordinal = 1; /* one queue group */
    ze_command_list_handle_t l = NULL;
    ZE_EXPECT(ze.zeCommandListCreateImmediate(ctx, devs[0], &qd, &l), ZE_RESULT_ERROR_INVALID_ARGUMENT);
}

/* Handles the driver never handed out: only without the loader's intercept
 * (which reads through them). */
static void test_foreign_handles(void) {
    if (intercept) return;
    hm_test_set_context("foreign handles");
    static char fake[256];
    void *p = NULL;
    uint64_t n0 = ctl.call_count("zeMemAllocDevice");
    ze_result_t r = alloc_dev((ze_context_handle_t)(void *)fake, 4096, 0, 0, &p);
    /* The driver answers INVALID_ARGUMENT; the validation layer's handle
     * lifetime checker answers for handles it never saw. */
    printf("foreign context handle: 0x%x (%s the driver)\n", (unsigned)r,
           ctl.call_count("zeMemAllocDevice") > n0 ? "from" : "not from");
    CHECK(r == ZE_RESULT_ERROR_INVALID_ARGUMENT || (validation && r == ZE_RESULT_ERROR_INVALID_NULL_HANDLE));
    CHECK(p == NULL);
    ze_device_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    r = ze.zeDeviceGetProperties((ze_device_handle_t)(void *)fake, &dp);
    printf("foreign device handle: 0x%x\n", (unsigned)r);
    CHECK(r == ZE_RESULT_ERROR_INVALID_ARGUMENT || (validation && r == ZE_RESULT_ERROR_INVALID_NULL_HANDLE));
    r = fill_byte((ze_command_list_handle_t)(void *)fake, fake, 1, 1);
    printf("foreign command list handle: 0x%x\n", (unsigned)r);
    CHECK(r == ZE_RESULT_ERROR_INVALID_ARGUMENT || (validation && r == ZE_RESULT_ERROR_INVALID_NULL_HANDLE));
    CHECK_EQ(fake[0], 0);
    ZE_EXPECT(alloc_dev(NULL, 4096, 0, 0, &p), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    ZE_EXPECT(ze.zeMemAllocDevice(ctx, &ddesc, 4096, 0, NULL, &p), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
}

/* ---- allocations ---- */

#define MAX_IDS 4096
static uint64_t ids[MAX_IDS];
static size_t nids;

static void note_id(uint64_t id) {
    CHECK(id != 0);
    for (size_t i = 0; i < nids; i++)
        if (ids[i] == id) {
            CHECK_MSG(0, "allocation id %llu handed out twice", (unsigned long long)id);
            return;
        }
    if (nids < MAX_IDS) ids[nids++] = id;
}

static void check_alloc(void *p, size_t size, ze_memory_type_t type, ze_device_handle_t dev,
                        size_t page) {
    ze_memory_allocation_properties_t ap = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t d = (ze_device_handle_t)(uintptr_t)1;
    ZE_OK(ze.zeMemGetAllocProperties(ctx, p, &ap, &d));
    CHECK_EQ(ap.type, type);
    CHECK_EQ(ap.pageSize, page);
    CHECK(d == dev); /* NULL for host memory, also through the intercept */
    note_id(ap.id);
    /* an interior pointer: the same allocation */
    const char *in = (const char *)p + size / 2;
    ze_memory_allocation_properties_t ai = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ZE_OK(ze.zeMemGetAllocProperties(ctx, in, &ai, NULL));
    CHECK_EQ(ai.id, ap.id);
    CHECK_EQ(ai.type, type);
    void *base = NULL;
    size_t len = 0;
    ZE_OK(ze.zeMemGetAddressRange(ctx, in, &base, &len));
    CHECK(base == p);
    CHECK_EQ(len, size);
    ZE_OK(ze.zeMemGetAddressRange(ctx, p, NULL, &len));
    ZE_OK(ze.zeMemGetAddressRange(ctx, p, &base, NULL));
    /* one past the end: not this allocation */
    ze_memory_allocation_properties_t ae = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ZE_OK(ze.zeMemGetAllocProperties(ctx, (const char *)p + size, &ae, NULL));
    CHECK(ae.id != ap.id);
}

static void test_alloc(void) {
    hm_test_set_context("alloc");
    hm_ze_test_stats_t s0 = stats();
    static const size_t aligns[] = {0, 64, 64 * KIB, 2 * MIB};
    static const size_t sizes[] = {1, 100000};
    for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++)
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
            size_t al = aligns[a], sz = sizes[z];
            for (uint32_t d = 0; d < ndev; d++) {
                void *p = NULL;
                ZE_OK(alloc_dev(ctx, sz, al, d, &p));
                REQUIRE(p);
                CHECK((uintptr_t)p % (al > 64 * KIB ? al : 64 * KIB) == 0);
                check_alloc(p, sz, ZE_MEMORY_TYPE_DEVICE, devs[d], 64 * KIB);
                ZE_OK(ze.zeMemFree(ctx, p));
                ZE_OK(alloc_shared(ctx, sz, al, d, &p));
                REQUIRE(p);
                CHECK((uintptr_t)p % (al > 64 * KIB ? al : 64 * KIB) == 0);
                check_alloc(p, sz, ZE_MEMORY_TYPE_SHARED, devs[d], 64 * KIB);
                memset(p, 0xab, sz); /* the CPU may touch shared memory */
                ZE_OK(ze.zeMemFree(ctx, p));
            }
            void *p = NULL;
            ZE_OK(alloc_host(ctx, sz, al, &p));
            REQUIRE(p);
            CHECK((uintptr_t)p % (al > 4096 ? al : 4096) == 0);
            check_alloc(p, sz, ZE_MEMORY_TYPE_HOST, NULL, 4 * KIB);
            memset(p, 0xcd, sz); /* and host memory */
            ZE_OK(ze.zeMemFree(ctx, p));
        }
    /* shared memory of no device */
    void *p = NULL;
    ZE_OK(ze.zeMemAllocShared(ctx, &ddesc, &hdesc, 4096, 0, NULL, &p));
    if (p) {
        ze_memory_allocation_properties_t ap = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
        ZE_OK(ze.zeMemGetAllocProperties(ctx, p, &ap, NULL));
        CHECK_EQ(ap.type, ZE_MEMORY_TYPE_SHARED);
        ZE_OK(ze.zeMemFree(ctx, p));
    }

    /* The same address again gets a new id. */
    void *q = NULL;
    ZE_OK(alloc_dev(ctx, 64 * KIB, 0, 0, &p));
    ze_memory_allocation_properties_t a1 = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ZE_OK(ze.zeMemGetAllocProperties(ctx, p, &a1, NULL));
    ZE_OK(ze.zeMemFree(ctx, p));
    ZE_OK(alloc_dev(ctx, 64 * KIB, 0, 0, &q));
    ze_memory_allocation_properties_t a2 = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ZE_OK(ze.zeMemGetAllocProperties(ctx, q, &a2, NULL));
    CHECK(a1.id != a2.id);
    printf("re-allocation %s the address\n", p == q ? "reused" : "did not reuse");
    ZE_OK(ze.zeMemFree(ctx, q));

    /* bad alignment, size 0 */
    p = NULL;
    ZE_EXPECT(alloc_dev(ctx, 4096, 3, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    ZE_EXPECT(alloc_dev(ctx, 4096, 96, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    ZE_EXPECT(alloc_host(ctx, 4096, 3 * 4096, &p), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    ZE_EXPECT(alloc_shared(ctx, 4096, 12, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    ZE_EXPECT(alloc_dev(ctx, 0, 0, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    ZE_EXPECT(alloc_host(ctx, 0, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    ZE_EXPECT(alloc_shared(ctx, 0, 0, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    /* Under the validation layer a NULL descriptor never reaches the driver. */
    uint64_t n0 = ctl.call_count("zeMemAllocDevice");
    ZE_EXPECT(ze.zeMemAllocDevice(ctx, NULL, 4096, 0, devs[0], &p), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK_EQ(ctl.call_count("zeMemAllocDevice") - n0, validation ? 0 : 1);
    ZE_EXPECT(ze.zeMemAllocDevice(ctx, &ddesc, 4096, 0, devs[0], NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_device_mem_alloc_desc_t bad = ddesc;
    bad.flags = 0x10;
    ZE_EXPECT(ze.zeMemAllocDevice(ctx, &bad, 4096, 0, devs[0], &p), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    CHECK(p == NULL);

    /* foreign pointers: plain process memory */
    int local = 0;
    ze_memory_allocation_properties_t ap = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t d = devs[0];
    ZE_OK(ze.zeMemGetAllocProperties(ctx, &local, &ap, &d));
    CHECK_EQ(ap.type, ZE_MEMORY_TYPE_UNKNOWN);
    CHECK(d == NULL);
    void *base;
    size_t len;
    ZE_EXPECT(ze.zeMemGetAddressRange(ctx, &local, &base, &len), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    char *m = malloc(64);
    ZE_EXPECT(ze.zeMemFree(ctx, m), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    free(m);

    /* free: interior pointer, twice, through another context */
    ZE_OK(alloc_dev(ctx, 100000, 0, 0, &p));
    ZE_EXPECT(ze.zeMemFree(ctx, (char *)p + 16), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t c2 = NULL;
    ZE_REQUIRE_OK(ze.zeContextCreate(drv, &cd, &c2));
    ZE_EXPECT(ze.zeMemFree(c2, p), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ze_memory_allocation_properties_t ax = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ZE_OK(ze.zeMemGetAllocProperties(c2, p, &ax, NULL));
    CHECK_EQ(ax.type, ZE_MEMORY_TYPE_UNKNOWN);
    ZE_OK(ze.zeContextDestroy(c2));
    ZE_OK(ze.zeMemFree(ctx, p));
    ZE_EXPECT(ze.zeMemFree(ctx, p), ZE_RESULT_ERROR_INVALID_ARGUMENT);

    /* zeMemFreeExt: both policies free at once; the flags are checked */
    ze_memory_free_ext_desc_t fd = {ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC, NULL, 0};
    static const ze_driver_memory_free_policy_ext_flags_t pol[] = {
        0, ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE,
        ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE};
    for (size_t i = 0; i < 3; i++) {
        ZE_OK(alloc_dev(ctx, 4096, 0, 0, &p));
        fd.freePolicy = 0x3;
        ZE_EXPECT(ze.zeMemFreeExt(ctx, &fd, p), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        fd.freePolicy = 0x4;
        ZE_EXPECT(ze.zeMemFreeExt(ctx, &fd, p), ZE_RESULT_ERROR_INVALID_ENUMERATION);
        ZE_EXPECT(ze.zeMemFreeExt(ctx, NULL, p), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
        fd.freePolicy = pol[i];
        ZE_OK(ze.zeMemFreeExt(ctx, &fd, p));
        ZE_EXPECT(ze.zeMemFreeExt(ctx, &fd, p), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    }
    hm_ze_test_stats_t s1 = stats();
    CHECK_EQ(s1.live_allocs, s0.live_allocs);
    CHECK_EQ(s1.host_used, s0.host_used);
    for (uint32_t i = 0; i < ndev; i++) CHECK_EQ(s1.device_used[i], s0.device_used[i]);
}

static void test_limits(void) {
    hm_test_set_context("limits");
    ctl.set_mem_limit(4 * MIB);
    ze_device_memory_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
    uint32_t m = 1;
    ZE_OK(ze.zeDeviceGetMemoryProperties(devs[0], &m, &mp));
    CHECK_EQ(mp.totalSize, 4 * MIB);

    void *p[5] = {0}, *h[5] = {0}, *x = NULL;
    for (int i = 0; i < 4; i++) ZE_OK(alloc_dev(ctx, MIB, 0, 0, &p[i]));
    CHECK_EQ(stats().device_used[0], 4 * MIB);
    ZE_EXPECT(alloc_dev(ctx, MIB, 0, 0, &p[4]), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    ZE_EXPECT(alloc_dev(ctx, 1, 0, 0, &p[4]), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    ZE_EXPECT(alloc_shared(ctx, 1, 0, 0, &p[4]), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    CHECK(p[4] == NULL);
    if (ndev > 1) { /* another device has its own memory */
        ZE_OK(alloc_dev(ctx, MIB, 0, 1, &x));
        ZE_OK(ze.zeMemFree(ctx, x));
    }
    ZE_OK(alloc_host(ctx, MIB, 0, &x)); /* and the host */
    ZE_OK(ze.zeMemFree(ctx, x));
    ZE_OK(ze.zeMemFree(ctx, p[1]));
    ZE_OK(alloc_dev(ctx, 1, 0, 0, &p[1])); /* room again; 64 KiB counted */
    CHECK_EQ(stats().device_used[0], 3 * MIB + 64 * KIB);
    ZE_EXPECT(alloc_dev(ctx, MIB, 0, 0, &p[4]), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    for (int i = 0; i < 4; i++) ZE_OK(ze.zeMemFree(ctx, p[i]));
    ZE_OK(alloc_dev(ctx, MIB, 0, 0, &p[4]));
    ZE_OK(ze.zeMemFree(ctx, p[4]));
    /* larger than maxMemAllocSize (half the memory): refused without the
     * relaxed limit, allowed with it up to the memory */
    x = NULL;
    ZE_EXPECT(alloc_dev(ctx, 2 * MIB + 1, 0, 0, &x), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    ZE_EXPECT(alloc_host(ctx, 2 * MIB + 1, 0, &x), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    ZE_EXPECT(alloc_shared(ctx, 2 * MIB + 1, 0, 0, &x), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(x == NULL);
    ze_relaxed_allocation_limits_exp_desc_t rx = {
        ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC, NULL,
        ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
    ze_device_mem_alloc_desc_t rdd = ddesc;
    ze_host_mem_alloc_desc_t rhd = hdesc;
    rdd.pNext = &rx;
    rhd.pNext = &rx;
    ZE_OK(ze.zeMemAllocDevice(ctx, &rdd, 3 * MIB, 0, devs[0], &x));
    ZE_OK(ze.zeMemFree(ctx, x));
    ZE_OK(ze.zeMemAllocShared(ctx, &rdd, &hdesc, 3 * MIB, 0, devs[0], &x));
    ZE_OK(ze.zeMemFree(ctx, x));
    ZE_OK(ze.zeMemAllocHost(ctx, &rhd, 3 * MIB, 0, &x));
    ZE_OK(ze.zeMemFree(ctx, x));
    x = NULL;
    ZE_EXPECT(ze.zeMemAllocDevice(ctx, &rdd, 4 * MIB + 1, 0, devs[0], &x),
              ZE_RESULT_ERROR_UNSUPPORTED_SIZE); /* above the memory itself */
    rx.flags = 0; /* the descriptor without the flag relaxes nothing */
    ZE_EXPECT(ze.zeMemAllocDevice(ctx, &rdd, 3 * MIB, 0, devs[0], &x),
              ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(x == NULL);

    for (int i = 0; i < 4; i++) ZE_OK(alloc_host(ctx, MIB, 0, &h[i]));
    ZE_EXPECT(alloc_host(ctx, 4096, 0, &h[4]), ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    ZE_OK(ze.zeMemFree(ctx, h[0]));
    ZE_OK(alloc_host(ctx, 4096, 0, &h[4]));
    CHECK_EQ(stats().host_used, 3 * MIB + 4096);
    for (int i = 1; i < 5; i++) ZE_OK(ze.zeMemFree(ctx, h[i]));
    CHECK_EQ(stats().host_used, 0);
    CHECK_EQ(stats().device_used[0], 0);
    ctl.set_mem_limit(limit);
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

static void test_device_faults(void) {
    hm_test_set_context("device faults");
    void *d = NULL, *h = NULL, *s = NULL;
    ZE_REQUIRE_OK(alloc_dev(ctx, 100000, 0, 0, &d));
    ZE_REQUIRE_OK(alloc_host(ctx, 4096, 0, &h));
    ZE_REQUIRE_OK(alloc_shared(ctx, 4096, 0, 0, &s));
    CHECK_EQ(touch_in_child(d, false), SIGSEGV);
    CHECK_EQ(touch_in_child((char *)d + 70000, true), SIGSEGV);
    CHECK_EQ(touch_in_child(h, true), 0);
    CHECK_EQ(touch_in_child(s, false), 0);
    ZE_OK(ze.zeMemFree(ctx, d));
    ZE_OK(ze.zeMemFree(ctx, h));
    ZE_OK(ze.zeMemFree(ctx, s));
}

/* ---- fill and copy ---- */

static void test_fill_copy(void) {
    hm_test_set_context("fill/copy");
    const size_t size = MIB;
    void *d = NULL, *d1 = NULL, *sh = NULL, *ho = NULL;
    uint32_t other = ndev > 1 ? 1 : 0;
    ZE_REQUIRE_OK(alloc_dev(ctx, size, 0, 0, &d));
    ZE_REQUIRE_OK(alloc_dev(ctx, size, 0, other, &d1));
    ZE_REQUIRE_OK(alloc_shared(ctx, size, 0, 0, &sh));
    ZE_REQUIRE_OK(alloc_host(ctx, size, 0, &ho));
    uint8_t *plain = malloc(size);
    REQUIRE(plain);

    /* every pattern size; a size that is no multiple of it ends in a part */
    for (size_t ps = 1; ps <= 128; ps *= 2) {
        uint8_t pat[128];
        for (size_t i = 0; i < ps; i++) pat[i] = (uint8_t)(i * 7 + ps + 1);
        ZE_OK(fill_byte(imm[0], d, 0, size));
        const size_t n = size - 3 - ps / 2;
        ZE_OK(fill(imm[0], d, pat, ps, n));
        memset(plain, 0xee, size);
        ZE_OK(copy(imm[0], plain, d, size));
        bool ok = true;
        for (size_t i = 0; ok && i < n; i++) ok = plain[i] == pat[i % ps];
        for (size_t i = n; ok && i < size; i++) ok = plain[i] == 0;
        CHECK_MSG(ok, "fill with a %zu-byte pattern", ps);
    }
    uint8_t pat3[3] = {1, 2, 3};
    ZE_EXPECT(fill(imm[0], d, pat3, 3, 64), ZE_RESULT_ERROR_INVALID_SIZE);
    uint8_t big[256] = {0};
    ZE_EXPECT(fill(imm[0], d, big, 256, 512), ZE_RESULT_ERROR_INVALID_SIZE);
    ZE_EXPECT(fill(imm[0], d, NULL, 1, 64), ZE_RESULT_ERROR_INVALID_NULL_POINTER);

    /* plain -> device -> other device -> shared -> host memory -> plain */
    for (size_t i = 0; i < size; i++) plain[i] = (uint8_t)(i * 31 + 7);
    ZE_OK(copy(imm[0], d, plain, size));
    ZE_OK(copy(imm[0], d1, d, size));
    ZE_OK(copy(imm[other], sh, d1, size));
    ZE_OK(copy(imm[0], ho, sh, size));
    CHECK(memcmp(sh, plain, size) == 0);
    CHECK(memcmp(ho, plain, size) == 0);
    uint8_t *back = malloc(size);
    REQUIRE(back);
    ZE_OK(copy(imm[0], back, d1, size));
    CHECK(memcmp(back, plain, size) == 0);
    /* interior pointers */
    ZE_OK(fill_byte(imm[0], (char *)d + 1000, 0x5c, 24));
    ZE_OK(copy(imm[0], back, (char *)d + 990, 40));
    CHECK(back[9] == plain[999] && back[10] == 0x5c && back[33] == 0x5c && back[34] == plain[1024]);
    ZE_OK(ze.zeCommandListAppendBarrier(imm[0], NULL, 0, NULL));

    /* ranges that run past the allocation */
    ZE_EXPECT(fill_byte(imm[0], (char *)d + size - 10, 1, 20), ZE_RESULT_ERROR_INVALID_SIZE);
    ZE_EXPECT(copy(imm[0], (char *)d + size - 10, plain, 20), ZE_RESULT_ERROR_INVALID_SIZE);
    ZE_EXPECT(copy(imm[0], plain, (char *)d1 + 1, size), ZE_RESULT_ERROR_INVALID_SIZE);
    ZE_EXPECT(copy(imm[0], plain, (char *)ho + size - 1, 2), ZE_RESULT_ERROR_INVALID_SIZE);
    void *small = NULL;
    ZE_REQUIRE_OK(alloc_dev(ctx, 100, 0, 0, &small));
    ZE_EXPECT(fill_byte(imm[0], small, 1, 101), ZE_RESULT_ERROR_INVALID_SIZE);
    ZE_EXPECT(fill_byte(imm[0], (char *)small + 200, 1, 1), ZE_RESULT_ERROR_INVALID_SIZE);
    ZE_OK(fill_byte(imm[0], small, 1, 100));
    ZE_OK(ze.zeMemFree(ctx, small));

    /* events */
    ze_event_pool_desc_t pd = {ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, NULL, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 4};
    ze_event_pool_handle_t pool = NULL;
    ZE_REQUIRE_OK(ze.zeEventPoolCreate(ctx, &pd, 0, NULL, &pool));
    ze_event_desc_t ed = {ZE_STRUCTURE_TYPE_EVENT_DESC, NULL, 0, ZE_EVENT_SCOPE_FLAG_HOST,
                          ZE_EVENT_SCOPE_FLAG_HOST};
    ze_event_handle_t e0 = NULL, e1 = NULL;
    ZE_REQUIRE_OK(ze.zeEventCreate(pool, &ed, &e0));
    ed.index = 1;
    ZE_REQUIRE_OK(ze.zeEventCreate(pool, &ed, &e1));
    ZE_EXPECT(ze.zeEventQueryStatus(e0), ZE_RESULT_NOT_READY);
    ZE_EXPECT(ze.zeEventHostSynchronize(e0, 0), ZE_RESULT_NOT_READY);
    uint8_t v = 0x42;
    ZE_OK(ze.zeCommandListAppendMemoryFill(imm[0], d, &v, 1, 4096, e0, 0, NULL));
    ZE_OK(ze.zeEventQueryStatus(e0));
    ZE_OK(ze.zeEventHostSynchronize(e0, UINT64_MAX));
    ZE_OK(ze.zeCommandListAppendMemoryCopy(imm[0], back, d, 4096, e1, 1, &e0));
    ZE_OK(ze.zeEventHostSynchronize(e1, UINT64_MAX));
    CHECK(back[0] == 0x42 && back[4095] == 0x42);
    ZE_OK(ze.zeEventHostReset(e0));
    ZE_EXPECT(ze.zeEventQueryStatus(e0), ZE_RESULT_NOT_READY);
    /* waiting on an event nobody signals: refused, nothing done */
    back[0] = 0;
    ZE_EXPECT(ze.zeCommandListAppendMemoryCopy(imm[0], back, d, 4096, NULL, 1, &e0),
              ZE_RESULT_ERROR_NOT_AVAILABLE);
    CHECK_EQ(back[0], 0);
    ZE_OK(ze.zeEventHostSignal(e0));
    ZE_OK(ze.zeCommandListAppendBarrier(imm[0], NULL, 1, &e0));
    ZE_EXPECT(ze.zeEventPoolDestroy(pool), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    ZE_OK(ze.zeEventDestroy(e0));
    ZE_OK(ze.zeEventDestroy(e1));
    ZE_OK(ze.zeEventPoolDestroy(pool));

    /* a regular command list on a queue */
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_DEFAULT, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_queue_handle_t q = NULL;
    ZE_REQUIRE_OK(ze.zeCommandQueueCreate(ctx, devs[0], &qd, &q));
    ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
    ze_command_list_handle_t l = NULL;
    ZE_REQUIRE_OK(ze.zeCommandListCreate(ctx, devs[0], &ld, &l));
    uint32_t pat4 = 0xa1b2c3d4;
    ZE_OK(fill(l, d, &pat4, 4, size));
    ZE_OK(copy(l, back, d, size));
    memset(back, 0, size);
    ZE_EXPECT(ze.zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(back[0], 0); /* recorded, not run */
    ZE_OK(ze.zeCommandListClose(l));
    ZE_EXPECT(fill(l, d, &pat4, 4, size), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* closed */
    ZE_OK(ze.zeCommandQueueExecuteCommandLists(q, 1, &l, NULL));
    ZE_OK(ze.zeCommandQueueSynchronize(q, UINT64_MAX));
    uint32_t w0, wl;
    memcpy(&w0, back, 4);
    memcpy(&wl, back + size - 4, 4);
    CHECK(w0 == pat4 && wl == pat4);
    /* run twice */
    memset(back, 0, size);
    ZE_OK(ze.zeCommandQueueExecuteCommandLists(q, 1, &l, NULL));
    memcpy(&w0, back, 4);
    CHECK(w0 == pat4);
    /* memory freed between append and execute: the GPU would fault */
    ZE_OK(ze.zeCommandListReset(l));
    void *gone = NULL;
    ZE_REQUIRE_OK(alloc_dev(ctx, 4096, 0, 0, &gone));
    ZE_OK(fill_byte(l, gone, 1, 4096));
    ZE_OK(ze.zeCommandListClose(l));
    ZE_OK(ze.zeMemFree(ctx, gone));
    ZE_EXPECT(ze.zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), ZE_RESULT_ERROR_DEVICE_LOST);
    ZE_OK(ze.zeCommandListDestroy(l));
    ZE_OK(ze.zeCommandQueueDestroy(q));

    free(back);
    free(plain);
    ZE_OK(ze.zeMemFree(ctx, d));
    ZE_OK(ze.zeMemFree(ctx, d1));
    ZE_OK(ze.zeMemFree(ctx, sh));
    ZE_OK(ze.zeMemFree(ctx, ho));
}

/* ---- asynchronous immediate lists ---- */

static ze_command_list_handle_t imm_list(ze_command_queue_mode_t mode) {
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0, mode,
                                  ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t l = NULL;
    ZE_REQUIRE_OK(ze.zeCommandListCreateImmediate(ctx, devs[0], &qd, &l));
    return l;
}

/* The first byte of driver memory p, read at once (synchronous list). */
static int byte_at(const void *p) {
    uint8_t b = 0;
    return copy(imm[0], &b, p, 1) == ZE_RESULT_SUCCESS ? b : -1;
}

static void test_async(void) {
    hm_test_set_context("asynchronous immediate lists");
    hm_ze_test_stats_t s0 = stats();
    void *d = NULL, *d2 = NULL;
    ZE_REQUIRE_OK(alloc_dev(ctx, 64 * KIB, 0, 0, &d));
    ZE_REQUIRE_OK(alloc_dev(ctx, 64 * KIB, 0, 0, &d2));
    ZE_OK(fill_byte(imm[0], d, 0, 64 * KIB));
    ZE_OK(fill_byte(imm[0], d2, 0, 64 * KIB));
    ze_event_pool_desc_t pd = {ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, NULL,
                               ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 8};
    ze_event_pool_handle_t pool = NULL;
    ZE_REQUIRE_OK(ze.zeEventPoolCreate(ctx, &pd, 1, &devs[0], &pool));
    ze_event_handle_t e[8];
    for (uint32_t i = 0; i < 8; i++) {
        ze_event_desc_t ed = {ZE_STRUCTURE_TYPE_EVENT_DESC, NULL, i, ZE_EVENT_SCOPE_FLAG_HOST,
                              ZE_EVENT_SCOPE_FLAG_HOST};
        ZE_REQUIRE_OK(ze.zeEventCreate(pool, &ed, &e[i]));
    }
    CHECK_EQ(stats().live_events, s0.live_events + 8);
    ze_command_list_handle_t a = imm_list(ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    ze_command_list_handle_t b = imm_list(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    uint8_t v = 0x42;

    /* queued, not run: query runs nothing, timeout 0 runs nothing */
    ZE_OK(ze.zeCommandListAppendMemoryFill(a, d, &v, 1, 64 * KIB, e[0], 0, NULL));
    CHECK_EQ(stats().queued_commands, 1);
    CHECK_EQ(byte_at(d), 0);
    ZE_EXPECT(ze.zeEventQueryStatus(e[0]), ZE_RESULT_NOT_READY);
    ZE_EXPECT(ze.zeEventHostSynchronize(e[0], 0), ZE_RESULT_NOT_READY);
    CHECK_EQ(byte_at(d), 0);
    ZE_OK(ze.zeEventHostSynchronize(e[0], UINT64_MAX));
    CHECK_EQ(byte_at(d), 0x42);
    ZE_OK(ze.zeEventQueryStatus(e[0]));
    CHECK_EQ(stats().queued_commands, 0);

    /* a synchronize runs up to its event, in order */
    v = 1;
    ZE_OK(ze.zeCommandListAppendMemoryFill(a, d, &v, 1, 4096, e[1], 0, NULL));
    v = 2;
    ZE_OK(ze.zeCommandListAppendMemoryFill(a, d, &v, 1, 4096, NULL, 0, NULL));
    ZE_OK(ze.zeCommandListAppendSignalEvent(a, e[2]));
    ZE_OK(ze.zeEventHostSynchronize(e[1], UINT64_MAX));
    CHECK_EQ(byte_at(d), 1);
    ZE_EXPECT(ze.zeEventQueryStatus(e[2]), ZE_RESULT_NOT_READY);
    CHECK_EQ(stats().queued_commands, 2);
    CHECK_EQ(ctl.run_queued(), 2); /* the device catches up */
    CHECK_EQ(byte_at(d), 2);
    ZE_OK(ze.zeEventQueryStatus(e[2]));
    CHECK_EQ(ctl.run_queued(), 0);

    /* a reset event signaled again by queued work; a host reset of an event
     * whose signal is queued does not cancel that signal */
    ZE_OK(ze.zeEventHostReset(e[2]));
    ZE_OK(ze.zeCommandListAppendSignalEvent(b, e[2])); /* DEFAULT mode queues too */
    ZE_EXPECT(ze.zeEventQueryStatus(e[2]), ZE_RESULT_NOT_READY);
    ZE_OK(ze.zeEventHostReset(e[2]));
    ZE_OK(ze.zeEventHostSynchronize(e[2], UINT64_MAX));

    /* a wait on an event only the host signals holds that list, not others */
    ZE_OK(ze.zeEventHostReset(e[2]));
    ZE_OK(ze.zeCommandListAppendWaitOnEvents(a, 1, &e[3]));
    v = 3;
    ZE_OK(ze.zeCommandListAppendMemoryFill(a, d, &v, 1, 4096, e[4], 0, NULL));
    ZE_OK(ze.zeCommandListAppendSignalEvent(b, e[5]));
    ZE_EXPECT(ze.zeEventHostSynchronize(e[4], UINT64_MAX), ZE_RESULT_NOT_READY);
    CHECK_EQ(byte_at(d), 2);
    ZE_OK(ze.zeEventQueryStatus(e[5])); /* b ran meanwhile */
    ZE_EXPECT(ze.zeEventDestroy(e[3]), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE); /* queued wait */
    ZE_EXPECT(ze.zeEventDestroy(e[4]), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE); /* queued signal */
    ZE_OK(ze.zeEventHostSignal(e[3]));
    ZE_EXPECT(ze.zeEventQueryStatus(e[4]), ZE_RESULT_NOT_READY);
    ZE_OK(ze.zeEventHostSynchronize(e[4], UINT64_MAX));
    CHECK_EQ(byte_at(d), 3);

    /* across lists: b waits on a's signal; synchronizing b's event runs a */
    for (int i = 3; i <= 5; i++) ZE_OK(ze.zeEventHostReset(e[i]));
    ZE_OK(ze.zeCommandListAppendWaitOnEvents(b, 1, &e[3]));
    v = 4;
    ZE_OK(ze.zeCommandListAppendMemoryFill(b, d2, &v, 1, 4096, e[5], 0, NULL));
    v = 5;
    ZE_OK(ze.zeCommandListAppendMemoryFill(a, d, &v, 1, 4096, e[3], 0, NULL));
    ZE_OK(ze.zeEventHostSynchronize(e[5], UINT64_MAX));
    CHECK_EQ(byte_at(d), 5);
    CHECK_EQ(byte_at(d2), 4);

    /* a synchronous list's command waiting on queued work: that work runs */
    ZE_OK(ze.zeEventHostReset(e[3]));
    v = 6;
    ZE_OK(ze.zeCommandListAppendMemoryFill(a, d, &v, 1, 4096, e[3], 0, NULL));
    uint8_t got = 0;
    ZE_OK(ze.zeCommandListAppendMemoryCopy(imm[0], &got, d, 1, NULL, 1, &e[3]));
    CHECK_EQ(got, 6);

    /* a free runs the queued work that uses the memory first */
    void *t = NULL;
    ZE_REQUIRE_OK(alloc_dev(ctx, 4096, 0, 0, &t));
    ZE_OK(ze.zeEventHostReset(e[6]));
    ZE_OK(fill_byte(a, t, 7, 4096));
    ZE_OK(ze.zeCommandListAppendMemoryCopy(a, d2, t, 4096, e[6], 0, NULL));
    CHECK_EQ(stats().queued_commands, 2);
    ZE_OK(ze.zeMemFree(ctx, t));
    CHECK_EQ(stats().queued_commands, 0);
    ZE_OK(ze.zeEventQueryStatus(e[6]));
    CHECK_EQ(byte_at(d2), 7);

    /* memory freed under a command that cannot run yet: the command faults,
     * the list's work is dropped, its events lost, the list is lost */
    ze_command_list_handle_t c = imm_list(ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    ZE_REQUIRE_OK(alloc_dev(ctx, 4096, 0, 0, &t));
    ZE_OK(ze.zeEventHostReset(e[3]));
    ZE_OK(ze.zeEventHostReset(e[6]));
    ZE_OK(ze.zeCommandListAppendWaitOnEvents(c, 1, &e[3]));
    ZE_OK(fill_byte(c, t, 8, 4096));
    ZE_OK(ze.zeCommandListAppendSignalEvent(c, e[6]));
    ZE_OK(ze.zeMemFree(ctx, t));
    CHECK_EQ(stats().queued_commands, 3);
    ZE_OK(ze.zeEventHostSignal(e[3]));
    ZE_EXPECT(ze.zeEventHostSynchronize(e[6], UINT64_MAX), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_EQ(stats().queued_commands, 0);
    ZE_EXPECT(ze.zeCommandListAppendSignalEvent(c, e[6]), ZE_RESULT_ERROR_DEVICE_LOST);
    ZE_OK(ze.zeEventHostReset(e[6]));
    ZE_EXPECT(ze.zeEventHostSynchronize(e[6], 0), ZE_RESULT_NOT_READY);
    ZE_OK(ze.zeCommandListDestroy(c));

    /* a destroyed list's queued work runs first */
    c = imm_list(ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    v = 9;
    ZE_OK(ze.zeCommandListAppendMemoryFill(c, d, &v, 1, 4096, e[6], 0, NULL));
    ZE_OK(ze.zeCommandListDestroy(c));
    ZE_OK(ze.zeEventQueryStatus(e[6]));
    CHECK_EQ(byte_at(d), 9);

    /* a failed append queues nothing; range errors are found at the append */
    CHECK_EQ(ctl.fail_next("zeCommandListAppendSignalEvent", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    ZE_EXPECT(ze.zeCommandListAppendSignalEvent(a, e[7]), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_EQ(ctl.fail_next("zeCommandListAppendWaitOnEvents", 1, ZE_RESULT_ERROR_UNKNOWN), 0);
    ZE_EXPECT(ze.zeCommandListAppendWaitOnEvents(a, 1, &e[7]), ZE_RESULT_ERROR_UNKNOWN);
    ZE_EXPECT(fill_byte(a, d, 1, 64 * KIB + 1), ZE_RESULT_ERROR_INVALID_SIZE);
    CHECK_EQ(stats().queued_commands, 0);
    CHECK_EQ(ctl.fail_next("zeEventQueryStatus", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    ZE_EXPECT(ze.zeEventQueryStatus(e[6]), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_EQ(ctl.fail_next("zeEventHostSynchronize", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    ZE_EXPECT(ze.zeEventHostSynchronize(e[6], UINT64_MAX), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_EQ(ctl.fail_next("zeEventHostReset", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    ZE_EXPECT(ze.zeEventHostReset(e[6]), ZE_RESULT_ERROR_DEVICE_LOST);
    ZE_OK(ze.zeEventQueryStatus(e[6])); /* the failed reset reset nothing */

    /* the lenient option: immediate lists run at once whatever their mode */
    CHECK_EQ(ctl.set_option("immediate_synchronous", 1), 0);
    c = imm_list(ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    CHECK_EQ(ctl.set_option("immediate_synchronous", 0), 0);
    ZE_OK(ze.zeEventHostReset(e[7]));
    ZE_OK(ze.zeCommandListAppendSignalEvent(c, e[7]));
    ZE_OK(ze.zeEventQueryStatus(e[7]));
    ZE_OK(ze.zeCommandListDestroy(c));

    ZE_OK(ze.zeCommandListDestroy(a));
    ZE_OK(ze.zeCommandListDestroy(b));
    for (int i = 0; i < 8; i++) ZE_OK(ze.zeEventDestroy(e[i]));
    ZE_OK(ze.zeEventPoolDestroy(pool));
    ZE_OK(ze.zeMemFree(ctx, d));
    ZE_OK(ze.zeMemFree(ctx, d2));
    CHECK_EQ(stats().live_events, s0.live_events);
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
}

/* ---- IPC between two processes ---- */

static void send_msg(int sock, const void *data, size_t len, const int *fds, int nfds) {
    struct iovec iov = {(void *)(uintptr_t)data, len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } u;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds) {
        memset(&u, 0, sizeof u);
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    REQUIRE(sendmsg(sock, &mh, 0) == (ssize_t)len);
}

/* Receives len bytes and up to 4 fds; returns the number of fds. */
static int recv_msg(int sock, void *data, size_t len, int *fds) {
    struct iovec iov = {data, len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } u;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    REQUIRE(n == (ssize_t)len);
    int nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)nfds);
        }
    return nfds;
}

struct ipc_msg {
    ze_ipc_mem_handle_t a, b; /* a: alive in the exporter, b: freed before the open */
    size_t a_size, b_size;
};

static ze_ipc_mem_handle_t with_fd(ze_ipc_mem_handle_t h, int64_t fd) {
    memcpy(h.data, &fd, 8);
    return h;
}

static void ipc_importer(int sock) {
    hm_test_set_context("ipc importer");
    struct ipc_msg msg;
    int fds[4], got[2];
    REQUIRE(recv_msg(sock, &msg, sizeof msg, fds) == 2);
    /* Move the received fds out of the range the exporter's numbers are
     * in, so that an untranslated number cannot name the same file here by
     * chance. */
    for (int i = 0; i < 2; i++) {
        got[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 500);
        REQUIRE(got[i] >= 500);
        close(fds[i]);
    }
    char go;
    REQUIRE(read(sock, &go, 1) == 1); /* b is freed in the exporter now */

    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t c = NULL;
    ZE_REQUIRE_OK(ze.zeContextCreate(drv, &cd, &c));
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t l = NULL;
    ZE_REQUIRE_OK(ze.zeCommandListCreateImmediate(c, devs[0], &qd, &l));
    hm_ze_test_stats_t s0 = stats();

    /* untranslated: the exporter's number is closed here or another file */
    void *pa = NULL;
    ZE_EXPECT(ze.zeMemOpenIpcHandle(c, devs[0], msg.a, 0, &pa), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_EXPECT(ze.zeMemOpenIpcHandle(c, devs[0], with_fd(msg.a, 450), 0, &pa),
              ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_EXPECT(ze.zeMemOpenIpcHandle(c, devs[0], with_fd(msg.a, sock), 0, &pa),
              ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_EXPECT(ze.zeMemOpenIpcHandle(c, devs[0], with_fd(msg.a, got[1]), 0, &pa),
              ZE_RESULT_ERROR_INVALID_ARGUMENT); /* b's file, not a's */
    CHECK(pa == NULL);

    /* the handle's size bytes are not believed: the mapping, and the range
     * the driver reports, are the allocation's */
    {
        ze_ipc_mem_handle_t lie = with_fd(msg.a, got[0]);
        uint64_t big = (uint64_t)msg.a_size + 4 * MIB;
        memcpy(lie.data + 32, &big, 8);
        void *pl = NULL, *lb = NULL;
        size_t ls = 0;
        ZE_REQUIRE_OK(ze.zeMemOpenIpcHandle(c, devs[0], lie, 0, &pl));
        ZE_OK(ze.zeMemGetAddressRange(c, pl, &lb, &ls));
        CHECK(lb == pl);
        CHECK_EQ(ls, msg.a_size);
        ZE_OK(ze.zeMemCloseIpcHandle(c, pl));
        CHECK_EQ(stats().live_ipc_mappings, s0.live_ipc_mappings);
    }

    /* translated: device memory of this process's device 0 */
    ze_ipc_mem_handle_t ha = with_fd(msg.a, got[0]);
    ZE_REQUIRE_OK(ze.zeMemOpenIpcHandle(c, devs[0], ha, 0, &pa));
    ze_memory_allocation_properties_t ap = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t dev = NULL;
    ZE_OK(ze.zeMemGetAllocProperties(c, (char *)pa + 100, &ap, &dev));
    CHECK_EQ(ap.type, ZE_MEMORY_TYPE_DEVICE);
    CHECK(dev == devs[0]);
    void *base = NULL;
    size_t len = 0;
    ZE_OK(ze.zeMemGetAddressRange(c, (char *)pa + 100, &base, &len));
    CHECK(base == pa);
    CHECK_EQ(len, msg.a_size);
    CHECK(all_bytes(l, pa, 0x5a, msg.a_size));
    CHECK_EQ(touch_in_child(pa, false), SIGSEGV);
    /* a second open of the same handle: a pointer of its own (ze_api.h:
     * "unique pointers"), the same memory */
    void *pa2 = NULL;
    ZE_OK(ze.zeMemOpenIpcHandle(c, devs[0], ha, 0, &pa2));
    CHECK(pa2 != NULL && pa2 != pa);
    CHECK(all_bytes(l, pa2, 0x5a, msg.a_size));
    hm_ze_test_stats_t s1 = stats();
    CHECK_EQ(s1.live_ipc_mappings, s0.live_ipc_mappings + 2);
    CHECK_EQ(s1.live_ipc_refs, s0.live_ipc_refs + 2);
    CHECK(s1.ipc_open >= s0.ipc_open + 2);
    ZE_OK(ze.zeMemCloseIpcHandle(c, pa2));
    CHECK(all_bytes(l, pa, 0x5a, 64)); /* the first is its own mapping */
    /* the lenient option: the same pointer with a reference (CUDA's way) */
    CHECK_EQ(ctl.set_option("ipc_open_same_pointer", 1), 0);
    ZE_OK(ze.zeMemOpenIpcHandle(c, devs[0], ha, 0, &pa2));
    CHECK(pa2 == pa);
    CHECK_EQ(ctl.set_option("ipc_open_same_pointer", 0), 0);
    s1 = stats();
    CHECK_EQ(s1.live_ipc_mappings, s0.live_ipc_mappings + 1);
    CHECK_EQ(s1.live_ipc_refs, s0.live_ipc_refs + 2);
    /* no re-export, no free of an opened mapping */
    ze_ipc_mem_handle_t again;
    ZE_EXPECT(ze.zeMemGetIpcHandle(c, pa, &again), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_EXPECT(ze.zeMemFree(c, pa), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    /* the importer writes; the exporter checks */
    ZE_OK(fill_byte(l, pa, 0xc3, msg.a_size));
    ZE_EXPECT(fill_byte(l, pa, 0xc3, msg.a_size + 1), ZE_RESULT_ERROR_INVALID_SIZE);

    /* b: freed in the exporter, alive through the fd this process holds */
    void *pb = NULL;
    ze_ipc_mem_handle_t hb = with_fd(msg.b, got[1]);
    ZE_OK(ze.zeMemOpenIpcHandle(c, devs[0], hb, 0, &pb));
    if (pb) CHECK(all_bytes(l, pb, 0x77, msg.b_size));

    /* an injected failure opens nothing */
    CHECK_EQ(ctl.fail_next("zeMemOpenIpcHandle", 1, ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY), 0);
    void *px = (void *)(uintptr_t)0x1234;
    ZE_EXPECT(ze.zeMemOpenIpcHandle(c, devs[0], hb, 0, &px), ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    CHECK(px == (void *)(uintptr_t)0x1234);
    hm_ze_test_stats_t s2 = stats();
    CHECK_EQ(s2.live_ipc_mappings, s1.live_ipc_mappings + 1);
    CHECK_EQ(s2.live_ipc_refs, s1.live_ipc_refs + 1);

    /* the fds may go: the mappings hold the memory */
    close(got[0]);
    close(got[1]);
    CHECK(all_bytes(l, pa, 0xc3, msg.a_size));

    /* close: one per open; then it is unknown */
    ZE_OK(ze.zeMemCloseIpcHandle(c, pa));
    CHECK(all_bytes(l, pa, 0xc3, 64)); /* still one reference */
    ZE_OK(ze.zeMemCloseIpcHandle(c, pa));
    ZE_EXPECT(ze.zeMemCloseIpcHandle(c, pa), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    if (pb) {
        ZE_EXPECT(ze.zeMemCloseIpcHandle(c, (char *)pb + 64), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        ZE_OK(ze.zeMemCloseIpcHandle(c, pb));
        ZE_EXPECT(ze.zeMemCloseIpcHandle(c, pb), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    }
    int local;
    ZE_EXPECT(ze.zeMemCloseIpcHandle(c, &local), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    /* the fork child's own memory works too; closing it is refused */
    void *own = NULL;
    ZE_OK(alloc_dev(c, 4096, 0, 0, &own));
    ZE_EXPECT(ze.zeMemCloseIpcHandle(c, own), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_OK(fill_byte(l, own, 9, 4096));
    CHECK(all_bytes(l, own, 9, 4096));
    ZE_OK(ze.zeMemFree(c, own));
    hm_ze_test_stats_t s3 = stats();
    CHECK_EQ(s3.live_ipc_mappings, s0.live_ipc_mappings);
    CHECK_EQ(s3.live_ipc_refs, s0.live_ipc_refs);
    ZE_OK(ze.zeCommandListDestroy(l));
    ZE_OK(ze.zeContextDestroy(c));
    char done = 'd';
    REQUIRE(write(sock, &done, 1) == 1);
}

static void test_ipc(void) {
    hm_test_set_context("ipc exporter");
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    /* The importer forks before the memory exists: it inherits no memfd.
     * It uses the driver as a fork child, which a real driver does not
     * allow (the provider's IPC tests exec their importer): asked for. */
    CHECK_EQ(ctl.set_option("fork_child_works", 1), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int before = hm_test_failed_count(); /* the parent's, inherited */
        close(sv[0]);
        ipc_importer(sv[1]);
        int failed = hm_test_failed_count() - before;
        printf("importer: %d checks failed\n", failed);
        fflush(stdout);
        _exit(failed ? 1 : 0);
    }
    close(sv[1]);
    CHECK_EQ(ctl.set_option("fork_child_works", 0), 0);
    uint32_t exp_dev = ndev > 1 ? 1 : 0;
    struct ipc_msg msg;
    memset(&msg, 0, sizeof msg);
    msg.a_size = 300000;
    msg.b_size = 64 * KIB;
    void *a = NULL, *b = NULL, *sh = NULL, *ho = NULL;
    ZE_REQUIRE_OK(alloc_dev(ctx, msg.a_size, 0, exp_dev, &a));
    ZE_REQUIRE_OK(alloc_dev(ctx, msg.b_size, 0, 0, &b));
    ZE_OK(fill_byte(imm[exp_dev], a, 0x5a, msg.a_size));
    ZE_OK(fill_byte(imm[0], b, 0x77, msg.b_size));
    hm_ze_test_stats_t s0 = stats();
    ZE_REQUIRE_OK(ze.zeMemGetIpcHandle(ctx, a, &msg.a));
    ZE_REQUIRE_OK(ze.zeMemGetIpcHandle(ctx, b, &msg.b));
    CHECK_EQ(stats().ipc_get, s0.ipc_get + 2);

    /* the Linux layout: fd, offset, type */
    int64_t fda, fdb;
    uint64_t off;
    memcpy(&fda, msg.a.data, 8);
    memcpy(&fdb, msg.b.data, 8);
    memcpy(&off, msg.a.data + 8, 8);
    CHECK_EQ(off, 0);
    CHECK_EQ((uint8_t)msg.a.data[16], ZE_MEMORY_TYPE_DEVICE);
    struct stat st;
    REQUIRE(fstat((int)fda, &st) == 0);
    CHECK(st.st_size >= (off_t)msg.a_size);

    /* refused exports, and the exporter's own open */
    ze_ipc_mem_handle_t h;
    ZE_EXPECT(ze.zeMemGetIpcHandle(ctx, (char *)a + 4096, &h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_REQUIRE_OK(alloc_shared(ctx, 4096, 0, 0, &sh));
    ZE_REQUIRE_OK(alloc_host(ctx, 4096, 0, &ho));
    ZE_EXPECT(ze.zeMemGetIpcHandle(ctx, sh, &h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ZE_EXPECT(ze.zeMemGetIpcHandle(ctx, ho, &h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    int local;
    ZE_EXPECT(ze.zeMemGetIpcHandle(ctx, &local, &h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    void *self = NULL;
    ZE_EXPECT(ze.zeMemOpenIpcHandle(ctx, devs[0], msg.a, 0, &self), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(self == NULL);
    ZE_OK(ze.zeMemFree(ctx, sh));
    ZE_OK(ze.zeMemFree(ctx, ho));

    int fds[2] = {(int)fda, (int)fdb};
    send_msg(sv[0], &msg, sizeof msg, fds, 2);
    ZE_OK(ze.zeMemFree(ctx, b)); /* the importer holds b's fd */
    CHECK(fcntl((int)fdb, F_GETFD) == -1); /* the driver closed its memfd */
    char c = 'g';
    REQUIRE(write(sv[0], &c, 1) == 1);
    char done = 0;
    ssize_t n = read(sv[0], &done, 1);
    CHECK(n == 1 && done == 'd');
    /* what the importer wrote */
    CHECK(all_bytes(imm[exp_dev], a, 0xc3, msg.a_size));
    ZE_OK(ze.zeMemFree(ctx, a));
    int st2 = 0;
    REQUIRE(waitpid(pid, &st2, 0) == pid);
    CHECK_MSG(WIFEXITED(st2) && WEXITSTATUS(st2) == 0, "importer exit status 0x%x", st2);
    close(sv[0]);
}

/* ---- failure injection ---- */

static void test_injection(void) {
    hm_test_set_context("injection");
    hm_ze_test_stats_t s0 = stats();
    uint64_t calls0 = ctl.call_count("zeMemAllocDevice");
    CHECK_EQ(ctl.fail_next("zeMemAllocDevice", 1, ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY), 0);
    void *p = (void *)(uintptr_t)0x5678;
    ZE_EXPECT(alloc_dev(ctx, 4096, 0, 0, &p), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    CHECK(p == (void *)(uintptr_t)0x5678);
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
    CHECK_EQ(stats().device_used[0], s0.device_used[0]);
    CHECK_EQ(ctl.call_count("zeMemAllocDevice"), calls0 + 1);
    ZE_OK(alloc_dev(ctx, 4096, 0, 0, &p)); /* once only */

    /* the second next call */
    CHECK_EQ(ctl.fail_next("zeMemAllocHost", 2, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    void *h1 = NULL, *h2 = NULL, *h3 = NULL;
    ZE_OK(alloc_host(ctx, 4096, 0, &h1));
    ZE_EXPECT(alloc_host(ctx, 4096, 0, &h2), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK(h2 == NULL);
    ZE_OK(alloc_host(ctx, 4096, 0, &h3));
    /* cancelled */
    CHECK_EQ(ctl.fail_next("zeMemAllocHost", 1, ZE_RESULT_ERROR_UNKNOWN), 0);
    CHECK_EQ(ctl.fail_next("zeMemAllocHost", 0, ZE_RESULT_SUCCESS), 0);
    ZE_OK(alloc_host(ctx, 4096, 0, &h2));
    /* reset drops pending injections */
    CHECK_EQ(ctl.fail_next("zeMemFree", 1, ZE_RESULT_ERROR_UNKNOWN), 0);
    ctl.reset();
    CHECK_EQ(ctl.call_count("zeMemFree"), 0);
    ZE_OK(ze.zeMemFree(ctx, h1));
    ZE_OK(ze.zeMemFree(ctx, h2));

    /* a failed free frees nothing */
    CHECK_EQ(ctl.fail_next("zeMemFree", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    ZE_EXPECT(ze.zeMemFree(ctx, h3), ZE_RESULT_ERROR_DEVICE_LOST);
    ze_memory_allocation_properties_t ap = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ZE_OK(ze.zeMemGetAllocProperties(ctx, h3, &ap, NULL));
    CHECK_EQ(ap.type, ZE_MEMORY_TYPE_HOST);
    ZE_OK(ze.zeMemFree(ctx, h3));

    /* a failed fill writes nothing */
    ZE_OK(fill_byte(imm[0], p, 0x11, 4096));
    CHECK_EQ(ctl.fail_next("zeCommandListAppendMemoryFill", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    ZE_EXPECT(fill_byte(imm[0], p, 0x22, 4096), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK(all_bytes(imm[0], p, 0x11, 4096));
    CHECK_EQ(ctl.fail_next("zeCommandListAppendMemoryCopy", 1, ZE_RESULT_ERROR_DEVICE_LOST), 0);
    uint8_t buf[64];
    memset(buf, 0, sizeof buf);
    ZE_EXPECT(copy(imm[0], buf, p, sizeof buf), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_EQ(buf[0], 0);
    ZE_OK(ze.zeMemFree(ctx, p));

    /* a failed context create makes none */
    uint64_t live = stats().live_contexts;
    CHECK_EQ(ctl.fail_next("zeContextCreate", 1, ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY), 0);
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t c = (ze_context_handle_t)(uintptr_t)0x99;
    ZE_EXPECT(ze.zeContextCreate(drv, &cd, &c), ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    CHECK(c == (ze_context_handle_t)(uintptr_t)0x99);
    CHECK_EQ(stats().live_contexts, live);

    /* a failed IPC export */
    ZE_OK(alloc_dev(ctx, 4096, 0, 0, &p));
    CHECK_EQ(ctl.fail_next("zeMemGetIpcHandle", 1, ZE_RESULT_ERROR_UNKNOWN), 0);
    ze_ipc_mem_handle_t h;
    memset(&h, 0x3c, sizeof h);
    ZE_EXPECT(ze.zeMemGetIpcHandle(ctx, p, &h), ZE_RESULT_ERROR_UNKNOWN);
    CHECK((uint8_t)h.data[0] == 0x3c && (uint8_t)h.data[63] == 0x3c);
    ZE_OK(ze.zeMemGetIpcHandle(ctx, p, &h));
    ZE_OK(ze.zeMemFree(ctx, p));

    CHECK_EQ(ctl.fail_next("zeNoSuchCall", 1, ZE_RESULT_ERROR_UNKNOWN), -1);
    CHECK_EQ(ctl.fail_next("zeMemFree", 1, ZE_RESULT_SUCCESS), -1);
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
}

/* ---- threads ---- */

struct worker {
    unsigned seed;
    int failures;
};

static void *work(void *arg) {
    struct worker *w = arg;
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    uint32_t d = w->seed % ndev;
    ze_command_list_handle_t l = NULL;
    if (ze.zeCommandListCreateImmediate(ctx, devs[d], &qd, &l) != ZE_RESULT_SUCCESS) {
        w->failures++;
        return NULL;
    }
    uint8_t buf[512];
    for (int i = 0; i < 200; i++) {
        size_t size = 1 + rand_r(&w->seed) % (200 * KIB);
        void *p = NULL, *h = NULL;
        if (alloc_dev(ctx, size, 0, d, &p) != ZE_RESULT_SUCCESS ||
            alloc_host(ctx, 512, 0, &h) != ZE_RESULT_SUCCESS) {
            w->failures++;
            break;
        }
        uint8_t v = (uint8_t)i;
        size_t n = size < sizeof buf ? size : sizeof buf;
        if (fill_byte(l, p, v, size) != ZE_RESULT_SUCCESS ||
            copy(l, h, (char *)p + size - n, n) != ZE_RESULT_SUCCESS ||
            copy(l, buf, h, n) != ZE_RESULT_SUCCESS)
            w->failures++;
        for (size_t k = 0; k < n; k++)
            if (buf[k] != v) {
                w->failures++;
                break;
            }
        if (ze.zeMemFree(ctx, p) != ZE_RESULT_SUCCESS || ze.zeMemFree(ctx, h) != ZE_RESULT_SUCCESS)
            w->failures++;
    }
    if (ze.zeCommandListDestroy(l) != ZE_RESULT_SUCCESS) w->failures++;
    return NULL;
}

static void test_threads(void) {
    hm_test_set_context("threads");
    hm_ze_test_stats_t s0 = stats();
    enum { N = 4 };
    pthread_t t[N];
    struct worker w[N];
    for (int i = 0; i < N; i++) {
        w[i].seed = (unsigned)i + 1;
        w[i].failures = 0;
        REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(w[i].failures == 0, "thread %d: %d failures", i, w[i].failures);
    }
    CHECK_EQ(stats().live_allocs, s0.live_allocs);
}

/* ---- fork while another thread is inside the driver ---- */

static _Atomic int busy_stop;

static void *busy(void *arg) {
    (void)arg;
    while (!busy_stop) {
        void *p = NULL;
        if (alloc_dev(ctx, 8192, 0, 0, &p) == ZE_RESULT_SUCCESS) {
            fill_byte(imm[0], p, 1, 8192);
            ze.zeMemFree(ctx, p);
        }
    }
    return NULL;
}

static void test_fork_busy(void) {
    hm_test_set_context("fork: the child has no driver");
    fflush(stdout);
    fflush(stderr);
    pid_t cp = fork();
    REQUIRE(cp >= 0);
    if (cp == 0) {
        void *p = NULL;
        uint32_t n = 0;
        int ok = alloc_dev(ctx, 4096, 0, 0, &p) == ZE_RESULT_ERROR_UNINITIALIZED && p == NULL;
        (void)ze.zeInit(ZE_INIT_FLAG_GPU_ONLY); /* a new zeInit changes nothing */
        ok = ok && ze.zeDeviceGet(drv, &n, NULL) == ZE_RESULT_ERROR_UNINITIALIZED;
        _exit(ok ? 0 : 1);
    }
    int cst = 0;
    REQUIRE(waitpid(cp, &cst, 0) == cp);
    CHECK_MSG(WIFEXITED(cst) && WEXITSTATUS(cst) == 0, "fork child: status 0x%x", cst);

    hm_test_set_context("fork while busy (option fork_child_works)");
    CHECK_EQ(ctl.set_option("fork_child_works", 1), 0);
    busy_stop = 0;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, busy, NULL) == 0);
    for (int i = 0; i < 20; i++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            /* The child: no lock left taken, the driver works. */
            void *p = NULL;
            int ok = alloc_dev(ctx, 4096, 0, 0, &p) == ZE_RESULT_SUCCESS &&
                     fill_byte(imm[0], p, 7, 4096) == ZE_RESULT_SUCCESS &&
                     all_bytes(imm[0], p, 7, 4096) && ze.zeMemFree(ctx, p) == ZE_RESULT_SUCCESS;
            _exit(ok ? 0 : 1);
        }
        int st = 0;
        REQUIRE(waitpid(pid, &st, 0) == pid);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child %d: status 0x%x", i, st);
    }
    busy_stop = 1;
    pthread_join(t, NULL);
    CHECK_EQ(ctl.set_option("fork_child_works", 0), 0);
}

/* ---- a context destroyed with memory alive ---- */

static void test_context_leaks(void) {
    hm_test_set_context("context leaks");
    hm_ze_test_stats_t s0 = stats();
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t c = NULL;
    ZE_REQUIRE_OK(ze.zeContextCreate(drv, &cd, &c));
    void *p = NULL, *q = NULL, *h = NULL;
    ZE_OK(alloc_dev(c, 4096, 0, 0, &p));
    ZE_OK(alloc_dev(c, 4096, 0, 0, &q));
    ZE_OK(alloc_host(c, 4096, 0, &h));
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t l = NULL;
    ZE_OK(ze.zeCommandListCreateImmediate(c, devs[0], &qd, &l));
    ze_result_t r = ze.zeContextDestroy(c);
    printf("context destroy with a command list alive: 0x%x\n", (unsigned)r);
    CHECK_EQ(r, ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    ZE_OK(ze.zeCommandListDestroy(l));
    CHECK_EQ(stats().live_allocs, s0.live_allocs + 3);
    ZE_OK(ze.zeContextDestroy(c));
    hm_ze_test_stats_t s1 = stats();
    CHECK_EQ(s1.leaks, s0.leaks + 3);
    CHECK_EQ(s1.live_allocs, s0.live_allocs);
    CHECK_EQ(s1.device_used[0], s0.device_used[0]);
    CHECK_EQ(s1.host_used, s0.host_used);
}

static void test_unsupported(void) {
    hm_test_set_context("empty slots");
    ze_fence_desc_t fd = {ZE_STRUCTURE_TYPE_FENCE_DESC, NULL, 0};
    ze_fence_handle_t f = NULL;
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_DEFAULT, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_queue_handle_t q = NULL;
    ZE_REQUIRE_OK(ze.zeCommandQueueCreate(ctx, devs[0], &qd, &q));
    ZE_EXPECT(ze.zeFenceCreate(q, &fd, &f), empty_slot());
    ZE_OK(ze.zeCommandQueueDestroy(q));
}

static void test_end(void) {
    hm_test_set_context("end");
    for (uint32_t i = 0; i < ndev; i++) ZE_OK(ze.zeCommandListDestroy(imm[i]));
    ZE_OK(ze.zeContextDestroy(ctx));
    hm_ze_test_stats_t s = stats();
    CHECK_EQ(s.live_allocs, 0);
    CHECK_EQ(s.live_ipc_mappings, 0);
    CHECK_EQ(s.live_ipc_refs, 0);
    CHECK_EQ(s.live_contexts, 0);
    CHECK_EQ(s.live_command_lists, 0);
    CHECK_EQ(s.host_used, 0);
    for (uint32_t i = 0; i < ndev; i++) CHECK_EQ(s.device_used[i], 0);
    printf("calls since the last reset: %llu allocs, %llu frees, %llu fills, %llu copies, %llu leaks\n",
           (unsigned long long)(s.alloc_device + s.alloc_host + s.alloc_shared),
           (unsigned long long)s.free, (unsigned long long)s.fill, (unsigned long long)s.copy,
           (unsigned long long)s.leaks);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    load();
    test_init();
    test_enumeration();
    test_contexts();
    test_foreign_handles();
    test_alloc();
    test_limits();
    test_device_faults();
    test_fill_copy();
    test_async();
    test_ipc();
    test_injection();
    test_threads();
    test_fork_busy();
    test_context_leaks();
    test_unsupported();
    test_end();
    return hm_test_finish();
}
