/* hetmem example: two processes share NVIDIA GPU memory through a pool.
 * SPDX-License-Identifier: MIT
 *
 *   cuda_ipc            (starts the second process itself)
 *
 * The first process allocates device memory from a native pool over the
 * CUDA provider (device ordinal 0, its primary context), writes a pattern
 * into it with the provider's copy (the CPU must not touch device memory),
 * exports it as an IPC handle and starts a second process (this program
 * again, exec'd), which opens the handle through a pool of its own, reads
 * the memory back, checks it, and writes its answer into the first page.
 * The first process then checks the answer in its own allocation. A CUDA
 * handle travels by value (no descriptor), here over a unix socket.
 *
 * Without an NVIDIA GPU (no libcuda.so.1, or no device) it says so and
 * exits 77 ("skipped"). On a machine without one, the project's test
 * driver stands in:
 *   HM_CUDA_DRIVER=$PWD/build/test/cuda/driver/libcuda.so.1 cuda_ipc
 */
#include <hetmem/hetmem.h>
#include <hetmem/providers/cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE (4u << 20)
#define ANSWER 4096u

static unsigned char host[SIZE];

static int fail(const char *who, const char *what, hm_result_t r) {
    const char *msg = NULL;
    int64_t code = hm_last_native_error(&msg);
    fprintf(stderr, "cuda_ipc (%s): %s: %s", who, what, hm_result_string(r));
    if (code) fprintf(stderr, " (%s: %lld)", msg ? msg : "native error", (long long)code);
    fprintf(stderr, "\n");
    return 1;
}

static unsigned char pattern(size_t i, unsigned seed) {
    return (unsigned char)((i * 131u + seed) >> 3);
}

/* A native pool over device memory of GPU 0. */
static hm_result_t device_pool(hm_provider_t **prov, hm_pool_t **pool) {
    hm_result_t r = hm_cuda_provider_create(NULL, prov); /* ordinal 0, device memory */
    if (r) return r;
    r = hm_native_pool_create(*prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, pool);
    if (r) hm_provider_destroy(*prov);
    return r;
}

static int second(int sock) {
    hm_provider_t *prov;
    hm_pool_t *pool;
    hm_ipc_channel_t *ch;
    hm_result_t r;
    if ((r = device_pool(&prov, &pool))) return fail("second", "device pool", r);
    if ((r = hm_ipc_channel_from_fd(sock, &ch))) return fail("second", "channel", r);
    unsigned char handle[4096];
    size_t len = 0;
    int fd = -1;
    if ((r = hm_ipc_channel_recv(ch, handle, sizeof(handle), &len, &fd)))
        return fail("second", "receive", r);
    void *dev = NULL;
    if ((r = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)handle, len, fd, &dev)))
        return fail("second", "hm_ipc_open", r);
    if (fd >= 0) close(fd);
    if ((r = hm_provider_copy(prov, host, dev, SIZE))) return fail("second", "copy", r);
    size_t bad = 0;
    for (size_t i = 0; i < SIZE; i++) bad += host[i] != pattern(i, 1);
    for (size_t i = 0; i < ANSWER; i++) host[i] = pattern(i, 2);
    if ((r = hm_provider_copy(prov, dev, host, ANSWER))) return fail("second", "copy", r);
    printf("second process %d: opened %u MiB of device memory at %p, %zu bytes differ from "
           "the pattern; wrote its answer into the first %u bytes\n",
           (int)getpid(), SIZE >> 20, dev, bad, ANSWER);
    if ((r = hm_ipc_close(dev))) return fail("second", "hm_ipc_close", r);
    char ack = bad == 0;
    (void)hm_ipc_channel_send_bytes(ch, &ack, 1);
    hm_ipc_channel_destroy(ch);
    hm_pool_destroy(pool);
    return bad != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--second") == 0) return second(atoi(argv[2]));

    hm_provider_t *prov;
    hm_pool_t *pool;
    hm_result_t r = device_pool(&prov, &pool);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        printf("cuda_ipc: no NVIDIA GPU here (no libcuda.so.1 or no device): skipped\n");
        return 77;
    }
    if (r) return fail("first", "device pool", r);
    hm_device_id_t dev_id;
    hm_provider_get_device(prov, &dev_id);
    unsigned char *dev = hm_pool_malloc(pool, SIZE);
    if (!dev) return fail("first", "hm_pool_malloc", HM_ERROR_OUT_OF_MEMORY);
    for (size_t i = 0; i < SIZE; i++) host[i] = pattern(i, 1);
    if ((r = hm_provider_copy(prov, dev, host, SIZE))) return fail("first", "copy", r);
    hm_ipc_handle_t *h;
    size_t len;
    if ((r = hm_ipc_get(dev, &h, &len))) return fail("first", "hm_ipc_get", r);

    printf("first process %d: %u MiB of device memory on GPU %d at %p, exported as a %zu-byte "
           "handle\n", (int)getpid(), SIZE >> 20, (int)dev_id.ordinal, (void *)dev, len);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return fail("first", "socketpair", HM_ERROR_UNKNOWN);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* a fresh process: GPU drivers do not survive fork */
        close(sv[0]);
        char fdarg[16];
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        execl("/proc/self/exe", argv[0], "--second", fdarg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    hm_ipc_channel_t *ch;
    if ((r = hm_ipc_channel_from_fd(sv[0], &ch))) return fail("first", "channel", r);
    if ((r = hm_ipc_channel_send(ch, h, len))) return fail("first", "send", r);
    char ack = 0;
    size_t got = 0;
    (void)hm_ipc_channel_recv_bytes(ch, &ack, 1, &got);
    int st = 0;
    waitpid(pid, &st, 0);
    if (hm_provider_copy(prov, host, dev, ANSWER) != HM_SUCCESS) return fail("first", "copy", r);
    size_t bad = 0;
    for (size_t i = 0; i < ANSWER; i++) bad += host[i] != pattern(i, 2);
    hm_ipc_put(h);
    hm_pool_free(pool, dev);
    hm_ipc_channel_destroy(ch);
    hm_pool_destroy(pool);
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && got == 1 && ack == 1 && bad == 0;
    printf("first process: the second process %s; its answer %s in our device memory\n",
           ok ? "read every byte right" : "FAILED", bad ? "is MISSING" : "is there");
    return ok ? 0 : 1;
}
