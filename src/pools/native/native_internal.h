/* hetmem — the native pool's internal structures. Never installed.
 * SPDX-License-Identifier: MIT */
#ifndef HM_NATIVE_INTERNAL_H
#define HM_NATIVE_INTERNAL_H

#include "internal.h"
#include "addr_width.h"

#include <hetmem/pools/native.h>
#include <urcu/wfcqueue.h>

#define NV_NCLS_MAX 113          /* classes up to 1 MiB */
#define NV_FAST_MAX 4096         /* sizes classed by table lookup (513 bytes) */
#define NV_SLAB_MIN ((size_t)4 << 10)
#define NV_SLAB_MAX ((size_t)64 << 20)
#define NV_CLASS_LIMIT_MAX ((size_t)1 << 20)
#define NV_MIN_BLOCKS 8          /* a slab holds at least this many blocks */
#define NV_ADDR_BITS HM_NATIVE_ADDR_BITS /* addresses the page map covers (48) */
#define NV_OUT_SLOTS 8           /* outgoing remote-free batches per heap */
#define NV_BATCH_CAP 126         /* frees per batch: a large batch is 2 KiB */
#define NV_BATCH_SMALL 14        /* entries of a small batch (256 bytes) */
#define NV_BATCH_MID 30          /* entries of a middle one (512 bytes) */
#define NV_BATCH_SIZES 3         /* small, middle, large */
/* Remote frees between forced flushes, each counted in KiB rounded up
 * (1 for a block up to 1 KiB; flush_extra): 1024 frees of small blocks,
 * and at most 1 MiB of larger ones (up to 1 MiB each on device memory), is
 * what a thread that stops calling the pool (blocked in MPI_Wait, say) can
 * hold of other heaps' memory unpublished. */
#define NV_FLUSH_EVERY 1024
/* Spare batches a heap keeps, and batches moved to/from the depot at once:
 * every batch ever carved stays resident, and their number is about the
 * most in flight plus this slack (the owner's stock below NV_STOCK_MAX, the
 * freeing thread's last move, the depot): 4 and 2 keep a 1->1 pair's
 * batches on one page of 256-byte ones (8 and 4: 16 or 17, two pages at
 * times), for one more depot_lock round trip per 2 batches (252 frees)
 * than per 4. */
#define NV_STOCK_MAX 4
#define NV_STOCK_MOVE 2
#define NV_META_CHUNK ((size_t)64 << 10) /* mapping size for heaps and batches */
#define NV_META_ALIGN 4096       /* a heap's start in the metadata (meta_carve) */
#define NV_STACK_CAP 128         /* free-block stack slots per class (nv_sent_t; see nv_cls) */
#define NV_BY_TP_BITS 6
#define NV_BY_TP (1u << NV_BY_TP_BITS) /* heaps found by thread pointer */

extern uint32_t hm__nv_cls_size[NV_NCLS_MAX];
extern uint8_t hm__nv_cls_of8[NV_FAST_MAX / 8 + 1];
/* The same classes as byte offsets of their nv_cls in a heap (NV_CLS_AT):
 * the allocation fast path's class word is one add away from the heap. */
extern uint16_t hm__nv_cls_at8[NV_FAST_MAX / 8 + 1];

typedef struct nv_heap nv_heap_t;
typedef struct nv_pool nv_pool_t;

/* A slab: `span` bytes of provider memory at `base` (aligned to the slab
 * size), cut into nblocks blocks of bsize bytes. Host memory only, aligned to
 * a cache line.
 * Invariants: bit i of bits[] is set iff block i is free and not held in the
 * owner's cls word; nfree == popcount(bits). base, span never change;
 * owner, cl, cls, bsize, nblocks, magic change only while the slab is empty and
 * unmapped (retained), so a thread freeing a live block may read them
 * without a lock. Everything else is the owner heap's (or, when retained,
 * the pool lock's).
 * Layout: the first cache line holds what only the slow paths use (lists,
 * span, scan position, the state flags, bsize); the second holds
 * everything a local free reads or writes (the fixed fields it needs,
 * nfree, tr) and the first two bitmap words, so that a local free into a
 * slab of up to 128 blocks (classes of 512 B and up with 64 KiB slabs)
 * touches one line of its descriptor. A remote free reads the fixed fields
 * (bsize too) once per bitmap word (nv_heap.r_key), which the owner writes
 * at most once per word it takes or drains. */
