/* hetmem — stream-ordered allocation over any pool (include/hetmem/stream.h).
 * SPDX-License-Identifier: MIT
 *
 * Each pool gets, at its first stream-ordered call, a cache of the blocks
 * freed on streams (ent_t):
 *   by stream   a slot per stream, its blocks newest first: an allocation
 *               on that stream takes one at once (stream order);
 *   by age      every block, oldest first: an allocation on another stream
 *               takes one whose event has completed, and blocks over the
 *               release threshold go back to the pool from here;
 *   by address  a hash of the pending pointers, so that a second free of
 *               one is refused (pool.c asks while the cache holds any).
 * A free records nothing: stream order alone makes a block safe for its
 * own stream. Only when another stream wants blocks of a stream (or the
 * cache must give them back: threshold, trim, destroy, out of memory, a
 * forgotten stream) is one event of the provider recorded on that stream;
 * it covers every block freed there since the last one (they were all
 * freed before it), so a stream costs one event per cross-stream demand,
 * not one per free. Events are shared (evref_t, counted) and recycled
 * through a free list (creating one is a driver call). PyTorch's CUDA
 * caching allocator likewise keeps blocks per stream and makes cross-stream
 * reuse wait for events (c10/cuda/CUDACachingAllocator.cpp,
 * insert_events / process_events).
 *
 * Lock: sc->lock (stream.h's table). Waiting for events (event_sync) and
 * calls into the pool happen with it released: blocks are first taken out
 * of every list under the lock. */
#include "stream/stream.h"

#include "platform/prim.h"

#include <hetmem/stream.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* An event recorded on a stream, shared by the blocks it covers. */
typedef struct evref {
    void *ev;
    unsigned refs;
} evref_t;

typedef struct ent {
    void *ptr;
    size_t size;  /* usable size (0: unknown, never reused, only given back) */
    void *stream; /* the stream it was freed on (NULL also names a stream) */
    bool has_stream; /* false once its stream was forgotten */
    evref_t *ev;  /* NULL: freed after the stream's last event (not covered yet) */
    struct ent *sprev, *snext; /* its stream's list */
    struct ent *aprev, *anext; /* the age list */
    struct ent *hnext;         /* the address hash */
    struct sslot *slot;
} ent_t;

typedef struct sslot {
    void *stream;
    ent_t *head; /* newest first */
} sslot_t;

struct hm_stream_pool {
    pthread_mutex_t lock;
    unsigned epoch; /* hm__prim_fork_epoch() when made or last reset */
    hm_pool_t *pool;
    hm_provider_t *prov;
    sslot_t *slots;
    size_t nslots, capslots;
    ent_t *oldest, *newest;
    ent_t **hash;
    size_t hcap, n;
    _Atomic size_t npending; /* n, readable without the lock (hm__stream_pending) */
    ent_t *spare; /* entries to reuse (through hnext), at most SPARE_MAX */
    size_t nspare;
    void **events; /* recorded and done with, or never recorded: reusable */
    size_t nevents, capevents;
    size_t bytes, threshold;
    uint64_t same, other, fresh, released, waits, recorded;
};
typedef struct hm_stream_pool spool_t;

/* ---- the cache ---- */

#define SPARE_MAX 1024

/* An entry for a new pending block (lock held): a spare one, else new. */
static ent_t *ent_get(spool_t *sc) {
    ent_t *e = sc->spare;
    if (!e) return calloc(1, sizeof(*e));
    sc->spare = e->hnext;
    sc->nspare--;
    memset(e, 0, sizeof(*e));
    return e;
}
static void ent_put(spool_t *sc, ent_t *e) {
    if (sc->nspare == SPARE_MAX) {
        free(e);
        return;
    }
    e->hnext = sc->spare;
    sc->spare = e;
    sc->nspare++;
}

static spool_t *cache_of(hm_pool_t *pool, bool make) {
    spool_t *sc = atomic_load_explicit(&pool->streams, memory_order_acquire);
    if (sc || !make) return sc;
    sc = calloc(1, sizeof(*sc));
    if (!sc) return NULL;
    pthread_mutex_init(&sc->lock, NULL);
    sc->pool = pool;
    sc->prov = pool->provider;
    sc->threshold = SIZE_MAX;
    sc->epoch = hm__prim_fork_epoch();
    spool_t *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&pool->streams, &expected, sc,
                                                 memory_order_acq_rel, memory_order_acquire)) {
        pthread_mutex_destroy(&sc->lock);
        free(sc);
        return expected;
    }
    return sc;
}

