/* hetmem tests — the fault-injecting provider itself: it passes the provider
 * suite around the OS and fixed providers, counts calls, fails exactly the
 * call it was told to, and tracks live allocations. SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <pthread.h>
#include <sys/mman.h>

#define MIB ((size_t)1 << 20)
#define FIXED_SIZE (64 * MIB)

static void *fixed_buffer;
static void *device_buffer; /* PROT_NONE: any CPU access crashes the test */

static int wrap_nofree; /* wrap without a free op: a provider that cannot free */

static hm_result_t wrap(hm_provider_t *inner, hm_provider_t **out) {
    hm_fault_params_t fp = {.inner = inner, .own_inner = 1};
    hm_result_t r = hm_provider_create(
        wrap_nofree ? hm_fault_provider_nofree_ops() : hm_fault_provider_ops(), &fp, out);
    if (r != HM_SUCCESS) hm_provider_destroy(inner);
    return r;
}

static hm_result_t make_fault_os(void *arg, hm_provider_t **out) {
    hm_provider_t *os;
    hm_result_t r = hm_os_provider_create(NULL, &os);
    return r == HM_SUCCESS ? wrap(os, out) : r;
}

static hm_result_t make_fault_fixed(void *arg, hm_provider_t **out) {
    hm_provider_t *fx;
    hm_result_t r = hm_fixed_provider_create(fixed_buffer, FIXED_SIZE, &fx);
    return r == HM_SUCCESS ? wrap(fx, out) : r;
}

/* Device-kind memory behind the wrapper: the suite must never touch it. */
static hm_result_t make_fault_device(void *arg, hm_provider_t **out) {
    hm_fixed_params_t *params;
    hm_result_t r = hm_fixed_params_create(device_buffer, FIXED_SIZE, &params);
    if (r != HM_SUCCESS) return r;
    r = hm_fixed_params_set_memory_kind(params, HM_MEMORY_DEVICE, false);
    hm_provider_t *fx = NULL;
    if (r == HM_SUCCESS) r = hm_provider_create(hm_fixed_provider_ops(), params, &fx);
    hm_fixed_params_destroy(params);
    return r == HM_SUCCESS ? wrap(fx, out) : r;
}

static void test_params(void) {
    hm_test_set_context("fault params");
    hm_provider_t *p = NULL;
    CHECK_RES(hm_provider_create(hm_fault_provider_ops(), NULL, &p), HM_ERROR_INVALID_ARGUMENT);
    hm_fault_params_t fp = {0};
    CHECK_RES(hm_provider_create(hm_fault_provider_ops(), &fp, &p), HM_ERROR_INVALID_ARGUMENT);
    hm_provider_t *os;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    fp.inner = os;
    fp.fail_nth[HM_FAULT_FREE] = -2;
    CHECK_RES(hm_provider_create(hm_fault_provider_ops(), &fp, &p), HM_ERROR_INVALID_ARGUMENT);
    fp.fail_nth[HM_FAULT_FREE] = 0;
    fp.name = "wrapped-os";
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &p));
    CHECK(strcmp(hm_provider_name(p), "wrapped-os") == 0);
    /* Same memory, same caps as the inner provider. */
    CHECK_EQ(hm_provider_caps(p), hm_provider_caps(os));
    CHECK_EQ(hm_provider_memory_kind(p), hm_provider_memory_kind(os));
    CHECK_EQ(hm_provider_min_page_size(p), hm_provider_min_page_size(os));
    /* Queries on something that is not a fault provider. */
    CHECK_EQ(hm_fault_provider_calls(os, HM_FAULT_ALLOC), -1);
    CHECK_EQ(hm_fault_provider_live(os), -1);
    CHECK_EQ(hm_fault_provider_misuse(NULL), -1);
    CHECK_EQ(hm_fault_provider_calls(p, HM_FAULT_OP_COUNT), -1);
    hm_fault_provider_arm(os, HM_FAULT_ALLOC, 1); /* ignored, with a message */
    CHECK_OK(hm_provider_destroy(p));
    /* Not owned: the inner provider is still live. */
    void *x;
    CHECK_OK(hm_provider_alloc(os, 4096, 0, &x));
    CHECK_OK(hm_provider_free(os, x, 4096));
    CHECK_OK(hm_provider_destroy(os));
}

