/* hetmem — base definitions: results, versions, memory kinds, native errors.
 * SPDX-License-Identifier: MIT */
#ifndef HETMEM_BASE_H
#define HETMEM_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HM_STATIC_DEFINE)
#define HM_API
#elif defined(HM_BUILDING_LIBRARY)
#define HM_API __attribute__((visibility("default")))
#else
#define HM_API
#endif

#define HM_VERSION_MAJOR 0
#define HM_VERSION_MINOR 1
#define HM_VERSION_PATCH 0
/* One integer that orders versions: major*10000 + minor*100 + patch. */
#define HM_VERSION (HM_VERSION_MAJOR * 10000 + HM_VERSION_MINOR * 100 + HM_VERSION_PATCH)

/* The single list of results. X(name, value, message). Success is 0, errors
 * are negative so that `if (r < 0)` and `if (r != HM_SUCCESS)` both work. */
#define HM_RESULT_MAP(X)                                                        \
    X(SUCCESS, 0, "success")                                                    \
    X(ERROR_INVALID_ARGUMENT, -1, "invalid argument")                           \
    X(ERROR_INVALID_ALIGNMENT, -2, "alignment is not a power of two or is too large") \
    X(ERROR_OUT_OF_HOST_MEMORY, -3, "out of host memory (metadata)")            \
    X(ERROR_OUT_OF_MEMORY, -4, "the provider is out of memory")                 \
    X(ERROR_NOT_SUPPORTED, -5, "operation not supported by this provider or pool") \
    X(ERROR_DRIVER, -6, "the OS or driver failed; see hm_last_native_error()")  \
    X(ERROR_NOT_FOUND, -7, "pointer or object not known to hetmem")             \
    X(ERROR_INVALID_HANDLE, -8, "IPC handle is malformed, forged or corrupt")   \
    X(ERROR_STALE_HANDLE, -9, "IPC handle refers to a dead process or a freed allocation") \
    X(ERROR_BUSY, -10, "object is in use")                                      \
    X(ERROR_LIMIT, -11, "a configured or system limit was reached")             \
    X(ERROR_PERMISSION, -12, "permission denied")                               \
    X(ERROR_DOUBLE_FREE, -13, "double free detected")                           \
    X(ERROR_UNKNOWN, -14, "unknown error")

typedef enum hm_result {
#define HM__RESULT_ENUM(name, value, msg) HM_##name = value,
    HM_RESULT_MAP(HM__RESULT_ENUM)
#undef HM__RESULT_ENUM
} hm_result_t;

/* A static, never-NULL string for any value (unknown values included). */
HM_API const char *hm_result_string(hm_result_t result);

/* HM_VERSION of the library actually loaded (may differ from the header). */
HM_API unsigned hm_version(void);
HM_API const char *hm_version_string(void);

/* The per-thread last native error: the errno or driver code of the last OS or
 * driver call that failed inside hetmem on this thread, and a message naming
 * the call. Both stay valid until the next hetmem call on this thread.
 * Returns 0 when no native error has been recorded on this thread. */
HM_API int64_t hm_last_native_error(const char **message);

/* The kind of memory a provider hands out. */
typedef enum hm_memory_kind {
    HM_MEMORY_HOST = 0,        /* ordinary pageable host memory */
    HM_MEMORY_HOST_PINNED = 1, /* host memory pinned/registered for a device */
    HM_MEMORY_DEVICE = 2,      /* device memory: the CPU must not touch it */
    HM_MEMORY_SHARED = 3,      /* shared/managed: migrates between host and device */
} hm_memory_kind_t;

HM_API const char *hm_memory_kind_string(hm_memory_kind_t kind);

/* Log levels for HM_LOG=level[,file] and hm_log_set_sink().
 * HM_LOG is read with secure_getenv (a set-user-ID program ignores it). Its
 * file is opened without following a symlink, created mode 0600, and used
 * only when it is a regular file owned by the effective uid; otherwise lines
 * stay on stderr. In every line, bytes below 0x20 and 0x7f of the message
 * are written as \xNN (one line per message, whatever a logged value holds). */
typedef enum hm_log_level {
    HM_LOG_DEBUG = 0,
    HM_LOG_INFO = 1,
    HM_LOG_WARN = 2,
    HM_LOG_ERROR = 3,
    HM_LOG_OFF = 4, /* default: hetmem is silent */
} hm_log_level_t;

/* A log sink receives one formatted, NUL-terminated line (no trailing
 * newline). It may be called from any thread, must not call back into hetmem's
 * allocation functions, and must be thread-safe. */
typedef void (*hm_log_sink_fn)(hm_log_level_t level, const char *line, void *arg);

/* Replace the sink (NULL restores the default: stderr or the HM_LOG file).
 * The level is read once from HM_LOG; hm_log_set_level() overrides it. */
HM_API void hm_log_set_sink(hm_log_sink_fn sink, void *arg);
HM_API void hm_log_set_level(hm_log_level_t level);
HM_API hm_log_level_t hm_log_get_level(void);

#ifdef __cplusplus
}
#endif
#endif /* HETMEM_BASE_H */
