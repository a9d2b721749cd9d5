/* hetmem tests — a tiny in-tree harness. SPDX-License-Identifier: MIT
 *
 * CHECK* record a failure (file:line and the expression) and go on;
 * REQUIRE* stop the test program at once. hm_test_finish() prints the
 * closing line "N passed, N failed" and returns the exit code for main().
 * HM_TEST_SKIP(...) prints why and exits 77 (CTest's SKIP_RETURN_CODE). */
#ifndef HM_TEST_HARNESS_H
#define HM_TEST_HARNESS_H

#include <hetmem/hetmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

void hm_test_record(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int hm_test_failed_count(void);
int hm_test_passed_count(void);
int hm_test_finish(void);
/* Label printed with failures (e.g. the suite and provider in use). */
void hm_test_set_context(const char *context);
/* Run this program again as a peer process: `self importer <fd> [extra]`,
 * where fd is its end of a SOCK_SEQPACKET socketpair. *fd receives this
 * process's end; returns the child's pid (stops the test on failure). */
int hm_test_spawn_importer(const char *self, const char *extra, int *fd);
/* Everything readable from fd until end of file (or cap - 1 bytes), as a
 * NUL-terminated string in buf; fd is closed. Returns the length. */
size_t hm_test_read_all(int fd, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#define CHECK(cond) hm_test_record(!!(cond), __FILE__, __LINE__, "%s", #cond)
#define CHECK_MSG(cond, ...) hm_test_record(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_EQ(a, b)                                                               \
    do {                                                                             \
        long long _a = (long long)(a), _b = (long long)(b);                          \
        hm_test_record(_a == _b, __FILE__, __LINE__, "%s == %s (%lld vs %lld)", #a, #b, \
                       _a, _b);                                                      \
    } while (0)
#define CHECK_RES(expr, expected)                                                    \
    do {                                                                             \
        hm_result_t _r = (expr), _e = (expected);                                    \
        hm_test_record(_r == _e, __FILE__, __LINE__, "%s -> %s, expected %s", #expr, \
                       hm_result_string(_r), hm_result_string(_e));                  \
    } while (0)
#define CHECK_OK(expr) CHECK_RES(expr, HM_SUCCESS)
#define REQUIRE(cond)                                                            \
    do {                                                                         \
        int _ok = !!(cond);                                                      \
        hm_test_record(_ok, __FILE__, __LINE__, "REQUIRE %s", #cond);            \
        if (!_ok) {                                                              \
            hm_test_finish();                                                    \
            exit(1);                                                             \
        }                                                                        \
    } while (0)
#define REQUIRE_OK(expr)                                                         \
    do {                                                                         \
        hm_result_t _r = (expr);                                                 \
        hm_test_record(_r == HM_SUCCESS, __FILE__, __LINE__, "REQUIRE %s -> %s", \
                       #expr, hm_result_string(_r));                             \
        if (_r != HM_SUCCESS) {                                                  \
            hm_test_finish();                                                    \
            exit(1);                                                             \
        }                                                                        \
    } while (0)
#define HM_TEST_SKIP(...)                        \
    do {                                         \
        printf("SKIP: ");                        \
        printf(__VA_ARGS__);                     \
        printf("\n");                            \
        fflush(stdout);                          \
        exit(77);                                \
    } while (0)

/* How long a test waits for something that can only fail by hanging (a
 * forked child, a peer process) before calling it hung: alarm() in such
 * children and the parent's bounded waits use it. Generous on purpose: a
 * sanitizer build on a loaded 2-CPU machine may be 20x slower than a quiet
 * Release run, and a real hang is caught all the same, only later. */
#define HM_TEST_HANG_SECONDS 300

/* Run a test phase and print how long it took (a slow phase shows in the
 * log; nothing is asserted about time). */
static inline double hm_test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#define HM_TEST_PHASE(call)                                    \
    do {                                                       \
        double t0_ = hm_test_now();                            \
        call;                                                  \
        printf("%-60s %.2f s\n", #call, hm_test_now() - t0_); \
    } while (0)

#endif
