/* hetmem — memory spaces, internal: the topology a space is made from, its
 * targets, the space itself, and what the parts share. Never installed.
 * SPDX-License-Identifier: MIT
 *
 * Files (one concern each):
 *   topology.c    the topologies (this machine's, loaded once; XML ones),
 *                 their references, their targets, the module's lock and
 *                 fork slot, initiators and localities
 *   target.c      hm_memtarget_* (properties, attributes)
 *   space.c       spaces: create from ids, clone, destroy, contents, add/remove
 *   predefined.c  host all, highest capacity/bandwidth, lowest latency, nearest
 *   filter.c      the in-place filters
 *   bind.c        spaces to OS providers
 *
 * Locking: g_lock (topology.c, hm__ms_lock/unlock) guards the current
 * topology pointer and every space's n and idx. Nothing of the library is
 * called, nothing allocated and nothing logged under it. Topologies and
 * targets are immutable once published; a topology is freed when its last
 * reference goes (spaces hold one each, the current-topology pointer one). */
#ifndef HM_MEMSPACE_INTERNAL_H
#define HM_MEMSPACE_INTERNAL_H

#include "internal.h"

#include <hetmem/memspace.h>
#include <hwloc.h>

#define HM_MEMTARGET_MAGIC 0x4d544754u /* "MTGT" */
#define HM_MEMSPACE_MAGIC 0x4d535043u  /* "MSPC" */

typedef struct hm_ms_topo hm_ms_topo_t;

/* One NUMA node. Immutable; lives as long as its topology. */
struct hm_memtarget {
    uint32_t magic;
    uint32_t index; /* in topo->targets */
    hm_ms_topo_t *topo;
    hwloc_obj_t node;
    unsigned os_id;
    hm_memtarget_kind_t kind;
    uint64_t capacity;
    const char *subtype; /* hwloc's strings, or NULL */
    const char *dax;
};

/* A loaded topology. Invariants: targets[] in ascending os_id, n >= 1,
 * never changed after publication; refs > 0 while anything can reach it. */
struct hm_ms_topo {
    _Atomic size_t refs;
    hwloc_topology_t hw;
    int xml;     /* loaded from an XML file: describes another machine, never binds */
    size_t n;    /* NUMA nodes */
    struct hm_memtarget *targets;
};

/* Invariants: 1 <= n <= topo->n; idx[0..n) strictly ascending indexes into
 * topo->targets (so ascending OS numbers); idx has room for topo->n. n and
 * idx change only under g_lock; topo never changes. */
struct hm_memspace {
    uint32_t magic;
    hm_ms_topo_t *topo; /* one reference */
    size_t n;
    uint32_t *idx;
};

/* ---- topology.c ---- */
void hm__ms_lock(void);
void hm__ms_unlock(void);
/* A reference to the topology spaces are made from now (loading this
 * machine's on first use: HM_ERROR_DRIVER with the native error recorded
 * when hwloc cannot). */
hm_result_t hm__ms_topo_get(hm_ms_topo_t **topo);
void hm__ms_topo_ref(hm_ms_topo_t *topo);
void hm__ms_topo_put(hm_ms_topo_t *topo);
/* The OS number's target, or NULL. */
const struct hm_memtarget *hm__ms_target_by_id(const hm_ms_topo_t *topo, unsigned os_id);

/* The initiator as a cpuset: cpus[ncpus] (each must be a CPU of the
 * topology), or NULL/0 for the calling thread's CPUs (this machine only).
 * what names the caller for the log. *set: hwloc_bitmap_free(). */
hm_result_t hm__ms_initiator(const hm_ms_topo_t *topo, const unsigned *cpus, size_t ncpus,
                             const char *what, hwloc_bitmap_t *set);

/* The initiator split by locality: for each locality (the smallest node
 * cpuset holding a CPU), the node cpuset and the initiator's CPUs in it. */
typedef struct hm_ms_group {
    hwloc_const_bitmap_t locality; /* a node's cpuset (the topology's) */
    hwloc_bitmap_t cpus;           /* initiator ∩ locality, owned */
} hm_ms_group_t;
/* groups: room for topo->n entries. Returns how many, or -1 when out of
 * memory. */
int hm__ms_groups(const hm_ms_topo_t *topo, hwloc_const_bitmap_t initiator,
                  hm_ms_group_t *groups);
void hm__ms_groups_free(hm_ms_group_t *groups, int n);

/* ---- space.c ---- */
/* Checks a space argument (NULL, not a live space): logs, INVALID_ARGUMENT. */
hm_result_t hm__ms_check(const hm_memspace_t *space, const char *what);
/* Checks a target argument (NULL, not a target). */
hm_result_t hm__ms_check_target(const hm_memtarget_t *target, const char *what);
/* A new space of topo (a reference of its own taken) holding the targets
 * whose keep[i] is set (at least one). */
hm_result_t hm__ms_create_from_mask(hm_ms_topo_t *topo, const unsigned char *keep,
                                    hm_memspace_t **space);
/* Copies the space's target indexes (room for topo->n) under the lock;
 * returns how many. */
size_t hm__ms_snapshot(const hm_memspace_t *space, uint32_t *idx);

#endif
