/* hetmem — the CUDA provider: NVIDIA device, host-pinned and managed memory.
 * SPDX-License-Identifier: MIT
 *
 * Memory of one CUDA device, allocated with cuMemAlloc_v2 (device),
 * cuMemHostAlloc (host-pinned) or cuMemAllocManaged (managed). The library
 * links no CUDA library and needs no CUDA header: the driver, libcuda.so.1,
 * is opened at the first create (the environment variable HM_CUDA_DRIVER
 * names another path) and every entry point is resolved by its exact
 * versioned name (cuMemAlloc_v2, not the old cuMemAlloc with 32-bit sizes).
 * Without a driver or a device, create answers HM_ERROR_NOT_SUPPORTED with
 * one log line, and nothing else in hetmem changes.
 *
 * Context: either the caller's (hm_cuda_params_set_context: a CUcontext
 * and the CUdevice it is on, both kept alive by the caller longer than the
 * provider), or a device ordinal (hm_cuda_params_set_ordinal), whose
 * primary context hetmem retains at create and releases at destroy: the
 * context the CUDA runtime uses, so memory of such a provider is the
 * runtime's as well. The current context is per thread: every op that needs
 * the provider's context current checks it (cuCtxGetCurrent) and switches
 * (cuCtxPushCurrent_v2 ... cuCtxPopCurrent_v2) only when another is
 * current, so a thread's current context is the same after the op as
 * before. Driver calls per op when the provider's context is current:
 * alloc 2 (cuCtxGetCurrent + the allocation: cuMemAlloc_v2 allocates in
 * whatever context is current, so it cannot be skipped without risking
 * memory of a foreign context), free 1 (the free alone; only when the
 * driver answers CUDA_ERROR_INVALID_CONTEXT, no context being current, is
 * the context pushed and the free made again).
 *
 * Memory types (hm_cuda_params_set_memory_type):
 *   DEVICE   HM_MEMORY_DEVICE, the CPU must not touch it; fill and copy
 *            (cuMemsetD8_v2, cuMemcpy, then cuStreamSynchronize of the
 *            legacy stream) let pools zero and move it.
 *   HOST     HM_MEMORY_HOST_PINNED; flags HM_CUDA_HOST_PORTABLE, _MAPPED,
 *            _WRITE_COMBINED (cuMemHostAlloc's). hetmem hands out the host
 *            pointer; fill and copy use the CPU (memset, memcpy). With
 *            _WRITE_COMBINED the device's address of the memory differs
 *            from the host pointer (cuda.h, cuMemHostAlloc): pass kernels
 *            hm_cuda_allocation_info's device_ptr. The CPU reads
 *            write-combined memory slowly; write it, do not read it.
 *   MANAGED  HM_MEMORY_SHARED; attach HM_CUDA_ATTACH_GLOBAL (default) or
 *            _HOST (cuMemAllocManaged's).
 * IPC (device memory only; host-pinned and managed: hm_ipc_get answers
 * HM_ERROR_NOT_SUPPORTED). The VMM allocator's is described with it below;
 * the legacy allocator's: cuIpcGetMemHandle, the 64-byte handle carried by
 * value in hetmem's handle (no descriptor moves), cuIpcOpenMemHandle_v2 with
 * lazy peer access in the importer, cuIpcCloseMemHandle (of the mapping's
 * base, which the driver reports: any provider of the context may close
 * what another opened). The driver opens a handle once per context: pools
 * over providers of one context share that mapping (provider.h,
 * ipc_context). An importer opens memory of its own device, or of a device
 * it can access as a peer (cuDeviceCanAccessPeer). The driver maps an
 * import at the exporter's address and refuses (CUDA_ERROR_ALREADY_MAPPED)
 * while an earlier mapping of the same exporter overlaps it, which is the
 * case once an exporter frees memory and allocates the address again: the
 * open closes the importer's unused cached mappings of that exporter that
 * overlap and tries once more; if one is still in use (not closed by its
 * hm_ipc_close), hm_ipc_open answers HM_ERROR_BUSY.
 *
 * Frees do not wait for the GPU. A pool's free of device memory makes the
 * block available to the next allocation at once; only a free that reaches
 * the driver (cuMemFree_v2) synchronises. Work a stream still does on a
 * freed block (a kernel, an asynchronous copy) races with its next owner:
 * synchronise the stream (cuStreamSynchronize, cudaDeviceSynchronize)
 * before hm_free/hm_pool_free, or use stream-ordered allocation, which
 * orders the free after the stream's work.
 *
 * Fork: CUDA does not work in a child of a process that initialised it
 * (every driver call there answers CUDA_ERROR_NOT_INITIALIZED). In a fork
 * child, pools over CUDA providers refuse every allocation
 * (HM_ERROR_NOT_SUPPORTED, one log line, also for blocks a pool still
 * caches), IPC export and open, fill and copy; the child may free what it
 * inherited and destroy the pools and providers, which forgets the parent's
 * memory without a driver call (it stays the parent's). Start a new process
 * (exec) for GPU work.
 *
 * Alignment: any power of two. The driver's own alignment is used where it
 * is enough (large allocations come 2 MiB aligned); otherwise the provider
 * allocates size + alignment and hands out the aligned part, freed and
 * exported by its base (hm_cuda_allocation_info reports both).
 * min_page_size: 2 MiB for device and managed memory (the driver's
 * granularity), the system page for host-pinned memory.
 *
 * Driver errors are logged with the native CUresult and its name
 * (cuGetErrorName where the driver has it), kept in hm_last_native_error(),
 * and returned as HM_ERROR_DRIVER; CUDA_ERROR_OUT_OF_MEMORY is
 * HM_ERROR_OUT_OF_MEMORY (the pool front end then trims the pool and tries
 * once more, pool.h), CUDA_ERROR_INVALID_VALUE HM_ERROR_INVALID_ARGUMENT.
 * A free or close the driver refuses during hm_pool_destroy makes the
 * destroy answer HM_ERROR_DRIVER (the pool is gone all the same).
 *
 * Thread safety: every op is thread-safe. */
