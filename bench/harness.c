/* hetmem benchmarks — the harness (see harness.h).
 * SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum { ST_OK = 0, ST_FAILED = 1, ST_SKIPPED = 2 };

typedef struct result {
    char case_name[96];
    char impl[48];
    int subject;          /* 1 for the subject row of its case */
    int status;           /* ST_* */
    uint64_t ops_per_iter;
    uint64_t iters;       /* per measurement */
    int repeats;          /* measurements taken */
    double median, min, max; /* ns/op */
    double cpus;          /* (user+sys) / wall over this row's measurements */
    double wall;          /* seconds spent in this row's measurements */
    double ratio;         /* subject median / this median; NAN where none */
} result_t;

struct hm_bench {
    const char *suite;
    int repeats;
    double min_time;
    const char *csv;
    const char *filter;
    int threads;
    int trace; /* HM_BENCH_TRACE set: one line per timed run on stderr */
    int failed;
    result_t *res;
    size_t n, cap;
    double wall0, cpu0;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time (user + system) of the whole process so far. */
static double cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [--repeats R] [--min-time S] [--csv FILE] [--filter TEXT] [--quick]\n"
            "  --repeats R    measurements per implementation and case (default 7)\n"
            "  --min-time S   seconds per measurement, at least (default 0.05)\n"
            "  --csv FILE     also write the results as CSV\n"
            "  --filter TEXT  only the cases whose name contains TEXT\n"
            "  --quick        1 repeat of about 1 ms (a smoke test)\n",
            prog);
}

int hm_bench_trace_on(void) {
    const char *e = getenv("HM_BENCH_TRACE");
    return e && *e && strcmp(e, "0");
}

hm_bench_t *hm_bench_create(const char *suite, int *argc, char **argv, int *exit_code) {
    *exit_code = 0;
    hm_bench_t *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "bench: out of memory\n");
        *exit_code = 1;
        return NULL;
    }
    b->suite = suite;
    b->repeats = 7;
    b->min_time = 0.05;
    b->threads = 1;
    b->trace = hm_bench_trace_on();
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char *val = (i + 1 < *argc) ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, argv[0]);
            free(b);
            return NULL;
        } else if (!strcmp(a, "--quick")) {
            b->repeats = 1;
            b->min_time = 0.001;
        } else if (!strcmp(a, "--repeats") && val) {
            char *end;
            long r = strtol(val, &end, 10);
            if (*end || r < 1 || r > 1000) goto bad;
            b->repeats = (int)r;
            i++;
        } else if (!strcmp(a, "--min-time") && val) {
            char *end;
            double t = strtod(val, &end);
            if (*end || !(t > 0.0) || t > 60.0) goto bad;
            b->min_time = t;
            i++;
        } else if (!strcmp(a, "--csv") && val) {
            b->csv = val;
            i++;
        } else if (!strcmp(a, "--filter") && val) {
            b->filter = val;
            i++;
        } else if (!strncmp(a, "--", 2)) {
            goto bad;
        } else {
            argv[out++] = argv[i]; /* not ours: left for the program */
        }
        continue;
    bad:
        fprintf(stderr, "%s: bad option or value: %s%s%s\n", argv[0], a, val ? " " : "",
                val ? val : "");
        usage(stderr, argv[0]);
        free(b);
        *exit_code = 2;
        return NULL;
    }
    *argc = out;
    argv[out] = NULL;
    b->wall0 = now_s();
    b->cpu0 = cpu_s();
    return b;
}

void hm_bench_set_threads(hm_bench_t *b, int threads) { b->threads = threads > 0 ? threads : 1; }

static result_t *new_result(hm_bench_t *b, const char *case_name, const hm_bench_impl_t *impl,
                            int subject, uint64_t ops_per_iter) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 32;
        result_t *r = realloc(b->res, cap * sizeof *r);
        if (!r) return NULL;
        b->res = r;
        b->cap = cap;
    }
    result_t *r = &b->res[b->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->case_name, sizeof r->case_name, "%s", case_name);
    snprintf(r->impl, sizeof r->impl, "%s", impl->name ? impl->name : "?");
    r->subject = subject;
    r->ops_per_iter = ops_per_iter ? ops_per_iter : 1;
    r->median = r->min = r->max = r->cpus = r->ratio = NAN;
    return r;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One implementation's state during a case. */
