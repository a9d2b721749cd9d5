/* A bounded single-producer single-consumer ring of pointers, for the
 * programs that move blocks between threads. SPDX-License-Identifier: MIT */
#ifndef HM_BENCH_PROG_RING_H
#define HM_BENCH_PROG_RING_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#define PROG_RING_CAP 4096 /* power of two */

typedef struct prog_ring {
    _Alignas(64) _Atomic uint64_t head; /* next slot to read (consumer) */
    _Alignas(64) _Atomic uint64_t tail; /* next slot to write (producer) */
    _Alignas(64) void *slot[PROG_RING_CAP];
} prog_ring_t;

/* 0: full. */
static inline int prog_ring_put(prog_ring_t *r, void *p) {
    uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (t - atomic_load_explicit(&r->head, memory_order_acquire) == PROG_RING_CAP) return 0;
    r->slot[t & (PROG_RING_CAP - 1)] = p;
    atomic_store_explicit(&r->tail, t + 1, memory_order_release);
    return 1;
}

/* NULL: empty. */
static inline void *prog_ring_get(prog_ring_t *r) {
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (h == atomic_load_explicit(&r->tail, memory_order_acquire)) return NULL;
    void *p = r->slot[h & (PROG_RING_CAP - 1)];
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
    return p;
}

/* Waiting for the other side: spin a little, then give the CPU away (the
 * machine may have fewer CPUs than threads). */
static inline void prog_wait(unsigned *spins) {
    if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        return;
    }
    *spins = 0;
    sched_yield();
}

#endif
