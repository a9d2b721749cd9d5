/* bench_prog_workset: every thread keeps a working set of 20000 live blocks
 * of random sizes (8 to 2048 bytes, skewed small) and replaces a random one
 * per operation (free, then malloc of a new size): random frees over many
 * slabs. --threads N (default 2), --ops replacements per thread (default
 * 10^7). SPDX-License-Identifier: MIT */
#include "prog.h"

#define LIVE 20000

static void *work(void *v) {
    prog_arg_t *a = v;
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    void **s = prog_xmalloc(LIVE * sizeof(*s));
    for (unsigned k = 0; k < LIVE; k++) {
        size_t n = prog_small_size(&r, 8, 2048);
        s[k] = prog_xmalloc(n);
        prog_touch(s[k], n, k);
    }
    for (uint64_t i = 0; i < a->ops; i++) {
        uint32_t k = prog_below(&r, LIVE);
        free(s[k]);
        size_t n = prog_small_size(&r, 8, 2048);
        s[k] = prog_xmalloc(n);
        prog_touch(s[k], n, i);
    }
    for (unsigned k = 0; k < LIVE; k++) free(s[k]);
    free(s);
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 2, .ops = 10000000, .seed = 1};
    prog_parse(argc, argv, &o, "per-thread working set of 20000 random blocks 8..2048");
    return prog_run_alike(&o, work);
}
