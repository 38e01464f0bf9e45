#!/usr/bin/env bash
# Runs precis's device tests, the device benchmarks and then the tests again under
# compute-sanitizer memcheck, on a machine with a GPU, from binaries built on a machine with
# the host dependencies (`./run.sh cuda` builds them in build/cuda). Carry build/cuda/tests
# and build/cuda/bench/bench_cuda (or copies in the same layout, named by BUILD) to the GPU
# machine and run this from the repository root.
#
# Results go to $RESULTS (default bench/results/cuda): the device, the libraries each
# binary resolved, each test's output and status, the benchmark's table and CSV, and the
# sanitizer's reports. Each run has a time limit (TEST_TIMEOUT, MEMCHECK_TIMEOUT seconds),
# so that a hung kernel costs one entry, not the lease; a run stopped by it is reported as
# "timed out", never as passed. The exit status is 0 only when every test and the
# benchmark passed. BENCH=0 skips the benchmark, MEMCHECK=0 the sanitizer, PLAIN=0 the tests'
# plain runs (the sanitizer's alone); TOOL names the sanitizer's tool (default memcheck;
# racecheck, initcheck, synccheck); TESTS (a shell pattern, default *) picks the tests by name.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD="${BUILD:-build/cuda}"
source bench/cuda/staged.sh  # a staged folder's packed binaries
RESULTS="${RESULTS:-bench/results/cuda}"
TEST_TIMEOUT="${TEST_TIMEOUT:-120}"
MEMCHECK_TIMEOUT="${MEMCHECK_TIMEOUT:-60}"
BENCH="${BENCH:-1}"
MEMCHECK="${MEMCHECK:-1}"
TOOL="${TOOL:-memcheck}"
PLAIN="${PLAIN:-1}"
TESTS="${TESTS:-*}"
mkdir -p "$RESULTS"

# cuBLAS(Lt), cuDNN, NCCL and the runtime may come from Python wheels (nvidia-*) rather
# than system libraries; then the toolkit's own folder; EXTRA_LIBS last (a fallback).
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
libs=""
for d in $wheel_libs /usr/local/cuda/lib64 ${EXTRA_LIBS:-}; do
  [[ -d "$d" ]] && libs="${libs:+$libs:}$d"
done
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -n 2
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} 2>&1 | tee "$RESULTS/device.txt"

tests=()
for t in "$BUILD"/tests/cuda/test_cuda_* "$BUILD"/tests/numeric/test_numeric_device; do
  # The fused-attention test built without the cuDNN frontend is a build check: it only
  # reports itself skipped, which here would read as a failure.
  [[ "$t" == *_without_frontend ]] && continue
  # shellcheck disable=SC2053
  [[ "$(basename "$t")" == $TESTS ]] && tests+=("$t")
done
{
  for t in "${tests[@]}" "$BUILD/bench/bench_cuda"; do
    echo "== $(basename "$t")"
    ldd "$t" | grep -E 'cu|nccl|not found' || true
  done
} > "$RESULTS/libraries.txt" 2>&1
if grep -q 'not found' "$RESULTS/libraries.txt"; then
  echo "unresolved libraries:"
  grep 'not found' "$RESULTS/libraries.txt" | sort -u
fi

# A status word for an exit code.
status_of() {
  case "$1" in
    0) echo passed ;;
    77) echo SKIPPED ;;
    124) echo "TIMED OUT" ;;
    *) echo FAILED ;;
  esac
}

failed=0
: > "$RESULTS/tests.txt"
[[ "$PLAIN" == 0 ]] && echo "plain runs: not run (PLAIN=0)" | tee -a "$RESULTS/tests.txt"
for t in "${tests[@]}"; do
  [[ "$PLAIN" == 0 ]] && break
  [[ -x "$t" ]] || { echo "missing: $t" | tee -a "$RESULTS/tests.txt"; failed=1; continue; }
  name="$(basename "$t")"
  start_ms=$(date +%s%3N)
  timeout "$TEST_TIMEOUT" "$t" > "$RESULTS/$name.log" 2>&1
  rc=$?
  ms=$(( $(date +%s%3N) - start_ms ))
  echo "$name: exit $rc ($(status_of $rc), $((ms / 1000)).$(printf %03d $((ms % 1000))) s)" |
    tee -a "$RESULTS/tests.txt"
  [[ $rc -eq 0 ]] || failed=1
done

if [[ "$BENCH" == 0 ]]; then
  echo "bench_cuda: not run (BENCH=0)" | tee -a "$RESULTS/tests.txt"
elif [[ -x "$BUILD/bench/bench_cuda" ]]; then
  timeout "${BENCH_TIMEOUT:-240}" "$BUILD/bench/bench_cuda" --csv "$RESULTS/bench_cuda.csv" \
    > "$RESULTS/bench_cuda.txt" 2>&1
  rc=$?
  echo "bench_cuda: exit $rc ($(status_of $rc))" | tee -a "$RESULTS/tests.txt"
  [[ $rc -eq 0 ]] || failed=1
else
  echo "missing: $BUILD/bench/bench_cuda" | tee -a "$RESULTS/tests.txt"
  failed=1
fi

if [[ "$MEMCHECK" == 0 ]]; then
  echo "$TOOL: not run (MEMCHECK=0)" | tee -a "$RESULTS/tests.txt"
elif command -v compute-sanitizer > /dev/null; then
  for t in "${tests[@]}"; do
    [[ -x "$t" ]] || continue
    name="$(basename "$t")"
    # NCCL's start-up asks for kernels of other GPU generations and ignores the refusals;
    # in its test the sanitizer checks memory only, not the CUDA calls' return codes.
    api=()
    [[ "$name" == test_cuda_nccl ]] && api=(--report-api-errors no)
    timeout "$MEMCHECK_TIMEOUT" compute-sanitizer --tool "$TOOL" ${api[@]+"${api[@]}"} --error-exitcode 3 "$t" \
      > "$RESULTS/$name.$TOOL.log" 2>&1
    rc=$?
    echo "$name under $TOOL: exit $rc ($(status_of $rc))" | tee -a "$RESULTS/tests.txt"
    [[ $rc -eq 0 ]] || failed=1
  done
else
  echo "compute-sanitizer not found: $TOOL not run" | tee -a "$RESULTS/tests.txt"
fi
exit "$failed"
