/* hetmem tests — a 'device' provider: memory the CPU must not touch.
 * SPDX-License-Identifier: MIT
 *
 * Each allocation is a memfd mapped twice: the address handed out is a
 * PROT_NONE view (any load or store by the CPU faults, as on device
 * memory), and a private read-write view of the same pages is what the
 * provider's fill and copy use, as a DMA engine would. It reports
 * HM_MEMORY_DEVICE, no CPU access, a device ordinal and UUID (params), and
 * a memory limit beyond which alloc answers HM_ERROR_OUT_OF_MEMORY.
 *
 * IPC, like a GPU driver's: ipc.get of an allocation's base passes its
 * memfd; the payload names the exporting device's UUID; ipc_compatible and
 * ipc.open accept the provider's own UUID and its configured peers and
 * refuse others with HM_ERROR_NOT_SUPPORTED; an opened mapping is device
 * memory of the importer (fill and copy work on it). Providers made with
 * one nonzero params.context share a driver context: its mappings belong
 * to all of them, and an allocation is opened at most once in it.
 *
 * Test hooks: counts fill and copy calls, fails the Nth one on request (with
 * HM_ERROR_DRIVER, touching nothing), counts live allocations and mappings,
 * and refuses (HM_ERROR_INVALID_ARGUMENT, logged to stderr, counted as
 * misuse) any op on a range that is not one of its own.
 *
 * Concurrency: counters are atomics; the table of allocations is under the
 * provider's mutex, the table of mappings under its context's (ctx_lock
 * guards the list of contexts and their users), each held for lookups and
 * updates only (a fill or copy runs unlocked: its
 * caller keeps the range alive). */
#include "conformance.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEV_MAGIC 0x68646576u /* "hdev" */

typedef struct drange {
    uintptr_t base;  /* the PROT_NONE view */
    char *alias;     /* the read-write view */
    size_t len;      /* mapped bytes (a multiple of the page) */
    size_t size;     /* as asked (alloc) or opened */
    int fd;          /* the memfd; -1 for mappings (ipc.open) */
    int imported;
    dev_t fdev;      /* mappings: the file opened (a second open of it fails) */
    ino_t fino;
} drange_t;

/* Ranges sorted by base. */
typedef struct dtable {
    drange_t *r;
    size_t n, cap;
} dtable_t;

/* A driver context: the opened IPC mappings of its providers. Shared by
 * the providers made with one nonzero params.context (ctx_list), private
 * to a provider made with 0. */
typedef struct dctx {
    uint64_t key;
    int users;            /* ctx_lock */
    pthread_mutex_t lock; /* guards t */
    dtable_t t;
    _Atomic long mappings;
    struct dctx *next;    /* ctx_list (ctx_lock) */
} dctx_t;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static dctx_t *ctx_list;

typedef struct dev {
    hm_test_device_params_t p;
    size_t page, rec_page, capacity;
    pthread_mutex_t lock; /* guards t (its own allocations), used */
    dtable_t t;
    size_t used;
    dctx_t *cx;           /* its mappings */
    _Atomic long calls[HM_TEST_DEVICE_OP_COUNT];
    _Atomic long fail_at[HM_TEST_DEVICE_OP_COUNT]; /* absolute call number; 0 never */
    _Atomic long misuse, allocs;
} tdev_t;

typedef struct dev_payload {
    uint32_t magic;
    int32_t ordinal;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    uint64_t len, size;
} dev_payload_t;

static void mx_lock(pthread_mutex_t *m) {
    if (pthread_mutex_lock(m) != 0) abort();
}
static void mx_unlock(pthread_mutex_t *m) {
    if (pthread_mutex_unlock(m) != 0) abort();
}
static void lock(tdev_t *d) { mx_lock(&d->lock); }
static void unlock(tdev_t *d) { mx_unlock(&d->lock); }

static void misuse(tdev_t *d, const char *what, const void *ptr, size_t size) {
    atomic_fetch_add(&d->misuse, 1);
    fprintf(stderr, "device provider '%s': %s of [%p, +%zu), which is not its memory\n",
            d->p.name, what, ptr, size);
    fflush(stderr);
}

/* Count the call of op; 1 if it is to fail. */
static int inject(tdev_t *d, hm_test_device_op_t op) {
    long n = atomic_fetch_add(&d->calls[op], 1) + 1;
    long at = atomic_load(&d->fail_at[op]);
    return at > 0 && n == at;
}

/* ---- range tables (callers hold the table's lock) ---- */

