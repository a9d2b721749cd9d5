/* hetmem — IPC: what the export side (export.c) and the import side
 * (import.c) share: configuration, the exporter identity, the object arena,
 * the per-pool IPC state, fork handling and the small public calls.
 * SPDX-License-Identifier: MIT
 *
 *  Lock order (the IPC fork slot's prepare takes them all in this order,
 *  src/fork.h): the shared mappings' lock (import.c's shared_maps.lock) ->
 *  pilist_lock -> every pi->lock -> the import side's
 *  (opened.lock, imp_arena) -> the export side's (exports.lock, the view arenas) ->
 *  ptrace.c's pt.lock -> the pidfd cache.
 *  pi->lock guards the import side's per-pool index; the export side's
 *  per-pool fields (xhead, held) are exports.lock's. ident_lock nests with
 *  nothing. */
#include "ipc/ipc_core.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* configuration, identity                                                  */

static pthread_once_t ipc_once = PTHREAD_ONCE_INIT;
size_t hm__ipc_export_max = 1024;

static size_t env_size(const char *name, size_t dflt) {
    const char *v = secure_getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end) {
        HM_LOG_WARN("%s=%s is not a number; using %zu", name, v, dflt);
        return dflt;
    }
    return (size_t)x;
}

hm_ipc_ident_t hm__ipc_ident;
_Atomic unsigned hm__ipc_ident_epoch;
static pthread_mutex_t ident_lock = PTHREAD_MUTEX_INITIALIZER;

HM_NOINLINE const hm_ipc_ident_t *hm__ipc_ident_refresh(unsigned epoch) {
    hm__ipc_lazy_init();
    hm__mutex_lock(&ident_lock);
    if (atomic_load_explicit(&hm__ipc_ident_epoch, memory_order_relaxed) != epoch + 1) {
        hm__ipc_ident.pid = (uint64_t)getpid();
        hm__ipc_ident.nonce = hm__prim_process_nonce();
        uint64_t t = 0;
        if (hm__prim_process_start_time(0, &t) != HM_SUCCESS) t = 0;
        hm__ipc_ident.start = t;
        atomic_store_explicit(&hm__ipc_ident_epoch, epoch + 1, memory_order_release);
    }
    hm__mutex_unlock(&ident_lock);
    return &hm__ipc_ident;
}

/* ------------------------------------------------------------------------ */
/* object arena                                                             */

void *hm__ipc_arena_alloc(arena_t *a) {
    hm__mutex_lock(&a->lock);
    void *o = a->free;
    if (o) {
        memcpy(&a->free, (char *)o + a->link_off, sizeof(void *));
    } else {
        if ((size_t)(a->end - a->bump) < a->objsize) {
            size_t n = atomic_load_explicit(&a->nchunks, memory_order_relaxed);
            size_t sz = n ? ARENA_CHUNK : ARENA_FIRST;
            void *m = NULL;
            if (n == ARENA_MAX_CHUNKS ||
                hm__prim_map(sz, n ? ARENA_CHUNK : 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, 0,
                             -1, 0, &m) != HM_SUCCESS) {
                hm__mutex_unlock(&a->lock);
                return NULL; /* the callers fall back to malloc */
            }
            if (n) (void)hm__prim_advise(m, sz, HM_PRIM_ADVISE_HUGEPAGE);
            a->chunk_base[n] = (uintptr_t)m;
            a->chunk_size[n] = sz;
            atomic_store_explicit(&a->nchunks, n + 1, memory_order_release);
            a->bump = m;
            a->end = (char *)m + sz;
        }
        o = a->bump;
        a->bump += a->objsize;
    }
    hm__mutex_unlock(&a->lock);
    return o;
}
void hm__ipc_arena_free(arena_t *a, void *o) {
    hm__mutex_lock(&a->lock);
    memcpy((char *)o + a->link_off, &a->free, sizeof(void *));
    a->free = o;
    hm__mutex_unlock(&a->lock);
}

/* ------------------------------------------------------------------------ */
/* per-pool state                                                           */

pthread_mutex_t hm__ipc_pilist_lock = PTHREAD_MUTEX_INITIALIZER;
hm_ipc_pool_t *hm__ipc_pilist;

hm_ipc_pool_t *hm__ipc_pool_make(hm_pool_t *pool) {
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    if (hm_likely(pi)) return pi;
    hm_ipc_pool_t *fresh = calloc(1, sizeof(*fresh));
    if (!fresh) return NULL;
    if (!hm__ipc_import_pool_init(fresh)) {
        free(fresh);
        return NULL;
    }
    pthread_mutex_init(&fresh->lock, NULL);
    fresh->pool = pool;
    hm__mutex_lock(&hm__ipc_pilist_lock);
    pi = hm__ipc_pool(pool);
    if (!pi) {
        fresh->gnext = hm__ipc_pilist;
        if (hm__ipc_pilist) hm__ipc_pilist->gprev = fresh;
        hm__ipc_pilist = fresh;
        atomic_store_explicit(&pool->ipc, fresh, memory_order_release);
        pi = fresh;
        fresh = NULL;
    }
    hm__mutex_unlock(&hm__ipc_pilist_lock);
    if (fresh) {
        pthread_mutex_destroy(&fresh->lock);
        hm__ipc_import_pool_fini(fresh);
        free(fresh);
    }
    return pi;
}

