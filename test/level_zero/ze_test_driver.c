/* hetmem tests — libze_test.so.1, a Level Zero driver behind the real loader.
 * What it models and the control API: ze_test_driver.h.
 * SPDX-License-Identifier: MIT
 *
 * Layout of this file: state and the entry/exit of every call (counting,
 * failure injection, the one mutex); objects and their registry; memory
 * (mappings, the allocation table, alloc/free/properties); IPC; command
 * lists, queues and events; the tables the loader asks for; the control
 * API.
 *
 * Invariants (all under g_lock):
 *  - g.allocs is sorted by base; spans [base, base + span) never overlap.
 *    An own allocation has fd >= 0 and `charged` bytes on its device or the
 *    host; an opened IPC mapping has fd == -1, charged == 0 and refs >= 1.
 *  - Every live context, queue, command list, event pool and event is on
 *    g.objs; a handle is used only after it is found there (or, for the
 *    driver and devices, in the static objects), so an unknown pointer is
 *    never read.
 *  - A context's nqueues/nlists/npools count its live objects of each kind;
 *    a pool's live counts its events, whose indices are marked in `used`.
 *  - Only an asynchronous immediate list has queued commands; every event
 *    and wait event of a queued command is live (zeEventDestroy refuses an
 *    event a queued command names), and its memory was valid at the append
 *    (it is checked again, by allocation id, when the command runs).
 */
#include "ze_test_driver.h"

#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

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
#include <time.h>
#include <unistd.h>

#include "../common/sized_memfd.h"

#define EXPORT __attribute__((visibility("default")))

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define DEVICE_PAGE (64 * KIB)
#define HOST_PAGE (4 * KIB)
#define MAX_ALIGNMENT GIB
#define MAX_FILL_PATTERN 128
#define DEFAULT_DEVICES 2
#define DEFAULT_MEM_LIMIT (256 * MIB)
#define DRIVER_VERSION 0x00010000u
#define VENDOR_ID 0x8086u
#define DEVICE_ID 0x7a54u
#define IPC_TAG 0x5a54u

#define die(...)                                                                  \
    do {                                                                          \
        fprintf(stderr, "libze_test: %s:%d: ", __FILE__, __LINE__);               \
        fprintf(stderr, __VA_ARGS__);                                             \
        fprintf(stderr, "\n");                                                    \
        abort();                                                                  \
    } while (0)

/* ---- the entry points the driver implements, by API name ---- */

#define ZT_APIS(X)                                                               \
    X(zeInit)                                                                    \
    X(zeDriverGet) X(zeDriverGetApiVersion) X(zeDriverGetProperties)             \
    X(zeDriverGetIpcProperties) X(zeDriverGetExtensionProperties)                \
    X(zeDriverGetExtensionFunctionAddress)                                       \
    X(zeDeviceGet) X(zeDeviceGetSubDevices) X(zeDeviceGetProperties)             \
    X(zeDeviceGetCommandQueueGroupProperties) X(zeDeviceGetMemoryProperties)     \
    X(zeDeviceGetMemoryAccessProperties) X(zeDeviceGetP2PProperties)             \
    X(zeDeviceCanAccessPeer) X(zeDeviceGetStatus)                                \
    X(zeContextCreate) X(zeContextCreateEx) X(zeContextDestroy)                  \
    X(zeContextGetStatus) X(zeContextMakeMemoryResident) X(zeContextEvictMemory) \
    X(zeCommandQueueCreate) X(zeCommandQueueDestroy)                             \
    X(zeCommandQueueExecuteCommandLists) X(zeCommandQueueSynchronize)            \
    X(zeCommandListCreate) X(zeCommandListCreateImmediate)                       \
    X(zeCommandListDestroy) X(zeCommandListClose) X(zeCommandListReset)          \
    X(zeCommandListAppendBarrier) X(zeCommandListAppendMemoryCopy)               \
    X(zeCommandListAppendMemoryFill) X(zeCommandListAppendSignalEvent)           \
    X(zeCommandListAppendWaitOnEvents) X(zeCommandListAppendEventReset)          \
    X(zeEventPoolCreate) X(zeEventPoolDestroy)                                   \
    X(zeEventCreate) X(zeEventDestroy) X(zeEventHostSignal)                      \
    X(zeEventHostSynchronize) X(zeEventQueryStatus) X(zeEventHostReset)          \
    X(zeMemAllocShared) X(zeMemAllocDevice) X(zeMemAllocHost)                    \
    X(zeMemFree) X(zeMemFreeExt) X(zeMemGetAllocProperties)                      \
    X(zeMemGetAddressRange) X(zeMemGetIpcHandle) X(zeMemOpenIpcHandle)           \
    X(zeMemCloseIpcHandle)

enum api {
#define X(name) API_##name,
    ZT_APIS(X)
#undef X
    API_COUNT
};

static const char *const api_names[API_COUNT] = {
#define X(name) #name,
    ZT_APIS(X)
#undef X
};

/* ---- objects ---- */

enum kind { K_CONTEXT = 0x5a544358, K_QUEUE, K_LIST, K_POOL, K_EVENT };

/* The header of every object a create call hands out; `next` links g.objs. */
struct obj {
    enum kind kind;
    struct obj *next;
};

struct driver {
    uint32_t magic;
};

struct device {
    uint32_t magic;
    unsigned index;
    uint64_t used; /* bytes charged: device + shared allocations, rounded */
};

struct context {
    struct obj o;
    unsigned nqueues, nlists, npools;
};

struct queue {
    struct obj o;
    struct context *ctx;
    struct device *dev;
};

struct evpool {
    struct obj o;
    struct context *ctx;
    uint32_t count, live;
    bool *used; /* [count]: an event with that index exists */
};

struct event {
    struct obj o;
    struct evpool *pool;
    uint32_t index;
    bool signaled;
    bool lost; /* the command that was to signal it was dropped (device lost) */
};

enum cmd_kind { CMD_FILL, CMD_COPY, CMD_BARRIER, CMD_SIGNAL, CMD_WAIT, CMD_RESET };

/* One command. On a synchronous immediate list it lives on the stack and
 * `wait` points at the caller's array; a regular list and the queue of an
 * asynchronous immediate list own a copy of `wait`. */
struct cmd {
    enum cmd_kind kind;
    void *dst;
    const void *src;
    size_t size;
    uint64_t dst_id, src_id; /* allocation ids at append time, 0: plain memory */
    size_t pattern_size;
    uint8_t pattern[MAX_FILL_PATTERN];
    struct event *signal;    /* signaled after the command (or the event of
                                CMD_SIGNAL / CMD_RESET) */
    uint32_t nwait;
    struct event **wait;
};

struct cmdlist {
    struct obj o;
    struct context *ctx;
    struct device *dev;
    bool immediate, closed;
    bool async;       /* immediate, mode ASYNCHRONOUS or DEFAULT: appends queue */
    ze_result_t lost; /* a queued command failed: the list's work was dropped */
    struct cmd *cmds; /* a regular list's recorded commands */
    size_t n, cap;
    struct cmd *q;    /* an asynchronous list's queue: [qhead, qn) wait to run */
    size_t qhead, qn, qcap;
};

struct alloc {
    uintptr_t base;
    size_t size;   /* what the caller asked for */
    size_t span;   /* mapped at base: size rounded up to a page */
    char *cpu;     /* where the driver reads and writes: the alias of device
                      memory, the mapping itself for host and shared */
    int fd;        /* the memfd; -1 for an opened IPC mapping */
    ino_t ino;
    dev_t fsdev;
    uint64_t id;
    ze_memory_type_t type;
    struct device *dev; /* NULL: host memory, or shared with no device */
    struct context *ctx;
    uint64_t charged;   /* bytes on dev->used or g.host_used */
    /* opened IPC mappings */
    unsigned refs;
    uint32_t exp_pid;
    uint64_t exp_nonce, exp_id;
};

/* The device's progress while the host waits, and what it waits for
 * (the section on asynchronous immediate lists). */
static bool progress(bool (*done)(const void *), const void *arg);
static bool event_queued(const struct event *e);
static bool alloc_idle(const void *arg);

/* ---- state ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct driver g_driver = {.magic = 0x5a544452};
static struct device g_devices[HM_ZE_TEST_MAX_DEVICES];

/* Lenient behaviours a test asks for by name (hm_ze_test_set_option). */
#define ZT_OPTIONS(X) X(fork_child_works) X(ipc_open_same_pointer) X(immediate_synchronous)
enum option {
#define X(name) OPT_##name,
    ZT_OPTIONS(X)
#undef X
    OPT_COUNT
};
static const char *const option_names[OPT_COUNT] = {
#define X(name) #name,
    ZT_OPTIONS(X)
#undef X
};

static struct {
    bool initialized; /* the driver's zeInit ran */
    bool forked;      /* this is a fork child of a process the driver ran in */
    bool torn_down;   /* the library's destructor ran (exit or unload) */
    int opt[OPT_COUNT];
    unsigned ndev;
    uint64_t limit; /* per device and for the host, bytes */
    uint64_t host_used;
    uint64_t next_id;
    uint64_t nonce; /* this process's, new in a fork child */
    uint64_t calls[API_COUNT];
    struct {
        unsigned countdown; /* 0: none pending */
        ze_result_t result;
    } inject[API_COUNT];
    uint64_t leaks;
    uint64_t ran_queued; /* queued commands run (hm_ze_test_run_queued) */
    struct obj *objs;
    struct alloc **allocs;
    size_t nallocs, cap;
} g;

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

/* A fork child gets the tables in the state the parent had them; the
 * forking thread holds g_lock across fork, so no other thread's half-done
 * update is copied. */
static void fork_prepare(void) { lock(); }
static void fork_parent(void) { unlock(); }
static void fork_child(void) {
    g.nonce = new_nonce();
    g.forked = true;
    unlock();
}

/* The driver's exit-time teardown (compute-runtime tears its driver down
 * in a library destructor too): every later call is
 * ZE_RESULT_ERROR_UNINITIALIZED, as loaders from 1.17 answer once they are
 * in teardown (zelCheckIsLoaderInTearDown), and is reported with one line
 * per call on the descriptor HM_ZE_TEST_TEARDOWN_REPORT names, if set. */
