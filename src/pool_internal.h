/* hetmem — the pool struct, for the front-ends. SPDX-License-Identifier: MIT */
#ifndef HM_POOL_INTERNAL_H
#define HM_POOL_INTERNAL_H

#include "internal.h"
#include "provider_internal.h"
#include "tracker/tracker.h"

/* Invariants: ops, provider, flags, cpu_accessible are immutable after
 * create; every range the pool holds from its provider is in `index` unless
 * the pool was created with HM_POOL_FLAG_NO_TRACKING. */
struct hm_pool {
    hm_pool_ops_t ops;
    void *state;
    hm_provider_t *provider;
    uint32_t flags;
    bool tracked;
    bool cpu_accessible;
    hm_tracker_index_t index;
    struct hm_ipc_pool *_Atomic ipc; /* IPC exports/imports (src/ipc), made on first use */
};

#endif
