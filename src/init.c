/* hetmem — library state: one-time set-up, the live-handle registry, fork
 * and exit. SPDX-License-Identifier: MIT
 *
 * Fork (documented in pool.h): the child inherits every pool and provider in
 * the state the forking thread saw. The child may keep using them from its
 * single thread, or destroy them. Memory of shared-mode providers stays shared
 * with the parent. Locks are taken before fork and re-made in the child, so
 * no lock is left held by a thread that does not exist in the child. */
#include "internal.h"
#include "tracker/tracker.h"

#include <stdlib.h>

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

int hm__handle_register(const void *h, int kind) {
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

int hm__handle_is_live(const void *h, int kind) {
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

/* ---- fork ----
 * One set of handlers for the tracker and the native pools, so that their
 * order is fixed here rather than by which registered first (the tracker's
 * at init, a native pool's at the first native pool, so prepare ran the
 * pool's first and the child ran the tracker's first). Under
 * libhetmem_proxy.so malloc is a native pool, and the tracker's call_rcu
 * helper calls free (its callbacks) and, in the child, malloc (liburcu
 * re-creates it): so the helper is paused before the pools are locked, and
 * re-created in the child after they are usable again. Before, with
 * HM_PROXY=tracked, a fork once call_rcu had been used hung: the child in
 * the helper's malloc, on a pool lock its own thread held; or the parent,
 * pausing a helper that was waiting for such a lock. Between the two
 * parts: the pools are locked before the tracker (a pool calls the tracker
 * under its locks). */
static void atfork_prepare(void) {
    hm__tracker_atfork_prepare_rcu();
    hm__native_atfork_prepare();
    hm__mutex_lock(&lib.reg_lock);
    hm__tracker_atfork_prepare();
}
static void atfork_parent(void) {
    hm__tracker_atfork_parent();
    hm__mutex_unlock(&lib.reg_lock);
    hm__native_atfork_parent();
    hm__tracker_atfork_parent_rcu();
}
static void atfork_child(void) {
    hm__tracker_atfork_child();
    /* The forking thread took it in prepare and is the child's only thread. */
    hm__mutex_unlock(&lib.reg_lock);
    hm__native_atfork_child();
    hm__tracker_atfork_child_rcu();
}

static _Atomic int lib_inited;

static void init_once(void) {
    hm__log_init();
    hm__tracker_init();
    if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child))
        HM_DIE("pthread_atfork failed");
    atomic_store(&lib_inited, 1);
}

void hm__init(void) {
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
