/* hetmem — the provider struct, for the front-ends (pool.c, ipc).
 * SPDX-License-Identifier: MIT */
#ifndef HM_PROVIDER_INTERNAL_H
#define HM_PROVIDER_INTERNAL_H

#include "internal.h"

/* Invariants: ops and info are immutable after hm_provider_create();
 * info.caps never claims an op that is NULL. */
struct hm_provider {
    hm_provider_ops_t ops; /* copied: the caller's table may be short-lived */
    void *state;
    hm_provider_info_t info;
};

int hm__provider_is_live(const hm_provider_t *p);

#endif
