/* hetmem — libhetmem_proxy.so: the process's malloc family served by a
 * native pool over the OS provider. SPDX-License-Identifier: MIT
 *
 *   LD_PRELOAD=libhetmem_proxy.so program ...
 *   HM_PROXY=shared[,tracked]   options, comma-separated:
 *     shared    the OS provider in shared (memfd) mode, so the heap can be
 *               exported through IPC (implies tracked). The memfd's
 *               descriptor is out of the program's way (close-on-exec, at
 *               512 or above); a program that closes it (closing "all" its
 *               descriptors) or puts a file of its own at its number can no
 *               longer grow the heap: such allocations fail (ENOMEM; the
 *               log says why), the program's file is never touched
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
 * - First call: any entry point may be a program's first call into the
 *   family, on a pointer glibc allocated before the takeover, before the
 *   pool exists or while another thread makes it. Those that allocate make
 *   the pool (or use glibc meanwhile); free and realloc need nothing of it
 *   for glibc's pointers; malloc_usable_size needs glibc's own function,
 *   found at its first use (libc_usable), not by the pool's set-up.
 * - Fork: the native pool and the tracker hold their locks across fork().
 *   With HM_PROXY=shared the heap is MAP_SHARED memory of a memfd, which a
 *   forked child would keep sharing with its parent (each one's writes to
 *   heap blocks seen by the other). So the heap is copied inside fork(), in
 *   the parent, once the pool's locks are held (its ranges cannot change):
 *   every range into an anonymous private mapping filled with the resident
 *   pages. The child moves each copy over its range with mremap before any
 *   other child hook runs, and the parent unmaps its copies. The copy
 *   must be the heap as it was at fork(): one made by the child after
 *   fork() returned saw the parent's later writes (a shell's child read the
 *   word list its parent had freed and reused, and crashed), and the
 *   handlers before it (liburcu's) wrote into the parent's heap. Until the
 *   child's own pool exists (made by the last child hook, over a private
 *   OS provider), its allocations go to glibc; blocks inherited from the
 *   parent are freed into the inherited pool, now private memory. The copy
 *   costs a memcpy of the resident heap per fork (pages never touched or
 *   purged stay holes; where swap is on, non-resident pages may be swapped
 *   out, so every page is copied, which also fills the holes). If it cannot
 *   be made (out of memory), the child aborts rather than write into its
 *   parent's heap. Programs whose children exec at once through posix_spawn
 *   or vfork pay nothing (no atfork handlers run).
 * The pool is never destroyed (memory outlives every static destructor). */
#include "fork.h"
#include "pool_internal.h"
/* The native pool in this translation unit (native.c's object is left out
 * of this library's copy of hetmem: CMakeLists.txt), so that the entries
 * inline its fast paths; its thread-local state initial-exec (this library
 * is only ever preloaded). */
#define HM_NATIVE_PRELOAD 1
#include "pools/native/native.c"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
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

/* ST_FORKED: a forked child of a shared-heap process between its first
 * and last fork hooks: allocations go to glibc, inherited blocks are
 * freed into g_old. */
enum { ST_NONE = 0, ST_INIT = 1, ST_READY = 2, ST_FAILED = 3, ST_FORKED = 4 };
static _Atomic int g_status;
/* The native pool's state (immutable once READY, but for the fork child
 * handler, which runs alone). */
static void *g_state;
/* In a child of a shared-heap process: the inherited pool, its ranges made
 * private; frees of its blocks go there. NULL otherwise. */
static void *g_old;
static int g_shared;  /* g_state's heap is shared memory (not yet forked) */
static int g_tracked; /* HM_PROXY asked for tracking */
static size_t (*_Atomic g_libc_usable)(void *); /* see libc_usable */
static TLS_IE int tl_guard;

/* Set the guard: also the fast entries' heap (tl.fast), so that they take
 * the slow ones until a slow entry sets it again (px_arm). */
HM_INLINE void guard_on(void) {
    tl_guard = 1;
    tl.fast = NULL;
}

static hm_result_t pool_make(int shared, int tracked, void **state);
static void snap_prepare(void);
static void snap_parent(void);
static void snap_child(void);
static void fork_child(void);
/* The proxy's two slots of the fork list (fork.h): the snapshot, last in
 * prepare (the pool and the tracker are locked) and first in the child;
 * the child's own pool, last in the child. This library carries its own
 * copy of hetmem (src/preload/CMakeLists.txt), and so its own list and
 * its own pthread_atfork registration (init.c's), separate from
 * libhetmem.so's in a program that loads both: the proxy's registers at the
 * process's first malloc, earlier, so its prepare runs after libhetmem.so's
 * and its child before, which is right since libhetmem.so calls malloc
 * under its locks and the proxy never calls libhetmem.so. */
