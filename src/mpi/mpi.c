/* hetmem MPI companion (include/hetmem/mpi.h): libhetmem_mpi.
 * SPDX-License-Identifier: MIT
 *
 * hm_mpi_share, step by step. The node's communicator (MPI_Comm_split_type,
 * SHARED) is made at the first share over a communicator and kept as its
 * attribute (freed with it); the steps are collective over it, and the one
 * agreement over the whole communicator, so that the ranks of every node
 * return alike:
 *   1. export: hm_ipc_get of the rank's pointer;
 *   2. one MPI_Allgather on the node of (handle length, rank, failed) and
 *      one MPI_Allgatherv of the handles: a failure on the node means no
 *      rank of it opens anything;
 *   3. open every peer's handle, descriptors by pidfd unless some rank of
 *      the node cannot use it (an MPI_Allreduce on the node, only where a
 *      handle carries a descriptor) or HM_MPI_TRANSPORT says otherwise;
 *      with "socket" each rank serves its handle and descriptor on a unix
 *      socket in a directory the node's first rank makes, from a thread, to
 *      each of the node's other ranks, which connect in turn;
 *   4. agree (agree()): the lowest rank whose step failed, and its result,
 *      reach every rank (MPI_Allreduce MINLOC of (failed ? rank : size),
 *      then a broadcast of that rank's result, only on failure): all keep
 *      their mappings or all close them and put their exports.
 * hm_mpi_unshare: close the mappings, one agreement over the communicator
 * (its reduction is also the barrier after which no peer maps this rank's
 * memory), put the export.
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
    MPI_Comm comm;
    int size, rank;
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
            /* A send to a peer that hung up is the peer's failure, which
             * that peer reports itself: not this rank's. */
            if (sv->h) (void)hm_ipc_channel_send(c, sv->h, sv->hlen);
            else (void)hm_ipc_channel_send_bytes(c, "", 1); /* nothing shared */
            hm_ipc_channel_destroy(c);
        }
        if (r != HM_SUCCESS && sv->result == HM_SUCCESS) sv->result = r;
    }
    return NULL;
}

/* ---- share ---- */

static bool want_socket(void) {
    const char *t = secure_getenv("HM_MPI_TRANSPORT");
    return t && strcmp(t, "socket") == 0;
}
static bool force_pidfd(void) {
    const char *t = secure_getenv("HM_MPI_TRANSPORT");
    return t && strcmp(t, "pidfd") == 0;
}

/* The node communicator of comm (MPI_Comm_split_type, SHARED), made at the
 * first share over comm and kept as an attribute of comm (freed with it:
 * node_delete), so a share costs no split. Collective over comm the first
 * time, local after. */
static int node_keyval = MPI_KEYVAL_INVALID;
static int node_delete(MPI_Comm comm, int keyval, void *attr, void *extra) {
    (void)comm, (void)keyval, (void)extra;
    MPI_Comm *node = attr;
    MPI_Comm_free(node);
    free(node);
    return MPI_SUCCESS;
}
static int node_of_comm(MPI_Comm comm, MPI_Comm *node) {
    if (node_keyval == MPI_KEYVAL_INVALID &&
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, node_delete, &node_keyval, NULL) !=
            MPI_SUCCESS)
        return -1;
    void *attr = NULL;
    int found = 0;
    MPI_Comm_get_attr(comm, node_keyval, &attr, &found);
    if (found) {
        *node = *(MPI_Comm *)attr;
        return 0;
    }
    MPI_Comm *n = malloc(sizeof(*n));
    int rank;
    MPI_Comm_rank(comm, &rank);
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, n ? n : node) !=
        MPI_SUCCESS) {
        free(n);
        return -1;
    }
    if (!n) return -1; /* (the split made *node: leaked on no memory) */
    MPI_Comm_set_attr(comm, node_keyval, n);
    *node = *n;
    return 0;
}

/* What each rank of the node tells the others first (one Allgather). */
typedef struct hello {
    int len;    /* its handle's length, 0: it shares nothing */
    int rank;   /* in comm */
    int failed; /* its export (or its arguments) failed: nobody opens anything */
    int has_fd; /* its handle carries a descriptor */
} hello_t;

