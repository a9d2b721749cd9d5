/* hetmem — the devdax provider (see include/hetmem/providers/devdax.h).
 * SPDX-License-Identifier: MIT
 *
 * The device's usable part is mapped once at create (address space only;
 * pages fault in at the device alignment) and handed to the coarse layer as
 * one region whose tag is its device offset (0). The coarse layer's
 * granularity is the base page: allocations need not be multiples of the
 * device alignment, since only the one big mapping has to be aligned.
 * IPC opens map the aligned range around the allocation. */
#include "providers/devdax/devdax.h"

#include "providers/coarse/coarse.h"
#include "platform/prim.h"
#include "providers/file/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define DEVDAX_DEFAULT_ALIGN (2u << 20)
#define DEVDAX_MAX_ALIGN (1u << 30)

struct hm_devdax_params {
    char *path;
    char *sysfs_root;
    uint64_t size_limit;
};

typedef struct devdax_state {
    hm_coarse_t *coarse;
    int fd;
    char *path;
    char *sysfs_root; /* NULL: /sys */
    void *base;
    size_t size;  /* mapped, usable bytes */
    size_t align; /* device alignment */
    size_t page;
    dev_t rdev;
    hm_prim_file_id_t id; /* the device node's identity, to check fd before each use */
} devdax_state_t;

/* ---- sysfs ---- */

/* Read a small sysfs file holding one unsigned number. 0: ok; -1: missing;
 * -2: unreadable or not a number. */
static int read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "re");
    if (!f) return errno == ENOENT ? -1 : -2;
    char buf[64];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n && buf[n - 1] == '\n') buf[--n] = '\0';
    if (!n || buf[0] == '-' || buf[0] == '+' || buf[0] == ' ') return -2;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 0);
    if (errno || *end) return -2;
    *out = (uint64_t)v;
    return 0;
}

