/* hetmem — the jemalloc pool: one jemalloc arena per pool, over any provider.
 * SPDX-License-Identifier: MIT
 *
 * Built only with -DHM_WITH_JEMALLOC=ON (it is not in the umbrella header
 * hetmem/hetmem.h; include this header yourself). The library then carries a
 * private copy of jemalloc 5.3.0, built from source with every symbol renamed
 * (hm_je_ / hm_jei_) and made local to libhetmem: it never replaces or
 * disturbs the process's own malloc (glibc's, or a jemalloc the program links
 * or preloads), and libhetmem.so stays dlopen()-able (jemalloc's thread data
 * uses dynamic TLS; Debian's prebuilt libjemalloc_pic.a uses initial-exec TLS,
 * which glibc cannot give a dlopen()ed library of that size). See
 * cmake/HmJemalloc.cmake for how that copy is obtained and built.
 *
 * Design:
 * - Each pool creates one jemalloc arena whose extent hooks call the pool's
 *   provider through hm_pool_provider_alloc/free/purge, so that the tracker
 *   records every range jemalloc's extents live in (hm_pool_by_ptr and
 *   hm_free work for every pointer, also while jemalloc splits or merges).
 * - Thread caches: each thread gets its own explicit jemalloc tcache per pool,
 *   created on its first call on the pool, destroyed when the thread exits or
 *   the pool is destroyed; a pool's memory never mixes with another's. Past
 *   jemalloc's limit of 4093 explicit tcaches per process, further
 *   (thread, pool) pairs run without a cache (correct, slower).
 * - Arenas: jemalloc allows 4095 per process (including its own one or two);
 *   destroyed pools give their arena index back for reuse. At the limit,
 *   creation fails with HM_ERROR_LIMIT.
 *
 * Memory the CPU cannot touch (device memory, PROT_NONE): supported. The
 * arena is created with metadata_use_hooks = false (jemalloc 5.3's
 * experimental.arenas_create_ext), so all of jemalloc's metadata (the arena,
 * extent and slab descriptors with their free bitmaps, tcache stacks) lives in
 * host memory jemalloc maps itself; the private build has no junk/zero fill
 * (--disable-fill) and jemalloc never keeps free lists inside free blocks.
 * On memory that is not CPU-accessible the pool never asks jemalloc for
 * zeroed memory (calloc: HM_ERROR_NOT_SUPPORTED) nor lets it copy (realloc
 * resizes in place or fails with HM_ERROR_NOT_SUPPORTED, leaving the block as
 * it was); the extent alloc hook refuses a request for zeroed device memory.
 *
 * Addresses: the private jemalloc is built for 48-bit addresses (its extent
 * map ignores higher bits). The extent alloc hook gives provider memory that
 * reaches 2^48 back to the provider and fails, so the request fails with
 * HM_ERROR_NOT_SUPPORTED (ENOTSUP), logged once per pool.
 *
 * Providers: any. The alloc hook takes ranges from the provider exactly as
 * jemalloc asks for them (no "retain": see cmake/HmJemalloc.cmake); jemalloc
 * splits and coalesces its extents inside a range without the provider (a
 * merge never crosses the start of a range), so the provider needs no
 * split/merge and the tracker keeps one record per range, valid for every
 * byte of it. A range goes back to the provider when jemalloc frees it whole:
 * after its decay time (dirty pages are purged lazily after 10 s, then freed;
 * hm_jemalloc_params_set_decay_ms) or at hm_pool_trim(); a piece of a range is
 * purged instead (where the provider can purge, on whole provider pages) and
 * reused; everything goes back at hm_pool_destroy(). A provider that cannot
 * free keeps its memory with the pool until then (reused meanwhile). After a
 * successful forced purge the provider's memory must read as zero
 * (MADV_DONTNEED / hole punch semantics), as jemalloc assumes.
 *
 * Provider pages: jemalloc asks the hook for each large block's extent (from
 * 16 KiB) and for slabs of small blocks, at its own sizes; a provider rounds
 * each request up to its min_page_size. Large blocks start page-aligned
 * (the private build has no cache-oblivious padding), so a block of a
 * multiple of the provider's page costs nothing more: 8 MiB blocks fill a
 * CUDA device's 2 MiB pages exactly. Over such a provider a large block that
 * is not a multiple of 2 MiB takes its size rounded up to one (a 32 KiB
 * block: a 2 MiB range; measured in test_cuda_scenarios): for many blocks
 * under 2 MiB on device memory, use the native pool, which carves them from
 * slabs. Out of memory: the pool gives back the extents it caches
 * (hm_pool_trim) and asks jemalloc once more before failing.
 *
 * Fast paths: small allocations and frees (up to 4 KiB) go straight to the
 * thread's tcache of the pool through the pool's own code written against
 * jemalloc 5.3.0's internals (src/pools/jemalloc/je_fast.c), without
 * jemalloc's per-thread event counters (their events act on jemalloc's
 * automatic thread cache, which the pool never uses; je_fast.c says why this
 * is safe); everything else goes through mallocx/dallocx. A thread finds its tcache of the pool
 * by its thread pointer, without a TLS access: the pool's first thread (the
 * first to take the line while it is free) with one comparison, others
 * through a small table in the pool keyed by the thread pointer (a thread
 * whose entry another live thread holds uses a per-thread table instead). The check of a freed pointer is made from the one
 * extent-map word jemalloc's own free reads, and for small classes other
 * than powers of two up to 4 KiB from the slab's start in its descriptor.
 *
 * Errors: the pool validates every pointer given to free, realloc and
 * usable_size against jemalloc's own extent map (the pool sets
 * HM_POOL_OPS_VALIDATES_POINTERS, so the front-end skips the tracker, also
 * for pools made with HM_POOL_FLAG_NO_TRACKING): a pointer that is not the
 * start of a live block of this pool's arena — foreign memory, another
 * pool's block, an interior or misaligned pointer, a freed large block — is
 * refused with HM_ERROR_INVALID_ARGUMENT (realloc: NULL and EINVAL;
 * usable_size: 0) and one log line. Not detected, as in jemalloc: a small
 * block freed twice, or a region start of a slab that is free or sits in a
 * thread cache (it is indistinguishable from a live block).
 * hm_pool_trim() purges the arena and flushes the calling thread's cache of
 * the pool (other threads' caches are theirs to use; they are flushed at
 * thread exit and pool destroy).
 *
 * Statistics (hm_pool_get_stats): bytes_requested is jemalloc's count of
 * the arena's allocated bytes (usable sizes) less the bytes in the pool's
 * thread caches, each thread's cache read as it is (no counter on the
 * alloc/free paths); bytes_from_provider and provider_allocs are the
 * provider ranges the arena holds; slabs is jemalloc's count of the arena's
 * slabs. remote_frees_* stay 0: a block freed by another thread goes into
 * that thread's cache, as any free does. Exact while no thread is inside a
 * call on the pool.
 *
 * Concurrency contract (per pool):
 *
 * | operation                  | runs concurrently with       | synchronisation             |
 * |----------------------------|------------------------------|-----------------------------|
 * | alloc, free, realloc,      | every call but destroy       | the thread's own tcache (no |
 * |   usable_size              |                              | lock); jemalloc's bin/extent|
 * |                            |                              | locks on cache misses       |
 * | first call of a thread     | every call but destroy       | global mutex (tcache list)  |
 * | thread exit                | everything                   | global mutex                |
 * | trim, get_stats (O(pools): | every call but destroy       | jemalloc's ctl lock; global |
 * |   jemalloc's epoch refresh)|                              | mutex (the pool's tcaches)  |
 * | destroy                    | nothing on the same pool     | caller; global mutex        |
 * Fork: the child may keep using inherited pools (jemalloc's and this pool's
 * locks are taken around fork; the parent's other threads' entries in the
 * thread-pointer tables are forgotten in the child). */
