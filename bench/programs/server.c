/* bench_prog_server: a server pattern where most blocks are freed by a
 * thread other than the one that allocated them. The threads form a ring:
 * each one makes requests (16 to 2048 bytes, skewed small) and hands each
 * to the next thread, which reads and frees it; making a request also
 * uses a short-lived buffer of its own (16 to 256 bytes, freed at once).
 * A thread whose outgoing queue is full serves its incoming one meanwhile.
 * --threads N (default 2), --ops requests per thread (default 5*10^6).
 * SPDX-License-Identifier: MIT */
#include "prog.h"
#include "ring.h"

typedef struct arg {
    uint64_t ops, seed;
    prog_ring_t *in, *out;
} arg_t;

static int serve(prog_ring_t *in, uint64_t *got) {
    void *p = prog_ring_get(in);
    if (!p) return 0;
    volatile unsigned char *c = p;
    c[0]++;
    free(p);
    ++*got;
    return 1;
}

static void *work(void *v) {
    arg_t *a = v;
    prog_rng_t r;
    prog_rng_init(&r, a->seed);
    uint64_t got = 0;
    unsigned spins = 0;
    for (uint64_t i = 0; i < a->ops; i++) {
        size_t n = prog_small_size(&r, 16, 2048);
        void *req = prog_xmalloc(n);
        prog_touch(req, n, i);
        size_t m = prog_small_size(&r, 16, 256);
        void *tmp = prog_xmalloc(m);
        prog_touch(tmp, m, i);
        free(tmp);
        while (!prog_ring_put(a->out, req))
            if (!serve(a->in, &got)) prog_wait(&spins);
        for (int k = 0; k < 2 && serve(a->in, &got); k++) {
        }
    }
    while (got < a->ops)
        if (!serve(a->in, &got)) prog_wait(&spins);
    return NULL;
}

int main(int argc, char **argv) {
    prog_opts_t o = {.threads = 2, .ops = 5000000, .seed = 1};
    prog_parse(argc, argv, &o, "threads in a ring: each frees the requests its neighbour made");
    prog_ring_t *rings = aligned_alloc(64, o.threads * sizeof(prog_ring_t));
    arg_t *a = prog_xmalloc(o.threads * sizeof(*a));
    if (!rings) return 1;
    memset(rings, 0, o.threads * sizeof(prog_ring_t));
    for (unsigned i = 0; i < o.threads; i++)
        a[i] = (arg_t){o.ops, o.seed + i, &rings[i], &rings[(i + 1) % o.threads]};
    prog_run_threads(o.threads, work, a, sizeof(*a));
    free(a);
    free(rings);
    return 0;
}
