/* hetmem benchmark: what exporting and importing cost the allocations
 * around them. SPDX-License-Identifier: MIT
 *
 * Cases: hm_pool_malloc + hm_pool_free pairs of 64 B on a native and a
 * jemalloc pool over the OS provider in shared mode (ns per pair):
 *   subject "after export"  the pool had one allocation exported and put
 *                           (hm_ipc_get + hm_ipc_put) before the run
 *   "no export"             a pool that never met IPC
 *   "1000 opened"           a pool through which 1000 mappings of another
 *                           process's memory are open during the run
 *   "export held"           a pool with one export whose handle is not put:
 *                           its frees are checked (a block holding an
 *                           exported pointer must wait for the last put)
 * The first three are expected within a few percent of each other. The
 * opened mappings come from a forked exporter (proxy pool, shared OS
 * provider, 4 KiB allocations), moved by pidfd_getfd.
 *
 * Then the caches with every entry in use (ns per call, one implementation
 * per count, the 10^2 one the subject):
 *   "first get, N held"    hm_ipc_get of a new allocation (malloc, get, put,
 *                          free) while N exports of the same pool are held,
 *                          the export cache bound N: each get must look for
 *                          an entry to evict among N held ones
 *   "open miss, N open"    hm_ipc_open (a miss: descriptor fetched, mapped)
 *                          + hm_ipc_close of one of 64 handles in turn while
 *                          N mappings are open, the cache bound N: each open
 *                          must look for a mapping to evict
 * Flat (within 1.2x) from 10^2 to 10^4 means neither walks its entries. */
#include "harness.h"

#include <hetmem/hetmem.h>
#ifdef HM_BENCH_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { NOPEN = 1000, HMAX = 256, NCYCLE = 64, NBIG = 10000 };
typedef enum { K_NATIVE, K_JEMALLOC } kind_t;
typedef enum { S_NONE, S_AFTER, S_OPENED, S_HELD } state_t;
typedef struct {
    kind_t kind;
} fp_arg_t;

static unsigned char g_handles[NBIG + NCYCLE][HMAX];
static size_t g_len[NBIG + NCYCLE];
static int g_have_handles;

static hm_pool_t *make_pool(kind_t k) {
    hm_os_params_t *p;
    hm_provider_t *prov;
    hm_pool_t *pool = NULL;
    if (hm_os_params_create(&p)) return NULL;
    hm_os_params_set_visibility(p, HM_OS_SHARED);
    hm_result_t r = hm_os_provider_create(p, &prov);
    hm_os_params_destroy(p);
    if (r) return NULL;
    if (k == K_NATIVE) r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool);
#ifdef HM_BENCH_JEMALLOC
    else r = hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool);
#else
    else r = HM_ERROR_NOT_SUPPORTED;
#endif
    if (r) {
        hm_provider_destroy(prov);
        return NULL;
    }
    return pool;
}

typedef struct {
    hm_pool_t *pool;
    void *opened[NOPEN];
    size_t nopened;
    hm_ipc_handle_t *held;
} fp_ctx_t;

static int setup_state(const void *arg, void **ctx, state_t st) {
    const fp_arg_t *a = arg;
    fp_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->pool = make_pool(a->kind);
    if (!c->pool) {
        free(c);
        return a->kind == K_JEMALLOC ? HM_BENCH_SKIP : 1;
    }
    if (st == S_AFTER || st == S_HELD) {
        void *p = hm_pool_malloc(c->pool, 4096);
        hm_ipc_handle_t *h;
        size_t len;
        if (!p || hm_ipc_get(p, &h, &len)) return 1;
        if (st == S_AFTER) hm_ipc_put(h);
        else c->held = h;
    }
    if (st == S_OPENED) {
        if (!g_have_handles) return HM_BENCH_SKIP;
        for (size_t i = 0; i < NOPEN; i++) {
            if (hm_ipc_open(c->pool, (const hm_ipc_handle_t *)g_handles[i], g_len[i],
                            &c->opened[i]) != HM_SUCCESS)
                return 1;
            c->nopened++;
        }
    }
    *ctx = c;
    return 0;
}
static int setup_none(const void *a, void **c) { return setup_state(a, c, S_NONE); }
static int setup_after(const void *a, void **c) { return setup_state(a, c, S_AFTER); }
static int setup_opened(const void *a, void **c) { return setup_state(a, c, S_OPENED); }
static int setup_held(const void *a, void **c) { return setup_state(a, c, S_HELD); }

