/* hetmem tests — cuda_probe: what a CUDA driver answers where hetmem's CUDA
 * provider and IPC cache depend on behaviour that cuda.h states loosely or
 * not at all. It opens libcuda.so.1 (HM_CUDA_DRIVER names another file),
 * calls the driver API by its versioned names and writes one CSV line per
 * behaviour: behaviour,observed,detail.
 * SPDX-License-Identifier: MIT
 *
 *   cuda_probe [--csv FILE] [--expect EXPECTED.csv]
 *   cuda_probe --compare OBSERVED.csv --expect EXPECTED.csv
 *
 * Every scenario runs in a child process (this program re-executed through
 * /proc/self/exe) under an alarm, so a driver that crashes or hangs costs one
 * line, recorded as "missing" with how the child ended, never the probe. The
 * IPC scenarios use two such children, exporter and importer, over a
 * socketpair: separate processes, as on a real machine. The main process
 * opens the driver and calls cuInit only to tell whether there is a device.
 *
 * --expect compares the lines with a file of expected answers
 * (behaviour,expected,source; "record" accepts any answer; '#' starts a
 * comment) and fails on a difference or a missing line; --compare does only
 * that, for a CSV recorded elsewhere (on a GPU machine).
 *
 * Exit: 0 when every line was recorded (and, with --expect, matched); 1
 * otherwise; 77 when there is no driver or no device. */
#include "../cuda/cuda_decls.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Not implemented by every test driver, so not in cuda_decls.h: cuda.h 13.0. */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);

#define MIB ((size_t)1 << 20)
#define CHILD_ALARM_S 12 /* a child's own limit; the parent kills at CHILD_KILL_S */
#define CHILD_KILL_S 15
#define IPC_SIZE MIB

/* ---- the driver, by exact versioned names ---- */

#define CU_SYMBOLS(X)                                                                      \
    X(cuInit, 1)                                                                           \
    X(cuDriverGetVersion, 1)                                                               \
    X(cuDeviceGetCount, 1)                                                                 \
    X(cuDeviceGet, 1)                                                                      \
    X(cuDeviceGetName, 1)                                                                  \
    X(cuDevicePrimaryCtxRetain, 1)                                                         \
    X(cuCtxPushCurrent_v2, 1)                                                              \
    X(cuCtxGetCurrent, 1)                                                                  \
    X(cuMemAlloc_v2, 1)                                                                    \
    X(cuMemFree_v2, 1)                                                                     \
    X(cuMemGetAddressRange_v2, 1)                                                          \
    X(cuMemHostAlloc, 1)                                                                   \
    X(cuMemFreeHost, 1)                                                                    \
    X(cuMemHostGetDevicePointer_v2, 0)                                                     \
    X(cuIpcGetMemHandle, 1)                                                                \
    X(cuIpcOpenMemHandle_v2, 1)                                                            \
    X(cuIpcCloseMemHandle, 1)

static struct {
#define FIELD(name, required) __typeof__(name) *name;
    CU_SYMBOLS(FIELD)
#undef FIELD
} cu;

static char g_load_error[256];

/* 0: loaded with every required symbol; -1: no library; -2: a symbol is missing. */
static int load_driver(void) {
    const char *path = getenv("HM_CUDA_DRIVER");
    if (!path || !*path) path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_load_error, sizeof g_load_error, "%s", dlerror());
        return -1;
    }
