#!/bin/bash
# SPDX-License-Identifier: MIT
# The hardware-dependent tests (CTest label `hardware`) of a Release build, in
# a QEMU guest that has what this machine lacks: several NUMA nodes (one with
# memory and no CPU), HMAT bandwidth/latency, a device DAX and an fsdax ext4
# file system mounted with -o dax. .ci/run runs it in CI mode after
# scripts/test.sh passed.
#
#   scripts/vm-test.sh [--ci] [--build DIR] [--keep]
#     --ci         a missing QEMU or kernel is a failure (also when CI is set
#                  and not "false"/"0"); elsewhere it is a skip (exit 77)
#     --build DIR  the build tree to test (default build-release; HM_VM_BUILD)
#     --keep       keep the run folder (console log, initramfs, NVDIMM images);
#                  the console is kept in any case, as <build>/vm-test.log
#
# Environment: HM_VM_TIMEOUT (seconds the guest may run, default 300),
# HM_VM_CACHE (default ~/.cache/hetmem/vm: the kernel, extracted once per
# Debian kernel package), HM_VM_CTEST_ARGS (the ctest arguments of the first
# run, default "-L hardware -j2"), HM_VM_KMEM=0 (leave out the second run, over
# the device DAX onlined as system RAM), HM_VM_TEST_ENV (more VAR=value for the
# tests in the guest, e.g. HM_LOG_LEVEL=debug).
#
# The guest (TCG: nested KVM does not work on these machines), 2 vCPUs:
#   node 0: CPU 0, 768 MiB        node 1: CPU 1, 512 MiB
#   node 2: no CPU, 256 MiB, initiator 0 (an HBM-like memory-only node)
#   node 3: no CPU, no RAM at boot: the proximity domain of two 512 MiB
#           file-backed NVDIMMs (label-size 128K); offline until the kmem
#           step gives it memory
#   HMAT access latency / bandwidth, initiator -> target:
#     0->0 10 ns 20G   0->1 20 ns 10G   0->2 15 ns 40G
#     1->0 20 ns 10G   1->1 10 ns 20G   1->2 25 ns 20G
#   This is issue 24's layout as given: QEMU 7.2 takes it unchanged (node 3
#   needs no initiator and no HMAT entries of its own).
#   The kernel runs without SWIOTLB (swiotlb=noforce: no device here needs
#   bounce buffers); its 64 MiB would come from the top of the memory below
#   4 GiB, node 2's, leaving that node 72% of its 256 MiB.
#   NVDIMM 0: device DAX /dev/dax0.0 (align 2 MiB); NVDIMM 1: fsdax
#   /dev/pmem1, ext4 mounted -o dax on /mnt/hm-dax.
# The guest mounts the host's root over 9p read-only, lays a tmpfs overlay on
# it (ctest writes Testing/ in the build tree; /tmp is a tmpfs), chroots into
# it and runs `ctest -L hardware` with HM_TEST_VM=1,
# HM_TEST_DEVDAX_PATH=/dev/dax0.0 (HM_TEST_DEVDAX_ALIGN=2097152) and
# HM_TEST_DAX_DIR=/mnt/hm-dax. Then
# `daxctl reconfigure-device --mode=system-ram dax0.0` onlines the device DAX
# as memory of node 3 and the NUMA test runs again over the four nodes.
# Prints one summary line per run, as scripts/test.sh does per build;
# exits 0 when all passed, 1 on a failure, 77 when skipped. Log: the guest's
# console with every test's output, <build>/vm-test.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

ci=0
case "${CI:-}" in "" | false | 0) ;; *) ci=1 ;; esac
build=${HM_VM_BUILD:-build-release}
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) ci=1 ;;
    --build) build=${2:?--build needs a folder}; shift ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--ci] [--build DIR] [--keep]" >&2; exit 2 ;;
  esac
  shift
done
timeout_s=${HM_VM_TIMEOUT:-300}
cache=${HM_VM_CACHE:-$HOME/.cache/hetmem/vm}
read -r -a ctest_args <<<"${HM_VM_CTEST_ARGS:--L hardware -j2}"
t0=$SECONDS

