#!/bin/bash
# SPDX-License-Identifier: MIT
# Every benchmark of bench/, whole programs and trace replays, against the
# baselines each names, in one sitting; one CSV, PNG charts and a summary
# table of ratios.
#
#   bash bench/run.sh [--quick] [--build DIR]
#
# 1. Installs what is missing (scripts/deps.sh bench: the peers' Debian
#    packages libjemalloc2, libmimalloc2.0, libtcmalloc-minimal4, memkind,
#    sqlite3, perl, Python's test suite, gnuplot) and builds Release
#    (DIR, default build-release, configured as scripts/test.sh does).
# 2. Runs every harness benchmark (bench/harness.h: repetitions, interleaved,
#    medians, effective CPUs); those with a malloc baseline (bench_native,
#    bench_alloc, bench_numa) also once under each peer's LD_PRELOAD, so that
#    the baseline is that peer. The GPU benchmarks run on the project's test
#    drivers where the machine has no GPU driver; bench_mpi under mpirun.
# 3. Times whole programs (gcc -O2, Python's test suite, sqlite3, perl, a
#    threaded C++ program, bash, and the synthetic bench_prog_* programs:
#    each the allocation pattern of a kind of program) and replays
#    the traces of bench/traces/, under hetmem (libhetmem_proxy.so), glibc,
#    jemalloc, mimalloc and tcmalloc, interleaved (bench/bench_exec.c); each
#    trace is first replayed with its checks on, under the proxy, and must
#    be faithful.
# 4. Writes bench/results/<date>-<host>.csv (machine facts in '#' lines) and
#    bench/results/<date>-<host>-*.png, and prints bench/report.py's summary.
#
# --quick: one repetition of everything, small program sizes, results under
# DIR/bench-results/ (CI runs this so that the benchmarks keep building and
# running; nothing about speed is asserted). Exits non-zero when a benchmark
# fails or a replay is not faithful.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1

quick=0
build=build-release
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --build) build=${2:?--build needs a folder}; shift ;;
    -h|--help) sed -n '3,30p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (--quick, --build DIR)" >&2; exit 2 ;;
  esac
  shift
done

t_start=$SECONDS
step=0
steps=0
failed=()
progress() { # progress TEXT: one line per step, with the elapsed time
  step=$((step + 1))
  printf '[%2d/%d %4ds] %s\n' "$step" "$steps" "$((SECONDS - t_start))" "$1" >&2
}

bash scripts/deps.sh bench >&2 || { echo "run.sh: installing dependencies failed" >&2; exit 1; }

echo "run.sh: building Release in $build (log: $build/bench-build.log)" >&2
mkdir -p "$build"
read -r -a extra_args <<<"${HM_TEST_EXTRA_CMAKE_ARGS:-}"
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHM_DEVELOPER=ON \
         -DHM_WITH_JEMALLOC=ON -DHM_WITH_LEVEL_ZERO=ON -DHM_WITH_CUDA=ON "${extra_args[@]}" &&
       cmake --build "$build" -j "$(nproc)"; } >"$build/bench-build.log" 2>&1; then
  tail -n 40 "$build/bench-build.log" >&2
  echo "run.sh: the build failed (log: $build/bench-build.log)" >&2
  exit 1
fi
build=$(cd "$build" && pwd)
bin=$build/bench
proxy=$build/src/preload/libhetmem_proxy.so

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
manifest=$tmp/manifest
: >"$manifest"

# The peers, through LD_PRELOAD of their Debian libraries.
libdir=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
declare -A peer_lib=([jemalloc]=$libdir/libjemalloc.so.2 [mimalloc]=$libdir/libmimalloc.so.2
                     [tcmalloc]=$libdir/libtcmalloc_minimal.so.4)
peers=()
for p in jemalloc mimalloc tcmalloc; do
  if [ -r "${peer_lib[$p]}" ]; then peers+=("$p"); else echo "run.sh: no ${peer_lib[$p]}: $p left out" >&2; fi
done
alloc_args=(--alloc "hetmem=$proxy" --alloc "glibc=")
for p in "${peers[@]}"; do alloc_args+=(--alloc "$p=${peer_lib[$p]}"); done

# GPU benchmarks: the real driver where there is one, else the test drivers.
gpu_env=()
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  gpu_env+=("HM_CUDA_DRIVER=$build/test/cuda/driver/libcuda.so.1")
fi
if ! ls /dev/dri/renderD* >/dev/null 2>&1; then
  gpu_env+=("ZE_ENABLE_ALT_DRIVERS=$build/test/level_zero/libze_test.so.1")
