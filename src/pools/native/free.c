/* hetmem — the native pool: free (free_impl, its cached and slow paths),
 * and the fast entry points of the ops and the malloc replacement
 * (nv_free, nv_malloc_fast, hm__native_malloc, hm__native_free).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Free                                                                     */

/* remote_free with its statistics (the case remote_free_quick leaves). */
HM_RUN static HM_NOINLINE hm_result_t free_remote_slow(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
    hm_result_t r = remote_free(h, s, idx);
    if (r == HM_SUCCESS) stat_add_i(&h->st_bytes, -(int64_t)s->bsize);
    return r;
}

/* Block idx of s, another heap's, freed by h's thread: a leaf but for
 * the tail call of the slow case. */
HM_RUN static HM_NOINLINE hm_result_t free_remote(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
    if (hm_likely(remote_free_quick(h, s, idx))) return HM_SUCCESS;
    return free_remote_slow(h, s, idx);
}

HM_RUN static hm_result_t free_block(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
    if (s->owner == h) return free_own(s, idx);
    return free_remote(h, s, idx);
}

/* quiet: a pointer that is not the pool's returns HM_ERROR_NOT_FOUND
 * without a log line (hm__native_free_owned). */
HM_RUN static hm_result_t free_slow_q(nv_pool_t *nv, void *p, int quiet) {
    if (hm_unlikely(!p) && !quiet) return HM_SUCCESS; /* the free entry's NULL */
    nv_slab_t *s = map_get(nv, p);
    if (!s) {
        hm_result_t r = large_free(nv, p);
        if (r == HM_ERROR_NOT_FOUND) {
            if (quiet) return r;
            return hm__pool_refuse_free(nv->pool, p, "free", "not an allocation of this pool");
        }
        return r;
    }
    uint32_t idx;
    if (!block_index(s, p, &idx)) {
        HM_LOG_ERROR("native pool: free(%p): not the start of a block (interior pointer?)", p);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    nv_heap_t *h = heap_get(nv);
    if (hm_likely(h)) return free_block(h, s, idx);
    hm__mutex_lock(&nv->orphan_lock);
    nv_heap_t *o = orphan_heap(nv);
    hm_result_t r = free_block(o, s, idx);
    flush_all(o);
    hm__mutex_unlock(&nv->orphan_lock);
    return r;
}

HM_RUN static HM_NOINLINE hm_result_t free_slow(nv_pool_t *nv, void *p) {
    return free_slow_q(nv, p, 0);
}
HM_RUN static HM_NOINLINE hm_result_t free_slow_quiet(nv_pool_t *nv, void *p) {
    return free_slow_q(nv, p, 1);
}

/* A valid block (index idx) of s freed by a thread not bound to its owner
 * heap, or one whose heap is not in its by_tp slot (h is then
 * &by_tp_nobody; the block may even be the caller's own). */
HM_RUN static HM_NOINLINE hm_result_t free_other(nv_pool_t *nv, nv_slab_t *s, void *p, nv_heap_t *h,
                                          uint32_t idx) {
    if (hm_unlikely(h == &by_tp_nobody)) {
        if (hm_unlikely(tl.id != nv->id)) return free_slow(nv, p);
        h = tl.heap;
        by_tp_note(nv, h);
    }
    return free_block(h, s, idx);
}

/* The fast path met a double free of the block allocated last. */
static HM_NOINLINE hm_result_t free_double_last(nv_pool_t *nv, void *p) {
    nv_slab_t *s = map_get(nv, p);
    uint32_t idx = 0;
    if (s) block_index(s, p, &idx);
    if (s) return double_free(s, idx);
    HM_LOG_ERROR("native pool: double free of %p", p);
    return HM_ERROR_DOUBLE_FREE;
}


/* free_impl's modes: the free op; the same without a log line for a
 * pointer that is not the pool's (hm__native_free_owned); the fast paths
 * only (hm__native_free): every case that may call malloc or free (a slow
 * path, a slab going back to the pool, an error) goes, before changing
 * anything, to hm__native_free's other; the same with remote frees made in
 * place (the malloc replacement's entry on its own heap, src/preload: a
 * remote free calls no malloc or free, only the depot lock and the metadata
 * mappings' mmap). */
enum { NV_FREE_OP, NV_FREE_QUIET, NV_FREE_FAST, NV_FREE_PX };
#define NV_EXIT(mode, call) ((mode) >= NV_FREE_FAST ? other(p) : (call))


/* free_own() inlined with the ownership test, which compares the slab's
 * owner with the caller's heap found by thread pointer (no TLS access);
 * every exit but success is a tail call, so the fast path needs no stack
 * frame. mode is a constant: one copy is compiled per mode. */
/* free_impl past the thread's own fast cases: me is the caller's heap, or
 * &by_tp_nobody. */
HM_INLINE hm_result_t free_general(nv_pool_t *nv, void *p, nv_heap_t *me, int mode,
                                   nv_other_fn other, int pf) {
    nv_slab_t *s = map_get(nv, p);
    if (hm_unlikely(!s))
        return NV_EXIT(mode, mode == NV_FREE_QUIET ? free_slow_quiet(nv, p) : free_slow(nv, p));
    uint32_t idx;
    if (hm_unlikely(!block_index(s, p, &idx)))
        return NV_EXIT(mode, mode == NV_FREE_QUIET ? free_slow_quiet(nv, p) : free_slow(nv, p));
    /* Ownership: the owner heap is the caller's (found by thread pointer;
     * no load of the owner's fields). */
    nv_heap_t *h = s->owner;
    if (hm_unlikely(h != me))
        return mode == NV_FREE_FAST ? other(p)
               : mode == NV_FREE_PX ? free_remote(me, s, idx) /* me: the caller's heap */
                                    : free_other(nv, s, p, me, idx);
    uint32_t w = idx >> 6;
    /* No branch on whether s is the current slab: that is a coin toss when
     * a class's live blocks span two slabs (random frees of small
     * classes), and a mispredicted branch here waits for the page-map
     * chain (cachegrind --branch-sim: 0.5 mispredictions per op on random
     * 8-128, all on that test). So the only test is whether the block is
     * of the word being handed out (its block goes back into the
     * class word): with random frees that is a word of 64 blocks among a
     * class's live blocks (s->cur_word names the word only while s is
     * current); the transition test reads is_cur, which rules out the
     * current slab. */
    /* A block of the word of s being handed out (s is its class's current
     * slab) goes back into the class word, so that the next allocations of
     * the class take it again without a stack push and pop (short-lived
     * blocks and nested temporaries freed in reverse are mostly of that
     * word). Its double-free test reads the class word and s->bits[w], as
     * every test of a block of that word (nv_cls). No state change. */
    if (w == s->cur_word) {
        nv_cls_t *cl = s->cl;
        uint64_t bit = (uint64_t)1 << (idx & 63), b = cl_bits(cl);
        if (hm_unlikely((s->bits[w] | b) & bit))
            return NV_EXIT(mode, double_free_at(s, (uintptr_t)p));
        cl_set(cl, b | bit);
        return HM_SUCCESS;
    }
    /* Past the ownership test only p, s and what follows from them stay
     * live (the exits recompute idx; h is s->owner), so that the path
     * needs no callee-saved registers. */
    nv_cls_t *cl = s->cl;
    uint64_t x = s->bits[w];
    if (hm_unlikely(bit_set_old(&x, idx))) return NV_EXIT(mode, double_free_at(s, (uintptr_t)p));
    uint32_t n = s->nfree + 1;
    /* (!(in_partial | is_cur) || n == nblocks) && !is_cur, in one compare
     * (nv_slab.tr). */
    if (hm_unlikely(n >= s->tr))
        return free_transition(s, (uintptr_t)p, mode >= NV_FREE_FAST ? other : NULL);
    s->bits[w] = x; /* the bit set above */
    s->nfree = n;
    nv_sent_t *t = stk_top(cl) - 1;
    if (hm_unlikely(stk_at_end(t))) return stk_full(s);
    stk_put_pf(cl, s, (uintptr_t)p, idx, t, pf);
    return HM_SUCCESS;
}

/* free_general out of line (the cached remote free's fallback: inlined,
 * its registers would cost every free a stack frame). */
HM_RUN
static HM_NOINLINE hm_result_t free_general_out(nv_pool_t *nv, void *p, nv_heap_t *me, int mode,
                                                nv_other_fn other) {
    return free_general(nv, p, me, mode, other, NV_PF_ASK);
}

/* free_more's free of a block in the word of the caller's last remote free
 * (roff: its offset from that word's first block): its bit goes into the
 * cached entry. 0: not that case (free_general sorts it out). */
HM_INLINE int cached_free(nv_heap_t *me, uintptr_t roff) {
    /* sub = roff / bsize through a 32-bit magic c = floor(M / 2^32) + 1,
     * with M the slab's 64-bit one (ceil(2^64 / bsize)): c exceeds
     * 2^32 / bsize by less than 1 + 2^-32, so for a block's offset
     * (q * bsize, q < 64, below 2^26) the product's high half is exactly q,
     * and any other offset fails the exact test sub * bsize == roff (the
     * shift is masked: such a sub may reach 64). Two imuls and no 128-bit
     * mul, which would take rdx, an argument the fallback passes on. */
    uint32_t sub = (uint32_t)((roff * me->r_magic) >> 32);
    uint32_t bsize = me->r_bsize;
    nv_rent_t *e = me->r_ent;
    uint64_t m = e->mask, bit = (uint64_t)1 << (sub & 63);
    uint32_t left = me->r_left;
    if (hm_unlikely((uintptr_t)sub * bsize != roff || (m & bit) || left <= 1)) return 0;
    e->mask = m | bit;
    me->r_left = left - 1;
    stat_add_i(&me->st_bytes, -(int64_t)bsize);
    return 1;
}

/* cached_free out of line, one copy per mode (so that the registers it
 * needs cost the local free no stack frame, and the fallback's mode is a
 * constant: with the 32-bit magic, the op's copy saves one callee-saved
 * register where the shared copy with a 128-bit mul saved five). */
HM_RUN static HM_NOINLINE hm_result_t free_cached_op(nv_pool_t *nv, void *p, nv_heap_t *me,
                                              uintptr_t roff) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_OP, NULL);
}
HM_RUN static HM_NOINLINE hm_result_t free_cached_quiet(nv_pool_t *nv, void *p, nv_heap_t *me,
                                                 uintptr_t roff) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_QUIET, NULL);
}
HM_RUN static HM_NOINLINE hm_result_t free_cached_fast(nv_pool_t *nv, void *p, nv_heap_t *me,
                                                uintptr_t roff, nv_other_fn other) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_FAST, other);
}
#ifdef HM_NATIVE_PRELOAD /* the malloc replacement's (NV_FREE_PX) */
HM_RUN static HM_NOINLINE hm_result_t free_cached_px(nv_pool_t *nv, void *p, nv_heap_t *me,
                                              uintptr_t roff, nv_other_fn other) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_PX, other);
}
#endif

