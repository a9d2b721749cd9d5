/* hetmem — the tracker: a lock-free radix tree from addresses to records.
 * SPDX-License-Identifier: MIT
 *
 * Layout (see tracker.h for the contract). The tree is shaped like an x86-64
 * page table with huge-page entries (the idea of jemalloc's rtree and of
 * Linux's page tables; the code is our own):
 *
 *   level 0 (root)  bits 39..56  2^18 slots, each spanning 512 GiB (one
 *                                2 MiB calloc: untouched parts cost no RSS)
 *   level 1         bits 30..38  512 slots of 1 GiB
 *   level 2         bits 21..29  512 slots of 2 MiB
 *   level 3 (leaf)  bits 12..20  512 slots of 4 KiB (the granule)
 *
 * A slot holds 0 (nothing), a child node (tag 0), a record (tag 1) whose
 * range covers the slot's whole span, or — at the leaf level only — a page
 * list (tag 2): an immutable array of the records that cover part of that
 * 4 KiB granule, sorted by base, replaced copy-on-write with CAS.
 *
 * A range is stored with the fewest slots: a slot wholly inside the range
 * holds the record; a partially covered slot descends. Records, page lists
 * and nodes are reclaimed after an RCU grace period (urcu-bp); see
 * "Reclamation" below.
 *
 * Nodes and the per-thread node cache. Nodes are not permanent: a
 * split/merge/remove whose new value for a wholly covered slot is one record
 * (or nothing) replaces a child node there with one CAS ("collapse") and
 * retires the subtree, O(1) — otherwise a long-lived region split at many
 * points would keep its nodes, and every later merge or remove of a large
 * range would rewrite every slot of every node under it. The cache
 * stays safe with one counter, g_cache_epoch, bumped after every collapse
 * (and root change) and before the grace period that frees the nodes: a
 * lookup reads it inside its read-side section and drops its cache if it
 * moved. A lookup that read the old epoch began before that grace period, so
 * the nodes it may use are still allocated, and they still hold the old
 * records (linearised before the collapse). Collapses happen only when a
 * range covers a whole 2 MiB (or 1 GiB, 512 GiB) aligned span that had a
 * node, so the counter is written rarely.
 */
#include "tracker/tracker.h"
#include "addr_width.h"

#include "platform/prim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <urcu/urcu-bp.h>
/* The read-side lock and unlock are used inline from liburcu's static header:
 * each is under ten lines and marked by liburcu as meeting the LGPL's
 * ten-line criterion "allowing this function to be invoked directly from
 * non-LGPL code" (urcu/static/urcu-bp.h). Called through the shared library
 * they would be most of a lookup's cost (docs/performance.md). Nothing else
 * of the static header is used (no _LGPL_SOURCE). */
#include <urcu/static/urcu-bp.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* ---- ThreadSanitizer and RCU -------------------------------------------
 * TSan does not see the ordering that urcu's grace period provides (it lives
 * in an uninstrumented library and uses membarrier). Model it: every reader
 * "releases" one sync object when it leaves its read-side section, and a
 * writer "acquires" it after synchronize_rcu. Since the grace period waits
 * for every section that began before it, each such release really happens
 * before the acquire, so this adds no ordering that does not exist. */
#if defined(HM_TSAN) || defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
static char tsan_grace;
#define TSAN_READER_DONE() __tsan_release(&tsan_grace)
#define TSAN_GRACE_DONE() __tsan_acquire(&tsan_grace)
/* call_rcu's queue is uninstrumented too: writer -> callback thread. */
#define TSAN_RELEASE(p) __tsan_release(p)
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define TSAN_READER_DONE() ((void)0)
#define TSAN_GRACE_DONE() ((void)0)
#define TSAN_RELEASE(p) ((void)0)
#define TSAN_ACQUIRE(p) ((void)0)
#endif

#ifndef HM_SANITIZE_BUILD
/* The urcu-bp read side with this thread's reader struct fetched once per
 * section. liburcu's inline _urcu_bp_read_lock/_unlock (urcu/static/
 * urcu-bp.h, 0.13) name the thread-local reader pointer four times, and in a
 * shared library built with TLS descriptors each is a call the compiler
 * cannot merge across the barriers: half of a hot lookup's time. Same
 * protocol: the nest count sits in the upper bits of ctr; the outermost lock
 * copies the global phase counter, then a compiler barrier (sys_membarrier
 * present) or a full fence; unlock fences, then drops one nesting level.
 * The reader struct does not move while its thread lives (urcu-bp keeps its
 * registry in chunks it never relocates). */
typedef struct urcu_bp_reader *rd_t;
static inline rd_t rd_lock(void) {
    rd_t r = URCU_TLS(urcu_bp_reader);
    if (hm_unlikely(!r)) {
        urcu_bp_register();
        r = URCU_TLS(urcu_bp_reader);
    }
    cmm_barrier();
    unsigned long tmp = r->ctr;
    if (hm_likely(!(tmp & URCU_BP_GP_CTR_NEST_MASK))) {
        _CMM_STORE_SHARED(r->ctr, _CMM_LOAD_SHARED(urcu_bp_gp.ctr));
        urcu_bp_smp_mb_slave();
    } else {
        _CMM_STORE_SHARED(r->ctr, tmp + URCU_BP_GP_COUNT);
    }
    return r;
}
static inline void rd_unlock(rd_t r) {
    TSAN_READER_DONE();
    unsigned long tmp = r->ctr;
    urcu_bp_smp_mb_slave();
    _CMM_STORE_SHARED(r->ctr, tmp - URCU_BP_GP_COUNT);
    cmm_barrier();
}
#else
/* Sanitizer builds call the library: liburcu-bp 0.13 places its per-thread
 * reader struct at addresses below the 128-byte alignment its header
 * declares, which UBSan's alignment check reports inside the inline code
 * (harmless on x86-64 and aarch64; not ours to fix). */
typedef int rd_t;
static inline rd_t rd_lock(void) {
    urcu_bp_read_lock();
    return 0;
}
static inline void rd_unlock(rd_t r) {
    (void)r;
    TSAN_READER_DONE();
    urcu_bp_read_unlock();
}
#endif
static void grace_period(void) {
    urcu_bp_synchronize_rcu();
    TSAN_GRACE_DONE();
}

/* ---- geometry ---- */
#define VA_BITS HM_TRACKER_ADDR_BITS /* 57: root bits 39..56 */
#define ROOT_BITS 18
#define NODE_BITS 9
#define NODE_SLOTS (1u << NODE_BITS)
#define ROOT_SLOTS (1u << ROOT_BITS)
#define LEAF_LEVEL 3
#define GRANULE_SHIFT 12
static const unsigned level_shift[4] = {39, 30, 21, 12};
_Static_assert(VA_BITS == 39 + ROOT_BITS, "the root's slots span the covered address bits");

enum { TAG_NODE = 0, TAG_REC = 1, TAG_LIST = 2, TAG_MASK = 3 };

typedef _Atomic uintptr_t slot_t;

/* Header of everything reclaimed after a grace period (records, page lists,
 * nodes): first member, so free(ptr) frees the object. */
typedef struct retired {
    struct retired *next;
    uint32_t kind;  /* RET_* */
    uint32_t bytes; /* the object's size, for the bound on retired memory */
} retired_t;
enum { RET_PLAIN = 0, RET_SUBTREE = 1 };

typedef struct node {
    retired_t retire; /* used once unpublished; readers never look at it */
    char pad[HM_CACHE_LINE - sizeof(retired_t)];
    slot_t slot[NODE_SLOTS];
} node_t;

/* Invariants: base/size/pool/provider/id/flags/idx are immutable once the
 * record is published in a slot. state moves INSERTING -> LIVE -> BUSY (one
 * writer claimed it, by CAS) and never back, except that a merge whose
 * second claim fails returns its first record from BUSY to LIVE. prev/next
 * are guarded by idx->lock. */
