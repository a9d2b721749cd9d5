/* hetmem — IPC: export an allocation as a handle, open it in another process.
 * SPDX-License-Identifier: MIT
 *
 * A handle is plain bytes (safe to copy, send over a socket, MPI or a file):
 * a versioned, little-endian header (magic, version, provider family,
 * exporter identity = pid + per-process random nonce + process start time,
 * the exporter's allocation id, base, size, the pointer's offset in the
 * allocation, the address of the exporter's own copy of the handle, the
 * provider's payload) protected by a CRC32C. Before anything is mapped the
 * importer checks the format and checksum, and then, at a cache miss,
 * compares the whole handle with the exporter's own copy, read from the
 * exporter's memory (process_vm_readv: the same permission pidfd_getfd
 * needs): equal bytes prove every field genuine, the nonce included, and
 * the export still cached by the exporter. Where that read is refused
 * (ptrace denied: the channel transport's case) the importer verifies the
 * format, that the pid names a live process started at the handle's start
 * time (descriptor handles), and what the provider checks of its payload
 * and descriptor; the nonce and the other fields are then taken as given.
 * A repeated open that hits the cache compares the handle with the
 * validated one in every field but the offset (any offset inside the
 * allocation) and the origin.
 *
 *   exporter                                importer
 *   hm_ipc_get(ptr, &h, &len)    --bytes-->  hm_ipc_open(pool, h, len, &p)
 *   ... hm_ipc_put(h)                        ... hm_ipc_close(p)
 *
 * File descriptors: where the provider's memory is a file (OS provider in
 * HM_OS_SHARED mode: a memfd), the importer needs its own copy of the
 * exporter's descriptor. hm_ipc_open() fetches it with pidfd_open +
 * pidfd_getfd (Linux >= 5.6; same user; the exporter allows it with
 * prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) where Yama is active, which
 * hetmem does at the first export unless HM_IPC_PIDFD=0). Where that is
 * refused (containers' seccomp, ptrace_scope=2/3, HM_IPC_PIDFD=0) it
 * returns HM_ERROR_PERMISSION or HM_ERROR_NOT_SUPPORTED, and the handle
 * travels with its descriptor over a unix socket instead:
 * hm_ipc_channel_send() / hm_ipc_channel_recv() + hm_ipc_open_fd().
 *
 * Lifetimes:
 *  - hm_ipc_get() returns a handle owned by hetmem's export cache (one
 *    provider export per allocation, reused: a repeated get makes no system
 *    call); hm_ipc_put() gives it back. The cache is bounded
 *    (HM_IPC_EXPORT_CACHE_MAX, default 1024 allocations); unused entries are
 *    released when the allocation is freed or when the bound is hit.
 *  - Freeing an allocation while handles are outstanding (got, not put) is
 *    allowed and defined the same way for every pool over every provider
 *    with IPC: the importer's mapping stays valid until it closes it, and
 *    the exporter does not hand the same bytes out again until the last
 *    hm_ipc_put(). hm_pool_free() / hm_free() of a block that holds an
 *    exported pointer with handles outstanding returns HM_SUCCESS and the
 *    pool gets the block back at that put (a second free of it meanwhile:
 *    HM_ERROR_DOUBLE_FREE); hm_pool_realloc() of such a block moves the data
 *    to a new block (HM_ERROR_BUSY where the CPU cannot copy it). Other
 *    blocks of the same provider range are freed and reused at once. If
 *    the pool gives the exported range itself back (its destroy), the range
 *    stays allocated in the provider until that put, so no other pool gets
 *    its bytes and importers keep them; a provider the pool owns
 *    (HM_POOL_FLAG_OWN_PROVIDER) is destroyed after that put instead of in
 *    hm_pool_destroy (in a forked child, which drops the parent's exports,
 *    such a provider stays). Meanwhile the exporter must not
 *    touch the freed pointer; the importer may keep reading and writing its
 *    mapping. Splitting or merging a provider range with handles
 *    outstanding is refused (HM_ERROR_BUSY; pools treat that as "not now").
 *    After the last put the bytes are reused normally: a mapping still open
 *    in an importer then sees the new allocation's bytes (the medium is
 *    shared) — close before putting where that matters.
 *  - Pools whose providers name one driver context (ipc_context in
 *    provider.h: GPU providers) share one mapping of each handle: opening
 *    it through a second such pool returns the same pointer without a
 *    second driver open; the driver's close comes when the last of them
 *    lets go (its destroy, an eviction of its entry, the last close), and
 *    until then hm_pool_destroy() of one leaves the mapping valid for the
 *    others. hm_pool_by_ptr() gives the pool that opened it first, or,
 *    once that one has let go, another that holds it; hm_ipc_close()
 *    drops a reference taken through any of them.
 *  - Opened mappings are cached process-wide, keyed by (exporter, remote
 *    base, importing pool) and validated by the exporter's allocation id: a
 *    repeated open of the same allocation returns the same mapping and takes
 *    a reference; a new allocation at a reused address is a miss. An unused
 *    mapping (every open closed) stays cached until the cache bound evicts
 *    it (hm_ipc_set_cache_limits(), or HM_IPC_CACHE_MAX_ENTRIES /
 *    HM_IPC_CACHE_MAX_BYTES; default 4096 entries, no byte limit), its
 *    importing pool is destroyed, or a newer allocation at that remote
 *    address is opened. A repeated open skips the full decode only when the
 *    handle's bytes equal those of a handle already validated for that
 *    entry (apart from the offset); any other handle is validated whole.
 *  - The importer keeps one verified pidfd per exporter process (at most
 *    32, closed when that exporter exits or the slot is reused), so a miss
 *    costs no pidfd_open or /proc read.
 *  - hm_pool_destroy() closes every mapping opened through that pool (a
 *    warning names those still open); pointers into them become invalid
 *    (except shared mappings another pool still holds: above).
 *  - Opened mappings are tracked: hm_pool_by_ptr() gives the importing pool,
 *    hm_allocation_info() reports HM_ALLOCATION_IMPORTED. hm_free() and
 *    hm_pool_free() of an opened pointer return HM_ERROR_INVALID_ARGUMENT
 *    and change nothing: use hm_ipc_close().
 *
 * Thread safety: every call is thread-safe. Destroying a pool must not race
 * with opens/closes through that same pool (as for every pool call); opens
 * through other pools proceed during the destroy.
 * Fork: a child drops the export cache (its handles would name the parent:
 * hm_ipc_put of one in the child is HM_ERROR_INVALID_HANDLE) and keeps the
 * opened mappings it inherited. The parent's outstanding exports do not
 * hold anything in the child: an allocation exported by the parent can be
 * freed, split and merged by the child as any other; a block the parent
 * freed while exported is freed into the child's pool at the child's next
 * IPC call or free through a pool with IPC state, and a range the parent
 * kept for an export is given back to the child's provider then (the OS
 * provider's shared memory cannot be allocated in a child at all). In the
 * parent nothing changes: its blocks and ranges stay held
 * until its last put. */
