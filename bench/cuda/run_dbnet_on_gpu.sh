#!/usr/bin/env bash
# DBNet on a GPU, from binaries built by `./run.sh cuda` (carry build/cuda/examples/
# example_dbnet_cuda and build/cuda/bench/bench_dbnet_gpu, or copies in that layout under BUILD,
# with OpenCV's core and imgproc libraries packed in $BUILD/lib.tar.xz: bench/cuda/stage_for_gpu.sh
# DBNET=1):
#
# 1. the example trained on the device under each map (example_dbnet_cuda, EPOCHS epochs,
#    default 20: the CPU run's recipe), its summary.csv, curves.csv, steps.csv, each map's
#    res_img_N.txt and the log in $RESULTS (default bench/results/dbnet/gpu);
# 2. the training step under each map, precis (bench_dbnet_gpu) against PyTorch eager and
#    torch.compile and Lightning (bench/dbnet/torch_reference.py time --device cuda, and
#    lightning) on the same GPU, merged into $RESULTS_CUDA/dbnet_gpu.csv (default
#    bench/results/cuda):
#    config,policy,precis_ms,torch_ms,torch_compile_ms,lightning_ms,precis_peak_mib,torch_peak_mib,gpu
#    (torch's figures under the map's counterpart: fp32 and tf32 as such, bf16_mixed as AMP bf16,
#    fp16_mixed and fp16_fp32_head as AMP fp16 with a GradScaler; Lightning's 32-true,
#    bf16-mixed and 16-mixed; torch_peak_mib the eager step's torch.cuda.max_memory_reserved(),
#    one process per precision). A policy with `_graph` appended is precis's step as a CUDA
#    graph (train_options::graph); its other columns are the same map's. A policy with `_nhwc`
#    is precis's channels-last model (build_options::layout); its torch columns are torch's
#    channels_last step (--channels-last) where it was run (NHWC=0 leaves those runs out),
#    its Lightning column the NCHW one.
#
# STAGES picks them (default "train step"); POLICIES the example's maps (default all),
# STEP_POLICIES the step's rows (bench_dbnet_gpu --policy: e.g. "bf16_mixed,bf16_mixed_graph";
# default all, 20 rows a configuration);
# COMPILE=0 leaves torch.compile out, LIGHTNING=0 Lightning; COMPILE_MODES and
# COMPILE_PRECISIONS as run_vit_on_gpu.sh's (torch_compile_ms the fastest mode's, every mode's
# time in dbnet_gpu_compile_modes.csv); CONFIGS the step's configurations
# (default "dbnet-r18-640-b16 dbnet-w16-256-b8"); STEPS and WARMUP set the timed and untimed
# steps of every side. PYTHON names an interpreter with torch (default: python3, else
# /opt/torch/.venv/bin/python). Each program has a time limit (TRAIN_TIMEOUT, STEP_TIMEOUT
# seconds); the exit status is 0 only when every stage passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD="${BUILD:-build/cuda}"
RESULTS="${RESULTS:-bench/results/dbnet/gpu}"
RESULTS_CUDA="${RESULTS_CUDA:-bench/results/cuda}"
EPOCHS="${EPOCHS:-20}"
STAGES="${STAGES:-train step}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-5}"
COMPILE="${COMPILE:-1}"
COMPILE_MODES="${COMPILE_MODES:-default reduce-overhead}"
COMPILE_PRECISIONS="${COMPILE_PRECISIONS:-fp32 tf32 bf16 fp16}"
NHWC="${NHWC:-1}"
LIGHTNING="${LIGHTNING:-1}"
CONFIGS="${CONFIGS:-dbnet-r18-640-b16 dbnet-w16-256-b8}"
mkdir -p "$RESULTS" "$RESULTS_CUDA"
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  "$PYTHON" -c 'import torch' 2>/dev/null || PYTHON=/opt/torch/.venv/bin/python
fi
source bench/cuda/staged.sh  # a staged folder's packed binaries, and OpenCV's core and imgproc
failed=0

