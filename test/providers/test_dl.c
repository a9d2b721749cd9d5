/* hetmem tests — run-time driver loading (src/platform/dl.h).
 * SPDX-License-Identifier: MIT
 *
 * Loads the test libraries libhm_dltest.so and libhm_dltest_b.so (built
 * from dl_testlib.c into HM_DLTEST_DIR, which CTest puts on
 * LD_LIBRARY_PATH): by default name, by an override variable, a missing
 * library, missing required and optional symbols, the exact versioned
 * name, concurrent first loads, and a load in a forked child. */
#include "harness.h"
#include "platform/dl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef HM_DLTEST_DIR
#error "HM_DLTEST_DIR names the directory of the test libraries"
#endif

/* ---- log lines, counted by level ---- */

static _Atomic int g_lines[HM_LOG_OFF + 1];
static char g_last[512];
static pthread_mutex_t g_last_lock = PTHREAD_MUTEX_INITIALIZER;

static void sink(hm_log_level_t level, const char *line, void *arg) {
    (void)arg;
    if ((int)level >= 0 && level <= HM_LOG_OFF) atomic_fetch_add(&g_lines[level], 1);
    pthread_mutex_lock(&g_last_lock);
    snprintf(g_last, sizeof(g_last), "%s", line);
    pthread_mutex_unlock(&g_last_lock);
}

static void lines_reset(void) {
    for (int i = 0; i <= HM_LOG_OFF; i++) atomic_store(&g_lines[i], 0);
    g_last[0] = '\0';
}
static int lines(hm_log_level_t level) { return atomic_load(&g_lines[level]); }
static int lines_total(void) {
    int n = 0;
    for (int i = 0; i <= HM_LOG_OFF; i++) n += atomic_load(&g_lines[i]);
    return n;
}
static int last_has(const char *what) { return strstr(g_last, what) != NULL; }

/* ---- the test library's symbols ---- */

typedef struct dltest_api {
    int (*answer)(void);
    int64_t (*add_v2)(int64_t, int64_t);
    int (*absent)(void);
    int *constructed;
} dltest_api_t;

static void test_default_name(void) {
    hm_test_set_context("default name");
    lines_reset();
    hm_dl_lib_t *lib = NULL;
    CHECK_OK(hm__dl_open("libhm_dltest.so", NULL, "test library", &lib));
    REQUIRE(lib != NULL);
    CHECK(hm__dl_handle(lib) != NULL);
    CHECK(strcmp(hm__dl_path(lib), "libhm_dltest.so") == 0);
    CHECK_EQ(lines_total(), 0); /* success is silent */

    dltest_api_t api;
    memset(&api, 0x5a, sizeof(api));
    const hm_dl_sym_t syms[] = {
        HM_DL_REQUIRED("hm_dltest_answer", &api.answer),
        HM_DL_REQUIRED("hm_dltest_add_v2", &api.add_v2),
        HM_DL_OPTIONAL("hm_dltest_absent_v3", &api.absent),
        HM_DL_REQUIRED("hm_dltest_constructed", &api.constructed),
    };
    size_t missing = 99;
    CHECK_OK(hm__dl_resolve(lib, syms, sizeof(syms) / sizeof(syms[0]), &missing));
    CHECK_EQ(missing, 1);
    CHECK(api.absent == NULL);
    REQUIRE(api.answer && api.add_v2 && api.constructed);
    CHECK_EQ(api.answer(), 42);
    /* The versioned name: 64-bit arithmetic, not the old 32-bit entry. */
    CHECK(api.add_v2((int64_t)1 << 40, 1) == ((int64_t)1 << 40) + 1);
    CHECK_EQ(*api.constructed, 1);
    /* One info line names the missing optional symbol. */
    CHECK_EQ(lines(HM_LOG_INFO), 1);
    CHECK_EQ(lines_total(), 1);
    CHECK_MSG(last_has("hm_dltest_absent_v3"), "info line: %s", g_last);

    /* The same library again: the same entry and handle, no second load. */
    hm_dl_lib_t *again = NULL;
    CHECK_OK(hm__dl_open("libhm_dltest.so", NULL, "test library", &again));
    CHECK(again == lib);
    CHECK(hm__dl_handle(again) == hm__dl_handle(lib));
    CHECK_EQ(*api.constructed, 1);

    /* Single lookups. */
    CHECK(hm__dl_sym(lib, "hm_dltest_answer") == (void *)api.answer);
    CHECK(hm__dl_sym(lib, "hm_dltest_nope") == NULL);
    CHECK(hm__dl_sym(NULL, "hm_dltest_answer") == NULL);
    CHECK(hm__dl_sym(lib, NULL) == NULL);

    /* The old name is a different function (the one a wrong name would get). */
    void *old = hm__dl_sym(lib, "hm_dltest_add");
    CHECK(old != NULL && old != (void *)api.add_v2);
}

