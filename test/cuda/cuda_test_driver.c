/* hetmem tests — libcuda.so.1, a CUDA driver for machines without an NVIDIA
 * GPU. What it models and the control API: cuda_test_driver.h.
 * SPDX-License-Identifier: MIT
 *
 * Layout of this file: state and the entry/exit of every call (counting,
 * failure injection, the one mutex); contexts and the per-thread stack;
 * the allocation table and mappings; the entry points by area; the old
 * ABIs that abort; cuGetProcAddress_v2's table; the control API.
 *
 * Invariants (all under g_lock, except the thread's own context stack):
 *  - g.allocs is sorted by base; spans [base, base + span) never overlap.
 *    Device and async memory has `charged` bytes on its device's `used`;
 *    host, managed and opened IPC memory charges nothing. Only device
 *    allocations (M_DEVICE) keep their memfd open (fd >= 0): an IPC open
 *    elsewhere reaches it through /proc/<pid>/fd/<fd>.
 *  - An opened IPC mapping (M_IPC) has refs >= 1; other kinds refs == 0.
 *  - Context objects are never freed: a created context stays on g.ctxs
 *    after cuCtxDestroy_v2 (destroyed = true), so no handle is ever reused
 *    and a stale handle on some thread's stack is recognised. A primary
 *    context is active while refs > 0.
 *  - Every allocation's ctx is a context that was usable when it was made;
 *    a context's end releases its allocations (async ones excepted).
 *  - The queue: g.q[g.qhead, g.nq) are the ops not yet run, in the order
 *    they were queued; g.q_seq ops were ever queued and g.q_done ever run,
 *    so g.q_seq - g.q_done == g.nq - g.qhead, and the op at index i is op
 *    number g.q_done + (i - g.qhead). An event's point is a value of q_seq:
 *    it is complete when q_done >= point.
 *  - g.streams and g.events hold the live created streams and events,
 *    sorted by id (ids rise and are never reused: a handle encodes its id,
 *    so a destroyed handle is never found again). Each names a context that
 *    is usable; a context's end destroys its streams and events.
 *  - VMM: g.vmms holds the physical allocations with refs > 0 or maps > 0;
 *    maps is the number of M_VMM records naming it. An M_VMM record lies
 *    inside one range of g.vres (reservations, taken from the reservation's
 *    free set), has no context and charges nothing (its vmm does); a
 *    reservation is given back only with no mapping left in it.
 *  - Pools: g.mpools holds the created and imported pools until destroyed
 *    with live == 0 (live: M_POOL records of a created pool, M_POOLIMP
 *    records of an imported one, each naming it by mpool). An M_POOL
 *    record's offsets are out of its pool's free set and its slot names its
 *    id; it has no context and charges its pool's device.
 */
#include "cuda_test_driver.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../common/sized_memfd.h"

#define EXPORT __attribute__((visibility("default")))

extern void *__dso_handle;
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GRANULARITY HM_CUDA_TEST_GRANULARITY
#define HOST_PAGE (4 * KIB)
#define DEFAULT_DEVICES 1
#define DEFAULT_VA_BASE ((uintptr_t)0x7e8000000000) /* TSan's high app range, ASan's HighMem */
#define VA_SIZE ((size_t)64 << 30)
#define LIFO_MAX 64   /* freed ranges remembered for reuse */
#define QUEUE_MAX 1024 /* queued memsets and copies before a forced run */
#define DEFAULT_MEM_LIMIT ((uint64_t)256 * MIB)
#define CTX_STACK_MAX 64
#define IPC_MAGIC 0x55434d48u /* "HMCU" little-endian */

#define die(...)                                                                  \
    do {                                                                          \
        fprintf(stderr, "libcuda (hetmem test): %s:%d: ", __FILE__, __LINE__);    \
        fprintf(stderr, __VA_ARGS__);                                             \
        fprintf(stderr, "\n");                                                    \
        abort();                                                                  \
    } while (0)

/* ---- every exported entry point, by symbol name ---- */

#define CT_APIS(X)                                                                      \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)               \
    X(cuGetProcAddress_v2) X(cuGetProcAddress)                                          \
    X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetUuid)            \
    X(cuDeviceGetUuid_v2) X(cuDeviceGetAttribute) X(cuDeviceTotalMem_v2)                \
    X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuDeviceGetDefaultMemPool)           \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2)                         \
    X(cuDevicePrimaryCtxRelease) X(cuCtxCreate_v2) X(cuCtxCreate_v4) X(cuCtxCreate)     \
    X(cuCtxDestroy_v2) X(cuCtxDestroy) X(cuCtxGetCurrent) X(cuCtxSetCurrent)            \
    X(cuCtxPushCurrent_v2) X(cuCtxPushCurrent) X(cuCtxPopCurrent_v2) X(cuCtxPopCurrent) \
    X(cuCtxGetDevice) X(cuCtxGetDevice_v2) X(cuCtxSynchronize) X(cuCtxSynchronize_v2)   \
    X(cuMemAlloc_v2) X(cuMemAlloc) X(cuMemFree_v2) X(cuMemFree)                         \
    X(cuMemAllocHost_v2) X(cuMemAllocHost) X(cuMemHostAlloc) X(cuMemFreeHost)           \
    X(cuMemHostGetDevicePointer_v2) X(cuMemHostGetDevicePointer)                        \
    X(cuMemAllocManaged) X(cuMemGetAddressRange_v2) X(cuMemGetAddressRange)             \
    X(cuMemGetInfo_v2) X(cuMemGetInfo) X(cuMemGetAllocationGranularity)                 \
    X(cuMemsetD8_v2) X(cuMemsetD8) X(cuMemcpy) X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD)       \
    X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH) X(cuMemcpyDtoD_v2) X(cuMemcpyDtoD)               \
    X(cuPointerGetAttribute) X(cuPointerGetAttributes)                                  \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcOpenMemHandle)                 \
    X(cuIpcCloseMemHandle)                                                              \
    X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuStreamSynchronize)                        \
    X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamDestroy) X(cuStreamQuery)         \
    X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)              \
    X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuEventDestroy)                        \
    X(cuMemsetD8Async) X(cuMemcpyAsync)                                                \
    X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree)           \
    X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess)                       \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                   \
    X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle)         \
    X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemAllocFromPoolAsync)                   \
    X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle)           \
    X(cuMemPoolExportPointer) X(cuMemPoolImportPointer)

enum api {
#define X(name) API_##name,
    CT_APIS(X)
#undef X
    API_COUNT
};

static const char *const api_names[API_COUNT] = {
#define X(name) #name,
    CT_APIS(X)
#undef X
};

/* ---- state ---- */

struct device;

struct ctx {
    uint32_t magic;
    bool primary;
    bool destroyed;     /* created contexts only */
    unsigned flags;
    unsigned refs;      /* primary contexts: retains not yet released */
    struct device *dev;
    struct ctx *next;   /* g.ctxs (created contexts) */
};

struct pool {
    uint32_t magic;
    unsigned index;
};

struct device {
    unsigned index;
    uint64_t limit; /* bytes */
    uint64_t used;  /* bytes charged by device and async memory */
    struct ctx primary;
    struct pool pool;
};

/* M_WCDEV: the device address of write-combined host memory, the twin of
 * its M_HOST record. M_VMM: one cuMemMap mapping of a physical allocation.
 * M_POOL: an allocation from a created pool (cuMemAllocFromPoolAsync);
 * M_POOLIMP: one imported into this process (cuMemPoolImportPointer). */
enum mkind { M_DEVICE, M_ASYNC, M_HOST, M_MANAGED, M_IPC, M_WCDEV, M_VMM, M_POOL, M_POOLIMP };

struct mpool;

/* A physical allocation of the VMM API (cuMemCreate, or an import): a
 * sealed memfd. It lives while refs > 0 (handle references: the create or
 * import, each cuMemRetainAllocationHandle, minus each cuMemRelease) or
 * maps > 0 (its M_VMM mappings); `charged` bytes are on dev's `used`
 * (0 for an import). */
struct vmm {
    uint64_t id; /* the handle encodes it (handle_of()) */
    int fd;
    size_t size;
    struct device *dev;
    uint64_t charged;
    CUmemAllocationProp prop;
    unsigned refs;
    unsigned maps;
    struct vmm *next;
};

struct alloc {
    uintptr_t base;
    size_t size;   /* what the caller asked for */
    size_t span;   /* mapped at base */
    char *cpu;     /* where the driver reads and writes: the alias of device
                      memory, base itself for host and managed memory */
    int fd;        /* M_DEVICE: the memfd; -1 otherwise */
    ino_t ino;
    dev_t fsdev;
    uint64_t id;   /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
    enum mkind kind;
    bool in_va;    /* mapped inside the reservation (given back when freed) */
    struct alloc *twin; /* write-combined memory: host record <-> device record */
    struct ctx *ctx;
    struct device *dev;
    uint64_t charged;
    /* M_VMM: the physical allocation, and the access flags per device */
    struct vmm *vmm;
    unsigned char access[HM_CUDA_TEST_MAX_DEVICES];
    /* M_POOL, M_POOLIMP: the pool, and the offset in its memory */
    struct mpool *mpool;
    uint64_t pool_off;
    /* M_IPC, M_POOLIMP */
    unsigned refs;
    uint32_t exp_pid;
    uint32_t exp_dev;
    uint64_t exp_nonce, exp_id;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct device g_devices[HM_CUDA_TEST_MAX_DEVICES];

struct range {
    uintptr_t lo, hi; /* [lo, hi) */
};

/* A queued memset (src NULL) or copy, through aliases; `stream`: the
 * stream's tag (stream_tag()). */
struct op {
    char *dst;
    const char *src;
    size_t n;
    int value;
    uintptr_t stream;
};

/* A created stream or event; the handle encodes the id (handle_of()). */
struct stream {
    uint64_t id;
    struct ctx *ctx;
    unsigned flags;
};

struct event {
    uint64_t id;
    struct ctx *ctx;
    unsigned flags;
    uint64_t point; /* complete when g.q_done >= point; 0: never recorded */
};

static struct {
    bool initialized; /* cuInit(0) succeeded */
    bool forked;      /* a fork child of an initialized process */
    bool deinit;      /* torn down (exit, or hm_cuda_test_teardown) */
    bool atexit_set;
    bool strict_ipc;
    bool fabric; /* HM_CUDA_TEST_FABRIC=1: fabric handles */
    unsigned lenient; /* HM_CUDA_TEST_LENIENT_* */
    CUresult sticky;  /* CUDA_SUCCESS: none */
    /* the reservation: [va_base, va_base + VA_SIZE) once reserved */
    uintptr_t va_base;
    bool va_reserved;
    struct range *va_free; /* free ranges, sorted, coalesced */
    size_t va_nfree, va_capfree;
    struct range lifo[LIFO_MAX]; /* freed ranges, most recent last */
    unsigned nlifo;
    uintptr_t va_cursor; /* LENIENT_NO_REUSE: where the next search starts */
    struct op *q;
    size_t qhead, nq, qcap;
    uint64_t q_seq, q_done; /* ops ever queued, ever run */
    struct stream *streams;
    size_t nstreams, capstreams;
    struct event *events;
    size_t nevents, capevents;
    uint64_t next_stream_id, next_event_id;
    uint64_t events_recorded;
    unsigned ndev;
    uint64_t next_id;
    uint64_t nonce;   /* this process's, new in a fork child */
    bool peer[HM_CUDA_TEST_MAX_DEVICES][HM_CUDA_TEST_MAX_DEVICES];
    uint64_t calls[API_COUNT];
    struct {
        unsigned countdown; /* 0: none pending */
        CUresult result;
        bool sticky;
    } inject[API_COUNT];
    uint64_t ipc_open_repeats;
    uint64_t leaks;
    struct ctx *ctxs;
    struct alloc **allocs;
    size_t nallocs, cap;
    struct vmm *vmms;          /* live physical allocations */
    uint64_t next_vmm_id;
    struct range *vres;        /* cuMemAddressReserve ranges, unordered */
    size_t nvres, capvres;
    struct mpool *mpools;      /* created and imported pools not yet freed */
    uint64_t next_pool_id;
    uint64_t pool_early_frees;
} g;

/* The calling thread's context stack; t_stack[t_depth - 1] is current. */
static __thread struct ctx *t_stack[CTX_STACK_MAX];
static __thread unsigned t_depth;

static void lock(void) {
    int e = pthread_mutex_lock(&g_lock);
    if (e) die("pthread_mutex_lock: %s", strerror(e));
}

static void unlock(void) {
    int e = pthread_mutex_unlock(&g_lock);
    if (e) die("pthread_mutex_unlock: %s", strerror(e));
}

static uint64_t new_nonce(void) {
    uint64_t n = 0;
    if (getrandom(&n, sizeof n, GRND_NONBLOCK) != (ssize_t)sizeof n) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        n = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    return n | 1; /* never 0 */
}

/* The forking thread holds g_lock across fork, so the child copies no
 * half-done update. */
static void fork_prepare(void) { lock(); }
static void fork_parent(void) { unlock(); }
static void fork_child(void) {
    g.nonce = new_nonce();
    /* The parent's queued work is the parent's: the child never runs it
     * (its events count as complete there). */
    g.qhead = g.nq = 0;
    g.q_done = g.q_seq;
    if (g.initialized && !(g.lenient & HM_CUDA_TEST_LENIENT_FORK)) g.forked = true;
    unlock();
}

static const struct {
    const char *name;
    unsigned bit;
} lenient_names[] = {
    {"align", HM_CUDA_TEST_LENIENT_ALIGN},
    {"no-reuse", HM_CUDA_TEST_LENIENT_NO_REUSE},
    {"ipc-anywhere", HM_CUDA_TEST_LENIENT_IPC_ANYWHERE},
    {"sync", HM_CUDA_TEST_LENIENT_SYNC},
    {"fork", HM_CUDA_TEST_LENIENT_FORK},
    {"exit", HM_CUDA_TEST_LENIENT_EXIT},
    {"wc", HM_CUDA_TEST_LENIENT_WC},
    {"all", HM_CUDA_TEST_LENIENT_ALL},
};

/* HM_CUDA_TEST_LENIENT: names separated by commas; unknown ones are
 * reported and ignored. */
static unsigned parse_lenient(const char *s) {
    unsigned bits = 0;
    while (s && *s) {
        size_t n = strcspn(s, ",");
        bool known = n == 0;
        for (size_t i = 0; i < sizeof lenient_names / sizeof lenient_names[0]; i++)
            if (strlen(lenient_names[i].name) == n && strncmp(s, lenient_names[i].name, n) == 0) {
                bits |= lenient_names[i].bit;
                known = true;
            }
        if (!known)
            fprintf(stderr, "libcuda (hetmem test): HM_CUDA_TEST_LENIENT: unknown option '%.*s'\n",
                    (int)n, s);
        s += n;
        if (*s == ',') s++;
    }
    return bits;
}

/* A size in bytes with an optional K, M or G suffix; 0 when malformed. */
static uint64_t parse_size(const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *s == '-') return 0;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end || v > (UINT64_MAX >> 1) >> shift) return 0;
    return (uint64_t)v << shift;
}

static void setup(void) {
    g.ndev = DEFAULT_DEVICES;
    const char *s = getenv("HM_CUDA_TEST_DEVICES");
    if (s && *s) {
        char *end;
        long n = strtol(s, &end, 10);
        if (*end == '\0' && n >= 0 && n <= HM_CUDA_TEST_MAX_DEVICES)
            g.ndev = (unsigned)n;
        else
            fprintf(stderr, "libcuda (hetmem test): HM_CUDA_TEST_DEVICES=%s is not 0..%d; using %u\n",
                    s, HM_CUDA_TEST_MAX_DEVICES, g.ndev);
    }
    uint64_t limit = DEFAULT_MEM_LIMIT;
    s = getenv("HM_CUDA_TEST_DEVICE_MEM");
    if (s && *s) {
        uint64_t v = parse_size(s);
        if (v)
            limit = v;
        else
            fprintf(stderr, "libcuda (hetmem test): HM_CUDA_TEST_DEVICE_MEM=%s is not a size; using %llu\n",
                    s, (unsigned long long)limit);
    }
    s = getenv("HM_CUDA_TEST_STRICT_IPC");
    g.strict_ipc = s && strcmp(s, "1") == 0;
    s = getenv("HM_CUDA_TEST_FABRIC");
    g.fabric = s && strcmp(s, "1") == 0;
    g.lenient = parse_lenient(getenv("HM_CUDA_TEST_LENIENT"));
    g.va_base = DEFAULT_VA_BASE;
    s = getenv("HM_CUDA_TEST_VA_BASE");
    if (s && *s) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 0);
        if (!errno && *end == '\0' && v && v % GRANULARITY == 0 && v <= UINTPTR_MAX - VA_SIZE)
            g.va_base = (uintptr_t)v;
        else
            fprintf(stderr, "libcuda (hetmem test): HM_CUDA_TEST_VA_BASE=%s is not a 2 MiB "
                    "aligned address; using %#llx\n", s, (unsigned long long)g.va_base);
    }
    for (unsigned i = 0; i < HM_CUDA_TEST_MAX_DEVICES; i++) {
        struct device *d = &g_devices[i];
        d->index = i;
        d->limit = limit;
        d->primary.magic = 0x43545850; /* "PXTC" */
        d->primary.primary = true;
        d->primary.dev = d;
        d->pool.magic = 0x4c4f4f50;
        d->pool.index = i;
        for (unsigned j = 0; j < HM_CUDA_TEST_MAX_DEVICES; j++) g.peer[i][j] = i != j;
    }
    g.next_id = 1;
    g.next_stream_id = g.next_event_id = 1;
    g.nonce = new_nonce();
    int e = pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (e) die("pthread_atfork: %s", strerror(e));
}

