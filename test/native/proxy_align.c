/* hetmem tests — the aligned allocation calls behave as the system's libc
 * does (test_proxy_malloc runs this with and without libhetmem_proxy.so and
 * compares the output): memalign rounds an alignment that is not a power of
 * two up to the next one, as glibc does; posix_memalign refuses it; valloc
 * and pvalloc return page-aligned blocks; huge requests fail with ENOMEM.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "ok A" when p is aligned to A and writable, "NULL errno" otherwise. */
static void report(const char *what, void *p, size_t align, int err) {
    if (!p) {
        printf("%s: NULL %s\n", what, err == ENOMEM ? "ENOMEM" : err == EINVAL ? "EINVAL" : "?");
        return;
    }
    memset(p, 0x5a, 64);
    printf("%s: %s\n", what, (uintptr_t)p % align ? "MISALIGNED" : "ok");
    free(p);
}

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    static const size_t odd[] = {24, 48, 100, 1000, 3000, 5000};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        size_t a = odd[i], up = 1;
        while (up < a) up <<= 1;
        char what[64];
        snprintf(what, sizeof what, "memalign(%zu)", a);
        errno = 0;
        void *p = memalign(a, 100);
        report(what, p, up, errno);
        snprintf(what, sizeof what, "posix_memalign(%zu)", a);
        p = NULL;
        int e = posix_memalign(&p, a, 100);
        report(what, p, up, e);
    }
    for (size_t a = 1; a <= ((size_t)1 << 20); a <<= 1) {
        char what[64];
        snprintf(what, sizeof what, "memalign(%zu)", a);
        errno = 0;
        void *p = memalign(a, 200);
        report(what, p, a, errno);
    }
    volatile size_t huge = SIZE_MAX - 4096; /* not a constant: no compile-time warning */
    errno = 0;
    void *p = memalign(64, huge);
    report("memalign(64, huge)", p, 64, errno);
    errno = 0;
    p = valloc(100);
    report("valloc", p, page, errno);
    errno = 0;
    p = pvalloc(100);
    report("pvalloc", p, page, errno);
    return 0;
}
