/* hetmem benchmark: neighbour exchange and set-up through libhetmem_mpi,
 * against MPI's shared-memory windows and MPI_Sendrecv, under mpirun.
 * SPDX-License-Identifier: MIT
 *
 * The ranks form a ring (left = rank - 1, right = rank + 1, mod size); every
 * rank must run on one node (otherwise the program skips, 77). Rank 0 prints.
 *
 * Cases:
 *   exchange S        one step of a neighbour exchange of S bytes (1 KiB ..
 *                     16 MiB), microseconds per step:
 *     hetmem          each rank's buffer is an allocation of a native pool
 *                     over the OS provider in shared (memfd) mode, shared
 *                     once with hm_mpi_share(MPI_COMM_WORLD); a step is a
 *                     memcpy of the left neighbour's buffer, read through
 *                     the mapping hm_mpi_shared_peer gives, into a private
 *                     receive buffer, then MPI_Barrier (so that no rank
 *                     rewrites its buffer while a neighbour reads it).
 *     window          one MPI_Win_allocate_shared window of S bytes per rank
 *                     on the node communicator (with the hint
 *                     alloc_shared_noncontig, which lets MPI place each
 *                     rank's segment on its own), the left neighbour's
 *                     base from MPI_Win_shared_query, MPI_Win_lock_all once;
 *                     a step is the same memcpy and the same MPI_Barrier.
 *                     Neither variant calls a fence in the step: the source
 *                     buffers do not change while timed. A program whose
 *                     buffers change between steps adds MPI_Win_sync
 *                     (window; the MPI memory model asks for it) or an
 *                     atomic_thread_fence (hetmem) before the barrier; on
 *                     x86-64 both are one full fence.
 *     sendrecv        MPI_Sendrecv of S bytes from a private buffer to the
 *                     right into the receive buffer from the left.
 *   barrier           MPI_Barrier alone: the synchronisation in the first two.
 *   set-up            sharing N buffers of 64 KiB (N = 64), microseconds per
 *                     buffer:
 *     hetmem share    N hm_mpi_share calls, one buffer each (the buffers
 *                     allocated and written before), against "window": N
 *                     MPI_Win_allocate_shared + MPI_Win_shared_query.
 *     hetmem cycle    hm_pool_malloc + hm_mpi_share + hm_mpi_unshare +
 *                     hm_pool_free per buffer, against "window": allocate +
 *                     query + MPI_Win_free.
 * Every variant's data is checked once per case and size before it is timed
 * (each rank's received bytes are its left neighbour's pattern); a mismatch
 * fails the run.
 *
 * How it is measured: all ranks start a measurement together (MPI_Barrier),
 * each times its loop with MPI_Wtime, and a measurement's time is the
 * slowest rank's. An exchange variant's step count is calibrated first
 * (grown until a measurement lasts --min-time; every rank gets the same
 * count), one untimed step precedes each measurement, and R measurements
 * (--repeats) are made per variant, interleaved (hetmem, window, sendrecv,
 * then window, sendrecv, hetmem, ...: each first in turn) so that drift and
 * order hit them alike; the table shows the median, min and max over the R.
 * The set-up cases make R measurements of N buffers each, interleaved
 * likewise, after one untimed round of each.
 * "cpus": CPU time (user + system, getrusage) summed over the ranks over
 * the wall time of the same measurements: the effective CPU count, at most
 * the number of ranks (one thread each; MPI polls while it waits, so a rank
 * that waits in a barrier still counts). Below 0.8 x ranks (marked '*') the
 * ranks shared cores: with more ranks than cores (mpirun --oversubscribe)
 * every figure includes time a rank spent descheduled. The last line gives
 * the same figure for the whole run.
 *
 * Options: --repeats R (default 7), --min-time S (default 0.05),
 * --quick (1 repeat of ~1 ms, 1 and 16 KiB, 8 buffers: the CTest smoke
 * run), --csv FILE, --help. */
#include <hetmem/mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define SETUP_SIZE (64 * KIB)
#define MAX_REPEATS 1000

static MPI_Comm world = MPI_COMM_WORLD;
static int g_rank, g_size, g_left, g_right;
static int g_repeats = 7, g_quick, g_nbuf = 64;
static double g_min_time = 0.05;
static const char *g_csv;

