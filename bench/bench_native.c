/* hetmem benchmark: the native pool against malloc, in one run.
 * SPDX-License-Identifier: MIT
 *
 * Implementations (the same workload code, workloads.c, shared with
 * bench_jemalloc; only the alloc/free calls differ):
 *   native        hm_pool_malloc/hm_pool_free on a native pool over the OS
 *                 provider (tracked: hm_pool_free checks ownership through
 *                 the tracker, as the API promises).
 *   native-untr   the same pool created with HM_POOL_FLAG_NO_TRACKING: the
 *                 pool's own cost, without the tracker lookup.
 *   native-mutex  (remote cases) remote frees through a mutex-protected list
 *                 per heap instead of the wait-free queue.
 *   native-nobatch (remote cases) the wait-free queue, one free per batch.
 *   native-mutex-nobatch (remote cases) the mutex list, one free per batch:
 *                 with native-nobatch, what the queue buys per remote free.
 *   ring-only     (remote 64B cases only) no allocator: the producer hands addresses
 *                 of a static array through the same ring and the consumer
 *                 drops them. The hand-off's own cost per object, i.e. the
 *                 floor under every implementation's remote figure.
 *   malloc        malloc/free of this process: glibc, or whatever LD_PRELOAD
 *                 put in front (the name shown is the preloaded library's):
 *                   LD_PRELOAD=libjemalloc.so.2 ./bench_native
 *                   LD_PRELOAD=libmimalloc.so.2 ./bench_native
 *                   LD_PRELOAD=libtcmalloc_minimal.so.4 ./bench_native
 *                 and hetmem's own malloc replacement (the native pool's
 *                 ops called directly, no hm_pool_* front-end):
 *                   LD_PRELOAD=.../libhetmem_proxy.so ./bench_native
 *                 (its "native" row is the same in every run, so proxy vs
 *                 tcmalloc is (proxy/native) x (native/tcmalloc)).
 *
 * Cases (one op = one allocation and its free):
 *   pairs S       malloc immediately followed by free, sizes S (cycled from a
 *                 precomputed random list)
 *   random S      10,000 live slots; each op frees a random slot and
 *                 allocates a new block of a random size S into it
 *   remote 64B    one thread allocates 64-byte objects, another frees them
 *                 (handed through a single-producer/single-consumer ring)
 *   xmalloc 2+2   2 producers allocate batches of 4096 objects (16..512 B),
 *                 2 consumers free whole batches (the xmalloc-test pattern)
 *   remote 64B 1->3  one thread allocates 64-byte objects, 3 threads free
 *                 them (each gets every third object through its own ring):
 *                 3 threads publish into one heap's queue, 4 threads on
 *                 the machine's cores. With the nobatch rows (one
 *                 publication per free) it shows what the wait-free queue
 *                 buys over the mutex list when publishers contend and are
 *                 preempted (a preempted mutex holder stalls the others; a
 *                 wfcq enqueue never waits); with batching (the default)
 *                 one publication carries up to 126 frees and both queues
 *                 cost the same.
 * Memory is not touched beyond one byte per block (the allocator is timed,
 * not page faults).
 *
 * Peak RSS: after the timed cases, each remote case (1->1, xmalloc 2+2,
 * 1->3) runs once more per
 * implementation in a fresh process (this program, re-executed with
 * --rss-child, same environment, so the same LD_PRELOAD), for --rss N
 * objects (default 2,000,000; 0: skip); the table shows that process's
 * VmHWM (/proc/self/status, in KiB: the differences between allocators are
 * tens of KiB) after set-up and at the end of the run, and the
 * peak less the file pages mapped at the end (RssFile + RssShmem, before
 * teardown; they only grow during a run): about the private memory at the
 * peak. The file pages are mostly code, which the kernel maps up to 16
 * pages at a time around each page executed (fault-around) if they are in
 * the page cache, so their count depends on the library's layout and on the
 * cache, not on the allocator's use of memory.
 *
 * Code layout: the native pool's run-time code sits in the first 64 KiB of
 * libhetmem's text (functions marked HM_RUN, cmake/hm_text.ld). After a
 * change to the paths these children run, check that it still does:
 *   scripts/text_layout.sh build-release
 * runs the remote, fan-in and xmalloc children under callgrind and lists the
 * functions they execute without the mark (nothing listed: exit status 0). */
#include "harness.h"
#include "workloads.h"

#include <hetmem/hetmem.h>

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- set-up of each implementation ---- */

