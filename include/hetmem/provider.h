/* hetmem — memory providers: coarse memory of one memory space.
 * SPDX-License-Identifier: MIT
 *
 * A provider is created from an ops table and an opaque, provider-specific
 * params object (e.g. hm_os_params_t). Pools carve fine allocations out of it.
 * Anyone may write a provider: fill a `static const hm_provider_ops_t` with
 * designated initializers; a NULL op means "unsupported" and the front-end
 * answers HM_ERROR_NOT_SUPPORTED for it.
 *
 * Descriptors: a provider that keeps a file descriptor open (the OS
 * provider's memfd in shared mode, the file and devdax providers' files)
 * keeps it close-on-exec at a high number (the lowest free one from 512, or
 * from half the soft RLIMIT_NOFILE if that is lower), out of the way of the
 * numbers programs name and the kernel hands out, and checks before each
 * use that it is still the file it opened (device and inode). If the
 * program has closed it or put another file at its number, the provider
 * leaves that descriptor alone: what needed it (growing, mapping, hole
 * punching, an export of the descriptor, the close at destroy) is refused
 * with HM_ERROR_DRIVER (native error EBADF) and one log line; memory already
 * mapped stays usable and can be freed. */
#ifndef HETMEM_PROVIDER_H
#define HETMEM_PROVIDER_H

#include <hetmem/base.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_provider hm_provider_t;

/* Capability bits reported in hm_provider_info_t.caps. The front-end clears a
 * bit whose op is NULL, so a provider cannot claim what it does not do. */
enum {
    HM_PROVIDER_CAP_FREE = 1u << 0,        /* free() returns memory to the provider/OS */
    HM_PROVIDER_CAP_PURGE_LAZY = 1u << 1,  /* purge_lazy (MADV_FREE-like) */
    HM_PROVIDER_CAP_PURGE_FORCE = 1u << 2, /* purge_force (MADV_DONTNEED/hole punch) */
    HM_PROVIDER_CAP_SPLIT_MERGE = 1u << 3, /* allocations can be split and adjacent ones merged */
    HM_PROVIDER_CAP_IPC = 1u << 4,         /* allocations can be exported/opened via IPC */
    HM_PROVIDER_CAP_CPU_ACCESS = 1u << 5,  /* the CPU may load/store this memory */
    HM_PROVIDER_CAP_NUMA = 1u << 6,        /* memory is bound to NUMA nodes as asked */
    /* Set by the front-end exactly when the op is present (ops version 2). */
    HM_PROVIDER_CAP_FILL = 1u << 7,        /* fill: set bytes of its memory (a memset) */
    HM_PROVIDER_CAP_COPY = 1u << 8,        /* copy: its memory <-> host, and within it */
    /* Set by the front-end exactly when the five stream ops are present
     * (ops version 3): stream-ordered allocation (hetmem/stream.h). */
    HM_PROVIDER_CAP_STREAMS = 1u << 9,
};

/* The device a provider's memory belongs to, as its driver names it.
 * Filled by the provider's optional get_device op; the front-end starts it
 * as "no device" (ordinal -1, no UUID), which is what providers without
 * the op (host memory: os, fixed, file, devdax) report. It is not a field
 * of hm_provider_info_t because hm_provider_get_info() writes that struct
 * into the caller's storage: growing it would overrun programs built
 * against an older header. Read it with hm_provider_get_device(). */
#define HM_DEVICE_UUID_SIZE 16
typedef struct hm_device_id {
    /* The driver's index of the device: the CUDA device ordinal (CUdevice),
     * the Level Zero device's index in zeDeviceGet's list for its driver.
     * -1: no device (host memory) or none the driver numbers. */
    int32_t ordinal;
    /* uuid holds the driver's device UUID (CUuuid, ze_device_uuid_t: 16
     * bytes each), which, unlike the ordinal, names the same device in
     * every process (CUDA_VISIBLE_DEVICES or ZE_AFFINITY_MASK renumber
     * ordinals). false: uuid is all zero. */
    bool has_uuid;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
} hm_device_id_t;

/* Provider families: used by IPC to decide which providers can open which
 * handles. User-written providers use HM_PROVIDER_FAMILY_USER or above. */