/* Index of the first range whose base is > addr. */
static size_t upper(const dtable_t *d, uintptr_t addr) {
    size_t lo = 0, hi = d->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->r[mid].base <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The range holding [addr, addr + size), or NULL; *partial set when the
 * bytes overlap one of the ranges without lying inside it. */
static drange_t *containing(dtable_t *d, uintptr_t addr, size_t size, int *partial) {
    *partial = 0;
    size_t i = upper(d, addr);
    if (i > 0) {
        drange_t *r = &d->r[i - 1];
        if (addr < r->base + r->len) {
            if (size <= r->base + r->len - addr) return r;
            *partial = 1;
            return NULL;
        }
    }
    if (i < d->n && d->r[i].base < addr + size) *partial = 1;
    return NULL;
}

static int table_insert(dtable_t *d, const drange_t *nr) {
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 64;
        drange_t *t = realloc(d->r, nc * sizeof(*t));
        if (!t) return 0;
        d->r = t;
        d->cap = nc;
    }
    size_t i = upper(d, nr->base);
    memmove(&d->r[i + 1], &d->r[i], (d->n - i) * sizeof(*d->r));
    d->r[i] = *nr;
    d->n++;
    return 1;
}

/* Take the range starting exactly at base (with `imported` as given). */
static int table_take(dtable_t *d, uintptr_t base, int imported, drange_t *out) {
    size_t i = upper(d, base);
    if (i == 0 || d->r[i - 1].base != base || d->r[i - 1].imported != imported) return 0;
    *out = d->r[i - 1];
    memmove(&d->r[i - 1], &d->r[i], (d->n - i) * sizeof(*d->r));
    d->n--;
    return 1;
}

/* ---- mappings ---- */

/* fd's first len bytes twice: a PROT_NONE view aligned to `align` (a power
 * of two, at least the page) and a read-write alias. */
static hm_result_t map_views(int fd, size_t len, size_t align, uintptr_t *base, char **alias) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (align < page) align = page;
    if (len > SIZE_MAX - align) return HM_ERROR_OUT_OF_MEMORY;
    size_t span = len + align - page;
    char *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) return HM_ERROR_OUT_OF_MEMORY;
    uintptr_t a = ((uintptr_t)res + align - 1) & ~(uintptr_t)(align - 1);
    if (mmap((void *)a, len, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(res, span);
        return HM_ERROR_OUT_OF_MEMORY;
    }
    if (a > (uintptr_t)res) munmap(res, a - (uintptr_t)res);
    uintptr_t end = (uintptr_t)res + span;
    if (a + len < end) munmap((void *)(a + len), end - (a + len));
    char *rw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (rw == MAP_FAILED) {
        munmap((void *)a, len);
        return HM_ERROR_OUT_OF_MEMORY;
    }
    *base = a;
    *alias = rw;
    return HM_SUCCESS;
}

static void unmap_views(const drange_t *r) {
    munmap((void *)r->base, r->len);
    munmap(r->alias, r->len);
}

/* ---- ops ---- */

