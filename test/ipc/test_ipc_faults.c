/* hetmem IPC — faults injected in the IPC path under real pools.
 * SPDX-License-Identifier: MIT
 *
 * This program (the fault side) and a peer (this program exec'd with
 * --peer, plain pools, no faults) pass handles over a SOCK_SEQPACKET
 * channel, each handle with its descriptor (SCM_RIGHTS), so no pidfd is
 * needed. On the fault side the pool's provider is the fault-injecting
 * wrapper (test/common/fault_provider.c) around a real IPC-capable provider:
 * the OS provider in HM_OS_SHARED mode or the file provider. For each of
 * those, each pool (proxy, native, and jemalloc where built) and each op of
 * the IPC path, the op fails at its 1st, 2nd and 5th call from arming:
 *
 *   ipc.get      hm_ipc_get of a new allocation (exporter)
 *   ipc.put      export released by a free after the last hm_ipc_put, by the
 *                last hm_ipc_put after a free, by the export cache bound, by
 *                the pool destroy with handles outstanding (exporter)
 *   ipc.open     hm_ipc_open_fd of a new mapping, also of a newer allocation
 *                at a cached remote address (importer)
 *   ipc.close    mapping closed by the opened-handle cache bound, by the last
 *                close of a stale mapping, by the pool destroy (importer)
 *   close_many   the pool destroy's batch close (OS provider; importer)
 *   purge_force  under the pool's own trim/decay, and hm_pool_provider_purge
 *
 * After each injected failure: the public call whose own work the op is
 * (get, open, hm_pool_provider_purge) returns the injected error and hands
 * out nothing; a call that only triggers the op as deferred work (a free, a
 * put, a close, a trim) succeeds and the failure is logged; a failed put or
 * close is made again with the next one the provider accepts, so the range
 * or mapping is not held for good; nothing is mapped that the provider's
 * counters and the caches do not account for (/proc/self/maps, in bytes);
 * the export and opened-handle caches agree (hm_ipc_get_cache_stats); the
 * next call, the fault disarmed, works; and once the pool is destroyed the
 * provider holds nothing (no allocation, export or mapping) except what a
 * failure in the destroy itself, the last chance, left: exactly the failed
 * op's share, logged. Leaks of host memory: ASan's leak check. */
#include "conformance.h"
/* The peer is this very program (peers_start), not ipc_peer: peer_start()
 * of ipc_test_util.h is not used. */
#define IPC_PEER_PATH "/proc/self/exe"
#include "ipc_test_util.h"

#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define KB ((size_t)1024)
#define SIZE (256 * KB) /* one provider range per allocation in every pool */
#define FILL 4096       /* bytes written of each allocation (keeps RSS small) */
#define INJECTED HM_ERROR_DRIVER
#define EXPORT_MAX 8 /* HM_IPC_EXPORT_CACHE_MAX for this process */

enum { K_OS, K_FILE, K_COUNT };
enum { P_PROXY, P_NATIVE, P_JEMALLOC, P_COUNT };
static const char *const kind_name[K_COUNT] = {"os-shared", "file"};
static const char *const pool_name[P_COUNT] = {"proxy", "native", "jemalloc"};
static const long nths[] = {1, 2, 5};

/* Peer commands beyond ipc_proto.h's. */
enum {
    X_EXPORT = 100, /* slot, a = size, b = fill byte: allocate, fill, hm_ipc_get; the
                       reply then the handle (with its descriptor) follow */
    X_UNEXPORT,     /* slot: hm_ipc_put, free */
    X_REEXPORT,     /* slot, b = fill: put, free, allocate the same size again (v[1]: at
                       the same address), fill, get; reply and handle as X_EXPORT */
};

/* ------------------------------------------------------------------------ */
/* log capture                                                              */

#define LOG_LINES 128
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_ring[LOG_LINES][320];
static unsigned log_seq;

static void log_sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    pthread_mutex_lock(&log_lock);
    snprintf(log_ring[log_seq % LOG_LINES], sizeof(log_ring[0]), "%s", line);
    log_seq++;
    pthread_mutex_unlock(&log_lock);
    fprintf(stderr, "  [hetmem %s] %s\n", level >= HM_LOG_ERROR ? "error" : "warn", line);
}

static unsigned log_mark(void) {
    pthread_mutex_lock(&log_lock);
    unsigned m = log_seq;
    pthread_mutex_unlock(&log_lock);
    return m;
}

/* Lines logged since mark that contain needle. */
static int logged_since(unsigned mark, const char *needle) {
    int n = 0;
    pthread_mutex_lock(&log_lock);
    for (unsigned i = mark; i != log_seq; i++)
        if (log_seq - i <= LOG_LINES && strstr(log_ring[i % LOG_LINES], needle)) n++;
    pthread_mutex_unlock(&log_lock);
    return n;
}

/* ------------------------------------------------------------------------ */
/* what is mapped                                                           */

/* Bytes mapped of needle (a memfd's name or a path) by /proc/self/maps;
 * bytes, not lines: the kernel merges adjacent mappings of one file. The
 * ranges themselves in lo/hi (up to *n) when asked. */
static size_t maps_scan(const char *needle, uintptr_t *lo, uintptr_t *hi, int *n) {
    FILE *f = fopen("/proc/self/maps", "r");
    REQUIRE(f);
    char line[1024];
    size_t bytes = 0;
    int k = 0, cap = n ? *n : 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long a, b;
        if (!strstr(line, needle) || sscanf(line, "%lx-%lx", &a, &b) != 2) continue;
        bytes += b - a;
        if (k < cap) {
            lo[k] = a;
            hi[k++] = b;
        }
    }
    fclose(f);
    if (n) *n = k;
    return bytes;
}
static size_t maps_bytes(const char *needle) { return maps_scan(needle, NULL, NULL, NULL); }