static double cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static inline void escape(const void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }

static unsigned char pat(int rank, size_t i) {
    return (unsigned char)(rank * 131 + i * 7 + (i >> 12) + 1);
}
static void fill(unsigned char *p, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) p[i] = pat(rank, i);
}
static size_t mismatches(const unsigned char *p, size_t n, int rank) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += p[i] != pat(rank, i);
    return bad;
}
/* Collective: whether any rank saw a non-zero count. */
static int any(size_t n) {
    unsigned long long mine = n, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, world);
    return all != 0;
}

/* ---- results ---- */

typedef struct result {
    char case_name[40], impl[24];
    int subject, failed;
    size_t bytes;         /* per op, for GB/s; 0: none */
    double med, min, max; /* microseconds per op */
    double cpus, wall;    /* summed CPU over summed wall; wall in s */
    double ratio;         /* subject's median over this one's (NAN for the subject) */
} result_t;

static result_t g_res[64];
static int g_nres, g_failed;

static double median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Measurements of one implementation in one case, as they come. */
typedef struct series {
    double us[MAX_REPEATS];
    int n;
    double cpu, wall;
} series_t;

static void series_add(series_t *s, double wall, double cpu, double ops) {
    if (s->n < MAX_REPEATS) s->us[s->n++] = wall / ops * 1e6;
    s->wall += wall;
    s->cpu += cpu;
}

/* Record a case: names[0] is the subject. failed[i]: it did not run. */
static void record(const char *case_name, size_t bytes, const char *const *names,
                   series_t *ser, const int *failed, int n) {
    double subj = NAN;
    for (int i = 0; i < n && g_nres < (int)(sizeof g_res / sizeof g_res[0]); i++) {
        result_t *r = &g_res[g_nres++];
        memset(r, 0, sizeof *r);
        snprintf(r->case_name, sizeof r->case_name, "%s", case_name);
        snprintf(r->impl, sizeof r->impl, "%s", names[i]);
        r->subject = i == 0;
        r->bytes = bytes;
        r->failed = failed[i] || ser[i].n == 0;
        r->ratio = NAN;
        if (r->failed) continue;
        double v[MAX_REPEATS];
        memcpy(v, ser[i].us, (size_t)ser[i].n * sizeof(double));
        r->med = median(v, ser[i].n);
        r->min = v[0];
        r->max = v[ser[i].n - 1];
        r->wall = ser[i].wall;
        r->cpus = ser[i].wall > 0 ? ser[i].cpu / ser[i].wall : NAN;
        if (i == 0) subj = r->med;
        else r->ratio = subj / r->med;
    }
}

/* One measurement's result on every rank: the slowest rank's wall time and
 * the CPU time of all ranks. */
static void reduce(double wall, double cpu, double *wall_max, double *cpu_sum) {
    MPI_Allreduce(&wall, wall_max, 1, MPI_DOUBLE, MPI_MAX, world);
    MPI_Allreduce(&cpu, cpu_sum, 1, MPI_DOUBLE, MPI_SUM, world);
}

/* ---- the exchange ---- */

typedef struct xch {
    size_t size;
    unsigned char *rbuf; /* private receive buffer, written before */
    unsigned char *sbuf; /* Sendrecv's private send buffer */
    hm_pool_t *pool;
    unsigned char *hbuf; /* this rank's hetmem buffer */
    hm_mpi_shared_t *sh;
    const unsigned char *hleft; /* the left neighbour's, mapped here */
    MPI_Comm node;
    MPI_Win win;
    unsigned char *wbuf; /* this rank's window segment */
    const unsigned char *wleft;
} xch_t;

typedef void (*step_fn)(xch_t *x);

static void step_hetmem(xch_t *x) {
    memcpy(x->rbuf, x->hleft, x->size);
    escape(x->rbuf);
    MPI_Barrier(world);
}
static void step_window(xch_t *x) {
    memcpy(x->rbuf, x->wleft, x->size);
    escape(x->rbuf);
    MPI_Barrier(world);
}
static void step_sendrecv(xch_t *x) {
    MPI_Sendrecv(x->sbuf, (int)x->size, MPI_BYTE, g_right, 7, x->rbuf, (int)x->size, MPI_BYTE,
                 g_left, 7, world, MPI_STATUS_IGNORE);
}
static void step_barrier(xch_t *x) {
    (void)x;
    MPI_Barrier(world);
}

