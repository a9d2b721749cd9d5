/* hetmem — the native pool: size classes, per-thread heaps, remote frees
 * through liburcu wait-free queues. SPDX-License-Identifier: MIT
 *
 * Design (the public contract is in include/hetmem/pools/native.h):
 *
 * - Metadata apart from the managed memory. A slab is a provider range of
 *   `span` bytes aligned to slab_size; its descriptor (nv_slab_t, host
 *   memory) holds a bitmap of free blocks. The pool never dereferences the
 *   managed memory, so it works on memory the CPU must not touch.
 * - The free path finds a block's slab through a per-pool two-level radix
 *   map from address >> log2(slab_size) to the descriptor (lock-free reads,
 *   leaves installed with CAS), then the block index and whether the
 *   pointer starts a block from one multiply by a 64-bit reciprocal (Lemire,
 *   Kaser and Kurz 2019: for n < 2^32 and c = ceil(2^64 / d), n / d is the
 *   high half of n * c and d divides n iff the low half is below c; see
 *   nv_slab.magic), so an interior pointer is refused.
 * - Per-thread heaps. Each heap keeps, per size class, one 64-bit word of the
 *   current slab's free bitmap (`bits`), the address of that word's first
 *   block and the class size: allocation is ctz + clear-lowest-bit + multiply
 *   (the "free list sharding" idea of mimalloc, Leijen et al. 2019, with a
 *   bitmap instead of in-block links, since blocks cannot hold metadata).
 *   A free into that same word sets the bit back, so alloc/free pairs reuse
 *   the same block; a free into any other word of any slab of the thread's
 *   heap sets the bit in that slab's bitmap, also on the fast path (only a
 *   slab that was full or becomes empty takes a non-inlined step). A thread
 *   finds its heap without a TLS access: the pool keeps one heap apart
 *   (nv_pool.own, its first thread's, as the jemalloc pool's own_tp) and
 *   the others in a small table indexed by a hash of the thread pointer
 *   (one instruction to read); an entry counts only if the heap's recorded
 *   thread pointer is the caller's (set at binding, cleared at
 *   abandonment); otherwise through a
 *   one-entry thread-local cache keyed by the pool's unique id, then the
 *   thread's bindings. A free tells its own blocks by comparing the slab's
 *   owner with that heap. The heap remembers the block it handed out last:
 *   freeing that one (malloc/free pairs) is an address comparison and a bit
 *   set, with no page-map lookup on the loop's critical path. Byte counters
 *   change only when blocks move between slab bitmaps and class words (or
 *   leave as remote frees), not per allocation (nv_heap.st_bytes).
 * - LIFO reuse: a free into a slab bitmap (any block not of the word being
 *   handed out) also pushes the block and its slab onto a bounded per-class
 *   stack in host memory (nv_cls.stk); an allocation that finds its class
 *   word empty pops the newest one, clearing its bit, before it takes a new
 *   word. This is the LIFO reuse of a thread cache's free list (tcmalloc,
 *   jemalloc) kept apart from the managed memory, with the bitmap as the
 *   truth: a stacked block is free there, so double frees are still caught
 *   and a slab whose blocks are all free still goes back to the pool (its
 *   entries dropped first). With random frees, the class word is mostly
 *   empty and every allocation would otherwise scan slab words for one or
 *   two free bits. Over host memory the CPU may touch, the push also
 *   prefetches the block (a free list in the blocks starts that miss with
 *   its store; the block's next user writes it).
 * - Sharing: what a remote free reads (a slab's fixed fields, a heap's
 *   thread pointer) sits on cache lines nobody writes while they are live;
 *   the owner's counters and lists are on other lines.
 * - Remote frees (snmalloc's message passing, Lietar et al. 2019, on the
 *   queue of the glibc RFC "malloc: use wfcqueue to speed up remote frees"):
 *   a thread freeing another heap's block appends it to a host-memory batch
 *   for that heap (8 outgoing slots, two-way associative by destination); a
 *   batch entry is one bitmap word (its first block's address and a mask),
 *   and consecutive frees into one word (the owner's allocation order, which
 *   remote frees usually follow) share it. The heap caches the entry of its
 *   last remote free with the word's geometry, so the next free into that
 *   word is validated and recorded without the page map (the slab cannot go
 *   back to the pool while an unpublished entry holds one of its blocks). A
 *   batch of 126 frees is published with one cds_wfcq_enqueue (one xchg).
 *   The owner splices its queue into a private one and drains it with the
 *   _nonblocking calls only, on its allocation slow path, one word's mask at
 *   a time. Drained batches are recycled through the heap's stock and a
 *   per-pool depot. Batches come in three sizes (nv_batch_t): frees into
 *   consecutive blocks need few entries, and small batches keep the
 *   batches in flight in few pages.
 * - Memory use: heaps and batches live in the pool's own mappings
 *   (nv_pool.meta: each heap's busy lines on a page of their own, the
 *   batches together) and thread bindings in thread-local storage or pages
 *   of their own, so a thread that only frees never calls malloc; the page
 *   map's first leaf is reached through its hint alone (no root page), and
 *   the orphan heap is set up at its first use; a heap touches only the
 *   lines of the classes it uses; a producer reuses the lowest blocks its
 *   consumers free (take_word), and a slab taken in a brief overflow gives
 *   way to one that empties with more of its pages used (slab_transition).
 * - The malloc replacement (src/preload/preload.c) compiles this file into
 *   its own translation unit (HM_NATIVE_PRELOAD: initial-exec TLS), so that
 *   its malloc, free, calloc and realloc inline the fast paths on the
 *   thread's heap (tl.fast, one load); its slow entries call
 *   hm__native_malloc/hm__native_free. The fast paths call nothing, so its
 *   recursion guard is set only around what may call malloc.
 * - Thread exit: a pthread key destructor abandons the thread's heaps; a
 *   thread that starts using the pool adopts one. Heaps live until the pool
 *   is destroyed, so a remote free can always reach its owner's queue.
 *
 * Lock order: g_lock -> nv->lock -> (tracker / provider); nv->large_lock,
 * nv->depot_lock (also the metadata mappings) and nv->orphan_lock are
 * leaves, except that the orphan heap, under orphan_lock, may take
 * nv->lock, large_lock and depot_lock. g_lock also guards the spare thread
 * bindings. */
