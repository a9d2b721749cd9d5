/* hetmem IPC — a producer (this test) and a consumer (ipc_peer, fork+exec)
 * over the OS provider's shared (memfd) mode, once per fd transport:
 * pidfd_getfd, and SCM_RIGHTS through hm_ipc_channel (pidfd disabled in
 * the consumer). SPDX-License-Identifier: MIT */
#include "ipc_test_util.h"

#include <sys/syscall.h>

#define KB 1024u

static void basic_and_hit(peer_t *pe, hm_pool_t *pool) {
    hm_test_set_context("open/write/close/reopen");
    unsigned char *p = hm_pool_malloc(pool, 64 * KB);
    REQUIRE(p);
    memset(p, 0, 64 * KB);
    hm_ipc_handle_t *h, *h2;
    size_t len, len2;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    CHECK(len > HM_IPC_HEADER_SIZE && len <= hm_ipc_handle_size());
    hm_ipc_handle_t *again;
    size_t len_again;
    CHECK_OK(hm_ipc_get(p, &again, &len_again)); /* cached: the same bytes */
    CHECK(again == h && len_again == len);
    CHECK_OK(hm_ipc_put(again));

    peer_reply_t s0 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    peer_reply_t r = peer_open(pe, PEER_OPEN, 0, 0, h, len, pe->scm);
    REQUIRE(r.result == HM_SUCCESS);
    uint64_t local = r.v[0];
    CHECK_OK(peer_cmd(pe, PEER_WRITE, 0, 0, 100, 0xAB, 1000).result);
    int ok = 1;
    for (int i = 100; i < 1100; i++) ok &= p[i] == 0xAB;
    CHECK_MSG(ok && p[99] == 0 && p[1100] == 0, "the consumer's write is visible here");
    p[5] = 0x42;
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 0, 5, 0, 0).v[0], 0x42);
    peer_reply_t info = peer_cmd(pe, PEER_INFO, 0, 0, 0, 0, 0);
    CHECK_OK(info.result);
    CHECK_EQ(info.v[0], 1); /* HM_ALLOCATION_IMPORTED */
    CHECK_EQ(info.v[1], 0); /* hm_pool_by_ptr: the importing pool */
    CHECK_EQ(info.v[2], 64 * KB);
    CHECK_EQ((int)info.v[3], HM_ERROR_INVALID_ARGUMENT); /* hm_free refused */
    CHECK_EQ((int)info.v[4], HM_ERROR_INVALID_ARGUMENT); /* hm_pool_free refused */
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 0, 0, 0, 0).result);
    CHECK_EQ(peer_cmd(pe, PEER_CLOSE, 0, 0, 0, 0, 0).result, HM_ERROR_INVALID_ARGUMENT);

    /* Reopen: a cache hit, the same mapping. */
    r = peer_open(pe, PEER_OPEN, 0, 0, h, len, pe->scm);
    CHECK_OK(r.result);
    CHECK(r.v[0] == local);
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 0, 100, 0, 0).v[0], 0xAB);
    /* An interior pointer: same mapping, translated. */
    REQUIRE_OK(hm_ipc_get(p + 8192, &h2, &len2));
    CHECK(h2 != h);
    r = peer_open(pe, PEER_OPEN, 0, 1, h2, len2, pe->scm);
    CHECK_OK(r.result);
    CHECK(r.v[0] == local + 8192);
    peer_reply_t s1 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    CHECK_EQ(s1.v[3] - s0.v[3], 2); /* hits */
    CHECK_EQ(s1.v[4] - s0.v[4], 1); /* misses */
    CHECK_EQ(s1.v[2], 1);           /* in use */
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 0, 0, 0, 0).result);
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 1, 0, 0, 0).result);
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_ipc_put(h2));
    CHECK_EQ(hm_ipc_put(h2), HM_ERROR_INVALID_HANDLE); /* put more often than got */
    CHECK_OK(hm_pool_free(pool, p));
}

