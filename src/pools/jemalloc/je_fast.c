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
 *   table (sz_size2index_usize_fastpath, sz.h), a pop from the cache bin
 *   (cache_bin_alloc_easy / cache_bin_alloc, cache_bin.h) and the bin's
 *   request count (fastpath_success_finish). When the bin is empty or
 *   anything is unusual the pool calls mallocx(), which refills the bin from
 *   the pool's arena.
 * - hm__je_fast_free() first proves that ptr is a live block of the pool's
 *   arena (live_block below), then is jemalloc's free fast path
 *   (free_fastpath, src/jemalloc.c: cache_bin_dalloc_easy) on the explicit
 *   tcache; anything else is left to dallocx().
 * - Neither makes jemalloc's thread-event check (te_malloc_fastpath_ctx /
 *   te_free_fastpath_ctx, thread_event.h) nor advances the thread's byte
 *   counters: in jemalloc 5.3.0 every thread event acts on the thread's
 *   automatic tcache (tcache_gc_event_handler -> tcache_event ->
 *   tcache_get(tsd), tcache.c), which the pool never uses, or is a statistic
 *   of the thread (thread.allocated, thread.peak) or disabled (prof, stats
 *   interval); explicit tcaches are never garbage-collected by events, and
 *   arena decay ticks come from the arena paths (arena_decay_tick), not from
 *   thread events. With the check, a free of 4 KiB blocks went to dallocx()
 *   every 16 calls (the 64 KiB GC interval) for nothing. mallocx()/dallocx()
 *   on the slow paths keep jemalloc's own bookkeeping.
 * - live_block() is a non-dependent lookup in jemalloc's global extent map
 *   (rtree_leaf_elm_lookup, rtree.h, on arena_emap_global, the map
 *   ivsalloc() uses), of one word per page: the extent descriptor's address,
 *   size class, slab bit and extent state (rtree_leaf_elm_bits_encode). The
 *   page must belong to an active extent of the arena (its descriptor lies in
 *   the arena's first metadata block, see hm__je_fast_key_init, or names the
 *   arena); on a slab, ptr must be the start of one of its regions (a
 *   multiple of the power-of-two part of the size, and for other than powers
 *   of two up to a page the region index by jemalloc's multiply-shift
 *   division, div_compute in div.h with arena_binind_div_info, as
 *   arena_slab_regind in arena_inlines_b.h does); a large block must start at
 *   ptr (edata_addr_get: jemalloc's cache-oblivious offset is part of the
 *   extent's address). A pointer of another jemalloc pool, of malloc(),
 *   inside a block or into freed memory is refused. A block freed twice
 *   while it sits in a thread cache is not detected (jemalloc does not
 *   detect it either). The free fast path makes the slab case inline from
 *   the word alone (the descriptor is read only for sizes that need the
 *   division, or when it is outside the first metadata block) and hands
 *   everything else to the whole check (free_checked).
 *
 * Thread data: the pool's table by thread pointer (hm_je_key_t.by_tp,
 * je_fast.h) gives the fast paths the thread's tcache and jemalloc's thread
 * data (tsd) with no TLS access. A thread that does not hold its slot goes
 * through jemalloc's thread data (tsd_tls, tsd_tls.h) and the pool's
 * per-thread table (tl_table), both hidden TLS of this module, reached
 * through one TLS-descriptor call (the local-dynamic model; no initial-exec
 * TLS, so libhetmem.so stays dlopen()able).
 *
 * Concurrency: everything here touches only the calling thread's tsd, its
 * own tcaches, table and by_tp entry (whose protocol je_fast.h states), and
 * reads the global extent map and extent
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

__attribute__((visibility("hidden"))) void hm__je_fast_tcache_refresh(hm_je_key_t *key,
                                                                       hm_je_tl_entry_t *e) {
    e->tcache = NULL;
    if (e->tc != HM_JE_NO_TCACHE) {
        /* tcaches[] (tcache.c): NULL when destroyed, TCACHES_ELM_NEED_REINIT
         * after tcache.flush, until mallocx/dallocx re-create it. */
        tcache_t *tc = tcaches[e->tc].tcache;
        if ((uintptr_t)tc > (uintptr_t)TCACHES_ELM_NEED_REINIT) e->tcache = tc;
    }
    hm_je_tp_entry_t *b = hm_je_by_tp_mine(key);
    if (b != NULL) {
        b->tsd = tsd_get(false);
        b->tcache = e->tcache;
    }
}

/* live_block's answer: NOT_LIVE, or the size class, with LIVE_SLAB set for a
 * block on a slab. */
