/* hetmem tests — Level Zero IPC against a hostile exporter, through the real
 * loader and the project's test driver (ze_test_driver.c,
 * ZE_ENABLE_ALT_DRIVERS set by CTest).
 * SPDX-License-Identifier: MIT
 *
 * This process exports device memory and rewrites fields of its own copy of
 * the handle (the bytes hm_ipc_get returned, checksum recomputed), so that
 * the importer's comparison with the exporter's copy agrees: the size, the
 * size bytes of the driver's own handle inside the payload, the memory type,
 * the device UUID. An importer exec'd afresh (the descriptor comes over the
 * channel) must refuse each (HM_ERROR_INVALID_HANDLE, or NOT_SUPPORTED for
 * a device it cannot map) with the driver's mapping closed again and
 * nothing cached, then open
 * the genuine handle, and keep its mapping readable and writable after the
 * exporter has freed the memory, until it closes it.
 *
 * Usage: test_level_zero_ipc_hostile
 *        test_level_zero_ipc_hostile importer <socket fd>  (internal) */
#include "harness.h"
#include "ipc/wire.h"
#include "ze_test_driver.h"

#include <hetmem/hetmem.h>
#include <hetmem/providers/level_zero.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define IPC_SIZE (3 * MIB + 5)
#define SEED 31

/* What the importer is asked to do with the handle that follows. */
enum { CMD_REFUSE = 1, CMD_OPEN_HOLD = 2, CMD_AFTER_FREE = 3, CMD_END = 4 };

/* The importer's answer. */
typedef struct reply {
    int32_t result;         /* hm_ipc_open's */
    int32_t ok;             /* the data checks passed (OPEN_HOLD, AFTER_FREE) */
    uint64_t opens, closes; /* driver calls during the command */
    uint64_t live_mappings, live_refs;
    uint64_t cache_entries; /* hetmem's opened-handle cache */
} reply_t;

/* ---- the driver's control API, from the library the provider loaded ---- */

static struct {
    hm_ze_test_reset_fn reset;
    hm_ze_test_get_stats_fn stats;
    hm_ze_test_call_count_fn calls;
} drv;

/* After the loader has loaded the driver (a provider exists). */
static int driver_api(void) {
    const char *path = getenv("ZE_ENABLE_ALT_DRIVERS");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!h) return 0;
    *(void **)&drv.reset = dlsym(h, "hm_ze_test_reset");
    *(void **)&drv.stats = dlsym(h, "hm_ze_test_get_stats");
    *(void **)&drv.calls = dlsym(h, "hm_ze_test_call_count");
    return drv.reset && drv.stats && drv.calls;
}

static hm_ze_test_stats_t stats(void) {
    hm_ze_test_stats_t s;
    drv.stats(&s);
    return s;
}

static hm_result_t device_pool(hm_provider_t **prov, hm_pool_t **pool) {
    hm_level_zero_params_t *p;
    hm_result_t r = hm_level_zero_params_create(&p);
    if (r != HM_SUCCESS) return r;
    if ((r = hm_level_zero_params_set_memory_type(p, HM_LEVEL_ZERO_MEMORY_DEVICE)) == HM_SUCCESS)
        r = hm_level_zero_provider_create(p, prov);
    hm_level_zero_params_destroy(p);
    if (r != HM_SUCCESS) return r;
    r = hm_proxy_pool_create(*prov, HM_POOL_FLAG_OWN_PROVIDER, pool);
    if (r != HM_SUCCESS) hm_provider_destroy(*prov);
    return r;
}

/* ---- bytes through the provider's copy ---- */

static unsigned char pat(uint64_t seed, size_t i) {
    return (unsigned char)(((uint32_t)(i + seed) * 2654435761u) >> 24);
}
static unsigned char g_buf[8 * MIB];

