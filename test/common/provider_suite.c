/* hetmem tests — the provider conformance suite: every provider passes it.
 * SPDX-License-Identifier: MIT
 *
 * Each case makes a fresh provider through the caller's factory and destroys
 * it before the next case, so capacity-limited providers (a fixed buffer)
 * start every case full. Memory that is not CPU-accessible is never touched:
 * every load/store below is behind hm_provider_cpu_accessible(). */
#include "conformance.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#define MIB ((size_t)1 << 20)

/* ---- fill patterns (shared with the pool suite) ---- */

/* splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014): a cheap, well-mixed word per position. */
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte i of the pattern. Large buffers get the pattern at every 64th byte
 * and a memset elsewhere, so filling 64 MiB stays cheap under TSan while every
 * page is still written. */
#define DENSE_LIMIT ((size_t)256 << 10)
/* Above it, one word per SPARSE_STRIDE bytes. In sanitizer builds one per
 * 64 KiB: there the cost is faulting in each page and its shadow, and what
 * those builds look for (races, bad accesses) needs no page-by-page
 * pattern; Release checks every cache line. */
#if defined(HM_SANITIZE_BUILD)
#define SPARSE_STRIDE ((size_t)64 << 10)
#else
#define SPARSE_STRIDE ((size_t)64)
#endif

static inline unsigned char pattern_byte(uint64_t seed, size_t i) {
    return (unsigned char)(mix64(seed ^ (uint64_t)(i >> 3)) >> ((i & 7) * 8));
}

/* Dense fill and check a word at a time: byte i is byte i%8 of word i/8,
 * stored little-endian (what pattern_byte gives), so a word is one store and
 * one mix64 rather than eight of each (under ThreadSanitizer every store is
 * a call). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define WORDWISE 1
#else
#define WORDWISE 0
#endif
/* An 8-byte word where b is 8-aligned (one plain store: a sanitizer checks
 * it as one access), memcpy where it is not. */
typedef uint64_t __attribute__((may_alias)) word_t;
static inline void put_word(unsigned char *b, uint64_t w) {
    if (((uintptr_t)b & 7) == 0)
        *(word_t *)(void *)b = w;
    else
        memcpy(b, &w, 8);
}
static inline uint64_t get_word(const unsigned char *b) {
    uint64_t w;
    if (((uintptr_t)b & 7) == 0) return *(const word_t *)(const void *)b;
    memcpy(&w, b, 8);
    return w;
}

void hm_test_fill(void *p, size_t n, uint64_t seed) {
    unsigned char *b = p;
    if (n <= DENSE_LIMIT) {
        size_t i = 0;
        if (WORDWISE)
            for (; i + 8 <= n; i += 8) put_word(b + i, mix64(seed ^ (uint64_t)(i >> 3)));
        for (; i < n; i++) b[i] = pattern_byte(seed, i);
        return;
    }
    /* Large: one pattern word per SPARSE_STRIDE bytes and the last 8. */
    for (size_t i = 0; i + 8 <= n; i += SPARSE_STRIDE)
        put_word(b + i, mix64(seed ^ (uint64_t)(i >> 3)));
    put_word(b + n - 8, mix64(~seed ^ (uint64_t)n));
}

int hm_test_verify(const void *p, size_t n, uint64_t seed) {
    const unsigned char *b = p;
    if (n <= DENSE_LIMIT) {
        size_t i = 0;
        if (WORDWISE)
            for (; i + 8 <= n; i += 8)
                if (get_word(b + i) != mix64(seed ^ (uint64_t)(i >> 3))) return 0;
        for (; i < n; i++)
            if (b[i] != pattern_byte(seed, i)) return 0;
        return 1;
    }
    if (get_word(b + n - 8) != mix64(~seed ^ (uint64_t)n)) return 0;
    for (size_t i = 0; i + 8 <= n - 8; i += SPARSE_STRIDE) /* the words the tail left */
        if (get_word(b + i) != mix64(seed ^ (uint64_t)(i >> 3))) return 0;
    return 1;
}

/* ---- suite state ---- */

typedef struct psuite {
    const char *label;
    hm_test_provider_factory make;
    void *arg;
    size_t max_alloc, max_alignment, capacity;
    int threads, can_free, skip_huge;
    char context[256];
} psuite_t;

static void set_case(psuite_t *s, const char *name) {
    snprintf(s->context, sizeof(s->context), "provider suite %s: %s", s->label, name);
    hm_test_set_context(s->context);
}

static hm_provider_t *fresh(psuite_t *s) {
    hm_provider_t *p = NULL;
    hm_result_t r = s->make(s->arg, &p);
    CHECK_MSG(r == HM_SUCCESS && p, "factory -> %s", hm_result_string(r));
    return r == HM_SUCCESS ? p : NULL;
}

