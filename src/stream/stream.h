/* hetmem — the stream cache of a pool (stream-ordered allocation,
 * include/hetmem/stream.h): the hooks pool.c calls. Never installed.
 * SPDX-License-Identifier: MIT
 *
 * Concurrency: one mutex per pool's cache (stream.c), taken for list work
 * and the provider's non-blocking event calls (record, query); never held
 * while an event is waited for or the pool is called. The cache is made at
 * the pool's first stream-ordered call and freed at its destroy.
 *
 *   structure                 guarded by
 *   entries, stream slots,    the cache's lock
 *   pending hash, counters
 *   npending (= the count)    written under the lock, read relaxed without
 *                             it (a free with nothing pending takes no lock)
 *   pool->streams (pointer)   written once (compare-and-swap), then read
 *                             with an acquire load */
#ifndef HM_STREAM_STREAM_H
#define HM_STREAM_STREAM_H

#include "pool_internal.h"

/* hm_pool_destroy, before the pool's fini: waits for every pending block's
 * event, gives the blocks back to the pool and frees the cache. */
void hm__stream_pool_destroy(hm_pool_t *pool);
/* hm_pool_trim: the same, but the cache stays. */
void hm__stream_pool_trim(hm_pool_t *pool);
/* Whether ptr is pending on a stream (a free of it is a double free). */
bool hm__stream_pending(hm_pool_t *pool, const void *ptr);

#endif
