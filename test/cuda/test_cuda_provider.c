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
 *
 * VMM IPC (vmm_ipc): shareable FD handles between two processes, over the
 * channel and by pidfd, opened by a VMM and a legacy provider, closed
 * through another pool of the context; peers; every payload field forged
 * and every new driver call failing, with nothing left behind; exports from
 * every pool. vmm_fabric (the test driver's HM_CUDA_TEST_FABRIC=1): fabric
 * handles by value, a forged one refused.
 *
 * VMM split and merge (vmm_split): splits at every granularity multiple,
 * the pieces freed in every order with the driver's live physical
 * allocations and mappings going exactly at the last piece; merges (within
 * one mapping and across two) then frees; refused split points, merges and
 * frees (a log line each, no driver call); cuMemUnmap and cuMemAddressFree
 * failing during a free (reported, the free made again succeeds, nothing
 * stays); only a whole mapping exported; split and merge through a pool
 * (hm_pool_provider_split/merge, the tracker following).
 * SPDX-License-Identifier: MIT
 *
 * Usage: test_cuda_provider [unit|provider|pools|vmm|vmm_ipc|vmm_split|vmm_fabric|ipc|all|hardware]
 *        (hardware: the machine's own libcuda.so.1, skipped without one: the
 *        provider and pool suites, legacy and, where the driver has the
 *        virtual memory API, VMM mode) */
#include "cuda_provider_util.h"

#include <dirent.h>
#include <fcntl.h>
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
    CHECK(hm_provider_caps(d) & HM_PROVIDER_CAP_IPC); /* FD handles, the default */
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

/* ---- VMM split and merge ---- */

#define GRAN (2 * MIB)

static _Atomic int g_logged;
static void count_log(hm_log_level_t level, const char *line, void *arg) {
    (void)line, (void)arg;
    if (level >= HM_LOG_ERROR) g_logged++;
}

/* Live physical allocations and mappings the driver holds. */
static int vmm_held(uint64_t handles, uint64_t mappings) {
    hm_cuda_test_stats_t st = stats();
    return st.live_vmm_handles == handles && st.live_vmm_mappings == mappings;
}

/* Each permutation of n (n <= 5) pieces in turn: perm is its index. */
static void nth_perm(size_t n, unsigned perm, size_t *out) {
    size_t left[5];
    for (size_t i = 0; i < n; i++) left[i] = i;
    for (size_t i = 0; i < n; i++) {
        size_t f = 1;
        for (size_t k = 2; k < n - i; k++) f *= k;
        size_t j = perm / f;
        perm %= f;
        out[i] = left[j];
        for (size_t k = j; k + 1 < n - i; k++) left[k] = left[k + 1];
    }
}

static void test_vmm_split_orders(hm_provider_t *d) {
    hm_test_set_context("VMM split: every split point, every order of frees");
    /* One split at each granularity multiple; sizes asked whole and not. */
    const size_t totals[] = {4 * GRAN, 3 * GRAN + 5};
    for (size_t t = 0; t < 2; t++) {
        size_t total = totals[t];
        for (size_t first = GRAN; first < total; first += GRAN) {
            for (int order = 0; order < 2; order++) {
                void *p = NULL;
                REQUIRE_OK(hm_provider_alloc(d, total, 0, &p));
                dev_put(d, p, total, first);
                CHECK_OK(hm_provider_split(d, p, total, first));
                CHECK(dev_check(d, p, total, first)); /* bookkeeping: the bytes stay */
                char *q = (char *)p + first;
                drv.reset();
                if (order == 0) {
                    CHECK_OK(hm_provider_free(d, p, first));
                    CHECK_MSG(vmm_held(1, 1), "split at %zu of %zu: memory went with the first "
                              "piece", first, total);
                    CHECK_OK(hm_provider_free(d, q, total - first));
                } else {
                    CHECK_OK(hm_provider_free(d, q, total - first));
                    CHECK_MSG(vmm_held(1, 1), "split at %zu of %zu: memory went with the second "
                              "piece", first, total);
                    CHECK_OK(hm_provider_free(d, p, first));
                }
                CHECK_MSG(vmm_held(0, 0), "split at %zu of %zu: memory stays after both",
                          first, total);
                CHECK_EQ(drv.calls("cuMemUnmap"), 1);
                CHECK_EQ(drv.calls("cuMemAddressFree"), 1);
            }
        }
    }
    /* Four pieces of one mapping, freed in each of the 24 orders: the
     * mapping goes exactly with the last. */
    for (unsigned perm = 0; perm < 24; perm++) {
        size_t ord[4];
        nth_perm(4, perm, ord);
        void *p = NULL;
        REQUIRE_OK(hm_provider_alloc(d, 4 * GRAN, 0, &p));
        char *c = p;
        CHECK_OK(hm_provider_split(d, c, 4 * GRAN, GRAN));
        CHECK_OK(hm_provider_split(d, c + GRAN, 3 * GRAN, 2 * GRAN));
        CHECK_OK(hm_provider_split(d, c + GRAN, 2 * GRAN, GRAN));
        drv.reset();
        for (size_t i = 0; i < 4; i++) {
            CHECK_OK(hm_provider_free(d, c + ord[i] * GRAN, GRAN));
            uint64_t held = i < 3;
            CHECK_MSG(vmm_held(held, held), "order %u, after %zu frees: %s", perm, i + 1,
                      held ? "the memory went early" : "the memory stays");
        }
        CHECK_EQ(drv.calls("cuMemUnmap"), 1);
    }
}

/* Two allocations of n granules each, the second right after the first in
 * the address space: up to 8 made until two are, the others freed. */
static int adjacent_pair(hm_provider_t *d, size_t n, char **a, char **b) {
    char *x[8];
    size_t k = 0, ia = 0, ib = 0;
    int found = 0;
    for (; k < 8 && !found; k++) {
        void *p = NULL;
        if (hm_provider_alloc(d, n * GRAN, 0, &p) != HM_SUCCESS) break;
        x[k] = p;
        for (size_t i = 0; i < k && !found; i++) {
            if (x[i] + n * GRAN == x[k]) ia = i, ib = k, found = 1;
            else if (x[k] + n * GRAN == x[i]) ia = k, ib = i, found = 1;
        }
    }
    for (size_t i = 0; i < k; i++)
        if (!found || (i != ia && i != ib)) CHECK_OK(hm_provider_free(d, x[i], n * GRAN));
    CHECK_MSG(found, "no two of %zu allocations are adjacent", k);
    if (found) *a = x[ia], *b = x[ib];
    return found;
}

static void test_vmm_merge(hm_provider_t *d) {
    hm_test_set_context("VMM merge: within a mapping, across two, then frees");
    const hm_provider_ops_t *ops = hm_provider_get_ops(d);
    void *st = hm_provider_get_state(d);
    unsigned char pl[256];
    int fd = -1;
    REQUIRE(ops->ipc.handle_size(st) <= sizeof(pl));
    /* Split, merge back: one whole mapping again, exported like one. */
    void *p = NULL;
    REQUIRE_OK(hm_provider_alloc(d, 3 * GRAN, 0, &p));
    char *c = p;
    CHECK_OK(hm_provider_split(d, c, 3 * GRAN, GRAN));
    CHECK_RES(ops->ipc.get(st, c, GRAN, pl, &fd), HM_ERROR_NOT_SUPPORTED); /* part of one */
    CHECK_OK(hm_provider_merge(d, c, c + GRAN, 3 * GRAN));
    REQUIRE_OK(ops->ipc.get(st, c, 3 * GRAN, pl, &fd));
    CHECK_OK(ops->ipc.put(st, pl));
    drv.reset();
    CHECK_OK(hm_provider_free(d, c, 3 * GRAN));
    CHECK(vmm_held(0, 0));
    CHECK_EQ(drv.calls("cuMemUnmap"), 1);

    /* Across two mappings: freed whole, both go. */
    char *a, *b;
    REQUIRE(adjacent_pair(d, 2, &a, &b));
    dev_put(d, a, 2 * GRAN, 3);
    dev_put(d, b, 2 * GRAN, 4);
    CHECK_OK(hm_provider_merge(d, a, b, 4 * GRAN));
    CHECK(dev_check(d, a, 2 * GRAN, 3) && dev_check(d, b, 2 * GRAN, 4));
    CHECK_RES(ops->ipc.get(st, a, 4 * GRAN, pl, &fd), HM_ERROR_NOT_SUPPORTED); /* two */
    drv.reset();
    CHECK_OK(hm_provider_free(d, a, 4 * GRAN));
    CHECK(vmm_held(0, 0));
    CHECK_EQ(drv.calls("cuMemUnmap"), 2);
    CHECK_EQ(drv.calls("cuMemAddressFree"), 2);

    /* Across two, split again off the boundary, pieces freed one by one:
     * each mapping goes with its own last byte. [a, a+3G) spans both. */
    REQUIRE(adjacent_pair(d, 2, &a, &b));
    CHECK_OK(hm_provider_merge(d, a, b, 4 * GRAN));
    CHECK_OK(hm_provider_split(d, a, 4 * GRAN, 3 * GRAN));
    CHECK_OK(hm_provider_split(d, a, 3 * GRAN, GRAN));
    /* pieces: [a, +1G) [a+1G, +2G: spans both) [a+3G, +1G) */
    CHECK_OK(hm_provider_free(d, a, GRAN));
    CHECK(vmm_held(2, 2));
    CHECK_OK(hm_provider_free(d, a + GRAN, 2 * GRAN));
    CHECK_MSG(vmm_held(1, 1), "the first mapping stays after its last byte went");
    CHECK_OK(hm_provider_free(d, a + 3 * GRAN, GRAN));
    CHECK(vmm_held(0, 0));

    /* A merged range of the first half of one mapping and the whole next
     * one, the rest of the first freed first. */
    REQUIRE(adjacent_pair(d, 2, &a, &b));
    CHECK_OK(hm_provider_split(d, a, 2 * GRAN, GRAN));
    CHECK_OK(hm_provider_merge(d, a + GRAN, b, 3 * GRAN));
    CHECK_OK(hm_provider_free(d, a, GRAN));
    CHECK(vmm_held(2, 2));
    CHECK_OK(hm_provider_free(d, a + GRAN, 3 * GRAN));
    CHECK(vmm_held(0, 0));
}

static void test_vmm_refusals(hm_provider_t *d) {
    hm_test_set_context("VMM split/merge: refusals");
    void *p = NULL;
    REQUIRE_OK(hm_provider_alloc(d, 4 * GRAN, 0, &p));
    char *c = p;
    hm_log_set_level(HM_LOG_ERROR);
    hm_log_set_sink(count_log, NULL);
    drv.reset();
    struct {
        hm_result_t r;
        const char *what;
    } t[16];
    size_t n = 0;
#define REFUSE(call) t[n++] = (typeof(t[0])){(call), #call}
    REFUSE(hm_provider_split(d, c, 4 * GRAN, GRAN / 2));        /* not a multiple */
    REFUSE(hm_provider_split(d, c, 4 * GRAN, GRAN + 4096));
    REFUSE(hm_provider_split(d, c, 3 * GRAN, GRAN));            /* not the piece's size */
    REFUSE(hm_provider_split(d, c + GRAN, 3 * GRAN, GRAN));     /* not a piece */
    REFUSE(hm_provider_free(d, c + GRAN, GRAN));                /* inside a piece */
    REFUSE(hm_provider_free(d, c, 2 * GRAN));                   /* not its size */
    REFUSE(hm_provider_merge(d, c, c + 2 * GRAN, 4 * GRAN));    /* not a piece at hi */
    CHECK_OK(hm_provider_split(d, c, 4 * GRAN, GRAN));
    CHECK_OK(hm_provider_split(d, c + GRAN, 3 * GRAN, GRAN));
    /* pieces [0,1) [1,2) [2,4) in granules */
    REFUSE(hm_provider_merge(d, c, c + 2 * GRAN, 4 * GRAN));    /* not adjacent */
    REFUSE(hm_provider_merge(d, c, c + 2 * GRAN, 3 * GRAN));    /* the sizes fit, a gap */
    REFUSE(hm_provider_merge(d, c, c + GRAN, 3 * GRAN));        /* total not the two */
    REFUSE(hm_provider_merge(d, c + GRAN, c + 2 * GRAN, 4 * GRAN));
    REFUSE(hm_provider_free(d, c + GRAN, 3 * GRAN));            /* spans two pieces */
    CHECK_OK(hm_provider_free(d, c + GRAN, GRAN));
    REFUSE(hm_provider_merge(d, c, c + GRAN, 2 * GRAN));        /* hi freed */
    REFUSE(hm_provider_free(d, c + GRAN, GRAN));                /* freed twice */
#undef REFUSE
    hm_log_set_sink(NULL, NULL);
    hm_log_set_level(HM_LOG_OFF);
    for (size_t i = 0; i < n; i++)
        CHECK_MSG(t[i].r == HM_ERROR_INVALID_ARGUMENT, "%s (%zu) -> %s", t[i].what, i,
                  hm_result_string(t[i].r));
    CHECK_MSG(g_logged >= (int)n, "%d log lines for %zu refusals", (int)g_logged, n);
    CHECK_EQ(drv.calls("cuMemUnmap"), 0);
    CHECK_EQ(drv.calls("cuMemAddressFree"), 0);
    CHECK(vmm_held(1, 1));
    CHECK_OK(hm_provider_free(d, c, GRAN));
    CHECK_OK(hm_provider_free(d, c + 2 * GRAN, 2 * GRAN));
    CHECK(vmm_held(0, 0));
}

static void test_vmm_free_failures(void) {
    hm_test_set_context("VMM free: cuMemUnmap and cuMemAddressFree failing");
    hm_provider_t *d;
    REQUIRE_OK(cu_provider_with(HM_CUDA_MEMORY_DEVICE, 0, HM_CUDA_ALLOCATOR_VMM, &d));
    /* The last piece's unmap refused: the piece stays allocated, the
     * mapping too; the free again succeeds and both go. */
    void *p = NULL;
    REQUIRE_OK(hm_provider_alloc(d, 2 * GRAN, 0, &p));
    char *c = p;
    CHECK_OK(hm_provider_split(d, c, 2 * GRAN, GRAN));
    CHECK_OK(hm_provider_free(d, c, GRAN));
    REQUIRE(drv.fail_next("cuMemUnmap", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_free(d, c + GRAN, GRAN), HM_ERROR_DRIVER);
    CHECK(vmm_held(1, 1));
    CHECK_OK(hm_provider_free(d, c + GRAN, GRAN));
    CHECK(vmm_held(0, 0));

    /* A merged range over two mappings, the second unmap refused: the first
     * is unmapped already; the free again unmaps the second and frees both
     * reservations. */
    char *a, *b;
    REQUIRE(adjacent_pair(d, 1, &a, &b));
    CHECK_OK(hm_provider_merge(d, a, b, 2 * GRAN));
    drv.reset();
    REQUIRE(drv.fail_next("cuMemUnmap", 2, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_free(d, a, 2 * GRAN), HM_ERROR_DRIVER);
    CHECK(vmm_held(1, 1));
    CHECK_EQ(drv.calls("cuMemAddressFree"), 0);
    CHECK_OK(hm_provider_free(d, a, 2 * GRAN));
    CHECK(vmm_held(0, 0));
    CHECK_EQ(drv.calls("cuMemUnmap"), 3);
    CHECK_EQ(drv.calls("cuMemAddressFree"), 2);

    /* The reservation's free refused: the memory is gone (unmapped), the
     * error reported; the free again frees the reservation, and a third
     * time the range is unknown. */
    REQUIRE_OK(hm_provider_alloc(d, GRAN, 0, &p));
    drv.reset();
    REQUIRE(drv.fail_next("cuMemAddressFree", 1, CUDA_ERROR_INVALID_VALUE) == 0);
    CHECK_RES(hm_provider_free(d, p, GRAN), HM_ERROR_INVALID_ARGUMENT); /* INVALID_VALUE */
    CHECK(vmm_held(0, 0));
    CHECK_OK(hm_provider_free(d, p, GRAN));
    CHECK_EQ(drv.calls("cuMemAddressFree"), 2);
    CHECK_RES(hm_provider_free(d, p, GRAN), HM_ERROR_INVALID_ARGUMENT);
    /* The same, the reservation freed by the next free instead. */
    void *q = NULL;
    REQUIRE_OK(hm_provider_alloc(d, GRAN, 0, &p));
    REQUIRE_OK(hm_provider_alloc(d, GRAN, 0, &q));
    drv.reset();
    REQUIRE(drv.fail_next("cuMemAddressFree", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_free(d, p, GRAN), HM_ERROR_DRIVER);
    CHECK_OK(hm_provider_free(d, q, GRAN));
    CHECK_EQ(drv.calls("cuMemAddressFree"), 3);
    /* ... or by the provider's destroy. */
    REQUIRE_OK(hm_provider_alloc(d, GRAN, 0, &p));
    drv.reset();
    REQUIRE(drv.fail_next("cuMemAddressFree", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
    CHECK_RES(hm_provider_free(d, p, GRAN), HM_ERROR_DRIVER);
    CHECK_OK(hm_provider_destroy(d));
    CHECK_EQ(drv.calls("cuMemAddressFree"), 2);
    CHECK(vmm_held(0, 0));
}

static void test_vmm_split_pool(void) {
    hm_test_set_context("VMM split/merge through a pool (the tracker follows)");
    hm_provider_t *d;
    REQUIRE_OK(cu_provider_with(HM_CUDA_MEMORY_DEVICE, 0, HM_CUDA_ALLOCATOR_VMM, &d));
    hm_pool_t *pool;
    REQUIRE_OK(hm_proxy_pool_create(d, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    void *p = NULL;
    REQUIRE_OK(hm_pool_provider_alloc(pool, 4 * GRAN, 0, &p));
    char *c = p;
    CHECK_OK(hm_pool_provider_split(pool, c, 4 * GRAN, GRAN));
    hm_allocation_info_t ai;
    REQUIRE_OK(hm_allocation_info(c + 2 * GRAN, &ai));
    CHECK(ai.base == c + GRAN && ai.size == 3 * GRAN);
    CHECK_RES(hm_pool_provider_split(pool, c + GRAN, 3 * GRAN, 4096), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_allocation_info(c + 2 * GRAN, &ai)); /* a refused split changes nothing */
    CHECK(ai.base == c + GRAN && ai.size == 3 * GRAN);
    CHECK_OK(hm_pool_provider_free(pool, c, GRAN));
    CHECK(vmm_held(1, 1));
    CHECK_OK(hm_pool_provider_split(pool, c + GRAN, 3 * GRAN, GRAN));
    CHECK_OK(hm_pool_provider_merge(pool, c + GRAN, c + 2 * GRAN, 3 * GRAN));
    REQUIRE_OK(hm_allocation_info(c + GRAN, &ai));
    CHECK(ai.base == c + GRAN && ai.size == 3 * GRAN);
    CHECK_OK(hm_pool_provider_free(pool, c + GRAN, 3 * GRAN));
    CHECK(vmm_held(0, 0));
    CHECK_OK(hm_pool_destroy(pool));
}

static void test_vmm_split(void) {
    hm_provider_t *d;
    REQUIRE_OK(cu_provider_with(HM_CUDA_MEMORY_DEVICE, 0, HM_CUDA_ALLOCATOR_VMM, &d));
    CHECK(hm_provider_caps(d) & HM_PROVIDER_CAP_SPLIT_MERGE);
    CHECK(!(hm_provider_caps(d) & (HM_PROVIDER_CAP_PURGE_LAZY | HM_PROVIDER_CAP_PURGE_FORCE)));
    hm_provider_t *legacy;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &legacy));
    CHECK(!(hm_provider_caps(legacy) & HM_PROVIDER_CAP_SPLIT_MERGE));
    CHECK_OK(hm_provider_destroy(legacy));
    REQUIRE(vmm_held(0, 0));
    test_vmm_split_orders(d);
    test_vmm_merge(d);
    test_vmm_refusals(d);
    CHECK_OK(hm_provider_destroy(d));
    test_vmm_free_failures();
    test_vmm_split_pool();
}


/* ---- IPC of VMM memory: shareable handles ---- */

#define IPC_SIZE (3 * MIB + 5)

static struct {
    CUresult (*get_access)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
    CUresult (*addr_range)(CUdeviceptr *, size_t *, CUdeviceptr);
    int (*set_peer)(int, int, int);
} vdrv;
static void vmm_driver_api(void) {
    void *h = dlopen(getenv("HM_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h != NULL);
    *(void **)&vdrv.get_access = dlsym(h, "cuMemGetAccess");
    *(void **)&vdrv.addr_range = dlsym(h, "cuMemGetAddressRange_v2");
    *(void **)&vdrv.set_peer = dlsym(h, "hm_cuda_test_set_peer_access");
    REQUIRE(vdrv.get_access && vdrv.addr_range && vdrv.set_peer);
}

static hm_result_t vmm_provider(int ordinal, hm_cuda_shareable_t sh, const int *peers,
                                size_t npeers, hm_provider_t **out) {
    hm_cuda_params_t *p;
    hm_result_t r = hm_cuda_params_create(&p);
    if (r != HM_SUCCESS) return r;
    if ((r = hm_cuda_params_set_ordinal(p, ordinal)) == HM_SUCCESS &&
        (r = hm_cuda_params_set_allocator(p, HM_CUDA_ALLOCATOR_VMM)) == HM_SUCCESS &&
        (r = hm_cuda_params_set_shareable_handle(p, sh)) == HM_SUCCESS &&
        (r = hm_cuda_params_set_peers(p, peers, npeers)) == HM_SUCCESS)
        r = hm_cuda_provider_create(p, out);
    hm_cuda_params_destroy(p);
    return r;
}

/* Open descriptors of this process. */
static int fd_count(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static int rw_access(int dev, const void *p) {
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    unsigned long long f = 0;
    if (vdrv.get_access(&f, &loc, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return -1;
    return f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* The VMM payload (cuda.c's cu_vmm_payload_t), after the IPC header. */
enum {
    VP_MAGIC = 0, VP_KIND = 4, VP_UUID = 8, VP_ALLOC = 24, VP_OFFSET = 32, VP_SIZE = 40,
    VP_FD = 48, VP_ZERO = 52, VP_ID = 56, VP_ZERO2 = 64, VP_FABRIC = 48, VP_LEN = 112
};
static void put_le(unsigned char *b, size_t at, unsigned n, uint64_t v) {
    for (unsigned i = 0; i < n; i++) b[at + i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_le(const unsigned char *b, size_t at, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)b[at + i] << (8 * i);
    return v;
}

typedef struct vmm_live {
    uint64_t handles, mappings;
    int fds;
} vmm_live_t;
static vmm_live_t vmm_live(void) {
    hm_cuda_test_stats_t st = stats();
    return (vmm_live_t){st.live_vmm_handles, st.live_vmm_mappings, fd_count()};
}
static int vmm_same(vmm_live_t a, vmm_live_t b) {
    return a.handles == b.handles && a.mappings == b.mappings && a.fds == b.fds;
}

/* ipc.open of payload through prov's ops with a copy of fd (-1: none),
 * which the open must not keep. */
static hm_result_t raw_open(hm_provider_t *prov, const unsigned char *pl, int fd, size_t size,
                            void **out) {
    const hm_provider_ops_t *o = hm_provider_get_ops(prov);
    int mine = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    hm_result_t r = o->ipc.open(hm_provider_get_state(prov), pl, mine, size, out);
    if (mine >= 0) close(mine);
    return r;
}
static hm_result_t raw_close(hm_provider_t *prov, void *p, size_t size) {
    const hm_provider_ops_t *o = hm_provider_get_ops(prov);
    return o->ipc.close(hm_provider_get_state(prov), p, size);
}

/* One forged payload: refused with `want`, nothing left mapped, held or
 * open. */
static void forged_open(hm_provider_t *prov, const unsigned char *good, int fd, size_t size,
                        const char *what, size_t at, unsigned n, uint64_t v, hm_result_t want) {
    unsigned char pl[VP_LEN];
    memcpy(pl, good, VP_LEN);
    if (n) put_le(pl, at, n, v);
    vmm_live_t before = vmm_live();
    void *q = (void *)1;
    hm_result_t r = raw_open(prov, pl, fd, size, &q);
    CHECK_MSG(r == want && q == NULL, "forged %s: %s (want %s)", what, hm_result_string(r),
              hm_result_string(want));
    if (r == HM_SUCCESS) (void)raw_close(prov, q, size);
    CHECK_MSG(vmm_same(before, vmm_live()), "forged %s left something behind", what);
}

/* Parameters, peers, whole-mapping exports, put of a wrong payload, and
 * ipc.open of every forgery and every failing driver call, in one process
 * (the provider's ops, no IPC layer: it refuses a process's own handles). */
static void test_vmm_share_local(void) {
    hm_test_set_context("VMM IPC: parameters and peers");
    hm_cuda_params_t *params;
    REQUIRE_OK(hm_cuda_params_create(&params));
    CHECK_RES(hm_cuda_params_set_shareable_handle(params, (hm_cuda_shareable_t)3),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_shareable_handle(NULL, HM_CUDA_SHAREABLE_FD),
              HM_ERROR_INVALID_ARGUMENT);
    int bad[] = {0, -1};
    CHECK_RES(hm_cuda_params_set_peers(params, bad, 2), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_peers(params, NULL, 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_cuda_params_set_peers(params, bad, HM_CUDA_PEERS_MAX + 1),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_cuda_params_set_peers(params, NULL, 0));
    hm_provider_t *x = NULL;
    CHECK_OK(hm_cuda_params_set_shareable_handle(params, HM_CUDA_SHAREABLE_FABRIC));
    CHECK_RES(hm_cuda_provider_create(params, &x), HM_ERROR_INVALID_ARGUMENT); /* legacy */
    CHECK_OK(hm_cuda_params_set_shareable_handle(params, HM_CUDA_SHAREABLE_FD));
    int one = 1;
    CHECK_OK(hm_cuda_params_set_peers(params, &one, 1));
    CHECK_RES(hm_cuda_provider_create(params, &x), HM_ERROR_INVALID_ARGUMENT); /* legacy */
    CHECK_OK(hm_cuda_params_destroy(params));
    const char *fab = getenv("HM_CUDA_TEST_FABRIC");
    if (!fab || strcmp(fab, "1") != 0) {
        CHECK_RES(vmm_provider(0, HM_CUDA_SHAREABLE_FABRIC, NULL, 0, &x), HM_ERROR_NOT_SUPPORTED);
        CHECK(x == NULL);
    }
    int five = 5, own_and_peer[] = {0, 1, 1};
    CHECK_RES(vmm_provider(0, HM_CUDA_SHAREABLE_FD, &five, 1, &x), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE(vdrv.set_peer(1, 0, 0) == 0);
    CHECK_RES(vmm_provider(0, HM_CUDA_SHAREABLE_FD, &one, 1, &x), HM_ERROR_NOT_SUPPORTED);
    REQUIRE(vdrv.set_peer(1, 0, 1) == 0);
    hm_provider_t *pp;
    REQUIRE_OK(vmm_provider(0, HM_CUDA_SHAREABLE_FD, own_and_peer, 3, &pp));
    void *m = NULL;
    REQUIRE_OK(hm_provider_alloc(pp, 2 * MIB, 0, &m));
    CHECK_EQ(rw_access(0, m), 1);
    CHECK_EQ(rw_access(1, m), 1);
    CHECK_OK(hm_provider_free(pp, m, 2 * MIB));
    CHECK_OK(hm_provider_destroy(pp));
    REQUIRE_OK(vmm_provider(0, HM_CUDA_SHAREABLE_FD, NULL, 0, &pp));
    REQUIRE_OK(hm_provider_alloc(pp, 2 * MIB, 0, &m));
    CHECK_EQ(rw_access(0, m), 1);
    CHECK_EQ(rw_access(1, m), 0); /* no peers asked for */
    CHECK_OK(hm_provider_free(pp, m, 2 * MIB));
    CHECK_OK(hm_provider_destroy(pp));
    /* NONE: no IPC. */
    hm_provider_t *none;
    REQUIRE_OK(vmm_provider(0, HM_CUDA_SHAREABLE_NONE, NULL, 0, &none));
    CHECK(!(hm_provider_caps(none) & HM_PROVIDER_CAP_IPC));
    hm_pool_t *np;
    REQUIRE_OK(pool_over(0, none, HM_POOL_FLAG_OWN_PROVIDER, &np));
    void *nm = hm_pool_malloc(np, 4096);
    REQUIRE(nm);
    hm_ipc_handle_t *h;
    size_t hl;
    CHECK(hm_ipc_get(nm, &h, &hl) != HM_SUCCESS);
    CHECK_OK(hm_pool_free(np, nm));
    CHECK_OK(hm_pool_destroy(np));

    hm_test_set_context("VMM IPC: export, put, open in one process");
    hm_provider_t *d, *legacy;
    REQUIRE_OK(vmm_provider(0, HM_CUDA_SHAREABLE_FD, &one, 1, &d));
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &legacy));
    const hm_provider_ops_t *o = hm_provider_get_ops(d);
    void *st = hm_provider_get_state(d);
    vmm_live_t base = vmm_live();
    void *p = NULL;
    const size_t sz = 3 * MIB + 5, len = 4 * MIB;
    REQUIRE_OK(hm_provider_alloc(d, sz, 0, &p));
    dev_put(d, p, sz, 51);
    /* The driver reports the mapping (cuMemGetAddressRange_v2, pointer attributes). */
    CUdeviceptr rb = 0;
    size_t rl = 0;
    CUcontext prim = NULL;
    REQUIRE(drv.primary_retain(&prim, 0) == CUDA_SUCCESS && drv.ctx_set(prim) == CUDA_SUCCESS);
    CHECK(vdrv.addr_range(&rb, &rl, (CUdeviceptr)(uintptr_t)p + 5000) == CUDA_SUCCESS);
    CHECK(rb == (uintptr_t)p && rl == len);
    REQUIRE(drv.ctx_set(NULL) == CUDA_SUCCESS && drv.primary_release(0) == CUDA_SUCCESS);
    hm_cuda_allocation_t ai;
    CHECK_OK(hm_cuda_allocation_info(d, (char *)p + 5000, &ai));
    CHECK(ai.type == HM_CUDA_MEMORY_DEVICE && ai.device == 0 && ai.base == (uintptr_t)p &&
          ai.size == len);
    unsigned char pl[VP_LEN], junk[VP_LEN];
    int fd = -1;
    /* Not a whole mapping: refused, nothing held. */
    vmm_live_t mid = vmm_live();
    CHECK_RES(o->ipc.get(st, (char *)p + 2 * MIB, 2 * MIB, junk, &fd), HM_ERROR_NOT_SUPPORTED);
    CHECK_RES(o->ipc.get(st, p, 2 * MIB, junk, &fd), HM_ERROR_NOT_SUPPORTED);
    CHECK(fd == -1 && vmm_same(mid, vmm_live()));
    REQUIRE_OK(o->ipc.get(st, p, sz, pl, &fd));
    CHECK(fd >= 0);
    CHECK_EQ(get_le(pl, VP_MAGIC, 4), 0x68637532u);
    CHECK_EQ(get_le(pl, VP_KIND, 4), 1);
    CHECK_EQ(get_le(pl, VP_ALLOC, 8), len);
    CHECK_EQ(get_le(pl, VP_OFFSET, 8), 0);
    CHECK_EQ(get_le(pl, VP_SIZE, 8), sz);
    CHECK_EQ((int)get_le(pl, VP_FD, 4), fd);
    /* put of a payload naming another descriptor, or the right one with
     * another id: nothing closed. */
    int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(other >= 0);
    memcpy(junk, pl, VP_LEN);
    put_le(junk, VP_FD, 4, (uint64_t)other);
    CHECK_RES(o->ipc.put(st, junk), HM_ERROR_INVALID_HANDLE);
    CHECK(fcntl(other, F_GETFD) >= 0);
    memcpy(junk, pl, VP_LEN);
    put_le(junk, VP_ID, 8, get_le(pl, VP_ID, 8) + 1);
    CHECK_RES(o->ipc.put(st, junk), HM_ERROR_INVALID_HANDLE);
    CHECK(fcntl(fd, F_GETFD) >= 0);
    close(other);

    /* Open through a legacy-mode provider and through the VMM one: the data,
     * the access (the VMM one's peer too), close through the other. */
    void *q = NULL, *q2 = NULL;
    REQUIRE_OK(raw_open(legacy, pl, fd, sz, &q));
    CHECK(q != NULL && q != p);
    CHECK(dev_check(legacy, q, sz, 51));
    CHECK_EQ(rw_access(0, q), 1);
    CHECK_EQ(rw_access(1, q), 0);
    REQUIRE_OK(raw_open(d, pl, fd, sz, &q2));
    CHECK_EQ(rw_access(1, q2), 1);
    dev_put(d, q2, 4096, 52);
    CHECK(dev_check(legacy, q, 4096, 52)); /* one physical allocation */
    CHECK(dev_check(d, p, 4096, 52));
    drv.reset();
    CHECK_OK(raw_close(d, q, sz)); /* the legacy provider opened it */
    CHECK_OK(raw_close(legacy, q2, sz));
    CHECK_EQ(drv.calls("cuMemUnmap"), 2);
    CHECK_EQ(drv.calls("cuIpcCloseMemHandle"), 0);

    /* Every field forged. */
    uint64_t gran = 2 * MIB;
    forged_open(legacy, pl, fd, sz, "magic", VP_MAGIC, 4, 0x68637533u, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "kind 0", VP_KIND, 4, 0, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "kind 3", VP_KIND, 4, 3, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "reserved", VP_ZERO, 4, 1, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "reserved (tail)", VP_LEN - 1, 1, 1, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "uuid", VP_UUID, 8, 0x1234, HM_ERROR_NOT_SUPPORTED);
    forged_open(legacy, pl, fd, sz, "allocation 0", VP_ALLOC, 8, 0, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "allocation not a granule", VP_ALLOC, 8, len + 4096,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "allocation too small", VP_ALLOC, 8, gran,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "allocation larger than the real one", VP_ALLOC, 8,
                len + gran, HM_ERROR_INVALID_HANDLE);
    /* So large that no address range is reserved: out of (address) memory. */
    forged_open(legacy, pl, fd, sz, "allocation 2^62", VP_ALLOC, 8, (uint64_t)1 << 62,
                HM_ERROR_OUT_OF_MEMORY);
    forged_open(legacy, pl, fd, sz, "offset not a granule", VP_OFFSET, 8, 4096,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "offset past the end", VP_OFFSET, 8, gran,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "offset wraps", VP_OFFSET, 8, UINT64_MAX - gran + 1,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "size 0", VP_SIZE, 8, 0, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, sz, "size not the handle's", VP_SIZE, 8, sz - 1,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, fd, 0, "handle size 0", 0, 0, 0, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, -1, sz, "no descriptor", 0, 0, 0, HM_ERROR_INVALID_HANDLE);
    int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    forged_open(legacy, pl, nul, sz, "another file", 0, 0, 0, HM_ERROR_INVALID_HANDLE);
    close(nul);
    /* Every driver call of the open failing: an error, nothing behind. */
    const char *calls[] = {"cuMemImportFromShareableHandle",
                           "cuMemGetAllocationPropertiesFromHandle", "cuMemAddressReserve",
                           "cuMemMap", "cuMemSetAccess", "cuMemRelease"};
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
        vmm_live_t before = vmm_live();
        REQUIRE(drv.fail_next(calls[i], 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
        q = (void *)1;
        hm_result_t r = raw_open(d, pl, fd, sz, &q);
        CHECK_MSG(r != HM_SUCCESS && q == NULL, "open with %s failing: %s", calls[i],
                  hm_result_string(r));
        CHECK_MSG(vmm_same(before, vmm_live()), "open with %s failing left something", calls[i]);
    }
    drv.reset();
    void *kept = NULL; /* outlives the exporter's free */
    REQUIRE_OK(raw_open(legacy, pl, fd, sz, &kept));
    CHECK_OK(o->ipc.put(st, pl));
    CHECK(fcntl(fd, F_GETFD) < 0); /* closed by the put */
    /* Every driver call of the export failing: an error, nothing held. */
    const char *xcalls[] = {"cuMemGetAddressRange_v2", "cuMemRetainAllocationHandle",
                            "cuMemExportToShareableHandle", "cuMemRelease"};
    for (size_t i = 0; i < sizeof(xcalls) / sizeof(xcalls[0]); i++) {
        vmm_live_t before = vmm_live();
        REQUIRE(drv.fail_next(xcalls[i], 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
        fd = -1;
        hm_result_t r = o->ipc.get(st, p, sz, junk, &fd);
        CHECK_MSG(r != HM_SUCCESS && fd == -1, "export with %s failing: %s", xcalls[i],
                  hm_result_string(r));
        CHECK_MSG(vmm_same(before, vmm_live()), "export with %s failing left something",
                  xcalls[i]);
    }
    drv.reset();
    CHECK_OK(hm_provider_free(d, p, sz));
    CHECK(dev_check(legacy, kept, 4096, 52));
    dev_put(legacy, kept, 4096, 53);
    CHECK(dev_check(legacy, kept, 4096, 53));
    CHECK_OK(raw_close(legacy, kept, sz));
    CHECK_MSG(vmm_same(base, vmm_live()), "the export's memory or descriptors outlive it");
    CHECK_OK(hm_provider_destroy(d));
    CHECK_OK(hm_provider_destroy(legacy));

    hm_test_set_context("VMM IPC: exports from every pool");
    int fds0 = fd_count();
    for (int k = 0; k < 3; k++) {
        hm_provider_t *vp;
        REQUIRE_OK(vmm_provider(0, HM_CUDA_SHAREABLE_FD, NULL, 0, &vp));
        hm_pool_t *pool;
        hm_result_t r = pool_over(k, vp, HM_POOL_FLAG_OWN_PROVIDER, &pool);
        if (r == HM_ERROR_NOT_SUPPORTED) {
            hm_provider_destroy(vp);
            continue;
        }
        REQUIRE_OK(r);
        const size_t sizes[] = {100, 64 * KIB, 3 * MIB + 5, 5 * MIB};
        for (size_t i = 0; i < 4; i++) {
            void *b = hm_pool_malloc(pool, sizes[i]);
            REQUIRE(b);
            hm_ipc_handle_t *hh = NULL;
            size_t hlen = 0;
            CHECK_OK(hm_ipc_get(b, &hh, &hlen));
            hm_ipc_handle_info_t info;
            CHECK_OK(hm_ipc_handle_info(hh, hlen, &info));
            CHECK(info.has_fd && info.payload_size == VP_LEN);
            CHECK_OK(hm_ipc_put(hh));
            CHECK_OK(hm_pool_free(pool, b));
        }
        CHECK_OK(hm_pool_destroy(pool));
    }
    CHECK_EQ(fd_count(), fds0);
}

/* Fabric handles (the test driver's HM_CUDA_TEST_FABRIC=1): by value, no
 * descriptor; opened by a legacy provider; a forged value refused. */
static void test_vmm_fabric_local(void) {
    hm_test_set_context("VMM IPC: fabric handles in one process");
    hm_provider_t *f, *legacy;
    REQUIRE_OK(vmm_provider(0, HM_CUDA_SHAREABLE_FABRIC, NULL, 0, &f));
    CHECK(hm_provider_caps(f) & HM_PROVIDER_CAP_IPC);
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &legacy));
    const hm_provider_ops_t *o = hm_provider_get_ops(f);
    void *st = hm_provider_get_state(f);
    vmm_live_t base = vmm_live();
    void *p = NULL;
    const size_t sz = 2 * MIB;
    REQUIRE_OK(hm_provider_alloc(f, sz, 0, &p));
    dev_put(f, p, sz, 61);
    unsigned char pl[VP_LEN];
    int fd = 7;
    REQUIRE_OK(o->ipc.get(st, p, sz, pl, &fd));
    CHECK_EQ(fd, -1);
    CHECK_EQ(get_le(pl, VP_KIND, 4), 2);
    void *q = NULL;
    REQUIRE_OK(raw_open(legacy, pl, -1, sz, &q));
    CHECK(dev_check(legacy, q, sz, 61));
    CHECK_OK(raw_close(f, q, sz));
    /* The driver's value forged: its pid, descriptor, size, nonce. */
    forged_open(legacy, pl, -1, sz, "fabric pid", VP_FABRIC + 4, 4, 1, HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, -1, sz, "fabric descriptor", VP_FABRIC + 8, 4, 0,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, -1, sz, "fabric size", VP_FABRIC + 16, 8, 4 * MIB,
                HM_ERROR_INVALID_HANDLE);
    forged_open(legacy, pl, -1, sz, "fabric nonce", VP_FABRIC + 24, 8,
                get_le(pl, VP_FABRIC + 24, 8) ^ 1, HM_ERROR_INVALID_HANDLE);
    CHECK_OK(o->ipc.put(st, pl));
    CHECK_OK(hm_provider_free(f, p, sz));
    CHECK(vmm_same(base, vmm_live()));
    CHECK_OK(hm_provider_destroy(f));
    CHECK_OK(hm_provider_destroy(legacy));
}

/* Two processes: the importer, exec'd afresh, gets handle A with its
 * descriptor over the channel and handle B alone (its descriptor by
 * pidfd_getfd; a fabric handle by value). */
static int vmm_importer(int sock, bool fabric) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    static unsigned char ha[4096], hb[4096];
    size_t la = 0, lb = 0;
    int fa = -1, fb = -1;
    if (hm_ipc_channel_recv(ch, ha, sizeof(ha), &la, &fa) != HM_SUCCESS) return 11;
    if (hm_ipc_channel_recv(ch, hb, sizeof(hb), &lb, &fb) != HM_SUCCESS) return 12;
    if ((fa < 0) != fabric || fb >= 0) return 13;
    int one = 1;
    hm_provider_t *p0, *p1;
    if (vmm_provider(0, HM_CUDA_SHAREABLE_FD, &one, 1, &p0) != HM_SUCCESS) return 14;
    if (cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &p1) != HM_SUCCESS) return 15;
    hm_pool_t *a, *b;
    if (pool_over(1, p0, HM_POOL_FLAG_OWN_PROVIDER, &a) != HM_SUCCESS) return 16;
    if (pool_over(0, p1, HM_POOL_FLAG_OWN_PROVIDER, &b) != HM_SUCCESS) return 17;
    driver_api();
    vmm_driver_api();
    vmm_live_t base = vmm_live();
    drv.reset();
    /* Truncated handles: refused before anything is imported. */
    void *t = NULL;
    if (hm_ipc_open_fd(a, (hm_ipc_handle_t *)ha, la - 1, fa, &t) == HM_SUCCESS || t) return 18;
    if (hm_ipc_open_fd(a, (hm_ipc_handle_t *)ha, HM_IPC_HEADER_SIZE + 8, fa, &t) == HM_SUCCESS)
        return 19;
    if (drv.calls("cuMemImportFromShareableHandle") != 0) return 20;
    void *qa = NULL, *qa2 = NULL, *qb = NULL;
    if (hm_ipc_open_fd(a, (hm_ipc_handle_t *)ha, la, fa, &qa) != HM_SUCCESS || !qa) return 21;
    if (fa >= 0) close(fa);
    if (!dev_check(p0, qa, IPC_SIZE, 41)) return 22;
    if (rw_access(0, qa) != 1 || rw_access(1, qa) != 1) return 23; /* its peer too */
    /* A legacy-mode importer, B by pidfd (or fabric by value). */
    if (hm_ipc_open(b, (hm_ipc_handle_t *)hb, lb, &qb) != HM_SUCCESS || !qb) return 24;
    if (!dev_check(p1, qb, IPC_SIZE, 42)) return 25;
    if (rw_access(1, qb) != 0) return 26; /* no peers asked for */
    dev_put(p1, qb, 4096, 43);
    /* A in the second pool of the same context: the same mapping. */
    if (hm_ipc_open(b, (hm_ipc_handle_t *)ha, la, &qa2) != HM_SUCCESS || qa2 != qa) return 27;
    if (drv.calls("cuMemImportFromShareableHandle") != 2) return 28;
    if (stats().live_vmm_mappings != base.mappings + 2) return 29;
    /* The opening pool destroyed with A open: the mapping stays, and the
     * legacy provider's pool closes it. */
    if (hm_pool_destroy(a) != HM_SUCCESS) return 30;
    if (drv.calls("cuMemUnmap") != 0 || !dev_check(p1, qa2, 4096, 41)) return 31;
    if (hm_ipc_close(qa2) != HM_SUCCESS || hm_ipc_close(qb) != HM_SUCCESS) return 32;
    if (hm_pool_destroy(b) != HM_SUCCESS) return 33;
    if (drv.calls("cuMemUnmap") != 2 || drv.calls("cuIpcCloseMemHandle") != 0) return 34;
    if (!vmm_same(base, vmm_live())) return 35;
    char ack = 1;
    if (hm_ipc_channel_send_bytes(ch, &ack, 1) != HM_SUCCESS) return 36;
    hm_ipc_channel_destroy(ch);
    return 0;
}

static void test_vmm_ipc(const char *self, bool fabric) {
    hm_test_set_context(fabric ? "VMM IPC: fabric, two processes" : "VMM IPC: two processes");
    int fds0 = fd_count();
    int sv0;
    pid_t pid = hm_test_spawn_importer(self, fabric ? "fabric" : "vmm", &sv0);
    (void)hm_ipc_allow_importer(pid); /* Yama at ptrace_scope 1: pidfd_getfd */
    hm_provider_t *prov;
    REQUIRE_OK(vmm_provider(0, fabric ? HM_CUDA_SHAREABLE_FABRIC : HM_CUDA_SHAREABLE_FD, NULL, 0,
                            &prov));
    hm_pool_t *pool;
    REQUIRE_OK(pool_over(1, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    void *pa = hm_pool_malloc(pool, IPC_SIZE), *pb = hm_pool_malloc(pool, IPC_SIZE);
    REQUIRE(pa && pb);
    dev_put(prov, pa, IPC_SIZE, 41);
    dev_put(prov, pb, IPC_SIZE, 42);
    hm_ipc_handle_t *ha = NULL, *hb = NULL;
    size_t la = 0, lb = 0;
    REQUIRE_OK(hm_ipc_get(pa, &ha, &la));
    REQUIRE_OK(hm_ipc_get(pb, &hb, &lb));
    hm_ipc_channel_t *ch;
    REQUIRE_OK(hm_ipc_channel_from_fd(sv0, &ch));
    CHECK_OK(hm_ipc_channel_send(ch, ha, la));        /* with its descriptor */
    CHECK_OK(hm_ipc_channel_send_bytes(ch, hb, lb)); /* the bytes alone */
    char ack = 0;
    size_t got = 0;
    hm_result_t ar = hm_ipc_channel_recv_bytes(ch, &ack, 1, &got);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    CHECK_MSG(code == 0, "importer failed at step %d (status 0x%x)", code, st);
    if (code == 0) {
        CHECK(ar == HM_SUCCESS && got == 1 && ack == 1);
        CHECK(dev_check(prov, pb, 4096, 43)); /* the importer's write */
    }
    CHECK_OK(hm_ipc_put(ha));
    CHECK_OK(hm_ipc_put(hb));
    CHECK_OK(hm_pool_free(pool, pa));
    CHECK_OK(hm_pool_free(pool, pb));
    CHECK_OK(hm_pool_destroy(pool));
    hm_ipc_channel_destroy(ch);
    CHECK_EQ(fd_count(), fds0);
    CHECK_EQ(stats().live_vmm_handles, 0);
}

/* ---- IPC: an importer exec'd afresh ---- */


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
    if (strcmp(g_part, "importer") == 0 && argc > 3) {
        if (!getenv("HM_CUDA_DRIVER")) return 9;
        return vmm_importer(atoi(argv[2]), strcmp(argv[3], "fabric") == 0);
    }
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
        /* VMM mode (split and merge among the provider suite's cases), where
         * the driver has the virtual memory API. */
        cuf_t vf = {.type = HM_CUDA_MEMORY_DEVICE, .vmm = 1};
        hm_provider_t *vp;
        if (make_provider(&vf, &vp) == HM_SUCCESS) {
            CHECK_OK(hm_provider_destroy(vp));
            hm_test_suite_opts_t vo = {.can_free = 1, .max_alloc = 32 * MIB};
            hm_test_provider_suite("cuda device (vmm, hardware)", make_provider, &vf, &vo);
            vf.pool = 1;
            hm_test_pool_suite("native over cuda device (vmm, hardware)", make_pool, &vf, &opts);
        }
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
    if (PART("vmm_split")) {
        ran++;
        test_vmm_split();
    }
    if (PART("vmm_ipc")) {
        ran++;
        vmm_driver_api();
        test_vmm_share_local();
        test_vmm_ipc(argv[0], false);
    }
    if (strcmp(g_part, "vmm_fabric") == 0) {
        ran++;
        const char *fab = getenv("HM_CUDA_TEST_FABRIC");
        if (!fab || strcmp(fab, "1") != 0) HM_TEST_SKIP("HM_CUDA_TEST_FABRIC is not 1");
        vmm_driver_api();
        test_vmm_fabric_local();
        test_vmm_ipc(argv[0], true);
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
