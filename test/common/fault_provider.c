/* hetmem tests — the fault-injecting pass-through provider.
 * SPDX-License-Identifier: MIT
 *
 * Wraps another provider and forwards the ops of its table: alloc, free,
 * both purges, split, merge and get_device through the inner provider's
 * public front-end (not fill, copy or ipc_compatible: a static table would
 * claim them for every inner provider); the ipc sub-table (handle_size, get, put, open, close,
 * close_many) straight to the inner ops, as the IPC layer calls them. Per op
 * (hm_fault_op_t; init, fini and get_info run once, at create and destroy):
 *   - counts every call (injected failures included) and every call that
 *     succeeded;
 *   - fails the Nth call from arming (or every call) with a chosen result,
 *     without reaching the inner provider;
 *   - tracks the live allocations it handed out, exactly: free, purge, split
 *     and merge of a range that is not live are refused with
 *     HM_ERROR_INVALID_ARGUMENT, logged to stderr and counted as misuse, so a
 *     pool that frees the wrong size or twice is caught here;
 *   - tracks the mappings ipc.open made the same way (a close or close_many
 *     of one it did not make is misuse) and the exports ipc.get made that
 *     ipc.put has not given back, so a leak check can ask what the inner
 *     provider still holds.
 * The idea follows jemalloc's test extent hooks (test/include/test/extent_hooks.h),
 * which count calls and can be told to fail; nothing is copied.
 *
 * Concurrency: counters are atomics; the live-range and mapping tables are
 * under one mutex (a test tool, not a hot path). An inner free or close runs
 * after its range left the table and the range is put back if it fails, so
 * an address the inner provider hands out again is never in a table twice. */
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
    const char *name;
    hm_result_t fail_default; /* params' fail_with (0: HM_ERROR_OUT_OF_MEMORY) */
    _Atomic long calls[HM_FAULT_OP_COUNT];
    _Atomic long succeeded[HM_FAULT_OP_COUNT];
    _Atomic long fail_at[HM_FAULT_OP_COUNT]; /* absolute call number; 0 never; -1 every */
    _Atomic int fail_with[HM_FAULT_OP_COUNT]; /* hm_result_t of an injected failure */
    _Atomic long injected;
    _Atomic long misuse;
    _Atomic long exports; /* ipc.get successes minus ipc.put successes */
    pthread_mutex_t lock; /* guards buckets, live, live_bytes, mapped, mappings */
    frange_t *buckets[NBUCKETS]; /* live allocations */
    long live;
    size_t live_bytes;
    frange_t *mapped[NBUCKETS]; /* mappings ipc.open made, not yet closed */
    long mappings;
} fault_t;

static void lock(fault_t *f) {
    if (pthread_mutex_lock(&f->lock) != 0) abort();
}
static void unlock(fault_t *f) {
    if (pthread_mutex_unlock(&f->lock) != 0) abort();
}

/* Count the call; 1 if this one is to fail (with injected(f, op)). */
static int inject(fault_t *f, hm_fault_op_t op) {
    long n = atomic_fetch_add(&f->calls[op], 1) + 1;
    long at = atomic_load(&f->fail_at[op]);
    if (at == -1 || (at > 0 && n == at)) {
        atomic_fetch_add(&f->injected, 1);
        return 1;
    }
    return 0;
}

static hm_result_t injected(fault_t *f, hm_fault_op_t op) {
    return (hm_result_t)atomic_load(&f->fail_with[op]);
}

/* Count a success of op; pass the result through. */
static hm_result_t done(fault_t *f, hm_fault_op_t op, hm_result_t r) {
    if (r == HM_SUCCESS) atomic_fetch_add(&f->succeeded[op], 1);
    return r;
}

