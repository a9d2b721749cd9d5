// hetmem tests — every public header compiles as C++ and links from C++.
// SPDX-License-Identifier: MIT
//
// Each header is included on its own first (each must be self-contained),
// then the umbrella; a few calls prove the extern "C" linkage is right.
#include <hetmem/base.h>
#include <hetmem/provider.h>
#include <hetmem/pool.h>
#include <hetmem/providers/os.h>
#include <hetmem/providers/fixed.h>
#include <hetmem/pools/proxy.h>
#include <hetmem/pools/native.h>
#include <hetmem/pools/jemalloc.h>
#include <hetmem/providers/file.h>
#include <hetmem/providers/devdax.h>
#include <hetmem/ipc.h>
#include <hetmem/memspace.h>
#include <hetmem/providers/cuda.h>
#include <hetmem/providers/level_zero.h>
#ifdef HM_TEST_MPI
#include <hetmem/mpi.h>
#endif
#include <hetmem/hetmem.h>

#include <cstdio>
#include <cstring>
#include <vector>

static int failures = 0;

#define EXPECT(cond)                                                                 \
    do {                                                                             \
        if (!(cond)) {                                                               \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
            failures++;                                                              \
        }                                                                            \
    } while (0)

int main() {
    EXPECT(hm_version() == HM_VERSION);
    EXPECT(std::strcmp(hm_result_string(HM_SUCCESS), "success") == 0);
    EXPECT(hm_result_string(static_cast<hm_result_t>(-12345)) != nullptr);
    EXPECT(hm_memory_kind_string(HM_MEMORY_DEVICE) != nullptr);

    // The ops tables are usable from C++ (designated initializers are C++20;
    // here the tables are only read).
    const hm_provider_ops_t *ops = hm_os_provider_ops();
    EXPECT(ops != nullptr && ops->version == HM_PROVIDER_OPS_VERSION);
    EXPECT(hm_proxy_pool_ops() != nullptr);

    // A pool over the OS provider, from C++.
    hm_provider_t *provider = nullptr;
    hm_result_t r = hm_os_provider_create(nullptr, &provider);
    EXPECT(r == HM_SUCCESS);
    if (r == HM_SUCCESS) {
        hm_pool_t *pool = nullptr;
        r = hm_proxy_pool_create(provider, HM_POOL_FLAG_OWN_PROVIDER, &pool);
        EXPECT(r == HM_SUCCESS);
        if (r == HM_SUCCESS) {
            std::vector<void *> blocks;
            for (int i = 1; i <= 4; i++) {
                void *p = hm_pool_malloc(pool, static_cast<size_t>(i) * 1000);
                EXPECT(p != nullptr);
                if (p) {
                    std::memset(p, i, static_cast<size_t>(i) * 1000);
                    EXPECT(hm_pool_by_ptr(p) == pool);
                    blocks.push_back(p);
                }
            }
            for (void *p : blocks) EXPECT(hm_free(p) == HM_SUCCESS);
            EXPECT(hm_pool_destroy(pool) == HM_SUCCESS);
        } else {
            hm_provider_destroy(provider);
        }
    }
    std::printf("checks: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
