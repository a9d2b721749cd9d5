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

/* ---- ranges held for IPC (file and devdax providers) ----
 *
 * An allocation exported through IPC (ipc.get without the matching put) is
 * not handed out again when it is freed: the free is deferred to the last
 * put, so an importer's mapping never sees another allocation's bytes while
 * an export is outstanding (the OS provider's zombie extents do the same).
 * Records are keyed by the range's file/device offset (unique among live
 * ranges). A provider with nothing exported pays one relaxed load per free.
 * Thread-safe (one mutex); the deferred free runs with it released. */
typedef struct hm_file_hold hm_file_hold_t;
/* Gives a range back to its provider (the deferred free). */
typedef void (*hm_file_release_fn)(void *ctx, void *ptr, size_t size);
typedef struct hm_file_holds {
    pthread_mutex_t lock;
    _Atomic size_t live;    /* records (exported or held), due ones included */
    _Atomic size_t due;     /* records on `dues` (a forked child's) */
    hm_file_hold_t **b;     /* chained hash by offset; cap buckets */
    size_t cap;
    hm_file_hold_t *dues;   /* freed while the parent exported them: give back */
    hm_file_release_fn release;
    void *release_ctx;
    struct hm_file_holds *gprev, *gnext; /* every table, for fork */
} hm_file_holds_t;
void hm__file_holds_init(hm_file_holds_t *h, hm_file_release_fn release, void *ctx);
/* Drops every record (provider teardown: the coarse layer unmaps all). */
void hm__file_holds_fini(hm_file_holds_t *h);
/* Fork (called by the IPC layer's fork handlers, which take the export
 * cache's lock first: the order ipc.put calls in): 0 prepare (lock every
 * table), 1 parent (unlock), 2 child. In the child the exports are the
 * parent's (the IPC layer drops its export cache there without a put, so
 * no put will ever come): every record is forgotten — an exported range
 * the child still has allocated is an ordinary allocation again (free,
 * split and merge work) — and a range freed while exported is due: given
 * back (release) at the next operation on its table from an ordinary
 * thread (not in the handler: the provider's own lock may have been held
 * by a thread that does not exist in the child until it is re-made). */
void hm__file_holds_atfork(int phase);
/* Gives the due ranges back (see hm__file_holds_atfork). */
void hm__file_holds_settle(hm_file_holds_t *h);
/* ipc.get of [ptr, +len) at offset off: one more export. */
hm_result_t hm__file_holds_get(hm_file_holds_t *h, uint64_t off, void *ptr, size_t len);
/* ipc.put of the export at off. *free_ptr, *free_size: a deferred free that
 * is now due (the caller gives the range back), else NULL. Not exported:
 * HM_ERROR_INVALID_HANDLE (logged). */
hm_result_t hm__file_holds_put(hm_file_holds_t *h, uint64_t off, void **free_ptr,
                               size_t *free_size);
/* A provider's ipc.put over its hold table (file and devdax): checks the
 * payload's magic (who names the provider in the log line), drops the hold
 * and, at the last put of a range freed while exported, frees it to coarse. */
struct hm_coarse;
hm_result_t hm__file_holds_ipc_put(hm_file_holds_t *h, struct hm_coarse *coarse,
                                   const void *payload, uint32_t magic, const char *who);
/* Whether anything is exported (one relaxed load: the fast path of free).
 * Settles a forked child's due ranges first. */
static inline bool hm__file_holds_any(hm_file_holds_t *h) {
    if (hm_likely(atomic_load_explicit(&h->live, memory_order_relaxed) == 0)) return false;
    if (hm_unlikely(atomic_load_explicit(&h->due, memory_order_acquire) != 0))
        hm__file_holds_settle(h);
    return atomic_load_explicit(&h->live, memory_order_relaxed) != 0;
}
/* free(ptr, size) of the range at off: true if it is exported (the free is
 * recorded and happens at the last put), false if the caller frees now. */
bool hm__file_holds_defer_free(hm_file_holds_t *h, uint64_t off, void *ptr, size_t size);
/* Whether the range at off is exported (split/merge refuse: HM_ERROR_BUSY). */
bool hm__file_holds_busy(hm_file_holds_t *h, uint64_t off);

#endif
