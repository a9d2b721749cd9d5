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

/* ---- fork ---- */
static void atfork_prepare(void) {
    hm__mutex_lock(&lib.reg_lock);
    hm__tracker_atfork_prepare();
}
static void atfork_parent(void) {
    hm__tracker_atfork_parent();
    hm__mutex_unlock(&lib.reg_lock);
}
static void atfork_child(void) {
    hm__tracker_atfork_child();
    /* The forking thread took it in prepare and is the child's only thread. */
    hm__mutex_unlock(&lib.reg_lock);
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
