/* hetmem — IPC handle wire format. SPDX-License-Identifier: MIT
 *
 * CRC32C: the CRC with the Castagnoli polynomial 0x1EDC6F41 (reflected
 * 0x82F63B78), chosen for its Hamming distance at short lengths
 * (G. Castagnoli, S. Braeuer, M. Herrmann, "Optimization of cyclic
 * redundancy-check codes with 24 and 32 parity bits", IEEE Trans. Commun.
 * 41(6), 1993) and used by iSCSI (RFC 3720 section 12.1, test vectors in
 * appendix B.4: "123456789" -> 0xE3069283). x86-64 computes it in hardware
 * with the SSE4.2 CRC32 instruction (Intel SDM vol. 2A, "CRC32"), 8 bytes
 * at a time; elsewhere a byte-wise table (the classic reflected table
 * algorithm, e.g. Ross Williams, "A painless guide to CRC error detection
 * algorithms", 1993, section 10). */
#include "ipc/wire.h"

#include <string.h>

/* ---- CRC32C ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_make(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

static uint32_t crc32c_sw(uint32_t crc, const unsigned char *p, size_t len) {
    pthread_once(&crc_table_once, crc_table_make);
    while (len--) crc = (crc >> 8) ^ crc_table[(crc ^ *p++) & 0xffu];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p,
                                                             size_t len) {
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
static int crc_hw_ok(void) {
    static _Atomic int state; /* 0 unknown, 1 yes, 2 no */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (hm_unlikely(!s)) {
        __builtin_cpu_init();
        s = __builtin_cpu_supports("sse4.2") ? 1 : 2;
        atomic_store_explicit(&state, s, memory_order_relaxed);
    }
    return s == 1;
}
#endif

uint32_t hm__crc32c(uint32_t crc, const void *buf, size_t len) {
    crc = ~crc;
#if defined(__x86_64__)
    if (hm_likely(crc_hw_ok())) return ~crc32c_hw(crc, buf, len);
#endif
    return ~crc32c_sw(crc, buf, len);
}

/* ---- little-endian access, whatever the host ---- */

static inline void put16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}
static inline void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t get64(const unsigned char *p) {
    return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32);
}

static uint32_t wire_crc(const unsigned char *b, uint32_t payload_len) {
    uint32_t c = hm__crc32c(0, b, HM__WIRE_CRC_OFF);
    return hm__crc32c(c, b + HM_IPC_HEADER_SIZE, payload_len);
}

uint32_t hm__wire_checksum(const unsigned char *b, uint32_t payload_len) {
    return wire_crc(b, payload_len);
}

void hm__wire_encode(const hm_wire_t *w, unsigned char *out) {
    memset(out, 0, HM_IPC_HEADER_SIZE);
    put32(out + 0, HM__WIRE_MAGIC);
    put16(out + 4, HM__WIRE_VERSION);
    put16(out + 6, HM_IPC_HEADER_SIZE);
    put32(out + 8, HM_IPC_HEADER_SIZE + w->payload_len);
    put32(out + 12, w->family);
    put32(out + 16, w->flags);
    put32(out + 20, w->payload_len);
    put32(out + 24, w->kind);
    put32(out + 28, (uint32_t)w->fd);
    put64(out + 32, w->pid);
    put64(out + 40, w->nonce);
    put64(out + 48, w->start_time);
    put64(out + 56, w->alloc_id);
    put64(out + 64, w->base);
    put64(out + 72, w->size);
    put64(out + 80, w->offset);
    put64(out + 88, w->origin);
    put32(out + HM__WIRE_CRC_OFF, wire_crc(out, w->payload_len));
}