static int run_pairs(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    hm_pool_t *pool = ((fp_ctx_t *)ctx)->pool;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = hm_pool_malloc(pool, 64);
        hm_bench_escape(p);
        if (hm_pool_free(pool, p) != HM_SUCCESS) return 1;
    }
    return 0;
}

static void teardown(void *ctx) {
    fp_ctx_t *c = ctx;
    for (size_t i = 0; i < c->nopened; i++) hm_ipc_close(c->opened[i]);
    if (c->held) hm_ipc_put(c->held);
    hm_pool_destroy(c->pool);
    free(c);
}

/* The exporter: NOPEN allocations exported, handles written to `out`, then
 * alive until `in` closes. */
static int exporter(int out, int in) {
    hm_os_params_t *p;
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_os_params_create(&p)) return 2;
    hm_os_params_set_visibility(p, HM_OS_SHARED);
    if (hm_os_provider_create(p, &prov) || hm_proxy_pool_create(prov, 0, &pool)) return 3;
    hm_os_params_destroy(p);
    for (size_t i = 0; i < NBIG + NCYCLE; i++) {
        void *m = hm_pool_malloc(pool, 4096);
        hm_ipc_handle_t *h;
        size_t len;
        if (!m || hm_ipc_get(m, &h, &len) || len > HMAX) return 4;
        uint32_t l = (uint32_t)len;
        if (write(out, &l, sizeof l) != sizeof l || write(out, h, len) != (ssize_t)len) return 5;
    }
    char c;
    (void)!read(in, &c, 1);
    return 0;
}

/* ---- the caches with N entries in use ---- */
typedef struct {
    size_t n;
} held_arg_t;
typedef struct {
    hm_pool_t *pool;
    void **blk;
    hm_ipc_handle_t **h;
    void **opened;
    size_t n;
    uint64_t next;
} held_ctx_t;

static int held_setup(const void *arg, void **ctx) {
    size_t n = ((const held_arg_t *)arg)->n;
    held_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->n = n;
    c->pool = make_pool(K_NATIVE);
    c->blk = calloc(n, sizeof(void *));
    c->h = calloc(n, sizeof(void *));
    if (!c->pool || !c->blk || !c->h) return 1;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        c->blk[i] = hm_pool_malloc(c->pool, 4096);
        if (!c->blk[i] || hm_ipc_get(c->blk[i], &c->h[i], &len)) return 1;
    }
    *ctx = c;
    return 0;
}
static int held_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    held_ctx_t *c = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        void *p = hm_pool_malloc(c->pool, 4096);
        hm_ipc_handle_t *h;
        size_t len;
        if (!p || hm_ipc_get(p, &h, &len) || hm_ipc_put(h)) return 1;
        if (hm_pool_free(c->pool, p)) return 1;
    }
    return 0;
}
static void held_teardown(void *ctx) {
    held_ctx_t *c = ctx;
    for (size_t i = 0; i < c->n; i++) {
        if (c->h[i]) hm_ipc_put(c->h[i]);
        if (c->blk[i]) hm_pool_free(c->pool, c->blk[i]);
    }
    hm_pool_destroy(c->pool);
    free(c->blk);
    free(c->h);
    free(c);
}

