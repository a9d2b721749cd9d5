/* hetmem — loading drivers at run time (contract in dl.h).
 * SPDX-License-Identifier: MIT */
#include "platform/dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A symbol's address goes into the caller's slot by memcpy: one size fits
 * every function pointer type (POSIX requires dlsym's void * to hold one). */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers must fit dlsym's void *");

/* Invariants: an entry is immutable once published (but `reported`);
 * at most one entry per path is ever published; entries are never freed
 * and the list only grows at its head, so a reader walking it needs no
 * lock and sees whole entries (published with release, read with
 * acquire). */
struct hm_dl_lib {
    hm_dl_lib_t *next;
    void *handle;          /* NULL: the load failed (error says why) */
    bool from_env;         /* the path came from an override variable */
    _Atomic bool reported; /* a failure of this path was logged above debug level */
    char error[256];       /* dlerror()'s text of the failed load */
    char path[];           /* what dlopen was given */
};

static hm_dl_lib_t *_Atomic g_libs;
static _Atomic size_t g_loaded; /* libraries dlopen() loaded */

HM_RUN size_t hm__dl_loaded(void) { return atomic_load_explicit(&g_loaded, memory_order_relaxed); }

static hm_dl_lib_t *find(hm_dl_lib_t *from, const char *path) {
    for (hm_dl_lib_t *e = from; e; e = e->next)
        if (strcmp(e->path, path) == 0) return e;
    return NULL;
}

/* Push n unless an entry for its path got there first: the entry to use. */
static hm_dl_lib_t *publish(hm_dl_lib_t *n) {
    hm_dl_lib_t *head = atomic_load_explicit(&g_libs, memory_order_acquire);
    for (;;) {
        hm_dl_lib_t *other = find(head, n->path);
        if (other) {
            /* Lost a race for the same path. A handle of ours is a second
             * reference to the same object: kept (never closed), harmless. */
            free(n);
            return other;
        }
        n->next = head;
        if (atomic_compare_exchange_weak_explicit(&g_libs, &head, n, memory_order_acq_rel,
                                                  memory_order_acquire))
            return n;
    }
}

static void copy_dlerror(char *buf, size_t size) {
    const char *m = dlerror(); /* this thread's, for the call just made */
    snprintf(buf, size, "%s", m ? m : "unknown error");
}

static void log_failed_open(hm_dl_lib_t *e, const char *env_var, const char *what) {
    const char *w = what ? what : "library";
    bool first = !atomic_exchange_explicit(&e->reported, true, memory_order_relaxed);
    hm_log_level_t level = !first ? HM_LOG_DEBUG : e->from_env ? HM_LOG_WARN : HM_LOG_INFO;
    HM_LOG(level, "%s: cannot load '%s'%s%s%s: %s", w, e->path, e->from_env ? " (from " : "",
           e->from_env && env_var ? env_var : "", e->from_env ? ")" : "", e->error);
}

hm_result_t hm__dl_open(const char *soname, const char *env_var, const char *what,
                        hm_dl_lib_t **lib) {
    if (!lib || !soname || !*soname) {
        HM_LOG_ERROR("hm__dl_open: %s", !lib ? "lib is NULL" : "no library name");
        if (lib) *lib = NULL;
        return HM_ERROR_INVALID_ARGUMENT;
    }
    *lib = NULL;
    const char *path = soname;
    bool from_env = false;
    if (env_var) {
        const char *v = secure_getenv(env_var);
        if (v && *v) {
            path = v;
            from_env = true;
        }
    }
    hm_dl_lib_t *e = find(atomic_load_explicit(&g_libs, memory_order_acquire), path);
    if (!e) {
        size_t len = strlen(path);
        hm_dl_lib_t *n = calloc(1, sizeof(*n) + len + 1);
        if (!n) return HM_ERROR_OUT_OF_HOST_MEMORY;
        memcpy(n->path, path, len + 1);
        n->from_env = from_env;
        atomic_init(&n->reported, false);
        (void)dlerror(); /* clear a stale message of this thread */
        n->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!n->handle) copy_dlerror(n->error, sizeof(n->error));
        else atomic_fetch_add_explicit(&g_loaded, 1, memory_order_relaxed);
        e = publish(n);
    }
    if (!e->handle) {
        log_failed_open(e, env_var, what);
        return HM_ERROR_NOT_SUPPORTED;
    }
    *lib = e;
    return HM_SUCCESS;
}

