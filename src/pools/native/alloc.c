/* hetmem — the native pool: allocation (alloc_fast, the class refill,
 * the slow path, nv_alloc).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Allocation                                                               */

/* The size class for size/align, or -1 for a large allocation. */
HM_RUN static int class_for(const nv_pool_t *nv, size_t size, size_t align) {
    if (align <= 8) return size <= nv->class_limit ? (int)cls_of(size) : -1;
    if (align > nv->slab_size) return -1;
    size_t sz = size > align ? size : align;
    if (sz > nv->class_limit) return -1;
    unsigned c = cls_of(sz);
    while (c < nv->ncls && hm__nv_cls_size[c] % align) c++;
    return c < nv->ncls ? (int)c : -1;
}

/* The word take_word would take from s (s->nfree > 0). */
HM_RUN static uint32_t next_word(const nv_slab_t *s) {
    uint32_t i = s->scan;
    while (!s->bits[i]) i = i + 1 == s->nwords ? 0 : i + 1;
    return i;
}

/* cl->cur would hand out a word it never used (its pages untouched): if one
 * of the first few slabs of the partial list has a free word among those it
 * used, that slab becomes the current one and cur goes back to the lists.
 * First fit across the heap's slabs, as take_word within one: the producer
 * of a producer/consumer pair, whose blocks come back through the remote
 * queue after a delay, otherwise moves its whole working set into each new
 * slab (a slab taken while the others were full, before the consumer's
 * frees were drained) and keeps every page of both resident; so the new
 * slab serves only the overflow. Called by cls_refill only (the stack is
 * empty, cl->bits too). Returns the current slab. */
#define NV_TOUCHED_LOOK 4
HM_RUN static HM_NOINLINE nv_slab_t *cls_prefer_touched(nv_heap_t *h, nv_cls_t *cl, unsigned c) {
    nv_slab_t *p = h->partial[c];
    for (unsigned k = 0; p && k < NV_TOUCHED_LOOK; p = p->next, k++) {
        if (!p->nfree || next_word(p) >= p->hw) continue;
        cls_retire_cur(h, cl);
        partial_unlink(cl, p);
        cl->cur = p;
        slab_state(p, 0, 1); /* cur_word is set by take_word */
        break;
    }
    return cl->cur;
}

/* cl->cur would hand out a word it never used (its pages untouched), and no
 * slab of the heap's partial list has a used one free (cls_prefer_touched):
 * a slab of the class's span that went back to the pool with pages still
 * backed (hw > 0: not purged since) becomes the current one, and cur goes
 * back to the lists. A producer whose consumers' frees come back in bursts
 * empties its older slabs while a slab taken in the meantime is current; the
 * first to empty becomes the current one (slab_transition), the others go
 * back to the pool, and without this the slab taken in the meantime, popped
 * from the partial list once that one is used up, would go on into its
 * untouched words (a 1->3 fan-in had its four slabs' pages all resident,
 * where three and a half at most were in use at once). Called only while
 * the pool keeps something (nv_pool.kept, a hint read without the lock).
 * Returns the current slab. */
HM_RUN static HM_NOINLINE nv_slab_t *cls_prefer_retained(nv_pool_t *nv, nv_heap_t *h, nv_cls_t *cl,
                                                  unsigned c) {
    size_t span = nv->cls_span[c];
    uint32_t words = cls_words(nv, c);
    nv_slab_t *r = NULL;
    hm__mutex_lock(&nv->lock);
    for (nv_slab_t **sp = &nv->retained; *sp; sp = &(*sp)->next) {
        if ((*sp)->span != span || (*sp)->wcap < words || !(*sp)->hw) continue;
        r = *sp;
        *sp = r->next;
        atomic_fetch_sub_explicit(&nv->kept, span, memory_order_relaxed);
        break;
    }
    hm__mutex_unlock(&nv->lock);
    if (!r) return cl->cur;
    if (!slab_carve(nv, r, h, c)) { /* out of host memory for a page-map leaf */
        r->owner = NULL;
        slab_unacquire(nv, r);
        return cl->cur;
    }
    cls_retire_cur(h, cl);
    cl->cur = r;
    slab_state(r, 0, 1); /* cur_word is set by take_word */
    return r;
}

/* Refill cl->bits (bits is empty). */
/* Should the refill look for a retained slab (cls_prefer_retained) before
 * s, the current slab, hands out a word it never used? Only if s has used
 * some (a fresh slab's first word costs the same as a retained one's) and
 * the pool keeps something (nv_pool.kept, a hint read without the lock). */
HM_INLINE int retained_first(nv_pool_t *nv, const nv_slab_t *s) {
    return s->scan >= s->hw && s->hw && atomic_load_explicit(&nv->kept, memory_order_relaxed);
}

