/* hetmem — the jemalloc pool: one arena of a private jemalloc per pool, with
 * extent hooks over the pool's provider and per-(thread, pool) tcaches.
 * SPDX-License-Identifier: MIT
 *
 * The design and its contract are in include/hetmem/pools/jemalloc.h; how the
 * private jemalloc is built is in cmake/HmJemalloc.cmake. Facts of jemalloc
 * 5.3.0 this file relies on (read in its source, src/ctl.c, src/base.c,
 * src/extent.c, src/tcache.c):
 * - experimental.arenas_create_ext takes an arena_config_t
 *   {extent_hooks_t *extent_hooks; bool metadata_use_hooks;}; with
 *   metadata_use_hooks false the arena's base allocator (arena_t, edata_t,
 *   ...) maps host memory with the default hooks instead of ours.
 * - arenas.create/arenas_create_ext reuse the index of a destroyed arena.
 * - arena.<i>.destroy requires every tcache used with the arena to be flushed
 *   first; it calls dalloc or destroy for every extent the arena holds.
 * - After a successful purge_forced hook jemalloc treats the range as zeroed.
 * - The private build runs without "retain" (cmake/HmJemalloc.cmake says
 *   why): the alloc hook is asked for what an extent needs, neighbours are
 *   coalesced only within one arena (through the merge hook), and decayed
 *   extents go to the dalloc hook; refused ones are purged and kept. */
#include "pool_internal.h"
#include "addr_width.h"
#include "fork.h"
#include "je_fast.h"

#include <hetmem/pools/jemalloc.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The private build's API is hidden in libhetmem: say so at every use. */
#define JEMALLOC_EXPORT __attribute__((visibility("hidden")))
#include <hm_jemalloc/jemalloc.h>

/* jemalloc 5.3.0's arena_config_t (include/jemalloc/internal/arena_types.h),
 * which its public header does not carry. The private build is pinned to
 * 5.3.0 (cmake/HmJemalloc.cmake checks the tarball's SHA-256). */
typedef struct je_arena_config {
    extent_hooks_t *extent_hooks;
    bool metadata_use_hooks;
} je_arena_config_t;

#define JE_PAGE ((size_t)4096) /* --with-lg-page=12 */

/* ---- the pool ---- */

typedef struct tc_node tc_node_t;

/* Invariants: `hooks` is first touched by jemalloc after arenas_create_ext
 * and last by arena.<i>.destroy, both in this pool's init/fini; the hooks get
 * the pool back with container_of. `tcaches` lists every explicit tcache made
 * for this pool (one per thread that used it); it and `slot` are guarded by
 * g_lock. */
typedef struct jpool {
    hm_je_key_t key;  /* first: the ops' state is &key (je_fast.h) */
    extent_hooks_t hooks;
    hm_pool_t *pool;
    unsigned arena;
    int arena_flags;  /* MALLOCX_ARENA(arena) */
    bool cpu;         /* the CPU may touch the memory */
    bool can_fill, can_copy; /* else: the provider's fill and copy (HM_PROVIDER_CAP_FILL/COPY) */
    bool can_free;    /* the provider takes memory back */
    bool can_purge_lazy, can_purge_force;
    size_t page;      /* the provider's page size */
    bool use_tcache;
    unsigned slot;    /* index in g_slots (= key.slot) */
    uint64_t gen;     /* unique per pool creation, never 0 (= key.gen) */
    tc_node_t *tcaches;
    /* The provider ranges (see "provider ranges"), guarded by range_lock. */
    pthread_mutex_t range_lock;
    struct prange **range_tab; /* range_nb buckets, a power of two */
    size_t range_nb, range_n;
    _Atomic bool high_logged; /* the alloc hook refused memory above its width */
} jpool_t;

/* One explicit tcache of the pool. `tcache` is jemalloc's tcache_t of `tc`
 * as its thread last saw it (NULL while there is none, as after a flush),
 * for get_stats: written by that thread under g_lock, read by get_stats
 * under g_lock. So a tcache get_stats reads stays alive meanwhile: jp_trim
 * flushes it only after clearing `tcache` under g_lock, and thread exit and
 * pool destroy destroy it under g_lock together with the node. */
struct tc_node {
    tc_node_t *next, **prevp;
    unsigned tc;
    void *tcache;
};

/* ---- the registry of pools and per-thread caches ----
 *
 * A thread keeps, per pool slot, the generation of the pool it made a tcache
 * for and the mallocx flags to use. A slot is reused after its pool is
 * destroyed; the generation tells a stale entry from a live one, so no thread
 * ever writes another thread's table. */

typedef hm_je_tl_entry_t tl_entry_t; /* .flags: arena | tcache flags; .node: a
                                       * tc_node_t, NULL without a tcache */
typedef hm_je_tl_table_t tl_table_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static jpool_t **g_slots;     /* live pools by slot, NULL = free */
static unsigned g_nslots;     /* slots in use or freed (high-water mark) */
static unsigned g_slots_cap;
static uint64_t g_next_gen = 1;
static unsigned g_live;       /* live pools */
static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_once_failed;

/* The thread's table is je_fast.c's (hm__je_fast_tl), next to jemalloc's
 * thread data. Not initial-exec: one initial-exec access anywhere in
 * libhetmem.so puts the module's whole TLS block, jemalloc's 2.6 KiB tsd
 * included, in glibc's static TLS, which a dlopen()ed library cannot get.
 * This file is compiled with -mtls-dialect=gnu2 (TLS descriptors: a static
 * offset when the library is loaded at start-up). */
static __thread bool tl_exiting;
/* Set by the extent alloc hook when it refuses provider memory above
 * HM_JEMALLOC_ADDR_BITS, or the front-end refuses it (the tracker's width).
 * jemalloc calls the alloc hook only inside an allocating call, on its
 * thread: the slow paths clear it before mallocx/rallocx, and one that
 * returns NULL reports HM_ERROR_NOT_SUPPORTED rather than OUT_OF_MEMORY when
 * it is set (hook_result). */
static __thread bool tl_hook_refused;

/* The result of a mallocx/rallocx that returned NULL. */
static hm_result_t hook_result(void) {
    return tl_hook_refused ? HM_ERROR_NOT_SUPPORTED : HM_ERROR_OUT_OF_MEMORY;
}

