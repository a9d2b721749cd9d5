/* hetmem tests — the tracker under concurrency (run it under TSan too).
 * SPDX-License-Identifier: MIT
 *
 * Writers churn their own windows (insert/remove/split/merge of sub-page to
 * multi-GiB ranges) and keep a "stable" region split into pieces that they
 * split and merge at random points, so its bytes stay covered throughout; a
 * drainer fills and drains its own index; readers look up random addresses:
 * a byte of a stable region must always be found (split/merge are atomic for
 * lookups), and anything found must contain the address and belong to the
 * window's owner. At the end: ids are unique across threads. */
#include "harness.h"
#include "internal.h"
#include "tracker/tracker.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_WRITERS 2
#define N_READERS 2
#define MAX_PIECES 96
#define MAX_CHURN 64
#define MAX_IDS 400000

typedef struct piece {
    uintptr_t base;
    size_t size;
} piece_t;

typedef struct writer {
    int w;
    hm_tracker_index_t idx;
    uintptr_t stable_base;
    size_t stable_len;
    piece_t pieces[MAX_PIECES];
    int n_pieces;
    uintptr_t churn_base;
    size_t churn_len;
    piece_t churn[MAX_CHURN];
    int n_churn;
    uint64_t *ids;
    size_t n_ids;
    long ops, failures;
    uint64_t rng;
} writer_t;

static writer_t writers[N_WRITERS + 1]; /* the last one is the drainer */
static char pool_tag[N_WRITERS + 1];
static _Atomic int stop;       /* set when every writer has done its steps */
static _Atomic int writers_left = N_WRITERS;
static long g_steps;           /* stable+churn steps per writer: bounded work */
static _Atomic long reader_misses, reader_wrong, reader_lookups;
static _Atomic int ready;

static hm_pool_t *pool_of(int w) { return (hm_pool_t *)(void *)&pool_tag[w]; }

static uint64_t rnd(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}
static uint64_t below(uint64_t *s, uint64_t n) { return n ? rnd(s) % n : 0; }

static void add_id(writer_t *wr, uint64_t id) {
    if (wr->n_ids < MAX_IDS) wr->ids[wr->n_ids++] = id;
}

static void fail(writer_t *wr, const char *what, hm_result_t r) {
    if (wr->failures++ < 5) CHECK_MSG(0, "writer %d: %s -> %s", wr->w, what, hm_result_string(r));
}

static size_t split_point(uint64_t *s, size_t size) {
    switch (below(s, 4)) {
    case 0: return 1 + below(s, size - 1);
    case 1: return size > 8192 ? 4096 * (1 + below(s, size / 4096 - 1)) : size / 2;
    case 2: return size > (4u << 20) ? ((size_t)1 << 21) * (1 + below(s, (size >> 21) - 1)) : size / 2;
    default: return size > (2ull << 30) ? ((size_t)1 << 30) : size / 2;
    }
}

static void stable_step(writer_t *wr) {
    uint64_t *s = &wr->rng;
    if (wr->n_pieces < MAX_PIECES && (wr->n_pieces < 4 || below(s, 2))) {
        int i = (int)below(s, (uint64_t)wr->n_pieces);
        piece_t p = wr->pieces[i];
        if (p.size < 2) return;
        size_t first = split_point(s, p.size);
        if (first == 0 || first >= p.size) return;
        hm_result_t r = hm__tracker_split(p.base, p.size, first);
        if (r != HM_SUCCESS) return fail(wr, "stable split", r);
        hm_tracker_entry_t e;
        if (hm__tracker_lookup((const void *)(p.base + first), &e)) add_id(wr, e.id);
        memmove(&wr->pieces[i + 2], &wr->pieces[i + 1],
                (size_t)(wr->n_pieces - i - 1) * sizeof(piece_t));
        wr->pieces[i].size = first;
        wr->pieces[i + 1] = (piece_t){p.base + first, p.size - first};
        wr->n_pieces++;
    } else if (wr->n_pieces > 1) {
        int i = (int)below(s, (uint64_t)wr->n_pieces - 1);
        piece_t a = wr->pieces[i], b = wr->pieces[i + 1];
        hm_result_t r = hm__tracker_merge(a.base, b.base, a.size + b.size);
        if (r != HM_SUCCESS) return fail(wr, "stable merge", r);
        hm_tracker_entry_t e;
        if (hm__tracker_lookup((const void *)a.base, &e)) add_id(wr, e.id);
        wr->pieces[i].size = a.size + b.size;
        memmove(&wr->pieces[i + 1], &wr->pieces[i + 2],
                (size_t)(wr->n_pieces - i - 2) * sizeof(piece_t));
        wr->n_pieces--;
    }
}

static int churn_overlaps(writer_t *wr, uintptr_t base, size_t size) {
    for (int i = 0; i < wr->n_churn; i++)
        if (base < wr->churn[i].base + wr->churn[i].size && wr->churn[i].base < base + size)
            return 1;
    return 0;
}

