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

/* ---- The pool's threads by thread pointer (hm_je_key_t.by_tp) ----
 *
 * The fast paths find the calling thread's tcache of the pool and its
 * jemalloc thread data without a TLS access (the native pool's scheme,
 * src/pools/native/native.c): a small table in the pool, indexed by a hash of
 * the thread pointer (one instruction to read); an entry counts only if its
 * `tp` is the caller's. A thread whose slot another live thread holds uses
 * its per-thread table instead (one TLS-descriptor call more).
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
 * | forget other threads' entries     | fork child (g_lock)  | relaxed stores         |
 *
 * So a thread only ever uses tcache/tsd values it wrote itself; the CAS and
 * the release store order one owner's writes before the next owner's. An
 * entry is released before its thread's thread pointer can be reused (the
 * pthread key destructor runs before the thread's control block is freed);
 * in a forked child, entries of the parent's other threads, whose control
 * blocks glibc reuses, are forgotten. The table lives and dies with the pool
 * (no thread may use a pool being destroyed). */
#define HM_JE_BY_TP_BITS 6
#define HM_JE_BY_TP (1u << HM_JE_BY_TP_BITS)

typedef struct hm_je_tp_entry {
    _Atomic uintptr_t tp; /* the owner's thread pointer; 0 = free */
    void *tcache;         /* the owner's tcache_t of the pool, or NULL: slow path */
    void *tsd;            /* the owner's jemalloc tsd_t (valid while owned) */
    void *unused;
} hm_je_tp_entry_t;

/* The calling thread's thread pointer (0 where not known: HM_JE_HAVE_TP is
 * 0 there, and no entry is ever claimed). */
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

/* Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4), as the native pool's tp_slot. */
static inline __attribute__((always_inline)) size_t hm_je_tp_slot(uintptr_t tp) {
    return (size_t)(((uint64_t)tp * 0x9E3779B97F4A7C15ull) >> (64 - HM_JE_BY_TP_BITS));
}

/* What the fast paths need of a pool (immutable while the pool lives, but
 * for by_tp, see above). It is the first member of the pool's state, so the
 * pool ops get it as `state`. */
typedef struct hm_je_key {
    unsigned slot;  /* index in the per-thread table */
    unsigned arena; /* the pool's arena */
    uint64_t gen;   /* the pool's generation, never 0 */
    /* The first block of the arena's own metadata allocator, its start and
     * size shifted left by 16 (see hm__je_fast_key_init): extent
     * descriptors in it are the arena's. */
    uintptr_t meta_lo_sh;
    uintptr_t meta_size_sh;
    hm_je_tp_entry_t by_tp[HM_JE_BY_TP]; /* see above */
} hm_je_key_t;

/* &key->by_tp[hm_je_tp_slot(tp)] (read-only), with the slot computed as a byte offset
 * (the fast paths then address the entry's fields directly). */
#define HM_JE_TP_ENTRY(key, tp)                                                        \
    ((const hm_je_tp_entry_t *)((const char *)(key)->by_tp +                        \
                          ((((uint64_t)(tp) * 0x9E3779B97F4A7C15ull) >>              \
                            (64 - HM_JE_BY_TP_BITS - 5)) & ~(uint64_t)31)))
_Static_assert(sizeof(hm_je_tp_entry_t) == 32, "HM_JE_TP_ENTRY assumes 32-byte entries");

/* The caller's entry in key->by_tp if it owns it, else NULL. */
static inline hm_je_tp_entry_t *hm_je_by_tp_mine(hm_je_key_t *key) {
    uintptr_t tp = hm_je_thread_tp();
    hm_je_tp_entry_t *b = &key->by_tp[hm_je_tp_slot(tp)];
    if (tp && atomic_load_explicit(&b->tp, memory_order_relaxed) == tp) return b;
    return NULL;
}

/* Once the arena exists: fill key->meta_lo_sh/meta_size_sh. Called under
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
 * caller's by_tp entry of the pool if it owns one (tcache and tsd). */
void hm__je_fast_tcache_refresh(hm_je_key_t *key, hm_je_tl_entry_t *e);

/* Is ptr the start of a live block of the pool? Its usable size, or 0. */
size_t hm__je_fast_check(const hm_je_key_t *key, const void *ptr);

#endif
