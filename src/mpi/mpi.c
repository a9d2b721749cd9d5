/* hetmem MPI companion (include/hetmem/mpi.h): libhetmem_mpi.
 * SPDX-License-Identifier: MIT
 *
 * hm_mpi_share, step by step (every step is collective over the node's
 * communicator, made once by MPI_Comm_split_type; the agreement steps over
 * the whole communicator, so that ranks of every node return alike):
 *   1. export: hm_ipc_get of the rank's pointer;
 *   2. agree (agree()): the lowest rank whose step failed, and its result,
 *      reach every rank (MPI_Allreduce MINLOC of (failed ? rank : size),
 *      then a broadcast of that rank's result): all go on or all undo;
 *   3. the handles: lengths and bytes by MPI_Allgather(v) on the node;
 *   4. the transport for descriptors: pidfd unless some rank of the node
 *      cannot use it (tried on one peer's handle first), or
 *      HM_MPI_TRANSPORT says otherwise; with "socket" each rank serves its
 *      handle and descriptor on a unix socket in a directory the node's
 *      first rank makes, from a thread, to each of the node's other ranks,
 *      which connect in turn;
 *   5. open every peer's handle; agree again; on failure every rank closes
 *      what it opened and puts its export.
 * hm_mpi_unshare: close the mappings, MPI_Barrier on the node (no rank frees
 * memory a peer still maps), put the export, free the node communicator.
 *
 * Nothing here is shared between threads: the struct is the caller's; the
 * server thread of step 4 reads only what its rank prepared before. */
#define _GNU_SOURCE
#include <hetmem/mpi.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct hm_mpi_shared {
    MPI_Comm comm, node;
    int size, rank, node_size, node_rank;
    int *node_of;          /* comm rank -> node rank, or -1 (another node) */
    void **ptr;            /* per comm rank */
    size_t *len;           /* bytes from ptr to the end of the allocation */
    bool *opened;          /* per comm rank: a mapping this rank must close */
    hm_ipc_handle_t *mine; /* this rank's export, or NULL */
    const char *transport;
    int unreachable;
};

static void log_err(const char *what, hm_result_t r) {
    /* hetmem's own log has the details; one line here names the step. */
    fprintf(stderr, "hetmem_mpi: %s: %s\n", what, hm_result_string(r));
}

/* Step 2: every rank of comm learns the result of the lowest failing rank. */
static hm_result_t agree(MPI_Comm comm, int rank, int size, hm_result_t mine) {
    int in[2] = {mine != HM_SUCCESS ? rank : size, rank}, out[2];
    if (MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MINLOC, comm) != MPI_SUCCESS)
        return HM_ERROR_UNKNOWN;
    if (out[0] == size) return HM_SUCCESS;
    int r = (int)mine;
    if (MPI_Bcast(&r, 1, MPI_INT, out[0], comm) != MPI_SUCCESS) return HM_ERROR_UNKNOWN;
    return (hm_result_t)r;
}

static void shared_free(hm_mpi_shared_t *s) {
    if (!s) return;
    if (s->node != MPI_COMM_NULL) MPI_Comm_free(&s->node);
    free(s->node_of);
    free(s->ptr);
    free(s->len);
    free(s->opened);
    free(s);
}

/* ---- the socket transport ---- */

typedef struct server {
    const char *path;
    const hm_ipc_handle_t *h;
    size_t hlen;
    int clients;
    hm_result_t result;
    hm_ipc_channel_t *listener;
} server_t;

static void *serve(void *arg) {
    server_t *sv = arg;
    sv->result = HM_SUCCESS;
    for (int i = 0; i < sv->clients; i++) {
        hm_ipc_channel_t *c;
        hm_result_t r = hm_ipc_channel_accept(sv->listener, &c);
        if (r == HM_SUCCESS) {
            if (sv->h) r = hm_ipc_channel_send(c, sv->h, sv->hlen);
            else r = hm_ipc_channel_send_bytes(c, "", 1); /* nothing shared */
            hm_ipc_channel_destroy(c);
        }
        if (r != HM_SUCCESS && sv->result == HM_SUCCESS) sv->result = r;
    }
    return NULL;
}

/* ---- share ---- */