static int open_setup(const void *arg, void **ctx) {
    if (!g_have_handles) return HM_BENCH_SKIP;
    size_t n = ((const held_arg_t *)arg)->n;
    held_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->n = n;
    c->pool = make_pool(K_NATIVE);
    c->opened = calloc(n, sizeof(void *));
    if (!c->pool || !c->opened) return 1;
    hm_ipc_set_cache_limits(n, 0);
    for (size_t i = 0; i < n; i++)
        if (hm_ipc_open(c->pool, (const hm_ipc_handle_t *)g_handles[i], g_len[i],
                        &c->opened[i]))
            return 1;
    *ctx = c;
    return 0;
}
static int open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    held_ctx_t *c = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        size_t k = NBIG + (size_t)(c->next++ % NCYCLE);
        void *p;
        if (hm_ipc_open(c->pool, (const hm_ipc_handle_t *)g_handles[k], g_len[k], &p))
            return 1;
        if (hm_ipc_close(p)) return 1;
    }
    return 0;
}
static void open_teardown(void *ctx) {
    held_ctx_t *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        if (c->opened[i]) hm_ipc_close(c->opened[i]);
    hm_pool_destroy(c->pool);
    hm_ipc_set_cache_limits(4096, 0);
    free(c->opened);
    free(c);
}

static int read_full(int fd, void *b, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)b + got, n - got);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

int main(int argc, char **argv) {
    int rc;
    hm_bench_t *b = hm_bench_create("ipc_fastpath", &argc, argv, &rc);
    if (!b) return rc;
    int hp[2], go[2];
    pid_t child = -1;
    if (pipe(hp) == 0 && pipe(go) == 0) {
        fflush(stdout);
        child = fork();
        if (child == 0) {
            close(hp[0]);
            close(go[1]);
            _exit(exporter(hp[1], go[0]));
        }
        close(hp[1]);
        close(go[0]);
        g_have_handles = child > 0;
        for (size_t i = 0; g_have_handles && i < NBIG + NCYCLE; i++) {
            uint32_t l;
            if (read_full(hp[0], &l, sizeof l) || l > HMAX || read_full(hp[0], g_handles[i], l))
                g_have_handles = 0;
            else g_len[i] = l;
        }
    }
    if (!g_have_handles) fprintf(stderr, "bench_ipc_fastpath: no exporter: '1000 opened' skipped\n");

    static const hm_bench_impl_t subject = {"after export", setup_after, run_pairs, teardown};
    static const hm_bench_impl_t baselines[] = {
        {"no export", setup_none, run_pairs, teardown},
        {"1000 opened", setup_opened, run_pairs, teardown},
        {"export held", setup_held, run_pairs, teardown},
    };
    fp_arg_t nat = {K_NATIVE}, je = {K_JEMALLOC};
    hm_bench_case(b, "malloc+free 64 B, native pool", &nat, 1, &subject, baselines, 3);
    hm_bench_case(b, "malloc+free 64 B, jemalloc pool", &je, 1, &subject, baselines, 3);

    /* One argument per implementation: the harness passes the case's arg
     * to all, so the counts are three cases' worth of one implementation
     * each, compared through the table's rows. */
    static const held_arg_t h2 = {100}, h3 = {1000}, h4 = {NBIG};
    static const hm_bench_impl_t held_impl = {"hetmem", held_setup, held_run, held_teardown};
    static const hm_bench_impl_t open_impl = {"hetmem", open_setup, open_run, open_teardown};
    hm_bench_case(b, "first get, 100 held", &h2, 1, &held_impl, NULL, 0);
    hm_bench_case(b, "first get, 1000 held", &h3, 1, &held_impl, NULL, 0);
    hm_bench_case(b, "first get, 10000 held", &h4, 1, &held_impl, NULL, 0);
    hm_bench_case(b, "open miss, 100 open", &h2, 1, &open_impl, NULL, 0);
    hm_bench_case(b, "open miss, 1000 open", &h3, 1, &open_impl, NULL, 0);
    hm_bench_case(b, "open miss, 10000 open", &h4, 1, &open_impl, NULL, 0);
    rc = hm_bench_finish(b);
    if (child > 0) {
        close(go[1]);
        waitpid(child, NULL, 0);
    }
    return rc;
}
