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
 * (ptrace denied: another user, or Yama — the channel transport's case), a
 * handle whose memory travels as a descriptor is opened only after the
 * provider has checked that descriptor (the file the handle names, its
 * kind, its seals, its size: a peer can hand over only what it holds
 * itself, and the handle cannot point past it); any other handle (GPU
 * memory by value) is refused with HM_ERROR_PERMISSION unless the program
 * chose hm_ipc_set_trust(HM_IPC_TRUST_FIELDS). A repeated open that hits
 * the cache compares the handle with the validated one in every field but
 * the offset (any offset inside the allocation) and the origin.
 *
 * What a handle grants (docs/security.md): the provider allocation that
 * holds the exported pointer, read and write, and nothing else of the
 * exporter — with the protection of the importer's own provider (never
 * executable unless that provider asks for it). A pool carves many blocks
 * out of one provider allocation, so they travel together: give memory you
 * share a pool (or provider) of its own. Neither side can shrink shared
 * OS memory under the other (sealed memfds); a regular file (file
 * provider) cannot be sealed: see providers/file.h.
 *
 *   exporter                                importer
 *   hm_ipc_get(ptr, &h, &len)    --bytes-->  hm_ipc_open(pool, h, len, &p)
 *   ... hm_ipc_put(h)                        ... hm_ipc_close(p)
 *
 * File descriptors: where the provider's memory is a file (OS provider in
 * HM_OS_SHARED mode: a memfd; the file and devdax providers), the importer
 * needs its own copy of the exporter's descriptor; it never opens a path.
 * hm_ipc_open() fetches it with pidfd_open + pidfd_getfd (Linux >= 5.6;
 * same user, ptrace access to the exporter). hetmem never changes the
 * process's ptrace protection by itself: where Yama's ptrace_scope is 1
 * (Ubuntu's default) an importer that is not the exporter's ancestor needs
 * the exporter's hm_ipc_allow_importer() (below). Where the fetch is
 * refused (Yama without that call, ptrace_scope 2/3, another user,
 * containers' seccomp, HM_IPC_PIDFD=0) it returns HM_ERROR_PERMISSION or
 * HM_ERROR_NOT_SUPPORTED, and the handle travels with its descriptor over
 * a unix socket instead — the preferred transport wherever ptrace is
 * restricted: hm_ipc_channel_send() / hm_ipc_channel_recv() +
 * hm_ipc_open_fd().
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
 *                            (use the channel), or the handle cannot be
 *                            verified and carries no descriptor
 *                            (hm_ipc_set_trust)
 * A descriptor that is not what the handle names (another file, too short,
 * a memfd not sealed against shrinking, not a DAX device) is
 * HM_ERROR_INVALID_HANDLE: nothing is mapped. */
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

/* Exporter: let importers use the pidfd transport where Yama restricts
 * ptrace (ptrace_scope 1). pid > 0 names the one importer process allowed
 * (prctl(PR_SET_PTRACER, pid): the kernel keeps one per process, so a
 * later call replaces it); HM_IPC_IMPORTER_ANY allows every process of the
 * same user (PR_SET_PTRACER_ANY); 0 withdraws. Cost: the process allowed
 * may then attach to this whole process — read and write all of its memory
 * and take any of its descriptors, not only exported ones — so name the
 * importer where you can, and prefer the channel. The declaration is in
 * force only while this process has exports (its export cache holds at
 * least one), withdrawn when the cache empties and made again at the next
 * export; a forked child starts without it (its first export makes it).
 * Without Yama, or at ptrace_scope 0, nothing is declared (the kernel
 * already allows same-user importers) and HM_SUCCESS is returned; at
 * ptrace_scope 2 or 3: HM_ERROR_NOT_SUPPORTED (use the channel). pid < -1
 * or beyond a pid: HM_ERROR_INVALID_ARGUMENT. hetmem makes no prctl call
 * in a program that does not call this. */
#define HM_IPC_IMPORTER_ANY ((int64_t)-1)
HM_API hm_result_t hm_ipc_allow_importer(int64_t pid);

/* Importer: what hm_ipc_open() does with a handle it cannot check against
 * the exporter's own copy (the read is refused: see the top of this file).
 * Process-wide; thread-safe. */
typedef enum hm_ipc_trust {
    /* Default: opened only when its memory comes as a descriptor the
     * provider verifies (kind, identity, seals, size); otherwise
     * HM_ERROR_PERMISSION, logged. */
    HM_IPC_TRUST_DESCRIPTOR = 0,
    /* Also handles without a descriptor (GPU memory by value), by their
     * fields only: the program trusts whoever gave it the handle. */
    HM_IPC_TRUST_FIELDS = 1,
} hm_ipc_trust_t;
/* Unknown value: HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_ipc_set_trust(hm_ipc_trust_t trust);

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
 * A SOCK_SEQPACKET socket: one message = one handle (+ its fd).
 * Peers are checked with SO_PEERCRED (unix(7)): by default a channel joins
 * processes of one user. A listener's socket file is owner-only (0600,
 * whatever the umask; the umask is not changed) and accept refuses a peer
 * of another uid; connect refuses a listener that runs neither as this
 * process's effective uid nor as root. A peer of a uid the program named
 * (hm_ipc_channel_allow_uid, hm_ipc_channel_connect_uid) is admitted. Each
 * check costs one getsockopt() per connection. */
typedef struct hm_ipc_channel hm_ipc_channel_t;

/* Any uid, for hm_ipc_channel_allow_uid() and hm_ipc_channel_connect_uid(). */
#define HM_IPC_CHANNEL_ANY_UID UINT32_MAX

/* Bind and listen on a filesystem path; accept one peer at a time. An
 * existing socket file of this user there is replaced; another user's is
 * not (bind fails). The file is created mode 0600 and checked (a socket
 * owned by the effective uid) before listen(), so no process of another
 * user can connect, even under umask 000. The path's directory should be
 * one that other users cannot write.
 * Errors: HM_ERROR_INVALID_ARGUMENT (no path, path too long for
 * sockaddr_un), HM_ERROR_PERMISSION (the path is no longer our socket after
 * bind), HM_ERROR_DRIVER (socket/bind/listen, the native error says which). */
HM_API hm_result_t hm_ipc_channel_listen(const char *path, hm_ipc_channel_t **listener);
/* Admit peers of `uid` on this listener besides its own user
 * (HM_IPC_CHANNEL_ANY_UID: any user), and make the socket file connectable
 * by them: mode 0666 (changed only after checking that the path still names
 * this listener's socket); peers of uids not admitted are still refused at
 * accept. Up to 8 uids. A process of an admitted uid can hand this process
 * handles and descriptors; admit only the users the program trusts.
 * Not concurrently with another call on the same listener.
 * Errors: HM_ERROR_INVALID_ARGUMENT (NULL, not a listener), HM_ERROR_LIMIT
 * (8 uids already), HM_ERROR_PERMISSION (the path is no longer this
 * listener's socket), HM_ERROR_DRIVER (chmod through /proc/self/fd). */
HM_API hm_result_t hm_ipc_channel_allow_uid(hm_ipc_channel_t *listener, uint32_t uid);
/* Accept one peer. A peer whose uid (SO_PEERCRED) is not this process's
 * effective uid and not admitted is refused: its connection is closed (it
 * sees the channel closed), one log line names its pid and uid, and the
 * result is HM_ERROR_PERMISSION; call accept again for the next peer. */
HM_API hm_result_t hm_ipc_channel_accept(hm_ipc_channel_t *listener, hm_ipc_channel_t **channel);
/* Connect to a listener that runs as this process's effective uid or as
 * root; another listener is refused with HM_ERROR_PERMISSION (one log line
 * naming its pid and uid). Nobody listens: HM_ERROR_NOT_FOUND; the socket
 * file is not writable by us: HM_ERROR_PERMISSION. */
HM_API hm_result_t hm_ipc_channel_connect(const char *path, hm_ipc_channel_t **channel);
/* The same, also accepting a listener that runs as `uid`
 * (HM_IPC_CHANNEL_ANY_UID: any listener). */
HM_API hm_result_t hm_ipc_channel_connect_uid(const char *path, uint32_t uid,
                                              hm_ipc_channel_t **channel);
/* Wrap a connected SOCK_SEQPACKET socket (e.g. from socketpair()); the
 * channel owns it from now on. The peer is not checked: the program chose
 * it (a socketpair's other end, an inherited socket); checking its
 * credentials is the program's business. */
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