static void test_env_override(void) {
    hm_test_set_context("environment override");
    lines_reset();
    const char *abs = HM_DLTEST_DIR "/libhm_dltest.so";
    REQUIRE(setenv("HM_DLTEST_PATH", abs, 1) == 0);
    hm_dl_lib_t *lib = NULL;
    /* The default name does not exist: the override is what loads. */
    CHECK_OK(hm__dl_open("libhm_dltest_nonexistent.so.7", "HM_DLTEST_PATH", "test library",
                         &lib));
    REQUIRE(lib != NULL);
    CHECK(strcmp(hm__dl_path(lib), abs) == 0);
    /* glibc: the same file, already loaded by name, is the same object. */
    hm_dl_lib_t *byname = NULL;
    CHECK_OK(hm__dl_open("libhm_dltest.so", NULL, NULL, &byname));
    CHECK(byname && hm__dl_handle(byname) == hm__dl_handle(lib));
    int (*answer)(void) = NULL;
    const hm_dl_sym_t syms[] = {HM_DL_REQUIRED("hm_dltest_answer", &answer)};
    size_t missing = 7;
    CHECK_OK(hm__dl_resolve(lib, syms, 1, &missing));
    CHECK_EQ(missing, 0);
    CHECK(answer && answer() == 42);
    CHECK_EQ(lines_total(), 0);

    /* An override replaces the default; it is never a fallback. */
    lines_reset();
    REQUIRE(setenv("HM_DLTEST_BAD", "/nonexistent/dir/libnope.so.1", 1) == 0);
    lib = (hm_dl_lib_t *)(uintptr_t)1;
    CHECK_RES(hm__dl_open("libhm_dltest.so", "HM_DLTEST_BAD", "test library", &lib),
              HM_ERROR_NOT_SUPPORTED);
    CHECK(lib == NULL);
    CHECK_EQ(lines(HM_LOG_WARN), 1); /* the user asked for that file */
    CHECK_EQ(lines_total(), 1);
    CHECK_MSG(last_has("/nonexistent/dir/libnope.so.1") && last_has("HM_DLTEST_BAD"),
              "warn line: %s", g_last);
    /* Again: refused at once, one debug line. */
    lines_reset();
    CHECK_RES(hm__dl_open("libhm_dltest.so", "HM_DLTEST_BAD", "test library", &lib),
              HM_ERROR_NOT_SUPPORTED);
    CHECK_EQ(lines(HM_LOG_DEBUG), 1);
    CHECK_EQ(lines_total(), 1);

    /* An empty value is no override. */
    REQUIRE(setenv("HM_DLTEST_EMPTY", "", 1) == 0);
    CHECK_OK(hm__dl_open("libhm_dltest.so", "HM_DLTEST_EMPTY", NULL, &lib));
    CHECK(lib == byname);
    unsetenv("HM_DLTEST_PATH");
    unsetenv("HM_DLTEST_BAD");
    unsetenv("HM_DLTEST_EMPTY");
}

static void test_missing_library(void) {
    hm_test_set_context("missing library");
    lines_reset();
    hm_dl_lib_t *lib = (hm_dl_lib_t *)(uintptr_t)1;
    CHECK_RES(hm__dl_open("libhm_absent_driver.so.3", "HM_DLTEST_UNSET_VAR", "absent driver",
                          &lib),
              HM_ERROR_NOT_SUPPORTED);
    CHECK(lib == NULL);
    /* One line, at info level (a machine without the device), with dlerror's text. */
    CHECK_EQ(lines(HM_LOG_INFO), 1);
    CHECK_EQ(lines_total(), 1);
    CHECK_MSG(last_has("absent driver") && last_has("libhm_absent_driver.so.3"), "line: %s",
              g_last);
    /* hm__dl_load clears the caller's slots. */
    lines_reset();
    int (*fn)(void) = (int (*)(void))(uintptr_t)1;
    const hm_dl_sym_t syms[] = {HM_DL_REQUIRED("hm_dltest_answer", &fn)};
    size_t missing = 5;
    lib = (hm_dl_lib_t *)(uintptr_t)1;
    CHECK_RES(hm__dl_load("libhm_absent_driver.so.3", NULL, "absent driver", syms, 1, &lib,
                          &missing),
              HM_ERROR_NOT_SUPPORTED);
    CHECK(fn == NULL && lib == NULL);
    CHECK_EQ(missing, 0);
    CHECK_EQ(lines(HM_LOG_DEBUG), 1); /* the second failure of that path */
    CHECK_EQ(lines_total(), 1);
}

