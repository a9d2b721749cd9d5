/* hetmem IPC tests — one decoder check shared by the fuzzer and the corpus
 * test: never crash; a handle that decodes re-encodes to the same bytes.
 * SPDX-License-Identifier: MIT */
#ifndef HM_TEST_DECODE_CHECK_H
#define HM_TEST_DECODE_CHECK_H

#include "ipc/wire.h"

#include <stdlib.h>
#include <string.h>

/* Returns 1 if the input decoded. Aborts on a broken round trip. */
static inline int decode_check(const unsigned char *data, size_t size) {
    hm_wire_t w;
    hm_result_t r = hm__wire_decode(data, size, &w);
    if (r != HM_SUCCESS) {
        if (r != HM_ERROR_INVALID_HANDLE && r != HM_ERROR_NOT_SUPPORTED) abort();
        return 0;
    }
    if (w.total_size > size || w.payload != data + HM_IPC_HEADER_SIZE) abort();
    static unsigned char out[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    memcpy(out + HM_IPC_HEADER_SIZE, w.payload, w.payload_len);
    hm__wire_encode(&w, out);
    if (memcmp(out, data, w.total_size) != 0) abort();
    return 1;
}

/* The same input with its checksum made valid, so that the field checks
 * behind the CRC are reached too. */
static inline int decode_check_fixed_crc(const unsigned char *data, size_t size) {
    if (size < HM_IPC_HEADER_SIZE || size > HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX) return 0;
    static unsigned char b[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    memcpy(b, data, size);
    uint32_t plen = (uint32_t)b[20] | ((uint32_t)b[21] << 8) | ((uint32_t)b[22] << 16) |
                    ((uint32_t)b[23] << 24);
    if (plen > size - HM_IPC_HEADER_SIZE) plen = (uint32_t)(size - HM_IPC_HEADER_SIZE);
    uint32_t c = hm__crc32c(0, b, HM__WIRE_CRC_OFF);
    c = hm__crc32c(c, b + HM_IPC_HEADER_SIZE, plen);
    for (int i = 0; i < 4; i++) b[HM__WIRE_CRC_OFF + i] = (unsigned char)(c >> (8 * i));
    return decode_check(b, size);
}

#endif