static const hm_fork_hooks_t snap_hooks = {snap_prepare, snap_parent, snap_child};
static const hm_fork_hooks_t child_pool_hooks = {NULL, NULL, fork_child};

static void proxy_init(void) {
    int expect = ST_NONE;
    if (!atomic_compare_exchange_strong(&g_status, &expect, ST_INIT)) return;
    guard_on();
    const char *opt = secure_getenv("HM_PROXY");
    int shared = opt && strstr(opt, "shared");
    int tracked = shared || (opt && strstr(opt, "tracked"));
    void *state = NULL;
    hm_result_t r = pool_make(shared, tracked, &state);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("libhetmem_proxy: cannot create the pool (%s); glibc malloc stays",
                     hm_result_string(r));
        tl_guard = 0;
        atomic_store(&g_status, ST_FAILED);
        return;
    }
    g_state = state;
    g_shared = shared;
    g_tracked = tracked;
    if (shared) { /* before the pool serves: no fork may miss the snapshot */
        hm__fork_enable(HM_FORK_PROXY_SNAPSHOT, &snap_hooks);
        hm__fork_enable(HM_FORK_PROXY_POOL, &child_pool_hooks);
    }
    tl_guard = 0;
    atomic_store_explicit(&g_status, ST_READY, memory_order_release);
}

/* A native pool over a new OS provider (the guard is set). */
static hm_result_t pool_make(int shared, int tracked, void **state) {
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
        if (prov) hm_provider_destroy(prov);
        return r;
    }
    *state = pool->state;
    return HM_SUCCESS;
}

/* ---- fork of a shared-heap process: the child's heap becomes private ---- */

/* Is swap on? Then a page mincore() calls absent may hold data. */
static int swap_on(void) {
    char buf[4096];
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    const char *p = strstr(buf, "SwapTotal:");
    if (!p) return 1;
    p += strlen("SwapTotal:");
    while (*p == ' ') p++;
    return !(p[0] == '0' && p[1] == ' ');
}

/* The copies of the heap's ranges made inside fork() (snap_prepare), in
 * mappings of their own (the pool is locked then: no malloc). */
typedef struct snap_ent {
    uintptr_t base, copy;
    size_t size;
} snap_ent_t;

typedef struct snap {
    snap_ent_t *e;
    size_t n, cap, map_size;
    size_t page;
    int copy_all;
    int failed; /* errno of the first failure */
} snap_t;

static snap_t g_snap;

static void snap_count(void *arg, uintptr_t base, size_t size) {
    (void)base;
    (void)size;
    ((snap_t *)arg)->cap++;
}

/* Copy [base, +size) (a MAP_SHARED range) into a new private mapping. */
static void snap_copy(void *arg, uintptr_t base, size_t size) {
    snap_t *c = arg;
    if (c->failed) return;
    if (c->n == c->cap) { /* cannot happen: the pool is locked */
        c->failed = EAGAIN;
        return;
    }
    char *tmp = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) {
        c->failed = errno;
        return;
    }
    enum { CHUNK = 4096 };
    unsigned char vec[CHUNK];
    for (size_t off = 0; off < size;) {
        size_t pages = (size - off) / c->page;
        if (pages > CHUNK) pages = CHUNK;
        size_t len = pages * c->page;
        if (c->copy_all || mincore((void *)(base + off), len, vec)) {
            memcpy(tmp + off, (const void *)(base + off), len);
        } else {
            /* Copy runs of resident pages; absent ones are holes (no swap):
             * reading them would allocate pages in the memfd. */
            for (size_t i = 0; i < pages;) {
                if (!(vec[i] & 1)) {
                    i++;
                    continue;
                }
                size_t j = i;
                while (j < pages && (vec[j] & 1)) j++;
                memcpy(tmp + off + i * c->page, (const void *)(base + off + i * c->page),
                       (j - i) * c->page);
                i = j;
            }
        }
        off += len;
    }
    c->e[c->n++] = (snap_ent_t){.base = base, .copy = (uintptr_t)tmp, .size = size};
}

static void snap_free(void) {
    for (size_t i = 0; i < g_snap.n; i++) munmap((void *)g_snap.e[i].copy, g_snap.e[i].size);
    if (g_snap.e) munmap(g_snap.e, g_snap.map_size);
    g_snap = (snap_t){0};
}

/* The snapshot's prepare, after every other slot's (the pool and the
 * tracker are locked: the heap's ranges are fixed). */
