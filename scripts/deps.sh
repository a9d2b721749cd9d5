#!/bin/bash
# SPDX-License-Identifier: MIT
# Install the Debian packages hetmem needs, only those missing: one
# `apt-get update`, then one `apt-get install -y`. Nothing happens when all
# are present. Debian 12 (bookworm) or later; run as root (or with sudo).
#
#   scripts/deps.sh [demo|test|bench|vm]   (default: test)
#     demo: what building the library and the examples needs
#     test: that, plus what the test suite and the optional parts use
#     bench: that, plus what bench/run.sh runs and draws with
#     vm:   what scripts/vm-test.sh adds to boot its guest (QEMU, busybox,
#           ndctl/daxctl, e2fsprogs; the kernel it fetches itself)
set -euo pipefail

profile=${1:-test}

# Building the library (C and C++ are both enabled: a C++ test includes every
# public header): compilers, libc headers, make, cmake, pkg-config, hwloc for
# NUMA topology, liburcu (urcu-bp, cds) for the tracker, the Level Zero headers
# and loader (libze-dev, with libze1) for the Level Zero provider, which opens
# the loader at run time (no GPU is needed to build or run it).
build=(cmake make gcc g++ libc6-dev pkg-config libhwloc-dev liburcu-dev libze-dev)
# Tests and optional parts: valgrind (leak checks of error paths), clang
# (a second compiler for the header test), jemalloc (HM_WITH_JEMALLOC pool),
# and util-linux for setarch (TSan on kernels with high mmap entropy); Open
# MPI for the MPI companion (libhetmem_mpi) and its tests under mpirun.
# python3 and git are real programs run under the malloc-replacement
# library; libclang-rt-14-dev gives clang's libFuzzer runtime (IPC decoder
# fuzz test); strace checks that IPC makes no prctl call unasked; the
# allocators compared in bench/ come as their Debian packages.
extra=(valgrind clang libclang-rt-14-dev libjemalloc-dev util-linux binutils strace
       libopenmpi-dev openmpi-bin
       python3 git libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4 debian-archive-keyring)

# bench/run.sh: the programs it times and whose traces it replays (sqlite3,
# perl, Debian's python3 test suite, xz for the traces), memkind (the
# NUMA-bound baseline, opened at run time) and gnuplot for the charts.
pyver=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null ||
        echo 3.11)
benchonly=(sqlite3 perl xz-utils "libpython$pyver-testsuite" libmemkind0 gnuplot-nox)

# The guest of scripts/vm-test.sh (emulated NUMA nodes and NVDIMMs): QEMU,
# a static busybox for its initramfs, ndctl and daxctl to set up the NVDIMM
# namespaces, e2fsprogs for the ext4 DAX file system, kmod for depmod, cpio
# for the initramfs.
vm=(qemu-system-x86 busybox-static ndctl daxctl e2fsprogs kmod cpio)

case "$profile" in
  demo) wanted=("${build[@]}") ;;
  test) wanted=("${build[@]}" "${extra[@]}") ;;
  bench) wanted=("${build[@]}" "${extra[@]}" "${benchonly[@]}") ;;
  vm) wanted=("${vm[@]}") ;;
  *) echo "usage: $0 [demo|test|bench|vm]" >&2; exit 2 ;;
esac

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for p in "${wanted[@]}"; do
  installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#wanted[@]} packages present"
  exit 0
fi

echo "deps: installing ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "deps: not root and no sudo: install these packages: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"

for p in "${missing[@]}"; do
  if ! installed "$p"; then
    echo "deps: $p is still not installed" >&2
    exit 1
  fi
done
echo "deps: done"