static void done(hm_provider_t *p) {
    if (p) CHECK_OK(hm_provider_destroy(p));
}

static int cpu(const hm_provider_t *p) { return hm_provider_cpu_accessible(p); }
static int frees(const hm_provider_t *p) { return !!(hm_provider_caps(p) & HM_PROVIDER_CAP_FREE); }

/* Expected answer of free: success, or NOT_SUPPORTED without the cap. */
static hm_result_t free_expect(const hm_provider_t *p) {
    return frees(p) ? HM_SUCCESS : HM_ERROR_NOT_SUPPORTED;
}

static int is_clear_error(hm_result_t r) { return r < 0 && r != HM_ERROR_UNKNOWN; }

/* Allocate, check alignment and (CPU memory) that all of it is writable and
 * keeps what was written, then free with the asked size. */
static void alloc_check_free(psuite_t *s, hm_provider_t *p, size_t size, size_t alignment,
                             uint64_t seed) {
    void *ptr = NULL;
    hm_result_t r = hm_provider_alloc(p, size, alignment, &ptr);
    CHECK_MSG(r == HM_SUCCESS && ptr, "alloc(%zu, align %zu) -> %s", size, alignment,
              hm_result_string(r));
    if (r != HM_SUCCESS || !ptr) return;
    size_t page = hm_provider_min_page_size(p);
    size_t want = alignment > page ? alignment : page;
    CHECK_MSG(((uintptr_t)ptr & (want - 1)) == 0, "alloc(%zu, align %zu) = %p not aligned to %zu",
              size, alignment, ptr, want);
    if (cpu(p)) {
        hm_test_fill(ptr, size, seed);
        CHECK_MSG(hm_test_verify(ptr, size, seed), "alloc(%zu, align %zu): content lost", size,
                  alignment);
    }
    CHECK_RES(hm_provider_free(p, ptr, size), free_expect(p));
}

/* ---- cases ---- */