/* free_impl past the block allocated last: me is the caller's heap, or
 * &by_tp_nobody (whose r_span is 0). */
HM_INLINE hm_result_t free_more(nv_pool_t *nv, void *p, nv_heap_t *me, int mode,
                                nv_other_fn other) {
    /* A block in the word of the caller's last remote free (nv_heap.r_key;
     * its offset from the word's first block is below r_span, which is 0
     * while there is none): the cached entry's geometry validates it
     * without the page map (the slab cannot go back to the pool while the
     * entry holds one of its blocks), and its bit goes into the entry. */
    uintptr_t roff = (uintptr_t)p - me->r_key;
    if (roff < me->r_span) {
        if (mode == NV_FREE_OP) return free_cached_op(nv, p, me, roff);
        if (mode == NV_FREE_QUIET) return free_cached_quiet(nv, p, me, roff);
        return free_cached_fast(nv, p, me, roff, other);
    }
    return free_general(nv, p, me, mode, other, NV_PF_ASK);
}

/* One out-of-line copy per mode: the fast case of free_impl then needs no
 * stack frame. */
HM_RUN static HM_NOINLINE hm_result_t free_more_op(nv_pool_t *nv, void *p, nv_heap_t *me) {
    return free_more(nv, p, me, NV_FREE_OP, NULL);
}
HM_RUN static HM_NOINLINE hm_result_t free_more_quiet(nv_pool_t *nv, void *p, nv_heap_t *me) {
    return free_more(nv, p, me, NV_FREE_QUIET, NULL);
}
HM_RUN static HM_NOINLINE hm_result_t free_more_fast(nv_pool_t *nv, void *p, nv_heap_t *me,
                                              nv_other_fn other) {
    return free_more(nv, p, me, NV_FREE_FAST, other);
}

