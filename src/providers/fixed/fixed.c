/* hetmem — the fixed provider: memory out of a caller's buffer.
 * SPDX-License-Identifier: MIT
 *
 * The page-aligned inside of [buffer, buffer+size) is one region of the
 * coarse layer (src/providers/coarse/coarse.h), which gives best-fit alloc, free,
 * split and merge with coalescing; thread-safe through the coarse lock. The
 * coarse object cannot grow and releases nothing: the buffer stays the
 * caller's. Memory never goes back to the OS (no purge: hetmem does not
 * know what the caller's buffer is, and it may be device memory). */
#include "internal.h"
#include "provider_internal.h"
#include "providers/coarse/coarse.h"

#include <stdlib.h>
#include <string.h>

#define FIXED_PAGE 4096u

struct hm_fixed_params {
    void *buffer;
    size_t size;
    hm_memory_kind_t kind;
    bool cpu_accessible;
};

typedef struct fixed_state {
    hm_coarse_t *coarse; /* one region: the page-aligned inside of the buffer */
    hm_memory_kind_t kind;
    bool cpu_accessible;
} fixed_state_t;

hm_result_t hm_fixed_params_create(void *buffer, size_t size, hm_fixed_params_t **params) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    *params = NULL;
    if (!buffer || !size) {
        HM_LOG_ERROR("hm_fixed_params_create: %s", !buffer ? "buffer is NULL" : "size is 0");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_fixed_params_t *p = calloc(1, sizeof(*p));
    if (!p) return HM_ERROR_OUT_OF_HOST_MEMORY;
    p->buffer = buffer;
    p->size = size;
    p->kind = HM_MEMORY_HOST;
    p->cpu_accessible = true;
    *params = p;
    return HM_SUCCESS;
}

hm_result_t hm_fixed_params_destroy(hm_fixed_params_t *params) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_fixed_params_set_memory_kind(hm_fixed_params_t *params, hm_memory_kind_t kind,
                                            bool cpu_accessible) {
    if (!params || (unsigned)kind > HM_MEMORY_SHARED) {
        HM_LOG_ERROR("hm_fixed_params_set_memory_kind: bad argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->kind = kind;
    params->cpu_accessible = cpu_accessible;
    return HM_SUCCESS;
}

static hm_result_t fixed_init(const void *params, void **state) {
    const hm_fixed_params_t *p = params;
    if (!p) {
        HM_LOG_ERROR("fixed provider: params are required (hm_fixed_params_create)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    uintptr_t b = (uintptr_t)p->buffer, e;
    if (__builtin_add_overflow(b, p->size, &e)) return HM_ERROR_INVALID_ARGUMENT;
    uintptr_t begin = hm_align_up(b, FIXED_PAGE), end = hm_align_down(e, FIXED_PAGE);
    if (!begin || begin >= end) {
        HM_LOG_ERROR("fixed provider: buffer [%p, +%zu) holds no whole 4 KiB page", p->buffer,
                     p->size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    fixed_state_t *s = calloc(1, sizeof(*s));
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    hm_result_t r = hm__coarse_create(NULL, NULL, FIXED_PAGE, &s->coarse);
    if (r == HM_SUCCESS) r = hm__coarse_add_region(s->coarse, (void *)begin, end - begin, 0);
    if (r != HM_SUCCESS) {
        hm__coarse_destroy(s->coarse);
        free(s);
        return r;
    }
    s->kind = p->kind;
    s->cpu_accessible = p->cpu_accessible;
    *state = s;
    return HM_SUCCESS;
}

static void fixed_fini(void *state) {
    fixed_state_t *s = state;
    hm__coarse_destroy(s->coarse);
    free(s);
}

static void fixed_get_info(void *state, hm_provider_info_t *info) {
    fixed_state_t *s = state;
    memset(info, 0, sizeof(*info));
    info->name = "fixed";
    info->family = HM_PROVIDER_FAMILY_FIXED;
    info->kind = s->kind;
    info->caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_SPLIT_MERGE;
    if (s->cpu_accessible) info->caps |= HM_PROVIDER_CAP_CPU_ACCESS;
    info->min_page_size = FIXED_PAGE;
    info->recommended_page_size = FIXED_PAGE;
}

static hm_result_t fixed_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    fixed_state_t *s = state;
    hm_result_t r = hm__coarse_alloc(s->coarse, size, alignment, ptr);
    if (r == HM_ERROR_OUT_OF_MEMORY)
        HM_LOG_INFO("fixed provider: %zu bytes aligned to %zu do not fit", size, alignment);
    return r;
}

static hm_result_t fixed_free(void *state, void *ptr, size_t size) {
    fixed_state_t *s = state;
    return hm__coarse_free(s->coarse, ptr, size);
}

static hm_result_t fixed_split(void *state, void *ptr, size_t total, size_t first) {
    fixed_state_t *s = state;
    return hm__coarse_split(s->coarse, ptr, total, first);
}

static hm_result_t fixed_merge(void *state, void *lo, void *hi, size_t total) {
    fixed_state_t *s = state;
    return hm__coarse_merge(s->coarse, lo, hi, total);
}

static const hm_provider_ops_t fixed_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fixed",
    .init = fixed_init,
    .fini = fixed_fini,
    .get_info = fixed_get_info,
    .alloc = fixed_alloc,
    .free = fixed_free,
    /* purge: none (the caller's buffer); ipc: none (no name to share it by). */
    .split = fixed_split,
    .merge = fixed_merge,
};

const hm_provider_ops_t *hm_fixed_provider_ops(void) { return &fixed_ops; }

hm_result_t hm_fixed_provider_create(void *buffer, size_t size, hm_provider_t **provider) {
    hm_fixed_params_t *p;
    hm_result_t r = hm_fixed_params_create(buffer, size, &p);
    if (r != HM_SUCCESS) return r;
    r = hm_provider_create(&fixed_ops, p, provider);
    hm_fixed_params_destroy(p);
    return r;
}
