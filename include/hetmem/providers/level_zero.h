/* hetmem — the Level Zero provider: Intel GPU device, host and shared USM.
 * SPDX-License-Identifier: MIT
 *
 * Memory of one Level Zero device (or host memory of its driver), allocated
 * with zeMemAllocDevice / zeMemAllocHost / zeMemAllocShared. The library
 * links no Level Zero library: the loader, libze_loader.so.1, is opened at
 * the first create (the environment variable HM_LEVEL_ZERO_LOADER names
 * another path). Without a loader, or without a driver and device behind
 * it, create answers HM_ERROR_NOT_SUPPORTED with one log line, and nothing
 * else in hetmem changes.
 *
 * Device and context: either the caller's (hm_level_zero_params_set_context:
 * a ze_context_handle_t and a ze_device_handle_t of the same driver, which
 * the caller keeps alive longer than the provider), or a device ordinal
 * that hetmem resolves (hm_level_zero_params_set_ordinal: the ordinal-th
 * GPU device over every driver, in the loader's order; zeInit is called
 * as needed, before or after the program's own). Providers made from
 * ordinals of one driver share one context that hetmem creates at the
 * first and destroys with the last of them, so their pools share opened
 * IPC mappings (provider.h, ipc_context).
 *
 * Memory types (hm_level_zero_params_set_memory_type):
 *   DEVICE  HM_MEMORY_DEVICE: the CPU must not touch it; pools keep their
 *           metadata on the host and zero and move it with the provider's
 *           fill and copy (an immediate command list, synchronous).
 *   HOST    HM_MEMORY_HOST_PINNED: host memory the device reads and writes.
 *   SHARED  HM_MEMORY_SHARED: migrates between host and device. No IPC
 *           (real drivers have none for it): hm_ipc_get answers
 *           HM_ERROR_NOT_SUPPORTED.
 * IPC (device memory only, as on real drivers): zeMemGetIpcHandle of the
 * allocation's base; its dma-buf descriptor is valid only in the exporting
 * process, so it travels to the importer (pidfd_getfd, or the channel's
 * SCM_RIGHTS) and the importer's own copy is written into the handle before
 * zeMemOpenIpcHandle. zeMemPutIpcHandle is called at the export's release
 * where the loader has it (1.10+). An importer opens memory of its own
 * device, or of a device its device can access as a peer
 * (zeDeviceCanAccessPeer); any other answers HM_ERROR_NOT_SUPPORTED before
 * a descriptor moves.
 *
 * Alignment: any power of two, passed to the driver (whose answer to one
 * it cannot meet, ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT, is
 * HM_ERROR_INVALID_ARGUMENT). min_page_size is the
 * driver's page size for the memory type (from zeMemGetAllocProperties of a
 * probe allocation at create); recommended_page_size is 2 MiB.
 * Free: zeMemFree, or zeMemFreeExt with the blocking or deferred policy
 * where the driver offers it (HM_LEVEL_ZERO_FREE_*); asking for a policy
 * the driver lacks fails at create with HM_ERROR_NOT_SUPPORTED.
 * Resident devices (hm_level_zero_params_set_resident_devices): every
 * allocation is made resident on them (zeContextMakeMemoryResident).
 * Sizes: above the device's maxMemAllocSize (4 GiB on many Intel GPUs) the
 * allocation carries ze_relaxed_allocation_limits_exp_desc_t
 * (ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE); kernels that address
 * such memory need the driver's >4 GiB build option, which is the
 * program's.
 * IPC: every zeMemOpenIpcHandle maps anew (the spec: "unique pointers");
 * the IPC layer's cache of opened mappings is what shares one open between
 * pools of one context.
 *
 * Streams (stream-ordered allocation, hetmem/stream.h; the provider has
 * HM_PROVIDER_CAP_STREAMS): a stream is an immediate command list
 * (ze_command_list_handle_t) that the program created, in any mode, on the
 * provider's context and device (the spec: a command list and the events
 * it signals are of one context). So streams need a provider made with the
 * program's context (hm_level_zero_params_set_context): one made from an
 * ordinal uses a context of hetmem's own. The events are the
 * provider's: driver events from host-visible event pools (64 events each)
 * it creates on its context as needed and destroys at its destroy. A
 * record appends a signal of the event to the list
 * (zeCommandListAppendSignalEvent): the event completes once the work
 * appended to the list before it has run. A query is zeEventQueryStatus
 * (not yet: HM_ERROR_BUSY), a sync zeEventHostSynchronize without a
 * timeout. An event destroyed, or recorded again, while its signal is still
 * queued is kept from the driver's reuse until it completes (the spec
 * forbids destroying an event the device still uses); the provider's
 * destroy waits for such events. A record that fails leaves the event as
 * if never recorded (complete). Calls on one event are the caller's to
 * serialise; different events are independent.
 *
 * Fork: Level Zero does not work in a fork child (the loader's zeInit is
 * done once per address space and the handles are the parent's). There a
 * provider made before the fork calls no driver: alloc, fill, copy, IPC
 * export and open, hm_level_zero_allocation_info and a new create answer
 * HM_ERROR_NOT_SUPPORTED (one log line per process), and so do event
 * create, record, query and sync; free, IPC close and put, event destroy
 * and destroy succeed and forget the parent's memory and events. A process started
 * by exec is new: create works there.
 * Exit: once exit() has begun (an atexit handler the provider registers
 * when it opens the loader, which runs before the loader's own exit-time
 * teardown), the same holds: pools destroyed from later atexit handlers or
 * destructors succeed without calling the driver; the memory goes back with
 * the process.
 *
 * Driver errors are logged with the native ze_result_t, kept in
 * hm_last_native_error(), and returned as HM_ERROR_DRIVER;
 * ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY (and UNSUPPORTED_SIZE: more than the
 * device's largest allocation) is HM_ERROR_OUT_OF_MEMORY and
 * ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY HM_ERROR_OUT_OF_HOST_MEMORY.
 *
 * Thread safety: every op is thread-safe (fill and copy share the
 * provider's one command list under a lock). */
