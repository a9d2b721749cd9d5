/* hetmem tests — providers made the same way by every pool test.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

hm_result_t hm_test_os_provider(hm_os_visibility_t vis, unsigned prot, hm_provider_t **out) {
    hm_os_params_t *params;
    hm_result_t r = hm_os_params_create(&params);
    if (r != HM_SUCCESS) return r;
    r = hm_os_params_set_visibility(params, vis);
    if (r == HM_SUCCESS) r = hm_os_params_set_protection(params, prot);
    if (r == HM_SUCCESS) r = hm_os_provider_create(params, out);
    hm_os_params_destroy(params);
    return r;
}

hm_result_t hm_test_fixed_provider(void *buffer, size_t size, hm_memory_kind_t kind, bool cpu,
                                   hm_provider_t **out) {
    hm_fixed_params_t *params;
    hm_result_t r = hm_fixed_params_create(buffer, size, &params);
    if (r != HM_SUCCESS) return r;
    r = hm_fixed_params_set_memory_kind(params, kind, cpu);
    if (r == HM_SUCCESS) r = hm_provider_create(hm_fixed_provider_ops(), params, out);
    hm_fixed_params_destroy(params);
    return r;
}
