/* hetmem — platform primitives for Linux. SPDX-License-Identifier: MIT
 *
 * See prim.h for the contract. Raw syscall numbers and Linux-only flags are
 * confined to this file. */
#include "platform/prim.h"
#include "fork.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#include <unistd.h>

#if __has_include(<sys/random.h>)
#include <sys/random.h>
#define HM_HAVE_GETRANDOM 1
#endif

/* Flags that older headers may lack; the values are the kernel ABI. */
#ifndef MAP_HUGETLB
#define MAP_HUGETLB 0x40000
#endif
#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif
#ifndef MAP_HUGE_1GB
#define MAP_HUGE_1GB (30 << MAP_HUGE_SHIFT)
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MADV_FREE
#define MADV_FREE 8
#endif
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif
#ifndef MADV_NOHUGEPAGE
#define MADV_NOHUGEPAGE 15
#endif
#ifndef MADV_REMOVE
#define MADV_REMOVE 9
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef MFD_HUGE_SHIFT
#define MFD_HUGE_SHIFT 26
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << MFD_HUGE_SHIFT)
#endif
#ifndef MFD_HUGE_1GB
#define MFD_HUGE_1GB (30U << MFD_HUGE_SHIFT)
#endif
#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef SYS_memfd_create
#if defined(__x86_64__)
#define SYS_memfd_create 319
#elif defined(__aarch64__)
#define SYS_memfd_create 279
#endif
#endif

/* ---- sizes ---- */

static _Atomic size_t page_size_cache;

HM_RUN size_t hm__prim_page_size(void) {
    size_t ps = atomic_load_explicit(&page_size_cache, memory_order_relaxed);
    if (hm_likely(ps)) return ps;
    long v = sysconf(_SC_PAGESIZE);
    ps = (v > 0 && hm_is_pow2((size_t)v)) ? (size_t)v : 4096;
    atomic_store_explicit(&page_size_cache, ps, memory_order_relaxed);
    return ps;
}

/* Read one unsigned number from a sysfs/procfs file; 0 on success. */
static int read_u64_file(const char *path, uint64_t *value) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[64];
    ssize_t n;
    do {
        n = read(fd, buf, sizeof(buf) - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf) return -1;
    *value = v;
    return 0;
}

static _Atomic size_t thp_size_cache; /* 0: unknown yet; 1: none */

size_t hm__prim_thp_size(void) {
    size_t s = atomic_load_explicit(&thp_size_cache, memory_order_relaxed);
    if (hm_likely(s)) return s == 1 ? 0 : s;
    uint64_t v = 0;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        s = 1;
    else if (read_u64_file("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", &v) == 0 &&
             hm_is_pow2((size_t)v))
        s = (size_t)v;
    else
        s = (size_t)2 << 20; /* kernels before 4.x lack hpage_pmd_size */
    atomic_store_explicit(&thp_size_cache, s, memory_order_relaxed);
    return s == 1 ? 0 : s;
}

hm_result_t hm__prim_hugetlb_available(size_t size, uint64_t *configured_pages) {
    if (configured_pages) *configured_pages = 0;
    if (!hm_is_pow2(size) || size < hm__prim_page_size()) return HM_ERROR_INVALID_ARGUMENT;
    char dir[96], path[160];
    snprintf(dir, sizeof(dir), "/sys/kernel/mm/hugepages/hugepages-%zukB", size >> 10);
    if (access(dir, F_OK) != 0) return HM_ERROR_NOT_SUPPORTED;
    uint64_t nr = 0, over = 0;
    snprintf(path, sizeof(path), "%s/nr_hugepages", dir);
    if (read_u64_file(path, &nr) != 0) nr = 0;
    snprintf(path, sizeof(path), "%s/nr_overcommit_hugepages", dir);
    if (read_u64_file(path, &over) != 0) over = 0;
    if (configured_pages) *configured_pages = nr + over;
    return nr + over ? HM_SUCCESS : HM_ERROR_OUT_OF_MEMORY;
}

/* ---- mappings ---- */

