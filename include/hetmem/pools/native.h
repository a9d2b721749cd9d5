/* hetmem — the native pool: hetmem's own allocator, over any provider.
 * SPDX-License-Identifier: MIT
 *
 * Size classes carved out of slabs, per-thread heaps, remote frees batched
 * through wait-free queues, and large allocations straight from the provider.
 * All of the pool's metadata (slab descriptors, free bitmaps, queues, remote
 * free batches) lives in host memory apart from the managed memory: the pool
 * never reads or writes the memory it hands out, so it works on device memory
 * that the CPU must not touch (providers without HM_PROVIDER_CAP_CPU_ACCESS).
 * (Over host memory the CPU may touch, a free may issue a prefetch of the
 * freed block, the next one of its class to be handed out: a hint that
 * neither reads, writes nor faults.)
 *
 * Tiers, by request size (after alignment):
 *   small  size <= size_class_limit: blocks of a size class carved out of a
 *          slab (8, 16..256 by 16, then 8 classes per power of two: at most
 *          12.5% internal fragmentation above 128 B; in (64, 128] the 16-byte
 *          alignment floor makes the classes 16 B apart, at most 18.75%).
 *   large  size_class_limit < size <= large_threshold: one provider
 *          allocation rounded up to the same class scale and to the provider
 *          page; freed ranges go to a bounded cache and are reused by a later
 *          allocation of the same rounded size.
 *   huge   size > large_threshold: one provider allocation, freed at once.
 * When the provider cannot give a whole slab (bounded capacity), a small
 * request is served as a large one (page-granular) instead.
 *
 * Addresses: the pool's page map covers addresses below 2^48. Provider
 * memory that reaches 2^48 (a caller's buffer there, on a kernel with 5-level
 * page tables) is given back to the provider and the request fails with
 * HM_ERROR_NOT_SUPPORTED (ENOTSUP) and one error log line, whatever its size.
 *
 * Giving memory back: a slab whose blocks are all free is returned to the
 * pool; the pool keeps up to retained_bytes of such slabs and cached large
 * ranges, and frees the rest to the provider. hm_pool_trim() frees all it can:
 * retained slabs, the large cache, the calling thread's empty slabs and those
 * of heaps whose thread exited; where the provider cannot free it purges them
 * instead (where the provider can purge). A provider that cannot free
 * (no HM_PROVIDER_CAP_FREE) is never asked to: its memory is kept and reused.
 *
 * Concurrency contract (per pool; "heap" = the pool's state for one thread):
 *
 * | operation                    | runs concurrently with        | synchronisation            |
 * |------------------------------|-------------------------------|----------------------------|
 * | alloc, free of own block     | every other call but destroy  | none: thread-local heap, no|
 * |   (fast path)                |                               | lock, no atomic RMW        |
 * | free of another heap's block | everything but destroy        | batched per owner heap on  |
 * |   (remote free)              |                               | the freeing side (one entry|
 * |                              |                               | per bitmap word); one      |
 * |                              |                               | wait-free enqueue (xchg)   |
 * |                              |                               | per batch of up to 126     |
 * | owner drains its queue       | enqueues by any thread        | nonblocking splice+dequeue;|
 * |   (alloc slow path)          |                               | owner only                 |
 * | new/empty slab, large alloc  | everything but destroy        | pool mutex / large mutex   |
 * | thread exit (heap abandoned) | everything but destroy        | global mutex, pool mutex   |
 * | trim, get_stats              | everything but destroy        | pool mutex                 |
 * | destroy                      | nothing on the same pool      | caller                     |
 *
 * Ordering: a remote free publishes its batch with a release (the queue's
 * exchange); the owner reads the batch after an acquire, so everything the
 * freeing thread wrote to the block happens before the block's next owner
 * gets it. Remote frees are delayed at most until the freeing thread's batch
 * for that heap fills, the thread frees 1024 more blocks or 1 MiB more
 * remotely, reaches an allocation slow path, calls hm_pool_trim(), or exits:
 * a thread that stops calling the pool holds at most that much of other
 * heaps' memory.
 *
 * Thread exit: the thread's heap in each pool is abandoned and later adopted
 * by a thread that starts using the pool; blocks freed into an abandoned heap
 * still land in its queue. A thread's calls made after its heap destructor
 * ran (other TLS destructors) go through a mutex-protected heap of the pool.
 *
 * Errors: freeing a pointer that is not the start of a live block of this
 * pool returns HM_ERROR_INVALID_ARGUMENT; a double free that the pool sees
 * returns HM_ERROR_DOUBLE_FREE (a remote double free is found at once when
 * both frees fall in one batch entry, else when the owner drains it, and is
 * logged). Both log one line.
 *
 * Statistics: bytes_requested counts blocks in a heap's per-class word of
 * free blocks as free, so it is exact whenever no thread is inside a call
 * (and approximate while one is).
 *
 * What the checks cost: every free is validated against host metadata
 * (a pointer of the pool, the start of a block, not free already), never
 * against the block itself. Allocators that keep their free lists in the
 * blocks (tcmalloc, mimalloc) do none of that, and on random frees of small
 * blocks, where the checks are most of the work, they are faster; where
 * threads free each other's blocks the native pool is faster than any of
 * them. bench/bench_native measures each mix (figures: docs/performance.md,
 * not this header). */
