/* hetmem IPC test: exports and imports leave a pool's fast entries alone.
 * SPDX-License-Identifier: MIT
 *
 * For the native and the jemalloc pool over the OS provider in shared mode:
 *  - an export that is got and put leaves hm_pool_free on the pool's own
 *    entry; while a handle is outstanding the entry checks frees, and the
 *    pool's own entry is back after the last put;
 *  - mappings opened through the pool leave the entry alone, and
 *    hm_pool_free of one is refused (HM_ERROR_INVALID_ARGUMENT) with a log
 *    line that names hm_ipc_close, the mapping intact;
 *  - more exports held than the pool has hold slots: every freed exported
 *    block still waits for its put, other blocks are freed at once. */
#include "harness.h"

#include "pool_internal.h"

#include <hetmem/hetmem.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_close_lines;
static void sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    (void)level;
    if (strstr(line, "hm_ipc_close")) g_close_lines++;
}

static hm_pool_t *make_pool(int jemalloc) {
    hm_os_params_t *p;
    hm_provider_t *prov;
    hm_pool_t *pool = NULL;
    REQUIRE_OK(hm_os_params_create(&p));
    REQUIRE_OK(hm_os_params_set_visibility(p, HM_OS_SHARED));
    REQUIRE_OK(hm_os_provider_create(p, &prov));
    hm_os_params_destroy(p);
    hm_result_t r;
    if (!jemalloc) r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool);
#ifdef HM_TEST_JEMALLOC
    else r = hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool);
#else
    else r = HM_ERROR_NOT_SUPPORTED;
#endif
    if (r != HM_SUCCESS) {
        hm_provider_destroy(prov);
        return NULL;
    }
    return pool;
}

static hm_pool_free_entry_t entry(hm_pool_t *pool) { return atomic_load(&pool->free_entry); }

/* A forked exporter: one 64 KiB allocation exported, its handle written to
 * `out`, then alive until `in` closes. */
static void exporter(int out, int in) {
    hm_pool_t *pool = make_pool(0);
    void *m = pool ? hm_pool_malloc(pool, 65536) : NULL;
    hm_ipc_handle_t *h;
    size_t len;
    if (!m || hm_ipc_get(m, &h, &len)) _exit(2);
    memset(m, 0x3c, 65536);
    if (write(out, h, len) != (ssize_t)len) _exit(3);
    char c;
    (void)!read(in, &c, 1);
    _exit(0);
}

static void run(int jemalloc) {
    hm_pool_t *pool = make_pool(jemalloc);
    if (!pool) {
        printf("jemalloc pool not built: skipped\n");
        return;
    }
    hm_test_set_context(jemalloc ? "jemalloc" : "native");
    hm_pool_free_entry_t base = entry(pool);

    /* get + put: the entry is the pool's own again. */
    void *a = hm_pool_malloc(pool, 64);
    REQUIRE(a != NULL);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(a, &h, &len));
    CHECK(entry(pool) != base); /* a handle outstanding: frees are checked */
    void *other = hm_pool_malloc(pool, 64);
    CHECK_OK(hm_pool_free(pool, other)); /* not exported: freed at once */
    CHECK_OK(hm_ipc_put(h));
    CHECK(entry(pool) == base);
    CHECK_OK(hm_pool_free(pool, a));
    CHECK(entry(pool) == base);

    /* Opened mappings leave the entry alone; freeing one is refused. */
    int hp[2], go[2];
    REQUIRE(pipe(hp) == 0 && pipe(go) == 0);
    fflush(stdout);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        close(hp[0]);
        close(go[1]);
        exporter(hp[1], go[0]);
    }
    close(hp[1]);
    close(go[0]);
    unsigned char buf[4096];
    ssize_t n = read(hp[0], buf, sizeof buf);
    REQUIRE(n > 0);
    void *m = NULL;
    REQUIRE_OK(hm_ipc_open(pool, (const hm_ipc_handle_t *)buf, (size_t)n, &m));
    CHECK(entry(pool) == base);
    g_close_lines = 0;
    CHECK_RES(hm_pool_free(pool, m), HM_ERROR_INVALID_ARGUMENT);
    CHECK_MSG(g_close_lines == 1, "%d log lines name hm_ipc_close", g_close_lines);
    CHECK_RES(hm_free(m), HM_ERROR_INVALID_ARGUMENT);
    CHECK(((unsigned char *)m)[100] == 0x3c); /* still mapped, intact */
    CHECK_OK(hm_ipc_close(m));
    close(go[1]);
    waitpid(child, NULL, 0);
    close(hp[0]);

    /* More held exports than hold slots: each in a range of its own. */
    enum { NH = HM_POOL_HOLD_SLOTS + 4 };
    void *b[NH];
    hm_ipc_handle_t *hb[NH];
    for (int i = 0; i < NH; i++) {
        b[i] = hm_pool_malloc(pool, (size_t)1 << 20);
        REQUIRE(b[i] != NULL);
        REQUIRE_OK(hm_ipc_get(b[i], &hb[i], &len));
    }
    CHECK(atomic_load(&pool->holds_over) > 0);
    for (int i = 0; i < NH; i++) {
        CHECK_OK(hm_pool_free(pool, b[i]));
        CHECK_RES(hm_pool_free(pool, b[i]), HM_ERROR_DOUBLE_FREE); /* waits for its put */
    }
    void *c = hm_pool_malloc(pool, 200);
    CHECK(c != NULL);
    CHECK_OK(hm_pool_free(pool, c));
    for (int i = 0; i < NH; i++) CHECK_OK(hm_ipc_put(hb[i]));
    CHECK(entry(pool) == base);
    CHECK_EQ(atomic_load(&pool->holds_over), 0);
    for (int i = 0; i < HM_POOL_HOLD_SLOTS; i++) CHECK_EQ(atomic_load(&pool->holds[i].base), 0);
    hm_test_set_context("");
    CHECK_OK(hm_pool_destroy(pool));
}

int main(void) {
    hm_log_set_sink(sink, NULL);
    hm_log_set_level(HM_LOG_ERROR);
    run(0);
    run(1);
    hm_log_set_sink(NULL, NULL);
    return hm_test_finish();
}
