/* hetmem benchmark: how much memory the tracker's deferred reclamation holds
 * back under allocation churn with a concurrent lookup thread.
 * SPDX-License-Identifier: MIT
 *
 * Pattern (issue 30): a user provider whose pages are 64 bytes (a provider
 * may declare any power-of-two page), a proxy pool over it (every block is a
 * tracked provider range), one thread allocating and freeing `--live`
 * blocks of 64..256 bytes in a loop, one thread calling hm_pool_by_ptr on
 * them. Each free retires a tracker record and a copy-on-write page list,
 * freed only after an RCU grace period; with both threads pinned to one CPU
 * (--pin), urcu's call_rcu worker must compete for that CPU.
 *
 * Prints the process's RSS growth between the end of a warm-up and the end
 * of the run, the operations done and the effective CPU count (CPU time
 * over wall time). Bounded by work (--ops) or by time (--seconds).
 *   --ops N            alloc+free pairs to run (default 2000000)
 *   --seconds S        run for S seconds instead
 *   --live K           live blocks (default 300)
 *   --pin              both threads (and so urcu's worker, which they
 *                      create) on the first CPU of this process's set
 *   --max-growth-mib M exit 1 if RSS grew by more than M MiB (a test)
 *   --quick            20000 ops (the CTest smoke run) */
#include <hetmem/hetmem.h>
#include <hetmem/pools/proxy.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---- a user provider with 64-byte pages over malloc ---- */
#define PAGE 64
static hm_result_t up_init(const void *params, void **state) {
    (void)params;
    *state = NULL;
    return HM_SUCCESS;
}
static void up_fini(void *state) { (void)state; }
static void up_info(void *state, hm_provider_info_t *info) {
    (void)state;
    info->name = "bench-64b";
    info->family = HM_PROVIDER_FAMILY_USER;
    info->kind = HM_MEMORY_HOST;
    info->caps = HM_PROVIDER_CAP_FREE | HM_PROVIDER_CAP_CPU_ACCESS;
    info->min_page_size = PAGE;
    info->recommended_page_size = PAGE;
}
static hm_result_t up_alloc(void *state, size_t size, size_t alignment, void **ptr) {
    (void)state;
    size_t a = alignment > PAGE ? alignment : PAGE;
    *ptr = aligned_alloc(a, (size + a - 1) / a * a);
    return *ptr ? HM_SUCCESS : HM_ERROR_OUT_OF_HOST_MEMORY;
}
static hm_result_t up_free(void *state, void *ptr, size_t size) {
    (void)state;
    (void)size;
    free(ptr);
    return HM_SUCCESS;
}
static const hm_provider_ops_t up_ops = {
    .version = HM_PROVIDER_OPS_VERSION,
    .name = "bench-64b",
    .init = up_init,
    .fini = up_fini,
    .get_info = up_info,
    .alloc = up_alloc,
    .free = up_free,
};

/* ---- the workload ---- */
static _Atomic(void *) *g_slots;
static size_t g_live;
static _Atomic int g_stop;
static _Atomic unsigned long g_lookups;
static int g_pin_cpu = -1;

static void pin_self(void) {
    if (g_pin_cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(g_pin_cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
}

static void *lookup_thread(void *arg) {
    (void)arg;
    pin_self();
    unsigned long n = 0;
    size_t i = 0;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        void *p = atomic_load_explicit(&g_slots[i], memory_order_relaxed);
        if (p) (void)hm_pool_by_ptr(p);
        if (++i == g_live) i = 0;
        n++;
    }
    atomic_store(&g_lookups, n);
    return NULL;
}

static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (size_t)sysconf(_SC_PAGESIZE);
}

static double now_s(int clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int first_cpu(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) return 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) return c;
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: retire_growth [--ops N | --seconds S] [--live K] [--pin] "
                    "[--max-growth-mib M] [--quick]\n");
}