typedef enum hm_provider_family {
    HM_PROVIDER_FAMILY_OS = 1,
    HM_PROVIDER_FAMILY_FIXED = 2,
    HM_PROVIDER_FAMILY_FILE = 3,
    HM_PROVIDER_FAMILY_DEVDAX = 4,
    HM_PROVIDER_FAMILY_LEVEL_ZERO = 5,
    HM_PROVIDER_FAMILY_CUDA = 6,
    HM_PROVIDER_FAMILY_USER = 1000,
} hm_provider_family_t;

/* What a provider is and can do. Filled by the provider's get_info op; the
 * front-end adjusts caps to the ops present. Strings are static. */
typedef struct hm_provider_info {
    const char *name;             /* e.g. "os", "fixed", "cuda" */
    hm_provider_family_t family;
    hm_memory_kind_t kind;
    uint32_t caps;                /* HM_PROVIDER_CAP_* */
    size_t min_page_size;         /* every allocation is a multiple of, and aligned to, this */
    size_t recommended_page_size; /* e.g. 2 MiB for huge pages or GPU granularity */
} hm_provider_info_t;

/* Version 2 appended get_device, fill, copy, ipc_compatible and ipc_context;
 * version 3 the stream sub-table. The front-end accepts tables of versions 1
 * (they end before get_device, and only that much is read), 2 (they end
 * before stream) and 3; a table always says the version of the header it
 * was compiled against, so a program built against an older header keeps
 * working unchanged. */
#define HM_PROVIDER_OPS_VERSION 3u

/* The provider interface. `state` is what init returned. Ops return
 * HM_SUCCESS or an error; on driver/OS failure they record the native error
 * (the front-end never calls an op with invalid arguments: size > 0,
 * alignment 0 or a power of two, ptr non-NULL). */
