/* hetmem — the native pool: slabs (descriptors, carve, acquire, release,
 * the partial lists, block index), the per-class free-block stacks, and the
 * owner's free into a slab (slab_transition, free_own).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Slabs                                                                    */

/* Bitmap words of a slab of class c. */
static uint32_t cls_words(const nv_pool_t *nv, unsigned c) {
    return (uint32_t)((nv->cls_span[c] / hm__nv_cls_size[c] + 63) / 64);
}

/* A zeroed descriptor with room for `words` bitmap words: sized for its
 * class (a 64 KiB slab of 4 KiB blocks needs 2 lines, of 8-byte blocks 18),
 * so the descriptors of big classes sit close together. NULL: out of host
 * memory. */
HM_RUN static nv_slab_t *desc_new(uint32_t words) {
    size_t size = hm_align_up(sizeof(nv_slab_t) + (size_t)words * sizeof(uint64_t), HM_CACHE_LINE);
    nv_slab_t *s = aligned_alloc(HM_CACHE_LINE, size); /* see nv_slab_t's layout */
    if (!s) return NULL;
    memset(s, 0, size);
    s->wcap = words;
    return s;
}

/* Give retained slab s (in no list but all_slabs) a descriptor with room
 * for `words` bitmap words; NULL (s unchanged) if out of host memory. */
static nv_slab_t *desc_grow(nv_pool_t *nv, nv_slab_t *s, uint32_t words) {
    nv_slab_t *n = desc_new(words);
    if (!n) return NULL;
    n->base = s->base;
    n->span = s->span;
    hm__mutex_lock(&nv->lock);
    n->all_prev = s->all_prev;
    n->all_next = s->all_next;
    if (s->all_prev) s->all_prev->all_next = n;
    else nv->all_slabs = n;
    if (s->all_next) s->all_next->all_prev = n;
    hm__mutex_unlock(&nv->lock);
    free(s);
    return n;
}

/* Set the state flags of s (the owner's) and the free's test of them,
 * nv_slab.tr. */
HM_INLINE void slab_state(nv_slab_t *s, int in_partial, int is_cur) {
    s->in_partial = (uint8_t)in_partial;
    s->is_cur = (uint8_t)is_cur;
    s->tr = is_cur ? UINT32_MAX : in_partial ? s->nblocks : 1;
}

/* Carve s for class c of heap h and publish it in the page map. */
HM_RUN static int slab_carve(nv_pool_t *nv, nv_slab_t *s, nv_heap_t *h, unsigned c) {
    uint32_t bsize = hm__nv_cls_size[c];
    s->owner = h;
    s->cls = (uint16_t)c;
    s->cl = &h->cls[c];
    s->bsize = bsize;
    s->nblocks = (uint32_t)(s->span / bsize);
    s->magic = UINT64_MAX / bsize + 1; /* ceil(2^64 / bsize): bsize is no power of 2^64 */
    s->nwords = (s->nblocks + 63) / 64;
    for (uint32_t i = 0; i < s->nwords; i++) s->bits[i] = ~(uint64_t)0;
    if (s->nblocks & 63) s->bits[s->nwords - 1] = ((uint64_t)1 << (s->nblocks & 63)) - 1;
    s->nfree = s->nblocks;
    s->scan = 0;
    slab_state(s, 0, 0);
    s->cur_word = UINT32_MAX;
    s->prev = s->next = NULL;
    if (!map_set(nv, s->base, s->span, s)) {
        map_set(nv, s->base, s->span, NULL);
        return 0;
    }
    return 1;
}

