#!/bin/bash
# SPDX-License-Identifier: MIT
# Records the traces in this folder: each program runs under
# libhetmem_proxy.so with HM_PROXY_TRACE (src/preload/trace.h), and each
# trace file is compressed with xz. Programs that start others (gcc) give one
# file per process; the processes are named after what they run.
#
#   bash bench/traces/record.sh [BUILD_DIR]    (default build-release)
#
# Run from anywhere; writes bench/traces/*.hmtrace.xz (replacing them).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build-release}" && pwd)
proxy=$build/src/preload/libhetmem_proxy.so
out=$root/bench/traces
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -r "$proxy" ] || { echo "record: no $proxy (build first)" >&2; exit 1; }
cd "$root"

rec() { # rec NAME COMMAND...: trace files $tmp/NAME.hmtrace[.<pid>]
  local name=$1
  shift
  HM_PROXY_TRACE=$tmp/$name.hmtrace LD_PRELOAD=$proxy "$@" >/dev/null 2>&1
}

rec gcc gcc -O2 -c bench/harness.c -o "$tmp/harness.o"
rec python3 /usr/bin/python3 -m test -q test_dict test_list test_sort
rec sqlite3 sqlite3 :memory: -cmd ".parameter set @n 6000" -cmd ".read bench/programs/sqlite.sql"
rec perl perl bench/programs/words.pl 1
rec cxx "$build/bench/bench_prog_cxx" 2 40
rec bash bash bench/programs/script.sh 2

# gcc's processes in the order they start: the driver, cc1, as (collect2 and
# ld do not run for -c).
mv "$tmp/gcc.hmtrace" "$tmp/gcc-driver.hmtrace"
n=0
for f in $(ls -tr "$tmp"/gcc.hmtrace.*); do
  case $n in 0) mv "$f" "$tmp/gcc-cc1.hmtrace" ;; 1) mv "$f" "$tmp/gcc-as.hmtrace" ;; *) rm -f "$f" ;; esac
  n=$((n + 1))
done
rm -f "$out"/*.hmtrace.xz
for f in "$tmp"/*.hmtrace; do
  xz -T2 -9 -c "$f" >"$out/$(basename "$f").xz"
done
ls -l "$out"
