/* hetmem tests — libhetmem_mpi under mpirun (4 ranks): sharing one
 * allocation per rank and reading and writing every peer's directly; ranks
 * that share nothing; a wrong pointer or a NULL result on one rank failing
 * the call identically on every rank with nothing left shared; an exporting
 * rank's pool destroyed while its peers map its memory (the bytes stay);
 * unshare; the descriptor transport the environment asks for
 * (HM_MPI_TRANSPORT: CTest runs it with pidfd and with socket).
 * SPDX-License-Identifier: MIT */
#include "harness.h"

#include <hetmem/mpi.h>

#include <stdlib.h>
#include <string.h>

#define SIZE (1u << 20)

static int g_rank, g_size;

static hm_pool_t *shared_pool(void) {
    hm_os_params_t *p;
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_os_params_create(&p));
    REQUIRE_OK(hm_os_params_set_visibility(p, HM_OS_SHARED));
    REQUIRE_OK(hm_os_provider_create(p, &prov));
    hm_os_params_destroy(p);
    REQUIRE_OK(hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    return pool;
}

static unsigned char pat(int rank, size_t i) { return (unsigned char)(rank * 31 + i * 7); }

/* Every rank shares a block; each reads every peer's, writes a marker into
 * each, and finds every peer's marker in its own. */
