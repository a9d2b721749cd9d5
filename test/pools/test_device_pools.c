/* hetmem tests — pools over memory the CPU must not touch (the device test
 * provider, test/common/device_provider.c): the provider conformance suite
 * over it; the pool conformance suite for the proxy, native and jemalloc
 * pools over it; hm_pool_calloc returning zeroed device memory and
 * hm_pool_realloc keeping its contents (read back through the provider's
 * copy) across small size classes, large and huge blocks in each pool, and
 * their failure paths; device identity, fill/copy argument checks, version
 * 1 ops tables, the IPC device check and a forked importer.
 * SPDX-License-Identifier: MIT
 *
 * Usage: test_device_pools [unit|provider|proxy|native|jemalloc|ipc|all]
 * (none: unit; CTest runs each part as an entry of its own). */
#include "conformance.h"
#include "provider_internal.h" /* hm__provider_ipc_compatible */

#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static const char *g_part;
#define PART(name) (strcmp(g_part, "all") == 0 || strcmp(g_part, (name)) == 0)

static const hm_test_device_params_t k_dev0 = {.ordinal = 0};

/* ---- pools over a device provider ---- */

typedef enum { POOL_PROXY, POOL_NATIVE, POOL_NATIVE_SMALL_LARGE, POOL_JEMALLOC } pool_kind_t;

static const char *kind_name(pool_kind_t k) {
    switch (k) {
    case POOL_PROXY: return "proxy";
    case POOL_NATIVE: return "native";
    case POOL_NATIVE_SMALL_LARGE: return "native(large threshold 4 MiB)";
    case POOL_JEMALLOC: return "jemalloc";
    }
    return "?";
}

static hm_result_t pool_over(pool_kind_t k, hm_provider_t *prov, hm_pool_t **out) {
    switch (k) {
    case POOL_PROXY: return hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    case POOL_NATIVE: return hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, out);
    case POOL_NATIVE_SMALL_LARGE: {
        hm_native_params_t *np;
        hm_result_t r = hm_native_params_create(&np);
        if (r != HM_SUCCESS) return r;
        r = hm_native_params_set_large_threshold(np, 4 * MIB);
        if (r == HM_SUCCESS) r = hm_native_pool_create(prov, np, HM_POOL_FLAG_OWN_PROVIDER, out);
        hm_native_params_destroy(np);
        return r;
    }
    case POOL_JEMALLOC:
#ifdef HM_TEST_JEMALLOC
        return hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, out);
#else
        return HM_ERROR_NOT_SUPPORTED;
#endif
    }
    return HM_ERROR_INVALID_ARGUMENT;
}

typedef struct factory {
    pool_kind_t kind;
    hm_test_device_params_t params;
} factory_t;

static hm_result_t make_pool(void *arg, hm_pool_t **out) {
    factory_t *f = arg;
    hm_provider_t *prov;
    hm_result_t r = hm_test_device_provider(&f->params, &prov);
    if (r != HM_SUCCESS) return r;
    r = pool_over(f->kind, prov, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

static hm_result_t make_provider(void *arg, hm_provider_t **out) {
    return hm_test_device_provider(arg, out);
}

/* ---- device bytes, written and checked through the provider's copy ---- */

static unsigned char pat(uint64_t seed, size_t i) {
    return (unsigned char)(((uint32_t)(i + seed) * 2654435761u) >> 24);
}

enum { CHUNK = 1 << 20 };
static unsigned char g_chunk[CHUNK];

static void dev_put(hm_provider_t *prov, void *dev, size_t n, uint64_t seed) {
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t len = n - off < CHUNK ? n - off : CHUNK;
        for (size_t i = 0; i < len; i++) g_chunk[i] = pat(seed, off + i);
        CHECK_OK(hm_provider_copy(prov, (char *)dev + off, g_chunk, len));
    }
}

/* seed 0 with zero set: expect zero bytes. */
static int dev_check(hm_provider_t *prov, const void *dev, size_t n, uint64_t seed, int zero) {
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t len = n - off < CHUNK ? n - off : CHUNK;
        memset(g_chunk, 0x5a, len);
        if (hm_provider_copy(prov, g_chunk, (const char *)dev + off, len) != HM_SUCCESS) return 0;
        for (size_t i = 0; i < len; i++)
            if (g_chunk[i] != (zero ? 0 : pat(seed, off + i))) {
                fprintf(stderr, "byte %zu of %zu: 0x%02x, expected 0x%02x\n", off + i, n,
                        g_chunk[i], zero ? 0 : pat(seed, off + i));
                return 0;
            }
    }
    return 1;
}

