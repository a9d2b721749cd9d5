/* hetmem — the native pool: the fork handlers (the locks held across
 * fork(), the child's re-making of them).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Fork: hold every lock across fork(); in the child, re-make them and       */
/* abandon the heaps of threads that do not exist there. The NATIVE slot of */
/* the fork list (fork.h): prepare after the call_rcu pause, before IPC and  */
/* the tracker; parent and child in reverse.                                 */

void hm__native_atfork_prepare(void) {
    hm__mutex_lock(&g_lock);
    for (nv_pool_t *nv = g_pools; nv; nv = nv->g_next) {
        hm__mutex_lock(&nv->orphan_lock);
        hm__mutex_lock(&nv->lock);
        hm__mutex_lock(&nv->large_lock);
        hm__mutex_lock(&nv->depot_lock);
        for (nv_heap_t *h = nv->heaps; h; h = h->all_next) hm__mutex_lock(&h->mq_lock);
    }
}

void hm__native_atfork_parent(void) {
    for (nv_pool_t *nv = g_pools; nv; nv = nv->g_next) {
        for (nv_heap_t *h = nv->heaps; h; h = h->all_next) hm__mutex_unlock(&h->mq_lock);
        hm__mutex_unlock(&nv->depot_lock);
        hm__mutex_unlock(&nv->large_lock);
        hm__mutex_unlock(&nv->lock);
        hm__mutex_unlock(&nv->orphan_lock);
    }
    hm__mutex_unlock(&g_lock);
}

/* The child unlocks, as the parent does: the forking thread owns every lock
 * there (prepare took them), and unlike re-initialising, unlocking keeps
 * TSan's lock graph right (init.c runs this between the tracker's two
 * child parts, after the call_rcu mutex was taken in prepare). */
void hm__native_atfork_child(void) {
    for (nv_pool_t *nv = g_pools; nv; nv = nv->g_next) {
        for (nv_heap_t *h = nv->heaps; h; h = h->all_next) {
            hm__mutex_unlock(&h->mq_lock);
            if (!h->binding) continue;
            int mine = 0;
            for (nv_binding_t *b = tl.bindings; b; b = b->next) mine |= b == h->binding;
            if (mine) continue;
            /* Its thread is gone: the binding stays unreachable (a small,
             * deliberate leak); the heap is adopted like any other. (A
             * thread caught inside an allocation at fork() leaves its heap
             * as it was; blocks in its outgoing batches stay there until the
             * heap is adopted and flushes them.) */
            h->binding = NULL;
            atomic_store_explicit(&h->tp, 0, memory_order_relaxed);
            h->aband_next = nv->abandoned;
            nv->abandoned = h;
        }
        hm__mutex_unlock(&nv->depot_lock);
        hm__mutex_unlock(&nv->large_lock);
        hm__mutex_unlock(&nv->lock);
        hm__mutex_unlock(&nv->orphan_lock);
    }
    hm__mutex_unlock(&g_lock);
}
