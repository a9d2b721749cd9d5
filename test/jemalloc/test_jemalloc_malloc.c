/* hetmem tests — the jemalloc pool does not replace or disturb the process's
 * malloc: with jemalloc pools in use (several threads, all size classes),
 * malloc & co. still resolve to libc's, libc's allocator still serves them,
 * and no jemalloc symbol is visible from libhetmem.so.
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <hetmem/pools/jemalloc.h>

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

static hm_pool_t *g_pool;

static void *use_pool(void *arg) {
    (void)arg;
    for (int i = 0; i < 5000; i++) {
        size_t size = (size_t)(i * 97 % 70000) + 1;
        void *p = hm_pool_malloc(g_pool, size);
        CHECK(p != NULL);
        if (p) memset(p, 1, size);
        void *q = malloc(size); /* libc's, side by side */
        CHECK(q != NULL);
        if (q) {
            memset(q, 2, size);
            CHECK(hm_pool_by_ptr(q) == NULL);
        }
        free(q);
        CHECK_OK(hm_pool_free(g_pool, p));
    }
    return NULL;
}

int main(void) {
    hm_test_set_context("malloc not replaced");
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    REQUIRE_OK(hm_jemalloc_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &g_pool));
    pthread_t t[3];
    for (int i = 0; i < 3; i++) REQUIRE(pthread_create(&t[i], NULL, use_pool, NULL) == 0);
    use_pool(NULL);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);

    /* The process's allocator functions are libc's (or, under a sanitizer,
     * the sanitizer's, which is then what the executable itself binds to). */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(libc != NULL);
    const char *fns[] = {"malloc", "free", "calloc", "realloc", "posix_memalign",
                         "aligned_alloc", "memalign", "valloc", "malloc_usable_size"};
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        void *def = dlsym(RTLD_DEFAULT, fns[i]);
        void *lc = dlsym(libc, fns[i]);
        CHECK_MSG(def != NULL, "%s not found", fns[i]);
#if defined(HM_SANITIZE_BUILD)
        /* The sanitizer runtime interposes malloc: it must be neither
         * hetmem's nor jemalloc's. */
        Dl_info di;
        CHECK(dladdr(def, &di) && di.dli_fname && !strstr(di.dli_fname, "hetmem"));
        (void)lc;
#else
        CHECK_MSG(def == lc, "%s resolves to %p, libc's is %p", fns[i], def, lc);
#endif
    }
    dlclose(libc);
    /* What the executable calls is what libc serves: a libc block has a
     * plausible libc usable size, and mallinfo2 sees it. */
    void *m = malloc(1000);
    REQUIRE(m);
    CHECK(malloc_usable_size(m) >= 1000 && malloc_usable_size(m) < 1100);
    free(m);

    /* No jemalloc symbol is reachable, from the process or from libhetmem. */
    const char *je[] = {"hm_je_mallocx", "hm_je_mallctl", "hm_je_malloc", "hm_je_dallocx",
                        "mallocx", "mallctl", "je_malloc", "je_mallocx", "hm_jei_arena_new",
                        "hm_je_malloc_conf", "malloc_conf"};
    Dl_info self;
    REQUIRE(dladdr((void *)hm_jemalloc_pool_ops, &self) && self.dli_fname);
    void *lib = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(lib != NULL);
    for (size_t i = 0; i < sizeof(je) / sizeof(je[0]); i++) {
        CHECK_MSG(dlsym(RTLD_DEFAULT, je[i]) == NULL, "%s is visible in the process", je[i]);
        CHECK_MSG(dlsym(lib, je[i]) == NULL, "%s is visible in %s", je[i], self.dli_fname);
    }
    /* malloc looked up through libhetmem's scope is still libc's. */
#if !defined(HM_SANITIZE_BUILD)
    void *lc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    CHECK(dlsym(lib, "malloc") == dlsym(lc, "malloc"));
    dlclose(lc);
#endif
    dlclose(lib);
    CHECK_OK(hm_pool_destroy(g_pool));
    return hm_test_finish();
}