static void case_create_destroy(psuite_t *s) {
    set_case(s, "create/destroy");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    CHECK_OK(hm_provider_destroy(p));
    /* Double destroy and NULL are caught by the front-end's handle registry. */
    CHECK_RES(hm_provider_destroy(p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);

    /* Creation with NULL arguments. */
    p = fresh(s);
    if (!p) return;
    const hm_provider_ops_t *ops = hm_provider_get_ops(p);
    CHECK(ops != NULL);
    hm_provider_t *q = (hm_provider_t *)(uintptr_t)1;
    CHECK_RES(hm_provider_create(NULL, NULL, &q), HM_ERROR_INVALID_ARGUMENT);
    if (ops) CHECK_RES(hm_provider_create(ops, NULL, NULL), HM_ERROR_INVALID_ARGUMENT);
    done(p);

    /* Several in a row (state must not leak between instances). */
    for (int i = 0; i < 3; i++) done(fresh(s));
}

static void case_info(psuite_t *s) {
    set_case(s, "get_info");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    hm_provider_info_t info;
    memset(&info, 0, sizeof(info));
    CHECK_OK(hm_provider_get_info(p, &info));
    CHECK_RES(hm_provider_get_info(NULL, &info), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_get_info(p, NULL), HM_ERROR_INVALID_ARGUMENT);

    CHECK(info.name != NULL && info.name[0] != '\0');
    CHECK(hm_provider_name(p) != NULL);
    if (info.name && hm_provider_name(p)) CHECK(strcmp(info.name, hm_provider_name(p)) == 0);
    size_t mp = info.min_page_size, rp = info.recommended_page_size;
    CHECK_MSG(mp && (mp & (mp - 1)) == 0, "min_page_size %zu is not a power of two", mp);
    CHECK_MSG(rp && (rp & (rp - 1)) == 0, "recommended_page_size %zu is not a power of two", rp);
    CHECK_MSG(rp >= mp, "recommended %zu < min %zu", rp, mp);
    CHECK_EQ(hm_provider_min_page_size(p), mp);
    CHECK_EQ(hm_provider_recommended_page_size(p), rp);
    CHECK_EQ(hm_provider_caps(p), info.caps);
    CHECK_EQ(hm_provider_memory_kind(p), info.kind);
    CHECK(info.kind == HM_MEMORY_HOST || info.kind == HM_MEMORY_HOST_PINNED ||
          info.kind == HM_MEMORY_DEVICE || info.kind == HM_MEMORY_SHARED);
    CHECK(hm_memory_kind_string(info.kind) != NULL);
    CHECK_EQ(cpu(p), !!(info.caps & HM_PROVIDER_CAP_CPU_ACCESS));
    if (info.kind == HM_MEMORY_HOST) CHECK_MSG(cpu(p), "host memory must be CPU-accessible");
    if (info.kind == HM_MEMORY_DEVICE) CHECK_MSG(!cpu(p), "device memory is CPU-accessible?");

    /* Caps never claim an op that is missing. */
    const hm_provider_ops_t *ops = hm_provider_get_ops(p);
    CHECK(ops != NULL && hm_provider_get_state(NULL) == NULL);
    if (ops) {
        CHECK(ops->version == HM_PROVIDER_OPS_VERSION);
        CHECK(ops->init && ops->fini && ops->get_info && ops->alloc);
        if (info.caps & HM_PROVIDER_CAP_FREE) CHECK(ops->free != NULL);
        if (info.caps & HM_PROVIDER_CAP_PURGE_LAZY) CHECK(ops->purge_lazy != NULL);
        if (info.caps & HM_PROVIDER_CAP_PURGE_FORCE) CHECK(ops->purge_force != NULL);
        if (info.caps & HM_PROVIDER_CAP_SPLIT_MERGE) CHECK(ops->split && ops->merge);
        if (info.caps & HM_PROVIDER_CAP_IPC)
            CHECK(ops->ipc.handle_size && ops->ipc.get && ops->ipc.put && ops->ipc.open &&
                  ops->ipc.close);
        /* FILL and COPY are exactly the ops. */
        CHECK_EQ(!!(info.caps & HM_PROVIDER_CAP_FILL), ops->fill != NULL);
        CHECK_EQ(!!(info.caps & HM_PROVIDER_CAP_COPY), ops->copy != NULL);
        if (!(info.caps & HM_PROVIDER_CAP_IPC)) CHECK(ops->ipc_compatible == NULL);
    }
    /* The device: none for host memory without a get_device op. */
    hm_device_id_t dev;
    memset(&dev, 0x5a, sizeof(dev));
    CHECK_OK(hm_provider_get_device(p, &dev));
    CHECK_RES(hm_provider_get_device(NULL, &dev), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_get_device(p, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_MSG(dev.ordinal >= -1, "device ordinal %d", (int)dev.ordinal);
    if (!dev.has_uuid) {
        static const uint8_t zero[HM_DEVICE_UUID_SIZE];
        CHECK(memcmp(dev.uuid, zero, sizeof(zero)) == 0);
    }
    if (ops && !ops->get_device) CHECK_EQ(dev.ordinal, -1);
    if (ops && !ops->get_device) CHECK(!dev.has_uuid);
    CHECK_MSG(frees(p) == !!s->can_free, "caps say free %s, the test expects %s",
              frees(p) ? "supported" : "unsupported", s->can_free ? "supported" : "unsupported");
    done(p);
}

static void case_null_args(psuite_t *s) {
    set_case(s, "NULL arguments");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    /* A failed alloc leaves *ptr NULL, whatever the reason. */
    void *ptr = (void *)(uintptr_t)1;
    CHECK_RES(hm_provider_alloc(NULL, 64, 0, &ptr), HM_ERROR_INVALID_ARGUMENT);
    CHECK(ptr == NULL);
    CHECK_RES(hm_provider_alloc(p, 64, 0, NULL), HM_ERROR_INVALID_ARGUMENT);
    ptr = (void *)(uintptr_t)1;
    CHECK_RES(hm_provider_alloc(p, 0, 0, &ptr), HM_ERROR_INVALID_ARGUMENT);
    CHECK(ptr == NULL);
    ptr = (void *)(uintptr_t)1;
    CHECK_RES(hm_provider_alloc(p, 64, 3, &ptr), HM_ERROR_INVALID_ALIGNMENT);
    CHECK(ptr == NULL);

    hm_result_t r = hm_provider_free(p, NULL, 4096);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || (!frees(p) && r == HM_ERROR_NOT_SUPPORTED),
              "free(NULL ptr) -> %s", hm_result_string(r));
    CHECK_RES(hm_provider_free(NULL, (void *)(uintptr_t)4096, 4096), HM_ERROR_INVALID_ARGUMENT);
    r = hm_provider_purge_lazy(p, NULL, 4096);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_NOT_SUPPORTED,
              "purge_lazy(NULL ptr) -> %s", hm_result_string(r));
    r = hm_provider_purge_force(p, NULL, 4096);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_NOT_SUPPORTED,
              "purge_force(NULL ptr) -> %s", hm_result_string(r));
    CHECK_RES(hm_provider_purge_lazy(NULL, (void *)(uintptr_t)4096, 4096),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_purge_force(NULL, (void *)(uintptr_t)4096, 4096),
              HM_ERROR_INVALID_ARGUMENT);
    r = hm_provider_split(p, NULL, 8192, 4096);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_NOT_SUPPORTED,
              "split(NULL ptr) -> %s", hm_result_string(r));
    r = hm_provider_merge(p, NULL, NULL, 8192);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_NOT_SUPPORTED,
              "merge(NULL) -> %s", hm_result_string(r));
    CHECK_RES(hm_provider_split(NULL, (void *)(uintptr_t)4096, 8192, 4096),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_merge(NULL, (void *)(uintptr_t)4096, (void *)(uintptr_t)8192, 8192),
              HM_ERROR_INVALID_ARGUMENT);
    /* Queries on NULL do not crash. */
    (void)hm_provider_name(NULL);
    CHECK(!hm_provider_cpu_accessible(NULL));
    CHECK_EQ(hm_provider_caps(NULL), 0);
    CHECK(hm_provider_get_ops(NULL) == NULL);
    done(p);
}

