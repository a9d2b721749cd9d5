/* hetmem tests — the file provider: conformance suites (shared and private
 * mappings, raw and through the proxy pool), persistence across destroy and
 * re-open, hole punching, keep/remove, limits, IPC payload round trip, bad
 * input, and threads growing the file at once (TSan).
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static char dir[256];
static atomic_int file_counter;

static void path_in_dir(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

typedef struct factory {
    hm_file_visibility_t vis;
    size_t grow;
} factory_t;

/* A fresh file per provider, removed at destroy. */
static hm_result_t make_params(const factory_t *f, hm_file_params_t **out) {
    char path[512], name[64];
    snprintf(name, sizeof(name), "suite-%d", atomic_fetch_add(&file_counter, 1));
    path_in_dir(path, sizeof(path), name);
    hm_result_t r = hm_file_params_create(path, out);
    if (r != HM_SUCCESS) return r;
    hm_file_params_set_visibility(*out, f->vis);
    hm_file_params_set_keep_file(*out, false);
    if (f->grow) hm_file_params_set_grow_size(*out, f->grow);
    return HM_SUCCESS;
}

static hm_result_t make_provider(void *arg, hm_provider_t **out) {
    hm_file_params_t *p;
    hm_result_t r = make_params(arg, &p);
    if (r != HM_SUCCESS) return r;
    r = hm_provider_create(hm_file_provider_ops(), p, out);
    hm_file_params_destroy(p);
    return r;
}

static hm_result_t make_pool(void *arg, hm_pool_t **out) {
    hm_provider_t *prov;
    hm_result_t r = make_provider(arg, &prov);
    if (r != HM_SUCCESS) return r;
    r = hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

/* hetmem's own pool over the file provider. */
static hm_result_t make_native_pool(void *arg, hm_pool_t **out) {
    hm_provider_t *prov;
    hm_result_t r = make_provider(arg, &prov);
    if (r != HM_SUCCESS) return r;
    r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r != HM_SUCCESS) hm_provider_destroy(prov);
    return r;
}