# A missing tool or kernel: a failure in CI, a skip elsewhere.
unavailable() {
  if [ $ci -eq 1 ]; then
    echo "vm-test: FAILED: $*" >&2
    exit 1
  fi
  echo "vm-test: skipped: $* (CI mode, --ci, makes this a failure)"
  exit 77
}

case "$build" in /*) ;; *) build=$root/$build ;; esac
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "vm-test: $build is not a configured build tree; build it first, e.g." >&2
  echo "  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release && cmake --build build-release" >&2
  exit 2
fi

# ---- tools: QEMU, busybox, ndctl/daxctl, mke2fs, depmod ------------------
need_tools() {
  command -v qemu-system-x86_64 && [ -x /bin/busybox ] && command -v ndctl &&
    command -v daxctl && [ -x /usr/sbin/mke2fs ] && command -v depmod && command -v cpio
} >/dev/null 2>&1
# deps.sh checks packages, not commands: a dynamic busybox (package busybox)
# would pass for busybox-static here and fail in the initramfs.
updated=0 # scripts/deps.sh ran `apt-get update`: the package lists are fresh
deps_out=$(bash scripts/deps.sh vm 2>&1)
deps_rc=$?
echo "$deps_out"
case "$deps_out" in *"deps: installing"*) updated=1 ;; esac
[ $deps_rc -eq 0 ] || unavailable "cannot install the guest's tools (scripts/deps.sh vm)"
need_tools || unavailable "QEMU, busybox, ndctl, daxctl, mke2fs, depmod or cpio still missing"

# ---- kernel: Debian's, extracted once into the cache ---------------------
# The current package name comes from the linux-image-amd64 metapackage; with
# no package lists (or no archive), the newest kernel already cached is used.
kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
pkg=$(kernel_pkg)
if [ -z "$pkg" ] && [ $updated -eq 0 ]; then
  apt-get update >/dev/null 2>&1
  pkg=$(kernel_pkg)
fi
kdir=
mkdir -p "$cache"
# The cache's lock: held exclusively to fetch (and to remove replaced
# kernels), shared while a guest runs from it.
exec 9>"$cache/lock"
flock 9
if [ -n "$pkg" ] && [ -f "$cache/$pkg/ready" ]; then
  kdir=$cache/$pkg
elif [ -n "$pkg" ]; then
  echo "vm-test: fetching $pkg into $cache"
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  chmod 755 "$tmp" # apt-get download drops privileges to _apt where it can
  if (cd "$tmp" && apt-get download "$pkg" >download.log 2>&1) &&
     dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/x"; then
    rm -rf "${cache:?}/$pkg"
    mkdir -p "$cache/$pkg"
    ver=$(basename "$(ls -d "$tmp"/x/lib/modules/*)")
    mv "$tmp/x/boot/vmlinuz-$ver" "$cache/$pkg/vmlinuz"
    mv "$tmp/x/lib" "$cache/$pkg/lib"
    if depmod -b "$cache/$pkg" "$ver"; then
      echo "$ver" >"$cache/$pkg/ready"
      kdir=$cache/$pkg
      for old in "$cache"/linux-image-*; do # kernels Debian has replaced
        [ "$old" = "$kdir" ] || rm -rf "$old"
      done
    fi
  else
    tail -n 3 "$tmp/download.log" 2>/dev/null
  fi
  rm -rf "$tmp"
fi
if [ -z "$kdir" ]; then
  newest=$(ls -d "$cache"/linux-image-*/ready 2>/dev/null | sort -V | tail -n 1)
  [ -n "$newest" ] || unavailable "cannot fetch Debian's kernel (linux-image-amd64's package)"
  kdir=$(dirname "$newest")
  echo "vm-test: cannot fetch ${pkg:-the current kernel}; using the cached $(basename "$kdir")"
fi
kver=$(cat "$kdir/ready")
flock -s 9

# ---- initramfs: busybox, modules, ndctl/daxctl/mke2fs with their libraries
run=$(mktemp -d /var/tmp/hm-vm.XXXXXX)
cleanup() { [ $keep -eq 1 ] && echo "vm-test: run folder kept: $run" || rm -rf "$run"; }
trap cleanup EXIT
ird=$run/initramfs
mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,host,ovl,newroot}
cp /bin/busybox "$ird/bin/busybox"
for a in $(/bin/busybox --list); do
  [ -e "$ird/bin/$a" ] || ln -s busybox "$ird/bin/$a"