/* One measurement of iters steps (after one untimed step). */
static void measure(step_fn f, xch_t *x, uint64_t iters, double *wall, double *cpu) {
    f(x);
    MPI_Barrier(world);
    double c0 = cpu_s(), t0 = MPI_Wtime();
    for (uint64_t i = 0; i < iters; i++) f(x);
    double t1 = MPI_Wtime(), c1 = cpu_s();
    reduce(t1 - t0, c1 - c0, wall, cpu);
}

/* Steps per measurement: grown until one lasts min_time (the same count on
 * every rank: the times are reduced). */
static uint64_t calibrate(step_fn f, xch_t *x) {
    uint64_t iters = 1;
    for (;;) {
        double w, c;
        measure(f, x, iters, &w, &c);
        if (w >= g_min_time || iters >= ((uint64_t)1 << 30)) return iters;
        double grow = w > 0 ? 1.25 * g_min_time / w : 16;
        grow = grow < 2 ? 2 : grow > 16 ? 16 : grow;
        iters = (uint64_t)ceil((double)iters * grow);
    }
}

/* Collective: the data of one step of f is the left neighbour's pattern. */
static int verify(step_fn f, xch_t *x) {
    memset(x->rbuf, 0, x->size);
    MPI_Barrier(world);
    f(x);
    return !any(mismatches(x->rbuf, x->size, g_left));
}

static hm_pool_t *shared_pool(void) {
    hm_os_params_t *p;
    hm_provider_t *prov;
    hm_pool_t *pool = NULL;
    if (hm_os_params_create(&p) != HM_SUCCESS) return NULL;
    hm_os_params_set_visibility(p, HM_OS_SHARED);
    if (hm_os_provider_create(p, &prov) == HM_SUCCESS &&
        hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) {
        hm_provider_destroy(prov);
        pool = NULL;
    }
    hm_os_params_destroy(p);
    return pool;
}

/* Collective: the three variants' buffers for size S. Non-zero: hetmem's or
 * the window's part failed (on every rank alike). */
static int xch_setup(xch_t *x, size_t size, int *h_ok, int *w_ok) {
    x->size = size;
    /* hetmem */
    x->hbuf = hm_pool_malloc(x->pool, size);
    if (x->hbuf) fill(x->hbuf, size, g_rank);
    hm_result_t r = hm_mpi_share(world, x->pool, x->hbuf, &x->sh);
    *h_ok = r == HM_SUCCESS;
    if (*h_ok) x->hleft = hm_mpi_shared_peer(x->sh, g_left);
    else if (g_rank == 0)
        fprintf(stderr, "bench_mpi: hm_mpi_share of %zu bytes: %s\n", size, hm_result_string(r));
    *h_ok = *h_ok && !any(x->hleft == NULL);
    /* the window */
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    int wr = MPI_Win_allocate_shared((MPI_Aint)size, 1, info, x->node, &x->wbuf, &x->win);
    MPI_Info_free(&info);
    *w_ok = wr == MPI_SUCCESS;
    if (*w_ok) {
        MPI_Aint wsize;
        int disp;
        void *base = NULL;
        fill(x->wbuf, size, g_rank);
        MPI_Win_shared_query(x->win, g_left, &wsize, &disp, &base);
        x->wleft = base;
        MPI_Win_lock_all(MPI_MODE_NOCHECK, x->win);
        *w_ok = !any(x->wleft == NULL || (size_t)wsize < size);
    }
    fill(x->sbuf, size, g_rank);
    return !*h_ok || !*w_ok;
}

static void xch_teardown(xch_t *x, int h_ok, int w_ok) {
    if (x->sh) hm_mpi_unshare(x->sh);
    x->sh = NULL;
    if (x->hbuf) hm_pool_free(x->pool, x->hbuf);
    x->hbuf = NULL;
    if (w_ok) MPI_Win_unlock_all(x->win);
    if (x->win != MPI_WIN_NULL) MPI_Win_free(&x->win);
    (void)h_ok;
}

