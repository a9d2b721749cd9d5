/* hetmem — memory spaces to OS providers: the space's nodes become the
 * provider's NUMA binding. SPDX-License-Identifier: MIT */
#include "memspace/memspace_internal.h"

#include <stdlib.h>

hm_result_t hm_os_params_set_memspace(hm_os_params_t *params, const hm_memspace_t *space,
                                      hm_os_numa_mode_t mode) {
    const char *what = "hm_os_params_set_memspace";
    hm__init();
    hm_result_t r = hm__ms_check(space, what);
    if (r) return r;
    if (!params) {
        HM_LOG_ERROR("%s: params is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (mode != HM_OS_NUMA_BIND && mode != HM_OS_NUMA_INTERLEAVE &&
        mode != HM_OS_NUMA_PREFERRED) {
        HM_LOG_ERROR("%s: mode %d (BIND, INTERLEAVE or PREFERRED)", what, (int)mode);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    const hm_ms_topo_t *topo = space->topo;
    if (topo->xml) {
        /* Its node numbers are another machine's: binding this one's by them
         * would place memory on whatever happens to carry the number here. */
        HM_LOG_ERROR("%s: the space was made from an XML topology (another machine); it "
                     "cannot bind memory here",
                     what);
        return HM_ERROR_NOT_SUPPORTED;
    }
    uint32_t *idx = malloc(topo->n * sizeof(*idx));
    unsigned *ids = malloc(topo->n * sizeof(*ids));
    if (!idx || !ids) {
        free(idx);
        free(ids);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    size_t n = hm__ms_snapshot(space, idx);
    for (size_t i = 0; i < n; i++) ids[i] = topo->targets[idx[i]].os_id;
    /* Validates the rest (PREFERRED: one node) and logs what it refuses. */
    r = hm_os_params_set_numa(params, mode, ids, n);
    free(idx);
    free(ids);
    return r;
}

hm_result_t hm_memspace_provider_create(const hm_memspace_t *space, hm_os_numa_mode_t mode,
                                        hm_provider_t **provider) {
    const char *what = "hm_memspace_provider_create";
    hm__init();
    if (!provider) {
        HM_LOG_ERROR("%s: provider is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *provider = NULL;
    hm_os_params_t *params;
    hm_result_t r = hm_os_params_create(&params);
    if (r) return r;
    if ((r = hm_os_params_set_memspace(params, space, mode)) == HM_SUCCESS)
        r = hm_os_provider_create(params, provider);
    hm_os_params_destroy(params);
    return r;
}
