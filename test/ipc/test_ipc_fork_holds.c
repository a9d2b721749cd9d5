/* hetmem IPC test: ranges of the file provider held for IPC at fork time.
 * SPDX-License-Identifier: MIT
 *
 * The parent exports two allocations of a file provider and frees one of
 * them while its handle is outstanding (the range stays held until the last
 * put). In a forked child the exports are the parent's (the IPC layer drops
 * its export cache there without a put): the child must be able to free
 * the still-allocated range, and both ranges must be reusable in the child,
 * while in the parent they stay held until the parent's puts. */
#include "harness.h"

#include <hetmem/hetmem.h>

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SZ ((size_t)64 << 10)

/* Whether ranges a and b both come back among n allocations of SZ (all
 * freed again before returning). */
static int both_reused(hm_pool_t *pool, void *a, void *b, int n) {
    void *q[16];
    int got_a = 0, got_b = 0, k = 0;
    for (; k < n && k < 16; k++) {
        q[k] = hm_pool_malloc(pool, SZ);
        if (!q[k]) break;
        got_a |= q[k] == a;
        got_b |= q[k] == b;
    }
    for (int i = 0; i < k; i++) hm_pool_free(pool, q[i]);
    return got_a && got_b;
}
/* Whether any of n allocations of SZ overlaps [a, +SZ) or [b, +SZ). */
static int any_overlap(hm_pool_t *pool, void *a, void *b, int n) {
    void *q[16];
    int hit = 0, k = 0;
    for (; k < n && k < 16; k++) {
        q[k] = hm_pool_malloc(pool, SZ);
        if (!q[k]) break;
        char *c = q[k];
        hit |= (c + SZ > (char *)a && c < (char *)a + SZ) ||
               (c + SZ > (char *)b && c < (char *)b + SZ);
    }
    for (int i = 0; i < k; i++) hm_pool_free(pool, q[i]);
    return hit;
}

int main(void) {
    char path[128];
    snprintf(path, sizeof(path), "/tmp/hm_ipc_fork_holds_%d", (int)getpid());
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_file_provider_create(path, &prov));
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    void *p = hm_pool_malloc(pool, SZ), *q = hm_pool_malloc(pool, SZ);
    REQUIRE(p && q);
    hm_ipc_handle_t *hp, *hq;
    size_t lp, lq;
    REQUIRE_OK(hm_ipc_get(p, &hp, &lp));
    REQUIRE_OK(hm_ipc_get(q, &hq, &lq));
    CHECK_OK(hm_pool_free(pool, q)); /* exported: held until the last put */

    fflush(stdout);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int bad = 0;
        /* p: a plain allocation of the child now */
        if (hm_pool_free(pool, p) != HM_SUCCESS) bad |= 1;
        /* p and q are both free in the child: allocations get them again */
        if (!both_reused(pool, p, q, 8)) bad |= 2;
        /* the child exports afresh (its own export, its own put) */
        void *m = hm_pool_malloc(pool, SZ);
        hm_ipc_handle_t *hm;
        size_t lm;
        if (!m || hm_ipc_get(m, &hm, &lm) != HM_SUCCESS || hm_ipc_put(hm) != HM_SUCCESS)
            bad |= 4;
        if (m && hm_pool_free(pool, m) != HM_SUCCESS) bad |= 8;
        if (hm_pool_destroy(pool) != HM_SUCCESS) bad |= 16;
        _exit(bad);
    }
    int st = 0;
    REQUIRE(waitpid(child, &st, 0) == child);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "child: status 0x%x (1: free of the exported range, 2: ranges not reusable, "
              "4: fresh export, 8: free, 16: destroy)", (unsigned)st);

    /* The parent's exports are untouched: both ranges stay out of reuse. */
    CHECK_MSG(!any_overlap(pool, p, q, 6), "the parent reuses a range still exported");
    CHECK_OK(hm_ipc_put(hq)); /* q's last put: given back now */
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_ipc_put(hp)); /* p's last put */
    CHECK_MSG(both_reused(pool, p, q, 8), "after the last puts both ranges are reusable");
    CHECK_OK(hm_pool_destroy(pool));
    unlink(path);
    return hm_test_finish();
}
