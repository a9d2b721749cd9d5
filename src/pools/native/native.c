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
 * - The malloc replacement calls the fast paths directly
 *   (hm__native_malloc/hm__native_free): they call nothing, so its
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
 * function. */
typedef struct nv_tls {
    uint64_t id;           /* pool id of `heap` (one-entry cache) */
    nv_heap_t *heap;       /* this thread's heap in that pool */
    nv_binding_t *bindings;
    int dead;              /* the heap destructor ran: use the orphan heaps */
    int first_used;        /* `first` is in use (binding_new_locked) */
    nv_binding_t first;    /* the thread's first binding */
} nv_tls_t;

/* ------------------------------------------------------------------------ */
/* Size classes: 8, 16..256 step 16, then 8 per power of two up to 1 MiB.   */

uint32_t hm__nv_cls_size[NV_NCLS_MAX];
uint8_t hm__nv_cls_of8[NV_FAST_MAX / 8 + 1];
uint16_t hm__nv_cls_at8[NV_FAST_MAX / 8 + 1];

HM_INLINE unsigned cls_of_big(size_t size) { /* size > 256 */
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(size - 1));
    return 17u + (k - 8u) * 8u + (unsigned)((size - 1 - ((size_t)1 << k)) >> (k - 3u));
}

HM_INLINE unsigned cls_of(size_t size) {
    if (hm_likely(size <= NV_FAST_MAX)) return hm__nv_cls_of8[(size + 7) >> 3];
    return cls_of_big(size);
}

/* Round a large size up on the same scale (8 steps per power of two); 0 on
 * overflow. */
static size_t scale_round(size_t size) {
    if (size <= 256) return hm_align_up(size, 16);
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(size - 1));
    return hm_align_up(size, (size_t)1 << (k - 3u));
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* bindings, g_pools */
static _Atomic uint64_t g_next_id = 1;
static nv_pool_t *g_pools; /* live pools, for fork (g_lock) */

/* This thread's thread pointer: one instruction on x86-64 and AArch64 (the
 * TCB address, unique among live threads), else the address of a
 * thread-local variable. */
HM_INLINE uintptr_t thread_tp(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    uintptr_t tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#elif defined(__aarch64__) && defined(__GNUC__)
    uintptr_t tp;
    __asm__("mrs %0, tpidr_el0" : "=r"(tp));
    return tp;
#else
    static __thread char anchor;
    return (uintptr_t)&anchor;
#endif
}

/* Thread state: the alloc fast path reads tl.id/tl.heap only. */
static __thread nv_tls_t tl;

static void tl_destructor(void *arg);

static void global_init(void) {
    hm__nv_cls_size[0] = 8;
    for (unsigned i = 1; i <= 16; i++) hm__nv_cls_size[i] = 16u * i;
    for (unsigned k = 8; k < 20; k++)
        for (unsigned j = 0; j < 8; j++)
            hm__nv_cls_size[17 + (k - 8) * 8 + j] = (1u << k) + (j + 1) * (1u << (k - 3));
    for (unsigned i = 0; i <= NV_FAST_MAX / 8; i++) {
        size_t size = i ? (size_t)i * 8 : 1;
        unsigned c = 0;
        while (hm__nv_cls_size[c] < size) c++;
        hm__nv_cls_of8[i] = (uint8_t)c;
        hm__nv_cls_at8[i] = (uint16_t)NV_CLS_AT(c);
    }
    if (pthread_key_create(&g_key, tl_destructor)) HM_DIE("pthread_key_create failed");
    /* The fork hooks (hm__native_atfork_*) are the NATIVE slot of the
     * library's fork list, filled by init.c (fork.h). */
}

/* ------------------------------------------------------------------------ */
/* Params                                                                   */

#define NV_PARAMS_MAGIC 0x6e617469766550ull

enum {
    SET_SLAB = 1u << 0,
    SET_LIMIT = 1u << 1,
    SET_LARGE = 1u << 2,
    SET_RETAINED = 1u << 3,
};

struct hm_native_params {
    uint64_t magic;
    unsigned set;
    hm_native_defaults_t defaults;
    size_t slab_size, class_limit, large_threshold, retained;
    hm_native_remote_queue_t queue;
    unsigned batch;
};

hm_result_t hm_native_params_create(hm_native_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_native_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_native_params_t *p = calloc(1, sizeof(*p));
    if (!p) return HM_ERROR_OUT_OF_HOST_MEMORY;
    p->magic = NV_PARAMS_MAGIC;
    p->batch = NV_BATCH_CAP;
    *params = p;
    return HM_SUCCESS;
}

static int params_ok(const hm_native_params_t *p, const char *fn) {
    if (p && p->magic == NV_PARAMS_MAGIC) return 1;
    HM_LOG_ERROR("%s: %s", fn, p ? "not a native params object" : "params is NULL");
    return 0;
}

