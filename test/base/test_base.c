/* hetmem tests — results, versions, native errors, logging.
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

static _Atomic int sink_lines;
static char last_line[512];
static hm_log_level_t last_level;

static void sink(hm_log_level_t level, const char *line, void *arg) {
    CHECK(arg == (void *)&sink_lines);
    atomic_fetch_add(&sink_lines, 1);
    last_level = level;
    snprintf(last_line, sizeof(last_line), "%s", line);
}

static void test_results(void) {
    /* Every result has a distinct, non-empty message; unknown values too. */
    const hm_result_t all[] = {
#define X(name, value, msg) HM_##name,
        HM_RESULT_MAP(X)
#undef X
    };
    size_t n = sizeof(all) / sizeof(all[0]);
    CHECK(n >= 10);
    CHECK_EQ(HM_SUCCESS, 0);
    for (size_t i = 0; i < n; i++) {
        const char *s = hm_result_string(all[i]);
        CHECK(s && *s);
        if (i) CHECK_MSG(all[i] < 0, "error %d is negative", all[i]);
        for (size_t j = 0; j < i; j++) CHECK(strcmp(s, hm_result_string(all[j])) != 0);
    }
    CHECK(strcmp(hm_result_string((hm_result_t)12345), "unknown result code") == 0);
    CHECK_EQ(hm_version(), HM_VERSION);
    CHECK(strcmp(hm_version_string(), "0.1.0") == 0 || HM_VERSION != 100);
    CHECK(strcmp(hm_memory_kind_string(HM_MEMORY_DEVICE), "device") == 0);
    CHECK(strcmp(hm_memory_kind_string((hm_memory_kind_t)99), "unknown") == 0);
}

static void *native_thread(void *arg) {
    const char *msg = NULL;
    /* A fresh thread has no native error, whatever the main thread did. */
    CHECK_EQ(hm_last_native_error(&msg), 0);
    CHECK(msg && !*msg);
    return arg;
}

static void test_native_error(void) {
    hm_provider_t *os;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    void *p = NULL;
    /* Too big for any address space: refused before the OS is asked. */
    CHECK_RES(hm_provider_alloc(os, SIZE_MAX, 0, &p), HM_ERROR_OUT_OF_MEMORY);
    CHECK(p == NULL);
    /* Big enough to reach mmap and fail there with ENOMEM. */
    hm_result_t r = hm_provider_alloc(os, (size_t)1 << 60, 0, &p);
    CHECK(r == HM_ERROR_OUT_OF_MEMORY || r == HM_ERROR_DRIVER);
    const char *msg = NULL;
    int64_t code = hm_last_native_error(&msg);
    CHECK_EQ(code, ENOMEM);
    CHECK_MSG(msg && strstr(msg, "mmap"), "native error names the call: '%s'", msg ? msg : "");
    pthread_t t;
    pthread_create(&t, NULL, native_thread, NULL);
    pthread_join(t, NULL);
    CHECK_OK(hm_provider_destroy(os));
}

static void test_logging(void) {
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_sink(sink, (void *)&sink_lines);
    hm_log_set_level(HM_LOG_ERROR);
    /* A caller bug at a public entry point: an error code and one log line. */
    CHECK(hm_pool_malloc(NULL, 10) == NULL);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(atomic_load(&sink_lines), 1);
    CHECK_EQ(last_level, HM_LOG_ERROR);
    CHECK_MSG(strstr(last_line, "pool is NULL") != NULL, "line: %s", last_line);
    /* Below the threshold: silent. */
    hm_log_set_level(HM_LOG_OFF);
    CHECK(hm_pool_malloc(NULL, 10) == NULL);
    CHECK_EQ(atomic_load(&sink_lines), 1);
    /* A very long message is cut, not overflowed. */
    hm_log_set_level(HM_LOG_DEBUG);
    char big[2048];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    hm_provider_ops_t bad = {.version = HM_PROVIDER_OPS_VERSION, .name = big};
    hm_provider_t *p;
    CHECK_RES(hm_provider_create(&bad, NULL, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK(strlen(last_line) < 512);
    hm_log_set_sink(NULL, NULL);
    hm_log_set_level(old);
}

static void test_bad_ops(void) {
    hm_provider_t *p = (hm_provider_t *)0x1;
    CHECK_RES(hm_provider_create(NULL, NULL, &p), HM_ERROR_INVALID_ARGUMENT);
    hm_provider_ops_t v2 = *hm_os_provider_ops();
    v2.version = 99;
    CHECK_RES(hm_provider_create(&v2, NULL, &p), HM_ERROR_NOT_SUPPORTED);
    hm_pool_t *pool;
    CHECK_RES(hm_pool_create(hm_proxy_pool_ops(), (hm_provider_t *)&v2, NULL, 0, &pool),
              HM_ERROR_INVALID_ARGUMENT); /* not a live provider */
    CHECK_RES(hm_provider_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_pool_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_free(NULL), HM_SUCCESS);
    int local;
    CHECK_RES(hm_free(&local), HM_ERROR_INVALID_ARGUMENT);
    CHECK(hm_pool_by_ptr(&local) == NULL);
    hm_allocation_info_t info;
    CHECK_RES(hm_allocation_info(&local, &info), HM_ERROR_NOT_FOUND);
    CHECK_RES(hm_allocation_info(NULL, &info), HM_ERROR_INVALID_ARGUMENT);
}

int main(void) {
    test_results();
    test_native_error();
    test_logging();
    test_bad_ops();
    return hm_test_finish();
}
