/* hetmem tests — the descriptors providers keep (the OS provider's memfd in
 * shared mode, the file provider's file) against programs that use
 * descriptors by number. Such a descriptor is out of the way (at or above
 * 256, close-on-exec); when the program closes it or puts a file of its own
 * at its number (dup2, or closing everything and opening a file), the
 * provider refuses what would use it (HM_ERROR_DRIVER, native error EBADF,
 * one log line): the program's file is never resized, mapped, punched or
 * closed, and memory allocated before stays usable and can be freed. A child
 * started with descriptors passed by number (fork, dup2, exec) sees exactly
 * those, also when it makes a shared-mode provider of its own, as a program
 * under HM_PROXY=shared does (Python's test_subprocess
 * test_pass_fds_redirected).
 * Usage: test_provider_fds             the tests
 *        test_provider_fds list-fds    (the exec'd child) make a shared-mode
 *                                      provider, print the open descriptors
 *                                      below 256, as Python's fd_status.py
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static char g_dir[256];
static const char *g_self;

/* ---- the program's own file: a pattern that any write, resize or hole
 * punch would change ---- */

#define USER_SIZE (64 * KIB + 20)

static unsigned char user_byte(size_t i) { return (unsigned char)(i * 31 + 7); }

static void user_file_make(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    static unsigned char buf[USER_SIZE];
    for (size_t i = 0; i < USER_SIZE; i++) buf[i] = user_byte(i);
    REQUIRE(write(fd, buf, USER_SIZE) == (ssize_t)USER_SIZE);
    close(fd);
}

static int user_file_intact(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size != (off_t)USER_SIZE) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    static unsigned char buf[USER_SIZE + 1];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n != (ssize_t)USER_SIZE) return 0;
    for (size_t i = 0; i < USER_SIZE; i++)
        if (buf[i] != user_byte(i)) return 0;
    return 1;
}

/* ---- descriptors ---- */

/* The descriptor other than `except` whose /proc/self/fd link contains
 * `target`, or -1. */
static int fd_of_except(const char *target, int except) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char link[300], to[512];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, to, sizeof to - 1);
        if (n <= 0) continue;
        to[n] = 0;
        int fd = atoi(e->d_name);
        if (strstr(to, target) && fd != dirfd(d) && fd != except) found = fd;
    }
    closedir(d);
    return found;
}
static int fd_of(const char *target) { return fd_of_except(target, -1); }

static int is_cloexec(int fd) {
    int f = fcntl(fd, F_GETFD);
    return f >= 0 && (f & FD_CLOEXEC);
}

static int same_file(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* ---- log lines ---- */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refusals;

/* Every refusal logs a line: the first of a descriptor at error level, the
 * later ones at debug level (so the sink listens at debug level). */
static void sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    (void)level;
    if (!strstr(line, "closed or replaced")) return;
    pthread_mutex_lock(&g_log_lock);
    g_refusals++;
    pthread_mutex_unlock(&g_log_lock);
}

static int refusals(void) {
    pthread_mutex_lock(&g_log_lock);
    int n = g_refusals;
    g_refusals = 0;
    pthread_mutex_unlock(&g_log_lock);
    return n;
}

/* A refusal: HM_ERROR_DRIVER, EBADF, and its log line. */
#define CHECK_REFUSED(expr)                                                                 \
    do {                                                                                    \
        (void)refusals();                                                                   \
        CHECK_RES((expr), HM_ERROR_DRIVER);                                                 \
        CHECK_EQ(hm_last_native_error(NULL), EBADF);                                        \
        CHECK_MSG(refusals() >= 1, "%s: no log line", #expr);                               \
    } while (0)

/* ---- the OS provider in shared mode ---- */

/* max_memfds 0: the default bound. */
static hm_provider_t *shared_os_max(const char *name, size_t max_memfds) {
    hm_os_params_t *p;
    REQUIRE_OK(hm_os_params_create(&p));
    REQUIRE_OK(hm_os_params_set_visibility(p, HM_OS_SHARED));
    REQUIRE_OK(hm_os_params_set_shm_name(p, name));
    REQUIRE_OK(hm_os_params_set_max_memfds(p, max_memfds));
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_provider_create(p, &prov));
    hm_os_params_destroy(p);
    return prov;
}
static hm_provider_t *shared_os(const char *name) { return shared_os_max(name, 0); }

