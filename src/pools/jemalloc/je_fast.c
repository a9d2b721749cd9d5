/* hetmem — the jemalloc pool's fast paths, written against jemalloc 5.3.0's
 * internal headers (not its public API).
 * SPDX-License-Identifier: MIT
 *
 * This file is ours (hetmem's); it contains no jemalloc code. It is compiled
 * with jemalloc's own flags against the internal headers of the private
 * jemalloc build and linked into that build's object (cmake/HmJemalloc.cmake),
 * so jemalloc's inline functions expand here. Every jemalloc function and
 * structure it uses is named below with the jemalloc 5.3.0 file it comes
 * from; they are internals, hence the version pin (#error below, and the
 * configure step).
 *
 * Why: the public mallocx()/dallocx() take jemalloc's general path
 * (imalloc_body / ifree, src/jemalloc.c) whenever the flags name an arena or
 * an explicit tcache, which the pool always does, and the pool front-end had
 * to ask the tracker whether a pointer handed to hm_pool_free() is the
 * pool's. Here:
 *
 * - hm__je_fast_alloc() is jemalloc's own malloc fast path
 *   (imalloc_fastpath, jemalloc_internal_inlines_c.h) with the thread's
 *   explicit tcache of the pool instead of its automatic one: size class by
 *   table (sz_size2index_usize_fastpath, sz.h), the thread-event check
 *   (te_malloc_fastpath_ctx, thread_event.h: one branch that also catches a
 *   thread whose jemalloc data is not "nominal", whose threshold is 0), a pop
 *   from the cache bin (cache_bin_alloc_easy / cache_bin_alloc,
 *   cache_bin.h), and the byte counter advanced exactly as jemalloc does
 *   (fastpath_success_finish). Whenever a thread event is due, the bin is
 *   empty or anything is unusual it returns NULL and the pool calls mallocx(),
 *   which runs the event (tcache GC, decay ticks, statistics) and refills the
 *   bin from the pool's arena. So jemalloc's bookkeeping is the same as for
 *   its own malloc().
 * - hm__je_fast_free() first proves that ptr is a live block of the pool's
 *   arena (live_block below), then is jemalloc's free fast path
 *   (free_fastpath, src/jemalloc.c: te_free_fastpath_ctx, cache_bin_dalloc_easy)
 *   on the explicit tcache; anything else is left to dallocx().
 * - live_block() is a non-dependent lookup in jemalloc's global extent map
 *   (rtree_read_independent, rtree.h, on arena_emap_global, the map
 *   ivsalloc() uses): the page must belong to an active extent of the arena
 *   (its descriptor lies in the arena's first metadata block, see
 *   hm__je_fast_key_init, or names the arena); on a slab, ptr must be the
 *   start of one of its regions (for a power-of-two size up to a page, a
 *   multiple of the size; otherwise the region index by jemalloc's
 *   multiply-shift division, div_compute in div.h with
 *   arena_binind_div_info, as arena_slab_regind in arena_inlines_b.h does);
 *   a large block must start at ptr (edata_addr_get: jemalloc's
 *   cache-oblivious offset is part of the extent's address). A pointer of
 *   another jemalloc pool, of malloc(), inside a block or into freed memory
 *   is refused. A block freed twice while it sits in a thread cache is not
 *   detected (jemalloc does not detect it either).
 *
 * Thread data: jemalloc's (tsd_tls, tsd_tls.h) and the pool's per-thread
 * table (tl_table) are both hidden TLS of this module, so each call reaches
 * both through one TLS-descriptor call (the local-dynamic model; no
 * initial-exec TLS, so libhetmem.so stays dlopen()able).
 *
 * Concurrency: everything here touches only the calling thread's tsd, its
 * own tcaches and table, and reads the global extent map and extent
 * metadata, which jemalloc designs for concurrent readers (the non-dependent
 * lookup tolerates extents being changed by other threads: a stale answer
 * can only concern a pointer that is not the caller's live block). */
#include "je_fast.h"

#pragma GCC visibility push(hidden)
#include "jemalloc/internal/jemalloc_preamble.h"
/* jemalloc's thread data in the local-dynamic TLS model (the build leaves the
 * model to the compiler, which picks general-dynamic for an extern
 * variable): tsd_tls and tl_table are then reached from one module base. It
 * is the same variable; only this file's way of reaching it changes. */
#undef JEMALLOC_TLS_MODEL
#define JEMALLOC_TLS_MODEL __attribute__((tls_model("local-dynamic")))
#include "jemalloc/internal/jemalloc_internal_includes.h"
#include "jemalloc/internal/emap.h"
#include "jemalloc/internal/sz.h"
#include "jemalloc/internal/thread_event.h"
#pragma GCC visibility pop

