#!/bin/bash
# SPDX-License-Identifier: MIT
# Lists the functions of libhetmem.so that a native pool's run executes but
# that lie outside the run-time section (.text.hm_run, cmake/hm_text.ld): each
# is missing the HM_RUN mark at its definition (src/internal.h) and costs
# resident code pages (docs/architecture.md, "Code layout"). Runs
# `bench_native --rss-child CASE native N` under callgrind for the remote,
# fan-in and xmalloc cases; teardown (destroy, fini, the tracker's drain and
# flush, the statistics read at the end) runs after the figures are taken and
# is left out by name. Needs valgrind and a Release build; part of the
# benchmark's routine (bench/bench_native.c, README "Benchmarks"), not a test.
#   scripts/text_layout.sh [BUILD_DIR]       (default: build)
# Exit status: 0 when nothing is listed, 1 otherwise, 2 on a usage error.
set -uo pipefail
build=${1:-build}
lib=$build/src/libhetmem.so
bench=$build/bench/bench_native
command -v valgrind >/dev/null || { echo "text_layout: valgrind is not installed" >&2; exit 2; }
[ -x "$bench" ] && [ -e "$lib" ] || { echo "text_layout: no $bench or $lib" >&2; exit 2; }
read -r lo size < <(readelf -SW "$lib" |
  awk '$2 == ".text.hm_run" { print $4, $6 } $3 == ".text.hm_run" { print $5, $7 }')
[ -n "${lo:-}" ] || { echo "text_layout: $lib has no .text.hm_run (linker without INSERT?)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for c in remote fanin xmalloc; do
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$c" "$bench" --rss-child "$c" native 100000 \
    >/dev/null 2>&1 || { echo "text_layout: $c run failed" >&2; exit 2; }
  callgrind_annotate --threshold=100 "$tmp/cg.$c" 2>/dev/null |
    sed -nE 's/.*\?\?\?:([^ ]+) \[.*libhetmem.*/\1/p' >>"$tmp/executed"
done
nm -S --defined-only "$lib" | awk 'NF == 4 && $3 ~ /[tT]/ { print $4, $1 }' | sort -u >"$tmp/syms"
sed "s/'.*//" "$tmp/executed" | sort -u | join - "$tmp/syms" |
  awk -v lo=$((16#$lo)) -v hi=$((16#$lo + 16#$size)) '
    function hex(s,  i, v, c) { v = 0; for (i = 1; i <= length(s); i++) { c = index("0123456789abcdef", substr(s, i, 1)) - 1; v = v * 16 + c } return v }
    $1 ~ /^(hm_pool_destroy|hm_provider_destroy|nv_fini|os_fini|hm__tracker_fini|hm__tracker_flush|hm__tracker_index_drain|hm__tracker_index_fini|free_subtree|subtree_has_records|hm__handle_unregister|hm__ipc_range_release|hm__ipc_pool_destroy|map_fini|meta_fini|nv_get_stats)([.]|$)/ { next }
    { a = hex($2); if (a < lo || a >= hi) { print "  " $1; n++ } }
    END { exit n > 0 }' >"$tmp/out"
rc=$?
if [ $rc -eq 0 ]; then
  echo "text_layout: every function the runs execute is in .text.hm_run"
else
  echo "text_layout: executed outside .text.hm_run (mark them HM_RUN where they are defined):"
  cat "$tmp/out"
fi
exit $rc
