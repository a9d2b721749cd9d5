/* hetmem — the one fork order: every module's fork hooks in one ordered
 * list, run by the library's single pthread_atfork registration (init.c).
 * SPDX-License-Identifier: MIT
 *
 * A module that must hold its locks across fork() (so that the child never
 * inherits one held by a thread it does not have), or fix its state in the
 * child, owns a slot below. Prepare runs the filled slots in slot order,
 * which is the library's global lock order: a module's slot comes after the
 * slot of every module that calls it while holding locks. Parent and child
 * run the same slots in reverse, so each releases what it took while the
 * locks of the modules that call it are still held. This is jemalloc's
 * jemalloc_prefork/postfork pattern for the whole library: one prepare that
 * takes every lock in the one order, parent and child that release in
 * reverse. The order is the slots', whatever the order in which modules
 * start.
 *
 *  slot             owner            prepare takes; the child        why this position
 *  PROXY_POOL       preload.c        child only: the forked child    last in the child: it makes a
 *                   (HM_PROXY=       gets its own (private) pool     pool, so every other module
 *                   shared)                                          must be usable again
 *  RCU              tracker/         pauses the call_rcu helper      first: the helper runs
 *                                    (urcu's call_rcu mutex); the    callbacks that call free
 *                                    child re-creates it (malloc)    (under the proxy: a native
 *                                                                    pool's locks) and may be in a
 *                                                                    grace period
 *  NATIVE           pools/native/    g_lock, then per pool           pools call the tracker,
 *                                    orphan_lock, lock, large_lock,  providers and IPC under their
 *                                    depot_lock, each heap's         locks; nothing calls a pool
 *                                    mq_lock; the child adopts the   under its own
 *                                    heaps of absent threads
 *  JEMALLOC_POOLS   pools/jemalloc/  g_lock (pool slots, tcaches);   tcache.destroy runs under it
 *                                    the child forgets absent        and takes jemalloc's locks
 *                                    threads' by_tp words
 *  JEMALLOC         jemalloc itself  every jemalloc mutex            its extent hooks run under
 *                   (captured by     (jemalloc_prefork/postfork)     them and take range_locks, the
 *                   hm__jemalloc_                                    tracker's, providers', IPC's
 *                   pthread_atfork)
 *  JEMALLOC_RANGES  pools/jemalloc/  every pool's range_lock         taken inside extent hooks
 *  JEMALLOC_INIT    pools/jemalloc/  g_init_lock                     held only around jemalloc's
 *                                                                    set-up (which takes only
 *                                                                    jemalloc's own locks)
 *  IPC              ipc/             pilist_lock -> each pi->lock    pools give provider ranges
 *                                    -> opened.lock, imp_arena (import)  back (hm__ipc_range_release,
 *                                    -> exports.lock, view arenas         _busy) under their locks;
 *                                    (export) -> pidfd cache; the    ipc.get/put call providers
 *                                    child drops the parent's        under exports.lock
 *                                    export cache
 *  (device          providers/cuda,  their own locks: a slot of      after IPC, which calls their
 *   providers)      level_zero       their own here                  ipc ops under its locks;
 *                                                                    before the tracker
 *  MEMSPACE         memspace/        g_lock (current topology,       a leaf: nothing of ours is
 *                                    spaces' contents)               called under it; nothing
 *                                                                    calls memspace under a lock
 *  HANDLES          init.c           reg_lock (live handles)         a leaf: nothing is taken
 *                                                                    under it
 *  TRACKER          tracker/         g_reclaim_lock, g_reg_lock,     every module calls the
 *                                    every index lock, the retire    tracker under its locks; it
 *                                    shards, then urcu-bp's locks    calls nothing of ours
 *  PRIM             platform/prim.c  child only: fork epoch + 1,     early in the child: the hooks
 *                                    process nonce reset             after it see the child's
 *                                                                    epoch
 *  PROXY_SNAPSHOT   preload.c        copies the shared heap (its     last: the native pool and the
 *                   (HM_PROXY=       ranges are fixed); the child    tracker are locked; first in
 *                   shared)          moves the copies over the       the child, before any hook
 *                                    heap                            writes to the heap
 *
 * The host providers (os, file, devdax, fixed, over providers/coarse/) have no slot:
 * the ranges held for IPC are the IPC module's, and the OS provider tells
 * that it runs in a forked child by the fork epoch (PRIM).
 *
 * A module fills its slot when it starts: the library's set-up fills
 * RCU, NATIVE, IPC, HANDLES and TRACKER; others are filled lazily (PRIM at
 * the first read of the fork epoch, the jemalloc slots at the first jemalloc
 * pool, MEMSPACE at the first memory-space call that needs a topology, the
 * proxy's when its heap is shared), and a slot keeps its position
 * whenever it is filled. (IPC is not lazy: hm_ipc_get takes its lock before
 * IPC sets itself up.)
 *
 * libhetmem_proxy.so carries its own copy of the library and so its own
 * list and registration; it registers at the process's first malloc,
 * before libhetmem.so's, so its prepare runs after libhetmem.so's and its
 * child before: libhetmem.so calls malloc under its locks, never the
 * reverse.
 *
 * Concurrency (fork_lock is init.c's; only these take it):
 *  operation           may run with              needs
 *  fork() (the hooks)  everything; a fork from   fork_lock, taken first in
 *                      another thread waits      prepare, released last in the
 *                                                parent, first in the child
 *  hm__fork_enable     anything, forks included  no lock to fill the slot (an
 *                                                atomic store); then, for a
 *                                                slot with a prepare hook,
 *                                                fork_lock once, to wait for a
 *                                                fork in progress: the caller
 *                                                holds no lock of the library
 *                                                (its own module's included)
 *  hm__fork_trace      anything                  fork_lock
 * The fork path allocates nothing and never reads a slot twice: prepare
 * notes the hooks it ran, and parent and child run exactly those (a slot
 * filled during a fork's prepare, past the slot's position, is not part of
 * that fork, as glibc runs no handler registered during a fork). When
 * hm__fork_enable returns, every later fork runs the slot. The first call
 * registers the list (pthread_atfork, which allocates). A slot is filled
 * once; filling it again with the same hooks does nothing (a forked child
 * re-running a module's set-up). */
