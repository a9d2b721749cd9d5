/* hetmem tests — the conformance suites, written once and reused by every
 * provider and every pool x provider pair. SPDX-License-Identifier: MIT */
#ifndef HM_TEST_CONFORMANCE_H
#define HM_TEST_CONFORMANCE_H

#include "harness.h"

/* Makes a fresh provider for one test case (called many times). The suites
 * never hold two objects from one factory at once (each is destroyed before
 * the next is made), so a factory over a caller buffer may reuse one buffer. */
typedef hm_result_t (*hm_test_provider_factory)(void *arg, hm_provider_t **out);
/* Makes a fresh pool for one test case; the pool must own its provider
 * (HM_POOL_FLAG_OWN_PROVIDER) so hm_pool_destroy() cleans everything. */
typedef hm_result_t (*hm_test_pool_factory)(void *arg, hm_pool_t **out);

/* Suite options. */
typedef struct hm_test_suite_opts {
    size_t max_alloc;      /* largest size to try (0: 64 MiB); capacity-limited providers set it */
    size_t max_alignment;  /* largest alignment to try (0: 2 MiB) */
    int threads;           /* threads for the concurrent case (0: 4) */
    int can_free;          /* expected: 1 if the provider frees (checked against caps) */
    /* Total bytes one fresh provider can hand out (0: unbounded). When set,
     * the provider suite exhausts it and expects HM_ERROR_OUT_OF_MEMORY, and
     * both suites size their workloads to fit when memory cannot be freed.
     * A provider that cannot free should offer at least
     * max_alloc + 2 * max_alignment + 4 MiB. */
    size_t capacity;
    /* Pool suite: hm_pool_free() answers HM_ERROR_NOT_SUPPORTED (the proxy
     * pool over a provider that cannot free); otherwise it must succeed. */
    int free_unsupported;
    /* Provider suite: no request of an impossible size (2^52 bytes and
     * more): a real driver may take long or hang on one (managed memory). */
    int skip_huge;
} hm_test_suite_opts_t;

/* Fill [p, p+n) with a pattern derived from seed; check it (1: intact).
 * Up to 256 KiB every byte; above, one word in each 64 bytes (in sanitizer
 * builds one in each 64 KiB) and the last 8 bytes. Check with the same n. */
void hm_test_fill(void *p, size_t n, uint64_t seed);
int hm_test_verify(const void *p, size_t n, uint64_t seed);

/* Run every case; failures are recorded through the harness. The label is
 * printed with failures. */
void hm_test_provider_suite(const char *label, hm_test_provider_factory make, void *arg,
                            const hm_test_suite_opts_t *opts);
void hm_test_pool_suite(const char *label, hm_test_pool_factory make, void *arg,
                        const hm_test_suite_opts_t *opts);

/* Providers made the same way by every pool test (factories.c). */
hm_result_t hm_test_os_provider(hm_os_visibility_t vis, unsigned prot, hm_provider_t **out);
hm_result_t hm_test_fixed_provider(void *buffer, size_t size, hm_memory_kind_t kind, bool cpu,
                                   hm_provider_t **out);

/* The provider kinds of the pool x provider matrix (test/pools/test_pool_matrix.c):
 * hm_test_make_provider() makes a fresh provider of a kind (called once per
 * test case, like a hm_test_provider_factory). */
typedef enum hm_test_provider_kind {
    HM_TEST_OS_PRIVATE = 0, /* OS, private, read-write */
    HM_TEST_OS_SHARED,      /* OS, shared (memfd), read-write */
    HM_TEST_OS_UNTRACKED,   /* OS, private, read-write; the pool gets HM_POOL_FLAG_NO_TRACKING */
    HM_TEST_OS_PROT_NONE,   /* OS, private, PROT_NONE: the pool must not touch it */
    HM_TEST_FAULT,          /* fault(os-private), nothing armed */
    HM_TEST_FAULT_NOFREE,   /* fault(os-private) with no free/split/merge (file/devdax-like) */
    HM_TEST_FILE,           /* file provider, shared, a file in a temporary folder */
    HM_TEST_FIXED_HOST,     /* fixed over a read-write 96 MiB buffer, host memory */
    HM_TEST_FIXED_DEVICE,   /* fixed over a PROT_NONE 96 MiB buffer, device kind, no CPU */
    HM_TEST_PROVIDER_KIND_COUNT
} hm_test_provider_kind_t;