/* ---- fork ----
 * Lock order: g_lock, then jemalloc's locks (tcache.destroy runs under
 * g_lock), then the pools' range_locks, the tracker's and providers' (the
 * extent hooks run under jemalloc's locks); g_init_lock stands alone. Four
 * slots of the library's fork list hold them in that order (fork.h:
 * JEMALLOC_POOLS, JEMALLOC, JEMALLOC_RANGES, JEMALLOC_INIT), after the
 * native pools' and before IPC's and the tracker's. jemalloc's own handlers
 * (jemalloc_prefork and its postfork pair) are the JEMALLOC slot: the
 * private build's pthread_atfork call is renamed to the function below
 * (cmake/HmJemalloc.cmake), which keeps them; once_init fills the slot with
 * them once jemalloc has set itself up. */
typedef void (*fork_fn)(void);
static hm_fork_hooks_t g_je_hooks;

int hm__jemalloc_pthread_atfork(fork_fn prepare, fork_fn parent, fork_fn child);
int hm__jemalloc_pthread_atfork(fork_fn prepare, fork_fn parent, fork_fn child) {
    /* jemalloc 5.3.0 makes this call once, in its set-up. */
    if (g_je_hooks.prepare) {
        HM_LOG_ERROR("jemalloc pool: jemalloc registered fork handlers twice");
        return EBUSY;
    }
    g_je_hooks = (hm_fork_hooks_t){prepare, parent, child};
    return 0;
}

/* The JEMALLOC_POOLS slot: g_lock; in the child the forking thread, which
 * holds it, releases it (its table stays valid). */
static void atfork_prepare(void) { hm__mutex_lock(&g_lock); }
static void atfork_parent(void) { hm__mutex_unlock(&g_lock); }
static void atfork_child(void) {
    /* The parent's other threads are gone and glibc reuses their control
     * blocks: forget their by_tp entries (je_fast.h). */
    uintptr_t tp = hm_je_thread_tp();
    for (unsigned i = 0; i < g_nslots; i++) {
        if (!g_slots[i]) continue;
        hm_je_key_t *key = &g_slots[i]->key;
        for (unsigned j = 0; j < HM_JE_BY_TP; j++)
            if (atomic_load_explicit(&key->by_tp.tp[j], memory_order_relaxed) != tp)
                atomic_store_explicit(&key->by_tp.tp[j], 0, memory_order_relaxed);
        if (atomic_load_explicit(&key->own_tp, memory_order_relaxed) != tp)
            atomic_store_explicit(&key->own_tp, 0, memory_order_relaxed);
    }
    hm__mutex_unlock(&g_lock);
}
static const hm_fork_hooks_t g_pool_hooks = {atfork_prepare, atfork_parent, atfork_child};

/* The JEMALLOC_RANGES slot: every live pool's range_lock, taken inside the
 * extent hooks, that is under jemalloc's locks: its prepare runs after
 * jemalloc's has taken every jemalloc lock (no hook can be running) and
 * while g_lock (the slots) is held. Without it a child forked while another
 * thread was inside a hook waited forever on the range_lock that thread
 * held. */
static void ranges_lock_all(void) {
    for (unsigned i = 0; i < g_nslots; i++)
        if (g_slots[i]) hm__mutex_lock(&g_slots[i]->range_lock);
}
static void ranges_unlock_all(void) {
    for (unsigned i = 0; i < g_nslots; i++)
        if (g_slots[i]) hm__mutex_unlock(&g_slots[i]->range_lock);
}
static const hm_fork_hooks_t g_ranges_hooks = {ranges_lock_all, ranges_unlock_all,
                                               ranges_unlock_all};

static bool je_tcache_destroy(unsigned tc) {
    int e = hm_je_mallctl("tcache.destroy", NULL, NULL, &tc, sizeof(tc));
    if (e) HM_LOG_ERROR("jemalloc pool: tcache.destroy(%u) failed: %s", tc, strerror(e));
    return e == 0;
}

/* Thread exit: destroy this thread's tcaches of live pools (flushing their
 * blocks back to the arenas). Calls made later by this thread (other TLS
 * destructors) run without a tcache. */
static void tl_destructor(void *arg) {
    tl_table_t *t = arg;
    tl_exiting = true;
    *hm__je_fast_tl() = NULL;
    if (!t) return;
    hm__mutex_lock(&g_lock);
    for (unsigned i = 0; i < t->cap; i++) {
        tl_entry_t *e = &t->e[i];
        if (!e->gen || !e->node) continue;
        if (i < g_nslots && g_slots[i] && g_slots[i]->gen == e->gen) {
            /* Free the pool's by_tp slot before this thread's pointer can be
             * another thread's (je_fast.h). */
            hm_je_key_release_mine(&g_slots[i]->key);
            tc_node_t *n = (tc_node_t *)e->node;
            je_tcache_destroy(n->tc);
            *n->prevp = n->next;
            if (n->next) n->next->prevp = n->prevp;
            free(n);
        }
    }
    hm__mutex_unlock(&g_lock);
    free(t->e);
    free(t);
}

/* jemalloc sets itself up at its first call, the mallctl in once_init (its
 * load-time constructor is taken out of the private build: see
 * cmake/HmJemalloc.cmake), in whichever thread creates the first jemalloc
 * pool, while other threads may fork. Its own fork handlers are known only
 * after that call, so g_init_lock keeps fork() out of it: a child never
 * inherits jemalloc's mutexes held by a set-up that does not go on in the
 * child (the child's pthread_once runs once_init again, and jemalloc's
 * set-up would wait on them forever). It is the JEMALLOC_INIT slot, filled
 * before that call; its place is after this file's other slots (it is held
 * only around that call, which takes none of their locks). */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static void init_lock(void) { hm__mutex_lock(&g_init_lock); }
static void init_unlock(void) { hm__mutex_unlock(&g_init_lock); }
static const hm_fork_hooks_t g_init_hooks = {init_lock, init_unlock, init_unlock};

/* Has jemalloc set itself up? (Tests: its set-up hands its fork handlers
 * to hm__jemalloc_pthread_atfork.) */
int hm__jemalloc_started(void);
int hm__jemalloc_started(void) { return g_je_hooks.prepare != NULL; }

