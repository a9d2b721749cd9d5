/* hetmem tests — the pool conformance suite: every pool x provider pair
 * passes it. SPDX-License-Identifier: MIT
 *
 * Each case makes a fresh pool (which owns its provider) and destroys it
 * before the next. Memory of a pool whose provider is not CPU-accessible is
 * never touched. Pools created with HM_POOL_FLAG_NO_TRACKING get the tracker
 * checks inverted (the tracker must not know them) and no foreign-pointer
 * frees (the documented trade-off: such a pool cannot reject them). */
#include "conformance.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#define MIB ((size_t)1 << 20)
#define KIB ((size_t)1 << 10)

typedef struct qsuite {
    const char *label;
    hm_test_pool_factory make;
    void *arg;
    size_t max_alloc, max_alignment, capacity;
    int threads, free_unsupported;
    char context[256];
} qsuite_t;

static void set_case(qsuite_t *s, const char *name) {
    snprintf(s->context, sizeof(s->context), "pool suite %s: %s", s->label, name);
    hm_test_set_context(s->context);
}

static hm_pool_t *fresh(qsuite_t *s) {
    hm_pool_t *p = NULL;
    hm_result_t r = s->make(s->arg, &p);
    CHECK_MSG(r == HM_SUCCESS && p, "factory -> %s", hm_result_string(r));
    if (r == HM_SUCCESS && p)
        CHECK_MSG(hm_pool_flags(p) & HM_POOL_FLAG_OWN_PROVIDER,
                  "the factory's pool must own its provider");
    return r == HM_SUCCESS ? p : NULL;
}

static void done(hm_pool_t *p) {
    if (p) CHECK_OK(hm_pool_destroy(p));
}

static int cpu(const hm_pool_t *p) { return hm_provider_cpu_accessible(hm_pool_get_provider(p)); }
static int tracked(const hm_pool_t *p) { return !(hm_pool_flags(p) & HM_POOL_FLAG_NO_TRACKING); }
/* Provider memory is never given back: keep workloads within capacity. */
static int bounded(const hm_pool_t *p) {
    return !(hm_provider_caps(hm_pool_get_provider(p)) & HM_PROVIDER_CAP_FREE);
}

static hm_result_t free_expect(const qsuite_t *s) {
    return s->free_unsupported ? HM_ERROR_NOT_SUPPORTED : HM_SUCCESS;
}

static void pfree(qsuite_t *s, hm_pool_t *pool, void *ptr) {
    hm_result_t r = hm_pool_free(pool, ptr);
    CHECK_MSG(r == free_expect(s), "hm_pool_free(%p) -> %s, expected %s", ptr,
              hm_result_string(r), hm_result_string(free_expect(s)));
}

/* The tracker answers for every byte of a live allocation. */
static void check_tracked(hm_pool_t *pool, void *ptr, size_t size) {
    const char *c = ptr;
    const void *probe[3] = {c, c + size / 2, c + size - 1};
    hm_provider_t *prov = hm_pool_get_provider(pool);
    for (int i = 0; i < 3; i++) {
        hm_allocation_info_t info;
        memset(&info, 0, sizeof(info));
        hm_result_t r = hm_allocation_info(probe[i], &info);
        if (!tracked(pool)) {
            CHECK_MSG(hm_pool_by_ptr(probe[i]) == NULL, "untracked pool's %p is known", probe[i]);
            CHECK_MSG(r == HM_ERROR_NOT_FOUND || r == HM_ERROR_INVALID_ARGUMENT,
                      "hm_allocation_info(untracked %p) -> %s", probe[i], hm_result_string(r));
            continue;
        }
        CHECK_MSG(hm_pool_by_ptr(probe[i]) == pool, "hm_pool_by_ptr(%p + %zu) is not the pool",
                  ptr, (size_t)((const char *)probe[i] - c));
        CHECK_MSG(r == HM_SUCCESS, "hm_allocation_info(%p) -> %s", probe[i], hm_result_string(r));
        if (r != HM_SUCCESS) continue;
        CHECK(info.pool == pool);
        CHECK(info.provider == prov);
        CHECK_MSG((uintptr_t)info.base <= (uintptr_t)ptr &&
                      (uintptr_t)ptr + size <= (uintptr_t)info.base + info.size,
                  "allocation [%p, +%zu) outside its provider range [%p, +%zu)", ptr, size,
                  info.base, info.size);
        CHECK(info.id != 0);
        CHECK_EQ(info.kind, hm_provider_memory_kind(prov));
        CHECK_EQ(!!(info.flags & HM_ALLOCATION_HOST_ACCESSIBLE), cpu(pool));
        CHECK(!(info.flags & HM_ALLOCATION_IMPORTED));
    }
}