#ifndef HETMEM_PROVIDERS_CUDA_H
#define HETMEM_PROVIDERS_CUDA_H

#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hm_cuda_memory_type {
    HM_CUDA_MEMORY_DEVICE = 0,
    HM_CUDA_MEMORY_HOST = 1,
    HM_CUDA_MEMORY_MANAGED = 2,
} hm_cuda_memory_type_t;

/* Host-pinned flags (cuMemHostAlloc's CU_MEMHOSTALLOC_*). */
enum {
    HM_CUDA_HOST_PORTABLE = 0x01,
    HM_CUDA_HOST_MAPPED = 0x02,
    HM_CUDA_HOST_WRITE_COMBINED = 0x04,
};
/* Managed attach flags (cuMemAllocManaged's CU_MEM_ATTACH_*). */
enum {
    HM_CUDA_ATTACH_GLOBAL = 0x1,
    HM_CUDA_ATTACH_HOST = 0x2,
};

/* How device memory is allocated (hm_cuda_params_set_allocator):
 *   LEGACY  cuMemAlloc_v2 (the default): the driver's alignment (2 MiB for
 *           2 MiB and more), larger alignments by over-allocation; IPC by
 *           cuIpcGetMemHandle.
 *   VMM     the virtual memory API: cuMemCreate (physical memory), an
 *           address range of exactly the asked alignment from
 *           cuMemAddressReserve, cuMemMap, cuMemSetAccess (read-write for
 *           the provider's device); min_page_size is the driver's
 *           allocation granularity (cuMemGetAllocationGranularity, MINIMUM;
 *           2 MiB on current GPUs). Device memory only (other memory types:
 *           HM_ERROR_INVALID_ARGUMENT at create); a driver without the API:
 *           HM_ERROR_NOT_SUPPORTED at create. IPC through a shareable
 *           handle (hm_cuda_params_set_shareable_handle, below), and
 *           access for peer devices (hm_cuda_params_set_peers).
 *
 * Split and merge in VMM mode (HM_PROVIDER_CAP_SPLIT_MERGE; the legacy
 * allocator has neither: cuMemFree_v2 frees a whole allocation). Each
 * allocation is one physical allocation mapped whole at its own address
 * range, and the driver unmaps and frees ranges only whole; so split and
 * merge are the provider's bookkeeping (a record of its mappings and of the
 * live pieces of each, under a mutex, no driver call). A split point must
 * be a multiple of the granularity (min_page_size); a merge takes two
 * adjacent ranges the provider handed out (pieces of one mapping, or of two
 * whose addresses touch); anything else is HM_ERROR_INVALID_ARGUMENT with a
 * log line. A free gives a piece's bytes back; a mapping is unmapped (its
 * physical memory freed) and its address range freed when its last live
 * byte is freed, so a merged range over two mappings frees both when it is
 * freed whole. If the driver refuses the unmap (cuMemUnmap), the free
 * answers its error and the range stays allocated: the same free made
 * again resumes. If it refuses the address range's free
 * (cuMemAddressFree), the memory is already gone; the free answers the
 * error, and the range stays reserved (no allocation can get its
 * addresses) until the same free made again, the next free, or the
 * provider's destroy frees it. IPC exports a whole mapping only: a piece of
 * one, or a range merged over two, is refused (below).
 * Purge: none (no HM_PROVIDER_CAP_PURGE_LAZY or _FORCE, in either mode).
 * Device memory cannot be faulted back in: a purge that unmapped a range's
 * physical memory would leave the range unusable to the pool that reuses
 * it, and a purge that keeps it mapped gives nothing back. In VMM mode
 * memory goes back to the device by freeing whole ranges (pools trim by
 * freeing, hm_pool_trim), and with split, by freeing the pieces that
 * empty a mapping.
 *
 * IPC in VMM mode. The physical allocation is created asking for the
 * shareable handle type chosen (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR by
 * default, or _FABRIC), and the provider has HM_PROVIDER_CAP_IPC (not with
 * HM_CUDA_SHAREABLE_NONE). A handle grants exactly what it names, so only a
 * whole allocation of the provider is exported, which is what the IPC layer
 * asks for (the provider allocation that holds the pointer); any other
 * range is refused with HM_ERROR_NOT_SUPPORTED and a log line. Export:
 * cuMemRetainAllocationHandle, cuMemExportToShareableHandle, cuMemRelease of
 * the retained handle. FD: the driver's descriptor travels like the memory
 * of host providers (pidfd_getfd, or with the handle over
 * hm_ipc_channel_send / hm_ipc_open_fd); the exporter keeps it open until
 * hm_ipc_put gives the export back, then closes it. FABRIC: the driver's
 * 64-byte fabric handle travels by value (no descriptor), for memory shared
 * across the nodes of a multi-node NVLink system (the importer's process
 * needs access to the exporter's IMEX channel; the driver refuses an import
 * otherwise).
 * Import (hm_ipc_open), by any device provider of this family, legacy or VMM
 * mode, of either payload (legacy cuIpcGetMemHandle or VMM): every field of
 * the payload is checked before use (kind, reserved bytes, sizes nonzero and
 * multiples of the allocation granularity, the range within the allocation,
 * the size the one of the handle) and the device as for legacy handles (its
 * own or a peer it can access); then cuMemImportFromShareableHandle,
 * cuMemGetAllocationPropertiesFromHandle (pinned device memory only),
 * cuMemAddressReserve of the allocation's size at an address of the
 * importer's choosing, cuMemMap (the driver refuses a size larger than the
 * real allocation: a payload that claims more is HM_ERROR_INVALID_HANDLE;
 * one that claims more than any address range can hold fails the
 * reservation: HM_ERROR_OUT_OF_MEMORY),
 * cuMemSetAccess read-write for the importer's device and its peers, and
 * cuMemRelease of the imported handle (the mapping keeps the memory). A
 * failure at any step undoes the others: nothing stays mapped or reserved.
 * hm_ipc_close: cuMemUnmap and cuMemAddressFree, through any provider of
 * the same context (the process records which mappings are VMM imports).
 * The memory stays readable and writable for the importer after the
 * exporter frees it, until the importer closes it (the driver frees the
 * physical memory at the last unmap or release). */
