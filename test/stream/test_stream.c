/* hetmem tests — stream-ordered allocation (hetmem/stream.h) over the
 * proxy, native and jemalloc pools, through a provider of host memory whose
 * streams and events are the test's own: a stream counts the work queued
 * on it and the work done, an event completes when the work queued before
 * its record is done, and only the test (or event_sync) does work. So the
 * ordering rules are checked exactly: a block freed on a stream goes back
 * to that stream at once, to another one only once its event completed;
 * the threshold; trim, destroy and out of memory waiting for events;
 * double frees; a forgotten stream; injected failures of every event op;
 * a provider without streams; a fork child; threads.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <hetmem/stream.h>
#ifdef HM_TEST_JEMALLOC
#include <hetmem/pools/jemalloc.h>
#endif

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- streams, events and the provider ---- */

typedef struct tstream {
    _Atomic uint64_t queued, done;
} tstream_t;

typedef struct tevent {
    tstream_t *stream; /* NULL: never recorded (complete) */
    uint64_t point;
} tevent_t;

/* What the provider's ops saw, and failures to inject (op index: the next
 * call of that op fails). */
enum { OP_CREATE, OP_RECORD, OP_QUERY, OP_SYNC, OP_DESTROY, OP_COUNT };
static struct {
    _Atomic long calls[OP_COUNT];
    _Atomic int fail[OP_COUNT];
    _Atomic long live_events;
    _Atomic size_t used, capacity; /* bytes of the inner provider; capacity 0: none */
} g;

typedef struct evprov {
    hm_provider_t *inner;
} evprov_t;

static hm_result_t ev_init(const void *params, void **state) {
    evprov_t *e = calloc(1, sizeof(*e));
    if (!e) return HM_ERROR_OUT_OF_HOST_MEMORY;
    (void)params;
    hm_result_t r = hm_test_os_provider(HM_OS_PRIVATE, HM_OS_PROT_READ | HM_OS_PROT_WRITE, &e->inner);
    if (r != HM_SUCCESS) free(e);
    else *state = e;
    return r;
}
static void ev_fini(void *state) {
    evprov_t *e = state;
    hm_provider_destroy(e->inner);
    free(e);
}
static void ev_info(void *state, hm_provider_info_t *info) {
    (void)state;
    memset(info, 0, sizeof(*info));
    info->name = "events";
    info->family = HM_PROVIDER_FAMILY_USER;
    info->kind = HM_MEMORY_HOST;
    info->caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_CPU_ACCESS;
    info->min_page_size = 4096;
    info->recommended_page_size = 4096;
}
static hm_result_t ev_alloc(void *state, size_t size, size_t align, void **ptr) {
    evprov_t *e = state;
    size_t cap = atomic_load(&g.capacity);
    if (cap && atomic_fetch_add(&g.used, size) + size > cap) {
        atomic_fetch_sub(&g.used, size);
        return HM_ERROR_OUT_OF_MEMORY;
    }
    hm_result_t r = hm_provider_alloc(e->inner, size, align, ptr);
    if (r != HM_SUCCESS && cap) atomic_fetch_sub(&g.used, size);
    return r;
}
static hm_result_t ev_free(void *state, void *ptr, size_t size) {
    evprov_t *e = state;
    hm_result_t r = hm_provider_free(e->inner, ptr, size);
    if (r == HM_SUCCESS && atomic_load(&g.capacity)) atomic_fetch_sub(&g.used, size);
    return r;
}