/* Append name to a comma-separated list in buf; "..." once it is full. */
static void list_add(char *buf, size_t size, size_t *len, const char *name) {
    if (*len >= size - 1) return;
    int n = snprintf(buf + *len, size - *len, "%s%s", *len ? ", " : "", name);
    if (n < 0 || (size_t)n >= size - *len) {
        snprintf(buf + size - 4, 4, "...");
        *len = size - 1;
        return;
    }
    *len += (size_t)n;
}

static void set_slot(const hm_dl_sym_t *s, void *addr) { memcpy(s->slot, &addr, sizeof(addr)); }

hm_result_t hm__dl_resolve(hm_dl_lib_t *lib, const hm_dl_sym_t *syms, size_t n,
                           size_t *missing_optional) {
    if (missing_optional) *missing_optional = 0;
    if (!lib || !lib->handle || (n && !syms)) {
        HM_LOG_ERROR("hm__dl_resolve: %s", !lib || !lib->handle ? "no loaded library"
                                                                : "symbol table is NULL");
        return HM_ERROR_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < n; i++)
        if (!syms[i].name || !syms[i].slot) {
            HM_LOG_ERROR("hm__dl_resolve(%s): entry %zu has no %s", lib->path, i,
                         !syms[i].name ? "name" : "slot");
            return HM_ERROR_INVALID_ARGUMENT;
        }
    char req[512], opt[512];
    size_t req_len = 0, opt_len = 0, nreq = 0, nopt = 0;
    req[0] = opt[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        void *addr = dlsym(lib->handle, syms[i].name);
        if (!addr) {
            (void)dlerror(); /* consume this thread's message: the name says it all */
            if (syms[i].optional) {
                nopt++;
                list_add(opt, sizeof(opt), &opt_len, syms[i].name);
            } else {
                nreq++;
                list_add(req, sizeof(req), &req_len, syms[i].name);
            }
        }
        set_slot(&syms[i], addr);
    }
    if (nreq) {
        for (size_t i = 0; i < n; i++) set_slot(&syms[i], NULL);
        HM_LOG_WARN("'%s' lacks %zu required symbol%s: %s", lib->path, nreq, nreq == 1 ? "" : "s",
                    req);
        return HM_ERROR_NOT_SUPPORTED;
    }
    if (nopt)
        HM_LOG_INFO("'%s' lacks %zu optional symbol%s (not used): %s", lib->path, nopt,
                    nopt == 1 ? "" : "s", opt);
    if (missing_optional) *missing_optional = nopt;
    return HM_SUCCESS;
}

hm_result_t hm__dl_load(const char *soname, const char *env_var, const char *what,
                        const hm_dl_sym_t *syms, size_t n, hm_dl_lib_t **lib,
                        size_t *missing_optional) {
    if (missing_optional) *missing_optional = 0;
    hm_dl_lib_t *l = NULL;
    hm_result_t r = hm__dl_open(soname, env_var, what, &l);
    if (lib) *lib = NULL;
    if (r != HM_SUCCESS) {
        for (size_t i = 0; syms && i < n; i++)
            if (syms[i].slot) set_slot(&syms[i], NULL);
        return r;
    }
    r = hm__dl_resolve(l, syms, n, missing_optional);
    if (r == HM_SUCCESS && lib) *lib = l;
    return r;
}

void *hm__dl_sym(hm_dl_lib_t *lib, const char *name) {
    if (!lib || !lib->handle || !name) return NULL;
    void *addr = dlsym(lib->handle, name);
    if (!addr) (void)dlerror();
    return addr;
}

const char *hm__dl_path(const hm_dl_lib_t *lib) { return lib ? lib->path : NULL; }
void *hm__dl_handle(const hm_dl_lib_t *lib) { return lib ? lib->handle : NULL; }
