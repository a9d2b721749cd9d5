/* hetmem tests — a small shared library that test_dl loads at run time.
 * SPDX-License-Identifier: MIT
 *
 * Like a driver, it exports an old entry point and its versioned successor
 * with another signature (hm_dltest_add truncates to 32 bits, as the
 * unversioned cuMemAlloc does; hm_dltest_add_v2 does not), so a test can
 * tell which one a lookup found. */
#include <stdint.h>

int hm_dltest_answer(void);
int32_t hm_dltest_add(int32_t a, int32_t b);
int64_t hm_dltest_add_v2(int64_t a, int64_t b);
extern int hm_dltest_constructed;

int hm_dltest_constructed;

__attribute__((constructor)) static void constructed(void) { hm_dltest_constructed++; }

int hm_dltest_answer(void) { return 42; }
int32_t hm_dltest_add(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
int64_t hm_dltest_add_v2(int64_t a, int64_t b) { return a + b; }
