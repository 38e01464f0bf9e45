#!/usr/bin/env bash
# A whole GPU lease in one call: the device work in order of priority, each piece only if the
# time left allows it, every result packed into one archive that the lent machine hands back
# (it returns at most eight files from $OUT). From a folder staged by
# `DATA=1 DBNET=1 bench/cuda/stage_for_gpu.sh .gpu`, carried to the GPU machine:
#
#   BUILD=.gpu bash bench/cuda/gpu_session.sh          (run's timeout_s: BUDGET + 30)
#
# PHASES (default "tests bench profile vit_step dbnet_step memcheck racecheck vit_train
# dbnet_train")
# run in that order:
#   tests        every device test, plain                       (run_on_gpu.sh)
#   bench        bench_cuda: products, convolutions, bandwidth   (run_on_gpu.sh)
#   profile      ncu, kernel by kernel, of one ViT-B/16 bf16_mixed step (profile_on_gpu.sh;
#                PROFILES as there)
#   vit_step     the ViT steps against torch eager (run_vit_on_gpu.sh STAGES=step;
#                COMPILE=1 adds torch.compile, in COMPILE_MODES for COMPILE_PRECISIONS as
#                there: COMPILE=1 COMPILE_PRECISIONS=bf16 times what the speed targets
#                compare with; STEP_POLICIES picks precis's rows, in this phase and the next)
#   dbnet_step   the DBNet step at ResNet-18 width against torch eager (run_dbnet_on_gpu.sh
#                STAGES=step; COMPILE, LIGHTNING, NHWC and CONFIGS as there, default off and
#                dbnet-r18-640-b16)
#   memcheck     every device test under compute-sanitizer memcheck
#   racecheck    the tests of the kernels that stage through shared memory (the reductions,
#                the row kernels, the losses) under racecheck (RACE_TESTS, a shell pattern)
#   vit_train    the ViT example trained under each map, 6 epochs (run_vit_on_gpu.sh)
#   dbnet_train  the DBNet example (run_dbnet_on_gpu.sh; EPOCHS, POLICIES as there)
# A phase starts only when at least its minimum time (MIN_<phase>, seconds) is left of BUDGET
# (default 540: the lease's command limit less the unpacking and the transfers), and runs for
# at most its maximum (MAX_<phase>) or what is left; each script's own per-program limits are
# set to fit. Results go to $OUT/results.tar.xz (results.tar.gz on a machine without xz; one
# folder per phase, repacked after each phase, and on a TERM, INT or HUP, which also stops
# the running phase, so a call stopped by its limit still returns what had finished) and a
# summary, one line per phase with its exit status and seconds, to $OUT/session.txt. Exit
# status 0 when every phase that ran passed. Unpack here with
#   mkdir -p bench/results/cuda/<name> && tar xf results.tar.xz -C bench/results/cuda/<name>
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
BUILD="${BUILD:-.gpu}"
OUT="${OUT:-.gpu_out}"
BUDGET="${BUDGET:-540}"
PHASES="${PHASES:-tests bench profile vit_step dbnet_step memcheck racecheck vit_train dbnet_train}"
work="$(mktemp -d)"
R="$work/results"
mkdir -p "$R" "$OUT"
export BUILD R
start=$(date +%s)

# Seconds a phase needs to be worth starting, and the most it may take.
declare -A MIN=([tests]=60 [bench]=45 [profile]=120 [vit_step]=120 [dbnet_step]=120 [memcheck]=120
                [racecheck]=60 [vit_train]=300 [dbnet_train]=400)
declare -A MAX=([tests]=240 [bench]=150 [profile]=300 [vit_step]=300 [dbnet_step]=300 [memcheck]=300
                [racecheck]=150 [vit_train]=420 [dbnet_train]=480)