/* Allocation checks common to every malloc-family result. */
static void check_alloc(qsuite_t *s, hm_pool_t *pool, void *ptr, size_t size, size_t align,
                        uint64_t seed) {
    size_t natural = size >= 16 ? 16 : 8;
    size_t a = align > natural ? align : natural;
    if (size < 8 && align <= 1) a = 1; /* tiny objects: no alignment promised */
    CHECK_MSG(((uintptr_t)ptr & (a - 1)) == 0, "%p (size %zu, align %zu) is not %zu-aligned",
              ptr, size, align, a);
    size_t us = hm_pool_malloc_usable_size(pool, ptr);
    CHECK_MSG(us == 0 || us >= size, "usable_size %zu < size %zu", us, size);
    check_tracked(pool, ptr, size);
    if (cpu(pool)) {
        hm_test_fill(ptr, size, seed);
        CHECK_MSG(hm_test_verify(ptr, size, seed), "content of %p (%zu) lost", ptr, size);
        if (us > size) { /* the usable tail is writable too */
            hm_test_fill((char *)ptr + size, us - size, seed + 1);
            CHECK(hm_test_verify(ptr, size, seed));
        }
    }
}

static void *malloc_check(qsuite_t *s, hm_pool_t *pool, size_t size, uint64_t seed) {
    errno = 0;
    void *p = hm_pool_malloc(pool, size);
    CHECK_MSG(p != NULL, "hm_pool_malloc(%zu) -> NULL, errno %d", size, errno);
    if (p) check_alloc(s, pool, p, size, 0, seed);
    return p;
}

/* ---- cases ---- */

static void case_create_destroy(qsuite_t *s) {
    set_case(s, "create/destroy");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    CHECK(hm_pool_name(pool) != NULL && hm_pool_name(pool)[0] != '\0');
    CHECK(hm_pool_get_provider(pool) != NULL);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(pool, &st));
    CHECK_RES(hm_pool_get_stats(pool, NULL), HM_ERROR_INVALID_ARGUMENT);
    hm_result_t r = hm_pool_trim(pool);
    CHECK_MSG(r == HM_SUCCESS || r == HM_ERROR_NOT_SUPPORTED, "trim -> %s", hm_result_string(r));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_RES(hm_pool_destroy(pool), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_pool_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
    hm_pool_t *q = (hm_pool_t *)(uintptr_t)1;
    CHECK_RES(hm_pool_create(NULL, NULL, NULL, 0, &q), HM_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < 3; i++) done(fresh(s));
}

