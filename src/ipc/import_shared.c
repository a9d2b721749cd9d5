/* hetmem — IPC, import side: shared mappings (one driver mapping per handle
 * per device context, shared by the pools over that context).
 * SPDX-License-Identifier: MIT
 *
 * Part of import.c's one translation unit (import.c includes it, after the
 * entries and the close helpers it uses, before retire and the evictor that
 * use it); not compiled on its own. */

/* ------------------------------------------------------------------------ */
/* shared mappings                                                          */
/*
 * Providers that name a driver context (ipc_context != 0) map a handle once
 * per context, so pools over providers of one family and one context share
 * one mapping of it. An smap per (context, family, exporter pid, nonce,
 * remote base, allocation id, size); its members are the entries (one per
 * importing pool) that use it. The driver's open happens once, through the
 * provider of the first member, and its close once, through the provider
 * of the last member to leave. The mapping's tracker record belongs to one
 * member's pool (owner) and moves to another member's pool
 * (hm__tracker_rehome) when the owner's entry leaves, so hm_pool_by_ptr()
 * never names a pool that no longer holds the mapping.
 *
 *   state    OPENING (the first member's driver open is in flight), READY,
 *            CLOSING (the last member's driver close is in flight). An
 *            open that meets OPENING or CLOSING waits on shared_maps.cv: a handle is
 *            never in two driver opens of one context at once, nor opened
 *            while it closes.
 *   members  shared_maps.lock. A listed member's entry is not recycled (it leaves
 *            first), and its pool is alive (a destroy makes its entries
 *            leave before it frees the pool's IPC state).
 *   Lock order: shared_maps.lock -> pi->lock -> opened.lock. No provider call is made
 *   under shared_maps.lock (opens and closes run in the OPENING/CLOSING states).
 * Each pool's entry counts in the cache's bound on its own (a mapping
 * shared by two pools counts twice). */
