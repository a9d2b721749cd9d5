/* hetmem — stream-ordered allocation: memory allocated and freed on the
 * streams that use it. SPDX-License-Identifier: MIT
 *
 * A stream is the driver's own handle, passed through as given: CUDA a
 * CUstream (NULL: the legacy default stream), Level Zero an immediate
 * command list (ze_command_list_handle_t) of the provider's context. The
 * calls work over every pool whose provider has stream ops
 * (HM_PROVIDER_CAP_STREAMS: the CUDA and Level Zero providers, or a
 * provider of one's own): the front end keeps the blocks freed on streams
 * and gives them to the pool (hm_pool_free) once they are safe.
 *
 * Ordering rules
 *  - hm_pool_free_async(pool, p, s): p's bytes may still be in use by work
 *    queued on s before the call; p stays with the pool's stream cache. The
 *    free makes no driver call: when another stream wants s's blocks (or
 *    the cache gives them back), one event is recorded on s, which covers
 *    every block freed on s until then.
 *  - hm_pool_malloc_async(pool, n, s): a block for work queued on s after
 *    the call. It is, in order of preference: a block freed on s (at once:
 *    the work that used it runs before the work that will, in stream
 *    order), a block freed on another stream whose event has completed
 *    (queried, never waited for), a fresh block of the pool. A block freed
 *    on stream A is never handed to stream B before an event recorded on A
 *    after its free has completed:
 *    no dependency between streams is made (as PyTorch's caching
 *    allocator; CUDA's pools may instead make B wait, which can serialise
 *    streams). The host must not touch the block before work on s has
 *    made it ready (as with cuMemAllocAsync).
 *  - Threshold (hm_pool_set_release_threshold): the bytes of freed blocks
 *    the cache keeps. Above it, each stream-ordered call gives back blocks
 *    whose events have completed, oldest first. Default SIZE_MAX (keep
 *    them all, as RMM sets CUDA's CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
 *    hm_pool_trim waits for every event and gives back everything.
 *  - Out of memory: when the pool cannot serve an allocation, the cache
 *    waits for the events of its blocks, gives them back and tries once
 *    more.
 *
 * Mixed use (decided):
 *  - A block from hm_pool_malloc may be freed with hm_pool_free_async, and
 *    one from hm_pool_malloc_async with hm_pool_free (on the host's
 *    timeline: the program synchronises first).
 *  - hm_pool_free, hm_free or a second hm_pool_free_async of a block that
 *    is pending on a stream: HM_ERROR_DOUBLE_FREE, nothing freed.
 *  - A stream about to be destroyed: call hm_pool_stream_forget(pool, s)
 *    first. Its blocks then wait for their events like any other stream's
 *    (a new stream may get the destroyed one's handle value, and must not
 *    reuse its blocks by stream order).
 *  - hm_pool_destroy with blocks pending: waits for their events, then
 *    gives them back (the destroy blocks until the streams' work is done).
 *  - Fork: a child's pools over GPU providers refuse allocations (pool.h);
 *    the stream cache of a child forgets the parent's blocks.
 *
 * Thread safety: every call is thread-safe; one lock per pool's stream
 * cache (held for list work and event queries, never while waiting for an
 * event or calling the pool). */
#ifndef HETMEM_STREAM_H
#define HETMEM_STREAM_H

#include <hetmem/pool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* size > 0. NULL and errno on failure: EINVAL (NULL pool, size 0), ENOTSUP
 * (the provider has no streams), ENOMEM, or what hm_pool_malloc sets. */
HM_API void *hm_pool_malloc_async(hm_pool_t *pool, size_t size, void *stream);
/* ptr NULL: a no-op success. HM_ERROR_INVALID_ARGUMENT: not a live block
 * of pool; HM_ERROR_DOUBLE_FREE: already pending on a stream;
 * HM_ERROR_NOT_SUPPORTED: no streams; HM_ERROR_OUT_OF_HOST_MEMORY (the
 * block is still the caller's). A stream on which no event can be recorded
 * later keeps its blocks to itself (logged); they go back to the pool at
 * trim or destroy without a wait. */
HM_API hm_result_t hm_pool_free_async(hm_pool_t *pool, void *ptr, void *stream);
/* Bytes of freed blocks the stream cache keeps (SIZE_MAX: all). */
HM_API hm_result_t hm_pool_set_release_threshold(hm_pool_t *pool, size_t bytes);
/* The stream's blocks no longer go back to it by stream order (call before
 * destroying the stream: an event is recorded on it now, which its blocks
 * then wait for). Unknown streams: a no-op success. */
HM_API hm_result_t hm_pool_stream_forget(hm_pool_t *pool, void *stream);

typedef struct hm_stream_stats {
    size_t cached_bytes;    /* freed on streams, kept by the cache */
    size_t cached_blocks;
    size_t threshold;       /* the release threshold */
    uint64_t same_stream;   /* allocations served by a block freed on their stream */
    uint64_t other_stream;  /* ... by a block of another stream, its event completed */
    uint64_t from_pool;     /* ... by the pool */
    uint64_t released;      /* blocks given back to the pool */
    uint64_t waits;         /* events waited for (trim, out of memory, destroy) */
    uint64_t events;        /* events recorded (one per cross-stream demand on a stream) */
} hm_stream_stats_t;
HM_API hm_result_t hm_pool_get_stream_stats(hm_pool_t *pool, hm_stream_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