static int os_prot(unsigned prot) {
    int p = PROT_NONE;
    if (prot & HM_PRIM_PROT_READ) p |= PROT_READ;
    if (prot & HM_PRIM_PROT_WRITE) p |= PROT_WRITE;
    if (prot & HM_PRIM_PROT_EXEC) p |= PROT_EXEC;
    return p;
}

static int os_map_flags(unsigned flags, int fd) {
    int f = (flags & HM_PRIM_MAP_SHARED) ? MAP_SHARED : MAP_PRIVATE;
    if (fd < 0) f |= MAP_ANONYMOUS;
    if (flags & HM_PRIM_MAP_NORESERVE) f |= MAP_NORESERVE;
    if (fd < 0 && (flags & HM_PRIM_MAP_HUGETLB_2M)) f |= MAP_HUGETLB | MAP_HUGE_2MB;
    if (fd < 0 && (flags & HM_PRIM_MAP_HUGETLB_1G)) f |= MAP_HUGETLB | MAP_HUGE_1GB;
    return f;
}

/* Unmap a trimmed piece; failure here leaves only unused address space
 * behind, so it is recorded and otherwise ignored. */
HM_RUN static void unmap_piece(void *addr, size_t size) {
    if (size && munmap(addr, size) != 0)
        (void)hm__errno_result(errno, "munmap(%p, %zu) of an alignment trim", addr, size);
}

HM_RUN
hm_result_t hm__prim_map(size_t size, size_t alignment, unsigned prot, unsigned flags, int fd,
                         uint64_t offset, void **out) {
    *out = NULL;
    const size_t page = hm__prim_page_size();
    if (size == 0) return hm__errno_result(EINVAL, "mmap(size 0)");
    if (size > (size_t)PTRDIFF_MAX || offset > (uint64_t)INT64_MAX)
        return hm__errno_result(ENOMEM, "mmap(%zu bytes at offset %" PRIu64 "): too large", size,
                                offset);
    if (alignment && !hm_is_pow2(alignment))
        return hm__errno_result(EINVAL, "mmap: alignment %zu is not a power of two", alignment);
    const int p = os_prot(prot);
    const int f = os_map_flags(flags, fd);
    const int huge = (flags & (HM_PRIM_MAP_HUGETLB_2M | HM_PRIM_MAP_HUGETLB_1G)) != 0;

    if (alignment <= page) {
        void *a = mmap(NULL, size, p, f, fd, (off_t)offset);
        if (a == MAP_FAILED)
            return hm__errno_result(errno, "mmap(%zu bytes, fd %d, offset %" PRIu64 ")", size,
                                    fd, offset);
        *out = a;
        return HM_SUCCESS;
    }

    /* Over-map by alignment - page, keep the aligned middle (the classic
     * trick; mimalloc's _mi_prim_alloc_aligned does the same). */
    const size_t extra = alignment - page;
    if (size > (size_t)PTRDIFF_MAX - extra)
        return hm__errno_result(ENOMEM, "mmap(%zu bytes aligned to %zu): too large", size,
                                alignment);
    const size_t span = size + extra;

    if (fd < 0 && !huge) {
        /* Anonymous base pages: map for real, trim the ends. */
        char *a = mmap(NULL, span, p, f, -1, 0);
        if (a == MAP_FAILED)
            return hm__errno_result(errno, "mmap(%zu bytes to align %zu bytes to %zu)", span,
                                    size, alignment);
        char *aligned = (char *)hm_align_up((uintptr_t)a, alignment);
        unmap_piece(a, (size_t)(aligned - a));
        unmap_piece(aligned + size, (size_t)((a + span) - (aligned + size)));
        *out = aligned;
        return HM_SUCCESS;
    }

    /* File or hugetlb mappings cannot be trimmed at an arbitrary base page
     * (hugetlb) or would commit file space for the slack: reserve an
     * inaccessible, unbacked window, then put the real mapping over its
     * aligned part. The window is ours, so MAP_FIXED replaces nothing else. */
    char *w = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w == MAP_FAILED)
        return hm__errno_result(errno, "mmap(reserve %zu bytes to align %zu bytes to %zu)", span,
                                size, alignment);
    char *aligned = (char *)hm_align_up((uintptr_t)w, alignment);
    void *a = mmap(aligned, size, p, f | MAP_FIXED, fd, (off_t)offset);
    if (a == MAP_FAILED) {
        int e = errno;
        unmap_piece(w, span);
        return hm__errno_result(e, "mmap(%zu bytes, fd %d, offset %" PRIu64 ", fixed at %p)",
                                size, fd, offset, (void *)aligned);
    }
    unmap_piece(w, (size_t)(aligned - w));
    unmap_piece(aligned + size, (size_t)((w + span) - (aligned + size)));
    *out = aligned;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm__prim_unmap(void *addr, size_t size) {
    if (munmap(addr, size) != 0) return hm__errno_result(errno, "munmap(%p, %zu)", addr, size);
    return HM_SUCCESS;
}

