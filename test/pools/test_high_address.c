/* hetmem tests — memory above the address widths hetmem's structures cover
 * (src/addr_width.h): the tracker 57 bits, the native pool's page map and
 * the jemalloc pool's extent map 48 bits, the proxy pool none.
 *
 * Each pool gets its memory from a fixed provider, through a fault provider
 * with no fault armed (which counts live ranges and misuse, so a range that is
 * not given back shows). A pool must refuse a provider range that reaches
 * beyond what it covers with HM_ERROR_NOT_SUPPORTED (NULL and ENOTSUP from the
 * malloc family) and one log line, give the range back, and keep working.
 *
 * Part "unit" (always runs): the fixed provider describes an address range
 * that is not mapped (fake_range): the high address of a real, mapped low
 * buffer with bit 48 (or 57) set, the address a 48-bit (57-bit) map would
 * confuse with the low buffer. Nothing may touch such memory: the pools must
 * refuse it before they do. A pool over the low buffer runs alongside and
 * must stay intact. The proxy pool has no address-keyed structure: it takes
 * the memory below 2^57 (the tracker's width) and, untracked, above.
 * Part "mapped": real memory above 2^48 from mmap with a hint (x86-64 and
 * arm64 Linux with 5-level or 52-bit page tables); skipped (77) where the
 * kernel places the mapping lower. SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <hetmem/pools/native.h>
#include <hetmem/pools/proxy.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#define MIB ((size_t)1 << 20)
#define LOW_SIZE (16 * MIB)
#define HIGH_SIZE (16 * MIB)
#define BIT48 ((uintptr_t)1 << 48)
#define BIT57 ((uintptr_t)1 << 57)

/* ---- log capture ---- */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_log[8192];
static int g_log_lines;

static void capture_sink(hm_log_level_t level, const char *line, void *arg) {
    (void)level, (void)arg;
    pthread_mutex_lock(&g_log_lock);
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", line);
    g_log_lines++;
    pthread_mutex_unlock(&g_log_lock);
}

static void log_start(void) {
    g_log[0] = 0;
    g_log_lines = 0;
    hm_log_set_sink(capture_sink, NULL);
    hm_log_set_level(HM_LOG_ERROR);
}

static void log_stop(void) {
    hm_log_set_level(HM_LOG_OFF);
    hm_log_set_sink(NULL, NULL);
}

/* Lines logged so far that contain what. */
static int log_count(const char *what) {
    int n = 0;
    for (const char *s = g_log; (s = strstr(s, what)) != NULL; s += strlen(what)) n++;
    return n;
}

/* ---- pools over a fault(fixed) provider ---- */

typedef enum { P_NATIVE, P_PROXY, P_JEMALLOC } pool_kind_t;
static const char *const kind_name[] = {"native", "proxy", "jemalloc"};

typedef struct setup {
    hm_provider_t *fixed, *fault;
    hm_pool_t *pool;
} setup_t;

/* 1: made; 0: this kind is not built (jemalloc). */
static int setup_make(setup_t *s, pool_kind_t kind, void *buf, size_t size, uint32_t flags) {
    memset(s, 0, sizeof *s);
#ifndef HM_TEST_JEMALLOC
    if (kind == P_JEMALLOC) return 0;
#endif
    REQUIRE_OK(hm_fixed_provider_create(buf, size, &s->fixed));
    hm_fault_params_t fp = {.inner = s->fixed, .own_inner = 1};
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &s->fault));
    switch (kind) {
    case P_NATIVE: REQUIRE_OK(hm_native_pool_create(s->fault, NULL, flags, &s->pool)); break;
    case P_PROXY: REQUIRE_OK(hm_proxy_pool_create(s->fault, flags, &s->pool)); break;
    case P_JEMALLOC:
#ifdef HM_TEST_JEMALLOC
        REQUIRE_OK(hm_jemalloc_pool_create(s->fault, NULL, flags, &s->pool));
#endif
        break;
    }
    return 1;
}

