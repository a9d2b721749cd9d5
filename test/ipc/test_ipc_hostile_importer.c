/* hetmem tests — a hostile importer against an honest exporter (OS shared
 * memory; the file providers: test/file/test_file_ipc_hostile).
 *
 * The importer takes the descriptor that comes with a handle and misuses
 * it: it looks for the exporter's other allocations in it, maps it whole,
 * tries to shrink, grow and seal it, and writes wherever it can. It runs as
 * this user and, where the test runs as root, as another user. The
 * exporter must see none of its other memory exposed, never fault, and get
 * a fresh allocation that the importer's mapping of a freed one does not
 * reach. Also: 10^5 exports over one provider stay within a descriptor
 * limit of 1024, and a program that never calls hm_ipc_allow_importer()
 * makes no PR_SET_PTRACER call (under strace).
 * Usage: test_ipc_hostile_importer              the tests
 *        test_ipc_hostile_importer export [allow]  (under strace) export
 *                                               one block, put, free
 * SPDX-License-Identifier: MIT */
#include "hostile_util.h"

#include <hetmem/hetmem.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define KIB ((size_t)1 << 10)
#define SZ (64 * KIB)

static const char *g_self;

static hm_pool_t *shared_pool(size_t max_memfds, bool proxy) {
    hm_os_params_t *par;
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_os_params_create(&par));
    REQUIRE_OK(hm_os_params_set_visibility(par, HM_OS_SHARED));
    REQUIRE_OK(hm_os_params_set_max_memfds(par, max_memfds));
    REQUIRE_OK(hm_os_provider_create(par, &prov));
    hm_os_params_destroy(par);
    if (proxy) REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    else REQUIRE_OK(hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    return pool;
}

/* Findings of the importer, one bit each (all set: nothing gained). */
enum {
    F_SIZE = 1,      /* the file is exactly the exported allocation */
    F_NO_SECRET = 2, /* nothing of the exporter's other allocation in it */
    F_NO_SHRINK = 4, /* ftruncate to 0 refused */
    F_NO_GROW = 8,   /* ftruncate up refused */
    F_NO_SEAL = 16,  /* no further seal (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE) */
    F_ALL = 31
};

static int importer(hm_ipc_channel_t *c, int other_user) {
    if (other_user && hostile_become(HOSTILE_OTHER_UID) != 0) return 90;
    unsigned char buf[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    size_t n = 0;
    int fd = -1;
    if (hm_ipc_channel_recv(c, buf, sizeof buf, &n, &fd) != HM_SUCCESS || fd < 0) return 91;
    uint64_t found = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) return 92;
    if (st.st_size == (off_t)SZ) found |= F_SIZE;
    unsigned char *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 93;
    size_t run = 0, best = 0;
    for (off_t i = 0; i < st.st_size; i++) {
        run = m[i] == 0xb5 ? run + 1 : 0;
        if (run > best) best = run;
    }
    if (best < 64) found |= F_NO_SECRET;
    if (ftruncate(fd, 0) != 0 && errno == EPERM) found |= F_NO_SHRINK;
    if (ftruncate(fd, 64 * (off_t)SZ) != 0 && errno == EPERM) found |= F_NO_GROW;
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0)
        found |= F_NO_SEAL;
    memset(m, 0xee, (size_t)st.st_size); /* its right: the exported bytes */
    if (hostile_send64(c, found)) return 94;
    uint64_t cmd;
    if (hostile_recv64(c, &cmd)) return 95; /* the exporter freed and reallocated */
    memset(m, 0xef, (size_t)st.st_size);
    munmap(m, (size_t)st.st_size);
    close(fd);
    if (hostile_send64(c, 1)) return 96;
    return 0;
}

static void misuse(int other_user) {
    hm_test_set_context(other_user ? "importer of another user" : "importer of this user");
    hm_ipc_channel_t *mine;
    pid_t pid = hostile_fork(importer, other_user, &mine);
    hm_pool_t *pool = shared_pool(0, true);
    unsigned char *secret = hm_pool_malloc(pool, SZ), *a = hm_pool_malloc(pool, SZ);
    REQUIRE(secret && a);
    memset(secret, 0xb5, SZ);
    memset(a, 0x11, SZ);
    hm_ipc_handle_t *h;
    size_t len;
    REQUIRE_OK(hm_ipc_get(a, &h, &len));
    REQUIRE_OK(hm_ipc_channel_send(mine, h, len));
    uint64_t found = 0, done = 0;
    REQUIRE(hostile_recv64(mine, &found) == 0);
    CHECK_MSG(found == F_ALL, "the importer gained: %#llx of %#x", (unsigned long long)found,
              F_ALL);
    /* The exporter never faults; its other memory is untouched. */
    for (size_t i = 0; i < SZ; i++)
        if (a[i] != 0xee) {
            CHECK_MSG(0, "the exported bytes are not the importer's at %zu", i);
            break;
        }
    for (size_t i = 0; i < SZ; i++)
        if (secret[i] != 0xb5) {
            CHECK_MSG(0, "the exporter's other allocation changed at %zu", i);
            break;
        }
    /* Freed while imported; a new allocation is not reachable through the
     * importer's mapping of the old one. */
    CHECK_OK(hm_ipc_put(h));
    CHECK_OK(hm_free(a));
    unsigned char *c = hm_pool_malloc(pool, SZ);
    REQUIRE(c);
    memset(c, 0xc3, SZ);
    REQUIRE(hostile_send64(mine, 1) == 0);
    REQUIRE(hostile_recv64(mine, &done) == 0);
    for (size_t i = 0; i < SZ; i++)
        if (c[i] != 0xc3) {
            CHECK_MSG(0, "the importer's mapping of a freed block reached a new one (%zu)", i);
            break;
        }
    hm_free(c);
    hm_free(secret);
    hostile_join(pid, mine);
    CHECK_OK(hm_pool_destroy(pool));
    hm_test_set_context(NULL);
}

