/* hetmem — the native pool: large allocations (the live map, the cache of
 * freed ranges).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Large allocations: live map (address -> size) and the cache of freed     */
/* ranges, under large_lock.                                                */

HM_RUN static size_t lmap_slot(uintptr_t k, size_t cap) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull; /* Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4) */
    return (size_t)(k >> 17) & (cap - 1);
}

HM_RUN static int lmap_grow(nv_lmap_t *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    nv_lentry_t *ne = calloc(ncap, sizeof(*ne));
    if (!ne) return 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].base) continue;
        size_t j = lmap_slot(m->e[i].base, ncap);
        while (ne[j].base) j = (j + 1) & (ncap - 1);
        ne[j] = m->e[i];
    }
    free(m->e);
    m->e = ne;
    m->cap = ncap;
    return 1;
}

HM_RUN static int lmap_put(nv_lmap_t *m, uintptr_t base, size_t size) {
    if ((m->count + 1) * 2 > m->cap && !lmap_grow(m)) return 0;
    size_t j = lmap_slot(base, m->cap);
    while (m->e[j].base) j = (j + 1) & (m->cap - 1);
    m->e[j].base = base;
    m->e[j].size = size;
    m->count++;
    return 1;
}

HM_RUN static nv_lentry_t *lmap_find(nv_lmap_t *m, uintptr_t base) {
    if (!m->cap) return NULL;
    for (size_t j = lmap_slot(base, m->cap); m->e[j].base; j = (j + 1) & (m->cap - 1))
        if (m->e[j].base == base) return &m->e[j];
    return NULL;
}

/* Remove base; its size, or 0. Linear probing with backward-shift deletion
 * (Knuth, TAOCP vol. 3, 6.4, Algorithm R): no tombstones. */
HM_RUN static size_t lmap_take(nv_lmap_t *m, uintptr_t base) {
    nv_lentry_t *e = lmap_find(m, base);
    if (!e) return 0;
    size_t size = e->size, i = (size_t)(e - m->e), mask = m->cap - 1;
    for (size_t j = (i + 1) & mask; m->e[j].base; j = (j + 1) & mask) {
        size_t h = lmap_slot(m->e[j].base, m->cap);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            m->e[i] = m->e[j];
            i = j;
        }
    }
    m->e[i].base = 0;
    m->e[i].size = 0;
    m->count--;
    return size;
}

/* Bytes kept (retained slabs + cached large ranges) may grow by n? */
HM_RUN static int kept_fits(nv_pool_t *nv, size_t n) {
    size_t kept = atomic_load_explicit(&nv->kept, memory_order_relaxed);
    return nv->retained_max == SIZE_MAX || (kept <= nv->retained_max && n <= nv->retained_max - kept);
}

HM_RUN static void purge_range(nv_pool_t *nv, uintptr_t base, size_t size) {
    if (nv->can_purge_force || nv->can_purge_lazy)
        hm_pool_provider_purge(nv->pool, (void *)base, size, nv->can_purge_force);
}

/* Provider memory [p, +size) that provider_take refuses: given back. */
static HM_NOINLINE hm_result_t refuse_range(nv_pool_t *nv, void *p, size_t size) {
    if (!p) { /* a provider bug; 0 also marks "none" in the pool (nv_heap.r_key) */
        HM_LOG_ERROR("native pool: the provider returned address 0 for %zu bytes", size);
        return HM_ERROR_NOT_SUPPORTED;
    }
    HM_LOG_ERROR("native pool: provider memory [%p, +%zu) reaches beyond the %d-bit addresses "
                 "its page map covers; refused", p, size, HM_NATIVE_ADDR_BITS);
    if (hm_pool_provider_free(nv->pool, p, size) != HM_SUCCESS)
        HM_LOG_WARN("native pool: the provider cannot take [%p, +%zu) back; it stays unused "
                    "until the pool is destroyed", p, size);
    return HM_ERROR_NOT_SUPPORTED;
}

/* Memory from the provider, for a slab or a large block: [*out, +size),
 * below 2^HM_NATIVE_ADDR_BITS (addr_width.h), which the page map covers
 * (map_init). A range that reaches beyond would index past the map's root
 * (map_set), so it goes back to the provider and the call fails; large
 * blocks, kept in lmap rather than the map, are refused alike, so that what
 * the pool accepts does not depend on the size. */
HM_INLINE hm_result_t provider_take(nv_pool_t *nv, size_t size, size_t align, void **out) {
    void *p = NULL;
    hm_result_t r = hm_pool_provider_alloc(nv->pool, size, align, &p);
    if (r != HM_SUCCESS) return r;
    if (hm_unlikely(!p || !hm__range_below((uintptr_t)p, size, HM_NATIVE_ADDR_BITS)))
        return refuse_range(nv, p, size);
    *out = p;
    return HM_SUCCESS;
}

