/* hetmem IPC — the handle decoder over a generated corpus: valid handles
 * with random fields, and their truncations, bit flips, byte overwrites and
 * splices; raw and with a repaired checksum. Every valid one must decode
 * and re-encode byte for byte; nothing may crash. (With clang the libFuzzer
 * target fuzz_ipc_decode explores further.) SPDX-License-Identifier: MIT */
#include "harness.h"
#include "decode_check.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { /* xorshift64* (Vigna 2016) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static size_t make_valid(unsigned char *b) {
    hm_wire_t w = {
        .family = 1 + (uint32_t)(next() % 6),
        .kind = (uint32_t)(next() % 4),
        .payload_len = (uint32_t)(next() % 600),
        .pid = 1 + next() % 4000000,
        .nonce = next() | 1,
        .start_time = next() % 100000000,
        .alloc_id = 1 + next() % 1000000,
        .base = (next() & 0x7fffffff000ull) | 0x1000,
        .size = 1 + next() % (1u << 30),
    };
    w.offset = next() % w.size;
    w.origin = (next() & 0x7ffffffffff8ull) | 8;
    if (next() & 1) {
        w.flags = HM__WIRE_HAS_FD;
        w.fd = (int32_t)(next() % 1024);
    } else {
        w.fd = -1;
    }
    for (uint32_t i = 0; i < w.payload_len; i++) b[HM_IPC_HEADER_SIZE + i] = (unsigned char)next();
    hm__wire_encode(&w, b);
    return HM_IPC_HEADER_SIZE + w.payload_len;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    static unsigned char b[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX], m[sizeof(b)];
    long valid = 0, decoded = 0, decoded_fixed = 0;
    for (long it = 0; it < iters; it++) {
        size_t len = make_valid(b);
        valid += decode_check(b, len);
        memcpy(m, b, len);
        size_t mlen = len;
        switch (next() % 5) {
        case 0: mlen = next() % len; break;
        case 1: m[next() % len] ^= (unsigned char)(1u << (next() % 8)); break;
        case 2: m[next() % len] = (unsigned char)next(); break;
        case 3:
            for (int k = 0; k < 8; k++) m[next() % len] = (unsigned char)next();
            break;
        case 4: /* splice the header of another handle */
            make_valid(b);
            memcpy(m, b, 40);
            break;
        }
        decoded += decode_check(m, mlen);
        decoded_fixed += decode_check_fixed_crc(m, mlen);
    }
    CHECK_EQ(valid, iters);
    printf("%ld inputs: %ld valid decoded; mutants decoded %ld raw, %ld with the CRC repaired\n",
           iters, valid, decoded, decoded_fixed);
    return hm_test_finish();
}
