/* hetmem tests — the fault-injecting pass-through provider.
 * SPDX-License-Identifier: MIT
 *
 * Wraps another provider (through its public front-end) and, per op:
 *   - counts every call (injected failures included);
 *   - fails the Nth call from arming (or every call) with a chosen result,
 *     without reaching the inner provider;
 *   - tracks the live allocations it handed out, exactly: free, purge, split
 *     and merge of a range that is not live are refused with
 *     HM_ERROR_INVALID_ARGUMENT, logged to stderr and counted as misuse, so a
 *     pool that frees the wrong size or twice is caught here.
 * The idea follows jemalloc's test extent hooks (test/include/test/extent_hooks.h),
 * which count calls and can be told to fail; nothing is copied.
 *
 * Concurrency: counters are atomics; the live-range table is under one mutex
 * (a test tool, not a hot path). An inner free runs after its range left the
 * table and the range is put back if the free fails, so an address the inner
 * provider hands out again is never in the table twice. */
#include "conformance.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define NBUCKETS 4096u

typedef struct frange {
    uintptr_t base;
    size_t size;
    struct frange *next;
} frange_t;

typedef struct fault {
    hm_provider_t *inner;
    int own_inner;
    hm_result_t fail_with;
    const char *name;
    _Atomic long calls[HM_FAULT_OP_COUNT];
    _Atomic long fail_at[HM_FAULT_OP_COUNT]; /* absolute call number; 0 never; -1 every */
    _Atomic long injected;
    _Atomic long misuse;
    pthread_mutex_t lock; /* guards buckets, live, live_bytes */
    frange_t *buckets[NBUCKETS];
    long live;
    size_t live_bytes;
} fault_t;

static void lock(fault_t *f) {
    if (pthread_mutex_lock(&f->lock) != 0) abort();
}
static void unlock(fault_t *f) {
    if (pthread_mutex_unlock(&f->lock) != 0) abort();
}

/* Count the call; 1 if this one is to fail. */
static int inject(fault_t *f, hm_fault_op_t op) {
    long n = atomic_fetch_add(&f->calls[op], 1) + 1;
    long at = atomic_load(&f->fail_at[op]);
    if (at == -1 || (at > 0 && n == at)) {
        atomic_fetch_add(&f->injected, 1);
        return 1;
    }
    return 0;
}

static void misuse(fault_t *f, const char *what, const void *ptr, size_t size) {
    atomic_fetch_add(&f->misuse, 1);
    fprintf(stderr, "fault provider '%s': %s of [%p, +%zu), which is not a live allocation\n",
            f->name, what, ptr, size);
    fflush(stderr);
}

/* ---- the live-range table (callers hold f->lock) ---- */

static unsigned bucket_of(uintptr_t base) {
    uint64_t h = (uint64_t)base * 0x9e3779b97f4a7c15ull; /* Fibonacci hashing (Knuth, TAOCP 6.4) */
    return (unsigned)(h >> 52) & (NBUCKETS - 1);
}

static frange_t **find_slot(fault_t *f, uintptr_t base) {
    frange_t **pp = &f->buckets[bucket_of(base)];
    while (*pp && (*pp)->base != base) pp = &(*pp)->next;
    return pp;
}

static void table_insert(fault_t *f, frange_t *r) {
    unsigned b = bucket_of(r->base);
    r->next = f->buckets[b];
    f->buckets[b] = r;
    f->live++;
    f->live_bytes += r->size;
}

static frange_t *table_unlink(fault_t *f, frange_t **pp) {
    frange_t *r = *pp;
    *pp = r->next;
    r->next = NULL;
    f->live--;
    f->live_bytes -= r->size;
    return r;
}

/* Is [p, p+size) inside one live range? */
static int table_contains(fault_t *f, uintptr_t p, size_t size) {
    frange_t *e = *find_slot(f, p);
    if (e && size <= e->size) return 1;
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (e = f->buckets[b]; e; e = e->next)
            if (p >= e->base && p - e->base <= e->size && size <= e->size - (p - e->base))
                return 1;
    return 0;
}

/* ---- ops ---- */

static hm_result_t fault_init(const void *params, void **state) {
    const hm_fault_params_t *fp = params;
    if (!fp || !fp->inner) {
        fprintf(stderr, "fault provider: params%s is NULL\n", fp ? "->inner" : "");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < HM_FAULT_OP_COUNT; i++)
        if (fp->fail_nth[i] < -1) return HM_ERROR_INVALID_ARGUMENT;
    fault_t *f = calloc(1, sizeof(*f));
    if (!f) return HM_ERROR_OUT_OF_HOST_MEMORY;
    if (pthread_mutex_init(&f->lock, NULL) != 0) {
        free(f);
        return HM_ERROR_UNKNOWN;
    }
    f->inner = fp->inner;
    f->own_inner = fp->own_inner;
    f->fail_with = fp->fail_with ? fp->fail_with : HM_ERROR_OUT_OF_MEMORY;
    f->name = fp->name ? fp->name : "fault";
    for (int i = 0; i < HM_FAULT_OP_COUNT; i++) atomic_init(&f->fail_at[i], fp->fail_nth[i]);
    *state = f;
    return HM_SUCCESS;
}

