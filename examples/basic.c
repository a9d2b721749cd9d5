/* hetmem example: NUMA-bound host memory through a pool.
 * SPDX-License-Identifier: MIT
 *
 * Creates the OS provider bound to the first NUMA node, puts a proxy pool
 * over it, allocates, writes and checks memory, asks where its pages live and
 * which pool owns each pointer, then tears everything down. Prints what it
 * did; exits 0 only if every check passed. */
#include <hetmem/hetmem.h>
#include <hetmem/pools/proxy.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int checks, failures;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        checks++;                                                           \
        if (!(cond)) {                                                      \
            failures++;                                                     \
            fprintf(stderr, "basic: FAILED %s (line %d): ", #cond, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

static void report(const char *what, hm_result_t r) {
    const char *msg = NULL;
    int64_t code = hm_last_native_error(&msg);
    fprintf(stderr, "basic: %s: %s", what, hm_result_string(r));
    if (code != 0) fprintf(stderr, " (native error %lld: %s)", (long long)code, msg ? msg : "");
    fprintf(stderr, "\n");
}

static unsigned char pattern(size_t i, size_t salt) { return (unsigned char)((i * 31u + salt) & 0xff); }

static int filled_ok(const unsigned char *p, size_t n, size_t salt) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern(i, salt)) return 0;
    return 1;
}

static void fill(unsigned char *p, size_t n, size_t salt) {
    for (size_t i = 0; i < n; i++) p[i] = pattern(i, salt);
}

int main(void) {
    hm_result_t r;
    printf("hetmem %s\n", hm_version_string());

    /* 1. The machine's NUMA nodes. */
    unsigned nodes[256];
    size_t count = 0;
    r = hm_os_numa_nodes(nodes, sizeof nodes / sizeof nodes[0], &count);
    if (r != HM_SUCCESS || count == 0) {
        report("hm_os_numa_nodes", r);
        return 1;
    }
    size_t shown = count < sizeof nodes / sizeof nodes[0] ? count : sizeof nodes / sizeof nodes[0];
    printf("NUMA nodes: %zu (", count);
    for (size_t i = 0; i < shown; i++) printf("%s%u", i ? ", " : "", nodes[i]);
    printf(")\n");
    const unsigned node = nodes[0];

    /* 2. An OS provider whose pages are bound to that node. */
    hm_os_params_t *params = NULL;
    hm_provider_t *provider = NULL;
    r = hm_os_params_create(&params);
    if (r == HM_SUCCESS) r = hm_os_params_set_numa(params, HM_OS_NUMA_BIND, &node, 1);
    if (r == HM_SUCCESS) r = hm_os_provider_create(params, &provider);
    hm_os_params_destroy(params); /* the provider keeps its own copy */
    if (r != HM_SUCCESS) {
        report("creating the OS provider", r);
        return 1;
    }
    printf("provider \"%s\": %s memory, page %zu B, bound to node %u\n", hm_provider_name(provider),
           hm_memory_kind_string(hm_provider_memory_kind(provider)),
           hm_provider_min_page_size(provider), node);

    /* 3. A proxy pool over it; the pool owns (and later destroys) the provider. */
    hm_pool_t *pool = NULL;
    r = hm_proxy_pool_create(provider, HM_POOL_FLAG_OWN_PROVIDER, &pool);
    if (r != HM_SUCCESS) {
        report("hm_proxy_pool_create", r);
        hm_provider_destroy(provider);
        return 1;
    }

    /* 4. Allocations: written, read back, located, and traced to their pool. */
    static const size_t sizes[] = {64, 4096, 100000, 1u << 20, 4u << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *ptrs[N] = {0};
    size_t bytes = 0;
    for (size_t i = 0; i < N; i++) {
        ptrs[i] = hm_pool_malloc(pool, sizes[i]);
        EXPECT(ptrs[i] != NULL, "hm_pool_malloc(%zu) returned NULL", sizes[i]);
        if (!ptrs[i]) continue;
        bytes += sizes[i];
        fill(ptrs[i], sizes[i], i);
        EXPECT(hm_pool_malloc_usable_size(pool, ptrs[i]) >= sizes[i], "usable size of %zu B",
               sizes[i]);
        unsigned where = ~0u;
        r = hm_os_numa_node_of(ptrs[i], &where);
        EXPECT(r == HM_SUCCESS && where == node, "%zu B: hm_os_numa_node_of -> %s, node %u",
               sizes[i], hm_result_string(r), where);
        EXPECT(hm_pool_by_ptr(ptrs[i]) == pool, "hm_pool_by_ptr(start of %zu B)", sizes[i]);
        EXPECT(hm_pool_by_ptr(ptrs[i] + sizes[i] - 1) == pool, "hm_pool_by_ptr(end of %zu B)",
               sizes[i]);
    }
    for (size_t i = 0; i < N; i++)
        if (ptrs[i]) EXPECT(filled_ok(ptrs[i], sizes[i], i), "contents of %zu B", sizes[i]);
    int local = 0;
    EXPECT(hm_pool_by_ptr(&local) == NULL, "a stack address must not belong to a pool");
    printf("pool \"%s\": %d allocations (%zu B in all) written and read back, pages on node %u, "
           "each traced to its pool\n",
           hm_pool_name(pool), (int)N, bytes, node);

    /* 5. The rest of the malloc family. */
    size_t *zeros = hm_pool_calloc(pool, 1000, sizeof *zeros);
    EXPECT(zeros != NULL, "hm_pool_calloc");
    if (zeros) {
        size_t nonzero = 0;
        for (size_t i = 0; i < 1000; i++) nonzero += zeros[i] != 0;
        EXPECT(nonzero == 0, "calloc memory has %zu non-zero words", nonzero);
        EXPECT(hm_pool_free(pool, zeros) == HM_SUCCESS, "hm_pool_free(calloc)");
    }
    unsigned char *grown = hm_pool_realloc(pool, ptrs[1], 3 * sizes[1]);
    EXPECT(grown != NULL, "hm_pool_realloc");
    if (grown) {
        EXPECT(filled_ok(grown, sizes[1], 1), "realloc kept the contents");
        ptrs[1] = grown;
    }
    const size_t align = (size_t)2 << 20;
    void *aligned = hm_pool_aligned_malloc(pool, 4096, align);
    EXPECT(aligned != NULL && ((uintptr_t)aligned & (align - 1)) == 0,
           "hm_pool_aligned_malloc(4096, 2 MiB) -> %p", aligned);
    if (aligned) EXPECT(hm_free(aligned) == HM_SUCCESS, "hm_free(aligned)");
    printf("calloc (zeroed), realloc (contents kept), aligned_malloc (2 MiB) and hm_free: ok\n");

    /* 6. Frees, a foreign pointer refused, clean destroy. */
    for (size_t i = 0; i < N; i++) {
        if (!ptrs[i]) continue;
        /* half through the pool, half through hm_free() which finds the pool */
        r = (i % 2) ? hm_free(ptrs[i]) : hm_pool_free(pool, ptrs[i]);
        EXPECT(r == HM_SUCCESS, "freeing %zu B: %s", sizes[i], hm_result_string(r));
    }
    r = hm_pool_free(pool, &local);
    EXPECT(r == HM_ERROR_INVALID_ARGUMENT, "freeing a stack address: %s", hm_result_string(r));
    r = hm_pool_destroy(pool);
    EXPECT(r == HM_SUCCESS, "hm_pool_destroy: %s", hm_result_string(r));
    printf("freed everything, refused a foreign pointer, destroyed the pool and its provider\n");

    if (failures) {
        printf("basic: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("basic: all %d checks passed\n", checks);
    return 0;
}
