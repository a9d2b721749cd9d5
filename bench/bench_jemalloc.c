/* hetmem benchmark: the jemalloc pool against jemalloc itself, in one run.
 * SPDX-License-Identifier: MIT
 *
 * The workloads are those of bench_native (issue 4; both use workloads.c), so
 * the figures compare directly. Implementations (the same workload code, only
 * alloc/free differ):
 *   je-pool       hm_pool_malloc/hm_pool_free on a jemalloc pool over the OS
 *                 provider (tracked; hm_pool_free's ownership check is the
 *                 pool's own, through jemalloc's extent map: the pool sets
 *                 HM_POOL_OPS_VALIDATES_POINTERS, so no tracker lookup).
 *   je-pool-untr  the same pool with HM_POOL_FLAG_NO_TRACKING (the tracker
 *                 records nothing when the arena takes provider memory; the
 *                 per-call paths are the same).
 *   je-pool-notc  tracked, without thread caches (every call takes the arena's
 *                 locks, as UMF's jemalloc pool does).
 *   malloc        malloc/free of this process, named after the preloaded
 *                 library. Unless --no-reexec is given (or the build is
 *                 sanitized), the program re-executes itself once with
 *                 LD_PRELOAD=libjemalloc.so.2 (Debian's libjemalloc2) when
 *                 that library exists and nothing is preloaded yet, so the
 *                 baseline is plain jemalloc (malloc fast path, automatic
 *                 tcache and arena).
 *
 * Cases (one op = one allocation and its free):
 *   pairs S       malloc immediately followed by free, sizes S
 *   random S      10,000 live slots; each op frees a random slot and
 *                 allocates a block of a random size S into it
 *   remote 64B    one thread allocates 64-byte objects, another frees them
 *   xmalloc 2+2   2 producers allocate batches of 4096 objects (16..512 B),
 *                 2 consumers free whole batches (the xmalloc-test pattern)
 * Target (issue 5): je-pool within 1.3x of plain jemalloc on the local mixes. */
#include "harness.h"
#include "workloads.h"

#include <hetmem/hetmem.h>
#include <hetmem/pools/jemalloc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define JEMALLOC_SO "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"

/* ---- set-up of each implementation ---- */

static int make_pool(impl_ctx_t *c, uint32_t flags, bool tcache) {
    hm_provider_t *prov;
    if (hm_os_provider_create(NULL, &prov) != HM_SUCCESS) return 1;
    hm_jemalloc_params_t *jp;
    if (hm_jemalloc_params_create(&jp) != HM_SUCCESS) return 1;
    hm_jemalloc_params_set_tcache(jp, tcache);
    hm_result_t r = hm_jemalloc_pool_create(prov, jp, flags | HM_POOL_FLAG_OWN_PROVIDER, &c->pool);
    hm_jemalloc_params_destroy(jp);
    if (r != HM_SUCCESS) {
        fprintf(stderr, "bench_jemalloc: pool: %s\n", hm_result_string(r));
        hm_provider_destroy(prov);
        return 1;
    }
    c->kind = K_POOL;
    return 0;
}

static int setup_generic(const void *a, void **ctx, kind_t kind, uint32_t flags, bool tcache) {
    impl_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return 1;
    c->kind = kind;
    if (kind == K_POOL && make_pool(c, flags, tcache)) {
        free(c);
        return 1;
    }
    return wl_setup_finish(a, c, ctx);
}

static int setup_pool(const void *a, void **ctx) { return setup_generic(a, ctx, K_POOL, 0, true); }
static int setup_untracked(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, HM_POOL_FLAG_NO_TRACKING, true);
}
static int setup_notc(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_POOL, 0, false);
}
static int setup_malloc(const void *a, void **ctx) {
    return setup_generic(a, ctx, K_MALLOC, 0, true);
}


/* Re-execute once under Debian's jemalloc so that "malloc" is plain jemalloc. */
static void maybe_reexec(int argc, char **argv) {
#if defined(HM_SANITIZE_BUILD)
    (void)argc, (void)argv; /* a sanitizer runtime must come first: no preload */
#else
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--no-reexec")) return;
    const char *pre = getenv("LD_PRELOAD");
    if ((pre && *pre) || getenv("HM_BENCH_REEXECED") || access(JEMALLOC_SO, R_OK) != 0) return;
    setenv("LD_PRELOAD", JEMALLOC_SO, 1);
    setenv("HM_BENCH_REEXECED", "1", 1);
    execv("/proc/self/exe", argv);
    unsetenv("LD_PRELOAD"); /* exec failed: go on with this process's malloc */
#endif
}

int main(int argc, char **argv) {
    maybe_reexec(argc, argv);
    for (int i = 1; i < argc; i++) /* drop our own option before the harness sees it */
        if (!strcmp(argv[i], "--no-reexec")) {
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof(*argv));
            argc--;
            i--;
        }
    int rc;
    hm_bench_t *b = hm_bench_create("jemalloc", &argc, argv, &rc);
    if (!b) return rc;
    if (argc > 1) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[1]);
        hm_bench_finish(b);
        return 2;
    }
    static hm_bench_impl_t subject = {"je-pool", setup_pool, NULL, wl_teardown};
    static hm_bench_impl_t base[] = {
        {"je-pool-untr", setup_untracked, NULL, wl_teardown},
        {"je-pool-notc", setup_notc, NULL, wl_teardown},
        {NULL, setup_malloc, NULL, wl_teardown},
    };
    enum { NBASE = sizeof(base) / sizeof(base[0]) };
    base[NBASE - 1].name = wl_malloc_name();

    wl_run_cases(b, &subject, base, NBASE, &subject, base, NBASE);
    return hm_bench_finish(b);
}
