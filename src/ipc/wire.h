/* hetmem — IPC handle wire format: encode, decode, CRC32C. Never installed.
 * SPDX-License-Identifier: MIT
 *
 * Layout (all integers little-endian, whatever the host; offsets in bytes):
 *
 *   off size field
 *     0   4  magic          "HMIP" = 0x50494d48
 *     4   2  version        HM__WIRE_VERSION (a reader refuses any other)
 *     6   2  header_size    HM_IPC_HEADER_SIZE (104)
 *     8   4  total_size     header_size + payload_len
 *    12   4  family         hm_provider_family_t of the exporting provider
 *    16   4  flags          HM__WIRE_HAS_FD; other bits must be 0
 *    20   4  payload_len    <= HM_IPC_PAYLOAD_MAX
 *    24   4  kind           hm_memory_kind_t
 *    28   4  fd             exporter's descriptor number (HAS_FD), else -1
 *    32   8  pid            exporter's pid (1 .. 2^31-1)
 *    40   8  nonce          exporter's per-process random nonce (!= 0)
 *    48   8  start_time     exporter's start time, clock ticks since boot
 *    56   8  alloc_id       exporter's tracker id of the allocation (!= 0)
 *    64   8  base           exporter's address of the allocation (!= 0)
 *    72   8  size           allocation size (> 0, base + size no overflow)
 *    80   8  offset         exported pointer - base (< size)
 *    88   8  origin         exporter's address of its own copy of this
 *                           handle (the bytes hm_ipc_get returned; != 0)
 *    96   4  reserved       0
 *   100   4  crc32c         over bytes [0, 100) and the payload
 *   104   .. payload        the provider's native handle
 *
 * The checksum catches corruption and truncation, not forgery. A forged
 * handle with a valid checksum is stopped by the importer's comparison
 * with the exporter's own copy at `origin` (read from the exporter's
 * memory: import.c, open_verify), which covers every field and the payload;
 * where the importer may not read it, by the identity check (pid + start
 * time), the provider's payload validation and the fd's size check. */
#ifndef HM_IPC_WIRE_H
#define HM_IPC_WIRE_H

#include "internal.h"

#include <string.h>

#define HM__WIRE_MAGIC 0x50494d48u
#define HM__WIRE_VERSION 2u
#define HM__WIRE_CRC_OFF 100u

enum { HM__WIRE_HAS_FD = 1u << 0 };

/* Offsets of the fields the caches read without decoding. */
enum {
    HM__WIRE_OFF_TOTAL = 8,  /* total_size | family << 32 */
    HM__WIRE_OFF_FLAGS = 16, /* flags | payload_len << 32 */
    HM__WIRE_OFF_KIND = 24,  /* kind | fd << 32 */
    HM__WIRE_OFF_PID = 32,
    HM__WIRE_OFF_NONCE = 40,
    HM__WIRE_OFF_START = 48,
    HM__WIRE_OFF_ALLOC_ID = 56,
    HM__WIRE_OFF_BASE = 64,
    HM__WIRE_OFF_SIZE = 72,
    HM__WIRE_OFF_OFFSET = 80,
    HM__WIRE_OFF_ORIGIN = 88,
    HM__WIRE_OFF_RESERVED = 96, /* 4 bytes */
};

/* The little-endian 64-bit field at off (no validation: a cache key, or a
 * field of bytes already known to equal a validated handle's). */
static inline uint64_t hm__wire_peek64(const unsigned char *b, unsigned off) {
    uint64_t v;
    memcpy(&v, b + off, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* The little-endian 32-bit field at off (no validation, as above). */
static inline uint32_t hm__wire_peek32(const unsigned char *b, unsigned off) {
    uint32_t v;
    memcpy(&v, b + off, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* The first 8 bytes of every valid handle (magic, version, header size) as
 * hm__wire_peek64 reads them. */
#define HM__WIRE_WORD0 \
    ((uint64_t)HM__WIRE_MAGIC | (uint64_t)HM__WIRE_VERSION << 32 | (uint64_t)HM_IPC_HEADER_SIZE << 48)

/* A decoded header; payload points into the caller's bytes. */
typedef struct hm_wire {
    uint32_t family;
    uint32_t flags;
    uint32_t payload_len;
    uint32_t kind;
    int32_t fd;
    uint64_t pid, nonce, start_time;
    uint64_t alloc_id, base, size, offset;
    uint64_t origin;
    const unsigned char *payload;
    uint32_t total_size;
} hm_wire_t;

/* CRC32C (Castagnoli) of buf, continuing from crc (start with 0). */
uint32_t hm__crc32c(uint32_t crc, const void *buf, size_t len);

/* The checksum a handle of payload_len payload bytes must carry at
 * HM__WIRE_CRC_OFF: CRC32C of bytes [0, 100) and of the payload. b holds
 * HM_IPC_HEADER_SIZE + payload_len bytes. */
uint32_t hm__wire_checksum(const unsigned char *b, uint32_t payload_len);

/* Write the header for w (payload_len bytes of payload already at
 * out + HM_IPC_HEADER_SIZE) and the checksum. out holds total bytes. */
void hm__wire_encode(const hm_wire_t *w, unsigned char *out);

/* Validate bytes completely and fill *w. Pure: no allocation, no system
 * call; logs the reason of a rejection at WARN and returns
 *   HM_ERROR_INVALID_HANDLE (truncated, magic, lengths, checksum, fields),
 *   HM_ERROR_NOT_SUPPORTED (another version). */
hm_result_t hm__wire_decode(const void *bytes, size_t len, hm_wire_t *w);

/* Only magic/version/header_size/total_size: the length of a handle whose
 * header has arrived. */
hm_result_t hm__wire_length(const void *bytes, size_t len, size_t *total);

#endif