typedef struct slot {
    const hm_bench_impl_t *impl;
    void *ctx;
    result_t *res;
    double *samples; /* ns/op, one per repeat */
    double cpu, wall;
    int set_up;      /* setup() succeeded: teardown() is owed */
    int live;        /* set up and not failed */
    int recalibrations; /* made by the measurement loop */
} slot_t;

/* Most recalibrations per implementation and case (see the measurement loop). */
#define RECALIBRATIONS 2

/* Time `iters` iterations. -1 if the workload failed. what: "calib" or
 * "measure", for the trace (a workload's own trace lines, e.g. the remote
 * ones in workloads.c, come before the line of their run). */
static double timed_run(hm_bench_t *b, slot_t *s, const void *arg, uint64_t iters, double *cpu,
                        const char *what) {
    double c0 = cpu_s(), t0 = now_s();
    int rc = s->impl->run(s->ctx, arg, iters);
    double t = now_s() - t0;
    *cpu = cpu_s() - c0;
    if (b->trace)
        fprintf(stderr, "bench trace: %s / %s: %s %llu iters %.6f s cpu %.6f s at %.6f\n",
                s->res->case_name, s->res->impl, what, (unsigned long long)iters, t, *cpu, t0);
    return rc ? -1.0 : t;
}

/* Double the iteration count (or jump by the estimate) until one run lasts
 * min_time; this also warms the implementation up. Starts at 1 iteration,
 * or, with t0 >= 0, goes on from a run of iters0 iterations that took t0 s
 * (the measurement loop's recalibration, below). */
static int calibrate(hm_bench_t *b, slot_t *s, const void *arg, uint64_t iters0, double t0) {
    uint64_t iters = t0 >= 0 ? iters0 : 1;
    double t = t0;
    for (;;) {
        if (t < 0) {
            double cpu;
            t = timed_run(b, s, arg, iters, &cpu, "calib");
            if (t < 0) return -1;
        }
        if (t >= b->min_time || iters >= (UINT64_C(1) << 40)) break;
        uint64_t next = iters * 2;
        if (t > 1e-6) {
            double est = (double)iters * b->min_time / t * 1.1;
            if (est > (double)next) next = est > (double)iters * 100 ? iters * 100 : (uint64_t)est;
        } else {
            next = iters * 10;
        }
        iters = next;
        t = -1.0;
    }
    s->res->iters = iters;
    return 0;
}

