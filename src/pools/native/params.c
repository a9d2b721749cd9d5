/* hetmem — the native pool: the parameters (hm_native_params_*, params_ok).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Params                                                                   */

#define NV_PARAMS_MAGIC 0x6e617469766550ull

enum {
    SET_SLAB = 1u << 0,
    SET_LIMIT = 1u << 1,
    SET_LARGE = 1u << 2,
    SET_RETAINED = 1u << 3,
};

struct hm_native_params {
    uint64_t magic;
    unsigned set;
    hm_native_defaults_t defaults;
    size_t slab_size, class_limit, large_threshold, retained;
    hm_native_remote_queue_t queue;
    unsigned batch;
};

HM_RUN hm_result_t hm_native_params_create(hm_native_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_native_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_native_params_t *p = calloc(1, sizeof(*p));
    if (!p) return HM_ERROR_OUT_OF_HOST_MEMORY;
    p->magic = NV_PARAMS_MAGIC;
    p->batch = NV_BATCH_CAP;
    *params = p;
    return HM_SUCCESS;
}

static int params_ok(const hm_native_params_t *p, const char *fn) {
    if (p && p->magic == NV_PARAMS_MAGIC) return 1;
    HM_LOG_ERROR("%s: %s", fn, p ? "not a native params object" : "params is NULL");
    return 0;
}

HM_RUN hm_result_t hm_native_params_destroy(hm_native_params_t *params) {
    if (!params) return HM_SUCCESS;
    if (!params_ok(params, "hm_native_params_destroy")) return HM_ERROR_INVALID_ARGUMENT;
    params->magic = 0;
    free(params);
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_defaults(hm_native_params_t *params,
                                          hm_native_defaults_t defaults) {
    if (!params_ok(params, "hm_native_params_set_defaults")) return HM_ERROR_INVALID_ARGUMENT;
    if (defaults != HM_NATIVE_DEFAULTS_AUTO && defaults != HM_NATIVE_DEFAULTS_HOST &&
        defaults != HM_NATIVE_DEFAULTS_DEVICE) {
        HM_LOG_ERROR("hm_native_params_set_defaults: unknown defaults %d", (int)defaults);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->defaults = defaults;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_slab_size(hm_native_params_t *params, size_t size) {
    if (!params_ok(params, "hm_native_params_set_slab_size")) return HM_ERROR_INVALID_ARGUMENT;
    if (!hm_is_pow2(size) || size < NV_SLAB_MIN || size > NV_SLAB_MAX) {
        HM_LOG_ERROR("hm_native_params_set_slab_size(%zu): must be a power of two in "
                     "[4 KiB, 64 MiB]", size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->slab_size = size;
    params->set |= SET_SLAB;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_size_class_limit(hm_native_params_t *params, size_t size) {
    if (!params_ok(params, "hm_native_params_set_size_class_limit"))
        return HM_ERROR_INVALID_ARGUMENT;
    if (size < 64 || size > NV_CLASS_LIMIT_MAX) {
        HM_LOG_ERROR("hm_native_params_set_size_class_limit(%zu): must be in [64 B, 1 MiB]",
                     size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->class_limit = size;
    params->set |= SET_LIMIT;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_large_threshold(hm_native_params_t *params, size_t size) {
    if (!params_ok(params, "hm_native_params_set_large_threshold"))
        return HM_ERROR_INVALID_ARGUMENT;
    params->large_threshold = size;
    params->set |= SET_LARGE;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_retained_bytes(hm_native_params_t *params, size_t bytes) {
    if (!params_ok(params, "hm_native_params_set_retained_bytes"))
        return HM_ERROR_INVALID_ARGUMENT;
    params->retained = bytes;
    params->set |= SET_RETAINED;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_remote_queue(hm_native_params_t *params,
                                              hm_native_remote_queue_t queue) {
    if (!params_ok(params, "hm_native_params_set_remote_queue"))
        return HM_ERROR_INVALID_ARGUMENT;
    if (queue != HM_NATIVE_QUEUE_WFCQ && queue != HM_NATIVE_QUEUE_MUTEX) {
        HM_LOG_ERROR("hm_native_params_set_remote_queue: unknown queue %d", (int)queue);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->queue = queue;
    return HM_SUCCESS;
}

HM_RUN hm_result_t hm_native_params_set_remote_batch(hm_native_params_t *params, unsigned count) {
    if (!params_ok(params, "hm_native_params_set_remote_batch"))
        return HM_ERROR_INVALID_ARGUMENT;
    if (count < 1 || count > NV_BATCH_CAP) {
        HM_LOG_ERROR("hm_native_params_set_remote_batch(%u): must be in [1, %u]", count,
                     NV_BATCH_CAP);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->batch = count;
    return HM_SUCCESS;
}
