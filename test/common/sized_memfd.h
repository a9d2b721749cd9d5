/* hetmem tests — the GPU test drivers' allocation files: a memfd whose name
 * records the size the allocation asked for ("<prefix>:<size>") and that is
 * sealed against resizing once sized, so that an importer learns the size
 * of what a handle names from the file it was given (as a real driver
 * learns it from its kernel object), never from bytes of the handle that
 * its peer could rewrite. Header-only: each driver is its own library.
 * SPDX-License-Identifier: MIT */
#ifndef HM_TEST_SIZED_MEMFD_H
#define HM_TEST_SIZED_MEMFD_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A sealable memfd named "<prefix>:<size>"; -1 and errno on failure. */
static inline int sized_memfd_create(const char *prefix, size_t size) {
    char name[64];
    snprintf(name, sizeof name, "%s:%zu", prefix, size);
    return memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

/* Seal it once sized: no resize, no further seal. */
static inline bool sized_memfd_seal(int fd) {
    return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
}

/* The size recorded in the name of fd, a memfd of `prefix` sealed against
 * resizing; 0 for any other file. */
static inline uint64_t sized_memfd_size(const char *prefix, int fd) {
    char link[64], name[128], pfx[80];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, name, sizeof name - 1);
    if (n <= 0) return 0;
    name[n] = '\0';
    int plen = snprintf(pfx, sizeof pfx, "/memfd:%s:", prefix);
    if (plen <= 0 || strncmp(name, pfx, (size_t)plen) != 0) return 0;
    const char *digits = name + plen;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(digits, &end, 10);
    if (errno || end == digits || (*end != '\0' && *end != ' ')) return 0;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return 0;
    return (uint64_t)v;
}

#endif
