/* hetmem — libhetmem_proxy.so: the process's malloc family served by a
 * native pool over the OS provider. SPDX-License-Identifier: MIT
 *
 *   LD_PRELOAD=libhetmem_proxy.so program ...
 *   HM_PROXY=shared[,tracked]   options, comma-separated:
 *     shared    the OS provider in shared (memfd) mode, so the heap can be
 *               exported through IPC (implies tracked)
 *     tracked   record the heap's ranges in the tracker (hm_pool_by_ptr,
 *               hm_allocation_info work on malloc'ed pointers); off by default
 *
 * Safety:
 * - Recursion: hetmem itself (its init, the tracker, liburcu, the pool's
 *   metadata) calls malloc. A thread-local guard is set around every call
 *   into the pool and around initialisation; a malloc-family call made while
 *   it is set goes to glibc (__libc_malloc and friends). So does every call
 *   until the pool exists, and any call on a thread that meets another
 *   thread's initialisation in progress.
 * - Foreign pointers: free/realloc/malloc_usable_size first ask the pool
 *   whether the pointer is one of its blocks (page map, then large map); any
 *   other pointer (allocated before the takeover, by the guard path, or by
 *   libc functions called through dlsym) goes back to glibc.
 * - Fork: the native pool and the tracker hold their locks across fork().
 *   With HM_PROXY=shared the heap's pages stay shared with a forked child,
 *   so in the child the pool is left alone: new allocations come from glibc
 *   and frees of the parent's blocks are ignored. The child's writes to
 *   blocks it inherited are still seen by the parent: programs whose forked
 *   children go on running (shells, $(...)) must not use HM_PROXY=shared
 *   (known limitation; making the child's copy private at fork is to do).
 * The pool is never destroyed (memory outlives every static destructor). */
#include "pool_internal.h"
#include "pools/native/native_internal.h"

#include <dlfcn.h>
#include <malloc.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define TLS_IE __thread __attribute__((tls_model("initial-exec")))

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

enum { ST_NONE = 0, ST_INIT = 1, ST_READY = 2, ST_FAILED = 3 };
static _Atomic int g_status;
static void *g_state; /* the native pool's state (immutable once READY) */
static size_t (*g_libc_usable)(void *);
static TLS_IE int tl_guard;

/* Child of a shared-heap parent: leave the (shared) pool alone. */
static void shared_child(void) { atomic_store(&g_status, ST_FAILED); }

static void proxy_init(void) {
    int expect = ST_NONE;
    if (!atomic_compare_exchange_strong(&g_status, &expect, ST_INIT)) return;
    tl_guard = 1;
    g_libc_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    const char *opt = getenv("HM_PROXY");
    int shared = opt && strstr(opt, "shared");
    int tracked = shared || (opt && strstr(opt, "tracked"));
    hm_os_params_t *osp = NULL;
    hm_provider_t *prov = NULL;
    hm_pool_t *pool = NULL;
    hm_result_t r = hm_os_params_create(&osp);
    if (r == HM_SUCCESS && shared) r = hm_os_params_set_visibility(osp, HM_OS_SHARED);
    if (r == HM_SUCCESS) r = hm_os_params_set_shm_name(osp, "hetmem-proxy");
    if (r == HM_SUCCESS) r = hm_os_provider_create(osp, &prov);
    hm_os_params_destroy(osp);
    if (r == HM_SUCCESS)
        r = hm_native_pool_create(prov, NULL,
                                  HM_POOL_FLAG_OWN_PROVIDER |
                                      (tracked ? 0 : HM_POOL_FLAG_NO_TRACKING),
                                  &pool);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("libhetmem_proxy: cannot create the pool (%s); glibc malloc stays",
                     hm_result_string(r));
        if (prov) hm_provider_destroy(prov);
        tl_guard = 0;
        atomic_store(&g_status, ST_FAILED);
        return;
    }
    g_state = pool->state;
    if (shared && pthread_atfork(NULL, NULL, shared_child))
        HM_LOG_WARN("libhetmem_proxy: pthread_atfork failed; do not fork with HM_PROXY=shared");
    tl_guard = 0;
    atomic_store_explicit(&g_status, ST_READY, memory_order_release);
}

