/* hetmem — internal definitions shared by every module. Never installed.
 * SPDX-License-Identifier: MIT */
#ifndef HM_INTERNAL_H
#define HM_INTERNAL_H

#include <hetmem/hetmem.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>

#define hm_likely(x) __builtin_expect(!!(x), 1)
#define hm_unlikely(x) __builtin_expect(!!(x), 0)
#define HM_NOINLINE __attribute__((noinline))
#define HM_INLINE static inline __attribute__((always_inline))
#define HM_CACHE_LINE 64
#define HM_CACHE_ALIGNED __attribute__((aligned(HM_CACHE_LINE)))
#define HM_PRINTF(a, b) __attribute__((format(printf, a, b)))
/* Marks a function that a program using a native pool runs, from set-up through
 * its steady state: the link puts the section at the start of the text
 * segment (cmake/hm_text.ld says why); scripts/text_layout.sh lists what such
 * runs execute without the mark. Inlined functions need none. */
#define HM_RUN __attribute__((section(".text.hm_run")))

#define hm_container_of(ptr, type, member) \
    ((type *)((char *)(ptr) - offsetof(type, member)))

static inline int hm_is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }
/* Round x up to a multiple of the power of two a; 0 on overflow. */
static inline size_t hm_align_up(size_t x, size_t a) {
    if (x > SIZE_MAX - (a - 1)) return 0;
    return (x + a - 1) & ~(a - 1);
}
static inline uintptr_t hm_align_down(uintptr_t x, size_t a) { return x & ~(uintptr_t)(a - 1); }
/* Whether [at + off, at + off + size) lies inside [base, base + len),
 * without overflow whatever the operands (a peer may have chosen them). */
static inline bool hm_range_holds(uintptr_t base, size_t len, uintptr_t at, uint64_t off,
                                  uint64_t size) {
    if (at < base || at - base > len) return false;
    uint64_t room = len - (at - base);
    return off <= room && size <= room - off;
}

/* ---- library state (init.c) ---- */
/* Runs the one-time library set-up (pthread_once); cheap after the first call. */
void hm__init(void);

/* Registry of live handles (providers, pools) so that double destroy and
 * foreign handles are caught: register on create, unregister on destroy
 * (returns 0 if the handle was not live). kind is a small tag. */
int hm__handle_register(const void *h, int kind);
int hm__handle_unregister(const void *h, int kind);
int hm__handle_is_live(const void *h, int kind);
enum { HM_HANDLE_PROVIDER = 1, HM_HANDLE_POOL = 2, HM_HANDLE_MEMSPACE = 3 };

/* ---- logging (log.c) ---- */
/* Never allocates; formats into a fixed stack buffer; recursion-guarded;
 * cheap level check first. Not for the success path of alloc/free. */
void hm__log(hm_log_level_t level, const char *file, int line, const char *fmt, ...)
    HM_PRINTF(4, 5);
extern _Atomic int hm__log_level; /* current threshold */
#define HM_LOG(level, ...)                                                         \
    do {                                                                           \
        if (hm_unlikely((int)(level) >= atomic_load_explicit(&hm__log_level,       \
                                                             memory_order_relaxed))) \
            hm__log((level), __FILE__, __LINE__, __VA_ARGS__);                     \
    } while (0)
#define HM_LOG_DEBUG(...) HM_LOG(HM_LOG_DEBUG, __VA_ARGS__)
#define HM_LOG_INFO(...) HM_LOG(HM_LOG_INFO, __VA_ARGS__)
#define HM_LOG_WARN(...) HM_LOG(HM_LOG_WARN, __VA_ARGS__)
#define HM_LOG_ERROR(...) HM_LOG(HM_LOG_ERROR, __VA_ARGS__)

/* ---- errors (error.c) ---- */
/* Record the per-thread native error (errno or driver code) with a message
 * naming the failed call, and log it once at WARN. Returns HM_ERROR_DRIVER
 * so callers can `return hm__native_error(errno, "mmap(%zu)", size);` */
hm_result_t hm__native_error(int64_t code, const char *fmt, ...) HM_PRINTF(2, 3);
/* The same for a driver's own result code (CUresult, ze_result_t): the
 * message is the caller's alone, with no strerror() text of the number. */
hm_result_t hm__driver_error(int64_t code, const char *fmt, ...) HM_PRINTF(2, 3);

/* The native pools' fork hooks (pools/native/native.c): the NATIVE slot of
 * the library's fork list (fork.h), filled by init.c. */
void hm__native_atfork_prepare(void);
void hm__native_atfork_parent(void);
void hm__native_atfork_child(void);
/* Map an errno to a result: ENOMEM -> OUT_OF_MEMORY, EINVAL -> INVALID_ARGUMENT,
 * EPERM/EACCES -> PERMISSION, ENOSYS/EOPNOTSUPP -> NOT_SUPPORTED, else DRIVER.
 * Also records it as the native error. */
hm_result_t hm__errno_result(int err, const char *fmt, ...) HM_PRINTF(2, 3);
/* errno value for a result (malloc-style entry points). */
int hm__result_errno(hm_result_t r);
/* alloc(state, size, 0, &p) malloc-style: p, or NULL with errno set from
 * the result (pool.c; the slow path of the pools' malloc_fast ops). */
void *hm__malloc_via(hm_result_t (*alloc)(void *state, size_t size, size_t alignment, void **ptr),
                     void *state, size_t size);

/* Broken invariant or failed mutex operation: print file:line and abort. */
_Noreturn void hm__die(const char *file, int line, const char *fmt, ...) HM_PRINTF(3, 4);
#define HM_DIE(...) hm__die(__FILE__, __LINE__, __VA_ARGS__)
#define HM_ASSERT(cond)                                      \
    do {                                                     \
        if (hm_unlikely(!(cond))) HM_DIE("assert: %s", #cond); \
    } while (0)

#include <pthread.h>
static inline void hm__mutex_lock(pthread_mutex_t *m) {
    int e = pthread_mutex_lock(m);
    if (hm_unlikely(e)) HM_DIE("pthread_mutex_lock: %d", e);
}
static inline void hm__mutex_unlock(pthread_mutex_t *m) {
    int e = pthread_mutex_unlock(m);
    if (hm_unlikely(e)) HM_DIE("pthread_mutex_unlock: %d", e);
}

#endif
