/* hetmem — pools: fine allocations carved out of a provider.
 * SPDX-License-Identifier: MIT */
#ifndef HETMEM_POOL_H
#define HETMEM_POOL_H

#include <hetmem/base.h>
#include <hetmem/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_pool hm_pool_t;

/* Thread safety: every call is thread-safe, except that hm_pool_destroy()
 * must not race with other calls on the same pool (or on pointers of it).
 *
 * Fork: the child inherits every pool and provider as the forking thread saw
 * them; hetmem's locks are taken around fork() and re-made in the child. The
 * child may keep using inherited pools (from any thread it creates) or
 * destroy them. Private memory is copy-on-write as usual; memory of
 * shared-mode providers (HM_OS_SHARED) stays shared with the parent, so
 * parent and child must not both free the same allocation. */

/* hm_pool_create() flags. */
enum {
    /* The pool destroys its provider in hm_pool_destroy(). */
    HM_POOL_FLAG_OWN_PROVIDER = 1u << 0,
    /* Do not record the pool's provider ranges in the tracker. Trade-off:
     * allocation is a little cheaper, but hm_free(), hm_pool_by_ptr(),
     * hm_allocation_info() and IPC export do not know this pool's memory, and
     * hm_pool_free() cannot reject foreign pointers; leaked memory is not
     * reclaimed at destroy. */
    HM_POOL_FLAG_NO_TRACKING = 1u << 1,
};

/* Statistics of a pool (fields a pool does not keep are 0; for a tracked
 * pool the front-end fills bytes_from_provider and provider_allocs from the
 * tracker when the pool does not). Exact while no thread is inside a call
 * on the pool, approximate while one is. */
typedef struct hm_pool_stats {
    /* Bytes of the blocks users hold now (allocated and not yet freed), each
     * counted at its usable size (hm_pool_malloc_usable_size). Freed blocks
     * a pool keeps for reuse (in thread caches, free lists) are not
     * counted: with every block freed it is 0, with no trim. */
    size_t bytes_requested;
    size_t bytes_from_provider; /* bytes currently held from the provider */
    size_t provider_allocs;     /* live provider allocations */
    size_t slabs;               /* slabs (runs of blocks of one size) held now */
    /* Frees of a block by a thread other than the one whose heap owns it,
     * queued for the owner and taken in by it, since the pool was made
     * (pools whose remote frees go through such queues). */
    size_t remote_frees_published;
    size_t remote_frees_drained;
} hm_pool_stats_t;

#define HM_POOL_OPS_VERSION 1u

/* The pool interface. A pool gets its memory only through
 * hm_pool_provider_alloc()/free()/split()/merge() on the `pool` handle it is
 * given in init, so that the tracker knows every range. */
typedef struct hm_pool_ops {
    uint32_t version; /* HM_POOL_OPS_VERSION */
    const char *name;

    /* Required. */
    hm_result_t (*init)(hm_pool_t *pool, const void *params, void **state);
    void (*fini)(void *state);
    /* alignment 0: natural (at least 16 bytes where the pool can). size > 0. */
    hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr);
    hm_result_t (*free)(void *state, void *ptr);

    /* Optional. Without calloc the front-end does alloc + memset, or on
     * memory the CPU may not touch alloc + the provider's fill
     * (HM_PROVIDER_CAP_FILL). Without realloc, where usable_size exists, it
     * does alloc + memcpy + free, or alloc + the provider's copy + free
     * (HM_PROVIDER_CAP_COPY). A pool's own calloc or realloc over memory
     * the CPU may not touch must not touch it either: it zeroes and moves
     * bytes with hm_provider_fill/hm_provider_copy on its provider, or
     * answers HM_ERROR_NOT_SUPPORTED. */
    size_t (*usable_size)(void *state, const void *ptr);
    hm_result_t (*calloc)(void *state, size_t size, void **ptr);
    hm_result_t (*realloc)(void *state, void *ptr, size_t size, void **out);
    hm_result_t (*trim)(void *state);
    hm_result_t (*get_stats)(void *state, hm_pool_stats_t *stats);
    /* Optional: alloc(state, size, 0, &p) returning p itself, or NULL with
     * errno set as hm_pool_malloc() documents (ENOMEM, EINVAL, ...) and the
     * failure logged as alloc would. hm_pool_malloc() then tail-calls it:
     * no result code, out-parameter or stack frame between the caller and
     * the pool. size > 0. */
    void *(*malloc_fast)(void *state, size_t size);

    /* HM_POOL_OPS_* bits. */
    uint32_t flags;
} hm_pool_ops_t;

enum {
    /* The pool's free/usable_size/realloc refuse (HM_ERROR_INVALID_ARGUMENT)
     * every pointer they did not hand out, by their own metadata; the
     * front-end then skips its tracker check on those paths. */
    HM_POOL_OPS_VALIDATES_POINTERS = 1u << 0,
    /* The pool's alloc paths give back what the pool caches and try once
     * more when the provider is out of memory; the front-end then does not
     * do it again around them (see the malloc family below). */
    HM_POOL_OPS_RETRIES_OUT_OF_MEMORY = 1u << 1,
};

HM_API hm_result_t hm_pool_create(const hm_pool_ops_t *ops, hm_provider_t *provider,
                                  const void *params, uint32_t flags, hm_pool_t **pool);
