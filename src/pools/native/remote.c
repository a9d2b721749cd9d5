/* hetmem — the native pool: remote frees (batches, the outgoing slots,
 * publishing, the owner's drain).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Remote frees                                                             */

/* The size (index of nv_heap.stock) of a batch of cap entries, or of the
 * smallest that holds n entries. */
HM_INLINE unsigned batch_size_of(uint32_t n) {
    return (unsigned)(n > NV_BATCH_SMALL) + (unsigned)(n > NV_BATCH_MID);
}

/* An empty batch of size big (batch_size_of); NULL: out of host memory. */
HM_RUN static nv_batch_t *batch_get(nv_heap_t *h, unsigned big) {
    nv_batch_t *b = h->stock[big];
    if (!b) {
        nv_pool_t *nv = h->nv;
        hm__mutex_lock(&nv->depot_lock);
        for (unsigned n = 0; n < NV_STOCK_MOVE && nv->depot[big]; n++) {
            b = nv->depot[big];
            nv->depot[big] = b->link;
            b->link = h->stock[big];
            h->stock[big] = b;
            h->nstock[big]++;
        }
        if (!h->stock[big]) {
            /* Whole cache lines: the freeing thread writes it, the owner
             * reads it. */
            uint32_t cap = big == 0 ? NV_BATCH_SMALL : big == 1 ? NV_BATCH_MID : NV_BATCH_CAP;
            b = meta_alloc(nv, sizeof(*b) + cap * sizeof(nv_rent_t), META_BATCH);
            if (b) {
                b->cap = cap;
                b->link = NULL;
                h->stock[big] = b;
                h->nstock[big]++;
            }
        }
        hm__mutex_unlock(&nv->depot_lock);
        b = h->stock[big];
        if (!b) return NULL;
    }
    h->stock[big] = b->link;
    h->nstock[big]--;
    cds_wfcq_node_init(&b->node);
    b->count = 0;
    b->nfrees = 0;
    return b;
}

HM_RUN static void batch_put(nv_heap_t *h, nv_batch_t *b) {
    unsigned big = batch_size_of(b->cap);
    b->link = h->stock[big];
    h->stock[big] = b;
    if (++h->nstock[big] < NV_STOCK_MAX) return;
    nv_pool_t *nv = h->nv;
    hm__mutex_lock(&nv->depot_lock);
    while (h->nstock[big] > NV_STOCK_MAX - NV_STOCK_MOVE) {
        b = h->stock[big];
        h->stock[big] = b->link;
        h->nstock[big]--;
        b->link = nv->depot[big];
        nv->depot[big] = b;
    }
    hm__mutex_unlock(&nv->depot_lock);
}

/* o's batch, small or middle, has no room for another entry: move its
 * entries into one of the next size (its cached entry settled by the
 * caller). NULL: out of host memory (o unchanged). */
HM_RUN static nv_batch_t *batch_grow(nv_heap_t *h, nv_out_t *o) {
    unsigned big = batch_size_of(o->b->cap) + 1;
    nv_batch_t *s = o->b, *b = batch_get(h, big);
    if (!b) return NULL;
    memcpy(b->ent, s->ent, s->count * sizeof(nv_rent_t));
    b->count = s->count;
    b->nfrees = s->nfrees;
    batch_put(h, s);
    o->b = b;
    h->batch_start = big;
    return b;
}

/* What a remote free of a bsize-byte block counts towards NV_FLUSH_EVERY
 * beyond 1: its size in KiB, rounded up, less 1 (0 up to 1 KiB, so the
 * common case adds nothing: callers test bsize > 1024 first). */
HM_INLINE uint32_t flush_extra(uint32_t bsize) { return ((bsize + 1023) >> 10) - 1; }

/* Leave h's cached entry (nv_heap.r_key): the frees merged into it on the
 * fast path are counted into its batch and the flush bound. */
HM_INLINE void out_settle(nv_heap_t *h) {
    if (!h->r_key) return;
    uint32_t used = h->r_base - h->r_left;
    h->r_b->nfrees += used;
    h->out_pending += used; /* blocks up to 1 KiB: 1 each (remote_free) */
    h->r_key = 0;
    h->r_span = 0;
}

HM_RUN static void publish(nv_heap_t *h, nv_out_t *o) {
    out_settle(h);
    nv_batch_t *b = o->b;
    nv_heap_t *dest = o->dest;
    o->b = NULL;
    unsigned need = batch_size_of(b->count);
    if (need < batch_size_of(b->cap)) h->batch_start = need; /* a smaller one would have done */
    stat_add_u(&h->st_published, b->nfrees);
    if (h->nv->queue == HM_NATIVE_QUEUE_WFCQ) {
        NV_TSAN_RELEASE(b);
        cds_wfcq_enqueue(&dest->rq_head, &dest->rq_tail, &b->node);
    } else {
        hm__mutex_lock(&dest->mq_lock);
        b->link = atomic_load_explicit(&dest->mq_list, memory_order_relaxed);
        atomic_store_explicit(&dest->mq_list, b, memory_order_relaxed);
        hm__mutex_unlock(&dest->mq_lock);
    }
}

