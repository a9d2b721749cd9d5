/* hetmem — IPC: the exporter's ptrace permission, only as the program asks.
 * SPDX-License-Identifier: MIT
 *
 * An importer reads the exporter's copy of a handle (process_vm_readv) and
 * fetches its descriptors (pidfd_getfd); both need ptrace access to the
 * exporter (PTRACE_MODE_ATTACH_REALCREDS). Where Yama's ptrace_scope is 1
 * only descendants and a declared ptracer have it. Declaring one
 * (prctl(PR_SET_PTRACER)) opens the whole process — its memory and every
 * descriptor — to that process, so the library never does it by itself:
 * hm_ipc_allow_importer() records the program's choice, and it is in force
 * only while this process has exports (the export cache holds at least
 * one: export.c reports the two transitions), then withdrawn (PR_SET_PTRACER
 * 0), and set again at the next export. Without Yama, or at scope 0, there
 * is nothing to declare and no prctl is made; at scope 2 or 3 a
 * declaration does not help (use the channel).
 *
 * State (pt.lock): the program's choice, whether the export cache is
 * non-empty, and whether hetmem's declaration is in force. Lock order:
 * exports.lock -> pt.lock (export.c calls in with it held). Fork: a child
 * has no Yama declaration of its parent's and no exports; the IPC fork
 * slot takes pt.lock in prepare, and the child resets both flags. */
#include "ipc/ipc_core.h"

#include <errno.h>

static struct {
    pthread_mutex_t lock;
    int64_t allowed;  /* 0 none, > 0 a pid, -1 any */
    bool exporting;   /* the export cache is not empty */
    bool in_force;    /* hetmem's PR_SET_PTRACER is the process's */
} pt = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Bring the declaration in line with (allowed, exporting); pt.lock held. */
static hm_result_t pt_apply(void) {
    if (hm__prim_yama_scope() < 1) return HM_SUCCESS; /* nothing to declare */
    bool want = pt.allowed != 0 && pt.exporting;
    if (want) {
        hm_result_t r = hm__prim_set_ptracer(pt.allowed);
        if (r != HM_SUCCESS) {
            HM_LOG_ERROR("hm_ipc_allow_importer: prctl(PR_SET_PTRACER) refused; importers "
                         "need the channel");
            return r;
        }
        pt.in_force = true;
    } else if (pt.in_force) {
        (void)hm__prim_set_ptracer(0);
        pt.in_force = false;
    }
    return HM_SUCCESS;
}

void hm__ipc_ptrace_exporting(bool exporting) {
    hm__mutex_lock(&pt.lock);
    if (pt.exporting != exporting) {
        pt.exporting = exporting;
        if (pt.allowed) (void)pt_apply();
    }
    hm__mutex_unlock(&pt.lock);
}

void hm__ipc_ptrace_atfork(int phase) {
    if (phase == 0) {
        hm__mutex_lock(&pt.lock);
        return;
    }
    if (phase == 2) { /* the child: no declaration, no exports of its own yet */
        pt.exporting = false;
        pt.in_force = false;
    }
    hm__mutex_unlock(&pt.lock);
}

hm_result_t hm_ipc_allow_importer(int64_t pid) {
    hm__ipc_lazy_init();
    if (pid < HM_IPC_IMPORTER_ANY || pid > INT32_MAX) {
        HM_LOG_ERROR("hm_ipc_allow_importer(%lld): not a pid, 0 or HM_IPC_IMPORTER_ANY",
                     (long long)pid);
        return HM_ERROR_INVALID_ARGUMENT;
    }
    int scope = hm__prim_yama_scope();
    if (pid != 0 && scope >= 2) {
        HM_LOG_ERROR("hm_ipc_allow_importer: Yama's ptrace_scope is %d: no process may be "
                     "declared; send handles over hm_ipc_channel_send()", scope);
        return HM_ERROR_NOT_SUPPORTED;
    }
    hm__mutex_lock(&pt.lock);
    pt.allowed = pid;
    hm_result_t r = pt_apply();
    if (r != HM_SUCCESS) pt.allowed = 0;
    hm__mutex_unlock(&pt.lock);
    return r;
}
