/* hetmem example: memory tiers from memory spaces.
 * SPDX-License-Identifier: MIT
 *
 * A hot working set goes to the highest-bandwidth memory the calling thread
 * can reach (HBM, or its socket's DRAM), a cold one to the highest-capacity
 * memory (a big DRAM node, a CXL expander, persistent memory onlined as
 * RAM). Each tier is a native pool over an OS provider made from a memory
 * space, bound to the space's nodes. Prints each space's nodes and what it
 * placed where (the node of every block's pages); exits 0 when every page
 * is on a node of its tier's space.
 *
 * Where the firmware gives no bandwidth figures (no HMAT: most one-socket
 * machines and VMs), the hot tier falls back to the nodes nearest the
 * calling thread, and says so. On a one-node machine both tiers are node 0. */
#include <hetmem/hetmem.h>
#include <hetmem/memspace.h>
#include <hetmem/pools/native.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define MAX_NODES 64

typedef struct tier {
    const char *name;
    hm_memspace_t *space;
    hm_pool_t *pool;
    size_t block, count;
    void *blocks[64];
    unsigned ids[MAX_NODES];
    size_t nids;
    size_t per_node[MAX_NODES]; /* blocks whose first page is on ids[i] */
} tier_t;

static void report(const char *what, hm_result_t r) {
    const char *msg = NULL;
    int64_t code = hm_last_native_error(&msg);
    fprintf(stderr, "tiers: %s: %s", what, hm_result_string(r));
    if (code != 0) fprintf(stderr, " (native error %" PRId64 ": %s)", code, msg ? msg : "");
    fprintf(stderr, "\n");
}

static void describe(const tier_t *t) {
    size_t n = 0;
    (void)hm_memspace_target_count(t->space, &n);
    printf("%s tier: %zu node(s)\n", t->name, n);
    for (size_t i = 0; i < n; i++) {
        const hm_memtarget_t *m;
        unsigned id = 0;
        uint64_t cap = 0, bw = 0, lat = 0;
        hm_memtarget_kind_t kind = HM_MEMTARGET_DRAM;
        if (hm_memspace_target_get(t->space, i, &m) != HM_SUCCESS) continue;
        (void)hm_memtarget_get_id(m, &id);
        (void)hm_memtarget_get_capacity(m, &cap);
        (void)hm_memtarget_get_kind(m, &kind);
        printf("  node %u: %s, %" PRIu64 " MiB", id, hm_memtarget_kind_string(kind), cap >> 20);
        /* From the calling thread's CPUs; absent where the firmware says nothing. */
        if (hm_memtarget_get_attr(m, HM_MEMATTR_BANDWIDTH, NULL, 0, &bw) == HM_SUCCESS)
            printf(", %" PRIu64 " MiB/s", bw);
        else
            printf(", bandwidth unknown");
        if (hm_memtarget_get_attr(m, HM_MEMATTR_LATENCY, NULL, 0, &lat) == HM_SUCCESS)
            printf(", %" PRIu64 " ns", lat);
        else
            printf(", latency unknown");
        printf("\n");
    }
}

/* The tier's pool: a native pool over an OS provider bound to the space. */
static hm_result_t open_tier(tier_t *t) {
    hm_provider_t *provider;
    hm_result_t r = hm_memspace_provider_create(t->space, HM_OS_NUMA_BIND, &provider);
    if (r != HM_SUCCESS) return r;
    r = hm_native_pool_create(provider, NULL, HM_POOL_FLAG_OWN_PROVIDER, &t->pool);
    if (r != HM_SUCCESS) hm_provider_destroy(provider);
    if (r == HM_SUCCESS) r = hm_memspace_ids(t->space, t->ids, MAX_NODES, &t->nids);
    return r;
}

/* Allocates and writes the working set; counts where each block landed.
 * Returns the number of blocks placed outside the tier's nodes (or -1 when
 * allocation failed). */
static int fill_tier(tier_t *t) {
    int misplaced = 0;
    for (size_t i = 0; i < t->count; i++) {
        unsigned char *p = hm_pool_malloc(t->pool, t->block);
        if (!p) {
            perror("tiers: hm_pool_malloc");
            return -1;
        }
        memset(p, (int)(i & 0xff), t->block); /* pages are placed when first touched */
        t->blocks[i] = p;
        unsigned node;
        hm_result_t r = hm_os_numa_node_of(p, &node);
        if (r != HM_SUCCESS) {
            report("hm_os_numa_node_of", r);
            return -1;
        }
        size_t k = 0;
        while (k < t->nids && t->ids[k] != node) k++;
        if (k == t->nids) {
            fprintf(stderr, "tiers: %s block %zu on node %u, outside its space\n", t->name, i,
                    node);
            misplaced++;
        } else {
            t->per_node[k]++;
        }
    }
    printf("%s tier: %zu blocks of %zu KiB:", t->name, t->count, t->block >> 10);
    for (size_t k = 0; k < t->nids; k++)
        if (t->per_node[k]) printf(" %zu on node %u", t->per_node[k], t->ids[k]);
    printf("\n");
    return misplaced;
}

static void close_tier(tier_t *t) {
    for (size_t i = 0; i < t->count; i++)
        if (t->blocks[i]) hm_pool_free(t->pool, t->blocks[i]);
    if (t->pool) hm_pool_destroy(t->pool);
    if (t->space) hm_memspace_destroy(t->space);
}

int main(void) {
    tier_t hot = {.name = "hot", .block = 64 << 10, .count = 64};
    tier_t cold = {.name = "cold", .block = 1 << 20, .count = 16};
    int rc = 1;
    hm_result_t r = hm_memspace_create_highest_bandwidth(NULL, 0, &hot.space);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        printf("hot tier: no bandwidth figures on this machine (no HMAT): the nodes nearest "
               "this thread\n");
        r = hm_memspace_create_nearest(NULL, 0, &hot.space);
    }
    if (r != HM_SUCCESS) {
        report("the hot tier's space", r);
        goto out;
    }
    if ((r = hm_memspace_create_highest_capacity(&cold.space)) != HM_SUCCESS) {
        report("the cold tier's space", r);
        goto out;
    }
    describe(&hot);
    describe(&cold);
    if ((r = open_tier(&hot)) != HM_SUCCESS) {
        report("the hot tier's pool", r);
        goto out;
    }
    if ((r = open_tier(&cold)) != HM_SUCCESS) {
        report("the cold tier's pool", r);
        goto out;
    }
    int bad_hot = fill_tier(&hot), bad_cold = fill_tier(&cold);
    if (bad_hot == 0 && bad_cold == 0) {
        printf("tiers: every block is on a node of its tier\n");
        rc = 0;
    }
out:
    close_tier(&hot);
    close_tier(&cold);
    return rc;
}
