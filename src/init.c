/* hetmem — library state: one-time set-up, the live-handle registry, fork
 * and exit. SPDX-License-Identifier: MIT
 *
 * Fork (documented in pool.h): the child inherits every pool and provider in
 * the state the forking thread saw. The child may keep using them from its
 * single thread, or destroy them. Memory of shared-mode providers stays shared
 * with the parent. Every module's locks are taken before fork, in the one
 * order of fork.h, and released after it in reverse, in the child by its one
 * thread (the forking one, which took them), so no lock is left held by a
 * thread that does not exist in the child. */
#include "internal.h"
#include "fork.h"
#include "ipc/ipc_internal.h"
#include "platform/dl.h"
#include "platform/prim.h"
#include "tracker/tracker.h"

#include <stdlib.h>
#include <string.h>

void hm__log_init(void);

/* ---- live-handle registry: a chained hash set under one mutex. Only
 * create/destroy (rare, slow path) touch it. ---- */
#define HM_REG_BUCKETS 256
typedef struct reg_node {
    const void *h;
    int kind;
    struct reg_node *next;
} reg_node_t;

static struct {
    pthread_once_t once;
    pthread_mutex_t reg_lock;
    reg_node_t *buckets[HM_REG_BUCKETS];
} lib = {.once = PTHREAD_ONCE_INIT, .reg_lock = PTHREAD_MUTEX_INITIALIZER};

static size_t reg_hash(const void *h) {
    uintptr_t x = (uintptr_t)h;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull; /* Fibonacci hashing (Knuth, TAOCP 6.4) */
    return (size_t)(x >> 56) & (HM_REG_BUCKETS - 1);
}

HM_RUN int hm__handle_register(const void *h, int kind) {
    reg_node_t *n = malloc(sizeof(*n));
    if (!n) return 0;
    n->h = h;
    n->kind = kind;
    size_t b = reg_hash(h);
    hm__mutex_lock(&lib.reg_lock);
    n->next = lib.buckets[b];
    lib.buckets[b] = n;
    hm__mutex_unlock(&lib.reg_lock);
    return 1;
}

int hm__handle_unregister(const void *h, int kind) {
    reg_node_t *found = NULL;
    size_t b = reg_hash(h);
    hm__mutex_lock(&lib.reg_lock);
    for (reg_node_t **p = &lib.buckets[b]; *p; p = &(*p)->next) {
        if ((*p)->h == h && (*p)->kind == kind) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    hm__mutex_unlock(&lib.reg_lock);
    free(found);
    return found != NULL;
}

HM_RUN int hm__handle_is_live(const void *h, int kind) {
    int live = 0;
    size_t b = reg_hash(h);
    hm__mutex_lock(&lib.reg_lock);
    for (reg_node_t *n = lib.buckets[b]; n; n = n->next)
        if (n->h == h && n->kind == kind) {
            live = 1;
            break;
        }
    hm__mutex_unlock(&lib.reg_lock);
    return live;
}

/* ---- fork: the one ordered list (fork.h has the order and its reasons) ----
 *
 * The hooks of the modules built into every copy of the library, by slot;
 * the others (the jemalloc pool, the proxy) bring their own. */
static void handles_lock(void) { hm__mutex_lock(&lib.reg_lock); }
/* Parent and child: the forking thread took it in prepare (in the child,
 * the only thread). */
static void handles_unlock(void) { hm__mutex_unlock(&lib.reg_lock); }

static const hm_fork_hooks_t fork_builtin[HM_FORK_SLOTS] = {
    [HM_FORK_RCU] = {hm__tracker_atfork_prepare_rcu, hm__tracker_atfork_parent_rcu,
                     hm__tracker_atfork_child_rcu},
    [HM_FORK_NATIVE] = {hm__native_atfork_prepare, hm__native_atfork_parent,
                        hm__native_atfork_child},
    [HM_FORK_IPC] = {hm__ipc_atfork_prepare, hm__ipc_atfork_parent, hm__ipc_atfork_child},
    [HM_FORK_HANDLES] = {handles_lock, handles_unlock, handles_unlock},
    [HM_FORK_TRACKER] = {hm__tracker_atfork_prepare, hm__tracker_atfork_parent,
                         hm__tracker_atfork_child},
    [HM_FORK_PRIM] = {NULL, NULL, hm__prim_atfork_child},
};

/* The list: slot -> its hooks, NULL while the slot is empty. fork_lock
 * serialises forks from several threads: `taken` (the slots this fork's
 * prepare ran, which its parent or child runs in reverse) and `trace` are
 * written under it. It is the outermost lock: only a fork's prepare,
 * hm__fork_enable and hm__fork_trace take it, none of them holding another
 * lock of the library. */
static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    _Atomic(const hm_fork_hooks_t *) slot[HM_FORK_SLOTS];
    const hm_fork_hooks_t *taken[HM_FORK_SLOTS];
    unsigned char trace[3][HM_FORK_SLOTS];
    unsigned char ntrace[3];
} fork_list = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void trace_add(hm_fork_phase_t phase, int slot) {
    fork_list.trace[phase][fork_list.ntrace[phase]++] = (unsigned char)slot;
}

/* Registrations of the three handlers below (see hm__fork_after_drivers):
 * of a fork's calls, the forking thread's first prepare (the newest
 * registration's: glibc runs prepare handlers newest first) and its last
 * parent or child call (the newest's again: those run oldest first) do the
 * work; the others only count. Per thread, so that forks of two threads
 * count apart; a child inherits the count of the thread that forked. */
