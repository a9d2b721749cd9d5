/* hetmem — the CUDA provider (include/hetmem/providers/cuda.h).
 * SPDX-License-Identifier: MIT
 *
 * The driver is opened at run time (platform/dl.h) and its entry points
 * resolved once per process by their exact versioned names (cuda_api.h)
 * into `cu`. State per provider: the context (retained primary context, or
 * the caller's), the device, its UUID, the memory type and flags, and a
 * table of the allocations that do not start where the driver put them
 * (over-aligned ones: aligned address -> the driver's base). IPC mappings
 * are not in it: their base is the driver's (cuMemGetAddressRange_v2),
 * since another provider of the context may close them.
 *
 * Context switching (ctx_enter / ctx_leave): one cuCtxGetCurrent; a push
 * and a pop only when another context (or none) is current.
 *
 * VMM mode (HM_CUDA_ALLOCATOR_VMM) records its mappings and the live
 * pieces of each (vmm_rec.h): split and merge are bookkeeping there, and a
 * mapping is unmapped and its reservation freed once no byte of it is live.
 * It exports a whole allocation through a
 * shareable handle (FD or fabric); an FD export's descriptor stays in the
 * provider's export table until put. VMM imports (by any device provider)
 * are recorded process-wide, so that close, through any provider of the
 * context, unmaps them instead of cuIpcCloseMemHandle.
 *
 * Concurrency:
 *   cu (entry points)      written once under pthread_once, then read-only
 *   provider state         immutable after init, but the two tables
 *   offset table           off_lock; noff read without it (relaxed) to skip
 *                          the lookup when it is empty
 *   export table           x_lock
 *   VMM record             vmm_lock, held across the cuMemUnmap and
 *                          cuMemAddressFree of a free, so that a piece and
 *                          the state of its mappings change together
 *   VMM import record      vimp.lock (process-wide); n read without it
 *                          (relaxed) to skip the lookup when it is empty:
 *                          a close of a mapping follows its open in the
 *                          IPC layer's order, which publishes the entry */
#include "internal.h"
#include "platform/dl.h"
#include "platform/prim.h"
#include "providers/cuda/cuda_api.h"
#include "providers/cuda/vmm_rec.h"

#include <hetmem/providers/cuda.h>

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- entry points ---- */

#define CU_FIELD(field, sym, ret, params) ret(*field) params;
static struct {
    HM_CU_FN(CU_FIELD)
    HM_CU_FN_OPTIONAL(CU_FIELD)
} cu;
#define CU_REQ(field, sym, ret, params) HM_DL_REQUIRED(#sym, &cu.field),
#define CU_OPT(field, sym, ret, params) HM_DL_OPTIONAL(#sym, &cu.field),
static const hm_dl_sym_t cu_syms[] = {HM_CU_FN(CU_REQ) HM_CU_FN_OPTIONAL(CU_OPT)};

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static hm_result_t cu_loaded = HM_ERROR_NOT_SUPPORTED;

static void cu_load(void) {
    hm_dl_lib_t *lib;
    if (hm__dl_load("libcuda.so.1", "HM_CUDA_DRIVER", "CUDA driver", cu_syms,
                    sizeof(cu_syms) / sizeof(cu_syms[0]), &lib, NULL) != HM_SUCCESS)
        return;
    hm_cu_result_t r = cu.Init(0);
    if (r != HM_CUDA_SUCCESS) {
        HM_LOG_INFO("CUDA: cuInit failed (CUresult %u): no usable device", r);
        return;
    }
    cu_loaded = HM_SUCCESS;
}

/* A driver failure as a result: logged with its name, recorded.
 * CUDA_ERROR_ALREADY_MAPPED (an IPC open whose range overlaps a mapping
 * of the same exporter that is still open here) is HM_ERROR_BUSY: the IPC
 * layer closes the stale mappings it caches and tries once more. */
static hm_result_t cu_fail(hm_cu_result_t r, const char *call) {
    const char *name = NULL;
    if (cu.GetErrorName && cu.GetErrorName(r, &name) != HM_CUDA_SUCCESS) name = NULL;
    hm_result_t res = hm__driver_error((int64_t)r, "CUDA %s failed: %s (CUresult %u)", call,
                                       name ? name : "?", r);
    switch (r) {
    case HM_CUDA_ERROR_OUT_OF_MEMORY: return HM_ERROR_OUT_OF_MEMORY;
    case HM_CUDA_ERROR_INVALID_VALUE: return HM_ERROR_INVALID_ARGUMENT;
    case HM_CUDA_ERROR_ALREADY_MAPPED: return HM_ERROR_BUSY;
    default: return res;
    }
}

/* CUDA_ERROR_DEINITIALIZED: the driver has shut down (at exit, before
 * destructors that run later, e.g. a static object's freeing device
 * memory). Its memory and mappings went with it: a free or close then is
 * done, not failed. Logged once. */
static bool torn_down(hm_cu_result_t r) {
    static _Atomic int logged;
    if (r != HM_CUDA_ERROR_DEINITIALIZED) return false;
    if (!atomic_exchange_explicit(&logged, 1, memory_order_relaxed))
        HM_LOG_INFO("CUDA provider: the driver has shut down (process exit); frees and closes "
                    "after it are no-ops, its memory went with it");
    return true;
}

/* ---- params ---- */

struct hm_cuda_params {
    hm_cu_context_t ctx;
    hm_cu_device_t dev;
    int ordinal;
    hm_cuda_memory_type_t type;
    unsigned flags;
    hm_cuda_allocator_t allocator;
    hm_cuda_shareable_t shareable;
    size_t npeers;
    int peers[HM_CUDA_PEERS_MAX];
};

hm_result_t hm_cuda_params_create(hm_cuda_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_cuda_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *params = calloc(1, sizeof(**params));
    return *params ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
}

