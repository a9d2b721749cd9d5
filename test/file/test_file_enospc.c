/* hetmem tests — the file provider on a full filesystem: a 1 MiB tmpfs made
 * by the test (skipped, exit 77, where mount is not permitted). Growth that
 * does not fit fails with HM_ERROR_OUT_OF_MEMORY and the native error
 * ENOSPC; nothing already written is lost; freed space is reused.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)

static char dir[256];

static void cleanup(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/data", dir);
    unlink(path);
    umount2(dir, MNT_DETACH);
    rmdir(dir);
}

int main(void) {
    snprintf(dir, sizeof(dir), "/tmp/hm-enospc-XXXXXX");
    REQUIRE(mkdtemp(dir));
    if (mount("hm-test", dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m") != 0) {
        int e = errno;
        rmdir(dir);
        HM_TEST_SKIP("cannot mount a size-limited tmpfs (%s): not root or no permission",
                     strerror(e));
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/data", dir);
    hm_provider_t *p;
    /* Default growth (16 MiB) does not fit in 1 MiB: each growth falls back
     * to exactly what the allocation needs. */
    REQUIRE_OK(hm_file_provider_create(path, &p));
    void *live[64];
    int n = 0;
    hm_result_t r = HM_SUCCESS;
    while (n < 64) {
        r = hm_provider_alloc(p, 64 * KIB, 0, &live[n]);
        if (r != HM_SUCCESS) break;
        hm_test_fill(live[n], 64 * KIB, (uint64_t)n);
        n++;
    }
    printf("%d x 64 KiB fit in the 1 MiB tmpfs\n", n);
    CHECK(n >= 8 && n <= 16);
    CHECK_RES(r, HM_ERROR_OUT_OF_MEMORY);
    const char *msg = NULL;
    int64_t native = hm_last_native_error(&msg);
    CHECK_MSG(native == ENOSPC, "native error %lld (%s), expected ENOSPC", (long long)native,
              msg ? msg : "");
    /* Again, and bigger: the same clear error, nothing broken. */
    void *x;
    CHECK_RES(hm_provider_alloc(p, 512 * KIB, 0, &x), HM_ERROR_OUT_OF_MEMORY);
    CHECK_RES(hm_provider_alloc(p, 64 * KIB, 0, &x), HM_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < n; i++)
        CHECK_MSG(hm_test_verify(live[i], 64 * KIB, (uint64_t)i), "allocation %d damaged", i);
    /* Freed space is reused without growing. */
    if (n >= 2) {
        CHECK_OK(hm_provider_free(p, live[1], 64 * KIB));
        CHECK_OK(hm_provider_alloc(p, 64 * KIB, 0, &live[1]));
        hm_test_fill(live[1], 64 * KIB, 1);
    }
    /* Punch a hole, fill the space from elsewhere, then allocate the punched
     * range anew: it must be backed again or fail cleanly, never SIGBUS. */
    if (n >= 3) {
        CHECK_OK(hm_provider_purge_force(p, live[2], 64 * KIB));
        CHECK_OK(hm_provider_free(p, live[2], 64 * KIB));
        char filler[512];
        snprintf(filler, sizeof(filler), "%s/filler", dir);
        int fd = open(filler, O_RDWR | O_CREAT, 0600);
        REQUIRE(fd >= 0);
        int fr = posix_fallocate(fd, 0, 64 * KIB);
        if (fr == 0) {
            /* The space is gone: the re-allocation must fail cleanly. */
            CHECK_RES(hm_provider_alloc(p, 64 * KIB, 0, &live[2]), HM_ERROR_OUT_OF_MEMORY);
            close(fd);
            unlink(filler);
            CHECK_OK(hm_provider_alloc(p, 64 * KIB, 0, &live[2]));
        } else {
            close(fd);
            unlink(filler);
            CHECK_OK(hm_provider_alloc(p, 64 * KIB, 0, &live[2]));
        }
        hm_test_fill(live[2], 64 * KIB, 2); /* would SIGBUS if not backed */
    }
    CHECK_OK(hm_provider_destroy(p));

    /* Persistence: everything written is in the file. */
    REQUIRE_OK(hm_file_provider_create(path, &p));
    for (int i = 0; i < n; i++) {
        CHECK_OK(hm_provider_alloc(p, 64 * KIB, 0, &x));
        if (x) CHECK_MSG(hm_test_verify(x, 64 * KIB, (uint64_t)i), "allocation %d lost", i);
    }
    CHECK_OK(hm_provider_destroy(p));
    cleanup();
    return hm_test_finish();
}
