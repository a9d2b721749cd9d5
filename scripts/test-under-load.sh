#!/bin/bash
# SPDX-License-Identifier: MIT
# The README's test command on a busy machine: clone HEAD afresh, start K
# CPU-bound processes (busy loops; default K = the number of CPUs), run
# `bash scripts/test.sh` in the clone, stop the load; N times in a row.
# Prints each run's wall time and result; exits non-zero if any run failed.
#
#   bash scripts/test-under-load.sh [--runs N] [--load K] [--quiet-too]
#
# --quiet-too first runs once with no load, for the quiet wall time.
# Clones go to a temporary folder (kept on failure, with its logs); the
# jemalloc source cache (~/.cache/hetmem) is shared with normal runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

runs=3
load=$(nproc 2>/dev/null || echo 2)
quiet=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --quiet-too) quiet=1; shift ;;
    *) echo "usage: $0 [--runs N] [--load K] [--quiet-too]" >&2; exit 2 ;;
  esac
done

src=$(pwd)
rev=$(git rev-parse --short HEAD) # every run tests this commit
pids=()
stop_load() {
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}" 2>/dev/null
  pids=()
}
trap stop_load EXIT

one_run() { # $1: label, $2: number of busy loops
  local dir t0 rc secs
  dir=$(mktemp -d /tmp/hm-load-XXXXXX)
  git clone -q "$src" "$dir/hetmem" && git -C "$dir/hetmem" checkout -q "$rev" || return 1
  for ((i = 0; i < $2; i++)); do
    bash -c 'while :; do :; done' &
    pids+=($!)
  done
  t0=$SECONDS
  (cd "$dir/hetmem" && bash scripts/test.sh) >"$dir/test.out" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  stop_load
  printf '%-10s %s  load %d  %dm%02ds  ' "$1" "$rev" "$2" $((secs / 60)) $((secs % 60))
  if [ $rc -eq 0 ]; then
    echo "passed: $(grep -E '^  (release|asan|tsan) ' "$dir/test.out" | sed -E 's/ +/ /g' | tr '\n' ';')"
    rm -rf "$dir"
  else
    echo "FAILED (log: $dir/test.out)"
    grep -E 'Failed|Timeout|\*\*\*' "$dir/test.out" | head -n 20
  fi
  return $rc
}

status=0
[ "$quiet" = 1 ] && { one_run quiet 0 || status=1; }
for ((r = 1; r <= runs; r++)); do
  one_run "loaded-$r" "$load" || status=1
done
exit $status