static void test_counting_and_injection(void) {
    hm_test_set_context("fault counting");
    hm_provider_t *os, *f;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    hm_fault_params_t fp = {.inner = os, .own_inner = 1, .fail_with = HM_ERROR_DRIVER};
    fp.fail_nth[HM_FAULT_ALLOC] = 3;
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &f));
    void *p[5] = {0};
    CHECK_OK(hm_provider_alloc(f, 4096, 0, &p[0]));
    CHECK_OK(hm_provider_alloc(f, 8192, 0, &p[1]));
    CHECK_RES(hm_provider_alloc(f, 4096, 0, &p[2]), HM_ERROR_DRIVER); /* the 3rd */
    CHECK(p[2] == NULL);
    CHECK_OK(hm_provider_alloc(f, 4096, 0, &p[2])); /* one-shot */
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_ALLOC), 4);
    CHECK_EQ(hm_fault_provider_injected(f), 1);
    CHECK_EQ(hm_fault_provider_live(f), 3);
    CHECK_EQ(hm_fault_provider_live_bytes(f), 4096 + 8192 + 4096);
    /* Calls the front-end refuses never reach the provider. */
    CHECK_RES(hm_provider_alloc(f, 0, 0, &p[3]), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_ALLOC), 4);

    /* Re-arm relative to now; -1 fails every call. */
    hm_fault_provider_arm(f, HM_FAULT_FREE, 2);
    CHECK_OK(hm_provider_free(f, p[0], 4096));
    CHECK_RES(hm_provider_free(f, p[1], 8192), HM_ERROR_DRIVER);
    CHECK_EQ(hm_fault_provider_live(f), 2); /* a failed free keeps it live */
    CHECK_OK(hm_provider_free(f, p[1], 8192));
    hm_fault_provider_arm(f, HM_FAULT_ALLOC, -1);
    for (int i = 0; i < 3; i++) CHECK_RES(hm_provider_alloc(f, 4096, 0, &p[3]), HM_ERROR_DRIVER);
    hm_fault_provider_arm(f, HM_FAULT_ALLOC, 0);
    CHECK_OK(hm_provider_alloc(f, 4096, 0, &p[3]));
    CHECK_EQ(hm_fault_provider_injected(f), 5);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_FREE), 3);

    /* Purge: counted, injected, forwarded. */
    uint32_t caps = hm_provider_caps(f);
    hm_fault_provider_arm(f, HM_FAULT_PURGE_LAZY, 1);
    CHECK_RES(hm_provider_purge_lazy(f, p[2], 4096), HM_ERROR_DRIVER);
    CHECK_RES(hm_provider_purge_lazy(f, p[2], 4096),
              (caps & HM_PROVIDER_CAP_PURGE_LAZY) ? HM_SUCCESS : HM_ERROR_NOT_SUPPORTED);
    CHECK_RES(hm_provider_purge_force(f, p[2], 4096),
              (caps & HM_PROVIDER_CAP_PURGE_FORCE) ? HM_SUCCESS : HM_ERROR_NOT_SUPPORTED);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_PURGE_LAZY), 2);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_PURGE_FORCE), 1);

    /* Misuse: unknown ranges and wrong sizes are refused, never forwarded. */
    CHECK_EQ(hm_fault_provider_misuse(f), 0);
    CHECK_RES(hm_provider_free(f, p[2], 8192), HM_ERROR_INVALID_ARGUMENT); /* wrong size */
    CHECK_RES(hm_provider_free(f, (char *)p[2] + 4096 * 100, 4096), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_purge_force(f, (char *)p[3] + 4096 * 100, 4096),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_fault_provider_misuse(f), 3);
    CHECK_EQ(hm_fault_provider_live(f), 2);
    CHECK_OK(hm_provider_free(f, p[2], 4096));
    CHECK_RES(hm_provider_free(f, p[2], 4096), HM_ERROR_INVALID_ARGUMENT); /* double free */
    CHECK_EQ(hm_fault_provider_misuse(f), 4);
    CHECK_OK(hm_provider_free(f, p[3], 4096));
    CHECK_EQ(hm_fault_provider_live(f), 0);
    CHECK_EQ(hm_fault_provider_live_bytes(f), 0);

    /* Split/merge keep the live table exact (where the inner provider can). */
    if (caps & HM_PROVIDER_CAP_SPLIT_MERGE) {
        void *q;
        REQUIRE_OK(hm_provider_alloc(f, 4 * 4096, 0, &q));
        char *c = q;
        hm_fault_provider_arm(f, HM_FAULT_SPLIT, 1);
        CHECK_RES(hm_provider_split(f, q, 4 * 4096, 4096), HM_ERROR_DRIVER);
        CHECK_EQ(hm_fault_provider_live(f), 1);
        CHECK_OK(hm_provider_split(f, q, 4 * 4096, 4096));
        CHECK_EQ(hm_fault_provider_live(f), 2);
        CHECK_RES(hm_provider_split(f, q, 4 * 4096, 2 * 4096), HM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(hm_provider_split(f, c + 4096, 3 * 4096, 4096));
        CHECK_EQ(hm_fault_provider_live(f), 3);
        hm_fault_provider_arm(f, HM_FAULT_MERGE, 1);
        CHECK_RES(hm_provider_merge(f, q, c + 4096, 2 * 4096), HM_ERROR_DRIVER);
        CHECK_OK(hm_provider_merge(f, q, c + 4096, 2 * 4096));
        CHECK_EQ(hm_fault_provider_live(f), 2);
        CHECK_RES(hm_provider_merge(f, q, c + 4096, 4 * 4096), HM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(hm_provider_merge(f, q, c + 2 * 4096, 4 * 4096));
        CHECK_EQ(hm_fault_provider_live(f), 1);
        CHECK_EQ(hm_fault_provider_live_bytes(f), 4 * 4096);
        CHECK_OK(hm_provider_free(f, q, 4 * 4096));
        CHECK_EQ(hm_fault_provider_live(f), 0);
    } else {
        CHECK_RES(hm_provider_split(f, (void *)(uintptr_t)4096, 8192, 4096),
                  HM_ERROR_NOT_SUPPORTED);
    }
    CHECK_OK(hm_provider_destroy(f)); /* and os with it */
}

/* Counters stay exact under concurrent calls. */
typedef struct targ {
    hm_provider_t *f;
    int iters;
} targ_t;

static void *hammer(void *arg) {
    targ_t *t = arg;
    for (int i = 0; i < t->iters; i++) {
        void *p;
        if (hm_provider_alloc(t->f, 4096, 0, &p) == HM_SUCCESS)
            CHECK_OK(hm_provider_free(t->f, p, 4096));
    }
    return NULL;
}

static void test_concurrent_counts(void) {
    hm_test_set_context("fault counters under threads");
    hm_provider_t *os, *f;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    hm_fault_params_t fp = {.inner = os, .own_inner = 1};
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &f));
    hm_fault_provider_arm(f, HM_FAULT_ALLOC, 500); /* exactly one of the 4 * 300 fails */
    enum { T = 4, ITERS = 300 };
    pthread_t tid[T];
    targ_t arg = {.f = f, .iters = ITERS};
    for (int i = 0; i < T; i++) REQUIRE(pthread_create(&tid[i], NULL, hammer, &arg) == 0);
    for (int i = 0; i < T; i++) pthread_join(tid[i], NULL);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_ALLOC), T * ITERS);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_FREE), T * ITERS - 1);
    CHECK_EQ(hm_fault_provider_injected(f), 1);
    CHECK_EQ(hm_fault_provider_live(f), 0);
    CHECK_EQ(hm_fault_provider_misuse(f), 0);
    CHECK_OK(hm_provider_destroy(f));
}

