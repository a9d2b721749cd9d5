/* hetmem tests — the native pool's front-end entries (hm_pool.malloc_entry,
 * free_entry; see src/pool_internal.h): which one each pool gets. Behaviour
 * through them is covered by test_native_pool (test_null_and_zero, the pool
 * suite); this program checks what behaviour cannot show, that the free
 * entry that prefetches stacked blocks serves only pools over host memory
 * the CPU may touch (nv_pool.prefetch): a prefetch of device memory never
 * faults, so no allocation test could tell. It also checks that making IPC
 * state swaps in the front end's checking entry.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"
#include "harness.h"
#include "pool_internal.h"
#include "pools/native/native_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

#define MIB ((size_t)1 << 20)
#define FIXED_SIZE (16 * MIB)

typedef struct seen {
    hm_pool_t *pool;
    const char *what;
    bool prefetch;
    hm_pool_free_entry_t free_entry;
    hm_pool_malloc_entry_t malloc_entry;
} seen_t;

static void note(seen_t *s, hm_pool_t *pool, const char *what) {
    s->pool = pool;
    s->what = what;
    s->prefetch = ((const nv_pool_t *)pool->state)->prefetch;
    s->free_entry = atomic_load(&pool->free_entry);
    s->malloc_entry = pool->malloc_entry;
    /* Still a working pool through them. */
    void *p = hm_pool_malloc(pool, 40);
    CHECK_MSG(p != NULL, "%s: malloc", what);
    CHECK_MSG(hm_pool_free(pool, p) == HM_SUCCESS, "%s: free", what);
    CHECK_MSG(hm_pool_free(pool, NULL) == HM_SUCCESS, "%s: free(NULL)", what);
}

static hm_pool_t *os_pool(unsigned prot, uint32_t flags) {
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, prot, &prov));
    hm_pool_t *pool;
    REQUIRE_OK(hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER | flags, &pool));
    return pool;
}

static hm_pool_t *fixed_pool(void *buf, hm_memory_kind_t kind, bool cpu) {
    hm_provider_t *prov;
    REQUIRE_OK(hm_test_fixed_provider(buf, FIXED_SIZE, kind, cpu, &prov));
    hm_pool_t *pool;
    REQUIRE_OK(hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    return pool;
}

int main(void) {
    hm_test_set_context("native entries");
    void *buf1 = mmap(NULL, FIXED_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    void *buf2 = mmap(NULL, FIXED_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    REQUIRE(buf1 != MAP_FAILED && buf2 != MAP_FAILED);
    seen_t s[5];
    note(&s[0], os_pool(HM_OS_PROT_READ | HM_OS_PROT_WRITE, 0), "os read-write");
    note(&s[1], os_pool(HM_OS_PROT_READ | HM_OS_PROT_WRITE, HM_POOL_FLAG_NO_TRACKING),
         "os read-write, untracked");
    note(&s[2], fixed_pool(buf1, HM_MEMORY_HOST, true), "fixed host");
    note(&s[3], fixed_pool(buf2, HM_MEMORY_DEVICE, false), "fixed device");
    note(&s[4], os_pool(HM_OS_PROT_NONE, 0), "os PROT_NONE");
    size_t n = sizeof s / sizeof s[0];
    /* Host memory prefetches, device memory never. */
    CHECK(s[0].prefetch && s[1].prefetch && s[2].prefetch);
    CHECK(!s[3].prefetch);
    /* One free entry per prefetch mode, and the two differ: a pool whose
     * memory must not be prefetched never gets the host pools' entry. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            CHECK_MSG((s[i].free_entry == s[j].free_entry) == (s[i].prefetch == s[j].prefetch),
                      "%s (prefetch %d) and %s (prefetch %d): free entries %s", s[i].what,
                      s[i].prefetch, s[j].what, s[j].prefetch,
                      s[i].free_entry == s[j].free_entry ? "equal" : "differ");
    for (size_t i = 1; i < n; i++)
        CHECK_MSG(s[i].malloc_entry == s[0].malloc_entry, "%s: another malloc entry",
                  s[i].what);
    /* hm__pool_hold_frees (the IPC export side, while exports of the pool
     * have handles outstanding): the front end's own checks, for either
     * entry, and the pool's own entry back when they are put. */
    for (size_t i = 0; i < n; i += 3) {
        hm__pool_hold_frees(s[i].pool, true);
        CHECK_MSG(atomic_load(&s[i].pool->free_entry) != s[i].free_entry, "%s: entry kept",
                  s[i].what);
        void *p = hm_pool_malloc(s[i].pool, 40);
        CHECK(p != NULL);
        CHECK_OK(hm_pool_free(s[i].pool, p));
        CHECK_OK(hm_pool_free(s[i].pool, NULL));
        int local;
        hm_log_level_t old = hm_log_get_level();
        hm_log_set_level(HM_LOG_OFF);
        CHECK_RES(hm_pool_free(s[i].pool, &local), HM_ERROR_INVALID_ARGUMENT);
        hm_log_set_level(old);
        hm__pool_hold_frees(s[i].pool, false);
        CHECK_MSG(atomic_load(&s[i].pool->free_entry) == s[i].free_entry, "%s: entry not back",
                  s[i].what);
    }
    for (size_t i = 0; i < n; i++) CHECK_OK(hm_pool_destroy(s[i].pool));
    munmap(buf1, FIXED_SIZE);
    munmap(buf2, FIXED_SIZE);
    return hm_test_finish();
}
