/* bench_prog_own: every thread allocates and frees its own blocks of random
 * sizes (1 to 1024 bytes, skewed small), each living for the next 15
 * allocations of its thread (a window of 16): short-lived objects, no block
 * crosses threads. --threads N (default 2), --ops allocations per thread
 * (default 10^7). SPDX-License-Identifier: MIT */
#include "prog.h"

#define WINDOW 16

static void *work(void *v) {
    prog_arg_t *a = v;
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    void *w[WINDOW] = {0};
    for (uint64_t i = 0; i < a->ops; i++) {
        unsigned k = (unsigned)(i & (WINDOW - 1));
        free(w[k]);
        size_t n = prog_small_size(&r, 1, 1024);
        w[k] = prog_xmalloc(n);
        prog_touch(w[k], n, i);
    }
    for (unsigned k = 0; k < WINDOW; k++) free(w[k]);
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 2, .ops = 10000000, .seed = 1};
    prog_parse(argc, argv, &o, "per-thread short-lived blocks of random sizes 1..1024");
    return prog_run_alike(&o, work);
}