if [[ " $STAGES " == *" train "* ]]; then
  policy=()
  [[ -n "${POLICIES:-}" ]] && policy=(--policy "$POLICIES")
  timeout "${TRAIN_TIMEOUT:-480}" "$BUILD/examples/example_dbnet_cuda" --epochs "$EPOCHS" "${policy[@]}" \
    --out "$RESULTS" 2>&1 | tr '\r' '\n' | grep -v ' step [0-9]*/' | tee "$RESULTS/run_log.txt"
  rc=${PIPESTATUS[0]}
  echo "example_dbnet_cuda: exit $rc" | tee -a "$RESULTS/run_log.txt"
  rm -rf "$RESULTS/data"
  [[ $rc -eq 0 ]] || failed=1
fi

if [[ " $STAGES " == *" step "* ]]; then
  precis_csv="$RESULTS_CUDA/dbnet_gpu_precis.csv"
  : > "$precis_csv.part"
  : > "$RESULTS_CUDA/bench_dbnet_gpu.txt"
  rows=()
  [[ -n "${STEP_POLICIES:-}" ]] && rows=(--policy "$STEP_POLICIES")
  for config in $CONFIGS; do
    rm -f "$precis_csv.one"
    timeout "${STEP_TIMEOUT:-300}" "$BUILD/bench/bench_dbnet_gpu" --steps "$STEPS" --warmup "$WARMUP" \
      --config "$config" "${rows[@]}" --csv "$precis_csv.one" 2>&1 | tee -a "$RESULTS_CUDA/bench_dbnet_gpu.txt"
    rc=${PIPESTATUS[0]}
    echo "bench_dbnet_gpu ($config): exit $rc" | tee -a "$RESULTS_CUDA/bench_dbnet_gpu.txt"
    [[ $rc -eq 0 ]] || failed=1
    # The rows it wrote (each as it was timed: a failed or stopped run keeps those before).
    if [[ -s "$precis_csv.one" ]]; then
      [[ -s "$precis_csv.part" ]] && tail -n +2 "$precis_csv.one" >> "$precis_csv.part" || cat "$precis_csv.one" >> "$precis_csv.part"
    fi
  done
  mv "$precis_csv.part" "$precis_csv"
  rm -f "$precis_csv.one"
  torch_log="$RESULTS_CUDA/dbnet_gpu_torch.txt"
  : > "$torch_log"
  sizes_of() {
    case "$1" in
      dbnet-r18-640-b16) echo "--width 64 --inner 256 --size 640 --batch 16" ;;
      dbnet-w16-256-b8) echo "--width 16 --inner 64 --size 256 --batch 8" ;;
    esac
  }
  run_python() {  # config, then torch_reference.py's arguments; one process per precision
    local config="$1"
    shift
    echo "== $config $*" >> "$torch_log"
    timeout "${STEP_TIMEOUT:-300}" "$PYTHON" bench/dbnet/torch_reference.py "$@" --steps "$STEPS" \
      --warmup "$WARMUP" $(sizes_of "$config") 2>&1 | sed "s/^RESULT,/RESULT,$config,/" >> "$torch_log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "torch_reference.py ($config $*) failed" >> "$torch_log"; failed=1; }
  }
  compiled() {  # config, then torch_reference.py's arguments: under each of COMPILE_MODES
    local mode
    for mode in $COMPILE_MODES; do run_python "$@" --compile "$mode"; done
  }
  for config in $CONFIGS; do
    for p in fp32 tf32 bf16 fp16; do
      compile_this=0
      [[ "$COMPILE" != 0 && " $COMPILE_PRECISIONS " == *" $p "* ]] && compile_this=1
      run_python "$config" time --device cuda --precision "$p"
      [[ $compile_this == 1 ]] && compiled "$config" time --device cuda --precision "$p"
      if [[ "$NHWC" != 0 && ( "$p" == bf16 || "$p" == fp16 ) ]]; then
        run_python "$config" time --device cuda --precision "$p" --channels-last
        [[ $compile_this == 1 ]] && compiled "$config" time --device cuda --precision "$p" --channels-last
      fi
    done
    if [[ "$LIGHTNING" != 0 ]]; then
      for p in 32-true bf16-mixed 16-mixed; do run_python "$config" lightning --precision "$p"; done
    fi
  done
  cat "$torch_log"
  "$PYTHON" bench/cuda/merge_steps.py dbnet "$precis_csv" "$torch_log" "$RESULTS_CUDA/dbnet_gpu.csv" || failed=1
fi
exit "$failed"
