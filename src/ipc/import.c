/* hetmem — IPC, import side: hm_ipc_open/close and the opened-handle cache.
 * SPDX-License-Identifier: MIT
 *
 * OPENED-HANDLE CACHE (consumer side). One entry per opened mapping:
 *   key   (exporter pid, exporter nonce, remote base) in the importing
 *         pool's key index (open addressing, 16-byte slots holding the
 *         key's hash and the entry). Hit: every field of the caller's
 *         handle but the offset equals the entry's record of the last fully
 *         validated handle that named it, the offset is inside the
 *         allocation and the handle's checksum is right (imp_hit: reads the
 *         index slot and the entry's two hot lines; no decode, no byte copy
 *         of the handle); else the handle is decoded and validated, and hits
 *         if imp_same() holds (the same test on the decoded fields).
 *   also  by local base in the same pool's second hash (close slow path).
 *   map   for providers that name a driver context: the shared mapping
 *         (smap, import_shared.c, part of this file's translation unit)
 *         whose members are the entries of
 *         every pool over that context that opened the handle; one driver
 *         open and one close per mapping, however many pools hold it.
 *   ring  a process-wide CLOCK ring of every cached mapping (F. J. Corbato,
 *         "A paging experiment with the Multics system", 1968: second-chance
 *         approximation of LRU), for the count/byte bound.
 *   state one atomic word: generation << 32 | STALE | refs. Opens add
 *         references under pi->lock; closes drop them by compare-and-swap,
 *         from a per-thread cache of recently opened (range, entry,
 *         generation) slots with no lock and no tracker lookup, or through
 *         the tracker and pi->lock. Whoever unlinks an entry for good bumps
 *         its generation (imp_kill), so an outdated slot's CAS fails.
 *         Entries are type-stable: recycled through a free list, never
 *         returned to malloc, so reading `state` through an outdated slot
 *         is safe.
 * Each pool's index lives in its own struct hm_ipc_pool with its own lock,
 * so destroying pool A touches only A's entries (O(A's entries), no global
 * scan) and never blocks an open through pool B: A's destroy unlinks its
 * entries 16 per hold of A's lock (which B's opens never take), takes the
 * ring lock once per 16 ring unlinks (B's hits never take it) and unmaps
 * with no lock held. Hit counters are per pool; in-use counts are summed
 * when the statistics are read: no shared counter on a hit.
 *
 *  Lock order: shared mappings (shared_maps.lock) -> pool lock (pi->lock) -> ring
 *  lock (opened.lock);
 *  hm__ipc_pilist_lock -> pi->lock (statistics, fork). exports.lock (export.c) and the arenas' locks nest
 *  with nothing.
 *
 *  Entry fields and who guards them:
 *   refs (in state)                 added under pi->lock; dropped by CAS
 *                                   anywhere; under pi->lock a zero count
 *                                   stays zero (only opens add)
 *   generation, STALE (in state)    changed under pi->lock
 *   in_key, in_local, hash links,   pi->lock
 *   key index slots
 *   ring links, in_ring, claimed,   opened.lock
 *   dead
 *   used (CLOCK reference bit)      atomic, no lock
 *
 *  Lifecycle: an entry is "owned for closing" by whoever removes it from
 *  its pool's local-address hash (close of the last user of a stale entry,
 *  open replacing an unused stale entry, the evictor, the pool destroy).
 *  The evictor first claims an entry under opened.lock (removing it from the
 *  ring) and only then takes the pool lock; if someone else became the
 *  closer meanwhile, the last of the two to let go recycles the memory
 *  (`dead`). A destroy waits for the pool's in-flight evictors
 *  (pi->evictors) before freeing the pool's IPC state.
 *
 *  A mapping whose provider close fails (eviction, a stale entry's last
 *  close, a destroy) has left the cache and the tracker: it is kept on its
 *  pool's `unclosed` list and closed again at the pool's next close of a
 *  mapping and at its destroy (once more there, then left mapped, logged).
 *  A failed close_many is not retried: which of its mappings it closed is
 *  not known.
 *
 *  Stale entries (a newer allocation at the same remote base opened
 *  successfully) leave the key hash then (later opens miss) and are closed
 *  when their last user closes them — never while in use (UMF replaces them
 *  regardless). A handle that fails to open replaces nothing, and a failed
 *  open leaves no entry behind (entries are inserted only after the mapping
 *  and its tracker record exist).
 *
 * Descriptors (channel.c): the exporter's verified pidfd is cached per
 * exporter identity, so a miss costs pidfd_getfd + the provider's mapping,
 * not pidfd_open + a /proc read each time. */
#include "ipc/ipc_core.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* data structures                                                          */

/* imp_t.state: (generation << 32) | ST_STALE | refs. The generation changes
 * (imp_kill) when the entry leaves its pool's hashes for good, so a
 * per-thread cache slot that remembers (entry, generation) can never act on
 * a closed or reused entry: its compare-and-swap fails. */
#define ST_REFS 0x7fffffffu
#define ST_STALE 0x80000000u
static inline uint32_t st_gen(uint64_t w) { return (uint32_t)(w >> 32); }
static inline uint32_t st_refs(uint64_t w) { return (uint32_t)w & ST_REFS; }

/* An opened mapping. Type-stable: the memory of an imp_t is never given
 * back to malloc, only recycled through imp_free_list (its state word keeps
 * counting generations), so a thread may read `state` of an entry it only
 * remembers. Everything but `state` is guarded as the table at the top of
 * this file says.
 *
 * Layout: a hit reads lines 0 and 1 (line 1 prefetched with line 0) and
 * nothing else of the entry. They hold, besides the state and the mapping,
 * every field of the last fully validated handle that named the entry
 * except its offset and checksum (which differ between handles of one
 * allocation) and the fields every valid handle has alike (magic, version,
 * header size; reserved bytes zero), stored narrower where the decoder
 * bounds them (pid < 2^31, kind, flags, length) and compared with the
 * caller's bytes widened: exact, no byte copy of the handle. Payloads longer
 * than IMP_PAY_INLINE bytes (file and devdax: 560) keep the rest in the
 * heap (pay_rest, in the cold line). 192 bytes from the huge-page object
 * arena (arena_t). */
#define IMP_PAY_INLINE 48
typedef struct imp {
    /* line 0: the key, the allocation, the mapping */
    _Atomic uint64_t state; /* first: kept across reuse */
    uintptr_t local;
    uint64_t rbase, nonce;  /* key (with pid) */
    uint64_t alloc_id;
    uint64_t size;          /* of the mapping = the exporter's allocation size */
    uint64_t start;         /* exporter's start time */
    uint32_t pid;
    int32_t fd;
    /* line 1: the rest of the validated handle */
    uint32_t family;
    uint16_t len;           /* total bytes of the handle */
    uint8_t kf;             /* kind | flags << 2 (kind <= 3, flags <= 1) */
    _Atomic uint8_t used;   /* CLOCK reference bit, atomic, no lock (set on a hit) */
    /* The offset (< 2^32; IMP_NO_MEMO: none) and the checksum folded with
     * the origin (memo_key) of the last handle whose checksum a hit
     * verified: a handle equal to it in every other field and carrying
     * all three is byte-identical to it, so valid without recomputing its
     * checksum. pi->lock. */
    uint32_t memo_crc, memo_off;
    unsigned char pay[IMP_PAY_INLINE]; /* the payload's first bytes (OS: all 48) */
    /* line 2, cold: slow paths only */
    unsigned char *pay_rest;   /* payload bytes past IMP_PAY_INLINE (heap), or NULL */
    struct imp *lnext;         /* local-address hash (pi->lock) */
    struct imp *rprev, *rnext; /* CLOCK ring (opened.lock) */
    struct imp *fnext;         /* arena free list (arena lock) */
    struct hm_ipc_pool *pi;
    struct smap *map;            /* the shared mapping it is a member of, or NULL (fixed) */
    bool in_key, in_local;       /* pi->lock */
    bool in_ring, claimed, dead; /* opened.lock */
    /* Counted in the cache (in_ring) but off the ring's links: the evictor
     * met it in use (ring_park). Its last close puts it back (ring_unpark).
     * Written under opened.lock, read by closers without it. */
    _Atomic uint8_t parked;
} HM_CACHE_ALIGNED imp_t;
#define IMP_NO_MEMO UINT32_MAX
_Static_assert(offsetof(imp_t, family) == 64 && offsetof(imp_t, pay) == 80 && offsetof(imp_t, pay_rest) == 128 &&
                   sizeof(imp_t) == 192,
               "imp_t: two hot cache lines and a cold one");
