/* hetmem — memory spaces: topologies, their targets, initiators and
 * localities. SPDX-License-Identifier: MIT */
#include "memspace/memspace_internal.h"

#include "fork.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* The topology new spaces use: NULL means this machine's (sys). Under g_lock;
 * holds one reference. */
static hm_ms_topo_t *g_cur;

/* This machine's, loaded once and kept for the process's life (a reference
 * that is never put), like the OS provider's. */
static pthread_once_t sys_once = PTHREAD_ONCE_INIT;
static hm_ms_topo_t *sys_topo;
static int sys_errno;
static const char *sys_failed;

void hm__ms_lock(void) { hm__mutex_lock(&g_lock); }
void hm__ms_unlock(void) { hm__mutex_unlock(&g_lock); }

/* The MEMSPACE fork slot: the forking thread holds g_lock across fork(), so
 * the child never inherits it held by a thread it does not have. */
static void ms_fork_prepare(void) { hm__mutex_lock(&g_lock); }
static void ms_fork_release(void) { hm__mutex_unlock(&g_lock); }
static const hm_fork_hooks_t ms_fork_hooks = {ms_fork_prepare, ms_fork_release,
                                              ms_fork_release};
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void fork_start(void) { hm__fork_enable(HM_FORK_MEMSPACE, &ms_fork_hooks); }

static hm_memtarget_kind_t kind_of(hwloc_obj_t node) {
    static const struct {
        const char *name;
        hm_memtarget_kind_t kind;
    } names[] = {
        {"DRAM", HM_MEMTARGET_DRAM},         {"HBM", HM_MEMTARGET_HBM},
        {"MCDRAM", HM_MEMTARGET_HBM},        {"NVM", HM_MEMTARGET_NVM},
        {"CXL-DRAM", HM_MEMTARGET_CXL_DRAM}, {"CXL-NVM", HM_MEMTARGET_CXL_NVM},
        {"SPM", HM_MEMTARGET_SPM},           {"GPUMemory", HM_MEMTARGET_GPU},
    };
    const char *s = node->subtype;
    if (!s || !*s) {
        /* hwloc 2.8+ names where a DAX device's memory comes from. */
        const char *dax = hwloc_obj_get_info_by_name(node, "DAXType");
        if (dax && !strcasecmp(dax, "NVM")) return HM_MEMTARGET_NVM;
        if (dax && !strcasecmp(dax, "SPM")) return HM_MEMTARGET_SPM;
        return HM_MEMTARGET_DRAM;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcasecmp(s, names[i].name)) return names[i].kind;
    return HM_MEMTARGET_OTHER;
}

static int by_os_id(const void *a, const void *b) {
    const struct hm_memtarget *x = a, *y = b;
    return (x->os_id > y->os_id) - (x->os_id < y->os_id);
}

static void topo_free(hm_ms_topo_t *t) {
    if (!t) return;
    free(t->targets);
    if (t->hw) hwloc_topology_destroy(t->hw);
    free(t);
}

/* Loads a topology (xml: a file, else this machine) and builds its targets.
 * On failure *err and *failed say what failed (errno, the hwloc call). */
