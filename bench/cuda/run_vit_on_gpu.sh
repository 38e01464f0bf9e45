#!/usr/bin/env bash
# The ViT on a GPU, from binaries built by `./run.sh cuda` (carry build/cuda/examples/
# example_vit_cuda and build/cuda/bench/bench_vit_gpu, or copies in that layout under BUILD):
#
# 1. the example trained on the device under each map (example_vit_cuda, EPOCHS epochs,
#    default 6, Fashion-MNIST from DATA), its summary.csv, curves.csv and log in
#    $RESULTS/vit/ (default bench/results/vit/gpu);
# 2. the training step under each map, precis (bench_vit_gpu) against PyTorch eager and
#    torch.compile (bench/vit/torch_reference.py time --device cuda) on the same GPU, merged
#    into $RESULTS_CUDA/vit_gpu.csv (default bench/results/cuda):
#    config,policy,precis_ms,torch_eager_ms,torch_compile_ms,precis_peak_mib,torch_peak_mib,gpu
#    (torch_peak_mib: the eager step's torch.cuda.max_memory_reserved()). A policy with
#    `_graph` appended is precis's step as a CUDA graph (train_options::graph); its torch
#    columns are torch's step under the same map. bf16_mixed_pieces is bf16_mixed with the
#    attention unfused (precis's fused attention needs precis::cudnn_frontend); torch's
#    attention is F.scaled_dot_product_attention (flash attention), SDPA=0 for the three
#    steps written out.
#
# STAGES picks them (default "train step"); STEP_POLICIES the step's rows (bench_vit_gpu
# --policy, e.g. "bf16_mixed,bf16_mixed_graph"; default all); COMPILE=0 leaves torch.compile out;
# COMPILE_MODES lists torch.compile's modes to time (default "default reduce-overhead";
# "max-autotune" tunes for minutes), COMPILE_PRECISIONS the precisions compiled (default
# "fp32 tf32 bf16 fp16"; "bf16" is all the speed targets compare with); torch_compile_ms is the
# fastest mode's, every mode's time in vit_gpu_compile_modes.csv (bench/cuda/merge_steps.py
# merges the table). STEPS and WARMUP set the timed and untimed steps of both sides. PYTHON names an interpreter with
# torch (default: python3, else /opt/torch/.venv/bin/python). Each program has a time limit
# (TRAIN_TIMEOUT, STEP_TIMEOUT seconds); the exit status is 0 only when every stage passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD="${BUILD:-build/cuda}"
source bench/cuda/staged.sh  # a staged folder's packed binaries
RESULTS="${RESULTS:-bench/results/vit/gpu}"
RESULTS_CUDA="${RESULTS_CUDA:-bench/results/cuda}"
DATA="${DATA:-/usr/share/datasets/fashion-mnist}"
EPOCHS="${EPOCHS:-6}"
STAGES="${STAGES:-train step}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-5}"
COMPILE="${COMPILE:-1}"
COMPILE_MODES="${COMPILE_MODES:-default reduce-overhead}"
COMPILE_PRECISIONS="${COMPILE_PRECISIONS:-fp32 tf32 bf16 fp16}"
SDPA="${SDPA:-1}"
mkdir -p "$RESULTS" "$RESULTS_CUDA"
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  "$PYTHON" -c 'import torch' 2>/dev/null || PYTHON=/opt/torch/.venv/bin/python
fi
failed=0

if [[ " $STAGES " == *" train "* ]]; then
  timeout "${TRAIN_TIMEOUT:-420}" "$BUILD/examples/example_vit_cuda" --epochs "$EPOCHS" --data "$DATA" \
    --out "$RESULTS" 2>&1 | tr '\r' '\n' | grep -v ' step [0-9]*/' | tee "$RESULTS/run_log.txt"
  rc=${PIPESTATUS[0]}
  echo "example_vit_cuda: exit $rc" | tee -a "$RESULTS/run_log.txt"
  [[ $rc -eq 0 ]] || failed=1
fi

if [[ " $STAGES " == *" step "* ]]; then
  precis_csv="$RESULTS_CUDA/vit_gpu_precis.csv"
  rows=()
  [[ -n "${STEP_POLICIES:-}" ]] && rows=(--policy "$STEP_POLICIES")
  timeout "${STEP_TIMEOUT:-300}" "$BUILD/bench/bench_vit_gpu" --steps "$STEPS" --warmup "$WARMUP" \
    "${rows[@]}" --csv "$precis_csv" 2>&1 | tee "$RESULTS_CUDA/bench_vit_gpu.txt"
  rc=${PIPESTATUS[0]}
  echo "bench_vit_gpu: exit $rc" | tee -a "$RESULTS_CUDA/bench_vit_gpu.txt"
  [[ $rc -eq 0 ]] || failed=1
  torch_log="$RESULTS_CUDA/vit_gpu_torch.txt"
  : > "$torch_log"
  run_torch() {  # config name, then torch_reference.py's arguments
    local config="$1"
    shift
    local mode modes=(eager)
    [[ "$COMPILE" != 0 ]] && read -r -a more <<< "$COMPILE_MODES" && modes+=("${more[@]}")
    for mode in "${modes[@]}"; do
      local flag=() precisions=fp32,tf32,bf16,fp16
      [[ $mode != eager ]] && flag=(--compile "$mode") && precisions="${COMPILE_PRECISIONS// /,}"
      [[ $SDPA != 0 ]] && flag+=(--sdpa)
      echo "== $config${flag[*]:+ ${flag[*]}}" >> "$torch_log"
      timeout "${STEP_TIMEOUT:-300}" "$PYTHON" bench/vit/torch_reference.py time --device cuda \
        --precision "$precisions" --steps "$STEPS" --warmup "$WARMUP" "$@" "${flag[@]}" \
        2>&1 | sed "s/^RESULT,/RESULT,$config,/" >> "$torch_log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "torch_reference.py ($config${flag[*]:+ ${flag[*]}}) failed" >> "$torch_log"; failed=1; }
    done
  }
  # ViT-B first: its figures are the ones the speed targets compare, and a phase cut short by
  # its time limit loses what comes last.
  run_torch vit-b16-224-b64 --image 224 --channels 3 --patch 16 --width 768 --heads 12 --depth 12 --classes 1000 --batch 64
  run_torch vit-w192-d6-p4-b128 --image 28 --channels 1 --patch 4 --width 192 --heads 3 --depth 6 --classes 10 --batch 128
  cat "$torch_log"
  "$PYTHON" bench/cuda/merge_steps.py vit "$precis_csv" "$torch_log" "$RESULTS_CUDA/vit_gpu.csv" || failed=1
fi
exit "$failed"
