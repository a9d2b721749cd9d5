/* hetmem IPC — bad input: truncated, bit-flipped, wrong-version,
 * wrong-provider and forged handles, a dead exporter, a handle opened by its
 * own exporter. Each gets a clear error, maps nothing, leaks nothing (file
 * descriptors, mappings, cache entries counted before and after).
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "ipc/wire.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned char good[4096];
static size_t good_len;
static hm_pool_t *pool;

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}
static int count_maps(void) {
#ifdef HM_SANITIZE_BUILD
    return 0; /* sanitizers map shadow memory as they go */
#endif
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    if (!f) return -1;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}
static size_t cache_entries(void) {
    hm_ipc_cache_stats_t st;
    hm_ipc_get_cache_stats(&st);
    return st.entries;
}

/* Rewrite the checksum so that only the field we changed is wrong. */
static void fix_crc(unsigned char *b, size_t len) {
    uint32_t c = hm__crc32c(0, b, HM__WIRE_CRC_OFF);
    c = hm__crc32c(c, b + HM_IPC_HEADER_SIZE, len - HM_IPC_HEADER_SIZE);
    for (int i = 0; i < 4; i++) b[HM__WIRE_CRC_OFF + i] = (unsigned char)(c >> (8 * i));
}
static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static hm_result_t try_open(const unsigned char *b, size_t len) {
    void *p = (void *)1;
    hm_result_t r = hm_ipc_open(pool, (const hm_ipc_handle_t *)b, len, &p);
    if (r == HM_SUCCESS) hm_ipc_close(p);
    else CHECK(p == NULL);
    return r;
}

/* Open a copy of the good handle with `n` bytes at `off` set to v (and the
 * checksum fixed) -> expected result. */
typedef struct open_arg {
    hm_pool_t *pool;
    void *p;
    hm_result_t r;
} open_arg_t;
static void *open_in_thread(void *arg) {
    open_arg_t *a = arg;
    a->r = hm_ipc_open(a->pool, (const hm_ipc_handle_t *)good, good_len, &a->p);
    return NULL;
}
static hm_pool_t *shared_pool_make(void) {
    hm_os_params_t *prm;
    hm_provider_t *prov;
    hm_pool_t *p = NULL;
    if (hm_os_params_create(&prm)) return NULL;
    hm_os_params_set_visibility(prm, HM_OS_SHARED);
    if (hm_os_provider_create(prm, &prov) == HM_SUCCESS &&
        hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &p) != HM_SUCCESS)
        hm_provider_destroy(prov);
    hm_os_params_destroy(prm);
    return p;
}

static void forged(const char *what, unsigned off, int n, uint64_t v, hm_result_t expected) {
    unsigned char b[sizeof(good)];
    memcpy(b, good, good_len);
    put_le(b + off, v, n);
    fix_crc(b, good_len);
    hm_result_t r = try_open(b, good_len);
    CHECK_MSG(r == expected, "forged %s: %s, expected %s", what, hm_result_string(r),
              hm_result_string(expected));
}

