/* hetmem — one API over host, pinned, device, file and DAX memory.
 * The umbrella header. SPDX-License-Identifier: MIT */
#ifndef HETMEM_HETMEM_H
#define HETMEM_HETMEM_H

#include <hetmem/base.h>
#include <hetmem/provider.h>
#include <hetmem/pool.h>
#include <hetmem/providers/os.h>
#include <hetmem/providers/fixed.h>
#include <hetmem/providers/file.h>
#include <hetmem/providers/devdax.h>
#include <hetmem/pools/proxy.h>
#include <hetmem/ipc.h>
#include <hetmem/pools/native.h>
#include <hetmem/memspace.h>
#include <hetmem/stream.h>

#endif
