#!/bin/bash
# SPDX-License-Identifier: MIT
# The README's demo command: install what is missing, build the library and
# the examples (Release, in build-demo/), run examples/basic.
# Exit code: the demo's (0 = every check passed).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh demo

jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p build-demo
log=build-demo/build.log
echo "demo: building (Release, build-demo/; log in $log)"
if ! { cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release \
         -DHM_BUILD_TESTS=OFF -DHM_BUILD_BENCHMARKS=OFF -DHM_BUILD_EXAMPLES=ON &&
       cmake --build build-demo --target basic -j "$jobs"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "demo: the build failed (full log: $log)" >&2
  exit 1
fi
echo "== examples/basic =="
exec ./build-demo/examples/basic
