/* hetmem tests — a program for test_proxy_trace: one thread allocates
 * (malloc, calloc, aligned), another reallocs some blocks and frees them
 * all, so that its trace has frees of blocks made on another thread.
 * SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 20000 };
static void *_Atomic g_blocks[N];

static void *produce(void *arg) {
    (void)arg;
    for (size_t i = 0; i < N; i++) {
        size_t size = 1 + (i * 53) % 2048;
        void *p = i % 5 == 0 ? calloc(1, size) : i % 7 == 0 ? aligned_alloc(64, 128) : malloc(size);
        if (!p) abort();
        memset(p, (int)(i & 0xff), i % 7 == 0 && i % 5 ? 128 : size);
        atomic_store_explicit(&g_blocks[i], p, memory_order_release);
    }
    return NULL;
}

static void *consume(void *arg) {
    size_t *sum = arg;
    for (size_t i = 0; i < N; i++) {
        void *p;
        while (!(p = atomic_load_explicit(&g_blocks[i], memory_order_acquire))) {
        }
        if (i % 3 == 0) {
            void *q = realloc(p, 4096);
            if (!q) abort();
            p = q;
        }
        *sum += *(unsigned char *)p;
        free(p);
    }
    return NULL;
}

int main(void) {
    pthread_t a, b;
    size_t sum = 0;
    if (pthread_create(&a, NULL, produce, NULL) || pthread_create(&b, NULL, consume, &sum))
        return 1;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("%zu\n", sum);
    return 0;
}
