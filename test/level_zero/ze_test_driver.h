/* hetmem tests — libze_test.so.1, a Level Zero driver for machines without
 * an Intel GPU, loaded by the real loader (libze_loader.so.1) through
 * ZE_ENABLE_ALT_DRIVERS=/abs/path/libze_test.so.1, and its control API.
 * SPDX-License-Identifier: MIT
 *
 * What the driver models
 *  - One driver with N GPU devices (env HM_ZE_TEST_DEVICES, 1..8, default 2):
 *    vendor 0x8086, device id 0x7a54 (made up), a UUID that is distinct per
 *    device and the same in every process (IPC peers compare them), no
 *    sub-devices, one memory (totalSize = maxMemAllocSize = the limit), one
 *    command queue group (compute + copy, fill patterns up to 128 bytes).
 *    The driver reports API version 1.4 and accepts any 1.x request.
 *  - Memory: every allocation is a memfd of its own (named
 *    "hm_ze_test:<asked size>" and sealed with F_SEAL_SHRINK | F_SEAL_GROW:
 *    neither its name nor its size can change, as a dma-buf's cannot).
 *    Device memory is handed
 *    out as a PROT_NONE mapping (a CPU touch faults, as on a GPU) and the
 *    driver keeps a private read-write alias of the same memfd for its
 *    command lists; host and shared memory are read-write MAP_SHARED
 *    mappings. Device and shared memory come in 64 KiB pages and are at
 *    least 64 KiB aligned; host memory in 4 KiB pages. Sizes are rounded up
 *    to a page inside the driver; zeMemGetAddressRange reports the size
 *    asked for, zeMemGetAllocProperties the page size.
 *  - Limits: device + shared memory count against their device, host memory
 *    (and shared memory with no device) against a host limit. Both are
 *    HM_ZE_TEST_DEVICE_MEM bytes (suffix K, M or G allowed; default 256 MiB)
 *    until hm_ze_test_set_mem_limit() changes them. maxMemAllocSize is half
 *    the limit (at least 64 KiB): real devices' is below their memory (4 GiB
 *    on many Intel GPUs; compute-runtime's "Allocations greater than 4GB").
 *    A request above it is ZE_RESULT_ERROR_UNSUPPORTED_SIZE unless the
 *    descriptor's pNext chain holds ze_relaxed_allocation_limits_exp_desc_t
 *    with ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE (ze_api.h: the
 *    device descriptor for device and shared memory, the host descriptor
 *    for host memory), which lets it go up to the limit. One that does not
 *    fit in what is left is ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY
 *    (ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY for the host limit): ze_api.h lists
 *    both for zeMemAllocDevice/Shared/Host.
 *  - Every allocation (and every opened IPC mapping) gets an id unique in
 *    the process for its life; ids are never reused.
 *  - Pointers belong to their context: zeMemFree, zeMemGetAllocProperties,
 *    zeMemGetAddressRange and zeMemGetIpcHandle see only the memory of the
 *    context they are given (anything else is foreign: UNKNOWN type, or
 *    ZE_RESULT_ERROR_INVALID_ARGUMENT). zeMemFree takes base pointers of
 *    allocations only; an opened IPC mapping is closed with
 *    zeMemCloseIpcHandle. Command lists resolve every pointer: the driver's
 *    memory of any context (device memory through the alias), anything else
 *    as plain process memory used directly. A range that starts in the
 *    driver's memory and runs past its allocation, or plain memory that runs
 *    into a driver mapping, is ZE_RESULT_ERROR_INVALID_SIZE.
 *  - zeContextDestroy with memory alive succeeds, frees that memory (and
 *    closes its opened IPC mappings) and counts each one in `leaks`; with
 *    command lists, queues or event pools alive it is
 *    ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE.
 *  - IPC (device memory only: host and shared memory are refused with
 *    ZE_RESULT_ERROR_INVALID_ARGUMENT, as are interior pointers and opened
 *    mappings). The 64-byte handle has the real Linux layout at its start:
 *      [0,8)   the allocation's memfd number, valid only in the exporter
 *      [8,16)  u64 offset (0)
 *      [16]    u8 memory type (ZE_MEMORY_TYPE_DEVICE)
 *    then the driver's own: [17] u8 device index, [18,20) u16 0x5a54 tag,
 *    [20,24) exporter pid, [24,32) allocation id, [32,40) size,
 *    [40,48) the memfd's st_ino, [48,56) st_dev, [56,64) a random nonce of
 *    the exporting process (new in each fork child).
 *    zeMemOpenIpcHandle needs the importer's own copy of the fd (SCM_RIGHTS
 *    or pidfd_getfd) written over bytes [0,8): an fd that is not open here
 *    or is another file (fstat st_ino/st_dev) is
 *    ZE_RESULT_ERROR_INVALID_ARGUMENT, as is an open in the exporting
 *    process itself. The driver does not keep or close that fd. The memory
 *    is mapped as device memory of the importer's hDevice (PROT_NONE view +
 *    alias, so command lists work on it). The mapping is the whole
 *    allocation the fd names: zeMemGetAddressRange on it reports its base
 *    and the allocation's size (the spec: "Retrieves the base address
 *    and/or size of an allocation"), read from the memfd, never from the
 *    handle's size bytes, which a peer may rewrite (a real driver sizes an
 *    imported dma-buf from the kernel object). Every open maps anew and
 *    returns a pointer of its own (ze_api.h, zeMemOpenIpcHandle: "Multiple
 *    calls to this function with the same IPC handle will return unique
 *    pointers"), each closed by its own zeMemCloseIpcHandle; option
 *    "ipc_open_same_pointer" makes a second open in the same context while
 *    the first is open return the same pointer with a reference (CUDA's
 *    way), each close dropping one. A handle stays
 *    openable as long as some process holds its fd: the memfd keeps the
 *    pages after the exporter's zeMemFree, as a dma-buf does. After the
 *    exporter frees an allocation and a new one lands at the same address,
 *    its handle differs (another fd, allocation id, st_ino): an importer
 *    that keys opened mappings by the exporter's address alone maps the
 *    old memory (MPICH's false cache hits; the notes' "unique id").
 *  - Command lists: fill (power-of-two patterns of 1..128 bytes; a size
 *    that is not a multiple ends with a partial pattern), copy, barrier,
 *    signal/wait/reset event. No fences: hFence must be NULL. Every append
 *    checks its arguments (handles, ranges) when it is made.
 *    Immediate lists (zeCommandListCreateImmediate) follow their mode
 *    (ze_api.h, ze_command_queue_mode_t):
 *      SYNCHRONOUS: "Device execution always completes immediately on
 *        execute; Host thread is blocked": each command runs before the
 *        append returns.
 *      ASYNCHRONOUS: "Device execution is scheduled and will complete in
 *        future; explicit synchronization object must be used to determine
 *        completeness"; and DEFAULT ("driver-based heuristics": a program
 *        cannot count on either): the append queues the command and
 *        returns. Queued commands run in order per list, and only while the
 *        host waits: zeEventHostSynchronize with a nonzero timeout (until
 *        that event is signaled; ze_api.h: timeout 0 "operates exactly like
 *        zeEventQueryStatus"), a command of a synchronous list or of an
 *        executed queue that waits on an event, zeMemFree / zeMemFreeExt /
 *        zeMemCloseIpcHandle of memory a queued command uses (until none
 *        does: ze_api.h "The application must ensure the device is not
 *        currently referencing the memory before it is freed", and
 *        compute-runtime's zeMemFree waits for the engines that used the
 *        allocation), zeCommandListDestroy of the list (until it is empty;
 *        ze_api.h asks the same of a destroyed list), the library's
 *        teardown, and hm_ze_test_run_queued() (the device catching up
 *        while the host does something else). zeEventQueryStatus runs
 *        nothing, so a test sees a queued signal pending. A queued command
 *        waiting on an unsignaled event holds its list; other lists go on.
 *        A queued command whose memory was freed since the append (only
 *        possible while it waits on an event) faults when it runs: its
 *        list's queued work is dropped, the events that work was to signal
 *        are lost (zeEventHostSynchronize: ZE_RESULT_ERROR_DEVICE_LOST,
 *        ze_api.h: it returns "until complete or device is lost"), and
 *        every later append to the list is ZE_RESULT_ERROR_DEVICE_LOST.
 *        Level Zero 1.4 has no zeCommandListHostSynchronize (1.6): wait on
 *        an event signaled at the end of the work.
 *    Option "immediate_synchronous" runs every immediate list's commands
 *    at once whatever its mode (the driver's earlier model).
 *    Regular lists record commands, run them at
 *    zeCommandQueueExecuteCommandLists (closed lists only; the queue's mode
 *    is not modelled: zeCommandQueueSynchronize has nothing to wait for)
 *    and re-check their memory then (memory freed since:
 *    ZE_RESULT_ERROR_DEVICE_LOST, as a GPU page fault is).
 *  - Events: pools and events with host signal/reset/query/synchronize.
 *    No other thread runs while one is in the driver, so a wait that
 *    neither queued work nor the calling host thread can end — a
 *    synchronous list's command waiting on an event nobody signals, or
 *    zeEventHostSynchronize of one — is ZE_RESULT_ERROR_NOT_AVAILABLE
 *    (command) or ZE_RESULT_NOT_READY (synchronize) whatever the timeout,
 *    where a real driver would block. zeEventDestroy of an event a queued
 *    command names (signal, reset or wait) is
 *    ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE (ze_api.h: "The application must
 *    ensure the device is not currently referencing the event before it is
 *    deleted"; a real driver frees it under the command).
 *  - Handles are pointers to objects the driver keeps in registries: NULL is
 *    ZE_RESULT_ERROR_INVALID_NULL_HANDLE, a pointer the driver did not hand
 *    out (or already destroyed) ZE_RESULT_ERROR_INVALID_ARGUMENT; the driver
 *    never reads through an unknown handle.
 *  - Calls before the driver's zeInit are ZE_RESULT_ERROR_UNINITIALIZED.
 *    zeInit is idempotent and thread-safe. All entry points are thread-safe
 *    (one mutex, taken around fork by pthread_atfork handlers so that a
 *    child never inherits it held).
 *  - Fork: in a fork child every call, zeInit included, is
 *    ZE_RESULT_ERROR_UNINITIALIZED. The loader runs zeInit once per address
 *    space (a child inherits it done) and the driver's device state is the
 *    parent's: intel/compute-runtime#954 ("fork() is broken for Level Zero
 *    on Linux when the parent has already initialized the driver ... the
 *    child either deadlocks on its first GPU call or gets 0 drivers").
 *    Option "fork_child_works" keeps the child working on the parent's
 *    state. A process started by exec is new: the driver works there.
 *  - Teardown: the library's destructor (at exit, or when the loader
 *    unloads it) tears the driver down; every later call is
 *    ZE_RESULT_ERROR_UNINITIALIZED (what loaders from 1.17 answer in
 *    teardown, zelCheckIsLoaderInTearDown; loader 1.8 has no such check and
 *    calls through freed state) and writes one line to the descriptor
 *    named by HM_ZE_TEST_TEARDOWN_REPORT, where set.
 *  - Every zes and zet table is empty; so are the Fence, Image, Kernel,
 *    Module, ModuleBuildLog, PhysicalMem, Sampler and VirtualMem tables.
 *    Loader 1.8.12 answers a call to an empty slot with
 *    ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, but with
 *    ZE_RESULT_ERROR_UNINITIALIZED when its intercept is on
 *    (ZE_ENABLE_LOADER_INTERCEPT=1), validation layer or not.
 *  - Level Zero 1.4 (the headers this is built with) has no
 *    zeCommandListHostSynchronize, zeMemPutIpcHandle or zeInitDrivers slot;
 *    the driver has none of them.
 *
 * Control API
 * A test reaches these through the very library the loader loaded:
 *     void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  (after zeInit)
 *     hm_ze_test_get_stats_fn get = (hm_ze_test_get_stats_fn)dlsym(h, "hm_ze_test_get_stats");
 * with `path` exactly the string given in ZE_ENABLE_ALT_DRIVERS. They may be
 * called at any time, from any thread, also before zeInit.
 */