#ifndef HM_FORK_H
#define HM_FORK_H

#include <stddef.h>

typedef enum hm_fork_slot {
    HM_FORK_PROXY_POOL,
    HM_FORK_RCU,
    HM_FORK_NATIVE,
    HM_FORK_JEMALLOC_POOLS,
    HM_FORK_JEMALLOC,
    HM_FORK_JEMALLOC_RANGES,
    HM_FORK_JEMALLOC_INIT,
    HM_FORK_IPC,
    HM_FORK_MEMSPACE,
    HM_FORK_HANDLES,
    HM_FORK_TRACKER,
    HM_FORK_PRIM,
    HM_FORK_PROXY_SNAPSHOT,
    HM_FORK_SLOTS
} hm_fork_slot_t;

/* A slot's hooks; NULL: nothing to do in that phase. Static storage: the
 * list keeps the pointer for good. */
typedef struct hm_fork_hooks {
    void (*prepare)(void);
    void (*parent)(void);
    void (*child)(void);
} hm_fork_hooks_t;

/* Fills slot with hooks (NULL: the hooks init.c's table names for the
 * modules built into every copy of the library: RCU, NATIVE, IPC, HANDLES,
 * TRACKER, PRIM); every fork from its return on runs them at the slot's
 * position. Filling a slot with other hooks than it has is a broken
 * invariant. */
void hm__fork_enable(hm_fork_slot_t slot, const hm_fork_hooks_t *hooks);

/* The slots the last fork() ran in phase, in the order it ran them (at most
 * cap written); returns how many it ran. A fork's prepare clears the record
 * of the phases before: in the parent the child phase is empty, in the
 * child the parent phase. For tests. */
typedef enum hm_fork_phase { HM_FORK_PREPARE, HM_FORK_PARENT, HM_FORK_CHILD } hm_fork_phase_t;
size_t hm__fork_trace(hm_fork_phase_t phase, hm_fork_slot_t *out, size_t cap);

/* Drivers (platform/dl.h) may register fork handlers of their own when they
 * are loaded or set up, after the library registered its list. glibc runs
 * prepare handlers newest first, so theirs would take the driver's locks
 * before the library's prepare takes its own — while another thread, inside
 * the library, holds one of the library's locks and waits in the driver for
 * the driver's lock: a deadlock. Called after a provider's init when a
 * library was loaded since the last call, this registers the library's
 * handlers once more (the same three: only the newest registration's calls
 * do the work), so the library's prepare runs before every driver's loaded
 * so far, and its parent and child after theirs. At most one registration
 * per driver library loaded (the libraries are never unloaded). A driver
 * that registers fork handlers later still (at its first allocation, say)
 * is not covered. */
void hm__fork_after_drivers(void);

#endif
