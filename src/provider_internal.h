/* hetmem — the provider struct, for the front-ends (pool.c, ipc).
 * SPDX-License-Identifier: MIT */
#ifndef HM_PROVIDER_INTERNAL_H
#define HM_PROVIDER_INTERNAL_H

#include "internal.h"

/* Invariants: ops, info and device are immutable after
 * hm_provider_create(); ops is a whole table of HM_PROVIDER_OPS_VERSION
 * (what a version 1 table lacks is NULL); info.caps never claims an op
 * that is NULL, and claims FILL/COPY exactly when fill/copy are set;
 * ops.ipc.close_many and ops.ipc_compatible are NULL unless the ipc five
 * are all set. */
struct hm_provider {
    hm_provider_ops_t ops; /* copied: the caller's table may be short-lived */
    void *state;
    hm_provider_info_t info;
    hm_device_id_t device; /* from ops.get_device; ordinal -1 and no UUID without it */
    uint64_t ipc_context;  /* from ops.ipc_context; 0: mappings are not shared */
};

int hm__provider_is_live(const hm_provider_t *p);

/* For src/ipc (hm_ipc_open, before it moves a descriptor or calls
 * ops.ipc.open): can p open the memory `payload` (handle_size() bytes,
 * from a provider of p's family) describes? HM_SUCCESS when p has no
 * ipc_compatible op; otherwise the op's answer (HM_ERROR_NOT_SUPPORTED:
 * another device's memory, logged by the op; HM_ERROR_INVALID_HANDLE:
 * malformed). */
hm_result_t hm__provider_ipc_compatible(hm_provider_t *p, const void *payload);

#endif
