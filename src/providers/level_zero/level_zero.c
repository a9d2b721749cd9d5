/* hetmem — the Level Zero provider (include/hetmem/providers/level_zero.h).
 * SPDX-License-Identifier: MIT
 *
 * The loader is opened at run time (platform/dl.h) and its entry points
 * resolved once per process into `ze` (required ones, and the optional
 * zeInitDrivers, zeMemFreeExt, zeMemPutIpcHandle, zeCommandListHostSynchronize).
 * Types, constants and struct layouts come from Debian's libze-dev headers;
 * no code of the loader is linked.
 *
 * State per provider: the context (the caller's, or one per driver that
 * hetmem creates for providers made from ordinals, counted in `owned_ctx`),
 * the device, its identity, the memory type, the page size, and one
 * synchronous immediate command list for fill and copy (created at the
 * first fill or copy, under cl_lock, which also serialises its use: a
 * command list is not thread-safe), and the events of stream-ordered
 * allocation (below).
 *
 * Where the driver cannot be called, the provider does not call it:
 *  - in a fork child (the epoch hm__prim_fork_epoch() differs from the one
 *    at load): Level Zero's handles and mappings are the parent's, and the
 *    loader's zeInit is done once per address space, so the child's calls
 *    reach no initialised driver (intel/compute-runtime#954: the child
 *    deadlocks or sees no driver). Allocation, fill, copy and IPC export and
 *    open answer HM_ERROR_NOT_SUPPORTED (one log line per process); free,
 *    IPC put and close and fini forget what they are given.
 *  - once exit() has begun (an atexit handler registered right after the
 *    loader was opened, so it runs before the loader's own exit-time
 *    destructors): a pool destroyed later at exit, or from a destructor,
 *    would call into a torn-down loader and driver. The same answers as in
 *    a fork child; the kernel takes the memory back with the process.
 *
 * Concurrency:
 *   ze (entry points)     written once under pthread_once, then read-only
 *   ze_epoch, ze_exiting  ze_epoch written once under pthread_once;
 *                         ze_exiting set once by the atexit handler
 *   owned_ctx list        ctx_lock (create/fini only)
 *   provider state        immutable after init, except the command list
 *                         (cl_lock) and the event pools and slots (ev_lock)
 *   one event (lz_event_t) its ops are the caller's to serialise, as the
 *                         driver's own calls on one event are
 * No lock is held across a driver call except cl_lock around the command
 * list's own calls and ev_lock around zeEventPoolCreate, zeEventCreate,
 * zeEventDestroy and the zeEventQueryStatus of a retired slot. */
#include "internal.h"
#include "platform/dl.h"
#include "platform/prim.h"

#include <hetmem/providers/level_zero.h>
#include <level_zero/ze_api.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- entry points ---- */

#define ZE_FN(name) __typeof__(name) *name
static struct {
    ZE_FN(zeInit);
    ZE_FN(zeDriverGet);
    ZE_FN(zeDriverGetProperties);
    ZE_FN(zeDeviceGet);
    ZE_FN(zeDeviceGetProperties);
    ZE_FN(zeDeviceGetCommandQueueGroupProperties);
    ZE_FN(zeDeviceCanAccessPeer);
    ZE_FN(zeContextCreate);
    ZE_FN(zeContextDestroy);
    ZE_FN(zeContextMakeMemoryResident);
    ZE_FN(zeMemAllocDevice);
    ZE_FN(zeMemAllocHost);
    ZE_FN(zeMemAllocShared);
    ZE_FN(zeMemFree);
    ZE_FN(zeMemGetAllocProperties);
    ZE_FN(zeMemGetAddressRange);
    ZE_FN(zeMemGetIpcHandle);
    ZE_FN(zeMemOpenIpcHandle);
    ZE_FN(zeMemCloseIpcHandle);
    ZE_FN(zeCommandListCreateImmediate);
    ZE_FN(zeCommandListDestroy);
    ZE_FN(zeCommandListAppendMemoryFill);
    ZE_FN(zeCommandListAppendMemoryCopy);
    ZE_FN(zeCommandListAppendSignalEvent);
    ZE_FN(zeEventPoolCreate);
    ZE_FN(zeEventPoolDestroy);
    ZE_FN(zeEventCreate);
    ZE_FN(zeEventDestroy);
    ZE_FN(zeEventHostReset);
    ZE_FN(zeEventQueryStatus);
    ZE_FN(zeEventHostSynchronize);
    /* optional */
    ZE_FN(zeMemFreeExt);
    /* newer than Debian's 1.8 headers: declared here, by the spec's signatures */
    ze_result_t (*zeCommandListHostSynchronize)(ze_command_list_handle_t, uint64_t);
    ze_result_t (*zeMemPutIpcHandle)(ze_context_handle_t, ze_ipc_mem_handle_t);
    ze_result_t (*zeInitDrivers)(uint32_t *, ze_driver_handle_t *, void *);
} ze;

#define REQ(n) HM_DL_REQUIRED(#n, &ze.n)
#define OPT(n) HM_DL_OPTIONAL(#n, &ze.n)
static const hm_dl_sym_t ze_syms[] = {
    REQ(zeInit), REQ(zeDriverGet), REQ(zeDriverGetProperties), REQ(zeDeviceGet),
    REQ(zeDeviceGetProperties), REQ(zeDeviceGetCommandQueueGroupProperties),
    REQ(zeDeviceCanAccessPeer), REQ(zeContextCreate), REQ(zeContextDestroy),
    REQ(zeContextMakeMemoryResident), REQ(zeMemAllocDevice), REQ(zeMemAllocHost),
    REQ(zeMemAllocShared), REQ(zeMemFree), REQ(zeMemGetAllocProperties),
    REQ(zeMemGetAddressRange), REQ(zeMemGetIpcHandle), REQ(zeMemOpenIpcHandle),
    REQ(zeMemCloseIpcHandle), REQ(zeCommandListCreateImmediate), REQ(zeCommandListDestroy),
    REQ(zeCommandListAppendMemoryFill), REQ(zeCommandListAppendMemoryCopy),
    REQ(zeCommandListAppendSignalEvent), REQ(zeEventPoolCreate), REQ(zeEventPoolDestroy),
    REQ(zeEventCreate), REQ(zeEventDestroy), REQ(zeEventHostReset), REQ(zeEventQueryStatus),
    REQ(zeEventHostSynchronize), OPT(zeMemFreeExt), OPT(zeCommandListHostSynchronize), OPT(zeMemPutIpcHandle),
    OPT(zeInitDrivers),
};