static void case_null_pool(qsuite_t *s) {
    set_case(s, "NULL pool arguments");
    int stack_var = 0;
    errno = 0;
    CHECK(hm_pool_malloc(NULL, 16) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(hm_pool_calloc(NULL, 1, 16) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(hm_pool_realloc(NULL, NULL, 16) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(hm_pool_aligned_malloc(NULL, 16, 64) == NULL && errno == EINVAL);
    CHECK_RES(hm_pool_free(NULL, &stack_var), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_pool_free(NULL, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_pool_malloc_usable_size(NULL, &stack_var), 0);
    CHECK_RES(hm_pool_trim(NULL), HM_ERROR_INVALID_ARGUMENT);
    hm_pool_stats_t st;
    CHECK_RES(hm_pool_get_stats(NULL, &st), HM_ERROR_INVALID_ARGUMENT);
    CHECK(hm_pool_get_provider(NULL) == NULL);
    CHECK_EQ(hm_pool_flags(NULL), 0);
    (void)hm_pool_name(NULL);
    CHECK_RES(hm_free(NULL), HM_SUCCESS);
    CHECK(hm_pool_by_ptr(NULL) == NULL);
    hm_allocation_info_t info;
    hm_result_t r = hm_allocation_info(NULL, &info);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_NOT_FOUND,
              "hm_allocation_info(NULL) -> %s", hm_result_string(r));
    CHECK_RES(hm_allocation_info(&stack_var, NULL), HM_ERROR_INVALID_ARGUMENT);
}

static void case_malloc(qsuite_t *s) {
    set_case(s, "malloc");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    errno = 0;
    CHECK(hm_pool_malloc(pool, 0) == NULL);
    CHECK_EQ(errno, EINVAL);
    const size_t sizes[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 100, 255, 1000, 4095, 4096, 4097,
                            12345, 65537, 1 * MIB + 1};
    uint64_t seed = 1;
    void *live[sizeof(sizes) / sizeof(sizes[0])];
    size_t n = sizeof(sizes) / sizeof(sizes[0]);
    for (size_t i = 0; i < n; i++) live[i] = malloc_check(s, pool, sizes[i], seed + i);
    /* All live at once: none overwrote another. */
    for (size_t i = 0; i < n; i++)
        if (live[i] && cpu(pool))
            CHECK_MSG(hm_test_verify(live[i], sizes[i], seed + i), "%zu-byte block clobbered",
                      sizes[i]);
    for (size_t i = 0; i < n; i += 2) pfree(s, pool, live[i]);
    for (size_t i = 1; i < n; i += 2) pfree(s, pool, live[i]);
    /* Large: the suite's max_alloc, on a pool of its own when nothing is freed. */
    if (bounded(pool)) {
        done(pool);
        pool = fresh(s);
        if (!pool) return;
    }
    void *big = malloc_check(s, pool, s->max_alloc, 77);
    pfree(s, pool, big);
    /* Sizes nothing can hold: NULL and ENOMEM, and the pool still works. */
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 15, SIZE_MAX / 2 + 1, (size_t)1 << 60};
    for (size_t i = 0; i < 4; i++) {
        errno = 0;
        void *p = hm_pool_malloc(pool, huge[i]);
        CHECK_MSG(p == NULL && errno == ENOMEM, "hm_pool_malloc(%zu) -> %p errno %d", huge[i], p,
                  errno);
        if (p) (void)hm_pool_free(pool, p);
    }
    pfree(s, pool, malloc_check(s, pool, 64, 78));
    done(pool);
}

/* Memory the CPU may not touch, reached through the provider's copy
 * (HM_PROVIDER_CAP_COPY): n bytes at dev into (or from) a host buffer. */
static int dev_copies(const hm_pool_t *p) {
    return !!(hm_provider_caps(hm_pool_get_provider(p)) & HM_PROVIDER_CAP_COPY);
}
static int dev_fills(const hm_pool_t *p) {
    return !!(hm_provider_caps(hm_pool_get_provider(p)) & HM_PROVIDER_CAP_FILL);
}
static int dev_read(hm_pool_t *pool, void *host, const void *dev, size_t n) {
    hm_result_t r = hm_provider_copy(hm_pool_get_provider(pool), host, dev, n);
    CHECK_MSG(r == HM_SUCCESS, "provider copy of %zu bytes to the host -> %s", n,
              hm_result_string(r));
    return r == HM_SUCCESS;
}
static int dev_write(hm_pool_t *pool, void *dev, const void *host, size_t n) {
    hm_result_t r = hm_provider_copy(hm_pool_get_provider(pool), dev, host, n);
    CHECK_MSG(r == HM_SUCCESS, "provider copy of %zu bytes from the host -> %s", n,
              hm_result_string(r));
    return r == HM_SUCCESS;
}

/* The bytes of p: read directly (CPU memory) or through the provider's
 * copy; NULL where neither can (the caller frees the copy with free_view). */
static const unsigned char *view(hm_pool_t *pool, const void *p, size_t n) {
    if (cpu(pool)) return p;
    if (!dev_copies(pool)) return NULL;
    unsigned char *h = malloc(n);
    REQUIRE(h != NULL);
    if (!dev_read(pool, h, p, n)) {
        free(h);
        return NULL;
    }
    return h;
}
static void free_view(hm_pool_t *pool, const unsigned char *v) {
    if (!cpu(pool)) free((void *)(uintptr_t)v);
}

/* Set n bytes of p to value (directly, or through the provider's copy). */
static void dirty(hm_pool_t *pool, void *p, int value, size_t n) {
    if (cpu(pool)) {
        memset(p, value, n);
    } else if (dev_copies(pool)) {
        unsigned char *h = malloc(n);
        REQUIRE(h != NULL);
        memset(h, value, n);
        dev_write(pool, p, h, n);
        free(h);
    }
}

static void case_calloc(qsuite_t *s) {
    set_case(s, "calloc");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    const size_t shapes[][2] = {{1, 1}, {3, 5}, {10, 100}, {4096, 1}, {1, 4097}, {100, 1000}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        size_t num = shapes[i][0], size = shapes[i][1], total = num * size;
        /* Dirty memory first so a reusing pool must really zero. */
        void *d = hm_pool_malloc(pool, total);
        if (d) {
            dirty(pool, d, 0xa5, total);
            pfree(s, pool, d);
        }
        errno = 0;
        unsigned char *p = hm_pool_calloc(pool, num, size);
        if (!cpu(pool) && !dev_fills(pool)) {
            /* Device memory that neither the CPU nor the provider can zero:
             * only a pool with its own calloc could. */
            CHECK_MSG(p || errno != 0, "calloc on device memory: NULL without errno");
            if (p) pfree(s, pool, p);
            continue;
        }
        CHECK_MSG(p != NULL, "hm_pool_calloc(%zu, %zu) -> NULL errno %d", num, size, errno);
        if (!p) continue;
        const unsigned char *v = view(pool, p, total);
        if (v) {
            size_t nz = 0;
            for (size_t k = 0; k < total; k++) nz += v[k] != 0;
            CHECK_MSG(nz == 0, "calloc(%zu, %zu): %zu non-zero bytes", num, size, nz);
            free_view(pool, v);
        }
        check_alloc(s, pool, p, total, 0, 300 + i);
        pfree(s, pool, p);
    }
    /* num * size overflows: NULL and ENOMEM. */
    const size_t ovf[][2] = {{SIZE_MAX, 2},
                             {2, SIZE_MAX},
                             {SIZE_MAX / 2 + 1, 2},
                             {(size_t)1 << 33, (size_t)1 << 33},
                             {SIZE_MAX, SIZE_MAX}};
    for (size_t i = 0; i < sizeof(ovf) / sizeof(ovf[0]); i++) {
        errno = 0;
        void *p = hm_pool_calloc(pool, ovf[i][0], ovf[i][1]);
        CHECK_MSG(p == NULL && errno == ENOMEM, "calloc(%zu, %zu) -> %p errno %d", ovf[i][0],
                  ovf[i][1], p, errno);
    }
    /* Zero elements or zero size: like malloc(0). */
    errno = 0;
    CHECK(hm_pool_calloc(pool, 0, 16) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(hm_pool_calloc(pool, 16, 0) == NULL && errno == EINVAL);
    done(pool);
}

/* A pattern that depends only on the position, so any prefix of a block
 * verifies on its own (realloc keeps a prefix). On memory the CPU may not
 * touch, written and read through the provider's copy. */
static void pos_fill_host(unsigned char *b, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 31u + (i >> 8) + seed * 7u);
}

static void pos_fill(hm_pool_t *pool, void *p, size_t n, uint64_t seed) {
    if (cpu(pool)) {
        pos_fill_host(p, n, seed);
        return;
    }
    unsigned char *h = malloc(n);
    REQUIRE(h != NULL);
    pos_fill_host(h, n, seed);
    dev_write(pool, p, h, n);
    free(h);
}

static int pos_verify(hm_pool_t *pool, const void *p, size_t n, uint64_t seed) {
    const unsigned char *b = view(pool, p, n);
    if (!b) return 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++)
        if (b[i] != (unsigned char)(i * 31u + (i >> 8) + seed * 7u)) ok = 0;
    free_view(pool, b);
    return ok;
}

static void case_realloc(qsuite_t *s) {
    set_case(s, "realloc");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    /* realloc(NULL, n) is malloc(n). */
    errno = 0;
    void *p = hm_pool_realloc(pool, NULL, 100);
    CHECK_MSG(p != NULL, "realloc(NULL, 100) -> NULL errno %d", errno);
    if (!p) {
        done(pool);
        return;
    }
    check_alloc(s, pool, p, 100, 0, 500);
    errno = 0;
    CHECK(hm_pool_realloc(pool, NULL, 0) == NULL && errno == EINVAL);
    if (!cpu(pool) && !dev_copies(pool)) {
        /* Memory that neither the CPU nor the provider can move: realloc
         * works through the pool's own op or fails cleanly, leaving p alone. */
        errno = 0;
        void *q = hm_pool_realloc(pool, p, 5000);
        CHECK_MSG(q || errno != 0, "device realloc: NULL without errno");
        pfree(s, pool, q ? q : p);
        done(pool);
        return;
    }
    size_t cur = 100;
    uint64_t seed = 500;
    pos_fill(pool, p, cur, seed);
    const size_t steps[] = {5000, 5001, 200000, 1 * MIB + 7, 64, 10, 1, 3000, 65536};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        size_t want = steps[i];
        errno = 0;
        void *q = hm_pool_realloc(pool, p, want);
        CHECK_MSG(q != NULL, "realloc(%zu -> %zu) -> NULL errno %d", cur, want, errno);
        if (!q) break;
        size_t keep = cur < want ? cur : want;
        CHECK_MSG(pos_verify(pool, q, keep, seed), "realloc(%zu -> %zu) lost content", cur,
                  want);
        p = q;
        cur = want;
        seed++;
        check_alloc(s, pool, p, cur, 0, seed);
        pos_fill(pool, p, cur, seed);
    }
    /* Failing realloc: NULL, ENOMEM, the block untouched. */
    pos_fill(pool, p, cur, 600);
    errno = 0;
    void *q = hm_pool_realloc(pool, p, SIZE_MAX - 64);
    CHECK_MSG(q == NULL && errno == ENOMEM, "realloc(SIZE_MAX - 64) -> %p errno %d", q, errno);
    CHECK(pos_verify(pool, p, cur, 600));
    CHECK(hm_pool_by_ptr(p) == (tracked(pool) ? pool : NULL));
    /* realloc(p, 0) frees p and returns NULL (the front-end's documented choice). */
    void *r0 = hm_pool_realloc(pool, p, 0);
    CHECK_MSG(r0 == NULL, "realloc(p, 0) -> %p, expected NULL", r0);
    if (r0) (void)hm_pool_free(pool, r0);
    if (tracked(pool) && !s->free_unsupported && !bounded(pool)) {
        /* p is gone: if the tracker forgot its range, a second free is refused. */
        if (hm_pool_by_ptr(p) == NULL)
            CHECK_RES(hm_pool_free(pool, p), HM_ERROR_INVALID_ARGUMENT);
    }
    /* realloc of a foreign pointer on a tracked pool: refused, nothing freed. */
    if (tracked(pool)) {
        int stack_var = 1;
        errno = 0;
        CHECK(hm_pool_realloc(pool, &stack_var, 64) == NULL && errno == EINVAL);
        CHECK_EQ(stack_var, 1);
    }
    done(pool);
}