typedef struct nv_cls nv_cls_t;
typedef struct nv_slab {
    /* Slow paths only. */
    size_t span;
    uint32_t nwords;
    uint32_t scan; /* next word take_word looks at (owner) */
    uint32_t wcap; /* bitmap words the descriptor has room for */
    uint32_t hw;   /* words taken at least once since the range was mapped
                    * or purged (take_word): the slab's pages in use */
    struct nv_slab *prev, *next;         /* owner's partial list | pool's retained list */
    struct nv_slab *all_prev, *all_next; /* pool's list of every slab (pool lock) */
    uint32_t bsize; /* fixed while live */
    /* The owner's, with tr below (slab_state). */
    uint8_t in_partial;
    /* s == s->cl->cur: a free's test whether s joins a list or goes back
     * needs no comparison with cl->cur (a coin toss when a class's blocks
     * span two slabs). The current slab does neither, even with every
     * block free; it goes back when retired (cls_retire_cur). */
    uint8_t is_cur;
    uint16_t cls; /* fixed while live */
    /* Read by every free; fixed while the slab is live (but cur_word). */
    uintptr_t base HM_CACHE_ALIGNED;
    /* ceil(2^64 / bsize): for an offset off < 2^32, off / bsize is the high
     * 64 bits of off * magic, and off is a multiple of bsize iff the low 64
     * bits are below magic (Lemire, Kaser and Kurz, "Faster remainder by
     * direct computation", Softw. Pract. Exp. 49(6), 2019): one multiply
     * finds a block's index and refuses an interior pointer (slab_div). */
    uint64_t magic;
    nv_heap_t *owner;
    nv_cls_t *cl;   /* &owner->cls[cls] */
    /* The owner's (read by its frees only): cl->word while s is its class's
     * current slab (is_cur), else UINT32_MAX, so that a free tells whether
     * its block is in the word being handed out with one comparison. */
    uint32_t cur_word;
    uint32_t nblocks;
    /* The owner's. */
    uint32_t nfree;
    /* The nfree after a free at which that free must call slab_transition
     * (the state flags in one compare): UINT32_MAX for the current slab
     * (never), nblocks for a slab in the partial list (it goes back to the
     * pool when all its blocks are free), 1 for a slab in neither (full: a
     * free makes it partial). Kept by slab_state. */
    uint32_t tr;
    uint64_t bits[];
} nv_slab_t;
_Static_assert(NV_NCLS_MAX <= UINT16_MAX, "nv_slab.cls is 16 bits");
_Static_assert(offsetof(nv_slab_t, base) == HM_CACHE_LINE,
               "the slow paths' fields fill the first line");
_Static_assert(offsetof(nv_slab_t, bits) + 2 * sizeof(uint64_t) <= 2 * HM_CACHE_LINE,
               "a free's fields and two bitmap words share the second line");

/* One entry of a heap's free-block stack: a free block, as its slab and
 * its index there (the pop's bitmap update needs no division). */
typedef struct nv_sent {
    nv_slab_t *s;
    uint32_t idx;
    uint32_t unused;
} nv_sent_t;
/* A class's stack area, NV_STACK_CAP slots: a power of two, and aligned to
 * its size (nv_heap.stk_map), so that a stack pointer alone tells whether
 * its stack is empty or full (nv_cls.top). */
#define NV_STACK_BYTES ((uintptr_t)NV_STACK_CAP * sizeof(nv_sent_t))
_Static_assert((NV_STACK_BYTES & (NV_STACK_BYTES - 1)) == 0 && NV_STACK_BYTES <= 4096,
               "a stack area is a power of two that divides a page");