HM_RUN static void flush_all(nv_heap_t *h) {
    out_settle(h);
    for (unsigned i = 0; i < NV_OUT_SLOTS; i++)
        if (h->out[i].b) publish(h, &h->out[i]);
    h->out_pending = 0;
}

/* The outgoing slot of a destination heap (direct-mapped). */
HM_INLINE size_t out_slot(const nv_heap_t *dest) {
    return (size_t)(((uintptr_t)dest * 0x9E3779B97F4A7C15ull) >> 58) & (NV_OUT_SLOTS - 1);
}

/* The outgoing batch slot for dest: two-way set-associative (slot and its
 * neighbour), so that two destinations hashing to one slot do not evict each
 * other on every free (which would publish batches of one). */
HM_RUN static nv_out_t *out_pick(nv_heap_t *h, nv_heap_t *dest) {
    size_t i = out_slot(dest);
    nv_out_t *a = &h->out[i], *b = &h->out[i ^ 1];
    if (a->b && a->dest == dest) return a;
    if (b->b && b->dest == dest) return b;
    if (!a->b) return a;
    if (!b->b) return b;
    publish(h, a);
    return a;
}

static HM_NOINLINE hm_result_t remote_double_free(const nv_slab_t *s, uint32_t idx) {
    HM_LOG_ERROR("native pool: double free of %p (block %u of the %u-byte slab at %p, remote, "
                 "twice in one batch)", (void *)(s->base + (uintptr_t)idx * s->bsize), idx,
                 s->bsize, (void *)s->base);
    return HM_ERROR_DOUBLE_FREE;
}

/* Free block idx of s (another heap's slab, live) from h: into h's outgoing
 * batch for the owner, merged with that batch's entry for the same bitmap
 * word when it has one (nv_out.ix); the entry becomes h's cached one (nv_heap.r_key), so the
 * next frees into that word take nv_free's fast path. Statistics are the
 * caller's. */
HM_RUN static hm_result_t remote_free(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
    nv_pool_t *nv = h->nv;
    uint32_t sub = idx & 63;
    uint64_t bit = (uint64_t)1 << sub;
    uintptr_t wbase = s->base + (uintptr_t)(idx - sub) * s->bsize;
    out_settle(h);
    nv_out_t *o = out_pick(h, s->owner);
    nv_batch_t *b = o->b;
    if (!b) {
        b = o->b = batch_get(h, h->batch_start);
        if (hm_unlikely(!b)) goto oom;
        o->dest = s->owner;
    }
    /* The word's entry in the batch, if it has one (nv_out.ix). */
    uint8_t *ix = &o->ix[(size_t)((wbase * 0x9E3779B97F4A7C15ull) >> 59) & (NV_OUT_IX - 1)];
    uint32_t i = (uint32_t)*ix - 1; /* UINT32_MAX: none */
    nv_rent_t *e;
    if (i < b->count && (e = &b->ent[i])->wbase == wbase) {
        if (hm_unlikely(e->mask & bit)) return remote_double_free(s, idx);
        e->mask |= bit;
    } else {
        /* Only a small or middle batch runs out of entries: a large one has
         * room for every free, and is published when its frees reach
         * batch_cap. */
        if (hm_unlikely(b->count == b->cap) && !(b = batch_grow(h, o))) goto oom;
        e = &b->ent[b->count++];
        e->wbase = wbase;
        e->mask = bit;
        *ix = (uint8_t)b->count;
    }
    b->nfrees++;
    h->out_pending++;
    if (hm_unlikely(s->bsize > 1024)) h->out_pending += flush_extra(s->bsize);
    if (b->nfrees >= nv->batch_cap) {
        publish(h, o);
    } else if (h->out_pending >= NV_FLUSH_EVERY) {
        flush_all(h);
    } else if (hm_likely(s->bsize <= 1024)) {
        /* The entry becomes the cached one: its next frees count 1 each
         * (out_settle). A larger block's frees each come here instead, to
         * be counted in full. */
        uint32_t left = nv->batch_cap - b->nfrees, fl = NV_FLUSH_EVERY - h->out_pending;
        h->r_key = wbase;
        h->r_span = (uintptr_t)(s->nblocks - (idx - sub) < 64 ? s->nblocks - (idx - sub) : 64) *
                    s->bsize;
        h->r_magic = (s->magic >> 32) + 1; /* see cached_free */
        h->r_bsize = s->bsize;
        h->r_ent = e;
        h->r_b = b;
        h->r_left = h->r_base = left < fl ? left : fl;
    }
    return HM_SUCCESS;
oom:
    HM_LOG_ERROR("native pool: out of host memory for a remote free of %p",
                 (void *)(s->base + (uintptr_t)idx * s->bsize));
    return HM_ERROR_OUT_OF_HOST_MEMORY;
}