hm_result_t hm__wire_length(const void *bytes, size_t len, size_t *total) {
    const unsigned char *b = bytes;
    if (!b || len < HM_IPC_HEADER_SIZE) {
        HM_LOG_WARN("IPC handle: %zu bytes, shorter than the %u-byte header (truncated)", len,
                    HM_IPC_HEADER_SIZE);
        return HM_ERROR_INVALID_HANDLE;
    }
    uint32_t magic = get32(b);
    if (magic != HM__WIRE_MAGIC) {
        HM_LOG_WARN("IPC handle: bad magic 0x%08x (not a hetmem handle)", magic);
        return HM_ERROR_INVALID_HANDLE;
    }
    uint16_t version = get16(b + 4);
    if (version != HM__WIRE_VERSION) {
        HM_LOG_WARN("IPC handle: format version %u, this library reads version %u", version,
                    HM__WIRE_VERSION);
        return HM_ERROR_NOT_SUPPORTED;
    }
    uint16_t hsize = get16(b + 6);
    uint32_t tsize = get32(b + 8), plen = get32(b + 20);
    if (hsize != HM_IPC_HEADER_SIZE || plen > HM_IPC_PAYLOAD_MAX ||
        tsize != HM_IPC_HEADER_SIZE + plen) {
        HM_LOG_WARN("IPC handle: inconsistent lengths (header %u, total %u, payload %u)", hsize,
                    tsize, plen);
        return HM_ERROR_INVALID_HANDLE;
    }
    *total = tsize;
    return HM_SUCCESS;
}

hm_result_t hm__wire_decode(const void *bytes, size_t len, hm_wire_t *w) {
    size_t total;
    hm_result_t r = hm__wire_length(bytes, len, &total);
    if (r) return r;
    const unsigned char *b = bytes;
    if (len < total) {
        HM_LOG_WARN("IPC handle: %zu bytes of a %zu-byte handle (truncated)", len, total);
        return HM_ERROR_INVALID_HANDLE;
    }
    w->payload_len = get32(b + 20);
    uint32_t crc = get32(b + HM__WIRE_CRC_OFF);
    uint32_t want = wire_crc(b, w->payload_len);
    if (crc != want) {
        HM_LOG_WARN("IPC handle: checksum 0x%08x, computed 0x%08x (corrupt)", crc, want);
        return HM_ERROR_INVALID_HANDLE;
    }
    w->total_size = (uint32_t)total;
    w->family = get32(b + 12);
    w->flags = get32(b + 16);
    w->kind = get32(b + 24);
    w->fd = (int32_t)get32(b + 28);
    w->pid = get64(b + 32);
    w->nonce = get64(b + 40);
    w->start_time = get64(b + 48);
    w->alloc_id = get64(b + 56);
    w->base = get64(b + 64);
    w->size = get64(b + 72);
    w->offset = get64(b + 80);
    w->origin = get64(b + 88);
    w->payload = b + HM_IPC_HEADER_SIZE;
    const char *why = NULL;
    int reserved = 0;
    for (unsigned i = HM__WIRE_OFF_RESERVED; i < HM__WIRE_CRC_OFF; i++) reserved |= b[i];
    if (reserved) why = "reserved bytes are not zero";
    else if (w->flags & ~(uint32_t)HM__WIRE_HAS_FD) why = "unknown flags";
    else if (!w->family) why = "no provider family";
    else if (w->kind > HM_MEMORY_SHARED) why = "unknown memory kind";
    else if ((w->flags & HM__WIRE_HAS_FD) ? w->fd < 0 : w->fd != -1) why = "fd field disagrees with flags";
    else if (!w->pid || w->pid > INT32_MAX) why = "pid out of range";
    else if (!w->nonce) why = "zero nonce";
    else if (!w->alloc_id) why = "zero allocation id";
    else if (!w->base || !w->size) why = "zero base or size";
    else if (w->base > UINT64_MAX - w->size || w->size > (SIZE_MAX >> 1)) why = "base + size overflows";
    else if (w->offset >= w->size) why = "offset beyond the allocation";
    else if (!w->origin) why = "zero origin";
    if (why) {
        HM_LOG_WARN("IPC handle rejected: %s", why);
        return HM_ERROR_INVALID_HANDLE;
    }
    return HM_SUCCESS;
}