static pthread_once_t ze_once = PTHREAD_ONCE_INIT;
static hm_result_t ze_loaded = HM_ERROR_NOT_SUPPORTED;
static unsigned ze_epoch;          /* hm__prim_fork_epoch() when the loader was opened */
static _Atomic bool ze_exiting;    /* exit() has begun */
static _Atomic unsigned ze_refused; /* the fork epoch + 1 whose refusal was logged */

static void ze_at_exit(void) { atomic_store(&ze_exiting, true); }

/* The driver may not be called here (the file's comment: fork child, exit). */
static inline bool ze_gone(void) {
    return hm_unlikely(hm__prim_fork_epoch() != ze_epoch ||
                       atomic_load_explicit(&ze_exiting, memory_order_relaxed));
}

/* The answer of an op that needs the driver where it cannot be called;
 * logged once per process (a fork child logs its own). */
static HM_NOINLINE hm_result_t ze_refuse(const char *op) {
    unsigned e = hm__prim_fork_epoch() + 1;
    if (atomic_exchange(&ze_refused, e) != e)
        HM_LOG_ERROR("Level Zero provider: %s %s: the driver cannot be called there (%s)", op,
                     hm__prim_fork_epoch() != ze_epoch ? "in a fork child" : "during exit",
                     hm__prim_fork_epoch() != ze_epoch
                         ? "Level Zero does not work after fork(); start a new process"
                         : "the loader tears down at exit");
    return HM_ERROR_NOT_SUPPORTED;
}

static void ze_load(void) {
    hm_dl_lib_t *lib;
    size_t missing = 0;
    hm_result_t r = hm__dl_load("libze_loader.so.1", "HM_LEVEL_ZERO_LOADER", "Level Zero loader",
                                ze_syms, sizeof(ze_syms) / sizeof(ze_syms[0]), &lib, &missing);
    if (r != HM_SUCCESS) return;
    /* zeInit is idempotent and thread-safe; the program may have called it
     * already, or call it later: both are fine. */
    ze_result_t zr = ze.zeInit(ZE_INIT_FLAG_GPU_ONLY);
    if (zr != ZE_RESULT_SUCCESS) {
        HM_LOG_INFO("Level Zero: zeInit failed (0x%x): no GPU driver", (unsigned)zr);
        return;
    }
    /* Registered after the loader's exit-time handlers (made while it
     * loaded): runs before them. */
    if (atexit(ze_at_exit) != 0) {
        HM_LOG_ERROR("Level Zero: atexit failed: no provider");
        return;
    }
    ze_epoch = hm__prim_fork_epoch();
    ze_loaded = HM_SUCCESS;
}

/* A driver's answer as a result: logged, recorded as the native error. */
static hm_result_t ze_fail(ze_result_t zr, const char *call) {
    hm_result_t r = hm__driver_error((int64_t)zr, "Level Zero %s failed (ze_result_t 0x%x)", call,
                                     (unsigned)zr);
    switch (zr) {
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
    case ZE_RESULT_ERROR_UNSUPPORTED_SIZE: /* more than the device's largest allocation */
        return HM_ERROR_OUT_OF_MEMORY;
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY: return HM_ERROR_OUT_OF_HOST_MEMORY;
    case ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT:
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
    case ZE_RESULT_ERROR_INVALID_SIZE: return HM_ERROR_INVALID_ARGUMENT;
    default: return r;
    }
}

/* ---- params ---- */

#define MAX_RESIDENT 64
struct hm_level_zero_params {
    ze_context_handle_t ctx;
    ze_device_handle_t dev;
    int ordinal;
    hm_level_zero_memory_type_t type;
    hm_level_zero_free_policy_t policy;
    size_t nresident;
    ze_device_handle_t resident[MAX_RESIDENT];
};

hm_result_t hm_level_zero_params_create(hm_level_zero_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_level_zero_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *params = calloc(1, sizeof(**params));
    return *params ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
}

