/* hetmem tests — one driver mapping per handle per device context: pools
 * over providers that name one context (ipc_context; the device test
 * provider's params.context, which refuses a second open of an allocation
 * in a context, as CUDA does) share the mapping of a handle: one provider
 * open and one close however many pools open it, the tracker record moving
 * to a remaining pool when the one holding it is destroyed, closes through
 * any pool's reference, eviction of one pool's entry closing nothing while
 * another holds the mapping; pools over another context map it on their
 * own. A forked exporter sends the handles with their descriptors over the
 * channel; a stress of concurrent opens, closes and evictions through two
 * pools must never open an allocation twice in the context.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define NBUF 2
static const size_t k_size[NBUF] = {3 * MIB + 5, 256 * 1024};

static unsigned char pat(uint64_t seed, size_t i) {
    return (unsigned char)(((uint32_t)(i + seed) * 2654435761u) >> 24);
}
static unsigned char g_buf[4 * MIB];

static void dev_put(hm_provider_t *prov, void *dev, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) g_buf[i] = pat(seed, i);
    CHECK_OK(hm_provider_copy(prov, dev, g_buf, n));
}
static int dev_check(hm_provider_t *prov, const void *dev, size_t n, uint64_t seed) {
    memset(g_buf, 0x5a, n);
    if (hm_provider_copy(prov, g_buf, dev, n) != HM_SUCCESS) return 0;
    for (size_t i = 0; i < n; i++)
        if (g_buf[i] != pat(seed, i)) return 0;
    return 1;
}

static hm_test_device_params_t dev_params(uint64_t context) {
    hm_test_device_params_t p = {.ordinal = 0, .context = context};
    memcpy(p.uuid, "shared-map-dev-0", 16);
    return p;
}

/* The exporter: NBUF device buffers, their handles and descriptors sent,
 * held until the importer's ack. */
static int exporter(int sock) {
    hm_test_device_params_t dp = dev_params(0);
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_test_device_provider(&dp, &prov) != HM_SUCCESS) return 10;
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) return 11;
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 12;
    void *p[NBUF];
    hm_ipc_handle_t *h[NBUF];
    for (int i = 0; i < NBUF; i++) {
        size_t len;
        if (!(p[i] = hm_pool_malloc(pool, k_size[i]))) return 13;
        dev_put(prov, p[i], k_size[i], 100 + (uint64_t)i);
        if (hm_ipc_get(p[i], &h[i], &len) != HM_SUCCESS) return 14;
        if (hm_ipc_channel_send(ch, h[i], len) != HM_SUCCESS) return 15;
    }
    char ack = 0;
    size_t got = 0;
    if (hm_ipc_channel_recv_bytes(ch, &ack, 1, &got) != HM_SUCCESS || got != 1) return 16;
    for (int i = 0; i < NBUF; i++) {
        if (hm_ipc_put(h[i]) != HM_SUCCESS) return 17;
        if (hm_pool_free(pool, p[i]) != HM_SUCCESS) return 18;
    }
    hm_ipc_channel_destroy(ch);
    return hm_pool_destroy(pool) == HM_SUCCESS ? 0 : 19;
}

typedef struct handle {
    unsigned char bytes[1024];
    size_t len;
    int fd;
} handle_t;
static handle_t g_h[NBUF];

static void *open_(hm_pool_t *pool, int i) {
    void *q = NULL;
    hm_result_t r = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)g_h[i].bytes, g_h[i].len,
                                   g_h[i].fd, &q);
    CHECK_MSG(r == HM_SUCCESS && q, "open of handle %d: %s", i, hm_result_string(r));
    return q;
}

static long opens(hm_provider_t *const *p, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += hm_test_device_calls(p[i], HM_TEST_DEVICE_IPC_OPEN);
    return s;
}
static long closes(hm_provider_t *const *p, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += hm_test_device_calls(p[i], HM_TEST_DEVICE_IPC_CLOSE);
    return s;
}

static void *close_in_thread(void *q) {
    return (void *)(intptr_t)hm_ipc_close(q);
}
/* A close from a thread that never opened q: no per-thread slot, the
 * tracker's path. */
static hm_result_t close_elsewhere(void *q) {
    pthread_t t;
    void *r = NULL;
    if (pthread_create(&t, NULL, close_in_thread, q) != 0) return HM_ERROR_UNKNOWN;
    pthread_join(t, &r);
    return (hm_result_t)(intptr_t)r;
}