static hm_ms_topo_t *topo_load(const char *xml, int *err, const char **failed) {
    hm_ms_topo_t *t = calloc(1, sizeof(*t));
    if (!t) {
        *err = ENOMEM;
        *failed = "calloc";
        return NULL;
    }
    atomic_init(&t->refs, 1);
    t->xml = xml != NULL;
    errno = 0;
    if (hwloc_topology_init(&t->hw) != 0) {
        t->hw = NULL;
        *failed = "hwloc_topology_init";
        goto fail;
    }
    /* I/O devices are kept: GPUs and NICs are found by bus id or name. */
    if (hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
        *failed = "hwloc_topology_set_io_types_filter";
        goto fail;
    }
    if (xml && hwloc_topology_set_xml(t->hw, xml) != 0) {
        *failed = "hwloc_topology_set_xml";
        goto fail;
    }
    if (hwloc_topology_load(t->hw) != 0) {
        *failed = "hwloc_topology_load";
        goto fail;
    }
    int n = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE);
    if (n <= 0) {
        errno = ENOENT;
        *failed = "hwloc_get_nbobjs_by_type(NUMANODE)";
        goto fail;
    }
    t->n = (size_t)n;
    t->targets = calloc(t->n, sizeof(*t->targets));
    if (!t->targets) {
        errno = ENOMEM;
        *failed = "calloc";
        goto fail;
    }
    for (size_t i = 0; i < t->n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (!o) {
            errno = ENOENT;
            *failed = "hwloc_get_obj_by_type(NUMANODE)";
            goto fail;
        }
        struct hm_memtarget *m = &t->targets[i];
        m->magic = HM_MEMTARGET_MAGIC;
        m->topo = t;
        m->node = o;
        m->os_id = o->os_index;
        m->kind = kind_of(o);
        m->capacity = o->attr ? o->attr->numanode.local_memory : 0;
        m->subtype = (o->subtype && *o->subtype) ? o->subtype : NULL;
        m->dax = hwloc_obj_get_info_by_name(o, "DAXDevice");
    }
    /* hwloc refreshes an attribute's cache lazily, at its first read (a
     * write into the topology): read each once here, before the topology is
     * shared, so that later reads from many threads only read. */
    struct hwloc_location root = {.type = HWLOC_LOCATION_TYPE_CPUSET};
    root.location.cpuset = hwloc_get_root_obj(t->hw)->cpuset;
    for (hwloc_memattr_id_t id = HWLOC_MEMATTR_ID_BANDWIDTH; id <= HWLOC_MEMATTR_ID_WRITE_LATENCY;
         id++) {
        hwloc_uint64_t v;
        (void)hwloc_memattr_get_value(t->hw, id, t->targets[0].node, &root, 0, &v);
    }
    errno = 0;
    qsort(t->targets, t->n, sizeof(*t->targets), by_os_id);
    for (size_t i = 0; i < t->n; i++) {
        t->targets[i].index = (uint32_t)i;
        if (i && t->targets[i].os_id == t->targets[i - 1].os_id) {
            errno = EINVAL;
            *failed = "two NUMA nodes with one OS number";
            goto fail;
        }
    }
    return t;
fail:
    *err = errno ? errno : EINVAL;
    topo_free(t);
    return NULL;
}

static void sys_load(void) {
    int err = 0;
    const char *failed = NULL;
    sys_topo = topo_load(NULL, &err, &failed);
    if (!sys_topo) {
        sys_errno = err;
        sys_failed = failed;
    }
}

static hm_result_t sys_get(hm_ms_topo_t **topo) {
    if (pthread_once(&sys_once, sys_load) != 0) HM_DIE("pthread_once failed");
    if (!sys_topo) return hm__native_error(sys_errno, "memspace: %s", sys_failed);
    *topo = sys_topo;
    return HM_SUCCESS;
}

void hm__ms_topo_ref(hm_ms_topo_t *topo) {
    atomic_fetch_add_explicit(&topo->refs, 1, memory_order_relaxed);
}

void hm__ms_topo_put(hm_ms_topo_t *topo) {
    if (!topo) return;
    size_t was = atomic_fetch_sub_explicit(&topo->refs, 1, memory_order_acq_rel);
    HM_ASSERT(was > 0);
    if (was == 1) {
        HM_ASSERT(topo != sys_topo);
        topo_free(topo);
    }
}

hm_result_t hm__ms_topo_get(hm_ms_topo_t **topo) {
    *topo = NULL;
    if (pthread_once(&fork_once, fork_start) != 0) HM_DIE("pthread_once failed");
    hm__mutex_lock(&g_lock);
    hm_ms_topo_t *t = g_cur;
    if (t) hm__ms_topo_ref(t);
    hm__mutex_unlock(&g_lock);
    if (!t) {
        hm_result_t r = sys_get(&t);
        if (r) return r;
        hm__ms_topo_ref(t);
    }
    *topo = t;
    return HM_SUCCESS;
}

hm_result_t hm_memspace_topology_load_xml(const char *path) {
    hm__init();
    if (pthread_once(&fork_once, fork_start) != 0) HM_DIE("pthread_once failed");
    hm_ms_topo_t *t = NULL;
    if (path) {
        int err = 0;
        const char *failed = NULL;
        if (!*path) {
            HM_LOG_ERROR("hm_memspace_topology_load_xml: empty path");
            return HM_ERROR_INVALID_ARGUMENT;
        }
        t = topo_load(path, &err, &failed);
        if (!t) {
            HM_LOG_ERROR("hm_memspace_topology_load_xml(%s): %s failed: %s", path, failed,
                         strerror(err));
            return HM_ERROR_INVALID_ARGUMENT;
        }
        HM_LOG_INFO("memspace: spaces now made from the XML topology %s (%zu nodes)", path,
                    t->n);
    }
    hm__mutex_lock(&g_lock);
    hm_ms_topo_t *old = g_cur;
    g_cur = t;
    hm__mutex_unlock(&g_lock);
    hm__ms_topo_put(old);
    return HM_SUCCESS;
}

