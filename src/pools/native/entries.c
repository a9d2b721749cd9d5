/* hetmem — the native pool: the front end's entries (hm_pool.malloc_entry,
 * free_entry), usable size, ownership and the range walk.
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ---- The front end's entries (hm_pool.malloc_entry, free_entry) ----
 * hm_pool_malloc and hm_pool_free tail-call these with the pool (not NULL),
 * so that no test of theirs and no second indirect call stands between the
 * caller and the fast paths: the entries test what the front end would
 * (size 0, ptr NULL) on paths they take anyway. */

/* nv_malloc_entry past its fast path: size 0 (EINVAL, as hm_pool_malloc's
 * generic entries), a size beyond fast_limit, no heap found by thread
 * pointer, or a refill. */
HM_RUN static HM_NOINLINE void *malloc_entry_slow(nv_pool_t *nv, size_t size) {
    if (hm_unlikely(!size)) {
        errno = hm__result_errno(HM_ERROR_INVALID_ARGUMENT);
        return NULL;
    }
    return nv_malloc_fast(nv, size);
}

HM_RUN static void *nv_malloc_entry(hm_pool_t *pool, size_t size) {
    nv_pool_t *nv = pool->state;
    /* size - 1 wraps for 0, which takes the slow path. */
    if (hm_unlikely(size - 1 >= nv->fast_limit)) return malloc_entry_slow(nv, size);
    uintptr_t tp = thread_tp();
    nv_heap_t *h = heap_own(nv);
    if (hm_unlikely(!heap_is_mine(h, tp))) {
        h = heap_by_tp(nv, tp);
        if (hm_unlikely(!heap_is_mine(h, tp))) return malloc_entry_slow(nv, size);
    }
    /* hm__nv_cls_at8[(size + 7) >> 3], from size - 1 as the test above
     * has it (size >= 1). */
    nv_cls_t *cl = (nv_cls_t *)((char *)h + (hm__nv_cls_at8 + 1)[(size - 1) >> 3]);
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return (void *)alloc_word(h, cl, b);
    uintptr_t p = alloc_pop(cl);
    if (hm_likely(p)) return (void *)p;
    return malloc_fast_refill(h, cl);
}

/* Host memory (nv_pool.prefetch): a stacked block is prefetched. */
HM_RUN static hm_result_t nv_free_entry_host(hm_pool_t *pool, void *p) {
    return free_impl(pool->state, p, NV_FREE_OP, NULL, NV_PF_HOST);
}
/* Any other memory: never prefetched. */
HM_RUN static hm_result_t nv_free_entry(hm_pool_t *pool, void *p) {
    return free_impl(pool->state, p, NV_FREE_OP, NULL, NV_PF_NEVER);
}

HM_RUN static size_t nv_usable_size(void *state, const void *p) {
    nv_pool_t *nv = state;
    nv_slab_t *s = map_get(nv, p);
    uint32_t idx;
    if (s) return block_index(s, p, &idx) ? s->bsize : 0;
    hm__mutex_lock(&nv->large_lock);
    nv_lentry_t *e = lmap_find(&nv->live, (uintptr_t)p);
    size_t size = e ? e->size : 0;
    hm__mutex_unlock(&nv->large_lock);
    return size;
}

HM_RUN int hm__native_owns(void *state, const void *p) {
    nv_pool_t *nv = state;
    nv_slab_t *s = map_get(nv, p);
    uint32_t idx;
    if (s) return block_index(s, p, &idx);
    hm__mutex_lock(&nv->large_lock);
    int found = lmap_find(&nv->live, (uintptr_t)p) != NULL;
    hm__mutex_unlock(&nv->large_lock);
    return found;
}

void hm__native_for_each_range(void *state, void (*fn)(void *arg, uintptr_t base, size_t size),
                               void *arg) {
    nv_pool_t *nv = state;
    hm__mutex_lock(&nv->lock);
    hm__mutex_lock(&nv->large_lock);
    hm__native_for_each_range_locked(state, fn, arg);
    hm__mutex_unlock(&nv->large_lock);
    hm__mutex_unlock(&nv->lock);
}

void hm__native_for_each_range_locked(void *state,
                                      void (*fn)(void *arg, uintptr_t base, size_t size),
                                      void *arg) {
    nv_pool_t *nv = state;
    for (nv_slab_t *s = nv->all_slabs; s; s = s->all_next) fn(arg, s->base, s->span);
    for (size_t i = 0; i < nv->live.cap; i++)
        if (nv->live.e[i].base) fn(arg, nv->live.e[i].base, nv->live.e[i].size);
    for (size_t i = 0; i < nv->lcache_len; i++) fn(arg, nv->lcache[i].base, nv->lcache[i].size);
}