_Static_assert(HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX <= UINT16_MAX, "imp_t.len: 16 bits");
static arena_t imp_arena = {.lock = PTHREAD_MUTEX_INITIALIZER,
                            .objsize = sizeof(imp_t),
                            .link_off = offsetof(imp_t, fnext)};

/* A slot of a pool's key index: open addressing with linear probing (W. W.
 * Peterson, "Addressing for random-access storage", IBM J. Res. Dev. 1(2),
 * 1957), deletion by backward shift (D. E. Knuth, TAOCP vol. 3, 6.4,
 * Algorithm R), so no tombstones. The slot holds the key's full 64-bit hash:
 * a probe past other keys compares tags in the index line only and reads
 * no entry; the entry is read only when its tag matches. e == NULL: empty. */
typedef struct kslot {
    uint64_t tag;
    imp_t *e;
} kslot_t;

/* The opened-handle cache's global part: the CLOCK ring for the bound and
 * counters that only misses, evictions and destroys touch. */
static struct {
    pthread_mutex_t lock;
    imp_t *hand; /* CLOCK ring, NULL when empty */
    size_t count, bytes;
    _Atomic size_t a_count, a_bytes;
    _Atomic size_t max_entries, max_bytes;
    _Atomic uint64_t hits, misses, evictions, stale; /* hits: of destroyed pools */
} opened = {.lock = PTHREAD_MUTEX_INITIALIZER, .max_entries = 4096};

/* Per-thread cache of the mappings this thread opened last, for
 * hm_ipc_close(): a slot is (range, entry, generation); a close inside the
 * range drops its reference with one compare-and-swap on the entry's state,
 * which fails if the generation moved on (entry closed, evicted, its pool
 * destroyed, memory reused). Initial-exec TLS: 232 bytes of the static TLS
 * block, no __tls_get_addr call (the library is linked, not dlopen'ed, by
 * its users; glibc keeps a reserve for dlopen'ed ones). */
#define TC_SLOTS 8
typedef struct tcache {
    uintptr_t lo[TC_SLOTS];
    size_t len[TC_SLOTS]; /* 0: empty */
    imp_t *e[TC_SLOTS];
    uint32_t gen[TC_SLOTS];
    unsigned next;
} tcache_t;
/* Default TLS model (libhetmem.so may be dlopen()ed); the library is built
 * with TLS descriptors where available, so this costs no __tls_get_addr call. */
static __thread tcache_t thread_opens;

static inline void tc_note(imp_t *e, uint32_t gen, uintptr_t local, size_t size) {
    tcache_t *t = &thread_opens;
    for (unsigned i = 0; i < TC_SLOTS; i++)
        if (t->e[i] == e && t->gen[i] == gen && t->len[i]) return;
    unsigned i = t->next++ & (TC_SLOTS - 1);
    t->lo[i] = local;
    t->len[i] = size;
    t->e[i] = e;
    t->gen[i] = gen;
}

/* A hit on e, referenced (gen) under pi->lock: count it, drop the lock, note
 * it for the per-thread close path, and hand out local + offset. */
static inline hm_result_t hit_unlock(hm_ipc_pool_t *pi, imp_t *e, uint32_t gen, uint64_t offset,
                                     void **ptr) {
    uintptr_t local = e->local;
    size_t lsize = e->size;
    pi->hits++;
    hm__mutex_unlock(&pi->lock);
    tc_note(e, gen, local, lsize);
    *ptr = (void *)(local + offset);
    return HM_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* entries                                                                  */

/* A fresh entry for the validated handle w (not yet published). */
static imp_t *imp_alloc(const hm_wire_t *w) {
    unsigned char *rest = NULL;
    if (w->payload_len > IMP_PAY_INLINE &&
        !(rest = malloc(w->payload_len - IMP_PAY_INLINE)))
        return NULL;
    imp_t *e = hm__ipc_arena_alloc(&imp_arena);
    if (!e) {
        /* Arena exhausted (or no mapping): plain memory, recycled the same
         * way (never given back, so still type-stable). */
        void *m = NULL;
        if (posix_memalign(&m, HM_CACHE_LINE, sizeof(*e))) {
            free(rest);
            return NULL;
        }
        e = m;
        atomic_init(&e->state, 0);
    }
    /* A fresh arena object is zero (state 0); a recycled one keeps its state. */
    memset((char *)e + offsetof(imp_t, local), 0, sizeof(*e) - offsetof(imp_t, local));
    e->rbase = w->base;
    e->nonce = w->nonce;
    e->alloc_id = w->alloc_id;
    e->size = w->size;
    e->start = w->start_time;
    e->pid = (uint32_t)w->pid;     /* the decoder bounds it: < 2^31 */
    e->fd = w->fd;
    e->family = w->family;
    e->len = (uint16_t)w->total_size; /* <= HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX */
    /* kind <= HM_MEMORY_SHARED (3), flags HM__WIRE_HAS_FD or 0 (decoder) */
    e->kf = (uint8_t)(w->kind | w->flags << 2);
    e->memo_off = IMP_NO_MEMO;
    uint32_t inl = w->payload_len < IMP_PAY_INLINE ? w->payload_len : IMP_PAY_INLINE;
    memcpy(e->pay, w->payload, inl);
    if (rest) memcpy(rest, w->payload + inl, w->payload_len - inl);
    e->pay_rest = rest;
    return e;
}

/* Back to the free list (already out of every hash, the ring and every
 * claim; killed if it was ever published). */
static void imp_free(imp_t *e) {
    free(e->pay_rest);
    e->pay_rest = NULL;
    hm__ipc_arena_free(&imp_arena, e);
}

/* Whether the caller's handle bytes b (size bytes, unvalidated) hit e,
 * whose key (pid, nonce, base) they are already known to carry: every field
 * equal to e's validated handle's but the offset and the origin (both
 * differ between the handles of one allocation; the allocation itself was
 * verified against the exporter's copy at the miss), the reserved bytes
 * zero, the origin not 0, the offset inside the allocation and the checksum
 * right (recomputed unless offset
 * and checksum are those of the last handle verified here: then the bytes
 * are that handle's) — exactly what the decoder checks followed by
 * imp_same(): a handle that differs from the validated
 * one in anything but its offset (another allocation at that address, a
 * forgery with a recomputed checksum) goes the slow path. *offset: the
 * handle's offset. pi->lock held. */
/* The checksum folded with the origin, which the hit does not compare
 * with the entry's: an odd multiplier's high half changes with every
 * single-bit change of the origin, so a corrupted origin under the
 * memoised checksum is not taken for the memoised bytes. */
static inline uint32_t memo_key(uint32_t crc, uint64_t origin) {
    return crc ^ (uint32_t)((origin * 0x9e3779b97f4a7c15ull) >> 32);
}

static inline bool imp_hit(imp_t *e, const unsigned char *b, size_t size, uint64_t *offset) {
    uint32_t len = e->len, plen = len - HM_IPC_HEADER_SIZE;
    if (hm_unlikely(size < len)) return false;
    uint64_t d = (hm__wire_peek64(b, 0) ^ HM__WIRE_WORD0) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_TOTAL) ^ (len | (uint64_t)e->family << 32)) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_FLAGS) ^
                  ((uint32_t)(e->kf >> 2) | (uint64_t)plen << 32)) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_KIND) ^
                  ((uint32_t)(e->kf & 3) | (uint64_t)(uint32_t)e->fd << 32)) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_START) ^ e->start) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_ALLOC_ID) ^ e->alloc_id) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_SIZE) ^ e->size) |
                 hm__wire_peek32(b, HM__WIRE_OFF_RESERVED) |
                 (hm__wire_peek64(b, HM__WIRE_OFF_ORIGIN) == 0);
    uint64_t off = hm__wire_peek64(b, HM__WIRE_OFF_OFFSET);
    if (hm_unlikely(d != 0 || off >= e->size)) return false;
    uint32_t inl = plen < IMP_PAY_INLINE ? plen : IMP_PAY_INLINE;
    if (hm_unlikely(memcmp(b + HM_IPC_HEADER_SIZE, e->pay, inl) != 0)) return false;
    if (plen > inl && memcmp(b + HM_IPC_HEADER_SIZE + inl, e->pay_rest, plen - inl) != 0)
        return false;
    uint32_t crc = hm__wire_peek32(b, HM__WIRE_CRC_OFF);
    uint32_t key = memo_key(crc, hm__wire_peek64(b, HM__WIRE_OFF_ORIGIN));
    if (off != e->memo_off || key != e->memo_crc) { /* not the last verified bytes */
        if (hm_unlikely(hm__wire_checksum(b, plen) != crc)) return false;
        if (off < IMP_NO_MEMO) {
            e->memo_off = (uint32_t)off;
            e->memo_crc = key;
        }
    }
    *offset = off;
    return true;
}