static void case_aligned(qsuite_t *s) {
    set_case(s, "aligned_malloc");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    uint64_t seed = 700;
    for (size_t a = 1; a <= s->max_alignment; a *= 2) {
        if (bounded(pool) && a >= 64 * KIB) {
            done(pool);
            pool = fresh(s);
            if (!pool) return;
        }
        const size_t sizes[] = {1, 24, a <= s->max_alloc ? a : 4096, a + 5};
        for (size_t i = 0; i < 4; i++) {
            size_t size = sizes[i];
            if (size > s->max_alloc) continue;
            if (bounded(pool) && a >= 64 * KIB && i == 3) continue;
            errno = 0;
            void *p = hm_pool_aligned_malloc(pool, size, a);
            CHECK_MSG(p != NULL, "aligned_malloc(%zu, %zu) -> NULL errno %d", size, a, errno);
            if (!p) continue;
            check_alloc(s, pool, p, size, a, seed++);
            pfree(s, pool, p);
        }
    }
    const size_t bad[] = {0, 3, 5, 6, 12, 24, 100, 4095, 4097, 3 * 4096, SIZE_MAX,
                          ((size_t)1 << 63) + 1};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        errno = 0;
        void *p = hm_pool_aligned_malloc(pool, 64, bad[i]);
        if (bad[i] == 0) { /* undocumented: either natural alignment or EINVAL */
            CHECK_MSG(p || errno == EINVAL, "aligned_malloc(64, 0) -> NULL errno %d", errno);
            if (p) pfree(s, pool, p);
            continue;
        }
        CHECK_MSG(p == NULL && errno == EINVAL, "aligned_malloc(64, %zu) -> %p errno %d", bad[i],
                  p, errno);
    }
    errno = 0;
    CHECK(hm_pool_aligned_malloc(pool, 0, 64) == NULL && errno == EINVAL);
    errno = 0;
    void *p = hm_pool_aligned_malloc(pool, 64, (size_t)1 << 62);
    CHECK_MSG(p == NULL && (errno == ENOMEM || errno == EINVAL),
              "aligned_malloc(64, 2^62) -> %p errno %d", p, errno);
    done(pool);
}