static void misuse_of(fault_t *f, const char *what, const void *ptr, size_t size,
                      const char *is_not) {
    atomic_fetch_add(&f->misuse, 1);
    fprintf(stderr, "fault provider '%s': %s of [%p, +%zu), which is not %s\n", f->name, what,
            ptr, size, is_not);
    fflush(stderr);
}
static void misuse(fault_t *f, const char *what, const void *ptr, size_t size) {
    misuse_of(f, what, ptr, size, "a live allocation");
}

/* ---- the live-range table (callers hold f->lock) ---- */

static unsigned bucket_of(uintptr_t base) {
    uint64_t h = (uint64_t)base * 0x9e3779b97f4a7c15ull; /* Fibonacci hashing (Knuth, TAOCP 6.4) */
    return (unsigned)(h >> 52) & (NBUCKETS - 1);
}

static frange_t **find_in(frange_t **table, uintptr_t base) {
    frange_t **pp = &table[bucket_of(base)];
    while (*pp && (*pp)->base != base) pp = &(*pp)->next;
    return pp;
}
static frange_t **find_slot(fault_t *f, uintptr_t base) { return find_in(f->buckets, base); }

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
    f->name = fp->name ? fp->name : "fault";
    f->fail_default = fp->fail_with ? fp->fail_with : HM_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < HM_FAULT_OP_COUNT; i++) {
        atomic_init(&f->fail_at[i], fp->fail_nth[i]);
        atomic_init(&f->fail_with[i], (int)f->fail_default);
    }
    *state = f;
    return HM_SUCCESS;
}

static void table_free(frange_t **table) {
    for (unsigned b = 0; b < NBUCKETS; b++) {
        frange_t *e = table[b];
        while (e) {
            frange_t *n = e->next;
            free(e);
            e = n;
        }
    }
}

static void fault_fini(void *state) {
    fault_t *f = state;
    table_free(f->buckets);
    table_free(f->mapped);
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

static void fault_get_device(void *state, hm_device_id_t *device) {
    fault_t *f = state;
    hm_provider_get_device(f->inner, device);
}

static hm_result_t fault_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_ALLOC)) return injected(f, HM_FAULT_ALLOC);
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
    return done(f, HM_FAULT_ALLOC, HM_SUCCESS);
}

static hm_result_t fault_free(void *state, void *ptr, size_t size) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_FREE)) return injected(f, HM_FAULT_FREE);
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
    return done(f, HM_FAULT_FREE, HM_SUCCESS);
}

static hm_result_t purge(fault_t *f, void *ptr, size_t size, int force) {
    hm_fault_op_t op = force ? HM_FAULT_PURGE_FORCE : HM_FAULT_PURGE_LAZY;
    if (inject(f, op)) return injected(f, op);
    lock(f);
    int ok = table_contains(f, (uintptr_t)ptr, size);
    unlock(f);
    if (!ok) {
        misuse(f, force ? "purge_force" : "purge_lazy", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return done(f, op, force ? hm_provider_purge_force(f->inner, ptr, size)
                                 : hm_provider_purge_lazy(f->inner, ptr, size));
}

static hm_result_t fault_purge_lazy(void *state, void *ptr, size_t size) {
    return purge(state, ptr, size, 0);
}
static hm_result_t fault_purge_force(void *state, void *ptr, size_t size) {
    return purge(state, ptr, size, 1);
}

static hm_result_t fault_split(void *state, void *ptr, size_t total, size_t first) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_SPLIT)) return injected(f, HM_FAULT_SPLIT);
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
    return done(f, HM_FAULT_SPLIT, res);
}

static hm_result_t fault_merge(void *state, void *lo, void *hi, size_t total) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_MERGE)) return injected(f, HM_FAULT_MERGE);
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
    return done(f, HM_FAULT_MERGE, res);
}

/* ---- IPC: straight to the inner provider's ops (the IPC layer calls ops,
 * not a front-end), counted and injectable ---- */

static const hm_provider_ops_t *inner_ops(fault_t *f) { return hm_provider_get_ops(f->inner); }
static void *inner_state(fault_t *f) { return hm_provider_get_state(f->inner); }