static void fault_fini(void *state) {
    fault_t *f = state;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        frange_t *e = f->buckets[b];
        while (e) {
            frange_t *n = e->next;
            free(e);
            e = n;
        }
    }
    if (f->own_inner) {
        hm_result_t r = hm_provider_destroy(f->inner);
        if (r != HM_SUCCESS)
            fprintf(stderr, "fault provider: destroying the inner provider -> %s\n",
                    hm_result_string(r));
    }
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static void fault_get_info(void *state, hm_provider_info_t *info) {
    fault_t *f = state;
    hm_provider_get_info(f->inner, info);
    info->name = f->name;
}

static hm_result_t fault_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_ALLOC)) return f->fail_with;
    frange_t *r = malloc(sizeof(*r));
    if (!r) return HM_ERROR_OUT_OF_HOST_MEMORY;
    hm_result_t res = hm_provider_alloc(f->inner, size, alignment, ptr);
    if (res != HM_SUCCESS) {
        free(r);
        return res;
    }
    r->base = (uintptr_t)*ptr;
    r->size = size;
    lock(f);
    int dup = *find_slot(f, r->base) != NULL;
    if (!dup) table_insert(f, r);
    unlock(f);
    if (dup) { /* the inner provider handed out a live address again */
        misuse(f, "alloc (address already live)", *ptr, size);
        free(r);
    }
    return HM_SUCCESS;
}

static hm_result_t fault_free(void *state, void *ptr, size_t size) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_FREE)) return f->fail_with;
    lock(f);
    frange_t **pp = find_slot(f, (uintptr_t)ptr);
    frange_t *r = (*pp && (*pp)->size == size) ? table_unlink(f, pp) : NULL;
    unlock(f);
    if (!r) {
        misuse(f, "free", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t res = hm_provider_free(f->inner, ptr, size);
    if (res != HM_SUCCESS) { /* still allocated: keep it live */
        lock(f);
        table_insert(f, r);
        unlock(f);
        return res;
    }
    free(r);
    return HM_SUCCESS;
}

static hm_result_t purge(fault_t *f, void *ptr, size_t size, int force) {
    if (inject(f, force ? HM_FAULT_PURGE_FORCE : HM_FAULT_PURGE_LAZY)) return f->fail_with;
    lock(f);
    int ok = table_contains(f, (uintptr_t)ptr, size);
    unlock(f);
    if (!ok) {
        misuse(f, force ? "purge_force" : "purge_lazy", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return force ? hm_provider_purge_force(f->inner, ptr, size)
                 : hm_provider_purge_lazy(f->inner, ptr, size);
}

static hm_result_t fault_purge_lazy(void *state, void *ptr, size_t size) {
    return purge(state, ptr, size, 0);
}
static hm_result_t fault_purge_force(void *state, void *ptr, size_t size) {
    return purge(state, ptr, size, 1);
}

static hm_result_t fault_split(void *state, void *ptr, size_t total, size_t first) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_SPLIT)) return f->fail_with;
    frange_t *hi = malloc(sizeof(*hi));
    if (!hi) return HM_ERROR_OUT_OF_HOST_MEMORY;
    /* Hold the lock across the inner call: the range must not be freed or
     * split by another thread in between (pools do not do that, but a broken
     * one would corrupt the table). */
    lock(f);
    frange_t **pp = find_slot(f, (uintptr_t)ptr);
    if (!*pp || (*pp)->size != total) {
        unlock(f);
        free(hi);
        misuse(f, "split", ptr, total);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t res = hm_provider_split(f->inner, ptr, total, first);
    if (res == HM_SUCCESS) {
        frange_t *lo = table_unlink(f, pp);
        lo->size = first;
        table_insert(f, lo);
        hi->base = (uintptr_t)ptr + first;
        hi->size = total - first;
        table_insert(f, hi);
        hi = NULL;
    }
    unlock(f);
    free(hi);
    return res;
}

static hm_result_t fault_merge(void *state, void *lo, void *hi, size_t total) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_MERGE)) return f->fail_with;
    size_t lo_size = (size_t)((uintptr_t)hi - (uintptr_t)lo);
    lock(f);
    frange_t **plo = find_slot(f, (uintptr_t)lo);
    frange_t **phi = find_slot(f, (uintptr_t)hi);
    if (!*plo || (*plo)->size != lo_size || !*phi || (*phi)->size != total - lo_size) {
        unlock(f);
        misuse(f, "merge", lo, total);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t res = hm_provider_merge(f->inner, lo, hi, total);
    frange_t *gone = NULL;
    if (res == HM_SUCCESS) {
        gone = table_unlink(f, phi);
        plo = find_slot(f, (uintptr_t)lo); /* the unlink may have moved it */
        frange_t *l = table_unlink(f, plo);
        l->size = total;
        table_insert(f, l);
    }
    unlock(f);
    free(gone);
    return res;
}

