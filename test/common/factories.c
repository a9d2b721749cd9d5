/* hetmem tests — providers made the same way by every pool test.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

hm_result_t hm_test_os_provider(hm_os_visibility_t vis, unsigned prot, hm_provider_t **out) {
    hm_os_params_t *params;
    hm_result_t r = hm_os_params_create(&params);
    if (r != HM_SUCCESS) return r;
    r = hm_os_params_set_visibility(params, vis);
    if (r == HM_SUCCESS) r = hm_os_params_set_protection(params, prot);
    if (r == HM_SUCCESS) r = hm_os_provider_create(params, out);
    hm_os_params_destroy(params);
    return r;
}

hm_result_t hm_test_fixed_provider(void *buffer, size_t size, hm_memory_kind_t kind, bool cpu,
                                   hm_provider_t **out) {
    hm_fixed_params_t *params;
    hm_result_t r = hm_fixed_params_create(buffer, size, &params);
    if (r != HM_SUCCESS) return r;
    r = hm_fixed_params_set_memory_kind(params, kind, cpu);
    if (r == HM_SUCCESS) r = hm_provider_create(hm_fixed_provider_ops(), params, out);
    hm_fixed_params_destroy(params);
    return r;
}

/* ---- providers of a named kind (the pool x provider matrix) ---- */

#include <hetmem/providers/file.h>

#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define RW (HM_OS_PROT_READ | HM_OS_PROT_WRITE)

/* One buffer per fixed kind, mapped at first use and shared by every fixed
 * provider of that kind: the suites hold one object from a factory at a time
 * (conformance.h), so two providers never use a buffer at once. */
#define FIXED_SIZE ((size_t)96 * MIB)
static void *g_fixed_host, *g_fixed_device;
/* The file kind's folder (made at first use, removed by the clean-up). */
static char g_file_dir[256];

static const hm_test_provider_kind_info_t g_kinds[HM_TEST_PROVIDER_KIND_COUNT] = {
    [HM_TEST_OS_PRIVATE] = {"os-private", 0, {.can_free = 1}},
    [HM_TEST_OS_SHARED] = {"os-shared", 0, {.can_free = 1}},
    [HM_TEST_OS_UNTRACKED] = {"os-untracked", HM_POOL_FLAG_NO_TRACKING, {.can_free = 1}},
    [HM_TEST_OS_PROT_NONE] = {"os-prot-none", 0, {.can_free = 1}},
    [HM_TEST_FAULT] = {"fault(os)", 0, {.can_free = 1}},
    [HM_TEST_FAULT_NOFREE] = {"fault-nofree(os)", 0, {.can_free = 0}},
    [HM_TEST_FILE] = {"file", 0, {.can_free = 1, .max_alloc = 8 * MIB}},
    [HM_TEST_FIXED_HOST] = {"fixed-host", 0,
                            {.max_alloc = 16 * MIB, .max_alignment = 2 * MIB,
                             .capacity = FIXED_SIZE}},
    [HM_TEST_FIXED_DEVICE] = {"fixed-device", 0,
                              {.max_alloc = 16 * MIB, .max_alignment = 2 * MIB,
                               .capacity = FIXED_SIZE}},
};

const hm_test_provider_kind_info_t *hm_test_provider_kind_info(hm_test_provider_kind_t kind) {
    if ((unsigned)kind >= HM_TEST_PROVIDER_KIND_COUNT) return NULL;
    return &g_kinds[kind];
}

static hm_result_t make_fault(int nofree, hm_provider_t **out) {
    hm_provider_t *os;
    hm_result_t r = hm_test_os_provider(HM_OS_PRIVATE, RW, &os);
    if (r != HM_SUCCESS) return r;
    hm_fault_params_t fp = {.inner = os, .own_inner = 1};
    r = hm_provider_create(nofree ? hm_fault_provider_nofree_ops() : hm_fault_provider_ops(), &fp,
                           out);
    if (r != HM_SUCCESS) hm_provider_destroy(os);
    return r;
}

static hm_result_t make_file(hm_provider_t **out) {
    static _Atomic unsigned n;
    if (!g_file_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(g_file_dir, sizeof(g_file_dir), "%s/hm-pool-file-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(g_file_dir)) {
            g_file_dir[0] = '\0';
            return HM_ERROR_DRIVER;
        }
    }
    char path[320];
    snprintf(path, sizeof(path), "%s/pool-%u", g_file_dir, atomic_fetch_add(&n, 1));
    hm_file_params_t *fp;
    hm_result_t r = hm_file_params_create(path, &fp);
    if (r != HM_SUCCESS) return r;
    hm_file_params_set_keep_file(fp, false);
    r = hm_provider_create(hm_file_provider_ops(), fp, out);
    hm_file_params_destroy(fp);
    return r;
}

/* Host: read-write. Device-kind: PROT_NONE, so a single CPU access by the
 * suite or the pool crashes the test. */
static hm_result_t make_fixed(int device, hm_provider_t **out) {
    void **buf = device ? &g_fixed_device : &g_fixed_host;
    if (!*buf) {
        void *p = device ? mmap(NULL, FIXED_SIZE, PROT_NONE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                         : mmap(NULL, FIXED_SIZE, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return HM_ERROR_OUT_OF_MEMORY;
        *buf = p;
    }
    return hm_test_fixed_provider(*buf, FIXED_SIZE, device ? HM_MEMORY_DEVICE : HM_MEMORY_HOST,
                                  !device, out);
}

hm_result_t hm_test_make_provider(hm_test_provider_kind_t kind, hm_provider_t **out) {
    if (!out) return HM_ERROR_INVALID_ARGUMENT;
    switch (kind) {
    case HM_TEST_OS_PRIVATE:
    case HM_TEST_OS_UNTRACKED: /* the kind's pool_flags make it untracked */
        return hm_test_os_provider(HM_OS_PRIVATE, RW, out);
    case HM_TEST_OS_SHARED: return hm_test_os_provider(HM_OS_SHARED, RW, out);
    case HM_TEST_OS_PROT_NONE: return hm_test_os_provider(HM_OS_PRIVATE, HM_OS_PROT_NONE, out);
    case HM_TEST_FAULT: return make_fault(0, out);
    case HM_TEST_FAULT_NOFREE: return make_fault(1, out);
    case HM_TEST_FILE: return make_file(out);
    case HM_TEST_FIXED_HOST: return make_fixed(0, out);
    case HM_TEST_FIXED_DEVICE: return make_fixed(1, out);
    default: return HM_ERROR_INVALID_ARGUMENT;
    }
}

int hm_test_providers_cleanup(void) {
    int ok = 1;
    if (g_fixed_host) munmap(g_fixed_host, FIXED_SIZE);
    if (g_fixed_device) munmap(g_fixed_device, FIXED_SIZE);
    g_fixed_host = g_fixed_device = NULL;
    if (g_file_dir[0]) {
        if (rmdir(g_file_dir) != 0) {
            fprintf(stderr, "files left behind in %s\n", g_file_dir);
            ok = 0;
        }
        g_file_dir[0] = '\0';
    }
    return ok;
}
