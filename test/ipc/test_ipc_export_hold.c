/* hetmem IPC test: memory freed while exported is not handed out again
 * before the last hm_ipc_put() (ipc.h), for every pool over every provider
 * with IPC, at every tier of sizes. SPDX-License-Identifier: MIT
 *
 * For each pool (proxy, native, jemalloc where built) over each provider
 * (OS in shared mode, file) and each size (tiny, small classes, the native
 * pool's size-class limit and one past it, large, its large threshold and
 * one past it: huge), and for the exported pointer at the block's start
 * and inside it:
 *  - an importer (a forked child with a pool of its own) opens the handle
 *    and checks it sees the exporter's pattern;
 *  - the exporter frees the block: success; a second free is
 *    HM_ERROR_DOUBLE_FREE; allocations of the same and nearby sizes never
 *    overlap the freed bytes; a realloc of another exported block moves it;
 *  - the importer sees the pattern intact after the exporter has filled
 *    every new block with other bytes;
 *  - after the last put the block is the pool's again (it is free: the
 *    pool no longer knows it, or hands its bytes out again).
 * Fails on a pool that reuses a freed exported block (the native pool's
 * large cache, jemalloc's arena) or loses its free. */
#include "harness.h"

#include <hetmem/hetmem.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define LARGE_THRESHOLD (4 * MIB) /* the native pool's, set in make_pool */

static char g_path[128];

typedef enum { PROV_OS, PROV_FILE, PROV_N } prov_kind_t;
static prov_kind_t g_prov; /* of the case running */
typedef enum { POOL_PROXY, POOL_NATIVE, POOL_JEMALLOC, POOL_N } pool_kind_t;
static const char *prov_name[] = {"os-shared", "file"};
static const char *pool_name[] = {"proxy", "native", "jemalloc"};

static hm_result_t make_provider(prov_kind_t k, hm_provider_t **out) {
    if (k == PROV_OS) {
        hm_os_params_t *p;
        hm_result_t r = hm_os_params_create(&p);
        if (r) return r;
        r = hm_os_params_set_visibility(p, HM_OS_SHARED);
        if (!r) r = hm_os_provider_create(p, out);
        hm_os_params_destroy(p);
        return r;
    }
    static int n;
    snprintf(g_path, sizeof(g_path), "/tmp/hm_export_hold_%d_%d", (int)getpid(), n++);
    return hm_file_provider_create(g_path, out);
}

/* HM_ERROR_NOT_SUPPORTED: the pool is not built (jemalloc). */
static hm_result_t make_pool(pool_kind_t k, hm_provider_t *prov, hm_pool_t **out) {
    switch (k) {
    case POOL_PROXY: return hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    case POOL_NATIVE: {
        /* The large threshold at 4 MiB rather than 32: the same tiers
         * (large cached, huge past it) with an eighth of the memory to
         * fault in, which dominated this test under the sanitizers. */
        hm_native_params_t *np;
        hm_result_t r = hm_native_params_create(&np);
        if (r) return r;
        r = hm_native_params_set_large_threshold(np, LARGE_THRESHOLD);
        if (!r) r = hm_native_pool_create(prov, np, HM_POOL_FLAG_OWN_PROVIDER, out);
        hm_native_params_destroy(np);
        return r;
    }
    default:
#ifdef HM_TEST_JEMALLOC
        return hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, out);
#else
        (void)prov;
        (void)out;
        return HM_ERROR_NOT_SUPPORTED;
#endif
    }
}

static void fill(void *p, size_t n, unsigned char seed) {
    unsigned char *c = p;
    for (size_t i = 0; i + 1 < n; i += 512) c[i] = (unsigned char)(seed + i / 512);
    c[n - 1] = seed;
}
static int intact(const void *p, size_t n, unsigned char seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i + 1 < n; i += 512)
        if (c[i] != (unsigned char)(seed + i / 512)) return 0;
    return c[n - 1] == seed;
}
static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

/* ---- the importer: a forked child that opens the handle in a pool of its
 * own and checks the pattern on each request of the parent ---- */
typedef struct importer {
    pid_t pid;
    int to, from; /* pipes: commands to the child, answers from it */
} importer_t;

static int rd(int fd, void *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)b + got, n - got);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}
static int wr(int fd, const void *b, size_t n) { return write(fd, b, n) == (ssize_t)n ? 0 : -1; }

/* Child: open(handle) once, then answer 'c' (check seed over n bytes at
 * the opened pointer) until 'q'. Answers 1 (intact), 0, or -1 (open failed). */