/* remote_free's common case, which calls nothing (so that its caller
 * needs no stack frame): the free joins an outgoing batch that exists, with
 * room for its entry, and neither publishes that batch nor reaches the
 * flush bound; its bytes leave h's statistics. 0: not that case (or a
 * double free in the batch), and nothing changed but the cached entry
 * settled (out_settle, which remote_free repeats harmlessly): the caller
 * calls remote_free. */
HM_INLINE int remote_free_quick(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
    nv_heap_t *dest = s->owner;
    size_t i = out_slot(dest);
    nv_out_t *o = &h->out[i];
    if (!o->b || o->dest != dest) {
        o = &h->out[i ^ 1];
        if (!o->b || o->dest != dest) return 0;
    }
    uint32_t bsize = s->bsize, sub = idx & 63;
    uint32_t units = hm_likely(bsize <= 1024) ? 1 : 1 + flush_extra(bsize);
    out_settle(h);
    nv_batch_t *b = o->b;
    uint32_t nfrees = b->nfrees + 1, pending = h->out_pending + units;
    const uint32_t cap = h->nv->batch_cap;
    if (hm_unlikely(nfrees >= cap || pending >= NV_FLUSH_EVERY)) return 0;
    uint64_t bit = (uint64_t)1 << sub;
    uintptr_t wbase = s->base + (uintptr_t)(idx - sub) * bsize;
    uint8_t *ix = &o->ix[(size_t)((wbase * 0x9E3779B97F4A7C15ull) >> 59) & (NV_OUT_IX - 1)];
    uint32_t k = (uint32_t)*ix - 1; /* UINT32_MAX: none */
    nv_rent_t *e;
    if (k < b->count && (e = &b->ent[k])->wbase == wbase) {
        if (hm_unlikely(e->mask & bit)) return 0;
        e->mask |= bit;
    } else {
        if (hm_unlikely(b->count == b->cap)) return 0;
        e = &b->ent[b->count++];
        e->wbase = wbase;
        e->mask = bit;
        *ix = (uint8_t)b->count;
    }
    b->nfrees = nfrees;
    h->out_pending = pending;
    if (hm_likely(bsize <= 1024)) { /* the entry becomes the cached one: see remote_free */
        uint32_t left = cap - nfrees, fl = NV_FLUSH_EVERY - pending;
        uint32_t rest = s->nblocks - (idx - sub);
        h->r_key = wbase;
        h->r_span = (uintptr_t)(rest < 64 ? rest : 64) * bsize;
        h->r_magic = (s->magic >> 32) + 1; /* see cached_free */
        h->r_bsize = bsize;
        h->r_ent = e;
        h->r_b = b;
        h->r_left = h->r_base = left < fl ? left : fl;
    }
    stat_add_i(&h->st_bytes, -(int64_t)bsize);
    return 1;
}

/* Free the blocks of mask (bits of word w of s, a slab of h) into h, as
 * free_own does block by block: a bit already free is a double free (logged,
 * skipped). Returns 1 if s may have gone back to the pool (the caller must
 * not read it again). */
static HM_NOINLINE void drain_dups(const nv_slab_t *s, uint32_t w, uint64_t dup) {
    while (dup) {
        uint32_t i = (uint32_t)__builtin_ctzll(dup);
        dup &= dup - 1;
        /* s is still h's: the log reads only its immutable fields. */
        HM_LOG_ERROR("native pool: double free of %p (block %u of the %u-byte slab at %p, "
                     "remote)", (void *)(s->base + ((uintptr_t)w * 64 + i) * s->bsize),
                     w * 64 + i, s->bsize, (void *)s->base);
    }
}

HM_INLINE int drain_word(nv_heap_t *h, nv_slab_t *s, uint32_t w, uint64_t mask) {
    nv_cls_t *cl = s->cl;
    uint64_t dup;
    int gone = 0;
    if (s == cl->cur && w == cl->word) {
        /* Free bits of the word are in the class word (nv_cls: the test
         * reads s->bits[w] too). */
        uint64_t b = cl_bits(cl);
        dup = (b | s->bits[w]) & mask;
        cl_set(cl, b | (mask & ~dup));
        /* Blocks coming back into a class word: see nv_heap.st_bytes. */
        stat_add_i(&h->st_bytes, (int64_t)popcount64(mask & ~dup) * s->bsize);
    } else {
        uint64_t x = s->bits[w];
        dup = x & mask;
        s->bits[w] = x | mask;
        if (w < s->scan) s->scan = w; /* first fit: see take_word */
        uint32_t n = s->nfree += popcount64(mask & ~dup);
        if (hm_unlikely(s != cl->cur && (!s->in_partial || n == s->nblocks))) {
            gone = n == s->nblocks;
            slab_transition(h, cl, s);
        }
    }
    if (hm_unlikely(dup)) drain_dups(s, w, dup);
    return gone;
}

