/* hetmem tests — a program that dlopen()s libhetmem.so (not linked to it)
 * uses the jemalloc pool from several threads, closes the library, and keeps
 * running threads afterwards (libhetmem is -z nodelete: jemalloc's thread
 * destructors stay mapped). Self-contained: the harness would link hetmem.
 * Usage: test_jemalloc_dlopen /path/to/libhetmem.so
 * SPDX-License-Identifier: MIT */
#include <hetmem/hetmem.h>
#include <hetmem/pools/jemalloc.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failed;
#define EXPECT(cond)                                                       \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond); \
            __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);              \
        }                                                                  \
    } while (0)

static struct {
    hm_result_t (*os_create)(const hm_os_params_t *, hm_provider_t **);
    hm_result_t (*je_create)(hm_provider_t *, const hm_jemalloc_params_t *, uint32_t,
                             hm_pool_t **);
    void *(*malloc_)(hm_pool_t *, size_t);
    hm_result_t (*free_)(hm_pool_t *, void *);
    hm_result_t (*hfree)(void *);
    hm_pool_t *(*by_ptr)(const void *);
    hm_result_t (*destroy)(hm_pool_t *);
    const char *(*result_string)(hm_result_t);
} api;

static hm_pool_t *g_pool;

static void *worker(void *arg) {
    (void)arg;
    void *keep[256];
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 256; i++) {
            size_t size = (size_t)((i * 131 + round) % 40000) + 1;
            keep[i] = api.malloc_(g_pool, size);
            EXPECT(keep[i] != NULL);
            if (!keep[i]) continue;
            memset(keep[i], i, size);
            EXPECT(api.by_ptr(keep[i]) == g_pool);
        }
        for (int i = 0; i < 256; i++)
            if (keep[i]) EXPECT((i & 1 ? api.free_(g_pool, keep[i]) : api.hfree(keep[i])) == 0);
    }
    return NULL;
}

static void *idle(void *arg) { return arg; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s libhetmem.so\n", argv[0]);
        return 2;
    }
    /* Not linked: hetmem must not be loaded yet. */
    EXPECT(dlsym(RTLD_DEFAULT, "hm_pool_malloc") == NULL);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }
#define LOAD(field, name)                                          \
    do {                                                           \
        *(void **)&api.field = dlsym(lib, name);                   \
        if (!api.field) {                                          \
            fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());   \
            return 1;                                              \
        }                                                          \
    } while (0)
    LOAD(os_create, "hm_os_provider_create");
    LOAD(je_create, "hm_jemalloc_pool_create");
    LOAD(malloc_, "hm_pool_malloc");
    LOAD(free_, "hm_pool_free");
    LOAD(hfree, "hm_free");
    LOAD(by_ptr, "hm_pool_by_ptr");
    LOAD(destroy, "hm_pool_destroy");
    LOAD(result_string, "hm_result_string");
    hm_provider_t *prov = NULL;
    hm_result_t r = api.os_create(NULL, &prov);
    EXPECT(r == HM_SUCCESS);
    r = api.je_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_pool);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "hm_jemalloc_pool_create: %s\n", api.result_string(r));
        return 1;
    }
    pthread_t t[4];
    for (int i = 0; i < 4; i++) EXPECT(pthread_create(&t[i], NULL, worker, NULL) == 0);
    worker(NULL);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    /* malloc is still libc's (under a sanitizer: the sanitizer's, which
     * then is what the program binds to; either way not hetmem's). */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
#if defined(HM_SANITIZE_BUILD)
    Dl_info di;
    EXPECT(dladdr(dlsym(RTLD_DEFAULT, "malloc"), &di) && di.dli_fname &&
           !strstr(di.dli_fname, "hetmem"));
#else
    EXPECT(libc && dlsym(RTLD_DEFAULT, "malloc") == dlsym(libc, "malloc"));
#endif
    if (libc) dlclose(libc);
    EXPECT(dlsym(RTLD_DEFAULT, "hm_je_mallocx") == NULL);
    EXPECT(dlsym(lib, "hm_je_mallocx") == NULL);
    EXPECT(api.destroy(g_pool) == HM_SUCCESS);
    EXPECT(dlclose(lib) == 0);
    /* Threads still start and exit after the close. */
    for (int i = 0; i < 4; i++) {
        pthread_t x;
        EXPECT(pthread_create(&x, NULL, idle, NULL) == 0);
        pthread_join(x, NULL);
    }
    printf("dlopen test: %s\n", g_failed ? "FAILED" : "ok");
    return g_failed ? 1 : 0;
}