#define RESOLVE(name, required)                                                            \
    *(void **)&cu.name = dlsym(h, #name);                                                  \
    if (!cu.name && (required)) {                                                          \
        snprintf(g_load_error, sizeof g_load_error, "%s lacks %s", path, #name);           \
        return -2;                                                                         \
    }
    CU_SYMBOLS(RESOLVE)
#undef RESOLVE
    return 0;
}

/* ---- output: one line, one write(), so that lines from children never mix ---- */

static int g_out = 1;

__attribute__((format(printf, 3, 4))) static void emit(const char *behaviour, const char *observed,
                                                       const char *fmt, ...) {
    char line[512], detail[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    for (char *c = detail; *c; c++)
        if (*c == ',' || *c == '\n') *c = ';'; /* one CSV field */
    int n = snprintf(line, sizeof line, "%s,%s,%s\n", behaviour, observed, detail);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    ssize_t w = write(g_out, line, (size_t)n);
    (void)w;
}

static const char *rc_str(CUresult rc, char buf[16]) {
    snprintf(buf, 16, "%d", (int)rc);
    return buf;
}

/* The lowest set bit of an address: the alignment the driver gave. */
static unsigned long long low_bit(CUdeviceptr p) { return p ? p & -p : 0; }

static int ctx_up(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cu.cuInit(0) || cu.cuDeviceGet(&dev, 0) || cu.cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cu.cuCtxPushCurrent_v2(ctx)) {
        fprintf(stderr, "cuda_probe: no context on device 0\n");
        return -1;
    }
    return 0;
}

/* ---- scenarios, each in its own child ---- */

/* Where small allocations land: lowest set bit of each address, whether
 * consecutive small ones share a 2 MiB region, what cuMemGetAddressRange_v2
 * says the range of a 1-byte allocation is. */
static int child_alloc(void) {
    if (ctx_up()) return 1;
    static const size_t sizes[] = {1, 256, 4096, 65536, MIB};
    CUdeviceptr p[5] = {0}, small[4] = {0};
    char name[32], obs[32];
    for (int i = 0; i < 5; i++) {
        CUresult rc = cu.cuMemAlloc_v2(&p[i], sizes[i]);
        snprintf(name, sizeof name, "align_%zu", sizes[i]);
        if (rc) {
            snprintf(obs, sizeof obs, "rc=%d", (int)rc);
            emit(name, obs, "cuMemAlloc_v2 failed");
        } else {
            snprintf(obs, sizeof obs, "%llu", low_bit(p[i]));
            emit(name, obs, "address 0x%llx", (unsigned long long)p[i]);
        }
    }
    int shared = 0, ok = 1;
    char deltas[160] = "";
    size_t used = 0;
    for (int i = 0; i < 4; i++) {
        if (cu.cuMemAlloc_v2(&small[i], 1)) ok = 0;
        if (i > 0 && ok) {
            shared |= (small[i] >> 21) == (small[i - 1] >> 21);
            used += (size_t)snprintf(deltas + used, sizeof deltas - used, "%s%lld", i > 1 ? " " : "",
                                     (long long)(small[i] - small[i - 1]));
        }
    }
    emit("small_share_2m", ok ? (shared ? "yes" : "no") : "alloc_failed",
         "four 1-byte allocations; address deltas %s", deltas);
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult rc = p[0] ? cu.cuMemGetAddressRange_v2(&base, &size, p[0]) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        snprintf(obs, sizeof obs, "%zu", size);
        emit("range_1", obs, "size of a 1-byte allocation's range; base %s the pointer",
             base == p[0] ? "is" : "is not");
    } else {
        emit("range_1", rc_str(rc, obs), "cuMemGetAddressRange_v2 failed");
    }
    for (int i = 0; i < 5; i++)
        if (p[i]) cu.cuMemFree_v2(p[i]);
    for (int i = 0; i < 4; i++)
        if (small[i]) cu.cuMemFree_v2(small[i]);
    return 0;
}

/* Host memory mapped for the device: the device pointer of write-combined
 * memory, and of plain mapped memory, against the host pointer. */
static void host_pointer(const char *behaviour, unsigned flags) {
    void *h = NULL;
    char obs[32];
    CUresult rc = cu.cuMemHostAlloc(&h, MIB, flags);
    if (rc) {
        snprintf(obs, sizeof obs, "alloc_rc=%d", (int)rc);
        emit(behaviour, obs, "cuMemHostAlloc(0x%x) failed", flags);
        return;
    }
    if (!cu.cuMemHostGetDevicePointer_v2) {
        emit(behaviour, "no_symbol", "the driver lacks cuMemHostGetDevicePointer_v2");
    } else {
        CUdeviceptr d = 0;
        rc = cu.cuMemHostGetDevicePointer_v2(&d, h, 0);
        if (rc)
            emit(behaviour, rc_str(rc, obs), "cuMemHostGetDevicePointer_v2 failed");
        else
            emit(behaviour, d == (CUdeviceptr)(uintptr_t)h ? "equal" : "different",
                 "host %p device 0x%llx", h, (unsigned long long)d);
    }
    cu.cuMemFreeHost(h);
}