typedef struct hm_test_provider_kind_info {
    const char *name;       /* "os-private", ... (static storage) */
    uint32_t pool_flags;    /* extra flags for the pool made over it */
    hm_test_suite_opts_t opts; /* the pool suite's options for this kind */
} hm_test_provider_kind_info_t;

/* NULL for an unknown kind. */
const hm_test_provider_kind_info_t *hm_test_provider_kind_info(hm_test_provider_kind_t kind);
/* The fixed kinds share one buffer per kind (mapped at first use): at most
 * one fixed provider of a kind may exist at a time, as in the suites. */
hm_result_t hm_test_make_provider(hm_test_provider_kind_t kind, hm_provider_t **out);
/* Unmap the fixed buffers and remove the file kind's folder, once every
 * provider of those kinds is gone. 1: clean; 0: files were left behind. */
int hm_test_providers_cleanup(void);

/* The fault-injecting pass-through provider (fault_provider.c): wraps another
 * provider and forwards every op (but fill, copy and ipc_compatible); fails
 * the Nth call of an op with a chosen result; counts calls; tracks what the
 * inner provider holds. */
typedef enum hm_fault_op {
    HM_FAULT_ALLOC = 0,
    HM_FAULT_FREE,
    HM_FAULT_PURGE_LAZY,
    HM_FAULT_PURGE_FORCE,
    HM_FAULT_SPLIT,
    HM_FAULT_MERGE,
    HM_FAULT_IPC_GET, /* the ipc sub-table is passed through to the inner ops */
    HM_FAULT_IPC_PUT,
    HM_FAULT_IPC_OPEN,
    HM_FAULT_IPC_CLOSE,
    HM_FAULT_IPC_CLOSE_MANY,  /* an injected failure closes nothing */
    HM_FAULT_IPC_HANDLE_SIZE, /* an injected failure answers HM_IPC_PAYLOAD_MAX + 1 */
    HM_FAULT_OP_COUNT
} hm_fault_op_t;

typedef struct hm_fault_params {
    hm_provider_t *inner;          /* wrapped provider (not owned unless own_inner) */
    int own_inner;                 /* destroy inner with the fault provider */
    long fail_nth[HM_FAULT_OP_COUNT]; /* 1-based call number to fail; 0 = never; -1 = every call */
    hm_result_t fail_with;         /* result of an injected failure (0: OUT_OF_MEMORY) */
    /* The provider's name in get_info (NULL: "fault"). */
    const char *name;
} hm_fault_params_t;

/* Every op, close_many included (forwarded, or close() each where the inner
 * provider has none). */
const hm_provider_ops_t *hm_fault_provider_ops(void);
/* The same with no free, split or merge: the provider cannot take memory back. */
const hm_provider_ops_t *hm_fault_provider_nofree_ops(void);
/* The table that matches inner's optional IPC op: close_many only where
 * inner has one (so the IPC layer takes the path it takes for inner);
 * nofree: as hm_fault_provider_nofree_ops(). */
const hm_provider_ops_t *hm_fault_provider_ops_for(const hm_provider_t *inner, int nofree);
/* Calls seen so far of one kind (failed ones included), the calls of it that
 * succeeded, and live allocations (allocs minus frees) — for leak checks.
 * -1 if fault is not a fault provider. */
long hm_fault_provider_calls(hm_provider_t *fault, hm_fault_op_t op);
long hm_fault_provider_succeeded(hm_provider_t *fault, hm_fault_op_t op);
long hm_fault_provider_live(hm_provider_t *fault);
/* Bytes in live allocations (sizes as asked). */
size_t hm_fault_provider_live_bytes(hm_provider_t *fault);
/* Exports the inner provider holds (ipc.get successes minus ipc.put
 * successes) and mappings it has open (ipc.open successes not yet closed by
 * close or close_many). */