/* Destroy. Allocations still live are reported (one log line, count and
 * bytes), forgotten by the tracker and returned to the provider where it can
 * free. Double destroy returns HM_ERROR_INVALID_ARGUMENT. Must not run
 * concurrently with other calls on the same pool. The pool is gone whatever
 * the result; HM_ERROR_DRIVER says that the provider refused to free a
 * range or to close an IPC mapping of the pool (logged, with the driver's
 * code in hm_last_native_error()): that memory may stay allocated or
 * mapped until the process ends. */
HM_API hm_result_t hm_pool_destroy(hm_pool_t *pool);

/* The malloc family: NULL and errno (ENOMEM, EINVAL; ENOTSUP where the pool
 * cannot use the memory, e.g. provider memory at addresses it does not
 * cover, or in a fork child a pool of a GPU provider) on failure.
 * hm_pool_malloc(pool, 0) returns NULL with errno EINVAL.
 * Out of memory: when the provider is out of memory, the pool gives back
 * the freed memory it caches (as hm_pool_trim does) and tries once more
 * before failing: memory a pool caches never makes an allocation fail
 * that the provider could serve after a trim. hetmem's pools do this
 * themselves; for a pool of one's own the front end does it around the
 * alloc op when the pool has a trim op and no HM_POOL_OPS_RETRIES_OUT_OF_MEMORY
 * (a malloc_fast op must do it itself). */
HM_API void *hm_pool_malloc(hm_pool_t *pool, size_t size);
HM_API void *hm_pool_calloc(hm_pool_t *pool, size_t num, size_t size);
HM_API void *hm_pool_realloc(hm_pool_t *pool, void *ptr, size_t size);
HM_API void *hm_pool_aligned_malloc(hm_pool_t *pool, size_t size, size_t alignment);
/* hm_pool_realloc(pool, NULL, n) is hm_pool_malloc(pool, n);
 * hm_pool_realloc(pool, p, 0) frees p and returns NULL. On failure p is
 * untouched and NULL is returned with errno set.
 * On memory the CPU may not touch (device memory), hm_pool_calloc zeroes
 * through the pool's calloc or the provider's fill, and hm_pool_realloc
 * moves bytes through the pool's realloc or the provider's copy; with
 * neither they fail with ENOTSUP. */

/* Free ptr (NULL is a no-op success). On a tracked pool a pointer that does
 * not belong to this pool returns HM_ERROR_INVALID_ARGUMENT and frees nothing. */
HM_API hm_result_t hm_pool_free(hm_pool_t *pool, void *ptr);
/* 0 for NULL, unknown pointers, or pools that cannot tell. */
HM_API size_t hm_pool_malloc_usable_size(hm_pool_t *pool, const void *ptr);
HM_API hm_result_t hm_pool_trim(hm_pool_t *pool);
HM_API hm_result_t hm_pool_get_stats(hm_pool_t *pool, hm_pool_stats_t *stats);
HM_API const char *hm_pool_name(const hm_pool_t *pool);
HM_API hm_provider_t *hm_pool_get_provider(const hm_pool_t *pool);
HM_API uint32_t hm_pool_flags(const hm_pool_t *pool);

/* --- Tracker-backed calls (any pool created without NO_TRACKING) --- */

/* Free ptr through whichever pool owns it. NULL: success, no-op. A pointer
 * hetmem does not know: HM_ERROR_INVALID_ARGUMENT, nothing freed. */
HM_API hm_result_t hm_free(void *ptr);
/* The pool that owns ptr (anywhere inside a provider range), or NULL. */
HM_API hm_pool_t *hm_pool_by_ptr(const void *ptr);

enum {
    HM_ALLOCATION_HOST_ACCESSIBLE = 1u << 0,
    HM_ALLOCATION_IMPORTED = 1u << 1, /* opened through IPC */
};

/* Untagged: a tag named like the function would shadow it in C++. */
typedef struct {
    hm_pool_t *pool;
    hm_provider_t *provider;
    void *base;       /* the provider allocation containing ptr */
    size_t size;
    uint64_t id;      /* unique in the process, never reused */
    hm_memory_kind_t kind;
    uint32_t flags;   /* HM_ALLOCATION_* */
} hm_allocation_info_t;

HM_API hm_result_t hm_allocation_info(const void *ptr, hm_allocation_info_t *info);

/* --- For pool implementations: provider memory, recorded in the tracker --- */
HM_API hm_result_t hm_pool_provider_alloc(hm_pool_t *pool, size_t size, size_t alignment,
                                          void **ptr);
/* Forget the range and free it to the provider. If the provider cannot free,
 * returns HM_ERROR_NOT_SUPPORTED and the range stays recorded. */
HM_API hm_result_t hm_pool_provider_free(hm_pool_t *pool, void *ptr, size_t size);
HM_API hm_result_t hm_pool_provider_split(hm_pool_t *pool, void *ptr, size_t total,
                                          size_t first);
HM_API hm_result_t hm_pool_provider_merge(hm_pool_t *pool, void *lo, void *hi, size_t total);
HM_API hm_result_t hm_pool_provider_purge(hm_pool_t *pool, void *ptr, size_t size, bool force);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_POOL_H */
