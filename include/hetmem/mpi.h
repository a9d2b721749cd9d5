/* hetmem MPI companion (libhetmem_mpi): share allocations between the ranks
 * of a communicator that run on one node, at any time, one allocation each.
 * SPDX-License-Identifier: MIT
 *
 *   hm_mpi_shared_t *s;
 *   hm_mpi_share(comm, pool, my_block, &s);   // collective over comm
 *   double *left = hm_mpi_shared_peer(s, left_rank);   // mapped here
 *   ... read and write the peers' memory directly ...
 *   hm_mpi_unshare(s);                          // collective
 *
 * hm_mpi_share is collective over `comm` (every rank calls it, in the same
 * order as its other collectives). Each rank gives one pointer into an
 * allocation of a tracked hetmem pool whose provider has IPC (any kind of
 * memory: the OS provider's shared memory, file, devdax, CUDA or Level Zero
 * device memory), or NULL to take part without sharing. The ranks are
 * grouped by node (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED); each rank's
 * handle (hm_ipc_get) travels through MPI to the other ranks of its node,
 * which open it (hm_ipc_open) through `pool`, a pool of a compatible
 * provider in the importing rank (the same provider family; for device
 * memory, a device that can map the exporter's). Descriptors move by
 * pidfd_getfd, or, where any rank of the node cannot use it (a container's
 * seccomp, Yama's ptrace_scope >= 1: the library never lowers a rank's
 * ptrace protection, see hm_ipc_allow_importer in ipc.h), over a per-node
 * unix socket (SCM_RIGHTS) for every rank of the node;
 * HM_MPI_TRANSPORT=pidfd|socket forces one.
 *
 * After it: hm_mpi_shared_peer(s, r) is rank r's pointer mapped in this
 * process (the calling rank's own pointer for itself), NULL for a rank on
 * another node (hm_mpi_shared_reachable says which) or one that shared
 * NULL. The mappings are valid until hm_mpi_unshare, also when a peer frees
 * its allocation meanwhile (the memory stays until every mapping closes).
 *
 * hm_mpi_unshare(s) is collective over the same communicator: it closes
 * this rank's mappings of its peers, waits until every rank of the node
 * has closed its own (so that a rank may free its allocation as soon as the
 * call returns), and releases the rank's export. It frees s.
 *
 * Errors are hetmem results. Where the cause is collective — some rank's
 * export or some rank's open of a peer's handle failed — every rank gets the
 * same result (the failing rank with the lowest number decides which) and
 * nothing stays shared anywhere. Arguments that are wrong on one rank only
 * (NULL out, a NULL pool while peers share) are reported that way too: every
 * rank learns of them, since the others must not wait. A communicator that
 * is MPI_COMM_NULL, or MPI not initialised: HM_ERROR_INVALID_ARGUMENT on
 * that rank (no collective call can be made).
 *
 * Thread safety: as for MPI collectives on `comm` (one thread at a time per
 * communicator); the calls that read s may run in any thread. */
#ifndef HETMEM_MPI_H
#define HETMEM_MPI_H

#include <hetmem/hetmem.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hm_mpi_shared hm_mpi_shared_t;

/* Collective: share ptr (NULL: nothing) with the ranks of comm on this node
 * and map theirs through pool (may be NULL only where no peer shares). */
HM_API hm_result_t hm_mpi_share(MPI_Comm comm, hm_pool_t *pool, void *ptr,
                                hm_mpi_shared_t **shared);
/* Rank r's (of comm) pointer mapped here, its own for the caller; NULL for
 * a rank on another node, one that shared NULL, or r out of range. */
HM_API void *hm_mpi_shared_peer(const hm_mpi_shared_t *shared, int rank);
/* Bytes mapped from hm_mpi_shared_peer(s, r) on: to the end of the
 * provider range that holds r's pointer, which its pool may have carved
 * other blocks from (0 where the pointer is NULL). Read and write only r's
 * own block, whose size the program knows. */
HM_API size_t hm_mpi_shared_size(const hm_mpi_shared_t *shared, int rank);
/* Whether rank r runs on this node (its memory can be mapped here). */
HM_API bool hm_mpi_shared_reachable(const hm_mpi_shared_t *shared, int rank);
/* How many ranks of comm are not on this node. */
HM_API int hm_mpi_shared_unreachable(const hm_mpi_shared_t *shared);
/* Which transport moved descriptors: "pidfd", "socket", or "none" (no
 * shared allocation carried a descriptor). */
HM_API const char *hm_mpi_shared_transport(const hm_mpi_shared_t *shared);
/* Collective over the communicator of hm_mpi_share: close, wait, release
 * (see above). NULL: HM_ERROR_INVALID_ARGUMENT (on that rank only). */
HM_API hm_result_t hm_mpi_unshare(hm_mpi_shared_t *shared);

#ifdef __cplusplus
}
#endif
#endif