/* The decoded (validated) handle w names e's allocation exactly as e's
 * validated handle did, in everything but the offset. pi->lock held. */
static bool imp_same(const imp_t *e, const hm_wire_t *w) {
    uint32_t inl = w->payload_len < IMP_PAY_INLINE ? w->payload_len : IMP_PAY_INLINE;
    return e->len == w->total_size && e->family == w->family &&
           e->kf == (w->kind | w->flags << 2) && e->fd == w->fd && e->pid == w->pid &&
           e->nonce == w->nonce &&
           e->start == w->start_time && e->alloc_id == w->alloc_id && e->rbase == w->base &&
           e->size == w->size && memcmp(w->payload, e->pay, inl) == 0 &&
           (w->payload_len == inl ||
            memcmp(w->payload + inl, e->pay_rest, w->payload_len - inl) == 0);
}

/* New generation, no references: every per-thread slot naming e is dead.
 * Called by whoever unlinks e from its pool's local hash, pi->lock held. */
static void imp_kill(imp_t *e) {
    uint64_t w = atomic_load_explicit(&e->state, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&e->state, &w, (uint64_t)(st_gen(w) + 1) << 32,
                                                  memory_order_acq_rel, memory_order_relaxed)) {
    }
}

static inline uint64_t key_hash(uint64_t pid, uint64_t nonce, uint64_t rbase) {
    return hm__ipc_mix64(rbase ^ hm__ipc_mix64(nonce ^ (pid << 40)));
}

static inline imp_t *key_find(hm_ipc_pool_t *pi, uint64_t h, uint64_t pid, uint64_t nonce,
                           uint64_t rbase) {
    size_t mask = pi->kcap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const kslot_t *k = &pi->ks[i];
        imp_t *e = k->e;
        if (!e) return NULL;
        if (k->tag != h) continue;
        __builtin_prefetch((const char *)e + 64); /* line 1, for imp_hit */
        if (e->rbase == rbase && e->nonce == nonce && e->pid == pid) return e;
    }
}
static imp_t *local_find(hm_ipc_pool_t *pi, uintptr_t local) {
    for (imp_t *e = pi->lb[hm__ipc_mix64(local) & (pi->cap - 1)]; e; e = e->lnext)
        if (e->local == local) return e;
    return NULL;
}
static void kput(kslot_t *ks, size_t kcap, uint64_t h, imp_t *e) {
    size_t i = h & (kcap - 1);
    while (ks[i].e) i = (i + 1) & (kcap - 1);
    ks[i].tag = h;
    ks[i].e = e;
}
static void kinsert(hm_ipc_pool_t *pi, uint64_t h, imp_t *e) {
    kput(pi->ks, pi->kcap, h, e);
    pi->kn++;
    e->in_key = true;
}
static void kunlink(hm_ipc_pool_t *pi, imp_t *e) {
    size_t mask = pi->kcap - 1;
    size_t i = key_hash(e->pid, e->nonce, e->rbase) & mask;
    while (pi->ks[i].e != e) i = (i + 1) & mask;
    /* Backward shift: pull each later member of the cluster whose home slot
     * is not in (i, j] into the hole. */
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (!pi->ks[j].e) break;
        size_t home = pi->ks[j].tag & mask;
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j)) continue;
        pi->ks[i] = pi->ks[j];
        i = j;
    }
    pi->ks[i].e = NULL;
    pi->ks[i].tag = 0;
    pi->kn--;
    e->in_key = false;
}
static void lunlink(hm_ipc_pool_t *pi, imp_t *e) {
    imp_t **p = &pi->lb[hm__ipc_mix64(e->local) & (pi->cap - 1)];
    while (*p != e) p = &(*p)->lnext;
    *p = e->lnext;
    e->in_local = false;
    pi->n--;
}
/* Room for one more entry: double the key index past 3/4 full and the
 * local hash past load 1 (best effort for the local hash: without memory
 * its chains grow; the key index must keep an empty slot, so a failure to
 * grow it at full capacity fails the open). */
static bool grow(hm_ipc_pool_t *pi) {
    if ((pi->kn + 1) * 4 > pi->kcap * 3) {
        size_t kcap = pi->kcap * 2;
        kslot_t *ks = calloc(kcap, sizeof(*ks));
        if (ks) {
            for (size_t i = 0; i < pi->kcap; i++)
                if (pi->ks[i].e) kput(ks, kcap, pi->ks[i].tag, pi->ks[i].e);
            free(pi->ks);
            pi->ks = ks;
            pi->kcap = kcap;
        } else if (pi->kn + 1 >= pi->kcap) {
            return false;
        }
    }
    if (pi->n < pi->cap) return true;
    size_t cap = pi->cap * 2;
    imp_t **lb = calloc(cap, sizeof(*lb));
    if (!lb) return true;
    for (size_t i = 0; i < pi->cap; i++) {
        for (imp_t *e = pi->lb[i], *nx; e; e = nx) {
            nx = e->lnext;
            size_t b = hm__ipc_mix64(e->local) & (cap - 1);
            e->lnext = lb[b];
            lb[b] = e;
        }
    }
    free(pi->lb);
    pi->lb = lb;
    pi->cap = cap;
    return true;
}

/* ---- the CLOCK ring (opened.lock held) ----
 * Every cached mapping is counted (in_ring: opened.count, opened.bytes); those the
 * evictor found in use are parked, off the ring's links, so that a scan
 * visits only what it may evict and an open over the bound costs O(1)
 * however many mappings are in use. A mapping in use stays on the links
 * until the evictor meets it (taking it off at its last close would put
 * opened.lock on the lock-free close path). */
static void ring_link(imp_t *e) {
    if (!opened.hand) {
        e->rnext = e->rprev = e;
        opened.hand = e;
    } else { /* just behind the hand: visited last */
        e->rnext = opened.hand;
        e->rprev = opened.hand->rprev;
        e->rprev->rnext = e;
        opened.hand->rprev = e;
    }
}
static void ring_unlink_links(imp_t *e) {
    if (e->rnext == e) {
        opened.hand = NULL;
    } else {
        if (opened.hand == e) opened.hand = e->rnext;
        e->rprev->rnext = e->rnext;
        e->rnext->rprev = e->rprev;
    }
}
/* In use: off the links. Its closer and this evictor order their writes
 * (refs, parked) before their reads of the other's (seq_cst, Dekker): if
 * the last close came first, the evictor sees refs 0 and links it back;
 * otherwise the closer sees parked and does. */
static void ring_park(imp_t *e) {
    ring_unlink_links(e);
    atomic_store_explicit(&e->parked, 1, memory_order_seq_cst);
    if (!st_refs(atomic_load_explicit(&e->state, memory_order_seq_cst))) {
        atomic_store_explicit(&e->parked, 0, memory_order_relaxed);
        ring_link(e);
    }
}
/* A closer that dropped the last reference of a parked entry. */
static HM_NOINLINE void ring_unpark(imp_t *e) {
    hm__mutex_lock(&opened.lock);
    if (e->in_ring && atomic_load_explicit(&e->parked, memory_order_relaxed)) {
        atomic_store_explicit(&e->parked, 0, memory_order_relaxed);
        ring_link(e);
    }
    hm__mutex_unlock(&opened.lock);
}
static inline void unpark_check(imp_t *e) {
    if (hm_unlikely(atomic_load_explicit(&e->parked, memory_order_seq_cst))) ring_unpark(e);
}
static void ring_insert(imp_t *e) {
    ring_link(e);
    e->in_ring = true;
    opened.count++;
    opened.bytes += e->size;
    atomic_store_explicit(&opened.a_count, opened.count, memory_order_relaxed);
    atomic_store_explicit(&opened.a_bytes, opened.bytes, memory_order_relaxed);
}
static void ring_unlink(imp_t *e) {
    if (atomic_load_explicit(&e->parked, memory_order_relaxed))
        atomic_store_explicit(&e->parked, 0, memory_order_relaxed);
    else ring_unlink_links(e);
    e->in_ring = false;
    opened.count--;
    opened.bytes -= e->size;
    atomic_store_explicit(&opened.a_count, opened.count, memory_order_relaxed);
    atomic_store_explicit(&opened.a_bytes, opened.bytes, memory_order_relaxed);
}

