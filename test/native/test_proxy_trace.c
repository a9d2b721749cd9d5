/* hetmem tests — HM_PROXY_TRACE: real programs run under libhetmem_proxy.so
 * with recording on leave a well-formed trace (src/preload/trace.h) that
 * bench_replay replays faithfully through the native pool and through
 * malloc (the replayer's own, and the proxy preloaded): ls over a directory tree, a C++ program using new/delete across
 * threads, and a C program that frees on one thread what another made.
 * Skipped in sanitizer builds (the sanitizers own malloc).
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "preload/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Record cmd's trace into path; check its header and shape; replay it. */
static void record_replay(const char *label, const char *cmd, const char *path, int threads) {
    char full[4096];
    unlink(path);
    snprintf(full, sizeof full, "HM_PROXY_TRACE=%s LD_PRELOAD=%s %s >/dev/null", path,
             HM_PROXY_LIB, cmd);
    int s = system(full);
    CHECK_MSG(s == 0, "%s: exit status %d under the proxy with recording on", label, s);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "%s: no trace %s", label, path);
    if (!f) return;
    struct stat st;
    hm_trace_header_t h;
    CHECK(fstat(fileno(f), &st) == 0);
    CHECK_MSG(fread(&h, sizeof h, 1, f) == 1, "%s: no header", label);
    CHECK(h.magic == HM_TRACE_MAGIC && h.version == HM_TRACE_VERSION);
    CHECK(h.header_size == sizeof h && h.record_size == sizeof(hm_trace_rec_t));
    size_t n = ((size_t)st.st_size - sizeof h) / sizeof(hm_trace_rec_t);
    CHECK_MSG(((size_t)st.st_size - sizeof h) % sizeof(hm_trace_rec_t) == 0,
              "%s: trace is not whole records", label);
    CHECK_MSG(n > 100, "%s: only %zu records", label, n);
    unsigned max_thread = 0;
    hm_trace_rec_t r;
    while (fread(&r, sizeof r, 1, f) == 1) {
        CHECK(r.op >= HM_TRACE_MALLOC && r.op <= HM_TRACE_MEMALIGN);
        if (r.thread > max_thread) max_thread = r.thread;
    }
    fclose(f);
    CHECK_MSG((int)max_thread + 1 >= threads, "%s: %u threads recorded, %d expected", label,
              max_thread + 1, threads);
    snprintf(full, sizeof full, "%s %s", HM_REPLAY, path);
    s = system(full);
    CHECK_MSG(s == 0, "%s: replay of %zu records not faithful (status %d)", label, n, s);
    /* through the preloaded malloc (here the proxy itself, recording off) */
    snprintf(full, sizeof full, "LD_PRELOAD=%s %s --backend malloc %s", HM_PROXY_LIB, HM_REPLAY,
             path);
    s = system(full);
    CHECK_MSG(s == 0, "%s: replay under the proxy not faithful (status %d)", label, s);
    printf("%s: %zu records, %u threads\n", label, n, max_thread + 1);
    unlink(path);
}

int main(void) {
#if defined(HM_SANITIZE_BUILD)
    HM_TEST_SKIP("the sanitizers replace malloc themselves");
#endif
    if (access(HM_PROXY_LIB, R_OK)) HM_TEST_SKIP("no %s", HM_PROXY_LIB);
    char path[256];
    snprintf(path, sizeof path, "/tmp/hm_trace_test.%ld", (long)getpid());
    record_replay("ls -R", "ls -R " HM_SOURCE_DIR, path, 1);
    record_replay("c++ new/delete across threads", HM_CXX_PROG, path, 2);
    record_replay("free on another thread", HM_TRACE_MT_PROG, path, 3);
    /* The exit status and output are the program's with recording on. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "test \"$(HM_PROXY_TRACE=%s LD_PRELOAD=%s %s)\" = \"$(%s)\"", path,
             HM_PROXY_LIB, HM_TRACE_MT_PROG, HM_TRACE_MT_PROG);
    CHECK_MSG(system(cmd) == 0, "the program's output differs with recording on");
    unlink(path);
    return hm_test_finish();
}