typedef enum hm_cuda_allocator {
    HM_CUDA_ALLOCATOR_LEGACY = 0,
    HM_CUDA_ALLOCATOR_VMM = 1,
} hm_cuda_allocator_t;

/* The shareable handle type of VMM allocations
 * (hm_cuda_params_set_shareable_handle):
 *   FD      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, the default: a file
 *           descriptor, for processes of one machine.
 *   FABRIC  CU_MEM_HANDLE_TYPE_FABRIC: 64 bytes by value, for processes on
 *           the nodes of a multi-node NVLink system (and of one machine).
 *           The device must report
 *           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED; otherwise (or
 *           without cuDeviceGetAttribute) create answers
 *           HM_ERROR_NOT_SUPPORTED with a log line.
 *   NONE    no shareable handle: no IPC (no HM_PROVIDER_CAP_IPC; hm_ipc_get
 *           answers HM_ERROR_NOT_SUPPORTED).
 * The legacy allocator exports with cuIpcGetMemHandle whatever is chosen
 * here: FD (the default) is accepted and means nothing there; FABRIC and
 * NONE are refused at create with HM_ERROR_INVALID_ARGUMENT. */
typedef enum hm_cuda_shareable {
    HM_CUDA_SHAREABLE_FD = 0,
    HM_CUDA_SHAREABLE_FABRIC = 1,
    HM_CUDA_SHAREABLE_NONE = 2,
} hm_cuda_shareable_t;