#define NOT_LIVE (-1)
#define LIVE_SLAB 0x10000

#ifndef RTREE_LEAF_COMPACT
#error "je_fast.c reads jemalloc's extent map as one word per page (RTREE_LEAF_COMPACT)"
#endif

/* Per small size class, what telling a region start needs (filled once from
 * jemalloc's bin_infos and arena_binind_div_info, which are fixed after
 * jemalloc boots):
 * - low: the low bits every region start has clear. A slab starts on a page,
 *   so a region start is a multiple of the largest power of two dividing the
 *   region size, capped at a page.
 * - fast: `low` where that already proves a region start (a power of two up
 *   to a page), else all ones (never passes: see region_start).
 * - magic: jemalloc's reciprocal of the region size (div_info_t.magic, div.h:
 *   n / size == (n * magic) >> 32 for every multiple n of size below 2^32),
 *   with nregs and size to check the quotient. */
typedef struct cls_info {
    uintptr_t sel;  /* ~0: the check needs the slab's start; 0: key's page */
    uintptr_t zero; /* where sel is 0, &g_zero_word; else 0 */
    uintptr_t page; /* where sel is 0, ~PAGE_MASK; else 0 */
    uint64_t dmul;  /* ceil(2^64 / size): see region_start_nb */
    uint32_t bound; /* offsets from the start that region_start_nb accepts are below */
    uint32_t fast, size, magic;
    uint16_t nregs, low;
    uint32_t unused[3];
} cls_info_t;
_Static_assert(sizeof(cls_info_t) == 64, "one 64-byte entry per class");
_Static_assert(PAGE - 1 <= UINT16_MAX && (PAGE >> SC_LG_TINY_MIN) <= UINT16_MAX,
               "cls_info_t.low, nregs");

/* Never written: what region_start_nb reads instead of a slab's start. */
static uintptr_t g_zero_word;

static cls_info_t g_cls[SC_NBINS] __attribute__((aligned(64)));

static bool g_cls_ready; /* set under the pool registry's lock (see je_fast.h) */

static void cls_init(void) {
    for (szind_t i = 0; i < SC_NBINS; i++) {
        size_t size = bin_infos[i].reg_size;
        size_t low = size & (0 - size); /* the largest power of two dividing size */
        cls_info_t *c = &g_cls[i];
        c->low = (uint16_t)((low < PAGE ? low : PAGE) - 1);
        c->fast = (low == size && size <= PAGE) ? c->low : UINT32_MAX;
        c->sel = c->fast == UINT32_MAX ? ~(uintptr_t)0 : 0;
        c->zero = c->sel ? 0 : (uintptr_t)&g_zero_word;
        c->page = c->sel ? 0 : ~(uintptr_t)PAGE_MASK;
        c->dmul = UINT64_MAX / size + 1; /* ceil(2^64 / size), size >= 8 */
        /* the regions proper (a slab may end in a few unused bytes) */
        c->bound = c->sel ? (uint32_t)(bin_infos[i].nregs * size) : (uint32_t)PAGE;
        c->magic = arena_binind_div_info[i].magic;
        c->nregs = (uint16_t)bin_infos[i].nregs;
        c->size = (uint32_t)size;
    }
}

/* The arena's base (base.h: base_t, base_block_t; arena_structs.h:
 * arena_t.base) maps its metadata in blocks that live as long as the arena;
 * every extent descriptor (edata_t) of the arena comes from it (arena_new and
 * pa_shard_init give the arena's edata caches the arena's base; base.c:
 * base_alloc_edata), and only the arena's extents use them. The first block
 * (the oldest, last in the list) holds the arena itself and the first
 * thousands of descriptors: a descriptor inside it proves the arena without
 * reading the descriptor (a cache miss when blocks are freed at random over
 * many slabs). Others are checked by the descriptor's arena index. The key
 * keeps the block's bounds shifted as the extent-map word keeps a
 * descriptor's address (see leaf_meta_ok). */
__attribute__((visibility("hidden"))) void hm__je_fast_key_init(hm_je_key_t *key) {
    if (!g_cls_ready) {
        cls_init();
        g_cls_ready = true;
    }
    key->meta_lo_sh = 0;
    key->meta_size_sh = 0;
    arena_t *arena = arena_get(TSDN_NULL, key->arena, false);
    if (arena == NULL || arena->base == NULL) return;
    base_block_t *b = arena->base->blocks;
    if (b == NULL) return;
    while (b->next != NULL) b = b->next;
    key->meta_lo_sh = (uintptr_t)b << RTREE_NHIB;
    key->meta_size_sh = (uintptr_t)b->size << RTREE_NHIB;
}

