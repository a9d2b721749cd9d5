/* Allocation workloads shared by bench_native and bench_jemalloc, so that
 * their figures compare directly: only the pool under test differs.
 * SPDX-License-Identifier: MIT
 *
 * Each implementation context (impl_ctx_t) is either this process's malloc or
 * an hm_pool_t; the run functions have the harness's run signature
 * (bench/harness.h) and take a case_arg_t filled by wl_fill_arg(). */
#ifndef HM_BENCH_WORKLOADS_H
#define HM_BENCH_WORKLOADS_H

#include "harness.h"

#include <hetmem/hetmem.h>

#include <stdint.h>
#include <stdlib.h>

#define SLOTS 10000
#define NSIZES 4096 /* power of two */

/* K_RING: no allocator at all; the remote case hands precomputed addresses
 * through its ring and the consumer drops them (the hand-off's own cost:
 * the floor of the remote per-object figure). Other cases refuse it. */
typedef enum kind { K_MALLOC, K_POOL, K_RING } kind_t;

typedef struct impl_ctx {
    kind_t kind;
    hm_pool_t *pool;
    void **slot; /* random cases: the live slots (filled in setup) */
} impl_ctx_t;

typedef struct case_arg {
    int random;    /* needs SLOTS live blocks, made in setup */
    size_t lo, hi; /* size range */
    uint32_t sizes[NSIZES];
    uint32_t slots[NSIZES]; /* random slot indices */
} case_arg_t;

static inline void *xalloc(impl_ctx_t *c, size_t n) {
    return c->kind == K_MALLOC ? malloc(n) : hm_pool_malloc(c->pool, n);
}
static inline void xfree(impl_ctx_t *c, void *p) {
    if (c->kind == K_MALLOC) free(p);
    else hm_pool_free(c->pool, p);
}

/* Finishes a set-up: c (calloc'ed, kind and pool set) becomes *ctx and, for
 * a random case, gets its SLOTS live blocks. On failure c is torn down and
 * 1 is returned. */
int wl_setup_finish(const case_arg_t *a, impl_ctx_t *c, void **ctx);
/* Frees the live slots, destroys the pool (K_POOL) and frees the context. */
void wl_teardown(void *ctx);

int wl_run_pairs(void *ctx, const void *arg, uint64_t iters);
int wl_run_random(void *ctx, const void *arg, uint64_t iters);
int wl_run_remote(void *ctx, const void *arg, uint64_t iters);
int wl_run_xmalloc(void *ctx, const void *arg, uint64_t iters);
/* One thread allocates 64-byte objects, FANIN threads free them (each gets
 * every FANIN-th object through its own ring); K_RING works as in
 * wl_run_remote. */
#define FANIN 3
int wl_run_fanin(void *ctx, const void *arg, uint64_t iters);

/* Fills a's sizes in [lo, hi] and slot indices from seed (xorshift64*). */
void wl_fill_arg(case_arg_t *a, int random, size_t lo, size_t hi, uint64_t seed);
/* "glibc", or the base name of the LD_PRELOAD library (up to its first '.'). */
const char *wl_malloc_name(void);

/* Runs every case: pairs and random with local_*, then "remote 64B 1->1" and
 * "xmalloc 2+2" with remote_* (the same sets may be passed twice); sets each
 * implementation's run function. */
void wl_run_cases(hm_bench_t *b, hm_bench_impl_t *local_subject, hm_bench_impl_t *local_base,
                  size_t nlocal, hm_bench_impl_t *remote_subject, hm_bench_impl_t *remote_base,
                  size_t nremote);

#endif
