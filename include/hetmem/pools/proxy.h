/* hetmem — the proxy pool: every call goes straight to the provider.
 * SPDX-License-Identifier: MIT
 *
 * For big device buffers where pooling is not wanted. Each hm_pool_malloc is
 * one provider allocation (rounded up to the provider's page size); free
 * returns it at once. calloc/realloc/usable_size work where the memory is
 * CPU-accessible (usable_size also on device memory). On a provider that
 * cannot free, hm_pool_free succeeds and the pool keeps the range for reuse
 * by a later allocation that fits (first fit); it is never given back.
 * Freeing an interior pointer, a foreign pointer or freeing twice returns
 * HM_ERROR_INVALID_ARGUMENT and frees nothing. */
#ifndef HETMEM_POOLS_PROXY_H
#define HETMEM_POOLS_PROXY_H

#include <hetmem/pool.h>

#ifdef __cplusplus
extern "C" {
#endif

HM_API const hm_pool_ops_t *hm_proxy_pool_ops(void);
/* Convenience: hm_pool_create(hm_proxy_pool_ops(), provider, NULL, flags, pool). */
HM_API hm_result_t hm_proxy_pool_create(hm_provider_t *provider, uint32_t flags, hm_pool_t **pool);

#ifdef __cplusplus
}
#endif
#endif
