/* hetmem tests — the platform primitives (src/platform/prim.h).
 * SPDX-License-Identifier: MIT */
#include "harness.h"
#include "platform/prim.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static size_t page;

static void test_sizes(void) {
    page = hm__prim_page_size();
    CHECK_EQ(page, (size_t)sysconf(_SC_PAGESIZE));
    CHECK(hm_is_pow2(page));
    size_t thp = hm__prim_thp_size();
    CHECK(thp == 0 || (hm_is_pow2(thp) && thp > page));
    uint64_t n = 99;
    hm_result_t r = hm__prim_hugetlb_available(2 * MIB, &n);
    CHECK(r == HM_SUCCESS || r == HM_ERROR_OUT_OF_MEMORY || r == HM_ERROR_NOT_SUPPORTED);
    CHECK(r != HM_SUCCESS || n > 0);
    CHECK_RES(hm__prim_hugetlb_available(3 * MIB, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__prim_hugetlb_available((size_t)1 << 50, NULL), HM_ERROR_NOT_SUPPORTED);
}

static void test_map(void) {
    /* Anonymous, every alignment up to 64 MiB: aligned and usable. */
    for (size_t a = 0; a <= 64 * MIB; a = a ? a * 4 : 1) {
        void *p = NULL;
        CHECK_OK(hm__prim_map(3 * page, a, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, 0, -1, 0, &p));
        if (!p) continue;
        size_t want = a > page ? a : page;
        CHECK((uintptr_t)p % want == 0);
        memset(p, 1, 3 * page);
        CHECK_OK(hm__prim_protect(p, page, HM_PRIM_PROT_READ));
        CHECK_OK(hm__prim_unmap(p, 3 * page));
    }
    /* A file mapping aligned by the reserve-then-MAP_FIXED path. */
    int fd = -1;
    REQUIRE_OK(hm__prim_memfd_create("hm-prim", 0, &fd));
    REQUIRE_OK(hm__prim_ftruncate(fd, 4 * page));
    void *p = NULL, *q = NULL;
    REQUIRE_OK(hm__prim_map(2 * page, 8 * MIB, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                            HM_PRIM_MAP_SHARED, fd, 2 * page, &p));
    CHECK((uintptr_t)p % (8 * MIB) == 0);
    REQUIRE_OK(hm__prim_map(4 * page, 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE,
                            HM_PRIM_MAP_SHARED, fd, 0, &q));
    ((char *)p)[0] = 42;
    CHECK(((char *)q)[2 * page] == 42); /* the same file page */
    uint64_t size = 0, alloc = 0;
    CHECK_OK(hm__prim_fd_size(fd, &size, &alloc));
    CHECK_EQ(size, 4 * page);
    CHECK(alloc >= page);
    CHECK_OK(hm__prim_punch_hole(fd, 2 * page, page));
    CHECK_OK(hm__prim_fd_size(fd, NULL, &alloc));
    CHECK_EQ(alloc, 0);
    CHECK(((char *)q)[2 * page] == 0); /* (a read fault on shmem allocates the page again) */
    /* MADV_REMOVE through a mapping punches the file too. */
    memset(q, 3, 4 * page);
    CHECK_OK(hm__prim_advise(q, 4 * page, HM_PRIM_ADVISE_REMOVE));
    CHECK_OK(hm__prim_fd_size(fd, NULL, &alloc));
    CHECK_EQ(alloc, 0);
    /* MADV_FREE on a shared mapping falls back to MADV_DONTNEED quietly. */
    CHECK_OK(hm__prim_advise(q, page, HM_PRIM_ADVISE_FREE));
    CHECK_OK(hm__prim_advise(q, page, HM_PRIM_ADVISE_DONTNEED));
    CHECK_RES(hm__prim_advise(q, page, (hm_prim_advice_t)77), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm__prim_unmap(p, 2 * page));
    CHECK_OK(hm__prim_unmap(q, 4 * page));
    int d = -1;
    CHECK_OK(hm__prim_dup(fd, &d));
    CHECK(d >= 0 && d != fd && (fcntl(d, F_GETFD) & FD_CLOEXEC));
    CHECK_OK(hm__prim_close(d));
    CHECK_OK(hm__prim_close(fd));

    /* Residency through mincore. */
    REQUIRE_OK(hm__prim_map(8 * page, 0, HM_PRIM_PROT_READ | HM_PRIM_PROT_WRITE, 0, -1, 0, &p));
    size_t res = 99;
    CHECK_OK(hm__prim_resident_pages(p, 8 * page, &res));
    CHECK_EQ(res, 0);
    memset(p, 1, 3 * page);
    CHECK_OK(hm__prim_resident_pages(p, 8 * page, &res));
    CHECK_EQ(res, 3);
    CHECK_OK(hm__prim_advise(p, 8 * page, HM_PRIM_ADVISE_DONTNEED));
    CHECK_OK(hm__prim_resident_pages(p, 8 * page, &res));
    CHECK_EQ(res, 0);
    CHECK_OK(hm__prim_advise(p, 8 * page, HM_PRIM_ADVISE_FREE));
    CHECK_OK(hm__prim_unmap(p, 8 * page));
}

static void test_errors(void) {
    /* Each failure records errno and names the call. */
    const char *msg;
    void *p = (void *)1;
    CHECK_RES(hm__prim_map((size_t)1 << 50, 0, HM_PRIM_PROT_READ, 0, -1, 0, &p),
              HM_ERROR_OUT_OF_MEMORY);
    CHECK(p == NULL);
    CHECK_EQ(hm_last_native_error(&msg), ENOMEM);
    CHECK(strstr(msg, "mmap") != NULL);
    CHECK_RES(hm__prim_map(page, 3 * page, HM_PRIM_PROT_READ, 0, -1, 0, &p),
              HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__prim_map(0, 0, HM_PRIM_PROT_READ, 0, -1, 0, &p), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__prim_map(page, 0, HM_PRIM_PROT_READ, HM_PRIM_MAP_SHARED, 12345, 0, &p),
              HM_ERROR_DRIVER);
    CHECK_EQ(hm_last_native_error(NULL), EBADF);
    CHECK_RES(hm__prim_unmap((void *)3, page), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(hm_last_native_error(&msg), EINVAL);
    CHECK(strstr(msg, "munmap") != NULL);
    CHECK_RES(hm__prim_ftruncate(-1, 10), HM_ERROR_DRIVER);
    CHECK_EQ(hm_last_native_error(&msg), EBADF);
    CHECK(strstr(msg, "ftruncate") != NULL);
    CHECK(hm__prim_ftruncate(-1, UINT64_MAX) != HM_SUCCESS);
    CHECK(hm__prim_punch_hole(-1, 0, page) != HM_SUCCESS);
    CHECK(strstr((hm_last_native_error(&msg), msg), "fallocate") != NULL);
    CHECK(hm__prim_fd_size(-1, NULL, NULL) != HM_SUCCESS);
    CHECK(hm__prim_close(-1) != HM_SUCCESS);
    int fd = 7;
    char longname[300];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    CHECK_RES(hm__prim_memfd_create(longname, 0, &fd), HM_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(fd, -1);
    CHECK(strstr((hm_last_native_error(&msg), msg), "memfd_create") != NULL);
}

static void *tid_thread(void *arg) {
    *(uint64_t *)arg = hm__prim_gettid();
    return NULL;
}

static void test_process(void) {
    uint64_t t0 = 0, t1 = 0;
    CHECK_OK(hm__prim_process_start_time(0, &t0));
    CHECK_OK(hm__prim_process_start_time(getpid(), &t1));
    CHECK(t0 > 0 && t0 == t1);
    CHECK(hm__prim_process_start_time(0x3fffffff, &t1) != HM_SUCCESS); /* no such pid */

    unsigned char a[64] = {0}, b[64] = {0};
    CHECK_OK(hm__prim_random(a, sizeof(a)));
    CHECK_OK(hm__prim_random(b, sizeof(b)));
    CHECK(memcmp(a, b, sizeof(a)) != 0);
    uint64_t nonce = hm__prim_process_nonce();
    CHECK(nonce != 0 && nonce == hm__prim_process_nonce());

    uint64_t main_tid = hm__prim_gettid(), other = 0;
    CHECK_EQ(main_tid, (uint64_t)getpid());
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, tid_thread, &other) == 0);
    pthread_join(th, NULL);
    CHECK(other != 0 && other != main_tid);

    /* A forked child: a new epoch, a new nonce, another start time. */
    unsigned epoch = hm__prim_fork_epoch();
    int pipefd[2];
    REQUIRE(pipe(pipefd) == 0);
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        uint64_t out[3] = {hm__prim_fork_epoch(), hm__prim_process_nonce(), 0};
        (void)hm__prim_process_start_time(0, &out[2]);
        ssize_t w = write(pipefd[1], out, sizeof(out));
        _exit(w == (ssize_t)sizeof(out) ? 0 : 1);
    }
    uint64_t got[3] = {0};
    CHECK_EQ(read(pipefd[0], got, sizeof(got)), (ssize_t)sizeof(got));
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(got[0], epoch + 1);
    CHECK(got[1] != 0 && got[1] != nonce);
    CHECK(got[2] >= t0);
    CHECK_EQ(hm__prim_fork_epoch(), epoch); /* the parent is unchanged */
    CHECK_EQ(hm__prim_process_nonce(), nonce);
    close(pipefd[0]);
    close(pipefd[1]);

    /* pidfd: take a copy of one of our own descriptors. */
    int pidfd = -1;
    hm_result_t r = hm__prim_pidfd_open(getpid(), &pidfd);
    if (r == HM_ERROR_NOT_SUPPORTED) {
        printf("pidfd_open: not supported by this kernel\n");
        return;
    }
    REQUIRE_OK(r);
    int memfd = -1, copy = -1;
    REQUIRE_OK(hm__prim_memfd_create("hm-pidfd", 0, &memfd));
    REQUIRE_OK(hm__prim_ftruncate(memfd, 12345));
    r = hm__prim_pidfd_getfd(pidfd, memfd, &copy);
    if (r == HM_SUCCESS) {
        uint64_t size = 0;
        CHECK(copy >= 0 && copy != memfd);
        CHECK_OK(hm__prim_fd_size(copy, &size, NULL));
        CHECK_EQ(size, 12345);
        CHECK(fcntl(copy, F_GETFD) & FD_CLOEXEC);
        hm__prim_close(copy);
    } else {
        /* Refused (seccomp, Yama, old kernel): a clear error and errno. */
        CHECK(r == HM_ERROR_PERMISSION || r == HM_ERROR_NOT_SUPPORTED);
        CHECK(hm_last_native_error(NULL) != 0);
    }
    CHECK(hm__prim_pidfd_getfd(pidfd, 98765, &copy) != HM_SUCCESS); /* no such fd */
    CHECK_EQ(copy, -1);
    CHECK(hm__prim_pidfd_open(-5, &copy) != HM_SUCCESS);
    hm__prim_close(memfd);
    hm__prim_close(pidfd);
}