/* Unmap what is still mapped of needle (what a failed close in a pool
 * destroy left); the bytes. */
static size_t unmap_leftovers(const char *needle) {
    uintptr_t lo[64], hi[64];
    int n = 64;
    size_t bytes = maps_scan(needle, lo, hi, &n);
    for (int i = 0; i < n; i++) munmap((void *)lo[i], hi[i] - lo[i]);
    return bytes;
}

/* ------------------------------------------------------------------------ */
/* the peer                                                                 */

static char work_dir[64];

static hm_pool_t *peer_pool(const char *kind, const char *path) {
    hm_provider_t *prov = NULL;
    hm_pool_t *pool = NULL;
    if (!strcmp(kind, "file")) {
        if (hm_file_provider_create(path, &prov)) return NULL;
    } else {
        hm_os_params_t *p;
        if (hm_os_params_create(&p)) return NULL;
        hm_os_params_set_visibility(p, HM_OS_SHARED);
        hm_os_params_set_shm_name(p, "hmfltpeer");
        hm_result_t r = hm_os_provider_create(p, &prov);
        hm_os_params_destroy(p);
        if (r) return NULL;
    }
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool)) return NULL;
    return pool;
}

typedef struct pslot {
    unsigned char *p;
    size_t size;
    hm_ipc_handle_t *h;
    size_t len;
} pslot_t;

static int peer_main(int sock, const char *kind, const char *path) {
    hm_ipc_channel_t *ch;
    if (hm_ipc_channel_from_fd(sock, &ch)) return 3;
    char ipath[256];
    snprintf(ipath, sizeof(ipath), "%s.import", path);
    hm_pool_t *exp = peer_pool(kind, path), *imp = peer_pool(kind, ipath);
    if (!exp || !imp) return 4;
    static pslot_t x[64];
    static unsigned char *in[64];
    static unsigned char buf[4096];
    for (;;) {
        peer_msg_t m;
        size_t n;
        if (hm_ipc_channel_recv_bytes(ch, &m, sizeof(m), &n) || n != sizeof(m)) break;
        peer_reply_t rep;
        memset(&rep, 0, sizeof(rep));
        int s = m.slot >= 0 && m.slot < 64 ? m.slot : 0;
        int send_handle = 0;
        switch (m.op) {
        case X_REEXPORT: {
            unsigned char *old = x[s].p;
            size_t size = x[s].size;
            hm_ipc_put(x[s].h);
            hm_pool_free(exp, old);
            m.a = size;
            rep.v[1] = 0;
            x[s].p = hm_pool_malloc(exp, size);
            rep.v[1] = x[s].p == old;
        }
            /* fall through */
        case X_EXPORT:
            if (m.op == X_EXPORT) {
                x[s].p = hm_pool_malloc(exp, (size_t)m.a);
                x[s].size = (size_t)m.a;
            }
            if (!x[s].p) {
                rep.result = HM_ERROR_OUT_OF_MEMORY;
                break;
            }
            memset(x[s].p, (int)m.b, FILL);
            rep.result = hm_ipc_get(x[s].p, &x[s].h, &x[s].len);
            rep.v[0] = (uint64_t)(uintptr_t)x[s].p;
            send_handle = rep.result == HM_SUCCESS;
            break;
        case X_UNEXPORT:
            rep.result = hm_ipc_put(x[s].h);
            if (hm_pool_free(exp, x[s].p)) rep.result = HM_ERROR_UNKNOWN;
            x[s].p = NULL;
            break;
        case PEER_OPEN: {
            int fd = -1;
            size_t len;
            hm_result_t r = hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd);
            void *q = NULL;
            if (r == HM_SUCCESS) r = hm_ipc_open_fd(imp, (const hm_ipc_handle_t *)buf, len, fd, &q);
            if (fd >= 0) close(fd);
            rep.result = r;
            rep.v[0] = (uint64_t)(uintptr_t)q;
            if (r == HM_SUCCESS) {
                in[s] = q;
                rep.v[1] = in[s][100];
            }
            break;
        }
        case PEER_READ:
            rep.v[0] = in[s][m.a];
            break;
        case PEER_CLOSE:
            rep.result = hm_ipc_close(in[s]);
            in[s] = NULL;
            break;
        case PEER_STATS: {
            hm_ipc_cache_stats_t st;
            rep.result = hm_ipc_get_cache_stats(&st);
            rep.v[0] = st.entries;
            rep.v[2] = st.in_use;
            rep.v[7] = st.exports;
            break;
        }
        case PEER_DESTROY: /* the import pool: drop every cached mapping */
            rep.result = hm_pool_destroy(imp);
            imp = peer_pool(kind, ipath);
            if (!imp) rep.result = HM_ERROR_OUT_OF_HOST_MEMORY;
            break;
        case PEER_EXIT:
            hm_ipc_channel_send_bytes(ch, &rep, sizeof(rep));
            goto out;
        default:
            rep.result = HM_ERROR_INVALID_ARGUMENT;
        }
        if (hm_ipc_channel_send_bytes(ch, &rep, sizeof(rep))) break;
        if (send_handle && hm_ipc_channel_send(ch, x[s].h, x[s].len)) break;
    }
out:
    for (int i = 0; i < 64; i++)
        if (x[i].p) {
            hm_ipc_put(x[i].h);
            hm_pool_free(exp, x[i].p);
        }
    hm_pool_destroy(imp);
    hm_pool_destroy(exp);
    hm_ipc_channel_destroy(ch);
    unlink(path);
    unlink(ipath);
    return 0;
}

