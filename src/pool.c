/* hetmem — the pool front-end: the ONLY caller of pool ops, and the place
 * where provider memory is recorded in the tracker.
 * SPDX-License-Identifier: MIT */
#include "pool_internal.h"
#include "ipc/ipc_internal.h"
#include "platform/prim.h"
#include "stream/stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void *malloc_via_fast(hm_pool_t *pool, size_t size);
static void *malloc_checked(hm_pool_t *pool, size_t size);
static hm_result_t free_via_op(hm_pool_t *pool, void *ptr);
static hm_result_t free_checked(hm_pool_t *pool, void *ptr);
static void *fork_malloc_entry(hm_pool_t *pool, size_t size);

/* A driver whose memory and calls do not survive fork() (CUDA: "CUDA does
 * not support fork", every call in the child failing; Level Zero's handles
 * are the parent's process's). */
static bool fork_bound_provider(const hm_provider_t *prov) {
    return prov->info.family == HM_PROVIDER_FAMILY_CUDA ||
           prov->info.family == HM_PROVIDER_FAMILY_LEVEL_ZERO;
}

/* A fork child's allocation from a pool over such a driver: refused, even
 * from blocks the pool still caches (they are the parent's device memory,
 * which no call of the child can use). Logged once per process. */
static HM_NOINLINE __attribute__((cold)) bool fork_refuses(hm_pool_t *pool) {
    if (hm_likely(hm__prim_fork_epoch() == pool->fork_epoch)) return false;
    static _Atomic unsigned logged_epoch;
    unsigned e = hm__prim_fork_epoch() + 1;
    if (atomic_exchange_explicit(&logged_epoch, e, memory_order_relaxed) != e)
        HM_LOG_ERROR("pool '%s': no allocation in a fork child from a pool of provider '%s' "
                     "(its driver does not work after fork; start a new process)",
                     pool->ops.name, pool->provider->info.name);
    return true;
}
static inline bool child_refuses(hm_pool_t *pool) {
    return hm_unlikely(pool->fork_bound) && fork_refuses(pool);
}

