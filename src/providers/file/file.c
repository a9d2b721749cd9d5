/* hetmem — the file provider (see include/hetmem/providers/file.h).
 * SPDX-License-Identifier: MIT
 *
 * State and locking:
 *  - the coarse object (its own lock) holds every mapping as a region whose
 *    tag is the region's file offset; allocations are coarse blocks;
 *  - grow_lock guards file_end, the offset where the next growth starts. A
 *    shared mapping's growth reserves [file_end, +len) under the lock and
 *    extends the file with fallocate() outside it (fallocate never shrinks a
 *    file, so concurrent growths of disjoint ranges are safe); only the
 *    fallbacks that use ftruncate() (private mappings, filesystems without
 *    fallocate) hold grow_lock across the call, since a smaller ftruncate
 *    racing a larger one would cut the file. Allocation from free space never
 *    waits on grow_lock.
 *  - punched: set once a hole was punched; from then on alloc re-backs the
 *    range it hands out (fallocate KEEP_SIZE), so that a full filesystem
 *    answers HM_ERROR_OUT_OF_MEMORY instead of SIGBUS on first write.
 */
#include "providers/file/file.h"

#include "providers/coarse/coarse.h"
#include "platform/prim.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define FILE_DEFAULT_GROW (16u << 20)

struct hm_file_params {
    char *path;
    hm_file_visibility_t visibility;
    bool map_sync;
    bool keep_file;
    bool foreign_file;
    size_t grow_size;
    uint64_t max_size;
};

typedef struct file_state {
    hm_coarse_t *coarse;
    int fd;
    char *path;
    bool shared, map_sync, keep_file;
    _Atomic bool no_fallocate; /* the filesystem answered EOPNOTSUPP once */
    size_t page;
    size_t grow_size;
    uint64_t max_size;
    hm_prim_file_id_t id; /* the file's identity, to check fd before each use */
    pthread_mutex_t grow_lock;
    uint64_t file_end; /* guarded by grow_lock */
    _Atomic bool punched;
} file_state_t;

/* A range freed while the parent exported it, due in a forked child. */
/* ---- helpers shared with devdax ---- */

hm_result_t hm__file_map(int fd, uint64_t offset, size_t size, size_t alignment, bool shared,
                         bool sync, void **out) {
    *out = NULL;
    if (!sync)
        return hm__prim_map(size, alignment, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                            shared ? HM_PRIM_MAP_SHARED : 0, fd, offset, out);
    const size_t page = hm__prim_page_size();
    if (alignment < page) alignment = page;
    size_t span;
    if (__builtin_add_overflow(size, alignment - page, &span) || span > (size_t)PTRDIFF_MAX ||
        offset > (uint64_t)INT64_MAX)
        return hm__errno_result(ENOMEM, "mmap(%zu bytes aligned to %zu): too large", size,
                                alignment);
    /* Reserve an unbacked window, place the MAP_SYNC mapping over its aligned
     * part (the window is ours: MAP_FIXED replaces nothing else), trim. */
    char *w = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w == MAP_FAILED)
        return hm__errno_result(errno, "mmap(reserve %zu bytes for MAP_SYNC)", span);
    char *at = (char *)hm_align_up((uintptr_t)w, alignment);
    void *m = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC | MAP_FIXED,
                   fd, (off_t)offset);
    if (m == MAP_FAILED) {
        int e = errno;
        munmap(w, span);
        if (e == EOPNOTSUPP || e == EINVAL) {
            HM_LOG_ERROR("MAP_SYNC mapping of fd %d refused (%s): the file must be on a "
                         "filesystem mounted with DAX, or a device DAX",
                         fd, strerror(e));
            (void)hm__native_error(e, "mmap(MAP_SHARED_VALIDATE | MAP_SYNC, fd %d)", fd);
            return HM_ERROR_NOT_SUPPORTED;
        }
        return hm__errno_result(e, "mmap(%zu bytes, MAP_SYNC, fd %d, offset %" PRIu64 ")", size,
                                fd, offset);
    }
    if (at > w) munmap(w, (size_t)(at - w));
    if (at + size < w + span) munmap(at + size, (size_t)(w + span - (at + size)));
    *out = at;
    return HM_SUCCESS;
}

