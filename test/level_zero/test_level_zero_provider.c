/* hetmem tests — the Level Zero provider through Debian's real loader and
 * the project's test driver (ze_test_driver.c, ZE_ENABLE_ALT_DRIVERS, set
 * by CTest): parameters and their errors, device identity, page sizes,
 * alignments, the device memory limit, injected driver failures and the
 * native error, fill and copy, allocation properties, free policies,
 * resident devices, the caller's own context, no loader at all; the
 * provider conformance suite for device, host and shared memory; the pool
 * conformance suite for every pool over each; calloc and realloc on device
 * memory; IPC with a separately exec'd importer over both descriptor
 * transports, two importing pools on one device making one driver open,
 * and a pool destroyed with a mapping open.
 * SPDX-License-Identifier: MIT
 *
 * Usage: test_level_zero_provider [unit|provider|pools|ipc|all|hardware|twodrivers]
 *        (hardware: the machine's own driver, skipped without an Intel GPU)
 *        test_level_zero_provider importer <socket fd> <transport>  (internal) */
#include "conformance.h"
#include "ze_test_driver.h"

#include <hetmem/providers/level_zero.h>
#include <hetmem/stream.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static const char *g_part;
#define PART(name) (strcmp(g_part, "all") == 0 || strcmp(g_part, (name)) == 0)

/* ---- the test driver's control API, from the library the loader loaded ---- */

static struct {
    hm_ze_test_reset_fn reset;
    hm_ze_test_get_stats_fn stats;
    hm_ze_test_call_count_fn calls;
    hm_ze_test_fail_next_fn fail_next;
    hm_ze_test_set_mem_limit_fn set_limit;
    hm_ze_test_run_queued_fn run_queued;
} drv;

static void driver_api(void) {
    const char *path = getenv("ZE_ENABLE_ALT_DRIVERS");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    CHECK_MSG(h != NULL, "the test driver (%s) is not loaded", path ? path : "unset");
    REQUIRE(h != NULL);
    drv.reset = (hm_ze_test_reset_fn)dlsym(h, "hm_ze_test_reset");
    drv.stats = (hm_ze_test_get_stats_fn)dlsym(h, "hm_ze_test_get_stats");
    drv.calls = (hm_ze_test_call_count_fn)dlsym(h, "hm_ze_test_call_count");
    drv.fail_next = (hm_ze_test_fail_next_fn)dlsym(h, "hm_ze_test_fail_next");
    drv.set_limit = (hm_ze_test_set_mem_limit_fn)dlsym(h, "hm_ze_test_set_mem_limit");
    drv.run_queued = (hm_ze_test_run_queued_fn)dlsym(h, "hm_ze_test_run_queued");
    REQUIRE(drv.reset && drv.stats && drv.calls && drv.fail_next && drv.set_limit &&
            drv.run_queued);
}

static hm_ze_test_stats_t stats(void) {
    hm_ze_test_stats_t s;
    drv.stats(&s);
    return s;
}

/* ---- providers ---- */

typedef struct lzf {
    hm_level_zero_memory_type_t type;
    int ordinal;
    int pool; /* 0 proxy, 1 native, 2 jemalloc */
} lzf_t;

static hm_result_t lz_provider(hm_level_zero_memory_type_t type, int ordinal, hm_provider_t **out) {
    hm_level_zero_params_t *p;
    hm_result_t r = hm_level_zero_params_create(&p);
    if (r != HM_SUCCESS) return r;
    if ((r = hm_level_zero_params_set_memory_type(p, type)) == HM_SUCCESS &&
        (r = hm_level_zero_params_set_ordinal(p, ordinal)) == HM_SUCCESS)
        r = hm_level_zero_provider_create(p, out);
    hm_level_zero_params_destroy(p);
    return r;
}

static hm_result_t make_provider(void *arg, hm_provider_t **out) {
    const lzf_t *f = arg;
    return lz_provider(f->type, f->ordinal, out);
}

static hm_result_t pool_over(int kind, hm_provider_t *prov, unsigned flags, hm_pool_t **out) {
    switch (kind) {
    case 0: return hm_proxy_pool_create(prov, flags, out);
    case 1: return hm_native_pool_create(prov, NULL, flags, out);
    default:
#ifdef HM_TEST_JEMALLOC
        return hm_jemalloc_pool_create(prov, NULL, flags, out);
#else
        return HM_ERROR_NOT_SUPPORTED;
#endif
    }
}

static hm_result_t make_pool(void *arg, hm_pool_t **out) {
    const lzf_t *f = arg;
    hm_provider_t *prov;
    hm_result_t r = make_provider(arg, &prov);
    if (r != HM_SUCCESS) return r;
    r = pool_over(f->pool, prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

static const char *type_name(hm_level_zero_memory_type_t t) {
    return t == HM_LEVEL_ZERO_MEMORY_DEVICE ? "device" : t == HM_LEVEL_ZERO_MEMORY_HOST ? "host"
                                                                                          : "shared";
}

/* ---- bytes through the provider's copy ---- */

static unsigned char pat(uint64_t seed, size_t i) {
    return (unsigned char)(((uint32_t)(i + seed) * 2654435761u) >> 24);
}
static unsigned char g_buf[8 * MIB];

static void dev_put(hm_provider_t *prov, void *dev, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) g_buf[i] = pat(seed, i);
    CHECK_OK(hm_provider_copy(prov, dev, g_buf, n));
}
static int dev_check(hm_provider_t *prov, const void *dev, size_t n, uint64_t seed) {
    memset(g_buf, 0x5a, n);
    if (hm_provider_copy(prov, g_buf, dev, n) != HM_SUCCESS) return 0;
    for (size_t i = 0; i < n; i++)
        if (g_buf[i] != pat(seed, i)) return 0;
    return 1;
}

/* ---- unit ---- */

static void test_params(void) {
    hm_test_set_context("params");
    hm_level_zero_params_t *p;
    CHECK_RES(hm_level_zero_params_create(NULL), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_level_zero_params_create(&p));
    int x;
    CHECK_RES(hm_level_zero_params_set_context(p, NULL, &x), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_context(p, &x, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_context(NULL, &x, &x), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_ordinal(p, -1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_memory_type(p, (hm_level_zero_memory_type_t)3),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_free_policy(p, (hm_level_zero_free_policy_t)7),
              HM_ERROR_INVALID_ARGUMENT);
    void *devs[65] = {0};
    CHECK_RES(hm_level_zero_params_set_resident_devices(p, devs, 65), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_resident_devices(p, devs, 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_params_set_resident_devices(p, NULL, 2), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_level_zero_params_set_resident_devices(p, NULL, 0));
    /* An ordinal that does not exist (the driver has 2 devices). */
    CHECK_OK(hm_level_zero_params_set_ordinal(p, 5));
    hm_provider_t *prov = NULL;
    CHECK_RES(hm_level_zero_provider_create(p, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK(prov == NULL);
    /* A context and a "device" that is no device of any driver. */
    hm_provider_t *good;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &good));
    CHECK_OK(hm_level_zero_params_set_context(p, &x, &x));
    CHECK_RES(hm_level_zero_provider_create(p, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_destroy(good));
    CHECK_OK(hm_level_zero_params_destroy(p));
    CHECK_RES(hm_level_zero_params_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
}

static void test_identity(void) {
    hm_test_set_context("identity, kinds, page sizes");
    hm_provider_t *d0, *d1, *h, *s;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &d0));
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 1, &d1));
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_HOST, 0, &h));
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_SHARED, 1, &s));
    hm_device_id_t a, b;
    CHECK_OK(hm_provider_get_device(d0, &a));
    CHECK_OK(hm_provider_get_device(d1, &b));
    CHECK(a.ordinal == 0 && b.ordinal == 1 && a.has_uuid && b.has_uuid);
    CHECK(memcmp(a.uuid, b.uuid, sizeof(a.uuid)) != 0);
    CHECK(hm_provider_memory_kind(d0) == HM_MEMORY_DEVICE && !hm_provider_cpu_accessible(d0));
    CHECK(hm_provider_memory_kind(h) == HM_MEMORY_HOST_PINNED && hm_provider_cpu_accessible(h));
    CHECK(hm_provider_memory_kind(s) == HM_MEMORY_SHARED && hm_provider_cpu_accessible(s));
    CHECK(hm_provider_caps(d0) & HM_PROVIDER_CAP_IPC);
    CHECK(!(hm_provider_caps(h) & HM_PROVIDER_CAP_IPC));
    CHECK(!(hm_provider_caps(s) & HM_PROVIDER_CAP_IPC));
    CHECK((hm_provider_caps(d0) & (HM_PROVIDER_CAP_FILL | HM_PROVIDER_CAP_COPY)) ==
          (HM_PROVIDER_CAP_FILL | HM_PROVIDER_CAP_COPY));
    CHECK_EQ(hm_provider_min_page_size(d0), 64 * KIB); /* the driver's pages */
    CHECK_EQ(hm_provider_min_page_size(h), 4 * KIB);
    CHECK_EQ(hm_provider_recommended_page_size(d0), 2 * MIB);
    CHECK(strcmp(hm_provider_name(d0), "level_zero(device)") == 0);
    CHECK_OK(hm_provider_destroy(d0));
    CHECK_OK(hm_provider_destroy(d1));
    CHECK_OK(hm_provider_destroy(h));
    CHECK_OK(hm_provider_destroy(s));
}