int hm_bench_case(hm_bench_t *b, const char *case_name, const void *arg, uint64_t ops_per_iter,
                  const hm_bench_impl_t *subject, const hm_bench_impl_t *baselines,
                  size_t n_baselines) {
    if (b->filter && !strstr(case_name, b->filter)) return 0;
    size_t n = 1 + n_baselines;
    slot_t *slots = calloc(n, sizeof *slots);
    double *samples = calloc(n * (size_t)b->repeats, sizeof *samples);
    if (!slots || !samples) {
        free(slots);
        free(samples);
        fprintf(stderr, "bench: out of memory\n");
        b->failed = 1;
        return 1;
    }
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        slot_t *s = &slots[i];
        s->impl = i == 0 ? subject : &baselines[i - 1];
        s->samples = samples + i * (size_t)b->repeats;
        s->res = new_result(b, case_name, s->impl, i == 0, ops_per_iter);
        if (!s->res) {
            fprintf(stderr, "bench: out of memory\n");
            failed = 1;
            continue;
        }
        int rc = s->impl->setup ? s->impl->setup(arg, &s->ctx) : 0;
        if (rc == HM_BENCH_SKIP) {
            s->res->status = ST_SKIPPED;
            continue;
        }
        if (rc != 0 || !s->impl->run) {
            fprintf(stderr, "bench: %s / %s: set-up failed\n", case_name, s->res->impl);
            s->res->status = ST_FAILED;
            failed = 1;
            continue;
        }
        s->set_up = 1;
        s->live = 1;
        if (calibrate(b, s, arg, 0, -1.0) != 0) {
            fprintf(stderr, "bench: %s / %s: the workload failed\n", case_name, s->res->impl);
            s->res->status = ST_FAILED;
            s->live = 0;
            failed = 1;
        }
    }
    /* Interleaved measurements. */
    for (int r = 0; r < b->repeats; r++) {
        for (size_t i = 0; i < n; i++) {
            slot_t *s = &slots[i];
            if (!s->live) continue;
            double cpu;
            double t = timed_run(b, s, arg, s->res->iters, &cpu, "measure");
            /* A measurement under half of min_time: calibration stopped too
             * early, on a run slowed by something outside the workload, and
             * every repeat would measure mostly fixed costs (such as starting
             * threads). Recalibrate from this run (up to RECALIBRATIONS times
             * per implementation) and measure again; earlier samples lasted
             * at least min_time / 2 and are kept. Seen in bench_native under
             * LD_PRELOAD=libjemalloc.so.2 on a busy machine: the first
             * threads of a case spent up to 250 ms in jemalloc purging
             * (madvise, from their thread-exit destructor) the dirty pages the
             * previous case had freed, or waited for a CPU, over several
             * consecutive calibration runs; the case's first implementation
             * (the "native" subject of "remote 64B 1->3") stopped calibrating
             * at 2-1000 iterations and each repeat measured 0.3-700 us per
             * object instead of 20-200 ns. The interleaved rounds run long
             * after the calibrations, out of such a burst. */
            if (t >= 0 && t < 0.5 * b->min_time && s->recalibrations < RECALIBRATIONS &&
                s->res->iters < (UINT64_C(1) << 40)) {
                s->recalibrations++;
                if (calibrate(b, s, arg, s->res->iters, t) == 0)
                    t = timed_run(b, s, arg, s->res->iters, &cpu, "measure");
                else
                    t = -1.0;
            }
            if (t < 0) {
                fprintf(stderr, "bench: %s / %s: the workload failed\n", case_name, s->res->impl);
                s->res->status = ST_FAILED;
                s->live = 0;
                failed = 1;
                continue;
            }
            s->samples[r] = t * 1e9 / ((double)s->res->iters * (double)s->res->ops_per_iter);
            s->cpu += cpu;
            s->wall += t;
            s->res->repeats++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        slot_t *s = &slots[i];
        if (s->set_up && s->impl->teardown) s->impl->teardown(s->ctx);
        if (!s->live || s->res->repeats == 0) continue;
        int k = s->res->repeats;
        qsort(s->samples, (size_t)k, sizeof(double), cmp_double);
        s->res->min = s->samples[0];
        s->res->max = s->samples[k - 1];
        s->res->median = (k % 2) ? s->samples[k / 2]
                                 : 0.5 * (s->samples[k / 2 - 1] + s->samples[k / 2]);
        s->res->cpus = s->wall > 0 ? s->cpu / s->wall : NAN;
        s->res->wall = s->wall;
    }
    if (slots[0].res && slots[0].res->status == ST_OK && slots[0].res->repeats) {
        for (size_t i = 1; i < n; i++) {
            result_t *r = slots[i].res;
            if (r && r->status == ST_OK && r->repeats && r->median > 0)
                r->ratio = slots[0].res->median / r->median;
        }
    }
    free(samples);
    free(slots);
    if (failed) b->failed = 1;
    return failed;
}

static const char *status_name(int st) {
    return st == ST_OK ? "ok" : st == ST_SKIPPED ? "skipped" : "failed";
}

void hm_bench_csv_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void hm_bench_csv_num(FILE *f, double x) {
    if (isnan(x))
        fputs(",", f);
    else
        fprintf(f, ",%.4f", x);
}