int main(void) {
    test_params();
    test_counting_and_injection();
    test_concurrent_counts();
    hm_test_set_context(NULL);

    hm_test_suite_opts_t os_opts = {.can_free = 1};
    hm_test_provider_suite("fault(os)", make_fault_os, NULL, &os_opts);

    fixed_buffer = mmap(NULL, FIXED_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                        0);
    REQUIRE(fixed_buffer != MAP_FAILED);
    hm_test_suite_opts_t fixed_opts = {
        .max_alloc = 8 * MIB, .max_alignment = 2 * MIB, .capacity = FIXED_SIZE, .can_free = 0};
    hm_test_provider_suite("fault(fixed)", make_fault_fixed, NULL, &os_opts);
    wrap_nofree = 1; /* the same memory through a wrapper that cannot free */
    hm_test_provider_suite("fault-nofree(fixed)", make_fault_fixed, NULL, &fixed_opts);

    device_buffer = mmap(NULL, FIXED_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
    REQUIRE(device_buffer != MAP_FAILED);
    hm_test_provider_suite("fault(fixed device-kind, PROT_NONE)", make_fault_device, NULL,
                           &fixed_opts);
    munmap(fixed_buffer, FIXED_SIZE);
    munmap(device_buffer, FIXED_SIZE);
    return hm_test_finish();
}
