/* hetmem tests — the one fork order (src/fork.h).
 * SPDX-License-Identifier: MIT
 *
 *   order   every fork runs the filled slots in slot order in prepare and in
 *           reverse in the parent and in the child; a module that starts
 *           late (jemalloc at its first pool) and hooks filled by this test
 *           into the two slots libhetmem leaves empty (the proxy's, first
 *           and last) run at their positions, not after the slots filled
 *           before them; IPC runs between the pools and the tracker.
 *   busy    threads fork, several at once, while others allocate and free
 *           in a native pool, a jemalloc pool and a shared native pool
 *           whose blocks they export and put: neither the parent nor a child
 *           (each doing work in every module, under an alarm) may hang.
 *   busy-nojemalloc  the same without the jemalloc pool, so that
 *           ThreadSanitizer's deadlock detector, which cannot follow
 *           jemalloc's prefork (more than 64 locks held), checks the order
 *           of the others against their ordinary use.
 * Without an argument: order. */
#include "harness.h"
#include "fork.h"

#include <hetmem/hetmem.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- order ---- */

/* What a fork's hooks leave to check, in one process (parent or child). */
typedef struct record {
    size_t n[3];
    hm_fork_slot_t s[3][HM_FORK_SLOTS];
    int nlog;
    int log[8]; /* this test's hooks: slot * 4 + phase */
} record_t;

static int g_log[8];
static _Atomic int g_nlog;
static void note(hm_fork_slot_t slot, hm_fork_phase_t phase) {
    int i = atomic_fetch_add(&g_nlog, 1);
    if (i < 8) g_log[i] = (int)slot * 4 + (int)phase;
}
static void first_prepare(void) { note(HM_FORK_PROXY_POOL, HM_FORK_PREPARE); }
static void first_parent(void) { note(HM_FORK_PROXY_POOL, HM_FORK_PARENT); }
static void first_child(void) { note(HM_FORK_PROXY_POOL, HM_FORK_CHILD); }
static void last_prepare(void) { note(HM_FORK_PROXY_SNAPSHOT, HM_FORK_PREPARE); }
static void last_parent(void) { note(HM_FORK_PROXY_SNAPSHOT, HM_FORK_PARENT); }
static void last_child(void) { note(HM_FORK_PROXY_SNAPSHOT, HM_FORK_CHILD); }
static const hm_fork_hooks_t first_hooks = {first_prepare, first_parent, first_child};
static const hm_fork_hooks_t last_hooks = {last_prepare, last_parent, last_child};

static void record_fill(record_t *r) {
    memset(r, 0, sizeof(*r));
    for (int p = 0; p < 3; p++)
        r->n[p] = hm__fork_trace((hm_fork_phase_t)p, r->s[p], HM_FORK_SLOTS);
    r->nlog = atomic_load(&g_nlog);
    memcpy(r->log, g_log, sizeof(r->log));
}

