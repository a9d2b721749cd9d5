/* hetmem tests — the file and devdax providers' IPC against a hostile peer,
 * with real processes.
 *
 * A hostile exporter (this process) crafts handles of a file provider: it
 * decodes its own handle, changes the payload or header, recomputes the
 * checksum and writes the bytes back into the buffer hm_ipc_get returned,
 * so that the importer's check against the exporter's copy agrees. Each
 * handle goes to an importer process, by pidfd_getfd (bytes only) and by
 * the channel (bytes + the descriptor the header names), which must:
 *  - refuse a handle whose dev/ino name another file (a root-only 0600
 *    file): the descriptor is the exporter's, bound by dev/ino; the file is
 *    unchanged;
 *  - refuse a descriptor the exporter holds read-only, or that is no regular
 *    file;
 *  - refuse a size or offset beyond the file with HM_ERROR_INVALID_HANDLE,
 *    and survive (no SIGBUS);
 *  - refuse unknown flags, ignore MAP_SYNC, and never map executable (the
 *    importer's /proc/self/maps);
 *  - open the genuine handle.
 * The importer runs as root and, when the test runs as root, as a second
 * user (uid/gid 54321, no groups): the genuine handle opens by the channel,
 * and by pidfd_getfd either opens or is refused cleanly.
 * The provider's own file: a symbolic link at the path is refused; a
 * pre-existing file owned by another uid or open to group/others is refused
 * unless hm_file_params_set_foreign_file() allows it.
 * devdax: the same with the device named by HM_TEST_DEVDAX_PATH (its
 * contents are overwritten), skipped with a message without one.
 *
 * Importers are forked from a server process forked before this process
 * used hetmem, so they inherit none of the exporter's descriptors or state.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"
#include "pidfd_probe.h"
#include "ipc/wire.h"
#include "providers/file/file.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define SIZE (64 * KIB)
#define OTHER_UID 54321

enum { MODE_PIDFD = 0, MODE_CHANNEL = 1 };
enum { KIND_FILE = 0, KIND_DEVDAX = 1 };

typedef struct cmd {
    int32_t op; /* 1: import, 0: exit */
    int32_t mode, kind, as_user;
    uint64_t seed;  /* the pattern of the exported bytes (0: do not check) */
    int32_t write;  /* write 0x5a at byte 0 when open */
    char dir[200];  /* where the importer's own pool file goes */
    char dev[200];  /* devdax: the device */
} cmd_t;

typedef struct result {
    int32_t stage; /* 0: done; else the setup step that failed */
    int32_t r;     /* hm_ipc_open's result */
    int32_t got_fd;
    int32_t data_ok;
    char perms[8]; /* of the mapping, from /proc/self/maps */
} result_t;

typedef struct reply {
    int32_t status; /* waitpid status of the importer */
    int32_t got;    /* the importer wrote its result */
    result_t res;
} reply_t;

/* ---- the importer ---- */

static void maps_perms(const void *p, char out[8]) {
    strcpy(out, "?");
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
            snprintf(out, 8, "%s", perms);
            break;
        }
    }
    fclose(f);
}

static hm_pool_t *importer_pool(const cmd_t *c) {
    hm_provider_t *prov = NULL;
    if (c->kind == KIND_DEVDAX) {
        if (hm_devdax_provider_create(c->dev, &prov) != HM_SUCCESS) return NULL;
    } else {
        char path[300];
        snprintf(path, sizeof(path), "%s/importer-%d", c->dir, (int)getpid());
        hm_file_params_t *fp;
        if (hm_file_params_create(path, &fp) != HM_SUCCESS) return NULL;
        hm_file_params_set_keep_file(fp, false);
        hm_result_t r = hm_provider_create(hm_file_provider_ops(), fp, &prov);
        hm_file_params_destroy(fp);
        if (r != HM_SUCCESS) return NULL;
    }
    hm_pool_t *pool;
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) {
        hm_provider_destroy(prov);
        return NULL;
    }
    return pool;
}