static void case_free_foreign(qsuite_t *s) {
    set_case(s, "free/foreign pointers");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    CHECK_OK(hm_pool_free(pool, NULL));
    CHECK_OK(hm_free(NULL));
    CHECK_EQ(hm_pool_malloc_usable_size(pool, NULL), 0);
    static int static_var;
    int stack_var = 0;
    void *heap = malloc(64);
    REQUIRE(heap != NULL);
    void *foreign[] = {&stack_var, heap, &static_var, (char *)heap + 8};
    for (size_t i = 0; i < 4; i++) {
        CHECK(hm_pool_by_ptr(foreign[i]) == NULL);
        CHECK_RES(hm_free(foreign[i]), HM_ERROR_INVALID_ARGUMENT);
        hm_allocation_info_t info;
        CHECK_RES(hm_allocation_info(foreign[i], &info), HM_ERROR_NOT_FOUND);
        if (tracked(pool)) {
            CHECK_RES(hm_pool_free(pool, foreign[i]), HM_ERROR_INVALID_ARGUMENT);
            CHECK_EQ(hm_pool_malloc_usable_size(pool, foreign[i]), 0);
            errno = 0;
            CHECK(hm_pool_realloc(pool, foreign[i], 128) == NULL && errno == EINVAL);
        }
    }
    free(heap);

    /* hm_free through the tracker. */
    void *p = malloc_check(s, pool, 1000, 800);
    if (p) {
        if (tracked(pool)) {
            CHECK_RES(hm_free(p), free_expect(s));
        } else {
            CHECK_RES(hm_free(p), HM_ERROR_INVALID_ARGUMENT); /* unknown: nothing freed */
            pfree(s, pool, p);
        }
    }
    /* Double free: refused where the tracker forgot the range. */
    p = malloc_check(s, pool, 4096 * 3, 801);
    if (p) {
        pfree(s, pool, p);
        if (tracked(pool) && !s->free_unsupported && hm_pool_by_ptr(p) == NULL) {
            hm_result_t r = hm_pool_free(pool, p);
            CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_DOUBLE_FREE,
                      "double free -> %s", hm_result_string(r));
            r = hm_free(p);
            CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_DOUBLE_FREE,
                      "double hm_free -> %s", hm_result_string(r));
        }
    }
    /* The pool is intact after all the refusals. */
    pfree(s, pool, malloc_check(s, pool, 333, 802));
    done(pool);
}

