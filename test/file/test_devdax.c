/* hetmem tests — the devdax provider without a device: sysfs parsing over
 * fake sysfs trees, the alignment rules, and the error paths of create.
 * (test_devdax_device runs the provider on a real device.)
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "providers/devdax/devdax.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static char root[256];

static void put_file(const char *rel, const char *content) {
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(content, f);
    fclose(f);
}

static void rm_file(const char *rel) {
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    unlink(path);
}

static void mk_dir(const char *rel) {
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    REQUIRE(mkdir(path, 0755) == 0 || errno == EEXIST);
}

static void mk_link(const char *target, const char *rel) {
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    unlink(path);
    REQUIRE(symlink(target, path) == 0);
}

/* The kernel's layout, in miniature:
 *   devices/platform/region0/dax_region/align
 *   devices/platform/region0/dax0.0/{size,align?,subsystem -> bus/dax}
 *   dev/char/250:3 -> ../../devices/platform/region0/dax0.0
 *   dev/char/1:3   -> a "mem" device (not DAX) */
static void make_tree(void) {
    const char *dirs[] = {"dev", "dev/char", "bus", "bus/dax", "class", "class/mem", "devices",
                          "devices/platform", "devices/platform/region0",
                          "devices/platform/region0/dax_region",
                          "devices/platform/region0/dax0.0", "devices/virtual",
                          "devices/virtual/null"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) mk_dir(dirs[i]);
    mk_link("../../devices/platform/region0/dax0.0", "dev/char/250:3");
    mk_link("../../../../bus/dax", "devices/platform/region0/dax0.0/subsystem");
    put_file("devices/platform/region0/dax0.0/size", "4294967296\n");
    put_file("devices/platform/region0/dax0.0/align", "2097152\n");
    put_file("devices/platform/region0/dax_region/align", "1073741824\n");
    mk_link("../../devices/virtual/null", "dev/char/1:3");
    mk_link("../../../class/mem", "devices/virtual/null/subsystem");
}

static void test_sysfs(void) {
    uint64_t size = 0, align = 0;
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_EQ(size, 4294967296ull);
    CHECK_EQ(align, 2u << 20);

    /* Older kernels: no per-device align; the region's align is used. */
    rm_file("devices/platform/region0/dax0.0/align");
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_EQ(align, 1u << 30);
    /* No alignment anywhere: the 2 MiB default. */
    rm_file("devices/platform/region0/dax_region/align");
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_EQ(align, 2u << 20);
    /* The old dax class layout: device/dax_region/align. */
    mk_dir("devices/platform/region0/dax0.0/device");
    mk_dir("devices/platform/region0/dax0.0/device/dax_region");
    put_file("devices/platform/region0/dax0.0/device/dax_region/align", "0x1000\n");
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_EQ(align, 4096);
    put_file("devices/platform/region0/dax0.0/align", "65536"); /* no newline: fine */
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_EQ(align, 65536);

    /* Sizes: hex accepted; garbage, negative, empty, zero refused. */
    put_file("devices/platform/region0/dax0.0/size", "0x40000000\n");
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_EQ(size, 1u << 30);
    const char *bad_sizes[] = {"abc\n", "-4096\n", "\n", "", "0\n", "12 34\n", "4096k\n",
                               "99999999999999999999999\n"};
    for (size_t i = 0; i < sizeof(bad_sizes) / sizeof(bad_sizes[0]); i++) {
        put_file("devices/platform/region0/dax0.0/size", bad_sizes[i]);
        CHECK_MSG(hm__devdax_sysfs_read(root, 250, 3, &size, &align) ==
                      HM_ERROR_INVALID_ARGUMENT,
                  "size file '%s' accepted", bad_sizes[i]);
    }
    rm_file("devices/platform/region0/dax0.0/size");
    CHECK_RES(hm__devdax_sysfs_read(root, 250, 3, &size, &align), HM_ERROR_INVALID_ARGUMENT);
    put_file("devices/platform/region0/dax0.0/size", "4294967296\n");
    put_file("devices/platform/region0/dax0.0/align", "two megs\n");
    CHECK_RES(hm__devdax_sysfs_read(root, 250, 3, &size, &align), HM_ERROR_INVALID_ARGUMENT);
    put_file("devices/platform/region0/dax0.0/align", "2097152\n");

    /* Not a DAX device: another subsystem, no subsystem link, no entry. */
    CHECK_RES(hm__devdax_sysfs_read(root, 1, 3, &size, &align), HM_ERROR_INVALID_ARGUMENT);
    rm_file("devices/platform/region0/dax0.0/subsystem");
    CHECK_RES(hm__devdax_sysfs_read(root, 250, 3, &size, &align), HM_ERROR_INVALID_ARGUMENT);
    mk_link("../../../../class/dax", "devices/platform/region0/dax0.0/subsystem"); /* old class */
    CHECK_OK(hm__devdax_sysfs_read(root, 250, 3, &size, &align));
    CHECK_RES(hm__devdax_sysfs_read(root, 250, 4, &size, &align), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_sysfs_read("/nonexistent-sysfs", 250, 3, &size, &align),
              HM_ERROR_INVALID_ARGUMENT);
}

