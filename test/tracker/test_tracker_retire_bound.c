/* hetmem tests — the tracker's retired memory stays bounded.
 * SPDX-License-Identifier: MIT
 *
 * Removed records and replaced page lists are freed after a grace period by
 * urcu's call_rcu helper; a writer that outruns the helper must reclaim
 * itself (back-pressure), so retired memory never exceeds the tracker's
 * bound whatever the scheduling.
 *
 * 1. Stalled reclamation: a reader thread sits inside a read-side section,
 *    so no grace period can end (a reader preempted in its section, on a
 *    machine that is busy, is the same for the helper). A writer churns a
 *    fixed number of insert/remove pairs of sub-granule ranges (each frees a
 *    record and copies a page list). Without the bound it finishes with all
 *    of it retired (hundreds of MiB); with it, a writer's batch finds the
 *    queue full and waits for a grace period of its own. The reader leaves
 *    its section once that happens (or once the writer is done), so the test
 *    is bounded by work, not by time.
 * 2. Churn beside lookups with every thread pinned to one CPU (urcu's
 *    helper, created by this process, inherits the pin): retired memory
 *    stays within the bound and each pair completes. */
#include "harness.h"
#include "internal.h"
#include "tracker/tracker.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <urcu/urcu-bp.h>

static hm_tracker_index_t idx;
static char pool_tag;
#define BASE 0x3e0000000000ull
#define PAIRS_STALLED 100000
#define PAIRS_PINNED 300000
#define LIVE 300
/* What the tracker promises, independent of what it reports: at most a few
 * MiB retired (2 MiB queued, 16 shards of 64 KiB plus one object each). */
#define RETIRED_BOUND ((size_t)4 << 20)

static _Atomic int writer_done;
static _Atomic int reader_stop;
static _Atomic size_t seen_max; /* pending + shard bytes, sampled by the reader */

static size_t retired_now(void) {
    hm_tracker_retire_stats_t st;
    hm__tracker_retire_stats(&st);
    return st.pending_bytes + st.shard_bytes;
}

static void sample(void) {
    size_t v = retired_now(), m = atomic_load(&seen_max);
    while (v > m && !atomic_compare_exchange_weak(&seen_max, &m, v))
        ;
}

static void pause_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* Insert LIVE ranges of 50 bytes 100 bytes apart (41 share each 4 KiB
 * granule's page list), remove them, `pairs` times in all. */
static int churn(uintptr_t base, long pairs) {
    int bad = 0;
    for (long done = 0; done < pairs;) {
        for (int k = 0; k < LIVE; k++)
            if (hm__tracker_insert(&idx, (hm_pool_t *)(void *)&pool_tag, NULL, base + k * 100, 50, 0,
                                   NULL))
                bad++;
        for (int k = 0; k < LIVE; k++)
            if (hm__tracker_remove(base + k * 100, 50)) bad++;
        done += LIVE;
    }
    return bad;
}

static void *stalled_writer(void *arg) {
    (void)arg;
    long bad = churn(BASE, PAIRS_STALLED);
    atomic_store(&writer_done, 1);
    return (void *)bad;
}

static void test_stalled_reclamation(void) {
    hm_tracker_retire_stats_t st0, st1;
    hm__tracker_flush();
    hm__tracker_retire_stats(&st0);
    atomic_store(&seen_max, 0);

    urcu_bp_read_lock(); /* no grace period ends until we leave */
    pthread_t w;
    REQUIRE(!pthread_create(&w, NULL, stalled_writer, NULL));
    for (;;) {
        sample();
        hm_tracker_retire_stats_t st;
        hm__tracker_retire_stats(&st);
        if (atomic_load(&writer_done) || st.sync_reclaims > st0.sync_reclaims) break;
        pause_us(100);
    }
    sample();
    urcu_bp_read_unlock();
    void *bad = NULL;
    pthread_join(w, &bad);
    CHECK_EQ((long)bad, 0);

    hm__tracker_retire_stats(&st1);
    CHECK_MSG(st1.sync_reclaims > st0.sync_reclaims,
              "a writer that filled the queue while grace periods were stalled waited for one "
              "(sync reclaims %llu -> %llu)",
              (unsigned long long)st0.sync_reclaims, (unsigned long long)st1.sync_reclaims);
    CHECK_MSG(st1.pending_peak <= st1.pending_limit, "queued %zu bytes, bound %zu",
              st1.pending_peak, st1.pending_limit);
    CHECK_MSG(atomic_load(&seen_max) <= RETIRED_BOUND, "retired %zu bytes while stalled, bound %zu",
              atomic_load(&seen_max), RETIRED_BOUND);
    hm__tracker_flush();
    hm__tracker_retire_stats(&st1);
    CHECK_EQ(st1.pending_bytes, 0);
    CHECK_EQ(st1.shard_bytes, 0);
}

static int g_cpu = -1;
static void pin_self(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(g_cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
}

static void *pinned_reader(void *arg) {
    (void)arg;
    pin_self();
    unsigned i = 0;
    while (!atomic_load_explicit(&reader_stop, memory_order_relaxed)) {
        hm__tracker_lookup((const void *)(BASE + (1ull << 30) + (i++ % LIVE) * 100), NULL);
        if ((i & 0xffff) == 0) sample();
    }
    return NULL;
}

static void test_pinned_churn(void) {
    cpu_set_t set;
    REQUIRE(!sched_getaffinity(0, sizeof set, &set));
    for (int c = 0; c < CPU_SETSIZE && g_cpu < 0; c++)
        if (CPU_ISSET(c, &set)) g_cpu = c;
    REQUIRE(g_cpu >= 0);
    cpu_set_t old = set;
    pin_self();
    atomic_store(&seen_max, 0);
    pthread_t r;
    REQUIRE(!pthread_create(&r, NULL, pinned_reader, NULL));
    CHECK_EQ(churn(BASE + (1ull << 30), PAIRS_PINNED), 0);
    atomic_store(&reader_stop, 1);
    pthread_join(r, NULL);
    sched_setaffinity(0, sizeof old, &old);

    hm_tracker_retire_stats_t st;
    hm__tracker_retire_stats(&st);
    CHECK_MSG(st.pending_peak <= st.pending_limit, "queued %zu bytes, bound %zu", st.pending_peak,
              st.pending_limit);
    CHECK_MSG(atomic_load(&seen_max) <= RETIRED_BOUND, "retired %zu bytes pinned, bound %zu",
              atomic_load(&seen_max), RETIRED_BOUND);
}

int main(void) {
    hm__init();
    hm__tracker_index_init(&idx);
    test_stalled_reclamation();
    test_pinned_churn();
    hm__tracker_index_drain(&idx, NULL, NULL);
    hm__tracker_index_fini(&idx);
    hm__tracker_flush();
    return hm_test_finish();
}