struct hm_tracker_record {
    retired_t retire; /* must stay first */
    uintptr_t base;
    size_t size;
    hm_pool_t *pool;
    hm_provider_t *provider;
    uint64_t id;
    uint32_t flags;
    _Atomic uint32_t state;
    hm_tracker_index_t *idx;
    struct hm_tracker_record *prev, *next;
};
typedef struct hm_tracker_record rec_t;
enum { REC_INSERTING = 0, REC_LIVE = 1, REC_BUSY = 2 };

typedef struct plist_entry {
    uintptr_t base, end; /* copies of rec's, so the search touches one array */
    rec_t *rec;
} ple_t;

/* Immutable once published. n >= 1. */
typedef struct plist {
    retired_t retire; /* must stay first */
    uint32_t n;
    ple_t e[];
} plist_t;

/* The root: 2 MiB of slots that cost RSS only where touched.
 * touched has one bit per 4 KiB of slots (512 slots) that was ever written,
 * so fini visits only those. No padding between the two: the slots of every
 * address below 2^47 (the 256 first, all a 4-level x86-64 or aarch64 user
 * space has) share the first page with touched, so a process's tracker
 * root costs it one page, not two. */
typedef struct root {
    _Atomic uint64_t touched[ROOT_SLOTS * sizeof(slot_t) / 4096 / 64];
    slot_t slot[ROOT_SLOTS];
} root_t;

static _Atomic(root_t *) g_root;
/* Bumped when cached node pointers may go stale (collapse, new root). */
static _Atomic uint64_t g_cache_epoch HM_CACHE_ALIGNED = 1;
static char g_cache_epoch_pad[HM_CACHE_LINE - sizeof(uint64_t)] __attribute__((unused));

static inline uintptr_t tag_of(uintptr_t v) { return v & TAG_MASK; }
static inline void *untag(uintptr_t v) { return (void *)(v & ~(uintptr_t)TAG_MASK); }
static inline int is_node(uintptr_t v) { return v != 0 && tag_of(v) == TAG_NODE; }
static inline uintptr_t rec_val(rec_t *r) { return (uintptr_t)r | TAG_REC; }
static inline uintptr_t list_val(plist_t *p) { return (uintptr_t)p | TAG_LIST; }

static inline size_t slot_index(unsigned level, uintptr_t a) {
    size_t i = a >> level_shift[level];
    return level == 0 ? i & (ROOT_SLOTS - 1) : i & (NODE_SLOTS - 1);
}

/* ---- unique ids: per-thread blocks from one counter ---- */
#define ID_BLOCK 1024
static _Atomic uint64_t g_next_id = 1;
static __thread uint64_t t_id_next, t_id_end;

HM_RUN static uint64_t new_id(void) {
    if (hm_unlikely(t_id_next == t_id_end)) {
        t_id_next = atomic_fetch_add_explicit(&g_next_id, ID_BLOCK, memory_order_relaxed);
        t_id_end = t_id_next + ID_BLOCK;
    }
    return t_id_next++;
}

/* ---- reclamation ----------------------------------------------------------
 * Removed records, replaced page lists and collapsed nodes are pushed onto
 * one of a few sharded retire lists (a thread keeps its shard; nothing is
 * left behind by exiting threads). When a shard holds RETIRE_BATCH objects
 * or RETIRE_BATCH_BYTES bytes, the thread that filled it detaches the list
 * and hands it to call_rcu as one callback: one grace period and one queue
 * operation per 256 removals.
 *
 * Why not synchronize_rcu in the writer (the first version did): urcu-bp's
 * grace period spins briefly and then sleeps 10 ms at a time while a reader
 * is inside a read-side section; on a loaded machine a reader preempted in
 * its section made an unlucky hm_free wait milliseconds (measured: 2-thread
 * insert+remove at 0.7 effective CPUs). call_rcu moves that wait to urcu's
 * helper thread. Its costs are handled: the helper is paused around fork
 * (call_rcu_before_fork etc. in the atfork hooks), and fini waits for
 * pending batches so none runs after a dlclose. flush and fini also free
 * every shard's list (drain does not: see there).
 *
 * Back-pressure. The helper is one thread that competes for the CPU (and
 * for malloc) with the writers; a writer that outruns it would pile up
 * retired memory without limit, and a forked child would inherit the pile.
 * So the bytes handed to call_rcu and not yet freed are counted
 * (g_pending_bytes), and a writer whose batch would take them past
 * RETIRE_PENDING_LIMIT reclaims that batch itself: one grace period in the
 * writer, then free. Retired memory is then at most RETIRE_PENDING_LIMIT plus
 * RETIRE_SHARDS partly filled shards (each under RETIRE_BATCH_BYTES plus one
 * object), whatever the scheduling: the "help when the reclaimer lags"
 * rule of bounded-memory reclamation schemes (Michael's hazard pointers
 * scan when the retire list reaches a threshold, IEEE TPDS 15(6), 2004;
 * liburcu's own call_rcu falls back to synchronize_rcu when it cannot queue).
 * The same synchronous path serves when a batch carrier cannot be allocated.
 * Writers never wait while the helper keeps up. */
#define RETIRE_SHARDS 16
#define RETIRE_BATCH 256
#define RETIRE_BATCH_BYTES (64u << 10)
#define RETIRE_PENDING_LIMIT ((size_t)2 << 20)

typedef struct shard {
    pthread_mutex_t lock;
    retired_t *head, *tail;
    size_t n, bytes;
} HM_CACHE_ALIGNED shard_t;

static shard_t g_shards[RETIRE_SHARDS] = {
#define SH PTHREAD_MUTEX_INITIALIZER
    [0 ... RETIRE_SHARDS - 1] = {.lock = SH},
#undef SH
};
static _Atomic unsigned g_shard_rr;
static __thread unsigned t_shard; /* 1 + shard index; 0: not chosen yet */

/* Bytes in batches handed to call_rcu and not yet freed; its high-water
 * mark and the batches writers reclaimed themselves (hm__tracker_retire_stats). */
static _Atomic size_t g_pending_bytes;
static _Atomic size_t g_pending_peak;
static _Atomic uint64_t g_sync_reclaims;

static void free_subtree(uintptr_t v);

static void free_list(retired_t *r) {
    while (r) {
        retired_t *next = r->next;
        if (r->kind == RET_SUBTREE)
            free_subtree((uintptr_t)r);
        else
            free(r);
        r = next;
    }
}

static void reclaim_later(retired_t *list, size_t bytes);

/* Append [head..tail] (n objects, bytes in all) to this thread's shard;
 * maybe reclaim. */
HM_RUN static void retire_list(retired_t *head, retired_t *tail, size_t n, size_t bytes) {
    if (!head) return;
    if (hm_unlikely(!t_shard))
        t_shard = 1 + atomic_fetch_add_explicit(&g_shard_rr, 1, memory_order_relaxed) %
                          RETIRE_SHARDS;
    shard_t *s = &g_shards[t_shard - 1];
    retired_t *batch = NULL;
    size_t batch_bytes = 0;
    hm__mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = head;
    else
        s->head = head;
    s->tail = tail;
    s->n += n;
    s->bytes += bytes;
    if (s->n >= RETIRE_BATCH || s->bytes >= RETIRE_BATCH_BYTES) {
        batch = s->head;
        batch_bytes = s->bytes;
        s->head = s->tail = NULL;
        s->n = s->bytes = 0;
    }
    hm__mutex_unlock(&s->lock);
    if (batch) reclaim_later(batch, batch_bytes);
}

typedef struct batch {
    struct rcu_head head;
    retired_t *list;
    size_t bytes;
} batch_t;
/* Batches handed to call_rcu and not yet freed. flush/fini wait for zero
 * (our own rcu_barrier: liburcu's allocates in the caller and frees in the
 * helper, which TSan cannot see ordered, and it is all we need). */
static _Atomic long g_batches_pending;
/* Held from counting a batch in g_batches_pending to handing it to
 * call_rcu, and taken by the atfork prepare: a fork never lands
 * between the two, where the child would count a batch that no thread of
 * its own ever queues, and its flush or fini would wait for it forever
 * (test_tracker_fork hung so, with its writer thread in that window). */