/* An injected failure answers a payload size no handle may carry
 * (HM_IPC_PAYLOAD_MAX + 1): the op has no result code, and a size smaller
 * than what get() writes would be the wrapper's own buffer overflow, not a
 * fault of the provider. */
static size_t fault_ipc_handle_size(void *state) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_HANDLE_SIZE)) return (size_t)HM_IPC_PAYLOAD_MAX + 1;
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.handle_size) return 0;
    (void)done(f, HM_FAULT_IPC_HANDLE_SIZE, HM_SUCCESS);
    return o->ipc.handle_size(inner_state(f));
}

static hm_result_t fault_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_GET)) return injected(f, HM_FAULT_IPC_GET);
    lock(f);
    int ok = table_contains(f, (uintptr_t)ptr, size);
    unlock(f);
    if (!ok) { /* exporting memory that is not a live allocation */
        misuse(f, "ipc.get", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.get) return HM_ERROR_NOT_SUPPORTED;
    hm_result_t r = o->ipc.get(inner_state(f), ptr, size, payload, fd);
    if (r == HM_SUCCESS) atomic_fetch_add(&f->exports, 1);
    return done(f, HM_FAULT_IPC_GET, r);
}

static hm_result_t fault_ipc_put(void *state, void *payload) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_PUT)) return injected(f, HM_FAULT_IPC_PUT);
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.put) return HM_ERROR_NOT_SUPPORTED;
    hm_result_t r = o->ipc.put(inner_state(f), payload);
    if (r == HM_SUCCESS) atomic_fetch_sub(&f->exports, 1);
    return done(f, HM_FAULT_IPC_PUT, r);
}

static hm_result_t fault_ipc_open(void *state, const void *payload, int fd, size_t size,
                                  void **ptr) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_OPEN)) return injected(f, HM_FAULT_IPC_OPEN);
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.open) return HM_ERROR_NOT_SUPPORTED;
    frange_t *m = malloc(sizeof(*m));
    if (!m) return HM_ERROR_OUT_OF_HOST_MEMORY;
    hm_result_t r = o->ipc.open(inner_state(f), payload, fd, size, ptr);
    if (r != HM_SUCCESS || !*ptr) {
        free(m);
        return r;
    }
    m->base = (uintptr_t)*ptr;
    m->size = size;
    lock(f);
    frange_t **pp = find_in(f->mapped, m->base);
    int dup = *pp != NULL;
    if (!dup) {
        m->next = NULL;
        *pp = m;
        f->mappings++;
    }
    unlock(f);
    if (dup) {
        misuse(f, "ipc.open (address already mapped)", *ptr, size);
        free(m);
    }
    return done(f, HM_FAULT_IPC_OPEN, HM_SUCCESS);
}

/* Take the record of the mapping ipc.open made at ptr with this size, or
 * NULL (misuse, logged). */
static frange_t *mapping_take(fault_t *f, void *ptr, size_t size, const char *what) {
    lock(f);
    frange_t **pp = find_in(f->mapped, (uintptr_t)ptr);
    frange_t *m = *pp && (*pp)->size == size ? *pp : NULL;
    if (m) {
        *pp = m->next;
        m->next = NULL;
        f->mappings--;
    }
    unlock(f);
    if (!m) misuse_of(f, what, ptr, size, "a mapping ipc.open made (of that size)");
    return m;
}

static void mapping_put_back(fault_t *f, frange_t *m) {
    lock(f);
    frange_t **pp = find_in(f->mapped, m->base);
    m->next = *pp;
    *pp = m;
    f->mappings++;
    unlock(f);
}