/* An extent-map word (rtree_leaf_elm_bits_encode, rtree.h: the descriptor's
 * address in the low LG_VADDR bits, 128-aligned, with slab, is_head and state
 * in its low 7 bits, the size class above): is its descriptor in the arena's
 * first metadata block? Shifted left by RTREE_NHIB, the word is the
 * descriptor's address times 2^16 plus the flags times 2^16, so with the
 * block's bounds shifted the same way one subtraction and one comparison
 * answer (the flags are below the 128-byte granularity of both). */
JEMALLOC_ALWAYS_INLINE bool leaf_meta_ok(const hm_je_key_t *hk, uintptr_t bits) {
    return (bits << RTREE_NHIB) - hk->meta_lo_sh < hk->meta_size_sh;
}

/* The descriptor of an extent-map word (rtree_leaf_elm_bits_decode). */
JEMALLOC_ALWAYS_INLINE edata_t *leaf_edata(uintptr_t bits) {
    return rtree_leaf_elm_bits_decode(bits).edata;
}

/* Does the descriptor of this word belong to the pool's arena? */
JEMALLOC_ALWAYS_INLINE bool leaf_arena_ok(const hm_je_key_t *hk, uintptr_t bits) {
    return leaf_meta_ok(hk, bits) || edata_arena_ind_get(leaf_edata(bits)) == hk->arena;
}

/* The word is an active slab's (state extent_state_active, which is 0, and
 * the slab bit). jemalloc writes a slab's descriptor and flags in one word,
 * so the descriptor is not NULL then. */
#define LEAF_ACTIVE_SLAB(bits) (((bits) & (RTREE_LEAF_STATE_MASK | 1)) == 1)

/* The region index by jemalloc's multiply-shift division, as
 * arena_slab_regind (arena_inlines_b.h) computes it. diff >= 2^32 (only from
 * a word read while another thread changed the extent) gives an index whose
 * multiple is below 2^32, so it is refused too. */
JEMALLOC_ALWAYS_INLINE bool region_start_div(uintptr_t key, uintptr_t bits,
                                             const cls_info_t *c) {
    if ((key & c->low) != 0) return false;
    size_t diff = key - (uintptr_t)edata_addr_get(leaf_edata(bits));
    size_t reg = (size_t)(((uint64_t)diff * c->magic) >> 32);
    return reg < c->nregs && reg * c->size == diff;
}

/* On an active slab of size class szind (< SC_NBINS for a slab), is key the
 * start of a region? One test for powers of two up to a page (their `fast`
 * mask); the others fail it and take the division. */
JEMALLOC_ALWAYS_INLINE bool region_start(uintptr_t key, uintptr_t bits, const cls_info_t *c) {
    if (likely((key & c->fast) == 0)) return true;
    return region_start_div(key, bits, c);
}

/* region_start without a branch that depends on the size class (a free of
 * a random mix of classes would mispredict it about every other time): one
 * test for every class, from the slab's start for classes that need it (read
 * from the descriptor) and from key's page for powers of two up to a page
 * (whose regions tile every page of their slabs; the descriptor is not read,
 * the address to read chosen by the class's masks). The offset is a multiple
 * of the size iff offset * ceil(2^64 / size) mod 2^64 < ceil(2^64 / size), for
 * offsets below 2^32 (Lemire, Kaser, Kurz, "Faster remainder by direct
 * computation", Software: Practice and Experience 49(6), 2019, the
 * divisibility test); the bound (the slab's regions, or the page) keeps it there
 * and the region inside the slab. */
JEMALLOC_ALWAYS_INLINE bool region_start_nb(uintptr_t key, uintptr_t bits, const cls_info_t *c) {
    uintptr_t src = ((uintptr_t)&leaf_edata(bits)->e_addr & c->sel) | c->zero;
    uintptr_t base = *(const uintptr_t *)src | (key & c->page);
    uint64_t diff = key - base;
    return (diff * c->dmul < c->dmul) & (diff < c->bound);
}

/* The extent-map word of key's page, through the thread's lookup cache (the
 * direct-mapped first level inline: rtree_leaf_elm_lookup, rtree.h);
 * false if the page is not in the map. */
static JEMALLOC_NOINLINE bool leaf_read_slow(tsdn_t *tsdn, rtree_ctx_t *ctx, uintptr_t key,
                                             uintptr_t *bits) {
    rtree_leaf_elm_t *elm = rtree_leaf_elm_lookup(tsdn, &arena_emap_global.rtree, ctx, key,
                                                  /* dependent */ false,
                                                  /* init_missing */ false);
    if (elm == NULL) return false;
    *bits = rtree_leaf_elm_bits_read(tsdn, &arena_emap_global.rtree, elm, false);
    return true;
}

