#!/usr/bin/env bash
# Runs precis's device tests (plain and under compute-sanitizer memcheck) and the device
# benchmarks on a machine with a GPU, from binaries built on a machine with the host
# dependencies (`./run.sh cuda` builds them in build/cuda). Carry build/cuda/tests and
# build/cuda/bench/bench_cuda to the GPU machine and run this from the repository root.
# Results go to $OUT (default bench/results/cuda): the device name, each test's output and
# status, the sanitizer's reports, and the benchmark tables and CSV.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD="${BUILD:-build/cuda}"
OUT="${OUT:-bench/results/cuda}"
mkdir -p "$OUT"

# cuBLAS(Lt) and cuDNN may come from Python wheels (nvidia-*) rather than system libraries.
wheel_libs="$(python3 - <<'PY' 2>/dev/null
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for name in sorted(os.listdir(root)):
        lib = os.path.join(root, name, "lib")
        if os.path.isdir(lib):
            print(lib)
PY
)"
for d in $wheel_libs; do LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"

failed=0
tests=("$BUILD"/tests/cuda/test_cuda_* "$BUILD"/tests/numeric/test_numeric_device)
: > "$OUT/tests.txt"
for t in "${tests[@]}"; do
  [[ -x "$t" ]] || { echo "missing: $t" | tee -a "$OUT/tests.txt"; failed=1; continue; }
  name="$(basename "$t")"
  "$t" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc ($( [[ $rc -eq 0 ]] && echo passed || { [[ $rc -eq 77 ]] && echo SKIPPED || echo FAILED; }))" |
    tee -a "$OUT/tests.txt"
  [[ $rc -eq 0 ]] || failed=1
  if command -v compute-sanitizer > /dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 3 "$t" > "$OUT/$name.memcheck.log" 2>&1
    rc=$?
    echo "$name under memcheck: exit $rc" | tee -a "$OUT/tests.txt"
    [[ $rc -eq 0 ]] || failed=1
  else
    echo "compute-sanitizer not found: memcheck not run" | tee -a "$OUT/tests.txt"
  fi
done

if [[ -x "$BUILD/bench/bench_cuda" ]]; then
  "$BUILD/bench/bench_cuda" --csv "$OUT/bench_cuda.csv" 2>&1 | tee "$OUT/bench_cuda.txt"
else
  echo "missing: $BUILD/bench/bench_cuda"
  failed=1
fi
exit "$failed"