/* Per heap and size class. `bits` are free blocks of word `word` of `cur`
 * taken out of cur->bits; the fast path hands them out. Blocks of that word
 * come back into `bits` (the owner's frees, the block allocated last,
 * nv_heap.last, among them, and remote frees drained); a free's
 * double-free test of such a block reads both `bits` and cur->bits[word].
 * The free-block stack (host memory) holds blocks the owner freed into
 * slab bitmaps (not into the class word): the next allocation of the class
 * that finds `bits` empty pops the newest one (the LIFO reuse of tcmalloc's
 * thread-cache free lists, kept apart from the managed memory). It grows
 * down from the end of its area stk[0..NV_STACK_CAP), and `top` points at
 * the newest entry: the entries are top[0..n), n = (end - top) / 16. Slot
 * 0 is never used, so that the area's alignment (NV_STACK_BYTES) tells
 * both ends apart with top alone: the stack is empty iff top is aligned
 * (top == end, or NULL before set-up), full iff top - 1 is (top ==
 * &stk[1]); a push and a pop each test, move and store one pointer
 * (NV_STACK_CAP - 1 entries at most). Invariants: every entry is a block
 * of a slab of this heap and class whose bitmap bit is set (the bitmap stays the truth: a
 * stacked block is free, so a second free of it is caught and a slab whose
 * blocks are all free, stacked or not, goes back to the pool); no block is
 * stacked twice; take_word runs only while the stack is empty (so it never
 * takes a stacked block); a slab leaving the heap first drops its entries
 * (stk_purge). A free finding the stack full only sets the bit.
 * A heap's classes are set up at their first refill (cls_refill), so that
 * only the cache lines of the classes a heap uses are touched: until then
 * the line is all zero (no bits, no current slab, an empty stack), which
 * every path takes for an empty class, and no block of the class is the
 * heap's. */
struct nv_cls {
    /* Atomic only for get_stats, which reads other heaps' words (relaxed:
     * plain loads and stores on the owner's paths). */
    _Atomic uint64_t bits;
    uintptr_t wbase; /* address of the first block of that word */
    uint32_t bsize;
    uint32_t word;   /* UINT32_MAX: none */
    nv_slab_t *cur;
    /* The newest stacked entry (relaxed: get_stats reads it); NULL until
     * the class is set up. */
    _Atomic(nv_sent_t *) top;
    uint32_t prefetch; /* nv_pool.prefetch, on the line a push reads */
    nv_sent_t *stk;  /* the stack area, NV_STACK_CAP slots (nv_heap.stk_map) */
} HM_CACHE_ALIGNED; /* one cache line per class; the partial lists are apart */

/* One entry of a remote-free batch: blocks of one bitmap word of a slab,
 * named by the address of the word's first block (an address in the managed
 * memory, never dereferenced: the owner finds the slab through its page map)
 * and a mask of the word's blocks freed. The freeing side merges consecutive
 * frees into one word (allocation order, which remote frees usually follow)
 * into one entry, so the owner's drain works per word, not per block. */
typedef struct nv_rent {
    uintptr_t wbase;
    uint64_t mask;
} nv_rent_t;

/* A batch of remote frees: host memory, one queue node for up to
 * NV_BATCH_CAP frees. Three sizes: small (NV_BATCH_SMALL entries), middle
 * (NV_BATCH_MID) and large (NV_BATCH_CAP entries, so room for every free).
 * A batch starts at the size the heap's last batches needed
 * (nv_heap.batch_start); one whose entries run out before its frees do is
 * copied into one of the next size (batch_grow). The middle size serves
 * frees that scatter over a few more words than a small batch names (a
 * producer handing out the partly refilled words of a fan-in: 15 to 21
 * entries per 126 frees), at a quarter of a large one's memory. Frees into consecutive blocks share entries, so producer/
 * consumer pairs fill a batch's frees with a few entries, and the batches
 * in flight (up to a consumer's burst of frees) then take few pages.
 * Carved from the pool's metadata mappings (nv_pool.meta) and never freed
 * before the pool: a drained batch goes to its owner heap's stock of its
 * size, whose surplus goes to the pool's depot of that size, where any
 * heap's batch_get finds it. */