static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n - 2;
}

/* 10^5 exports over one provider within RLIMIT_NOFILE = 1024 (in a child:
 * the limit is the child's alone): native-pool blocks, and 20000 live
 * provider allocations (a proxy pool), each exported. */
static int stress_child(void) {
    struct rlimit rl = {1024, 1024};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 80;
    enum { BLOCKS = 100000, RANGES = 20000 };
    hm_pool_t *native = shared_pool(0, false), *proxy = shared_pool(0, true);
    static void *blk[BLOCKS], *rng[RANGES];
    int peak = 0;
    for (int i = 0; i < BLOCKS; i++) {
        if (!(blk[i] = hm_pool_malloc(native, 64 + (size_t)(i % 5) * 100))) return 81;
        hm_ipc_handle_t *h;
        size_t len;
        if (hm_ipc_get(blk[i], &h, &len) != HM_SUCCESS || hm_ipc_put(h) != HM_SUCCESS) return 82;
    }
    for (int i = 0; i < RANGES; i++) {
        if (!(rng[i] = hm_pool_malloc(proxy, 4096))) return 83;
        ((char *)rng[i])[0] = (char)i;
        hm_ipc_handle_t *h;
        size_t len;
        if (hm_ipc_get(rng[i], &h, &len) != HM_SUCCESS || hm_ipc_put(h) != HM_SUCCESS) return 84;
        if (i % 1000 == 0) {
            int n = open_fds();
            if (n > peak) peak = n;
        }
    }
    for (int i = 0; i < RANGES; i++)
        if (((char *)rng[i])[0] != (char)i) return 85;
    int n = open_fds();
    if (n > peak) peak = n;
    printf("stress: %d blocks and %d ranges exported, at most %d descriptors open\n", BLOCKS,
           RANGES, peak);
    fflush(stdout);
    if (peak >= 1024) return 86;
    for (int i = 0; i < BLOCKS; i++) hm_free(blk[i]);
    for (int i = 0; i < RANGES; i++) hm_free(rng[i]);
    hm_pool_destroy(native);
    hm_pool_destroy(proxy);
    return 0;
}

static void stress(void) {
    hm_test_set_context("10^5 exports");
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(stress_child());
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "stress child: status %#x", status);
    hm_test_set_context(NULL);
}

/* The strace'd program: one export, its put and free; with "allow", after
 * hm_ipc_allow_importer(HM_IPC_IMPORTER_ANY). */
static int export_once(int allow) {
    if (allow && hm_ipc_allow_importer(HM_IPC_IMPORTER_ANY) != HM_SUCCESS) return 2;
    hm_pool_t *pool = shared_pool(0, true);
    void *a = hm_pool_malloc(pool, SZ);
    hm_ipc_handle_t *h;
    size_t len;
    if (!a || hm_ipc_get(a, &h, &len) != HM_SUCCESS || hm_ipc_put(h) != HM_SUCCESS) return 3;
    hm_free(a);
    hm_pool_destroy(pool);
    return 0;
}

/* PR_SET_PTRACER calls of `self export [allow]` under strace, or -1. */
static int ptracer_calls(const char *extra) {
    char log[] = "/tmp/hm-strace-XXXXXX";
    int lfd = mkstemp(log);
    if (lfd < 0) return -1;
    close(lfd);
    char cmd[1024];
    /* LeakSanitizer cannot run under ptrace: off for the traced child. */
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" "
             "strace -f -qq -e trace=prctl -o %s %s export %s >/dev/null 2>&1",
             log, g_self, extra);
    int rc = system(cmd);
    int n = -1;
    FILE *f = fopen(log, "r");
    if (rc == 0 && f) {
        n = 0;
        char line[512];
        while (fgets(line, sizeof line, f)) n += strstr(line, "PR_SET_PTRACER") != NULL;
    }
    if (f) fclose(f);
    unlink(log);
    return n;
}

static void no_prctl(void) {
    hm_test_set_context("prctl");
    if (system("strace -V >/dev/null 2>&1") != 0) {
        printf("skip: strace is not installed (scripts/deps.sh test installs it)\n");
        return;
    }
    CHECK_EQ(ptracer_calls(""), 0);
    /* Asked for: declared where Yama is active (and withdrawn after the
     * last export), nothing where it is absent or at scope 0. */
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = -1;
    if (f) {
        if (fscanf(f, "%d", &scope) != 1) scope = -1;
        fclose(f);
    }
    int n = ptracer_calls("allow");
    if (scope == 1) CHECK_MSG(n == 2, "%d PR_SET_PTRACER calls (want: set and withdraw)", n);
    else if (scope <= 0) CHECK_EQ(n, 0);
    /* The API's arguments. */
    CHECK_RES(hm_ipc_allow_importer(-2), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_ipc_allow_importer((int64_t)1 << 40), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_ipc_allow_importer(0));
    CHECK_RES(hm_ipc_set_trust((hm_ipc_trust_t)7), HM_ERROR_INVALID_ARGUMENT);
    hm_test_set_context(NULL);
}

int main(int argc, char **argv) {
    g_self = argv[0];
    if (argc >= 2 && !strcmp(argv[1], "export"))
        return export_once(argc >= 3 && !strcmp(argv[2], "allow"));
    misuse(0);
    if (geteuid() == 0) misuse(1);
    else printf("skip: the importer as another user needs root\n");
    stress();
    no_prctl();
    return hm_test_finish();
}