int main(int argc, char **argv) {
    unsigned long long ops = 2000000;
    double seconds = 0;
    double max_growth_mib = -1;
    g_live = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ops") && v) {
            ops = strtoull(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--seconds") && v) {
            seconds = strtod(v, NULL);
            i++;
        } else if (!strcmp(a, "--live") && v) {
            g_live = strtoul(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--max-growth-mib") && v) {
            max_growth_mib = strtod(v, NULL);
            i++;
        } else if (!strcmp(a, "--pin")) {
            g_pin_cpu = first_cpu();
        } else if (!strcmp(a, "--quick")) {
            ops = 20000;
        } else {
            usage();
            return !strcmp(a, "--help") ? 0 : 2;
        }
    }
    if (g_live == 0 || g_live > 1000000) {
        usage();
        return 2;
    }
    pin_self();

    hm_provider_t *prov = NULL;
    hm_pool_t *pool = NULL;
    if (hm_provider_create(&up_ops, NULL, &prov) || hm_proxy_pool_create(prov, 0, &pool)) {
        fprintf(stderr, "retire_growth: cannot create the provider or pool\n");
        return 1;
    }
    g_slots = calloc(g_live, sizeof *g_slots);
    if (!g_slots) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, lookup_thread, NULL)) return 1;

    /* Warm-up: one pass per slot size class, so the malloc arenas and the
     * tracker's nodes exist before the first RSS sample. */
    unsigned rnd = 12345;
    unsigned long long done = 0, warm = 20 * (unsigned long long)g_live;
    size_t rss0 = 0, peak = 0;
    double w0 = 0, c0 = 0;
    int failed = 0;
    for (unsigned long long k = 0;; k++) {
        if (k == warm) {
            rss0 = rss_bytes();
            peak = rss0;
            w0 = now_s(CLOCK_MONOTONIC);
            c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        }
        if (k >= warm) {
            if (seconds > 0 ? (k & 1023) == 0 && now_s(CLOCK_MONOTONIC) - w0 >= seconds
                            : done >= ops)
                break;
            if ((k & 4095) == 0) {
                size_t r = rss_bytes();
                if (r > peak) peak = r;
            }
            done++;
        }
        size_t i = k % g_live;
        void *old = atomic_exchange_explicit(&g_slots[i], NULL, memory_order_relaxed);
        if (old && hm_pool_free(pool, old) != HM_SUCCESS) failed++;
        rnd = rnd * 1103515245u + 12345u;
        void *p = hm_pool_malloc(pool, 64 + (rnd >> 16) % 193);
        if (!p) failed++;
        atomic_store_explicit(&g_slots[i], p, memory_order_relaxed);
    }
    size_t rss1 = rss_bytes();
    if (rss1 > peak) peak = rss1;
    double wall = now_s(CLOCK_MONOTONIC) - w0;
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    atomic_store(&g_stop, 1);
    pthread_join(t, NULL);
    for (size_t i = 0; i < g_live; i++) {
        void *p = atomic_load(&g_slots[i]);
        if (p && hm_pool_free(pool, p) != HM_SUCCESS) failed++;
    }
    hm_pool_destroy(pool);
    hm_provider_destroy(prov);
    free(g_slots);

    double growth = ((double)rss1 - (double)rss0) / 1048576.0;
    double peak_growth = ((double)peak - (double)rss0) / 1048576.0;
    printf("retire_growth: live %zu, pinned %s, %llu alloc+free pairs and %lu lookups in %.1f s\n",
           g_live, g_pin_cpu >= 0 ? "yes" : "no", done, atomic_load(&g_lookups), wall);
    printf("  RSS after warm-up %.1f MiB; growth at end %.1f MiB, at peak %.1f MiB; "
           "effective CPUs %.2f\n",
           (double)rss0 / 1048576.0, growth, peak_growth, wall > 0 ? cpu / wall : 0.0);
    if (failed) {
        fprintf(stderr, "retire_growth: %d allocations or frees failed\n", failed);
        return 1;
    }
    if (max_growth_mib >= 0 && peak_growth > max_growth_mib) {
        fprintf(stderr, "retire_growth: RSS grew by %.1f MiB, over the %.1f MiB bound\n",
                peak_growth, max_growth_mib);
        return 1;
    }
    return 0;
}
