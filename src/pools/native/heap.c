/* hetmem — the native pool: heaps (carve, init, orphan, abandon), thread
 * bindings and how a thread finds its heap (heap_get, nv->by_tp).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Heaps and thread bindings                                                */

static size_t stk_map_size(const nv_pool_t *nv) {
    return hm_align_up((size_t)nv->ncls * NV_STACK_CAP * sizeof(nv_sent_t), (size_t)4096);
}

/* Bytes of a heap's partial heads, which precede it (see heap_carve). */
static size_t partial_size(const nv_pool_t *nv) {
    return hm_align_up((size_t)nv->ncls * sizeof(nv_slab_t *), HM_CACHE_LINE);
}

/* Room for a heap, not yet set up (heap_init): its partial heads, then the
 * heap, so that the lines a heap of small classes uses (partial heads,
 * header, first classes: under 2 KiB with 64-byte blocks) lie together, and
 * its stacks, a mapping of their own, so that only the pages of the classes
 * in use are backed (whatever malloc the process runs on). Nothing of it is
 * touched. NULL: out of host memory. */
HM_RUN static nv_heap_t *heap_carve(nv_pool_t *nv, int kind, nv_sent_t **stkp) {
    void *stk;
    if (hm__prim_map(stk_map_size(nv), 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                     HM_PRIM_MAP_NORESERVE, -1, 0, &stk) != HM_SUCCESS)
        return NULL;
    size_t size = partial_size(nv) + sizeof(nv_heap_t) + nv->ncls * sizeof(nv_cls_t);
    hm__mutex_lock(&nv->depot_lock);
    char *unit = meta_alloc(nv, size, kind); /* zeroed, cache-line aligned */
    hm__mutex_unlock(&nv->depot_lock);
    if (!unit) {
        (void)hm__prim_unmap(stk, stk_map_size(nv));
        return NULL;
    }
    *stkp = stk;
    return (nv_heap_t *)(unit + partial_size(nv));
}

/* Set up a heap and its stacks from heap_carve and enter it in the pool's
 * list. */
HM_RUN static void heap_init(nv_pool_t *nv, nv_heap_t *h, nv_sent_t *stk) {
    h->stk_map = stk;
    h->partial = (nv_slab_t **)((char *)h - partial_size(nv));
    h->nv = nv;
    h->last_cl = &h->cls[0]; /* last 0, last_bit 0: see heap_forget_last */
    __cds_wfcq_init(&h->rq_head, &h->rq_tail);
    __cds_wfcq_init(&h->priv_head, &h->priv_tail);
    pthread_mutex_init(&h->mq_lock, NULL);
    /* The classes are set up at their first refill (cls_refill). */
    hm__mutex_lock(&nv->lock);
    h->all_next = nv->heaps;
    nv->heaps = h;
    hm__mutex_unlock(&nv->lock);
}

HM_RUN static nv_heap_t *heap_new(nv_pool_t *nv) {
    nv_sent_t *stk;
    nv_heap_t *h = heap_carve(nv, META_HEAP, &stk);
    if (h) heap_init(nv, h, stk);
    return h;
}

/* The heap of threads without one (orphan_lock held): carved at nv_init,
 * set up at its first use, so that a pool whose threads all have heaps
 * never touches it. */
HM_RUN static nv_heap_t *orphan_heap(nv_pool_t *nv) {
    if (hm_unlikely(!nv->orphan_ready)) {
        heap_init(nv, nv->orphan, nv->orphan_stk);
        nv->orphan_ready = true;
    }
    return nv->orphan;
}

/* Publish what h holds for others and hand it to the pool (g_lock held). */
HM_RUN static void heap_abandon(nv_heap_t *h) {
    nv_pool_t *nv = h->nv;
    atomic_store_explicit(&h->tp, 0, memory_order_relaxed);
    flush_all(h);
    hm__mutex_lock(&nv->lock);
    h->aband_next = nv->abandoned;
    nv->abandoned = h;
    hm__mutex_unlock(&nv->lock);
}

/* Thread bindings (g_lock held), so that a thread that only frees never
 * calls malloc (see nv_pool.meta): a thread's first one is in its
 * thread-local state (tl.first: no page of its own for the common thread of
 * one pool; only its own thread and, until its destructor has run, nv_fini
 * under g_lock touch it), the others from pages of their own, kept for
 * reuse (never unmapped: a binding may outlive its pool). */
static nv_binding_t *g_spare_bindings;

HM_RUN static nv_binding_t *binding_new_locked(void) {
    if (!tl.first_used) {
        tl.first_used = 1;
        return &tl.first;
    }
    if (!g_spare_bindings) {
        size_t page = hm__prim_page_size();
        void *p;
        if (hm__prim_map(page, 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, 0, -1, 0, &p) !=
            HM_SUCCESS)
            return NULL;
        nv_binding_t *a = p;
        for (size_t i = 0; i < page / sizeof(*a); i++) {
            a[i].next = g_spare_bindings;
            g_spare_bindings = &a[i];
        }
    }
    nv_binding_t *b = g_spare_bindings;
    g_spare_bindings = b->next;
    return b;
}