fi

harness_args=()
[ $quick = 1 ] && harness_args=(--quick)
with_peers=(bench_native bench_alloc bench_numa)
micro=()
for f in "$bin"/bench_*; do
  n=$(basename "$f")
  case "$n" in bench_exec|bench_replay|bench_mpi|bench_prog_*) continue ;; esac
  [ -x "$f" ] && micro+=("$n")
done

# Whole programs: NAME=COMMAND (run by sh -c from $root); "[N threads]" in
# the name is how many CPUs the program can use.
if [ $quick = 1 ]; then
  n_sql=3000 n_perl=2 n_bash=3 n_cxx=100 pytests="test_list" gcc_src=bench/harness.c
else
  n_sql=40000 n_perl=20 n_bash=30 n_cxx=1500 pytests="test_dict test_list test_sort test_collections"
  gcc_src=src/pools/native/native.c
fi
programs=(
  "gcc -O2=gcc -O2 -std=gnu11 -D_GNU_SOURCE -Iinclude -Isrc -c $gcc_src -o $tmp/gcc.o"
  "python3 test suite=cd $tmp && /usr/bin/python3 -m test -q $pytests >/dev/null"
  "sqlite3=sqlite3 :memory: -cmd '.parameter set @n $n_sql' -cmd '.read bench/programs/sqlite.sql'"
  "perl=perl bench/programs/words.pl $n_perl"
  "c++ messages [2 threads]=$bin/bench_prog_cxx 2 $n_cxx"
  "bash=bash bench/programs/script.sh $n_bash"
)
# The synthetic whole-program workloads (bench/programs/*.c: each the
# pattern of a kind of program, on the process's malloc), at their default
# sizes; --quick: 10^5 operations per thread.
synthetic=(
  "tight|1|" "lifo|1|" "mixed|1|" "workset|2|--threads 2" "own|2|--threads 2"
  "server|2|--threads 2" "xmalloc 2+2|4|--threads 2"
)
for s in "${synthetic[@]}"; do
  IFS='|' read -r label th args <<<"$s"
  exe=$bin/bench_prog_${label%% *}
  [ -x "$exe" ] || continue
  [ "$th" -gt 1 ] && label="$label [$th threads]"
  programs+=("$label=$exe $args$([ $quick = 1 ] && echo ' --ops 100000')")