static int child_hostmem(void) {
    if (ctx_up()) return 1;
    host_pointer("hostwc_device_pointer", CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_DEVICEMAP);
    host_pointer("hostmap_device_pointer", CU_MEMHOSTALLOC_DEVICEMAP);
    return 0;
}

/* IPC between two children over a SOCK_SEQPACKET socketpair. */
enum { MSG_HANDLE = 1, MSG_REALLOC, MSG_DONE };
struct msg {
    int op;
    CUipcMemHandle handle;
    CUdeviceptr ptr;
};

static int send_msg(int fd, int op, const CUipcMemHandle *h, CUdeviceptr p) {
    struct msg m;
    memset(&m, 0, sizeof m);
    m.op = op;
    if (h) m.handle = *h;
    m.ptr = p;
    return send(fd, &m, sizeof m, MSG_NOSIGNAL) == (ssize_t)sizeof m ? 0 : -1;
}

static int recv_msg(int fd, int op, struct msg *m) {
    ssize_t n;
    do n = recv(fd, m, sizeof *m, 0);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof *m || m->op != op) {
        fprintf(stderr, "cuda_probe: peer gone or out of step (wanted message %d)\n", op);
        return -1;
    }
    return 0;
}

/* The exporter: A, then A freed and allocated again (same address?), its
 * own handle opened by itself, then B, exported, and exit with B live. */
