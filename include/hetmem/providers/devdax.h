/* hetmem — the devdax provider: memory of a device DAX (/dev/daxX.Y).
 * SPDX-License-Identifier: MIT
 *
 * A device DAX is persistent memory (or CXL memory) exposed as a character
 * device that can only be mapped, shared, in multiples of its alignment.
 * The provider reads the device's size and alignment from sysfs
 * (/sys/dev/char/<major>:<minor>/size and .../align, or the dax_region's
 * align on older kernels), maps the usable part once with
 * MAP_SHARED_VALIDATE | MAP_SYNC, and carves allocations out of it through
 * the coarse layer: free, split and merge work; allocations are multiples
 * of the page size (min_page_size), and recommended_page_size is the device
 * alignment.
 *
 * Memory never goes back to the OS: the device has no hole punching, so
 * purge is not offered (no HM_PROVIDER_CAP_PURGE_*). Data persists on the
 * device across processes; as with the file provider, a fresh provider hands
 * memory out from offset 0, best fit, deterministically.
 *
 * A path that does not exist, is a symbolic link (the device is opened
 * O_NOFOLLOW | O_CLOEXEC: give the device node itself), is not a character
 * device, or is a character device that is not a device DAX (checked in
 * sysfs) is refused with HM_ERROR_INVALID_ARGUMENT and a log line saying
 * which; a device that refuses MAP_SYNC gives HM_ERROR_NOT_SUPPORTED.
 *
 * IPC. A handle moves as the provider's descriptor of the device (the IPC
 * layer passes it by pidfd_getfd or the channel: see ipc.h) plus {device
 * number, offset, size}; it names no path, and an importer never opens a
 * device because a handle says so. What a handle exposes and grants: the
 * descriptor of the whole device, open read-write. The exporter shares only
 * what it already holds, but an importer that has the descriptor can map,
 * read and write any part of the device, not only the exported range:
 * export only to a peer that may see all of it. A device DAX cannot be
 * truncated, so neither side can make the other's mappings fault that way.
 * The importer (a devdax provider over the same device: the device's
 * alignment shapes the mapping) checks, before it maps, that the descriptor
 * came with the handle, is open read-write, is a character device with the
 * handle's device number, that sysfs says it is a device DAX
 * (/sys/dev/char/<major>:<minor>/subsystem is "dax") with this provider's
 * alignment, and that the device (its sysfs size) holds the aligned range
 * around [offset, offset + size); any of these failing is
 * HM_ERROR_INVALID_HANDLE, logged. It maps that aligned range read-write,
 * shared, MAP_SYNC, never executable: nothing in the handle chooses the
 * protection. As with the file provider, a range freed while exported is
 * reused at once. The device's descriptor stays open for the provider's
 * life, high and close-on-exec, and is checked before each use (provider.h,
 * "Descriptors"). */
#ifndef HETMEM_PROVIDERS_DEVDAX_H
#define HETMEM_PROVIDERS_DEVDAX_H

#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_devdax_params hm_devdax_params_t;

HM_API const hm_provider_ops_t *hm_devdax_provider_ops(void);

/* path: e.g. "/dev/dax0.0"; copied. */
HM_API hm_result_t hm_devdax_params_create(const char *path, hm_devdax_params_t **params);
HM_API hm_result_t hm_devdax_params_destroy(hm_devdax_params_t *params);
/* Use only the first `bytes` of the device (rounded down to its alignment;
 * 0, the default: all of it). More than the device holds is refused at
 * create with HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_devdax_params_set_size(hm_devdax_params_t *params, uint64_t bytes);

/* Convenience: the whole device. */
HM_API hm_result_t hm_devdax_provider_create(const char *path, hm_provider_t **provider);

#ifdef __cplusplus
}
#endif
#endif