/* Nothing held from the provider, nothing misused; then destroy. */
static void setup_destroy(setup_t *s) {
    CHECK_OK(hm_pool_destroy(s->pool));
    CHECK_EQ(hm_fault_provider_live(s->fault), 0);
    CHECK_EQ(hm_fault_provider_misuse(s->fault), 0);
    CHECK_OK(hm_provider_destroy(s->fault));
}

/* The pool refuses what its provider hands out: small and large requests
 * fail with ENOTSUP, a log line names the limit, every range went back (the
 * provider holds no live range and can still hand out its whole buffer),
 * and the tracker knows none of it. what: the text of the log line. */
static void expect_refused(setup_t *s, uintptr_t base, size_t size, const char *what) {
    log_start();
    size_t sizes[] = {16, 4096, 100000, 4 * MIB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        errno = 0;
        void *p = hm_pool_malloc(s->pool, sizes[i]);
        CHECK_MSG(p == NULL, "%s: malloc(%zu) of memory at %#lx gave %p", hm_pool_name(s->pool),
                  sizes[i], (unsigned long)base, p);
        CHECK_MSG(errno == ENOTSUP, "%s: malloc(%zu): errno %d, expected ENOTSUP",
                  hm_pool_name(s->pool), sizes[i], errno);
        CHECK_EQ(hm_fault_provider_live(s->fault), 0);
    }
    errno = 0;
    CHECK(hm_pool_aligned_malloc(s->pool, 8192, 1 << 16) == NULL && errno == ENOTSUP);
    errno = 0;
    CHECK(hm_pool_calloc(s->pool, 100, 100) == NULL && errno == ENOTSUP);
    errno = 0;
    CHECK(hm_pool_realloc(s->pool, NULL, 3 * MIB) == NULL && errno == ENOTSUP);
    log_stop();
    CHECK_MSG(log_count(what) >= 1, "%s: no log line with '%s'; log:\n%s", hm_pool_name(s->pool),
              what, g_log);
    hm_pool_stats_t st;
    CHECK_OK(hm_pool_get_stats(s->pool, &st));
    CHECK_EQ(st.bytes_from_provider, 0);
    CHECK_EQ(st.provider_allocs, 0);
    CHECK(hm_pool_by_ptr((void *)base) == NULL);
    CHECK(hm_pool_by_ptr((void *)(base + size / 2)) == NULL);
    /* The whole page-aligned buffer is free again (nothing kept by the pool). */
    void *all;
    CHECK_OK(hm_provider_alloc(s->fault, size, 0, &all));
    CHECK((uintptr_t)all == base);
    CHECK_OK(hm_provider_free(s->fault, all, size));
}

/* The proxy pool over memory it may take: allocations in the range, known to
 * the tracker when tracked, freed back. Never touches the memory (it may be
 * a fake range). */
static void expect_taken(setup_t *s, uintptr_t base, size_t size, bool tracked) {
    void *p = hm_pool_malloc(s->pool, 3 * 4096);
    void *q = hm_pool_malloc(s->pool, 2 * MIB);
    CHECK(p && (uintptr_t)p >= base && (uintptr_t)p + 3 * 4096 <= base + size);
    CHECK(q && (uintptr_t)q >= base && (uintptr_t)q + 2 * MIB <= base + size);
    if (tracked) {
        CHECK(hm_pool_by_ptr(p) == s->pool);
        CHECK(hm_pool_by_ptr((char *)q + MIB) == s->pool);
    }
    CHECK_EQ(hm_pool_malloc_usable_size(s->pool, p), 3 * 4096);
    CHECK_EQ(hm_fault_provider_live(s->fault), 2);
    CHECK_OK(hm_pool_free(s->pool, p));
    CHECK_OK(hm_pool_free(s->pool, q));
    CHECK(hm_pool_by_ptr(p) == NULL);
    CHECK_EQ(hm_fault_provider_live(s->fault), 0);
}

/* Allocations of every kind of pool over the low buffer, filled; checked
 * intact (and freed) by check_low after the high pools ran. */
#define NLOW 64
typedef struct low {
    setup_t s;
    void *p[NLOW];
    size_t n[NLOW];
    int made;
} low_t;

