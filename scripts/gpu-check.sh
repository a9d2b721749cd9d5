#!/bin/bash
# SPDX-License-Identifier: MIT
# The CUDA provider on a machine with an NVIDIA GPU and its real driver, in
# two steps, because a lent GPU machine has no network, none of hetmem's
# build dependencies and little time:
#
#   scripts/gpu-check.sh --prepare [DIR]
#       here (with a compiler and network): builds hetmem (Release,
#       build-gpu/) with $ORIGIN-relative rpaths and puts into DIR (default
#       gpu-check/ in the repository root) what the check runs: bin/ (the
#       driver probe cuda_probe, test_cuda_provider, test_cuda_scenarios,
#       bench_cuda, cuda_ipc, cuda_stream),
#       lib/ (libhetmem.so.0 and every shared library it and they need that a
#       bare machine may lack: all but glibc, libgcc_s and libstdc++; hwloc's
#       PCI plugin in lib/hwloc/), testdriver/libcuda.so.1 (the project's
#       CUDA test driver, to prove DIR here), the probe's expected answers,
#       this script, and MANIFEST. DIR stays under 64 MiB.
#
#   scripts/gpu-check.sh --run [DIR] [--out DIR2] [--test-driver]
#   DIR/gpu-check.sh --run [DIR]
#       on the GPU machine: needs nothing but DIR, bash and coreutils. Runs
#       each step under `timeout` (limits below, 4 minutes in all): the
#       bundle's libraries; the driver probe (test/gpu_check/cuda_probe.c)
#       and its answers against test/gpu_check/nvidia_expected.csv; the
#       provider and pool suites on the GPU (test_cuda_provider hardware);
#       the provider and pool suites in VMM mode too where the driver has
#       the virtual memory API; the two-process IPC example; a short
#       benchmark (with its VMM cases); nvidia-smi's facts.
#       Logs and CSVs (gpu-check.csv: step,status,seconds,detail; probe.csv;
#       bench_cuda.csv) go to $OUT when it is set, else to --out DIR2, else
#       to DIR/results. A summary table comes last, also when a step timed
#       out or crashed: steps, then the benchmark (pool alloc/free against
#       cuMemAlloc and cuMemAllocAsync, IPC open hit/miss against
#       cuIpcOpenMemHandle; VMM-mode alloc/free against a legacy provider
#       and cuMemAlloc, VMM IPC open hit/miss against a legacy export,
#       cuIpcOpenMemHandle, the driver's VMM import and its import of a
#       memory pool's allocation, cuMemPoolImportPointer; ratios < 1: hetmem
#       is faster).
#       The machine's libcuda.so.1 by default. With HM_CUDA_DRIVER set (or
#       --test-driver, which sets it to DIR/testdriver/libcuda.so.1) it runs
#       against that driver instead: then the suites run as CTest runs them
#       on the test driver (test_cuda_provider provider, pools, ipc, vmm,
#       vmm_ipc, vmm_split: the VMM parts read the test driver's counters,
#       so on a GPU they give way to the hardware part's VMM suites), and the
#       probe's differences from NVIDIA's answers fail the check (on a real
#       GPU they are findings about nvidia_expected.csv: reported, not
#       failed).
#       Exit: 0 when every step passed; 77 when there is no NVIDIA GPU or no
#       driver; 1 otherwise.
#
# Proven here against the test driver in a Debian minbase chroot without
# hetmem's build dependencies (no hwloc, liburcu, libpciaccess, compiler),
# with only DIR bound in (the chroot in ../gpucheck-root, beside the checkout):
#   apt-get install -y debootstrap      # when missing
#   debootstrap --variant=minbase bookworm ../gpucheck-root http://deb.debian.org/debian
#   scripts/gpu-check.sh --prepare /tmp/gpu-check
#   mkdir -p ../gpucheck-root/gpu-check
#   r=$(realpath ../gpucheck-root) unshare --mount --fork sh -c '
#     mount --bind /tmp/gpu-check $r/gpu-check && mount -t proc proc $r/proc &&
#     mount -t tmpfs tmpfs $r/dev/shm && mount -t tmpfs tmpfs $r/tmp &&
#     exec chroot $r env -i PATH=/usr/bin:/bin HOME=/tmp \
#       /gpu-check/gpu-check.sh --run /gpu-check --test-driver'
set -uo pipefail

self=$(readlink -f "$0")
usage() {
  sed -n '/^#   scripts\/gpu-check.sh --prepare/,/^#   DIR\/gpu-check.sh/p' "$self" | sed 's/^#//' >&2
  exit 2
}