static uint64_t file_blocks(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return UINT64_MAX;
    return (uint64_t)st.st_blocks * 512u;
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- bad input and capabilities ---- */

static void test_bad_input(void) {
    hm_file_params_t *fp;
    hm_provider_t *p;
    char path[512];
    CHECK_RES(hm_file_params_create(NULL, &fp), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_create("", &fp), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_create("/x", NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_create(hm_file_provider_ops(), NULL, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_provider_create(dir, &p), HM_ERROR_INVALID_ARGUMENT); /* a directory */
    path_in_dir(path, sizeof(path), "no/such/dir/file");
    CHECK_RES(hm_file_provider_create(path, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_provider_create("/dev/null", &p), HM_ERROR_INVALID_ARGUMENT);

    path_in_dir(path, sizeof(path), "bad");
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_RES(hm_file_params_set_visibility(fp, (hm_file_visibility_t)7),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_set_grow_size(fp, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_set_visibility(NULL, HM_FILE_SHARED), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_set_map_sync(NULL, true), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_set_keep_file(NULL, true), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_set_max_size(NULL, 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_file_params_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
    /* MAP_SYNC with a private mapping: refused. */
    CHECK_OK(hm_file_params_set_map_sync(fp, true));
    CHECK_OK(hm_file_params_set_visibility(fp, HM_FILE_PRIVATE));
    CHECK_RES(hm_provider_create(hm_file_provider_ops(), fp, &p), HM_ERROR_INVALID_ARGUMENT);
    /* MAP_SYNC shared: a clear NOT_SUPPORTED unless this filesystem is DAX. */
    CHECK_OK(hm_file_params_set_visibility(fp, HM_FILE_SHARED));
    CHECK_OK(hm_file_params_set_keep_file(fp, false));
    hm_result_t r = hm_provider_create(hm_file_provider_ops(), fp, &p);
    if (r == HM_SUCCESS) {
        printf("note: %s supports MAP_SYNC (a DAX filesystem)\n", dir);
        void *x;
        CHECK_OK(hm_provider_alloc(p, 4096, 0, &x));
        CHECK_OK(hm_provider_free(p, x, 4096));
        CHECK_OK(hm_provider_destroy(p));
    } else {
        CHECK_RES(r, HM_ERROR_NOT_SUPPORTED);
        const char *msg = NULL;
        int64_t e = hm_last_native_error(&msg);
        CHECK_MSG(e == EOPNOTSUPP || e == EINVAL, "native error %lld (%s)", (long long)e,
                  msg ? msg : "");
    }
    unlink(path);
    CHECK_OK(hm_file_params_destroy(fp));
}

static void test_caps(void) {
    char path[512];
    path_in_dir(path, sizeof(path), "caps");
    hm_file_params_t *fp;
    hm_provider_t *p;
    hm_provider_info_t info;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_OK(hm_file_params_set_keep_file(fp, false));
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &p));
    CHECK_OK(hm_provider_get_info(p, &info));
    CHECK(strcmp(info.name, "file") == 0);
    CHECK_EQ(info.family, HM_PROVIDER_FAMILY_FILE);
    CHECK_EQ(info.kind, HM_MEMORY_HOST);
    CHECK_EQ(info.min_page_size, (size_t)sysconf(_SC_PAGESIZE));
    uint32_t want = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_PURGE_FORCE |
                    HM_PROVIDER_CAP_SPLIT_MERGE | HM_PROVIDER_CAP_CPU_ACCESS | HM_PROVIDER_CAP_IPC;
    CHECK_EQ(info.caps, want); /* no lazy purge, no NUMA */
    CHECK_OK(hm_provider_destroy(p));
    CHECK(!file_exists(path)); /* keep_file false */
    CHECK_OK(hm_file_params_set_visibility(fp, HM_FILE_PRIVATE));
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &p));
    CHECK_OK(hm_provider_get_info(p, &info));
    CHECK_EQ(info.caps, want & ~(uint32_t)HM_PROVIDER_CAP_IPC); /* private: nothing to share */
    CHECK_OK(hm_provider_destroy(p));
    CHECK_OK(hm_file_params_destroy(fp));
}

/* ---- persistence ---- */

static void test_persistence(void) {
    char path[512];
    path_in_dir(path, sizeof(path), "persist");
    unlink(path);
    static const size_t sizes[] = {100, 64 * KIB, 3 * MIB + 5};
    void *ptr[3];
    hm_pool_t *pool;
    hm_provider_t *prov;

    REQUIRE_OK(hm_file_provider_create(path, &prov)); /* keep_file defaults to true */
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    for (int i = 0; i < 3; i++) {
        ptr[i] = hm_pool_malloc(pool, sizes[i]);
        REQUIRE(ptr[i]);
        hm_test_fill(ptr[i], sizes[i], 1000u + (unsigned)i);
    }
    CHECK_OK(hm_pool_destroy(pool));
    CHECK(file_exists(path));

    /* A new provider over the same file, in the same order: same bytes. */
    REQUIRE_OK(hm_file_provider_create(path, &prov));
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    for (int i = 0; i < 3; i++) {
        ptr[i] = hm_pool_malloc(pool, sizes[i]);
        REQUIRE(ptr[i]);
        CHECK_MSG(hm_test_verify(ptr[i], sizes[i], 1000u + (unsigned)i),
                  "allocation %d lost its data across destroy and re-open", i);
    }
    /* And the bytes are in the file itself, at offset 0 for the first. */
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    char buf[100];
    CHECK_EQ(pread(fd, buf, sizeof(buf), 0), (long long)sizeof(buf));
    CHECK(memcmp(buf, ptr[0], sizeof(buf)) == 0);
    close(fd);
    CHECK_OK(hm_pool_destroy(pool));

    /* A private mapping of the same file sees the data; its writes stay
     * private. */
    hm_file_params_t *fp;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_OK(hm_file_params_set_visibility(fp, HM_FILE_PRIVATE));
    CHECK_OK(hm_file_params_set_keep_file(fp, false)); /* removes the file at the end */
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &prov));
    hm_file_params_destroy(fp);
    void *x;
    REQUIRE_OK(hm_provider_alloc(prov, 100, 0, &x));
    CHECK(hm_test_verify(x, 100, 1000u));
    memset(x, 0x5a, 100);
    fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    CHECK_EQ(pread(fd, buf, sizeof(buf), 0), (long long)sizeof(buf));
    CHECK(buf[0] != 0x5a);
    close(fd);
    CHECK_OK(hm_provider_destroy(prov));
    CHECK(!file_exists(path));
}

/* ---- holes ---- */

static void test_holes(void) {
    char path[512];
    path_in_dir(path, sizeof(path), "holes");
    unlink(path);
    hm_provider_t *p;
    REQUIRE_OK(hm_file_provider_create(path, &p));
    const size_t n = 8 * MIB;
    void *a;
    REQUIRE_OK(hm_provider_alloc(p, n, 0, &a));
    memset(a, 0xab, n);
    uint64_t before = file_blocks(path);
    CHECK_MSG(before >= n, "file holds %llu bytes after writing %zu", (unsigned long long)before,
              n);
    CHECK_OK(hm_provider_purge_force(p, a, n));
    uint64_t after = file_blocks(path);
    CHECK_MSG(after + n <= before, "purge_force: %llu -> %llu bytes on disk",
              (unsigned long long)before, (unsigned long long)after);
    CHECK(((unsigned char *)a)[12345] == 0); /* reads back as zeros */
    /* A partial purge leaves the partial pages alone. */
    memset(a, 0xcd, 3 * 4096);
    CHECK_OK(hm_provider_purge_force(p, (char *)a + 100, 2 * 4096));
    CHECK(((unsigned char *)a)[4095] == 0xcd); /* first page is partial: kept */
    CHECK(((unsigned char *)a)[4096] == 0);    /* the whole page inside: punched */
    CHECK(((unsigned char *)a)[2 * 4096 + 50] == 0xcd);
    /* Purge of a range that is not an allocation: refused. */
    CHECK_RES(hm_provider_purge_force(p, (char *)a + n, 4096), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_purge_lazy(p, a, n), HM_ERROR_NOT_SUPPORTED);
    /* Free, allocate again: the range is backed again. */
    CHECK_OK(hm_provider_free(p, a, n));
    REQUIRE_OK(hm_provider_alloc(p, n, 0, &a));
    CHECK_MSG(file_blocks(path) >= n, "re-allocated range not backed again");
    CHECK_OK(hm_provider_free(p, a, n));
    CHECK_OK(hm_provider_destroy(p));
    unlink(path);
}

/* ---- limits, split/merge ---- */

static void test_limits(void) {
    char path[512];
    path_in_dir(path, sizeof(path), "limits");
    unlink(path);
    hm_file_params_t *fp;
    hm_provider_t *p;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_OK(hm_file_params_set_max_size(fp, 4 * MIB));
    CHECK_OK(hm_file_params_set_grow_size(fp, MIB));
    CHECK_OK(hm_file_params_set_keep_file(fp, false));
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &p));
    hm_file_params_destroy(fp);
    void *a, *b, *c;
    CHECK_RES(hm_provider_alloc(p, 5 * MIB, 0, &a), HM_ERROR_OUT_OF_MEMORY);
    REQUIRE_OK(hm_provider_alloc(p, 3 * MIB, 0, &a));
    REQUIRE_OK(hm_provider_alloc(p, MIB, 0, &b));
    CHECK_RES(hm_provider_alloc(p, 4096, 0, &c), HM_ERROR_OUT_OF_MEMORY);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == 4 * MIB);
    /* split and merge through the coarse layer */
    CHECK_OK(hm_provider_split(p, a, 3 * MIB, MIB));
    CHECK_OK(hm_provider_free(p, a, MIB));
    CHECK_OK(hm_provider_alloc(p, MIB, 0, &c)); /* the freed first MiB */
    CHECK(c == a);
    CHECK_OK(hm_provider_merge(p, c, (char *)c + MIB, 3 * MIB));
    CHECK_RES(hm_provider_split(p, c, 3 * MIB, 100), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_free(p, c, 3 * MIB));
    CHECK_OK(hm_provider_free(p, b, MIB));
    CHECK_RES(hm_provider_free(p, b, MIB), HM_ERROR_DOUBLE_FREE);
    CHECK_OK(hm_provider_destroy(p));
    CHECK(!file_exists(path));
}