static void importer_main(int in, int out, const void *handle, size_t hlen, size_t n,
                          unsigned char seed) {
    alarm(HM_TEST_HANG_SECONDS);
    hm_provider_t *prov;
    hm_pool_t *pool;
    int res = -1;
    void *p = NULL;
    /* A pool of the handle's provider family, of the importer's own. */
    if (make_provider(g_prov, &prov) == HM_SUCCESS &&
        hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) == HM_SUCCESS &&
        hm_ipc_open(pool, handle, hlen, &p) == HM_SUCCESS)
        res = 1;
    if (g_prov == PROV_FILE) unlink(g_path);
    for (;;) {
        char c;
        if (rd(in, &c, 1)) break;
        if (c == 'q') break;
        int a = res < 0 ? -1 : intact(p, n, seed);
        if (wr(out, &a, sizeof(a))) break;
    }
    _exit(0);
}

static int importer_start(importer_t *im, const void *handle, size_t hlen, size_t n,
                          unsigned char seed) {
    /* The handle's bytes travel as a copy, as they would over a socket: in
     * the child the export cache (and so *handle) is the parent's, dropped. */
    static unsigned char copy[4096];
    if (hlen > sizeof(copy)) return -1;
    memcpy(copy, handle, hlen);
    handle = copy;
    int a[2], b[2];
    if (pipe(a) || pipe(b)) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        importer_main(a[0], b[1], handle, hlen, n, seed);
    }
    close(a[0]);
    close(b[1]);
    im->pid = pid;
    im->to = a[1];
    im->from = b[0];
    return 0;
}
static int importer_check(importer_t *im) {
    int a = -2;
    if (wr(im->to, "c", 1) || rd(im->from, &a, sizeof(a))) return -2;
    return a;
}
static void importer_stop(importer_t *im) {
    (void)wr(im->to, "q", 1);
    close(im->to);
    close(im->from);
    int st;
    waitpid(im->pid, &st, 0);
}

/* ---- one case ---- */

static void run_case(hm_pool_t *pool, size_t size, int interior, int with_importer) {
    unsigned char seed = (unsigned char)(size * 7 + (size_t)interior);
    char *p = hm_pool_malloc(pool, size);
    REQUIRE(p != NULL);
    fill(p, size, seed);
    size_t off = interior ? size / 2 : 0;
    hm_ipc_handle_t *h;
    size_t hlen;
    REQUIRE_OK(hm_ipc_get(p + off, &h, &hlen));
    importer_t im = {0};
    int imp = with_importer && importer_start(&im, h, hlen, size - off, (unsigned char)0) == 0;
    if (imp) {
        /* The importer sees the exporter's bytes from off on. */
        fill(p + off, size - off, 0);
        CHECK_EQ(importer_check(&im), 1);
    } else {
        fill(p + off, size - off, 0);
    }

    CHECK_OK(hm_pool_free(pool, p));
    CHECK_RES(hm_pool_free(pool, p), HM_ERROR_DOUBLE_FREE);
    CHECK_RES(hm_free(p), HM_ERROR_DOUBLE_FREE);

    /* New blocks of this size and of its neighbours never reuse the bytes. */
    enum { N = 24 };
    void *q[3 * N];
    size_t qs[3 * N];
    int nq = 0, overlap = 0;
    size_t sizes[3] = {size, size > 8 ? size - size / 8 : size, size + size / 8};
    int per = size >= LARGE_THRESHOLD ? 2 : N;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < per; i++) {
            void *b = hm_pool_malloc(pool, sizes[s]);
            if (!b) break;
            overlap |= overlaps(b, sizes[s], p, size);
            fill(b, sizes[s], (unsigned char)(seed + 1)); /* the exporter's new data */
            qs[nq] = sizes[s];
            q[nq++] = b;
        }
    CHECK_MSG(!overlap, "size %zu%s: a block freed while exported was handed out again",
              size, interior ? " (interior export)" : "");
    CHECK_MSG(intact(p + off, size - off, 0), "size %zu: the freed exported bytes changed", size);
    if (imp) CHECK_EQ(importer_check(&im), 1);

    /* realloc of an exported block moves it and keeps the old bytes held. */
    char *r = hm_pool_malloc(pool, size);
    REQUIRE(r != NULL);
    fill(r, size, (unsigned char)(seed + 2));
    hm_ipc_handle_t *hr;
    size_t hrlen;
    REQUIRE_OK(hm_ipc_get(r, &hr, &hrlen));
    char *r2 = hm_pool_realloc(pool, r, size + size / 4 + 1);
    CHECK(r2 != NULL);
    if (r2) {
        CHECK(r2 != r);
        CHECK(intact(r2, size, (unsigned char)(seed + 2)));
        void *b = hm_pool_malloc(pool, size);
        CHECK(b == NULL || !overlaps(b, size, r, size));
        if (b) hm_pool_free(pool, b);
        CHECK_OK(hm_pool_free(pool, r2));
    }
    CHECK_OK(hm_ipc_put(hr));

    if (imp) importer_stop(&im);
    for (int i = 0; i < nq; i++) CHECK_OK(hm_pool_free(pool, q[i]));
    (void)qs;

    /* The last put gives the block back to the pool: it is free now. */
    CHECK_OK(hm_ipc_put(h));
    CHECK_RES(hm_ipc_put(h), HM_ERROR_INVALID_HANDLE);
    size_t us = hm_pool_malloc_usable_size(hm_pool_by_ptr(p) ? pool : pool, p);
    int reused = us == 0;
    void *again[N];
    int na = 0;
    for (; na < N && !reused; na++) {
        again[na] = hm_pool_malloc(pool, size);
        if (!again[na]) break;
        reused |= overlaps(again[na], size, p, size);
    }
    for (int i = 0; i < na; i++)
        if (again[i]) hm_pool_free(pool, again[i]);
    CHECK_MSG(reused, "size %zu: the block freed while exported never came back after the "
              "last put", size);
}