static void drop_all(spool_t *sc);

/* Lock the cache. In a fork child the blocks and events are the parent's
 * (their driver does not work here): forgotten, once. */
static void cache_lock(spool_t *sc) {
    unsigned epoch = hm__prim_fork_epoch();
    if (hm_unlikely(sc->epoch != epoch)) {
        /* The forking thread is the child's only one: no other user. */
        pthread_mutex_init(&sc->lock, NULL);
        drop_all(sc);
        sc->epoch = epoch;
    }
    hm__mutex_lock(&sc->lock);
}

static inline size_t hslot(const spool_t *sc, const void *p) {
    uint64_t z = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing (Knuth) */
    return (size_t)(z >> 32) & (sc->hcap - 1);
}

static ent_t *hfind(const spool_t *sc, const void *p) {
    if (!sc->hcap) return NULL;
    for (ent_t *e = sc->hash[hslot(sc, p)]; e; e = e->hnext)
        if (e->ptr == p) return e;
    return NULL;
}

static bool hgrow(spool_t *sc) {
    if (sc->n < sc->hcap) return true;
    size_t cap = sc->hcap ? 2 * sc->hcap : 64;
    ent_t **h = calloc(cap, sizeof(*h));
    if (!h) return false;
    ent_t **old = sc->hash;
    size_t oldcap = sc->hcap;
    sc->hash = h;
    sc->hcap = cap;
    for (size_t i = 0; i < oldcap; i++)
        for (ent_t *e = old[i], *nx; e; e = nx) {
            nx = e->hnext;
            size_t b = hslot(sc, e->ptr);
            e->hnext = h[b];
            h[b] = e;
        }
    free(old);
    return true;
}

static sslot_t *slot_find(spool_t *sc, void *stream) {
    for (size_t i = 0; i < sc->nslots; i++)
        if (sc->slots[i].stream == stream) return &sc->slots[i];
    return NULL;
}

static sslot_t *slot_get(spool_t *sc, void *stream) {
    sslot_t *s = slot_find(sc, stream);
    if (s) return s;
    if (sc->nslots == sc->capslots) {
        size_t cap = sc->capslots ? 2 * sc->capslots : 8;
        sslot_t *a = realloc(sc->slots, cap * sizeof(*a));
        if (!a) return NULL;
        /* Entries point at their slot: repoint them. */
        for (size_t i = 0; i < sc->nslots; i++)
            for (ent_t *e = a[i].head; e; e = e->snext) e->slot = &a[i];
        sc->slots = a;
        sc->capslots = cap;
    }
    s = &sc->slots[sc->nslots++];
    s->stream = stream;
    s->head = NULL;
    return s;
}

/* e out of every list and the hash (lock held). */
static void unlink_ent(spool_t *sc, ent_t *e) {
    if (e->slot) {
        if (e->sprev) e->sprev->snext = e->snext;
        else e->slot->head = e->snext;
        if (e->snext) e->snext->sprev = e->sprev;
        e->slot = NULL;
    }
    if (e->aprev) e->aprev->anext = e->anext;
    else sc->oldest = e->anext;
    if (e->anext) e->anext->aprev = e->aprev;
    else sc->newest = e->aprev;
    ent_t **pp = &sc->hash[hslot(sc, e->ptr)];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    sc->n--;
    atomic_store_explicit(&sc->npending, sc->n, memory_order_relaxed);
    sc->bytes -= e->size;
    if (!sc->n) hm__pool_hold_frees(sc->pool, false);
}

/* An event back to the free list (destroyed when the list has no room). */
static void event_put(spool_t *sc, void *ev) {
    if (sc->nevents == sc->capevents) {
        size_t cap = sc->capevents ? 2 * sc->capevents : 16;
        void **a = realloc(sc->events, cap * sizeof(*a));
        if (!a) {
            sc->prov->ops.stream.event_destroy(sc->prov->state, ev);
            return;
        }
        sc->events = a;
        sc->capevents = cap;
    }
    sc->events[sc->nevents++] = ev;
}

