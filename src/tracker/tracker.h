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
 * time proportional to their number. */
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
/* The index must be empty (drained). */
void hm__tracker_index_fini(hm_tracker_index_t *idx);

/* Record [base, base+size) for pool/provider. Overlap with a live range:
 * HM_ERROR_INVALID_ARGUMENT (logged). Out of metadata: OUT_OF_HOST_MEMORY.
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

/* Remove every record of idx; for each, after it is unreachable by lookups,
 * call cb(arg, entry). Cost proportional to idx's own records. */
void hm__tracker_index_drain(hm_tracker_index_t *idx,
                             void (*cb)(void *arg, const hm_tracker_entry_t *entry), void *arg);

/* Library hooks (called from init.c). */
void hm__tracker_init(void);
void hm__tracker_fini(void);
void hm__tracker_atfork_prepare(void);
void hm__tracker_atfork_parent(void);
void hm__tracker_atfork_child(void);

#endif