/* The start of every entry point: count the call; an injected failure, or
 * NOT_INITIALIZED when `needs_init`, returns at once (lock released);
 * otherwise CUDA_SUCCESS with g_lock held, to be released by leave(). */
static bool sticky_exempt(enum api a) {
    return a == API_cuGetErrorName || a == API_cuGetErrorString || a == API_cuDriverGetVersion;
}

static CUresult enter(enum api a, bool needs_init) {
    pthread_once(&g_once, setup);
    lock();
    g.calls[a]++;
    CUresult r = CUDA_SUCCESS;
    if (g.forked)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (g.deinit)
        r = CUDA_ERROR_DEINITIALIZED;
    else if (g.inject[a].countdown && --g.inject[a].countdown == 0) {
        r = g.inject[a].result;
        if (g.inject[a].sticky) g.sticky = r;
    } else if (g.sticky != CUDA_SUCCESS && !sticky_exempt(a))
        r = g.sticky;
    else if (needs_init && !g.initialized)
        r = CUDA_ERROR_NOT_INITIALIZED;
    if (r != CUDA_SUCCESS) unlock();
    return r;
}

static CUresult leave(CUresult r) {
    unlock();
    return r;
}

#define ENTER_AS(name, needs_init)                           \
    do {                                                     \
        CUresult enter_r_ = enter(API_##name, needs_init);   \
        if (enter_r_ != CUDA_SUCCESS) return enter_r_;       \
    } while (0)
#define ENTER(name) ENTER_AS(name, true)
/* cuInit, cuDriverGetVersion, cuGetErrorName/String, cuGetProcAddress_v2 */
#define ENTER_BEFORE_INIT(name) ENTER_AS(name, false)

/* ---- devices and contexts ---- */

static struct device *device_at(CUdevice d) {
    return d >= 0 && (unsigned)d < g.ndev ? &g_devices[d] : NULL;
}

#define FIND_DEVICE(var, d)                                               \
    struct device *var = device_at(d);                                    \
    do {                                                                  \
        if (!var) return leave(CUDA_ERROR_INVALID_DEVICE);                \
    } while (0)

/* The context behind a handle the driver handed out (destroyed or not). */
static struct ctx *ctx_find(CUcontext h) {
    struct ctx *c = (struct ctx *)(void *)h;
    if (!c) return NULL;
    for (unsigned i = 0; i < g.ndev; i++)
        if (c == &g_devices[i].primary) return c;
    for (struct ctx *o = g.ctxs; o; o = o->next)
        if (o == c) return c;
    return NULL;
}

static CUresult ctx_usable(const struct ctx *c) {
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->primary ? c->refs == 0 : c->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}

static struct ctx *current(void) { return t_depth ? t_stack[t_depth - 1] : NULL; }

/* `var`: the calling thread's current context, which must be usable. */
#define CURRENT(var)                                                      \
    struct ctx *var = current();                                          \
    do {                                                                  \
        CUresult cur_r_ = ctx_usable(var);                                \
        if (cur_r_ != CUDA_SUCCESS) return leave(cur_r_);                 \
    } while (0)

/* ---- created streams and events: handles and tables ---- */

/* A handle is its kind's base plus the id times 16: never a valid
 * pointer, never NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD, and a
 * stream's handle is never an event's. */
#define STREAM_HANDLE_BASE ((uintptr_t)0x5354000000000000ull) /* "ST" */
#define EVENT_HANDLE_BASE ((uintptr_t)0x4556000000000000ull)  /* "EV" */
#define HANDLE_ID_MASK ((uintptr_t)0x0000fffffffffff0ull)

static uintptr_t handle_of(uintptr_t base, uint64_t id) { return base + ((uintptr_t)id << 4); }

/* The id a handle of this kind encodes; 0 for anything else. */
static uint64_t id_of(uintptr_t base, uintptr_t h) {
    if ((h & ~HANDLE_ID_MASK) != base) return 0;
    return (uint64_t)((h & HANDLE_ID_MASK) >> 4);
}

/* The element of a by-id sorted array (n elements of elsize bytes, the id
 * at idoff) whose id is id, or NULL (id 0: none). A binary search. */
static void *find_by_id(void *arr, size_t n, size_t elsize, size_t idoff, uint64_t id) {
    size_t lo = 0, hi = n;
    while (id && lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        char *el = (char *)arr + mid * elsize;
        uint64_t have;
        memcpy(&have, el + idoff, sizeof(have));
        if (have == id) return el;
        if (have < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static struct stream *stream_find(CUstream h) {
    return find_by_id(g.streams, g.nstreams, sizeof(*g.streams), offsetof(struct stream, id),
                      id_of(STREAM_HANDLE_BASE, (uintptr_t)h));
}

static struct event *event_find(CUevent h) {
    return find_by_id(g.events, g.nevents, sizeof(*g.events), offsetof(struct event, id),
                      id_of(EVENT_HANDLE_BASE, (uintptr_t)h));
}

/* Room for one more element of a table of `size`-byte elements. */
static bool table_grow(void **v, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return true;
    const size_t c = *cap ? 2 * *cap : 16;
    void *nv = realloc(*v, c * size);
    if (!nv) return false;
    *v = nv;
    *cap = c;
    return true;
}

static void stream_remove(struct stream *s) {
    const size_t i = (size_t)(s - g.streams);
    memmove(s, s + 1, (g.nstreams - i - 1) * sizeof *s);
    if (--g.nstreams == 0) {
        free(g.streams);
        g.streams = NULL;
        g.capstreams = 0;
    }
}

static void event_remove(struct event *e) {
    const size_t i = (size_t)(e - g.events);
    memmove(e, e + 1, (g.nevents - i - 1) * sizeof *e);
    if (--g.nevents == 0) {
        free(g.events);
        g.events = NULL;
        g.capevents = 0;
    }
}

/* The calling thread's per-thread default stream: its tag is this
 * variable's address. */
static __thread char t_per_thread_stream;

/* What a call that takes a stream may be given: NULL and CU_STREAM_LEGACY
 * (the legacy default stream, one tag), CU_STREAM_PER_THREAD (the calling
 * thread's), both of the current context, which must be usable; or a live
 * created stream, of its own context. Anything else is
 * CUDA_ERROR_INVALID_HANDLE. *ctx: the stream's context; *tag: what its
 * queued ops carry. */
static CUresult stream_arg(CUstream h, struct ctx **ctx, uintptr_t *tag) {
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct ctx *c = current();
        CUresult r = ctx_usable(c);
        if (r != CUDA_SUCCESS) return r;
        *ctx = c;
        *tag = h == CU_STREAM_PER_THREAD ? (uintptr_t)&t_per_thread_stream
                                         : (uintptr_t)CU_STREAM_LEGACY;
        return CUDA_SUCCESS;
    }
    const struct stream *s = stream_find(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    *ctx = s->ctx;
    *tag = (uintptr_t)h;
    return CUDA_SUCCESS;
}

#define STREAM_ARG(ctx_var, tag_var, h)                                   \
    struct ctx *ctx_var;                                                  \
    uintptr_t tag_var;                                                    \
    do {                                                                  \
        CUresult st_r_ = stream_arg(h, &ctx_var, &tag_var);               \
        if (st_r_ != CUDA_SUCCESS) return leave(st_r_);                   \
    } while (0)

/* ---- the allocation table ---- */

/* Index of the first allocation whose base is above p. */
static size_t alloc_upper(uintptr_t p) {
    size_t lo = 0, hi = g.nallocs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g.allocs[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The allocation that holds p within the size it was asked for. */
static struct alloc *alloc_at(uintptr_t p) {
    size_t i = alloc_upper(p);
    if (i == 0) return NULL;
    struct alloc *a = g.allocs[i - 1];
    return p - a->base < a->size ? a : NULL;
}

/* Whether [p, p + n) (n > 0) meets any mapping of the driver. */
static bool span_overlaps(uintptr_t p, size_t n) {
    size_t i = alloc_upper(p + n - 1);
    if (i == 0) return false;
    const struct alloc *a = g.allocs[i - 1];
    return a->base + a->span > p;
}

static bool table_reserve(size_t n) {
    if (g.nallocs + n <= g.cap) return true;
    size_t cap = g.cap ? 2 * g.cap : 64;
    struct alloc **v = realloc(g.allocs, cap * sizeof *v);
    if (!v) return false;
    g.allocs = v;
    g.cap = cap;
    return true;
}

/* Room must have been made with table_reserve(). */
static void table_insert(struct alloc *a) {
    size_t i = alloc_upper(a->base);
    memmove(&g.allocs[i + 1], &g.allocs[i], (g.nallocs - i) * sizeof *g.allocs);
    g.allocs[i] = a;
    g.nallocs++;
}

static void table_remove(struct alloc *a) {
    size_t i = alloc_upper(a->base);
    if (i == 0 || g.allocs[i - 1] != a) die("allocation %p not in the table", (void *)a->base);
    i--;
    memmove(&g.allocs[i], &g.allocs[i + 1], (g.nallocs - i - 1) * sizeof *g.allocs);
    g.nallocs--;
    if (g.nallocs == 0) { /* give the table back: a leak checker sees none */
        free(g.allocs);
        g.allocs = NULL;
        g.cap = 0;
    }
}

/* len bytes at an address aligned to `align` (a power of two >= the host
 * page), anonymous private memory outside the reservation. */
static char *map_aligned(size_t len, size_t align, int prot) {
    size_t span = len + align;
    char *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)r + align - 1) & ~(uintptr_t)(align - 1));
    if (p > r) munmap(r, (size_t)(p - r));
    if (r + span > p + len) munmap(p + len, (size_t)(r + span - (p + len)));
    if (mmap(p, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

/* ---- the reservation: one range of addresses for device memory ---- */

/* What an allocation of `size` bytes spans and how it is aligned: 4 KiB
 * below 2 MiB, 2 MiB from 2 MiB on (LENIENT_ALIGN: 2 MiB always). */
static size_t span_of(size_t size) {
    const size_t page = size >= GRANULARITY || (g.lenient & HM_CUDA_TEST_LENIENT_ALIGN)
                            ? GRANULARITY : HOST_PAGE;
    return (size + page - 1) & ~(page - 1);
}

static size_t align_of(size_t size) {
    return size >= GRANULARITY || (g.lenient & HM_CUDA_TEST_LENIENT_ALIGN) ? GRANULARITY : HOST_PAGE;
}

static CUresult va_reserve(void) {
    if (g.va_reserved) return CUDA_SUCCESS;
    void *p = mmap((void *)g.va_base, VA_SIZE, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED || p != (void *)g.va_base) {
        if (p != MAP_FAILED) munmap(p, VA_SIZE); /* a kernel without MAP_FIXED_NOREPLACE */
        fprintf(stderr, "libcuda (hetmem test): cannot reserve %#llx..%#llx: %s\n",
                (unsigned long long)g.va_base, (unsigned long long)(g.va_base + VA_SIZE),
                p == MAP_FAILED ? strerror(errno) : "taken");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g.va_free = malloc(16 * sizeof *g.va_free);
    if (!g.va_free) {
        munmap(p, VA_SIZE);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g.va_capfree = 16;
    g.va_free[0] = (struct range){g.va_base, g.va_base + VA_SIZE};
    g.va_nfree = 1;
    g.va_cursor = g.va_base;
    g.va_reserved = true;
    return CUDA_SUCCESS;
}

/* Index of the free range that holds all of [lo, hi), or -1. */
static long va_holder(uintptr_t lo, uintptr_t hi) {
    for (size_t i = 0; i < g.va_nfree; i++)
        if (g.va_free[i].lo <= lo && hi <= g.va_free[i].hi) return (long)i;
    return -1;
}

static bool va_grow(void) {
    if (g.va_nfree < g.va_capfree) return true;
    struct range *v = realloc(g.va_free, 2 * g.va_capfree * sizeof *v);
    if (!v) return false;
    g.va_free = v;
    g.va_capfree *= 2;
    return true;
}

/* Takes [lo, hi), which lies in free range i, out of the free set. */
static bool va_take(long i, uintptr_t lo, uintptr_t hi) {
    struct range *r = &g.va_free[i];
    if (r->lo < lo && hi < r->hi) { /* a hole in the middle: one range more */
        if (!va_grow()) return false;
        r = &g.va_free[i];
        memmove(r + 2, r + 1, (g.va_nfree - (size_t)i - 1) * sizeof *r);
        r[1] = (struct range){hi, r->hi};
        r->hi = lo;
        g.va_nfree++;
    } else if (r->lo == lo && hi == r->hi) {
        memmove(r, r + 1, (g.va_nfree - (size_t)i - 1) * sizeof *r);
        g.va_nfree--;
    } else if (r->lo == lo) {
        r->lo = hi;
    } else {
        r->hi = lo;
    }
    return true;
}

/* Gives [lo, hi) back: PROT_NONE again, and free for the next allocation,
 * remembered as the most recently freed range. */
static void va_give(uintptr_t lo, uintptr_t hi) {
    if (mmap((void *)lo, hi - lo, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
        die("re-reserving %#llx: %s", (unsigned long long)lo, strerror(errno));
    size_t i = 0;
    while (i < g.va_nfree && g.va_free[i].lo < lo) i++;
    const bool left = i > 0 && g.va_free[i - 1].hi == lo;
    const bool right = i < g.va_nfree && g.va_free[i].lo == hi;
    if (left && right) {
        g.va_free[i - 1].hi = g.va_free[i].hi;
        memmove(&g.va_free[i], &g.va_free[i + 1], (g.va_nfree - i - 1) * sizeof *g.va_free);
        g.va_nfree--;
    } else if (left) {
        g.va_free[i - 1].hi = hi;
    } else if (right) {
        g.va_free[i].lo = lo;
    } else {
        if (!va_grow()) die("out of memory for the reservation's free list");
        memmove(&g.va_free[i + 1], &g.va_free[i], (g.va_nfree - i) * sizeof *g.va_free);
        g.va_free[i] = (struct range){lo, hi};
        g.va_nfree++;
    }
    if (g.nlifo == LIFO_MAX) {
        memmove(&g.lifo[0], &g.lifo[1], (LIFO_MAX - 1) * sizeof g.lifo[0]);
        g.nlifo--;
    }
    g.lifo[g.nlifo++] = (struct range){lo, hi};
}

/* A free range of len bytes aligned to `align`, taken: the most recently
 * freed range that fits, else the lowest address that fits
 * (LENIENT_NO_REUSE: the next address above the last one handed out). */
static uintptr_t va_alloc(size_t len, size_t align) {
    if (!g.va_reserved) return 0;
    if (!(g.lenient & HM_CUDA_TEST_LENIENT_NO_REUSE)) {
        for (unsigned k = g.nlifo; k-- > 0;) {
            const struct range e = g.lifo[k];
            long i = va_holder(e.lo, e.hi);
            if (i < 0) { /* handed out again since: forget it */
                memmove(&g.lifo[k], &g.lifo[k + 1], (g.nlifo - k - 1) * sizeof e);
                g.nlifo--;
                continue;
            }
            if (e.lo % align || e.hi - e.lo < len) continue;
            if (!va_take(i, e.lo, e.lo + len)) return 0;
            memmove(&g.lifo[k], &g.lifo[k + 1], (g.nlifo - k - 1) * sizeof e);
            g.nlifo--;
            return e.lo;
        }
    }
    const bool next = g.lenient & HM_CUDA_TEST_LENIENT_NO_REUSE;
    for (int pass = 0; pass < 2; pass++) {
        const uintptr_t from = next && pass == 0 ? g.va_cursor : g.va_base;
        for (size_t i = 0; i < g.va_nfree; i++) {
            uintptr_t lo = g.va_free[i].lo < from ? from : g.va_free[i].lo;
            lo = (lo + align - 1) & ~(uintptr_t)(align - 1);
            if (lo >= g.va_free[i].hi || g.va_free[i].hi - lo < len) continue;
            if (!va_take((long)i, lo, lo + len)) return 0;
            g.va_cursor = lo + len;
            return lo;
        }
        if (!next) break;
    }
    return 0;
}

/* fd's first len bytes at addr (taken from the reservation) as device
 * memory: PROT_NONE for the caller. */
static bool map_at(uintptr_t addr, int fd, size_t len) {
    return mmap((void *)addr, len, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED;
}

/* ---- queued work: memsets and copies, in one queue in stream order ---- */

static void op_run(const struct op *o) {
    if (o->src)
        memmove(o->dst, o->src, o->n);
    else
        memset(o->dst, o->value, o->n);
}

/* Runs the queued ops until q_done reaches `point` (or the queue is
 * empty): the work an event recorded at `point` captured, and whatever
 * was queued before it. */
static void queue_run_to(uint64_t point) {
    while (g.qhead < g.nq && g.q_done < point) {
        op_run(&g.q[g.qhead++]);
        g.q_done++;
    }
    if (g.qhead < g.nq) return;
    g.qhead = g.nq = 0;
    if (g.qcap > 64) { /* keep the queue small between bursts */
        free(g.q);
        g.q = NULL;
        g.qcap = 0;
    }
}

static void queue_run(void) { queue_run_to(g.q_seq); }

/* Queues (or, with LENIENT_SYNC, runs) one memset (src NULL) or copy on
 * the stream tagged `stream`. A full queue runs first, as a real driver's
 * full push buffer blocks. */
static void queue_push(char *dst, const char *src, size_t n, int value, uintptr_t stream) {
    const struct op o = {dst, src, n, value, stream};
    g.q_seq++;
    if (!(g.lenient & HM_CUDA_TEST_LENIENT_SYNC)) {
        if (g.nq - g.qhead == QUEUE_MAX) queue_run();
        if (g.nq == g.qcap && g.qhead > 0) { /* room at the front: move down */
            memmove(g.q, g.q + g.qhead, (g.nq - g.qhead) * sizeof *g.q);
            g.nq -= g.qhead;
            g.qhead = 0;
        }
        if (g.nq == g.qcap) {
            size_t cap = g.qcap ? 2 * g.qcap : 16;
            struct op *v = realloc(g.q, cap * sizeof *v);
            if (v) {
                g.q = v;
                g.qcap = cap;
            }
        }
        if (g.nq < g.qcap) {
            g.q[g.nq++] = o;
            return;
        }
    }
    queue_run(); /* LENIENT_SYNC, or no room: synchronous, after the queue */
    op_run(&o);
    g.q_done++;
}

/* The point just after the last queued op of the stream tagged `tag`
 * (queue_run_to() of it runs that op); 0 when the queue holds none. */
static uint64_t stream_last(uintptr_t tag) {
    for (size_t i = g.nq; i-- > g.qhead;)
        if (g.q[i].stream == tag) return g.q_done + (i - g.qhead) + 1;
    return 0;
}

static void pool_unlink(struct alloc *a);
static CUmemoryPool pool_handle(const struct mpool *p);

/* Unmaps and forgets a (and its twin), after the queued work, which may
 * touch it. */
static void alloc_release(struct alloc *a) {
    queue_run();
    if (a->mpool) pool_unlink(a);
    if (a->twin) {
        struct alloc *t = a->twin;
        a->twin = NULL;
        t->twin = NULL;
        alloc_release(t);
    }
    table_remove(a);
    if (a->cpu != (char *)a->base && a->kind != M_WCDEV) munmap(a->cpu, a->span);
    if (a->in_va)
        va_give(a->base, a->base + a->span);
    else
        munmap((void *)a->base, a->span);
    if (a->fd >= 0) close(a->fd);
    if (a->dev) a->dev->used -= a->charged;
    free(a);
}

/* Device memory's memfd records the allocation's asked size in its name
 * ("hm_cuda_test:<size>"), which no holder of the descriptor can change, and
 * is sealed against resizing once sized: an importer learns the size of
 * what a handle names from the file itself, as a real driver learns it from
 * its kernel object, never from bytes of the handle its peer could rewrite
 * (cuda.h, cuMemGetAddressRange: "the allocation by cuMemAlloc() ... that
 * contains the input pointer"). */
#define MEMFD_PREFIX "hm_cuda_test" /* test/common/sized_memfd.h */

/* A sealed memfd of `size` bytes asked, `span` long; -1 on failure. */
static int memfd_for(size_t size, size_t span, struct stat *st) {
    int fd = sized_memfd_create(MEMFD_PREFIX, size);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)span) != 0 || !sized_memfd_seal(fd) || fstat(fd, st) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A new allocation of `kind` (M_DEVICE, M_ASYNC, M_HOST, M_MANAGED) in
 * context c; `wc`: write-combined host memory, with a device address of its
 * own. */
static CUresult mem_alloc(struct ctx *c, enum mkind kind, size_t size, bool wc, struct alloc **out) {
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    const bool device = kind == M_DEVICE || kind == M_ASYNC;
    if (size > SIZE_MAX - GRANULARITY) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t span = device ? span_of(size)
                        : kind == M_HOST ? (size + HOST_PAGE - 1) & ~(HOST_PAGE - 1)
                                         : (size + GRANULARITY - 1) & ~(GRANULARITY - 1);
    struct device *d = c->dev;
    if (device && (d->used > d->limit || span > d->limit - d->used)) return CUDA_ERROR_OUT_OF_MEMORY;

    struct alloc *a = calloc(1, sizeof *a), *t = NULL;
    if (!a || !table_reserve(wc ? 2 : 1)) goto fail_alloc;
    a->fd = -1;
    uintptr_t at = 0;
    if (device) {
        struct stat st;
        a->fd = memfd_for(size, span, &st);
        if (a->fd < 0) goto fail_alloc;
        a->cpu = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
        if (a->cpu == MAP_FAILED) goto fail_fd;
        at = va_alloc(span, align_of(size));
        if (!at) goto fail_cpu;
        if (!map_at(at, a->fd, span)) {
            va_give(at, at + span);
            goto fail_cpu;
        }
        a->in_va = true;
        a->ino = st.st_ino;
        a->fsdev = st.st_dev;
        if (kind == M_ASYNC) { /* never exported: no fd kept */
            close(a->fd);
            a->fd = -1;
        }
        a->charged = span;
        d->used += span;
    } else if (wc) {
        /* One memfd mapped twice: read-write at the host pointer, PROT_NONE
         * at a device address inside the reservation. */
        struct stat st;
        int fd = memfd_for(size, span, &st);
        if (fd < 0) goto fail_alloc;
        t = calloc(1, sizeof *t);
        char *host = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        uintptr_t dev = host == MAP_FAILED || !t ? 0 : va_alloc(span, HOST_PAGE);
        if (!dev || !map_at(dev, fd, span)) {
            if (dev) va_give(dev, dev + span);
            if (host != MAP_FAILED) munmap(host, span);
            close(fd);
            free(t);
            goto fail_alloc;
        }
        close(fd); /* the mappings hold the file */
        at = (uintptr_t)host;
        a->cpu = host;
        *t = (struct alloc){.base = dev, .size = size, .span = span, .cpu = host, .fd = -1,
                            .id = 0, .kind = M_WCDEV, .in_va = true, .twin = a, .ctx = c,
                            .dev = d};
        a->twin = t;
    } else {
        char *view = map_aligned(span, kind == M_HOST ? HOST_PAGE : GRANULARITY, PROT_READ | PROT_WRITE);
        if (!view) goto fail_alloc;
        at = (uintptr_t)view;
        a->cpu = view;
    }
    a->base = at;
    a->size = size;
    a->span = span;
    a->id = g.next_id++;
    a->kind = kind;
    a->ctx = c;
    a->dev = d;
    table_insert(a);
    if (t) {
        t->id = a->id;
        table_insert(t);
    }
    *out = a;
    return CUDA_SUCCESS;

fail_cpu:
    munmap(a->cpu, span);
fail_fd:
    close(a->fd);
fail_alloc:
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The end of context c: its memory (async memory excepted) and its opened
 * IPC mappings go, each counted as a leak. */
static void ctx_drop_memory(struct ctx *c) {
    for (size_t i = g.nallocs; i-- > 0;) {
        if (i >= g.nallocs) continue; /* a twin went with its host record */
        struct alloc *a = g.allocs[i];
        if (a->ctx == c && a->kind != M_ASYNC && a->kind != M_WCDEV) {
            g.leaks++;
            alloc_release(a);
        }
    }
}

/* The end of context c (cuCtxDestroy_v2, the last release of a primary
 * context): the queued work runs, its streams and events are destroyed
 * (their handles are unknown from now on), its memory goes. */
static void ctx_end(struct ctx *c) {
    queue_run();
    for (size_t i = g.nstreams; i-- > 0;)
        if (g.streams[i].ctx == c) stream_remove(&g.streams[i]);
    for (size_t i = g.nevents; i-- > 0;)
        if (g.events[i].ctx == c) event_remove(&g.events[i]);
    ctx_drop_memory(c);
}

/* Whether the driver's memory a lives on a device: queued work touches it. */
static bool on_device(const struct alloc *a) {
    return a && (a->kind == M_DEVICE || a->kind == M_ASYNC || a->kind == M_IPC || a->kind == M_VMM ||
                 a->kind == M_POOL || a->kind == M_POOLIMP);
}

/* Where the driver reads or writes n > 0 bytes at p: the driver's memory
 * (through the alias for device memory) or, unless `device_side`, plain
 * process memory that meets no driver mapping. A device-side argument must
 * be the driver's memory, and not the host pointer of write-combined memory
 * (its device address is another). *owner: the allocation, or NULL. */
static CUresult resolve(CUdeviceptr ptr, size_t n, bool device_side, char **cpu,
                        const struct alloc **owner) {
    uintptr_t p = (uintptr_t)ptr;
    struct alloc *a = alloc_at(p);
    *owner = a;
    if (a) {
        if (n > a->size - (p - a->base)) return CUDA_ERROR_INVALID_VALUE;
        if (device_side && a->twin && a->kind == M_HOST) return CUDA_ERROR_INVALID_VALUE;
        if (a->kind == M_VMM && a->access[a->dev->index] != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE; /* mapped, no access granted */
        *cpu = a->cpu + (p - a->base);
        return CUDA_SUCCESS;
    }
    if (device_side || p == 0 || n - 1 > UINTPTR_MAX - p || span_overlaps(p, n))
        return CUDA_ERROR_INVALID_VALUE;
    *cpu = (char *)p;
    return CUDA_SUCCESS;
}

/* ---- initialization, version, errors ---- */

/* The process's end: the queued work runs, then every entry point is
 * CUDA_ERROR_DEINITIALIZED (for atexit handlers registered before cuInit,
 * which run after this one). */
static void at_exit(void *unused) {
    (void)unused;
    lock();
    if (g.initialized && !g.forked && !(g.lenient & HM_CUDA_TEST_LENIENT_EXIT)) {
        queue_run();
        g.deinit = true;
    }
    unlock();
}

/* The library's unloading (dlclose, or the end of the process after every
 * atexit handler): the driver's own bookkeeping goes, and any later call is
 * CUDA_ERROR_DEINITIALIZED. The reservation stays mapped (memory may still
 * be mapped inside it). */
__attribute__((destructor)) static void unload(void) {
    lock();
    queue_run();
    free(g.q);
    g.q = NULL;
    g.qcap = 0;
    free(g.streams);
    g.streams = NULL;
    g.nstreams = g.capstreams = 0;
    free(g.events);
    g.events = NULL;
    g.nevents = g.capevents = 0;
    if (g.nallocs == 0 && g.nvres == 0) { /* nothing left to give back into it */
        free(g.va_free);
        g.va_free = NULL;
        g.va_nfree = g.va_capfree = 0;
        g.va_reserved = false;
    }
    g.deinit = true;
    unlock();
}

EXPORT CUresult cuInit(unsigned int Flags) {
    ENTER_BEFORE_INIT(cuInit);
    if (Flags != 0) return leave(CUDA_ERROR_INVALID_VALUE);
    if (g.ndev == 0) return leave(CUDA_ERROR_NO_DEVICE);
    CUresult r = va_reserve();
    if (r != CUDA_SUCCESS) return leave(r);
    if (!g.atexit_set) {
        /* atexit() itself, tied to this library: a dlclose runs it and
         * drops it (the sanitizers' atexit interceptors lose the tie). */
        if (__cxa_atexit(at_exit, NULL, &__dso_handle) != 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
        g.atexit_set = true;
    }
    g.initialized = true;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    ENTER_BEFORE_INIT(cuDriverGetVersion);
    if (!driverVersion) return leave(CUDA_ERROR_INVALID_VALUE);
    *driverVersion = HM_CUDA_TEST_DRIVER_VERSION;
    return leave(CUDA_SUCCESS);
}

#define CT_ERRORS(X)                                                                       \
    X(CUDA_SUCCESS, "no error")                                                            \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                        \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                           \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                  \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                    \
    X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                            \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                          \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                 \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                \
    X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                            \
    X(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")                        \
    X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                \
    X(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                                        \
    X(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered")                 \
    X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use")                         \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
    X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS") \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                \
    X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")  \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                      \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                            \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")              \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")            \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled")              \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process") \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                             \
    X(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted")                       \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                              \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                 \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                 \
    X(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                           \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination") \
    X(CUDA_ERROR_TIMEOUT, "timeout")                                                       \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
#define X(code, text) {code, #code, text},
    CT_ERRORS(X)
#undef X
};

static CUresult error_lookup(CUresult e, bool name, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == e) {
            *pStr = name ? errors[i].name : errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
    ENTER_BEFORE_INIT(cuGetErrorName);
    return leave(error_lookup(error, true, pStr));
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) {
    ENTER_BEFORE_INIT(cuGetErrorString);
    return leave(error_lookup(error, false, pStr));
}

/* ---- devices ---- */

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ENTER(cuDeviceGet);
    if (!device) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, ordinal);
    *device = (CUdevice)d->index;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    ENTER(cuDeviceGetCount);
    if (!count) return leave(CUDA_ERROR_INVALID_VALUE);
    *count = (int)g.ndev;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    ENTER(cuDeviceGetName);
    if (!name || len <= 0) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    snprintf(name, (size_t)len, "hetmem CUDA test device %u", d->index);
    return leave(CUDA_SUCCESS);
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev) {
    if (!uuid) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    /* The same in every process: IPC peers compare UUIDs. */
    static const char u[16] = {'h', 'm', 'c', 'u', 'd', 'a', 't', 'e',
                               's', 't', 'd', 'e', 'v', 0, 0, 0};
    memcpy(uuid->bytes, u, sizeof u);
    uuid->bytes[15] = (char)d->index;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    ENTER(cuDeviceGetUuid);
    return device_uuid(uuid, dev);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    ENTER(cuDeviceGetUuid_v2);
    return device_uuid(uuid, dev);
}

static int attribute_value(const struct device *d, CUdevice_attribute a) {
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 4;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return (int)d->index + 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: return g.fabric;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
        return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    default: return 0;
    }
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    ENTER(cuDeviceGetAttribute);
    if (!pi || (int)attrib < 1 || (int)attrib >= (int)CU_DEVICE_ATTRIBUTE_MAX)
        return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    *pi = attribute_value(d, attrib);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    ENTER(cuDeviceTotalMem_v2);
    if (!bytes) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    *bytes = (size_t)d->limit;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    ENTER(cuDeviceCanAccessPeer);
    if (!canAccessPeer) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    FIND_DEVICE(p, peerDev);
    *canAccessPeer = g.peer[d->index][p->index];
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    ENTER(cuDeviceGetDefaultMemPool);
    if (!pool_out) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    *pool_out = (CUmemoryPool)(void *)&d->pool;
    return leave(CUDA_SUCCESS);
}

/* ---- contexts ---- */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    ENTER(cuDevicePrimaryCtxRetain);
    if (!pctx) return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, dev);
    d->primary.refs++;
    *pctx = (CUcontext)(void *)&d->primary;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER(cuDevicePrimaryCtxRelease_v2);
    FIND_DEVICE(d, dev);
    if (d->primary.refs == 0) return leave(CUDA_ERROR_INVALID_CONTEXT);
    if (--d->primary.refs == 0) ctx_end(&d->primary); /* the reset */
    return leave(CUDA_SUCCESS);
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev) {
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK)) return CUDA_ERROR_INVALID_VALUE;
    struct device *d = device_at(dev);
    if (!d) return CUDA_ERROR_INVALID_DEVICE;
    if (t_depth == CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    struct ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = 0x43545843; /* "CXTC" */
    c->flags = flags;
    c->dev = d;
    c->next = g.ctxs;
    g.ctxs = c;
    t_stack[t_depth++] = c;
    *pctx = (CUcontext)(void *)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    ENTER(cuCtxCreate_v2);
    return leave(ctx_create(pctx, flags, dev));
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                               unsigned int flags, CUdevice dev) {
    ENTER(cuCtxCreate_v4);
    if (ctxCreateParams) {
        const CUctxCreateParams *p = ctxCreateParams;
        if (!p->execAffinityParams && !p->numExecAffinityParams && !p->cigParams)
            return leave(CUDA_ERROR_INVALID_VALUE); /* exactly one must be set */
        return leave(CUDA_ERROR_NOT_SUPPORTED);
    }
    return leave(ctx_create(pctx, flags, dev));
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    ENTER(cuCtxDestroy_v2);
    if (!ctx) return leave(CUDA_ERROR_INVALID_VALUE);
    struct ctx *c = ctx_find(ctx);
    if (!c || c->primary || c->destroyed) return leave(CUDA_ERROR_INVALID_CONTEXT);
    ctx_end(c);
    c->destroyed = true;
    if (current() == c) t_depth--;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    ENTER(cuCtxGetCurrent);
    if (!pctx) return leave(CUDA_ERROR_INVALID_VALUE);
    *pctx = (CUcontext)(void *)current();
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER(cuCtxSetCurrent);
    if (!ctx) {
        if (t_depth) t_depth--;
        return leave(CUDA_SUCCESS);
    }
    struct ctx *c = ctx_find(ctx);
    if (!c || c->destroyed) return leave(CUDA_ERROR_INVALID_CONTEXT);
    if (t_depth)
        t_stack[t_depth - 1] = c;
    else
        t_stack[t_depth++] = c;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    ENTER(cuCtxPushCurrent_v2);
    if (!ctx) return leave(CUDA_ERROR_INVALID_VALUE);
    struct ctx *c = ctx_find(ctx);
    if (!c || c->destroyed) return leave(CUDA_ERROR_INVALID_CONTEXT);
    if (t_depth == CTX_STACK_MAX) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    t_stack[t_depth++] = c;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    ENTER(cuCtxPopCurrent_v2);
    if (!t_depth) return leave(CUDA_ERROR_INVALID_CONTEXT);
    struct ctx *c = t_stack[--t_depth];
    if (pctx) *pctx = (CUcontext)(void *)c;
    return leave(CUDA_SUCCESS);
}

/* The context a *_v2 query names: ctx, or the current one for NULL. */
static CUresult ctx_named(CUcontext ctx, struct ctx **out) {
    struct ctx *c = current();
    if (ctx) {
        c = ctx_find(ctx);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult r = ctx_usable(c);
    if (r == CUDA_SUCCESS) *out = c;
    return r;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    ENTER(cuCtxGetDevice);
    if (!device) return leave(CUDA_ERROR_INVALID_VALUE);
    CURRENT(c);
    *device = (CUdevice)c->dev->index;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    ENTER(cuCtxGetDevice_v2);
    if (!device) return leave(CUDA_ERROR_INVALID_VALUE);
    struct ctx *c;
    CUresult r = ctx_named(ctx, &c);
    if (r == CUDA_SUCCESS) *device = (CUdevice)c->dev->index;
    return leave(r);
}

EXPORT CUresult cuCtxSynchronize(void) {
    ENTER(cuCtxSynchronize);
    CURRENT(c);
    (void)c;
    queue_run();
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    ENTER(cuCtxSynchronize_v2);
    struct ctx *c;
    CUresult r = ctx_named(ctx, &c);
    if (r == CUDA_SUCCESS) queue_run();
    return leave(r);
}

/* ---- memory ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    ENTER(cuMemAlloc_v2);
    CURRENT(c);
    if (!dptr) return leave(CUDA_ERROR_INVALID_VALUE);
    struct alloc *a;
    CUresult r = mem_alloc(c, M_DEVICE, bytesize, false, &a);
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)a->base;
    return leave(r);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER(cuMemFree_v2);
    CURRENT(c);
    (void)c;
    struct alloc *a = alloc_at((uintptr_t)dptr);
    if (!a || a->base != (uintptr_t)dptr ||
        (a->kind != M_DEVICE && a->kind != M_ASYNC && a->kind != M_MANAGED && a->kind != M_POOL &&
         a->kind != M_POOLIMP))
        return leave(CUDA_ERROR_INVALID_VALUE);
    if (a->kind != M_POOLIMP || --a->refs == 0) alloc_release(a);
    return leave(CUDA_SUCCESS);
}

static CUresult host_alloc(void **pp, size_t bytesize, unsigned flags) {
    CURRENT(c);
    const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                           CU_MEMHOSTALLOC_WRITECOMBINED;
    if (!pp || (flags & ~known)) return leave(CUDA_ERROR_INVALID_VALUE);
    struct alloc *a;
    const bool wc = (flags & CU_MEMHOSTALLOC_WRITECOMBINED) && !(g.lenient & HM_CUDA_TEST_LENIENT_WC);
    CUresult r = mem_alloc(c, M_HOST, bytesize, wc, &a);
    if (r == CUDA_SUCCESS) *pp = (void *)a->base;
    return leave(r);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    ENTER(cuMemAllocHost_v2);
    return host_alloc(pp, bytesize, 0);
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    ENTER(cuMemHostAlloc);
    return host_alloc(pp, bytesize, Flags);
}

EXPORT CUresult cuMemFreeHost(void *p) {
    ENTER(cuMemFreeHost);
    CURRENT(c);
    (void)c;
    struct alloc *a = alloc_at((uintptr_t)p);
    if (!a || a->base != (uintptr_t)p || a->kind != M_HOST) return leave(CUDA_ERROR_INVALID_VALUE);
    alloc_release(a);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
    ENTER(cuMemHostGetDevicePointer_v2);
    CURRENT(c);
    (void)c;
    if (!pdptr || Flags != 0) return leave(CUDA_ERROR_INVALID_VALUE);
    const struct alloc *a = alloc_at((uintptr_t)p);
    if (!a || a->kind != M_HOST) return leave(CUDA_ERROR_INVALID_VALUE);
    const uintptr_t dev = a->twin ? a->twin->base : a->base;
    *pdptr = (CUdeviceptr)(dev + ((uintptr_t)p - a->base));
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    ENTER(cuMemAllocManaged);
    CURRENT(c);
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return leave(CUDA_ERROR_INVALID_VALUE);
    struct alloc *a;
    CUresult r = mem_alloc(c, M_MANAGED, bytesize, false, &a);
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)a->base;
    return leave(r);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    ENTER(cuMemGetAddressRange_v2);
    CURRENT(c);
    (void)c;
    struct alloc *a = alloc_at((uintptr_t)dptr);
    if (!a) return leave(CUDA_ERROR_NOT_FOUND);
    if (pbase) *pbase = (CUdeviceptr)a->base;
    if (psize) *psize = a->size;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    ENTER(cuMemGetInfo_v2);
    CURRENT(c);
    if (!free_bytes || !total) return leave(CUDA_ERROR_INVALID_VALUE);
    const struct device *d = c->dev;
    *free_bytes = d->used < d->limit ? (size_t)(d->limit - d->used) : 0;
    *total = (size_t)d->limit;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    ENTER(cuMemGetAllocationGranularity);
    if (!granularity || !prop) return leave(CUDA_ERROR_INVALID_VALUE);
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return leave(CUDA_ERROR_INVALID_VALUE);
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return leave(CUDA_ERROR_INVALID_VALUE);
    FIND_DEVICE(d, prop->location.id);
    (void)d;
    *granularity = GRANULARITY;
    return leave(CUDA_SUCCESS);
}

/* ---- virtual memory management (cuMemCreate, cuMemMap, ...) ---- */

#define VMM_HANDLE_BASE ((uintptr_t)0x564d000000000000ull) /* "VM" */

/* A physical allocation's memfd is named "hm_cuda_test_vmm<device>:<size>"
 * and sealed against resizing: an importer learns the device and the size
 * from the file, and refuses any other file. */
static void vmm_prefix(char *buf, size_t n, unsigned dev) {
    snprintf(buf, n, "%s_vmm%u", MEMFD_PREFIX, dev);
}

static struct vmm *vmm_find(CUmemGenericAllocationHandle h) {
    const uint64_t id = id_of(VMM_HANDLE_BASE, (uintptr_t)h);
    if (!id) return NULL;
    for (struct vmm *v = g.vmms; v; v = v->next)
        if (v->id == id) return v->refs ? v : NULL; /* released: unknown */
    return NULL;
}

/* A new handle for fd (which the allocation takes) on device d. */
static CUresult vmm_new(int fd, size_t size, struct device *d, uint64_t charged,
                        CUmemAllocationHandleType types, CUmemGenericAllocationHandle *out) {
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    v->id = ++g.next_vmm_id;
    v->fd = fd;
    v->size = size;
    v->dev = d;
    v->charged = charged;
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.requestedHandleTypes = types;
    v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    v->prop.location.id = (int)d->index;
    v->refs = 1;
    v->next = g.vmms;
    g.vmms = v;
    d->used += charged;
    *out = (CUmemGenericAllocationHandle)handle_of(VMM_HANDLE_BASE, v->id);
    return CUDA_SUCCESS;
}

/* Frees v once no handle reference and no mapping is left. */
static void vmm_put(struct vmm *v) {
    if (v->refs || v->maps) return;
    struct vmm **pp = &g.vmms;
    while (*pp != v) pp = &(*pp)->next;
    *pp = v->next;
    close(v->fd);
    v->dev->used -= v->charged;
    free(v);
}

/* The cuMemAddressReserve range that holds [p, p + n), or -1. */
static long vres_holder(uintptr_t p, size_t n) {
    for (size_t i = 0; i < g.nvres; i++)
        if (g.vres[i].lo <= p && p < g.vres[i].hi && n <= g.vres[i].hi - p) return (long)i;
    return -1;
}

/* Whether [p, p + n) is exactly a run of whole adjacent mappings. */
static bool vmm_whole(uintptr_t p, size_t n) {
    if (n == 0 || n - 1 > UINTPTR_MAX - p) return false;
    for (uintptr_t q = p; q < p + n;) {
        const struct alloc *a = alloc_at(q);
        if (!a || a->kind != M_VMM || a->base != q || a->size > p + n - q) return false;
        q += a->size;
    }
    return true;
}

/* Fabric handles (HM_CUDA_TEST_FABRIC=1). The 64 bytes name the exporter's
 * memfd: [0,4) magic 0x42464d48 ("HMFB"), [4,8) exporter pid, [8,12) the
 * memfd's number there, [12,16) device ordinal, [16,24) size, [24,32) the
 * nonce, [32,40) st_ino, [40,48) st_dev, [48,64) zero. The nonce is random
 * per allocation and kept as the file offset of the allocation's open file
 * description (the driver never reads or writes through it; every
 * duplicate, pidfd_getfd's too, shares it and no other process can set
 * it), so an importer checks it on the descriptor it fetched. */
#define FABRIC_MAGIC 0x42464d48u
#define FABRIC_NONCE_MASK (((uint64_t)1 << 62) - 1)

static bool fabric_nonce_set(int fd) {
    uint64_t n = 0;
    while (!(n & FABRIC_NONCE_MASK))
        if (getrandom(&n, sizeof n, 0) != (ssize_t)sizeof n) return false;
    n &= FABRIC_NONCE_MASK;
    return lseek(fd, (off_t)n, SEEK_SET) == (off_t)n;
}

static CUresult fabric_export(unsigned char out[64], const struct vmm *v) {
    struct stat st;
    off_t nonce = lseek(v->fd, 0, SEEK_CUR);
    if (nonce <= 0 || fstat(v->fd, &st) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    uint32_t w[4] = {FABRIC_MAGIC, (uint32_t)getpid(), (uint32_t)v->fd, v->dev->index};
    uint64_t q[4] = {v->size, (uint64_t)nonce, (uint64_t)st.st_ino, (uint64_t)st.st_dev};
    memset(out, 0, 64);
    memcpy(out, w, sizeof w);
    memcpy(out + 16, q, sizeof q);
    return CUDA_SUCCESS;
}

/* The exporter's memfd, fetched with pidfd_open + pidfd_getfd (ptrace
 * access to the exporter, as for the IPC layer's own transport) and checked
 * against every field: a value that names anything else is refused. The
 * importer's own descriptor in *own. */
static CUresult fabric_fetch(const unsigned char in[64], struct device **d, uint64_t *size,
                             int *own) {
    uint32_t w[4];
    uint64_t q[4];
    memcpy(w, in, sizeof w);
    memcpy(q, in + 16, sizeof q);
    for (int i = 48; i < 64; i++)
        if (in[i]) return CUDA_ERROR_INVALID_VALUE;
    if (w[0] != FABRIC_MAGIC || !w[1] || w[3] >= HM_CUDA_TEST_MAX_DEVICES || !q[0] ||
        q[0] % GRANULARITY || !q[1] || (q[1] & ~FABRIC_NONCE_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)w[1], 0);
    if (pidfd < 0) return errno == EPERM ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, (int)w[2], 0);
    int e = errno;
    close(pidfd);
    if (fd < 0) return e == EPERM || e == EACCES ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    char prefix[32];
    vmm_prefix(prefix, sizeof prefix, w[3]);
    struct stat st;
    if (sized_memfd_size(prefix, fd) != q[0] || fstat(fd, &st) != 0 ||
        (uint64_t)st.st_size != q[0] || (uint64_t)st.st_ino != q[2] ||
        (uint64_t)st.st_dev != q[3] || lseek(fd, 0, SEEK_CUR) != (off_t)q[1]) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *d = device_at((CUdevice)w[3]);
    if (!*d) { /* memory of a device this process lacks */
        close(fd);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *size = q[0];
    *own = fd;
    return CUDA_SUCCESS;
}

static CUresult prop_device(const CUmemAllocationProp *prop, struct device **d) {
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    *d = device_at(prop->location.id);
    return *d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    ENTER(cuMemCreate);
    if (!handle || !prop || flags != 0 || size == 0 || size % GRANULARITY)
        return leave(CUDA_ERROR_INVALID_VALUE);
    struct device *d;
    CUresult r = prop_device(prop, &d);
    if (r != CUDA_SUCCESS) return leave(r);
    const unsigned types = (unsigned)prop->requestedHandleTypes;
    if ((types & CU_MEM_HANDLE_TYPE_FABRIC) && !g.fabric) return leave(CUDA_ERROR_NOT_SUPPORTED);
    if (types & ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
        return leave(CUDA_ERROR_INVALID_VALUE); /* Win32 handles on Linux */
    if (d->used > d->limit || size > d->limit - d->used) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    char prefix[32];
    vmm_prefix(prefix, sizeof prefix, d->index);
    int fd = sized_memfd_create(prefix, size);
    if (fd < 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    if (ftruncate(fd, (off_t)size) != 0 || !sized_memfd_seal(fd)) {
        close(fd);
        return leave(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if ((types & CU_MEM_HANDLE_TYPE_FABRIC) && !fabric_nonce_set(fd)) {
        close(fd);
        return leave(CUDA_ERROR_OUT_OF_MEMORY);
    }
    r = vmm_new(fd, size, d, size, prop->requestedHandleTypes, handle);
    if (r != CUDA_SUCCESS) close(fd);
    return leave(r);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    ENTER(cuMemRelease);
    struct vmm *v = vmm_find(handle);
    if (!v) return leave(CUDA_ERROR_INVALID_VALUE);
    v->refs--;
    vmm_put(v);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags) {
    ENTER(cuMemAddressReserve);
    if (!ptr || size == 0 || size % HOST_PAGE || addr % HOST_PAGE || flags != 0 ||
        (alignment & (alignment - 1)))
        return leave(CUDA_ERROR_INVALID_VALUE);
    size_t align = alignment ? alignment : GRANULARITY;
    if (align < HOST_PAGE) align = HOST_PAGE;
    if (g.nvres == g.capvres) {
        size_t cap = g.capvres ? 2 * g.capvres : 8;
        struct range *v = realloc(g.vres, cap * sizeof *v);
        if (!v) return leave(CUDA_ERROR_OUT_OF_MEMORY);
        g.vres = v;
        g.capvres = cap;
    }
    uintptr_t at = 0;
    long i = addr && addr % align == 0 && size <= UINTPTR_MAX - addr
                 ? va_holder((uintptr_t)addr, (uintptr_t)addr + size) : -1;
    if (i >= 0 && va_take(i, (uintptr_t)addr, (uintptr_t)addr + size)) /* the hint is free */
        at = (uintptr_t)addr;
    else
        at = va_alloc(size, align);
    if (!at) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    g.vres[g.nvres++] = (struct range){at, at + size};
    *ptr = (CUdeviceptr)at;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    ENTER(cuMemAddressFree);
    long i = vres_holder((uintptr_t)ptr, size);
    if (i < 0 || g.vres[i].lo != (uintptr_t)ptr || g.vres[i].hi - g.vres[i].lo != size ||
        span_overlaps((uintptr_t)ptr, size)) /* mappings left */
        return leave(CUDA_ERROR_INVALID_VALUE);
    va_give(g.vres[i].lo, g.vres[i].hi);
    g.vres[i] = g.vres[--g.nvres];
    if (g.nvres == 0) {
        free(g.vres);
        g.vres = NULL;
        g.capvres = 0;
    }
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    ENTER(cuMemMap);
    const uintptr_t p = (uintptr_t)ptr;
    struct vmm *v = vmm_find(handle);
    if (!v || flags != 0 || offset != 0 || size == 0 || p % GRANULARITY || size % GRANULARITY ||
        size > v->size || vres_holder(p, size) < 0 || span_overlaps(p, size))
        return leave(CUDA_ERROR_INVALID_VALUE);
    struct alloc *a = calloc(1, sizeof *a);
    if (!a || !table_reserve(1)) goto fail;
    a->cpu = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
    if (a->cpu == MAP_FAILED) goto fail;
    if (!map_at(p, v->fd, size)) {
        munmap(a->cpu, size);
        goto fail;
    }
    a->base = p;
    a->size = a->span = size;
    a->fd = -1;
    a->id = g.next_id++;
    a->kind = M_VMM;
    a->dev = v->dev;
    a->vmm = v;
    table_insert(a);
    v->maps++;
    return leave(CUDA_SUCCESS);
fail:
    free(a);
    return leave(CUDA_ERROR_OUT_OF_MEMORY);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    ENTER(cuMemUnmap);
    const uintptr_t p = (uintptr_t)ptr;
    if (!vmm_whole(p, size)) return leave(CUDA_ERROR_INVALID_VALUE);
    queue_run(); /* the queued work may touch it */
    for (uintptr_t q = p; q < p + size;) {
        struct alloc *a = alloc_at(q);
        q += a->size;
        table_remove(a);
        munmap(a->cpu, a->span);
        if (mmap((void *)a->base, a->span, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
            die("re-reserving %#llx: %s", (unsigned long long)a->base, strerror(errno));
        struct vmm *v = a->vmm;
        free(a);
        v->maps--;
        vmm_put(v);
    }
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count) {
    ENTER(cuMemSetAccess);
    const uintptr_t p = (uintptr_t)ptr;
    if (!desc || count == 0 || !vmm_whole(p, size)) return leave(CUDA_ERROR_INVALID_VALUE);
    for (size_t k = 0; k < count; k++) {
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return leave(CUDA_ERROR_INVALID_VALUE);
        if (!device_at(desc[k].location.id)) return leave(CUDA_ERROR_INVALID_DEVICE);
        if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) return leave(CUDA_ERROR_NOT_SUPPORTED);
        if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return leave(CUDA_ERROR_INVALID_VALUE);
    }
    queue_run(); /* access changes after the work queued before */
    for (uintptr_t q = p; q < p + size;) {
        struct alloc *a = alloc_at(q);
        for (size_t k = 0; k < count; k++)
            a->access[desc[k].location.id] = (unsigned char)desc[k].flags;
        q += a->size;
    }
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                               CUdeviceptr ptr) {
    ENTER(cuMemGetAccess);
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return leave(CUDA_ERROR_INVALID_VALUE);
    if (!device_at(location->id)) return leave(CUDA_ERROR_INVALID_DEVICE);
    const struct alloc *a = alloc_at((uintptr_t)ptr);
    if (!a || a->kind != M_VMM) return leave(CUDA_ERROR_INVALID_VALUE);
    *flags = a->access[location->id];
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags) {
    ENTER(cuMemExportToShareableHandle);
    if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
        if (!g.fabric) return leave(CUDA_ERROR_NOT_SUPPORTED);
        const struct vmm *fv = vmm_find(handle);
        if (!shareableHandle || !fv || flags != 0 ||
            !(fv->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC))
            return leave(CUDA_ERROR_INVALID_VALUE);
        return leave(fabric_export(shareableHandle, fv));
    }
    struct vmm *v = vmm_find(handle);
    if (!shareableHandle || !v || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        !(v->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return leave(CUDA_ERROR_INVALID_VALUE);
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    memcpy(shareableHandle, &fd, sizeof fd);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType) {
    ENTER(cuMemImportFromShareableHandle);
    if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC) {
        if (!g.fabric) return leave(CUDA_ERROR_NOT_SUPPORTED);
        if (!handle || !osHandle) return leave(CUDA_ERROR_INVALID_VALUE);
        struct device *fd_dev = NULL;
        uint64_t fsize = 0;
        int own = -1;
        CUresult fr = fabric_fetch(osHandle, &fd_dev, &fsize, &own);
        if (fr != CUDA_SUCCESS) return leave(fr);
        fr = vmm_new(own, (size_t)fsize, fd_dev, 0, CU_MEM_HANDLE_TYPE_FABRIC, handle);
        if (fr != CUDA_SUCCESS) close(own);
        return leave(fr);
    }
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return leave(CUDA_ERROR_INVALID_VALUE);
    const intptr_t fd = (intptr_t)osHandle;
    if (fd < 0 || fd > INT32_MAX) return leave(CUDA_ERROR_INVALID_VALUE);
    struct stat st;
    if (fstat((int)fd, &st) != 0) return leave(CUDA_ERROR_INVALID_VALUE);
    /* the device from the name; one this process does not have: NOT_SUPPORTED */
    for (unsigned dev = 0; dev < HM_CUDA_TEST_MAX_DEVICES; dev++) {
        char prefix[32];
        vmm_prefix(prefix, sizeof prefix, dev);
        const uint64_t size = sized_memfd_size(prefix, (int)fd);
        if (size == 0) continue;
        if (size % GRANULARITY || (uint64_t)st.st_size != size) return leave(CUDA_ERROR_INVALID_VALUE);
        struct device *d = device_at((CUdevice)dev);
        if (!d) return leave(CUDA_ERROR_NOT_SUPPORTED);
        int own = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
        CUresult r = vmm_new(own, (size_t)size, d, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, handle);
        if (r != CUDA_SUCCESS) close(own);
        return leave(r);
    }
    return leave(CUDA_ERROR_INVALID_VALUE);
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    ENTER(cuMemRetainAllocationHandle);
    const struct alloc *a = alloc_at((uintptr_t)addr);
    if (!handle || !a || a->kind != M_VMM) return leave(CUDA_ERROR_INVALID_VALUE);
    a->vmm->refs++;
    *handle = (CUmemGenericAllocationHandle)handle_of(VMM_HANDLE_BASE, a->vmm->id);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                       CUmemGenericAllocationHandle handle) {
    ENTER(cuMemGetAllocationPropertiesFromHandle);
    const struct vmm *v = vmm_find(handle);
    if (!prop || !v) return leave(CUDA_ERROR_INVALID_VALUE);
    *prop = v->prop;
    return leave(CUDA_SUCCESS);
}

/* ---- memset and copies ---- */

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    ENTER(cuMemsetD8_v2);
    CURRENT(c);
    (void)c;
    if (N == 0) return leave(CUDA_SUCCESS);
    char *dst;
    const struct alloc *a;
    CUresult r = resolve(dstDevice, N, true, &dst, &a);
    if (r != CUDA_SUCCESS) return leave(r);
    if (on_device(a)) { /* done at the next synchronising call */
        queue_push(dst, NULL, N, uc, (uintptr_t)CU_STREAM_LEGACY);
    } else { /* host-pinned or managed memory: synchronous */
        queue_run();
        memset(dst, uc, N);
    }
    return leave(CUDA_SUCCESS);
}

static bool host_kind(const struct alloc *a) { return a->kind == M_HOST || a->kind == M_WCDEV; }

/* A synchronous copy (async false) between device memory is queued on the
 * legacy stream; one with a host side (plain, pinned or managed memory)
 * runs the queue and then itself. An async copy (cuMemcpyAsync, on the
 * stream tagged `tag`) is queued when both sides are the driver's memory
 * and not both pinned host memory; with plain (pageable) memory on a side,
 * or host memory on both, it runs the queue and then itself. */
static CUresult copy(CUdeviceptr dst, bool dst_device, CUdeviceptr src, bool src_device, size_t n,
                     bool async, uintptr_t tag) {
    CURRENT(c);
    (void)c;
    if (n == 0) return leave(CUDA_SUCCESS);
    char *d, *s;
    const struct alloc *da, *sa;
    CUresult r = resolve(dst, n, dst_device, &d, &da);
    if (r == CUDA_SUCCESS) r = resolve(src, n, src_device, &s, &sa);
    if (r != CUDA_SUCCESS) return leave(r);
    const bool queued = async ? da && sa && !(host_kind(da) && host_kind(sa))
                              : on_device(da) && on_device(sa);
    if (queued) {
        queue_push(d, s, n, 0, async ? tag : (uintptr_t)CU_STREAM_LEGACY);
    } else {
        queue_run();
        memmove(d, s, n);
    }
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    ENTER(cuMemcpy);
    return copy(dst, false, src, false, ByteCount, false, 0);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    ENTER(cuMemcpyHtoD_v2);
    return copy(dstDevice, true, (CUdeviceptr)(uintptr_t)srcHost, false, ByteCount, false, 0);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    ENTER(cuMemcpyDtoH_v2);
    return copy((CUdeviceptr)(uintptr_t)dstHost, false, srcDevice, true, ByteCount, false, 0);
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    ENTER(cuMemcpyDtoD_v2);
    return copy(dstDevice, true, srcDevice, true, ByteCount, false, 0);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
    ENTER(cuMemsetD8Async);
    STREAM_ARG(sc, tag, hStream);
    (void)sc;
    CURRENT(c);
    (void)c;
    if (N == 0) return leave(CUDA_SUCCESS);
    char *dst;
    const struct alloc *a;
    CUresult r = resolve(dstDevice, N, true, &dst, &a);
    if (r != CUDA_SUCCESS) return leave(r);
    queue_push(dst, NULL, N, uc, tag); /* any of the driver's memory: asynchronous */
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
    ENTER(cuMemcpyAsync);
    STREAM_ARG(sc, tag, hStream);
    (void)sc;
    return copy(dst, false, src, false, ByteCount, true, tag);
}

/* ---- pointer attributes ---- */

/* Bytes written for attribute `at`; 0 for one the driver does not answer. */
static size_t attr_size(CUpointer_attribute at) {
    switch (at) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return sizeof(int);
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MAPPED: return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: return sizeof(CUmemoryPool);
    default: return 0;
    }
}

/* Attribute `at` of p, in a (not NULL), into data. CUDA_ERROR_INVALID_VALUE
 * when p has no such value (a host pointer of device memory). */
static CUresult attr_get(const struct alloc *a, CUpointer_attribute at, uintptr_t p, void *data) {
    union {
        CUcontext ctx;
        unsigned int u;
        int i;
        CUdeviceptr dp;
        void *ptr;
        unsigned long long ull;
        size_t sz;
        CUmemoryPool pool;
    } v;
    memset(&v, 0, sizeof v);
    switch (at) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: v.ctx = (CUcontext)(void *)a->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        v.u = a->kind == M_HOST || a->kind == M_WCDEV ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: /* write-combined: the other address */
        v.dp = (CUdeviceptr)(a->kind == M_HOST && a->twin ? a->twin->base + (p - a->base) : p);
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (a->kind != M_HOST && a->kind != M_MANAGED && a->kind != M_WCDEV)
            return CUDA_ERROR_INVALID_VALUE;
        v.ptr = (void *)(a->kind == M_WCDEV ? a->twin->base + (p - a->base) : p);
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: v.ull = a->id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: v.u = a->kind == M_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: v.i = (int)a->dev->index; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: v.u = a->kind == M_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: /* a mapping: its reservation */
        v.dp = (CUdeviceptr)(a->kind == M_VMM ? g.vres[vres_holder(a->base, a->size)].lo : a->base);
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        if (a->kind == M_VMM) {
            const struct range r = g.vres[vres_holder(a->base, a->size)];
            v.sz = r.hi - r.lo;
        } else {
            v.sz = a->size;
        }
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED: v.u = 1; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        v.pool = a->kind == M_ASYNC ? (CUmemoryPool)(void *)&a->dev->pool
                 : a->mpool         ? pool_handle(a->mpool)
                                    : NULL;
        break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(data, &v, attr_size(at));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    ENTER(cuPointerGetAttribute);
    if (!data || !attr_size(attribute)) return leave(CUDA_ERROR_INVALID_VALUE);
    const struct alloc *a = alloc_at((uintptr_t)ptr);
    if (!a) return leave(CUDA_ERROR_INVALID_VALUE);
    if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_POINTER) {
        CURRENT(c);
        (void)c;
    }
    return leave(attr_get(a, attribute, (uintptr_t)ptr, data));
}

EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                       void **data, CUdeviceptr ptr) {
    ENTER(cuPointerGetAttributes);
    if (numAttributes == 0 || !attributes || !data) return leave(CUDA_ERROR_INVALID_VALUE);
    for (unsigned i = 0; i < numAttributes; i++)
        if (!data[i] || !attr_size(attributes[i])) return leave(CUDA_ERROR_INVALID_VALUE);
    const struct alloc *a = alloc_at((uintptr_t)ptr);
    for (unsigned i = 0; i < numAttributes; i++)
        if (!a || attr_get(a, attributes[i], (uintptr_t)ptr, data[i]) != CUDA_SUCCESS)
            memset(data[i], 0, attr_size(attributes[i]));
    return leave(CUDA_SUCCESS);
}

/* ---- IPC ---- */

enum {
    IPC_MAGIC_AT = 0,  /* u32 */
    IPC_PID = 4,       /* u32 */
    IPC_FD = 8,        /* i32 */
    IPC_DEVICE = 12,   /* u32 */
    IPC_ID = 16,       /* u64 */
    IPC_SIZE = 24,     /* u64 */
    IPC_NONCE = 32,    /* u64 */
    IPC_INO = 40,      /* u64 */
    IPC_FSDEV = 48,    /* u64 */
    IPC_BASE = 56,     /* u64: the allocation's address in the exporter */
};
_Static_assert(IPC_BASE + 8 == CU_IPC_HANDLE_SIZE, "the handle is 64 bytes");

static void put32(CUipcMemHandle *h, size_t at, uint32_t v) { memcpy(h->reserved + at, &v, 4); }
static void put64(CUipcMemHandle *h, size_t at, uint64_t v) { memcpy(h->reserved + at, &v, 8); }
static uint32_t get32(const CUipcMemHandle *h, size_t at) {
    uint32_t v;
    memcpy(&v, h->reserved + at, 4);
    return v;
}
static uint64_t get64(const CUipcMemHandle *h, size_t at) {
    uint64_t v;
    memcpy(&v, h->reserved + at, 8);
    return v;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    ENTER(cuIpcGetMemHandle);
    CURRENT(c);
    (void)c;
    if (!pHandle) return leave(CUDA_ERROR_INVALID_VALUE);
    /* Device memory of cuMemAlloc_v2 only; an interior pointer names the
     * whole allocation. */
    const struct alloc *a = alloc_at((uintptr_t)dptr);
    if (!a || a->kind != M_DEVICE) return leave(CUDA_ERROR_INVALID_VALUE);
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    put32(&h, IPC_MAGIC_AT, IPC_MAGIC);
    put32(&h, IPC_PID, (uint32_t)getpid());
    put32(&h, IPC_FD, (uint32_t)a->fd);
    put32(&h, IPC_DEVICE, a->dev->index);
    put64(&h, IPC_ID, a->id);
    put64(&h, IPC_SIZE, a->size);
    put64(&h, IPC_NONCE, g.nonce);
    put64(&h, IPC_INO, (uint64_t)a->ino);
    put64(&h, IPC_FSDEV, (uint64_t)a->fsdev);
    put64(&h, IPC_BASE, (uint64_t)a->base);
    *pHandle = h;
    return leave(CUDA_SUCCESS);
}

static CUresult ipc_open(struct ctx *c, const CUipcMemHandle *h, CUdeviceptr *pdptr) {
    const uint32_t pid = get32(h, IPC_PID), hdev = get32(h, IPC_DEVICE);
    const int32_t fd_there = (int32_t)get32(h, IPC_FD);
    const uint64_t id = get64(h, IPC_ID), size = get64(h, IPC_SIZE), nonce = get64(h, IPC_NONCE);
    const uint64_t there = get64(h, IPC_BASE);
    if (get32(h, IPC_MAGIC_AT) != IPC_MAGIC || there == 0 || there % HOST_PAGE || pid == 0 ||
        fd_there < 0 || hdev >= HM_CUDA_TEST_MAX_DEVICES || size == 0 ||
        size > SIZE_MAX - GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    if (pid == (uint32_t)getpid() && nonce == g.nonce) return CUDA_ERROR_INVALID_VALUE;

    /* Already open here: in this context (a repeat), or in another context
     * of this device, which may not open this exporter's device's handles. */
    for (size_t i = 0; i < g.nallocs; i++) {
        struct alloc *a = g.allocs[i];
        if (a->kind != M_IPC || a->exp_pid != pid || a->exp_nonce != nonce || a->exp_dev != hdev)
            continue;
        if (a->ctx == c && a->exp_id == id) {
            g.ipc_open_repeats++;
            if (g.strict_ipc) return CUDA_ERROR_ALREADY_MAPPED;
            a->refs++;
            *pdptr = (CUdeviceptr)a->base;
            return CUDA_SUCCESS;
        }
        if (a->ctx != c && a->dev == c->dev) return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (hdev != c->dev->index && !g.peer[c->dev->index][hdev])
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;

    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", (unsigned)pid, (int)fd_there);
    /* O_NONBLOCK, O_NOCTTY: a stale number may name a FIFO or a tty now */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE; /* exporter gone, or the fd */
    /* The size is the allocation's, read from its memfd (sized_memfd_create), not
     * the handle's size bytes: a peer may rewrite those. The file is as long
     * as the allocation spans (4 KiB or 2 MiB units). */
    struct stat st;
    const uint64_t asked = sized_memfd_size(MEMFD_PREFIX, fd);
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != get64(h, IPC_INO) ||
        (uint64_t)st.st_dev != get64(h, IPC_FSDEV) || asked == 0 ||
        asked > SIZE_MAX - GRANULARITY || st.st_size < (off_t)asked || st.st_size % HOST_PAGE ||
        (uint64_t)st.st_size > ((asked + GRANULARITY - 1) & ~(uint64_t)(GRANULARITY - 1))) {
        close(fd); /* another file under that number now */
        return CUDA_ERROR_INVALID_HANDLE;
    }
    const size_t span = (size_t)st.st_size;

    /* Where: the exporter's address, as unified addressing gives it. Taken
     * by a mapping of another allocation of the same exporter (the exporter
     * freed it and the address came back in a new allocation, while this
     * process still maps the old one): CUDA_ERROR_ALREADY_MAPPED. Taken by
     * anything else here: another free address of the reservation. */
    uintptr_t at = 0;
    const bool anywhere = g.lenient & HM_CUDA_TEST_LENIENT_IPC_ANYWHERE;
    if (!anywhere && there <= UINTPTR_MAX - span) {
        for (size_t i = 0; i < g.nallocs; i++) {
            const struct alloc *o = g.allocs[i];
            if (o->kind == M_IPC && o->exp_pid == pid && o->exp_nonce == nonce && o->exp_id != id &&
                o->base < there + span && there < o->base + o->span) {
                close(fd);
                return CUDA_ERROR_ALREADY_MAPPED;
            }
        }
        long i = va_holder((uintptr_t)there, (uintptr_t)there + span);
        if (i >= 0 && va_take(i, (uintptr_t)there, (uintptr_t)there + span)) at = (uintptr_t)there;
    }
    if (!at) at = va_alloc(span, (size_t)asked >= GRANULARITY ? GRANULARITY : HOST_PAGE);
    struct alloc *a = at ? calloc(1, sizeof *a) : NULL;
    char *cpu = MAP_FAILED;
    if (a && table_reserve(1)) cpu = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (cpu == MAP_FAILED || !map_at(at, fd, span)) {
        if (cpu != MAP_FAILED) munmap(cpu, span);
        if (at) va_give(at, at + span);
        close(fd);
        free(a);
        return CUDA_ERROR_MAP_FAILED;
    }
    close(fd); /* the mappings hold the file */
    a->base = at;
    a->size = (size_t)asked;
    a->span = span;
    a->cpu = cpu;
    a->in_va = true;
    a->fd = -1;
    a->ino = st.st_ino;
    a->fsdev = st.st_dev;
    a->id = g.next_id++;
    a->kind = M_IPC;
    a->ctx = c;
    a->dev = c->dev;
    a->refs = 1;
    a->exp_pid = pid;
    a->exp_dev = hdev;
    a->exp_nonce = nonce;
    a->exp_id = id;
    table_insert(a);
    *pdptr = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    ENTER(cuIpcOpenMemHandle_v2);
    CURRENT(c);
    if (!pdptr || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return leave(CUDA_ERROR_INVALID_VALUE);
    return leave(ipc_open(c, &handle, pdptr));
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    ENTER(cuIpcCloseMemHandle);
    CURRENT(c);
    (void)c;
    struct alloc *a = alloc_at((uintptr_t)dptr);
    if (!a || a->base != (uintptr_t)dptr || a->kind != M_IPC) return leave(CUDA_ERROR_INVALID_VALUE);
    if (--a->refs == 0) alloc_release(a);
    return leave(CUDA_SUCCESS);
}

/* ---- stream-ordered allocation (synchronous here) ---- */

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ENTER(cuMemAllocAsync);
    STREAM_ARG(sc, tag, hStream);
    (void)tag;
    CURRENT(c);
    (void)c;
    if (!dptr) return leave(CUDA_ERROR_INVALID_VALUE);
    CUresult r = ctx_usable(sc); /* the stream's device's pool */
    if (r != CUDA_SUCCESS) return leave(r);
    struct alloc *a;
    r = mem_alloc(sc, M_ASYNC, bytesize, false, &a);
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)a->base;
    return leave(r);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    ENTER(cuMemFreeAsync);
    STREAM_ARG(sc, tag, hStream);
    (void)sc;
    (void)tag;
    CURRENT(c);
    (void)c;
    struct alloc *a = alloc_at((uintptr_t)dptr);
    if (!a || a->base != (uintptr_t)dptr ||
        (a->kind != M_ASYNC && a->kind != M_DEVICE && a->kind != M_POOL && a->kind != M_POOLIMP))
        return leave(CUDA_ERROR_INVALID_VALUE);
    if (a->kind != M_POOLIMP || --a->refs == 0) alloc_release(a);
    return leave(CUDA_SUCCESS);
}

/* ---- memory pools with IPC (cuMemPoolCreate ... cuMemPoolImportPointer) ---- */

/* A created pool's memory is one sealed memfd, named
 * "hm_cuda_test_pool<device>:<capacity>": a header of POOL_SLOT bytes per
 * 4 KiB unit of the capacity, then the capacity. An allocation takes a run
 * of units (4 KiB below 2 MiB, 2 MiB units from 2 MiB on, as device memory)
 * and its first unit's slot names it: the id the export data carries, its
 * size and span, and how many importers map it. The pool's shareable
 * handle is a descriptor of that memfd: it gives exactly the pool's memory
 * (cuda.h: "Individual pointers can then be shared with the
 * ::cuMemPoolExportPointer and ::cuMemPoolImportPointer APIs"), and an
 * importer reads the slots through it, so that export data naming a freed
 * allocation, another one, or none is refused. Whoever holds the
 * descriptor may write the slots (as it may write the memory): an importer
 * checks every value it reads against the data and the capacity. */
#define POOL_HANDLE_BASE ((uintptr_t)0x504c000000000000ull) /* "PL" */
#define POOL_MAGIC 0x50504d48u                              /* "HMPP" */
#define POOL_UNIT HOST_PAGE

struct pool_slot {
    _Atomic uint64_t id; /* 0: no allocation starts in this unit */
    _Atomic uint64_t size, span;
    _Atomic uint32_t imports;
    uint32_t pad;
};
#define POOL_SLOT sizeof(struct pool_slot)
_Static_assert(sizeof(struct pool_slot) == 32, "a slot is 32 bytes");

/* A created (imported false) or imported pool. Lives until destroyed and
 * `live` (its allocations here, or its imported pointers) is 0. */
struct mpool {
    uint64_t id; /* the handle encodes it (handle_of()) */
    bool imported, destroyed;
    int fd;
    struct device *dev;
    CUmemAllocationHandleType types;
    size_t cap, hdr; /* the capacity, and the header before it in the file */
    struct pool_slot *slots; /* the header, mapped shared */
    ino_t ino;
    dev_t fsdev;
    struct range *free; /* created pools: free offsets in [0, cap), sorted */
    size_t nfree, capfree;
    unsigned live;
    struct mpool *next;
};

static size_t pool_hdr(size_t cap) {
    return ((cap / POOL_UNIT) * POOL_SLOT + HOST_PAGE - 1) & ~(HOST_PAGE - 1);
}

static void pool_prefix(char *buf, size_t n, unsigned dev) {
    snprintf(buf, n, "%s_pool%u", MEMFD_PREFIX, dev);
}

static CUmemoryPool pool_handle(const struct mpool *p) {
    return (CUmemoryPool)(void *)handle_of(POOL_HANDLE_BASE, p->id);
}

/* The live (not destroyed) pool behind a handle, or NULL. */
static struct mpool *pool_find(CUmemoryPool h) {
    const uint64_t id = id_of(POOL_HANDLE_BASE, (uintptr_t)h);
    if (!id) return NULL;
    for (struct mpool *p = g.mpools; p; p = p->next)
        if (p->id == id) return p->destroyed ? NULL : p;
    return NULL;
}

/* The device whose default pool h is, or NULL. */
static struct device *default_pool_of(CUmemoryPool h) {
    for (unsigned i = 0; i < g.ndev; i++)
        if ((void *)h == (void *)&g_devices[i].pool) return &g_devices[i];
    return NULL;
}

/* Frees p once destroyed with nothing left in it. */
static void pool_put(struct mpool *p) {
    if (!p->destroyed || p->live) return;
    struct mpool **pp = &g.mpools;
    while (*pp != p) pp = &(*pp)->next;
    *pp = p->next;
    munmap(p->slots, p->hdr);
    close(p->fd);
    free(p->free);
    free(p);
}

/* A new pool over fd (which it takes), its header mapped. */
static CUresult pool_new(int fd, struct device *d, size_t cap, bool imported,
                         CUmemAllocationHandleType types, struct mpool **out) {
    struct stat st;
    struct mpool *p = calloc(1, sizeof *p);
    if (!p || fstat(fd, &st) != 0) goto fail;
    p->hdr = pool_hdr(cap);
    p->slots = mmap(NULL, p->hdr, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p->slots == MAP_FAILED) goto fail;
    if (!imported) {
        p->free = malloc(16 * sizeof *p->free);
        if (!p->free) {
            munmap(p->slots, p->hdr);
            goto fail;
        }
        p->capfree = 16;
        p->free[0] = (struct range){0, cap};
        p->nfree = 1;
    }
    p->id = ++g.next_pool_id;
    p->imported = imported;
    p->fd = fd;
    p->dev = d;
    p->types = types;
    p->cap = cap;
    p->ino = st.st_ino;
    p->fsdev = st.st_dev;
    p->next = g.mpools;
    g.mpools = p;
    *out = p;
    return CUDA_SUCCESS;
fail:
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* len bytes at an offset aligned to `align` taken from p's free offsets
 * (first fit); UINT64_MAX when none fits. */
static uint64_t pool_take(struct mpool *p, size_t len, size_t align) {
    for (size_t i = 0; i < p->nfree; i++) {
        struct range *r = &p->free[i];
        const uintptr_t lo = (r->lo + align - 1) & ~(uintptr_t)(align - 1);
        if (lo >= r->hi || r->hi - lo < len) continue;
        if (lo > r->lo && lo + len < r->hi) { /* a hole in the middle */
            if (!table_grow((void **)&p->free, p->nfree, &p->capfree, sizeof *p->free))
                return UINT64_MAX;
            r = &p->free[i];
            memmove(r + 2, r + 1, (p->nfree - i - 1) * sizeof *r);
            r[1] = (struct range){lo + len, r->hi};
            r->hi = lo;
            p->nfree++;
        } else if (lo == r->lo && lo + len == r->hi) {
            memmove(r, r + 1, (p->nfree - i - 1) * sizeof *r);
            p->nfree--;
        } else if (lo == r->lo) {
            r->lo = lo + len;
        } else {
            r->hi = lo;
        }
        return lo;
    }
    return UINT64_MAX;
}

/* Gives [off, off + len) back to p's free offsets (coalesced). */
static void pool_give(struct mpool *p, uint64_t off, size_t len) {
    const uintptr_t lo = (uintptr_t)off, hi = lo + len;
    size_t i = 0;
    while (i < p->nfree && p->free[i].lo < lo) i++;
    const bool left = i > 0 && p->free[i - 1].hi == lo;
    const bool right = i < p->nfree && p->free[i].lo == hi;
    if (left && right) {
        p->free[i - 1].hi = p->free[i].hi;
        memmove(&p->free[i], &p->free[i + 1], (p->nfree - i - 1) * sizeof *p->free);
        p->nfree--;
    } else if (left) {
        p->free[i - 1].hi = hi;
    } else if (right) {
        p->free[i].lo = lo;
    } else {
        if (!table_grow((void **)&p->free, p->nfree, &p->capfree, sizeof *p->free))
            die("out of memory for a pool's free offsets");
        memmove(&p->free[i + 1], &p->free[i], (p->nfree - i) * sizeof *p->free);
        p->free[i] = (struct range){lo, hi};
        p->nfree++;
    }
}

/* Maps span bytes of p's memory at offset off: at `at` (taken from the
 * reservation) as device memory, and a private alias into *cpu. */
static bool pool_map(const struct mpool *p, uint64_t off, size_t span, uintptr_t at, char **cpu) {
    const off_t where = (off_t)(p->hdr + off);
    *cpu = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, where);
    if (*cpu == MAP_FAILED) return false;
    if (mmap((void *)at, span, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, where) == MAP_FAILED) {
        munmap(*cpu, span);
        return false;
    }
    return true;
}

/* The pool side of freeing a (from alloc_release). An allocation of a
 * created pool: its slot is cleared, its memory given back to the system
 * and its offsets to the pool. cuda.h, cuMemPoolImportPointer: "The imported
 * memory must be freed from all importing processes before being freed in
 * the exporting process"; a free made while importers still map it counts
 * in `pool_early_frees` (what an importer then reads is undefined: here
 * zeros, or the next allocation at that offset). An imported pointer: one
 * importer less, when the slot still names what was imported. */
static void pool_unlink(struct alloc *a) {
    struct mpool *p = a->mpool;
    struct pool_slot *sl = &p->slots[a->pool_off / POOL_UNIT];
    if (a->kind == M_POOL) {
        if (atomic_load(&sl->imports)) g.pool_early_frees++;
        atomic_store(&sl->id, 0);
        atomic_store(&sl->imports, 0);
        (void)fallocate(p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (off_t)(p->hdr + a->pool_off), (off_t)a->span);
        pool_give(p, a->pool_off, a->span);
    } else if (atomic_load(&sl->id) == a->exp_id) {
        uint32_t n = atomic_load(&sl->imports);
        while (n && !atomic_compare_exchange_weak(&sl->imports, &n, n - 1)) {
        }
    }
    a->mpool = NULL;
    p->live--;
    pool_put(p);
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    ENTER(cuMemPoolCreate);
    const CUmemPoolProps *pp = poolProps;
    if (!pool || !pp || pp->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || pp->win32SecurityAttributes)
        return leave(CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < sizeof pp->reserved; i++)
        if (pp->reserved[i]) return leave(CUDA_ERROR_INVALID_VALUE);
    if (pp->location.type == CU_MEM_LOCATION_TYPE_HOST ||
        pp->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        return leave(CUDA_ERROR_NOT_SUPPORTED); /* the test driver has device pools only */
    if (pp->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return leave(CUDA_ERROR_INVALID_VALUE);
    struct device *d = device_at(pp->location.id);
    if (!d) return leave(CUDA_ERROR_INVALID_DEVICE);
    const unsigned types = (unsigned)pp->handleTypes;
    if (types & CU_MEM_HANDLE_TYPE_FABRIC) return leave(CUDA_ERROR_NOT_SUPPORTED);
    if (types & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return leave(CUDA_ERROR_INVALID_VALUE); /* Win32 handles on Linux */
    if (pp->usage) return leave(CUDA_ERROR_NOT_SUPPORTED); /* no decompression engine */
    uint64_t cap = pp->maxSize ? pp->maxSize : d->limit;
    if (cap > VA_SIZE) return leave(CUDA_ERROR_INVALID_VALUE);
    cap = (cap + GRANULARITY - 1) & ~(uint64_t)(GRANULARITY - 1);
    char prefix[32];
    pool_prefix(prefix, sizeof prefix, d->index);
    int fd = sized_memfd_create(prefix, (size_t)cap);
    if (fd < 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    if (ftruncate(fd, (off_t)(pool_hdr((size_t)cap) + cap)) != 0 || !sized_memfd_seal(fd)) {
        close(fd);
        return leave(CUDA_ERROR_OUT_OF_MEMORY);
    }
    struct mpool *p;
    CUresult r = pool_new(fd, d, (size_t)cap, false, pp->handleTypes, &p);
    if (r != CUDA_SUCCESS) {
        close(fd);
        return leave(r);
    }
    *pool = pool_handle(p);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    ENTER(cuMemPoolDestroy);
    struct mpool *p = pool_find(pool);
    if (!p) return leave(CUDA_ERROR_INVALID_VALUE); /* a default pool too */
    p->destroyed = true;
    pool_put(p);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream) {
    ENTER(cuMemAllocFromPoolAsync);
    STREAM_ARG(sc, tag, hStream);
    (void)tag;
    if (!dptr || bytesize == 0) return leave(CUDA_ERROR_INVALID_VALUE);
    struct device *dd = default_pool_of(pool);
    if (dd) { /* a default pool: as cuMemAllocAsync, on that pool's device */
        struct alloc *a;
        CUresult r = mem_alloc(sc->dev == dd ? sc : &dd->primary, M_ASYNC, bytesize, false, &a);
        if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)a->base;
        return leave(r);
    }
    struct mpool *p = pool_find(pool);
    /* cuda.h: "imported memory pools may not be used in ...
     * cuMemAllocFromPoolAsync calls" */
    if (!p || p->imported) return leave(CUDA_ERROR_INVALID_VALUE);
    if (bytesize > p->cap) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    const size_t span = span_of(bytesize), align = align_of(bytesize);
    struct device *d = p->dev;
    if (d->used > d->limit || span > d->limit - d->used) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    struct alloc *a = calloc(1, sizeof *a);
    if (!a || !table_reserve(1)) goto fail;
    const uint64_t off = pool_take(p, span, align);
    if (off == UINT64_MAX) goto fail;
    const uintptr_t at = va_alloc(span, align);
    if (!at || !pool_map(p, off, span, at, &a->cpu)) {
        if (at) va_give(at, at + span);
        pool_give(p, off, span);
        goto fail;
    }
    a->base = at;
    a->size = bytesize;
    a->span = span;
    a->fd = -1;
    a->id = g.next_id++;
    a->kind = M_POOL;
    a->in_va = true;
    a->dev = d;
    a->charged = span;
    a->mpool = p;
    a->pool_off = off;
    d->used += span;
    struct pool_slot *sl = &p->slots[off / POOL_UNIT];
    atomic_store(&sl->size, bytesize);
    atomic_store(&sl->span, span);
    atomic_store(&sl->imports, 0);
    atomic_store(&sl->id, a->id);
    p->live++;
    table_insert(a);
    *dptr = (CUdeviceptr)at;
    return leave(CUDA_SUCCESS);
fail:
    free(a);
    return leave(CUDA_ERROR_OUT_OF_MEMORY);
}

EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags) {
    ENTER(cuMemPoolExportToShareableHandle);
    const struct mpool *p = pool_find(pool);
    if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) return leave(CUDA_ERROR_NOT_SUPPORTED);
    /* an IPC-capable pool: "create a mempool with a CUmemAllocationHandleType
     * other than CU_MEM_HANDLE_TYPE_NONE" */
    if (!handle_out || !p || p->imported || flags != 0 ||
        handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        !(p->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return leave(CUDA_ERROR_INVALID_VALUE);
    int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
    memcpy(handle_out, &fd, sizeof fd);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                   CUmemAllocationHandleType handleType,
                                                   unsigned long long flags) {
    ENTER(cuMemPoolImportFromShareableHandle);
    if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) return leave(CUDA_ERROR_NOT_SUPPORTED);
    if (!pool_out || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return leave(CUDA_ERROR_INVALID_VALUE);
    const intptr_t fd = (intptr_t)handle;
    struct stat st;
    if (fd < 0 || fd > INT32_MAX || fstat((int)fd, &st) != 0) return leave(CUDA_ERROR_INVALID_VALUE);
    for (unsigned dev = 0; dev < HM_CUDA_TEST_MAX_DEVICES; dev++) {
        char prefix[32];
        pool_prefix(prefix, sizeof prefix, dev);
        const uint64_t cap = sized_memfd_size(prefix, (int)fd);
        if (cap == 0) continue;
        if (cap % GRANULARITY || cap > VA_SIZE || (uint64_t)st.st_size != pool_hdr(cap) + cap)
            return leave(CUDA_ERROR_INVALID_VALUE);
        struct device *d = device_at((CUdevice)dev);
        if (!d) return leave(CUDA_ERROR_NOT_SUPPORTED);
        int own = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0) return leave(CUDA_ERROR_OUT_OF_MEMORY);
        struct mpool *p;
        CUresult r = pool_new(own, d, (size_t)cap, true, handleType, &p);
        if (r != CUDA_SUCCESS) {
            close(own);
            return leave(r);
        }
        *pool_out = pool_handle(p);
        return leave(CUDA_SUCCESS);
    }
    return leave(CUDA_ERROR_INVALID_VALUE);
}

/* The 64 bytes of CUmemPoolPtrExportData. */
enum {
    PX_MAGIC = 0,  /* u32 */
    PX_PID = 4,    /* u32: the exporter */
    PX_DEVICE = 8, /* u32 */
    PX_ZERO = 12,  /* u32: 0 */
    PX_ID = 16,    /* u64: the allocation's id, as in its slot */
    PX_OFF = 24,   /* u64: its offset in the pool's capacity */
    PX_SIZE = 32,  /* u64 */
    PX_INO = 40,   /* u64: the pool memfd's st_ino */
    PX_FSDEV = 48, /* u64: its st_dev */
    PX_BASE = 56,  /* u64: the allocation's address in the exporter */
};
_Static_assert(PX_BASE + 8 == sizeof(CUmemPoolPtrExportData), "the export data is 64 bytes");

static void px_put(CUmemPoolPtrExportData *x, size_t at, uint64_t v, size_t n) {
    memcpy(x->reserved + at, &v, n); /* little-endian */
}
static uint64_t px_get(const CUmemPoolPtrExportData *x, size_t at, size_t n) {
    uint64_t v = 0;
    memcpy(&v, x->reserved + at, n);
    return v;
}

EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr) {
    ENTER(cuMemPoolExportPointer);
    /* an allocation of an IPC-capable pool; an interior pointer names the
     * whole allocation (cuda.h does not say; as cuIpcGetMemHandle) */
    const struct alloc *a = alloc_at((uintptr_t)ptr);
    if (!shareData_out || !a || a->kind != M_POOL ||
        !(a->mpool->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return leave(CUDA_ERROR_INVALID_VALUE);
    CUmemPoolPtrExportData x;
    memset(&x, 0, sizeof x);
    px_put(&x, PX_MAGIC, POOL_MAGIC, 4);
    px_put(&x, PX_PID, (uint32_t)getpid(), 4);
    px_put(&x, PX_DEVICE, a->dev->index, 4);
    px_put(&x, PX_ID, a->id, 8);
    px_put(&x, PX_OFF, a->pool_off, 8);
    px_put(&x, PX_SIZE, a->size, 8);
    px_put(&x, PX_INO, (uint64_t)a->mpool->ino, 8);
    px_put(&x, PX_FSDEV, (uint64_t)a->mpool->fsdev, 8);
    px_put(&x, PX_BASE, a->base, 8);
    *shareData_out = x;
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                       CUmemPoolPtrExportData *shareData) {
    ENTER(cuMemPoolImportPointer);
    struct mpool *p = pool_find(pool);
    if (!ptr_out || !shareData || !p || !p->imported) return leave(CUDA_ERROR_INVALID_VALUE);
    const CUmemPoolPtrExportData *x = shareData;
    const uint64_t id = px_get(x, PX_ID, 8), off = px_get(x, PX_OFF, 8);
    const uint64_t size = px_get(x, PX_SIZE, 8), there = px_get(x, PX_BASE, 8);
    /* data of another pool, or malformed */
    if (px_get(x, PX_MAGIC, 4) != POOL_MAGIC || px_get(x, PX_ZERO, 4) != 0 ||
        px_get(x, PX_DEVICE, 4) != p->dev->index || px_get(x, PX_INO, 8) != (uint64_t)p->ino ||
        px_get(x, PX_FSDEV, 8) != (uint64_t)p->fsdev || !id || !size || off % POOL_UNIT ||
        off >= p->cap || there % HOST_PAGE)
        return leave(CUDA_ERROR_INVALID_VALUE);
    /* the slot must name that allocation now: freed, reused or forged data
     * is refused */
    struct pool_slot *sl = &p->slots[off / POOL_UNIT];
    const uint64_t span = atomic_load(&sl->span);
    if (atomic_load(&sl->id) != id || atomic_load(&sl->size) != size || span < size ||
        span % POOL_UNIT || span > p->cap - off)
        return leave(CUDA_ERROR_INVALID_VALUE);
    /* imported here already from this pool: the same pointer, one more
     * reference (cuda.h does not say; as cuIpcOpenMemHandle) */
    for (size_t i = 0; i < g.nallocs; i++) {
        struct alloc *o = g.allocs[i];
        if (o->kind == M_POOLIMP && o->mpool == p && o->exp_id == id && o->pool_off == off) {
            o->refs++;
            *ptr_out = (CUdeviceptr)o->base;
            return leave(CUDA_SUCCESS);
        }
    }
    /* where: the exporter's address when free here (unified addressing),
     * else the lowest free address that fits */
    uintptr_t at = 0;
    if (!(g.lenient & HM_CUDA_TEST_LENIENT_IPC_ANYWHERE) && there && there <= UINTPTR_MAX - span) {
        long i = va_holder((uintptr_t)there, (uintptr_t)there + span);
        if (i >= 0 && va_take(i, (uintptr_t)there, (uintptr_t)there + span)) at = (uintptr_t)there;
    }
    if (!at) at = va_alloc((size_t)span, size >= GRANULARITY ? GRANULARITY : HOST_PAGE);
    struct alloc *a = at ? calloc(1, sizeof *a) : NULL;
    if (!a || !table_reserve(1) || !pool_map(p, off, (size_t)span, at, &a->cpu)) {
        if (at) va_give(at, at + span);
        free(a);
        return leave(at ? CUDA_ERROR_MAP_FAILED : CUDA_ERROR_OUT_OF_MEMORY);
    }
    a->base = at;
    a->size = (size_t)size;
    a->span = (size_t)span;
    a->fd = -1;
    a->id = g.next_id++;
    a->kind = M_POOLIMP;
    a->in_va = true;
    a->dev = p->dev;
    a->mpool = p;
    a->pool_off = off;
    a->refs = 1;
    a->exp_pid = (uint32_t)px_get(x, PX_PID, 4);
    a->exp_id = id;
    atomic_fetch_add(&sl->imports, 1);
    p->live++;
    table_insert(a);
    *ptr_out = (CUdeviceptr)at;
    return leave(CUDA_SUCCESS);
}

/* ---- streams and events ---- */

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    ENTER(cuStreamCreate);
    CURRENT(c);
    if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return leave(CUDA_ERROR_INVALID_VALUE);
    if (!table_grow((void **)&g.streams, g.nstreams, &g.capstreams, sizeof *g.streams))
        return leave(CUDA_ERROR_OUT_OF_MEMORY);
    const uint64_t id = g.next_stream_id++;
    g.streams[g.nstreams++] = (struct stream){.id = id, .ctx = c, .flags = Flags};
    *phStream = (CUstream)(void *)handle_of(STREAM_HANDLE_BASE, id);
    return leave(CUDA_SUCCESS);
}

/* The stream's queued work stays queued and runs as any other. */
EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    ENTER(cuStreamDestroy_v2);
    struct stream *s = stream_find(hStream);
    if (!s) return leave(CUDA_ERROR_INVALID_HANDLE);
    stream_remove(s);
    return leave(CUDA_SUCCESS);
}

/* A created stream: the queue up to its last op; a default stream: the
 * whole queue (the legacy stream waits for every blocking stream). */
EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
    ENTER(cuStreamSynchronize);
    STREAM_ARG(sc, tag, hStream);
    (void)sc;
    if (stream_find(hStream))
        queue_run_to(stream_last(tag));
    else
        queue_run();
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamQuery(CUstream hStream) {
    ENTER(cuStreamQuery);
    STREAM_ARG(sc, tag, hStream);
    (void)sc;
    return leave(stream_last(tag) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

/* One queue in order: later work of any stream already runs after
 * everything the event captured. */
EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    ENTER(cuStreamWaitEvent);
    STREAM_ARG(sc, tag, hStream);
    (void)sc;
    (void)tag;
    if (!event_find(hEvent)) return leave(CUDA_ERROR_INVALID_HANDLE);
    if (Flags != CU_EVENT_WAIT_DEFAULT) return leave(CUDA_ERROR_INVALID_VALUE);
    return leave(CUDA_SUCCESS);
}

EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    ENTER(cuEventCreate);
    CURRENT(c);
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known) ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return leave(CUDA_ERROR_INVALID_VALUE);
    if (!table_grow((void **)&g.events, g.nevents, &g.capevents, sizeof *g.events))
        return leave(CUDA_ERROR_OUT_OF_MEMORY);
    const uint64_t id = g.next_event_id++;
    g.events[g.nevents++] = (struct event){.id = id, .ctx = c, .flags = Flags, .point = 0};
    *phEvent = (CUevent)(void *)handle_of(EVENT_HANDLE_BASE, id);
    return leave(CUDA_SUCCESS);
}

/* The event captures the queue as it is now: it completes when every op
 * queued so far has run. */
EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    ENTER(cuEventRecord);
    STREAM_ARG(sc, tag, hStream);
    (void)tag;
    struct event *e = event_find(hEvent);
    if (!e || e->ctx != sc) return leave(CUDA_ERROR_INVALID_HANDLE);
    e->point = g.q_seq;
    g.events_recorded++;
    return leave(CUDA_SUCCESS);
}

/* Runs nothing. */
EXPORT CUresult cuEventQuery(CUevent hEvent) {
    ENTER(cuEventQuery);
    const struct event *e = event_find(hEvent);
    if (!e) return leave(CUDA_ERROR_INVALID_HANDLE);
    return leave(g.q_done >= e->point ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
    ENTER(cuEventSynchronize);
    const struct event *e = event_find(hEvent);
    if (!e) return leave(CUDA_ERROR_INVALID_HANDLE);
    queue_run_to(e->point);
    return leave(CUDA_SUCCESS);
}

/* A pending event too: what it captured still runs. */
EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
    ENTER(cuEventDestroy_v2);
    struct event *e = event_find(hEvent);
    if (!e) return leave(CUDA_ERROR_INVALID_HANDLE);
    event_remove(e);
    return leave(CUDA_SUCCESS);
}

/* ---- the old ABIs: counted, then abort ---- */

__attribute__((noreturn)) static void old_abi(enum api a, const char *use) {
    pthread_once(&g_once, setup);
    lock();
    g.calls[a]++;
    unlock();
    char msg[320];
    int n = snprintf(msg, sizeof msg,
                     "libcuda (hetmem test): %s is an old ABI of the CUDA driver (32-bit sizes or "
                     "old semantics) that the real driver would run without a word; resolve %s, "
                     "the symbol cuda.h 13.0 maps %s to\n",
                     api_names[a], use, api_names[a]);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    abort();
}

/* Each with the old signature it has in the real library. */
#define OLD_ABI(name, use, params)         \
    EXPORT CUresult name params;           \
    EXPORT CUresult name params { old_abi(API_##name, use); }

OLD_ABI(cuMemAlloc, "cuMemAlloc_v2", (unsigned int *dptr, unsigned int bytesize))
OLD_ABI(cuMemFree, "cuMemFree_v2", (unsigned int dptr))
OLD_ABI(cuMemAllocHost, "cuMemAllocHost_v2", (void **pp, unsigned int bytesize))
OLD_ABI(cuMemGetAddressRange, "cuMemGetAddressRange_v2",
        (unsigned int *pbase, unsigned int *psize, unsigned int dptr))
OLD_ABI(cuMemGetInfo, "cuMemGetInfo_v2", (unsigned int *free_bytes, unsigned int *total))
OLD_ABI(cuDeviceTotalMem, "cuDeviceTotalMem_v2", (unsigned int *bytes, CUdevice dev))
OLD_ABI(cuMemcpyHtoD, "cuMemcpyHtoD_v2",
        (unsigned int dstDevice, const void *srcHost, unsigned int ByteCount))
OLD_ABI(cuMemcpyDtoH, "cuMemcpyDtoH_v2",
        (void *dstHost, unsigned int srcDevice, unsigned int ByteCount))
OLD_ABI(cuMemcpyDtoD, "cuMemcpyDtoD_v2",
        (unsigned int dstDevice, unsigned int srcDevice, unsigned int ByteCount))
OLD_ABI(cuMemsetD8, "cuMemsetD8_v2", (unsigned int dstDevice, unsigned char uc, unsigned int N))
OLD_ABI(cuCtxCreate, "cuCtxCreate_v4 (or cuCtxCreate_v2)",
        (CUcontext *pctx, unsigned int flags, CUdevice dev))
OLD_ABI(cuCtxDestroy, "cuCtxDestroy_v2", (CUcontext ctx))
OLD_ABI(cuCtxPushCurrent, "cuCtxPushCurrent_v2", (CUcontext ctx))
OLD_ABI(cuCtxPopCurrent, "cuCtxPopCurrent_v2", (CUcontext *pctx))
OLD_ABI(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice dev))
OLD_ABI(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2",
        (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags))
OLD_ABI(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2",
        (unsigned int *pdptr, void *p, unsigned int Flags))
OLD_ABI(cuGetProcAddress, "cuGetProcAddress_v2",
        (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))
OLD_ABI(cuStreamDestroy, "cuStreamDestroy_v2", (CUstream hStream))
OLD_ABI(cuEventDestroy, "cuEventDestroy_v2", (CUevent hEvent))

/* ---- cuGetProcAddress_v2 ---- */

/* Base name, the CUDA version that introduced the variant, the variant
 * (NULL: one this driver does not have). A name's rows are consecutive, in
 * rising version order. */
static const struct {
    const char *name;
    int version;
    void *fn;
} procs[] = {
    {"cuInit", 2000, (void *)cuInit},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion},
    {"cuGetErrorName", 6000, (void *)cuGetErrorName},
    {"cuGetErrorString", 6000, (void *)cuGetErrorString},
    {"cuGetProcAddress", 11030, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet},
    {"cuDeviceGetCount", 2000, (void *)cuDeviceGetCount},
    {"cuDeviceGetName", 2000, (void *)cuDeviceGetName},
    {"cuDeviceGetUuid", 9020, (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid", 11040, (void *)cuDeviceGetUuid_v2},
    {"cuDeviceGetAttribute", 2000, (void *)cuDeviceGetAttribute},
    {"cuDeviceTotalMem", 2000, (void *)cuDeviceTotalMem},
    {"cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2},
    {"cuDeviceCanAccessPeer", 4000, (void *)cuDeviceCanAccessPeer},
    {"cuDeviceGetDefaultMemPool", 11020, (void *)cuDeviceGetDefaultMemPool},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 7000, (void *)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxRelease", 11000, (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuCtxCreate", 2000, (void *)cuCtxCreate},
    {"cuCtxCreate", 3020, (void *)cuCtxCreate_v2},
    {"cuCtxCreate", 11040, NULL}, /* cuCtxCreate_v3 (execution affinity) */
    {"cuCtxCreate", 12050, (void *)cuCtxCreate_v4},
    {"cuCtxDestroy", 2000, (void *)cuCtxDestroy},
    {"cuCtxDestroy", 4000, (void *)cuCtxDestroy_v2},
    {"cuCtxGetCurrent", 4000, (void *)cuCtxGetCurrent},
    {"cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent},
    {"cuCtxPushCurrent", 2000, (void *)cuCtxPushCurrent},
    {"cuCtxPushCurrent", 4000, (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", 2000, (void *)cuCtxPopCurrent},
    {"cuCtxPopCurrent", 4000, (void *)cuCtxPopCurrent_v2},
    {"cuCtxGetDevice", 2000, (void *)cuCtxGetDevice},
    {"cuCtxGetDevice", 13000, (void *)cuCtxGetDevice_v2},
    {"cuCtxSynchronize", 2000, (void *)cuCtxSynchronize},
    {"cuCtxSynchronize", 13000, (void *)cuCtxSynchronize_v2},
    {"cuMemAlloc", 2000, (void *)cuMemAlloc},
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2},
    {"cuMemFree", 2000, (void *)cuMemFree},
    {"cuMemFree", 3020, (void *)cuMemFree_v2},
    {"cuMemAllocHost", 2000, (void *)cuMemAllocHost},
    {"cuMemAllocHost", 3020, (void *)cuMemAllocHost_v2},
    {"cuMemHostAlloc", 2020, (void *)cuMemHostAlloc},
    {"cuMemFreeHost", 2000, (void *)cuMemFreeHost},
    {"cuMemHostGetDevicePointer", 2020, (void *)cuMemHostGetDevicePointer},
    {"cuMemHostGetDevicePointer", 3020, (void *)cuMemHostGetDevicePointer_v2},
    {"cuMemAllocManaged", 6000, (void *)cuMemAllocManaged},
    {"cuMemGetAddressRange", 2000, (void *)cuMemGetAddressRange},
    {"cuMemGetAddressRange", 3020, (void *)cuMemGetAddressRange_v2},
    {"cuMemGetInfo", 2000, (void *)cuMemGetInfo},
    {"cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2},
    {"cuMemGetAllocationGranularity", 10020, (void *)cuMemGetAllocationGranularity},
    {"cuMemsetD8", 2000, (void *)cuMemsetD8},
    {"cuMemsetD8", 3020, (void *)cuMemsetD8_v2},
    {"cuMemcpy", 4000, (void *)cuMemcpy},
    {"cuMemcpyHtoD", 2000, (void *)cuMemcpyHtoD},
    {"cuMemcpyHtoD", 3020, (void *)cuMemcpyHtoD_v2},
    {"cuMemcpyDtoH", 2000, (void *)cuMemcpyDtoH},
    {"cuMemcpyDtoH", 3020, (void *)cuMemcpyDtoH_v2},
    {"cuMemcpyDtoD", 2000, (void *)cuMemcpyDtoD},
    {"cuMemcpyDtoD", 3020, (void *)cuMemcpyDtoD_v2},
    {"cuPointerGetAttribute", 4000, (void *)cuPointerGetAttribute},
    {"cuPointerGetAttributes", 7000, (void *)cuPointerGetAttributes},
    {"cuIpcGetMemHandle", 4010, (void *)cuIpcGetMemHandle},
    {"cuIpcOpenMemHandle", 4010, (void *)cuIpcOpenMemHandle},
    {"cuIpcOpenMemHandle", 11000, (void *)cuIpcOpenMemHandle_v2},
    {"cuIpcCloseMemHandle", 4010, (void *)cuIpcCloseMemHandle},
    {"cuMemAllocAsync", 11020, (void *)cuMemAllocAsync},
    {"cuMemFreeAsync", 11020, (void *)cuMemFreeAsync},
    {"cuStreamSynchronize", 2000, (void *)cuStreamSynchronize},
    {"cuStreamCreate", 2000, (void *)cuStreamCreate},
    {"cuStreamDestroy", 2000, (void *)cuStreamDestroy},
    {"cuStreamDestroy", 4000, (void *)cuStreamDestroy_v2},
    {"cuStreamQuery", 2000, (void *)cuStreamQuery},
    {"cuStreamWaitEvent", 3020, (void *)cuStreamWaitEvent},
    {"cuEventCreate", 2000, (void *)cuEventCreate},
    {"cuEventRecord", 2000, (void *)cuEventRecord},
    {"cuEventQuery", 2000, (void *)cuEventQuery},
    {"cuEventSynchronize", 2000, (void *)cuEventSynchronize},
    {"cuEventDestroy", 2000, (void *)cuEventDestroy},
    {"cuEventDestroy", 4000, (void *)cuEventDestroy_v2},
    {"cuMemsetD8Async", 3020, (void *)cuMemsetD8Async},
    {"cuMemcpyAsync", 4000, (void *)cuMemcpyAsync},
    {"cuMemCreate", 10020, (void *)cuMemCreate},
    {"cuMemRelease", 10020, (void *)cuMemRelease},
    {"cuMemAddressReserve", 10020, (void *)cuMemAddressReserve},
    {"cuMemAddressFree", 10020, (void *)cuMemAddressFree},
    {"cuMemMap", 10020, (void *)cuMemMap},
    {"cuMemUnmap", 10020, (void *)cuMemUnmap},
    {"cuMemSetAccess", 10020, (void *)cuMemSetAccess},
    {"cuMemGetAccess", 10020, (void *)cuMemGetAccess},
    {"cuMemExportToShareableHandle", 10020, (void *)cuMemExportToShareableHandle},
    {"cuMemImportFromShareableHandle", 10020, (void *)cuMemImportFromShareableHandle},
    {"cuMemRetainAllocationHandle", 11000, (void *)cuMemRetainAllocationHandle},
    {"cuMemGetAllocationPropertiesFromHandle", 10020,
     (void *)cuMemGetAllocationPropertiesFromHandle},
    {"cuMemPoolCreate", 11020, (void *)cuMemPoolCreate},
    {"cuMemPoolDestroy", 11020, (void *)cuMemPoolDestroy},
    {"cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync},
    {"cuMemPoolExportToShareableHandle", 11020, (void *)cuMemPoolExportToShareableHandle},
    {"cuMemPoolImportFromShareableHandle", 11020, (void *)cuMemPoolImportFromShareableHandle},
    {"cuMemPoolExportPointer", 11020, (void *)cuMemPoolExportPointer},
    {"cuMemPoolImportPointer", 11020, (void *)cuMemPoolImportPointer},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus) {
    ENTER_BEFORE_INIT(cuGetProcAddress_v2);
    const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (!symbol || !pfn || (flags & ~known) || cudaVersion > HM_CUDA_TEST_DRIVER_VERSION)
        return leave(CUDA_ERROR_INVALID_VALUE);
    /* The newest variant of the name not above cudaVersion. */
    bool named = false;
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol) != 0) continue;
        named = true;
        if (procs[i].version > cudaVersion) break;
        fn = procs[i].fn;
        st = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    if (!named) st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    *pfn = fn;
    if (symbolStatus) *symbolStatus = st;
    return leave(r);
}

/* ---- control API ---- */

static int api_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < API_COUNT; i++)
        if (strcmp(api_names[i], name) == 0) return i;
    return -1;
}

EXPORT void hm_cuda_test_reset(void) {
    pthread_once(&g_once, setup);
    lock();
    memset(g.calls, 0, sizeof g.calls);
    memset(g.inject, 0, sizeof g.inject);
    g.sticky = CUDA_SUCCESS;
    g.ipc_open_repeats = 0;
    g.leaks = 0;
    g.events_recorded = 0;
    g.pool_early_frees = 0;
    unlock();
}

EXPORT void hm_cuda_test_get_stats(hm_cuda_test_stats_t *out) {
    pthread_once(&g_once, setup);
    hm_cuda_test_stats_t s;
    memset(&s, 0, sizeof s);
    lock();
    for (int i = 0; i < API_COUNT; i++) s.calls += g.calls[i];
    s.ipc_open_repeats = g.ipc_open_repeats;
    s.leaks = g.leaks;
    for (const struct ctx *c = g.ctxs; c; c = c->next)
        if (!c->destroyed) s.live_contexts++;
    for (size_t i = 0; i < g.nallocs; i++) {
        const struct alloc *a = g.allocs[i];
        switch (a->kind) {
        case M_DEVICE: s.live_device_allocs++; break;
        case M_ASYNC: s.live_async_allocs++; break;
        case M_HOST: s.live_host_allocs++; break;
        case M_MANAGED: s.live_managed_allocs++; break;
        case M_IPC:
            s.live_ipc_mappings++;
            s.live_ipc_refs += a->refs;
            break;
        case M_WCDEV: break; /* counted with its host record */
        case M_VMM: s.live_vmm_mappings++; break;
        case M_POOL: s.live_pool_allocs++; break;
        case M_POOLIMP:
            s.live_pool_imports++;
            s.live_pool_import_refs += a->refs;
            break;
        }
    }
    for (const struct vmm *v = g.vmms; v; v = v->next) s.live_vmm_handles++;
    for (const struct mpool *p = g.mpools; p; p = p->next)
        if (!p->destroyed) s.live_pools++;
    s.pool_early_frees = g.pool_early_frees;
    s.pending_ops = g.nq - g.qhead;
    s.live_streams = g.nstreams;
    s.live_events = g.nevents;
    s.events_recorded = g.events_recorded;
    s.live_allocs = s.live_device_allocs + s.live_async_allocs + s.live_host_allocs +
                    s.live_managed_allocs;
    for (unsigned i = 0; i < HM_CUDA_TEST_MAX_DEVICES; i++) {
        s.primary_refs[i] = g_devices[i].primary.refs;
        s.device_used[i] = g_devices[i].used;
    }
    unlock();
    if (out) *out = s;
}

EXPORT uint64_t hm_cuda_test_call_count(const char *symbol) {
    pthread_once(&g_once, setup);
    int i = api_index(symbol);
    if (i < 0) return UINT64_MAX;
    lock();
    uint64_t n = g.calls[i];
    unlock();
    return n;
}

static int inject(const char *symbol, unsigned nth, CUresult result, bool sticky) {
    pthread_once(&g_once, setup);
    int i = api_index(symbol);
    if (i < 0 || (nth && result == CUDA_SUCCESS)) return -1;
    lock();
    g.inject[i].countdown = nth;
    g.inject[i].result = result;
    g.inject[i].sticky = sticky;
    unlock();
    return 0;
}

EXPORT int hm_cuda_test_fail_next(const char *symbol, unsigned nth, CUresult result) {
    return inject(symbol, nth, result, false);
}

EXPORT int hm_cuda_test_fail_sticky(const char *symbol, unsigned nth, CUresult result) {
    return inject(symbol, nth, result, true);
}

EXPORT void hm_cuda_test_set_lenient(unsigned bits) {
    pthread_once(&g_once, setup);
    lock();
    g.lenient = bits & HM_CUDA_TEST_LENIENT_ALL;
    unlock();
}

EXPORT unsigned hm_cuda_test_get_lenient(void) {
    pthread_once(&g_once, setup);
    lock();
    unsigned bits = g.lenient;
    unlock();
    return bits;
}

EXPORT void hm_cuda_test_teardown(void) {
    pthread_once(&g_once, setup);
    lock();
    queue_run();
    g.deinit = true;
    unlock();
}

EXPORT uint64_t hm_cuda_test_va_base(void) {
    pthread_once(&g_once, setup);
    lock();
    uint64_t b = g.va_base;
    unlock();
    return b;
}

EXPORT int hm_cuda_test_set_mem_limit(int device, uint64_t bytes) {
    pthread_once(&g_once, setup);
    if (bytes == 0 || device >= HM_CUDA_TEST_MAX_DEVICES) return -1;
    lock();
    for (int i = 0; i < HM_CUDA_TEST_MAX_DEVICES; i++)
        if (device < 0 || i == device) g_devices[i].limit = bytes;
    unlock();
    return 0;
}

EXPORT void hm_cuda_test_set_strict_ipc(int on) {
    pthread_once(&g_once, setup);
    lock();
    g.strict_ipc = on != 0;
    unlock();
}

EXPORT int hm_cuda_test_set_peer_access(int device, int peer, int can) {
    pthread_once(&g_once, setup);
    if (device < 0 || peer < 0 || device >= HM_CUDA_TEST_MAX_DEVICES ||
        peer >= HM_CUDA_TEST_MAX_DEVICES)
        return -1;
    lock();
    if (device != peer) g.peer[device][peer] = can != 0;
    unlock();
    return 0;
}
