/* hetmem tests — libcuda.so.1, a CUDA driver for machines without an NVIDIA
 * GPU, and its control API. It is loaded where the real libcuda.so.1 would
 * be: by absolute path, through HM_CUDA_DRIVER, or by LD_LIBRARY_PATH
 * pointing at its directory (the file is libcuda.so.1, and so is its
 * SONAME). It links only libc and pthread.
 * SPDX-License-Identifier: MIT
 *
 * What the driver models (driver API 13.0, cuDriverGetVersion: 13000). By
 * default it behaves as NVIDIA's driver does, restrictions included, and
 * names the source of each behaviour; the lenient behaviours of earlier
 * test drivers are options a test asks for (HM_CUDA_TEST_LENIENT below).
 *  - Entry points: the versioned names declared in cuda_decls.h, which is
 *    what cuda.h 13.0 maps the plain names to. The plain symbols that are
 *    older ABIs in the real driver (cuMemAlloc, cuMemFree, cuMemAllocHost,
 *    cuMemGetAddressRange, cuMemGetInfo, cuDeviceTotalMem, cuMemcpyHtoD,
 *    cuMemcpyDtoH, cuMemcpyDtoD, cuMemsetD8, cuCtxCreate, cuCtxDestroy,
 *    cuCtxPushCurrent, cuCtxPopCurrent, cuDevicePrimaryCtxRelease,
 *    cuIpcOpenMemHandle, cuMemHostGetDevicePointer, cuGetProcAddress,
 *    cuStreamDestroy, cuEventDestroy; cuda.h
 *    13.0's "#define cuMemHostGetDevicePointer cuMemHostGetDevicePointer_v2"
 *    and its like) are exported too and abort with a
 *    message naming the versioned symbol: the real driver would take 32-bit
 *    sizes or old semantics without a word. cuDeviceGetUuid (same ABI as
 *    _v2; they differ only for MIG) works. cuCtxGetDevice_v2 and
 *    cuCtxSynchronize_v2 (CUDA 13: a context argument, NULL for the
 *    current one) exist next to the plain ones.
 *  - cuGetProcAddress_v2 takes the base name ("cuMemAlloc") and returns the
 *    variant the given CUDA version gets on a real driver (13000:
 *    cuMemAlloc_v2, cuCtxCreate_v4, cuCtxGetDevice_v2; 3000: the aborting
 *    cuMemAlloc). Unknown names, versioned names ("cuMemAlloc_v2") and
 *    variants this driver lacks (cuCtxCreate_v3) are CUDA_ERROR_NOT_FOUND,
 *    *pfn NULL, status SYMBOL_NOT_FOUND; a version older than the symbol
 *    is CUDA_ERROR_NOT_FOUND with VERSION_NOT_SUFFICIENT; a version above
 *    13000 or unknown flags CUDA_ERROR_INVALID_VALUE. (cuda.h documents
 *    CUDA_SUCCESS with a NULL *pfn for a missing symbol: a caller should
 *    accept both.) The per-thread-stream flag returns the same functions:
 *    there are no _ptds/_ptsz variants. The stream and event calls are in
 *    the table under their base names (cuStreamDestroy: cuStreamDestroy_v2
 *    from 4000, the aborting old ABI before; likewise cuEventDestroy;
 *    cuStreamWaitEvent and cuMemsetD8Async from 3020, cuMemcpyAsync from
 *    4000, the others from 2000: the versions of cudaTypedefs.h's PFN_
 *    names).
 *  - Initialization: every call but cuInit, cuDriverGetVersion,
 *    cuGetErrorName/String and cuGetProcAddress_v2 is
 *    CUDA_ERROR_NOT_INITIALIZED before a successful cuInit(0).
 *    cuInit(flags != 0) is CUDA_ERROR_INVALID_VALUE; cuInit is idempotent
 *    and thread-safe; with HM_CUDA_TEST_DEVICES=0 it is
 *    CUDA_ERROR_NO_DEVICE and the driver stays uninitialized.
 *  - Fork: in a child of a process where cuInit succeeded every entry point
 *    (cuInit included) is CUDA_ERROR_NOT_INITIALIZED, for good: CUDA does
 *    not survive fork (NVIDIA CUDA C++ Guidelines for robust and
 *    safety-critical programming, rule 1.6: "CUDA does not duplicate any of
 *    its internal data structures or threads to other processes upon a call
 *    to fork"; the CUDA C Programming Guide, Initialization; observed as
 *    CUDA_ERROR_NOT_INITIALIZED, test/gpu_check/nvidia_expected.csv
 *    fork_child). The child never runs the parent's queued work. The
 *    control API keeps working there. LENIENT_FORK: the child keeps a
 *    working driver with a nonce of its own, sharing device memory with the
 *    parent (MAP_SHARED memfds), which no real driver gives.
 *  - Teardown: cuInit registers an atexit handler (__cxa_atexit, tied to
 *    the library, so that a dlclose runs it too); once it has run (at
 *    exit(), or at hm_cuda_test_teardown()) the queued work is done and
 *    every entry point is CUDA_ERROR_DEINITIALIZED (cuda.h: "the CUDA
 *    driver is in the process of shutting down"), so an atexit handler
 *    registered before cuInit, or a destructor, that calls the driver sees
 *    what it sees on a real one. Nothing is unmapped. LENIENT_EXIT: the
 *    handler does nothing (hm_cuda_test_teardown still works).
 *  - Sticky errors (hm_cuda_test_fail_sticky): once the injected failure
 *    fires, every later call but cuGetErrorName, cuGetErrorString and
 *    cuDriverGetVersion returns the same result (cuda.h,
 *    CUDA_ERROR_ILLEGAL_ADDRESS: "This leaves the process in an
 *    inconsistent state and any further CUDA work will return the same
 *    error. To continue using CUDA, the process must be terminated and
 *    relaunched."), until hm_cuda_test_reset().
 *  - Order of the checks at every entry: fork child, torn down, an injected
 *    failure, a sticky error, not initialized. The stream and event calls
 *    go through the same entry, so all of this holds for them too; a fork
 *    child keeps no queued work (what its copies of the parent's events
 *    captured counts as done).
 *  - Devices: HM_CUDA_TEST_DEVICES (0..8, default 1: a test that needs
 *    peers asks for them) devices, ordinals
 *    0..n-1 (others: CUDA_ERROR_INVALID_DEVICE). Name "hetmem CUDA test
 *    device <i>"; UUID "hmcudatestdev" + 0,0 + i (16 bytes), the same in
 *    every process; PCI domain 0, bus i + 1, device 0; compute capability
 *    9.0; unified addressing, managed memory, concurrent managed access,
 *    host pointer for registered memory, map host memory, memory pools and
 *    IPC-event support (the documented probe for IPC) are 1,
 *    MEMPOOL_SUPPORTED_HANDLE_TYPES is POSIX_FILE_DESCRIPTOR; pageable
 *    memory access, virtual memory management, POSIX fd handles,
 *    host register, RDMA and integrated are 0; every other valid attribute
 *    is 0; attributes outside 1..CU_DEVICE_ATTRIBUTE_MAX-1 are
 *    CUDA_ERROR_INVALID_VALUE. cuDeviceCanAccessPeer: 1 between distinct
 *    devices (hm_cuda_test_set_peer_access changes that), 0 for a device
 *    and itself.
 *  - Contexts: each device has a primary context (a fixed handle), active
 *    while retained: cuDevicePrimaryCtxRetain counts up,
 *    cuDevicePrimaryCtxRelease_v2 down (CUDA_ERROR_INVALID_CONTEXT at 0);
 *    the last release resets it: what was allocated in it and the IPC
 *    mappings opened in it are freed (counted in `leaks`). cuCtxCreate_v2
 *    and cuCtxCreate_v4 (ctxCreateParams NULL; affinity or CIG parameters
 *    are CUDA_ERROR_NOT_SUPPORTED) make a context and push it on the
 *    calling thread's stack; cuCtxDestroy_v2 frees its memory and mappings
 *    (counted in `leaks`; cuMemAllocAsync memory stays, as on a real
 *    driver) and pops it if it is on top of the caller's stack. Destroying
 *    a primary context is CUDA_ERROR_INVALID_CONTEXT. Context handles are
 *    never reused, so a stale one is always recognised.
 *  - The current context is per thread: a stack of up to 64 (push, pop,
 *    set replaces the top, NULL set pops; a push beyond 64 is
 *    CUDA_ERROR_OUT_OF_MEMORY). A new thread has none. The calls that need
 *    one (allocations and frees of every kind, memset and copies,
 *    cuMemGetInfo_v2, cuMemGetAddressRange_v2, the three IPC calls,
 *    cuCtxGetDevice, cuCtxSynchronize and their _v2 with NULL, the calls
 *    given a default stream, cuStreamCreate, cuEventCreate,
 *    cuPointerGetAttribute of DEVICE_POINTER) are
 *    CUDA_ERROR_INVALID_CONTEXT without one, and
 *    CUDA_ERROR_CONTEXT_IS_DESTROYED when it is destroyed or is a primary
 *    context not retained; the other pointer attributes, device queries
 *    and cuMemGetAllocationGranularity need none. Set/push take any
 *    context the driver handed out that is not destroyed (an inactive
 *    primary one too).
 *  - One address space (UVA): memory of every context is found by every
 *    call whatever context is current (cuMemFree_v2 frees another
 *    context's memory); CU_POINTER_ATTRIBUTE_CONTEXT tells whose it is.
 *  - The reservation: the first successful cuInit reserves 64 GiB of
 *    addresses at the same fixed address in every process (PROT_NONE,
 *    MAP_NORESERVE, MAP_FIXED_NOREPLACE), as the real driver reserves its
 *    unified address range at initialization (CUDA driver API, Unified
 *    Addressing: "a single virtual address space ... for all memory in the
 *    process"; the same range in every process is what lets an importer
 *    map an export at the exporter's address). Default 0x7e8000000000,
 *    inside ThreadSanitizer's "high app" range and AddressSanitizer's
 *    HighMem on x86-64, so that fixed mappings work in both;
 *    HM_CUDA_TEST_VA_BASE (a 2 MiB aligned address) overrides it;
 *    hm_cuda_test_va_base() tells it. A reservation that cannot be made
 *    (the range is taken) fails cuInit with CUDA_ERROR_OUT_OF_MEMORY and a
 *    line on stderr. Device memory, opened IPC mappings and the device
 *    addresses of write-combined memory live inside it; a freed range is
 *    reserved again (PROT_NONE) and given back.
 *  - Placement: a freed range is handed out again, most recently freed
 *    first (LIFO), so that allocating the size just freed returns the same
 *    address, as the real driver does (test/gpu_check/nvidia_expected.csv
 *    reuse_address; UCX's cuda_ipc cache and Open MPI's rgpusm exist to
 *    survive it); otherwise the lowest free address that fits.
 *    Allocations below 2 MiB take 4 KiB units at 4 KiB alignment, packed
 *    one after the other (cuMemAlloc promises only "suitably aligned for
 *    any kind of variable", i.e. 256 bytes); from 2 MiB on, 2 MiB units at
 *    2 MiB alignment. LENIENT_ALIGN: 2 MiB units and alignment for every
 *    size; LENIENT_NO_REUSE: each search starts above the last address
 *    handed out (wrapping around at the end), so a freed address comes back
 *    only after the rest of the reservation.
 *  - Device memory (cuMemAlloc_v2, cuMemAllocAsync): a memfd per
 *    allocation (named "hm_cuda_test:<asked size>" and sealed with
 *    F_SEAL_SHRINK | F_SEAL_GROW, so that neither the name nor the size can
 *    change: an exporter cannot resize memory under its importers, as with
 *    a real allocation), as long as the allocation spans, mapped MAP_FIXED
 *    PROT_NONE at its place in the reservation (a CPU touch faults), with a
 *    private read-write alias the copy and memset calls use. Size 0 is
 *    CUDA_ERROR_INVALID_VALUE. Each device has a limit (HM_CUDA_TEST_DEVICE_MEM
 *    bytes, suffix K, M or G allowed; default 256 MiB;
 *    hm_cuda_test_set_mem_limit) charged with what each allocation spans
 *    (4 KiB-rounded below 2 MiB, 2 MiB-rounded from 2 MiB on): past it,
 *    CUDA_ERROR_OUT_OF_MEMORY. cuMemGetInfo_v2 and cuDeviceTotalMem_v2
 *    report the limit and what is left of it. cuMemGetAllocationGranularity
 *    is 2 MiB (minimum and recommended) for pinned memory on a device
 *    location; anything else is CUDA_ERROR_INVALID_VALUE.
 *  - Virtual memory management (cuda.h 13.0, "Virtual Memory Management"
 *    section; none of these names is versioned; cuGetProcAddress_v2 has
 *    them from 10020, cuMemRetainAllocationHandle from 11000). No current
 *    context is needed. A physical allocation (cuMemCreate) is a memfd named
 *    "hm_cuda_test_vmm<device>:<size>", sealed like device memory; the
 *    handle encodes an id (never reused, never a pointer).
 *    cuMemCreate: size a non-zero multiple of the granularity, flags 0
 *    ("must be a multiple of the value given via
 *    cuMemGetAllocationGranularity ... MINIMUM", "flags for future use, must
 *    be zero now"), else CUDA_ERROR_INVALID_VALUE; prop: PINNED on a DEVICE
 *    location (else CUDA_ERROR_INVALID_VALUE; a device out of range
 *    CUDA_ERROR_INVALID_DEVICE); requestedHandleTypes NONE or
 *    POSIX_FILE_DESCRIPTOR; FABRIC is CUDA_ERROR_NOT_SUPPORTED (the test
 *    driver has no IMEX channel) unless HM_CUDA_TEST_FABRIC=1 (below); the
 *    Win32 types CUDA_ERROR_INVALID_VALUE.
 *    The size is charged to the device's limit like cuMemAlloc_v2 (past it
 *    CUDA_ERROR_OUT_OF_MEMORY); an import charges nothing.
 *    Lifetime (cuMemRelease: "freed when all outstanding mappings to the
 *    memory are unmapped and when all outstanding references to the handle
 *    ... are also released"): create, import and each
 *    cuMemRetainAllocationHandle (which returns "the same handle value used
 *    to map the memory") take a reference, cuMemRelease drops one; the
 *    memory goes at the last release or unmap, whichever is later. A
 *    released handle is unknown to every call (cuda.h: undefined; here
 *    CUDA_ERROR_INVALID_VALUE).
 *    cuMemAddressReserve: size and addr multiples of the host page,
 *    alignment 0 (2 MiB) or a power of two, flags 0, else
 *    CUDA_ERROR_INVALID_VALUE; the range comes from the driver's reservation
 *    (as device memory does): at addr when that is free and aligned ("a
 *    hint"), else where the placement rules below put it. cuMemAddressFree:
 *    exactly a reserved (ptr, size) ("The size must match ... the ptr given
 *    must match"), with nothing mapped in it (cuda.h does not say; here
 *    CUDA_ERROR_INVALID_VALUE), else CUDA_ERROR_INVALID_VALUE.
 *    cuMemMap: ptr and size granularity multiples, inside one reservation,
 *    not mapped yet ("can only create mappings on VA range reservations that
 *    are not currently mapped"), size not past the allocation, offset 0
 *    ("Note: currently must be zero"), flags 0, else
 *    CUDA_ERROR_INVALID_VALUE. A mapping is the memfd MAP_FIXED PROT_NONE
 *    at ptr (a CPU touch faults) with a private read-write alias, as device
 *    memory; it starts without access for every device ("cuMemMap does not
 *    make the address accessible"). cuMemUnmap: whole mappings only ("cannot
 *    unmap a sub-range"), after the queued work; the range is a reservation
 *    again. cuMemSetAccess: the range a run of whole adjacent mappings ("a
 *    fully mapped address range"), DEVICE locations (a bad ordinal
 *    CUDA_ERROR_INVALID_DEVICE), flags PROT_NONE or PROT_READWRITE; PROT_READ
 *    is CUDA_ERROR_NOT_SUPPORTED (the test driver models read-write or
 *    nothing). cuMemGetAccess: the flags of the mapping at ptr for a device.
 *    The memset and copy calls take a mapping whose own device has
 *    read-write access, and refuse one without it with
 *    CUDA_ERROR_INVALID_VALUE (cuda.h names no error for it: on hardware the
 *    access faults). cuMemFree_v2 and cuIpcGetMemHandle refuse a mapping.
 *    cuMemGetAddressRange_v2 gives the mapping's base and size (cuda.h,
 *    RANGE_SIZE: "To retrieve the size of the mapped region, see
 *    cuMemGetAddressRange"); RANGE_START_ADDR and RANGE_SIZE give its
 *    reservation's ("the mappable address range ptr references (e.g. from
 *    cuMemAddressReserve)"). Other attributes: memory type DEVICE, the
 *    allocation's device, its own BUFFER_ID, MAPPED 1, no context (NULL),
 *    not IPC-capable; MAPPING_*, ALLOWED_HANDLE_TYPES and ACCESS_FLAGS are
 *    not answered.
 *    cuMemExportToShareableHandle: POSIX_FILE_DESCRIPTOR, when requested at
 *    creation (else CUDA_ERROR_INVALID_VALUE), writes an int: a new O_CLOEXEC
 *    descriptor of the memfd, the caller's to close and to pass on
 *    (SCM_RIGHTS, pidfd_getfd); FABRIC CUDA_ERROR_NOT_SUPPORTED; flags 0.
 *    cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
 *    POSIX_FILE_DESCRIPTOR) takes a memfd of this driver (name and seals,
 *    its size the named one), else CUDA_ERROR_INVALID_VALUE; a device this
 *    process lacks is CUDA_ERROR_NOT_SUPPORTED ("If the current process
 *    cannot support the memory described by this shareable handle"); it
 *    keeps its own descriptor, and each import is a new handle ("no
 *    guarantee that the contents of handle will be the same"). FABRIC:
 *    CUDA_ERROR_NOT_SUPPORTED. cuMemGetAllocationPropertiesFromHandle: type,
 *    location and requestedHandleTypes as created (an import: the type it
 *    was imported by).
 *    Fabric handles, only with HM_CUDA_TEST_FABRIC=1 (read at the first
 *    call; otherwise FABRIC is CUDA_ERROR_NOT_SUPPORTED everywhere and the
 *    attribute 0): CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 1
 *    (cuda.h: "Device supports exporting memory to a fabric handle with
 *    cuMemExportToShareableHandle() or requested with cuMemCreate()");
 *    cuMemCreate accepts FABRIC (alone or with POSIX_FILE_DESCRIPTOR);
 *    cuMemExportToShareableHandle(FABRIC), when requested at creation (else
 *    CUDA_ERROR_INVALID_VALUE), writes 64 bytes (CUmemFabricHandle) by value:
 *      [0,4) magic 0x42464d48 ("HMFB")  [4,8) exporter pid  [8,12) the
 *      memfd's number there  [12,16) device ordinal  [16,24) size
 *      [24,32) a random nonce per allocation  [32,40) st_ino  [40,48)
 *      st_dev  [48,64) zero;
 *    the nonce is kept as the file offset of the exporter's open file
 *    description (shared by every duplicate of it, pidfd_getfd's too).
 *    cuMemImportFromShareableHandle(&h, &fabric_handle, FABRIC) fetches the
 *    memfd (pidfd_open + pidfd_getfd: same user, ptrace access to the
 *    exporter, as the IPC layer's own transport needs) and checks name,
 *    seals, size, st_ino/st_dev and nonce: anything else (a forged or
 *    stale value, an exporter gone) is CUDA_ERROR_INVALID_VALUE, a refused
 *    pidfd_getfd CUDA_ERROR_NOT_PERMITTED (cuda.h's error for an importer
 *    without access to the exporter's IMEX channel), a device this process
 *    lacks CUDA_ERROR_NOT_SUPPORTED. Whether the real driver imports a
 *    fabric handle in the exporting process itself is not documented; here
 *    it does.
 *  - cuMemAllocAsync/cuMemFreeAsync run synchronously (a current context
 *    needed), on the device of the stream's context (cuda.h, cuMemAllocAsync:
 *    "allocates from the current mempool of the provided stream's device");
 *    streams as below. Async memory comes from
 *    the device's default pool (cuDeviceGetDefaultMemPool,
 *    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE), is not IPC-capable, and is freed
 *    by cuMemFreeAsync or cuMemFree_v2; cuMemFreeAsync also takes
 *    cuMemAlloc_v2 memory.
 *  - Memory pools with IPC (cuda.h 13.0, "Stream Ordered Memory Allocator";
 *    no versioned names; cuGetProcAddress_v2 has them from 11020). No
 *    current context is needed but for a default stream. cuMemPoolCreate:
 *    allocType PINNED, win32SecurityAttributes NULL and reserved all 0
 *    (cuda.h: "required to be zero", "must be 0"), else
 *    CUDA_ERROR_INVALID_VALUE; a DEVICE location (a bad ordinal
 *    CUDA_ERROR_INVALID_DEVICE; HOST and HOST_NUMA pools, a non-zero usage
 *    and FABRIC: CUDA_ERROR_NOT_SUPPORTED; Win32 types
 *    CUDA_ERROR_INVALID_VALUE); handleTypes NONE or POSIX_FILE_DESCRIPTOR.
 *    Its capacity is maxSize (0: the device's limit), 2 MiB-rounded. A pool
 *    is one memfd named "hm_cuda_test_pool<device>:<capacity>", sealed: a
 *    header of 32-byte slots, one per 4 KiB of capacity, then the capacity.
 *    cuMemAllocFromPoolAsync (synchronous, like cuMemAllocAsync; the stream
 *    checked as below) takes a run of the capacity (4 KiB units below
 *    2 MiB, 2 MiB units from 2 MiB on), maps it in the reservation like
 *    device memory and charges the pool's device; its first unit's slot
 *    holds the allocation's id, size, span and importer count. Past the
 *    capacity or the device's limit: CUDA_ERROR_OUT_OF_MEMORY; an imported
 *    pool CUDA_ERROR_INVALID_VALUE (cuda.h: "imported memory pools may not
 *    be used in ... cuMemAllocFromPoolAsync calls"); a device's default pool:
 *    async memory, as cuMemAllocAsync. Pool memory belongs to no context
 *    (cuda.h, cuCtxDestroy: "will not destroy memory allocations by ...
 *    cuMemAllocFromPoolAsync"; CONTEXT NULL; MEMPOOL_HANDLE its pool).
 *    cuMemFree_v2 and cuMemFreeAsync free it: its slot is cleared and its
 *    memory punched out of the memfd. cuMemPoolDestroy of a created or
 *    imported pool returns at once; the handle is unknown from then on
 *    (CUDA_ERROR_INVALID_VALUE), the pool goes with its last allocation or
 *    import ("released automatically once there are no more outstanding
 *    allocations"); a default pool is CUDA_ERROR_INVALID_VALUE.
 *    cuMemPoolExportToShareableHandle (POSIX_FILE_DESCRIPTOR of a pool
 *    created with it, flags 0; else CUDA_ERROR_INVALID_VALUE; FABRIC
 *    CUDA_ERROR_NOT_SUPPORTED) writes an int: a new O_CLOEXEC descriptor of
 *    the pool's memfd. cuMemPoolImportFromShareableHandle(&p, (void
 *    *)(uintptr_t)fd, POSIX_FILE_DESCRIPTOR, 0) takes a pool memfd of this
 *    driver (name, seals, size), else CUDA_ERROR_INVALID_VALUE; a device
 *    this process lacks CUDA_ERROR_NOT_SUPPORTED; it keeps its own
 *    descriptor. cuMemPoolExportPointer: a pointer into an allocation of a
 *    POSIX_FILE_DESCRIPTOR pool (an interior one names the whole allocation;
 *    cuda.h does not say), else CUDA_ERROR_INVALID_VALUE; the 64 bytes:
 *      [0,4) magic 0x50504d48 ("HMPP")  [4,8) exporter pid  [8,12) device
 *      [12,16) 0  [16,24) allocation id  [24,32) offset in the capacity
 *      [32,40) size  [40,48) the memfd's st_ino  [48,56) its st_dev
 *      [56,64) the allocation's address in the exporter.
 *    cuMemPoolImportPointer(&ptr, imported pool, data): data of another
 *    pool, malformed, or naming no live allocation now (the slot at that
 *    offset holds another id or size: forged, freed by the exporter, or
 *    reused) is CUDA_ERROR_INVALID_VALUE, as is a created pool. It maps the
 *    allocation as device memory of the pool's device, at the exporter's
 *    address when free here, else the lowest free one; charges nothing;
 *    counts one importer in the slot. A second import of the same
 *    allocation returns the same pointer and takes a reference (cuda.h
 *    does not say). cuMemFree_v2 or cuMemFreeAsync of an imported pointer
 *    drops one; the last unmaps it ("The pointer may be freed with cuMemFree
 *    or cuMemFreeAsync"). cuda.h: "The imported memory must be freed from
 *    all importing processes before being freed in the exporting process":
 *    an exporter's free while importers still map it succeeds, counts in
 *    `pool_early_frees`, and leaves the importers a mapping whose contents
 *    are undefined (here zeros, or a later allocation at that offset); its
 *    data is refused from then on, and the importers' frees still unmap.
 *  - Streams: every call that takes a stream accepts NULL and
 *    CU_STREAM_LEGACY (the legacy default stream of the current context),
 *    CU_STREAM_PER_THREAD (the calling thread's default stream of the
 *    current context) and live streams of cuStreamCreate; anything else
 *    (a destroyed stream, an event, a stream of a context that ended) is
 *    CUDA_ERROR_INVALID_HANDLE. The default streams need a usable current
 *    context; a created stream names its own (cuStreamSynchronize,
 *    cuStreamQuery and cuStreamDestroy_v2 of one need none current: to be
 *    confirmed on hardware). cuStreamCreate (a current context needed;
 *    Flags CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING, cuda.h's "Valid
 *    values"; others CUDA_ERROR_INVALID_VALUE) makes a stream of the
 *    current context. cuStreamDestroy_v2 of a stream with queued work
 *    returns at once and the work still runs (cuda.h: "the function will
 *    return immediately and the resources associated with hStream will be
 *    released automatically once the device has completed all work").
 *    Handles are never reused (like contexts): a destroyed one stays
 *    unknown. A context's end (cuCtxDestroy_v2, the last primary release)
 *    runs the queue and destroys its streams and events.
 *  - Events: cuEventCreate (a current context needed; Flags any of
 *    CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS,
 *    the last only with DISABLE_TIMING, cuda.h: "CU_EVENT_INTERPROCESS must
 *    be specified along with CU_EVENT_DISABLE_TIMING"; other bits
 *    CUDA_ERROR_INVALID_VALUE) makes an event of the current context.
 *    cuEventRecord(ev, stream) marks the current end of the queue (more
 *    than the stream's work: a superset, so it never completes early);
 *    recording again moves the mark (cuda.h: "will overwrite the previously
 *    captured state"); an event and a stream of different contexts are
 *    CUDA_ERROR_INVALID_HANDLE (cuda.h: "hEvent and hStream must be from
 *    the same context otherwise CUDA_ERROR_INVALID_HANDLE is returned").
 *    An event is complete once the queue has run up to its mark; one never
 *    recorded is complete (cuda.h: "Before the first call to
 *    cuEventRecord(), an event represents an empty set of work, so for
 *    example cuEventQuery() would return CUDA_SUCCESS"). cuEventQuery runs
 *    nothing: CUDA_SUCCESS or CUDA_ERROR_NOT_READY (cuda.h: "if any captured
 *    work is incomplete"). cuEventSynchronize runs the queue up to the mark.
 *    cuEventDestroy_v2 of a pending event is a success, and what it
 *    captured still runs (cuda.h: "An event may be destroyed before it is
 *    complete ... the call does not block"). cuStreamWaitEvent(stream, ev,
 *    flags) is accepted (flags other than CU_EVENT_WAIT_DEFAULT:
 *    CUDA_ERROR_INVALID_VALUE, cuda.h: CU_EVENT_WAIT_EXTERNAL "is invalid
 *    outside of stream capture"; the event may be of another context, cuda.h)
 *    and orders nothing more: with one queue, later work already runs after
 *    what the event captured. cuStreamQuery: CUDA_ERROR_NOT_READY while the
 *    queue holds work of that stream (NULL and CU_STREAM_LEGACY are one
 *    stream; the synchronous memset and copies are work of it), else
 *    CUDA_SUCCESS; it runs nothing. Event queries, synchronisation and
 *    destruction need no current context (the event names its own); an
 *    unknown, destroyed or NULL event is CUDA_ERROR_INVALID_HANDLE. Event
 *    handles are never reused.
 *  - Host memory (cuMemHostAlloc with PORTABLE, DEVICEMAP, WRITECOMBINED;
 *    other flags CUDA_ERROR_INVALID_VALUE; cuMemAllocHost_v2 = flags 0):
 *    anonymous read-write memory, 4 KiB pages, freed by cuMemFreeHost only.
 *    Not charged to a device. Its device pointer is its host pointer, but
 *    for write-combined memory (cuda.h, cuMemHostAlloc: "Unless the flag
 *    CU_MEMHOSTALLOC_WRITECOMBINED is specified, the device pointer ... is
 *    always equal to the returned host pointer *pp. If the flag
 *    CU_MEMHOSTALLOC_WRITECOMBINED is specified, then the function
 *    cuMemHostGetDevicePointer() must be used to query the device pointer,
 *    even if the context supports unified addressing"): a memfd mapped
 *    twice, read-write at the host pointer and PROT_NONE at a device address
 *    inside the reservation. cuMemHostGetDevicePointer_v2 (a current
 *    context needed; Flags must be 0, cuda.h; any pointer inside host
 *    memory, whatever the flags: with unified addressing all pinned memory
 *    is mapped) gives the device address (with the same offset); other
 *    memory is CUDA_ERROR_INVALID_VALUE. The calls that take device
 *    pointers accept the device address (MEMORY_TYPE HOST, HOST_POINTER
 *    the host pointer); the host pointer of write-combined memory given to
 *    cuMemsetD8_v2, as cuMemcpyHtoD_v2's destination, cuMemcpyDtoH_v2's
 *    source or either pointer of cuMemcpyDtoD_v2 is CUDA_ERROR_INVALID_VALUE
 *    (cuMemcpy takes it as host memory). cuMemFreeHost takes the host
 *    pointer only. LENIENT_WC: the device address is the host pointer.
 *  - Managed memory (cuMemAllocManaged, flags CU_MEM_ATTACH_GLOBAL or
 *    CU_MEM_ATTACH_HOST; others CUDA_ERROR_INVALID_VALUE): anonymous
 *    read-write memory outside the reservation, 2 MiB aligned, freed by
 *    cuMemFree_v2, not charged (managed memory may oversubscribe).
 *  - Pointer attributes: MEMORY_TYPE is DEVICE for device, managed
 *    (IS_MANAGED 1, as the real driver reports managed memory; to be
 *    confirmed on hardware) and opened IPC memory, HOST for host memory.
 *    DEVICE_ORDINAL and CONTEXT: the context current at allocation (for an
 *    IPC mapping, at the open). BUFFER_ID: unique in the process, never
 *    reused (an opened mapping gets its own). RANGE_START_ADDR and
 *    RANGE_SIZE: base and asked size, as cuMemGetAddressRange_v2.
 *    DEVICE_POINTER: the pointer itself (needs a current context; the
 *    device address for the host pointer of write-combined memory);
 *    HOST_POINTER: the pointer for host and managed memory,
 *    CUDA_ERROR_INVALID_VALUE for device memory. IS_LEGACY_CUDA_IPC_CAPABLE:
 *    1 for cuMemAlloc_v2 memory only. MAPPED: 1. MEMPOOL_HANDLE: the
 *    default pool for async memory, NULL otherwise. Other attributes are
 *    CUDA_ERROR_INVALID_VALUE. An address inside no allocation (within
 *    the asked size) is CUDA_ERROR_INVALID_VALUE for cuPointerGetAttribute;
 *    cuPointerGetAttributes writes 0 (NULL) for every attribute of such an
 *    address and returns CUDA_SUCCESS, as cuda.h documents.
 *  - cuMemGetAddressRange_v2: base and asked size of the allocation that
 *    holds an address (either output may be NULL); CUDA_ERROR_NOT_FOUND
 *    for an address in none. On an opened IPC mapping: its base and the
 *    size of the whole allocation the handle names (cuda.h: "the
 *    allocation by cuMemAlloc() ... that contains the input pointer"),
 *    which the driver reads from the exporter's memfd, never from the
 *    handle's bytes (a peer may rewrite those; a real driver knows the
 *    size from its kernel object).
 *  - Memset and copies (CUDA driver API, "API synchronization behavior":
 *    "For transfers from device memory to device memory, no host-side
 *    synchronization is performed"; "The synchronous memset functions are
 *    asynchronous with respect to the host except when the target is pinned
 *    host memory or a Unified Memory region, in which case they are fully
 *    synchronous"; for transfers from device to host memory "the function
 *    returns only once the copy has completed"): cuMemsetD8_v2 of device
 *    memory (cuMemAlloc_v2, async, opened IPC mappings) and copies with
 *    device memory on both sides (cuMemcpyDtoD_v2, cuMemcpy) are queued, in
 *    order, in one queue of the process, and run at the next synchronising
 *    call: cuStreamSynchronize, cuCtxSynchronize(_v2), any free or unmap
 *    (cuMemFree_v2, which synchronises; cuMemFreeAsync, cuMemFreeHost,
 *    cuIpcCloseMemHandle, a context's end: the driver never leaves work on
 *    memory it unmaps), a copy with a host side (cuMemcpyHtoD_v2,
 *    cuMemcpyDtoH_v2, cuMemcpy of plain, pinned or managed memory: these
 *    run the queue, then themselves), a memset of pinned or managed memory
 *    (likewise), teardown, or 1024 queued operations. Until then the bytes
 *    are unchanged, as another process that opened the memory sees.
 *    The asynchronous calls go on the same queue, tagged with their stream
 *    (the synchronous ones: the legacy stream): cuMemsetD8Async of any of
 *    the driver's memory (the same page: "The Async versions are always
 *    asynchronous with respect to the host"; its destination as
 *    cuMemsetD8_v2's, cuMemcpyAsync's pointers as cuMemcpy's), and
 *    cuMemcpyAsync with the driver's memory on both sides but not pinned
 *    host memory on both; with plain (pageable) memory on a side, or host
 *    memory on both, it runs the queue and then itself ("For transfers
 *    between device memory and pageable host memory, the function might be
 *    synchronous with respect to host"; "For transfers from any host memory
 *    to any host memory, the function is fully synchronous"). One queue in
 *    stream order never runs work early: a real GPU may run other streams'
 *    work sooner, never later. The queue runs at: cuStreamSynchronize (a
 *    created stream: up to its last op, and what was queued before it; a
 *    default stream: all of it), cuCtxSynchronize(_v2), cuEventSynchronize
 *    (up to the event's mark), the frees and host copies above, a context's
 *    end, teardown, or 1024 queued operations.
 *    `pending_ops` counts the queue. LENIENT_SYNC: everything runs at once
 *    (events are then always complete).
 *    Device memory is read and written through the alias. cuMemcpy takes any mix of the driver's memory and
 *    plain process memory; cuMemcpyHtoD_v2's destination, DtoH_v2's source
 *    and both DtoD_v2 pointers, and cuMemsetD8_v2's destination, must be
 *    the driver's memory (of any kind). A range that starts in an
 *    allocation and runs past its asked size, or a plain range that
 *    overlaps a driver mapping, is CUDA_ERROR_INVALID_VALUE. 0 bytes is a
 *    success that checks no pointer.
 *  - cuMemFree_v2 takes base pointers of device, async and managed memory;
 *    cuMemFreeHost base pointers of host memory; anything else (0 too,
 *    interior pointers, opened IPC mappings) is CUDA_ERROR_INVALID_VALUE.
 *  - IPC (cuMemAlloc_v2 memory only: host, managed, async memory and opened
 *    mappings are CUDA_ERROR_INVALID_VALUE). An interior pointer exports
 *    the whole allocation: the importer gets its base. The 64-byte handle:
 *      [0,4) magic 0x55434d48 ("HMCU")  [4,8) exporter pid
 *      [8,12) the memfd's number in the exporter  [12,16) device ordinal
 *      [16,24) buffer id  [24,32) asked size  [32,40) exporter nonce
 *      (random per process, new in a fork child)  [40,48) the memfd's
 *      st_ino  [48,56) its st_dev  [56,64) the allocation's base address
 *      in the exporter (not 0, 4 KiB aligned).
 *    Where an open maps: at the exporter's base address when that range of
 *    the reservation is free here (unified addressing; test/gpu_check
 *    ipc_address). When the range overlaps a mapping open in this process
 *    that came from the same exporter (pid and nonce) and names another
 *    allocation, the open is CUDA_ERROR_ALREADY_MAPPED: what a real GPU
 *    answers after the exporter freed a block and cuMemAlloc handed its
 *    address out again while the importer still maps the old block (UCX
 *    PR 2738 and src/uct/cuda/cuda_ipc/cuda_ipc_cache.c: on
 *    CUDA_ERROR_ALREADY_MAPPED the cache unmaps the overlapping stale
 *    regions and opens again; Open MPI's rgpusm does the same;
 *    test/gpu_check reuse_open_while_mapped). Taken by anything else (this
 *    process's own memory, another exporter's mappings, a mapping of the
 *    same allocation in a context of another device): the driver's fallback,
 *    the lowest free address of the reservation that fits.
 *    LENIENT_IPC_ANYWHERE: always the fallback, never ALREADY_MAPPED.
 *    cuIpcOpenMemHandle_v2 (flags 0 or CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
 *    others CUDA_ERROR_INVALID_VALUE) opens /proc/<pid>/fd/<n> (same uid,
 *    same pid namespace) and maps it as device memory of the current
 *    context's device (PROT_NONE + alias). Errors: a malformed handle
 *    (magic, size, reserved bytes) and the exporting process itself are
 *    CUDA_ERROR_INVALID_VALUE (the real error for an own handle is still to
 *    confirm on hardware); an exporter gone, an fd closed (the allocation
 *    freed) or now another file (not a sealed memfd of this driver, or
 *    another st_ino/st_dev) is CUDA_ERROR_INVALID_HANDLE; memory of a
 *    device the current one has no peer access to is
 *    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED. A process opens the handles of
 *    one exporting device of one exporter in one context per local device
 *    (cuda.h's rule): another context of that device is
 *    CUDA_ERROR_INVALID_CONTEXT while the first has any of them open.
 *    A second open of a handle already open in the current context returns
 *    the same pointer and takes a reference (as cuda.h documents), and
 *    counts in `ipc_open_repeats`; in strict mode (HM_CUDA_TEST_STRICT_IPC=1
 *    or hm_cuda_test_set_strict_ipc) it is CUDA_ERROR_ALREADY_MAPPED (and
 *    counts too). cuIpcCloseMemHandle drops one reference of the mapping
 *    at that base (from any context); the last unmaps; an address that is
 *    not the base of an open mapping (an interior pointer too) is
 *    CUDA_ERROR_INVALID_VALUE (test/gpu_check interior_close).
 *    cuMemGetAddressRange_v2 and RANGE_START_ADDR of any pointer inside a
 *    mapping give its base. The
 *    mapping keeps the memory after the exporter frees it (and after the
 *    exporter exits), until its last close: the physical memory is
 *    reference-counted by the kernel driver, not owned by the exporter's
 *    process (still to confirm on hardware).
 *  - cuGetErrorName/cuGetErrorString know every code in cuda_decls.h;
 *    others are CUDA_ERROR_INVALID_VALUE with *pStr NULL.
 *  - Thread-safe: one mutex around every entry point, held across fork so
 *    that a child copies no half-done update. memfds are close-on-exec.
 *
 * Control API
 * Exported next to the entry points; a test reaches them through the very
 * library the code under test loaded:
 *     void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
 *     hm_cuda_test_call_count_fn n = (hm_cuda_test_call_count_fn)dlsym(h, "hm_cuda_test_call_count");
 * They may be called at any time, from any thread, before cuInit too, in a
 * fork child and after teardown, and are not counted as calls.
 *
 * Lenient options: HM_CUDA_TEST_LENIENT, a comma-separated list of the
 * names below (read at the first call into the library; unknown names are
 * reported on stderr and ignored), or hm_cuda_test_set_lenient(bits),
 * which replaces the set at any time:
 *     align         HM_CUDA_TEST_LENIENT_ALIGN          2 MiB units and alignment always
 *     no-reuse      HM_CUDA_TEST_LENIENT_NO_REUSE       freed addresses come back last
 *     ipc-anywhere  HM_CUDA_TEST_LENIENT_IPC_ANYWHERE   opens never at the exporter's address
 *     sync          HM_CUDA_TEST_LENIENT_SYNC           memset and copies run at once
 *     fork          HM_CUDA_TEST_LENIENT_FORK           a fork child keeps a working driver
 *     exit          HM_CUDA_TEST_LENIENT_EXIT           no teardown at exit
 *     wc            HM_CUDA_TEST_LENIENT_WC             write-combined device pointer = host pointer
 *     all           HM_CUDA_TEST_LENIENT_ALL
 */