/* A pool destroyed with a handle outstanding, its provider shared with a
 * second pool: the exported range stays allocated in the provider until
 * the last put, so the second pool's blocks never take its bytes (the
 * importer keeps seeing the exporter's); after the put the range is the
 * provider's again. */
static void run_destroy_case(prov_kind_t vk, size_t size) {
    hm_provider_t *prov;
    g_prov = vk;
    REQUIRE_OK(make_provider(vk, &prov));
    char path[sizeof(g_path)];
    memcpy(path, g_path, sizeof(path));
    hm_pool_t *a, *b;
    REQUIRE_OK(hm_proxy_pool_create(prov, 0, &a));
    REQUIRE_OK(hm_native_pool_create(prov, NULL, 0, &b));
    char ctx[96];
    snprintf(ctx, sizeof(ctx), "pool destroyed while exported, %s, %zu bytes", prov_name[vk],
             size);
    hm_test_set_context(ctx);
    char *p = hm_pool_malloc(a, size);
    REQUIRE(p != NULL);
    fill(p, size, 0);
    hm_ipc_handle_t *h;
    size_t hlen;
    REQUIRE_OK(hm_ipc_get(p, &h, &hlen));
    importer_t im = {0};
    REQUIRE(importer_start(&im, h, hlen, size, 0) == 0);
    CHECK_EQ(importer_check(&im), 1);
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_level(HM_LOG_OFF); /* the destroy warns about the outstanding handle */
    CHECK_OK(hm_pool_destroy(a));
    hm_log_set_level(old);
    enum { NB = 16 };
    void *q[NB];
    for (int i = 0; i < NB; i++) {
        q[i] = hm_pool_malloc(b, size);
        if (q[i]) fill(q[i], size, 0x77);
    }
    CHECK_EQ(importer_check(&im), 1);
    importer_stop(&im);
    for (int i = 0; i < NB; i++)
        if (q[i]) CHECK_OK(hm_pool_free(b, q[i]));
    CHECK_OK(hm_ipc_put(h)); /* the range goes back to the provider */
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(b, &st));
    CHECK_OK(hm_pool_destroy(b));
    CHECK_OK(hm_provider_destroy(prov));
    if (vk == PROV_FILE) unlink(path);
    hm_test_set_context("");
}

int main(void) {
    for (int vk = 0; vk < PROV_N; vk++) {
        run_destroy_case((prov_kind_t)vk, 64 << 10);
        run_destroy_case((prov_kind_t)vk, 2 << 20);
    }
    static const size_t sizes[] = {
        8, 64, 4096, 32 << 10,          /* small classes, up to the size-class limit */
        (32 << 10) + 1, 1 * MIB,        /* large */
        LARGE_THRESHOLD, LARGE_THRESHOLD + 4096, /* the large threshold, and huge past it */
    };
    int ran = 0;
    for (int pk = 0; pk < POOL_N; pk++)
        for (int vk = 0; vk < PROV_N; vk++) {
            hm_provider_t *prov;
            hm_pool_t *pool;
            g_prov = (prov_kind_t)vk;
            REQUIRE_OK(make_provider(g_prov, &prov));
            char path[sizeof(g_path)];
            memcpy(path, g_path, sizeof(path));
            hm_result_t r = make_pool((pool_kind_t)pk, prov, &pool);
            if (r == HM_ERROR_NOT_SUPPORTED) {
                hm_provider_destroy(prov);
                printf("%s pool not built: skipped\n", pool_name[pk]);
                continue;
            }
            REQUIRE_OK(r);
            char ctx[96];
            for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                for (int interior = 0; interior < 2; interior++) {
                    snprintf(ctx, sizeof(ctx), "%s over %s, %zu bytes%s", pool_name[pk],
                             prov_name[vk], sizes[i], interior ? ", interior" : "");
                    hm_test_set_context(ctx);
                    /* An importer for one size of each tier keeps the run short. */
                    int with_importer = !interior && (i == 1 || i == 4 || i == 7);
                    run_case(pool, sizes[i], interior, with_importer);
                    ran++;
                }
            hm_test_set_context("");
            CHECK_OK(hm_pool_destroy(pool));
            if (vk == PROV_FILE) unlink(path);
        }
    printf("%d cases\n", ran);
    return hm_test_finish();
}
