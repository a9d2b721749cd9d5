/* hetmem — platform primitives: the one place that talks to the OS.
 * SPDX-License-Identifier: MIT
 *
 * Every OS facility hetmem needs (virtual memory, advice, memory files,
 * pidfds, identity, randomness) goes through this interface, so that no
 * `#ifdef __linux__` or raw syscall number appears anywhere else (the idea
 * follows mimalloc's include/mimalloc/prim.h). Only Linux is implemented.
 *
 * Conventions:
 *  - Functions return HM_SUCCESS or an hm_result_t error. A failing system
 *    call is recorded as the per-thread native error (errno and the call
 *    named) through hm__errno_result(), which maps errno to a result
 *    (ENOMEM -> HM_ERROR_OUT_OF_MEMORY, EINVAL -> HM_ERROR_INVALID_ARGUMENT,
 *    EPERM/EACCES -> HM_ERROR_PERMISSION, ENOSYS/EOPNOTSUPP -> NOT_SUPPORTED,
 *    anything else -> HM_ERROR_DRIVER).
 *  - Expected, handled failures (e.g. MADV_FREE falling back to
 *    MADV_DONTNEED) are not recorded.
 *  - Sizes and addresses handed to the mapping calls must be multiples of
 *    the page size of the mapping (hm__prim_page_size() or the huge page
 *    size); the callers round.
 *  - Every function is thread-safe and async-signal-unsafe.
 */
#ifndef HM_PLATFORM_PRIM_H
#define HM_PLATFORM_PRIM_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- sizes ---- */

/* The base page size (sysconf(_SC_PAGESIZE)), read once. */
size_t hm__prim_page_size(void);
/* The PMD-sized transparent huge page (2 MiB on x86-64), or 0 if the kernel
 * has no THP support. Read once. */
size_t hm__prim_thp_size(void);
/* Whether hugetlbfs pages of `size` bytes exist and some are configured
 * (nr_hugepages or nr_overcommit_hugepages > 0). *configured_pages receives
 * nr_hugepages + nr_overcommit_hugepages (may be NULL). Returns
 * HM_ERROR_NOT_SUPPORTED when the kernel has no pool of that size, and
 * HM_ERROR_OUT_OF_MEMORY when the pool exists but is empty (no native error
 * is recorded: these are configuration answers, the caller logs). */
hm_result_t hm__prim_hugetlb_available(size_t size, uint64_t *configured_pages);

/* ---- mappings ---- */

/* Protection bits for the mapping calls (same values as HM_OS_PROT_*). */
enum {
    HM_PRIM_PROT_NONE = 0,
    HM_PRIM_PROT_READ = 1u << 0,
    HM_PRIM_PROT_WRITE = 1u << 1,
    HM_PRIM_PROT_EXEC = 1u << 2,
};

/* Mapping flags. */
enum {
    HM_PRIM_MAP_SHARED = 1u << 0,     /* MAP_SHARED of fd (else private) */
    HM_PRIM_MAP_HUGETLB_2M = 1u << 1, /* anonymous MAP_HUGETLB|MAP_HUGE_2MB */
    HM_PRIM_MAP_HUGETLB_1G = 1u << 2, /* anonymous MAP_HUGETLB|MAP_HUGE_1GB */
    HM_PRIM_MAP_NORESERVE = 1u << 3,  /* MAP_NORESERVE */
};

/* Map `size` bytes aligned to `alignment` (a power of two; 0 or anything
 * up to the page size means the page size). fd < 0: anonymous memory;
 * otherwise `fd` at `offset` (offset a multiple of the page size of fd).
 *
 * Alignment beyond the page size: an anonymous base-page mapping is
 * over-mapped by alignment - page and trimmed (head and tail unmapped); a
 * file or hugetlb mapping first reserves an inaccessible, unbacked range of
 * size + alignment, places the real mapping over its aligned part with
 * MAP_FIXED and unmaps the rest. The reservation belongs to this call alone,
 * so MAP_FIXED can never replace someone else's mapping. */
hm_result_t hm__prim_map(size_t size, size_t alignment, unsigned prot, unsigned flags, int fd,
                         uint64_t offset, void **out);
