/* hetmem benchmark: IPC export and open, hits and misses, and pool destroy
 * next to a busy second pool. SPDX-License-Identifier: MIT
 *
 * Forked exporter processes (one per 40,000 allocations) allocate N 4 KiB
 * allocations through a proxy pool over the OS provider in shared (memfd)
 * mode, export them and send the handles back; this process opens them
 * (pidfd_getfd transport).
 *
 * Harness cases (ns per op):
 *   get+put (hit)     hm_ipc_get + hm_ipc_put of an allocation whose export is
 *                     cached, 10^4 exports cached. Baseline "getpid": one
 *                     system call, the floor of an export that asks the
 *                     kernel for its identity every time (UMF does).
 *   open+close (hit)  hm_ipc_open + hm_ipc_close of a cached mapping, 10^4
 *                     mappings cached.
 *                     Baseline "2-misses": two dependent loads over 10^4
 *                     random 320-byte records, the floor of any lookup that
 *                     reads an index bucket and then the entry when both are
 *                     cold (its working set, one line per record, fits in L2).
 *                     "floor": the lines the hit must read at the cache's real
 *                     footprint (every handle byte, an index slot, two entry
 *                     lines); "floor-old": the same for the previous layout
 *                     (bucket + four entry lines); "floor+sync": "floor" plus
 *                     the hit's synchronisation (mutex, atomic add, CAS on the
 *                     entry's line 0). See floor_run.
 *   ..., handle just received  the same, each handle rebuilt into one receive
 *                     buffer before its open (the importer's usual case: the
 *                     bytes were just received, the cache entry is cold;
 *                     see rebuild). Baseline "rebuild": that alone.
 *   ... 8 hot          the same with 8 allocations/handles used in turn: the
 *                     cost without cache misses on the cache's own data.
 *   open+close (miss) cache bound 1: every open maps (pidfd_open, start-time
 *                     check, pidfd_getfd, mmap, tracker insert), every close
 *                     evicts (tracker remove, munmap).
 * Then two experiments printed after the table:
 *   destroy-windows   thread 2 keeps opening (hits, each open timed alone)
 *                     through pool B while this thread runs, in rotating
 *                     order, windows of five kinds: control (it spins, no
 *                     call), destroy (pool A with 4000 opened mappings, each
 *                     written once), and three kernel-only references: 4000
 *                     munmaps of written private pages, of written shared
 *                     memfd pages (as pool A's), and of the same shared pages
 *                     one munmap per run of adjacent ones. Per window:
 *                     median and worst open, opens > 10x the median, thread
 *                     2's voluntary/involuntary switches, its off-CPU opens,
 *                     and the TLB-shootdown IPIs its CPU received; then, per
 *                     kind, medians over the windows (target: worst < 10x
 *                     median during a destroy). See destroy_windows.
 *   destroy-isolation destroy of A (4000 mappings) with B holding 0 vs 10^5
 *                     entries (B opened in the order that lets the kernel
 *                     merge its mappings' VMAs: see open_range_rev);
 *                     target: within 1.2x. */
#include "harness.h"

#include <hetmem/hetmem.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HSTRIDE 256 /* bytes per stored handle */

static unsigned char *handles;
static size_t *hlens;
static size_t nhandles;
static int quick;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static hm_pool_t *shared_pool(void) {
    hm_os_params_t *prm;
    hm_provider_t *prov;
    hm_pool_t *pool = NULL;
    if (hm_os_params_create(&prm)) return NULL;
    hm_os_params_set_visibility(prm, HM_OS_SHARED);
    if (hm_os_provider_create(prm, &prov) == HM_SUCCESS &&
        hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS)
        hm_provider_destroy(prov);
    hm_os_params_destroy(prm);
    return pool;
}

/* ---- the exporter process ---- */
static int write_all(int fd, const void *b, size_t n) {
    const char *p = b;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
static int read_all(int fd, void *b, size_t n) {
    char *p = b;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int exporter(size_t n, int out, int in) {
    hm_pool_t *pool = shared_pool();
    if (!pool) return 2;
    for (size_t i = 0; i < n; i++) {
        void *m = hm_pool_malloc(pool, 4096);
        hm_ipc_handle_t *h;
        size_t len;
        if (!m || hm_ipc_get(m, &h, &len) || len > HSTRIDE) return 3;
        uint32_t l = (uint32_t)len;
        if (write_all(out, &l, 4) || write_all(out, h, len)) return 4;
        hm_ipc_put(h); /* the allocation stays: its handle stays openable */
    }
    char c;
    (void)!read(in, &c, 1); /* until the benchmark is done */
    return 0;
}

/* Exporter processes: one per EXPORTER_MAX allocations. An exporter maps
 * each allocation on its own (ascending memfd offsets at descending
 * addresses: one VMA each), so one process cannot export more than
 * vm.max_map_count (65530 by default) allocations; several exporters
 * together can. Their handles are stored in order (exporter 0's first). */
#define EXPORTER_MAX 40000
#define EXPORTERS_MAX 8
static pid_t exporters[EXPORTERS_MAX];
static int nexporters;

static int start_exporters(size_t n, int *done_fd) {
    int b[2];
    if (pipe(b)) return -1;
    handles = malloc(n * HSTRIDE);
    hlens = malloc(n * sizeof(size_t));
    size_t at = 0;
    while (at < n) {
        size_t k = n - at < EXPORTER_MAX ? n - at : EXPORTER_MAX;
        int a[2];
        if (nexporters == EXPORTERS_MAX || pipe(a)) return -1;
        pid_t pid = fork();
        if (pid == 0) {
            close(a[0]);
            close(b[1]);
            _exit(exporter(k, a[1], b[0]));
        }
        close(a[1]);
        exporters[nexporters++] = pid;
        for (size_t i = at; i < at + k; i++) {
            uint32_t l;
            if (read_all(a[0], &l, 4) || l > HSTRIDE ||
                read_all(a[0], handles + i * HSTRIDE, l)) {
                fprintf(stderr, "bench_ipc: exporter %d failed after %zu handles\n", nexporters,
                        i - at);
                for (int e = 0; e < nexporters; e++) kill(exporters[e], SIGKILL);
                return -1;
            }
            hlens[i] = l;
        }
        close(a[0]);
        at += k;
    }
    close(b[0]);
    nhandles = n;
    *done_fd = b[1]; /* closing it ends every exporter */
    return 0;
}
static void stop_exporters(int done_fd) {
    close(done_fd);
    for (int e = 0; e < nexporters; e++) waitpid(exporters[e], NULL, 0);
}

static inline const hm_ipc_handle_t *H(size_t i) {
    return (const hm_ipc_handle_t *)(handles + i * HSTRIDE);
}
static inline const unsigned char *H0(void) { return handles; }

/* ---- handles "just received" ----
 * An importer opens a handle it has just received: the bytes are in a
 * receive buffer, in cache, and only the cache's own data (index, entry)
 * can be cold. Reading each handle from the 10^4-handle array (or
 * prefetching it from there) would stream 1.5 MB of handle bytes through
 * the cache on every pass, evicting the very entries being measured; a
 * receiver's buffer does not. So the handles are also kept compactly: the
 * bytes of handle 0 (the template) and, per handle, only the bytes at the
 * positions where some handle differs from it (allocation id, base,
 * payload, checksum: ~20 bytes a handle). rebuild() writes handle i into a
 * buffer: a hot template copy plus those bytes, and its own cost is a
 * baseline of the cases that use it. */
static unsigned char htemplate[HSTRIDE];
static uint16_t *vcols;      /* byte positions that vary */
static size_t nvcols, ncompact;
static unsigned char *hvar;  /* ncompact x nvcols */

static void handles_compact(size_t n) {
    size_t len = hlens[0];
    for (size_t i = 1; i < n; i++)
        if (hlens[i] != len) return; /* not all alike: the received cases skip */
    memcpy(htemplate, H0(), len);
    vcols = malloc(len * sizeof(*vcols));
    for (size_t b = 0; b < len; b++)
        for (size_t i = 1; i < n; i++)
            if (handles[i * HSTRIDE + b] != htemplate[b]) {
                vcols[nvcols++] = (uint16_t)b;
                break;
            }
    hvar = malloc(n * (nvcols ? nvcols : 1));
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < nvcols; c++) hvar[i * nvcols + c] = handles[i * HSTRIDE + vcols[c]];
    ncompact = n;
}
static inline void rebuild(size_t i, unsigned char *out) {
    memcpy(out, htemplate, HSTRIDE);
    const unsigned char *v = hvar + i * nvcols;
    for (size_t c = 0; c < nvcols; c++) out[vcols[c]] = v[c];
}
static unsigned char rxbuf[HSTRIDE] __attribute__((aligned(64))); /* the receive buffer */
/* The received cases visit the handles in a random order (one cycle over
 * all, read sequentially from this array): a constant stride, as in the
 * other cases, lets the core's stride prefetcher fetch the next entry
 * whenever entries lie in handle order, which flatters a floor more than
 * the library (whose entries lie where its free list put them). */
static uint32_t *rorders[4];
static size_t rorder_n[4];
/* The random order over [0, n) (made once per n, at set-up). */
static const uint32_t *rorder_for(size_t n) {
    int k = 0;
    for (; k < 4 && rorders[k]; k++)
        if (rorder_n[k] == n) return rorders[k];
    if (k == 4 || !(rorders[k] = malloc(n * sizeof(uint32_t)))) return NULL;
    uint32_t *o = rorders[k];
    rorder_n[k] = n;
    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)i;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates, xorshift64 (Marsaglia 2003) */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t j = x % (i + 1);
        uint32_t t = o[i];
        o[i] = o[j];
        o[j] = t;
    }
    return o;
}

