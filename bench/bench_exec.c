/* hetmem benchmarks — time whole programs under each allocator, interleaved.
 * SPDX-License-Identifier: MIT
 *
 *   bench_exec [--suite NAME] [--repeats R] [--warmup W] [--csv FILE] [--quiet]
 *              --alloc NAME=PRELOAD ...  --case NAME[@THREADS]=COMMAND ...
 *
 * Each --alloc names an allocator and the library put in LD_PRELOAD for it
 * (empty: none, the C library's malloc). The first --alloc is the subject,
 * the others its baselines. Each --case is a command run by /bin/sh -c in the
 * current directory; THREADS (default 1) is how many CPUs it can use, against
 * which its effective CPU count is judged.
 *
 * For every case the runner makes W unmeasured runs per allocator (the page
 * cache, the dynamic loader's caches), then R measured rounds; round r runs
 * the allocators in turn starting from the r-th, so that drift on a noisy
 * machine, and any advantage of going first or last, falls on all of them
 * alike. One run is fork, exec and wait4: its wall time (CLOCK_MONOTONIC),
 * its CPU time (user + sys of the program and its children, from wait4) and
 * its peak resident set. A program that prints a line
 *     HM_METRIC ns_per_op=X
 * on stdout (bench_replay --metric does) is measured by X instead of by its
 * wall time: the replayer's own loading is then not counted.
 *
 * Output: a table of medians (and min, max, effective CPUs, peak RSS, and
 * the subject's median over each allocator's: < 1 means the subject is
 * faster), then the effective CPU count of the whole run. --csv writes the
 * columns of bench/harness.c's CSV plus max_rss_kib; ns_per_op is then
 * nanoseconds per program run, or the program's own metric. Exits 1 when a
 * run fails (non-zero status or a signal; its output's tail is printed). */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_ALLOCS = 16, MAX_CASES = 128, TAIL = 2048 };

typedef struct alloc {
    const char *name, *preload; /* preload "" : none */
} alloc_t;

typedef struct kase {
    char *name;
    const char *cmd;
    int threads;
} kase_t;

typedef struct sample {
    double measure; /* ns (per run, or the program's metric) */
    int metric;     /* measure is the program's metric */
    double wall, cpu; /* s */
    long rss_kib;
} sample_t;

typedef struct result {
    int failed;
    int n;
    int metric; /* every measure is the program's metric (else ns per run) */
    double median, min, max, cpus;
    long rss_kib;
} result_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double tv_s(struct timeval tv) {
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* Appends what the child wrote to tail (the last TAIL bytes kept) and looks
 * for the metric line in each complete line. */
typedef struct output {
    char tail[TAIL + 1];
    size_t len;
    char line[512];
    size_t line_len;
    double metric; /* NAN: none */
} output_t;

static void out_line(output_t *o) {
    o->line[o->line_len] = '\0';
    const char *key = "HM_METRIC ns_per_op=";
    const char *p = strstr(o->line, key);
    if (p) {
        char *end;
        double x = strtod(p + strlen(key), &end);
        if (end != p + strlen(key) && isfinite(x) && x > 0) o->metric = x;
    }
    o->line_len = 0;
}

static void out_feed(output_t *o, const char *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') out_line(o);
        else if (o->line_len + 1 < sizeof o->line) o->line[o->line_len++] = buf[i];
    }
    if (n >= TAIL) {
        memcpy(o->tail, buf + n - TAIL, TAIL);
        o->len = TAIL;
    } else {
        if (o->len + n > TAIL) {
            size_t drop = o->len + n - TAIL;
            memmove(o->tail, o->tail + drop, o->len - drop);
            o->len -= drop;
        }
        memcpy(o->tail + o->len, buf, n);
        o->len += n;
    }
}