/* One fork; the child sends its record back through a pipe. */
static void fork_recorded(record_t *parent, record_t *child) {
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    atomic_store(&g_nlog, 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        alarm(HM_TEST_HANG_SECONDS);
        record_t r;
        record_fill(&r);
        ssize_t w = write(fd[1], &r, sizeof(r));
        _exit(w == (ssize_t)sizeof(r) ? 0 : 1);
    }
    record_fill(parent);
    close(fd[1]);
    memset(child, 0, sizeof(*child));
    size_t got = 0;
    while (got < sizeof(*child)) {
        ssize_t n = read(fd[0], (char *)child + got, sizeof(*child) - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 0 && got == sizeof(*child));
}

static int slot_index(const record_t *r, hm_fork_phase_t p, hm_fork_slot_t slot) {
    for (size_t i = 0; i < r->n[p]; i++)
        if (r->s[p][i] == slot) return (int)i;
    return -1;
}

/* The checks every fork passes: prepare in slot order, parent and child
 * its reverse, the child's prepare the parent's. */
static void check_order(const record_t *pa, const record_t *ch) {
    size_t n = pa->n[HM_FORK_PREPARE];
    CHECK(n > 0);
    for (size_t i = 1; i < n; i++)
        CHECK_MSG(pa->s[HM_FORK_PREPARE][i - 1] < pa->s[HM_FORK_PREPARE][i],
                  "prepare ran slot %d after slot %d", (int)pa->s[HM_FORK_PREPARE][i],
                  (int)pa->s[HM_FORK_PREPARE][i - 1]);
    CHECK_EQ(pa->n[HM_FORK_PARENT], n);
    CHECK_EQ(pa->n[HM_FORK_CHILD], 0);
    CHECK_EQ(ch->n[HM_FORK_PREPARE], n);
    CHECK_EQ(ch->n[HM_FORK_CHILD], n);
    CHECK_EQ(ch->n[HM_FORK_PARENT], 0);
    for (size_t i = 0; i < n && i < HM_FORK_SLOTS; i++) {
        hm_fork_slot_t s = pa->s[HM_FORK_PREPARE][i];
        CHECK_MSG(pa->s[HM_FORK_PARENT][n - 1 - i] == s, "parent: slot %d not at %zu", (int)s,
                  n - 1 - i);
        CHECK_MSG(ch->s[HM_FORK_CHILD][n - 1 - i] == s, "child: slot %d not at %zu", (int)s,
                  n - 1 - i);
        CHECK_MSG(ch->s[HM_FORK_PREPARE][i] == s, "child's prepare differs at %zu", i);
    }
}

/* This test's hooks in the first and last slots: they ran first and last in
 * prepare, and last and first after fork. */
static void check_test_hooks(const record_t *pa, const record_t *ch) {
    CHECK_EQ(slot_index(pa, HM_FORK_PREPARE, HM_FORK_PROXY_POOL), 0);
    CHECK_EQ(slot_index(pa, HM_FORK_PREPARE, HM_FORK_PROXY_SNAPSHOT),
             (int)pa->n[HM_FORK_PREPARE] - 1);
    const int want_pa[4] = {HM_FORK_PROXY_POOL * 4 + HM_FORK_PREPARE,
                            HM_FORK_PROXY_SNAPSHOT * 4 + HM_FORK_PREPARE,
                            HM_FORK_PROXY_SNAPSHOT * 4 + HM_FORK_PARENT,
                            HM_FORK_PROXY_POOL * 4 + HM_FORK_PARENT};
    const int want_ch[4] = {HM_FORK_PROXY_POOL * 4 + HM_FORK_PREPARE,
                            HM_FORK_PROXY_SNAPSHOT * 4 + HM_FORK_PREPARE,
                            HM_FORK_PROXY_SNAPSHOT * 4 + HM_FORK_CHILD,
                            HM_FORK_PROXY_POOL * 4 + HM_FORK_CHILD};
    CHECK_EQ(pa->nlog, 4);
    CHECK_EQ(ch->nlog, 4);
    for (int i = 0; i < 4; i++) {
        CHECK_MSG(pa->log[i] == want_pa[i], "parent's hook %d: %d, expected %d", i, pa->log[i],
                  want_pa[i]);
        CHECK_MSG(ch->log[i] == want_ch[i], "child's hook %d: %d, expected %d", i, ch->log[i],
                  want_ch[i]);
    }
}

static void check_has(const record_t *pa, const hm_fork_slot_t *want, size_t nwant, int has) {
    for (size_t i = 0; i < nwant; i++)
        CHECK_MSG((slot_index(pa, HM_FORK_PREPARE, want[i]) >= 0) == has, "slot %d %s",
                  (int)want[i], has ? "missing" : "ran before its module started");
}

static const hm_fork_slot_t core_slots[] = {HM_FORK_RCU, HM_FORK_NATIVE, HM_FORK_IPC,
                                            HM_FORK_HANDLES, HM_FORK_TRACKER};
static const hm_fork_slot_t je_slots[] = {HM_FORK_JEMALLOC_POOLS, HM_FORK_JEMALLOC,
                                          HM_FORK_JEMALLOC_RANGES, HM_FORK_JEMALLOC_INIT};
#define NSLOTS(a) (sizeof(a) / sizeof((a)[0]))

static hm_result_t shared_provider(hm_provider_t **out) {
    hm_os_params_t *p;
    hm_result_t r = hm_os_params_create(&p);
    if (r) return r;
    r = hm_os_params_set_visibility(p, HM_OS_SHARED);
    if (!r) r = hm_os_provider_create(p, out);
    hm_os_params_destroy(p);
    return r;
}

static void test_order(void) {
    record_t pa, ch;
    hm_provider_t *os;
    hm_pool_t *native;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    REQUIRE_OK(hm_native_pool_create(os, NULL, HM_POOL_FLAG_OWN_PROVIDER, &native));
    void *p = hm_pool_malloc(native, 100);
    REQUIRE(p);

    hm_test_set_context("order: the library's own slots");
    fork_recorded(&pa, &ch);
    check_order(&pa, &ch);
    check_has(&pa, core_slots, NSLOTS(core_slots), 1);
    check_has(&pa, je_slots, NSLOTS(je_slots), 0);
    CHECK_EQ(pa.nlog, 0);

    hm_test_set_context("order: hooks filled late in the first and last slots");
    hm__fork_enable(HM_FORK_PROXY_SNAPSHOT, &last_hooks);
    hm__fork_enable(HM_FORK_PROXY_POOL, &first_hooks);
    hm__fork_enable(HM_FORK_PROXY_POOL, &first_hooks); /* again: nothing changes */
    fork_recorded(&pa, &ch);
    check_order(&pa, &ch);
    check_test_hooks(&pa, &ch);

#ifdef HM_TEST_JEMALLOC
    hm_test_set_context("order: jemalloc, started at its first pool");
    hm_provider_t *jos;
    hm_pool_t *je;
    REQUIRE_OK(hm_os_provider_create(NULL, &jos));
    REQUIRE_OK(hm_jemalloc_pool_create(jos, NULL, HM_POOL_FLAG_OWN_PROVIDER, &je));
    void *q = hm_pool_malloc(je, 1 << 20);
    REQUIRE(q);
    fork_recorded(&pa, &ch);
    check_order(&pa, &ch);
    check_has(&pa, je_slots, NSLOTS(je_slots), 1);
    CHECK(slot_index(&pa, HM_FORK_PREPARE, HM_FORK_JEMALLOC_INIT) <
          slot_index(&pa, HM_FORK_PREPARE, HM_FORK_HANDLES));
    CHECK(slot_index(&pa, HM_FORK_PREPARE, HM_FORK_NATIVE) <
          slot_index(&pa, HM_FORK_PREPARE, HM_FORK_JEMALLOC_POOLS));
    check_test_hooks(&pa, &ch); /* still first and last */
#endif

    hm_test_set_context("order: with an export outstanding");
    hm_provider_t *sh;
    hm_pool_t *xp;
    REQUIRE_OK(shared_provider(&sh));
    REQUIRE_OK(hm_native_pool_create(sh, NULL, HM_POOL_FLAG_OWN_PROVIDER, &xp));
    void *x = hm_pool_malloc(xp, 4096);
    REQUIRE(x);
    hm_ipc_handle_t *h;
    size_t hlen;
    REQUIRE_OK(hm_ipc_get(x, &h, &hlen));
    fork_recorded(&pa, &ch);
    check_order(&pa, &ch);
    int at = slot_index(&pa, HM_FORK_PREPARE, HM_FORK_IPC);
    CHECK(at > 0);
    CHECK(at < slot_index(&pa, HM_FORK_PREPARE, HM_FORK_HANDLES));
    CHECK(at < slot_index(&pa, HM_FORK_PREPARE, HM_FORK_TRACKER));
    CHECK(at > slot_index(&pa, HM_FORK_PREPARE, HM_FORK_NATIVE));
#ifdef HM_TEST_JEMALLOC
    CHECK(at > slot_index(&pa, HM_FORK_PREPARE, HM_FORK_JEMALLOC_INIT));
#endif
    check_test_hooks(&pa, &ch);
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(xp, x));
    CHECK_OK(hm_pool_destroy(xp));
#ifdef HM_TEST_JEMALLOC
    CHECK_OK(hm_pool_free(je, q));
    CHECK_OK(hm_pool_destroy(je));
#endif
    CHECK_OK(hm_pool_free(native, p));
    CHECK_OK(hm_pool_destroy(native));
    hm_test_set_context(NULL);
}