/* Baseline: the rebuild alone (what the received cases pay for the bench's
 * own handle store). */
static int rebuild_setup(const void *arg, void **ctx) {
    (void)ctx;
    size_t n = *(const size_t *)arg;
    return n > ncompact ? HM_BENCH_SKIP : !rorder_for(n);
}
static int rebuild_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx;
    size_t n = *(const size_t *)arg, at = 0;
    const uint32_t *rorder = rorder_for(n);
    for (uint64_t k = 0; k < iters; k++) {
        rebuild(rorder[at], rxbuf);
        hm_bench_escape(rxbuf);
        at = at + 1 < n ? at + 1 : 0;
    }
    return 0;
}

/* ---- get+put (hit) ---- */
typedef struct get_ctx {
    hm_pool_t *pool;
    void **mem;
    size_t n;
} get_ctx_t;

static int get_setup(const void *arg, void **ctx) {
    size_t n = *(const size_t *)arg;
    get_ctx_t *c = calloc(1, sizeof(*c));
    c->pool = shared_pool();
    c->mem = calloc(n, sizeof(void *));
    c->n = n;
    if (!c->pool || !c->mem) return 1;
    for (size_t i = 0; i < n; i++) {
        hm_ipc_handle_t *h;
        size_t len;
        if (!(c->mem[i] = hm_pool_malloc(c->pool, 4096))) return 1;
        if (hm_ipc_get(c->mem[i], &h, &len)) return 1;
        hm_ipc_put(h);
    }
    *ctx = c;
    return 0;
}
static int get_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    get_ctx_t *c = ctx;
    size_t i = 0;
    for (uint64_t k = 0; k < iters; k++) {
        hm_ipc_handle_t *h;
        size_t len;
        if (hm_ipc_get(c->mem[i], &h, &len)) return 1;
        hm_bench_escape(h);
        hm_ipc_put(h);
        i = (i + 7919) % c->n; /* a stride: not the same entry every time */
    }
    return 0;
}
static int get_hot_run(void *ctx, const void *arg, uint64_t iters) { /* one allocation */
    (void)arg;
    get_ctx_t *c = ctx;
    for (uint64_t k = 0; k < iters; k++) {
        hm_ipc_handle_t *h;
        size_t len;
        if (hm_ipc_get(c->mem[k & 7], &h, &len)) return 1;
        hm_bench_escape(h);
        hm_ipc_put(h);
    }
    return 0;
}
static void get_teardown(void *ctx) {
    get_ctx_t *c = ctx;
    for (size_t i = 0; i < c->n; i++) hm_pool_free(c->pool, c->mem[i]);
    hm_pool_destroy(c->pool);
    free(c->mem);
    free(c);
}
static int getpid_run(void *ctx, const void *arg, uint64_t iters) {
    (void)ctx, (void)arg;
    for (uint64_t k = 0; k < iters; k++) {
        pid_t p = (pid_t)syscall(SYS_getpid);
        hm_bench_escape(&p);
    }
    return 0;
}


/* ---- the memory floor: two dependent loads over as many cache entries ----
 * A cache hit must read an index bucket and then the entry it names: two
 * dependent cache misses when the entries are cold. This baseline makes
 * exactly that, over n 320-byte records (an opened-entry's size) linked in a
 * random cycle: its ns/op is what two dependent misses cost on this machine
 * at this footprint, whatever the cache does. */
typedef struct chase_ctx {
    unsigned char *mem;
    size_t n, at;
} chase_ctx_t;
static int chase_setup(const void *arg, void **ctx) {
    size_t n = *(const size_t *)arg;
    chase_ctx_t *c = calloc(1, sizeof(*c));
    size_t *perm = malloc(n * sizeof(size_t));
    c->mem = aligned_alloc(64, n * 320);
    c->n = n;
    if (!c->mem || !perm) return 1;
    for (size_t i = 0; i < n; i++) perm[i] = i;
    uint64_t x = 88172645463325252ull;
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 (Marsaglia 2003) */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t j = x % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        size_t nx = perm[(i + 1) % n];
        memcpy(c->mem + perm[i] * 320, &nx, sizeof(nx));
    }
    free(perm);
    *ctx = c;
    return 0;
}
static int chase_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    chase_ctx_t *c = ctx;
    size_t at = c->at;
    for (uint64_t k = 0; k < 2 * iters; k++) memcpy(&at, c->mem + at * 320, sizeof(at));
    c->at = at;
    hm_bench_escape(&c->at);
    return 0;
}
static void chase_teardown(void *ctx) {
    chase_ctx_t *c = ctx;
    free(c->mem);
    free(c);
}