static void case_leaks_at_destroy(qsuite_t *s) {
    set_case(s, "destroy with live allocations");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    const size_t sizes[] = {1, 100, 4096, 70000, 1 * MIB + 1};
    void *leak[5];
    for (int i = 0; i < 5; i++) leak[i] = malloc_check(s, pool, sizes[i], 900 + (uint64_t)i);
    void *al = hm_pool_aligned_malloc(pool, 100, 4096);
    CHECK(al != NULL);
    CHECK_OK(hm_pool_destroy(pool));
    for (int i = 0; i < 5; i++)
        if (leak[i]) CHECK_MSG(hm_pool_by_ptr(leak[i]) == NULL, "leaked %p still tracked", leak[i]);
    if (al) CHECK(hm_pool_by_ptr(al) == NULL);
    CHECK_RES(hm_pool_destroy(pool), HM_ERROR_INVALID_ARGUMENT);
}

static void case_reuse(qsuite_t *s) {
    /* A provider that cannot free: a pool that frees (not the proxy) must
     * reuse what it holds, so alloc/free rounds far beyond capacity work. */
    if (s->free_unsupported) return;
    set_case(s, "reuse over a provider that cannot free");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    if (!bounded(pool)) {
        done(pool);
        return;
    }
    size_t cap = s->capacity ? s->capacity : 64 * MIB;
    size_t sz = 64 * KIB;
    size_t rounds = 3 * cap / sz;
    if (rounds > 20000) rounds = 20000;
    for (size_t i = 0; i < rounds; i++) {
        void *p = hm_pool_malloc(pool, sz + (i % 7) * 64);
        if (!p) {
            CHECK_MSG(0, "round %zu of malloc/free: NULL errno %d (memory not reused?)", i, errno);
            break;
        }
        if (cpu(pool)) ((volatile char *)p)[0] = 1;
        pfree(s, pool, p);
    }
    done(pool);
}