/* ---- busy ---- */

/* The sanitizers' runtimes are not fork-safe while other threads are inside
 * them (test_fork.c says why), so under either sanitizer the workers park
 * around each fork; the forker threads still fork at the same time, and
 * the Release build forks while the workers run. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PARK_AROUND_FORK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PARK_AROUND_FORK 1
#endif
#endif
#ifndef PARK_AROUND_FORK
#define PARK_AROUND_FORK 0
#endif

enum { FORKERS = 3, FORKS_EACH = 30, CHILD_ALARM = HM_TEST_HANG_SECONDS };

/* g_native, g_je: private memory (the children allocate there too);
 * g_shared, g_je_shared: shared memory, exported by the IPC worker. */
static hm_pool_t *g_native, *g_je, *g_shared, *g_je_shared;
static void *g_shared_block; /* a live block of g_shared, for the children */
static _Atomic int g_stop, g_forking, g_parked, g_workers;
static _Atomic int g_bad_fork, g_hung, g_child_bad, g_worker_bad;

static void maybe_park(void) {
    if (!PARK_AROUND_FORK || !atomic_load(&g_forking)) return;
    atomic_fetch_add(&g_parked, 1);
    while (atomic_load(&g_forking)) sched_yield();
    atomic_fetch_sub(&g_parked, 1);
}

