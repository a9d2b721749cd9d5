/* hetmem example: a halo exchange between MPI ranks that read their
 * neighbours' memory directly. SPDX-License-Identifier: MIT
 *
 *   mpirun -np 4 mpi_halo [steps]
 *
 * A 2-D grid of NX x NY cells is split into horizontal strips, one per rank.
 * Each rank keeps its strip, with one ghost row above and one below, in a
 * hetmem pool over shared host memory (the OS provider in shared mode; GPU
 * device memory works the same way through the CUDA or Level Zero provider,
 * with the provider's copy in place of the loads), and shares it once with
 * the ranks of its node (hm_mpi_share). Each step fills the ghost rows by
 * reading the neighbours' edge rows straight from their memory — no message,
 * no copy through MPI — then relaxes the interior (Jacobi, the average of
 * the four neighbours). Ranks on another node (hm_mpi_shared_reachable)
 * would need messages; this example runs where all ranks share a node.
 * At the end every rank checks every cell against the same computation done
 * on the whole grid alone, and rank 0 prints what was done. Exit 0 only if
 * every value is right on every rank. */
#include <hetmem/mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NX 256
#define NY_PER_RANK 64

static double initial(int gy, int x) { return (double)((gy * 31 + x * 17) % 101); }

/* One Jacobi step on rows [1, rows] of a grid with ghost rows 0 and rows+1
 * (fixed boundary: the first and last column and the grid's first and last
 * rows stay). */
static void relax(const double *in, double *out, int rows, int first_global, int ny) {
    for (int y = 1; y <= rows; y++) {
        int gy = first_global + y - 1;
        for (int x = 0; x < NX; x++) {
            double v = in[y * NX + x];
            if (x > 0 && x < NX - 1 && gy > 0 && gy < ny - 1)
                v = 0.25 * (in[(y - 1) * NX + x] + in[(y + 1) * NX + x] + in[y * NX + x - 1] +
                            in[y * NX + x + 1]);
            out[y * NX + x] = v;
        }
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int steps = argc > 1 ? atoi(argv[1]) : 50;
    if (steps < 1) steps = 50;
    const int rows = NY_PER_RANK, ny = rows * size, first = rank * rows;
    const size_t strip = (size_t)(rows + 2) * NX * sizeof(double);

    hm_os_params_t *op;
    hm_provider_t *prov;
    hm_pool_t *pool;
    hm_result_t r = hm_os_params_create(&op);
    if (!r) r = hm_os_params_set_visibility(op, HM_OS_SHARED);
    if (!r) r = hm_os_provider_create(op, &prov);
    hm_os_params_destroy(op);
    if (!r) r = hm_native_pool_create(prov, NULL, HM_POOL_FLAG_OWN_PROVIDER, &pool);
    if (r) {
        fprintf(stderr, "mpi_halo (rank %d): pool: %s\n", rank, hm_result_string(r));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Two strips (in, out) swapped each step; each is shared once. */
    double *grid[2];
    hm_mpi_shared_t *sh[2];
    for (int k = 0; k < 2; k++) {
        grid[k] = hm_pool_malloc(pool, strip);
        if (!grid[k]) MPI_Abort(MPI_COMM_WORLD, 1);
        for (int y = 0; y < rows + 2; y++)
            for (int x = 0; x < NX; x++) grid[k][y * NX + x] = initial(first + y - 1, x);
        r = hm_mpi_share(MPI_COMM_WORLD, pool, grid[k], &sh[k]);
        if (r) {
            if (rank == 0) fprintf(stderr, "mpi_halo: hm_mpi_share: %s\n", hm_result_string(r));
            MPI_Finalize();
            return 1;
        }
    }
    int up = rank - 1, down = rank + 1;
    if ((up >= 0 && !hm_mpi_shared_reachable(sh[0], up)) ||
        (down < size && !hm_mpi_shared_reachable(sh[0], down))) {
        if (rank == 0) fprintf(stderr, "mpi_halo: a neighbour runs on another node\n");
        MPI_Finalize();
        return 77;
    }
    double t0 = MPI_Wtime();
    int cur = 0;
    for (int s = 0; s < steps; s++) {
        double *g = grid[cur];
        /* Ghost rows straight from the neighbours' strips (their current
         * grid): the upper neighbour's last row, the lower one's first. */
        if (up >= 0) {
            const double *n = hm_mpi_shared_peer(sh[cur], up);
            memcpy(&g[0], &n[rows * NX], NX * sizeof(double));
        }
        if (down < size) {
            const double *n = hm_mpi_shared_peer(sh[cur], down);
            memcpy(&g[(rows + 1) * NX], &n[1 * NX], NX * sizeof(double));
        }
        MPI_Barrier(MPI_COMM_WORLD); /* every ghost read before any strip changes */
        relax(g, grid[1 - cur], rows, first, ny);
        cur = 1 - cur;
        MPI_Barrier(MPI_COMM_WORLD); /* every strip written before the next reads */
    }
    double t = MPI_Wtime() - t0;

    /* The same steps on the whole grid, alone, to check every cell. */
    double *a = malloc((size_t)(ny + 2) * NX * sizeof(double));
    double *b = malloc((size_t)(ny + 2) * NX * sizeof(double));
    if (!a || !b) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int y = 0; y < ny + 2; y++)
        for (int x = 0; x < NX; x++) a[y * NX + x] = b[y * NX + x] = initial(y - 1, x);
    for (int s = 0; s < steps; s++) {
        relax(a, b, ny, 0, ny);
        double *tmp = a;
        a = b;
        b = tmp;
    }
    long bad = 0;
    for (int y = 1; y <= rows; y++)
        for (int x = 0; x < NX; x++)
            if (fabs(grid[cur][y * NX + x] - a[(first + y) * NX + x]) > 1e-9) bad++;
    long all_bad = 0;
    MPI_Reduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("mpi_halo: %d ranks, a %d x %d grid in strips of %d rows in shared hetmem pools "
               "(descriptors by %s); %d steps, each rank reading its neighbours' edge rows "
               "directly: %.1f us per step; %ld of %ld cells wrong\n",
               size, NX, ny, rows, hm_mpi_shared_transport(sh[0]), steps, 1e6 * t / steps,
               all_bad, (long)NX * ny);
    for (int k = 0; k < 2; k++) {
        hm_mpi_unshare(sh[k]);
        hm_pool_free(pool, grid[k]);
    }
    hm_pool_destroy(pool);
    free(a);
    free(b);
    MPI_Finalize();
    return all_bad ? 1 : 0;
}
