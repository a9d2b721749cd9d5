/* hetmem IPC test: fork() after every kind of export, put or not.
 * SPDX-License-Identifier: MIT
 *
 * For each pool (proxy, native, jemalloc where built) over each provider
 * with IPC (OS in shared mode, file) and each export state at fork time:
 *   got        a handle outstanding, the block live
 *   put        got and put (the export stays cached, unused)
 *   freed      got, then the block freed (its free deferred to the put)
 *   put-freed  got, put, then freed (a plain free)
 *   many       several blocks of several sizes exported, some put, some freed
 * the process forks. The child must return from fork() at once (ipc.h: it
 * drops the export cache), run a program through fork+exec and system(),
 * free its blocks (a block the parent freed while exported is the child's
 * to reuse), export afresh where its provider allows, and exit; a child
 * that hangs is killed by its alarm and fails the test. The parent's
 * exports are unchanged: its deferred frees happen at its own last put. */
#include "harness.h"

#include <hetmem/hetmem.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef enum { PROV_OS, PROV_FILE, PROV_N } prov_kind_t;
typedef enum { POOL_PROXY, POOL_NATIVE, POOL_JEMALLOC, POOL_N } pool_kind_t;
typedef enum { ST_GOT, ST_PUT, ST_FREED, ST_PUT_FREED, ST_MANY, ST_N } state_t;
static const char *prov_name[] = {"os-shared", "file"};
static const char *pool_name[] = {"proxy", "native", "jemalloc"};
static const char *state_name[] = {"got", "put", "freed", "put-freed", "many"};

static char g_path[128];

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
    snprintf(g_path, sizeof(g_path), "/tmp/hm_fork_exports_%d_%d", (int)getpid(), n++);
    return hm_file_provider_create(g_path, out);
}