static hm_result_t dev_put(hm_provider_t *prov, void *dev, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) g_buf[i] = pat(seed, i);
    return hm_provider_copy(prov, dev, g_buf, n);
}
static int dev_check(hm_provider_t *prov, const void *dev, size_t n, uint64_t seed) {
    memset(g_buf, 0x5a, n);
    if (hm_provider_copy(prov, g_buf, dev, n) != HM_SUCCESS) return 0;
    for (size_t i = 0; i < n; i++)
        if (g_buf[i] != pat(seed, i)) return 0;
    return 1;
}

/* ---- the importer ---- */

static int importer(int sock) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (device_pool(&prov, &pool) != HM_SUCCESS) return 11;
    if (!driver_api()) return 12;
    static unsigned char buf[4096];
    void *held = NULL;
    size_t held_size = 0;
    for (;;) {
        unsigned char cmd = 0;
        size_t got = 0;
        if (hm_ipc_channel_recv_bytes(ch, &cmd, 1, &got) != HM_SUCCESS || got != 1) return 13;
        if (cmd == CMD_END) break;
        size_t len = 0;
        int fd = -1;
        if (cmd != CMD_AFTER_FREE) {
            if (hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd) != HM_SUCCESS) return 14;
            if (fd < 0) return 15; /* the memory travels as a descriptor */
        }
        drv.reset();
        reply_t rep = {0};
        if (cmd == CMD_REFUSE) {
            void *q = (void *)1;
            rep.result = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)buf, len, fd, &q);
            rep.ok = q == NULL;
        } else if (cmd == CMD_OPEN_HOLD) {
            hm_ipc_handle_info_t info;
            rep.result = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)buf, len, fd, &held);
            if (rep.result == HM_SUCCESS &&
                hm_ipc_handle_info((const hm_ipc_handle_t *)buf, len, &info) == HM_SUCCESS) {
                held_size = (size_t)info.size;
                rep.ok = dev_check(prov, held, IPC_SIZE, SEED);
            }
        } else if (cmd == CMD_AFTER_FREE) {
            /* The exporter has freed the memory: the mapping still holds it,
             * every byte that the tracker records readable and writable. */
            rep.ok = held && dev_check(prov, held, IPC_SIZE, SEED) &&
                     hm_provider_fill(prov, held, 0xa5, held_size) == HM_SUCCESS &&
                     dev_put(prov, held, held_size, SEED + 1) == HM_SUCCESS &&
                     dev_check(prov, held, held_size, SEED + 1);
            rep.result = held ? hm_ipc_close(held) : HM_ERROR_INVALID_ARGUMENT;
            held = NULL;
        } else {
            return 16;
        }
        if (fd >= 0) close(fd); /* hetmem keeps no descriptor it is given */
        hm_ze_test_stats_t s = stats();
        rep.opens = drv.calls("zeMemOpenIpcHandle");
        rep.closes = drv.calls("zeMemCloseIpcHandle");
        rep.live_mappings = s.live_ipc_mappings;
        rep.live_refs = s.live_ipc_refs;
        hm_ipc_cache_stats_t cs;
        rep.cache_entries = hm_ipc_get_cache_stats(&cs) == HM_SUCCESS ? cs.entries : 999;
        if (cmd == CMD_AFTER_FREE) {
            /* Closed for good: evict it from hetmem's cache, so the driver
             * unmaps it now. */
            (void)hm_ipc_set_cache_limits(1, 1);
            (void)hm_ipc_set_cache_limits(0, 0);
            s = stats();
            rep.live_mappings = s.live_ipc_mappings;
            rep.live_refs = s.live_ipc_refs;
        }
        if (hm_ipc_channel_send_bytes(ch, &rep, sizeof(rep)) != HM_SUCCESS) return 17;
    }
    if (hm_pool_destroy(pool) != HM_SUCCESS) return 18;
    if (stats().live_ipc_mappings != 0) return 19;
    hm_ipc_channel_destroy(ch);
    return 0;
}

/* ---- the hostile exporter ---- */