/* Return an empty slab (not current, in no list) to the pool. */
HM_RUN static void slab_release(nv_pool_t *nv, nv_slab_t *s) {
    map_set(nv, s->base, s->span, NULL);
    s->owner = NULL;
    hm__mutex_lock(&nv->lock);
    if (!nv->can_free || kept_fits(nv, s->span)) {
        s->next = nv->retained;
        nv->retained = s;
        atomic_fetch_add_explicit(&nv->kept, s->span, memory_order_relaxed);
        hm__mutex_unlock(&nv->lock);
        return;
    }
    /* Unlink from the all-slabs list and free it. */
    if (s->all_prev) s->all_prev->all_next = s->all_next;
    else nv->all_slabs = s->all_next;
    if (s->all_next) s->all_next->all_prev = s->all_prev;
    hm__mutex_unlock(&nv->lock);
    if (hm_pool_provider_free(nv->pool, (void *)s->base, s->span) == HM_SUCCESS) {
        atomic_fetch_sub_explicit(&nv->held, s->span, memory_order_relaxed);
        atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
        atomic_fetch_sub_explicit(&nv->nslabs, 1, memory_order_relaxed);
        free(s);
        return;
    }
    hm__mutex_lock(&nv->lock); /* could not free: keep it */
    s->all_prev = NULL;
    s->all_next = nv->all_slabs;
    if (nv->all_slabs) nv->all_slabs->all_prev = s;
    nv->all_slabs = s;
    s->next = nv->retained;
    nv->retained = s;
    atomic_fetch_add_explicit(&nv->kept, s->span, memory_order_relaxed);
    hm__mutex_unlock(&nv->lock);
}

/* slab_acquire could not use s (retained or new, unmapped): back to the
 * retained list, whatever the retained bound. */
static void slab_unacquire(nv_pool_t *nv, nv_slab_t *s) {
    hm__mutex_lock(&nv->lock);
    s->next = nv->retained;
    nv->retained = s;
    atomic_fetch_add_explicit(&nv->kept, s->span, memory_order_relaxed);
    hm__mutex_unlock(&nv->lock);
}

/* A slab for class c of heap h: a retained one of the same span, or a new
 * provider range. */