typedef struct nv_batch {
    struct cds_wfcq_node node;
    struct nv_batch *link; /* stock/depot list, or the mutex-queue list */
    uint32_t count;        /* entries */
    uint32_t nfrees;       /* frees: the bits of the masks */
    uint32_t cap;          /* entries it has room for */
    nv_rent_t ent[];       /* cap entries */
} nv_batch_t;
_Static_assert(sizeof(nv_batch_t) + NV_BATCH_SMALL * sizeof(nv_rent_t) == 256 &&
                   sizeof(nv_batch_t) + NV_BATCH_MID * sizeof(nv_rent_t) == 512 &&
                   sizeof(nv_batch_t) + NV_BATCH_CAP * sizeof(nv_rent_t) == 2048,
               "batches of 256 and 512 bytes and 2 KiB: whole cache lines");

/* An outgoing batch and where its words' entries are: ix[hash of an
 * entry's wbase] is that entry's index + 1 (0: none), so a remote free into
 * any word the batch already names merges into its entry, not only into the
 * last one (frees of mixed sizes interleave the words of several classes:
 * one entry per word keeps the batches and the owner's drain per word). A
 * hint only: an index is trusted after comparing the entry's wbase, so it
 * needs no clearing when the batch is published or replaced. */
#define NV_OUT_IX 32
typedef struct nv_out {
    nv_heap_t *dest;
    nv_batch_t *b;
    uint8_t ix[NV_OUT_IX];
} nv_out_t;
_Static_assert(NV_BATCH_CAP <= UINT8_MAX, "nv_out.ix holds an entry index + 1");

/* A thread's tie to a heap (thread-local list). heap becomes NULL when the
 * pool is destroyed (under g_lock). */
typedef struct nv_binding {
    struct nv_binding *next;
    uint64_t pool_id;
    _Atomic(nv_heap_t *) heap;
} nv_binding_t;

/* One pool's state for one thread. Everything above rq_head belongs to the
 * thread the heap is bound to (or to whoever holds it while abandoned:
 * pool lock, trim, or the orphan lock for the orphan heap), except the
 * all_next/aband_next links (pool lock), binding (g_lock) and the st_
 * counters, which others read relaxed. rq_head and rq_tail sit on their own
 * cache lines: enqueuers write the tail, the owner the head. */
