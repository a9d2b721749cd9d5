/* hetmem benchmarks — the harness every benchmark program uses.
 * SPDX-License-Identifier: MIT
 *
 * A benchmark program declares cases. A case is one workload (e.g. "alloc+free
 * 4 KiB") run by a *subject* (the hetmem configuration under test) and by any
 * number of named *baselines* (glibc malloc, the provider called raw, jemalloc,
 * ...), all in the same run. For each case the harness
 *   1. sets every implementation up and calibrates it: the iteration count is
 *      doubled until one measurement lasts at least --min-time (a later
 *      measurement that takes under half of it means calibration stopped on
 *      a run slowed by something else: the implementation is recalibrated
 *      from there and that measurement made again, at most twice);
 *   2. measures R times (--repeats), interleaved: subject, baseline 1, ...,
 *      subject, baseline 1, ... so that drift (frequency, noisy neighbours)
 *      hits every implementation alike;
 *   3. keeps the median ns/op, the min and max, and the CPU time used while
 *      measuring (user+sys from getrusage) over the wall time: the effective
 *      CPU count of the measurement. A single-threaded workload should show
 *      ~1.0; a clearly lower figure means the run was starved of CPU (or the
 *      workload slept or blocked, e.g. waiting for a grace period) and its
 *      numbers are to be read with care. Rows below 0.8 x threads are marked
 *      with '*' (only after 20 ms of measuring: getrusage is coarse).
 * hm_bench_finish() prints the table (ns/op and the subject-over-baseline
 * ratio: < 1 means hetmem is faster), the effective CPU count of the whole
 * run, and writes the CSV given with --csv FILE.
 *
 * Command line (hm_bench_create parses and removes what it knows):
 *   --repeats R     measurements per implementation and case (default 7)
 *   --min-time S    seconds per measurement, at least (default 0.05)
 *   --csv FILE      also write the results as CSV
 *   --filter TEXT   only cases whose name contains TEXT
 *   --quick         1 repeat, 1 ms: a smoke test (used by CTest)
 *   --help
 * Environment: HM_BENCH_TRACE=1 prints one line per timed run on stderr
 * (calibration runs and measurements: iterations, wall and CPU
 * seconds, start time), plus what the workloads trace themselves.
 *
 * Not thread-safe: one benchmark thread drives the harness (a workload may
 * start threads of its own inside run()). */
#ifndef HM_BENCH_HARNESS_H
#define HM_BENCH_HARNESS_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* One implementation of a workload. */
typedef struct hm_bench_impl {
    const char *name; /* short, shown in the table: "hetmem", "glibc", "os-raw" */
    /* Optional: make *ctx for this case (arg is the case's arg). Non-zero: the
     * implementation is reported as failed (or skipped if it returns
     * HM_BENCH_SKIP) and not measured. */
    int (*setup)(const void *arg, void **ctx);
    /* Required: run the workload `iters` times. Non-zero: failure. */
    int (*run)(void *ctx, const void *arg, uint64_t iters);
    /* Optional: undo setup. */
    void (*teardown)(void *ctx);
} hm_bench_impl_t;

/* setup() may return this to say "not available here" (e.g. no GPU). */
#define HM_BENCH_SKIP 77

typedef struct hm_bench hm_bench_t;

/* Whether HM_BENCH_TRACE is set (and not "0"): the harness and the
 * workloads then trace on stderr. */
int hm_bench_trace_on(void);

/* suite: the program's name in the table and CSV ("alloc"). Parses argv
 * (argc/argv are updated to what is left). NULL after printing the usage
 * for --help or a bad option: main() should then return *exit_code. */
hm_bench_t *hm_bench_create(const char *suite, int *argc, char **argv, int *exit_code);

/* Threads the workloads use (default 1): the effective CPU count is judged
 * against it. */
void hm_bench_set_threads(hm_bench_t *b, int threads);

/* Run one case: the subject and each baseline. ops_per_iter: operations one
 * iteration performs (ns/op = time / (iters * ops_per_iter)). Returns 0, or
 * non-zero if an implementation failed (the run goes on). */
int hm_bench_case(hm_bench_t *b, const char *case_name, const void *arg, uint64_t ops_per_iter,
                  const hm_bench_impl_t *subject, const hm_bench_impl_t *baselines,
                  size_t n_baselines);

/* Print the table and the run's effective CPU count, write the CSV, free
 * everything. Returns the exit code for main(): 0, or 1 if anything failed. */
int hm_bench_finish(hm_bench_t *b);

/* CSV fields as the harness writes them: a quoted string (quotes doubled),
 * and ",x" with 4 decimals (",": NaN, no value). Also for programs with
 * tables of their own (bench_exec) that write the same columns. */
void hm_bench_csv_str(FILE *f, const char *s);
void hm_bench_csv_num(FILE *f, double x);

/* Keep the compiler from optimising a value (e.g. an allocation) away. */
static inline void hm_bench_escape(const void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }

#endif /* HM_BENCH_HARNESS_H */