hm_result_t hm_level_zero_params_destroy(hm_level_zero_params_t *params) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_level_zero_params_set_context(hm_level_zero_params_t *p, void *ctx, void *dev) {
    if (!p || !ctx || !dev) {
        HM_LOG_ERROR("hm_level_zero_params_set_context: %s is NULL",
                     !p ? "params" : !ctx ? "the context" : "the device");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->ctx = ctx;
    p->dev = dev;
    p->ordinal = 0;
    return HM_SUCCESS;
}

hm_result_t hm_level_zero_params_set_ordinal(hm_level_zero_params_t *p, int ordinal) {
    if (!p || ordinal < 0) {
        HM_LOG_ERROR("hm_level_zero_params_set_ordinal: %s", !p ? "params is NULL"
                                                                : "a negative ordinal");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->ctx = NULL;
    p->dev = NULL;
    p->ordinal = ordinal;
    return HM_SUCCESS;
}

hm_result_t hm_level_zero_params_set_memory_type(hm_level_zero_params_t *p,
                                                 hm_level_zero_memory_type_t type) {
    if (!p || (unsigned)type > HM_LEVEL_ZERO_MEMORY_SHARED) {
        HM_LOG_ERROR("hm_level_zero_params_set_memory_type: %s",
                     !p ? "params is NULL" : "not a memory type");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->type = type;
    return HM_SUCCESS;
}

hm_result_t hm_level_zero_params_set_resident_devices(hm_level_zero_params_t *p,
                                                      void *const *devices, size_t n) {
    if (!p || (n && !devices) || n > MAX_RESIDENT) {
        HM_LOG_ERROR("hm_level_zero_params_set_resident_devices: %s",
                     !p ? "params is NULL" : n > MAX_RESIDENT ? "more than 64 devices"
                                                              : "devices is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < n; i++)
        if (!devices[i]) {
            HM_LOG_ERROR("hm_level_zero_params_set_resident_devices: device %zu is NULL", i);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    for (size_t i = 0; i < n; i++) p->resident[i] = devices[i];
    p->nresident = n;
    return HM_SUCCESS;
}

hm_result_t hm_level_zero_params_set_free_policy(hm_level_zero_params_t *p,
                                                 hm_level_zero_free_policy_t policy) {
    if (!p || (unsigned)policy > HM_LEVEL_ZERO_FREE_DEFER) {
        HM_LOG_ERROR("hm_level_zero_params_set_free_policy: %s",
                     !p ? "params is NULL" : "not a free policy");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    p->policy = policy;
    return HM_SUCCESS;
}

/* ---- contexts hetmem creates (one per driver, for ordinal providers) ---- */

typedef struct owned_ctx {
    ze_driver_handle_t driver;
    ze_context_handle_t ctx;
    int users;
    struct owned_ctx *next;
} owned_ctx_t;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static owned_ctx_t *owned;

static hm_result_t ctx_get(ze_driver_handle_t driver, ze_context_handle_t *out) {
    hm__mutex_lock(&ctx_lock);
    owned_ctx_t *o = owned;
    while (o && o->driver != driver) o = o->next;
    hm_result_t r = HM_SUCCESS;
    if (!o) {
        o = calloc(1, sizeof(*o));
        if (!o) {
            r = HM_ERROR_OUT_OF_HOST_MEMORY;
        } else {
            ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
            ze_result_t zr = ze.zeContextCreate(driver, &cd, &o->ctx);
            if (zr != ZE_RESULT_SUCCESS) {
                r = ze_fail(zr, "zeContextCreate");
                free(o);
                o = NULL;
            } else {
                o->driver = driver;
                o->next = owned;
                owned = o;
            }
        }
    }
    if (o) {
        o->users++;
        *out = o->ctx;
    }
    hm__mutex_unlock(&ctx_lock);
    return r;
}

static void ctx_put(ze_context_handle_t ctx) {
    hm__mutex_lock(&ctx_lock);
    owned_ctx_t **pp = &owned;
    while (*pp && (*pp)->ctx != ctx) pp = &(*pp)->next;
    owned_ctx_t *o = *pp;
    bool last = o && --o->users == 0;
    if (last) *pp = o->next;
    hm__mutex_unlock(&ctx_lock);
    if (last) {
        ze_result_t zr = ze.zeContextDestroy(o->ctx);
        if (zr != ZE_RESULT_SUCCESS) (void)ze_fail(zr, "zeContextDestroy");
        free(o);
    }
}

/* ---- the provider ---- */

typedef struct lz {
    ze_driver_handle_t driver;
    ze_context_handle_t ctx;
    ze_device_handle_t dev;
    bool own_ctx;
    hm_level_zero_memory_type_t type;
    hm_level_zero_free_policy_t policy;
    size_t nresident;
    ze_device_handle_t resident[MAX_RESIDENT];
    int32_t ordinal;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    size_t page;
    uint64_t max_alloc; /* the device's maxMemAllocSize: larger needs the relaxed limit */
    pthread_mutex_t cl_lock;
    ze_command_list_handle_t cl; /* NULL until the first fill or copy */
    pthread_mutex_t ev_lock;
    struct lz_evpool *evpools;   /* every event pool, newest first */
    struct lz_slot *free_slots;  /* slots with no driver event */
    struct lz_slot *retired;     /* events whose signal may still be queued */
} lz_t;

/* The IPC payload: the driver's handle (its first 8 bytes the exporter's
 * descriptor number), the exporting device's UUID, and the driver's id of
 * the allocation (so that a handle of a newer allocation at a reused
 * address never matches an opened mapping of an older one). */
#define LZ_MAGIC 0x687a6531u /* "hze1" */
typedef struct lz_payload {
    uint32_t magic;
    uint32_t type;
    uint8_t uuid[HM_DEVICE_UUID_SIZE];
    uint64_t driver_id;
    uint64_t size;
    ze_ipc_mem_handle_t h;
} lz_payload_t;

/* The ordinal-th GPU device over every driver. */
static hm_result_t find_device(int ordinal, ze_driver_handle_t *drv, ze_device_handle_t *dev) {
    uint32_t nd = 0;
    ze_result_t zr = ze.zeDriverGet(&nd, NULL);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeDriverGet");
    ze_driver_handle_t drivers[16];
    if (nd > 16) nd = 16;
    if ((zr = ze.zeDriverGet(&nd, drivers)) != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeDriverGet");
    int seen = 0;
    for (uint32_t i = 0; i < nd; i++) {
        uint32_t n = 0;
        if (ze.zeDeviceGet(drivers[i], &n, NULL) != ZE_RESULT_SUCCESS || !n) continue;
        ze_device_handle_t devs[64];
        if (n > 64) n = 64;
        if (ze.zeDeviceGet(drivers[i], &n, devs) != ZE_RESULT_SUCCESS) continue;
        for (uint32_t k = 0; k < n; k++) {
            ze_device_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
            if (ze.zeDeviceGetProperties(devs[k], &dp) != ZE_RESULT_SUCCESS ||
                dp.type != ZE_DEVICE_TYPE_GPU)
                continue;
            if (seen++ == ordinal) {
                *drv = drivers[i];
                *dev = devs[k];
                return HM_SUCCESS;
            }
        }
    }
    HM_LOG_ERROR("Level Zero: no GPU device of ordinal %d (%d found)", ordinal, seen);
    return HM_ERROR_INVALID_ARGUMENT;
}

/* The driver of the caller's device, and the device's ordinal within it
 * (-1 when it is in none: a handle of another driver, or not a device). */
static hm_result_t driver_of(ze_device_handle_t dev, ze_driver_handle_t *drv, int32_t *ordinal) {
    uint32_t nd = 0;
    ze_driver_handle_t drivers[16];
    if (ze.zeDriverGet(&nd, NULL) != ZE_RESULT_SUCCESS) nd = 0;
    if (nd > 16) nd = 16;
    if (nd && ze.zeDriverGet(&nd, drivers) != ZE_RESULT_SUCCESS) nd = 0;
    int seen = 0;
    for (uint32_t i = 0; i < nd; i++) {
        uint32_t n = 0;
        ze_device_handle_t devs[64];
        if (ze.zeDeviceGet(drivers[i], &n, NULL) != ZE_RESULT_SUCCESS) continue;
        if (n > 64) n = 64;
        if (ze.zeDeviceGet(drivers[i], &n, devs) != ZE_RESULT_SUCCESS) continue;
        for (uint32_t k = 0; k < n; k++, seen++)
            if (devs[k] == dev) {
                *drv = drivers[i];
                *ordinal = seen;
                return HM_SUCCESS;
            }
    }
    HM_LOG_ERROR("Level Zero: %p is not a device of any driver", (void *)dev);
    return HM_ERROR_INVALID_ARGUMENT;
}

/* The driver's page size for this provider's memory: that of a probe
 * allocation. Also proves the context and device work together. */
static hm_result_t alloc_raw(lz_t *z, size_t size, size_t align, void **ptr);
static hm_result_t probe_page(lz_t *z) {
    void *p = NULL;
    hm_result_t r = alloc_raw(z, 1, 0, &p);
    if (r != HM_SUCCESS) return r;
    ze_memory_allocation_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t d = NULL;
    ze_result_t zr = ze.zeMemGetAllocProperties(z->ctx, p, &mp, &d);
    (void)ze.zeMemFree(z->ctx, p);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeMemGetAllocProperties");
    size_t page = mp.pageSize;
    if (!page || (page & (page - 1))) page = (size_t)hm__prim_page_size();
    z->page = page;
    return HM_SUCCESS;
}

static hm_result_t lz_init(const void *params, void **state) {
    static const hm_level_zero_params_t defaults = {0};
    const hm_level_zero_params_t *p = params ? params : &defaults;
    pthread_once(&ze_once, ze_load);
    if (ze_loaded != HM_SUCCESS) {
        HM_LOG_INFO("Level Zero provider: no loader or no GPU driver");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (ze_gone()) return ze_refuse("create");
    lz_t *z = calloc(1, sizeof(*z));
    if (!z) return HM_ERROR_OUT_OF_HOST_MEMORY;
    z->type = p->type;
    z->policy = p->policy;
    z->nresident = p->nresident;
    memcpy(z->resident, p->resident, p->nresident * sizeof(p->resident[0]));
    hm_result_t r;
    if (p->ctx) {
        z->ctx = p->ctx;
        z->dev = p->dev;
        r = driver_of(p->dev, &z->driver, &z->ordinal);
        if (r != HM_SUCCESS) goto fail;
    } else {
        r = find_device(p->ordinal, &z->driver, &z->dev);
        if (r != HM_SUCCESS) goto fail;
        z->ordinal = p->ordinal;
        r = ctx_get(z->driver, &z->ctx);
        if (r != HM_SUCCESS) goto fail;
        z->own_ctx = true;
    }
    ze_device_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    ze_result_t zr = ze.zeDeviceGetProperties(z->dev, &dp);
    if (zr != ZE_RESULT_SUCCESS) {
        r = ze_fail(zr, "zeDeviceGetProperties");
        goto fail_ctx;
    }
    memcpy(z->uuid, dp.uuid.id, sizeof(z->uuid));
    z->max_alloc = dp.maxMemAllocSize ? dp.maxMemAllocSize : UINT64_MAX;
    if (z->policy != HM_LEVEL_ZERO_FREE_DEFAULT) {
        ze_driver_memory_free_ext_properties_t fp = {
            .stype = ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES};
        ze_driver_properties_t drp = {.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES, .pNext = &fp};
        ze_driver_memory_free_policy_ext_flags_t want =
            z->policy == HM_LEVEL_ZERO_FREE_BLOCKING ? ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE
                                                     : ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE;
        if (!ze.zeMemFreeExt || ze.zeDriverGetProperties(z->driver, &drp) != ZE_RESULT_SUCCESS ||
            !(fp.freePolicies & want)) {
            HM_LOG_ERROR("Level Zero provider: the driver has no %s free (zeMemFreeExt)",
                         z->policy == HM_LEVEL_ZERO_FREE_BLOCKING ? "blocking" : "deferred");
            r = HM_ERROR_NOT_SUPPORTED;
            goto fail_ctx;
        }
    }
    r = probe_page(z);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("Level Zero provider: the device does not allocate with this context "
                     "(another driver's?): %s", hm_result_string(r));
        if (r == HM_ERROR_DRIVER) r = HM_ERROR_INVALID_ARGUMENT;
        goto fail_ctx;
    }
    pthread_mutex_init(&z->cl_lock, NULL);
    pthread_mutex_init(&z->ev_lock, NULL);
    *state = z;
    return HM_SUCCESS;

fail_ctx:
    if (z->own_ctx) ctx_put(z->ctx);
fail:
    free(z);
    return r;
}

static void events_fini(lz_t *z);
static void events_forget(lz_t *z);

static void lz_fini(void *state) {
    lz_t *z = state;
    if (ze_gone()) { /* the events, command list and context go with the process */
        events_forget(z);
        pthread_mutex_destroy(&z->cl_lock);
        pthread_mutex_destroy(&z->ev_lock);
        free(z);
        return;
    }
    events_fini(z);
    if (z->cl) {
        ze_result_t zr = ze.zeCommandListDestroy(z->cl);
        if (zr != ZE_RESULT_SUCCESS) (void)ze_fail(zr, "zeCommandListDestroy");
    }
    if (z->own_ctx) ctx_put(z->ctx);
    pthread_mutex_destroy(&z->cl_lock);
    pthread_mutex_destroy(&z->ev_lock);
    free(z);
}

static void lz_get_info(void *state, hm_provider_info_t *info) {
    lz_t *z = state;
    memset(info, 0, sizeof(*info));
    info->name = z->type == HM_LEVEL_ZERO_MEMORY_DEVICE ? "level_zero(device)"
                 : z->type == HM_LEVEL_ZERO_MEMORY_HOST ? "level_zero(host)"
                                                        : "level_zero(shared)";
    info->family = HM_PROVIDER_FAMILY_LEVEL_ZERO;
    info->caps = HM_PROVIDER_CAP_FREE;
    switch (z->type) {
    case HM_LEVEL_ZERO_MEMORY_DEVICE:
        info->kind = HM_MEMORY_DEVICE;
        info->caps |= HM_PROVIDER_CAP_IPC;
        break;
    case HM_LEVEL_ZERO_MEMORY_HOST:
        info->kind = HM_MEMORY_HOST_PINNED;
        info->caps |= HM_PROVIDER_CAP_CPU_ACCESS;
        break;
    case HM_LEVEL_ZERO_MEMORY_SHARED:
        info->kind = HM_MEMORY_SHARED;
        info->caps |= HM_PROVIDER_CAP_CPU_ACCESS;
        break;
    }
    info->min_page_size = z->page;
    info->recommended_page_size = (size_t)2 << 20;
}

static void lz_get_device(void *state, hm_device_id_t *device) {
    lz_t *z = state;
    device->ordinal = z->ordinal;
    device->has_uuid = true;
    memcpy(device->uuid, z->uuid, sizeof(device->uuid));
}

/* Sizes above maxMemAllocSize (4 GiB on many Intel GPUs: compute-runtime's
 * "Allocations greater than 4GB") are refused with
 * ZE_RESULT_ERROR_UNSUPPORTED_SIZE unless the descriptor chains
 * ze_relaxed_allocation_limits_exp_desc_t with FLAG_MAX_SIZE (ze_api.h: "may
 * be passed to zeMemAllocShared or zeMemAllocDevice, via pNext of
 * ze_device_mem_alloc_desc_t ... also to zeMemAllocHost"). Only such sizes
 * carry it: the memory behind them is the same, but kernels that address
 * it need the >4 GiB build flag, which is the program's concern. */
static hm_result_t alloc_raw(lz_t *z, size_t size, size_t align, void **ptr) {
    ze_relaxed_allocation_limits_exp_desc_t relaxed = {
        .stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC,
        .flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
    const void *ext = (uint64_t)size > z->max_alloc ? &relaxed : NULL;
    ze_device_mem_alloc_desc_t dd = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
                                     .pNext = ext};
    ze_host_mem_alloc_desc_t hd = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC,
                                   .pNext = z->type == HM_LEVEL_ZERO_MEMORY_HOST ? ext : NULL};
    ze_result_t zr;
    const char *call;
    switch (z->type) {
    case HM_LEVEL_ZERO_MEMORY_DEVICE:
        call = "zeMemAllocDevice";
        zr = ze.zeMemAllocDevice(z->ctx, &dd, size, align, z->dev, ptr);
        break;
    case HM_LEVEL_ZERO_MEMORY_HOST:
        call = "zeMemAllocHost";
        zr = ze.zeMemAllocHost(z->ctx, &hd, size, align, ptr);
        break;
    default:
        call = "zeMemAllocShared";
        zr = ze.zeMemAllocShared(z->ctx, &dd, &hd, size, align, z->dev, ptr);
        break;
    }
    if (zr != ZE_RESULT_SUCCESS) {
        *ptr = NULL;
        return ze_fail(zr, call);
    }
    return HM_SUCCESS;
}

static hm_result_t free_raw(lz_t *z, void *ptr) {
    ze_result_t zr;
    if (z->policy == HM_LEVEL_ZERO_FREE_DEFAULT) {
        zr = ze.zeMemFree(z->ctx, ptr);
    } else {
        ze_memory_free_ext_desc_t fd = {
            .stype = ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC,
            .freePolicy = z->policy == HM_LEVEL_ZERO_FREE_BLOCKING
                              ? ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE
                              : ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE};
        zr = ze.zeMemFreeExt(z->ctx, &fd, ptr);
    }
    return zr == ZE_RESULT_SUCCESS ? HM_SUCCESS : ze_fail(zr, "zeMemFree");
}

static hm_result_t lz_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    lz_t *z = state;
    if (ze_gone()) {
        *ptr = NULL;
        return ze_refuse("allocation");
    }
    hm_result_t r = alloc_raw(z, size, alignment, ptr);
    if (r != HM_SUCCESS) return r;
    if (z->type != HM_LEVEL_ZERO_MEMORY_HOST) {
        for (size_t i = 0; i < z->nresident; i++) {
            ze_result_t zr = ze.zeContextMakeMemoryResident(z->ctx, z->resident[i], *ptr, size);
            if (zr != ZE_RESULT_SUCCESS) {
                r = ze_fail(zr, "zeContextMakeMemoryResident");
                (void)free_raw(z, *ptr);
                *ptr = NULL;
                return r;
            }
        }
    }
    return HM_SUCCESS;
}

static hm_result_t lz_free(void *state, void *ptr, size_t size) {
    (void)size;
    if (ze_gone()) return HM_SUCCESS; /* the parent's memory, or the process ends */
    return free_raw(state, ptr);
}

/* ---- fill and copy: one synchronous immediate command list ---- */

/* The command list, made at the first use (cl_lock held). */
static hm_result_t cl_get(lz_t *z) {
    if (z->cl) return HM_SUCCESS;
    uint32_t n = 0;
    ze_result_t zr = ze.zeDeviceGetCommandQueueGroupProperties(z->dev, &n, NULL);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeDeviceGetCommandQueueGroupProperties");
    ze_command_queue_group_properties_t gp[16];
    if (n > 16) n = 16;
    for (uint32_t i = 0; i < n; i++)
        gp[i] = (ze_command_queue_group_properties_t){
            .stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES};
    if (n && (zr = ze.zeDeviceGetCommandQueueGroupProperties(z->dev, &n, gp)) != ZE_RESULT_SUCCESS)
        return ze_fail(zr, "zeDeviceGetCommandQueueGroupProperties");
    /* A copy engine where there is one, else a compute group (it copies too). */
    uint32_t ord = UINT32_MAX;
    for (uint32_t i = 0; i < n && ord == UINT32_MAX; i++)
        if ((gp[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) &&
            !(gp[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE))
            ord = i;
    for (uint32_t i = 0; i < n && ord == UINT32_MAX; i++)
        if (gp[i].flags & (ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE |
                           ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY))
            ord = i;
    if (ord == UINT32_MAX) ord = 0;
    ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                  .ordinal = ord,
                                  .index = 0,
                                  .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS,
                                  .priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    zr = ze.zeCommandListCreateImmediate(z->ctx, z->dev, &qd, &z->cl);
    if (zr != ZE_RESULT_SUCCESS) {
        z->cl = NULL;
        return ze_fail(zr, "zeCommandListCreateImmediate");
    }
    return HM_SUCCESS;
}

/* Wait for the list's work where the loader can (the list is synchronous:
 * its appends return when done; this is the belt to those braces). */
static hm_result_t cl_sync(lz_t *z) {
    if (!ze.zeCommandListHostSynchronize) return HM_SUCCESS;
    ze_result_t zr = ze.zeCommandListHostSynchronize(z->cl, UINT64_MAX);
    return zr == ZE_RESULT_SUCCESS || zr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
               ? HM_SUCCESS
               : ze_fail(zr, "zeCommandListHostSynchronize");
}

static hm_result_t lz_fill(void *state, void *ptr, uint8_t value, size_t size) {
    lz_t *z = state;
    if (ze_gone()) return ze_refuse("fill");
    hm__mutex_lock(&z->cl_lock);
    hm_result_t r = cl_get(z);
    if (r == HM_SUCCESS) {
        ze_result_t zr =
            ze.zeCommandListAppendMemoryFill(z->cl, ptr, &value, 1, size, NULL, 0, NULL);
        r = zr == ZE_RESULT_SUCCESS ? cl_sync(z) : ze_fail(zr, "zeCommandListAppendMemoryFill");
    }
    hm__mutex_unlock(&z->cl_lock);
    return r;
}

static hm_result_t lz_copy(void *state, void *dst, const void *src, size_t size) {
    lz_t *z = state;
    if (ze_gone()) return ze_refuse("copy");
    hm__mutex_lock(&z->cl_lock);
    hm_result_t r = cl_get(z);
    if (r == HM_SUCCESS) {
        ze_result_t zr = ze.zeCommandListAppendMemoryCopy(z->cl, dst, src, size, NULL, 0, NULL);
        r = zr == ZE_RESULT_SUCCESS ? cl_sync(z) : ze_fail(zr, "zeCommandListAppendMemoryCopy");
    }
    hm__mutex_unlock(&z->cl_lock);
    return r;
}

/* ---- streams and events (provider.h's stream ops) ----
 * A stream is the program's immediate command list on this provider's
 * context and device. Events are driver events from host-visible pools the
 * provider creates as needed on its context (LZ_POOL_EVENTS each, kept
 * until fini), with signal and wait scope HOST. Each pool's events are
 * slots: a slot holds a driver event or is free.
 *
 * The front end's event (lz_event_t) names one slot at a time. A record
 * appends a signal of the slot's event to the stream
 * (zeCommandListAppendSignalEvent), so the event completes after the work
 * appended before it. Re-recording: an event that completed is reset on the
 * host (zeEventHostReset) and reused; one whose earlier signal is still
 * queued takes a new slot (a reset now would be undone by that signal), and
 * the old slot is retired. Destroying an event whose signal may still be
 * queued retires its slot too: the spec forbids destroying an event the
 * device still references (ze_api.h, zeEventDestroy), so a retired slot's
 * event is destroyed once zeEventQueryStatus says it completed (checked at
 * each event create and destroy), or at fini after zeEventHostSynchronize.
 * An event never recorded is complete (query and sync answer at once).
 *
 * Invariants (ev_lock): a slot is on exactly one of free_slots (ev NULL),
 * retired (ev set), or named by one live lz_event_t (ev set); pools are
 * destroyed only at fini, after every slot's event. */

#define LZ_POOL_EVENTS 64

typedef struct lz_slot {
    ze_event_handle_t ev;
    struct lz_evpool *pool;
    uint32_t index;
    struct lz_slot *next; /* on free_slots or retired */
} lz_slot_t;

typedef struct lz_evpool {
    ze_event_pool_handle_t h;
    struct lz_evpool *next;
    lz_slot_t slots[LZ_POOL_EVENTS];
} lz_evpool_t;

typedef struct lz_event {
    lz_slot_t *slot;
    bool recorded; /* a signal was appended (and the event not destroyed) */
} lz_event_t;

/* The slot's event back to the driver and the slot to the free list
 * (ev_lock held). A slot whose event the driver would not destroy stays
 * out of use: its index is still taken in the pool. */
static void slot_free(lz_t *z, lz_slot_t *s) {
    ze_result_t zr = ze.zeEventDestroy(s->ev);
    if (zr != ZE_RESULT_SUCCESS) {
        (void)ze_fail(zr, "zeEventDestroy");
        return;
    }
    s->ev = NULL;
    s->next = z->free_slots;
    z->free_slots = s;
}

/* Destroys the retired events that have completed (ev_lock held). */
static void slots_reap(lz_t *z) {
    for (lz_slot_t **pp = &z->retired; *pp;) {
        lz_slot_t *s = *pp;
        ze_result_t zr = ze.zeEventQueryStatus(s->ev);
        if (zr == ZE_RESULT_NOT_READY) {
            pp = &s->next;
            continue;
        }
        if (zr != ZE_RESULT_SUCCESS) (void)ze_fail(zr, "zeEventQueryStatus");
        *pp = s->next;
        slot_free(z, s); /* a failed query: its signal may be queued, but
                            there is no other way to learn more */
    }
}

/* A slot with a new driver event (ev_lock held). */
static hm_result_t slot_new(lz_t *z, lz_slot_t **out) {
    slots_reap(z);
    if (!z->free_slots) {
        lz_evpool_t *p = calloc(1, sizeof(*p));
        if (!p) return HM_ERROR_OUT_OF_HOST_MEMORY;
        ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                                   .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                                   .count = LZ_POOL_EVENTS};
        ze_device_handle_t dev = z->dev;
        ze_result_t zr = ze.zeEventPoolCreate(z->ctx, &pd, 1, &dev, &p->h);
        if (zr != ZE_RESULT_SUCCESS) {
            free(p);
            return ze_fail(zr, "zeEventPoolCreate");
        }
        for (uint32_t i = LZ_POOL_EVENTS; i-- > 0;) {
            p->slots[i] = (lz_slot_t){.pool = p, .index = i, .next = z->free_slots};
            z->free_slots = &p->slots[i];
        }
        p->next = z->evpools;
        z->evpools = p;
    }
    lz_slot_t *s = z->free_slots;
    ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                          .index = s->index,
                          .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                          .wait = ZE_EVENT_SCOPE_FLAG_HOST};
    ze_result_t zr = ze.zeEventCreate(s->pool->h, &ed, &s->ev);
    if (zr != ZE_RESULT_SUCCESS) {
        s->ev = NULL;
        return ze_fail(zr, "zeEventCreate");
    }
    z->free_slots = s->next;
    s->next = NULL;
    *out = s;
    return HM_SUCCESS;
}

/* A slot whose event's signal may still be queued (ev_lock held). */
static void slot_retire(lz_t *z, lz_slot_t *s) {
    s->next = z->retired;
    z->retired = s;
}

static hm_result_t lz_event_create(void *state, void **event) {
    lz_t *z = state;
    if (ze_gone()) return ze_refuse("event create");
    lz_event_t *e = calloc(1, sizeof(*e));
    if (!e) return HM_ERROR_OUT_OF_HOST_MEMORY;
    hm__mutex_lock(&z->ev_lock);
    hm_result_t r = slot_new(z, &e->slot);
    hm__mutex_unlock(&z->ev_lock);
    if (r != HM_SUCCESS) {
        free(e);
        return r;
    }
    *event = e;
    return HM_SUCCESS;
}

static hm_result_t lz_event_record(void *state, void *event, void *stream) {
    lz_t *z = state;
    lz_event_t *e = event;
    if (ze_gone()) return ze_refuse("event record");
    if (!stream) {
        HM_LOG_ERROR("Level Zero provider: a stream is an immediate command list (NULL given)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (e->recorded) {
        ze_result_t zr = ze.zeEventQueryStatus(e->slot->ev);
        if (zr == ZE_RESULT_SUCCESS) {
            if ((zr = ze.zeEventHostReset(e->slot->ev)) != ZE_RESULT_SUCCESS)
                return ze_fail(zr, "zeEventHostReset");
        } else if (zr == ZE_RESULT_NOT_READY) {
            lz_slot_t *s;
            hm__mutex_lock(&z->ev_lock);
            hm_result_t r = slot_new(z, &s);
            if (r == HM_SUCCESS) {
                slot_retire(z, e->slot);
                e->slot = s;
            }
            hm__mutex_unlock(&z->ev_lock);
            if (r != HM_SUCCESS) return r;
        } else {
            return ze_fail(zr, "zeEventQueryStatus");
        }
        e->recorded = false;
    }
    ze_result_t zr = ze.zeCommandListAppendSignalEvent((ze_command_list_handle_t)stream,
                                                       e->slot->ev);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeCommandListAppendSignalEvent");
    e->recorded = true;
    return HM_SUCCESS;
}

static hm_result_t lz_event_query(void *state, void *event) {
    lz_event_t *e = event;
    (void)state;
    if (ze_gone()) return ze_refuse("event query");
    if (!e->recorded) return HM_SUCCESS;
    ze_result_t zr = ze.zeEventQueryStatus(e->slot->ev);
    return zr == ZE_RESULT_SUCCESS     ? HM_SUCCESS
           : zr == ZE_RESULT_NOT_READY ? HM_ERROR_BUSY
                                       : ze_fail(zr, "zeEventQueryStatus");
}

static hm_result_t lz_event_sync(void *state, void *event) {
    lz_event_t *e = event;
    (void)state;
    if (ze_gone()) return ze_refuse("event sync");
    if (!e->recorded) return HM_SUCCESS;
    ze_result_t zr = ze.zeEventHostSynchronize(e->slot->ev, UINT64_MAX);
    return zr == ZE_RESULT_SUCCESS ? HM_SUCCESS : ze_fail(zr, "zeEventHostSynchronize");
}

static void lz_event_destroy(void *state, void *event) {
    lz_t *z = state;
    lz_event_t *e = event;
    if (!ze_gone()) {
        hm__mutex_lock(&z->ev_lock);
        if (e->recorded)
            slot_retire(z, e->slot);
        else
            slot_free(z, e->slot);
        slots_reap(z);
        hm__mutex_unlock(&z->ev_lock);
    }
    free(e);
}

/* Fini: every event the driver still has (retired ones once complete, and
 * those of lz_event_t the front end did not destroy), then the pools. */
static void events_fini(lz_t *z) {
    for (lz_slot_t *s = z->retired, *next; s; s = next) {
        next = s->next;
        ze_result_t zr = ze.zeEventHostSynchronize(s->ev, UINT64_MAX);
        if (zr != ZE_RESULT_SUCCESS) (void)ze_fail(zr, "zeEventHostSynchronize");
        slot_free(z, s);
    }
    z->retired = NULL;
    for (lz_evpool_t *p = z->evpools, *next; p; p = next) {
        next = p->next;
        bool busy = false;
        for (uint32_t i = 0; i < LZ_POOL_EVENTS; i++) {
            lz_slot_t *s = &p->slots[i];
            if (!s->ev) continue;
            ze_result_t zr = ze.zeEventDestroy(s->ev);
            if (zr != ZE_RESULT_SUCCESS) {
                (void)ze_fail(zr, "zeEventDestroy");
                busy = true;
            }
        }
        if (!busy) {
            ze_result_t zr = ze.zeEventPoolDestroy(p->h);
            if (zr != ZE_RESULT_SUCCESS) (void)ze_fail(zr, "zeEventPoolDestroy");
        }
        free(p);
    }
    z->evpools = NULL;
    z->free_slots = NULL;
}

/* In a fork child or at exit: the host side only. */
static void events_forget(lz_t *z) {
    for (lz_evpool_t *p = z->evpools, *next; p; p = next) {
        next = p->next;
        free(p);
    }
}

/* ---- IPC ---- */

static size_t lz_ipc_handle_size(void *state) {
    (void)state;
    return sizeof(lz_payload_t);
}

static hm_result_t lz_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    lz_t *z = state;
    if (ze_gone()) return ze_refuse("IPC export");
    if (z->type != HM_LEVEL_ZERO_MEMORY_DEVICE) {
        HM_LOG_ERROR("Level Zero provider: no IPC of %s memory",
                     z->type == HM_LEVEL_ZERO_MEMORY_HOST ? "host" : "shared");
        return HM_ERROR_NOT_SUPPORTED;
    }
    lz_payload_t pl = {.magic = LZ_MAGIC, .type = (uint32_t)z->type, .size = size};
    memcpy(pl.uuid, z->uuid, sizeof(pl.uuid));
    ze_memory_allocation_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t d = NULL;
    ze_result_t zr = ze.zeMemGetAllocProperties(z->ctx, ptr, &mp, &d);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeMemGetAllocProperties");
    pl.driver_id = mp.id;
    zr = ze.zeMemGetIpcHandle(z->ctx, ptr, &pl.h);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeMemGetIpcHandle");
    int64_t f;
    memcpy(&f, pl.h.data, sizeof(f));
    if (f < 0 || f > INT32_MAX) {
        HM_LOG_ERROR("Level Zero: zeMemGetIpcHandle gave no descriptor (%lld)", (long long)f);
        if (ze.zeMemPutIpcHandle) (void)ze.zeMemPutIpcHandle(z->ctx, pl.h);
        return HM_ERROR_DRIVER;
    }
    *fd = (int)f;
    memcpy(payload, &pl, sizeof(pl));
    return HM_SUCCESS;
}

static hm_result_t lz_ipc_put(void *state, void *payload) {
    lz_t *z = state;
    if (ze_gone()) return HM_SUCCESS;
    if (!ze.zeMemPutIpcHandle) return HM_SUCCESS; /* loaders before 1.10: nothing to release */
    lz_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    ze_result_t zr = ze.zeMemPutIpcHandle(z->ctx, pl.h);
    return zr == ZE_RESULT_SUCCESS || zr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
               ? HM_SUCCESS
               : ze_fail(zr, "zeMemPutIpcHandle");
}

static hm_result_t lz_ipc_compatible(void *state, const void *payload) {
    lz_t *z = state;
    if (ze_gone()) return ze_refuse("IPC open");
    lz_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != LZ_MAGIC || pl.type != HM_LEVEL_ZERO_MEMORY_DEVICE) return HM_ERROR_INVALID_HANDLE;
    if (memcmp(pl.uuid, z->uuid, sizeof(pl.uuid)) == 0) return HM_SUCCESS;
    /* Another device: one of this driver's that ours can access as a peer. */
    uint32_t n = 0;
    ze_device_handle_t devs[64];
    if (ze.zeDeviceGet(z->driver, &n, NULL) == ZE_RESULT_SUCCESS) {
        if (n > 64) n = 64;
        if (ze.zeDeviceGet(z->driver, &n, devs) != ZE_RESULT_SUCCESS) n = 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        ze_device_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
        if (ze.zeDeviceGetProperties(devs[i], &dp) != ZE_RESULT_SUCCESS ||
            memcmp(dp.uuid.id, pl.uuid, sizeof(pl.uuid)) != 0)
            continue;
        ze_bool_t can = 0;
        if (ze.zeDeviceCanAccessPeer(z->dev, devs[i], &can) == ZE_RESULT_SUCCESS && can)
            return HM_SUCCESS;
        break;
    }
    HM_LOG_ERROR("Level Zero provider (device %d): cannot open memory of another device that it "
                 "has no peer access to", (int)z->ordinal);
    return HM_ERROR_NOT_SUPPORTED;
}

/* The payload is the peer's: its size is checked before use, and after the
 * driver's open the mapping must hold all of it ([ptr, ptr + size) within
 * the allocation the driver mapped, as zeMemGetAddressRange reports it).
 * Otherwise the tracker would record more than is mapped, and a fill or
 * copy there would run past it. */
static hm_result_t lz_ipc_open(void *state, const void *payload, int fd, size_t size,
                               void **ptr) {
    lz_t *z = state;
    *ptr = NULL;
    if (ze_gone()) return ze_refuse("IPC open");
    lz_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != LZ_MAGIC || pl.type != HM_LEVEL_ZERO_MEMORY_DEVICE || !size ||
        pl.size != size || fd < 0) {
        HM_LOG_ERROR("Level Zero provider: malformed IPC payload (type %u, size %llu, handle "
                     "size %zu, descriptor %d)", pl.type, (unsigned long long)pl.size, size, fd);
        return HM_ERROR_INVALID_HANDLE;
    }
    /* The device (its UUID), as the IPC layer checked it before: open must
     * refuse on its own what it cannot map. */
    hm_result_t r = lz_ipc_compatible(state, payload);
    if (r != HM_SUCCESS) return r;
    /* The importer's copy of the descriptor replaces the exporter's number. */
    int64_t f = fd;
    memcpy(pl.h.data, &f, sizeof(f));
    void *p = NULL;
    ze_result_t zr = ze.zeMemOpenIpcHandle(z->ctx, z->dev, pl.h, 0, &p);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeMemOpenIpcHandle");
    void *base = NULL;
    size_t len = 0;
    zr = ze.zeMemGetAddressRange(z->ctx, p, &base, &len);
    if (zr != ZE_RESULT_SUCCESS) {
        r = ze_fail(zr, "zeMemGetAddressRange");
    } else if (!hm_range_holds((uintptr_t)base, len, (uintptr_t)p, 0, size)) {
        HM_LOG_ERROR("Level Zero provider: the IPC handle claims %zu bytes of an allocation the "
                     "driver mapped with %zu bytes: refused", size, len);
        r = HM_ERROR_INVALID_HANDLE;
    }
    if (r != HM_SUCCESS) {
        zr = ze.zeMemCloseIpcHandle(z->ctx, p);
        if (zr != ZE_RESULT_SUCCESS) (void)ze_fail(zr, "zeMemCloseIpcHandle");
        return r;
    }
    *ptr = p;
    return HM_SUCCESS;
}

static hm_result_t lz_ipc_close(void *state, void *ptr, size_t size) {
    lz_t *z = state;
    (void)size;
    if (ze_gone()) return HM_SUCCESS;
    ze_result_t zr = ze.zeMemCloseIpcHandle(z->ctx, ptr);
    return zr == ZE_RESULT_SUCCESS ? HM_SUCCESS : ze_fail(zr, "zeMemCloseIpcHandle");
}

static uint64_t lz_ipc_context(void *state) {
    lz_t *z = state;
    return (uint64_t)(uintptr_t)z->ctx;
}

static const hm_provider_ops_t lz_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "level_zero",
    .init = lz_init,
    .fini = lz_fini,
    .get_info = lz_get_info,
    .alloc = lz_alloc,
    .free = lz_free,
    .ipc =
        {
            .handle_size = lz_ipc_handle_size,
            .get = lz_ipc_get,
            .put = lz_ipc_put,
            .open = lz_ipc_open,
            .close = lz_ipc_close,
        },
    .get_device = lz_get_device,
    .fill = lz_fill,
    .copy = lz_copy,
    .ipc_compatible = lz_ipc_compatible,
    .ipc_context = lz_ipc_context,
    .stream =
        {
            .event_create = lz_event_create,
            .event_record = lz_event_record,
            .event_query = lz_event_query,
            .event_sync = lz_event_sync,
            .event_destroy = lz_event_destroy,
        },
};

const hm_provider_ops_t *hm_level_zero_provider_ops(void) { return &lz_ops; }

hm_result_t hm_level_zero_provider_create(const hm_level_zero_params_t *params,
                                          hm_provider_t **provider) {
    return hm_provider_create(&lz_ops, params, provider);
}

hm_result_t hm_level_zero_allocation_info(hm_provider_t *provider, const void *ptr,
                                          hm_level_zero_allocation_t *info) {
    if (!provider || !ptr || !info) {
        HM_LOG_ERROR("hm_level_zero_allocation_info: %s is NULL",
                     !provider ? "provider" : !ptr ? "ptr" : "info");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    const hm_provider_ops_t *o = hm_provider_get_ops(provider);
    if (!o || o->alloc != lz_alloc) {
        HM_LOG_ERROR("hm_level_zero_allocation_info: not a Level Zero provider");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (ze_gone()) return ze_refuse("hm_level_zero_allocation_info");
    lz_t *z = hm_provider_get_state(provider);
    ze_memory_allocation_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t d = NULL;
    ze_result_t zr = ze.zeMemGetAllocProperties(z->ctx, ptr, &mp, &d);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeMemGetAllocProperties");
    if (mp.type == ZE_MEMORY_TYPE_UNKNOWN) {
        HM_LOG_ERROR("hm_level_zero_allocation_info(%p): not memory of the driver", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    void *base = NULL;
    size_t sz = 0;
    zr = ze.zeMemGetAddressRange(z->ctx, ptr, &base, &sz);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(zr, "zeMemGetAddressRange");
    info->type = mp.type == ZE_MEMORY_TYPE_DEVICE ? HM_LEVEL_ZERO_MEMORY_DEVICE
                 : mp.type == ZE_MEMORY_TYPE_HOST ? HM_LEVEL_ZERO_MEMORY_HOST
                                                  : HM_LEVEL_ZERO_MEMORY_SHARED;
    info->device = d;
    info->id = mp.id;
    info->page_size = mp.pageSize;
    info->base = base;
    info->size = sz;
    return HM_SUCCESS;
}