static void dev_dirty(hm_provider_t *prov, void *dev, size_t n) {
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t len = n - off < CHUNK ? n - off : CHUNK;
        memset(g_chunk, 0xa5, len);
        CHECK_OK(hm_provider_copy(prov, (char *)dev + off, g_chunk, len));
    }
}

static size_t requested(hm_pool_t *pool) {
    hm_pool_stats_t st;
    if (hm_pool_get_stats(pool, &st) != HM_SUCCESS) return SIZE_MAX;
    return st.bytes_requested;
}

/* Small classes, large and huge blocks of every pool: the native pool's
 * default device thresholds are 256 KiB (classes) and 256 MiB (huge; 4 MiB
 * in the second native variant); the jemalloc pool's small classes end at
 * 14 KiB. Under TSan, whose every byte of the host-side checks costs a
 * shadow access, blocks above BIG_MAX are left out (the huge tier is still
 * reached, at 9 MiB, through the second native variant). */
#if defined(HM_TSAN)
#define BIG_MAX (16 * MIB)
#else
#define BIG_MAX SIZE_MAX
#endif
static const size_t k_sizes[] = {1,      8,          24,           100,     1000,
                                 4095,   16 * KIB + 1, 65536,      300007,  1 * MIB + 3,
                                 9 * MIB + 1, 257 * MIB};