/* b is the caller's (its thread's tl.bindings or not yet in them). */
HM_RUN static void binding_free_locked(nv_binding_t *b) {
    if (b == &tl.first) {
        tl.first_used = 0;
        return;
    }
    b->next = g_spare_bindings;
    g_spare_bindings = b;
}

HM_RUN static HM_NOINLINE nv_heap_t *heap_get_slow(nv_pool_t *nv) {
    if (tl.dead) return NULL;
    for (nv_binding_t **bp = &tl.bindings; *bp;) {
        nv_binding_t *b = *bp;
        nv_heap_t *h = atomic_load_explicit(&b->heap, memory_order_acquire);
        if (!h) { /* its pool was destroyed */
            *bp = b->next;
            hm__mutex_lock(&g_lock);
            binding_free_locked(b);
            hm__mutex_unlock(&g_lock);
            continue;
        }
        if (b->pool_id == nv->id) {
            tl.id = nv->id;
            tl.heap = h;
            return h;
        }
        bp = &b->next;
    }
    hm__mutex_lock(&g_lock);
    nv_binding_t *b = binding_new_locked();
    hm__mutex_unlock(&g_lock);
    if (!b) return NULL;
    hm__mutex_lock(&nv->lock);
    nv_heap_t *h = nv->abandoned;
    if (h) nv->abandoned = h->aband_next;
    hm__mutex_unlock(&nv->lock);
    if (!h) h = heap_new(nv);
    if (!h) {
        hm__mutex_lock(&g_lock);
        binding_free_locked(b);
        hm__mutex_unlock(&g_lock);
        return NULL;
    }
    b->pool_id = nv->id;
    atomic_store_explicit(&b->heap, h, memory_order_relaxed);
    atomic_store_explicit(&h->tp, thread_tp(), memory_order_relaxed);
    hm__mutex_lock(&g_lock);
    h->binding = b;
    hm__mutex_unlock(&g_lock);
    b->next = tl.bindings;
    tl.bindings = b;
    pthread_setspecific(g_key, (void *)&tl.bindings);
    tl.id = nv->id;
    tl.heap = h;
    return h;
}

HM_INLINE nv_heap_t *heap_get(nv_pool_t *nv) {
    if (hm_likely(tl.id == nv->id)) return tl.heap;
    return heap_get_slow(nv);
}

/* ---- Heaps by thread pointer (nv->by_tp) ---- */

/* What every by_tp slot holds until a heap takes it: no thread has tp 0. */
static nv_heap_t by_tp_nobody;

HM_INLINE size_t tp_slot(uintptr_t tp) { /* Fibonacci hashing, as lmap_slot */
    return (size_t)((tp * 0x9E3779B97F4A7C15ull) >> (64 - NV_BY_TP_BITS));
}

/* The heap in the caller's by_tp slot (never NULL): the caller's heap iff
 * its tp is the caller's thread pointer (else ask heap_get). */
HM_INLINE nv_heap_t *heap_by_tp(nv_pool_t *nv, uintptr_t tp) {
    return atomic_load_explicit(&nv->by_tp[tp_slot(tp)], memory_order_acquire);
}
HM_INLINE int heap_is_mine(nv_heap_t *h, uintptr_t tp) {
    return atomic_load_explicit(&h->tp, memory_order_relaxed) == tp;
}
/* The heap in nv->own (never NULL): the caller's iff heap_is_mine. Tested
 * before heap_by_tp, it spares the pool's first thread the hash. */
HM_INLINE nv_heap_t *heap_own(nv_pool_t *nv) {
    return atomic_load_explicit(&nv->own, memory_order_acquire);
}

/* h is the caller's heap: enter it in by_tp unless the slot serves another
 * live thread (that one keeps it; this thread then takes the TLS path). */
HM_RUN static void by_tp_note(nv_pool_t *nv, nv_heap_t *h) {
    uintptr_t tp = thread_tp();
    /* nv->own: taken when no thread is bound to the heap there. Racing
     * writers store heaps of live threads; whichever stays is trusted by
     * its own thread only (heap_is_mine). */
    nv_heap_t *own = heap_own(nv);
    if (own != h && !atomic_load_explicit(&own->tp, memory_order_relaxed))
        atomic_store_explicit(&nv->own, h, memory_order_release);
    _Atomic(nv_heap_t *) *slot = &nv->by_tp[tp_slot(tp)];
    nv_heap_t *o = atomic_load_explicit(slot, memory_order_acquire);
    if (o == h) return;
    uintptr_t otp = atomic_load_explicit(&o->tp, memory_order_relaxed);
    if (otp && tp_slot(otp) == tp_slot(tp)) return;
    atomic_store_explicit(slot, h, memory_order_release);
}

/* pthread key destructor: abandon every heap of the exiting thread. */
HM_RUN static void tl_destructor(void *arg) {
    (void)arg;
    hm__mutex_lock(&g_lock);
    for (nv_binding_t *b = tl.bindings, *next; b; b = next) {
        next = b->next;
        nv_heap_t *h = atomic_load_explicit(&b->heap, memory_order_acquire);
        if (h) {
            h->binding = NULL;
            heap_abandon(h);
        }
        binding_free_locked(b);
    }
    tl.bindings = NULL;
    tl.id = 0;
    tl.heap = NULL;
    tl.fast = NULL;
    tl.dead = 1;
    hm__mutex_unlock(&g_lock);
}