static _Atomic uint64_t calls_after_teardown;
static int teardown_report_fd = -1;
__attribute__((destructor)) static void teardown(void) {
    const char *s = getenv("HM_ZE_TEST_TEARDOWN_REPORT");
    if (s && *s) teardown_report_fd = atoi(s);
    pthread_mutex_lock(&g_lock);
    /* Queued work runs (the driver's teardown waits for its engines). */
    progress(NULL, NULL);
    g.torn_down = true;
    pthread_mutex_unlock(&g_lock);
}

/* maxMemAllocSize: half the memory (a real device's is below its memory
 * too: 4 GiB on many Intel GPUs), at least a device page. */
static uint64_t max_alloc(void) { return g.limit / 2 > DEVICE_PAGE ? g.limit / 2 : DEVICE_PAGE; }

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
    const char *s = getenv("HM_ZE_TEST_DEVICES");
    if (s && *s) {
        char *end;
        long n = strtol(s, &end, 10);
        if (*end == '\0' && n >= 1 && n <= HM_ZE_TEST_MAX_DEVICES)
            g.ndev = (unsigned)n;
        else
            fprintf(stderr, "libze_test: HM_ZE_TEST_DEVICES=%s is not 1..%d; using %u\n", s,
                    HM_ZE_TEST_MAX_DEVICES, g.ndev);
    }
    g.limit = DEFAULT_MEM_LIMIT;
    s = getenv("HM_ZE_TEST_DEVICE_MEM");
    if (s && *s) {
        uint64_t v = parse_size(s);
        if (v)
            g.limit = v;
        else
            fprintf(stderr, "libze_test: HM_ZE_TEST_DEVICE_MEM=%s is not a size; using %llu\n",
                    s, (unsigned long long)g.limit);
    }
    for (unsigned i = 0; i < HM_ZE_TEST_MAX_DEVICES; i++) {
        g_devices[i].magic = 0x5a544456;
        g_devices[i].index = i;
    }
    g.next_id = 1;
    g.nonce = new_nonce();
    int e = pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (e) die("pthread_atfork: %s", strerror(e));
}

/* The start of every entry point: count the call, then an injected failure
 * or UNINITIALIZED returns at once (lock released); otherwise SUCCESS with
 * g_lock held, to be released by leave(). */
static ze_result_t enter(enum api a) {
    pthread_once(&g_once, setup);
    lock();
    g.calls[a]++;
    ze_result_t r = ZE_RESULT_SUCCESS;
    if (g.torn_down) {
        uint64_t n = atomic_fetch_add(&calls_after_teardown, 1) + 1;
        if (teardown_report_fd >= 0) {
            char line[96];
            int len = snprintf(line, sizeof line, "libze_test: %s after teardown (%llu)\n",
                               api_names[a], (unsigned long long)n);
            if (write(teardown_report_fd, line, (size_t)len) < 0) { /* nothing to do */ }
        }
        r = ZE_RESULT_ERROR_UNINITIALIZED;
    } else if (g.forked && !g.opt[OPT_fork_child_works]) {
        /* The loader's zeInit is once per address space (a child inherits
         * it done) and the driver's state is the parent's: nothing works
         * (compute-runtime#954: the child deadlocks or sees no driver). */
        r = ZE_RESULT_ERROR_UNINITIALIZED;
    } else if (g.inject[a].countdown && --g.inject[a].countdown == 0) {
        r = g.inject[a].result;
    } else if (a != API_zeInit && !g.initialized) {
        r = ZE_RESULT_ERROR_UNINITIALIZED;
    }
    if (r != ZE_RESULT_SUCCESS) unlock();
    return r;
}

static ze_result_t leave(ze_result_t r) {
    unlock();
    return r;
}

