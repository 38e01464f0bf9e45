#!/usr/bin/env bash
# Where a GPU training step's time goes, kernel by kernel: Nsight Compute (ncu) times every
# kernel of one eager step of a step benchmark (its NVTX range "precis_step", which
# bench/cuda/step_bench.hpp puts around each timed step), and bench/cuda/kernel_times.py sums
# the kernels by family and by instantiation. From binaries built by `./run.sh cuda` (carry
# build/cuda/bench/, or a staged folder: bench/cuda/stage_for_gpu.sh), on the GPU machine:
#
#   BUILD=.gpu bash bench/cuda/profile_on_gpu.sh
#
# PROFILES lists program:config:policy triples (default: ViT-B/16 under bf16_mixed and fp32,
# and DBNet at ResNet-18 width under fp16_mixed); each writes
# $RESULTS/profile_<config>_<policy>.txt (the summary) and .csv (family,launches,total_us,
# mean_us,share), and keeps ncu's own CSV as .ncu.csv. RESULTS defaults to
# bench/results/cuda/profile. The clocks are left alone (--clock-control none, as the
# device notes ask); ncu runs each kernel by itself, so the sum is the kernels' time without
# overlap or launch gaps: compare it with the step's wall time from the step benchmark.
# TIMEOUT limits each program (seconds, default 240); the exit status is 0 only when every
# profile was written.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD="${BUILD:-build/cuda}"
RESULTS="${RESULTS:-bench/results/cuda/profile}"
PROFILES="${PROFILES:-bench_vit_gpu:vit-b16-224-b64:bf16_mixed bench_vit_gpu:vit-b16-224-b64:fp32 bench_dbnet_gpu:dbnet-r18-640-b16:fp16_mixed}"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
source bench/cuda/staged.sh  # a staged folder's packed binaries (and DBNet's libraries)
mkdir -p "$RESULTS"
failed=0
for p in $PROFILES; do
  IFS=: read -r program config policy <<<"$p"
  base="$RESULTS/profile_${config}_${policy}"
  echo "== $program $config $policy"
  # One warm-up step (buffers, plans and the graph-free eager path made), then the profiled one.
  run_ncu() {
    timeout "${TIMEOUT:-240}" "$NCU" --clock-control none --nvtx --nvtx-include "$1" \
      --metrics gpu__time_duration.sum --csv --print-units base \
      "$BUILD/bench/$program" --config "$config" --policy "$policy" --warmup 1 --steps 1 > "$base.ncu.csv" 2> "$base.ncu.err"
  }
  run_ncu "precis_step/"  # a push/pop range
  rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q 'gpu__time_duration' "$base.ncu.csv"; then
    run_ncu "precis_step"  # the other spelling of a range filter
    rc=$?
  fi
  if [[ $rc -ne 0 ]]; then
    echo "ncu on $program ($config, $policy): exit $rc"; tail -5 "$base.ncu.err"; failed=1; continue
  fi
  python3 bench/cuda/kernel_times.py "$base.ncu.csv" --csv "$base.csv" | tee "$base.txt" || failed=1
done
exit $failed