/* ---- the memory floor of an open hit at the cache's real footprint ----
 * What any implementation of this cache layout must read on an open hit,
 * and nothing else: the caller's handle bytes (the same array of handles
 * the hetmem case opens, every byte of each, as a checksum does), one slot
 * of an index as large as the library's (16-byte slots, at most 3/4 full:
 * 2^14 slots for 10^4 entries) at a random position, then the two lines of
 * the entry the slot points to (192-byte records on 2 MiB-aligned,
 * MADV_HUGEPAGE memory as the library's entry arena), the second line's
 * load issued with the first. "floor-old" is the same for the previous
 * layout: an 8-byte bucket array (2^14 buckets) and 320-byte entries whose
 * four lines are read (line 0, then the handle copy in lines 1-3). Same
 * stride order as the hetmem case, so the ratio hetmem / floor is what the
 * cache costs above the memory it must touch. The floor's iterations are
 * made dependent (the next starts once this one's entry has been read), and
 * so is the slot on the handle's bytes: by data (AND with a zero the
 * compiler cannot see), not by an empty asm, which orders only the compiler
 * and let the core overlap the misses of consecutive iterations (the floor
 * then measured ~40 ns of throughput, not a call's ~400 ns latency). */
typedef struct floor_ctx {
    unsigned char *ent, *idx;
    void *map;
    size_t n, i, at, esize, slot, lines, map_len;
    uint32_t *pos; /* entry i's index slot */
    const uint32_t *order; /* recv: the random order (rorder_for) */
    int recv;      /* the handle is rebuilt into the receive buffer ("just received") */
    int atomics;   /* also what the hit's synchronisation does: a mutex around it,
                      an atomic add on the entry's line 0 and a CAS on it (close) */
    pthread_mutex_t lock;
    uint64_t zero; /* 0, unknown to the compiler: makes the dependencies real */
} floor_ctx_t;
static int floor_setup_common(const void *arg, void **ctx, int old, int recv) {
    int atomics = old == 2;
    if (atomics) old = 0;
    size_t n = *(const size_t *)arg;
    if (n > nhandles || (recv && n > ncompact)) return HM_BENCH_SKIP;
    floor_ctx_t *c = calloc(1, sizeof(*c));
    size_t cap = 64;
    while (old ? cap < n : (n + 1) * 4 > cap * 3) cap *= 2;
    c->n = n;
    c->recv = recv;
    if (recv && !(c->order = rorder_for(n))) return 1;
    c->atomics = atomics;
    pthread_mutex_init(&c->lock, NULL);
    c->esize = old ? 320 : 192;
    c->slot = old ? 8 : 16;
    c->lines = old ? 4 : 2;
    c->map_len = (n * c->esize + (4u << 20)) & ~(size_t)((2u << 20) - 1);
    void *m = mmap(NULL, c->map_len + (2u << 20), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    c->idx = calloc(cap, c->slot);
    c->pos = malloc(n * sizeof(uint32_t));
    if (m == MAP_FAILED || !c->idx || !c->pos) return 1;
    c->map = m;
    c->ent = (unsigned char *)(((uintptr_t)m + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    (void)madvise(c->ent, c->map_len, MADV_HUGEPAGE);
    memset(c->ent, 0, n * c->esize);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) { /* linear probing, like the library */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t k = x & (cap - 1);
        uintptr_t z = 0;
        for (;; k = (k + 1) & (cap - 1)) {
            memcpy(&z, c->idx + k * c->slot + (old ? 0 : 8), sizeof(z));
            if (!z) break;
        }
        z = (uintptr_t)(c->ent + i * c->esize);
        memcpy(c->idx + k * c->slot + (old ? 0 : 8), &z, sizeof(z));
        c->pos[i] = (uint32_t)k;
    }
    *ctx = c;
    return 0;
}
static int floor_setup(const void *arg, void **ctx) { return floor_setup_common(arg, ctx, 0, 0); }
static int floor_old_setup(const void *arg, void **ctx) { return floor_setup_common(arg, ctx, 1, 0); }
static int floor_recv_setup(const void *arg, void **ctx) { return floor_setup_common(arg, ctx, 0, 1); }
static int floor_sync_setup(const void *arg, void **ctx) { return floor_setup_common(arg, ctx, 2, 0); }
static int floor_sync_recv_setup(const void *arg, void **ctx) {
    return floor_setup_common(arg, ctx, 2, 1);
}
static int floor_old_recv_setup(const void *arg, void **ctx) {
    return floor_setup_common(arg, ctx, 1, 1);
}
static int floor_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    floor_ctx_t *c = ctx;
    size_t i = c->i, next = (i + 7919) % c->n, next2 = (next + 7919) % c->n;
    uint64_t acc = 0;
    for (uint64_t k = 0; k < iters; k++) {
        const unsigned char *h = (const unsigned char *)H(i);
        if (c->recv) { /* random order (rorder), the handle in the receive buffer */
            i = c->order[c->at + (size_t)(acc & c->zero)]; /* after the last call's loads */
            c->at = c->at + 1 < c->n ? c->at + 1 : 0;
            rebuild(i, rxbuf);
            h = rxbuf;
        }
        uint64_t w = 0, v;
        for (size_t o = 0; o + 8 <= hlens[i]; o += 8) {
            memcpy(&v, h + o, 8);
            w += v;
        }
        /* the slot's position depends on the handle's bytes (a hash of
         * them), as the library's does */
        size_t at = (size_t)c->pos[i] * c->slot + (c->slot == 16 ? 8 : 0);
        at += (size_t)(w & c->zero); /* a real data dependency: the slot is found from the
                                       handle's bytes, so its load waits for them */
        const unsigned char *slot = c->idx + at;
        if (c->atomics) pthread_mutex_lock(&c->lock);
        unsigned char *e;
        memcpy(&e, slot, sizeof(e));
        for (size_t l = 1; l < c->lines; l++) __builtin_prefetch(e + 64 * l);
        for (size_t l = 0; l < c->lines; l++) {
            memcpy(&v, e + 64 * l + 8, 8);
            acc += v;
        }
        if (c->atomics) {
            _Atomic uint64_t *st = (_Atomic uint64_t *)(void *)e;
            atomic_fetch_add_explicit(st, 1, memory_order_relaxed);
            pthread_mutex_unlock(&c->lock);
            uint64_t o = atomic_load_explicit(st, memory_order_relaxed);
            atomic_compare_exchange_strong_explicit(st, &o, o - 1, memory_order_release,
                                                    memory_order_relaxed);
        }
        /* One call's latency: the next call starts after this one's loads
         * (the library's hit takes a lock and atomics, which order it after
         * the previous call), so the floor's calls do not overlap either. */
        i = next;
        i += (size_t)(acc & c->zero); /* real: the next call waits for this one's loads */
        next = next2;
        next2 = (next2 + 7919) % c->n;
    }
    c->i = i;
    hm_bench_escape(&acc);
    return 0;
}
static void floor_teardown(void *ctx) {
    floor_ctx_t *c = ctx;
    munmap(c->map, c->map_len + (2u << 20));
    free(c->idx);
    free(c->pos);
    free(c);
}

/* ---- open+close ---- */
typedef struct open_ctx {
    hm_pool_t *pool;
    size_t n;
    size_t i;
    const uint32_t *order; /* the received case's random order */
} open_ctx_t;

static int open_hit_setup(const void *arg, void **ctx) {
    size_t n = *(const size_t *)arg;
    if (n > nhandles) return HM_BENCH_SKIP;
    open_ctx_t *c = calloc(1, sizeof(*c));
    c->pool = shared_pool();
    c->n = n;
    if (!c->pool) return 1;
    hm_ipc_set_cache_limits(n + 16, 0);
    for (size_t i = 0; i < n; i++) { /* warm: every handle cached */
        void *p;
        if (hm_ipc_open(c->pool, H(i), hlens[i], &p)) return 1;
        hm_ipc_close(p);
    }
    *ctx = c;
    return 0;
}
static int open_miss_setup(const void *arg, void **ctx) {
    (void)arg;
    open_ctx_t *c = calloc(1, sizeof(*c));
    c->pool = shared_pool();
    c->n = nhandles < 1000 ? nhandles : 1000;
    if (!c->pool) return 1;
    hm_ipc_set_cache_limits(1, 0);
    *ctx = c;
    return 0;
}
static int open_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    open_ctx_t *c = ctx;
    for (uint64_t k = 0; k < iters; k++) {
        void *p;
        if (hm_ipc_open(c->pool, H(c->i), hlens[c->i], &p)) return 1;
        hm_bench_escape(p);
        if (hm_ipc_close(p)) return 1;
        c->i = (c->i + 7919) % c->n;
    }
    return 0;
}
/* The importer's usual case: the handle arrived just now (its bytes are in
 * the receive buffer, in cache) but the cache entry it names was last used
 * 10^4 opens ago: each handle is rebuilt into rxbuf, then opened from there
 * (see rebuild). */
