/* Whole-program allocation workloads: the shared part (options, random
 * numbers, threads). Each bench_prog_<name> is a plain C program on the
 * process's malloc family, to be run as is or under LD_PRELOAD of any
 * malloc; it does a fixed amount of work, prints nothing and exits 0 (1
 * on an allocation failure, 2 on a usage error).
 * SPDX-License-Identifier: MIT
 *
 * Options (every program): --threads N (worker threads; what a thread is
 * depends on the program), --ops N (operations per thread), --seed N. */
#ifndef HM_BENCH_PROG_H
#define HM_BENCH_PROG_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct prog_opts {
    unsigned threads;
    uint64_t ops;
    uint64_t seed;
} prog_opts_t;

/* Parse argv into o (defaults in o on entry); exits 2 on a bad option. */
static inline void prog_parse(int argc, char **argv, prog_opts_t *o, const char *usage) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: %s [--threads N] [--ops N] [--seed N]\n%s\n", argv[0], usage);
            exit(0);
        }
        if (i + 1 >= argc) goto bad;
        char *end;
        unsigned long long v = strtoull(argv[i + 1], &end, 0);
        if (*end || end == argv[i + 1]) goto bad;
        if (!strcmp(a, "--threads") && v >= 1 && v <= 1024) o->threads = (unsigned)v;
        else if (!strcmp(a, "--ops")) o->ops = v;
        else if (!strcmp(a, "--seed")) o->seed = v;
        else goto bad;
        i++;
    }
    return;
bad:
    fprintf(stderr, "%s: bad option (--help lists them)\n", argv[0]);
    exit(2);
}

/* xorshift64* (Vigna 2016): a fast generator whose cost does not swamp the
 * allocator's. */
typedef struct prog_rng {
    uint64_t s;
} prog_rng_t;

static inline void prog_rng_init(prog_rng_t *r, uint64_t seed) {
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!r->s) r->s = 1;
}
static inline uint64_t prog_rand(prog_rng_t *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}
/* Uniform in [0, n), n < 2^32 (Lemire's multiply-shift, no division). */
static inline uint32_t prog_below(prog_rng_t *r, uint32_t n) {
    return (uint32_t)(((prog_rand(r) >> 32) * (uint64_t)n) >> 32);
}

/* A size in [lo, hi] skewed towards small ones, as most programs' are: the
 * lower bound of two uniform draws. */
static inline size_t prog_small_size(prog_rng_t *r, uint32_t lo, uint32_t hi) {
    uint32_t a = prog_below(r, hi - lo + 1), b = prog_below(r, hi - lo + 1);
    return lo + (a < b ? a : b);
}

/* Write the block as a program does (its first and last words), so that a
 * free list kept in the blocks pays for its misses as the program would. */
static inline void prog_touch(void *p, size_t n, uint64_t v) {
    volatile unsigned char *c = p;
    c[0] = (unsigned char)v;
    c[n - 1] = (unsigned char)(v >> 8);
}

static inline void *prog_xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Run fn(i, arg) on n threads, 0 .. n-1 (thread 0 is a new thread too, so
 * that every worker is alike), and join them. */
static inline void prog_run_threads(unsigned n, void *(*fn)(void *), void *args,
                                    size_t arg_size) {
    pthread_t *t = prog_xmalloc(n * sizeof(*t));
    for (unsigned i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * arg_size)) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    for (unsigned i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(t);
}

/* The per-thread arguments of a program whose threads are alike: the
 * operations to do and the thread's own seed (o->seed + its index). */
typedef struct prog_arg {
    uint64_t ops, seed;
} prog_arg_t;

/* Run fn on o->threads threads, each given its prog_arg_t; returns main's 0. */
static inline int prog_run_alike(const prog_opts_t *o, void *(*fn)(void *)) {
    prog_arg_t *a = prog_xmalloc(o->threads * sizeof(*a));
    for (unsigned i = 0; i < o->threads; i++) a[i] = (prog_arg_t){o->ops, o->seed + i};
    prog_run_threads(o->threads, fn, a, sizeof(*a));
    free(a);
    return 0;
}

#endif
