/* hetmem — the file provider: memory mapped from a regular file.
 * SPDX-License-Identifier: MIT
 *
 * The file is opened (created if missing, reused if present) and mapped in
 * pieces as the provider grows: each growth extends the file with
 * fallocate() (ftruncate() where the filesystem has no fallocate, and for
 * private mappings) and maps the new part. Allocations are carved out of
 * those mappings by the coarse layer, so free() works (the range returns to
 * the provider, not to the OS) and split/merge work.
 *
 * Memory going back: purge_force punches a hole (FALLOC_FL_PUNCH_HOLE) in a
 * shared mapping's file range, so its disk blocks and page cache are
 * released (the range reads back as zeros); in a private mapping it drops the
 * private copies (MADV_DONTNEED). There is no lazy purge (a shared file
 * mapping has no MADV_FREE). The file itself never shrinks while the
 * provider lives.
 *
 * Persistence: a file that exists when the provider is created is mapped
 * whole as free memory, and a fresh provider hands memory out from the
 * lowest offset, best fit, deterministically: the same sequence of
 * allocations in a new process gets the same file offsets, so data written
 * through a shared mapping is found again. A pool on top may have its own
 * layout; only the proxy pool maps one hm_pool_malloc to one allocation.
 *
 * Space: when the filesystem is full the allocation fails with
 * HM_ERROR_OUT_OF_MEMORY (the native error says ENOSPC) and nothing already
 * written is touched. Memory whose range was purged is backed again when
 * the provider hands it out anew; a pool that keeps a purged range and
 * writes to it on a full filesystem receives SIGBUS, as with any mapped
 * file.
 *
 * The file: opened read-write, O_NOFOLLOW. A symbolic link at the path is
 * refused with HM_ERROR_INVALID_ARGUMENT (as any path that names no regular
 * file); the directories above it are followed. A file that does not exist
 * is created with mode 0600. A file that exists must belong to the
 * effective user and have no group or other permission bit (mode & 077 ==
 * 0), else hm_provider_create() fails with HM_ERROR_PERMISSION: another
 * user who can read or write the file reads or writes the memory.
 * hm_file_params_set_foreign_file() lifts that check.
 *
 * IPC (shared mappings only). A handle moves as the provider's descriptor
 * of the file (the IPC layer passes it by pidfd_getfd or the channel: see
 * ipc.h) plus {device, inode, offset, size}; it names no path, and an
 * importer never opens a file because a handle says so. What a handle
 * exposes and grants:
 *  - the descriptor of the whole file, open read-write. The exporter shares
 *    only what it already holds, but an importer that has the descriptor can
 *    map, read and write any part of that file, not only the exported range:
 *    export from a file only to a peer that may see all of it;
 *  - a regular file cannot be sealed: either side holding the descriptor can
 *    truncate it, and the other side's next touch of a mapping past the new
 *    end faults (SIGBUS), whatever was checked at open. File handles are
 *    for peers that trust each other not to do that (a device DAX cannot
 *    be truncated: devdax.h).
 * The importer (a file provider over any file) checks, before it maps, that
 * the descriptor came with the handle, is open read-write, is a regular
 * file with the handle's device and inode (a handle cannot be re-pointed at
 * another file), and is at least offset + size long (no SIGBUS on touch);
 * any of these failing is HM_ERROR_INVALID_HANDLE, logged. Its mapping is
 * read-write, shared, never executable, and MAP_SYNC as the importer's own
 * provider is set: nothing in the handle chooses the protection. Freeing an
 * allocation while it is exported returns the range to the provider at
 * once: an importer still mapping it may see the next allocation's data
 * there.
 *
 * The file's descriptor stays open for the provider's life, high and
 * close-on-exec, and is checked before each use (provider.h,
 * "Descriptors"). */
#ifndef HETMEM_PROVIDERS_FILE_H
#define HETMEM_PROVIDERS_FILE_H

#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_file_params hm_file_params_t;

typedef enum hm_file_visibility {
    HM_FILE_SHARED = 0,  /* MAP_SHARED: writes reach the file (default) */
    HM_FILE_PRIVATE = 1, /* MAP_PRIVATE: copy-on-write, the file is never written */
} hm_file_visibility_t;

HM_API const hm_provider_ops_t *hm_file_provider_ops(void);

/* path: the file to create (mode 0600) or reuse (the effective user's own,
 * mode & 077 == 0, unless hm_file_params_set_foreign_file() says
 * otherwise); never a symbolic link. The string is copied. */
HM_API hm_result_t hm_file_params_create(const char *path, hm_file_params_t **params);
HM_API hm_result_t hm_file_params_destroy(hm_file_params_t *params);
HM_API hm_result_t hm_file_params_set_visibility(hm_file_params_t *params,
                                                 hm_file_visibility_t visibility);
/* Map with MAP_SYNC | MAP_SHARED_VALIDATE (fsdax: stores reach persistence
 * with CPU cache flushes alone, no msync). Needs HM_FILE_SHARED and a
 * filesystem mounted with DAX; otherwise hm_provider_create() fails with
 * HM_ERROR_NOT_SUPPORTED (HM_ERROR_INVALID_ARGUMENT with HM_FILE_PRIVATE). */
HM_API hm_result_t hm_file_params_set_map_sync(hm_file_params_t *params, bool map_sync);
/* Keep the file after the provider is destroyed (default true); false
 * removes it (also a file that existed before). */
HM_API hm_result_t hm_file_params_set_keep_file(hm_file_params_t *params, bool keep);
/* Allow an existing file that is not the effective user's own or that has
 * group or other permission bits (default false: such a file is refused at
 * hm_provider_create() with HM_ERROR_PERMISSION). With true the provider
 * uses whatever regular file is at the path (not a symbolic link), and
 * whoever else may read or write that file reads or writes the provider's
 * memory: allow it only for a file shared on purpose. Files the provider
 * creates are 0600 either way. */
HM_API hm_result_t hm_file_params_set_foreign_file(hm_file_params_t *params, bool allow);
/* The file grows by at least this much at a time (default 16 MiB; rounded
 * up to the page size; a growth that does not fit on the filesystem is
 * retried with exactly what the allocation needs). */
HM_API hm_result_t hm_file_params_set_grow_size(hm_file_params_t *params, size_t bytes);
/* The provider never grows the file beyond this size (default 0: no limit);
 * allocations that would need more fail with HM_ERROR_OUT_OF_MEMORY. */
HM_API hm_result_t hm_file_params_set_max_size(hm_file_params_t *params, uint64_t bytes);

/* Convenience: a shared mapping of path with the defaults. */
HM_API hm_result_t hm_file_provider_create(const char *path, hm_provider_t **provider);

#ifdef __cplusplus
}
#endif
#endif