/* IPC: straight to the inner provider's ops (the IPC layer calls ops, not a
 * front-end), with counting and injection. */
static const hm_provider_ops_t *inner_ops(fault_t *f) { return hm_provider_get_ops(f->inner); }

static size_t fault_ipc_handle_size(void *state) {
    fault_t *f = state;
    const hm_provider_ops_t *o = inner_ops(f);
    return o && o->ipc.handle_size ? o->ipc.handle_size(hm_provider_get_state(f->inner)) : 0;
}

static hm_result_t fault_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_GET)) return f->fail_with;
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.get) return HM_ERROR_NOT_SUPPORTED;
    return o->ipc.get(hm_provider_get_state(f->inner), ptr, size, payload, fd);
}

static hm_result_t fault_ipc_put(void *state, void *payload) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_PUT)) return f->fail_with;
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.put) return HM_ERROR_NOT_SUPPORTED;
    return o->ipc.put(hm_provider_get_state(f->inner), payload);
}

static hm_result_t fault_ipc_open(void *state, const void *payload, int fd, size_t size,
                                  void **ptr) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_OPEN)) return f->fail_with;
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.open) return HM_ERROR_NOT_SUPPORTED;
    return o->ipc.open(hm_provider_get_state(f->inner), payload, fd, size, ptr);
}

static hm_result_t fault_ipc_close(void *state, void *ptr, size_t size) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_CLOSE)) return f->fail_with;
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.close) return HM_ERROR_NOT_SUPPORTED;
    return o->ipc.close(hm_provider_get_state(f->inner), ptr, size);
}

static const hm_provider_ops_t fault_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fault",
    .init = fault_init,
    .fini = fault_fini,
    .get_info = fault_get_info,
    .alloc = fault_alloc,
    .free = fault_free,
    .purge_lazy = fault_purge_lazy,
    .purge_force = fault_purge_force,
    .split = fault_split,
    .merge = fault_merge,
    .ipc =
        {
            .handle_size = fault_ipc_handle_size,
            .get = fault_ipc_get,
            .put = fault_ipc_put,
            .open = fault_ipc_open,
            .close = fault_ipc_close,
        },
};

/* The same wrapper without free: a provider that cannot take memory back,
 * like file or devdax media that cannot release ranges. */
static const hm_provider_ops_t fault_nofree_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fault-nofree",
    .init = fault_init,
    .fini = fault_fini,
    .get_info = fault_get_info,
    .alloc = fault_alloc,
    .purge_lazy = fault_purge_lazy,
    .purge_force = fault_purge_force,
};

const hm_provider_ops_t *hm_fault_provider_ops(void) { return &fault_ops; }
const hm_provider_ops_t *hm_fault_provider_nofree_ops(void) { return &fault_nofree_ops; }

/* The front-end keeps a copy of the ops table, so recognise ours by an op. */
static fault_t *fault_of(hm_provider_t *p) {
    const hm_provider_ops_t *o = hm_provider_get_ops(p);
    if (!o || o->alloc != fault_alloc) return NULL;
    return hm_provider_get_state(p);
}

long hm_fault_provider_calls(hm_provider_t *p, hm_fault_op_t op) {
    fault_t *f = fault_of(p);
    if (!f || (int)op < 0 || op >= HM_FAULT_OP_COUNT) return -1;
    return atomic_load(&f->calls[op]);
}

long hm_fault_provider_live(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    if (!f) return -1;
    lock(f);
    long n = f->live;
    unlock(f);
    return n;
}

size_t hm_fault_provider_live_bytes(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    if (!f) return 0;
    lock(f);
    size_t n = f->live_bytes;
    unlock(f);
    return n;
}

long hm_fault_provider_misuse(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    return f ? atomic_load(&f->misuse) : -1;
}

long hm_fault_provider_injected(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    return f ? atomic_load(&f->injected) : -1;
}

void hm_fault_provider_arm(hm_provider_t *p, hm_fault_op_t op, long nth) {
    fault_t *f = fault_of(p);
    if (!f || (int)op < 0 || op >= HM_FAULT_OP_COUNT || nth < -1) {
        fprintf(stderr, "hm_fault_provider_arm: bad arguments (op %d, nth %ld)\n", (int)op, nth);
        return;
    }
    long at = nth <= 0 ? nth : atomic_load(&f->calls[op]) + nth;
    atomic_store(&f->fail_at[op], at);
}

void hm_fault_provider_disarm(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    if (!f) return;
    for (int i = 0; i < HM_FAULT_OP_COUNT; i++) atomic_store(&f->fail_at[i], 0);
}
