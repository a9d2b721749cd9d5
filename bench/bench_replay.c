/* hetmem benchmarks — replay a malloc trace (src/preload/trace.h, recorded
 * by libhetmem_proxy.so with HM_PROXY_TRACE=path) through an allocator, and
 * check that the replay is faithful. SPDX-License-Identifier: MIT
 *
 *   bench_replay [--backend pool|malloc|all] [--no-check] [--allow-unknown] [--metric] TRACE...
 *   bench_replay --quick      a built-in two-thread trace (the CTest smoke run)
 *
 * Back ends: "pool", a hetmem native pool over the OS provider called
 * directly (hm_pool_malloc and friends); "malloc", the process's malloc
 * family, so that running the replayer under LD_PRELOAD of another
 * allocator measures that one.
 *
 * Loading sorts the records by seq and resolves each free and realloc to
 * the record that made its block (a hash from traced address to the live
 * record, in seq order); the replay then keeps replay-time pointers in a
 * slot per record, so no hash is on the timed path. Each traced thread is
 * replayed on a thread of its own, in its own order; a call on a block
 * another thread made waits (spinning, then yielding) until that thread has
 * made it. Only these dependencies are ordered: other calls of different
 * threads run as they come, which is the traced program's concurrency only
 * roughly.
 *
 * Faithful means: every free and realloc names a block the trace made and
 * did not free yet (--allow-unknown: such calls are counted and skipped);
 * every allocation the program got succeeds, with a usable size at least
 * the size asked for and the alignment asked for; calloc's block reads
 * zero; the first bytes written after an allocation are intact at its free
 * and across realloc. --no-check drops the writes and checks (the timing is
 * then the allocator's, plus the slot bookkeeping). Prints, per trace and
 * back end: ops, ns/op over the replay's wall time, the trace's peak live
 * bytes (requested sizes, in seq order) and the counts; exits 1 when a
 * replay is not faithful. --metric adds a line "HM_METRIC ns_per_op=X" per
 * faithful replay, the measure bench_exec takes from a program's output. */
#include "../src/preload/trace.h"

#include <hetmem/hetmem.h>

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { PATTERN = 16 };

typedef struct trace {
    hm_trace_rec_t *r; /* sorted by seq */
    size_t n;
    int64_t *dep; /* index of the record whose block r[i] frees or reallocs; -1: none */
    uint32_t threads;
    size_t **by_thread; /* record indices of each traced thread, in order */
    size_t *count;      /* records per thread */
    size_t unknown, reused, peak;
} trace_t;

typedef struct counts {
    uint64_t ops, allocs, frees, reallocs, skipped;
    uint64_t alloc_failed, bad_usable, bad_align, bad_zero, bad_pattern;
} counts_t;

typedef struct backend {
    const char *name;
    hm_pool_t *pool; /* "pool" */
} backend_t;

static int g_check = 1;
static int g_metric = 0; /* --metric: also the HM_METRIC line bench_exec reads */

/* ---- back ends ---- */

static void *be_alloc(const backend_t *b, int op, size_t size, size_t align) {
    if (b->pool) {
        if (!size) size = 1;
        if (op == HM_TRACE_CALLOC) return hm_pool_calloc(b->pool, 1, size);
        if (op == HM_TRACE_MEMALIGN && align > 8)
            return hm_pool_aligned_malloc(b->pool, size, align);
        return hm_pool_malloc(b->pool, size);
    }
    if (op == HM_TRACE_CALLOC) return calloc(1, size);
    if (op == HM_TRACE_MEMALIGN && align > sizeof(void *)) {
        void *p = NULL;
        return posix_memalign(&p, align, size) ? NULL : p;
    }
    return malloc(size);
}

static void *be_realloc(const backend_t *b, void *p, size_t size) {
    return b->pool ? hm_pool_realloc(b->pool, p, size ? size : 1) : realloc(p, size);
}

static void be_free(const backend_t *b, void *p) {
    if (b->pool) (void)hm_pool_free(b->pool, p);
    else free(p);
}

static size_t be_usable(const backend_t *b, void *p) {
    return b->pool ? hm_pool_malloc_usable_size(b->pool, p) : malloc_usable_size(p);
}

/* ---- loading ---- */

static int cmp_seq(const void *a, const void *b) {
    uint64_t x = ((const hm_trace_rec_t *)a)->seq, y = ((const hm_trace_rec_t *)b)->seq;
    return x < y ? -1 : x > y;
}

