/* hetmem tests — the proxy pool: every error path of the proxy pool and the
 * pool front-end driven by the fault-injecting provider, and creation errors.
 * The pool suite over every provider kind is test/pools/test_pool_matrix.c.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <errno.h>

#define MIB ((size_t)1 << 20)

static hm_result_t make_os_provider(hm_os_visibility_t vis, hm_provider_t **out) {
    return hm_test_os_provider(vis, HM_OS_PROT_READ | HM_OS_PROT_WRITE, out);
}

/* ---- fault injection ---- */

typedef struct rig {
    hm_provider_t *fault;
    hm_pool_t *pool;
} rig_t;

static void rig_up(rig_t *g, hm_result_t fail_with) {
    hm_provider_t *os;
    REQUIRE_OK(make_os_provider(HM_OS_PRIVATE, &os));
    hm_fault_params_t fp = {.inner = os, .own_inner = 1, .fail_with = fail_with};
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &g->fault));
    /* The pool does not own the fault provider, so its counters can be read
     * after the pool is gone. */
    REQUIRE_OK(hm_proxy_pool_create(g->fault, 0, &g->pool));
}

/* Destroy the pool; nothing may be left with the provider, and nothing may
 * have been freed twice or with the wrong size. */
static void rig_down(rig_t *g, const char *what, long n) {
    CHECK_OK(hm_pool_destroy(g->pool));
    long live = hm_fault_provider_live(g->fault);
    CHECK_MSG(live == 0, "%s #%ld: %ld provider allocations (%zu bytes) leaked after destroy",
              what, n, live, hm_fault_provider_live_bytes(g->fault));
    CHECK_MSG(hm_fault_provider_misuse(g->fault) == 0, "%s #%ld: pool misused the provider",
              what, n);
    CHECK_OK(hm_provider_destroy(g->fault));
}

typedef struct wl_stats {
    int failed_allocs; /* malloc-family calls that returned NULL */
    int failed_frees;  /* free calls that returned an error */
    int absorbed;      /* injected failures a successful call absorbed (realloc's
                        * free of the old block: it stays allocated until destroy) */
} wl_stats_t;

static int expected_errno(hm_result_t injected) {
    return injected == HM_ERROR_OUT_OF_MEMORY ? ENOMEM : 0; /* 0: any non-zero errno */
}

static void check_null(void *p, hm_result_t injected, const char *call, wl_stats_t *st) {
    if (p) return;
    st->failed_allocs++;
    int want = expected_errno(injected);
    CHECK_MSG(want ? errno == want : errno != 0, "%s -> NULL with errno %d", call, errno);
}

static void check_free(hm_result_t r, hm_result_t injected, const char *call, wl_stats_t *st) {
    if (r == HM_SUCCESS) return;
    st->failed_frees++;
    CHECK_MSG(r == injected, "%s -> %s, expected success or the injected %s", call,
              hm_result_string(r), hm_result_string(injected));
}

/* A workload that touches every proxy and front-end path that reaches the
 * provider: malloc, calloc, aligned_malloc, realloc grow/shrink (alloc + copy
 * + free), hm_pool_free, hm_free, realloc(p, 0). Each failure must be clean:
 * NULL + errno or the injected result, the old block intact. Everything that
 * succeeded is freed, so after destroy the provider must hold nothing. */
static void *realloc_watch(hm_pool_t *pool, hm_provider_t *fault, void *p, size_t size,
                           wl_stats_t *st) {
    long before = hm_fault_provider_injected(fault);
    void *q = hm_pool_realloc(pool, p, size);
    if ((q || size == 0) && hm_fault_provider_injected(fault) != before) st->absorbed++;
    return q;
}

