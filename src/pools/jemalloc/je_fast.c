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
 *   page must belong to an active extent of the arena (the descriptor's own
 *   bits, edata_t.e_bits in edata.h: arena index, slab bit and state, one
 *   masked comparison with the key's slab_bits for a slab); on a slab, ptr
 *   must be the start of one of its regions (region_start: one exact test,
 *   no branch on the size class); a large block must start at ptr
 *   (edata_addr_get: jemalloc's cache-oblivious offset is part of the
 *   extent's address). A pointer of another jemalloc pool, of malloc(),
 *   inside a block or into freed memory is refused. A block freed twice
 *   while it sits in a thread cache is not detected (jemalloc does not
 *   detect it either). The free fast path makes the slab case inline and
 *   hands everything else to the whole check (free_checked).
 *
 * Thread data: the pool's first thread (hm_je_key_t.own_tp, one comparison)
 * and the pool's table by thread pointer (hm_je_key_t.by_tp, je_fast.h)
 * give the fast paths the thread's tcache and jemalloc's thread data (tsd)
 * with no TLS access. A thread that holds neither goes
 * through jemalloc's thread data (tsd_tls, tsd_tls.h) and the pool's
 * per-thread table (tl_table), both hidden TLS of this module, reached
 * through one TLS-descriptor call (the local-dynamic model; no initial-exec
 * TLS, so libhetmem.so stays dlopen()able).
 *
 * Concurrency: everything here touches only the calling thread's tsd, its
 * own tcaches, table, own line and by_tp entry (whose protocol je_fast.h
 * states), and
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

/* ---- the cache that is never usable (hm_je_key_t.no_tcache) ----
 * Every small bin is empty and full at once: its stack head is one word
 * (never written, read by cache_bin_alloc_impl as it reads any empty bin's
 * head) whose low address bits are also its low-water, empty and full marks
 * (cache_bin.h). So cache_bin_alloc fails (low water, then empty) and
 * cache_bin_dalloc_easy fails (full) without writing anything: the fast paths
 * then take the slow path, as for a full or empty bin of a real tcache. Only
 * the small bins (szind < SC_NBINS) are set: the fast paths use no other. */
static tcache_t g_no_tcache;
static void *g_no_tcache_word;

static void no_tcache_init(void) {
    uint16_t low = (uint16_t)(uintptr_t)&g_no_tcache_word;
    for (szind_t i = 0; i < SC_NBINS; i++) {
        cache_bin_t *bin = &g_no_tcache.bins[i];
        bin->stack_head = &g_no_tcache_word;
        bin->low_bits_low_water = low;
        bin->low_bits_full = low;
        bin->low_bits_empty = low;
    }
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
    void *tc = e->tcache != NULL ? e->tcache : key->no_tcache;
    int i = hm_je_by_tp_mine(key);
    if (i >= 0) {
        key->by_tp.tsd[i] = tsd_get(false);
        key->by_tp.tcache[i] = tc;
    }
    if (hm_je_own_mine(key)) {
        key->own_tsd = tsd_get(false);
        key->own_tcache = tc;
    }
}

/* The bytes a tcache holds: every bin jemalloc caches (nhbins, small and
 * large, tcache.c), counted as jemalloc's own statistics merge counts
 * tcache_bytes (arena_stats_merge, arena.c): cache_bin_nitems_get_remote
 * reads the bin's stack head while its owner may move it, so the answer is
 * exact while the owner is not inside a call. The tcache must stay alive
 * meanwhile (jemalloc.c: get_stats holds the registry lock, under which
 * every tcache of a pool is destroyed or flushed). */
__attribute__((visibility("hidden"))) size_t hm__je_fast_cached_bytes(void *tcache) {
    tcache_t *t = tcache;
    size_t bytes = 0;
    for (szind_t i = 0; i < nhbins; i++) {
        cache_bin_sz_t ncached, nstashed;
        cache_bin_nitems_get_remote(&t->bins[i], &tcache_bin_info[i], &ncached, &nstashed);
        bytes += ((size_t)ncached + nstashed) * sz_index2size(i);
    }
    return bytes;
}

/* live_block's answer: NOT_LIVE, or the size class, with LIVE_SLAB set for a
 * block on a slab. */
#define NOT_LIVE (-1)
#define LIVE_SLAB 0x10000

#ifndef RTREE_LEAF_COMPACT
#error "je_fast.c reads jemalloc's extent map as one word per page (RTREE_LEAF_COMPACT)"
#endif
/* The width the pool's extent alloc hook enforces (src/addr_width.h, passed
 * by cmake/HmJemalloc.cmake, which also configures jemalloc with it). */
#if !defined(HM_JEMALLOC_ADDR_BITS) || LG_VADDR != HM_JEMALLOC_ADDR_BITS
#error "je_fast.c: the private jemalloc's LG_VADDR is not HM_JEMALLOC_ADDR_BITS (src/addr_width.h)"
#endif

/* ---- region starts ----
 * A slab of a small size class holds nregs regions of `size` bytes from the slab's
 * start (edata_addr_get). ptr is the start of one iff d = ptr - start is
 * k * size with k < nregs. With size = 2^t * o (o odd) and inv the inverse
 * of o modulo 2^64, rotr(d * inv, t) (rotation of the 64-bit product) is k
 * exactly when d = k * size, and otherwise at least 2^64 / size: a set bit
 * among d's low t bits is a set bit among the product's low t bits (inv is
 * odd), which the rotation moves to the top; for d = 2^t * m with o not
 * dividing m, m * inv modulo 2^(64-t) runs over the values above
 * (2^(64-t) - 1) / o, as multiplication by inv is a bijection that maps the
 * multiples of o to their quotients (Granlund and Montgomery, "Division by
 * invariant integers using multiplication", PLDI 1994, section 9; Warren,
 * Hacker's Delight, 2nd ed., 10-17, which GCC uses for x % c == 0). So one
 * test, rotr(d * inv, t) < nregs, proves a region start for every class and
 * every d (a pointer before the slab's start, or far past it, wraps to a
 * large d and fails), with no branch on the class (a random mix of classes
 * mispredicts one).
 * For a power of two up to a page (o = 1, inv = 1), whose regions tile every
 * page of its slabs (a slab starts on a page), any multiple of the size on
 * one of the slab's pages is a region start, and rotr(d, t) < 2^(64-t)
 * exactly when d is a multiple of the size: with that bound (hm_je_cls_t's
 * `bound`, nregs for the other classes) d may be counted from any multiple
 * of the size, such as address 0, which the free fast path uses so as not
 * to read the descriptor for those classes. */
_Static_assert(SC_NBINS <= HM_JE_NCLS, "hm_je_key_t.cls");
_Static_assert(SC_LOOKUP_MAXCLASS == HM_JE_LOOKUP_MAX && SC_LG_TINY_MIN == 3,
               "hm_je_key_t.bin_of");
_Static_assert(offsetof(tcache_t, bins) + HM_JE_NCLS * sizeof(cache_bin_t) <= UINT16_MAX,
               "hm_je_key_t.bin_of");

static bool g_no_tcache_ready; /* set under the pool registry's lock (see je_fast.h) */

/* The inverse of an odd x modulo 2^64 by Newton's iteration (Warren, Hacker's
 * Delight, 2nd ed., 10-16): x is its own inverse modulo 8 (3 bits), and each
 * step doubles the correct low bits (6 steps: 192 >= 64). */
static uint64_t inverse_odd(uint64_t x) {
    uint64_t y = x;
    for (int i = 0; i < 6; i++) y *= 2 - x * y;
    return y;
}

/* Never written: what free_body reads as the start of a power-of-two class's
 * slab (hm_je_cls_t.zero). */
static const uintptr_t g_zero_word;

/* The descriptor of an extent-map word (rtree_leaf_elm_bits_decode, for the
 * user-space addresses the map holds: no sign extension). */
#define LEAF_EDATA_MASK ((((uintptr_t)1 << LG_VADDR) - 1) & ~(uintptr_t)(EDATA_ALIGNMENT - 1))

/* key->cls from jemalloc's bin_infos (fixed once jemalloc has booted). */
static void cls_init(hm_je_key_t *key) {
    hm_je_cls_t *c = &key->cls;
    memset(c, 0, sizeof(*c));
    for (szind_t i = 0; i < SC_NBINS; i++) {
        uint64_t size = bin_infos[i].reg_size;
        unsigned t = (unsigned)__builtin_ctzll(size);
        c->inv[i] = inverse_odd(size >> t);
        c->rot[i] = t;
        if ((size & (size - 1)) == 0 && size <= PAGE) {
            /* Regions tile every page of the slab: any multiple of the size
             * on one of its pages is a region start (see "region starts"). */
            c->bound[i] = (uint64_t)1 << (64 - t);
            c->sel[i] = 0;
            c->zero[i] = (uintptr_t)&g_zero_word - offsetof(edata_t, e_addr);
        } else {
            c->bound[i] = bin_infos[i].nregs;
            c->sel[i] = LEAF_EDATA_MASK; /* the word's descriptor address */
            c->zero[i] = 0;
        }
    }
}

/* The arena's base (base.h: base_t, base_block_t; arena_structs.h:
 * arena_t.base) maps its metadata in blocks that live as long as the arena;
 * every extent descriptor (edata_t) of the arena comes from it (arena_new and
 * pa_shard_init give the arena's edata caches the arena's base; base.c:
 * base_alloc_edata), and only the arena's extents use them. The first block
 * (the oldest, last in the list; 2 MiB, HUGEPAGE_CEILING in
 * base_block_alloc) holds the arena itself and the first thousands of
 * descriptors: a descriptor inside it proves the arena without reading the
 * descriptor (a cache miss per free when blocks are freed at random over
 * many slabs: 4 KiB blocks over 40 MB, bench_jemalloc's random 4096). The
 * free fast path tests the extent-map word rotated (leaf_x): the slab bit
 * on top, the descriptor's address halved below it (the word's other flags
 * in the low 6 bits, under the descriptor's 64-unit granularity), so that
 * "a slab whose descriptor is in the block" is x - meta_x < meta_xsize, with
 * meta_x = 2^63 + block / 2 and meta_xsize = block size / 2. */
JEMALLOC_ALWAYS_INLINE uintptr_t leaf_x(uintptr_t bits) {
    uintptr_t v = bits << RTREE_NHIB; /* drop the size class */
    return (v >> (RTREE_NHIB + 1)) | (v << (64 - RTREE_NHIB - 1));
}

static void meta_init(hm_je_key_t *key) {
    key->meta_x = 0;
    key->meta_xsize = 0; /* nothing passes */
    arena_t *arena = arena_get(TSDN_NULL, key->arena, false);
    if (arena == NULL || arena->base == NULL) return;
    base_block_t *b = arena->base->blocks;
    if (b == NULL) return;
    while (b->next != NULL) b = b->next;
    key->meta_x = ((uintptr_t)1 << 63) | ((uintptr_t)b >> 1);
    key->meta_xsize = b->size >> 1;
}

/* The extent descriptor bits that live_block compares (edata.h): the arena,
 * the slab bit, the state. */
#define EDATA_CHECK_MASK (EDATA_BITS_ARENA_MASK | EDATA_BITS_SLAB_MASK | EDATA_BITS_STATE_MASK)
_Static_assert(EDATA_CHECK_MASK <= INT32_MAX, "one 32-bit immediate");

__attribute__((visibility("hidden"))) void hm__je_fast_key_init(hm_je_key_t *key) {
    if (!g_no_tcache_ready) {
        no_tcache_init();
        g_no_tcache_ready = true;
    }
    key->slab_bits = ((uint64_t)key->arena << EDATA_BITS_ARENA_SHIFT) | EDATA_BITS_SLAB_MASK |
                     ((uint64_t)extent_state_active << EDATA_BITS_STATE_SHIFT);
    key->no_tcache = &g_no_tcache;
    for (unsigned i = 0; i < HM_JE_BY_TP; i++) key->by_tp.tcache[i] = &g_no_tcache;
    key->own_tcache = &g_no_tcache;
    cls_init(key);
    meta_init(key);
    for (size_t i = 0; i <= SC_LOOKUP_MAXCLASS >> SC_LG_TINY_MIN; i++)
        key->bin_of[i] = (uint16_t)(offsetof(tcache_t, bins) +
                                    sz_size2index_tab[i] * sizeof(cache_bin_t));
}

JEMALLOC_ALWAYS_INLINE edata_t *leaf_edata(uintptr_t bits) {
    return (edata_t *)(bits & LEAF_EDATA_MASK);
}

/* The descriptor's bits, read while other threads may change them (the
 * free count, under the bin's lock: not among the bits compared). */
JEMALLOC_ALWAYS_INLINE uint64_t edata_bits_racy(const edata_t *edata) {
    return __atomic_load_n(&edata->e_bits, __ATOMIC_RELAXED);
}

/* Is key the start of a region of the slab `edata` of small class szind?
 * (see "region starts") */
JEMALLOC_ALWAYS_INLINE bool region_start(uintptr_t key, const edata_t *edata,
                                         const hm_je_cls_t *c, szind_t szind) {
    uint64_t d = key - (uintptr_t)edata_addr_get(edata);
    uint64_t q = d * c->inv[szind];
    unsigned r = (unsigned)c->rot[szind];
    q = (q >> r) | (q << ((64 - r) & 63));
    return q < c->bound[szind];
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
    edata_t *edata = leaf_edata(bits);
    if (edata == NULL) return NOT_LIVE;
    szind_t szind = (szind_t)(bits >> LG_VADDR);
    uint64_t eb = edata_bits_racy(edata);
    if (bits & 1) {
        /* A slab (jemalloc writes descriptor, class and slab bit in one
         * word: szind < SC_NBINS). */
        if ((eb & EDATA_CHECK_MASK) != hk->slab_bits || szind >= SC_NBINS ||
            !region_start(key, edata, &hk->cls, szind))
            return NOT_LIVE;
        return (int)szind | LIVE_SLAB;
    }
    /* A large block (or nothing): an active extent of the arena that starts
     * at ptr (edata_addr_get: jemalloc's cache-oblivious offset is part of
     * the extent's address). */
    if ((bits & RTREE_LEAF_STATE_MASK) != 0 || szind >= SC_NSIZES ||
        (eb & EDATA_CHECK_MASK) != (hk->slab_bits & ~(uint64_t)EDATA_BITS_SLAB_MASK) ||
        key != (uintptr_t)edata_addr_get(edata))
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

/* A small block (size 1..SC_LOOKUP_MAXCLASS) from a tcache (the key's
 * no_tcache included), or false (bin empty). The bin as
 * &tcache->bins[sz_size2index_lookup(size)], from the key's copy. */
JEMALLOC_ALWAYS_INLINE bool alloc_small(const hm_je_key_t *key, tcache_t *tcache, size_t size,
                                        void **ptr) {
    cache_bin_t *bin =
        (cache_bin_t *)((char *)tcache + key->bin_of[(size + 7) >> SC_LG_TINY_MIN]);
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
    if (likely(tcache != NULL) && likely(alloc_small(state, tcache, size, ptr))) return HM_SUCCESS;
    return hm__je_alloc_slow(state, size, alignment, ptr);
}

#if HM_JE_HAVE_TP
/* The caller's tcache of the pool (the key's no_tcache: none) through its
 * by_tp slot (the hash's top bits, with which the fast paths address each
 * array scaled by 8), or NULL if another thread holds the slot. */
JEMALLOC_ALWAYS_INLINE tcache_t *by_tp_tcache(const hm_je_key_t *key, uintptr_t tp) {
    size_t i = hm_je_tp_slot(tp);
    if (unlikely(atomic_load_explicit(&key->by_tp.tp[i], memory_order_relaxed) != tp))
        return NULL;
    return key->by_tp.tcache[i];
}

/* The fast paths of a thread that is not the pool's first: its by_tp slot
 * (out of line: the first thread's path stays short). */
static JEMALLOC_NOINLINE hm_result_t alloc_by_tp(void *state, size_t size, void **ptr,
                                                 uintptr_t tp) {
    tcache_t *tcache = by_tp_tcache(state, tp);
    if (unlikely(tcache == NULL)) return alloc_tl(state, size, 0, ptr);
    if (likely(alloc_small(state, tcache, size, ptr))) return HM_SUCCESS;
    return hm__je_alloc_slow(state, size, 0, ptr);
}

static JEMALLOC_NOINLINE void *malloc_by_tp(void *state, size_t size, uintptr_t tp) {
    tcache_t *tcache = by_tp_tcache(state, tp);
    void *p;
    if (likely(tcache != NULL) && likely(alloc_small(state, tcache, size, &p))) return p;
    return hm__je_malloc_slow(state, size);
}
#endif

__attribute__((visibility("hidden"))) hm_result_t hm__je_fast_alloc(void *state, size_t size,
                                                                     size_t alignment,
                                                                     void **ptr) {
    const hm_je_key_t *key = state;
    /* alignment 0 or 1: natural; size 1..SC_LOOKUP_MAXCLASS in one test. */
    if (likely(alignment <= 1 && size - 1 < SC_LOOKUP_MAXCLASS)) {
#if HM_JE_HAVE_TP
        uintptr_t tp = hm_je_thread_tp();
        if (unlikely(atomic_load_explicit(&key->own_tp, memory_order_relaxed) != tp))
            return alloc_by_tp(state, size, ptr, tp);
        if (likely(alloc_small(key, key->own_tcache, size, ptr))) return HM_SUCCESS;
        return hm__je_alloc_slow(state, size, 0, ptr); /* 0 and 1: the same */
#else
        (void)key;
        return alloc_tl(state, size, alignment, ptr);
#endif
    }
    return hm__je_alloc_slow(state, size, alignment, ptr);
}

/* size is not 0 (hm_pool_malloc's front-end). */
__attribute__((visibility("hidden"))) void *hm__je_fast_malloc(void *state, size_t size) {
#if HM_JE_HAVE_TP
    const hm_je_key_t *key = state;
    if (likely(size <= SC_LOOKUP_MAXCLASS)) {
        uintptr_t tp = hm_je_thread_tp();
        if (unlikely(atomic_load_explicit(&key->own_tp, memory_order_relaxed) != tp))
            return malloc_by_tp(state, size, tp);
        void *p;
        if (likely(alloc_small(key, key->own_tcache, size, &p))) return p;
    }
#endif
    return hm__je_malloc_slow(state, size);
}

/* hm__je_fast_free when anything is not the common case: the whole check
 * (large blocks, a thread without jemalloc data, lookup-cache misses, a
 * descriptor outside the arena's first metadata block), then the thread's
 * cache for a small block, else jemalloc's general path, or the refusal. */
static JEMALLOC_NOINLINE hm_result_t free_checked(void *state, void *ptr, tcache_t *tcache) {
    const hm_je_key_t *key = state;
    int live = live_block_tsd(tsd_once(), key, ptr);
    if (unlikely(live < 0)) return hm__je_refuse(state, ptr, "free");
    if ((live & LIVE_SLAB) &&
        cache_bin_dalloc_easy(&tcache->bins[live & ~LIVE_SLAB], ptr))
        return HM_SUCCESS;
    return hm__je_free_slow(state, ptr);
}

/* hm__je_fast_free on the thread's tsd and tcache (the key's no_tcache:
 * none). */
JEMALLOC_ALWAYS_INLINE hm_result_t free_body(void *state, void *ptr, tsd_t *tsd,
                                             tcache_t *tcache) {
    const hm_je_key_t *key = state;
    uintptr_t k = (uintptr_t)ptr;
    /* live_block's slab case, inline; everything else is decided again by
     * free_checked. (An address above LG_VADDR bits has a leaf key no cache
     * entry has: it goes there too.) The thread's lookup cache is read in
     * any state of its tsd, as jemalloc's own free fast path does
     * (free_fastpath, src/jemalloc.c: emap_alloc_ctx_try_lookup_fast before
     * any test of the tsd): its entries are invalid keys from the tsd's
     * static initializer (RTREE_CTX_INITIALIZER, rtree_tsd.h) or from
     * rtree_ctx_data_init, or leaves of the map, which are never freed; only
     * the owning thread writes them. */
    rtree_ctx_t *ctx = tsd_rtree_ctx(tsd);
    size_t slot = rtree_cache_direct_map(k);
    if (unlikely(ctx->cache[slot].leafkey != rtree_leafkey(k)))
        return free_checked(state, ptr, tcache);
    uintptr_t bits = rtree_leaf_elm_bits_read(
        tsd_tsdn(tsd), &arena_emap_global.rtree,
        &ctx->cache[slot].leaf[rtree_subkey(k, RTREE_HEIGHT - 1)], false);
    /* A slab (szind < SC_NBINS: jemalloc writes descriptor, class and slab
     * bit in one word) whose descriptor is in the arena's first metadata
     * block (see meta_init; an active slab: jemalloc rewrites the word when
     * the slab goes, pa_dalloc in pa.c). */
    if (unlikely(leaf_x(bits) - key->meta_x >= key->meta_xsize)) {
        /* Not in the first block: a slab (the descriptor is not NULL) whose
         * descriptor says the arena, slab, active (as live_block). */
        if (!(bits & 1) ||
            (edata_bits_racy(leaf_edata(bits)) & EDATA_CHECK_MASK) != key->slab_bits)
            return free_checked(state, ptr, tcache);
    }
    size_t szind = bits >> LG_VADDR;
    cache_bin_t *bin = &tcache->bins[szind];
    /* The region test (see "region starts") on the offset from the slab's
     * start (edata_addr_get), or for powers of two up to a page from address
     * 0 (read from g_zero_word: the address read is chosen by the class's
     * masks, no branch on the class, no read of the descriptor). */
    uintptr_t src = (bits & key->cls.sel[szind]) | key->cls.zero[szind];
    uintptr_t start = *(const uintptr_t *)(src + offsetof(edata_t, e_addr));
    uint64_t q = (k - start) * key->cls.inv[szind];
    unsigned r = (unsigned)key->cls.rot[szind];
    q = (q >> r) | (q << ((64 - r) & 63));
    if (unlikely(q >= key->cls.bound[szind])) return hm__je_refuse(state, ptr, "free");
    if (likely(cache_bin_dalloc_easy(bin, ptr))) return HM_SUCCESS;
    return hm__je_free_slow(state, ptr);
}

/* The fast path of a thread without the own line or a by_tp slot. */
static JEMALLOC_NOINLINE hm_result_t free_tl(void *state, void *ptr) {
    tsd_t *tsd = tsd_once();
    tcache_t *tcache = tcache_of(state, tl_table);
    return free_body(state, ptr, tsd, tcache != NULL ? tcache : &g_no_tcache);
}

#if HM_JE_HAVE_TP
/* The fast path of a thread that is not the pool's first (out of line, as
 * alloc_by_tp). */
static JEMALLOC_NOINLINE hm_result_t free_by_tp(void *state, void *ptr, uintptr_t tp) {
    const hm_je_key_t *key = state;
    size_t i = hm_je_tp_slot(tp);
    if (unlikely(atomic_load_explicit(&key->by_tp.tp[i], memory_order_relaxed) != tp))
        return free_tl(state, ptr);
    return free_body(state, ptr, key->by_tp.tsd[i], key->by_tp.tcache[i]);
}
#endif

__attribute__((visibility("hidden"))) hm_result_t hm__je_fast_free(void *state, void *ptr) {
#if HM_JE_HAVE_TP
    const hm_je_key_t *key = state;
    uintptr_t tp = hm_je_thread_tp();
    if (unlikely(atomic_load_explicit(&key->own_tp, memory_order_relaxed) != tp))
        return free_by_tp(state, ptr, tp);
    return free_body(state, ptr, key->own_tsd, key->own_tcache);
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