static void content_tests(pool_kind_t kind) {
    char ctx[128];
    snprintf(ctx, sizeof(ctx), "%s over device memory: calloc/realloc", kind_name(kind));
    hm_test_set_context(ctx);
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_device_provider(&k_dev0, &prov));
    hm_pool_t *pool;
    hm_result_t r = pool_over(kind, prov, &pool);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        hm_provider_destroy(prov);
        return;
    }
    REQUIRE_OK(r);
    CHECK(!hm_provider_cpu_accessible(prov));
    for (size_t i = 0; i < sizeof(k_sizes) / sizeof(k_sizes[0]); i++) {
        size_t n = k_sizes[i];
        if (n > BIG_MAX) continue;
        /* Dirty a block first, so a pool that reuses it must really zero. */
        void *d = hm_pool_malloc(pool, n);
        CHECK_MSG(d != NULL, "malloc(%zu) -> NULL errno %d", n, errno);
        if (d) {
            dev_dirty(prov, d, n);
            CHECK_OK(hm_pool_free(pool, d));
        }
        errno = 0;
        void *p = hm_pool_calloc(pool, 1, n);
        CHECK_MSG(p != NULL, "calloc(1, %zu) -> NULL errno %d", n, errno);
        if (!p) continue;
        CHECK_MSG(dev_check(prov, p, n, 0, 1), "calloc(%zu): not zero", n);
        /* calloc(num, size) with the product n. */
        if (n % 8 == 0 || n == 24) {
            void *q = hm_pool_calloc(pool, n / 8 ? n / 8 : 1, 8);
            CHECK(q != NULL);
            if (q) {
                CHECK(dev_check(prov, q, n, 0, 1));
                CHECK_OK(hm_pool_free(pool, q));
            }
        }
        /* Grow, then shrink: the prefix stays. */
        dev_put(prov, p, n, n);
        size_t grow = n >= 64 * MIB ? n + 4 * MIB : 2 * n + 3;
        errno = 0;
        void *g = hm_pool_realloc(pool, p, grow);
        CHECK_MSG(g != NULL, "realloc(%zu -> %zu) -> NULL errno %d", n, grow, errno);
        if (!g) {
            CHECK_OK(hm_pool_free(pool, p));
            continue;
        }
        CHECK_MSG(dev_check(prov, g, n, n, 0), "realloc(%zu -> %zu) lost content", n, grow);
        dev_put(prov, g, grow, n + 1);
        size_t shrink = n / 2 + 1;
        void *s = hm_pool_realloc(pool, g, shrink);
        CHECK_MSG(s != NULL, "realloc(%zu -> %zu) -> NULL errno %d", grow, shrink, errno);
        if (!s) {
            CHECK_OK(hm_pool_free(pool, g));
            continue;
        }
        CHECK_MSG(dev_check(prov, s, shrink, n + 1, 0), "realloc(%zu -> %zu) lost content",
                  grow, shrink);
        CHECK_OK(hm_pool_free(pool, s));
    }
    /* One block through every tier, small to huge and back. */
    const size_t chain[] = {100, 70000, 3 * MIB, 9 * MIB + 5, 257 * MIB + 1, 2 * MIB, 10, 1};
    size_t cur = 50;
    void *p = hm_pool_malloc(pool, cur);
    REQUIRE(p != NULL);
    dev_put(prov, p, cur, 9);
    uint64_t seed = 9;
    for (size_t i = 0; i < sizeof(chain) / sizeof(chain[0]); i++) {
        if (chain[i] > BIG_MAX) continue;
        void *q = hm_pool_realloc(pool, p, chain[i]);
        CHECK_MSG(q != NULL, "realloc(%zu -> %zu) -> NULL errno %d", cur, chain[i], errno);
        if (!q) break;
        size_t keep = cur < chain[i] ? cur : chain[i];
        CHECK_MSG(dev_check(prov, q, keep, seed, 0), "realloc(%zu -> %zu) lost content", cur,
                  chain[i]);
        p = q;
        cur = chain[i];
        seed++;
        dev_put(prov, p, cur, seed);
    }
    CHECK_OK(hm_pool_free(pool, p));

    /* Failures: a fill that fails fails the calloc and leaks nothing; a copy
     * that fails fails the realloc and leaves the block as it was. */
    for (size_t i = 0; i < 3; i++) {
        size_t n = i == 0 ? 100 : i == 1 ? 100 * KIB : 9 * MIB;
        size_t before = requested(pool);
        hm_test_device_fail_nth(prov, HM_TEST_DEVICE_FILL, 1);
        errno = 0;
        void *c = hm_pool_calloc(pool, 1, n);
        CHECK_MSG(c == NULL && errno == EIO, "calloc(%zu) with a failing fill -> %p errno %d", n,
                  c, errno);
        if (c) (void)hm_pool_free(pool, c);
        CHECK_EQ(requested(pool), before);
        void *b = hm_pool_malloc(pool, n);
        REQUIRE(b != NULL);
        dev_put(prov, b, n, 77);
        before = requested(pool);
        hm_test_device_fail_nth(prov, HM_TEST_DEVICE_COPY, 1);
        errno = 0;
        void *q = hm_pool_realloc(pool, b, 4 * n + 1);
        if (q == b) { /* grown in place (jemalloc, into free space after it): no copy */
            hm_test_device_fail_nth(prov, HM_TEST_DEVICE_COPY, 0);
        } else {
            CHECK_MSG(q == NULL && errno == EIO,
                      "realloc(%zu) with a failing copy -> %p errno %d", n, q, errno);
            if (q) b = q;
            CHECK_EQ(requested(pool), before);
        }
        CHECK(dev_check(prov, b, n, 77, 0));
        CHECK_OK(hm_pool_free(pool, b));
    }
    hm_test_device_fail_nth(prov, HM_TEST_DEVICE_FILL, 0);
    hm_test_device_fail_nth(prov, HM_TEST_DEVICE_COPY, 0);
    CHECK_EQ(hm_test_device_misuse(prov), 0);
    CHECK_OK(hm_pool_destroy(pool));
    hm_test_set_context(NULL);
}