static void fill_low(low_t *l, pool_kind_t kind, char *buf) {
    l->made = setup_make(&l->s, kind, buf, LOW_SIZE, 0);
    if (!l->made) return;
    for (int i = 0; i < NLOW; i++) {
        l->n[i] = i % 8 == 7 ? 300000 : (size_t)16 << (i % 8); /* 16 B .. 2 KiB, and large */
        l->p[i] = hm_pool_malloc(l->s.pool, l->n[i]);
        REQUIRE(l->p[i] != NULL);
        CHECK((char *)l->p[i] >= buf && (char *)l->p[i] + l->n[i] <= buf + LOW_SIZE);
        hm_test_fill(l->p[i], l->n[i], (uint64_t)kind * 1000 + (uint64_t)i);
    }
}

static void check_low(low_t *l, pool_kind_t kind) {
    if (!l->made) return;
    for (int i = 0; i < NLOW; i++) {
        CHECK_MSG(hm_test_verify(l->p[i], l->n[i], (uint64_t)kind * 1000 + (uint64_t)i),
                  "%s: block %d of the low pool was overwritten", kind_name[kind], i);
        CHECK(hm_pool_by_ptr(l->p[i]) == l->s.pool);
        CHECK_OK(hm_pool_free(l->s.pool, l->p[i]));
    }
    setup_destroy(&l->s);
}

/* ---- part "unit" ---- */

/* Addresses [low | bit, +HIGH_SIZE) for the low buffer of pool kind k: not
 * mapped (above 2^47 on x86-64 with 4-level paging, where nothing can be;
 * with 5-level paging only an mmap with a hint there could have mapped it),
 * and nothing touches them. Each kind gets the alias of its own low buffer:
 * jemalloc's extent map and the tracker are shared by every pool. */
static uintptr_t fake_range(char *low_buf, pool_kind_t k, uintptr_t bit) {
    return (uintptr_t)(low_buf + (size_t)k * LOW_SIZE) | bit;
}