/* ---- IPC payload: export, then open through a second provider ---- */

static void test_ipc_payload(void) {
    char path[512];
    path_in_dir(path, sizeof(path), "ipc");
    unlink(path);
    hm_provider_t *exp, *imp;
    REQUIRE_OK(hm_file_provider_create(path, &exp));
    char ipath[512];
    path_in_dir(ipath, sizeof(ipath), "ipc-importer");
    unlink(ipath);
    REQUIRE_OK(hm_file_provider_create(ipath, &imp)); /* any file: the fd names the memory */
    const hm_provider_ops_t *ops = hm_provider_get_ops(exp);
    void *es = hm_provider_get_state(exp), *is = hm_provider_get_state(imp);
    REQUIRE(ops && ops->ipc.handle_size);
    size_t hs = ops->ipc.handle_size(es);
    CHECK_EQ(hs, ops->ipc.handle_size(is));
    unsigned char *payload = calloc(1, hs), *bad = calloc(1, hs);
    REQUIRE(payload && bad);
    void *a, *b;
    REQUIRE_OK(hm_provider_alloc(exp, 64 * KIB, 0, &a)); /* offset 0 */
    REQUIRE_OK(hm_provider_alloc(exp, 64 * KIB, 0, &b)); /* offset 64 KiB */
    int xfd = -1;
    REQUIRE_OK(ops->ipc.get(es, b, 64 * KIB, payload, &xfd));
    CHECK(xfd >= 0); /* the memory moves as the exporter's descriptor */
    int fd = dup(xfd); /* the importer's copy, as pidfd_getfd or the channel gives it */
    REQUIRE(fd >= 0);
    hm_test_fill(b, 64 * KIB, 77);
    /* Without the descriptor: refused (no path is ever opened). */
    void *m1 = NULL, *m2 = NULL;
    CHECK_RES(ops->ipc.open(is, payload, -1, 64 * KIB, &m1), HM_ERROR_INVALID_HANDLE);
    CHECK_OK(ops->ipc.open(is, payload, fd, 64 * KIB, &m1));
    CHECK_OK(ops->ipc.open(is, payload, fd, 64 * KIB, &m2));
    if (m1 && m2) {
        CHECK(m1 != b);
        CHECK(hm_test_verify(m1, 64 * KIB, 77));
        memset(m2, 0x11, 16); /* shared: visible to the exporter */
        CHECK(((unsigned char *)b)[15] == 0x11);
        CHECK_OK(ops->ipc.close(is, m1, 64 * KIB));
        CHECK_OK(ops->ipc.close(is, m2, 64 * KIB));
    }
    /* Broken payloads: every one refused, nothing mapped. */
    void *m = NULL;
    for (size_t i = 0; i < hs; i++) { /* flip a byte of each field */
        memcpy(bad, payload, hs);
        bad[i] ^= 0x40;
        hm_result_t r = ops->ipc.open(is, bad, fd, 64 * KIB, &m);
        /* offset changes by 16 KiB * k inside the file are valid offsets of
         * the same file; every other change must be refused */
        if (r == HM_SUCCESS) {
            CHECK_MSG(i >= 8 && i < 16, "flipped byte %zu accepted", i);
            ops->ipc.close(is, m, 64 * KIB);
        } else {
            CHECK_MSG(r == HM_ERROR_INVALID_HANDLE, "flipped byte %zu -> %s", i,
                      hm_result_string(r));
        }
    }
    CHECK_RES(ops->ipc.open(is, payload, fd, 128 * KIB, &m), HM_ERROR_INVALID_HANDLE);
    /* The descriptor of another file (big enough): refused, bound by
     * dev/ino. */
    char other[512];
    path_in_dir(other, sizeof(other), "ipc-other");
    int ofd = open(other, O_RDWR | O_CREAT, 0600);
    REQUIRE(ofd >= 0);
    CHECK(ftruncate(ofd, 1 << 20) == 0);
    CHECK_RES(ops->ipc.open(is, payload, ofd, 64 * KIB, &m), HM_ERROR_INVALID_HANDLE);
    close(ofd);
    /* The right file, read-only: refused (never more than the sender holds). */
    int rofd = open(path, O_RDONLY);
    REQUIRE(rofd >= 0);
    CHECK_RES(ops->ipc.open(is, payload, rofd, 64 * KIB, &m), HM_ERROR_INVALID_HANDLE);
    close(rofd);
    /* A range past the file's end (forged offset): refused, no SIGBUS. */
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    uint64_t off = (uint64_t)st.st_size; /* the payload's offset: bytes 8..15, native */
    memcpy(bad, payload, hs);
    memcpy(bad + 8, &off, sizeof(off));
    CHECK_RES(ops->ipc.open(is, bad, fd, 64 * KIB, &m), HM_ERROR_INVALID_HANDLE);
    off = (uint64_t)st.st_size - 4 * KIB; /* straddles the end */
    memcpy(bad + 8, &off, sizeof(off));
    CHECK_RES(ops->ipc.open(is, bad, fd, 64 * KIB, &m), HM_ERROR_INVALID_HANDLE);
    CHECK_OK(ops->ipc.put(es, payload));
    close(fd);
    CHECK_OK(hm_provider_free(exp, a, 64 * KIB));
    CHECK_OK(hm_provider_free(exp, b, 64 * KIB));
    CHECK_OK(hm_provider_destroy(imp));
    CHECK_OK(hm_provider_destroy(exp));
    unlink(path);
    unlink(ipath);
    unlink(other);
    free(payload);
    free(bad);
}