static int make_pool(impl_ctx_t *c, uint32_t flags, hm_native_remote_queue_t q, unsigned batch) {
    hm_provider_t *prov;
    if (hm_os_provider_create(NULL, &prov) != HM_SUCCESS) return 1;
    hm_native_params_t *np;
    if (hm_native_params_create(&np) != HM_SUCCESS) return 1;
    hm_native_params_set_remote_queue(np, q);
    hm_native_params_set_remote_batch(np, batch);
    hm_result_t r = hm_native_pool_create(prov, np, flags | HM_POOL_FLAG_OWN_PROVIDER, &c->pool);
    hm_native_params_destroy(np);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_native: pool: %s\n", hm_result_string(r));
        hm_provider_destroy(prov);
        return 1;
    }
    c->kind = K_POOL;
    return 0;
}

static int setup_generic(const void *a, void **ctx, kind_t kind, uint32_t flags,
                         hm_native_remote_queue_t q, unsigned batch) {
    impl_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->kind = kind;
    if (kind == K_POOL && make_pool(c, flags, q, batch)) {
        free(c);
        return 1;
    }
    return wl_setup_finish(a, c, ctx);
}

static int setup_native(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_WFCQ, 126);
}
static int setup_untracked(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, HM_POOL_FLAG_NO_TRACKING, HM_NATIVE_QUEUE_WFCQ, 126);
}
static int setup_mutex(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_MUTEX, 126);
}
static int setup_nobatch(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_WFCQ, 1);
}
static int setup_mutex_nobatch(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, HM_NATIVE_QUEUE_MUTEX, 1);
}
static int setup_malloc(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_MALLOC, 0, HM_NATIVE_QUEUE_WFCQ, 126);
}
static int setup_ring(const void *a, void **ctx) {
    const case_arg_t *ca = a;
    if (ca->lo != 64 || ca->hi != 64) return HM_BENCH_SKIP; /* the remote case only */
    return setup_generic(a, ctx, K_RING, 0, HM_NATIVE_QUEUE_WFCQ, 126);
}


/* ---- peak RSS, one fresh process per run ---- */

static long vm_kb(const char *field) { /* from /proc/self/status, -1 if absent */
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') kb = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return kb;
}

/* Diagnostic, not part of the table: with HM_BENCH_SMAPS=PATH set, the
 * --rss-child copies /proc/self/smaps to PATH.setup after set-up and to
 * PATH.peak at the end of the run (where the table reads its figures), and
 * writes PATH.setup.pages / PATH.peak.pages: per mapping of /proc/self/maps,
 * the runs of its resident pages (present or swapped, from
 * /proc/self/pagemap; not the shared zero page), so the pages touched in one mapping can be told from
 * those of a neighbour that smaps merges with it; for a pool, its
 * statistics at the end in PATH.peak.stats. read/write on static
 * buffers: the dump allocates nothing (but what hm_pool_get_stats does). */
static void copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    static char buf[4096];
    ssize_t n;
    while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) break;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
}

/* Hex in and out by hand: printf and scanf would fault in libc code pages
 * that the run itself does not use, in one row and not in another. */
static const char *hex_in(const char *s, unsigned long *v) {
    *v = 0;
    for (;; s++) {
        unsigned d = *s >= '0' && *s <= '9' ? (unsigned)(*s - '0')
                     : *s >= 'a' && *s <= 'f' ? (unsigned)(*s - 'a' + 10)
                                              : 16u;
        if (d == 16) return s;
        *v = *v * 16 + d;
    }
}

static char *hex_out(char *o, unsigned long v) {
    char tmp[2 * sizeof v];
    int n = 0;
    do tmp[n++] = "0123456789abcdef"[v & 15]; while (v >>= 4);
    while (n) *o++ = tmp[--n];
    return o;
}

