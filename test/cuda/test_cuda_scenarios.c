/* hetmem tests — the CUDA provider where NVIDIA's driver is strict, through
 * the test driver's default (NVIDIA-like) behaviour, cuda_test_driver.h:
 *   reuse     an exporter frees a block and the driver hands the address out
 *             again; the importer, whose cache still maps the old block
 *             (the driver maps imports at the exporter's address), opens
 *             the new handle: the stale mapping is closed and the open
 *             succeeds; while the old mapping is in use the open answers
 *             HM_ERROR_BUSY, and succeeds once it is closed. Proxy pool
 *             (every free a cuMemFree) and native pool (large blocks given
 *             back by a trim).
 *   aligned   a block exported with 16 MiB alignment (an offset into the
 *             driver's allocation), opened through two pools of one
 *             context, the opener destroyed first: the other's destroy
 *             closes the mapping (no mapping left in the driver), and a
 *             destroy whose close the driver refuses answers
 *             HM_ERROR_DRIVER.
 *   wc        write-combined host memory: fill and copy work (the CPU's),
 *             hm_cuda_allocation_info reports the device address, which
 *             differs from the host pointer and reaches the same bytes.
 *   oom       a 1 GiB device filled through each pool with 32 KiB blocks,
 *             then 8 MiB ones, twice, then 32 KiB ones again, everything
 *             freed between: each fill gets nearly the whole device (the
 *             pool gives back what it caches when the driver is out of
 *             memory); the figures are printed.
 *   errors    a driver error's text carries no strerror() of its number.
 *   fork      a fork child's allocations from a pool of device memory are
 *             refused, even from blocks the pool caches; it may free and
 *             destroy what it inherited.
 *   streams   stream-ordered allocation on the driver's streams, whose work
 *             (a queued memset) runs only at a synchronising call: a block
 *             freed on one stream goes back to it at once and to another
 *             only after a sync; injected failures of the event calls; a
 *             stream forgotten and destroyed with blocks pending.
 * SPDX-License-Identifier: MIT
 *
 * Usage: test_cuda_scenarios [unit|reuse|aligned|oom|fork|streams|all]
 *        (unit, the default: wc and errors) */
#include "cuda_provider_util.h"

#include <hetmem/stream.h>

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the importer: a separate process, driven over a socket ---- */

/* A request: the command, a pool index, a mapping slot, then a handle
 * ('O' only). The reply: one int32 (an hm_result_t, or a count). */
enum { CMD_OPEN = 'O', CMD_CLOSE = 'C', CMD_DESTROY = 'D', CMD_NEW = 'N', CMD_MAPPINGS = 'M',
       CMD_FAIL_CLOSE = 'F', CMD_QUIT = 'Q' };
#define NPOOLS 2
#define NSLOTS 8

static hm_result_t importer_pool(int k, hm_pool_t **out) {
    hm_provider_t *prov;
    hm_result_t r = cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov);
    if (r != HM_SUCCESS) return r;
    r = pool_over(k, prov, HM_POOL_FLAG_OWN_PROVIDER, out); /* proxy, native */
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