HM_RUN static hm_result_t slab_acquire(nv_pool_t *nv, nv_heap_t *h, unsigned c, nv_slab_t **out) {
    size_t span = nv->cls_span[c];
    uint32_t words = cls_words(nv, c);
    nv_slab_t *s = NULL, **fit = NULL;
    hm__mutex_lock(&nv->lock);
    /* One of the span whose descriptor is big enough, else any of the span. */
    for (nv_slab_t **sp = &nv->retained; *sp; sp = &(*sp)->next) {
        if ((*sp)->span != span) continue;
        if (!fit || (*sp)->wcap >= words) fit = sp;
        if ((*sp)->wcap >= words) break;
    }
    if (fit) {
        s = *fit;
        *fit = s->next;
        atomic_fetch_sub_explicit(&nv->kept, span, memory_order_relaxed);
    }
    hm__mutex_unlock(&nv->lock);
    if (s && s->wcap < words) {
        nv_slab_t *n = desc_grow(nv, s, words);
        if (!n) {
            slab_unacquire(nv, s);
            return HM_ERROR_OUT_OF_HOST_MEMORY;
        }
        s = n;
    }
    if (!s) {
        void *p = NULL;
        hm_result_t r = provider_take(nv, span, nv->slab_size, &p);
        if (r != HM_SUCCESS) return r;
        s = desc_new(words);
        if (!s) {
            if (hm_pool_provider_free(nv->pool, p, span) != HM_SUCCESS)
                HM_LOG_WARN("native pool: out of host memory; %zu bytes at %p lost", span, p);
            return HM_ERROR_OUT_OF_HOST_MEMORY;
        }
        s->base = (uintptr_t)p; /* never 0 (provider_take; see nv_heap.r_key) */
        s->span = span;
        atomic_fetch_add_explicit(&nv->held, span, memory_order_relaxed);
        atomic_fetch_add_explicit(&nv->nranges, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&nv->nslabs, 1, memory_order_relaxed);
        hm__mutex_lock(&nv->lock);
        s->all_prev = NULL;
        s->all_next = nv->all_slabs;
        if (nv->all_slabs) nv->all_slabs->all_prev = s;
        nv->all_slabs = s;
        hm__mutex_unlock(&nv->lock);
    }
    if (!slab_carve(nv, s, h, c)) {
        s->owner = NULL;
        slab_unacquire(nv, s);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    *out = s;
    return HM_SUCCESS;
}

/* The head of the partial list of s's class in its owner heap. */
HM_INLINE nv_slab_t **partial_head(nv_slab_t *s) { return &s->owner->partial[s->cls]; }

HM_RUN static void partial_push(nv_cls_t *cl, nv_slab_t *s) {
    (void)cl;
    nv_slab_t **head = partial_head(s);
    s->prev = NULL;
    s->next = *head;
    if (*head) (*head)->prev = s;
    *head = s;
    slab_state(s, 1, s->is_cur);
}

HM_RUN static void partial_unlink(nv_cls_t *cl, nv_slab_t *s) {
    (void)cl;
    if (s->prev) s->prev->next = s->next;
    else *partial_head(s) = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
    slab_state(s, 0, s->is_cur);
}

/* Bits set in x, without a libgcc call where the target lacks POPCNT
 * (Hacker's Delight, 2nd ed., figure 5-2). */
HM_INLINE uint32_t popcount64(uint64_t x) {
#ifdef __POPCNT__
    return (uint32_t)__builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (uint32_t)((x * 0x0101010101010101ull) >> 56);
#endif
}

/* off / bsize for off < 2^32 and magic = ceil(2^64 / bsize) (nv_slab.magic),
 * and *exact: whether off is a multiple of bsize. One multiply. */
HM_INLINE uint32_t magic_div(uintptr_t off, uint64_t magic, int *exact) {
    unsigned __int128 m = (unsigned __int128)off * magic;
    *exact = (uint64_t)m < magic;
    return (uint32_t)(m >> 64);
}

/* Index of the block at offset off of s (off: a block's start). */
HM_INLINE uint32_t slab_idx(const nv_slab_t *s, uintptr_t off) {
    int exact;
    return magic_div(off, s->magic, &exact);
}

/* Index of the block p of s; 0 if p is not the start of a block. p is in
 * the page-map units of s, so that its offset is below 2^32 (a slab spans
 * at most NV_SLAB_MAX bytes). */
_Static_assert(NV_SLAB_MAX <= ((uint64_t)1 << 32), "block offsets are below 2^32: magic_div");
static inline int block_index(const nv_slab_t *s, const void *p, uint32_t *idx) {
    int exact;
    uint32_t i = magic_div((uintptr_t)p - s->base, s->magic, &exact);
    *idx = i;
    return exact && i < s->nblocks;
}

/* Bit i & 63 of *x: set it (bit_set_old) or clear it (bit_clear_old) and
 * return its old value. On x86-64 one bts/btr, whose carry flag is the old
 * bit (a register operand takes i mod 64), so a test and its update cost
 * one instruction and no mask of i; elsewhere the plain C. */
HM_INLINE int bit_set_old(uint64_t *x, uint64_t i) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__)
    int old;
    __asm__("btsq %2, %0" : "+r"(*x), "=@ccc"(old) : "r"(i));
    return old;
#else
    uint64_t b = (uint64_t)1 << (i & 63);
    int old = (*x & b) != 0;
    *x |= b;
    return old;
#endif
}
HM_INLINE int bit_clear_old(uint64_t *x, uint64_t i) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__)
    int old;
    __asm__("btrq %2, %0" : "+r"(*x), "=@ccc"(old) : "r"(i));
    return old;
#else
    uint64_t b = (uint64_t)1 << (i & 63);
    int old = (*x & b) != 0;
    *x &= ~b;
    return old;
#endif
}

/* ---- Free-block stacks (nv_cls.stk) ---- */

/* The owner's view of the stack pointer (relaxed: get_stats reads it). */
HM_INLINE nv_sent_t *stk_top(const nv_cls_t *cl) {
    return atomic_load_explicit(&cl->top, memory_order_relaxed);
}
HM_INLINE void stk_set_top(nv_cls_t *cl, nv_sent_t *t) {
    atomic_store_explicit(&cl->top, t, memory_order_relaxed);
}
/* Is the stack whose pointer is t empty (or not set up)? Full, if t is
 * the pointer a push would store? (See nv_cls.) */
