/* bench_prog_tight: a tight loop of malloc and free of random small sizes
 * (1 to 512 bytes, uniform): each block is written and freed at once.
 * --threads N threads each do --ops pairs (default 1 thread, 2*10^7).
 * SPDX-License-Identifier: MIT */
#include "prog.h"

static void *work(void *v) {
    prog_arg_t *a = v;
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    for (uint64_t i = 0; i < a->ops; i++) {
        size_t n = 1 + prog_below(&r, 512);
        void *p = prog_xmalloc(n);
        prog_touch(p, n, i);
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 1, .ops = 20000000, .seed = 1};
    prog_parse(argc, argv, &o, "malloc+free of random sizes 1..512, freed at once");
    return prog_run_alike(&o, work);
}