static peer_t peers[K_COUNT];
static char peer_file[K_COUNT][128];
static const char *peer_needle[K_COUNT]; /* the peer's memory in /proc/self/maps */

static void peers_start(void) {
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    REQUIRE(sl > 0);
    self[sl] = 0;
    for (int k = 0; k < K_COUNT; k++) {
        int sv[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
        char fdarg[16];
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        snprintf(peer_file[k], sizeof(peer_file[k]), "%s/peer-%s", work_dir, kind_name[k]);
        char *argv[] = {self, (char *)"--peer", fdarg, (char *)(k == K_FILE ? "file" : "os"),
                        peer_file[k], NULL};
        peers[k].pid = spawn(argv, NULL, sv[0]);
        close(sv[1]);
        peers[k].sock = sv[0];
        peers[k].scm = 1;
        REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], &peers[k].ch));
    }
    peer_needle[K_OS] = "memfd:hmfltpeer";
    peer_needle[K_FILE] = peer_file[K_FILE];
}

/* A handle the peer made, with its descriptor (or -1). */
typedef struct rhandle {
    unsigned char b[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    size_t len;
    int fd;
    uint64_t remote; /* the peer's pointer */
} rhandle_t;

static void rhandle_release(rhandle_t *h) {
    if (h->fd >= 0) close(h->fd);
    h->fd = -1;
}

static peer_reply_t peer_export(peer_t *pe, int op, int slot, size_t size, int fill,
                                rhandle_t *out) {
    peer_msg_t m = {.op = op, .slot = slot, .a = size, .b = (uint64_t)fill};
    peer_reply_t r;
    memset(&r, 0, sizeof(r));
    REQUIRE_OK(hm_ipc_channel_send_bytes(pe->ch, &m, sizeof(m)));
    size_t n = 0;
    REQUIRE_OK(hm_ipc_channel_recv_bytes(pe->ch, &r, sizeof(r), &n));
    REQUIRE(n == sizeof(r));
    out->fd = -1;
    if (r.result == HM_SUCCESS)
        REQUIRE_OK(hm_ipc_channel_recv(pe->ch, out->b, sizeof(out->b), &out->len, &out->fd));
    out->remote = r.v[0];
    return r;
}

/* The peer opens a handle of ours, reads offset 100, closes: the byte, or
 * -1 if it could not open. */
static int peer_roundtrip(peer_t *pe, const hm_ipc_handle_t *h, size_t len) {
    peer_reply_t r = peer_open(pe, PEER_OPEN, 0, 0, h, len, 1);
    if (r.result != HM_SUCCESS) {
        CHECK_MSG(0, "the peer cannot open our handle: %s", hm_result_string(r.result));
        return -1;
    }
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 0, 0, 0, 0).result);
    return (int)r.v[1];
}

/* ------------------------------------------------------------------------ */
/* the fault side: a fault provider around a real one, a pool over it        */

static unsigned file_seq;

static hm_provider_t *make_fault(int kind, int nofree) {
    hm_provider_t *inner = NULL;
    if (kind == K_OS) {
        hm_os_params_t *p;
        REQUIRE_OK(hm_os_params_create(&p));
        REQUIRE_OK(hm_os_params_set_visibility(p, HM_OS_SHARED));
        REQUIRE_OK(hm_os_params_set_shm_name(p, "hmfltmain"));
        REQUIRE_OK(hm_os_provider_create(p, &inner));
        hm_os_params_destroy(p);
    } else {
        char path[256];
        snprintf(path, sizeof(path), "%s/main-%u", work_dir, file_seq++);
        hm_file_params_t *fp;
        REQUIRE_OK(hm_file_params_create(path, &fp));
        REQUIRE_OK(hm_file_params_set_keep_file(fp, false));
        REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &inner));
        hm_file_params_destroy(fp);
    }
    hm_fault_params_t fp = {.inner = inner, .own_inner = 1, .fail_with = INJECTED};
    hm_provider_t *f = NULL;
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops_for(inner, nofree), &fp, &f));
    CHECK(hm_provider_caps(f) & HM_PROVIDER_CAP_IPC);
    return f;
}

/* A pool over fault that does not own it: the provider's counters are read
 * after the pool is gone. */
static hm_pool_t *make_pool(int pk, hm_provider_t *fault) {
    hm_pool_t *pool = NULL;
    switch (pk) {
    case P_PROXY: REQUIRE_OK(hm_proxy_pool_create(fault, 0, &pool)); break;
    case P_NATIVE: REQUIRE_OK(hm_native_pool_create(fault, NULL, 0, &pool)); break;
#ifdef HM_TEST_JEMALLOC
    case P_JEMALLOC: {
        /* Freed extents go back at once (decay 0): frees reach the provider
         * during the test, as in the other pools. */
        hm_jemalloc_params_t *jp;
        REQUIRE_OK(hm_jemalloc_params_create(&jp));
        REQUIRE_OK(hm_jemalloc_params_set_decay_ms(jp, 0, 0));
        REQUIRE_OK(hm_jemalloc_pool_create(fault, jp, 0, &pool));
        hm_jemalloc_params_destroy(jp);
        break;
    }
#endif
    default: REQUIRE(0);
    }
    return pool;
}

/* hm_pool_trim: the proxy pool has none (nothing to trim). */
static void trim(hm_pool_t *pool) {
    hm_result_t r = hm_pool_trim(pool);
    CHECK_MSG(r == HM_SUCCESS || r == HM_ERROR_NOT_SUPPORTED, "hm_pool_trim -> %s",
              hm_result_string(r));
}

static hm_ipc_cache_stats_t stats(void) {
    hm_ipc_cache_stats_t st;
    REQUIRE_OK(hm_ipc_get_cache_stats(&st));
    return st;
}