static int open_recv_run(void *ctx, const void *arg, uint64_t iters) {
    (void)arg;
    open_ctx_t *c = ctx;
    for (uint64_t k = 0; k < iters; k++) {
        size_t i = c->order[c->i];
        rebuild(i, rxbuf);
        void *p;
        if (hm_ipc_open(c->pool, (const hm_ipc_handle_t *)rxbuf, hlens[i], &p)) return 1;
        hm_bench_escape(p);
        if (hm_ipc_close(p)) return 1;
        c->i = c->i + 1 < c->n ? c->i + 1 : 0;
    }
    return 0;
}
static int open_recv_setup(const void *arg, void **ctx) {
    size_t n = *(const size_t *)arg;
    if (n > ncompact) return HM_BENCH_SKIP;
    int r = open_hit_setup(arg, ctx);
    if (!r && !(((open_ctx_t *)*ctx)->order = rorder_for(n))) r = 1;
    return r;
}
static int open_hot_run(void *ctx, const void *arg, uint64_t iters) { /* 8 handles */
    (void)arg;
    open_ctx_t *c = ctx;
    for (uint64_t k = 0; k < iters; k++) {
        void *p;
        size_t i = k & 7;
        if (hm_ipc_open(c->pool, H(i), hlens[i], &p)) return 1;
        hm_bench_escape(p);
        if (hm_ipc_close(p)) return 1;
    }
    return 0;
}
static void open_teardown(void *ctx) {
    open_ctx_t *c = ctx;
    hm_pool_destroy(c->pool);
    free(c);
}


/* ---- each call timed on its own ----
 * The harness cases time pairs. Here get, put, open and close are timed
 * apart: over all n cached entries in stride order, in batches of 8 (the
 * per-thread close cache's size); each batch's 8 gets are timed together,
 * then its 8 puts (opens, then closes), with clock_gettime per batch (its
 * own cost, measured on empty batches, is subtracted). Open is timed twice:
 * with the handle bytes cold (read from the big array, as in the harness
 * case) and "just received": the batch's handles are copied into a receive
 * buffer before its timer starts, so the bytes are in cache and only the
 * cache's own entries are cold. Median of `reps` passes. */
static int cmp_d(const void *a, const void *b);
static double cpu_now_s(void);
static void split_ops(size_t n, int reps) {
    enum { BATCH = 8 };
    get_ctx_t *g = NULL;
    open_ctx_t *o = NULL;
    if (get_setup(&n, (void **)&g) || open_hit_setup(&n, (void **)&o)) {
        printf("separate calls: set-up failed\n");
        return;
    }
    double ovh_v[64];
    for (int k = 0; k < 64; k++) {
        double a = now_ns();
        ovh_v[k] = now_ns() - a;
    }
    qsort(ovh_v, 64, sizeof(double), cmp_d);
    double ovh = ovh_v[32];
    double r_get[16], r_put[16], r_oc[16], r_oh[16], r_cl[16];
    static unsigned char rbuf[BATCH][HSTRIDE] __attribute__((aligned(64)));
    size_t batches = n / BATCH;
    for (int r = 0; r < reps && r < 16; r++) {
        double sg = 0, sp = 0, soc = 0, soh = 0, scl = 0;
        size_t idx = 0, idx2 = n / 2;
        for (size_t bt = 0; bt < batches; bt++) {
            size_t id[BATCH], id2[BATCH];
            for (int j = 0; j < BATCH; j++) {
                id[j] = idx;
                idx = (idx + 7919) % n;
                id2[j] = idx2;
                idx2 = (idx2 + 7919) % n;
            }
            hm_ipc_handle_t *h[BATCH];
            void *p[BATCH];
            size_t len;
            double t0 = now_ns();
            for (int j = 0; j < BATCH; j++) (void)hm_ipc_get(g->mem[id[j]], &h[j], &len);
            double t1 = now_ns();
            for (int j = 0; j < BATCH; j++) (void)hm_ipc_put(h[j]);
            double t2 = now_ns();
            sg += t1 - t0 - ovh;
            sp += t2 - t1 - ovh;
            t0 = now_ns();
            for (int j = 0; j < BATCH; j++) (void)hm_ipc_open(o->pool, H(id[j]), hlens[id[j]], &p[j]);
            t1 = now_ns();
            for (int j = 0; j < BATCH; j++) (void)hm_ipc_close(p[j]);
            soc += t1 - t0 - ovh;
            for (int j = 0; j < BATCH; j++) { /* received: in cache, not streamed (see rebuild) */
                if (n <= ncompact) rebuild(id2[j], rbuf[j]);
                else memcpy(rbuf[j], H(id2[j]), hlens[id2[j]]);
            }
            t0 = now_ns();
            for (int j = 0; j < BATCH; j++)
                (void)hm_ipc_open(o->pool, (const hm_ipc_handle_t *)rbuf[j], hlens[id2[j]], &p[j]);
            t1 = now_ns();
            for (int j = 0; j < BATCH; j++) (void)hm_ipc_close(p[j]);
            t2 = now_ns();
            soh += t1 - t0 - ovh;
            scl += t2 - t1 - ovh;
        }
        double ops = (double)(batches * BATCH);
        r_get[r] = sg / ops;
        r_put[r] = sp / ops;
        r_oc[r] = soc / ops;
        r_oh[r] = soh / ops;
        r_cl[r] = scl / ops;
    }
    int m = reps < 16 ? reps : 16;
    qsort(r_get, (size_t)m, sizeof(double), cmp_d);
    qsort(r_put, (size_t)m, sizeof(double), cmp_d);
    qsort(r_oc, (size_t)m, sizeof(double), cmp_d);
    qsort(r_oh, (size_t)m, sizeof(double), cmp_d);
    qsort(r_cl, (size_t)m, sizeof(double), cmp_d);
    printf("separate calls, %zu entries cached, stride order, batches of %d, timer cost %.0f ns "
           "per batch subtracted, median of %d passes (ns per call):\n"
           "  get (hit) %.1f   put %.1f   (get+put %.1f)\n"
           "  open (hit), handle bytes cold %.1f   open (hit), handle just received %.1f   "
           "close %.1f   (open+close, received %.1f)\n",
           n, BATCH, ovh, m, r_get[m / 2], r_put[m / 2], r_get[m / 2] + r_put[m / 2],
           r_oc[m / 2], r_oh[m / 2], r_cl[m / 2], r_oh[m / 2] + r_cl[m / 2]);
    open_teardown(o);
    get_teardown(g);
}