static void test_alloc(void) {
    hm_test_set_context("alignments, limit, driver failures, fill and copy, properties");
    hm_provider_t *d;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &d));
    const size_t aligns[] = {0, 4 * KIB, 64 * KIB, 2 * MIB, 16 * MIB};
    uint64_t last_id = 0;
    for (size_t i = 0; i < sizeof(aligns) / sizeof(aligns[0]); i++) {
        void *p = NULL;
        CHECK_OK(hm_provider_alloc(d, 100 * KIB, aligns[i], &p));
        if (!p) continue;
        CHECK_MSG(aligns[i] == 0 || ((uintptr_t)p & (aligns[i] - 1)) == 0,
                  "alignment %zu: %p", aligns[i], p);
        hm_level_zero_allocation_t ai;
        CHECK_OK(hm_level_zero_allocation_info(d, (char *)p + 1000, &ai));
        CHECK(ai.type == HM_LEVEL_ZERO_MEMORY_DEVICE && ai.base == p && ai.size == 100 * KIB);
        CHECK(ai.page_size == 64 * KIB && ai.device != NULL);
        CHECK_MSG(ai.id > last_id, "ids: %llu after %llu", (unsigned long long)ai.id,
                  (unsigned long long)last_id);
        last_id = ai.id;
        CHECK_OK(hm_provider_fill(d, p, 0xab, 100 * KIB));
        memset(g_buf, 0, 100 * KIB);
        CHECK_OK(hm_provider_copy(d, g_buf, p, 100 * KIB));
        int same = 1;
        for (size_t k = 0; k < 100 * KIB; k++) same &= g_buf[k] == 0xab;
        CHECK(same);
        dev_put(d, p, 100 * KIB, i);
        CHECK(dev_check(d, p, 100 * KIB, i));
        CHECK_OK(hm_provider_free(d, p, 100 * KIB));
    }
    char local[64];
    hm_level_zero_allocation_t ai;
    CHECK_RES(hm_level_zero_allocation_info(d, local, &ai), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_level_zero_allocation_info(d, NULL, &ai), HM_ERROR_INVALID_ARGUMENT);
    hm_provider_t *os;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, 0, &os));
    CHECK_RES(hm_level_zero_allocation_info(os, local, &ai), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_destroy(os));

    /* The device's limit: OUT_OF_DEVICE_MEMORY is HM_ERROR_OUT_OF_MEMORY. */
    drv.set_limit(32 * MIB);
    void *big[4] = {0};
    int n = 0;
    hm_result_t r = HM_SUCCESS;
    while (n < 4 && (r = hm_provider_alloc(d, 12 * MIB, 0, &big[n])) == HM_SUCCESS) n++;
    CHECK_EQ(n, 2);
    CHECK_RES(r, HM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(hm_last_native_error(NULL), (int64_t)ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    CHECK_OK(hm_provider_free(d, big[0], 12 * MIB));
    CHECK_OK(hm_provider_alloc(d, 12 * MIB, 0, &big[0])); /* room again */
    for (int i = 0; i < n; i++) CHECK_OK(hm_provider_free(d, big[i], 12 * MIB));
    drv.set_limit(256 * MIB);

    /* Any other driver failure: HM_ERROR_DRIVER with the native code. */
    void *p = NULL;
    REQUIRE(drv.fail_next("zeMemAllocDevice", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(hm_provider_alloc(d, 4096, 0, &p), HM_ERROR_DRIVER);
    CHECK(p == NULL);
    CHECK_EQ(hm_last_native_error(NULL), (int64_t)ZE_RESULT_ERROR_DEVICE_LOST);
    REQUIRE_OK(hm_provider_alloc(d, 4096, 0, &p));
    REQUIRE(drv.fail_next("zeCommandListAppendMemoryFill", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(hm_provider_fill(d, p, 1, 4096), HM_ERROR_DRIVER);
    REQUIRE(drv.fail_next("zeCommandListAppendMemoryCopy", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(hm_provider_copy(d, g_buf, p, 4096), HM_ERROR_DRIVER);
    CHECK_OK(hm_provider_fill(d, p, 1, 4096));
    CHECK_OK(hm_provider_free(d, p, 4096));
    CHECK_OK(hm_provider_destroy(d));
    CHECK_EQ(stats().live_allocs, 0);
}

static void test_policies_resident(void) {
    hm_test_set_context("free policies, resident devices");
    for (int pol = 0; pol <= 2; pol++) {
        hm_level_zero_params_t *p;
        REQUIRE_OK(hm_level_zero_params_create(&p));
        CHECK_OK(hm_level_zero_params_set_free_policy(p, (hm_level_zero_free_policy_t)pol));
        hm_provider_t *d;
        hm_result_t r = hm_level_zero_provider_create(p, &d);
        CHECK_OK(r);
        if (r == HM_SUCCESS) {
            uint64_t ext0 = drv.calls("zeMemFreeExt");
            void *m = NULL;
            CHECK_OK(hm_provider_alloc(d, 8192, 0, &m));
            CHECK_OK(hm_provider_free(d, m, 8192));
            CHECK_EQ(drv.calls("zeMemFreeExt") - ext0, pol ? 1u : 0u);
            CHECK_OK(hm_provider_destroy(d));
        }
        hm_level_zero_params_destroy(p);
    }
    /* Resident on both devices: two zeContextMakeMemoryResident per alloc. */
    hm_provider_t *d0, *d1;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &d0));
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 1, &d1));
    void *m = NULL;
    CHECK_OK(hm_provider_alloc(d0, 4096, 0, &m));
    hm_level_zero_allocation_t a0, a1;
    CHECK_OK(hm_level_zero_allocation_info(d0, m, &a0));
    CHECK_OK(hm_provider_free(d0, m, 4096));
    CHECK_OK(hm_provider_alloc(d1, 4096, 0, &m));
    CHECK_OK(hm_level_zero_allocation_info(d1, m, &a1));
    CHECK_OK(hm_provider_free(d1, m, 4096));
    void *devs[2] = {a0.device, a1.device};
    hm_level_zero_params_t *p;
    REQUIRE_OK(hm_level_zero_params_create(&p));
    CHECK_OK(hm_level_zero_params_set_resident_devices(p, devs, 2));
    hm_provider_t *r;
    REQUIRE_OK(hm_level_zero_provider_create(p, &r));
    uint64_t res0 = drv.calls("zeContextMakeMemoryResident");
    CHECK_OK(hm_provider_alloc(r, 4096, 0, &m));
    CHECK_EQ(drv.calls("zeContextMakeMemoryResident") - res0, 2u);
    REQUIRE(drv.fail_next("zeContextMakeMemoryResident", 2, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    void *m2 = NULL;
    uint64_t live = stats().live_allocs;
    CHECK_RES(hm_provider_alloc(r, 4096, 0, &m2), HM_ERROR_DRIVER);
    CHECK_EQ(stats().live_allocs, live); /* the half-made allocation went back */
    CHECK_OK(hm_provider_free(r, m, 4096));
    CHECK_OK(hm_provider_destroy(r));
    hm_level_zero_params_destroy(p);
    /* The caller's own context and device. */
    void *loader = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(loader != NULL);
    __typeof__(zeContextCreate) *ctx_create = (__typeof__(zeContextCreate) *)dlsym(loader, "zeContextCreate");
    __typeof__(zeContextDestroy) *ctx_destroy = (__typeof__(zeContextDestroy) *)dlsym(loader, "zeContextDestroy");
    __typeof__(zeDeviceGetProperties) *dev_props = (__typeof__(zeDeviceGetProperties) *)dlsym(loader, "zeDeviceGetProperties");
    __typeof__(zeDriverGet) *drv_get = (__typeof__(zeDriverGet) *)dlsym(loader, "zeDriverGet");
    REQUIRE(ctx_create && ctx_destroy && dev_props && drv_get);
    uint32_t nd = 1;
    ze_driver_handle_t driver;
    REQUIRE(drv_get(&nd, &driver) == ZE_RESULT_SUCCESS && nd == 1);
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    ze_context_handle_t ctx;
    REQUIRE(ctx_create(driver, &cd, &ctx) == ZE_RESULT_SUCCESS);
    REQUIRE_OK(hm_level_zero_params_create(&p));
    CHECK_OK(hm_level_zero_params_set_context(p, ctx, a1.device));
    hm_provider_t *mine;
    CHECK_OK(hm_level_zero_provider_create(p, &mine));
    hm_device_id_t id;
    CHECK_OK(hm_provider_get_device(mine, &id));
    CHECK_EQ(id.ordinal, 1);
    uint64_t made = stats().context_create;
    CHECK_OK(hm_provider_alloc(mine, 4096, 0, &m));
    CHECK_OK(hm_provider_free(mine, m, 4096));
    CHECK_OK(hm_provider_destroy(mine));
    CHECK_EQ(stats().context_create, made); /* none of its own */
    CHECK(ctx_destroy(ctx) == ZE_RESULT_SUCCESS); /* still the caller's to destroy */
    hm_level_zero_params_destroy(p);
    CHECK_OK(hm_provider_destroy(d0));
    CHECK_OK(hm_provider_destroy(d1));
}

/* Sizes above the device's maxMemAllocSize (the driver's: half its memory)
 * carry the relaxed-limits descriptor: they succeed up to the memory, and
 * beyond it are HM_ERROR_OUT_OF_MEMORY. */
static void test_relaxed_limit(void) {
    hm_test_set_context("above maxMemAllocSize");
    drv.set_limit(32 * MIB); /* maxMemAllocSize 16 MiB */
    const hm_level_zero_memory_type_t types[] = {HM_LEVEL_ZERO_MEMORY_DEVICE,
                                                 HM_LEVEL_ZERO_MEMORY_HOST,
                                                 HM_LEVEL_ZERO_MEMORY_SHARED};
    for (int t = 0; t < 3; t++) {
        hm_provider_t *d;
        REQUIRE_OK(lz_provider(types[t], 0, &d));
        void *p = NULL;
        hm_result_t r = hm_provider_alloc(d, 24 * MIB, 0, &p);
        CHECK_MSG(r == HM_SUCCESS && p, "%s: 24 MiB above a 16 MiB maxMemAllocSize: %s (0x%llx)",
                  type_name(types[t]), hm_result_string(r),
                  (unsigned long long)hm_last_native_error(NULL));
        if (p) {
            if (types[t] == HM_LEVEL_ZERO_MEMORY_DEVICE) {
                CHECK_OK(hm_provider_fill(d, (char *)p + 24 * MIB - 4096, 0x3c, 4096));
                CHECK_OK(hm_provider_copy(d, g_buf, (char *)p + 24 * MIB - 4096, 4096));
                CHECK(g_buf[0] == 0x3c && g_buf[4095] == 0x3c);
            }
            CHECK_OK(hm_provider_free(d, p, 24 * MIB));
        }
        void *q = NULL;
        CHECK_RES(hm_provider_alloc(d, 40 * MIB, 0, &q), HM_ERROR_OUT_OF_MEMORY);
        CHECK(q == NULL);
        CHECK_OK(hm_provider_destroy(d));
    }
    drv.set_limit(256 * MIB);
}

/* A fork child: Level Zero does not work there (the driver answers
 * UNINITIALIZED to every call). The provider calls nothing: allocation,
 * fill, copy, create answer HM_ERROR_NOT_SUPPORTED with one log line; free
 * and destroy forget the parent's memory. */
static _Atomic int g_log_lines;
static void count_sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    if (level >= HM_LOG_ERROR && strstr(line, "Level Zero provider") && strstr(line, "fork child"))
        atomic_fetch_add(&g_log_lines, 1);
}
static int fork_child_steps(hm_provider_t *d, hm_pool_t *pool, void *blk, void *pblk) {
    hm_log_set_sink(count_sink, NULL);
    hm_log_set_level(HM_LOG_ERROR);
    hm_ze_test_stats_t s0 = stats();
    uint64_t c0 = drv.calls("zeMemAllocDevice") + drv.calls("zeMemFree") +
                  drv.calls("zeCommandListAppendMemoryFill") +
                  drv.calls("zeCommandListAppendMemoryCopy") + drv.calls("zeContextDestroy") +
                  drv.calls("zeCommandListDestroy") + drv.calls("zeDriverGet");
    void *p = (void *)1;
    if (hm_provider_alloc(d, 4096, 0, &p) != HM_ERROR_NOT_SUPPORTED || p) return 10;
    if (hm_provider_fill(d, blk, 1, 4096) != HM_ERROR_NOT_SUPPORTED) return 11;
    if (hm_provider_copy(d, g_buf, blk, 4096) != HM_ERROR_NOT_SUPPORTED) return 12;
    hm_level_zero_allocation_t ai;
    if (hm_level_zero_allocation_info(d, blk, &ai) != HM_ERROR_NOT_SUPPORTED) return 13;
    hm_provider_t *other = NULL;
    if (lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &other) != HM_ERROR_NOT_SUPPORTED || other)
        return 14;
    if (hm_provider_free(d, blk, 4096) != HM_SUCCESS) return 15;
    (void)pblk; /* the pool's block: destroyed with the pool */
    if (hm_pool_destroy(pool) != HM_SUCCESS) return 16;
    if (hm_provider_destroy(d) != HM_SUCCESS) return 17;
    uint64_t c1 = drv.calls("zeMemAllocDevice") + drv.calls("zeMemFree") +
                  drv.calls("zeCommandListAppendMemoryFill") +
                  drv.calls("zeCommandListAppendMemoryCopy") + drv.calls("zeContextDestroy") +
                  drv.calls("zeCommandListDestroy") + drv.calls("zeDriverGet");
    if (c1 != c0) return 18; /* no driver call at all */
    if (stats().live_allocs != s0.live_allocs) return 19;
    if (atomic_load(&g_log_lines) != 1) return 20 + (atomic_load(&g_log_lines) > 1);
    return 0;
}
static void test_fork_child(void) {
    hm_test_set_context("fork child");
    hm_provider_t *d, *pd;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &d));
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &pd));
    hm_pool_t *pool;
    REQUIRE_OK(pool_over(1, pd, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    void *blk = NULL;
    REQUIRE_OK(hm_provider_alloc(d, 4096, 0, &blk));
    CHECK_OK(hm_provider_fill(d, blk, 7, 4096)); /* the command list exists */
    void *pblk = hm_pool_malloc(pool, 1000);
    REQUIRE(pblk);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(fork_child_steps(d, pool, blk, pblk));
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child failed at step %d (status 0x%x)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, st);
    /* the parent's memory is untouched */
    CHECK_OK(hm_provider_copy(d, g_buf, blk, 4096));
    CHECK(g_buf[0] == 7 && g_buf[4095] == 7);
    CHECK_OK(hm_pool_free(pool, pblk));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_OK(hm_provider_free(d, blk, 4096));
    CHECK_OK(hm_provider_destroy(d));
}