/* ---- many threads, pointers freed by other threads ---- */

enum { XCHG_SLOTS = 64, LOCAL_SLOTS = 16 };

typedef struct block {
    void *p;
    size_t size;
    uint64_t seed;
} block_t;

typedef struct xchg {
    pthread_mutex_t lock;
    block_t slot[XCHG_SLOTS];
    int count;
} xchg_t;

typedef struct qthread_arg {
    qsuite_t *s;
    hm_pool_t *pool;
    xchg_t *x;
    pthread_barrier_t *start;
    int id, iters;
    size_t max_size;
} qthread_arg_t;

static uint64_t xorshift(uint64_t *st) {
    /* Marsaglia, "Xorshift RNGs", J. Stat. Softw. 8(14), 2003. */
    uint64_t x = *st;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *st = x;
}

static void release(qthread_arg_t *a, block_t *b, int touch) {
    if (touch)
        CHECK_MSG(hm_test_verify(b->p, b->size, b->seed), "thread %d: %p (%zu bytes) clobbered",
                  a->id, b->p, b->size);
    pfree(a->s, a->pool, b->p);
    b->p = NULL;
}

static void *pool_worker(void *argp) {
    qthread_arg_t *a = argp;
    hm_pool_t *pool = a->pool;
    int touch = cpu(pool);
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(a->id + 1) * 0x100000001b3ull);
    block_t local[LOCAL_SLOTS];
    memset(local, 0, sizeof(local));
    pthread_barrier_wait(a->start);
    for (int i = 0; i < a->iters; i++) {
        uint64_t r = xorshift(&rng);
        int k = (int)(r % LOCAL_SLOTS);
        if (local[k].p) release(a, &local[k], touch);
        /* Size mix: mostly small, some medium, a few large. */
        size_t size;
        unsigned pick = (unsigned)((r >> 8) % 100);
        if (pick < 70) size = (size_t)((r >> 16) % 256) + 1;
        else if (pick < 95) size = (size_t)((r >> 16) % (16 * KIB)) + 1;
        else size = (size_t)((r >> 16) % (256 * KIB)) + 1;
        if (size > a->max_size) size = (size_t)((r >> 16) % a->max_size) + 1;
        void *p;
        unsigned how = (unsigned)((r >> 40) % 8);
        errno = 0;
        if (how == 0) p = hm_pool_aligned_malloc(pool, size, (size_t)64 << ((r >> 44) % 7));
        else if (how == 1 && touch) p = hm_pool_calloc(pool, 1, size);
        else p = hm_pool_malloc(pool, size);
        CHECK_MSG(p != NULL, "thread %d: alloc(%zu) -> NULL errno %d", a->id, size, errno);
        if (!p) continue;
        block_t b = {.p = p, .size = size, .seed = ((uint64_t)a->id << 40) ^ (uint64_t)i};
        if (touch) hm_test_fill(p, size, b.seed);
        /* Realloc now and then (CPU memory: the pattern must survive). */
        if (touch && how == 2 && !a->s->free_unsupported) {
            size_t ns = size / 2 + 1;
            void *q = hm_pool_realloc(pool, p, ns);
            CHECK_MSG(q != NULL, "thread %d: realloc -> NULL errno %d", a->id, errno);
            if (q) {
                CHECK(hm_test_verify(q, ns, b.seed));
                b.p = q;
                b.size = ns;
            }
        }
        /* A third of the blocks go to another thread to free. */
        if ((r >> 50) % 3 == 0) {
            pthread_mutex_lock(&a->x->lock);
            if (a->x->count < XCHG_SLOTS) {
                a->x->slot[a->x->count++] = b;
                b.p = NULL;
            }
            pthread_mutex_unlock(&a->x->lock);
        }
        if (b.p) local[k] = b;
        /* And take one published by someone else. */
        if ((r >> 54) % 3 == 0) {
            block_t t = {0};
            pthread_mutex_lock(&a->x->lock);
            if (a->x->count > 0) t = a->x->slot[--a->x->count];
            pthread_mutex_unlock(&a->x->lock);
            if (t.p) release(a, &t, touch);
        }
    }
    for (int k = 0; k < LOCAL_SLOTS; k++)
        if (local[k].p) release(a, &local[k], touch);
    return NULL;
}