/* Ready to serve this call from the pool? */
HM_INLINE int ready(void) {
    if (hm_likely(atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY))
        return !tl_guard;
    if (tl_guard) return 0;
    proxy_init();
    return atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY && !tl_guard;
}

static void *pool_alloc(size_t size, size_t align) {
    void *p = NULL;
    tl_guard = 1;
    hm_result_t r = hm_native_pool_ops()->alloc(g_state, size ? size : 1, align, &p);
    tl_guard = 0;
    if (hm_unlikely(r != HM_SUCCESS)) {
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

HM_INLINE int pool_owns(void *p) { return hm__native_owns(g_state, p); }

EXPORT void *malloc(size_t size) {
    if (hm_unlikely(!ready())) return __libc_malloc(size);
    return pool_alloc(size, 0);
}

/* Ours? Inside the pool (guard set) every pointer is glibc's. */
HM_INLINE int ours(void *p) {
    return hm_likely(atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY) &&
           !tl_guard && pool_owns(p);
}

EXPORT void free(void *p) {
    if (!p) return;
    if (hm_unlikely(atomic_load_explicit(&g_status, memory_order_relaxed) == ST_FAILED) &&
        g_state && hm__native_owns(g_state, p))
        return; /* a shared-heap parent's block, in the child: not ours to free */
    if (ours(p)) {
        tl_guard = 1;
        hm_native_pool_ops()->free(g_state, p);
        tl_guard = 0;
        return;
    }
    __libc_free(p);
}

EXPORT void *calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (hm_unlikely(!ready())) return __libc_calloc(n, size);
    void *p = pool_alloc(total, 0);
    if (p) memset(p, 0, total);
    return p;
}

static size_t usable(void *p) {
    tl_guard = 1;
    size_t n = hm_native_pool_ops()->usable_size(g_state, p);
    tl_guard = 0;
    return n;
}

EXPORT void *realloc(void *p, size_t size) {
    if (!p) return malloc(size);
    if (hm_unlikely(atomic_load_explicit(&g_status, memory_order_relaxed) == ST_FAILED) &&
        g_state && hm__native_owns(g_state, p)) {
        /* Shared-heap child: move the block to glibc, leave the original. */
        size_t old = hm_native_pool_ops()->usable_size(g_state, p);
        void *q = __libc_malloc(size);
        if (q) memcpy(q, p, old < size ? old : size);
        return q;
    }
    if (!ours(p)) return __libc_realloc(p, size); /* glibc's pointer stays glibc's */
    if (!size) {
        free(p);
        return NULL;
    }
    size_t old = usable(p);
    if (size <= old && size >= old / 2) return p;
    void *q = pool_alloc(size, 0);
    if (!q) return NULL;
    memcpy(q, p, old < size ? old : size);
    free(p);
    return q;
}

static int aligned(void **out, size_t align, size_t size) {
    if (!hm_is_pow2(align)) return EINVAL;
    void *p;
    if (hm_unlikely(!ready())) p = __libc_memalign(align, size);
    else p = pool_alloc(size, align > 8 ? align : 0);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

EXPORT int posix_memalign(void **out, size_t align, size_t size) {
    if (align % sizeof(void *)) return EINVAL;
    return aligned(out, align, size);
}

EXPORT void *aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    int e = aligned(&p, align, size);
    if (e) errno = e;
    return p;
}

EXPORT void *memalign(size_t align, size_t size) { return aligned_alloc(align, size); }

EXPORT void *valloc(size_t size) { return aligned_alloc((size_t)sysconf(_SC_PAGESIZE), size); }

EXPORT void *pvalloc(size_t size) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = hm_align_up(size ? size : 1, page);
    if (!n) {
        errno = ENOMEM;
        return NULL;
    }
    return aligned_alloc(page, n);
}

EXPORT size_t malloc_usable_size(void *p) {
    if (!p) return 0;
    if (ours(p)) return usable(p);
    if (atomic_load_explicit(&g_status, memory_order_relaxed) == ST_FAILED && g_state &&
        hm__native_owns(g_state, p))
        return hm_native_pool_ops()->usable_size(g_state, p);
    return g_libc_usable ? g_libc_usable(p) : 0;
}
