/* hetmem — the OS provider: anonymous or memfd-shared mappings, NUMA-bound
 * through hwloc. SPDX-License-Identifier: MIT */
#ifndef HETMEM_PROVIDERS_OS_H
#define HETMEM_PROVIDERS_OS_H

#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_os_params hm_os_params_t;

/* HM_OS_SHARED gives each allocation a memfd of its own, sized to it and
 * sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL: nobody holding its
 * descriptor can resize it or seal it further), so that an IPC handle of a
 * pointer exposes exactly the provider allocation that holds it (a pool
 * carves many blocks out of one provider allocation: they travel together),
 * never another allocation of the provider; the importer refuses a memfd
 * that is not sealed against shrinking. A freed allocation's memfd is
 * closed; its pages stay only while an importer maps them. The provider
 * keeps at most hm_os_params_set_max_memfds() such descriptors; beyond that
 * (or when the process has no descriptor left) allocations share one
 * further memfd, the spill (sealed F_SEAL_SHRINK, freed by punching holes),
 * and a handle of any of them exposes every allocation in the spill.
 * Descriptors are kept high and close-on-exec and checked before each
 * ftruncate, mmap, hole punch, export and close: a program that closes one
 * or reuses its number gets refusals, never its own file resized or
 * mapped as memory. */
typedef enum hm_os_visibility {
    HM_OS_PRIVATE = 0, /* anonymous private mappings (default) */
    HM_OS_SHARED = 1,  /* MAP_SHARED over sealed memfds: IPC-capable */
} hm_os_visibility_t;

typedef enum hm_os_page_kind {
    HM_OS_PAGES_DEFAULT = 0,     /* base pages; the kernel's THP policy applies */
    HM_OS_PAGES_THP = 1,         /* madvise(MADV_HUGEPAGE) */
    HM_OS_PAGES_NO_THP = 2,      /* madvise(MADV_NOHUGEPAGE) */
    HM_OS_PAGES_HUGETLB_2M = 3,  /* hugetlbfs 2 MiB pages (MAP_HUGETLB / MFD_HUGETLB) */
    HM_OS_PAGES_HUGETLB_1G = 4,  /* hugetlbfs 1 GiB pages */
} hm_os_page_kind_t;

typedef enum hm_os_numa_mode {
    HM_OS_NUMA_DEFAULT = 0,    /* the thread's policy; no binding */
    HM_OS_NUMA_BIND = 1,       /* only these nodes */
    HM_OS_NUMA_INTERLEAVE = 2, /* pages round-robin over these nodes */
    HM_OS_NUMA_PREFERRED = 3,  /* this node first (exactly one node) */
} hm_os_numa_mode_t;

enum {
    HM_OS_PROT_NONE = 0,
    HM_OS_PROT_READ = 1u << 0,
    HM_OS_PROT_WRITE = 1u << 1,
    HM_OS_PROT_EXEC = 1u << 2,
};

HM_API const hm_provider_ops_t *hm_os_provider_ops(void);

/* Params object: create, set, pass to hm_provider_create(), destroy.
 * Defaults: private, default pages, no NUMA binding, read|write. */
HM_API hm_result_t hm_os_params_create(hm_os_params_t **params);
HM_API hm_result_t hm_os_params_destroy(hm_os_params_t *params);
HM_API hm_result_t hm_os_params_set_visibility(hm_os_params_t *params, hm_os_visibility_t v);
HM_API hm_result_t hm_os_params_set_page_kind(hm_os_params_t *params, hm_os_page_kind_t kind);
/* nodes: OS NUMA node numbers; validated against the hwloc topology at
 * provider creation (unknown node: HM_ERROR_INVALID_ARGUMENT). */
HM_API hm_result_t hm_os_params_set_numa(hm_os_params_t *params, hm_os_numa_mode_t mode,
                                         const unsigned *nodes, size_t count);
HM_API hm_result_t hm_os_params_set_protection(hm_os_params_t *params, unsigned prot);
/* Name of the memfd in shared mode (shown in /proc/<pid>/maps). */
HM_API hm_result_t hm_os_params_set_shm_name(hm_os_params_t *params, const char *name);
/* Shared mode: memfds of their own that the provider keeps open at most (one
 * per live allocation); 0 (the default): an eighth of the soft
 * RLIMIT_NOFILE at create, at least 16 and at most 4096. Allocations beyond
 * it share the spill memfd (above); 1 and up are accepted. */
HM_API hm_result_t hm_os_params_set_max_memfds(hm_os_params_t *params, size_t count);

/* Convenience: hm_provider_create(hm_os_provider_ops(), params, provider);
 * params may be NULL for defaults. */
HM_API hm_result_t hm_os_provider_create(const hm_os_params_t *params, hm_provider_t **provider);

/* NUMA topology (hwloc): number of NUMA nodes (>= 1), and their OS numbers in
 * ascending order. */
HM_API hm_result_t hm_os_numa_nodes(unsigned *nodes, size_t capacity, size_t *count);
/* The NUMA node the page holding ptr currently lives on (touch it first). */
HM_API hm_result_t hm_os_numa_node_of(const void *ptr, unsigned *node);

#ifdef __cplusplus
}
#endif
#endif
