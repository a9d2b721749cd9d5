/* hetmem benchmark: NUMA-bound host memory, a native pool over an OS
 * provider bound to the nodes with CPUs, against memkind's MEMKIND_REGULAR
 * (memory of the nodes with CPUs, bound) and unbound malloc.
 * SPDX-License-Identifier: MIT
 *
 * One op = one allocation followed by its free on one thread, with the
 * first byte written (a block the program could use); the "working set"
 * case keeps 4096 blocks of 16 B .. 4 KiB live and replaces one per op.
 *   hetmem    hm_pool_malloc/hm_pool_free on a native pool over
 *             hm_os_provider with HM_OS_NUMA_BIND on every node with CPUs.
 *   memkind   memkind_malloc/memkind_free(MEMKIND_REGULAR), libmemkind.so.0
 *             opened at run time (skipped when it is not installed: Debian's
 *             libmemkind0).
 *   malloc    malloc/free, unbound: what binding costs, if anything. */
#include "harness.h"

#include <hetmem/hetmem.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WS = 4096 };

typedef struct numa_arg {
    size_t size; /* 0: the working-set case */
} numa_arg_t;

/* One allocator: alloc and free through function pointers, so that every
 * implementation runs the same loops. */
typedef struct impl {
    void *(*alloc)(struct impl *, size_t);
    void (*free)(struct impl *, void *);
    hm_pool_t *pool;
    void *kind; /* memkind_t */
    void **ws;
    uint64_t seed;
} impl_t;

static void *(*mk_malloc)(void *kind, size_t size);
static void (*mk_free)(void *kind, void *ptr);
static void *mk_regular;

static void *pool_alloc(impl_t *m, size_t n) { return hm_pool_malloc(m->pool, n); }
static void pool_free(impl_t *m, void *p) { (void)hm_pool_free(m->pool, p); }
static void *mk_alloc(impl_t *m, size_t n) { return mk_malloc(m->kind, n); }
static void mk_release(impl_t *m, void *p) { mk_free(m->kind, p); }
static void *libc_alloc(impl_t *m, size_t n) {
    (void)m;
    return malloc(n);
}
static void libc_free(impl_t *m, void *p) {
    (void)m;
    free(p);
}

static size_t ws_size(uint64_t *seed) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    return 16 + (size_t)((*seed >> 33) % 4081);
}

static int impl_start(impl_t *m, const numa_arg_t *a) {
    m->seed = 42;
    if (a->size) return 0;
    m->ws = calloc(WS, sizeof *m->ws);
    if (!m->ws) return 1;
    for (size_t i = 0; i < WS; i++) {
        m->ws[i] = m->alloc(m, ws_size(&m->seed));
        if (!m->ws[i]) return 1;
        *(volatile char *)m->ws[i] = 1;
    }
    return 0;
}

static void impl_stop(impl_t *m) {
    if (m->ws) {
        for (size_t i = 0; i < WS; i++)
            if (m->ws[i]) m->free(m, m->ws[i]);
        free(m->ws);
    }
    if (m->pool) hm_pool_destroy(m->pool);
    free(m);
}

static int setup_common(impl_t *m, const void *arg, void **ctx) {
    if (impl_start(m, arg)) {
        fprintf(stderr, "bench_numa: set-up allocation failed\n");
        impl_stop(m);
        return 1;
    }
    *ctx = m;
    return 0;
}

static int setup_pool(const void *arg, void **ctx) {
    unsigned nodes[256];
    size_t count = 0;
    hm_result_t r = hm_os_numa_nodes(nodes, 256, &count);
    hm_os_params_t *params = NULL;
    hm_provider_t *prov = NULL;
    impl_t *m = calloc(1, sizeof *m);
    if (!m) return 1;
    if (r == HM_SUCCESS) r = hm_os_params_create(&params);
    if (r == HM_SUCCESS) r = hm_os_params_set_numa(params, HM_OS_NUMA_BIND, nodes, count);
    if (r == HM_SUCCESS) r = hm_os_provider_create(params, &prov);
    if (r == HM_SUCCESS) {
        r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &m->pool);
        if (r != HM_SUCCESS) hm_provider_destroy(prov);
    }
    hm_os_params_destroy(params);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_numa: NUMA-bound native pool: %s\n", hm_result_string(r));
        free(m);
        return 1;
    }
    m->alloc = pool_alloc;
    m->free = pool_free;
    return setup_common(m, arg, ctx);
}

static int setup_memkind(const void *arg, void **ctx) {
    if (!mk_malloc) return HM_BENCH_SKIP;
    impl_t *m = calloc(1, sizeof *m);
    if (!m) return 1;
    m->alloc = mk_alloc;
    m->free = mk_release;
    m->kind = mk_regular;
    return setup_common(m, arg, ctx);
}

static int setup_malloc(const void *arg, void **ctx) {
    impl_t *m = calloc(1, sizeof *m);
    if (!m) return 1;
    m->alloc = libc_alloc;
    m->free = libc_free;
    return setup_common(m, arg, ctx);
}

static int run(void *ctx, const void *arg, uint64_t iters) {
    impl_t *m = ctx;
    size_t size = ((const numa_arg_t *)arg)->size;
    for (uint64_t i = 0; i < iters; i++) {
        if (size) {
            char *p = m->alloc(m, size);
            if (!p) return 1;
            *(volatile char *)p = 1;
            m->free(m, p);
        } else {
            size_t k = (size_t)(m->seed >> 40) % WS;
            m->free(m, m->ws[k]);
            m->ws[k] = m->alloc(m, ws_size(&m->seed));
            if (!m->ws[k]) return 1;
            *(volatile char *)m->ws[k] = 1;
        }
    }
    return 0;
}

static void teardown(void *ctx) { impl_stop(ctx); }

/* memkind, if installed: its allocation calls and MEMKIND_REGULAR (a
 * variable holding the kind). */
static void load_memkind(void) {
    void *h = dlopen("libmemkind.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("memkind: not installed (libmemkind.so.0: %s): its rows are skipped\n", dlerror());
        return;
    }
    void **regular = dlsym(h, "MEMKIND_REGULAR");
    void *a = dlsym(h, "memkind_malloc"), *f = dlsym(h, "memkind_free");
    if (!regular || !*regular || !a || !f) {
        printf("memkind: libmemkind.so.0 lacks MEMKIND_REGULAR or memkind_malloc/free\n");
        return;
    }
    mk_regular = *regular;
    memcpy(&mk_malloc, &a, sizeof a);
    memcpy(&mk_free, &f, sizeof f);
}

int main(int argc, char **argv) {
    int rc;
    hm_bench_t *b = hm_bench_create("numa", &argc, argv, &rc);
    if (!b) return rc;
    if (argc > 1) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[1]);
        hm_bench_finish(b);
        return 2;
    }
    load_memkind();
    static const hm_bench_impl_t subject = {"hetmem", setup_pool, run, teardown};
    static const hm_bench_impl_t baselines[] = {
        {"memkind", setup_memkind, run, teardown},
        {"malloc", setup_malloc, run, teardown},
    };
    static const struct {
        const char *name;
        size_t size;
    } cases[] = {
        {"bound alloc+free 64 B", 64},
        {"bound alloc+free 4 KiB", (size_t)4 << 10},
        {"bound alloc+free 256 KiB", (size_t)256 << 10},
        {"bound working set 16 B-4 KiB", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        numa_arg_t arg = {cases[i].size};
        hm_bench_case(b, cases[i].name, &arg, 1, &subject, baselines,
                      sizeof baselines / sizeof baselines[0]);
    }
    return hm_bench_finish(b);
}
