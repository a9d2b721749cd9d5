/* hetmem — the pool struct, for the front-ends. SPDX-License-Identifier: MIT */
#ifndef HM_POOL_INTERNAL_H
#define HM_POOL_INTERNAL_H

#include "internal.h"
#include "provider_internal.h"
#include "tracker/tracker.h"

/* Invariants: malloc_fast, alloc, free, check_owner, ops, provider, flags, tracked,
 * cpu_accessible are immutable after create; every range the pool holds from its provider is in `index` unless
 * the pool was created with HM_POOL_FLAG_NO_TRACKING. */
struct hm_pool {
    /* Line 0 (pools are allocated cache-line aligned): all that the
     * hm_pool_malloc/hm_pool_free fast paths read. */
    void *(*malloc_fast)(void *state, size_t size); /* ops.malloc_fast (may be NULL) */
    /* ops.free while hm_pool_free needs no check of its own: the pool
     * validates pointers itself (or is untracked) and has no IPC state.
     * Cleared for good, before pool->ipc is published, when IPC state is
     * made: an imported pointer only exists after that. NULL otherwise. */
    hm_result_t (*_Atomic free_fast)(void *state, void *ptr);
    void *state;
    hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr); /* ops.alloc */
    hm_result_t (*free)(void *state, void *ptr);                                  /* ops.free */
    struct hm_ipc_pool *_Atomic ipc; /* IPC exports/imports (src/ipc), made on first use */
    bool check_owner; /* tracked, and the pool does not validate pointers itself */
    hm_pool_ops_t ops;
    hm_provider_t *provider;
    uint32_t flags;
    bool tracked;
    bool cpu_accessible;
    hm_tracker_index_t index;
} HM_CACHE_ALIGNED;

#endif
