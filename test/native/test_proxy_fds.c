/* hetmem tests — libhetmem_proxy.so with HM_PROXY=shared (the heap in a
 * memfd) under programs that use descriptors by number: the memfd is out
 * of their way (close-on-exec, at or above 256), and a program that closes
 * it or puts its own file at its number keeps its file unchanged and its
 * process alive (allocations that need new heap memory fail, with a log
 * line), never gets that file resized or mapped as heap. Programs: the
 * helper proxy_fds (close everything and open a file; dup2 onto the memfd;
 * descriptors passed to a child by number), bash (`exec 3>log`, `exec
 * 3<>data`) and python3's subprocess pass_fds (test_pass_fds_redirected),
 * where present.
 * Skipped in sanitizer builds (the sanitizers replace malloc themselves).
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256];

/* The program's data file: 20 bytes. */
static const char g_data[] = "0123456789abcdefghij";

static void data_make(const char *path) {
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    REQUIRE(fwrite(g_data, 1, 20, f) == 20);
    fclose(f);
}

/* The whole file, NUL-terminated (NULL if unreadable); *size its size. */
static char *slurp(const char *path, long *size) {
    *size = -1;
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)*size + 1);
    size_t n = buf ? fread(buf, 1, (size_t)*size, f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    return buf;
}

static int data_intact(const char *path) {
    long size;
    char *c = slurp(path, &size);
    int ok = c && size == 20 && !memcmp(c, g_data, 20);
    free(c);
    return ok;
}