static void fill(void *p, size_t n, int v) { memset(p, v, n); }
static int filled(const void *p, size_t n, int v) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)v) return 0;
    return 1;
}

/* Untouched: high, close-on-exec, working. */
static void test_os_untouched(void) {
    hm_test_set_context("os shared, descriptor untouched");
    hm_provider_t *prov = shared_os("hm-fds-untouched");
    CHECK_EQ(fd_of("memfd:hm-fds-untouched"), -1); /* one per allocation */
    void *first;
    REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &first));
    int fd = fd_of("memfd:hm-fds-untouched");
    CHECK_MSG(fd >= 256, "the memfd is descriptor %d", fd);
    CHECK(fd < 0 || is_cloexec(fd));
    /* A program's open gets the lowest number, not near the memfd's. */
    int mine = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK(mine >= 0 && mine < 256);
    close(mine);
    void *p[64];
    for (int i = 0; i < 64; i++) {
        REQUIRE_OK(hm_provider_alloc(prov, (size_t)(i + 1) * 64 * KIB, 0, &p[i]));
        fill(p[i], (size_t)(i + 1) * 64 * KIB, i);
    }
    for (int i = 0; i < 64; i += 2)
        CHECK_OK(hm_provider_free(prov, p[i], (size_t)(i + 1) * 64 * KIB));
    for (int i = 1; i < 64; i += 2) {
        CHECK(filled(p[i], (size_t)(i + 1) * 64 * KIB, i));
        CHECK_OK(hm_provider_free(prov, p[i], (size_t)(i + 1) * 64 * KIB));
    }
    CHECK(fd < 0 || is_cloexec(fd)); /* first's: still open */
    CHECK_OK(hm_provider_free(prov, first, 64 * KIB));
    CHECK(fd < 0 || (fcntl(fd, F_GETFD) < 0 && errno == EBADF)); /* closed by its free */
    CHECK_EQ(fd_of("memfd:hm-fds-untouched"), -1);
    CHECK_OK(hm_provider_destroy(prov));
}

/* The program puts its own file at the memfd's number (dup2), as after
 * closing its descriptors and opening a file. */
