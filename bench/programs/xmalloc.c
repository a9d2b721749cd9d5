/* bench_prog_xmalloc: producer/consumer pairs (xmalloc-test style): each
 * producer allocates blocks (16 to 512 bytes, skewed small), writes them
 * and hands them to its consumer, which reads and frees them. --threads N
 * pairs (2N threads; default 2), --ops blocks per producer (default 10^7).
 * SPDX-License-Identifier: MIT */
#include "prog.h"
#include "ring.h"

typedef struct arg {
    uint64_t ops, seed;
    prog_ring_t *ring;
    int consumer;
} arg_t;

static void *work(void *v) {
    arg_t *a = v;
    unsigned spins = 0;
    if (a->consumer) {
        for (uint64_t got = 0; got < a->ops;) {
            void *p = prog_ring_get(a->ring);
            if (!p) {
                prog_wait(&spins);
                continue;
            }
            volatile unsigned char *c = p;
            c[0]++;
            free(p);
            got++;
        }
        return NULL;
    }
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    for (uint64_t i = 0; i < a->ops; i++) {
        size_t n = prog_small_size(&r, 16, 512);
        void *p = prog_xmalloc(n);
        prog_touch(p, n, i);
        while (!prog_ring_put(a->ring, p)) prog_wait(&spins);
    }
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 2, .ops = 10000000, .seed = 1};
    prog_parse(argc, argv, &o, "producer/consumer pairs: --threads pairs");
    prog_ring_t *rings = aligned_alloc(64, o.threads * sizeof(prog_ring_t));
    arg_t *a = prog_xmalloc(2 * o.threads * sizeof(*a));
    if (!rings) return 1;
    memset(rings, 0, o.threads * sizeof(prog_ring_t));
    for (unsigned i = 0; i < o.threads; i++) {
        a[2 * i] = (arg_t){o.ops, o.seed + i, &rings[i], 0};
        a[2 * i + 1] = (arg_t){o.ops, o.seed + i, &rings[i], 1};
    }
    prog_run_threads(2 * o.threads, work, a, sizeof(*a));
    free(a);
    free(rings);
    return 0;
}
