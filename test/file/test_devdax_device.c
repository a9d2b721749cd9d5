/* hetmem tests — the devdax provider on a real (or emulated) device DAX named
 * by HM_TEST_DEVDAX_PATH (e.g. /dev/dax0.0); skipped (exit 77) without one.
 * HM_TEST_DEVDAX_ALIGN (bytes), when set, is the alignment it must report.
 * THE DEVICE'S CONTENTS ARE OVERWRITTEN. Also: the provider's descriptor is
 * kept out of the program's way and left alone once the program replaces it.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dev;

static hm_result_t make_provider(void *arg, hm_provider_t **out) {
    return hm_devdax_provider_create(dev, out);
}

/* arg NULL: the proxy pool; non-NULL: the native pool. */
static hm_result_t make_pool(void *arg, hm_pool_t **out) {
    hm_provider_t *prov;
    hm_result_t r = make_provider(arg, &prov);
    if (r != HM_SUCCESS) return r;
    r = arg ? hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, out)
            : hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

int main(void) {
    dev = getenv("HM_TEST_DEVDAX_PATH");
    if (!dev || !*dev) HM_TEST_SKIP("HM_TEST_DEVDAX_PATH is not set (no device DAX to test)");
    hm_provider_t *p;
    REQUIRE_OK(hm_devdax_provider_create(dev, &p));
    hm_provider_info_t info;
    CHECK_OK(hm_provider_get_info(p, &info));
    printf("%s: page %zu, device alignment %zu, caps %#x\n", dev, info.min_page_size,
           info.recommended_page_size, info.caps);
    CHECK(strcmp(info.name, "devdax") == 0);
    CHECK_EQ(info.family, HM_PROVIDER_FAMILY_DEVDAX);
    CHECK(info.caps & HM_PROVIDER_CAP_FREE);
    CHECK(!(info.caps & (HM_PROVIDER_CAP_PURGE_LAZY | HM_PROVIDER_CAP_PURGE_FORCE)));
    CHECK(info.recommended_page_size >= info.min_page_size);
    /* The alignment the device was made with, where the caller knows it
     * (scripts/vm-test.sh: 2 MiB). */
    const char *want_align = getenv("HM_TEST_DEVDAX_ALIGN");
    if (want_align && *want_align)
        CHECK_EQ(info.recommended_page_size, (size_t)strtoull(want_align, NULL, 0));

    /* Exhaust the device to learn its usable size, then free all. */
    size_t unit = info.recommended_page_size, total = 0;
    void *first = NULL, *x;
    while (hm_provider_alloc(p, unit, 0, &x) == HM_SUCCESS) {
        if (!first) first = x;
        total += unit;
    }
    printf("%zu bytes usable\n", total);
    REQUIRE(total >= 4 * unit);
    CHECK_OK(hm_provider_destroy(p));

    /* Persistence across providers: offset 0 first. */
    REQUIRE_OK(hm_devdax_provider_create(dev, &p));
    REQUIRE_OK(hm_provider_alloc(p, 3 * unit + 4096, unit, &x));
    CHECK((uintptr_t)x % unit == 0);
    hm_test_fill(x, 3 * unit + 4096, 4242);
    void *y;
    REQUIRE_OK(hm_provider_alloc(p, 4096, 0, &y)); /* sub-alignment pieces work */
    memset(y, 7, 4096);
    /* IPC payload round trip in one process: a second mapping of the range. */
    const hm_provider_ops_t *ops = hm_provider_get_ops(p);
    void *st = hm_provider_get_state(p);
    unsigned char payload[1024];
    REQUIRE(ops->ipc.handle_size(st) <= sizeof(payload));
    int fd = -1;
    CHECK_OK(ops->ipc.get(st, y, 4096, payload, &fd));
    CHECK(fd >= 0); /* the memory moves as the device's descriptor */
    void *m = NULL;
    CHECK_RES(ops->ipc.open(st, payload, -1, 4096, &m), HM_ERROR_INVALID_HANDLE); /* no path */
    CHECK_OK(ops->ipc.open(st, payload, fd, 4096, &m));
    if (m) {
        CHECK(m != y && ((unsigned char *)m)[100] == 7);
        CHECK_OK(ops->ipc.close(st, m, 4096));
    }
    CHECK_OK(hm_provider_free(p, y, 4096));
    CHECK_OK(hm_provider_destroy(p));
    REQUIRE_OK(hm_devdax_provider_create(dev, &p));
    REQUIRE_OK(hm_provider_alloc(p, 3 * unit + 4096, unit, &x));
    CHECK_MSG(hm_test_verify(x, 3 * unit + 4096, 4242), "data lost across providers");
    CHECK_OK(hm_provider_destroy(p));

    /* The provider's descriptor: high and close-on-exec; a program that
     * puts another file at its number keeps it (the provider needs the
     * descriptor for nothing but exports and its close). */
    REQUIRE_OK(hm_devdax_provider_create(dev, &p));
    char real[PATH_MAX];
    REQUIRE(realpath(dev, real));
    int dfd = -1;
    for (int i = 0; i < 4096 && dfd < 0; i++) {
        char link[64], to[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", i);
        ssize_t n = readlink(link, to, sizeof to - 1);
        if (n <= 0) continue;
        to[n] = 0;
        if (!strcmp(to, real)) dfd = i;
    }
    CHECK_MSG(dfd >= 256, "the device is descriptor %d", dfd);
    if (dfd >= 0) {
        CHECK(fcntl(dfd, F_GETFD) & FD_CLOEXEC);
        int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
        REQUIRE(other >= 0 && dup2(other, dfd) == dfd);
        REQUIRE_OK(hm_provider_alloc(p, 4096, 0, &y)); /* mapped at create: works */
        memset(y, 9, 4096);
        CHECK_OK(hm_provider_free(p, y, 4096));
        CHECK_OK(hm_provider_destroy(p));
        struct stat a, b;
        CHECK(fstat(dfd, &a) == 0 && fstat(other, &b) == 0 && a.st_ino == b.st_ino);
        close(dfd);
        close(other);
    } else {
        CHECK_OK(hm_provider_destroy(p));
    }

    size_t cap = total < (256u << 20) ? total : (256u << 20);
    hm_test_suite_opts_t opts = {.max_alloc = cap / 4, .max_alignment = unit, .can_free = 1,
                                 .capacity = total};
    hm_test_provider_suite("devdax", make_provider, NULL, &opts);
    hm_test_pool_suite("proxy/devdax", make_pool, NULL, &opts);
    hm_test_pool_suite("native/devdax", make_pool, "native", &opts);
    return hm_test_finish();
}