static void bench_exchange(xch_t *x, size_t size) {
    static const char *const names[3] = {"hetmem", "window", "sendrecv"};
    const step_fn fns[3] = {step_hetmem, step_window, step_sendrecv};
    int failed[3] = {0, 0, 0}, h_ok, w_ok;
    series_t *ser = calloc(3, sizeof(series_t));
    uint64_t iters[3] = {0, 0, 0};
    char name[40];
    if (size >= MIB) snprintf(name, sizeof name, "exchange %zu MiB", size / MIB);
    else snprintf(name, sizeof name, "exchange %zu KiB", size / KIB);

    xch_setup(x, size, &h_ok, &w_ok);
    failed[0] = !h_ok;
    failed[1] = !w_ok;
    for (int i = 0; i < 3; i++) {
        if (failed[i]) continue;
        if (!verify(fns[i], x)) {
            if (g_rank == 0)
                fprintf(stderr, "bench_mpi: %s / %s: the received bytes are wrong\n", name,
                        names[i]);
            failed[i] = 1;
        }
    }
    for (int i = 0; i < 3; i++) g_failed |= failed[i];
    for (int i = 0; i < 3; i++)
        if (!failed[i]) iters[i] = calibrate(fns[i], x);
    for (int rep = 0; rep < g_repeats; rep++)
        for (int k = 0; k < 3; k++) {
            int i = (rep + k) % 3; /* each variant first in turn: no order bias */
            if (failed[i]) continue;
            double w, c;
            measure(fns[i], x, iters[i], &w, &c);
            series_add(&ser[i], w, c, (double)iters[i]);
        }
    record(name, size, names, ser, failed, 3);
    xch_teardown(x, h_ok, w_ok);
    free(ser);
}

static void bench_barrier(xch_t *x) {
    static const char *const names[1] = {"mpi"};
    series_t *ser = calloc(1, sizeof(series_t));
    int failed[1] = {0};
    uint64_t iters = calibrate(step_barrier, x);
    for (int rep = 0; rep < g_repeats; rep++) {
        double w, c;
        measure(step_barrier, x, iters, &w, &c);
        series_add(&ser[0], w, c, (double)iters);
    }
    record("barrier", 0, names, ser, failed, 1);
    free(ser);
}

/* ---- set-up: sharing N buffers ---- */

typedef struct setup_times {
    double share, cycle;         /* wall, slowest rank */
    double share_cpu, cycle_cpu; /* summed over ranks */
} setup_times_t;

/* One round of hetmem: N buffers allocated, shared, checked (untimed),
 * unshared, freed. Returns 0, or non-zero (every rank alike) on failure. */
static int round_hetmem(hm_pool_t *pool, int n, setup_times_t *t) {
    unsigned char **buf = calloc((size_t)n, sizeof(void *));
    hm_mpi_shared_t **sh = calloc((size_t)n, sizeof(void *));
    size_t bad = 0;
    MPI_Barrier(world);
    double c0 = cpu_s(), t0 = MPI_Wtime();
    for (int i = 0; i < n; i++) bad += !(buf[i] = hm_pool_malloc(pool, SETUP_SIZE));
    double c1 = cpu_s(), t1 = MPI_Wtime();
    /* The pattern is written outside the timed parts: a window's
     * allocation does not write its memory either. */
    for (int i = 0; i < n; i++)
        if (buf[i]) fill(buf[i], SETUP_SIZE, g_rank + i);
    MPI_Barrier(world);
    double c2 = cpu_s(), t2 = MPI_Wtime();
    for (int i = 0; i < n; i++)
        if (hm_mpi_share(world, pool, buf[i], &sh[i]) != HM_SUCCESS) bad++;
    double c3 = cpu_s(), t3 = MPI_Wtime();
    for (int i = 0; i < n; i++) {
        const unsigned char *p = sh[i] ? hm_mpi_shared_peer(sh[i], g_left) : NULL;
        bad += p ? mismatches(p, SETUP_SIZE, g_left + i) : 1;
    }
    MPI_Barrier(world);
    double c4 = cpu_s(), t4 = MPI_Wtime();
    for (int i = 0; i < n; i++)
        if (sh[i] && hm_mpi_unshare(sh[i]) != HM_SUCCESS) bad++;
    for (int i = 0; i < n; i++)
        if (buf[i]) hm_pool_free(pool, buf[i]);
    double c5 = cpu_s(), t5 = MPI_Wtime();
    reduce(t3 - t2, c3 - c2, &t->share, &t->share_cpu);
    reduce((t1 - t0) + (t3 - t2) + (t5 - t4), (c1 - c0) + (c3 - c2) + (c5 - c4), &t->cycle,
           &t->cycle_cpu);
    free(buf);
    free(sh);
    return any(bad);
}