hm_result_t hm__prim_protect(void *addr, size_t size, unsigned prot) {
    if (mprotect(addr, size, os_prot(prot)) != 0)
        return hm__errno_result(errno, "mprotect(%p, %zu, %#x)", addr, size, prot);
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm__prim_advise(void *addr, size_t size, hm_prim_advice_t advice) {
    int a;
    const char *name;
    switch (advice) {
    case HM_PRIM_ADVISE_FREE:
        if (madvise(addr, size, MADV_FREE) == 0) return HM_SUCCESS;
        /* EINVAL: a kernel before 4.5, or a mapping MADV_FREE does not
         * apply to (shared, hugetlb): drop the pages instead. */
        if (errno != EINVAL)
            return hm__errno_result(errno, "madvise(%p, %zu, MADV_FREE)", addr, size);
        a = MADV_DONTNEED;
        name = "MADV_DONTNEED (MADV_FREE fallback)";
        break;
    case HM_PRIM_ADVISE_DONTNEED: a = MADV_DONTNEED; name = "MADV_DONTNEED"; break;
    case HM_PRIM_ADVISE_REMOVE: a = MADV_REMOVE; name = "MADV_REMOVE"; break;
    case HM_PRIM_ADVISE_HUGEPAGE: a = MADV_HUGEPAGE; name = "MADV_HUGEPAGE"; break;
    case HM_PRIM_ADVISE_NOHUGEPAGE: a = MADV_NOHUGEPAGE; name = "MADV_NOHUGEPAGE"; break;
    default: return hm__errno_result(EINVAL, "madvise: unknown advice %d", (int)advice);
    }
    if (madvise(addr, size, a) != 0)
        return hm__errno_result(errno, "madvise(%p, %zu, %s)", addr, size, name);
    return HM_SUCCESS;
}

hm_result_t hm__prim_resident_pages(const void *addr, size_t size, size_t *pages) {
    *pages = 0;
    const size_t page = hm__prim_page_size();
    size_t n = size / page + (size % page != 0);
    unsigned char vec[256];
    size_t count = 0;
    const char *p = addr;
    /* mincore in chunks, so no allocation is needed for any size. */
    while (n) {
        size_t chunk = n < sizeof(vec) ? n : sizeof(vec);
        if (mincore((void *)(uintptr_t)p, chunk * page, vec) != 0)
            return hm__errno_result(errno, "mincore(%p, %zu)", (const void *)p, chunk * page);
        for (size_t i = 0; i < chunk; i++) count += vec[i] & 1;
        p += chunk * page;
        n -= chunk;
    }
    *pages = count;
    return HM_SUCCESS;
}

/* ---- memory files ---- */

hm_result_t hm__prim_memfd_create(const char *name, unsigned flags, int *fd) {
    *fd = -1;
    unsigned f = MFD_CLOEXEC;
    if (flags & HM_PRIM_MEMFD_HUGETLB_2M) f |= MFD_HUGETLB | MFD_HUGE_2MB;
    if (flags & HM_PRIM_MEMFD_HUGETLB_1G) f |= MFD_HUGETLB | MFD_HUGE_1GB;
    if (flags & HM_PRIM_MEMFD_SEALABLE) f |= MFD_ALLOW_SEALING;
#ifdef SYS_memfd_create
    long r = syscall(SYS_memfd_create, name ? name : "hetmem", f);
    if (r < 0)
        return hm__errno_result(errno, "memfd_create(\"%s\", %#x)", name ? name : "hetmem", f);
    *fd = (int)r;
    return HM_SUCCESS;
#else
    (void)name;
    (void)f;
    return hm__errno_result(ENOSYS, "memfd_create: not available on this architecture");
#endif
}

hm_result_t hm__prim_ftruncate(int fd, uint64_t size) {
    if (size > (uint64_t)INT64_MAX)
        return hm__errno_result(EFBIG, "ftruncate(%d, %" PRIu64 "): too large", fd, size);
    int r;
    do {
        r = ftruncate(fd, (off_t)size);
    } while (r != 0 && errno == EINTR);
    if (r != 0) return hm__errno_result(errno, "ftruncate(%d, %" PRIu64 ")", fd, size);
    return HM_SUCCESS;
}

hm_result_t hm__prim_seal(int fd, unsigned seals) {
    int f = 0;
    if (seals & HM_PRIM_SEAL_SEAL) f |= F_SEAL_SEAL;
    if (seals & HM_PRIM_SEAL_SHRINK) f |= F_SEAL_SHRINK;
    if (seals & HM_PRIM_SEAL_GROW) f |= F_SEAL_GROW;
    if (fcntl(fd, F_ADD_SEALS, f) != 0)
        return hm__errno_result(errno, "fcntl(%d, F_ADD_SEALS, %#x)", fd, (unsigned)f);
    return HM_SUCCESS;
}

hm_result_t hm__prim_seals(int fd, unsigned *seals) {
    *seals = 0;
    int f = fcntl(fd, F_GET_SEALS);
    if (f < 0) {
        int e = errno;
        hm_result_t r = hm__errno_result(e, "fcntl(%d, F_GET_SEALS)", fd);
        return e == EINVAL ? HM_ERROR_NOT_SUPPORTED : r;
    }
    if (f & F_SEAL_SEAL) *seals |= HM_PRIM_SEAL_SEAL;
    if (f & F_SEAL_SHRINK) *seals |= HM_PRIM_SEAL_SHRINK;
    if (f & F_SEAL_GROW) *seals |= HM_PRIM_SEAL_GROW;
    return HM_SUCCESS;
}

hm_result_t hm__prim_punch_hole(int fd, uint64_t offset, uint64_t len) {
    if (offset > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - offset)
        return hm__errno_result(EINVAL, "fallocate(punch hole %" PRIu64 "+%" PRIu64 ")", offset,
                                len);
    int r;
    do {
        r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)len);
    } while (r != 0 && errno == EINTR);
    if (r != 0)
        return hm__errno_result(errno, "fallocate(%d, PUNCH_HOLE, %" PRIu64 ", %" PRIu64 ")", fd,
                                offset, len);
    return HM_SUCCESS;
}