static hm_result_t make_pool(pool_kind_t k, hm_provider_t *prov, hm_pool_t **out) {
    switch (k) {
    case POOL_PROXY: return hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    case POOL_NATIVE: return hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, out);
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

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

/* Whether the block [p, +n) is free in this process. The proxy and native
 * pools refuse a second free of it (INVALID_ARGUMENT: unknown; DOUBLE_FREE);
 * jemalloc, which cannot tell a block in a thread cache from a live one,
 * hands a block of a thread-cached size (up to 32 KiB) out again at the
 * next allocations (its caches are LIFO); a larger one goes back to the
 * arena, whose choice among free extents this test does not predict. */
static pool_kind_t g_pool;
static int is_free(hm_pool_t *pool, void *p, size_t n) {
    if (g_pool != POOL_JEMALLOC) return hm_pool_free(pool, p) != HM_SUCCESS;
    if (n > (32 << 10)) return 1;
    void *q[32];
    int k = 0, hit = 0;
    for (; k < 32 && !hit; k++) {
        q[k] = hm_pool_malloc(pool, n);
        if (!q[k]) break;
        hit = overlaps(q[k], n, p, n);
    }
    for (int i = 0; i < k; i++)
        if (q[i]) hm_pool_free(pool, q[i]);
    return hit;
}

/* Wait for pid at most `secs` seconds; kill it past that. Its exit status,
 * or -1 if it had to be killed. */
static int wait_child(pid_t pid, int secs) {
    for (int i = 0; i < secs * 100; i++) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

#define NB 6
static const size_t sizes[NB] = {64, 4096, 40 << 10, 1 << 20, 64, 200};

static void run_case(prov_kind_t vk, pool_kind_t pk, state_t stt) {
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(make_provider(vk, &prov));
    char path[sizeof(g_path)];
    memcpy(path, g_path, sizeof(path));
    hm_result_t r = make_pool(pk, prov, &pool);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        hm_provider_destroy(prov);
        return;
    }
    REQUIRE_OK(r);
    g_pool = pk;
    char ctx[96];
    snprintf(ctx, sizeof(ctx), "%s over %s, %s", pool_name[pk], prov_name[vk], state_name[stt]);
    hm_test_set_context(ctx);

    void *b[NB] = {0};
    hm_ipc_handle_t *h[NB] = {0};
    int live[NB] = {0}, held[NB] = {0};
    int nb = stt == ST_MANY ? NB : 1;
    for (int i = 0; i < nb; i++) {
        size_t len;
        b[i] = hm_pool_malloc(pool, sizes[i]);
        REQUIRE(b[i] != NULL);
        memset(b[i], 0x5a, sizes[i]);
        REQUIRE_OK(hm_ipc_get((char *)b[i] + (i & 1) * 8, &h[i], &len));
        live[i] = held[i] = 1;
        state_t s = stt == ST_MANY ? (state_t)(i % 4) : stt;
        if (s == ST_PUT || s == ST_PUT_FREED) {
            CHECK_OK(hm_ipc_put(h[i]));
            held[i] = 0;
        }
        if (s == ST_FREED || s == ST_PUT_FREED) {
            CHECK_OK(hm_pool_free(pool, b[i]));
            live[i] = 0;
        }
    }

    fflush(stdout);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        alarm(HM_TEST_HANG_SECONDS);
        int bad = 0;
        /* A program run from the child: fork+exec and system(). */
        pid_t g = fork();
        if (g == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        int st;
        if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st)) bad |= 1;
        if (system("exit 0") != 0) bad |= 2;
        /* The parent's exports hold nothing here: the child frees its live
         * blocks, and the blocks the parent freed (while exported or not)
         * are free in the child. A handle of the parent's is not one of
         * the child's. */
        for (int i = 0; i < nb; i++) {
            if (live[i] && hm_pool_free(pool, b[i]) != HM_SUCCESS) bad |= 4;
            if (held[i] && hm_ipc_put(h[i]) != HM_ERROR_INVALID_HANDLE) bad |= 8;
        }
        for (int i = 0; i < nb; i++)
            if (!is_free(pool, b[i], sizes[i])) bad |= 16;
        /* A fresh export of the child's own, where its provider can still
         * allocate (the OS provider's shared memory cannot in a child). */
        if (vk == PROV_FILE) {
            void *m = hm_pool_malloc(pool, 4096);
            hm_ipc_handle_t *hm;
            size_t lm;
            if (!m || hm_ipc_get(m, &hm, &lm) != HM_SUCCESS || hm_ipc_put(hm) != HM_SUCCESS)
                bad |= 32;
            if (m && hm_pool_free(pool, m) != HM_SUCCESS) bad |= 64;
        }
        _exit(bad);
    }
    int rc = wait_child(child, HM_TEST_HANG_SECONDS + 10);
    CHECK_MSG(rc == 0, "child: %d (-1: it hung in fork and was killed; else a bit set of "
              "failed steps)", rc);

    /* The parent: its exports are as they were; the last puts finish the
     * deferred frees. */
    for (int i = 0; i < nb; i++) {
        if (held[i]) {
            if (live[i]) CHECK_OK(hm_pool_free(pool, b[i])); /* deferred to the put */
            CHECK_OK(hm_ipc_put(h[i]));
        } else if (live[i]) {
            CHECK_OK(hm_pool_free(pool, b[i]));
        }
    }
    for (int i = 0; i < nb; i++) CHECK_MSG(is_free(pool, b[i], sizes[i]), "block %d not free", i);
    hm_ipc_cache_stats_t cs;
    CHECK_OK(hm_ipc_get_cache_stats(&cs));
    hm_test_set_context("");
    CHECK_OK(hm_pool_destroy(pool));
    if (vk == PROV_FILE) unlink(path);
}

int main(void) {
    for (int pk = 0; pk < POOL_N; pk++)
        for (int vk = 0; vk < PROV_N; vk++)
            for (int s = 0; s < ST_N; s++) run_case((prov_kind_t)vk, (pool_kind_t)pk, (state_t)s);
    return hm_test_finish();
}