static void test_unit(char *low_buf) {
    low_t low[3];
    for (int k = 0; k < 3; k++) fill_low(&low[k], (pool_kind_t)k, low_buf + (size_t)k * LOW_SIZE);

    /* In range: a fixed buffer of ordinary memory works under every pool
     * (the low pools above), and an allocation there is usable. */
    for (int k = 0; k < 3; k++) {
        if (!low[k].made) continue;
        hm_test_set_context(kind_name[k]);
        void *p = hm_pool_malloc(low[k].s.pool, 5000);
        CHECK(p != NULL);
        if (p) {
            memset(p, 0xa5, 5000);
            CHECK_OK(hm_pool_free(low[k].s.pool, p));
        }
    }

    uintptr_t h48 = fake_range(low_buf, P_NATIVE, BIT48);
    setup_t s;

    /* 2^48 and above: the native pool's page map does not cover it. */
    hm_test_set_context("native above 2^48");
    setup_make(&s, P_NATIVE, (void *)h48, HIGH_SIZE, 0);
    expect_refused(&s, h48, HIGH_SIZE, "beyond the 48-bit addresses its page map covers");
    setup_destroy(&s);
    /* Untracked: the same refusal, by the pool itself. */
    hm_test_set_context("native untracked above 2^48");
    setup_make(&s, P_NATIVE, (void *)h48, HIGH_SIZE, HM_POOL_FLAG_NO_TRACKING);
    expect_refused(&s, h48, HIGH_SIZE, "beyond the 48-bit addresses its page map covers");
    setup_destroy(&s);
    /* A range that starts below 2^48 and ends above: refused by its end. */
    hm_test_set_context("native across 2^48");
    uintptr_t across = BIT48 - 64 * 1024;
    setup_make(&s, P_NATIVE, (void *)across, 4 * MIB, 0);
    errno = 0;
    log_start();
    CHECK(hm_pool_malloc(s.pool, 2 * MIB) == NULL && errno == ENOTSUP);
    log_stop();
    CHECK(log_count("page map covers") == 1);
    CHECK_EQ(hm_fault_provider_live(s.fault), 0);
    setup_destroy(&s);

    /* 2^48: the jemalloc pool's extent map (LG_VADDR 48) does not cover it;
     * the alloc hook refuses and logs once per pool. */
    h48 = fake_range(low_buf, P_JEMALLOC, BIT48);
    if (setup_make(&s, P_JEMALLOC, (void *)h48, HIGH_SIZE, 0)) {
        hm_test_set_context("jemalloc above 2^48");
        expect_refused(&s, h48, HIGH_SIZE, "addresses of jemalloc's extent map; refused");
        CHECK_MSG(log_count("extent map") == 1, "logged %d times:\n%s", log_count("extent map"),
                  g_log);
        setup_destroy(&s);
        hm_test_set_context("jemalloc untracked above 2^48");
        setup_make(&s, P_JEMALLOC, (void *)h48, HIGH_SIZE, HM_POOL_FLAG_NO_TRACKING);
        expect_refused(&s, h48, HIGH_SIZE, "addresses of jemalloc's extent map; refused");
        setup_destroy(&s);
    }

    /* A block below 2^48 that cannot grow across it: realloc fails with
     * ENOTSUP and leaves the block as it was (nothing copied). */
    for (int k = 0; k < 3; k += 2) {
        if (!setup_make(&s, (pool_kind_t)k, (void *)(BIT48 - MIB), 8 * MIB, 0)) continue;
        hm_test_set_context(k == P_NATIVE ? "native realloc across 2^48"
                                          : "jemalloc realloc across 2^48");
        void *p = hm_pool_malloc(s.pool, 512 * 1024);
        CHECK(p != NULL && (uintptr_t)p < BIT48);
        errno = 0;
        log_start();
        CHECK(hm_pool_realloc(s.pool, p, 4 * MIB) == NULL && errno == ENOTSUP);
        log_stop();
        CHECK(log_count(k == P_NATIVE ? "page map covers" : "jemalloc's extent map") == 1);
        CHECK(hm_pool_by_ptr(p) == s.pool);
        CHECK(hm_pool_malloc_usable_size(s.pool, p) >= 512 * 1024);
        CHECK_OK(hm_pool_free(s.pool, p));
        setup_destroy(&s);
    }

    /* The proxy pool has no address-keyed structure: 2^48 is fine. */
    hm_test_set_context("proxy above 2^48");
    h48 = fake_range(low_buf, P_PROXY, BIT48);
    setup_make(&s, P_PROXY, (void *)h48, HIGH_SIZE, 0);
    expect_taken(&s, h48, HIGH_SIZE, true);
    setup_destroy(&s);

    /* 2^57 and above: the tracker does not cover it, so no tracked pool takes
     * it; an untracked proxy pool does. */
    uintptr_t h57;
    for (int k = 0; k < 3; k++) {
        h57 = fake_range(low_buf, (pool_kind_t)k, BIT57);
        if (!setup_make(&s, (pool_kind_t)k, (void *)h57, HIGH_SIZE, 0)) continue;
        hm_test_set_context(kind_name[k]);
        expect_refused(&s, h57, HIGH_SIZE, "beyond the 57-bit address space the tracker covers");
        setup_destroy(&s);
    }
    hm_test_set_context("proxy untracked above 2^57");
    h57 = fake_range(low_buf, P_PROXY, BIT57);
    setup_make(&s, P_PROXY, (void *)h57, HIGH_SIZE, HM_POOL_FLAG_NO_TRACKING);
    expect_taken(&s, h57, HIGH_SIZE, false);
    setup_destroy(&s);

    /* The low pools kept their blocks (a map that ignored the high bits would
     * have taken the fake ranges for the low buffers). */
    for (int k = 0; k < 3; k++) {
        hm_test_set_context(kind_name[k]);
        check_low(&low[k], (pool_kind_t)k);
    }
}

/* ---- part "mapped" ---- */