typedef struct hm_provider_ops {
    uint32_t version; /* HM_PROVIDER_OPS_VERSION */
    const char *name; /* static, short */

    /* Required. */
    hm_result_t (*init)(const void *params, void **state);
    void (*fini)(void *state);
    void (*get_info)(void *state, hm_provider_info_t *info);
    /* alignment 0 means the provider's min_page_size. The size handed back
     * to free/purge/split is the size that was asked for. */
    hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr);

    /* Optional: NULL means unsupported. */
    hm_result_t (*free)(void *state, void *ptr, size_t size);
    hm_result_t (*purge_lazy)(void *state, void *ptr, size_t size);
    hm_result_t (*purge_force)(void *state, void *ptr, size_t size);
    /* Split [ptr, ptr+total) into [ptr, ptr+first) and the rest, so each can
     * be freed on its own; merge two adjacent allocations into one. Both or
     * neither (HM_PROVIDER_CAP_SPLIT_MERGE). */
    hm_result_t (*split)(void *state, void *ptr, size_t total, size_t first);
    hm_result_t (*merge)(void *state, void *lo, void *hi, size_t total);

    /* IPC: the first five all or none. The native payload is handle_size() opaque bytes
     * the provider writes in get() and reads in open(). A provider whose
     * handle carries a file descriptor returns it in *fd (valid in this
     * process until put()); the IPC layer moves it to the importer, which
     * receives its own copy in open()'s fd (-1 when none). open() must not
     * keep `fd` (dup it if needed); the caller closes it. Lifetimes are the
     * IPC layer's: it never frees, splits or merges an exported range before
     * the export's put(), which it makes first (a range freed while
     * exported is given back after the last hm_ipc_put), so a provider holds
     * nothing for an export; put() may refuse (logged, tried again later),
     * and the range then waits for the put's retry. */
    struct {
        size_t (*handle_size)(void *state);
        hm_result_t (*get)(void *state, void *ptr, size_t size, void *payload, int *fd);
        hm_result_t (*put)(void *state, void *payload);
        hm_result_t (*open)(void *state, const void *payload, int fd, size_t size, void **ptr);
        hm_result_t (*close)(void *state, void *ptr, size_t size);
        /* Optional even with the five (NULL: close() each): close n
         * mappings that open() made, as close() would each, where the
         * provider can do better together (e.g. unmap adjacent mappings with
         * one call: one TLB flush instead of one per mapping). Closes every
         * mapping it can; returns the first error. */
        hm_result_t (*close_many)(void *state, void *const *ptrs, const size_t *sizes, size_t n);
    } ipc;

    /* ---- Version 2: every op below is optional (NULL: unsupported) ---- */

    /* The device this provider's memory belongs to (hm_device_id_t). Called
     * once, at create, after get_info, on a struct set to "no device";
     * fill in what the driver gives. NULL: no device. */
    void (*get_device)(void *state, hm_device_id_t *device);

    /* Device operations, so that pools can zero and move memory the CPU
     * may not touch (hm_pool_calloc, hm_pool_realloc). Both are
     * synchronous: the bytes are in place when the op returns. The front-end
     * calls them with non-NULL pointers and size > 0 (and, for copy,
     * ranges that do not overlap); HM_PROVIDER_CAP_FILL/COPY follow them.
     *
     * fill: set size bytes at ptr, which lies in memory this provider
     * allocated (alloc) or mapped (ipc.open), to value.
     *
     * copy: size bytes from src to dst, where each side is either in memory
     * this provider allocated or mapped, or in host memory the CPU may
     * access (ordinary memory of the process). Required combinations:
     * provider -> provider (within one allocation or between two of this
     * provider), host -> provider and provider -> host. A provider whose
     * driver sees unified addresses (CUDA's cuMemcpy, Level Zero's
     * zeCommandListAppendMemoryCopy) gets host -> host for free; it is not
     * required. Memory of another provider on either side is outside the
     * contract (the op may refuse it with HM_ERROR_INVALID_ARGUMENT).
     *
     * Errors: HM_ERROR_INVALID_ARGUMENT for a range that is not the
     * provider's (or host memory where only its own is allowed), the
     * driver's failure as HM_ERROR_DRIVER with the native error recorded. */
    hm_result_t (*fill)(void *state, void *ptr, uint8_t value, size_t size);
    hm_result_t (*copy)(void *state, void *dst, const void *src, size_t size);

    /* IPC compatibility (optional even with the ipc five; cleared without
     * them): can this provider open the memory that `payload` describes?
     * payload is handle_size() bytes written by ipc.get of a provider of the
     * same family, in another process, perhaps on another device: a
     * provider whose memory belongs to a device writes that device's
     * identity (its UUID) into its own payload in get(), and checks it
     * here against the devices it can map (its own, and peers where the
     * driver allows).
     *   HM_SUCCESS               open() may be tried.
     *   HM_ERROR_NOT_SUPPORTED   exported on a device this provider cannot
     *                            map; the op logs one line naming both.
     *   HM_ERROR_INVALID_HANDLE  the payload is malformed.
     * NULL: every payload of the family can be opened (host memory). The
     * IPC layer calls it in hm_ipc_open, once the handle is validated and
     * before any descriptor is moved to this process or ipc.open is called,
     * and returns its error as hm_ipc_open's; ipc.open must still refuse
     * what it cannot map (the check is for a clear, early answer). */
    hm_result_t (*ipc_compatible)(void *state, const void *payload);

    /* IPC mapping context (optional even with the ipc five; cleared without
     * them): a nonzero key naming the driver context that ipc.open maps
     * into, for drivers that map a handle once per context (a second
     * cuIpcOpenMemHandle of one handle in one CUDA context must not
     * happen). Called once, at create. Pools whose providers are of one
     * family and answer the same key share one mapping of each handle: the
     * IPC layer calls ipc.open once, through the first pool that opens it,
     * and ipc.close once, through the last pool that drops it — so every
     * provider answering a key must accept close, fill and copy of a
     * mapping that another provider of the same key opened, as one driver
     * context does. NULL or 0: each importing pool opens its own mapping
     * (host memory: each open is its own mmap). */
    uint64_t (*ipc_context)(void *state);

    /* Streams and events (optional, all five or none; version 3), for
     * stream-ordered allocation (hetmem/stream.h). A stream is the driver's
     * own handle, passed through as the program gave it: CUDA a CUstream
     * (NULL: the legacy default stream), Level Zero an immediate command
     * list (ze_command_list_handle_t). An event marks a point in a
     * stream's work; the provider makes and owns them. No op blocks but
     * event_sync.
     *   event_create   a new event (*event non-NULL), not yet recorded.
     *   event_record   the event completes when the work the stream has at
     *                  the call has completed (earlier records of the same
     *                  event are forgotten).
     *   event_query    HM_SUCCESS: completed; HM_ERROR_BUSY: not yet; any
     *                  other result: the driver failed (the front end then
     *                  treats the event as never completing until a sync).
     *   event_sync     waits on the host until it completes.
     *   event_destroy  frees it (it may be pending: the driver keeps what
     *                  it needs). */
    struct {
        hm_result_t (*event_create)(void *state, void **event);
        hm_result_t (*event_record)(void *state, void *event, void *stream);
        hm_result_t (*event_query)(void *state, void *event);
        hm_result_t (*event_sync)(void *state, void *event);
        void (*event_destroy)(void *state, void *event);
    } stream;
} hm_provider_ops_t;