/* ---- streams: the stream ops on the program's immediate command lists ---- */

#define ZE_LOADER_FNS(X)                                                                  \
    X(zeDriverGet) X(zeDeviceGet) X(zeContextCreate) X(zeContextDestroy)                  \
    X(zeCommandListCreateImmediate) X(zeCommandListDestroy) X(zeCommandListAppendMemoryFill)
static struct {
#define X(name) __typeof__(name) *name;
    ZE_LOADER_FNS(X)
#undef X
} zl;

static void loader_fns(void) {
    void *h = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h != NULL);
#define X(name) *(void **)&zl.name = dlsym(h, #name); REQUIRE(zl.name != NULL);
    ZE_LOADER_FNS(X)
#undef X
}

static ze_command_list_handle_t imm_list(ze_context_handle_t c, ze_device_handle_t d,
                                         ze_command_queue_mode_t mode) {
    ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, .mode = mode};
    ze_command_list_handle_t l = NULL;
    REQUIRE(zl.zeCommandListCreateImmediate(c, d, &qd, &l) == ZE_RESULT_SUCCESS);
    return l;
}

/* A fill queued on the list (an asynchronous list runs it later). */
static void queue_fill(ze_command_list_handle_t l, void *p, uint8_t v, size_t n) {
    CHECK(zl.zeCommandListAppendMemoryFill(l, p, &v, 1, n, NULL, 0, NULL) == ZE_RESULT_SUCCESS);
}