#define ENTER(name)                                    \
    do {                                               \
        ze_result_t enter_r_ = enter(API_##name);      \
        if (enter_r_ != ZE_RESULT_SUCCESS) return enter_r_; \
    } while (0)

/* ---- handles ---- */

static void obj_add(struct obj *o, enum kind k) {
    o->kind = k;
    o->next = g.objs;
    g.objs = o;
}

static void obj_remove(struct obj *o) {
    for (struct obj **p = &g.objs; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            o->kind = 0;
            return;
        }
    die("object %p not registered", (void *)o);
}

/* The live object of kind k at h, or NULL with *r set. */
static void *obj_find(const void *h, enum kind k, ze_result_t *r) {
    if (!h) {
        *r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
        return NULL;
    }
    for (struct obj *o = g.objs; o; o = o->next)
        if ((const void *)o == h) {
            if (o->kind == k) return o;
            break;
        }
    *r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
    return NULL;
}

#define FIND(var, type, h, k)                          \
    type *var;                                         \
    do {                                               \
        ze_result_t find_r_;                           \
        var = obj_find((h), (k), &find_r_);            \
        if (!var) return leave(find_r_);               \
    } while (0)

static ze_result_t check_driver(ze_driver_handle_t h) {
    if (!h) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    return (const void *)h == (const void *)&g_driver ? ZE_RESULT_SUCCESS
                                                      : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

static struct device *device_find(ze_device_handle_t h, ze_result_t *r) {
    uintptr_t u = (uintptr_t)h, b = (uintptr_t)g_devices;
    if (!h) {
        *r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
        return NULL;
    }
    if (u < b || u >= b + g.ndev * sizeof(struct device) || (u - b) % sizeof(struct device)) {
        *r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    return &g_devices[(u - b) / sizeof(struct device)];
}

#define CHECK_DRIVER(h)                                \
    do {                                               \
        ze_result_t cd_r_ = check_driver(h);           \
        if (cd_r_ != ZE_RESULT_SUCCESS) return leave(cd_r_); \
    } while (0)

#define FIND_DEVICE(var, h)                            \
    struct device *var;                                \
    do {                                               \
        ze_result_t fd_r_;                             \
        var = device_find((h), &fd_r_);                \
        if (!var) return leave(fd_r_);                 \
    } while (0)

/* The usual count protocol: *pCount 0 asks for the number; otherwise up to
 * *pCount entries are written (when out is not NULL) and *pCount is set to
 * what was written. Returns how many to write. */
static uint32_t count_protocol(uint32_t *pCount, uint32_t have, bool out) {
    if (*pCount == 0 || !out) {
        *pCount = have;
        return 0;
    }
    if (*pCount > have) *pCount = have;
    return *pCount;
}

/* ---- driver and devices ---- */

static ze_result_t ZE_APICALL d_init(ze_init_flags_t flags) {
    ENTER(zeInit);
    if (flags & ~(ze_init_flags_t)(ZE_INIT_FLAG_GPU_ONLY | ZE_INIT_FLAG_VPU_ONLY))
        return leave(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    /* A GPU driver has nothing to offer a VPU-only init. */
    if (flags == ZE_INIT_FLAG_VPU_ONLY) return leave(ZE_RESULT_ERROR_UNINITIALIZED);
    g.initialized = true;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_driver_get(uint32_t *pCount, ze_driver_handle_t *phDrivers) {
    ENTER(zeDriverGet);
    if (!pCount) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (count_protocol(pCount, 1, phDrivers != NULL))
        phDrivers[0] = (ze_driver_handle_t)(void *)&g_driver;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_driver_get_api_version(ze_driver_handle_t hDriver,
                                                       ze_api_version_t *version) {
    ENTER(zeDriverGetApiVersion);
    CHECK_DRIVER(hDriver);
    if (!version) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    *version = ZE_API_VERSION_1_4;
    return leave(ZE_RESULT_SUCCESS);
}

static void driver_uuid(uint8_t id[ZE_MAX_DRIVER_UUID_SIZE]) {
    static const uint8_t u[ZE_MAX_DRIVER_UUID_SIZE] = {'h', 'e', 't', 'm', 'e', 'm', '-', 'z',
                                                       'e', '-', 't', 'e', 's', 't', 0, 1};
    memcpy(id, u, sizeof u);
}

static ze_result_t ZE_APICALL d_driver_get_properties(ze_driver_handle_t hDriver,
                                                      ze_driver_properties_t *p) {
    ENTER(zeDriverGetProperties);
    CHECK_DRIVER(hDriver);
    if (!p) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    driver_uuid(p->uuid.id);
    p->driverVersion = DRIVER_VERSION;
    /* Extensions in the chain: the memory free policies. */
    for (ze_base_properties_t *e = p->pNext; e; e = e->pNext)
        if (e->stype == ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES)
            ((ze_driver_memory_free_ext_properties_t *)(void *)e)->freePolicies =
                ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE |
                ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_driver_get_ipc_properties(ze_driver_handle_t hDriver,
                                                          ze_driver_ipc_properties_t *p) {
    ENTER(zeDriverGetIpcProperties);
    CHECK_DRIVER(hDriver);
    if (!p) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    p->flags = ZE_IPC_PROPERTY_FLAG_MEMORY;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_driver_get_extension_properties(
    ze_driver_handle_t hDriver, uint32_t *pCount, ze_driver_extension_properties_t *p) {
    ENTER(zeDriverGetExtensionProperties);
    CHECK_DRIVER(hDriver);
    if (!pCount) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (count_protocol(pCount, 1, p != NULL)) {
        memset(p[0].name, 0, sizeof p[0].name);
        snprintf(p[0].name, sizeof p[0].name, "%s", ZE_MEMORY_FREE_POLICIES_EXT_NAME);
        p[0].version = ZE_MEMORY_FREE_POLICIES_EXT_VERSION_CURRENT;
    }
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_driver_get_extension_function_address(ze_driver_handle_t hDriver,
                                                                      const char *name,
                                                                      void **ppFunctionAddress) {
    ENTER(zeDriverGetExtensionFunctionAddress);
    CHECK_DRIVER(hDriver);
    if (!name || !ppFunctionAddress) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    *ppFunctionAddress = NULL;
    return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
}

static ze_result_t ZE_APICALL d_device_get(ze_driver_handle_t hDriver, uint32_t *pCount,
                                           ze_device_handle_t *phDevices) {
    ENTER(zeDeviceGet);
    CHECK_DRIVER(hDriver);
    if (!pCount) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    uint32_t n = count_protocol(pCount, g.ndev, phDevices != NULL);
    for (uint32_t i = 0; i < n; i++) phDevices[i] = (ze_device_handle_t)(void *)&g_devices[i];
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_sub_devices(ze_device_handle_t hDevice,
                                                       uint32_t *pCount,
                                                       ze_device_handle_t *phSubdevices) {
    ENTER(zeDeviceGetSubDevices);
    FIND_DEVICE(d, hDevice);
    (void)d;
    if (!pCount) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    *pCount = 0;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_properties(ze_device_handle_t hDevice,
                                                      ze_device_properties_t *p) {
    ENTER(zeDeviceGetProperties);
    FIND_DEVICE(d, hDevice);
    if (!p) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    p->type = ZE_DEVICE_TYPE_GPU;
    p->vendorId = VENDOR_ID;
    p->deviceId = DEVICE_ID;
    p->flags = 0;
    p->subdeviceId = 0;
    p->coreClockRate = 1000;
    p->maxMemAllocSize = max_alloc();
    p->maxHardwareContexts = 64;
    p->maxCommandQueuePriority = ZE_COMMAND_QUEUE_PRIORITY_PRIORITY_HIGH;
    p->numThreadsPerEU = 8;
    p->physicalEUSimdWidth = 8;
    p->numEUsPerSubslice = 8;
    p->numSubslicesPerSlice = 4;
    p->numSlices = 1;
    /* nanoseconds, or cycles per second for the 1.2 structure */
    p->timerResolution = p->stype == ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2 ? 1000000000u : 1;
    p->timestampValidBits = 64;
    p->kernelTimestampValidBits = 32;
    /* The same in every process: IPC peers compare UUIDs. */
    static const uint8_t u[ZE_MAX_DEVICE_UUID_SIZE] = {'h', 'm', 'z', 'e', 't', 'e', 's', 't',
                                                       'd', 'e', 'v', 0, 0, 0, 0, 0};
    memcpy(p->uuid.id, u, sizeof u);
    p->uuid.id[ZE_MAX_DEVICE_UUID_SIZE - 1] = (uint8_t)d->index;
    snprintf(p->name, sizeof p->name, "hetmem Level Zero test device %u", d->index);
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_command_queue_group_properties(
    ze_device_handle_t hDevice, uint32_t *pCount, ze_command_queue_group_properties_t *p) {
    ENTER(zeDeviceGetCommandQueueGroupProperties);
    FIND_DEVICE(d, hDevice);
    (void)d;
    if (!pCount) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (count_protocol(pCount, 1, p != NULL)) {
        p[0].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE |
                     ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
        p[0].maxMemoryFillPatternSize = MAX_FILL_PATTERN;
        p[0].numQueues = 1;
    }
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_memory_properties(ze_device_handle_t hDevice,
                                                             uint32_t *pCount,
                                                             ze_device_memory_properties_t *p) {
    ENTER(zeDeviceGetMemoryProperties);
    FIND_DEVICE(d, hDevice);
    if (!pCount) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (count_protocol(pCount, 1, p != NULL)) {
        p[0].flags = 0;
        p[0].maxClockRate = 1000;
        p[0].maxBusWidth = 64;
        p[0].totalSize = g.limit;
        snprintf(p[0].name, sizeof p[0].name, "memfd of test device %u", d->index);
    }
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_memory_access_properties(
    ze_device_handle_t hDevice, ze_device_memory_access_properties_t *p) {
    ENTER(zeDeviceGetMemoryAccessProperties);
    FIND_DEVICE(d, hDevice);
    (void)d;
    if (!p) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_memory_access_cap_flags_t rw = ZE_MEMORY_ACCESS_CAP_FLAG_RW;
    p->hostAllocCapabilities = rw;
    p->deviceAllocCapabilities = rw;
    p->sharedSingleDeviceAllocCapabilities = rw;
    p->sharedCrossDeviceAllocCapabilities = 0;
    p->sharedSystemAllocCapabilities = 0;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_p2p_properties(ze_device_handle_t hDevice,
                                                          ze_device_handle_t hPeer,
                                                          ze_device_p2p_properties_t *p) {
    ENTER(zeDeviceGetP2PProperties);
    FIND_DEVICE(d, hDevice);
    FIND_DEVICE(peer, hPeer);
    (void)d, (void)peer;
    if (!p) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    p->flags = ZE_DEVICE_P2P_PROPERTY_FLAG_ACCESS;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_can_access_peer(ze_device_handle_t hDevice,
                                                       ze_device_handle_t hPeer,
                                                       ze_bool_t *value) {
    ENTER(zeDeviceCanAccessPeer);
    FIND_DEVICE(d, hDevice);
    FIND_DEVICE(peer, hPeer);
    (void)d, (void)peer;
    if (!value) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    *value = 1;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_device_get_status(ze_device_handle_t hDevice) {
    ENTER(zeDeviceGetStatus);
    FIND_DEVICE(d, hDevice);
    (void)d;
    return leave(ZE_RESULT_SUCCESS);
}

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

/* The allocation whose mapping holds p (page rounding included). */
static struct alloc *alloc_span_at(uintptr_t p) {
    size_t i = alloc_upper(p);
    if (i == 0) return NULL;
    struct alloc *a = g.allocs[i - 1];
    return p - a->base < a->span ? a : NULL;
}

/* The allocation of context c (any context when c is NULL) that holds p
 * within the size it was asked for. */
static struct alloc *alloc_at(const struct context *c, const void *ptr) {
    uintptr_t p = (uintptr_t)ptr;
    struct alloc *a = alloc_span_at(p);
    if (!a || p - a->base >= a->size || (c && a->ctx != c)) return NULL;
    return a;
}

static bool table_reserve(void) {
    if (g.nallocs < g.cap) return true;
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
}

/* len bytes of fd at an address aligned to `align` (a power of two >= the
 * host page), or NULL. */
static char *map_aligned(int fd, size_t len, size_t align, int prot) {
    size_t span = len + align;
    char *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)r + align - 1) & ~(uintptr_t)(align - 1));
    if (p > r) munmap(r, (size_t)(p - r));
    if (r + span > p + len) munmap(p + len, (size_t)(r + span - (p + len)));
    if (mmap(p, len, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

/* Maps fd as memory of `type`: *view for the caller, *cpu for the driver. */
static bool map_memory(int fd, size_t span, size_t align, ze_memory_type_t type, char **view,
                       char **cpu) {
    int prot = type == ZE_MEMORY_TYPE_DEVICE ? PROT_NONE : PROT_READ | PROT_WRITE;
    *view = map_aligned(fd, span, align, prot);
    if (!*view) return false;
    if (type != ZE_MEMORY_TYPE_DEVICE) {
        *cpu = *view;
        return true;
    }
    *cpu = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (*cpu == MAP_FAILED) {
        munmap(*view, span);
        return false;
    }
    return true;
}

static uint64_t *charge_of(struct device *d) { return d ? &d->used : &g.host_used; }

/* Unmaps and forgets a (an allocation or an opened mapping). */
static void alloc_release(struct alloc *a) {
    table_remove(a);
    if (a->cpu != (char *)a->base) munmap(a->cpu, a->span);
    munmap((void *)a->base, a->span);
    if (a->fd >= 0) close(a->fd);
    *charge_of(a->dev) -= a->charged;
    free(a);
}

/* Every allocation's memfd records its asked size in its name
 * ("hm_ze_test:<size>"), which no holder of the descriptor can change, and
 * is sealed against resizing once sized, as a dma-buf cannot be resized: an
 * importer learns the size of what a handle names from the file it was
 * given, never from bytes of the handle that its peer could rewrite. */
#define MEMFD_PREFIX "hm_ze_test" /* test/common/sized_memfd.h */

/* The descriptor chain asks for sizes above maxMemAllocSize. */
static bool relaxed_in(const void *pNext) {
    for (const ze_base_desc_t *e = pNext; e; e = e->pNext)
        if (e->stype == ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC &&
            (((const ze_relaxed_allocation_limits_exp_desc_t *)(const void *)e)->flags &
             ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE))
            return true;
    return false;
}

static ze_result_t mem_alloc(struct context *c, ze_memory_type_t type, struct device *d,
                             size_t size, size_t alignment, bool relaxed, void **pptr) {
    if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    if ((alignment & (alignment - 1)) || alignment > MAX_ALIGNMENT)
        return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
    size_t page = type == ZE_MEMORY_TYPE_HOST ? HOST_PAGE : DEVICE_PAGE;
    uint64_t *used = charge_of(d);
    if (size > (relaxed ? g.limit : max_alloc())) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    size_t span = (size + page - 1) & ~(page - 1);
    if (*used > g.limit || span > g.limit - *used)
        return d ? ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    size_t align = alignment > page ? alignment : page;

    struct alloc *a = calloc(1, sizeof *a);
    if (!a || !table_reserve()) goto fail_alloc;
    a->fd = sized_memfd_create(MEMFD_PREFIX, size);
    if (a->fd < 0) goto fail_alloc;
    struct stat st;
    if (ftruncate(a->fd, (off_t)span) != 0 || !sized_memfd_seal(a->fd) ||
        fstat(a->fd, &st) != 0)
        goto fail_fd;
    char *view;
    if (!map_memory(a->fd, span, align, type, &view, &a->cpu)) goto fail_fd;
    a->base = (uintptr_t)view;
    a->size = size;
    a->span = span;
    a->ino = st.st_ino;
    a->fsdev = st.st_dev;
    a->id = g.next_id++;
    a->type = type;
    a->dev = d;
    a->ctx = c;
    a->charged = span;
    *used += span;
    table_insert(a);
    *pptr = view;
    return ZE_RESULT_SUCCESS;

fail_fd:
    close(a->fd);
fail_alloc:
    free(a);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t check_device_desc(const ze_device_mem_alloc_desc_t *desc) {
    if (!desc) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->flags & ~(ze_device_mem_alloc_flags_t)0x7) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    if (desc->ordinal != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* one memory */
    return ZE_RESULT_SUCCESS;
}

static ze_result_t check_host_desc(const ze_host_mem_alloc_desc_t *desc) {
    if (!desc) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->flags & ~(ze_host_mem_alloc_flags_t)0xf) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL d_mem_alloc_device(ze_context_handle_t hContext,
                                                 const ze_device_mem_alloc_desc_t *desc,
                                                 size_t size, size_t alignment,
                                                 ze_device_handle_t hDevice, void **pptr) {
    ENTER(zeMemAllocDevice);
    FIND(c, struct context, hContext, K_CONTEXT);
    FIND_DEVICE(d, hDevice);
    if (!pptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_result_t r = check_device_desc(desc);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    return leave(mem_alloc(c, ZE_MEMORY_TYPE_DEVICE, d, size, alignment, relaxed_in(desc->pNext),
                           pptr));
}

static ze_result_t ZE_APICALL d_mem_alloc_host(ze_context_handle_t hContext,
                                               const ze_host_mem_alloc_desc_t *desc, size_t size,
                                               size_t alignment, void **pptr) {
    ENTER(zeMemAllocHost);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!pptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_result_t r = check_host_desc(desc);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    return leave(mem_alloc(c, ZE_MEMORY_TYPE_HOST, NULL, size, alignment, relaxed_in(desc->pNext),
                           pptr));
}

static ze_result_t ZE_APICALL d_mem_alloc_shared(ze_context_handle_t hContext,
                                                 const ze_device_mem_alloc_desc_t *device_desc,
                                                 const ze_host_mem_alloc_desc_t *host_desc,
                                                 size_t size, size_t alignment,
                                                 ze_device_handle_t hDevice, void **pptr) {
    ENTER(zeMemAllocShared);
    FIND(c, struct context, hContext, K_CONTEXT);
    struct device *d = NULL; /* optional: NULL is memory of no device */
    if (hDevice) {
        ze_result_t r;
        if (!(d = device_find(hDevice, &r))) return leave(r);
    }
    if (!pptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_result_t r = check_device_desc(device_desc);
    if (r == ZE_RESULT_SUCCESS) r = check_host_desc(host_desc);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    return leave(mem_alloc(c, ZE_MEMORY_TYPE_SHARED, d, size, alignment,
                           relaxed_in(device_desc->pNext), pptr));
}

/* ze_api.h, zeMemFree: "The application must ensure the device is not
 * currently referencing the memory before it is freed"; compute-runtime's
 * zeMemFree waits for the engines that used the allocation. So queued work
 * that uses it runs first; a command that still cannot run (it waits on an
 * event nobody signals) finds the memory gone when it runs: device lost. */
static ze_result_t mem_free(struct context *c, void *ptr) {
    if (!ptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct alloc *a = alloc_at(c, ptr);
    if (!a || a->base != (uintptr_t)ptr || a->fd < 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    progress(alloc_idle, a);
    alloc_release(a);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL d_mem_free(ze_context_handle_t hContext, void *ptr) {
    ENTER(zeMemFree);
    FIND(c, struct context, hContext, K_CONTEXT);
    return leave(mem_free(c, ptr));
}

/* Both policies free at once, after the queued work that uses the memory
 * (mem_free): nothing runs after the call returns. */
static ze_result_t ZE_APICALL d_mem_free_ext(ze_context_handle_t hContext,
                                             const ze_memory_free_ext_desc_t *desc, void *ptr) {
    ENTER(zeMemFreeExt);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!desc) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_driver_memory_free_policy_ext_flags_t all =
        ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE |
        ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE;
    if (desc->freePolicy & ~all) return leave(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    if (desc->freePolicy == all) return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT); /* one policy */
    return leave(mem_free(c, ptr));
}

static ze_result_t ZE_APICALL d_mem_get_alloc_properties(ze_context_handle_t hContext,
                                                         const void *ptr,
                                                         ze_memory_allocation_properties_t *p,
                                                         ze_device_handle_t *phDevice) {
    ENTER(zeMemGetAllocProperties);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!ptr || !p) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    struct alloc *a = alloc_at(c, ptr);
    if (!a) {
        p->type = ZE_MEMORY_TYPE_UNKNOWN;
        p->id = 0;
        p->pageSize = 0;
        if (phDevice) *phDevice = NULL;
        return leave(ZE_RESULT_SUCCESS);
    }
    p->type = a->type;
    p->id = a->id;
    p->pageSize = a->type == ZE_MEMORY_TYPE_HOST ? HOST_PAGE : DEVICE_PAGE;
    if (phDevice) *phDevice = a->dev ? (ze_device_handle_t)(void *)a->dev : NULL;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_mem_get_address_range(ze_context_handle_t hContext,
                                                      const void *ptr, void **pBase,
                                                      size_t *pSize) {
    ENTER(zeMemGetAddressRange);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!ptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    struct alloc *a = alloc_at(c, ptr);
    if (!a) return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    if (pBase) *pBase = (void *)a->base;
    if (pSize) *pSize = a->size;
    return leave(ZE_RESULT_SUCCESS);
}

/* ---- IPC ---- */

enum {
    IPC_FD = 0,      /* u64 */
    IPC_OFFSET = 8,  /* u64 */
    IPC_TYPE = 16,   /* u8 */
    IPC_DEVICE = 17, /* u8 */
    IPC_TAG_AT = 18, /* u16 */
    IPC_PID = 20,    /* u32 */
    IPC_ID = 24,     /* u64 */
    IPC_SIZE = 32,   /* u64 */
    IPC_INO = 40,    /* u64 */
    IPC_FSDEV = 48,  /* u64 */
    IPC_NONCE = 56,  /* u64 */
};
_Static_assert(IPC_NONCE + 8 == ZE_MAX_IPC_HANDLE_SIZE, "the handle is 64 bytes");

static void put64(ze_ipc_mem_handle_t *h, size_t at, uint64_t v) { memcpy(h->data + at, &v, 8); }
static uint64_t get64(const ze_ipc_mem_handle_t *h, size_t at) {
    uint64_t v;
    memcpy(&v, h->data + at, 8);
    return v;
}

static ze_result_t ZE_APICALL d_mem_get_ipc_handle(ze_context_handle_t hContext, const void *ptr,
                                                   ze_ipc_mem_handle_t *pIpcHandle) {
    ENTER(zeMemGetIpcHandle);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!ptr || !pIpcHandle) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    struct alloc *a = alloc_at(c, ptr);
    /* Base pointers of own device allocations only: interior pointers,
     * host and shared memory and opened mappings are refused. */
    if (!a || a->base != (uintptr_t)ptr || a->type != ZE_MEMORY_TYPE_DEVICE || a->fd < 0)
        return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ze_ipc_mem_handle_t h;
    memset(&h, 0, sizeof h);
    put64(&h, IPC_FD, (uint64_t)a->fd);
    put64(&h, IPC_OFFSET, 0);
    h.data[IPC_TYPE] = (char)ZE_MEMORY_TYPE_DEVICE;
    h.data[IPC_DEVICE] = (char)a->dev->index;
    uint16_t tag = IPC_TAG;
    memcpy(h.data + IPC_TAG_AT, &tag, 2);
    uint32_t pid = (uint32_t)getpid();
    memcpy(h.data + IPC_PID, &pid, 4);
    put64(&h, IPC_ID, a->id);
    put64(&h, IPC_SIZE, a->size);
    put64(&h, IPC_INO, (uint64_t)a->ino);
    put64(&h, IPC_FSDEV, (uint64_t)a->fsdev);
    put64(&h, IPC_NONCE, g.nonce);
    *pIpcHandle = h;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ipc_open(struct context *c, struct device *d, const ze_ipc_mem_handle_t *h,
                            void **pptr) {
    uint16_t tag;
    uint32_t pid;
    memcpy(&tag, h->data + IPC_TAG_AT, 2);
    memcpy(&pid, h->data + IPC_PID, 4);
    uint64_t fd64 = get64(h, IPC_FD), size = get64(h, IPC_SIZE), id = get64(h, IPC_ID);
    uint64_t nonce = get64(h, IPC_NONCE);
    if (tag != IPC_TAG || (uint8_t)h->data[IPC_TYPE] != ZE_MEMORY_TYPE_DEVICE ||
        get64(h, IPC_OFFSET) != 0 || size == 0 || size > SIZE_MAX - DEVICE_PAGE || fd64 > INT32_MAX)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (pid == (uint32_t)getpid() && nonce == g.nonce)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* the exporter itself */
    /* The fd must be the importer's copy of the exporter's memfd. */
    int fd = (int)fd64;
    struct stat st;
    /* The size is the allocation's, read from its memfd (sized_memfd_create), not
     * the handle's size bytes: a peer may rewrite those. */
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != get64(h, IPC_INO) ||
        (uint64_t)st.st_dev != get64(h, IPC_FSDEV))
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    const uint64_t asked = sized_memfd_size(MEMFD_PREFIX, fd);
    size_t span = ((size_t)asked + DEVICE_PAGE - 1) & ~(DEVICE_PAGE - 1);
    if (asked == 0 || asked > SIZE_MAX - DEVICE_PAGE || st.st_size != (off_t)span)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    for (size_t i = 0; g.opt[OPT_ipc_open_same_pointer] && i < g.nallocs; i++) {
        struct alloc *a = g.allocs[i];
        if (a->fd < 0 && a->ctx == c && a->exp_pid == pid && a->exp_nonce == nonce &&
            a->exp_id == id) {
            a->refs++;
            *pptr = (void *)a->base;
            return ZE_RESULT_SUCCESS;
        }
    }
    struct alloc *a = calloc(1, sizeof *a);
    if (!a || !table_reserve()) {
        free(a);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    char *view;
    if (!map_memory(fd, span, DEVICE_PAGE, ZE_MEMORY_TYPE_DEVICE, &view, &a->cpu)) {
        free(a);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    a->base = (uintptr_t)view;
    a->size = (size_t)asked;
    a->span = span;
    a->fd = -1;
    a->ino = st.st_ino;
    a->fsdev = st.st_dev;
    a->id = g.next_id++;
    a->type = ZE_MEMORY_TYPE_DEVICE;
    a->dev = d;
    a->ctx = c;
    a->refs = 1;
    a->exp_pid = pid;
    a->exp_nonce = nonce;
    a->exp_id = id;
    table_insert(a);
    *pptr = view;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL d_mem_open_ipc_handle(ze_context_handle_t hContext,
                                                    ze_device_handle_t hDevice,
                                                    ze_ipc_mem_handle_t handle,
                                                    ze_ipc_memory_flags_t flags, void **pptr) {
    ENTER(zeMemOpenIpcHandle);
    FIND(c, struct context, hContext, K_CONTEXT);
    FIND_DEVICE(d, hDevice);
    if (flags & ~(ze_ipc_memory_flags_t)0x3) return leave(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    if (!pptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    return leave(ipc_open(c, d, &handle, pptr));
}

static ze_result_t ZE_APICALL d_mem_close_ipc_handle(ze_context_handle_t hContext,
                                                     const void *ptr) {
    ENTER(zeMemCloseIpcHandle);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!ptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    struct alloc *a = alloc_at(c, ptr);
    if (!a || a->base != (uintptr_t)ptr || a->fd >= 0) return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    if (--a->refs == 0) {
        progress(alloc_idle, a); /* as mem_free */
        alloc_release(a);
    }
    return leave(ZE_RESULT_SUCCESS);
}

/* ---- contexts ---- */

static ze_result_t context_create(ze_driver_handle_t hDriver, const ze_context_desc_t *desc,
                                  uint32_t numDevices, ze_device_handle_t *phDevices,
                                  ze_context_handle_t *phContext) {
    ze_result_t r = check_driver(hDriver);
    if (r != ZE_RESULT_SUCCESS) return r;
    if (!desc || !phContext || (numDevices && !phDevices)) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->flags & ~(ze_context_flags_t)ZE_CONTEXT_FLAG_TBD) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    for (uint32_t i = 0; i < numDevices; i++)
        if (!device_find(phDevices[i], &r)) return r;
    struct context *c = calloc(1, sizeof *c);
    if (!c) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    obj_add(&c->o, K_CONTEXT);
    *phContext = (ze_context_handle_t)(void *)c;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL d_context_create(ze_driver_handle_t hDriver,
                                               const ze_context_desc_t *desc,
                                               ze_context_handle_t *phContext) {
    ENTER(zeContextCreate);
    return leave(context_create(hDriver, desc, 0, NULL, phContext));
}

static ze_result_t ZE_APICALL d_context_create_ex(ze_driver_handle_t hDriver,
                                                  const ze_context_desc_t *desc,
                                                  uint32_t numDevices,
                                                  ze_device_handle_t *phDevices,
                                                  ze_context_handle_t *phContext) {
    ENTER(zeContextCreateEx);
    return leave(context_create(hDriver, desc, numDevices, phDevices, phContext));
}

static ze_result_t ZE_APICALL d_context_destroy(ze_context_handle_t hContext) {
    ENTER(zeContextDestroy);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (c->nqueues || c->nlists || c->npools) return leave(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    for (size_t i = g.nallocs; i-- > 0;) {
        struct alloc *a = g.allocs[i];
        if (a->ctx != c) continue;
        g.leaks++;
        alloc_release(a); /* removes entry i: the walk goes down */
    }
    obj_remove(&c->o);
    free(c);
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_context_get_status(ze_context_handle_t hContext) {
    ENTER(zeContextGetStatus);
    FIND(c, struct context, hContext, K_CONTEXT);
    (void)c;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t resident(ze_context_handle_t hContext, ze_device_handle_t hDevice, void *ptr,
                            size_t size) {
    ze_result_t r;
    struct context *c = obj_find(hContext, K_CONTEXT, &r);
    if (!c) return r;
    if (!device_find(hDevice, &r)) return r;
    if (!ptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct alloc *a = alloc_at(c, ptr);
    if (!a) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (size > a->size - ((uintptr_t)ptr - a->base)) return ZE_RESULT_ERROR_INVALID_SIZE;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL d_context_make_memory_resident(ze_context_handle_t hContext,
                                                             ze_device_handle_t hDevice,
                                                             void *ptr, size_t size) {
    ENTER(zeContextMakeMemoryResident);
    return leave(resident(hContext, hDevice, ptr, size));
}

static ze_result_t ZE_APICALL d_context_evict_memory(ze_context_handle_t hContext,
                                                     ze_device_handle_t hDevice, void *ptr,
                                                     size_t size) {
    ENTER(zeContextEvictMemory);
    return leave(resident(hContext, hDevice, ptr, size));
}

/* ---- events ---- */

static ze_result_t ZE_APICALL d_event_pool_create(ze_context_handle_t hContext,
                                                  const ze_event_pool_desc_t *desc,
                                                  uint32_t numDevices,
                                                  ze_device_handle_t *phDevices,
                                                  ze_event_pool_handle_t *phEventPool) {
    ENTER(zeEventPoolCreate);
    FIND(c, struct context, hContext, K_CONTEXT);
    if (!desc || !phEventPool || (numDevices && !phDevices))
        return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (desc->flags & ~(ze_event_pool_flags_t)0x7) return leave(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    if (desc->count == 0) return leave(ZE_RESULT_ERROR_INVALID_SIZE);
    ze_result_t r;
    for (uint32_t i = 0; i < numDevices; i++)
        if (!device_find(phDevices[i], &r)) return leave(r);
    struct evpool *p = calloc(1, sizeof *p);
    bool *used = calloc(desc->count, sizeof *used);
    if (!p || !used) {
        free(p);
        free(used);
        return leave(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    }
    p->ctx = c;
    p->count = desc->count;
    p->used = used;
    c->npools++;
    obj_add(&p->o, K_POOL);
    *phEventPool = (ze_event_pool_handle_t)(void *)p;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_event_pool_destroy(ze_event_pool_handle_t hEventPool) {
    ENTER(zeEventPoolDestroy);
    FIND(p, struct evpool, hEventPool, K_POOL);
    if (p->live) return leave(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    p->ctx->npools--;
    obj_remove(&p->o);
    free(p->used);
    free(p);
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_event_create(ze_event_pool_handle_t hEventPool,
                                             const ze_event_desc_t *desc,
                                             ze_event_handle_t *phEvent) {
    ENTER(zeEventCreate);
    FIND(p, struct evpool, hEventPool, K_POOL);
    if (!desc || !phEvent) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if ((desc->signal | desc->wait) & ~(ze_event_scope_flags_t)0x7)
        return leave(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    if (desc->index >= p->count || p->used[desc->index])
        return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    struct event *e = calloc(1, sizeof *e);
    if (!e) return leave(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    e->pool = p;
    e->index = desc->index;
    p->used[desc->index] = true;
    p->live++;
    obj_add(&e->o, K_EVENT);
    *phEvent = (ze_event_handle_t)(void *)e;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_event_destroy(ze_event_handle_t hEvent) {
    ENTER(zeEventDestroy);
    FIND(e, struct event, hEvent, K_EVENT);
    /* ze_api.h, zeEventDestroy: "The application must ensure the device is
     * not currently referencing the event before it is deleted". A real
     * driver frees it under the queued command; this one refuses. */
    if (event_queued(e)) return leave(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    e->pool->used[e->index] = false;
    e->pool->live--;
    obj_remove(&e->o);
    free(e);
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_event_host_signal(ze_event_handle_t hEvent) {
    ENTER(zeEventHostSignal);
    FIND(e, struct event, hEvent, K_EVENT);
    e->signaled = true;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_event_host_reset(ze_event_handle_t hEvent) {
    ENTER(zeEventHostReset);
    FIND(e, struct event, hEvent, K_EVENT);
    e->signaled = false;
    e->lost = false;
    return leave(ZE_RESULT_SUCCESS);
}

/* Runs nothing: a test sees a queued signal still pending. */
static ze_result_t ZE_APICALL d_event_query_status(ze_event_handle_t hEvent) {
    ENTER(zeEventQueryStatus);
    FIND(e, struct event, hEvent, K_EVENT);
    return leave(e->signaled ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY);
}

static bool event_signaled(const void *e) { return ((const struct event *)e)->signaled; }

/* ze_api.h: timeout 0 "operates exactly like zeEventQueryStatus" (nothing
 * runs); otherwise the queued work runs until the event is signaled. What
 * still cannot run then waits on an event only the host could signal, and
 * no other thread runs while this one holds the driver: NOT_READY whatever
 * the timeout (a real driver would wait out the timeout). An event whose
 * signal was dropped with its list's work (a queued command faulted) is
 * ZE_RESULT_ERROR_DEVICE_LOST (ze_api.h: with UINT64_MAX the call "will not
 * return until complete or device is lost"). */
static ze_result_t ZE_APICALL d_event_host_synchronize(ze_event_handle_t hEvent,
                                                       uint64_t timeout) {
    ENTER(zeEventHostSynchronize);
    FIND(e, struct event, hEvent, K_EVENT);
    if (timeout && !e->signaled) progress(event_signaled, e);
    return leave(e->signaled ? ZE_RESULT_SUCCESS
                 : e->lost   ? ZE_RESULT_ERROR_DEVICE_LOST
                             : ZE_RESULT_NOT_READY);
}

/* ---- commands ---- */

/* The CPU address for [p, p + len) and the id of the allocation it is in
 * (0: plain process memory). */
static ze_result_t resolve(const void *ptr, size_t len, char **cpu, uint64_t *id) {
    uintptr_t p = (uintptr_t)ptr;
    if (len > UINTPTR_MAX - p) return ZE_RESULT_ERROR_INVALID_SIZE;
    struct alloc *a = alloc_span_at(p);
    if (a) {
        size_t off = p - a->base;
        if (off >= a->size || len > a->size - off) return ZE_RESULT_ERROR_INVALID_SIZE;
        *cpu = a->cpu + off;
        *id = a->id;
        return ZE_RESULT_SUCCESS;
    }
    size_t i = alloc_upper(p);
    if (len && i < g.nallocs && g.allocs[i]->base < p + len) return ZE_RESULT_ERROR_INVALID_SIZE;
    *cpu = (char *)(uintptr_t)ptr;
    *id = 0;
    return ZE_RESULT_SUCCESS;
}

/* The events of a command as the caller gave them. */
static ze_result_t check_events(ze_event_handle_t hSignalEvent, uint32_t numWaitEvents,
                                ze_event_handle_t *phWaitEvents) {
    ze_result_t r;
    if (hSignalEvent && !obj_find(hSignalEvent, K_EVENT, &r)) return r;
    if (numWaitEvents && !phWaitEvents) return ZE_RESULT_ERROR_INVALID_SIZE;
    for (uint32_t i = 0; i < numWaitEvents; i++)
        if (!obj_find(phWaitEvents[i], K_EVENT, &r)) return r;
    return ZE_RESULT_SUCCESS;
}

/* Every wait event of m is signaled. */
static bool waits_done(const void *arg) {
    const struct cmd *m = arg;
    for (uint32_t i = 0; i < m->nwait; i++)
        if (!m->wait[i]->signaled) return false;
    return true;
}

/* Runs cmd. `recorded`: from a regular list or a queue, whose memory and
 * events may have gone since the append. `host_waits`: the host is blocked
 * in this call (a synchronous list, a queue's execute), so queued work of
 * other lists runs until the wait events are signaled; a wait that still
 * cannot end would block forever: ZE_RESULT_ERROR_NOT_AVAILABLE. */
static ze_result_t cmd_run(const struct cmd *m, bool recorded, bool host_waits) {
    ze_result_t r;
    for (uint32_t i = 0; i < m->nwait; i++)
        if (recorded && !obj_find(m->wait[i], K_EVENT, &r)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (!waits_done(m) && !(host_waits && progress(waits_done, m)))
        return ZE_RESULT_ERROR_NOT_AVAILABLE;
    if (recorded && m->signal && !obj_find(m->signal, K_EVENT, &r))
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    char *dst = NULL, *src = NULL;
    uint64_t id;
    switch (m->kind) {
    case CMD_FILL:
    case CMD_COPY:
        /* A GPU touching memory freed since the append faults: device lost. */
        if ((r = resolve(m->dst, m->size, &dst, &id)) != ZE_RESULT_SUCCESS)
            return recorded ? ZE_RESULT_ERROR_DEVICE_LOST : r;
        if (recorded && id != m->dst_id) return ZE_RESULT_ERROR_DEVICE_LOST;
        if (m->kind == CMD_FILL) {
            if (m->pattern_size == 1) {
                memset(dst, m->pattern[0], m->size);
                break;
            }
            for (size_t done = 0; done < m->size; done += m->pattern_size) {
                size_t n = m->size - done < m->pattern_size ? m->size - done : m->pattern_size;
                memcpy(dst + done, m->pattern, n);
            }
            break;
        }
        if ((r = resolve(m->src, m->size, &src, &id)) != ZE_RESULT_SUCCESS)
            return recorded ? ZE_RESULT_ERROR_DEVICE_LOST : r;
        if (recorded && id != m->src_id) return ZE_RESULT_ERROR_DEVICE_LOST;
        memmove(dst, src, m->size);
        break;
    case CMD_RESET:
        m->signal->signaled = false;
        m->signal->lost = false;
        return ZE_RESULT_SUCCESS;
    case CMD_BARRIER:
    case CMD_SIGNAL:
    case CMD_WAIT:
        break;
    }
    if (m->signal) {
        m->signal->signaled = true;
        m->signal->lost = false;
    }
    return ZE_RESULT_SUCCESS;
}

/* ---- asynchronous immediate lists: the device's queue ----
 * An append to an asynchronous list is checked as any append, then queued.
 * Queued commands run in order per list, and only while the host waits for
 * something: zeEventHostSynchronize (until that event is signaled), a
 * synchronous list's or a queue's command waiting on an event, zeMemFree /
 * zeMemFreeExt / zeMemCloseIpcHandle of memory a queued command uses (until
 * none does), zeCommandListDestroy of the list (until it is empty), the
 * library's teardown, and hm_ze_test_run_queued. A queued command waiting on
 * an unsignaled event holds its list; the others go on. A queued command
 * that fails (its memory freed since the append: a GPU page fault) drops
 * the rest of its list's work, whose events are then lost, and the list
 * answers every later append with the failure (ZE_RESULT_ERROR_DEVICE_LOST). */

/* Drops the queue of l; `why` (not SUCCESS): the list is lost. */
static void queue_drop(struct cmdlist *l, ze_result_t why) {
    for (size_t i = l->qhead; i < l->qn; i++) {
        struct cmd *m = &l->q[i];
        if (m->signal && m->kind != CMD_RESET) m->signal->lost = true;
        free(m->wait);
    }
    l->qhead = l->qn = 0;
    if (why != ZE_RESULT_SUCCESS) l->lost = why;
}

/* Runs the first queued command of l if its wait events allow; true when
 * it ran (or failed). */
static bool list_step(struct cmdlist *l) {
    if (l->qhead == l->qn) return false;
    struct cmd *m = &l->q[l->qhead];
    if (!waits_done(m)) return false;
    ze_result_t r = cmd_run(m, true, false);
    free(m->wait);
    m->wait = NULL;
    if (++l->qhead == l->qn) l->qhead = l->qn = 0;
    g.ran_queued++;
    if (r != ZE_RESULT_SUCCESS) queue_drop(l, r);
    return true;
}

/* Queued commands run, one per list a round, until done(arg) holds (NULL:
 * never) or nothing can run. Returns whether done(arg) holds. */
static bool progress(bool (*done)(const void *), const void *arg) {
    for (;;) {
        if (done && done(arg)) return true;
        bool ran = false;
        for (struct obj *o = g.objs; o; o = o->next) {
            if (o->kind != K_LIST || !list_step((struct cmdlist *)(void *)o)) continue;
            ran = true;
            if (done && done(arg)) return true;
        }
        if (!ran) return done && done(arg);
    }
}

/* Some queued command names e (signal, reset or wait). */
static bool event_queued(const struct event *e) {
    for (struct obj *o = g.objs; o; o = o->next) {
        if (o->kind != K_LIST) continue;
        const struct cmdlist *l = (const struct cmdlist *)(const void *)o;
        for (size_t i = l->qhead; i < l->qn; i++) {
            if (l->q[i].signal == e) return true;
            for (uint32_t k = 0; k < l->q[i].nwait; k++)
                if (l->q[i].wait[k] == e) return true;
        }
    }
    return false;
}

/* No queued command uses the allocation a. */
static bool alloc_idle(const void *arg) {
    const struct alloc *a = arg;
    for (struct obj *o = g.objs; o; o = o->next) {
        if (o->kind != K_LIST) continue;
        const struct cmdlist *l = (const struct cmdlist *)(const void *)o;
        for (size_t i = l->qhead; i < l->qn; i++)
            if (l->q[i].dst_id == a->id || l->q[i].src_id == a->id) return false;
    }
    return true;
}

static bool list_idle(const void *arg) {
    const struct cmdlist *l = arg;
    return l->qhead == l->qn;
}

/* Appends a copy of m (and of its wait array) to v[n]. */
static ze_result_t cmd_push(struct cmd **v, size_t *n, size_t *cap, const struct cmd *m) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        struct cmd *nv = realloc(*v, c * sizeof *nv);
        if (!nv) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        *v = nv;
        *cap = c;
    }
    struct event **w = NULL;
    if (m->nwait) {
        if (!(w = malloc(m->nwait * sizeof *w))) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        memcpy(w, m->wait, m->nwait * sizeof *w);
    }
    (*v)[*n] = *m;
    (*v)[*n].wait = w;
    (*n)++;
    return ZE_RESULT_SUCCESS;
}

/* The common part of every append: run it (synchronous immediate list),
 * queue it (asynchronous immediate list) or record it (regular list). */
static ze_result_t cmd_submit(struct cmdlist *l, struct cmd *m) {
    if (l->immediate && !l->async) return cmd_run(m, false, true);
    if (l->immediate) {
        if (l->lost != ZE_RESULT_SUCCESS) return l->lost;
        if (l->qhead && l->qn == l->qcap) { /* room at the front */
            memmove(l->q, l->q + l->qhead, (l->qn - l->qhead) * sizeof *l->q);
            l->qn -= l->qhead;
            l->qhead = 0;
        }
        return cmd_push(&l->q, &l->qn, &l->qcap, m);
    }
    if (l->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    return cmd_push(&l->cmds, &l->n, &l->cap, m);
}

static void cmd_init(struct cmd *m, enum cmd_kind k, ze_event_handle_t hSignalEvent,
                     uint32_t numWaitEvents, ze_event_handle_t *phWaitEvents) {
    memset(m, 0, offsetof(struct cmd, pattern));
    m->kind = k;
    m->signal = (struct event *)(void *)hSignalEvent;
    m->nwait = numWaitEvents;
    m->wait = (struct event **)(void *)phWaitEvents;
}

static ze_result_t ZE_APICALL d_list_append_memory_fill(
    ze_command_list_handle_t hCommandList, void *ptr, const void *pattern, size_t pattern_size,
    size_t size, ze_event_handle_t hSignalEvent, uint32_t numWaitEvents,
    ze_event_handle_t *phWaitEvents) {
    ENTER(zeCommandListAppendMemoryFill);
    FIND(l, struct cmdlist, hCommandList, K_LIST);
    if (!ptr || !pattern) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (pattern_size == 0 || pattern_size > MAX_FILL_PATTERN || (pattern_size & (pattern_size - 1)))
        return leave(ZE_RESULT_ERROR_INVALID_SIZE);
    ze_result_t r = check_events(hSignalEvent, numWaitEvents, phWaitEvents);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    struct cmd m;
    cmd_init(&m, CMD_FILL, hSignalEvent, numWaitEvents, phWaitEvents);
    char *cpu;
    if ((r = resolve(ptr, size, &cpu, &m.dst_id)) != ZE_RESULT_SUCCESS) return leave(r);
    m.dst = ptr;
    m.size = size;
    m.pattern_size = pattern_size;
    memcpy(m.pattern, pattern, pattern_size);
    return leave(cmd_submit(l, &m));
}

static ze_result_t ZE_APICALL d_list_append_memory_copy(
    ze_command_list_handle_t hCommandList, void *dstptr, const void *srcptr, size_t size,
    ze_event_handle_t hSignalEvent, uint32_t numWaitEvents, ze_event_handle_t *phWaitEvents) {
    ENTER(zeCommandListAppendMemoryCopy);
    FIND(l, struct cmdlist, hCommandList, K_LIST);
    if (!dstptr || !srcptr) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_result_t r = check_events(hSignalEvent, numWaitEvents, phWaitEvents);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    struct cmd m;
    cmd_init(&m, CMD_COPY, hSignalEvent, numWaitEvents, phWaitEvents);
    char *cpu;
    if ((r = resolve(dstptr, size, &cpu, &m.dst_id)) != ZE_RESULT_SUCCESS ||
        (r = resolve(srcptr, size, &cpu, &m.src_id)) != ZE_RESULT_SUCCESS)
        return leave(r);
    m.dst = dstptr;
    m.src = srcptr;
    m.size = size;
    return leave(cmd_submit(l, &m));
}

static ze_result_t event_cmd(enum cmd_kind k, ze_command_list_handle_t hCommandList,
                             ze_event_handle_t hSignalEvent, uint32_t numWaitEvents,
                             ze_event_handle_t *phWaitEvents) {
    ze_result_t r;
    struct cmdlist *l = obj_find(hCommandList, K_LIST, &r);
    if (!l) return r;
    if ((r = check_events(hSignalEvent, numWaitEvents, phWaitEvents)) != ZE_RESULT_SUCCESS)
        return r;
    struct cmd m;
    cmd_init(&m, k, hSignalEvent, numWaitEvents, phWaitEvents);
    return cmd_submit(l, &m);
}

static ze_result_t ZE_APICALL d_list_append_barrier(ze_command_list_handle_t hCommandList,
                                                    ze_event_handle_t hSignalEvent,
                                                    uint32_t numWaitEvents,
                                                    ze_event_handle_t *phWaitEvents) {
    ENTER(zeCommandListAppendBarrier);
    return leave(event_cmd(CMD_BARRIER, hCommandList, hSignalEvent, numWaitEvents, phWaitEvents));
}

static ze_result_t ZE_APICALL d_list_append_signal_event(ze_command_list_handle_t hCommandList,
                                                         ze_event_handle_t hEvent) {
    ENTER(zeCommandListAppendSignalEvent);
    if (!hEvent) return leave(ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    return leave(event_cmd(CMD_SIGNAL, hCommandList, hEvent, 0, NULL));
}

static ze_result_t ZE_APICALL d_list_append_wait_on_events(ze_command_list_handle_t hCommandList,
                                                           uint32_t numEvents,
                                                           ze_event_handle_t *phEvents) {
    ENTER(zeCommandListAppendWaitOnEvents);
    if (!phEvents) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    return leave(event_cmd(CMD_WAIT, hCommandList, NULL, numEvents, phEvents));
}

static ze_result_t ZE_APICALL d_list_append_event_reset(ze_command_list_handle_t hCommandList,
                                                        ze_event_handle_t hEvent) {
    ENTER(zeCommandListAppendEventReset);
    if (!hEvent) return leave(ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    return leave(event_cmd(CMD_RESET, hCommandList, hEvent, 0, NULL));
}

static void list_clear(struct cmdlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->cmds[i].wait);
    l->n = 0;
}

static ze_result_t list_create(ze_context_handle_t hContext, ze_device_handle_t hDevice,
                               uint32_t ordinal, bool immediate, bool async,
                               ze_command_list_handle_t *phCommandList) {
    ze_result_t r;
    struct context *c = obj_find(hContext, K_CONTEXT, &r);
    if (!c) return r;
    struct device *d = device_find(hDevice, &r);
    if (!d) return r;
    if (!phCommandList) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (ordinal != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* one queue group */
    struct cmdlist *l = calloc(1, sizeof *l);
    if (!l) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    l->ctx = c;
    l->dev = d;
    l->immediate = immediate;
    l->async = async;
    c->nlists++;
    obj_add(&l->o, K_LIST);
    *phCommandList = (ze_command_list_handle_t)(void *)l;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t check_queue_desc(const ze_command_queue_desc_t *desc) {
    if (!desc) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->flags & ~(ze_command_queue_flags_t)ZE_COMMAND_QUEUE_FLAG_EXPLICIT_ONLY ||
        desc->mode > ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS ||
        desc->priority > ZE_COMMAND_QUEUE_PRIORITY_PRIORITY_HIGH)
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    if (desc->index != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* one queue */
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL d_list_create(ze_context_handle_t hContext,
                                            ze_device_handle_t hDevice,
                                            const ze_command_list_desc_t *desc,
                                            ze_command_list_handle_t *phCommandList) {
    ENTER(zeCommandListCreate);
    if (!desc) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (desc->flags & ~(ze_command_list_flags_t)0x7) return leave(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    return leave(list_create(hContext, hDevice, desc->commandQueueGroupOrdinal, false, false,
                             phCommandList));
}

static ze_result_t ZE_APICALL d_list_create_immediate(ze_context_handle_t hContext,
                                                      ze_device_handle_t hDevice,
                                                      const ze_command_queue_desc_t *altdesc,
                                                      ze_command_list_handle_t *phCommandList) {
    ENTER(zeCommandListCreateImmediate);
    ze_result_t r = check_queue_desc(altdesc);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    /* ze_api.h, ze_command_queue_mode_t: SYNCHRONOUS "Device execution
     * always completes immediately on execute; Host thread is blocked";
     * ASYNCHRONOUS "Device execution is scheduled and will complete in
     * future; explicit synchronization object must be used to determine
     * completeness"; DEFAULT "uses driver-based heuristics", so a program
     * cannot count on it being synchronous: it queues here too. */
    bool async = altdesc->mode != ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS &&
                 !g.opt[OPT_immediate_synchronous];
    return leave(list_create(hContext, hDevice, altdesc->ordinal, true, async, phCommandList));
}

static ze_result_t ZE_APICALL d_list_destroy(ze_command_list_handle_t hCommandList) {
    ENTER(zeCommandListDestroy);
    FIND(l, struct cmdlist, hCommandList, K_LIST);
    /* ze_api.h: "The application must ensure the device is not currently
     * referencing the command list before it is deleted"; compute-runtime
     * waits for an immediate list's work before it frees it. Its queued work
     * runs; what waits on an event nobody signals is dropped. */
    progress(list_idle, l);
    queue_drop(l, ZE_RESULT_SUCCESS);
    free(l->q);
    list_clear(l);
    free(l->cmds);
    l->ctx->nlists--;
    obj_remove(&l->o);
    free(l);
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_list_close(ze_command_list_handle_t hCommandList) {
    ENTER(zeCommandListClose);
    FIND(l, struct cmdlist, hCommandList, K_LIST);
    if (l->immediate) return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    l->closed = true;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_list_reset(ze_command_list_handle_t hCommandList) {
    ENTER(zeCommandListReset);
    FIND(l, struct cmdlist, hCommandList, K_LIST);
    list_clear(l);
    l->closed = false;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_queue_create(ze_context_handle_t hContext,
                                             ze_device_handle_t hDevice,
                                             const ze_command_queue_desc_t *desc,
                                             ze_command_queue_handle_t *phCommandQueue) {
    ENTER(zeCommandQueueCreate);
    FIND(c, struct context, hContext, K_CONTEXT);
    FIND_DEVICE(d, hDevice);
    if (!phCommandQueue) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_result_t r = check_queue_desc(desc);
    if (r != ZE_RESULT_SUCCESS) return leave(r);
    if (desc->ordinal != 0) return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    struct queue *q = calloc(1, sizeof *q);
    if (!q) return leave(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    q->ctx = c;
    q->dev = d;
    c->nqueues++;
    obj_add(&q->o, K_QUEUE);
    *phCommandQueue = (ze_command_queue_handle_t)(void *)q;
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_queue_destroy(ze_command_queue_handle_t hCommandQueue) {
    ENTER(zeCommandQueueDestroy);
    FIND(q, struct queue, hCommandQueue, K_QUEUE);
    q->ctx->nqueues--;
    obj_remove(&q->o);
    free(q);
    return leave(ZE_RESULT_SUCCESS);
}

/* The lists run in order, each command to its end, before the call
 * returns; the first failing command stops everything after it. */
static ze_result_t ZE_APICALL d_queue_execute(ze_command_queue_handle_t hCommandQueue,
                                              uint32_t numCommandLists,
                                              ze_command_list_handle_t *phCommandLists,
                                              ze_fence_handle_t hFence) {
    ENTER(zeCommandQueueExecuteCommandLists);
    FIND(q, struct queue, hCommandQueue, K_QUEUE);
    if (!phCommandLists) return leave(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (numCommandLists == 0) return leave(ZE_RESULT_ERROR_INVALID_SIZE);
    if (hFence) return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT); /* no fences here */
    ze_result_t r;
    for (uint32_t i = 0; i < numCommandLists; i++) {
        struct cmdlist *l = obj_find(phCommandLists[i], K_LIST, &r);
        if (!l) return leave(r);
        if (l->immediate || !l->closed || l->ctx != q->ctx || l->dev != q->dev)
            return leave(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    }
    for (uint32_t i = 0; i < numCommandLists; i++) {
        struct cmdlist *l = (struct cmdlist *)(void *)phCommandLists[i];
        for (size_t k = 0; k < l->n; k++)
            if ((r = cmd_run(&l->cmds[k], true, true)) != ZE_RESULT_SUCCESS) return leave(r);
    }
    return leave(ZE_RESULT_SUCCESS);
}

static ze_result_t ZE_APICALL d_queue_synchronize(ze_command_queue_handle_t hCommandQueue,
                                                  uint64_t timeout) {
    ENTER(zeCommandQueueSynchronize);
    FIND(q, struct queue, hCommandQueue, K_QUEUE);
    (void)q, (void)timeout;
    return leave(ZE_RESULT_SUCCESS);
}

/* ---- the tables the loader asks for ---- */

static ze_result_t table_begin(ze_api_version_t version, void *table, size_t size) {
    pthread_once(&g_once, setup);
    if (!table) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (ZE_MAJOR_VERSION(version) != ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT))
        return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
    memset(table, 0, size);
    return ZE_RESULT_SUCCESS;
}

#define TABLE_BEGIN(version, t)                                  \
    do {                                                         \
        ze_result_t tb_r_ = table_begin((version), (t), sizeof *(t)); \
        if (tb_r_ != ZE_RESULT_SUCCESS) return tb_r_;            \
    } while (0)

EXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version,
                                                       ze_global_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnInit = d_init;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version,
                                                       ze_driver_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnGet = d_driver_get;
    t->pfnGetApiVersion = d_driver_get_api_version;
    t->pfnGetProperties = d_driver_get_properties;
    t->pfnGetIpcProperties = d_driver_get_ipc_properties;
    t->pfnGetExtensionProperties = d_driver_get_extension_properties;
    t->pfnGetExtensionFunctionAddress = d_driver_get_extension_function_address;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version,
                                                       ze_device_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnGet = d_device_get;
    t->pfnGetSubDevices = d_device_get_sub_devices;
    t->pfnGetProperties = d_device_get_properties;
    t->pfnGetCommandQueueGroupProperties = d_device_get_command_queue_group_properties;
    t->pfnGetMemoryProperties = d_device_get_memory_properties;
    t->pfnGetMemoryAccessProperties = d_device_get_memory_access_properties;
    t->pfnGetP2PProperties = d_device_get_p2p_properties;
    t->pfnCanAccessPeer = d_device_can_access_peer;
    t->pfnGetStatus = d_device_get_status;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t version,
                                                        ze_context_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnCreate = d_context_create;
    t->pfnDestroy = d_context_destroy;
    t->pfnGetStatus = d_context_get_status;
    t->pfnMakeMemoryResident = d_context_make_memory_resident;
    t->pfnEvictMemory = d_context_evict_memory;
    t->pfnCreateEx = d_context_create_ex;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetCommandQueueProcAddrTable(ze_api_version_t version,
                                                             ze_command_queue_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnCreate = d_queue_create;
    t->pfnDestroy = d_queue_destroy;
    t->pfnExecuteCommandLists = d_queue_execute;
    t->pfnSynchronize = d_queue_synchronize;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetCommandListProcAddrTable(ze_api_version_t version,
                                                            ze_command_list_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnCreate = d_list_create;
    t->pfnCreateImmediate = d_list_create_immediate;
    t->pfnDestroy = d_list_destroy;
    t->pfnClose = d_list_close;
    t->pfnReset = d_list_reset;
    t->pfnAppendBarrier = d_list_append_barrier;
    t->pfnAppendMemoryCopy = d_list_append_memory_copy;
    t->pfnAppendMemoryFill = d_list_append_memory_fill;
    t->pfnAppendSignalEvent = d_list_append_signal_event;
    t->pfnAppendWaitOnEvents = d_list_append_wait_on_events;
    t->pfnAppendEventReset = d_list_append_event_reset;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetEventPoolProcAddrTable(ze_api_version_t version,
                                                          ze_event_pool_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnCreate = d_event_pool_create;
    t->pfnDestroy = d_event_pool_destroy;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetEventProcAddrTable(ze_api_version_t version,
                                                      ze_event_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnCreate = d_event_create;
    t->pfnDestroy = d_event_destroy;
    t->pfnHostSignal = d_event_host_signal;
    t->pfnHostSynchronize = d_event_host_synchronize;
    t->pfnQueryStatus = d_event_query_status;
    t->pfnHostReset = d_event_host_reset;
    return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t version,
                                                    ze_mem_dditable_t *t) {
    TABLE_BEGIN(version, t);
    t->pfnAllocShared = d_mem_alloc_shared;
    t->pfnAllocDevice = d_mem_alloc_device;
    t->pfnAllocHost = d_mem_alloc_host;
    t->pfnFree = d_mem_free;
    t->pfnGetAllocProperties = d_mem_get_alloc_properties;
    t->pfnGetAddressRange = d_mem_get_address_range;
    t->pfnGetIpcHandle = d_mem_get_ipc_handle;
    t->pfnOpenIpcHandle = d_mem_open_ipc_handle;
    t->pfnCloseIpcHandle = d_mem_close_ipc_handle;
    t->pfnFreeExt = d_mem_free_ext;
    return ZE_RESULT_SUCCESS;
}

/* Tables the loader requires and the driver leaves empty. */
#define EMPTY_TABLE(getter, type)                                                   \
    EXPORT ze_result_t ZE_APICALL getter(ze_api_version_t version, type *t) {       \
        TABLE_BEGIN(version, t);                                                    \
        return ZE_RESULT_SUCCESS;                                                   \
    }

EMPTY_TABLE(zeGetFenceProcAddrTable, ze_fence_dditable_t)
EMPTY_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
EMPTY_TABLE(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
EMPTY_TABLE(zeGetModuleProcAddrTable, ze_module_dditable_t)
EMPTY_TABLE(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
EMPTY_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
EMPTY_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
EMPTY_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)

EMPTY_TABLE(zetGetDeviceProcAddrTable, zet_device_dditable_t)
EMPTY_TABLE(zetGetContextProcAddrTable, zet_context_dditable_t)
EMPTY_TABLE(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
EMPTY_TABLE(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
EMPTY_TABLE(zetGetModuleProcAddrTable, zet_module_dditable_t)
EMPTY_TABLE(zetGetDebugProcAddrTable, zet_debug_dditable_t)
EMPTY_TABLE(zetGetMetricProcAddrTable, zet_metric_dditable_t)
EMPTY_TABLE(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
EMPTY_TABLE(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
EMPTY_TABLE(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
EMPTY_TABLE(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
EMPTY_TABLE(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)

EMPTY_TABLE(zesGetDeviceProcAddrTable, zes_device_dditable_t)
EMPTY_TABLE(zesGetDriverProcAddrTable, zes_driver_dditable_t)
EMPTY_TABLE(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)
EMPTY_TABLE(zesGetEngineProcAddrTable, zes_engine_dditable_t)
EMPTY_TABLE(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
EMPTY_TABLE(zesGetFanProcAddrTable, zes_fan_dditable_t)
EMPTY_TABLE(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
EMPTY_TABLE(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
EMPTY_TABLE(zesGetLedProcAddrTable, zes_led_dditable_t)
EMPTY_TABLE(zesGetMemoryProcAddrTable, zes_memory_dditable_t)
EMPTY_TABLE(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
EMPTY_TABLE(zesGetPowerProcAddrTable, zes_power_dditable_t)
EMPTY_TABLE(zesGetPsuProcAddrTable, zes_psu_dditable_t)
EMPTY_TABLE(zesGetRasProcAddrTable, zes_ras_dditable_t)
EMPTY_TABLE(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
EMPTY_TABLE(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
EMPTY_TABLE(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)

/* ---- control API ---- */

static int api_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < API_COUNT; i++)
        if (strcmp(api_names[i], name) == 0) return i;
    return -1;
}

EXPORT void hm_ze_test_reset(void) {
    pthread_once(&g_once, setup);
    lock();
    memset(g.calls, 0, sizeof g.calls);
    memset(g.inject, 0, sizeof g.inject);
    g.leaks = 0;
    unlock();
}

EXPORT void hm_ze_test_get_stats(hm_ze_test_stats_t *out) {
    pthread_once(&g_once, setup);
    hm_ze_test_stats_t s;
    memset(&s, 0, sizeof s);
    lock();
    s.context_create = g.calls[API_zeContextCreate] + g.calls[API_zeContextCreateEx];
    s.context_destroy = g.calls[API_zeContextDestroy];
    s.alloc_device = g.calls[API_zeMemAllocDevice];
    s.alloc_host = g.calls[API_zeMemAllocHost];
    s.alloc_shared = g.calls[API_zeMemAllocShared];
    s.free = g.calls[API_zeMemFree] + g.calls[API_zeMemFreeExt];
    s.ipc_get = g.calls[API_zeMemGetIpcHandle];
    s.ipc_open = g.calls[API_zeMemOpenIpcHandle];
    s.ipc_close = g.calls[API_zeMemCloseIpcHandle];
    s.fill = g.calls[API_zeCommandListAppendMemoryFill];
    s.copy = g.calls[API_zeCommandListAppendMemoryCopy];
    s.leaks = g.leaks;
    for (struct obj *o = g.objs; o; o = o->next) {
        if (o->kind == K_CONTEXT) s.live_contexts++;
        if (o->kind == K_EVENT) s.live_events++;
        if (o->kind == K_LIST) {
            const struct cmdlist *l = (const struct cmdlist *)(const void *)o;
            s.live_command_lists++;
            s.queued_commands += l->qn - l->qhead;
        }
    }
    for (size_t i = 0; i < g.nallocs; i++) {
        if (g.allocs[i]->fd >= 0) {
            s.live_allocs++;
        } else {
            s.live_ipc_mappings++;
            s.live_ipc_refs += g.allocs[i]->refs;
        }
    }
    for (unsigned i = 0; i < g.ndev; i++) s.device_used[i] = g_devices[i].used;
    s.host_used = g.host_used;
    unlock();
    if (out) *out = s;
}

EXPORT uint64_t hm_ze_test_call_count(const char *api_name) {
    pthread_once(&g_once, setup);
    int i = api_index(api_name);
    if (i < 0) return UINT64_MAX;
    lock();
    uint64_t n = g.calls[i];
    unlock();
    return n;
}

EXPORT int hm_ze_test_fail_next(const char *api_name, unsigned nth, ze_result_t result) {
    pthread_once(&g_once, setup);
    int i = api_index(api_name);
    if (i < 0 || (nth && result == ZE_RESULT_SUCCESS)) return -1;
    lock();
    g.inject[i].countdown = nth;
    g.inject[i].result = result;
    unlock();
    return 0;
}

EXPORT int hm_ze_test_set_option(const char *name, int value) {
    pthread_once(&g_once, setup);
    for (int i = 0; name && i < OPT_COUNT; i++)
        if (strcmp(option_names[i], name) == 0) {
            lock();
            g.opt[i] = value;
            unlock();
            return 0;
        }
    return -1;
}

EXPORT uint64_t hm_ze_test_run_queued(void) {
    pthread_once(&g_once, setup);
    lock();
    uint64_t n0 = g.ran_queued;
    progress(NULL, NULL);
    uint64_t n = g.ran_queued - n0;
    unlock();
    return n;
}

EXPORT void hm_ze_test_set_mem_limit(uint64_t bytes) {
    pthread_once(&g_once, setup);
    if (bytes == 0) return;
    lock();
    g.limit = bytes;
    unlock();
}