#if JEMALLOC_VERSION_MAJOR != 5 || JEMALLOC_VERSION_MINOR != 3 || JEMALLOC_VERSION_BUGFIX != 0
#error "je_fast.c is written against jemalloc 5.3.0's internals only"
#endif
/* The fast paths assume what the private build configures (no profiling,
 * no debug checks, no use-after-free detection: their special alignments
 * would have to be tested as free_fastpath does). */
#if defined(JEMALLOC_PROF) || defined(JEMALLOC_DEBUG) || defined(JEMALLOC_UAF_DETECTION)
#error "je_fast.c: the private jemalloc must be built without prof, debug and uaf-detection"
#endif

static __thread hm_je_tl_table_t *tl_table JEMALLOC_TLS_MODEL;

__attribute__((visibility("hidden"))) hm_je_tl_table_t **hm__je_fast_tl(void) {
    return &tl_table;
}

/* The thread's tsd, computed once per call: the empty asm makes the compiler
 * keep the pointer instead of re-deriving &tsd_tls (another TLS-descriptor
 * call) at each use. */
JEMALLOC_ALWAYS_INLINE tsd_t *tsd_once(void) {
    tsd_t *tsd = tsd_get(false);
    __asm__("" : "+r"(tsd));
    return tsd;
}

/* The explicit tcache of this thread for the pool, or NULL. */
JEMALLOC_ALWAYS_INLINE tcache_t *tcache_of(const hm_je_key_t *key, hm_je_tl_table_t *t) {
    if (unlikely(t == NULL || key->slot >= t->cap)) return NULL;
    hm_je_tl_entry_t *e = &t->e[key->slot];
    if (unlikely(e->gen != key->gen)) return NULL;
    return e->tcache;
}

__attribute__((visibility("hidden"))) void hm__je_fast_tcache_refresh(hm_je_tl_entry_t *e) {
    e->tcache = NULL;
    if (e->tc == HM_JE_NO_TCACHE) return;
    /* tcaches[] (tcache.c): NULL when destroyed, TCACHES_ELM_NEED_REINIT
     * after tcache.flush, until mallocx/dallocx re-create it. */
    tcache_t *tc = tcaches[e->tc].tcache;
    if ((uintptr_t)tc > (uintptr_t)TCACHES_ELM_NEED_REINIT) e->tcache = tc;
}

/* live_block's answer: NOT_LIVE, or the size class, with LIVE_SLAB set for a
 * block on a slab. */
#define NOT_LIVE (-1)
#define LIVE_SLAB 0x10000

/* The arena's base (base.h: base_t, base_block_t; arena_structs.h:
 * arena_t.base) maps its metadata in blocks that live as long as the arena;
 * every extent descriptor (edata_t) of the arena comes from it (arena_new and
 * pa_shard_init give the arena's edata caches the arena's base; base.c:
 * base_alloc_edata), and only the arena's extents use them. The first block
 * (the oldest, last in the list) holds the arena itself and the first
 * thousands of descriptors: a descriptor inside it proves the arena without
 * reading the descriptor (a cache miss when blocks are freed at random over
 * many slabs). Others are checked by the descriptor's arena index. */
__attribute__((visibility("hidden"))) void hm__je_fast_key_init(hm_je_key_t *key) {
    key->meta_lo = 0;
    key->meta_size = 0;
    arena_t *arena = arena_get(TSDN_NULL, key->arena, false);
    if (arena == NULL || arena->base == NULL) return;
    base_block_t *b = arena->base->blocks;
    if (b == NULL) return;
    while (b->next != NULL) b = b->next;
    key->meta_lo = (uintptr_t)b;
    key->meta_size = b->size;
}

/* See the file comment. */
JEMALLOC_ALWAYS_INLINE int live_block(tsdn_t *tsdn, rtree_ctx_t *rtree_ctx,
                                      const hm_je_key_t *hk, const void *ptr) {
    uintptr_t key = (uintptr_t)ptr;
    /* Blocks are 8-aligned at least; the map covers LG_VADDR bits (higher
     * bits would alias lower addresses). */
    if (unlikely(key == 0 || (key & 7) != 0 || (key >> LG_VADDR) != 0)) return NOT_LIVE;
    rtree_contents_t c;
    if (rtree_read_independent(tsdn, &arena_emap_global.rtree, rtree_ctx, key, &c))
        return NOT_LIVE;
    edata_t *edata = c.edata;
    if (unlikely(edata == NULL || c.metadata.state != extent_state_active)) return NOT_LIVE;
    if (unlikely((uintptr_t)edata - hk->meta_lo >= hk->meta_size) &&
        edata_arena_ind_get(edata) != hk->arena)
        return NOT_LIVE;
    szind_t szind = c.metadata.szind;
    if (likely(c.metadata.slab)) {
        if (unlikely(szind >= SC_NBINS)) return NOT_LIVE;
        const bin_info_t *bi = &bin_infos[szind];
        size_t reg_size = bi->reg_size;
        /* A power of two up to a page: slabs are page-aligned, so the
         * region starts are exactly the multiples of the size. */
        if ((reg_size & (reg_size - 1)) == 0 && reg_size <= PAGE)
            return (key & (reg_size - 1)) == 0 ? ((int)szind | LIVE_SLAB) : NOT_LIVE;
        uintptr_t addr = (uintptr_t)edata_addr_get(edata);
        size_t diff = key - addr; /* key < addr wraps: refused below */
        if (unlikely(diff >= bi->slab_size)) return NOT_LIVE;
        size_t reg = div_compute(&arena_binind_div_info[szind], diff);
        if (unlikely(reg >= bi->nregs || reg * reg_size != diff)) return NOT_LIVE;
        return (int)szind | LIVE_SLAB;
    }
    if (unlikely(key != (uintptr_t)edata_addr_get(edata) || szind >= SC_NSIZES)) return NOT_LIVE;
    return (int)szind;
}