static void pool_part(pool_kind_t kind) {
    char label[96];
    factory_t f = {.kind = kind, .params = k_dev0};
    snprintf(label, sizeof(label), "%s/device", kind_name(kind));
    hm_test_suite_opts_t opts = {0};
    hm_test_pool_suite(label, make_pool, &f, &opts);
    content_tests(kind);
}

/* ---- unit: identity, arguments, version 1 tables, the IPC check ---- */

static void test_identity(void) {
    hm_test_set_context("device identity");
    hm_test_device_params_t dp = {.ordinal = 3, .name = "dev3"};
    memcpy(dp.uuid, "0123456789abcdef", 16);
    hm_provider_t *dev;
    REQUIRE_OK(hm_test_device_provider(&dp, &dev));
    hm_device_id_t id;
    CHECK_OK(hm_provider_get_device(dev, &id));
    CHECK_EQ(id.ordinal, 3);
    CHECK(id.has_uuid && memcmp(id.uuid, "0123456789abcdef", 16) == 0);
    CHECK_EQ(hm_provider_memory_kind(dev), HM_MEMORY_DEVICE);
    CHECK(!hm_provider_cpu_accessible(dev));
    uint32_t caps = hm_provider_caps(dev);
    CHECK((caps & HM_PROVIDER_CAP_FILL) && (caps & HM_PROVIDER_CAP_COPY));
    CHECK(strcmp(hm_provider_name(dev), "dev3") == 0);
    CHECK_OK(hm_provider_destroy(dev));

    /* Host memory: no device. */
    hm_provider_t *os;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, HM_OS_PROT_READ | HM_OS_PROT_WRITE, &os));
    memset(&id, 0x77, sizeof(id));
    CHECK_OK(hm_provider_get_device(os, &id));
    CHECK_EQ(id.ordinal, -1);
    CHECK(!id.has_uuid);
    static const uint8_t zero[16];
    CHECK(memcmp(id.uuid, zero, 16) == 0);
    CHECK(!(hm_provider_caps(os) & (HM_PROVIDER_CAP_FILL | HM_PROVIDER_CAP_COPY)));
    void *p = NULL;
    REQUIRE_OK(hm_provider_alloc(os, 4096, 0, &p));
    char host[64];
    CHECK_RES(hm_provider_fill(os, p, 0, 64), HM_ERROR_NOT_SUPPORTED);
    CHECK_RES(hm_provider_copy(os, p, host, 64), HM_ERROR_NOT_SUPPORTED);
    CHECK_OK(hm_provider_free(os, p, 4096));
    CHECK_OK(hm_provider_destroy(os));
}

/* A get_device that claims an ordinal below -1 and a UUID it does not have:
 * the front-end normalises both. */
static void odd_get_device(void *state, hm_device_id_t *d) {
    (void)state;
    d->ordinal = -5;
    d->has_uuid = false;
    memset(d->uuid, 0xee, sizeof(d->uuid));
}