static hm_ipc_channel_t *g_ch;
static unsigned char *g_h; /* the exporter's own copy of the handle */
static size_t g_len;
static unsigned char g_orig[4096];

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void fix_crc(void) {
    uint32_t pl = (uint32_t)get_le(g_h + HM__WIRE_OFF_FLAGS + 4, 4);
    put_le(g_h + HM__WIRE_CRC_OFF, hm__wire_checksum(g_h, pl), 4);
}

static reply_t ask(unsigned char cmd, int send_handle) {
    reply_t rep;
    memset(&rep, 0xff, sizeof(rep));
    size_t got = 0;
    if (hm_ipc_channel_send_bytes(g_ch, &cmd, 1) != HM_SUCCESS ||
        (send_handle && hm_ipc_channel_send(g_ch, (const hm_ipc_handle_t *)g_h, g_len) !=
                            HM_SUCCESS) ||
        hm_ipc_channel_recv_bytes(g_ch, &rep, sizeof(rep), &got) != HM_SUCCESS ||
        got != sizeof(rep)) {
        CHECK_MSG(0, "the importer did not answer");
        rep.result = -1000;
    }
    return rep;
}

/* The payload's fields (level_zero.c's lz_payload_t): magic, type, uuid,
 * driver id, size, then the driver's 64-byte handle, whose bytes [32, 40)
 * are the test driver's size field. */
enum {
    PL_TYPE = 4,
    PL_UUID = 8,
    PL_SIZE = 32,
    PL_DRIVER = 40,
    DRV_SIZE = PL_DRIVER + 32,
};

/* One forgery: the exporter's own copy rewritten (checksum made valid),
 * sent, refused with `expected` by the importer with nothing left open;
 * then the genuine bytes back. */
static void forged(const char *what, uint64_t wire_size, int has_type, uint32_t type,
                   uint64_t pl_size, uint64_t drv_size, int uuid, hm_result_t expected,
                   int driver_opens) {
    hm_test_set_context(what);
    unsigned char *pl = g_h + HM_IPC_HEADER_SIZE;
    put_le(g_h + HM__WIRE_OFF_SIZE, wire_size, 8);
    if (has_type) put_le(pl + PL_TYPE, type, 4);
    put_le(pl + PL_SIZE, pl_size, 8);
    put_le(pl + DRV_SIZE, drv_size, 8);
    if (uuid) pl[PL_UUID] ^= 0x80;
    fix_crc();
    reply_t r = ask(CMD_REFUSE, 1);
    memcpy(g_h, g_orig, g_len);
    CHECK_MSG(r.result == (int32_t)expected, "%s: hm_ipc_open -> %s, expected %s", what,
              hm_result_string((hm_result_t)r.result), hm_result_string(expected));
    CHECK(r.ok);
    if (driver_opens) CHECK_EQ(r.opens, 1);
    else CHECK_EQ(r.opens, 0);
    CHECK_EQ(r.closes, r.opens); /* the driver's mapping closed again */
    CHECK_EQ(r.live_mappings, 0);
    CHECK_EQ(r.live_refs, 0);
    CHECK_EQ(r.cache_entries, 0);
}

