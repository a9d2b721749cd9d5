/* hetmem tests — the OS provider: the conformance suite over its modes, and
 * what only the OS provider does (memfd reuse, IPC through the ops, page
 * kinds, NUMA, protection, purge, native errors).
 * SPDX-License-Identifier: MIT */
#include "conformance.h"

#include <hetmem/providers/os.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <linux/mempolicy.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static size_t page;

/* ---- factories for the suite ---- */

typedef struct mode {
    const char *label;
    hm_os_visibility_t vis;
    hm_os_page_kind_t kind;
    unsigned prot;
    int numa; /* bind to node 0 */
} mode_t_;

static hm_result_t make_params(const mode_t_ *m, hm_os_params_t **out) {
    hm_os_params_t *p;
    hm_result_t r = hm_os_params_create(&p);
    if (r) return r;
    if ((r = hm_os_params_set_visibility(p, m->vis)) ||
        (r = hm_os_params_set_page_kind(p, m->kind)) ||
        (r = hm_os_params_set_protection(p, m->prot))) {
        hm_os_params_destroy(p);
        return r;
    }
    if (m->numa) {
        unsigned node;
        size_t count;
        if ((r = hm_os_numa_nodes(&node, 1, &count)) && r != HM_ERROR_LIMIT) {
            hm_os_params_destroy(p);
            return r;
        }
        if ((r = hm_os_params_set_numa(p, HM_OS_NUMA_BIND, &node, 1))) {
            hm_os_params_destroy(p);
            return r;
        }
    }
    *out = p;
    return HM_SUCCESS;
}

static hm_result_t make_os(void *arg, hm_provider_t **out) {
    hm_os_params_t *p;
    hm_result_t r = make_params(arg, &p);
    if (r) return r;
    r = hm_os_provider_create(p, out);
    hm_os_params_destroy(p);
    return r;
}

static hm_provider_t *create(hm_os_visibility_t vis, hm_os_page_kind_t kind, unsigned prot) {
    mode_t_ m = {"x", vis, kind, prot, 0};
    hm_provider_t *p = NULL;
    hm_result_t r = make_os(&m, &p);
    CHECK_MSG(r == HM_SUCCESS, "create(vis %d, kind %d, prot %u) -> %s", vis, kind, prot,
              hm_result_string(r));
    return p;
}

#define RW (HM_OS_PROT_READ | HM_OS_PROT_WRITE)

static void run_suites(void) {
    static mode_t_ modes[] = {
        {"os private", HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, RW, 0},
        {"os shared (memfd)", HM_OS_SHARED, HM_OS_PAGES_DEFAULT, RW, 0},
        {"os THP", HM_OS_PRIVATE, HM_OS_PAGES_THP, RW, 0},
        {"os PROT_NONE", HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, HM_OS_PROT_NONE, 0},
        {"os NUMA bind node 0", HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, RW, 1},
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        hm_provider_t *probe = NULL;
        hm_result_t r = make_os(&modes[i], &probe);
        if (r == HM_ERROR_NOT_SUPPORTED) {
            printf("provider suite: %s: not supported here, skipped\n", modes[i].label);
            continue;
        }
        CHECK_MSG(r == HM_SUCCESS, "%s: create -> %s", modes[i].label, hm_result_string(r));
        if (r) continue;
        hm_provider_destroy(probe);
        hm_test_suite_opts_t o = {.can_free = 1, .max_alloc = 64 * MIB};
        hm_test_provider_suite(modes[i].label, make_os, &modes[i], &o);
    }
}

/* ---- helpers ---- */

/* The memfd of a shared provider named `name`, found through /proc/self/fd
 * (test-only: the provider does not expose its descriptor). */
/* The first descriptor of a memfd called `name`, other than `except`. */
static int find_memfd_except(const char *name, int except) {
    char want[128];
    snprintf(want, sizeof(want), "/memfd:%s ", name);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strncmp(target, want, strlen(want)) == 0 && atoi(e->d_name) != except) {
            found = atoi(e->d_name);
            break;
        }
    }
    closedir(d);
    return found;
}
static int find_memfd(const char *name) { return find_memfd_except(name, -1); }

/* How many memfds called `name` are open. */
static int count_memfds(const char *name) {
    char want[128];
    snprintf(want, sizeof(want), "/memfd:%s ", name);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        if (k <= 0) continue;
        target[k] = 0;
        if (strncmp(target, want, strlen(want)) == 0) n++;
    }
    closedir(d);
    return n;
}

/* A shared provider whose allocations after the first go to the spill
 * memfd (max_memfds 1): *holder is that first allocation (one page), *spill
 * the spill's descriptor, made by a first spill allocation freed again. */
static hm_provider_t *spill_provider(const char *name, void **holder, int *spill) {
    hm_os_params_t *par;
    REQUIRE_OK(hm_os_params_create(&par));
    CHECK_OK(hm_os_params_set_visibility(par, HM_OS_SHARED));
    CHECK_OK(hm_os_params_set_shm_name(par, name));
    CHECK_OK(hm_os_params_set_max_memfds(par, 1));
    hm_provider_t *p;
    REQUIRE_OK(hm_os_provider_create(par, &p));
    CHECK_OK(hm_os_params_destroy(par));
    CHECK_EQ(count_memfds(name), 0); /* made at the first allocation */
    REQUIRE_OK(hm_provider_alloc(p, 1, 0, holder));
    int own = find_memfd(name);
    REQUIRE(own >= 0);
    void *x;
    REQUIRE_OK(hm_provider_alloc(p, 1, 0, &x));
    *spill = find_memfd_except(name, own);
    REQUIRE(*spill >= 0);
    CHECK_OK(hm_provider_free(p, x, 1));
    return p;
}

static size_t resident(const void *p, size_t len) {
    size_t n = len / page;
    unsigned char *vec = malloc(n);
    REQUIRE(vec);
    REQUIRE(mincore((void *)(uintptr_t)p, len, vec) == 0);
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += vec[i] & 1;
    free(vec);
    return c;
}

/* Run fn(arg) in a child; 1 if it faulted (SIGSEGV/SIGBUS), 0 if it
 * returned. The child catches the fault itself, because sanitizers turn a
 * fatal signal into a report and a plain exit. */
static void on_fault(int sig) {
    (void)sig;
    _exit(99);
}

static int child_faults(void (*fn)(void *), void *arg) {
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_fault;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        fn(arg);
        _exit(0);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    if (WIFSIGNALED(st)) return WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS;
    return WIFEXITED(st) && WEXITSTATUS(st) == 99;
}

static void touch_write(void *p) { *(volatile char *)p = 1; }
static void touch_read(void *p) { (void)*(volatile char *)p; }

/* ---- cases ---- */