static void importer(const cmd_t *c, int sock, int out) {
    result_t res;
    memset(&res, 0, sizeof(res));
    res.r = -1;
    unsigned char buf[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    if (c->as_user && (setgroups(0, NULL) != 0 || setresgid(OTHER_UID, OTHER_UID, OTHER_UID) != 0 ||
                       setresuid(OTHER_UID, OTHER_UID, OTHER_UID) != 0)) {
        (void)!recv(sock, buf, sizeof(buf), 0); /* the handle: not for the next case */
        res.stage = 1;
        goto done;
    }
    hm_ipc_channel_t *ch;
    int s2 = dup(sock);
    if (s2 < 0 || hm_ipc_channel_from_fd(s2, &ch) != HM_SUCCESS) {
        (void)!recv(sock, buf, sizeof(buf), 0);
        res.stage = 2;
        goto done;
    }
    size_t len = 0;
    int fd = -1;
    if (hm_ipc_channel_recv(ch, buf, sizeof(buf), &len, &fd) != HM_SUCCESS) {
        res.stage = 3;
        goto done;
    }
    res.got_fd = fd >= 0;
    hm_pool_t *pool = importer_pool(c);
    if (!pool) {
        res.stage = 4;
        goto done;
    }
    void *q = NULL;
    res.r = fd >= 0 ? hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)buf, len, fd, &q)
                    : hm_ipc_open(pool, (const hm_ipc_handle_t *)buf, len, &q);
    if (fd >= 0) close(fd);
    if (res.r == HM_SUCCESS && q) {
        maps_perms(q, res.perms);
        /* Touch every page: a mapping past the file's end dies here. */
        volatile const unsigned char *v = q;
        unsigned sum = 0;
        for (size_t i = 0; i < SIZE; i += 4096) sum += v[i];
        (void)sum;
        res.data_ok = !c->seed || hm_test_verify((char *)q + 4096, SIZE - 4096, c->seed);
        if (c->write) ((unsigned char *)q)[0] = 0x5a;
        if (hm_ipc_close(q) != HM_SUCCESS) res.stage = 5;
    }
    if (hm_pool_destroy(pool) != HM_SUCCESS) res.stage = 6;
    hm_ipc_channel_destroy(ch);
done:
    (void)!write(out, &res, sizeof(res));
}

/* The server: forked before this process used hetmem; forks one importer
 * per command and reports how it ended. */
static void server(int sock) {
    for (;;) {
        cmd_t c;
        ssize_t n = recv(sock, &c, sizeof(c), 0);
        if (n != (ssize_t)sizeof(c) || c.op == 0) _exit(0);
        int pfd[2];
        if (pipe(pfd) != 0) _exit(2);
        pid_t pid = fork();
        if (pid < 0) _exit(3);
        if (pid == 0) {
            close(pfd[0]);
            importer(&c, sock, pfd[1]);
            _exit(0);
        }
        close(pfd[1]);
        reply_t rep;
        memset(&rep, 0, sizeof(rep));
        rep.got = read(pfd[0], &rep.res, sizeof(rep.res)) == (ssize_t)sizeof(rep.res);
        close(pfd[0]);
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        rep.status = st;
        if (send(sock, &rep, sizeof(rep), 0) != (ssize_t)sizeof(rep)) _exit(4);
    }
}

/* ---- the exporter ---- */

static hm_ipc_channel_t *ch;
static int is_root, pidfd_ok;
static char dir[64], user_dir[64];
static const char *devdax_path;

