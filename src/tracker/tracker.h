/* hetmem — the tracker: every provider range mapped to its pool.
 * SPDX-License-Identifier: MIT
 *
 * INTERFACE CONTRACT (the implementer of tracker.c may extend this header,
 * must keep these calls and fill in the concurrency table below).
 *
 * A process-wide map from non-overlapping address ranges [base, base+size)
 * to records {pool, provider, base, size, id, flags}. Lookups are lock-free
 * (RCU, urcu-bp) and never write shared cache lines; every record is also
 * linked into its pool's index so that a pool's records can be dropped in
 * time proportional to their number.
 *
 * Structure (tracker.c): a radix tree over the 57-bit virtual address space
 * shaped like a page table with huge-page entries (root: bits 39..56, then
 * 9-bit levels down to a 4 KiB granule); a range occupies the fewest slots
 * (a slot wholly inside it holds its record), ranges smaller than a granule
 * share an immutable, copy-on-write "page list" in the leaf slot. Each
 * thread caches the deepest node it reached per 2 MiB region (invalidated by
 * an epoch counter when a node is collapsed). Removed records, replaced page
 * lists and collapsed nodes are freed after an urcu-bp grace period, in
 * batches of 256 (or 64 KiB) handed to call_rcu (urcu's helper thread
 * waits, writers do not, except drain/flush/fini which wait one grace
 * period). Retired memory is bounded: a writer whose batch would take the
 * bytes queued to call_rcu past 2 MiB frees that batch itself after a grace
 * period of its own (back-pressure when the helper lags).
 *
 * CONCURRENCY CONTRACT (in the manner of liburcu's wfcqueue.h)
 *
 * Operations on disjoint ranges:
 *
 *              | lookup | insert | remove | split | merge | drain(other idx)
 *   (rehome: as split, for the old index and the new)
 *   lookup     |   ok   |   ok   |   ok   |  ok   |  ok   |  ok
 *   insert     |   ok   |   ok   |   ok   |  ok   |  ok   |  ok
 *   remove     |   ok   |   ok   |   ok   |  ok   |  ok   |  ok
 *   split      |   ok   |   ok   |   ok   |  ok   |  ok   |  ok
 *   merge      |   ok   |   ok   |   ok   |  ok   |  ok   |  ok
 *   drain(idx) |   ok   |  (1)   |  (1)   |  (1)   |  (1)  |  ok
 *   fini       |   ok   |   -    |   -    |   -   |   -   |  -      (2)
 *
 *   ok  may run at the same time from any threads, with no lock in common
 *       (writers serialise only on the index mutex of the pool they change,
 *       and on one of 16 retire-list shards, briefly).
 *   (1) not on records of the same index: a pool is not destroyed while
 *       other threads still allocate from it. If it happens anyway, every
 *       record is still processed by exactly one of them (claimed by CAS)
 *       and drain logs a warning.
 *   (2) fini runs with no writer left (library teardown); concurrent lookups
 *       are safe (it unpublishes the root and waits a grace period).
 *   On the same range: the record is claimed by CAS, so of two removes (or
 *   remove/split/merge) of one range exactly one succeeds and the others
 *   return NOT_FOUND; overlapping inserts: at most one succeeds, the others
 *   return INVALID_ARGUMENT and leave nothing behind.
 *
 * Guarantees:
 *   lookup  lock-free, wait-free in practice (at most 4 node loads and a
 *           binary search in a page list); writes no shared memory (only
 *           this thread's urcu-bp reader counter and node cache); may run in
 *           any thread without registration. Linearisable: it returns a
 *           range that was tracked at some instant during the call.
 *   split/merge  every slot of the old range(s) changes by one atomic store
 *           from an old record to a new one (or to a fully built node that
 *           holds the new ones), so a concurrent lookup of a byte that stays
 *           covered sees the old or the new range, never none.
 *   remove/drain  once they return, no lookup that starts later finds the
 *           record. drain calls cb only after a grace period: no lookup in
 *           flight can still return the record, and the entry may be freed
 *           to the provider.
 *   ids     unique in the process for its life (never reused), from per-
 *           thread blocks of one atomic counter.
 *
 * Ordering: a record (and a page list) is fully initialised before the
 * release CAS that publishes it in a slot; lookups load slots with acquire.
 * A child node is zeroed (or, on split, pre-filled) before its release CAS.
 * Reclamation: unpublish -> synchronize_rcu -> free; the read-side section
 * of every lookup and writer walk encloses every dereference of a record or
 * page list.
 *
 * Rules for callers: never call drain, flush, fini or a writer from inside
 * an urcu-bp read-side section or a call_rcu callback (they may wait a
 * grace period: deadlock; a writer waits one when the call_rcu queue is
 * full); drain callbacks run outside any section. */
#ifndef HM_TRACKER_H
#define HM_TRACKER_H

#include "internal.h"

/* Record flags (same bits as the public HM_ALLOCATION_* flags). */
enum {
    HM_TRACK_HOST_ACCESSIBLE = HM_ALLOCATION_HOST_ACCESSIBLE,
    HM_TRACK_IMPORTED = HM_ALLOCATION_IMPORTED,
};

