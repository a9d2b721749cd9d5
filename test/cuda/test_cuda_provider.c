/* hetmem tests — the CUDA provider against the project's test driver
 * (cuda_test_driver.c, a libcuda.so.1 found through HM_CUDA_DRIVER, set by
 * CTest): parameters and their errors, device identity, page sizes, any
 * power-of-two alignment, the device memory limit, injected driver failures
 * and the native error, fill and copy, allocation properties, the caller's
 * own context, the current context of a thread kept as it was (none,
 * another, the provider's) and the driver calls per alloc and free, no
 * driver at all; the provider conformance suite for device, host-pinned and
 * managed memory; the pool conformance suite for every pool over each;
 * calloc and realloc on device memory; IPC with a separately exec'd
 * importer, two importing pools on one device making one driver open (the
 * driver in strict mode refuses a second), a pool destroyed with a mapping
 * open; fork while other threads export and free.
 * SPDX-License-Identifier: MIT
 *
 * Usage: test_cuda_provider [unit|provider|pools|vmm|ipc|all|hardware]
 *        (hardware: the machine's own libcuda.so.1, skipped without one) */
#include "cuda_provider_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_part;
#define PART(name) (strcmp(g_part, "all") == 0 || strcmp(g_part, (name)) == 0)

/* ---- unit ---- */