/* One round of windows: N windows allocated and queried, checked
 * (untimed), freed. */
static int round_window(MPI_Comm node, int n, setup_times_t *t) {
    MPI_Win *win = calloc((size_t)n, sizeof(MPI_Win));
    unsigned char **mine = calloc((size_t)n, sizeof(void *));
    const unsigned char **left = calloc((size_t)n, sizeof(void *));
    size_t bad = 0;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    MPI_Barrier(world);
    double c0 = cpu_s(), t0 = MPI_Wtime();
    for (int i = 0; i < n; i++) {
        win[i] = MPI_WIN_NULL;
        if (MPI_Win_allocate_shared((MPI_Aint)SETUP_SIZE, 1, info, node, &mine[i], &win[i]) !=
            MPI_SUCCESS) {
            bad++;
            continue;
        }
        MPI_Aint sz;
        int disp;
        void *base = NULL;
        MPI_Win_shared_query(win[i], g_left, &sz, &disp, &base);
        left[i] = base;
    }
    double c1 = cpu_s(), t1 = MPI_Wtime();
    for (int i = 0; i < n; i++)
        if (mine[i]) fill(mine[i], SETUP_SIZE, g_rank + i);
    MPI_Barrier(world);
    for (int i = 0; i < n; i++)
        bad += left[i] ? mismatches(left[i], SETUP_SIZE, g_left + i) : 1;
    MPI_Barrier(world);
    double c2 = cpu_s(), t2 = MPI_Wtime();
    for (int i = 0; i < n; i++)
        if (win[i] != MPI_WIN_NULL) MPI_Win_free(&win[i]);
    double c3 = cpu_s(), t3 = MPI_Wtime();
    MPI_Info_free(&info);
    reduce(t1 - t0, c1 - c0, &t->share, &t->share_cpu);
    reduce((t1 - t0) + (t3 - t2), (c1 - c0) + (c3 - c2), &t->cycle, &t->cycle_cpu);
    free(win);
    free(mine);
    free(left);
    return any(bad);
}

static void bench_setup(hm_pool_t *pool, MPI_Comm node) {
    static const char *const share_names[2] = {"hetmem share", "window"};
    static const char *const cycle_names[2] = {"hetmem cycle", "window"};
    series_t *share = calloc(2, sizeof(series_t)), *cycle = calloc(2, sizeof(series_t));
    int failed[2] = {0, 0};
    setup_times_t t;
    /* One untimed round each: the first share probes the transport, the
     * first window sets up MPI's shared-memory component. */
    failed[0] = round_hetmem(pool, 2, &t);
    failed[1] = round_window(node, 2, &t);
    for (int rep = 0; rep < g_repeats; rep++)
        for (int k = 0; k < 2; k++) {
            int i = (rep + k) % 2;
            if (failed[i]) continue;
            failed[i] = i ? round_window(node, g_nbuf, &t) : round_hetmem(pool, g_nbuf, &t);
            series_add(&share[i], t.share, t.share_cpu, g_nbuf);
            series_add(&cycle[i], t.cycle, t.cycle_cpu, g_nbuf);
        }
    if (g_rank == 0)
        for (int i = 0; i < 2; i++)
            if (failed[i])
                fprintf(stderr, "bench_mpi: set-up / %s: a call failed or the bytes are wrong\n",
                        i ? "window" : "hetmem");
    g_failed |= failed[0] | failed[1];
    char name[40];
    snprintf(name, sizeof name, "set-up %d x %zu KiB", g_nbuf, SETUP_SIZE / KIB);
    record(name, 0, share_names, share, failed, 2);
    snprintf(name, sizeof name, "set-up+release %d x %zu KiB", g_nbuf, SETUP_SIZE / KIB);
    record(name, 0, cycle_names, cycle, failed, 2);
    free(share);
    free(cycle);
}

/* ---- output ---- */