static void workload(hm_pool_t *pool, hm_provider_t *fault, hm_result_t inj, wl_stats_t *st) {
    errno = 0;
    char *a = hm_pool_malloc(pool, 100);
    check_null(a, inj, "malloc(100)", st);
    if (a) hm_test_fill(a, 100, 1);
    errno = 0;
    char *b = hm_pool_calloc(pool, 10, 1000);
    check_null(b, inj, "calloc(10, 1000)", st);
    if (b) {
        size_t nz = 0;
        for (int i = 0; i < 10000; i++) nz += b[i] != 0;
        CHECK_EQ(nz, 0);
        hm_test_fill(b, 10000, 2);
    }
    errno = 0;
    char *c = hm_pool_aligned_malloc(pool, 5000, 65536);
    check_null(c, inj, "aligned_malloc(5000, 64 KiB)", st);
    if (c) {
        CHECK(((uintptr_t)c & 65535) == 0);
        hm_test_fill(c, 5000, 3);
    }
    if (a) { /* grow: a new block, copy, free the old */
        errno = 0;
        char *a2 = realloc_watch(pool, fault, a, 20000, st);
        check_null(a2, inj, "realloc(100 -> 20000)", st);
        CHECK_MSG(hm_test_verify(a2 ? a2 : a, 100, 1), "realloc lost or clobbered content");
        if (a2) a = a2;
    }
    if (b) { /* shrink far: a new, smaller block */
        errno = 0;
        char *b2 = realloc_watch(pool, fault, b, 10, st);
        check_null(b2, inj, "realloc(10000 -> 10)", st);
        CHECK_MSG(hm_test_verify(b2 ? b2 : b, 10, 2), "realloc lost or clobbered content");
        if (b2) b = b2;
    }
    errno = 0;
    char *d = hm_pool_malloc(pool, 1 * MIB + 5);
    check_null(d, inj, "malloc(1 MiB + 5)", st);
    if (d) hm_test_fill(d, 1 * MIB + 5, 4);
    if (c) {
        CHECK(hm_test_verify(c, 5000, 3));
        hm_result_t r = hm_free(c);
        check_free(r, inj, "hm_free(c)", st);
        if (r != HM_SUCCESS) { /* the block is still the caller's: try once more */
            CHECK(hm_pool_by_ptr(c) == pool);
            CHECK(hm_test_verify(c, 5000, 3));
            r = hm_pool_free(pool, c);
            check_free(r, inj, "hm_pool_free(c) again", st);
        }
    }
    if (d) {
        CHECK(hm_test_verify(d, 1 * MIB + 5, 4));
        /* realloc(p, 0) frees */
        CHECK(realloc_watch(pool, fault, d, 0, st) == NULL);
    }
    if (a) {
        hm_result_t r = hm_pool_free(pool, a);
        check_free(r, inj, "hm_pool_free(a)", st);
    }
    if (b) {
        hm_result_t r = hm_pool_free(pool, b);
        check_free(r, inj, "hm_pool_free(b)", st);
    }
    /* A few more, left for destroy to reclaim (a leaking user). */
    errno = 0;
    void *leak = hm_pool_malloc(pool, 3000);
    check_null(leak, inj, "malloc(3000)", st);
}

static void fault_sweep(hm_fault_op_t op, const char *what, hm_result_t inj) {
    /* How many provider calls of this kind one clean run makes. */
    rig_t g;
    rig_up(&g, inj);
    wl_stats_t st = {0};
    workload(g.pool, g.fault, inj, &st);
    long calls = hm_fault_provider_calls(g.fault, op);
    CHECK_MSG(st.failed_allocs == 0 && st.failed_frees == 0, "clean %s run failed", what);
    CHECK_MSG(calls >= 4, "%s: only %ld provider calls in the workload", what, calls);
    rig_down(&g, what, 0);

    /* Fail the Nth call, for every N the workload reaches (and one past). */
    for (long n = 1; n <= calls + 1; n++) {
        rig_up(&g, inj);
        hm_fault_provider_arm(g.fault, op, n);
        wl_stats_t s2 = {0};
        workload(g.pool, g.fault, inj, &s2);
        long injected = hm_fault_provider_injected(g.fault);
        CHECK_MSG(injected == (n <= calls ? 1 : 0), "%s #%ld: %ld failures injected", what, n,
                  injected);
        if (n <= calls)
            CHECK_MSG(s2.failed_allocs + s2.failed_frees + s2.absorbed >= 1,
                      "%s #%ld: the injected failure was swallowed", what, n);
        /* Destroy's own provider frees must not be failed by the arming. */
        hm_fault_provider_disarm(g.fault);
        rig_down(&g, what, n);
    }
}

