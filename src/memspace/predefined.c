/* hetmem — the predefined memory spaces: host all, highest capacity, highest
 * bandwidth, lowest latency, nearest CPUs, nearest a device.
 * SPDX-License-Identifier: MIT */
#include "memspace/memspace_internal.h"

#include <stdlib.h>
#include <string.h>

/* What every create_* does first: the out-parameter, the topology, the mask. */
static hm_result_t begin(hm_memspace_t **space, const char *what, hm_ms_topo_t **topo,
                         unsigned char **keep) {
    hm__init();
    if (!space) {
        HM_LOG_ERROR("%s: space is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *space = NULL;
    hm_result_t r = hm__ms_topo_get(topo);
    if (r) return r;
    if (!(*keep = calloc((*topo)->n, 1))) {
        hm__ms_topo_put(*topo);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    return HM_SUCCESS;
}

static hm_result_t finish(hm_result_t r, hm_ms_topo_t *topo, unsigned char *keep,
                          hm_memspace_t **space) {
    if (r == HM_SUCCESS) r = hm__ms_create_from_mask(topo, keep, space);
    free(keep);
    hm__ms_topo_put(topo);
    return r;
}

hm_result_t hm_memspace_create_host_all(hm_memspace_t **space) {
    hm_ms_topo_t *topo;
    unsigned char *keep;
    hm_result_t r = begin(space, "hm_memspace_create_host_all", &topo, &keep);
    if (r) return r;
    for (size_t i = 0; i < topo->n; i++) keep[i] = 1;
    return finish(r, topo, keep, space);
}

hm_result_t hm_memspace_create_highest_capacity(hm_memspace_t **space) {
    hm_ms_topo_t *topo;
    unsigned char *keep;
    hm_result_t r = begin(space, "hm_memspace_create_highest_capacity", &topo, &keep);
    if (r) return r;
    uint64_t best = 0;
    for (size_t i = 0; i < topo->n; i++)
        if (topo->targets[i].capacity > best) best = topo->targets[i].capacity;
    /* All zero (hwloc knows no sizes): every node ties. */
    for (size_t i = 0; i < topo->n; i++) keep[i] = topo->targets[i].capacity == best;
    return finish(r, topo, keep, space);
}

/* For each locality of the initiator, the targets with the best value of
 * attr seen from the initiator's CPUs there (higher or lower is better);
 * marked in keep. Returns how many localities had any value (0: none), or
 * -1 when out of memory. */
static int best_by_attr(const hm_ms_topo_t *topo, hwloc_const_bitmap_t initiator,
                        hwloc_memattr_id_t attr, int higher, unsigned char *keep) {
    hm_ms_group_t *groups = calloc(topo->n, sizeof(*groups));
    uint64_t *val = calloc(topo->n, sizeof(*val));
    unsigned char *has = calloc(topo->n, 1);
    int ng = -1, found = 0;
    if (!groups || !val || !has) goto out;
    ng = hm__ms_groups(topo, initiator, groups);
    for (int g = 0; g < ng; g++) {
        struct hwloc_location loc = {.type = HWLOC_LOCATION_TYPE_CPUSET};
        loc.location.cpuset = groups[g].cpus;
        int any = 0;
        uint64_t best = 0;
        for (size_t i = 0; i < topo->n; i++) {
            hwloc_uint64_t v;
            has[i] = hwloc_memattr_get_value(topo->hw, attr, topo->targets[i].node, &loc, 0,
                                             &v) == 0;
            if (!has[i]) continue;
            val[i] = v;
            if (!any || (higher ? v > best : v < best)) best = v;
            any = 1;
        }
        for (size_t i = 0; i < topo->n; i++)
            if (has[i] && val[i] == best) keep[i] = 1;
        found += any;
    }
    hm__ms_groups_free(groups, ng);
out:
    free(groups);
    free(val);
    free(has);
    return ng < 0 ? -1 : found;
}

static hm_result_t create_best(const unsigned *cpus, size_t ncpus, hm_memspace_t **space,
                               hwloc_memattr_id_t attr, int higher, const char *what) {
    hm_ms_topo_t *topo;
    unsigned char *keep;
    hm_result_t r = begin(space, what, &topo, &keep);
    if (r) return r;
    hwloc_bitmap_t initiator;
    if ((r = hm__ms_initiator(topo, cpus, ncpus, what, &initiator)))
        return finish(r, topo, keep, space);
    int found = best_by_attr(topo, initiator, attr, higher, keep);
    hwloc_bitmap_free(initiator);
    if (found < 0) {
        r = HM_ERROR_OUT_OF_HOST_MEMORY;
    } else if (found == 0) {
        HM_LOG_INFO("%s: no NUMA node has a %s value for these CPUs (the firmware gives no "
                    "HMAT for them)",
                    what, higher ? "bandwidth" : "latency");
        r = HM_ERROR_NOT_SUPPORTED;
    }
    return finish(r, topo, keep, space);
}

hm_result_t hm_memspace_create_highest_bandwidth(const unsigned *cpus, size_t ncpus,
                                                 hm_memspace_t **space) {
    return create_best(cpus, ncpus, space, HWLOC_MEMATTR_ID_BANDWIDTH, 1,
                       "hm_memspace_create_highest_bandwidth");
}

hm_result_t hm_memspace_create_lowest_latency(const unsigned *cpus, size_t ncpus,
                                              hm_memspace_t **space) {
    return create_best(cpus, ncpus, space, HWLOC_MEMATTR_ID_LATENCY, 0,
                       "hm_memspace_create_lowest_latency");
}

/* Marks the nodes whose cpuset is the locality of a CPU of set. */
static hm_result_t mark_nearest(const hm_ms_topo_t *topo, hwloc_const_bitmap_t set,
                                unsigned char *keep, const char *what) {
    hm_ms_group_t *groups = calloc(topo->n, sizeof(*groups));
    if (!groups) return HM_ERROR_OUT_OF_HOST_MEMORY;
    int ng = hm__ms_groups(topo, set, groups);
    int any = 0;
    for (int g = 0; g < ng; g++)
        for (size_t i = 0; i < topo->n; i++) {
            hwloc_const_bitmap_t c = topo->targets[i].node->cpuset;
            if (c && hwloc_bitmap_isequal(c, groups[g].locality)) keep[i] = 1, any = 1;
        }
    hm__ms_groups_free(groups, ng);
    free(groups);
    if (ng < 0) return HM_ERROR_OUT_OF_HOST_MEMORY;
    if (!any) { /* every CPU is in some node's cpuset in hwloc; be safe anyway */
        HM_LOG_ERROR("%s: no NUMA node is local to these CPUs", what);
        return HM_ERROR_NOT_FOUND;
    }
    return HM_SUCCESS;
}

hm_result_t hm_memspace_create_nearest(const unsigned *cpus, size_t ncpus,
                                       hm_memspace_t **space) {
    const char *what = "hm_memspace_create_nearest";
    hm_ms_topo_t *topo;
    unsigned char *keep;
    hm_result_t r = begin(space, what, &topo, &keep);
    if (r) return r;
    hwloc_bitmap_t initiator;
    if ((r = hm__ms_initiator(topo, cpus, ncpus, what, &initiator)) == HM_SUCCESS) {
        r = mark_nearest(topo, initiator, keep, what);
        hwloc_bitmap_free(initiator);
    }
    return finish(r, topo, keep, space);
}

/* A PCI device by bus id, else an OS device by name. */
static hwloc_obj_t find_device(hwloc_topology_t hw, const char *device) {
    hwloc_obj_t o = hwloc_get_pcidev_by_busidstring(hw, device);
    if (o) return o;
    for (o = hwloc_get_next_osdev(hw, NULL); o; o = hwloc_get_next_osdev(hw, o))
        if (o->name && !strcmp(o->name, device)) return o;
    return NULL;
}

hm_result_t hm_memspace_create_nearest_device(const char *device, hm_memspace_t **space) {
    const char *what = "hm_memspace_create_nearest_device";
    if (!device || !*device) {
        HM_LOG_ERROR("%s: no device named", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_ms_topo_t *topo;
    unsigned char *keep;
    hm_result_t r = begin(space, what, &topo, &keep);
    if (r) return r;
    hwloc_obj_t dev = find_device(topo->hw, device);
    if (!dev) {
        HM_LOG_ERROR("%s: no PCI device or OS device \"%s\" in the topology", what, device);
        return finish(HM_ERROR_NOT_FOUND, topo, keep, space);
    }
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo->hw, dev);
    hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(topo->hw);
    if (!anc || !anc->cpuset || hwloc_bitmap_isincluded(all, anc->cpuset)) {
        HM_LOG_INFO("%s: %s is attached to the whole machine (no locality known): every "
                    "node",
                    what, device);
        for (size_t i = 0; i < topo->n; i++) keep[i] = 1;
    } else {
        r = mark_nearest(topo, anc->cpuset, keep, what);
    }
    return finish(r, topo, keep, space);
}