/* e no longer needs its event (lock held). */
static void ev_drop(spool_t *sc, ent_t *e) {
    evref_t *r = e->ev;
    e->ev = NULL;
    if (r && !--r->refs) {
        event_put(sc, r->ev);
        free(r);
    }
}

/* One event recorded on the stream of slot s now, covering every block of
 * s not yet covered (lock held). false: no event (the blocks stay
 * uncovered: never handed to another stream). */
static bool cover(spool_t *sc, sslot_t *s) {
    if (!s->head || s->head->ev) return true; /* nothing new since the last */
    const hm_provider_t *p = sc->prov;
    evref_t *r = calloc(1, sizeof(*r));
    if (!r) return false;
    hm_result_t res = HM_SUCCESS;
    void *ev = sc->nevents ? sc->events[--sc->nevents] : NULL;
    if (!ev) res = p->ops.stream.event_create(p->state, &ev);
    if (res == HM_SUCCESS) {
        res = p->ops.stream.event_record(p->state, ev, s->stream);
        if (res != HM_SUCCESS) event_put(sc, ev);
    }
    if (res != HM_SUCCESS) {
        free(r);
        HM_LOG_ERROR("stream cache of pool '%s': no event on stream %p (%s): its freed blocks "
                     "stay with it", sc->pool->ops.name, s->stream, hm_result_string(res));
        return false;
    }
    r->ev = ev;
    sc->recorded++;
    for (ent_t *e = s->head; e && !e->ev; e = e->snext) {
        e->ev = r;
        r->refs++;
    }
    return true;
}

/* Whether e's stream work is done (lock held): its event, recorded now if
 * it has none, has completed. */
static bool done(spool_t *sc, ent_t *e) {
    if (!e->ev && (!e->slot || !cover(sc, e->slot))) return false;
    if (!e->ev) return false;
    const hm_provider_t *p = sc->prov;
    return p->ops.stream.event_query(p->state, e->ev->ev) == HM_SUCCESS;
}

/* In a fork child: the parent's blocks and events are forgotten (never
 * freed nor destroyed: no driver call works here). */
static void drop_all(spool_t *sc) {
    if (sc->n) hm__pool_hold_frees(sc->pool, false);
    for (ent_t *e = sc->oldest, *nx; e; e = nx) {
        nx = e->anext;
        if (e->ev && !--e->ev->refs) free(e->ev);
        free(e);
    }
    sc->oldest = sc->newest = NULL;
    free(sc->slots);
    sc->slots = NULL;
    sc->nslots = sc->capslots = 0;
    if (sc->hash) memset(sc->hash, 0, sc->hcap * sizeof(*sc->hash));
    sc->n = 0;
    atomic_store_explicit(&sc->npending, 0, memory_order_relaxed);
    sc->bytes = 0;
    sc->nevents = 0;
}

/* Give a block back to the pool (no lock held). */
static void release_block(spool_t *sc, ent_t *e) {
    hm_result_t r = hm_pool_free(sc->pool, e->ptr);
    if (r != HM_SUCCESS)
        HM_LOG_ERROR("stream cache of pool '%s': giving %p back failed: %s", sc->pool->ops.name,
                     e->ptr, hm_result_string(r));
}

/* Blocks over the threshold whose events completed, oldest first, out of
 * the cache (lock held): returned as a list through anext, for the caller
 * to give back with the lock released. At most `budget` queries. */
static ent_t *collect_done(spool_t *sc, size_t budget) {
    ent_t *out = NULL;
    for (ent_t *e = sc->oldest, *nx; e && sc->bytes > sc->threshold && budget; e = nx, budget--) {
        nx = e->anext;
        if (!done(sc, e)) continue;
        unlink_ent(sc, e);
        ev_drop(sc, e);
        sc->released++;
        e->anext = out;
        out = e;
    }
    return out;
}

static void release_list(spool_t *sc, ent_t *list) {
    for (ent_t *e = list, *nx; e; e = nx) {
        nx = e->anext;
        release_block(sc, e);
        free(e);
    }
}