static void case_sizes(psuite_t *s) {
    set_case(s, "sizes");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    size_t page = hm_provider_min_page_size(p);
    int can = frees(p);
    const size_t sizes[] = {1, 2, 3, 7, 13, 100, 1000, 4095, 4097, 12345, 65537, 1 * MIB + 3};
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (sizes[i] > s->max_alloc) continue;
        alloc_check_free(s, p, sizes[i], 0, seed++);
    }
    /* Page multiples. */
    for (size_t n = 1; n <= 64 && n * page <= s->max_alloc; n *= 2) {
        alloc_check_free(s, p, n * page, 0, seed++);
        if (n * page + page <= s->max_alloc) alloc_check_free(s, p, n * page + page, 0, seed++);
    }
    /* The largest size: on its own provider when nothing can be freed. */
    if (!can) {
        done(p);
        p = fresh(s);
        if (!p) return;
    }
    alloc_check_free(s, p, s->max_alloc, 0, seed++);
    if (!can) {
        done(p);
        p = fresh(s);
        if (!p) return;
    }
    /* Several live at once, freed in another order than allocated. */
    void *live[16];
    size_t lsz[16];
    int n = 0;
    for (int i = 0; i < 16; i++) {
        lsz[i] = (size_t)(i + 1) * 1000 + (size_t)i;
        live[i] = NULL;
        hm_result_t r = hm_provider_alloc(p, lsz[i], 0, &live[i]);
        CHECK_MSG(r == HM_SUCCESS, "alloc(%zu) -> %s", lsz[i], hm_result_string(r));
        if (r == HM_SUCCESS && cpu(p)) hm_test_fill(live[i], lsz[i], 100 + (uint64_t)i);
        n++;
    }
    for (int i = 0; i < n; i += 2)
        if (live[i]) {
            if (cpu(p)) CHECK(hm_test_verify(live[i], lsz[i], 100 + (uint64_t)i));
            CHECK_RES(hm_provider_free(p, live[i], lsz[i]), free_expect(p));
        }
    for (int i = 1; i < n; i += 2)
        if (live[i]) {
            if (cpu(p)) CHECK(hm_test_verify(live[i], lsz[i], 100 + (uint64_t)i));
            CHECK_RES(hm_provider_free(p, live[i], lsz[i]), free_expect(p));
        }
    /* Distinct allocations never overlap (checked on CPU memory through
     * the patterns above; here by address for every provider). */
    done(p);
}

static void case_huge(psuite_t *s) {
    if (s->skip_huge) return;
    set_case(s, "huge sizes");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2, SIZE_MAX / 2 + 1,
                           SIZE_MAX - 4095, (size_t)1 << 62, (size_t)1 << 52};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        for (size_t a = 0; a <= (size_t)2 * MIB; a = a ? a * 512 : 4096) {
            void *ptr = NULL;
            hm_result_t r = hm_provider_alloc(p, huge[i], a, &ptr);
            CHECK_MSG(is_clear_error(r), "alloc(%zu, align %zu) -> %s, expected a clear error",
                      huge[i], a, hm_result_string(r));
            CHECK(ptr == NULL);
            if (r == HM_SUCCESS && ptr) (void)hm_provider_free(p, ptr, huge[i]);
        }
    }
    /* Capacity-limited providers: one byte more than everything fails. */
    if (s->capacity) {
        void *ptr = NULL;
        hm_result_t r = hm_provider_alloc(p, s->capacity + 1, 0, &ptr);
        CHECK_MSG(is_clear_error(r), "alloc(capacity + 1) -> %s", hm_result_string(r));
        if (r == HM_SUCCESS) (void)hm_provider_free(p, ptr, s->capacity + 1);
    }
    /* The provider still works after refusing. */
    alloc_check_free(s, p, 4096, 0, 7);
    done(p);
}