hm_result_t hm__file_fd_check(int fd, const hm_prim_file_id_t *id, const char *who,
                              const char *path, const char *what) {
    hm_result_t r = hm__prim_fd_check(fd, id);
    if (hm_unlikely(r != HM_SUCCESS)) {
        const char *why = NULL;
        (void)hm_last_native_error(&why);
        if (hm__prim_fd_first_report(id))
            HM_LOG_ERROR("%s provider '%s': its descriptor %d was closed or replaced by the "
                         "program (%s); %s refused, the descriptor is left alone (later "
                         "refusals are logged at debug level)", who, path, fd, why ? why : "?",
                         what);
        else
            HM_LOG_DEBUG("%s provider '%s': descriptor %d closed or replaced (%s); %s refused",
                         who, path, fd, why ? why : "?", what);
    }
    return r;
}

static hm_result_t fd_check(const file_state_t *s, const char *what) {
    return hm__file_fd_check(s->fd, &s->id, "file", s->path, what);
}


hm_result_t hm__file_ipc_validate(const hm_file_ipc_payload_t *p, uint32_t magic, size_t size,
                                  size_t granularity) {
    const char *why = NULL;
    if (p->magic != magic) why = "wrong magic (not this provider's handle)";
    else if (p->version != HM_FILE_IPC_VERSION) why = "unknown payload version";
    else if (p->pad != 0 || p->reserved != 0 || (p->flags & ~(uint32_t)HM_FILE_IPC_MAP_SYNC))
        why = "unknown flags or reserved bits set";
    else if (magic == HM_DEVDAX_IPC_MAGIC && p->ino != 0) why = "a device handle with an inode";
    else if (!p->size || (p->size & (granularity - 1)) || (p->offset & (granularity - 1)) ||
             p->offset > (uint64_t)INT64_MAX - p->size)
        why = "offset or size not aligned or out of range";
    else if (hm_align_up(size, granularity) != p->size) why = "size does not match the handle";
    if (why) {
        HM_LOG_ERROR("IPC payload rejected: %s", why);
        return HM_ERROR_INVALID_HANDLE;
    }
    return HM_SUCCESS;
}

hm_result_t hm__file_ipc_check_fd(const hm_file_ipc_payload_t *p, int fd, bool is_device,
                                  struct stat *st) {
    const char *who = is_device ? "devdax" : "file";
    if (fd < 0) {
        HM_LOG_ERROR("%s IPC open: the handle came without its descriptor (a handle of this "
                     "provider always moves as the exporter's descriptor; a path is never "
                     "opened)", who);
        return HM_ERROR_INVALID_HANDLE;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) {
        int e = errno;
        HM_LOG_ERROR("%s IPC open: descriptor %d: %s", who, fd, strerror(e));
        (void)hm__native_error(e, "fcntl(%d, F_GETFL)", fd);
        return HM_ERROR_INVALID_HANDLE;
    }
    if ((fl & O_PATH) == O_PATH || (fl & O_ACCMODE) != O_RDWR) {
        HM_LOG_ERROR("%s IPC open: the handle's descriptor is not open read-write (flags "
                     "0%o): the exporter does not hold what the handle would grant", who,
                     (unsigned)fl);
        return HM_ERROR_INVALID_HANDLE;
    }
    if (fstat(fd, st) != 0) {
        int e = errno;
        HM_LOG_ERROR("%s IPC open: fstat of the handle's descriptor: %s", who, strerror(e));
        (void)hm__native_error(e, "fstat(%d)", fd);
        return HM_ERROR_INVALID_HANDLE;
    }
    if (is_device) {
        if (!S_ISCHR(st->st_mode) || (uint64_t)st->st_rdev != p->dev) {
            HM_LOG_ERROR("devdax IPC open: the handle names the device %u:%u and its "
                         "descriptor is %s: refused", major((dev_t)p->dev), minor((dev_t)p->dev),
                         S_ISCHR(st->st_mode) ? "another character device"
                                              : "no character device");
            return HM_ERROR_INVALID_HANDLE;
        }
        return HM_SUCCESS;
    }
    if (!S_ISREG(st->st_mode) || (uint64_t)st->st_dev != p->dev ||
        (uint64_t)st->st_ino != p->ino) {
        HM_LOG_ERROR("file IPC open: the handle names the file (device 0x%" PRIx64
                     ", inode %" PRIu64 ") and its descriptor is %s: refused", p->dev, p->ino,
                     S_ISREG(st->st_mode) ? "another file" : "no regular file");
        return HM_ERROR_INVALID_HANDLE;
    }
    if (st->st_size < 0 || (uint64_t)st->st_size < p->offset + p->size) {
        HM_LOG_ERROR("file IPC open: the file holds %lld bytes, the handle maps [%" PRIu64
                     ", %" PRIu64 "): refused (a touch past its end would fault)",
                     (long long)st->st_size, p->offset, p->offset + p->size);
        return HM_ERROR_INVALID_HANDLE;
    }
    return HM_SUCCESS;
}