/* No lock of the library is held here (jp_init): filling a slot waits for a
 * fork in progress. */
static void once_init(void) {
    if (pthread_key_create(&g_key, tl_destructor) != 0) {
        g_once_failed = 1;
        return;
    }
    hm__fork_enable(HM_FORK_JEMALLOC_INIT, &g_init_hooks);
    /* jemalloc's first call: its set-up; its handlers are known after it. */
    const char *version = NULL;
    size_t sz = sizeof(version);
    init_lock();
    (void)hm_je_mallctl("version", &version, &sz, NULL, 0);
    init_unlock();
    hm__fork_enable(HM_FORK_JEMALLOC_POOLS, &g_pool_hooks);
    if (g_je_hooks.prepare) hm__fork_enable(HM_FORK_JEMALLOC, &g_je_hooks);
    hm__fork_enable(HM_FORK_JEMALLOC_RANGES, &g_ranges_hooks);
}

/* Take a thread-pointer word of the pool (by_tp slot or own_tp) for this
 * thread unless another live thread holds it (je_fast.h); true if the caller
 * holds it now. */
static bool tp_claim(_Atomic uintptr_t *slot, uintptr_t tp) {
    uintptr_t free_tp = 0;
    uintptr_t cur = atomic_load_explicit(slot, memory_order_relaxed);
    if (cur) return cur == tp;
    return atomic_compare_exchange_strong_explicit(slot, &free_tp, tp, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

/* Take the pool's own line and this thread's by_tp slot where free; true if
 * the caller took either now. The caller then fills them
 * (hm__je_fast_tcache_refresh). */
static bool by_tp_claim(jpool_t *jp) {
    uintptr_t tp = hm_je_thread_tp();
    if (!tp) return false;
    bool own = hm_je_own_mine(&jp->key), mine = hm_je_by_tp_mine(&jp->key) >= 0;
    bool took = !own && tp_claim(&jp->key.own_tp, tp);
    took |= !mine && tp_claim(&jp->key.by_tp.tp[hm_je_tp_slot(tp)], tp);
    return took;
}

/* The flags for this thread on this pool: its tcache, made on first use. */
static HM_NOINLINE int flags_slow(jpool_t *jp) {
    int none = jp->arena_flags | MALLOCX_TCACHE_NONE;
    if (!jp->use_tcache || tl_exiting) return none;
    tl_table_t **tlp = hm__je_fast_tl();
    tl_table_t *t = *tlp;
    if (!t) {
        t = calloc(1, sizeof(*t));
        if (!t) return none;
        if (pthread_setspecific(g_key, t) != 0) {
            free(t);
            return none;
        }
        *tlp = t;
    }
    if (jp->slot >= t->cap) {
        unsigned cap = t->cap ? t->cap : 8;
        while (cap <= jp->slot) cap *= 2;
        tl_entry_t *ne = realloc(t->e, cap * sizeof(*ne));
        if (!ne) return none;
        memset(ne + t->cap, 0, (cap - t->cap) * sizeof(*ne));
        t->e = ne;
        t->cap = cap;
    }
    tl_entry_t *e = &t->e[jp->slot];
    /* A stale entry (a destroyed pool that had this slot) is just replaced:
     * that pool's destroy already destroyed its tcache. */
    e->gen = 0;
    e->node = NULL;
    e->tcache = NULL;
    e->tc = HM_JE_NO_TCACHE;
    tc_node_t *n = malloc(sizeof(*n));
    unsigned tc = 0;
    size_t sz = sizeof(tc);
    int err = n ? hm_je_mallctl("tcache.create", &tc, &sz, NULL, 0) : ENOMEM;
    if (err) {
        free(n);
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            HM_LOG_WARN("jemalloc pool: no explicit tcache (%s); this thread uses pool '%s' "
                        "without a cache (jemalloc allows 4093 tcaches per process)",
                        strerror(err), hm_pool_name(jp->pool));
        e->gen = jp->gen;
        e->flags = none;
        return none;
    }
    n->tc = tc;
    e->node = n;
    e->tc = tc;
    by_tp_claim(jp);
    hm__je_fast_tcache_refresh(&jp->key, e);
    n->tcache = e->tcache;
    hm__mutex_lock(&g_lock);
    n->next = jp->tcaches;
    n->prevp = &jp->tcaches;
    if (jp->tcaches) jp->tcaches->prevp = &n->next;
    jp->tcaches = n;
    hm__mutex_unlock(&g_lock);
    e->flags = jp->arena_flags | MALLOCX_TCACHE(tc);
    e->gen = jp->gen;
    return e->flags;
}

/* The caller's tcache of e, as get_stats is to see it (its node's
 * `tcache`; only the caller writes it). */
static void tc_publish(tl_entry_t *e) {
    tc_node_t *n = e->node;
    if (!n || n->tcache == e->tcache) return;
    hm__mutex_lock(&g_lock);
    n->tcache = e->tcache;
    hm__mutex_unlock(&g_lock);
}

/* After a slow-path call: the fast paths and get_stats may use the tcache
 * again (it is re-created by jemalloc after the flush in jp_trim), and a
 * thread takes the pool's own line or its by_tp slot if either has become
 * free. */
static inline void tcache_refresh(jpool_t *jp) {
    tl_table_t *t = *hm__je_fast_tl();
    if (!t || jp->slot >= t->cap || t->e[jp->slot].gen != jp->gen || !t->e[jp->slot].node)
        return;
    tl_entry_t *e = &t->e[jp->slot];
    bool claimed = (hm_je_by_tp_mine(&jp->key) < 0 ||
                    atomic_load_explicit(&jp->key.own_tp, memory_order_relaxed) == 0) &&
                   by_tp_claim(jp);
    if (claimed || !e->tcache) {
        hm__je_fast_tcache_refresh(&jp->key, e);
        tc_publish(e);
    }
}

HM_INLINE int flags_of(jpool_t *jp) {
    tl_table_t *t = *hm__je_fast_tl();
    if (hm_likely(t && jp->slot < t->cap && t->e[jp->slot].gen == jp->gen))
        return t->e[jp->slot].flags;
    return flags_slow(jp);
}

/* ---- provider ranges ----
 * Every range the alloc hook got from the provider is recorded here (and, by
 * hm_pool_provider_alloc, in the tracker) exactly as allocated. jemalloc
 * splits and merges its extents inside a range freely: the split and merge
 * hooks only refuse a merge across the start of a range, so every extent lies
 * inside one range, the tracker never has to split or merge (hm_pool_by_ptr
 * answers for every byte of a range throughout), and the provider needs no
 * split/merge of its own. A range goes back to the provider when jemalloc
 * deallocates it whole (after decay, or hm_pool_trim); pieces are purged and
 * kept by jemalloc for reuse; the rest goes back at pool destroy. A merge
 * across two arenas cannot happen: without retain jemalloc checks the arena of
 * every neighbour (cmake/HmJemalloc.cmake says why retain is off). */

typedef struct prange {
    struct prange *next;
    uintptr_t base;
    size_t size;
} prange_t;

static size_t range_bucket(uintptr_t base, size_t nb) {
    /* Fibonacci hashing of the page number (Knuth, TAOCP vol. 3, 6.4). */
    return (size_t)(((uint64_t)(base >> 12) * 0x9e3779b97f4a7c15ull) >> 32) & (nb - 1);
}

static bool range_add(jpool_t *jp, void *base, size_t size) {
    prange_t *c = malloc(sizeof(*c));
    if (!c) return false;
    c->base = (uintptr_t)base;
    c->size = size;
    hm__mutex_lock(&jp->range_lock);
    if (jp->range_n >= 2 * jp->range_nb) { /* grow; keep the old table on failure */
        size_t nb = jp->range_nb ? 2 * jp->range_nb : 64;
        prange_t **t = calloc(nb, sizeof(*t));
        if (t) {
            for (size_t i = 0; i < jp->range_nb; i++)
                for (prange_t *x = jp->range_tab[i], *next; x; x = next) {
                    next = x->next;
                    size_t k = range_bucket(x->base, nb);
                    x->next = t[k];
                    t[k] = x;
                }
            free(jp->range_tab);
            jp->range_tab = t;
            jp->range_nb = nb;
        } else if (!jp->range_nb) {
            hm__mutex_unlock(&jp->range_lock);
            free(c);
            return false;
        }
    }
    size_t k = range_bucket(c->base, jp->range_nb);
    c->next = jp->range_tab[k];
    jp->range_tab[k] = c;
    jp->range_n++;
    hm__mutex_unlock(&jp->range_lock);
    return true;
}

/* The range that starts at base (NULL if none). Caller holds range_lock. */
static prange_t **range_find(jpool_t *jp, uintptr_t base) {
    if (!jp->range_nb) return NULL;
    prange_t **pp = &jp->range_tab[range_bucket(base, jp->range_nb)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->base == base) return pp;
    return NULL;
}

static bool range_starts_at(jpool_t *jp, void *base) {
    hm__mutex_lock(&jp->range_lock);
    bool found = range_find(jp, (uintptr_t)base) != NULL;
    hm__mutex_unlock(&jp->range_lock);
    return found;
}

/* Remove the range [base, base+size) if it is one whole range. */
static bool range_take(jpool_t *jp, void *base, size_t size) {
    bool found = false;
    hm__mutex_lock(&jp->range_lock);
    prange_t **pp = range_find(jp, (uintptr_t)base);
    if (pp && (*pp)->size == size) {
        prange_t *c = *pp;
        *pp = c->next;
        free(c);
        jp->range_n--;
        found = true;
    }
    hm__mutex_unlock(&jp->range_lock);
    return found;
}

/* Pool destroy, after the arena is gone: every range back to the provider
 * (where it can free; otherwise the front-end forgets them). */
static void range_release_all(jpool_t *jp) {
    for (size_t i = 0; i < jp->range_nb; i++)
        for (prange_t *x = jp->range_tab[i], *next; x; x = next) {
            next = x->next;
            if (jp->can_free &&
                hm_pool_provider_free(jp->pool, (void *)x->base, x->size) != HM_SUCCESS)
                HM_LOG_WARN("jemalloc pool '%s': could not free [%p, +%zu) to the provider",
                            hm_pool_name(jp->pool), (void *)x->base, x->size);
            free(x);
        }
    free(jp->range_tab);
    jp->range_tab = NULL;
    jp->range_nb = jp->range_n = 0;
}

/* ---- extent hooks: jemalloc's view of the provider ----
 * Each returns false on success (jemalloc's convention) and never logs on
 * success. */

static inline jpool_t *jp_of(extent_hooks_t *h) { return hm_container_of(h, jpool_t, hooks); }

/* Provider memory that reaches 2^HM_JEMALLOC_ADDR_BITS (addr_width.h): the
 * private jemalloc is built with that LG_VADDR and ignores a key's higher
 * bits, so an extent there would alias one below in its extent map. Given
 * back; logged once per pool (jemalloc may ask again at every allocation). */
static HM_NOINLINE void *refuse_high(jpool_t *jp, void *p, size_t size) {
    bool freed = hm_pool_provider_free(jp->pool, p, size) == HM_SUCCESS;
    if (!atomic_exchange_explicit(&jp->high_logged, true, memory_order_relaxed))
        HM_LOG_ERROR("jemalloc pool '%s': provider memory [%p, +%zu) reaches beyond the %d-bit "
                     "addresses of jemalloc's extent map; refused%s",
                     hm_pool_name(jp->pool), p, size, HM_JEMALLOC_ADDR_BITS,
                     freed ? "" : " (the provider cannot take it back: unused until destroy)");
    tl_hook_refused = true;
    return NULL;
}

static void *h_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment, bool *zero,
                     bool *commit, unsigned arena_ind) {
    (void)arena_ind;
    jpool_t *jp = jp_of(h);
    /* Providers cannot place memory at a chosen address (jemalloc asks when
     * growing a large block in place): decline, jemalloc moves it instead. */
    if (new_addr) return NULL;
    if (*zero && !jp->cpu && !jp->can_fill) return NULL; /* cannot zero device memory */
    void *p = NULL;
    hm_result_t r = hm_pool_provider_alloc(jp->pool, size, alignment > JE_PAGE ? alignment : 0, &p);
    if (r != HM_SUCCESS) {
        if (r == HM_ERROR_NOT_SUPPORTED) tl_hook_refused = true; /* e.g. beyond the tracker */
        return NULL;
    }
    if (hm_unlikely(!hm__range_below((uintptr_t)p, size, HM_JEMALLOC_ADDR_BITS)))
        return refuse_high(jp, p, size);
    /* The provider does not promise zeroed memory: zero it when asked, by
     * the CPU (below) or, on memory the CPU may not touch, the provider. */
    if (*zero && !jp->cpu &&
        hm_provider_fill(hm_pool_get_provider(jp->pool), p, 0, size) != HM_SUCCESS) {
        if (hm_pool_provider_free(jp->pool, p, size) != HM_SUCCESS)
            HM_LOG_WARN("jemalloc pool '%s': [%p, +%zu) kept after its provider failed to zero "
                        "it", hm_pool_name(jp->pool), p, size);
        return NULL;
    }
    if (!range_add(jp, p, size)) {
        if (hm_pool_provider_free(jp->pool, p, size) != HM_SUCCESS)
            HM_LOG_WARN("jemalloc pool '%s': [%p, +%zu) kept after running out of host memory",
                        hm_pool_name(jp->pool), p, size);
        return NULL;
    }
    if (*zero && jp->cpu) memset(p, 0, size);
    *commit = true; /* provider memory is always usable */
    return p;
}

static bool h_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed,
                     unsigned arena_ind) {
    (void)committed, (void)arena_ind;
    jpool_t *jp = jp_of(h);
    if (!jp->can_free) return true; /* jemalloc keeps it for reuse */
    if (!range_take(jp, addr, size)) return true; /* a piece: purged and kept */
    if (hm_pool_provider_free(jp->pool, addr, size) == HM_SUCCESS) return false;
    if (!range_add(jp, addr, size))
        HM_LOG_ERROR("jemalloc pool '%s': lost the record of [%p, +%zu)", hm_pool_name(jp->pool),
                     addr, size);
    return true;
}

