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

/* A provider range of the pool with exported handles outstanding, for the
 * free entry's quick test (hm__pool_maybe_held): written by the IPC export
 * side under its lock (end, then base with release; removed base first),
 * read with no lock. base 0: empty. */
#define HM_POOL_HOLD_SLOTS 8
typedef struct hm_pool_hold_slot {
    _Atomic uintptr_t base, end;
} hm_pool_hold_slot_t;

/* Invariants: malloc_entry, malloc_fast, alloc, free, check_owner, ops,
 * provider, flags, tracked, cpu_accessible are immutable after create (entries
 * installed by init included); every range the pool holds from its provider is in `index` unless
 * the pool was created with HM_POOL_FLAG_NO_TRACKING. */
struct hm_pool {
    /* Line 0 (pools are allocated cache-line aligned): all that the
     * hm_pool_malloc/hm_pool_free fast paths read. */
    hm_pool_malloc_entry_t malloc_entry; /* never NULL */
    /* Never NULL. base_free_entry, except while the pool has exports with
     * handles outstanding (hm__pool_hold_frees): then pool.c's checking
     * entry, which defers the free of a block that holds an exported
     * pointer. Opened mappings need no check here: the pool's own free
     * refuses them as foreign pointers (hm__pool_refuse_free says which). */
    _Atomic hm_pool_free_entry_t free_entry;
    void *state;
    void *(*malloc_fast)(void *state, size_t size); /* ops.malloc_fast (may be NULL) */
    hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr); /* ops.alloc */
    hm_result_t (*free)(void *state, void *ptr);                                  /* ops.free */
    struct hm_ipc_pool *_Atomic ipc; /* IPC exports/imports (src/ipc), made on first use */
    /* The stream cache (src/stream), made at the first stream-ordered call:
     * hm_free checks it beside ipc, on the same line. */
    struct hm_stream_pool *_Atomic streams;
    bool check_owner; /* tracked, and the pool does not validate pointers itself */
    /* The entry hm_pool_free uses while no export of the pool is held: the
     * pool's own (hm__pool_set_entries), pool.c's thin one, or, where the
     * front end must check pointers (check_owner), the checking one. */
    hm_pool_free_entry_t base_free_entry;
    /* The ranges with exports held (a few, in slots; the rest counted in
     * holds_over, which sends every free to the full check). */
    hm_pool_hold_slot_t holds[HM_POOL_HOLD_SLOTS];
    _Atomic uint32_t holds_over;
    hm_pool_ops_t ops;
    hm_provider_t *provider;
    uint32_t flags;
    bool tracked;
    bool cpu_accessible;
    /* Memory of a driver that does not work in a fork child (CUDA, Level
     * Zero): in a child (fork_epoch differs) every allocation is refused,
     * malloc_entry being fork_malloc_entry and inner_malloc_entry the
     * pool's own. */
    bool fork_bound;
    unsigned fork_epoch;
    hm_pool_malloc_entry_t inner_malloc_entry;
    /* Frees of provider ranges and closes of IPC mappings of this pool that
     * the provider refused (hm__pool_note_refused): a destroy during which
     * it grows answers HM_ERROR_DRIVER. */
    _Atomic unsigned refused;
    /* Why frees go through the checking entry (hm__pool_hold_frees): IPC
     * exports held, blocks pending on streams (hold_lock in pool.c). */
    unsigned holders;
    hm_tracker_index_t index;
} HM_CACHE_ALIGNED;
_Static_assert(offsetof(struct hm_pool, streams) + sizeof(void *) <= 64,
               "hm_pool: the fast paths' fields on line 0");

/* The provider refused to free a range of the pool or to close one of its
 * IPC mappings (logged by the caller). */
static inline void hm__pool_note_refused(hm_pool_t *pool) {
    atomic_fetch_add_explicit(&pool->refused, 1, memory_order_relaxed);
}

/* For a pool's init op: make malloc_entry and (unless the front end must
 * check pointers, hm_pool.check_owner) free_entry the pool's own. */
void hm__pool_set_entries(hm_pool_t *pool, hm_pool_malloc_entry_t m, hm_pool_free_entry_t f);
/* Frees go through the front end's checks while a reason holds (counted):
 * on when the IPC export side gets the pool's first export with handles
 * outstanding (the free of an exported block waits for its last put) or
 * the stream cache its first pending block (a free of one is a double
 * free); off when that reason ends (base_free_entry again when none is
 * left). */
void hm__pool_hold_frees(hm_pool_t *pool, bool on);
/* Its lock around fork (the IPC slot's hooks, after IPC's own locks, whose
 * holders call hm__pool_hold_frees): 0 prepare (lock), 1 parent, 2 child
 * (unlock). */
void hm__pool_hold_atfork(int phase);

/* Whether ptr may lie in a range with exports held: false means surely not
 * (the free needs no check). A few relaxed loads, no lock. */
static inline bool hm__pool_maybe_held(hm_pool_t *pool, const void *ptr) {
    if (atomic_load_explicit(&pool->holds_over, memory_order_relaxed)) return true;
    uintptr_t p = (uintptr_t)ptr;
    for (int i = 0; i < HM_POOL_HOLD_SLOTS; i++) {
        uintptr_t b = atomic_load_explicit(&pool->holds[i].base, memory_order_acquire);
        if (b && p - b < atomic_load_explicit(&pool->holds[i].end, memory_order_relaxed) - b)
            return true;
    }
    return false;
}
/* A pool's free refused ptr as none of its blocks: the log line and the
 * result, HM_ERROR_INVALID_ARGUMENT. `call` names the call, `why` the
 * pool's reason; an IPC mapping opened through the pool is named as such
 * (close it with hm_ipc_close). Out of line, off every fast path. */
hm_result_t hm__pool_refuse_free(hm_pool_t *pool, const void *ptr, const char *call,
                                 const char *why);

#endif