int main(void) {
    /* CRC32C check value (RFC 3720 appendix B.4). */
    CHECK_EQ(hm__crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ(hm_ipc_handle_size(), HM_IPC_HEADER_SIZE + HM_IPC_PAYLOAD_MAX);

    /* An exporter process that stays alive until told. */
    int hp[2], go[2];
    REQUIRE(pipe(hp) == 0 && pipe(go) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        close(hp[0]);
        close(go[1]);
        hm_os_params_t *prm;
        hm_provider_t *prov;
        hm_pool_t *cp;
        hm_os_params_create(&prm);
        hm_os_params_set_visibility(prm, HM_OS_SHARED);
        if (hm_os_provider_create(prm, &prov) || hm_proxy_pool_create(prov, 0, &cp)) _exit(2);
        void *m = hm_pool_malloc(cp, 65536);
        hm_ipc_handle_t *h;
        size_t len;
        if (!m || hm_ipc_get(m, &h, &len)) _exit(3);
        if (write(hp[1], h, len) != (ssize_t)len) _exit(4);
        char c;
        (void)!read(go[0], &c, 1);
        _exit(0);
    }
    close(hp[1]);
    close(go[0]);
    ssize_t n = read(hp[0], good, sizeof(good));
    REQUIRE(n > (ssize_t)HM_IPC_HEADER_SIZE);
    good_len = (size_t)n;

    hm_os_params_t *prm;
    hm_provider_t *prov;
    REQUIRE_OK(hm_os_params_create(&prm));
    REQUIRE_OK(hm_os_params_set_visibility(prm, HM_OS_SHARED));
    REQUIRE_OK(hm_os_provider_create(prm, &prov));
    REQUIRE_OK(hm_proxy_pool_create(prov, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    hm_os_params_destroy(prm);

    hm_ipc_handle_info_t info;
    REQUIRE_OK(hm_ipc_handle_info((const hm_ipc_handle_t *)good, good_len, &info));
    CHECK_EQ(info.exporter_pid, (uint64_t)child);
    CHECK(info.has_fd && info.family == HM_PROVIDER_FAMILY_OS && info.size == 65536);
    size_t total = 0;
    CHECK_OK(hm_ipc_handle_length(good, HM_IPC_HEADER_SIZE, &total));
    CHECK_EQ(total, good_len);
    CHECK_EQ(hm_ipc_handle_length(good, HM_IPC_HEADER_SIZE - 1, &total), HM_ERROR_INVALID_HANDLE);

    int pidfd_ok = 0;
    {
        int pfd = (int)syscall(SYS_pidfd_open, getpid(), 0), f = -1;
        if (pfd >= 0) f = (int)syscall(SYS_pidfd_getfd, pfd, 0, 0);
        pidfd_ok = f >= 0;
        if (f >= 0) close(f);
        if (pfd >= 0) close(pfd);
    }
    /* Warm-up: open the genuine handle once (pidfd permitting), so that the
     * exporter's verified pidfd (cached per exporter, by design) and the
     * cached mapping are there before counting. */
    if (pidfd_ok) {
        void *w;
        CHECK_OK(hm_ipc_open(pool, (const hm_ipc_handle_t *)good, good_len, &w));
        if (w) CHECK_OK(hm_ipc_close(w));
    }
    int fds0 = count_fds(), maps0 = count_maps();
    size_t ent0 = cache_entries();

    /* NULLs */
    void *p;
    CHECK_EQ(hm_ipc_open(NULL, (const hm_ipc_handle_t *)good, good_len, &p),
             HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_ipc_open(pool, NULL, good_len, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_ipc_open(pool, (const hm_ipc_handle_t *)good, good_len, NULL),
             HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_ipc_get(NULL, NULL, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_ipc_put(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_ipc_close(NULL), HM_ERROR_INVALID_ARGUMENT);

    /* Truncated: every shorter length. */
    int bad = 0;
    for (size_t len = 0; len < good_len; len++) bad += try_open(good, len) != HM_ERROR_INVALID_HANDLE;
    CHECK_MSG(!bad, "%d truncations not refused as INVALID_HANDLE", bad);

    /* A hit of the genuine handle first: the cache entry remembers its
     * offset and checksum (a later hit on the same bytes skips the checksum),
     * so the flips below also try that path. */
    if (pidfd_ok) CHECK_EQ(try_open(good, good_len), HM_SUCCESS);
    /* Every single bit flipped. */
    bad = 0;
    for (size_t bit = 0; bit < good_len * 8; bit++) {
        unsigned char b[sizeof(good)];
        memcpy(b, good, good_len);
        b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        hm_result_t r = try_open(b, good_len);
        bad += r != HM_ERROR_INVALID_HANDLE && r != HM_ERROR_NOT_SUPPORTED;
    }
    CHECK_MSG(!bad, "%d bit flips not refused", bad);

    /* None of the forged handles below may hit the cached mapping of the
     * genuine one (the hit compares every field but the offset, and the
     * checksum): the hit count stays. */
    hm_ipc_cache_stats_t st0;
    CHECK_OK(hm_ipc_get_cache_stats(&st0));
    /* Wrong version, wrong provider family (checksums made valid). */
    forged("version 1", 4, 2, 1, HM_ERROR_NOT_SUPPORTED);
    forged("version 3", 4, 2, 3, HM_ERROR_NOT_SUPPORTED);
    forged("file family", 12, 4, HM_PROVIDER_FAMILY_FILE, HM_ERROR_NOT_SUPPORTED);
    forged("user family", 12, 4, HM_PROVIDER_FAMILY_USER + 7, HM_ERROR_NOT_SUPPORTED);
    /* Forged fields. */
    forged("unknown flag", 16, 4, 3, HM_ERROR_INVALID_HANDLE);
    forged("reserved byte", 97, 1, 1, HM_ERROR_INVALID_HANDLE);
    forged("zero origin", 88, 8, 0, HM_ERROR_INVALID_HANDLE);
    forged("offset past the end", 80, 8, 65536, HM_ERROR_INVALID_HANDLE);
    forged("zero size", 72, 8, 0, HM_ERROR_INVALID_HANDLE);
    forged("wrapping base", 64, 8, UINT64_MAX - 4096, HM_ERROR_INVALID_HANDLE);
    forged("zero nonce", 40, 8, 0, HM_ERROR_INVALID_HANDLE);
    forged("pid 0", 32, 8, 0, HM_ERROR_INVALID_HANDLE);
    forged("nonexistent pid", 32, 8, 0x3ffffff0, HM_ERROR_STALE_HANDLE);
    /* Our parent: another live process, which started before the exporter
     * (STALE: not the exporting process) unless it started in the same
     * clock tick (a shell's pipeline subshell): then only the comparison
     * with the exporter's copy tells, and it says forged. */
    {
        unsigned char b[sizeof(good)];
        memcpy(b, good, good_len);
        put_le(b + 32, (uint64_t)getppid(), 8);
        fix_crc(b, good_len);
        hm_result_t r = try_open(b, good_len);
        CHECK_MSG(r == HM_ERROR_STALE_HANDLE || r == HM_ERROR_INVALID_HANDLE,
                  "forged our own parent's pid: %s", hm_result_string(r));
    }
    forged("exporter start time", 48, 8, info.exporter_nonce, HM_ERROR_STALE_HANDLE);
    forged("payload length", 20, 4, 8, HM_ERROR_INVALID_HANDLE);
    forged("payload magic", HM_IPC_HEADER_SIZE, 4, 0x12345678, HM_ERROR_INVALID_HANDLE);
    if (pidfd_ok) {
        /* Descriptor numbers that name something else in the exporter. */
        forged("fd = the exporter's stdin", 28, 4, 0, HM_ERROR_INVALID_HANDLE);
        forged("fd = a closed number", 28, 4, 999, HM_ERROR_INVALID_HANDLE);
        forged("size beyond the export", 72, 8, 1u << 20, HM_ERROR_INVALID_HANDLE);
        /* Valid but for the kind: not the exporter's handle (its copy says
         * otherwise), never a hit. */
        forged("another memory kind", 24, 4, HM_MEMORY_SHARED, HM_ERROR_INVALID_HANDLE);
        /* The payload's last byte (the OS payload's page size, high byte). */
        forged("payload's last byte", (unsigned)good_len - 1, 1, 0x40, HM_ERROR_INVALID_HANDLE);
    }
    {
        hm_ipc_cache_stats_t st1;
        CHECK_OK(hm_ipc_get_cache_stats(&st1));
        CHECK_MSG(st1.hits == st0.hits, "forged handles hit the cache %llu times",
                  (unsigned long long)(st1.hits - st0.hits));
    }
    CHECK_EQ(count_maps(), maps0);
    /* Every byte of the handle but the checksum, changed with the checksum
     * made valid (two values each), opened through a pool that has never
     * opened the genuine handle (so every open is a miss, compared with the
     * exporter's own copy): each is refused and leaves nothing mapped or
     * cached. Through the pool that caches the genuine mapping, a change of
     * the offset (within the allocation) or of the origin names the same
     * allocation and hits; every other change is refused. */
    if (pidfd_ok) {
        hm_pool_t *fresh = shared_pool_make();
        REQUIRE(fresh != NULL);
        int opened = 0, hit_bad = 0;
        size_t ent1 = cache_entries();
        int maps1 = count_maps();
        for (size_t i = 0; i < good_len; i++) {
            if (i >= HM__WIRE_CRC_OFF && i < HM__WIRE_CRC_OFF + 4) continue;
            for (int k = 0; k < 2; k++) {
                unsigned char b[sizeof(good)];
                memcpy(b, good, good_len);
                b[i] ^= k ? 0x80 : 0x01;
                fix_crc(b, good_len);
                void *q = NULL;
                hm_result_t r = hm_ipc_open(fresh, (const hm_ipc_handle_t *)b, good_len, &q);
                if (r == HM_SUCCESS) {
                    opened++;
                    printf("byte %zu ^ 0x%02x opened\n", i, k ? 0x80 : 0x01);
                    hm_ipc_close(q);
                }
                int ignored_on_hit = (i >= HM__WIRE_OFF_OFFSET && i < HM__WIRE_OFF_OFFSET + 8) ||
                                     (i >= HM__WIRE_OFF_ORIGIN && i < HM__WIRE_OFF_ORIGIN + 8);
                q = NULL;
                r = hm_ipc_open(pool, (const hm_ipc_handle_t *)b, good_len, &q);
                if (r == HM_SUCCESS) {
                    hit_bad += !ignored_on_hit;
                    hm_ipc_close(q);
                }
            }
        }
        CHECK_MSG(opened == 0, "%d forged handles opened on a miss", opened);
        CHECK_MSG(hit_bad == 0, "%d forged handles opened through the cached mapping", hit_bad);
        CHECK_EQ(cache_entries(), ent1);
        CHECK_EQ(count_maps(), maps1);
        CHECK_OK(hm_pool_destroy(fresh));
    }
    /* Wrong provider: a private OS pool cannot open, a fixed-family handle
     * would not match either. */
    {
        hm_provider_t *priv;
        hm_pool_t *pp;
        REQUIRE_OK(hm_os_provider_create(NULL, &priv));
        REQUIRE_OK(hm_proxy_pool_create(priv, HM_POOL_FLAG_OWN_PROVIDER, &pp));
        CHECK_EQ(hm_ipc_open(pp, (const hm_ipc_handle_t *)good, good_len, &p),
                 HM_ERROR_NOT_SUPPORTED);
        void *m = hm_pool_malloc(pp, 4096);
        hm_ipc_handle_t *h;
        size_t hl;
        CHECK_EQ(hm_ipc_get(m, &h, &hl), HM_ERROR_NOT_SUPPORTED); /* private memory */
        hm_pool_free(pp, m);
        CHECK_OK(hm_pool_destroy(pp));
    }
    /* Memory hetmem does not know; put of foreign or copied handles. */
    {
        char local[64];
        hm_ipc_handle_t *h;
        size_t hl;
        CHECK_EQ(hm_ipc_get(local, &h, &hl), HM_ERROR_NOT_FOUND);
        CHECK_EQ(hm_ipc_close(local), HM_ERROR_INVALID_ARGUMENT);
        unsigned char copy[sizeof(good)];
        memcpy(copy, good, good_len);
        CHECK_EQ(hm_ipc_put((hm_ipc_handle_t *)copy), HM_ERROR_INVALID_HANDLE);
    }
    /* The private provider's own munmap may split a neighbouring anonymous
     * mapping: count again from here, after one export has mapped the export
     * side's object arena (made once, at the first export of the process;
     * whether its mapping merges with a neighbour's depends on the layout). */
    {
        void *m = hm_pool_malloc(pool, 8192);
        REQUIRE(m);
        hm_ipc_handle_t *h;
        size_t hl;
        REQUIRE_OK(hm_ipc_get(m, &h, &hl));
        CHECK_OK(hm_ipc_put(h));
        CHECK_OK(hm_pool_free(pool, m));
    }
    maps0 = count_maps();
    /* A handle opened in its own exporting process. */
    {
        void *m = hm_pool_malloc(pool, 8192);
        REQUIRE(m);
        hm_ipc_handle_t *h;
        size_t hl;
        REQUIRE_OK(hm_ipc_get(m, &h, &hl));
        CHECK_EQ(hm_ipc_open(pool, h, hl, &p), HM_ERROR_INVALID_ARGUMENT);
        CHECK(p == NULL);
        unsigned char copy[sizeof(good)];
        memcpy(copy, h, hl); /* a copy is bytes, not the handle: put refuses it */
        CHECK_EQ(hm_ipc_put((hm_ipc_handle_t *)copy), HM_ERROR_INVALID_HANDLE);
        CHECK_OK(hm_ipc_put(h));
        CHECK_OK(hm_pool_free(pool, m));
    }
    CHECK_EQ(count_fds(), fds0);
    CHECK_EQ(count_maps(), maps0);
    CHECK_EQ(cache_entries(), ent0);

    /* Control: the genuine handle opens (pidfd permitting). */
    if (pidfd_ok) {
        CHECK_OK(hm_ipc_open(pool, (const hm_ipc_handle_t *)good, good_len, &p));
        if (p) CHECK_OK(hm_ipc_close(p));
    }

    /* The per-thread close cache: closes in another thread, double closes,
     * closes after the pool went, and a slot whose entry was recycled. */
    if (pidfd_ok) {
        void *p1, *p2;
        CHECK_OK(hm_ipc_open(pool, (const hm_ipc_handle_t *)good, good_len, &p1));
        CHECK_OK(hm_ipc_open(pool, (const hm_ipc_handle_t *)good, good_len, &p2));
        CHECK(p1 == p2);
        CHECK_OK(hm_ipc_close(p1));
        CHECK_OK(hm_ipc_close((char *)p2 + 100)); /* any byte of the mapping */
        CHECK_EQ(hm_ipc_close(p2), HM_ERROR_DOUBLE_FREE);
        pthread_t t;
        open_arg_t oa = {.pool = pool};
        REQUIRE(pthread_create(&t, NULL, open_in_thread, &oa) == 0);
        pthread_join(t, NULL);
        CHECK_OK(oa.r);
        if (oa.r == HM_SUCCESS) CHECK_OK(hm_ipc_close(oa.p)); /* not this thread's slot */
        CHECK_EQ(hm_ipc_close(oa.p), HM_ERROR_DOUBLE_FREE);
        for (int round = 0; round < 3; round++) { /* entries recycled, slots outdated */
            hm_pool_t *tmp = shared_pool_make();
            REQUIRE(tmp);
            void *q;
            CHECK_OK(hm_ipc_open(tmp, (const hm_ipc_handle_t *)good, good_len, &q));
            CHECK_OK(hm_pool_destroy(tmp)); /* closes q (logged) */
            CHECK_EQ(hm_ipc_close(q), HM_ERROR_INVALID_ARGUMENT);
        }
        CHECK_EQ(cache_entries(), ent0);
    }

    /* The exporter dies: its handle is stale. */
    CHECK(write(go[1], "x", 1) == 1);
    int st;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_OK(hm_pool_destroy(pool)); /* drops the control's cached mapping */
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    hm_os_params_create(&prm);
    hm_os_params_set_visibility(prm, HM_OS_SHARED);
    hm_provider_t *sp;
    REQUIRE_OK(hm_os_provider_create(prm, &sp));
    hm_os_params_destroy(prm);
    hm_provider_destroy(prov);
    REQUIRE_OK(hm_proxy_pool_create(sp, HM_POOL_FLAG_OWN_PROVIDER, &pool));
    CHECK_EQ(try_open(good, good_len), HM_ERROR_STALE_HANDLE); /* warm-up: pool IPC state */
    fds0 = count_fds();
    maps0 = count_maps();
    CHECK_EQ(try_open(good, good_len), HM_ERROR_STALE_HANDLE);
    CHECK_EQ(count_fds(), fds0);
    CHECK_EQ(count_maps(), maps0);
    CHECK_EQ(cache_entries(), 0);
    CHECK_OK(hm_pool_destroy(pool));
    return hm_test_finish();
}