#ifndef HETMEM_POOLS_JEMALLOC_H
#define HETMEM_POOLS_JEMALLOC_H

#include <hetmem/pool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_jemalloc_params hm_jemalloc_params_t;

HM_API const hm_pool_ops_t *hm_jemalloc_pool_ops(void);

/* Params object: create, set, pass to hm_pool_create() (it is copied),
 * destroy. NULL params means all defaults. */
HM_API hm_result_t hm_jemalloc_params_create(hm_jemalloc_params_t **params);
HM_API hm_result_t hm_jemalloc_params_destroy(hm_jemalloc_params_t *params);
/* Per-thread caches (default true). false: every call takes the arena's
 * locks, as UMF's jemalloc pool does (MALLOCX_TCACHE_NONE). */
HM_API hm_result_t hm_jemalloc_params_set_tcache(hm_jemalloc_params_t *params, bool enable);
/* jemalloc's decay times in milliseconds for the pool's arena: how long
 * freed dirty pages stay before a lazy purge, and muzzy pages before they
 * go back to the provider. -1: never; 0: at once. Defaults: jemalloc's
 * (10000 and 0). Range -1 .. 3600000 (one hour). */
HM_API hm_result_t hm_jemalloc_params_set_decay_ms(hm_jemalloc_params_t *params, long dirty_ms,
                                                   long muzzy_ms);

/* Convenience: hm_pool_create(hm_jemalloc_pool_ops(), provider, params,
 * flags, pool). */
HM_API hm_result_t hm_jemalloc_pool_create(hm_provider_t *provider,
                                           const hm_jemalloc_params_t *params, uint32_t flags,
                                           hm_pool_t **pool);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_POOLS_JEMALLOC_H */