#ifndef HM_CUDA_TEST_DRIVER_H
#define HM_CUDA_TEST_DRIVER_H

#include "cuda_decls.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_CUDA_TEST_MAX_DEVICES 8
#define HM_CUDA_TEST_DRIVER_VERSION 13000
#define HM_CUDA_TEST_GRANULARITY ((size_t)2 << 20)
#define HM_CUDA_TEST_VA_SIZE ((uint64_t)64 << 30)

#define HM_CUDA_TEST_LENIENT_ALIGN 0x01u
#define HM_CUDA_TEST_LENIENT_NO_REUSE 0x02u
#define HM_CUDA_TEST_LENIENT_IPC_ANYWHERE 0x04u
#define HM_CUDA_TEST_LENIENT_SYNC 0x08u
#define HM_CUDA_TEST_LENIENT_FORK 0x10u
#define HM_CUDA_TEST_LENIENT_EXIT 0x20u
#define HM_CUDA_TEST_LENIENT_WC 0x40u
#define HM_CUDA_TEST_LENIENT_ALL 0x7fu

/* Counters since the last hm_cuda_test_reset(), then states (live_*,
 * primary_refs, device_used), which reset leaves alone. */
typedef struct hm_cuda_test_stats {
    uint64_t calls;            /* every entry point, whatever its result */
    uint64_t ipc_open_repeats; /* opens of a handle already open in that context */
    uint64_t leaks;            /* allocations and mappings freed by a context's end */
    uint64_t live_contexts;    /* created and not destroyed (primary ones not counted) */
    uint64_t live_allocs;      /* all four kinds below */
    uint64_t live_device_allocs, live_async_allocs, live_host_allocs, live_managed_allocs;
    uint64_t live_ipc_mappings; /* opened IPC mappings */
    uint64_t live_ipc_refs;     /* opens not yet closed */
    uint32_t primary_refs[HM_CUDA_TEST_MAX_DEVICES];
    uint64_t device_used[HM_CUDA_TEST_MAX_DEVICES]; /* bytes charged (spans) */
    uint64_t pending_ops; /* memsets and copies queued, not yet run */
    uint64_t live_streams;    /* created streams not destroyed */
    uint64_t live_events;     /* created events not destroyed */
    uint64_t events_recorded; /* a counter: cuEventRecord successes since the last reset */
    uint64_t live_vmm_handles;  /* physical allocations (cuMemCreate, imports) not yet freed */
    uint64_t live_vmm_mappings; /* cuMemMap mappings not yet unmapped */
    uint64_t live_pools;        /* created and imported pools not destroyed */
    uint64_t live_pool_allocs;  /* cuMemAllocFromPoolAsync allocations of created pools */
    uint64_t live_pool_imports; /* cuMemPoolImportPointer mappings not yet freed */
    uint64_t live_pool_import_refs; /* imports not yet freed (a repeat adds one) */
    uint64_t pool_early_frees;  /* a counter: pool allocations freed while imported */
} hm_cuda_test_stats_t;