HM_INLINE int stk_at_end(const nv_sent_t *t) {
    return ((uintptr_t)t & (NV_STACK_BYTES - 1)) == 0;
}
/* Entries of the stack whose pointer is t (0 before set-up). */
HM_INLINE uint32_t stk_count(const nv_sent_t *t) {
    return (uint32_t)(((NV_STACK_BYTES - ((uintptr_t)t & (NV_STACK_BYTES - 1))) &
                       (NV_STACK_BYTES - 1)) / sizeof(nv_sent_t));
}

/* Block p (index idx) of s was just freed into its bitmap by the owner of
 * s (cl: its class there): stack it, or (stack full) count its bytes out
 * of the heap's (a stacked block's bytes leave when get_stats subtracts
 * the stacks, nv_heap.st_bytes). */
/* stk_push's part for a stack with room (t: the new stack pointer). */
/* pf: NV_PF_ASK (cl->prefetch says), NV_PF_NEVER or NV_PF_HOST (the free
 * entries', one copy each: nv_pool.prefetch is fixed per pool). */
enum { NV_PF_ASK = -1, NV_PF_NEVER = 0, NV_PF_HOST = 1 };
HM_INLINE void stk_put_pf(nv_cls_t *cl, nv_slab_t *s, uintptr_t p, uint32_t idx, nv_sent_t *t,
                          int pf) {
    /* The stacked block is the next one of its class handed out, and the
     * caller will write it: start bringing its line in now, as a free list
     * kept in the blocks does by its store (host memory the CPU may touch
     * only; a prefetch never faults). */
    if (pf == NV_PF_HOST || (pf == NV_PF_ASK && hm_likely(cl->prefetch)))
        __builtin_prefetch((const void *)p, 1, 3); /* inline: host */
    t->s = s;
    t->idx = idx;
    stk_set_top(cl, t);
}

HM_INLINE void stk_put(nv_cls_t *cl, nv_slab_t *s, uintptr_t p, uint32_t idx, nv_sent_t *t) {
    stk_put_pf(cl, s, p, idx, t, NV_PF_ASK);
}

/* stk_push's part for a full stack; returns HM_SUCCESS (free_general
 * tail-calls it, so that its fast path keeps no register for it). */
HM_RUN static HM_NOINLINE hm_result_t stk_full(const nv_slab_t *s) {
    stat_add_i(&s->owner->st_bytes, -(int64_t)s->bsize);
    return HM_SUCCESS;
}

HM_INLINE void stk_push(nv_cls_t *cl, nv_slab_t *s, uintptr_t p, uint32_t idx) {
    nv_sent_t *t = stk_top(cl) - 1;
    if (hm_likely(!stk_at_end(t))) stk_put(cl, s, p, idx, t);
    else stk_full(s);
}

/* s (h's) goes back to the pool: drop its entries (oldest first, so the
 * order of the others stays). */
HM_RUN static void stk_purge(nv_heap_t *h, const nv_slab_t *s) {
    nv_cls_t *cl = &h->cls[s->cls];
    nv_sent_t *top = stk_top(cl), *end = cl->stk + NV_STACK_CAP, *w = end;
    uint32_t n = stk_count(top);
    for (nv_sent_t *r = end; r-- > end - n;)
        if (r->s != s) *--w = *r;
    stk_set_top(cl, w);
    stat_add_i(&h->st_bytes, -(int64_t)(n - stk_count(w)) * cl->bsize);
}

/* Take stack entry e's block out of its slab's bitmap: its address, or 0
 * if its bit is not set (cannot be, nv_cls: the caller then drops the
 * entry). The entry names the block by index, so the bitmap update needs
 * no division; the address, one multiply, is off that chain. */
