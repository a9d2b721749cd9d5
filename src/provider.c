/* hetmem — the provider front-end: the ONLY caller of provider ops.
 * SPDX-License-Identifier: MIT
 *
 * Validates arguments once for every provider, answers NOT_SUPPORTED for a
 * NULL op in one place, and caches the provider's info and device
 * (immutable after create) so hot-path queries do not call into the
 * provider. Accepts ops tables of versions 1 to 3 (provider.h). */
#include "provider_internal.h"
#include "fork.h"
#include "ipc/ipc_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t caps_from_ops(const hm_provider_ops_t *ops) {
    uint32_t c = ~0u;
    if (!ops->free) c &= ~(uint32_t)HM_PROVIDER_CAP_FREE;
    if (!ops->purge_lazy) c &= ~(uint32_t)HM_PROVIDER_CAP_PURGE_LAZY;
    if (!ops->purge_force) c &= ~(uint32_t)HM_PROVIDER_CAP_PURGE_FORCE;
    if (!ops->split || !ops->merge) c &= ~(uint32_t)HM_PROVIDER_CAP_SPLIT_MERGE;
    if (!ops->ipc.handle_size || !ops->ipc.get || !ops->ipc.put || !ops->ipc.open ||
        !ops->ipc.close)
        c &= ~(uint32_t)HM_PROVIDER_CAP_IPC;
    if (!ops->fill) c &= ~(uint32_t)HM_PROVIDER_CAP_FILL;
    if (!ops->copy) c &= ~(uint32_t)HM_PROVIDER_CAP_COPY;
    return c;
}

/* A version 1 table ends where get_device begins. */
#define OPS_V1_SIZE offsetof(hm_provider_ops_t, get_device)
_Static_assert(OPS_V1_SIZE == offsetof(hm_provider_ops_t, ipc) +
                                  sizeof(((hm_provider_ops_t *)0)->ipc),
               "version 2 ops must start right after the version 1 table");
/* A version 2 table ends where the stream sub-table begins. */
#define OPS_V2_SIZE offsetof(hm_provider_ops_t, stream)