static void test_fault_injection(void) {
    hm_test_set_context("proxy fault injection");
    fault_sweep(HM_FAULT_ALLOC, "fail provider alloc", HM_ERROR_OUT_OF_MEMORY);
    fault_sweep(HM_FAULT_ALLOC, "fail provider alloc (driver)", HM_ERROR_DRIVER);
    fault_sweep(HM_FAULT_FREE, "fail provider free", HM_ERROR_DRIVER);
    fault_sweep(HM_FAULT_FREE, "fail provider free (busy)", HM_ERROR_BUSY);

    /* Every provider alloc fails: every malloc-family call fails cleanly. */
    rig_t g;
    rig_up(&g, HM_ERROR_OUT_OF_MEMORY);
    hm_fault_provider_arm(g.fault, HM_FAULT_ALLOC, -1);
    for (int i = 0; i < 3; i++) {
        errno = 0;
        CHECK(hm_pool_malloc(g.pool, 10) == NULL && errno == ENOMEM);
        errno = 0;
        CHECK(hm_pool_calloc(g.pool, 10, 10) == NULL && errno == ENOMEM);
        errno = 0;
        CHECK(hm_pool_aligned_malloc(g.pool, 10, 1 << 16) == NULL && errno == ENOMEM);
        errno = 0;
        CHECK(hm_pool_realloc(g.pool, NULL, 10) == NULL && errno == ENOMEM);
    }
    hm_pool_stats_t stats;
    CHECK_OK(hm_pool_get_stats(g.pool, &stats));
    CHECK_EQ(stats.provider_allocs, 0);
    hm_fault_provider_disarm(g.fault);
    rig_down(&g, "every alloc fails", 0);

    /* Every provider free fails: the frees report it, the blocks stay the
     * caller's, and destroy gives them back once the provider recovers. */
    rig_up(&g, HM_ERROR_DRIVER);
    void *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = hm_pool_malloc(g.pool, 4096 * (size_t)(i + 1));
        CHECK(p[i] != NULL);
    }
    hm_fault_provider_arm(g.fault, HM_FAULT_FREE, -1);
    for (int i = 0; i < 4; i++) {
        if (!p[i]) continue;
        CHECK_RES(hm_pool_free(g.pool, p[i]), HM_ERROR_DRIVER);
        CHECK(hm_pool_by_ptr(p[i]) == g.pool);
        CHECK(hm_pool_malloc_usable_size(g.pool, p[i]) >= 4096 * (size_t)(i + 1));
    }
    CHECK_EQ(hm_fault_provider_live(g.fault), 4);
    hm_fault_provider_disarm(g.fault);
    CHECK_OK(hm_pool_free(g.pool, p[0])); /* recovered */
    rig_down(&g, "every free fails, then recovers", 0);

    /* Destroy while the provider cannot free: the pool is gone (the tracker
     * forgets it), the ranges stay with the provider, and the destroy says
     * so. */
    rig_up(&g, HM_ERROR_DRIVER);
    void *q = hm_pool_malloc(g.pool, 4096);
    CHECK(q != NULL);
    hm_fault_provider_arm(g.fault, HM_FAULT_FREE, -1);
    CHECK_RES(hm_pool_destroy(g.pool), HM_ERROR_DRIVER);
    CHECK(hm_pool_by_ptr(q) == NULL);
    CHECK_EQ(hm_fault_provider_live(g.fault), 1);
    CHECK_EQ(hm_fault_provider_misuse(g.fault), 0);
    hm_fault_provider_disarm(g.fault);
    /* Hand the range back ourselves so the OS provider ends clean. */
    CHECK_OK(hm_provider_free(g.fault, q, 4096));
    CHECK_EQ(hm_fault_provider_live(g.fault), 0);
    CHECK_OK(hm_provider_destroy(g.fault));

    /* A pool that owns a provider whose alloc fails from the start. */
    hm_provider_t *os, *fault;
    REQUIRE_OK(make_os_provider(HM_OS_PRIVATE, &os));
    hm_fault_params_t fp = {.inner = os, .own_inner = 1};
    fp.fail_nth[HM_FAULT_ALLOC] = -1;
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &fault));
    hm_pool_t *pool;
    REQUIRE_OK(hm_proxy_pool_create(fault, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    errno = 0;
    CHECK(hm_pool_malloc(pool, 1) == NULL && errno == ENOMEM);
    CHECK_OK(hm_pool_destroy(pool)); /* destroys fault, which destroys os */
    hm_test_set_context(NULL);
}

/* Pool creation with bad arguments leaves the provider alone. */
static void test_create_errors(void) {
    hm_test_set_context("proxy create errors");
    hm_provider_t *os;
    REQUIRE_OK(make_os_provider(HM_OS_PRIVATE, &os));
    hm_pool_t *pool = (hm_pool_t *)(uintptr_t)1;
    CHECK_RES(hm_proxy_pool_create(NULL, 0, &pool), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_proxy_pool_create(os, 0, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_proxy_pool_create(os, 1u << 30, &pool), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_pool_create(hm_proxy_pool_ops(), NULL, NULL, 0, &pool),
              HM_ERROR_INVALID_ARGUMENT);
    /* The provider is still fine and still ours. */
    REQUIRE_OK(hm_proxy_pool_create(os, 0, &pool));
    CHECK(strcmp(hm_pool_name(pool), "proxy") == 0);
    CHECK(hm_pool_get_provider(pool) == os);
    void *p = hm_pool_malloc(pool, 10);
    CHECK(p != NULL);
    CHECK_EQ(hm_pool_malloc_usable_size(pool, p), 4096); /* one page */
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_OK(hm_provider_destroy(os)); /* not owned: still live */
    /* A destroyed provider cannot back a pool. */
    CHECK_RES(hm_proxy_pool_create(os, 0, &pool), HM_ERROR_INVALID_ARGUMENT);
    hm_test_set_context(NULL);
}

int main(void) {
    test_create_errors();
    test_fault_injection();
    return hm_test_finish();
}