/* Counters to 0, every pending failure injection and a sticky error
 * dropped. */
void hm_cuda_test_reset(void);
typedef void (*hm_cuda_test_reset_fn)(void);

void hm_cuda_test_get_stats(hm_cuda_test_stats_t *out);
typedef void (*hm_cuda_test_get_stats_fn)(hm_cuda_test_stats_t *out);

/* Calls of one entry point by its exact symbol name ("cuMemAlloc_v2",
 * "cuCtxGetCurrent", ...) since the last reset; UINT64_MAX for a name the
 * driver does not export. */
uint64_t hm_cuda_test_call_count(const char *symbol);
typedef uint64_t (*hm_cuda_test_call_count_fn)(const char *symbol);

/* The nth next call of `symbol` (nth = 1: the next one) returns `result`
 * at once, touching nothing (no out-parameter, no state; it still counts).
 * One injection per entry point: a new one replaces the old; nth = 0
 * cancels. It fires before the initialization check. Returns 0, or -1 for
 * a name the driver does not export or a `result` of CUDA_SUCCESS. */
int hm_cuda_test_fail_next(const char *symbol, unsigned nth, CUresult result);
typedef int (*hm_cuda_test_fail_next_fn)(const char *symbol, unsigned nth, CUresult result);

/* As hm_cuda_test_fail_next, and once it fires the error is sticky: every
 * later call but cuGetErrorName, cuGetErrorString and cuDriverGetVersion
 * returns `result` until hm_cuda_test_reset(). */