/* Two pools over one context share; a pool over another maps its own. */
static void test_share(void) {
    hm_test_set_context("two pools over one context, one over another");
    hm_test_device_params_t c7 = dev_params(7), c9 = dev_params(9);
    hm_provider_t *pv[3];
    REQUIRE_OK(hm_test_device_provider(&c7, &pv[0]));
    REQUIRE_OK(hm_test_device_provider(&c7, &pv[1]));
    REQUIRE_OK(hm_test_device_provider(&c9, &pv[2]));
    hm_pool_t *pa, *pb, *pc;
    REQUIRE_OK(hm_native_pool_create(pv[0], NULL, 0, &pa));
    REQUIRE_OK(hm_proxy_pool_create(pv[1], 0, &pb));
    REQUIRE_OK(hm_proxy_pool_create(pv[2], 0, &pc));

    void *qa = open_(pa, 0), *qb = open_(pb, 0), *qc = open_(pc, 0);
    CHECK_MSG(qa == qb, "pools over one context: %p and %p", qa, qb);
    CHECK(qc != qa);
    CHECK_EQ(opens(pv, 2), 1);            /* one driver open in context 7 */
    CHECK_EQ(hm_test_device_calls(pv[2], HM_TEST_DEVICE_IPC_OPEN), 1);
    CHECK_EQ(hm_test_device_mappings(pv[0]), 1);
    CHECK_EQ(hm_test_device_mappings(pv[2]), 1);
    CHECK(hm_pool_by_ptr(qa) == pa);      /* the first importer holds the record */
    CHECK(hm_pool_by_ptr(qc) == pc);
    CHECK(dev_check(pv[1], qa, k_size[0], 100)); /* any provider of the context */
    CHECK(dev_check(pv[2], qc, k_size[0], 100));
    void *qb2 = open_(pb, 0); /* a hit in pb */
    CHECK(qb2 == qa);
    CHECK_EQ(opens(pv, 2), 1);

    /* Three references (pa 1, pb 2): one closed by a thread without a slot. */
    CHECK_OK(close_elsewhere(qa));
    /* pa goes: the mapping stays for pb, which now holds the record. */
    CHECK_OK(hm_pool_destroy(pa));
    CHECK_EQ(closes(pv, 2), 0);
    CHECK_EQ(hm_test_device_mappings(pv[1]), 1);
    CHECK(hm_pool_by_ptr(qa) == pb);
    hm_allocation_info_t ai;
    CHECK_OK(hm_allocation_info(qa, &ai));
    CHECK(ai.flags & HM_ALLOCATION_IMPORTED);
    long closed0 = hm_test_device_calls(pv[0], HM_TEST_DEVICE_IPC_CLOSE);
    CHECK_EQ(hm_test_device_misuse(pv[0]), 0);
    CHECK_OK(hm_provider_destroy(pv[0]));
    CHECK(dev_check(pv[1], qb, k_size[0], 100));
    /* pb's two, then one too many (by another thread: the tracker's path). */
    CHECK_OK(hm_ipc_close(qb));
    CHECK_OK(close_elsewhere(qb2));
    CHECK_RES(close_elsewhere(qb), HM_ERROR_DOUBLE_FREE);
    CHECK_RES(hm_ipc_close(qb), HM_ERROR_DOUBLE_FREE);
    CHECK_EQ(closed0 + hm_test_device_calls(pv[1], HM_TEST_DEVICE_IPC_CLOSE), 0); /* cached */
    CHECK_OK(hm_pool_destroy(pb));
    CHECK_EQ(closed0 + hm_test_device_calls(pv[1], HM_TEST_DEVICE_IPC_CLOSE), 1);
    CHECK_EQ(hm_test_device_mappings(pv[1]), 0);
    CHECK(hm_pool_by_ptr(qa) == NULL);

    CHECK_OK(hm_ipc_close(qc));
    CHECK_OK(hm_pool_destroy(pc));
    CHECK_EQ(hm_test_device_calls(pv[2], HM_TEST_DEVICE_IPC_CLOSE), 1);
    CHECK_EQ(hm_test_device_mappings(pv[2]), 0);
    for (int i = 1; i < 3; i++) CHECK_EQ(hm_test_device_misuse(pv[i]), 0);
    CHECK_OK(hm_provider_destroy(pv[1]));
    CHECK_OK(hm_provider_destroy(pv[2]));
}

/* Eviction of one pool's entry closes nothing while another pool holds the
 * mapping; evicting the last closes it once; a later open maps it again. */