struct nv_heap {
    /* Read by other threads' frees (the ownership test); written only at
     * binding and abandonment. Alone on the first cache line. */
    nv_pool_t *nv;
    /* Thread pointer (thread_tp()) of the thread bound to the heap, 0 while
     * none is: the free fast path's ownership test, without a TLS access.
     * Unique among live threads; set by the binding thread, cleared when the
     * heap is abandoned (its own thread, or the fork child for threads that
     * do not exist there), so only the bound thread ever sees its own value. */
    _Atomic uintptr_t tp;
    /* The owner's, from the second line on. */
    /* Class bytes this heap took out of slab bitmaps into its class words
     * (take_word, and remote frees drained into a class word), minus those
     * it put back (its frees into slab bitmaps, words retired) and its
     * remote frees; the heap's share of bytes_requested is this minus the
     * blocks in its class words and stacks, so allocations from a word and
     * frees back into it, and pushes and pops of the stacks, need no
     * counter update. */
    _Atomic int64_t st_bytes HM_CACHE_ALIGNED;
    /* The block the allocation fast path handed out last (0: none), its
     * class and its bit in that class's `bits`: while set, that block is in
     * the word being handed out (cls_refill and heap_tidy, which change the
     * word, clear it first), so freeing it right back (malloc/free pairs)
     * needs no page-map lookup: the bit goes back into `bits`. While last
     * is 0, last_bit is 0 and last_cl a class of this heap
     * (heap_forget_last, heap_init), so that the free entry's test of a
     * NULL pointer against it changes nothing (nv_free_entry). */
    uintptr_t last;
    nv_cls_t *last_cl;
    uint64_t last_bit;
    /* The entry of the caller's last remote free (r_key: its wbase, 0:
     * none): a remote free into the same word only sets its bit there,
     * while r_left > 1. r_left counts down from r_base the frees the batch
     * and the flush bound still allow; the frees merged so (r_base - r_left)
     * are added to r_b->nfrees and out_pending (a unit each: only a block up
     * to 1 KiB gets a cached entry) when the entry is left (out_settle). */
    uintptr_t r_key;
    uintptr_t r_span;  /* bytes of the word's blocks (0: no entry) */
    uint64_t r_magic;  /* 32-bit magic from the slab's (cached_free) */
    uint32_t r_bsize;
    uint32_t r_left;
    nv_rent_t *r_ent;
    nv_batch_t *r_b;
    uint32_t r_base;
    uint32_t out_pending; /* remote frees since the last flush, in units (NV_FLUSH_EVERY) */
    uint32_t batch_start; /* the size batches start at, 0..2 (see nv_batch_t) */
    uint32_t nstock[NV_BATCH_SIZES]; /* spare batches per size: small, middle, large */
    nv_batch_t *stock[NV_BATCH_SIZES];
    nv_out_t out[NV_OUT_SLOTS];
    struct __cds_wfcq_head priv_head; /* spliced from rq, owner only */
    struct cds_wfcq_tail priv_tail;
    nv_heap_t *all_next;
    nv_heap_t *aband_next;
    nv_binding_t *binding;
    _Atomic uint64_t st_published, st_drained;
    struct __cds_wfcq_head rq_head HM_CACHE_ALIGNED;
    struct cds_wfcq_tail rq_tail HM_CACHE_ALIGNED;
    /* HM_NATIVE_QUEUE_MUTEX */
    pthread_mutex_t mq_lock HM_CACHE_ALIGNED;
    _Atomic(nv_batch_t *) mq_list;
    /* Per class: the other slabs of this heap with free blocks (the array
     * precedes the heap: heap_carve). */
    nv_slab_t **partial;
    nv_sent_t *stk_map; /* the classes' stacks: ncls * NV_STACK_CAP entries,
                         * a private mapping (backed where touched) */
    nv_cls_t cls[] HM_CACHE_ALIGNED;
};

/* Byte offset of class c's nv_cls in a heap (hm__nv_cls_at8). */
#define NV_CLS_AT(c) (offsetof(nv_heap_t, cls) + (size_t)(c) * sizeof(nv_cls_t))
_Static_assert(NV_CLS_AT(NV_NCLS_MAX) <= UINT16_MAX, "hm__nv_cls_at8 is 16 bits");

typedef struct nv_lentry {
    uintptr_t base;
    size_t size;
} nv_lentry_t;

typedef struct nv_lmap {
    nv_lentry_t *e;
    size_t cap, count;
} nv_lmap_t;

/* The head of one metadata mapping (nv_pool.meta): the pool's first
 * mapping's is nv_pool.meta0 (so that creating a pool touches no page of
 * it), the others' is their last cache line (on the page of their first
 * batches: meta_alloc). */
typedef struct nv_meta {
    struct nv_meta *next;
    uintptr_t base; /* the mapping */
    size_t size;
} HM_CACHE_ALIGNED nv_meta_t;