#ifndef HETMEM_POOLS_NATIVE_H
#define HETMEM_POOLS_NATIVE_H

#include <hetmem/pool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_native_params hm_native_params_t;

/* How a remote free reaches the owning heap (for benchmarks: the mutex list
 * shows what the wait-free queue buys). */
typedef enum hm_native_remote_queue {
    HM_NATIVE_QUEUE_WFCQ = 0,  /* liburcu wait-free concurrent queue (default) */
    HM_NATIVE_QUEUE_MUTEX = 1, /* a mutex-protected list per heap */
} hm_native_remote_queue_t;

/* Which defaults a params object starts from. AUTO (what
 * hm_native_params_create gives, and what a NULL params means) picks DEVICE
 * for a provider of device memory or without CPU access, HOST otherwise. */
typedef enum hm_native_defaults {
    HM_NATIVE_DEFAULTS_AUTO = 0,
    /* slab 64 KiB, size-class limit 32 KiB, large threshold 32 MiB,
     * retained 8 MiB */
    HM_NATIVE_DEFAULTS_HOST = 1,
    /* slab: the provider's recommended page size (its mapping granularity,
     * e.g. 2 MiB for GPUs), at least 64 KiB; size-class limit slab/8, at
     * least 32 KiB; large threshold 256 MiB, retained 64 MiB */
    HM_NATIVE_DEFAULTS_DEVICE = 2,
} hm_native_defaults_t;

HM_API const hm_pool_ops_t *hm_native_pool_ops(void);

/* Params object: create, set, pass to hm_pool_create() (it is copied),
 * destroy. Every value not set takes the default; the default slab size is
 * raised to the provider's page size (a slab size set explicitly below it is
 * refused at pool creation). */
HM_API hm_result_t hm_native_params_create(hm_native_params_t **params);
HM_API hm_result_t hm_native_params_destroy(hm_native_params_t *params);
HM_API hm_result_t hm_native_params_set_defaults(hm_native_params_t *params,
                                                 hm_native_defaults_t defaults);
/* Power of two, 4 KiB .. 64 MiB. Slabs are aligned to it. */
HM_API hm_result_t hm_native_params_set_slab_size(hm_native_params_t *params, size_t size);
/* Largest size served from slabs: 64 B .. 1 MiB. */
HM_API hm_result_t hm_native_params_set_size_class_limit(hm_native_params_t *params,
                                                         size_t size);
/* Largest freed range kept in the large cache (>= the size-class limit);
 * SIZE_MAX: every large range is cached. */
HM_API hm_result_t hm_native_params_set_large_threshold(hm_native_params_t *params,
                                                        size_t size);
/* Bytes of empty slabs and cached large ranges kept for reuse (0: keep
 * nothing; SIZE_MAX: unbounded). */
HM_API hm_result_t hm_native_params_set_retained_bytes(hm_native_params_t *params,
                                                       size_t bytes);
HM_API hm_result_t hm_native_params_set_remote_queue(hm_native_params_t *params,
                                                     hm_native_remote_queue_t queue);
/* Remote frees per published batch, 1 .. 126 (default 126). 1 publishes
 * every free on its own (for benchmarks). */
HM_API hm_result_t hm_native_params_set_remote_batch(hm_native_params_t *params,
                                                     unsigned count);

/* Convenience: hm_pool_create(hm_native_pool_ops(), provider, params, flags,
 * pool); params may be NULL for the defaults. */
HM_API hm_result_t hm_native_pool_create(hm_provider_t *provider,
                                         const hm_native_params_t *params, uint32_t flags,
                                         hm_pool_t **pool);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_POOLS_NATIVE_H */