/* Arena destroy: the ranges are released together afterwards. */
static void h_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed,
                      unsigned arena_ind) {
    (void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
}

static bool h_commit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
                     unsigned arena_ind) {
    (void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
    return false; /* provider memory is committed while allocated */
}

/* Purge [addr+offset, +length) through the provider, whole provider pages
 * only (a provider with pages above 4 KiB is left alone on smaller pieces). */
static bool purge(jpool_t *jp, void *addr, size_t offset, size_t length, bool force) {
    if (!(force ? jp->can_purge_force : jp->can_purge_lazy)) return true;
    char *p = (char *)addr + offset;
    if (((uintptr_t)p | length) & (jp->page - 1)) return true;
    return hm_pool_provider_purge(jp->pool, p, length, force) != HM_SUCCESS;
}

/* Decommit = forced purge: the pages stay mapped and read back as zero, so
 * "commit" has nothing to do. */
static bool h_decommit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
                       unsigned arena_ind) {
    (void)size, (void)arena_ind;
    return purge(jp_of(h), addr, offset, length, true);
}

static bool h_purge_lazy(extent_hooks_t *h, void *addr, size_t size, size_t offset,
                         size_t length, unsigned arena_ind) {
    (void)size, (void)arena_ind;
    return purge(jp_of(h), addr, offset, length, false);
}

