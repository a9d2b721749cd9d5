/* hetmem tests — the file provider's MAP_SYNC mode on a DAX file system:
 * the folder named by HM_TEST_DAX_DIR (e.g. an ext4 mounted -o dax on a pmem
 * device; scripts/vm-test.sh makes one in its guest); skipped (exit 77)
 * without one. The mapping is synchronous (VmFlags "sf"), data persists
 * across destroy and re-open, and the provider and proxy-pool conformance
 * suites pass over it.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static char dir[256];
static atomic_int file_counter;

typedef struct factory {
    int map_sync;
} factory_t;

static hm_result_t make_provider(void *arg, hm_provider_t **out) {
    const factory_t *f = arg;
    char path[512];
    snprintf(path, sizeof(path), "%s/suite-%d", dir, atomic_fetch_add(&file_counter, 1));
    hm_file_params_t *p;
    hm_result_t r = hm_file_params_create(path, &p);
    if (r) return r;
    hm_file_params_set_visibility(p, HM_FILE_SHARED);
    hm_file_params_set_map_sync(p, f->map_sync);
    hm_file_params_set_keep_file(p, false);
    r = hm_provider_create(hm_file_provider_ops(), p, out);
    hm_file_params_destroy(p);
    return r;
}

static hm_result_t make_pool(void *arg, hm_pool_t **out) {
    hm_provider_t *prov;
    hm_result_t r = make_provider(arg, &prov);
    if (r) return r;
    r = hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r) hm_provider_destroy(prov);
    return r;
}

/* The VmFlags of the mapping holding addr (/proc/self/smaps), or "". */
static void vm_flags(const void *addr, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    REQUIRE(f);
    char line[512];
    int inside = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, n, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

static int has_flag(const char *flags, const char *flag) {
    char padded[600];
    snprintf(padded, sizeof(padded), " %s ", flags);
    for (char *c = padded; *c; c++)
        if (*c == '\n') *c = ' ';
    char want[8];
    snprintf(want, sizeof(want), " %s ", flag);
    return strstr(padded, want) != NULL;
}

static void test_sync_mapping(void) {
    hm_test_set_context("MAP_SYNC mapping");
    factory_t f = {.map_sync = 1};
    hm_provider_t *p = NULL;
    /* On a DAX file system MAP_SYNC must work: NOT_SUPPORTED is a failure. */
    REQUIRE_OK(make_provider(&f, &p));
    char *x;
    REQUIRE_OK(hm_provider_alloc(p, 2 * MIB, 0, (void **)&x));
    hm_test_fill(x, 2 * MIB, 7);
    char flags[512];
    vm_flags(x, flags, sizeof(flags));
    CHECK_MSG(has_flag(flags, "sf"), "mapping not synchronous: VmFlags%s", flags);
    CHECK(hm_test_verify(x, 2 * MIB, 7));
    CHECK_OK(hm_provider_free(p, x, 2 * MIB));
    CHECK_OK(hm_provider_destroy(p));

    /* Without MAP_SYNC the same file system maps without "sf". */
    f.map_sync = 0;
    REQUIRE_OK(make_provider(&f, &p));
    REQUIRE_OK(hm_provider_alloc(p, MIB, 0, (void **)&x));
    x[0] = 1;
    vm_flags(x, flags, sizeof(flags));
    CHECK_MSG(flags[0] && !has_flag(flags, "sf"), "VmFlags%s", flags);
    CHECK_OK(hm_provider_free(p, x, MIB));
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

static void test_sync_persistence(void) {
    hm_test_set_context("MAP_SYNC persistence");
    char path[512];
    snprintf(path, sizeof(path), "%s/persist", dir);
    unlink(path);
    const size_t len = MIB + 4096;
    for (int round = 0; round < 2; round++) {
        hm_file_params_t *fp;
        REQUIRE_OK(hm_file_params_create(path, &fp));
        CHECK_OK(hm_file_params_set_visibility(fp, HM_FILE_SHARED));
        CHECK_OK(hm_file_params_set_map_sync(fp, true));
        CHECK_OK(hm_file_params_set_keep_file(fp, round == 0)); /* the second removes it */
        hm_provider_t *p;
        REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &p));
        CHECK_OK(hm_file_params_destroy(fp));
        char *x;
        REQUIRE_OK(hm_provider_alloc(p, len, 0, (void **)&x));
        if (round == 0) {
            hm_test_fill(x, len, 4242);
        } else {
            CHECK_MSG(hm_test_verify(x, len, 4242), "data lost across destroy and re-open");
            /* The bytes are in the file itself. */
            int fd = open(path, O_RDONLY);
            REQUIRE(fd >= 0);
            char buf[256];
            CHECK_EQ(pread(fd, buf, sizeof(buf), 0), (long long)sizeof(buf));
            CHECK(memcmp(buf, x, sizeof(buf)) == 0);
            close(fd);
        }
        CHECK_OK(hm_provider_free(p, x, len));
        CHECK_OK(hm_provider_destroy(p));
    }
    CHECK(access(path, F_OK) != 0);
    hm_test_set_context(NULL);
}

int main(void) {
    const char *base = getenv("HM_TEST_DAX_DIR");
    if (!base || !*base)
        HM_TEST_SKIP("HM_TEST_DAX_DIR is not set (no DAX file system to test MAP_SYNC on)");
    snprintf(dir, sizeof(dir), "%s/hm-map-sync-XXXXXX", base);
    REQUIRE(mkdtemp(dir));
    HM_TEST_PHASE(test_sync_mapping());
    HM_TEST_PHASE(test_sync_persistence());
    /* Each first write to a page of a MAP_SYNC mapping commits the file
     * system's metadata (that is what MAP_SYNC promises), so the suites stay
     * small: the native pool is tested over device DAX (test_devdax_device). */
    factory_t sync = {.map_sync = 1};
    hm_test_suite_opts_t opts = {.max_alloc = 4 * MIB, .can_free = 1, .threads = 2};
    HM_TEST_PHASE(hm_test_provider_suite("file MAP_SYNC", make_provider, &sync, &opts));
    HM_TEST_PHASE(hm_test_pool_suite("proxy/file MAP_SYNC", make_pool, &sync, &opts));
    CHECK_MSG(rmdir(dir) == 0, "files left behind in %s", dir);
    return hm_test_finish();
}
