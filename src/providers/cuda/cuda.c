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
 * Concurrency:
 *   cu (entry points)      written once under pthread_once, then read-only
 *   provider state         immutable after init, but the offset table
 *   offset table           off_lock; noff read without it (relaxed) to skip
 *                          the lookup when it is empty */
#include "internal.h"
#include "platform/dl.h"
#include "platform/prim.h"
#include "providers/cuda/cuda_api.h"

#include <hetmem/providers/cuda.h>

#include <pthread.h>
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

typedef struct cuprov {
    hm_cu_context_t ctx;
    hm_cu_device_t dev;
    bool primary; /* retained: released at fini */
    hm_cuda_memory_type_t type;
    unsigned flags;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    size_t page;
    bool vmm; /* HM_CUDA_ALLOCATOR_VMM: cuMemCreate + cuMemAddressReserve + cuMemMap */
    unsigned epoch; /* hm__prim_fork_epoch() at init: another one is a fork child */
    pthread_mutex_t off_lock;
    off_ent_t *off;
    size_t noff_cap;
    _Atomic size_t noff;
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
    if (n == c->noff_cap) {
        size_t cap = c->noff_cap ? 2 * c->noff_cap : 16;
        off_ent_t *t = realloc(c->off, cap * sizeof(*t));
        if (!t) {
            hm__mutex_unlock(&c->off_lock);
            return false;
        }
        c->off = t;
        c->noff_cap = cap;
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
    if (p->allocator == HM_CUDA_ALLOCATOR_VMM &&
        !(cu.MemGetAllocationGranularity && cu.MemCreate && cu.MemRelease &&
          cu.MemAddressReserve && cu.MemAddressFree && cu.MemMap && cu.MemUnmap &&
          cu.MemSetAccess)) {
        HM_LOG_ERROR("CUDA provider: the driver has no virtual memory API (cuMemCreate)");
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
    if (p->allocator == HM_CUDA_ALLOCATOR_VMM) {
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
    }
    c->epoch = hm__prim_fork_epoch();
    pthread_mutex_init(&c->off_lock, NULL);
    *state = c;
    return HM_SUCCESS;

fail_ctx:
    if (c->primary) (void)cu.DevicePrimaryCtxRelease(c->dev);
fail:
    free(c);
    return res;
}

static void cu_fini(void *state) {
    cuprov_t *c = state;
    if (c->primary && !in_child(c)) {
        hm_cu_result_t r = cu.DevicePrimaryCtxRelease(c->dev);
        if (r != HM_CUDA_SUCCESS && !torn_down(r)) (void)cu_fail(r, "cuDevicePrimaryCtxRelease_v2");
    }
    pthread_mutex_destroy(&c->off_lock);
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
        if (!c->vmm) info->caps |= HM_PROVIDER_CAP_IPC; /* VMM: not yet */
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
            hm_cu_mem_access_t acc = {.location = prop.location,
                                      .flags = HM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            call = "cuMemSetAccess";
            r = cu.MemSetAccess(ptr, len, &acc, 1);
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

/* Unmapping frees the physical memory (its handle was released). */
static hm_result_t vmm_free(cuprov_t *c, uintptr_t ptr, size_t size) {
    size_t len = vmm_round(c, size);
    hm_cu_result_t r = cu.MemUnmap((hm_cu_ptr_t)ptr, len);
    if (torn_down(r)) return HM_SUCCESS;
    if (r != HM_CUDA_SUCCESS) return cu_fail(r, "cuMemUnmap");
    r = cu.MemAddressFree((hm_cu_ptr_t)ptr, len);
    if (r != HM_CUDA_SUCCESS && !torn_down(r)) return cu_fail(r, "cuMemAddressFree");
    return HM_SUCCESS;
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
        (void)off_base(c, (uintptr_t)ptr, true);
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

/* ---- IPC (device memory) ---- */

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

static size_t cu_ipc_handle_size(void *state) {
    (void)state;
    return sizeof(cu_payload_t);
}

static hm_result_t cu_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    cuprov_t *c = state;
    *fd = -1;
    if (c->type != HM_CUDA_MEMORY_DEVICE) {
        HM_LOG_ERROR("CUDA provider: no IPC of %s memory",
                     c->type == HM_CUDA_MEMORY_HOST ? "host-pinned" : "managed");
        return HM_ERROR_NOT_SUPPORTED;
    }
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

static hm_result_t cu_ipc_put(void *state, void *payload) {
    (void)state, (void)payload; /* CUDA handles need no release */
    return HM_SUCCESS;
}

static hm_result_t cu_ipc_compatible(void *state, const void *payload) {
    cuprov_t *c = state;
    cu_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != CU_MAGIC) return HM_ERROR_INVALID_HANDLE;
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

/* The payload is the peer's: its sizes and offset are checked before use,
 * and after the driver's open the mapping must hold all that it claims
 * (offset + size within the allocation the driver mapped, as
 * cuMemGetAddressRange_v2 reports it). Otherwise the tracker would record
 * more than is mapped, and a fill or copy there would run past it. */
static hm_result_t cu_ipc_open(void *state, const void *payload, int fd, size_t size,
                               void **ptr) {
    cuprov_t *c = state;
    (void)fd;
    *ptr = NULL;
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
 * ptr), not a record of this provider's: pools of one context share a
 * mapping, and the provider that closes it may not be the one that opened
 * it (provider.h, ipc_context). */
static hm_result_t cu_ipc_close(void *state, void *ptr, size_t size) {
    cuprov_t *c = state;
    (void)size;
    if (hm_unlikely(in_child(c))) return HM_SUCCESS; /* the parent's mapping */
    hm_cu_context_t cur;
    if (torn_down(cu.CtxGetCurrent(&cur))) return HM_SUCCESS;
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