hm_result_t hm_mpi_share(MPI_Comm comm, hm_pool_t *pool, void *ptr, hm_mpi_shared_t **out) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited || comm == MPI_COMM_NULL) {
        fprintf(stderr, "hetmem_mpi: hm_mpi_share: %s\n",
                !inited ? "MPI is not initialised" : "MPI_COMM_NULL");
        if (out) *out = NULL;
        return HM_ERROR_INVALID_ARGUMENT;
    }
    int size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    hm_mpi_shared_t *s = calloc(1, sizeof(*s));
    hm_result_t r = s ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
    MPI_Comm node = MPI_COMM_NULL;
    if (node_of_comm(comm, &node) != 0) {
        /* Every rank fails the split alike (it is collective). */
        free(s);
        if (out) *out = NULL;
        return HM_ERROR_UNKNOWN;
    }
    if (s) {
        s->comm = comm;
        s->size = size;
        s->rank = rank;
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
    int n = 0, node_rank = 0;
    MPI_Comm_size(node, &n);
    MPI_Comm_rank(node, &node_rank);
    /* 1. export */
    hm_ipc_handle_t *h = NULL;
    size_t hlen = 0;
    if (r == HM_SUCCESS && ptr) {
        r = hm_ipc_get(ptr, &h, &hlen);
        if (r != HM_SUCCESS) log_err("hm_ipc_get of this rank's pointer", r);
    }
    /* 2. who shares what, and whether some rank of the node failed (a
     * rank without memory for the tables says so here, before any step
     * that needs them) */
    hello_t *hi = calloc((size_t)n, sizeof(*hi));
    int *lens = calloc((size_t)n, sizeof(int)), *offs = calloc((size_t)n, sizeof(int));
    unsigned long long *plen = calloc((size_t)n, sizeof(unsigned long long));
    if ((!hi || !lens || !offs || !plen) && r == HM_SUCCESS) r = HM_ERROR_OUT_OF_HOST_MEMORY;
    hm_ipc_handle_info_t own;
    hello_t me = {.len = (int)hlen, .rank = rank, .failed = r != HM_SUCCESS,
                  .has_fd = h && hm_ipc_handle_info(h, hlen, &own) == HM_SUCCESS && own.has_fd};
    hello_t dummy[1];
    MPI_Allgather(&me, 4, MPI_INT, hi ? hi : dummy, 4, MPI_INT, node);
    int total = 0;
    bool node_failed = !hi, peers_share = false, any_fd = false;
    for (int i = 0; hi && lens && offs && i < n; i++) {
        lens[i] = hi[i].len;
        offs[i] = total;
        total += hi[i].len;
        node_failed |= hi[i].failed != 0;
        peers_share |= i != node_rank && hi[i].len > 0;
        any_fd |= hi[i].has_fd != 0;
    }
    unsigned char *bytes = malloc(total ? (size_t)total : 1);
    if (!bytes && r == HM_SUCCESS) r = HM_ERROR_OUT_OF_HOST_MEMORY;
    if (lens && offs)
        MPI_Allgatherv(h ? (void *)h : (void *)"", (int)hlen, MPI_BYTE,
                       bytes ? bytes : (void *)dummy, lens, offs, MPI_BYTE, node);
    if (r == HM_SUCCESS && !node_failed && peers_share && !pool) {
        fprintf(stderr, "hetmem_mpi: hm_mpi_share: pool is NULL on rank %d, and peers share\n",
                rank);
        r = HM_ERROR_INVALID_ARGUMENT;
    }
    bool go = r == HM_SUCCESS && !node_failed && bytes && lens;
    /* Ranks of comm on other nodes. */
    for (int i = 0; s && s->node_of && i < size; i++) s->node_of[i] = -1;
    for (int i = 0; hi && s && s->node_of && i < n; i++) s->node_of[hi[i].rank] = i;
    if (s) s->unreachable = size - n;
    for (int i = 0; go && i < n; i++) {
        hm_ipc_handle_info_t inf;
        if (lens[i] && hm_ipc_handle_info((const hm_ipc_handle_t *)(bytes + offs[i]),
                                          (size_t)lens[i], &inf) == HM_SUCCESS)
            plen[i] = inf.size - inf.offset;
    }
    /* 3. open, by pidfd unless asked otherwise or refused somewhere */
    int sock = want_socket();
    for (int i = 0; go && i < n && !sock && r == HM_SUCCESS; i++) {
        if (i == node_rank || !lens[i]) continue;
        int cr = hi[i].rank;
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
    /* Every rank of the node decides alike: any_fd and node_failed come from
     * the gathered hellos (the same on every rank), sock from this
     * reduction. */
    int sock_any = 0;
    if (!node_failed && any_fd) MPI_Allreduce(&sock, &sock_any, 1, MPI_INT, MPI_MAX, node);
    /* Every rank of the node takes the same branch (any_fd comes from the
     * gathered handles), whatever its own result: its peers wait for it in
     * the branch's collectives and accepts. */
    if (sock_any && any_fd && !node_failed) {
        /* Undo the pidfd opens; every rank of the node goes by socket. */
        for (int i = 0; s && i < size; i++)
            if (s->opened[i]) {
                (void)hm_ipc_close(s->ptr[i]);
                s->opened[i] = false;
                s->ptr[i] = NULL;
            }
        char dir[108] = "";
        if (node_rank == 0) {
            const char *tmp = secure_getenv("TMPDIR");
            snprintf(dir, sizeof(dir), "%s/hm-mpi-XXXXXX", tmp && *tmp ? tmp : "/tmp");
            if (!mkdtemp(dir)) dir[0] = '\0';
        }
        MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, node);
        if (!dir[0]) r = HM_ERROR_UNKNOWN;
        char path[160];
        snprintf(path, sizeof(path), "%s/r%d", dir, node_rank);
        server_t sv = {.path = path, .h = h, .hlen = hlen, .clients = n - 1};
        pthread_t th;
        bool serving = false;
        /* Served whatever this rank's own result: its peers fetch from it. */
        hm_result_t lr = dir[0] ? hm_ipc_channel_listen(path, &sv.listener) : HM_ERROR_UNKNOWN;
        if (lr == HM_SUCCESS) serving = pthread_create(&th, NULL, serve, &sv) == 0;
        if (r == HM_SUCCESS && !serving) r = lr != HM_SUCCESS ? lr : HM_ERROR_UNKNOWN;
        MPI_Barrier(node); /* every listener is up */
        for (int i = 0; i < n; i++) {
            if (i == node_rank) continue;
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
                    int cr = hi[i].rank;
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
        MPI_Barrier(node);
        if (node_rank == 0 && dir[0]) (void)rmdir(dir);
        s->transport = "socket";
    } else if (any_fd) {
        s->transport = "pidfd";
    }
    /* 4. one agreement over comm: the lowest failing rank's result, for
     * every rank of every node (also the node's failures above). */
    hm_result_t all = agree(comm, rank, size, r);
    if (all == HM_SUCCESS && node_failed) all = HM_ERROR_UNKNOWN; /* cannot be: r failed there */
    if (all == HM_SUCCESS) {
        if (ptr) {
            s->ptr[rank] = ptr;
            s->len[rank] = (size_t)plen[node_rank];
        }
        s->mine = h;
        free(hi);
        free(lens);
        free(offs);
        free(plen);
        free(bytes);
        *out = s;
        return HM_SUCCESS;
    }
    /* Undo: nothing stays shared anywhere. */
    for (int i = 0; s && s->opened && i < size; i++)
        if (s->opened[i]) (void)hm_ipc_close(s->ptr[i]);
    MPI_Barrier(node); /* every peer closed ours before the put */
    if (h) (void)hm_ipc_put(h);
    free(hi);
    free(lens);
    free(offs);
    free(plen);
    free(bytes);
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
    /* One reduction over comm: the agreement, and the barrier that lets a
     * rank free its memory when this returns (every peer closed it). */
    hm_result_t all = agree(s->comm, s->rank, s->size, r);
    if (s->mine) {
        hm_result_t p = hm_ipc_put(s->mine);
        if (p != HM_SUCCESS && all == HM_SUCCESS) all = p; /* this rank's own: local */
    }
    shared_free(s);
    return all;
}