static void test_params(void) {
    hm_test_set_context("params");
    hm_cuda_params_t *p;
    CHECK_RES(hm_cuda_params_create(NULL), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_cuda_params_create(&p));
    int x;
    CHECK_RES(hm_cuda_params_set_context(p, NULL, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_context(p, &x, -1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_context(NULL, &x, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_ordinal(p, -1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_memory_type(p, (hm_cuda_memory_type_t)3), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_flags(p, 0x40), HM_ERROR_INVALID_ARGUMENT);
    hm_provider_t *prov = NULL;
    CHECK_OK(hm_cuda_params_set_ordinal(p, 5)); /* the driver has 2 devices */
    CHECK_RES(hm_cuda_provider_create(p, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK(prov == NULL);
    CHECK_OK(hm_cuda_params_set_ordinal(p, 0));
    CHECK_OK(hm_cuda_params_set_flags(p, HM_CUDA_HOST_PORTABLE)); /* on device memory */
    CHECK_RES(hm_cuda_provider_create(p, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_cuda_params_set_memory_type(p, HM_CUDA_MEMORY_MANAGED));
    CHECK_OK(hm_cuda_params_set_flags(p, HM_CUDA_ATTACH_GLOBAL | HM_CUDA_ATTACH_HOST));
    CHECK_RES(hm_cuda_provider_create(p, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_cuda_params_set_flags(p, HM_CUDA_ATTACH_HOST));
    CHECK_OK(hm_cuda_provider_create(p, &prov));
    void *m = NULL;
    CHECK_OK(hm_provider_alloc(prov, 4096, 0, &m));
    hm_cuda_allocation_t ai;
    CHECK_OK(hm_cuda_allocation_info(prov, m, &ai));
    CHECK(ai.type == HM_CUDA_MEMORY_MANAGED);
    CHECK_OK(hm_provider_free(prov, m, 4096));
    CHECK_OK(hm_provider_destroy(prov));
    CHECK_OK(hm_cuda_params_destroy(p));
    CHECK_RES(hm_cuda_params_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
}

static void test_identity(void) {
    hm_test_set_context("identity, kinds, page sizes");
    hm_provider_t *d0, *d1, *h, *m;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &d0));
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 1, &d1));
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_HOST, 0, &h));
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_MANAGED, 1, &m));
    hm_device_id_t a, b;
    CHECK_OK(hm_provider_get_device(d0, &a));
    CHECK_OK(hm_provider_get_device(d1, &b));
    CHECK(a.ordinal == 0 && b.ordinal == 1 && a.has_uuid && b.has_uuid);
    CHECK(memcmp(a.uuid, b.uuid, sizeof(a.uuid)) != 0);
    CHECK(hm_provider_memory_kind(d0) == HM_MEMORY_DEVICE && !hm_provider_cpu_accessible(d0));
    CHECK(hm_provider_memory_kind(h) == HM_MEMORY_HOST_PINNED && hm_provider_cpu_accessible(h));
    CHECK(hm_provider_memory_kind(m) == HM_MEMORY_SHARED && hm_provider_cpu_accessible(m));
    CHECK(hm_provider_caps(d0) & HM_PROVIDER_CAP_IPC);
    CHECK(!(hm_provider_caps(h) & HM_PROVIDER_CAP_IPC) && !(hm_provider_caps(m) & HM_PROVIDER_CAP_IPC));
    CHECK_EQ(hm_provider_min_page_size(d0), 2 * MIB);
    CHECK_EQ(hm_provider_min_page_size(h), 4 * KIB);
    CHECK(strcmp(hm_provider_name(d0), "cuda(device)") == 0);
    CHECK_OK(hm_provider_destroy(d0));
    CHECK_OK(hm_provider_destroy(d1));
    CHECK_OK(hm_provider_destroy(h));
    CHECK_OK(hm_provider_destroy(m));
}

static void test_alloc(void) {
    hm_test_set_context("alignments, limit, driver failures, fill and copy, properties");
    hm_provider_t *d;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &d));
    const size_t aligns[] = {0, 4 * KIB, 2 * MIB, 16 * MIB, 64 * MIB};
    uint64_t last = 0;
    uint64_t live0 = stats().live_allocs;
    for (size_t i = 0; i < sizeof(aligns) / sizeof(aligns[0]); i++) {
        void *p = NULL;
        CHECK_OK(hm_provider_alloc(d, 3 * MIB, aligns[i], &p));
        if (!p) continue;
        CHECK_MSG(aligns[i] == 0 || ((uintptr_t)p & (aligns[i] - 1)) == 0, "alignment %zu: %p",
                  aligns[i], p);
        hm_cuda_allocation_t ai;
        CHECK_OK(hm_cuda_allocation_info(d, (char *)p + 1000, &ai));
        CHECK(ai.type == HM_CUDA_MEMORY_DEVICE && ai.device == 0 && ai.base <= (uintptr_t)p);
        CHECK_MSG(ai.buffer_id > last, "buffer ids: %llu after %llu",
                  (unsigned long long)ai.buffer_id, (unsigned long long)last);
        last = ai.buffer_id;
        CHECK_OK(hm_provider_fill(d, p, 0xab, 3 * MIB));
        memset(g_buf, 0, 3 * MIB);
        CHECK_OK(hm_provider_copy(d, g_buf, p, 3 * MIB));
        int same = 1;
        for (size_t k = 0; k < 3 * MIB; k++) same &= g_buf[k] == 0xab;
        CHECK(same);
        dev_put(d, p, 3 * MIB, i);
        CHECK(dev_check(d, p, 3 * MIB, i));
        CHECK_OK(hm_provider_free(d, p, 3 * MIB));
    }
    CHECK_EQ(stats().live_allocs, live0); /* over-aligned ones freed by their base */
    char local[64];
    hm_cuda_allocation_t ai;
    CHECK_RES(hm_cuda_allocation_info(d, local, &ai), HM_ERROR_INVALID_ARGUMENT);
    hm_provider_t *os;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, 0, &os));
    CHECK_RES(hm_cuda_allocation_info(os, local, &ai), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_destroy(os));

    REQUIRE(drv.set_limit(-1, 32 * MIB) == 0);
    void *big[4] = {0};
    int n = 0;
    hm_result_t r = HM_SUCCESS;
    while (n < 4 && (r = hm_provider_alloc(d, 12 * MIB, 0, &big[n])) == HM_SUCCESS) n++;
    CHECK_EQ(n, 2);
    CHECK_RES(r, HM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(hm_last_native_error(NULL), 2); /* CUDA_ERROR_OUT_OF_MEMORY */
    CHECK_OK(hm_provider_free(d, big[0], 12 * MIB));
    CHECK_OK(hm_provider_alloc(d, 12 * MIB, 0, &big[0]));
    for (int i = 0; i < n; i++) CHECK_OK(hm_provider_free(d, big[i], 12 * MIB));
    REQUIRE(drv.set_limit(-1, 256 * MIB) == 0);

    void *p = NULL;
    REQUIRE(drv.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_alloc(d, 4096, 0, &p), HM_ERROR_DRIVER);
    CHECK(p == NULL);
    CHECK_EQ(hm_last_native_error(NULL), (int64_t)CUDA_ERROR_ILLEGAL_ADDRESS);
    REQUIRE_OK(hm_provider_alloc(d, 4096, 0, &p));
    REQUIRE(drv.fail_next("cuMemsetD8_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_fill(d, p, 1, 4096), HM_ERROR_DRIVER);
    REQUIRE(drv.fail_next("cuMemcpy", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_copy(d, g_buf, p, 4096), HM_ERROR_DRIVER);
    CHECK_OK(hm_provider_free(d, p, 4096));
    CHECK_OK(hm_provider_destroy(d));
}

/* The thread's current context stays as it was; driver calls per op. */
static void test_contexts(void) {
    hm_test_set_context("current contexts, calls per op, the caller's context");
    hm_provider_t *d;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &d));
    CUcontext prim = NULL, cur = (CUcontext)1;
    REQUIRE(drv.primary_retain(&prim, 0) == CUDA_SUCCESS);
    /* none current */
    REQUIRE(drv.ctx_set(NULL) == CUDA_SUCCESS);
    void *p = NULL;
    CHECK_OK(hm_provider_alloc(d, 4096, 0, &p));
    CHECK(drv.ctx_get(&cur) == CUDA_SUCCESS && cur == NULL);
    CHECK_OK(hm_provider_free(d, p, 4096));
    CHECK(drv.ctx_get(&cur) == CUDA_SUCCESS && cur == NULL);
    /* another one current (a context of device 1) */
    CUcontext other;
    REQUIRE(drv.ctx_create(&other, 0, 1) == CUDA_SUCCESS); /* pushed: current */
    CHECK_OK(hm_provider_alloc(d, 4096, 0, &p));
    hm_cuda_allocation_t ai;
    CHECK_OK(hm_cuda_allocation_info(d, p, &ai));
    CHECK_MSG(ai.context == (void *)prim && ai.device == 0, "allocated in %p (device %d)",
              ai.context, ai.device);
    CHECK(drv.ctx_get(&cur) == CUDA_SUCCESS && cur == other);
    CHECK_OK(hm_provider_free(d, p, 4096));
    CHECK(drv.ctx_get(&cur) == CUDA_SUCCESS && cur == other);
    /* the provider's own current: alloc = cuCtxGetCurrent + cuMemAlloc_v2, free = cuMemFree_v2 */
    REQUIRE(drv.ctx_set(prim) == CUDA_SUCCESS);
    drv.reset();
    CHECK_OK(hm_provider_alloc(d, 4096, 0, &p));
    uint64_t a = stats().calls;
    CHECK_EQ(drv.calls("cuMemAlloc_v2"), 1u);
    CHECK_EQ(drv.calls("cuCtxGetCurrent"), 1u);
    CHECK_MSG(a == 2, "an alloc made %llu driver calls", (unsigned long long)a);
    drv.reset();
    CHECK_OK(hm_provider_free(d, p, 4096));
    uint64_t f = stats().calls;
    CHECK_MSG(f == 1 && drv.calls("cuMemFree_v2") == 1, "a free made %llu driver calls",
              (unsigned long long)f);
    /* The caller's own context (device 1), and one on another device than said. */
    hm_cuda_params_t *pp;
    REQUIRE_OK(hm_cuda_params_create(&pp));
    CHECK_OK(hm_cuda_params_set_context(pp, other, 1));
    hm_provider_t *mine;
    CHECK_OK(hm_cuda_provider_create(pp, &mine));
    hm_device_id_t id;
    CHECK_OK(hm_provider_get_device(mine, &id));
    CHECK_EQ(id.ordinal, 1);
    CHECK_OK(hm_provider_alloc(mine, 4096, 0, &p));
    CHECK_OK(hm_cuda_allocation_info(mine, p, &ai));
    CHECK(ai.context == (void *)other && ai.device == 1);
    CHECK_OK(hm_provider_free(mine, p, 4096));
    CHECK_OK(hm_provider_destroy(mine));
    CHECK_OK(hm_cuda_params_set_context(pp, other, 0));
    CHECK_RES(hm_cuda_provider_create(pp, &mine), HM_ERROR_INVALID_ARGUMENT);
    hm_cuda_params_destroy(pp);
    CHECK(drv.ctx_get(&cur) == CUDA_SUCCESS && cur == prim);
    REQUIRE(drv.ctx_set(NULL) == CUDA_SUCCESS);
    CHECK(drv.ctx_destroy(other) == CUDA_SUCCESS);
    CHECK(drv.primary_release(0) == CUDA_SUCCESS);
    CHECK_OK(hm_provider_destroy(d));
}

static void test_no_driver(const char *self) {
    hm_test_set_context("no driver");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("HM_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
        execl(self, self, "nodriver", (char *)NULL);
        _exit(99);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "no-driver child: status 0x%x", st);
}
static int no_driver_child(void) {
    hm_provider_t *p = NULL;
    if (cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &p) != HM_ERROR_NOT_SUPPORTED || p) return 1;
    hm_provider_t *os;
    if (hm_test_os_provider(HM_OS_PRIVATE, 0, &os) != HM_SUCCESS) return 2;
    hm_pool_t *pool;
    if (hm_native_pool_create(os, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) return 3;
    void *m = hm_pool_malloc(pool, 100);
    if (!m || hm_pool_free(pool, m) != HM_SUCCESS) return 4;
    return hm_pool_destroy(pool) == HM_SUCCESS ? 0 : 5;
}

/* ---- suites ---- */

/* On the test driver managed memory comes from a second device (the CTest
 * entry asks for two); on a GPU everything is on device 0, which a one-GPU
 * machine has, and managed memory is not asked for impossible sizes (NVIDIA
 * warns that over-asking managed memory can hang the GPU). */
static void run_suites_provider(bool hardware) {
    for (int t = 0; t < 3; t++) {
        bool managed = t == HM_CUDA_MEMORY_MANAGED;
        cuf_t f = {.type = (hm_cuda_memory_type_t)t, .ordinal = managed && !hardware ? 1 : 0};
        char label[64];
        snprintf(label, sizeof(label), "cuda %s", type_name(f.type));
        hm_test_suite_opts_t opts = {.can_free = 1, .max_alloc = 32 * MIB,
                                     .skip_huge = managed && hardware};
        hm_test_provider_suite(label, make_provider, &f, &opts);
    }
}

static void run_suites_pools(void) {
    if (drv.set_limit) drv.set_limit(-1, (uint64_t)4 << 30);
    for (int t = 0; t < 3; t++) {
#if defined(HM_TSAN)
        /* Under TSan, device and host memory: managed memory takes the pools
         * through the same (CPU-accessible) paths as host memory, and the
         * provider part covers it. */
        if (t == HM_CUDA_MEMORY_MANAGED) continue;
#endif
        for (int k = 0; k < 3; k++) {
#ifndef HM_TEST_JEMALLOC
            if (k == 2) continue;
#endif
            cuf_t f = {.type = (hm_cuda_memory_type_t)t, .pool = k};
            char label[64];
            snprintf(label, sizeof(label), "%s over cuda %s",
                     k == 0 ? "proxy" : k == 1 ? "native" : "jemalloc", type_name(f.type));
            hm_test_suite_opts_t opts = {.max_alloc = 32 * MIB};
            hm_test_pool_suite(label, make_pool, &f, &opts);
        }
    }
    hm_test_set_context("calloc/realloc on device memory");
    for (int k = 0; k < 3; k++) {
        cuf_t f = {.type = HM_CUDA_MEMORY_DEVICE, .pool = k};
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
            CHECK_OK(hm_provider_fill(prov, p, 0xee, n));
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
            CHECK_MSG(dev_check(prov, q, n, 7 + i), "realloc(%zu) lost bytes", n);
            CHECK_OK(hm_pool_free(pool, q));
        }
        CHECK_OK(hm_pool_destroy(pool));
    }
}