long hm_fault_provider_exports(hm_provider_t *fault);
long hm_fault_provider_mappings(hm_provider_t *fault);
/* Calls on ranges that were not live allocations (free/purge/split/merge/
 * ipc.get of an unknown range or with a different size; close/close_many of
 * a mapping ipc.open did not make): each is logged to stderr, refused with
 * HM_ERROR_INVALID_ARGUMENT and counted here. */
long hm_fault_provider_misuse(hm_provider_t *fault);
/* Injected failures so far (all ops). */
long hm_fault_provider_injected(hm_provider_t *fault);
/* Re-arm: fail the nth call from now of op (0 = never, -1 = every call)
 * with the params' fail_with, or with `result` (not HM_SUCCESS). */
void hm_fault_provider_arm(hm_provider_t *fault, hm_fault_op_t op, long nth);
void hm_fault_provider_arm_with(hm_provider_t *fault, hm_fault_op_t op, long nth,
                                hm_result_t result);
/* Disarm every op. */
void hm_fault_provider_disarm(hm_provider_t *fault);

/* The 'device' provider (device_provider.c): memory the CPU must not touch
 * (PROT_NONE views of memfds; the provider's fill and copy work through a
 * read-write alias, as a DMA engine would), HM_MEMORY_DEVICE, a device
 * ordinal and UUID, fill, copy, purge_force, and IPC with a device check
 * (ipc_compatible). Every op on a range that is not its own is refused with
 * HM_ERROR_INVALID_ARGUMENT, logged to stderr and counted as misuse. */
#define HM_TEST_DEVICE_FAMILY ((hm_provider_family_t)(HM_PROVIDER_FAMILY_USER + 7))
#define HM_TEST_DEVICE_MAX_PEERS 4
typedef struct hm_test_device_params {
    int32_t ordinal;                    /* reported (get_device) */
    uint8_t uuid[HM_DEVICE_UUID_SIZE];  /* all zero: derived from the ordinal */
    size_t capacity;                    /* device memory (0: 16 GiB); beyond: OUT_OF_MEMORY */
    size_t page_size;                   /* min_page_size (0: the system page) */
    size_t recommended_page_size;       /* 0: 2 MiB, a GPU's granularity */
    const char *name;                   /* NULL: "test-device" (static storage) */
    /* Devices whose exports this one can open, besides its own. */
    uint8_t peers[HM_TEST_DEVICE_MAX_PEERS][HM_DEVICE_UUID_SIZE];
    int npeers;
    /* A driver context shared by every device provider made with the same
     * nonzero value (0: its own). Its opened IPC mappings belong to the
     * context, as a GPU context's do: any provider of the context may
     * close, fill and copy them, and a second open of an allocation that
     * is open in the context already fails (HM_ERROR_DRIVER, counted as
     * misuse), as a second cuIpcOpenMemHandle in one CUDA context must
     * never be made. The provider answers ipc_context with this value. */
    uint64_t context;
} hm_test_device_params_t;

typedef enum hm_test_device_op {
    HM_TEST_DEVICE_FILL = 0,
    HM_TEST_DEVICE_COPY,
    HM_TEST_DEVICE_IPC_GET,
    HM_TEST_DEVICE_IPC_COMPATIBLE,
    HM_TEST_DEVICE_IPC_OPEN,
    HM_TEST_DEVICE_IPC_CLOSE,
    HM_TEST_DEVICE_OP_COUNT
} hm_test_device_op_t;

const hm_provider_ops_t *hm_test_device_provider_ops(void);
/* params NULL: ordinal 0, defaults. */
hm_result_t hm_test_device_provider(const hm_test_device_params_t *params, hm_provider_t **out);
/* Calls of op so far (-1: not a device provider). */
long hm_test_device_calls(hm_provider_t *dev, hm_test_device_op_t op);
/* Fail the nth fill or copy call from now with HM_ERROR_DRIVER, touching
 * nothing (0: never). */
void hm_test_device_fail_nth(hm_provider_t *dev, hm_test_device_op_t op, long nth);
/* Live allocations, open IPC mappings (of its context, when it has one),
 * refused calls. */
long hm_test_device_live(hm_provider_t *dev);
long hm_test_device_mappings(hm_provider_t *dev);
long hm_test_device_misuse(hm_provider_t *dev);

#endif