static void pages_dump(const char *to) {
    static char maps[1 << 16];
    static char line_out[PATH_MAX + 256];
    int in = open("/proc/self/maps", O_RDONLY), pm = open("/proc/self/pagemap", O_RDONLY);
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t len = 0;
    ssize_t n;
    while (in >= 0 && len < sizeof maps - 1 && (n = read(in, maps + len, sizeof maps - 1 - len)) > 0)
        len += (size_t)n;
    maps[len] = 0;
    const unsigned long page = 4096;
    /* The shared zero page backs anonymous pages that were only read: not
     * in Rss. Its frame number (visible with CAP_SYS_ADMIN; 0 otherwise,
     * then such pages are listed too), from a page of our own read once. */
    static volatile char probe[2 * 4096];
    uintptr_t zp = ((uintptr_t)probe + 4095) & ~(uintptr_t)4095;
    (void)((volatile char *)zp)[0];
    uint64_t ze = 0, zpfn = 0;
    if (pm >= 0 && pread(pm, &ze, sizeof ze, (off_t)(zp / page * 8)) == 8 && (ze >> 63))
        zpfn = ze & (((uint64_t)1 << 55) - 1);
    for (char *line = maps, *next; out >= 0 && pm >= 0 && line && *line; line = next) {
        next = line;
        while (*next && *next != '\n') next++;
        if (*next) *next++ = 0;
        unsigned long lo, hi;
        const char *q = hex_in(line, &lo);
        if (*q != '-') continue;
        hex_in(q + 1, &hi);
        size_t k = (size_t)(next - line);
        memcpy(line_out, line, k - 1);
        line_out[k - 1] = '\n';
        if (write(out, line_out, k) != (ssize_t)k) break;
        if (hi - lo > ((unsigned long)1 << 32)) continue; /* a sanitizer's shadow: not scanned */
        unsigned long run = 0;
        int in_run = 0;
        for (unsigned long a = lo; a <= hi; a += page) {
            uint64_t e = 0;
            int res = a < hi && pread(pm, &e, sizeof e, (off_t)(a / page * 8)) == 8 &&
                      (e >> 62) && !(zpfn && (e >> 63) && (e & (((uint64_t)1 << 55) - 1)) == zpfn);
            unsigned long i = (a - lo) / page;
            if (res && !in_run) run = i, in_run = 1;
            if (!res && in_run) { /* "  +START..END" (offsets in the mapping, hex) */
                char *o = line_out;
                *o++ = ' ', *o++ = ' ', *o++ = '+';
                o = hex_out(o, run * page);
                *o++ = '.', *o++ = '.';
                o = hex_out(o, i * page);
                *o++ = '\n';
                if (write(out, line_out, (size_t)(o - line_out)) != o - line_out) break;
                in_run = 0;
            }
        }
    }
    if (out >= 0) close(out);
    if (in >= 0) close(in);
    if (pm >= 0) close(pm);
}

static void smaps_dump(const char *when, void *ctx) {
    const char *path = getenv("HM_BENCH_SMAPS");
    if (!path || !*path) return;
    char name[PATH_MAX];
    size_t pl = strlen(path), wl = strlen(when);
    if (pl + wl + 8 > sizeof name) return;
    memcpy(name, path, pl);
    name[pl] = '.';
    memcpy(name + pl + 1, when, wl + 1);
    copy_file("/proc/self/smaps", name);
    memcpy(name + pl + 1 + wl, ".pages", 7);
    pages_dump(name);
    const impl_ctx_t *c = ctx;
    hm_pool_stats_t st;
    /* At the peak only: at set-up the call would fault in code pages the run
     * does not use. */
    if (strcmp(when, "peak") || c->kind != K_POOL || hm_pool_get_stats(c->pool, &st) != HM_SUCCESS)
        return;
    snprintf(name, sizeof name, "%s.%s.stats", path, when);
    int out = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char line[256];
    int k = snprintf(line, sizeof line,
                     "requested %zu from_provider %zu provider_allocs %zu slabs %zu "
                     "published %zu drained %zu\n",
                     st.bytes_requested, st.bytes_from_provider, st.provider_allocs, st.slabs,
                     st.remote_frees_published, st.remote_frees_drained);
    if (out >= 0 && k > 0 && write(out, line, (size_t)k) != k) k = -1;
    if (out >= 0) close(out);
}

typedef struct rss_impl {
    const char *name;
    int (*setup)(const void *, void **);
} rss_impl_t;

static const rss_impl_t rss_impls[] = {
    {"native", setup_native},        {"native-mutex", setup_mutex},
    {"native-nobatch", setup_nobatch}, {"native-mutex-nobatch", setup_mutex_nobatch},
    {"native-untr", setup_untracked},
    {"malloc", setup_malloc},
};
static const char *const rss_cases[] = {"remote", "xmalloc", "fanin"};
static const char *const rss_labels[] = {"remote 64B 1->1", "xmalloc 2+2", "remote 64B 1->3"};

