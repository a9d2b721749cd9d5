/* hetmem benchmark: alloc+free pairs through a pool, against baselines.
 * SPDX-License-Identifier: MIT
 *
 * One op = one allocation followed by its free, same thread, memory not
 * touched (this times the allocator, not page faults).
 *   hetmem   hm_pool_malloc/hm_pool_free on a proxy pool over the OS provider.
 *            The proxy pool is a pass-through: every allocation is an mmap and
 *            every free a munmap, plus the tracker's insert/remove. Expected to
 *            be far slower than malloc until the pooling allocators land.
 *   glibc    malloc/free.
 *   os-raw   hm_provider_alloc/hm_provider_free on the same kind of provider:
 *            the provider's own cost, without pool or tracker. */
#include "harness.h"

#include <hetmem/hetmem.h>
#include <hetmem/pools/proxy.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct alloc_arg {
    size_t size;
} alloc_arg_t;

/* --- hetmem: proxy pool over the OS provider --- */
static int pool_setup(const void *arg, void **ctx) {
    (void)arg;
    hm_provider_t *prov = NULL;
    hm_pool_t *pool = NULL;
    hm_result_t r = hm_os_provider_create(NULL, &prov);
    if (r == HM_SUCCESS) {
        r = hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool);
        if (r != HM_SUCCESS) hm_provider_destroy(prov);
    }
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_alloc: proxy pool over os: %s\n", hm_result_string(r));
        return 1;
    }
    *ctx = pool;
    return 0;
}

static int pool_run(void *ctx, const void *arg, uint64_t iters) {
    hm_pool_t *pool = ctx;
    size_t size = ((const alloc_arg_t *)arg)->size;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = hm_pool_malloc(pool, size);
        if (!p) return 1;
        hm_bench_escape(p);
        if (hm_pool_free(pool, p) != HM_SUCCESS) return 1;
    }
    return 0;
}

static void pool_teardown(void *ctx) { hm_pool_destroy(ctx); }

/* --- glibc malloc --- */
static int malloc_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    size_t size = ((const alloc_arg_t *)arg)->size;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = malloc(size);
        if (!p) return 1;
        hm_bench_escape(p);
        free(p);
    }
    return 0;
}

/* --- the OS provider, raw --- */
static int os_setup(const void *arg, void **ctx) {
    (void)arg;
    hm_provider_t *prov = NULL;
    hm_result_t r = hm_os_provider_create(NULL, &prov);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_alloc: os provider: %s\n", hm_result_string(r));
        return 1;
    }
    *ctx = prov;
    return 0;
}

static int os_run(void *ctx, const void *arg, uint64_t iters) {
    hm_provider_t *prov = ctx;
    size_t size = ((const alloc_arg_t *)arg)->size;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = NULL;
        if (hm_provider_alloc(prov, size, 0, &p) != HM_SUCCESS) return 1;
        hm_bench_escape(p);
        if (hm_provider_free(prov, p, size) != HM_SUCCESS) return 1;
    }
    return 0;
}

static void os_teardown(void *ctx) { hm_provider_destroy(ctx); }

int main(int argc, char **argv) {
    int rc;
    hm_bench_t *b = hm_bench_create("alloc", &argc, argv, &rc);
    if (!b) return rc;
    if (argc > 1) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[1]);
        hm_bench_finish(b);
        return 2;
    }

    static const hm_bench_impl_t subject = {"hetmem-proxy", pool_setup, pool_run, pool_teardown};
    static const hm_bench_impl_t baselines[] = {
        {"glibc", NULL, malloc_run, NULL},
        {"os-raw", os_setup, os_run, os_teardown},
    };
    static const struct {
        const char *name;
        size_t size;
    } cases[] = {
        {"alloc+free 4 KiB", (size_t)4 << 10},
        {"alloc+free 64 KiB", (size_t)64 << 10},
        {"alloc+free 1 MiB", (size_t)1 << 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        alloc_arg_t arg = {cases[i].size};
        hm_bench_case(b, cases[i].name, &arg, 1, &subject, baselines,
                      sizeof baselines / sizeof baselines[0]);
    }
    return hm_bench_finish(b);
}