static HM_NOINLINE void drain_bad(const nv_rent_t *e, const char *why) {
    for (uint64_t m = e->mask; m; m &= m - 1)
        HM_LOG_ERROR("native pool: remote free of a block of the word at %p (bit %u) %s",
                     (void *)e->wbase, (unsigned)__builtin_ctzll(m), why);
}

/* Free the entries of one drained batch into h. Consecutive entries are
 * often of one slab: the last slab found is tried before the page map. The
 * freeing side checked each block; the owner checks again that the slab is
 * its own and the word a word of it (a double free may have raced with the
 * slab going back to the pool). */
HM_RUN static void drain_batch(nv_heap_t *h, nv_batch_t *b) {
    nv_pool_t *nv = h->nv;
    nv_slab_t *s = NULL;
    uintptr_t lo = 0, span = 0;
    uint64_t magic = 0;
    uint32_t nblocks = 0;
    const uint32_t count = b->count;
    for (uint32_t i = 0; i < count; i++) {
        const nv_rent_t *e = &b->ent[i];
        uintptr_t off = e->wbase - lo;
        if (off >= span) {
            s = map_get(nv, (void *)e->wbase);
            if (hm_unlikely(!s || s->owner != h)) {
                drain_bad(e, "reached a heap that does not own it (double free?)");
                span = 0;
                continue;
            }
            /* Fixed while the slab is live (nv_slab_t): kept in registers. */
            lo = s->base;
            span = s->span;
            magic = s->magic;
            nblocks = s->nblocks;
            off = e->wbase - lo;
        }
        int exact;
        uint32_t idx = magic_div(off, magic, &exact); /* as block_index() */
        uint64_t mask = e->mask;
        if (hm_unlikely(!exact || idx >= nblocks || (idx & 63) ||
                        (nblocks - idx < 64 && (mask >> (nblocks - idx))))) {
            drain_bad(e, "is not a block of its slab (double free?)");
            continue;
        }
        if (drain_word(h, s, idx >> 6, mask)) span = 0; /* s went back to the pool */
    }
    stat_add_u(&h->st_drained, b->nfrees);
    batch_put(h, b);
}

/* May h's remote queue hold something? (owner only; a cheap look: the
 * queue head's next is set once a first node is linked.) */
HM_INLINE int drain_pending(nv_heap_t *h) {
    if (h->nv->queue == HM_NATIVE_QUEUE_WFCQ)
        return __atomic_load_n(&h->rq_head.node.next, __ATOMIC_RELAXED) != NULL ||
               h->priv_head.node.next != NULL;
    return atomic_load_explicit(&h->mq_list, memory_order_relaxed) != NULL;
}

/* Drain h's remote queue (owner only). Returns the blocks freed. */
HM_RUN static size_t drain(nv_heap_t *h) {
    size_t n = 0;
    if (h->nv->queue == HM_NATIVE_QUEUE_WFCQ) {
        /* A cheap look first: head.next is set once a first node is linked. */
        if (__atomic_load_n(&h->rq_head.node.next, __ATOMIC_RELAXED) != NULL)
            __cds_wfcq_splice_nonblocking(&h->priv_head, &h->priv_tail, &h->rq_head,
                                          &h->rq_tail);
        for (;;) {
            struct cds_wfcq_node *node =
                __cds_wfcq_dequeue_nonblocking(&h->priv_head, &h->priv_tail);
            if (!node || node == CDS_WFCQ_WOULDBLOCK) break; /* in flight: next time */
            nv_batch_t *b = hm_container_of(node, nv_batch_t, node);
            NV_TSAN_ACQUIRE(b);
            n += b->nfrees;
            drain_batch(h, b);
        }
    } else if (atomic_load_explicit(&h->mq_list, memory_order_relaxed)) {
        hm__mutex_lock(&h->mq_lock);
        nv_batch_t *b = atomic_load_explicit(&h->mq_list, memory_order_relaxed);
        atomic_store_explicit(&h->mq_list, NULL, memory_order_relaxed);
        hm__mutex_unlock(&h->mq_lock);
        while (b) {
            nv_batch_t *next = b->link;
            n += b->nfrees;
            drain_batch(h, b);
            b = next;
        }
    }
    return n;
}