static void realloc_same_address(peer_t *pe, hm_pool_t *pool) {
    hm_test_set_context("free + reallocate at the same address");
    /* (1) handle put before free: the next allocation there must miss. */
    unsigned char *p = hm_pool_malloc(pool, 64 * KB);
    REQUIRE(p);
    memset(p, 0x11, 64 * KB);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    hm_ipc_handle_info_t i1, i2;
    REQUIRE_OK(hm_ipc_handle_info(h, len, &i1));
    CHECK_OK(peer_open(pe, PEER_OPEN, 0, 0, h, len, pe->scm).result);
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 0, 0, 0, 0).result); /* cached, unused */
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    unsigned char *q = hm_pool_malloc(pool, 64 * KB);
    REQUIRE(q);
    CHECK_MSG(q == p, "the reallocation reuses the address (%p vs %p)", (void *)q, (void *)p);
    memset(q, 0x22, 64 * KB);
    REQUIRE_OK(hm_ipc_get(q, &h, &len));
    REQUIRE_OK(hm_ipc_handle_info(h, len, &i2));
    CHECK(i1.base == i2.base || q != p);
    CHECK(i1.allocation_id != i2.allocation_id);
    peer_reply_t s0 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    CHECK_OK(peer_open(pe, PEER_OPEN, 0, 0, h, len, pe->scm).result);
    peer_reply_t s1 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    CHECK_EQ(s1.v[4] - s0.v[4], 1); /* a miss, never a false hit */
    CHECK_EQ(s1.v[3] - s0.v[3], 0);
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 0, 7, 0, 0).v[0], 0x22);

    /* (2) the old mapping still open and the handle still outstanding while
     * the producer frees: both mappings stay valid and distinct. */
    CHECK_OK(peer_cmd(pe, PEER_WRITE, 0, 0, 0, 0x33, 16).result);
    CHECK_EQ(q[3], 0x33);
    CHECK_OK(hm_pool_free(pool, q)); /* handle h not put yet */
    unsigned char *z = hm_pool_malloc(pool, 64 * KB);
    REQUIRE(z);
    memset(z, 0x44, 64 * KB);
    hm_ipc_handle_t *hz;
    size_t lz;
    REQUIRE_OK(hm_ipc_get(z, &hz, &lz));
    CHECK_OK(peer_open(pe, PEER_OPEN, 0, 1, hz, lz, pe->scm).result);
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 1, 9, 0, 0).v[0], 0x44);
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 0, 3, 0, 0).v[0], 0x33); /* old memory kept */
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 0, 0, 0, 0).result);
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 1, 0, 0, 0).result);
    CHECK_OK(hm_ipc_put(h)); /* after the free: releases the provider export */
    CHECK_OK(hm_ipc_put(hz));
    CHECK_OK(hm_pool_free(pool, z));
}

static void destroy_consumer_pool(peer_t *pe, hm_pool_t *pool) {
    hm_test_set_context("consumer pool destroyed with open mappings");
    void *p[3];
    hm_ipc_handle_t *h[3];
    size_t len[3];
    for (int i = 0; i < 3; i++) {
        REQUIRE((p[i] = hm_pool_malloc(pool, 16 * KB)));
        REQUIRE_OK(hm_ipc_get(p[i], &h[i], &len[i]));
        CHECK_OK(peer_open(pe, PEER_OPEN, 1, 10 + i, h[i], len[i], pe->scm).result);
    }
    /* one also open through pool 0: untouched by pool 1's destroy */
    CHECK_OK(peer_open(pe, PEER_OPEN, 0, 20, h[0], len[0], pe->scm).result);
    peer_reply_t s0 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    peer_reply_t d = peer_cmd(pe, PEER_DESTROY, 1, 0, 0, 0, 0);
    CHECK_OK(d.result);
    CHECK_EQ(d.v[0], 3); /* exactly its three mappings left the tracker */
    CHECK_EQ(d.v[1], 3); /* and are unmapped */
    peer_reply_t s1 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    CHECK_EQ(s0.v[0] - s1.v[0], 3);
    CHECK_EQ(s1.v[2], 1);
    CHECK_OK(peer_cmd(pe, PEER_WRITE, 0, 20, 0, 0x77, 8).result);
    CHECK_EQ(((unsigned char *)p[0])[7], 0x77);
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 20, 0, 0, 0).result);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(hm_ipc_put(h[i]));
        CHECK_OK(hm_pool_free(pool, p[i]));
    }
}

