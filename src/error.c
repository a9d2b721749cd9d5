/* hetmem — results, native errors, fatal errors. SPDX-License-Identifier: MIT */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *hm_result_string(hm_result_t result) {
    switch (result) {
#define HM__RESULT_CASE(name, value, msg) \
    case HM_##name: return msg;
        HM_RESULT_MAP(HM__RESULT_CASE)
#undef HM__RESULT_CASE
    }
    return "unknown result code";
}

unsigned hm_version(void) { return HM_VERSION; }

#define HM__STR2(x) #x
#define HM__STR(x) HM__STR2(x)
const char *hm_version_string(void) {
    return HM__STR(HM_VERSION_MAJOR) "." HM__STR(HM_VERSION_MINOR) "." HM__STR(HM_VERSION_PATCH);
}

const char *hm_memory_kind_string(hm_memory_kind_t kind) {
    switch (kind) {
    case HM_MEMORY_HOST: return "host";
    case HM_MEMORY_HOST_PINNED: return "host-pinned";
    case HM_MEMORY_DEVICE: return "device";
    case HM_MEMORY_SHARED: return "shared";
    }
    return "unknown";
}

/* The one per-thread "last native error" of the library. */
static __thread struct {
    int64_t code;
    char message[160];
} last_native;

int64_t hm_last_native_error(const char **message) {
    if (message) *message = last_native.code ? last_native.message : "";
    return last_native.code;
}

/* errno_text: the code is an errno value, whose strerror() text is
 * appended; a driver's code (CUresult, ze_result_t) gets none. */
static void set_native(int64_t code, bool errno_text, const char *fmt, va_list ap) {
    last_native.code = code;
    int n = vsnprintf(last_native.message, sizeof(last_native.message), fmt, ap);
    if (n < 0) last_native.message[0] = 0;
    size_t len = strlen(last_native.message);
    if (errno_text && code > 0 && code < 4096 && len + 4 < sizeof(last_native.message))
        snprintf(last_native.message + len, sizeof(last_native.message) - len, ": %s",
                 strerror((int)code));
}

/* Record and log a native error (errno is kept as the caller had it). */
static void record(int64_t code, bool errno_text, const char *fmt, va_list ap) {
    int saved = errno;
    set_native(code, errno_text, fmt, ap);
    HM_LOG_WARN("%s error %lld: %s", errno_text ? "native" : "driver", (long long)code,
                last_native.message);
    errno = saved;
}

hm_result_t hm__native_error(int64_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(code, true, fmt, ap);
    va_end(ap);
    return HM_ERROR_DRIVER;
}

hm_result_t hm__driver_error(int64_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(code, false, fmt, ap);
    va_end(ap);
    return HM_ERROR_DRIVER;
}

hm_result_t hm__errno_result(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(err, true, fmt, ap);
    va_end(ap);
    switch (err) {
    case ENOMEM: return HM_ERROR_OUT_OF_MEMORY;
    case EINVAL: return HM_ERROR_INVALID_ARGUMENT;
    case EPERM:
    case EACCES: return HM_ERROR_PERMISSION;
    case ENOSYS:
    case EOPNOTSUPP: return HM_ERROR_NOT_SUPPORTED;
    case ENOSPC:
    case EFBIG: return HM_ERROR_OUT_OF_MEMORY;
    default: return HM_ERROR_DRIVER;
    }
}

int hm__result_errno(hm_result_t r) {
    switch (r) {
    case HM_SUCCESS: return 0;
    case HM_ERROR_OUT_OF_HOST_MEMORY:
    case HM_ERROR_OUT_OF_MEMORY:
    case HM_ERROR_LIMIT: return ENOMEM;
    case HM_ERROR_NOT_SUPPORTED: return ENOTSUP;
    case HM_ERROR_PERMISSION: return EPERM;
    case HM_ERROR_BUSY: return EBUSY;
    case HM_ERROR_DRIVER: return EIO;
    default: return EINVAL;
    }
}

void hm__die(const char *file, int line, const char *fmt, ...) {
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "hetmem FATAL %s:%d: ", file, line);
    if (n < 0) n = 0;
    va_list ap;
    va_start(ap, fmt);
    if ((size_t)n < sizeof(buf)) vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    if (len < sizeof(buf) - 1) buf[len++] = '\n';
    ssize_t w = write(2, buf, len);
    (void)w;
    abort();
}