done
copy_with_libs() { # a program and every shared library ldd lists for it
  local f lib
  for f in "$@"; do
    cp -L --parents "$f" "$ird"
    for lib in $(ldd "$f" | grep -oE '/[^ ]+'); do
      [ -e "$ird$lib" ] || cp -L --parents "$lib" "$ird"
    done
  done
}
copy_with_libs "$(command -v ndctl)" "$(command -v daxctl)" /usr/sbin/mke2fs
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$ird/etc/"
# Modules in load order (dependencies first), each once. -C /dev/null: the
# host's modprobe.d (ndctl's install rule) does not apply to the guest.
mods=(virtio_pci 9pnet_virtio 9p overlay libnvdimm nfit nd_btt nd_pmem nd_e820 dax_pmem
      device_dax kmem crc32c_generic ext4)
: >"$ird/modules"
for m in "${mods[@]}"; do
  modprobe -C /dev/null -d "$kdir" -S "$kver" --show-depends "$m" 2>/dev/null |
    awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' | while read -r ko; do
  rel=${ko#"$kdir"/}
  mkdir -p "$ird/$(dirname "$rel")"
  cp "$ko" "$ird/$rel"
  echo "/$rel" >>"$ird/modules"
done
[ -s "$ird/modules" ] || { echo "vm-test: no modules found in $kdir" >&2; exit 1; }

cat >"$ird/init" <<'INIT'
#!/bin/sh
# The guest of scripts/vm-test.sh: set up NVDIMMs, mount the host's root,
# run the hardware tests, power off. Lines starting HM_VM: are read by the
# host; so are the ctest lines between "HM_VM: begin" and "HM_VM: end".
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
ln -s /proc/self/fd /dev/fd
say() { echo "HM_VM: $*"; }
fail() { say "setup failed: $*"; poweroff -f; }
while read -r ko; do
  insmod "$ko" 2>/dev/null || say "insmod $ko failed"
done </modules
. /hm-vm.env
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /host ||
  fail "9p mount of the host's root"
mount -t tmpfs -o size=512m tmpfs /ovl && mkdir /ovl/upper /ovl/work &&
  mount -t overlay overlay -o lowerdir=/host,upperdir=/ovl/upper,workdir=/ovl/work /newroot ||
  fail "overlay over the host's root"
for d in proc sys dev; do mount --bind /$d /newroot/$d || fail "bind /$d"; done
# A checkout or build under the host's /tmp stays visible under the guest's
# tmpfs /tmp: its top folder is bound back in (through the overlay).
keep=
for d in "$HM_VM_ROOT" "$HM_VM_BUILD"; do
  case "$d" in /tmp/?*) t=${d#/tmp/}; keep="$keep ${t%%/*}" ;; esac
done
for t in $keep; do
  [ -d /keep/$t ] && continue
  mkdir -p /keep/$t && mount --bind /newroot/tmp/$t /keep/$t || fail "keep /tmp/$t"
done
mount -t tmpfs -o size=256m tmpfs /newroot/tmp || fail "tmpfs /tmp"
for t in $keep; do
  [ -d /newroot/tmp/$t ] && continue
  mkdir -p /newroot/tmp/$t && mount --bind /keep/$t /newroot/tmp/$t || fail "bind /tmp/$t"
done

# NVDIMMs: each a region with one raw namespace; labels make namespaces.
ndctl disable-region all >/dev/null 2>&1
ndctl init-labels -f all >/dev/null 2>&1 || fail "ndctl init-labels"
ndctl enable-region all >/dev/null 2>&1
ndctl create-namespace -f -r region0 -m devdax -a 2M >/dev/null || fail "devdax namespace"
ndctl create-namespace -f -r region1 -m fsdax >/dev/null || fail "fsdax namespace"
[ -c /dev/dax0.0 ] || fail "no /dev/dax0.0"
/usr/sbin/mke2fs -q -F -t ext4 -b 4096 /dev/pmem1 || fail "mke2fs /dev/pmem1"
mkdir -p /newroot/mnt/hm-dax && mount -o dax /dev/pmem1 /newroot/mnt/hm-dax || fail "mount -o dax"
chmod 1777 /newroot/mnt/hm-dax
say "nodes $(cat /sys/devices/system/node/online), memory $(cat /sys/devices/system/node/has_memory), cpus $(cat /sys/devices/system/node/has_cpu)"
for n in /sys/devices/system/node/node*; do
  a=$n/access0/initiators
  hmat=
  [ -r $a/read_latency ] && hmat=", best initiator $(ls $a | grep '^node' | tr '\n' ' ')at $(cat $a/read_latency) ns, $(cat $a/read_bandwidth) MB/s"
  say "$(basename $n): cpus [$(cat $n/cpulist)], $(grep MemTotal $n/meminfo | sed 's/.*MemTotal: *//')$hmat"
done

tests() { # $1: name of the run; then ctest arguments
  name=$1; shift
  say "begin $name"
  t=$(date +%s)
  chroot /newroot /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    HOME=/tmp TMPDIR=/tmp HM_TEST_VM=1 HM_TEST_DEVDAX_PATH=/dev/dax0.0 HM_TEST_DEVDAX_ALIGN=2097152 \
    HM_TEST_DAX_DIR=/mnt/hm-dax $HM_VM_TEST_ENV \
    ctest --test-dir "$HM_VM_BUILD" --output-on-failure "$@" 2>&1
  rc=$?
  say "end $name rc=$rc s=$(($(date +%s) - t))"
  # Every test's whole output, for the host's log (not shown live).
  sed "s/^/HM_LOG $name| /" "/newroot$HM_VM_BUILD/Testing/Temporary/LastTest.log" 2>/dev/null
}
tests vm $HM_VM_CTEST_ARGS

# The device DAX as system RAM: node 3 gets memory (a CXL-like slow tier).
if [ "$HM_VM_KMEM" = 0 ]; then
  say "kmem: left out (HM_VM_KMEM=0)"
elif daxctl reconfigure-device --mode=system-ram dax0.0 >/dev/null 2>&1 ||
   daxctl reconfigure-device --mode=system-ram --force dax0.0 >/dev/null 2>&1; then
  say "kmem: nodes with memory $(cat /sys/devices/system/node/has_memory)"
  tests vm-kmem -L numa
else
  say "kmem: daxctl reconfigure-device --mode=system-ram dax0.0 failed"
fi
say "done"
poweroff -f
INIT
chmod 755 "$ird/init"
{
  printf 'HM_VM_BUILD=%q\n' "$build"
  printf 'HM_VM_ROOT=%q\n' "$root"
  printf 'HM_VM_CTEST_ARGS=%q\n' "${ctest_args[*]}"
  printf 'HM_VM_TEST_ENV=%q\n' "${HM_VM_TEST_ENV:-}"
  printf 'HM_VM_KMEM=%q\n' "${HM_VM_KMEM:-1}"
} >"$ird/hm-vm.env"
(cd "$ird" && find . | cpio -o -H newc --quiet) >"$run/initramfs.cpio" ||
  { echo "vm-test: building the initramfs failed" >&2; exit 1; }

# ---- the guest -----------------------------------------------------------
truncate -s 512M "$run/nvdimm0" "$run/nvdimm1"
hmat=()
lb() { # initiator target latency-ns bandwidth
  hmat+=(-numa "hmat-lb,initiator=$1,target=$2,hierarchy=memory,data-type=access-latency,latency=$3"
         -numa "hmat-lb,initiator=$1,target=$2,hierarchy=memory,data-type=access-bandwidth,bandwidth=$4")
}
lb 0 0 10 20G; lb 0 1 20 10G; lb 0 2 15 40G
lb 1 0 20 10G; lb 1 1 10 20G; lb 1 2 25 20G
qemu=(qemu-system-x86_64 -machine pc,nvdimm=on,hmat=on -accel tcg,thread=multi -cpu max
  -smp 2,sockets=2,cores=1,threads=1 -m 1536M,slots=4,maxmem=8G
  -object memory-backend-ram,id=ram0,size=768M
  -object memory-backend-ram,id=ram1,size=512M
  -object memory-backend-ram,id=ram2,size=256M
  -numa node,nodeid=0,memdev=ram0 -numa node,nodeid=1,memdev=ram1
  -numa node,nodeid=2,memdev=ram2,initiator=0 -numa node,nodeid=3
  -numa cpu,node-id=0,socket-id=0 -numa cpu,node-id=1,socket-id=1
  "${hmat[@]}"
  -object "memory-backend-file,id=nv0,share=on,mem-path=$run/nvdimm0,size=512M,align=2M"
  -device nvdimm,id=nvdimm0,memdev=nv0,label-size=128K,node=3
  -object "memory-backend-file,id=nv1,share=on,mem-path=$run/nvdimm1,size=512M,align=2M"
  -device nvdimm,id=nvdimm1,memdev=nv1,label-size=128K,node=3
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
  -kernel "$kdir/vmlinuz" -initrd "$run/initramfs.cpio"
  -append "console=ttyS0 loglevel=3 panic=-1 rdinit=/init mitigations=off swiotlb=noforce"
  -nic none -display none -monitor none -serial stdio -no-reboot)
log=$run/console.log
echo "vm-test: booting $(basename "$kdir") (QEMU, TCG, 2 vCPUs, 4 NUMA nodes, 2 NVDIMMs; log $log)"
timeout -k 10 "$timeout_s" "${qemu[@]}" </dev/null 2>&1 | sed -u 's/\r$//' | tee "$log" |
  grep --line-buffered -vE '^(\[ *[0-9]+\.[0-9]+\]|HM_LOG )'
qrc=${PIPESTATUS[0]}
# The console, with each test's whole output (HM_LOG lines), kept in the
# build tree as scripts/test.sh keeps its logs.
cp "$log" "$build/vm-test.log" 2>/dev/null || true
[ "$qrc" -eq 124 ] && echo "vm-test: the guest ran past ${timeout_s}s and was stopped"

# ---- the verdict, from the console (QEMU's status means nothing) ----------
status=0
declare -a lines
summarize() { # $1: run name
  local name=$1 part total passed skipped failed rc secs
  part=$(awk -v n="$name" '$0 == "HM_VM: begin " n { on = 1; next }
                           index($0, "HM_VM: end " n " rc=") == 1 { print; on = 0 }
                           on' "$log")
  rc=$(printf '%s\n' "$part" | sed -n "s/^HM_VM: end $name rc=\([0-9]*\).*/\1/p")
  secs=$(printf '%s\n' "$part" | sed -n "s/^HM_VM: end $name rc=[0-9]* s=//p")
  if [ -z "$rc" ]; then
    lines+=("$(printf '  %-8s %s' "$name" "not run -- FAILED")")
    status=1
    return
  fi
  total=$(printf '%s\n' "$part" | grep -oE 'tests? failed out of [0-9]+' | grep -oE '[0-9]+$' | tail -n 1)
  passed=$(printf '%s\n' "$part" | grep -cE 'Test +#[0-9]+: .* Passed +[0-9.]+ sec')
  skipped=$(printf '%s\n' "$part" | grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped')
  total=${total:-0}
  failed=$((total - passed - skipped))
  line=$(printf '  %-8s %s' "$name" "$total tests: $passed passed, $skipped skipped, $failed failed (${secs:-?}s)")
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$total" -eq 0 ]; then
    line+=" -- FAILED"
    status=1
  fi
  lines+=("$line")
}
if grep -q '^HM_VM: setup failed' "$log"; then
  grep '^HM_VM: setup failed' "$log"
  status=1
fi
summarize vm
[ "${HM_VM_KMEM:-1}" = 0 ] || summarize vm-kmem
if ! grep -q '^HM_VM: done' "$log"; then
  echo "vm-test: the guest did not finish; the end of its console:"
  grep -v '^HM_LOG ' "$log" | tail -n 15 | sed 's/^/  | /'
  status=1
fi
echo
echo "== vm summary ($((SECONDS - t0))s, log $build/vm-test.log)"
for l in "${lines[@]}"; do echo "$l"; done
if [ $status -eq 0 ]; then echo "vm-test: all passed"; else echo "vm-test: FAILED"; fi
exit $status
