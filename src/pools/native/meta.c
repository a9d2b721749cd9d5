/* hetmem — the native pool: the metadata mappings (heaps and remote-free
 * batches).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Pool metadata: heaps and remote-free batches (nv_pool.meta)              */

/* Metadata mappings (heads: nv_meta_t); heaps are carved
 * upwards from a mapping's start, each but its first from a page boundary
 * (NV_META_ALIGN), and batches (and the orphan heap, page-aligned)
 * downwards from its end, so that a heap's busy lines (its partial heads,
 * header and first classes: heap_carve) share a page with no other heap's
 * and the batches share pages with each other: two threads' heaps and
 * their batches back three pages (six when heaps and batches were carved
 * in turn; the orphan heap, untouched until used, is on pages of its own). */
enum { META_HEAP, META_BATCH, META_TOP };

HM_RUN static void *meta_carve(nv_pool_t *nv, size_t size, int kind) {
    if (!nv->meta) return NULL;
    uintptr_t at;
    if (kind == META_HEAP) {
        at = nv->meta_next == nv->meta_first
                 ? nv->meta_first
                 : hm_align_up(nv->meta_next, (uintptr_t)NV_META_ALIGN);
        if (at > nv->meta_end || nv->meta_end - at < size) return NULL;
        nv->meta_next = at + size;
        return (void *)at;
    }
    if (nv->meta_end - nv->meta_next < size) return NULL;
    at = nv->meta_end - size;
    if (kind == META_TOP) at &= ~(uintptr_t)(NV_META_ALIGN - 1);
    if (at < nv->meta_next) return NULL;
    nv->meta_end = at;
    return (void *)at;
}

/* size bytes of zeroed host memory, whole cache lines, that live until
 * nv_fini (depot_lock held), of a kind above; NULL: out of host memory
 * (logged by the mapping). */
HM_RUN static void *meta_alloc(nv_pool_t *nv, size_t size, int kind) {
    size = hm_align_up(size, HM_CACHE_LINE);
    void *p = meta_carve(nv, size, kind);
    if (p) return p;
    /* A later mapping's head: its last line, on the page of its first
     * batches (its first page is its first heap's). */
    size_t head = nv->meta ? sizeof(nv_meta_t) : 0;
    size_t len = hm_align_up(head + size + NV_META_ALIGN, NV_META_CHUNK);
    if (hm__prim_map(len, 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, HM_PRIM_MAP_NORESERVE, -1,
                     0, &p) != HM_SUCCESS)
        return NULL;
    nv_meta_t *m = head ? (nv_meta_t *)((char *)p + len - head) : &nv->meta0;
    m->next = nv->meta;
    m->base = (uintptr_t)p;
    m->size = len;
    nv->meta = m;
    nv->meta_first = nv->meta_next = (uintptr_t)p;
    nv->meta_end = (uintptr_t)p + len - head;
    return meta_carve(nv, size, kind);
}

/* Unmap the metadata (no heap or batch is used any more). */
static void meta_fini(nv_pool_t *nv) {
    for (nv_meta_t *m = nv->meta, *next; m; m = next) {
        next = m->next; /* before the unmap: m may be the mapping's */
        (void)hm__prim_unmap((void *)m->base, m->size);
    }
    nv->meta = NULL;
    nv->meta_first = nv->meta_next = nv->meta_end = 0;
}
