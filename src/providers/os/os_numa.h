/* hetmem — NUMA placement for the OS provider, through hwloc.
 * SPDX-License-Identifier: MIT
 *
 * One hwloc topology per process, loaded lazily on first use
 * (pthread_once) and never modified afterwards, so every function here may
 * run concurrently with any other. A forked child keeps using its copy. */
#ifndef HM_OS_NUMA_H
#define HM_OS_NUMA_H

#include "internal.h"

#include <hwloc.h>

/* The process's topology, loading it on the first call. HM_ERROR_DRIVER
 * (native error recorded) when hwloc cannot load it. */
hm_result_t hm__os_numa_topology(hwloc_topology_t *topology);

/* Build a nodeset from OS node numbers, each checked against the topology
 * (unknown node: HM_ERROR_INVALID_ARGUMENT, logged). Also checks that the
 * system can bind memory areas with `mode` (HM_ERROR_NOT_SUPPORTED).
 * *set is freed with hwloc_bitmap_free(). */
hm_result_t hm__os_numa_make_nodeset(hm_os_numa_mode_t mode, const unsigned *nodes,
                                     size_t count, hwloc_bitmap_t *set);

/* Apply the policy to [addr, addr+len) (fresh, untouched pages):
 * BIND = strict bind, INTERLEAVE, PREFERRED = non-strict bind to one node
 * (hwloc maps it to MPOL_PREFERRED). Failure records the native error. */
hm_result_t hm__os_numa_bind(void *addr, size_t len, hm_os_numa_mode_t mode,
                             hwloc_const_bitmap_t set);

#endif
