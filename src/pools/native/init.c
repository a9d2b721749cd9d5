/* hetmem — the native pool: pool init and fini (resolve_params, nv_init,
 * nv_fini).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Init and fini                                                            */

HM_RUN static hm_result_t resolve_params(nv_pool_t *nv, hm_provider_t *prov,
                                  const hm_native_params_t *p) {
    hm_native_params_t dflt = {.magic = NV_PARAMS_MAGIC, .batch = NV_BATCH_CAP};
    if (!p) p = &dflt;
    if (p->magic != NV_PARAMS_MAGIC) {
        HM_LOG_ERROR("native pool: params is not a hm_native_params_t");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    uint32_t caps = hm_provider_caps(prov);
    size_t page = hm_provider_min_page_size(prov);
    if (!page) page = 1;
    if (!hm_is_pow2(page)) {
        HM_LOG_ERROR("native pool: provider '%s' page size %zu is not a power of two",
                     hm_provider_name(prov), page);
        return HM_ERROR_NOT_SUPPORTED;
    }
    hm_native_defaults_t d = p->defaults;
    if (d == HM_NATIVE_DEFAULTS_AUTO)
        d = (hm_provider_memory_kind(prov) == HM_MEMORY_DEVICE ||
             !(caps & HM_PROVIDER_CAP_CPU_ACCESS))
                ? HM_NATIVE_DEFAULTS_DEVICE
                : HM_NATIVE_DEFAULTS_HOST;
    int dev = d == HM_NATIVE_DEFAULTS_DEVICE;
    /* Host: 64 KiB slabs. Device: the provider's recommended page (its
     * mapping granularity, e.g. 2 MiB on GPUs), at least 64 KiB. */
    size_t slab = (size_t)64 << 10;
    if (p->set & SET_SLAB) {
        slab = p->slab_size;
        if (slab < page) {
            HM_LOG_ERROR("native pool: slab size %zu is below provider '%s' page size %zu", slab,
                         hm_provider_name(prov), page);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    } else {
        if (slab < page) slab = page;
        size_t rec = hm_provider_recommended_page_size(prov);
        if (dev && hm_is_pow2(rec) && rec > slab && rec <= NV_SLAB_MAX) slab = rec;
    }
    if (slab > NV_SLAB_MAX) {
        HM_LOG_ERROR("native pool: slab size %zu exceeds 64 MiB", slab);
        return HM_ERROR_NOT_SUPPORTED;
    }
    size_t limit = (size_t)32 << 10;
    if (dev && slab / 8 > limit) limit = slab / 8 < NV_CLASS_LIMIT_MAX ? slab / 8 : NV_CLASS_LIMIT_MAX;
    if (p->set & SET_LIMIT) limit = p->class_limit;
    nv->ncls = cls_of(limit) + 1;
    nv->class_limit = hm__nv_cls_size[nv->ncls - 1];
    nv->fast_limit = nv->class_limit < NV_FAST_MAX ? nv->class_limit : NV_FAST_MAX;
    size_t large = (p->set & SET_LARGE) ? p->large_threshold
                                        : dev ? ((size_t)256 << 20) : ((size_t)32 << 20);
    if (large < nv->class_limit) {
        HM_LOG_ERROR("native pool: large threshold %zu is below the size-class limit %zu", large,
                     nv->class_limit);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    nv->page = page;
    nv->slab_size = slab;
    nv->shift = (unsigned)__builtin_ctzll(slab);
    nv->large_threshold = large;
    nv->retained_max = (p->set & SET_RETAINED) ? p->retained
                                                : dev ? ((size_t)64 << 20) : ((size_t)8 << 20);
    nv->queue = p->queue;
    nv->batch_cap = p->batch ? p->batch : NV_BATCH_CAP;
    nv->can_free = caps & HM_PROVIDER_CAP_FREE;
    nv->can_purge_lazy = caps & HM_PROVIDER_CAP_PURGE_LAZY;
    nv->can_purge_force = caps & HM_PROVIDER_CAP_PURGE_FORCE;
    hm_memory_kind_t kind = hm_provider_memory_kind(prov);
    nv->prefetch = (caps & HM_PROVIDER_CAP_CPU_ACCESS) &&
                   (kind == HM_MEMORY_HOST || kind == HM_MEMORY_HOST_PINNED);
    for (unsigned c = 0; c < nv->ncls; c++) {
        size_t want = (size_t)hm__nv_cls_size[c] * NV_MIN_BLOCKS;
        nv->cls_span[c] = want <= slab ? slab : hm_align_up(want, slab);
    }
    return HM_SUCCESS;
}

/* What init makes before any slab or heap: the page map, the metadata
 * mappings, the locks and the pool state itself. */
static void nv_free_bare(nv_pool_t *nv) {
    map_fini(nv);
    meta_fini(nv);
    pthread_mutex_destroy(&nv->lock);
    pthread_mutex_destroy(&nv->large_lock);
    pthread_mutex_destroy(&nv->depot_lock);
    pthread_mutex_destroy(&nv->orphan_lock);
    free(nv);
}

static void nv_fini(void *state) {
    nv_pool_t *nv = state;
    hm__mutex_lock(&g_lock);
    for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
        if (h->binding) atomic_store_explicit(&h->binding->heap, NULL, memory_order_release);
        h->binding = NULL;
    }
    for (nv_pool_t **pp = &g_pools; *pp; pp = &(*pp)->g_next) {
        if (*pp == nv) {
            *pp = nv->g_next;
            break;
        }
    }
    hm__mutex_unlock(&g_lock);
    if (tl.id == nv->id) {
        tl.id = 0;
        tl.heap = NULL;
        tl.fast = NULL;
    }

    hm_pool_stats_t st;
    nv_get_stats(nv, &st);
    if (st.bytes_requested)
        HM_LOG_WARN("native pool destroyed with %zu bytes still allocated; %s",
                    st.bytes_requested,
                    nv->can_free ? "returned to the provider" : "kept by the provider");
    /* Heaps and batches (queued, stocked or in the depot) go with the
     * metadata mappings (meta_fini, last). */
    for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
        pthread_mutex_destroy(&h->mq_lock);
        (void)hm__prim_unmap(h->stk_map, stk_map_size(nv));
    }
    if (!nv->orphan_ready) (void)hm__prim_unmap(nv->orphan_stk, stk_map_size(nv));
    for (nv_slab_t *s = nv->all_slabs, *n; s; s = n) {
        n = s->all_next;
        if (nv->can_free) hm_pool_provider_free(nv->pool, (void *)s->base, s->span);
        free(s);
    }
    if (nv->can_free) {
        for (size_t i = 0; i < nv->live.cap; i++)
            if (nv->live.e[i].base)
                hm_pool_provider_free(nv->pool, (void *)nv->live.e[i].base, nv->live.e[i].size);
        for (size_t i = 0; i < nv->lcache_len; i++)
            hm_pool_provider_free(nv->pool, (void *)nv->lcache[i].base, nv->lcache[i].size);
    }
    free(nv->live.e);
    free(nv->lcache);
    nv_free_bare(nv);
}

HM_RUN static hm_result_t nv_init(hm_pool_t *pool, const void *params, void **state) {
    pthread_once(&g_once, global_init);
    hm_provider_t *prov = hm_pool_get_provider(pool);
    nv_pool_t *nv = aligned_alloc(HM_CACHE_LINE, hm_align_up(sizeof(*nv), HM_CACHE_LINE));
    if (!nv) return HM_ERROR_OUT_OF_HOST_MEMORY;
    memset(nv, 0, sizeof(*nv));
    nv->pool = pool;
    for (unsigned i = 0; i < NV_BY_TP; i++) atomic_init(&nv->by_tp[i], &by_tp_nobody);
    atomic_init(&nv->own, &by_tp_nobody);
    hm_result_t r = resolve_params(nv, prov, params);
    if (r != HM_SUCCESS) {
        free(nv);
        return r;
    }
    nv->id = atomic_fetch_add_explicit(&g_next_id, 1, memory_order_relaxed);
    pthread_mutex_init(&nv->lock, NULL);
    pthread_mutex_init(&nv->large_lock, NULL);
    pthread_mutex_init(&nv->depot_lock, NULL);
    pthread_mutex_init(&nv->orphan_lock, NULL);
    if (map_init(nv) != HM_SUCCESS || !(nv->orphan = heap_carve(nv, META_TOP, &nv->orphan_stk))) {
        nv_free_bare(nv);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    hm__mutex_lock(&g_lock);
    nv->g_next = g_pools;
    g_pools = nv;
    hm__mutex_unlock(&g_lock);
    HM_LOG_DEBUG("native pool over '%s': slab %zu, classes up to %zu, large threshold %zu, "
                 "retained %zu, %s queue, batch %u",
                 hm_provider_name(prov), nv->slab_size, nv->class_limit, nv->large_threshold,
                 nv->retained_max, nv->queue == HM_NATIVE_QUEUE_WFCQ ? "wfcq" : "mutex",
                 nv->batch_cap);
    *state = nv;
    hm__pool_set_entries(pool, nv_malloc_entry, nv->prefetch ? nv_free_entry_host : nv_free_entry);
    return HM_SUCCESS;
}