/* Run cmd through sh with env in front; capture stdout; *status. */
static char *run(const char *env, const char *cmd, int *status) {
    char full[4096];
    snprintf(full, sizeof full, "%s %s", env, cmd);
    FILE *f = popen(full, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0, n;
    char *out = malloc(cap);
    while (out && (n = fread(out + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 4096) {
            char *o = realloc(out, cap *= 2);
            if (!o) break;
            out = o;
        }
    }
    if (out) out[len] = 0;
    *status = pclose(f);
    return out;
}

#define PRELOAD "LD_PRELOAD=" HM_PROXY_LIB
#define SHARED PRELOAD " HM_PROXY=shared"

/* The same output and a zero status with and without the shared proxy. */
static void same(const char *label, const char *cmd) {
    int s1 = -1, s2 = -1, s3 = -1;
    char *a = run("", cmd, &s1);
    char *b = run(SHARED, cmd, &s2);
    char *c = run(PRELOAD, cmd, &s3);
    CHECK_MSG(a && b && c, "%s: could not run", label);
    if (a && b && c) {
        CHECK_MSG(s1 == 0 && s2 == 0 && s3 == 0,
                  "%s: exit status %#x without the proxy, %#x shared, %#x private", label, s1,
                  s2, s3);
        CHECK_MSG(!strcmp(a, b), "%s: output differs under the shared proxy:\n--- without\n"
                  "%.600s\n--- with\n%.600s", label, a, b);
        CHECK_MSG(!strcmp(a, c), "%s: output differs under the proxy:\n--- without\n"
                  "%.600s\n--- with\n%.600s", label, a, c);
        CHECK_MSG(strlen(a) > 0, "%s: no output", label);
    }
    free(a);
    free(b);
    free(c);
}

/* proxy_fds MODE on a fresh data file, with the shared heap: it survives,
 * the file is unchanged, every allocation after succeeds, and the log (the
 * HM_LOG file, or stderr once the program has closed the log's descriptor
 * too) says nothing but refusals to touch a replaced descriptor. */
static void takes_number(const char *mode) {
    char data[320], log[320], err[320], cmd[1400], env[1024];
    snprintf(data, sizeof data, "%s/data-%s", g_dir, mode);
    snprintf(log, sizeof log, "%s/log-%s", g_dir, mode);
    snprintf(err, sizeof err, "%s/stderr-%s", g_dir, mode);
    data_make(data);
    unlink(log);
    snprintf(env, sizeof env, "%s HM_LOG=error,%s", SHARED, log);
    snprintf(cmd, sizeof cmd, "%s %s %s 2>%s", HM_FDS_PROG, mode, data, err);
    int status = -1;
    char *out = run(env, cmd, &status);
    CHECK_MSG(out && status == 0, "%s, shared heap: status %#x", mode, status);
    CHECK_MSG(out && !strcmp(out, "memfd high, allocations after: all ok\n"),
              "%s, shared heap: output '%s'", mode, out ? out : "(none)");
    CHECK_MSG(data_intact(data), "%s, shared heap: the program's 20-byte file was changed",
              mode);
    /* Each heap range is a memfd of its own: new ranges get new memfds, so
     * the heap keeps growing; a use of a replaced one is refused with a
     * log line (never an error line about anything else). */
    long size;
    char *l = slurp(log, &size), *e = slurp(err, &size);
    int other = (l && strstr(l, "ERROR") && !strstr(l, "closed or replaced")) ||
                (e && strstr(e, "ERROR") && !strstr(e, "closed or replaced"));
    CHECK_MSG(!other, "%s, shared heap: unexpected log lines (log: %.300s; stderr: %.300s)",
              mode, l ? l : "(none)", e ? e : "(none)");
    free(l);
    free(e);
    free(out);
    /* The private heap has no descriptor: nothing changes for the program. */
    data_make(data);
    out = run(PRELOAD, cmd, &status);
    CHECK_MSG(out && status == 0 && !strcmp(out, "memfd none, allocations after: all ok\n"),
              "%s, private heap: status %#x, output '%s'", mode, status, out ? out : "(none)");
    CHECK(data_intact(data));
    free(out);
    unlink(data);
    unlink(log);
    unlink(err);
}

static void bash_redirections(void) {
    char log[320], data[320], script[1400];
    snprintf(log, sizeof log, "%s/bash-log", g_dir);
    snprintf(data, sizeof data, "%s/bash-data", g_dir);
    /* exec 3>log, then a heap-hungry loop, then the log's contents. */
    snprintf(script, sizeof script,
             "bash -c 'exec 3>%s; echo hello >&3; a=(); for i in $(seq 1 30000); do"
             " a+=(\"line $i\"); done; echo ${#a[@]}; exec 3>&-; cat %s; wc -c < %s'",
             log, log, log);
    same("bash exec 3>log", script);
    long size;
    char *c = slurp(log, &size);
    CHECK_MSG(c && size == 6 && !strcmp(c, "hello\n"), "bash exec 3>log: the log is %ld bytes",
              size);
    free(c);
    /* exec 3<>data: a 20-byte file held open on 3 while the heap grows. */
    data_make(data);
    snprintf(script, sizeof script,
             "bash -c 'exec 3<>%s; a=(); for i in $(seq 1 20000); do a+=(\"x$i\"); done;"
             " echo ${#a[@]}; exec 3>&-; cat %s'",
             data, data);
    same("bash exec 3<>data", script);
    CHECK_MSG(data_intact(data), "bash exec 3<>data: the 20-byte file was changed");
    unlink(log);
    unlink(data);
}

/* Python's test_subprocess test_pass_fds_redirected, its fd_status.py
 * inline. */
static void python_pass_fds(void) {
    if (system("python3 -c 'import subprocess' >/dev/null 2>&1") != 0) {
        printf("python3 not found: skipped\n");
        return;
    }
    same("python3 subprocess pass_fds redirected",
         "python3 -c '\n"
         "import os, subprocess, sys\n"
         "status = \"import os\\nfds = []\\nfor fd in range(256):\\n try: os.fstat(fd)\\n"
         " except OSError: continue\\n fds.append(fd)\\nprint(\\\",\\\".join(map(str, fds)))\"\n"
         "pass_fds = [os.open(os.devnull, os.O_RDWR) for _ in range(2)]\n"
         "r, w = os.pipe()\n"
         "pass_fds.insert(1, w)\n"
         "with subprocess.Popen([sys.executable, \"-c\", status], stdin=pass_fds[0],\n"
         "                      stdout=pass_fds[1], stderr=pass_fds[2], close_fds=True,\n"
         "                      pass_fds=pass_fds):\n"
         "    out = os.read(r, 1024)\n"
         "fds = {int(n) for n in out.split(b\",\")}\n"
         "print(\"ok\" if fds == {0, 1, 2} | frozenset(pass_fds) else \"extra: %s\" %\n"
         "      sorted(fds - ({0, 1, 2} | frozenset(pass_fds))))'");
}

int main(void) {
#if defined(HM_SANITIZE_BUILD)
    HM_TEST_SKIP("the sanitizers replace malloc themselves");
#endif
    if (access(HM_PROXY_LIB, R_OK)) HM_TEST_SKIP("no %s", HM_PROXY_LIB);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/hm-proxy-fds-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(g_dir));
    takes_number("closeall");
    takes_number("dup2");
    same("descriptors passed to a child", HM_FDS_PROG " passfds");
    if (system("bash -c true >/dev/null 2>&1") == 0) bash_redirections();
    else printf("bash not found: skipped\n");
    python_pass_fds();
    CHECK_MSG(rmdir(g_dir) == 0, "files left behind in %s", g_dir);
    return hm_test_finish();
}
