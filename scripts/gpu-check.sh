#!/bin/bash
# SPDX-License-Identifier: MIT
# The CUDA provider on a machine with an NVIDIA GPU and its real driver:
# builds hetmem (Release, build-gpu/), runs the CUDA tests against the
# machine's libcuda.so.1 (the provider and pool suites on the GPU, and the
# two-process IPC example), then a short benchmark, and prints a summary
# table last: pool alloc/free against cuMemAlloc and cuMemAllocAsync, IPC
# open hit/miss against cuIpcOpenMemHandle, ratios (< 1: hetmem is faster).
# Under 5 minutes. Exit code: 0 when everything passed; 77 when there is no
# NVIDIA GPU (or no driver) here.
#
#   scripts/gpu-check.sh [--no-build]
set -uo pipefail
cd "$(dirname "$0")/.."

dir=build-gpu
jobs=$(nproc 2>/dev/null || echo 2)
[ "$jobs" -gt 16 ] && jobs=16
t0=$SECONDS

if [ "${1:-}" != "--no-build" ]; then
  if [ "$(id -u)" = 0 ]; then bash scripts/deps.sh demo >/dev/null || exit 1; fi
  echo "gpu-check: building (Release, $dir/)"
  if ! { cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DHM_WITH_CUDA=ON -DHM_BUILD_TESTS=ON \
           -DHM_BUILD_BENCHMARKS=ON -DHM_BUILD_EXAMPLES=ON &&
         cmake --build "$dir" -j "$jobs" --target test_cuda_provider bench_cuda cuda_ipc; } \
         >"$dir.log" 2>&1; then
    tail -n 40 "$dir.log"
    echo "gpu-check: the build failed (log: $dir.log)" >&2
    exit 1
  fi
fi

unset HM_CUDA_DRIVER # the machine's own driver
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu-check: GPU: /'
fi

status=0
declare -A result
run() { # name, command...
  local name=$1 rc
  shift
  local t=$SECONDS
  "$@" >"$dir/$name.log" 2>&1
  rc=$?
  case $rc in
    0) result[$name]="passed ($((SECONDS - t)) s)" ;;
    77) result[$name]="skipped: $(grep -m1 -i skip "$dir/$name.log" | cut -c1-80)" ;;
    *) result[$name]="FAILED ($rc; log $dir/$name.log)"; status=1 ;;
  esac
  return $rc
}

run hardware-suites "$dir/test/cuda/test_cuda_provider" hardware
hw=$?
if [ "$hw" -eq 77 ]; then
  echo "gpu-check: no NVIDIA GPU with a driver here (${result[hardware-suites]})"
  exit 77
fi
run ipc-example "$dir/examples/cuda_ipc"
run benchmark "$dir/bench/bench_cuda" --repeats 5 --min-time 0.05 --csv "$dir/bench_cuda.csv"

echo
echo "== gpu-check summary ($((SECONDS - t0)) s) =="
for k in hardware-suites ipc-example benchmark; do printf '  %-16s %s\n' "$k" "${result[$k]:-not run}"; done
if [ -s "$dir/bench_cuda.csv" ]; then
  echo
  printf '  %-20s %-16s %14s %12s\n' "case" "implementation" "median ns/op" "hetmem/impl"
  # suite,case,impl,role,status,ops,iters,repeats,median,min,max,cpus,ratio,run_cpus
  awk -F, 'NR > 1 { gsub(/"/, "", $2); gsub(/"/, "", $3);
                    printf "  %-20s %-16s %14.1f %12s\n", $2, $3, $9, ($13 == "" ? "-" : $13 "x") }' \
    "$dir/bench_cuda.csv"
  grep -h "driver calls per provider op" "$dir/benchmark.log" | sed 's/^/  /'
  grep -h "effective CPUs of the run" "$dir/benchmark.log" | sed 's/^/  /'
fi
[ "$status" -eq 0 ] && echo "gpu-check: passed" || echo "gpu-check: FAILED"
exit $status