enum { SM_OPENING, SM_READY, SM_CLOSING };
typedef struct smap {
    uint64_t ctx, pid, nonce, rbase, alloc_id, size;
    uint32_t family;
    int state;
    uintptr_t local;
    hm_pool_t *owner; /* holds the tracker record (READY) */
    imp_t **mem;      /* members: mem_inline or the heap */
    size_t n, cap;
    imp_t *mem_inline[2];
    struct smap *knext, *lnext;
    bool in_local;
} smap_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    smap_t **kb, **lb; /* chained hashes by key and by local base: cap buckets */
    size_t cap, n;
} shared_maps = {.lock = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static inline size_t sm_kslot(uint64_t ctx, uint64_t pid, uint64_t nonce, uint64_t rbase) {
    return hm__ipc_mix64(key_hash(pid, nonce, rbase) ^ ctx) & (shared_maps.cap - 1);
}
static inline size_t sm_lslot(uintptr_t local) { return hm__ipc_mix64(local) & (shared_maps.cap - 1); }

static smap_t *sm_find(uint64_t ctx, const hm_wire_t *w) {
    if (!shared_maps.cap) return NULL;
    for (smap_t *m = shared_maps.kb[sm_kslot(ctx, w->pid, w->nonce, w->base)]; m; m = m->knext)
        if (m->ctx == ctx && m->family == w->family && m->pid == w->pid &&
            m->nonce == w->nonce && m->rbase == w->base && m->alloc_id == w->alloc_id &&
            m->size == w->size)
            return m;
    return NULL;
}
static smap_t *sm_lfind(uintptr_t local) {
    if (!shared_maps.cap) return NULL;
    for (smap_t *m = shared_maps.lb[sm_lslot(local)]; m; m = m->lnext)
        if (m->local == local) return m;
    return NULL;
}
static void sm_kunlink(smap_t *m) {
    smap_t **p = &shared_maps.kb[sm_kslot(m->ctx, m->pid, m->nonce, m->rbase)];
    while (*p != m) p = &(*p)->knext;
    *p = m->knext;
    shared_maps.n--;
}
static void sm_lunlink(smap_t *m) {
    if (!m->in_local) return;
    smap_t **p = &shared_maps.lb[sm_lslot(m->local)];
    while (*p != m) p = &(*p)->lnext;
    *p = m->lnext;
    m->in_local = false;
}
/* Room for one more (false: out of memory). */
static bool sm_grow(void) {
    if (shared_maps.n < shared_maps.cap) return true;
    size_t cap = shared_maps.cap ? shared_maps.cap * 2 : 64;
    smap_t **kb = calloc(cap, sizeof(*kb)), **lb = calloc(cap, sizeof(*lb));
    if (!kb || !lb) {
        free(kb);
        free(lb);
        return shared_maps.cap && shared_maps.n < shared_maps.cap * 4; /* longer chains, still correct */
    }
    size_t old = shared_maps.cap;
    smap_t **okb = shared_maps.kb, **olb = shared_maps.lb;
    shared_maps.kb = kb;
    shared_maps.lb = lb;
    shared_maps.cap = cap;
    for (size_t i = 0; i < old; i++) {
        for (smap_t *m = okb[i], *nx; m; m = nx) {
            nx = m->knext;
            size_t b = sm_kslot(m->ctx, m->pid, m->nonce, m->rbase);
            m->knext = kb[b];
            kb[b] = m;
        }
        for (smap_t *m = olb[i], *nx; m; m = nx) {
            nx = m->lnext;
            size_t b = sm_lslot(m->local);
            m->lnext = lb[b];
            lb[b] = m;
        }
    }
    free(okb);
    free(olb);
    return true;
}
static bool sm_add_member(smap_t *m, imp_t *e) {
    if (m->n == m->cap) {
        size_t cap = m->cap * 2;
        imp_t **a = malloc(cap * sizeof(*a));
        if (!a) return false;
        memcpy(a, m->mem, m->n * sizeof(*a));
        if (m->mem != m->mem_inline) free(m->mem);
        m->mem = a;
        m->cap = cap;
    }
    m->mem[m->n++] = e;
    e->map = m;
    return true;
}
static void sm_free(smap_t *m) {
    if (m->mem != m->mem_inline) free(m->mem);
    free(m);
}

/* Join e (a fresh entry of an importing pool whose provider names context
 * ctx) to the shared mapping of handle w: *local is the mapping's address
 * when there is one (nothing to open); else *local is 0 and *made is a new
 * OPENING mapping whose only member is e: the caller opens the handle and
 * calls map_ready, or map_abort if that fails. */
static hm_result_t map_join(uint64_t ctx, const hm_wire_t *w, imp_t *e, smap_t **made,
                            uintptr_t *local) {
    *made = NULL;
    *local = 0;
    hm__mutex_lock(&shared_maps.lock);
    smap_t *m;
    while ((m = sm_find(ctx, w)) && m->state != SM_READY)
        if (pthread_cond_wait(&shared_maps.cv, &shared_maps.lock) != 0) HM_DIE("pthread_cond_wait failed");
    if (m) {
        bool ok = sm_add_member(m, e);
        if (ok) *local = m->local;
        hm__mutex_unlock(&shared_maps.lock);
        return ok ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    m = sm_grow() ? calloc(1, sizeof(*m)) : NULL;
    if (!m) {
        hm__mutex_unlock(&shared_maps.lock);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    m->ctx = ctx;
    m->family = w->family;
    m->pid = w->pid;
    m->nonce = w->nonce;
    m->rbase = w->base;
    m->alloc_id = w->alloc_id;
    m->size = w->size;
    m->state = SM_OPENING;
    m->mem = m->mem_inline;
    m->cap = 2;
    (void)sm_add_member(m, e); /* inline room */
    size_t b = sm_kslot(ctx, w->pid, w->nonce, w->base);
    m->knext = shared_maps.kb[b];
    shared_maps.kb[b] = m;
    shared_maps.n++;
    hm__mutex_unlock(&shared_maps.lock);
    *made = m;
    return HM_SUCCESS;
}

/* The first member's open succeeded: the mapping is at local, tracked for pool. */
static void map_ready(smap_t *m, uintptr_t local, hm_pool_t *pool) {
    hm__mutex_lock(&shared_maps.lock);
    m->local = local;
    m->owner = pool;
    m->state = SM_READY;
    size_t b = sm_lslot(local);
    m->lnext = shared_maps.lb[b];
    shared_maps.lb[b] = m;
    m->in_local = true;
    pthread_cond_broadcast(&shared_maps.cv);
    hm__mutex_unlock(&shared_maps.lock);
}

/* The first member's open failed: the mapping never existed. */
static void map_abort(smap_t *m) {
    hm__mutex_lock(&shared_maps.lock);
    sm_kunlink(m);
    m->mem[0]->map = NULL;
    pthread_cond_broadcast(&shared_maps.cv);
    hm__mutex_unlock(&shared_maps.lock);
    sm_free(m);
}

/* e (out of its pool's hashes, or never in them) leaves its shared
 * mapping. Returns the mapping, now CLOSING, when e was its last member:
 * the caller closes it (tracker and driver) and then calls map_closed;
 * NULL when other pools still hold it (if e's pool held the tracker record,
 * it moves to one of theirs). */
static smap_t *map_leave(imp_t *e) {
    smap_t *m = e->map;
    hm_pool_t *pool = e->pi->pool;
    hm__mutex_lock(&shared_maps.lock);
    size_t i = 0;
    while (m->mem[i] != e) i++;
    m->mem[i] = m->mem[--m->n];
    e->map = NULL;
    if (m->n) {
        if (m->owner == pool) {
            hm_pool_t *heir = m->mem[0]->pi->pool;
            hm_result_t r = hm__tracker_rehome(m->local, (size_t)m->size, &heir->index, heir,
                                               heir->provider);
            if (r != HM_SUCCESS)
                HM_LOG_ERROR("IPC: the shared mapping [%p, +%llu) could not move to pool '%s' "
                             "(%s): it stays mapped but untracked until that pool lets go",
                             (void *)m->local, (unsigned long long)m->size, heir->ops.name,
                             hm_result_string(r));
            m->owner = heir;
        }
        m = NULL;
    } else {
        m->state = SM_CLOSING;
    }
    hm__mutex_unlock(&shared_maps.lock);
    return m;
}

/* The last member closed m: forget it, and let waiting opens through. */
static void map_closed(smap_t *m) {
    hm__mutex_lock(&shared_maps.lock);
    sm_kunlink(m);
    sm_lunlink(m);
    pthread_cond_broadcast(&shared_maps.cv);
    hm__mutex_unlock(&shared_maps.lock);
    sm_free(m);
}

/* e's mapping out of the cache (no lock held; e out of its pool's hashes
 * and still the caller's): its own mapping closed, or its place in a shared
 * one given up (closed when it was the last). */
static void unmap_entry(imp_t *e) {
    hm_pool_t *pool = e->pi->pool;
    uintptr_t local = e->local;
    size_t size = (size_t)e->size;
    if (!e->map) {
        close_mapping(pool, local, size);
        return;
    }
    smap_t *m = map_leave(e);
    if (m) {
        close_mapping(pool, local, size);
        map_closed(m);
    }
}

/* Fork: shared_maps.lock is taken first (it comes before every pool lock). The
 * child drops the mappings whose open or close was in flight in a thread
 * that does not exist there (phase: 0 prepare, 1 parent, 2 child). */
void hm__ipc_import_share_atfork(int phase) {
    if (phase == 0) {
        hm__mutex_lock(&shared_maps.lock);
        return;
    }
    if (phase == 2) {
        for (size_t i = 0; i < shared_maps.cap; i++) {
            for (smap_t *m = shared_maps.kb[i], *nx; m; m = nx) {
                nx = m->knext;
                if (m->state == SM_READY) continue;
                for (size_t k = 0; k < m->n; k++) m->mem[k]->map = NULL;
                sm_kunlink(m);
                sm_lunlink(m);
                sm_free(m);
            }
        }
        pthread_cond_init(&shared_maps.cv, NULL);
    }
    hm__mutex_unlock(&shared_maps.lock);
}