static void case_alignment(psuite_t *s) {
    set_case(s, "alignment");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    uint64_t seed = 1000;
    /* Alignment 0: the provider's page size. */
    alloc_check_free(s, p, 1, 0, seed++);
    for (size_t a = 1; a <= s->max_alignment; a *= 2) {
        if (!frees(p) && a >= 64 * 1024) { /* keep within capacity */
            done(p);
            p = fresh(s);
            if (!p) return;
        }
        size_t size = a <= s->max_alloc ? a : 4096;
        alloc_check_free(s, p, size, a, seed++);
        alloc_check_free(s, p, 1, a, seed++);
        if (a > 1 && a + 3 <= s->max_alloc && a <= 64 * 1024)
            alloc_check_free(s, p, a + 3, a, seed++);
    }
    /* Not a power of two. */
    const size_t bad[] = {3, 5, 6, 12, 24, 100, 4095, 4097, 3 * 4096, 3 * MIB, SIZE_MAX,
                          SIZE_MAX - 1, ((size_t)1 << 63) + 1};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        void *ptr = NULL;
        CHECK_RES(hm_provider_alloc(p, 4096, bad[i], &ptr), HM_ERROR_INVALID_ALIGNMENT);
        CHECK(ptr == NULL);
    }
    /* A power of two no address space can honour: a clear error. */
    void *ptr = NULL;
    hm_result_t r = hm_provider_alloc(p, 4096, (size_t)1 << 63, &ptr);
    CHECK_MSG(is_clear_error(r), "alloc(4096, align 2^63) -> %s", hm_result_string(r));
    if (r == HM_SUCCESS) (void)hm_provider_free(p, ptr, 4096);
    done(p);
}

static void case_free(psuite_t *s) {
    set_case(s, "free");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    /* Free answers consistently with the cap, for every size shape. */
    const size_t sizes[] = {1, 4096, 12345};
    for (size_t i = 0; i < 3; i++) {
        void *ptr = NULL;
        if (hm_provider_alloc(p, sizes[i], 0, &ptr) != HM_SUCCESS) {
            CHECK_MSG(0, "alloc(%zu) failed", sizes[i]);
            continue;
        }
        CHECK_RES(hm_provider_free(p, ptr, sizes[i]), free_expect(p));
    }
    /* Size 0 is refused before reaching the provider. */
    void *ptr = NULL;
    if (hm_provider_alloc(p, 4096, 0, &ptr) == HM_SUCCESS) {
        hm_result_t r = hm_provider_free(p, ptr, 0);
        CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || (!frees(p) && r == HM_ERROR_NOT_SUPPORTED),
                  "free(ptr, 0) -> %s", hm_result_string(r));
        CHECK_RES(hm_provider_free(p, ptr, 4096), free_expect(p));
    }
    /* Freed memory is reused or returned: many rounds stay within capacity. */
    if (frees(p)) {
        size_t sz = s->max_alloc / 4 ? s->max_alloc / 4 : 4096;
        int rounds = s->capacity ? (int)(4 * s->capacity / sz) + 1 : 16;
        if (rounds > 64) rounds = 64;
        for (int i = 0; i < rounds; i++) {
            ptr = NULL;
            hm_result_t r = hm_provider_alloc(p, sz, 0, &ptr);
            CHECK_MSG(r == HM_SUCCESS, "round %d: alloc(%zu) -> %s", i, sz, hm_result_string(r));
            if (r != HM_SUCCESS) break;
            CHECK_OK(hm_provider_free(p, ptr, sz));
        }
    }
    done(p);
}

static void case_purge(psuite_t *s) {
    set_case(s, "purge");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    uint32_t caps = hm_provider_caps(p);
    size_t page = hm_provider_min_page_size(p);
    size_t size = 4 * (page > 4096 ? page : 4096);
    void *ptr = NULL;
    hm_result_t r = hm_provider_alloc(p, size, 0, &ptr);
    CHECK_MSG(r == HM_SUCCESS, "alloc -> %s", hm_result_string(r));
    if (r != HM_SUCCESS) {
        done(p);
        return;
    }
    if (cpu(p)) hm_test_fill(ptr, size, 42);
    CHECK_RES(hm_provider_purge_lazy(p, ptr, size),
              (caps & HM_PROVIDER_CAP_PURGE_LAZY) ? HM_SUCCESS : HM_ERROR_NOT_SUPPORTED);
    /* After a lazy purge the memory holds the old data or zeros; it stays usable. */
    if (cpu(p)) {
        hm_test_fill(ptr, size, 43);
        CHECK(hm_test_verify(ptr, size, 43));
    }
    CHECK_RES(hm_provider_purge_force(p, ptr, size),
              (caps & HM_PROVIDER_CAP_PURGE_FORCE) ? HM_SUCCESS : HM_ERROR_NOT_SUPPORTED);
    if (cpu(p)) {
        hm_test_fill(ptr, size, 44);
        CHECK(hm_test_verify(ptr, size, 44));
    }
    /* Purging twice is harmless. */
    CHECK_RES(hm_provider_purge_force(p, ptr, size),
              (caps & HM_PROVIDER_CAP_PURGE_FORCE) ? HM_SUCCESS : HM_ERROR_NOT_SUPPORTED);
    r = hm_provider_purge_lazy(p, ptr, 0);
    CHECK_MSG(r == HM_ERROR_INVALID_ARGUMENT || r == HM_ERROR_NOT_SUPPORTED,
              "purge_lazy(size 0) -> %s", hm_result_string(r));
    CHECK_RES(hm_provider_free(p, ptr, size), free_expect(p));
    done(p);
}