hm_result_t hm__devdax_sysfs_read(const char *root, unsigned major, unsigned minor,
                                  uint64_t *size, uint64_t *align) {
    /* dir is shorter than path by more than any suffix appended below. */
    char dir[PATH_MAX - 64], path[PATH_MAX], link[PATH_MAX];
    if (!root || !*root) root = "/sys";
    int n = snprintf(dir, sizeof(dir), "%s/dev/char/%u:%u", root, major, minor);
    if (n < 0 || (size_t)n >= sizeof(dir)) {
        HM_LOG_ERROR("devdax: sysfs path too long");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        HM_LOG_ERROR("devdax: device %u:%u has no sysfs entry %s: not a device DAX", major, minor,
                     dir);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    snprintf(path, sizeof(path), "%s/subsystem", dir);
    ssize_t len = readlink(path, link, sizeof(link) - 1);
    if (len <= 0) {
        HM_LOG_ERROR("devdax: %s is missing: cannot tell whether %u:%u is a device DAX", path,
                     major, minor);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    link[len] = '\0';
    const char *sub = strrchr(link, '/');
    sub = sub ? sub + 1 : link;
    if (strcmp(sub, "dax") != 0) {
        HM_LOG_ERROR("devdax: device %u:%u belongs to subsystem '%s', not 'dax': not a device DAX",
                     major, minor, sub);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    snprintf(path, sizeof(path), "%s/size", dir);
    int rc = read_u64(path, size);
    if (rc != 0 || *size == 0) {
        HM_LOG_ERROR("devdax: %s is %s", path,
                     rc == -1 ? "missing" : rc == -2 ? "not a number" : "0 (device disabled?)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    static const char *const align_files[] = {"align", "device/dax_region/align",
                                              "../dax_region/align"};
    for (size_t i = 0; i < sizeof(align_files) / sizeof(align_files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, align_files[i]);
        rc = read_u64(path, align);
        if (rc == 0) return HM_SUCCESS;
        if (rc == -2) {
            HM_LOG_ERROR("devdax: %s is not a number", path);
            return HM_ERROR_INVALID_ARGUMENT;
        }
    }
    HM_LOG_INFO("devdax: no alignment in sysfs for %u:%u; assuming %u", major, minor,
                DEVDAX_DEFAULT_ALIGN);
    *align = DEVDAX_DEFAULT_ALIGN;
    return HM_SUCCESS;
}

hm_result_t hm__devdax_geometry(uint64_t size, uint64_t align, uint64_t limit, size_t page,
                                uint64_t *usable) {
    if (!hm_is_pow2((size_t)align) || align < page || align > DEVDAX_MAX_ALIGN) {
        HM_LOG_ERROR("devdax: alignment %" PRIu64 " is not a power of two between %zu and %u",
                     align, page, DEVDAX_MAX_ALIGN);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (limit && limit > size) {
        HM_LOG_ERROR("devdax: %" PRIu64 " bytes asked, the device has %" PRIu64, limit, size);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    uint64_t u = (limit ? limit : size) & ~(align - 1);
    if (!u) {
        HM_LOG_ERROR("devdax: %" PRIu64 " bytes hold no %" PRIu64 "-byte aligned unit",
                     limit ? limit : size, align);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (u > (uint64_t)(SIZE_MAX >> 1)) u = (uint64_t)(SIZE_MAX >> 1) & ~(align - 1);
    *usable = u;
    return HM_SUCCESS;
}

/* ---- params ---- */

hm_result_t hm_devdax_params_create(const char *path, hm_devdax_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_devdax_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *params = NULL;
    if (!path || !*path) {
        HM_LOG_ERROR("hm_devdax_params_create: path is %s", path ? "empty" : "NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_devdax_params_t *p = calloc(1, sizeof(*p));
    if (!p || !(p->path = strdup(path))) {
        free(p);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    *params = p;
    return HM_SUCCESS;
}

hm_result_t hm_devdax_params_destroy(hm_devdax_params_t *params) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    free(params->path);
    free(params->sysfs_root);
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_devdax_params_set_size(hm_devdax_params_t *params, uint64_t bytes) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    params->size_limit = bytes;
    return HM_SUCCESS;
}

hm_result_t hm__devdax_params_set_sysfs_root(hm_devdax_params_t *params, const char *root) {
    if (!params || !root) return HM_ERROR_INVALID_ARGUMENT;
    char *r = strdup(root);
    if (!r) return HM_ERROR_OUT_OF_HOST_MEMORY;
    free(params->sysfs_root);
    params->sysfs_root = r;
    return HM_SUCCESS;
}

/* ---- ops ---- */

static void devdax_fini(void *state);

/* A range freed while the parent exported it, due in a forked child. */
static hm_result_t devdax_init(const void *params, void **state) {
    const hm_devdax_params_t *p = params;
    if (!p) {
        HM_LOG_ERROR("devdax provider: params are required (hm_devdax_params_create)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    struct stat st;
    if (lstat(p->path, &st) != 0) {
        int e = errno;
        HM_LOG_ERROR("devdax provider: '%s': %s", p->path, strerror(e));
        (void)hm__native_error(e, "lstat(%s)", p->path);
        return e == EACCES ? HM_ERROR_PERMISSION : HM_ERROR_INVALID_ARGUMENT;
    }
    if (S_ISLNK(st.st_mode)) {
        HM_LOG_ERROR("devdax provider: '%s' is a symbolic link: refused (the device is opened "
                     "O_NOFOLLOW; give the device node itself, e.g. /dev/dax0.0)", p->path);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (!S_ISCHR(st.st_mode)) {
        HM_LOG_ERROR("devdax provider: '%s' is not a character device%s", p->path,
                     S_ISREG(st.st_mode) ? " (a regular file: use the file provider)" : "");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    uint64_t size, align, usable;
    size_t page = hm__prim_page_size();
    hm_result_t r = hm__devdax_sysfs_read(p->sysfs_root, major(st.st_rdev), minor(st.st_rdev),
                                          &size, &align);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("devdax provider: '%s' is not a usable device DAX", p->path);
        return r;
    }
    r = hm__devdax_geometry(size, align, p->size_limit, page, &usable);
    if (r != HM_SUCCESS) return r;

    devdax_state_t *s = calloc(1, sizeof(*s));
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    s->fd = -1;
    s->page = page;
    s->align = (size_t)align;
    s->rdev = st.st_rdev;
    if (!(s->path = strdup(p->path)) ||
        (p->sysfs_root && !(s->sysfs_root = strdup(p->sysfs_root)))) {
        r = HM_ERROR_OUT_OF_HOST_MEMORY;
        goto fail;
    }
    s->fd = open(p->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (s->fd < 0) {
        int e = errno;
        HM_LOG_ERROR("devdax provider: cannot open '%s': %s", p->path, strerror(e));
        r = e == ELOOP ? HM_ERROR_INVALID_ARGUMENT : hm__errno_result(e, "open(%s)", p->path);
        goto fail;
    }
    if ((r = hm__prim_fd_keep(&s->fd, &s->id)) != HM_SUCCESS) goto fail;
    struct stat fst;
    if (fstat(s->fd, &fst) != 0 || !S_ISCHR(fst.st_mode) || fst.st_rdev != st.st_rdev) {
        HM_LOG_ERROR("devdax provider: '%s' is another file than the device it named a moment "
                     "ago", p->path);
        r = HM_ERROR_INVALID_ARGUMENT;
        goto fail;
    }
    r = hm__file_map(s->fd, 0, (size_t)usable, s->align, true, true, &s->base);
    if (r != HM_SUCCESS) {
        HM_LOG_ERROR("devdax provider: cannot map %" PRIu64 " bytes of '%s' with MAP_SYNC",
                     usable, p->path);
        goto fail;
    }
    s->size = (size_t)usable;
    r = hm__coarse_create(NULL, s, page, &s->coarse);
    if (r == HM_SUCCESS) r = hm__coarse_add_region(s->coarse, s->base, s->size, 0);
    if (r != HM_SUCCESS) goto fail;
    HM_LOG_DEBUG("devdax provider: '%s' mapped, %zu bytes aligned to %zu", p->path, s->size,
                 s->align);
    *state = s;
    return HM_SUCCESS;
fail:
    devdax_fini(s);
    return r;
}

static void devdax_fini(void *state) {
    devdax_state_t *s = state;
    hm__coarse_destroy(s->coarse);
    if (s->base) (void)hm__prim_unmap(s->base, s->size);
    if (s->fd >= 0 &&
        hm__file_fd_check(s->fd, &s->id, "devdax", s->path ? s->path : "?", "close") ==
            HM_SUCCESS)
        (void)hm__prim_close(s->fd);
    free(s->path);
    free(s->sysfs_root);
    free(s);
}

static void devdax_get_info(void *state, hm_provider_info_t *info) {
    devdax_state_t *s = state;
    memset(info, 0, sizeof(*info));
    info->name = "devdax";
    info->family = HM_PROVIDER_FAMILY_DEVDAX;
    info->kind = HM_MEMORY_HOST;
    /* No purge: a device DAX cannot give memory back. */
    info->caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_SPLIT_MERGE | HM_PROVIDER_CAP_CPU_ACCESS |
                 HM_PROVIDER_CAP_IPC;
    info->min_page_size = s->page;
    info->recommended_page_size = s->align;
}

static hm_result_t devdax_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    devdax_state_t *s = state;
    return hm__coarse_alloc(s->coarse, size, alignment, ptr);
}


static hm_result_t devdax_free(void *state, void *ptr, size_t size) {
    devdax_state_t *s = state;
    return hm__coarse_free(s->coarse, ptr, size);
}

static hm_result_t devdax_split(void *state, void *ptr, size_t total, size_t first) {
    devdax_state_t *s = state;
    return hm__coarse_split(s->coarse, ptr, total, first);
}

static hm_result_t devdax_merge(void *state, void *lo, void *hi, size_t total) {
    devdax_state_t *s = state;
    return hm__coarse_merge(s->coarse, lo, hi, total);
}

/* ---- IPC: the device's descriptor + {rdev, offset, size} ---- */

static size_t devdax_ipc_size(void *state) { return sizeof(hm_file_ipc_payload_t); }

static hm_result_t devdax_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    devdax_state_t *s = state;
    *fd = -1;
    hm_coarse_range_t rg;
    size_t len = hm_align_up(size, s->page);
    hm_result_t r = hm__coarse_lookup(s->coarse, ptr, len, &rg);
    if (r != HM_SUCCESS) return r;
    /* The memory moves as this descriptor (the IPC layer moves it). */
    r = hm__file_fd_check(s->fd, &s->id, "devdax", s->path, "ipc get");
    if (r != HM_SUCCESS) return r;
    /* The IPC layer's buffer may be unaligned: build here, copy out. */
    hm_file_ipc_payload_t local, *p = &local;
    memset(p, 0, sizeof(*p));
    p->magic = HM_DEVDAX_IPC_MAGIC;
    p->version = HM_FILE_IPC_VERSION;
    p->offset = rg.region_tag + (uint64_t)((uintptr_t)ptr - (uintptr_t)rg.region_base);
    p->size = len;
    p->dev = (uint64_t)s->rdev;
    p->flags = HM_FILE_IPC_MAP_SYNC;
    memcpy(payload, p, sizeof(*p));
    *fd = s->fd;
    return HM_SUCCESS;
}

static hm_result_t devdax_ipc_put(void *state, void *payload) {
    (void)state;
    return hm__file_ipc_put_check(payload, HM_DEVDAX_IPC_MAGIC, "devdax");
}

/* The descriptor that came with a handle is a character device with the
 * handle's (and this provider's) device number; sysfs must say it is a
 * device DAX with this provider's alignment, and hold the aligned range
 * [lo, hi) the open maps. Checked on every open (the miss path). */
static hm_result_t devdax_ipc_check(devdax_state_t *s, const hm_file_ipc_payload_t *p, int fd,
                                    uint64_t *lo, uint64_t *hi) {
    struct stat st;
    hm_result_t r = hm__file_ipc_check_fd(p, fd, true, &st);
    if (r != HM_SUCCESS) return r;
    uint64_t dsize, dalign;
    if (hm__devdax_sysfs_read(s->sysfs_root, major(st.st_rdev), minor(st.st_rdev), &dsize,
                              &dalign) != HM_SUCCESS) {
        HM_LOG_ERROR("devdax IPC open: the handle's descriptor is not a device DAX: refused");
        return HM_ERROR_INVALID_HANDLE;
    }
    if (dalign != (uint64_t)s->align) {
        HM_LOG_ERROR("devdax IPC open: the device's alignment is now %" PRIu64 ", was %zu: "
                     "refused", dalign, s->align);
        return HM_ERROR_INVALID_HANDLE;
    }
    /* Validated: offset + size does not overflow and is below 2^63. */
    *lo = p->offset & ~(uint64_t)(s->align - 1);
    *hi = (p->offset + p->size + (s->align - 1)) & ~(uint64_t)(s->align - 1);
    if (*hi > (dsize & ~(uint64_t)(s->align - 1)) || *hi - *lo > (uint64_t)(SIZE_MAX >> 1)) {
        HM_LOG_ERROR("devdax IPC open: the handle maps up to %" PRIu64 " of a %" PRIu64
                     "-byte device: refused", *hi, dsize);
        return HM_ERROR_INVALID_HANDLE;
    }
    return HM_SUCCESS;
}

static hm_result_t devdax_ipc_open(void *state, const void *payload, int fd, size_t size,
                                   void **ptr) {
    devdax_state_t *s = state;
    hm_file_ipc_payload_t local; /* the payload may be unaligned */
    memcpy(&local, payload, sizeof(local));
    const hm_file_ipc_payload_t *p = &local;
    hm_result_t r = hm__file_ipc_validate(p, HM_DEVDAX_IPC_MAGIC, size, s->page);
    if (r != HM_SUCCESS) return r;
    /* This provider's device only: its alignment shapes open and close. */
    if (p->dev != (uint64_t)s->rdev) {
        HM_LOG_ERROR("devdax IPC open: the handle is for another device");
        return HM_ERROR_INVALID_HANDLE;
    }
    uint64_t lo, hi;
    if ((r = devdax_ipc_check(s, p, fd, &lo, &hi)) != HM_SUCCESS) return r;
    /* Map the aligned range around [offset, offset+size), read-write
     * shared, MAP_SYNC: the importer's settings, never the payload's. The
     * mapping keeps the device; the caller closes fd. */
    void *m = NULL;
    r = hm__file_map(fd, lo, (size_t)(hi - lo), s->align, true, true, &m);
    if (r != HM_SUCCESS) return r;
    *ptr = (char *)m + (p->offset - lo);
    return HM_SUCCESS;
}

static hm_result_t devdax_ipc_close(void *state, void *ptr, size_t size) {
    devdax_state_t *s = state;
    /* open mapped [align_down(ptr), align_up(ptr + size)) at an aligned base. */
    uintptr_t lo = hm_align_down((uintptr_t)ptr, s->align);
    uintptr_t hi = hm_align_up((uintptr_t)ptr + hm_align_up(size, s->page), s->align);
    return hm__prim_unmap((void *)lo, hi - lo);
}

static const hm_provider_ops_t devdax_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "devdax",
    .init = devdax_init,
    .fini = devdax_fini,
    .get_info = devdax_get_info,
    .alloc = devdax_alloc,
    .free = devdax_free,
    /* purge: none, the device cannot give memory back. */
    .split = devdax_split,
    .merge = devdax_merge,
    .ipc = {.handle_size = devdax_ipc_size,
            .get = devdax_ipc_get,
            .put = devdax_ipc_put,
            .open = devdax_ipc_open,
            .close = devdax_ipc_close},
};

const hm_provider_ops_t *hm_devdax_provider_ops(void) { return &devdax_ops; }

hm_result_t hm_devdax_provider_create(const char *path, hm_provider_t **provider) {
    hm_devdax_params_t *p;
    hm_result_t r = hm_devdax_params_create(path, &p);
    if (r != HM_SUCCESS) return r;
    r = hm_provider_create(&devdax_ops, p, provider);
    hm_devdax_params_destroy(p);
    return r;
}