hm_result_t hm__prim_fd_size(int fd, uint64_t *size, uint64_t *allocated) {
    struct stat st;
    if (fstat(fd, &st) != 0) return hm__errno_result(errno, "fstat(%d)", fd);
    if (size) *size = (uint64_t)st.st_size;
    if (allocated) *allocated = (uint64_t)st.st_blocks * 512u;
    return HM_SUCCESS;
}

hm_result_t hm__prim_dup(int fd, int *out) {
    *out = -1;
    int r = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (r < 0) return hm__errno_result(errno, "fcntl(%d, F_DUPFD_CLOEXEC)", fd);
    *out = r;
    return HM_SUCCESS;
}

hm_result_t hm__prim_close(int fd) {
    if (close(fd) != 0 && errno != EINTR) return hm__errno_result(errno, "close(%d)", fd);
    return HM_SUCCESS;
}

/* ---- descriptors hetmem keeps ---- */

/* Failure: the descriptor is closed, *fd = -1. */
static hm_result_t fd_keep_fail(int *fd, const char *call) {
    int e = errno;
    (void)close(*fd);
    hm_result_t r = hm__errno_result(e, "%s(%d)", call, *fd);
    *fd = -1;
    return r;
}

hm_result_t hm__prim_fd_keep(int *fd, hm_prim_file_id_t *id) {
    struct stat st;
    if (fstat(*fd, &st) != 0) return fd_keep_fail(fd, "fstat");
    id->dev = (uint64_t)st.st_dev;
    id->ino = (uint64_t)st.st_ino;
    int min = HM_PRIM_FD_KEEP_MIN;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 2 < (rlim_t)min)
        min = (int)(rl.rlim_cur / 2);
    if (*fd < min) {
        int high = fcntl(*fd, F_DUPFD_CLOEXEC, min);
        if (high >= 0) {
            (void)close(*fd);
            *fd = high;
            return HM_SUCCESS;
        }
        /* EMFILE / EINVAL: nothing free up there; it stays. */
    }
    int flags = fcntl(*fd, F_GETFD);
    if (flags < 0 || (!(flags & FD_CLOEXEC) && fcntl(*fd, F_SETFD, flags | FD_CLOEXEC) != 0))
        return fd_keep_fail(fd, "fcntl(F_SETFD, FD_CLOEXEC)");
    return HM_SUCCESS;
}