/* munmap. */
hm_result_t hm__prim_unmap(void *addr, size_t size);
/* mprotect. */
hm_result_t hm__prim_protect(void *addr, size_t size, unsigned prot);

typedef enum hm_prim_advice {
    /* Lazy purge: MADV_FREE; where the kernel or mapping refuses it
     * (EINVAL: old kernel, shared or hugetlb mapping) MADV_DONTNEED. */
    HM_PRIM_ADVISE_FREE = 0,
    HM_PRIM_ADVISE_DONTNEED = 1, /* drop the pages now (private: zero on next touch) */
    HM_PRIM_ADVISE_REMOVE = 2,   /* shared file mapping: free the backing store too */
    HM_PRIM_ADVISE_HUGEPAGE = 3,
    HM_PRIM_ADVISE_NOHUGEPAGE = 4,
} hm_prim_advice_t;

/* madvise. */
hm_result_t hm__prim_advise(void *addr, size_t size, hm_prim_advice_t advice);

/* Number of pages of [addr, addr+size) resident in memory (mincore).
 * addr page-aligned. */
hm_result_t hm__prim_resident_pages(const void *addr, size_t size, size_t *pages);

/* ---- memory files ---- */

/* memfd flags. */
enum {
    HM_PRIM_MEMFD_HUGETLB_2M = 1u << 0, /* MFD_HUGETLB | MFD_HUGE_2MB */
    HM_PRIM_MEMFD_HUGETLB_1G = 1u << 1, /* MFD_HUGETLB | MFD_HUGE_1GB */
    HM_PRIM_MEMFD_SEALABLE = 1u << 2,   /* MFD_ALLOW_SEALING */
};
/* memfd_create(name, MFD_CLOEXEC | ...). */
hm_result_t hm__prim_memfd_create(const char *name, unsigned flags, int *fd);
/* ftruncate. */
hm_result_t hm__prim_ftruncate(int fd, uint64_t size);
/* File seals (fcntl(2) F_ADD_SEALS / F_GET_SEALS, memfd_create(2)): a
 * sealed memfd cannot change in the sealed way, whoever holds a
 * descriptor of it. */
enum {
    HM_PRIM_SEAL_SEAL = 1u << 0,   /* F_SEAL_SEAL: no further seals */
    HM_PRIM_SEAL_SHRINK = 1u << 1, /* F_SEAL_SHRINK */
    HM_PRIM_SEAL_GROW = 1u << 2,   /* F_SEAL_GROW */
};
/* Add seals (HM_PRIM_SEAL_*). */
hm_result_t hm__prim_seal(int fd, unsigned seals);
/* The file's seals (HM_PRIM_SEAL_*); a file that cannot be sealed (not a
 * memfd or shmem file) reports HM_ERROR_NOT_SUPPORTED (EINVAL). */
hm_result_t hm__prim_seals(int fd, unsigned *seals);
/* fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE): free the backing
 * store of [offset, offset+len); the file size is unchanged. */
hm_result_t hm__prim_punch_hole(int fd, uint64_t offset, uint64_t len);
/* fstat: the file size and the bytes actually allocated (st_blocks * 512).
 * Either out-pointer may be NULL. */
hm_result_t hm__prim_fd_size(int fd, uint64_t *size, uint64_t *allocated);
/* fcntl(F_DUPFD_CLOEXEC). */
hm_result_t hm__prim_dup(int fd, int *out);
/* close; EINTR is not retried (Linux releases the descriptor anyway). */
hm_result_t hm__prim_close(int fd);

/* ---- descriptors hetmem keeps ----
 * A provider that holds a descriptor for its lifetime (the OS provider's
 * memfd, the file and devdax providers' files) shares the descriptor table
 * with a program that does not know about it: programs pick low numbers
 * themselves (dup2 onto 3, a shell's `exec 3>file`, descriptors passed to a
 * child by number, fds counted in a child), and close descriptors they
 * think are theirs, after which the number goes to the program's next file.
 * So the provider keeps its descriptor high and close-on-exec
 * (hm__prim_fd_keep), and before each use of it checks that it is still the
 * file it opened (hm__prim_fd_check); if not, it leaves the descriptor
 * alone. */

