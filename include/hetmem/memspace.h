/* hetmem — memory spaces: the memory targets (NUMA nodes) of a machine, their
 * properties, and sets of them chosen by bandwidth, latency, capacity or
 * locality, from which an OS provider is made. Over hwloc.
 * SPDX-License-Identifier: MIT
 *
 * A memory target (hm_memtarget_t) is one NUMA node of a topology: its OS
 * number, capacity, kind, the CPUs it is local to, and the bandwidth and
 * latency hwloc's memory attributes give for it (from the firmware's HMAT,
 * where there is one). A memory space (hm_memspace_t) is a non-empty set of
 * targets of one topology, kept in ascending OS number order. A provider
 * made from a space binds its pages to the space's nodes.
 *
 * Topology. By default this machine's (hwloc, loaded at the first call that
 * needs it, I/O devices included, so that GPUs are found by PCI bus id).
 * hm_memspace_topology_load_xml() makes spaces created afterwards use an
 * hwloc XML topology instead (tests, diagnostics: what would be chosen on
 * another machine); spaces keep the topology they were made from. A space
 * of an XML topology describes another machine: it can be inspected and
 * filtered, but binding memory with it fails (HM_ERROR_NOT_SUPPORTED).
 *
 * Initiators. Bandwidth and latency depend on who accesses the memory. An
 * initiator is a list of OS CPU numbers; NULL with count 0 means the CPUs
 * the calling thread may run on (its affinity; this machine's topology
 * only: with an XML topology it is HM_ERROR_NOT_SUPPORTED). Each CPU of the
 * initiator belongs to a locality: the smallest cpuset of a NUMA node that
 * contains it (a socket's, a sub-NUMA cluster's). The "highest bandwidth"
 * and "lowest latency" spaces are the union, over the localities the
 * initiator touches, of the best targets seen from that locality's CPUs of
 * the initiator (all targets with the best value: ties are kept). So an
 * unpinned thread on a two-socket machine gets each socket's best, and a
 * thread pinned to one CPU gets its socket's. A target without a value for
 * that initiator (no HMAT, or the firmware names another initiator) is not
 * a candidate: no value is ever guessed. When no target has a value, the
 * call fails with HM_ERROR_NOT_SUPPORTED (and one INFO log line).
 *
 * Units: capacity in bytes, bandwidth in MiB/s, latency in nanoseconds, as
 * hwloc reports them.
 *
 * Counterparts of UMF's memory-space calls (for a UMF-compatible layer):
 *   umfMemspaceHostAllGet             hm_memspace_create_host_all
 *   umfMemspaceHighestCapacityGet     hm_memspace_create_highest_capacity
 *   umfMemspaceHighestBandwidthGet    hm_memspace_create_highest_bandwidth(NULL, 0)
 *   umfMemspaceLowestLatencyGet       hm_memspace_create_lowest_latency(NULL, 0)
 *     (UMF's are per-process singletons it never frees: the layer caches
 *      one of ours; UMF takes every NUMA node as an initiator, which is
 *      ours with every CPU of the machine as the initiator)
 *   umfMemspaceCreateFromNumaArray    hm_memspace_create_from_ids
 *   umfMemspaceDestroy                hm_memspace_destroy
 *   umfMemspaceClone                  hm_memspace_clone
 *   umfMemspaceMemtargetNum / Get     hm_memspace_target_count / hm_memspace_target_get
 *   umfMemspaceMemtargetAdd / Remove  hm_memspace_target_add / hm_memspace_target_remove
 *   umfMemspaceFilterById             hm_memspace_filter_by_id
 *   umfMemspaceFilterByCapacity       hm_memspace_filter_by_capacity
 *   umfMemspaceUserFilter             hm_memspace_filter
 *   umfMemtargetGetCapacity / GetId   hm_memtarget_get_capacity / hm_memtarget_get_id
 *   umfMemtargetGetType               every target is a NUMA node (UMF_MEMTARGET_TYPE_NUMA);
 *                                     hm_memtarget_get_kind says which memory it is
 *   umfMemoryProviderCreateFromMemspace  hm_memspace_provider_create
 * Differences a layer must bridge: UMF lets a filter empty a space (ours
 * refuse: a space is never empty), and UMF's filters return
 * UMF_RESULT_ERROR_USER_SPECIFIC for a failing callback (ours return the
 * callback's result).
 *
 * Concurrency. Targets are immutable; spaces change only through the calls
 * below, each atomic under the module's one lock (not on any allocation
 * path: placement is decided once, when a provider is made).
 *
 *  operation                       may run at the same time as        notes
 *  hm_memtarget_* (getters)        anything                           targets never change
 *  create_* / clone                anything                           the topology in use when
 *                                                                     the call starts
 *  target_count / target_get /     anything but destroy of the        each sees the space before
 *  ids / target_add / _remove /    same space                         or after a concurrent
 *  filter_by_id / _by_capacity /                                      change, never half of one
 *  hm_os_params_set_memspace /
 *  provider_create
 *  filter (user callback)          the same                           the callback runs without
 *                                                                     the lock, on a snapshot (it
 *                                                                     may call the getters on
 *                                                                     the space); then the targets
 *                                                                     it rejected are removed
 *  destroy                         anything but calls on the same     a caller's bug otherwise,
 *                                  space                              as for every destroy
 *  topology_load_xml               anything                           spaces already made keep
 *                                                                     their topology
 * A target pointer stays valid while the space it was got from exists (the
 * space holds its topology), even after the target is removed from it.
 * fork(): the module's lock is held across fork (its slot in src/fork.h),
 * so a child may go on using the spaces it inherited. */