hm_result_t hm_cuda_params_destroy(hm_cuda_params_t *params) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_context(hm_cuda_params_t *p, void *ctx, int dev) {
    if (!p || !ctx || dev < 0) {
        HM_LOG_ERROR("hm_cuda_params_set_context: %s", !p ? "params is NULL"
                                                     : !ctx ? "the context is NULL"
                                                            : "a negative device");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->ctx = ctx;
    p->dev = dev;
    p->ordinal = 0;
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_ordinal(hm_cuda_params_t *p, int ordinal) {
    if (!p || ordinal < 0) {
        HM_LOG_ERROR("hm_cuda_params_set_ordinal: %s", !p ? "params is NULL" : "a negative ordinal");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->ctx = NULL;
    p->ordinal = ordinal;
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_memory_type(hm_cuda_params_t *p, hm_cuda_memory_type_t type) {
    if (!p || (unsigned)type > HM_CUDA_MEMORY_MANAGED) {
        HM_LOG_ERROR("hm_cuda_params_set_memory_type: %s",
                     !p ? "params is NULL" : "not a memory type");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->type = type;
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_allocator(hm_cuda_params_t *p, hm_cuda_allocator_t a) {
    if (!p || (unsigned)a > HM_CUDA_ALLOCATOR_VMM) {
        HM_LOG_ERROR("hm_cuda_params_set_allocator: %s", !p ? "params is NULL" : "not an allocator");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->allocator = a;
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_shareable_handle(hm_cuda_params_t *p, hm_cuda_shareable_t type) {
    if (!p || (unsigned)type > HM_CUDA_SHAREABLE_NONE) {
        HM_LOG_ERROR("hm_cuda_params_set_shareable_handle: %s",
                     !p ? "params is NULL" : "not a shareable handle type");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->shareable = type;
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_peers(hm_cuda_params_t *p, const int *ordinals, size_t n) {
    const char *why = !p                       ? "params is NULL"
                      : n && !ordinals         ? "ordinals is NULL"
                      : n > HM_CUDA_PEERS_MAX ? "more than HM_CUDA_PEERS_MAX peers"
                                               : NULL;
    for (size_t i = 0; !why && i < n; i++)
        if (ordinals[i] < 0) why = "a negative ordinal";
    if (why) {
        HM_LOG_ERROR("hm_cuda_params_set_peers: %s", why);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (n) memcpy(p->peers, ordinals, n * sizeof(*ordinals));
    p->npeers = n;
    return HM_SUCCESS;
}

hm_result_t hm_cuda_params_set_flags(hm_cuda_params_t *p, unsigned flags) {
    unsigned all = HM_CUDA_HOST_PORTABLE | HM_CUDA_HOST_MAPPED | HM_CUDA_HOST_WRITE_COMBINED;
    if (!p || (flags & ~all)) {
        HM_LOG_ERROR("hm_cuda_params_set_flags: %s",
                     !p ? "params is NULL" : "unknown flags");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->flags = flags;
    return HM_SUCCESS;
}

/* ---- the provider ---- */

typedef struct off_ent {
    uintptr_t ptr;  /* what hetmem handed out (or the opened mapping's address) */
    uintptr_t base; /* what the driver handed out */
} off_ent_t;

/* An export's descriptor (VMM, FD handles): the exporter's until put. id
 * tells two exports apart that the driver gave the same number in turn. */
typedef struct xfd_ent {
    int fd;
    uint64_t id;
} xfd_ent_t;

typedef struct cuprov {
    hm_cu_context_t ctx;
    hm_cu_device_t dev;
    bool primary; /* retained: released at fini */
    hm_cuda_memory_type_t type;
    unsigned flags;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    size_t page;
    bool vmm; /* HM_CUDA_ALLOCATOR_VMM: cuMemCreate + cuMemAddressReserve + cuMemMap */
    hm_cuda_shareable_t shareable; /* VMM: what cuMemCreate asks for */
    /* Device memory: the VMM allocation granularity (0: no VMM API, so no
     * import of VMM handles), and the access every VMM allocation and
     * import gets: read-write for the provider's device, then its peers. */
    size_t vmm_gran;
    size_t nacc;
    hm_cu_mem_access_t acc[1 + HM_CUDA_PEERS_MAX];
    unsigned epoch; /* hm__prim_fork_epoch() at init: another one is a fork child */
    pthread_mutex_t off_lock;
    off_ent_t *off;
    size_t noff_cap;
    _Atomic size_t noff;
    /* The descriptors of live FD exports (x_lock): put closes one only when
     * it is found here with the payload's id. */
    pthread_mutex_t x_lock;
    xfd_ent_t *xfd;
    size_t nxfd, xfd_cap;
    uint64_t xfd_next;
    /* VMM: the mappings and their live pieces (vmm_lock); orphans: how many
     * recorded mappings have no live byte (their cuMemAddressFree failed),
     * freed again at the next free and at fini. */
    pthread_mutex_t vmm_lock;
    hm_vmm_rec_t rec;
    size_t orphans;
} cuprov_t;

/* The provider's context current on this thread: *pushed says whether it
 * had to be pushed (ctx_leave pops it then). */
static hm_result_t ctx_enter(cuprov_t *c, bool *pushed) {
    hm_cu_context_t cur = NULL;
    *pushed = false;
    hm_cu_result_t r = cu.CtxGetCurrent(&cur);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuCtxGetCurrent");
    if (cur == c->ctx) return HM_SUCCESS;
    r = cu.CtxPushCurrent(c->ctx);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuCtxPushCurrent_v2");
    *pushed = true;
    return HM_SUCCESS;
}
static void ctx_leave(bool pushed) {
    if (!pushed) return;
    hm_cu_context_t popped;
    hm_cu_result_t r = cu.CtxPopCurrent(&popped);
    if (r != HM_CUDA_SUCCESS) (void)cu_fail(r, "cuCtxPopCurrent_v2");
}

/* A fork child of the process that made the provider: the driver does not
 * work there (every call is CUDA_ERROR_NOT_INITIALIZED) and the memory is
 * the parent's context's. */
static bool in_child(const cuprov_t *c) { return hm__prim_fork_epoch() != c->epoch; }
static hm_result_t refuse_in_child(const char *op) {
    HM_LOG_ERROR("CUDA provider: %s in a fork child: CUDA does not work after fork() (the "
                 "child may only free and destroy what it inherited)", op);
    return HM_ERROR_NOT_SUPPORTED;
}

/* The offset table: aligned address -> the driver's base. */
static bool off_add(cuprov_t *c, uintptr_t ptr, uintptr_t base) {
    hm__mutex_lock(&c->off_lock);
    size_t n = atomic_load_explicit(&c->noff, memory_order_relaxed);
    if (!hm__cuda_grow((void **)&c->off, n, &c->noff_cap, sizeof(*c->off))) {
        hm__mutex_unlock(&c->off_lock);
        return false;
    }
    c->off[n] = (off_ent_t){ptr, base};
    atomic_store_explicit(&c->noff, n + 1, memory_order_relaxed);
    hm__mutex_unlock(&c->off_lock);
    return true;
}
/* The driver's base of ptr (ptr itself when it is not in the table);
 * take: remove it. */
static uintptr_t off_base(cuprov_t *c, uintptr_t ptr, bool take) {
    if (!atomic_load_explicit(&c->noff, memory_order_relaxed)) return ptr;
    uintptr_t base = ptr;
    hm__mutex_lock(&c->off_lock);
    size_t n = atomic_load_explicit(&c->noff, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        if (c->off[i].ptr != ptr) continue;
        base = c->off[i].base;
        if (take) {
            c->off[i] = c->off[n - 1];
            atomic_store_explicit(&c->noff, n - 1, memory_order_relaxed);
        }
        break;
    }
    hm__mutex_unlock(&c->off_lock);
    return base;
}

static void vmm_prop(const cuprov_t *c, hm_cu_mem_prop_t *prop);

static bool have_vmm(void) {
    return cu.MemGetAllocationGranularity && cu.MemCreate && cu.MemRelease &&
           cu.MemAddressReserve && cu.MemAddressFree && cu.MemMap && cu.MemUnmap &&
           cu.MemSetAccess;
}
static bool have_vmm_ipc(void) {
    return have_vmm() && cu.MemRetainAllocationHandle && cu.MemExportToShareableHandle &&
           cu.MemImportFromShareableHandle && cu.MemGetAllocationPropertiesFromHandle;
}

/* The peers of p (VMM): each an existing device that can access c's
 * memory (cuDeviceCanAccessPeer(peer, own)), added to c->acc after the
 * provider's own device; the own device and repeats are skipped. */
static hm_result_t vmm_peers(cuprov_t *c, const hm_cuda_params_t *p) {
    c->acc[0] = (hm_cu_mem_access_t){.location = {.type = HM_CU_MEM_LOCATION_TYPE_DEVICE,
                                                  .id = c->dev},
                                     .flags = HM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    c->nacc = 1;
    if (!p->npeers) return HM_SUCCESS;
    int count = 0;
    hm_cu_result_t r = cu.DeviceGetCount(&count);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuDeviceGetCount");
    for (size_t i = 0; i < p->npeers; i++) {
        if (p->peers[i] >= count) {
            HM_LOG_ERROR("CUDA provider: no peer device of ordinal %d (%d found)", p->peers[i],
                         count);
            return HM_ERROR_INVALID_ARGUMENT;
        }
        hm_cu_device_t d;
        if ((r = cu.DeviceGet(&d, p->peers[i])) != HM_CUDA_SUCCESS) return cu_fail(r, "cuDeviceGet");
        bool seen = d == c->dev;
        for (size_t k = 1; k < c->nacc && !seen; k++) seen = c->acc[k].location.id == d;
        if (seen) continue;
        int can = 0;
        if ((r = cu.DeviceCanAccessPeer(&can, d, c->dev)) != HM_CUDA_SUCCESS)
            return cu_fail(r, "cuDeviceCanAccessPeer");
        if (!can) {
            HM_LOG_ERROR("CUDA provider: device %d cannot access device %d's memory "
                         "(cuDeviceCanAccessPeer): not a peer", p->peers[i], (int)c->dev);
            return HM_ERROR_NOT_SUPPORTED;
        }
        c->acc[c->nacc++] = (hm_cu_mem_access_t){
            .location = {.type = HM_CU_MEM_LOCATION_TYPE_DEVICE, .id = d},
            .flags = HM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    }
    return HM_SUCCESS;
}

static hm_result_t cu_init(const void *params, void **state) {
    static const hm_cuda_params_t defaults = {0};
    const hm_cuda_params_t *p = params ? params : &defaults;
    pthread_once(&cu_once, cu_load);
    if (cu_loaded != HM_SUCCESS) {
        HM_LOG_INFO("CUDA provider: no CUDA driver or no device");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (p->type == HM_CUDA_MEMORY_MANAGED && p->flags &&
        p->flags != HM_CUDA_ATTACH_GLOBAL && p->flags != HM_CUDA_ATTACH_HOST) {
        HM_LOG_ERROR("CUDA provider: managed memory takes one attach flag");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->type == HM_CUDA_MEMORY_DEVICE && p->flags) {
        HM_LOG_ERROR("CUDA provider: device memory takes no flags");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->allocator == HM_CUDA_ALLOCATOR_VMM && p->type != HM_CUDA_MEMORY_DEVICE) {
        HM_LOG_ERROR("CUDA provider: the virtual memory API allocates device memory only");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->allocator != HM_CUDA_ALLOCATOR_VMM &&
        (p->shareable != HM_CUDA_SHAREABLE_FD || p->npeers)) {
        HM_LOG_ERROR("CUDA provider: %s applies to the virtual memory allocator only "
                     "(HM_CUDA_ALLOCATOR_VMM)",
                     p->npeers ? "a list of peers" : "a shareable handle type");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->allocator == HM_CUDA_ALLOCATOR_VMM && !have_vmm()) {
        HM_LOG_ERROR("CUDA provider: the driver has no virtual memory API (cuMemCreate)");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (p->allocator == HM_CUDA_ALLOCATOR_VMM && p->shareable != HM_CUDA_SHAREABLE_NONE &&
        !have_vmm_ipc()) {
        HM_LOG_ERROR("CUDA provider: the driver cannot share virtual memory allocations "
                     "(cuMemExportToShareableHandle): ask for HM_CUDA_SHAREABLE_NONE");
        return HM_ERROR_NOT_SUPPORTED;
    }
    cuprov_t *c = calloc(1, sizeof(*c));
    if (!c) return HM_ERROR_OUT_OF_HOST_MEMORY;
    c->type = p->type;
    c->flags = p->type == HM_CUDA_MEMORY_MANAGED && !p->flags ? HM_CUDA_ATTACH_GLOBAL : p->flags;
    hm_cu_result_t r;
    hm_result_t res;
    if (p->ctx) {
        c->ctx = p->ctx;
        c->dev = p->dev;
        /* The context must be on that device. */
        bool pushed;
        res = ctx_enter(c, &pushed);
        if (res != HM_SUCCESS) {
            HM_LOG_ERROR("CUDA provider: the caller's context cannot be made current");
            res = HM_ERROR_INVALID_ARGUMENT;
            goto fail;
        }
        hm_cu_device_t d = -1;
        r = cu.CtxGetDevice(&d);
        ctx_leave(pushed);
        if (r != HM_CUDA_SUCCESS || d != p->dev) {
            HM_LOG_ERROR("CUDA provider: the context is on device %d, not %d", (int)d,
                         (int)p->dev);
            res = HM_ERROR_INVALID_ARGUMENT;
            goto fail;
        }
    } else {
        int count = 0;
        if ((r = cu.DeviceGetCount(&count)) != HM_CUDA_SUCCESS) {
            res = cu_fail(r, "cuDeviceGetCount");
            goto fail;
        }
        if (p->ordinal >= count) {
            HM_LOG_ERROR("CUDA provider: no device of ordinal %d (%d found)", p->ordinal, count);
            res = HM_ERROR_INVALID_ARGUMENT;
            goto fail;
        }
        if ((r = cu.DeviceGet(&c->dev, p->ordinal)) != HM_CUDA_SUCCESS) {
            res = cu_fail(r, "cuDeviceGet");
            goto fail;
        }
        if ((r = cu.DevicePrimaryCtxRetain(&c->ctx, c->dev)) != HM_CUDA_SUCCESS) {
            res = cu_fail(r, "cuDevicePrimaryCtxRetain");
            goto fail;
        }
        c->primary = true;
    }
    hm_cu_uuid_t u;
    if ((r = cu.DeviceGetUuid(&u, c->dev)) != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuDeviceGetUuid_v2");
        goto fail_ctx;
    }
    memcpy(c->uuid, u.bytes, sizeof(c->uuid));
    size_t sys = hm__prim_page_size();
    c->page = c->type == HM_CUDA_MEMORY_HOST ? sys : (size_t)2 << 20;
    if ((res = vmm_peers(c, p)) != HM_SUCCESS) goto fail_ctx;
    c->shareable = HM_CUDA_SHAREABLE_NONE; /* legacy: cuMemAlloc_v2 asks for no type */
    if (p->allocator == HM_CUDA_ALLOCATOR_VMM) {
        c->shareable = p->shareable;
        if (c->shareable == HM_CUDA_SHAREABLE_FABRIC) {
            int fabric = 0;
            r = cu.DeviceGetAttribute
                    ? cu.DeviceGetAttribute(&fabric,
                                            HM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                                            c->dev)
                    : HM_CUDA_ERROR_NOT_SUPPORTED;
            if (r != HM_CUDA_SUCCESS || !fabric) {
                HM_LOG_ERROR("CUDA provider: device %d has no fabric handles "
                             "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED %s)",
                             (int)c->dev, r != HM_CUDA_SUCCESS ? "not answered" : "is 0");
                res = HM_ERROR_NOT_SUPPORTED;
                goto fail_ctx;
            }
        }
        hm_cu_mem_prop_t prop;
        vmm_prop(c, &prop);
        size_t gran = 0;
        r = cu.MemGetAllocationGranularity(&gran, &prop, HM_CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != HM_CUDA_SUCCESS || !hm_is_pow2(gran)) {
            res = r != HM_CUDA_SUCCESS ? cu_fail(r, "cuMemGetAllocationGranularity")
                                       : HM_ERROR_NOT_SUPPORTED;
            goto fail_ctx;
        }
        c->vmm = true;
        c->page = gran;
        c->vmm_gran = gran;
    } else if (c->type == HM_CUDA_MEMORY_DEVICE && have_vmm_ipc()) {
        /* A legacy provider opens VMM handles too: their granularity. */
        hm_cu_mem_prop_t prop;
        vmm_prop(c, &prop);
        size_t gran = 0;
        if (cu.MemGetAllocationGranularity(&gran, &prop, HM_CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
                HM_CUDA_SUCCESS &&
            hm_is_pow2(gran))
            c->vmm_gran = gran;
    }
    c->epoch = hm__prim_fork_epoch();
    pthread_mutex_init(&c->off_lock, NULL);
    pthread_mutex_init(&c->x_lock, NULL);
    pthread_mutex_init(&c->vmm_lock, NULL);
    *state = c;
    return HM_SUCCESS;

fail_ctx:
    if (c->primary) (void)cu.DevicePrimaryCtxRelease(c->dev);
fail:
    free(c);
    return res;
}

static hm_result_t vmm_free_orphans(cuprov_t *c, uintptr_t lo, size_t len, bool *found);

static void cu_fini(void *state) {
    cuprov_t *c = state;
    /* Reservations whose free failed: tried once more. Pieces still live
     * are the program's (a provider destroyed under a live pool leaks). */
    if (c->orphans && !in_child(c)) {
        bool pushed, found;
        if (ctx_enter(c, &pushed) == HM_SUCCESS) {
            hm__mutex_lock(&c->vmm_lock);
            (void)vmm_free_orphans(c, 0, 0, &found);
            hm__mutex_unlock(&c->vmm_lock);
            ctx_leave(pushed);
        }
    }
    hm__vmm_rec_fini(&c->rec);
    pthread_mutex_destroy(&c->vmm_lock);
    if (c->primary && !in_child(c)) {
        hm_cu_result_t r = cu.DevicePrimaryCtxRelease(c->dev);
        if (r != HM_CUDA_SUCCESS && !torn_down(r)) (void)cu_fail(r, "cuDevicePrimaryCtxRelease_v2");
    }
    /* Exports never put (the IPC layer puts each before a pool's destroy
     * ends; a program that destroys a provider under a live pool leaks). */
    for (size_t i = 0; i < c->nxfd; i++) (void)hm__prim_close(c->xfd[i].fd);
    pthread_mutex_destroy(&c->x_lock);
    pthread_mutex_destroy(&c->off_lock);
    free(c->xfd);
    free(c->off);
    free(c);
}

static void cu_get_info(void *state, hm_provider_info_t *info) {
    cuprov_t *c = state;
    memset(info, 0, sizeof(*info));
    info->family = HM_PROVIDER_FAMILY_CUDA;
    info->caps = HM_PROVIDER_CAP_FREE;
    switch (c->type) {
    case HM_CUDA_MEMORY_DEVICE:
        info->name = c->vmm ? "cuda(device, vmm)" : "cuda(device)";
        info->kind = HM_MEMORY_DEVICE;
        if (!c->vmm || c->shareable != HM_CUDA_SHAREABLE_NONE) info->caps |= HM_PROVIDER_CAP_IPC;
        if (c->vmm) info->caps |= HM_PROVIDER_CAP_SPLIT_MERGE;
        break;
    case HM_CUDA_MEMORY_HOST:
        info->name = "cuda(host)";
        info->kind = HM_MEMORY_HOST_PINNED;
        info->caps |= HM_PROVIDER_CAP_CPU_ACCESS;
        break;
    case HM_CUDA_MEMORY_MANAGED:
        info->name = "cuda(managed)";
        info->kind = HM_MEMORY_SHARED;
        info->caps |= HM_PROVIDER_CAP_CPU_ACCESS;
        break;
    }
    info->min_page_size = c->page;
    info->recommended_page_size = (size_t)2 << 20;
}

static void cu_get_device(void *state, hm_device_id_t *device) {
    cuprov_t *c = state;
    device->ordinal = c->dev;
    device->has_uuid = true;
    memcpy(device->uuid, c->uuid, sizeof(device->uuid));
}

/* ---- the virtual memory API (HM_CUDA_ALLOCATOR_VMM) ---- */

/* Pinned device memory of the provider's device. */
static void vmm_prop(const cuprov_t *c, hm_cu_mem_prop_t *prop) {
    memset(prop, 0, sizeof(*prop));
    prop->type = HM_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = HM_CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = c->dev;
    prop->requestedHandleTypes =
        c->shareable == HM_CUDA_SHAREABLE_FD       ? HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        : c->shareable == HM_CUDA_SHAREABLE_FABRIC ? HM_CU_MEM_HANDLE_TYPE_FABRIC
                                                   : HM_CU_MEM_HANDLE_TYPE_NONE;
}

static inline size_t vmm_round(const cuprov_t *c, size_t size) {
    return (size + c->page - 1) & ~(c->page - 1);
}

/* Physical memory (cuMemCreate), an address range of the asked alignment
 * (cuMemAddressReserve: exact, no over-allocation), the memory mapped
 * there with read-write access for the provider's device. The mapping
 * keeps the physical memory: its handle is released at once. The context
 * current. NCCL and UCX allocate device memory the same way. */
static hm_result_t vmm_alloc(cuprov_t *c, size_t size, size_t alignment, uintptr_t *out) {
    if (size > SIZE_MAX - (c->page - 1)) return HM_ERROR_OUT_OF_MEMORY;
    size_t len = vmm_round(c, size);
    hm_cu_mem_prop_t prop;
    vmm_prop(c, &prop);
    hm_cu_mem_handle_t h = 0;
    hm_cu_result_t r = cu.MemCreate(&h, len, &prop, 0);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuMemCreate");
    hm_cu_ptr_t ptr = 0;
    const char *call = "cuMemAddressReserve";
    r = cu.MemAddressReserve(&ptr, len, alignment > c->page ? alignment : c->page, 0, 0);
    if (r == HM_CUDA_SUCCESS) {
        call = "cuMemMap";
        r = cu.MemMap(ptr, len, 0, h, 0);
        if (r == HM_CUDA_SUCCESS) {
            call = "cuMemSetAccess";
            r = cu.MemSetAccess(ptr, len, c->acc, c->nacc);
            if (r != HM_CUDA_SUCCESS) (void)cu.MemUnmap(ptr, len);
        }
        if (r != HM_CUDA_SUCCESS) (void)cu.MemAddressFree(ptr, len);
    }
    hm_result_t res = r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, call);
    hm_cu_result_t rr = cu.MemRelease(h); /* the mapping keeps it, or nothing does */
    if (rr != HM_CUDA_SUCCESS) {
        /* Not handed out: unmapped, and the release tried once more. */
        res = cu_fail(rr, "cuMemRelease");
        if (r == HM_CUDA_SUCCESS) {
            (void)cu.MemUnmap(ptr, len);
            (void)cu.MemAddressFree(ptr, len);
        }
        (void)cu.MemRelease(h);
    }
    if (res == HM_SUCCESS) *out = (uintptr_t)ptr;
    return res;
}

/* A new mapping recorded as one live piece; without host memory for the
 * record it is unmapped and freed again. */
static hm_result_t vmm_record(cuprov_t *c, uintptr_t base, size_t size) {
    size_t len = vmm_round(c, size);
    hm__mutex_lock(&c->vmm_lock);
    bool ok = hm__vmm_rec_add(&c->rec, base, len);
    hm__mutex_unlock(&c->vmm_lock);
    if (ok) return HM_SUCCESS;
    hm_cu_result_t r = cu.MemUnmap((hm_cu_ptr_t)base, len);
    if (r == HM_CUDA_SUCCESS) r = cu.MemAddressFree((hm_cu_ptr_t)base, len);
    if (r != HM_CUDA_SUCCESS) (void)cu_fail(r, "cuMemUnmap/cuMemAddressFree");
    return HM_ERROR_OUT_OF_HOST_MEMORY;
}

/* The reservations of recorded mappings without live bytes (vmm_lock
 * held): each freed and dropped; the first failure returned. *found: one
 * of them lay in [lo, +len). */
static hm_result_t vmm_free_orphans(cuprov_t *c, uintptr_t lo, size_t len, bool *found) {
    hm_result_t res = HM_SUCCESS;
    *found = false;
    for (size_t i = c->rec.nm; i-- > 0 && c->orphans;) {
        hm_vmm_map_t m = c->rec.m[i];
        if (m.live) continue;
        *found |= m.base - lo < len;
        hm_cu_result_t r = cu.MemAddressFree((hm_cu_ptr_t)m.base, m.len);
        if (r != HM_CUDA_SUCCESS && !torn_down(r)) {
            if (res == HM_SUCCESS) res = cu_fail(r, "cuMemAddressFree");
            continue;
        }
        hm__vmm_rec_drop(&c->rec, i);
        c->orphans--;
    }
    return res;
}

/* A free of the piece at ptr (the context current). The driver unmaps and
 * frees a reservation only whole: a mapping goes once its last live byte
 * does, and a piece that spans several (a merge) may empty each. First
 * every mapping the free empties is unmapped (which frees its physical
 * memory: its handle was released at alloc); a failure there leaves the
 * piece allocated, the mappings already unmapped marked so, and the same
 * free made again resumes. Then the piece leaves the record and each
 * emptied reservation is freed; one the driver refuses stays recorded as
 * an orphan (its addresses stay reserved, so no allocation can get them)
 * and is freed again at the next free or at fini, and the free reports the
 * failure. */
static hm_result_t vmm_free(cuprov_t *c, uintptr_t ptr, size_t size) {
    hm_result_t res = HM_SUCCESS;
    hm__mutex_lock(&c->vmm_lock);
    hm_vmm_piece_t *pc = hm__vmm_rec_piece(&c->rec, ptr);
    if (!pc) {
        bool found = false;
        if (c->orphans && size <= SIZE_MAX - (c->page - 1))
            res = vmm_free_orphans(c, ptr, vmm_round(c, size), &found);
        hm__mutex_unlock(&c->vmm_lock);
        if (found) return res; /* a free made again after a cuMemAddressFree failed */
        HM_LOG_ERROR("CUDA provider: free of 0x%llx, which is not a range it handed out",
                     (unsigned long long)ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (size > SIZE_MAX - (c->page - 1) || vmm_round(c, size) != pc->len) {
        hm__mutex_unlock(&c->vmm_lock);
        HM_LOG_ERROR("CUDA provider: free of [0x%llx, +%zu), a range it handed out with %zu bytes",
                     (unsigned long long)ptr, size, pc->len);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    size_t first, n = hm__vmm_rec_span(&c->rec, pc, &first);
    for (size_t i = first; i < first + n; i++) {
        hm_vmm_map_t *m = &c->rec.m[i];
        if (!m->mapped || m->live != hm__vmm_rec_overlap(m, pc)) continue;
        hm_cu_result_t r = cu.MemUnmap((hm_cu_ptr_t)m->base, m->len);
        if (r != HM_CUDA_SUCCESS && !torn_down(r)) {
            res = cu_fail(r, "cuMemUnmap");
            hm__mutex_unlock(&c->vmm_lock);
            return res;
        }
        m->mapped = false;
    }
    hm__vmm_rec_free(&c->rec, pc);
    for (size_t i = first + n; i-- > first;) {
        hm_vmm_map_t m = c->rec.m[i];
        if (m.live) continue;
        hm_cu_result_t r = cu.MemAddressFree((hm_cu_ptr_t)m.base, m.len);
        if (r != HM_CUDA_SUCCESS && !torn_down(r)) {
            if (res == HM_SUCCESS) res = cu_fail(r, "cuMemAddressFree");
            c->orphans++;
            continue;
        }
        hm__vmm_rec_drop(&c->rec, i);
    }
    bool found;
    if (c->orphans > 0 && res == HM_SUCCESS) (void)vmm_free_orphans(c, 0, 0, &found);
    hm__mutex_unlock(&c->vmm_lock);
    return res;
}

/* In a fork child: the piece forgotten, its mappings with it once empty
 * (the parent's memory: no driver call). */
static void vmm_forget(cuprov_t *c, uintptr_t ptr) {
    hm__mutex_lock(&c->vmm_lock);
    hm_vmm_piece_t *pc = hm__vmm_rec_piece(&c->rec, ptr);
    if (pc) {
        size_t first, n = hm__vmm_rec_span(&c->rec, pc, &first);
        hm__vmm_rec_free(&c->rec, pc);
        for (size_t i = first + n; i-- > first;)
            if (!c->rec.m[i].live) hm__vmm_rec_drop(&c->rec, i);
    }
    hm__mutex_unlock(&c->vmm_lock);
}

/* Split and merge (VMM mode only: HM_PROVIDER_CAP_SPLIT_MERGE) are
 * bookkeeping: the driver's mappings stay as they are, and the pieces
 * are what free gives back. A split point must be a granularity multiple
 * (each part then starts on one); a merge takes two adjacent pieces the
 * provider handed out, in one mapping or across two. */
static hm_result_t cu_split(void *state, void *ptr, size_t total, size_t first) {
    cuprov_t *c = state;
    if (first % c->page) {
        HM_LOG_ERROR("CUDA provider: split of [%p, +%zu) at %zu, not a multiple of the "
                     "granularity (%zu)", ptr, total, first, c->page);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t res = HM_SUCCESS;
    hm__mutex_lock(&c->vmm_lock);
    hm_vmm_piece_t *pc = hm__vmm_rec_piece(&c->rec, (uintptr_t)ptr);
    if (!pc || total > SIZE_MAX - (c->page - 1) || vmm_round(c, total) != pc->len) {
        HM_LOG_ERROR("CUDA provider: split of [%p, +%zu), not a range it handed out", ptr, total);
        res = HM_ERROR_INVALID_ARGUMENT;
    } else if (!hm__vmm_rec_split(&c->rec, pc, first)) {
        res = HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    hm__mutex_unlock(&c->vmm_lock);
    return res;
}

static hm_result_t cu_merge(void *state, void *lo, void *hi, size_t total) {
    cuprov_t *c = state;
    hm_result_t res = HM_SUCCESS;
    hm__mutex_lock(&c->vmm_lock);
    hm_vmm_piece_t *a = hm__vmm_rec_piece(&c->rec, (uintptr_t)lo);
    hm_vmm_piece_t *b = hm__vmm_rec_piece(&c->rec, (uintptr_t)hi);
    if (!a || !b || a->ptr + a->len != b->ptr || total > SIZE_MAX - (c->page - 1) ||
        vmm_round(c, total) != a->len + b->len) {
        HM_LOG_ERROR("CUDA provider: merge of [%p, %p, +%zu): not two adjacent ranges it "
                     "handed out", lo, hi, total);
        res = HM_ERROR_INVALID_ARGUMENT;
    } else {
        hm__vmm_rec_merge(&c->rec, a);
    }
    hm__mutex_unlock(&c->vmm_lock);
    return res;
}

/* One driver allocation of size bytes (the context current). */
static hm_result_t raw_alloc(cuprov_t *c, size_t size, uintptr_t *out) {
    hm_cu_result_t r;
    switch (c->type) {
    case HM_CUDA_MEMORY_DEVICE: {
        hm_cu_ptr_t d = 0;
        r = cu.MemAlloc(&d, size);
        *out = (uintptr_t)d;
        return r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuMemAlloc_v2");
    }
    case HM_CUDA_MEMORY_HOST: {
        void *p = NULL;
        r = cu.MemHostAlloc(&p, size, c->flags);
        *out = (uintptr_t)p;
        return r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuMemHostAlloc");
    }
    default: {
        hm_cu_ptr_t d = 0;
        r = cu.MemAllocManaged(&d, size, c->flags);
        *out = (uintptr_t)d;
        return r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuMemAllocManaged");
    }
    }
}

static hm_cu_result_t raw_free_call(cuprov_t *c, uintptr_t base) {
    return c->type == HM_CUDA_MEMORY_HOST ? cu.MemFreeHost((void *)base)
                                          : cu.MemFree((hm_cu_ptr_t)base);
}

/* Free base: the call alone first; only with no context current (the
 * driver's CUDA_ERROR_INVALID_CONTEXT) the provider's is pushed and the
 * free made again. */
static hm_result_t raw_free(cuprov_t *c, uintptr_t base) {
    hm_cu_result_t r = raw_free_call(c, base);
    if (torn_down(r)) return HM_SUCCESS;
    if (r == HM_CUDA_ERROR_INVALID_CONTEXT) {
        bool pushed;
        hm_result_t res = ctx_enter(c, &pushed);
        if (res != HM_SUCCESS) return res;
        r = raw_free_call(c, base);
        ctx_leave(pushed);
    }
    return r == HM_CUDA_SUCCESS ? HM_SUCCESS
                                : cu_fail(r, c->type == HM_CUDA_MEMORY_HOST ? "cuMemFreeHost"
                                                                           : "cuMemFree_v2");
}

static hm_result_t cu_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    cuprov_t *c = state;
    if (hm_unlikely(in_child(c))) {
        *ptr = NULL;
        return refuse_in_child("alloc");
    }
    if (!alignment) alignment = c->page;
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    uintptr_t base = 0;
    if (c->vmm) {
        res = vmm_alloc(c, size, alignment, &base);
        if (res == HM_SUCCESS) res = vmm_record(c, base, size);
        ctx_leave(pushed);
        *ptr = res == HM_SUCCESS ? (void *)base : NULL;
        return res;
    }
    /* The driver hands out allocations of 2 MiB and more 2 MiB-aligned, and
     * smaller ones packed (only 256 B is promised): up to the page's
     * alignment, a whole number of pages is asked for, which comes aligned
     * in one call. */
    size_t ask = size;
    if (alignment <= c->page && size <= SIZE_MAX - (c->page - 1))
        ask = (size + c->page - 1) & ~(c->page - 1);
    res = raw_alloc(c, ask, &base);
    if (res == HM_SUCCESS && (base & (alignment - 1))) {
        /* Not aligned as asked: size + alignment, and the aligned part. */
        (void)raw_free(c, base);
        base = 0;
        if (size > SIZE_MAX - alignment) res = HM_ERROR_OUT_OF_MEMORY;
        else res = raw_alloc(c, size + alignment, &base);
        if (res == HM_SUCCESS) {
            uintptr_t a = (base + alignment - 1) & ~(uintptr_t)(alignment - 1);
            if (!off_add(c, a, base)) {
                (void)raw_free(c, base);
                res = HM_ERROR_OUT_OF_HOST_MEMORY;
            } else {
                base = a;
            }
        }
    }
    ctx_leave(pushed);
    *ptr = res == HM_SUCCESS ? (void *)base : NULL;
    return res;
}

/* In a fork child the memory is the parent's: forgotten, never freed (the
 * driver would refuse every call). */
static hm_result_t cu_free(void *state, void *ptr, size_t size) {
    cuprov_t *c = state;
    if (hm_unlikely(in_child(c))) {
        if (c->vmm) vmm_forget(c, (uintptr_t)ptr);
        else (void)off_base(c, (uintptr_t)ptr, true);
        return HM_SUCCESS;
    }
    if (c->vmm) {
        bool pushed;
        hm_result_t res = ctx_enter(c, &pushed);
        if (res != HM_SUCCESS) return res;
        res = vmm_free(c, (uintptr_t)ptr, size);
        ctx_leave(pushed);
        return res;
    }
    return raw_free(c, off_base(c, (uintptr_t)ptr, true));
}

/* ---- fill and copy ---- */

static hm_result_t cu_sync(void) {
    hm_cu_result_t r = cu.StreamSynchronize(NULL);
    return r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuStreamSynchronize");
}

/* Host-pinned memory is the CPU's: filled and copied with memset and
 * memcpy (write-combined memory has a device address of its own, and the
 * host pointer is not one the driver's memset takes). Device and managed
 * memory: the driver's calls, then a synchronisation of the legacy stream
 * (cuMemsetD8_v2 is asynchronous for device memory). */
static hm_result_t cu_fill(void *state, void *ptr, uint8_t value, size_t size) {
    cuprov_t *c = state;
    if (c->type == HM_CUDA_MEMORY_HOST) {
        memset(ptr, value, size);
        return HM_SUCCESS;
    }
    if (hm_unlikely(in_child(c))) return refuse_in_child("fill");
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_result_t r = cu.MemsetD8((hm_cu_ptr_t)(uintptr_t)ptr, value, size);
    res = r == HM_CUDA_SUCCESS ? cu_sync() : cu_fail(r, "cuMemsetD8_v2");
    ctx_leave(pushed);
    return res;
}

static hm_result_t cu_copy(void *state, void *dst, const void *src, size_t size) {
    cuprov_t *c = state;
    if (c->type == HM_CUDA_MEMORY_HOST) {
        memcpy(dst, src, size);
        return HM_SUCCESS;
    }
    if (hm_unlikely(in_child(c))) return refuse_in_child("copy");
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_result_t r =
        cu.Memcpy((hm_cu_ptr_t)(uintptr_t)dst, (hm_cu_ptr_t)(uintptr_t)src, size);
    res = r == HM_CUDA_SUCCESS ? cu_sync() : cu_fail(r, "cuMemcpy");
    ctx_leave(pushed);
    return res;
}

/* ---- IPC (device memory) ----
 *
 * Two payloads of one size (the IPC layer asks every provider of a family
 * for the same handle_size), told apart by their magic, with the device's
 * UUID at the same offset: cu_payload_t (legacy allocator:
 * cuIpcGetMemHandle) and cu_vmm_payload_t (VMM allocator: a shareable
 * handle). Any device provider opens either. */

#define CU_MAGIC 0x68637531u /* "hcu1" */
typedef struct cu_payload {
    uint32_t magic;
    uint32_t reserved;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    uint64_t buffer_id; /* the driver's id of the allocation (address reuse) */
    uint64_t offset;    /* of the exported range in the driver's allocation */
    uint64_t size;
    hm_cu_ipc_handle_t h;
} cu_payload_t;

#define CU_VMM_MAGIC 0x68637532u /* "hcu2" */
enum { CU_VMM_FD = 1, CU_VMM_FABRIC = 2 };
typedef struct cu_vmm_payload {
    uint32_t magic;
    uint32_t kind; /* CU_VMM_FD or CU_VMM_FABRIC */
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    uint64_t alloc_size; /* the physical allocation's */
    uint64_t offset;     /* of the exported range in it */
    uint64_t size;       /* of the exported range */
    union {
        /* FD: the exporter's descriptor and export id, for its put (the
         * importer receives its own copy of the descriptor and ignores
         * these); the rest zero. */
        struct {
            int32_t fd;
            uint32_t zero;
            uint64_t id;
            uint8_t zero2[48];
        } x;
        hm_cu_fabric_handle_t fabric; /* FABRIC: the driver's, by value */
    } h;
} cu_vmm_payload_t;
_Static_assert(sizeof(cu_vmm_payload_t) == sizeof(cu_payload_t), "one handle_size");
_Static_assert(offsetof(cu_vmm_payload_t, uuid) == offsetof(cu_payload_t, uuid), "the UUID");

static size_t cu_ipc_handle_size(void *state) {
    (void)state;
    return sizeof(cu_payload_t);
}

static uint32_t payload_magic(const void *payload) {
    uint32_t m;
    memcpy(&m, payload, sizeof(m));
    return m;
}

/* The export table (FD descriptors until put). */
static bool xfd_add(cuprov_t *c, int fd, uint64_t *id) {
    hm__mutex_lock(&c->x_lock);
    if (!hm__cuda_grow((void **)&c->xfd, c->nxfd, &c->xfd_cap, sizeof(*c->xfd))) {
        hm__mutex_unlock(&c->x_lock);
        return false;
    }
    *id = ++c->xfd_next;
    c->xfd[c->nxfd++] = (xfd_ent_t){fd, *id};
    hm__mutex_unlock(&c->x_lock);
    return true;
}
static bool xfd_take(cuprov_t *c, int fd, uint64_t id) {
    bool found = false;
    hm__mutex_lock(&c->x_lock);
    for (size_t i = 0; i < c->nxfd && !found; i++) {
        if (c->xfd[i].fd != fd || c->xfd[i].id != id) continue;
        c->xfd[i] = c->xfd[--c->nxfd];
        found = true;
    }
    hm__mutex_unlock(&c->x_lock);
    return found;
}

/* The process's VMM imports (base, length of the reservation): close goes
 * through any provider of the context, which unmaps these instead of
 * cuIpcCloseMemHandle. n is read without the lock (relaxed) to skip the
 * lookup while there are none. */
typedef struct vimp_ent {
    uintptr_t base;
    size_t len;
} vimp_ent_t;
static struct {
    pthread_mutex_t lock;
    vimp_ent_t *v;
    size_t cap;
    _Atomic size_t n;
} vimp = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool vimp_add(uintptr_t base, size_t len) {
    hm__mutex_lock(&vimp.lock);
    size_t n = atomic_load_explicit(&vimp.n, memory_order_relaxed);
    if (!hm__cuda_grow((void **)&vimp.v, n, &vimp.cap, sizeof(*vimp.v))) {
        hm__mutex_unlock(&vimp.lock);
        return false;
    }
    vimp.v[n] = (vimp_ent_t){base, len};
    atomic_store_explicit(&vimp.n, n + 1, memory_order_relaxed);
    hm__mutex_unlock(&vimp.lock);
    return true;
}
/* The import that holds ptr, taken out of the record. */
static bool vimp_take(uintptr_t ptr, vimp_ent_t *out) {
    if (!atomic_load_explicit(&vimp.n, memory_order_relaxed)) return false;
    bool found = false;
    hm__mutex_lock(&vimp.lock);
    size_t n = atomic_load_explicit(&vimp.n, memory_order_relaxed);
    for (size_t i = 0; i < n && !found; i++) {
        if (ptr < vimp.v[i].base || ptr - vimp.v[i].base >= vimp.v[i].len) continue;
        *out = vimp.v[i];
        vimp.v[i] = vimp.v[n - 1];
        atomic_store_explicit(&vimp.n, n - 1, memory_order_relaxed);
        found = true;
    }
    hm__mutex_unlock(&vimp.lock);
    return found;
}

/* VMM export: exactly one whole mapping the provider made (a handle grants
 * the whole physical allocation it names, so a part of it is refused):
 * its handle retained (cuMemRetainAllocationHandle), exported, released. */
static hm_result_t vmm_get(cuprov_t *c, void *ptr, size_t size, void *payload, int *fd) {
    if (c->shareable == HM_CUDA_SHAREABLE_NONE) {
        HM_LOG_ERROR("CUDA provider: no IPC of memory allocated without a shareable handle "
                     "(HM_CUDA_SHAREABLE_NONE)");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (hm_unlikely(in_child(c))) return refuse_in_child("IPC export");
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_ptr_t base = 0;
    size_t len = 0;
    hm_cu_result_t r = cu.MemGetAddressRange(&base, &len, (hm_cu_ptr_t)(uintptr_t)ptr);
    if (r != HM_CUDA_SUCCESS) {
        ctx_leave(pushed);
        return cu_fail(r, "cuMemGetAddressRange_v2");
    }
    if (base != (uintptr_t)ptr || !size || size > SIZE_MAX - (c->page - 1) ||
        len != vmm_round(c, size)) {
        ctx_leave(pushed);
        HM_LOG_ERROR("CUDA provider: [%p, +%zu) is not one whole allocation (the driver maps "
                     "[0x%llx, +%zu) there): a shareable handle would grant all of it; not "
                     "exported", ptr, size, (unsigned long long)base, len);
        return HM_ERROR_NOT_SUPPORTED;
    }
    hm_cu_mem_handle_t h = 0;
    r = cu.MemRetainAllocationHandle(&h, ptr);
    if (r != HM_CUDA_SUCCESS) {
        ctx_leave(pushed);
        return cu_fail(r, "cuMemRetainAllocationHandle");
    }
    cu_vmm_payload_t pl = {.magic = CU_VMM_MAGIC, .alloc_size = len, .size = size};
    memcpy(pl.uuid, c->uuid, sizeof(pl.uuid));
    int xfd = -1;
    if (c->shareable == HM_CUDA_SHAREABLE_FD) {
        pl.kind = CU_VMM_FD;
        r = cu.MemExportToShareableHandle(&xfd, h, HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    } else {
        pl.kind = CU_VMM_FABRIC;
        r = cu.MemExportToShareableHandle(&pl.h.fabric, h, HM_CU_MEM_HANDLE_TYPE_FABRIC, 0);
    }
    res = r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuMemExportToShareableHandle");
    if (r != HM_CUDA_SUCCESS) xfd = -1;
    r = cu.MemRelease(h);
    if (r != HM_CUDA_SUCCESS) {
        /* The reference would keep the memory after its free: once more. */
        res = cu_fail(r, "cuMemRelease");
        (void)cu.MemRelease(h);
    }
    ctx_leave(pushed);
    if (res == HM_SUCCESS && xfd >= 0) {
        uint64_t id = 0;
        if (!xfd_add(c, xfd, &id)) {
            res = HM_ERROR_OUT_OF_HOST_MEMORY;
        } else {
            pl.h.x.fd = xfd;
            pl.h.x.id = id;
        }
    }
    if (res != HM_SUCCESS) {
        if (xfd >= 0) (void)hm__prim_close(xfd);
        return res;
    }
    memcpy(payload, &pl, sizeof(pl));
    *fd = xfd;
    return HM_SUCCESS;
}

static hm_result_t cu_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    cuprov_t *c = state;
    *fd = -1;
    if (c->type != HM_CUDA_MEMORY_DEVICE) {
        HM_LOG_ERROR("CUDA provider: no IPC of %s memory",
                     c->type == HM_CUDA_MEMORY_HOST ? "host-pinned" : "managed");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (c->vmm) return vmm_get(c, ptr, size, payload, fd);
    if (hm_unlikely(in_child(c))) return refuse_in_child("IPC export");
    cu_payload_t pl = {.magic = CU_MAGIC, .size = size};
    memcpy(pl.uuid, c->uuid, sizeof(pl.uuid));
    uintptr_t base = off_base(c, (uintptr_t)ptr, false);
    pl.offset = (uintptr_t)ptr - base;
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    unsigned int attr = HM_CU_POINTER_ATTRIBUTE_BUFFER_ID;
    void *data[1] = {&pl.buffer_id};
    hm_cu_result_t r = cu.PointerGetAttributes(1, &attr, data, (hm_cu_ptr_t)base);
    if (r == HM_CUDA_SUCCESS) r = cu.IpcGetMemHandle(&pl.h, (hm_cu_ptr_t)base);
    ctx_leave(pushed);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuIpcGetMemHandle");
    memcpy(payload, &pl, sizeof(pl));
    return HM_SUCCESS;
}

/* Legacy and fabric handles need no release; an FD export's descriptor is
 * closed, only when this provider's table holds it (fd and id): a payload
 * that names another descriptor closes nothing. */
static hm_result_t cu_ipc_put(void *state, void *payload) {
    cuprov_t *c = state;
    if (payload_magic(payload) != CU_VMM_MAGIC) return HM_SUCCESS;
    cu_vmm_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.kind != CU_VMM_FD) return HM_SUCCESS;
    if (!xfd_take(c, pl.h.x.fd, pl.h.x.id)) {
        HM_LOG_ERROR("CUDA provider: put of an export it does not hold (descriptor %d, id %llu): "
                     "nothing closed", (int)pl.h.x.fd, (unsigned long long)pl.h.x.id);
        return HM_ERROR_INVALID_HANDLE;
    }
    (void)hm__prim_close(pl.h.x.fd);
    return HM_SUCCESS;
}

static hm_result_t cu_ipc_compatible(void *state, const void *payload) {
    cuprov_t *c = state;
    cu_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != CU_MAGIC && pl.magic != CU_VMM_MAGIC) return HM_ERROR_INVALID_HANDLE;
    if (memcmp(pl.uuid, c->uuid, sizeof(pl.uuid)) == 0) return HM_SUCCESS;
    int n = 0;
    if (cu.DeviceGetCount(&n) != HM_CUDA_SUCCESS) n = 0;
    for (int i = 0; i < n; i++) {
        hm_cu_device_t d;
        hm_cu_uuid_t u;
        if (cu.DeviceGet(&d, i) != HM_CUDA_SUCCESS || cu.DeviceGetUuid(&u, d) != HM_CUDA_SUCCESS ||
            memcmp(u.bytes, pl.uuid, sizeof(pl.uuid)) != 0)
            continue;
        int can = 0;
        if (cu.DeviceCanAccessPeer(&can, c->dev, d) == HM_CUDA_SUCCESS && can) return HM_SUCCESS;
        break;
    }
    HM_LOG_ERROR("CUDA provider (device %d): cannot open memory of another device that it has "
                 "no peer access to", (int)c->dev);
    return HM_ERROR_NOT_SUPPORTED;
}

/* The payload's claims, before any is used: a size equal to the handle's,
 * an over-alignment offset whose end (offset + size) does not wrap. */
static bool payload_sane(const cu_payload_t *pl, size_t size) {
    return pl->magic == CU_MAGIC && pl->reserved == 0 && size && pl->size == size &&
           pl->size <= UINT64_MAX - pl->offset;
}

/* A VMM payload's claims against what this provider can map: the kind, its
 * reserved bytes zero, the sizes nonzero, the allocation and the offset
 * multiples of the granularity, the range inside the allocation, its size
 * the handle's; NULL when sane, else why not. */
static const char *vmm_payload_insane(const cuprov_t *c, const cu_vmm_payload_t *pl, int fd,
                                      size_t size) {
    static const uint8_t zero[sizeof(pl->h.x.zero2)];
    if (pl->kind != CU_VMM_FD && pl->kind != CU_VMM_FABRIC) return "an unknown handle kind";
    if (pl->kind == CU_VMM_FD && (pl->h.x.zero || memcmp(pl->h.x.zero2, zero, sizeof(zero))))
        return "reserved bytes not zero";
    if (pl->kind == CU_VMM_FD && fd < 0) return "no descriptor came with it";
    if (!size || pl->size != size) return "a size other than the handle's";
    if (!pl->alloc_size || pl->alloc_size > SIZE_MAX || pl->alloc_size % c->vmm_gran)
        return "an allocation size that is no granularity multiple";
    if (pl->offset % c->vmm_gran) return "an offset that is no granularity multiple";
    if (pl->offset > pl->alloc_size || pl->size > pl->alloc_size - pl->offset)
        return "a range beyond the allocation";
    return NULL;
}

/* A driver error of an import or mapping as this open's answer: what the
 * peer's payload or descriptor names is not what it claims. */
static hm_result_t import_fail(hm_cu_result_t r, const char *call) {
    hm_result_t res = cu_fail(r, call);
    switch (r) {
    case HM_CUDA_ERROR_INVALID_VALUE:
    case HM_CUDA_ERROR_INVALID_HANDLE:
    case HM_CUDA_ERROR_NOT_PERMITTED: return HM_ERROR_INVALID_HANDLE;
    case HM_CUDA_ERROR_NOT_SUPPORTED: return HM_ERROR_NOT_SUPPORTED;
    default: return res;
    }
}

/* VMM import: the shareable handle imported, checked to be pinned device
 * memory, mapped whole (alloc_size) at a reservation of this process's
 * choosing with read-write access for the provider's device and peers, the
 * handle released (the mapping keeps the memory), the mapping recorded for
 * close. One unwinding ladder: nothing stays on failure. */
static hm_result_t vmm_open(cuprov_t *c, const cu_vmm_payload_t *pl, int fd, size_t size,
                            void **ptr) {
    if (!c->vmm_gran) {
        HM_LOG_ERROR("CUDA provider: the driver has no virtual memory API to open a VMM handle");
        return HM_ERROR_NOT_SUPPORTED;
    }
    const char *why = vmm_payload_insane(c, pl, fd, size);
    if (why) {
        HM_LOG_ERROR("CUDA provider: malformed VMM IPC payload (%s: allocation %llu, offset "
                     "%llu, size %llu, handle size %zu)", why,
                     (unsigned long long)pl->alloc_size, (unsigned long long)pl->offset,
                     (unsigned long long)pl->size, size);
        return HM_ERROR_INVALID_HANDLE;
    }
    hm_result_t res = cu_ipc_compatible(c, pl);
    if (res != HM_SUCCESS) return res;
    if (hm_unlikely(in_child(c))) return refuse_in_child("IPC open");
    bool pushed;
    res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    size_t len = (size_t)pl->alloc_size;
    hm_cu_fabric_handle_t fabric = pl->h.fabric;
    hm_cu_mem_handle_t h = 0;
    hm_cu_result_t r =
        pl->kind == CU_VMM_FD
            ? cu.MemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                              HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            : cu.MemImportFromShareableHandle(&h, &fabric, HM_CU_MEM_HANDLE_TYPE_FABRIC);
    if (r != HM_CUDA_SUCCESS) {
        res = import_fail(r, "cuMemImportFromShareableHandle");
        goto out;
    }
    hm_cu_mem_prop_t prop;
    memset(&prop, 0, sizeof(prop));
    r = cu.MemGetAllocationPropertiesFromHandle(&prop, h);
    if (r != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuMemGetAllocationPropertiesFromHandle");
        goto release;
    }
    if (prop.type != HM_CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop.location.type != HM_CU_MEM_LOCATION_TYPE_DEVICE) {
        HM_LOG_ERROR("CUDA provider: the VMM handle names no pinned device memory (type %u, "
                     "location type %u): refused", prop.type, prop.location.type);
        res = HM_ERROR_INVALID_HANDLE;
        goto release;
    }
    hm_cu_ptr_t va = 0;
    r = cu.MemAddressReserve(&va, len, c->vmm_gran, 0, 0);
    if (r != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuMemAddressReserve");
        goto release;
    }
    r = cu.MemMap(va, len, 0, h, 0);
    if (r != HM_CUDA_SUCCESS) {
        res = import_fail(r, "cuMemMap");
        if (res == HM_ERROR_INVALID_HANDLE)
            HM_LOG_ERROR("CUDA provider: the VMM handle claims an allocation of %zu bytes the "
                         "driver does not map: refused", len);
        goto unreserve;
    }
    r = cu.MemSetAccess(va, len, c->acc, c->nacc);
    if (r != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuMemSetAccess");
        goto unmap;
    }
    if (!vimp_add((uintptr_t)va, len)) {
        res = HM_ERROR_OUT_OF_HOST_MEMORY;
        goto unmap;
    }
    r = cu.MemRelease(h);
    if (r != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuMemRelease");
        vimp_ent_t e;
        (void)vimp_take((uintptr_t)va, &e);
        goto unmap;
    }
    ctx_leave(pushed);
    *ptr = (void *)(uintptr_t)(va + pl->offset);
    return HM_SUCCESS;

unmap:
    if ((r = cu.MemUnmap(va, len)) != HM_CUDA_SUCCESS) (void)cu_fail(r, "cuMemUnmap");
unreserve:
    if ((r = cu.MemAddressFree(va, len)) != HM_CUDA_SUCCESS) (void)cu_fail(r, "cuMemAddressFree");
release:
    if ((r = cu.MemRelease(h)) != HM_CUDA_SUCCESS) (void)cu_fail(r, "cuMemRelease");
out:
    ctx_leave(pushed);
    return res;
}

/* The payload is the peer's: its sizes and offset are checked before use,
 * and after the driver's open the mapping must hold all that it claims
 * (offset + size within the allocation the driver mapped, as
 * cuMemGetAddressRange_v2 reports it). Otherwise the tracker would record
 * more than is mapped, and a fill or copy there would run past it. */
static hm_result_t cu_ipc_open(void *state, const void *payload, int fd, size_t size,
                               void **ptr) {
    cuprov_t *c = state;
    *ptr = NULL;
    if (payload_magic(payload) == CU_VMM_MAGIC) {
        cu_vmm_payload_t vpl;
        memcpy(&vpl, payload, sizeof(vpl));
        return vmm_open(c, &vpl, fd, size, ptr);
    }
    cu_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (!payload_sane(&pl, size)) {
        HM_LOG_ERROR("CUDA provider: malformed IPC payload (offset %llu, size %llu, handle "
                     "size %zu)", (unsigned long long)pl.offset, (unsigned long long)pl.size,
                     size);
        return HM_ERROR_INVALID_HANDLE;
    }
    /* The device (its UUID), as the IPC layer checked it before: a payload
     * read here is the one checked there, but open must refuse on its own
     * what it cannot map. */
    hm_result_t res = cu_ipc_compatible(state, payload);
    if (res != HM_SUCCESS) return res;
    if (hm_unlikely(in_child(c))) return refuse_in_child("IPC open");
    bool pushed;
    res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_ptr_t d = 0;
    hm_cu_result_t r = cu.IpcOpenMemHandle(&d, pl.h, HM_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != HM_CUDA_SUCCESS) {
        ctx_leave(pushed);
        return cu_fail(r, "cuIpcOpenMemHandle_v2");
    }
    hm_cu_ptr_t base = 0;
    size_t len = 0;
    r = cu.MemGetAddressRange(&base, &len, d);
    if (r != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuMemGetAddressRange_v2");
    } else if (!hm_range_holds((uintptr_t)base, len, (uintptr_t)d, pl.offset, pl.size)) {
        HM_LOG_ERROR("CUDA provider: the IPC handle claims [%llu, +%llu) of an allocation the "
                     "driver mapped with %zu bytes: refused", (unsigned long long)pl.offset,
                     (unsigned long long)pl.size, len);
        res = HM_ERROR_INVALID_HANDLE;
    }
    if (res != HM_SUCCESS) {
        r = cu.IpcCloseMemHandle(d);
        if (r != HM_CUDA_SUCCESS) (void)cu_fail(r, "cuIpcCloseMemHandle");
        ctx_leave(pushed);
        return res;
    }
    ctx_leave(pushed);
    *ptr = (void *)(uintptr_t)(d + pl.offset);
    return HM_SUCCESS;
}

/* ptr is what open handed out: the mapping's base plus the exporter's
 * alignment offset. The base is the driver's (cuMemGetAddressRange_v2 of
 * ptr), or the process's record of VMM imports, not a record of this
 * provider's: pools of one context share a mapping, and the provider that
 * closes it may not be the one that opened it (provider.h, ipc_context). */
static hm_result_t cu_ipc_close(void *state, void *ptr, size_t size) {
    cuprov_t *c = state;
    (void)size;
    if (hm_unlikely(in_child(c))) return HM_SUCCESS; /* the parent's mapping */
    hm_cu_context_t cur;
    if (torn_down(cu.CtxGetCurrent(&cur))) return HM_SUCCESS;
    vimp_ent_t e;
    if (vimp_take((uintptr_t)ptr, &e)) {
        hm_cu_result_t r = cu.MemUnmap((hm_cu_ptr_t)e.base, e.len);
        if (torn_down(r)) return HM_SUCCESS;
        if (r != HM_CUDA_SUCCESS) {
            hm_result_t res = cu_fail(r, "cuMemUnmap");
            if (!vimp_add(e.base, e.len)) /* still mapped: closed again later */
                HM_LOG_ERROR("CUDA provider: lost the record of a VMM mapping at 0x%llx",
                             (unsigned long long)e.base);
            return res;
        }
        r = cu.MemAddressFree((hm_cu_ptr_t)e.base, e.len);
        if (r != HM_CUDA_SUCCESS && !torn_down(r)) return cu_fail(r, "cuMemAddressFree");
        return HM_SUCCESS;
    }
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_ptr_t base = 0;
    hm_cu_result_t r = cu.MemGetAddressRange(&base, NULL, (hm_cu_ptr_t)(uintptr_t)ptr);
    if (r != HM_CUDA_SUCCESS) {
        res = cu_fail(r, "cuMemGetAddressRange_v2");
    } else {
        r = cu.IpcCloseMemHandle(base);
        res = r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuIpcCloseMemHandle");
    }
    ctx_leave(pushed);
    return res;
}

/* ---- streams and events (hetmem/stream.h) ---- */

static bool have_events(void) {
    return cu.EventCreate && cu.EventRecord && cu.EventQuery && cu.EventSynchronize &&
           cu.EventDestroy;
}

static hm_result_t cu_event_create(void *state, void **event) {
    cuprov_t *c = state;
    if (!have_events()) {
        HM_LOG_ERROR("CUDA provider: the driver has no events (cuEventCreate)");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (hm_unlikely(in_child(c))) return refuse_in_child("event create");
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_event_t ev = NULL;
    hm_cu_result_t r = cu.EventCreate(&ev, HM_CU_EVENT_DISABLE_TIMING);
    ctx_leave(pushed);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuEventCreate");
    *event = ev;
    return HM_SUCCESS;
}

static hm_result_t cu_event_record(void *state, void *event, void *stream) {
    cuprov_t *c = state;
    if (hm_unlikely(in_child(c))) return refuse_in_child("event record");
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_result_t r = cu.EventRecord(event, stream);
    ctx_leave(pushed);
    return r == HM_CUDA_SUCCESS ? HM_SUCCESS : cu_fail(r, "cuEventRecord");
}

/* No context needed: an event is the driver's object wherever it is asked. */
static hm_result_t cu_event_query(void *state, void *event) {
    cuprov_t *c = state;
    if (hm_unlikely(in_child(c))) return HM_ERROR_NOT_SUPPORTED;
    hm_cu_result_t r = cu.EventQuery(event);
    if (r == HM_CUDA_SUCCESS) return HM_SUCCESS;
    if (r == HM_CUDA_ERROR_NOT_READY) return HM_ERROR_BUSY;
    if (torn_down(r)) return HM_SUCCESS; /* the work went with the driver */
    return cu_fail(r, "cuEventQuery");
}

static hm_result_t cu_event_sync(void *state, void *event) {
    cuprov_t *c = state;
    if (hm_unlikely(in_child(c))) return HM_ERROR_NOT_SUPPORTED;
    hm_cu_result_t r = cu.EventSynchronize(event);
    if (r == HM_CUDA_SUCCESS || torn_down(r)) return HM_SUCCESS;
    return cu_fail(r, "cuEventSynchronize");
}

static void cu_event_destroy(void *state, void *event) {
    cuprov_t *c = state;
    if (hm_unlikely(in_child(c))) return; /* the parent's */
    hm_cu_result_t r = cu.EventDestroy(event);
    if (r != HM_CUDA_SUCCESS && !torn_down(r)) (void)cu_fail(r, "cuEventDestroy_v2");
}

static uint64_t cu_ipc_context(void *state) {
    cuprov_t *c = state;
    return (uint64_t)(uintptr_t)c->ctx;
}

static const hm_provider_ops_t cu_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "cuda",
    .init = cu_init,
    .fini = cu_fini,
    .get_info = cu_get_info,
    .alloc = cu_alloc,
    .free = cu_free,
    .split = cu_split,
    .merge = cu_merge,
    .ipc =
        {
            .handle_size = cu_ipc_handle_size,
            .get = cu_ipc_get,
            .put = cu_ipc_put,
            .open = cu_ipc_open,
            .close = cu_ipc_close,
        },
    .get_device = cu_get_device,
    .fill = cu_fill,
    .copy = cu_copy,
    .ipc_compatible = cu_ipc_compatible,
    .ipc_context = cu_ipc_context,
    .stream =
        {
            .event_create = cu_event_create,
            .event_record = cu_event_record,
            .event_query = cu_event_query,
            .event_sync = cu_event_sync,
            .event_destroy = cu_event_destroy,
        },
};

const hm_provider_ops_t *hm_cuda_provider_ops(void) { return &cu_ops; }

hm_result_t hm_cuda_provider_create(const hm_cuda_params_t *params, hm_provider_t **provider) {
    return hm_provider_create(&cu_ops, params, provider);
}

hm_result_t hm_cuda_allocation_info(hm_provider_t *provider, const void *ptr,
                                    hm_cuda_allocation_t *info) {
    if (!provider || !ptr || !info) {
        HM_LOG_ERROR("hm_cuda_allocation_info: %s is NULL",
                     !provider ? "provider" : !ptr ? "ptr" : "info");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    const hm_provider_ops_t *o = hm_provider_get_ops(provider);
    if (!o || o->alloc != cu_alloc) {
        HM_LOG_ERROR("hm_cuda_allocation_info: not a CUDA provider");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    cuprov_t *c = hm_provider_get_state(provider);
    unsigned int attrs[] = {HM_CU_POINTER_ATTRIBUTE_CONTEXT, HM_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                            HM_CU_POINTER_ATTRIBUTE_BUFFER_ID, HM_CU_POINTER_ATTRIBUTE_IS_MANAGED,
                            HM_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                            HM_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                            HM_CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    hm_cu_context_t ctx = NULL;
    unsigned int mtype = 0;
    unsigned long long id = 0, start = 0;
    unsigned int managed = 0;
    int ordinal = -1;
    size_t rsize = 0;
    void *data[] = {&ctx, &mtype, &id, &managed, &ordinal, &start, &rsize};
    bool pushed;
    hm_result_t res = ctx_enter(c, &pushed);
    if (res != HM_SUCCESS) return res;
    hm_cu_result_t r = cu.PointerGetAttributes(sizeof(attrs) / sizeof(attrs[0]), attrs, data,
                                               (hm_cu_ptr_t)(uintptr_t)ptr);
    ctx_leave(pushed);
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuPointerGetAttributes");
    if (!mtype) {
        HM_LOG_ERROR("hm_cuda_allocation_info(%p): not memory of the driver", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    info->type = managed ? HM_CUDA_MEMORY_MANAGED
                 : mtype == HM_CU_MEMORYTYPE_HOST ? HM_CUDA_MEMORY_HOST
                                                  : HM_CUDA_MEMORY_DEVICE;
    info->device_ptr = (uint64_t)(uintptr_t)ptr;
    if (info->type == HM_CUDA_MEMORY_HOST && cu.MemHostGetDevicePointer) {
        /* The device's address of host-pinned memory: the host pointer but
         * for write-combined memory, whose device address is its own
         * (cuda.h, cuMemHostAlloc). Asked for the allocation's start. */
        hm_cu_ptr_t dbase = 0;
        uintptr_t hbase = start ? (uintptr_t)start : (uintptr_t)ptr;
        res = ctx_enter(c, &pushed);
        if (res != HM_SUCCESS) return res;
        r = cu.MemHostGetDevicePointer(&dbase, (void *)hbase, 0);
        ctx_leave(pushed);
        if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuMemHostGetDevicePointer_v2");
        info->device_ptr = (uint64_t)dbase + ((uintptr_t)ptr - hbase);
    }
    info->device = ordinal;
    info->context = ctx;
    info->buffer_id = id;
    info->base = start;
    info->size = rsize;
    return HM_SUCCESS;
}