/* --rss-child CASE IMPL N: run once, print "start_kb peak_kb private_kb". */
static int rss_child(const char *cs, const char *impl, const char *count) {
    static case_arg_t arg;
    uint64_t n = strtoull(count, NULL, 10);
    int remote = !strcmp(cs, "remote"), fanin = !strcmp(cs, "fanin");
    if (remote) wl_fill_arg(&arg, 0, 64, 64, 7);
    else if (fanin) wl_fill_arg(&arg, 0, 64, 64, 11);
    else wl_fill_arg(&arg, 0, 16, 512, 9);
    for (size_t i = 0; i < sizeof rss_impls / sizeof rss_impls[0]; i++) {
        if (strcmp(rss_impls[i].name, impl)) continue;
        void *ctx;
        if (rss_impls[i].setup(&arg, &ctx)) return 1;
        long start = vm_kb("VmHWM");
        smaps_dump("setup", ctx);
        int r = remote  ? wl_run_remote(ctx, &arg, n)
                : fanin ? wl_run_fanin(ctx, &arg, n)
                        : wl_run_xmalloc(ctx, &arg, n);
        long peak = vm_kb("VmHWM"), priv = peak - vm_kb("RssFile") - vm_kb("RssShmem");
        smaps_dump("peak", ctx);
        wl_teardown(ctx);
        printf("%ld %ld %ld\n", start, peak, priv);
        return r;
    }
    return 2;
}

static void rss_table(uint64_t n) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return;
    self[len] = 0;
    printf("\npeak RSS: one fresh process per run, %llu objects (KiB: VmHWM after set-up, "
           "and at the end; private: the peak less the file pages)\n", (unsigned long long)n);
    printf("%-17s %-20s %8s %8s %8s\n", "case", "impl", "set-up", "peak", "private");
    for (size_t c = 0; c < sizeof rss_cases / sizeof rss_cases[0]; c++) {
        for (size_t i = 0; i < sizeof rss_impls / sizeof rss_impls[0]; i++) {
            char cmd[PATH_MAX + 128];
            snprintf(cmd, sizeof cmd, "'%s' --rss-child %s %s %llu", self, rss_cases[c],
                     rss_impls[i].name, (unsigned long long)n);
            FILE *f = popen(cmd, "r");
            long start = -1, peak = -1, priv = -1;
            if (f) {
                if (fscanf(f, "%ld %ld %ld", &start, &peak, &priv) != 3) start = peak = priv = -1;
                pclose(f);
            }
            const char *name = strcmp(rss_impls[i].name, "malloc") ? rss_impls[i].name
                                                                     : wl_malloc_name();
            printf("%-17s %-20s %8ld %8ld %8ld\n", i ? "" : rss_labels[c], name, start, peak,
                   priv);
        }
    }
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--rss-child")) return rss_child(argv[2], argv[3], argv[4]);
    uint64_t rss_n = 2000000;
    int quick = 0;
    for (int i = 1; i < argc; i++) { /* take --rss N out before the harness sees it */
        quick |= !strcmp(argv[i], "--quick");
        if (!strcmp(argv[i], "--rss") && i + 1 < argc) {
            rss_n = strtoull(argv[i + 1], NULL, 10);
            for (int k = i; k + 2 <= argc; k++) argv[k] = argv[k + 2];
            argc -= 2;
            i--;
        }
    }
    if (quick && rss_n > 20000) rss_n = 20000;
    int rc;
    hm_bench_t *b = hm_bench_create("native", &argc, argv, &rc);
    if (!b) return rc;
    if (argc > 1) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[1]);
        hm_bench_finish(b);
        return 2;
    }
    static hm_bench_impl_t local_subject = {"native", setup_native, NULL, wl_teardown};
    static hm_bench_impl_t local_base[] = {
        {"native-untr", setup_untracked, NULL, wl_teardown},
        {NULL, setup_malloc, NULL, wl_teardown},
    };
    static hm_bench_impl_t remote_subject = {"native", setup_native, NULL, wl_teardown};
    static hm_bench_impl_t remote_base[] = {
        {"native-mutex", setup_mutex, NULL, wl_teardown},
        {"native-nobatch", setup_nobatch, NULL, wl_teardown},
        {"native-mutex-nobatch", setup_mutex_nobatch, NULL, wl_teardown},
        {"native-untr", setup_untracked, NULL, wl_teardown},
        {NULL, setup_malloc, NULL, wl_teardown},
        {"ring-only", setup_ring, NULL, wl_teardown},
    };
    local_base[1].name = wl_malloc_name();
    remote_base[4].name = wl_malloc_name();

    wl_run_cases(b, &local_subject, local_base, 2, &remote_subject, remote_base, 6);
    /* Fan-in: FANIN threads publish into one heap (see the header). */
    static case_arg_t fan_arg;
    wl_fill_arg(&fan_arg, 0, 64, 64, 11);
    remote_subject.run = wl_run_fanin;
    for (size_t k = 0; k < 6; k++) remote_base[k].run = wl_run_fanin;
    hm_bench_case(b, "remote 64B 1->3", &fan_arg, 1, &remote_subject, remote_base, 6);
    rc = hm_bench_finish(b);
    if (rss_n) rss_table(rss_n);
    return rc;
}
