/* hetmem — loading drivers at run time: the one place that calls dlopen/dlsym.
 * SPDX-License-Identifier: MIT
 *
 * A GPU provider links no driver. It names the driver's library by its
 * default soname ("libcuda.so.1", "libze_loader.so.1") and an environment
 * variable that overrides the path (HM_CUDA_PATH style), and resolves a
 * table of symbols by their exact names, version suffixes included
 * ("cuMemAlloc_v2": the unversioned names of a driver can be older entry
 * points with other signatures, so a name is never guessed or shortened).
 *
 * Contract:
 *  - hm__dl_open() loads a library once per process per path: the first
 *    caller dlopen()s it (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE), every later
 *    or concurrent caller with the same path gets the same hm_dl_lib_t (and
 *    the same native handle). The path is the value of `env_var` when that
 *    is set and not empty (read with secure_getenv, so a set-user-ID program
 *    ignores it), else `soname`; an override replaces the default, it is
 *    never a fallback. A path that fails to load is remembered and not
 *    tried again in this process.
 *  - A library is never dlclose()d: memory a driver handed out may be alive
 *    until the process ends (in a pool the program never destroyed, or
 *    mapped through IPC), and the driver's code must stay mapped under it.
 *    RTLD_NODELETE keeps it even when libhetmem itself is dlclose()d.
 *  - Failures are HM_ERROR_NOT_SUPPORTED with exactly one log line per
 *    failing call: a missing library at info level the first time for its
 *    path (a machine without that GPU is not an error) or warn level when an
 *    override named it (the user asked for that file); a missing required
 *    symbol at warn level; repeated failures of a path at debug level. The
 *    line carries dlerror()'s text.
 *  - dlerror(): glibc keeps its state per thread; the helper reads it on
 *    the thread that made the failing call, right after the call, and copies
 *    the text out before any other dl call, so concurrent loads never see
 *    each other's messages.
 *  - Thread safety: every function may run concurrently with every other.
 *    The set of loaded libraries is a list that only grows, pushed with a
 *    compare-and-swap (no lock, so nothing is held across fork(): a forked
 *    child loads and resolves like its parent, and its handles stay valid).
 *    Two threads that load one path at once may both call dlopen (glibc
 *    counts the second as a reference to the same object); one entry wins
 *    and both return it.
 *  - Async-signal-unsafe; never on an alloc/free path (load at provider
 *    create, once).
 */
#ifndef HM_PLATFORM_DL_H
#define HM_PLATFORM_DL_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>

/* A loaded (or failed) library; lives until the process ends. */
typedef struct hm_dl_lib hm_dl_lib_t;

/* One entry of a caller's symbol table. `slot` is the address of the
 * caller's pointer variable (a function pointer of any type, or an object
 * pointer): the symbol's address is copied into it, or NULL when the
 * symbol is missing. */
typedef struct hm_dl_sym {
    const char *name; /* exact symbol name, version suffix included */
    void *slot;
    bool optional;    /* missing: reported, not a failure */
} hm_dl_sym_t;

#define HM_DL_REQUIRED(sym_name, slot_addr) {.name = (sym_name), .slot = (slot_addr), .optional = false}
#define HM_DL_OPTIONAL(sym_name, slot_addr) {.name = (sym_name), .slot = (slot_addr), .optional = true}

/* Load the library (see above). `what` names it in log lines ("CUDA
 * driver"; NULL: the path alone). env_var may be NULL (no override).
 * HM_SUCCESS and *lib, or HM_ERROR_NOT_SUPPORTED (*lib NULL) when it cannot
 * be loaded; HM_ERROR_INVALID_ARGUMENT for a NULL soname or lib;
 * HM_ERROR_OUT_OF_HOST_MEMORY. */
hm_result_t hm__dl_open(const char *soname, const char *env_var, const char *what,
                        hm_dl_lib_t **lib);

/* Resolve n symbols of lib into their slots. Every required one found:
 * HM_SUCCESS, *missing_optional (may be NULL) set to the number of optional
 * ones not found (their slots NULL, their names in one info line). A
 * required one missing: HM_ERROR_NOT_SUPPORTED, one warn line naming every
 * missing required symbol, and every slot of the table set to NULL (a half
 * table is never left behind). The caller keeps its table (providers hold
 * theirs in their state or a static resolved once). */
hm_result_t hm__dl_resolve(hm_dl_lib_t *lib, const hm_dl_sym_t *syms, size_t n,
                           size_t *missing_optional);

/* hm__dl_open then hm__dl_resolve. */
hm_result_t hm__dl_load(const char *soname, const char *env_var, const char *what,
                        const hm_dl_sym_t *syms, size_t n, hm_dl_lib_t **lib,
                        size_t *missing_optional);

/* One symbol's address, or NULL (missing; nothing logged): for lookups a
 * provider makes later (e.g. through the driver's own proc-address call). */
void *hm__dl_sym(hm_dl_lib_t *lib, const char *name);

/* The path the library was opened by, and dlopen's handle (NULL for a
 * library that failed to load). */
/* How many libraries this process has loaded through hm__dl_open (only
 * grows; fork.h's hm__fork_after_drivers compares it). */
size_t hm__dl_loaded(void);

const char *hm__dl_path(const hm_dl_lib_t *lib);
void *hm__dl_handle(const hm_dl_lib_t *lib);

#endif /* HM_PLATFORM_DL_H */
