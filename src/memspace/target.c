/* hetmem — memory targets: properties and attributes.
 * SPDX-License-Identifier: MIT */
#include "memspace/memspace_internal.h"

#include <errno.h>

const char *hm_memtarget_kind_string(hm_memtarget_kind_t kind) {
    switch (kind) {
    case HM_MEMTARGET_DRAM: return "DRAM";
    case HM_MEMTARGET_HBM: return "HBM";
    case HM_MEMTARGET_NVM: return "NVM";
    case HM_MEMTARGET_CXL_DRAM: return "CXL-DRAM";
    case HM_MEMTARGET_CXL_NVM: return "CXL-NVM";
    case HM_MEMTARGET_SPM: return "SPM";
    case HM_MEMTARGET_GPU: return "GPU";
    case HM_MEMTARGET_OTHER: return "other";
    }
    return "?";
}

/* A target argument and an out-parameter. */
static hm_result_t check(const hm_memtarget_t *t, const void *out, const char *what) {
    hm_result_t r = hm__ms_check_target(t, what);
    if (r) return r;
    if (!out) {
        HM_LOG_ERROR("%s: the out-parameter is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_memtarget_get_id(const hm_memtarget_t *target, unsigned *os_id) {
    hm_result_t r = check(target, os_id, "hm_memtarget_get_id");
    if (r) return r;
    *os_id = target->os_id;
    return HM_SUCCESS;
}

hm_result_t hm_memtarget_get_capacity(const hm_memtarget_t *target, uint64_t *bytes) {
    hm_result_t r = check(target, bytes, "hm_memtarget_get_capacity");
    if (r) return r;
    *bytes = target->capacity;
    return HM_SUCCESS;
}

hm_result_t hm_memtarget_get_kind(const hm_memtarget_t *target, hm_memtarget_kind_t *kind) {
    hm_result_t r = check(target, kind, "hm_memtarget_get_kind");
    if (r) return r;
    *kind = target->kind;
    return HM_SUCCESS;
}

hm_result_t hm_memtarget_get_subtype(const hm_memtarget_t *target, const char **subtype) {
    hm_result_t r = check(target, subtype, "hm_memtarget_get_subtype");
    if (r) return r;
    *subtype = target->subtype;
    return target->subtype ? HM_SUCCESS : HM_ERROR_NOT_FOUND;
}

hm_result_t hm_memtarget_get_dax_device(const hm_memtarget_t *target, const char **name) {
    hm_result_t r = check(target, name, "hm_memtarget_get_dax_device");
    if (r) return r;
    *name = target->dax;
    return target->dax ? HM_SUCCESS : HM_ERROR_NOT_FOUND;
}

hm_result_t hm_memtarget_get_cpus(const hm_memtarget_t *target, unsigned *cpus, size_t capacity,
                                  size_t *count) {
    hm_result_t r = check(target, count, "hm_memtarget_get_cpus");
    if (r) return r;
    *count = 0;
    if (!cpus && capacity) {
        HM_LOG_ERROR("hm_memtarget_get_cpus: cpus is NULL with capacity %zu", capacity);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hwloc_const_bitmap_t set = target->node->cpuset;
    size_t n = 0;
    if (set) {
        for (int c = hwloc_bitmap_first(set); c >= 0; c = hwloc_bitmap_next(set, c)) {
            if (n < capacity) cpus[n] = (unsigned)c;
            n++;
        }
    }
    *count = n;
    return (cpus && n > capacity) ? HM_ERROR_LIMIT : HM_SUCCESS;
}

hm_result_t hm_memtarget_get_attr(const hm_memtarget_t *target, hm_memattr_t attr,
                                  const unsigned *cpus, size_t ncpus, uint64_t *value) {
    static const hwloc_memattr_id_t ids[] = {
        [HM_MEMATTR_BANDWIDTH] = HWLOC_MEMATTR_ID_BANDWIDTH,
        [HM_MEMATTR_READ_BANDWIDTH] = HWLOC_MEMATTR_ID_READ_BANDWIDTH,
        [HM_MEMATTR_WRITE_BANDWIDTH] = HWLOC_MEMATTR_ID_WRITE_BANDWIDTH,
        [HM_MEMATTR_LATENCY] = HWLOC_MEMATTR_ID_LATENCY,
        [HM_MEMATTR_READ_LATENCY] = HWLOC_MEMATTR_ID_READ_LATENCY,
        [HM_MEMATTR_WRITE_LATENCY] = HWLOC_MEMATTR_ID_WRITE_LATENCY,
    };
    hm_result_t r = check(target, value, "hm_memtarget_get_attr");
    if (r) return r;
    if ((unsigned)attr >= sizeof(ids) / sizeof(ids[0])) {
        HM_LOG_ERROR("hm_memtarget_get_attr: unknown attribute %d", (int)attr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hwloc_bitmap_t set;
    if ((r = hm__ms_initiator(target->topo, cpus, ncpus, "hm_memtarget_get_attr", &set)))
        return r;
    struct hwloc_location loc = {.type = HWLOC_LOCATION_TYPE_CPUSET};
    loc.location.cpuset = set;
    hwloc_uint64_t v = 0;
    int rc = hwloc_memattr_get_value(target->topo->hw, ids[attr], target->node, &loc, 0, &v);
    hwloc_bitmap_free(set);
    if (rc != 0) {
        /* hwloc: EINVAL / ENOENT when there is no value for this initiator. */
        HM_LOG_DEBUG("hm_memtarget_get_attr: node %u has no value of attribute %d for these "
                     "CPUs",
                     target->os_id, (int)attr);
        return HM_ERROR_NOT_SUPPORTED;
    }
    *value = v;
    return HM_SUCCESS;
}
