/* hetmem — the proxy pool: each allocation is one provider allocation.
 * SPDX-License-Identifier: MIT
 *
 * Concurrency: one mutex per pool guards `live` (address -> size of every
 * allocation handed out) and `retained`; it is never held across a provider
 * call. The pool is meant for few, big buffers, so a lock is the right tool.
 *
 * Providers that cannot free: a freed range is kept in `retained` and reused
 * by a later allocation it fits (first fit), never given back. */
#include "internal.h"
#include "pool_internal.h"

#include <stdlib.h>
#include <string.h>

/* Open-addressing hash map uintptr_t -> size_t with linear probing and
 * backward-shift deletion (Knuth, TAOCP vol. 3, 6.4, Algorithm R), so no
 * tombstones accumulate. Key 0 marks an empty slot. */
typedef struct ptr_map {
    uintptr_t *keys;
    size_t *vals;
    size_t cap, count; /* cap is a power of two */
} ptr_map_t;

static size_t map_slot(uintptr_t k, size_t cap) {
    k ^= k >> 29;
    k *= 0xBF58476D1CE4E5B9ull; /* splitmix64 finaliser step (Steele et al. 2014) */
    k ^= k >> 32;
    return (size_t)k & (cap - 1);
}

static int map_grow(ptr_map_t *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uintptr_t *nk = calloc(ncap, sizeof(*nk));
    size_t *nv = calloc(ncap, sizeof(*nv));
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return 0;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = map_slot(m->keys[i], ncap);
        while (nk[j]) j = (j + 1) & (ncap - 1);
        nk[j] = m->keys[i];
        nv[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
    return 1;
}

static int map_put(ptr_map_t *m, uintptr_t k, size_t v) {
    if ((m->count + 1) * 2 > m->cap && !map_grow(m)) return 0;
    size_t j = map_slot(k, m->cap);
    while (m->keys[j]) j = (j + 1) & (m->cap - 1);
    m->keys[j] = k;
    m->vals[j] = v;
    m->count++;
    return 1;
}

static size_t *map_find(ptr_map_t *m, uintptr_t k) {
    if (!m->cap) return NULL;
    for (size_t j = map_slot(k, m->cap); m->keys[j]; j = (j + 1) & (m->cap - 1))
        if (m->keys[j] == k) return &m->vals[j];
    return NULL;
}

/* Remove k; returns its value, or 0 if absent. */
static size_t map_take(ptr_map_t *m, uintptr_t k) {
    size_t *vp = map_find(m, k);
    if (!vp) return 0;
    size_t v = *vp, i = (size_t)(vp - m->vals), mask = m->cap - 1;
    /* Backward-shift: move later members of the cluster into the hole when
     * their home slot does not lie cyclically in (i, j]. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t h = map_slot(m->keys[j], m->cap);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = 0;
    m->count--;
    return v;
}

typedef struct retained {
    uintptr_t base;
    size_t size;
    struct retained *next;
} retained_t;

typedef struct proxy {
    hm_pool_t *pool;
    size_t page;
    bool can_free;
    pthread_mutex_t lock;
    ptr_map_t live;       /* guarded by lock */
    retained_t *retained; /* guarded by lock; only when !can_free */
} proxy_t;

static hm_result_t proxy_init(hm_pool_t *pool, const void *params, void **state) {
    proxy_t *p = calloc(1, sizeof(*p));
    if (!p) return HM_ERROR_OUT_OF_HOST_MEMORY;
    hm_provider_t *prov = hm_pool_get_provider(pool);
    p->pool = pool;
    p->page = hm_provider_min_page_size(prov);
    if (!p->page) p->page = 1;
    p->can_free = hm_provider_caps(prov) & HM_PROVIDER_CAP_FREE;
    pthread_mutex_init(&p->lock, NULL);
    *state = p;
    return HM_SUCCESS;
}

static void proxy_fini(void *state) {
    proxy_t *p = state;
    size_t leaked = 0, bytes = 0;
    for (size_t i = 0; i < p->live.cap; i++) {
        if (!p->live.keys[i]) continue;
        leaked++;
        bytes += p->live.vals[i];
        if (p->can_free)
            hm_pool_provider_free(p->pool, (void *)p->live.keys[i], p->live.vals[i]);
    }
    if (leaked)
        HM_LOG_WARN("proxy pool destroyed with %zu live allocations (%zu bytes)%s", leaked, bytes,
                    p->can_free ? "; returned to the provider" : "");
    for (retained_t *r = p->retained, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    free(p->live.keys);
    free(p->live.vals);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* Take a retained range that fits, or NULL. */
static retained_t *take_retained(proxy_t *p, size_t size, size_t alignment) {
    for (retained_t **rp = &p->retained; *rp; rp = &(*rp)->next) {
        retained_t *r = *rp;
        if (r->size >= size && !(r->base & (alignment - 1))) {
            *rp = r->next;
            return r;
        }
    }
    return NULL;
}

static hm_result_t proxy_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    proxy_t *p = state;
    size_t sz = hm_align_up(size, p->page);
    if (!sz) return HM_ERROR_OUT_OF_MEMORY;
    size_t align = alignment > p->page ? alignment : 0;
    if (!p->can_free) {
        hm__mutex_lock(&p->lock);
        retained_t *r = take_retained(p, sz, align ? align : p->page);
        if (r && !map_put(&p->live, r->base, r->size)) {
            r->next = p->retained;
            p->retained = r;
            hm__mutex_unlock(&p->lock);
            return HM_ERROR_OUT_OF_HOST_MEMORY;
        }
        hm__mutex_unlock(&p->lock);
        if (r) {
            *ptr = (void *)r->base;
            free(r);
            return HM_SUCCESS;
        }
    }
    hm_result_t res = hm_pool_provider_alloc(p->pool, sz, align, ptr);
    if (res != HM_SUCCESS) return res;
    hm__mutex_lock(&p->lock);
    int ok = map_put(&p->live, (uintptr_t)*ptr, sz);
    hm__mutex_unlock(&p->lock);
    if (!ok) {
        if (p->can_free) hm_pool_provider_free(p->pool, *ptr, sz);
        *ptr = NULL;
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    return HM_SUCCESS;
}

static hm_result_t proxy_free(void *state, void *ptr) {
    proxy_t *p = state;
    retained_t *keep = p->can_free ? NULL : malloc(sizeof(*keep));
    hm__mutex_lock(&p->lock);
    size_t sz = map_take(&p->live, (uintptr_t)ptr);
    hm__mutex_unlock(&p->lock);
    if (!sz) {
        free(keep);
        HM_LOG_ERROR("proxy pool: free(%p): not an allocation of this pool (interior pointer, "
                     "foreign pointer or double free)", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->can_free) {
        hm_result_t r = hm_pool_provider_free(p->pool, ptr, sz);
        if (r != HM_SUCCESS) { /* still allocated: the user still owns it */
            hm__mutex_lock(&p->lock);
            map_put(&p->live, (uintptr_t)ptr, sz);
            hm__mutex_unlock(&p->lock);
        }
        return r;
    }
    if (!keep) { /* cannot remember it: the range stays with the pool, unused */
        HM_LOG_WARN("proxy pool: out of host memory; %zu bytes at %p will not be reused", sz, ptr);
        return HM_SUCCESS;
    }
    keep->base = (uintptr_t)ptr;
    keep->size = sz;
    hm__mutex_lock(&p->lock);
    keep->next = p->retained;
    p->retained = keep;
    hm__mutex_unlock(&p->lock);
    return HM_SUCCESS;
}

static size_t proxy_usable_size(void *state, const void *ptr) {
    proxy_t *p = state;
    hm__mutex_lock(&p->lock);
    size_t *v = map_find(&p->live, (uintptr_t)ptr);
    size_t sz = v ? *v : 0;
    hm__mutex_unlock(&p->lock);
    return sz;
}

static const hm_pool_ops_t proxy_ops = {
    .version = HM_POOL_OPS_VERSION,
    .name = "proxy",
    .init = proxy_init,
    .fini = proxy_fini,
    .alloc = proxy_alloc,
    .free = proxy_free,
    .usable_size = proxy_usable_size,
};

const hm_pool_ops_t *hm_proxy_pool_ops(void) { return &proxy_ops; }

hm_result_t hm_proxy_pool_create(hm_provider_t *provider, uint32_t flags, hm_pool_t **pool) {
    return hm_pool_create(&proxy_ops, provider, NULL, flags, pool);
}