static pthread_mutex_t g_reclaim_lock = PTHREAD_MUTEX_INITIALIZER;

HM_RUN static void batch_free(struct rcu_head *h) {
    batch_t *b = caa_container_of(h, batch_t, head);
    TSAN_GRACE_DONE();
    TSAN_ACQUIRE(b);
    size_t bytes = b->bytes;
    free_list(b->list);
    free(b);
    atomic_fetch_sub_explicit(&g_pending_bytes, bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&g_batches_pending, 1, memory_order_release); /* last */
}

static void wait_batches(void) {
    while (atomic_load_explicit(&g_batches_pending, memory_order_acquire) != 0) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

/* The writer frees list itself, after a grace period of its own. */
static void reclaim_now(retired_t *list) {
    atomic_fetch_add_explicit(&g_sync_reclaims, 1, memory_order_relaxed);
    grace_period();
    free_list(list);
}

HM_RUN static void reclaim_later(retired_t *list, size_t bytes) {
    size_t before = atomic_fetch_add_explicit(&g_pending_bytes, bytes, memory_order_relaxed);
    if (hm_unlikely(before + bytes > RETIRE_PENDING_LIMIT)) {
        /* The helper lags: back-pressure (see above). */
        atomic_fetch_sub_explicit(&g_pending_bytes, bytes, memory_order_relaxed);
        reclaim_now(list);
        return;
    }
    size_t peak = atomic_load_explicit(&g_pending_peak, memory_order_relaxed);
    while (before + bytes > peak &&
           !atomic_compare_exchange_weak_explicit(&g_pending_peak, &peak, before + bytes,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    batch_t *b = malloc(sizeof *b);
    if (hm_unlikely(!b)) {
        atomic_fetch_sub_explicit(&g_pending_bytes, bytes, memory_order_relaxed);
        reclaim_now(list);
        return;
    }
    b->list = list;
    b->bytes = bytes;
    TSAN_RELEASE(b);
    /* Make sure the default worker exists before call_rcu. liburcu 0.13's
     * call_rcu enters a read-side section and, on the process's first use,
     * creates the worker under call_rcu's mutex; call_rcu_before_fork (the
     * atfork prepare) holds that mutex while it waits for the workers to
     * pause, and a worker inside a grace period waits for that reader: the
     * fork deadlocked (test_fork_first_reclaim). Here, outside any
     * read-side section, waiting for the mutex is harmless; afterwards
     * call_rcu finds the worker without taking it. One load when it exists.
     * It may call malloc (the worker's first creation), so it stays outside
     * g_reclaim_lock: under libhetmem_proxy.so, malloc may take the native
     * pool's locks, which the atfork prepare takes before this one. */
    (void)urcu_bp_get_default_call_rcu_data();
    hm__mutex_lock(&g_reclaim_lock);
    atomic_fetch_add_explicit(&g_batches_pending, 1, memory_order_relaxed);
    urcu_bp_call_rcu(&b->head, batch_free);
    hm__mutex_unlock(&g_reclaim_lock);
}

void hm__tracker_retire_stats(hm_tracker_retire_stats_t *st) {
    st->pending_bytes = atomic_load_explicit(&g_pending_bytes, memory_order_relaxed);
    st->pending_peak = atomic_load_explicit(&g_pending_peak, memory_order_relaxed);
    st->pending_limit = RETIRE_PENDING_LIMIT;
    st->shard_bytes = 0;
    for (unsigned i = 0; i < RETIRE_SHARDS; i++) {
        hm__mutex_lock(&g_shards[i].lock);
        st->shard_bytes += g_shards[i].bytes;
        hm__mutex_unlock(&g_shards[i].lock);
    }
    st->shard_limit = RETIRE_SHARDS * (size_t)RETIRE_BATCH_BYTES;
    st->sync_reclaims = atomic_load_explicit(&g_sync_reclaims, memory_order_relaxed);
}

static void retire_one(retired_t *r) {
    r->next = NULL;
    retire_list(r, r, 1, r->bytes);
}

/* Detach every shard's list (to be freed after the caller's grace period). */
static retired_t *steal_all_shards(void) {
    retired_t *all = NULL;
    for (unsigned i = 0; i < RETIRE_SHARDS; i++) {
        shard_t *s = &g_shards[i];
        hm__mutex_lock(&s->lock);
        if (s->head) {
            s->tail->next = all;
            all = s->head;
            s->head = s->tail = NULL;
            s->n = s->bytes = 0;
        }
        hm__mutex_unlock(&s->lock);
    }
    return all;
}

/* ---- allocation of metadata ---- */
HM_RUN static node_t *node_new(void) {
    node_t *n = aligned_alloc(HM_CACHE_LINE, sizeof(node_t));
    if (n) {
        memset(n, 0, sizeof *n);
        n->retire.kind = RET_SUBTREE;
        n->retire.bytes = sizeof *n;
    }
    return n;
}

HM_RUN static plist_t *plist_new(uint32_t n) {
    plist_t *p = malloc(sizeof *p + (size_t)n * sizeof(ple_t));
    if (p) {
        p->retire.kind = RET_PLAIN;
        p->retire.bytes = (uint32_t)(sizeof *p + (size_t)n * sizeof(ple_t));
        p->n = n;
    }
    return p;
}

/* A node and everything below it but records (they have owners). Only for
 * nodes nobody can reach any more. */
static void free_subtree(uintptr_t v) {
    if (!v) return;
    if (tag_of(v) == TAG_LIST) {
        free(untag(v));
    } else if (is_node(v)) {
        node_t *n = untag(v);
        for (unsigned i = 0; i < NODE_SLOTS; i++)
            free_subtree(atomic_load_explicit(&n->slot[i], memory_order_relaxed));
        free(n);
    }
}

/* The root (2 MiB) is a private mapping of its own: zero pages that cost
 * RSS only where a slot is written, whatever malloc the process runs on (a
 * 2 MiB calloc is a fresh mapping in glibc, but tcmalloc and mimalloc touch
 * it all). LeakSanitizer scans heap blocks, not our mappings: it is told
 * to scan this one, so nodes reachable from the root are not reported as
 * leaked when a program exits with live pools. */
static root_t *root_map(void) {
    void *p;
    if (hm__prim_map(sizeof(root_t), 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                     HM_PRIM_MAP_NORESERVE, -1, 0, &p) != HM_SUCCESS)
        return NULL;
#if defined(__SANITIZE_ADDRESS__)
    __lsan_register_root_region(p, sizeof(root_t));
#endif
    return p;
}

static void root_unmap(root_t *r) {
#if defined(__SANITIZE_ADDRESS__)
    __lsan_unregister_root_region(r, sizeof(root_t));
#endif
    (void)hm__prim_unmap(r, sizeof(root_t));
}

/* Create the root on first use. */
HM_RUN static root_t *root_get(void) {
    root_t *r = atomic_load_explicit(&g_root, memory_order_acquire);
    if (hm_likely(r)) return r;
    root_t *p = root_map();
    if (!p) {
        HM_LOG_ERROR("tracker: cannot allocate the root table (%zu bytes)", sizeof(root_t));
        return NULL;
    }
    root_t *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&g_root, &expected, p, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        root_unmap(p);
        return expected;
    }
    return p;
}

static void root_mark_touched(root_t *root, const slot_t *slot) {
    size_t page = ((size_t)(slot - root->slot) * sizeof(slot_t)) / 4096;
    _Atomic uint64_t *w = &root->touched[page / 64];
    uint64_t bit = (uint64_t)1 << (page % 64);
    if (!(atomic_load_explicit(w, memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(w, bit, memory_order_relaxed);
}

/* ---- lookups ---- */

/* Record among a value (record or page list) that contains a; NULL if none. */
HM_INLINE rec_t *resolve(uintptr_t v, uintptr_t a) {
    if (tag_of(v) == TAG_REC) {
        rec_t *r = untag(v);
        return a - r->base < r->size ? r : NULL;
    }
    const plist_t *p = untag(v);
    /* Last entry with base <= a (entries are sorted and disjoint). */
    uint32_t lo = 0, hi = p->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (p->e[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return NULL;
    const ple_t *e = &p->e[lo - 1];
    return a < e->end ? e->rec : NULL;
}

/* Per-thread, direct-mapped cache of the deepest node reached for a 2 MiB
 * region (key a >> 21), as jemalloc's rtree_ctx. A cached node is valid
 * while g_cache_epoch is unchanged (see the top of this file). Records are
 * never cached. */
#define TCACHE_SLOTS 16
typedef struct tcache {
    uint64_t epoch; /* g_cache_epoch when filled */
    uintptr_t key[TCACHE_SLOTS]; /* (a >> 21) + 1; 0: empty */
    node_t *node[TCACHE_SLOTS];
    uint8_t level[TCACHE_SLOTS]; /* level of node's slots */
} tcache_t;
static __thread tcache_t t_cache;

/* Must run inside a read-side section. */
HM_RUN static rec_t *find_rec(uintptr_t a) {
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    if (hm_unlikely(!root || (a >> VA_BITS))) return NULL;
    tcache_t *tc = &t_cache;
    uintptr_t key = (a >> 21) + 1;
    unsigned ci = (unsigned)(a >> 21) & (TCACHE_SLOTS - 1);
    unsigned level;
    uintptr_t v;
    uint64_t epoch = atomic_load_explicit(&g_cache_epoch, memory_order_acquire);
    if (hm_likely(tc->epoch == epoch)) {
        if (hm_likely(tc->key[ci] == key)) {
            level = tc->level[ci];
            v = atomic_load_explicit(&tc->node[ci]->slot[slot_index(level, a)],
                                     memory_order_acquire);
            goto walk;
        }
    } else {
        memset(tc, 0, sizeof *tc);
        tc->epoch = epoch;
    }
    level = 0;
    v = atomic_load_explicit(&root->slot[slot_index(0, a)], memory_order_acquire);
walk:
    while (is_node(v)) {
        node_t *n = untag(v);
        level++;
        tc->key[ci] = key;
        tc->node[ci] = n;
        tc->level[ci] = (uint8_t)level;
        v = atomic_load_explicit(&n->slot[slot_index(level, a)], memory_order_acquire);
    }
    if (!v) return NULL;
    return resolve(v, a);
}

static void fill_entry(const rec_t *r, hm_tracker_entry_t *out) {
    out->base = r->base;
    out->size = r->size;
    out->pool = r->pool;
    out->provider = r->provider;
    out->id = r->id;
    out->flags = r->flags;
}

HM_RUN int hm__tracker_lookup(const void *ptr, hm_tracker_entry_t *out) {
    rd_t rd = rd_lock();
    rec_t *r = find_rec((uintptr_t)ptr);
    if (r && out) fill_entry(r, out);
    rd_unlock(rd);
    return r != NULL;
}

HM_RUN hm_pool_t *hm__tracker_lookup_pool(const void *ptr) {
    rd_t rd = rd_lock();
    rec_t *r = find_rec((uintptr_t)ptr);
    hm_pool_t *pool = r ? r->pool : NULL;
    rd_unlock(rd);
    return pool;
}

/* ---- updates --------------------------------------------------------------
 * One walk applies an operation to every slot of a range's cover:
 *   INSERT   0 -> new record (CAS; anything else there is an overlap)
 *   REPLACE  old record(s) -> new record(s) over the same bytes: split
 *            (1 -> 2), merge (2 -> 1), remove (1 -> 0), rollback of a failed
 *            insert (1 -> 0, slots not holding it are skipped silently).
 * Each slot changes by one atomic store/CAS from an old value to a new one,
 * so a lookup sees the old record(s) or the new one(s), never nothing. Where
 * a split point falls inside a slot that held the old record whole, the
 * child node is built privately (pre-filled with the old record) and
 * published with one release CAS. */
enum { OP_INSERT, OP_REPLACE };

typedef struct op {
    int kind;
    int tolerant; /* REPLACE: slots not in the expected state are not errors */
    rec_t *old[2];
    int n_old;
    rec_t *nw[2]; /* sorted by base, contiguous */
    int n_new;
    root_t *root;
    hm_result_t err;   /* INSERT: why it stopped */
    size_t conflicts;  /* REPLACE: unexpected slots skipped */
    int collapsed;     /* a node was unpublished: bump g_cache_epoch */
    retired_t *retired_head, *retired_tail;
    size_t n_retired, bytes_retired;
} op_t;

static void op_retire(op_t *op, void *obj) {
    retired_t *r = obj; /* kind already set */
    r->next = NULL;
    if (op->retired_tail)
        op->retired_tail->next = r;
    else
        op->retired_head = r;
    op->retired_tail = r;
    op->n_retired++;
    op->bytes_retired += r->bytes;
}

static int is_old(const op_t *op, const rec_t *r) {
    for (int i = 0; i < op->n_old; i++)
        if (op->old[i] == r) return 1;
    return 0;
}

/* Metadata for a REPLACE cannot be given up halfway without leaving a range
 * half split; an allocation failure there is treated like a failed mutex
 * operation (hm__die), after a few retries. INSERT fails cleanly instead. */
static void *must_alloc(void *(*fn)(uint32_t), uint32_t n) {
    for (int attempt = 0; attempt < 8; attempt++) {
        void *p = fn(n);
        if (p) return p;
        struct timespec ts = {0, 1000000L << attempt};
        nanosleep(&ts, NULL);
    }
    HM_DIE("tracker: out of host memory in the middle of a split/merge/remove");
}
static void *node_new_n(uint32_t unused) {
    (void)unused;
    return node_new();
}
static void *plist_new_n(uint32_t n) { return plist_new(n); }

/* Value a slot spanning [s, e) (wholly inside the op's range) should hold:
 * 0 if the op leaves nothing, the new record containing it, or 1 (an
 * impossible value) if a boundary between new records falls inside. */
static uintptr_t wanted_full(const op_t *op, uintptr_t s, uintptr_t e) {
    if (op->n_new == 0) return 0;
    for (int i = 0; i < op->n_new; i++) {
        const rec_t *r = op->nw[i];
        if (r->base <= s && e - 1 <= r->base + (r->size - 1)) return rec_val(op->nw[i]);
    }
    return 1;
}

/* Build the normalised value for a granule [s, e): kept entries plus the new
 * records that intersect it. Returns 0 (empty), a record value (one record
 * covering the granule) or a fresh page list; *fail on allocation failure or
 * (INSERT) overlap. */
static uintptr_t build_granule(op_t *op, uintptr_t cur, uintptr_t s, uintptr_t e, int *fail,
                               int *found_old) {
    ple_t tmp_small[8];
    ple_t *tmp = tmp_small;
    uint32_t n_cur = 0;
    const ple_t *cur_e = NULL;
    ple_t one;
    *fail = 0;
    *found_old = 0;
    if (cur && tag_of(cur) == TAG_LIST) {
        const plist_t *p = untag(cur);
        n_cur = p->n;
        cur_e = p->e;
    } else if (cur && tag_of(cur) == TAG_REC) {
        rec_t *r = untag(cur);
        one = (ple_t){r->base, r->base + r->size, r};
        cur_e = &one;
        n_cur = 1;
    }
    uint32_t cap = n_cur + (uint32_t)op->n_new;
    if (cap > 8) {
        tmp = malloc(cap * sizeof(ple_t));
        if (!tmp) {
            if (op->kind == OP_INSERT) {
                op->err = HM_ERROR_OUT_OF_HOST_MEMORY;
                *fail = 1;
                return 0;
            }
            tmp = must_alloc(plist_new_n, cap); /* any block of enough bytes */
        }
    }
    uint32_t n = 0;
    uintptr_t v = 0;
    /* Kept entries (everything but the old records), then the new records
     * intersecting the granule, merged in base order. */
    int k = 0;
    for (uint32_t i = 0; i <= n_cur; i++) {
        uintptr_t next_base = i < n_cur ? cur_e[i].base : UINTPTR_MAX;
        while (k < op->n_new && op->nw[k]->base < next_base) {
            rec_t *r = op->nw[k++];
            uintptr_t rend = r->base + r->size;
            if (r->base < e && s < rend) tmp[n++] = (ple_t){r->base, rend, r};
        }
        if (i == n_cur) break;
        if (op->kind == OP_REPLACE && is_old(op, cur_e[i].rec)) {
            ++*found_old;
            continue;
        }
        tmp[n++] = cur_e[i];
    }
    /* INSERT: the new entry must not overlap its neighbours. */
    if (op->kind == OP_INSERT) {
        for (uint32_t i = 1; i < n; i++)
            if (tmp[i - 1].end > tmp[i].base) {
                op->err = HM_ERROR_INVALID_ARGUMENT;
                *fail = 1;
                goto out;
            }
    }
    if (n == 0)
        v = 0;
    else if (n == 1 && tmp[0].base <= s && tmp[0].end >= e)
        v = rec_val(tmp[0].rec);
    else {
        plist_t *p = plist_new(n);
        if (!p) {
            if (op->kind == OP_INSERT) {
                op->err = HM_ERROR_OUT_OF_HOST_MEMORY;
                *fail = 1;
                goto out;
            }
            p = must_alloc(plist_new_n, n);
        }
        memcpy(p->e, tmp, n * sizeof(ple_t));
        v = list_val(p);
    }
out:
    if (tmp != tmp_small) free(tmp);
    return v;
}

/* Free a value built by this op that never got published. */
static void discard_private(uintptr_t v, unsigned level) {
    (void)level;
    free_subtree(v);
}

static int walk(op_t *op, slot_t *slots, unsigned level, uintptr_t node_base, uintptr_t lo,
                uintptr_t hi);

/* CAS a slot; record root pages written. */
static int slot_cas(op_t *op, slot_t *slot, unsigned level, uintptr_t *cur, uintptr_t v) {
    if (!atomic_compare_exchange_strong_explicit(slot, cur, v, memory_order_acq_rel,
                                                 memory_order_acquire))
        return 0;
    if (level == 0 && op->root) root_mark_touched(op->root, slot);
    return 1;
}

/* Is cur (a record or page list) made only of the op's old records? */
static int only_old(const op_t *op, uintptr_t cur) {
    if (tag_of(cur) == TAG_REC) return is_old(op, untag(cur));
    const plist_t *p = untag(cur);
    for (uint32_t i = 0; i < p->n; i++)
        if (!is_old(op, p->e[i].rec)) return 0;
    return 1;
}

/* Apply op to one slot spanning [s, s + span); [lo, hi) is the op's range
 * clipped to it. Returns 0 to stop the walk (INSERT failure). */
HM_RUN static int slot_apply(op_t *op, slot_t *slot, unsigned level, uintptr_t s, uintptr_t lo,
                      uintptr_t hi) {
    uintptr_t e = s + ((uintptr_t)1 << level_shift[level]);
    int full = lo == s && hi == e;
    uintptr_t cur = atomic_load_explicit(slot, memory_order_acquire);
    for (;;) {
        if (is_node(cur)) {
            /* Collapse: a validated replace whose new value for this whole
             * span is one record (or nothing). The subtree holds only the
             * op's old records (the range covers the span, and the old
             * records were claimed), so one CAS replaces it. Not for a
             * rollback: a failed insert's span may hold someone else's. */
            if (full && op->kind == OP_REPLACE && !op->tolerant) {
                uintptr_t want = wanted_full(op, s, e);
                if (want != 1) {
                    if (slot_cas(op, slot, level, &cur, want)) {
                        op->collapsed = 1;
                        op_retire(op, untag(cur));
                        return 1;
                    }
                    continue;
                }
            }
            return walk(op, ((node_t *)untag(cur))->slot, level + 1, s, lo, hi);
        }

        if (!full && level < LEAF_LEVEL) {
            /* Partially covered, no node yet: only an insert creates one. */
            if (op->kind == OP_REPLACE) {
                if (!op->tolerant) op->conflicts++;
                return 1;
            }
            if (cur) { /* a record covers the whole span: overlap */
                op->err = HM_ERROR_INVALID_ARGUMENT;
                return 0;
            }
            node_t *n = node_new();
            if (!n) {
                op->err = HM_ERROR_OUT_OF_HOST_MEMORY;
                return 0;
            }
            if (!slot_cas(op, slot, level, &cur, (uintptr_t)n)) free(n); /* lost: use theirs */
            else cur = (uintptr_t)n;
            continue;
        }

        /* Full slot at any level, or a partial granule at the leaf. */
        uintptr_t want;
        if (op->kind == OP_INSERT) {
            if (full) {
                if (cur) {
                    op->err = HM_ERROR_INVALID_ARGUMENT;
                    return 0;
                }
                want = rec_val(op->nw[0]);
            } else {
                int fail, found_old;
                want = build_granule(op, cur, s, e, &fail, &found_old);
                if (fail) return 0;
            }
            if (slot_cas(op, slot, level, &cur, want)) {
                if (cur && tag_of(cur) == TAG_LIST) op_retire(op, untag(cur));
                return 1;
            }
            if (want && tag_of(want) == TAG_LIST) free(untag(want));
            continue; /* cur reloaded by the failed CAS */
        }

        /* REPLACE */
        if (!cur) {
            if (!op->tolerant) op->conflicts++;
            return 1;
        }
        if (full) {
            if (!only_old(op, cur)) {
                if (!op->tolerant) op->conflicts++;
                return 1;
            }
            want = wanted_full(op, s, e);
            if (want == 1) { /* a boundary between new records inside this slot */
                if (level == LEAF_LEVEL) {
                    int fail, found_old;
                    want = build_granule(op, 0, s, e, &fail, &found_old);
                } else {
                    /* Build the child privately: every slot first holds what
                     * this one holds (old records only), then the same op
                     * rewrites it; publish it with one release CAS. */
                    node_t *n = must_alloc(node_new_n, 0);
                    for (unsigned i = 0; i < NODE_SLOTS; i++)
                        atomic_store_explicit(&n->slot[i], cur, memory_order_relaxed);
                    /* cur is a record here (page lists live only at the
                     * leaf), so the private walk retires nothing. */
                    walk(op, n->slot, level + 1, s, s, e);
                    want = (uintptr_t)n;
                }
            }
        } else {
            /* Partial granule at the leaf: cur is a page list (or a record
             * that is not ours). */
            if (tag_of(cur) == TAG_REC) {
                if (!op->tolerant) op->conflicts++;
                return 1;
            }
            int fail, found_old;
            want = build_granule(op, cur, s, e, &fail, &found_old);
            if (!found_old) {
                discard_private(want, LEAF_LEVEL);
                if (!op->tolerant) op->conflicts++;
                return 1;
            }
        }
        if (tag_of(cur) == TAG_REC && op->kind == OP_REPLACE) {
            /* The slot holds one of our claimed records: no other writer
             * may change it, a release store is enough. */
            atomic_store_explicit(slot, want, memory_order_release);
            if (level == 0) root_mark_touched(op->root, slot);
            return 1;
        }
        if (slot_cas(op, slot, level, &cur, want)) {
            if (tag_of(cur) == TAG_LIST) op_retire(op, untag(cur));
            return 1;
        }
        discard_private(want, level);
    }
}

/* slot_apply's replace of a leaf slot [s, e) wholly inside the op's range
 * that holds one of the op's old records, without its generic steps (one
 * release store, as slot_apply's). 0: not that case, nothing changed
 * (slot_apply decides). walk tests the commonest cases, an insert into an
 * empty granule and a plain remove, first (a range of 64 KiB is 16
 * granules). */
HM_INLINE int leaf_full_quick(op_t *op, slot_t *slot, uintptr_t s, uintptr_t e) {
    if (op->kind != OP_REPLACE) return 0;
    uintptr_t cur = atomic_load_explicit(slot, memory_order_acquire);
    if (!cur || tag_of(cur) != TAG_REC || !is_old(op, untag(cur))) return 0;
    uintptr_t want = wanted_full(op, s, e);
    if (want == 1) return 0;
    /* One of our claimed records: no other writer may change the slot. */
    atomic_store_explicit(slot, want, memory_order_release);
    return 1;
}

static int walk(op_t *op, slot_t *slots, unsigned level, uintptr_t node_base, uintptr_t lo,
                uintptr_t hi) {
    unsigned shift = level_shift[level];
    size_t first = (lo - node_base) >> shift;
    size_t last = (hi - 1 - node_base) >> shift;
    if (level == LEAF_LEVEL) {
        /* The granules wholly inside [lo, hi): an insert's one value, or a
         * plain remove's one old value (replaced by nothing), tested per
         * granule before anything else. */
        uintptr_t ins = op->kind == OP_INSERT ? rec_val(op->nw[0]) : 0;
        uintptr_t rm = op->kind == OP_REPLACE && op->n_old == 1 && op->n_new == 0
                           ? rec_val(op->old[0])
                           : 0;
        for (size_t i = first; i <= last; i++) {
            uintptr_t s = node_base + ((uintptr_t)i << shift);
            uintptr_t e = s + ((uintptr_t)1 << shift);
            if (lo <= s && e <= hi) {
                if (ins) {
                    uintptr_t cur = 0;
                    if (atomic_compare_exchange_strong_explicit(&slots[i], &cur, ins,
                                                                memory_order_acq_rel,
                                                                memory_order_acquire))
                        continue;
                } else if (rm) {
                    /* One of our claimed records: a release store, as slot_apply's. */
                    if (atomic_load_explicit(&slots[i], memory_order_acquire) == rm) {
                        atomic_store_explicit(&slots[i], 0, memory_order_release);
                        continue;
                    }
                } else if (leaf_full_quick(op, &slots[i], s, e)) {
                    continue;
                }
            }
            uintptr_t clo = lo > s ? lo : s;
            uintptr_t chi = hi < e ? hi : e;
            if (!slot_apply(op, &slots[i], level, s, clo, chi)) return 0;
        }
        return 1;
    }
    for (size_t i = first; i <= last; i++) {
        uintptr_t s = node_base + ((uintptr_t)i << shift);
        uintptr_t e = s + ((uintptr_t)1 << shift);
        uintptr_t clo = lo > s ? lo : s;
        uintptr_t chi = hi < e ? hi : e;
        if (!slot_apply(op, &slots[i], level, s, clo, chi)) return 0;
    }
    return 1;
}

/* Run op over [lo, hi) from the root. Inside a read-side section. */
static int run_op(op_t *op, uintptr_t lo, uintptr_t hi) {
    return walk(op, op->root->slot, 0, 0, lo, hi);
}

/* Before the grace period that frees collapsed nodes starts. */
static void op_publish_collapse(op_t *op) {
    if (op->collapsed) {
        atomic_fetch_add_explicit(&g_cache_epoch, 1, memory_order_acq_rel);
        op->collapsed = 0;
    }
}

static void op_flush_retired(op_t *op) {
    op_publish_collapse(op);
    retire_list(op->retired_head, op->retired_tail, op->n_retired, op->bytes_retired);
    op->retired_head = op->retired_tail = NULL;
    op->n_retired = op->bytes_retired = 0;
}

static void op_report_conflicts(const op_t *op, const char *what, uintptr_t lo, uintptr_t hi) {
    if (op->conflicts)
        HM_LOG_ERROR("tracker %s of [%#lx, %#lx): %zu slots were not in the expected state "
                     "(concurrent overlapping update?)",
                     what, (unsigned long)lo, (unsigned long)hi, op->conflicts);
}

static int range_ok(uintptr_t base, size_t size) {
    return base != 0 && size != 0 && hm__range_below(base, size, VA_BITS);
}

/* ---- per-pool index ----
 * Every live index is on one registry list so that fork can take every
 * index lock (a thread holding one at fork time would leave the child's copy
 * locked forever). Touched only at pool create/destroy and fork. */
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static hm_tracker_index_t *g_reg_head;

HM_RUN void hm__tracker_index_init(hm_tracker_index_t *idx) {
    int e = pthread_mutex_init(&idx->lock, NULL);
    if (e) HM_DIE("pthread_mutex_init: %d", e);
    idx->head = NULL;
    idx->count = 0;
    idx->bytes = 0;
    hm__mutex_lock(&g_reg_lock);
    idx->reg_prev = NULL;
    idx->reg_next = g_reg_head;
    if (g_reg_head) g_reg_head->reg_prev = idx;
    g_reg_head = idx;
    hm__mutex_unlock(&g_reg_lock);
}

void hm__tracker_index_fini(hm_tracker_index_t *idx) {
    hm__mutex_lock(&idx->lock);
    size_t left = idx->count;
    hm__mutex_unlock(&idx->lock);
    if (left) {
        HM_LOG_ERROR("tracker: index %p finalised with %zu records; dropping them", (void *)idx,
                     left);
        hm__tracker_index_drain(idx, NULL, NULL);
    }
    hm__mutex_lock(&g_reg_lock);
    if (idx->reg_prev)
        idx->reg_prev->reg_next = idx->reg_next;
    else
        g_reg_head = idx->reg_next;
    if (idx->reg_next) idx->reg_next->reg_prev = idx->reg_prev;
    hm__mutex_unlock(&g_reg_lock);
    pthread_mutex_destroy(&idx->lock);
}

void hm__tracker_index_stats(hm_tracker_index_t *idx, size_t *count, size_t *bytes) {
    hm__mutex_lock(&idx->lock);
    if (count) *count = idx->count;
    if (bytes) *bytes = idx->bytes;
    hm__mutex_unlock(&idx->lock);
}

static void index_link(hm_tracker_index_t *idx, rec_t *r) {
    r->prev = NULL;
    r->next = idx->head;
    if (idx->head) idx->head->prev = r;
    idx->head = r;
    idx->count++;
    idx->bytes += r->size;
}

static void index_unlink(hm_tracker_index_t *idx, rec_t *r) {
    if (r->prev)
        r->prev->next = r->next;
    else
        idx->head = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    idx->count--;
    idx->bytes -= r->size;
}

/* ---- public (internal) calls ---- */

static rec_t *rec_new(hm_tracker_index_t *idx, hm_pool_t *pool, hm_provider_t *provider,
                      uintptr_t base, size_t size, uint32_t flags, uint64_t id) {
    rec_t *r = malloc(sizeof *r);
    if (!r) return NULL;
    r->retire.next = NULL;
    r->retire.kind = RET_PLAIN;
    r->retire.bytes = sizeof *r;
    r->base = base;
    r->size = size;
    r->pool = pool;
    r->provider = provider;
    r->id = id;
    r->flags = flags;
    atomic_init(&r->state, REC_INSERTING);
    r->idx = idx;
    r->prev = r->next = NULL;
    return r;
}

HM_RUN
hm_result_t hm__tracker_insert(hm_tracker_index_t *idx, hm_pool_t *pool, hm_provider_t *provider,
                               uintptr_t base, size_t size, uint32_t flags, uint64_t *id) {
    if (hm_unlikely(!idx || !range_ok(base, size))) {
        uintptr_t end;
        if (idx && base && size && !__builtin_add_overflow(base, size, &end)) {
            /* A real range the tree cannot hold: it covers 57 bits (every
             * user address of x86-64 with 5-level paging). */
            HM_LOG_ERROR("tracker insert: [%#lx, +%zu) reaches beyond the %d-bit address space "
                         "the tracker covers", (unsigned long)base, size, VA_BITS);
            return HM_ERROR_NOT_SUPPORTED;
        }
        HM_LOG_ERROR("tracker insert: invalid %s [%#lx, +%zu)", idx ? "range" : "index (NULL)",
                     (unsigned long)base, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    root_t *root = root_get();
    if (hm_unlikely(!root)) return HM_ERROR_OUT_OF_HOST_MEMORY;
    rec_t *r = rec_new(idx, pool, provider, base, size, flags, new_id());
    if (hm_unlikely(!r)) {
        HM_LOG_ERROR("tracker insert: out of host memory for a record");
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    op_t op = {.kind = OP_INSERT, .nw = {r}, .n_new = 1, .root = root, .err = HM_SUCCESS};
    rd_t rd = rd_lock();
    int ok = run_op(&op, base, base + size);
    if (hm_unlikely(!ok)) {
        /* Undo what was published; lookups may have seen r meanwhile, so r
         * is reclaimed after a grace period like any removed record. */
        op_t undo = {.kind = OP_REPLACE, .tolerant = 1, .old = {r}, .n_old = 1, .root = root};
        run_op(&undo, base, base + size);
        rd_unlock(rd);
        op_flush_retired(&op);
        op_flush_retired(&undo);
        retire_one(&r->retire);
        if (op.err == HM_ERROR_INVALID_ARGUMENT)
            HM_LOG_ERROR("tracker insert: [%#lx, +%zu) overlaps a tracked range",
                         (unsigned long)base, size);
        else
            HM_LOG_ERROR("tracker insert: out of host memory for [%#lx, +%zu)",
                         (unsigned long)base, size);
        return op.err;
    }
    rd_unlock(rd);
    op_flush_retired(&op);
    hm__mutex_lock(&idx->lock);
    index_link(idx, r);
    hm__mutex_unlock(&idx->lock);
    atomic_store_explicit(&r->state, REC_LIVE, memory_order_release);
    if (id) *id = r->id;
    return HM_SUCCESS;
}

/* Claim the live record that is exactly [base, base+size) (size 0: any
 * size). Inside a read-side section. */
static rec_t *claim(uintptr_t base, size_t size) {
    rec_t *r = find_rec(base);
    if (!r || r->base != base || (size && r->size != size)) return NULL;
    uint32_t expected = REC_LIVE;
    if (!atomic_compare_exchange_strong_explicit(&r->state, &expected, REC_BUSY,
                                                 memory_order_acq_rel, memory_order_relaxed))
        return NULL;
    return r;
}

HM_RUN hm_result_t hm__tracker_remove(uintptr_t base, size_t size) {
    if (hm_unlikely(!range_ok(base, size))) return HM_ERROR_NOT_FOUND;
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    if (!root) return HM_ERROR_NOT_FOUND;
    rd_t rd = rd_lock();
    rec_t *r = claim(base, size);
    if (!r) {
        rd_unlock(rd);
        return HM_ERROR_NOT_FOUND;
    }
    op_t op = {.kind = OP_REPLACE, .old = {r}, .n_old = 1, .root = root};
    run_op(&op, base, base + size);
    rd_unlock(rd);
    op_report_conflicts(&op, "remove", base, base + size);
    hm_tracker_index_t *idx = r->idx;
    hm__mutex_lock(&idx->lock);
    index_unlink(idx, r);
    hm__mutex_unlock(&idx->lock);
    op_retire(&op, r);
    op_flush_retired(&op);
    return HM_SUCCESS;
}

hm_result_t hm__tracker_split(uintptr_t base, size_t total, size_t first) {
    if (hm_unlikely(!range_ok(base, total) || first == 0 || first >= total)) {
        HM_LOG_ERROR("tracker split: invalid arguments [%#lx, +%zu) at %zu", (unsigned long)base,
                     total, first);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    if (!root) return HM_ERROR_NOT_FOUND;
    rec_t *hi_rec = rec_new(NULL, NULL, NULL, base + first, total - first, 0, new_id());
    rec_t *lo_rec = rec_new(NULL, NULL, NULL, base, first, 0, 0);
    if (!hi_rec || !lo_rec) {
        free(hi_rec);
        free(lo_rec);
        HM_LOG_ERROR("tracker split: out of host memory");
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    rd_t rd = rd_lock();
    rec_t *r = claim(base, total);
    if (!r) {
        rd_unlock(rd);
        free(hi_rec);
        free(lo_rec);
        return HM_ERROR_NOT_FOUND;
    }
    lo_rec->id = r->id; /* the lower part keeps the id */
    lo_rec->pool = hi_rec->pool = r->pool;
    lo_rec->provider = hi_rec->provider = r->provider;
    lo_rec->flags = hi_rec->flags = r->flags;
    lo_rec->idx = hi_rec->idx = r->idx;
    op_t op = {.kind = OP_REPLACE, .old = {r}, .n_old = 1, .nw = {lo_rec, hi_rec}, .n_new = 2,
               .root = root};
    run_op(&op, base, base + total);
    rd_unlock(rd);
    op_report_conflicts(&op, "split", base, base + total);
    hm_tracker_index_t *idx = r->idx;
    hm__mutex_lock(&idx->lock);
    index_unlink(idx, r);
    index_link(idx, lo_rec);
    index_link(idx, hi_rec);
    hm__mutex_unlock(&idx->lock);
    atomic_store_explicit(&lo_rec->state, REC_LIVE, memory_order_release);
    atomic_store_explicit(&hi_rec->state, REC_LIVE, memory_order_release);
    op_retire(&op, r);
    op_flush_retired(&op);
    return HM_SUCCESS;
}

hm_result_t hm__tracker_rehome(uintptr_t base, size_t size, hm_tracker_index_t *idx,
                               hm_pool_t *pool, hm_provider_t *provider) {
    if (hm_unlikely(!idx || !range_ok(base, size))) {
        HM_LOG_ERROR("tracker rehome: invalid arguments [%#lx, +%zu)", (unsigned long)base, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    if (!root) return HM_ERROR_NOT_FOUND;
    rec_t *nr = rec_new(idx, pool, provider, base, size, 0, 0);
    if (!nr) {
        HM_LOG_ERROR("tracker rehome: out of host memory");
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    rd_t rd = rd_lock();
    rec_t *r = claim(base, size);
    if (!r) {
        rd_unlock(rd);
        free(nr);
        return HM_ERROR_NOT_FOUND;
    }
    nr->id = r->id;
    nr->flags = r->flags;
    op_t op = {.kind = OP_REPLACE, .old = {r}, .n_old = 1, .nw = {nr}, .n_new = 1, .root = root};
    run_op(&op, base, base + size);
    rd_unlock(rd);
    op_report_conflicts(&op, "rehome", base, base + size);
    hm_tracker_index_t *old_idx = r->idx;
    hm__mutex_lock(&old_idx->lock);
    index_unlink(old_idx, r);
    hm__mutex_unlock(&old_idx->lock);
    hm__mutex_lock(&idx->lock);
    index_link(idx, nr);
    hm__mutex_unlock(&idx->lock);
    atomic_store_explicit(&nr->state, REC_LIVE, memory_order_release);
    op_retire(&op, r);
    op_flush_retired(&op);
    return HM_SUCCESS;
}

hm_result_t hm__tracker_merge(uintptr_t lo, uintptr_t hi, size_t total) {
    if (hm_unlikely(!range_ok(lo, total) || hi <= lo || hi - lo >= total)) {
        HM_LOG_ERROR("tracker merge: invalid arguments [%#lx, %#lx, +%zu)", (unsigned long)lo,
                     (unsigned long)hi, total);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    if (!root) return HM_ERROR_NOT_FOUND;
    rec_t *m = rec_new(NULL, NULL, NULL, lo, total, 0, new_id());
    if (!m) {
        HM_LOG_ERROR("tracker merge: out of host memory");
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    rd_t rd = rd_lock();
    rec_t *a = claim(lo, hi - lo);
    if (!a) {
        rd_unlock(rd);
        free(m);
        return HM_ERROR_NOT_FOUND;
    }
    rec_t *b = find_rec(hi);
    hm_result_t res = HM_SUCCESS;
    if (!b || b->base != hi || b->size != total - (hi - lo))
        res = HM_ERROR_NOT_FOUND;
    else if (b->pool != a->pool || b->provider != a->provider || b->idx != a->idx ||
             b->flags != a->flags)
        res = HM_ERROR_INVALID_ARGUMENT;
    else {
        uint32_t expected = REC_LIVE;
        if (!atomic_compare_exchange_strong_explicit(&b->state, &expected, REC_BUSY,
                                                     memory_order_acq_rel, memory_order_relaxed))
            res = HM_ERROR_NOT_FOUND;
    }
    if (res != HM_SUCCESS) {
        atomic_store_explicit(&a->state, REC_LIVE, memory_order_release);
        rd_unlock(rd);
        free(m);
        if (res == HM_ERROR_INVALID_ARGUMENT)
            HM_LOG_ERROR("tracker merge: [%#lx, +%zu) and [%#lx, ...) belong to different "
                         "pools, providers or kinds",
                         (unsigned long)lo, hi - lo, (unsigned long)hi);
        return res;
    }
    m->pool = a->pool;
    m->provider = a->provider;
    m->flags = a->flags;
    m->idx = a->idx;
    op_t op = {.kind = OP_REPLACE, .old = {a, b}, .n_old = 2, .nw = {m}, .n_new = 1,
               .root = root};
    run_op(&op, lo, lo + total);
    rd_unlock(rd);
    op_report_conflicts(&op, "merge", lo, lo + total);
    hm_tracker_index_t *idx = a->idx;
    hm__mutex_lock(&idx->lock);
    index_unlink(idx, a);
    index_unlink(idx, b);
    index_link(idx, m);
    hm__mutex_unlock(&idx->lock);
    atomic_store_explicit(&m->state, REC_LIVE, memory_order_release);
    op_retire(&op, a);
    op_retire(&op, b);
    op_flush_retired(&op);
    return HM_SUCCESS;
}

void hm__tracker_index_drain(hm_tracker_index_t *idx,
                             void (*cb)(void *arg, const hm_tracker_entry_t *entry), void *arg) {
    if (!idx) return;
    /* 1. Take this index's records (claiming each). */
    rec_t *mine = NULL;
    size_t busy = 0;
    hm__mutex_lock(&idx->lock);
    for (rec_t *r = idx->head, *next; r; r = next) {
        next = r->next;
        uint32_t expected = REC_LIVE;
        if (!atomic_compare_exchange_strong_explicit(&r->state, &expected, REC_BUSY,
                                                     memory_order_acq_rel, memory_order_relaxed)) {
            busy++; /* another writer owns it and will unlink it */
            continue;
        }
        index_unlink(idx, r);
        r->next = mine;
        mine = r;
    }
    hm__mutex_unlock(&idx->lock);
    if (busy)
        HM_LOG_WARN("tracker drain of index %p: %zu records were being changed concurrently",
                    (void *)idx, busy);
    if (!mine) return;

    /* 2. Unpublish them. */
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    op_t op = {.kind = OP_REPLACE, .n_old = 1, .root = root};
    rd_t rd = rd_lock();
    for (rec_t *r = mine; r; r = r->next) {
        op.old[0] = r;
        run_op(&op, r->base, r->base + r->size);
    }
    rd_unlock(rd);
    op_report_conflicts(&op, "drain", 0, 0);

    /* 3. One grace period for all of them, then report and free. (The
     * shards' lists are left alone: freeing them here would make a pool's
     * destroy cost depend on other pools' activity.) */
    op_publish_collapse(&op);
    grace_period();
    free_list(op.retired_head);
    for (rec_t *r = mine, *next; r; r = next) {
        next = r->next;
        if (cb) {
            hm_tracker_entry_t e;
            fill_entry(r, &e);
            cb(arg, &e);
        }
        free(r);
    }
}

void hm__tracker_flush(void) {
    retired_t *pending = steal_all_shards();
    grace_period();
    free_list(pending);
    /* and the batches already handed to call_rcu */
    wait_batches();
}

/* ---- library hooks ---- */

HM_RUN void hm__tracker_init(void) { (void)root_get(); }

/* Does the subtree hold anything but nodes? */
static int subtree_has_records(uintptr_t v) {
    if (!v) return 0;
    if (!is_node(v)) return 1;
    node_t *n = untag(v);
    for (unsigned i = 0; i < NODE_SLOTS; i++)
        if (subtree_has_records(atomic_load_explicit(&n->slot[i], memory_order_relaxed)))
            return 1;
    return 0;
}

/* Calls fn on every root slot value in a touched page; stops at non-zero. */
static int root_scan(root_t *root, int (*fn)(uintptr_t)) {
    const size_t per_page = 4096 / sizeof(slot_t);
    for (size_t w = 0; w < sizeof root->touched / sizeof root->touched[0]; w++) {
        uint64_t bits = atomic_load_explicit(&root->touched[w], memory_order_relaxed);
        while (bits) {
            size_t page = w * 64 + (size_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            for (size_t i = page * per_page; i < (page + 1) * per_page; i++)
                if (fn(atomic_load_explicit(&root->slot[i], memory_order_relaxed))) return 1;
        }
    }
    return 0;
}

static int free_one_root_slot(uintptr_t v) {
    if (is_node(v)) free_subtree(v); /* no records are left */
    return 0;
}

void hm__tracker_fini(void) {
    root_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
    if (root && root_scan(root, subtree_has_records)) {
        /* Records are left (pools not destroyed): keep everything, the
         * memory is the program's until it exits. */
        hm__tracker_flush();
        return;
    }
    atomic_store_explicit(&g_root, NULL, memory_order_release);
    atomic_fetch_add_explicit(&g_cache_epoch, 1, memory_order_acq_rel);
    /* Lookups that still hold the old root finish before we free it. */
    hm__tracker_flush();
    if (root) {
        root_scan(root, free_one_root_slot);
        root_unmap(root);
    }
}

/* Fork, in two parts around the other modules' hooks (the RCU and TRACKER
 * slots of the library's fork list, fork.h). _rcu: the call_rcu helper is
 * paused before anything else is locked, since it may be inside a grace
 * period (which needs urcu's gp lock) or running callbacks, and batch_free
 * calls free, which under libhetmem_proxy.so takes the native pool's locks;
 * it is resumed (in the child: re-created, which calls malloc) after
 * everything else is usable again. The rest, after the pools' and IPC's
 * locks (they call the tracker under them): g_reclaim_lock, the index registry and every index lock (a
 * writer holds an index lock only briefly and takes nothing under it), our
 * shard locks, then urcu-bp's locks; undone in reverse, in the child too:
 * the forking thread owns every one of them there, so unlocking is valid
 * (and, unlike re-initialising, keeps TSan's lock graph right). */
void hm__tracker_atfork_prepare_rcu(void) { urcu_bp_call_rcu_before_fork(); }

void hm__tracker_atfork_prepare(void) {
    hm__mutex_lock(&g_reclaim_lock);
    hm__mutex_lock(&g_reg_lock);
    for (hm_tracker_index_t *x = g_reg_head; x; x = x->reg_next) hm__mutex_lock(&x->lock);
    for (unsigned i = 0; i < RETIRE_SHARDS; i++) hm__mutex_lock(&g_shards[i].lock);
    urcu_bp_before_fork();
}

void hm__tracker_atfork_parent(void) {
    urcu_bp_after_fork_parent();
    for (unsigned i = RETIRE_SHARDS; i-- > 0;) hm__mutex_unlock(&g_shards[i].lock);
    for (hm_tracker_index_t *x = g_reg_head; x; x = x->reg_next) hm__mutex_unlock(&x->lock);
    hm__mutex_unlock(&g_reg_lock);
    hm__mutex_unlock(&g_reclaim_lock);
}

void hm__tracker_atfork_parent_rcu(void) { urcu_bp_call_rcu_after_fork_parent(); }

void hm__tracker_atfork_child(void) {
    urcu_bp_after_fork_child();
    for (unsigned i = RETIRE_SHARDS; i-- > 0;) hm__mutex_unlock(&g_shards[i].lock);
    for (hm_tracker_index_t *x = g_reg_head; x; x = x->reg_next) hm__mutex_unlock(&x->lock);
    hm__mutex_unlock(&g_reg_lock);
    hm__mutex_unlock(&g_reclaim_lock);
}

void hm__tracker_atfork_child_rcu(void) { urcu_bp_call_rcu_after_fork_child(); }
