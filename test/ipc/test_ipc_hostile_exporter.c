/* hetmem tests — a hostile exporter against an honest importer (OS shared
 * memory; the file and devdax providers: test/file/test_file_ipc_hostile,
 * the GPU test drivers: test/cuda, test/level_zero).
 *
 * The exporter rewrites fields of a handle in its own copy (the bytes
 * hm_ipc_get returned, which the importer's exporter-copy check reads, so
 * that check agrees) and re-seals the checksum: a size or offset beyond its
 * memory, a descriptor of another file (unsealed, or not the one named),
 * reserved bits where a protection used to travel; it maps its memory
 * executable; it tries to shrink the memfd under the importer and frees the
 * allocation while it is imported. The importer runs as this user (pidfd
 * transport) and, where the test runs as root, as another user (the
 * channel): every forged handle is refused with HM_ERROR_INVALID_HANDLE, the
 * importer never faults, never maps anything executable, and a genuine
 * handle still opens and stays valid after the exporter's free.
 * SPDX-License-Identifier: MIT */
#include "hostile_util.h"

#include <hetmem/hetmem.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define KIB ((size_t)1 << 10)
#define SZ (64 * KIB)

enum {
    CASE_GENUINE,
    CASE_SIZE,       /* payload and header size doubled */
    CASE_OFFSET,     /* payload offset past the memfd's end */
    CASE_UNSEALED,   /* another memfd, unsealed, named as itself */
    CASE_OTHER_FILE, /* another memfd, the handle still naming the real one */
    CASE_RESERVED,   /* bits where the exporter's protection travelled */
    CASE_COUNT
};
static const char *case_name[CASE_COUNT] = {"genuine", "size", "offset", "unsealed memfd",
                                            "other file", "reserved bits"};

/* Is [p, p+len) mapped executable here? -1: not found. */
static int mapped_exec(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
            found = perms[2] == 'x';
            break;
        }
    }
    fclose(f);
    return found;
}

/* The importer: open each handle, report, touch every byte, and again
 * after the exporter's shrink attempt and free. */
static int importer(hm_ipc_channel_t *c, int other_user) {
    if (other_user && hostile_become(HOSTILE_OTHER_UID) != 0) return 90;
    hm_os_params_t *par;
    hm_provider_t *prov;
    hm_pool_t *pool;
    if (hm_os_params_create(&par) || hm_os_params_set_visibility(par, HM_OS_SHARED) ||
        hm_os_provider_create(par, &prov) ||
        hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool))
        return 91;
    hm_os_params_destroy(par);
    unsigned char buf[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
    for (;;) {
        size_t n = 0;
        int fd = -1;
        hm_result_t r = hm_ipc_channel_recv(c, buf, sizeof buf, &n, &fd);
        if (r == HM_ERROR_NOT_FOUND) break;
        if (r) return 92;
        void *p = NULL;
        if (other_user) {
            /* pidfd_getfd and the exporter-copy read are refused: a clean
             * error, then the descriptor that came over the channel. */
            if (hm_ipc_open(pool, (const hm_ipc_handle_t *)buf, n, &p) != HM_ERROR_PERMISSION)
                return 93;
            r = hm_ipc_open_fd(pool, (const hm_ipc_handle_t *)buf, n, fd, &p);
        } else {
            r = hm_ipc_open(pool, (const hm_ipc_handle_t *)buf, n, &p);
        }
        if (fd >= 0) close(fd);
        if (hostile_send64(c, (uint64_t)r)) return 94;
        if (r != HM_SUCCESS) continue;
        volatile unsigned char *m = p;
        uint64_t sum = 0;
        for (size_t i = 0; i < SZ; i++) sum += m[i];
        memset(p, 0x5a, SZ);
        uint64_t flags = (sum == (uint64_t)0x11 * SZ ? 1u : 0) | (mapped_exec(p) == 0 ? 2u : 0);
        if (hostile_send64(c, flags)) return 95;
        uint64_t cmd;
        if (hostile_recv64(c, &cmd)) return 96;
        memset(p, 0x6b, SZ); /* after the shrink attempt and the free */
        for (size_t i = 0; i < SZ; i++)
            if (m[i] != 0x6b) return 97;
        if (hm_ipc_close(p) != HM_SUCCESS) return 98;
        if (hostile_send64(c, 1)) return 99;
    }
    hm_pool_destroy(pool);
    return 0;
}