static void test_ops_versions(void) {
    hm_test_set_context("ops table versions");
    hm_fixed_params_t *fp;
    static char buf[1 << 20] __attribute__((aligned(4096)));
    REQUIRE_OK(hm_fixed_params_create(buf, sizeof(buf), &fp));
    const hm_provider_ops_t *fixed = hm_fixed_provider_ops();
    /* A version 1 table ends before get_device: a heap block of exactly that
     * size, so a read past it is caught (ASan). */
    size_t v1 = offsetof(hm_provider_ops_t, get_device);
    unsigned char *old = malloc(v1);
    REQUIRE(old != NULL);
    memcpy(old, fixed, v1);
    const uint32_t one = 1;
    memcpy(old + offsetof(hm_provider_ops_t, version), &one, sizeof(one));
    hm_provider_t *p = NULL;
    CHECK_OK(hm_provider_create((const hm_provider_ops_t *)(void *)old, fp, &p));
    free(old); /* the front-end keeps its own copy */
    if (p) {
        const hm_provider_ops_t *o = hm_provider_get_ops(p);
        CHECK(o && o->version == HM_PROVIDER_OPS_VERSION);
        CHECK(o && !o->get_device && !o->fill && !o->copy && !o->ipc_compatible);
        hm_device_id_t id;
        CHECK_OK(hm_provider_get_device(p, &id));
        CHECK_EQ(id.ordinal, -1);
        void *q = NULL;
        CHECK_OK(hm_provider_alloc(p, 4096, 0, &q));
        if (q) {
            memset(q, 1, 4096);
            CHECK_OK(hm_provider_free(p, q, 4096));
        }
        CHECK_OK(hm_provider_destroy(p));
    }
    /* Versions this library does not speak. */
    hm_provider_ops_t bad = *fixed;
    bad.version = 0;
    CHECK_RES(hm_provider_create(&bad, fp, &p), HM_ERROR_NOT_SUPPORTED);
    bad.version = HM_PROVIDER_OPS_VERSION + 1;
    CHECK_RES(hm_provider_create(&bad, fp, &p), HM_ERROR_NOT_SUPPORTED);
    /* A version 2 table: get_device normalised. */
    hm_provider_ops_t v2 = *fixed;
    v2.get_device = odd_get_device;
    REQUIRE_OK(hm_provider_create(&v2, fp, &p));
    hm_device_id_t id;
    CHECK_OK(hm_provider_get_device(p, &id));
    CHECK_EQ(id.ordinal, -1);
    static const uint8_t zero[16];
    CHECK(!id.has_uuid && memcmp(id.uuid, zero, 16) == 0);
    /* ipc_compatible without the ipc five is dropped. */
    CHECK(hm_provider_get_ops(p)->ipc_compatible == NULL);
    CHECK_OK(hm_provider_destroy(p));
    hm_fixed_params_destroy(fp);
}

/* The IPC device check (hm__provider_ipc_compatible, what hm_ipc_open asks). */
static void test_ipc_compatible(void) {
    hm_test_set_context("IPC device check");
    hm_test_device_params_t a = {.ordinal = 0}, b = {.ordinal = 1}, c = {.ordinal = 2};
    memcpy(a.uuid, "uuid-of-device-A", 16);
    memcpy(b.uuid, "uuid-of-device-B", 16);
    memcpy(c.uuid, "uuid-of-device-C", 16);
    memcpy(c.peers[0], a.uuid, 16); /* C can open A's memory (peer access) */
    c.npeers = 1;
    hm_provider_t *pa, *pb, *pc, *os;
    REQUIRE_OK(hm_test_device_provider(&a, &pa));
    REQUIRE_OK(hm_test_device_provider(&b, &pb));
    REQUIRE_OK(hm_test_device_provider(&c, &pc));
    REQUIRE_OK(hm_test_os_provider(HM_OS_SHARED, HM_OS_PROT_READ | HM_OS_PROT_WRITE, &os));
    void *m = NULL;
    REQUIRE_OK(hm_provider_alloc(pa, 8192, 0, &m));
    const hm_provider_ops_t *oa = hm_provider_get_ops(pa);
    size_t hs = oa->ipc.handle_size(hm_provider_get_state(pa));
    unsigned char payload[256];
    REQUIRE(hs <= sizeof(payload));
    int fd = -1;
    REQUIRE_OK(oa->ipc.get(hm_provider_get_state(pa), m, 8192, payload, &fd));
    CHECK(fd >= 0);
    CHECK_OK(hm__provider_ipc_compatible(pa, payload));
    CHECK_RES(hm__provider_ipc_compatible(pb, payload), HM_ERROR_NOT_SUPPORTED);
    CHECK_OK(hm__provider_ipc_compatible(pc, payload));
    CHECK_OK(hm__provider_ipc_compatible(os, payload)); /* no op: host memory opens anything */
    unsigned char garbage[256];
    memset(garbage, 0x3c, sizeof(garbage));
    CHECK_RES(hm__provider_ipc_compatible(pa, garbage), HM_ERROR_INVALID_HANDLE);
    CHECK_OK(oa->ipc.put(hm_provider_get_state(pa), payload));
    CHECK_OK(hm_provider_free(pa, m, 8192));
    CHECK_OK(hm_provider_destroy(os));
    CHECK_OK(hm_provider_destroy(pc));
    CHECK_OK(hm_provider_destroy(pb));
    CHECK_OK(hm_provider_destroy(pa));
}

