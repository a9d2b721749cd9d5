/* hetmem — devdax provider internals, exposed for the tests. Internal.
 * SPDX-License-Identifier: MIT */
#ifndef HM_PROVIDERS_DEVDAX_INTERNAL_H
#define HM_PROVIDERS_DEVDAX_INTERNAL_H

#include "internal.h"

/* Read a device DAX's geometry from sysfs under `sysfs_root` (normally
 * "/sys"), for the character device major:minor:
 *  - <root>/dev/char/<major>:<minor> must exist (else: not a device with a
 *    sysfs entry) and its `subsystem` link must end in "dax" (both the dax
 *    bus and the old dax class do); otherwise it is not a device DAX;
 *  - size: <dir>/size (bytes, decimal or 0x-hex), required, > 0;
 *  - align: the first of <dir>/align (kernel 5.10+),
 *    <dir>/device/dax_region/align, <dir>/../dax_region/align; if none
 *    exists, 2 MiB (the default of ndctl-created namespaces), logged.
 * Every failure returns HM_ERROR_INVALID_ARGUMENT with a log line naming
 * the file. *align is not checked here (see hm__devdax_geometry). */
hm_result_t hm__devdax_sysfs_read(const char *sysfs_root, unsigned major, unsigned minor,
                                  uint64_t *size, uint64_t *align);

/* The alignment rules: align must be a power of two, at least the page
 * size and at most 1 GiB; the usable size is the device size (or `limit`
 * when non-zero and not larger) rounded down to align, and must hold at
 * least one aligned unit. HM_ERROR_INVALID_ARGUMENT (logged) otherwise. */
hm_result_t hm__devdax_geometry(uint64_t size, uint64_t align, uint64_t limit, size_t page,
                                uint64_t *usable);

/* Test hook: use another sysfs root for this params object ("/sys" by
 * default). The string is copied. */
hm_result_t hm__devdax_params_set_sysfs_root(hm_devdax_params_t *params, const char *root);

#endif