static void test_mapped(void) {
#ifdef HM_SANITIZE_BUILD
    /* ASan and TSan shadow only the application ranges of 4-level paging:
     * the test's own writes to memory above 2^48 would fault in the shadow. */
    HM_TEST_SKIP("sanitizer build: memory above 2^48 has no shadow");
#endif
    /* A hint above 2^48 that both 5-level x86-64 (user space below 2^56) and
     * 52-bit arm64 can give; without MAP_FIXED the kernel places the mapping
     * there only if its page tables reach that high. */
    void *hint = (void *)((uintptr_t)1 << 50);
    char *m = mmap(hint, HIGH_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        HM_TEST_SKIP("mmap(hint %p) failed (errno %d): no memory above 2^48 here", hint, errno);
    if ((uintptr_t)m < BIT48) {
        munmap(m, HIGH_SIZE);
        HM_TEST_SKIP("mmap(hint %p) gave %p: the kernel maps nothing above 2^48 (4-level page "
                     "tables)", hint, (void *)m);
    }
    printf("mapped %zu MiB at %p\n", HIGH_SIZE / MIB, (void *)m);
    memset(m, 0x5a, HIGH_SIZE);
    uintptr_t base = (uintptr_t)m;
    setup_t s;

    hm_test_set_context("native, mapped above 2^48");
    setup_make(&s, P_NATIVE, m, HIGH_SIZE, 0);
    expect_refused(&s, base, HIGH_SIZE, "page map covers");
    setup_destroy(&s);
    if (setup_make(&s, P_JEMALLOC, m, HIGH_SIZE, 0)) {
        hm_test_set_context("jemalloc, mapped above 2^48");
        expect_refused(&s, base, HIGH_SIZE, "jemalloc's extent map");
        setup_destroy(&s);
    }
    /* Nothing was written by the pools that refused. */
    for (size_t i = 0; i < HIGH_SIZE; i += 4096) CHECK(m[i] == 0x5a && m[i + 4095] == 0x5a);

    /* The proxy pool takes it, and the memory is usable. */
    hm_test_set_context("proxy, mapped above 2^48");
    setup_make(&s, P_PROXY, m, HIGH_SIZE, 0);
    expect_taken(&s, base, HIGH_SIZE, true);
    void *p = hm_pool_malloc(s.pool, MIB);
    REQUIRE(p != NULL);
    hm_test_fill(p, MIB, 48);
    CHECK(hm_test_verify(p, MIB, 48));
    CHECK_OK(hm_pool_free(s.pool, p));
    setup_destroy(&s);

    /* What hetmem maps itself (no hint) stays low even here: the os
     * provider's memory is taken by every pool. */
    hm_test_set_context("os provider on a kernel that maps above 2^48");
    hm_provider_t *os;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, HM_OS_PROT_READ | HM_OS_PROT_WRITE, &os));
    hm_pool_t *np;
    REQUIRE_OK(hm_native_pool_create(os, NULL, HM_POOL_FLAG_OWN_PROVIDER, &np));
    void *a = hm_pool_malloc(np, 64), *b = hm_pool_malloc(np, 8 * MIB);
    CHECK(a && (uintptr_t)a < BIT48 && b && (uintptr_t)b < BIT48);
    CHECK_OK(hm_pool_free(np, a));
    CHECK_OK(hm_pool_free(np, b));
    CHECK_OK(hm_pool_destroy(np));
    munmap(m, HIGH_SIZE);
}

int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : "unit";
    if (strcmp(part, "unit") == 0) {
        /* Three low buffers (one per kind of pool), ordinary memory below
         * 2^47: their addresses with bit 48 or 57 set are the fake ranges. */
        char *low = mmap(NULL, 3 * LOW_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
        REQUIRE(low != MAP_FAILED);
        REQUIRE((uintptr_t)low + 3 * LOW_SIZE <= BIT48);
        test_unit(low);
        munmap(low, 3 * LOW_SIZE);
    } else if (strcmp(part, "mapped") == 0) {
        test_mapped();
    } else {
        fprintf(stderr, "usage: %s [unit|mapped]\n", argv[0]);
        return 2;
    }
    return hm_test_finish();
}
