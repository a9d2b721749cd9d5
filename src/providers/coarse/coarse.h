/* hetmem — the coarse layer: alloc/free of arbitrary ranges out of a few
 * large mappings, for providers whose medium cannot give single ranges back
 * (a file, a DAX device, a caller's buffer). Internal; never installed.
 * SPDX-License-Identifier: MIT
 *
 * Model. The coarse object owns a set of *regions* (one region = one mapping
 * the owner made, e.g. one mmap of a file at some offset, or the whole fixed
 * buffer). Every byte of every region belongs to exactly one *block*; a block
 * is either used (handed out by hm__coarse_alloc) or free. Blocks never span
 * two regions, so a block's bytes are contiguous in the owner's medium too
 * (one file offset range), and neighbours in different regions are never
 * coalesced, even when their addresses happen to touch.
 *
 * Invariants (checked by hm__coarse_check):
 *  - region base and size are multiples of the granularity; so is every
 *    block's base and size; the blocks of a region tile it exactly;
 *  - no two free blocks of one region are neighbours (freeing coalesces);
 *  - the address tree holds every block keyed by base; the size tree holds
 *    every free block keyed by (size, base);
 *  - stats.mapped = sum of region sizes = allocated + free.
 *
 * Placement: best fit. alloc(size, alignment) looks up the smallest free
 * block of at least `size` bytes (O(log n)); when the alignment is larger
 * than the granularity it tries that block and the next larger ones in size
 * order until the aligned start fits. When the owner can grow, it stops
 * after a few probes and takes the smallest block of at least
 * size + alignment - granularity (which always fits) or grows; when it
 * cannot (fixed capacity), it keeps looking, so an allocation that can be
 * placed never fails (linear only in that rare case). Inside the chosen
 * block the range starts at the lowest aligned address; the head and tail
 * remainders stay free. A fresh coarse object over one region therefore hands
 * out its memory from the low end, deterministically (the file provider's
 * persistence contract relies on this).
 *
 * Trees: randomized search trees (treaps) of Aragon and Seidel ("Randomized
 * Search Trees", FOCS 1989; Algorithmica 16, 1996): expected O(log n) insert,
 * delete and search, written here from the paper's split/join description.
 *
 * Concurrency contract:
 *
 *  | operation                         | may run concurrently with | lock        |
 *  |-----------------------------------|---------------------------|-------------|
 *  | alloc, free, split, merge, lookup, | each other, any thread    | coarse lock |
 *  | add_region, get_stats, check      |                           | (internal)  |
 *  | ops.grow (owner callback)         | everything above, and     | none held   |
 *  |                                   | other grow calls          |             |
 *  | destroy                           | nothing                   | none        |
 *
 * The coarse lock is a mutex held only for tree and list updates (and the
 * malloc of block records): never across a system call or an owner callback.
 * When no free block fits, alloc drops the lock, calls ops.grow (which may
 * mmap, fallocate ...), then takes the lock again, adds the new region and
 * allocates from it. Several threads may grow at once; each adds its own
 * region. ops.release runs only from destroy.
 */
#ifndef HM_COARSE_H
#define HM_COARSE_H

#include "internal.h"

typedef struct hm_coarse hm_coarse_t;

typedef struct hm_coarse_ops {
    /* Make a new region that can hold `size` bytes at `alignment` (both
     * multiples of the granularity, alignment a power of two): set *base and
     * *len (multiples of the granularity, *len >= size) and an owner tag
     * (e.g. the file offset of *base). Called without the coarse lock, from
     * any thread, possibly concurrently. NULL: the coarse object cannot
     * grow; alloc answers HM_ERROR_OUT_OF_MEMORY when nothing fits. */
    hm_result_t (*grow)(void *owner, size_t size, size_t alignment, void **base, size_t *len,
                        uint64_t *tag);
    /* Give one region back (e.g. munmap); called by destroy for every
     * region, and for a grown region the coarse object could not record.
     * NULL: nothing to do (the fixed provider's caller buffer). */
    void (*release)(void *owner, void *base, size_t len, uint64_t tag);
} hm_coarse_ops_t;

