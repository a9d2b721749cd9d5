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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One (thread, pool) entry, indexed by the pool's slot. Written only by its
 * thread (jemalloc.c's slow path and thread-exit destructor); a stale entry
 * (the pool that had the slot is gone) is told apart by `gen`. */
typedef struct hm_je_tl_entry {
    uint64_t gen;   /* generation of the pool it was made for; 0 = unused */
    unsigned tc;    /* the explicit tcache's index; HM_JE_NO_TCACHE: none */
    int flags;      /* mallocx/dallocx flags for the slow path */
    void *node;     /* jemalloc.c's record of the tcache (NULL: none) */
} hm_je_tl_entry_t;

#define HM_JE_NO_TCACHE (~0u)

typedef struct hm_je_tl_table {
    hm_je_tl_entry_t *e;
    unsigned cap;
} hm_je_tl_table_t;

/* What the fast paths need of a pool (immutable while the pool lives). */
typedef struct hm_je_key {
    unsigned slot;  /* index in the per-thread table */
    unsigned arena; /* the pool's arena */
    uint64_t gen;   /* the pool's generation, never 0 */
} hm_je_key_t;

/* This thread's table pointer (the TLS variable lives in je_fast.c, next to
 * jemalloc's own thread data, so the fast paths reach both with one TLS
 * access). */
hm_je_tl_table_t **hm__je_fast_tl(void);

/* A block of `size` bytes (natural alignment) from this thread's tcache of
 * the pool, or NULL: take the slow path (no tcache yet, cache empty, size not
 * small, a jemalloc thread event due, thread data not ready). Never fails
 * otherwise; never allocates from jemalloc's arenas itself. */
void *hm__je_fast_alloc(const hm_je_key_t *key, size_t size);

enum {
    HM_JE_FREED = 0,   /* done */
    HM_JE_SLOW = 1,    /* a live block of the arena: free it with dallocx */
    HM_JE_FOREIGN = 2, /* not a live block of the arena: refuse */
};
/* Free ptr into this thread's tcache of the pool if ptr is a live block of
 * the pool's arena and the fast path applies. */
int hm__je_fast_free(const hm_je_key_t *key, void *ptr);

/* Is ptr the start of a live block of `arena`? Its usable size, or 0. */
size_t hm__je_fast_check(unsigned arena, const void *ptr);

#endif