static inline bool over_bound(void) {
    size_t me = atomic_load_explicit(&opened.max_entries, memory_order_relaxed);
    size_t mb = atomic_load_explicit(&opened.max_bytes, memory_order_relaxed);
    return (me && atomic_load_explicit(&opened.a_count, memory_order_relaxed) > me) ||
           (mb && atomic_load_explicit(&opened.a_bytes, memory_order_relaxed) > mb);
}

/* The provider's close of a mapping out of the cache and the tracker; a
 * failure is logged with `then`, what becomes of the mapping. */
static bool provider_close(hm_pool_t *pool, uintptr_t local, size_t size, const char *then) {
    hm_provider_t *prov = pool->provider;
    hm_result_t r = prov->ops.ipc.close(prov->state, (void *)local, size);
    if (r != HM_SUCCESS)
        HM_LOG_ERROR("IPC: provider '%s' failed to close [%p, +%zu): %s; %s", prov->info.name,
                     (void *)local, size, hm_result_string(r), then);
    return r == HM_SUCCESS;
}

/* Onto pool's unclosed list (without memory for it: left mapped, logged). */
static void keep_unclosed(hm_pool_t *pool, uintptr_t local, size_t size) {
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    hm__mutex_lock(&pi->lock);
    if (pi->nunclosed == pi->capunclosed) {
        size_t cap = pi->capunclosed ? 2 * pi->capunclosed : 8;
        struct unclosed *u = realloc(pi->unclosed, cap * sizeof(*u));
        if (u) {
            pi->unclosed = u;
            pi->capunclosed = cap;
        }
    }
    bool kept = pi->nunclosed < pi->capunclosed;
    if (kept) pi->unclosed[pi->nunclosed++] = (struct unclosed){local, size};
    hm__mutex_unlock(&pi->lock);
    if (!kept) {
        hm__pool_note_refused(pool);
        HM_LOG_ERROR("IPC: no memory to remember [%p, +%zu) for another close: left mapped",
                     (void *)local, size);
    }
}

/* Close again what failed to close before, now that a close succeeded. */
static void reclose(hm_pool_t *pool) {
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    hm__mutex_lock(&pi->lock);
    struct unclosed *u = pi->unclosed;
    size_t n = pi->nunclosed;
    pi->unclosed = NULL;
    pi->nunclosed = pi->capunclosed = 0;
    hm__mutex_unlock(&pi->lock);
    for (size_t i = 0; i < n; i++)
        if (!provider_close(pool, u[i].local, u[i].size, "closed again later"))
            keep_unclosed(pool, u[i].local, u[i].size);
    free(u);
}

/* Unmap a mapping out of the cache and the tracker (no lock held); where the
 * provider fails to, it is closed again later (keep_unclosed). */
static void close_or_keep(hm_pool_t *pool, uintptr_t local, size_t size) {
    if (!provider_close(pool, local, size, "closed again at the pool's next close or destroy")) {
        keep_unclosed(pool, local, size);
        return;
    }
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    hm__mutex_lock(&pi->lock);
    bool more = pi->nunclosed != 0;
    hm__mutex_unlock(&pi->lock);
    if (more) reclose(pool);
}

/* Forget the tracker record and unmap (no lock held). */
static void close_mapping(hm_pool_t *pool, uintptr_t local, size_t size) {
    if (hm__tracker_remove(local, size) != HM_SUCCESS)
        HM_LOG_ERROR("IPC: the opened mapping [%p, +%zu) was not tracked any more", (void *)local,
                     size);
    close_or_keep(pool, local, size);
}

/* Mappings a pool's destroy closes together through the provider's
 * close_many (one by one where it has none or memory is short): out of the
 * tracker at once, unmapped at the end. */
typedef struct closing {
    void **ptr;
    size_t *size;
    size_t n, cap;
} closing_t;

static void closing_add(closing_t *cl, hm_pool_t *pool, uintptr_t local, size_t size) {
    if (pool->provider->ops.ipc.close_many && cl->n == cl->cap) {
        size_t cap = cl->cap ? 2 * cl->cap : 256;
        void **p = realloc(cl->ptr, cap * sizeof(*p));
        if (p) cl->ptr = p;
        size_t *z = p ? realloc(cl->size, cap * sizeof(*z)) : NULL;
        if (z) {
            cl->size = z;
            cl->cap = cap;
        }
    }
    if (cl->n == cl->cap) {
        close_mapping(pool, local, size);
        return;
    }
    if (hm__tracker_remove(local, size) != HM_SUCCESS)
        HM_LOG_ERROR("IPC: the opened mapping [%p, +%zu) was not tracked any more", (void *)local,
                     size);
    cl->ptr[cl->n] = (void *)local;
    cl->size[cl->n++] = size;
}

static void closing_finish(closing_t *cl, hm_pool_t *pool) {
    hm_provider_t *prov = pool->provider;
    if (cl->n) {
        hm_result_t r = prov->ops.ipc.close_many(prov->state, cl->ptr, cl->size, cl->n);
        if (r != HM_SUCCESS) hm__pool_note_refused(pool);
        if (r != HM_SUCCESS)
            HM_LOG_ERROR("IPC: provider '%s' failed to close some of %zu mappings: %s",
                         prov->info.name, cl->n, hm_result_string(r));
    }
    free(cl->ptr);
    free(cl->size);
}

#include "ipc/import_shared.c"

/* e is out of both pool hashes, killed, unused; the caller is its closer. */
static void retire(imp_t *e) {
    hm_pool_t *pool = e->pi->pool;
    uintptr_t local = e->local;
    size_t size = e->size;
    bool free_it = true;
    /* Leave a shared mapping while e is still ours (an evictor's claim may
     * free it once it is dead). */
    bool shared = e->map != NULL;
    smap_t *last = shared ? map_leave(e) : NULL;
    hm__mutex_lock(&opened.lock);
    if (e->in_ring) ring_unlink(e);
    if (e->claimed) { /* an evictor holds it: it frees it */
        e->dead = true;
        free_it = false;
    }
    hm__mutex_unlock(&opened.lock);
    if (!shared || last) close_mapping(pool, local, size);
    if (last) map_closed(last);
    if (free_it) imp_free(e);
}

/* Close unused mappings, least recently used first, until the cache is
 * within its bound or nothing unused is left. */
#define EVICT_STEPS 64
static void evict_over_bound(void) {
    for (;;) {
        hm__mutex_lock(&opened.lock);
        size_t me = atomic_load_explicit(&opened.max_entries, memory_order_relaxed);
        size_t mb = atomic_load_explicit(&opened.max_bytes, memory_order_relaxed);
        if ((!me || opened.count <= me) && (!mb || opened.bytes <= mb)) {
            hm__mutex_unlock(&opened.lock);
            return;
        }
        /* At most EVICT_STEPS visits per call, the hand keeping its place
         * for the next: an open that finds every mapping in use costs O(1),
         * not a walk of the whole ring. (Mappings in use stay on the ring:
         * their last close is a lock-free compare-and-swap, which must not
         * take opened.lock to put them back.) */
        imp_t *v = NULL;
        for (size_t steps = EVICT_STEPS; steps && opened.hand; steps--) {
            imp_t *e = opened.hand;
            opened.hand = e->rnext;
            if (st_refs(atomic_load_explicit(&e->state, memory_order_relaxed))) {
                ring_park(e);
                continue;
            }
            if (atomic_exchange_explicit(&e->used, 0, memory_order_relaxed)) continue;
            v = e;
            break;
        }
        if (!v) { /* everything is in use */
            hm__mutex_unlock(&opened.lock);
            return;
        }
        ring_unlink(v);
        v->claimed = true;
        hm_ipc_pool_t *pi = v->pi;
        atomic_fetch_add_explicit(&pi->evictors, 1, memory_order_relaxed);
        hm__mutex_unlock(&opened.lock);

        int outcome; /* 0: we close it, 1: back in use, 2: someone else closes */
        hm__mutex_lock(&pi->lock);
        /* Under pi->lock nobody can add a reference (opens hold it; closes
         * only drop them), so refs == 0 seen here stays 0. Acquire: the
         * last user's accesses happen before the unmap. */
        if (v->in_local &&
            st_refs(atomic_load_explicit(&v->state, memory_order_acquire)) == 0) {
            if (v->in_key) kunlink(pi, v);
            lunlink(pi, v);
            imp_kill(v);
            outcome = 0;
        } else if (v->in_local) {
            hm__mutex_lock(&opened.lock);
            ring_insert(v);
            v->claimed = false;
            hm__mutex_unlock(&opened.lock);
            outcome = 1;
        } else {
            outcome = 2;
        }
        hm__mutex_unlock(&pi->lock);
        if (outcome == 0) {
            unmap_entry(v);
            imp_free(v);
            atomic_fetch_add_explicit(&opened.evictions, 1, memory_order_relaxed);
        } else if (outcome == 2) {
            hm__mutex_lock(&opened.lock);
            v->claimed = false;
            bool free_it = v->dead;
            hm__mutex_unlock(&opened.lock);
            if (free_it) imp_free(v);
        }
        atomic_fetch_sub_explicit(&pi->evictors, 1, memory_order_release);
    }
}

