/* hetmem — the CUDA provider's record of its VMM mappings and of the live
 * pieces of each (HM_CUDA_ALLOCATOR_VMM), which split, merge and free work
 * on. Internal; a plain data structure: no driver calls, no lock of its
 * own (the provider holds its vmm_lock around every call).
 * SPDX-License-Identifier: MIT
 *
 * A mapping is one physical allocation (cuMemCreate) mapped whole at its
 * own reservation (cuMemAddressReserve of the same base and length): the
 * driver unmaps and frees a reservation only whole (cuMemUnmap "cannot
 * unmap a sub-range", cuMemAddressFree "the size must match"), so the
 * physical memory goes back once no byte of the mapping is live.
 * A piece is a range the provider handed out (alloc, or the parts of a
 * split, or a merge of two adjacent pieces), rounded up to the granularity.
 *
 * Invariants:
 *  - mappings are sorted by base and do not overlap; so are pieces;
 *  - every piece's bytes lie in recorded mappings, and a piece may span
 *    several adjacent ones (after a merge);
 *  - a mapping's live bytes are the bytes of pieces inside it; a recorded
 *    mapping with none is one whose cuMemAddressFree failed: unmapped,
 *    still reserved (so its addresses cannot be handed out again), and
 *    freed again later by the provider;
 *  - base, length, piece start and piece length are granularity multiples.
 * Lookups are binary searches; insertions and removals move the tail of a
 * sorted array (these are provider calls, rarer than pool calls). */
#ifndef HM_CUDA_VMM_REC_H
#define HM_CUDA_VMM_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hm_vmm_map {
    uintptr_t base; /* of the reservation and of the mapping: one and the same */
    size_t len;
    size_t live;    /* bytes of live pieces inside it */
    bool mapped;    /* false: unmapped by a free that then failed; reserved still */
} hm_vmm_map_t;

typedef struct hm_vmm_piece {
    uintptr_t ptr;
    size_t len;
} hm_vmm_piece_t;

typedef struct hm_vmm_rec {
    hm_vmm_map_t *m;
    size_t nm, mcap;
    hm_vmm_piece_t *p;
    size_t np, pcap;
} hm_vmm_rec_t;

/* Room for one more element in an array of n `size`-byte elements with
 * room for *cap (doubling, 16 at first); false without memory. The
 * provider's tables (cuda.c) grow the same way. */
bool hm__cuda_grow(void **arr, size_t n, size_t *cap, size_t size);

/* A new mapping [base, +len), live whole as one piece. false: no host
 * memory for the record; nothing added. */
bool hm__vmm_rec_add(hm_vmm_rec_t *r, uintptr_t base, size_t len);
/* The piece that starts at ptr, or NULL. */
hm_vmm_piece_t *hm__vmm_rec_piece(hm_vmm_rec_t *r, uintptr_t ptr);
/* The index of the mapping that holds addr, or SIZE_MAX. */
size_t hm__vmm_rec_map_at(const hm_vmm_rec_t *r, uintptr_t addr);
/* The piece at ptr cut after its first `first` bytes (a granularity
 * multiple below its length). false: no host memory; nothing changed. */
bool hm__vmm_rec_split(hm_vmm_rec_t *r, hm_vmm_piece_t *piece, size_t first);
/* The piece lo and the piece that follows it at once (lo->ptr + lo->len)
 * become one. */
void hm__vmm_rec_merge(hm_vmm_rec_t *r, hm_vmm_piece_t *lo);
/* The bytes of piece inside mapping m. */
static inline size_t hm__vmm_rec_overlap(const hm_vmm_map_t *m, const hm_vmm_piece_t *p) {
    uintptr_t lo = m->base > p->ptr ? m->base : p->ptr;
    uintptr_t mend = m->base + m->len, pend = p->ptr + p->len;
    uintptr_t hi = mend < pend ? mend : pend;
    return hi > lo ? (size_t)(hi - lo) : 0;
}
/* The mappings piece spans: indexes [*first, *first + n), n returned. */
size_t hm__vmm_rec_span(const hm_vmm_rec_t *r, const hm_vmm_piece_t *piece, size_t *first);
/* The piece removed and its bytes taken from the live bytes of the
 * mappings it spans; those left with none stay recorded (the caller
 * releases each, then drops it). */
void hm__vmm_rec_free(hm_vmm_rec_t *r, hm_vmm_piece_t *piece);
/* The mapping of index i removed from the record. */
void hm__vmm_rec_drop(hm_vmm_rec_t *r, size_t i);
void hm__vmm_rec_fini(hm_vmm_rec_t *r);

#endif
