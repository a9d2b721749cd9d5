/* hetmem tests — the pool x provider matrix: the pool suite for every pool
 * (proxy, native, native with the mutex remote-free queue, jemalloc when
 * built) over every provider kind of test/common/factories.c.
 * Usage: test_pool_matrix [POOL [KIND]]   (POOL: proxy (the default), native,
 * native-mutex, jemalloc; KIND: one provider kind's name, default every kind).
 * One CTest entry per pool.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

typedef hm_result_t (*make_pool_fn)(hm_provider_t *prov, uint32_t flags, hm_pool_t **out);

typedef struct pool_kind {
    const char *name;
    make_pool_fn make; /* NULL: not built (the entry skips) */
    int threads;       /* the concurrent case's threads (0: the suite's default) */
} pool_kind_t;

static hm_result_t make_proxy(hm_provider_t *prov, uint32_t flags, hm_pool_t **out) {
    return hm_proxy_pool_create(prov, flags, out);
}

static hm_result_t make_native_queue(hm_provider_t *prov, hm_native_remote_queue_t queue,
                                     uint32_t flags, hm_pool_t **out) {
    hm_native_params_t *np;
    hm_result_t r = hm_native_params_create(&np);
    if (r != HM_SUCCESS) return r;
    r = hm_native_params_set_remote_queue(np, queue);
    if (r == HM_SUCCESS) r = hm_native_pool_create(prov, np, flags, out);
    hm_native_params_destroy(np);
    return r;
}

static hm_result_t make_native(hm_provider_t *prov, uint32_t flags, hm_pool_t **out) {
    return make_native_queue(prov, HM_NATIVE_QUEUE_WFCQ, flags, out);
}

static hm_result_t make_native_mutex(hm_provider_t *prov, uint32_t flags, hm_pool_t **out) {
    return make_native_queue(prov, HM_NATIVE_QUEUE_MUTEX, flags, out);
}

#ifdef HM_TEST_JEMALLOC
static hm_result_t make_jemalloc(hm_provider_t *prov, uint32_t flags, hm_pool_t **out) {
    return hm_jemalloc_pool_create(prov, NULL, flags, out);
}
#endif

static const pool_kind_t g_pools[] = {
    {"proxy", make_proxy, 0},
    {"native", make_native, 0},
    {"native-mutex", make_native_mutex, 0},
#ifdef HM_TEST_JEMALLOC
#if defined(HM_TSAN)
    /* Fewer threads under ThreadSanitizer: each jemalloc thread cache and
     * arena lock multiplies TSan's shadow state. */
    {"jemalloc", make_jemalloc, 3},
#else
    {"jemalloc", make_jemalloc, 0},
#endif
#else
    {"jemalloc", NULL, 0},
#endif
};

typedef struct cell {
    const pool_kind_t *pool;
    hm_test_provider_kind_t kind;
} cell_t;

/* The pool owns its provider, so hm_pool_destroy() cleans everything. */
static hm_result_t make_cell(void *arg, hm_pool_t **out) {
    const cell_t *c = arg;
    hm_provider_t *prov;
    hm_result_t r = hm_test_make_provider(c->kind, &prov);
    if (r != HM_SUCCESS) return r;
    uint32_t flags = HM_POOL_FLAG_OWN_PROVIDER | hm_test_provider_kind_info(c->kind)->pool_flags;
    r = c->pool->make(prov, flags, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

/* Why a (pool, kind) pair is not run; NULL: it runs. Every skip is printed.
 * Every pool runs over every kind today (no pool refuses one); a pair that
 * cannot work goes here, with the reason. */
static const char *why_skipped(const pool_kind_t *pool, hm_test_provider_kind_t kind) {
    (void)pool;
    (void)kind;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 3) {
        fprintf(stderr, "usage: %s [proxy|native|native-mutex|jemalloc [KIND]]\n", argv[0]);
        return 2;
    }
    const char *name = argc > 1 ? argv[1] : "proxy";
    const pool_kind_t *pool = NULL;
    for (size_t i = 0; i < sizeof(g_pools) / sizeof(g_pools[0]); i++)
        if (!strcmp(name, g_pools[i].name)) pool = &g_pools[i];
    if (!pool) {
        fprintf(stderr, "unknown pool '%s'\n", name);
        return 2;
    }
    if (!pool->make) HM_TEST_SKIP("the %s pool is not built", pool->name);
    int ran = 0;
    for (int k = 0; k < HM_TEST_PROVIDER_KIND_COUNT; k++) {
        const hm_test_provider_kind_info_t *info = hm_test_provider_kind_info(k);
        if (argc == 3 && strcmp(argv[2], info->name)) continue;
        char label[96];
        snprintf(label, sizeof(label), "%s/%s", pool->name, info->name);
        const char *why = why_skipped(pool, k);
        if (why) {
            printf("skipped %s: %s\n", label, why);
            continue;
        }
        hm_test_suite_opts_t opts = info->opts;
        if (pool->threads) opts.threads = pool->threads;
        cell_t cell = {pool, k};
        hm_test_pool_suite(label, make_cell, &cell, &opts);
        ran++;
    }
    if (argc == 3 && !ran) {
        fprintf(stderr, "unknown or skipped provider kind '%s'\n", argv[2]);
        return 2;
    }
    CHECK_MSG(hm_test_providers_cleanup(), "the file provider left files behind");
    return hm_test_finish();
}
