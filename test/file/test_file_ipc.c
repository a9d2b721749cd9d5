/* hetmem tests — the file provider through the IPC API, across a fork: the
 * parent exports an allocation of a proxy pool over a file; the child opens
 * the handle through its own pool over the same file (the memory moves as
 * the exporter's descriptor, fetched with pidfd_getfd: the payload names no
 * path), reads the parent's data and writes back; the parent sees the write.
 * A pool over another file opens the handle as well (the descriptor, not the
 * importer's own file, names the memory). Skipped where pidfd_getfd is not
 * available (test_file_ipc_hostile covers the channel).
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "conformance.h"
#include "pidfd_probe.h"

#include <sys/wait.h>
#include <unistd.h>

#define SIZE (256u << 10)

static hm_pool_t *file_pool(const char *path) {
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_file_provider_create(path, &prov) != HM_SUCCESS) return NULL;
    if (hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool) != HM_SUCCESS) {
        hm_provider_destroy(prov);
        return NULL;
    }
    return pool;
}

/* The child: 0 on success, else the step that failed. */
static int child(const char *path, const char *other, const hm_ipc_handle_t *h, size_t len) {
    hm_pool_t *pool = file_pool(path);
    if (!pool) return 10;
    void *q = NULL;
    if (hm_ipc_open(pool, h, len, &q) != HM_SUCCESS || !q) return 11;
    if (!hm_test_verify((char *)q + 4096, SIZE - 4096, 99)) return 12;
    memset(q, 0x77, 4096);
    if (hm_ipc_close(q) != HM_SUCCESS) return 13;
    /* A pool over another file opens it too: the descriptor names the file. */
    hm_pool_t *pool2 = file_pool(other);
    if (!pool2) return 14;
    void *r = NULL;
    if (hm_ipc_open(pool2, h, len, &r) != HM_SUCCESS || !r) return 15;
    if (((unsigned char *)r)[100] != 0x77) return 18;
    if (hm_pool_destroy(pool2) != HM_SUCCESS) return 16; /* closes its mapping */
    if (hm_pool_destroy(pool) != HM_SUCCESS) return 17;
    return 0;
}


int main(void) {
    if (!pidfd_getfd_works()) HM_TEST_SKIP("pidfd_getfd is not available here");
    char dir[] = "/tmp/hm-file-ipc-XXXXXX", path[128], other[128];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/shared", dir);
    snprintf(other, sizeof(other), "%s/other", dir);
    hm_pool_t *pool = file_pool(path);
    REQUIRE(pool);
    void *p = hm_pool_malloc(pool, SIZE);
    REQUIRE(p);
    memset(p, 0, 4096);
    hm_test_fill((char *)p + 4096, SIZE - 4096, 99);
    hm_ipc_handle_t *h = NULL;
    size_t len = 0;
    hm_result_t r = hm_ipc_get(p, &h, &len);
    if (r == HM_ERROR_NOT_SUPPORTED) HM_TEST_SKIP("IPC not built in");
    REQUIRE_OK(r);
    /* Handles are plain bytes; the child gets a copy (the exporter's own
     * handle belongs to its export cache, which a forked child drops). */
    void *bytes = malloc(len);
    REQUIRE(bytes);
    memcpy(bytes, h, len);
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(child(path, other, bytes, len));
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed at step %d",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(((unsigned char *)p)[0] == 0x77 && ((unsigned char *)p)[4095] == 0x77);
    CHECK_OK(hm_ipc_put(h));
    free(bytes);
    CHECK_OK(hm_pool_free(pool, p));
    CHECK_OK(hm_pool_destroy(pool));
    unlink(path);
    unlink(other);
    rmdir(dir);
    return hm_test_finish();
}
