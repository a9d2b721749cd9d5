/* hetmem — memory providers: coarse memory of one memory space.
 * SPDX-License-Identifier: MIT
 *
 * A provider is created from an ops table and an opaque, provider-specific
 * params object (e.g. hm_os_params_t). Pools carve fine allocations out of it.
 * Anyone may write a provider: fill a `static const hm_provider_ops_t` with
 * designated initializers; a NULL op means "unsupported" and the front-end
 * answers HM_ERROR_NOT_SUPPORTED for it.
 *
 * Descriptors: a provider that keeps a file descriptor open (the OS
 * provider's memfd in shared mode, the file and devdax providers' files)
 * keeps it close-on-exec at a high number (the lowest free one from 512, or
 * from half the soft RLIMIT_NOFILE if that is lower), out of the way of the
 * numbers programs name and the kernel hands out, and checks before each
 * use that it is still the file it opened (device and inode). If the
 * program has closed it or put another file at its number, the provider
 * leaves that descriptor alone: what needed it (growing, mapping, hole
 * punching, an export of the descriptor, the close at destroy) is refused
 * with HM_ERROR_DRIVER (native error EBADF) and one log line; memory already
 * mapped stays usable and can be freed. */
#ifndef HETMEM_PROVIDER_H
#define HETMEM_PROVIDER_H

#include <hetmem/base.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_provider hm_provider_t;

/* Capability bits reported in hm_provider_info_t.caps. The front-end clears a
 * bit whose op is NULL, so a provider cannot claim what it does not do. */
enum {
    HM_PROVIDER_CAP_FREE = 1u << 0,        /* free() returns memory to the provider/OS */
    HM_PROVIDER_CAP_PURGE_LAZY = 1u << 1,  /* purge_lazy (MADV_FREE-like) */
    HM_PROVIDER_CAP_PURGE_FORCE = 1u << 2, /* purge_force (MADV_DONTNEED/hole punch) */
    HM_PROVIDER_CAP_SPLIT_MERGE = 1u << 3, /* allocations can be split and adjacent ones merged */
    HM_PROVIDER_CAP_IPC = 1u << 4,         /* allocations can be exported/opened via IPC */
    HM_PROVIDER_CAP_CPU_ACCESS = 1u << 5,  /* the CPU may load/store this memory */
    HM_PROVIDER_CAP_NUMA = 1u << 6,        /* memory is bound to NUMA nodes as asked */
};

/* Provider families: used by IPC to decide which providers can open which
 * handles. User-written providers use HM_PROVIDER_FAMILY_USER or above. */
typedef enum hm_provider_family {
    HM_PROVIDER_FAMILY_OS = 1,
    HM_PROVIDER_FAMILY_FIXED = 2,
    HM_PROVIDER_FAMILY_FILE = 3,
    HM_PROVIDER_FAMILY_DEVDAX = 4,
    HM_PROVIDER_FAMILY_LEVEL_ZERO = 5,
    HM_PROVIDER_FAMILY_CUDA = 6,
    HM_PROVIDER_FAMILY_USER = 1000,
} hm_provider_family_t;

/* What a provider is and can do. Filled by the provider's get_info op; the
 * front-end adjusts caps to the ops present. Strings are static. */
typedef struct hm_provider_info {
    const char *name;             /* e.g. "os", "fixed", "cuda" */
    hm_provider_family_t family;
    hm_memory_kind_t kind;
    uint32_t caps;                /* HM_PROVIDER_CAP_* */
    size_t min_page_size;         /* every allocation is a multiple of, and aligned to, this */
    size_t recommended_page_size; /* e.g. 2 MiB for huge pages or GPU granularity */
} hm_provider_info_t;

#define HM_PROVIDER_OPS_VERSION 1u

/* The provider interface. `state` is what init returned. Ops return
 * HM_SUCCESS or an error; on driver/OS failure they record the native error
 * (the front-end never calls an op with invalid arguments: size > 0,
 * alignment 0 or a power of two, ptr non-NULL). */
