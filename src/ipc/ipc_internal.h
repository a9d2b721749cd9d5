/* hetmem — IPC layer hooks for the pool front-end, transports. Never installed.
 * SPDX-License-Identifier: MIT */
#ifndef HM_IPC_INTERNAL_H
#define HM_IPC_INTERNAL_H

#include "internal.h"
#include "ipc/wire.h"
#include "tracker/tracker.h"

struct hm_ipc_pool; /* per-pool IPC state, made at a pool's first export or open */

/* hm_pool_destroy(), before the pool's tracker index is drained: release
 * the pool's cached exports and close every mapping opened through it
 * (those still open are logged). Takes no lock other pools' opens need for
 * longer than one entry's unlink; unmaps with no lock held. */
void hm__ipc_pool_destroy(hm_pool_t *pool);

/* The pool front end gives the provider range [base, +size) back (its
 * tracker record already gone) and it has an unused cached export: the
 * export is released, its provider put first, and true says the IPC layer
 * gave the range to the provider itself (at once, or, if the provider
 * refused the put, once a retry of the put succeeds): the caller does not
 * free it. One relaxed load when nothing is exported. */
bool hm__ipc_range_release(hm_pool_t *pool, void *base, size_t size);

/* The front end's free of ptr, in pool's tracked range *e (not an
 * imported one), while the pool may hold exports: if the block at ptr holds
 * an exported pointer with handles outstanding (got, not put), its free is
 * deferred to the last hm_ipc_put() of that export (*done set; HM_SUCCESS,
 * or HM_ERROR_DOUBLE_FREE for a block already deferred); otherwise *done
 * is false and the caller frees it now. One relaxed load when the pool has
 * no outstanding export. Also runs a forked child's deferred frees. */
hm_result_t hm__ipc_free_held(hm_pool_t *pool, void *ptr, const hm_tracker_entry_t *e,
                              bool *done);
/* Whether hm__ipc_free_held would defer the free of ptr (realloc). */
bool hm__ipc_is_held(hm_pool_t *pool, const void *ptr, const hm_tracker_entry_t *e);
/* The pool front end is about to give [base, +size) back to the provider
 * (a free of the range, or its pool's destroy): true when the range has an
 * export with gets outstanding, which now owns it: the caller forgets the
 * range (tracker) but does not free it; the export's last hm_ipc_put gives
 * it to the provider (or a forked child's next IPC call, its own). */
bool hm__ipc_range_take(hm_pool_t *pool, void *base, size_t size);
/* hm_provider_destroy(), before the provider's fini: exports of its ranges
 * that outlived their pools are put now, their ranges left to the fini. */
void hm__ipc_provider_gone(hm_provider_t *prov);
/* A pool's destroy, about to destroy the provider it owns: true when the
 * IPC layer holds ranges of prov for exports with gets outstanding; it then
 * destroys prov itself after their last put (the bytes an importer maps
 * stay allocated until then, as where the provider outlives the pool), and
 * the caller must not touch prov again. false: destroy it now. */
bool hm__ipc_provider_defer(hm_provider_t *prov);
/* The pool is about to split or merge the provider range at base: true
 * (the caller answers HM_ERROR_BUSY) while it has an outstanding export;
 * otherwise an unused cached export of it is dropped. */
bool hm__ipc_range_busy(hm_pool_t *pool, void *base);

/* The IPC slot of the fork list (fork.h), filled at the library's set-up
 * (ipc.c; the lock order is in its header comment): prepare takes every IPC
 * lock but ident_lock; parent and child release them in reverse; the child
 * then drops the parent's export cache (no provider put: the exports are
 * the parent's). */
void hm__ipc_atfork_prepare(void);
void hm__ipc_atfork_parent(void);
void hm__ipc_atfork_child(void);

/* hm_free()/hm_pool_free() of an opened mapping: logs and returns
 * HM_ERROR_INVALID_ARGUMENT (use hm_ipc_close). */
hm_result_t hm__ipc_refuse_free(const void *ptr);

/* ---- transports (channel.c) ---- */
/* HM_IPC_PIDFD is not "0". */
int hm__ipc_pidfd_enabled(void);
/* Importer: a copy of the exporter's descriptor w->fd through pidfd_open +
 * pidfd_getfd, after checking that w->pid is still the exporting process
 * (start time). STALE_HANDLE: dead/reused pid or descriptor gone;
 * PERMISSION / NOT_SUPPORTED: use the channel. */
hm_result_t hm__ipc_fetch_fd(const hm_wire_t *w, int *fd);
/* The verified-pidfd cache around fork (called from ipc.c's hooks):
 * 0 prepare (lock), 1 parent (unlock), 2 child (unlock: the forking
 * thread, the child's only one, took it in prepare; the inherited pidfds
 * stay valid and cached). */
void hm__ipc_pidfd_cache_atfork(int phase);

#endif