static void print_table(double run_cpu, double run_wall) {
    int cw = 4, iw = 4;
    for (int i = 0; i < g_nres; i++) {
        int lc = (int)strlen(g_res[i].case_name), li = (int)strlen(g_res[i].impl);
        if (lc > cw) cw = lc;
        if (li > iw) iw = li;
    }
    printf("bench mpi: %d ranks, ring; median of %d measurement%s of >= %.3f s each (set-up: "
           "%d buffers each), interleaved; times are the slowest rank's\n",
           g_size, g_repeats, g_repeats == 1 ? "" : "s", g_min_time, g_nbuf);
    printf("%-*s  %-*s %12s %12s %12s %9s %6s %12s\n", cw, "case", iw, "impl", "us/op", "min",
           "max", "GB/s/rank", "cpus", "subject/impl");
    const char *prev = "";
    int any_starved = 0;
    for (int i = 0; i < g_nres; i++) {
        const result_t *r = &g_res[i];
        const char *cname = strcmp(prev, r->case_name) ? r->case_name : "";
        prev = r->case_name;
        if (r->failed) {
            printf("%-*s  %-*s %12s\n", cw, cname, iw, r->impl, "failed");
            continue;
        }
        char ratio[32] = "", bw[32] = "";
        if (!isnan(r->ratio)) snprintf(ratio, sizeof ratio, "%.3fx", r->ratio);
        if (r->bytes) snprintf(bw, sizeof bw, "%.2f", (double)r->bytes / (r->med * 1e3));
        int low = !isnan(r->cpus) && r->cpus < 0.8 * g_size && r->wall >= 0.02;
        any_starved |= low;
        printf("%-*s  %-*s %12.2f %12.2f %12.2f %9s %5.2f%s %12s\n", cw, cname, iw, r->impl,
               r->med, r->min, r->max, bw, r->cpus, low ? "*" : " ", ratio);
    }
    printf("subject/impl: the subject's (first row's) median over this implementation's (< 1: "
           "hetmem is faster)\n");
    if (any_starved)
        printf("* fewer effective CPUs than the %d ranks: ranks shared cores (more ranks than "
               "cores, or other load); treat those figures with care\n",
               g_size);
    printf("effective CPUs of the run: %.2f of %d ranks (cpu %.2f s summed over ranks / wall "
           "%.2f s; %ld online)\n",
           run_wall > 0 ? run_cpu / run_wall : NAN, g_size, run_cpu, run_wall,
           sysconf(_SC_NPROCESSORS_ONLN));
}

/* The targets, judged on the medians. */
static void print_targets(void) {
    double worst = 0;
    const char *worst_case = NULL;
    int n = 0;
    for (int i = 0; i + 1 < g_nres; i++) {
        const result_t *h = &g_res[i], *w = &g_res[i + 1];
        if (strncmp(h->case_name, "exchange", 8) || !h->subject || h->failed || w->failed ||
            strcmp(w->impl, "window"))
            continue;
        n++;
        if (w->ratio > worst) {
            worst = w->ratio;
            worst_case = h->case_name;
        }
    }
    if (n)
        printf("target exchange hetmem/window <= 1.10x at every size: %s (worst %.3fx, %s)\n",
               worst <= 1.10 ? "met" : "NOT met", worst, worst_case);
    for (int i = 0; i + 1 < g_nres; i++) {
        const result_t *h = &g_res[i], *w = &g_res[i + 1];
        if (strcmp(h->impl, "hetmem share") || h->failed || w->failed) continue;
        printf("target set-up per buffer >= 10x cheaper than a window: %s (%.2f us vs %.2f us: "
               "%.1fx cheaper)\n",
               w->med >= 10 * h->med ? "met" : "NOT met", h->med, w->med, w->med / h->med);
    }
}