static int importer(int sock) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch) != HM_SUCCESS) return 10;
    hm_provider_t *probe; /* loads the driver, for driver_api */
    if (cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &probe) != HM_SUCCESS) return 14;
    driver_api();
    hm_pool_t *pools[NPOOLS] = {0};
    void *slot[NSLOTS] = {0};
    for (;;) {
        unsigned char buf[4096];
        size_t len = 0;
        if (hm_ipc_channel_recv_bytes(ch, buf, sizeof(buf), &len) != HM_SUCCESS || len < 3)
            return 11;
        int k = buf[1] % NPOOLS, s = buf[2] % NSLOTS;
        int32_t reply = 0;
        switch (buf[0]) {
        case CMD_NEW: reply = importer_pool(k, &pools[k]); break;
        case CMD_OPEN:
            reply = hm_ipc_open(pools[k], (const hm_ipc_handle_t *)(buf + 3), len - 3, &slot[s]);
            break;
        case CMD_CLOSE: reply = hm_ipc_close(slot[s]); break;
        case CMD_DESTROY:
            reply = hm_pool_destroy(pools[k]);
            pools[k] = NULL;
            break;
        case CMD_MAPPINGS: reply = (int32_t)stats().live_ipc_mappings; break;
        case CMD_FAIL_CLOSE: { /* every later driver call fails (the driver's sticky error) */
            int (*sticky)(const char *, unsigned, CUresult);
            void *h = dlopen(getenv("HM_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
            *(void **)&sticky = h ? dlsym(h, "hm_cuda_test_fail_sticky") : NULL;
            reply = sticky ? sticky("cuIpcCloseMemHandle", 1, CUDA_ERROR_ILLEGAL_ADDRESS) : -1;
            break;
        }
        case CMD_QUIT:
            hm_ipc_channel_destroy(ch);
            (void)hm_provider_destroy(probe); /* fails after a sticky error */
            return 0;
        default: return 12;
        }
        if (hm_ipc_channel_send_bytes(ch, &reply, sizeof(reply)) != HM_SUCCESS) return 13;
    }
}

typedef struct peer {
    pid_t pid;
    hm_ipc_channel_t *ch;
} peer_t;

static void peer_start(peer_t *p, const char *self) {
    int fd;
    p->pid = hm_test_spawn_importer(self, NULL, &fd);
    REQUIRE_OK(hm_ipc_channel_from_fd(fd, &p->ch));
}

/* One request; its reply (INT32_MIN: the importer is gone). */
static int32_t ask(peer_t *p, int cmd, int k, int s, const void *handle, size_t len) {
    unsigned char buf[4096] = {(unsigned char)cmd, (unsigned char)k, (unsigned char)s};
    if (handle) memcpy(buf + 3, handle, len);
    if (hm_ipc_channel_send_bytes(p->ch, buf, 3 + (handle ? len : 0)) != HM_SUCCESS) return INT32_MIN;
    int32_t reply = 0;
    size_t got = 0;
    if (hm_ipc_channel_recv_bytes(p->ch, &reply, sizeof(reply), &got) != HM_SUCCESS ||
        got != sizeof(reply))
        return INT32_MIN;
    return reply;
}

/* Export ptr and have the importer open it through pool k into slot s. */
static int32_t open_there(peer_t *p, void *ptr, int k, int s) {
    hm_ipc_handle_t *h = NULL;
    size_t len = 0;
    if (hm_ipc_get(ptr, &h, &len) != HM_SUCCESS) return INT32_MIN + 1;
    int32_t r = ask(p, CMD_OPEN, k, s, h, len);
    CHECK_OK(hm_ipc_put(h));
    return r;
}

static void peer_stop(peer_t *p) {
    unsigned char q[3] = {CMD_QUIT, 0, 0};
    CHECK_OK(hm_ipc_channel_send_bytes(p->ch, q, sizeof(q)));
    int st = 0;
    REQUIRE(waitpid(p->pid, &st, 0) == p->pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "importer ended with status 0x%x", st);
    hm_ipc_channel_destroy(p->ch);
}

/* ---- reuse: open after the exporter reused an address ---- */

static void test_reuse(const char *self) {
    const size_t n = 4 * MIB;
    for (int kind = 0; kind < 2; kind++) { /* exporter: proxy, then native */
        hm_test_set_context(kind ? "reuse (native exporter, trimmed)" : "reuse (proxy exporter)");
        peer_t peer;
        peer_start(&peer, self);
        CHECK_EQ(ask(&peer, CMD_NEW, 0, 0, NULL, 0), HM_SUCCESS);
        hm_provider_t *prov;
        REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
        hm_pool_t *pool;
        REQUIRE_OK(pool_over(kind, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
        size_t size = kind ? 16 * MIB : n; /* native: a large block */
        void *a = hm_pool_malloc(pool, size);
        REQUIRE(a);
        CHECK_EQ(open_there(&peer, a, 0, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_CLOSE, 0, 0, NULL, 0), HM_SUCCESS); /* cached, unused */
        CHECK_OK(hm_pool_free(pool, a));
        if (kind) CHECK_OK(hm_pool_trim(pool));
        void *b = hm_pool_malloc(pool, size);
        REQUIRE(b);
        CHECK_MSG(b == a, "the driver did not hand the address out again (%p, then %p)", a, b);
        /* The cache's old mapping overlaps: closed, and the open succeeds. */
        CHECK_EQ(open_there(&peer, b, 0, 1), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_MAPPINGS, 0, 0, NULL, 0), 1);
        /* Again, with the old mapping still in use there: busy, until closed. */
        CHECK_OK(hm_pool_free(pool, b));
        if (kind) CHECK_OK(hm_pool_trim(pool));
        void *c = hm_pool_malloc(pool, size);
        REQUIRE(c);
        CHECK(c == b);
        CHECK_EQ(open_there(&peer, c, 0, 2), HM_ERROR_BUSY);
        CHECK_EQ(ask(&peer, CMD_CLOSE, 0, 1, NULL, 0), HM_SUCCESS);
        CHECK_EQ(open_there(&peer, c, 0, 2), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_CLOSE, 0, 2, NULL, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_DESTROY, 0, 0, NULL, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_MAPPINGS, 0, 0, NULL, 0), 0);
        peer_stop(&peer);
        CHECK_OK(hm_pool_free(pool, c));
        CHECK_OK(hm_pool_destroy(pool));
    }
}

/* ---- aligned: a shared mapping of an over-aligned export ---- */

static void test_aligned(const char *self) {
    hm_test_set_context("over-aligned export, two importing pools");
    peer_t peer;
    peer_start(&peer, self);
    hm_provider_t *prov;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
    hm_pool_t *pool;
    REQUIRE_OK(pool_over(0, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    /* A block whose 16 MiB-aligned start is not where the driver put it
     * (the driver's own address may be aligned by chance: such blocks are
     * kept aside until one is not). */
    void *p = NULL, *aside[8];
    int naside = 0;
    hm_cuda_allocation_t ai;
    while (naside < 8) {
        p = hm_pool_aligned_malloc(pool, 4 * MIB, 16 * MIB);
        REQUIRE(p);
        CHECK_OK(hm_cuda_allocation_info(prov, p, &ai));
        if (ai.base != (uintptr_t)p) break;
        aside[naside++] = p;
    }
    for (int i = 0; i < naside; i++) CHECK_OK(hm_pool_free(pool, aside[i]));
    CHECK_MSG(ai.base != (uintptr_t)p, "no block with an offset into the driver's allocation");
    for (int order = 0; order < 2; order++) { /* either pool opens first */
        CHECK_EQ(ask(&peer, CMD_NEW, 0, 0, NULL, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_NEW, 1, 0, NULL, 0), HM_SUCCESS);
        CHECK_EQ(open_there(&peer, p, order, 0), HM_SUCCESS);
        CHECK_EQ(open_there(&peer, p, 1 - order, 1), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_MAPPINGS, 0, 0, NULL, 0), 1);
        CHECK_EQ(ask(&peer, CMD_CLOSE, 0, 0, NULL, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_CLOSE, 0, 1, NULL, 0), HM_SUCCESS);
        /* The opener goes first; the other pool's destroy closes. */
        CHECK_EQ(ask(&peer, CMD_DESTROY, order, 0, NULL, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_MAPPINGS, 0, 0, NULL, 0), 1);
        CHECK_EQ(ask(&peer, CMD_DESTROY, 1 - order, 0, NULL, 0), HM_SUCCESS);
        CHECK_EQ(ask(&peer, CMD_MAPPINGS, 0, 0, NULL, 0), 0);
    }
    hm_test_set_context("a destroy whose close the driver refuses");
    CHECK_EQ(ask(&peer, CMD_NEW, 0, 0, NULL, 0), HM_SUCCESS);
    CHECK_EQ(open_there(&peer, p, 0, 0), HM_SUCCESS);
    CHECK_EQ(ask(&peer, CMD_FAIL_CLOSE, 0, 0, NULL, 0), 0);
    CHECK_EQ(ask(&peer, CMD_DESTROY, 0, 0, NULL, 0), HM_ERROR_DRIVER);
    peer_stop(&peer);
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
}

/* ---- wc: write-combined host memory ---- */

static void test_write_combined(void) {
    hm_test_set_context("write-combined host memory");
    hm_cuda_params_t *params;
    REQUIRE_OK(hm_cuda_params_create(&params));
    CHECK_OK(hm_cuda_params_set_memory_type(params, HM_CUDA_MEMORY_HOST));
    CHECK_OK(hm_cuda_params_set_flags(params, HM_CUDA_HOST_WRITE_COMBINED | HM_CUDA_HOST_MAPPED));
    hm_provider_t *prov;
    REQUIRE_OK(hm_cuda_provider_create(params, &prov));
    CHECK_OK(hm_cuda_params_destroy(params));
    hm_pool_t *pool;
    REQUIRE_OK(pool_over(1, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    const size_t n = 64 * KIB;
    unsigned char *p = hm_pool_malloc(pool, n);
    REQUIRE(p);
    CHECK_OK(hm_provider_fill(prov, p, 0xab, n));
    CHECK(p[0] == 0xab && p[n - 1] == 0xab);
    dev_put(prov, p, n, 5);
    CHECK(dev_check(prov, p, n, 5));
    unsigned char *z = hm_pool_calloc(pool, 1, n);
    REQUIRE(z);
    CHECK(z[0] == 0 && z[n / 2] == 0 && z[n - 1] == 0);
    hm_cuda_allocation_t ai;
    CHECK_OK(hm_cuda_allocation_info(prov, p + 100, &ai));
    CHECK(ai.type == HM_CUDA_MEMORY_HOST);
    CHECK_MSG(ai.device_ptr != (uintptr_t)(p + 100),
              "write-combined memory: the device address is the host pointer");
    /* The device address reaches the same bytes: the driver's memset there. */
    CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*sync)(CUstream);
    void *h = dlopen(getenv("HM_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h);
    *(void **)&memset_d8 = dlsym(h, "cuMemsetD8_v2");
    *(void **)&sync = dlsym(h, "cuStreamSynchronize");
    REQUIRE(memset_d8 && sync);
    CUcontext ctx = ai.context;
    REQUIRE(drv.ctx_set(ctx) == CUDA_SUCCESS);
    CHECK(memset_d8((CUdeviceptr)ai.device_ptr, 0xcd, 16) == CUDA_SUCCESS);
    CHECK(sync(NULL) == CUDA_SUCCESS);
    CHECK(p[100] == 0xcd && p[115] == 0xcd && p[116] == (unsigned char)pat(5, 116));
    REQUIRE(drv.ctx_set(NULL) == CUDA_SUCCESS);
    CHECK_OK(hm_pool_free(pool, z));
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
}

/* ---- oom: a full device, its memory cached by the pool ---- */

static int fill_device(hm_pool_t *pool, void **blocks, int max, size_t size) {
    int n = 0;
    while (n < max && (blocks[n] = hm_pool_malloc(pool, size)) != NULL) n++;
    CHECK_MSG(n < max && errno == ENOMEM, "the device did not run out (%d blocks, errno %d)", n,
              errno);
    return n;
}

static void free_all(hm_pool_t *pool, void **blocks, int n) {
    for (int i = 0; i < n; i++) CHECK_OK(hm_pool_free(pool, blocks[i]));
}

/* The device filled with small blocks, all freed (the pool may keep their
 * slabs), filled with large blocks, all freed (the pool may keep them),
 * filled with small blocks again: each fill must get (nearly) the whole
 * device, whatever the pool kept from the fill before. */
static void test_oom(void) {
    enum { MAX = 40000 };
    static void *blocks[MAX];
    const size_t small = 32 * KIB, large = 8 * MIB;
    const uint64_t device = (uint64_t)1 << 30;
    REQUIRE(drv.set_limit(0, device) == 0);
    for (int kind = 0; kind < 3; kind++) {
#ifndef HM_TEST_JEMALLOC
        if (kind == 2) continue;
#endif
        const char *name = kind == 0 ? "proxy" : kind == 1 ? "native" : "jemalloc";
        char label[64];
        snprintf(label, sizeof(label), "out of device memory, %s pool", name);
        hm_test_set_context(label);
        hm_provider_t *prov;
        REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
        hm_pool_t *pool;
        REQUIRE_OK(pool_over(kind, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
        int s1 = fill_device(pool, blocks, MAX, small);
        free_all(pool, blocks, s1);
        int l1 = fill_device(pool, blocks, MAX, large);
        free_all(pool, blocks, l1);
        int l2 = fill_device(pool, blocks, MAX, large);
        free_all(pool, blocks, l2);
        int s2 = fill_device(pool, blocks, MAX, small);
        free_all(pool, blocks, s2);
        printf("  %-8s pool on a 1 GiB device: %d blocks of 32 KiB (%.0f%%), then %d of 8 MiB "
               "(%.0f%%), again %d (%.0f%%), then %d of 32 KiB (%.0f%%)\n", name, s1,
               100.0 * (double)s1 * (double)small / (double)device, l1,
               100.0 * (double)l1 * (double)large / (double)device, l2,
               100.0 * (double)l2 * (double)large / (double)device, s2,
               100.0 * (double)s2 * (double)small / (double)device);
        /* Large blocks: the whole device, whatever the pool kept before
         * (the test driver charges exactly the 2 MiB-rounded sizes). */
        uint64_t floor = device * 63 / 64;
        CHECK_MSG(l1 * (uint64_t)large >= floor, "%s pool: %d large blocks after small ones "
                  "were freed (its cache kept the device's memory)", name, l1);
        CHECK_MSG(l2 * (uint64_t)large >= floor, "%s pool: %d large blocks the second time",
                  name, l2);
        /* Small blocks: the native pool carves them from slabs (the whole
         * device); the proxy pool takes each from the driver, and the
         * jemalloc pool gives each 32 KiB block (a large one for jemalloc)
         * an extent of its own, which the provider rounds to its 2 MiB
         * page (jemalloc.h): those two only must not lose any. */
        if (kind == 1)
            CHECK_MSG(s1 * (uint64_t)small >= floor && s2 * (uint64_t)small >= floor,
                      "%s pool: %d, then %d small blocks", name, s1, s2);
        CHECK_MSG(s2 >= s1, "%s pool: %d small blocks, %d the second time", name, s1, s2);
        CHECK_OK(hm_pool_destroy(pool));
    }
    REQUIRE(drv.set_limit(0, 256 * MIB) == 0);
}

/* ---- errors: a driver's code and its text ---- */

static void test_error_text(void) {
    hm_test_set_context("driver error text");
    hm_provider_t *prov;
    REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
    void *p = NULL;
    REQUIRE(drv.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
    CHECK_RES(hm_provider_alloc(prov, 4096, 0, &p), HM_ERROR_OUT_OF_MEMORY);
    const char *msg = NULL;
    CHECK_EQ(hm_last_native_error(&msg), (int64_t)CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(msg);
    CHECK_MSG(strstr(msg, "CUDA_ERROR_OUT_OF_MEMORY (CUresult 2)") != NULL, "message: %s", msg);
    CHECK_MSG(strstr(msg, strerror(ENOENT)) == NULL, "errno text in a driver error: %s", msg);
    size_t len = strlen(msg);
    CHECK_MSG(len > 0 && msg[len - 1] == ')', "text after the driver's code: %s", msg);
    CHECK_OK(hm_provider_destroy(prov));
}

/* ---- fork: a child's use of the parent's device pools ---- */

static int fork_child(hm_pool_t *pool, void *kept) {
    errno = 0;
    if (hm_pool_malloc(pool, 4096) != NULL || errno != ENOTSUP) return 2; /* cached blocks */
    if (hm_pool_malloc(pool, 64 * MIB) != NULL) return 3;
    if (hm_pool_calloc(pool, 1, 256) != NULL) return 4;
    if (hm_pool_aligned_malloc(pool, 4096, 4096) != NULL) return 5;
    if (hm_pool_free(pool, kept) != HM_SUCCESS) return 6;
    if (hm_pool_destroy(pool) != HM_SUCCESS) return 7;
    return 0;
}

static void test_fork(void) {
    for (int kind = 0; kind < 3; kind++) {
#if !defined(HM_TEST_JEMALLOC) || defined(HM_TSAN)
        /* Under TSan: jemalloc's fork handlers hold more locks at once than
         * its deadlock detector can track (64); Release and ASan run it. */
        if (kind == 2) continue;
#endif
        hm_test_set_context(kind == 0 ? "fork child, proxy pool"
                                      : kind == 1 ? "fork child, native pool" : "fork child, jemalloc pool");
        hm_provider_t *prov;
        REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
        hm_pool_t *pool;
        REQUIRE_OK(pool_over(kind, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
        void *kept = hm_pool_malloc(pool, 4096);
        void *freed = hm_pool_malloc(pool, 4096);
        REQUIRE(kept && freed);
        CHECK_OK(hm_pool_free(pool, freed)); /* cached by the pool */
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) _exit(fork_child(pool, kept));
        int st = 0;
        REQUIRE(waitpid(pid, &st, 0) == pid);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed at step %d (status 0x%x)",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1, st);
        void *again = hm_pool_malloc(pool, 4096); /* the parent's pool still works */
        CHECK(again != NULL);
        if (again) CHECK_OK(hm_pool_free(pool, again));
        CHECK_OK(hm_pool_free(pool, kept));
        CHECK_OK(hm_pool_destroy(pool));
    }
}

/* ---- streams: stream-ordered allocation on the driver's streams ---- */

static void test_streams(void) {
    void *h = dlopen(getenv("HM_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*memset_async)(CUdeviceptr, unsigned char, size_t, CUstream);
    *(void **)&stream_create = dlsym(h, "cuStreamCreate");
    *(void **)&stream_destroy = dlsym(h, "cuStreamDestroy_v2");
    *(void **)&stream_sync = dlsym(h, "cuStreamSynchronize");
    *(void **)&memset_async = dlsym(h, "cuMemsetD8Async");
    REQUIRE(stream_create && stream_destroy && stream_sync && memset_async);
    CUcontext ctx;
    REQUIRE(drv.primary_retain(&ctx, 0) == CUDA_SUCCESS);
    REQUIRE(drv.ctx_set(ctx) == CUDA_SUCCESS);
    const size_t n = 1 * MIB;
    for (int kind = 0; kind < 3; kind++) {
#ifndef HM_TEST_JEMALLOC
        if (kind == 2) continue;
#endif
        hm_test_set_context(kind == 0   ? "streams, proxy pool"
                            : kind == 1 ? "streams, native pool"
                                        : "streams, jemalloc pool");
        hm_provider_t *prov;
        REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
        CHECK(hm_provider_caps(prov) & HM_PROVIDER_CAP_STREAMS);
        hm_pool_t *pool;
        REQUIRE_OK(pool_over(kind, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
        CUstream s1, s2;
        REQUIRE(stream_create(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        REQUIRE(stream_create(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        void *p = hm_pool_malloc_async(pool, n, s1);
        REQUIRE(p);
        CHECK(memset_async((CUdeviceptr)(uintptr_t)p, 7, n, s1) == CUDA_SUCCESS);
        CHECK_OK(hm_pool_free_async(pool, p, s1));
        CHECK_MSG(stats().pending_ops > 0, "the memset ran already");
        void *q = hm_pool_malloc_async(pool, n, s2);
        REQUIRE(q);
        CHECK_MSG(q != p, "a block freed on s1 went to s2 while s1's memset was queued");
        void *r = hm_pool_malloc_async(pool, n, s1);
        CHECK_MSG(r == p, "s1 did not get back its own block at once");
        CHECK_OK(hm_pool_free_async(pool, r, s1));
        CHECK_OK(hm_pool_free_async(pool, q, s2));
        CHECK(stream_sync(s1) == CUDA_SUCCESS);
        void *a = hm_pool_malloc_async(pool, n, s2); /* its own: q */
        void *b = hm_pool_malloc_async(pool, n, s2); /* s1's, now done: p */
        CHECK(a == q);
        CHECK_MSG(b == p, "s2 did not reuse s1's block after s1's work was done");
        hm_stream_stats_t st;
        CHECK_OK(hm_pool_get_stream_stats(pool, &st));
        CHECK(st.same_stream == 2 && st.other_stream == 1);
        CHECK_MSG(st.events >= 1 && st.events <= 2, "%llu events recorded",
                  (unsigned long long)st.events);
        /* Injected failures: a failed record or query keeps s2's blocks
         * from s1; the next demand records again. */
        CHECK_OK(hm_pool_free_async(pool, a, s2));
        CHECK(stream_sync(s2) == CUDA_SUCCESS);
        CHECK(drv.fail_next("cuEventRecord", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
        void *c = hm_pool_malloc_async(pool, n, s1);
        CHECK(c != NULL && c != a);
        CHECK(drv.fail_next("cuEventQuery", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
        void *c2 = hm_pool_malloc_async(pool, n, s1); /* the record works, the query fails */
        CHECK(c2 != NULL && c2 != a);
        void *c3 = hm_pool_malloc_async(pool, n, s1); /* now s2's */
        CHECK(c3 == a);
        CHECK_OK(hm_pool_free(pool, c));
        CHECK_OK(hm_pool_free(pool, c2));
        CHECK_OK(hm_pool_free_async(pool, c3, s2));
        CHECK(memset_async((CUdeviceptr)(uintptr_t)b, 1, n, s2) == CUDA_SUCCESS);
        CHECK_OK(hm_pool_free_async(pool, b, s2));
        /* s2 forgotten and destroyed with its blocks pending: they wait
         * for their events like any other stream's. */
        CHECK_OK(hm_pool_stream_forget(pool, s2));
        CHECK(stream_destroy(s2) == CUDA_SUCCESS);
        CHECK(drv.fail_next("cuEventSynchronize", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
        hm_result_t tr = hm_pool_trim(pool); /* waits (one wait fails: logged) */
        CHECK(tr == HM_SUCCESS || tr == HM_ERROR_NOT_SUPPORTED);
        CHECK_OK(hm_pool_get_stream_stats(pool, &st));
        CHECK_EQ(st.cached_blocks, 0);
        /* A fresh pool's first event: its creation fails. */
        void *d = hm_pool_malloc_async(pool, n, s1);
        REQUIRE(d);
        CHECK_OK(hm_pool_destroy(pool)); /* d still allocated: reported */
        REQUIRE_OK(cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &prov));
        REQUIRE_OK(pool_over(kind, prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
        void *e = hm_pool_malloc_async(pool, n, s1);
        REQUIRE(e);
        CHECK(memset_async((CUdeviceptr)(uintptr_t)e, 2, n, s1) == CUDA_SUCCESS);
        CHECK_OK(hm_pool_free_async(pool, e, s1));
        CHECK(drv.fail_next("cuEventCreate", 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
        CHECK_OK(hm_pool_stream_forget(pool, s1)); /* no event: e stays s1's (logged) */
        CHECK(stream_sync(s1) == CUDA_SUCCESS);
        CHECK(stream_destroy(s1) == CUDA_SUCCESS);
        CHECK_OK(hm_pool_destroy(pool)); /* e given back without a wait (logged) */
    }
    CHECK_EQ(stats().live_events, 0);
    REQUIRE(drv.ctx_set(NULL) == CUDA_SUCCESS);
    REQUIRE(drv.primary_release(0) == CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "importer") == 0) return importer(atoi(argv[2]));
    const char *part = argc > 1 ? argv[1] : "unit";
    if (!getenv("HM_CUDA_DRIVER"))
        HM_TEST_SKIP("HM_CUDA_DRIVER is not set (CTest sets it to the test driver)");
    hm_provider_t *probe;
    hm_result_t r = cu_provider(HM_CUDA_MEMORY_DEVICE, 0, &probe);
    if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("no CUDA driver");
    REQUIRE_OK(r);
    driver_api();
    bool all = strcmp(part, "all") == 0;
    int ran = 0;
#define RUN(name, call)                          \
    if (all || strcmp(part, name) == 0) {        \
        ran++;                                   \
        call;                                    \
    }
    RUN("reuse", test_reuse(argv[0]));
    RUN("aligned", test_aligned(argv[0]));
    RUN("unit", test_write_combined(); test_error_text());
    RUN("oom", test_oom());
    RUN("fork", test_fork());
    RUN("streams", test_streams());
#undef RUN
    if (!ran) {
        fprintf(stderr, "unknown part '%s'\n", part);
        return 2;
    }
    CHECK_OK(hm_provider_destroy(probe));
    CHECK_EQ(stats().live_allocs, 0);
    CHECK_EQ(stats().live_ipc_mappings, 0);
    return hm_test_finish();
}
