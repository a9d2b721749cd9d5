/* hetmem tests — run under libhetmem_proxy.so only (glibc aborts on the
 * first of these): frees the pool must refuse, on each of the proxy's free
 * paths (the block allocated last, a block of the word being handed out, a
 * block of a slab's bitmap, a remote free, an interior pointer), change
 * nothing: the blocks allocated afterwards are all distinct, and none is a
 * block still live. Prints "ok" and exits 0. SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define N 4096

/* The compiler sees malloc and free as builtins: every pointer goes
 * through here, so that it neither drops a pair nor warns about the
 * frees made on purpose. */
static void *(*volatile launder_fn)(void *);
static void *same_ptr(void *p) { return p; }
static void *launder(void *p) { return launder_fn(p); }

static void *free_twice(void *p) {
    free(launder(p));
    free(launder(p));
    return NULL;
}

static int cmp(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    launder_fn = same_ptr;
    /* The block allocated last. */
    char *p = launder(malloc(40));
    free(launder(p));
    free(launder(p));
    /* A block of the word being handed out, not the last one. */
    char *a = launder(malloc(40)), *b = launder(malloc(40));
    free(launder(a));
    free(launder(b));
    free(launder(a));
    /* Blocks of slab bitmaps (their words no longer handed out); every
     * 64th stays live, so that no slab goes back to the pool (a pointer
     * into memory the pool no longer maps is glibc's to judge). */
    void **v = malloc(N * sizeof *v);
    if (!v) return 1;
    for (int i = 0; i < N; i++) v[i] = launder(malloc(48));
    for (int i = 0; i < N; i++)
        if (i % 64 != 63) free(launder(v[i]));
    free(launder(v[0]));
    free(launder(v[N / 2]));
    /* An interior pointer: refused, the block stays live. */
    char *q = launder(malloc(64));
    free(launder(q + 16));
    /* A remote double free. */
    pthread_t t;
    char *r = malloc(40);
    if (pthread_create(&t, NULL, free_twice, r) || pthread_join(t, NULL)) return 1;
    /* Everything allocated from here on is distinct, and not q. */
    enum { M = 3 * N };
    uintptr_t *all = malloc(M * sizeof *all);
    if (!all) return 1;
    for (int i = 0; i < M; i++) {
        all[i] = (uintptr_t)malloc(i % 3 == 0 ? 40 : i % 3 == 1 ? 48 : 64);
        if (!all[i]) return 1;
        *(char *)all[i] = 1;
    }
    qsort(all, M, sizeof *all, cmp);
    for (int i = 0; i < M; i++) {
        int live = all[i] == (uintptr_t)q;
        for (int j = 63; j < N && !live; j += 64) live = all[i] == (uintptr_t)v[j];
        if (live) {
            printf("a live block was handed out again\n");
            return 1;
        }
        if (i && all[i] == all[i - 1]) {
            printf("a block was handed out twice\n");
            return 1;
        }
    }
    printf("ok\n");
    return 0;
}
