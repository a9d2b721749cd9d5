/* hetmem — the CUDA provider's record of its VMM mappings and pieces
 * (vmm_rec.h). SPDX-License-Identifier: MIT */
#include "providers/cuda/vmm_rec.h"

#include <stdlib.h>
#include <string.h>

bool hm__cuda_grow(void **arr, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return true;
    size_t nc = *cap ? 2 * *cap : 16;
    void *t = realloc(*arr, nc * size);
    if (!t) return false;
    *arr = t;
    *cap = nc;
    return true;
}

/* The first mapping whose base is above addr (binary search). */
static size_t map_upper(const hm_vmm_rec_t *r, uintptr_t addr) {
    size_t lo = 0, hi = r->nm;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->m[mid].base <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The first piece whose start is at or above ptr. */
static size_t piece_lower(const hm_vmm_rec_t *r, uintptr_t ptr) {
    size_t lo = 0, hi = r->np;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->p[mid].ptr < ptr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static bool piece_insert(hm_vmm_rec_t *r, hm_vmm_piece_t v) {
    if (!hm__cuda_grow((void **)&r->p, r->np, &r->pcap, sizeof(*r->p))) return false;
    size_t i = piece_lower(r, v.ptr);
    memmove(&r->p[i + 1], &r->p[i], (r->np - i) * sizeof(*r->p));
    r->p[i] = v;
    r->np++;
    return true;
}

static void piece_remove(hm_vmm_rec_t *r, size_t i) {
    memmove(&r->p[i], &r->p[i + 1], (r->np - i - 1) * sizeof(*r->p));
    r->np--;
}

bool hm__vmm_rec_add(hm_vmm_rec_t *r, uintptr_t base, size_t len) {
    /* Room in both arrays first, so that nothing is added on failure. */
    if (!hm__cuda_grow((void **)&r->m, r->nm, &r->mcap, sizeof(*r->m)) ||
        !hm__cuda_grow((void **)&r->p, r->np, &r->pcap, sizeof(*r->p)))
        return false;
    size_t i = map_upper(r, base);
    memmove(&r->m[i + 1], &r->m[i], (r->nm - i) * sizeof(*r->m));
    r->m[i] = (hm_vmm_map_t){.base = base, .len = len, .live = len, .mapped = true};
    r->nm++;
    (void)piece_insert(r, (hm_vmm_piece_t){base, len}); /* room made above */
    return true;
}

hm_vmm_piece_t *hm__vmm_rec_piece(hm_vmm_rec_t *r, uintptr_t ptr) {
    size_t i = piece_lower(r, ptr);
    return i < r->np && r->p[i].ptr == ptr ? &r->p[i] : NULL;
}

size_t hm__vmm_rec_map_at(const hm_vmm_rec_t *r, uintptr_t addr) {
    size_t i = map_upper(r, addr);
    if (i == 0) return SIZE_MAX;
    const hm_vmm_map_t *m = &r->m[i - 1];
    return addr - m->base < m->len ? i - 1 : SIZE_MAX;
}

bool hm__vmm_rec_split(hm_vmm_rec_t *r, hm_vmm_piece_t *piece, size_t first) {
    hm_vmm_piece_t rest = {piece->ptr + first, piece->len - first};
    size_t i = (size_t)(piece - r->p);
    if (!hm__cuda_grow((void **)&r->p, r->np, &r->pcap, sizeof(*r->p))) return false;
    r->p[i].len = first; /* piece may have moved with the array */
    memmove(&r->p[i + 2], &r->p[i + 1], (r->np - i - 1) * sizeof(*r->p));
    r->p[i + 1] = rest;
    r->np++;
    return true;
}

void hm__vmm_rec_merge(hm_vmm_rec_t *r, hm_vmm_piece_t *lo) {
    size_t i = (size_t)(lo - r->p);
    r->p[i].len += r->p[i + 1].len;
    piece_remove(r, i + 1);
}

size_t hm__vmm_rec_span(const hm_vmm_rec_t *r, const hm_vmm_piece_t *piece, size_t *first) {
    size_t i = hm__vmm_rec_map_at(r, piece->ptr);
    if (i == SIZE_MAX) {
        *first = 0;
        return 0;
    }
    *first = i;
    size_t n = 0;
    while (i + n < r->nm && r->m[i + n].base < piece->ptr + piece->len) n++;
    return n;
}

void hm__vmm_rec_free(hm_vmm_rec_t *r, hm_vmm_piece_t *piece) {
    size_t first, n = hm__vmm_rec_span(r, piece, &first);
    for (size_t k = first; k < first + n; k++) r->m[k].live -= hm__vmm_rec_overlap(&r->m[k], piece);
    piece_remove(r, (size_t)(piece - r->p));
}

void hm__vmm_rec_drop(hm_vmm_rec_t *r, size_t i) {
    memmove(&r->m[i], &r->m[i + 1], (r->nm - i - 1) * sizeof(*r->m));
    r->nm--;
}

void hm__vmm_rec_fini(hm_vmm_rec_t *r) {
    free(r->m);
    free(r->p);
    memset(r, 0, sizeof(*r));
}