#ifndef HETMEM_MEMSPACE_H
#define HETMEM_MEMSPACE_H

#include <hetmem/base.h>
#include <hetmem/provider.h>
#include <hetmem/providers/os.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_memspace hm_memspace_t;
typedef struct hm_memtarget hm_memtarget_t;

/* Which memory a target is, from hwloc's subtype of the node (and its
 * DAXType info where it has no subtype). A node with neither is ordinary
 * memory: DRAM. hwloc before 2.10 names no CXL memory: a CXL expander reads
 * as DRAM there (a CPU-less node with lower bandwidth; see its attributes). */
typedef enum hm_memtarget_kind {
    HM_MEMTARGET_DRAM = 0,     /* subtype DRAM, or none */
    HM_MEMTARGET_HBM = 1,      /* HBM, MCDRAM */
    HM_MEMTARGET_NVM = 2,      /* NVM: persistent memory used as RAM (e.g. a DAX device onlined) */
    HM_MEMTARGET_CXL_DRAM = 3, /* CXL-DRAM */
    HM_MEMTARGET_CXL_NVM = 4,  /* CXL-NVM */
    HM_MEMTARGET_SPM = 5,      /* SPM: specific-purpose (soft-reserved) memory */
    HM_MEMTARGET_GPU = 6,      /* GPUMemory: GPU memory exposed as a NUMA node */
    HM_MEMTARGET_OTHER = 7,    /* a subtype hetmem does not know (hm_memtarget_get_subtype) */
} hm_memtarget_kind_t;

/* "DRAM", "HBM", ...; "?" for a value outside the enum. */
HM_API const char *hm_memtarget_kind_string(hm_memtarget_kind_t kind);

/* Memory attributes that depend on the initiator. */
typedef enum hm_memattr {
    HM_MEMATTR_BANDWIDTH = 0,       /* MiB/s, average of read and write */
    HM_MEMATTR_READ_BANDWIDTH = 1,  /* MiB/s */
    HM_MEMATTR_WRITE_BANDWIDTH = 2, /* MiB/s */
    HM_MEMATTR_LATENCY = 3,         /* ns, average of read and write */
    HM_MEMATTR_READ_LATENCY = 4,    /* ns */
    HM_MEMATTR_WRITE_LATENCY = 5,   /* ns */
} hm_memattr_t;

/* ---- the topology ---------------------------------------------------- */

