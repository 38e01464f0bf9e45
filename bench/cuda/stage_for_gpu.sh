#!/usr/bin/env bash
# Copies what the GPU scripts run, from a `./run.sh cuda` build, into one folder in the layout
# they read (BUILD=<that folder>): the device tests, bench_cuda, bench_vit_gpu, bench_dbnet_gpu,
# example_vit_cuda and example_dbnet_cuda, stripped; with DATA=1 also Fashion-MNIST (Debian's
# dataset-fashion-mnist, 30 MB) under <folder>/fashion-mnist, for run_vit_on_gpu.sh's DATA;
# with DBNET=1 also <folder>/lib.tar.xz, the shared libraries example_dbnet_cuda needs beyond
# the C and C++ runtimes, CUDA's and zlib (OpenCV's core and imgproc, Clipper, and theirs:
# about 11 MB packed), which run_dbnet_on_gpu.sh unpacks. The binaries are packed too, as
# <folder>/bin.tar.xz (about 8 MB for 63 MB of binaries; PACK=0 leaves them loose), which the
# run scripts unpack (bench/cuda/staged.sh). Prints the folder's size: a lent machine takes
# the working tree and carried folders up to 64 MiB in all; DATA=1 DBNET=1 together is about
# 50 MB.
#
#   bench/cuda/stage_for_gpu.sh [FOLDER]      default .gpu (.gitignore ignores it: carry it)
#
# Then, on the GPU machine, from the repository root:
#   BUILD=.gpu bash bench/cuda/run_on_gpu.sh
#   BUILD=.gpu DATA=.gpu/fashion-mnist bash bench/cuda/run_vit_on_gpu.sh
#   BUILD=.gpu bash bench/cuda/run_dbnet_on_gpu.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
from="${FROM:-build/cuda}"
to="${1:-.gpu}"
[[ -d "$from/tests/cuda" ]] || { echo "stage_for_gpu.sh: no $from/tests/cuda: run ./run.sh cuda first" >&2; exit 1; }
rm -rf "$to/tests" "$to/bench" "$to/examples" "$to/lib.tar.xz" "$to/bin.tar.xz" "$to/.unpacked"
mkdir -p "$to/tests/cuda" "$to/tests/numeric" "$to/bench" "$to/examples"
for f in "$from"/tests/cuda/test_cuda_*; do
  # The build without the cuDNN frontend only reports itself skipped: a build check.
  [[ "$f" == *_without_frontend ]] && continue
  [[ -f "$f" && -x "$f" ]] && cp "$f" "$to/tests/cuda/"
done
cp "$from/tests/numeric/test_numeric_device" "$to/tests/numeric/"
for f in bench/bench_cuda bench/bench_vit_gpu bench/bench_dbnet_gpu examples/example_vit_cuda examples/example_dbnet_cuda; do
  if [[ -x "$from/$f" ]]; then cp "$from/$f" "$to/$f"; else echo "stage_for_gpu.sh: missing $from/$f" >&2; fi
done
strip "$to"/tests/cuda/* "$to"/tests/numeric/* "$to"/bench/* "$to"/examples/* 2>/dev/null || true
if [[ "${DATA:-0}" != 0 ]]; then
  mkdir -p "$to/fashion-mnist"
  cp /usr/share/datasets/fashion-mnist/*.gz "$to/fashion-mnist/"
fi
if [[ "${DBNET:-0}" != 0 ]]; then
  libs="$(mktemp -d)"
  base='^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libz)\.'
  ldd "$from/examples/example_dbnet_cuda" | awk '/=>/ {print $1, $3}' | grep -v -E "$base" |
    while read -r name path; do cp -L "$path" "$libs/$name"; done
  tar cJf "$to/lib.tar.xz" -C "$libs" .
  rm -rf "$libs"
fi
if [[ "${PACK:-1}" != 0 ]]; then
  tar cJf "$to/bin.tar.xz" -C "$to" tests bench examples
  rm -rf "$to/tests" "$to/bench" "$to/examples"
fi
du -sh "$to"