/* ---- destroy of pool A next to a busy pool B: windows ----
 * Thread 2 ("the opener", pinned to the last online CPU; this thread to the
 * first) loops hm_ipc_open (hits, timed alone) + hm_ipc_close through pool
 * B. This thread runs windows of five kinds, in rotating order, `nwin` of
 * each:
 *   control  it spins as long as the last destroy took (no library call):
 *            the machine's own outliers (preemption, timer, other tenants);
 *   destroy  hm_pool_destroy(A), A holding a_entries opened mappings;
 *   munmap   it unmaps a_entries separate, written 4 KiB private anonymous
 *            mappings, one munmap each (no library call): what unmapping
 *            costs the opener through the kernel alone (each munmap of
 *            written pages in a process whose other thread runs on another
 *            CPU sends that CPU a TLB-shootdown IPI);
 *   munmap-shm  the same with written 4 KiB shared memfd mappings, as pool
 *            A's are;
 *   shm-runs the same shared pages unmapped one munmap per run of adjacent
 *            mappings: what a destroy that unmapped in runs would cost.
 * Per window: the opener's median and worst open latency, how many opens
 * took > 10x the window's median, the opener's voluntary and involuntary
 * context switches in the window (getrusage RUSAGE_THREAD, taken by the
 * opener at the window's edges: a lock wait is voluntary, preemption
 * involuntary), opens that lost > OFF_CPU_NS to not running (wall minus
 * thread CPU time: descheduled, or the vCPU stolen), and the TLB-shootdown
 * IPIs its CPU received (/proc/interrupts). A window is "clean" when the
 * opener had no context switch in it. Summary per kind: the median over
 * windows of worst/median, the share of windows whose worst is > 10x the
 * median (all windows, and clean windows only), and the median count of
 * > 10x opens per window. A stall of the library's own making (a lock the
 * destroy holds) shows in destroy windows only, or as voluntary switches;
 * what the kernel does for any munmap shows in munmap windows as well. */
#define OFF_CPU_NS 1000.0
enum { WK_CONTROL, WK_DESTROY, WK_MUNMAP, WK_MUNMAP_SHM, WK_MUNMAP_RUNS, WK_KINDS };
static const char *const wk_name[WK_KINDS] = {"control", "destroy", "munmap", "munmap-shm",
                                              "shm-runs"};

typedef struct lat_sample {
    float ns;      /* the open's latency */
    float off_cpu; /* wall minus thread CPU time around it */
    int16_t win;   /* window, -1 between windows */
} lat_sample_t;

typedef struct wstat {
    int kind;
    double dur_ns;
    long csw[2][2]; /* [start, end][voluntary, involuntary], by the opener */
    long ipis;      /* TLB shootdowns received by the opener's CPU */
    long cals;      /* function-call IPIs received by it (membarrier, ...) */
    size_t n, over10, off, over10_on;
    double med, worst, worst_on;
} wstat_t;

#define MAX_WIN 128
typedef struct opener {
    hm_pool_t *pool;
    int cpu; /* -1: not pinned */
    _Atomic int stop;
    _Atomic int win; /* the current window, -1 between windows */
    _Atomic int seen; /* the window whose edge the opener recorded last, -2 none */
    wstat_t *ws;
    lat_sample_t *lat;
    size_t nlat, cap;
} opener_t;

