/* hetmem — the native pool: trim and statistics (nv_trim, nv_get_stats).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Trim and statistics                                                      */

/* Give back what heap h (owned by the caller) holds without need. */
static void heap_tidy(nv_heap_t *h) {
    heap_forget_last(h);
    flush_all(h);
    drain(h);
    for (unsigned c = 0; c < h->nv->ncls; c++) cls_retire_cur(h, &h->cls[c]);
}

static hm_result_t nv_trim(void *state) {
    nv_pool_t *nv = state;
    if (!tl.dead && tl.id == nv->id) heap_tidy(tl.heap);
    /* Heaps whose thread exited: take them off the list while tidying. */
    hm__mutex_lock(&nv->lock);
    nv_heap_t *ab = nv->abandoned;
    nv->abandoned = NULL;
    hm__mutex_unlock(&nv->lock);
    nv_heap_t *last = NULL;
    for (nv_heap_t *h = ab; h; h = h->aband_next) {
        heap_tidy(h);
        last = h;
    }
    hm__mutex_lock(&nv->orphan_lock);
    if (nv->orphan_ready) heap_tidy(nv->orphan);
    hm__mutex_unlock(&nv->orphan_lock);
    hm__mutex_lock(&nv->lock);
    if (last) {
        last->aband_next = nv->abandoned;
        nv->abandoned = ab;
    }
    nv_slab_t *ret = nv->retained;
    nv->retained = NULL;
    if (nv->can_free) { /* unlink them all from the all-slabs list */
        for (nv_slab_t *s = ret; s; s = s->next) {
            if (s->all_prev) s->all_prev->all_next = s->all_next;
            else nv->all_slabs = s->all_next;
            if (s->all_next) s->all_next->all_prev = s->all_prev;
            atomic_fetch_sub_explicit(&nv->kept, s->span, memory_order_relaxed);
        }
    }
    hm__mutex_unlock(&nv->lock);
    hm_result_t result = HM_SUCCESS;
    if (nv->can_free) {
        nv_slab_t *keep = NULL;
        for (nv_slab_t *s = ret, *next; s; s = next) {
            next = s->next;
            if (hm_pool_provider_free(nv->pool, (void *)s->base, s->span) == HM_SUCCESS) {
                atomic_fetch_sub_explicit(&nv->held, s->span, memory_order_relaxed);
                atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
                atomic_fetch_sub_explicit(&nv->nslabs, 1, memory_order_relaxed);
                free(s);
            } else {
                s->next = keep;
                keep = s;
                result = HM_ERROR_DRIVER;
            }
        }
        hm__mutex_lock(&nv->lock);
        for (nv_slab_t *s = keep, *next; s; s = next) {
            next = s->next;
            s->all_prev = NULL;
            s->all_next = nv->all_slabs;
            if (nv->all_slabs) nv->all_slabs->all_prev = s;
            nv->all_slabs = s;
            s->next = nv->retained;
            nv->retained = s;
            atomic_fetch_add_explicit(&nv->kept, s->span, memory_order_relaxed);
        }
        hm__mutex_unlock(&nv->lock);
    } else {
        /* Cannot free: purge (the provider's own choice of force or lazy). */
        for (nv_slab_t *s = ret; s; s = s->next) {
            purge_range(nv, s->base, s->span);
            s->hw = 0; /* no word is backed now */
        }
        hm__mutex_lock(&nv->lock);
        if (ret) {
            nv_slab_t *tail = ret;
            while (tail->next) tail = tail->next;
            tail->next = nv->retained;
            nv->retained = ret;
        }
        hm__mutex_unlock(&nv->lock);
    }
    /* The large cache. */
    hm__mutex_lock(&nv->large_lock);
    nv_lentry_t *cache = nv->lcache;
    size_t n = nv->lcache_len;
    if (nv->can_free) {
        nv->lcache = NULL;
        nv->lcache_len = nv->lcache_cap = 0;
        for (size_t i = 0; i < n; i++)
            atomic_fetch_sub_explicit(&nv->kept, cache[i].size, memory_order_relaxed);
    } else {
        for (size_t i = 0; i < n; i++) purge_range(nv, cache[i].base, cache[i].size);
    }
    hm__mutex_unlock(&nv->large_lock);
    if (nv->can_free) {
        for (size_t i = 0; i < n; i++) {
            if (hm_pool_provider_free(nv->pool, (void *)cache[i].base, cache[i].size) ==
                HM_SUCCESS) {
                atomic_fetch_sub_explicit(&nv->held, cache[i].size, memory_order_relaxed);
                atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
            } else {
                hm__mutex_lock(&nv->large_lock);
                lcache_push(nv, cache[i].base, cache[i].size);
                hm__mutex_unlock(&nv->large_lock);
                result = HM_ERROR_DRIVER;
            }
        }
        free(cache);
    }
    return result;
}

static hm_result_t nv_get_stats(void *state, hm_pool_stats_t *st) {
    nv_pool_t *nv = state;
    int64_t bytes = 0;
    uint64_t pub = 0, drained = 0;
    hm__mutex_lock(&nv->lock);
    for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
        bytes += atomic_load_explicit(&h->st_bytes, memory_order_relaxed);
        /* Blocks in the heap's class words are free (nv_heap.st_bytes). */
        for (unsigned c = 0; c < nv->ncls; c++) {
            uint64_t b = cl_bits(&h->cls[c]);
            /* The class size from the table: the owner sets up cls[c].bsize
             * at its first refill of the class (nv_cls). */
            if (b) bytes -= (int64_t)popcount64(b) * hm__nv_cls_size[c];
            bytes -= (int64_t)stk_count(stk_top(&h->cls[c])) * hm__nv_cls_size[c]; /* free */
        }
        pub += atomic_load_explicit(&h->st_published, memory_order_relaxed);
        drained += atomic_load_explicit(&h->st_drained, memory_order_relaxed);
    }
    hm__mutex_unlock(&nv->lock);
    bytes += (int64_t)atomic_load_explicit(&nv->large_live, memory_order_relaxed);
    st->bytes_requested = bytes > 0 ? (size_t)bytes : 0;
    st->bytes_from_provider = atomic_load_explicit(&nv->held, memory_order_relaxed);
    st->provider_allocs = atomic_load_explicit(&nv->nranges, memory_order_relaxed);
    st->slabs = atomic_load_explicit(&nv->nslabs, memory_order_relaxed);
    st->remote_frees_published = pub;
    st->remote_frees_drained = drained;
    return HM_SUCCESS;
}