/* ---- ipc: a forked importer on the same device and on another ---- */

#define IPC_SIZE (3 * MIB + 5)

static hm_pool_t *proxy_on(const hm_test_device_params_t *dp, hm_provider_t **prov) {
    hm_pool_t *pool = NULL;
    if (hm_test_device_provider(dp, prov) != HM_SUCCESS) return NULL;
    if (hm_proxy_pool_create(*prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) {
        hm_provider_destroy(*prov);
        return NULL;
    }
    return pool;
}

static int importer(int sock, const hm_test_device_params_t *same,
                    const hm_test_device_params_t *other) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    unsigned char buf[1024];
    size_t len = 0;
    int fd = -1;
    if (hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd) != HM_SUCCESS || fd < 0) return 11;
    const hm_ipc_handle_t *h = (const hm_ipc_handle_t *)buf;
    /* Another device, no peer access: refused by ipc_compatible, which the
     * IPC layer asks before the driver's open: the open is never called,
     * nothing is mapped. */
    hm_provider_t *po, *ps;
    hm_pool_t *other_pool = proxy_on(other, &po);
    if (!other_pool) return 12;
    void *q = NULL;
    hm_result_t r = hm_ipc_open_fd(other_pool, h, len, fd, &q);
    if (r != HM_ERROR_NOT_SUPPORTED || q) return 13;
    if (hm_test_device_mappings(po) != 0) return 14;
    if (hm_test_device_calls(po, HM_TEST_DEVICE_IPC_COMPATIBLE) != 1 ||
        hm_test_device_calls(po, HM_TEST_DEVICE_IPC_OPEN) != 0)
        return 15;
    /* The same device (another process's provider, the same UUID). */
    hm_pool_t *pool = proxy_on(same, &ps);
    if (!pool) return 16;
    r = hm_ipc_open_fd(pool, h, len, fd, &q);
    close(fd);
    if (r != HM_SUCCESS || !q) return 17;
    if (hm_test_device_mappings(ps) != 1) return 18;
    if (!dev_check(ps, q, IPC_SIZE, 31, 0)) return 19;
    dev_put(ps, q, 4096, 32); /* the exporter sees it */
    if (hm_ipc_close(q) != HM_SUCCESS) return 20;
    if (hm_pool_destroy(pool) != HM_SUCCESS || hm_pool_destroy(other_pool) != HM_SUCCESS)
        return 21;
    char ack = 1;
    if (hm_ipc_channel_send_bytes(ch, &ack, 1) != HM_SUCCESS) return 22;
    hm_ipc_channel_destroy(ch);
    return 0;
}

static void test_ipc_fork(void) {
    hm_test_set_context("IPC across fork, device check");
    hm_test_device_params_t same = {.ordinal = 0}, other = {.ordinal = 1};
    memcpy(same.uuid, "device-uuid-same", 16);
    memcpy(other.uuid, "device-uuid-othr", 16);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(importer(sv[1], &same, &other));
    }
    close(sv[1]);
    hm_provider_t *prov;
    hm_pool_t *pool = proxy_on(&same, &prov);
    REQUIRE(pool != NULL);
    void *p = hm_pool_malloc(pool, IPC_SIZE);
    REQUIRE(p != NULL);
    dev_put(prov, p, IPC_SIZE, 31);
    hm_ipc_handle_t *h = NULL;
    size_t len = 0;
    hm_result_t r = hm_ipc_get(p, &h, &len);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        HM_TEST_SKIP("IPC not built in");
    }
    REQUIRE_OK(r);
    hm_ipc_channel_t *ch;
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], &ch));
    CHECK_OK(hm_ipc_channel_send(ch, h, len));
    char ack = 0;
    size_t got = 0;
    hm_result_t ar = hm_ipc_channel_recv_bytes(ch, &ack, 1, &got);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "importer failed at step %d (status 0x%x)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, st);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        CHECK(ar == HM_SUCCESS && got == 1 && ack == 1);
        CHECK(dev_check(prov, p, 4096, 32, 0));
        CHECK(dev_check(prov, (char *)p + 4096, IPC_SIZE - 4096, 31 + 4096, 0));
    }
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
    hm_ipc_channel_destroy(ch);
}

