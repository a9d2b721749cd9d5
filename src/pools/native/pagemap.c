/* hetmem — the native pool: the page map (address >> slab shift -> slab
 * descriptor).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Page map: address >> shift -> slab descriptor                            */

/* Page-map tables (root and leaves, 512 KiB each with 64 KiB slabs) come
 * straight from mmap: zero pages that the kernel backs only where a slot is
 * written, whatever malloc the process runs on (tcmalloc, for one, memsets
 * a large calloc: 1 MiB of RSS per pool before any allocation). */
HM_RUN static void *map_table(size_t n) {
    void *p;
    return hm__prim_map(n * sizeof(uintptr_t), 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                        HM_PRIM_MAP_NORESERVE, -1, 0, &p) == HM_SUCCESS
               ? p
               : NULL;
}

static void map_table_free(void *t, size_t n) {
    if (t) (void)hm__prim_unmap(t, n * sizeof(uintptr_t));
}

HM_RUN static hm_result_t map_init(nv_pool_t *nv) {
    unsigned bits = NV_ADDR_BITS - nv->shift;
    nv->leaf_bits = bits / 2;
    nv->root_shift = nv->shift + nv->leaf_bits;
    nv->leaf_mask = ((size_t)1 << nv->leaf_bits) - 1;
    nv->root_len = (size_t)1 << (bits - nv->leaf_bits);
    nv->root = map_table(nv->root_len);
    atomic_init(&nv->hint_leaf, NULL);
    atomic_init(&nv->hint_first, (size_t)1 << 63);
    nv->leaf_len = (size_t)1 << nv->leaf_bits;
    return nv->root ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
}

static void map_fini(nv_pool_t *nv) {
    if (!nv->root) return;
    for (size_t i = 0; i < nv->root_len; i++)
        map_table_free((void *)atomic_load_explicit(&nv->root[i], memory_order_relaxed),
                       nv->leaf_len);
    map_table_free((void *)nv->root, nv->root_len);
    map_table_free((void *)atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed),
                   nv->leaf_len);
}

/* The leaf of root index ri, NULL if none is installed (or none visible to
 * the caller yet: map_set then rechecks under the lock). The first leaf is
 * in the hint only (nv_pool.hint_first), never in the root, so that a pool
 * whose slabs all lie in one leaf's span touches no page of the root. */
HM_RUN static _Atomic uintptr_t *map_leaf(nv_pool_t *nv, size_t ri) {
    if (atomic_load_explicit(&nv->hint_first, memory_order_acquire) == ri << nv->leaf_bits)
        return atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed);
    return (_Atomic uintptr_t *)atomic_load_explicit(&nv->root[ri], memory_order_acquire);
}

/* Install the leaf of root index ri (none was visible); NULL: out of host
 * memory. Under the pool lock: installs are rare (one per leaf span, 4 GiB
 * with 64 KiB slabs), and the lock orders the hint's two fields for the
 * writers (readers: see map_get). */
HM_RUN static HM_NOINLINE _Atomic uintptr_t *map_leaf_install(nv_pool_t *nv, size_t ri) {
    hm__mutex_lock(&nv->lock);
    _Atomic uintptr_t *leaf = map_leaf(nv, ri);
    if (!leaf && (leaf = map_table(nv->leaf_len))) {
        if (!atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed)) {
            /* hint_leaf before hint_first (release): a reader that takes
             * the hint (map_get, map_leaf) sees the leaf. */
            atomic_store_explicit(&nv->hint_leaf, leaf, memory_order_relaxed);
            atomic_store_explicit(&nv->hint_first, ri << nv->leaf_bits, memory_order_release);
        } else {
            atomic_store_explicit(&nv->root[ri], (uintptr_t)leaf, memory_order_release);
        }
    }
    hm__mutex_unlock(&nv->lock);
    return leaf;
}

/* Point every unit of [base, base+span) at s (NULL to clear). 0: out of
 * host memory for a leaf (nothing changed for the units not reached).
 * Called without the pool lock (it takes it to install a leaf). */
HM_RUN static int map_set(nv_pool_t *nv, uintptr_t base, size_t span, nv_slab_t *s) {
    for (uintptr_t k = base >> nv->shift, end = (base + span) >> nv->shift; k < end; k++) {
        size_t ri = k >> nv->leaf_bits;
        _Atomic uintptr_t *leaf = map_leaf(nv, ri);
        if (!leaf) {
            if (!s) continue;
            if (!(leaf = map_leaf_install(nv, ri))) return 0;
        }
        atomic_store_explicit(&leaf[k & nv->leaf_mask], (uintptr_t)s, memory_order_release);
    }
    return 1;
}
