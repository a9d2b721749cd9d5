/* hetmem tests — the tracker against a reference model.
 * SPDX-License-Identifier: MIT
 *
 * Random insert/remove/split/merge/rehome (and overlapping inserts that must fail)
 * over synthetic addresses — sub-page ranges, page ranges, multi-MiB and
 * >1 GiB ranges — compared after every step with a sorted array: for every
 * range, lookups just before, at, inside, at the last byte of and just after
 * it; rehome moves a record to another pool's index. Then: per-pool drain leaves the other indexes untouched; ids unique;
 * bad arguments rejected. The tracker never touches the memory it tracks. */
#include "harness.h"
#include "internal.h"
#include "tracker/tracker.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N_POOLS 3
#define MAX_RANGES 160

typedef struct mrange {
    uintptr_t base;
    size_t size;
    int pool;
    uint64_t id;
    int fpool; /* the flags: the pool it was inserted for (rehome keeps them) */
} mrange_t;

static mrange_t model[MAX_RANGES * 2];
static int n_model;
static hm_tracker_index_t idx[N_POOLS];
static char pool_tag[N_POOLS], prov_tag[N_POOLS];
static uint64_t max_id;

static hm_pool_t *pool_of(int p) { return (hm_pool_t *)(void *)&pool_tag[p]; }
static hm_provider_t *prov_of(int p) { return (hm_provider_t *)(void *)&prov_tag[p]; }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* index of the model range containing a, or -1 */
static int model_find(uintptr_t a) {
    int lo = 0, hi = n_model;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (model[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return -1;
    const mrange_t *m = &model[lo - 1];
    return a - m->base < m->size ? lo - 1 : -1;
}

/* The model has a range of exactly [base, base+size) (a neighbour of
 * another: a "wrong" range that is in fact right). */
static int starts_at(uintptr_t base, size_t size) {
    int i = model_find(base);
    return i >= 0 && model[i].base == base && model[i].size == size;
}

static int model_overlaps(uintptr_t base, size_t size) {
    for (int i = 0; i < n_model; i++)
        if (base < model[i].base + model[i].size && model[i].base < base + size) return 1;
    return 0;
}

static void model_insert(mrange_t r) {
    int i = n_model;
    while (i > 0 && model[i - 1].base > r.base) {
        model[i] = model[i - 1];
        i--;
    }
    model[i] = r;
    n_model++;
}

static void model_delete(int i) {
    memmove(&model[i], &model[i + 1], (size_t)(n_model - i - 1) * sizeof model[0]);
    n_model--;
}

static long checks;
static long n_ins, n_overlap, n_rem, n_split, n_merge, n_rehome;

static void check_addr(uintptr_t a, const char *what) {
    if (a == 0 || a >= ((uintptr_t)1 << 57)) return;
    int mi = model_find(a);
    hm_tracker_entry_t e;
    int found = hm__tracker_lookup((const void *)a, &e);
    hm_pool_t *pool = hm__tracker_lookup_pool((const void *)a);
    checks++;
    if (mi < 0) {
        CHECK_MSG(!found && !pool, "%s %#lx: found [%#lx,+%zu) but the model has nothing", what,
                  (unsigned long)a, (unsigned long)e.base, e.size);
        return;
    }
    const mrange_t *m = &model[mi];
    int ok = found && e.base == m->base && e.size == m->size && e.pool == pool_of(m->pool) &&
             e.provider == prov_of(m->pool) && e.id == m->id && e.flags == (uint32_t)m->fpool &&
             pool == pool_of(m->pool);
    CHECK_MSG(ok, "%s %#lx: model [%#lx,+%zu) id %llu, tracker %s [%#lx,+%zu) id %llu", what,
              (unsigned long)a, (unsigned long)m->base, m->size, (unsigned long long)m->id,
              found ? "found" : "NOT FOUND", found ? (unsigned long)e.base : 0UL,
              found ? e.size : 0, found ? (unsigned long long)e.id : 0ULL);
}

static void check_all(void) {
    for (int i = 0; i < n_model; i++) {
        const mrange_t *m = &model[i];
        check_addr(m->base - 1, "before");
        check_addr(m->base, "at");
        check_addr(m->base + rnd_below(m->size), "inside");
        check_addr(m->base + m->size / 2, "middle");
        check_addr(m->base + m->size - 1, "last");
        check_addr(m->base + m->size, "after");
    }
    /* random probes */
    for (int i = 0; i < 8 && n_model; i++) {
        const mrange_t *m = &model[rnd_below((uint64_t)n_model)];
        check_addr(m->base + m->size + rnd_below(1 << 14), "probe");
    }
    size_t count[N_POOLS] = {0}, bytes[N_POOLS] = {0};
    for (int i = 0; i < n_model; i++) {
        count[model[i].pool]++;
        bytes[model[i].pool] += model[i].size;
    }
    for (int p = 0; p < N_POOLS; p++) {
        size_t c, b;
        hm__tracker_index_stats(&idx[p], &c, &b);
        CHECK_MSG(c == count[p] && b == bytes[p], "index %d: %zu records %zu bytes, model %zu %zu",
                  p, c, b, count[p], bytes[p]);
    }
}

/* Address windows: a small one (sub-page and page ranges pack densely, so
 * granules are shared and merges find neighbours) and a huge one. */
#define SMALL_WIN 0x7f1200000000ull
#define SMALL_LEN (64ull << 20)
#define HUGE_WIN 0x100000000000ull
#define HUGE_LEN (1ull << 42)

static void random_range(uintptr_t *base, size_t *size) {
    switch (rnd_below(6)) {
    case 0: /* sub-page, any alignment */
        *size = 1 + rnd_below(3000);
        *base = SMALL_WIN + rnd_below(SMALL_LEN - 8192);
        break;
    case 1: /* sub-page, packed near others so granules are shared */
        *size = 1 + rnd_below(700);
        *base = n_model ? model[rnd_below((uint64_t)n_model)].base +
                              model[rnd_below((uint64_t)n_model)].size % 4096 + rnd_below(64)
                        : SMALL_WIN;
        if (*base < SMALL_WIN || *base + *size > SMALL_WIN + SMALL_LEN) *base = SMALL_WIN + 4096;
        break;
    case 2: /* pages */
        *size = 4096 * (1 + rnd_below(700));
        *base = SMALL_WIN + 4096 * rnd_below((SMALL_LEN - *size) / 4096);
        break;
    case 3: /* odd sizes spanning granules */
        *size = 1 + rnd_below(5 << 20);
        *base = SMALL_WIN + rnd_below(SMALL_LEN - *size);
        break;
    case 4: /* multi-MiB to GiB, in the huge window */
        *size = (1 + rnd_below(1024)) << 21;
        *base = HUGE_WIN + ((uintptr_t)rnd_below(HUGE_LEN >> 21) << 21) - rnd_below(2) * 4096;
        break;
    default: /* > 1 GiB, unaligned ends */
        *size = (1ull << 30) + rnd_below(1ull << 34);
        *base = HUGE_WIN + rnd_below(HUGE_LEN - *size);
        break;
    }
}

static void do_insert(void) {
    uintptr_t base;
    size_t size;
    random_range(&base, &size);
    int p = (int)rnd_below(N_POOLS);
    uint64_t id = 0;
    hm_result_t r =
        hm__tracker_insert(&idx[p], pool_of(p), prov_of(p), base, size, (uint32_t)p, &id);
    if (model_overlaps(base, size)) {
        CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT, "overlapping insert [%#lx,+%zu) -> %s",
                  (unsigned long)base, size, hm_result_string(r));
        if (r == HM_SUCCESS) hm__tracker_remove(base, size);
        n_overlap++;
        return;
    }
    CHECK_MSG(r == HM_SUCCESS, "insert [%#lx,+%zu) -> %s", (unsigned long)base, size,
              hm_result_string(r));
    if (r != HM_SUCCESS) return;
    CHECK_MSG(id > max_id, "id %llu not new (max %llu)", (unsigned long long)id,
              (unsigned long long)max_id);
    max_id = id;
    model_insert((mrange_t){base, size, p, id, p});
    n_ins++;
}

static void do_remove(void) {
    if (!n_model) return;
    int i = (int)rnd_below((uint64_t)n_model);
    mrange_t m = model[i];
    /* wrong sizes first: must not remove */
    if (m.size > 1) CHECK_RES(hm__tracker_remove(m.base, m.size - 1), HM_ERROR_NOT_FOUND);
    if (!starts_at(m.base + 1, m.size))
        CHECK_RES(hm__tracker_remove(m.base + 1, m.size), HM_ERROR_NOT_FOUND);
    CHECK_OK(hm__tracker_remove(m.base, m.size));
    CHECK_RES(hm__tracker_remove(m.base, m.size), HM_ERROR_NOT_FOUND);
    model_delete(i);
    n_rem++;
}

static void do_split(void) {
    if (!n_model) return;
    int i = (int)rnd_below((uint64_t)n_model);
    mrange_t m = model[i];
    if (m.size < 2) return;
    size_t first;
    switch (rnd_below(4)) {
    case 0: first = 1 + rnd_below(m.size - 1); break;
    case 1: first = (m.size >= 8192) ? 4096 * (1 + rnd_below(m.size / 4096 - 1)) : 1; break;
    case 2: first = (m.size > (4u << 20)) ? ((size_t)1 << 21) * (1 + rnd_below(m.size >> 21) / 2) : m.size / 2; break;
    default: first = m.size / 2; break;
    }
    if (first == 0 || first >= m.size) first = m.size / 2;
    if (first == 0) return;
    CHECK_RES(hm__tracker_split(m.base, m.size, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__tracker_split(m.base, m.size, m.size), HM_ERROR_INVALID_ARGUMENT);
    hm_result_t r = hm__tracker_split(m.base, m.size, first);
    CHECK_MSG(r == HM_SUCCESS, "split [%#lx,+%zu) at %zu -> %s", (unsigned long)m.base, m.size,
              first, hm_result_string(r));
    if (r != HM_SUCCESS) return;
    hm_tracker_entry_t hi;
    REQUIRE(hm__tracker_lookup((const void *)(m.base + first), &hi));
    CHECK_MSG(hi.id > max_id, "split: upper id %llu not new", (unsigned long long)hi.id);
    max_id = hi.id;
    model[i].size = first; /* lower part keeps the id */
    model_insert((mrange_t){m.base + first, m.size - first, m.pool, hi.id, m.fpool});
    n_split++;
}

static void do_merge(void) {
    if (n_model < 2) return;
    int start = (int)rnd_below((uint64_t)n_model - 1);
    for (int k = 0; k < n_model - 1; k++) {
        int i = (start + k) % (n_model - 1);
        mrange_t a = model[i], b = model[i + 1];
        if (a.base + a.size != b.base) continue;
        hm_result_t r = hm__tracker_merge(a.base, b.base, a.size + b.size);
        if (a.pool != b.pool) {
            CHECK_RES(r, HM_ERROR_INVALID_ARGUMENT);
            continue;
        }
        CHECK_MSG(r == HM_SUCCESS, "merge [%#lx,%#lx,+%zu) -> %s", (unsigned long)a.base,
                  (unsigned long)b.base, a.size + b.size, hm_result_string(r));
        if (r != HM_SUCCESS) return;
        hm_tracker_entry_t e;
        REQUIRE(hm__tracker_lookup((const void *)a.base, &e));
        CHECK(e.id > max_id);
        max_id = e.id;
        model[i].size = a.size + b.size;
        model[i].id = e.id;
        model_delete(i + 1);
        n_merge++;
        return;
    }
    /* No neighbours: make some by splitting. A wrong merge must fail. */
    mrange_t a = model[0];
    CHECK_RES(hm__tracker_merge(a.base, a.base + a.size, a.size + 1), HM_ERROR_NOT_FOUND);
}

/* A record moves to another pool's index: same range, id and flags. */
static void do_rehome(void) {
    if (!n_model) return;
    int i = (int)rnd_below((uint64_t)n_model);
    mrange_t m = model[i];
    int q = (int)rnd_below(N_POOLS);
    if (m.size > 1)
        CHECK_RES(hm__tracker_rehome(m.base, m.size - 1, &idx[q], pool_of(q), prov_of(q)),
                  HM_ERROR_NOT_FOUND);
    if (!starts_at(m.base + 1, m.size))
        CHECK_RES(hm__tracker_rehome(m.base + 1, m.size, &idx[q], pool_of(q), prov_of(q)),
                  HM_ERROR_NOT_FOUND);
    CHECK_OK(hm__tracker_rehome(m.base, m.size, &idx[q], pool_of(q), prov_of(q)));
    model[i].pool = q;
    n_rehome++;
}

static size_t drained_count;
static size_t drained_bytes;
static int drained_bad;
static int drain_pool;
static void on_drain(void *arg, const hm_tracker_entry_t *e) {
    (void)arg;
    drained_count++;
    drained_bytes += e->size;
    if (e->pool != pool_of(drain_pool)) drained_bad++;
    /* the record is already unreachable */
    if (hm__tracker_lookup_pool((const void *)e->base) == pool_of(drain_pool)) drained_bad++;
}

static void test_drain(int p) {
    size_t c = 0, b = 0;
    for (int i = 0; i < n_model; i++)
        if (model[i].pool == p) {
            c++;
            b += model[i].size;
        }
    drained_count = drained_bytes = 0;
    drained_bad = 0;
    drain_pool = p;
    hm__tracker_index_drain(&idx[p], on_drain, NULL);
    CHECK_EQ(drained_count, c);
    CHECK_EQ(drained_bytes, b);
    CHECK_EQ(drained_bad, 0);
    for (int i = 0; i < n_model;)
        if (model[i].pool == p)
            model_delete(i);
        else
            i++;
    check_all();
}

static void test_bad_arguments(void) {
    hm_tracker_index_t x;
    hm__tracker_index_init(&x);
    uint64_t id;
    CHECK_RES(hm__tracker_insert(NULL, NULL, NULL, 0x10000, 10, 0, &id), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, 0, 10, 0, &id), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, 0x10000, 0, 0, &id), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, UINTPTR_MAX - 10, 100, 0, &id),
              HM_ERROR_INVALID_ARGUMENT);
    /* beyond the 57 bits the tree covers: refused, not wrapped */
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, (uintptr_t)1 << 57, 1, 0, &id),
              HM_ERROR_NOT_SUPPORTED);
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, ((uintptr_t)1 << 57) - 4096, 8192, 0, &id),
              HM_ERROR_NOT_SUPPORTED);
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, (uintptr_t)1 << 60, 4096, 0, &id),
              HM_ERROR_NOT_SUPPORTED);
    /* the very top of the 57-bit space is fine */
    CHECK_OK(hm__tracker_insert(&x, NULL, NULL, ((uintptr_t)1 << 57) - 4096, 4096, 0, &id));
    CHECK(hm__tracker_lookup((const void *)(((uintptr_t)1 << 57) - 1), NULL));
    CHECK(!hm__tracker_lookup((const void *)((uintptr_t)1 << 57), NULL));
    CHECK(!hm__tracker_lookup((const void *)UINTPTR_MAX, NULL));
    CHECK(!hm__tracker_lookup(NULL, NULL));
    CHECK_RES(hm__tracker_remove(0, 0), HM_ERROR_NOT_FOUND);
    CHECK_RES(hm__tracker_remove(0x12345000, 4096), HM_ERROR_NOT_FOUND);
    CHECK_RES(hm__tracker_split(0x12345000, 4096, 100), HM_ERROR_NOT_FOUND);
    CHECK_RES(hm__tracker_merge(0x12345000, 0x12346000, 8192), HM_ERROR_NOT_FOUND);
    CHECK_RES(hm__tracker_merge(0x12346000, 0x12345000, 8192), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__tracker_split(0x12345000, 0, 0), HM_ERROR_INVALID_ARGUMENT);
    /* the whole address space at once, and a range across the root's slots */
    CHECK_OK(hm__tracker_remove(((uintptr_t)1 << 57) - 4096, 4096));
    CHECK_OK(hm__tracker_insert(&x, NULL, NULL, 4096, ((uintptr_t)1 << 57) - 4096, 0, &id));
    CHECK(hm__tracker_lookup((const void *)0x7fff12345678, NULL));
    CHECK_OK(hm__tracker_split(4096, ((uintptr_t)1 << 57) - 4096, ((uintptr_t)1 << 47) + 5));
    CHECK_RES(hm__tracker_insert(&x, NULL, NULL, 0x10000, 1, 0, &id), HM_ERROR_INVALID_ARGUMENT);
    size_t c;
    hm__tracker_index_stats(&x, &c, NULL);
    CHECK_EQ(c, 2);
    hm__tracker_index_drain(&x, NULL, NULL);
    hm__tracker_index_fini(&x);
    CHECK(!hm__tracker_lookup((const void *)0x7fff12345678, NULL));
}