void hm__ipc_pool_destroy(hm_pool_t *pool) {
    hm_ipc_pool_t *pi = hm__ipc_pool(pool);
    if (!pi) return;
    hm__ipc_export_pool_destroy(pool, pi);
    hm__ipc_import_pool_destroy(pool, pi);
    hm__mutex_lock(&hm__ipc_pilist_lock);
    hm__ipc_import_fold_hits(pi); /* under pilist_lock, as the statistics read them */
    if (pi->gprev) pi->gprev->gnext = pi->gnext;
    else hm__ipc_pilist = pi->gnext;
    if (pi->gnext) pi->gnext->gprev = pi->gprev;
    atomic_store_explicit(&pool->ipc, NULL, memory_order_release);
    hm__mutex_unlock(&hm__ipc_pilist_lock);
    pthread_mutex_destroy(&pi->lock);
    free(pi);
}

/* ------------------------------------------------------------------------ */
/* fork                                                                     */

void hm__ipc_atfork_prepare(void) {
    hm__ipc_import_share_atfork(0);
    hm__mutex_lock(&hm__ipc_pilist_lock);
    for (hm_ipc_pool_t *pi = hm__ipc_pilist; pi; pi = pi->gnext) hm__mutex_lock(&pi->lock);
    hm__ipc_import_atfork(0);
    hm__ipc_export_atfork(0);
    hm__ipc_ptrace_atfork(0);
    hm__ipc_pidfd_cache_atfork(0);
    hm__pool_hold_atfork(0);
}
/* Release what prepare took, in reverse (phase: 1 parent, 2 child). */
static void ipc_atfork_release(int phase) {
    hm__pool_hold_atfork(phase);
    hm__ipc_pidfd_cache_atfork(phase);
    hm__ipc_ptrace_atfork(phase);
    hm__ipc_export_atfork(phase);
    hm__ipc_import_atfork(phase);
    for (hm_ipc_pool_t *pi = hm__ipc_pilist; pi; pi = pi->gnext) hm__mutex_unlock(&pi->lock);
    hm__mutex_unlock(&hm__ipc_pilist_lock);
    hm__ipc_import_share_atfork(phase);
}
void hm__ipc_atfork_parent(void) { ipc_atfork_release(1); }
void hm__ipc_atfork_child(void) {
    /* The locks prepare took: the forking thread, the child's only one,
     * holds them (unlocked, not re-made: a re-made locked mutex is still
     * "locked" to ThreadSanitizer). They are released before the export
     * cache is dropped: dropping frees views into the view arenas, whose
     * locks are among them. ident_lock was not taken in prepare: a thread
     * that does not exist in the child may have held it. Opened mappings
     * are inherited and stay. */
    ipc_atfork_release(2);
    pthread_mutex_init(&ident_lock, NULL);
    hm__ipc_export_atfork_child();
}

static void ipc_init_once(void) {
    hm__ipc_export_max = env_size("HM_IPC_EXPORT_CACHE_MAX", 1024);
    if (!hm__ipc_export_max) hm__ipc_export_max = 1;
    hm__ipc_import_init(env_size("HM_IPC_CACHE_MAX_ENTRIES", 4096),
                        env_size("HM_IPC_CACHE_MAX_BYTES", 0));
    /* The fork hooks (hm__ipc_atfork_*) are the IPC slot of the library's
     * fork list, filled at the library's set-up (init.c). */
}
void hm__ipc_lazy_init(void) {
    hm__init();
    pthread_once(&ipc_once, ipc_init_once);
}

/* ------------------------------------------------------------------------ */
/* small public calls                                                       */

size_t hm_ipc_handle_size(void) { return HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX; }

hm_result_t hm_ipc_handle_length(const void *bytes, size_t avail, size_t *length) {
    if (!bytes || !length) {
        HM_LOG_ERROR("hm_ipc_handle_length: NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return hm__wire_length(bytes, avail, length);
}

hm_result_t hm_ipc_handle_info(const hm_ipc_handle_t *handle, size_t size,
                               hm_ipc_handle_info_t *info) {
    if (!handle || !info) {
        HM_LOG_ERROR("hm_ipc_handle_info: NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_wire_t w;
    hm_result_t r = hm__wire_decode(handle, size, &w);
    if (r) return r;
    info->family = (hm_provider_family_t)w.family;
    info->kind = (hm_memory_kind_t)w.kind;
    info->exporter_pid = w.pid;
    info->exporter_nonce = w.nonce;
    info->allocation_id = w.alloc_id;
    info->base = w.base;
    info->size = w.size;
    info->offset = w.offset;
    info->payload_size = w.payload_len;
    info->has_fd = (w.flags & HM__WIRE_HAS_FD) != 0;
    return HM_SUCCESS;
}