HM_RUN hm_result_t hm_provider_create(const hm_provider_ops_t *ops, const void *params,
                               hm_provider_t **out) {
    hm__init();
    if (!ops || !out) {
        HM_LOG_ERROR("hm_provider_create: %s is NULL", !ops ? "ops" : "provider");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (ops->version < 1u || ops->version > HM_PROVIDER_OPS_VERSION) {
        HM_LOG_ERROR("hm_provider_create: ops version %u, this library speaks 1 to %u",
                     ops->version, HM_PROVIDER_OPS_VERSION);
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (!ops->init || !ops->fini || !ops->get_info || !ops->alloc) {
        HM_LOG_ERROR("hm_provider_create: '%s' lacks a required op (init, fini, get_info, alloc)",
                     ops->name ? ops->name : "?");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_provider_t *p = calloc(1, sizeof(*p));
    if (!p) return HM_ERROR_OUT_OF_HOST_MEMORY;
    /* Only what the table's version has is read; the rest stays NULL. */
    memcpy(&p->ops, ops, ops->version == 1u   ? OPS_V1_SIZE
                         : ops->version == 2u ? OPS_V2_SIZE
                                              : sizeof(*ops));
    p->ops.version = HM_PROVIDER_OPS_VERSION;
    uint32_t op_caps = caps_from_ops(&p->ops);
    if (!(op_caps & HM_PROVIDER_CAP_IPC)) p->ops.ipc.close_many = NULL;
    hm_result_t r = ops->init(params, &p->state);
    if (r != HM_SUCCESS) {
        HM_LOG_INFO("provider '%s' init failed: %s", ops->name ? ops->name : "?",
                    hm_result_string(r));
        free(p);
        return r;
    }
    /* A driver loaded by this init may have registered fork handlers: the
     * library's go before them again (fork.h). */
    hm__fork_after_drivers();
    ops->get_info(p->state, &p->info);
    if (!p->info.name) p->info.name = ops->name ? ops->name : "unnamed";
    p->info.caps &= op_caps;
    if (!(p->info.caps & HM_PROVIDER_CAP_IPC)) { /* this provider's memory has no IPC */
        p->ops.ipc_compatible = NULL;
        p->ops.ipc_context = NULL;
    }
    /* FILL, COPY and STREAMS are the ops themselves. */
    if (p->ops.fill) p->info.caps |= HM_PROVIDER_CAP_FILL;
    if (p->ops.copy) p->info.caps |= HM_PROVIDER_CAP_COPY;
    if (p->ops.stream.event_create && p->ops.stream.event_record &&
        p->ops.stream.event_query && p->ops.stream.event_sync && p->ops.stream.event_destroy)
        p->info.caps |= HM_PROVIDER_CAP_STREAMS;
    else
        memset(&p->ops.stream, 0, sizeof(p->ops.stream));
    p->device.ordinal = -1;
    if (p->ops.get_device) {
        p->ops.get_device(p->state, &p->device);
        if (p->device.ordinal < -1) p->device.ordinal = -1;
        if (!p->device.has_uuid) memset(p->device.uuid, 0, sizeof(p->device.uuid));
    }
    if (p->ops.ipc_context) p->ipc_context = p->ops.ipc_context(p->state);
    if (!hm_is_pow2(p->info.min_page_size)) p->info.min_page_size = 1;
    if (!hm_is_pow2(p->info.recommended_page_size) ||
        p->info.recommended_page_size < p->info.min_page_size)
        p->info.recommended_page_size = p->info.min_page_size;
    if (!hm__handle_register(p, HM_HANDLE_PROVIDER)) {
        ops->fini(p->state);
        free(p);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    *out = p;
    return HM_SUCCESS;
}

hm_result_t hm_provider_destroy(hm_provider_t *p) {
    if (!p) {
        HM_LOG_ERROR("hm_provider_destroy(NULL)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!hm__handle_unregister(p, HM_HANDLE_PROVIDER)) {
        HM_LOG_ERROR("hm_provider_destroy(%p): not a live provider (double destroy?)", (void *)p);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm__ipc_provider_gone(p); /* exports of its ranges that outlived their pools */
    p->ops.fini(p->state);
    free(p);
    return HM_SUCCESS;
}

HM_RUN int hm__provider_is_live(const hm_provider_t *p) {
    return p && hm__handle_is_live(p, HM_HANDLE_PROVIDER);
}

#define CHECK_PROVIDER(p, what)                                   \
    do {                                                          \
        if (hm_unlikely(!(p))) {                                  \
            HM_LOG_ERROR("%s: provider is NULL", what);           \
            return HM_ERROR_INVALID_ARGUMENT;                     \
        }                                                         \
    } while (0)

HM_RUN hm_result_t hm_provider_alloc(hm_provider_t *p, size_t size, size_t alignment, void **ptr) {
    if (ptr) *ptr = NULL; /* on every failure, this one's included */
    CHECK_PROVIDER(p, "hm_provider_alloc");
    if (hm_unlikely(!ptr)) {
        HM_LOG_ERROR("hm_provider_alloc: out pointer is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *ptr = NULL;
    if (hm_unlikely(size == 0)) {
        HM_LOG_ERROR("hm_provider_alloc(%s): size 0", p->info.name);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_unlikely(alignment && !hm_is_pow2(alignment))) {
        HM_LOG_ERROR("hm_provider_alloc(%s): alignment %zu is not a power of two", p->info.name,
                     alignment);
        return HM_ERROR_INVALID_ALIGNMENT;
    }
    /* Sizes no address space can hold: refuse before asking the OS. */
    if (hm_unlikely(size > (SIZE_MAX >> 1) || alignment > (SIZE_MAX >> 2))) {
        HM_LOG_WARN("hm_provider_alloc(%s): size %zu / alignment %zu too large", p->info.name,
                    size, alignment);
        return HM_ERROR_OUT_OF_MEMORY;
    }
    hm_result_t r = p->ops.alloc(p->state, size, alignment, ptr);
    if (hm_unlikely(r == HM_SUCCESS && !*ptr)) {
        HM_LOG_ERROR("provider '%s' returned success and NULL", p->info.name);
        return HM_ERROR_UNKNOWN;
    }
    if (hm_unlikely(r == HM_SUCCESS && alignment && ((uintptr_t)*ptr & (alignment - 1)))) {
        HM_LOG_ERROR("provider '%s' returned %p, not aligned to %zu", p->info.name, *ptr,
                     alignment);
        if (p->ops.free) p->ops.free(p->state, *ptr, size);
        *ptr = NULL;
        return HM_ERROR_UNKNOWN;
    }
    if (r != HM_SUCCESS) *ptr = NULL;
    return r;
}

static hm_result_t range_args(const hm_provider_t *p, const void *ptr, size_t size,
                              const char *what) {
    if (hm_unlikely(!p)) {
        HM_LOG_ERROR("%s: provider is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_unlikely(!ptr || !size)) {
        HM_LOG_ERROR("%s(%s): %s", what, p->info.name, !ptr ? "ptr is NULL" : "size 0");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_provider_free(hm_provider_t *p, void *ptr, size_t size) {
    hm_result_t r = range_args(p, ptr, size, "hm_provider_free");
    if (r) return r;
    if (!p->ops.free) return HM_ERROR_NOT_SUPPORTED;
    return p->ops.free(p->state, ptr, size);
}

hm_result_t hm_provider_purge_lazy(hm_provider_t *p, void *ptr, size_t size) {
    hm_result_t r = range_args(p, ptr, size, "hm_provider_purge_lazy");
    if (r) return r;
    if (!p->ops.purge_lazy) return HM_ERROR_NOT_SUPPORTED;
    return p->ops.purge_lazy(p->state, ptr, size);
}

hm_result_t hm_provider_purge_force(hm_provider_t *p, void *ptr, size_t size) {
    hm_result_t r = range_args(p, ptr, size, "hm_provider_purge_force");
    if (r) return r;
    if (!p->ops.purge_force) return HM_ERROR_NOT_SUPPORTED;
    return p->ops.purge_force(p->state, ptr, size);
}

hm_result_t hm_provider_split(hm_provider_t *p, void *ptr, size_t total, size_t first) {
    hm_result_t r = range_args(p, ptr, total, "hm_provider_split");
    if (r) return r;
    if (!(p->info.caps & HM_PROVIDER_CAP_SPLIT_MERGE)) return HM_ERROR_NOT_SUPPORTED;
    if (first == 0 || first >= total) {
        HM_LOG_ERROR("hm_provider_split(%s): first %zu not inside total %zu", p->info.name, first,
                     total);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return p->ops.split(p->state, ptr, total, first);
}

hm_result_t hm_provider_merge(hm_provider_t *p, void *lo, void *hi, size_t total) {
    hm_result_t r = range_args(p, lo, total, "hm_provider_merge");
    if (r) return r;
    if (!hi || (uintptr_t)hi <= (uintptr_t)lo || (uintptr_t)hi - (uintptr_t)lo >= total) {
        HM_LOG_ERROR("hm_provider_merge(%s): hi %p not inside [lo %p, +%zu)", p->info.name, hi,
                     lo, total);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!(p->info.caps & HM_PROVIDER_CAP_SPLIT_MERGE)) return HM_ERROR_NOT_SUPPORTED;
    return p->ops.merge(p->state, lo, hi, total);
}

/* [ptr, ptr + size) wraps around the address space (or ends at its very
 * top, where ptr + size itself would wrap). */
static bool wraps(const void *ptr, size_t size) { return (uintptr_t)ptr > UINTPTR_MAX - size; }

hm_result_t hm_provider_fill(hm_provider_t *p, void *ptr, uint8_t value, size_t size) {
    CHECK_PROVIDER(p, "hm_provider_fill");
    if (hm_unlikely(!ptr)) {
        HM_LOG_ERROR("hm_provider_fill(%s): ptr is NULL", p->info.name);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!size) return HM_SUCCESS;
    if (hm_unlikely(wraps(ptr, size))) {
        HM_LOG_ERROR("hm_provider_fill(%s): [%p, +%zu) wraps around", p->info.name, ptr, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!p->ops.fill) return HM_ERROR_NOT_SUPPORTED;
    return p->ops.fill(p->state, ptr, value, size);
}

hm_result_t hm_provider_copy(hm_provider_t *p, void *dst, const void *src, size_t size) {
    CHECK_PROVIDER(p, "hm_provider_copy");
    if (hm_unlikely(!dst || !src)) {
        HM_LOG_ERROR("hm_provider_copy(%s): %s is NULL", p->info.name, !dst ? "dst" : "src");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!size) return HM_SUCCESS;
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (hm_unlikely(wraps(dst, size) || wraps(src, size))) {
        HM_LOG_ERROR("hm_provider_copy(%s): a range of %zu bytes at %s %p wraps around",
                     p->info.name, size, wraps(dst, size) ? "dst" : "src",
                     wraps(dst, size) ? dst : src);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (hm_unlikely(d < s + size && s < d + size)) {
        HM_LOG_ERROR("hm_provider_copy(%s): dst %p and src %p overlap (%zu bytes)", p->info.name,
                     dst, src, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!p->ops.copy) return HM_ERROR_NOT_SUPPORTED;
    return p->ops.copy(p->state, dst, src, size);
}

hm_result_t hm__provider_ipc_compatible(hm_provider_t *p, const void *payload) {
    if (!p->ops.ipc_compatible) return HM_SUCCESS;
    return p->ops.ipc_compatible(p->state, payload);
}

hm_result_t hm_provider_get_device(const hm_provider_t *p, hm_device_id_t *device) {
    if (!p || !device) {
        HM_LOG_ERROR("hm_provider_get_device: %s is NULL", !p ? "provider" : "device");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *device = p->device;
    return HM_SUCCESS;
}

hm_result_t hm_provider_get_info(const hm_provider_t *p, hm_provider_info_t *info) {
    if (!p || !info) {
        HM_LOG_ERROR("hm_provider_get_info: NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *info = p->info;
    return HM_SUCCESS;
}

const char *hm_provider_name(const hm_provider_t *p) { return p ? p->info.name : "(null)"; }
HM_RUN hm_memory_kind_t hm_provider_memory_kind(const hm_provider_t *p) {
    return p ? p->info.kind : HM_MEMORY_HOST;
}
HM_RUN bool hm_provider_cpu_accessible(const hm_provider_t *p) {
    return p && (p->info.caps & HM_PROVIDER_CAP_CPU_ACCESS);
}
HM_RUN
size_t hm_provider_min_page_size(const hm_provider_t *p) { return p ? p->info.min_page_size : 0; }
HM_RUN size_t hm_provider_recommended_page_size(const hm_provider_t *p) {
    return p ? p->info.recommended_page_size : 0;
}
HM_RUN uint32_t hm_provider_caps(const hm_provider_t *p) { return p ? p->info.caps : 0; }
const hm_provider_ops_t *hm_provider_get_ops(const hm_provider_t *p) { return p ? &p->ops : NULL; }
void *hm_provider_get_state(const hm_provider_t *p) { return p ? p->state : NULL; }