/* Send the handle at h (the exporter's own buffer) to a fresh importer. */
static reply_t import(const hm_ipc_handle_t *h, size_t len, int mode, int kind, int as_user,
                      uint64_t seed, int write) {
    cmd_t c;
    memset(&c, 0, sizeof(c));
    c.op = 1;
    c.mode = mode;
    c.kind = kind;
    c.as_user = as_user;
    c.seed = seed;
    c.write = write;
    snprintf(c.dir, sizeof(c.dir), "%s", as_user ? user_dir : dir);
    if (devdax_path) snprintf(c.dev, sizeof(c.dev), "%s", devdax_path);
    REQUIRE_OK(hm_ipc_channel_send_bytes(ch, &c, sizeof(c)));
    if (mode == MODE_CHANNEL) REQUIRE_OK(hm_ipc_channel_send(ch, h, len));
    else REQUIRE_OK(hm_ipc_channel_send_bytes(ch, h, len));
    reply_t rep;
    size_t n = 0;
    REQUIRE_OK(hm_ipc_channel_recv_bytes(ch, &rep, sizeof(rep), &n));
    REQUIRE(n == sizeof(rep));
    return rep;
}

static const char *mode_name(int mode) { return mode == MODE_CHANNEL ? "channel" : "pidfd"; }

/* The importer ended normally, set up, and hm_ipc_open said `want`. */
static void check_reply(const reply_t *rep, hm_result_t want, const char *what, int mode) {
    CHECK_MSG(WIFEXITED(rep->status) && WEXITSTATUS(rep->status) == 0,
              "%s (%s): the importer %s %d", what, mode_name(mode),
              WIFSIGNALED(rep->status) ? "died of signal" : "exited with",
              WIFSIGNALED(rep->status) ? WTERMSIG(rep->status) : WEXITSTATUS(rep->status));
    CHECK_MSG(rep->got && rep->res.stage == 0, "%s (%s): importer setup failed at step %d",
              what, mode_name(mode), rep->res.stage);
    CHECK_MSG(rep->res.r == (int)want, "%s (%s): hm_ipc_open -> %s, expected %s", what,
              mode_name(mode), hm_result_string((hm_result_t)rep->res.r),
              hm_result_string(want));
    if (rep->res.r == HM_SUCCESS)
        CHECK_MSG(!strcmp(rep->res.perms, "rw-s"),
                  "%s (%s): the importer's mapping is '%s', expected rw-s", what,
                  mode_name(mode), rep->res.perms);
}

/* A crafted copy of the exporter's handle, written into the exporter's own
 * buffer (as a hostile exporter can); restore() puts the genuine bytes
 * back. */
typedef struct craft {
    hm_ipc_handle_t *h;
    size_t len;
    unsigned char orig[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    unsigned char bytes[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    hm_wire_t w;
    hm_file_ipc_payload_t p;
} craft_t;

static void craft_begin(craft_t *c, hm_ipc_handle_t *h, size_t len) {
    c->h = h;
    c->len = len;
    REQUIRE(len <= sizeof(c->orig));
    memcpy(c->orig, h, len);
    memcpy(c->bytes, h, len);
    REQUIRE_OK(hm__wire_decode(c->bytes, len, &c->w));
    REQUIRE(c->w.payload_len == sizeof(hm_file_ipc_payload_t));
    memcpy(&c->p, c->bytes + HM_IPC_HEADER_SIZE, sizeof(c->p));
}

static void craft_apply(craft_t *c) {
    memcpy(c->bytes + HM_IPC_HEADER_SIZE, &c->p, sizeof(c->p));
    hm__wire_encode(&c->w, c->bytes);
    hm_wire_t check;
    REQUIRE_OK(hm__wire_decode(c->bytes, c->len, &check)); /* a well-formed handle */
    memcpy(c->h, c->bytes, c->len);
}

static void craft_restore(craft_t *c) { memcpy(c->h, c->orig, c->len); }

static void make_file(const char *path, size_t size, int byte, mode_t mode) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    REQUIRE(fd >= 0);
    unsigned char b[4096];
    memset(b, byte, sizeof(b));
    for (size_t i = 0; i < size; i += sizeof(b)) REQUIRE(write(fd, b, sizeof(b)) == (ssize_t)sizeof(b));
    REQUIRE(fchmod(fd, mode) == 0);
    close(fd);
}

static int file_is(const char *path, size_t size, int byte) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && (size_t)st.st_size == size;
    unsigned char b[4096];
    for (size_t i = 0; ok && i < size; i += sizeof(b)) {
        ok = read(fd, b, sizeof(b)) == (ssize_t)sizeof(b);
        for (size_t k = 0; ok && k < sizeof(b); k++) ok = b[k] == (unsigned char)byte;
    }
    close(fd);
    return ok;
}