static hm_result_t dev_init(const void *params, void **state) {
    const hm_test_device_params_t *p = params;
    tdev_t *d = calloc(1, sizeof(*d));
    if (!d) return HM_ERROR_OUT_OF_HOST_MEMORY;
    if (p) d->p = *p;
    else d->p.ordinal = 0;
    if (!d->p.name) d->p.name = "test-device";
    static const uint8_t zero[HM_DEVICE_UUID_SIZE];
    if (memcmp(d->p.uuid, zero, sizeof(zero)) == 0) { /* derived from the ordinal */
        memcpy(d->p.uuid, "hm-test-device", 14);
        d->p.uuid[14] = (uint8_t)(d->p.ordinal >> 8);
        d->p.uuid[15] = (uint8_t)d->p.ordinal;
    }
    size_t sys = (size_t)sysconf(_SC_PAGESIZE);
    d->page = d->p.page_size ? d->p.page_size : sys;
    if (d->page < sys || (d->page & (d->page - 1))) {
        free(d);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    d->rec_page = d->p.recommended_page_size ? d->p.recommended_page_size : (size_t)2 << 20;
    d->capacity = d->p.capacity ? d->p.capacity : (size_t)16 << 30;
    mx_lock(&ctx_lock);
    dctx_t *cx = NULL;
    for (cx = d->p.context ? ctx_list : NULL; cx && cx->key != d->p.context; cx = cx->next) {
    }
    if (!cx && (cx = calloc(1, sizeof(*cx)))) {
        cx->key = d->p.context;
        pthread_mutex_init(&cx->lock, NULL);
        if (cx->key) {
            cx->next = ctx_list;
            ctx_list = cx;
        }
    }
    if (cx) cx->users++;
    mx_unlock(&ctx_lock);
    if (!cx) {
        free(d);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    d->cx = cx;
    pthread_mutex_init(&d->lock, NULL);
    *state = d;
    return HM_SUCCESS;
}

static void table_fini(dtable_t *t) {
    for (size_t i = 0; i < t->n; i++) {
        unmap_views(&t->r[i]);
        if (t->r[i].fd >= 0) close(t->r[i].fd);
    }
    free(t->r);
}

static void dev_fini(void *state) {
    tdev_t *d = state;
    table_fini(&d->t);
    dctx_t *cx = d->cx;
    mx_lock(&ctx_lock);
    int last = --cx->users == 0;
    if (last && cx->key) {
        dctx_t **pp = &ctx_list;
        while (*pp != cx) pp = &(*pp)->next;
        *pp = cx->next;
    }
    mx_unlock(&ctx_lock);
    if (last) { /* the context goes with its last provider */
        table_fini(&cx->t);
        pthread_mutex_destroy(&cx->lock);
        free(cx);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static void dev_get_info(void *state, hm_provider_info_t *info) {
    tdev_t *d = state;
    memset(info, 0, sizeof(*info));
    info->name = d->p.name;
    info->family = HM_TEST_DEVICE_FAMILY;
    info->kind = HM_MEMORY_DEVICE;
    info->caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_PURGE_FORCE | HM_PROVIDER_CAP_IPC;
    info->min_page_size = d->page;
    info->recommended_page_size = d->rec_page;
}

static void dev_get_device(void *state, hm_device_id_t *device) {
    tdev_t *d = state;
    device->ordinal = d->p.ordinal;
    device->has_uuid = true;
    memcpy(device->uuid, d->p.uuid, sizeof(device->uuid));
}

static hm_result_t dev_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    tdev_t *d = state;
    size_t len = (size + d->page - 1) & ~(d->page - 1);
    if (len < size || len > d->capacity) return HM_ERROR_OUT_OF_MEMORY;
    lock(d);
    int fits = d->used <= d->capacity - len;
    if (fits) d->used += len; /* reserved */
    unlock(d);
    if (!fits) return HM_ERROR_OUT_OF_MEMORY;
    hm_result_t r = HM_ERROR_OUT_OF_MEMORY;
    drange_t nr = {.len = len, .size = size, .fd = -1};
    nr.fd = memfd_create("hm-test-device", MFD_CLOEXEC);
    if (nr.fd < 0) goto fail;
    if (ftruncate(nr.fd, (off_t)len) != 0) goto fail_fd;
    r = map_views(nr.fd, len, alignment > d->page ? alignment : d->page, &nr.base, &nr.alias);
    if (r != HM_SUCCESS) goto fail_fd;
    lock(d);
    int ok = table_insert(&d->t, &nr);
    unlock(d);
    if (!ok) {
        r = HM_ERROR_OUT_OF_HOST_MEMORY;
        goto fail_map;
    }
    atomic_fetch_add(&d->allocs, 1);
    *ptr = (void *)nr.base;
    return HM_SUCCESS;

fail_map:
    unmap_views(&nr);
fail_fd:
    close(nr.fd);
fail:
    lock(d);
    d->used -= len;
    unlock(d);
    return r;
}

static hm_result_t dev_free(void *state, void *ptr, size_t size) {
    tdev_t *d = state;
    drange_t r;
    lock(d);
    int ok = table_take(&d->t, (uintptr_t)ptr, 0, &r);
    if (ok && r.size != size) { /* another size than asked: put it back */
        table_insert(&d->t, &r);
        ok = 0;
    }
    if (ok) d->used -= r.len;
    unlock(d);
    if (!ok) {
        misuse(d, "free", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    unmap_views(&r);
    close(r.fd);
    atomic_fetch_sub(&d->allocs, 1);
    return HM_SUCCESS;
}

/* The read-write address of [ptr, ptr + size) of the provider's memory:
 * its allocations, or the mappings of its context. */
static char *alias_of(tdev_t *d, const void *ptr, size_t size, int *partial) {
    lock(d);
    drange_t *r = containing(&d->t, (uintptr_t)ptr, size, partial);
    char *a = r ? r->alias + ((uintptr_t)ptr - r->base) : NULL;
    unlock(d);
    if (a || *partial) return a;
    mx_lock(&d->cx->lock);
    r = containing(&d->cx->t, (uintptr_t)ptr, size, partial);
    a = r ? r->alias + ((uintptr_t)ptr - r->base) : NULL;
    mx_unlock(&d->cx->lock);
    return a;
}

static hm_result_t dev_purge_force(void *state, void *ptr, size_t size) {
    tdev_t *d = state;
    int partial;
    char *a = alias_of(d, ptr, size, &partial);
    if (!a) {
        misuse(d, "purge_force", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    /* Whole pages inside the range: their backing store goes (zero after). */
    uintptr_t lo = ((uintptr_t)a + d->page - 1) & ~(uintptr_t)(d->page - 1);
    uintptr_t hi = ((uintptr_t)a + size) & ~(uintptr_t)(d->page - 1);
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_REMOVE) != 0) return HM_ERROR_DRIVER;
    return HM_SUCCESS;
}

static hm_result_t dev_fill(void *state, void *ptr, uint8_t value, size_t size) {
    tdev_t *d = state;
    if (inject(d, HM_TEST_DEVICE_FILL)) return HM_ERROR_DRIVER;
    int partial;
    char *a = alias_of(d, ptr, size, &partial);
    if (!a) {
        misuse(d, "fill", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    memset(a, value, size);
    return HM_SUCCESS;
}

static hm_result_t dev_copy(void *state, void *dst, const void *src, size_t size) {
    tdev_t *d = state;
    if (inject(d, HM_TEST_DEVICE_COPY)) return HM_ERROR_DRIVER;
    int pd, ps;
    char *ad = alias_of(d, dst, size, &pd);
    char *as = alias_of(d, src, size, &ps);
    if (pd || ps) { /* straddles the edge of one of its ranges */
        misuse(d, "copy", pd ? dst : src, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    /* Not its memory: host memory of the process. */
    memcpy(ad ? ad : dst, as ? as : src, size);
    return HM_SUCCESS;
}

/* ---- IPC ---- */

static int can_open(const tdev_t *d, const uint8_t *uuid) {
    if (memcmp(uuid, d->p.uuid, HM_DEVICE_UUID_SIZE) == 0) return 1;
    for (int i = 0; i < d->p.npeers && i < HM_TEST_DEVICE_MAX_PEERS; i++)
        if (memcmp(uuid, d->p.peers[i], HM_DEVICE_UUID_SIZE) == 0) return 1;
    return 0;
}

static size_t dev_ipc_handle_size(void *state) {
    (void)state;
    return sizeof(dev_payload_t);
}

static hm_result_t dev_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    tdev_t *d = state;
    dev_payload_t pl = {.magic = DEV_MAGIC, .ordinal = d->p.ordinal};
    memcpy(pl.uuid, d->p.uuid, sizeof(pl.uuid));
    lock(d);
    size_t i = upper(&d->t, (uintptr_t)ptr);
    /* Like real drivers: the base of one of its own allocations only. */
    const drange_t *r = i > 0 ? &d->t.r[i - 1] : NULL;
    int ok = r && r->base == (uintptr_t)ptr && size <= r->len;
    if (ok) {
        pl.len = r->len;
        pl.size = size;
        *fd = r->fd;
    }
    unlock(d);
    if (!ok) {
        misuse(d, "ipc.get", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    memcpy(payload, &pl, sizeof(pl));
    atomic_fetch_add(&d->calls[HM_TEST_DEVICE_IPC_GET], 1);
    return HM_SUCCESS;
}

static hm_result_t dev_ipc_put(void *state, void *payload) {
    (void)state, (void)payload; /* the memfd lives with the allocation */
    return HM_SUCCESS;
}

static hm_result_t dev_ipc_compatible(void *state, const void *payload) {
    tdev_t *d = state;
    atomic_fetch_add(&d->calls[HM_TEST_DEVICE_IPC_COMPATIBLE], 1);
    dev_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != DEV_MAGIC || pl.size > pl.len) return HM_ERROR_INVALID_HANDLE;
    if (!can_open(d, pl.uuid)) {
        fprintf(stderr, "device provider '%s' (device %d): cannot open memory of device %d\n",
                d->p.name, (int)d->p.ordinal, (int)pl.ordinal);
        fflush(stderr);
        return HM_ERROR_NOT_SUPPORTED;
    }
    return HM_SUCCESS;
}

static hm_result_t dev_ipc_open(void *state, const void *payload, int fd, size_t size,
                                void **ptr) {
    tdev_t *d = state;
    atomic_fetch_add(&d->calls[HM_TEST_DEVICE_IPC_OPEN], 1);
    dev_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != DEV_MAGIC || pl.size > pl.len || size > pl.len)
        return HM_ERROR_INVALID_HANDLE;
    if (!can_open(d, pl.uuid)) return HM_ERROR_NOT_SUPPORTED; /* the driver's own refusal */
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < pl.len)
        return HM_ERROR_INVALID_HANDLE;
    drange_t nr = {.len = (size_t)pl.len, .size = size, .fd = -1, .imported = 1,
                   .fdev = st.st_dev, .fino = st.st_ino};
    /* One open of an allocation per shared context, as CUDA requires (a
     * provider of its own context, 0, maps a handle as often as asked). */
    dctx_t *cx = d->cx;
    mx_lock(&cx->lock);
    int twice = 0;
    for (size_t i = 0; cx->key && i < cx->t.n; i++)
        twice |= cx->t.r[i].fdev == nr.fdev && cx->t.r[i].fino == nr.fino;
    mx_unlock(&cx->lock);
    if (twice) {
        atomic_fetch_add(&d->misuse, 1);
        fprintf(stderr, "device provider '%s': a second open of one allocation in one context\n",
                d->p.name);
        fflush(stderr);
        return HM_ERROR_DRIVER;
    }
    hm_result_t r = map_views(fd, nr.len, d->page, &nr.base, &nr.alias);
    if (r != HM_SUCCESS) return r;
    mx_lock(&cx->lock);
    int ok = table_insert(&cx->t, &nr);
    mx_unlock(&cx->lock);
    if (!ok) {
        unmap_views(&nr);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    atomic_fetch_add(&cx->mappings, 1);
    *ptr = (void *)nr.base;
    return HM_SUCCESS;
}

static hm_result_t dev_ipc_close(void *state, void *ptr, size_t size) {
    tdev_t *d = state;
    atomic_fetch_add(&d->calls[HM_TEST_DEVICE_IPC_CLOSE], 1);
    drange_t r;
    mx_lock(&d->cx->lock);
    int ok = table_take(&d->cx->t, (uintptr_t)ptr, 1, &r);
    mx_unlock(&d->cx->lock);
    if (!ok) {
        misuse(d, "ipc.close", ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    unmap_views(&r);
    atomic_fetch_sub(&d->cx->mappings, 1);
    return HM_SUCCESS;
}

static uint64_t dev_ipc_context(void *state) {
    tdev_t *d = state;
    return d->p.context;
}

static const hm_provider_ops_t dev_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "test-device",
    .init = dev_init,
    .fini = dev_fini,
    .get_info = dev_get_info,
    .alloc = dev_alloc,
    .free = dev_free,
    .purge_force = dev_purge_force,
    .ipc =
        {
            .handle_size = dev_ipc_handle_size,
            .get = dev_ipc_get,
            .put = dev_ipc_put,
            .open = dev_ipc_open,
            .close = dev_ipc_close,
        },
    .get_device = dev_get_device,
    .fill = dev_fill,
    .copy = dev_copy,
    .ipc_compatible = dev_ipc_compatible,
    .ipc_context = dev_ipc_context,
};

const hm_provider_ops_t *hm_test_device_provider_ops(void) { return &dev_ops; }

hm_result_t hm_test_device_provider(const hm_test_device_params_t *params, hm_provider_t **out) {
    return hm_provider_create(&dev_ops, params, out);
}

static tdev_t *dev_of(hm_provider_t *p) {
    const hm_provider_ops_t *o = hm_provider_get_ops(p);
    if (!o || o->alloc != dev_alloc) return NULL;
    return hm_provider_get_state(p);
}

static int op_ok(hm_test_device_op_t op) {
    return (int)op >= 0 && op < HM_TEST_DEVICE_OP_COUNT;
}

long hm_test_device_calls(hm_provider_t *p, hm_test_device_op_t op) {
    tdev_t *d = dev_of(p);
    return d && op_ok(op) ? atomic_load(&d->calls[op]) : -1;
}

void hm_test_device_fail_nth(hm_provider_t *p, hm_test_device_op_t op, long nth) {
    tdev_t *d = dev_of(p);
    if (!d || !op_ok(op)) return;
    atomic_store(&d->fail_at[op], nth > 0 ? atomic_load(&d->calls[op]) + nth : 0);
}

long hm_test_device_live(hm_provider_t *p) {
    tdev_t *d = dev_of(p);
    return d ? atomic_load(&d->allocs) : -1;
}

long hm_test_device_mappings(hm_provider_t *p) {
    tdev_t *d = dev_of(p);
    return d ? atomic_load(&d->cx->mappings) : -1;
}

long hm_test_device_misuse(hm_provider_t *p) {
    tdev_t *d = dev_of(p);
    return d ? atomic_load(&d->misuse) : -1;
}