/* ------------------------------------------------------------------------ */
/* open / close                                                             */

static const char *family_name(uint32_t f) {
    switch (f) {
    case HM_PROVIDER_FAMILY_OS: return "os";
    case HM_PROVIDER_FAMILY_FIXED: return "fixed";
    case HM_PROVIDER_FAMILY_FILE: return "file";
    case HM_PROVIDER_FAMILY_DEVDAX: return "devdax";
    case HM_PROVIDER_FAMILY_LEVEL_ZERO: return "level_zero";
    case HM_PROVIDER_FAMILY_CUDA: return "cuda";
    default: return f >= HM_PROVIDER_FAMILY_USER ? "user" : "unknown";
    }
}

/* An entry at the same key with another allocation id: unlink it from the
 * key hash; if unused it is returned (killed) for the caller to retire
 * after unlocking, else marked stale and closed at its last close.
 * pi->lock held. */
static imp_t *unlink_stale(hm_ipc_pool_t *pi, imp_t *e) {
    kunlink(pi, e);
    atomic_fetch_add_explicit(&opened.stale, 1, memory_order_relaxed);
    uint64_t w = atomic_fetch_or_explicit(&e->state, ST_STALE, memory_order_acq_rel);
    if (st_refs(w)) return NULL; /* closed at its last close */
    lunlink(pi, e);
    imp_kill(e);
    return e;
}

static inline bool ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
    return a < b + blen && b < a + alen;
}

/* Does cached entry e hold another allocation of w's exporter that
 * overlaps w's remote range? */
static bool stale_overlap(const imp_t *e, const hm_wire_t *w) {
    return e->pid == w->pid && e->nonce == w->nonce && e->family == w->family &&
           !(e->rbase == w->base && e->alloc_id == w->alloc_id) &&
           ranges_overlap(e->rbase, e->size, w->base, w->size);
}

/* The provider refused to open w (HM_ERROR_BUSY: CUDA_ERROR_ALREADY_MAPPED)
 * because the driver maps an import at the exporter's address and a mapping
 * of an older allocation of that exporter still overlaps it: the exporter
 * freed the memory and allocated the address again. Every cached entry of
 * that exporter overlapping w's range (in pool, or for a shared mapping in
 * every pool over the context) is stale: each leaves the key index, the
 * unused ones are closed now, the others at their last close. Returns
 * whether any was closed (then the open is worth another try). UCX's CUDA
 * IPC cache does the same on CUDA_ERROR_ALREADY_MAPPED
 * (uct/cuda/cuda_ipc/cuda_ipc_cache.c, UCX PR 2738). */
/* One stale entry of evict_overlapping's kind, out of the key index: the
 * unused one found first, killed (the caller retires it), or NULL when
 * none is left unused (those in use are marked on the way). */
static imp_t *take_overlapping(hm_pool_t *pool, hm_ipc_pool_t *pi, const hm_wire_t *w) {
    imp_t *v = NULL;
    uint64_t ctx = pool->provider->ipc_context;
    if (ctx) {
        hm__mutex_lock(&shared_maps.lock);
        for (size_t b = 0; b < shared_maps.cap && !v; b++) {
            for (smap_t *m = shared_maps.kb[b]; m && !v; m = m->knext) {
                if (m->ctx != ctx || m->state != SM_READY || !m->n ||
                    !stale_overlap(m->mem[0], w))
                    continue;
                for (size_t k = 0; k < m->n && !v; k++) {
                    imp_t *e = m->mem[k];
                    hm__mutex_lock(&e->pi->lock);
                    if (e->in_key) v = unlink_stale(e->pi, e);
                    hm__mutex_unlock(&e->pi->lock);
                }
            }
        }
        hm__mutex_unlock(&shared_maps.lock);
        return v;
    }
    hm__mutex_lock(&pi->lock);
    for (size_t b = 0; b < pi->cap && !v; b++)
        for (imp_t *e = pi->lb[b]; e && !v; e = e->lnext)
            if (e->in_key && stale_overlap(e, w)) v = unlink_stale(pi, e);
    hm__mutex_unlock(&pi->lock);
    return v;
}

static bool evict_overlapping(hm_pool_t *pool, hm_ipc_pool_t *pi, const hm_wire_t *w) {
    bool any = false;
    for (imp_t *v; (v = take_overlapping(pool, pi, w)) != NULL; any = true) retire(v);
    return any;
}

/* One more reference (pi->lock held). false: the count is saturated. */
static inline bool take_ref(imp_t *e, uint32_t *gen) {
    uint64_t w = atomic_load_explicit(&e->state, memory_order_relaxed);
    if (hm_unlikely(st_refs(w) == ST_REFS)) return false;
    w = atomic_fetch_add_explicit(&e->state, 1, memory_order_relaxed);
    *gen = st_gen(w);
    atomic_store_explicit(&e->used, 1, memory_order_relaxed);
    return true;
}

static _Atomic int trust = HM_IPC_TRUST_DESCRIPTOR; /* hm_ipc_set_trust */

