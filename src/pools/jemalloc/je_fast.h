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

/* What the fast paths need of a pool (immutable while the pool lives). It is
 * the first member of the pool's state, so the pool ops get it as `state`. */
typedef struct hm_je_key {
    unsigned slot;  /* index in the per-thread table */
    unsigned arena; /* the pool's arena */
    uint64_t gen;   /* the pool's generation, never 0 */
    /* The first block of the arena's own metadata allocator (see
     * hm__je_fast_key_init): extent descriptors in it are the arena's. */
    uintptr_t meta_lo;
    size_t meta_size;
} hm_je_key_t;

/* Once the arena exists: fill key->meta_lo/meta_size. */
void hm__je_fast_key_init(hm_je_key_t *key);

/* This thread's table pointer (the TLS variable lives in je_fast.c, next to
 * jemalloc's own thread data, so the fast paths reach both with one TLS
 * access). */
hm_je_tl_table_t **hm__je_fast_tl(void);

/* The pool's alloc op (state = the key): a small block from this thread's
 * tcache of the pool; otherwise (no tcache yet, cache empty, not small,
 * aligned, a jemalloc thread event due, thread data not ready) a tail call
 * to hm__je_alloc_slow. */
hm_result_t hm__je_fast_alloc(void *state, size_t size, size_t alignment, void **ptr);

/* The pool's free op: refuses (tail call to hm__je_refuse) unless ptr is a
 * live block of the pool's arena; frees small blocks into this thread's
 * tcache of the pool, anything else through hm__je_free_slow. */
hm_result_t hm__je_fast_free(void *state, void *ptr);

/* The slow paths, in jemalloc.c. */
hm_result_t hm__je_alloc_slow(void *state, size_t size, size_t alignment, void **ptr);
hm_result_t hm__je_free_slow(void *state, void *ptr);
hm_result_t hm__je_refuse(void *state, const void *ptr, const char *what);

/* Set e->tcache from jemalloc's table of explicit tcaches (after the tcache
 * was created, or re-created by the slow path after a flush). */
void hm__je_fast_tcache_refresh(hm_je_tl_entry_t *e);

/* Is ptr the start of a live block of the pool? Its usable size, or 0. */
size_t hm__je_fast_check(const hm_je_key_t *key, const void *ptr);

#endif