static void *native_worker(void *arg) {
    void *keep[64] = {0};
    unsigned i = 0;
    while (!atomic_load(&g_stop)) {
        maybe_park();
        size_t size = (size_t)16 << (i % 14); /* 16 B .. 128 KiB: slabs and large */
        void **slot = &keep[i % 64];
        if (*slot) hm_pool_free(g_native, *slot);
        *slot = hm_pool_malloc(g_native, size);
        i++;
    }
    for (int k = 0; k < 64; k++)
        if (keep[k]) hm_pool_free(g_native, keep[k]);
    return arg;
}

static void *je_worker(void *arg) {
    void *keep[32] = {0};
    unsigned i = 0;
    while (!atomic_load(&g_stop)) {
        maybe_park();
        size_t size = (size_t)8 << (i % 19); /* up to 2 MiB: the extent hooks run */
        void **slot = &keep[i % 32];
        if (*slot) hm_pool_free(g_je, *slot);
        *slot = hm_pool_malloc(g_je, size);
        i++;
    }
    for (int k = 0; k < 32; k++)
        if (keep[k]) hm_pool_free(g_je, keep[k]);
    return arg;
}

/* Exports, from a native and a jemalloc pool in turn: get, sometimes free
 * while exported (deferred to the put), put. While one is outstanding the
 * pools' range changes take the export cache's lock, in jemalloc's extent
 * hooks under jemalloc's locks. */
static void *ipc_worker(void *arg) {
    unsigned i = 0;
    while (!atomic_load(&g_stop)) {
        maybe_park();
        hm_pool_t *pool = g_je_shared && i % 2 ? g_je_shared : g_shared;
        size_t size = (size_t)64 << (i % 12);
        i++;
        void *p = hm_pool_malloc(pool, size);
        if (!p) continue;
        hm_ipc_handle_t *h;
        size_t len;
        if (hm_ipc_get(p, &h, &len) != HM_SUCCESS) {
            atomic_fetch_add(&g_worker_bad, 1);
            hm_pool_free(pool, p);
            continue;
        }
        int freed_first = i % 3 == 0;
        if (freed_first && hm_pool_free(pool, p) != HM_SUCCESS)
            atomic_fetch_add(&g_worker_bad, 1);
        if (hm_ipc_put(h) != HM_SUCCESS) atomic_fetch_add(&g_worker_bad, 1);
        if (!freed_first && hm_pool_free(pool, p) != HM_SUCCESS)
            atomic_fetch_add(&g_worker_bad, 1);
    }
    return arg;
}

/* The child: one thread, every module once; exit status 0 if all went. */
static int child_work(void) {
    alarm(CHILD_ALARM);
    int bad = 0;
    for (int i = 0; i < 100; i++) {
        void *p = hm_pool_malloc(g_native, (size_t)64 << (i % 12));
        if (!p || hm_pool_by_ptr(p) != g_native) bad |= 1;
        if (p && hm_pool_free(g_native, p) != HM_SUCCESS) bad |= 2;
        if (g_je) {
            void *q = hm_pool_malloc(g_je, (size_t)64 << (i % 16));
            if (!q || hm_pool_by_ptr(q) != g_je) bad |= 4;
            if (q && hm_pool_free(g_je, q) != HM_SUCCESS) bad |= 8;
        }
    }
    /* IPC in the child: the export cache is the child's own (empty); the
     * shared provider cannot allocate here, so a get may be refused, but it
     * must answer. */
    hm_ipc_handle_t *h;
    size_t len;
    if (hm_ipc_get(g_shared_block, &h, &len) == HM_SUCCESS && hm_ipc_put(h) != HM_SUCCESS)
        bad |= 16;
    hm_ipc_cache_stats_t st;
    if (hm_ipc_get_cache_stats(&st) != HM_SUCCESS) bad |= 32;
    return bad;
}