static hm_result_t fault_ipc_close(void *state, void *ptr, size_t size) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_CLOSE)) return injected(f, HM_FAULT_IPC_CLOSE);
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.close) return HM_ERROR_NOT_SUPPORTED;
    frange_t *m = mapping_take(f, ptr, size, "ipc.close");
    if (!m) return HM_ERROR_INVALID_ARGUMENT;
    hm_result_t r = o->ipc.close(inner_state(f), ptr, size);
    if (r != HM_SUCCESS) { /* still mapped: keep the record */
        mapping_put_back(f, m);
        return r;
    }
    free(m);
    return done(f, HM_FAULT_IPC_CLOSE, HM_SUCCESS);
}

/* The inner provider's close_many where it has one, else close() each (what
 * the IPC layer does without close_many). An injected failure closes
 * nothing. Mappings it did not make are misuse and are not passed on; the
 * rest is, and the first error is returned. After a failed inner
 * close_many the records of all its mappings go (the contract: it closes
 * every one it can). */
static hm_result_t fault_ipc_close_many(void *state, void *const *ptrs, const size_t *sizes,
                                        size_t n) {
    fault_t *f = state;
    if (inject(f, HM_FAULT_IPC_CLOSE_MANY)) return injected(f, HM_FAULT_IPC_CLOSE_MANY);
    const hm_provider_ops_t *o = inner_ops(f);
    if (!o || !o->ipc.close) return HM_ERROR_NOT_SUPPORTED;
    void **p = malloc((n ? n : 1) * sizeof(*p));
    size_t *z = malloc((n ? n : 1) * sizeof(*z));
    frange_t **m = malloc((n ? n : 1) * sizeof(*m));
    if (!p || !z || !m) {
        free(p);
        free(z);
        free(m);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    hm_result_t res = HM_SUCCESS;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        frange_t *r = mapping_take(f, ptrs[i], sizes[i], "ipc.close_many");
        if (!r) {
            if (res == HM_SUCCESS) res = HM_ERROR_INVALID_ARGUMENT;
            continue;
        }
        p[k] = ptrs[i];
        z[k] = sizes[i];
        m[k++] = r;
    }
    if (o->ipc.close_many) {
        hm_result_t r = k ? o->ipc.close_many(inner_state(f), p, z, k) : HM_SUCCESS;
        if (res == HM_SUCCESS) res = r;
        for (size_t i = 0; i < k; i++) free(m[i]);
    } else {
        for (size_t i = 0; i < k; i++) {
            hm_result_t r = o->ipc.close(inner_state(f), p[i], z[i]);
            if (r != HM_SUCCESS) mapping_put_back(f, m[i]);
            else free(m[i]);
            if (res == HM_SUCCESS) res = r;
        }
    }
    free(p);
    free(z);
    free(m);
    return done(f, HM_FAULT_IPC_CLOSE_MANY, res);
}

/* The tables: every op, or without free (a provider that cannot take memory
 * back, like some device media), each with or without close_many (the IPC
 * layer closes one by one without it, as for the file and devdax
 * providers). The wrapper without free has no split and merge either: the
 * pools' suites run it as the case of a provider that can neither give
 * memory back nor re-cut its ranges. */
#define FAULT_IPC(close_many_op)                                                              \
    {                                                                                        \
        .handle_size = fault_ipc_handle_size, .get = fault_ipc_get, .put = fault_ipc_put,    \
        .open = fault_ipc_open, .close = fault_ipc_close, .close_many = close_many_op,       \
    }

static const hm_provider_ops_t fault_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fault",
    .init = fault_init,
    .fini = fault_fini,
    .get_info = fault_get_info,
    .get_device = fault_get_device,
    .alloc = fault_alloc,
    .free = fault_free,
    .purge_lazy = fault_purge_lazy,
    .purge_force = fault_purge_force,
    .split = fault_split,
    .merge = fault_merge,
    .ipc = FAULT_IPC(fault_ipc_close_many),
};

static const hm_provider_ops_t fault_ops_close_each = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fault",
    .init = fault_init,
    .fini = fault_fini,
    .get_info = fault_get_info,
    .get_device = fault_get_device,
    .alloc = fault_alloc,
    .free = fault_free,
    .purge_lazy = fault_purge_lazy,
    .purge_force = fault_purge_force,
    .split = fault_split,
    .merge = fault_merge,
    .ipc = FAULT_IPC(NULL),
};