static void churn_step(writer_t *wr) {
    uint64_t *s = &wr->rng;
    uint64_t op = below(s, 10);
    if (op < 4 && wr->n_churn < MAX_CHURN) {
        size_t size;
        switch (below(s, 3)) {
        case 0: size = 1 + below(s, 2000); break;
        case 1: size = 4096 * (1 + below(s, 600)); break;
        default: size = 1 + below(s, 8u << 20); break;
        }
        uintptr_t base = wr->churn_base + below(s, wr->churn_len - size);
        if (churn_overlaps(wr, base, size)) return;
        uint64_t id;
        hm_result_t r = hm__tracker_insert(&wr->idx, pool_of(wr->w), NULL, base, size, 0, &id);
        if (r != HM_SUCCESS) return fail(wr, "churn insert", r);
        add_id(wr, id);
        wr->churn[wr->n_churn++] = (piece_t){base, size};
    } else if (op < 7 && wr->n_churn) {
        int i = (int)below(s, (uint64_t)wr->n_churn);
        hm_result_t r = hm__tracker_remove(wr->churn[i].base, wr->churn[i].size);
        if (r != HM_SUCCESS) return fail(wr, "churn remove", r);
        wr->churn[i] = wr->churn[--wr->n_churn];
    } else if (wr->n_churn && wr->n_churn < MAX_CHURN) {
        int i = (int)below(s, (uint64_t)wr->n_churn);
        piece_t p = wr->churn[i];
        if (p.size < 2) return;
        size_t first = split_point(s, p.size);
        if (first == 0 || first >= p.size) return;
        hm_result_t r = hm__tracker_split(p.base, p.size, first);
        if (r != HM_SUCCESS) return fail(wr, "churn split", r);
        wr->churn[i].size = first;
        wr->churn[wr->n_churn++] = (piece_t){p.base + first, p.size - first};
        /* and merge them back half the time */
        if (below(s, 2)) {
            r = hm__tracker_merge(p.base, p.base + first, p.size);
            if (r != HM_SUCCESS) return fail(wr, "churn merge", r);
            wr->churn[i].size = p.size;
            wr->n_churn--;
        }
    }
}

static void *writer_main(void *arg) {
    writer_t *wr = arg;
    atomic_fetch_add(&ready, 1);
    for (long i = 0; i < g_steps; i++) {
        stable_step(wr);
        churn_step(wr);
        wr->ops += 2;
    }
    if (atomic_fetch_sub(&writers_left, 1) == 1) atomic_store(&stop, 1);
    return NULL;
}

/* Fills its index with small ranges and drains it, again and again. */
static size_t drained;
static void on_drain(void *arg, const hm_tracker_entry_t *e) {
    (void)arg;
    (void)e;
    drained++;
}
static void *drainer_main(void *arg) {
    writer_t *wr = arg;
    atomic_fetch_add(&ready, 1);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < 64; i++) {
            uint64_t id;
            uintptr_t base = wr->churn_base + (uintptr_t)i * 3000;
            hm_result_t r = hm__tracker_insert(&wr->idx, pool_of(wr->w), NULL, base, 2500, 0, &id);
            if (r != HM_SUCCESS)
                fail(wr, "drainer insert", r);
            else
                add_id(wr, id);
        }
        hm__tracker_index_drain(&wr->idx, on_drain, NULL);
        wr->ops++;
    }
    return NULL;
}