/* Destroy pool (fault outlives it), then check that the provider holds
 * nothing but what the caller expects a failure in the destroy itself to
 * have left (exports, mappings), then destroy the provider. */
static void teardown(hm_pool_t *pool, hm_provider_t *fault, int nofree, long exports_left,
                     long mappings_left) {
    if (pool) CHECK_OK(hm_pool_destroy(pool));
    CHECK_EQ(hm_fault_provider_misuse(fault), 0);
    if (!nofree) CHECK_EQ(hm_fault_provider_live(fault), 0);
    CHECK_EQ(hm_fault_provider_exports(fault), exports_left);
    CHECK_EQ(hm_fault_provider_mappings(fault), mappings_left);
    CHECK_OK(hm_provider_destroy(fault));
    hm_ipc_cache_stats_t st = stats();
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.exports, 0);
}

static char ctx[256];
static void context(const char *what, int kind, int pk, long nth) {
    snprintf(ctx, sizeof(ctx), "%s, %s provider, %s pool, fail call #%ld", what, kind_name[kind],
             pool_name[pk], nth);
    hm_test_set_context(ctx);
}

/* An op armed to fail once: did it fire since `before`? */
#define FIRED(fault, before) (hm_fault_provider_injected(fault) != (before))

/* ------------------------------------------------------------------------ */
/* exporter side: ipc.get                                                   */

static void fault_get(int kind, int pk, long nth) {
    context("ipc.get", kind, pk, nth);
    peer_t *pe = &peers[kind];
    hm_provider_t *fault = make_fault(kind, 0);
    hm_pool_t *pool = make_pool(pk, fault);
    enum { N = 7 };
    unsigned char *b[N];
    hm_ipc_handle_t *h[N];
    size_t len[N];
    hm_fault_provider_arm(fault, HM_FAULT_IPC_GET, nth);
    int fired = 0;
    for (int i = 0; i < N; i++) {
        REQUIRE((b[i] = hm_pool_malloc(pool, SIZE)));
        memset(b[i], i + 1, FILL);
        hm_ipc_cache_stats_t s0 = stats();
        long ex0 = hm_fault_provider_exports(fault), inj0 = hm_fault_provider_injected(fault);
        unsigned mark = log_mark();
        hm_result_t r = hm_ipc_get(b[i], &h[i], &len[i]);
        if (FIRED(fault, inj0)) {
            fired++;
            CHECK_RES(r, INJECTED);
            CHECK(h[i] == NULL && len[i] == 0);
            CHECK_EQ(stats().exports, s0.exports); /* no export entry */
            CHECK_EQ(hm_fault_provider_exports(fault), ex0);
            CHECK(logged_since(mark, "could not export"));
            r = hm_ipc_get(b[i], &h[i], &len[i]); /* disarmed: works */
        }
        REQUIRE_OK(r);
        CHECK_EQ(peer_roundtrip(pe, h[i], len[i]), i + 1);
    }
    CHECK_EQ(fired, 1);
    CHECK_EQ(hm_fault_provider_calls(fault, HM_FAULT_IPC_GET), N + 1);
    for (int i = 0; i < N; i++) {
        CHECK_OK(hm_ipc_put(h[i]));
        CHECK_OK(hm_pool_free(pool, b[i]));
    }
    teardown(pool, fault, 0, 0, 0);
    CHECK_OK(peer_cmd(pe, PEER_DESTROY, 0, 0, 0, 0, 0).result);
}

/* ------------------------------------------------------------------------ */
/* exporter side: ipc.put                                                   */

enum { PUT_FREE_AFTER_PUT, PUT_PUT_AFTER_FREE, PUT_EVICT, PUT_DESTROY, PUT_MODES };
static const char *const put_mode[PUT_MODES] = {
    "ipc.put at the free of an unused export", "ipc.put at the last hm_ipc_put after a free",
    "ipc.put at export cache eviction", "ipc.put at the pool destroy (handles outstanding)"};