struct nv_pool {
    /* Immutable after init. */
    hm_pool_t *pool;
    uint64_t id; /* unique in the process: thread-local caches key on it */
    uint32_t ncls;
    size_t class_limit;
    size_t fast_limit; /* min(class_limit, NV_FAST_MAX): nv_alloc's fast path */
    /* A by_tp slot of its own, looked at before the hash table (as the
     * jemalloc pool's own_tp, je_fast.c): the heap of the first thread
     * noted (by_tp_note), or of any noted thread once that heap is unbound
     * (tp 0). The same protocol as by_tp: never NULL (&by_tp_nobody at
     * first), written on the slow path with release, trusted by a reader
     * only if heap->tp equals its own thread pointer. Beside the fields
     * the fast paths read, and written only when it changes. */
    _Atomic(nv_heap_t *) own;
    size_t slab_size;
    unsigned shift; /* log2(slab_size) */
    unsigned leaf_bits;
    unsigned root_shift; /* shift + leaf_bits */
    size_t leaf_mask;    /* (1 << leaf_bits) - 1 */
    size_t root_len;
    /* Page map: root[k >> leaf_bits][k & mask], but for the first leaf
     * installed, which is in the hint alone (root[] untouched: a pool whose
     * slabs lie in one leaf's span backs no page of the root). */
    _Atomic uintptr_t *root;
    /* The first leaf installed and the first unit it maps (root index <<
     * leaf_bits), set once under the pool lock (hint_leaf first, then
     * hint_first with release; hint_first is 2^63 until then, which no unit
     * index reaches): a lookup in that leaf's span skips the root load, so
     * its only load that depends on the address is the leaf entry. */
    _Atomic size_t hint_first;
    _Atomic uintptr_t *_Atomic hint_leaf;
    size_t leaf_len; /* 1 << leaf_bits */
    size_t page;
    size_t large_threshold;
    size_t retained_max;
    hm_native_remote_queue_t queue;
    uint32_t batch_cap;
    bool can_free, can_purge_lazy, can_purge_force;
    /* Host memory the CPU may touch (HM_MEMORY_HOST or _HOST_PINNED with
     * HM_PROVIDER_CAP_CPU_ACCESS): a free that stacks a block prefetches it
     * for writing (stk_push). Never for other memory. Fixed: the front
     * end's free entry is one of two copies, with and without the
     * prefetch (nv_init), so that the flag is not tested there. */
    bool prefetch;
    size_t cls_span[NV_NCLS_MAX];

    /* Heaps by thread pointer, for the allocation fast path without a TLS
     * access: slot tp_slot(tp) holds a heap that was bound to a thread with
     * that hash. A reader trusts the entry only if heap->tp equals its own
     * thread pointer (only the bound thread can see its own value there).
     * Written on the slow path; heaps live as long as the pool. */
    _Atomic(nv_heap_t *) by_tp[NV_BY_TP] HM_CACHE_ALIGNED;

    pthread_mutex_t lock HM_CACHE_ALIGNED; /* heaps, abandoned, retained, all_slabs */
    nv_heap_t *heaps;
    nv_heap_t *abandoned;
    nv_slab_t *retained;
    nv_slab_t *all_slabs;

    pthread_mutex_t orphan_lock; /* the heap of threads without one */
    nv_heap_t *orphan;
    nv_sent_t *orphan_stk; /* its stacks until it is set up */
    bool orphan_ready;     /* orphan set up (orphan_heap; orphan_lock) */

    pthread_mutex_t depot_lock; /* also the metadata mappings */
    nv_batch_t *depot[NV_BATCH_SIZES]; /* spare batches per size (nv_heap.stock) */
    /* Metadata that lives as long as the pool (heaps, remote-free batches),
     * carved in order from mappings of its own (meta_alloc): a thread that
     * only frees remotely then never calls malloc (under glibc its first
     * malloc would set up a malloc arena for the thread), and the batches
     * of all heaps share pages (layout: meta_carve). meta: the mappings'
     * heads, newest first; meta_first: where the newest's room starts;
     * [meta_next, meta_end): what is left of it, heaps carved from its
     * start, batches from its end. */
    struct nv_meta *meta;
    uintptr_t meta_first, meta_next, meta_end;
    struct nv_meta meta0;

    pthread_mutex_t large_lock;
    nv_lmap_t live;
    nv_lentry_t *lcache;
    size_t lcache_len, lcache_cap;

    /* Slow-path counters. */
    _Atomic size_t kept; /* retained slab bytes + cached large bytes */
    _Atomic size_t held, nranges, nslabs, large_live;

