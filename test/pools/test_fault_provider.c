/* hetmem tests — the fault-injecting provider itself: it passes the provider
 * suite around the OS and fixed providers, counts calls, fails exactly the
 * call it was told to, tracks live allocations, and forwards the ipc
 * sub-table with the same counting, injection and tracking of exports and
 * mappings. SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* The ipc ops, called as the IPC layer calls them, over the OS provider in
 * shared mode (its ipc.open maps any memfd, this process's own included). */
static void test_ipc_ops(void) {
    hm_test_set_context("fault ipc ops");
    hm_provider_t *os, *f;
    REQUIRE_OK(hm_test_os_provider(HM_OS_SHARED, HM_OS_PROT_READ | HM_OS_PROT_WRITE, &os));
    CHECK(hm_fault_provider_ops_for(os, 0) == hm_fault_provider_ops()); /* os has close_many */
    CHECK(hm_fault_provider_ops_for(os, 1) == hm_fault_provider_nofree_ops());
    hm_fault_params_t fp = {.inner = os, .own_inner = 1, .fail_with = HM_ERROR_DRIVER};
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &f));
    CHECK(hm_provider_caps(f) & HM_PROVIDER_CAP_IPC);
    const hm_provider_ops_t *o = hm_provider_get_ops(f);
    void *st = hm_provider_get_state(f);
    REQUIRE(o->ipc.close_many != NULL);

    size_t plen = o->ipc.handle_size(st);
    CHECK(plen > 0 && plen <= HM_IPC_PAYLOAD_MAX);
    hm_fault_provider_arm(f, HM_FAULT_IPC_HANDLE_SIZE, 1);
    CHECK(o->ipc.handle_size(st) > HM_IPC_PAYLOAD_MAX); /* the injected answer */
    CHECK_EQ(o->ipc.handle_size(st), plen);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_IPC_HANDLE_SIZE), 3);
    CHECK_EQ(hm_fault_provider_succeeded(f, HM_FAULT_IPC_HANDLE_SIZE), 2);

    void *a, *b;
    REQUIRE_OK(hm_provider_alloc(f, 8192, 0, &a));
    REQUIRE_OK(hm_provider_alloc(f, 4096, 0, &b));
    unsigned char pa[HM_IPC_PAYLOAD_MAX], pb[HM_IPC_PAYLOAD_MAX];
    int fa = -1, fb = -1;
    hm_fault_provider_arm_with(f, HM_FAULT_IPC_GET, 2, HM_ERROR_PERMISSION);
    CHECK_OK(o->ipc.get(st, a, 8192, pa, &fa));
    CHECK_RES(o->ipc.get(st, b, 4096, pb, &fb), HM_ERROR_PERMISSION); /* the 2nd, chosen result */
    CHECK_EQ(hm_fault_provider_exports(f), 1);
    CHECK_OK(o->ipc.get(st, b, 4096, pb, &fb));
    CHECK_EQ(hm_fault_provider_exports(f), 2);
    CHECK(fa >= 0 && fb >= 0);
    /* Exporting what is not a live allocation: misuse, not forwarded. */
    int fx = -1;
    CHECK_RES(o->ipc.get(st, (char *)a + 4096 * 1000, 4096, pb, &fx), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_fault_provider_misuse(f), 1);

    void *ma = NULL, *mb = NULL, *mc = NULL;
    hm_fault_provider_arm(f, HM_FAULT_IPC_OPEN, 1); /* the params' result */
    CHECK_RES(o->ipc.open(st, pa, fa, 8192, &ma), HM_ERROR_DRIVER);
    CHECK_EQ(hm_fault_provider_mappings(f), 0);
    REQUIRE_OK(o->ipc.open(st, pa, fa, 8192, &ma));
    REQUIRE_OK(o->ipc.open(st, pb, fb, 4096, &mb));
    REQUIRE_OK(o->ipc.open(st, pa, fa, 8192, &mc));
    CHECK_EQ(hm_fault_provider_mappings(f), 3);
    memset(a, 0x3c, 8192);
    CHECK(((unsigned char *)ma)[8191] == 0x3c && ((unsigned char *)mc)[0] == 0x3c);

    hm_fault_provider_arm(f, HM_FAULT_IPC_CLOSE, 1);
    CHECK_RES(o->ipc.close(st, mb, 4096), HM_ERROR_DRIVER);
    CHECK_EQ(hm_fault_provider_mappings(f), 3); /* still mapped */
    CHECK_RES(o->ipc.close(st, mb, 8192), HM_ERROR_INVALID_ARGUMENT); /* wrong size: misuse */
    CHECK_EQ(hm_fault_provider_misuse(f), 2);
    CHECK_OK(o->ipc.close(st, mb, 4096));
    CHECK_RES(o->ipc.close(st, mb, 4096), HM_ERROR_INVALID_ARGUMENT); /* closed twice */
    CHECK_EQ(hm_fault_provider_misuse(f), 3);
    CHECK_EQ(hm_fault_provider_mappings(f), 2);

    void *const many[2] = {ma, mc};
    const size_t sizes[2] = {8192, 8192};
    hm_fault_provider_arm(f, HM_FAULT_IPC_CLOSE_MANY, 1);
    CHECK_RES(o->ipc.close_many(st, many, sizes, 2), HM_ERROR_DRIVER); /* closes nothing */
    CHECK_EQ(hm_fault_provider_mappings(f), 2);
    CHECK_EQ(((unsigned char *)mc)[100], 0x3c);
    CHECK_OK(o->ipc.close_many(st, many, sizes, 2));
    CHECK_EQ(hm_fault_provider_mappings(f), 0);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_IPC_CLOSE_MANY), 2);
    CHECK_EQ(hm_fault_provider_succeeded(f, HM_FAULT_IPC_CLOSE_MANY), 1);

    hm_fault_provider_arm(f, HM_FAULT_IPC_PUT, -1);
    CHECK_RES(o->ipc.put(st, pa), HM_ERROR_DRIVER);
    CHECK_RES(o->ipc.put(st, pb), HM_ERROR_DRIVER);
    hm_fault_provider_disarm(f);
    CHECK_EQ(hm_fault_provider_exports(f), 2);
    CHECK_OK(o->ipc.put(st, pa));
    CHECK_OK(o->ipc.put(st, pb));
    CHECK_EQ(hm_fault_provider_exports(f), 0);
    CHECK_EQ(hm_fault_provider_calls(f, HM_FAULT_IPC_PUT), 4);
    CHECK_EQ(hm_fault_provider_succeeded(f, HM_FAULT_IPC_PUT), 2);
    CHECK_OK(hm_provider_free(f, a, 8192));
    CHECK_OK(hm_provider_free(f, b, 4096));
    CHECK_EQ(hm_fault_provider_live(f), 0);
    CHECK_EQ(hm_fault_provider_injected(f), 7);
    CHECK_OK(hm_provider_destroy(f));

    /* Without close_many in the inner provider (file): the matching table
     * has none either, so the IPC layer closes one by one as for the file
     * provider itself; hm_fault_provider_ops() forwards close_many as
     * close() of each. */
    char dir[] = "/tmp/hm-fault-ipc-XXXXXX", path[64];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/f", dir);
    hm_provider_t *file;
    REQUIRE_OK(hm_file_provider_create(path, &file));
    const hm_provider_ops_t *each = hm_fault_provider_ops_for(file, 0);
    CHECK(each != hm_fault_provider_ops() && each->ipc.close_many == NULL && each->free);
    CHECK(hm_fault_provider_ops_for(file, 1)->free == NULL);
    fp.inner = file;
    REQUIRE_OK(hm_provider_create(hm_fault_provider_ops(), &fp, &f));
    o = hm_provider_get_ops(f);
    st = hm_provider_get_state(f);
    REQUIRE_OK(hm_provider_alloc(f, 4096, 0, &a));
    REQUIRE_OK(o->ipc.get(st, a, 4096, pa, &fa));
    REQUIRE_OK(o->ipc.open(st, pa, fa, 4096, &ma));
    REQUIRE_OK(o->ipc.open(st, pa, fa, 4096, &mb));
    void *const two[2] = {ma, mb};
    const size_t four[2] = {4096, 4096};
    CHECK_OK(o->ipc.close_many(st, two, four, 2));
    CHECK_EQ(hm_fault_provider_mappings(f), 0);
    CHECK_OK(o->ipc.put(st, pa));
    CHECK_OK(hm_provider_free(f, a, 4096));
    CHECK_EQ(hm_fault_provider_misuse(f), 0);
    CHECK_OK(hm_provider_destroy(f));
    unlink(path);
    rmdir(dir);
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
    test_ipc_ops();
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
