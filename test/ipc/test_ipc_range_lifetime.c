/* hetmem IPC test: a provider range freed while exported is given back to
 * its provider exactly once, after the export's last put — with and
 * without a fork in between — for every provider with IPC.
 * SPDX-License-Identifier: MIT
 *
 * The provider is the fault provider (test/common) around the OS provider
 * in shared mode and around the file provider: it records every call
 * (frees, puts, exports held). For each:
 *  - a proxy pool (one provider range per block): free of an exported
 *    block, then gets and puts; the range's provider free comes at the last
 *    put, once, after the provider put;
 *  - every pool (proxy, native, jemalloc): the pool destroyed with a handle
 *    outstanding, its provider outliving it: no provider free or put of
 *    the exported range until the last put, then one of each;
 *  - a fork while such a range is held: the child gives the range back to
 *    its own provider (once) at its next IPC call; the parent's counts are
 *    untouched by the child, and its last put frees it once. */
#include "conformance.h"

#include <hetmem/hetmem.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SZ ((size_t)256 << 10)

static char g_path[128];

static hm_provider_t *make_fault(int file) {
    hm_provider_t *inner;
    if (file) {
        static int n;
        snprintf(g_path, sizeof g_path, "/tmp/hm_range_life_%d_%d", (int)getpid(), n++);
        REQUIRE_OK(hm_file_provider_create(g_path, &inner));
    } else {
        REQUIRE_OK(hm_test_os_provider(HM_OS_SHARED, HM_OS_PROT_READ | HM_OS_PROT_WRITE, &inner));
    }
    hm_fault_params_t fp = {.inner = inner, .own_inner = 1};
    hm_provider_t *f;
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops_for(inner, 0), &fp, &f));
    return f;
}

static hm_pool_t *make_pool(int pk, hm_provider_t *prov) {
    hm_pool_t *pool = NULL;
    hm_result_t r;
    if (pk == 0) r = hm_proxy_pool_create(prov, 0, &pool);
    else if (pk == 1) r = hm_native_pool_create(prov, NULL, 0, &pool);
#ifdef HM_TEST_JEMALLOC
    else r = hm_jemalloc_pool_create(prov, NULL, 0, &pool);
#else
    else r = HM_ERROR_NOT_SUPPORTED;
#endif
    return r == HM_SUCCESS ? pool : NULL;
}

#define FREES(f) hm_fault_provider_succeeded(f, HM_FAULT_FREE)
#define PUTS(f) hm_fault_provider_succeeded(f, HM_FAULT_IPC_PUT)

static void quiet(int on) {
    static hm_log_level_t old;
    if (on) {
        old = hm_log_get_level();
        hm_log_set_level(HM_LOG_OFF);
    } else {
        hm_log_set_level(old);
    }
}

/* Proxy pool: the block's free is the range's; the last put gives it back. */
static void block_free_case(int file) {
    hm_test_set_context(file ? "proxy, block freed while exported, file"
                             : "proxy, block freed while exported, os-shared");
    hm_provider_t *f = make_fault(file);
    hm_pool_t *pool = make_pool(0, f);
    REQUIRE(pool);
    void *p = hm_pool_malloc(pool, SZ);
    REQUIRE(p);
    hm_ipc_handle_t *h1, *h2;
    size_t l;
    REQUIRE_OK(hm_ipc_get(p, &h1, &l));
    REQUIRE_OK(hm_ipc_get(p, &h2, &l)); /* two gets */
    long f0 = FREES(f), p0 = PUTS(f);
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_EQ(FREES(f), f0); /* held */
    CHECK_OK(hm_ipc_put(h1));
    CHECK_EQ(FREES(f), f0); /* a get still outstanding */
    CHECK_EQ(PUTS(f), p0);
    CHECK_OK(hm_ipc_put(h2)); /* the last: provider put, then the range */
    CHECK_EQ(PUTS(f), p0 + 1);
    CHECK_EQ(FREES(f), f0 + 1);
    CHECK_RES(hm_ipc_put(h2), HM_ERROR_INVALID_HANDLE);
    CHECK_EQ(FREES(f), f0 + 1);
    CHECK_EQ(hm_fault_provider_exports(f), 0);
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_EQ(hm_fault_provider_live(f), 0);
    CHECK_EQ(hm_fault_provider_misuse(f), 0);
    CHECK_OK(hm_provider_destroy(f));
    if (file) unlink(g_path);
}

/* The pool destroyed with a handle outstanding; with fork: a child forked
 * while the range is held. */
static void destroy_case(int pk, int file, int with_fork) {
    char ctx[96];
    static const char *pn[] = {"proxy", "native", "jemalloc"};
    snprintf(ctx, sizeof ctx, "%s, destroyed while exported, %s%s", pn[pk],
             file ? "file" : "os-shared", with_fork ? ", fork" : "");
    hm_test_set_context(ctx);
    hm_provider_t *f = make_fault(file);
    hm_pool_t *pool = make_pool(pk, f);
    if (!pool) {
        hm_provider_destroy(f);
        return;
    }
    void *p = hm_pool_malloc(pool, SZ);
    REQUIRE(p);
    hm_ipc_handle_t *h;
    size_t l;
    REQUIRE_OK(hm_ipc_get(p, &h, &l));
    CHECK_OK(hm_pool_free(pool, p)); /* deferred: the block holds the export */
    long live0 = hm_fault_provider_live(f);
    quiet(1);
    CHECK_OK(hm_pool_destroy(pool)); /* warns about the outstanding handle */
    quiet(0);
    /* Every range went back but the exported one. */
    CHECK_EQ(hm_fault_provider_live(f), 1);
    CHECK(live0 >= 1);
    CHECK_EQ(hm_fault_provider_exports(f), 1);
    long f0 = FREES(f), p0 = PUTS(f);
    if (with_fork) {
        fflush(stdout);
        pid_t c = fork();
        REQUIRE(c >= 0);
        if (c == 0) {
            alarm(HM_TEST_HANG_SECONDS);
            /* The parent's handle is not the child's; the call settles the
             * range the parent held: given back to this child's provider. */
            int bad = hm_ipc_put(h) != HM_ERROR_INVALID_HANDLE;
            bad |= (FREES(f) != f0 + 1) << 1;
            bad |= (PUTS(f) != p0) << 2; /* the export is the parent's: no put */
            bad |= (hm_fault_provider_live(f) != 0) << 3;
            _exit(bad);
        }
        int st;
        REQUIRE(waitpid(c, &st, 0) == c);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
        CHECK_EQ(FREES(f), f0); /* the child's counts are its own */
    }
    CHECK_EQ(FREES(f), f0);
    CHECK_OK(hm_ipc_put(h)); /* the last put: provider put, then the range */
    CHECK_EQ(PUTS(f), p0 + 1);
    CHECK_EQ(FREES(f), f0 + 1);
    CHECK_EQ(hm_fault_provider_live(f), 0);
    CHECK_EQ(hm_fault_provider_exports(f), 0);
    CHECK_EQ(hm_fault_provider_misuse(f), 0);
    CHECK_OK(hm_provider_destroy(f));
    if (file) unlink(g_path);
}

int main(void) {
    for (int file = 0; file < 2; file++) {
        block_free_case(file);
        for (int pk = 0; pk < 3; pk++)
            for (int fk = 0; fk < 2; fk++) destroy_case(pk, file, fk);
    }
    hm_test_set_context("");
    return hm_test_finish();
}