typedef struct hm_coarse_stats {
    size_t mapped;       /* bytes in all regions */
    size_t allocated;    /* bytes in used blocks */
    size_t free;         /* mapped - allocated */
    size_t largest_free; /* largest free block (0 if none) */
    size_t regions;
    size_t used_blocks;
    size_t free_blocks;
} hm_coarse_stats_t;

/* What hm__coarse_lookup found: the used block holding a range, and its
 * region. */
typedef struct hm_coarse_range {
    void *block_base;
    size_t block_size;
    void *region_base;
    size_t region_size;
    uint64_t region_tag;
} hm_coarse_range_t;

/* granularity: a power of two (the page size of the medium); every size is
 * rounded up to it and every block is aligned to it. ops may be NULL (no
 * grow, no release); it is copied. */
hm_result_t hm__coarse_create(const hm_coarse_ops_t *ops, void *owner, size_t granularity,
                              hm_coarse_t **out);
/* Calls ops.release for every region, frees all metadata. Used blocks still
 * present are forgotten (logged at DEBUG: a provider destroyed with live
 * allocations is the pool's business). */
void hm__coarse_destroy(hm_coarse_t *c);

/* Add a region [base, base+len). base and len must be non-zero multiples of
 * the granularity and must not overlap a region already added
 * (HM_ERROR_INVALID_ARGUMENT otherwise). The whole region is free. */
hm_result_t hm__coarse_add_region(hm_coarse_t *c, void *base, size_t len, uint64_t tag);

/* alignment 0 or below the granularity means the granularity. Returns
 * HM_ERROR_OUT_OF_MEMORY when nothing fits and growing failed or is not
 * possible (a grow failure's own result is returned instead when it is not
 * OUT_OF_MEMORY, e.g. HM_ERROR_DRIVER), HM_ERROR_OUT_OF_HOST_MEMORY when
 * block records cannot be allocated. */
hm_result_t hm__coarse_alloc(hm_coarse_t *c, size_t size, size_t alignment, void **ptr);
/* ptr must be the base of a used block and size round up to its size.
 * A ptr inside a free block: HM_ERROR_DOUBLE_FREE; any other mismatch:
 * HM_ERROR_INVALID_ARGUMENT. Nothing changes on error. Coalesces. */
hm_result_t hm__coarse_free(hm_coarse_t *c, void *ptr, size_t size);
/* Split the used block [ptr, ptr+total) into [ptr, ptr+first) and
 * [ptr+first, ptr+total). first must be a multiple of the granularity and
 * inside the block. */
hm_result_t hm__coarse_split(hm_coarse_t *c, void *ptr, size_t total, size_t first);
/* Merge the used block at lo with the used block at hi that directly
 * follows it in the same region; total rounds up to their summed sizes. */
hm_result_t hm__coarse_merge(hm_coarse_t *c, void *lo, void *hi, size_t total);
/* The used block holding all of [ptr, ptr+size), with its region.
 * HM_ERROR_INVALID_ARGUMENT if the range is not inside one used block. */
hm_result_t hm__coarse_lookup(hm_coarse_t *c, const void *ptr, size_t size,
                              hm_coarse_range_t *out);

void hm__coarse_get_stats(hm_coarse_t *c, hm_coarse_stats_t *stats);

/* ---- for tests ---- */
/* Verify every invariant above; NULL if all hold, else a static message. */
const char *hm__coarse_check(hm_coarse_t *c);
/* Visit every block in address order (regions in address order too), under
 * the lock: fn must not call back into the coarse object. */
void hm__coarse_foreach(hm_coarse_t *c,
                        void (*fn)(void *arg, void *base, size_t size, bool used, uint64_t tag),
                        void *arg);

#endif /* HM_COARSE_H */