/* Spaces created after this call use the hwloc XML topology at path; NULL
 * goes back to this machine's. A file hwloc cannot load is
 * HM_ERROR_INVALID_ARGUMENT (logged) and changes nothing. For tests and
 * diagnostics: such spaces never bind memory. */
HM_API hm_result_t hm_memspace_topology_load_xml(const char *path);

/* ---- targets --------------------------------------------------------- */

HM_API hm_result_t hm_memtarget_get_id(const hm_memtarget_t *target, unsigned *os_id);
/* Bytes of memory the node has (hwloc's local_memory). */
HM_API hm_result_t hm_memtarget_get_capacity(const hm_memtarget_t *target, uint64_t *bytes);
HM_API hm_result_t hm_memtarget_get_kind(const hm_memtarget_t *target,
                                         hm_memtarget_kind_t *kind);
/* hwloc's subtype string ("HBM", "CXL-DRAM", ...); HM_ERROR_NOT_FOUND where
 * the node has none. Valid as long as target is. */
HM_API hm_result_t hm_memtarget_get_subtype(const hm_memtarget_t *target, const char **subtype);
/* The device DAX the node was onlined from ("dax0.0": hwloc's DAXDevice
 * info); HM_ERROR_NOT_FOUND for a node that is not one. Valid as long as
 * target is. */
HM_API hm_result_t hm_memtarget_get_dax_device(const hm_memtarget_t *target, const char **name);
/* The OS numbers of the CPUs the node is local to (its hwloc cpuset), as
 * many as fit in cpus[capacity]; *count is the total. cpus may be NULL
 * with capacity 0 to ask for the count; a buffer too small is filled and
 * HM_ERROR_LIMIT returned. */
HM_API hm_result_t hm_memtarget_get_cpus(const hm_memtarget_t *target, unsigned *cpus,
                                         size_t capacity, size_t *count);
/* The attribute's value for accesses from the initiator (cpus[ncpus]; NULL,
 * 0: the calling thread's CPUs). hwloc's rule: a value recorded for an
 * initiator cpuset that contains all of these CPUs. None:
 * HM_ERROR_NOT_SUPPORTED, *value untouched (the firmware gives none, or
 * only for other CPUs). */
HM_API hm_result_t hm_memtarget_get_attr(const hm_memtarget_t *target, hm_memattr_t attr,
                                         const unsigned *cpus, size_t ncpus, uint64_t *value);

/* ---- spaces: predefined ---------------------------------------------- */
/* Each creates a new space (*space: destroy it with hm_memspace_destroy).
 * Bad CPU numbers (not in the topology) are HM_ERROR_INVALID_ARGUMENT. */

/* Every NUMA node of the topology. */
HM_API hm_result_t hm_memspace_create_host_all(hm_memspace_t **space);
/* The nodes with the largest capacity (all of them on a tie). Capacity does
 * not depend on the initiator. */
HM_API hm_result_t hm_memspace_create_highest_capacity(hm_memspace_t **space);
/* Best bandwidth / latency seen from the initiator's localities (see the
 * top of this file); HM_ERROR_NOT_SUPPORTED where no node has a value. */
HM_API hm_result_t hm_memspace_create_highest_bandwidth(const unsigned *cpus, size_t ncpus,
                                                        hm_memspace_t **space);
HM_API hm_result_t hm_memspace_create_lowest_latency(const unsigned *cpus, size_t ncpus,
                                                     hm_memspace_t **space);
/* The nodes local to the CPUs: for each CPU, every node whose cpuset is the
 * CPU's locality (the smallest node cpuset that contains it); the union.
 * A socket's DRAM and HBM nodes are both near its CPUs; a node attached to
 * the whole machine (a CXL expander) is near no CPU but where nothing
 * smaller is. */
HM_API hm_result_t hm_memspace_create_nearest(const unsigned *cpus, size_t ncpus,
                                              hm_memspace_t **space);
