/* hetmem — memory spaces: create, clone, destroy, contents.
 * SPDX-License-Identifier: MIT */
#include "memspace/memspace_internal.h"

#include <stdlib.h>
#include <string.h>

hm_result_t hm__ms_check(const hm_memspace_t *space, const char *what) {
    if (!space) {
        HM_LOG_ERROR("%s: space is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!hm__handle_is_live(space, HM_HANDLE_MEMSPACE) || space->magic != HM_MEMSPACE_MAGIC) {
        HM_LOG_ERROR("%s: %p is not a live memory space", what, (const void *)space);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm__ms_check_target(const hm_memtarget_t *target, const char *what) {
    if (!target) {
        HM_LOG_ERROR("%s: target is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (target->magic != HM_MEMTARGET_MAGIC || !target->topo ||
        target->index >= target->topo->n || &target->topo->targets[target->index] != target) {
        HM_LOG_ERROR("%s: %p is not a memory target", what, (const void *)target);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

/* An empty space of topo, taking a reference; n is set by the caller. */
static hm_memspace_t *space_new(hm_ms_topo_t *topo) {
    hm_memspace_t *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->idx = calloc(topo->n, sizeof(*s->idx));
    if (!s->idx) {
        free(s);
        return NULL;
    }
    s->magic = HM_MEMSPACE_MAGIC;
    s->topo = topo;
    hm__ms_topo_ref(topo);
    return s;
}

static void space_free(hm_memspace_t *s) {
    hm__ms_topo_put(s->topo);
    s->magic = 0;
    free(s->idx);
    free(s);
}

static hm_result_t publish(hm_memspace_t *s, hm_memspace_t **out) {
    if (!hm__handle_register(s, HM_HANDLE_MEMSPACE)) {
        space_free(s);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    *out = s;
    return HM_SUCCESS;
}

hm_result_t hm__ms_create_from_mask(hm_ms_topo_t *topo, const unsigned char *keep,
                                    hm_memspace_t **space) {
    hm_memspace_t *s = space_new(topo);
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < topo->n; i++)
        if (keep[i]) s->idx[s->n++] = (uint32_t)i;
    HM_ASSERT(s->n > 0);
    return publish(s, space);
}

size_t hm__ms_snapshot(const hm_memspace_t *space, uint32_t *idx) {
    hm__ms_lock();
    size_t n = space->n;
    memcpy(idx, space->idx, n * sizeof(*idx));
    hm__ms_unlock();
    return n;
}

hm_result_t hm_memspace_create_from_ids(const unsigned *ids, size_t count,
                                        hm_memspace_t **space) {
    hm__init();
    if (!space || !ids || !count) {
        HM_LOG_ERROR("hm_memspace_create_from_ids: %s", !space ? "space is NULL"
                                                        : !ids ? "ids is NULL"
                                                               : "no ids");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *space = NULL;
    hm_ms_topo_t *topo;
    hm_result_t r = hm__ms_topo_get(&topo);
    if (r) return r;
    unsigned char *keep = calloc(topo->n, 1);
    if (!keep) {
        hm__ms_topo_put(topo);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    for (size_t i = 0; i < count && r == HM_SUCCESS; i++) {
        const struct hm_memtarget *t = hm__ms_target_by_id(topo, ids[i]);
        if (!t) {
            HM_LOG_ERROR("hm_memspace_create_from_ids: NUMA node %u does not exist (%zu "
                         "node(s) known)",
                         ids[i], topo->n);
            r = HM_ERROR_INVALID_ARGUMENT;
        } else if (keep[t->index]) {
            HM_LOG_ERROR("hm_memspace_create_from_ids: node %u listed twice", ids[i]);
            r = HM_ERROR_INVALID_ARGUMENT;
        } else {
            keep[t->index] = 1;
        }
    }
    if (r == HM_SUCCESS) r = hm__ms_create_from_mask(topo, keep, space);
    free(keep);
    hm__ms_topo_put(topo);
    return r;
}

hm_result_t hm_memspace_clone(const hm_memspace_t *space, hm_memspace_t **clone) {
    hm__init();
    hm_result_t r = hm__ms_check(space, "hm_memspace_clone");
    if (r) return r;
    if (!clone) {
        HM_LOG_ERROR("hm_memspace_clone: clone is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *clone = NULL;
    hm_memspace_t *s = space_new(space->topo);
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    s->n = hm__ms_snapshot(space, s->idx);
    return publish(s, clone);
}

hm_result_t hm_memspace_destroy(hm_memspace_t *space) {
    if (!space) {
        HM_LOG_ERROR("hm_memspace_destroy: space is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!hm__handle_unregister(space, HM_HANDLE_MEMSPACE)) {
        HM_LOG_ERROR("hm_memspace_destroy: %p is not a live memory space (destroyed twice?)",
                     (void *)space);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    space_free(space);
    return HM_SUCCESS;
}

hm_result_t hm_memspace_target_count(const hm_memspace_t *space, size_t *count) {
    hm_result_t r = hm__ms_check(space, "hm_memspace_target_count");
    if (r) return r;
    if (!count) {
        HM_LOG_ERROR("hm_memspace_target_count: count is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm__ms_lock();
    *count = space->n;
    hm__ms_unlock();
    return HM_SUCCESS;
}

hm_result_t hm_memspace_target_get(const hm_memspace_t *space, size_t index,
                                   const hm_memtarget_t **target) {
    hm_result_t r = hm__ms_check(space, "hm_memspace_target_get");
    if (r) return r;
    if (!target) {
        HM_LOG_ERROR("hm_memspace_target_get: target is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *target = NULL;
    size_t n;
    hm__ms_lock();
    n = space->n;
    if (index < n) *target = &space->topo->targets[space->idx[index]];
    hm__ms_unlock();
    if (!*target) {
        HM_LOG_ERROR("hm_memspace_target_get: index %zu, the space has %zu target(s)", index, n);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_memspace_ids(const hm_memspace_t *space, unsigned *ids, size_t capacity,
                            size_t *count) {
    hm_result_t r = hm__ms_check(space, "hm_memspace_ids");
    if (r) return r;
    if (!count || (!ids && capacity)) {
        HM_LOG_ERROR("hm_memspace_ids: %s", !count ? "count is NULL" : "ids is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm__ms_lock();
    size_t n = space->n;
    for (size_t i = 0; i < n && i < capacity; i++)
        ids[i] = space->topo->targets[space->idx[i]].os_id;
    hm__ms_unlock();
    *count = n;
    return (ids && n > capacity) ? HM_ERROR_LIMIT : HM_SUCCESS;
}

/* The target argument, checked to be of space's topology. */
static hm_result_t check_member(const hm_memspace_t *space, const hm_memtarget_t *target,
                                const char *what) {
    hm_result_t r = hm__ms_check(space, what);
    if (r) return r;
    if ((r = hm__ms_check_target(target, what))) return r;
    if (target->topo != space->topo) {
        HM_LOG_ERROR("%s: node %u is a target of another topology than the space's", what,
                     target->os_id);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_memspace_target_add(hm_memspace_t *space, const hm_memtarget_t *target) {
    hm_result_t r = check_member(space, target, "hm_memspace_target_add");
    if (r) return r;
    uint32_t t = target->index;
    int there = 0;
    hm__ms_lock();
    size_t i = 0;
    while (i < space->n && space->idx[i] < t) i++;
    if (i < space->n && space->idx[i] == t) {
        there = 1;
    } else {
        /* Room for every node of the topology, so never full here. */
        memmove(&space->idx[i + 1], &space->idx[i], (space->n - i) * sizeof(*space->idx));
        space->idx[i] = t;
        space->n++;
    }
    hm__ms_unlock();
    if (there) {
        HM_LOG_ERROR("hm_memspace_target_add: node %u is in the space already", target->os_id);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_memspace_target_remove(hm_memspace_t *space, const hm_memtarget_t *target) {
    hm_result_t r = check_member(space, target, "hm_memspace_target_remove");
    if (r) return r;
    uint32_t t = target->index;
    const char *why = NULL;
    hm__ms_lock();
    size_t i = 0;
    while (i < space->n && space->idx[i] != t) i++;
    if (i == space->n) {
        why = "is not in the space";
    } else if (space->n == 1) {
        why = "is the space's last target (a space is never empty)";
    } else {
        memmove(&space->idx[i], &space->idx[i + 1], (space->n - i - 1) * sizeof(*space->idx));
        space->n--;
    }
    hm__ms_unlock();
    if (why) {
        HM_LOG_ERROR("hm_memspace_target_remove: node %u %s", target->os_id, why);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}
