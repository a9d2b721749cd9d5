/* hetmem — the native pool: the size classes, and the state all pools share
 * (g_lock, the pool list, the thread-local state and its key, global_init).
 * Part of native.c's unity build (native.c includes it; it is not compiled
 * alone). SPDX-License-Identifier: MIT */

/* ------------------------------------------------------------------------ */
/* Size classes: 8, 16..256 step 16, then 8 per power of two up to 1 MiB.   */

uint32_t hm__nv_cls_size[NV_NCLS_MAX];
uint8_t hm__nv_cls_of8[NV_FAST_MAX / 8 + 1];
uint16_t hm__nv_cls_at8[NV_FAST_MAX / 8 + 1];

HM_INLINE unsigned cls_of_big(size_t size) { /* size > 256 */
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(size - 1));
    return 17u + (k - 8u) * 8u + (unsigned)((size - 1 - ((size_t)1 << k)) >> (k - 3u));
}

HM_INLINE unsigned cls_of(size_t size) {
    if (hm_likely(size <= NV_FAST_MAX)) return hm__nv_cls_of8[(size + 7) >> 3];
    return cls_of_big(size);
}

/* Round a large size up on the same scale (8 steps per power of two); 0 on
 * overflow. */
static size_t scale_round(size_t size) {
    if (size <= 256) return hm_align_up(size, 16);
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(size - 1));
    return hm_align_up(size, (size_t)1 << (k - 3u));
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* bindings, g_pools */
static _Atomic uint64_t g_next_id = 1;
static nv_pool_t *g_pools; /* live pools, for fork (g_lock) */

/* This thread's thread pointer: one instruction on x86-64 and AArch64 (the
 * TCB address, unique among live threads), else the address of a
 * thread-local variable. */
HM_INLINE uintptr_t thread_tp(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    uintptr_t tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#elif defined(__aarch64__) && defined(__GNUC__)
    uintptr_t tp;
    __asm__("mrs %0, tpidr_el0" : "=r"(tp));
    return tp;
#else
    static __thread char anchor;
    return (uintptr_t)&anchor;
#endif
}

/* Thread state: the alloc fast path reads tl.id/tl.heap only. */
static NV_TLS nv_tls_t tl;

static void tl_destructor(void *arg);

HM_RUN static void global_init(void) {
    hm__nv_cls_size[0] = 8;
    for (unsigned i = 1; i <= 16; i++) hm__nv_cls_size[i] = 16u * i;
    for (unsigned k = 8; k < 20; k++)
        for (unsigned j = 0; j < 8; j++)
            hm__nv_cls_size[17 + (k - 8) * 8 + j] = (1u << k) + (j + 1) * (1u << (k - 3));
    for (unsigned i = 0; i <= NV_FAST_MAX / 8; i++) {
        size_t size = i ? (size_t)i * 8 : 1;
        unsigned c = 0;
        while (hm__nv_cls_size[c] < size) c++;
        hm__nv_cls_of8[i] = (uint8_t)c;
        hm__nv_cls_at8[i] = (uint16_t)NV_CLS_AT(c);
    }
    if (pthread_key_create(&g_key, tl_destructor)) HM_DIE("pthread_key_create failed");
    /* The fork hooks (hm__native_atfork_*) are the NATIVE slot of the
     * library's fork list, filled by init.c (fork.h). */
}
