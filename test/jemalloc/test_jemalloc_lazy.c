/* hetmem tests — the private jemalloc sets itself up when the first jemalloc
 * pool is created, not when the library is loaded: a program that never makes
 * a jemalloc pool does not pay for it.
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <hetmem/pools/jemalloc.h>

int hm__jemalloc_started(void); /* src/pools/jemalloc/jemalloc.c */

int main(void) {
    hm_test_set_context("jemalloc set up at the first jemalloc pool");
    CHECK_MSG(!hm__jemalloc_started(), "jemalloc set up before any pool (load time)");
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    hm_pool_t *native;
    REQUIRE_OK(hm_native_pool_create(prov, NULL, 0, &native));
    void *p = hm_pool_malloc(native, 100);
    CHECK(p != NULL);
    CHECK_OK(hm_pool_free(native, p));
    CHECK_MSG(!hm__jemalloc_started(), "jemalloc set up by a native pool");
    CHECK_OK(hm_pool_destroy(native));

    hm_pool_t *je;
    REQUIRE_OK(hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &je));
    CHECK(hm__jemalloc_started());
    for (size_t size = 8; size <= (size_t)1 << 20; size *= 2) {
        p = hm_pool_malloc(je, size);
        CHECK(p != NULL);
        if (p) memset(p, 1, size);
        CHECK_OK(hm_pool_free(je, p));
    }
    CHECK_OK(hm_pool_destroy(je));
    return hm_test_finish();
}