HM_RUN static hm_result_t cls_refill(nv_heap_t *h, unsigned c) {
    nv_pool_t *nv = h->nv;
    nv_cls_t *cl = &h->cls[c];
    if (hm_unlikely(!cl->stk)) { /* the heap's first use of the class: see nv_cls */
        cl->bsize = hm__nv_cls_size[c];
        cl->word = UINT32_MAX;
        cl->stk = h->stk_map + (size_t)c * NV_STACK_CAP;
        stk_set_top(cl, cl->stk + NV_STACK_CAP); /* empty */
        cl->prefetch = nv->prefetch;
    }
    if (h->last_cl == cl) heap_forget_last(h); /* the word may change */
    if (h->out_pending) flush_all(h);
    /* Remote frees first: their blocks are reused before another word of
     * the slab, or another slab, is taken (fewer pages touched), and their
     * batches go back into circulation sooner (fewer batches). */
    if (drain_pending(h) && drain(h) && cl_bits(cl))
        return HM_SUCCESS; /* frees landed in the current word */
    nv_slab_t *s = cl->cur;
    if (s && s->nfree) {
        /* take_word's next word is usually s->scan's: from s->hw on, never used. */
        if (hm_unlikely(s->scan >= s->hw)) {
            if (h->partial[c]) s = cls_prefer_touched(h, cl, c);
            if (retained_first(nv, s)) s = cls_prefer_retained(nv, h, cl, c);
        }
        take_word(h, cl, s);
        return HM_SUCCESS;
    }
    if (s) { /* full: it leaves the lists until a block comes back */
        cl->cur = NULL;
        cl->word = UINT32_MAX;
        slab_state(s, s->in_partial, 0);
        s->cur_word = UINT32_MAX;
    }
    /* Slabs whose last free blocks stk_pop took stay listed until here. */
    while ((s = h->partial[c]) && !s->nfree) partial_unlink(cl, s);
    if (s) {
        partial_unlink(cl, s);
    } else {
        hm_result_t r = slab_acquire(nv, h, c, &s);
        if (r != HM_SUCCESS) return r;
    }
    cl->cur = s;
    slab_state(s, 0, 1);
    if (hm_unlikely(retained_first(nv, s))) s = cls_prefer_retained(nv, h, cl, c);
    take_word(h, cl, s);
    return HM_SUCCESS;
}

HM_RUN static hm_result_t alloc_small(nv_heap_t *h, unsigned c, void **out) {
    nv_cls_t *cl = &h->cls[c];
    if (!cl_bits(cl)) {
        uintptr_t p = stk_pop(h, cl);
        if (p) {
            *out = (void *)p;
            return HM_SUCCESS;
        }
        hm_result_t r = cls_refill(h, c);
        if (r != HM_SUCCESS) return r;
    }
    uint64_t b = cl_bits(cl);
    cl_set(cl, b & (b - 1));
    *out = (void *)(cl->wbase + (uintptr_t)__builtin_ctzll(b) * cl->bsize);
    return HM_SUCCESS;
}

HM_RUN static HM_NOINLINE hm_result_t alloc_slow(nv_pool_t *nv, size_t size, size_t align,
                                          void **out) {
    int c = class_for(nv, size, align);
    if (c < 0) return large_alloc(nv, size, align, out);
    nv_heap_t *h = heap_get(nv);
    hm_result_t r;
    if (hm_likely(h)) {
        by_tp_note(nv, h);
        r = alloc_small(h, (unsigned)c, out);
    } else {
        hm__mutex_lock(&nv->orphan_lock);
        nv_heap_t *o = orphan_heap(nv);
        r = alloc_small(o, (unsigned)c, out);
        flush_all(o);
        hm__mutex_unlock(&nv->orphan_lock);
    }
    /* No room for a whole slab (a provider of bounded capacity): a range of
     * its own, page-granular, may still fit. */
    if (hm_unlikely(r == HM_ERROR_OUT_OF_MEMORY))
        r = large_alloc(nv, size, align > 16 ? align : 16, out);
    return r;
}

/* The fast path's refill: h is the caller's heap, c a class. */
HM_RUN static HM_NOINLINE hm_result_t alloc_refill(nv_heap_t *h, unsigned c, void **out) {
    hm_result_t r = alloc_small(h, c, out);
    if (hm_unlikely(r == HM_ERROR_OUT_OF_MEMORY)) /* see alloc_slow */
        r = large_alloc(h->nv, hm__nv_cls_size[c], 16, out);
    return r;
}

/* The allocation fast path (alignment <= 8), in three parts that call
 * nothing, so that each caller's exits are tail calls of its own.
 * alloc_cls: the caller's heap's class for size, found by thread pointer
 * (*hp: the heap), or NULL (the slow path: a large size, or no heap found
 * that way). */