static void run(int other_user) {
    hm_test_set_context(other_user ? "importer of another user" : "importer of this user");
    hm_ipc_channel_t *mine;
    pid_t pid = hostile_fork(importer, other_user, &mine);

    /* The exporter's memory is even executable: the importer decides. */
    hm_os_params_t *par;
    hm_provider_t *prov;
    hm_pool_t *pool;
    REQUIRE_OK(hm_os_params_create(&par));
    REQUIRE_OK(hm_os_params_set_visibility(par, HM_OS_SHARED));
    REQUIRE_OK(hm_os_params_set_protection(par, HM_OS_PROT_READ | HM_OS_PROT_WRITE |
                                                    HM_OS_PROT_EXEC));
    REQUIRE_OK(hm_os_provider_create(par, &prov));
    hm_os_params_destroy(par);
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));

    /* A memfd of the exporter's that is not an allocation, unsealed. */
    int stray = memfd_create("hm-hostile-stray", MFD_CLOEXEC);
    REQUIRE(stray >= 0);
    REQUIRE(ftruncate(stray, 4 * (off_t)SZ) == 0);
    struct stat sst;
    REQUIRE(fstat(stray, &sst) == 0);

    for (int k = 0; k < CASE_COUNT; k++) {
        hm_test_set_context(case_name[k]);
        unsigned char *a = hm_pool_malloc(pool, SZ);
        REQUIRE(a);
        memset(a, 0x11, SZ);
        hm_ipc_handle_t *h;
        size_t len;
        REQUIRE_OK(hm_ipc_get(a, &h, &len));
        unsigned char *hb = (unsigned char *)h, saved[HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX];
        memcpy(saved, hb, len);
        hostile_os_payload_t pl;
        memcpy(&pl, hb + HM_IPC_HEADER_SIZE, sizeof pl);
        int own_fd = pl.fd;
        switch (k) {
        case CASE_SIZE:
            pl.size *= 2;
            hostile_put64(hb, HM__WIRE_OFF_SIZE, pl.size);
            break;
        case CASE_OFFSET: pl.offset += SZ; break;
        case CASE_UNSEALED:
            pl.fd = stray;
            pl.dev = (uint64_t)sst.st_dev;
            pl.ino = (uint64_t)sst.st_ino;
            break;
        case CASE_OTHER_FILE: pl.fd = stray; break;
        case CASE_RESERVED: pl.reserved = 7; break;
        default: break;
        }
        if (pl.fd != own_fd) { /* the header names the descriptor too */
            for (int i = 0; i < 4; i++)
                hb[HM__WIRE_OFF_KIND + 4 + i] = (unsigned char)((uint32_t)pl.fd >> (8 * i));
        }
        memcpy(hb + HM_IPC_HEADER_SIZE, &pl, sizeof pl);
        hostile_reseal(hb);
        REQUIRE_OK(hm_ipc_channel_send(mine, h, len));
        uint64_t r = 0, flags = 0, done = 0;
        REQUIRE(hostile_recv64(mine, &r) == 0);
        hm_result_t want = k == CASE_GENUINE ? HM_SUCCESS : HM_ERROR_INVALID_HANDLE;
        CHECK_MSG((hm_result_t)r == want, "open: %s, expected %s", hm_result_string((int)r),
                  hm_result_string(want));
        if ((hm_result_t)r == HM_SUCCESS) {
            REQUIRE(hostile_recv64(mine, &flags) == 0);
            CHECK_MSG(flags & 1, "the importer did not see the exporter's bytes");
            CHECK_MSG(flags & 2, "the importer's mapping is executable");
            CHECK(a[0] == 0x5a && a[SZ - 1] == 0x5a);
            /* The exporter cannot shrink (or grow) its memfd under the
             * importer; then it frees the allocation while imported. */
            CHECK(ftruncate(own_fd, 0) != 0 && errno == EPERM);
            CHECK(ftruncate(own_fd, 8 * (off_t)SZ) != 0 && errno == EPERM);
            memcpy(hb, saved, len);
            CHECK_OK(hm_ipc_put(h));
            CHECK_OK(hm_free(a));
            REQUIRE(hostile_send64(mine, 1) == 0);
            CHECK_MSG(hostile_recv64(mine, &done) == 0 && done == 1,
                      "the importer failed after the exporter's free");
        } else {
            memcpy(hb, saved, len);
            CHECK_OK(hm_ipc_put(h));
            CHECK_OK(hm_free(a));
        }
    }
    hm_test_set_context(other_user ? "importer of another user" : "importer of this user");
    close(stray);
    hostile_join(pid, mine);
    CHECK_OK(hm_pool_destroy(pool));
    hm_test_set_context(NULL);
}

int main(void) {
    run(0);
    if (geteuid() == 0) run(1);
    else printf("skip: the importer as another user needs root\n");
    return hm_test_finish();
}