HM_INLINE uintptr_t stk_take(const nv_cls_t *cl, const nv_sent_t *e) {
    nv_slab_t *s = e->s;
    uint32_t idx = e->idx, w = idx >> 6;
    uint64_t x = s->bits[w];
    if (hm_unlikely(!bit_clear_old(&x, idx))) return 0;
    s->bits[w] = x;
    s->nfree--; /* a slab in the partial list may reach 0: see cls_refill */
    uintptr_t p = s->base + (uintptr_t)idx * cl->bsize; /* cl: a line at hand */
    if (!p) __builtin_unreachable(); /* a slab's base is never 0 (slab_acquire) */
    return p;
}

/* The newest stacked block of cl (h's), taken out of its slab's bitmap; 0
 * if the stack is empty. */
HM_INLINE uintptr_t stk_pop(nv_heap_t *h, nv_cls_t *cl) {
    nv_sent_t *t;
    while (!stk_at_end(t = stk_top(cl))) {
        stk_set_top(cl, t + 1);
        uintptr_t p = stk_take(cl, t);
        if (hm_likely(p)) return p;
        stat_add_i(&h->st_bytes, -(int64_t)cl->bsize); /* a stale entry: dropped */
    }
    return 0;
}

/* h has no block allocated last (nv_heap.last): last_bit 0 too, so that a
 * free of NULL, which then matches `last`, changes nothing (last_cl stays
 * a class of h). */
HM_INLINE void heap_forget_last(nv_heap_t *h) {
    h->last = 0;
    h->last_bit = 0;
}

/* Move the next word with free blocks of cl->cur (s) into cl->bits: the
 * first from s->scan on, cyclically. scan moves past each word taken, and
 * back to a lower word that a drain of remote frees fills (drain_word), so
 * that blocks freed remotely (whose owner allocates without freeing, the
 * producer of a producer/consumer pair) are reused lowest first and the
 * pages of the slab it touches stay few (address-ordered first fit, the
 * policy that keeps fragmentation lowest in Johnstone and Wilson, "The
 * memory fragmentation problem: solved?", ISMM 1998). Local frees leave scan
 * alone (the free-block stacks reuse those blocks first). */
HM_RUN static void take_word(nv_heap_t *h, nv_cls_t *cl, nv_slab_t *s) {
    uint32_t i = s->scan;
    while (!s->bits[i]) i = i + 1 == s->nwords ? 0 : i + 1;
    uint64_t w = s->bits[i];
    uint32_t n = popcount64(w);
    s->bits[i] = 0;
    s->nfree -= n;
    s->scan = i + 1 == s->nwords ? 0 : i + 1;
    if (i >= s->hw) s->hw = i + 1;
    stat_add_i(&h->st_bytes, (int64_t)n * s->bsize);
    cl_set(cl, w);
    cl->word = i;
    s->cur_word = i;
    cl->wbase = s->base + (uintptr_t)i * 64u * s->bsize;
}

/* Give cl's current slab back to the lists (its word's free bits too). */
HM_RUN static void cls_retire_cur(nv_heap_t *h, nv_cls_t *cl) {
    nv_slab_t *s = cl->cur;
    if (!s) return;
    uint64_t bits = cl_bits(cl);
    if (bits) {
        uint32_t n = popcount64(bits);
        s->bits[cl->word] |= bits;
        s->nfree += n;
        stat_add_i(&h->st_bytes, -(int64_t)n * s->bsize);
    }
    cl_set(cl, 0);
    cl->cur = NULL;
    cl->word = UINT32_MAX;
    slab_state(s, s->in_partial, 0);
    s->cur_word = UINT32_MAX;
    if (s->nfree == s->nblocks) {
        stk_purge(h, s);
        slab_release(h->nv, s);
    }
    else if (s->nfree) partial_push(cl, s);
}

/* ------------------------------------------------------------------------ */
/* Local free (owner of the slab)                                           */

static HM_NOINLINE hm_result_t double_free(const nv_slab_t *s, uint32_t idx) {
    HM_LOG_ERROR("native pool: double free of %p (block %u of the %u-byte slab at %p)",
                 (void *)(s->base + (uintptr_t)idx * s->bsize), idx, s->bsize, (void *)s->base);
    return HM_ERROR_DOUBLE_FREE;
}

