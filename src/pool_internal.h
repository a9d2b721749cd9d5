/* hetmem — the pool struct, for the front-ends. SPDX-License-Identifier: MIT */
#ifndef HM_POOL_INTERNAL_H
#define HM_POOL_INTERNAL_H

#include "internal.h"
#include "provider_internal.h"
#include "tracker/tracker.h"

/* What hm_pool_malloc and hm_pool_free tail-call once pool is known not to
 * be NULL: one load and an indirect jump in the front end. A pool whose ops
 * give a fast malloc or validate pointers gets pool.c's thin entries
 * (malloc_fast after a size test, ops.free after a NULL test); a pool may
 * install entries of its own from its init op (hm__pool_set_entries), which
 * then do those tests themselves: malloc_entry(pool, 0) fails with EINVAL,
 * free_entry(pool, NULL) returns HM_SUCCESS. */
typedef void *(*hm_pool_malloc_entry_t)(hm_pool_t *pool, size_t size);
typedef hm_result_t (*hm_pool_free_entry_t)(hm_pool_t *pool, void *ptr);

/* Invariants: malloc_entry, malloc_fast, alloc, free, check_owner, ops,
 * provider, flags, tracked, cpu_accessible are immutable after create (entries
 * installed by init included); every range the pool holds from its provider is in `index` unless
 * the pool was created with HM_POOL_FLAG_NO_TRACKING. */
struct hm_pool {
    /* Line 0 (pools are allocated cache-line aligned): all that the
     * hm_pool_malloc/hm_pool_free fast paths read. */
    hm_pool_malloc_entry_t malloc_entry; /* never NULL */
    /* Never NULL. While hm_pool_free needs no check of its own (the pool
     * validates pointers itself, or is untracked, and has no IPC state), a
     * fast entry; set for good to pool.c's checking entry, before pool->ipc
     * is published, when IPC state is made (hm__pool_check_frees): an
     * imported pointer only exists after that. */
    _Atomic hm_pool_free_entry_t free_entry;
    void *state;
    void *(*malloc_fast)(void *state, size_t size); /* ops.malloc_fast (may be NULL) */
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

/* For a pool's init op: make malloc_entry and (unless the front end must
 * check pointers, hm_pool.check_owner) free_entry the pool's own. */
void hm__pool_set_entries(hm_pool_t *pool, hm_pool_malloc_entry_t m, hm_pool_free_entry_t f);
/* hm_pool_free checks every pointer from now on (ipc.c, under its lock,
 * before it publishes pool->ipc). */
void hm__pool_check_frees(hm_pool_t *pool);

#endif