#ifndef HM_ZE_TEST_DRIVER_H
#define HM_ZE_TEST_DRIVER_H

#include <level_zero/ze_api.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_ZE_TEST_MAX_DEVICES 8

/* Counters since the last hm_ze_test_reset(). A call counts whatever its
 * result (an injected failure and a refused argument too), but only calls
 * that reach the driver: the loader's validation layer answers some
 * itself. The live_* fields are states, not counters: reset leaves them. */
typedef struct hm_ze_test_stats {
    uint64_t context_create;  /* zeContextCreate + zeContextCreateEx */
    uint64_t context_destroy;
    uint64_t alloc_device, alloc_host, alloc_shared;
    uint64_t free;            /* zeMemFree + zeMemFreeExt */
    uint64_t ipc_get, ipc_open, ipc_close;
    uint64_t fill, copy;      /* appends, on any command list */
    uint64_t leaks;           /* memory freed by zeContextDestroy */
    uint64_t live_contexts;
    uint64_t live_allocs;       /* allocations made and not freed */
    uint64_t live_ipc_mappings; /* opened IPC mappings (one per pointer) */
    uint64_t live_ipc_refs;     /* references on them (opens not yet closed) */
    uint64_t live_command_lists;
    uint64_t device_used[HM_ZE_TEST_MAX_DEVICES]; /* bytes, rounded to pages */
    uint64_t host_used;
    uint64_t live_events;
    uint64_t queued_commands; /* on asynchronous immediate lists, not yet run */
} hm_ze_test_stats_t;