static void test_evict(void) {
    hm_test_set_context("eviction of shared entries");
    hm_test_device_params_t c7 = dev_params(11);
    hm_provider_t *pv[2];
    hm_pool_t *pool[2];
    for (int i = 0; i < 2; i++) {
        REQUIRE_OK(hm_test_device_provider(&c7, &pv[i]));
        REQUIRE_OK(hm_proxy_pool_create(pv[i], 0, &pool[i]));
    }
    void *q0 = open_(pool[0], 1), *q1 = open_(pool[1], 1);
    CHECK(q0 == q1);
    CHECK_OK(hm_ipc_close(q0));
    CHECK_OK(hm_ipc_close(q1));
    CHECK_EQ(opens(pv, 2), 1);
    hm_ipc_cache_stats_t st;
    CHECK_OK(hm_ipc_get_cache_stats(&st));
    CHECK_EQ(st.entries, 2); /* one per pool */
    CHECK_OK(hm_ipc_set_cache_limits(1, 0)); /* one entry leaves: still mapped */
    CHECK_EQ(closes(pv, 2), 0);
    CHECK_EQ(hm_test_device_mappings(pv[0]), 1);
    CHECK_OK(hm_ipc_set_cache_limits(0, 1)); /* the other too: closed, once */
    CHECK_EQ(closes(pv, 2), 1);
    CHECK_EQ(hm_test_device_mappings(pv[0]), 0);
    CHECK_OK(hm_ipc_set_cache_limits(4096, 0));
    void *q = open_(pool[1], 1);
    CHECK(dev_check(pv[0], q, k_size[1], 101));
    CHECK_EQ(opens(pv, 2), 2);
    CHECK_OK(hm_ipc_close(q));
    for (int i = 0; i < 2; i++) {
        CHECK_OK(hm_pool_destroy(pool[i]));
        CHECK_EQ(hm_test_device_misuse(pv[i]), 0);
    }
    CHECK_EQ(closes(pv, 2), 2);
    for (int i = 0; i < 2; i++) CHECK_OK(hm_provider_destroy(pv[i]));
}

/* Opens, closes and evictions through two pools of one context at once:
 * every open is either a hit or the context's only open of the handle. */
enum { STRESS_THREADS = 4, STRESS_ITERS = 300 };
static hm_pool_t *g_spool[2];
static _Atomic int g_sfail;
static void *stress(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int k = 0; k < STRESS_ITERS; k++) {
        int b = (id + k) % NBUF;
        void *q = NULL;
        hm_result_t r = hm_ipc_open_fd(g_spool[(id + k / 3) % 2],
                                       (const hm_ipc_handle_t *)g_h[b].bytes, g_h[b].len,
                                       g_h[b].fd, &q);
        if (r != HM_SUCCESS || !q || hm_ipc_close(q) != HM_SUCCESS) atomic_fetch_add(&g_sfail, 1);
        if (k % 17 == 0) (void)hm_ipc_set_cache_limits(1 + (unsigned)k % 2, 0);
    }
    return NULL;
}
static void test_stress(void) {
    hm_test_set_context("concurrent opens, closes and evictions");
    hm_test_device_params_t c = dev_params(13);
    hm_provider_t *pv[2];
    for (int i = 0; i < 2; i++) {
        REQUIRE_OK(hm_test_device_provider(&c, &pv[i]));
        REQUIRE_OK(hm_native_pool_create(pv[i], NULL, 0, &g_spool[i]));
    }
    pthread_t t[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++)
        REQUIRE(pthread_create(&t[i], NULL, stress, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < STRESS_THREADS; i++) pthread_join(t[i], NULL);
    CHECK_EQ(atomic_load(&g_sfail), 0);
    CHECK_OK(hm_ipc_set_cache_limits(4096, 0));
    for (int i = 0; i < 2; i++) CHECK_OK(hm_pool_destroy(g_spool[i]));
    CHECK_EQ(opens(pv, 2), closes(pv, 2));
    CHECK_EQ(hm_test_device_mappings(pv[0]), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(hm_test_device_misuse(pv[i]), 0); /* never a second open in the context */
        CHECK_OK(hm_provider_destroy(pv[i]));
    }
}

int main(void) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(exporter(sv[1]));
    }
    close(sv[1]);
    hm_ipc_channel_t *ch;
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], &ch));
    int got_all = 1;
    for (int i = 0; i < NBUF; i++) {
        g_h[i].fd = -1;
        hm_result_t r = hm_ipc_channel_recv(ch, g_h[i].bytes, sizeof(g_h[i].bytes), &g_h[i].len,
                                            &g_h[i].fd);
        if (r != HM_SUCCESS || g_h[i].fd < 0) got_all = 0;
    }
    if (got_all) {
        test_share();
        test_evict();
        test_stress();
    } else {
        CHECK_MSG(0, "the exporter's handles did not arrive");
    }
    char ack = 1;
    CHECK_OK(hm_ipc_channel_send_bytes(ch, &ack, 1));
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exporter failed at step %d (status 0x%x)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, st);
    for (int i = 0; i < NBUF; i++)
        if (g_h[i].fd >= 0) close(g_h[i].fd);
    hm_ipc_channel_destroy(ch);
    return hm_test_finish();
}