static void case_split_merge(psuite_t *s) {
    set_case(s, "split/merge");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    size_t page = hm_provider_min_page_size(p);
    if (page < 4096) page = 4096;
    size_t total = 4 * page;
    void *ptr = NULL;
    hm_result_t r = hm_provider_alloc(p, total, 0, &ptr);
    CHECK_MSG(r == HM_SUCCESS, "alloc -> %s", hm_result_string(r));
    if (r != HM_SUCCESS) {
        done(p);
        return;
    }
    char *c = ptr;
    if (!(hm_provider_caps(p) & HM_PROVIDER_CAP_SPLIT_MERGE)) {
        CHECK_RES(hm_provider_split(p, ptr, total, page), HM_ERROR_NOT_SUPPORTED);
        CHECK_RES(hm_provider_merge(p, ptr, c + page, total), HM_ERROR_NOT_SUPPORTED);
        CHECK_RES(hm_provider_free(p, ptr, total), free_expect(p));
        done(p);
        return;
    }
    if (cpu(p)) hm_test_fill(ptr, total, 9);
    /* Bad split points. */
    CHECK_RES(hm_provider_split(p, ptr, total, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_split(p, ptr, total, total), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_merge(p, ptr, ptr, total), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_merge(p, ptr, c + total, total), HM_ERROR_INVALID_ARGUMENT);
    /* Split, merge back: data kept. */
    CHECK_OK(hm_provider_split(p, ptr, total, page));
    CHECK_OK(hm_provider_merge(p, ptr, c + page, total));
    if (cpu(p)) CHECK(hm_test_verify(ptr, total, 9));
    /* Split in three, free each part on its own. */
    CHECK_OK(hm_provider_split(p, ptr, total, page));
    CHECK_OK(hm_provider_split(p, c + page, total - page, page));
    if (cpu(p)) CHECK(hm_test_verify(ptr, total, 9));
    CHECK_RES(hm_provider_free(p, c + page, page), free_expect(p));
    CHECK_RES(hm_provider_free(p, ptr, page), free_expect(p));
    CHECK_RES(hm_provider_free(p, c + 2 * page, total - 2 * page), free_expect(p));
    done(p);
}

/* fill and copy: the bytes, read back through copy (or the CPU). */
static int read_back(hm_provider_t *p, void *host, const void *mem, size_t n) {
    if (cpu(p)) {
        memcpy(host, mem, n);
        return 1;
    }
    hm_result_t r = hm_provider_copy(p, host, mem, n);
    CHECK_MSG(r == HM_SUCCESS, "copy of %zu bytes to the host -> %s", n, hm_result_string(r));
    return r == HM_SUCCESS;
}

static size_t count_not(const unsigned char *b, size_t n, unsigned char v) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += b[i] != v;
    return k;
}