/* Everything out of the cache, waited for and given back (no lock held on
 * entry). Returns how many blocks. */
static size_t release_all(spool_t *sc) {
    cache_lock(sc);
    for (size_t i = 0; i < sc->nslots; i++) (void)cover(sc, &sc->slots[i]);
    ent_t *list = sc->oldest;
    for (ent_t *e = list; e; e = e->anext) e->slot = NULL;
    sc->oldest = sc->newest = NULL;
    for (size_t i = 0; i < sc->nslots; i++) sc->slots[i].head = NULL;
    if (sc->hash) memset(sc->hash, 0, sc->hcap * sizeof(*sc->hash));
    bool had = sc->n != 0;
    sc->n = 0;
    atomic_store_explicit(&sc->npending, 0, memory_order_relaxed);
    sc->bytes = 0;
    hm__mutex_unlock(&sc->lock);
    if (had) hm__pool_hold_frees(sc->pool, false);
    const hm_provider_t *p = sc->prov;
    size_t count = 0;
    size_t waits = 0;
    for (ent_t *e = list; e; e = e->anext) {
        count++;
        /* One wait per event: the blocks it covers are neighbours in age. */
        if (e->anext && e->anext->ev == e->ev) continue;
        if (!e->ev) {
            HM_LOG_ERROR("stream cache of pool '%s': %p has no event (its stream could not "
                         "record one): given back without waiting", sc->pool->ops.name, e->ptr);
            continue;
        }
        waits++;
        hm_result_t r = p->ops.stream.event_sync(p->state, e->ev->ev);
        if (r != HM_SUCCESS)
            HM_LOG_ERROR("stream cache of pool '%s': waiting for the event of %p failed (%s): "
                         "the block is given back all the same", sc->pool->ops.name, e->ptr,
                         hm_result_string(r));
    }
    cache_lock(sc);
    sc->waits += waits;
    sc->released += count;
    for (ent_t *e = list; e; e = e->anext) ev_drop(sc, e);
    hm__mutex_unlock(&sc->lock);
    for (ent_t *e = list, *nx; e; e = nx) {
        nx = e->anext;
        release_block(sc, e);
        free(e);
    }
    return count;
}

static bool check_pool(hm_pool_t *pool, const char *call) {
    if (!pool) {
        HM_LOG_ERROR("%s: pool is NULL", call);
        return false;
    }
    if (!(pool->provider->info.caps & HM_PROVIDER_CAP_STREAMS)) {
        HM_LOG_ERROR("%s(%s): provider '%s' has no streams", call, pool->ops.name,
                     pool->provider->info.name);
        return false;
    }
    return true;
}

/* ---- the calls ---- */

/* Whether a cached block of `have` usable bytes serves `size`: big enough,
 * and not more than twice the size or a provider page more (a pool rounds
 * small sizes to its own granularity: a proxy pool to the page). */
static inline bool fits(const spool_t *sc, size_t have, size_t size) {
    return have >= size && (have / 2 <= size || have - size <= sc->prov->info.min_page_size);
}

/* A cached block for size on stream (lock held): one freed on stream, else
 * one of another stream whose event completed. */
static ent_t *take_block(spool_t *sc, size_t size, void *stream, bool *same) {
    sslot_t *s = slot_find(sc, stream);
    unsigned scan = 0;
    if (s)
        for (ent_t *e = s->head; e && scan < 32; e = e->snext, scan++)
            if (fits(sc, e->size, size)) {
                *same = true;
                return e;
            }
    scan = 0;
    for (ent_t *e = sc->oldest; e && scan < 16; e = e->anext) {
        if (!fits(sc, e->size, size) || (e->slot && e->slot->stream == stream)) continue;
        scan++; /* a query (and at most one record) per candidate */
        if (done(sc, e)) {
            *same = false;
            return e;
        }
    }
    return NULL;
}