static void test_missing_symbols(void) {
    hm_test_set_context("missing symbols");
    hm_dl_lib_t *lib = NULL;
    REQUIRE(hm__dl_open("libhm_dltest.so", NULL, NULL, &lib) == HM_SUCCESS);
    /* A required symbol missing: nothing resolved, one warn line naming it. */
    lines_reset();
    int (*answer)(void) = NULL;
    int64_t (*add)(int64_t, int64_t) = NULL;
    void *missing1 = (void *)(uintptr_t)1, *missing2 = (void *)(uintptr_t)1;
    const hm_dl_sym_t syms[] = {
        HM_DL_REQUIRED("hm_dltest_answer", &answer),
        HM_DL_REQUIRED("hm_dltest_missing_v9", &missing1),
        HM_DL_OPTIONAL("hm_dltest_add_v2", &add),
        HM_DL_REQUIRED("hm_dltest_gone", &missing2),
    };
    size_t nopt = 3;
    CHECK_RES(hm__dl_resolve(lib, syms, 4, &nopt), HM_ERROR_NOT_SUPPORTED);
    CHECK(answer == NULL && add == NULL && missing1 == NULL && missing2 == NULL);
    CHECK_EQ(nopt, 0);
    CHECK_EQ(lines(HM_LOG_WARN), 1);
    CHECK_EQ(lines_total(), 1);
    CHECK_MSG(last_has("hm_dltest_missing_v9") && last_has("hm_dltest_gone") &&
                  !last_has("hm_dltest_answer"),
              "warn line: %s", g_last);
    /* Only optional ones missing: success, each named once in one info line. */
    lines_reset();
    void *o1 = NULL, *o2 = NULL;
    const hm_dl_sym_t opt[] = {
        HM_DL_OPTIONAL("hm_dltest_opt_a", &o1),
        HM_DL_REQUIRED("hm_dltest_answer", &answer),
        HM_DL_OPTIONAL("hm_dltest_opt_b", &o2),
    };
    CHECK_OK(hm__dl_resolve(lib, opt, 3, &nopt));
    CHECK_EQ(nopt, 2);
    CHECK(answer != NULL && o1 == NULL && o2 == NULL);
    CHECK_EQ(lines(HM_LOG_INFO), 1);
    CHECK_EQ(lines_total(), 1);
    CHECK_MSG(last_has("hm_dltest_opt_a") && last_has("hm_dltest_opt_b"), "info: %s", g_last);
    /* hm__dl_load: both steps. */
    lines_reset();
    answer = NULL;
    hm_dl_lib_t *l2 = NULL;
    CHECK_OK(hm__dl_load("libhm_dltest.so", NULL, NULL, opt + 1, 1, &l2, &nopt));
    CHECK(l2 == lib && answer != NULL);
    CHECK_EQ(nopt, 0);
    /* A table too long for one line still logs one line. */
    lines_reset();
    enum { MANY = 100 };
    static void *slots[MANY];
    static char names[MANY][48];
    hm_dl_sym_t many[MANY];
    for (int i = 0; i < MANY; i++) {
        snprintf(names[i], sizeof(names[i]), "hm_dltest_not_there_with_a_long_name_%d", i);
        many[i] = (hm_dl_sym_t)HM_DL_OPTIONAL(names[i], &slots[i]);
    }
    CHECK_OK(hm__dl_resolve(lib, many, MANY, &nopt));
    CHECK_EQ(nopt, MANY);
    CHECK_EQ(lines_total(), 1);
}

