/* hetmem — helpers shared by the file and devdax providers. Internal.
 * SPDX-License-Identifier: MIT */
#ifndef HM_PROVIDERS_FILE_INTERNAL_H
#define HM_PROVIDERS_FILE_INTERNAL_H

#include "internal.h"
#include "platform/prim.h"

#include <sys/types.h>

/* Map [offset, offset+size) of fd read/write, the start aligned to
 * `alignment` (0: the page size). shared: MAP_SHARED, else MAP_PRIVATE.
 * sync: MAP_SHARED_VALIDATE | MAP_SYNC (shared only); a file or device that
 * does not support it gives HM_ERROR_NOT_SUPPORTED (EOPNOTSUPP, or EINVAL
 * from a kernel without MAP_SHARED_VALIDATE), recorded as the native error.
 * (hm__prim_map has no MAP_SYNC flag yet; this is the one place that adds
 * it.) */
hm_result_t hm__file_map(int fd, uint64_t offset, size_t size, size_t alignment, bool shared,
                         bool sync, void **out);

/* Before each use of the descriptor a provider keeps (platform/prim.h,
 * "descriptors hetmem keeps"): is fd still the file `id` the provider
 * opened at `path`? If the program closed it or put another file at its
 * number: one log line naming `who` and `what` (the use refused) and
 * hm__prim_fd_check's error; the caller then leaves fd alone. */
hm_result_t hm__file_fd_check(int fd, const hm_prim_file_id_t *id, const char *who,
                              const char *path, const char *what);

/* ---- IPC payload of the file and devdax providers ----
 *
 * Machine-local, native byte order (the IPC layer's own header is the
 * portable part). A fixed size, so that exporter and importer agree on
 * handle_size() whatever their paths: paths longer than
 * HM_FILE_IPC_PATH_MAX - 1 bytes travel as path_len 0 and the importer must
 * use the file descriptor that comes with the handle. */
#define HM_FILE_IPC_MAGIC 0x4c464d48u /* "HMFL" */
#define HM_DEVDAX_IPC_MAGIC 0x58444d48u /* "HMDX" */
#define HM_FILE_IPC_VERSION 1u
#define HM_FILE_IPC_PATH_MAX 512u

enum { HM_FILE_IPC_MAP_SYNC = 1u << 0 };

typedef struct hm_file_ipc_payload {
    uint32_t magic;    /* HM_FILE_IPC_MAGIC or HM_DEVDAX_IPC_MAGIC */
    uint16_t version;  /* HM_FILE_IPC_VERSION */
    uint16_t path_len; /* bytes of path before its NUL; 0: none */
    uint64_t offset;   /* of the allocation in the file / device */
    uint64_t size;     /* bytes to map (a multiple of the page / device alignment) */
    uint64_t dev;      /* st_dev of the file; st_rdev of a device */
    uint64_t ino;      /* st_ino of the file; 0 for a device */
    uint32_t flags;    /* HM_FILE_IPC_* */
    uint32_t reserved; /* 0 */
    char path[HM_FILE_IPC_PATH_MAX]; /* NUL-terminated */
} hm_file_ipc_payload_t;

/* Validate a payload completely (magic, version, lengths, NUL, reserved
 * zero, offset and size against `granularity`, size matching `size`
 * rounded up). Returns HM_ERROR_INVALID_HANDLE (logged) when anything is
 * off. */
hm_result_t hm__file_ipc_validate(const hm_file_ipc_payload_t *p, uint32_t magic, size_t size,
                                  size_t granularity);
/* Open the file a payload names: dup of fd when fd >= 0, else open(path);
 * checks that it is the same file (dev/ino, or rdev for a device:
 * is_device). The caller closes *out. */
hm_result_t hm__file_ipc_open_fd(const hm_file_ipc_payload_t *p, int fd, bool is_device,
                                 int *out);

/* A provider's ipc.put (file and devdax): the payload is one of `who`'s
 * (its magic); the provider holds nothing for an export (the IPC layer
 * owns an exported range's lifetime: src/ipc/export.c), so that is all. */
hm_result_t hm__file_ipc_put_check(const void *payload, uint32_t magic, const char *who);

#endif
