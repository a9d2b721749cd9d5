/* hetmem tests — libhetmem_proxy.so: real programs run with and without
 * LD_PRELOAD of the malloc replacement must print the same output: python3
 * with a workload, git on this repository, a C++ program using new/delete
 * across threads, and the shell. Also: programs that fork under the proxy,
 * whose children go on running (bash $(...)), with the heap private and in
 * shared memory (HM_PROXY=shared). And each entry point of the family as a
 * program's first call, and frees the pool must refuse (double, interior).
 * Skipped in sanitizer builds (the sanitizers own malloc).
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Run cmd through sh with (or without) the proxy; capture stdout. */
static char *run(const char *cmd, int preload, int *status) {
    char full[4096];
    snprintf(full, sizeof full, "%s%s%s %s", preload ? "LD_PRELOAD=" : "",
             preload ? HM_PROXY_LIB : "", preload ? "" : "", cmd);
    FILE *f = popen(full, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t n;
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

static void same(const char *label, const char *cmd) {
    int s1 = -1, s2 = -1;
    char *a = run(cmd, 0, &s1);
    char *b = run(cmd, 1, &s2);
    CHECK_MSG(a && b, "%s: could not run", label);
    if (a && b) {
        CHECK_MSG(s1 == 0 && s2 == 0, "%s: exit status %d without, %d with the proxy", label, s1,
                  s2);
        CHECK_MSG(strcmp(a, b) == 0, "%s: output differs under the proxy:\n--- without\n%.500s\n"
                  "--- with\n%.500s", label, a, b);
        CHECK_MSG(strlen(a) > 0, "%s: no output", label);
    }
    free(a);
    free(b);
}

int main(void) {
#if defined(HM_SANITIZE_BUILD)
    HM_TEST_SKIP("the sanitizers replace malloc themselves");
#endif
    if (access(HM_PROXY_LIB, R_OK)) HM_TEST_SKIP("no %s", HM_PROXY_LIB);
    same("shell", "sh -c 'echo hello; ls / | sort | head -5'");
    if (system("python3 -c 'pass' >/dev/null 2>&1") == 0)
        same("python3",
             "python3 -c 'import json,hashlib\n"
             "d={str(i):[i*j for j in range(i%50)] for i in range(20000)}\n"
             "s=json.dumps(d,sort_keys=True)\n"
             "print(len(s), hashlib.sha256(s.encode()).hexdigest())\n"
             "import threading\n"
             "out=[]\n"
             "def w(k): out.append(sum(len(str(x)*k) for x in range(20000)))\n"
             "t=[threading.Thread(target=w,args=(k,)) for k in range(4)]\n"
             "[x.start() for x in t]; [x.join() for x in t]\n"
             "print(sorted(out))'");
    else
        printf("python3 not found: skipped\n");
    if (system("git --version >/dev/null 2>&1") == 0 &&
        system("git -C " HM_SOURCE_DIR " rev-parse HEAD >/dev/null 2>&1") == 0)
        same("git", "git -C " HM_SOURCE_DIR " log --stat -n 30 --format='%H %s' HEAD");
    same("c++ new/delete across threads", HM_CXX_PROG);
    /* A program using libhetmem.so itself under the proxy (the proxy's own
     * copy of hetmem must stay private). */
    same("hetmem pools under the proxy", HM_NATIVE_TEST " remote");
    /* fork under the proxy: parent and child both allocate and free. */
    same("fork", "sh -c 'for i in 1 2 3; do (echo child $i) & done; wait' | sort");
    /* Forked children that go on running, with the heap in shared memory
     * (HM_PROXY=shared): they must get private copies. */
    same("forked children", HM_FORK_PROG);
    same("forked children, shared heap", "HM_PROXY=shared " HM_FORK_PROG);
    /* fork once the tracker has used call_rcu (its atfork child handler
     * calls malloc) */
    same("fork after call_rcu, tracked heap", "HM_PROXY=tracked " HM_FORK_RCU_PROG);
    same("fork after call_rcu, shared heap", "HM_PROXY=shared " HM_FORK_RCU_PROG);
    /* the child's heap is the one at fork(), whatever the parent writes next */
    same("fork snapshot", HM_FORK_SNAPSHOT_PROG);
    same("fork snapshot, shared heap", "HM_PROXY=shared " HM_FORK_SNAPSHOT_PROG);
    /* memalign, posix_memalign, valloc, pvalloc: glibc's answers */
    same("aligned allocation calls", HM_ALIGN_PROG);
    /* Every entry point as the program's first call into the family, on a
     * block glibc made before the replacement served anything. */
    static const char *const first[] = {"malloc_usable_size", "free", "realloc", "malloc",
                                        "calloc", "posix_memalign", "aligned_alloc",
                                        "memalign", "valloc", "pvalloc"};
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++) {
        char label[96], cmd[1024];
        snprintf(label, sizeof label, "first call %s", first[i]);
        snprintf(cmd, sizeof cmd, "%s %s", HM_FIRST_CALL_PROG, first[i]);
        same(label, cmd);
        snprintf(label, sizeof label, "first call %s, shared heap", first[i]);
        snprintf(cmd, sizeof cmd, "HM_PROXY=shared %s %s", HM_FIRST_CALL_PROG, first[i]);
        same(label, cmd);
    }
    /* Frees the pool refuses (under the proxy only: glibc aborts on them). */
    {
        int st = -1;
        char *out = run(HM_SAFETY_PROG " 2>/dev/null", 1, &st);
        CHECK_MSG(out && st == 0 && strcmp(out, "ok\n") == 0,
                  "refused frees: exit status %d, output %.200s", st, out ? out : "(none)");
        free(out);
    }
    if (system("bash -c true >/dev/null 2>&1") == 0) {
        same("bash $(...), shared heap",
             "HM_PROXY=shared bash " HM_SOURCE_DIR "/test/native/proxy_fork.sh");
        same("bash $(...)", "bash " HM_SOURCE_DIR "/test/native/proxy_fork.sh");
    }
    return hm_test_finish();
}
