/* bench_prog_lifo: many small short-lived objects freed in reverse order,
 * as a big-number program's temporaries are: each operation makes 1 to 12
 * nested temporaries (16 to 160 bytes, skewed small), writes them, frees
 * them innermost first, and keeps one result (16 to 64 bytes) among the
 * last 256. --threads N (default 1), --ops operations per thread (default
 * 3*10^6). SPDX-License-Identifier: MIT */
#include "prog.h"

#define DEPTH 12
#define KEEP 256

static void *work(void *v) {
    prog_arg_t *a = v;
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    void *keep[KEEP] = {0};
    void *t[DEPTH];
    for (uint64_t i = 0; i < a->ops; i++) {
        unsigned d = 1 + prog_below(&r, DEPTH);
        for (unsigned k = 0; k < d; k++) {
            size_t n = prog_small_size(&r, 16, 160);
            t[k] = prog_xmalloc(n);
            prog_touch(t[k], n, k);
        }
        while (d) free(t[--d]);
        unsigned s = (unsigned)(i & (KEEP - 1));
        free(keep[s]);
        size_t n = 16 + prog_below(&r, 49);
        keep[s] = prog_xmalloc(n);
        prog_touch(keep[s], n, i);
    }
    for (unsigned k = 0; k < KEEP; k++) free(keep[k]);
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 1, .ops = 3000000, .seed = 1};
    prog_parse(argc, argv, &o, "nested small temporaries freed LIFO");
    return prog_run_alike(&o, work);
}
