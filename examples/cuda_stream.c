/* hetmem example: stream-ordered allocation of NVIDIA GPU memory.
 * SPDX-License-Identifier: MIT
 *
 *   cuda_stream
 *
 * A native pool over device memory of GPU 0; two CUDA streams. Each
 * iteration allocates a block on a stream, queues work on it there (a
 * memset stands in for a kernel), and frees it on the same stream without
 * waiting: the next allocation on that stream may take the block at once,
 * because stream order runs the old work first. The other stream gets the
 * block only once the first stream's work is done. At the end the program
 * synchronises, reads one block back and prints the stream cache's
 * figures.
 *
 * The streams are the driver's (cuStreamCreate, through the libcuda.so.1
 * hetmem uses; a program with the CUDA runtime passes its cudaStream_t the
 * same way). Without an NVIDIA GPU it says so and exits 77; the project's
 * test driver stands in:
 *   HM_CUDA_DRIVER=$PWD/build/test/cuda/driver/libcuda.so.1 cuda_stream
 */
#include <hetmem/hetmem.h>
#include <hetmem/providers/cuda.h>
#include <hetmem/stream.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cu_result;         /* CUresult */
typedef void *cu_stream;       /* CUstream */
typedef void *cu_context;      /* CUcontext */
typedef unsigned long long cu_ptr; /* CUdeviceptr */

static struct {
    cu_result (*primary_retain)(cu_context *, int);
    cu_result (*primary_release)(int);
    cu_result (*ctx_set)(cu_context);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_destroy)(cu_stream);
    cu_result (*stream_sync)(cu_stream);
    cu_result (*memset_async)(cu_ptr, unsigned char, size_t, cu_stream);
    cu_result (*copy_dtoh)(void *, cu_ptr, size_t);
} cu;

static int load_driver(void) {
    const char *path = getenv("HM_CUDA_DRIVER");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    *(void **)&cu.primary_retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.primary_release = dlsym(h, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu.ctx_set = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.stream_create = dlsym(h, "cuStreamCreate");
    *(void **)&cu.stream_destroy = dlsym(h, "cuStreamDestroy_v2");
    *(void **)&cu.stream_sync = dlsym(h, "cuStreamSynchronize");
    *(void **)&cu.memset_async = dlsym(h, "cuMemsetD8Async");
    *(void **)&cu.copy_dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    return cu.primary_retain && cu.primary_release && cu.ctx_set && cu.stream_create &&
                   cu.stream_destroy && cu.stream_sync && cu.memset_async && cu.copy_dtoh
               ? 0
               : -1;
}

int main(void) {
    hm_provider_t *prov;
    hm_result_t r = hm_cuda_provider_create(NULL, &prov); /* GPU 0, device memory */
    if (r == HM_ERROR_NOT_SUPPORTED) {
        printf("cuda_stream: no NVIDIA GPU with a driver here: skipped\n");
        return 77;
    }
    if (r != HM_SUCCESS || load_driver() != 0) {
        fprintf(stderr, "cuda_stream: %s\n", r ? hm_result_string(r) : "driver entry points");
        return 1;
    }
    hm_pool_t *pool;
    if ((r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool)) != HM_SUCCESS) {
        fprintf(stderr, "cuda_stream: pool: %s\n", hm_result_string(r));
        return 1;
    }
    cu_context ctx; /* the primary context of GPU 0, which the provider uses */
    cu_stream s[2];
    if (cu.primary_retain(&ctx, 0) || cu.ctx_set(ctx) || cu.stream_create(&s[0], 1) ||
        cu.stream_create(&s[1], 1)) {
        fprintf(stderr, "cuda_stream: no streams\n");
        return 1;
    }
    const size_t n = 1u << 20;
    int status = 0;
    void *last = NULL;
    for (int i = 0; i < 64 && !status; i++) {
        cu_stream st = s[i % 2];
        void *p = hm_pool_malloc_async(pool, n, st);
        if (!p || cu.memset_async((cu_ptr)(uintptr_t)p, (unsigned char)i, n, st)) {
            fprintf(stderr, "cuda_stream: iteration %d failed\n", i);
            status = 1;
            break;
        }
        if (i == 63) {
            last = p; /* kept: read back below */
            break;
        }
        if ((r = hm_pool_free_async(pool, p, st)) != HM_SUCCESS) {
            fprintf(stderr, "cuda_stream: free_async: %s\n", hm_result_string(r));
            status = 1;
        }
    }
    unsigned char back[16] = {0};
    if (!status && (cu.stream_sync(s[1]) || cu.copy_dtoh(back, (cu_ptr)(uintptr_t)last, 16) ||
                    back[0] != 63 || back[15] != 63)) {
        fprintf(stderr, "cuda_stream: the last block reads %u, not 63\n", back[0]);
        status = 1;
    }
    if (last) hm_pool_free_async(pool, last, s[1]);
    hm_stream_stats_t stats;
    hm_pool_get_stream_stats(pool, &stats);
    printf("cuda_stream: 64 blocks of 1 MiB on 2 streams: %llu from the block freed on their "
           "stream, %llu from the other stream's (its work done), %llu from the pool; %zu "
           "cached\n", (unsigned long long)stats.same_stream,
           (unsigned long long)stats.other_stream, (unsigned long long)stats.from_pool,
           stats.cached_blocks);
    for (int i = 0; i < 2; i++) { /* forget a stream before destroying it */
        hm_pool_stream_forget(pool, s[i]);
        cu.stream_destroy(s[i]);
    }
    if (hm_pool_destroy(pool) != HM_SUCCESS) status = 1; /* waits for the last events */
    cu.ctx_set(NULL);
    cu.primary_release(0);
    if (!status) printf("cuda_stream: ok\n");
    return status;
}