HM_RUN
hm_result_t hm_pool_create(const hm_pool_ops_t *ops, hm_provider_t *provider, const void *params,
                           uint32_t flags, hm_pool_t **out) {
    hm__init();
    if (!ops || !provider || !out) {
        HM_LOG_ERROR("hm_pool_create: %s is NULL", !ops ? "ops" : !provider ? "provider" : "pool");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (ops->version != HM_POOL_OPS_VERSION) {
        HM_LOG_ERROR("hm_pool_create: ops version %u, this library speaks %u", ops->version,
                     HM_POOL_OPS_VERSION);
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (!ops->init || !ops->fini || !ops->alloc || !ops->free) {
        HM_LOG_ERROR("hm_pool_create: '%s' lacks a required op (init, fini, alloc, free)",
                     ops->name ? ops->name : "?");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (flags & ~(uint32_t)(HM_POOL_FLAG_OWN_PROVIDER | HM_POOL_FLAG_NO_TRACKING)) {
        HM_LOG_ERROR("hm_pool_create: unknown flags 0x%x", flags);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!hm__provider_is_live(provider)) {
        HM_LOG_ERROR("hm_pool_create: %p is not a live provider", (void *)provider);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_pool_t *pool = aligned_alloc(HM_CACHE_LINE, sizeof(*pool));
    if (!pool) return HM_ERROR_OUT_OF_HOST_MEMORY;
    memset(pool, 0, sizeof(*pool));
    pool->ops = *ops;
    pool->alloc = ops->alloc;
    pool->free = ops->free;
    if (!pool->ops.name) pool->ops.name = "unnamed";
    pool->provider = provider;
    pool->flags = flags;
    pool->tracked = !(flags & HM_POOL_FLAG_NO_TRACKING);
    pool->check_owner = pool->tracked && !(ops->flags & HM_POOL_OPS_VALIDATES_POINTERS);
    pool->malloc_fast = ops->malloc_fast;
    pool->malloc_entry = ops->malloc_fast ? malloc_via_fast : malloc_checked;
    pool->base_free_entry = pool->check_owner ? free_checked : free_via_op;
    atomic_init(&pool->free_entry, pool->base_free_entry);
    pool->cpu_accessible = hm_provider_cpu_accessible(provider);
    pool->fork_bound = fork_bound_provider(provider);
    pool->fork_epoch = hm__prim_fork_epoch();
    hm__tracker_index_init(&pool->index);
    hm_result_t r = ops->init(pool, params, &pool->state);
    if (r != HM_SUCCESS) {
        HM_LOG_INFO("pool '%s' init failed: %s", ops->name ? ops->name : "?",
                    hm_result_string(r));
        goto fail_init;
    }
    if (pool->fork_bound) {
        pool->inner_malloc_entry = pool->malloc_entry;
        pool->malloc_entry = fork_malloc_entry;
    }
    if (!hm__handle_register(pool, HM_HANDLE_POOL)) {
        r = HM_ERROR_OUT_OF_HOST_MEMORY;
        goto fail_register;
    }
    *out = pool;
    return HM_SUCCESS;

fail_register:
    ops->fini(pool->state);
fail_init:
    hm__tracker_index_drain(&pool->index, NULL, NULL);
    hm__tracker_index_fini(&pool->index);
    free(pool);
    return r;
}

typedef struct leak_report {
    hm_pool_t *pool;
    size_t count, bytes, freed;
} leak_report_t;

static void reclaim_range(void *arg, const hm_tracker_entry_t *e) {
    leak_report_t *lr = arg;
    lr->count++;
    lr->bytes += e->size;
    if (e->flags & HM_TRACK_IMPORTED) return; /* the IPC layer closes its own mappings */
    hm_provider_t *prov = lr->pool->provider;
    if (hm__ipc_range_take(lr->pool, (void *)e->base, e->size)) return; /* an export holds it */
    if (!prov->ops.free) return;
    if (prov->ops.free(prov->state, (void *)e->base, e->size) == HM_SUCCESS) lr->freed++;
    else hm__pool_note_refused(lr->pool);
}

hm_result_t hm_pool_destroy(hm_pool_t *pool) {
    if (!pool) {
        HM_LOG_ERROR("hm_pool_destroy(NULL)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!hm__handle_unregister(pool, HM_HANDLE_POOL)) {
        HM_LOG_ERROR("hm_pool_destroy(%p): not a live pool (double destroy?)", (void *)pool);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    unsigned refused = atomic_load_explicit(&pool->refused, memory_order_relaxed);
    hm__stream_pool_destroy(pool); /* blocks pending on streams, once their work is done */
    hm__ipc_pool_destroy(pool); /* its cached exports and opened mappings */
    pool->ops.fini(pool->state);
    /* Whatever the pool did not give back is a leak: forget it, report it
     * once, and return it to the provider where it can free. */
    leak_report_t lr = {.pool = pool};
    hm__tracker_index_drain(&pool->index, reclaim_range, &lr);
    if (lr.count && pool->provider->ops.free)
        HM_LOG_WARN("pool '%s' destroyed with %zu provider ranges (%zu bytes) still allocated; "
                    "%zu returned to provider '%s'",
                    pool->ops.name, lr.count, lr.bytes, lr.freed, pool->provider->info.name);
    else if (lr.count) /* expected: the provider cannot take memory back */
        HM_LOG_INFO("pool '%s' destroyed holding %zu ranges (%zu bytes) of provider '%s', "
                    "which cannot free", pool->ops.name, lr.count, lr.bytes,
                    pool->provider->info.name);
    hm__tracker_index_fini(&pool->index);
    hm_result_t r = HM_SUCCESS;
    unsigned now = atomic_load_explicit(&pool->refused, memory_order_relaxed);
    if (now != refused) {
        HM_LOG_ERROR("pool '%s' destroyed, but provider '%s' refused %u frees or IPC closes "
                     "(logged above): that memory may stay allocated or mapped",
                     pool->ops.name, pool->provider->info.name, now - refused);
        r = HM_ERROR_DRIVER;
    }
    /* An owned provider whose ranges the IPC layer holds for exports goes
     * after their last put (importers still map those bytes). */
    if ((pool->flags & HM_POOL_FLAG_OWN_PROVIDER) && !hm__ipc_provider_defer(pool->provider)) {
        hm_result_t pr = hm_provider_destroy(pool->provider);
        if (r == HM_SUCCESS) r = pr;
    }
    free(pool);
    return r;
}

/* ---- the malloc family ---- */

/* Out of line: the success path of hm_pool_malloc needs no stack frame. */
static HM_NOINLINE __attribute__((cold)) void *fail_errno(hm_result_t r) {
    errno = hm__result_errno(r);
    return NULL;
}

HM_RUN
void *hm__malloc_via(hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr),
                     void *state, size_t size) {
    void *p;
    hm_result_t r = alloc(state, size, 0, &p);
    if (hm_unlikely(r != HM_SUCCESS)) return fail_errno(r);
    return p;
}

/* The pool's alloc op; where the provider is out of memory and the pool
 * can give back what it caches (trim), once more after the trim. hetmem's
 * own caching pools (native, jemalloc) do this inside their alloc paths
 * (HM_POOL_OPS_RETRIES_OUT_OF_MEMORY), and a user pool gets it here: device memory has no swap to fall back
 * on, so memory a pool caches must not make an allocation fail (PyTorch's
 * CUDA caching allocator frees its cached blocks and retries for the same
 * reason). */
static hm_result_t alloc_or_trim(hm_pool_t *pool, size_t size, size_t alignment, void **p) {
    hm_result_t r = pool->ops.alloc(pool->state, size, alignment, p);
    if (hm_likely(r != HM_ERROR_OUT_OF_MEMORY) || !pool->ops.trim ||
        (pool->ops.flags & HM_POOL_OPS_RETRIES_OUT_OF_MEMORY))
        return r;
    (void)pool->ops.trim(pool->state);
    return pool->ops.alloc(pool->state, size, alignment, p);
}

/* The entries (hm_pool.malloc_entry): pool is not NULL. */
HM_RUN static HM_NOINLINE void *malloc_checked(hm_pool_t *pool, size_t size) {
    if (hm_unlikely(!size)) return fail_errno(HM_ERROR_INVALID_ARGUMENT);
    void *p;
    hm_result_t r = alloc_or_trim(pool, size, 0, &p);
    if (hm_unlikely(r != HM_SUCCESS)) return fail_errno(r);
    return p;
}

static HM_NOINLINE void *fork_malloc_entry(hm_pool_t *pool, size_t size) {
    if (child_refuses(pool)) return fail_errno(HM_ERROR_NOT_SUPPORTED);
    return pool->inner_malloc_entry(pool, size);
}

HM_RUN static void *malloc_via_fast(hm_pool_t *pool, size_t size) {
    if (hm_likely(size)) return pool->malloc_fast(pool->state, size); /* a tail call */
    return fail_errno(HM_ERROR_INVALID_ARGUMENT);
}

static HM_NOINLINE __attribute__((cold)) void *malloc_null_pool(void) {
    HM_LOG_ERROR("hm_pool_malloc: pool is NULL");
    return fail_errno(HM_ERROR_INVALID_ARGUMENT);
}

HM_RUN void *hm_pool_malloc(hm_pool_t *pool, size_t size) {
    if (hm_likely(pool != NULL)) return pool->malloc_entry(pool, size); /* a tail call */
    return malloc_null_pool();
}

HM_RUN void *hm_pool_aligned_malloc(hm_pool_t *pool, size_t size, size_t alignment) {
    if (hm_unlikely(!pool || !size || !hm_is_pow2(alignment))) {
        if (!pool) HM_LOG_ERROR("hm_pool_aligned_malloc: pool is NULL");
        else if (size && !hm_is_pow2(alignment))
            HM_LOG_ERROR("hm_pool_aligned_malloc: alignment %zu is not a power of two",
                         alignment);
        return fail_errno(HM_ERROR_INVALID_ARGUMENT);
    }
    if (child_refuses(pool)) return fail_errno(HM_ERROR_NOT_SUPPORTED);
    void *p;
    hm_result_t r = alloc_or_trim(pool, size, alignment, &p);
    if (hm_unlikely(r != HM_SUCCESS)) return fail_errno(r);
    return p;
}

HM_RUN void *hm_pool_calloc(hm_pool_t *pool, size_t num, size_t size) {
    if (!pool) {
        HM_LOG_ERROR("hm_pool_calloc: pool is NULL");
        return fail_errno(HM_ERROR_INVALID_ARGUMENT);
    }
    size_t total;
    if (__builtin_mul_overflow(num, size, &total)) return fail_errno(HM_ERROR_OUT_OF_MEMORY);
    if (!total) return fail_errno(HM_ERROR_INVALID_ARGUMENT);
    if (child_refuses(pool)) return fail_errno(HM_ERROR_NOT_SUPPORTED);
    void *p = NULL;
    hm_result_t r;
    if (pool->ops.calloc) {
        r = pool->ops.calloc(pool->state, total, &p);
    } else if (pool->cpu_accessible) {
        r = alloc_or_trim(pool, total, 0, &p);
        if (r == HM_SUCCESS) memset(p, 0, total);
    } else if (pool->provider->ops.fill) {
        /* Memory the CPU may not touch: zeroed by the provider (its driver's
         * memset). */
        r = alloc_or_trim(pool, total, 0, &p);
        if (r == HM_SUCCESS) {
            r = hm_provider_fill(pool->provider, p, 0, total);
            if (r != HM_SUCCESS) {
                HM_LOG_ERROR("hm_pool_calloc(%s): provider '%s' could not zero %zu bytes: %s",
                             pool->ops.name, pool->provider->info.name, total,
                             hm_result_string(r));
                pool->ops.free(pool->state, p);
            }
        }
    } else {
        HM_LOG_ERROR("hm_pool_calloc(%s): memory is not CPU-accessible, and neither the pool "
                     "(calloc) nor provider '%s' (fill) can zero it", pool->ops.name,
                     pool->provider->info.name);
        r = HM_ERROR_NOT_SUPPORTED;
    }
    if (r != HM_SUCCESS) return fail_errno(r);
    return p;
}

/* Can the front end move a block's bytes: the CPU, or the provider's copy. */
static inline bool can_copy(const hm_pool_t *pool) {
    return pool->cpu_accessible || pool->provider->ops.copy;
}

/* n bytes of the pool's memory from src to dst (two blocks of the pool). */
static hm_result_t copy_block(hm_pool_t *pool, void *dst, const void *src, size_t n) {
    if (pool->cpu_accessible) {
        memcpy(dst, src, n);
        return HM_SUCCESS;
    }
    hm_result_t r = hm_provider_copy(pool->provider, dst, src, n);
    if (r != HM_SUCCESS)
        HM_LOG_ERROR("hm_pool_realloc(%s): provider '%s' could not copy %zu bytes: %s",
                     pool->ops.name, pool->provider->info.name, n, hm_result_string(r));
    return r;
}

static hm_result_t free_tracked(hm_pool_t *pool, void *ptr, const hm_tracker_entry_t *e);

/* hm_pool_realloc of a block whose bytes are exported with handles
 * outstanding: the pool's own realloc could free or reuse them, so the
 * data moves to a new block and the old one's free is deferred like any
 * free of it. */
static HM_NOINLINE void *realloc_held(hm_pool_t *pool, void *ptr, size_t size,
                                      const hm_tracker_entry_t *e) {
    size_t old = pool->ops.usable_size ? pool->ops.usable_size(pool->state, ptr) : 0;
    if (!old || !can_copy(pool)) {
        HM_LOG_ERROR("hm_pool_realloc(%s): %p is exported with handles outstanding and "
                     "cannot be moved here", pool->ops.name, ptr);
        return fail_errno(HM_ERROR_BUSY);
    }
    void *out = NULL;
    hm_result_t r = alloc_or_trim(pool, size, 0, &out);
    if (r != HM_SUCCESS) return fail_errno(r);
    r = copy_block(pool, out, ptr, old < size ? old : size);
    if (r != HM_SUCCESS) {
        pool->ops.free(pool->state, out);
        return fail_errno(r);
    }
    r = free_tracked(pool, ptr, e);
    if (r != HM_SUCCESS)
        HM_LOG_WARN("hm_pool_realloc(%s): the free of the old block %p failed: %s",
                    pool->ops.name, ptr, hm_result_string(r));
    return out;
}

/* Is ptr one of this pool's? Tracked pools answer from the tracker; untracked
 * pools are trusted (documented trade-off of HM_POOL_FLAG_NO_TRACKING). */
static inline int owns(hm_pool_t *pool, const void *ptr) {
    return !pool->check_owner || hm__tracker_lookup_pool(ptr) == pool;
}

HM_RUN void *hm_pool_realloc(hm_pool_t *pool, void *ptr, size_t size) {
    if (!pool) {
        HM_LOG_ERROR("hm_pool_realloc: pool is NULL");
        return fail_errno(HM_ERROR_INVALID_ARGUMENT);
    }
    if (!ptr) return hm_pool_malloc(pool, size);
    if (!owns(pool, ptr) || ((pool->ops.flags & HM_POOL_OPS_VALIDATES_POINTERS) &&
                             pool->ops.usable_size && !pool->ops.usable_size(pool->state, ptr))) {
        HM_LOG_ERROR("hm_pool_realloc(%s): %p does not belong to this pool", pool->ops.name, ptr);
        return fail_errno(HM_ERROR_INVALID_ARGUMENT);
    }
    if (!size) { /* documented: frees ptr and returns NULL */
        hm_pool_free(pool, ptr);
        return NULL;
    }
    if (child_refuses(pool)) return fail_errno(HM_ERROR_NOT_SUPPORTED);
    void *out = NULL;
    hm_result_t r;
    hm_tracker_entry_t e;
    if (hm_unlikely(hm__pool_maybe_held(pool, ptr)) && pool->tracked &&
        hm__tracker_lookup(ptr, &e) && !(e.flags & HM_TRACK_IMPORTED) &&
        hm__ipc_is_held(pool, ptr, &e))
        return realloc_held(pool, ptr, size, &e);
    if (pool->ops.realloc) {
        r = pool->ops.realloc(pool->state, ptr, size, &out);
    } else if (can_copy(pool) && pool->ops.usable_size) {
        size_t old = pool->ops.usable_size(pool->state, ptr);
        if (!old) {
            HM_LOG_ERROR("hm_pool_realloc(%s): %p is not an allocation of this pool",
                         pool->ops.name, ptr);
            return fail_errno(HM_ERROR_INVALID_ARGUMENT);
        }
        if (old >= size && old / 2 <= size) return ptr; /* fits, not wastefully */
        r = alloc_or_trim(pool, size, 0, &out);
        if (r == HM_SUCCESS) {
            r = copy_block(pool, out, ptr, old < size ? old : size);
            pool->ops.free(pool->state, r == HM_SUCCESS ? ptr : out);
        }
    } else {
        HM_LOG_ERROR("hm_pool_realloc(%s): not supported on this memory (not CPU-accessible, "
                     "and the pool has no realloc%s)", pool->ops.name,
                     pool->ops.usable_size ? ", its provider no copy" : " nor usable_size");
        r = HM_ERROR_NOT_SUPPORTED;
    }
    if (r != HM_SUCCESS) return fail_errno(r); /* ptr untouched */
    return out;
}

/* A free of ptr, in the pool's tracked range *e, once the front end knows
 * it is not an opened mapping: deferred while the block holds an exported
 * pointer with handles outstanding (ipc.h: the bytes are not handed out
 * again before the last put), else the pool's free. */
/* A host-side free of a block that is pending on a stream (freed with
 * hm_pool_free_async): refused. */
static HM_NOINLINE bool stream_refuses(hm_pool_t *pool, const void *ptr) {
    if (!hm__stream_pending(pool, ptr)) return false;
    HM_LOG_ERROR("free of %p (pool '%s'): it is pending on a stream (freed with "
                 "hm_pool_free_async): double free", ptr, pool->ops.name);
    return true;
}

static hm_result_t free_tracked(hm_pool_t *pool, void *ptr, const hm_tracker_entry_t *e) {
    if (hm_unlikely(atomic_load_explicit(&pool->streams, memory_order_relaxed) != NULL) &&
        stream_refuses(pool, ptr))
        return HM_ERROR_DOUBLE_FREE;
    if (hm_unlikely(atomic_load_explicit(&pool->ipc, memory_order_relaxed) != NULL)) {
        bool done;
        hm_result_t r = hm__ipc_free_held(pool, ptr, e, &done);
        if (done) return r;
    }
    return pool->free(pool->state, ptr);
}

/* The entries (hm_pool.free_entry): pool is not NULL. free_checked: the
 * front end checks what ptr is (a tracked pool that does not validate
 * pointers, or a pool while it has exports with handles outstanding). */
static HM_NOINLINE hm_result_t free_checked(hm_pool_t *pool, void *ptr) {
    if (hm_unlikely(!ptr)) return HM_SUCCESS;
    if (hm_unlikely(!pool->tracked)) return pool->free(pool->state, ptr);
    hm_tracker_entry_t e;
    if (hm_unlikely(!hm__tracker_lookup(ptr, &e) || e.pool != pool)) {
        if (!pool->check_owner) return pool->free(pool->state, ptr); /* it refuses, and says why */
        HM_LOG_ERROR("hm_pool_free(%s): %p does not belong to this pool (foreign pointer or "
                     "double free)", pool->ops.name, ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_unlikely(e.flags & HM_TRACK_IMPORTED)) return hm__ipc_refuse_free(ptr);
    return free_tracked(pool, ptr, &e);
}

/* The pool checks pointers itself (or is untracked) and holds no IPC
 * mapping that ptr could be. */
HM_RUN static hm_result_t free_via_op(hm_pool_t *pool, void *ptr) {
    if (hm_likely(ptr != NULL)) return pool->free(pool->state, ptr); /* a tail call */
    return HM_SUCCESS;
}

HM_RUN
void hm__pool_set_entries(hm_pool_t *pool, hm_pool_malloc_entry_t m, hm_pool_free_entry_t f) {
    pool->malloc_entry = m;
    if (pool->check_owner) return;
    pool->base_free_entry = f;
    atomic_store_explicit(&pool->free_entry, f, memory_order_relaxed);
}

/* The free entry while exports of the pool are held or blocks are pending
 * on streams: a pending block is refused; a pointer outside every held
 * range (most) goes to the pool's usual entry at once. */
static HM_NOINLINE hm_result_t free_held(hm_pool_t *pool, void *ptr) {
    if (hm_unlikely(ptr && atomic_load_explicit(&pool->streams, memory_order_relaxed) &&
                    stream_refuses(pool, ptr)))
        return HM_ERROR_DOUBLE_FREE;
    if (hm_likely(!hm__pool_maybe_held(pool, ptr))) return pool->base_free_entry(pool, ptr);
    return free_checked(pool, ptr);
}

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;

void hm__pool_hold_atfork(int phase) {
    if (phase == 0) hm__mutex_lock(&hold_lock);
    else hm__mutex_unlock(&hold_lock);
}

void hm__pool_hold_frees(hm_pool_t *pool, bool on) {
    hm__mutex_lock(&hold_lock);
    pool->holders = on ? pool->holders + 1 : pool->holders - 1;
    atomic_store_explicit(&pool->free_entry, pool->holders ? free_held : pool->base_free_entry,
                          memory_order_relaxed);
    hm__mutex_unlock(&hold_lock);
}

HM_NOINLINE __attribute__((cold)) hm_result_t hm__pool_refuse_free(hm_pool_t *pool,
                                                                   const void *ptr,
                                                                   const char *call,
                                                                   const char *why) {
    hm_tracker_entry_t e;
    if (ptr && hm__tracker_lookup(ptr, &e) && (e.flags & HM_TRACK_IMPORTED))
        return hm__ipc_refuse_free(ptr);
    HM_LOG_ERROR("%s pool: %s(%p): %s", hm_pool_name(pool), call, ptr, why);
    return HM_ERROR_INVALID_ARGUMENT;
}

static HM_NOINLINE __attribute__((cold)) hm_result_t free_null_pool(void) {
    HM_LOG_ERROR("hm_pool_free: pool is NULL");
    return HM_ERROR_INVALID_ARGUMENT;
}

HM_RUN hm_result_t hm_pool_free(hm_pool_t *pool, void *ptr) {
    if (hm_likely(pool != NULL)) /* a tail call */
        return atomic_load_explicit(&pool->free_entry, memory_order_relaxed)(pool, ptr);
    return free_null_pool();
}

HM_RUN size_t hm_pool_malloc_usable_size(hm_pool_t *pool, const void *ptr) {
    if (!pool || !ptr || !pool->ops.usable_size || !owns(pool, ptr)) return 0;
    return pool->ops.usable_size(pool->state, ptr);
}

hm_result_t hm_pool_trim(hm_pool_t *pool) {
    if (!pool) return HM_ERROR_INVALID_ARGUMENT;
    hm__stream_pool_trim(pool); /* blocks pending on streams, once their work is done */
    if (!pool->ops.trim) return HM_ERROR_NOT_SUPPORTED;
    return pool->ops.trim(pool->state);
}

hm_result_t hm_pool_get_stats(hm_pool_t *pool, hm_pool_stats_t *stats) {
    if (!pool || !stats) return HM_ERROR_INVALID_ARGUMENT;
    memset(stats, 0, sizeof(*stats));
    if (pool->ops.get_stats) {
        hm_result_t r = pool->ops.get_stats(pool->state, stats);
        if (r != HM_SUCCESS) return r;
    }
    if (pool->tracked && !stats->bytes_from_provider) {
        hm__mutex_lock(&pool->index.lock);
        stats->bytes_from_provider = pool->index.bytes;
        stats->provider_allocs = pool->index.count;
        hm__mutex_unlock(&pool->index.lock);
    }
    return HM_SUCCESS;
}

const char *hm_pool_name(const hm_pool_t *pool) {
    return pool ? (pool->ops.name ? pool->ops.name : "unnamed") : "(null)";
}
HM_RUN
hm_provider_t *hm_pool_get_provider(const hm_pool_t *pool) { return pool ? pool->provider : NULL; }
uint32_t hm_pool_flags(const hm_pool_t *pool) { return pool ? pool->flags : 0; }

/* ---- tracker-backed public calls ---- */

HM_RUN hm_result_t hm_free(void *ptr) {
    if (!ptr) return HM_SUCCESS;
    hm_tracker_entry_t e;
    if (hm_unlikely(!hm__tracker_lookup(ptr, &e))) {
        HM_LOG_ERROR("hm_free(%p): not memory hetmem knows (foreign pointer, untracked pool, or "
                     "already freed)", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_unlikely(e.flags & HM_TRACK_IMPORTED)) return hm__ipc_refuse_free(ptr);
    return free_tracked(e.pool, ptr, &e);
}

HM_RUN hm_pool_t *hm_pool_by_ptr(const void *ptr) {
    if (!ptr) return NULL;
    return hm__tracker_lookup_pool(ptr);
}

hm_result_t hm_allocation_info(const void *ptr, hm_allocation_info_t *info) {
    if (!ptr || !info) {
        HM_LOG_ERROR("hm_allocation_info: %s is NULL", !ptr ? "ptr" : "info");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_tracker_entry_t e;
    if (!hm__tracker_lookup(ptr, &e)) return HM_ERROR_NOT_FOUND;
    info->pool = e.pool;
    info->provider = e.provider;
    info->base = (void *)e.base;
    info->size = e.size;
    info->id = e.id;
    info->kind = e.provider ? e.provider->info.kind : HM_MEMORY_HOST;
    info->flags = e.flags;
    return HM_SUCCESS;
}

/* ---- provider memory for pool implementations ---- */

static uint32_t track_flags(const hm_pool_t *pool) {
    return pool->cpu_accessible ? HM_TRACK_HOST_ACCESSIBLE : 0;
}

HM_RUN
hm_result_t hm_pool_provider_alloc(hm_pool_t *pool, size_t size, size_t alignment, void **ptr) {
    if (hm_unlikely(!pool)) return HM_ERROR_INVALID_ARGUMENT;
    hm_result_t r = hm_provider_alloc(pool->provider, size, alignment, ptr);
    if (r != HM_SUCCESS || !pool->tracked) return r;
    r = hm__tracker_insert(&pool->index, pool, pool->provider, (uintptr_t)*ptr, size,
                           track_flags(pool), NULL);
    if (hm_unlikely(r != HM_SUCCESS)) {
        if (pool->provider->ops.free) pool->provider->ops.free(pool->provider->state, *ptr, size);
        *ptr = NULL;
    }
    return r;
}

HM_RUN hm_result_t hm_pool_provider_free(hm_pool_t *pool, void *ptr, size_t size) {
    if (hm_unlikely(!pool || !ptr || !size)) return HM_ERROR_INVALID_ARGUMENT;
    hm_provider_t *prov = pool->provider;
    if (!prov->ops.free) return HM_ERROR_NOT_SUPPORTED;
    if (pool->tracked) {
        hm_result_t r = hm__tracker_remove((uintptr_t)ptr, size);
        if (r != HM_SUCCESS) {
            HM_LOG_ERROR("hm_pool_provider_free(%s): [%p, +%zu) is not a range of this pool",
                         pool->ops.name, ptr, size);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    }
    /* Exported: the export gives the range back, at its last put if gets
     * are outstanding, after its provider put if it is unused. */
    if (hm_unlikely(hm__ipc_range_take(pool, ptr, size))) return HM_SUCCESS;
    if (hm_unlikely(hm__ipc_range_release(pool, ptr, size))) return HM_SUCCESS;
    hm_result_t r = prov->ops.free(prov->state, ptr, size);
    if (r != HM_SUCCESS) hm__pool_note_refused(pool);
    if (r != HM_SUCCESS && pool->tracked) {
        /* Still allocated: keep knowing it. */
        if (hm__tracker_insert(&pool->index, pool, prov, (uintptr_t)ptr, size, track_flags(pool),
                               NULL) != HM_SUCCESS)
            HM_LOG_ERROR("lost track of [%p, +%zu) after a failed free", ptr, size);
    }
    return r;
}

hm_result_t hm_pool_provider_split(hm_pool_t *pool, void *ptr, size_t total, size_t first) {
    if (hm_unlikely(!pool)) return HM_ERROR_INVALID_ARGUMENT;
    if (hm_unlikely(hm__ipc_range_busy(pool, ptr))) return HM_ERROR_BUSY; /* exported */
    hm_result_t r = hm_provider_split(pool->provider, ptr, total, first);
    if (r != HM_SUCCESS || !pool->tracked) return r;
    r = hm__tracker_split((uintptr_t)ptr, total, first);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("tracker split of [%p, +%zu) at %zu failed: %s", ptr, total, first,
                     hm_result_string(r));
        hm_provider_merge(pool->provider, ptr, (char *)ptr + first, total); /* undo */
    }
    return r;
}

hm_result_t hm_pool_provider_merge(hm_pool_t *pool, void *lo, void *hi, size_t total) {
    if (hm_unlikely(!pool)) return HM_ERROR_INVALID_ARGUMENT;
    if (hm_unlikely(hm__ipc_range_busy(pool, lo) || hm__ipc_range_busy(pool, hi)))
        return HM_ERROR_BUSY; /* exported */
    hm_result_t r = hm_provider_merge(pool->provider, lo, hi, total);
    if (r != HM_SUCCESS || !pool->tracked) return r;
    r = hm__tracker_merge((uintptr_t)lo, (uintptr_t)hi, total);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("tracker merge of [%p, %p, +%zu) failed: %s", lo, hi, total,
                     hm_result_string(r));
        hm_provider_split(pool->provider, lo, total, (size_t)((char *)hi - (char *)lo));
    }
    return r;
}

hm_result_t hm_pool_provider_purge(hm_pool_t *pool, void *ptr, size_t size, bool force) {
    if (hm_unlikely(!pool)) return HM_ERROR_INVALID_ARGUMENT;
    return force ? hm_provider_purge_force(pool->provider, ptr, size)
                 : hm_provider_purge_lazy(pool->provider, ptr, size);
}
