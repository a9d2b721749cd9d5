#!/bin/bash
# SPDX-License-Identifier: MIT
# The README's test command (and CI's, through .ci/run): install what is
# missing, then build and run the whole test suite three ways, each in its own
# folder with warnings as errors (HM_DEVELOPER=ON):
#   build-release  Release
#   build-asan     AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer)
#   build-tsan     ThreadSanitizer
# Prints the test counts of each build; exits non-zero if any build or test
# failed. Logs: build-<name>/{build,test}.log.
#
# Environment: HM_TEST_BUILDS="release asan tsan" (a subset), HM_JOBS (build
# parallelism, default nproc), HM_CTEST_JOBS (default 2), HM_TEST_EXTRA_CMAKE_ARGS,
# HM_TEST_JEMALLOC (default ON: the jemalloc pool is built and tested; its
# private jemalloc comes once from Debian's source package, cached in
# ~/.cache/hetmem — see cmake/HmJemalloc.cmake).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

bash scripts/deps.sh test || { echo "test: installing dependencies failed" >&2; exit 1; }

builds=${HM_TEST_BUILDS:-release asan tsan}
jobs=${HM_JOBS:-$(nproc 2>/dev/null || echo 2)}
ctest_jobs=${HM_CTEST_JOBS:-2}
read -r -a extra_args <<<"${HM_TEST_EXTRA_CMAKE_ARGS:-}"
extra_args=("-DHM_WITH_JEMALLOC=${HM_TEST_JEMALLOC:-ON}" "-DHM_WITH_LEVEL_ZERO=${HM_TEST_LEVEL_ZERO:-ON}" "-DHM_WITH_CUDA=${HM_TEST_CUDA:-ON}" "${extra_args[@]}")
cc=${CC:-cc}

# ThreadSanitizer (GCC 12's runtime) aborts with "unexpected memory mapping"
# on kernels whose mmap randomisation reaches its shadow ranges
# (vm.mmap_rnd_bits > 28). Probe it once; if it fails only with ASLR on, run
# the TSan tests with ASLR off for the tests' process tree (setarch -R).
tsan_prefix=()
probe_tsan() {
  local d
  d=$(mktemp -d)
  cat >"$d/p.c" <<'PROBE'
#include <pthread.h>
static void *f(void *a) { return a; }
int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); return pthread_join(t, 0); }
PROBE
  if ! "$cc" -fsanitize=thread -pthread "$d/p.c" -o "$d/p" 2>"$d/err"; then
    echo "test: cannot build a TSan program: $(head -n 3 "$d/err")"
  elif "$d/p" >"$d/out" 2>&1; then
    echo "test: TSan works with ASLR on"
  elif setarch "$(uname -m)" -R "$d/p" >/dev/null 2>&1; then
    echo "test: TSan fails with ASLR on ($(grep -m1 -o 'unexpected memory mapping' "$d/out" ||
          head -c 80 "$d/out")); TSan tests run under 'setarch -R' (ASLR off)"
    tsan_prefix=(setarch "$(uname -m)" -R)
  else
    echo "test: TSan does not work on this machine: $(head -n 2 "$d/out")"
  fi
  rm -rf "$d"
}

declare -A summary
status=0
start_all=$SECONDS

for b in $builds; do
  case "$b" in
    release) args=(-DCMAKE_BUILD_TYPE=Release) ;;
    asan) args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DHM_SANITIZE=address,undefined") ;;
    tsan) args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DHM_SANITIZE=thread)
          probe_tsan ;;
    *) echo "test: unknown build '$b' (release, asan, tsan)" >&2; exit 2 ;;
  esac
  dir=build-$b
  mkdir -p "$dir"
  t0=$SECONDS
  echo "== $b: configure and build ($dir, log $dir/build.log)"
  if ! { cmake -S . -B "$dir" -DHM_DEVELOPER=ON "${args[@]}" "${extra_args[@]}" &&
         cmake --build "$dir" -j "$jobs"; } >"$dir/build.log" 2>&1; then
    tail -n 60 "$dir/build.log"
    summary[$b]="BUILD FAILED (see $dir/build.log)"
    status=1
    continue
  fi
  echo "== $b: ctest -j$ctest_jobs"
  prefix=()
  [ "$b" = tsan ] && prefix=("${tsan_prefix[@]}")
  # ASan: report leaks; UBSan: print stacks. TSan: fail on the first report.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
  "${prefix[@]}" ctest --test-dir "$dir" --output-on-failure -j "$ctest_jobs" 2>&1 |
    tee "$dir/test.log"
  rc=${PIPESTATUS[0]}
  # Counts from CTest's own lines: "Test #n: name ....   Passed", "***Skipped", ...
  total=$(grep -oE 'tests? failed out of [0-9]+' "$dir/test.log" | grep -oE '[0-9]+$' | tail -n 1)
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed +[0-9.]+ sec' "$dir/test.log")
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$dir/test.log")
  total=${total:-0}
  failed=$((total - passed - skipped))
  secs=$((SECONDS - t0))
  summary[$b]="$total tests: $passed passed, $skipped skipped, $failed failed (${secs}s)"
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$total" -eq 0 ]; then
    summary[$b]+=" -- FAILED"
    status=1
  fi
done

echo
echo "== summary ($((SECONDS - start_all))s)"
for b in $builds; do
  printf '  %-8s %s\n' "$b" "${summary[$b]:-not run}"
done
if [ $status -eq 0 ]; then echo "test: all builds passed"; else echo "test: FAILED"; fi
exit $status