#ifndef HETMEM_PROVIDERS_LEVEL_ZERO_H
#define HETMEM_PROVIDERS_LEVEL_ZERO_H

#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hm_level_zero_memory_type {
    HM_LEVEL_ZERO_MEMORY_DEVICE = 0,
    HM_LEVEL_ZERO_MEMORY_HOST = 1,
    HM_LEVEL_ZERO_MEMORY_SHARED = 2,
} hm_level_zero_memory_type_t;

typedef enum hm_level_zero_free_policy {
    HM_LEVEL_ZERO_FREE_DEFAULT = 0,  /* zeMemFree */
    HM_LEVEL_ZERO_FREE_BLOCKING = 1, /* zeMemFreeExt: wait until the device no longer uses it */
    HM_LEVEL_ZERO_FREE_DEFER = 2,    /* zeMemFreeExt: freed once the device no longer uses it */
} hm_level_zero_free_policy_t;

typedef struct hm_level_zero_params hm_level_zero_params_t;

HM_API const hm_provider_ops_t *hm_level_zero_provider_ops(void);

/* Defaults: device ordinal 0, device memory, zeMemFree, no resident devices. */
HM_API hm_result_t hm_level_zero_params_create(hm_level_zero_params_t **params);
HM_API hm_result_t hm_level_zero_params_destroy(hm_level_zero_params_t *params);
/* The caller's ze_context_handle_t and ze_device_handle_t (both non-NULL;
 * replaces an ordinal). A device of another driver than the context's is
 * refused at create with HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_level_zero_params_set_context(hm_level_zero_params_t *params,
                                                    void *ze_context, void *ze_device);
/* A device ordinal (>= 0; replaces a context). One that does not exist is
 * refused at create with HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_level_zero_params_set_ordinal(hm_level_zero_params_t *params, int ordinal);
HM_API hm_result_t hm_level_zero_params_set_memory_type(hm_level_zero_params_t *params,
                                                        hm_level_zero_memory_type_t type);
/* ze_device_handle_t devices (copied; at most 64; n 0: none). */
HM_API hm_result_t hm_level_zero_params_set_resident_devices(hm_level_zero_params_t *params,
                                                             void *const *devices, size_t n);
HM_API hm_result_t hm_level_zero_params_set_free_policy(hm_level_zero_params_t *params,
                                                        hm_level_zero_free_policy_t policy);

/* What the driver says of an allocation of a Level Zero provider (any
 * pointer inside it, or inside a mapping it opened). */
typedef struct hm_level_zero_allocation {
    hm_level_zero_memory_type_t type;
    void *device;    /* ze_device_handle_t; NULL for host memory */
    uint64_t id;     /* the driver's allocation id: unique in the process for its life */
    size_t page_size;
    void *base;      /* zeMemGetAddressRange */
    size_t size;
} hm_level_zero_allocation_t;
/* provider: a Level Zero provider; ptr: its memory. Not its memory:
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_level_zero_allocation_info(hm_provider_t *provider, const void *ptr,
                                                 hm_level_zero_allocation_t *info);

/* Convenience: params as given (NULL: the defaults). */
HM_API hm_result_t hm_level_zero_provider_create(const hm_level_zero_params_t *params,
                                                 hm_provider_t **provider);

#ifdef __cplusplus
}
#endif
#endif