    nv_pool_t *g_next; /* live native pools (g_lock) */
};

/* Is p the start of a block or large range of the pool with this state?
 * (For the malloc replacement, which must tell its pointers from libc's.) */
int hm__native_owns(void *state, const void *p);

/* The pool's free and alloc ops, called directly (for the malloc
 * replacement). hm__native_free_owned returns HM_ERROR_NOT_FOUND, without a
 * log line, for a pointer the pool does not hold (it frees nothing then);
 * otherwise what the free op returns. */
hm_result_t hm__native_free_owned(void *state, void *p);
hm_result_t hm__native_alloc(void *state, size_t size, size_t align, void **out);
/* malloc and free for the malloc replacement (alignment <= 8): the fast
 * paths call nothing (no malloc, no lock, no log). hm__native_malloc runs a
 * refill, which may call malloc, with *guard set (the replacement's
 * recursion guard, a thread-local of the caller's), and passes what the
 * pool does not serve at once (a large size, no heap for the thread yet, an
 * out-of-memory refill) to other. hm__native_free passes every case beyond
 * its fast path (a slow path, a slab going back to the pool, an error, a
 * pointer that is not the pool's) to other, by tail call, having changed
 * nothing. */
void *hm__native_malloc(void *state, size_t size, int *guard, void *(*other)(size_t));
hm_result_t hm__native_free(void *state, void *p, hm_result_t (*other)(void *));

/* Call fn for every range the pool holds from its provider (slabs, live and
 * cached large ranges), under the pool's locks: fn must not call into the
 * pool. (For the malloc replacement's fork handling.) */
void hm__native_for_each_range(void *state, void (*fn)(void *arg, uintptr_t base, size_t size),
                               void *arg);
/* The same with the pool's locks already held by the caller (inside fork(),
 * after hm__native_atfork_prepare, or in the child before
 * hm__native_atfork_child). */
void hm__native_for_each_range_locked(void *state,
                                      void (*fn)(void *arg, uintptr_t base, size_t size),
                                      void *arg);

/* Lock-free page-map lookup. */
HM_INLINE nv_slab_t *map_get(const nv_pool_t *nv, const void *p) {
    size_t d = ((uintptr_t)p >> nv->shift) -
               atomic_load_explicit(&nv->hint_first, memory_order_acquire);
    _Atomic uintptr_t *leaf;
    if (hm_likely(d < nv->leaf_len)) {
        leaf = atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed);
    } else {
        size_t ri = (uintptr_t)p >> nv->root_shift;
        if (hm_unlikely(ri >= nv->root_len)) return NULL;
        leaf = (_Atomic uintptr_t *)atomic_load_explicit(&nv->root[ri], memory_order_acquire);
        if (hm_unlikely(!leaf)) return NULL;
        /* The unit's index in its leaf, from p again (not from the
         * quotient above, which would then stay live on the hint's path):
         * bits [shift, root_shift) of p. */
        d = ((uintptr_t)p << (64 - nv->root_shift)) >> (64 - nv->leaf_bits);
    }
    return (nv_slab_t *)atomic_load_explicit(&leaf[d], memory_order_acquire);
}

/* A heap's class word (nv_cls.bits): relaxed, the owner is its only writer. */
HM_INLINE uint64_t cl_bits(const nv_cls_t *cl) {
    return atomic_load_explicit(&cl->bits, memory_order_relaxed);
}
HM_INLINE void cl_set(nv_cls_t *cl, uint64_t v) {
    atomic_store_explicit(&cl->bits, v, memory_order_relaxed);
}

/* Counters with one writer: a relaxed load and store, no RMW. */
HM_INLINE void stat_add_i(_Atomic int64_t *x, int64_t d) {
    atomic_store_explicit(x, atomic_load_explicit(x, memory_order_relaxed) + d,
                          memory_order_relaxed);
}
HM_INLINE void stat_add_u(_Atomic uint64_t *x, uint64_t d) {
    atomic_store_explicit(x, atomic_load_explicit(x, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

#endif