static __thread unsigned t_fork_depth;
static _Atomic unsigned fork_registrations;

static void fork_prepare(void) {
    if (t_fork_depth++ != 0) return;
    hm__mutex_lock(&fork_list.lock);
    memset(fork_list.ntrace, 0, sizeof(fork_list.ntrace));
    for (int i = 0; i < HM_FORK_SLOTS; i++) {
        const hm_fork_hooks_t *h =
            atomic_load_explicit(&fork_list.slot[i], memory_order_acquire);
        fork_list.taken[i] = h;
        if (!h) continue;
        trace_add(HM_FORK_PREPARE, i);
        if (h->prepare) h->prepare();
    }
}

static void fork_parent(void) {
    if (--t_fork_depth != 0) return;
    for (int i = HM_FORK_SLOTS; i-- > 0;) {
        const hm_fork_hooks_t *h = fork_list.taken[i];
        if (!h) continue;
        trace_add(HM_FORK_PARENT, i);
        if (h->parent) h->parent();
    }
    hm__mutex_unlock(&fork_list.lock);
}

/* The child releases fork_lock first (the forking thread, its only one,
 * holds it), so that a child hook may start a module (hm__fork_enable). */
static void fork_child(void) {
    if (--t_fork_depth != 0) return;
    const hm_fork_hooks_t *taken[HM_FORK_SLOTS];
    memcpy(taken, fork_list.taken, sizeof(taken));
    for (int i = HM_FORK_SLOTS; i-- > 0;)
        if (taken[i]) trace_add(HM_FORK_CHILD, i);
    hm__mutex_unlock(&fork_list.lock);
    for (int i = HM_FORK_SLOTS; i-- > 0;)
        if (taken[i] && taken[i]->child) taken[i]->child();
}

/* The library's one pthread_atfork call site (per copy of the library: the
 * proxy's is its own; see fork.h): once at the first slot, again after a
 * driver's set-up (hm__fork_after_drivers). */
HM_RUN static void fork_register(void) {
    if (pthread_atfork(fork_prepare, fork_parent, fork_child)) HM_DIE("pthread_atfork failed");
    atomic_fetch_add_explicit(&fork_registrations, 1, memory_order_relaxed);
}

HM_RUN void hm__fork_after_drivers(void) {
    static _Atomic size_t seen;
    size_t loaded = hm__dl_loaded();
    size_t was = atomic_load_explicit(&seen, memory_order_relaxed);
    if (loaded == was ||
        !atomic_compare_exchange_strong_explicit(&seen, &was, loaded, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    if (pthread_once(&fork_list.once, fork_register)) HM_DIE("pthread_once failed");
    fork_register();
}

HM_RUN void hm__fork_enable(hm_fork_slot_t slot, const hm_fork_hooks_t *hooks) {
    HM_ASSERT((unsigned)slot < HM_FORK_SLOTS);
    if (!hooks) hooks = &fork_builtin[slot];
    HM_ASSERT(hooks->prepare || hooks->parent || hooks->child);
    if (pthread_once(&fork_list.once, fork_register)) HM_DIE("pthread_once failed");
    const hm_fork_hooks_t *cur = NULL;
    if (!atomic_compare_exchange_strong_explicit(&fork_list.slot[slot], &cur, hooks,
                                                 memory_order_acq_rel, memory_order_acquire) &&
        cur != hooks)
        HM_DIE("fork slot %d filled twice", (int)slot);
    /* A slot with a prepare waits for a fork whose prepare may have passed
     * it before it was filled: when this returns, no fork that missed the
     * slot is still running, and every later one runs it. So the caller
     * holds no lock of the library, its own module's included (a fork that
     * saw the slot would wait for it under fork_lock). */
    if (hooks->prepare) {
        hm__mutex_lock(&fork_list.lock);
        hm__mutex_unlock(&fork_list.lock);
    }
}

size_t hm__fork_trace(hm_fork_phase_t phase, hm_fork_slot_t *out, size_t cap) {
    hm__mutex_lock(&fork_list.lock);
    size_t n = fork_list.ntrace[phase];
    for (size_t i = 0; i < n && i < cap; i++) out[i] = (hm_fork_slot_t)fork_list.trace[phase][i];
    hm__mutex_unlock(&fork_list.lock);
    return n;
}

static _Atomic int lib_inited;

HM_RUN static void init_once(void) {
    hm__log_init();
    hm__tracker_init();
    /* The library's own slots (prim fills its own at the first read of the
     * fork epoch, the jemalloc pool at its first pool). IPC's is filled
     * here, not at IPC's first use: every hm_ipc_get takes exports.lock before
     * it sets IPC up, so a fork at the process's first get would leave that
     * lock held in the child. */
    hm__fork_enable(HM_FORK_RCU, NULL);
    hm__fork_enable(HM_FORK_NATIVE, NULL);
    hm__fork_enable(HM_FORK_IPC, NULL);
    hm__fork_enable(HM_FORK_HANDLES, NULL);
    hm__fork_enable(HM_FORK_TRACKER, NULL);
    atomic_store(&lib_inited, 1);
}

HM_RUN void hm__init(void) {
    if (pthread_once(&lib.once, init_once)) HM_DIE("pthread_once failed");
}

/* Teardown at exit (or dlclose): the tracker releases its nodes if no
 * record is left. Pools the program did not destroy stay registered and
 * usable by later destructors — their memory is the program's until the
 * process ends. */
__attribute__((destructor)) static void lib_fini(void) {
    if (!atomic_load(&lib_inited)) return;
    hm__tracker_fini();
}