static void fault_put(int mode, int kind, int pk, long nth) {
    context(put_mode[mode], kind, pk, nth);
    peer_t *pe = &peers[kind];
    hm_provider_t *fault = make_fault(kind, 0);
    hm_pool_t *pool = make_pool(pk, fault);
    enum { N = 7, NE = EXPORT_MAX + 6 };
    unsigned char *b[NE];
    hm_ipc_handle_t *h[NE];
    size_t len[NE];
    unsigned mark = log_mark();
    hm_fault_provider_arm(fault, HM_FAULT_IPC_PUT, nth);
    long inj0 = hm_fault_provider_injected(fault);
    int n = mode == PUT_EVICT ? NE : N;
    /* All allocated first: distinct provider ranges (a pool reuses a range
     * it still holds for the next allocation, and its export with it). */
    for (int i = 0; i < n; i++) {
        REQUIRE((b[i] = hm_pool_malloc(pool, SIZE)));
        memset(b[i], i + 1, FILL);
    }
    for (int i = 0; i < n; i++) {
        REQUIRE_OK(hm_ipc_get(b[i], &h[i], &len[i]));
        CHECK_EQ(peer_roundtrip(pe, h[i], len[i]), i + 1);
        switch (mode) {
        case PUT_FREE_AFTER_PUT:
            CHECK_OK(hm_ipc_put(h[i]));
            CHECK_OK(hm_pool_free(pool, b[i])); /* the provider put, maybe failing */
            b[i] = NULL;
            break;
        case PUT_PUT_AFTER_FREE:
            CHECK_OK(hm_pool_free(pool, b[i]));
            b[i] = NULL;
            CHECK_OK(hm_ipc_put(h[i])); /* the last one: the provider put */
            break;
        case PUT_EVICT:
            CHECK_OK(hm_ipc_put(h[i])); /* unused: the bound evicts it */
            CHECK(stats().exports <= EXPORT_MAX);
            break;
        default: /* PUT_DESTROY: outstanding until the pool is gone */
            break;
        }
    }
    /* The native and jemalloc pools may keep a freed range a while: hand
     * them back now, so that the put happens before the destroy. */
    if (mode != PUT_DESTROY) trim(pool);
    int fired_before_destroy = FIRED(fault, inj0);
    if (mode == PUT_EVICT) CHECK_MSG(fired_before_destroy, "an eviction put failed");
    if (fired_before_destroy) CHECK(logged_since(mark, "put of the export") &&
                                    logged_since(mark, "tried again"));
    hm_fault_provider_disarm(fault);
    /* The allocations the modes keep still work, also through IPC. */
    for (int i = 0; i < n; i++) {
        if (!b[i]) continue;
        CHECK_EQ(b[i][0], i + 1);
        if (mode == PUT_EVICT) {
            hm_ipc_handle_t *h2;
            size_t l2;
            CHECK_OK(hm_ipc_get(b[i], &h2, &l2));
            CHECK_EQ(peer_roundtrip(pe, h2, l2), i + 1);
            CHECK_OK(hm_ipc_put(h2));
            CHECK_OK(hm_pool_free(pool, b[i]));
        }
    }
    long exports_left = 0;
    if (mode == PUT_DESTROY) {
        /* The provider outlives the pool: the exports stay, and their ranges
         * stay allocated, until their last puts (ipc.h), which put them
         * (the nth failing) and give the ranges back. */
        hm_fault_provider_arm(fault, HM_FAULT_IPC_PUT, nth);
        mark = log_mark();
        CHECK_OK(hm_pool_destroy(pool));
        pool = NULL;
        CHECK(!FIRED(fault, inj0)); /* no put at the destroy */
        CHECK(logged_since(mark, "were not put"));
        CHECK(logged_since(mark, "until their last put"));
        CHECK_EQ(stats().exports, 0);
        CHECK_EQ(hm_fault_provider_exports(fault), n);
        for (int i = 0; i < n; i++) CHECK_OK(hm_ipc_put(h[i]));
        CHECK(FIRED(fault, inj0) == (nth <= n));
        if (FIRED(fault, inj0)) CHECK(logged_since(mark, "put of the export"));
        hm_fault_provider_disarm(fault);
        /* A refused one is put again at the provider's next accepted put. */
        hm_pool_t *again = make_pool(pk, fault);
        unsigned char *c = hm_pool_malloc(again, SIZE);
        REQUIRE(c);
        hm_ipc_handle_t *hc;
        size_t lc;
        CHECK_OK(hm_ipc_get(c, &hc, &lc));
        CHECK_OK(hm_ipc_put(hc));
        CHECK_OK(hm_pool_free(again, c));
        CHECK_OK(hm_pool_destroy(again));
        exports_left = 0;
    } else {
        CHECK_MSG(FIRED(fault, inj0), "ipc.put call #%ld was made", nth);
        /* The refused put is made again with the next put the provider
         * accepts: one more export released, and the provider holds nothing
         * before the pool goes. */
        unsigned char *c = hm_pool_malloc(pool, SIZE);
        REQUIRE(c);
        hm_ipc_handle_t *hc;
        size_t lc;
        CHECK_OK(hm_ipc_get(c, &hc, &lc));
        CHECK_OK(hm_ipc_put(hc));
        CHECK_OK(hm_pool_free(pool, c));
        trim(pool);
        CHECK_EQ(hm_fault_provider_exports(fault), 0);
        CHECK_EQ(stats().exports, 0);
    }
    teardown(pool, fault, 0, exports_left, 0);
    CHECK_OK(peer_cmd(pe, PEER_DESTROY, 0, 0, 0, 0, 0).result);
}

/* ------------------------------------------------------------------------ */
/* importer side: ipc.open                                                  */