static int child_exporter(int sock) {
    if (ctx_up()) return 1;
    CUdeviceptr a = 0, a2 = 0, b = 0;
    CUipcMemHandle h;
    char obs[32];
    if (cu.cuMemAlloc_v2(&a, IPC_SIZE) || cu.cuIpcGetMemHandle(&h, a) ||
        send_msg(sock, MSG_HANDLE, &h, a))
        return 1;
    struct msg m;
    if (recv_msg(sock, MSG_REALLOC, &m)) return 1;
    CUresult rc = cu.cuMemFree_v2(a);
    if (rc == CUDA_SUCCESS) rc = cu.cuMemAlloc_v2(&a2, IPC_SIZE);
    if (rc) {
        emit("reuse_address", rc_str(rc, obs), "cuMemFree_v2 or cuMemAlloc_v2 failed");
        return 1;
    }
    emit("reuse_address", a2 == a ? "same" : "different",
         "freed 0x%llx and allocated the same size: 0x%llx", (unsigned long long)a,
         (unsigned long long)a2);
    if (cu.cuIpcGetMemHandle(&h, a2) || send_msg(sock, MSG_HANDLE, &h, a2)) return 1;
    if (recv_msg(sock, MSG_DONE, &m)) return 1;

    CUdeviceptr own = 0;
    rc = cu.cuIpcOpenMemHandle_v2(&own, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    emit("own_process_open", rc_str(rc, obs), "%s",
         rc ? "the exporter opened its own handle" :
         own == a2 ? "succeeded: the allocation's own address" : "succeeded: another address");
    if (rc == CUDA_SUCCESS) cu.cuIpcCloseMemHandle(own);

    if (cu.cuMemAlloc_v2(&b, IPC_SIZE) || cu.cuIpcGetMemHandle(&h, b) ||
        send_msg(sock, MSG_HANDLE, &h, b))
        return 1;
    return 0; /* exit with A2 and B allocated: the driver tears them down */
}

/* The importer: a repeat open, an open of a reused address while the old
 * mapping is open and after it is closed, an interior close, and an open
 * after the exporter has exited (the parent says when, on `go`). */
static int child_importer(int sock, int go) {
    if (ctx_up()) return 1;
    struct msg m;
    char obs[32];
    if (recv_msg(sock, MSG_HANDLE, &m)) return 1;
    const CUdeviceptr exported = m.ptr;
    CUdeviceptr p1 = 0, p2 = 0;
    CUresult rc1 = cu.cuIpcOpenMemHandle_v2(&p1, m.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (rc1) {
        emit("repeat_open", "first_open_failed", "first cuIpcOpenMemHandle_v2: %d", (int)rc1);
        return 1;
    }
    CUresult rc2 = cu.cuIpcOpenMemHandle_v2(&p2, m.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (rc2 == CUDA_SUCCESS)
        snprintf(obs, sizeof obs, "0:%s", p2 == p1 ? "same" : "different");
    else
        rc_str(rc2, obs);
    emit("repeat_open", obs, "second open of one handle in one context: first 0x%llx second 0x%llx",
         (unsigned long long)p1, (unsigned long long)p2);

    emit("ipc_address", p1 == exported ? "same" : "different",
         "the importer's mapping 0x%llx against the exporter's address 0x%llx",
         (unsigned long long)p1, (unsigned long long)exported);

    if (send_msg(sock, MSG_REALLOC, NULL, 0) || recv_msg(sock, MSG_HANDLE, &m)) return 1;
    CUdeviceptr p3 = 0;
    CUresult rc = cu.cuIpcOpenMemHandle_v2(&p3, m.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    emit("reuse_open_while_mapped", rc_str(rc, obs),
         "the exporter's new allocation %s its freed one; the old mapping 0x%llx still open here; "
         "result 0x%llx", m.ptr == exported ? "reuses the address of" : "does not reuse",
         (unsigned long long)p1, (unsigned long long)p3);
    if (rc == CUDA_SUCCESS && p3 != p1) cu.cuIpcCloseMemHandle(p3);

    /* Close the old mapping as often as it was opened. */
    CUresult c1 = cu.cuIpcCloseMemHandle(p1), c2 = CUDA_SUCCESS;
    int twice = rc2 == CUDA_SUCCESS && p2 == p1;
    if (twice) c2 = cu.cuIpcCloseMemHandle(p1);
    else if (rc2 == CUDA_SUCCESS) c2 = cu.cuIpcCloseMemHandle(p2);
    snprintf(obs, sizeof obs, "%d/%d", (int)c1, (int)c2);
    emit("repeat_open_close", obs, "closing the twice-opened mapping: first close / second close%s",
         twice ? "" : " (of the second mapping)");

    CUdeviceptr p4 = 0;
    rc = cu.cuIpcOpenMemHandle_v2(&p4, m.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    emit("reuse_open_after_close", rc_str(rc, obs), "the new handle once the old mapping is closed");
    if (rc == CUDA_SUCCESS) { /* last: what a successful interior close does is unknown */
        rc = cu.cuIpcCloseMemHandle(p4 + 4096);
        emit("interior_close", rc_str(rc, obs), "cuIpcCloseMemHandle(base + 4096)%s",
             rc ? "" : ": succeeded; what it closed is unknown");
        cu.cuIpcCloseMemHandle(p4);
    } else {
        emit("interior_close", "no_mapping", "the reopened handle failed: nothing to close");
    }

    if (send_msg(sock, MSG_DONE, NULL, 0) || recv_msg(sock, MSG_HANDLE, &m)) return 1;
    char byte;
    ssize_t n;
    do n = read(go, &byte, 1);
    while (n < 0 && errno == EINTR);
    CUdeviceptr p5 = 0;
    rc = cu.cuIpcOpenMemHandle_v2(&p5, m.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    emit("open_after_exit", rc_str(rc, obs), "a handle opened after its exporter %s",
         n == 1 && byte == 'x' ? "exited" : "was killed or vanished");
    if (rc == CUDA_SUCCESS) cu.cuIpcCloseMemHandle(p5);
    return 0;
}

/* A call in a fork child of a process with a context, then cuInit there,
 * then a call in the parent again. */
static int child_fork(void) {
    if (ctx_up()) return 1;
    CUdeviceptr x = 0;
    if (cu.cuMemAlloc_v2(&x, 4096)) return 1;
    char obs[16];
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        alarm(10);
        CUdeviceptr y = 0;
        CUresult rc = cu.cuMemAlloc_v2(&y, 4096);
        emit("fork_child", rc_str(rc, obs), "cuMemAlloc_v2 in a fork child");
        rc = cu.cuInit(0);
        emit("fork_child_init", rc_str(rc, obs), "cuInit(0) in the fork child afterwards");
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    CUresult rc = cu.cuMemFree_v2(x);
    emit("fork_parent_after", rc_str(rc, obs), "cuMemFree_v2 in the parent after the fork");
    return 0;
}

/* A call from an atexit handler registered before the driver was loaded, so
 * that it runs after whatever the driver registered at load or cuInit. */
static CUdeviceptr g_teardown_ptr;

static void teardown_handler(void) {
    char obs[16];
    alarm(10);
    CUresult rc = cu.cuMemFree_v2(g_teardown_ptr);
    emit("teardown", rc_str(rc, obs), "cuMemFree_v2 from an atexit handler registered before cuInit");
}

static int child_teardown(void) {
    if (ctx_up()) return 1;
    return cu.cuMemAlloc_v2(&g_teardown_ptr, 4096) ? 1 : 0;
}

/* ---- the parent: one child per scenario ---- */

static const char *g_self;

static pid_t spawn(const char *scenario, int out, int fd1, int fd2) {
    char a[16], b[16], c[16];
    snprintf(a, sizeof a, "%d", out);
    snprintf(b, sizeof b, "%d", fd1);
    snprintf(c, sizeof c, "%d", fd2);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* Every descriptor is close-on-exec; the child keeps only its own, so
         * that one peer's death is end-of-file to the other. */
        const int keep[3] = {out, fd1, fd2};
        for (int i = 0; i < 3; i++)
            if (keep[i] >= 0 && fcntl(keep[i], F_SETFD, 0) != 0) _exit(127);
        execl("/proc/self/exe", g_self, "--child", scenario, a, b, c, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* How a child ended, in words; it is killed past CHILD_KILL_S. */
static void wait_child(pid_t pid, char *how, size_t len) {
    struct timespec t0, now, nap = {0, 10 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            snprintf(how, len, "lost");
            return;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= CHILD_KILL_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            snprintf(how, len, "killed after %d s", CHILD_KILL_S);
            return;
        }
        nanosleep(&nap, NULL);
    }
    if (WIFEXITED(st))
        snprintf(how, len, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(how, len, "%s", WTERMSIG(st) == SIGALRM ? "hung (alarm)" : strsignal(WTERMSIG(st)));
    else
        snprintf(how, len, "status 0x%x", st);
}

#define MAX_LINES 64
static char *g_lines[MAX_LINES];
static int g_nlines;

/* Reads the children's lines from `fd` (all written: the children are gone)
 * and adds a "missing" line for each behaviour of `names` they did not write. */
static int collect(int fd, const char *const *names, const char *how) {
    char buf[16384];
    size_t used = 0;
    ssize_t n;
    while (used < sizeof buf - 1 && (n = read(fd, buf + used, sizeof buf - 1 - used)) != 0) {
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        used += (size_t)n;
    }
    buf[used] = 0;
    close(fd);
    int missing = 0;
    for (char *save, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        if (g_nlines < MAX_LINES) g_lines[g_nlines++] = strdup(l);
    for (const char *const *b = names; *b; b++) {
        size_t len = strlen(*b);
        int found = 0;
        for (int i = 0; i < g_nlines && !found; i++)
            found = strncmp(g_lines[i], *b, len) == 0 && g_lines[i][len] == ',';
        if (!found && g_nlines < MAX_LINES) {
            char line[256];
            snprintf(line, sizeof line, "%s,missing,the scenario's child: %s", *b, how);
            g_lines[g_nlines++] = strdup(line);
            missing++;
        }
    }
    return missing;
}

static int run_one(const char *scenario, const char *const *names) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return 1;
    pid_t pid = spawn(scenario, p[1], -1, -1);
    close(p[1]);
    char how[64];
    if (pid < 0) snprintf(how, sizeof how, "fork failed");
    else wait_child(pid, how, sizeof how);
    return collect(p[0], names, how);
}

static int run_ipc(const char *const *names) {
    int p[2], sv[2], go[2];
    if (pipe2(p, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0 ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    pid_t e = spawn("exporter", p[1], sv[0], -1);
    pid_t i = spawn("importer", p[1], sv[1], go[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
    close(go[0]);
    char how_e[64] = "fork failed", how_i[64] = "fork failed", how[160];
    if (e > 0) wait_child(e, how_e, sizeof how_e);
    ssize_t w = write(go[1], "x", 1); /* the exporter has exited: open its last handle */
    (void)w;
    close(go[1]);
    if (i > 0) wait_child(i, how_i, sizeof how_i);
    snprintf(how, sizeof how, "exporter %s; importer %s", how_e, how_i);
    return collect(p[0], names, how);
}

static int probe(const char *csv) {
    signal(SIGPIPE, SIG_IGN); /* a child that died early: write() fails instead */
    int lr = load_driver();
    if (lr == -1) {
        printf("cuda_probe: no CUDA driver (%s): skipped\n", g_load_error);
        return 77;
    }
    if (lr == -2) {
        fprintf(stderr, "cuda_probe: %s\n", g_load_error);
        return 1;
    }
    CUresult rc = cu.cuInit(0);
    int count = 0, version = 0;
    if (rc == CUDA_SUCCESS) rc = cu.cuDeviceGetCount(&count);
    if (rc == CUDA_ERROR_NO_DEVICE || rc == CUDA_ERROR_STUB_LIBRARY ||
        (rc == CUDA_SUCCESS && count == 0)) {
        printf("cuda_probe: no CUDA device (cuInit: %d): skipped\n", (int)rc);
        return 77;
    }
    if (rc) {
        fprintf(stderr, "cuda_probe: cuInit or cuDeviceGetCount failed: %d\n", (int)rc);
        return 1;
    }
    char name[128] = "?", obs[32];
    CUdevice dev;
    if (cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS) cu.cuDeviceGetName(name, sizeof name, dev);
    cu.cuDriverGetVersion(&version);

    static const char *const alloc_names[] = {"align_1", "align_256", "align_4096",
        "align_65536", "align_1048576", "small_share_2m", "range_1", NULL};
    static const char *const host_names[] = {"hostwc_device_pointer", "hostmap_device_pointer", NULL};
    static const char *const ipc_names[] = {"repeat_open", "ipc_address", "interior_close", "reuse_address",
        "reuse_open_while_mapped", "repeat_open_close", "reuse_open_after_close",
        "own_process_open", "open_after_exit", NULL};
    static const char *const fork_names[] = {"fork_child", "fork_child_init", "fork_parent_after",
                                             NULL};
    static const char *const teardown_names[] = {"teardown", NULL};

    FILE *f = csv ? fopen(csv, "w") : NULL;
    if (csv && !f) {
        perror(csv);
        return 1;
    }
    char line[256];
    snprintf(line, sizeof line, "driver_version,%d,%s", version, name);
    g_lines[g_nlines++] = strdup(line);
    snprintf(obs, sizeof obs, "%d", count);
    snprintf(line, sizeof line, "device_count,%s,", obs);
    g_lines[g_nlines++] = strdup(line);

    /* Lines are written after each scenario: a probe stopped from outside
     * still leaves what it learnt. */
    int missing = 0, shown = 0;
    printf("behaviour,observed,detail\n");
    if (f) fprintf(f, "behaviour,observed,detail\n");
    for (int s = 0; s < 6; s++) {
        switch (s) {
        case 1: missing += run_one("alloc", alloc_names); break;
        case 2: missing += run_one("hostmem", host_names); break;
        case 3: missing += run_ipc(ipc_names); break;
        case 4: missing += run_one("fork", fork_names); break;
        case 5: missing += run_one("teardown", teardown_names); break;
        }
        for (; shown < g_nlines; shown++) {
            printf("%s\n", g_lines[shown]);
            if (f) fprintf(f, "%s\n", g_lines[shown]);
        }
        fflush(stdout);
        if (f) fflush(f);
    }
    if (f && fclose(f) != 0) return 1;
    if (missing) fprintf(stderr, "cuda_probe: %d behaviour(s) not recorded\n", missing);
    return missing ? 1 : 0;
}

/* ---- --expect ---- */

/* The second field of `line` into `out` ("" when there is none). */
static void field2(const char *line, char *out, size_t len) {
    const char *a = strchr(line, ','), *b;
    out[0] = 0;
    if (!a) return;
    a++;
    b = strchr(a, ',');
    size_t n = b ? (size_t)(b - a) : strcspn(a, "\r\n");
    if (n >= len) n = len - 1;
    memcpy(out, a, n);
    out[n] = 0;
}

static int compare(const char *observed_csv, const char *expected_csv) {
    FILE *e = fopen(expected_csv, "r");
    if (!e) {
        perror(expected_csv);
        return 1;
    }
    if (observed_csv) { /* from a file instead of this run */
        FILE *o = fopen(observed_csv, "r");
        if (!o) {
            perror(observed_csv);
            fclose(e);
            return 1;
        }
        char l[512];
        while (fgets(l, sizeof l, o) && g_nlines < MAX_LINES) {
            l[strcspn(l, "\r\n")] = 0;
            if (*l && strncmp(l, "behaviour,", 10) != 0) g_lines[g_nlines++] = strdup(l);
        }
        fclose(o);
    }
    char l[512], want[64], got[64];
    int bad = 0, checked = 0;
    while (fgets(l, sizeof l, e)) {
        l[strcspn(l, "\r\n")] = 0;
        if (!*l || *l == '#' || strncmp(l, "behaviour,", 10) == 0) continue;
        size_t len = strcspn(l, ",");
        field2(l, want, sizeof want);
        const char *line = NULL;
        for (int i = 0; i < g_nlines && !line; i++)
            if (strncmp(g_lines[i], l, len) == 0 && g_lines[i][len] == ',') line = g_lines[i];
        if (line) field2(line, got, sizeof got);
        int ok = line && (strcmp(want, "record") == 0 || strcmp(want, got) == 0);
        checked++;
        if (!ok) bad++;
        printf("  %-26.*s %-10s %-14s %s\n", (int)len, l, ok ? (strcmp(want, "record") ? "ok" : "recorded") : "MISMATCH",
               line ? got : "(no line)", strcmp(want, "record") ? want : "");
    }
    fclose(e);
    printf("cuda_probe: %d of %d expected answers differ (%s)\n", bad, checked, expected_csv);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    g_self = argv[0];
    if (argc == 6 && strcmp(argv[1], "--child") == 0) {
        const char *s = argv[2];
        g_out = atoi(argv[3]);
        int fd1 = atoi(argv[4]), fd2 = atoi(argv[5]);
        alarm(CHILD_ALARM_S);
        if (strcmp(s, "teardown") == 0) {
            /* before the driver is loaded and initialised */
            if (atexit(teardown_handler) != 0) return 1;
        }
        if (load_driver() != 0) return 1;
        if (strcmp(s, "alloc") == 0) return child_alloc();
        if (strcmp(s, "hostmem") == 0) return child_hostmem();
        if (strcmp(s, "exporter") == 0) return child_exporter(fd1);
        if (strcmp(s, "importer") == 0) return child_importer(fd1, fd2);
        if (strcmp(s, "fork") == 0) return child_fork();
        if (strcmp(s, "teardown") == 0) return child_teardown();
        return 2;
    }
    const char *csv = NULL, *expect = NULL, *from = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
        else if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc) expect = argv[++i];
        else if (strcmp(argv[i], "--compare") == 0 && i + 1 < argc) from = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--csv FILE] [--expect EXPECTED.csv]\n"
                            "       %s --compare OBSERVED.csv --expect EXPECTED.csv\n",
                    argv[0], argv[0]);
            return 2;
        }
    }
    if (from) return expect ? compare(from, expect) : 2;
    int rc = probe(csv);
    fflush(stdout);
    if (rc != 0 || !expect) return rc;
    return compare(NULL, expect);
}