HM_INLINE nv_cls_t *alloc_cls(nv_pool_t *nv, size_t size, nv_heap_t **hp) {
    size_t at; /* of the class in the heap: NV_CLS_AT */
    if (hm_likely(size <= nv->fast_limit)) at = hm__nv_cls_at8[(size + 7) >> 3];
    else if (size <= nv->class_limit) at = NV_CLS_AT(cls_of_big(size));
    else return NULL;
    uintptr_t tp = thread_tp();
    nv_heap_t *h = heap_own(nv);
    if (hm_unlikely(!heap_is_mine(h, tp))) {
        h = heap_by_tp(nv, tp);
        if (hm_unlikely(!heap_is_mine(h, tp))) return NULL;
    }
    *hp = h;
    nv_cls_t *cl = (nv_cls_t *)((char *)h + at);
    if (!cl) __builtin_unreachable(); /* a heap's class: no test on the fast path */
    return cl;
}

/* alloc_fast's block from cl's class word b (not 0), which becomes h's
 * `last`. */
HM_INLINE uintptr_t alloc_word(nv_heap_t *h, nv_cls_t *cl, uint64_t b) {
    /* No counter update: see nv_heap.st_bytes. */
    uint64_t lowest = b & (0 - b);
    uintptr_t p = cl->wbase + (uintptr_t)(unsigned)__builtin_ctzll(b) * cl->bsize;
    cl_set(cl, b ^ lowest);
    h->last = p;
    h->last_cl = cl;
    h->last_bit = lowest;
    if (!p) __builtin_unreachable(); /* a slab's base is never 0 (slab_acquire) */
    return p;
}

/* alloc_fast's block from cl's stack (its class word is empty): the newest
 * entry's, or 0 if the stack is empty or that entry stale (the refill's
 * stk_pop then drops it). */
HM_INLINE uintptr_t alloc_pop(nv_cls_t *cl) {
    nv_sent_t *t = stk_top(cl);
    if (hm_unlikely(stk_at_end(t))) return 0;
    uintptr_t p = stk_take(cl, t);
    if (hm_likely(p)) stk_set_top(cl, t + 1);
    return p;
}

/* The three parts in one: the block, or 0 with *hp the caller's heap (its
 * class *clp has no block at hand: refill) or NULL (the slow path). */
HM_INLINE uintptr_t alloc_fast(nv_pool_t *nv, size_t size, nv_heap_t **hp, nv_cls_t **clp) {
    nv_heap_t *h = NULL;
    nv_cls_t *cl = alloc_cls(nv, size, &h);
    *hp = h;
    *clp = cl;
    if (hm_unlikely(!cl)) return 0;
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return alloc_word(h, cl, b);
    return alloc_pop(cl);
}

static hm_result_t nv_trim(void *state);

/* The provider is out of memory while the pool may cache freed memory
 * (empty slabs, large blocks): give it back (nv_trim) and try once more.
 * Device memory has no swap to fall back on; PyTorch's CUDA caching
 * allocator frees its cached blocks and retries cudaMalloc for the same
 * reason (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks). */
static HM_NOINLINE __attribute__((cold)) hm_result_t oom_retry_refill(nv_heap_t *h, unsigned c,
                                                                     void **out) {
    (void)nv_trim(h->nv);
    return alloc_refill(h, c, out);
}
static HM_NOINLINE __attribute__((cold)) hm_result_t oom_retry_slow(nv_pool_t *nv, size_t size,
                                                                   size_t align, void **out) {
    (void)nv_trim(nv);
    return alloc_slow(nv, size, align, out);
}
HM_RUN static hm_result_t refill_or_trim(nv_heap_t *h, unsigned c, void **out) {
    hm_result_t r = alloc_refill(h, c, out);
    if (hm_likely(r != HM_ERROR_OUT_OF_MEMORY)) return r;
    return oom_retry_refill(h, c, out);
}
HM_RUN static hm_result_t slow_or_trim(nv_pool_t *nv, size_t size, size_t align, void **out) {
    hm_result_t r = alloc_slow(nv, size, align, out);
    if (hm_likely(r != HM_ERROR_OUT_OF_MEMORY)) return r;
    return oom_retry_slow(nv, size, align, out);
}

HM_RUN static hm_result_t nv_alloc(void *state, size_t size, size_t align, void **out) {
    nv_pool_t *nv = state;
    if (hm_likely(align <= 8)) {
        nv_heap_t *h;
        nv_cls_t *cl;
        uintptr_t p = alloc_fast(nv, size, &h, &cl);
        if (hm_likely(p)) {
            *out = (void *)p;
            return HM_SUCCESS;
        }
        if (h) return refill_or_trim(h, (unsigned)(cl - h->cls), out);
    }
    return slow_or_trim(nv, size, align, out);
}