static void fault_open(int kind, int pk, long nth) {
    context("ipc.open", kind, pk, nth);
    peer_t *pe = &peers[kind];
    const char *needle = peer_needle[kind];
    size_t maps0 = maps_bytes(needle);
    hm_provider_t *fault = make_fault(kind, 0);
    hm_pool_t *pool = make_pool(pk, fault);
    enum { N = 7 };
    rhandle_t rh[N];
    unsigned char *p[N];
    for (int i = 0; i < N; i++) REQUIRE_OK(peer_export(pe, X_EXPORT, i, SIZE, i + 1, &rh[i]).result);
    hm_fault_provider_arm(fault, HM_FAULT_IPC_OPEN, nth);
    int fired = 0;
    for (int i = 0; i < N; i++) {
        hm_ipc_cache_stats_t s0 = stats();
        long m0 = hm_fault_provider_mappings(fault), inj0 = hm_fault_provider_injected(fault);
        size_t maps = maps_bytes(needle);
        unsigned mark = log_mark();
        void *q = (void *)1;
        hm_result_t r = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len,
                                       rh[i].fd, &q);
        if (FIRED(fault, inj0)) {
            fired++;
            CHECK_RES(r, INJECTED);
            CHECK(q == NULL);
            CHECK_EQ(maps_bytes(needle), maps); /* nothing mapped */
            CHECK_EQ(hm_fault_provider_mappings(fault), m0);
            hm_ipc_cache_stats_t s1 = stats();
            CHECK_EQ(s1.entries, s0.entries); /* no entry left behind */
            CHECK_EQ(s1.in_use, s0.in_use);
            CHECK_EQ(s1.misses, s0.misses + 1);
            CHECK(logged_since(mark, "could not open"));
            r = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len, rh[i].fd,
                               &q);
        }
        REQUIRE_OK(r);
        p[i] = q;
        CHECK_EQ(p[i][100], i + 1);
        CHECK(hm_pool_by_ptr(p[i]) == pool);
        if (i % 2) CHECK_OK(hm_ipc_close(p[i])); /* half stay in use */
    }
    CHECK_EQ(fired, 1);
    CHECK_EQ(maps_bytes(needle), maps0 + N * SIZE);
    hm_ipc_cache_stats_t st = stats();
    CHECK_EQ(st.entries, N);
    CHECK_EQ(st.in_use, (N + 1) / 2);

    /* A newer allocation at a cached remote address whose open fails
     * replaces nothing: the cached mapping stays, and is replaced by the
     * next open that succeeds. */
    hm_fault_provider_arm(fault, HM_FAULT_IPC_OPEN, 1);
    rhandle_t nh;
    peer_reply_t rr = peer_export(pe, X_REEXPORT, 1, SIZE, 0x70, &nh);
    REQUIRE_OK(rr.result);
    if (rr.v[1]) { /* the same remote address */
        hm_ipc_cache_stats_t s0 = stats();
        size_t maps = maps_bytes(needle);
        void *q = (void *)1;
        CHECK_RES(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)nh.b, nh.len, nh.fd, &q),
                  INJECTED);
        CHECK(q == NULL);
        hm_ipc_cache_stats_t s1 = stats();
        CHECK_EQ(s1.stale, s0.stale);
        CHECK_EQ(s1.entries, s0.entries);
        CHECK_EQ(maps_bytes(needle), maps);
        CHECK_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)nh.b, nh.len, nh.fd, &q));
        CHECK_EQ(((unsigned char *)q)[100], 0x70);
        CHECK_EQ(stats().stale, s0.stale + 1);
        CHECK_EQ(stats().entries, s0.entries); /* the unused old one went */
        CHECK_OK(hm_ipc_close(q));
    } else {
        printf("note: the peer's reallocation moved; the stale-replacement case is skipped\n");
        hm_fault_provider_disarm(fault);
    }
    rhandle_release(&nh);
    for (int i = 0; i < N; i += 2) CHECK_OK(hm_ipc_close(p[i]));
    teardown(pool, fault, 0, 0, 0);
    CHECK_EQ(maps_bytes(needle), maps0);
    for (int i = 0; i < N; i++) {
        CHECK_OK(peer_cmd(pe, X_UNEXPORT, 0, i, 0, 0, 0).result);
        rhandle_release(&rh[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* importer side: ipc.close and close_many                                  */

enum { CLOSE_EVICT, CLOSE_STALE, CLOSE_DESTROY, CLOSE_MANY_DESTROY, CLOSE_MODES };
static const char *const close_mode[CLOSE_MODES] = {
    "ipc.close at opened-handle cache eviction", "ipc.close at the last close of a stale mapping",
    "ipc.close at the pool destroy", "ipc.close_many at the pool destroy"};

static void fault_close(int mode, int kind, int pk, long nth) {
    context(close_mode[mode], kind, pk, nth);
    peer_t *pe = &peers[kind];
    const char *needle = peer_needle[kind];
    size_t maps0 = maps_bytes(needle);
    hm_provider_t *fault = make_fault(kind, 0);
    const hm_provider_ops_t *ops = hm_provider_get_ops(fault);
    int has_many = ops->ipc.close_many != NULL;
    if ((mode == CLOSE_MANY_DESTROY && !has_many) || (mode == CLOSE_DESTROY && has_many)) {
        CHECK_OK(hm_provider_destroy(fault)); /* the destroy takes the other path */
        return;
    }
    hm_pool_t *pool = make_pool(pk, fault);
    hm_fault_op_t op = mode == CLOSE_MANY_DESTROY ? HM_FAULT_IPC_CLOSE_MANY : HM_FAULT_IPC_CLOSE;
    enum { N = 7 };
    rhandle_t rh[N];
    for (int i = 0; i < N; i++) REQUIRE_OK(peer_export(pe, X_EXPORT, i, SIZE, i + 1, &rh[i]).result);
    unsigned mark = log_mark();
    long inj0 = hm_fault_provider_injected(fault);
    long mappings_left = 0;
    hm_fault_provider_arm(fault, op, nth);
    switch (mode) {
    case CLOSE_EVICT: {
        CHECK_OK(hm_ipc_set_cache_limits(2, 0));
        for (int i = 0; i < N; i++) {
            void *q;
            REQUIRE_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len,
                                      rh[i].fd, &q));
            CHECK_EQ(((unsigned char *)q)[100], i + 1);
            CHECK_OK(hm_ipc_close(q)); /* over the bound: an older one is closed */
            hm_ipc_cache_stats_t st = stats();
            CHECK(st.entries <= 2 && st.in_use == 0);
        }
        CHECK(FIRED(fault, inj0));
        CHECK(logged_since(mark, "failed to close") && logged_since(mark, "closed again"));
        hm_fault_provider_disarm(fault);
        /* Cached mappings and the one whose close failed: accounted for. */
        CHECK_EQ(maps_bytes(needle), maps0 + (size_t)hm_fault_provider_mappings(fault) * SIZE);
        /* The next close that succeeds closes it too: an open over the
         * bound evicts, and only the cached mappings are left. */
        for (int i = 0; i < 3; i++) {
            void *q;
            REQUIRE_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len,
                                      rh[i].fd, &q));
            CHECK_OK(hm_ipc_close(q));
        }
        CHECK_EQ(hm_fault_provider_mappings(fault), (long)stats().entries);
        CHECK_EQ(maps_bytes(needle), maps0 + stats().entries * SIZE);
        CHECK_OK(hm_ipc_set_cache_limits(4096, 0));
        break;
    }
    case CLOSE_STALE: {
        /* Each round: open the allocation in slot i (in use), the peer puts,
         * frees and reallocates it at the same address, we open the new one
         * (the old mapping is now stale), then close the old: its mapping is
         * closed then, through ipc.close. */
        int rounds = 0;
        for (int i = 0; i < N && rounds <= nth; i++) {
            void *old, *young;
            REQUIRE_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len,
                                      rh[i].fd, &old));
            rhandle_t nh;
            peer_reply_t rr = peer_export(pe, X_REEXPORT, i, SIZE, 0x40 + i, &nh);
            REQUIRE_OK(rr.result);
            rhandle_release(&rh[i]);
            rh[i] = nh;
            if (!rr.v[1]) { /* moved: not the same remote address */
                CHECK_OK(hm_ipc_close(old));
                continue;
            }
            REQUIRE_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)nh.b, nh.len, nh.fd,
                                      &young));
            CHECK_EQ(((unsigned char *)young)[100], 0x40 + i);
            long before = hm_fault_provider_injected(fault);
            unsigned m = log_mark();
            CHECK_OK(hm_ipc_close(old)); /* the stale mapping's last user */
            if (FIRED(fault, before)) CHECK(logged_since(m, "failed to close"));
            CHECK_OK(hm_ipc_close(young));
            CHECK_EQ(stats().in_use, 0);
            rounds++;
        }
        if (rounds <= nth) {
            printf("note: %d stale rounds (the peer's reallocations moved)\n", rounds);
            hm_fault_provider_disarm(fault);
        } else {
            CHECK(FIRED(fault, inj0));
            /* Round nth + 1's close closed the one that failed too. */
            CHECK_EQ(hm_fault_provider_mappings(fault), (long)stats().entries);
        }
        break;
    }
    default: { /* at the pool destroy: the last chance */
        /* close: one destroy closes N mappings, call nth of them fails;
         * close_many: each destroy is one call, so destroy nth pools. */
        int pools = mode == CLOSE_MANY_DESTROY ? (int)nth : 1;
        for (int k = 0; k < pools; k++) {
            if (k) pool = make_pool(pk, fault);
            int per = mode == CLOSE_MANY_DESTROY ? 2 : N;
            for (int i = 0; i < per; i++) {
                void *q;
                REQUIRE_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len,
                                          rh[i].fd, &q));
                if (i % 2) CHECK_OK(hm_ipc_close(q)); /* cached, unused; others in use */
            }
            long before = hm_fault_provider_injected(fault);
            hm_result_t dr = hm_pool_destroy(pool);
            pool = NULL;
            /* A close that failed and succeeded when tried again at the
             * destroy's end leaves nothing mapped: success; a failed
             * close_many leaves its batch mapped: the destroy says so. */
            CHECK_RES(dr, mode == CLOSE_MANY_DESTROY && FIRED(fault, before) ? HM_ERROR_DRIVER
                                                                             : HM_SUCCESS);
            CHECK_EQ(stats().entries, 0);
            if (FIRED(fault, before)) CHECK(logged_since(mark, "failed to close"));
            mappings_left = hm_fault_provider_mappings(fault);
        }
        CHECK(FIRED(fault, inj0));
        /* A failed close in a destroy is tried again at its end; a failed
         * close_many cannot be (which of its mappings it closed is not
         * known): its batch stays with the provider. */
        CHECK_EQ(mappings_left, mode == CLOSE_MANY_DESTROY ? 2 : 0);
        CHECK_EQ(hm_fault_provider_mappings(fault), mappings_left);
        CHECK_EQ(maps_bytes(needle), maps0 + (size_t)mappings_left * SIZE);
        /* Every call failing: the destroy leaves all of them (logged), and
         * nothing else goes wrong. */
        pool = make_pool(pk, fault);
        for (int i = 0; i < 3; i++) {
            void *q;
            REQUIRE_OK(hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)rh[i].b, rh[i].len,
                                      rh[i].fd, &q));
            if (i == 1) CHECK_OK(hm_ipc_close(q));
        }
        hm_fault_provider_arm(fault, op, -1);
        mark = log_mark();
        CHECK_RES(hm_pool_destroy(pool), HM_ERROR_DRIVER);
        pool = NULL;
        hm_fault_provider_disarm(fault);
        CHECK(logged_since(mark, "failed to close"));
        mappings_left += 3;
        CHECK_EQ(hm_fault_provider_mappings(fault), mappings_left);
        CHECK_EQ(maps_bytes(needle), maps0 + (size_t)mappings_left * SIZE);
        CHECK_EQ(stats().entries, 0);
        break;
    }
    }
    teardown(pool, fault, 0, 0, mappings_left);
    /* The OS provider unmaps at its destroy what it opened and nobody
     * closed; the file provider keeps no record of its openings. */
    size_t left = maps_bytes(needle) - maps0;
    CHECK_EQ(left, kind == K_FILE ? (size_t)mappings_left * SIZE : 0);
    if (left > 0) CHECK_EQ(unmap_leftovers(needle), left);
    for (int i = 0; i < N; i++) {
        CHECK_OK(peer_cmd(pe, X_UNEXPORT, 0, i, 0, 0, 0).result);
        rhandle_release(&rh[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* purge_force                                                              */

/* The pool's own purges (trim, decay) and hm_pool_provider_purge. The
 * native and jemalloc pools over the wrapper without free: they purge the
 * memory they cannot give back (over a provider that frees, they free whole
 * ranges instead). An export is outstanding and open in the peer throughout. */
static void fault_purge(int kind, int pk, long nth) {
    context("purge_force", kind, pk, nth);
    peer_t *pe = &peers[kind];
    int nofree = pk != P_PROXY;
    hm_provider_t *fault = make_fault(kind, nofree);
    CHECK(hm_provider_caps(fault) & HM_PROVIDER_CAP_PURGE_FORCE);
    hm_pool_t *pool = make_pool(pk, fault);
    unsigned char *keep = hm_pool_malloc(pool, SIZE);
    REQUIRE(keep);
    memset(keep, 0x5c, FILL);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(keep, &h, &len));
    peer_reply_t r = peer_open(pe, PEER_OPEN, 0, 1, h, len, 1);
    REQUIRE_OK(r.result);

    /* 1: the pool's own purges, until call nth has been made. */
    hm_fault_provider_arm(fault, HM_FAULT_PURGE_FORCE, nth);
    long inj0 = hm_fault_provider_injected(fault);
    int rounds = 0;
    for (; rounds < 40 && !FIRED(fault, inj0); rounds++) {
        enum { M = 64 };
        void *q[M];
        for (int i = 0; i < M; i++) {
            size_t sz = i % 4 ? 3000 + 512 * (size_t)i : SIZE + 4096 * (size_t)i;
            REQUIRE((q[i] = hm_pool_malloc(pool, sz)));
            memset(q[i], 0xee, 64);
        }
        for (int i = 0; i < M; i++) CHECK_OK(hm_pool_free(pool, q[i]));
        trim(pool);
    }
    long pool_purges = hm_fault_provider_calls(fault, HM_FAULT_PURGE_FORCE);
    if (pk == P_PROXY) {
        CHECK_EQ(pool_purges, 0); /* the proxy pool never purges */
    } else {
        CHECK_MSG(FIRED(fault, inj0), "purge_force call #%ld reached (%ld calls, %d rounds)", nth,
                  pool_purges, rounds);
        /* After a failed purge the pool still works and hands out zeroed
         * memory where it promises it (it did not take the purge for done). */
        for (int i = 0; i < 8; i++) {
            size_t sz = i % 2 ? 8192 : SIZE;
            unsigned char *z = hm_pool_calloc(pool, 1, sz);
            REQUIRE(z);
            size_t nz = 0;
            for (size_t j = 0; j < sz; j++) nz += z[j] != 0;
            CHECK_MSG(nz == 0, "calloc(%zu) after a failed purge: %zu bytes not zero", sz, nz);
            CHECK_OK(hm_pool_free(pool, z));
        }
        long ok0 = hm_fault_provider_succeeded(fault, HM_FAULT_PURGE_FORCE);
        hm_fault_provider_disarm(fault);
        void *q = hm_pool_malloc(pool, SIZE);
        REQUIRE(q);
        CHECK_OK(hm_pool_free(pool, q));
        trim(pool); /* disarmed: purges succeed again */
        CHECK(hm_fault_provider_succeeded(fault, HM_FAULT_PURGE_FORCE) > ok0);
    }

    /* 2: hm_pool_provider_purge on the range of keep: the error comes back. */
    hm_allocation_info_t ai;
    REQUIRE_OK(hm_allocation_info(keep, &ai));
    hm_fault_provider_arm(fault, HM_FAULT_PURGE_FORCE, nth);
    for (long i = 1; i <= nth + 1; i++)
        CHECK_RES(hm_pool_provider_purge(pool, ai.base, ai.size, true),
                  i == nth ? INJECTED : HM_SUCCESS);
    hm_fault_provider_disarm(fault);
    /* The export saw all of it the same way as we do (the direct purge
     * zeroed it, through the memfd or the file, for the peer too). */
    uint64_t seen = peer_cmd(pe, PEER_READ, 0, 1, 0, 0, 0).v[0];
    CHECK_EQ(seen, keep[0]);
    CHECK_OK(peer_cmd(pe, PEER_CLOSE, 0, 1, 0, 0, 0).result);
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, keep));
    teardown(pool, fault, nofree, 0, 0);
    CHECK_OK(peer_cmd(pe, PEER_DESTROY, 0, 0, 0, 0, 0).result);
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--peer")) return peer_main(atoi(argv[2]), argv[3], argv[4]);
    /* Before the first IPC call: the export cache bound is read once. */
    char em[16];
    snprintf(em, sizeof(em), "%d", EXPORT_MAX);
    setenv("HM_IPC_EXPORT_CACHE_MAX", em, 1);
    hm_log_set_sink(log_sink, NULL);
    hm_log_set_level(HM_LOG_WARN);
    snprintf(work_dir, sizeof(work_dir), "/tmp/hm-ipc-faults-XXXXXX");
    REQUIRE(mkdtemp(work_dir));
    peers_start();
    int npools = P_COUNT;
#ifndef HM_TEST_JEMALLOC
    npools = P_JEMALLOC; /* not built */
#endif
    for (int kind = 0; kind < K_COUNT; kind++) {
        for (int pk = 0; pk < npools; pk++) {
            for (size_t t = 0; t < sizeof(nths) / sizeof(nths[0]); t++) {
                long nth = nths[t];
                fault_get(kind, pk, nth);
                for (int m = 0; m < PUT_MODES; m++) fault_put(m, kind, pk, nth);
                fault_open(kind, pk, nth);
                for (int m = 0; m < CLOSE_MODES; m++) fault_close(m, kind, pk, nth);
                fault_purge(kind, pk, nth);
            }
            printf("%s provider, %s pool: done (%d failed so far)\n", kind_name[kind],
                   pool_name[pk], hm_test_failed_count());
            fflush(stdout);
        }
    }
    hm_test_set_context("peers");
    for (int k = 0; k < K_COUNT; k++) CHECK_EQ(peer_stop(&peers[k]), 0);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", work_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", work_dir);
    hm_log_set_sink(NULL, NULL);
    return hm_test_finish();
}