/* The most peer ordinals hm_cuda_params_set_peers takes. */
#define HM_CUDA_PEERS_MAX 32

typedef struct hm_cuda_params hm_cuda_params_t;

HM_API const hm_provider_ops_t *hm_cuda_provider_ops(void);

/* Defaults: device ordinal 0 (its primary context), device memory. */
HM_API hm_result_t hm_cuda_params_create(hm_cuda_params_t **params);
HM_API hm_result_t hm_cuda_params_destroy(hm_cuda_params_t *params);
/* The caller's CUcontext (non-NULL) and the CUdevice it is on (replaces an
 * ordinal). A device the context is not on is refused at create with
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_cuda_params_set_context(hm_cuda_params_t *params, void *cu_context,
                                              int cu_device);
/* A device ordinal (>= 0; replaces a context); one that does not exist is
 * refused at create with HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_cuda_params_set_ordinal(hm_cuda_params_t *params, int ordinal);
HM_API hm_result_t hm_cuda_params_set_memory_type(hm_cuda_params_t *params,
                                                  hm_cuda_memory_type_t type);
/* HM_CUDA_ALLOCATOR_LEGACY (default) or _VMM; others:
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_cuda_params_set_allocator(hm_cuda_params_t *params,
                                                hm_cuda_allocator_t allocator);
/* HM_CUDA_SHAREABLE_FD (default), _FABRIC or _NONE; others:
 * HM_ERROR_INVALID_ARGUMENT. Checked against the allocator at create. */
HM_API hm_result_t hm_cuda_params_set_shareable_handle(hm_cuda_params_t *params,
                                                       hm_cuda_shareable_t type);
/* VMM mode: devices (ordinals) that get read-write access to every
 * allocation, and to every mapping the provider opens through IPC, next to
 * the provider's own device (cuMemSetAccess). Replaces an earlier list;
 * n == 0 clears it (ordinals may then be NULL). ordinals NULL with n > 0,
 * a negative ordinal or n > HM_CUDA_PEERS_MAX: HM_ERROR_INVALID_ARGUMENT.
 * The provider's own device in the list is ignored. At create, an ordinal
 * that does not exist is HM_ERROR_INVALID_ARGUMENT, and a peer that cannot
 * access the provider's device (cuDeviceCanAccessPeer(peer, own) is 0)
 * HM_ERROR_NOT_SUPPORTED, each with a log line; a list with the legacy
 * allocator is HM_ERROR_INVALID_ARGUMENT (it maps with cuMemAlloc_v2, whose
 * peer access is the context's, cuCtxEnablePeerAccess). */
HM_API hm_result_t hm_cuda_params_set_peers(hm_cuda_params_t *params, const int *ordinals,
                                            size_t n);
/* HOST: HM_CUDA_HOST_* bits (other bits: HM_ERROR_INVALID_ARGUMENT);
 * MANAGED: exactly one of HM_CUDA_ATTACH_*. Checked against the memory type
 * at create. 0: the defaults (no host flags; ATTACH_GLOBAL). */
HM_API hm_result_t hm_cuda_params_set_flags(hm_cuda_params_t *params, unsigned flags);

/* What the driver says of memory of a CUDA provider (any pointer inside an
 * allocation or inside a mapping it opened). */
typedef struct hm_cuda_allocation {
    hm_cuda_memory_type_t type;
    int device;          /* ordinal */
    void *context;       /* CUcontext */
    uint64_t buffer_id;  /* unique in the process for its life */
    uint64_t base;       /* the driver's allocation (before any alignment offset) */
    size_t size;
    /* The address of ptr that kernels and the driver's device calls take:
     * ptr itself, but for write-combined host memory, whose device address
     * differs from its host pointer (cuMemHostGetDevicePointer_v2). */
    uint64_t device_ptr;
} hm_cuda_allocation_t;
HM_API hm_result_t hm_cuda_allocation_info(hm_provider_t *provider, const void *ptr,
                                           hm_cuda_allocation_t *info);

/* Convenience: params as given (NULL: the defaults). */
HM_API hm_result_t hm_cuda_provider_create(const hm_cuda_params_t *params,
                                           hm_provider_t **provider);

#ifdef __cplusplus
}
#endif
#endif
