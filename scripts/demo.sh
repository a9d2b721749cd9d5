#!/bin/bash
# SPDX-License-Identifier: MIT
# The README's demo command: install what is missing, build the library and
# the examples (Release, in build-demo/), run examples/basic (a NUMA-bound
# pool), then the IPC demo: examples/ipc_producer allocates and exports
# handles, examples/ipc_consumer (a separate process, started on its own)
# opens them and writes, and the producer verifies what came back; then the
# GPU part (examples/cuda_ipc, examples/level_zero_ipc) on whichever GPU
# driver finds a device, or a line saying there is none.
# Exit code: 0 only if every check of every demo passed.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh demo

jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p build-demo
log=build-demo/build.log
echo "demo: building (Release, build-demo/; log in $log)"
if ! { cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release \
         -DHM_BUILD_TESTS=OFF -DHM_BUILD_BENCHMARKS=OFF -DHM_BUILD_EXAMPLES=ON \
         -DHM_WITH_LEVEL_ZERO=ON -DHM_WITH_CUDA=ON &&
       cmake --build build-demo --target basic ipc_producer ipc_consumer level_zero_ipc cuda_ipc \
         -j "$jobs"; } \
       >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "demo: the build failed (full log: $log)" >&2
  exit 1
fi
echo "== examples/basic =="
./build-demo/examples/basic

echo
echo "== examples/ipc_producer + examples/ipc_consumer (two processes) =="
sock=$(mktemp -u "${TMPDIR:-/tmp}/hm-demo-XXXXXX.sock")
./build-demo/examples/ipc_producer "$sock" &
producer=$!
consumer_rc=0
./build-demo/examples/ipc_consumer "$sock" || consumer_rc=$?
producer_rc=0
wait "$producer" || producer_rc=$?
rm -f "$sock"
if [ "$consumer_rc" -ne 0 ] || [ "$producer_rc" -ne 0 ]; then
  echo "demo: IPC demo failed (producer $producer_rc, consumer $consumer_rc)" >&2
  exit 1
fi
echo
echo "== GPU memory shared between two processes =="
gpus=0
for gpu in cuda level_zero; do
  gpu_rc=0
  ./build-demo/examples/${gpu}_ipc || gpu_rc=$?
  if [ "$gpu_rc" -eq 0 ]; then
    gpus=$((gpus + 1))
  elif [ "$gpu_rc" -ne 77 ]; then
    echo "demo: the $gpu demo failed ($gpu_rc)" >&2
    exit 1
  fi
done
if [ "$gpus" -eq 0 ]; then
  echo "demo: no GPU with a driver on this machine (CUDA or Level Zero): the GPU part was skipped"
fi
echo "demo: all demos passed"
