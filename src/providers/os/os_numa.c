/* hetmem — NUMA placement for the OS provider, through hwloc.
 * SPDX-License-Identifier: MIT */
#include "providers/os/os_numa.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static hwloc_topology_t topo;   /* written once under topo_once, then read-only */
static int topo_errno;          /* why loading failed (0: loaded) */
static const char *topo_failed; /* the hwloc call that failed */

static void topo_load(void) {
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) {
        topo_errno = errno ? errno : ENOMEM;
        topo_failed = "hwloc_topology_init";
        return;
    }
    /* Only NUMA nodes and membind support are needed: skip I/O devices
     * (the slowest part of discovery). */
    (void)hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
    if (hwloc_topology_load(t) != 0) {
        topo_errno = errno ? errno : EIO;
        topo_failed = "hwloc_topology_load";
        hwloc_topology_destroy(t);
        return;
    }
    topo = t;
}

/* The topology lives until the process exits: it is read-only, and freeing
 * it in an atexit handler would race with threads still allocating. */
hm_result_t hm__os_numa_topology(hwloc_topology_t *topology) {
    *topology = NULL;
    if (pthread_once(&topo_once, topo_load) != 0) HM_DIE("pthread_once failed");
    if (!topo) return hm__native_error(topo_errno, "%s", topo_failed);
    *topology = topo;
    return HM_SUCCESS;
}

hm_result_t hm__os_numa_make_nodeset(hm_os_numa_mode_t mode, const unsigned *nodes,
                                     size_t count, hwloc_bitmap_t *set) {
    *set = NULL;
    hwloc_topology_t t;
    hm_result_t r = hm__os_numa_topology(&t);
    if (r) return r;
    const struct hwloc_topology_support *sup = hwloc_topology_get_support(t);
    int ok = sup && sup->membind && sup->membind->set_area_membind &&
             (mode == HM_OS_NUMA_INTERLEAVE ? sup->membind->interleave_membind
                                            : sup->membind->bind_membind);
    if (!ok) {
        HM_LOG_WARN("os provider: this system cannot bind memory areas (%s)",
                    mode == HM_OS_NUMA_INTERLEAVE ? "interleave" : "bind");
        return HM_ERROR_NOT_SUPPORTED;
    }
    hwloc_bitmap_t s = hwloc_bitmap_alloc();
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < count; i++) {
        if (!hwloc_get_numanode_obj_by_os_index(t, nodes[i])) {
            HM_LOG_ERROR("os provider: NUMA node %u does not exist (or is not allowed to this "
                         "process); %d node(s) known",
                         nodes[i], hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE));
            hwloc_bitmap_free(s);
            return HM_ERROR_INVALID_ARGUMENT;
        }
        if (hwloc_bitmap_set(s, nodes[i]) != 0) {
            hwloc_bitmap_free(s);
            return HM_ERROR_OUT_OF_HOST_MEMORY;
        }
    }
    *set = s;
    return HM_SUCCESS;
}

hm_result_t hm__os_numa_bind(void *addr, size_t len, hm_os_numa_mode_t mode,
                             hwloc_const_bitmap_t set) {
    hwloc_topology_t t;
    hm_result_t r = hm__os_numa_topology(&t);
    if (r) return r;
    hwloc_membind_policy_t policy;
    int flags = HWLOC_MEMBIND_BYNODESET;
    switch (mode) {
    case HM_OS_NUMA_BIND: policy = HWLOC_MEMBIND_BIND; flags |= HWLOC_MEMBIND_STRICT; break;
    case HM_OS_NUMA_INTERLEAVE: policy = HWLOC_MEMBIND_INTERLEAVE; break;
    case HM_OS_NUMA_PREFERRED: policy = HWLOC_MEMBIND_BIND; break; /* non-strict = preferred */
    default: return HM_SUCCESS;
    }
    if (hwloc_set_area_membind(t, addr, len, set, policy, flags) != 0)
        return hm__errno_result(errno, "hwloc_set_area_membind(%p, %zu, mode %d)", addr, len,
                                (int)mode);
    return HM_SUCCESS;
}

hm_result_t hm_os_numa_nodes(unsigned *nodes, size_t capacity, size_t *count) {
    hm__init();
    if (!count) {
        HM_LOG_ERROR("hm_os_numa_nodes: count is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *count = 0;
    if (!nodes && capacity) {
        HM_LOG_ERROR("hm_os_numa_nodes: nodes is NULL with capacity %zu", capacity);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hwloc_topology_t t;
    hm_result_t r = hm__os_numa_topology(&t);
    if (r) return r;
    int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    if (n <= 0) { /* hwloc always reports at least one node; be safe anyway */
        if (nodes && capacity) nodes[0] = 0;
        *count = 1;
        return HM_SUCCESS;
    }
    /* Ascending OS numbers: the topology's node set, not hwloc's logical
     * order (which follows the tree: a memory-only node comes after the
     * other nodes of its package). */
    size_t k = 0;
    unsigned id;
    hwloc_bitmap_foreach_begin(id, hwloc_topology_get_topology_nodeset(t)) {
        if (k < capacity) nodes[k] = id;
        k++;
    }
    hwloc_bitmap_foreach_end();
    *count = k;
    /* A query with nodes == NULL only asks for the count; a buffer too small
     * is filled as far as it goes and reported. */
    if (nodes && capacity < k) {
        HM_LOG_INFO("hm_os_numa_nodes: %zu nodes, room for %zu", k, capacity);
        return HM_ERROR_LIMIT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_os_numa_node_of(const void *ptr, unsigned *node) {
    hm__init();
    if (!ptr || !node) {
        HM_LOG_ERROR("hm_os_numa_node_of: %s is NULL", !ptr ? "ptr" : "node");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hwloc_topology_t t;
    hm_result_t r = hm__os_numa_topology(&t);
    if (r) return r;
    hwloc_bitmap_t s = hwloc_bitmap_alloc();
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    /* hwloc asks the kernel with move_pages(2) in query mode. */
    if (hwloc_get_area_memlocation(t, ptr, 1, s, HWLOC_MEMBIND_BYNODESET) != 0) {
        int e = errno;
        hwloc_bitmap_free(s);
        return hm__errno_result(e, "hwloc_get_area_memlocation(%p)", ptr);
    }
    int first = hwloc_bitmap_first(s);
    hwloc_bitmap_free(s);
    if (first < 0) {
        HM_LOG_INFO("hm_os_numa_node_of(%p): page not present (touch it first)", ptr);
        return HM_ERROR_NOT_FOUND;
    }
    *node = (unsigned)first;
    return HM_SUCCESS;
}