/* Where hm__prim_fd_keep moves a descriptor: the lowest free number at or
 * above this (or above half the soft RLIMIT_NOFILE, if that is lower).
 * Above what programs name (shells use up to 255, Python's test suite
 * counts descriptors below 256) and low enough that the kernel's descriptor
 * table stays small. */
#define HM_PRIM_FD_KEEP_MIN 512

/* What identifies an open file: fstat's st_dev and st_ino. */
typedef struct hm_prim_file_id {
    uint64_t dev, ino;
    _Atomic int reported; /* a failed check was logged at error level */
} hm_prim_file_id_t;

/* Make *fd, a descriptor hetmem opened and keeps, close-on-exec and move it
 * (F_DUPFD_CLOEXEC, then close the original) to the lowest free number at
 * or above HM_PRIM_FD_KEEP_MIN (see above); where none is free it stays
 * where it is. Records the file's identity in *id. On failure the
 * descriptor is closed and *fd is -1. */
hm_result_t hm__prim_fd_keep(int *fd, hm_prim_file_id_t *id);
/* Is fd still the file `id`? HM_SUCCESS, or, when it is closed or another
 * file has its number, HM_ERROR_DRIVER with the native error EBADF (what
 * it is now in the message). The caller logs and leaves fd alone. */
hm_result_t hm__prim_fd_check(int fd, const hm_prim_file_id_t *id);
/* For the caller's log line after a failed check: true the first time for
 * this descriptor (log at error level), false afterwards (debug level), so
 * a program that closed it does not get one error line per allocation. */
bool hm__prim_fd_first_report(const hm_prim_file_id_t *id);

/* ---- processes ---- */

/* pidfd_open(pid, 0) (Linux 5.3). */
hm_result_t hm__prim_pidfd_open(pid_t pid, int *pidfd);
/* pidfd_getfd(pidfd, target_fd, 0) (Linux 5.6): a copy of another process's
 * descriptor, close-on-exec. Needs ptrace access to the target. */
hm_result_t hm__prim_pidfd_getfd(int pidfd, int target_fd, int *fd);
/* The process's start time in clock ticks since boot (/proc/<pid>/stat
 * field 22): with the pid, it names one process for the life of the
 * system. pid 0 means this process. */
hm_result_t hm__prim_process_start_time(pid_t pid, uint64_t *ticks);
/* process_vm_readv: len bytes at addr in process pid into buf. Needs what
 * pidfd_getfd needs (same user, ptrace access mode attach). A read shorter
 * than len is EFAULT (recorded as the native error, as every failure). */
hm_result_t hm__prim_process_read(pid_t pid, uint64_t addr, void *buf, size_t len);
/* Yama's ptrace_scope (Documentation/admin-guide/LSM/Yama.rst): 0 classic,
 * 1 restricted to descendants and declared ptracers, 2 admin only, 3 none;
 * -1 where Yama is absent. Read once. */
int hm__prim_yama_scope(void);
/* prctl(PR_SET_PTRACER, who): who > 0 a pid, -1 any process
 * (PR_SET_PTRACER_ANY), 0 none. Yama only; EINVAL without it. */
hm_result_t hm__prim_set_ptracer(int64_t who);
/* len random bytes from the kernel (getrandom, /dev/urandom fallback). */
hm_result_t hm__prim_random(void *buf, size_t len);
/* A per-process random 64-bit nonce, drawn once (and again in a forked
 * child), never 0. */
uint64_t hm__prim_process_nonce(void);
/* The calling thread's kernel id. */
uint64_t hm__prim_gettid(void);
/* Bumped in the child at every fork() after its first call. Objects that own
 * process-private resources (a memfd's extent map) compare it with the value
 * they saw at creation to know that they now live in a forked child. */
unsigned hm__prim_fork_epoch(void);
/* The PRIM slot's child hook (fork.h): the epoch + 1, a new nonce. */
void hm__prim_atfork_child(void);

#endif /* HM_PLATFORM_PRIM_H */