bool hm__prim_fd_first_report(const hm_prim_file_id_t *id) {
    /* The flag is the only mutable part of an identity the callers keep const. */
    return !atomic_exchange_explicit(&((hm_prim_file_id_t *)id)->reported, 1,
                                     memory_order_relaxed);
}

hm_result_t hm__prim_fd_check(int fd, const hm_prim_file_id_t *id) {
    struct stat st;
    if (fd < 0) return hm__errno_result(EBADF, "descriptor %d: none", fd);
    if (fstat(fd, &st) != 0) {
        int e = errno;
        return hm__errno_result(e, "fstat(%d)%s", fd, e == EBADF ? ": closed" : "");
    }
    if ((uint64_t)st.st_dev != id->dev || (uint64_t)st.st_ino != id->ino)
        return hm__errno_result(EBADF,
                                "descriptor %d is another file now (device %#" PRIx64
                                ", inode %" PRIu64 "; was %#" PRIx64 ", %" PRIu64 ")",
                                fd, (uint64_t)st.st_dev, (uint64_t)st.st_ino, id->dev, id->ino);
    return HM_SUCCESS;
}

int hm__prim_yama_scope(void) {
    static _Atomic int scope = -2; /* -2: not read yet */
    int v = atomic_load_explicit(&scope, memory_order_relaxed);
    if (v != -2) return v;
    uint64_t x;
    v = read_u64_file("/proc/sys/kernel/yama/ptrace_scope", &x) == 0 && x <= 3 ? (int)x : -1;
    atomic_store_explicit(&scope, v, memory_order_relaxed);
    return v;
}

hm_result_t hm__prim_set_ptracer(int64_t who) {
    unsigned long arg = who < 0 ? (unsigned long)-1 /* PR_SET_PTRACER_ANY */ : (unsigned long)who;
    if (prctl(PR_SET_PTRACER, arg, 0, 0, 0) != 0)
        return hm__errno_result(errno, "prctl(PR_SET_PTRACER, %lld)", (long long)who);
    return HM_SUCCESS;
}

/* ---- processes ---- */

hm_result_t hm__prim_pidfd_open(pid_t pid, int *pidfd) {
    *pidfd = -1;
    long r = syscall(SYS_pidfd_open, (long)pid, 0L);
    if (r < 0) return hm__errno_result(errno, "pidfd_open(%ld)", (long)pid);
    *pidfd = (int)r;
    return HM_SUCCESS;
}

hm_result_t hm__prim_pidfd_getfd(int pidfd, int target_fd, int *fd) {
    *fd = -1;
    long r = syscall(SYS_pidfd_getfd, (long)pidfd, (long)target_fd, 0L);
    if (r < 0) return hm__errno_result(errno, "pidfd_getfd(%d, %d)", pidfd, target_fd);
    *fd = (int)r;
    return HM_SUCCESS;
}

