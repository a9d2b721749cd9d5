/* hetmem tests — each malloc-family entry point as a program's first call
 * into the family, on a block glibc allocated before the malloc replacement
 * served anything (test_proxy_malloc runs this with and without
 * libhetmem_proxy.so and compares the output).
 *
 *   proxy_first_call ENTRY   ENTRY: malloc_usable_size, free, realloc,
 *                            malloc, calloc, posix_memalign, aligned_alloc,
 *                            memalign, valloc, pvalloc
 *
 * The block comes from __libc_malloc, glibc's own allocator, which the
 * replacement does not interpose: as a block allocated by glibc before the
 * replacement took over (during start-up, or by code that calls glibc
 * directly). Nothing before the first call may touch the family (printf
 * allocates its buffer), so results are printed at the end. Printed: the
 * block's usable size before and after, whether its bytes survived, and
 * whether the entry's own result was right; these are the same with and
 * without the replacement.
 * SPDX-License-Identifier: MIT */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);

#define EARLY 100

static int intact(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 7 + 1)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *entry = argv[1];
    unsigned char *early = __libc_malloc(EARLY);
    if (!early) return 3;
    for (size_t i = 0; i < EARLY; i++) early[i] = (unsigned char)(i * 7 + 1);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    /* The first call. */
    size_t first_usable = 0;
    int entry_ok = 0, freed = 0;
    void *q = NULL;
    if (!strcmp(entry, "malloc_usable_size")) {
        first_usable = malloc_usable_size(early);
        entry_ok = first_usable >= EARLY;
    } else if (!strcmp(entry, "free")) {
        free(early);
        freed = entry_ok = 1;
    } else if (!strcmp(entry, "realloc")) {
        unsigned char *r = realloc(early, 3 * EARLY);
        entry_ok = r && intact(r, EARLY) && malloc_usable_size(r) >= 3 * EARLY;
        if (r) early = r;
    } else if (!strcmp(entry, "malloc")) {
        q = malloc(EARLY);
        entry_ok = q != NULL;
    } else if (!strcmp(entry, "calloc")) {
        unsigned char *c = calloc(EARLY, 3);
        entry_ok = c != NULL;
        for (size_t i = 0; c && i < 3 * EARLY; i++) entry_ok &= c[i] == 0;
        q = c;
    } else if (!strcmp(entry, "posix_memalign")) {
        entry_ok = posix_memalign(&q, 256, EARLY) == 0 && (uintptr_t)q % 256 == 0;
    } else if (!strcmp(entry, "aligned_alloc")) {
        q = aligned_alloc(512, 1024);
        entry_ok = q && (uintptr_t)q % 512 == 0;
    } else if (!strcmp(entry, "memalign")) {
        q = memalign(128, EARLY);
        entry_ok = q && (uintptr_t)q % 128 == 0;
    } else if (!strcmp(entry, "valloc")) {
        q = valloc(EARLY);
        entry_ok = q && (uintptr_t)q % page == 0;
    } else if (!strcmp(entry, "pvalloc")) {
        q = pvalloc(EARLY);
        entry_ok = q && (uintptr_t)q % page == 0;
    } else {
        return 2;
    }
    if (q) memset(q, 0x5a, EARLY);

    /* Then everything else, on both kinds of blocks. */
    size_t later_usable = freed ? 0 : malloc_usable_size(early);
    int bytes_ok = freed || intact(early, EARLY);
    int later_ok = 1;
    void *p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = malloc((size_t)(i + 1) * 40);
        later_ok &= p[i] != NULL && malloc_usable_size(p[i]) >= (size_t)(i + 1) * 40;
        if (p[i]) memset(p[i], i, (size_t)(i + 1) * 40);
    }
    for (int i = 0; i < 64; i += 2) {
        void *r = realloc(p[i], (size_t)(i + 1) * 400);
        later_ok &= r != NULL;
        if (r) p[i] = r;
    }
    for (int i = 0; i < 64; i++) free(p[i]);
    free(q);
    if (!freed) free(early);

    printf("%s: entry %s, early block usable %zu then %zu, bytes %s, later calls %s\n", entry,
           entry_ok ? "ok" : "WRONG", first_usable, later_usable, bytes_ok ? "kept" : "LOST",
           later_ok ? "ok" : "WRONG");
    return entry_ok && bytes_ok && later_ok ? 0 : 1;
}