/* ---- the virtual memory API (HM_CUDA_ALLOCATOR_VMM) ---- */

static void test_vmm(void) {
    hm_test_set_context("VMM: parameters, exact alignment, failures");
    hm_cuda_params_t *params;
    REQUIRE_OK(hm_cuda_params_create(&params));
    CHECK_RES(hm_cuda_params_set_allocator(params, (hm_cuda_allocator_t)7),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_allocator(NULL, HM_CUDA_ALLOCATOR_VMM), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_cuda_params_set_allocator(params, HM_CUDA_ALLOCATOR_VMM));
    CHECK_OK(hm_cuda_params_set_memory_type(params, HM_CUDA_MEMORY_HOST));
    hm_provider_t *bad = NULL;
    CHECK_RES(hm_cuda_provider_create(params, &bad), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_cuda_params_destroy(params));
    hm_provider_t *d;
    REQUIRE_OK(cu_provider_with(HM_CUDA_MEMORY_DEVICE, 0, HM_CUDA_ALLOCATOR_VMM, &d));
    CHECK_EQ(hm_provider_min_page_size(d), 2 * MIB);
    CHECK(!(hm_provider_caps(d) & HM_PROVIDER_CAP_IPC));
    drv.reset();
    const size_t aligns[] = {0, 4 * KIB, 2 * MIB, 16 * MIB, 64 * MIB};
    for (size_t i = 0; i < sizeof(aligns) / sizeof(aligns[0]); i++) {
        void *p = NULL;
        CHECK_OK(hm_provider_alloc(d, 3 * MIB, aligns[i], &p));
        if (!p) continue;
        CHECK_MSG(aligns[i] == 0 || ((uintptr_t)p & (aligns[i] - 1)) == 0, "alignment %zu: %p",
                  aligns[i], p);
        dev_put(d, p, 3 * MIB, i);
        CHECK(dev_check(d, p, 3 * MIB, i));
        CHECK_OK(hm_provider_fill(d, p, 0xab, 4096));
        CHECK_OK(hm_provider_free(d, p, 3 * MIB));
    }
    /* One create and one reservation each: no over-allocation, no cuMemAlloc. */
    CHECK_EQ(drv.calls("cuMemCreate"), 5);
    CHECK_EQ(drv.calls("cuMemAddressReserve"), 5);
    CHECK_EQ(drv.calls("cuMemAlloc_v2"), 0);
    CHECK_EQ(stats().live_vmm_handles, 0);
    CHECK_EQ(stats().live_vmm_mappings, 0);
    /* Each new driver call failing: a clean error, nothing left behind. */
    const char *calls[] = {"cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                           "cuMemRelease"};
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
        void *p = NULL;
        REQUIRE(drv.fail_next(calls[i], 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
        hm_result_t r = hm_provider_alloc(d, 2 * MIB, 0, &p);
        CHECK_MSG(r != HM_SUCCESS && p == NULL, "%s failing: %s", calls[i], hm_result_string(r));
        CHECK_MSG(stats().live_vmm_handles == 0 && stats().live_vmm_mappings == 0,
                  "%s failing left memory behind", calls[i]);
    }
    void *p = NULL;
    REQUIRE_OK(hm_provider_alloc(d, 2 * MIB, 0, &p));
    REQUIRE(drv.fail_next("cuMemUnmap", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_free(d, p, 2 * MIB), HM_ERROR_DRIVER);
    CHECK_OK(hm_provider_free(d, p, 2 * MIB));
    CHECK_EQ(stats().live_vmm_mappings, 0);
    /* Out of device memory: the driver's limit. */
    REQUIRE(drv.set_limit(0, 8 * MIB) == 0);
    void *big[8];
    int n = 0;
    hm_result_t r = HM_SUCCESS;
    while (n < 8 && (r = hm_provider_alloc(d, 2 * MIB, 0, &big[n])) == HM_SUCCESS) n++;
    CHECK_EQ(n, 4);
    CHECK_RES(r, HM_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < n; i++) CHECK_OK(hm_provider_free(d, big[i], 2 * MIB));
    REQUIRE(drv.set_limit(-1, 256 * MIB) == 0);
    CHECK_OK(hm_provider_destroy(d));
}

static void run_suites_vmm(void) {
    cuf_t f = {.type = HM_CUDA_MEMORY_DEVICE, .vmm = 1};
    hm_test_suite_opts_t opts = {.can_free = 1, .max_alloc = 32 * MIB};
    hm_test_provider_suite("cuda device (vmm)", make_provider, &f, &opts);
    if (drv.set_limit) drv.set_limit(-1, (uint64_t)4 << 30);
    for (int k = 0; k < 3; k++) {
#ifndef HM_TEST_JEMALLOC
        if (k == 2) continue;
#endif
        cuf_t pf = {.type = HM_CUDA_MEMORY_DEVICE, .pool = k, .vmm = 1};
        char label[64];
        snprintf(label, sizeof(label), "%s over cuda device (vmm)",
                 k == 0 ? "proxy" : k == 1 ? "native" : "jemalloc");
        hm_test_suite_opts_t po = {.max_alloc = 32 * MIB};
        hm_test_pool_suite(label, make_pool, &pf, &po);
    }
    if (drv.set_limit) drv.set_limit(-1, 256 * MIB);
}

/* ---- IPC: an importer exec'd afresh ---- */

#define IPC_SIZE (3 * MIB + 5)

static int importer(int sock) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    unsigned char buf[4096];
    size_t len = 0;
    int fd = -1;
    if (hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd) != HM_SUCCESS) return 11;
    if (fd >= 0) return 12; /* CUDA handles travel by value */
    const hm_ipc_handle_t *h = (const hm_ipc_handle_t *)buf;
    hm_provider_t *p0, *p1;
    if (cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &p0) != HM_SUCCESS) return 13;
    if (cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &p1) != HM_SUCCESS) return 14;
    hm_pool_t *a, *b;
    if (pool_over(1, p0, HM_POOL_FLAG_OWN_PROVIDER, &a) != HM_SUCCESS) return 15;
    if (pool_over(0, p1, HM_POOL_FLAG_OWN_PROVIDER, &b) != HM_SUCCESS) return 16;
    driver_api();
    drv.strict(1); /* a second open of the handle in the context would fail */
    drv.reset();
    void *qa = NULL, *qb = NULL;
    if (hm_ipc_open(a, h, len, &qa) != HM_SUCCESS || !qa) return 17;
    if (hm_ipc_open(b, h, len, &qb) != HM_SUCCESS || qb != qa) return 18;
    if (drv.calls("cuIpcOpenMemHandle_v2") != 1) return 19; /* one primary context: one open */
    if (!dev_check(p0, qa, IPC_SIZE, 31)) return 20;
    dev_put(p1, qa, 4096, 32);
    if (hm_ipc_close(qb) != HM_SUCCESS) return 21;
    if (hm_pool_destroy(a) != HM_SUCCESS) return 22; /* with its mapping open */
    if (drv.calls("cuIpcCloseMemHandle") != 0 || stats().live_ipc_mappings != 1) return 23;
    if (!dev_check(p1, qa, 4096, 32)) return 24;
    if (hm_pool_destroy(b) != HM_SUCCESS) return 25;
    if (drv.calls("cuIpcCloseMemHandle") != 1 || stats().live_ipc_mappings != 0) return 26;
    char ack = 1;
    if (hm_ipc_channel_send_bytes(ch, &ack, 1) != HM_SUCCESS) return 27;
    hm_ipc_channel_destroy(ch);
    return 0;
}

