/* hetmem tests — the tracker across fork().
 * SPDX-License-Identifier: MIT
 *
 * With a reader thread busy in lookups and a writer churning, the process
 * forks (the library's atfork hooks run urcu_bp_before_fork and friends and
 * hold the tracker's retire-list locks); the child must find the parent's
 * ranges, and insert, remove and wait a grace period without deadlock. */
#include "harness.h"
#include "internal.h"
#include "tracker/tracker.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

static hm_tracker_index_t idx;
static char pool_tag;
static _Atomic int stop;
#define BASE 0x3f0000000000ull

static __attribute__((unused)) void *reader(void *arg) {
    (void)arg;
    unsigned i = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        hm__tracker_lookup((const void *)(BASE + (i++ % 64) * 8192), NULL);
    return NULL;
}

static __attribute__((unused)) void *writer(void *arg) {
    (void)arg;
    uintptr_t b = BASE + (1ull << 30);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int k = 0; k < 300; k++)
            hm__tracker_insert(&idx, (hm_pool_t *)(void *)&pool_tag, NULL, b + k * 100, 50, 0, NULL);
        for (int k = 0; k < 300; k++) hm__tracker_remove(b + k * 100, 50);
    }
    return NULL;
}

static int child_main(void) {
    int bad = 0;
    for (int k = 0; k < 64; k++)
        if (hm__tracker_lookup_pool((const void *)(BASE + k * 8192 + 5)) !=
            (hm_pool_t *)(void *)&pool_tag)
            bad++;
    for (int k = 0; k < 1000; k++) {
        if (hm__tracker_insert(&idx, NULL, NULL, BASE + (2ull << 30) + k * 4096, 4096, 0, NULL))
            bad++;
        if (hm__tracker_remove(BASE + (2ull << 30) + k * 4096, 4096)) bad++;
    }
    hm__tracker_flush(); /* a grace period in the child */
    return bad ? 1 : 0;
}

int main(void) {
    hm__init(); /* registers the atfork hooks */
    hm__tracker_index_init(&idx);
    for (int k = 0; k < 64; k++)
        REQUIRE_OK(hm__tracker_insert(&idx, (hm_pool_t *)(void *)&pool_tag, NULL, BASE + k * 8192,
                                      4096, 0, NULL));
    pthread_t r, w;
#ifndef HM_SANITIZE_BUILD
    REQUIRE(!pthread_create(&r, NULL, reader, NULL));
    REQUIRE(!pthread_create(&w, NULL, writer, NULL));
#else
    /* Sanitizer runtimes are not fork-safe with other threads running when
     * the child then starts one (urcu's call_rcu helper): TSan refuses, and
     * ASan's allocator lock may be held by a parent thread (seen: the child's
     * helper hung in ASan's allocator). Release builds run the threads. */
    (void)r;
    (void)w;
#endif
    for (int f = 0; f < 10; f++) {
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) _exit(child_main());
        int st = 0;
        REQUIRE(waitpid(pid, &st, 0) == pid);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork %d: child status %#x", f, st);
    }
    atomic_store(&stop, 1);
#ifndef HM_SANITIZE_BUILD
    pthread_join(r, NULL);
    pthread_join(w, NULL);
#endif
    hm__tracker_index_drain(&idx, NULL, NULL);
    hm__tracker_index_fini(&idx);
    return hm_test_finish();
}