/* ---- the provider's own file: no symlink, no foreign file ---- */

static void test_own_file(void) {
    char path[512], target[512];
    path_in_dir(path, sizeof(path), "own");
    path_in_dir(target, sizeof(target), "own-target");
    unlink(path);
    unlink(target);
    hm_provider_t *p = NULL;
    /* A symbolic link at the path, dangling or not: refused, nothing
     * created or changed through it. */
    REQUIRE(symlink(target, path) == 0);
    CHECK_RES(hm_file_provider_create(path, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK(!file_exists(target));
    int tfd = open(target, O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(tfd >= 0);
    close(tfd);
    CHECK_RES(hm_file_provider_create(path, &p), HM_ERROR_INVALID_ARGUMENT);
    struct stat st;
    CHECK(stat(target, &st) == 0 && st.st_size == 0);
    unlink(path);
    /* Created by the provider: 0600, used again. */
    REQUIRE_OK(hm_file_provider_create(path, &p));
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK_OK(hm_provider_destroy(p));
    REQUIRE_OK(hm_file_provider_create(path, &p));
    CHECK_OK(hm_provider_destroy(p));
    /* Open to group or others: refused unless the program allows it. */
    static const mode_t modes[] = {0666, 0640, 0604, 0620, 0602, 0610};
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        REQUIRE(chmod(path, modes[i]) == 0);
        CHECK_RES(hm_file_provider_create(path, &p), HM_ERROR_PERMISSION);
    }
    hm_file_params_t *fp;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_RES(hm_file_params_set_foreign_file(NULL, true), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_file_params_set_foreign_file(fp, true));
    CHECK_OK(hm_provider_create(hm_file_provider_ops(), fp, &p));
    if (p) CHECK_OK(hm_provider_destroy(p));
    CHECK_OK(hm_file_params_set_foreign_file(fp, false));
    CHECK_RES(hm_provider_create(hm_file_provider_ops(), fp, &p), HM_ERROR_PERMISSION);
    hm_file_params_destroy(fp);
    unlink(path);
    unlink(target);
}

/* ---- threads growing the file at once ---- */

#define THREADS 4

typedef struct worker {
    hm_provider_t *p;
    int id, errors;
} worker_t;

/* The first and last 256 bytes carry the owner's pattern: enough to catch
 * two threads handed overlapping ranges, cheap under TSan. */
static void fill_ends(void *p, size_t n, uint64_t seed) {
    hm_test_fill(p, 256, seed);
    hm_test_fill((char *)p + n - 256, 256, seed + 1);
}

static int verify_ends(const void *p, size_t n, uint64_t seed) {
    return hm_test_verify(p, 256, seed) && hm_test_verify((const char *)p + n - 256, 256, seed + 1);
}

static void *worker_fn(void *arg) {
    worker_t *w = arg;
    void *live[16] = {0};
    size_t size[16] = {0};
    unsigned seed = (unsigned)w->id * 7919u;
    for (int i = 0; i < 1500; i++) {
        int k = (int)(rand_r(&seed) % 16);
        if (live[k]) {
            if (!verify_ends(live[k], size[k], (uint64_t)(w->id * 100 + k))) w->errors++;
            if (rand_r(&seed) % 8 == 0 && hm_provider_purge_force(w->p, live[k], size[k]) != 0)
                w->errors++;
            if (hm_provider_free(w->p, live[k], size[k]) != HM_SUCCESS) w->errors++;
            live[k] = NULL;
        } else {
            size[k] = (size_t)(rand_r(&seed) % 32 + 1) * 4096 - rand_r(&seed) % 2048;
            if (hm_provider_alloc(w->p, size[k], 0, &live[k]) != HM_SUCCESS) {
                w->errors++;
                live[k] = NULL;
                continue;
            }
            fill_ends(live[k], size[k], (uint64_t)(w->id * 100 + k));
        }
    }
    for (int k = 0; k < 16; k++)
        if (live[k] && hm_provider_free(w->p, live[k], size[k]) != HM_SUCCESS) w->errors++;
    return NULL;
}

static void test_threads(void) {
    char path[512];
    path_in_dir(path, sizeof(path), "threads");
    unlink(path);
    hm_file_params_t *fp;
    hm_provider_t *p;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_OK(hm_file_params_set_grow_size(fp, 256 * KIB)); /* many concurrent growths */
    CHECK_OK(hm_file_params_set_keep_file(fp, false));
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &p));
    hm_file_params_destroy(fp);
    pthread_t t[THREADS];
    worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker_t){.p = p, .id = i + 1};
        REQUIRE(pthread_create(&t[i], NULL, worker_fn, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].errors, 0);
    }
    CHECK_OK(hm_provider_destroy(p));
    CHECK(!file_exists(path));
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/hm-file-XXXXXX", base && *base ? base : "/tmp");
    REQUIRE(mkdtemp(dir));
    HM_TEST_PHASE(test_bad_input());
    HM_TEST_PHASE(test_caps());
    HM_TEST_PHASE(test_persistence());
    HM_TEST_PHASE(test_holes());
    HM_TEST_PHASE(test_limits());
    HM_TEST_PHASE(test_ipc_payload());
    HM_TEST_PHASE(test_own_file());
    HM_TEST_PHASE(test_threads());

    factory_t shared = {.vis = HM_FILE_SHARED, .grow = 0};
    factory_t priv = {.vis = HM_FILE_PRIVATE, .grow = 0};
    factory_t small = {.vis = HM_FILE_SHARED, .grow = 64 * KIB};
    hm_test_suite_opts_t opts = {.max_alloc = 8 * MIB, .can_free = 1};
    HM_TEST_PHASE(hm_test_provider_suite("file shared", make_provider, &shared, &opts));
    HM_TEST_PHASE(hm_test_provider_suite("file private", make_provider, &priv, &opts));
    HM_TEST_PHASE(hm_test_provider_suite("file shared, 64 KiB growth", make_provider, &small, &opts));
    HM_TEST_PHASE(hm_test_pool_suite("proxy/file shared", make_pool, &shared, &opts));
    HM_TEST_PHASE(hm_test_pool_suite("proxy/file private", make_pool, &priv, &opts));
    HM_TEST_PHASE(hm_test_pool_suite("native/file shared", make_native_pool, &shared, &opts));
    HM_TEST_PHASE(hm_test_pool_suite("native/file private", make_native_pool, &priv, &opts));
    CHECK_MSG(rmdir(dir) == 0, "files left behind in %s", dir);
    return hm_test_finish();
}