static bool h_purge_forced(extent_hooks_t *h, void *addr, size_t size, size_t offset,
                           size_t length, unsigned arena_ind) {
    (void)size, (void)arena_ind;
    return purge(jp_of(h), addr, offset, length, true);
}

/* Splitting an extent inside a range needs nothing from the provider. */
static bool h_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                    bool committed, unsigned arena_ind) {
    (void)h, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed,
        (void)arena_ind;
    return false;
}

/* Merging: only inside one provider range. */
static bool h_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                    bool committed, unsigned arena_ind) {
    (void)size_b, (void)committed, (void)arena_ind;
    if ((char *)addr_a + size_a != (char *)addr_b) return true;
    return range_starts_at(jp_of(h), addr_b);
}

static const extent_hooks_t hooks_template = {
    .alloc = h_alloc,
    .dalloc = h_dalloc,
    .destroy = h_destroy,
    .commit = h_commit,
    .decommit = h_decommit,
    .purge_lazy = h_purge_lazy,
    .purge_forced = h_purge_forced,
    .split = h_split,
    .merge = h_merge,
};

/* ---- params ---- */

#define DECAY_UNSET (-2L)
#define DECAY_MAX 3600000L

struct hm_jemalloc_params {
    bool tcache;
    long dirty_ms, muzzy_ms;
};

static const hm_jemalloc_params_t default_params = {
    .tcache = true, .dirty_ms = DECAY_UNSET, .muzzy_ms = DECAY_UNSET};

hm_result_t hm_jemalloc_params_create(hm_jemalloc_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_jemalloc_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *params = malloc(sizeof(**params));
    if (!*params) return HM_ERROR_OUT_OF_HOST_MEMORY;
    **params = default_params;
    return HM_SUCCESS;
}