JEMALLOC_ALWAYS_INLINE bool leaf_read(tsdn_t *tsdn, rtree_ctx_t *ctx, uintptr_t key,
                                      uintptr_t *bits) {
    size_t slot = rtree_cache_direct_map(key);
    if (likely(ctx->cache[slot].leafkey == rtree_leafkey(key))) {
        rtree_leaf_elm_t *elm = &ctx->cache[slot].leaf[rtree_subkey(key, RTREE_HEIGHT - 1)];
        *bits = rtree_leaf_elm_bits_read(tsdn, &arena_emap_global.rtree, elm, false);
        return true;
    }
    return leaf_read_slow(tsdn, ctx, key, bits);
}

/* See the file comment. */
JEMALLOC_ALWAYS_INLINE int live_block(tsdn_t *tsdn, rtree_ctx_t *rtree_ctx,
                                      const hm_je_key_t *hk, const void *ptr) {
    uintptr_t key = (uintptr_t)ptr;
    /* The map covers LG_VADDR bits (higher bits would alias lower
     * addresses). Page 0 is never in it, so NULL is refused below. */
    if (unlikely((key >> LG_VADDR) != 0)) return NOT_LIVE;
    uintptr_t bits;
    if (!leaf_read(tsdn, rtree_ctx, key, &bits)) return NOT_LIVE;
    szind_t szind = (szind_t)(bits >> LG_VADDR);
    if (likely(LEAF_ACTIVE_SLAB(bits))) {
        if (unlikely(!leaf_arena_ok(hk, bits)) ||
            unlikely(!region_start(key, bits, &g_cls[szind])))
            return NOT_LIVE;
        return (int)szind | LIVE_SLAB;
    }
    /* A large block (or nothing): an active extent of the arena that starts
     * at ptr (edata_addr_get: jemalloc's cache-oblivious offset is part of
     * the extent's address). */
    edata_t *edata = leaf_edata(bits);
    if ((bits & RTREE_LEAF_STATE_MASK) != 0 || edata == NULL || szind >= SC_NSIZES ||
        !leaf_arena_ok(hk, bits) || key != (uintptr_t)edata_addr_get(edata))
        return NOT_LIVE;
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

/* A small block from the thread's tcache, or false (bin empty). */
JEMALLOC_ALWAYS_INLINE bool alloc_small(tcache_t *tcache, size_t size, void **ptr) {
    szind_t ind = sz_size2index_lookup(size);
    cache_bin_t *bin = &tcache->bins[ind];
    bool ok;
    void *ret = cache_bin_alloc_easy(bin, &ok);
    if (unlikely(!ok)) ret = cache_bin_alloc(bin, &ok);
    if (unlikely(!ok)) return false;
    if (config_stats) bin->tstats.nrequests++; /* as fastpath_success_finish */
    *ptr = ret;
    return true;
}

/* The fast path of a thread whose by_tp slot is not its own: the tcache
 * through the thread's table (one TLS access). */
static JEMALLOC_NOINLINE hm_result_t alloc_tl(void *state, size_t size, size_t alignment,
                                              void **ptr) {
    tcache_t *tcache = tcache_of(state, tl_table);
    if (likely(tcache != NULL) && likely(alloc_small(tcache, size, ptr))) return HM_SUCCESS;
    return hm__je_alloc_slow(state, size, alignment, ptr);
}

__attribute__((visibility("hidden"))) hm_result_t hm__je_fast_alloc(void *state, size_t size,
                                                                     size_t alignment,
                                                                     void **ptr) {
    const hm_je_key_t *key = state;
    /* alignment 0 or 1: natural; size 1..SC_LOOKUP_MAXCLASS in one test. */
    if (likely(alignment <= 1 && size - 1 < SC_LOOKUP_MAXCLASS)) {
#if HM_JE_HAVE_TP
        uintptr_t tp = hm_je_thread_tp();
        const hm_je_tp_entry_t *b = HM_JE_TP_ENTRY(key, tp);
        if (unlikely(atomic_load_explicit(&b->tp, memory_order_relaxed) != tp))
            return alloc_tl(state, size, alignment, ptr);
        tcache_t *tcache = b->tcache;
        if (likely(tcache != NULL) && likely(alloc_small(tcache, size, ptr)))
            return HM_SUCCESS;
        return hm__je_alloc_slow(state, size, 0, ptr); /* 0 and 1: the same */
#else
        (void)key;
        return alloc_tl(state, size, alignment, ptr);
#endif
    }
    return hm__je_alloc_slow(state, size, alignment, ptr);
}

__attribute__((visibility("hidden"))) void *hm__je_fast_malloc(void *state, size_t size) {
#if HM_JE_HAVE_TP
    const hm_je_key_t *key = state;
    if (likely(size - 1 < SC_LOOKUP_MAXCLASS)) {
        uintptr_t tp = hm_je_thread_tp();
        const hm_je_tp_entry_t *b = HM_JE_TP_ENTRY(key, tp);
        void *p;
        if (likely(atomic_load_explicit(&b->tp, memory_order_relaxed) == tp) &&
            likely(b->tcache != NULL) && likely(alloc_small(b->tcache, size, &p)))
            return p;
    }
#endif
    return hm__je_malloc_slow(state, size);
}

/* hm__je_fast_free when anything is not the common case: the whole check
 * (large blocks, a thread without jemalloc data, lookup-cache misses), then
 * jemalloc's general path or the refusal. */
static JEMALLOC_NOINLINE hm_result_t free_checked(void *state, void *ptr) {
    const hm_je_key_t *key = state;
    if (unlikely(live_block_tsd(tsd_once(), key, ptr) < 0))
        return hm__je_refuse(state, ptr, "free");
    return hm__je_free_slow(state, ptr);
}

/* hm__je_fast_free on the thread's tsd and tcache (NULL: none). */
JEMALLOC_ALWAYS_INLINE hm_result_t free_body(void *state, void *ptr, tsd_t *tsd,
                                             tcache_t *tcache) {
    const hm_je_key_t *key = state;
    uintptr_t k = (uintptr_t)ptr;
    /* live_block's slab case, inline; everything else is decided again by
     * free_checked. (An address above LG_VADDR bits has a leaf key no cache
     * entry has: it goes there too.) */
    if (unlikely(!tsd_nominal(tsd))) return free_checked(state, ptr);
    rtree_ctx_t *ctx = tsd_rtree_ctx(tsd);
    size_t slot = rtree_cache_direct_map(k);
    if (unlikely(ctx->cache[slot].leafkey != rtree_leafkey(k))) return free_checked(state, ptr);
    uintptr_t bits = rtree_leaf_elm_bits_read(
        tsd_tsdn(tsd), &arena_emap_global.rtree,
        &ctx->cache[slot].leaf[rtree_subkey(k, RTREE_HEIGHT - 1)], false);
    if (unlikely(!LEAF_ACTIVE_SLAB(bits)) || unlikely(!leaf_meta_ok(key, bits)))
        return free_checked(state, ptr);
    size_t szind = bits >> LG_VADDR;
    /* &g_cls[szind] from the word in two operations (64-byte entries) */
    const cls_info_t *c =
        (const cls_info_t *)((const char *)g_cls + ((bits >> (LG_VADDR - 6)) & ~(uintptr_t)63));
    if (unlikely(!region_start_nb(k, bits, c))) return hm__je_refuse(state, ptr, "free");
    if (likely(tcache != NULL) && likely(cache_bin_dalloc_easy(&tcache->bins[szind], ptr)))
        return HM_SUCCESS;
    return hm__je_free_slow(state, ptr);
}

/* The fast path of a thread whose by_tp slot is not its own. */
static JEMALLOC_NOINLINE hm_result_t free_tl(void *state, void *ptr) {
    tsd_t *tsd = tsd_once();
    return free_body(state, ptr, tsd, tcache_of(state, tl_table));
}

__attribute__((visibility("hidden"))) hm_result_t hm__je_fast_free(void *state, void *ptr) {
#if HM_JE_HAVE_TP
    const hm_je_key_t *key = state;
    uintptr_t tp = hm_je_thread_tp();
    const hm_je_tp_entry_t *b = HM_JE_TP_ENTRY(key, tp);
    if (unlikely(atomic_load_explicit(&b->tp, memory_order_relaxed) != tp))
        return free_tl(state, ptr);
    return free_body(state, ptr, b->tsd, b->tcache);
#else
    return free_tl(state, ptr);
#endif
}

__attribute__((visibility("hidden"))) size_t hm__je_fast_check(const hm_je_key_t *key,
                                                                const void *ptr) {
    int live = live_block_tsd(tsd_once(), key, ptr);
    if (live < 0) return 0;
    return sz_index2size((szind_t)(live & ~LIVE_SLAB));
}