static void lru_bound(peer_t *pe, hm_pool_t *pool, int n) {
    hm_test_set_context("thousands of handles, LRU bound 10");
    CHECK_OK(peer_cmd(pe, PEER_LIMIT, 0, 0, 10, 0, 0).result);
    peer_reply_t s0 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    unsigned char **p = calloc((size_t)n, sizeof(*p));
    REQUIRE(p);
    for (int i = 0; i < n; i++) {
        REQUIRE((p[i] = hm_pool_malloc(pool, 4 * KB)));
        p[i][0] = 0;
        hm_ipc_handle_t *h;
        size_t len;
        REQUIRE_OK(hm_ipc_get(p[i], &h, &len));
        peer_reply_t r = peer_open(pe, PEER_OPEN, 2, 100, h, len, pe->scm);
        if (r.result != HM_SUCCESS) {
            CHECK_MSG(0, "open #%d: %s", i, hm_result_string(r.result));
            break;
        }
        peer_cmd(pe, PEER_WRITE, 0, 100, 0, (uint64_t)(i & 0xff) | 1, 1);
        peer_cmd(pe, PEER_CLOSE, 0, 100, 0, 0, 0);
        CHECK_OK(hm_ipc_put(h));
    }
    peer_reply_t s1 = peer_cmd(pe, PEER_STATS, 0, 0, 0, 0, 0);
    CHECK_MSG(s1.v[0] <= 10, "%llu entries cached with a bound of 10",
              (unsigned long long)s1.v[0]);
    CHECK_MSG(s1.v[5] - s0.v[5] >= (uint64_t)n - 10, "%llu evictions",
              (unsigned long long)(s1.v[5] - s0.v[5]));
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= p[i][0] == ((i & 0xff) | 1);
    CHECK_MSG(ok, "every consumer write arrived");
    for (int i = 0; i < n; i++) hm_pool_free(pool, p[i]);
    free(p);
    hm_ipc_cache_stats_t st;
    CHECK_OK(hm_ipc_get_cache_stats(&st));
    CHECK_MSG(st.exports == 0, "export cache empty after the frees (%zu)", st.exports);
    CHECK_OK(peer_cmd(pe, PEER_LIMIT, 0, 0, 4096, 0, 0).result);
}

/* A second producer process (this program exec'd with --producer) exports,
 * the consumer opens, the producer exits: the mapping stays valid; a handle
 * of the dead producer not yet opened is stale (pidfd mode: its descriptor
 * cannot be fetched any more). posix_spawn, not fork: TSan forbids
 * threads after a multi-threaded fork. */
static int producer_main(int sock, int out, const char *mode) {
    peer_t pe = {.sock = sock, .scm = !strcmp(mode, "scm")};
    if (hm_ipc_channel_from_fd(sock, &pe.ch)) return 1;
    hm_pool_t *pool = shared_pool();
    unsigned char *a = hm_pool_malloc(pool, 32 * KB), *b = hm_pool_malloc(pool, 32 * KB);
    if (!a || !b) return 2;
    memset(a, 0x5A, 32 * KB);
    hm_ipc_handle_t *ha, *hb;
    size_t la, lb;
    if (hm_ipc_get(a, &ha, &la) || hm_ipc_get(b, &hb, &lb)) return 3;
    peer_reply_t r = peer_open(&pe, PEER_OPEN, 0, 30, ha, la, pe.scm);
    if (r.result) return 4;
    if (write(out, hb, lb) != (ssize_t)lb) return 5;
    _exit(0); /* no cleanup: the process just dies */
}

static void producer_exits(peer_t *pe) {
    hm_test_set_context("producer exits while the consumer holds the mapping");
    int pp[2];
    REQUIRE(pipe(pp) == 0);
    char s1[16], s2[16], self[4096];
    snprintf(s1, sizeof(s1), "%d", pe->sock);
    snprintf(s2, sizeof(s2), "%d", pp[1]);
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    REQUIRE(sl > 0);
    self[sl] = 0;
    char *argv[] = {self, (char *)"--producer", s1, s2, (char *)(pe->scm ? "scm" : "pidfd"), NULL};
    pid_t c = spawn(argv, NULL, pp[0]);
    close(pp[1]);
    unsigned char hb[4096];
    ssize_t lb = read(pp[0], hb, sizeof(hb));
    close(pp[0]);
    int st;
    waitpid(c, &st, 0);
    REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    REQUIRE(lb > 0);
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 30, 1000, 0, 0).v[0], 0x5A);
    CHECK_OK(peer_cmd(pe, PEER_WRITE, 0, 30, 0, 1, 4096).result);
    CHECK_EQ(peer_cmd(pe, PEER_READ, 0, 30, 4095, 0, 0).v[0], 1);
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 30, 0, 0, 0).result);
    if (!pe->scm) {
        peer_reply_t r = peer_open(pe, PEER_OPEN_CHECK, 0, 31, hb, (size_t)lb, 0);
        CHECK_EQ(r.result, HM_ERROR_STALE_HANDLE);
    }
}