hm_result_t hm_jemalloc_params_destroy(hm_jemalloc_params_t *params) {
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_jemalloc_params_set_tcache(hm_jemalloc_params_t *params, bool enable) {
    if (!params) {
        HM_LOG_ERROR("hm_jemalloc_params_set_tcache: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->tcache = enable;
    return HM_SUCCESS;
}

hm_result_t hm_jemalloc_params_set_decay_ms(hm_jemalloc_params_t *params, long dirty_ms,
                                            long muzzy_ms) {
    if (!params || dirty_ms < -1 || dirty_ms > DECAY_MAX || muzzy_ms < -1 ||
        muzzy_ms > DECAY_MAX) {
        HM_LOG_ERROR("hm_jemalloc_params_set_decay_ms(%ld, %ld): %s", dirty_ms, muzzy_ms,
                     !params ? "params is NULL" : "each must be -1 .. 3600000");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->dirty_ms = dirty_ms;
    params->muzzy_ms = muzzy_ms;
    return HM_SUCCESS;
}

/* ---- pool ops ---- */

/* mallctl on "arena.<ind>.<what>" (not on a hot path). */
static int arena_ctl(unsigned ind, const char *what) {
    char name[64];
    snprintf(name, sizeof(name), "arena.%u.%s", ind, what);
    return hm_je_mallctl(name, NULL, NULL, NULL, 0);
}

static hm_result_t set_decay(unsigned arena, const char *what, long ms) {
    char name[64];
    snprintf(name, sizeof(name), "arena.%u.%s_decay_ms", arena, what);
    ssize_t v = (ssize_t)ms;
    int e = hm_je_mallctl(name, NULL, NULL, &v, sizeof(v));
    if (e) {
        HM_LOG_ERROR("jemalloc pool: %s = %ld: %s", name, ms, strerror(e));
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

static void slot_release(jpool_t *jp) {
    g_slots[jp->slot] = NULL;
    g_live--;
}

static hm_result_t slot_take(jpool_t *jp) {
    unsigned s = 0;
    while (s < g_nslots && g_slots[s]) s++;
    if (s == g_slots_cap) {
        unsigned cap = g_slots_cap ? 2 * g_slots_cap : 64;
        jpool_t **n = realloc(g_slots, cap * sizeof(*n));
        if (!n) return HM_ERROR_OUT_OF_HOST_MEMORY;
        memset(n + g_slots_cap, 0, (cap - g_slots_cap) * sizeof(*n));
        g_slots = n;
        g_slots_cap = cap;
    }
    if (s == g_nslots) g_nslots++;
    g_slots[s] = jp;
    jp->slot = jp->key.slot = s;
    jp->gen = jp->key.gen = g_next_gen++;
    g_live++;
    return HM_SUCCESS;
}

static void arena_destroy(jpool_t *jp) {
    int e = arena_ctl(jp->arena, "destroy");
    if (e)
        HM_LOG_ERROR("jemalloc pool '%s': arena.%u.destroy failed: %s (the arena is leaked)",
                     hm_pool_name(jp->pool), jp->arena, strerror(e));
}

static hm_result_t jp_init(hm_pool_t *pool, const void *params_in, void **state) {
    const hm_jemalloc_params_t *params = params_in ? params_in : &default_params;
    hm_provider_t *prov = hm_pool_get_provider(pool);
    uint32_t caps = hm_provider_caps(prov);
    size_t page = hm_provider_min_page_size(prov);
    if (!hm_is_pow2(page)) page = JE_PAGE;
    pthread_once(&g_once, once_init);
    if (g_once_failed) {
        HM_LOG_ERROR("jemalloc pool: pthread_key_create failed");
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    jpool_t *jp = calloc(1, sizeof(*jp));
    if (!jp) return HM_ERROR_OUT_OF_HOST_MEMORY;
    jp->hooks = hooks_template;
    jp->pool = pool;
    jp->page = page;
    pthread_mutex_init(&jp->range_lock, NULL);
    jp->cpu = hm_provider_cpu_accessible(prov);
    jp->can_fill = (caps & HM_PROVIDER_CAP_FILL) != 0;
    jp->can_copy = (caps & HM_PROVIDER_CAP_COPY) != 0;
    jp->can_free = (caps & HM_PROVIDER_CAP_FREE) != 0;
    jp->can_purge_lazy = (caps & HM_PROVIDER_CAP_PURGE_LAZY) != 0;
    jp->can_purge_force = (caps & HM_PROVIDER_CAP_PURGE_FORCE) != 0;
    jp->use_tcache = params->tcache;

    /* Metadata in host memory: see the header. */
    je_arena_config_t cfg = {.extent_hooks = &jp->hooks, .metadata_use_hooks = false};
    unsigned ind = 0;
    size_t sz = sizeof(ind);
    int e = hm_je_mallctl("experimental.arenas_create_ext", &ind, &sz, &cfg, sizeof(cfg));
    hm_result_t r;
    if (e) {
        hm__mutex_lock(&g_lock);
        unsigned live = g_live;
        hm__mutex_unlock(&g_lock);
        if (e == EAGAIN || e == EFAULT) {
            HM_LOG_ERROR("jemalloc pool: no arena left (%s): jemalloc allows 4095 arenas per "
                         "process, %u jemalloc pools are live", strerror(e), live);
            r = HM_ERROR_LIMIT;
        } else {
            HM_LOG_ERROR("jemalloc pool: experimental.arenas_create_ext: %s", strerror(e));
            r = HM_ERROR_UNKNOWN;
        }
        pthread_mutex_destroy(&jp->range_lock);
        free(jp);
        return r;
    }
    jp->arena = jp->key.arena = ind;
    hm__mutex_lock(&g_lock);
    hm__je_fast_key_init(&jp->key);
    hm__mutex_unlock(&g_lock);
    /* MALLOCX_ARENA(ind) without its signed overflow for ind >= 2047 (the
     * flag word keeps the arena in bits 20..31). */
    jp->arena_flags = (int)((unsigned)(ind + 1) << 20);
    r = HM_SUCCESS;
    if (params->dirty_ms != DECAY_UNSET)
        r = set_decay(ind, "dirty", params->dirty_ms);
    if (r == HM_SUCCESS && params->muzzy_ms != DECAY_UNSET)
        r = set_decay(ind, "muzzy", params->muzzy_ms);
    if (r == HM_SUCCESS) {
        hm__mutex_lock(&g_lock);
        r = slot_take(jp);
        hm__mutex_unlock(&g_lock);
    }
    if (r != HM_SUCCESS) {
        arena_destroy(jp);
        range_release_all(jp);
        pthread_mutex_destroy(&jp->range_lock);
        free(jp);
        return r;
    }
    *state = jp;
    return HM_SUCCESS;
}

/* jemalloc's statistics of the pool's arena, refreshed (jemalloc refreshes
 * every arena's at once, "epoch": O(arenas)): the bytes of its blocks at
 * their usable size, those in thread caches included (jemalloc counts a
 * block as allocated from the moment a cache takes it from a slab or
 * extent), and optionally its slabs (curslabs over the small bins). false
 * if jemalloc refuses (then 0s). */
static bool arena_stats(jpool_t *jp, size_t *allocated, size_t *slabs) {
    *allocated = 0;
    if (slabs) *slabs = 0;
    uint64_t epoch = 1;
    size_t sz = sizeof(epoch);
    if (hm_je_mallctl("epoch", &epoch, &sz, &epoch, sz)) return false;
    const char *names[] = {"small.allocated", "large.allocated"};
    char name[96];
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof(name), "stats.arenas.%u.%s", jp->arena, names[i]);
        size_t v = 0;
        sz = sizeof(v);
        if (hm_je_mallctl(name, &v, &sz, NULL, 0)) return false;
        *allocated += v;
    }
    if (!slabs) return true;
    unsigned nbins = 0;
    sz = sizeof(nbins);
    if (hm_je_mallctl("arenas.nbins", &nbins, &sz, NULL, 0)) return false;
    for (unsigned b = 0; b < nbins; b++) {
        snprintf(name, sizeof(name), "stats.arenas.%u.bins.%u.curslabs", jp->arena, b);
        size_t v = 0;
        sz = sizeof(v);
        if (hm_je_mallctl(name, &v, &sz, NULL, 0)) return false;
        *slabs += v;
    }
    return true;
}

static size_t arena_allocated(jpool_t *jp) {
    size_t allocated;
    return arena_stats(jp, &allocated, NULL) ? allocated : 0;
}

/* Destroy with blocks still allocated (all thread caches are flushed by now).
 * jemalloc refreshes the statistics of every arena at once ("epoch"), which
 * costs O(arenas): only done when the warning would be printed. */
static void report_live(jpool_t *jp) {
    if (atomic_load_explicit(&hm__log_level, memory_order_relaxed) > HM_LOG_WARN) return;
    size_t live = arena_allocated(jp);
    if (live)
        HM_LOG_WARN("jemalloc pool '%s' destroyed with %zu bytes still allocated; the memory "
                    "goes back to the provider", hm_pool_name(jp->pool), live);
}

static void jp_fini(void *state) {
    jpool_t *jp = state;
    /* Every tcache used with the arena must go before the arena does. */
    hm__mutex_lock(&g_lock);
    tc_node_t *n = jp->tcaches;
    while (n) {
        tc_node_t *next = n->next;
        je_tcache_destroy(n->tc);
        free(n);
        n = next;
    }
    jp->tcaches = NULL;
    slot_release(jp);
    hm__mutex_unlock(&g_lock);
    report_live(jp);
    arena_destroy(jp);
    range_release_all(jp);
    pthread_mutex_destroy(&jp->range_lock);
    free(jp);
}

/* The pool's alloc and free ops are je_fast.c's hm__je_fast_alloc and
 * hm__je_fast_free (state = jp, whose first member is the key); they come
 * here when the fast path does not apply: no tcache yet, cache empty or full,
 * not small, aligned, or the thread's jemalloc data not usable. */
static hm_result_t jp_trim(void *state);

/* mallocx, and where the provider is out of memory while the arena caches
 * freed extents, once more after giving them back (jp_trim): device memory
 * has no swap to fall back on. PyTorch's CUDA caching allocator frees its
 * cached blocks and retries cudaMalloc for the same reason
 * (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks). */
static void *mallocx_or_trim(jpool_t *jp, size_t size, int flags) {
    tl_hook_refused = false;
    void *p = hm_je_mallocx(size, flags);
    tcache_refresh(jp);
    if (hm_likely(p != NULL) || tl_hook_refused) return p;
    (void)jp_trim(jp);
    p = hm_je_mallocx(size, flags);
    tcache_refresh(jp);
    return p;
}

hm_result_t hm__je_alloc_slow(void *state, size_t size, size_t alignment, void **ptr) {
    jpool_t *jp = state;
    int flags = flags_of(jp);
    if (alignment > 1) {
        if (hm_unlikely(alignment > ((size_t)1 << 62))) return HM_ERROR_OUT_OF_MEMORY;
        flags |= MALLOCX_ALIGN(alignment);
    }
    void *p = mallocx_or_trim(jp, size, flags);
    if (hm_unlikely(!p)) return hook_result();
    *ptr = p;
    return HM_SUCCESS;
}

/* A live block of the pool (validated by hm__je_fast_free). */
hm_result_t hm__je_free_slow(void *state, void *ptr) {
    jpool_t *jp = state;
    hm_je_dallocx(ptr, flags_of(jp));
    tcache_refresh(jp);
    return HM_SUCCESS;
}

/* Pointer validation (HM_POOL_OPS_VALIDATES_POINTERS): see je_fast.c. */
__attribute__((cold)) hm_result_t hm__je_refuse(void *state, const void *ptr, const char *what) {
    jpool_t *jp = state;
    return hm__pool_refuse_free(jp->pool, ptr, what,
                                "not a live block of this pool (foreign or interior pointer, "
                                "another pool's block, or freed memory)");
}

static size_t jp_usable_size(void *state, const void *ptr) {
    jpool_t *jp = state;
    return hm__je_fast_check(&jp->key, ptr);
}

/* calloc on memory the CPU may not touch: a block, zeroed by the provider. */
static HM_NOINLINE hm_result_t calloc_device(jpool_t *jp, size_t size, void **ptr) {
    if (!jp->can_fill) {
        HM_LOG_ERROR("jemalloc pool '%s': calloc on memory the CPU cannot touch, and provider "
                     "'%s' has no fill", hm_pool_name(jp->pool),
                     hm_provider_name(hm_pool_get_provider(jp->pool)));
        return HM_ERROR_NOT_SUPPORTED;
    }
    void *p = NULL;
    hm_result_t r = hm__je_fast_alloc(jp, size, 0, &p);
    if (r != HM_SUCCESS) return r;
    r = hm_provider_fill(hm_pool_get_provider(jp->pool), p, 0, size);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("jemalloc pool '%s': provider could not zero %zu bytes: %s",
                     hm_pool_name(jp->pool), size, hm_result_string(r));
        (void)hm__je_fast_free(jp, p);
        return r;
    }
    *ptr = p;
    return HM_SUCCESS;
}

/* realloc on memory the CPU may not touch, when the block cannot be
 * resized in place: a new block, the bytes moved by the provider. */
static HM_NOINLINE hm_result_t realloc_device(jpool_t *jp, void *ptr, size_t size, void **out) {
    if (!jp->can_copy) {
        HM_LOG_ERROR("jemalloc pool '%s': realloc(%p, %zu) cannot resize in place, and provider "
                     "'%s' has no copy to move memory the CPU cannot touch",
                     hm_pool_name(jp->pool), ptr, size,
                     hm_provider_name(hm_pool_get_provider(jp->pool)));
        return HM_ERROR_NOT_SUPPORTED;
    }
    size_t old = hm__je_fast_check(&jp->key, ptr);
    void *p = NULL;
    hm_result_t r = hm__je_fast_alloc(jp, size, 0, &p);
    if (r != HM_SUCCESS) return r;
    r = hm_provider_copy(hm_pool_get_provider(jp->pool), p, ptr, old < size ? old : size);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("jemalloc pool '%s': provider could not move %zu bytes: %s",
                     hm_pool_name(jp->pool), old < size ? old : size, hm_result_string(r));
        (void)hm__je_fast_free(jp, p);
        return r;
    }
    (void)hm__je_fast_free(jp, ptr);
    *out = p;
    return HM_SUCCESS;
}

static hm_result_t jp_calloc(void *state, size_t size, void **ptr) {
    jpool_t *jp = state;
    if (!jp->cpu) return calloc_device(jp, size, ptr);
    void *p = mallocx_or_trim(jp, size, flags_of(jp) | MALLOCX_ZERO);
    if (!p) return hook_result();
    *ptr = p;
    return HM_SUCCESS;
}

static hm_result_t jp_realloc(void *state, void *ptr, size_t size, void **out) {
    jpool_t *jp = state;
    if (hm_unlikely(!hm__je_fast_check(&jp->key, ptr))) return hm__je_refuse(jp, ptr, "realloc");
    int flags = flags_of(jp);
    if (size > ((size_t)1 << 62)) return HM_ERROR_OUT_OF_MEMORY;
    if (!jp->cpu) {
        /* No copy through the CPU: in place, else through the provider. */
        size_t got = hm_je_xallocx(ptr, size, 0, flags);
        tcache_refresh(jp);
        if (got >= size) {
            *out = ptr;
            return HM_SUCCESS;
        }
        return realloc_device(jp, ptr, size, out);
    }
    tl_hook_refused = false;
    void *p = hm_je_rallocx(ptr, size, flags);
    tcache_refresh(jp);
    if (!p && !tl_hook_refused) { /* as mallocx_or_trim */
        (void)jp_trim(jp);
        p = hm_je_rallocx(ptr, size, flags);
        tcache_refresh(jp);
    }
    if (!p) return hook_result();
    *out = p;
    return HM_SUCCESS;
}

static hm_result_t jp_trim(void *state) {
    jpool_t *jp = state;
    /* The calling thread's cache first, so its blocks can be purged too. */
    tl_table_t *t = *hm__je_fast_tl();
    if (t && jp->slot < t->cap && t->e[jp->slot].gen == jp->gen && t->e[jp->slot].node) {
        unsigned tc = t->e[jp->slot].tc;
        /* flush destroys it (re-made on next use): neither the fast paths
         * nor get_stats may use it from now on */
        t->e[jp->slot].tcache = NULL;
        hm_je_key_disable_mine(&jp->key);
        tc_publish(&t->e[jp->slot]);
        int e = hm_je_mallctl("tcache.flush", NULL, NULL, &tc, sizeof(tc));
        if (e) HM_LOG_WARN("jemalloc pool: tcache.flush(%u): %s", tc, strerror(e));
    }
    int e = arena_ctl(jp->arena, "purge");
    if (e) {
        HM_LOG_ERROR("jemalloc pool '%s': arena.%u.purge: %s", hm_pool_name(jp->pool), jp->arena,
                     strerror(e));
        return HM_ERROR_UNKNOWN;
    }
    return HM_SUCCESS;
}

/* bytes_requested: jemalloc's allocated bytes less those in the pool's
 * thread caches (each thread's cache is its own statistic, summed here; no
 * counter on the alloc/free paths). Exact while no thread is inside a call
 * on the pool. */
static hm_result_t jp_get_stats(void *state, hm_pool_stats_t *stats) {
    jpool_t *jp = state;
    size_t allocated = 0, slabs = 0, cached = 0;
    if (!arena_stats(jp, &allocated, &slabs))
        HM_LOG_WARN("jemalloc pool '%s': jemalloc's statistics are not available",
                    hm_pool_name(jp->pool));
    hm__mutex_lock(&g_lock);
    for (tc_node_t *n = jp->tcaches; n; n = n->next)
        if (n->tcache) cached += hm__je_fast_cached_bytes(n->tcache);
    hm__mutex_unlock(&g_lock);
    stats->bytes_requested = allocated > cached ? allocated - cached : 0;
    stats->slabs = slabs;
    /* bytes_from_provider / provider_allocs: from the provider ranges. */
    hm__mutex_lock(&jp->range_lock);
    for (size_t i = 0; i < jp->range_nb; i++)
        for (prange_t *x = jp->range_tab[i]; x; x = x->next) stats->bytes_from_provider += x->size;
    stats->provider_allocs = jp->range_n;
    hm__mutex_unlock(&jp->range_lock);
    return HM_SUCCESS;
}

/* hm__je_fast_malloc off its fast path: hm__je_fast_alloc decides. */
void *hm__je_malloc_slow(void *state, size_t size) {
    return hm__malloc_via(hm__je_fast_alloc, state, size);
}

static const hm_pool_ops_t jemalloc_ops = {
    .version = HM_POOL_OPS_VERSION,
    .name = "jemalloc",
    .init = jp_init,
    .fini = jp_fini,
    .alloc = hm__je_fast_alloc,
    .free = hm__je_fast_free,
    .malloc_fast = hm__je_fast_malloc,
    .usable_size = jp_usable_size,
    .calloc = jp_calloc,
    .realloc = jp_realloc,
    .trim = jp_trim,
    .get_stats = jp_get_stats,
    .flags = HM_POOL_OPS_VALIDATES_POINTERS | HM_POOL_OPS_RETRIES_OUT_OF_MEMORY,
};

const hm_pool_ops_t *hm_jemalloc_pool_ops(void) { return &jemalloc_ops; }

hm_result_t hm_jemalloc_pool_create(hm_provider_t *provider, const hm_jemalloc_params_t *params,
                                    uint32_t flags, hm_pool_t **pool) {
    return hm_pool_create(&jemalloc_ops, provider, params, flags, pool);
}
