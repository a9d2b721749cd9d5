/* bench_prog_mixed: mixed small sizes (8 to 256 bytes, skewed small) and
 * lifetimes, as a logic minimiser's terms and cubes: per operation, half
 * the time a temporary freed at once, else a block that replaces the
 * oldest of the last 2048 (35%), a random one of 30000 long-lived ones
 * (10%), or a vector grown by realloc from 64 bytes to up to 8 KiB and
 * freed (5%). --threads N (default 1), --ops operations per thread
 * (default 10^7). SPDX-License-Identifier: MIT */
#include "prog.h"

#define MEDIUM 2048
#define LONG 30000

static void *work(void *v) {
    prog_arg_t *a = v;
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    void **med = calloc(MEDIUM, sizeof(void *)), **lng = calloc(LONG, sizeof(void *));
    if (!med || !lng) exit(1);
    unsigned mi = 0;
    for (uint64_t i = 0; i < a->ops; i++) {
        uint32_t k = prog_below(&r, 100);
        size_t n = prog_small_size(&r, 8, 256);
        if (k < 50) {
            void *p = prog_xmalloc(n);
            prog_touch(p, n, i);
            free(p);
        } else if (k < 85) {
            free(med[mi]);
            med[mi] = prog_xmalloc(n);
            prog_touch(med[mi], n, i);
            mi = (mi + 1) & (MEDIUM - 1);
        } else if (k < 95) {
            uint32_t j = prog_below(&r, LONG);
            free(lng[j]);
            lng[j] = prog_xmalloc(n);
            prog_touch(lng[j], n, i);
        } else {
            size_t cap = 64, end = 64u << prog_below(&r, 8);
            char *vec = prog_xmalloc(cap);
            prog_touch(vec, cap, i);
            while (cap < end) {
                cap *= 2;
                char *nv = realloc(vec, cap);
                if (!nv) exit(1);
                vec = nv;
                prog_touch(vec, cap, i);
            }
            free(vec);
        }
    }
    for (unsigned j = 0; j < MEDIUM; j++) free(med[j]);
    for (unsigned j = 0; j < LONG; j++) free(lng[j]);
    free(med);
    free(lng);
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 1, .ops = 10000000, .seed = 1};
    prog_parse(argc, argv, &o, "mixed small sizes and lifetimes, some realloc growth");
    return prog_run_alike(&o, work);
}
