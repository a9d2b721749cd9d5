/* hetmem tests — Level Zero IPC against a hostile exporter, through the real
 * loader and the project's test driver (ze_test_driver.c,
 * ZE_ENABLE_ALT_DRIVERS set by CTest): the forgeries of
 * test/common/gpu_ipc_hostile.h, and the memory type of Level Zero's
 * payload. The descriptor comes over the channel.
 * SPDX-License-Identifier: MIT */
#include "gpu_ipc_hostile.h"
#include "ze_test_driver.h"

#include <hetmem/providers/level_zero.h>

static struct {
    hm_ze_test_reset_fn reset;
    hm_ze_test_get_stats_fn stats;
    hm_ze_test_call_count_fn calls;
} drv;

static int ze_driver_api(void *h) {
    *(void **)&drv.reset = dlsym(h, "hm_ze_test_reset");
    *(void **)&drv.stats = dlsym(h, "hm_ze_test_get_stats");
    *(void **)&drv.calls = dlsym(h, "hm_ze_test_call_count");
    return drv.reset && drv.stats && drv.calls;
}
static void ze_reset(void) { drv.reset(); }
static uint64_t ze_calls(const char *name) { return drv.calls(name); }
static gpu_stats_t ze_stats(void) {
    hm_ze_test_stats_t s;
    drv.stats(&s);
    /* Every allocation of this test is device memory. */
    return (gpu_stats_t){.live_mappings = s.live_ipc_mappings, .live_refs = s.live_ipc_refs,
                         .live_device_allocs = s.live_allocs, .live_allocs = s.live_allocs};
}

static hm_result_t ze_device_pool(hm_provider_t **prov, hm_pool_t **pool) {
    hm_level_zero_params_t *p;
    hm_result_t r = hm_level_zero_params_create(&p);
    if (r != HM_SUCCESS) return r;
    if ((r = hm_level_zero_params_set_memory_type(p, HM_LEVEL_ZERO_MEMORY_DEVICE)) == HM_SUCCESS)
        r = hm_level_zero_provider_create(p, prov);
    hm_level_zero_params_destroy(p);
    if (r != HM_SUCCESS) return r;
    r = hm_proxy_pool_create(*prov, HM_POOL_FLAG_OWN_PROVIDER, pool);
    if (r != HM_SUCCESS) hm_provider_destroy(*prov);
    return r;
}

/* The payload's fields (level_zero.c's lz_payload_t): magic, type, uuid,
 * driver id, size, then the driver's 64-byte handle, whose bytes [32, 40)
 * are the test driver's size field. */
enum { PL_TYPE = 4, PL_UUID = 8, PL_SIZE = 32, PL_DRIVER = 40, DRV_SIZE = PL_DRIVER + 32 };

/* Another memory type than device memory. */
static void ze_forgeries(const unsigned char *pl, uint64_t size, uint64_t dsz) {
    CHECK_EQ(get_le(pl + PL_TYPE, 4), HM_LEVEL_ZERO_MEMORY_DEVICE);
    forged("host memory type", size, (field_t){PL_TYPE, 4, HM_LEVEL_ZERO_MEMORY_HOST}, size,
           dsz, 0, HM_ERROR_INVALID_HANDLE, 0);
}

int main(int argc, char **argv) {
    static const gpu_hostile_t level_zero = {
        .driver_env = "ZE_ENABLE_ALT_DRIVERS",
        .no_driver = "no Level Zero loader or driver",
        .open_call = "zeMemOpenIpcHandle",
        .close_call = "zeMemCloseIpcHandle",
        .by_descriptor = true,
        .pl_uuid = PL_UUID,
        .pl_size = PL_SIZE,
        .drv_size = DRV_SIZE,
        .device_pool = ze_device_pool,
        .driver_api = ze_driver_api,
        .reset = ze_reset,
        .stats = ze_stats,
        .calls = ze_calls,
        .forgeries = ze_forgeries,
    };
    return gpu_hostile_main(&level_zero, argc, argv);
}