static bool want_socket(void) {
    const char *t = getenv("HM_MPI_TRANSPORT");
    return t && strcmp(t, "socket") == 0;
}
static bool force_pidfd(void) {
    const char *t = getenv("HM_MPI_TRANSPORT");
    return t && strcmp(t, "pidfd") == 0;
}

hm_result_t hm_mpi_share(MPI_Comm comm, hm_pool_t *pool, void *ptr, hm_mpi_shared_t **out) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited || comm == MPI_COMM_NULL) {
        fprintf(stderr, "hetmem_mpi: hm_mpi_share: %s\n",
                !inited ? "MPI is not initialised" : "MPI_COMM_NULL");
        if (out) *out = NULL;
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_mpi_shared_t *s = calloc(1, sizeof(*s));
    hm_result_t r = s ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
    int size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    if (s) {
        s->comm = comm;
        s->size = size;
        s->rank = rank;
        s->node = MPI_COMM_NULL;
        s->transport = "none";
        s->node_of = calloc((size_t)size, sizeof(int));
        s->ptr = calloc((size_t)size, sizeof(void *));
        s->len = calloc((size_t)size, sizeof(size_t));
        s->opened = calloc((size_t)size, sizeof(bool));
        if (!s->node_of || !s->ptr || !s->len || !s->opened) r = HM_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (!out) {
        fprintf(stderr, "hetmem_mpi: hm_mpi_share: shared (the result) is NULL\n");
        r = HM_ERROR_INVALID_ARGUMENT;
    } else {
        *out = NULL;
    }
    /* 1. export */
    hm_ipc_handle_t *h = NULL;
    size_t hlen = 0;
    if (r == HM_SUCCESS && ptr) {
        r = hm_ipc_get(ptr, &h, &hlen);
        if (r != HM_SUCCESS) log_err("hm_ipc_get of this rank's pointer", r);
    }
    hm_result_t all = agree(comm, rank, size, r);
    if (all != HM_SUCCESS) goto undo_export;
    s->mine = h;

    /* The node and its ranks. */
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &s->node) !=
        MPI_SUCCESS) {
        all = HM_ERROR_UNKNOWN;
        goto undo_export;
    }
    MPI_Comm_size(s->node, &s->node_size);
    MPI_Comm_rank(s->node, &s->node_rank);
    {
        MPI_Group g, ng;
        MPI_Comm_group(comm, &g);
        MPI_Comm_group(s->node, &ng);
        int *all_ranks = malloc((size_t)size * sizeof(int));
        if (!all_ranks) {
            r = HM_ERROR_OUT_OF_HOST_MEMORY;
        } else {
            for (int i = 0; i < size; i++) all_ranks[i] = i;
            MPI_Group_translate_ranks(g, size, all_ranks, ng, s->node_of);
            free(all_ranks);
        }
        MPI_Group_free(&g);
        MPI_Group_free(&ng);
    }
    for (int i = 0; i < size; i++)
        if (s->node_of[i] == MPI_UNDEFINED) {
            s->node_of[i] = -1;
            s->unreachable++;
        }

    /* 3. the handles, on the node */
    int n = s->node_size;
    int *lens = calloc((size_t)n, sizeof(int)), *offs = calloc((size_t)n, sizeof(int));
    int *ranks_of = calloc((size_t)n, sizeof(int)); /* node rank -> comm rank */
    unsigned long long *plen = calloc((size_t)n, sizeof(unsigned long long));
    unsigned char *bytes = NULL;
    int my_len = (int)hlen, total = 0;
    if (!lens || !offs || !ranks_of || !plen) r = HM_ERROR_OUT_OF_HOST_MEMORY;
    MPI_Allgather(&my_len, 1, MPI_INT, lens ? lens : offs, 1, MPI_INT, s->node);
    MPI_Allgather(&rank, 1, MPI_INT, ranks_of ? ranks_of : offs, 1, MPI_INT, s->node);
    if (lens && offs)
        for (int i = 0; i < n; i++) {
            offs[i] = total;
            total += lens[i];
        }
    bytes = malloc(total ? (size_t)total : 1);
    if (!bytes) r = HM_ERROR_OUT_OF_HOST_MEMORY;
    MPI_Allgatherv(h ? (void *)h : (void *)"", my_len, MPI_BYTE, bytes ? bytes : (void *)lens,
                   lens, offs, MPI_BYTE, s->node);
    /* Each shared pointer's extent: to the end of the range its handle maps. */
    for (int i = 0; plen && bytes && i < n; i++) {
        hm_ipc_handle_info_t hi;
        if (lens[i] && hm_ipc_handle_info((const hm_ipc_handle_t *)(bytes + offs[i]),
                                          (size_t)lens[i], &hi) == HM_SUCCESS)
            plen[i] = hi.size - hi.offset;
    }
    unsigned long long mine_len = plen && lens ? plen[s->node_rank] : 0;
    bool peers_share = false;
    for (int i = 0; lens && i < n; i++) peers_share |= i != s->node_rank && lens[i] > 0;
    if (r == HM_SUCCESS && peers_share && !pool) {
        fprintf(stderr, "hetmem_mpi: hm_mpi_share: pool is NULL on rank %d, and peers share\n",
                rank);
        r = HM_ERROR_INVALID_ARGUMENT;
    }
    all = agree(comm, rank, size, r);
    if (all != HM_SUCCESS) goto undo_gather;

    /* 4. the transport: pidfd unless a rank of the node cannot use it. */
    bool any_fd = false;
    for (int i = 0; i < n; i++) {
        hm_ipc_handle_info_t hi;
        if (lens[i] && hm_ipc_handle_info((const hm_ipc_handle_t *)(bytes + offs[i]),
                                          (size_t)lens[i], &hi) == HM_SUCCESS && hi.has_fd)
            any_fd = true;
    }
    int sock = want_socket();
    /* 5. open, pidfd first */
    r = HM_SUCCESS;
    for (int i = 0; i < n && !sock && r == HM_SUCCESS; i++) {
        if (i == s->node_rank || !lens[i]) continue;
        int cr = ranks_of[i];
        r = hm_ipc_open(pool, (const hm_ipc_handle_t *)(bytes + offs[i]), (size_t)lens[i],
                        &s->ptr[cr]);
        if (r == HM_SUCCESS) {
            s->opened[cr] = true;
            s->len[cr] = (size_t)plen[i];
        } else if ((r == HM_ERROR_PERMISSION || r == HM_ERROR_NOT_SUPPORTED) && any_fd &&
                   !force_pidfd()) {
            sock = 1; /* this rank cannot fetch descriptors: the node goes by socket */
            r = HM_SUCCESS;
        } else {
            log_err("hm_ipc_open of a peer's handle", r);
        }
    }
    int sock_any = 0;
    MPI_Allreduce(&sock, &sock_any, 1, MPI_INT, MPI_MAX, s->node);
    /* Every rank of the node takes the same branch (any_fd comes from the
     * gathered handles), whatever its own result: its peers wait for it in
     * the branch's collectives and accepts. */
    if (sock_any && any_fd) {
        /* Undo the pidfd opens; every rank of the node goes by socket. */
        for (int i = 0; i < size; i++)
            if (s->opened[i]) {
                (void)hm_ipc_close(s->ptr[i]);
                s->opened[i] = false;
                s->ptr[i] = NULL;
            }
        char dir[108] = "";
        if (s->node_rank == 0) {
            const char *tmp = getenv("TMPDIR");
            snprintf(dir, sizeof(dir), "%s/hm-mpi-XXXXXX", tmp && *tmp ? tmp : "/tmp");
            if (!mkdtemp(dir)) dir[0] = '\0';
        }
        MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, s->node);
        if (!dir[0]) r = HM_ERROR_UNKNOWN;
        char path[160];
        snprintf(path, sizeof(path), "%s/r%d", dir, s->node_rank);
        server_t sv = {.path = path, .h = h, .hlen = hlen, .clients = n - 1};
        pthread_t th;
        bool serving = false;
        if (r == HM_SUCCESS && (r = hm_ipc_channel_listen(path, &sv.listener)) == HM_SUCCESS)
            serving = pthread_create(&th, NULL, serve, &sv) == 0;
        if (r == HM_SUCCESS && !serving) r = HM_ERROR_UNKNOWN;
        MPI_Barrier(s->node); /* every listener is up */
        for (int i = 0; i < n; i++) {
            if (i == s->node_rank) continue;
            char peer[160];
            snprintf(peer, sizeof(peer), "%s/r%d", dir, i);
            hm_ipc_channel_t *c;
            hm_result_t cr_ = hm_ipc_channel_connect(peer, &c);
            if (cr_ == HM_SUCCESS && r != HM_SUCCESS) { /* keep the peer's count, open nothing */
                hm_ipc_channel_destroy(c);
                continue;
            }
            if (cr_ == HM_SUCCESS) {
                unsigned char buf[4096];
                size_t got = 0;
                int fd = -1;
                if (lens[i]) {
                    cr_ = hm_ipc_channel_recv(c, buf, sizeof(buf), &got, &fd);
                    int cr = ranks_of[i];
                    if (cr_ == HM_SUCCESS)
                        cr_ = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)buf, got, fd,
                                             &s->ptr[cr]);
                    if (cr_ == HM_SUCCESS) {
                        s->opened[cr] = true;
                        s->len[cr] = (size_t)plen[i];
                    }
                    if (fd >= 0) close(fd);
                } else {
                    char b;
                    cr_ = hm_ipc_channel_recv_bytes(c, &b, 1, &got);
                }
                hm_ipc_channel_destroy(c);
            }
            if (cr_ != HM_SUCCESS && r == HM_SUCCESS) {
                log_err("a peer's handle over the node's socket", cr_);
                r = cr_;
            }
        }
        if (serving) {
            pthread_join(th, NULL);
            if (sv.result != HM_SUCCESS && r == HM_SUCCESS) r = sv.result;
        }
        if (sv.listener) hm_ipc_channel_destroy(sv.listener);
        (void)unlink(path);
        MPI_Barrier(s->node);
        if (s->node_rank == 0 && dir[0]) (void)rmdir(dir);
        s->transport = "socket";
    } else if (any_fd) {
        s->transport = "pidfd";
    }
    all = agree(comm, rank, size, r);
    if (all != HM_SUCCESS) goto undo_open;
    if (ptr) {
        s->ptr[rank] = ptr;
        s->len[rank] = (size_t)mine_len;
    }
    free(lens);
    free(offs);
    free(ranks_of);
    free(plen);
    free(bytes);
    *out = s;
    return HM_SUCCESS;