/* Counters to 0 and every pending failure injection dropped. */
void hm_ze_test_reset(void);
typedef void (*hm_ze_test_reset_fn)(void);

void hm_ze_test_get_stats(hm_ze_test_stats_t *out);
typedef void (*hm_ze_test_get_stats_fn)(hm_ze_test_stats_t *out);

/* Calls of one entry point by its API name ("zeMemAllocDevice",
 * "zeCommandListAppendMemoryFill", ...) since the last reset; UINT64_MAX for
 * a name the driver does not implement. */
uint64_t hm_ze_test_call_count(const char *api_name);
typedef uint64_t (*hm_ze_test_call_count_fn)(const char *api_name);

/* The nth next call of api_name (nth = 1: the next one) returns `result`
 * at once, touching nothing (no out-parameter, no state; it still counts
 * as a call). One injection per API: a new one replaces the old; nth = 0
 * cancels. Returns 0, or -1 for a name the driver does not implement or a
 * `result` of ZE_RESULT_SUCCESS. */
int hm_ze_test_fail_next(const char *api_name, unsigned nth, ze_result_t result);
typedef int (*hm_ze_test_fail_next_fn)(const char *api_name, unsigned nth, ze_result_t result);

/* Lenient behaviours, off by default, by name; value 1 turns one on, 0 off.
 * Returns 0, or -1 for an unknown name. The options are inherited by fork
 * children (set them before fork()).
 *   "fork_child_works"       a fork child keeps using the driver and the
 *                            parent's handles (a real driver does not)
 *   "ipc_open_same_pointer"  a second zeMemOpenIpcHandle of a handle that is
 *                            open in the context returns the same pointer
 *                            and takes a reference (CUDA's behaviour; the
 *                            Level Zero spec promises unique pointers)
 *   "immediate_synchronous"  immediate lists created from then on run each
 *                            command at once whatever their mode */
int hm_ze_test_set_option(const char *name, int value);
typedef int (*hm_ze_test_set_option_fn)(const char *name, int value);

/* The device catches up: every queued command that can run runs (as if
 * the host waited for all of them). Returns how many ran. */
uint64_t hm_ze_test_run_queued(void);
typedef uint64_t (*hm_ze_test_run_queued_fn)(void);

/* The limit of every device and of host memory, in bytes (> 0), for the
 * allocations that follow; live memory stays. Also what
 * zeDeviceGetMemoryProperties and maxMemAllocSize report from then on. */
void hm_ze_test_set_mem_limit(uint64_t bytes);
typedef void (*hm_ze_test_set_mem_limit_fn)(uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif
