/* hetmem tests — the log in hostile hands: HM_LOG's file is never reached
 * through a symlink, never another user's file, a FIFO or a device, is
 * created 0600 under any umask; a logged value cannot inject a line
 * (control bytes are written \xNN, to the sink and to the file); a
 * set-user-ID-like program (AT_SECURE) ignores HM_LOG.
 * SPDX-License-Identifier: MIT
 *
 * HM_LOG is read once, at the library's set-up, so each case runs this
 * program again (/proc/self/exe, "child" mode) with HM_LOG set and its
 * stderr in a file. The AT_SECURE case, as root, runs a set-group-ID copy
 * of this program (group 54321) from the build folder: the kernel then sets
 * AT_SECURE (egid != gid) and glibc's secure_getenv returns NULL; without
 * root, or on a nosuid mount, that case is skipped with a message. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A logged value that tries to inject a line of its own and a terminal
 * escape: hm_ipc_channel_connect logs the path it could not reach. */
#define NASTY "/nonexistent-hm-log/a\nhetmem ERROR forged.c:1: injected\x1b[31mred"

static char self[4096];
static char dir[] = "/tmp/hm-log-hardening-XXXXXX";

/* ---- child mode: set up the library (HM_LOG is read then), log lines ---- */

static int child(int secure) {
    if (secure && getauxval(AT_SECURE) != 1) return 3; /* not a secure exec after all */
    hm_provider_t *os;
    if (hm_os_provider_create(NULL, &os) != HM_SUCCESS) return 2;
    hm_ipc_channel_t *c = NULL;
    hm_result_t r = hm_ipc_channel_connect(NASTY, &c);
    (void)hm_provider_destroy(os);
    return r == HM_ERROR_NOT_FOUND ? 0 : 4;
}

/* ---- parent ---- */

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

/* Run `exe` child-mode with HM_LOG=value (NULL: unset), stderr to errfile;
 * returns its exit status, or -1 when it hung (killed after 20 s). */
static int run_child(const char *exe, const char *mode, const char *value, const char *errfile) {
    pid_t pid = fork();
    if (pid < 0) return -2;
    if (pid == 0) {
        int fd = open(errfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0) _exit(100);
        if (value) setenv("HM_LOG", value, 1);
        else unsetenv("HM_LOG");
        execl(exe, exe, mode, (char *)NULL);
        _exit(101);
    }
    for (int i = 0; i < HM_TEST_HANG_SECONDS * 100; i++) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static size_t read_all(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return (size_t)-1;
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)k;
    buf[n] = 0;
    close(fd);
    return n;
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
}

/* Every line of a log text starts with "hetmem " and holds no control byte;
 * the forged line is there, escaped, inside one of them. */
static void check_log_text(const char *what, const char *text) {
    CHECK_MSG(strstr(text, "\\x0ahetmem ERROR forged.c:1: injected\\x1b[31mred") != NULL,
              "%s: the logged path appears escaped on its line:\n%s", what, text);
    int lines = 0;
    for (const char *l = text; *l; lines++) {
        const char *nl = strchr(l, '\n');
        CHECK_MSG(nl != NULL, "%s: the last line ends with a newline", what);
        if (!nl) break;
        CHECK_MSG(strncmp(l, "hetmem ", 7) == 0, "%s: line %d starts with \"hetmem \": %.*s",
                  what, lines + 1, (int)(nl - l), l);
        for (const char *p = l; p < nl; p++)
            CHECK_MSG((unsigned char)*p >= 0x20 && *p != 0x7f,
                      "%s: line %d holds control byte 0x%02x", what, lines + 1,
                      (unsigned char)*p);
        l = nl + 1;
    }
    CHECK_MSG(lines > 0, "%s: lines were logged", what);
}

/* A fresh HM_LOG file, under umask 0: mode 0600, lines escaped. */
static void test_fresh_file(void) {
    char log[256], err[256], text[16384];
    path_in(log, sizeof(log), "fresh.log");
    path_in(err, sizeof(err), "fresh.err");
    char value[300];
    snprintf(value, sizeof(value), "debug,%s", log);
    mode_t old = umask(0);
    int rc = run_child(self, "child", value, err);
    umask(old);
    CHECK_EQ(rc, 0);
    struct stat st;
    REQUIRE(lstat(log, &st) == 0);
    CHECK_MSG((st.st_mode & 07777) == 0600, "fresh log file mode 0%o, expected 0600",
              (unsigned)(st.st_mode & 07777));
    CHECK(S_ISREG(st.st_mode));
    REQUIRE(read_all(log, text, sizeof(text)) != (size_t)-1);
    check_log_text("HM_LOG file", text);
    /* Appended to, never truncated: a second run adds its lines. */
    size_t first = strlen(text);
    CHECK_EQ(run_child(self, "child", value, err), 0);
    CHECK(read_all(log, text, sizeof(text)) > first);
    /* Without a file, stderr gets the same escaped lines. */
    CHECK_EQ(run_child(self, "child", "debug", err), 0);
    REQUIRE(read_all(err, text, sizeof(text)) != (size_t)-1);
    check_log_text("stderr", text);
}

/* HM_LOG's path is refused; `target` (if any) must be unchanged and `made`
 * (if any) must not exist; the child's stderr says why. */
static void expect_refused(const char *what, const char *logpath, const char *target,
                           const char *made) {
    char err[256], value[300], before[256] = "", after[256] = "", text[16384];
    path_in(err, sizeof(err), "refused.err");
    snprintf(value, sizeof(value), "debug,%s", logpath);
    if (target) REQUIRE(read_all(target, before, sizeof(before)) != (size_t)-1);
    int rc = run_child(self, "child", value, err);
    CHECK_MSG(rc == 0, "%s: the child ran (status %d; -1: hung on open)", what, rc);
    if (target) {
        CHECK(read_all(target, after, sizeof(after)) != (size_t)-1);
        CHECK_MSG(strcmp(before, after) == 0, "%s: %s unchanged (now '%s')", what, target,
                  after);
    }
    if (made) CHECK_MSG(access(made, F_OK) != 0, "%s: %s was not created", what, made);
    CHECK(read_all(err, text, sizeof(text)) != (size_t)-1);
    CHECK_MSG(strstr(text, "HM_LOG: not logging to") != NULL,
              "%s: stderr says the file was refused:\n%s", what, text);
    check_log_text(what, text);
}

static void test_refused_files(void) {
    char target[256], link[256], dangling[256], made[256];
    path_in(target, sizeof(target), "target");
    path_in(link, sizeof(link), "link.log");
    path_in(dangling, sizeof(dangling), "dangling.log");
    path_in(made, sizeof(made), "made-through-link");
    write_file(target, "original\n");
    REQUIRE(symlink(target, link) == 0);
    REQUIRE(symlink(made, dangling) == 0);
    expect_refused("symlink to a file", link, target, NULL);
    expect_refused("dangling symlink", dangling, NULL, made);

    char fifo[256];
    path_in(fifo, sizeof(fifo), "fifo.log");
    REQUIRE(mkfifo(fifo, 0600) == 0);
    expect_refused("FIFO without reader", fifo, NULL, NULL);

    if (geteuid() != 0) {
        printf("SKIP part: a log file owned by another user (needs root to chown)\n");
        return;
    }
    char other[256];
    path_in(other, sizeof(other), "other-user.log");
    write_file(other, "another user's\n");
    REQUIRE(chown(other, 54321, 54321) == 0);
    expect_refused("another user's file", other, other, NULL);
}

/* The sink gets the escaped text, without newline; a long value is cut
 * whole escapes at a time within the fixed buffer. */
static char sink_line[4096];
static _Atomic int sink_calls;
static void sink(hm_log_level_t level, const char *line, void *arg) {
    (void)level;
    (void)arg;
    atomic_fetch_add(&sink_calls, 1);
    snprintf(sink_line, sizeof(sink_line), "%s", line);
}

static void test_sink(void) {
    hm_log_level_t old = hm_log_get_level();
    hm_log_set_sink(sink, NULL);
    hm_log_set_level(HM_LOG_INFO);
    hm_ipc_channel_t *c = NULL;
    /* make_addr logs the too-long path at error level, connect's ENOENT at info. */
    CHECK_RES(hm_ipc_channel_connect(NASTY, &c), HM_ERROR_NOT_FOUND);
    CHECK(atomic_load(&sink_calls) > 0);
    char text[4200];
    snprintf(text, sizeof(text), "%s\n", sink_line);
    check_log_text("sink", text);
    CHECK(strchr(sink_line, '\n') == NULL);

    char longv[300];
    memset(longv, '\n', sizeof(longv) - 1);
    longv[sizeof(longv) - 1] = 0;
    atomic_store(&sink_calls, 0);
    CHECK_RES(hm_ipc_channel_connect(longv, &c), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(atomic_load(&sink_calls), 1);
    size_t len = strlen(sink_line);
    CHECK_MSG(len > 200 && len < 1024, "truncated line: %zu bytes", len);
    const char *esc = strstr(sink_line, "\\x0a");
    REQUIRE(esc != NULL);
    CHECK_MSG((len - (size_t)(esc - sink_line)) % 4 == 0,
              "the line ends with whole escapes: ...%s", sink_line + len - 6);
    for (size_t i = 0; i < len; i++) CHECK((unsigned char)sink_line[i] >= 0x20);
    hm_log_set_sink(NULL, NULL);
    hm_log_set_level(old);
}

/* A set-group-ID copy of this program (AT_SECURE) ignores HM_LOG. */
static void test_secure_exec(void) {
    if (geteuid() != 0) {
        printf("SKIP part: AT_SECURE (needs root to make a set-group-ID copy)\n");
        return;
    }
    char copy[4200];
    snprintf(copy, sizeof(copy), "%s.sgid", self);
    int in = open(self, O_RDONLY | O_CLOEXEC);
    int out = open(copy, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    REQUIRE(in >= 0 && out >= 0);
    char buf[65536];
    ssize_t k;
    while ((k = read(in, buf, sizeof(buf))) > 0) REQUIRE(write(out, buf, (size_t)k) == k);
    close(in);
    close(out);
    REQUIRE(chown(copy, 0, 54321) == 0);
    REQUIRE(chmod(copy, 02755) == 0);
    char log[256], err[256], value[300];
    path_in(log, sizeof(log), "secure.log");
    path_in(err, sizeof(err), "secure.err");
    snprintf(value, sizeof(value), "debug,%s", log);
    int rc = run_child(copy, "child-secure", value, err);
    unlink(copy);
    if (rc == 3) {
        printf("SKIP part: AT_SECURE (the set-group-ID bit had no effect here: nosuid mount?)\n");
        return;
    }
    CHECK_MSG(rc == 0, "secure child status %d", rc);
    CHECK_MSG(access(log, F_OK) != 0, "a set-group-ID program created the HM_LOG file %s",
              log);
    char text[4096];
    CHECK(read_all(err, text, sizeof(text)) != (size_t)-1);
    CHECK_MSG(strstr(text, "hetmem ") == NULL, "a set-group-ID program logged:\n%s", text);
}

static void cleanup(void) {
    static const char *names[] = {"fresh.log", "fresh.err", "refused.err", "target",
                                  "link.log", "dangling.log", "made-through-link", "fifo.log",
                                  "other-user.log", "secure.log", "secure.err"};
    char p[256];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        path_in(p, sizeof(p), names[i]);
        unlink(p);
    }
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "child")) return child(0);
    if (argc > 1 && !strcmp(argv[1], "child-secure")) return child(1);
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) HM_TEST_SKIP("no /proc/self/exe");
    self[n] = 0;
    REQUIRE(mkdtemp(dir) != NULL);
    test_fresh_file();
    test_refused_files();
    test_sink();
    test_secure_exec();
    cleanup();
    return hm_test_finish();
}