#include "pools/native/native_internal.h"
#include "pool_internal.h"

#include "platform/prim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef HM_TSAN
#include <sanitizer/tsan_interface.h>
/* liburcu's x86 atomics are inline assembly TSan cannot see: tell it that the
 * batch published by the enqueue is acquired by the dequeuer. */
#define NV_TSAN_RELEASE(p) __tsan_release(p)
#define NV_TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define NV_TSAN_RELEASE(p) ((void)(p))
#define NV_TSAN_ACQUIRE(p) ((void)(p))
#endif

/* Thread-local state in the default (dynamic) TLS model, so that
 * libhetmem.so can be dlopen()ed; the build compiles this file with TLS
 * descriptors (-mtls-dialect=gnu2) where the compiler has them, which make an
 * access to a module loaded at start-up as cheap as initial-exec (one call
 * to a two-instruction resolver). One struct: one address computation per
 * function. The malloc replacement, which is only ever preloaded, compiles
 * this file with HM_NATIVE_PRELOAD: initial-exec, one load from the thread
 * pointer and no call. */
#ifdef HM_NATIVE_PRELOAD
#define NV_TLS __thread __attribute__((tls_model("initial-exec")))
#else
#define NV_TLS __thread
#endif
typedef struct nv_tls {
    uint64_t id;           /* pool id of `heap` (one-entry cache) */
    nv_heap_t *heap;       /* this thread's heap in that pool */
    /* The malloc replacement's (src/preload/preload.c, which compiles this
     * file into its own translation unit): this thread's heap in its pool
     * while its fast entries may use it, else NULL. The pool only clears
     * it, with `heap` (the heap abandoned, the pool destroyed). */
    nv_heap_t *fast;
    nv_binding_t *bindings;
    int dead;              /* the heap destructor ran: use the orphan heaps */
    int first_used;        /* `first` is in use (binding_new_locked) */
    nv_binding_t first;    /* the thread's first binding */
} nv_tls_t;

/* The parts, in this order: each uses what the ones before it define. One
 * translation unit, so that the fast paths inline across the parts. */
#include "pools/native/classes.c"
#include "pools/native/params.c"
#include "pools/native/pagemap.c"
#include "pools/native/large.c"
#include "pools/native/slab.c"
#include "pools/native/meta.c"
#include "pools/native/remote.c"
#include "pools/native/heap.c"
#include "pools/native/alloc.c"
#include "pools/native/free.c"
#include "pools/native/entries.c"
#include "pools/native/stats.c"
#include "pools/native/init.c"
#include "pools/native/fork.c"

/* ------------------------------------------------------------------------ */

static const hm_pool_ops_t native_ops = {
    .version = HM_POOL_OPS_VERSION,
    .name = "native",
    .init = nv_init,
    .fini = nv_fini,
    .alloc = nv_alloc,
    .free = nv_free,
    .malloc_fast = nv_malloc_fast,
    .usable_size = nv_usable_size,
    .trim = nv_trim,
    .get_stats = nv_get_stats,
    /* nv_free/nv_usable_size refuse foreign and interior pointers through the
     * pool's own slab map: the front-end's tracker check would double the
     * cost of a local free. */
    .flags = HM_POOL_OPS_VALIDATES_POINTERS | HM_POOL_OPS_RETRIES_OUT_OF_MEMORY,
};

const hm_pool_ops_t *hm_native_pool_ops(void) { return &native_ops; }

HM_RUN hm_result_t hm_native_pool_create(hm_provider_t *provider, const hm_native_params_t *params,
                                  uint32_t flags, hm_pool_t **pool) {
    return hm_pool_create(&native_ops, provider, params, flags, pool);
}