int hm_cuda_test_fail_sticky(const char *symbol, unsigned nth, CUresult result);
typedef int (*hm_cuda_test_fail_sticky_fn)(const char *symbol, unsigned nth, CUresult result);

/* The lenient options (HM_CUDA_TEST_LENIENT_* bits; others ignored):
 * replaced, and read. */
void hm_cuda_test_set_lenient(unsigned bits);
typedef void (*hm_cuda_test_set_lenient_fn)(unsigned bits);
unsigned hm_cuda_test_get_lenient(void);
typedef unsigned (*hm_cuda_test_get_lenient_fn)(void);

/* What the exit handler does, now: the queued work runs, then every entry
 * point is CUDA_ERROR_DEINITIALIZED for the rest of the process. */
void hm_cuda_test_teardown(void);
typedef void (*hm_cuda_test_teardown_fn)(void);

/* The address of the reservation (reserved at the first successful cuInit,
 * HM_CUDA_TEST_VA_SIZE bytes). */
uint64_t hm_cuda_test_va_base(void);
typedef uint64_t (*hm_cuda_test_va_base_fn)(void);

/* The memory limit of one device (device < 0: every device), in bytes
 * (> 0), for the allocations that follow; live memory stays. Returns 0, or
 * -1 for a bad device or 0 bytes. */
int hm_cuda_test_set_mem_limit(int device, uint64_t bytes);
typedef int (*hm_cuda_test_set_mem_limit_fn)(int device, uint64_t bytes);

/* Strict IPC on (1) or off (0): a second open of a handle in the same
 * context is CUDA_ERROR_ALREADY_MAPPED instead of a new reference. */
void hm_cuda_test_set_strict_ipc(int on);
typedef void (*hm_cuda_test_set_strict_ipc_fn)(int on);

/* Whether `device` can access `peer`'s memory (cuDeviceCanAccessPeer, IPC
 * opens of memory exported from `peer` in a context of `device`). Ignored
 * for device == peer. Returns 0, or -1 for a bad ordinal. */
int hm_cuda_test_set_peer_access(int device, int peer, int can);
typedef int (*hm_cuda_test_set_peer_access_fn)(int device, int peer, int can);

#ifdef __cplusplus
}
#endif

#endif
