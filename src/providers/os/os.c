/* hetmem — the OS provider: anonymous private mappings, or MAP_SHARED
 * mappings of sealed memfds (IPC-capable), with any power-of-two
 * alignment, THP/hugetlb page kinds, NUMA placement through hwloc and
 * protection flags. SPDX-License-Identifier: MIT
 *
 * Private mode keeps no per-allocation state: alloc is mmap, free is
 * munmap, and no lock is ever taken.
 *
 * Shared mode gives each allocation a memfd of its own (an os_seg_t), sized
 * to it and sealed F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so that the
 * descriptor an export hands to another process reaches that allocation's
 * bytes and nothing else, and nobody holding it can resize it under a
 * mapping (Wayland's one-memfd-per-buffer; systemd's sealed memfds). A split
 * leaves both parts in the one memfd (refs counts them); a merge joins only
 * parts of one memfd. The provider holds at most max_memfds such
 * descriptors: beyond that (or when the process runs out of descriptors)
 * allocations come from one further memfd, the spill, sealed F_SEAL_SHRINK |
 * F_SEAL_SEAL, whose handles expose every allocation in it (os.h says so).
 *
 * The spill carves file extents out of its memfd:
 *
 *   file:  [ used | free | used | used | free ......... ] file_size
 *            ^ mapped at some address, recorded in `map`
 *
 *  - `extents` is the free list of file ranges, sorted by offset, coalesced
 *    (no two entries touch). Allocation is first fit; when nothing fits the
 *    file grows with ftruncate (from a free tail extent if there is one).
 *    A freed range has its pages released with a hole punch before it
 *    rejoins the list; the file never shrinks (it is sealed against it), so
 *    its size is the peak of live bytes plus fragmentation, its memory the
 *    live bytes.
 *  - `map` is an open-addressing hash from mapping address to
 *    {length, memfd, file offset, export count}: free, split, merge and IPC
 *    need it.
 *    The export count only checks puts: the IPC layer owns an exported
 *    range's lifetime (it gives a range freed while exported back here at
 *    the last put, src/ipc/export.c), so a free here is always a free.
 *
 * Concurrency contract (shared mode):
 *   operation           | lock                   | syscalls under the lock
 *   --------------------+------------------------+--------------------------
 *   alloc               | twice (take, record)   | the spill's ftruncate, and
 *                       |                        | its memfd_create, once
 *   free                | twice (unrecord, give) | none
 *   purge_lazy/force    | none                   | -
 *   split/merge/ipc.*   | once                   | none
 *   mmap/munmap/punch   | never under the lock   |
 *   a memfd of its own  | never under the lock   | (created, sealed, closed)
 * Capacity for the free list and the map is reserved under the lock before
 * any irreversible step, so an out-of-memory can never strand an extent.
 *
 * After fork(): the child shares the memfd with the parent but not the
 * extent bookkeeping, so a shared-mode provider inherited by a child refuses
 * to allocate (HM_ERROR_NOT_SUPPORTED); its free only unmaps. Private mode
 * works unchanged in the child.
 *
 * The memfds' descriptors are the program's too (platform/prim.h,
 * "descriptors hetmem keeps"): they live close-on-exec at high numbers, and
 * every ftruncate, mmap, hole punch, export and the final close first checks
 * that the number still names the memfd (memfd_check, seg_check). A program that closed it
 * or put a file of its own there gets refusals (HM_ERROR_DRIVER, native
 * error EBADF, one log line each), never a resized, mapped or punched file
 * of its own; mappings made before stay valid (they hold the memfd). */
#include "internal.h"
#include "platform/prim.h"
#include "providers/os/os_numa.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define OS_PARAMS_MAGIC 0x4f535041u /* "OSPA" */
#define OS_MAX_NODES 4096           /* more than any machine hwloc has seen */
#define OS_SHM_NAME_MAX 64
#define OS_IPC_MAGIC 0x4f534950u /* "OSIP" */
#define OS_IPC_VERSION 2u
#define OS_MEMFDS_MIN 16     /* the default bound on memfds of their own ... */
#define OS_MEMFDS_MAX 4096   /* ... is an eighth of RLIMIT_NOFILE, within these */

struct hm_os_params {
    uint32_t magic;
    hm_os_visibility_t visibility;
    hm_os_page_kind_t page_kind;
    hm_os_numa_mode_t numa_mode;
    unsigned prot;
    size_t node_count;
    unsigned *nodes; /* node_count entries, owned */
    char shm_name[OS_SHM_NAME_MAX];
    size_t max_memfds; /* 0: the default */
};

/* ---------------------------------------------------------------------- */
/* params                                                                 */