static int wait_child(pid_t pid, int secs) {
    for (int i = 0; i < secs * 100; i++) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void *forker(void *arg) {
    for (int i = 0; i < FORKS_EACH; i++) {
        if (PARK_AROUND_FORK) {
            atomic_fetch_add(&g_forking, 1);
            while (atomic_load(&g_parked) < atomic_load(&g_workers)) sched_yield();
        }
        pid_t pid = fork();
        if (pid == 0) _exit(child_work());
        if (PARK_AROUND_FORK) atomic_fetch_sub(&g_forking, 1);
        if (pid < 0) {
            atomic_fetch_add(&g_bad_fork, 1);
            continue;
        }
        int rc = wait_child(pid, CHILD_ALARM + 10);
        if (rc == -1 || rc == 128 + SIGALRM) atomic_fetch_add(&g_hung, 1);
        else if (rc != 0) {
            fprintf(stderr, "child exited with %d\n", rc);
            atomic_fetch_add(&g_child_bad, 1);
        }
        struct timespec ts = {0, 2 * 1000 * 1000}; /* let the workers take locks again */
        nanosleep(&ts, NULL);
    }
    return arg;
}

static void test_busy(int with_jemalloc) {
    hm_test_set_context(with_jemalloc ? "busy" : "busy-nojemalloc");
    hm_provider_t *os, *sh;
    REQUIRE_OK(hm_os_provider_create(NULL, &os));
    REQUIRE_OK(hm_native_pool_create(os, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_native));
    REQUIRE_OK(shared_provider(&sh));
    REQUIRE_OK(hm_native_pool_create(sh, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_shared));
    g_shared_block = hm_pool_malloc(g_shared, 4096);
    REQUIRE(g_shared_block);
    g_je = g_je_shared = NULL;
#ifdef HM_TEST_JEMALLOC
    if (with_jemalloc) {
        hm_provider_t *jos, *jsh;
        REQUIRE_OK(hm_os_provider_create(NULL, &jos));
        REQUIRE_OK(hm_jemalloc_pool_create(jos, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_je));
        REQUIRE_OK(shared_provider(&jsh));
        REQUIRE_OK(hm_jemalloc_pool_create(jsh, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_je_shared));
    }
#endif
    pthread_t w[4], f[FORKERS];
    int nw = 0;
    REQUIRE(pthread_create(&w[nw++], NULL, native_worker, NULL) == 0);
    REQUIRE(pthread_create(&w[nw++], NULL, native_worker, NULL) == 0);
    REQUIRE(pthread_create(&w[nw++], NULL, ipc_worker, NULL) == 0);
    if (g_je) REQUIRE(pthread_create(&w[nw++], NULL, je_worker, NULL) == 0);
    atomic_store(&g_workers, nw);
    for (int i = 0; i < FORKERS; i++) REQUIRE(pthread_create(&f[i], NULL, forker, NULL) == 0);
    for (int i = 0; i < FORKERS; i++) pthread_join(f[i], NULL);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < nw; i++) pthread_join(w[i], NULL);
    atomic_store(&g_stop, 0);

    CHECK_EQ(atomic_load(&g_bad_fork), 0);
    CHECK_MSG(atomic_load(&g_hung) == 0, "%d forked children hung (killed by their alarm)",
              atomic_load(&g_hung));
    CHECK_EQ(atomic_load(&g_child_bad), 0);
    CHECK_EQ(atomic_load(&g_worker_bad), 0);
    CHECK_OK(hm_pool_free(g_shared, g_shared_block));
    CHECK_OK(hm_pool_destroy(g_shared));
    CHECK_OK(hm_pool_destroy(g_native));
    if (g_je) CHECK_OK(hm_pool_destroy(g_je));
    if (g_je_shared) CHECK_OK(hm_pool_destroy(g_je_shared));
    hm_test_set_context(NULL);
}

int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : "order";
    if (!strcmp(part, "order")) test_order();
    else if (!strcmp(part, "busy")) test_busy(1);
    else if (!strcmp(part, "busy-nojemalloc")) test_busy(0);
    else REQUIRE(!"part: order, busy or busy-nojemalloc");
    return hm_test_finish();
}