static hm_pool_t *exporter_file_pool(const char *path) {
    hm_file_params_t *fp;
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    REQUIRE_OK(hm_file_params_set_grow_size(fp, 256 * KIB)); /* a short file */
    REQUIRE_OK(hm_file_params_set_keep_file(fp, false));
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &prov));
    hm_file_params_destroy(fp);
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    return pool;
}

/* Both transports: pidfd only where pidfd_getfd works at all. */
#define FOR_MODES(m) for (int m = pidfd_ok ? MODE_PIDFD : MODE_CHANNEL; m <= MODE_CHANNEL; m++)

static void test_hostile_exporter(void) {
    char path[128], secret[128], other[128];
    snprintf(path, sizeof(path), "%s/exporter", dir);
    snprintf(secret, sizeof(secret), "%s/secret", dir);
    snprintf(other, sizeof(other), "%s/other", dir);
    make_file(secret, 1 << 20, 'S', 0600); /* root-only when run as root */
    make_file(other, 1 << 20, 'O', 0600);
    struct stat sst, ost, zst;
    REQUIRE(stat(secret, &sst) == 0 && stat(other, &ost) == 0);
    int ro = open(other, O_RDONLY | O_CLOEXEC); /* the exporter holds it read-only */
    int zero = open("/dev/zero", O_RDWR | O_CLOEXEC);
    REQUIRE(ro >= 0 && zero >= 0 && fstat(zero, &zst) == 0);

    hm_pool_t *pool = exporter_file_pool(path);
    unsigned char *p = hm_pool_malloc(pool, SIZE);
    REQUIRE(p);
    memset(p, 0, 4096);
    hm_test_fill(p + 4096, SIZE - 4096, 31);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    hm_ipc_handle_info_t info;
    REQUIRE_OK(hm_ipc_handle_info(h, len, &info));
    CHECK(info.has_fd); /* the memory moves as the exporter's descriptor */
    int xfd = -1;
    {
        hm_wire_t w;
        REQUIRE_OK(hm__wire_decode(h, len, &w));
        xfd = w.fd;
    }
    struct stat xst;
    REQUIRE(fstat(xfd, &xst) == 0);
    craft_t c;

    FOR_MODES(m) {
        /* Genuine: opens, reads, writes back. */
        p[0] = 0;
        reply_t rep = import(h, len, m, KIND_FILE, 0, 31, 1);
        check_reply(&rep, HM_SUCCESS, "genuine", m);
        CHECK_MSG(rep.res.data_ok, "genuine (%s): the importer read other bytes", mode_name(m));
        CHECK_MSG(p[0] == 0x5a, "genuine (%s): the importer's write is not seen", mode_name(m));
        CHECK_EQ(rep.res.got_fd, m == MODE_CHANNEL);

        /* dev/ino of another file (root-only): the descriptor is still the
         * exporter's, and it is not that file. */
        craft_begin(&c, h, len);
        c.p.dev = (uint64_t)sst.st_dev;
        c.p.ino = (uint64_t)sst.st_ino;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 1);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "dev/ino of a root-only file", m);
        craft_restore(&c);
        CHECK_MSG(file_is(secret, 1 << 20, 'S'), "the root-only file changed");

        /* Another descriptor of the exporter's, named by its dev/ino: one it
         * holds read-only (never more than it holds) ... */
        craft_begin(&c, h, len);
        c.w.fd = ro;
        c.p.dev = (uint64_t)ost.st_dev;
        c.p.ino = (uint64_t)ost.st_ino;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 1);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "a read-only descriptor", m);
        craft_restore(&c);
        CHECK_MSG(file_is(other, 1 << 20, 'O'), "the read-only file changed");
        /* ... and one that is no regular file (/dev/zero). */
        craft_begin(&c, h, len);
        c.w.fd = zero;
        c.p.dev = (uint64_t)zst.st_dev;
        c.p.ino = (uint64_t)zst.st_ino;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "a descriptor of /dev/zero", m);
        craft_restore(&c);

        /* Size beyond the file (header and payload agree): refused, the
         * importer survives. */
        REQUIRE(fstat(xfd, &xst) == 0);
        uint64_t fsize = (uint64_t)xst.st_size;
        craft_begin(&c, h, len);
        c.w.size = fsize + (1u << 20);
        c.p.size = c.w.size;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "size beyond the file", m);
        craft_restore(&c);
        /* Offset: straddling the end, and far beyond it. */
        craft_begin(&c, h, len);
        c.p.offset = fsize - 4096;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "offset straddling the end", m);
        craft_restore(&c);
        craft_begin(&c, h, len);
        c.p.offset = (uint64_t)1 << 40;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "offset beyond the file", m);
        craft_restore(&c);

        /* Protection and flags: unknown bits refused (PROT_EXEC's value, all
         * of them, a reserved field); MAP_SYNC is the importer's choice
         * (ignored: this filesystem has no DAX); never executable. */
        static const uint32_t bad_flags[] = {0x4u, 0xffffffffu, HM_FILE_IPC_MAP_SYNC | 0x4u};
        for (size_t i = 0; i < sizeof(bad_flags) / sizeof(bad_flags[0]); i++) {
            craft_begin(&c, h, len);
            c.p.flags = bad_flags[i];
            craft_apply(&c);
            rep = import(h, len, m, KIND_FILE, 0, 0, 0);
            check_reply(&rep, HM_ERROR_INVALID_HANDLE, "unknown flags", m);
            craft_restore(&c);
        }
        craft_begin(&c, h, len);
        c.p.reserved = 0x4;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "reserved field set", m);
        craft_restore(&c);
        craft_begin(&c, h, len);
        c.p.flags = HM_FILE_IPC_MAP_SYNC;
        craft_apply(&c);
        rep = import(h, len, m, KIND_FILE, 0, 31, 0);
        check_reply(&rep, HM_SUCCESS, "MAP_SYNC asked by the exporter (ignored)", m);
        craft_restore(&c);
    }
    if (!pidfd_ok) printf("pidfd_getfd is not available here: the channel alone was tried\n");

    /* The genuine bytes are back: the exporter's put takes them. */
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
    close(ro);
    close(zero);
    CHECK(file_is(secret, 1 << 20, 'S') && file_is(other, 1 << 20, 'O'));
    unlink(secret);
    unlink(other);
}