static int write_csv(double run_cpus) {
    FILE *f = fopen(g_csv, "w");
    if (!f) {
        perror(g_csv);
        return 1;
    }
    fprintf(f, "suite,case,impl,role,status,ranks,repeats,median_us_per_op,min_us,max_us,"
               "cpus,subject_over_impl,run_cpus\n");
    for (int i = 0; i < g_nres; i++) {
        const result_t *r = &g_res[i];
        fprintf(f, "mpi,%s,%s,%s,%s,%d,%d,%.4f,%.4f,%.4f,%.3f,%.4f,%.3f\n", r->case_name,
                r->impl, r->subject ? "subject" : "baseline", r->failed ? "failed" : "ok",
                g_size, g_repeats, r->med, r->min, r->max, r->cpus, r->ratio, run_cpus);
    }
    return fclose(f) != 0;
}

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: mpirun -np N %s [--repeats R] [--min-time S] [--csv FILE] [--quick]\n"
            "  --repeats R    measurements per implementation and case (default 7)\n"
            "  --min-time S   seconds per exchange measurement, at least (default 0.05)\n"
            "  --csv FILE     also write the results as CSV (rank 0)\n"
            "  --quick        1 repeat of about 1 ms, 1 and 16 KiB, 8 buffers (a smoke test)\n",
            prog);
}

/* Returns -1 to go on, else the exit code. */
static int parse(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            g_quick = 1;
        } else if (!strcmp(a, "--repeats") && v) {
            g_repeats = atoi(v);
            i++;
        } else if (!strcmp(a, "--min-time") && v) {
            g_min_time = atof(v);
            i++;
        } else if (!strcmp(a, "--csv") && v) {
            g_csv = v;
            i++;
        } else if (!strcmp(a, "--help")) {
            if (g_rank == 0) usage(stdout, argv[0]);
            return 0;
        } else {
            if (g_rank == 0) {
                fprintf(stderr, "%s: bad option or value: %s\n", argv[0], a);
                usage(stderr, argv[0]);
            }
            return 2;
        }
    }
    if (g_quick) {
        g_repeats = 1;
        g_min_time = 0.001;
        g_nbuf = 8;
    }
    if (g_repeats < 1 || g_repeats > MAX_REPEATS || !(g_min_time > 0)) {
        if (g_rank == 0) fprintf(stderr, "%s: --repeats 1..%d, --min-time > 0\n", argv[0],
                                 MAX_REPEATS);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    double run_c0 = cpu_s(), run_t0 = MPI_Wtime();
    MPI_Comm_rank(world, &g_rank);
    MPI_Comm_size(world, &g_size);
    g_left = (g_rank + g_size - 1) % g_size;
    g_right = (g_rank + 1) % g_size;
    int rc = parse(argc, argv);
    if (rc >= 0) {
        MPI_Finalize();
        return rc;
    }

    xch_t x = {.node = MPI_COMM_NULL, .win = MPI_WIN_NULL};
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &x.node);
    int node_size = 0;
    MPI_Comm_size(x.node, &node_size);
    if (any(node_size != g_size)) {
        if (g_rank == 0)
            fprintf(stderr, "bench_mpi: every rank must run on one node (skipped)\n");
        MPI_Comm_free(&x.node);
        MPI_Finalize();
        return 77;
    }
    static const size_t sizes[] = {1 * KIB, 16 * KIB, 256 * KIB, 4 * MIB, 16 * MIB};
    const int nsizes = g_quick ? 2 : (int)(sizeof sizes / sizeof sizes[0]);
    const size_t max = sizes[nsizes - 1];
    x.rbuf = aligned_alloc(4096, max);
    x.sbuf = aligned_alloc(4096, max);
    x.pool = shared_pool();
    if (any(!x.rbuf || !x.sbuf || !x.pool)) {
        if (g_rank == 0) fprintf(stderr, "bench_mpi: set-up failed (memory or the pool)\n");
        MPI_Abort(world, 1);
    }
    memset(x.rbuf, 0, max); /* the private buffers are resident before any timing */
    memset(x.sbuf, 0, max);

    for (int i = 0; i < nsizes; i++) bench_exchange(&x, sizes[i]);
    bench_barrier(&x);
    bench_setup(x.pool, x.node);

    double run_wall = MPI_Wtime() - run_t0, run_cpu = cpu_s() - run_c0, wall_max, cpu_sum;
    reduce(run_wall, run_cpu, &wall_max, &cpu_sum);
    if (g_rank == 0) {
        print_table(cpu_sum, wall_max);
        print_targets();
        if (g_csv) {
            if (write_csv(cpu_sum / wall_max) == 0) printf("CSV written to %s\n", g_csv);
            else g_failed = 1;
        }
        fflush(stdout);
    }
    hm_pool_destroy(x.pool);
    free(x.rbuf);
    free(x.sbuf);
    MPI_Comm_free(&x.node);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