/* hm_pool_realloc of a block exported with handles outstanding: the bytes
 * move to a new block through the provider's copy; the old block waits for
 * the last put. */
static void test_realloc_exported(pool_kind_t kind) {
    char ctx[128];
    snprintf(ctx, sizeof(ctx), "%s over device memory: realloc while exported", kind_name(kind));
    hm_test_set_context(ctx);
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_device_provider(&k_dev0, &prov));
    hm_pool_t *pool;
    hm_result_t r = pool_over(kind, prov, &pool);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        hm_provider_destroy(prov);
        return;
    }
    REQUIRE_OK(r);
    const size_t sizes[] = {200, 100 * KIB, 5 * MIB};
    for (size_t i = 0; i < 3; i++) {
        size_t n = sizes[i];
        void *p = hm_pool_malloc(pool, n);
        REQUIRE(p != NULL);
        dev_put(prov, p, n, 40 + i);
        hm_ipc_handle_t *h = NULL;
        size_t len = 0;
        r = hm_ipc_get(p, &h, &len);
        if (r == HM_ERROR_NOT_SUPPORTED) {
            CHECK_OK(hm_pool_free(pool, p));
            break;
        }
        CHECK_OK(r);
        void *q = hm_pool_realloc(pool, p, 3 * n);
        CHECK_MSG(q != NULL && q != p, "realloc(%zu -> %zu) of an exported block -> %p", n,
                  3 * n, q);
        if (q) CHECK(dev_check(prov, q, n, 40 + i, 0));
        if (r == HM_SUCCESS) CHECK_OK(hm_ipc_put(h));
        if (q) CHECK_OK(hm_pool_free(pool, q));
    }
    CHECK_EQ(hm_test_device_misuse(prov), 0);
    CHECK_OK(hm_pool_destroy(pool));
    hm_test_set_context(NULL);
}

int main(int argc, char **argv) {
    g_part = argc > 1 ? argv[1] : "unit";
    /* Each device allocation keeps a memfd: room for the suites' many. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max && rl.rlim_cur < 65536) {
        rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    int ran = 0;
    if (PART("unit")) {
        ran++;
        test_identity();
        test_ops_versions();
        test_ipc_compatible();
    }
    if (PART("provider")) {
        ran++;
        hm_test_suite_opts_t opts = {.can_free = 1};
        hm_test_provider_suite("device", make_provider, (void *)&k_dev0, &opts);
        /* A device with a memory limit: exhausted, then usable again. */
        hm_test_device_params_t small = {.ordinal = 1, .capacity = 96 * MIB};
        hm_test_suite_opts_t lim = {.can_free = 1, .capacity = 96 * MIB, .max_alloc = 32 * MIB};
        hm_test_provider_suite("device (96 MiB)", make_provider, &small, &lim);
    }
    if (PART("proxy")) {
        ran++;
        pool_part(POOL_PROXY);
    }
    if (PART("native")) {
        ran++;
        pool_part(POOL_NATIVE);
        pool_part(POOL_NATIVE_SMALL_LARGE);
    }
    if (PART("jemalloc")) {
        ran++;
#ifdef HM_TEST_JEMALLOC
        pool_part(POOL_JEMALLOC);
#else
        if (strcmp(g_part, "jemalloc") == 0)
            HM_TEST_SKIP("the jemalloc pool is not built (HM_WITH_JEMALLOC=OFF)");
#endif
    }
    if (PART("ipc")) {
        ran++;
        test_realloc_exported(POOL_PROXY);
        test_realloc_exported(POOL_NATIVE);
        test_realloc_exported(POOL_JEMALLOC);
        test_ipc_fork();
    }
    if (!ran) {
        fprintf(stderr, "unknown part '%s'\n", g_part);
        return 2;
    }
    return hm_test_finish();
}