hm_result_t hm_native_params_destroy(hm_native_params_t *params) {
    if (!params) return HM_SUCCESS;
    if (!params_ok(params, "hm_native_params_destroy")) return HM_ERROR_INVALID_ARGUMENT;
    params->magic = 0;
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_defaults(hm_native_params_t *params,
                                          hm_native_defaults_t defaults) {
    if (!params_ok(params, "hm_native_params_set_defaults")) return HM_ERROR_INVALID_ARGUMENT;
    if (defaults != HM_NATIVE_DEFAULTS_AUTO && defaults != HM_NATIVE_DEFAULTS_HOST &&
        defaults != HM_NATIVE_DEFAULTS_DEVICE) {
        HM_LOG_ERROR("hm_native_params_set_defaults: unknown defaults %d", (int)defaults);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->defaults = defaults;
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_slab_size(hm_native_params_t *params, size_t size) {
    if (!params_ok(params, "hm_native_params_set_slab_size")) return HM_ERROR_INVALID_ARGUMENT;
    if (!hm_is_pow2(size) || size < NV_SLAB_MIN || size > NV_SLAB_MAX) {
        HM_LOG_ERROR("hm_native_params_set_slab_size(%zu): must be a power of two in "
                     "[4 KiB, 64 MiB]", size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->slab_size = size;
    params->set |= SET_SLAB;
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_size_class_limit(hm_native_params_t *params, size_t size) {
    if (!params_ok(params, "hm_native_params_set_size_class_limit"))
        return HM_ERROR_INVALID_ARGUMENT;
    if (size < 64 || size > NV_CLASS_LIMIT_MAX) {
        HM_LOG_ERROR("hm_native_params_set_size_class_limit(%zu): must be in [64 B, 1 MiB]",
                     size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->class_limit = size;
    params->set |= SET_LIMIT;
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_large_threshold(hm_native_params_t *params, size_t size) {
    if (!params_ok(params, "hm_native_params_set_large_threshold"))
        return HM_ERROR_INVALID_ARGUMENT;
    params->large_threshold = size;
    params->set |= SET_LARGE;
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_retained_bytes(hm_native_params_t *params, size_t bytes) {
    if (!params_ok(params, "hm_native_params_set_retained_bytes"))
        return HM_ERROR_INVALID_ARGUMENT;
    params->retained = bytes;
    params->set |= SET_RETAINED;
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_remote_queue(hm_native_params_t *params,
                                              hm_native_remote_queue_t queue) {
    if (!params_ok(params, "hm_native_params_set_remote_queue"))
        return HM_ERROR_INVALID_ARGUMENT;
    if (queue != HM_NATIVE_QUEUE_WFCQ && queue != HM_NATIVE_QUEUE_MUTEX) {
        HM_LOG_ERROR("hm_native_params_set_remote_queue: unknown queue %d", (int)queue);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->queue = queue;
    return HM_SUCCESS;
}

hm_result_t hm_native_params_set_remote_batch(hm_native_params_t *params, unsigned count) {
    if (!params_ok(params, "hm_native_params_set_remote_batch"))
        return HM_ERROR_INVALID_ARGUMENT;
    if (count < 1 || count > NV_BATCH_CAP) {
        HM_LOG_ERROR("hm_native_params_set_remote_batch(%u): must be in [1, %u]", count,
                     NV_BATCH_CAP);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->batch = count;
    return HM_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Page map: address >> shift -> slab descriptor                            */

/* Page-map tables (root and leaves, 512 KiB each with 64 KiB slabs) come
 * straight from mmap: zero pages that the kernel backs only where a slot is
 * written, whatever malloc the process runs on (tcmalloc, for one, memsets
 * a large calloc: 1 MiB of RSS per pool before any allocation). */
static void *map_table(size_t n) {
    void *p;
    return hm__prim_map(n * sizeof(uintptr_t), 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                        HM_PRIM_MAP_NORESERVE, -1, 0, &p) == HM_SUCCESS
               ? p
               : NULL;
}

static void map_table_free(void *t, size_t n) {
    if (t) (void)hm__prim_unmap(t, n * sizeof(uintptr_t));
}

static hm_result_t map_init(nv_pool_t *nv) {
    unsigned bits = NV_ADDR_BITS - nv->shift;
    nv->leaf_bits = bits / 2;
    nv->root_shift = nv->shift + nv->leaf_bits;
    nv->leaf_mask = ((size_t)1 << nv->leaf_bits) - 1;
    nv->root_len = (size_t)1 << (bits - nv->leaf_bits);
    nv->root = map_table(nv->root_len);
    atomic_init(&nv->hint_leaf, NULL);
    atomic_init(&nv->hint_first, (size_t)1 << 63);
    nv->leaf_len = (size_t)1 << nv->leaf_bits;
    return nv->root ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
}

static void map_fini(nv_pool_t *nv) {
    if (!nv->root) return;
    for (size_t i = 0; i < nv->root_len; i++)
        map_table_free((void *)atomic_load_explicit(&nv->root[i], memory_order_relaxed),
                       nv->leaf_len);
    map_table_free((void *)nv->root, nv->root_len);
    map_table_free((void *)atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed),
                   nv->leaf_len);
}

/* The leaf of root index ri, NULL if none is installed (or none visible to
 * the caller yet: map_set then rechecks under the lock). The first leaf is
 * in the hint only (nv_pool.hint_first), never in the root, so that a pool
 * whose slabs all lie in one leaf's span touches no page of the root. */
static _Atomic uintptr_t *map_leaf(nv_pool_t *nv, size_t ri) {
    if (atomic_load_explicit(&nv->hint_first, memory_order_acquire) == ri << nv->leaf_bits)
        return atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed);
    return (_Atomic uintptr_t *)atomic_load_explicit(&nv->root[ri], memory_order_acquire);
}

/* Install the leaf of root index ri (none was visible); NULL: out of host
 * memory. Under the pool lock: installs are rare (one per leaf span, 4 GiB
 * with 64 KiB slabs), and the lock orders the hint's two fields for the
 * writers (readers: see map_get). */
static HM_NOINLINE _Atomic uintptr_t *map_leaf_install(nv_pool_t *nv, size_t ri) {
    hm__mutex_lock(&nv->lock);
    _Atomic uintptr_t *leaf = map_leaf(nv, ri);
    if (!leaf && (leaf = map_table(nv->leaf_len))) {
        if (!atomic_load_explicit(&nv->hint_leaf, memory_order_relaxed)) {
            /* hint_leaf before hint_first (release): a reader that takes
             * the hint (map_get, map_leaf) sees the leaf. */
            atomic_store_explicit(&nv->hint_leaf, leaf, memory_order_relaxed);
            atomic_store_explicit(&nv->hint_first, ri << nv->leaf_bits, memory_order_release);
        } else {
            atomic_store_explicit(&nv->root[ri], (uintptr_t)leaf, memory_order_release);
        }
    }
    hm__mutex_unlock(&nv->lock);
    return leaf;
}

/* Point every unit of [base, base+span) at s (NULL to clear). 0: out of
 * host memory for a leaf (nothing changed for the units not reached).
 * Called without the pool lock (it takes it to install a leaf). */
static int map_set(nv_pool_t *nv, uintptr_t base, size_t span, nv_slab_t *s) {
    for (uintptr_t k = base >> nv->shift, end = (base + span) >> nv->shift; k < end; k++) {
        size_t ri = k >> nv->leaf_bits;
        _Atomic uintptr_t *leaf = map_leaf(nv, ri);
        if (!leaf) {
            if (!s) continue;
            if (!(leaf = map_leaf_install(nv, ri))) return 0;
        }
        atomic_store_explicit(&leaf[k & nv->leaf_mask], (uintptr_t)s, memory_order_release);
    }
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Large allocations: live map (address -> size) and the cache of freed     */
/* ranges, under large_lock.                                                */

static size_t lmap_slot(uintptr_t k, size_t cap) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull; /* Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4) */
    return (size_t)(k >> 17) & (cap - 1);
}

static int lmap_grow(nv_lmap_t *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    nv_lentry_t *ne = calloc(ncap, sizeof(*ne));
    if (!ne) return 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].base) continue;
        size_t j = lmap_slot(m->e[i].base, ncap);
        while (ne[j].base) j = (j + 1) & (ncap - 1);
        ne[j] = m->e[i];
    }
    free(m->e);
    m->e = ne;
    m->cap = ncap;
    return 1;
}

static int lmap_put(nv_lmap_t *m, uintptr_t base, size_t size) {
    if ((m->count + 1) * 2 > m->cap && !lmap_grow(m)) return 0;
    size_t j = lmap_slot(base, m->cap);
    while (m->e[j].base) j = (j + 1) & (m->cap - 1);
    m->e[j].base = base;
    m->e[j].size = size;
    m->count++;
    return 1;
}

static nv_lentry_t *lmap_find(nv_lmap_t *m, uintptr_t base) {
    if (!m->cap) return NULL;
    for (size_t j = lmap_slot(base, m->cap); m->e[j].base; j = (j + 1) & (m->cap - 1))
        if (m->e[j].base == base) return &m->e[j];
    return NULL;
}

/* Remove base; its size, or 0. Linear probing with backward-shift deletion
 * (Knuth, TAOCP vol. 3, 6.4, Algorithm R): no tombstones. */
static size_t lmap_take(nv_lmap_t *m, uintptr_t base) {
    nv_lentry_t *e = lmap_find(m, base);
    if (!e) return 0;
    size_t size = e->size, i = (size_t)(e - m->e), mask = m->cap - 1;
    for (size_t j = (i + 1) & mask; m->e[j].base; j = (j + 1) & mask) {
        size_t h = lmap_slot(m->e[j].base, m->cap);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            m->e[i] = m->e[j];
            i = j;
        }
    }
    m->e[i].base = 0;
    m->e[i].size = 0;
    m->count--;
    return size;
}

/* Bytes kept (retained slabs + cached large ranges) may grow by n? */
static int kept_fits(nv_pool_t *nv, size_t n) {
    size_t kept = atomic_load_explicit(&nv->kept, memory_order_relaxed);
    return nv->retained_max == SIZE_MAX || (kept <= nv->retained_max && n <= nv->retained_max - kept);
}

static void purge_range(nv_pool_t *nv, uintptr_t base, size_t size) {
    if (nv->can_purge_force || nv->can_purge_lazy)
        hm_pool_provider_purge(nv->pool, (void *)base, size, nv->can_purge_force);
}

/* Provider memory [p, +size) that provider_take refuses: given back. */
static HM_NOINLINE hm_result_t refuse_range(nv_pool_t *nv, void *p, size_t size) {
    if (!p) { /* a provider bug; 0 also marks "none" in the pool (nv_heap.r_key) */
        HM_LOG_ERROR("native pool: the provider returned address 0 for %zu bytes", size);
        return HM_ERROR_NOT_SUPPORTED;
    }
    HM_LOG_ERROR("native pool: provider memory [%p, +%zu) reaches beyond the %d-bit addresses "
                 "its page map covers; refused", p, size, HM_NATIVE_ADDR_BITS);
    if (hm_pool_provider_free(nv->pool, p, size) != HM_SUCCESS)
        HM_LOG_WARN("native pool: the provider cannot take [%p, +%zu) back; it stays unused "
                    "until the pool is destroyed", p, size);
    return HM_ERROR_NOT_SUPPORTED;
}

/* Memory from the provider, for a slab or a large block: [*out, +size),
 * below 2^HM_NATIVE_ADDR_BITS (addr_width.h), which the page map covers
 * (map_init). A range that reaches beyond would index past the map's root
 * (map_set), so it goes back to the provider and the call fails; large
 * blocks, kept in lmap rather than the map, are refused alike, so that what
 * the pool accepts does not depend on the size. */
HM_INLINE hm_result_t provider_take(nv_pool_t *nv, size_t size, size_t align, void **out) {
    void *p = NULL;
    hm_result_t r = hm_pool_provider_alloc(nv->pool, size, align, &p);
    if (r != HM_SUCCESS) return r;
    if (hm_unlikely(!p || !hm__range_below((uintptr_t)p, size, HM_NATIVE_ADDR_BITS)))
        return refuse_range(nv, p, size);
    *out = p;
    return HM_SUCCESS;
}

static hm_result_t large_alloc(nv_pool_t *nv, size_t size, size_t align, void **out) {
    size_t rsize = size <= nv->large_threshold ? scale_round(size) : size;
    if (rsize) rsize = hm_align_up(rsize, nv->page);
    if (!rsize) return HM_ERROR_OUT_OF_MEMORY;
    size_t a = align > nv->page ? align : nv->page;
    uintptr_t base = 0;
    size_t got = rsize;
    if (rsize <= nv->large_threshold || !nv->can_free) {
        hm__mutex_lock(&nv->large_lock);
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < nv->lcache_len; i++) {
            nv_lentry_t *e = &nv->lcache[i];
            if (e->size < rsize || (e->base & (a - 1))) continue;
            /* Exact fit for providers that free; the smallest fit otherwise. */
            if (nv->can_free && e->size != rsize) continue;
            if (best == SIZE_MAX || e->size < nv->lcache[best].size) best = i;
            if (e->size == rsize) break;
        }
        if (best != SIZE_MAX) {
            base = nv->lcache[best].base;
            got = nv->lcache[best].size;
            nv->lcache[best] = nv->lcache[--nv->lcache_len];
            atomic_fetch_sub_explicit(&nv->kept, got, memory_order_relaxed);
        }
        hm__mutex_unlock(&nv->large_lock);
    }
    if (!base) {
        void *p = NULL;
        hm_result_t r = provider_take(nv, rsize, align > nv->page ? align : 0, &p);
        if (r != HM_SUCCESS) return r;
        base = (uintptr_t)p;
        atomic_fetch_add_explicit(&nv->held, rsize, memory_order_relaxed);
        atomic_fetch_add_explicit(&nv->nranges, 1, memory_order_relaxed);
    }
    hm__mutex_lock(&nv->large_lock);
    int ok = lmap_put(&nv->live, base, got);
    hm__mutex_unlock(&nv->large_lock);
    if (!ok) {
        if (nv->can_free && hm_pool_provider_free(nv->pool, (void *)base, got) == HM_SUCCESS) {
            atomic_fetch_sub_explicit(&nv->held, got, memory_order_relaxed);
            atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
        } else {
            HM_LOG_WARN("native pool: out of host memory; %zu bytes at %p lost for reuse", got,
                        (void *)base);
        }
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    atomic_fetch_add_explicit(&nv->large_live, got, memory_order_relaxed);
    *out = (void *)base;
    return HM_SUCCESS;
}

/* Keep [base, +size) in the cache (large_lock held). 0: no room. */
static int lcache_push(nv_pool_t *nv, uintptr_t base, size_t size) {
    if (nv->lcache_len == nv->lcache_cap) {
        size_t ncap = nv->lcache_cap ? nv->lcache_cap * 2 : 16;
        nv_lentry_t *n = realloc(nv->lcache, ncap * sizeof(*n));
        if (!n) return 0;
        nv->lcache = n;
        nv->lcache_cap = ncap;
    }
    nv->lcache[nv->lcache_len].base = base;
    nv->lcache[nv->lcache_len].size = size;
    nv->lcache_len++;
    atomic_fetch_add_explicit(&nv->kept, size, memory_order_relaxed);
    return 1;
}

static hm_result_t large_free(nv_pool_t *nv, void *p) {
    hm__mutex_lock(&nv->large_lock);
    size_t size = lmap_take(&nv->live, (uintptr_t)p);
    if (!size) {
        hm__mutex_unlock(&nv->large_lock);
        return HM_ERROR_NOT_FOUND;
    }
    atomic_fetch_sub_explicit(&nv->large_live, size, memory_order_relaxed);
    if (!nv->can_free || (size <= nv->large_threshold && kept_fits(nv, size))) {
        int ok = lcache_push(nv, (uintptr_t)p, size);
        hm__mutex_unlock(&nv->large_lock);
        if (ok) return HM_SUCCESS;
        if (!nv->can_free) {
            HM_LOG_WARN("native pool: out of host memory; %zu bytes at %p lost for reuse", size,
                        p);
            return HM_SUCCESS;
        }
    } else {
        hm__mutex_unlock(&nv->large_lock);
    }
    hm_result_t r = hm_pool_provider_free(nv->pool, p, size);
    if (r != HM_SUCCESS) { /* keep it rather than lose it */
        hm__mutex_lock(&nv->large_lock);
        if (!lcache_push(nv, (uintptr_t)p, size))
            HM_LOG_WARN("native pool: %zu bytes at %p lost for reuse", size, p);
        hm__mutex_unlock(&nv->large_lock);
        return HM_SUCCESS;
    }
    atomic_fetch_sub_explicit(&nv->held, size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
    return HM_SUCCESS;
}

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
static nv_slab_t *desc_new(uint32_t words) {
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
static int slab_carve(nv_pool_t *nv, nv_slab_t *s, nv_heap_t *h, unsigned c) {
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
static void slab_release(nv_pool_t *nv, nv_slab_t *s) {
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
static hm_result_t slab_acquire(nv_pool_t *nv, nv_heap_t *h, unsigned c, nv_slab_t **out) {
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

static void partial_push(nv_cls_t *cl, nv_slab_t *s) {
    (void)cl;
    nv_slab_t **head = partial_head(s);
    s->prev = NULL;
    s->next = *head;
    if (*head) (*head)->prev = s;
    *head = s;
    slab_state(s, 1, s->is_cur);
}

static void partial_unlink(nv_cls_t *cl, nv_slab_t *s) {
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
static HM_NOINLINE hm_result_t stk_full(const nv_slab_t *s) {
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
static void stk_purge(nv_heap_t *h, const nv_slab_t *s) {
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
static void take_word(nv_heap_t *h, nv_cls_t *cl, nv_slab_t *s) {
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
static void cls_retire_cur(nv_heap_t *h, nv_cls_t *cl) {
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
static HM_NOINLINE void slab_transition(nv_heap_t *h, nv_cls_t *cl, nv_slab_t *s) {
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
        /* The word's blocks freed since it was taken are in s->bits[w]
         * (free_general): a double free may be found there too. */
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


/* ------------------------------------------------------------------------ */
/* Pool metadata: heaps and remote-free batches (nv_pool.meta)              */

/* Metadata mappings (heads: nv_meta_t); heaps are carved
 * upwards from a mapping's start, each but its first from a page boundary
 * (NV_META_ALIGN), and batches (and the orphan heap, page-aligned)
 * downwards from its end, so that a heap's busy lines (its partial heads,
 * header and first classes: heap_carve) share a page with no other heap's
 * and the batches share pages with each other: two threads' heaps and
 * their batches back three pages (six when heaps and batches were carved
 * in turn; the orphan heap, untouched until used, is on pages of its own). */
enum { META_HEAP, META_BATCH, META_TOP };

static void *meta_carve(nv_pool_t *nv, size_t size, int kind) {
    if (!nv->meta) return NULL;
    uintptr_t at;
    if (kind == META_HEAP) {
        at = nv->meta_next == nv->meta_first
                 ? nv->meta_first
                 : hm_align_up(nv->meta_next, (uintptr_t)NV_META_ALIGN);
        if (at > nv->meta_end || nv->meta_end - at < size) return NULL;
        nv->meta_next = at + size;
        return (void *)at;
    }
    if (nv->meta_end - nv->meta_next < size) return NULL;
    at = nv->meta_end - size;
    if (kind == META_TOP) at &= ~(uintptr_t)(NV_META_ALIGN - 1);
    if (at < nv->meta_next) return NULL;
    nv->meta_end = at;
    return (void *)at;
}

/* size bytes of zeroed host memory, whole cache lines, that live until
 * nv_fini (depot_lock held), of a kind above; NULL: out of host memory
 * (logged by the mapping). */
static void *meta_alloc(nv_pool_t *nv, size_t size, int kind) {
    size = hm_align_up(size, HM_CACHE_LINE);
    void *p = meta_carve(nv, size, kind);
    if (p) return p;
    /* A later mapping's head: its last line, on the page of its first
     * batches (its first page is its first heap's). */
    size_t head = nv->meta ? sizeof(nv_meta_t) : 0;
    size_t len = hm_align_up(head + size + NV_META_ALIGN, NV_META_CHUNK);
    if (hm__prim_map(len, 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, HM_PRIM_MAP_NORESERVE, -1,
                     0, &p) != HM_SUCCESS)
        return NULL;
    nv_meta_t *m = head ? (nv_meta_t *)((char *)p + len - head) : &nv->meta0;
    m->next = nv->meta;
    m->base = (uintptr_t)p;
    m->size = len;
    nv->meta = m;
    nv->meta_first = nv->meta_next = (uintptr_t)p;
    nv->meta_end = (uintptr_t)p + len - head;
    return meta_carve(nv, size, kind);
}

/* Unmap the metadata (no heap or batch is used any more). */
static void meta_fini(nv_pool_t *nv) {
    for (nv_meta_t *m = nv->meta, *next; m; m = next) {
        next = m->next; /* before the unmap: m may be the mapping's */
        (void)hm__prim_unmap((void *)m->base, m->size);
    }
    nv->meta = NULL;
    nv->meta_first = nv->meta_next = nv->meta_end = 0;
}

/* ------------------------------------------------------------------------ */
/* Remote frees                                                             */

/* The size (index of nv_heap.stock) of a batch of cap entries, or of the
 * smallest that holds n entries. */
HM_INLINE unsigned batch_size_of(uint32_t n) {
    return (unsigned)(n > NV_BATCH_SMALL) + (unsigned)(n > NV_BATCH_MID);
}

/* An empty batch of size big (batch_size_of); NULL: out of host memory. */
static nv_batch_t *batch_get(nv_heap_t *h, unsigned big) {
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

static void batch_put(nv_heap_t *h, nv_batch_t *b) {
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
static nv_batch_t *batch_grow(nv_heap_t *h, nv_out_t *o) {
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

static void publish(nv_heap_t *h, nv_out_t *o) {
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

static void flush_all(nv_heap_t *h) {
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
static nv_out_t *out_pick(nv_heap_t *h, nv_heap_t *dest) {
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
static hm_result_t remote_free(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
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
        /* Free bits of the word are in the class word or, freed by the
         * owner since it was taken, in s->bits[w] (free_general). */
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
static void drain_batch(nv_heap_t *h, nv_batch_t *b) {
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
static size_t drain(nv_heap_t *h) {
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

/* ------------------------------------------------------------------------ */
/* Heaps and thread bindings                                                */

static size_t stk_map_size(const nv_pool_t *nv) {
    return hm_align_up((size_t)nv->ncls * NV_STACK_CAP * sizeof(nv_sent_t), (size_t)4096);
}

/* Bytes of a heap's partial heads, which precede it (see heap_carve). */
static size_t partial_size(const nv_pool_t *nv) {
    return hm_align_up((size_t)nv->ncls * sizeof(nv_slab_t *), HM_CACHE_LINE);
}

/* Room for a heap, not yet set up (heap_init): its partial heads, then the
 * heap, so that the lines a heap of small classes uses (partial heads,
 * header, first classes: under 2 KiB with 64-byte blocks) lie together, and
 * its stacks, a mapping of their own, so that only the pages of the classes
 * in use are backed (whatever malloc the process runs on). Nothing of it is
 * touched. NULL: out of host memory. */
static nv_heap_t *heap_carve(nv_pool_t *nv, int kind, nv_sent_t **stkp) {
    void *stk;
    if (hm__prim_map(stk_map_size(nv), 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                     HM_PRIM_MAP_NORESERVE, -1, 0, &stk) != HM_SUCCESS)
        return NULL;
    size_t size = partial_size(nv) + sizeof(nv_heap_t) + nv->ncls * sizeof(nv_cls_t);
    hm__mutex_lock(&nv->depot_lock);
    char *unit = meta_alloc(nv, size, kind); /* zeroed, cache-line aligned */
    hm__mutex_unlock(&nv->depot_lock);
    if (!unit) {
        (void)hm__prim_unmap(stk, stk_map_size(nv));
        return NULL;
    }
    *stkp = stk;
    return (nv_heap_t *)(unit + partial_size(nv));
}

/* Set up a heap and its stacks from heap_carve and enter it in the pool's
 * list. */
static void heap_init(nv_pool_t *nv, nv_heap_t *h, nv_sent_t *stk) {
    h->stk_map = stk;
    h->partial = (nv_slab_t **)((char *)h - partial_size(nv));
    h->nv = nv;
    h->last_cl = &h->cls[0]; /* last 0, last_bit 0: see heap_forget_last */
    __cds_wfcq_init(&h->rq_head, &h->rq_tail);
    __cds_wfcq_init(&h->priv_head, &h->priv_tail);
    pthread_mutex_init(&h->mq_lock, NULL);
    /* The classes are set up at their first refill (cls_refill). */
    hm__mutex_lock(&nv->lock);
    h->all_next = nv->heaps;
    nv->heaps = h;
    hm__mutex_unlock(&nv->lock);
}

static nv_heap_t *heap_new(nv_pool_t *nv) {
    nv_sent_t *stk;
    nv_heap_t *h = heap_carve(nv, META_HEAP, &stk);
    if (h) heap_init(nv, h, stk);
    return h;
}

/* The heap of threads without one (orphan_lock held): carved at nv_init,
 * set up at its first use, so that a pool whose threads all have heaps
 * never touches it. */
static nv_heap_t *orphan_heap(nv_pool_t *nv) {
    if (hm_unlikely(!nv->orphan_ready)) {
        heap_init(nv, nv->orphan, nv->orphan_stk);
        nv->orphan_ready = true;
    }
    return nv->orphan;
}

/* Publish what h holds for others and hand it to the pool (g_lock held). */
static void heap_abandon(nv_heap_t *h) {
    nv_pool_t *nv = h->nv;
    atomic_store_explicit(&h->tp, 0, memory_order_relaxed);
    flush_all(h);
    hm__mutex_lock(&nv->lock);
    h->aband_next = nv->abandoned;
    nv->abandoned = h;
    hm__mutex_unlock(&nv->lock);
}

/* Thread bindings (g_lock held), so that a thread that only frees never
 * calls malloc (see nv_pool.meta): a thread's first one is in its
 * thread-local state (tl.first: no page of its own for the common thread of
 * one pool; only its own thread and, until its destructor has run, nv_fini
 * under g_lock touch it), the others from pages of their own, kept for
 * reuse (never unmapped: a binding may outlive its pool). */
static nv_binding_t *g_spare_bindings;

static nv_binding_t *binding_new_locked(void) {
    if (!tl.first_used) {
        tl.first_used = 1;
        return &tl.first;
    }
    if (!g_spare_bindings) {
        size_t page = hm__prim_page_size();
        void *p;
        if (hm__prim_map(page, 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, 0, -1, 0, &p) !=
            HM_SUCCESS)
            return NULL;
        nv_binding_t *a = p;
        for (size_t i = 0; i < page / sizeof(*a); i++) {
            a[i].next = g_spare_bindings;
            g_spare_bindings = &a[i];
        }
    }
    nv_binding_t *b = g_spare_bindings;
    g_spare_bindings = b->next;
    return b;
}

/* b is the caller's (its thread's tl.bindings or not yet in them). */
static void binding_free_locked(nv_binding_t *b) {
    if (b == &tl.first) {
        tl.first_used = 0;
        return;
    }
    b->next = g_spare_bindings;
    g_spare_bindings = b;
}

static HM_NOINLINE nv_heap_t *heap_get_slow(nv_pool_t *nv) {
    if (tl.dead) return NULL;
    for (nv_binding_t **bp = &tl.bindings; *bp;) {
        nv_binding_t *b = *bp;
        nv_heap_t *h = atomic_load_explicit(&b->heap, memory_order_acquire);
        if (!h) { /* its pool was destroyed */
            *bp = b->next;
            hm__mutex_lock(&g_lock);
            binding_free_locked(b);
            hm__mutex_unlock(&g_lock);
            continue;
        }
        if (b->pool_id == nv->id) {
            tl.id = nv->id;
            tl.heap = h;
            return h;
        }
        bp = &b->next;
    }
    hm__mutex_lock(&g_lock);
    nv_binding_t *b = binding_new_locked();
    hm__mutex_unlock(&g_lock);
    if (!b) return NULL;
    hm__mutex_lock(&nv->lock);
    nv_heap_t *h = nv->abandoned;
    if (h) nv->abandoned = h->aband_next;
    hm__mutex_unlock(&nv->lock);
    if (!h) h = heap_new(nv);
    if (!h) {
        hm__mutex_lock(&g_lock);
        binding_free_locked(b);
        hm__mutex_unlock(&g_lock);
        return NULL;
    }
    b->pool_id = nv->id;
    atomic_store_explicit(&b->heap, h, memory_order_relaxed);
    atomic_store_explicit(&h->tp, thread_tp(), memory_order_relaxed);
    hm__mutex_lock(&g_lock);
    h->binding = b;
    hm__mutex_unlock(&g_lock);
    b->next = tl.bindings;
    tl.bindings = b;
    pthread_setspecific(g_key, (void *)&tl.bindings);
    tl.id = nv->id;
    tl.heap = h;
    return h;
}

HM_INLINE nv_heap_t *heap_get(nv_pool_t *nv) {
    if (hm_likely(tl.id == nv->id)) return tl.heap;
    return heap_get_slow(nv);
}

/* ---- Heaps by thread pointer (nv->by_tp) ---- */

/* What every by_tp slot holds until a heap takes it: no thread has tp 0. */
static nv_heap_t by_tp_nobody;

HM_INLINE size_t tp_slot(uintptr_t tp) { /* Fibonacci hashing, as lmap_slot */
    return (size_t)((tp * 0x9E3779B97F4A7C15ull) >> (64 - NV_BY_TP_BITS));
}

/* The heap in the caller's by_tp slot (never NULL): the caller's heap iff
 * its tp is the caller's thread pointer (else ask heap_get). */
HM_INLINE nv_heap_t *heap_by_tp(nv_pool_t *nv, uintptr_t tp) {
    return atomic_load_explicit(&nv->by_tp[tp_slot(tp)], memory_order_acquire);
}
HM_INLINE int heap_is_mine(nv_heap_t *h, uintptr_t tp) {
    return atomic_load_explicit(&h->tp, memory_order_relaxed) == tp;
}
/* The heap in nv->own (never NULL): the caller's iff heap_is_mine. Tested
 * before heap_by_tp, it spares the pool's first thread the hash. */
HM_INLINE nv_heap_t *heap_own(nv_pool_t *nv) {
    return atomic_load_explicit(&nv->own, memory_order_acquire);
}

/* h is the caller's heap: enter it in by_tp unless the slot serves another
 * live thread (that one keeps it; this thread then takes the TLS path). */
static void by_tp_note(nv_pool_t *nv, nv_heap_t *h) {
    uintptr_t tp = thread_tp();
    /* nv->own: taken when no thread is bound to the heap there. Racing
     * writers store heaps of live threads; whichever stays is trusted by
     * its own thread only (heap_is_mine). */
    nv_heap_t *own = heap_own(nv);
    if (own != h && !atomic_load_explicit(&own->tp, memory_order_relaxed))
        atomic_store_explicit(&nv->own, h, memory_order_release);
    _Atomic(nv_heap_t *) *slot = &nv->by_tp[tp_slot(tp)];
    nv_heap_t *o = atomic_load_explicit(slot, memory_order_acquire);
    if (o == h) return;
    uintptr_t otp = atomic_load_explicit(&o->tp, memory_order_relaxed);
    if (otp && tp_slot(otp) == tp_slot(tp)) return;
    atomic_store_explicit(slot, h, memory_order_release);
}

/* pthread key destructor: abandon every heap of the exiting thread. */
static void tl_destructor(void *arg) {
    (void)arg;
    hm__mutex_lock(&g_lock);
    for (nv_binding_t *b = tl.bindings, *next; b; b = next) {
        next = b->next;
        nv_heap_t *h = atomic_load_explicit(&b->heap, memory_order_acquire);
        if (h) {
            h->binding = NULL;
            heap_abandon(h);
        }
        binding_free_locked(b);
    }
    tl.bindings = NULL;
    tl.id = 0;
    tl.heap = NULL;
    tl.dead = 1;
    hm__mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------------ */
/* Allocation                                                               */

/* The size class for size/align, or -1 for a large allocation. */
static int class_for(const nv_pool_t *nv, size_t size, size_t align) {
    if (align <= 8) return size <= nv->class_limit ? (int)cls_of(size) : -1;
    if (align > nv->slab_size) return -1;
    size_t sz = size > align ? size : align;
    if (sz > nv->class_limit) return -1;
    unsigned c = cls_of(sz);
    while (c < nv->ncls && hm__nv_cls_size[c] % align) c++;
    return c < nv->ncls ? (int)c : -1;
}

/* The word take_word would take from s (s->nfree > 0). */
static uint32_t next_word(const nv_slab_t *s) {
    uint32_t i = s->scan;
    while (!s->bits[i]) i = i + 1 == s->nwords ? 0 : i + 1;
    return i;
}

/* cl->cur would hand out a word it never used (its pages untouched): if one
 * of the first few slabs of the partial list has a free word among those it
 * used, that slab becomes the current one and cur goes back to the lists.
 * First fit across the heap's slabs, as take_word within one: the producer
 * of a producer/consumer pair, whose blocks come back through the remote
 * queue after a delay, otherwise moves its whole working set into each new
 * slab (a slab taken while the others were full, before the consumer's
 * frees were drained) and keeps every page of both resident; so the new
 * slab serves only the overflow. Called by cls_refill only (the stack is
 * empty, cl->bits too). Returns the current slab. */
#define NV_TOUCHED_LOOK 4
static HM_NOINLINE nv_slab_t *cls_prefer_touched(nv_heap_t *h, nv_cls_t *cl, unsigned c) {
    nv_slab_t *p = h->partial[c];
    for (unsigned k = 0; p && k < NV_TOUCHED_LOOK; p = p->next, k++) {
        if (!p->nfree || next_word(p) >= p->hw) continue;
        cls_retire_cur(h, cl);
        partial_unlink(cl, p);
        cl->cur = p;
        slab_state(p, 0, 1); /* cur_word is set by take_word */
        break;
    }
    return cl->cur;
}

/* cl->cur would hand out a word it never used (its pages untouched), and no
 * slab of the heap's partial list has a used one free (cls_prefer_touched):
 * a slab of the class's span that went back to the pool with pages still
 * backed (hw > 0: not purged since) becomes the current one, and cur goes
 * back to the lists. A producer whose consumers' frees come back in bursts
 * empties its older slabs while a slab taken in the meantime is current; the
 * first to empty becomes the current one (slab_transition), the others go
 * back to the pool, and without this the slab taken in the meantime, popped
 * from the partial list once that one is used up, would go on into its
 * untouched words (a 1->3 fan-in had its four slabs' pages all resident,
 * where three and a half at most were in use at once). Called only while
 * the pool keeps something (nv_pool.kept, a hint read without the lock).
 * Returns the current slab. */
static HM_NOINLINE nv_slab_t *cls_prefer_retained(nv_pool_t *nv, nv_heap_t *h, nv_cls_t *cl,
                                                  unsigned c) {
    size_t span = nv->cls_span[c];
    uint32_t words = cls_words(nv, c);
    nv_slab_t *r = NULL;
    hm__mutex_lock(&nv->lock);
    for (nv_slab_t **sp = &nv->retained; *sp; sp = &(*sp)->next) {
        if ((*sp)->span != span || (*sp)->wcap < words || !(*sp)->hw) continue;
        r = *sp;
        *sp = r->next;
        atomic_fetch_sub_explicit(&nv->kept, span, memory_order_relaxed);
        break;
    }
    hm__mutex_unlock(&nv->lock);
    if (!r) return cl->cur;
    if (!slab_carve(nv, r, h, c)) { /* out of host memory for a page-map leaf */
        r->owner = NULL;
        slab_unacquire(nv, r);
        return cl->cur;
    }
    cls_retire_cur(h, cl);
    cl->cur = r;
    slab_state(r, 0, 1); /* cur_word is set by take_word */
    return r;
}

/* Refill cl->bits (bits is empty). */
/* Should the refill look for a retained slab (cls_prefer_retained) before
 * s, the current slab, hands out a word it never used? Only if s has used
 * some (a fresh slab's first word costs the same as a retained one's) and
 * the pool keeps something (nv_pool.kept, a hint read without the lock). */
HM_INLINE int retained_first(nv_pool_t *nv, const nv_slab_t *s) {
    return s->scan >= s->hw && s->hw && atomic_load_explicit(&nv->kept, memory_order_relaxed);
}

static hm_result_t cls_refill(nv_heap_t *h, unsigned c) {
    nv_pool_t *nv = h->nv;
    nv_cls_t *cl = &h->cls[c];
    if (hm_unlikely(!cl->stk)) { /* the heap's first use of the class: see nv_cls */
        cl->bsize = hm__nv_cls_size[c];
        cl->word = UINT32_MAX;
        cl->stk = h->stk_map + (size_t)c * NV_STACK_CAP;
        stk_set_top(cl, cl->stk + NV_STACK_CAP); /* empty */
        cl->prefetch = nv->prefetch;
    }
    if (h->last_cl == cl) heap_forget_last(h); /* the word may change */
    if (h->out_pending) flush_all(h);
    /* Remote frees first: their blocks are reused before another word of
     * the slab, or another slab, is taken (fewer pages touched), and their
     * batches go back into circulation sooner (fewer batches). */
    if (drain_pending(h) && drain(h) && cl_bits(cl))
        return HM_SUCCESS; /* frees landed in the current word */
    nv_slab_t *s = cl->cur;
    if (s && s->nfree) {
        /* take_word's next word is usually s->scan's: from s->hw on, never used. */
        if (hm_unlikely(s->scan >= s->hw)) {
            if (h->partial[c]) s = cls_prefer_touched(h, cl, c);
            if (retained_first(nv, s)) s = cls_prefer_retained(nv, h, cl, c);
        }
        take_word(h, cl, s);
        return HM_SUCCESS;
    }
    if (s) { /* full: it leaves the lists until a block comes back */
        cl->cur = NULL;
        cl->word = UINT32_MAX;
        slab_state(s, s->in_partial, 0);
        s->cur_word = UINT32_MAX;
    }
    /* Slabs whose last free blocks stk_pop took stay listed until here. */
    while ((s = h->partial[c]) && !s->nfree) partial_unlink(cl, s);
    if (s) {
        partial_unlink(cl, s);
    } else {
        hm_result_t r = slab_acquire(nv, h, c, &s);
        if (r != HM_SUCCESS) return r;
    }
    cl->cur = s;
    slab_state(s, 0, 1);
    if (hm_unlikely(retained_first(nv, s))) s = cls_prefer_retained(nv, h, cl, c);
    take_word(h, cl, s);
    return HM_SUCCESS;
}

static hm_result_t alloc_small(nv_heap_t *h, unsigned c, void **out) {
    nv_cls_t *cl = &h->cls[c];
    if (!cl_bits(cl)) {
        uintptr_t p = stk_pop(h, cl);
        if (p) {
            *out = (void *)p;
            return HM_SUCCESS;
        }
        hm_result_t r = cls_refill(h, c);
        if (r != HM_SUCCESS) return r;
    }
    uint64_t b = cl_bits(cl);
    cl_set(cl, b & (b - 1));
    *out = (void *)(cl->wbase + (uintptr_t)__builtin_ctzll(b) * cl->bsize);
    return HM_SUCCESS;
}

static HM_NOINLINE hm_result_t alloc_slow(nv_pool_t *nv, size_t size, size_t align,
                                          void **out) {
    int c = class_for(nv, size, align);
    if (c < 0) return large_alloc(nv, size, align, out);
    nv_heap_t *h = heap_get(nv);
    hm_result_t r;
    if (hm_likely(h)) {
        by_tp_note(nv, h);
        r = alloc_small(h, (unsigned)c, out);
    } else {
        hm__mutex_lock(&nv->orphan_lock);
        nv_heap_t *o = orphan_heap(nv);
        r = alloc_small(o, (unsigned)c, out);
        flush_all(o);
        hm__mutex_unlock(&nv->orphan_lock);
    }
    /* No room for a whole slab (a provider of bounded capacity): a range of
     * its own, page-granular, may still fit. */
    if (hm_unlikely(r == HM_ERROR_OUT_OF_MEMORY))
        r = large_alloc(nv, size, align > 16 ? align : 16, out);
    return r;
}

/* The fast path's refill: h is the caller's heap, c a class. */
static HM_NOINLINE hm_result_t alloc_refill(nv_heap_t *h, unsigned c, void **out) {
    hm_result_t r = alloc_small(h, c, out);
    if (hm_unlikely(r == HM_ERROR_OUT_OF_MEMORY)) /* see alloc_slow */
        r = large_alloc(h->nv, hm__nv_cls_size[c], 16, out);
    return r;
}

/* The allocation fast path (alignment <= 8), in three parts that call
 * nothing, so that each caller's exits are tail calls of its own.
 * alloc_cls: the caller's heap's class for size, found by thread pointer
 * (*hp: the heap), or NULL (the slow path: a large size, or no heap found
 * that way). */
HM_INLINE nv_cls_t *alloc_cls(nv_pool_t *nv, size_t size, nv_heap_t **hp) {
    size_t at; /* of the class in the heap: NV_CLS_AT */
    if (hm_likely(size <= nv->fast_limit)) at = hm__nv_cls_at8[(size + 7) >> 3];
    else if (size <= nv->class_limit) at = NV_CLS_AT(cls_of_big(size));
    else return NULL;
    uintptr_t tp = thread_tp();
    nv_heap_t *h = heap_own(nv);
    if (hm_unlikely(!heap_is_mine(h, tp))) {
        h = heap_by_tp(nv, tp);
        if (hm_unlikely(!heap_is_mine(h, tp))) return NULL;
    }
    *hp = h;
    nv_cls_t *cl = (nv_cls_t *)((char *)h + at);
    if (!cl) __builtin_unreachable(); /* a heap's class: no test on the fast path */
    return cl;
}

/* alloc_fast's block from cl's class word b (not 0), which becomes h's
 * `last`. */
HM_INLINE uintptr_t alloc_word(nv_heap_t *h, nv_cls_t *cl, uint64_t b) {
    /* No counter update: see nv_heap.st_bytes. */
    uint64_t lowest = b & (0 - b);
    uintptr_t p = cl->wbase + (uintptr_t)(unsigned)__builtin_ctzll(b) * cl->bsize;
    cl_set(cl, b ^ lowest);
    h->last = p;
    h->last_cl = cl;
    h->last_bit = lowest;
    if (!p) __builtin_unreachable(); /* a slab's base is never 0 (slab_acquire) */
    return p;
}

/* alloc_fast's block from cl's stack (its class word is empty): the newest
 * entry's, or 0 if the stack is empty or that entry stale (the refill's
 * stk_pop then drops it). */
HM_INLINE uintptr_t alloc_pop(nv_cls_t *cl) {
    nv_sent_t *t = stk_top(cl);
    if (hm_unlikely(stk_at_end(t))) return 0;
    uintptr_t p = stk_take(cl, t);
    if (hm_likely(p)) stk_set_top(cl, t + 1);
    return p;
}

/* The three parts in one: the block, or 0 with *hp the caller's heap (its
 * class *clp has no block at hand: refill) or NULL (the slow path). */
HM_INLINE uintptr_t alloc_fast(nv_pool_t *nv, size_t size, nv_heap_t **hp, nv_cls_t **clp) {
    nv_heap_t *h = NULL;
    nv_cls_t *cl = alloc_cls(nv, size, &h);
    *hp = h;
    *clp = cl;
    if (hm_unlikely(!cl)) return 0;
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return alloc_word(h, cl, b);
    return alloc_pop(cl);
}

static hm_result_t nv_alloc(void *state, size_t size, size_t align, void **out) {
    nv_pool_t *nv = state;
    if (hm_likely(align <= 8)) {
        nv_heap_t *h;
        nv_cls_t *cl;
        uintptr_t p = alloc_fast(nv, size, &h, &cl);
        if (hm_likely(p)) {
            *out = (void *)p;
            return HM_SUCCESS;
        }
        if (h) return alloc_refill(h, (unsigned)(cl - h->cls), out);
    }
    return alloc_slow(nv, size, align, out);
}

/* ------------------------------------------------------------------------ */
/* Free                                                                     */

static hm_result_t free_block(nv_heap_t *h, nv_slab_t *s, uint32_t idx) {
    if (s->owner == h) return free_own(s, idx);
    hm_result_t r = remote_free(h, s, idx);
    if (r == HM_SUCCESS) stat_add_i(&h->st_bytes, -(int64_t)s->bsize);
    return r;
}

/* quiet: a pointer that is not the pool's returns HM_ERROR_NOT_FOUND
 * without a log line (hm__native_free_owned). */
static hm_result_t free_slow_q(nv_pool_t *nv, void *p, int quiet) {
    if (hm_unlikely(!p) && !quiet) return HM_SUCCESS; /* the free entry's NULL */
    nv_slab_t *s = map_get(nv, p);
    if (!s) {
        hm_result_t r = large_free(nv, p);
        if (r == HM_ERROR_NOT_FOUND) {
            if (quiet) return r;
            return hm__pool_refuse_free(nv->pool, p, "free", "not an allocation of this pool");
        }
        return r;
    }
    uint32_t idx;
    if (!block_index(s, p, &idx)) {
        HM_LOG_ERROR("native pool: free(%p): not the start of a block (interior pointer?)", p);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    nv_heap_t *h = heap_get(nv);
    if (hm_likely(h)) return free_block(h, s, idx);
    hm__mutex_lock(&nv->orphan_lock);
    nv_heap_t *o = orphan_heap(nv);
    hm_result_t r = free_block(o, s, idx);
    flush_all(o);
    hm__mutex_unlock(&nv->orphan_lock);
    return r;
}

static HM_NOINLINE hm_result_t free_slow(nv_pool_t *nv, void *p) {
    return free_slow_q(nv, p, 0);
}
static HM_NOINLINE hm_result_t free_slow_quiet(nv_pool_t *nv, void *p) {
    return free_slow_q(nv, p, 1);
}

/* A valid block (index idx) of s freed by a thread not bound to its owner
 * heap, or one whose heap is not in its by_tp slot (h is then
 * &by_tp_nobody; the block may even be the caller's own). */
static HM_NOINLINE hm_result_t free_other(nv_pool_t *nv, nv_slab_t *s, void *p, nv_heap_t *h,
                                          uint32_t idx) {
    if (hm_unlikely(h == &by_tp_nobody)) {
        if (hm_unlikely(tl.id != nv->id)) return free_slow(nv, p);
        h = tl.heap;
        by_tp_note(nv, h);
    }
    return free_block(h, s, idx);
}

/* The fast path met a double free of the block allocated last. */
static HM_NOINLINE hm_result_t free_double_last(nv_pool_t *nv, void *p) {
    nv_slab_t *s = map_get(nv, p);
    uint32_t idx = 0;
    if (s) block_index(s, p, &idx);
    if (s) return double_free(s, idx);
    HM_LOG_ERROR("native pool: double free of %p", p);
    return HM_ERROR_DOUBLE_FREE;
}


/* free_impl's modes: the free op; the same without a log line for a
 * pointer that is not the pool's (hm__native_free_owned); the fast paths
 * only (hm__native_free): every case that may call malloc or free (a slow
 * path, a slab going back to the pool, an error) goes, before changing
 * anything, to hm__native_free's other. */
enum { NV_FREE_OP, NV_FREE_QUIET, NV_FREE_FAST };
#define NV_EXIT(mode, call) ((mode) == NV_FREE_FAST ? other(p) : (call))

/* free_general's free of block p of s, the caller's, in the word of s
 * being handed out (s is its class's current slab): that word's free
 * blocks are in the class word, or, freed since it was taken, in s->bits
 * (nv_cls), so its double-free test reads both; then the block goes into
 * the bitmap and onto the stack like any other (s is current: no state
 * change). mode, other: as free_general's. */
static HM_NOINLINE hm_result_t free_cur_word(nv_slab_t *s, uintptr_t p, int mode,
                                             nv_other_fn other) {
    nv_cls_t *cl = s->cl;
    uint32_t idx = slab_idx(s, p - s->base), w = idx >> 6;
    uint64_t bit = (uint64_t)1 << (idx & 63), x = s->bits[w];
    if (hm_unlikely((x | cl_bits(cl)) & bit)) 
        return mode == NV_FREE_FAST ? other((void *)p) : double_free(s, idx);
    s->bits[w] = x | bit;
    s->nfree++;
    stk_push(cl, s, p, idx);
    return HM_SUCCESS;
}

/* free_own() inlined with the ownership test, which compares the slab's
 * owner with the caller's heap found by thread pointer (no TLS access);
 * every exit but success is a tail call, so the fast path needs no stack
 * frame. mode is a constant: one copy is compiled per mode. */
/* free_impl past the thread's own fast cases: me is the caller's heap, or
 * &by_tp_nobody. */
HM_INLINE hm_result_t free_general(nv_pool_t *nv, void *p, nv_heap_t *me, int mode,
                                   nv_other_fn other, int pf) {
    nv_slab_t *s = map_get(nv, p);
    if (hm_unlikely(!s))
        return NV_EXIT(mode, mode == NV_FREE_QUIET ? free_slow_quiet(nv, p) : free_slow(nv, p));
    uint32_t idx;
    if (hm_unlikely(!block_index(s, p, &idx)))
        return NV_EXIT(mode, mode == NV_FREE_QUIET ? free_slow_quiet(nv, p) : free_slow(nv, p));
    /* Ownership: the owner heap is the caller's (found by thread pointer;
     * no load of the owner's fields). */
    nv_heap_t *h = s->owner;
    if (hm_unlikely(h != me)) return NV_EXIT(mode, free_other(nv, s, p, me, idx));
    uint32_t w = idx >> 6;
    /* No branch on whether s is the current slab: that is a coin toss when
     * a class's live blocks span two slabs (random frees of small
     * classes), and a mispredicted branch here waits for the page-map
     * chain (cachegrind --branch-sim: 0.5 mispredictions per op on random
     * 8-128, all on that test). So a block of the word being handed out
     * goes into the slab's bitmap and onto the stack like any other (see
     * nv_cls); only its double-free test, which also reads the class word,
     * is apart (free_cur_word). That branch is rarely taken, a word of 64
     * blocks among a class's live blocks (s->cur_word names the word only
     * while s is current); the transition test reads is_cur, which rules
     * out the current slab. */
    if (hm_unlikely(w == s->cur_word)) return free_cur_word(s, (uintptr_t)p, mode, other);
    /* Past the ownership test only p, s and what follows from them stay
     * live (the exits recompute idx; h is s->owner), so that the path
     * needs no callee-saved registers. */
    nv_cls_t *cl = s->cl;
    uint64_t x = s->bits[w];
    if (hm_unlikely(bit_set_old(&x, idx))) return NV_EXIT(mode, double_free_at(s, (uintptr_t)p));
    uint32_t n = s->nfree + 1;
    /* (!(in_partial | is_cur) || n == nblocks) && !is_cur, in one compare
     * (nv_slab.tr). */
    if (hm_unlikely(n >= s->tr))
        return free_transition(s, (uintptr_t)p, mode == NV_FREE_FAST ? other : NULL);
    s->bits[w] = x; /* the bit set above */
    s->nfree = n;
    nv_sent_t *t = stk_top(cl) - 1;
    if (hm_unlikely(stk_at_end(t))) return stk_full(s);
    stk_put_pf(cl, s, (uintptr_t)p, idx, t, pf);
    return HM_SUCCESS;
}

/* free_general out of line (the cached remote free's fallback: inlined,
 * its registers would cost every free a stack frame). */
static HM_NOINLINE hm_result_t free_general_out(nv_pool_t *nv, void *p, nv_heap_t *me, int mode,
                                                nv_other_fn other) {
    return free_general(nv, p, me, mode, other, NV_PF_ASK);
}

/* free_more's free of a block in the word of the caller's last remote free
 * (roff: its offset from that word's first block): its bit goes into the
 * cached entry. 0: not that case (free_general sorts it out). */
HM_INLINE int cached_free(nv_heap_t *me, uintptr_t roff) {
    /* sub = roff / bsize through a 32-bit magic c = floor(M / 2^32) + 1,
     * with M the slab's 64-bit one (ceil(2^64 / bsize)): c exceeds
     * 2^32 / bsize by less than 1 + 2^-32, so for a block's offset
     * (q * bsize, q < 64, below 2^26) the product's high half is exactly q,
     * and any other offset fails the exact test sub * bsize == roff (the
     * shift is masked: such a sub may reach 64). Two imuls and no 128-bit
     * mul, which would take rdx, an argument the fallback passes on. */
    uint32_t sub = (uint32_t)((roff * me->r_magic) >> 32);
    uint32_t bsize = me->r_bsize;
    nv_rent_t *e = me->r_ent;
    uint64_t m = e->mask, bit = (uint64_t)1 << (sub & 63);
    uint32_t left = me->r_left;
    if (hm_unlikely((uintptr_t)sub * bsize != roff || (m & bit) || left <= 1)) return 0;
    e->mask = m | bit;
    me->r_left = left - 1;
    stat_add_i(&me->st_bytes, -(int64_t)bsize);
    return 1;
}

/* cached_free out of line, one copy per mode (so that the registers it
 * needs cost the local free no stack frame, and the fallback's mode is a
 * constant: with the 32-bit magic, the op's copy saves one callee-saved
 * register where the shared copy with a 128-bit mul saved five). */
static HM_NOINLINE hm_result_t free_cached_op(nv_pool_t *nv, void *p, nv_heap_t *me,
                                              uintptr_t roff) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_OP, NULL);
}
static HM_NOINLINE hm_result_t free_cached_quiet(nv_pool_t *nv, void *p, nv_heap_t *me,
                                                 uintptr_t roff) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_QUIET, NULL);
}
static HM_NOINLINE hm_result_t free_cached_fast(nv_pool_t *nv, void *p, nv_heap_t *me,
                                                uintptr_t roff, nv_other_fn other) {
    if (hm_likely(cached_free(me, roff))) return HM_SUCCESS;
    return free_general_out(nv, p, me, NV_FREE_FAST, other);
}

/* free_impl past the block allocated last: me is the caller's heap, or
 * &by_tp_nobody (whose r_span is 0). */
HM_INLINE hm_result_t free_more(nv_pool_t *nv, void *p, nv_heap_t *me, int mode,
                                nv_other_fn other) {
    /* A block in the word of the caller's last remote free (nv_heap.r_key;
     * its offset from the word's first block is below r_span, which is 0
     * while there is none): the cached entry's geometry validates it
     * without the page map (the slab cannot go back to the pool while the
     * entry holds one of its blocks), and its bit goes into the entry. */
    uintptr_t roff = (uintptr_t)p - me->r_key;
    if (roff < me->r_span) {
        if (mode == NV_FREE_OP) return free_cached_op(nv, p, me, roff);
        if (mode == NV_FREE_QUIET) return free_cached_quiet(nv, p, me, roff);
        return free_cached_fast(nv, p, me, roff, other);
    }
    return free_general(nv, p, me, mode, other, NV_PF_ASK);
}

/* One out-of-line copy per mode: the fast case of free_impl then needs no
 * stack frame. */
static HM_NOINLINE hm_result_t free_more_op(nv_pool_t *nv, void *p, nv_heap_t *me) {
    return free_more(nv, p, me, NV_FREE_OP, NULL);
}
static HM_NOINLINE hm_result_t free_more_quiet(nv_pool_t *nv, void *p, nv_heap_t *me) {
    return free_more(nv, p, me, NV_FREE_QUIET, NULL);
}
static HM_NOINLINE hm_result_t free_more_fast(nv_pool_t *nv, void *p, nv_heap_t *me,
                                              nv_other_fn other) {
    return free_more(nv, p, me, NV_FREE_FAST, other);
}

/* pf: NV_PF_ASK, the ops' copies (free_more out of line, one copy per
 * mode); NV_PF_NEVER or NV_PF_HOST, the free entries' (NV_FREE_OP with
 * free_more and free_general inlined: every exit but success is a tail
 * call, so it needs no stack frame; prefetch fixed). */
HM_INLINE hm_result_t free_impl(void *state, void *p, int mode, nv_other_fn other, int pf) {
    nv_pool_t *nv = state;
#if defined(__x86_64__)
    /* p stays where it came (rsi), which is where every tail call of an
     * entry passes it: without this GCC 12 moves it to rdi and back (2 of
     * the entry's fast-path instructions). Changes nothing else. */
    if (pf != NV_PF_ASK) __asm__("" : "+S"(p));
#endif
    uintptr_t tp = thread_tp();
    nv_heap_t *me = heap_own(nv);
    if (hm_likely(heap_is_mine(me, tp)) ||
        hm_likely(heap_is_mine(me = heap_by_tp(nv, tp), tp))) {
        /* The block this thread allocated last (see nv_heap.last): a
         * pointer equal to it is valid, so only the double-free test
         * remains. The address comparison does not wait for the page map,
         * which takes the lookup off the critical path of malloc/free
         * pairs. `last` stays set: the block is in the class word now, so
         * freeing it again finds its bit there (a double free), and every
         * change of the word clears `last` (cls_refill, heap_tidy). p NULL
         * matches only while `last` is 0, and then changes nothing
         * (heap_forget_last). */
        if (me->last == (uintptr_t)p) {
            nv_cls_t *cl = me->last_cl;
            uint64_t bit = me->last_bit, b = cl_bits(cl);
            if (hm_unlikely(b & bit)) {
                if (mode == NV_FREE_FAST) return other(p);
                heap_forget_last(me);
                return free_double_last(nv, p);
            }
            cl_set(cl, b | bit);
            return HM_SUCCESS;
        }
    } else {
        me = &by_tp_nobody; /* free_general sorts it out */
    }
    if (pf != NV_PF_ASK) { /* free_more inlined (NV_FREE_OP) */
        uintptr_t roff = (uintptr_t)p - me->r_key;
        if (roff < me->r_span) return free_cached_op(nv, p, me, roff);
        return free_general(nv, p, me, NV_FREE_OP, NULL, pf);
    }
    if (mode == NV_FREE_OP) return free_more_op(nv, p, me);
    if (mode == NV_FREE_QUIET) return free_more_quiet(nv, p, me);
    return free_more_fast(nv, p, me, other);
}

static hm_result_t nv_free(void *state, void *p) {
    return free_impl(state, p, NV_FREE_OP, NULL, NV_PF_ASK);
}

hm_result_t hm__native_free_owned(void *state, void *p) {
    return free_impl(state, p, NV_FREE_QUIET, NULL, NV_PF_ASK);
}

hm_result_t hm__native_alloc(void *state, size_t size, size_t align, void **out) {
    return nv_alloc(state, size, align, out);
}

/* hm__native_malloc's refill (h: the caller's heap, cl: the class). */
static HM_NOINLINE void *malloc_refill(nv_heap_t *h, nv_cls_t *cl, size_t size, int *guard,
                                       void *(*other)(size_t)) {
    uintptr_t p = stk_pop(h, cl); /* calls nothing */
    if (hm_likely(p)) return (void *)p;
    void *q;
    *guard = 1;
    hm_result_t r = alloc_refill(h, (unsigned)(cl - h->cls), &q);
    *guard = 0;
    return hm_likely(r == HM_SUCCESS) ? q : other(size);
}

void *hm__native_malloc(void *state, size_t size, int *guard, void *(*other)(size_t)) {
    nv_heap_t *h;
    nv_cls_t *cl;
    uintptr_t p = alloc_fast(state, size, &h, &cl);
    if (hm_likely(p)) return (void *)p;
    if (h) return malloc_refill(h, cl, size, guard, other);
    return other(size);
}

/* The malloc_fast op (hm_pool_malloc tail-calls it): alloc_fast, else
 * nv_alloc with its result as errno. */
static HM_NOINLINE void *malloc_fast_refill(nv_heap_t *h, nv_cls_t *cl) {
    uintptr_t p = stk_pop(h, cl);
    if (p) return (void *)p;
    void *q;
    hm_result_t r = alloc_refill(h, (unsigned)(cl - h->cls), &q);
    if (hm_unlikely(r != HM_SUCCESS)) {
        errno = hm__result_errno(r);
        return NULL;
    }
    return q;
}

static void *nv_malloc_fast(void *state, size_t size) {
    nv_heap_t *h;
    nv_cls_t *cl = alloc_cls(state, size, &h);
    if (hm_unlikely(!cl)) return hm__malloc_via(nv_alloc, state, size);
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return (void *)alloc_word(h, cl, b);
    uintptr_t p = alloc_pop(cl);
    if (hm_likely(p)) return (void *)p;
    return malloc_fast_refill(h, cl);
}

hm_result_t hm__native_free(void *state, void *p, hm_result_t (*other)(void *)) {
    return free_impl(state, p, NV_FREE_FAST, other, NV_PF_ASK);
}

/* ---- The front end's entries (hm_pool.malloc_entry, free_entry) ----
 * hm_pool_malloc and hm_pool_free tail-call these with the pool (not NULL),
 * so that no test of theirs and no second indirect call stands between the
 * caller and the fast paths: the entries test what the front end would
 * (size 0, ptr NULL) on paths they take anyway. */

/* nv_malloc_entry past its fast path: size 0 (EINVAL, as hm_pool_malloc's
 * generic entries), a size beyond fast_limit, no heap found by thread
 * pointer, or a refill. */
static HM_NOINLINE void *malloc_entry_slow(nv_pool_t *nv, size_t size) {
    if (hm_unlikely(!size)) {
        errno = hm__result_errno(HM_ERROR_INVALID_ARGUMENT);
        return NULL;
    }
    return nv_malloc_fast(nv, size);
}

static void *nv_malloc_entry(hm_pool_t *pool, size_t size) {
    nv_pool_t *nv = pool->state;
    /* size - 1 wraps for 0, which takes the slow path. */
    if (hm_unlikely(size - 1 >= nv->fast_limit)) return malloc_entry_slow(nv, size);
    uintptr_t tp = thread_tp();
    nv_heap_t *h = heap_own(nv);
    if (hm_unlikely(!heap_is_mine(h, tp))) {
        h = heap_by_tp(nv, tp);
        if (hm_unlikely(!heap_is_mine(h, tp))) return malloc_entry_slow(nv, size);
    }
    /* hm__nv_cls_at8[(size + 7) >> 3], from size - 1 as the test above
     * has it (size >= 1). */
    nv_cls_t *cl = (nv_cls_t *)((char *)h + (hm__nv_cls_at8 + 1)[(size - 1) >> 3]);
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return (void *)alloc_word(h, cl, b);
    uintptr_t p = alloc_pop(cl);
    if (hm_likely(p)) return (void *)p;
    return malloc_fast_refill(h, cl);
}

/* Host memory (nv_pool.prefetch): a stacked block is prefetched. */
static hm_result_t nv_free_entry_host(hm_pool_t *pool, void *p) {
    return free_impl(pool->state, p, NV_FREE_OP, NULL, NV_PF_HOST);
}
/* Any other memory: never prefetched. */
static hm_result_t nv_free_entry(hm_pool_t *pool, void *p) {
    return free_impl(pool->state, p, NV_FREE_OP, NULL, NV_PF_NEVER);
}

static size_t nv_usable_size(void *state, const void *p) {
    nv_pool_t *nv = state;
    nv_slab_t *s = map_get(nv, p);
    uint32_t idx;
    if (s) return block_index(s, p, &idx) ? s->bsize : 0;
    hm__mutex_lock(&nv->large_lock);
    nv_lentry_t *e = lmap_find(&nv->live, (uintptr_t)p);
    size_t size = e ? e->size : 0;
    hm__mutex_unlock(&nv->large_lock);
    return size;
}

int hm__native_owns(void *state, const void *p) {
    nv_pool_t *nv = state;
    nv_slab_t *s = map_get(nv, p);
    uint32_t idx;
    if (s) return block_index(s, p, &idx);
    hm__mutex_lock(&nv->large_lock);
    int found = lmap_find(&nv->live, (uintptr_t)p) != NULL;
    hm__mutex_unlock(&nv->large_lock);
    return found;
}

void hm__native_for_each_range(void *state, void (*fn)(void *arg, uintptr_t base, size_t size),
                               void *arg) {
    nv_pool_t *nv = state;
    hm__mutex_lock(&nv->lock);
    hm__mutex_lock(&nv->large_lock);
    hm__native_for_each_range_locked(state, fn, arg);
    hm__mutex_unlock(&nv->large_lock);
    hm__mutex_unlock(&nv->lock);
}

void hm__native_for_each_range_locked(void *state,
                                      void (*fn)(void *arg, uintptr_t base, size_t size),
                                      void *arg) {
    nv_pool_t *nv = state;
    for (nv_slab_t *s = nv->all_slabs; s; s = s->all_next) fn(arg, s->base, s->span);
    for (size_t i = 0; i < nv->live.cap; i++)
        if (nv->live.e[i].base) fn(arg, nv->live.e[i].base, nv->live.e[i].size);
    for (size_t i = 0; i < nv->lcache_len; i++) fn(arg, nv->lcache[i].base, nv->lcache[i].size);
}

/* ------------------------------------------------------------------------ */
/* Trim and statistics                                                      */

/* Give back what heap h (owned by the caller) holds without need. */
static void heap_tidy(nv_heap_t *h) {
    heap_forget_last(h);
    flush_all(h);
    drain(h);
    for (unsigned c = 0; c < h->nv->ncls; c++) cls_retire_cur(h, &h->cls[c]);
}

static hm_result_t nv_trim(void *state) {
    nv_pool_t *nv = state;
    if (!tl.dead && tl.id == nv->id) heap_tidy(tl.heap);
    /* Heaps whose thread exited: take them off the list while tidying. */
    hm__mutex_lock(&nv->lock);
    nv_heap_t *ab = nv->abandoned;
    nv->abandoned = NULL;
    hm__mutex_unlock(&nv->lock);
    nv_heap_t *last = NULL;
    for (nv_heap_t *h = ab; h; h = h->aband_next) {
        heap_tidy(h);
        last = h;
    }
    hm__mutex_lock(&nv->orphan_lock);
    if (nv->orphan_ready) heap_tidy(nv->orphan);
    hm__mutex_unlock(&nv->orphan_lock);
    hm__mutex_lock(&nv->lock);
    if (last) {
        last->aband_next = nv->abandoned;
        nv->abandoned = ab;
    }
    nv_slab_t *ret = nv->retained;
    nv->retained = NULL;
    if (nv->can_free) { /* unlink them all from the all-slabs list */
        for (nv_slab_t *s = ret; s; s = s->next) {
            if (s->all_prev) s->all_prev->all_next = s->all_next;
            else nv->all_slabs = s->all_next;
            if (s->all_next) s->all_next->all_prev = s->all_prev;
            atomic_fetch_sub_explicit(&nv->kept, s->span, memory_order_relaxed);
        }
    }
    hm__mutex_unlock(&nv->lock);
    hm_result_t result = HM_SUCCESS;
    if (nv->can_free) {
        nv_slab_t *keep = NULL;
        for (nv_slab_t *s = ret, *next; s; s = next) {
            next = s->next;
            if (hm_pool_provider_free(nv->pool, (void *)s->base, s->span) == HM_SUCCESS) {
                atomic_fetch_sub_explicit(&nv->held, s->span, memory_order_relaxed);
                atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
                atomic_fetch_sub_explicit(&nv->nslabs, 1, memory_order_relaxed);
                free(s);
            } else {
                s->next = keep;
                keep = s;
                result = HM_ERROR_DRIVER;
            }
        }
        hm__mutex_lock(&nv->lock);
        for (nv_slab_t *s = keep, *next; s; s = next) {
            next = s->next;
            s->all_prev = NULL;
            s->all_next = nv->all_slabs;
            if (nv->all_slabs) nv->all_slabs->all_prev = s;
            nv->all_slabs = s;
            s->next = nv->retained;
            nv->retained = s;
            atomic_fetch_add_explicit(&nv->kept, s->span, memory_order_relaxed);
        }
        hm__mutex_unlock(&nv->lock);
    } else {
        /* Cannot free: purge (the provider's own choice of force or lazy). */
        for (nv_slab_t *s = ret; s; s = s->next) {
            purge_range(nv, s->base, s->span);
            s->hw = 0; /* no word is backed now */
        }
        hm__mutex_lock(&nv->lock);
        if (ret) {
            nv_slab_t *tail = ret;
            while (tail->next) tail = tail->next;
            tail->next = nv->retained;
            nv->retained = ret;
        }
        hm__mutex_unlock(&nv->lock);
    }
    /* The large cache. */
    hm__mutex_lock(&nv->large_lock);
    nv_lentry_t *cache = nv->lcache;
    size_t n = nv->lcache_len;
    if (nv->can_free) {
        nv->lcache = NULL;
        nv->lcache_len = nv->lcache_cap = 0;
        for (size_t i = 0; i < n; i++)
            atomic_fetch_sub_explicit(&nv->kept, cache[i].size, memory_order_relaxed);
    } else {
        for (size_t i = 0; i < n; i++) purge_range(nv, cache[i].base, cache[i].size);
    }
    hm__mutex_unlock(&nv->large_lock);
    if (nv->can_free) {
        for (size_t i = 0; i < n; i++) {
            if (hm_pool_provider_free(nv->pool, (void *)cache[i].base, cache[i].size) ==
                HM_SUCCESS) {
                atomic_fetch_sub_explicit(&nv->held, cache[i].size, memory_order_relaxed);
                atomic_fetch_sub_explicit(&nv->nranges, 1, memory_order_relaxed);
            } else {
                hm__mutex_lock(&nv->large_lock);
                lcache_push(nv, cache[i].base, cache[i].size);
                hm__mutex_unlock(&nv->large_lock);
                result = HM_ERROR_DRIVER;
            }
        }
        free(cache);
    }
    return result;
}

static hm_result_t nv_get_stats(void *state, hm_pool_stats_t *st) {
    nv_pool_t *nv = state;
    int64_t bytes = 0;
    uint64_t pub = 0, drained = 0;
    hm__mutex_lock(&nv->lock);
    for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
        bytes += atomic_load_explicit(&h->st_bytes, memory_order_relaxed);
        /* Blocks in the heap's class words are free (nv_heap.st_bytes). */
        for (unsigned c = 0; c < nv->ncls; c++) {
            uint64_t b = cl_bits(&h->cls[c]);
            /* The class size from the table: the owner sets up cls[c].bsize
             * at its first refill of the class (nv_cls). */
            if (b) bytes -= (int64_t)popcount64(b) * hm__nv_cls_size[c];
            bytes -= (int64_t)stk_count(stk_top(&h->cls[c])) * hm__nv_cls_size[c]; /* free */
        }
        pub += atomic_load_explicit(&h->st_published, memory_order_relaxed);
        drained += atomic_load_explicit(&h->st_drained, memory_order_relaxed);
    }
    hm__mutex_unlock(&nv->lock);
    bytes += (int64_t)atomic_load_explicit(&nv->large_live, memory_order_relaxed);
    st->bytes_requested = bytes > 0 ? (size_t)bytes : 0;
    st->bytes_from_provider = atomic_load_explicit(&nv->held, memory_order_relaxed);
    st->provider_allocs = atomic_load_explicit(&nv->nranges, memory_order_relaxed);
    st->slabs = atomic_load_explicit(&nv->nslabs, memory_order_relaxed);
    st->remote_frees_published = pub;
    st->remote_frees_drained = drained;
    return HM_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Init and fini                                                            */

static hm_result_t resolve_params(nv_pool_t *nv, hm_provider_t *prov,
                                  const hm_native_params_t *p) {
    hm_native_params_t dflt = {.magic = NV_PARAMS_MAGIC, .batch = NV_BATCH_CAP};
    if (!p) p = &dflt;
    if (p->magic != NV_PARAMS_MAGIC) {
        HM_LOG_ERROR("native pool: params is not a hm_native_params_t");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    uint32_t caps = hm_provider_caps(prov);
    size_t page = hm_provider_min_page_size(prov);
    if (!page) page = 1;
    if (!hm_is_pow2(page)) {
        HM_LOG_ERROR("native pool: provider '%s' page size %zu is not a power of two",
                     hm_provider_name(prov), page);
        return HM_ERROR_NOT_SUPPORTED;
    }
    hm_native_defaults_t d = p->defaults;
    if (d == HM_NATIVE_DEFAULTS_AUTO)
        d = (hm_provider_memory_kind(prov) == HM_MEMORY_DEVICE ||
             !(caps & HM_PROVIDER_CAP_CPU_ACCESS))
                ? HM_NATIVE_DEFAULTS_DEVICE
                : HM_NATIVE_DEFAULTS_HOST;
    int dev = d == HM_NATIVE_DEFAULTS_DEVICE;
    /* Host: 64 KiB slabs. Device: the provider's recommended page (its
     * mapping granularity, e.g. 2 MiB on GPUs), at least 64 KiB. */
    size_t slab = (size_t)64 << 10;
    if (p->set & SET_SLAB) {
        slab = p->slab_size;
        if (slab < page) {
            HM_LOG_ERROR("native pool: slab size %zu is below provider '%s' page size %zu", slab,
                         hm_provider_name(prov), page);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    } else {
        if (slab < page) slab = page;
        size_t rec = hm_provider_recommended_page_size(prov);
        if (dev && hm_is_pow2(rec) && rec > slab && rec <= NV_SLAB_MAX) slab = rec;
    }
    if (slab > NV_SLAB_MAX) {
        HM_LOG_ERROR("native pool: slab size %zu exceeds 64 MiB", slab);
        return HM_ERROR_NOT_SUPPORTED;
    }
    size_t limit = (size_t)32 << 10;
    if (dev && slab / 8 > limit) limit = slab / 8 < NV_CLASS_LIMIT_MAX ? slab / 8 : NV_CLASS_LIMIT_MAX;
    if (p->set & SET_LIMIT) limit = p->class_limit;
    nv->ncls = cls_of(limit) + 1;
    nv->class_limit = hm__nv_cls_size[nv->ncls - 1];
    nv->fast_limit = nv->class_limit < NV_FAST_MAX ? nv->class_limit : NV_FAST_MAX;
    size_t large = (p->set & SET_LARGE) ? p->large_threshold
                                        : dev ? ((size_t)256 << 20) : ((size_t)32 << 20);
    if (large < nv->class_limit) {
        HM_LOG_ERROR("native pool: large threshold %zu is below the size-class limit %zu", large,
                     nv->class_limit);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    nv->page = page;
    nv->slab_size = slab;
    nv->shift = (unsigned)__builtin_ctzll(slab);
    nv->large_threshold = large;
    nv->retained_max = (p->set & SET_RETAINED) ? p->retained
                                                : dev ? ((size_t)64 << 20) : ((size_t)8 << 20);
    nv->queue = p->queue;
    nv->batch_cap = p->batch ? p->batch : NV_BATCH_CAP;
    nv->can_free = caps & HM_PROVIDER_CAP_FREE;
    nv->can_purge_lazy = caps & HM_PROVIDER_CAP_PURGE_LAZY;
    nv->can_purge_force = caps & HM_PROVIDER_CAP_PURGE_FORCE;
    hm_memory_kind_t kind = hm_provider_memory_kind(prov);
    nv->prefetch = (caps & HM_PROVIDER_CAP_CPU_ACCESS) &&
                   (kind == HM_MEMORY_HOST || kind == HM_MEMORY_HOST_PINNED);
    for (unsigned c = 0; c < nv->ncls; c++) {
        size_t want = (size_t)hm__nv_cls_size[c] * NV_MIN_BLOCKS;
        nv->cls_span[c] = want <= slab ? slab : hm_align_up(want, slab);
    }
    return HM_SUCCESS;
}

static void nv_fini(void *state) {
    nv_pool_t *nv = state;
    hm__mutex_lock(&g_lock);
    for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
        if (h->binding) atomic_store_explicit(&h->binding->heap, NULL, memory_order_release);
        h->binding = NULL;
    }
    for (nv_pool_t **pp = &g_pools; *pp; pp = &(*pp)->g_next) {
        if (*pp == nv) {
            *pp = nv->g_next;
            break;
        }
    }
    hm__mutex_unlock(&g_lock);
    if (tl.id == nv->id) {
        tl.id = 0;
        tl.heap = NULL;
    }

    hm_pool_stats_t st;
    nv_get_stats(nv, &st);
    if (st.bytes_requested)
        HM_LOG_WARN("native pool destroyed with %zu bytes still allocated; %s",
                    st.bytes_requested,
                    nv->can_free ? "returned to the provider" : "kept by the provider");
    /* Heaps and batches (queued, stocked or in the depot) go with the
     * metadata mappings (meta_fini, last). */
    for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
        pthread_mutex_destroy(&h->mq_lock);
        (void)hm__prim_unmap(h->stk_map, stk_map_size(nv));
    }
    if (!nv->orphan_ready) (void)hm__prim_unmap(nv->orphan_stk, stk_map_size(nv));
    for (nv_slab_t *s = nv->all_slabs, *n; s; s = n) {
        n = s->all_next;
        if (nv->can_free) hm_pool_provider_free(nv->pool, (void *)s->base, s->span);
        free(s);
    }
    if (nv->can_free) {
        for (size_t i = 0; i < nv->live.cap; i++)
            if (nv->live.e[i].base)
                hm_pool_provider_free(nv->pool, (void *)nv->live.e[i].base, nv->live.e[i].size);
        for (size_t i = 0; i < nv->lcache_len; i++)
            hm_pool_provider_free(nv->pool, (void *)nv->lcache[i].base, nv->lcache[i].size);
    }
    free(nv->live.e);
    free(nv->lcache);
    map_fini(nv);
    meta_fini(nv);
    pthread_mutex_destroy(&nv->lock);
    pthread_mutex_destroy(&nv->large_lock);
    pthread_mutex_destroy(&nv->depot_lock);
    pthread_mutex_destroy(&nv->orphan_lock);
    free(nv);
}

static hm_result_t nv_init(hm_pool_t *pool, const void *params, void **state) {
    pthread_once(&g_once, global_init);
    hm_provider_t *prov = hm_pool_get_provider(pool);
    nv_pool_t *nv = aligned_alloc(HM_CACHE_LINE, hm_align_up(sizeof(*nv), HM_CACHE_LINE));
    if (!nv) return HM_ERROR_OUT_OF_HOST_MEMORY;
    memset(nv, 0, sizeof(*nv));
    nv->pool = pool;
    for (unsigned i = 0; i < NV_BY_TP; i++) atomic_init(&nv->by_tp[i], &by_tp_nobody);
    atomic_init(&nv->own, &by_tp_nobody);
    hm_result_t r = resolve_params(nv, prov, params);
    if (r != HM_SUCCESS) {
        free(nv);
        return r;
    }
    nv->id = atomic_fetch_add_explicit(&g_next_id, 1, memory_order_relaxed);
    pthread_mutex_init(&nv->lock, NULL);
    pthread_mutex_init(&nv->large_lock, NULL);
    pthread_mutex_init(&nv->depot_lock, NULL);
    pthread_mutex_init(&nv->orphan_lock, NULL);
    if (map_init(nv) != HM_SUCCESS || !(nv->orphan = heap_carve(nv, META_TOP, &nv->orphan_stk))) {
        map_fini(nv);
        meta_fini(nv);
        pthread_mutex_destroy(&nv->lock);
        pthread_mutex_destroy(&nv->large_lock);
        pthread_mutex_destroy(&nv->depot_lock);
        pthread_mutex_destroy(&nv->orphan_lock);
        free(nv);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    hm__mutex_lock(&g_lock);
    nv->g_next = g_pools;
    g_pools = nv;
    hm__mutex_unlock(&g_lock);
    HM_LOG_DEBUG("native pool over '%s': slab %zu, classes up to %zu, large threshold %zu, "
                 "retained %zu, %s queue, batch %u",
                 hm_provider_name(prov), nv->slab_size, nv->class_limit, nv->large_threshold,
                 nv->retained_max, nv->queue == HM_NATIVE_QUEUE_WFCQ ? "wfcq" : "mutex",
                 nv->batch_cap);
    *state = nv;
    hm__pool_set_entries(pool, nv_malloc_entry, nv->prefetch ? nv_free_entry_host : nv_free_entry);
    return HM_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Fork: hold every lock across fork(); in the child, re-make them and       */
/* abandon the heaps of threads that do not exist there. The NATIVE slot of */
/* the fork list (fork.h): prepare after the call_rcu pause, before IPC and  */
/* the tracker; parent and child in reverse.                                 */

void hm__native_atfork_prepare(void) {
    hm__mutex_lock(&g_lock);
    for (nv_pool_t *nv = g_pools; nv; nv = nv->g_next) {
        hm__mutex_lock(&nv->orphan_lock);
        hm__mutex_lock(&nv->lock);
        hm__mutex_lock(&nv->large_lock);
        hm__mutex_lock(&nv->depot_lock);
        for (nv_heap_t *h = nv->heaps; h; h = h->all_next) hm__mutex_lock(&h->mq_lock);
    }
}

void hm__native_atfork_parent(void) {
    for (nv_pool_t *nv = g_pools; nv; nv = nv->g_next) {
        for (nv_heap_t *h = nv->heaps; h; h = h->all_next) hm__mutex_unlock(&h->mq_lock);
        hm__mutex_unlock(&nv->depot_lock);
        hm__mutex_unlock(&nv->large_lock);
        hm__mutex_unlock(&nv->lock);
        hm__mutex_unlock(&nv->orphan_lock);
    }
    hm__mutex_unlock(&g_lock);
}

/* The child unlocks, as the parent does: the forking thread owns every lock
 * there (prepare took them), and unlike re-initialising, unlocking keeps
 * TSan's lock graph right (init.c runs this between the tracker's two
 * child parts, after the call_rcu mutex was taken in prepare). */
void hm__native_atfork_child(void) {
    for (nv_pool_t *nv = g_pools; nv; nv = nv->g_next) {
        for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
            hm__mutex_unlock(&h->mq_lock);
            if (!h->binding) continue;
            int mine = 0;
            for (nv_binding_t *b = tl.bindings; b; b = b->next) mine |= b == h->binding;
            if (mine) continue;
            /* Its thread is gone: the binding stays unreachable (a small,
             * deliberate leak); the heap is adopted like any other. (A
             * thread caught inside an allocation at fork() leaves its heap
             * as it was; blocks in its outgoing batches stay there until the
             * heap is adopted and flushes them.) */
            h->binding = NULL;
            atomic_store_explicit(&h->tp, 0, memory_order_relaxed);
            h->aband_next = nv->abandoned;
            nv->abandoned = h;
        }
        hm__mutex_unlock(&nv->depot_lock);
        hm__mutex_unlock(&nv->large_lock);
        hm__mutex_unlock(&nv->lock);
        hm__mutex_unlock(&nv->orphan_lock);
    }
    hm__mutex_unlock(&g_lock);
}

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
    .flags = HM_POOL_OPS_VALIDATES_POINTERS,
};

const hm_pool_ops_t *hm_native_pool_ops(void) { return &native_ops; }

hm_result_t hm_native_pool_create(hm_provider_t *provider, const hm_native_params_t *params,
                                  uint32_t flags, hm_pool_t **pool) {
    return hm_pool_create(&native_ops, provider, params, flags, pool);
}
