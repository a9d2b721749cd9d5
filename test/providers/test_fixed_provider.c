/* hetmem tests — the fixed provider. SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <stdlib.h>

#define BUF_SIZE (64u << 20)
static char *buffer;

static hm_result_t make_fixed(void *arg, hm_provider_t **out) {
    return hm_fixed_provider_create(buffer, BUF_SIZE, out);
}

static void test_specific(void) {
    hm_provider_t *p;
    CHECK_RES(hm_fixed_provider_create(NULL, 4096, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_fixed_provider_create(buffer, 0, &p), HM_ERROR_INVALID_ARGUMENT);
    /* A buffer that holds no whole page once its start is aligned. */
    CHECK_RES(hm_fixed_provider_create(buffer + 1, 4096, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_create(hm_fixed_provider_ops(), NULL, &p), HM_ERROR_INVALID_ARGUMENT);

    /* An unaligned buffer: memory comes from its page-aligned inside only. */
    REQUIRE_OK(hm_fixed_provider_create(buffer + 100, 5 * 4096, &p));
    hm_provider_info_t info;
    CHECK_OK(hm_provider_get_info(p, &info));
    CHECK(strcmp(info.name, "fixed") == 0);
    CHECK_EQ(info.family, HM_PROVIDER_FAMILY_FIXED);
    CHECK_EQ(info.min_page_size, 4096);
    CHECK(info.caps & HM_PROVIDER_CAP_FREE); /* through the coarse layer */
    CHECK(info.caps & HM_PROVIDER_CAP_SPLIT_MERGE);
    CHECK(!(info.caps & (HM_PROVIDER_CAP_PURGE_LAZY | HM_PROVIDER_CAP_PURGE_FORCE)));
    CHECK(info.caps & HM_PROVIDER_CAP_CPU_ACCESS);
    void *a[5] = {0};
    int got = 0;
    while (got < 5 && hm_provider_alloc(p, 1, 0, &a[got]) == HM_SUCCESS) {
        CHECK((uintptr_t)a[got] % 4096 == 0);
        CHECK((char *)a[got] >= buffer + 100 && (char *)a[got] + 4096 <= buffer + 100 + 5 * 4096);
        got++;
    }
    CHECK_EQ(got, 4); /* 5 pages minus the partial first one */
    void *x;
    CHECK_RES(hm_provider_alloc(p, 1, 0, &x), HM_ERROR_OUT_OF_MEMORY);
    /* Free, coalesce, reuse: free the middle two, then a 2-page allocation
     * fits exactly there; free everything and the whole 4 pages fit again. */
    CHECK_OK(hm_provider_free(p, a[1], 1));
    CHECK_RES(hm_provider_free(p, a[1], 1), HM_ERROR_DOUBLE_FREE);
    CHECK_RES(hm_provider_free(p, a[0], 8192), HM_ERROR_INVALID_ARGUMENT); /* wrong size */
    CHECK_OK(hm_provider_free(p, a[2], 4096));
    CHECK_OK(hm_provider_alloc(p, 8192, 0, &x));
    CHECK(x == a[1]);
    CHECK_OK(hm_provider_split(p, x, 8192, 4096));
    CHECK_OK(hm_provider_free(p, x, 4096));
    CHECK_OK(hm_provider_free(p, (char *)x + 4096, 4096));
    CHECK_OK(hm_provider_free(p, a[0], 4096));
    CHECK_OK(hm_provider_free(p, a[3], 4096));
    CHECK_OK(hm_provider_alloc(p, 4 * 4096, 0, &x));
    CHECK(x == a[0]);
    CHECK_OK(hm_provider_free(p, x, 4 * 4096));
    CHECK_OK(hm_provider_destroy(p));

    /* Alignment larger than the buffer allows: a clear error, nothing lost. */
    REQUIRE_OK(hm_fixed_provider_create(buffer, 1 << 20, &p));
    CHECK_RES(hm_provider_alloc(p, 4096, (size_t)1 << 30, &x), HM_ERROR_OUT_OF_MEMORY);
    CHECK_OK(hm_provider_alloc(p, 1 << 20, 0, &x)); /* still the whole buffer */
    CHECK_OK(hm_provider_destroy(p));

    /* Device-kind memory the CPU may not touch. */
    hm_fixed_params_t *fp;
    REQUIRE_OK(hm_fixed_params_create(buffer, 1 << 20, &fp));
    CHECK_OK(hm_fixed_params_set_memory_kind(fp, HM_MEMORY_DEVICE, false));
    CHECK_RES(hm_fixed_params_set_memory_kind(fp, (hm_memory_kind_t)42, false),
              HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_provider_create(hm_fixed_provider_ops(), fp, &p));
    CHECK_OK(hm_fixed_params_destroy(fp)); /* params are copied */
    CHECK_EQ(hm_provider_memory_kind(p), HM_MEMORY_DEVICE);
    CHECK(!hm_provider_cpu_accessible(p));
    CHECK_OK(hm_provider_destroy(p));
}

int main(void) {
    buffer = aligned_alloc(4096, BUF_SIZE);
    REQUIRE(buffer);
    test_specific();
    hm_test_suite_opts_t opts = {.max_alloc = 8u << 20, .max_alignment = 2u << 20, .can_free = 1,
                                  .capacity = BUF_SIZE};
    hm_test_provider_suite("fixed", make_fixed, NULL, &opts);
    free(buffer);
    return hm_test_finish();
}