#ifndef HETMEM_IPC_H
#define HETMEM_IPC_H

#include <hetmem/base.h>
#include <hetmem/pool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handle bytes. Use through a pointer and its length. */
typedef struct hm_ipc_handle hm_ipc_handle_t;

/* The fixed header every handle starts with; a reader of a byte stream can
 * read this many bytes and learn the whole length from
 * hm_ipc_handle_length(). */
#define HM_IPC_HEADER_SIZE 104u
/* The largest provider payload a handle may carry. */
#define HM_IPC_PAYLOAD_MAX 2048u

/* The largest handle this library makes or accepts (header + largest
 * payload): a buffer this big holds any handle. */
HM_API size_t hm_ipc_handle_size(void);

/* The total length of the handle whose first `avail` bytes are at `bytes`
 * (avail >= HM_IPC_HEADER_SIZE). Checks magic, version and lengths only (no
 * checksum: the rest may not have arrived yet). */
HM_API hm_result_t hm_ipc_handle_length(const void *bytes, size_t avail, size_t *length);

/* Export ptr (anywhere inside an allocation of a tracked pool whose provider
 * has HM_PROVIDER_CAP_IPC). *handle stays valid until hm_ipc_put(). */
HM_API hm_result_t hm_ipc_get(const void *ptr, hm_ipc_handle_t **handle, size_t *size);
/* Give back one get of a handle from hm_ipc_get(). NULL:
 * HM_ERROR_INVALID_ARGUMENT. Anything that is not an outstanding handle (one
 * already put as many times as it was got, a copy of its bytes, corrupted
 * bytes): HM_ERROR_INVALID_HANDLE, logged, nothing changed. The handle
 * pointer is valid only until its last put: hetmem may then reuse its
 * memory for another export's handle. */
HM_API hm_result_t hm_ipc_put(hm_ipc_handle_t *handle);

/* Map the memory a handle describes through `pool`'s provider (same provider
 * family, HM_PROVIDER_CAP_IPC). *ptr = the exporter's ptr translated.
 * Errors (nothing is mapped, nothing leaks):
 *   HM_ERROR_INVALID_HANDLE  truncated, corrupt (checksum), malformed, forged
 *                            (not the exporter's copy: a changed nonce,
 *                            descriptor number, kind, size, payload ...)
 *   HM_ERROR_NOT_SUPPORTED   another format version; provider family or
 *                            payload the pool's provider cannot open; no
 *                            pidfd_getfd on this kernel
 *   HM_ERROR_INVALID_ARGUMENT  a handle made by this very process (use the
 *                            pointer itself), NULL arguments
 *   HM_ERROR_STALE_HANDLE    the exporter is dead (or its pid was reused),
 *                            or the memory is gone: the exporter no longer
 *                            caches the export (its last put, then a free
 *                            or the cache bound)
 *   HM_ERROR_PERMISSION      the exporter's descriptor cannot be fetched
 *                            (use the channel) */
