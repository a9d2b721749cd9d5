/* hetmem — the malloc trace format of libhetmem_proxy.so (HM_PROXY_TRACE)
 * and bench/bench_replay. SPDX-License-Identifier: MIT
 *
 * A trace file is one hm_trace_header_t followed by hm_trace_rec_t records,
 * both in the recording machine's byte order (little-endian on every target
 * hetmem builds for), with no padding between them:
 *
 *   header  magic HM_TRACE_MAGIC, version HM_TRACE_VERSION, header_size and
 *           record_size (a reader refuses sizes it does not know), the pid
 *           of the traced process.
 *   record  one malloc-family call of the program:
 *     seq     a process-wide counter, taken after an allocation returns and
 *             before a free gives its block back, so that sorting by seq
 *             orders a block's free before its address is handed out again.
 *             Gaps are possible (records lost at exec or after the final
 *             flush); order, not density, is what a reader may rely on
 *     thread  a small index, 0 for the first thread that called the family,
 *             then 1, 2, ... in order of first call (not the kernel tid)
 *     op      hm_trace_op_t
 *     ptr     the argument pointer (free, realloc), 0 otherwise
 *     size    the requested size (calloc: n * size)
 *     align   the alignment asked for (memalign family), 0 otherwise
 *     result  the pointer returned (0 for free, or a failed call)
 *
 * Records of one thread are in the file in that thread's call order; those
 * of different threads interleave at buffer granularity (each thread writes
 * whole buffers with one write() to a file opened O_APPEND), so a reader
 * sorts by seq to get the process's order.
 *
 * Which calls are recorded: every call the program makes into the exported
 * family, whichever allocator serves it (the pool, or glibc before the pool
 * exists); not the calls hetmem itself makes while serving one (the proxy's
 * guard), nor the internal calls one entry point makes of another (realloc's
 * malloc and free): a realloc is one record. realloc(p, 0) is recorded as a
 * realloc whose result is 0. */
#ifndef HM_PRELOAD_TRACE_H
#define HM_PRELOAD_TRACE_H

#include <stdint.h>

#define HM_TRACE_MAGIC 0x31434152544d4824ull /* "$HMTRAC1" read as little-endian */
#define HM_TRACE_VERSION 1u

typedef enum hm_trace_op {
    HM_TRACE_MALLOC = 1,
    HM_TRACE_CALLOC = 2,
    HM_TRACE_REALLOC = 3,
    HM_TRACE_FREE = 4,
    HM_TRACE_MEMALIGN = 5, /* posix_memalign, aligned_alloc, memalign, valloc, pvalloc */
} hm_trace_op_t;

typedef struct hm_trace_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size; /* sizeof(hm_trace_header_t) */
    uint32_t record_size; /* sizeof(hm_trace_rec_t) */
    uint32_t pid;
    uint64_t reserved;
} hm_trace_header_t;

typedef struct hm_trace_rec {
    uint64_t seq;
    uint64_t ptr;
    uint64_t size;
    uint64_t result;
    uint32_t align;
    uint16_t thread;
    uint8_t op;
    uint8_t reserved;
} hm_trace_rec_t;

_Static_assert(sizeof(hm_trace_header_t) == 32, "trace header layout");
_Static_assert(sizeof(hm_trace_rec_t) == 40, "trace record layout");

#endif