hm_result_t hm_ipc_set_trust(hm_ipc_trust_t t) {
    if (t != HM_IPC_TRUST_DESCRIPTOR && t != HM_IPC_TRUST_FIELDS) {
        HM_LOG_ERROR("hm_ipc_set_trust(%d): unknown trust", (int)t);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    atomic_store_explicit(&trust, (int)t, memory_order_relaxed);
    return HM_SUCCESS;
}

/* A handle that misses the cache against the exporter's own copy of it
 * (at w->origin in the exporter: the bytes hm_ipc_get returned there),
 * read from the exporter's memory: equal bytes prove every field and the
 * payload genuine and the export still held by the exporter's cache. The
 * read needs what pidfd_getfd needs (same user, ptrace access); where it is
 * refused a descriptor handle is used as validated by the decoder and the
 * provider's checks of the descriptor (logged once), and any other handle
 * only if the program chose HM_IPC_TRUST_FIELDS. */
static hm_result_t open_verify(const hm_wire_t *w) {
    static _Atomic int unverified_logged;
    const unsigned char *b = w->payload - HM_IPC_HEADER_SIZE;
    unsigned char theirs[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    hm_result_t r = hm__prim_process_read((pid_t)w->pid, w->origin, theirs, w->total_size);
    int64_t e = r != HM_SUCCESS ? hm_last_native_error(NULL) : 0;
    if (r == HM_SUCCESS && memcmp(theirs, b, w->total_size) == 0) return HM_SUCCESS;
    if (e == EPERM || e == EACCES || e == ENOSYS) {
        /* A descriptor handle: the provider checks what it maps (the file
         * the handle names, seals, size), and a peer can hand over only
         * what it holds. Anything else fails closed unless the program
         * trusts its peers' fields (ipc.h, hm_ipc_set_trust). */
        if (!(w->flags & HM__WIRE_HAS_FD) &&
            atomic_load_explicit(&trust, memory_order_relaxed) != HM_IPC_TRUST_FIELDS) {
            HM_LOG_ERROR("hm_ipc_open: cannot read the exporter's copy of the handle (errno "
                         "%lld) and its memory is not a descriptor to check: refused "
                         "(hm_ipc_set_trust(HM_IPC_TRUST_FIELDS) accepts such handles)",
                         (long long)e);
            return HM_ERROR_PERMISSION;
        }
        if (!atomic_exchange_explicit(&unverified_logged, 1, memory_order_relaxed))
            HM_LOG_INFO("hm_ipc_open: cannot read the exporter's copy of a handle (errno "
                        "%lld); handles are checked by %s", (long long)e,
                        (w->flags & HM__WIRE_HAS_FD) ? "their descriptors"
                                                     : "their fields only (as the program chose)");
        return HM_SUCCESS;
    }
    /* Not the exporter's bytes. Whose fault, most exactly: */
    uint64_t start = 0;
    if (e == ESRCH || hm__prim_process_start_time((pid_t)w->pid, &start) != HM_SUCCESS ||
        start != w->start_time) {
        HM_LOG_ERROR("hm_ipc_open: the exporter (pid %llu) is not running any more",
                     (unsigned long long)w->pid);
        return HM_ERROR_STALE_HANDLE;
    }
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("hm_ipc_open: the exporter (pid %llu) has no handle at 0x%llx (errno "
                     "%lld): forged", (unsigned long long)w->pid,
                     (unsigned long long)w->origin, (long long)e);
        return HM_ERROR_INVALID_HANDLE;
    }
    if (memcmp(theirs + HM__WIRE_OFF_PID, b + HM__WIRE_OFF_PID, 24) != 0) {
        HM_LOG_ERROR("hm_ipc_open: the handle's exporter identity (pid %llu, nonce 0x%llx) is "
                     "not the exporter's: forged", (unsigned long long)w->pid,
                     (unsigned long long)w->nonce);
        return HM_ERROR_INVALID_HANDLE;
    }
    /* The exporter's copy is released (its magic cleared) or the slot now
     * holds another export's handle (allocation ids are never reused): the
     * export is gone. The same export with other bytes: forged. */
    if (hm__wire_peek32(theirs, 0) != HM__WIRE_MAGIC ||
        hm__wire_peek64(theirs, HM__WIRE_OFF_ALLOC_ID) != w->alloc_id) {
        HM_LOG_ERROR("hm_ipc_open: the exporter (pid %llu) no longer holds this handle (put "
                     "and released)", (unsigned long long)w->pid);
        return HM_ERROR_STALE_HANDLE;
    }
    HM_LOG_ERROR("hm_ipc_open: the handle differs from the exporter's copy of it: forged");
    return HM_ERROR_INVALID_HANDLE;
}

/* The driver's open of handle w through pool's provider, tracked for pool:
 * the importer's copy of the descriptor fetched where the handle has one
 * (unless the caller gave it: fd_in), the provider's open, the tracker
 * record. Nothing is left behind on failure. */
static hm_result_t open_mapping(hm_pool_t *pool, const hm_wire_t *w, int fd_in,
                                uintptr_t *out) {
    hm_provider_t *prov = pool->provider;
    hm_result_t r;
    int fd = -1, own_fd = -1;
    if (w->flags & HM__WIRE_HAS_FD) {
        if (fd_in >= 0) {
            fd = fd_in;
        } else {
            r = hm__ipc_fetch_fd(w, &own_fd);
            if (r != HM_SUCCESS) return r;
            fd = own_fd;
        }
    }
    void *local = NULL;
    r = prov->ops.ipc.open(prov->state, w->payload, fd, (size_t)w->size, &local);
    if (own_fd >= 0) (void)hm__prim_close(own_fd);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("hm_ipc_open: provider '%s' could not open the handle (pid %llu, base "
                     "0x%llx, %llu bytes): %s", prov->info.name, (unsigned long long)w->pid,
                     (unsigned long long)w->base, (unsigned long long)w->size,
                     hm_result_string(r));
        return r;
    }
    if (!local) {
        HM_LOG_ERROR("hm_ipc_open: provider '%s' returned success and NULL", prov->info.name);
        return HM_ERROR_UNKNOWN;
    }
    uint32_t tflags = HM_TRACK_IMPORTED | (pool->cpu_accessible ? HM_TRACK_HOST_ACCESSIBLE : 0);
    r = hm__tracker_insert(&pool->index, pool, prov, (uintptr_t)local, (size_t)w->size, tflags,
                           NULL);
    if (r != HM_SUCCESS) {
        close_or_keep(pool, (uintptr_t)local, (size_t)w->size);
        return r;
    }
    *out = (uintptr_t)local;
    return HM_SUCCESS;
}