static void *reader_main(void *arg) {
    uint64_t s = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    long n = 0;
    atomic_fetch_add(&ready, 1);
    /* at least 3000 lookups, however late this thread starts */
    while (n < 3000 || !atomic_load_explicit(&stop, memory_order_relaxed)) {
        int w = (int)below(&s, N_WRITERS + 1);
        const writer_t *wr = &writers[w];
        hm_tracker_entry_t e;
        if (w < N_WRITERS) {
            /* stable: must be found, always */
            uintptr_t a = wr->stable_base + below(&s, wr->stable_len);
            if (below(&s, 4) == 0) { /* at or just below a granule/2 MiB/1 GiB boundary */
                unsigned sh = 12 + 9 * (unsigned)below(&s, 3);
                a = ((a >> sh) << sh) - below(&s, 2);
            }
            if (a < wr->stable_base) a = wr->stable_base;
            if (!hm__tracker_lookup((const void *)a, &e))
                atomic_fetch_add(&reader_misses, 1);
            else if (e.pool != pool_of(w) || a < e.base || a - e.base >= e.size ||
                     e.base < wr->stable_base ||
                     e.base + e.size > wr->stable_base + wr->stable_len)
                atomic_fetch_add(&reader_wrong, 1);
            if (hm__tracker_lookup_pool((const void *)a) != pool_of(w))
                atomic_fetch_add(&reader_misses, 1);
        }
        uintptr_t a = wr->churn_base + below(&s, wr->churn_len);
        if (hm__tracker_lookup((const void *)a, &e) &&
            (e.pool != pool_of(w) || a < e.base || a - e.base >= e.size))
            atomic_fetch_add(&reader_wrong, 1);
        n += 3;
    }
    atomic_fetch_add(&reader_lookups, n);
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    /* Steps per writer (argv[1]); the drainer and the readers run until the
     * writers are done. */
    g_steps = 20000;
#if defined(HM_SANITIZE_BUILD)
    g_steps = 3000;
#endif
    if (argc > 1) g_steps = atol(argv[1]);

    for (int w = 0; w <= N_WRITERS; w++) {
        writer_t *wr = &writers[w];
        wr->w = w;
        wr->rng = 0x1234567ull * (uint64_t)(w + 1);
        wr->ids = calloc(MAX_IDS, sizeof(uint64_t));
        REQUIRE(wr->ids);
        hm__tracker_index_init(&wr->idx);
        /* stable: 3 GiB + 5000 bytes from an address that is not aligned */
        wr->stable_base = 0x600000000000ull + ((uintptr_t)w << 40) + 123;
        wr->stable_len = (3ull << 30) + 5000;
        wr->churn_base = 0x200000000000ull + ((uintptr_t)w << 36);
        wr->churn_len = 256ull << 20;
        if (w < N_WRITERS) {
            uint64_t id;
            REQUIRE_OK(hm__tracker_insert(&wr->idx, pool_of(w), NULL, wr->stable_base,
                                          wr->stable_len, 0, &id));
            add_id(wr, id);
            wr->pieces[0] = (piece_t){wr->stable_base, wr->stable_len};
            wr->n_pieces = 1;
        }
    }
    pthread_t th[N_WRITERS + 1 + N_READERS];
    for (int w = 0; w < N_WRITERS; w++) REQUIRE(!pthread_create(&th[w], NULL, writer_main, &writers[w]));
    REQUIRE(!pthread_create(&th[N_WRITERS], NULL, drainer_main, &writers[N_WRITERS]));
    for (int r = 0; r < N_READERS; r++)
        REQUIRE(!pthread_create(&th[N_WRITERS + 1 + r], NULL, reader_main, (void *)(uintptr_t)(r + 1)));
    for (int i = 0; i < N_WRITERS + 1 + N_READERS; i++) pthread_join(th[i], NULL);

    long wops = 0;
    for (int w = 0; w <= N_WRITERS; w++) wops += writers[w].ops;
    printf("%ld steps each: %ld writer steps, %zu records drained, %ld lookups; %ld misses in stable "
           "regions, %ld wrong answers\n",
           g_steps, wops, drained, atomic_load(&reader_lookups), atomic_load(&reader_misses),
           atomic_load(&reader_wrong));
    CHECK_EQ(atomic_load(&reader_misses), 0);
    CHECK_EQ(atomic_load(&reader_wrong), 0);
    CHECK(wops >= 2 * N_WRITERS * g_steps);
    CHECK(atomic_load(&reader_lookups) >= 3000 * N_READERS);

    /* the writers' final state is exact */
    for (int w = 0; w < N_WRITERS; w++) {
        writer_t *wr = &writers[w];
        for (int i = 0; i < wr->n_pieces; i++) {
            hm_tracker_entry_t e;
            CHECK(hm__tracker_lookup((const void *)(wr->pieces[i].base + wr->pieces[i].size - 1), &e) &&
                  e.base == wr->pieces[i].base && e.size == wr->pieces[i].size);
        }
        size_t count;
        hm__tracker_index_stats(&wr->idx, &count, NULL);
        CHECK_EQ(count, (size_t)(wr->n_pieces + wr->n_churn));
    }

    /* ids unique across all threads */
    size_t total = 0;
    for (int w = 0; w <= N_WRITERS; w++) total += writers[w].n_ids;
    uint64_t *all = malloc(total * sizeof *all);
    REQUIRE(all);
    size_t k = 0;
    for (int w = 0; w <= N_WRITERS; w++) {
        memcpy(all + k, writers[w].ids, writers[w].n_ids * sizeof *all);
        k += writers[w].n_ids;
    }
    qsort(all, total, sizeof *all, cmp_u64);
    size_t dups = 0;
    for (size_t i = 1; i < total; i++) dups += all[i] == all[i - 1];
    CHECK_MSG(dups == 0, "%zu duplicate ids among %zu", dups, total);
    free(all);

    for (int w = 0; w <= N_WRITERS; w++) {
        hm__tracker_index_drain(&writers[w].idx, NULL, NULL);
        hm__tracker_index_fini(&writers[w].idx);
        free(writers[w].ids);
    }
    hm__tracker_fini();
    return hm_test_finish();
}