/* Descriptors hetmem keeps: moved high and close-on-exec, and checked. */
static void test_kept_fds(void) {
    hm_test_set_context("kept descriptors");
    int fd = -1;
    REQUIRE_OK(hm__prim_memfd_create("kept", 0, &fd));
    int low = fd;
    hm_prim_file_id_t id;
    REQUIRE_OK(hm__prim_fd_keep(&fd, &id));
    CHECK_MSG(fd >= HM_PRIM_FD_KEEP_MIN, "kept at %d", fd);
    CHECK(fcntl(low, F_GETFD) < 0 && errno == EBADF); /* the low number is free again */
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK_OK(hm__prim_fd_check(fd, &id));
    /* Another file at its number. */
    int other = open("/dev/null", O_RDWR | O_CLOEXEC);
    REQUIRE(other >= 0);
    int saved = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    REQUIRE(saved >= 0);
    REQUIRE(dup2(other, fd) == fd);
    CHECK_RES(hm__prim_fd_check(fd, &id), HM_ERROR_DRIVER);
    const char *msg = NULL;
    CHECK_EQ(hm_last_native_error(&msg), EBADF);
    CHECK(msg && strstr(msg, "another file"));
    /* Closed. */
    REQUIRE(close(fd) == 0);
    CHECK_RES(hm__prim_fd_check(fd, &id), HM_ERROR_DRIVER);
    CHECK_EQ(hm_last_native_error(NULL), EBADF);
    CHECK_RES(hm__prim_fd_check(-1, &id), HM_ERROR_DRIVER);
    /* The same file back at the number (a dup of it): fine. */
    REQUIRE(dup2(saved, fd) == fd);
    CHECK_OK(hm__prim_fd_check(fd, &id));
    close(fd);
    close(saved);
    close(other);
    /* A descriptor already high stays where it is (and becomes
     * close-on-exec). */
    int high = fcntl(0, F_DUPFD, HM_PRIM_FD_KEEP_MIN + 100);
    if (high >= 0) {
        int was = high;
        CHECK_OK(hm__prim_fd_keep(&high, &id));
        CHECK_EQ(high, was);
        CHECK((fcntl(high, F_GETFD) & FD_CLOEXEC) != 0);
        close(high);
    }
    /* A closed descriptor cannot be kept. */
    int bad = 1000000;
    CHECK_RES(hm__prim_fd_keep(&bad, &id), HM_ERROR_DRIVER);
    CHECK_EQ(bad, -1);
    hm_test_set_context(NULL);
}

int main(void) {
    test_sizes();
    test_kept_fds();
    test_map();
    test_errors();
    test_process();
    return hm_test_finish();
}
