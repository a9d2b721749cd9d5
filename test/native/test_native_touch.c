/* hetmem tests — which memory the native pool touches: a heap reuses the
 * pages it has used before it takes a word it never used (first fit across
 * its slabs), so a producer whose blocks come back late through the remote
 * queue keeps few pages resident; a slab the pool retained with its pages
 * still backed is taken before a word never used.
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <pthread.h>
#include <stdint.h>

#define SLAB ((size_t)64 << 10) /* the 64-byte class's slab with the host defaults */
#define BSIZE 64
#define NBLOCKS (SLAB / BSIZE)
#define WORD 64 /* blocks per bitmap word */

static hm_pool_t *make_pool(void) {
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    return pool;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

typedef struct frees {
    hm_pool_t *pool;
    void **p;
    size_t n;
} frees_t;

static void *free_all(void *arg) { /* remote frees; the thread's exit publishes them */
    frees_t *f = arg;
    for (size_t i = 0; i < f->n; i++) CHECK_OK(hm_pool_free(f->pool, f->p[i]));
    return NULL;
}

/* The producer fills slab A, then takes slab B for one word; another thread
 * frees two words of A. The producer's next allocations must come from
 * those words of A (drained at its refill), not from a word of B it never
 * used; only when they are used up does B give a new word. */
static void test_first_fit_across_slabs(void) {
    hm_test_set_context("first fit across a heap's slabs");
    hm_pool_t *pool = make_pool();
    static void *a[NBLOCKS], *b[WORD];
    for (size_t i = 0; i < NBLOCKS; i++) REQUIRE((a[i] = hm_pool_malloc(pool, BSIZE)));
    qsort(a, NBLOCKS, sizeof a[0], cmp_ptr);
    uintptr_t a_lo = (uintptr_t)a[0];
    REQUIRE((uintptr_t)a[NBLOCKS - 1] - a_lo == SLAB - BSIZE); /* one slab, all of it */
    for (size_t i = 0; i < WORD; i++) REQUIRE((b[i] = hm_pool_malloc(pool, BSIZE)));
    for (size_t i = 0; i < WORD; i++) /* B: another slab */
        REQUIRE((uintptr_t)b[i] - a_lo >= SLAB);

    frees_t f = {pool, &a[3 * WORD], 2 * WORD}; /* A's words 3 and 4 */
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, free_all, &f) == 0);
    pthread_join(t, NULL);

    static void *c[2 * WORD + 1];
    size_t in_a = 0;
    for (size_t i = 0; i < 2 * WORD; i++) {
        REQUIRE((c[i] = hm_pool_malloc(pool, BSIZE)));
        in_a += (uintptr_t)c[i] - a_lo < SLAB;
    }
    CHECK_MSG(in_a == 2 * WORD, "%zu of %d blocks reused from the freed words of slab A "
              "(the others from a word of slab B never used)", in_a, 2 * WORD);
    REQUIRE((c[2 * WORD] = hm_pool_malloc(pool, BSIZE)));
    CHECK((uintptr_t)c[2 * WORD] - a_lo >= SLAB); /* A is full again: B's next word */

    for (size_t i = 0; i < NBLOCKS; i++)
        if ((uintptr_t)a[i] - (uintptr_t)a[3 * WORD] >= 2 * WORD * BSIZE)
            CHECK_OK(hm_pool_free(pool, a[i]));
    for (size_t i = 0; i < WORD; i++) CHECK_OK(hm_pool_free(pool, b[i]));
    for (size_t i = 0; i <= 2 * WORD; i++) CHECK_OK(hm_pool_free(pool, c[i]));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Slabs A, B, C full, D current with one word used; the heap frees all of A
 * (A, more used than D, becomes the current slab: D goes back to the partial
 * list), then all of B (back to the pool, its pages still backed). Once A
 * is used up again, the next allocation must come from B, taken back from
 * the pool, not from a word of D never used. */
static void test_retained_before_untouched(void) {
    hm_test_set_context("a retained slab before an untouched word");
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    hm_native_params_t *np;
    REQUIRE_OK(hm_native_params_create(&np));
    REQUIRE_OK(hm_native_params_set_retained_bytes(np, 4 * SLAB));
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_native_pool_create(prov, np, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    hm_native_params_destroy(np);
    static void *s[3][NBLOCKS], *d[WORD], *c[NBLOCKS + 1];
    uintptr_t lo[3];
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < NBLOCKS; i++) REQUIRE((s[k][i] = hm_pool_malloc(pool, BSIZE)));
        qsort(s[k], NBLOCKS, sizeof s[k][0], cmp_ptr);
        lo[k] = (uintptr_t)s[k][0];
        REQUIRE((uintptr_t)s[k][NBLOCKS - 1] - lo[k] == SLAB - BSIZE); /* one slab each */
    }
    for (size_t i = 0; i < WORD; i++) REQUIRE((d[i] = hm_pool_malloc(pool, BSIZE)));
    for (int k = 0; k < 3; k++) REQUIRE((uintptr_t)d[0] - lo[k] >= SLAB); /* D: a fourth */
    for (int k = 0; k < 2; k++) /* A, then B */
        for (size_t i = 0; i < NBLOCKS; i++) CHECK_OK(hm_pool_free(pool, s[k][i]));
    size_t in_a = 0;
    for (size_t i = 0; i < NBLOCKS; i++) {
        REQUIRE((c[i] = hm_pool_malloc(pool, BSIZE)));
        in_a += (uintptr_t)c[i] - lo[0] < SLAB;
    }
    CHECK_EQ(in_a, NBLOCKS); /* A again, all of it */
    REQUIRE((c[NBLOCKS] = hm_pool_malloc(pool, BSIZE)));
    uintptr_t x = (uintptr_t)c[NBLOCKS];
    CHECK_MSG(x - lo[1] < SLAB, "the block after A's came from %s",
              x - (uintptr_t)d[0] < SLAB || (uintptr_t)d[0] - x < SLAB
                  ? "slab D (a word never used), not from slab B retained"
                  : "neither slab B (retained) nor slab D");

    for (size_t i = 0; i < NBLOCKS; i++) CHECK_OK(hm_pool_free(pool, s[2][i]));
    for (size_t i = 0; i < WORD; i++) CHECK_OK(hm_pool_free(pool, d[i]));
    for (size_t i = 0; i <= NBLOCKS; i++) CHECK_OK(hm_pool_free(pool, c[i]));
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_EQ(st.bytes_requested, 0);
    CHECK_OK(hm_pool_destroy(pool));
}

int main(void) {
    test_first_fit_across_slabs();
    test_retained_before_untouched();
    return hm_test_finish();
}