/* One run of cmd under a: 0 and *s filled, or -1 (its output's tail printed). */
static int run_once(const alloc_t *a, const kase_t *k, sample_t *s) {
    int fd[2];
    if (pipe2(fd, O_CLOEXEC)) {
        fprintf(stderr, "bench_exec: pipe: %s\n", strerror(errno));
        return -1;
    }
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_exec: fork: %s\n", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        if (a->preload[0]) setenv("LD_PRELOAD", a->preload, 1);
        else unsetenv("LD_PRELOAD");
        execl("/bin/sh", "sh", "-c", k->cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    output_t *o = calloc(1, sizeof *o);
    if (!o) {
        fprintf(stderr, "bench_exec: out of memory\n");
        close(fd[0]);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    o->metric = NAN;
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd[0], buf, sizeof buf);
        if (n > 0) out_feed(o, buf, (size_t)n);
        else if (n == 0 || errno != EINTR) break;
    }
    if (o->line_len) out_line(o);
    close(fd[0]);
    int status = 0;
    struct rusage ru;
    pid_t w;
    do w = wait4(pid, &status, 0, &ru);
    while (w < 0 && errno == EINTR);
    double wall = now_s() - t0;
    if (w < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        o->tail[o->len] = '\0';
        fprintf(stderr, "bench_exec: %s under %s: %s %d; its output ends:\n%s\n", k->name,
                a->name, w < 0 ? "wait failed" : WIFSIGNALED(status) ? "signal" : "exit status",
                w < 0 ? errno : WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                o->tail);
        free(o);
        return -1;
    }
    s->wall = wall;
    s->cpu = tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
    s->rss_kib = ru.ru_maxrss;
    s->measure = isnan(o->metric) ? wall * 1e9 : o->metric;
    s->metric = !isnan(o->metric);
    free(o);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_exec [--suite NAME] [--repeats R] [--warmup W] [--csv FILE] [--quiet]\n"
               "                  --alloc NAME=PRELOAD ... --case NAME[@THREADS]=COMMAND ...\n"
               "  the first --alloc is the subject; PRELOAD empty: no LD_PRELOAD (libc malloc)\n");
}