static int write_csv(const hm_bench_t *b, double run_cpus) {
    FILE *f = fopen(b->csv, "w");
    if (!f) {
        fprintf(stderr, "bench: cannot write %s: %s\n", b->csv, strerror(errno));
        return -1;
    }
    fprintf(f, "suite,case,impl,role,status,ops_per_iter,iters,repeats,median_ns_per_op,"
               "min_ns_per_op,max_ns_per_op,effective_cpus,subject_over_impl,run_effective_cpus\n");
    for (size_t i = 0; i < b->n; i++) {
        const result_t *r = &b->res[i];
        hm_bench_csv_str(f, b->suite);
        fputc(',', f);
        hm_bench_csv_str(f, r->case_name);
        fputc(',', f);
        hm_bench_csv_str(f, r->impl);
        fprintf(f, ",%s,%s,%llu,%llu,%d", r->subject ? "subject" : "baseline",
                status_name(r->status), (unsigned long long)r->ops_per_iter,
                (unsigned long long)r->iters, r->repeats);
        hm_bench_csv_num(f, r->median);
        hm_bench_csv_num(f, r->min);
        hm_bench_csv_num(f, r->max);
        hm_bench_csv_num(f, r->cpus);
        hm_bench_csv_num(f, r->ratio);
        hm_bench_csv_num(f, run_cpus);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "bench: writing %s: %s\n", b->csv, strerror(errno));
        return -1;
    }
    return 0;
}

int hm_bench_finish(hm_bench_t *b) {
    double wall = now_s() - b->wall0, cpu = cpu_s() - b->cpu0;
    double run_cpus = wall > 0 ? cpu / wall : NAN;
    const double starved = 0.8 * b->threads;
    int any_starved = 0;

    printf("bench %s: median of %d measurement%s of >= %.3f s each, interleaved\n", b->suite,
           b->repeats, b->repeats == 1 ? "" : "s", b->min_time);
    int cw = 4, iw = 4; /* column widths: the longest case and implementation names */
    for (size_t i = 0; i < b->n; i++) {
        int lc = (int)strlen(b->res[i].case_name), li = (int)strlen(b->res[i].impl);
        if (lc > cw) cw = lc;
        if (li > iw) iw = li;
    }
    printf("%-*s  %-*s %12s %12s %12s %6s %12s\n", cw, "case", iw, "impl", "ns/op", "min", "max",
           "cpus", "subject/impl");
    const char *prev = "";
    for (size_t i = 0; i < b->n; i++) {
        const result_t *r = &b->res[i];
        const char *cname = strcmp(prev, r->case_name) ? r->case_name : "";
        prev = r->case_name;
        if (r->status != ST_OK || r->repeats == 0) {
            printf("%-*s  %-*s %12s\n", cw, cname, iw, r->impl, status_name(r->status));
            continue;
        }
        char ratio[32] = "";
        if (!isnan(r->ratio)) snprintf(ratio, sizeof ratio, "%.3fx", r->ratio);
        /* Below ~20 ms of measuring, getrusage's accounting is too coarse to judge. */
        int low = !isnan(r->cpus) && r->cpus < starved && r->wall >= 0.02;
        any_starved |= low;
        printf("%-*s  %-*s %12.1f %12.1f %12.1f %5.2f%s %12s\n", cw, cname, iw, r->impl,
               r->median, r->min, r->max, r->cpus, low ? "*" : " ", ratio);
    }
    printf("subject/impl: the subject's median over this implementation's (< 1: the subject is "
           "faster)\n");
    if (any_starved)
        printf("* fewer effective CPUs than the %d thread%s the workload uses: the run was "
               "starved of CPU, or the workload slept or blocked; treat those figures with care\n",
               b->threads, b->threads == 1 ? "" : "s");
    printf("effective CPUs of the run: %.2f (cpu %.2f s / wall %.2f s; %ld online)\n", run_cpus,
           cpu, wall, sysconf(_SC_NPROCESSORS_ONLN));
    if (b->csv) {
        if (write_csv(b, run_cpus) == 0)
            printf("CSV written to %s\n", b->csv);
        else
            b->failed = 1;
    }
    fflush(stdout);
    int rc = b->failed ? 1 : 0;
    free(b->res);
    free(b);
    return rc;
}
