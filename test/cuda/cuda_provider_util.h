/* hetmem tests — what the CUDA provider tests share: the test driver's
 * control API and a few entry points (reached through the very library the
 * provider loaded, HM_CUDA_DRIVER), providers and pools over it, and a
 * pattern written to and checked in device memory through the provider.
 * SPDX-License-Identifier: MIT */
#ifndef HM_TEST_CUDA_PROVIDER_UTIL_H
#define HM_TEST_CUDA_PROVIDER_UTIL_H

#include "conformance.h"
#include "cuda_test_driver.h"

#include <hetmem/providers/cuda.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ---- the driver: its control API and a few entry points, by exact name ---- */

static struct {
    hm_cuda_test_reset_fn reset;
    hm_cuda_test_get_stats_fn stats;
    hm_cuda_test_call_count_fn calls;
    hm_cuda_test_fail_next_fn fail_next;
    hm_cuda_test_set_mem_limit_fn set_limit;
    hm_cuda_test_set_strict_ipc_fn strict;
    CUresult (*ctx_get)(CUcontext *);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
} drv;

static inline void driver_api(void) {
    const char *path = getenv("HM_CUDA_DRIVER");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    CHECK_MSG(h != NULL, "the test driver (%s) is not loaded", path ? path : "unset");
    REQUIRE(h != NULL);
#define SYM(field, name) *(void **)&drv.field = dlsym(h, name)
    SYM(reset, "hm_cuda_test_reset");
    SYM(stats, "hm_cuda_test_get_stats");
    SYM(calls, "hm_cuda_test_call_count");
    SYM(fail_next, "hm_cuda_test_fail_next");
    SYM(set_limit, "hm_cuda_test_set_mem_limit");
    SYM(strict, "hm_cuda_test_set_strict_ipc");
    SYM(ctx_get, "cuCtxGetCurrent");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(ctx_create, "cuCtxCreate_v2");
    SYM(ctx_destroy, "cuCtxDestroy_v2");
    SYM(ctx_pop, "cuCtxPopCurrent_v2");
    SYM(primary_retain, "cuDevicePrimaryCtxRetain");
    SYM(primary_release, "cuDevicePrimaryCtxRelease_v2");
#undef SYM
    REQUIRE(drv.reset && drv.stats && drv.calls && drv.fail_next && drv.set_limit && drv.strict &&
            drv.ctx_get && drv.ctx_set && drv.ctx_create && drv.ctx_destroy && drv.ctx_pop &&
            drv.primary_retain && drv.primary_release);
}

static inline hm_cuda_test_stats_t stats(void) {
    hm_cuda_test_stats_t s;
    drv.stats(&s);
    return s;
}

/* ---- providers and pools ---- */

typedef struct cuf {
    hm_cuda_memory_type_t type;
    int ordinal;
    int pool; /* 0 proxy, 1 native, 2 jemalloc */
    int vmm;  /* HM_CUDA_ALLOCATOR_VMM */
} cuf_t;

static inline hm_result_t cu_provider_with(hm_cuda_memory_type_t type, int ordinal,
                                           hm_cuda_allocator_t allocator, hm_provider_t **out) {
    hm_cuda_params_t *p;
    hm_result_t r = hm_cuda_params_create(&p);
    if (r != HM_SUCCESS) return r;
    if ((r = hm_cuda_params_set_memory_type(p, type)) == HM_SUCCESS &&
        (r = hm_cuda_params_set_ordinal(p, ordinal)) == HM_SUCCESS &&
        (r = hm_cuda_params_set_allocator(p, allocator)) == HM_SUCCESS)
        r = hm_cuda_provider_create(p, out);
    hm_cuda_params_destroy(p);
    return r;
}
static inline hm_result_t cu_provider(hm_cuda_memory_type_t type, int ordinal, hm_provider_t **out) {
    return cu_provider_with(type, ordinal, HM_CUDA_ALLOCATOR_LEGACY, out);
}
static inline hm_result_t make_provider(void *arg, hm_provider_t **out) {
    const cuf_t *f = arg;
    return cu_provider_with(f->type, f->ordinal,
                            f->vmm ? HM_CUDA_ALLOCATOR_VMM : HM_CUDA_ALLOCATOR_LEGACY, out);
}
static inline hm_result_t pool_over(int kind, hm_provider_t *prov, unsigned flags, hm_pool_t **out) {
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
static inline hm_result_t make_pool(void *arg, hm_pool_t **out) {
    const cuf_t *f = arg;
    hm_provider_t *prov;
    hm_result_t r = make_provider(arg, &prov);
    if (r != HM_SUCCESS) return r;
    r = pool_over(f->pool, prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}
static inline const char *type_name(hm_cuda_memory_type_t t) {
    return t == HM_CUDA_MEMORY_DEVICE ? "device" : t == HM_CUDA_MEMORY_HOST ? "host" : "managed";
}

static inline unsigned char pat(uint64_t seed, size_t i) {
    return (unsigned char)(((uint32_t)(i + seed) * 2654435761u) >> 24);
}
static unsigned char g_buf[8 * MIB] __attribute__((unused));
static inline void dev_put(hm_provider_t *prov, void *dev, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) g_buf[i] = pat(seed, i);
    CHECK_OK(hm_provider_copy(prov, dev, g_buf, n));
}
static inline int dev_check(hm_provider_t *prov, const void *dev, size_t n, uint64_t seed) {
    memset(g_buf, 0x5a, n);
    if (hm_provider_copy(prov, g_buf, dev, n) != HM_SUCCESS) return 0;
    for (size_t i = 0; i < n; i++)
        if (g_buf[i] != pat(seed, i)) return 0;
    return 1;
}

#endif