static int is_alloc(const hm_trace_rec_t *r) {
    return r->result && r->op != HM_TRACE_FREE;
}

/* Open-addressing map: traced address -> live record index (tombstones). */
typedef struct map {
    uint64_t *key;
    int64_t *val;
    size_t cap;
} map_t;

static size_t mhash(uint64_t k, size_t cap) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static int64_t *map_find(map_t *m, uint64_t k, int insert) {
    size_t i = mhash(k, m->cap), tomb = SIZE_MAX;
    for (;; i = (i + 1) & (m->cap - 1)) {
        if (m->key[i] == k && m->val[i] >= 0) return &m->val[i];
        if (!m->key[i]) break;
        if (m->val[i] < 0 && tomb == SIZE_MAX) tomb = i;
    }
    if (!insert) return NULL;
    if (tomb != SIZE_MAX) i = tomb;
    m->key[i] = k;
    m->val[i] = -1;
    return &m->val[i];
}

/* Sort, resolve dependencies, split by thread. r is taken over. */
static int trace_prepare(trace_t *t, hm_trace_rec_t *r, size_t n) {
    qsort(r, n, sizeof *r, cmp_seq);
    t->r = r;
    t->n = n;
    t->dep = malloc((n ? n : 1) * sizeof *t->dep);
    map_t m = {.cap = 64};
    while (m.cap < 4 * n) m.cap *= 2; /* tombstones never outnumber records */
    m.key = calloc(m.cap, sizeof *m.key);
    m.val = calloc(m.cap, sizeof *m.val);
    size_t *size = calloc(n ? n : 1, sizeof *size);
    if (!t->dep || !m.key || !m.val || !size) return -1;
    size_t live = 0;
    t->threads = 0;
    for (size_t i = 0; i < n; i++) {
        hm_trace_rec_t *x = &r[i];
        t->dep[i] = -1;
        if (x->thread + 1u > t->threads) t->threads = x->thread + 1u;
        int frees = x->op == HM_TRACE_FREE || (x->op == HM_TRACE_REALLOC && x->ptr);
        int failed_realloc = x->op == HM_TRACE_REALLOC && x->ptr && !x->result && x->size;
        if (frees && !failed_realloc) {
            int64_t *v = map_find(&m, x->ptr, 0);
            if (!v) {
                t->unknown++;
                t->dep[i] = -2;
            } else {
                t->dep[i] = *v;
                live -= size[*v];
                *v = -1; /* tombstone */
            }
        }
        if (is_alloc(x)) {
            int64_t *v = map_find(&m, x->result, 1);
            if (*v >= 0) { /* the address came back before its free's record */
                t->reused++;
                live -= size[*v];
            }
            *v = (int64_t)i;
            size[i] = x->size;
            live += x->size;
            if (live > t->peak) t->peak = live;
        }
    }
    free(m.key);
    free(m.val);
    free(size);
    t->count = calloc(t->threads + 1, sizeof *t->count);
    t->by_thread = calloc(t->threads + 1, sizeof *t->by_thread);
    if (!t->count || !t->by_thread) return -1;
    for (size_t i = 0; i < n; i++) t->count[r[i].thread]++;
    for (uint32_t k = 0; k < t->threads; k++) {
        t->by_thread[k] = malloc((t->count[k] ? t->count[k] : 1) * sizeof(size_t));
        if (!t->by_thread[k]) return -1;
        t->count[k] = 0;
    }
    for (size_t i = 0; i < n; i++) t->by_thread[r[i].thread][t->count[r[i].thread]++] = i;
    return 0;
}

static void trace_fini(trace_t *t) {
    for (uint32_t k = 0; k < t->threads; k++) free(t->by_thread[k]);
    free(t->by_thread);
    free(t->count);
    free(t->dep);
    free(t->r);
}