int main(int argc, char **argv) {
#ifdef HM_SANITIZE_BUILD
    int steps = 1000; /* every step checks every range: keep sanitizer runs short */
#else
    int steps = 2500;
#endif
    if (argc > 1) steps = atoi(argv[1]);
    for (int p = 0; p < N_POOLS; p++) hm__tracker_index_init(&idx[p]);
    test_bad_arguments();

    for (int round = 0; round < 2; round++) {
        for (int s = 0; s < steps; s++) {
            uint64_t op = rnd_below(100);
            if (n_model >= MAX_RANGES && op < 40) op = 50;
            if (op < 40)
                do_insert();
            else if (op < 60)
                do_remove();
            else if (op < 82)
                do_split();
            else if (op < 94)
                do_merge();
            else
                do_rehome();
            check_all();
            if (hm_test_failed_count() > 20) break;
        }
        /* pool destroy: exactly its records go, the others stay */
        test_drain((int)(round % N_POOLS));
    }
    printf("%ld lookups checked; %ld inserts, %ld overlaps rejected, %ld removes, %ld splits, "
           "%ld merges, %ld rehomes; %d ranges left, max id %llu\n",
           checks, n_ins, n_overlap, n_rem, n_split, n_merge, n_rehome, n_model,
           (unsigned long long)max_id);
    CHECK(n_ins > 100 && n_overlap > 10 && n_rem > 100 && n_split > 100 && n_merge > 50 &&
          n_rehome > 50);
    for (int p = 0; p < N_POOLS; p++) {
        hm__tracker_index_drain(&idx[p], NULL, NULL);
        hm__tracker_index_fini(&idx[p]);
    }
    /* nothing left anywhere: every former range misses */
    for (int i = 0; i < n_model; i++) {
        CHECK(!hm__tracker_lookup((const void *)model[i].base, NULL));
        CHECK(!hm__tracker_lookup((const void *)(model[i].base + model[i].size - 1), NULL));
    }
    n_model = 0;
    hm__tracker_fini();
    /* usable again after fini */
    hm_tracker_index_t again;
    hm__tracker_index_init(&again);
    CHECK_OK(hm__tracker_insert(&again, pool_of(0), NULL, 0x5000, 10, 0, NULL));
    CHECK(hm__tracker_lookup_pool((const void *)0x5009) == pool_of(0));
    hm__tracker_index_drain(&again, NULL, NULL);
    hm__tracker_index_fini(&again);
    hm__tracker_fini();
    return hm_test_finish();
}