static void test_bad_arguments(void) {
    hm_test_set_context("bad arguments");
    hm_dl_lib_t *lib = NULL;
    CHECK_RES(hm__dl_open(NULL, NULL, NULL, &lib), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__dl_open("", NULL, NULL, &lib), HM_ERROR_INVALID_ARGUMENT);
    CHECK_RES(hm__dl_open("libhm_dltest.so", NULL, NULL, NULL), HM_ERROR_INVALID_ARGUMENT);
    void *slot = NULL;
    const hm_dl_sym_t ok[] = {HM_DL_REQUIRED("hm_dltest_answer", &slot)};
    CHECK_RES(hm__dl_resolve(NULL, ok, 1, NULL), HM_ERROR_INVALID_ARGUMENT);
    REQUIRE(hm__dl_open("libhm_dltest.so", NULL, NULL, &lib) == HM_SUCCESS);
    CHECK_RES(hm__dl_resolve(lib, NULL, 1, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(hm__dl_resolve(lib, NULL, 0, NULL));
    const hm_dl_sym_t noslot[] = {{.name = "hm_dltest_answer", .slot = NULL}};
    CHECK_RES(hm__dl_resolve(lib, noslot, 1, NULL), HM_ERROR_INVALID_ARGUMENT);
    const hm_dl_sym_t noname[] = {{.name = NULL, .slot = &slot}};
    CHECK_RES(hm__dl_resolve(lib, noname, 1, NULL), HM_ERROR_INVALID_ARGUMENT);
    CHECK(hm__dl_path(NULL) == NULL && hm__dl_handle(NULL) == NULL);
}

/* ---- concurrent first loads ---- */

enum { NTHREADS = 8 };

typedef struct loader {
    pthread_barrier_t *start;
    hm_dl_lib_t *lib;
    void *answer;
    hm_result_t r;
} loader_t;

static void *load_thread(void *arg) {
    loader_t *l = arg;
    pthread_barrier_wait(l->start);
    const hm_dl_sym_t syms[] = {HM_DL_REQUIRED("hm_dltest_answer", &l->answer)};
    l->r = hm__dl_load("libhm_dltest_b.so", NULL, "test library b", syms, 1, &l->lib, NULL);
    return NULL;
}

static void test_concurrent(void) {
    hm_test_set_context("concurrent first loads");
    lines_reset();
    for (int round = 0; round < 2; round++) { /* the first loads it, the second finds it */
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, NTHREADS);
        loader_t l[NTHREADS];
        pthread_t t[NTHREADS];
        memset(l, 0, sizeof(l));
        for (int i = 0; i < NTHREADS; i++) {
            l[i].start = &start;
            REQUIRE(pthread_create(&t[i], NULL, load_thread, &l[i]) == 0);
        }
        for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < NTHREADS; i++) {
            CHECK_OK(l[i].r);
            CHECK(l[i].lib != NULL && l[i].lib == l[0].lib);
            CHECK(l[i].answer != NULL && l[i].answer == l[0].answer);
        }
        if (l[0].lib) {
            int *constructed = hm__dl_sym(l[0].lib, "hm_dltest_constructed");
            CHECK(constructed && *constructed == 1); /* loaded once */
        }
    }
    CHECK_EQ(lines_total(), 0);
}

/* ---- fork: nothing held, the child loads and resolves like its parent ---- */

static void test_fork(void) {
    hm_test_set_context("fork");
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        hm_dl_lib_t *lib = NULL;
        int (*answer)(void) = NULL;
        const hm_dl_sym_t syms[] = {HM_DL_REQUIRED("hm_dltest_answer", &answer)};
        if (hm__dl_load("libhm_dltest_b.so", NULL, NULL, syms, 1, &lib, NULL) != HM_SUCCESS)
            _exit(2);
        if (!answer || answer() != 42) _exit(3);
        if (hm__dl_open("libhm_absent_driver.so.4", NULL, NULL, &lib) != HM_ERROR_NOT_SUPPORTED)
            _exit(4);
        _exit(0);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x", st);
}

/* The test libraries' directory must be on LD_LIBRARY_PATH (CTest sets it;
 * glibc reads it at start-up only): run by hand, the program re-executes
 * itself with it. */
static void ensure_search_path(char **argv) {
    const char *llp = getenv("LD_LIBRARY_PATH");
    if ((llp && strstr(llp, HM_DLTEST_DIR)) || getenv("HM_DLTEST_REEXEC")) return;
    char path[4096];
    snprintf(path, sizeof(path), "%s%s%s", HM_DLTEST_DIR, llp && *llp ? ":" : "",
             llp ? llp : "");
    if (setenv("LD_LIBRARY_PATH", path, 1) != 0 || setenv("HM_DLTEST_REEXEC", "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    (void)argc;
    ensure_search_path(argv);
    hm_log_set_sink(sink, NULL);
    hm_log_set_level(HM_LOG_DEBUG);
    test_default_name();
    test_env_override();
    test_missing_library();
    test_missing_symbols();
    test_bad_arguments();
    test_concurrent();
    test_fork();
    hm_log_set_sink(NULL, NULL);
    return hm_test_finish();
}