struct hm_tracker_record;

/* One per pool, embedded in the pool struct. */
typedef struct hm_tracker_index {
    pthread_mutex_t lock;           /* guards the list and counters */
    struct hm_tracker_record *head; /* this pool's records */
    size_t count;
    size_t bytes;
    /* all live indexes, so the fork hooks can hold every index lock
     * (guarded by the tracker's registry lock) */
    struct hm_tracker_index *reg_prev, *reg_next;
} hm_tracker_index_t;

/* A copy of a record, safe to use outside any read-side section. */
typedef struct hm_tracker_entry {
    uintptr_t base;
    size_t size;
    hm_pool_t *pool;
    hm_provider_t *provider;
    uint64_t id;
    uint32_t flags;
} hm_tracker_entry_t;

void hm__tracker_index_init(hm_tracker_index_t *idx);
/* This index's record count and bytes (a consistent pair). Either may be NULL. */
void hm__tracker_index_stats(hm_tracker_index_t *idx, size_t *count, size_t *bytes);
/* The index must be empty (drained). */
void hm__tracker_index_fini(hm_tracker_index_t *idx);

/* Record [base, base+size) for pool/provider. Overlap with a live range:
 * HM_ERROR_INVALID_ARGUMENT (logged). A range that reaches 2^57
 * (HM_TRACKER_ADDR_BITS, addr_width.h): HM_ERROR_NOT_SUPPORTED (logged);
 * lookups of such addresses find nothing. Out of metadata: OUT_OF_HOST_MEMORY.
 * *id (may be NULL) receives the new unique allocation id. */
hm_result_t hm__tracker_insert(hm_tracker_index_t *idx, hm_pool_t *pool, hm_provider_t *provider,
                               uintptr_t base, size_t size, uint32_t flags, uint64_t *id);
/* Forget exactly [base, base+size). Unknown or different range: NOT_FOUND. */
hm_result_t hm__tracker_remove(uintptr_t base, size_t size);

/* Lock-free lookups of the range containing ptr. */
int hm__tracker_lookup(const void *ptr, hm_tracker_entry_t *out); /* 1 found, 0 not */
hm_pool_t *hm__tracker_lookup_pool(const void *ptr);              /* NULL if unknown */

/* Split [base, base+total) at base+first; merge adjacent [lo, hi) + [hi, ...)
 * ranges of the same pool and provider into one of `total` bytes. Atomic for
 * lookups: a concurrent lookup sees the old range(s) or the new one(s), never
 * none. The new ranges get fresh ids (split: the lower part keeps the id). */
hm_result_t hm__tracker_split(uintptr_t base, size_t total, size_t first);
hm_result_t hm__tracker_merge(uintptr_t lo, uintptr_t hi, size_t total);

/* Give the record of exactly [base, base+size) to another pool: the same
 * range, id and flags, now in idx for pool/provider. Atomic for lookups
 * (they see the old owner or the new one, never none), like split. A
 * mapping shared by several importing pools moves to another of them when
 * the pool that holds its record lets go (src/ipc/import.c). Unknown range:
 * NOT_FOUND; no memory for the new record: OUT_OF_HOST_MEMORY (nothing
 * changed). */
hm_result_t hm__tracker_rehome(uintptr_t base, size_t size, hm_tracker_index_t *idx,
                               hm_pool_t *pool, hm_provider_t *provider);

/* Remove every record of idx; for each, after it is unreachable by lookups,
 * call cb(arg, entry). Cost proportional to idx's own records. */
void hm__tracker_index_drain(hm_tracker_index_t *idx,
                             void (*cb)(void *arg, const hm_tracker_entry_t *entry), void *arg);

/* Wait one grace period and free every retired record and page list
 * (tests, leak checks; fini does it itself). */
void hm__tracker_flush(void);

/* The retired memory not yet freed: bytes queued to call_rcu now, their
 * high-water mark since the process started, and the bound they stay
 * within; bytes waiting in the retire shards and their bound (each shard
 * may exceed its share by the last retired object); batches that writers
 * freed themselves because the queue was full. For tests and benchmarks. */
typedef struct hm_tracker_retire_stats {
    size_t pending_bytes, pending_peak, pending_limit;
    size_t shard_bytes, shard_limit;
    uint64_t sync_reclaims;
} hm_tracker_retire_stats_t;
void hm__tracker_retire_stats(hm_tracker_retire_stats_t *st);

/* Library hooks (called from init.c). fini frees the tree only if no record
 * is left; it must not run concurrently with writers. */
void hm__tracker_init(void);
void hm__tracker_fini(void);
/* Fork: the _rcu hooks are the RCU slot of the library's fork list, the
 * others the TRACKER slot (fork.h; init.c fills both): prepare_rcu, (the
 * pools', IPC's), prepare; after fork parent, (...), parent_rcu, or child,
 * (...), child_rcu (see tracker.c). */
void hm__tracker_atfork_prepare_rcu(void);
void hm__tracker_atfork_prepare(void);
void hm__tracker_atfork_parent(void);
void hm__tracker_atfork_parent_rcu(void);
void hm__tracker_atfork_child(void);
void hm__tracker_atfork_child_rcu(void);

#endif