static bool failing(int op) {
    atomic_fetch_add(&g.calls[op], 1);
    return atomic_exchange(&g.fail[op], 0) != 0;
}
static hm_result_t ev_create(void *state, void **event) {
    (void)state;
    if (failing(OP_CREATE)) return HM_ERROR_DRIVER;
    tevent_t *ev = calloc(1, sizeof(*ev));
    if (!ev) return HM_ERROR_OUT_OF_HOST_MEMORY;
    atomic_fetch_add(&g.live_events, 1);
    *event = ev;
    return HM_SUCCESS;
}
static hm_result_t ev_record(void *state, void *event, void *stream) {
    (void)state;
    if (failing(OP_RECORD)) return HM_ERROR_DRIVER;
    tevent_t *ev = event;
    ev->stream = stream;
    ev->point = ev->stream ? atomic_load(&ev->stream->queued) : 0;
    return HM_SUCCESS;
}
static hm_result_t ev_query(void *state, void *event) {
    (void)state;
    if (failing(OP_QUERY)) return HM_ERROR_DRIVER;
    tevent_t *ev = event;
    return !ev->stream || atomic_load(&ev->stream->done) >= ev->point ? HM_SUCCESS : HM_ERROR_BUSY;
}
/* Waiting does the stream's work up to the event. */
static hm_result_t ev_sync(void *state, void *event) {
    (void)state;
    if (failing(OP_SYNC)) return HM_ERROR_DRIVER;
    tevent_t *ev = event;
    if (!ev->stream) return HM_SUCCESS;
    uint64_t d = atomic_load(&ev->stream->done);
    while (d < ev->point && !atomic_compare_exchange_weak(&ev->stream->done, &d, ev->point)) {
    }
    return HM_SUCCESS;
}
static void ev_destroy(void *state, void *event) {
    (void)state;
    atomic_fetch_add(&g.calls[OP_DESTROY], 1);
    atomic_fetch_sub(&g.live_events, 1);
    free(event);
}

static const hm_provider_ops_t ev_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "events",
    .init = ev_init,
    .fini = ev_fini,
    .get_info = ev_info,
    .alloc = ev_alloc,
    .free = ev_free,
    .stream = {ev_create, ev_record, ev_query, ev_sync, ev_destroy},
};

/* Work queued on s (a kernel that uses the stream's blocks). */
static void queue_work(tstream_t *s) { atomic_fetch_add(&s->queued, 1); }
/* The stream runs everything queued. */
static void run(tstream_t *s) { atomic_store(&s->done, atomic_load(&s->queued)); }

static const char *kind_name(int k) { return k == 0 ? "proxy" : k == 1 ? "native" : "jemalloc"; }

static hm_pool_t *make_pool(int kind) {
    hm_provider_t *prov;
    REQUIRE_OK(hm_provider_create(&ev_ops, NULL, &prov));
    CHECK(hm_provider_caps(prov) & HM_PROVIDER_CAP_STREAMS);
    hm_pool_t *pool = NULL;
    hm_result_t r;
    switch (kind) {
    case 0: r = hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool); break;
    case 1: r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool); break;
    default:
#ifdef HM_TEST_JEMALLOC
        r = hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool);
#else
        r = HM_ERROR_NOT_SUPPORTED;
#endif
        break;
    }
    REQUIRE_OK(r);
    return pool;
}

static hm_stream_stats_t stats_of(hm_pool_t *pool) {
    hm_stream_stats_t st;
    CHECK_OK(hm_pool_get_stream_stats(pool, &st));
    return st;
}

/* ---- the ordering rules ---- */