const struct hm_memtarget *hm__ms_target_by_id(const hm_ms_topo_t *topo, unsigned os_id) {
    size_t lo = 0, hi = topo->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        unsigned id = topo->targets[mid].os_id;
        if (id == os_id) return &topo->targets[mid];
        if (id < os_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

hm_result_t hm__ms_initiator(const hm_ms_topo_t *topo, const unsigned *cpus, size_t ncpus,
                             const char *what, hwloc_bitmap_t *set) {
    *set = NULL;
    if (!cpus != !ncpus) {
        HM_LOG_ERROR("%s: cpus %s with count %zu", what, cpus ? "given" : "NULL", ncpus);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(topo->hw);
    hwloc_bitmap_t s = hwloc_bitmap_alloc();
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    if (cpus) {
        for (size_t i = 0; i < ncpus; i++) {
            if (cpus[i] > (unsigned)INT32_MAX || !hwloc_bitmap_isset(all, cpus[i])) {
                HM_LOG_ERROR("%s: CPU %u is not in the topology (%d CPUs)", what, cpus[i],
                             hwloc_bitmap_weight(all));
                hwloc_bitmap_free(s);
                return HM_ERROR_INVALID_ARGUMENT;
            }
            if (hwloc_bitmap_set(s, cpus[i]) != 0) {
                hwloc_bitmap_free(s);
                return HM_ERROR_OUT_OF_HOST_MEMORY;
            }
        }
    } else {
        if (topo->xml) {
            HM_LOG_ERROR("%s: the topology was loaded from XML (another machine): name the "
                         "initiator's CPUs, the calling thread's mean nothing there",
                         what);
            hwloc_bitmap_free(s);
            return HM_ERROR_NOT_SUPPORTED;
        }
        if (hwloc_get_cpubind(topo->hw, s, HWLOC_CPUBIND_THREAD) != 0) {
            int e = errno;
            hwloc_bitmap_free(s);
            return hm__errno_result(e, "%s: hwloc_get_cpubind(thread)", what);
        }
        if (hwloc_bitmap_and(s, s, all) != 0 || hwloc_bitmap_iszero(s)) {
            HM_LOG_ERROR("%s: the calling thread may run on no CPU of the topology", what);
            hwloc_bitmap_free(s);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    }
    *set = s;
    return HM_SUCCESS;
}

/* The smallest node cpuset holding cpu (NULL if none does). */
static hwloc_const_bitmap_t locality_of(const hm_ms_topo_t *topo, unsigned cpu) {
    hwloc_const_bitmap_t best = NULL;
    int best_w = 0;
    for (size_t i = 0; i < topo->n; i++) {
        hwloc_const_bitmap_t c = topo->targets[i].node->cpuset;
        if (!c || !hwloc_bitmap_isset(c, cpu)) continue;
        int w = hwloc_bitmap_weight(c);
        if (!best || (w >= 0 && w < best_w)) {
            best = c;
            best_w = w;
        }
    }
    return best;
}

int hm__ms_groups(const hm_ms_topo_t *topo, hwloc_const_bitmap_t initiator,
                  hm_ms_group_t *groups) {
    int n = 0;
    int cpu = hwloc_bitmap_first(initiator);
    for (; cpu >= 0; cpu = hwloc_bitmap_next(initiator, cpu)) {
        hwloc_const_bitmap_t loc = locality_of(topo, (unsigned)cpu);
        if (!loc) continue;
        int g = 0;
        while (g < n && !hwloc_bitmap_isequal(groups[g].locality, loc)) g++;
        if (g == n) {
            HM_ASSERT((size_t)n < topo->n); /* at most one locality per node */
            groups[n].locality = loc;
            groups[n].cpus = hwloc_bitmap_alloc();
            if (!groups[n].cpus) {
                hm__ms_groups_free(groups, n);
                return -1;
            }
            n++;
        }
        if (hwloc_bitmap_set(groups[g].cpus, (unsigned)cpu) != 0) {
            hm__ms_groups_free(groups, n);
            return -1;
        }
    }
    return n;
}

void hm__ms_groups_free(hm_ms_group_t *groups, int n) {
    for (int i = 0; i < n; i++) hwloc_bitmap_free(groups[i].cpus);
}