static void test_ipc(const char *self) {
    hm_test_set_context("IPC");
    int sv0;
    pid_t pid = hm_test_spawn_importer(self, NULL, &sv0);
    hm_provider_t *prov;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
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
    CHECK_MSG(code == 0, "importer failed at step %d (status 0x%x)", code, st);
    if (code == 0) {
        CHECK(ar == HM_SUCCESS && got == 1 && ack == 1);
        CHECK(dev_check(prov, p, 4096, 32));
    }
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    for (int t = 1; t <= 2; t++) { /* host-pinned and managed: no IPC */
        hm_provider_t *hp;
        REQUIRE_OK(cu_provider((hm_cuda_memory_type_t)t, 0, &hp));
        hm_pool_t *hpool;
        REQUIRE_OK(pool_over(0, hp, HM_POOL_FLAG_OWN_PROVIDER, &hpool));
        void *s = hm_pool_malloc(hpool, 4096);
        REQUIRE(s);
        CHECK_RES(hm_ipc_get(s, &h, &len), HM_ERROR_NOT_SUPPORTED);
        CHECK_OK(hm_pool_free(hpool, s));
        CHECK_OK(hm_pool_destroy(hpool));
    }
    CHECK_OK(hm_pool_destroy(pool));
    hm_ipc_channel_destroy(ch);
}

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
        (void)hm_pool_free(pool, p);
        (void)hm_ipc_put(h);
    }
    return NULL;
}
static void test_fork_while_exporting(void) {
    hm_test_set_context("fork while exporting through the driver");
    hm_provider_t *prov;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
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

int main(int argc, char **argv) {
    g_part = argc > 1 ? argv[1] : "unit";
    if (strcmp(g_part, "nodriver") == 0) return no_driver_child();
    if (strcmp(g_part, "importer") == 0 && argc > 2) return importer(atoi(argv[2]));
    hm_provider_t *probe;
    if (strcmp(g_part, "hardware") == 0) {
        if (getenv("HM_CUDA_DRIVER")) HM_TEST_SKIP("a test driver is configured");
        hm_result_t r = cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &probe);
        if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("no NVIDIA GPU with a driver here");
        REQUIRE_OK(r);
        run_suites_provider(true);
        cuf_t f = {.type = HM_CUDA_MEMORY_DEVICE, .pool = 1};
        hm_test_suite_opts_t opts = {.max_alloc = 32 * MIB};
        hm_test_pool_suite("native over cuda device (hardware)", make_pool, &f, &opts);
        CHECK_OK(hm_provider_destroy(probe));
        return hm_test_finish();
    }
    if (!getenv("HM_CUDA_DRIVER"))
        HM_TEST_SKIP("HM_CUDA_DRIVER is not set (CTest sets it to the test driver)");
    hm_result_t r = cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &probe);
    if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("no CUDA driver");
    REQUIRE_OK(r);
    driver_api();
    int ran = 0;
    if (PART("unit")) {
        ran++;
        test_params();
        test_identity();
        test_alloc();
        test_contexts();
        test_no_driver(argv[0]);
    }
    if (PART("provider")) {
        ran++;
        run_suites_provider(false);
    }
    if (PART("pools")) {
        ran++;
        run_suites_pools();
    }
    if (PART("vmm")) {
        ran++;
        test_vmm();
        run_suites_vmm();
    }
    if (PART("ipc")) {
        ran++;
        test_ipc(argv[0]);
        test_fork_while_exporting();
    }
    CHECK_OK(hm_provider_destroy(probe));
    CHECK_EQ(stats().live_allocs, 0);
    CHECK_EQ(stats().live_ipc_mappings, 0);
    if (!ran) {
        fprintf(stderr, "unknown part '%s'\n", g_part);
        return 2;
    }
    return hm_test_finish();
}