static void run(const char *self) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        char fdarg[16];
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        execl(self, self, "importer", fdarg, (char *)NULL);
        _exit(98);
    }
    close(sv[1]);
    /* The importer reads this process's copy of each handle (Yama's
     * ptrace_scope 1 asks for this; elsewhere the call is refused, which is
     * fine). */
    (void)prctl(PR_SET_PTRACER, (unsigned long)pid, 0, 0, 0);
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], &g_ch));

    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(device_pool(&prov, &pool));
    void *p = hm_pool_malloc(pool, IPC_SIZE);
    REQUIRE(p != NULL);
    CHECK_OK(dev_put(prov, p, IPC_SIZE, SEED));
    hm_ipc_handle_t *h = NULL;
    REQUIRE_OK(hm_ipc_get(p, &h, &g_len));
    REQUIRE(g_len <= sizeof(g_orig));
    g_h = (unsigned char *)h;
    memcpy(g_orig, g_h, g_len);
    hm_wire_t w;
    REQUIRE_OK(hm__wire_decode(g_h, g_len, &w));
    REQUIRE(w.payload_len >= DRV_SIZE + 8);
    const uint64_t size = w.size; /* what the driver allocated */
    const unsigned char *pl = g_h + HM_IPC_HEADER_SIZE;
    const uint64_t dsz = get_le(pl + DRV_SIZE, 8);
    CHECK_EQ(get_le(pl + PL_SIZE, 8), size);
    CHECK_EQ(get_le(pl + PL_TYPE, 4), HM_LEVEL_ZERO_MEMORY_DEVICE);
    CHECK_EQ(dsz, size);

    /* Sizes past the allocation: far, and by one byte; the driver's own
     * size bytes rewritten too (the driver does not believe them). */
    forged("size + 2 MiB", size + 2 * MIB, 0, 0, size + 2 * MIB, dsz, 0,
           HM_ERROR_INVALID_HANDLE, 1);
    forged("size + 1", size + 1, 0, 0, size + 1, dsz, 0, HM_ERROR_INVALID_HANDLE, 1);
    forged("size + 2 MiB, driver's bytes too", size + 2 * MIB, 0, 0, size + 2 * MIB,
           size + 2 * MIB, 0, HM_ERROR_INVALID_HANDLE, 1);
    /* Another memory type than device memory. */
    forged("host memory type", size, 1, HM_LEVEL_ZERO_MEMORY_HOST, size, dsz, 0,
           HM_ERROR_INVALID_HANDLE, 0);
    /* The payload's size alone differs from the handle's. */
    forged("payload size only", size, 0, 0, size + 2 * MIB, dsz, 0, HM_ERROR_INVALID_HANDLE, 0);
    forged("payload size 0", size, 0, 0, 0, dsz, 0, HM_ERROR_INVALID_HANDLE, 0);
    /* A device UUID the importer has no such device of. */
    forged("unknown device UUID", size, 0, 0, size, dsz, 1, HM_ERROR_NOT_SUPPORTED, 0);

    /* The genuine handle opens, all of it readable. */
    hm_test_set_context("genuine handle");
    REQUIRE(memcmp(g_h, g_orig, g_len) == 0);
    reply_t r = ask(CMD_OPEN_HOLD, 1);
    CHECK_RES((hm_result_t)r.result, HM_SUCCESS);
    CHECK(r.ok);
    CHECK_EQ(r.opens, 1);
    CHECK_EQ(r.live_mappings, 1);

    /* The exporter frees its memory while the importer holds the mapping. */
    hm_test_set_context("exporter frees while imported");
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_EQ(stats().live_allocs, 0);
    r = ask(CMD_AFTER_FREE, 0);
    CHECK(r.ok);
    CHECK_RES((hm_result_t)r.result, HM_SUCCESS);
    CHECK_EQ(r.live_mappings, 0);
    CHECK_EQ(r.live_refs, 0);

    unsigned char end = CMD_END;
    CHECK_OK(hm_ipc_channel_send_bytes(g_ch, &end, 1));
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    CHECK_MSG(code == 0, "importer failed at step %d (status 0x%x)", code, st);
    CHECK_OK(hm_pool_destroy(pool));
    hm_ipc_channel_destroy(g_ch);
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "importer") == 0) return importer(atoi(argv[2]));
    if (!getenv("ZE_ENABLE_ALT_DRIVERS"))
        HM_TEST_SKIP("ZE_ENABLE_ALT_DRIVERS is not set (CTest sets it to the test driver)");
    hm_provider_t *probe;
    hm_pool_t *pp;
    hm_result_t r = device_pool(&probe, &pp);
    if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("no Level Zero loader or driver");
    REQUIRE_OK(r);
    REQUIRE(driver_api());
    run(argv[0]);
    CHECK_OK(hm_pool_destroy(pp));
    CHECK_EQ(stats().live_allocs, 0);
    return hm_test_finish();
}