static void test_os_replaced(void) {
    hm_test_set_context("os shared, descriptor replaced");
    char path[320];
    snprintf(path, sizeof path, "%s/user-os", g_dir);
    user_file_make(path);
    char path2[320];
    snprintf(path2, sizeof path2, "%s/user-os2", g_dir);
    user_file_make(path2);
    /* One allocation with a memfd of its own (own), the rest in the spill. */
    hm_provider_t *prov = shared_os_max("hm-fds-replaced", 1);
    void *own, *live, *gone, *exported;
    REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &own));
    fill(own, 64 * KIB, 0x44);
    int own_fd = fd_of("memfd:hm-fds-replaced");
    REQUIRE(own_fd >= 0);
    hm_pool_t *pool;
    REQUIRE_OK(hm_native_pool_create(prov, NULL, 0, &pool));
    REQUIRE_OK(hm_provider_alloc(prov, 256 * KIB, 0, &live));
    int fd = fd_of_except("memfd:hm-fds-replaced", own_fd);
    REQUIRE(fd >= 0);
    REQUIRE_OK(hm_provider_alloc(prov, 128 * KIB, 0, &gone));
    REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &exported));
    fill(live, 256 * KIB, 0x11);
    CHECK_OK(hm_provider_free(prov, gone, 128 * KIB)); /* a free extent to reuse */
    void *small[100];
    for (int i = 0; i < 100; i++) {
        small[i] = hm_pool_malloc(pool, 100);
        REQUIRE(small[i]);
        fill(small[i], 100, i);
    }

    int user = open(path, O_RDWR | O_CLOEXEC);
    REQUIRE(user >= 0);
    REQUIRE(dup2(user, fd) == fd);
    close(user);
    user = open(path2, O_RDWR | O_CLOEXEC);
    REQUIRE(user >= 0);
    REQUIRE(dup2(user, own_fd) == own_fd);
    close(user);

    void *p = NULL;
    CHECK_REFUSED(hm_provider_alloc(prov, 16 * MIB, 0, &p)); /* would grow the memfd */
    CHECK(p == NULL);
    CHECK_REFUSED(hm_provider_alloc(prov, 64 * KIB, 0, &p)); /* would map a free extent */
    CHECK(p == NULL);
    /* The export would hand the program's file to an importer. */
    const hm_provider_ops_t *ops = hm_provider_get_ops(prov);
    unsigned char payload[256];
    REQUIRE(ops->ipc.handle_size(hm_provider_get_state(prov)) <= sizeof payload);
    int xfd = 7;
    CHECK_REFUSED(ops->ipc.get(hm_provider_get_state(prov), exported, 64 * KIB, payload, &xfd));
    CHECK_EQ(xfd, -1);
    xfd = 7;
    CHECK_REFUSED(ops->ipc.get(hm_provider_get_state(prov), own, 64 * KIB, payload, &xfd));
    CHECK_EQ(xfd, -1);
    CHECK(filled(own, 64 * KIB, 0x44));
    /* Through a pool: no block where the provider is needed (the driver
     * error as EIO), no crash. */
    errno = 0;
    void *big = hm_pool_malloc(pool, 8 * MIB);
    CHECK_MSG(big == NULL && errno == EIO, "hm_pool_malloc: %p, errno %d", big, errno);
    /* Memory from before is the memfd's and stays usable. */
    for (int i = 0; i < 100; i++) {
        CHECK(filled(small[i], 100, i));
        CHECK_OK(hm_pool_free(pool, small[i]));
    }
    CHECK(filled(live, 256 * KIB, 0x11));
    fill(live, 256 * KIB, 0x22);
    CHECK(filled(live, 256 * KIB, 0x22));
    CHECK_OK(hm_provider_free(prov, own, 64 * KIB)); /* unmaps; the close is refused */
    /* Frees unmap; the hole punch and the shrink are refused. */
    CHECK_OK(hm_provider_free(prov, live, 256 * KIB));
    CHECK_OK(hm_provider_free(prov, exported, 64 * KIB));
    CHECK_OK(hm_pool_destroy(pool));
    CHECK_OK(hm_provider_destroy(prov));
    /* The program's descriptor is still open and still its file. */
    CHECK(same_file(fd, path));
    CHECK(user_file_intact(path));
    CHECK(same_file(own_fd, path2));
    close(fd);
    close(own_fd);
    CHECK_MSG(user_file_intact(path), "the program's file was changed");
    CHECK_MSG(user_file_intact(path2), "the program's file was changed");
    unlink(path);
    unlink(path2);
}

/* The program closes every descriptor it does not know (here: above 2),
 * then opens files. */