static int trace_load(const char *path, trace_t *t) {
    memset(t, 0, sizeof *t);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        fprintf(stderr, "bench_replay: %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    hm_trace_header_t h;
    if (len < sizeof h || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
        h.magic != HM_TRACE_MAGIC || h.version != HM_TRACE_VERSION ||
        h.header_size != sizeof h || h.record_size != sizeof(hm_trace_rec_t) ||
        (len - sizeof h) % sizeof(hm_trace_rec_t)) {
        fprintf(stderr, "bench_replay: %s: not a version %u trace of %zu-byte records\n", path,
                HM_TRACE_VERSION, sizeof(hm_trace_rec_t));
        close(fd);
        return -1;
    }
    size_t n = (len - sizeof h) / sizeof(hm_trace_rec_t);
    hm_trace_rec_t *r = malloc((n ? n : 1) * sizeof *r);
    size_t got = 0;
    while (r && got < n * sizeof *r) {
        ssize_t k = pread(fd, (char *)r + got, n * sizeof *r - got, (off_t)(sizeof h + got));
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (!r || got != n * sizeof *r) {
        fprintf(stderr, "bench_replay: %s: cannot read the records\n", path);
        free(r);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (r[i].op < HM_TRACE_MALLOC || r[i].op > HM_TRACE_MEMALIGN) {
            fprintf(stderr, "bench_replay: %s: record %zu has op %u\n", path, i, r[i].op);
            free(r);
            return -1;
        }
    if (trace_prepare(t, r, n)) {
        fprintf(stderr, "bench_replay: out of memory\n");
        return -1;
    }
    return 0;
}

/* ---- replay ---- */

typedef struct replay {
    const trace_t *t;
    const backend_t *b;
    void *_Atomic *slot; /* the replay block of each allocating record */
    int allow_unknown;
} replay_t;

typedef struct worker {
    replay_t *rp;
    uint32_t thread;
    counts_t c;
    pthread_t tid;
} worker_t;

static void fill(void *p, size_t size, size_t key) {
    size_t k = size < PATTERN ? size : PATTERN;
    for (size_t i = 0; i < k; i++) ((unsigned char *)p)[i] = (unsigned char)(key * 131 + i + 1);
}

static int intact(const void *p, size_t size, size_t key) {
    size_t k = size < PATTERN ? size : PATTERN;
    for (size_t i = 0; i < k; i++)
        if (((const unsigned char *)p)[i] != (unsigned char)(key * 131 + i + 1)) return 0;
    return 1;
}

static void *wait_slot(replay_t *rp, int64_t d) {
    void *p;
    for (unsigned spins = 0; !(p = atomic_load_explicit(&rp->slot[d], memory_order_acquire));
         spins++)
        if (spins > 64) sched_yield();
    return p;
}

static void check_new(const backend_t *b, const hm_trace_rec_t *x, void *p, size_t key,
                      counts_t *c) {
    if (be_usable(b, p) < x->size) c->bad_usable++;
    if (x->align && ((uintptr_t)p & (x->align - 1))) c->bad_align++;
    if (x->op == HM_TRACE_CALLOC) {
        size_t k = x->size < 64 ? x->size : 64;
        for (size_t i = 0; i < k; i++)
            if (((unsigned char *)p)[i]) {
                c->bad_zero++;
                break;
            }
    }
    fill(p, x->size, key);
}

static void *work(void *arg) {
    worker_t *w = arg;
    replay_t *rp = w->rp;
    const trace_t *t = rp->t;
    const backend_t *b = rp->b;
    counts_t *c = &w->c;
    const size_t *idx = t->by_thread[w->thread];
    for (size_t j = 0; j < t->count[w->thread]; j++) {
        size_t i = idx[j];
        const hm_trace_rec_t *x = &t->r[i];
        int64_t d = t->dep[i];
        if (d == -2) { /* a block the trace never made (counted at load) */
            c->skipped++;
            continue;
        }
        c->ops++;
        if (x->op == HM_TRACE_FREE || (x->op == HM_TRACE_REALLOC && d >= 0 && !x->result)) {
            void *p = wait_slot(rp, d);
            if (g_check && !intact(p, t->r[d].size, (size_t)d)) c->bad_pattern++;
            be_free(b, p);
            c->frees++;
        } else if (x->op == HM_TRACE_REALLOC && d >= 0) {
            void *p = wait_slot(rp, d);
            size_t keep = t->r[d].size < x->size ? t->r[d].size : x->size;
            if (g_check && !intact(p, keep, (size_t)d)) c->bad_pattern++;
            void *q = be_realloc(b, p, x->size);
            if (!q) {
                c->alloc_failed++;
                continue;
            }
            if (g_check) {
                if (!intact(q, keep, (size_t)d)) c->bad_pattern++;
                check_new(b, x, q, i, c);
            }
            atomic_store_explicit(&rp->slot[i], q, memory_order_release);
            c->reallocs++;
        } else if (is_alloc(x)) { /* malloc, calloc, memalign, realloc(NULL, n) */
            void *p = be_alloc(b, x->op, x->size, x->align);
            if (!p) {
                c->alloc_failed++;
                continue;
            }
            if (g_check) check_new(b, x, p, i, c);
            atomic_store_explicit(&rp->slot[i], p, memory_order_release);
            c->allocs++;
        } else { /* a call that failed in the program, or a failed realloc */
            c->ops--;
            c->skipped++;
        }
    }
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Replay t through b; free what the trace leaves live. 0: faithful. */
static int replay(const char *label, const trace_t *t, const backend_t *b, int allow_unknown) {
    replay_t rp = {.t = t, .b = b, .allow_unknown = allow_unknown};
    rp.slot = calloc(t->n ? t->n : 1, sizeof *rp.slot);
    worker_t *w = calloc(t->threads ? t->threads : 1, sizeof *w);
    if (!rp.slot || !w) {
        fprintf(stderr, "bench_replay: out of memory\n");
        free(rp.slot);
        free(w);
        return 1;
    }
    double t0 = now();
    int err = 0;
    if (t->threads == 1) {
        w[0].rp = &rp;
        work(&w[0]);
    } else {
        for (uint32_t k = 0; k < t->threads; k++) {
            w[k].rp = &rp;
            w[k].thread = k;
            if (pthread_create(&w[k].tid, NULL, work, &w[k])) {
                fprintf(stderr, "bench_replay: cannot start thread %u\n", k);
                err = 1;
                for (uint32_t j = 0; j < k; j++) pthread_join(w[j].tid, NULL);
                break;
            }
        }
        if (!err)
            for (uint32_t k = 0; k < t->threads; k++) pthread_join(w[k].tid, NULL);
    }
    double wall = now() - t0;
    counts_t c = {0};
    for (uint32_t k = 0; k < t->threads; k++) {
        c.ops += w[k].c.ops;
        c.allocs += w[k].c.allocs;
        c.frees += w[k].c.frees;
        c.reallocs += w[k].c.reallocs;
        c.skipped += w[k].c.skipped;
        c.alloc_failed += w[k].c.alloc_failed;
        c.bad_usable += w[k].c.bad_usable;
        c.bad_align += w[k].c.bad_align;
        c.bad_zero += w[k].c.bad_zero;
        c.bad_pattern += w[k].c.bad_pattern;
    }
    /* Blocks still live at the trace's end: a slot whose block no later
     * record consumed. */
    char *used = calloc(t->n ? t->n : 1, 1);
    size_t leaked = 0;
    if (used) {
        for (size_t i = 0; i < t->n; i++)
            if (t->dep[i] >= 0) used[t->dep[i]] = 1;
        for (size_t i = 0; i < t->n; i++) {
            void *p = atomic_load(&rp.slot[i]);
            if (p && !used[i]) {
                be_free(b, p);
                leaked++;
            }
        }
        free(used);
    }
    int bad = err || c.alloc_failed || c.bad_usable || c.bad_align || c.bad_zero ||
              c.bad_pattern || (t->unknown && !allow_unknown);
    printf("%s %s: threads %u ops %llu ns/op %.1f peak-live %zu bytes | allocs %llu frees %llu "
           "reallocs %llu skipped %llu live-at-end %zu | unknown-frees %zu reused-early %zu "
           "alloc-failed %llu bad-usable %llu bad-align %llu bad-zero %llu bad-pattern %llu: "
           "%s\n",
           label, b->name, t->threads, (unsigned long long)c.ops,
           c.ops ? wall * 1e9 / (double)c.ops : 0.0, t->peak, (unsigned long long)c.allocs,
           (unsigned long long)c.frees, (unsigned long long)c.reallocs,
           (unsigned long long)c.skipped, leaked, t->unknown, t->reused,
           (unsigned long long)c.alloc_failed, (unsigned long long)c.bad_usable,
           (unsigned long long)c.bad_align, (unsigned long long)c.bad_zero,
           (unsigned long long)c.bad_pattern, bad ? "NOT FAITHFUL" : "faithful");
    if (g_metric && !bad && c.ops) printf("HM_METRIC ns_per_op=%.3f\n", wall * 1e9 / (double)c.ops);
    free(rp.slot);
    free(w);
    return bad;
}

/* ---- the built-in trace: thread 0 allocates, thread 1 frees and reallocs
 * half of it, thread 0 frees the rest ---- */

static int quick_trace(trace_t *t) {
    enum { N = 3000 };
    size_t cap = 3 * N, n = 0;
    hm_trace_rec_t *r = calloc(cap, sizeof *r);
    if (!r) return -1;
    uint64_t seq = 0, base = 0x100000;
    for (size_t i = 0; i < N; i++) {
        int op = i % 7 == 0 ? HM_TRACE_CALLOC : i % 11 == 0 ? HM_TRACE_MEMALIGN : HM_TRACE_MALLOC;
        r[n++] = (hm_trace_rec_t){.seq = seq++, .op = (uint8_t)op, .thread = 0,
                                  .size = 1 + (i * 37) % 3000, .align = op == HM_TRACE_MEMALIGN ? 64 : 0,
                                  .result = base + i * 0x1000};
    }
    for (size_t i = 0; i < N; i += 2) {
        if (i % 4 == 0) {
            r[n++] = (hm_trace_rec_t){.seq = seq++, .op = HM_TRACE_REALLOC, .thread = 1,
                                      .ptr = base + i * 0x1000, .size = 5000 + i,
                                      .result = base + (N + i) * 0x1000};
            r[n++] = (hm_trace_rec_t){.seq = seq++, .op = HM_TRACE_FREE, .thread = 0,
                                      .ptr = base + (N + i) * 0x1000};
        } else {
            r[n++] = (hm_trace_rec_t){.seq = seq++, .op = HM_TRACE_FREE, .thread = 1,
                                      .ptr = base + i * 0x1000};
        }
        r[n++] = (hm_trace_rec_t){.seq = seq++, .op = HM_TRACE_FREE, .thread = 0,
                                  .ptr = base + (i + 1) * 0x1000};
    }
    /* shuffle the file order a little: the loader sorts by seq */
    for (size_t i = 0; i + 1 < n; i += 5) {
        hm_trace_rec_t x = r[i];
        r[i] = r[i + 1];
        r[i + 1] = x;
    }
    memset(t, 0, sizeof *t);
    return trace_prepare(t, r, n);
}

static int run_all(const char *label, const trace_t *t, const char *which, int allow_unknown) {
    int bad = 0;
    if (!strcmp(which, "pool") || !strcmp(which, "all")) {
        hm_provider_t *prov = NULL;
        backend_t b = {.name = "pool"};
        if (hm_os_provider_create(NULL, &prov) != HM_SUCCESS ||
            hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &b.pool) !=
                HM_SUCCESS) {
            fprintf(stderr, "bench_replay: cannot create the native pool\n");
            return 1;
        }
        bad |= replay(label, t, &b, allow_unknown);
        hm_pool_destroy(b.pool);
    }
    if (!strcmp(which, "malloc") || !strcmp(which, "all")) {
        backend_t b = {.name = "malloc"};
        bad |= replay(label, t, &b, allow_unknown);
    }
    return bad;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_replay [--backend pool|malloc|all] [--no-check] "
                    "[--allow-unknown] [--metric] TRACE...\n       bench_replay --quick\n");
}

int main(int argc, char **argv) {
    const char *which = "all";
    int quick = 0, allow_unknown = 0, bad = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--no-check")) g_check = 0;
        else if (!strcmp(argv[i], "--metric")) g_metric = 1;
        else if (!strcmp(argv[i], "--allow-unknown")) allow_unknown = 1;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else if (argv[i][0] == '-') {
            usage();
            return 2;
        } else {
            files++;
        }
    }
    if (strcmp(which, "pool") && strcmp(which, "malloc") && strcmp(which, "all")) {
        usage();
        return 2;
    }
    if (quick) {
        trace_t t;
        if (quick_trace(&t)) return 1;
        bad |= run_all("built-in", &t, which, 0);
        trace_fini(&t);
    }
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') {
            if (!strcmp(argv[i], "--backend")) i++;
            continue;
        }
        trace_t t;
        if (trace_load(argv[i], &t)) return 1;
        bad |= run_all(argv[i], &t, which, allow_unknown);
        trace_fini(&t);
    }
    if (!quick && !files) {
        usage();
        return 2;
    }
    return bad ? 1 : 0;
}