/* File provider: freeing an exported allocation while its handle is
 * outstanding keeps the file range out of reuse until the last put (the
 * same defined behaviour as the OS provider's): the importer's mapping keeps
 * its bytes, and a new allocation gets other bytes. */
static void file_free_while_exported(void) {
    hm_test_set_context("file provider: free while exported");
    peer_t pe;
    peer_start(&pe, "file");
    char path[128];
    snprintf(path, sizeof(path), "/tmp/hm_ipc_test_file_%d", (int)getpid());
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_file_provider_create(path, &prov));
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    unsigned char *p = hm_pool_malloc(pool, 64 * KB);
    REQUIRE(p);
    memset(p, 0x11, 64 * KB);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    CHECK_OK(peer_open(&pe, PEER_OPEN, 0, 0, h, len, 0).result);
    CHECK_EQ(peer_cmd(&pe, PEER_READ, 0, 0, 5, 0, 0).v[0], 0x11);
    CHECK_OK(hm_pool_free(pool, p)); /* handle outstanding */
    unsigned char *q[4];
    for (int i = 0; i < 4; i++) { /* none of them may land on p's range */
        q[i] = hm_pool_malloc(pool, 64 * KB);
        REQUIRE(q[i]);
        CHECK_MSG(q[i] + 64 * KB <= p || q[i] >= p + 64 * KB,
                  "allocation %d reuses the exported range %p", i, (void *)p);
        memset(q[i], 0x22, 64 * KB);
    }
    CHECK_EQ(peer_cmd(&pe, PEER_READ, 0, 0, 5, 0, 0).v[0], 0x11); /* the importer's bytes */
    CHECK_OK(peer_cmd(&pe, PEER_WRITE, 0, 0, 100, 0x55, 8).result);
    for (int i = 0; i < 4; i++) CHECK_EQ(q[i][100], 0x22);
    CHECK_OK(peer_cmd(&pe, PEER_CLOSE, 0, 0, 0, 0, 0).result);
    CHECK_OK(hm_ipc_put(h)); /* the last put: the range is free now */
    unsigned char *r = hm_pool_malloc(pool, 64 * KB);
    REQUIRE(r);
    CHECK_MSG(r == p, "after the last put the range is reusable (%p, freed %p)", (void *)r,
              (void *)p);
    hm_pool_free(pool, r);
    for (int i = 0; i < 4; i++) CHECK_OK(hm_pool_free(pool, q[i]));
    CHECK_EQ(peer_stop(&pe), 0);
    CHECK_OK(hm_pool_destroy(pool));
    unlink(path);
}

static void run(const char *mode) {
    printf("--- transport: %s\n", mode);
    fflush(stdout);
    peer_t pe;
    peer_start(&pe, mode);
    hm_pool_t *pool = shared_pool();
    basic_and_hit(&pe, pool);
    realloc_same_address(&pe, pool);
    destroy_consumer_pool(&pe, pool);
    lru_bound(&pe, pool, getenv("HM_TEST_QUICK") ? 300 : 2000);
    producer_exits(&pe);
    CHECK_EQ(peer_stop(&pe), 0);
    CHECK_OK(hm_pool_destroy(pool));
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--producer"))
        return producer_main(atoi(argv[2]), atoi(argv[3]), argv[4]);
    if (pidfd_getfd_works()) run("pidfd");
    else printf("pidfd_getfd refused here: only the SCM_RIGHTS transport is tested\n");
    run("scm");
    file_free_while_exported();
    return hm_test_finish();
}
