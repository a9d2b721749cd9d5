/* hetmem — how many address bits each address-keyed structure covers. Never
 * installed.
 * SPDX-License-Identifier: MIT
 *
 * A structure keyed by address covers the low N bits of an address: a range
 * that reaches 2^N or above cannot be represented (its key would index past
 * the structure, or alias an address below). Every component that has such
 * a limit refuses a range beyond it where the range first reaches it, with
 * HM_ERROR_NOT_SUPPORTED and one HM_LOG_ERROR line, and gives it back:
 *
 *   component           bits  structure                  refused in
 *   tracker              57   radix tree (tracker.c)     hm__tracker_insert, so
 *                                                        hm_pool_provider_alloc of
 *                                                        every tracked pool
 *   native pool          48   page map (native.c)        where it takes memory from
 *                                                        its provider (slabs and
 *                                                        large blocks alike)
 *   jemalloc pool        48   jemalloc's extent map      the extent alloc hook
 *                             (LG_VADDR)                 (jemalloc.c)
 *   proxy pool            -   hash map of full addresses nowhere (the tracker's
 *                                                        limit when tracked)
 *
 * Providers do not refuse: the fixed provider takes the caller's buffer
 * wherever it lies and leaves the limits to the pools and the tracker, which
 * know what they can represent. The os, file and devdax providers map with
 * no address hint (src/platform/prim.c; MAP_FIXED only inside a reservation
 * made without one), and Linux places such a mapping below 2^47 on x86-64
 * and below 2^48 on arm64 even when the kernel runs 5-level (57-bit) or
 * 52-bit page tables: it hands out higher addresses only to an mmap whose
 * hint lies above. So only a caller's buffer (the fixed provider, or a
 * provider outside hetmem) can bring such memory in.
 *
 * x86-64 user space is below 2^56 with 5-level paging, so the tracker covers
 * every user address. HM_JEMALLOC_ADDR_BITS is also what the private
 * jemalloc is configured with (--with-lg-vaddr; cmake/HmJemalloc.cmake reads
 * it from this file), never the build CPU's width: jemalloc keeps an extent's
 * size class in the bits of its extent-map word above LG_VADDR (one word per
 * page, RTREE_LEAF_COMPACT), which needs 64 - LG_VADDR >= 8 with 4 KiB pages
 * (232 size classes), and src/pools/jemalloc/je_fast.c reads that word. */
#ifndef HM_ADDR_WIDTH_H
#define HM_ADDR_WIDTH_H

#include <stddef.h>
#include <stdint.h>

#define HM_TRACKER_ADDR_BITS 57
#define HM_NATIVE_ADDR_BITS 48
#define HM_JEMALLOC_ADDR_BITS 48

_Static_assert(HM_JEMALLOC_ADDR_BITS <= 56, "jemalloc's one-word extent map needs LG_VADDR <= 56");

/* 1 when [base, base+size) lies below 2^bits (bits < 64). */
static inline int hm__range_below(uintptr_t base, size_t size, unsigned bits) {
    uintptr_t limit = (uintptr_t)1 << bits;
    return size <= limit && base <= limit - size;
}

#endif