static HM_NOINLINE hm_result_t open_miss(hm_pool_t *pool, hm_ipc_pool_t *pi, const hm_wire_t *w,
                                         uint64_t kh, int fd_in, void **ptr) {
    hm_provider_t *prov = pool->provider;
    if (!hm__handle_is_live(pool, HM_HANDLE_POOL)) {
        HM_LOG_ERROR("hm_ipc_open: %p is not a live pool", (void *)pool);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t r = open_verify(w);
    if (r != HM_SUCCESS) return r;
    /* Memory of a device the importing provider cannot open: refused before
     * a descriptor moves or the driver is asked (the provider logs why). */
    r = hm__provider_ipc_compatible(prov, w->payload);
    if (r != HM_SUCCESS) return r;
    imp_t *e = imp_alloc(w);
    if (!e) return HM_ERROR_OUT_OF_HOST_MEMORY;
    e->pi = pi;
    /* A provider that names its driver context shares the mapping with
     * every pool over that context: joined, nothing is opened. */
    smap_t *made = NULL;
    uintptr_t local = 0;
    for (int attempt = 0;; attempt++) {
        if (prov->ipc_context) {
            r = map_join(prov->ipc_context, w, e, &made, &local);
            if (r != HM_SUCCESS) {
                imp_free(e);
                return r;
            }
        }
        if (local) break;
        r = open_mapping(pool, w, fd_in, &local);
        if (r == HM_SUCCESS) {
            if (made) map_ready(made, local, pool);
            break;
        }
        if (made) map_abort(made);
        made = NULL;
        /* The driver maps at the exporter's address and refuses while an
         * older mapping of that exporter overlaps: close the stale ones
         * and try once more. */
        if (r == HM_ERROR_BUSY && attempt == 0 && evict_overlapping(pool, pi, w)) continue;
        if (r == HM_ERROR_BUSY)
            HM_LOG_ERROR("hm_ipc_open: an earlier mapping of memory the exporter (pid %llu) "
                         "had at [0x%llx, +%llu) is still open here and in use: the exporter "
                         "freed that memory and allocated the address again; close the old "
                         "mapping (hm_ipc_close) before opening the new handle",
                         (unsigned long long)w->pid, (unsigned long long)w->base,
                         (unsigned long long)w->size);
        imp_free(e);
        return r;
    }
    e->local = local;

    imp_t *victim = NULL;
    uint32_t gen = 0;
    hm__mutex_lock(&pi->lock);
    imp_t *o = key_find(pi, kh, w->pid, w->nonce, w->base);
    if (o && imp_same(o, w)) {
        /* Another thread opened it meanwhile: share theirs, undo ours. (A
         * handle that differs from o's in anything but the offset replaces o
         * below, as a newer allocation at that address: it never shares.) */
        bool ok = take_ref(o, &gen);
        uintptr_t theirs = o->local;
        size_t theirs_size = o->size;
        if (ok) pi->hits++;
        hm__mutex_unlock(&pi->lock);
        if (ok) tc_note(o, gen, theirs, theirs_size);
        unmap_entry(e);
        imp_free(e); /* never published */
        if (!ok) {
            HM_LOG_ERROR("hm_ipc_open: mapping opened %u times, never closed", ST_REFS);
            return HM_ERROR_LIMIT;
        }
        *ptr = (void *)(theirs + w->offset);
        return HM_SUCCESS;
    }
    if (hm_unlikely(!grow(pi))) {
        hm__mutex_unlock(&pi->lock);
        unmap_entry(e);
        imp_free(e);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (o) victim = unlink_stale(pi, o);
    kinsert(pi, kh, e);
    size_t lb = hm__ipc_mix64(e->local) & (pi->cap - 1);
    e->lnext = pi->lb[lb];
    pi->lb[lb] = e;
    e->in_local = true;
    pi->n++;
    (void)take_ref(e, &gen);
    size_t esize = (size_t)e->size; /* e may be evicted and reused once unlocked */
    hm__mutex_lock(&opened.lock);
    ring_insert(e);
    hm__mutex_unlock(&opened.lock);
    hm__mutex_unlock(&pi->lock);
    tc_note(e, gen, local, esize);
    if (victim) retire(victim);
    if (over_bound()) evict_over_bound();
    *ptr = (char *)local + w->offset;
    return HM_SUCCESS;
}

/* Everything but a fast hit: full validation (checksum and fields), then
 * the cache, then the miss. */
static HM_NOINLINE hm_result_t open_slow(hm_pool_t *pool, const hm_ipc_handle_t *handle,
                                         size_t size, int fd, void **ptr) {
    hm_wire_t w;
    hm_result_t r = hm__wire_decode(handle, size, &w);
    if (hm_unlikely(r != HM_SUCCESS)) {
        HM_LOG_ERROR("hm_ipc_open: handle rejected: %s", hm_result_string(r));
        return r;
    }
    const hm_ipc_ident_t *me = hm__ipc_self_ident();
    if (hm_unlikely(w.pid == me->pid && w.nonce == me->nonce)) {
        HM_LOG_ERROR("hm_ipc_open: the handle was made by this process (use the pointer "
                     "itself: 0x%llx)", (unsigned long long)(w.base + w.offset));
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_provider_t *prov = pool->provider;
    if (hm_unlikely(!pool->tracked || !(prov->info.caps & HM_PROVIDER_CAP_IPC) ||
                    prov->info.family != (hm_provider_family_t)w.family)) {
        if (!pool->tracked)
            HM_LOG_ERROR("hm_ipc_open: pool '%s' was created with HM_POOL_FLAG_NO_TRACKING",
                         pool->ops.name);
        else if (!(prov->info.caps & HM_PROVIDER_CAP_IPC))
            HM_LOG_ERROR("hm_ipc_open: provider '%s' of pool '%s' cannot open IPC handles",
                         prov->info.name, pool->ops.name);
        else
            HM_LOG_ERROR("hm_ipc_open: the handle comes from a '%s'-family provider; pool '%s' "
                         "has a '%s' provider", family_name(w.family), pool->ops.name,
                         family_name(prov->info.family));
        return HM_ERROR_NOT_SUPPORTED;
    }
    hm_ipc_pool_t *pi = hm__ipc_pool_make(pool);
    if (hm_unlikely(!pi)) return HM_ERROR_OUT_OF_HOST_MEMORY;
    uint64_t kh = key_hash(w.pid, w.nonce, w.base);
    hm__mutex_lock(&pi->lock);
    imp_t *e = key_find(pi, kh, w.pid, w.nonce, w.base);
    if (hm_likely(e != NULL)) {
        /* A hit needs every field but the offset (and so the checksum)
         * equal to the validated handle's: a handle that differs elsewhere
         * (another allocation at that address, or a forgery) goes the miss
         * path's full way, and only a successful open there replaces the
         * entry (a forged handle cannot evict a genuine mapping). */
        if (hm_likely(imp_same(e, &w))) {
            uint32_t gen = 0;
            if (hm_unlikely(!take_ref(e, &gen))) {
                hm__mutex_unlock(&pi->lock);
                HM_LOG_ERROR("hm_ipc_open: mapping opened %u times, never closed", ST_REFS);
                return HM_ERROR_LIMIT;
            }
            return hit_unlock(pi, e, gen, w.offset, ptr);
        }
    }
    hm__mutex_unlock(&pi->lock);
    atomic_fetch_add_explicit(&opened.misses, 1, memory_order_relaxed);
    if (hm_unlikely(prov->ops.ipc.handle_size(prov->state) != w.payload_len)) {
        HM_LOG_ERROR("hm_ipc_open: payload of %u bytes; provider '%s' reads %zu", w.payload_len,
                     prov->info.name, prov->ops.ipc.handle_size(prov->state));
        return HM_ERROR_INVALID_HANDLE;
    }
    return open_miss(pool, pi, &w, kh, fd, ptr);
}

hm_result_t hm_ipc_open_fd(hm_pool_t *pool, const hm_ipc_handle_t *handle, size_t size, int fd,
                           void **ptr) {
    if (hm_unlikely(!ptr || !pool || !handle)) {
        HM_LOG_ERROR("hm_ipc_open: %s is NULL", !ptr ? "ptr" : !pool ? "pool" : "handle");
        if (ptr) *ptr = NULL;
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *ptr = NULL;
    /* Hit: the handle's fields equal those of a handle that was fully
     * validated when it was opened through this pool (its checksum, fields,
     * exporter identity, provider family), but for the offset, and its
     * checksum is right (imp_hit): no decode. Reads the index slot and the
     * entry's two hot lines. The key fields are read unvalidated only to
     * find the candidate. */
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    if (hm_likely(pi != NULL && size >= HM_IPC_HEADER_SIZE)) {
        const unsigned char *b = (const unsigned char *)handle;
        /* The handle's lines (the checksum reads them all) load in parallel
         * with the index slot and entry, not one after the other. */
        __builtin_prefetch(b + 64);
        __builtin_prefetch(b + 128);
        uint64_t pid = hm__wire_peek64(b, HM__WIRE_OFF_PID);
        uint64_t nonce = hm__wire_peek64(b, HM__WIRE_OFF_NONCE);
        uint64_t base = hm__wire_peek64(b, HM__WIRE_OFF_BASE);
        uint64_t kh = key_hash(pid, nonce, base);
        hm__mutex_lock(&pi->lock);
        imp_t *e = key_find(pi, kh, pid, nonce, base);
        uint32_t gen = 0;
        uint64_t offset;
        if (hm_likely(e != NULL && imp_hit(e, b, size, &offset) && take_ref(e, &gen)))
            return hit_unlock(pi, e, gen, offset, ptr);
        hm__mutex_unlock(&pi->lock);
    }
    return open_slow(pool, handle, size, fd, ptr);
}

hm_result_t hm_ipc_open(hm_pool_t *pool, const hm_ipc_handle_t *handle, size_t size, void **ptr) {
    return hm_ipc_open_fd(pool, handle, size, -1, ptr);
}

/* Close of a shared mapping without the per-thread slot: one reference of
 * any member that has one (the mapping stays while any member holds it, so
 * which pool's count drops changes only which entry becomes evictable). */
static HM_NOINLINE hm_result_t close_shared(void *ptr, uintptr_t base) {
    hm__mutex_lock(&shared_maps.lock);
    smap_t *m = sm_lfind(base);
    if (hm_unlikely(!m)) {
        hm__mutex_unlock(&shared_maps.lock);
        HM_LOG_ERROR("hm_ipc_close(%p): no open mapping there (closed concurrently?)", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    imp_t *x = NULL;
    bool last = false, retire_now = false;
    for (size_t i = 0; i < m->n && !x; i++) {
        imp_t *e = m->mem[i];
        hm_ipc_pool_t *pi = e->pi;
        hm__mutex_lock(&pi->lock);
        if (e->in_local) {
            uint64_t w = atomic_load_explicit(&e->state, memory_order_relaxed);
            while (st_refs(w) &&
                   !atomic_compare_exchange_weak_explicit(&e->state, &w, w - 1,
                                                          memory_order_seq_cst,
                                                          memory_order_relaxed)) {
            }
            if (st_refs(w)) {
                x = e;
                last = st_refs(w) == 1;
                if (last) unpark_check(e);
                if (last && !e->in_key) { /* stale: its last user is gone */
                    lunlink(pi, e);
                    imp_kill(e);
                    retire_now = true;
                }
            }
        }
        hm__mutex_unlock(&pi->lock);
    }
    hm__mutex_unlock(&shared_maps.lock);
    if (hm_unlikely(!x)) {
        HM_LOG_ERROR("hm_ipc_close(%p): closed more times than opened", ptr);
        return HM_ERROR_DOUBLE_FREE;
    }
    if (retire_now) retire(x);
    else if (last && over_bound()) evict_over_bound();
    return HM_SUCCESS;
}

/* Close through the tracker and the pool's local-address hash. */
static HM_NOINLINE hm_result_t close_slow(void *ptr) {
    hm_tracker_entry_t te;
    if (hm_unlikely(!ptr || !hm__tracker_lookup(ptr, &te))) {
        HM_LOG_ERROR("hm_ipc_close(%p): not memory hetmem knows", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_unlikely(!(te.flags & HM_TRACK_IMPORTED))) {
        HM_LOG_ERROR("hm_ipc_close(%p): not a mapping opened through IPC", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (te.provider && te.provider->ipc_context) return close_shared(ptr, te.base);
    hm_ipc_pool_t *pi = hm__ipc_pool(te.pool);
    if (hm_unlikely(!pi)) {
        HM_LOG_ERROR("hm_ipc_close(%p): the pool has no IPC state", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm__mutex_lock(&pi->lock);
    imp_t *e = local_find(pi, te.base);
    if (hm_unlikely(!e)) {
        hm__mutex_unlock(&pi->lock);
        HM_LOG_ERROR("hm_ipc_close(%p): no open mapping there (closed concurrently?)", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    /* Lock-free closers may decrement concurrently: compare-and-swap. */
    uint64_t w = atomic_load_explicit(&e->state, memory_order_relaxed);
    do {
        if (hm_unlikely(!st_refs(w))) {
            hm__mutex_unlock(&pi->lock);
            HM_LOG_ERROR("hm_ipc_close(%p): closed more times than opened", ptr);
            return HM_ERROR_DOUBLE_FREE;
        }
    } while (!atomic_compare_exchange_weak_explicit(&e->state, &w, w - 1, memory_order_seq_cst,
                                                    memory_order_relaxed));
    bool last = st_refs(w) == 1, retire_now = false;
    if (last) unpark_check(e);
    if (last && !e->in_key) { /* stale: its last user is gone */
        lunlink(pi, e);
        imp_kill(e);
        retire_now = true;
    }
    hm__mutex_unlock(&pi->lock);
    if (retire_now) retire(e);
    else if (last && over_bound()) evict_over_bound();
    return HM_SUCCESS;
}

hm_result_t hm_ipc_close(void *ptr) {
    /* Fast: ptr lies in a mapping this thread opened recently; drop the
     * reference with one CAS, unless it is the last one of a stale entry
     * (that needs the closer's work) or the slot is out of date. */
    tcache_t *t = &thread_opens;
    uintptr_t p = (uintptr_t)ptr;
    for (unsigned i = 0; i < TC_SLOTS; i++) {
        if (p - t->lo[i] >= t->len[i]) continue;
        imp_t *e = t->e[i];
        uint64_t w = atomic_load_explicit(&e->state, memory_order_relaxed);
        if (st_gen(w) != t->gen[i]) { /* closed since: forget it, a newer slot may match */
            t->len[i] = 0;
            continue;
        }
        for (;;) {
            uint32_t r = st_refs(w);
            if (st_gen(w) != t->gen[i] || r == 0 || (r == 1 && (w & ST_STALE))) break;
            /* release: this user's accesses happen before an evictor's
             * unmap; seq_cst: against ring_park (no cost on x86, whose
             * locked compare-and-swap is a full barrier) */
            if (atomic_compare_exchange_weak_explicit(&e->state, &w, w - 1, memory_order_seq_cst,
                                                      memory_order_relaxed)) {
                if (r == 1) unpark_check(e);
                if (r == 1 && hm_unlikely(over_bound())) evict_over_bound();
                return HM_SUCCESS;
            }
        }
        break;
    }
    return close_slow(ptr);
}

hm_result_t hm__ipc_refuse_free(const void *ptr) {
    HM_LOG_ERROR("%p is a mapping opened through IPC: close it with hm_ipc_close(), not "
                 "hm_free()/hm_pool_free()", ptr);
    return HM_ERROR_INVALID_ARGUMENT;
}

/* ------------------------------------------------------------------------ */
/* pool destroy, import side                                                */

bool hm__ipc_import_pool_init(hm_ipc_pool_t *pi) {
    pi->cap = 64;
    pi->kcap = 64;
    pi->ks = calloc(pi->kcap, sizeof(kslot_t));
    pi->lb = calloc(pi->cap, sizeof(imp_t *));
    if (pi->ks && pi->lb) return true;
    hm__ipc_import_pool_fini(pi);
    return false;
}

void hm__ipc_import_pool_fini(hm_ipc_pool_t *pi) {
    free(pi->ks);
    free(pi->lb);
    free(pi->unclosed);
    pi->ks = NULL;
    pi->lb = NULL;
    pi->unclosed = NULL;
}

void hm__ipc_import_pool_destroy(hm_pool_t *pool, hm_ipc_pool_t *pi) {
    /* Take the mappings out of the pool's hashes DESTROY_BATCH at a time
     * (pi->lock held for that many unlinks; only an evictor that claimed one
     * of ours waits on it), out of the CLOCK ring with one opened.lock hold per
     * batch, then unmap them with no lock held. */
    enum { DESTROY_BATCH = 16 };
    size_t open_count = 0, n = 0, bucket = 0;
    closing_t cl = {0};
    for (;;) {
        imp_t *batch[DESTROY_BATCH];
        /* The mapping of each, copied while the entry is still ours: once an
         * entry is marked dead below, its evictor may free it at any time. */
        uintptr_t local[DESTROY_BATCH];
        size_t size[DESTROY_BATCH];
        size_t k = 0;
        hm__mutex_lock(&pi->lock);
        while (k < DESTROY_BATCH && bucket < pi->cap) {
            imp_t *e = pi->lb[bucket];
            if (!e) {
                bucket++;
                continue;
            }
            pi->lb[bucket] = e->lnext;
            e->in_local = false;
            pi->n--;
            if (e->in_key) kunlink(pi, e);
            if (st_refs(atomic_load_explicit(&e->state, memory_order_acquire))) open_count++;
            imp_kill(e);
            local[k] = e->local;
            size[k] = e->size;
            batch[k++] = e;
        }
        hm__mutex_unlock(&pi->lock);
        if (!k) break;
        n += k;
        bool mine[DESTROY_BATCH], shared[DESTROY_BATCH];
        smap_t *last[DESTROY_BATCH];
        for (size_t i = 0; i < k; i++) { /* while the entries are still ours */
            shared[i] = batch[i]->map != NULL;
            last[i] = shared[i] ? map_leave(batch[i]) : NULL;
        }
        hm__mutex_lock(&opened.lock);
        for (size_t i = 0; i < k; i++) {
            if (batch[i]->in_ring) ring_unlink(batch[i]);
            mine[i] = !batch[i]->claimed;
            if (!mine[i]) batch[i]->dead = true; /* its evictor frees it */
        }
        hm__mutex_unlock(&opened.lock);
        for (size_t i = 0; i < k; i++) {
            if (last[i]) { /* the last pool to hold a shared mapping: closed now */
                close_mapping(pool, local[i], size[i]);
                map_closed(last[i]);
            } else if (!shared[i]) {
                closing_add(&cl, pool, local[i], size[i]);
            }
            if (mine[i]) imp_free(batch[i]);
        }
    }
    closing_finish(&cl, pool);
    if (open_count)
        HM_LOG_WARN("pool '%s' destroyed with %zu IPC mappings still open (of %zu cached); "
                    "closed them", pool->ops.name, open_count, n);
    /* An evictor may still hold a claim on one of ours. */
    while (atomic_load_explicit(&pi->evictors, memory_order_acquire)) sched_yield();
    /* Mappings whose close failed before (in this destroy too): the last try. */
    for (size_t i = 0; i < pi->nunclosed; i++)
        if (!provider_close(pool, pi->unclosed[i].local, pi->unclosed[i].size, "left mapped"))
            hm__pool_note_refused(pool);
    hm__ipc_import_pool_fini(pi);
}

void hm__ipc_import_fold_hits(hm_ipc_pool_t *pi) {
    atomic_fetch_add_explicit(&opened.hits, pi->hits, memory_order_relaxed);
}

/* ------------------------------------------------------------------------ */
/* limits, statistics, fork                                                 */

void hm__ipc_import_init(size_t max_entries, size_t max_bytes) {
    atomic_store(&opened.max_entries, max_entries);
    atomic_store(&opened.max_bytes, max_bytes);
}

hm_result_t hm_ipc_set_cache_limits(size_t max_entries, size_t max_bytes) {
    hm__ipc_lazy_init();
    atomic_store(&opened.max_entries, max_entries);
    atomic_store(&opened.max_bytes, max_bytes);
    if (over_bound()) evict_over_bound();
    return HM_SUCCESS;
}

hm_result_t hm_ipc_get_cache_stats(hm_ipc_cache_stats_t *st) {
    if (!st) return HM_ERROR_INVALID_ARGUMENT;
    hm__ipc_lazy_init();
    hm__mutex_lock(&opened.lock);
    st->entries = opened.count;
    st->bytes = opened.bytes;
    hm__mutex_unlock(&opened.lock);
    /* In-use entries and hits are per pool (no shared counter on the hit
     * paths): summed here. */
    size_t in_use = 0;
    uint64_t hits = 0;
    hm__mutex_lock(&hm__ipc_pilist_lock);
    hits = atomic_load(&opened.hits);
    for (hm_ipc_pool_t *pi = hm__ipc_pilist; pi; pi = pi->gnext) {
        hm__mutex_lock(&pi->lock);
        hits += pi->hits;
        for (size_t i = 0; i < pi->cap; i++)
            for (imp_t *e = pi->lb[i]; e; e = e->lnext)
                in_use += st_refs(atomic_load_explicit(&e->state, memory_order_relaxed)) != 0;
        hm__mutex_unlock(&pi->lock);
    }
    hm__mutex_unlock(&hm__ipc_pilist_lock);
    st->in_use = in_use;
    st->hits = hits;
    st->misses = atomic_load(&opened.misses);
    st->evictions = atomic_load(&opened.evictions);
    st->stale = atomic_load(&opened.stale);
    st->exports = hm__ipc_export_count();
    return HM_SUCCESS;
}

void hm__ipc_import_atfork(int phase) {
    if (phase == 0) {
        hm__mutex_lock(&opened.lock);
        hm__mutex_lock(&imp_arena.lock);
    } else {
        hm__mutex_unlock(&imp_arena.lock);
        hm__mutex_unlock(&opened.lock);
    }
}