/* The importer as root and as a second user: the genuine handle opens (by
 * pidfd_getfd where the kernel lets that user take the descriptor, else a
 * clean HM_ERROR_PERMISSION; always by the channel). */
static void test_hostile_importer(void) {
    char path[128];
    snprintf(path, sizeof(path), "%s/exporter2", dir);
    hm_pool_t *pool = exporter_file_pool(path);
    unsigned char *p = hm_pool_malloc(pool, SIZE);
    REQUIRE(p);
    memset(p, 0, 4096);
    hm_test_fill(p + 4096, SIZE - 4096, 47);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    for (int user = 0; user <= 1; user++) {
        if (user && !is_root) {
            printf("SKIP (part): the importer as a second user needs root\n");
            break;
        }
        const char *who = user ? "second user" : "same user";
        if (pidfd_ok) {
            p[0] = 0;
            reply_t rep = import(h, len, MODE_PIDFD, KIND_FILE, user, 47, 1);
            if (user && rep.res.r == HM_ERROR_PERMISSION) {
                check_reply(&rep, HM_ERROR_PERMISSION, who, MODE_PIDFD);
                printf("%s: pidfd_getfd refused (HM_ERROR_PERMISSION), as expected\n", who);
            } else {
                check_reply(&rep, HM_SUCCESS, who, MODE_PIDFD);
                CHECK_MSG(rep.res.data_ok && p[0] == 0x5a, "%s (pidfd): data", who);
            }
        }
        p[0] = 0;
        reply_t rep = import(h, len, MODE_CHANNEL, KIND_FILE, user, 47, 1);
        check_reply(&rep, HM_SUCCESS, who, MODE_CHANNEL);
        CHECK_MSG(rep.res.data_ok && p[0] == 0x5a, "%s (channel): data", who);
        /* A forged dev/ino also fails as that user (the descriptor binds). */
        struct stat st;
        REQUIRE(stat("/etc/passwd", &st) == 0);
        craft_t c;
        craft_begin(&c, h, len);
        c.p.dev = (uint64_t)st.st_dev;
        c.p.ino = (uint64_t)st.st_ino;
        craft_apply(&c);
        rep = import(h, len, MODE_CHANNEL, KIND_FILE, user, 0, 1);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, user ? "second user, forged dev/ino"
                                                        : "same user, forged dev/ino",
                    MODE_CHANNEL);
        craft_restore(&c);
    }
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
}

