/* hetmem — helpers shared by the file and devdax providers. Internal.
 * SPDX-License-Identifier: MIT */
#ifndef HM_PROVIDERS_FILE_INTERNAL_H
#define HM_PROVIDERS_FILE_INTERNAL_H

#include "internal.h"
#include "platform/prim.h"

#include <sys/stat.h>
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
 * portable part), fixed size. The payload names no path: the memory moves as
 * the exporter's descriptor (ipc.get always hands it to the IPC layer, which
 * moves it by pidfd_getfd or the channel), so an exporter shares only a file
 * it holds itself and an importer never opens anything with its own rights
 * because a handle says so. dev/ino bind the handle to that descriptor: the
 * importer refuses a descriptor of any other file. */
#define HM_FILE_IPC_MAGIC 0x4c464d48u /* "HMFL" */
#define HM_DEVDAX_IPC_MAGIC 0x58444d48u /* "HMDX" */
#define HM_FILE_IPC_VERSION 2u

/* What the exporter mapped with; informational: the importer's mapping
 * follows the importer's own provider settings, never the payload. */
enum { HM_FILE_IPC_MAP_SYNC = 1u << 0 };

typedef struct hm_file_ipc_payload {
    uint32_t magic;    /* HM_FILE_IPC_MAGIC or HM_DEVDAX_IPC_MAGIC */
    uint16_t version;  /* HM_FILE_IPC_VERSION */
    uint16_t pad;      /* 0 */
    uint64_t offset;   /* of the allocation in the file / device */
    uint64_t size;     /* bytes to map (a multiple of the page size) */
    uint64_t dev;      /* st_dev of the file; st_rdev of a device */
    uint64_t ino;      /* st_ino of the file; 0 for a device */
    uint32_t flags;    /* HM_FILE_IPC_* */
    uint32_t reserved; /* 0 */
} hm_file_ipc_payload_t;

/* Validate a payload completely (magic, version, padding and reserved zero,
 * known flags, offset and size against `granularity`, size matching `size`
 * rounded up, no overflow; a device payload has ino 0). Returns
 * HM_ERROR_INVALID_HANDLE (logged) when anything is off. */
hm_result_t hm__file_ipc_validate(const hm_file_ipc_payload_t *p, uint32_t magic, size_t size,
                                  size_t granularity);

/* Check the descriptor that came with a handle before anything maps it
 * (p already validated): fd >= 0 (a handle of these providers always
 * carries one), open read-write (not O_PATH, not read-only: the importer
 * maps read-write shared, and an exporter must not grant more than it
 * holds), and
 *  - is_device false: a regular file whose st_dev/st_ino are the payload's
 *    and whose st_size covers [offset, offset + size) (a shorter file would
 *    SIGBUS the importer on touch);
 *  - is_device true: a character device whose st_rdev is the payload's dev
 *    (the caller checks that it is a DAX device and big enough).
 * HM_ERROR_INVALID_HANDLE, logged, otherwise; *st: what fstat said. */
hm_result_t hm__file_ipc_check_fd(const hm_file_ipc_payload_t *p, int fd, bool is_device,
                                  struct stat *st);

/* A provider's ipc.put (file and devdax): the payload is one of `who`'s
 * (its magic); the provider holds nothing for an export (the IPC layer
 * owns an exported range's lifetime: src/ipc/export.c), so that is all. */
hm_result_t hm__file_ipc_put_check(const void *payload, uint32_t magic, const char *who);

#endif