/* pf: NV_PF_ASK, the ops' copies (free_more out of line, one copy per
 * mode); NV_PF_NEVER or NV_PF_HOST, the free entries' (NV_FREE_OP with
 * free_more and free_general inlined: every exit but success is a tail
 * call, so it needs no stack frame; prefetch fixed). */
HM_INLINE hm_result_t free_impl(void *state, void *p, int mode, nv_other_fn other, int pf) {
    nv_pool_t *nv = state;
#if defined(__x86_64__)
    /* p stays where it came (rsi), which is where every tail call of an
     * entry passes it: without this GCC 12 moves it to rdi and back (2 of
     * the entry's fast-path instructions). Changes nothing else. */
    if (pf != NV_PF_ASK) __asm__("" : "+S"(p));
#endif
    uintptr_t tp = thread_tp();
    nv_heap_t *me = heap_own(nv);
    if (hm_likely(heap_is_mine(me, tp)) ||
        hm_likely(heap_is_mine(me = heap_by_tp(nv, tp), tp))) {
        /* The block this thread allocated last (see nv_heap.last): a
         * pointer equal to it is valid, so only the double-free test
         * remains. The address comparison does not wait for the page map,
         * which takes the lookup off the critical path of malloc/free
         * pairs. `last` stays set: the block is in the class word now, so
         * freeing it again finds its bit there (a double free), and every
         * change of the word clears `last` (cls_refill, heap_tidy). p NULL
         * matches only while `last` is 0, and then changes nothing
         * (heap_forget_last). */
        if (me->last == (uintptr_t)p) {
            nv_cls_t *cl = me->last_cl;
            uint64_t bit = me->last_bit, b = cl_bits(cl);
            if (hm_unlikely(b & bit)) {
                if (mode == NV_FREE_FAST) return other(p);
                heap_forget_last(me);
                return free_double_last(nv, p);
            }
            cl_set(cl, b | bit);
            return HM_SUCCESS;
        }
    } else {
        me = &by_tp_nobody; /* free_general sorts it out */
    }
    if (pf != NV_PF_ASK) { /* free_more inlined (NV_FREE_OP) */
        uintptr_t roff = (uintptr_t)p - me->r_key;
        if (roff < me->r_span) return free_cached_op(nv, p, me, roff);
        return free_general(nv, p, me, NV_FREE_OP, NULL, pf);
    }
    if (mode == NV_FREE_OP) return free_more_op(nv, p, me);
    if (mode == NV_FREE_QUIET) return free_more_quiet(nv, p, me);
    return free_more_fast(nv, p, me, other);
}