static void test_os_closed(void) {
    hm_test_set_context("os shared, descriptors closed");
    char path[320];
    snprintf(path, sizeof path, "%s/user-closed", g_dir);
    user_file_make(path);
    /* In a child: closing everything would take the test's own descriptors. */
    int failed_before = hm_test_failed_count();
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        /* One memfd of its own (own), then the spill (live). */
        hm_provider_t *prov = shared_os_max("hm-fds-closed", 1);
        void *own, *live;
        REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &own));
        int own_fd = fd_of("memfd:hm-fds-closed");
        REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &live));
        int fd = fd_of_except("memfd:hm-fds-closed", own_fd);
        fill(live, 64 * KIB, 0x33);
        fill(own, 64 * KIB, 0x55);
        for (int i = 3; i < 1024; i++) close(i);
        void *p = NULL;
        CHECK_REFUSED(hm_provider_alloc(prov, 4 * MIB, 0, &p));
        /* The allocation's own memfd is gone from the table: its free only
         * unmaps, and a new allocation gets a memfd of its own again. */
        CHECK(filled(own, 64 * KIB, 0x55));
        CHECK_OK(hm_provider_free(prov, own, 64 * KIB));
        REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &own));
        fill(own, 64 * KIB, 0x66);
        CHECK(filled(own, 64 * KIB, 0x66));
        /* The program's files take the low numbers, and one lands on the
         * memfd's. */
        int user = open(path, O_RDWR);
        REQUIRE(user >= 0);
        if (fd >= 0) REQUIRE(dup2(user, fd) == fd);
        CHECK_REFUSED(hm_provider_alloc(prov, 4 * MIB, 0, &p));
        CHECK(filled(live, 64 * KIB, 0x33));
        CHECK_OK(hm_provider_free(prov, live, 64 * KIB));
        CHECK_OK(hm_provider_free(prov, own, 64 * KIB));
        CHECK_OK(hm_provider_destroy(prov));
        CHECK(fd < 0 || same_file(fd, path));
        CHECK(same_file(user, path));
        exit(hm_test_failed_count() > failed_before);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %#x", status);
    CHECK_MSG(user_file_intact(path), "the program's file was changed");
    unlink(path);
}

/* ---- descriptors passed to a child by number ---- */

/* The exec'd child: as a program under HM_PROXY=shared, it has a
 * shared-mode provider before it looks. */
static int list_fds(void) {
    hm_provider_t *prov = shared_os("hm-fds-child");
    void *p;
    if (hm_provider_alloc(prov, 64 * KIB, 0, &p) != HM_SUCCESS) return 3;
    char out[1024];
    size_t len = 0;
    for (int fd = 0; fd < 256; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0) continue;
        len += (size_t)snprintf(out + len, sizeof out - len, "%s%d", len ? "," : "", fd);
    }
    len += (size_t)snprintf(out + len, sizeof out - len, "\n");
    if (write(1, out, len) != (ssize_t)len) return 4;
    hm_provider_free(prov, p, 64 * KIB);
    hm_provider_destroy(prov);
    return 0;
}

/* As Python's test_pass_fds_redirected: stdin, stdout and stderr redirected
 * to three descriptors that are also passed by number; the child must see
 * exactly 0, 1, 2 and those three. The parent has a shared-mode provider
 * too. */
