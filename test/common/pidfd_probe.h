/* hetmem tests — does pidfd_getfd work here at all (kernel, seccomp)?
 * SPDX-License-Identifier: MIT */
#ifndef HM_TEST_PIDFD_PROBE_H
#define HM_TEST_PIDFD_PROBE_H

#include <sys/syscall.h>
#include <unistd.h>

static inline int pidfd_getfd_works(void) {
#ifdef SYS_pidfd_getfd
    int pfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pfd < 0) return 0;
    int fd = (int)syscall(SYS_pidfd_getfd, pfd, 0, 0);
    close(pfd);
    if (fd < 0) return 0;
    close(fd);
    return 1;
#else
    return 0;
#endif
}

#endif