static const hm_provider_ops_t fault_nofree_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fault-nofree",
    .init = fault_init,
    .fini = fault_fini,
    .get_info = fault_get_info,
    .get_device = fault_get_device,
    .alloc = fault_alloc,
    .purge_lazy = fault_purge_lazy,
    .purge_force = fault_purge_force,
    .ipc = FAULT_IPC(fault_ipc_close_many),
};

static const hm_provider_ops_t fault_nofree_ops_close_each = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fault-nofree",
    .init = fault_init,
    .fini = fault_fini,
    .get_info = fault_get_info,
    .get_device = fault_get_device,
    .alloc = fault_alloc,
    .purge_lazy = fault_purge_lazy,
    .purge_force = fault_purge_force,
    .ipc = FAULT_IPC(NULL),
};

const hm_provider_ops_t *hm_fault_provider_ops(void) { return &fault_ops; }
const hm_provider_ops_t *hm_fault_provider_nofree_ops(void) { return &fault_nofree_ops; }

const hm_provider_ops_t *hm_fault_provider_ops_for(const hm_provider_t *inner, int nofree) {
    const hm_provider_ops_t *o = hm_provider_get_ops(inner);
    int each = !o || !o->ipc.close_many;
    if (nofree) return each ? &fault_nofree_ops_close_each : &fault_nofree_ops;
    return each ? &fault_ops_close_each : &fault_ops;
}

/* The front-end keeps a copy of the ops table, so recognise ours by an op. */
static fault_t *fault_of(hm_provider_t *p) {
    const hm_provider_ops_t *o = hm_provider_get_ops(p);
    if (!o || o->alloc != fault_alloc) return NULL;
    return hm_provider_get_state(p);
}

static int op_ok(hm_fault_op_t op) { return (int)op >= 0 && op < HM_FAULT_OP_COUNT; }

long hm_fault_provider_calls(hm_provider_t *p, hm_fault_op_t op) {
    fault_t *f = fault_of(p);
    if (!f || !op_ok(op)) return -1;
    return atomic_load(&f->calls[op]);
}

long hm_fault_provider_succeeded(hm_provider_t *p, hm_fault_op_t op) {
    fault_t *f = fault_of(p);
    if (!f || !op_ok(op)) return -1;
    return atomic_load(&f->succeeded[op]);
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

long hm_fault_provider_exports(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    return f ? atomic_load(&f->exports) : -1;
}

long hm_fault_provider_mappings(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    if (!f) return -1;
    lock(f);
    long n = f->mappings;
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

void hm_fault_provider_arm_with(hm_provider_t *p, hm_fault_op_t op, long nth, hm_result_t result) {
    fault_t *f = fault_of(p);
    if (!f || !op_ok(op) || nth < -1 || result == HM_SUCCESS) {
        fprintf(stderr, "hm_fault_provider_arm: bad arguments (op %d, nth %ld, result %d)\n",
                (int)op, nth, (int)result);
        return;
    }
    atomic_store(&f->fail_with[op], (int)result);
    long at = nth <= 0 ? nth : atomic_load(&f->calls[op]) + nth;
    atomic_store(&f->fail_at[op], at);
}

void hm_fault_provider_arm(hm_provider_t *p, hm_fault_op_t op, long nth) {
    fault_t *f = fault_of(p);
    hm_fault_provider_arm_with(p, op, nth, f ? f->fail_default : HM_ERROR_OUT_OF_MEMORY);
}

void hm_fault_provider_disarm(hm_provider_t *p) {
    fault_t *f = fault_of(p);
    if (!f) return;
    for (int i = 0; i < HM_FAULT_OP_COUNT; i++) atomic_store(&f->fail_at[i], 0);
}