/* The first byte of provider memory, by the provider's copy. */
static int first_byte(hm_provider_t *prov, const void *p) {
    uint8_t b = 0;
    return hm_provider_copy(prov, &b, p, 1) == HM_SUCCESS ? b : -1;
}

typedef struct stream_env {
    ze_context_handle_t ctx;
    ze_device_handle_t dev;
    hm_provider_t *prov;
    const hm_provider_ops_t *ops;
    void *st;
} stream_env_t;

static void stream_env_init(stream_env_t *v) {
    uint32_t n = 1;
    ze_driver_handle_t d;
    REQUIRE(zl.zeDriverGet(&n, &d) == ZE_RESULT_SUCCESS && n == 1);
    n = 1;
    REQUIRE(zl.zeDeviceGet(d, &n, &v->dev) == ZE_RESULT_SUCCESS && n == 1);
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    REQUIRE(zl.zeContextCreate(d, &cd, &v->ctx) == ZE_RESULT_SUCCESS);
    hm_level_zero_params_t *p;
    REQUIRE_OK(hm_level_zero_params_create(&p));
    REQUIRE_OK(hm_level_zero_params_set_context(p, v->ctx, v->dev));
    REQUIRE_OK(hm_level_zero_provider_create(p, &v->prov));
    hm_level_zero_params_destroy(p);
    v->ops = hm_provider_get_ops(v->prov);
    v->st = hm_provider_get_state(v->prov);
}

static void stream_env_fini(stream_env_t *v) {
    CHECK_OK(hm_provider_destroy(v->prov));
    CHECK(zl.zeContextDestroy(v->ctx) == ZE_RESULT_SUCCESS); /* no pool or event left */
}

/* A fork child: every event op that needs the driver is refused, destroy
 * calls nothing. */
static int stream_fork_child(stream_env_t *v, void *ev, ze_command_list_handle_t l) {
    uint64_t c0 = drv.calls("zeEventQueryStatus") + drv.calls("zeEventDestroy") +
                  drv.calls("zeEventCreate") + drv.calls("zeEventHostSynchronize") +
                  drv.calls("zeCommandListAppendSignalEvent") + drv.calls("zeEventPoolDestroy");
    void *other = NULL;
    if (v->ops->stream.event_query(v->st, ev) != HM_ERROR_NOT_SUPPORTED) return 10;
    if (v->ops->stream.event_sync(v->st, ev) != HM_ERROR_NOT_SUPPORTED) return 11;
    if (v->ops->stream.event_record(v->st, ev, l) != HM_ERROR_NOT_SUPPORTED) return 12;
    if (v->ops->stream.event_create(v->st, &other) != HM_ERROR_NOT_SUPPORTED) return 13;
    v->ops->stream.event_destroy(v->st, ev);
    if (hm_provider_destroy(v->prov) != HM_SUCCESS) return 14;
    uint64_t c1 = drv.calls("zeEventQueryStatus") + drv.calls("zeEventDestroy") +
                  drv.calls("zeEventCreate") + drv.calls("zeEventHostSynchronize") +
                  drv.calls("zeCommandListAppendSignalEvent") + drv.calls("zeEventPoolDestroy");
    return c1 == c0 ? 0 : 15;
}

/* Stream-ordered allocation (hetmem/stream.h) with immediate command lists
 * as streams: a block freed on one list goes back to it at once, to
 * another only once the first list's work (a queued fill) has run. */