hm_result_t hm__prim_process_read(pid_t pid, uint64_t addr, void *buf, size_t len) {
    struct iovec local = {.iov_base = buf, .iov_len = len};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) return hm__errno_result(errno, "process_vm_readv(%ld, 0x%llx, %zu)", (long)pid,
                                       (unsigned long long)addr, len);
    if ((size_t)n != len)
        return hm__errno_result(EFAULT, "process_vm_readv(%ld, 0x%llx, %zu): %zd bytes",
                                (long)pid, (unsigned long long)addr, len, n);
    return HM_SUCCESS;
}

hm_result_t hm__prim_process_start_time(pid_t pid, uint64_t *ticks) {
    *ticks = 0;
    char path[64];
    if (pid == 0)
        snprintf(path, sizeof(path), "/proc/self/stat");
    else
        snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hm__errno_result(errno, "open(%s)", path);
    char buf[1024];
    ssize_t n;
    do {
        n = read(fd, buf, sizeof(buf) - 1);
    } while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n <= 0) return hm__errno_result(n < 0 ? e : EIO, "read(%s)", path);
    buf[n] = 0;
    /* proc(5): "pid (comm) state ppid ..."; comm may hold spaces and ')',
     * so fields are counted after the LAST ')'. starttime is field 22,
     * i.e. the 20th after the ')'. */
    char *p = strrchr(buf, ')');
    if (!p) return hm__errno_result(EIO, "parse %s: no ')'", path);
    p++;
    for (int field = 3; field < 22; field++) {
        while (*p == ' ') p++;
        while (*p && *p != ' ') p++;
        if (!*p) return hm__errno_result(EIO, "parse %s: short line", path);
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || end == p) return hm__errno_result(EIO, "parse %s: bad starttime", path);
    *ticks = v;
    return HM_SUCCESS;
}

hm_result_t hm__prim_random(void *buf, size_t len) {
    unsigned char *p = buf;
#ifdef HM_HAVE_GETRANDOM
    while (len) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == ENOSYS) break; /* very old kernel: use /dev/urandom */
            return hm__errno_result(errno, "getrandom(%zu)", len);
        }
        p += n;
        len -= (size_t)n;
    }
    if (!len) return HM_SUCCESS;
#endif
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hm__errno_result(errno, "open(/dev/urandom)");
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            return hm__errno_result(e, "read(/dev/urandom)");
        }
        p += n;
        len -= (size_t)n;
    }
    close(fd);
    return HM_SUCCESS;
}

uint64_t hm__prim_gettid(void) { return (uint64_t)syscall(SYS_gettid); }

static _Atomic unsigned fork_epoch;
static _Atomic uint64_t process_nonce;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

void hm__prim_atfork_child(void) {
    atomic_fetch_add_explicit(&fork_epoch, 1, memory_order_relaxed);
    atomic_store_explicit(&process_nonce, 0, memory_order_relaxed);
}

/* The PRIM slot of the fork list, filled at the first read of the epoch or
 * the nonce (a child-only slot: filling it takes no lock, so the first read
 * may come from under any lock). */
HM_RUN static void prim_fork_start(void) { hm__fork_enable(HM_FORK_PRIM, NULL); }

HM_RUN unsigned hm__prim_fork_epoch(void) {
    pthread_once(&fork_once, prim_fork_start);
    return atomic_load_explicit(&fork_epoch, memory_order_acquire);
}

uint64_t hm__prim_process_nonce(void) {
    pthread_once(&fork_once, prim_fork_start);
    uint64_t n = atomic_load_explicit(&process_nonce, memory_order_acquire);
    if (hm_likely(n)) return n;
    uint64_t fresh = 0;
    while (fresh == 0) {
        if (hm__prim_random(&fresh, sizeof(fresh)) != HM_SUCCESS) {
            /* No kernel randomness at all: mix what identifies this
             * process instance (still unique per pid and start time). */
            uint64_t t = 0;
            (void)hm__prim_process_start_time(0, &t);
            fresh = ((uint64_t)getpid() << 32) ^ t ^ (uint64_t)(uintptr_t)&fresh;
        }
    }
    /* First writer wins, so every thread sees one nonce. */
    uint64_t expected = 0;
    if (!atomic_compare_exchange_strong_explicit(&process_nonce, &expected, fresh,
                                                 memory_order_acq_rel, memory_order_acquire))
        return expected;
    return fresh;
}
