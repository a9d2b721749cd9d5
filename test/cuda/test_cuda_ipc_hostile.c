/* hetmem tests — CUDA IPC against a hostile exporter, with the project's test
 * driver (cuda_test_driver.c, HM_CUDA_DRIVER set by CTest): the forgeries of
 * test/common/gpu_ipc_hostile.h, and the over-alignment offset of CUDA's
 * payload. CUDA handles travel by value.
 * SPDX-License-Identifier: MIT */
#include "cuda_test_driver.h"
#include "gpu_ipc_hostile.h"

#include <hetmem/providers/cuda.h>

static struct {
    hm_cuda_test_reset_fn reset;
    hm_cuda_test_get_stats_fn stats;
    hm_cuda_test_call_count_fn calls;
} drv;

static int cu_driver_api(void *h) {
    *(void **)&drv.reset = dlsym(h, "hm_cuda_test_reset");
    *(void **)&drv.stats = dlsym(h, "hm_cuda_test_get_stats");
    *(void **)&drv.calls = dlsym(h, "hm_cuda_test_call_count");
    return drv.reset && drv.stats && drv.calls;
}
static void cu_reset(void) { drv.reset(); }
static uint64_t cu_calls(const char *name) { return drv.calls(name); }
static gpu_stats_t cu_stats(void) {
    hm_cuda_test_stats_t s;
    drv.stats(&s);
    return (gpu_stats_t){.live_mappings = s.live_ipc_mappings, .live_refs = s.live_ipc_refs,
                         .live_device_allocs = s.live_device_allocs,
                         .live_allocs = s.live_allocs};
}

static hm_result_t cu_device_pool(hm_provider_t **prov, hm_pool_t **pool) {
    hm_cuda_params_t *p;
    hm_result_t r = hm_cuda_params_create(&p);
    if (r != HM_SUCCESS) return r;
    if ((r = hm_cuda_params_set_memory_type(p, HM_CUDA_MEMORY_DEVICE)) == HM_SUCCESS)
        r = hm_cuda_provider_create(p, prov);
    hm_cuda_params_destroy(p);
    if (r != HM_SUCCESS) return r;
    r = hm_proxy_pool_create(*prov, HM_POOL_FLAG_OWN_PROVIDER, pool);
    if (r != HM_SUCCESS) hm_provider_destroy(*prov);
    return r;
}

/* The payload's fields (cuda.c's cu_payload_t): magic, reserved, uuid,
 * buffer id, offset, size, then the driver's 64-byte handle, whose bytes
 * [24, 32) are the test driver's size field. */
enum { PL_UUID = 8, PL_OFFSET = 32, PL_SIZE = 40, PL_DRIVER = 48, DRV_SIZE = PL_DRIVER + 24 };

/* The over-alignment offset beyond the allocation, or so large that
 * offset + size wraps (refused before the driver is asked). */
static void cu_forgeries(const unsigned char *pl, uint64_t size, uint64_t dsz) {
    CHECK_EQ(get_le(pl + PL_OFFSET, 8), 0);
    forged("offset 2 MiB", size, (field_t){PL_OFFSET, 8, 2 * MIB}, size, dsz, 0,
           HM_ERROR_INVALID_HANDLE, 1);
    forged("offset 1 byte", size, (field_t){PL_OFFSET, 8, 1}, size, dsz, 0,
           HM_ERROR_INVALID_HANDLE, 1);
    forged("offset 2^40", size, (field_t){PL_OFFSET, 8, (uint64_t)1 << 40}, size, dsz, 0,
           HM_ERROR_INVALID_HANDLE, 1);
    forged("offset + size wraps", size, (field_t){PL_OFFSET, 8, UINT64_MAX - size + 2}, size,
           dsz, 0, HM_ERROR_INVALID_HANDLE, 0);
}

int main(int argc, char **argv) {
    static const gpu_hostile_t cuda = {
        .driver_env = "HM_CUDA_DRIVER",
        .no_driver = "no CUDA driver",
        .open_call = "cuIpcOpenMemHandle_v2",
        .close_call = "cuIpcCloseMemHandle",
        .by_descriptor = false,
        .pl_uuid = PL_UUID,
        .pl_size = PL_SIZE,
        .drv_size = DRV_SIZE,
        .device_pool = cu_device_pool,
        .driver_api = cu_driver_api,
        .reset = cu_reset,
        .stats = cu_stats,
        .calls = cu_calls,
        .forgeries = cu_forgeries,
    };
    return gpu_hostile_main(&cuda, argc, argv);
}