static void test_stream_pools(void) {
    hm_test_set_context("stream-ordered allocation on immediate command lists");
    loader_fns();
    stream_env_t v;
    stream_env_init(&v);
    hm_pool_t *pool;
    REQUIRE_OK(hm_native_pool_create(v.prov, NULL, 0, &pool));
    ze_command_list_handle_t a = imm_list(v.ctx, v.dev, ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    ze_command_list_handle_t b = imm_list(v.ctx, v.dev, ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    const size_t n = 64 * KIB;
    void *p = hm_pool_malloc_async(pool, n, a);
    REQUIRE(p);
    queue_fill(a, p, 1, n);
    CHECK_OK(hm_pool_free_async(pool, p, a));
    void *q = hm_pool_malloc_async(pool, n, b);
    CHECK_MSG(q && q != p, "a block freed on list a went to list b while a's fill was queued");
    void *r = hm_pool_malloc_async(pool, n, a);
    CHECK_MSG(r == p, "list a did not get its own block back at once");
    queue_fill(a, r, 2, n);
    CHECK_OK(hm_pool_free_async(pool, r, a));
    void *c = hm_pool_malloc_async(pool, n, b); /* records an event on a: pending */
    CHECK(c && c != p);
    CHECK(drv.run_queued() > 0); /* the device catches up */
    void *d = hm_pool_malloc_async(pool, n, b);
    CHECK_MSG(d == p, "list b did not reuse a's block once a's work had run");
    CHECK_EQ(first_byte(v.prov, d), 2);
    CHECK_OK(hm_pool_free(pool, q));
    CHECK_OK(hm_pool_free(pool, c));
    CHECK_OK(hm_pool_free_async(pool, d, b));
    CHECK_OK(hm_pool_stream_forget(pool, a));
    CHECK_OK(hm_pool_stream_forget(pool, b));
    CHECK(zl.zeCommandListDestroy(a) == ZE_RESULT_SUCCESS);
    CHECK(zl.zeCommandListDestroy(b) == ZE_RESULT_SUCCESS);
    CHECK_OK(hm_pool_destroy(pool));
    stream_env_fini(&v);
}

static void test_streams(void) {
    hm_test_set_context("streams: events on immediate command lists");
    loader_fns();
    hm_ze_test_stats_t s0 = stats();
    stream_env_t v;
    stream_env_init(&v);
    const hm_provider_ops_t *o = v.ops;
    CHECK(hm_provider_caps(v.prov) & HM_PROVIDER_CAP_STREAMS);
    ze_command_list_handle_t a = imm_list(v.ctx, v.dev, ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    ze_command_list_handle_t sy = imm_list(v.ctx, v.dev, ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS);
    void *m = NULL;
    REQUIRE_OK(hm_provider_alloc(v.prov, 64 * KIB, 0, &m));
    CHECK_OK(hm_provider_fill(v.prov, m, 0, 64 * KIB));

    /* never recorded: complete */
    void *ev = NULL;
    uint64_t pools = drv.calls("zeEventPoolCreate");
    REQUIRE_OK(o->stream.event_create(v.st, &ev));
    CHECK_EQ(drv.calls("zeEventPoolCreate"), pools + 1);
    CHECK_EQ(stats().live_events, s0.live_events + 1);
    CHECK_OK(o->stream.event_query(v.st, ev));
    CHECK_OK(o->stream.event_sync(v.st, ev));

    /* recorded after a queued fill: busy until synchronized */
    queue_fill(a, m, 0x11, 64 * KIB);
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    CHECK_EQ(stats().queued_commands, 2);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_BUSY);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_BUSY);
    CHECK_EQ(first_byte(v.prov, m), 0);
    CHECK_OK(o->stream.event_sync(v.st, ev));
    CHECK_OK(o->stream.event_query(v.st, ev));
    CHECK_EQ(first_byte(v.prov, m), 0x11);
    CHECK_EQ(stats().queued_commands, 0);

    /* re-recorded after completion: reset and reused; the device catching
     * up completes it without a sync */
    uint64_t resets = drv.calls("zeEventHostReset"), creates = drv.calls("zeEventCreate");
    queue_fill(a, m, 0x22, 64 * KIB);
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    CHECK_EQ(drv.calls("zeEventHostReset"), resets + 1);
    CHECK_EQ(drv.calls("zeEventCreate"), creates);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_BUSY);
    CHECK_EQ(drv.run_queued(), 2);
    CHECK_OK(o->stream.event_query(v.st, ev));
    CHECK_EQ(first_byte(v.prov, m), 0x22);

    /* re-recorded while its signal is queued: a new driver event; the old
     * one is destroyed once it completes */
    queue_fill(a, m, 0x33, 64 * KIB);
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    queue_fill(a, m, 0x44, 64 * KIB);
    uint64_t destroys = drv.calls("zeEventDestroy");
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    CHECK_EQ(drv.calls("zeEventCreate"), creates + 1);
    CHECK_EQ(stats().live_events, s0.live_events + 2);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_BUSY);
    CHECK_OK(o->stream.event_sync(v.st, ev));
    CHECK_EQ(first_byte(v.prov, m), 0x44);
    void *ev2 = NULL;
    REQUIRE_OK(o->stream.event_create(v.st, &ev2)); /* reaps the retired one */
    CHECK_EQ(drv.calls("zeEventDestroy"), destroys + 1);
    CHECK_EQ(stats().live_events, s0.live_events + 2);

    /* destroyed while pending: kept from the driver until complete */
    queue_fill(a, m, 0x55, 64 * KIB);
    CHECK_OK(o->stream.event_record(v.st, ev2, a));
    destroys = drv.calls("zeEventDestroy");
    o->stream.event_destroy(v.st, ev2);
    CHECK_EQ(drv.calls("zeEventDestroy"), destroys);
    CHECK_EQ(stats().live_events, s0.live_events + 2);
    CHECK_EQ(drv.run_queued(), 2);
    REQUIRE_OK(o->stream.event_create(v.st, &ev2));
    CHECK_EQ(drv.calls("zeEventDestroy"), destroys + 1);
    o->stream.event_destroy(v.st, ev2); /* never recorded: destroyed at once */
    CHECK_EQ(drv.calls("zeEventDestroy"), destroys + 2);
    CHECK_EQ(stats().live_events, s0.live_events + 1);

    /* a synchronous list: complete at once; a NULL stream is refused */
    CHECK_OK(o->stream.event_record(v.st, ev, sy));
    CHECK_OK(o->stream.event_query(v.st, ev));
    CHECK_RES(o->stream.event_record(v.st, ev, NULL), HM_ERROR_INVALID_ARGUMENT);

    /* more events than a pool holds: a second pool */
    void *many[70];
    for (int i = 0; i < 70; i++) REQUIRE_OK(o->stream.event_create(v.st, &many[i]));
    CHECK_EQ(drv.calls("zeEventPoolCreate"), pools + 2);
    for (int i = 0; i < 70; i++) {
        if (i % 2) CHECK_OK(o->stream.event_record(v.st, many[i], a));
        o->stream.event_destroy(v.st, many[i]);
    }
    CHECK_EQ(drv.run_queued(), 35);

    /* injected failures: HM_ERROR_DRIVER with the native code */
    void *bad = NULL;
    REQUIRE(drv.fail_next("zeEventCreate", 1, ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY) == 0);
    CHECK_RES(o->stream.event_create(v.st, &bad), HM_ERROR_OUT_OF_MEMORY);
    CHECK(bad == NULL);
    CHECK_EQ(hm_last_native_error(NULL), (int64_t)ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    REQUIRE(drv.fail_next("zeEventCreate", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(o->stream.event_create(v.st, &bad), HM_ERROR_DRIVER);
    CHECK_EQ(hm_last_native_error(NULL), (int64_t)ZE_RESULT_ERROR_DEVICE_LOST);
    queue_fill(a, m, 0x66, 64 * KIB);
    REQUIRE(drv.fail_next("zeCommandListAppendSignalEvent", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(o->stream.event_record(v.st, ev, a), HM_ERROR_DRIVER);
    CHECK_OK(o->stream.event_query(v.st, ev)); /* left as never recorded */
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    REQUIRE(drv.fail_next("zeEventQueryStatus", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_DRIVER);
    CHECK_EQ(hm_last_native_error(NULL), (int64_t)ZE_RESULT_ERROR_DEVICE_LOST);
    REQUIRE(drv.fail_next("zeEventHostSynchronize", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(o->stream.event_sync(v.st, ev), HM_ERROR_DRIVER);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_BUSY); /* still queued */
    CHECK_OK(o->stream.event_sync(v.st, ev));
    REQUIRE(drv.fail_next("zeEventQueryStatus", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(o->stream.event_record(v.st, ev, a), HM_ERROR_DRIVER);
    REQUIRE(drv.fail_next("zeEventHostReset", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    CHECK_RES(o->stream.event_record(v.st, ev, a), HM_ERROR_DRIVER);
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    CHECK_OK(o->stream.event_sync(v.st, ev));
    /* a refused destroy: the event stays the driver's until the provider's
     * destroy tries again */
    REQUIRE_OK(o->stream.event_create(v.st, &bad));
    destroys = drv.calls("zeEventDestroy");
    REQUIRE(drv.fail_next("zeEventDestroy", 1, ZE_RESULT_ERROR_DEVICE_LOST) == 0);
    o->stream.event_destroy(v.st, bad);
    CHECK_EQ(stats().live_events, s0.live_events + 2);
    /* a pool the driver will not make: no event */
    stream_env_t w;
    stream_env_init(&w);
    REQUIRE(drv.fail_next("zeEventPoolCreate", 1, ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY) == 0);
    CHECK_RES(w.ops->stream.event_create(w.st, &bad), HM_ERROR_OUT_OF_HOST_MEMORY);
    REQUIRE_OK(w.ops->stream.event_create(w.st, &bad));
    w.ops->stream.event_destroy(w.st, bad);
    stream_env_fini(&w);

    /* a fork child calls no driver */
    queue_fill(a, m, 0x77, 64 * KIB);
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(stream_fork_child(&v, ev, a));
    int wst = 0;
    REQUIRE(waitpid(pid, &wst, 0) == pid);
    CHECK_MSG(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "stream fork child failed at step %d",
              WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    CHECK_RES(o->stream.event_query(v.st, ev), HM_ERROR_BUSY);

    /* the provider's destroy waits for a retired event and destroys the
     * rest: the program's context then has no pool or event of it */
    queue_fill(a, m, 0x88, 64 * KIB);
    CHECK_OK(o->stream.event_record(v.st, ev, a));
    o->stream.event_destroy(v.st, ev);
    CHECK_OK(hm_provider_free(v.prov, m, 64 * KIB)); /* runs the fills first */
    CHECK(zl.zeCommandListDestroy(a) == ZE_RESULT_SUCCESS);
    CHECK(zl.zeCommandListDestroy(sy) == ZE_RESULT_SUCCESS);
    stream_env_fini(&v);
    CHECK_EQ(stats().live_events, s0.live_events);
    CHECK_EQ(stats().queued_commands, 0);
}

/* Teardown at exit: pools destroyed by an atexit handler registered before
 * the first provider (it runs after the provider's) and by a destructor of
 * the executable: no call reaches a torn-down driver (it reports any on
 * HM_ZE_TEST_TEARDOWN_REPORT), no crash, every destroy succeeds. Run in an
 * exec'd child whose exit the parent watches. (The executable's destructors
 * run before those of the libraries it needs, the driver's included; a
 * destructor of a library loaded before the loader is the case that reaches
 * a torn-down driver.) */
static hm_pool_t *g_exit_pool[2];
static int g_report_fd = -1;
static void report(const char *what, hm_result_t r) {
    char line[128];
    int n = snprintf(line, sizeof line, "%s: %s\n", what, hm_result_string(r));
    if (g_report_fd >= 0 && write(g_report_fd, line, (size_t)n) < 0) { /* nothing to do */ }
}
static void exit_destroy(void) {
    if (g_exit_pool[0]) report("atexit destroy", hm_pool_destroy(g_exit_pool[0]));
}
__attribute__((destructor)) static void dtor_destroy(void) {
    if (g_exit_pool[1]) report("destructor destroy", hm_pool_destroy(g_exit_pool[1]));
}
static int teardown_child(void) {
    const char *fd = getenv("HM_ZE_TEST_TEARDOWN_REPORT");
    if (!fd) return 2;
    g_report_fd = atoi(fd);
    if (atexit(exit_destroy) != 0) return 3;
    for (int i = 0; i < 2; i++) {
        hm_provider_t *d;
        if (lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &d) != HM_SUCCESS) return 4;
        if (pool_over(1, d, HM_POOL_FLAG_OWN_PROVIDER, &g_exit_pool[i]) != HM_SUCCESS) return 5;
        void *p = hm_pool_malloc(g_exit_pool[i], 100 * KIB); /* left allocated */
        if (!p || hm_provider_fill(d, p, 1, 100 * KIB) != HM_SUCCESS) return 6;
    }
    return 0; /* exit: the atexit handler, then destructors */
}
static void test_teardown(const char *self) {
    hm_test_set_context("teardown at exit");
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        char num[16];
        snprintf(num, sizeof num, "%d", pfd[1]);
        setenv("HM_ZE_TEST_TEARDOWN_REPORT", num, 1);
        execl(self, self, "teardown", (char *)NULL);
        _exit(99);
    }
    close(pfd[1]);
    char out[4096];
    (void)hm_test_read_all(pfd[0], out, sizeof out);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "teardown child: status 0x%x; it reported:\n%s",
              st, out);
    CHECK_MSG(strstr(out, "after teardown") == NULL, "calls after the driver's teardown:\n%s", out);
    CHECK_MSG(strstr(out, "atexit destroy: success") && strstr(out, "destructor destroy: success"),
              "destroys at exit:\n%s", out);
}

/* Without a loader: a clear NOT_SUPPORTED (in a child, before it loads one). */
static void test_no_loader(const char *self) {
    hm_test_set_context("no loader");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("HM_LEVEL_ZERO_LOADER", "/nonexistent/libze_loader.so.1", 1);
        execl(self, self, "noloader", (char *)NULL);
        _exit(99);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "no-loader child: status 0x%x", st);
}
static int no_loader_child(void) {
    hm_provider_t *p = NULL;
    if (lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &p) != HM_ERROR_NOT_SUPPORTED || p) return 1;
    /* the rest of hetmem is unchanged */
    hm_provider_t *os;
    if (hm_test_os_provider(HM_OS_PRIVATE, 0, &os) != HM_SUCCESS) return 2;
    hm_pool_t *pool;
    if (hm_native_pool_create(os, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) return 3;
    void *m = hm_pool_malloc(pool, 100);
    if (!m || hm_pool_free(pool, m) != HM_SUCCESS) return 4;
    return hm_pool_destroy(pool) == HM_SUCCESS ? 0 : 5;
}

/* ---- suites ---- */

static void run_suites_provider(void) {
    for (int t = 0; t < 3; t++) {
        lzf_t f = {.type = (hm_level_zero_memory_type_t)t, .ordinal = t == 2 ? 1 : 0};
        char label[64];
        snprintf(label, sizeof(label), "level_zero %s", type_name(f.type));
        hm_test_suite_opts_t opts = {.can_free = 1, .max_alloc = 32 * MIB};
        hm_test_provider_suite(label, make_provider, &f, &opts);
    }
}

static void run_suites_pools(void) {
    /* Room for four threads' heaps of every pool (the driver counts pages
     * it never touches: memfds fill lazily). */
    drv.set_limit((uint64_t)4 << 30);
    for (int t = 0; t < 3; t++) {
#if defined(HM_TSAN)
        /* Under TSan, device and host memory: shared memory takes the pools
         * through the same (CPU-accessible) paths as host memory, and the
         * provider part covers it. */
        if (t == HM_LEVEL_ZERO_MEMORY_SHARED) continue;
#endif
        for (int k = 0; k < 3; k++) {
#ifndef HM_TEST_JEMALLOC
            if (k == 2) continue;
#endif
            lzf_t f = {.type = (hm_level_zero_memory_type_t)t, .ordinal = 0, .pool = k};
            char label[64];
            snprintf(label, sizeof(label), "%s over level_zero %s",
                     k == 0 ? "proxy" : k == 1 ? "native" : "jemalloc", type_name(f.type));
            hm_test_suite_opts_t opts = {.max_alloc = 32 * MIB};
            hm_test_pool_suite(label, make_pool, &f, &opts);
        }
    }
    /* calloc and realloc on device memory go through fill and copy. */
    hm_test_set_context("calloc/realloc on device memory");
    for (int k = 0; k < 3; k++) {
        lzf_t f = {.type = HM_LEVEL_ZERO_MEMORY_DEVICE, .pool = k};
        hm_pool_t *pool;
        hm_result_t r = make_pool(&f, &pool);
        if (r == HM_ERROR_NOT_SUPPORTED) continue;
        REQUIRE_OK(r);
        hm_provider_t *prov = hm_pool_get_provider(pool);
        const size_t sizes[] = {48, 5000, 300 * KIB, 3 * MIB};
        for (size_t i = 0; i < 4; i++) {
            size_t n = sizes[i];
            void *p = hm_pool_malloc(pool, n);
            REQUIRE(p);
            CHECK_OK(hm_provider_fill(prov, p, 0xee, n)); /* dirty it */
            CHECK_OK(hm_pool_free(pool, p));
            void *z = hm_pool_calloc(pool, 1, n);
            REQUIRE(z);
            memset(g_buf, 0x77, n);
            CHECK_OK(hm_provider_copy(prov, g_buf, z, n));
            int zero = 1;
            for (size_t b = 0; b < n; b++) zero &= g_buf[b] == 0;
            CHECK_MSG(zero, "calloc(%zu) on device memory is not zero", n);
            dev_put(prov, z, n, 7 + i);
            void *q = hm_pool_realloc(pool, z, 2 * n + 100);
            REQUIRE(q);
            CHECK_MSG(dev_check(prov, q, n, 7 + i), "realloc(%zu -> %zu) lost bytes", n, 2 * n + 100);
            CHECK_OK(hm_pool_free(pool, q));
        }
        CHECK_OK(hm_pool_destroy(pool));
    }
    CHECK_EQ(stats().live_allocs, 0);
}

/* ---- IPC: an importer exec'd afresh (real drivers do not survive fork) ---- */

#define IPC_SIZE (3 * MIB + 5)

/* transport 0: hm_ipc_open (pidfd_getfd); 1: the channel's descriptor. */
static int importer(int sock, int transport) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    unsigned char buf[4096];
    size_t len = 0;
    int fd = -1;
    if (hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd) != HM_SUCCESS) return 11;
    if (transport == 0 && fd >= 0) {
        close(fd);
        fd = -1;
    }
    if (transport == 1 && fd < 0) return 12;
    const hm_ipc_handle_t *h = (const hm_ipc_handle_t *)buf;
    hm_provider_t *p0, *p1;
    if (lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &p0) != HM_SUCCESS) return 13;
    if (lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &p1) != HM_SUCCESS) return 14;
    hm_pool_t *a, *b;
    if (pool_over(1, p0, HM_POOL_FLAG_OWN_PROVIDER, &a) != HM_SUCCESS) return 15;
    if (pool_over(0, p1, HM_POOL_FLAG_OWN_PROVIDER, &b) != HM_SUCCESS) return 16;
    driver_api(); /* the loader has loaded the driver now */
    drv.reset();
    void *qa = NULL, *qb = NULL;
    hm_result_t r = hm_ipc_open_fd(a, h, len, fd, &qa);
    if (r == HM_ERROR_PERMISSION || r == HM_ERROR_NOT_SUPPORTED) return 77; /* no pidfd_getfd */
    if (r != HM_SUCCESS || !qa) return 17;
    if (hm_ipc_open_fd(b, h, len, fd, &qb) != HM_SUCCESS || qb != qa) return 18;
    /* Two pools on one device (one hetmem context): one driver open. */
    if (drv.calls("zeMemOpenIpcHandle") != 1) return 19;
    if (!dev_check(p0, qa, IPC_SIZE, 31)) return 20;
    dev_put(p1, qa, 4096, 32); /* the exporter sees it */
    if (hm_ipc_close(qb) != HM_SUCCESS) return 21;
    /* a destroyed with its mapping open: b still holds it. */
    if (hm_pool_destroy(a) != HM_SUCCESS) return 22;
    if (drv.calls("zeMemCloseIpcHandle") != 0 || stats().live_ipc_mappings != 1) return 23;
    if (!dev_check(p1, qa, 4096, 32)) return 24;
    if (hm_pool_destroy(b) != HM_SUCCESS) return 25; /* the last: closed once */
    if (drv.calls("zeMemCloseIpcHandle") != 1 || stats().live_ipc_mappings != 0) return 26;
    if (fd >= 0) close(fd);
    char ack = 1;
    if (hm_ipc_channel_send_bytes(ch, &ack, 1) != HM_SUCCESS) return 27;
    hm_ipc_channel_destroy(ch);
    return 0;
}

static void test_ipc(const char *self, int transport) {
    hm_test_set_context(transport ? "IPC, descriptor over the channel" : "IPC, pidfd_getfd");
    char targ[4];
    snprintf(targ, sizeof(targ), "%d", transport);
    int sv0;
    pid_t pid = hm_test_spawn_importer(self, targ, &sv0);
    hm_provider_t *prov;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &prov));
    hm_pool_t *pool;
    REQUIRE_OK(pool_over(1, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    void *p = hm_pool_malloc(pool, IPC_SIZE);
    REQUIRE(p != NULL);
    dev_put(prov, p, IPC_SIZE, 31);
    hm_ipc_handle_t *h = NULL;
    size_t len = 0;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    hm_ipc_channel_t *ch;
    REQUIRE_OK(hm_ipc_channel_from_fd(sv0, &ch));
    CHECK_OK(hm_ipc_channel_send(ch, h, len));
    char ack = 0;
    size_t got = 0;
    hm_result_t ar = hm_ipc_channel_recv_bytes(ch, &ack, 1, &got);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (code == 77) {
        printf("importer: descriptors cannot move by pidfd_getfd here; skipped that transport\n");
    } else {
        CHECK_MSG(code == 0, "importer failed at step %d (status 0x%x)", code, st);
        if (code == 0) {
            CHECK(ar == HM_SUCCESS && got == 1 && ack == 1);
            CHECK(dev_check(prov, p, 4096, 32));
            CHECK(dev_check(prov, (char *)p + 4096, 1000, 31 + 4096));
        }
    }
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    /* Host and shared memory have no IPC. */
    hm_provider_t *hp;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_SHARED, 0, &hp));
    hm_pool_t *hpool;
    REQUIRE_OK(pool_over(0, hp, HM_POOL_FLAG_OWN_PROVIDER, &hpool));
    void *s = hm_pool_malloc(hpool, 4096);
    REQUIRE(s);
    CHECK_RES(hm_ipc_get(s, &h, &len), HM_ERROR_NOT_SUPPORTED);
    CHECK_OK(hm_pool_free(hpool, s));
    CHECK_OK(hm_pool_destroy(hpool));
    CHECK_OK(hm_pool_destroy(pool));
    hm_ipc_channel_destroy(ch);
}

/* fork() while other threads export and free through the driver: the
 * driver takes its lock in fork handlers of its own (as drivers may), and
 * the library calls it under the export cache's lock (a range freed while
 * exported goes back to the driver at the last put). The library's fork
 * handlers run before the driver's (fork.h, hm__fork_after_drivers), so
 * neither waits for the other: no deadlock (the alarm fails the test). */
static _Atomic int g_fork_stop;
static void *export_loop(void *arg) {
    hm_pool_t *pool = arg;
    while (!atomic_load(&g_fork_stop)) {
        void *p = hm_pool_malloc(pool, 64 * KIB);
        hm_ipc_handle_t *h;
        size_t len;
        if (!p || hm_ipc_get(p, &h, &len) != HM_SUCCESS) {
            atomic_store(&g_fork_stop, 2);
            break;
        }
        (void)hm_pool_free(pool, p); /* held until the put */
        (void)hm_ipc_put(h);         /* the driver's free, under the export lock */
    }
    return NULL;
}
static void test_fork_while_exporting(void) {
    hm_test_set_context("fork while exporting through the driver");
    hm_provider_t *prov;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &prov));
    hm_pool_t *pool;
    REQUIRE_OK(pool_over(0, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    atomic_store(&g_fork_stop, 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&t[i], NULL, export_loop, pool) == 0);
    alarm(HM_TEST_HANG_SECONDS);
    int forks = 0;
    for (; forks < 300 && atomic_load(&g_fork_stop) == 0; forks++) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        REQUIRE(pid > 0);
        waitpid(pid, NULL, 0);
    }
    alarm(0);
    int why = atomic_exchange(&g_fork_stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK_MSG(why == 0, "an export failed while forking");
    CHECK_EQ(forks, 300);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Two drivers (the test driver loaded twice, from two paths): ordinals run
 * over both; a context of one with a device of the other is refused. */
static void test_two_drivers(void) {
    hm_test_set_context("two drivers");
    hm_provider_t *p2;
    REQUIRE_OK(lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 2, &p2)); /* the second driver's first */
    hm_device_id_t id;
    CHECK_OK(hm_provider_get_device(p2, &id));
    CHECK_EQ(id.ordinal, 2);
    void *m = NULL;
    CHECK_OK(hm_provider_alloc(p2, 4096, 0, &m));
    hm_level_zero_allocation_t ai;
    CHECK_OK(hm_level_zero_allocation_info(p2, m, &ai));
    void *dev2 = ai.device;
    CHECK_OK(hm_provider_free(p2, m, 4096));
    void *loader = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(loader != NULL);
    __typeof__(zeDriverGet) *drv_get = (__typeof__(zeDriverGet) *)dlsym(loader, "zeDriverGet");
    __typeof__(zeContextCreate) *ctx_create =
        (__typeof__(zeContextCreate) *)dlsym(loader, "zeContextCreate");
    __typeof__(zeContextDestroy) *ctx_destroy =
        (__typeof__(zeContextDestroy) *)dlsym(loader, "zeContextDestroy");
    REQUIRE(drv_get && ctx_create && ctx_destroy);
    uint32_t nd = 2;
    ze_driver_handle_t drivers[2];
    REQUIRE(drv_get(&nd, drivers) == ZE_RESULT_SUCCESS);
    CHECK_EQ(nd, 2u);
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    ze_context_handle_t ctx1;
    REQUIRE(ctx_create(drivers[0], &cd, &ctx1) == ZE_RESULT_SUCCESS);
    hm_level_zero_params_t *p;
    REQUIRE_OK(hm_level_zero_params_create(&p));
    CHECK_OK(hm_level_zero_params_set_context(p, ctx1, dev2));
    hm_provider_t *bad = NULL;
    CHECK_RES(hm_level_zero_provider_create(p, &bad), HM_ERROR_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    hm_level_zero_params_destroy(p);
    CHECK(ctx_destroy(ctx1) == ZE_RESULT_SUCCESS);
    CHECK_OK(hm_provider_destroy(p2));
}

int main(int argc, char **argv) {
    g_part = argc > 1 ? argv[1] : "unit";
    if (strcmp(g_part, "noloader") == 0) return no_loader_child();
    if (strcmp(g_part, "teardown") == 0) return teardown_child();
    if (strcmp(g_part, "importer") == 0 && argc > 3) return importer(atoi(argv[2]), atoi(argv[3]));
    hm_provider_t *probe;
    if (strcmp(g_part, "hardware") == 0) {
        /* The machine's own driver (no ZE_ENABLE_ALT_DRIVERS): the suites
         * where an Intel GPU is found. */
        if (getenv("ZE_ENABLE_ALT_DRIVERS")) HM_TEST_SKIP("a test driver is configured");
        hm_result_t r = lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &probe);
        if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("no Level Zero GPU on this machine");
        REQUIRE_OK(r);
        run_suites_provider();
        lzf_t f = {.type = HM_LEVEL_ZERO_MEMORY_DEVICE, .pool = 1};
        hm_test_suite_opts_t opts = {.max_alloc = 32 * MIB};
        hm_test_pool_suite("native over level_zero device (hardware)", make_pool, &f, &opts);
        CHECK_OK(hm_provider_destroy(probe));
        return hm_test_finish();
    }
    if (!getenv("ZE_ENABLE_ALT_DRIVERS"))
        HM_TEST_SKIP("ZE_ENABLE_ALT_DRIVERS is not set (CTest sets it to the test driver)");
    if (strcmp(g_part, "twodrivers") == 0) { /* ZE_ENABLE_ALT_DRIVERS names two copies */
        test_two_drivers();
        return hm_test_finish();
    }
    hm_result_t r = lz_provider(HM_LEVEL_ZERO_MEMORY_DEVICE, 0, &probe);
    if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("no Level Zero loader or driver");
    REQUIRE_OK(r);
    driver_api();
    int ran = 0;
    if (PART("unit")) {
        ran++;
        test_params();
        test_identity();
        test_alloc();
        test_policies_resident();
        test_relaxed_limit();
        test_fork_child();
        test_streams();
        test_stream_pools();
        test_teardown(argv[0]);
        test_no_loader(argv[0]);
    }
    if (PART("provider")) {
        ran++;
        run_suites_provider();
    }
    if (PART("pools")) {
        ran++;
        run_suites_pools();
    }
    if (PART("ipc")) {
        ran++;
        test_ipc(argv[0], 0);
        test_ipc(argv[0], 1);
        test_fork_while_exporting();
    }
    CHECK_OK(hm_provider_destroy(probe));
    CHECK_EQ(stats().live_contexts, 0); /* hetmem's own context went with its last provider */
    CHECK_EQ(stats().live_allocs, 0);
    if (!ran) {
        fprintf(stderr, "unknown part '%s'\n", g_part);
        return 2;
    }
    return hm_test_finish();
}
