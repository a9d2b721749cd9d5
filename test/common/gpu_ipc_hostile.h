/* hetmem tests — GPU IPC against a hostile exporter, written once for the
 * CUDA and Level Zero test drivers (test/cuda/test_cuda_ipc_hostile.c,
 * test/level_zero/test_level_zero_ipc_hostile.c give the driver's part).
 * SPDX-License-Identifier: MIT
 *
 * This process exports device memory and rewrites fields of its own copy of
 * the handle (the bytes hm_ipc_get returned, checksum recomputed), so that
 * the importer's comparison with the exporter's copy agrees. An importer
 * exec'd afresh must refuse each forgery (HM_ERROR_INVALID_HANDLE, or
 * NOT_SUPPORTED for a device it cannot map) with the driver's mapping closed
 * again and nothing cached, then open the genuine handle, and keep its
 * mapping readable and writable after the exporter has freed the memory,
 * until it closes it.
 *
 * Usage: <test>
 *        <test> importer <socket fd>  (internal)
 * Include once, in the test's one source file. */
#ifndef HM_TEST_GPU_IPC_HOSTILE_H
#define HM_TEST_GPU_IPC_HOSTILE_H

#include "harness.h"
#include "ipc/wire.h"

#include <hetmem/hetmem.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define IPC_SIZE (3 * MIB + 5)
#define SEED 31

/* What the test driver reports, whatever its own stats struct. */
typedef struct gpu_stats {
    uint64_t live_mappings, live_refs; /* IPC mappings open in this process */
    uint64_t live_device_allocs, live_allocs;
} gpu_stats_t;

/* The driver's part of the test. */
typedef struct gpu_hostile {
    const char *driver_env; /* the variable naming the test driver's library */
    const char *no_driver;  /* the skip message without one */
    const char *open_call, *close_call; /* the driver's IPC open and close */
    bool by_descriptor;     /* handles travel with a descriptor (the channel's) */
    /* Payload offsets: device UUID (16 bytes), size, and the test driver's
     * size field inside the driver's own handle (8 bytes each). */
    unsigned pl_uuid, pl_size, drv_size;
    hm_result_t (*device_pool)(hm_provider_t **prov, hm_pool_t **pool);
    /* Resolve the driver's control API (the library the provider loaded). */
    int (*driver_api)(void *lib);
    void (*reset)(void);
    gpu_stats_t (*stats)(void);
    uint64_t (*calls)(const char *name);
    /* The driver's own forgeries, given the allocation's size and the
     * driver's size bytes (forged() below). */
    void (*forgeries)(const unsigned char *payload, uint64_t size, uint64_t drv_size);
} gpu_hostile_t;

static const gpu_hostile_t *gh;

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

/* After the driver is loaded (a provider exists). */
static int driver_api(void) {
    const char *path = getenv(gh->driver_env);
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    return h && gh->driver_api(h);
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

static hm_result_t open_it(hm_pool_t *pool, const unsigned char *buf, size_t len, int fd,
                           void **out) {
    if (gh->by_descriptor)
        return hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)buf, len, fd, out);
    return hm_ipc_open(pool, (const hm_ipc_handle_t *)buf, len, out);
}

static int importer(int sock) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (gh->device_pool(&prov, &pool) != HM_SUCCESS) return 11;
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
            if ((fd >= 0) != gh->by_descriptor) return 15; /* by value, or as a descriptor */
        }
        gh->reset();
        reply_t rep = {0};
        if (cmd == CMD_REFUSE) {
            void *q = (void *)1;
            rep.result = open_it(pool, buf, len, fd, &q);
            rep.ok = q == NULL;
        } else if (cmd == CMD_OPEN_HOLD) {
            hm_ipc_handle_info_t info;
            rep.result = open_it(pool, buf, len, fd, &held);
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
        gpu_stats_t s = gh->stats();
        rep.opens = gh->calls(gh->open_call);
        rep.closes = gh->calls(gh->close_call);
        rep.live_mappings = s.live_mappings;
        rep.live_refs = s.live_refs;
        hm_ipc_cache_stats_t cs;
        rep.cache_entries = hm_ipc_get_cache_stats(&cs) == HM_SUCCESS ? cs.entries : 999;
        if (cmd == CMD_AFTER_FREE) {
            /* Closed for good: evict it from hetmem's cache, so the driver
             * unmaps it now. */
            (void)hm_ipc_set_cache_limits(1, 1);
            (void)hm_ipc_set_cache_limits(0, 0);
            s = gh->stats();
            rep.live_mappings = s.live_mappings;
            rep.live_refs = s.live_refs;
        }
        if (hm_ipc_channel_send_bytes(ch, &rep, sizeof(rep)) != HM_SUCCESS) return 17;
    }
    if (hm_pool_destroy(pool) != HM_SUCCESS) return 18;
    if (gh->stats().live_mappings != 0) return 19;
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