static void test_geometry(void) {
    const size_t page = 4096;
    uint64_t u = 0;
    CHECK_OK(hm__devdax_geometry(4ull << 30, 2u << 20, 0, page, &u));
    CHECK_EQ(u, 4ull << 30);
    /* The usable size is rounded down to the alignment. */
    CHECK_OK(hm__devdax_geometry((4ull << 30) + 12345, 2u << 20, 0, page, &u));
    CHECK_EQ(u, 4ull << 30);
    CHECK_OK(hm__devdax_geometry(4ull << 30, 2u << 20, (1u << 30) + 5, page, &u));
    CHECK_EQ(u, 1u << 30);
    CHECK_OK(hm__devdax_geometry(1u << 30, 1u << 30, 0, page, &u));
    CHECK_EQ(u, 1u << 30);
    CHECK_OK(hm__devdax_geometry(8192, 4096, 0, page, &u));
    CHECK_EQ(u, 8192);
    /* Refused: not a power of two, below the page, above 1 GiB, a device or
     * limit smaller than one unit, a limit beyond the device. */
    CHECK_RES(hm__devdax_geometry(4ull << 30, 3u << 20, 0, page, &u), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_geometry(4ull << 30, 0, 0, page, &u), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_geometry(4ull << 30, 2048, 0, page, &u), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_geometry(8ull << 30, 2u << 30, 0, page, &u), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_geometry(1u << 20, 2u << 20, 0, page, &u), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_geometry(4ull << 30, 2u << 20, 1u << 20, page, &u),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__devdax_geometry(4ull << 30, 2u << 20, 5ull << 30, page, &u),
              HM_ERROR_INVALID_ARGUMENT);
}

static hm_result_t create_with_root(const char *path, const char *sysfs, uint64_t limit,
                                    hm_provider_t **p) {
    hm_devdax_params_t *dp;
    hm_result_t r = hm_devdax_params_create(path, &dp);
    if (r != HM_SUCCESS) return r;
    if (sysfs) hm__devdax_params_set_sysfs_root(dp, sysfs);
    if (limit) hm_devdax_params_set_size(dp, limit);
    r = hm_provider_create(hm_devdax_provider_ops(), dp, p);
    hm_devdax_params_destroy(dp);
    return r;
}

static void test_create_errors(void) {
    hm_provider_t *p = NULL;
    hm_devdax_params_t *dp;
    CHECK_RES(hm_devdax_params_create(NULL, &dp), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_devdax_params_create("", &dp), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_devdax_params_create("/dev/dax0.0", NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_devdax_params_set_size(NULL, 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_devdax_params_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_create(hm_devdax_provider_ops(), NULL, &p), HM_ERROR_INVALID_ARGUMENT);

    /* Missing path. */
    CHECK_RES(hm_devdax_provider_create("/dev/dax-does-not-exist.0", &p),
              HM_ERROR_INVALID_ARGUMENT);
    const char *msg = NULL;
    CHECK_EQ(hm_last_native_error(&msg), ENOENT);
    /* A regular file or a directory. */
    char file[512];
    snprintf(file, sizeof(file), "%s/regular", root);
    put_file("regular", "x");
    CHECK_RES(hm_devdax_provider_create(file, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_devdax_provider_create(root, &p), HM_ERROR_INVALID_ARGUMENT);
    /* A character device that is not DAX, by the real sysfs (/dev/null is
     * in subsystem "mem") and by the fake one. */
    CHECK_RES(hm_devdax_provider_create("/dev/null", &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(create_with_root("/dev/null", root, 0, &p), HM_ERROR_INVALID_ARGUMENT);

    /* A character device that sysfs calls DAX but that refuses MAP_SYNC:
     * /dev/zero posing as dax (1:5) in the fake tree. Clear NOT_SUPPORTED. */
    struct stat st;
    if (stat("/dev/zero", &st) == 0 && S_ISCHR(st.st_mode)) {
        char rel[64];
        snprintf(rel, sizeof(rel), "dev/char/%u:%u", major(st.st_rdev), minor(st.st_rdev));
        mk_link("../../devices/platform/region0/dax0.0", rel);
        put_file("devices/platform/region0/dax0.0/size", "4194304\n");
        put_file("devices/platform/region0/dax0.0/align", "2097152\n");
        CHECK_RES(create_with_root("/dev/zero", root, 0, &p), HM_ERROR_NOT_SUPPORTED);
        /* Geometry errors surface before any mapping. */
        CHECK_RES(create_with_root("/dev/zero", root, 8u << 20, &p), HM_ERROR_INVALID_ARGUMENT);
        put_file("devices/platform/region0/dax0.0/align", "3000000\n");
        CHECK_RES(create_with_root("/dev/zero", root, 0, &p), HM_ERROR_INVALID_ARGUMENT);
        put_file("devices/platform/region0/dax0.0/align", "2097152\n");
    }
}

static void remove_tree(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

int main(void) {
    snprintf(root, sizeof(root), "/tmp/hm-fake-sysfs-XXXXXX");
    REQUIRE(mkdtemp(root));
    make_tree();
    test_sysfs();
    test_geometry();
    test_create_errors();
    remove_tree(root);
    return hm_test_finish();
}
