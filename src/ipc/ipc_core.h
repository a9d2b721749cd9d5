/* hetmem — IPC internals shared by ipc.c, export.c and import.c (never
 * installed, not for other modules: they use ipc_internal.h).
 * SPDX-License-Identifier: MIT */
#ifndef HM_IPC_CORE_H
#define HM_IPC_CORE_H

#include "ipc/ipc_internal.h"
#include "platform/prim.h"
#include "pool_internal.h"

/* The exporter identity (pid, nonce, start time), cached per fork epoch. */
typedef struct hm_ipc_ident {
    uint64_t pid, nonce, start;
} hm_ipc_ident_t;
extern hm_ipc_ident_t hm__ipc_ident;
extern _Atomic unsigned hm__ipc_ident_epoch; /* fork epoch + 1 the identity is valid for */
const hm_ipc_ident_t *hm__ipc_ident_refresh(unsigned epoch);

/* The exporter identity, cached: one atomic load and a compare per call. */
static inline const hm_ipc_ident_t *hm__ipc_self_ident(void) {
    unsigned epoch = hm__prim_fork_epoch();
    if (hm_likely(atomic_load_explicit(&hm__ipc_ident_epoch, memory_order_acquire) == epoch + 1))
        return &hm__ipc_ident;
    return hm__ipc_ident_refresh(epoch);
}

/* splitmix64's finaliser (G. Steele, D. Lea, C. Flood, "Fast splittable
 * pseudorandom number generators", OOPSLA 2014) as a 64-bit mixer. */
static inline uint64_t hm__ipc_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Object arena for the caches' entries (imp_t) and export views (xview_t):
 * fixed-size objects carved from chunks that are never unmapped, recycled
 * through a free list (so entries are type-stable, see imp_t). The first
 * chunk is 256 KiB of ordinary pages; later ones are 2 MiB, 2 MiB-aligned
 * and advised MADV_HUGEPAGE: a hit with 10^4 entries cached touches entries
 * spread over megabytes, and one TLB entry per 2 MiB instead of one per
 * 4 KiB pays most where page walks are dear (virtual machines: nested
 * paging). A process that opens or exports a few handles pays no more than
 * the first chunk. Chunks are recorded (append-only, read without a lock)
 * so that hm_ipc_put can tell a view's address from any other pointer. */
#define ARENA_FIRST ((size_t)256 << 10)
#define ARENA_CHUNK ((size_t)2 << 20)
#define ARENA_MAX_CHUNKS 1024
typedef struct arena {
    pthread_mutex_t lock;
    size_t objsize, link_off; /* the free-list link's offset in an object */
    void *free;
    char *bump, *end;
    _Atomic size_t nchunks;
    uintptr_t chunk_base[ARENA_MAX_CHUNKS];
    size_t chunk_size[ARENA_MAX_CHUNKS];
} arena_t;

void *hm__ipc_arena_alloc(arena_t *a); /* NULL: out of memory */
void hm__ipc_arena_free(arena_t *a, void *o);
/* p is the start of an object of a (allocated or free). No lock. */
static inline bool hm__ipc_arena_owns(arena_t *a, const void *p) {
    size_t n = atomic_load_explicit(&a->nchunks, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        uintptr_t d = (uintptr_t)p - a->chunk_base[i];
        if (d < a->chunk_size[i]) return d % a->objsize == 0 && d + a->objsize <= a->chunk_size[i];
    }
    return false;
}

struct imp;
struct xent;
struct kslot;

/* The IPC state of one pool: its import index (import.c, pi->lock) and its
 * exports (export.c, exports.lock). Made at the pool's first export or open,
 * freed at its destroy. */
struct hm_ipc_pool {
    pthread_mutex_t lock;
    hm_pool_t *pool;
    struct kslot *ks;      /* key index: kcap slots, at most 3/4 full */
    size_t kcap, kn;
    struct imp **lb;       /* local-address hash: cap buckets (chained) */
    size_t cap, n;
    uint64_t hits; /* pi->lock; folded into opened.hits at destroy */
    _Atomic int evictors;
    struct xent *xhead; /* this pool's export entries (exports.lock) */
    /* This pool's live export entries with refs > 0: while 0 no free of
     * the pool needs the export cache (changed under exports.lock, read
     * relaxed by the front end; see hm__ipc_free_held). */
    _Atomic size_t held;
    _Atomic int flushers; /* puts freeing deferred blocks into the pool now */
    struct unclosed { uintptr_t local; size_t size; } *unclosed; /* pi->lock */
    size_t nunclosed, capunclosed;
    struct hm_ipc_pool *gprev, *gnext; /* pilist (fork handling, stats) */
};
typedef struct hm_ipc_pool hm_ipc_pool_t;

/* Every pool's IPC state (fork handling, statistics). */
extern pthread_mutex_t hm__ipc_pilist_lock;
extern hm_ipc_pool_t *hm__ipc_pilist;
extern size_t hm__ipc_export_max; /* HM_IPC_EXPORT_CACHE_MAX */

static inline hm_ipc_pool_t *hm__ipc_pool(hm_pool_t *pool) {
    return atomic_load_explicit(&pool->ipc, memory_order_acquire);
}
/* The pool's IPC state, made if need be (NULL: out of memory). */
hm_ipc_pool_t *hm__ipc_pool_make(hm_pool_t *pool);
/* hm__init, the configuration and the fork handlers, once. */
void hm__ipc_lazy_init(void);

/* ---- export side (export.c) ---- */
void hm__ipc_export_pool_destroy(hm_pool_t *pool, hm_ipc_pool_t *pi);
size_t hm__ipc_export_count(void);
void hm__ipc_export_atfork(int phase); /* 0 prepare (lock), 1 parent, 2 child (unlock) */
void hm__ipc_export_atfork_child(void); /* after the unlock: drop the parent's exports */
/* ptrace.c: the export cache became non-empty (true) or empty (false);
 * called with exports.lock held. */
void hm__ipc_ptrace_exporting(bool exporting);
void hm__ipc_ptrace_atfork(int phase); /* 0 prepare (lock), 1 parent, 2 child (unlock) */

/* ---- import side (import.c) ---- */
/* The pool's import index: made (false: out of memory) and freed. */
bool hm__ipc_import_pool_init(hm_ipc_pool_t *pi);
void hm__ipc_import_pool_fini(hm_ipc_pool_t *pi);
/* Close every mapping opened through the pool (pi stays linked). */
void hm__ipc_import_pool_destroy(hm_pool_t *pool, hm_ipc_pool_t *pi);
/* Its hit count into the destroyed pools' total (pilist_lock held). */
void hm__ipc_import_fold_hits(hm_ipc_pool_t *pi);
void hm__ipc_import_init(size_t max_entries, size_t max_bytes);
void hm__ipc_import_atfork(int phase);
/* The shared mappings' lock: taken before every pool lock (0 prepare, 1 parent, 2 child). */
void hm__ipc_import_share_atfork(int phase);

#endif