static void case_fill_copy(psuite_t *s) {
    if (s->max_alloc < 4 * 4096) return;
    set_case(s, "fill/copy");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    uint32_t caps = hm_provider_caps(p);
    int fill = !!(caps & HM_PROVIDER_CAP_FILL), copy = !!(caps & HM_PROVIDER_CAP_COPY);
    const size_t n = 3 * 4096 + 17;
    void *a = NULL, *b = NULL;
    CHECK_OK(hm_provider_alloc(p, n, 0, &a));
    CHECK_OK(hm_provider_alloc(p, n, 0, &b));
    unsigned char *h = malloc(n), *h2 = malloc(n);
    REQUIRE(h && h2);
    if (!a || !b) goto out;
    /* Arguments, whatever the ops. */
    CHECK_RES(hm_provider_fill(NULL, a, 0, n), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_fill(p, NULL, 0, n), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_copy(NULL, a, h, n), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_copy(p, NULL, h, n), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_copy(p, a, NULL, n), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_copy(p, a, (char *)a + 1, n - 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_copy(p, (char *)a + 1, a, n - 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_fill(p, (void *)(UINTPTR_MAX - 15), 0, 32), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_fill(p, a, 0, 0), HM_SUCCESS);
    CHECK_RES(hm_provider_copy(p, a, h, 0), HM_SUCCESS);
    if (!fill) CHECK_RES(hm_provider_fill(p, a, 0, n), HM_ERROR_NOT_SUPPORTED);
    if (!copy) CHECK_RES(hm_provider_copy(p, a, h, n), HM_ERROR_NOT_SUPPORTED);
    if (fill && (copy || cpu(p))) {
        CHECK_OK(hm_provider_fill(p, a, 0xc3, n));
        if (read_back(p, h, a, n)) CHECK_EQ(count_not(h, n, 0xc3), 0);
        /* An interior piece, unaligned. */
        CHECK_OK(hm_provider_fill(p, (char *)a + 5, 0, 4096));
        if (read_back(p, h, a, n)) {
            CHECK_EQ(count_not(h, 5, 0xc3), 0);
            CHECK_EQ(count_not(h + 5, 4096, 0), 0);
            CHECK_EQ(count_not(h + 5 + 4096, n - 5 - 4096, 0xc3), 0);
        }
    }
    if (copy) {
        /* host -> provider -> provider -> host */
        hm_test_fill(h, n, 77);
        CHECK_OK(hm_provider_copy(p, a, h, n));
        CHECK_OK(hm_provider_copy(p, b, a, n));
        memset(h2, 0, n);
        CHECK_OK(hm_provider_copy(p, h2, b, n));
        CHECK(hm_test_verify(h2, n, 77));
        /* Within one allocation, unaligned, not overlapping. */
        CHECK_OK(hm_provider_copy(p, (char *)a + 4096 + 3, (char *)a + 1, 4096));
        memset(h2, 0, n);
        CHECK_OK(hm_provider_copy(p, h2, a, n));
        CHECK(memcmp(h2 + 4096 + 3, h + 1, 4096) == 0);
        CHECK(memcmp(h2, h, 4096 + 3) == 0);
    }
out:
    free(h);
    free(h2);
    if (a) CHECK_RES(hm_provider_free(p, a, n), free_expect(p));
    if (b) CHECK_RES(hm_provider_free(p, b, n), free_expect(p));
    done(p);
}

/* ---- many threads at once ---- */

typedef struct pthread_arg {
    psuite_t *s;
    hm_provider_t *p;
    pthread_barrier_t *start;
    int id, iters;
} pthread_arg_t;

static uint64_t xorshift(uint64_t *st) {
    /* Marsaglia, "Xorshift RNGs", J. Stat. Softw. 8(14), 2003. */
    uint64_t x = *st;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *st = x;
}

/* The threads case touches each block's first and last 64 KiB only: two
 * blocks handed out over each other share their first page (provider blocks
 * are page-aligned), and faulting in every page of multi-MiB blocks (GPU
 * providers' 2 MiB pages) would be most of the case's time. */
#define EDGE ((size_t)64 << 10)
static void edge_fill(void *p, size_t n, uint64_t seed) {
    if (n <= 2 * EDGE) {
        hm_test_fill(p, n, seed);
        return;
    }
    hm_test_fill(p, EDGE, seed);
    hm_test_fill((char *)p + n - EDGE, EDGE, ~seed);
}
static int edge_verify(const void *p, size_t n, uint64_t seed) {
    if (n <= 2 * EDGE) return hm_test_verify(p, n, seed);
    return hm_test_verify(p, EDGE, seed) && hm_test_verify((const char *)p + n - EDGE, EDGE, ~seed);
}

static void *provider_worker(void *argp) {
    pthread_arg_t *a = argp;
    hm_provider_t *p = a->p;
    int can = frees(p), touch = cpu(p);
    size_t page = hm_provider_min_page_size(p);
    uint64_t rng = 0x1234567ull * (uint64_t)(a->id + 1);
    enum { SLOTS = 8 };
    void *ptr[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    uint64_t seed[SLOTS] = {0};
    pthread_barrier_wait(a->start);
    for (int i = 0; i < a->iters; i++) {
        int k = (int)(xorshift(&rng) % SLOTS);
        if (ptr[k]) {
            if (touch)
                CHECK_MSG(edge_verify(ptr[k], sz[k], seed[k]),
                          "thread %d: allocation %p (%zu bytes) overwritten", a->id, ptr[k],
                          sz[k]);
            if (can) CHECK_OK(hm_provider_free(p, ptr[k], sz[k]));
            ptr[k] = NULL;
        }
        uint64_t r = xorshift(&rng);
        size_t size = can ? (size_t)(r % (4 * page)) + 1 : (size_t)(r % page) + 1;
        size_t align = (r >> 32) % 4 == 0 ? (size_t)1 << ((r >> 40) % 17) : 0;
        if (!can) align = 0;
        hm_result_t res = hm_provider_alloc(p, size, align, &ptr[k]);
        CHECK_MSG(res == HM_SUCCESS, "thread %d: alloc(%zu, %zu) -> %s", a->id, size, align,
                  hm_result_string(res));
        if (res != HM_SUCCESS) {
            ptr[k] = NULL;
            continue;
        }
        if (align) CHECK(((uintptr_t)ptr[k] & (align - 1)) == 0);
        sz[k] = size;
        seed[k] = ((uint64_t)a->id << 32) | (uint64_t)i;
        if (touch) edge_fill(ptr[k], size, seed[k]);
    }
    for (int k = 0; k < SLOTS; k++)
        if (ptr[k]) {
            if (touch) CHECK(edge_verify(ptr[k], sz[k], seed[k]));
            if (can) CHECK_OK(hm_provider_free(p, ptr[k], sz[k]));
        }
    return NULL;
}

static void case_threads(psuite_t *s) {
    set_case(s, "threads");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    int n = s->threads;
    int iters = 400;
#if defined(HM_TSAN)
    iters = 150;
#endif
    if (!frees(p)) {
        /* Every allocation stays until destroy: fit the capacity. */
        size_t page = hm_provider_min_page_size(p);
        size_t per = page < 4096 ? 4096 : page;
        size_t cap = s->capacity ? s->capacity : 16 * MIB;
        long fit = (long)(cap / 2 / (per * 2) / (size_t)n);
        if (fit < iters) iters = (int)(fit > 1 ? fit : 1);
    }
    pthread_t tid[64];
    pthread_arg_t args[64];
    if (n > 64) n = 64;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        args[i] = (pthread_arg_t){.s = s, .p = p, .start = &start, .id = i, .iters = iters};
        if (pthread_create(&tid[i], NULL, provider_worker, &args[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            abort();
        }
    }
    for (int i = 0; i < n; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&start);
    done(p);
}

static void case_exhaust(psuite_t *s) {
    if (!s->capacity) return;
    set_case(s, "exhaustion");
    hm_provider_t *p = fresh(s);
    if (!p) return;
    size_t chunk = s->capacity / 8;
    if (chunk < 4096) chunk = 4096;
    void *ptrs[64];
    int n = 0;
    hm_result_t r = HM_SUCCESS;
    while (n < 64) {
        r = hm_provider_alloc(p, chunk, 0, &ptrs[n]);
        if (r != HM_SUCCESS) break;
        n++;
    }
    CHECK_MSG(r == HM_ERROR_OUT_OF_MEMORY, "exhausting %zu bytes in %zu-byte chunks -> %s",
              s->capacity, chunk, hm_result_string(r));
    CHECK_MSG(n >= 1 && (size_t)n <= s->capacity / chunk, "%d chunks of %zu from %zu bytes", n,
              chunk, s->capacity);
    if (frees(p)) {
        for (int i = 0; i < n; i++) CHECK_OK(hm_provider_free(p, ptrs[i], chunk));
        void *again = NULL;
        CHECK_OK(hm_provider_alloc(p, chunk, 0, &again));
        if (again) CHECK_OK(hm_provider_free(p, again, chunk));
    }
    done(p);
}

void hm_test_provider_suite(const char *label, hm_test_provider_factory make, void *arg,
                            const hm_test_suite_opts_t *opts) {
    hm_test_suite_opts_t o = {0};
    if (opts) o = *opts;
    psuite_t s = {
        .label = label ? label : "?",
        .make = make,
        .arg = arg,
        .max_alloc = o.max_alloc ? o.max_alloc : 64 * MIB,
        .max_alignment = o.max_alignment ? o.max_alignment : 2 * MIB,
        .capacity = o.capacity,
        .threads = o.threads > 0 ? o.threads : 4,
        .can_free = o.can_free,
        .skip_huge = o.skip_huge,
    };
    printf("provider suite: %s\n", s.label);
    fflush(stdout);
    int before = hm_test_failed_count();
    case_create_destroy(&s);
    case_info(&s);
    case_null_args(&s);
    case_sizes(&s);
    case_huge(&s);
    case_alignment(&s);
    case_free(&s);
    case_purge(&s);
    case_split_merge(&s);
    case_fill_copy(&s);
    case_exhaust(&s);
    case_threads(&s);
    hm_test_set_context(NULL);
    printf("provider suite: %s: %s\n", s.label,
           hm_test_failed_count() == before ? "ok" : "FAILED");
    fflush(stdout);
}
