/* hetmem — memory spaces: the in-place filters.
 * SPDX-License-Identifier: MIT */
#include "memspace/memspace_internal.h"

#include <stdlib.h>

/* Removes from space the targets whose drop[index] is set, unless that
 * would leave none (then nothing changes). */
static hm_result_t apply(hm_memspace_t *space, const unsigned char *drop, const char *what) {
    int empty = 0;
    hm__ms_lock();
    size_t left = 0;
    for (size_t i = 0; i < space->n; i++) left += !drop[space->idx[i]];
    if (left == 0) {
        empty = 1;
    } else {
        size_t k = 0;
        for (size_t i = 0; i < space->n; i++)
            if (!drop[space->idx[i]]) space->idx[k++] = space->idx[i];
        space->n = k;
    }
    hm__ms_unlock();
    if (empty) {
        HM_LOG_ERROR("%s: no target of the space passes (a space is never empty; unchanged)",
                     what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_memspace_filter_by_id(hm_memspace_t *space, const unsigned *ids, size_t count) {
    const char *what = "hm_memspace_filter_by_id";
    hm_result_t r = hm__ms_check(space, what);
    if (r) return r;
    if (!ids || !count) {
        HM_LOG_ERROR("%s: %s", what, !ids ? "ids is NULL" : "no ids");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    const hm_ms_topo_t *topo = space->topo;
    unsigned char *drop = malloc(topo->n);
    if (!drop) return HM_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < topo->n; i++) drop[i] = 1;
    for (size_t i = 0; i < count; i++) {
        const struct hm_memtarget *t = hm__ms_target_by_id(topo, ids[i]);
        if (!t) {
            HM_LOG_ERROR("%s: NUMA node %u does not exist (%zu node(s) known)", what, ids[i],
                         topo->n);
            free(drop);
            return HM_ERROR_INVALID_ARGUMENT;
        }
        drop[t->index] = 0;
    }
    r = apply(space, drop, what);
    free(drop);
    return r;
}

hm_result_t hm_memspace_filter_by_capacity(hm_memspace_t *space, uint64_t min_bytes) {
    const char *what = "hm_memspace_filter_by_capacity";
    hm_result_t r = hm__ms_check(space, what);
    if (r) return r;
    const hm_ms_topo_t *topo = space->topo;
    unsigned char *drop = malloc(topo->n);
    if (!drop) return HM_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < topo->n; i++) drop[i] = topo->targets[i].capacity < min_bytes;
    r = apply(space, drop, what);
    free(drop);
    return r;
}

static int is_result(int v) {
    switch (v) {
#define HM_X(name, value, msg) case value:
        HM_RESULT_MAP(HM_X)
#undef HM_X
        return 1;
    }
    return 0;
}

hm_result_t hm_memspace_filter(hm_memspace_t *space, hm_memspace_filter_fn fn, void *arg) {
    const char *what = "hm_memspace_filter";
    hm_result_t r = hm__ms_check(space, what);
    if (r) return r;
    if (!fn) {
        HM_LOG_ERROR("%s: fn is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    const hm_ms_topo_t *topo = space->topo;
    uint32_t *idx = malloc(topo->n * sizeof(*idx));
    unsigned char *drop = calloc(topo->n, 1);
    if (!idx || !drop) {
        free(idx);
        free(drop);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    /* The callback runs without the lock, on a snapshot: it may call the
     * getters on this space. */
    size_t n = hm__ms_snapshot(space, idx);
    for (size_t i = 0; i < n && r == HM_SUCCESS; i++) {
        int v = fn(space, &topo->targets[idx[i]], arg);
        if (v < 0) {
            r = is_result(v) ? (hm_result_t)v : HM_ERROR_UNKNOWN;
            HM_LOG_INFO("%s: the callback returned %d for node %u: %s", what, v,
                        topo->targets[idx[i]].os_id, hm_result_string(r));
        } else if (v == 0) {
            drop[idx[i]] = 1;
        }
    }
    if (r == HM_SUCCESS) r = apply(space, drop, what);
    free(idx);
    free(drop);
    return r;
}