/* Create a provider. `params` is the provider's params object (may be NULL
 * for defaults where the provider allows it); it is copied, so the caller may
 * destroy it right after. */
HM_API hm_result_t hm_provider_create(const hm_provider_ops_t *ops, const void *params,
                                      hm_provider_t **provider);
/* Destroy. Destroying a provider still used by a pool is a caller bug;
 * destroying one twice (or a pointer that is not a live provider) returns
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_provider_destroy(hm_provider_t *provider);

/* Raw provider calls. Every call is thread-safe. Memory obtained here is not
 * tracked (hm_free does not know it); pools get tracked memory through
 * hm_pool_provider_alloc(). hm_provider_alloc sets *ptr to NULL on every
 * failure (ptr itself NULL: HM_ERROR_INVALID_ARGUMENT). */
HM_API hm_result_t hm_provider_alloc(hm_provider_t *provider, size_t size, size_t alignment,
                                     void **ptr);
HM_API hm_result_t hm_provider_free(hm_provider_t *provider, void *ptr, size_t size);
HM_API hm_result_t hm_provider_purge_lazy(hm_provider_t *provider, void *ptr, size_t size);
HM_API hm_result_t hm_provider_purge_force(hm_provider_t *provider, void *ptr, size_t size);
HM_API hm_result_t hm_provider_split(hm_provider_t *provider, void *ptr, size_t total,
                                     size_t first);
HM_API hm_result_t hm_provider_merge(hm_provider_t *provider, void *lo, void *hi, size_t total);

/* Device operations (see fill and copy in hm_provider_ops_t). size 0 does
 * nothing and succeeds, as memset and memcpy would. NULL pointers, ranges
 * that wrap around the address space and (copy) ranges that overlap:
 * HM_ERROR_INVALID_ARGUMENT. A provider without the op:
 * HM_ERROR_NOT_SUPPORTED. Thread-safe; the caller keeps the ranges alive
 * and unwritten by others during the call. */
HM_API hm_result_t hm_provider_fill(hm_provider_t *provider, void *ptr, uint8_t value,
                                    size_t size);
HM_API hm_result_t hm_provider_copy(hm_provider_t *provider, void *dst, const void *src,
                                    size_t size);

HM_API hm_result_t hm_provider_get_info(const hm_provider_t *provider, hm_provider_info_t *info);
/* The device the provider's memory belongs to (hm_device_id_t; a provider
 * of host memory: ordinal -1, no UUID). Immutable after create. */
HM_API hm_result_t hm_provider_get_device(const hm_provider_t *provider, hm_device_id_t *device);
HM_API const char *hm_provider_name(const hm_provider_t *provider);
HM_API hm_memory_kind_t hm_provider_memory_kind(const hm_provider_t *provider);
HM_API bool hm_provider_cpu_accessible(const hm_provider_t *provider);
HM_API size_t hm_provider_min_page_size(const hm_provider_t *provider);
HM_API size_t hm_provider_recommended_page_size(const hm_provider_t *provider);
HM_API uint32_t hm_provider_caps(const hm_provider_t *provider);
/* The ops table and state the provider was created with (for wrappers).
 * The table is the front-end's copy, always of HM_PROVIDER_OPS_VERSION
 * (the fields a version 1 table lacks are NULL). */
HM_API const hm_provider_ops_t *hm_provider_get_ops(const hm_provider_t *provider);
HM_API void *hm_provider_get_state(const hm_provider_t *provider);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_PROVIDER_H */