static void test_pass_fds(void) {
    hm_test_set_context("descriptors passed to a child");
    hm_provider_t *prov = shared_os("hm-fds-parent");
    void *p;
    REQUIRE_OK(hm_provider_alloc(prov, 64 * KIB, 0, &p));
    int pass[3];
    int pipefd[2];
    pass[0] = open("/dev/null", O_RDWR | O_CLOEXEC);
    REQUIRE(pipe2(pipefd, O_CLOEXEC) == 0);
    pass[1] = pipefd[1];
    pass[2] = open("/dev/null", O_RDWR | O_CLOEXEC);
    REQUIRE(pass[0] >= 0 && pass[2] >= 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        /* _posixsubprocess with close_fds: the passed ones lose
         * close-on-exec, every other one above 2 is closed, 0-2 are dup2'ed
         * from them. */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != pass[0] && fd != pass[1] && fd != pass[2]) close(fd);
        for (int i = 0; i < 3; i++) fcntl(pass[i], F_SETFD, 0);
        dup2(pass[0], 0);
        dup2(pass[1], 1);
        dup2(pass[2], 2);
        execl(g_self, g_self, "list-fds", (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char buf[1024];
    (void)hm_test_read_all(pipefd[0], buf, sizeof buf);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %#x", status);
    /* Expected: 0,1,2 and the passed ones, in order. */
    int want[6] = {0, 1, 2, pass[0], pass[1], pass[2]};
    for (int i = 3; i < 6; i++)
        for (int j = i; j > 0 && want[j] < want[j - 1]; j--) {
            int t = want[j];
            want[j] = want[j - 1];
            want[j - 1] = t;
        }
    char expect[128];
    size_t el = 0;
    for (int i = 0; i < 6; i++)
        if (i == 0 || want[i] != want[i - 1])
            el += (size_t)snprintf(expect + el, sizeof expect - el, "%s%d", el ? "," : "",
                                   want[i]);
    snprintf(expect + el, sizeof expect - el, "\n");
    CHECK_MSG(strcmp(buf, expect) == 0, "the child sees %s, expected %s", buf, expect);
    close(pass[0]);
    close(pass[2]);
    CHECK_OK(hm_provider_free(prov, p, 64 * KIB));
    CHECK_OK(hm_provider_destroy(prov));
}

/* ---- the file provider ---- */

static void test_file(void) {
    hm_test_set_context("file provider");
    char heap[320], path[320];
    snprintf(heap, sizeof heap, "%s/heap-file", g_dir);
    snprintf(path, sizeof path, "%s/user-file", g_dir);
    user_file_make(path);
    hm_file_params_t *fp;
    REQUIRE_OK(hm_file_params_create(heap, &fp));
    REQUIRE_OK(hm_file_params_set_keep_file(fp, false));
    REQUIRE_OK(hm_file_params_set_grow_size(fp, 1 * MIB));
    hm_provider_t *prov;
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &prov));
    hm_file_params_destroy(fp);
    int fd = fd_of(heap);
    CHECK_MSG(fd >= 256, "the file is descriptor %d", fd);
    REQUIRE(fd >= 0);
    CHECK(is_cloexec(fd));
    void *live;
    REQUIRE_OK(hm_provider_alloc(prov, 256 * KIB, 0, &live));
    fill(live, 256 * KIB, 0x44);

    int user = open(path, O_RDWR | O_CLOEXEC);
    REQUIRE(user >= 0);
    REQUIRE(dup2(user, fd) == fd);
    close(user);
    void *p = NULL;
    CHECK_REFUSED(hm_provider_alloc(prov, 8 * MIB, 0, &p)); /* would grow the file */
    CHECK(p == NULL);
    CHECK_REFUSED(hm_provider_purge_force(prov, live, 256 * KIB)); /* would punch a hole */
    CHECK(filled(live, 256 * KIB, 0x44));
    CHECK_OK(hm_provider_free(prov, live, 256 * KIB));
    CHECK_OK(hm_provider_destroy(prov));
    CHECK(same_file(fd, path));
    close(fd);
    CHECK_MSG(user_file_intact(path), "the program's file was changed");
    unlink(path);

    /* Closed: refused too, and destroy closes nothing of the program's. */
    REQUIRE_OK(hm_file_params_create(heap, &fp));
    REQUIRE_OK(hm_file_params_set_keep_file(fp, false));
    REQUIRE_OK(hm_provider_create(hm_file_provider_ops(), fp, &prov));
    hm_file_params_destroy(fp);
    fd = fd_of(heap);
    REQUIRE(fd >= 0);
    close(fd);
    CHECK_REFUSED(hm_provider_alloc(prov, 8 * MIB, 0, &p));
    int later = open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(later >= 0 && dup2(later, fd) == fd);
    CHECK_OK(hm_provider_destroy(prov));
    CHECK(fcntl(fd, F_GETFD) >= 0 && same_file(fd, "/dev/null"));
    close(fd);
    close(later);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "list-fds")) return list_fds();
    g_self = argv[0];
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/hm-fds-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(g_dir));
    hm_log_set_sink(sink, NULL);
    hm_log_set_level(HM_LOG_DEBUG);
    test_os_untouched();
    test_os_replaced();
    test_os_closed();
    test_pass_fds();
    test_file();
    hm_log_set_sink(NULL, NULL);
    CHECK_MSG(rmdir(g_dir) == 0, "files left behind in %s", g_dir);
    return hm_test_finish();
}
