/* hetmem tests — harness implementation. SPDX-License-Identifier: MIT */
#include "harness.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>

static _Atomic int passed, failed;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *_Atomic context;

void hm_test_set_context(const char *c) { atomic_store(&context, c); }

void hm_test_record(int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) {
        atomic_fetch_add(&passed, 1);
        return;
    }
    int n = atomic_fetch_add(&failed, 1);
    if (n >= 200) return; /* enough said */
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_lock);
    const char *c = atomic_load(&context);
    fprintf(stderr, "FAIL %s:%d%s%s%s: ", file, line, c ? " [" : "", c ? c : "", c ? "]" : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&out_lock);
    va_end(ap);
}

int hm_test_failed_count(void) { return atomic_load(&failed); }
int hm_test_passed_count(void) { return atomic_load(&passed); }

int hm_test_finish(void) {
    printf("checks: %d passed, %d failed\n", atomic_load(&passed), atomic_load(&failed));
    fflush(stdout);
    return atomic_load(&failed) ? 1 : 0;
}
