/* hetmem — the jemalloc pool's fast paths into jemalloc (je_fast.c), and the
 * per-thread table they share with the pool (jemalloc.c).
 * SPDX-License-Identifier: MIT
 *
 * je_fast.c is compiled with jemalloc's own flags against jemalloc 5.3.0's
 * internal headers and linked into the private jemalloc object
 * (cmake/HmJemalloc.cmake); this header is all the two files share, so it
 * uses plain C types only. */
#ifndef HM_JE_FAST_H
#define HM_JE_FAST_H

#include <hetmem/base.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One (thread, pool) entry, indexed by the pool's slot. Written only by its
 * thread (jemalloc.c's slow path and thread-exit destructor); a stale entry
 * (the pool that had the slot is gone) is told apart by `gen`. */
typedef struct hm_je_tl_entry {
    uint64_t gen;   /* generation of the pool it was made for; 0 = unused */
    void *tcache;   /* jemalloc's tcache_t of `tc`, or NULL: take the slow
                     * path (set by hm__je_tcache_refresh; cleared before
                     * the pool flushes or destroys the tcache) */
    unsigned tc;    /* the explicit tcache's index; HM_JE_NO_TCACHE: none */
    int flags;      /* mallocx/dallocx flags for the slow path */
    void *node;     /* jemalloc.c's record of the tcache (NULL: none) */
} hm_je_tl_entry_t;

#define HM_JE_NO_TCACHE (~0u)

typedef struct hm_je_tl_table {
    hm_je_tl_entry_t *e;
    unsigned cap;
} hm_je_tl_table_t;

/* ---- The pool's first thread (hm_je_key_t.own_tp, own_tcache, own_tsd) ----
 *
 * One thread of the pool (the first to take it while it is free, usually
 * the only thread of a single-threaded program) finds its tcache and tsd
 * with one comparison: its thread pointer is own_tp. Every other thread
 * then goes on to by_tp below (two instructions more than without this
 * line). The protocol is by_tp's (below): own_tp taken by CAS (0 -> tp) and
 * released by the owner at thread exit (release store, under g_lock) or
 * forgotten in a fork child; own_tcache and own_tsd written and read by the
 * owner only; own_tcache never NULL (no_tcache instead). */

/* ---- The pool's threads by thread pointer (hm_je_key_t.by_tp) ----
 *
 * The fast paths find the calling thread's tcache of the pool and its
 * jemalloc thread data without a TLS access (the native pool's scheme,
 * src/pools/native/native.c): a small table in the pool, indexed by a hash of
 * the thread pointer (one instruction to read); a slot counts only if its
 * `tp` is the caller's. A thread whose slot another live thread holds uses
 * its per-thread table instead (one TLS-descriptor call more). The table is
 * three parallel arrays, so that the fast paths address a slot's fields with
 * the hash scaled by 8 (no extra instruction to form an entry's address).
 *
 * | operation                         | who                  | how                    |
 * |-----------------------------------|----------------------|------------------------|
 * | claim (tp 0 -> own)               | the thread, slow path| CAS, acq_rel           |
 * | set/clear tcache, tsd             | the owner only       | plain stores           |
 * | read tp, then tcache/tsd          | any thread, fast path| relaxed load of tp;    |
 * |                                   |                      | the rest only if tp is |
 * |                                   |                      | its own (its own data) |
 * | release (own -> 0)                | the owner at thread  | release store, under   |
 * |                                   | exit (g_lock)        | jemalloc.c's g_lock    |
 * | forget other threads' slots       | fork child (g_lock)  | relaxed stores         |
 *
 * So a thread only ever uses tcache/tsd values it wrote itself; the CAS and
 * the release store order one owner's writes before the next owner's. A
 * slot is released before its thread's thread pointer can be reused (the
 * pthread key destructor runs before the thread's control block is freed);
 * in a forked child, slots of the parent's other threads, whose control
 * blocks glibc reuses, are forgotten. The table lives and dies with the pool
 * (no thread may use a pool being destroyed).
 *
 * `tcache` is never NULL: a slot without a usable tcache holds the key's
 * `no_tcache`, a cache whose small bins are all empty and all full at once
 * (je_fast.c), so the fast paths need no test of their own for it: the pop
 * and the push fail and the slow path runs. */
#define HM_JE_BY_TP_BITS 6
#define HM_JE_BY_TP (1u << HM_JE_BY_TP_BITS)

typedef struct hm_je_by_tp {
    _Atomic uintptr_t tp[HM_JE_BY_TP]; /* the owner's thread pointer; 0 = free */
    void *tcache[HM_JE_BY_TP];         /* the owner's tcache_t of the pool, or no_tcache */
    void *tsd[HM_JE_BY_TP];            /* the owner's jemalloc tsd_t (valid while owned) */
} hm_je_by_tp_t;

/* The calling thread's thread pointer (0 where not known: HM_JE_HAVE_TP is
 * 0 there, and no slot is ever claimed). */
#if defined(__x86_64__) || defined(__aarch64__)
#define HM_JE_HAVE_TP 1
#else
#define HM_JE_HAVE_TP 0
#endif
static inline __attribute__((always_inline)) uintptr_t hm_je_thread_tp(void) {
#if defined(__x86_64__)
    uintptr_t tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#elif defined(__aarch64__)
    uintptr_t tp;
    __asm__("mrs %0, tpidr_el0" : "=r"(tp));
    return tp;
#else
    return 0;
#endif
}

/* Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4), as the native pool's tp_slot:
 * the top bits of the product (a 64-bit multiplier: thread pointers of
 * threads with 8 MiB stacks differ by about 2^23, which a shorter multiplier
 * would map to the same slot). */
static inline __attribute__((always_inline)) size_t hm_je_tp_slot(uintptr_t tp) {
    return (size_t)(((uint64_t)tp * 0x9E3779B97F4A7C15ull) >> (64 - HM_JE_BY_TP_BITS));
}

#define HM_JE_NCLS 40         /* at least jemalloc's SC_NBINS (checked in je_fast.c) */

/* Per small size class (index: jemalloc's szind), what the free path's
 * region test needs (je_fast.c, "region starts"), as parallel arrays, each
 * addressed with the class index scaled by 8. The test counts a pointer's
 * offset from the slab's start in its descriptor, or (powers of two up to a
 * page, whose regions tile every page) from address 0, without reading the
 * descriptor: the address read is (extent-map word & sel) | zero. */
typedef struct hm_je_cls {
    uint64_t inv[HM_JE_NCLS];   /* the inverse of the size's odd part modulo 2^64 */
    uint64_t bound[HM_JE_NCLS]; /* regions per slab; 2^(64 - rot) for powers of two up
                                 * to a page */
    uint64_t rot[HM_JE_NCLS];   /* log2 of the size's largest power-of-two divisor */
    uintptr_t sel[HM_JE_NCLS];  /* the word's descriptor address bits, or 0 */
    uintptr_t zero[HM_JE_NCLS]; /* 0, or where to read 0 instead (less the e_addr offset) */
} hm_je_cls_t;

#define HM_JE_LOOKUP_MAX 4096 /* jemalloc's SC_LOOKUP_MAXCLASS (checked in je_fast.c) */

/* What the fast paths need of a pool (immutable while the pool lives, but
 * for by_tp, see above). It is the first member of the pool's state, so the
 * pool ops get it as `state`. */
typedef struct hm_je_key {
    /* first: the fast paths address its arrays from the key with no
     * displacement */
    hm_je_by_tp_t by_tp; /* see above */
    /* Copies of jemalloc's tables, kept here so that the fast paths address
     * them from the key (no instruction to form their address): the class
     * information by size class, and by (size + 7) / 8 for sizes up to
     * HM_JE_LOOKUP_MAX the byte offset of the size class's cache bin in a
     * tcache_t (sz_size2index_tab, sz.h, times the bins' stride). Set by
     * hm__je_fast_key_init. */
    hm_je_cls_t cls;
    uint16_t bin_of[HM_JE_LOOKUP_MAX / 8 + 1];
    /* The pool's first thread (see above). */
    _Atomic uintptr_t own_tp;
    void *own_tcache;
    void *own_tsd;
    unsigned slot;  /* index in the per-thread table */
    unsigned arena; /* the pool's arena */
    uint64_t gen;   /* the pool's generation, never 0 */
    /* An extent descriptor's bits (edata_t.e_bits) under je_fast.c's mask
     * (arena, slab, state) for an active slab of the arena (set by
     * hm__je_fast_key_init). */
    uint64_t slab_bits;
    /* The arena's first metadata block (its descriptors are the arena's), as
     * the free fast path tests an extent-map word: see je_fast.c,
     * leaf_slab_of_arena. */
    uintptr_t meta_x, meta_xsize;
    void *no_tcache; /* see above (set by hm__je_fast_key_init) */
} hm_je_key_t;

/* The caller's slot in key->by_tp if it owns it, else -1. */
static inline int hm_je_by_tp_mine(const hm_je_key_t *key) {
    uintptr_t tp = hm_je_thread_tp();
    size_t i = hm_je_tp_slot(tp);
    if (tp && atomic_load_explicit(&key->by_tp.tp[i], memory_order_relaxed) == tp) return (int)i;
    return -1;
}

/* Is the caller the pool's first thread (own_tp)? */
static inline bool hm_je_own_mine(const hm_je_key_t *key) {
    uintptr_t tp = hm_je_thread_tp();
    return tp && atomic_load_explicit(&key->own_tp, memory_order_relaxed) == tp;
}

/* The fast paths must not use the caller's tcache of the pool (it is about
 * to be flushed or destroyed): its by_tp slot and own line, if it has them,
 * get no_tcache. */
static inline void hm_je_key_disable_mine(hm_je_key_t *key) {
    int b = hm_je_by_tp_mine(key);
    if (b >= 0) key->by_tp.tcache[b] = key->no_tcache;
    if (hm_je_own_mine(key)) key->own_tcache = key->no_tcache;
}

/* Thread exit (under jemalloc.c's g_lock): the caller gives back its by_tp
 * slot and the own line, if it has them. */
static inline void hm_je_key_release_mine(hm_je_key_t *key) {
    hm_je_key_disable_mine(key);
    int b = hm_je_by_tp_mine(key);
    if (b >= 0) atomic_store_explicit(&key->by_tp.tp[b], 0, memory_order_release);
    if (hm_je_own_mine(key)) atomic_store_explicit(&key->own_tp, 0, memory_order_release);
}

/* Once the arena exists: fill key->cls, bin_of, slab_bits,
 * meta_x, meta_xsize and no_tcache,
 * and set every by_tp tcache to no_tcache. Called under
 * jemalloc.c's g_lock (the first call also fills je_fast.c's table of size
 * classes; a pthread_once here would be a hidden reference to libc: the file
 * is compiled under jemalloc's visibility pragma). */
void hm__je_fast_key_init(hm_je_key_t *key);

/* This thread's table pointer (the TLS variable lives in je_fast.c, next to
 * jemalloc's own thread data, so the fast paths reach both with one TLS
 * access). */
hm_je_tl_table_t **hm__je_fast_tl(void);

/* The pool's alloc op (state = the key): a small block from this thread's
 * tcache of the pool; otherwise (no tcache yet, cache empty, not small,
 * aligned) a tail call to hm__je_alloc_slow. */
hm_result_t hm__je_fast_alloc(void *state, size_t size, size_t alignment, void **ptr);

/* The pool's malloc_fast op: the same small-block path as
 * hm__je_fast_alloc returning the block, everything else through
 * hm__je_malloc_slow (NULL and errno on failure). */
void *hm__je_fast_malloc(void *state, size_t size);

/* The pool's free op: refuses (tail call to hm__je_refuse) unless ptr is a
 * live block of the pool's arena; frees small blocks into this thread's
 * tcache of the pool, anything else through hm__je_free_slow. */
hm_result_t hm__je_fast_free(void *state, void *ptr);

/* The slow paths, in jemalloc.c. */
hm_result_t hm__je_alloc_slow(void *state, size_t size, size_t alignment, void **ptr);
hm_result_t hm__je_free_slow(void *state, void *ptr);
void *hm__je_malloc_slow(void *state, size_t size);
hm_result_t hm__je_refuse(void *state, const void *ptr, const char *what);

/* Set e->tcache from jemalloc's table of explicit tcaches (after the tcache
 * was created, or re-created by the slow path after a flush), and the
 * caller's by_tp slot and own line of the pool if it has them (tcache, or
 * no_tcache, and tsd). */
void hm__je_fast_tcache_refresh(hm_je_key_t *key, hm_je_tl_entry_t *e);

/* The bytes of blocks held in a tcache_t (freed by users, not yet back in
 * the arena), read while its owner may be using it: exact when the owner is
 * not inside a call. The caller keeps the tcache alive. */
size_t hm__je_fast_cached_bytes(void *tcache);

/* Is ptr the start of a live block of the pool? Its usable size, or 0. */
size_t hm__je_fast_check(const hm_je_key_t *key, const void *ptr);

#endif