HM_RUN static hm_result_t nv_free(void *state, void *p) {
    return free_impl(state, p, NV_FREE_OP, NULL, NV_PF_ASK);
}

HM_RUN hm_result_t hm__native_free_owned(void *state, void *p) {
    return free_impl(state, p, NV_FREE_QUIET, NULL, NV_PF_ASK);
}

HM_RUN hm_result_t hm__native_alloc(void *state, size_t size, size_t align, void **out) {
    return nv_alloc(state, size, align, out);
}

/* hm__native_malloc's refill (h: the caller's heap, cl: the class). */
HM_RUN static HM_NOINLINE void *malloc_refill(nv_heap_t *h, nv_cls_t *cl, size_t size, int *guard,
                                       void *(*other)(size_t)) {
    uintptr_t p = stk_pop(h, cl); /* calls nothing */
    if (hm_likely(p)) return (void *)p;
    void *q;
    *guard = 1;
    hm_result_t r = alloc_refill(h, (unsigned)(cl - h->cls), &q);
    *guard = 0;
    return hm_likely(r == HM_SUCCESS) ? q : other(size);
}

HM_RUN void *hm__native_malloc(void *state, size_t size, int *guard, void *(*other)(size_t)) {
    nv_heap_t *h;
    nv_cls_t *cl;
    uintptr_t p = alloc_fast(state, size, &h, &cl);
    if (hm_likely(p)) return (void *)p;
    if (h) return malloc_refill(h, cl, size, guard, other);
    return other(size);
}

/* The malloc_fast op (hm_pool_malloc tail-calls it): alloc_fast, else
 * nv_alloc with its result as errno. */
HM_RUN static HM_NOINLINE void *malloc_fast_refill(nv_heap_t *h, nv_cls_t *cl) {
    uintptr_t p = stk_pop(h, cl);
    if (p) return (void *)p;
    void *q;
    hm_result_t r = refill_or_trim(h, (unsigned)(cl - h->cls), &q);
    if (hm_unlikely(r != HM_SUCCESS)) {
        errno = hm__result_errno(r);
        return NULL;
    }
    return q;
}

HM_RUN static void *nv_malloc_fast(void *state, size_t size) {
    nv_heap_t *h;
    nv_cls_t *cl = alloc_cls(state, size, &h);
    if (hm_unlikely(!cl)) return hm__malloc_via(nv_alloc, state, size);
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return (void *)alloc_word(h, cl, b);
    uintptr_t p = alloc_pop(cl);
    if (hm_likely(p)) return (void *)p;
    return malloc_fast_refill(h, cl);
}

HM_RUN hm_result_t hm__native_free(void *state, void *p, hm_result_t (*other)(void *)) {
    return free_impl(state, p, NV_FREE_FAST, other, NV_PF_ASK);
}