# ---------------------------------------------------------------- --prepare

# Libraries every machine that runs these programs has: glibc, libgcc_s,
# libstdc++ (and the kernel's vDSO). Anything else is bundled.
is_system_lib() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | \
    librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libmvec.so.* | libBrokenLocale.so.* | \
    libnss_*.so.* | libthread_db.so.* | libgcc_s.so.* | libstdc++.so.*) return 0 ;;
  esac
  return 1
}

# Copies into $1 (lib/) every library that the files after it need and that
# is not already there nor a system library, until nothing more is missing.
bundle_libs() {
  local lib=$1 f name path new
  shift
  while :; do
    new=0
    for f in "$@" "$lib"/*.so.* "$lib"/hwloc/*.so; do
      [ -f "$f" ] || continue
      while read -r name path; do
        is_system_lib "$name" && continue
        [ "$name" = libcuda.so.1 ] && continue # never bundled: the machine's own
        [ -e "$lib/$name" ] && continue
        if [ ! -f "$path" ]; then
          echo "gpu-check: $f needs $name, which is not found here" >&2
          return 1
        fi
        cp -L "$path" "$lib/$name" && chmod 644 "$lib/$name" && new=1
      done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" { print $1, ($3 == "not" ? "-" : $3) }')
    done
    [ "$new" = 0 ] && return 0
  done
}

prepare() {
  local out=$1 repo dir=build-gpu jobs f
  repo=$(cd "$(dirname "$self")/.." && pwd)
  [ -f "$repo/CMakeLists.txt" ] && [ -d "$repo/test/gpu_check" ] ||
    { echo "gpu-check: --prepare runs from the repository's scripts/" >&2; return 1; }
  cd "$repo" || return 1
  mkdir -p "$out" && out=$(cd "$out" && pwd) || return 1
  if [ -n "$(ls -A "$out")" ] && [ ! -f "$out/MANIFEST" ]; then
    echo "gpu-check: $out is not empty and not a gpu-check folder: not touching it" >&2
    return 1
  fi
  rm -rf "${out:?}"/bin "${out:?}"/lib "${out:?}"/testdriver "${out:?}"/results \
    "${out:?}"/MANIFEST "${out:?}"/gpu-check.sh "${out:?}"/nvidia_expected.csv

  jobs=$(nproc 2>/dev/null || echo 2)
  [ "$jobs" -gt 16 ] && jobs=16
  if [ "$(id -u)" = 0 ]; then bash scripts/deps.sh demo >/dev/null || return 1; fi
  echo "gpu-check: building (Release, $dir/; log $dir/gpu-check-build.log)"
  mkdir -p "$dir"
  # DT_RPATH (--disable-new-dtags), not DT_RUNPATH: the loader searches an
  # executable's RPATH for the dependencies of its libraries too (hwloc's
  # libudev, the PCI plugin's libpciaccess), RUNPATH only for its own.
  if ! { cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DHM_WITH_CUDA=ON \
           -DHM_BUILD_TESTS=ON -DHM_BUILD_BENCHMARKS=ON -DHM_BUILD_EXAMPLES=ON \
           -DHM_WITH_LEVEL_ZERO=OFF -DHM_WITH_JEMALLOC=OFF -DHM_SANITIZE= \
           -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
           -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
           -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags &&
         cmake --build "$dir" -j "$jobs" --target hetmem test_cuda_provider test_cuda_scenarios bench_cuda cuda_ipc cuda_stream \
           cuda_probe cuda_test; } >"$dir/gpu-check-build.log" 2>&1; then
    tail -n 40 "$dir/gpu-check-build.log"
    echo "gpu-check: the build failed (log: $dir/gpu-check-build.log)" >&2
    return 1
  fi

  mkdir -p "$out/bin" "$out/lib/hwloc" "$out/testdriver"
  cp "$dir/test/cuda/test_cuda_provider" "$dir/test/cuda/test_cuda_scenarios" \
     "$dir/bench/bench_cuda" "$dir/examples/cuda_ipc" "$dir/examples/cuda_stream" \
     "$dir/test/gpu_check/cuda_probe" "$out/bin/" || return 1
  cp -L "$dir/src/libhetmem.so.0" "$out/lib/" || return 1
  cp -L "$dir/test/cuda/driver/libcuda.so.1" "$out/testdriver/" || return 1
  cp test/gpu_check/nvidia_expected.csv "$out/"
  cp "$self" "$out/gpu-check.sh" && chmod 755 "$out/gpu-check.sh"
  # hwloc's PCI plugin, where installed: GPU locality in memspaces needs PCI
  # objects (found through HWLOC_PLUGINS_PATH, which --run sets).
  local plugdir
  plugdir=$(pkg-config --variable=libdir hwloc 2>/dev/null)/hwloc
  [ -f "$plugdir/hwloc_pci.so" ] && cp -L "$plugdir/hwloc_pci.so" "$out/lib/hwloc/"
  bundle_libs "$out/lib" "$out"/bin/* || return 1

  # Every program and library resolves all it needs, from lib/ or the system.
  local bad=0
  for f in "$out"/bin/* "$out"/lib/*.so.* "$out"/lib/hwloc/*.so; do
    [ -f "$f" ] || continue
    if ldd "$f" 2>&1 | grep -q "not found"; then
      echo "gpu-check: $f: a library is not found:" >&2
      ldd "$f" | grep "not found" >&2
      bad=1
    fi
  done
  [ "$bad" = 0 ] || return 1

  {
    echo "hetmem gpu-check folder, made by scripts/gpu-check.sh --prepare"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(ldd --version 2>/dev/null | head -n1)"
    echo "run: DIR/gpu-check.sh --run DIR   (DIR/gpu-check.sh --run DIR --test-driver: without a GPU)"
    echo "files:"
    (cd "$out" && find . -type f ! -name MANIFEST | sort | while read -r f; do
       printf '  %-36s %8s bytes\n' "${f#./}" "$(stat -c %s "$f")"; done)
  } >"$out/MANIFEST"
  local kib
  kib=$(du -sk "$out" | cut -f1)
  local libs=()
  for f in "$out"/lib/*.so.* "$out"/lib/hwloc/*.so; do [ -f "$f" ] && libs+=("${f#"$out"/lib/}"); done
  echo "gpu-check: $out ready ($kib KiB; bundled: ${libs[*]})"
  if [ "$kib" -gt $((64 * 1024)) ]; then
    echo "gpu-check: $out is over 64 MiB" >&2
    return 1
  fi
  echo "gpu-check: on the GPU machine: $out/gpu-check.sh --run $out"
}

# -------------------------------------------------------------------- --run

# Per-step limits (seconds), 280 in all on a GPU and 350 on the test
# driver; they only catch hangs: on the test driver the whole check takes
# under a minute. The probe starts seven processes, each with its own
# cuInit (seconds each on a GPU without persistence mode), and stops a
# scenario's child after 15 s.
T_LIBS=10 T_PROBE=50 T_EXPECT=5 T_HARDWARE=120 T_PROVIDER=30 T_POOLS=40 T_IPC=30 T_EXAMPLE=20
T_BENCH=45 T_SMI=10 T_VMM=20

steps=() status=0 nogpu=0 out='' dir=''
declare -A st_status st_seconds st_detail

csvq() { local s=${1//\"/\'}; printf '"%s"' "$s"; }

record() { # name status seconds detail
  st_status[$1]=$2 st_seconds[$1]=$3 st_detail[$1]=$4
  printf '%s,%s,%s,%s\n' "$1" "$2" "$3" "$(csvq "$4")" >>"$out/gpu-check.csv"
}

# step NAME LIMIT [--nofail] COMMAND...: runs it under timeout with its log in
# $out/NAME.log; returns its exit code. --nofail: a failure is reported
# ("differs") without failing the check.
step() {
  local name=$1 limit=$2 nofail=0 rc t0 t1 secs detail
  shift 2
  if [ "${1:-}" = --nofail ]; then nofail=1; shift; fi
  steps+=("$name")
  echo "gpu-check: $name (limit ${limit} s)"
  t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1 </dev/null
  rc=$?
  t1=$(date +%s%N)
  secs=$(( (t1 - t0) / 1000000 ))
  secs=$(printf '%d.%03d' $((secs / 1000)) $((secs % 1000)))
  case $rc in
    0) record "$name" passed "$secs" "" ;;
    77) record "$name" skipped "$secs" "$(grep -m1 -i skip "$out/$name.log" | cut -c1-100)" ;;
    124 | 137) record "$name" TIMEOUT "$secs" "killed after $limit s; log $name.log"; status=1 ;;
    *)
      if [ "$rc" -gt 128 ]; then detail="crashed: signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null))"
      else detail="exit $rc"; fi
      if [ "$nofail" = 1 ]; then
        record "$name" differs "$secs" "$detail; log $name.log"
      else
        record "$name" FAILED "$secs" "$detail; log $name.log"
        status=1
      fi ;;
  esac
  return $rc
}

not_run() { steps+=("$1"); record "$1" "not run" 0 "$2"; }

summary() {
  echo
  echo "== gpu-check summary ($SECONDS s; results in $out) =="
  local k
  printf '  %-18s %-8s %9s  %s\n' step status seconds detail
  for k in "${steps[@]}"; do
    printf '  %-18s %-8s %9s  %s\n' "$k" "${st_status[$k]}" "${st_seconds[$k]}" "${st_detail[$k]}"
  done
  if [ -s "$out/probe-expected.log" ]; then
    echo
    echo "  driver probe: behaviour, against NVIDIA's answers, observed, expected"
    sed 's/^/  /' "$out/probe-expected.log"
  elif [ -s "$out/probe.csv" ]; then
    echo
    echo "  driver probe: behaviour, observed"
    awk -F, 'NR > 1 { printf "    %-26s %s\n", $1, $2 }' "$out/probe.csv"
  fi
  if [ -s "$out/bench_cuda.csv" ]; then
    echo
    printf '  %-24s %-16s %14s %12s\n' "case" "implementation" "median ns/op" "hetmem/impl"
    # suite,case,impl,role,status,ops,iters,repeats,median,min,max,cpus,ratio,run_cpus
    awk -F, 'NR > 1 { gsub(/"/, "", $2); gsub(/"/, "", $3);
                      if ($5 != "ok") { printf "  %-24s %-16s %14s %12s\n", $2, $3, $5, "-"; next }
                      printf "  %-24s %-16s %14.1f %12s\n", $2, $3, $9, ($13 == "" ? "-" : $13 "x") }' \
      "$out/bench_cuda.csv"
    grep -h "driver calls per provider op" "$out/benchmark.log" | sed 's/^/  /'
    grep -h "effective CPUs of the run" "$out/benchmark.log" | sed 's/^/  /'
  fi
  if [ "$nogpu" = 1 ]; then echo "gpu-check: no NVIDIA GPU with a driver here (skipped)"
  elif [ "$status" -eq 0 ]; then echo "gpu-check: passed"
  else echo "gpu-check: FAILED"; fi
}

facts() { # what the check ran on, and where each program finds its libraries
  echo "kernel: $(uname -srm); CPUs: $(nproc)"
  echo "HM_CUDA_DRIVER=${HM_CUDA_DRIVER:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "libcuda.so.1 in the loader cache:"
  { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep 'libcuda\.so\.1' || echo "  none"
  local f bad=0
  for f in "$dir"/bin/*; do
    echo "== $f"
    if command -v ldd >/dev/null 2>&1; then
      ldd "$f" 2>&1
      ldd "$f" 2>&1 | grep -q "not found" && bad=1
    else
      # no ldd: the loader itself lists what it maps
      LD_TRACE_LOADED_OBJECTS=1 "$f" 2>&1
      LD_TRACE_LOADED_OBJECTS=1 "$f" 2>&1 | grep -q "not found" && bad=1
    fi
  done
  return $bad
}

run_check() {
  local test_driver=$1 hw=0 rc
  if [ "$test_driver" = 1 ]; then
    export HM_CUDA_DRIVER=$dir/testdriver/libcuda.so.1
    export LD_LIBRARY_PATH=$dir/testdriver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  if [ -z "${HM_CUDA_DRIVER:-}" ]; then
    hw=1
    unset HM_CUDA_DRIVER # set but empty is a test driver to the suites
  fi
  # Whatever carried the folder here may have dropped the executable bits.
  chmod u+x "$dir"/bin/* 2>/dev/null
  export HWLOC_PLUGINS_PATH=$dir/lib/hwloc
  echo "step,status,seconds,detail" >"$out/gpu-check.csv"
  trap 'echo "gpu-check: interrupted" >&2; status=1; summary; exit 1' INT TERM

  step libraries "$T_LIBS" bash "$self" --facts "$dir"
  step probe "$T_PROBE" "$dir/bin/cuda_probe" --csv "$out/probe.csv"
  rc=$?
  if [ "$rc" = 77 ]; then
    nogpu=1
    for s in probe-expected suites ipc-example benchmark; do not_run "$s" "no GPU or driver"; done
  else
    if [ -s "$out/probe.csv" ]; then
      if [ "$hw" = 1 ]; then # the hardware's answers are the facts: differences are findings
        step probe-expected "$T_EXPECT" --nofail "$dir/bin/cuda_probe" \
          --compare "$out/probe.csv" --expect "$dir/nvidia_expected.csv"
      else
        step probe-expected "$T_EXPECT" "$dir/bin/cuda_probe" \
          --compare "$out/probe.csv" --expect "$dir/nvidia_expected.csv"
      fi
    else
      not_run probe-expected "no probe.csv"
    fi
    if [ "$hw" = 1 ]; then
      step hardware-suites "$T_HARDWARE" "$dir/bin/test_cuda_provider" hardware
      [ $? = 77 ] && nogpu=1
    else # as CTest runs them on the test driver (test/cuda/CMakeLists.txt): two devices
      HM_CUDA_TEST_DEVICES=2 step suites-provider "$T_PROVIDER" "$dir/bin/test_cuda_provider" provider
      HM_CUDA_TEST_DEVICES=2 step suites-pools "$T_POOLS" "$dir/bin/test_cuda_provider" pools
      HM_CUDA_TEST_DEVICES=2 step suites-ipc "$T_IPC" "$dir/bin/test_cuda_provider" ipc
      HM_CUDA_TEST_DEVICES=2 step suites-vmm "$T_VMM" "$dir/bin/test_cuda_provider" vmm
      HM_CUDA_TEST_DEVICES=2 step suites-vmm-ipc "$T_VMM" "$dir/bin/test_cuda_provider" vmm_ipc
      HM_CUDA_TEST_DEVICES=2 step suites-vmm-split "$T_VMM" "$dir/bin/test_cuda_provider" vmm_split
      step scenarios "$T_IPC" "$dir/bin/test_cuda_scenarios" all
    fi
    step ipc-example "$T_EXAMPLE" "$dir/bin/cuda_ipc"
    step stream-example "$T_EXAMPLE" "$dir/bin/cuda_stream"
    step benchmark "$T_BENCH" "$dir/bin/bench_cuda" --repeats 5 --min-time 0.05 \
      --csv "$out/bench_cuda.csv"
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then
    step nvidia-smi "$T_SMI" sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,pci.bus_id,persistence_mode,mig.mode.current --format=csv && nvidia-smi topo -m; nvidia-smi -q'
    [ -s "$out/nvidia-smi.log" ] && sed -n '1,2p' "$out/nvidia-smi.log" | sed 's/^/gpu-check: /'
  else
    not_run nvidia-smi "no nvidia-smi here"
  fi
  trap - INT TERM
  summary
  if [ "$nogpu" = 1 ] && [ "$status" = 0 ]; then return 77; fi
  return $status
}

# ------------------------------------------------------------------- main

mode=${1:-}
shift || true
case "$mode" in
  --prepare)
    [ $# -le 1 ] || usage
    default=$(cd "$(dirname "$self")/.." && pwd)/gpu-check
    SECONDS=0
    prepare "${1:-$default}" || exit 1
    echo "gpu-check: prepared in $SECONDS s" ;;
  --run)
    test_driver=0 given_out=
    while [ $# -gt 0 ]; do
      case "$1" in
        --out) [ $# -ge 2 ] || usage; given_out=$2; shift 2 ;;
        --test-driver) test_driver=1; shift ;;
        -*) usage ;;
        *) [ -z "$dir" ] || usage; dir=$1; shift ;;
      esac
    done
    if [ -z "$dir" ]; then # DIR/gpu-check.sh --run: its own folder
      if [ -f "$(dirname "$self")/bin/cuda_probe" ]; then dir=$(dirname "$self")
      else dir=$(cd "$(dirname "$self")/.." && pwd)/gpu-check; fi
    fi
    dir=$(cd "$dir" 2>/dev/null && pwd) || { echo "gpu-check: no folder $dir" >&2; exit 1; }
    [ -f "$dir/bin/cuda_probe" ] ||
      { echo "gpu-check: $dir is not a prepared folder (scripts/gpu-check.sh --prepare)" >&2; exit 1; }
    if [ -n "${OUT:-}" ]; then out=$OUT
    elif [ -n "$given_out" ]; then out=$given_out
    else out=$dir/results; fi
    mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
    SECONDS=0
    run_check "$test_driver"
    exit $? ;;
  --facts) # internal: the "libraries" step, a separate process under timeout
    dir=$1
    facts ;;
  *) usage ;;
esac