done
traces=("$root"/bench/traces/*.hmtrace.xz)

steps=$(( ${#micro[@]} + 3 * ${#peers[@]} + 1 + 1 + ${#traces[@]} + 1 + 1 ))

# --- 1. harness benchmarks ---
for n in "${micro[@]}"; do
  progress "$n"
  rc=0
  env "${gpu_env[@]}" "$bin/$n" "${harness_args[@]}" --csv "$tmp/$n.csv" >"$tmp/$n.out" 2>&1 || rc=$?
  if [ $rc -eq 77 ]; then
    echo "  $n: skipped: $(tail -n 1 "$tmp/$n.out")" >&2
  elif [ $rc -ne 0 ]; then
    failed+=("$n")
    tail -n 20 "$tmp/$n.out" >&2
  fi
  # bench_native and bench_numa call their libc baseline "malloc".
  printf '%s\tmalloc\tglibc\t0\n' "$tmp/$n.csv" >>"$manifest"
done
for n in "${with_peers[@]}"; do
  [ -x "$bin/$n" ] || continue
  for p in "${peers[@]}"; do
    progress "$n under $p"
    # The baseline's name: what the benchmark calls its libc malloc, or the
    # library it found serving malloc.
    base=malloc,glibc,libjemalloc,libmimalloc,libtcmalloc_minimal,libtcmalloc
    if LD_PRELOAD=${peer_lib[$p]} "$bin/$n" "${harness_args[@]}" --csv "$tmp/$n@$p.csv" \
         >"$tmp/$n@$p.out" 2>&1; then
      printf '%s\t%s\t%s\t1\n' "$tmp/$n@$p.csv" "$base" "$p" >>"$manifest"
    else
      failed+=("$n under $p")
      tail -n 20 "$tmp/$n@$p.out" >&2
    fi
  done
done
progress "bench_mpi (mpirun -np 2)"
if [ -x "$bin/bench_mpi" ] && command -v mpirun >/dev/null; then
  if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
     OMPI_MCA_btl_vader_single_copy_mechanism=none \
     mpirun -np 2 --oversubscribe "$bin/bench_mpi" "${harness_args[@]}" --csv "$tmp/bench_mpi.csv" \
       >"$tmp/bench_mpi.out" 2>&1; then
    printf '%s\t\t\t0\n' "$tmp/bench_mpi.csv" >>"$manifest"
  else
    failed+=(bench_mpi)
    tail -n 20 "$tmp/bench_mpi.out" >&2
  fi
fi

# --- 2. whole programs ---
exec_args=(--repeats 5 --warmup 1)
[ $quick = 1 ] && exec_args=(--repeats 1 --warmup 0)
progress "whole programs (${#programs[@]}) under $(( ${#alloc_args[@]} / 2 )) allocators"
cases=()
for p in "${programs[@]}"; do cases+=(--case "$p"); done
if ! "$bin/bench_exec" --quiet --suite programs "${exec_args[@]}" "${alloc_args[@]}" \
     "${cases[@]}" --csv "$tmp/programs.csv" >"$tmp/programs.out" 2>&1; then
  failed+=("whole programs")
  tail -n 30 "$tmp/programs.out" >&2
fi
printf '%s\t\t\t0\n' "$tmp/programs.csv" >>"$manifest"

# --- 3. traces: a checked replay each (pool and proxy), then timed replays ---
mkdir -p "$tmp/traces"
tcases=()
for t in "${traces[@]}"; do
  [ -e "$t" ] || continue
  name=$(basename "$t" .hmtrace.xz)
  progress "trace $name: checked replay"
  xz -dc "$t" >"$tmp/traces/$name.hmtrace" || { failed+=("trace $name: xz"); continue; }
  if ! LD_PRELOAD=$proxy "$bin/bench_replay" --backend all "$tmp/traces/$name.hmtrace" \
       >"$tmp/traces/$name.check" 2>&1; then
    failed+=("trace $name: replay not faithful")
    tail -n 5 "$tmp/traces/$name.check" >&2
    continue
  fi
  th=$(grep -m1 -o 'threads [0-9]*' "$tmp/traces/$name.check" | grep -o '[0-9]*$')
  label=$name
  [ "${th:-1}" -gt 1 ] && label="$name [$th threads]"
  tcases+=(--case "$label=$bin/bench_replay --backend malloc --no-check --metric $tmp/traces/$name.hmtrace")
done
progress "trace replays (${#traces[@]}) under every allocator"
texec=(--repeats 7 --warmup 1)
[ $quick = 1 ] && texec=(--repeats 1 --warmup 0)
if [ ${#tcases[@]} -gt 0 ]; then
  if ! "$bin/bench_exec" --quiet --suite traces "${texec[@]}" "${alloc_args[@]}" "${tcases[@]}" \
       --csv "$tmp/traces.csv" >"$tmp/traces.out" 2>&1; then
    failed+=("trace replays")
    tail -n 30 "$tmp/traces.out" >&2
  fi
  printf '%s\t\t\t0\n' "$tmp/traces.csv" >>"$manifest"
fi

# --- 4. results ---
progress "results and charts"
stamp=$(date -u +%Y-%m-%d)
host=$(hostname -s 2>/dev/null || hostname)
if [ $quick = 1 ]; then
  outdir=$build/bench-results
else
  outdir=$root/bench/results
fi
mkdir -p "$outdir"
out=$outdir/$stamp-$host.csv
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); mode: $([ $quick = 1 ] && echo quick || echo full)"
  echo "host: $host; $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1); $(nproc) CPUs online"
  echo "$(grep -m1 'address sizes' /proc/cpuinfo | sed 's/\t//g'); memory $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "kernel: $(uname -r); compiler: $(gcc -dumpfullversion 2>/dev/null); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "peers: $(dpkg-query -W -f='${Package} ${Version}; ' libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4 libmemkind0 2>/dev/null)"
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$tmp/facts"
python3 "$root/bench/report.py" --merge "$out" "$tmp/facts" "$manifest" || failed+=("merging the CSVs")
python3 "$root/bench/report.py" "$out" --charts "$outdir" |
  sed "s|chart: $outdir/|chart: $outdir/$stamp-$host-|" >"$tmp/summary" || failed+=("the report")
for png in "$outdir"/ratio-to-best-peer.png "$outdir"/time-*.png; do
  [ -e "$png" ] && mv "$png" "$outdir/$stamp-$host-$(basename "$png")"
done
cat "$tmp/summary"
echo
echo "results: $out ($((SECONDS - t_start)) s)"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'run.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "run.sh: every benchmark ran"