static void test_share(hm_pool_t *pool, const char *want_transport) {
    hm_test_set_context("share, read, write"); if (getenv("HM_T")) fprintf(stderr, "rank %d: %s\n", g_rank, "share, read, write");
    unsigned char *mine = hm_pool_malloc(pool, SIZE);
    REQUIRE(mine);
    for (size_t i = 0; i < SIZE; i++) mine[i] = pat(g_rank, i);
    hm_mpi_shared_t *s = NULL;
    REQUIRE_OK(hm_mpi_share(MPI_COMM_WORLD, pool, mine, &s));
    CHECK_EQ(hm_mpi_shared_unreachable(s), 0);
    CHECK(hm_mpi_shared_peer(s, g_rank) == mine);
    CHECK(hm_mpi_shared_peer(s, -1) == NULL && hm_mpi_shared_peer(s, g_size) == NULL);
    if (want_transport)
        CHECK_MSG(strcmp(hm_mpi_shared_transport(s), want_transport) == 0, "transport %s",
                  hm_mpi_shared_transport(s));
    for (int r = 0; r < g_size; r++) {
        unsigned char *p = hm_mpi_shared_peer(s, r);
        CHECK(hm_mpi_shared_reachable(s, r));
        CHECK_MSG(p != NULL && hm_mpi_shared_size(s, r) >= SIZE, "rank %d's block", r);
        if (!p) continue;
        size_t bad = 0;
        for (size_t i = 0; i < SIZE; i++) bad += p[i] != pat(r, i);
        CHECK_MSG(bad == 0, "rank %d's block: %zu bytes differ", r, bad);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* everyone has read before anyone writes */
    for (int r = 0; r < g_size; r++) {
        unsigned char *p = hm_mpi_shared_peer(s, r);
        if (p && r != g_rank) p[SIZE - 1 - (size_t)g_rank] = (unsigned char)(0xa0 + g_rank);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int r = 0; r < g_size; r++)
        if (r != g_rank)
            CHECK_MSG(mine[SIZE - 1 - (size_t)r] == (unsigned char)(0xa0 + r),
                      "rank %d's write into our block", r);
    CHECK_OK(hm_mpi_unshare(s));
    CHECK_OK(hm_pool_free(pool, mine));
}

/* Odd ranks share nothing. */
static void test_some_share(hm_pool_t *pool) {
    hm_test_set_context("ranks that share nothing"); if (getenv("HM_T")) fprintf(stderr, "rank %d: %s\n", g_rank, "ranks that share nothing");
    unsigned char *mine = g_rank % 2 ? NULL : hm_pool_malloc(pool, 4096);
    if (mine) memset(mine, g_rank + 1, 4096);
    hm_mpi_shared_t *s = NULL;
    REQUIRE_OK(hm_mpi_share(MPI_COMM_WORLD, pool, mine, &s));
    for (int r = 0; r < g_size; r++) {
        unsigned char *p = hm_mpi_shared_peer(s, r);
        if (r % 2) {
            CHECK(p == NULL && hm_mpi_shared_size(s, r) == 0);
        } else {
            CHECK_MSG(p && p[100] == r + 1, "rank %d's block", r);
        }
    }
    CHECK_OK(hm_mpi_unshare(s));
    if (mine) CHECK_OK(hm_pool_free(pool, mine));
}

/* Wrong on one rank: every rank gets the same error, nothing is shared. */
static void test_errors(hm_pool_t *pool) {
    hm_test_set_context("errors agreed by every rank"); if (getenv("HM_T")) fprintf(stderr, "rank %d: %s\n", g_rank, "errors agreed by every rank");
    char stack[64];
    unsigned char *mine = hm_pool_malloc(pool, 4096);
    REQUIRE(mine);
    hm_mpi_shared_t *s = (hm_mpi_shared_t *)1;
    /* rank 2: memory hetmem does not know */
    hm_result_t r = hm_mpi_share(MPI_COMM_WORLD, pool, g_rank == 2 ? (void *)stack : mine, &s);
    CHECK_RES(r, HM_ERROR_NOT_FOUND);
    CHECK(s == NULL);
    /* rank 0: no place for the result */
    r = hm_mpi_share(MPI_COMM_WORLD, pool, mine, g_rank == 0 ? NULL : &s);
    CHECK_RES(r, HM_ERROR_INVALID_ARGUMENT);
    /* rank 1: no pool to open the others' blocks through */
    r = hm_mpi_share(MPI_COMM_WORLD, g_rank == 1 ? NULL : pool, mine, &s);
    CHECK_RES(r, HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_mpi_unshare(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_mpi_share(MPI_COMM_NULL, pool, mine, &s), HM_ERROR_INVALID_ARGUMENT);
    /* nothing stayed exported or mapped: a normal share works */
    hm_ipc_cache_stats_t st;
    CHECK_OK(hm_ipc_get_cache_stats(&st));
    CHECK_EQ(st.in_use, 0);
    REQUIRE_OK(hm_mpi_share(MPI_COMM_WORLD, pool, mine, &s));
    CHECK_OK(hm_mpi_unshare(s));
    CHECK_OK(hm_pool_free(pool, mine));
}

/* Rank 0 frees its block and destroys its pool while its peers map it: they
 * still read its bytes until they unshare. */
static void test_destroy_while_mapped(hm_pool_t *importer) {
    hm_test_set_context("exporting pool destroyed while peers map it"); if (getenv("HM_T")) fprintf(stderr, "rank %d: %s\n", g_rank, "exporting pool destroyed while peers map it");
    hm_pool_t *own = shared_pool();
    unsigned char *mine = hm_pool_malloc(own, SIZE);
    REQUIRE(mine);
    for (size_t i = 0; i < SIZE; i++) mine[i] = pat(g_rank + 10, i);
    hm_mpi_shared_t *s = NULL;
    REQUIRE_OK(hm_mpi_share(MPI_COMM_WORLD, importer, mine, &s));
    if (g_rank == 0) {
        CHECK_OK(hm_pool_free(own, mine));
        CHECK_OK(hm_pool_destroy(own));
        own = NULL;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned char *p = hm_mpi_shared_peer(s, 0);
    if (g_rank != 0 && p) {
        size_t bad = 0;
        for (size_t i = 0; i < SIZE; i++) bad += p[i] != pat(10, i);
        CHECK_MSG(bad == 0, "rank 0's block after its pool's destroy: %zu bytes differ", bad);
    }
    CHECK_OK(hm_mpi_unshare(s));
    if (own) {
        CHECK_OK(hm_pool_free(own, mine));
        CHECK_OK(hm_pool_destroy(own));
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *t = getenv("HM_MPI_TRANSPORT");
    hm_pool_t *pool = shared_pool();
    test_share(pool, t && *t ? t : NULL);
    test_some_share(pool);
    test_errors(pool);
    test_destroy_while_mapped(pool);
    CHECK_OK(hm_pool_destroy(pool));
    int failed = hm_test_failed_count() != 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    int rc = hm_test_finish();
    MPI_Finalize();
    return any ? 1 : rc;
}