void *hm_pool_malloc_async(hm_pool_t *pool, size_t size, void *stream) {
    if (!check_pool(pool, "hm_pool_malloc_async")) {
        errno = pool ? ENOTSUP : EINVAL;
        return NULL;
    }
    if (!size) {
        errno = EINVAL;
        return NULL;
    }
    spool_t *sc = cache_of(pool, true);
    if (sc) {
        cache_lock(sc);
        bool same = false;
        ent_t *e = take_block(sc, size, stream, &same);
        ent_t *done = NULL;
        void *got = NULL;
        if (e) {
            unlink_ent(sc, e);
            ev_drop(sc, e);
            if (same) sc->same++;
            else sc->other++;
            got = e->ptr;
            ent_put(sc, e);
        } else {
            sc->fresh++;
        }
        if (sc->bytes > sc->threshold) done = collect_done(sc, 8);
        hm__mutex_unlock(&sc->lock);
        release_list(sc, done);
        if (got) return got;
    }
    void *p = hm_pool_malloc(pool, size);
    if (p || errno != ENOMEM || !sc) return p;
    /* Out of memory while blocks wait for their events: wait, give them
     * back, try once more. */
    if (release_all(sc)) p = hm_pool_malloc(pool, size);
    if (!p) errno = ENOMEM;
    return p;
}