/* The nodes nearest a device: device is a PCI bus id ("0000:65:00.0" or
 * "65:00.0") or the name of an hwloc OS device ("cuda0", "nvml0", "ze0",
 * "ib0", ...). The nodes near the CPUs of its closest non-I/O ancestor. A
 * device hwloc attaches to the whole machine (its locality is unknown, or
 * it is equally near every node) gets every node: with no locality known,
 * no node is nearer than another (logged at INFO). A device the topology
 * does not have: HM_ERROR_NOT_FOUND (logged). */
HM_API hm_result_t hm_memspace_create_nearest_device(const char *device, hm_memspace_t **space);

/* ---- spaces: explicit, copies, destroy ------------------------------- */

/* The nodes with these OS numbers (each at most once; at least one; every
 * one must exist: else HM_ERROR_INVALID_ARGUMENT, logged). */
HM_API hm_result_t hm_memspace_create_from_ids(const unsigned *ids, size_t count,
                                               hm_memspace_t **space);
HM_API hm_result_t hm_memspace_clone(const hm_memspace_t *space, hm_memspace_t **clone);
HM_API hm_result_t hm_memspace_destroy(hm_memspace_t *space);

/* ---- spaces: contents ------------------------------------------------ */

HM_API hm_result_t hm_memspace_target_count(const hm_memspace_t *space, size_t *count);
/* The index-th target (ascending OS number); index >= count:
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_memspace_target_get(const hm_memspace_t *space, size_t index,
                                          const hm_memtarget_t **target);
/* The OS numbers of the space's nodes, ascending; same buffer rules as
 * hm_memtarget_get_cpus. */
HM_API hm_result_t hm_memspace_ids(const hm_memspace_t *space, unsigned *ids, size_t capacity,
                                   size_t *count);
/* Add a target of the same topology (got from any space made from it); one
 * already there, or of another topology: HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_memspace_target_add(hm_memspace_t *space, const hm_memtarget_t *target);
/* Remove a target; one not there, or the last one:
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_memspace_target_remove(hm_memspace_t *space, const hm_memtarget_t *target);

/* ---- spaces: filters (in place) -------------------------------------- */
/* Each keeps the targets that pass. On any error, and when no target would
 * be left (HM_ERROR_INVALID_ARGUMENT, logged), the space is unchanged. */

/* Keep the nodes whose OS number is listed (ids[count], count >= 1; an id
 * the topology does not have: HM_ERROR_INVALID_ARGUMENT). */
HM_API hm_result_t hm_memspace_filter_by_id(hm_memspace_t *space, const unsigned *ids,
                                            size_t count);
/* Keep the nodes with at least min_bytes of capacity. */
HM_API hm_result_t hm_memspace_filter_by_capacity(hm_memspace_t *space, uint64_t min_bytes);
/* Keep the targets for which fn returns 1; 0 drops one; a negative value
 * stops the filter and is returned as the result (an hm_result_t error;
 * other negative values become HM_ERROR_UNKNOWN). */
typedef int (*hm_memspace_filter_fn)(const hm_memspace_t *space, const hm_memtarget_t *target,
                                     void *arg);
HM_API hm_result_t hm_memspace_filter(hm_memspace_t *space, hm_memspace_filter_fn fn, void *arg);

/* ---- providers ------------------------------------------------------- */

/* Make params bind to the space's nodes: hm_os_params_set_numa(params,
 * mode, the space's OS numbers). mode: HM_OS_NUMA_BIND (pages only on these
 * nodes; Linux takes them from the node nearest the running CPU first),
 * HM_OS_NUMA_INTERLEAVE, or HM_OS_NUMA_PREFERRED (a one-node space only).
 * A space of an XML topology: HM_ERROR_NOT_SUPPORTED (logged). The params
 * keep the node numbers, not the space. */
HM_API hm_result_t hm_os_params_set_memspace(hm_os_params_t *params, const hm_memspace_t *space,
                                             hm_os_numa_mode_t mode);
/* An OS provider (private mappings, default pages) bound to the space as
 * above. */
HM_API hm_result_t hm_memspace_provider_create(const hm_memspace_t *space, hm_os_numa_mode_t mode,
                                               hm_provider_t **provider);

#ifdef __cplusplus
}
#endif
#endif