/* A field of the driver's payload to rewrite in a forgery (len 0: none). */
typedef struct field {
    unsigned off, len;
    uint64_t value;
} field_t;

/* One forgery: the exporter's own copy rewritten (checksum made valid),
 * sent, refused with `expected` by the importer with nothing left open;
 * then the genuine bytes back. */
static void forged(const char *what, uint64_t wire_size, field_t extra, uint64_t pl_size,
                   uint64_t drv_size, int uuid, hm_result_t expected, int driver_opens) {
    hm_test_set_context(what);
    unsigned char *pl = g_h + HM_IPC_HEADER_SIZE;
    put_le(g_h + HM__WIRE_OFF_SIZE, wire_size, 8);
    if (extra.len) put_le(pl + extra.off, extra.value, (int)extra.len);
    put_le(pl + gh->pl_size, pl_size, 8);
    put_le(pl + gh->drv_size, drv_size, 8);
    if (uuid) pl[gh->pl_uuid] ^= 0x80;
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

/* The forgeries every driver gets: sizes past the allocation (far, by one
 * byte, the driver's own size bytes rewritten too: the driver does not
 * believe them), the payload's size alone, a device UUID the importer has
 * no such device of. */
static void common_forgeries(uint64_t size, uint64_t dsz) {
    const field_t none = {0, 0, 0};
    forged("size + 2 MiB", size + 2 * MIB, none, size + 2 * MIB, dsz, 0,
           HM_ERROR_INVALID_HANDLE, 1);
    forged("size + 1", size + 1, none, size + 1, dsz, 0, HM_ERROR_INVALID_HANDLE, 1);
    forged("size + 2 MiB, driver's bytes too", size + 2 * MIB, none, size + 2 * MIB,
           size + 2 * MIB, 0, HM_ERROR_INVALID_HANDLE, 1);
    forged("payload size only", size, none, size + 2 * MIB, dsz, 0, HM_ERROR_INVALID_HANDLE, 0);
    forged("payload size 0", size, none, 0, dsz, 0, HM_ERROR_INVALID_HANDLE, 0);
    forged("unknown device UUID", size, none, size, dsz, 1, HM_ERROR_NOT_SUPPORTED, 0);
}

static void run(const char *self) {
    int sv0;
    pid_t pid = hm_test_spawn_importer(self, NULL, &sv0);
    /* The importer reads this process's copy of each handle: under Yama's
     * ptrace_scope 1 it must be named (elsewhere this does nothing). */
    (void)hm_ipc_allow_importer(pid);
    REQUIRE_OK(hm_ipc_channel_from_fd(sv0, &g_ch));

    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(gh->device_pool(&prov, &pool));
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
    REQUIRE(w.payload_len >= gh->drv_size + 8);
    const uint64_t size = w.size; /* what the driver allocated */
    const unsigned char *pl = g_h + HM_IPC_HEADER_SIZE;
    const uint64_t dsz = get_le(pl + gh->drv_size, 8);
    CHECK_EQ(get_le(pl + gh->pl_size, 8), size);
    CHECK_EQ(dsz, size);
    common_forgeries(size, dsz);
    gh->forgeries(pl, size, dsz);

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
    CHECK_EQ(gh->stats().live_device_allocs, 0);
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

static int gpu_hostile_main(const gpu_hostile_t *t, int argc, char **argv) {
    gh = t;
    if (argc > 2 && strcmp(argv[1], "importer") == 0) return importer(atoi(argv[2]));
    if (!getenv(gh->driver_env))
        HM_TEST_SKIP("%s is not set (CTest sets it to the test driver)", gh->driver_env);
    hm_provider_t *probe;
    hm_pool_t *pp;
    hm_result_t r = gh->device_pool(&probe, &pp);
    if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("%s", gh->no_driver);
    REQUIRE_OK(r);
    REQUIRE(driver_api());
    run(argv[0]);
    CHECK_OK(hm_pool_destroy(pp));
    CHECK_EQ(gh->stats().live_allocs, 0);
    return hm_test_finish();
}

#endif