/* The provider's own file. */
static void test_own_file(void) {
    char path[128], target[128];
    snprintf(path, sizeof(path), "%s/own", dir);
    snprintf(target, sizeof(target), "%s/own-target", dir);
    hm_provider_t *prov = NULL;
    /* A symbolic link at the path (to a file of ours, and dangling). */
    make_file(target, 4096, 'T', 0600);
    REQUIRE(symlink(target, path) == 0);
    CHECK_RES(hm_file_provider_create(path, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK(file_is(target, 4096, 'T'));
    unlink(target);
    CHECK_RES(hm_file_provider_create(path, &prov), HM_ERROR_INVALID_ARGUMENT);
    CHECK(access(target, F_OK) != 0); /* not created through the link */
    unlink(path);
    /* A file of ours, 0666: refused unless allowed. */
    make_file(path, 64 * KIB, 'F', 0666);
    CHECK_RES(hm_file_provider_create(path, &prov), HM_ERROR_PERMISSION);
    hm_file_params_t *fp;
    REQUIRE_OK(hm_file_params_create(path, &fp));
    CHECK_OK(hm_file_params_set_foreign_file(fp, true));
    CHECK_OK(hm_provider_create(hm_file_provider_ops(), fp, &prov));
    if (prov) CHECK_OK(hm_provider_destroy(prov));
    hm_file_params_destroy(fp);
    /* Another uid's file, 0600. */
    if (!is_root) {
        printf("SKIP (part): a file of another uid needs root to make\n");
    } else {
        REQUIRE(chmod(path, 0600) == 0 && chown(path, OTHER_UID, OTHER_UID) == 0);
        CHECK_RES(hm_file_provider_create(path, &prov), HM_ERROR_PERMISSION);
        REQUIRE_OK(hm_file_params_create(path, &fp));
        CHECK_OK(hm_file_params_set_foreign_file(fp, true));
        CHECK_OK(hm_provider_create(hm_file_provider_ops(), fp, &prov));
        if (prov) CHECK_OK(hm_provider_destroy(prov));
        hm_file_params_destroy(fp);
    }
    CHECK(file_is(path, 64 * KIB, 'F')); /* refused: untouched */
    unlink(path);
}

/* devdax, on the device HM_TEST_DEVDAX_PATH names. */
static void test_devdax(void) {
    if (!devdax_path) {
        printf("SKIP (part): devdax cases need HM_TEST_DEVDAX_PATH (a device DAX, "
               "overwritten)\n");
        return;
    }
    char link[128];
    snprintf(link, sizeof(link), "%s/dax-link", dir);
    REQUIRE(symlink(devdax_path, link) == 0);
    hm_provider_t *prov = NULL;
    CHECK_RES(hm_devdax_provider_create(link, &prov), HM_ERROR_INVALID_ARGUMENT);
    unlink(link);
    REQUIRE_OK(hm_devdax_provider_create(devdax_path, &prov));
    hm_pool_t *pool;
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    unsigned char *p = hm_pool_malloc(pool, SIZE);
    REQUIRE(p);
    memset(p, 0, 4096);
    hm_test_fill(p + 4096, SIZE - 4096, 53);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(p, &h, &len));
    struct stat dst, zst;
    REQUIRE(stat(devdax_path, &dst) == 0 && stat("/dev/zero", &zst) == 0);
    int zero = open("/dev/zero", O_RDWR | O_CLOEXEC);
    REQUIRE(zero >= 0);
    craft_t c;
    FOR_MODES(m) {
        p[0] = 0;
        reply_t rep = import(h, len, m, KIND_DEVDAX, 0, 53, 1);
        check_reply(&rep, HM_SUCCESS, "devdax genuine", m);
        CHECK_MSG(rep.res.data_ok && p[0] == 0x5a, "devdax genuine (%s): data", mode_name(m));
        /* Another character device, named by its rdev. */
        craft_begin(&c, h, len);
        c.w.fd = zero;
        c.p.dev = (uint64_t)zst.st_rdev;
        craft_apply(&c);
        rep = import(h, len, m, KIND_DEVDAX, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "devdax: /dev/zero's rdev", m);
        craft_restore(&c);
        /* /dev/zero's descriptor with the device's rdev. */
        craft_begin(&c, h, len);
        c.w.fd = zero;
        craft_apply(&c);
        rep = import(h, len, m, KIND_DEVDAX, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "devdax: /dev/zero's descriptor", m);
        craft_restore(&c);
        /* Beyond the device. */
        craft_begin(&c, h, len);
        c.p.offset = (uint64_t)1 << 50;
        craft_apply(&c);
        rep = import(h, len, m, KIND_DEVDAX, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "devdax: offset beyond the device", m);
        craft_restore(&c);
        /* An inode or unknown flags. */
        craft_begin(&c, h, len);
        c.p.ino = (uint64_t)dst.st_ino;
        craft_apply(&c);
        rep = import(h, len, m, KIND_DEVDAX, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "devdax: an inode", m);
        craft_restore(&c);
        craft_begin(&c, h, len);
        c.p.flags |= 0x4;
        craft_apply(&c);
        rep = import(h, len, m, KIND_DEVDAX, 0, 0, 0);
        check_reply(&rep, HM_ERROR_INVALID_HANDLE, "devdax: unknown flags", m);
        craft_restore(&c);
    }
    close(zero);
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
}

int main(void) {
    /* Before any hetmem call: the importers' server. */
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    fflush(stdout);
    pid_t srv = fork();
    REQUIRE(srv >= 0);
    if (srv == 0) {
        close(sv[0]);
        server(sv[1]);
        _exit(0);
    }
    close(sv[1]);
    is_root = geteuid() == 0;
    pidfd_ok = pidfd_getfd_works();
    const char *d = getenv("HM_TEST_DEVDAX_PATH");
    devdax_path = d && *d ? d : NULL;
    snprintf(dir, sizeof(dir), "/tmp/hm-fhostile-XXXXXX");
    REQUIRE(mkdtemp(dir));
    snprintf(user_dir, sizeof(user_dir), "/tmp/hm-fhostile-user-XXXXXX");
    REQUIRE(mkdtemp(user_dir));
    if (is_root) REQUIRE(chown(user_dir, OTHER_UID, OTHER_UID) == 0);
    REQUIRE_OK(hm_ipc_channel_from_fd(sv[0], &ch));

    HM_TEST_PHASE(test_hostile_exporter());
    HM_TEST_PHASE(test_hostile_importer());
    HM_TEST_PHASE(test_own_file());
    HM_TEST_PHASE(test_devdax());

    cmd_t bye;
    memset(&bye, 0, sizeof(bye));
    CHECK_OK(hm_ipc_channel_send_bytes(ch, &bye, sizeof(bye)));
    int st = 0;
    CHECK(waitpid(srv, &st, 0) == srv && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    hm_ipc_channel_destroy(ch);
    rmdir(dir);
    rmdir(user_dir);
    return hm_test_finish();
}