static void test_params(void) {
    hm_test_set_context("params");
    hm_os_params_t *p;
    CHECK_RES(hm_os_params_create(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_destroy(NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_visibility(NULL, HM_OS_SHARED), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_page_kind(NULL, HM_OS_PAGES_THP), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(NULL, HM_OS_NUMA_DEFAULT, NULL, 0),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_protection(NULL, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_shm_name(NULL, "x"), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_os_params_create(&p));
    CHECK_RES(hm_os_params_set_visibility(p, (hm_os_visibility_t)7), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_visibility(p, (hm_os_visibility_t)-1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_page_kind(p, (hm_os_page_kind_t)5), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_page_kind(p, (hm_os_page_kind_t)-3), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_protection(p, 8), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_protection(p, ~0u), HM_ERROR_INVALID_ARGUMENT);
    unsigned nodes[3] = {0, 1, 0};
    CHECK_RES(hm_os_params_set_numa(p, (hm_os_numa_mode_t)9, nodes, 1),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(p, HM_OS_NUMA_BIND, NULL, 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(p, HM_OS_NUMA_BIND, nodes, 0), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(p, HM_OS_NUMA_DEFAULT, nodes, 1), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(p, HM_OS_NUMA_PREFERRED, nodes, 2),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(p, HM_OS_NUMA_BIND, nodes, 3), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_numa(p, HM_OS_NUMA_INTERLEAVE, nodes, (size_t)1 << 40),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_shm_name(p, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_shm_name(p, ""), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_params_set_shm_name(p, "a/b"), HM_ERROR_INVALID_ARGUMENT);
    char longname[200];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    CHECK_RES(hm_os_params_set_shm_name(p, longname), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_os_params_set_shm_name(p, "fine"));
    /* A failed setter left the defaults: the provider is private, RW. */
    hm_provider_t *prov;
    CHECK_RES(hm_os_provider_create(p, NULL), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_os_provider_create(p, &prov));
    CHECK_OK(hm_os_params_destroy(p));
    hm_provider_info_t info;
    CHECK_OK(hm_provider_get_info(prov, &info));
    CHECK(!(info.caps & HM_PROVIDER_CAP_IPC));
    CHECK(info.caps & HM_PROVIDER_CAP_CPU_ACCESS);
    CHECK(!(info.caps & HM_PROVIDER_CAP_NUMA));
    CHECK_OK(hm_provider_destroy(prov));
    /* Defaults through NULL params. */
    REQUIRE_OK(hm_os_provider_create(NULL, &prov));
    CHECK_OK(hm_provider_destroy(prov));
    /* Something that is not an OS params object. */
    uint64_t junk[32] = {0};
    CHECK_RES(hm_os_provider_create((const hm_os_params_t *)junk, &prov),
              HM_ERROR_INVALID_ARGUMENT);
    hm_test_set_context(NULL);
}

static void test_info(void) {
    hm_test_set_context("info");
    hm_provider_t *p = create(HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, RW);
    hm_provider_t *s = create(HM_OS_SHARED, HM_OS_PAGES_DEFAULT, RW);
    REQUIRE(p && s);
    hm_provider_info_t i;
    CHECK_OK(hm_provider_get_info(p, &i));
    CHECK(strcmp(i.name, "os") == 0);
    CHECK_EQ(i.family, HM_PROVIDER_FAMILY_OS);
    CHECK_EQ(i.kind, HM_MEMORY_HOST);
    CHECK_EQ(i.min_page_size, page);
    const uint32_t base = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_PURGE_LAZY |
                          HM_PROVIDER_CAP_PURGE_FORCE | HM_PROVIDER_CAP_SPLIT_MERGE |
                          HM_PROVIDER_CAP_CPU_ACCESS;
    CHECK_EQ(i.caps, base);
    CHECK_OK(hm_provider_get_info(s, &i));
    CHECK_EQ(i.caps, base | HM_PROVIDER_CAP_IPC);
    CHECK_OK(hm_provider_destroy(p));
    CHECK_OK(hm_provider_destroy(s));

    hm_os_params_t *par;
    REQUIRE_OK(hm_os_params_create(&par));
    CHECK_OK(hm_os_params_set_page_kind(par, HM_OS_PAGES_THP));
    hm_result_t r = hm_os_provider_create(par, &p);
    if (r == HM_SUCCESS) {
        CHECK_OK(hm_provider_get_info(p, &i));
        CHECK_EQ(i.min_page_size, page);
        CHECK_EQ(i.recommended_page_size, 2 * MIB);
        /* A THP allocation of a huge page or more is aligned to one. */
        void *x;
        CHECK_OK(hm_provider_alloc(p, 4 * MIB, 0, &x));
        CHECK((uintptr_t)x % (2 * MIB) == 0);
        memset(x, 1, 4 * MIB);
        CHECK_OK(hm_provider_free(p, x, 4 * MIB));
        CHECK_OK(hm_provider_destroy(p));
    } else {
        CHECK_RES(r, HM_ERROR_NOT_SUPPORTED);
    }
    CHECK_OK(hm_os_params_set_page_kind(par, HM_OS_PAGES_NO_THP));
    REQUIRE_OK(hm_os_provider_create(par, &p));
    void *x;
    CHECK_OK(hm_provider_alloc(p, 4 * MIB, 0, &x));
    memset(x, 1, 4 * MIB);
    CHECK_OK(hm_provider_free(p, x, 4 * MIB));
    CHECK_OK(hm_provider_destroy(p));
    CHECK_OK(hm_os_params_destroy(par));
    hm_test_set_context(NULL);
}

static void test_alignment(hm_os_visibility_t vis) {
    hm_test_set_context(vis == HM_OS_SHARED ? "alignment (shared)" : "alignment (private)");
    hm_provider_t *p = create(vis, HM_OS_PAGES_DEFAULT, RW);
    REQUIRE(p);
    for (size_t a = 1; a <= GIB; a *= 2) {
        void *x = NULL;
        hm_result_t r = hm_provider_alloc(p, 3 * page + 5, a, &x);
        CHECK_MSG(r == HM_SUCCESS, "alloc align %zu -> %s", a, hm_result_string(r));
        if (r) continue;
        size_t want = a > page ? a : page;
        CHECK_MSG((uintptr_t)x % want == 0, "%p not aligned to %zu", x, want);
        /* Every byte of the rounded size is usable. */
        memset(x, 0xab, 4 * page);
        CHECK_OK(hm_provider_free(p, x, 3 * page + 5));
    }
    /* Size rounding: 1 byte is one page; free with the asked size. */
    void *x;
    REQUIRE_OK(hm_provider_alloc(p, 1, 0, &x));
    memset(x, 1, page);
    CHECK_OK(hm_provider_free(p, x, 1));
    /* Bad frees. */
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &x));
    CHECK_RES(hm_provider_free(p, (char *)x + 1, page), HM_ERROR_INVALID_ARGUMENT);
    if (vis == HM_OS_SHARED) {
        CHECK_RES(hm_provider_free(p, x, 2 * page), HM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(hm_provider_free(p, x, page));
        CHECK_RES(hm_provider_free(p, x, page), HM_ERROR_INVALID_ARGUMENT); /* double free */
    } else {
        CHECK_OK(hm_provider_free(p, x, page));
    }
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

/* Each allocation of a shared provider is a memfd of its own, sized to it
 * and sealed against resizing and further seals; a free closes it; at
 * most max_memfds are open, the rest share the spill. */
static void test_memfd_own(void) {
    hm_test_set_context("memfd per allocation");
    hm_os_params_t *par;
    REQUIRE_OK(hm_os_params_create(&par));
    CHECK_OK(hm_os_params_set_visibility(par, HM_OS_SHARED));
    CHECK_OK(hm_os_params_set_shm_name(par, "hm-test-own"));
    CHECK_OK(hm_os_params_set_max_memfds(par, 4));
    CHECK_RES(hm_os_params_set_max_memfds(NULL, 4), HM_ERROR_INVALID_ARGUMENT);
    hm_provider_t *p;
    REQUIRE_OK(hm_os_provider_create(par, &p));
    CHECK_OK(hm_os_params_destroy(par));
    void *a, *b;
    REQUIRE_OK(hm_provider_alloc(p, 3 * page, 0, &a));
    int fa = find_memfd("hm-test-own");
    REQUIRE(fa >= 0);
    REQUIRE_OK(hm_provider_alloc(p, 5 * page, 0, &b));
    int fb = find_memfd_except("hm-test-own", fa);
    REQUIRE(fb >= 0);
    CHECK_EQ(count_memfds("hm-test-own"), 2);
    struct stat st;
    REQUIRE(fstat(fa, &st) == 0);
    off_t sa = st.st_size;
    REQUIRE(fstat(fb, &st) == 0);
    off_t sb = st.st_size;
    /* Each file is exactly its allocation (which one is which: by size). */
    CHECK((sa == (off_t)(3 * page) && sb == (off_t)(5 * page)) ||
          (sa == (off_t)(5 * page) && sb == (off_t)(3 * page)));
    int seals = fcntl(fa, F_GET_SEALS);
    CHECK((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
          (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    CHECK(ftruncate(fa, 0) != 0 && errno == EPERM);
    CHECK(ftruncate(fa, 64 * (off_t)page) != 0 && errno == EPERM);
    CHECK(fcntl(fa, F_ADD_SEALS, F_SEAL_WRITE) != 0);
    memset(a, 1, 3 * page);
    memset(b, 2, 5 * page);
    CHECK_OK(hm_provider_free(p, b, 5 * page));
    CHECK_EQ(count_memfds("hm-test-own"), 1);
    CHECK(((char *)a)[3 * page - 1] == 1);
    /* A split leaves both parts in one memfd; it closes with the last. */
    CHECK_OK(hm_provider_split(p, a, 3 * page, page));
    CHECK_OK(hm_provider_free(p, a, page));
    CHECK_EQ(count_memfds("hm-test-own"), 1);
    CHECK(((char *)a + page)[0] == 1);
    CHECK_OK(hm_provider_free(p, (char *)a + page, 2 * page));
    CHECK_EQ(count_memfds("hm-test-own"), 0);
    /* Parts of two memfds never merge. */
    void *x[10];
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &x[0]));
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &x[1]));
    if ((char *)x[1] == (char *)x[0] + page)
        CHECK_RES(hm_provider_merge(p, x[0], x[1], 2 * page), HM_ERROR_NOT_SUPPORTED);
    else if ((char *)x[0] == (char *)x[1] + page)
        CHECK_RES(hm_provider_merge(p, x[1], x[0], 2 * page), HM_ERROR_NOT_SUPPORTED);
    /* The bound: 4 of their own, the rest in the spill. */
    for (int i = 2; i < 10; i++) {
        REQUIRE_OK(hm_provider_alloc(p, page, 0, &x[i]));
        memset(x[i], i, page);
    }
    CHECK_EQ(count_memfds("hm-test-own"), 5);
    for (int i = 0; i < 10; i++) {
        if (i >= 2) CHECK(((unsigned char *)x[i])[page - 1] == i);
        CHECK_OK(hm_provider_free(p, x[i], page));
    }
    CHECK_EQ(count_memfds("hm-test-own"), 1); /* the spill stays */
    CHECK_OK(hm_provider_destroy(p));
    CHECK_EQ(count_memfds("hm-test-own"), 0);
    hm_test_set_context(NULL);
}

static void test_memfd_reuse(void) {
    hm_test_set_context("spill memfd reuse");
    void *holder;
    int fd;
    hm_provider_t *p = spill_provider("hm-test-reuse", &holder, &fd);
    CHECK_EQ(fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_SEAL);
    struct stat st;

    /* Alloc/free in a loop with a bounded live set: the file stays bounded
     * by the peak, and its pages are released. */
    enum { LIVE = 8, ROUNDS = 2000 };
    void *live[LIVE] = {0};
    size_t sz[LIVE] = {0};
    uint64_t rng = 12345;
    off_t max_size = 0;
    for (int i = 0; i < ROUNDS; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((rng >> 33) % LIVE);
        if (live[k]) {
            CHECK(hm_test_verify(live[k], sz[k], (uint64_t)k + (uint64_t)sz[k]));
            CHECK_OK(hm_provider_free(p, live[k], sz[k]));
            live[k] = NULL;
        } else {
            sz[k] = 1 + (size_t)((rng >> 20) % (256 * KIB));
            size_t align = (rng & 1) ? 64 * KIB : 0;
            if (hm_provider_alloc(p, sz[k], align, &live[k]) != HM_SUCCESS) {
                CHECK(0);
                live[k] = NULL;
                continue;
            }
            hm_test_fill(live[k], sz[k], (uint64_t)k + (uint64_t)sz[k]);
        }
        REQUIRE(fstat(fd, &st) == 0);
        if (st.st_size > max_size) max_size = st.st_size;
    }
    /* At most LIVE allocations of <= 256 KiB + a page live at once; allow
     * fragmentation of 4x. */
    CHECK_MSG((size_t)max_size <= 4 * LIVE * (256 * KIB + page), "memfd grew to %lld bytes",
              (long long)max_size);
    for (int k = 0; k < LIVE; k++)
        if (live[k]) CHECK_OK(hm_provider_free(p, live[k], sz[k]));
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_EQ(st.st_blocks, 0); /* everything free: the file holds no pages */
    CHECK_OK(hm_provider_free(p, holder, 1));
    CHECK_OK(hm_provider_destroy(p));

    /* A freed hole in the middle is reused and its pages punched. */
    p = spill_provider("hm-test-reuse2", &holder, &fd);
    void *a, *b, *c;
    REQUIRE_OK(hm_provider_alloc(p, MIB, 0, &a));
    REQUIRE_OK(hm_provider_alloc(p, MIB, 0, &b));
    REQUIRE_OK(hm_provider_alloc(p, MIB, 0, &c));
    memset(a, 1, MIB);
    memset(b, 2, MIB);
    memset(c, 3, MIB);
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_EQ(st.st_size, 3 * MIB); /* the first spill allocation's page is reused */
    off_t blocks_full = st.st_blocks;
    CHECK_OK(hm_provider_free(p, b, MIB));
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_EQ(st.st_size, 3 * MIB);
    CHECK_MSG(st.st_blocks <= blocks_full - (off_t)(MIB / 512), "blocks %lld -> %lld",
              (long long)blocks_full, (long long)st.st_blocks);
    REQUIRE_OK(hm_provider_alloc(p, MIB / 2, 0, &b));
    memset(b, 4, MIB / 2);
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_EQ(st.st_size, 3 * MIB); /* the hole was reused, no growth */
    CHECK(((char *)a)[MIB - 1] == 1 && ((char *)c)[0] == 3);
    CHECK_OK(hm_provider_free(p, a, MIB));
    CHECK_OK(hm_provider_free(p, b, MIB / 2));
    CHECK_OK(hm_provider_free(p, c, MIB));
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_EQ(st.st_size, 3 * MIB); /* sealed against shrinking */
    CHECK_EQ(st.st_blocks, 0);

    /* Force purge gives the pages back to the file system (MADV_REMOVE):
     * the range reads zero afterwards and the file holds fewer blocks. */
    REQUIRE_OK(hm_provider_alloc(p, 2 * MIB, 0, &a));
    memset(a, 7, 2 * MIB);
    REQUIRE(fstat(fd, &st) == 0);
    blocks_full = st.st_blocks;
    CHECK_OK(hm_provider_purge_force(p, (char *)a + MIB, MIB));
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_MSG(st.st_blocks <= blocks_full - (off_t)(MIB / 512), "blocks %lld -> %lld",
              (long long)blocks_full, (long long)st.st_blocks);
    CHECK_EQ(resident((char *)a + MIB, MIB), 0);
    CHECK(((char *)a)[MIB] == 0 && ((char *)a)[MIB - 1] == 7);
    CHECK_OK(hm_provider_purge_lazy(p, a, MIB));
    CHECK_OK(hm_provider_free(p, a, 2 * MIB));

    /* Split: each part frees on its own; merge: contiguous parts rejoin. */
    REQUIRE_OK(hm_provider_alloc(p, 4 * page, 0, &a));
    CHECK_RES(hm_provider_split(p, a, 4 * page, 100), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_provider_split(p, a, 4 * page, 4 * page), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_split(p, a, 4 * page, page));
    b = (char *)a + page;
    CHECK_RES(hm_provider_free(p, a, 4 * page), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_split(p, b, 3 * page, page));
    c = (char *)b + page;
    CHECK_OK(hm_provider_merge(p, a, b, 2 * page));
    CHECK_RES(hm_provider_merge(p, a, c, 2 * page), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_free(p, a, 2 * page));
    CHECK_OK(hm_provider_free(p, c, 2 * page));
    REQUIRE(fstat(fd, &st) == 0);
    CHECK_EQ(st.st_blocks, 0);

    /* Two single-page allocations: the file gives them offsets 0 and page.
     * Where the kernel placed them next to each other in memory, merging
     * works if the file order matches the memory order, and is refused as
     * NOT_SUPPORTED if it does not (one mapping cannot cover both). */
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &a));
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &b));
    if ((char *)b == (char *)a + page) {
        CHECK_OK(hm_provider_merge(p, a, b, 2 * page));
        CHECK_OK(hm_provider_split(p, a, 2 * page, page));
    } else if ((char *)a == (char *)b + page) {
        CHECK_RES(hm_provider_merge(p, b, a, 2 * page), HM_ERROR_NOT_SUPPORTED);
    } else {
        CHECK_RES(hm_provider_merge(p, a, b, 2 * page), HM_ERROR_INVALID_ARGUMENT);
    }
    CHECK_OK(hm_provider_free(p, a, page));
    CHECK_OK(hm_provider_free(p, b, page));
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

/* IPC through the ops in one process: export, open a second mapping of the
 * same memory, see writes both ways. */
static void test_ipc(void) {
    hm_test_set_context("ipc");
    hm_provider_t *p = create(HM_OS_SHARED, HM_OS_PAGES_DEFAULT, RW);
    hm_provider_t *importer = create(HM_OS_SHARED, HM_OS_PAGES_DEFAULT, RW);
    REQUIRE(p && importer);
    /* The provider's own copy of the table dies with it: use the static one. */
    const hm_provider_ops_t *ops = hm_os_provider_ops();
    CHECK(hm_provider_get_ops(p)->ipc.get == ops->ipc.get);
    void *st = hm_provider_get_state(p), *ist = hm_provider_get_state(importer);
    REQUIRE(ops && ops->ipc.handle_size && ops->ipc.get && ops->ipc.open);
    size_t hs = ops->ipc.handle_size(st);
    CHECK(hs > 0 && hs <= 256);
    unsigned char payload[256], bad[256];

    const size_t size = 3 * page + 17;
    char *x;
    REQUIRE_OK(hm_provider_alloc(p, size, 0, (void **)&x));
    memset(x, 0x5a, size);
    int fd = -1;
    REQUIRE_OK(ops->ipc.get(st, x, size, payload, &fd));
    CHECK(fd >= 0);
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the importer's own copy */
    REQUIRE(mine >= 0);
    char *y = NULL;
    REQUIRE_OK(ops->ipc.open(ist, payload, mine, size, (void **)&y));
    close(mine); /* open must not keep it */
    CHECK(y && y != x);
    CHECK(y[0] == 0x5a && y[size - 1] == 0x5a);
    y[5] = 0x11;
    CHECK(x[5] == 0x11);
    x[page] = 0x22;
    CHECK(y[page] == 0x22);

    /* Malformed payloads and descriptors: clear errors, nothing mapped. */
    char *z = NULL;
    memcpy(bad, payload, hs);
    bad[0] ^= 0xff;
    mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    CHECK_RES(ops->ipc.open(ist, bad, mine, size, (void **)&z), HM_ERROR_INVALID_HANDLE);
    CHECK(z == NULL);
    CHECK_RES(ops->ipc.open(ist, payload, -1, size, (void **)&z), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(ops->ipc.open(ist, payload, mine, size + 10 * page, (void **)&z),
              HM_ERROR_INVALID_HANDLE);
    for (size_t i = 0; i < hs; i++) { /* every single-byte corruption is safe */
        memcpy(bad, payload, hs);
        bad[i] ^= 0x40;
        z = NULL;
        hm_result_t r = ops->ipc.open(ist, bad, mine, size, (void **)&z);
        if (r == HM_SUCCESS) CHECK_OK(ops->ipc.close(ist, z, size));
        else CHECK(z == NULL);
    }
    /* A descriptor that is not the memfd the handle names (another file,
     * even a long enough and sealed one): refused, nothing mapped. */
    int other = memfd_create("hm-test-other", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(other >= 0);
    REQUIRE(ftruncate(other, (off_t)(64 * page)) == 0);
    REQUIRE(fcntl(other, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    CHECK_RES(ops->ipc.open(ist, payload, other, size, (void **)&z), HM_ERROR_INVALID_HANDLE);
    CHECK(z == NULL);
    close(other);
    close(mine);
    CHECK_RES(ops->ipc.close(ist, x, size), HM_ERROR_INVALID_ARGUMENT); /* not opened */

    /* The IPC layer puts an export before it gives the range back (it owns
     * an exported range's lifetime: src/ipc/export.c; test_ipc_export_hold
     * checks that an importer keeps its bytes): put, then free. */
    CHECK_OK(ops->ipc.close(ist, y, size));
    CHECK_OK(ops->ipc.put(st, payload));
    CHECK_RES(ops->ipc.put(st, payload), HM_ERROR_INVALID_HANDLE); /* put twice */
    CHECK_OK(hm_provider_free(p, x, size));

    /* Split refuses while exported; put then split works. */
    REQUIRE_OK(hm_provider_alloc(p, 2 * page, 0, (void **)&x));
    REQUIRE_OK(ops->ipc.get(st, x, 2 * page, payload, &fd));
    CHECK_RES(hm_provider_split(p, x, 2 * page, page), HM_ERROR_BUSY);
    CHECK_OK(ops->ipc.put(st, payload));
    CHECK_OK(hm_provider_split(p, x, 2 * page, page));
    CHECK_OK(hm_provider_free(p, x, page));
    CHECK_OK(hm_provider_free(p, x + page, page));

    /* close_many: several opened mappings at once (adjacent ones unmapped
     * together), a pointer that is not an opened mapping is refused with
     * the others still closed. */
    {
        enum { M = 12 };
        REQUIRE(ops->ipc.close_many);
        void *open_at[M + 1];
        size_t sizes[M + 1];
        REQUIRE_OK(hm_provider_alloc(p, 4 * page, 0, (void **)&x));
        memset(x, 0x3c, 4 * page);
        REQUIRE_OK(ops->ipc.get(st, x, 4 * page, payload, &fd));
        for (int i = 0; i < M; i++) {
            mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
            REQUIRE(mine >= 0);
            sizes[i] = (size_t)(i % 4 + 1) * page;
            REQUIRE_OK(ops->ipc.open(ist, payload, mine, sizes[i], &open_at[i]));
            close(mine);
            CHECK(((char *)open_at[i])[sizes[i] - 1] == 0x3c);
            ((char *)open_at[i])[0] = (char)i; /* written: unmapping must flush */
        }
        open_at[M] = x; /* the exporter's own allocation: not an opened mapping */
        sizes[M] = 4 * page;
        CHECK_RES(ops->ipc.close_many(ist, open_at, sizes, M + 1), HM_ERROR_INVALID_ARGUMENT);
        unsigned char vec[4];
        for (int i = 0; i < M; i++) { /* gone: mincore fails with ENOMEM */
            errno = 0;
            CHECK_MSG(mincore(open_at[i], page, vec) == -1 && errno == ENOMEM,
                      "mapping %d at %p still mapped after close_many", i, open_at[i]);
        }
        CHECK(x[0] == (char)(M - 1) && x[4 * page - 1] == 0x3c); /* the exporter's is intact */
        CHECK_RES(ops->ipc.close(ist, open_at[0], sizes[0]), HM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(ops->ipc.close_many(ist, open_at, sizes, 0));
        CHECK_OK(ops->ipc.put(st, payload));
        CHECK_OK(hm_provider_free(p, x, 4 * page));
    }

    /* An importer destroyed with a mapping still open unmaps it. */
    REQUIRE_OK(hm_provider_alloc(p, page, 0, (void **)&x));
    REQUIRE_OK(ops->ipc.get(st, x, page, payload, &fd));
    mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    REQUIRE_OK(ops->ipc.open(ist, payload, mine, page, (void **)&y));
    close(mine);
    CHECK_OK(ops->ipc.put(st, payload));
    CHECK_OK(hm_provider_free(p, x, page));
    CHECK_OK(hm_provider_destroy(importer));
    CHECK_OK(hm_provider_destroy(p));

    /* Private mode: no IPC cap, get refuses. */
    p = create(HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, RW);
    REQUIRE(p);
    CHECK(!(hm_provider_caps(p) & HM_PROVIDER_CAP_IPC));
    REQUIRE_OK(hm_provider_alloc(p, page, 0, (void **)&x));
    CHECK_RES(ops->ipc.get(hm_provider_get_state(p), x, page, payload, &fd),
              HM_ERROR_NOT_SUPPORTED);
    CHECK_OK(hm_provider_free(p, x, page));
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

static void test_hugetlb(void) {
    hm_test_set_context("hugetlb");
    const struct {
        hm_os_page_kind_t kind;
        size_t size;
    } kinds[] = {{HM_OS_PAGES_HUGETLB_2M, 2 * MIB}, {HM_OS_PAGES_HUGETLB_1G, GIB}};
    for (int v = 0; v < 2; v++)
        for (size_t k = 0; k < 2; k++) {
            hm_os_params_t *par;
            REQUIRE_OK(hm_os_params_create(&par));
            CHECK_OK(hm_os_params_set_visibility(par, v ? HM_OS_SHARED : HM_OS_PRIVATE));
            CHECK_OK(hm_os_params_set_page_kind(par, kinds[k].kind));
            hm_provider_t *p = NULL;
            hm_result_t r = hm_os_provider_create(par, &p);
            CHECK_OK(hm_os_params_destroy(par));
            if (r != HM_SUCCESS) {
                /* No pool of that size configured: a clear answer. */
                CHECK_RES(r, HM_ERROR_NOT_SUPPORTED);
                CHECK(p == NULL);
                printf("hugetlb %zu MiB (%s): not configured here\n", kinds[k].size >> 20,
                       v ? "shared" : "private");
                continue;
            }
            CHECK_EQ(hm_provider_min_page_size(p), kinds[k].size);
            void *x = NULL;
            r = hm_provider_alloc(p, 1, 0, &x);
            if (r == HM_SUCCESS) {
                const size_t hp = kinds[k].size;
                CHECK((uintptr_t)x % hp == 0);
                memset(x, 1, 4096);
                CHECK_OK(hm_provider_purge_force(p, x, 1));
                CHECK(((char *)x)[0] == 0);
                CHECK_OK(hm_provider_free(p, x, 1));
                /* Two pages aligned to twice the page (the reserve-then-fixed
                 * path), split into pages, each freed on its own. Skipped
                 * when the pool has fewer than two pages free. */
                if (hp == 2 * MIB && hm_provider_alloc(p, hp + 1, 2 * hp, &x) == HM_SUCCESS) {
                    CHECK((uintptr_t)x % (2 * hp) == 0);
                    memset(x, 2, 2 * hp);
                    CHECK_RES(hm_provider_split(p, x, 2 * hp, 4096), HM_ERROR_INVALID_ARGUMENT);
                    CHECK_OK(hm_provider_split(p, x, hp + 1, hp));
                    CHECK(((char *)x)[2 * hp - 1] == 2);
                    CHECK_OK(hm_provider_free(p, x, hp));
                    CHECK_OK(hm_provider_free(p, (char *)x + hp, 1));
                }
            } else {
                /* Configured but exhausted (overcommit only, or all in use). */
                CHECK_RES(r, HM_ERROR_OUT_OF_MEMORY);
            }
            CHECK_OK(hm_provider_destroy(p));
        }
    hm_test_set_context(NULL);
}

/* ---- NUMA ----
 * Checked against what the kernel promises, so they hold on any machine
 * (one node here, several in scripts/vm-test.sh's guest): the policy the
 * kernel holds for the range (get_mempolicy) is the mode asked for over
 * exactly the nodes asked for; bind puts every page on some node of the set
 * (the kernel takes the node nearest the running CPU first, not the first of
 * the set); interleave cycles the pages over the set (any starting node);
 * preferred puts them on the node while it has memory free. */

enum { MASK_BITS = 1024 };
typedef struct nodemask {
    unsigned long bits[MASK_BITS / (8 * sizeof(unsigned long))];
} nodemask_t;

static void mask_set(nodemask_t *m, unsigned n) {
    if (n >= MASK_BITS) return; /* never in a mask: a check fails */
    m->bits[n / (8 * sizeof(unsigned long))] |= 1ul << (n % (8 * sizeof(unsigned long)));
}

static int mask_has(const nodemask_t *m, unsigned n) {
    return n < MASK_BITS &&
           (m->bits[n / (8 * sizeof(unsigned long))] >> (n % (8 * sizeof(unsigned long)))) & 1;
}

/* The kernel's policy of the page at addr: its mode (without mode flags),
 * and its nodes. -1 on error. hwloc asks for MPOL_PREFERRED_MANY (Linux
 * 5.15; an enumerator, not a macro, in the headers) where the kernel has it:
 * over one node, the same promise as MPOL_PREFERRED, which it is read as. */
static int policy_of(void *addr, nodemask_t *mask) {
    int mode = -1;
    memset(mask, 0, sizeof(*mask));
    if (syscall(SYS_get_mempolicy, &mode, mask->bits, (unsigned long)MASK_BITS, addr,
                MPOL_F_ADDR) != 0)
        return -1;
    mode &= ~MPOL_MODE_FLAGS;
    return mode == 5 /* MPOL_PREFERRED_MANY */ ? MPOL_PREFERRED : mode;
}

/* A node's MemTotal or MemFree in bytes from sysfs; -1 if unreadable. */
static long long node_mem(unsigned node, const char *what) {
    char path[96], line[256], key[64];
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%u/meminfo", node);
    snprintf(key, sizeof(key), "Node %u %s:", node, what);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, strlen(key)) == 0) {
            v = strtoll(line + strlen(key), NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

static const char *numa_mode_name(hm_os_numa_mode_t m) {
    return m == HM_OS_NUMA_BIND         ? "bind"
           : m == HM_OS_NUMA_INTERLEAVE ? "interleave"
                                        : "preferred";
}

static hm_provider_t *numa_provider(hm_os_numa_mode_t mode, hm_os_visibility_t vis,
                                    const unsigned *set, size_t n) {
    hm_os_params_t *par;
    hm_provider_t *p = NULL;
    REQUIRE_OK(hm_os_params_create(&par));
    CHECK_OK(hm_os_params_set_visibility(par, vis));
    /* No THP: a huge page would put 512 pages on one node. */
    CHECK_OK(hm_os_params_set_page_kind(par, HM_OS_PAGES_NO_THP));
    CHECK_OK(hm_os_params_set_numa(par, mode, set, n));
    hm_result_t r = hm_os_provider_create(par, &p);
    CHECK_MSG(r == HM_SUCCESS, "%s over %zu node(s): create -> %s", numa_mode_name(mode), n,
              hm_result_string(r));
    CHECK_OK(hm_os_params_destroy(par));
    return p;
}

/* Allocate, touch and check the placement of `pages` pages under one
 * policy over set[0..n). */
static void check_placement(hm_os_numa_mode_t mode, hm_os_visibility_t vis, const unsigned *set,
                            size_t n, size_t pages) {
    char what[160];
    int at = snprintf(what, sizeof(what), "%s %s over {", numa_mode_name(mode),
                      vis == HM_OS_SHARED ? "shared" : "private");
    for (size_t i = 0; i < n && at < (int)sizeof(what) - 16; i++)
        at += snprintf(what + at, sizeof(what) - (size_t)at, "%s%u", i ? "," : "", set[i]);
    snprintf(what + at, sizeof(what) - (size_t)at, "}");
    hm_test_set_context(what);
    hm_provider_t *p = numa_provider(mode, vis, set, n);
    if (!p) return;
    CHECK(hm_provider_caps(p) & HM_PROVIDER_CAP_NUMA);
    char *x = NULL;
    REQUIRE_OK(hm_provider_alloc(p, pages * page, 0, (void **)&x));

    /* The policy the kernel holds for the range. */
    nodemask_t m;
    int kmode = policy_of(x, &m);
    int want = mode == HM_OS_NUMA_BIND ? MPOL_BIND
               : mode == HM_OS_NUMA_INTERLEAVE ? MPOL_INTERLEAVE
                                               : MPOL_PREFERRED;
    CHECK_MSG(kmode == want, "kernel policy %d, want %d", kmode, want);
    nodemask_t wantmask;
    memset(&wantmask, 0, sizeof(wantmask));
    for (size_t i = 0; i < n; i++) mask_set(&wantmask, set[i]);
    CHECK_MSG(memcmp(&m, &wantmask, sizeof(m)) == 0, "the kernel's node mask differs");
    nodemask_t last;
    CHECK(policy_of(x + (pages - 1) * page, &last) == kmode && memcmp(&last, &m, sizeof(m)) == 0);

    memset(x, 0x5a, pages * page);
    unsigned *where = calloc(pages, sizeof(*where));
    REQUIRE(where);
    int placed = 1;
    for (size_t i = 0; i < pages; i++) {
        hm_result_t r = hm_os_numa_node_of(x + i * page, &where[i]);
        if (r != HM_SUCCESS) {
            CHECK_MSG(0, "node_of(page %zu) -> %s", i, hm_result_string(r));
            placed = 0;
            break;
        }
    }
    if (placed && mode == HM_OS_NUMA_BIND) {
        /* Every page on some node of the set; which one is the kernel's. */
        for (size_t i = 0; i < pages; i++)
            CHECK_MSG(mask_has(&wantmask, where[i]), "page %zu on node %u, outside the set", i,
                      where[i]);
    } else if (placed && mode == HM_OS_NUMA_INTERLEAVE) {
        /* Round-robin from any start: the first n pages are on the n nodes
         * of the set, and the pattern repeats every n pages. */
        size_t bad = 0;
        for (size_t i = 0; i < pages; i++) {
            int repeat = 0;
            for (size_t j = 0; j < i && j < n && i < n; j++) repeat |= where[j] == where[i];
            if (!mask_has(&wantmask, where[i]) || repeat) bad++;
            else if (i >= n && where[i] != where[i - n]) bad++;
        }
        CHECK_MSG(bad == 0, "%zu of %zu pages break the round-robin (first pages on %u %u %u %u)",
                  bad, pages, where[0], where[1 % pages], where[2 % pages], where[3 % pages]);
    } else if (placed) {
        /* Preferred: the node while it has memory free (4x what is asked). */
        long long free_bytes = node_mem(set[0], "MemFree");
        if (free_bytes < 0 || free_bytes > (long long)(4 * pages * page + 64 * MIB)) {
            for (size_t i = 0; i < pages; i++)
                CHECK_MSG(where[i] == set[0], "page %zu on node %u, preferred %u", i, where[i],
                          set[0]);
        } else {
            printf("numa: node %u has %lld KiB free: preferred placement not checked\n", set[0],
                   free_bytes >> 10);
        }
    }
    free(where);
    CHECK_OK(hm_provider_free(p, x, pages * page));
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

/* The nodes that can take pages (memory-only nodes count; a node with no
 * memory is listed by hwloc on some machines but cannot be bound alone). */
static size_t numa_nodes_with_memory(unsigned **out) {
    size_t count = 0;
    REQUIRE_OK(hm_os_numa_nodes(NULL, 0, &count));
    REQUIRE(count >= 1);
    unsigned *nodes = calloc(count, sizeof(*nodes));
    REQUIRE(nodes);
    REQUIRE_OK(hm_os_numa_nodes(nodes, count, &count));
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        if (node_mem(nodes[i], "MemTotal") == 0) {
            printf("numa: node %u has no memory: not bound to\n", nodes[i]);
            continue;
        }
        nodes[k++] = nodes[i];
    }
    REQUIRE(k >= 1);
    *out = nodes;
    return k;
}

static void test_numa_placement(void) {
    unsigned *nodes;
    size_t count = numa_nodes_with_memory(&nodes);
    printf("numa: %zu node(s) with memory:", count);
    for (size_t i = 0; i < count; i++)
        printf(" %u (%lld MiB, %lld MiB free)", nodes[i], node_mem(nodes[i], "MemTotal") >> 20,
               node_mem(nodes[i], "MemFree") >> 20);
    printf("\n");
    const size_t pages = 64;
    for (int vis = 0; vis < 2; vis++) {
        hm_os_visibility_t v = vis ? HM_OS_SHARED : HM_OS_PRIVATE;
        for (size_t i = 0; i < count; i++) {
            check_placement(HM_OS_NUMA_BIND, v, &nodes[i], 1, pages);
            check_placement(HM_OS_NUMA_INTERLEAVE, v, &nodes[i], 1, pages);
            check_placement(HM_OS_NUMA_PREFERRED, v, &nodes[i], 1, pages);
        }
        if (count > 1) {
            check_placement(HM_OS_NUMA_BIND, v, nodes, count, pages);
            check_placement(HM_OS_NUMA_INTERLEAVE, v, nodes, count, pages);
            /* The set in the other order: the same policy. */
            unsigned rev[64];
            size_t n = count < 64 ? count : 64;
            for (size_t i = 0; i < n; i++) rev[i] = nodes[n - 1 - i];
            check_placement(HM_OS_NUMA_INTERLEAVE, v, rev, n, pages);
        }
    }
    free(nodes);
}

/* Pools over a provider bound to each node: the pool's blocks live there. */
typedef struct numa_factory {
    hm_os_numa_mode_t mode;
    const unsigned *set;
    size_t n;
    int native; /* pool factories: the native pool, else the proxy pool */
} numa_factory_t;

static hm_result_t make_numa_os(void *arg, hm_provider_t **out) {
    const numa_factory_t *f = arg;
    hm_os_params_t *par;
    hm_result_t r = hm_os_params_create(&par);
    if (r) return r;
    if ((r = hm_os_params_set_numa(par, f->mode, f->set, f->n)) == HM_SUCCESS)
        r = hm_os_provider_create(par, out);
    hm_os_params_destroy(par);
    return r;
}

static hm_result_t make_numa_pool(void *arg, hm_pool_t **out) {
    const numa_factory_t *f = arg;
    hm_provider_t *p;
    hm_result_t r = make_numa_os(arg, &p);
    if (r) return r;
    r = f->native ? hm_native_pool_create(p, NULL, HM_POOL_FLAG_OWN_PROVIDER, out)
                  : hm_proxy_pool_create(p, HM_POOL_FLAG_OWN_PROVIDER, out);
    if (r) hm_provider_destroy(p);
    return r;
}

static void pool_placement(numa_factory_t *f, unsigned node, const char *label) {
    hm_test_set_context(label);
    for (int native = 0; native < 2; native++) {
        f->native = native;
        hm_pool_t *pool;
        REQUIRE_OK(make_numa_pool(f, &pool));
        enum { N = 64 };
        char *b[N];
        for (int k = 0; k < N; k++) {
            b[k] = hm_pool_malloc(pool, 1000 + (size_t)k * 1500);
            CHECK(b[k] != NULL);
            if (b[k]) memset(b[k], k, 1000 + (size_t)k * 1500);
        }
        for (int k = 0; k < N; k++) {
            unsigned where = ~0u;
            if (!b[k]) continue;
            CHECK_OK(hm_os_numa_node_of(b[k], &where));
            CHECK_MSG(where == node, "%s pool block %d on node %u", native ? "native" : "proxy",
                      k, where);
        }
        for (int k = 0; k < N; k++)
            if (b[k]) CHECK_OK(hm_pool_free(pool, b[k]));
        CHECK_OK(hm_pool_destroy(pool));
    }
    hm_test_set_context(NULL);
}

/* Per node: pools over a provider bound to it keep their blocks there, and
 * the provider suite passes over it. The pool suites (the costly part in a
 * TCG guest) run once, over all nodes interleaved (one node: bound to it). */
static void test_numa_pools(void) {
    unsigned *nodes;
    size_t count = numa_nodes_with_memory(&nodes);
    char label[96];
    hm_test_suite_opts_t o = {.can_free = 1, .max_alloc = 8 * MIB, .threads = 2};
    for (size_t i = 0; i < count; i++) {
        numa_factory_t f = {HM_OS_NUMA_BIND, &nodes[i], 1, 0};
        snprintf(label, sizeof(label), "pools bound to node %u", nodes[i]);
        pool_placement(&f, nodes[i], label);
        snprintf(label, sizeof(label), "os bind node %u", nodes[i]);
        hm_test_provider_suite(label, make_numa_os, &f, &o);
    }
    numa_factory_t f = {count > 1 ? HM_OS_NUMA_INTERLEAVE : HM_OS_NUMA_BIND, nodes, count, 0};
    if (count > 1) {
        snprintf(label, sizeof(label), "os interleave %zu nodes", count);
        hm_test_provider_suite(label, make_numa_os, &f, &o);
    }
    snprintf(label, sizeof(label), "proxy/os %s %zu node(s)", count > 1 ? "interleave" : "bind",
             count);
    hm_test_pool_suite(label, make_numa_pool, &f, &o);
    f.native = 1;
    snprintf(label, sizeof(label), "native/os %s %zu node(s)",
             count > 1 ? "interleave" : "bind", count);
    hm_test_pool_suite(label, make_numa_pool, &f, &o);
    free(nodes);
}

static void test_numa(void) {
    hm_test_set_context("numa");
    size_t count = 0;
    CHECK_RES(hm_os_numa_nodes(NULL, 0, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_numa_nodes(NULL, 4, &count), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE_OK(hm_os_numa_nodes(NULL, 0, &count));
    REQUIRE(count >= 1);
    unsigned *nodes = calloc(count, sizeof(*nodes));
    REQUIRE(nodes);
    CHECK_OK(hm_os_numa_nodes(nodes, count, &count));
    /* Every node once, in ascending order, each the kernel's node (it has a
     * sysfs folder). */
    for (size_t i = 0; i < count; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/sys/devices/system/node/node%u", nodes[i]);
        CHECK_MSG(access(dir, F_OK) == 0 || count == 1, "node %u: no %s", nodes[i], dir);
        if (i) CHECK_MSG(nodes[i - 1] < nodes[i], "nodes out of order: %u before %u", nodes[i - 1],
                         nodes[i]);
    }
    if (count > 1) CHECK_RES(hm_os_numa_nodes(nodes, 1, &count), HM_ERROR_LIMIT);
    unsigned node = 0;
    CHECK_RES(hm_os_numa_node_of(NULL, &node), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm_os_numa_node_of(&node, NULL), HM_ERROR_INVALID_ARGUMENT);

    /* Unknown nodes are refused at creation, with no provider made. */
    hm_os_params_t *par;
    REQUIRE_OK(hm_os_params_create(&par));
    unsigned badnodes[2] = {nodes[0], 9999};
    CHECK_OK(hm_os_params_set_numa(par, HM_OS_NUMA_BIND, badnodes, 2));
    hm_provider_t *p = (hm_provider_t *)&par; /* must be reset */
    CHECK_RES(hm_os_provider_create(par, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK(p == NULL);
    badnodes[0] = 1u << 31;
    CHECK_OK(hm_os_params_set_numa(par, HM_OS_NUMA_PREFERRED, badnodes, 1));
    CHECK_RES(hm_os_provider_create(par, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_os_params_destroy(par));

    /* An untouched page has no node yet. */
    void *fresh = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(fresh != MAP_FAILED);
    hm_result_t r = hm_os_numa_node_of(fresh, &node);
    CHECK_MSG(r == HM_ERROR_NOT_FOUND || r == HM_SUCCESS, "node_of(untouched) -> %s",
              hm_result_string(r));
    munmap(fresh, page);
    free(nodes);
    hm_test_set_context(NULL);
    test_numa_placement();
}

static void test_protection(void) {
    hm_test_set_context("protection");
    /* PROT_NONE: a stand-in for device memory; touching it faults. */
    hm_provider_t *p = create(HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, HM_OS_PROT_NONE);
    REQUIRE(p);
    CHECK(!hm_provider_cpu_accessible(p));
    CHECK(!(hm_provider_caps(p) & HM_PROVIDER_CAP_CPU_ACCESS));
    CHECK_EQ(hm_provider_memory_kind(p), HM_MEMORY_DEVICE);
    void *x;
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &x));
    CHECK_EQ(child_faults(touch_read, x), 1);
    CHECK_OK(hm_provider_purge_force(p, x, page));
    CHECK_OK(hm_provider_free(p, x, page));
    CHECK_OK(hm_provider_destroy(p));

    /* Read-only: reads work, writes fault. */
    p = create(HM_OS_SHARED, HM_OS_PAGES_DEFAULT, HM_OS_PROT_READ);
    REQUIRE(p);
    CHECK(hm_provider_cpu_accessible(p));
    REQUIRE_OK(hm_provider_alloc(p, page, 0, &x));
    CHECK_EQ(child_faults(touch_read, x), 0);
    CHECK_EQ(child_faults(touch_write, x), 1);
    CHECK_OK(hm_provider_free(p, x, page));
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

static void test_purge_rss(void) {
    hm_test_set_context("purge");
    hm_provider_t *p = create(HM_OS_PRIVATE, HM_OS_PAGES_NO_THP, RW);
    REQUIRE(p);
    const size_t len = 4 * MIB;
    char *x;
    REQUIRE_OK(hm_provider_alloc(p, len, 0, (void **)&x));
    CHECK_EQ(resident(x, len), 0);
    memset(x, 9, len);
    CHECK_EQ(resident(x, len), len / page);
    CHECK_OK(hm_provider_purge_force(p, x + MIB, 2 * MIB));
    CHECK_EQ(resident(x, len), len / page - 2 * MIB / page);
    CHECK(x[MIB] == 0 && x[3 * MIB - 1] == 0 && x[MIB - 1] == 9 && x[3 * MIB] == 9);
    /* Lazy: the pages may stay until memory pressure, but the range stays
     * usable; rewriting keeps the new data. */
    CHECK_OK(hm_provider_purge_lazy(p, x, len));
    memset(x, 3, len);
    CHECK(x[0] == 3 && x[len - 1] == 3);
    CHECK_RES(hm_provider_purge_force(p, x + 1, page), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm_provider_free(p, x, len));
    CHECK_OK(hm_provider_destroy(p));
    hm_test_set_context(NULL);
}

static void test_native_error(void) {
    hm_test_set_context("native errors");
    for (int vis = 0; vis < 2; vis++) {
        hm_provider_t *p = create(vis ? HM_OS_SHARED : HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, RW);
        REQUIRE(p);
        void *x = (void *)1;
        /* 1 PiB: passes every argument check, the kernel says ENOMEM. */
        CHECK_RES(hm_provider_alloc(p, (size_t)1 << 50, 0, &x), HM_ERROR_OUT_OF_MEMORY);
        CHECK(x == NULL);
        const char *msg = NULL;
        CHECK_EQ(hm_last_native_error(&msg), ENOMEM);
        CHECK_MSG(msg && strstr(msg, "mmap"), "message: %s", msg ? msg : "(null)");
        CHECK_RES(hm_provider_alloc(p, (size_t)1 << 46, (size_t)1 << 46, &x),
                  HM_ERROR_OUT_OF_MEMORY);
        CHECK_EQ(hm_last_native_error(NULL), ENOMEM);
        /* Still works, and in shared mode the file did not keep the size. */
        CHECK_OK(hm_provider_alloc(p, page, 0, &x));
        CHECK_OK(hm_provider_free(p, x, page));
        CHECK_OK(hm_provider_destroy(p));
    }
    hm_test_set_context(NULL);
}

/* Several threads on one shared provider: every allocation keeps its data. */
typedef struct worker_arg {
    hm_provider_t *p;
    int id;
    int errors;
} worker_arg_t;

static void *shared_worker(void *argp) {
    worker_arg_t *a = argp;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(a->id + 1);
    void *live[8] = {0};
    size_t sz[8] = {0};
    for (int i = 0; i < 400; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int k = (int)(rng % 8);
        uint64_t seed = (uint64_t)a->id * 1000 + (uint64_t)k;
        if (live[k]) {
            if (!hm_test_verify(live[k], sz[k], seed)) a->errors++;
            if (hm_provider_free(a->p, live[k], sz[k]) != HM_SUCCESS) a->errors++;
            live[k] = NULL;
        } else {
            sz[k] = 1 + (size_t)(rng >> 40) % (64 * KIB);
            if (hm_provider_alloc(a->p, sz[k], (rng & 2) ? 16 * KIB : 0, &live[k]) !=
                HM_SUCCESS) {
                a->errors++;
                live[k] = NULL;
                continue;
            }
            hm_test_fill(live[k], sz[k], seed);
        }
    }
    for (int k = 0; k < 8; k++)
        if (live[k] && hm_provider_free(a->p, live[k], sz[k]) != HM_SUCCESS) a->errors++;
    return NULL;
}

static void test_shared_threads(void) {
    hm_test_set_context("shared threads");
    hm_os_params_t *par;
    REQUIRE_OK(hm_os_params_create(&par));
    CHECK_OK(hm_os_params_set_visibility(par, HM_OS_SHARED));
    CHECK_OK(hm_os_params_set_shm_name(par, "hm-test-threads"));
    hm_provider_t *p;
    REQUIRE_OK(hm_os_provider_create(par, &p));
    CHECK_OK(hm_os_params_destroy(par));
    enum { N = 4 };
    pthread_t t[N];
    worker_arg_t args[N];
    for (int i = 0; i < N; i++) {
        args[i] = (worker_arg_t){.p = p, .id = i};
        REQUIRE(pthread_create(&t[i], NULL, shared_worker, &args[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(args[i].errors, 0);
    }
    /* Every allocation freed: every memfd of its own closed (the spill, if
     * the threads ever had more than the bound live, stays empty). */
    int fd = find_memfd("hm-test-threads");
    struct stat st;
    if (fd >= 0) {
        REQUIRE(fstat(fd, &st) == 0);
        CHECK_EQ(st.st_blocks, 0);
        CHECK_EQ(find_memfd_except("hm-test-threads", fd), -1);
    }
    CHECK_OK(hm_provider_destroy(p));
    CHECK_EQ(find_memfd("hm-test-threads"), -1); /* the memfd is closed */
    hm_test_set_context(NULL);
}

/* After fork: private mode works in the child; a shared provider refuses to
 * allocate there (its extents belong to the parent) but still unmaps. */
static void test_fork(void) {
    hm_test_set_context("fork");
    hm_provider_t *pp = create(HM_OS_PRIVATE, HM_OS_PAGES_DEFAULT, RW);
    hm_provider_t *sp = create(HM_OS_SHARED, HM_OS_PAGES_DEFAULT, RW);
    REQUIRE(pp && sp);
    char *shared_mem;
    REQUIRE_OK(hm_provider_alloc(sp, page, 0, (void **)&shared_mem));
    shared_mem[0] = 1;
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int bad = 0;
        void *x;
        if (hm_provider_alloc(pp, page, 0, &x) != HM_SUCCESS) bad |= 1;
        else if (hm_provider_free(pp, x, page) != HM_SUCCESS) bad |= 2;
        if (hm_provider_alloc(sp, page, 0, &x) != HM_ERROR_NOT_SUPPORTED) bad |= 4;
        shared_mem[0] = 42; /* MAP_SHARED: the parent sees it */
        if (hm_provider_free(sp, shared_mem, page) != HM_SUCCESS) bad |= 8;
        _exit(bad);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    CHECK_EQ(shared_mem[0], 42);
    CHECK_OK(hm_provider_free(sp, shared_mem, page));
    CHECK_OK(hm_provider_destroy(sp));
    CHECK_OK(hm_provider_destroy(pp));
    hm_test_set_context(NULL);
}

/* No argument: every case. "numa": the NUMA cases and the suites over
 * NUMA-bound providers only (CTest's test_os_provider_numa, labelled
 * hardware: scripts/vm-test.sh runs it in a guest with several nodes). */
int main(int argc, char **argv) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    if (argc > 1) {
        if (strcmp(argv[1], "numa") != 0) {
            fprintf(stderr, "usage: %s [numa]\n", argv[0]);
            return 2;
        }
        test_numa();
        test_numa_pools();
        return hm_test_finish();
    }
    test_params();
    test_info();
    test_alignment(HM_OS_PRIVATE);
    test_alignment(HM_OS_SHARED);
    test_memfd_own();
    test_memfd_reuse();
    test_ipc();
    test_hugetlb();
    test_numa();
    test_protection();
    test_purge_rss();
    test_native_error();
    test_shared_threads();
    test_fork();
    run_suites();
    return hm_test_finish();
}