HM_API hm_result_t hm_ipc_open(hm_pool_t *pool, const hm_ipc_handle_t *handle, size_t size,
                               void **ptr);
/* The same with the importer's own copy of the handle's descriptor (from
 * hm_ipc_channel_recv()); fd is not kept: the caller closes it. fd -1:
 * hm_ipc_open(). On a cache hit the descriptor is not used. */
HM_API hm_result_t hm_ipc_open_fd(hm_pool_t *pool, const hm_ipc_handle_t *handle, size_t size,
                                  int fd, void **ptr);
/* Drop one reference taken by an open (ptr: any pointer inside the mapping).
 * Not an opened mapping: HM_ERROR_INVALID_ARGUMENT; closed more times than
 * opened: HM_ERROR_DOUBLE_FREE. */
HM_API hm_result_t hm_ipc_close(void *ptr);

/* What a handle says (after full validation). */
typedef struct {
    hm_provider_family_t family;
    hm_memory_kind_t kind;
    uint64_t exporter_pid;
    uint64_t exporter_nonce;
    uint64_t allocation_id; /* in the exporting process */
    uint64_t base;          /* exporter's address of the allocation */
    uint64_t size;          /* the allocation's size */
    uint64_t offset;        /* the exported pointer is base + offset */
    size_t payload_size;
    bool has_fd;            /* the memory travels as a file descriptor */
} hm_ipc_handle_info_t;
HM_API hm_result_t hm_ipc_handle_info(const hm_ipc_handle_t *handle, size_t size,
                                      hm_ipc_handle_info_t *info);

/* Opened-handle cache bound, process-wide: at most max_entries mappings and
 * max_bytes bytes stay cached; beyond that unused mappings are closed,
 * least recently used first (CLOCK approximation). 0 = no limit. Mappings in
 * use are never closed, so the cache may exceed the bound while they are. */
HM_API hm_result_t hm_ipc_set_cache_limits(size_t max_entries, size_t max_bytes);

typedef struct {
    size_t entries;       /* cached opened mappings (in use or not) */
    size_t bytes;
    size_t in_use;        /* entries with at least one open */
    uint64_t hits, misses, evictions, stale; /* since start */
    size_t exports;       /* export cache entries */
} hm_ipc_cache_stats_t;
HM_API hm_result_t hm_ipc_get_cache_stats(hm_ipc_cache_stats_t *stats);

/* --- Unix-socket channel: handles with their descriptors (SCM_RIGHTS) ---
 * A SOCK_SEQPACKET socket: one message = one handle (+ its fd). */
typedef struct hm_ipc_channel hm_ipc_channel_t;

/* Bind and listen on a filesystem path (an existing socket file there is
 * replaced); accept one peer at a time. */
HM_API hm_result_t hm_ipc_channel_listen(const char *path, hm_ipc_channel_t **listener);
HM_API hm_result_t hm_ipc_channel_accept(hm_ipc_channel_t *listener, hm_ipc_channel_t **channel);
HM_API hm_result_t hm_ipc_channel_connect(const char *path, hm_ipc_channel_t **channel);
/* Wrap a connected SOCK_SEQPACKET socket (e.g. from socketpair()); the
 * channel owns it from now on. */
HM_API hm_result_t hm_ipc_channel_from_fd(int socket_fd, hm_ipc_channel_t **channel);
/* Send a handle made by this process (hm_ipc_get) and, if the handle's
 * memory is a descriptor, that descriptor. */
HM_API hm_result_t hm_ipc_channel_send(hm_ipc_channel_t *channel, const hm_ipc_handle_t *handle,
                                       size_t size);
/* Receive one handle into buf (capacity cap; hm_ipc_handle_size() always
 * suffices): *size its length, *fd the descriptor that came with it or -1
 * (the caller owns it). Peer gone: HM_ERROR_NOT_FOUND. */
HM_API hm_result_t hm_ipc_channel_recv(hm_ipc_channel_t *channel, void *buf, size_t cap,
                                       size_t *size, int *fd);
/* Send and receive small plain messages (no descriptor) on the same
 * channel, e.g. acknowledgements. */
HM_API hm_result_t hm_ipc_channel_send_bytes(hm_ipc_channel_t *channel, const void *buf,
                                             size_t size);
HM_API hm_result_t hm_ipc_channel_recv_bytes(hm_ipc_channel_t *channel, void *buf, size_t cap,
                                             size_t *size);
HM_API hm_result_t hm_ipc_channel_destroy(hm_ipc_channel_t *channel);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_IPC_H */
