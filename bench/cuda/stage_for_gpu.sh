#!/usr/bin/env bash
# Copies what the GPU scripts run, from a `./run.sh cuda` build, into one folder in the layout
# they read (BUILD=<that folder>): the device tests, bench_cuda, bench_vit_gpu and
# example_vit_cuda, stripped; with DATA=1 also Fashion-MNIST (Debian's dataset-fashion-mnist,
# 30 MB) under <folder>/fashion-mnist, for run_vit_on_gpu.sh's DATA. Prints the folder's size
# (a lent machine takes the working tree and carried folders up to 64 MiB in all).
#
#   bench/cuda/stage_for_gpu.sh [FOLDER]      default .gpu (ignore it: .git/info/exclude)
#
# Then, on the GPU machine, from the repository root:
#   BUILD=.gpu bash bench/cuda/run_on_gpu.sh
#   BUILD=.gpu DATA=.gpu/fashion-mnist bash bench/cuda/run_vit_on_gpu.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
from="${FROM:-build/cuda}"
to="${1:-.gpu}"
[[ -d "$from/tests/cuda" ]] || { echo "stage_for_gpu.sh: no $from/tests/cuda: run ./run.sh cuda first" >&2; exit 1; }
rm -rf "$to/tests" "$to/bench" "$to/examples"
mkdir -p "$to/tests/cuda" "$to/tests/numeric" "$to/bench" "$to/examples"
for f in "$from"/tests/cuda/test_cuda_*; do
  [[ -f "$f" && -x "$f" ]] && cp "$f" "$to/tests/cuda/"
done
cp "$from/tests/numeric/test_numeric_device" "$to/tests/numeric/"
for f in bench/bench_cuda bench/bench_vit_gpu examples/example_vit_cuda; do
  if [[ -x "$from/$f" ]]; then cp "$from/$f" "$to/$f"; else echo "stage_for_gpu.sh: missing $from/$f" >&2; fi
done
strip "$to"/tests/cuda/* "$to"/tests/numeric/* "$to"/bench/* "$to"/examples/* 2>/dev/null || true
if [[ "${DATA:-0}" != 0 ]]; then
  mkdir -p "$to/fashion-mnist"
  cp /usr/share/datasets/fashion-mnist/*.gz "$to/fashion-mnist/"
fi
du -sh "$to"