hm_result_t hm_pool_free_async(hm_pool_t *pool, void *ptr, void *stream) {
    if (!ptr) return HM_SUCCESS;
    if (!check_pool(pool, "hm_pool_free_async"))
        return pool ? HM_ERROR_NOT_SUPPORTED : HM_ERROR_INVALID_ARGUMENT;
    /* A pool that validates pointers itself answers usable_size 0 for any
     * pointer not a live block of its own; the others: the tracker. */
    bool validates = (pool->ops.flags & HM_POOL_OPS_VALIDATES_POINTERS) && pool->ops.usable_size;
    if (pool->tracked && !validates) {
        hm_pool_t *owner = hm_pool_by_ptr(ptr);
        if (owner != pool) {
            HM_LOG_ERROR("hm_pool_free_async(%s): %p is not a block of this pool",
                         pool->ops.name, ptr);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    }
    /* A pending block is still allocated to the pool: its size is known. */
    size_t size = pool->ops.usable_size ? pool->ops.usable_size(pool->state, ptr) : 0;
    if (pool->ops.usable_size && !size) {
        HM_LOG_ERROR("hm_pool_free_async(%s): %p is not a live block of this pool",
                     pool->ops.name, ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    spool_t *sc = cache_of(pool, true);
    if (!sc) return HM_ERROR_OUT_OF_HOST_MEMORY;
    cache_lock(sc);
    ent_t *e = ent_get(sc);
    if (!e) {
        hm__mutex_unlock(&sc->lock);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (hfind(sc, ptr)) {
        ent_put(sc, e);
        hm__mutex_unlock(&sc->lock);
        HM_LOG_ERROR("hm_pool_free_async(%s): %p is already pending on a stream (double free)",
                     pool->ops.name, ptr);
        return HM_ERROR_DOUBLE_FREE;
    }
    sslot_t *s = slot_get(sc, stream);
    if (!s || !hgrow(sc)) {
        ent_put(sc, e);
        hm__mutex_unlock(&sc->lock);
        HM_LOG_ERROR("hm_pool_free_async(%s): no memory to keep %p: the block is still the "
                     "caller's", pool->ops.name, ptr);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    e->ptr = ptr;
    e->size = size;
    e->stream = stream;
    e->has_stream = true;
    e->slot = s;
    e->snext = s->head;
    if (s->head) s->head->sprev = e;
    s->head = e;
    e->aprev = sc->newest;
    if (sc->newest) sc->newest->anext = e;
    else sc->oldest = e;
    sc->newest = e;
    size_t b = hslot(sc, ptr);
    e->hnext = sc->hash[b];
    sc->hash[b] = e;
    if (!sc->n++) hm__pool_hold_frees(pool, true);
    atomic_store_explicit(&sc->npending, sc->n, memory_order_relaxed);
    sc->bytes += size;
    ent_t *done = sc->bytes > sc->threshold ? collect_done(sc, 8) : NULL;
    hm__mutex_unlock(&sc->lock);
    release_list(sc, done);
    return HM_SUCCESS;
}

hm_result_t hm_pool_set_release_threshold(hm_pool_t *pool, size_t bytes) {
    if (!check_pool(pool, "hm_pool_set_release_threshold"))
        return pool ? HM_ERROR_NOT_SUPPORTED : HM_ERROR_INVALID_ARGUMENT;
    spool_t *sc = cache_of(pool, true);
    if (!sc) return HM_ERROR_OUT_OF_HOST_MEMORY;
    cache_lock(sc);
    sc->threshold = bytes;
    ent_t *done = collect_done(sc, SIZE_MAX);
    hm__mutex_unlock(&sc->lock);
    release_list(sc, done);
    return HM_SUCCESS;
}

hm_result_t hm_pool_stream_forget(hm_pool_t *pool, void *stream) {
    if (!check_pool(pool, "hm_pool_stream_forget"))
        return pool ? HM_ERROR_NOT_SUPPORTED : HM_ERROR_INVALID_ARGUMENT;
    spool_t *sc = cache_of(pool, false);
    if (!sc) return HM_SUCCESS;
    cache_lock(sc);
    sslot_t *s = slot_find(sc, stream);
    if (s) {
        /* The stream is going away: its blocks get their event while it
         * still exists (without one they could never be reused). */
        (void)cover(sc, s);
        for (ent_t *e = s->head; e; e = e->snext) {
            e->slot = NULL;
            e->has_stream = false;
            e->sprev = NULL;
        }
        /* The last slot takes its place. */
        size_t i = (size_t)(s - sc->slots);
        sc->slots[i] = sc->slots[--sc->nslots];
        if (i < sc->nslots)
            for (ent_t *e = sc->slots[i].head; e; e = e->snext) e->slot = &sc->slots[i];
    }
    hm__mutex_unlock(&sc->lock);
    return HM_SUCCESS;
}

hm_result_t hm_pool_get_stream_stats(hm_pool_t *pool, hm_stream_stats_t *st) {
    if (!pool || !st) {
        HM_LOG_ERROR("hm_pool_get_stream_stats: %s is NULL", !pool ? "pool" : "stats");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    memset(st, 0, sizeof(*st));
    st->threshold = SIZE_MAX;
    spool_t *sc = cache_of(pool, false);
    if (!sc) return HM_SUCCESS;
    cache_lock(sc);
    st->cached_bytes = sc->bytes;
    st->cached_blocks = sc->n;
    st->threshold = sc->threshold;
    st->same_stream = sc->same;
    st->other_stream = sc->other;
    st->from_pool = sc->fresh;
    st->released = sc->released;
    st->waits = sc->waits;
    st->events = sc->recorded;
    hm__mutex_unlock(&sc->lock);
    return HM_SUCCESS;
}

/* ---- pool.c's hooks ---- */

/* Nothing pending (the common case once the cache exists): no lock. A
 * free racing with a stream-ordered free of the same block is the
 * program's double free either way. */
bool hm__stream_pending(hm_pool_t *pool, const void *ptr) {
    spool_t *sc = cache_of(pool, false);
    if (!sc || !atomic_load_explicit(&sc->npending, memory_order_relaxed)) return false;
    cache_lock(sc);
    bool found = hfind(sc, ptr) != NULL;
    hm__mutex_unlock(&sc->lock);
    return found;
}

void hm__stream_pool_trim(hm_pool_t *pool) {
    spool_t *sc = cache_of(pool, false);
    if (sc) (void)release_all(sc);
}

void hm__stream_pool_destroy(hm_pool_t *pool) {
    spool_t *sc = cache_of(pool, false);
    if (!sc) return;
    if (sc->epoch == hm__prim_fork_epoch()) {
        (void)release_all(sc);
        const hm_provider_t *p = sc->prov;
        for (size_t i = 0; i < sc->nevents; i++) p->ops.stream.event_destroy(p->state, sc->events[i]);
    } else {
        drop_all(sc); /* a fork child: the parent's */
    }
    for (ent_t *e = sc->spare, *nx; e; e = nx) {
        nx = e->hnext;
        free(e);
    }
    pthread_mutex_destroy(&sc->lock);
    free(sc->events);
    free(sc->slots);
    free(sc->hash);
    free(sc);
    atomic_store_explicit(&pool->streams, NULL, memory_order_release);
}