undo_open:
    for (int i = 0; i < size; i++)
        if (s->opened[i]) (void)hm_ipc_close(s->ptr[i]);
    MPI_Barrier(s->node);
undo_gather:
    free(lens);
    free(offs);
    free(ranks_of);
    free(plen);
    free(bytes);
undo_export:
    if (h) (void)hm_ipc_put(h);
    shared_free(s);
    return all;
}

void *hm_mpi_shared_peer(const hm_mpi_shared_t *s, int rank) {
    return s && rank >= 0 && rank < s->size ? s->ptr[rank] : NULL;
}

size_t hm_mpi_shared_size(const hm_mpi_shared_t *s, int rank) {
    return s && rank >= 0 && rank < s->size && s->ptr[rank] ? s->len[rank] : 0;
}

bool hm_mpi_shared_reachable(const hm_mpi_shared_t *s, int rank) {
    return s && rank >= 0 && rank < s->size && s->node_of[rank] >= 0;
}

int hm_mpi_shared_unreachable(const hm_mpi_shared_t *s) { return s ? s->unreachable : 0; }

const char *hm_mpi_shared_transport(const hm_mpi_shared_t *s) { return s ? s->transport : "none"; }

hm_result_t hm_mpi_unshare(hm_mpi_shared_t *s) {
    if (!s) {
        fprintf(stderr, "hetmem_mpi: hm_mpi_unshare(NULL)\n");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    hm_result_t r = HM_SUCCESS;
    for (int i = 0; i < s->size; i++)
        if (s->opened[i]) {
            hm_result_t c = hm_ipc_close(s->ptr[i]);
            if (c != HM_SUCCESS && r == HM_SUCCESS) r = c;
        }
    MPI_Barrier(s->node); /* every peer has closed its mapping of ours */
    if (s->mine) {
        hm_result_t p = hm_ipc_put(s->mine);
        if (p != HM_SUCCESS && r == HM_SUCCESS) r = p;
    }
    hm_result_t all = agree(s->comm, s->rank, s->size, r);
    shared_free(s);
    return all;
}