static void test_order(int kind) {
    hm_pool_t *pool = make_pool(kind);
    tstream_t s1 = {0}, s2 = {0};
    const size_t n = 1000;
    /* Same stream: at once, though the work that used it is not done. */
    char *p = hm_pool_malloc_async(pool, n, &s1);
    REQUIRE(p);
    memset(p, 1, n);
    queue_work(&s1);
    CHECK_OK(hm_pool_free_async(pool, p, &s1));
    CHECK_EQ(stats_of(pool).cached_blocks, 1);
    char *q = hm_pool_malloc_async(pool, n, &s1);
    CHECK(q == p);
    CHECK_EQ(stats_of(pool).same_stream, 1);
    /* Another stream: never before the event completed. */
    queue_work(&s1);
    CHECK_OK(hm_pool_free_async(pool, q, &s1));
    char *r = hm_pool_malloc_async(pool, n, &s2);
    REQUIRE(r);
    CHECK_MSG(r != q, "a block freed on s1 went to s2 before s1's work was done");
    run(&s1);
    char *t = hm_pool_malloc_async(pool, n, &s2);
    CHECK_MSG(t == q, "the block freed on s1 was not reused by s2 once s1's work was done");
    CHECK_EQ(stats_of(pool).other_stream, 1);
    /* Mixed: a synchronous block freed on a stream, an async one freed
     * on the host. */
    void *u = hm_pool_malloc(pool, n);
    REQUIRE(u);
    CHECK_OK(hm_pool_free_async(pool, u, &s2));
    CHECK_OK(hm_pool_free(pool, r));
    CHECK_OK(hm_pool_free(pool, t));
    /* A block of another pool, a foreign pointer, NULL. */
    char local[64];
    CHECK_RES(hm_pool_free_async(pool, local, &s1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_pool_free_async(pool, NULL, &s1));
    CHECK_OK(hm_pool_destroy(pool));
}

/* Double frees of a pending block: on a stream, on the host, hm_free. */
static void test_double_free(int kind) {
    hm_pool_t *pool = make_pool(kind);
    tstream_t s = {0};
    void *p = hm_pool_malloc_async(pool, 256, &s);
    REQUIRE(p);
    queue_work(&s);
    CHECK_OK(hm_pool_free_async(pool, p, &s));
    CHECK_RES(hm_pool_free_async(pool, p, &s), HM_ERROR_DOUBLE_FREE);
    CHECK_RES(hm_pool_free(pool, p), HM_ERROR_DOUBLE_FREE);
    CHECK_RES(hm_free(p), HM_ERROR_DOUBLE_FREE);
    CHECK_EQ(stats_of(pool).cached_blocks, 1);
    /* Taken again: an ordinary block once more. */
    void *q = hm_pool_malloc_async(pool, 256, &s);
    CHECK(q == p);
    CHECK_OK(hm_free(q));
    CHECK_OK(hm_pool_destroy(pool));
}

/* Threshold: blocks over it go back once their events complete. */
static void test_threshold(int kind) {
    hm_pool_t *pool = make_pool(kind);
    tstream_t s = {0};
    CHECK_OK(hm_pool_set_release_threshold(pool, 0));
    CHECK_EQ(stats_of(pool).threshold, 0);
    void *b[8];
    for (int i = 0; i < 8; i++) {
        b[i] = hm_pool_malloc_async(pool, 4096, &s);
        REQUIRE(b[i]);
    }
    queue_work(&s);
    for (int i = 0; i < 4; i++) CHECK_OK(hm_pool_free_async(pool, b[i], &s));
    CHECK_EQ(stats_of(pool).cached_blocks, 4); /* pending: kept */
    run(&s);
    for (int i = 4; i < 8; i++) CHECK_OK(hm_pool_free_async(pool, b[i], &s));
    hm_stream_stats_t st = stats_of(pool);
    CHECK_MSG(st.cached_blocks == 0 && st.released == 8, "cached %zu, released %llu",
              st.cached_blocks, (unsigned long long)st.released);
    CHECK_OK(hm_pool_set_release_threshold(pool, SIZE_MAX));
    CHECK_OK(hm_pool_destroy(pool));
}

/* Trim and destroy wait for the events; a forgotten stream's blocks wait
 * for theirs. */
static void test_trim_destroy_forget(int kind) {
    hm_pool_t *pool = make_pool(kind);
    tstream_t s = {0};
    void *p = hm_pool_malloc_async(pool, 512, &s);
    REQUIRE(p);
    queue_work(&s);
    CHECK_OK(hm_pool_free_async(pool, p, &s));
    CHECK_OK(hm_pool_stream_forget(pool, &s));
    CHECK_OK(hm_pool_stream_forget(pool, (void *)&g)); /* unknown: a no-op */
    void *q = hm_pool_malloc_async(pool, 512, &s);
    CHECK_MSG(q != p, "a forgotten stream got its pending block by stream order");
    CHECK_OK(hm_pool_free(pool, q));
    long syncs = atomic_load(&g.calls[OP_SYNC]);
    hm_result_t tr = hm_pool_trim(pool);
    CHECK(tr == HM_SUCCESS || tr == HM_ERROR_NOT_SUPPORTED);
    hm_stream_stats_t st = stats_of(pool);
    CHECK(st.cached_blocks == 0 && st.waits >= 1);
    CHECK(atomic_load(&g.calls[OP_SYNC]) > syncs);
    /* Destroy with a block pending: it waits, and every event goes. */
    tstream_t s2 = {0};
    void *r = hm_pool_malloc_async(pool, 512, &s2);
    REQUIRE(r);
    queue_work(&s2);
    CHECK_OK(hm_pool_free_async(pool, r, &s2));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_EQ(atomic_load(&s2.done), atomic_load(&s2.queued));
    CHECK_EQ(atomic_load(&g.live_events), 0);
}

/* Out of memory with blocks pending: they are waited for and reused. */
static void test_oom(int kind) {
    atomic_store(&g.used, 0);
    atomic_store(&g.capacity, (size_t)8 << 20);
    hm_pool_t *pool = make_pool(kind);
    tstream_t s1 = {0}, s2 = {0};
    enum { MAX = 64 };
    void *b[MAX];
    int n = 0;
    while (n < MAX && (b[n] = hm_pool_malloc_async(pool, 1 << 20, &s1)) != NULL) n++;
    CHECK_MSG(n > 0 && n < MAX, "%d blocks of 1 MiB from 8 MiB", n);
    queue_work(&s1);
    for (int i = 0; i < n; i++) CHECK_OK(hm_pool_free_async(pool, b[i], &s1));
    /* s2 may not take s1's pending blocks, and the provider is full: the
     * cache waits for s1's events and gives the blocks back. */
    void *q = hm_pool_malloc_async(pool, 1 << 20, &s2);
    CHECK_MSG(q != NULL, "out of memory with every block pending on another stream");
    CHECK(stats_of(pool).waits >= 1);
    if (q) CHECK_OK(hm_pool_free(pool, q));
    CHECK_OK(hm_pool_destroy(pool));
    atomic_store(&g.capacity, 0);
}

/* Every event op failing once. A free records nothing; the event is
 * recorded when another stream wants the block: if that fails the block
 * stays with its stream, and the next demand records again. */
static void test_failures(int kind) {
    hm_pool_t *pool = make_pool(kind);
    tstream_t s = {0}, s2 = {0};
    for (int op = OP_CREATE; op <= OP_RECORD; op++) { /* create: the first event */
        void *p = hm_pool_malloc_async(pool, 128, &s);
        REQUIRE(p);
        queue_work(&s);
        long before = atomic_load(&g.calls[OP_RECORD]);
        CHECK_OK(hm_pool_free_async(pool, p, &s));
        CHECK_EQ(atomic_load(&g.calls[OP_RECORD]), before); /* no driver call at a free */
        run(&s);
        atomic_store(&g.fail[op], 1);
        void *q = hm_pool_malloc_async(pool, 128, &s2);
        CHECK_MSG(q != NULL && q != p, "%s failed, and s2 got the block anyway",
                  op == OP_CREATE ? "event_create" : "event_record");
        void *r = hm_pool_malloc_async(pool, 128, &s2);
        CHECK_MSG(r == p, "the next demand did not record again");
        CHECK_OK(hm_pool_free(pool, q));
        CHECK_OK(hm_pool_free(pool, r));
    }
    /* A failed query: the block stays pending (not handed to another stream). */
    void *p = hm_pool_malloc_async(pool, 128, &s);
    REQUIRE(p);
    CHECK_OK(hm_pool_free_async(pool, p, &s)); /* nothing queued: complete once recorded */
    atomic_store(&g.fail[OP_QUERY], 1);
    void *q = hm_pool_malloc_async(pool, 128, &s2);
    CHECK(q != NULL && q != p);
    void *r = hm_pool_malloc_async(pool, 128, &s2); /* the query works again */
    CHECK(r == p);
    CHECK_OK(hm_pool_free(pool, q));
    CHECK_OK(hm_pool_free(pool, r));
    /* A failed wait at destroy: the block goes back all the same. */
    void *w = hm_pool_malloc_async(pool, 128, &s);
    queue_work(&s);
    CHECK_OK(hm_pool_free_async(pool, w, &s));
    atomic_store(&g.fail[OP_SYNC], 1);
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_EQ(atomic_load(&g.live_events), 0);
}

/* A fork child forgets the parent's pending blocks. */
static void test_fork(int kind) {
    hm_pool_t *pool = make_pool(kind);
    tstream_t s = {0};
    void *p = hm_pool_malloc_async(pool, 300, &s);
    REQUIRE(p);
    queue_work(&s);
    CHECK_OK(hm_pool_free_async(pool, p, &s));
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        hm_stream_stats_t st;
        if (hm_pool_get_stream_stats(pool, &st) != HM_SUCCESS || st.cached_blocks) _exit(2);
        void *q = hm_pool_malloc_async(pool, 300, &s);
        if (!q) _exit(3);
        if (hm_pool_free_async(pool, q, &s) != HM_SUCCESS) _exit(4);
        _exit(0);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed at step %d",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK_EQ(stats_of(pool).cached_blocks, 1);
    CHECK_OK(hm_pool_destroy(pool));
}

/* Threads: each its own stream, blocks freed on it and taken across. */
typedef struct targ {
    hm_pool_t *pool;
    tstream_t s;
    int fails;
} targ_t;
static void *worker(void *arg) {
    targ_t *a = arg;
    void *held[16] = {0};
    for (int i = 0; i < 4000; i++) {
        int k = i % 16;
        if (held[k]) {
            queue_work(&a->s);
            if (hm_pool_free_async(a->pool, held[k], &a->s) != HM_SUCCESS) a->fails++;
        }
        held[k] = hm_pool_malloc_async(a->pool, 64 + (size_t)(i % 7) * 200, &a->s);
        if (!held[k]) a->fails++;
        else memset(held[k], i & 0xff, 64);
        if (i % 64 == 0) run(&a->s);
    }
    for (int k = 0; k < 16; k++)
        if (held[k]) hm_pool_free(a->pool, held[k]);
    return NULL;
}
static void test_threads(int kind) {
    hm_pool_t *pool = make_pool(kind);
    enum { T = 4 };
    targ_t a[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        a[i] = (targ_t){.pool = pool};
        REQUIRE(pthread_create(&th[i], NULL, worker, &a[i]) == 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(a[i].fails, 0);
    }
    CHECK_OK(hm_pool_destroy(pool));
}

/* A provider without stream ops. */
static void test_no_streams(void) {
    hm_provider_t *os;
    REQUIRE_OK(hm_test_os_provider(HM_OS_PRIVATE, 0, &os));
    CHECK(!(hm_provider_caps(os) & HM_PROVIDER_CAP_STREAMS));
    hm_pool_t *pool;
    REQUIRE_OK(hm_proxy_pool_create(os, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    errno = 0;
    CHECK(hm_pool_malloc_async(pool, 64, NULL) == NULL && errno == ENOTSUP);
    void *p = hm_pool_malloc(pool, 64);
    CHECK_RES(hm_pool_free_async(pool, p, NULL), HM_ERROR_NOT_SUPPORTED);
    CHECK_RES(hm_pool_set_release_threshold(pool, 0), HM_ERROR_NOT_SUPPORTED);
    CHECK_OK(hm_pool_free(pool, p));
    errno = 0;
    CHECK(hm_pool_malloc_async(NULL, 64, NULL) == NULL && errno == EINVAL);
    CHECK_RES(hm_pool_free_async(NULL, p, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_pool_get_stream_stats(pool, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_pool_destroy(pool));
    hm_pool_t *sp = make_pool(0);
    errno = 0;
    CHECK(hm_pool_malloc_async(sp, 0, NULL) == NULL && errno == EINVAL);
    CHECK_OK(hm_pool_destroy(sp));
}

int main(void) {
    test_no_streams();
    for (int kind = 0; kind < 3; kind++) {
#ifndef HM_TEST_JEMALLOC
        if (kind == 2) continue;
#endif
        char label[64];
        snprintf(label, sizeof(label), "streams over the %s pool", kind_name(kind));
        hm_test_set_context(label);
        test_order(kind);
        test_double_free(kind);
        test_threshold(kind);
        test_trim_destroy_forget(kind);
        test_oom(kind);
        test_failures(kind);
#if !defined(HM_TSAN)
        test_fork(kind); /* jemalloc's fork handlers hold more locks than TSan tracks */
#else
        if (kind != 2) test_fork(kind);
#endif
        test_threads(kind);
    }
    return hm_test_finish();
}