static void case_threads(qsuite_t *s) {
    set_case(s, "threads");
    hm_pool_t *pool = fresh(s);
    if (!pool) return;
    int n = s->threads > 64 ? 64 : s->threads;
    int iters = 2000;
#if defined(HM_TSAN)
    iters = 600;
#endif
    size_t max_size = 256 * KIB;
    if (bounded(pool) && s->free_unsupported) {
        /* Nothing comes back: every block costs at least a page for good. */
        size_t cap = s->capacity ? s->capacity : 16 * MIB;
        max_size = 4 * KIB;
        long fit = (long)(cap / 2 / (16 * KIB) / (size_t)n);
        if (fit < iters) iters = (int)(fit > 1 ? fit : 1);
    } else if (bounded(pool)) {
        max_size = 16 * KIB;
    }
    xchg_t x;
    memset(&x, 0, sizeof(x));
    pthread_mutex_init(&x.lock, NULL);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n);
    pthread_t tid[64];
    qthread_arg_t args[64];
    for (int i = 0; i < n; i++) {
        args[i] = (qthread_arg_t){.s = s, .pool = pool, .x = &x, .start = &start, .id = i,
                                  .iters = iters, .max_size = max_size};
        if (pthread_create(&tid[i], NULL, pool_worker, &args[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            abort();
        }
    }
    for (int i = 0; i < n; i++) pthread_join(tid[i], NULL);
    /* What is still published is freed here, by yet another thread. */
    qthread_arg_t main_arg = {.s = s, .pool = pool, .x = &x, .id = -1};
    for (int i = 0; i < x.count; i++) release(&main_arg, &x.slot[i], cpu(pool));
    pthread_barrier_destroy(&start);
    pthread_mutex_destroy(&x.lock);
    done(pool);
}

void hm_test_pool_suite(const char *label, hm_test_pool_factory make, void *arg,
                        const hm_test_suite_opts_t *opts) {
    hm_test_suite_opts_t o = {0};
    if (opts) o = *opts;
    qsuite_t s = {
        .label = label ? label : "?",
        .make = make,
        .arg = arg,
        .max_alloc = o.max_alloc ? o.max_alloc : 64 * MIB,
        .max_alignment = o.max_alignment ? o.max_alignment : 2 * MIB,
        .capacity = o.capacity,
        .threads = o.threads > 0 ? o.threads : 4,
        .free_unsupported = o.free_unsupported,
    };
    printf("pool suite: %s\n", s.label);
    fflush(stdout);
    int before = hm_test_failed_count();
    case_create_destroy(&s);
    case_null_pool(&s);
    case_malloc(&s);
    case_calloc(&s);
    case_realloc(&s);
    case_aligned(&s);
    case_free_foreign(&s);
    case_leaks_at_destroy(&s);
    case_reuse(&s);
    case_threads(&s);
    hm_test_set_context(NULL);
    printf("pool suite: %s: %s\n", s.label, hm_test_failed_count() == before ? "ok" : "FAILED");
    fflush(stdout);
}