/* double_free for a block known by its address. */
static HM_NOINLINE hm_result_t double_free_at(const nv_slab_t *s, uintptr_t p) {
    return double_free(s, slab_idx(s, p - s->base));
}

/* A free changed the state of s, which is not its class's current slab: it
 * was full (it joins the partial list) or it is now empty (it goes back to
 * the pool). */
HM_RUN static HM_NOINLINE void slab_transition(nv_heap_t *h, nv_cls_t *cl, nv_slab_t *s) {
    if (s->nfree == s->nblocks) {
        if (s->in_partial) partial_unlink(cl, s);
        nv_slab_t *cur = cl->cur;
        if (cur && s->hw > cur->hw && cur->hw < cur->nwords) {
            /* s has had more of its words in use than the current slab,
             * which would touch a word never used next: s becomes the
             * current slab (its blocks, stacked ones too, stay the
             * heap's), and the other goes back to the lists. The
             * allocations then reuse pages already touched: a slab taken
             * while the others were briefly full (a consumer's frees not
             * yet drained) serves only that overflow. */
            if (h->last_cl == cl) heap_forget_last(h); /* the word changes */
            cls_retire_cur(h, cl);
            cl->cur = s;
            slab_state(s, 0, 1); /* cur_word is set by take_word */
            s->scan = 0;   /* first fit (take_word) */
            return;
        }
        stk_purge(h, s);
        slab_release(h->nv, s);
    } else if (!s->in_partial) {
        partial_push(cl, s);
    }
}

typedef hm_result_t (*nv_other_fn)(void *p); /* see free_impl */

/* The owner's free of block p of s (valid, free not yet, not in the word
 * being handed out; free_general's and free_own's) that changes the slab's
 * state (see slab_transition). other (hm__native_free's): a slab going back
 * to the pool may call free, so that case goes there, unchanged; a full
 * slab joining the partial list calls nothing. */
HM_RUN
static HM_NOINLINE hm_result_t free_transition(nv_slab_t *s, uintptr_t p, nv_other_fn other) {
    nv_heap_t *h = s->owner;
    uint32_t idx = slab_idx(s, p - s->base);
    if (other && s->nfree + 1 == s->nblocks) return other((void *)p);
    s->bits[idx >> 6] |= (uint64_t)1 << (idx & 63);
    if (++s->nfree != s->nblocks) stk_push(s->cl, s, p, idx);
    else stat_add_i(&h->st_bytes, -(int64_t)s->bsize);
    slab_transition(h, s->cl, s);
    return HM_SUCCESS;
}

/* Free block idx of s by the slab's owner: into the word being handed
 * out when it is that word, else straight into the slab's bitmap (whichever
 * slab of the heap it is, so a random free takes no slow path). Returns
 * HM_SUCCESS or HM_ERROR_DOUBLE_FREE (logged). */
HM_INLINE hm_result_t free_own(nv_slab_t *s, uint32_t idx) {
    nv_cls_t *cl = s->cl;
    uint32_t w = idx >> 6;
    uint64_t bit = (uint64_t)1 << (idx & 63);
    if (s == cl->cur && w == cl->word) {
        /* The word's free blocks are in the class word; the double-free
         * test reads s->bits[w] too, as every test of the word (nv_cls). */
        uint64_t b = cl_bits(cl);
        if (hm_unlikely((b | s->bits[w]) & bit)) return double_free(s, idx);
        cl_set(cl, b | bit);
        return HM_SUCCESS;
    }
    uint64_t x = s->bits[w];
    if (hm_unlikely(x & bit)) return double_free(s, idx);
    uintptr_t p = s->base + (uintptr_t)idx * s->bsize;
    if (hm_unlikely(s != cl->cur && (!s->in_partial || s->nfree + 1 == s->nblocks)))
        return free_transition(s, p, NULL);
    s->bits[w] = x | bit;
    s->nfree++;
    stk_push(cl, s, p, idx);
    return HM_SUCCESS;
}