int main(int argc, char **argv) {
    alloc_t allocs[MAX_ALLOCS];
    kase_t cases[MAX_CASES];
    int na = 0, nc = 0, repeats = 5, warmup = 1, quiet = 0;
    const char *suite = "programs", *csv = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        char *eq = strchr(v, '=');
        if (!strcmp(a, "--suite")) suite = v;
        else if (!strcmp(a, "--csv")) csv = v;
        else if (!strcmp(a, "--repeats") && atoi(v) > 0) repeats = atoi(v);
        else if (!strcmp(a, "--warmup") && atoi(v) >= 0) warmup = atoi(v);
        else if (!strcmp(a, "--alloc") && eq && eq != v && na < MAX_ALLOCS) {
            *eq = '\0';
            allocs[na++] = (alloc_t){.name = v, .preload = eq + 1};
        } else if (!strcmp(a, "--case") && eq && eq != v && eq[1] && nc < MAX_CASES) {
            *eq = '\0';
            char *at = strchr(v, '@');
            int threads = 1;
            if (at) {
                *at = '\0';
                threads = atoi(at + 1);
                if (threads < 1) threads = 1;
            }
            cases[nc++] = (kase_t){.name = v, .cmd = eq + 1, .threads = threads};
        } else {
            fprintf(stderr, "bench_exec: bad option or value: %s %s\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    if (!na || !nc) {
        usage(stderr);
        return 2;
    }

    result_t *res = calloc((size_t)(na * nc), sizeof *res);
    sample_t *smp = calloc((size_t)(na * repeats), sizeof *smp);
    double *tmp = calloc((size_t)repeats, sizeof *tmp);
    if (!res || !smp || !tmp) {
        fprintf(stderr, "bench_exec: out of memory\n");
        return 1;
    }
    int failed = 0, progress = !quiet && isatty(2);
    double wall_all = 0, cpu_all = 0;
    for (int c = 0; c < nc; c++) {
        const kase_t *k = &cases[c];
        result_t *rc = &res[c * na];
        for (int w = 0; w < warmup; w++)
            for (int j = 0; j < na; j++) {
                sample_t s;
                if (!rc[j].failed && run_once(&allocs[j], k, &s)) rc[j].failed = 1;
            }
        for (int r = 0; r < repeats; r++) {
            for (int t = 0; t < na; t++) {
                int j = (r + t) % na;
                if (rc[j].failed) continue;
                sample_t *s = &smp[j * repeats + rc[j].n];
                if (run_once(&allocs[j], k, s)) {
                    rc[j].failed = 1;
                    continue;
                }
                rc[j].n++;
                wall_all += s->wall;
                cpu_all += s->cpu;
            }
            if (progress)
                fprintf(stderr, "bench_exec: %s: round %d/%d\r", k->name, r + 1, repeats);
        }
        if (progress) fprintf(stderr, "%*s\r", 60, "");
        for (int j = 0; j < na; j++) {
            result_t *x = &rc[j];
            if (x->failed) {
                failed = 1;
                continue;
            }
            double wall = 0, cpu = 0;
            long rss = 0;
            x->metric = 1;
            for (int i = 0; i < x->n; i++) {
                const sample_t *s = &smp[j * repeats + i];
                x->metric &= s->metric;
                tmp[i] = s->measure;
                wall += s->wall;
                cpu += s->cpu;
                if (s->rss_kib > rss) rss = s->rss_kib;
            }
            qsort(tmp, (size_t)x->n, sizeof *tmp, cmp_double);
            x->median = x->n % 2 ? tmp[x->n / 2] : 0.5 * (tmp[x->n / 2 - 1] + tmp[x->n / 2]);
            x->min = tmp[0];
            x->max = tmp[x->n - 1];
            x->cpus = wall > 0 ? cpu / wall : NAN;
            x->rss_kib = rss;
        }
    }

    /* The table. */
    int cw = 4, iw = 4;
    for (int c = 0; c < nc; c++)
        if ((int)strlen(cases[c].name) > cw) cw = (int)strlen(cases[c].name);
    for (int j = 0; j < na; j++)
        if ((int)strlen(allocs[j].name) > iw) iw = (int)strlen(allocs[j].name);
    printf("bench %s: median of %d run%s per allocator, interleaved (subject: %s)\n", suite,
           repeats, repeats == 1 ? "" : "s", allocs[0].name);
    printf("%-*s  %-*s %14s %14s %14s %6s %9s %12s\n", cw, "case", iw, "impl", "median", "min",
           "max", "cpus", "rss MiB", "subject/impl");
    for (int c = 0; c < nc; c++) {
        const result_t *rc = &res[c * na];
        for (int j = 0; j < na; j++) {
            const result_t *x = &rc[j];
            const char *cname = j ? "" : cases[c].name;
            if (x->failed) {
                printf("%-*s  %-*s %14s\n", cw, cname, iw, allocs[j].name, "failed");
                continue;
            }
            char ratio[32] = "";
            if (!rc[0].failed) snprintf(ratio, sizeof ratio, "%.3fx", rc[0].median / x->median);
            int low = x->cpus < 0.8 * cases[c].threads;
            /* ms per run, or the program's own ns per operation */
            double u = x->metric ? 1.0 : 1e-6;
            const char *unit = x->metric ? "ns" : "ms";
            printf("%-*s  %-*s %11.2f %s %11.2f %s %11.2f %s %5.2f%s %9.1f %12s\n", cw, cname, iw,
                   allocs[j].name, x->median * u, unit, x->min * u, unit, x->max * u, unit,
                   x->cpus, low ? "*" : " ", (double)x->rss_kib / 1024.0, ratio);
        }
    }
    double run_cpus = wall_all > 0 ? cpu_all / wall_all : NAN;
    printf("ms: per program run; ns: the program's own time per operation (HM_METRIC); "
           "subject/impl: the subject's median over this allocator's (< 1: the subject is "
           "faster); * fewer effective CPUs than the case's threads\n");
    printf("effective CPUs of the measured runs: %.2f (%ld online)\n", run_cpus,
           sysconf(_SC_NPROCESSORS_ONLN));

    if (csv) {
        FILE *f = fopen(csv, "w");
        if (!f) {
            fprintf(stderr, "bench_exec: cannot write %s: %s\n", csv, strerror(errno));
            return 1;
        }
        fprintf(f, "suite,case,impl,role,status,ops_per_iter,iters,repeats,median_ns_per_op,"
                   "min_ns_per_op,max_ns_per_op,effective_cpus,subject_over_impl,"
                   "run_effective_cpus,max_rss_kib\n");
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < na; j++) {
                const result_t *x = &res[c * na + j], *s0 = &res[c * na];
                hm_bench_csv_str(f, suite);
                fputc(',', f);
                hm_bench_csv_str(f, cases[c].name);
                fputc(',', f);
                hm_bench_csv_str(f, allocs[j].name);
                fprintf(f, ",%s,%s,1,1,%d", j ? "baseline" : "subject",
                        x->failed ? "failed" : "ok", x->n);
                if (x->failed) {
                    fputs(",,,,,", f);
                } else {
                    hm_bench_csv_num(f, x->median);
                    hm_bench_csv_num(f, x->min);
                    hm_bench_csv_num(f, x->max);
                    hm_bench_csv_num(f, x->cpus);
                    hm_bench_csv_num(f, s0->failed ? NAN : s0->median / x->median);
                }
                hm_bench_csv_num(f, run_cpus);
                fprintf(f, ",%ld\n", x->failed ? 0L : x->rss_kib);
            }
        if (fclose(f)) {
            fprintf(stderr, "bench_exec: writing %s: %s\n", csv, strerror(errno));
            return 1;
        }
        printf("CSV written to %s\n", csv);
    }
    free(res);
    free(smp);
    free(tmp);
    return failed;
}