static void snap_prepare(void) {
    if (!g_shared || atomic_load(&g_status) != ST_READY) return;
    snap_t c = {.page = (size_t)sysconf(_SC_PAGESIZE), .copy_all = swap_on()};
    hm__native_for_each_range_locked(g_state, snap_count, &c);
    c.map_size = hm_align_up((c.cap ? c.cap : 1) * sizeof(snap_ent_t), c.page);
    void *e = mmap(NULL, c.map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (e == MAP_FAILED) {
        c.failed = errno;
        c.map_size = 0;
    } else {
        c.e = e;
        hm__native_for_each_range_locked(g_state, snap_copy, &c);
    }
    g_snap = c;
}

/* The snapshot's parent hook, before every other slot's. */
static void snap_parent(void) {
    if (!g_snap.page) return;
    if (g_snap.failed) { /* the pool is still locked: a log line's malloc goes to glibc */
        int guard = tl_guard;
        guard_on();
        HM_LOG_WARN("libhetmem_proxy: could not copy the shared heap for a forked child (%s); "
                    "the child aborts", strerror(g_snap.failed));
        tl_guard = guard;
    }
    snap_free();
}

/* The snapshot's child hook, before every other slot's: the heap becomes the
 * copies. */
static void snap_child(void) {
    if (!g_snap.page) return;
    int guard = tl_guard;
    guard_on(); /* the pool is still locked: a log line's malloc goes to glibc */
    if (g_snap.failed)
        HM_DIE("libhetmem_proxy: forked child has no copy of the shared heap (%s); aborting "
               "rather than writing into the parent's memory", strerror(g_snap.failed));
    size_t bytes = 0;
    for (size_t i = 0; i < g_snap.n; i++) {
        snap_ent_t *x = &g_snap.e[i];
        if (mremap((void *)x->copy, x->size, x->size, MREMAP_MAYMOVE | MREMAP_FIXED,
                   (void *)x->base) == MAP_FAILED)
            HM_DIE("libhetmem_proxy: forked child cannot move its copy of the shared heap "
                   "(%s); aborting rather than writing into the parent's memory",
                   strerror(errno));
        x->copy = 0;
        bytes += x->size;
    }
    HM_LOG_DEBUG("libhetmem_proxy: forked child has %zu heap ranges (%zu bytes) private",
                 g_snap.n, bytes);
    munmap(g_snap.e, g_snap.map_size);
    g_snap = (snap_t){0};
    /* Until fork_child makes the child's pool: glibc allocates, inherited
     * blocks go back to the inherited pool. */
    g_old = g_state;
    g_shared = 0;
    atomic_store(&g_status, ST_FORKED);
    tl_guard = guard;
}

/* The PROXY_POOL slot's child hook, after every other slot's: the child's
 * own pool. */
static void fork_child(void) {
    if (atomic_load(&g_status) != ST_FORKED) return;
    int guard = tl_guard;
    guard_on();
    void *state = NULL;
    if (pool_make(0, g_tracked, &state) == HM_SUCCESS) {
        g_state = state;
        atomic_store_explicit(&g_status, ST_READY, memory_order_release);
    } else {
        HM_LOG_ERROR("libhetmem_proxy: forked child cannot create its pool; glibc malloc "
                     "serves it");
        atomic_store(&g_status, ST_FAILED);
    }
    tl_guard = guard;
}

/* Ready to serve this call from the pool? */
HM_INLINE int ready(void) {
    if (hm_likely(atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY))
        return !tl_guard;
    if (tl_guard) return 0;
    proxy_init();
    return atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY && !tl_guard;
}

/* The pool's provider refused to grow (HM_ERROR_DRIVER: with HM_PROXY=shared,
 * the program closed or replaced the heap's memfd descriptor, which the
 * provider will not touch): the program keeps running on glibc's heap
 * (free, realloc and malloc_usable_size tell glibc's blocks from the
 * pool's), with one log line from the provider. */
static HM_NOINLINE void *glibc_fallback(size_t size, size_t align) {
    static _Atomic int told;
    if (!atomic_exchange_explicit(&told, 1, memory_order_relaxed))
        HM_LOG_WARN("libhetmem_proxy: the heap's provider refused to grow; new blocks come "
                    "from glibc's malloc");
    return align ? __libc_memalign(align, size) : __libc_malloc(size);
}

static void *pool_alloc(size_t size, size_t align) {
    void *p = NULL;
    guard_on();
    hm_result_t r = hm__native_alloc(g_state, size ? size : 1, align, &p);
    tl_guard = 0;
    if (hm_unlikely(r != HM_SUCCESS)) {
        if (r == HM_ERROR_DRIVER) return glibc_fallback(size ? size : 1, align);
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

static HM_NOINLINE void *px_malloc_other(size_t size) {
    if (hm_unlikely(!ready())) return __libc_malloc(size);
    return pool_alloc(size, 0);
}

/* The pool's fast path calls nothing (no malloc, no lock), so it needs no
 * guard; the pool sets the guard itself around a refill, and passes what it
 * does not serve to px_malloc_other. */
HM_INLINE void *impl_malloc(size_t size) {
    if (hm_likely(atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY &&
                  !tl_guard))
        return hm__native_malloc(g_state, size, &tl_guard, px_malloc_other);
    return px_malloc_other(size);
}

/* Which pool's block is p: g_state's, g_old's (a forked child's inherited
 * heap) or neither (NULL: glibc's). Inside the pool (guard set) every
 * pointer is glibc's. */
HM_INLINE void *owner_of(void *p) {
    if (hm_unlikely(tl_guard)) return NULL;
    int st = atomic_load_explicit(&g_status, memory_order_acquire);
    if (hm_likely(st == ST_READY) && hm__native_owns(g_state, p)) return g_state;
    if (hm_unlikely(g_old != NULL) && st >= ST_READY && hm__native_owns(g_old, p))
        return g_old;
    return NULL;
}

/* free's general case: the pool's free tells its own blocks from others
 * (HM_ERROR_NOT_FOUND, nothing done), one page-map lookup instead of
 * owner_of() and then the free op looking the pointer up again. */
static HM_NOINLINE hm_result_t px_free_other(void *p) {
    if (!p) return HM_SUCCESS; /* free(NULL): the fast entry's `last` test lets it through */
    if (hm_likely(!tl_guard)) {
        int st = atomic_load_explicit(&g_status, memory_order_acquire);
        if (hm_likely(st == ST_READY)) {
            guard_on();
            hm_result_t r = hm__native_free_owned(g_state, p);
            tl_guard = 0;
            if (hm_likely(r != HM_ERROR_NOT_FOUND)) return r;
        }
        if (hm_unlikely(g_old != NULL) && st >= ST_READY) {
            guard_on();
            hm_result_t r = hm__native_free_owned(g_old, p);
            tl_guard = 0;
            if (r != HM_ERROR_NOT_FOUND) return r;
        }
    }
    __libc_free(p);
    return HM_SUCCESS;
}

/* The pool's fast path calls nothing, so it needs no guard (see malloc);
 * what it does not finish it passes, unchanged, to px_free_other. */
HM_INLINE void impl_free(void *p) {
    if (!p) return;
    if (hm_likely(atomic_load_explicit(&g_status, memory_order_acquire) == ST_READY &&
                  !tl_guard)) {
        (void)hm__native_free(g_state, p, px_free_other);
        return;
    }
    (void)px_free_other(p);
}

HM_INLINE void *impl_calloc(size_t n, size_t size) {
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

static size_t usable(void *st, void *p) {
    guard_on();
    size_t n = hm_native_pool_ops()->usable_size(st, p);
    tl_guard = 0;
    return n;
}

HM_INLINE void *impl_realloc(void *p, size_t size) {
    if (!p) return impl_malloc(size);
    void *st = owner_of(p);
    if (!st) return __libc_realloc(p, size); /* glibc's pointer stays glibc's */
    if (!size) {
        impl_free(p);
        return NULL;
    }
    size_t old = usable(st, p);
    if (st == g_state && size <= old && size >= old / 2) return p;
    void *q = impl_malloc(size); /* the current pool, or glibc's in a failed child */
    if (!q) return NULL;
    memcpy(q, p, old < size ? old : size);
    impl_free(p);
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

HM_INLINE int impl_posix_memalign(void **out, size_t align, size_t size) {
    if (align % sizeof(void *)) return EINVAL;
    return aligned(out, align, size);
}

static void *impl_aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    int e = aligned(&p, align, size);
    if (e) errno = e;
    return p;
}

/* As glibc's: an alignment that is not a power of two is rounded up to the
 * next one (aligned_alloc and posix_memalign refuse it). */
static void *impl_memalign(size_t align, size_t size) {
    if (!hm_is_pow2(align)) {
        if (align > SIZE_MAX / 2 + 1) {
            errno = EINVAL;
            return NULL;
        }
        size_t up = 1;
        while (up < align) up <<= 1;
        align = up;
    }
    return impl_aligned_alloc(align, size);
}

static void *impl_valloc(size_t size) { return impl_aligned_alloc((size_t)sysconf(_SC_PAGESIZE), size); }

static void *impl_pvalloc(size_t size) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = hm_align_up(size ? size : 1, page);
    if (!n) {
        errno = ENOMEM;
        return NULL;
    }
    return impl_aligned_alloc(page, n);
}

/* glibc's malloc_usable_size of one of its blocks. Looked up at the first
 * call that needs it, in whatever state the proxy is (no pool yet, another
 * thread making it, failed): a block glibc allocated before the takeover can
 * reach malloc_usable_size before any call that makes the pool. dlsym may
 * allocate: under the guard, glibc serves it. Racing first lookups find the
 * same function. */
static HM_NOINLINE size_t libc_usable_slow(void *p) {
    int guard = tl_guard;
    guard_on();
    size_t (*f)(void *) = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    tl_guard = guard;
    if (!f) return 0;
    atomic_store_explicit(&g_libc_usable, f, memory_order_release);
    return f(p);
}

HM_INLINE size_t libc_usable(void *p) {
    size_t (*f)(void *) = atomic_load_explicit(&g_libc_usable, memory_order_acquire);
    if (hm_likely(f != NULL)) return f(p);
    return libc_usable_slow(p);
}

EXPORT size_t malloc_usable_size(void *p) {
    if (!p) return 0;
    void *st = owner_of(p);
    if (st) return usable(st, p);
    return libc_usable(p);
}

/* ---- recording (HM_PROXY_TRACE=path): trace.h's format ----
 *
 * Each thread appends records to a buffer of its own (1 MiB from mmap, not
 * from any heap) and writes the buffer whole, with one write(), to the trace
 * file (O_APPEND) when it is full, at thread exit (a pthread key's
 * destructor) and at process exit (this library's destructor, which also
 * writes what the other threads' buffers hold then). The only shared datum
 * a call touches is the sequence counter (one relaxed fetch-add), and only
 * while tracing. Buffers of exited threads are reused by new threads.
 *
 * The file: path itself when it does not exist yet, else path.<pid> (a
 * program the traced one runs, which inherits the environment, gets a file
 * of its own; an existing file is never appended to or truncated). A forked
 * child stops recording at fork() (its copy of the buffers is the parent's
 * to write) and closes its copy of the descriptor. Records still buffered
 * when the process execs, and those made after the exit-time flush, are
 * lost. A write error (a full disk, a program that closed the descriptor)
 * stops recording, with one log line.
 *
 *   buffer field   written by                      read by
 *   n              the owner                       the owner
 *   count          the owner (release, per record)  flushers (acquire)
 *   flushed        whoever holds busy              whoever holds busy
 *   free           the key destructor (release);   tbuf_get (CAS)
 * A flush holds busy: the owner's (which then empties the buffer) and the
 * exit-time flush of another thread's buffer (which writes the published
 * records past flushed and leaves the rest to the owner). */
#include "trace.h"

#include <pthread.h>

enum { TR_UNKNOWN = 0, TR_INIT = 1, TR_ON = 2, TR_OFF = 3 };
enum { TBUF_BYTES = 1 << 20 };

typedef struct tbuf {
    struct tbuf *next; /* g_tbufs, push-only */
    uint32_t n;
    _Atomic uint32_t count;
    uint32_t flushed;
    _Atomic int busy;
    _Atomic int free; /* no thread owns it */
    hm_trace_rec_t rec[];
} tbuf_t;

#define TBUF_CAP ((TBUF_BYTES - sizeof(tbuf_t)) / sizeof(hm_trace_rec_t))

static _Atomic int g_trace; /* TR_*: read by every exported call */
static int g_trace_fd = -1;
static _Atomic uint64_t g_trace_seq;
static _Atomic uint32_t g_trace_threads;
static tbuf_t *_Atomic g_tbufs;
static pthread_key_t g_trace_key;
static TLS_IE tbuf_t *tl_tbuf;
static TLS_IE uint32_t tl_trace_thread; /* index + 1; 0: none yet */

static void trace_stop(int err) {
    if (atomic_exchange(&g_trace, TR_OFF) != TR_ON) return;
    int guard = tl_guard;
    guard_on();
    HM_LOG_WARN("libhetmem_proxy: cannot write the trace (%s); recording stops", strerror(err));
    tl_guard = guard;
}

static int trace_write(const void *p, size_t len) {
    const char *c = p;
    while (len) {
        ssize_t w = write(g_trace_fd, c, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        c += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Write b's published records; the owner also empties it. */
static void tbuf_flush(tbuf_t *b, int owner) {
    if (atomic_load(&g_trace) != TR_ON) return;
    int e = errno;
    while (atomic_exchange_explicit(&b->busy, 1, memory_order_acquire)) sched_yield();
    uint32_t c = atomic_load_explicit(&b->count, memory_order_acquire);
    int err = 0;
    if (c > b->flushed)
        err = trace_write(&b->rec[b->flushed], (c - b->flushed) * sizeof(hm_trace_rec_t));
    b->flushed = c;
    if (owner) {
        b->n = b->flushed = 0;
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&b->busy, 0, memory_order_release);
    if (err) trace_stop(err);
    errno = e;
}

static void tbuf_release(void *arg) {
    tbuf_t *b = arg;
    tbuf_flush(b, 1);
    tl_tbuf = NULL;
    atomic_store_explicit(&b->free, 1, memory_order_release);
}

static HM_NOINLINE tbuf_t *tbuf_get(void) {
    tbuf_t *b;
    for (b = atomic_load_explicit(&g_tbufs, memory_order_acquire); b; b = b->next) {
        int one = 1;
        if (atomic_load_explicit(&b->free, memory_order_relaxed) &&
            atomic_compare_exchange_strong(&b->free, &one, 0))
            break;
    }
    if (!b) {
        void *m = mmap(NULL, TBUF_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (m == MAP_FAILED) return NULL;
        b = m;
        b->next = atomic_load(&g_tbufs);
        while (!atomic_compare_exchange_weak(&g_tbufs, &b->next, b)) {
        }
    }
    if (!tl_trace_thread) tl_trace_thread = atomic_fetch_add(&g_trace_threads, 1) + 1;
    tl_tbuf = b;
    int guard = tl_guard;
    guard_on(); /* pthread_setspecific may allocate: glibc serves it */
    (void)pthread_setspecific(g_trace_key, b);
    tl_guard = guard;
    return b;
}

static void trace_put(int op, const void *ptr, size_t size, size_t align, const void *result) {
    tbuf_t *b = tl_tbuf;
    if (hm_unlikely(!b) && !(b = tbuf_get())) return;
    hm_trace_rec_t *r = &b->rec[b->n];
    *r = (hm_trace_rec_t){
        .seq = atomic_fetch_add_explicit(&g_trace_seq, 1, memory_order_relaxed),
        .ptr = (uintptr_t)ptr,
        .size = size,
        .result = (uintptr_t)result,
        .align = align > UINT32_MAX ? UINT32_MAX : (uint32_t)align,
        .thread = (uint16_t)(tl_trace_thread - 1),
        .op = (uint8_t)op,
    };
    atomic_store_explicit(&b->count, ++b->n, memory_order_release);
    if (hm_unlikely(b->n == TBUF_CAP)) tbuf_flush(b, 1);
}

static void trace_fork_child(void) {
    if (atomic_exchange(&g_trace, TR_OFF) != TR_ON) return;
    close(g_trace_fd);
    g_trace_fd = -1;
}

/* At process exit: every buffer's published records. */
__attribute__((destructor)) static void trace_fini(void) {
    if (atomic_load(&g_trace) != TR_ON) return;
    for (tbuf_t *b = atomic_load(&g_tbufs); b; b = b->next)
        if (!atomic_load_explicit(&b->free, memory_order_acquire)) tbuf_flush(b, b == tl_tbuf);
}

static int trace_open(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        char alt[4096];
        int n = snprintf(alt, sizeof alt, "%s.%ld", path, (long)getpid());
        if (n > 0 && (size_t)n < sizeof alt)
            fd = open(alt, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    }
    if (fd < 0) return -1;
    int hi = fcntl(fd, F_DUPFD_CLOEXEC, 512); /* out of the program's way */
    if (hi >= 0) {
        close(fd);
        fd = hi;
    }
    return fd;
}

/* First call on any thread: is HM_PROXY_TRACE set? Others wait meanwhile. */
static HM_NOINLINE int trace_init(void) {
    int expect = TR_UNKNOWN;
    if (!atomic_compare_exchange_strong(&g_trace, &expect, TR_INIT)) {
        while ((expect = atomic_load(&g_trace)) == TR_INIT) sched_yield();
        return expect;
    }
    int guard = tl_guard;
    guard_on(); /* what the set-up allocates is glibc's, and not recorded */
    int st = TR_OFF;
    const char *path = secure_getenv("HM_PROXY_TRACE");
    if (path && *path) {
        int fd = trace_open(path);
        hm_trace_header_t h = {.magic = HM_TRACE_MAGIC,
                               .version = HM_TRACE_VERSION,
                               .header_size = sizeof(hm_trace_header_t),
                               .record_size = sizeof(hm_trace_rec_t),
                               .pid = (uint32_t)getpid()};
        g_trace_fd = fd;
        if (fd < 0)
            HM_LOG_WARN("libhetmem_proxy: cannot create the trace %s (%s); not recording", path,
                        strerror(errno));
        else if (trace_write(&h, sizeof h) || pthread_key_create(&g_trace_key, tbuf_release) ||
                 pthread_atfork(NULL, NULL, trace_fork_child)) {
            HM_LOG_WARN("libhetmem_proxy: cannot start the trace %s; not recording", path);
            close(fd);
            g_trace_fd = -1;
        } else {
            st = TR_ON;
        }
    }
    tl_guard = guard;
    atomic_store(&g_trace, st);
    return st;
}

/* Is this call the program's, to be recorded? (entry: tl_guard at entry) */
HM_INLINE int trace_want(int entry) {
    if (entry) return 0;
    int st = atomic_load_explicit(&g_trace, memory_order_acquire);
    if (hm_unlikely(st < TR_ON)) st = trace_init();
    return st == TR_ON;
}

/* The recorded entry points: the call, then its record (free: the record
 * first, so that its seq precedes any reuse of the block). */
static HM_NOINLINE void *trace_malloc(size_t size) {
    int entry = tl_guard;
    void *r = impl_malloc(size);
    if (trace_want(entry)) trace_put(HM_TRACE_MALLOC, NULL, size, 0, r);
    return r;
}

static HM_NOINLINE void trace_free(void *p) {
    if (p && trace_want(tl_guard)) trace_put(HM_TRACE_FREE, p, 0, 0, NULL);
    impl_free(p);
}

static HM_NOINLINE void *trace_calloc(size_t n, size_t size) {
    int entry = tl_guard;
    void *r = impl_calloc(n, size);
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) total = SIZE_MAX;
    if (trace_want(entry)) trace_put(HM_TRACE_CALLOC, NULL, total, 0, r);
    return r;
}

static HM_NOINLINE void *trace_realloc(void *p, size_t size) {
    int entry = tl_guard;
    void *r = impl_realloc(p, size);
    if (trace_want(entry)) trace_put(HM_TRACE_REALLOC, p, size, 0, r);
    return r;
}

static HM_NOINLINE int trace_posix_memalign(void **out, size_t align, size_t size) {
    int entry = tl_guard;
    int e = impl_posix_memalign(out, align, size);
    if (trace_want(entry)) trace_put(HM_TRACE_MEMALIGN, NULL, size, align, e ? NULL : *out);
    return e;
}

static HM_NOINLINE void *trace_align(int kind, size_t align, size_t size) {
    int entry = tl_guard;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *r = kind == 0   ? impl_aligned_alloc(align, size)
              : kind == 1 ? impl_memalign(align, size)
              : kind == 2 ? impl_valloc(size)
                          : impl_pvalloc(size);
    if (kind >= 2) align = page;
    if (kind == 3) size = hm_align_up(size ? size : 1, page);
    if (trace_want(entry)) trace_put(HM_TRACE_MEMALIGN, NULL, size, align, r);
    return r;
}

#define TRACING() hm_unlikely(atomic_load_explicit(&g_trace, memory_order_relaxed) != TR_OFF)

/* ---- the fast entries: the pool's fast paths on the caller's heap ----
 *
 * tl.fast is the calling thread's heap in g_state while the fast entries may
 * serve it: the pool is ready, nothing is recorded, the guard is clear
 * (guard_on clears tl.fast; a slow entry sets it again, px_arm), the pool's
 * classes cover every size up to NV_FAST_MAX (its fast_limit), and it is of
 * host memory (a stacked block is prefetched). The pool clears it when the
 * thread's heap is abandoned (its key destructor), so that later calls take
 * the slow entries, which use the orphan heap. One initial-exec load finds
 * the heap: no thread pointer compared, no hash. */

static HM_NOINLINE void px_arm(void) {
    if (atomic_load_explicit(&g_status, memory_order_acquire) != ST_READY || tl_guard ||
        atomic_load_explicit(&g_trace, memory_order_relaxed) != TR_OFF)
        return;
    nv_pool_t *nv = g_state;
    if (nv->fast_limit < NV_FAST_MAX || !nv->prefetch) return;
    guard_on(); /* a new binding may call malloc (pthread_setspecific) */
    nv_heap_t *h = heap_get(nv);
    tl_guard = 0;
    tl.fast = h;
}

/* px_malloc's refill (h: tl.fast, cl: the class of size, empty). */
static HM_NOINLINE void *px_refill(nv_heap_t *h, nv_cls_t *cl, size_t size) {
    uintptr_t p = stk_pop(h, cl); /* calls nothing */
    if (hm_likely(p)) return (void *)p;
    void *q;
    guard_on();
    hm_result_t r = alloc_refill(h, (unsigned)(cl - h->cls), &q);
    tl_guard = 0;
    tl.fast = h;
    return hm_likely(r == HM_SUCCESS) ? q : px_malloc_other(size);
}

/* A block of class cl on h: the class word, else the class's stack, else a
 * refill. */
HM_INLINE void *px_class_alloc(nv_heap_t *h, nv_cls_t *cl, size_t size) {
    uint64_t b = cl_bits(cl);
    if (hm_likely(b)) return (void *)alloc_word(h, cl, b);
    uintptr_t p = alloc_pop(cl);
    if (hm_likely(p)) return (void *)p;
    return px_refill(h, cl, size);
}

/* Every malloc the fast entry does not serve: a size of a class beyond
 * NV_FAST_MAX on tl.fast, else recorded or not, then arm. */
static HM_NOINLINE void *px_malloc_slow(size_t size) {
    nv_heap_t *h = tl.fast;
    if (h && size - 1 < h->nv->class_limit) { /* size > NV_FAST_MAX */
        return px_class_alloc(h, &h->cls[cls_of_big(size)], size);
    }
    tl.fast = NULL; /* impl_malloc's refill sets the guard directly */
    void *p = TRACING() ? trace_malloc(size) : impl_malloc(size);
    px_arm();
    return p;
}

HM_INLINE void *px_malloc(size_t size) {
    nv_heap_t *h = tl.fast;
    /* size - 1 wraps for 0, which takes the slow entry. */
    if (hm_likely(h != NULL) && hm_likely(size - 1 < NV_FAST_MAX)) {
        return px_class_alloc(
            h, (nv_cls_t *)((char *)h + (hm__nv_cls_at8 + 1)[(size - 1) >> 3]), size);
    }
    return px_malloc_slow(size);
}

static HM_NOINLINE void px_free_slow(void *p) {
    if (TRACING()) trace_free(p);
    else impl_free(p);
    px_arm();
}

/* hm__native_free's paths on tl.fast, remote frees included (NV_FREE_PX):
 * every case beyond them goes, with nothing changed, to px_free_other
 * (which refuses a double free, frees into the pool or gives glibc its
 * pointer). */
HM_INLINE void px_free(void *p) {
    nv_heap_t *me = tl.fast;
    if (hm_unlikely(me == NULL)) {
        px_free_slow(p);
        return;
    }
    /* The block allocated last (free_impl): a NULL p matches only while
     * `last` is 0, and then changes nothing. */
    if (me->last == (uintptr_t)p) {
        nv_cls_t *cl = me->last_cl;
        uint64_t bit = me->last_bit, b = cl_bits(cl);
        if (hm_unlikely(b & bit)) {
            (void)px_free_other(p);
            return;
        }
        cl_set(cl, b | bit);
        return;
    }
    uintptr_t roff = (uintptr_t)p - me->r_key;
    if (roff < me->r_span) {
        (void)free_cached_px(g_state, p, me, roff, px_free_other);
        return;
    }
    (void)free_general(g_state, p, me, NV_FREE_PX, px_free_other, NV_PF_HOST);
}

static HM_NOINLINE void *px_calloc_slow(size_t n, size_t size) {
    void *p = TRACING() ? trace_calloc(n, size) : impl_calloc(n, size);
    px_arm();
    return p;
}

static HM_NOINLINE void *px_realloc_slow(void *p, size_t size) {
    tl.fast = NULL; /* impl_realloc's malloc may refill with the guard set directly */
    void *q = TRACING() ? trace_realloc(p, size) : impl_realloc(p, size);
    px_arm();
    return q;
}

/* realloc of a block of one of the pool's slabs, to a size that is not 0:
 * impl_realloc's rule (kept if the size is at most the block's and at
 * least half of it), through the fast entries; anything else is
 * impl_realloc's. */
HM_INLINE void *px_realloc(void *p, size_t size) {
    if (hm_likely(tl.fast != NULL) && hm_likely(size != 0)) {
        nv_slab_t *s = map_get(g_state, p); /* NULL for p NULL */
        uint32_t idx;
        if (hm_likely(s != NULL) && hm_likely(block_index(s, p, &idx))) {
            size_t old = s->bsize;
            if (size <= old && size >= old / 2) return p;
            void *q = px_malloc(size);
            if (hm_unlikely(q == NULL)) return NULL;
            memcpy(q, p, old < size ? old : size);
            px_free(p);
            return q;
        }
    }
    return px_realloc_slow(p, size);
}

HM_INLINE void *px_calloc(size_t n, size_t size) {
    size_t total;
    if (hm_likely(tl.fast != NULL) && !__builtin_mul_overflow(n, size, &total)) {
        void *p = px_malloc(total);
        if (hm_likely(p != NULL)) memset(p, 0, total);
        return p;
    }
    return px_calloc_slow(n, size);
}

/* ---- the exported family: malloc, free and calloc through the fast entries; the others
 * one predictable branch when not recording ---- */

EXPORT void *malloc(size_t size) { return px_malloc(size); }

EXPORT void free(void *p) { px_free(p); }

EXPORT void *calloc(size_t n, size_t size) { return px_calloc(n, size); }

EXPORT void *realloc(void *p, size_t size) { return px_realloc(p, size); }

EXPORT int posix_memalign(void **out, size_t align, size_t size) {
    if (TRACING()) return trace_posix_memalign(out, align, size);
    return impl_posix_memalign(out, align, size);
}

EXPORT void *aligned_alloc(size_t align, size_t size) {
    if (TRACING()) return trace_align(0, align, size);
    return impl_aligned_alloc(align, size);
}

EXPORT void *memalign(size_t align, size_t size) {
    if (TRACING()) return trace_align(1, align, size);
    return impl_memalign(align, size);
}

EXPORT void *valloc(size_t size) {
    if (TRACING()) return trace_align(2, 0, size);
    return impl_valloc(size);
}

EXPORT void *pvalloc(size_t size) {
    if (TRACING()) return trace_align(3, 0, size);
    return impl_pvalloc(size);
}