/* ---- params ---- */

hm_result_t hm_file_params_create(const char *path, hm_file_params_t **params) {
    if (!params) {
        HM_LOG_ERROR("hm_file_params_create: params is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *params = NULL;
    if (!path || !*path) {
        HM_LOG_ERROR("hm_file_params_create: path is %s", path ? "empty" : "NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_file_params_t *p = calloc(1, sizeof(*p));
    if (!p || !(p->path = strdup(path))) {
        free(p);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    p->visibility = HM_FILE_SHARED;
    p->keep_file = true;
    p->grow_size = FILE_DEFAULT_GROW;
    *params = p;
    return HM_SUCCESS;
}

hm_result_t hm_file_params_destroy(hm_file_params_t *params) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    free(params->path);
    free(params);
    return HM_SUCCESS;
}

hm_result_t hm_file_params_set_visibility(hm_file_params_t *params, hm_file_visibility_t v) {
    if (!params || (v != HM_FILE_SHARED && v != HM_FILE_PRIVATE)) {
        HM_LOG_ERROR("hm_file_params_set_visibility: bad argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->visibility = v;
    return HM_SUCCESS;
}

hm_result_t hm_file_params_set_map_sync(hm_file_params_t *params, bool map_sync) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    params->map_sync = map_sync;
    return HM_SUCCESS;
}

hm_result_t hm_file_params_set_keep_file(hm_file_params_t *params, bool keep) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    params->keep_file = keep;
    return HM_SUCCESS;
}

hm_result_t hm_file_params_set_foreign_file(hm_file_params_t *params, bool allow) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    params->foreign_file = allow;
    return HM_SUCCESS;
}

hm_result_t hm_file_params_set_grow_size(hm_file_params_t *params, size_t bytes) {
    if (!params || !bytes || bytes > (SIZE_MAX >> 2)) {
        HM_LOG_ERROR("hm_file_params_set_grow_size: bad argument");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    params->grow_size = bytes;
    return HM_SUCCESS;
}

hm_result_t hm_file_params_set_max_size(hm_file_params_t *params, uint64_t bytes) {
    if (!params) return HM_ERROR_INVALID_ARGUMENT;
    params->max_size = bytes;
    return HM_SUCCESS;
}

/* ---- growing the file ---- */

static bool is_no_space(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

/* Record a "no space" failure: the native error keeps the errno, the caller
 * gets OUT_OF_MEMORY. */
static hm_result_t no_space(file_state_t *s, int e, const char *call, uint64_t off, uint64_t len) {
    (void)hm__native_error(e, "%s('%s', %" PRIu64 ", %" PRIu64 ")", call, s->path, off, len);
    HM_LOG_INFO("file provider '%s': no space for %" PRIu64 " more bytes (%s)", s->path, len,
                strerror(e));
    return HM_ERROR_OUT_OF_MEMORY;
}

/* Back [off, off+len) of the file with real blocks; extends the file size
 * (keep_size false) or not. */
static hm_result_t back_range(file_state_t *s, uint64_t off, uint64_t len, bool keep_size) {
    hm_result_t fr = fd_check(s, "fallocate");
    if (fr != HM_SUCCESS) return fr;
    int r;
    do {
        r = fallocate(s->fd, keep_size ? FALLOC_FL_KEEP_SIZE : 0, (off_t)off, (off_t)len);
    } while (r != 0 && errno == EINTR);
    if (r == 0) return HM_SUCCESS;
    int e = errno;
    if (is_no_space(e)) return no_space(s, e, "fallocate", off, len);
    if (e == EOPNOTSUPP) return HM_ERROR_NOT_SUPPORTED; /* caller falls back */
    return hm__errno_result(e, "fallocate('%s', %" PRIu64 ", %" PRIu64 ")", s->path, off, len);
}

/* ftruncate up to end if the file is shorter; grow_lock held. */
static hm_result_t extend_size_locked(file_state_t *s, uint64_t end) {
    hm_result_t fr = fd_check(s, "ftruncate");
    if (fr != HM_SUCCESS) return fr;
    struct stat st;
    if (fstat(s->fd, &st) != 0) return hm__errno_result(errno, "fstat('%s')", s->path);
    if ((uint64_t)st.st_size >= end) return HM_SUCCESS;
    int r;
    do {
        r = ftruncate(s->fd, (off_t)end);
    } while (r != 0 && errno == EINTR);
    if (r == 0) return HM_SUCCESS;
    if (is_no_space(errno)) return no_space(s, errno, "ftruncate", 0, end);
    return hm__errno_result(errno, "ftruncate('%s', %" PRIu64 ")", s->path, end);
}

/* Make [off, off+len) part of the file. */
static hm_result_t extend(file_state_t *s, uint64_t off, uint64_t len) {
    if (s->shared && !atomic_load_explicit(&s->no_fallocate, memory_order_relaxed)) {
        hm_result_t r = back_range(s, off, len, false);
        if (r != HM_ERROR_NOT_SUPPORTED) return r;
        HM_LOG_INFO("file provider '%s': no fallocate on this filesystem; using ftruncate "
                    "(a full filesystem then shows as SIGBUS on first write)",
                    s->path);
        atomic_store_explicit(&s->no_fallocate, true, memory_order_relaxed);
    }
    /* Private mappings need only the size (their pages are anonymous
     * copies); filesystems without fallocate get a sparse extension. */
    hm__mutex_lock(&s->grow_lock);
    hm_result_t r = extend_size_locked(s, off + len);
    hm__mutex_unlock(&s->grow_lock);
    return r;
}

static hm_result_t file_grow(void *owner, size_t size, size_t alignment, void **base, size_t *len,
                             uint64_t *tag) {
    file_state_t *s = owner;
    size_t want = size > s->grow_size ? size : s->grow_size;
    want = hm_align_up(want, s->page);
    if (!want) return HM_ERROR_OUT_OF_MEMORY;

    hm__mutex_lock(&s->grow_lock);
    uint64_t off = s->file_end, end;
    if (s->max_size) {
        uint64_t room = s->max_size > off ? s->max_size - off : 0;
        room &= ~(uint64_t)(s->page - 1);
        if (room < size) {
            hm__mutex_unlock(&s->grow_lock);
            HM_LOG_INFO("file provider '%s': max size %" PRIu64 " reached", s->path,
                        s->max_size);
            return HM_ERROR_OUT_OF_MEMORY;
        }
        if (want > room) want = (size_t)room;
    }
    if (__builtin_add_overflow(off, (uint64_t)want, &end) || end > (uint64_t)INT64_MAX) {
        hm__mutex_unlock(&s->grow_lock);
        return HM_ERROR_OUT_OF_MEMORY;
    }
    s->file_end = end; /* reserved: ours alone */
    hm__mutex_unlock(&s->grow_lock);

    hm_result_t r = extend(s, off, want);
    if (r == HM_ERROR_OUT_OF_MEMORY && want > size) {
        want = size; /* the step does not fit: try exactly what is needed */
        r = extend(s, off, want);
    }
    void *m = NULL;
    if (r == HM_SUCCESS) r = fd_check(s, "mmap");
    if (r == HM_SUCCESS) r = hm__file_map(s->fd, off, want, alignment, s->shared, s->map_sync, &m);
    hm__mutex_lock(&s->grow_lock);
    if (s->file_end == end) s->file_end = r == HM_SUCCESS ? off + want : off; /* give back */
    hm__mutex_unlock(&s->grow_lock);
    if (r != HM_SUCCESS) return r;
    *base = m;
    *len = want;
    *tag = off;
    return HM_SUCCESS;
}

static void file_release(void *owner, void *base, size_t len, uint64_t tag) {
    (void)hm__prim_unmap(base, len);
}

static const hm_coarse_ops_t file_coarse_ops = {.grow = file_grow, .release = file_release};

/* ---- ops ---- */

static void file_fini(void *state);

/* Open the provider's own file read-write: create it (O_EXCL, mode 0600:
 * *created) or open the one there. A symbolic link as the last component
 * is refused (O_NOFOLLOW; O_EXCL never follows one either), with
 * HM_ERROR_INVALID_ARGUMENT, as any path that names no regular file. */
static hm_result_t open_own_file(const char *path, int *out, bool *created) {
    const int fl = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY;
    int fd = -1;
    *created = false;
    /* A file removed between the two opens: try again (a few times). */
    for (int tries = 0; tries < 8; tries++) {
        fd = open(path, fl | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            *created = true;
            break;
        }
        if (errno != EEXIST) break;
        fd = open(path, fl);
        if (fd >= 0 || errno != ENOENT) break;
    }
    if (fd >= 0) {
        *out = fd;
        return HM_SUCCESS;
    }
    int e = errno;
    if (e == ELOOP) {
        HM_LOG_ERROR("file provider: '%s' is a symbolic link: refused (the provider opens its "
                     "file O_NOFOLLOW; give the path of the file itself)", path);
        (void)hm__native_error(e, "open(%s, O_NOFOLLOW)", path);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    HM_LOG_ERROR("file provider: cannot open '%s': %s", path, strerror(e));
    if (e == EISDIR || e == ENOENT || e == ENOTDIR) {
        (void)hm__native_error(e, "open(%s)", path);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    return hm__errno_result(e, "open(%s)", path);
}

static hm_result_t file_init(const void *params, void **state) {
    const hm_file_params_t *p = params;
    if (!p) {
        HM_LOG_ERROR("file provider: params are required (hm_file_params_create)");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    if (p->map_sync && p->visibility != HM_FILE_SHARED) {
        HM_LOG_ERROR("file provider '%s': MAP_SYNC needs a shared mapping", p->path);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    file_state_t *s = calloc(1, sizeof(*s));
    if (!s) return HM_ERROR_OUT_OF_HOST_MEMORY;
    s->fd = -1;
    if (!(s->path = strdup(p->path))) {
        free(s);
        return HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    int e = pthread_mutex_init(&s->grow_lock, NULL);
    if (e) {
        free(s->path);
        free(s);
        return hm__errno_result(e, "pthread_mutex_init");
    }
    s->shared = p->visibility == HM_FILE_SHARED;
    s->map_sync = p->map_sync;
    s->keep_file = p->keep_file;
    s->page = hm__prim_page_size();
    s->grow_size = p->grow_size;
    s->max_size = p->max_size;
    hm_result_t r;

    bool created;
    if ((r = open_own_file(p->path, &s->fd, &created)) != HM_SUCCESS) goto fail;
    if ((r = hm__prim_fd_keep(&s->fd, &s->id)) != HM_SUCCESS) goto fail;
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        r = hm__errno_result(errno, "fstat(%s)", p->path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        HM_LOG_ERROR("file provider: '%s' is not a regular file%s", p->path,
                     S_ISCHR(st.st_mode) ? " (a device DAX? use the devdax provider)" : "");
        r = HM_ERROR_INVALID_ARGUMENT;
        goto fail;
    }
    if (!created && !p->foreign_file && (st.st_uid != geteuid() || (st.st_mode & 077))) {
        HM_LOG_ERROR("file provider: '%s' exists and is %s (owner uid %u, mode 0%03o): refused, "
                     "another user could read or change the memory; "
                     "hm_file_params_set_foreign_file() allows such a file",
                     p->path, st.st_uid != geteuid() ? "not the effective user's"
                                                     : "open to group or others",
                     (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        r = HM_ERROR_PERMISSION;
        goto fail;
    }
    if (s->map_sync) { /* fail at create, not at the first allocation */
        void *probe;
        r = hm__file_map(s->fd, 0, s->page, 0, true, true, &probe);
        if (r != HM_SUCCESS) {
            HM_LOG_ERROR("file provider: '%s' does not support MAP_SYNC", p->path);
            goto fail;
        }
        (void)hm__prim_unmap(probe, s->page);
    }
    r = hm__coarse_create(&file_coarse_ops, s, s->page, &s->coarse);
    if (r != HM_SUCCESS) goto fail;
    /* An existing file: its whole pages are free memory, from offset 0. */
    uint64_t size = (uint64_t)st.st_size;
    uint64_t whole = size & ~(uint64_t)(s->page - 1);
    s->file_end = hm_align_up(size, s->page);
    if (whole > (uint64_t)(SIZE_MAX >> 1)) {
        r = HM_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    if (whole) {
        void *m;
        r = hm__file_map(s->fd, 0, (size_t)whole, 0, s->shared, s->map_sync, &m);
        if (r != HM_SUCCESS) goto fail;
        r = hm__coarse_add_region(s->coarse, m, (size_t)whole, 0);
        if (r != HM_SUCCESS) {
            (void)hm__prim_unmap(m, (size_t)whole);
            goto fail;
        }
    }
    *state = s;
    return HM_SUCCESS;
fail:
    s->keep_file = true; /* never remove a file we failed to use */
    file_fini(s);
    return r;
}

static void file_fini(void *state) {
    file_state_t *s = state;
    hm__coarse_destroy(s->coarse); /* unmaps every region */
    if (s->fd >= 0 && fd_check(s, "close") == HM_SUCCESS) (void)hm__prim_close(s->fd);
    if (!s->keep_file && unlink(s->path) != 0)
        (void)hm__errno_result(errno, "unlink(%s)", s->path);
    pthread_mutex_destroy(&s->grow_lock);
    free(s->path);
    free(s);
}

static void file_get_info(void *state, hm_provider_info_t *info) {
    file_state_t *s = state;
    memset(info, 0, sizeof(*info));
    info->name = "file";
    info->family = HM_PROVIDER_FAMILY_FILE;
    info->kind = HM_MEMORY_HOST;
    info->caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_PURGE_FORCE |
                 HM_PROVIDER_CAP_SPLIT_MERGE | HM_PROVIDER_CAP_CPU_ACCESS;
    if (s->shared) info->caps |= HM_PROVIDER_CAP_IPC;
    info->min_page_size = s->page;
    info->recommended_page_size = s->page;
}

/* File offset of ptr inside the used block that holds [ptr, ptr+size). */
static hm_result_t offset_of(file_state_t *s, const void *ptr, size_t size, uint64_t *off,
                             hm_coarse_range_t *rg) {
    hm_result_t r = hm__coarse_lookup(s->coarse, ptr, size, rg);
    if (r != HM_SUCCESS) return r;
    *off = rg->region_tag + (uint64_t)((uintptr_t)ptr - (uintptr_t)rg->region_base);
    return HM_SUCCESS;
}

static hm_result_t file_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    file_state_t *s = state;
    hm_result_t r = hm__coarse_alloc(s->coarse, size, alignment, ptr);
    if (r != HM_SUCCESS || !s->shared ||
        !atomic_load_explicit(&s->punched, memory_order_relaxed))
        return r;
    /* Holes may have been punched here: back the range again now. */
    uint64_t off;
    hm_coarse_range_t rg;
    size_t len = hm_align_up(size, s->page);
    r = offset_of(s, *ptr, len, &off, &rg);
    if (r == HM_SUCCESS) r = back_range(s, off, len, true);
    if (r == HM_ERROR_NOT_SUPPORTED) r = HM_SUCCESS; /* no fallocate: nothing to do */
    if (r != HM_SUCCESS) {
        (void)hm__coarse_free(s->coarse, *ptr, size);
        *ptr = NULL;
    }
    return r;
}

static hm_result_t file_free(void *state, void *ptr, size_t size) {
    file_state_t *s = state;
    return hm__coarse_free(s->coarse, ptr, size);
}

static hm_result_t file_purge_force(void *state, void *ptr, size_t size) {
    file_state_t *s = state;
    uint64_t off;
    hm_coarse_range_t rg;
    hm_result_t r = offset_of(s, ptr, size, &off, &rg);
    if (r != HM_SUCCESS) return r;
    /* Only whole pages: a partial page may hold a neighbour's bytes. */
    uintptr_t b = hm_align_up((uintptr_t)ptr, s->page);
    uintptr_t e = hm_align_down((uintptr_t)ptr + size, s->page);
    if (!b || b >= e) return HM_SUCCESS;
    off += b - (uintptr_t)ptr;
    if (!s->shared) return hm__prim_advise((void *)b, e - b, HM_PRIM_ADVISE_DONTNEED);
    if ((r = fd_check(s, "punching a hole")) != HM_SUCCESS) return r;
    r = hm__prim_punch_hole(s->fd, off, e - b);
    if (r == HM_SUCCESS) atomic_store_explicit(&s->punched, true, memory_order_relaxed);
    return r;
}

static hm_result_t file_split(void *state, void *ptr, size_t total, size_t first) {
    file_state_t *s = state;
    return hm__coarse_split(s->coarse, ptr, total, first);
}

static hm_result_t file_merge(void *state, void *lo, void *hi, size_t total) {
    file_state_t *s = state;
    return hm__coarse_merge(s->coarse, lo, hi, total);
}

/* ---- IPC: the file's descriptor + {dev, ino, offset, size} ---- */

static size_t file_ipc_size(void *state) { return sizeof(hm_file_ipc_payload_t); }

static hm_result_t file_ipc_get(void *state, void *ptr, size_t size, void *payload, int *fd) {
    file_state_t *s = state;
    *fd = -1;
    if (!s->shared) {
        HM_LOG_ERROR("file provider '%s': a private mapping cannot be shared", s->path);
        return HM_ERROR_NOT_SUPPORTED;
    }
    uint64_t off;
    hm_coarse_range_t rg;
    size_t len = hm_align_up(size, s->page);
    hm_result_t r = offset_of(s, ptr, len ? len : 1, &off, &rg);
    if (r != HM_SUCCESS) return r;
    if ((uintptr_t)ptr & (s->page - 1)) {
        HM_LOG_ERROR("file provider: IPC of %p: not page-aligned", ptr);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    /* The memory moves as this descriptor (the IPC layer moves it). */
    if ((r = fd_check(s, "ipc get")) != HM_SUCCESS) return r;
    /* The IPC layer's buffer may be unaligned: build here, copy out. */
    hm_file_ipc_payload_t local, *p = &local;
    memset(p, 0, sizeof(*p));
    p->magic = HM_FILE_IPC_MAGIC;
    p->version = HM_FILE_IPC_VERSION;
    p->offset = off;
    p->size = len;
    p->dev = s->id.dev;
    p->ino = s->id.ino;
    p->flags = s->map_sync ? HM_FILE_IPC_MAP_SYNC : 0;
    memcpy(payload, p, sizeof(*p));
    *fd = s->fd;
    return HM_SUCCESS;
}

hm_result_t hm__file_ipc_put_check(const void *payload, uint32_t magic, const char *who) {
    hm_file_ipc_payload_t p;
    if (!payload) return HM_ERROR_INVALID_ARGUMENT;
    memcpy(&p, payload, sizeof(p));
    if (p.magic != magic) {
        HM_LOG_ERROR("%s provider: ipc put: not a handle of this provider", who);
        return HM_ERROR_INVALID_HANDLE;
    }
    return HM_SUCCESS;
}

static hm_result_t file_ipc_put(void *state, void *payload) {
    (void)state;
    return hm__file_ipc_put_check(payload, HM_FILE_IPC_MAGIC, "file");
}

static hm_result_t file_ipc_open(void *state, const void *payload, int fd, size_t size,
                                 void **ptr) {
    file_state_t *s = state;
    hm_file_ipc_payload_t local; /* the payload may be unaligned */
    memcpy(&local, payload, sizeof(local));
    const hm_file_ipc_payload_t *p = &local;
    hm_result_t r = hm__file_ipc_validate(p, HM_FILE_IPC_MAGIC, size, s->page);
    if (r != HM_SUCCESS) return r;
    struct stat st;
    if ((r = hm__file_ipc_check_fd(p, fd, false, &st)) != HM_SUCCESS) return r;
    /* Read-write shared, and the importer's own MAP_SYNC choice: the
     * importer's settings decide, never the payload. The mapping keeps the
     * file; the caller closes fd. */
    return hm__file_map(fd, p->offset, (size_t)p->size, 0, true, s->map_sync, ptr);
}

static hm_result_t file_ipc_close(void *state, void *ptr, size_t size) {
    file_state_t *s = state;
    return hm__prim_unmap(ptr, hm_align_up(size, s->page));
}

static const hm_provider_ops_t file_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "file",
    .init = file_init,
    .fini = file_fini,
    .get_info = file_get_info,
    .alloc = file_alloc,
    .free = file_free,
    /* purge_lazy: none (a shared file mapping has no MADV_FREE). */
    .purge_force = file_purge_force,
    .split = file_split,
    .merge = file_merge,
    .ipc = {.handle_size = file_ipc_size,
            .get = file_ipc_get,
            .put = file_ipc_put,
            .open = file_ipc_open,
            .close = file_ipc_close},
};

const hm_provider_ops_t *hm_file_provider_ops(void) { return &file_ops; }

hm_result_t hm_file_provider_create(const char *path, hm_provider_t **provider) {
    hm_file_params_t *p;
    hm_result_t r = hm_file_params_create(path, &p);
    if (r != HM_SUCCESS) return r;
    r = hm_provider_create(&file_ops, p, provider);
    hm_file_params_destroy(p);
    return r;
}
