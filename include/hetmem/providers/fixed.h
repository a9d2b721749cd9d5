/* hetmem — the fixed provider: memory out of a caller's buffer.
 * SPDX-License-Identifier: MIT
 *
 * The page-aligned inside of the buffer is managed by the coarse layer:
 * best-fit alloc with alignment, free (HM_PROVIDER_CAP_FREE: the range
 * returns to the provider and neighbours coalesce), split and merge. Memory
 * never goes back to the OS (no purge). The buffer is never freed or
 * unmapped by hetmem; the caller keeps it alive until the provider is
 * destroyed. The buffer may lie at any address: a pool that cannot use
 * memory that high refuses it when it gets it (the native and jemalloc pools
 * below 2^48, every tracked pool below 2^57; HM_ERROR_NOT_SUPPORTED). */
#ifndef HETMEM_PROVIDERS_FIXED_H
#define HETMEM_PROVIDERS_FIXED_H

#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_fixed_params hm_fixed_params_t;

HM_API const hm_provider_ops_t *hm_fixed_provider_ops(void);
/* buffer must be non-NULL and size large enough for one page after aligning
 * the start to the page size (4 KiB). kind/cpu_accessible describe the
 * memory (default HM_MEMORY_HOST, accessible). */
HM_API hm_result_t hm_fixed_params_create(void *buffer, size_t size, hm_fixed_params_t **params);
HM_API hm_result_t hm_fixed_params_destroy(hm_fixed_params_t *params);
HM_API hm_result_t hm_fixed_params_set_memory_kind(hm_fixed_params_t *params,
                                                   hm_memory_kind_t kind, bool cpu_accessible);
HM_API hm_result_t hm_fixed_provider_create(void *buffer, size_t size, hm_provider_t **provider);

#ifdef __cplusplus
}
#endif
#endif