static hm_result_t check_params(const hm_os_params_t *p, const char *what) {
    if (!p) {
        HM_LOG_ERROR("%s: params is NULL", what);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->magic != OS_PARAMS_MAGIC) {
        HM_LOG_ERROR("%s: %p is not an OS provider params object", what, (const void *)p);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

hm_result_t hm_os_params_create(hm_os_params_t **params) {
    hm__init();
    if (!params) {
        HM_LOG_ERROR("hm_os_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_os_params_t *p = calloc(1, sizeof(*p));
    if (!(*params = p)) return HM_ERROR_OUT_OF_HOST_MEMORY;
    p->magic = OS_PARAMS_MAGIC;
    p->visibility = HM_OS_PRIVATE;
    p->page_kind = HM_OS_PAGES_DEFAULT;
    p->numa_mode = HM_OS_NUMA_DEFAULT;
    p->prot = HM_OS_PROT_READ | HM_OS_PROT_WRITE;
    snprintf(p->shm_name, sizeof(p->shm_name), "hetmem");
    return HM_SUCCESS;
}

hm_result_t hm_os_params_destroy(hm_os_params_t *params) {
    hm_result_t r = check_params(params, "hm_os_params_destroy");
    if (r) return r;
    free(params->nodes);
    params->magic = 0;
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_os_params_set_visibility(hm_os_params_t *params, hm_os_visibility_t v) {
    hm_result_t r = check_params(params, "hm_os_params_set_visibility");
    if (r) return r;
    if (v != HM_OS_PRIVATE && v != HM_OS_SHARED) {
        HM_LOG_ERROR("hm_os_params_set_visibility: unknown visibility %d", (int)v);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->visibility = v;
    return HM_SUCCESS;
}

hm_result_t hm_os_params_set_page_kind(hm_os_params_t *params, hm_os_page_kind_t kind) {
    hm_result_t r = check_params(params, "hm_os_params_set_page_kind");
    if (r) return r;
    if ((unsigned)kind > HM_OS_PAGES_HUGETLB_1G) {
        HM_LOG_ERROR("hm_os_params_set_page_kind: unknown page kind %d", (int)kind);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->page_kind = kind;
    return HM_SUCCESS;
}

hm_result_t hm_os_params_set_numa(hm_os_params_t *params, hm_os_numa_mode_t mode,
                                  const unsigned *nodes, size_t count) {
    hm_result_t r = check_params(params, "hm_os_params_set_numa");
    if (r) return r;
    if ((unsigned)mode > HM_OS_NUMA_PREFERRED) {
        HM_LOG_ERROR("hm_os_params_set_numa: unknown mode %d", (int)mode);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (mode == HM_OS_NUMA_DEFAULT) {
        if (count) {
            HM_LOG_ERROR("hm_os_params_set_numa: %zu node(s) given with HM_OS_NUMA_DEFAULT",
                         count);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    } else {
        if (!nodes || !count) {
            HM_LOG_ERROR("hm_os_params_set_numa: mode %d needs at least one node", (int)mode);
            return HM_ERROR_INVALID_ARGUMENT;
        }
        if (count > OS_MAX_NODES) {
            HM_LOG_ERROR("hm_os_params_set_numa: %zu nodes (at most %d)", count, OS_MAX_NODES);
            return HM_ERROR_INVALID_ARGUMENT;
        }
        if (mode == HM_OS_NUMA_PREFERRED && count != 1) {
            HM_LOG_ERROR("hm_os_params_set_numa: PREFERRED takes exactly one node, got %zu",
                         count);
            return HM_ERROR_INVALID_ARGUMENT;
        }
        for (size_t i = 0; i < count; i++)
            for (size_t j = 0; j < i; j++)
                if (nodes[i] == nodes[j]) {
                    HM_LOG_ERROR("hm_os_params_set_numa: node %u listed twice", nodes[i]);
                    return HM_ERROR_INVALID_ARGUMENT;
                }
    }
    unsigned *copy = NULL;
    if (count) {
        copy = malloc(count * sizeof(*copy));
        if (!copy) return HM_ERROR_OUT_OF_HOST_MEMORY;
        memcpy(copy, nodes, count * sizeof(*copy));
    }
    free(params->nodes);
    params->nodes = copy;
    params->node_count = count;
    params->numa_mode = mode;
    return HM_SUCCESS;
}

hm_result_t hm_os_params_set_protection(hm_os_params_t *params, unsigned prot) {
    hm_result_t r = check_params(params, "hm_os_params_set_protection");
    if (r) return r;
    if (prot & ~(unsigned)(HM_OS_PROT_READ | HM_OS_PROT_WRITE | HM_OS_PROT_EXEC)) {
        HM_LOG_ERROR("hm_os_params_set_protection: unknown bits %#x", prot);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->prot = prot;
    return HM_SUCCESS;
}

hm_result_t hm_os_params_set_shm_name(hm_os_params_t *params, const char *name) {
    hm_result_t r = check_params(params, "hm_os_params_set_shm_name");
    if (r) return r;
    if (!name || !*name || strlen(name) >= OS_SHM_NAME_MAX || strchr(name, '/')) {
        HM_LOG_ERROR("hm_os_params_set_shm_name: name must be 1..%d characters without '/'",
                     OS_SHM_NAME_MAX - 1);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    snprintf(params->shm_name, sizeof(params->shm_name), "%s", name);
    return HM_SUCCESS;
}

hm_result_t hm_os_params_set_max_memfds(hm_os_params_t *params, size_t count) {
    hm_result_t r = check_params(params, "hm_os_params_set_max_memfds");
    if (r) return r;
    params->max_memfds = count;
    return HM_SUCCESS;
}

/* ---------------------------------------------------------------------- */
/* provider state                                                         */

/* A memfd of one allocation (and the parts a split made of it). */
typedef struct os_seg {
    int fd;
    hm_prim_file_id_t id;
    uint32_t refs; /* live mappings in it, under the provider's lock */
} os_seg_t;

typedef struct os_mapping { /* a live shared allocation or an IPC-opened mapping */
    uintptr_t addr;         /* 0: empty slot */
    size_t len;             /* mapped length, a page multiple */
    os_seg_t *seg;          /* its own memfd; NULL: the spill's (or imported) */
    uint64_t off;           /* file offset */
    uint32_t exports;       /* ipc.get calls not yet put */
    uint32_t imported;      /* 1: made by ipc.open, not ours to free */
} os_mapping_t;

typedef struct os_extent {
    uint64_t off, len;
} os_extent_t;


typedef struct os_provider {
    /* Immutable after init. */
    hm_os_visibility_t visibility;
    hm_os_page_kind_t page_kind;
    hm_os_numa_mode_t numa_mode;
    unsigned prot;
    unsigned map_flags;   /* HM_PRIM_MAP_* */
    size_t page;          /* min page size: base or hugetlb page */
    size_t recommended;   /* recommended page size */
    size_t thp;           /* THP size when page_kind is THP, else 0 */
    hwloc_bitmap_t nodes; /* NULL unless numa_mode != DEFAULT */
    char shm_name[OS_SHM_NAME_MAX]; /* the memfds' name */
    unsigned memfd_flags; /* HM_PRIM_MEMFD_* */
    size_t max_memfds;    /* memfds of their own at most (shared mode) */
    unsigned epoch;       /* hm__prim_fork_epoch() at init */

    /* Mutable, under lock (shared mode and IPC-opened mappings). */
    pthread_mutex_t lock;
    int fd;               /* the spill memfd, made at its first use; else -1 */
    hm_prim_file_id_t fd_id; /* its identity, to check fd before each use */
    size_t nsegs;         /* memfds of their own, live or being made */
    os_mapping_t *map;
    size_t map_cap, map_count, map_reserved;
    os_extent_t *ext;
    size_t ext_cap, ext_count, ext_reserved;
    uint64_t file_size;
} os_provider_t;

/* What a handle carries. The importer maps the descriptor that comes with
 * it only after checking that it is the memfd named here (dev, ino), that
 * it is sealed against shrinking and covers [offset, +size); it maps it
 * with its own provider's protection, whatever the exporter's. */
typedef struct os_ipc_payload {
    uint32_t magic;     /* OS_IPC_MAGIC */
    uint16_t version;   /* OS_IPC_VERSION */
    uint16_t page_kind; /* hm_os_page_kind_t of the exporter */
    int32_t fd;         /* the exporter's memfd number */
    uint32_t reserved;  /* 0 */
    uint64_t offset;    /* file offset of the allocation */
    uint64_t size;      /* mapped length (a multiple of page_size) */
    uint64_t base;      /* the exporter's address (for put) */
    uint64_t page_size; /* the exporter's page size */
    uint64_t dev, ino;  /* the memfd's identity (fstat) */
} os_ipc_payload_t;

static inline int in_forked_child(const os_provider_t *s) {
    return hm__prim_fork_epoch() != s->epoch;
}

static inline int is_shared(const os_provider_t *s) { return s->visibility == HM_OS_SHARED; }

/* Before each use of a memfd's descriptor: is it still the memfd? If the
 * program closed it or put another file at its number, `what` is not done
 * (see the file comment). */
static hm_result_t fd_check(int fd, const hm_prim_file_id_t *id, const char *what) {
    hm_result_t r = hm__prim_fd_check(fd, id);
    if (hm_unlikely(r != HM_SUCCESS)) {
        const char *why = NULL;
        (void)hm_last_native_error(&why);
        if (hm__prim_fd_first_report(id))
            HM_LOG_ERROR("os provider: its memfd, descriptor %d, was closed or replaced by the "
                         "program (%s); %s refused, the descriptor is left alone (later "
                         "refusals are logged at debug level)", fd, why ? why : "?", what);
        else
            HM_LOG_DEBUG("os provider: memfd descriptor %d closed or replaced (%s); %s refused",
                         fd, why ? why : "?", what);
    }
    return r;
}
/* The spill's memfd; a memfd of one allocation. */
static hm_result_t memfd_check(const os_provider_t *s, const char *what) {
    return fd_check(s->fd, &s->fd_id, what);
}
static hm_result_t seg_check(const os_seg_t *g, const char *what) {
    return fd_check(g->fd, &g->id, what);
}

/* The memfd of a live allocation: its own, or the spill's. */
static inline int map_fd(const os_provider_t *s, const os_mapping_t *m) {
    return m->seg ? m->seg->fd : s->fd;
}
static inline const hm_prim_file_id_t *map_fd_id(const os_provider_t *s, const os_mapping_t *m) {
    return m->seg ? &m->seg->id : &s->fd_id;
}

/* Drop a memfd of its own whose last mapping is gone (no lock held). */
static void seg_drop(os_seg_t *g) {
    if (seg_check(g, "closing it") == HM_SUCCESS) (void)hm__prim_close(g->fd);
    free(g);
}

/* ---- the address -> mapping hash (open addressing, linear probing) ---- */

static inline size_t map_slot(const os_provider_t *s, uintptr_t addr) {
    /* Fibonacci hashing of the page number. */
    uint64_t h = (uint64_t)(addr >> 12) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (s->map_cap - 1);
}

static os_mapping_t *map_find(os_provider_t *s, uintptr_t addr) {
    if (!s->map_cap) return NULL;
    for (size_t i = map_slot(s, addr);; i = (i + 1) & (s->map_cap - 1)) {
        os_mapping_t *m = &s->map[i];
        if (m->addr == addr) return m;
        if (!m->addr) return NULL;
    }
}

/* Insert into a table known to have a free slot. */
static void map_put_raw(os_mapping_t *tab, size_t cap, const os_mapping_t *m) {
    uint64_t h = (uint64_t)(m->addr >> 12) * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 32) & (cap - 1);
    while (tab[i].addr) i = (i + 1) & (cap - 1);
    tab[i] = *m;
}

/* Make room for `extra` more entries beyond those live and reserved, keeping
 * the load at most one half. */
static hm_result_t map_reserve(os_provider_t *s, size_t extra) {
    size_t need = s->map_count + s->map_reserved + extra;
    if (need * 2 <= s->map_cap) return HM_SUCCESS;
    size_t cap = s->map_cap ? s->map_cap : 64;
    while (need * 2 > cap) cap *= 2;
    os_mapping_t *tab = calloc(cap, sizeof(*tab));
    if (!tab) {
        HM_LOG_ERROR("os provider: no memory for a %zu-entry mapping table", cap);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    for (size_t i = 0; i < s->map_cap; i++)
        if (s->map[i].addr) map_put_raw(tab, cap, &s->map[i]);
    free(s->map);
    s->map = tab;
    s->map_cap = cap;
    return HM_SUCCESS;
}

static void map_insert(os_provider_t *s, const os_mapping_t *m) {
    HM_ASSERT(s->map_count + 1 < s->map_cap);
    map_put_raw(s->map, s->map_cap, m);
    s->map_count++;
}

/* Remove by backward-shift deletion (Knuth, TAOCP vol. 3, 6.4 Algorithm R),
 * so no tombstones accumulate. */
static void map_remove(os_provider_t *s, os_mapping_t *m) {
    size_t mask = s->map_cap - 1;
    size_t i = (size_t)(m - s->map);
    size_t j = i;
    for (;;) {
        s->map[i].addr = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (!s->map[j].addr) {
                s->map_count--;
                return;
            }
            size_t k = map_slot(s, s->map[j].addr);
            /* Move j back to i unless its home k lies cyclically in (i, j]. */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
            break;
        }
        s->map[i] = s->map[j];
        i = j;
    }
}

/* ---- the free extent list (sorted by offset, coalesced) ---- */

static hm_result_t ext_reserve(os_provider_t *s) {
    size_t need = s->ext_count + s->ext_reserved + 1;
    if (need > s->ext_cap) {
        size_t cap = s->ext_cap ? s->ext_cap * 2 : 16;
        while (cap < need) cap *= 2;
        os_extent_t *e = realloc(s->ext, cap * sizeof(*e));
        if (!e) {
            HM_LOG_ERROR("os provider: no memory for a %zu-entry extent list", cap);
            return HM_ERROR_OUT_OF_HOST_MEMORY;
        }
        s->ext = e;
        s->ext_cap = cap;
    }
    s->ext_reserved++;
    return HM_SUCCESS;
}

/* Give [off, off+len) back, coalescing with its neighbours. Uses a slot
 * reserved by ext_reserve(). */
static void ext_give(os_provider_t *s, uint64_t off, uint64_t len) {
    HM_ASSERT(s->ext_reserved > 0);
    s->ext_reserved--;
    size_t lo = 0, hi = s->ext_count;
    while (lo < hi) { /* first extent after off */
        size_t mid = (lo + hi) / 2;
        if (s->ext[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    size_t i = lo;
    HM_ASSERT(i == s->ext_count || off + len <= s->ext[i].off);
    HM_ASSERT(i == 0 || s->ext[i - 1].off + s->ext[i - 1].len <= off);
    int join_prev = i > 0 && s->ext[i - 1].off + s->ext[i - 1].len == off;
    int join_next = i < s->ext_count && off + len == s->ext[i].off;
    if (join_prev && join_next) {
        s->ext[i - 1].len += len + s->ext[i].len;
        memmove(&s->ext[i], &s->ext[i + 1], (s->ext_count - i - 1) * sizeof(*s->ext));
        s->ext_count--;
    } else if (join_prev) {
        s->ext[i - 1].len += len;
    } else if (join_next) {
        s->ext[i].off = off;
        s->ext[i].len += len;
    } else {
        memmove(&s->ext[i + 1], &s->ext[i], (s->ext_count - i) * sizeof(*s->ext));
        s->ext[i].off = off;
        s->ext[i].len = len;
        s->ext_count++;
    }
    /* The file keeps its size (F_SEAL_SHRINK): a free tail is grown into
     * again by ext_take. */
}

/* Take `len` bytes of file: first fit, else grow the file. */
static hm_result_t ext_take(os_provider_t *s, uint64_t len, uint64_t *off) {
    for (size_t i = 0; i < s->ext_count; i++) {
        os_extent_t *e = &s->ext[i];
        if (e->len < len) continue;
        *off = e->off;
        e->off += len;
        e->len -= len;
        if (!e->len) {
            memmove(e, e + 1, (s->ext_count - i - 1) * sizeof(*e));
            s->ext_count--;
        }
        return HM_SUCCESS;
    }
    /* Grow, starting from a free tail extent if there is one. */
    uint64_t start = s->file_size;
    int tail = s->ext_count && s->ext[s->ext_count - 1].off + s->ext[s->ext_count - 1].len ==
                                   s->file_size;
    if (tail) start = s->ext[s->ext_count - 1].off;
    if (len > (uint64_t)INT64_MAX - start)
        return hm__errno_result(ENOMEM, "os provider: memfd would exceed the file size limit");
    hm_result_t r = HM_SUCCESS;
    if (s->fd < 0) { /* the spill's first use */
        r = hm__prim_memfd_create(s->shm_name, s->memfd_flags, &s->fd);
        if (r == HM_SUCCESS) r = hm__prim_fd_keep(&s->fd, &s->fd_id);
        if (r == HM_SUCCESS) r = hm__prim_seal(s->fd, HM_PRIM_SEAL_SHRINK | HM_PRIM_SEAL_SEAL);
        if (r != HM_SUCCESS) {
            if (s->fd >= 0) (void)hm__prim_close(s->fd);
            s->fd = -1;
            return r;
        }
    }
    r = memfd_check(s, "growing the memfd");
    if (r) return r;
    r = hm__prim_ftruncate(s->fd, start + len);
    if (r) return r == HM_ERROR_INVALID_ARGUMENT ? HM_ERROR_OUT_OF_MEMORY : r;
    if (tail) s->ext_count--;
    s->file_size = start + len;
    *off = start;
    return HM_SUCCESS;
}

/* ---------------------------------------------------------------------- */
/* init / fini / info                                                     */

static hm_result_t check_page_kind(os_provider_t *s) {
    size_t huge = 0;
    switch (s->page_kind) {
    case HM_OS_PAGES_DEFAULT:
    case HM_OS_PAGES_NO_THP: return HM_SUCCESS;
    case HM_OS_PAGES_THP:
        s->thp = hm__prim_thp_size();
        if (!s->thp) {
            HM_LOG_WARN("os provider: transparent huge pages are not supported by this kernel");
            return HM_ERROR_NOT_SUPPORTED;
        }
        s->recommended = s->thp;
        return HM_SUCCESS;
    case HM_OS_PAGES_HUGETLB_2M: huge = (size_t)2 << 20; break;
    case HM_OS_PAGES_HUGETLB_1G: huge = (size_t)1 << 30; break;
    default:
        HM_LOG_ERROR("os provider: unknown page kind %d", (int)s->page_kind);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t r = hm__prim_hugetlb_available(huge, NULL);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        HM_LOG_WARN("os provider: the kernel has no hugetlb pool of %zu kB pages", huge >> 10);
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (r != HM_SUCCESS) {
        HM_LOG_WARN("os provider: no %zu kB hugetlb pages are configured (set "
                    "/sys/kernel/mm/hugepages/hugepages-%zukB/nr_hugepages)",
                    huge >> 10, huge >> 10);
        return HM_ERROR_NOT_SUPPORTED;
    }
    s->page = s->recommended = huge;
    s->map_flags |= huge == ((size_t)2 << 20) ? HM_PRIM_MAP_HUGETLB_2M : HM_PRIM_MAP_HUGETLB_1G;
    return HM_SUCCESS;
}

static void os_fini(void *state);

HM_RUN static hm_result_t os_init(const void *params, void **state) {
    *state = NULL;
    hm_os_params_t defaults = {
        .magic = OS_PARAMS_MAGIC,
        .visibility = HM_OS_PRIVATE,
        .prot = HM_OS_PROT_READ | HM_OS_PROT_WRITE,
        .shm_name = "hetmem",
    };
    const hm_os_params_t *p = params ? params : &defaults;
    hm_result_t r = check_params(p, "os provider init");
    if (r) return r;
    /* The setters validate, but the params object is caller memory. */
    if ((unsigned)p->visibility > HM_OS_SHARED || (unsigned)p->page_kind > HM_OS_PAGES_HUGETLB_1G ||
        (unsigned)p->numa_mode > HM_OS_NUMA_PREFERRED || p->node_count > OS_MAX_NODES ||
        (p->numa_mode != HM_OS_NUMA_DEFAULT && (!p->nodes || !p->node_count))) {
        HM_LOG_ERROR("os provider init: corrupt params object");
        return HM_ERROR_INVALID_ARGUMENT;
    }

    os_provider_t *s = calloc(1, sizeof(*s));
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    s->fd = -1;
    s->visibility = p->visibility;
    s->page_kind = p->page_kind;
    s->numa_mode = p->numa_mode;
    s->prot = p->prot;
    s->page = s->recommended = hm__prim_page_size();
    s->epoch = hm__prim_fork_epoch();
    if (is_shared(s)) s->map_flags |= HM_PRIM_MAP_SHARED;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }

    if ((r = check_page_kind(s))) goto fail;
    if (s->numa_mode != HM_OS_NUMA_DEFAULT &&
        (r = hm__os_numa_make_nodeset(s->numa_mode, p->nodes, p->node_count, &s->nodes)))
        goto fail;
    if (is_shared(s)) {
        unsigned mf = HM_PRIM_MEMFD_SEALABLE;
        if (s->page_kind == HM_OS_PAGES_HUGETLB_2M) mf |= HM_PRIM_MEMFD_HUGETLB_2M;
        if (s->page_kind == HM_OS_PAGES_HUGETLB_1G) mf |= HM_PRIM_MEMFD_HUGETLB_1G;
        s->memfd_flags = mf;
        snprintf(s->shm_name, sizeof(s->shm_name), "%s", p->shm_name);
        s->max_memfds = p->max_memfds;
        if (!s->max_memfds) {
            struct rlimit rl;
            size_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                           ? (size_t)rl.rlim_cur / 8 : OS_MEMFDS_MAX;
            s->max_memfds = n < OS_MEMFDS_MIN ? OS_MEMFDS_MIN
                            : n > OS_MEMFDS_MAX ? OS_MEMFDS_MAX : n;
        }
        /* Memfds are mapped, never mapped by the anonymous flags. */
        s->map_flags &= ~(unsigned)(HM_PRIM_MAP_HUGETLB_2M | HM_PRIM_MAP_HUGETLB_1G);
    }
    *state = s;
    return HM_SUCCESS;
fail:
    os_fini(s);
    return r;
}

static void os_fini(void *state) {
    os_provider_t *s = state;
    if (!s) return;
    int child = in_forked_child(s);
    /* Unmap what ipc.open mapped and the caller never closed; live
     * allocations are the caller's leak and stay mapped (the front-end or
     * pool reports them), but their file goes away with the memfd once
     * unmapped. */
    for (size_t i = 0; i < s->map_cap; i++) {
        os_mapping_t *m = &s->map[i];
        if (m->addr && m->imported) (void)hm__prim_unmap((void *)m->addr, m->len);
        if (m->addr && m->seg && !--m->seg->refs) seg_drop(m->seg);
    }
    if (s->fd >= 0 && memfd_check(s, "closing it") == HM_SUCCESS) (void)hm__prim_close(s->fd);
    if (s->nodes) hwloc_bitmap_free(s->nodes);
    free(s->map);
    free(s->ext);
    /* A child may have inherited the lock held by another parent thread. */
    if (!child) pthread_mutex_destroy(&s->lock);
    free(s);
}

HM_RUN static void os_get_info(void *state, hm_provider_info_t *info) {
    const os_provider_t *s = state;
    uint32_t caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_PURGE_LAZY |
                    HM_PROVIDER_CAP_PURGE_FORCE | HM_PROVIDER_CAP_SPLIT_MERGE;
    if (is_shared(s)) caps |= HM_PROVIDER_CAP_IPC;
    if (s->prot & (HM_OS_PROT_READ | HM_OS_PROT_WRITE)) caps |= HM_PROVIDER_CAP_CPU_ACCESS;
    if (s->numa_mode != HM_OS_NUMA_DEFAULT) caps |= HM_PROVIDER_CAP_NUMA;
    info->name = "os";
    info->family = HM_PROVIDER_FAMILY_OS;
    /* PROT_NONE memory is the tests' stand-in for device memory: the CPU
     * must not touch it, which is what HM_MEMORY_DEVICE promises (and
     * HM_MEMORY_HOST would deny). */
    info->kind = (caps & HM_PROVIDER_CAP_CPU_ACCESS) ? HM_MEMORY_HOST : HM_MEMORY_DEVICE;
    info->caps = caps;
    info->min_page_size = s->page;
    info->recommended_page_size = s->recommended;
}

/* ---------------------------------------------------------------------- */
/* alloc / free                                                           */

/* Round a caller's size to whole pages; 0 when it cannot be represented. */
static inline size_t round_len(const os_provider_t *s, size_t size) {
    return size ? hm_align_up(size, s->page) : 0;
}

static hm_result_t too_large(size_t size, size_t alignment) {
    return hm__errno_result(ENOMEM, "os provider: %zu bytes aligned to %zu cannot be mapped",
                            size, alignment);
}

/* Advice and placement of a fresh mapping. */
static hm_result_t prepare(os_provider_t *s, void *addr, size_t len) {
    hm_result_t r = HM_SUCCESS;
    if (s->page_kind == HM_OS_PAGES_THP)
        r = hm__prim_advise(addr, len, HM_PRIM_ADVISE_HUGEPAGE);
    else if (s->page_kind == HM_OS_PAGES_NO_THP)
        r = hm__prim_advise(addr, len, HM_PRIM_ADVISE_NOHUGEPAGE);
    if (r == HM_SUCCESS && s->nodes) r = hm__os_numa_bind(addr, len, s->numa_mode, s->nodes);
    return r;
}

/* A memfd of its own for one allocation: made, sized, sealed, mapped. */
static hm_result_t seg_make(os_provider_t *s, size_t len, size_t alignment, void **out,
                            os_seg_t **seg) {
    os_seg_t *g = calloc(1, sizeof(*g));
    if (!g) return HM_ERROR_OUT_OF_HOST_MEMORY;
    g->refs = 1;
    void *addr = NULL;
    hm_result_t r = hm__prim_memfd_create(s->shm_name, s->memfd_flags, &g->fd);
    if (r == HM_SUCCESS) r = hm__prim_fd_keep(&g->fd, &g->id);
    if (r == HM_SUCCESS) r = hm__prim_ftruncate(g->fd, len);
    if (r == HM_SUCCESS)
        r = hm__prim_seal(g->fd, HM_PRIM_SEAL_SHRINK | HM_PRIM_SEAL_GROW | HM_PRIM_SEAL_SEAL);
    if (r == HM_SUCCESS) r = hm__prim_map(len, alignment, s->prot, s->map_flags, g->fd, 0, &addr);
    if (r == HM_SUCCESS && (r = prepare(s, addr, len)) != HM_SUCCESS) {
        (void)hm__prim_unmap(addr, len);
        addr = NULL;
    }
    if (r != HM_SUCCESS) {
        if (g->fd >= 0) (void)hm__prim_close(g->fd);
        free(g);
        return r;
    }
    *out = addr;
    *seg = g;
    return HM_SUCCESS;
}

static hm_result_t alloc_shared(os_provider_t *s, size_t len, size_t alignment, void **out) {
    if (in_forked_child(s)) {
        HM_LOG_ERROR("os provider: a shared-mode provider cannot allocate in a forked child; "
                     "create a new provider there");
        return HM_ERROR_NOT_SUPPORTED;
    }
    /* A memfd of its own while there are fewer than max_memfds. */
    hm__mutex_lock(&s->lock);
    hm_result_t r = map_reserve(s, 1);
    bool own = r == HM_SUCCESS && s->nsegs < s->max_memfds;
    if (own) {
        s->nsegs++;
        s->map_reserved++;
    }
    hm__mutex_unlock(&s->lock);
    if (r) return r;
    if (own) {
        void *addr = NULL;
        os_seg_t *g = NULL;
        r = seg_make(s, len, alignment, &addr, &g);
        int64_t e = r ? hm_last_native_error(NULL) : 0;
        hm__mutex_lock(&s->lock);
        s->map_reserved--;
        if (r == HM_SUCCESS) {
            os_mapping_t m = {.addr = (uintptr_t)addr, .len = len, .seg = g};
            map_insert(s, &m);
        } else {
            s->nsegs--;
        }
        hm__mutex_unlock(&s->lock);
        if (r == HM_SUCCESS) {
            *out = addr;
            return HM_SUCCESS;
        }
        if (e != EMFILE && e != ENFILE) return r;
        HM_LOG_DEBUG("os provider: out of descriptors; the allocation goes to the spill memfd");
    }

    uint64_t off = 0;
    hm__mutex_lock(&s->lock);
    r = map_reserve(s, 1);
    if (r == HM_SUCCESS) {
        r = ext_reserve(s); /* for giving the extent back if mapping fails */
        if (r == HM_SUCCESS) {
            r = ext_take(s, len, &off);
            if (r == HM_SUCCESS) s->map_reserved++;
            else s->ext_reserved--;
        }
    }
    hm__mutex_unlock(&s->lock);
    if (r) return r;

    void *addr = NULL;
    r = memfd_check(s, "mapping the memfd");
    if (r == HM_SUCCESS)
        r = hm__prim_map(len, alignment, s->prot, s->map_flags, s->fd, off, &addr);
    if (r == HM_SUCCESS && (r = prepare(s, addr, len)) != HM_SUCCESS) {
        (void)hm__prim_unmap(addr, len);
        addr = NULL;
    }

    hm__mutex_lock(&s->lock);
    s->map_reserved--;
    if (r == HM_SUCCESS) {
        s->ext_reserved--;
        os_mapping_t m = {.addr = (uintptr_t)addr, .len = len, .off = off};
        map_insert(s, &m);
    } else {
        ext_give(s, off, len); /* never touched: no hole to punch */
    }
    hm__mutex_unlock(&s->lock);
    *out = addr;
    return r;
}

HM_RUN static hm_result_t os_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    os_provider_t *s = state;
    *ptr = NULL;
    if (!size) {
        HM_LOG_ERROR("os provider: alloc of 0 bytes");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (alignment && !hm_is_pow2(alignment)) {
        HM_LOG_ERROR("os provider: alignment %zu is not a power of two", alignment);
        return HM_ERROR_INVALID_ALIGNMENT;
    }
    size_t len = round_len(s, size);
    if (!len || len > (SIZE_MAX >> 2) || alignment > (SIZE_MAX >> 2))
        return too_large(size, alignment);
    if (alignment < s->page) alignment = s->page;
    /* THP: a mapping of at least one huge page is aligned to it, or the
     * kernel could never back it with huge pages. */
    if (s->thp && len >= s->thp && alignment < s->thp) alignment = s->thp;

    if (is_shared(s)) return alloc_shared(s, len, alignment, ptr);

    void *addr;
    hm_result_t r = hm__prim_map(len, alignment, s->prot, s->map_flags, -1, 0, &addr);
    if (r) return r;
    if ((r = prepare(s, addr, len)) != HM_SUCCESS) {
        (void)hm__prim_unmap(addr, len);
        return r;
    }
    *ptr = addr;
    return HM_SUCCESS;
}

static hm_result_t check_range(const os_provider_t *s, const void *ptr, size_t size,
                               const char *what, size_t *len) {
    *len = round_len(s, size);
    if (!ptr || !*len || ((uintptr_t)ptr & (s->page - 1))) {
        HM_LOG_ERROR("os provider: %s(%p, %zu): %s", what, ptr, size,
                     !ptr ? "NULL pointer" : !*len ? "bad size" : "pointer not page-aligned");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return HM_SUCCESS;
}

static hm_result_t free_shared(os_provider_t *s, void *ptr, size_t len) {
    if (in_forked_child(s)) /* the extents are the parent's: only unmap */
        return hm__prim_unmap(ptr, len);

    hm__mutex_lock(&s->lock);
    os_mapping_t *m = map_find(s, (uintptr_t)ptr);
    hm_result_t r = HM_SUCCESS;
    if (!m || m->imported) {
        HM_LOG_ERROR("os provider: free(%p): %s", ptr,
                     m ? "an IPC-opened mapping (use ipc close)"
                       : "not an allocation of this provider (double free?)");
        r = HM_ERROR_INVALID_ARGUMENT;
    } else if (m->len != len) {
        HM_LOG_ERROR("os provider: free(%p, %zu): the allocation is %zu bytes", ptr, len, m->len);
        r = HM_ERROR_INVALID_ARGUMENT;
    } else if (!m->seg) {
        r = ext_reserve(s);
    }
    uint64_t off = 0;
    os_seg_t *g = NULL;
    if (r == HM_SUCCESS) {
        off = m->off;
        g = m->seg;
        map_remove(s, m);
    }
    hm__mutex_unlock(&s->lock);
    if (r) return r;

    if (g) { /* a memfd of its own: closed with its last part */
        hm_result_t ur = hm__prim_unmap(ptr, len);
        hm__mutex_lock(&s->lock);
        bool alone = g->refs == 1;
        hm__mutex_unlock(&s->lock);
        /* A part a split made: its pages go now (our reference keeps g). */
        if (!alone && seg_check(g, "punching a hole in the memfd") == HM_SUCCESS)
            (void)hm__prim_punch_hole(g->fd, off, len);
        hm__mutex_lock(&s->lock);
        bool last = --g->refs == 0;
        if (last) s->nsegs--;
        hm__mutex_unlock(&s->lock);
        if (last) seg_drop(g);
        return ur;
    }

    /* The mapping and the pages go first; only then may the extent be
     * handed to another allocation. */
    hm_result_t ur = hm__prim_unmap(ptr, len);
    /* If it fails, or the memfd is gone, the pages stay until reuse. */
    if (memfd_check(s, "punching a hole in the memfd") == HM_SUCCESS)
        (void)hm__prim_punch_hole(s->fd, off, len);

    hm__mutex_lock(&s->lock);
    ext_give(s, off, len);
    hm__mutex_unlock(&s->lock);
    return ur;
}

HM_RUN static hm_result_t os_free(void *state, void *ptr, size_t size) {
    os_provider_t *s = state;
    size_t len;
    hm_result_t r = check_range(s, ptr, size, "free", &len);
    if (r) return r;
    if (is_shared(s)) return free_shared(s, ptr, len);
    return hm__prim_unmap(ptr, len);
}

/* ---------------------------------------------------------------------- */
/* purge                                                                  */

static hm_result_t os_purge_lazy(void *state, void *ptr, size_t size) {
    os_provider_t *s = state;
    size_t len;
    hm_result_t r = check_range(s, ptr, size, "purge_lazy", &len);
    if (r) return r;
    /* MADV_FREE applies to private anonymous memory only; the shared
     * mapping's pages stay in the file (a later force purge frees them). */
    return hm__prim_advise(ptr, len,
                           is_shared(s) ? HM_PRIM_ADVISE_DONTNEED : HM_PRIM_ADVISE_FREE);
}

static hm_result_t os_purge_force(void *state, void *ptr, size_t size) {
    os_provider_t *s = state;
    size_t len;
    hm_result_t r = check_range(s, ptr, size, "purge_force", &len);
    if (r) return r;
    /* Shared: MADV_REMOVE punches the hole in the memfd through the mapping
     * (no offset lookup, works on any page range of an allocation). */
    return hm__prim_advise(ptr, len,
                           is_shared(s) ? HM_PRIM_ADVISE_REMOVE : HM_PRIM_ADVISE_DONTNEED);
}

/* ---------------------------------------------------------------------- */
/* split / merge                                                          */

static hm_result_t os_split(void *state, void *ptr, size_t total, size_t first) {
    os_provider_t *s = state;
    size_t len;
    hm_result_t r = check_range(s, ptr, total, "split", &len);
    if (r) return r;
    if (!first || first >= total || (first & (s->page - 1))) {
        HM_LOG_ERROR("os provider: split(%p, %zu, %zu): the first part must be a non-empty "
                     "multiple of %zu smaller than the total",
                     ptr, total, first, s->page);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!is_shared(s) || in_forked_child(s)) return HM_SUCCESS; /* munmap needs no record */
    hm__mutex_lock(&s->lock);
    /* Room first: a rehash would move the entry found below. */
    if ((r = map_reserve(s, 1)) != HM_SUCCESS) {
        hm__mutex_unlock(&s->lock);
        return r;
    }
    os_mapping_t *m = map_find(s, (uintptr_t)ptr);
    if (!m || m->imported || m->len != len) {
        HM_LOG_ERROR("os provider: split(%p, %zu): not an allocation of this provider", ptr,
                     total);
        r = HM_ERROR_INVALID_ARGUMENT;
    } else if (m->exports) {
        HM_LOG_ERROR("os provider: split(%p): the allocation has IPC handles outstanding", ptr);
        r = HM_ERROR_BUSY;
    } else {
        os_mapping_t hi = {.addr = m->addr + first, .len = m->len - first, .seg = m->seg,
                           .off = m->off + first};
        m->len = first;
        if (m->seg) m->seg->refs++;
        map_insert(s, &hi); /* inserting never moves existing entries */
    }
    hm__mutex_unlock(&s->lock);
    return r;
}

static hm_result_t os_merge(void *state, void *lo, void *hi, size_t total) {
    os_provider_t *s = state;
    size_t len;
    hm_result_t r = check_range(s, lo, total, "merge", &len);
    if (r) return r;
    uintptr_t a = (uintptr_t)lo, b = (uintptr_t)hi;
    if (!hi || b <= a || ((b - a) & (s->page - 1)) || b - a >= len) {
        HM_LOG_ERROR("os provider: merge(%p, %p, %zu): not two adjacent allocations", lo, hi,
                     total);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!is_shared(s) || in_forked_child(s)) return HM_SUCCESS;
    hm__mutex_lock(&s->lock);
    os_mapping_t *ml = map_find(s, a);
    os_mapping_t *mh = map_find(s, b);
    if (!ml || !mh || ml->imported || mh->imported || ml->len != b - a ||
        ml->len + mh->len != len) {
        HM_LOG_ERROR("os provider: merge(%p, %p, %zu): not two adjacent allocations of this "
                     "provider",
                     lo, hi, total);
        r = HM_ERROR_INVALID_ARGUMENT;
    } else if (ml->seg != mh->seg || ml->off + ml->len != mh->off) {
        /* Adjacent in memory but not in the file: one mapping cannot cover
         * both, so they stay two allocations. */
        HM_LOG_INFO("os provider: merge(%p, %p): not contiguous parts of one memfd", lo, hi);
        r = HM_ERROR_NOT_SUPPORTED;
    } else if (ml->exports || mh->exports) {
        HM_LOG_ERROR("os provider: merge(%p, %p): IPC handles outstanding", lo, hi);
        r = HM_ERROR_BUSY;
    } else {
        ml->len += mh->len;
        if (ml->seg) ml->seg->refs--; /* two parts are one now; the memfd stays */
        map_remove(s, mh); /* may move entries: ml is not used after this */
    }
    hm__mutex_unlock(&s->lock);
    return r;
}

/* ---------------------------------------------------------------------- */
/* IPC (shared mode exports; any mode opens)                              */

static size_t os_ipc_handle_size(void *state) {
    (void)state;
    return sizeof(os_ipc_payload_t);
}

/* The live allocation containing addr: exact hit first, else a scan (an
 * exporter normally passes the base; the scan keeps inner pointers working). */
static os_mapping_t *map_find_containing(os_provider_t *s, uintptr_t addr) {
    os_mapping_t *m = map_find(s, addr);
    if (m) return m;
    for (size_t i = 0; i < s->map_cap; i++) {
        m = &s->map[i];
        if (m->addr && !m->imported && m->addr <= addr && addr - m->addr < m->len) return m;
    }
    return NULL;
}

static hm_result_t os_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    os_provider_t *s = state;
    if (fd) *fd = -1;
    if (!ptr || !payload || !fd) {
        HM_LOG_ERROR("os provider: ipc get: NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!is_shared(s)) {
        HM_LOG_ERROR("os provider: ipc get needs a shared-mode provider (HM_OS_SHARED)");
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (in_forked_child(s)) return HM_ERROR_NOT_SUPPORTED;
    hm_result_t r = HM_SUCCESS;
    hm__mutex_lock(&s->lock);
    os_mapping_t *m = map_find_containing(s, (uintptr_t)ptr);
    if (!m || m->imported) {
        HM_LOG_ERROR("os provider: ipc get(%p): not an allocation of this provider", ptr);
        r = HM_ERROR_INVALID_ARGUMENT;
    } else if (size > m->len - ((uintptr_t)ptr - m->addr)) {
        HM_LOG_ERROR("os provider: ipc get(%p, %zu): beyond the allocation (%zu bytes)", ptr,
                     size, m->len);
        r = HM_ERROR_INVALID_ARGUMENT;
    } else if (m->exports == UINT32_MAX) {
        r = HM_ERROR_LIMIT;
    } else if ((r = fd_check(map_fd(s, m), map_fd_id(s, m), "ipc get")) == HM_SUCCESS) {
        /* The descriptor goes to the importer: it must be the memfd. The
         * allocation's own memfd holds nothing else (the spill's: see the
         * file comment). */
        m->exports++;
        const hm_prim_file_id_t *id = map_fd_id(s, m);
        os_ipc_payload_t pl = {
            .magic = OS_IPC_MAGIC,
            .version = OS_IPC_VERSION,
            .page_kind = (uint16_t)s->page_kind,
            .fd = map_fd(s, m),
            .offset = m->off,
            .size = m->len,
            .base = m->addr,
            .page_size = s->page,
            .dev = id->dev,
            .ino = id->ino,
        };
        memcpy(payload, &pl, sizeof(pl));
        *fd = pl.fd;
    }
    hm__mutex_unlock(&s->lock);
    return r;
}

static hm_result_t os_ipc_put(void *state, void *payload) {
    os_provider_t *s = state;
    if (!payload) return HM_ERROR_INVALID_ARGUMENT;
    os_ipc_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != OS_IPC_MAGIC || pl.version != OS_IPC_VERSION) {
        HM_LOG_ERROR("os provider: ipc put: not a handle exported by this provider");
        return HM_ERROR_INVALID_HANDLE;
    }
    if (!is_shared(s)) return HM_ERROR_NOT_SUPPORTED;
    if (in_forked_child(s)) return HM_SUCCESS;
    hm__mutex_lock(&s->lock);
    os_mapping_t *m = map_find(s, (uintptr_t)pl.base);
    if (m && !m->imported && m->off == pl.offset && m->exports &&
        pl.fd == map_fd(s, m)) {
        m->exports--;
        hm__mutex_unlock(&s->lock);
        return HM_SUCCESS;
    }
    hm__mutex_unlock(&s->lock);
    HM_LOG_ERROR("os provider: ipc put: no outstanding handle for offset %llu",
                 (unsigned long long)pl.offset);
    return HM_ERROR_INVALID_HANDLE;
}

static hm_result_t os_ipc_open(void *state, const void *payload, int fd, size_t size,
                               void **ptr) {
    os_provider_t *s = state;
    if (ptr) *ptr = NULL;
    if (!payload || !ptr || fd < 0) {
        HM_LOG_ERROR("os provider: ipc open: %s", fd < 0 ? "no file descriptor"
                                                         : "NULL argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (in_forked_child(s)) return HM_ERROR_NOT_SUPPORTED;
    os_ipc_payload_t pl;
    memcpy(&pl, payload, sizeof(pl));
    const size_t base_page = hm__prim_page_size();
    if (pl.magic != OS_IPC_MAGIC || pl.version != OS_IPC_VERSION ||
        !hm_is_pow2((size_t)pl.page_size) || pl.page_size < base_page ||
        pl.page_size > ((uint64_t)1 << 30) || !pl.size || (pl.size & (pl.page_size - 1)) ||
        (pl.offset & (pl.page_size - 1)) || pl.size > (SIZE_MAX >> 2) ||
        pl.offset > (uint64_t)INT64_MAX - pl.size || pl.reserved) {
        HM_LOG_ERROR("os provider: ipc open: malformed payload");
        return HM_ERROR_INVALID_HANDLE;
    }
    if (size > pl.size) {
        HM_LOG_ERROR("os provider: ipc open: %zu bytes asked, the handle covers %llu", size,
                     (unsigned long long)pl.size);
        return HM_ERROR_INVALID_HANDLE;
    }
    /* What came is checked before it is mapped (a peer chose it): the
     * memfd the handle names, sealed so that nobody can shrink it under
     * the mapping (a touch past the end would SIGBUS), long enough. */
    hm_prim_file_id_t named = {.dev = pl.dev, .ino = pl.ino};
    if (hm__prim_fd_check(fd, &named) != HM_SUCCESS) {
        HM_LOG_ERROR("os provider: ipc open: the descriptor is not the memfd the handle names");
        return HM_ERROR_INVALID_HANDLE;
    }
    unsigned seals = 0;
    if (hm__prim_seals(fd, &seals) != HM_SUCCESS || !(seals & HM_PRIM_SEAL_SHRINK)) {
        HM_LOG_ERROR("os provider: ipc open: the memfd is not sealed against shrinking (its "
                     "holder could make our touches fault): refused");
        return HM_ERROR_INVALID_HANDLE;
    }
    uint64_t fsize = 0;
    hm_result_t r = hm__prim_fd_size(fd, &fsize, NULL);
    if (r) return r;
    if (fsize < pl.offset + pl.size) {
        HM_LOG_ERROR("os provider: ipc open: the file is %llu bytes, the handle needs %llu",
                     (unsigned long long)fsize, (unsigned long long)(pl.offset + pl.size));
        return HM_ERROR_INVALID_HANDLE;
    }

    hm__mutex_lock(&s->lock);
    r = map_reserve(s, 1);
    if (r == HM_SUCCESS) s->map_reserved++;
    hm__mutex_unlock(&s->lock);
    if (r) return r;

    void *addr = NULL;
    /* This provider's own protection (never the exporter's say). */
    r = hm__prim_map((size_t)pl.size, (size_t)pl.page_size, s->prot, HM_PRIM_MAP_SHARED, fd,
                     pl.offset, &addr);
    hm__mutex_lock(&s->lock);
    s->map_reserved--;
    if (r == HM_SUCCESS) {
        os_mapping_t m = {.addr = (uintptr_t)addr, .len = (size_t)pl.size, .off = pl.offset,
                          .imported = 1};
        map_insert(s, &m);
    }
    hm__mutex_unlock(&s->lock);
    *ptr = addr;
    return r;
}

static hm_result_t os_ipc_close(void *state, void *ptr, size_t size) {
    os_provider_t *s = state;
    if (!ptr) return HM_ERROR_INVALID_ARGUMENT;
    if (in_forked_child(s)) return hm__prim_unmap(ptr, round_len(s, size));
    hm__mutex_lock(&s->lock);
    os_mapping_t *m = map_find(s, (uintptr_t)ptr);
    size_t len = 0;
    if (m && m->imported) {
        len = m->len;
        map_remove(s, m);
    }
    hm__mutex_unlock(&s->lock);
    if (!len) {
        HM_LOG_ERROR("os provider: ipc close(%p): not opened through this provider", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return hm__prim_unmap(ptr, len);
}

static int cmp_range(const void *a, const void *b) {
    uintptr_t x = ((const uintptr_t *)a)[0], y = ((const uintptr_t *)b)[0];
    return (x > y) - (x < y);
}

/* Each munmap of a written shared mapping sends a TLB-shootdown interrupt to
 * every other CPU running this process; unmapping each run of adjacent
 * mappings at once sends one per run (mmap places consecutive mappings next
 * to each other, so a pool's imports are mostly runs). */
static hm_result_t os_ipc_close_many(void *state, void *const *ptrs, const size_t *sizes,
                                     size_t n) {
    os_provider_t *s = state;
    hm_result_t res = HM_SUCCESS;
    uintptr_t(*run)[2] = n && !in_forked_child(s) ? malloc(n * sizeof(*run)) : NULL;
    if (!run) { /* one by one */
        for (size_t i = 0; i < n; i++) {
            hm_result_t r = os_ipc_close(state, ptrs[i], sizes[i]);
            if (res == HM_SUCCESS) res = r;
        }
        return res;
    }
    size_t k = 0;
    hm__mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        os_mapping_t *m = ptrs[i] ? map_find(s, (uintptr_t)ptrs[i]) : NULL;
        if (!m || !m->imported) {
            HM_LOG_ERROR("os provider: ipc close(%p): not opened through this provider", ptrs[i]);
            res = HM_ERROR_INVALID_ARGUMENT;
            continue;
        }
        run[k][0] = m->addr;
        run[k++][1] = m->len;
        map_remove(s, m);
    }
    hm__mutex_unlock(&s->lock);
    qsort(run, k, sizeof(*run), cmp_range);
    for (size_t i = 0; i < k;) {
        uintptr_t end = run[i][0] + run[i][1];
        size_t j = i + 1;
        while (j < k && run[j][0] == end) end += run[j++][1];
        hm_result_t r = hm__prim_unmap((void *)run[i][0], end - run[i][0]);
        if (res == HM_SUCCESS) res = r;
        i = j;
    }
    free(run);
    return res;
}

/* ---------------------------------------------------------------------- */

static const hm_provider_ops_t os_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "os",
    .init = os_init,
    .fini = os_fini,
    .get_info = os_get_info,
    .alloc = os_alloc,
    .free = os_free,
    .purge_lazy = os_purge_lazy,
    .purge_force = os_purge_force,
    .split = os_split,
    .merge = os_merge,
    .ipc =
        {
            .handle_size = os_ipc_handle_size,
            .get = os_ipc_get,
            .put = os_ipc_put,
            .open = os_ipc_open,
            .close = os_ipc_close,
            .close_many = os_ipc_close_many,
        },
};

const hm_provider_ops_t *hm_os_provider_ops(void) { return &os_ops; }

HM_RUN hm_result_t hm_os_provider_create(const hm_os_params_t *params, hm_provider_t **provider) {
    return hm_provider_create(&os_ops, params, provider);
}