typedef struct hm_provider_ops {
    uint32_t version; /* HM_PROVIDER_OPS_VERSION */
    const char *name; /* static, short */

    /* Required. */
    hm_result_t (*init)(const void *params, void **state);
    void (*fini)(void *state);
    void (*get_info)(void *state, hm_provider_info_t *info);
    /* alignment 0 means the provider's min_page_size. The size handed back
     * to free/purge/split is the size that was asked for. */
    hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr);

    /* Optional: NULL means unsupported. */
    hm_result_t (*free)(void *state, void *ptr, size_t size);
    hm_result_t (*purge_lazy)(void *state, void *ptr, size_t size);
    hm_result_t (*purge_force)(void *state, void *ptr, size_t size);
    /* Split [ptr, ptr+total) into [ptr, ptr+first) and the rest, so each can
     * be freed on its own; merge two adjacent allocations into one. Both or
     * neither (HM_PROVIDER_CAP_SPLIT_MERGE). */
    hm_result_t (*split)(void *state, void *ptr, size_t total, size_t first);
    hm_result_t (*merge)(void *state, void *lo, void *hi, size_t total);

    /* IPC: the first five all or none. The native payload is handle_size() opaque bytes
     * the provider writes in get() and reads in open(). A provider whose
     * handle carries a file descriptor returns it in *fd (valid in this
     * process until put()); the IPC layer moves it to the importer, which
     * receives its own copy in open()'s fd (-1 when none). open() must not
     * keep `fd` (dup it if needed); the caller closes it. Lifetimes are the
     * IPC layer's: it never frees, splits or merges an exported range before
     * the export's put(), which it makes first (a range freed while
     * exported is given back after the last hm_ipc_put), so a provider holds
     * nothing for an export; put() may refuse (logged, tried again later),
     * and the range then waits for the put's retry. */
    struct {
        size_t (*handle_size)(void *state);
        hm_result_t (*get)(void *state, void *ptr, size_t size, void *payload, int *fd);
        hm_result_t (*put)(void *state, void *payload);
        hm_result_t (*open)(void *state, const void *payload, int fd, size_t size, void **ptr);
        hm_result_t (*close)(void *state, void *ptr, size_t size);
        /* Optional even with the five (NULL: close() each): close n
         * mappings that open() made, as close() would each, where the
         * provider can do better together (e.g. unmap adjacent mappings with
         * one call: one TLB flush instead of one per mapping). Closes every
         * mapping it can; returns the first error. */
        hm_result_t (*close_many)(void *state, void *const *ptrs, const size_t *sizes, size_t n);
    } ipc;
} hm_provider_ops_t;

/* Create a provider. `params` is the provider's params object (may be NULL
 * for defaults where the provider allows it); it is copied, so the caller may
 * destroy it right after. */
HM_API hm_result_t hm_provider_create(const hm_provider_ops_t *ops, const void *params,
                                      hm_provider_t **provider);
/* Destroy. Destroying a provider still used by a pool is a caller bug;
 * destroying one twice (or a pointer that is not a live provider) returns
 * HM_ERROR_INVALID_ARGUMENT. */
HM_API hm_result_t hm_provider_destroy(hm_provider_t *provider);

/* Raw provider calls. Every call is thread-safe. Memory obtained here is not
 * tracked (hm_free does not know it); pools get tracked memory through
 * hm_pool_provider_alloc(). */
HM_API hm_result_t hm_provider_alloc(hm_provider_t *provider, size_t size, size_t alignment,
                                     void **ptr);
HM_API hm_result_t hm_provider_free(hm_provider_t *provider, void *ptr, size_t size);
HM_API hm_result_t hm_provider_purge_lazy(hm_provider_t *provider, void *ptr, size_t size);
HM_API hm_result_t hm_provider_purge_force(hm_provider_t *provider, void *ptr, size_t size);
HM_API hm_result_t hm_provider_split(hm_provider_t *provider, void *ptr, size_t total,
                                     size_t first);
HM_API hm_result_t hm_provider_merge(hm_provider_t *provider, void *lo, void *hi, size_t total);

HM_API hm_result_t hm_provider_get_info(const hm_provider_t *provider, hm_provider_info_t *info);
HM_API const char *hm_provider_name(const hm_provider_t *provider);
HM_API hm_memory_kind_t hm_provider_memory_kind(const hm_provider_t *provider);
HM_API bool hm_provider_cpu_accessible(const hm_provider_t *provider);
HM_API size_t hm_provider_min_page_size(const hm_provider_t *provider);
HM_API size_t hm_provider_recommended_page_size(const hm_provider_t *provider);
HM_API uint32_t hm_provider_caps(const hm_provider_t *provider);
/* The ops table and state the provider was created with (for wrappers). */
HM_API const hm_provider_ops_t *hm_provider_get_ops(const hm_provider_t *provider);
HM_API void *hm_provider_get_state(const hm_provider_t *provider);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_PROVIDER_H */