HM_RUN static hm_result_t large_alloc(nv_pool_t *nv, size_t size, size_t align, void **out) {
    size_t rsize = size <= nv->large_threshold ? scale_round(size) : size;
    if (rsize) rsize = hm_align_up(rsize, nv->page);
    if (!rsize) return HM_ERROR_OUT_OF_MEMORY;
    size_t a = align > nv->page ? align : nv->page;
    uintptr_t base = 0;
    size_t got = rsize;
    if (rsize <= nv->large_threshold || !nv->can_free) {
        hm__mutex_lock(&nv->large_lock);
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < nv->lcache_len; i++) {
            nv_lentry_t *e = &nv->lcache[i];
            if (e->size < rsize || (e->base & (a - 1))) continue;
            /* Exact fit for providers that free; the smallest fit otherwise. */
            if (nv->can_free && e->size != rsize) continue;
            if (best == SIZE_MAX || e->size < nv->lcache[best].size) best = i;
            if (e->size == rsize) break;
        }
        if (best != SIZE_MAX) {
            base = nv->lcache[best].base;
            got = nv->lcache[best].size;
            nv->lcache[best] = nv->lcache[--nv->lcache_len];
            atomic_fetch_sub_explicit(&nv->kept, got, memory_order_relaxed);
        }
        hm__mutex_unlock(&nv->large_lock);
    }
    if (!base) {
        void *p = NULL;
        hm_result_t r = provider_take(nv, rsize, align > nv->page ? align : 0, &p);
        if (r != HM_SUCCESS) return r;
        base = (uintptr_t)p;
        atomic_fetch_add_explicit(&nv->held, rsize, memory_order_relaxed);
        atomic_fetch_add_explicit(&nv->nranges, 1, memory_order_relaxed);
    }
    hm__mutex_lock(&nv->large_lock);
    int ok = lmap_put(&nv->live, base, got);
    hm__mutex_unlock(&nv->large_lock);
    if (!ok) {
        if (nv->can_free && hm_pool_provider_free(nv->pool, (void *)base, got) == HM_SUCCESS) {
            atomic_fetch_sub_explicit(&nv->held, got, memory_order_relaxed);
            atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
        } else {
            HM_LOG_WARN("native pool: out of host memory; %zu bytes at %p lost for reuse", got,
                        (void *)base);
        }
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    atomic_fetch_add_explicit(&nv->large_live, got, memory_order_relaxed);
    *out = (void *)base;
    return HM_SUCCESS;
}

/* Keep [base, +size) in the cache (large_lock held). 0: no room. */
HM_RUN static int lcache_push(nv_pool_t *nv, uintptr_t base, size_t size) {
    if (nv->lcache_len == nv->lcache_cap) {
        size_t ncap = nv->lcache_cap ? nv->lcache_cap * 2 : 16;
        nv_lentry_t *n = realloc(nv->lcache, ncap * sizeof(*n));
        if (!n) return 0;
        nv->lcache = n;
        nv->lcache_cap = ncap;
    }
    nv->lcache[nv->lcache_len].base = base;
    nv->lcache[nv->lcache_len].size = size;
    nv->lcache_len++;
    atomic_fetch_add_explicit(&nv->kept, size, memory_order_relaxed);
    return 1;
}

HM_RUN static hm_result_t large_free(nv_pool_t *nv, void *p) {
    hm__mutex_lock(&nv->large_lock);
    size_t size = lmap_take(&nv->live, (uintptr_t)p);
    if (!size) {
        hm__mutex_unlock(&nv->large_lock);
        return HM_ERROR_NOT_FOUND;
    }
    atomic_fetch_sub_explicit(&nv->large_live, size, memory_order_relaxed);
    if (!nv->can_free || (size <= nv->large_threshold && kept_fits(nv, size))) {
        int ok = lcache_push(nv, (uintptr_t)p, size);
        hm__mutex_unlock(&nv->large_lock);
        if (ok) return HM_SUCCESS;
        if (!nv->can_free) {
            HM_LOG_WARN("native pool: out of host memory; %zu bytes at %p lost for reuse", size,
                        p);
            return HM_SUCCESS;
        }
    } else {
        hm__mutex_unlock(&nv->large_lock);
    }
    hm_result_t r = hm_pool_provider_free(nv->pool, p, size);
    if (r != HM_SUCCESS) { /* keep it rather than lose it */
        hm__mutex_lock(&nv->large_lock);
        if (!lcache_push(nv, (uintptr_t)p, size))
            HM_LOG_WARN("native pool: %zu bytes at %p lost for reuse", size, p);
        hm__mutex_unlock(&nv->large_lock);
        return HM_SUCCESS;
    }
    atomic_fetch_sub_explicit(&nv->held, size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
    return HM_SUCCESS;
}