/* A thread whose jemalloc data is not usable (not set up yet, or torn down
 * at thread exit): a lookup cache on the stack, as tsdn_rtree_ctx (tsd.h)
 * does. Out of line: the cache is 400 bytes of stack. */
static JEMALLOC_NOINLINE int live_block_notsd(const hm_je_key_t *hk, const void *ptr) {
    rtree_ctx_t fallback;
    rtree_ctx_data_init(&fallback);
    return live_block(TSDN_NULL, &fallback, hk, ptr);
}

JEMALLOC_ALWAYS_INLINE int live_block_tsd(tsd_t *tsd, const hm_je_key_t *hk, const void *ptr) {
    if (likely(tsd_nominal(tsd)))
        return live_block(tsd_tsdn(tsd), tsd_rtree_ctx(tsd), hk, ptr);
    return live_block_notsd(hk, ptr);
}

__attribute__((visibility("hidden"))) hm_result_t hm__je_fast_alloc(void *state, size_t size,
                                                                     size_t alignment,
                                                                     void **ptr) {
    const hm_je_key_t *key = state;
    /* alignment 0 or 1: natural; size 1..SC_LOOKUP_MAXCLASS in one test. */
    if (likely(alignment <= 1 && size - 1 < SC_LOOKUP_MAXCLASS)) {
        tsd_t *tsd = tsd_once();
        tcache_t *tcache = tcache_of(key, tl_table);
        if (likely(tcache != NULL)) {
            szind_t ind;
            size_t usize;
            sz_size2index_usize_fastpath(size, &ind, &usize);
            uint64_t allocated, threshold;
            te_malloc_fastpath_ctx(tsd, &allocated, &threshold);
            uint64_t allocated_after = allocated + usize;
            /* An event due, or the thread data not "fast": threshold 0. */
            if (likely(allocated_after < threshold)) {
                cache_bin_t *bin = &tcache->bins[ind];
                bool ok;
                void *ret = cache_bin_alloc_easy(bin, &ok);
                if (unlikely(!ok)) ret = cache_bin_alloc(bin, &ok);
                if (likely(ok)) {
                    fastpath_success_finish(tsd, allocated_after, bin, ret);
                    *ptr = ret;
                    return HM_SUCCESS;
                }
            }
        }
    }
    return hm__je_alloc_slow(state, size, alignment, ptr);
}

__attribute__((visibility("hidden"))) hm_result_t hm__je_fast_free(void *state, void *ptr) {
    const hm_je_key_t *key = state;
    tsd_t *tsd = tsd_once();
    hm_je_tl_table_t *t = tl_table;
    int live = live_block_tsd(tsd, key, ptr);
    if (unlikely(live < 0)) return hm__je_refuse(state, ptr, "free");
    if (likely(live & LIVE_SLAB)) {
        szind_t szind = (szind_t)(live & ~LIVE_SLAB);
        tcache_t *tcache = tcache_of(key, t);
        if (likely(tcache != NULL)) {
            uint64_t deallocated, threshold;
            te_free_fastpath_ctx(tsd, &deallocated, &threshold);
            uint64_t deallocated_after = deallocated + sz_index2size(szind);
            if (likely(deallocated_after < threshold) &&
                likely(cache_bin_dalloc_easy(&tcache->bins[szind], ptr))) {
                *tsd_thread_deallocatedp_get(tsd) = deallocated_after;
                return HM_SUCCESS;
            }
        }
    }
    return hm__je_free_slow(state, ptr);
}

__attribute__((visibility("hidden"))) size_t hm__je_fast_check(const hm_je_key_t *key,
                                                                const void *ptr) {
    int live = live_block_tsd(tsd_once(), key, ptr);
    if (live < 0) return 0;
    return sz_index2size((szind_t)(live & ~LIVE_SLAB));
}
