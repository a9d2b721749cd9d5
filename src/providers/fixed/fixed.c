/* hetmem — the fixed provider: memory out of a caller's buffer.
 * SPDX-License-Identifier: MIT
 *
 * A bump allocator over [buffer, buffer+size) aligned to 4 KiB pages. It has
 * no free until the coarse layer lands (issue 6): the ops table leaves free
 * NULL, so HM_PROVIDER_CAP_FREE is absent and pools keep and reuse what they
 * got. Thread-safe: one mutex guards the bump pointer (never held across a
 * syscall). */
#include "internal.h"
#include "provider_internal.h"

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
    pthread_mutex_t lock;
    uintptr_t begin, end; /* page-aligned usable part of the buffer */
    uintptr_t next;       /* bump pointer, guarded by lock */
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
    pthread_mutex_init(&s->lock, NULL);
    s->begin = s->next = begin;
    s->end = end;
    s->kind = p->kind;
    s->cpu_accessible = p->cpu_accessible;
    *state = s;
    return HM_SUCCESS;
}

static void fixed_fini(void *state) {
    fixed_state_t *s = state;
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void fixed_get_info(void *state, hm_provider_info_t *info) {
    fixed_state_t *s = state;
    memset(info, 0, sizeof(*info));
    info->name = "fixed";
    info->family = HM_PROVIDER_FAMILY_FIXED;
    info->kind = s->kind;
    info->caps = s->cpu_accessible ? HM_PROVIDER_CAP_CPU_ACCESS : 0;
    info->min_page_size = FIXED_PAGE;
    info->recommended_page_size = FIXED_PAGE;
}

static hm_result_t fixed_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    fixed_state_t *s = state;
    size_t sz = hm_align_up(size, FIXED_PAGE);
    if (alignment < FIXED_PAGE) alignment = FIXED_PAGE;
    if (!sz) return HM_ERROR_OUT_OF_MEMORY;
    hm__mutex_lock(&s->lock);
    uintptr_t at = hm_align_up(s->next, alignment);
    int fits = at && at >= s->next && at <= s->end && sz <= s->end - at;
    if (fits) s->next = at + sz;
    hm__mutex_unlock(&s->lock);
    if (!fits) {
        HM_LOG_INFO("fixed provider: %zu bytes aligned to %zu do not fit", size, alignment);
        return HM_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (void *)at;
    return HM_SUCCESS;
}

static const hm_provider_ops_t fixed_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "fixed",
    .init = fixed_init,
    .fini = fixed_fini,
    .get_info = fixed_get_info,
    .alloc = fixed_alloc,
    /* free, purge, split/merge, ipc: not until the coarse layer (issue 6). */
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