static double thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
static void thread_csw(long out[2]) {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    out[0] = ru.ru_nvcsw;
    out[1] = ru.ru_nivcsw;
}
static int pin_to(int cpu) {
    if (cpu < 0) return 0;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

static void *opener_thread(void *arg) {
    opener_t *o = arg;
    (void)pin_to(o->cpu);
    size_t i = 0;
    int cur = -1;
    atomic_store_explicit(&o->seen, -1, memory_order_release); /* running */
    while (!atomic_load_explicit(&o->stop, memory_order_relaxed)) {
        int w = atomic_load_explicit(&o->win, memory_order_acquire);
        if (w != cur) { /* a window's edge: its start (w >= 0) or cur's end */
            long c[2];
            thread_csw(c);
            if (cur >= 0) memcpy(o->ws[cur].csw[1], c, sizeof(c));
            if (w >= 0) memcpy(o->ws[w].csw[0], c, sizeof(c));
            cur = w;
            atomic_store_explicit(&o->seen, w, memory_order_release);
        }
        /* wall and thread-CPU clocks around the open: m0 c0 [t0 open t1] c1 m1 */
        double m0 = now_ns(), c0 = thread_cpu_ns();
        double t0 = now_ns();
        void *p;
        hm_result_t r = hm_ipc_open(o->pool, H(i), hlens[i], &p);
        double t1 = now_ns();
        double c1 = thread_cpu_ns(), m1 = now_ns();
        if (r == HM_SUCCESS) hm_ipc_close(p);
        if (cur >= 0 && o->nlat < o->cap)
            o->lat[o->nlat++] =
                (lat_sample_t){(float)(t1 - t0), (float)((m1 - m0) - (c1 - c0)), (int16_t)cur};
        i = (i + 1) % 64;
    }
    return NULL;
}

/* Set the window (w >= 0: start it; -1: end the current one) and wait
 * until the opener has recorded the edge. */
static void window_edge(opener_t *o, int w) {
    atomic_store_explicit(&o->win, w, memory_order_release);
    while (atomic_load_explicit(&o->seen, memory_order_acquire) != w) sched_yield();
}

/* The interrupts of /proc/interrupts row `row` ("TLB:" shootdowns, "CAL:"
 * function calls) CPU `cpu` has received (columns are the online CPUs in
 * order). -1: unknown. */
static long cpu_irqs(const char *row, int cpu) {
    FILE *f = fopen("/proc/interrupts", "r");
    char line[4096];
    long v = -1;
    size_t rl = strlen(row);
    if (!f) return -1;
    while (fgets(line, sizeof(line), f)) {
        char *p = line;
        while (*p == ' ') p++;
        if (strncmp(p, row, rl)) continue;
        p += rl;
        for (int c = 0; c <= cpu; c++) v = strtol(p, &p, 10);
        break;
    }
    fclose(f);
    return v;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Open handles [lo, hi) through pool (all misses), leaving them open; with
 * rev, from hi - 1 down to lo (see open_range_rev). Forward, each mapping's
 * first byte is also written (with its own value), as an importer uses what
 * it opens: its page is then mapped, and unmapping it makes the kernel
 * flush the TLB of every other CPU running the process, one IPI per munmap
 * (an untouched mapping's munmap flushes nothing: pool A's destroy then
 * sent its opener's CPU 1-8 IPIs per 4000 munmaps, against ~4000 once
 * written). */
static int open_range_dir(hm_pool_t *pool, size_t lo, size_t hi, int rev) {
    for (size_t k = lo; k < hi; k++) {
        size_t i = rev ? hi - 1 - (k - lo) : k;
        void *p;
        hm_result_t r = hm_ipc_open(pool, H(i), hlens[i], &p);
        if (r) {
            fprintf(stderr, "bench_ipc: open #%zu: %s\n", i, hm_result_string(r));
            return 1;
        }
        if (!rev) *(volatile char *)p = *(volatile const char *)p;
    }
    return 0;
}
static int open_range(hm_pool_t *pool, size_t lo, size_t hi) {
    return open_range_dir(pool, lo, hi, 0);
}

static double cpu_now_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static double median_of(double *v, size_t n) {
    if (!n) return 0;
    qsort(v, n, sizeof(double), cmp_d);
    return v[n / 2];
}

/* n separate 4 KiB anonymous mappings (every other page of one region
 * made PROT_NONE, so that no two merge), each touched; *region for the
 * clean-up. */
static char *munmap_prepare(size_t n, size_t *len) {
    long pg = sysconf(_SC_PAGESIZE);
    *len = 2 * n * (size_t)pg;
    char *m = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    for (size_t i = 0; i < n; i++) {
        m[2 * i * (size_t)pg] = 1;
        (void)mprotect(m + (2 * i + 1) * (size_t)pg, (size_t)pg, PROT_NONE);
    }
    return m;
}

/* n separate 4 KiB shared mappings of one memfd (ascending offsets at
 * descending addresses: no two merge), each written, as pool A's are. */
static char **shm_prepare(size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    int fd = memfd_create("bench_ipc", 0);
    char **v = malloc(n * sizeof(*v));
    if (fd < 0 || !v || ftruncate(fd, (off_t)(n * (size_t)pg))) {
        if (fd >= 0) close(fd);
        free(v);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(i * (size_t)pg));
        if (v[i] == MAP_FAILED) {
            while (i--) munmap(v[i], (size_t)pg);
            close(fd);
            free(v);
            return NULL;
        }
        v[i][0] = 1;
    }
    close(fd);
    return v;
}

static void destroy_windows(size_t a_entries, int nwin) {
    hm_ipc_set_cache_limits(0, 0);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    hm_pool_t *B = shared_pool();
    if (!B || nwin * WK_KINDS > MAX_WIN) return;
    opener_t o = {.pool = B, .cap = (size_t)1 << 22, .cpu = ncpu >= 2 ? (int)ncpu - 1 : -1};
    atomic_init(&o.win, -1);
    atomic_init(&o.seen, -2);
    o.ws = calloc(MAX_WIN, sizeof(wstat_t));
    o.lat = malloc(o.cap * sizeof(lat_sample_t));
    if (!o.ws || !o.lat) return;
    /* Touched now: a page fault while recording would take the mmap lock,
     * which munmap holds for writing (the bench's own wait, not the library's). */
    memset(o.lat, 0, o.cap * sizeof(lat_sample_t));
    for (size_t i = 0; i < 64; i++) { /* B's working set: cached */
        void *p;
        if (hm_ipc_open(B, H(i), hlens[i], &p) == HM_SUCCESS) hm_ipc_close(p);
    }
    (void)pin_to(ncpu >= 2 ? 0 : -1);
    pthread_t t;
    pthread_create(&t, NULL, opener_thread, &o);
    window_edge(&o, -1);
    double last_destroy = 20e6, cpu0 = cpu_now_s(), wall0 = now_ns();
    int nw = 0;
    for (int r = 0; r < nwin; r++) {
        hm_pool_t *A = shared_pool();
        size_t mlen = 0;
        char *mm = munmap_prepare(a_entries, &mlen);
        char **shm_one = shm_prepare(a_entries), **shm_runs = shm_prepare(a_entries);
        if (!A || !mm || !shm_one || !shm_runs || open_range(A, 64, 64 + a_entries)) {
            printf("destroy-windows: set-up failed\n");
            break;
        }
        long pg = sysconf(_SC_PAGESIZE);
        for (int k = 0; k < WK_KINDS; k++) {
            int kind = (k + r) % WK_KINDS; /* rotating order */
            wstat_t *w = &o.ws[nw];
            w->kind = kind;
            int oc = o.cpu < 0 ? 0 : o.cpu;
            long ip0 = cpu_irqs("TLB:", oc), ca0 = cpu_irqs("CAL:", oc);
            window_edge(&o, nw);
            double t0 = now_ns();
            if (kind == WK_DESTROY) {
                hm_pool_destroy(A);
            } else if (kind == WK_MUNMAP) {
                for (size_t i = 0; i < a_entries; i++) (void)munmap(mm + 2 * i * (size_t)pg, (size_t)pg);
            } else if (kind == WK_MUNMAP_SHM) {
                for (size_t i = 0; i < a_entries; i++) (void)munmap(shm_one[i], (size_t)pg);
            } else if (kind == WK_MUNMAP_RUNS) { /* one munmap per run of adjacent mappings */
                char **shm = shm_runs;
                size_t i = 0;
                while (i < a_entries) {
                    size_t j = i + 1;
                    while (j < a_entries && shm[j] + pg == shm[j - 1]) j++; /* descending */
                    (void)munmap(shm[j - 1], (size_t)pg * (j - i));
                    i = j;
                }
            } else {
                while (now_ns() - t0 < last_destroy) {
                }
            }
            double t1 = now_ns();
            window_edge(&o, -1);
            long ip1 = cpu_irqs("TLB:", oc), ca1 = cpu_irqs("CAL:", oc);
            w->cals = ca0 >= 0 && ca1 >= 0 ? ca1 - ca0 : -1;
            w->dur_ns = t1 - t0;
            w->ipis = ip0 >= 0 && ip1 >= 0 ? ip1 - ip0 : -1;
            if (kind == WK_DESTROY) last_destroy = w->dur_ns;
            nw++;
        }
        munmap(mm, mlen);
        free(shm_one);
        free(shm_runs);
    }
    double cpus = (cpu_now_s() - cpu0) / ((now_ns() - wall0) / 1e9);
    atomic_store(&o.stop, 1);
    pthread_join(t, NULL);
    (void)pin_to(-1);
    {   /* back to every CPU */
        cpu_set_t s;
        CPU_ZERO(&s);
        for (long c = 0; c < ncpu && c < CPU_SETSIZE; c++) CPU_SET((int)c, &s);
        pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
    }

    /* per-window statistics */
    double *v = malloc(o.nlat * sizeof(double) + 1);
    for (int w = 0; w < nw; w++) {
        wstat_t *s = &o.ws[w];
        size_t n = 0;
        for (size_t i = 0; i < o.nlat; i++)
            if (o.lat[i].win == w) v[n++] = o.lat[i].ns;
        s->n = n;
        s->med = median_of(v, n);
        s->worst = n ? v[n - 1] : 0;
        for (size_t i = 0; i < o.nlat; i++) {
            if (o.lat[i].win != w) continue;
            if (o.lat[i].ns > 10 * s->med) s->over10++;
            if (o.lat[i].off_cpu > OFF_CPU_NS) {
                s->off++;
                continue;
            }
            if (o.lat[i].ns > s->worst_on) s->worst_on = o.lat[i].ns;
            if (o.lat[i].ns > 10 * s->med) s->over10_on++;
        }
    }
    printf("destroy-windows: pool A holds %zu mappings; thread 2 opens (hits, each open timed "
           "alone) through pool B on CPU %d, this thread on CPU %d; %d windows of each kind; "
           "effective CPUs %.2f (%ld online)\n",
           a_entries, o.cpu, o.cpu < 0 ? -1 : 0, nwin, cpus, ncpu);
    if (!quick) {
        printf("  %-7s %7s %6s %6s %9s %8s %6s %5s %5s %6s %9s %8s %6s %8s %5s\n", "window", "ms",
               "n", "median", "worst", "x median", ">10x", "vcsw", "icsw", "offcpu", "worst on",
               "x median", ">10x on", "TLB IPIs", "CAL");
        for (int w = 0; w < nw; w++) {
            wstat_t *s = &o.ws[w];
            printf("  %-7s %7.2f %6zu %6.0f %9.0f %8.1f %6zu %5ld %5ld %6zu %9.0f %8.1f %6zu "
                   "%8ld %5ld\n",
                   wk_name[s->kind], s->dur_ns / 1e6, s->n, s->med, s->worst,
                   s->med > 0 ? s->worst / s->med : 0, s->over10, s->csw[1][0] - s->csw[0][0],
                   s->csw[1][1] - s->csw[0][1], s->off, s->worst_on,
                   s->med > 0 ? s->worst_on / s->med : 0, s->over10_on, s->ipis, s->cals);
        }
    }
    printf("  (munmap: 4 KiB private anonymous pages; munmap-shm: 4 KiB shared memfd pages, as "
           "pool A's; each written, one munmap each; shm-runs: the same pages, one munmap per "
           "run of adjacent ones)\n");
    printf("  summary by kind, medians over its windows (ratio: a window's worst open over "
           "its median open; \"on-CPU\": opens that lost < %.0f ns to not running; "
           "\"clean\": windows in which the opener was never switched out):\n", OFF_CPU_NS);
    for (int k = 0; k < WK_KINDS; k++) {
        double ratio[MAX_WIN], ratio_on[MAX_WIN], ratio_c[MAX_WIN], med[MAX_WIN], over[MAX_WIN],
            over_on[MAX_WIN], ipi[MAX_WIN], dur[MAX_WIN], vcsw[MAX_WIN];
        size_t m = 0, mc = 0, gt = 0, gt_on = 0, gtc = 0;
        for (int w = 0; w < nw; w++) {
            wstat_t *s = &o.ws[w];
            if (s->kind != k || !s->n) continue;
            double rt = s->worst / s->med, rt_on = s->worst_on / s->med;
            int clean = s->csw[1][0] == s->csw[0][0] && s->csw[1][1] == s->csw[0][1];
            med[m] = s->med;
            over[m] = (double)s->over10;
            over_on[m] = (double)s->over10_on;
            ipi[m] = (double)s->ipis;
            dur[m] = s->dur_ns / 1e6;
            vcsw[m] = (double)(s->csw[1][0] - s->csw[0][0]);
            ratio_on[m] = rt_on;
            ratio[m++] = rt;
            gt += rt > 10;
            gt_on += rt_on > 10;
            if (clean) {
                ratio_c[mc++] = rt;
                gtc += rt > 10;
            }
        }
        if (!m) continue;
        printf("    %-7s %2zu windows of %5.1f ms, median open %4.0f ns, TLB IPIs to the opener's "
               "CPU %5.0f, voluntary switches %2.0f\n"
               "            worst/median %8.1fx (on-CPU %6.1fx); windows with worst > 10x: %2zu "
               "of %zu (on-CPU: %2zu; clean: %zu of %zu); opens > 10x median per window: %4.0f "
               "(on-CPU %4.0f)\n",
               wk_name[k], m, median_of(dur, m), median_of(med, m), median_of(ipi, m),
               median_of(vcsw, m), median_of(ratio, m), median_of(ratio_on, m), gt, m, gt_on,
               gtc, mc, median_of(over, m), median_of(over_on, m));
        (void)ratio_c;
    }
    free(v);
    free(o.lat);
    free(o.ws);
    hm_pool_destroy(B);
}

/* Open [lo, hi) last first: an exporter's allocations have ascending memfd
 * offsets, and the importer's kernel places each new mapping just below the
 * previous one, so in this order neighbouring mappings of one exporter are
 * contiguous in both address and file offset, with the same flags, and the
 * kernel merges them into one VMA (the OS provider maps each handle on its
 * own; pidfd_getfd gives the same open file each time). Pool B can then
 * hold 10^5 mappings under vm.max_map_count; each is still its own cache
 * entry, tracker record and provider mapping record (the library does not
 * know they share a VMA; closing one splits it). */
static int open_range_rev(hm_pool_t *pool, size_t lo, size_t hi) {
    return open_range_dir(pool, lo, hi, 1);
}
static size_t count_vmas(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    size_t n = 0;
    int c;
    if (!f) return 0;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static size_t max_maps(void);
static double destroy_once(size_t a_entries) {
    hm_pool_t *A = shared_pool();
    if (!A || open_range(A, 0, a_entries)) return -1;
    double t0 = now_ns();
    hm_pool_destroy(A);
    return now_ns() - t0;
}

static void destroy_isolation(size_t a_entries, size_t b_entries) {
    hm_ipc_set_cache_limits(0, 0);
    const int reps = quick ? 1 : 5;
    double t_empty[5], t_full[5];
    hm_pool_t *B = shared_pool();
    for (int r = 0; r < reps; r++) t_empty[r] = destroy_once(a_entries);
    size_t vmas0 = count_vmas();
    double t = now_ns();
    if (open_range_rev(B, a_entries, a_entries + b_entries)) return;
    double fill = now_ns() - t;
    printf("destroy-isolation: pool B's %zu mappings (opened last first: the kernel merges "
           "neighbours) added %zd VMAs (vm.max_map_count %zu)\n", b_entries,
           (ssize_t)(count_vmas() - vmas0), max_maps());
    for (int r = 0; r < reps; r++) t_full[r] = destroy_once(a_entries);
    qsort(t_empty, (size_t)reps, sizeof(double), cmp_d);
    qsort(t_full, (size_t)reps, sizeof(double), cmp_d);
    double e = t_empty[reps / 2], f = t_full[reps / 2];
    printf("destroy-isolation: destroy of pool A (%zu mappings): %.2f ms with pool B empty, "
           "%.2f ms with pool B holding %zu mappings = %.2fx (target within 1.2x); filling B "
           "took %.0f ms (%.1f us per open miss)\n",
           a_entries, e / 1e6, f / 1e6, b_entries, f / e, fill / 1e6,
           fill / 1e3 / (double)b_entries);
    t = now_ns();
    hm_pool_destroy(B);
    printf("destroy-isolation: destroying B itself (%zu mappings) took %.0f ms\n", b_entries,
           (now_ns() - t) / 1e6);
}

static size_t max_maps(void) {
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    unsigned long v = 65530;
    if (f) {
        if (fscanf(f, "%lu", &v) != 1) v = 65530;
        fclose(f);
    }
    return v;
}

int main(int argc, char **argv) {
    int cases_only = 0, windows_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        int c = !strcmp(argv[i], "--cases-only");    /* the table only, no experiments */
        int w = !strcmp(argv[i], "--windows-only");  /* only the destroy windows */
        if (c || w) {
            cases_only |= c;
            windows_only |= w;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof(*argv));
            argc--;
            i--;
        }
    }
    size_t a_entries = quick ? 200 : 4000;
    size_t b_entries = quick ? 500 : 100000;
    /* Pool A's mappings are VMAs of their own; pool B's merge (see
     * open_range_rev); each exporter stays under the limit (EXPORTER_MAX). */
    size_t limit = max_maps();
    if (2 * a_entries + 12000 > limit) a_entries = (limit - 12000) / 2;
    size_t cached = quick ? 1000 : 10000;
    size_t n = cases_only ? 0 : windows_only ? 64 + a_entries : a_entries + b_entries;
    if (n < cached) n = cached;
    /* Every handle the exporter makes stays in its export cache (the get
     * case caches 10^4; a bound below n would evict the first handles
     * before they are opened): the exporter inherits this bound. */
    char bound[32];
    snprintf(bound, sizeof bound, "%zu", n + 1024);
    setenv("HM_IPC_EXPORT_CACHE_MAX", bound, 0);
    int done_fd = -1;
    if (start_exporters(n, &done_fd)) { /* before any thread exists */
        fprintf(stderr, "bench_ipc: could not start the exporter\n");
        return 1;
    }
    handles_compact(cached);
    {   /* the pidfd transport must work here */
        hm_pool_t *p = shared_pool();
        void *m;
        hm_result_t r = hm_ipc_open(p, H(0), hlens[0], &m);
        if (r == HM_SUCCESS) hm_ipc_close(m);
        hm_pool_destroy(p);
        if (r != HM_SUCCESS) {
            fprintf(stderr, "bench_ipc: opening through pidfd_getfd fails here (%s); skipped\n",
                    hm_result_string(r));
            stop_exporters(done_fd);
            return 77;
        }
    }
    int code = 0;
    if (windows_only) {
        destroy_windows(a_entries, quick ? 1 : 12);
        stop_exporters(done_fd);
        return 0;
    }
    hm_bench_t *b = hm_bench_create("ipc", &argc, argv, &code);
    if (!b) return code;
    const hm_bench_impl_t get_impl = {"hetmem", get_setup, get_run, get_teardown};
    const hm_bench_impl_t getpid_impl[2] = {{"getpid", NULL, getpid_run, NULL},
                                            {"2-misses", chase_setup, chase_run, chase_teardown}};
    hm_bench_case(b, "get+put (hit), 10^4 exports cached", &cached, 1, &get_impl, getpid_impl,
                  2);
    const hm_bench_impl_t hit_impl = {"hetmem", open_hit_setup, open_run, open_teardown};
    const hm_bench_impl_t floors[4] = {
        getpid_impl[1],
        {"floor", floor_setup, floor_run, floor_teardown},
        {"floor-old", floor_old_setup, floor_run, floor_teardown},
        {"floor+sync", floor_sync_setup, floor_run, floor_teardown}};
    hm_bench_case(b, "open+close (hit), 10^4 mappings cached", &cached, 1, &hit_impl, floors, 4);
    const hm_bench_impl_t recv_impl = {"hetmem", open_recv_setup, open_recv_run, open_teardown};
    const hm_bench_impl_t recv_floors[4] = {
        {"rebuild", rebuild_setup, rebuild_run, NULL},
        {"floor", floor_recv_setup, floor_run, floor_teardown},
        {"floor-old", floor_old_recv_setup, floor_run, floor_teardown},
        {"floor+sync", floor_sync_recv_setup, floor_run, floor_teardown}};
    hm_bench_case(b, "open+close (hit), 10^4 cached, handle just received", &cached, 1,
                  &recv_impl, recv_floors, 4);
    /* The same at a tenth of the footprint (index + entries ~150 KB): what a
     * hit costs when the cache's own lines stay in this machine's caches. */
    size_t small = cached / 10;
    hm_bench_case(b, "open+close (hit), 10^3 cached, handle just received", &small, 1,
                  &recv_impl, recv_floors, 4);
    const hm_bench_impl_t get_hot = {"hetmem", get_setup, get_hot_run, get_teardown};
    hm_bench_case(b, "get+put (hit), 8 hot of 10^4 exports cached", &cached, 1, &get_hot, NULL, 0);
    const hm_bench_impl_t open_hot = {"hetmem", open_hit_setup, open_hot_run, open_teardown};
    hm_bench_case(b, "open+close (hit), 8 hot of 10^4 cached", &cached, 1, &open_hot, NULL, 0);
    const hm_bench_impl_t miss_impl = {"hetmem", open_miss_setup, open_run, open_teardown};
    hm_bench_case(b, "open+close (miss: map, then evict)", &cached, 1, &miss_impl, NULL, 0);
    code = hm_bench_finish(b);
    split_ops(cached, quick ? 1 : 9);
    if (cases_only) {
        stop_exporters(done_fd);
        return code;
    }

    destroy_windows(a_entries, quick ? 1 : 12);
    destroy_isolation(a_entries, b_entries);
    hm_ipc_cache_stats_t st;
    hm_ipc_get_cache_stats(&st);
    printf("cache at the end: %zu entries, %llu hits, %llu misses, %llu evictions\n", st.entries,
           (unsigned long long)st.hits, (unsigned long long)st.misses,
           (unsigned long long)st.evictions);
    stop_exporters(done_fd);
    return code;
}