# Runs phase $1 for at most $2 seconds, its results in $R/$1.
run_phase() {
  local d="$R/$1" t="$2"
  mkdir -p "$d"
  case "$1" in
    tests) RESULTS="$d" BENCH=0 MEMCHECK=0 TEST_TIMEOUT=120 bash bench/cuda/run_on_gpu.sh ;;
    bench) RESULTS="$d" TESTS=none BENCH=1 MEMCHECK=0 BENCH_TIMEOUT="$t" bash bench/cuda/run_on_gpu.sh ;;
    profile)
      RESULTS="$d" PROFILES="${PROFILES:-bench_vit_gpu:vit-b16-224-b64:bf16_mixed}" TIMEOUT="$t" \
        bash bench/cuda/profile_on_gpu.sh ;;
    vit_step)
      RESULTS="$d" RESULTS_CUDA="$d" STAGES=step COMPILE="${COMPILE:-0}" STEP_TIMEOUT="$t" \
        bash bench/cuda/run_vit_on_gpu.sh ;;
    dbnet_step)
      RESULTS="$d" RESULTS_CUDA="$d" STAGES=step COMPILE="${COMPILE:-0}" LIGHTNING="${LIGHTNING:-0}" \
        NHWC="${NHWC:-0}" CONFIGS="${CONFIGS:-dbnet-r18-640-b16}" STEP_TIMEOUT="$t" bash bench/cuda/run_dbnet_on_gpu.sh ;;
    memcheck) RESULTS="$d" PLAIN=0 BENCH=0 MEMCHECK_TIMEOUT=90 bash bench/cuda/run_on_gpu.sh ;;
    racecheck)
      RESULTS="$d" PLAIN=0 BENCH=0 TOOL=racecheck TESTS="${RACE_TESTS:-test_cuda_device_[kl]*}" MEMCHECK_TIMEOUT=70 \
        bash bench/cuda/run_on_gpu.sh ;;
    vit_train)
      RESULTS="$d" RESULTS_CUDA="$d" STAGES=train DATA="$BUILD/fashion-mnist" TRAIN_TIMEOUT="$t" \
        bash bench/cuda/run_vit_on_gpu.sh ;;
    dbnet_train) RESULTS="$d" RESULTS_CUDA="$d" STAGES=train TRAIN_TIMEOUT="$t" bash bench/cuda/run_dbnet_on_gpu.sh ;;
  esac
}

# Runs phase $1 for at most $2 seconds, its output in $R/$1.log, in a session of its own
# (setsid), and then stops every process left in that session: the scripts run their programs
# under `timeout`, which gives each a process group of its own, out of reach of a timeout
# around the phase; a program that outlived its phase would hold the GPU through the next
# one. Exit status: the phase's, or 124 when it was stopped. `sid` (the running phase's
# session) is global: a signal to this script stops that session too (see the trap below).
sid=""
run_limited() {
  local phase="$1" limit="$2" waited=0 rc
  setsid bash -c "$(declare -f run_phase); run_phase $phase $((limit - 10))" > "$R/$phase.log" 2>&1 &
  sid=$!  # a background job of a script is no group leader: setsid makes it a session's leader
  while kill -0 "$sid" 2>/dev/null && ((waited < limit)); do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$sid" 2>/dev/null; then
    pkill -TERM -s "$sid"
    sleep 5
    pkill -KILL -s "$sid"
    wait "$sid" 2>/dev/null
    sid=""
    return 124
  fi
  wait "$sid"
  rc=$?
  pkill -KILL -s "$sid"  # anything the phase left running in the background
  sid=""
  return "$rc"
}

for p in $PHASES; do
  [[ -n "${MIN[$p]:-}" ]] || { echo "gpu_session.sh: no phase named $p (phases: ${!MIN[*]})" >&2; exit 2; }
done

# The archive: xz where the machine has it, else gzip (results.tar.gz), so that a missing xz
# never costs the results.
if command -v xz > /dev/null; then
  archive=results.tar.xz pack_flag=J
else
  archive=results.tar.gz pack_flag=z
  echo "gpu_session.sh: no xz here, the results go to $archive" >&2
fi
pack() { tar "c${pack_flag}f" "$OUT/$archive.part" -C "$R" . && mv "$OUT/$archive.part" "$OUT/$archive"; }
# Stopped from outside (the lease's command limit, an interrupt): the running phase's session
# is stopped, not left holding the GPU, and what has finished is packed.
trap '[[ -n "$sid" ]] && pkill -KILL -s "$sid"; echo "gpu_session.sh: stopped by a signal" >> "$OUT/session.txt"; \
  cp "$OUT/session.txt" "$R/session.txt"; pack; rm -rf "$work"; exit 124' TERM INT HUP

{
  echo "gpu_session.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${BUDGET} s, phases: $PHASES"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
} | tee "$OUT/session.txt"
failed=0
for p in $PHASES; do
  left=$((BUDGET - ($(date +%s) - start)))
  v="MIN_$p" && need="${!v:-${MIN[$p]}}"
  if ((left < need)); then
    echo "$p: not started (${left} s left, needs ${need})" | tee -a "$OUT/session.txt"
    continue
  fi
  v="MAX_$p" && limit="${!v:-${MAX[$p]}}"
  ((limit > left)) && limit=$left
  echo "== $p (at most ${limit} s)"
  t0=$(date +%s)
  run_limited "$p" "$limit"
  rc=$?
  ((rc == 0)) || failed=1
  tail -n 20 "$R/$p.log"
  echo "$p: exit $rc$([[ $rc == 124 || $rc == 137 ]] && echo ' (timed out)') in $(($(date +%s) - t0)) s" |
    tee -a "$OUT/session.txt"
  pack
done
cp "$OUT/session.txt" "$R/session.txt" && pack
rm -rf "$work"
exit "$failed"
