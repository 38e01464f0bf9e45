#!/usr/bin/env bash
# Builds, tests and packages precis. Each command first installs what is missing
# (Debian/Ubuntu packages; Conan for `package`).
#
#   ./run.sh test       g++ Release build in build/gcc (-O2 under CI with the unit tests at
#                       -Og, else -O3), warnings are errors, CTest; under CI the benchmarks
#                       are only checked (-fsyntax-only), not built
#   ./run.sh demo       builds and runs the demo (precis_demo); arguments are passed on
#   ./run.sh clang      the second compiler and the sanitizers in one build: clang++ -O0
#                       with ASan + UBSan and -Werror in build/clang, CTest without the
#                       `slow` tests, the libFuzzer harnesses fuzzed (what only repeats the
#                       test stage's work is left to it: the training examples, benchmarks,
#                       header checks, bits probe, MPI, instruction-set variants)
#   ./run.sh cuda       PRECIS_CUDA=ON in build/cuda (and the cuDNN frontend's headers from
#                       PyPI, nvidia-cudnn-frontend): every CUDA unit compiled and linked
#                       with nvcc (for sm_80 and sm_90, host code at -O3; under CI sm_90
#                       only, host and device code at -O0, the device benchmarks and
#                       examples only checked), their tests and the CUDA compile-fail tests (tests
#                       labelled gpu are skipped without a GPU); host-only targets are
#                       left to `test`
#   ./run.sh package    install to build/install-prefix, build tests/consumer against it,
#                       conan create with boost and xtensor taken from the system
#   ./run.sh docs       the documentation's checks (docs/tools/check_docs.py): README.md within
#                       12 KiB, every relative link and anchor of README.md, docs/ and the
#                       examples' READMEs, every C++ block taken from a compiled file or
#                       marked a fragment, the compiler output and the performance tables as
#                       their sources give them, and the API reference (Doxygen, into
#                       build/docs/html) without a warning beyond docs/reference/known-warnings.txt
#   ./run.sh ci         docs, test, clang, cuda, package
#
# CTest labels: `gpu` needs a GPU (exits 77 without one, reported as skipped); `slow`
# (the examples' training runs, the numerical comparisons) is left out of the clang stage.
# JOBS (default 2) sets build and test parallelism; TEST_TIMEOUT (default 600) the seconds
# after which a test counts as hung and fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"
export DEBIAN_FRONTEND=noninteractive

# ocl-icd-opencl-dev: Debian's oneDNN is built with the OpenCL GPU runtime, and its CMake
# package configuration requires OpenCL; apt only recommends it, and recommends are off.
PACKAGES=(cmake g++ clang libboost-dev xtensor-dev doctest-dev libopenblas-dev libdnnl-dev
          ocl-icd-opencl-dev gnuplot-nox python3-pip zlib1g-dev dataset-fashion-mnist
          nlohmann-json3-dev libclang-rt-14-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
          libpolyclipping-dev libopenmpi-dev openmpi-bin doxygen)

log() { printf '\n\033[1m-- %s\033[0m\n' "$*"; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_packages() {
  if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    printf 'run.sh: not a Debian system; make sure these are installed: %s\n' \
      "${PACKAGES[*]}" >&2
    return
  fi
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    # dpkg -s also succeeds for removed packages whose configuration is left.
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" == installed ]] ||
      missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends "${missing[@]}"
  fi
}

install_conan() {
  command -v conan >/dev/null && return
  log "installing conan"
  export PATH="$HOME/.local/bin:$PATH"
  # Debian's Python refuses user installs unless told (PEP 668).
  python3 -m pip install --user conan ||
    python3 -m pip install --user --break-system-packages conan
  command -v conan >/dev/null || die "conan was installed but is not on PATH"
}

# The cuDNN frontend's headers (header-only; the PyPI wheel installs them under its
# site-packages' include/), for fused attention (precis::cudnn_frontend).
install_cudnn_frontend() {
  python3 -c "import site, sys, os; sys.exit(not any(os.path.exists(os.path.join(d, 'include', 'cudnn_frontend.h')) for d in site.getsitepackages() + [site.getusersitepackages()]))" && return
  log "installing nvidia-cudnn-frontend"
  python3 -m pip install --user nvidia-cudnn-frontend ||
    python3 -m pip install --user --break-system-packages nvidia-cudnn-frontend
}

# configure <build dir> <C++ compiler> <build type> [cmake args...]
configure() {
  local dir="$1" cxx="$2" type="$3"
  shift 3
  command -v "$cxx" >/dev/null || die "$cxx not found"
  cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE="$type" "$@"
}

build() {
  local dir="$1"
  shift
  cmake --build "$dir" --parallel "$JOBS" "$@"
}

# A test that hangs fails after TEST_TIMEOUT seconds (default 600; the longest test, a
# training example's check run, takes under a minute) instead of holding up CI.
run_ctest() {
  local dir="$1"
  shift
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$JOBS" \
    --timeout "${TEST_TIMEOUT:-600}" "$@"
}

# The host stages leave CUDA off so that only the cuda stage spends time in nvcc.
# Under CI the test stage compiles at -O2 instead of Release's -O3, the unit tests at -Og
# (PRECIS_TEST_OPTIMIZATION) and the examples at -O1 (PRECIS_EXAMPLE_OPTIMIZATION): they are
# built to run once, and their compilation is most of the stage. On a two-core EPYC:
# - test_layout.cpp compiles in 74 s at -O2, 51 s at -O1 and 36 s at -Og, and the slowest
#   unit tests run about as fast at -Og as at -O1 (test_numeric_rounding 3.1 s,
#   test_kernels_conv 1.1 s against 0.9);
# - train_vit.cpp compiles in 121 s at -O2, 93 s at -O1 and 70 s at -Og, and `example_vit
#   --check` runs in 56 s, 58 s and 97 s: -O1 is the examples' level;
# - -Og and -O1 keep GCC's flow-based warnings (-Wmaybe-uninitialized and the like);
# - the bits probe stays at -O2, as users build, and precis gives the same bits under any
#   flags (tests/flags).
# And it checks the benchmarks, which CI never runs, with -fsyntax-only
# (PRECIS_BENCH_CHECK_ONLY): every compile error, and the front-end warnings of those that
# carry the project's warning set (the step benchmarks), under -Werror, in about a fifth of
# the time that building them at -O2 takes (bench_vit_step: 11 s against 62; 160 s of
# compilation in all). Outside CI build/gcc keeps -O3 everywhere and builds the benchmarks,
# as their recorded figures were measured. The settings are always passed, so that a tree
# configured once under CI does not keep them in its cache.
configure_gcc() {
  local level=3 bench_check_only=OFF test_level="" example_level=""
  [[ -n "${CI:-}" ]] && level=2 bench_check_only=ON test_level=-Og example_level=-O1
  configure build/gcc g++ Release -DCMAKE_CXX_FLAGS_RELEASE="-O$level -DNDEBUG" \
    -DPRECIS_WERROR=ON -DPRECIS_CUDA=OFF -DPRECIS_BENCH_CHECK_ONLY=$bench_check_only \
    -DPRECIS_TEST_OPTIMIZATION="$test_level" -DPRECIS_EXAMPLE_OPTIMIZATION="$example_level"
}

cmd_test() {
  configure_gcc
  build build/gcc
  run_ctest build/gcc
}

cmd_clang() {
  # One build for the second compiler and the sanitizers. clang's warnings come from its
  # front end, whatever the optimisation level, and precis gives the same bits under any
  # flags (tests/flags), so -O0, where clang compiles fastest: on a two-core EPYC this
  # stage's build took 160 s and its tests 195 s, where the two stages it replaces (clang
  # at -O1 for the warnings, GCC at -O0 with the sanitizers) took 349 s and 445 s.
  # -g1: line tables only, which is what the sanitizers' reports print (file and line per
  # frame). Left to the test stage, which compiles them with -Werror and runs what runs: the
  # benchmarks (under CI only checked, see configure_gcc), the training examples (their code is the examples', their runs are slow),
  # the headers' stand-alone check (whether a header includes what it uses does not depend
  # on the compiler), the bits probe (it builds with both compilers itself), MPI, and the
  # tests' instruction-set variants.
  configure build/clang clang++ RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" \
    -DPRECIS_SANITIZE=ON -DPRECIS_WERROR=ON -DPRECIS_CUDA=OFF -DPRECIS_BITS_PROBE=OFF \
    -DPRECIS_BUILD_BENCH=OFF -DPRECIS_BUILD_TRAINING_EXAMPLES=OFF -DPRECIS_HEADER_CHECKS=OFF \
    -DPRECIS_MPI=OFF -DPRECIS_ISA_VARIANT_TESTS=OFF
  build build/clang
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_stack_use_after_return=1:strict_string_checks=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
    run_ctest build/clang -LE '^(gpu|slow)$'
}

cmd_demo() {
  configure_gcc
  grep -q '/precis_demo\.dir$' build/gcc/CMakeFiles/TargetDirectories.txt ||
    die "there is no precis_demo target (examples/CMakeLists.txt defines it)"
  build build/gcc --target precis_demo
  local exe
  exe="$(find build/gcc -type f -name precis_demo -perm -u+x -print -quit)"
  [[ -n "$exe" ]] || die "precis_demo was built but not found under build/gcc"
  "$exe" "$@"
}

cmd_cuda() {
  # Under CI, one architecture, sm_90 (and its PTX), instead of 80;90 (A100 and H100), to
  # keep CI within its time (a unit such as test_nn_block.cu: 68 s for both, 49 s for one).
  # The device code's only architecture branches are the conversion instructions of
  # numeric/detail/device_convert.hpp (>= 800: bfloat16, >= 890: float8), all of which
  # sm_90 compiles; on sm_80 float8 decodes in the portable code that the host build
  # compiles too. Outside CI (binaries for bench/cuda/run_on_gpu.sh) both are built.
  # CUDA_ARCHITECTURES overrides either. The list is always passed, so that a tree
  # configured once under CI does not keep its list in its cache.
  # Under CI the host code is also compiled at -O0 instead of -O3: no GPU runs these
  # binaries there, nvcc's host pass (g++ on the host half of each unit) was two thirds of a
  # unit's time at -O3 (test_nn_block.cu: 38 of 56 s; 13 s at -O0), and nvcc's -O level does
  # not reach the device code (cicc and ptxas run the same either way). CUDA sources carry
  # no warning flags; the one C++ unit here, test_cuda_host, runs at -O0 and loses only the
  # optimiser's warnings (-Wmaybe-uninitialized and the like). Outside CI both are -O3.
  # And under CI the device tests, benchmarks and training examples are checked, not built
  # (PRECIS_CUDA_CHECK_ONLY; CI has no GPU to run them on): their device code compiled in full
  # (nvcc -cuda), their host half with -fsyntax-only, 10 to 40 s less each; their gpu tests
  # then report themselves skipped, as they would without a GPU anyway. One device test,
  # test_cuda_blas_lt, is still built in full, so that CI links an nvcc unit.
  # And under CI the device code itself is compiled without optimisation (-Xcicc -O0 -Xptxas
  # -O0): every front-end error and every PTX and ptxas check remain, nothing runs the code,
  # and each unit takes a fifth less (test_nn_layers.cu: 51 s against 64).
  install_cudnn_frontend
  local archs="80;90" level=3 check_only=OFF device_level=""
  [[ -n "${CI:-}" ]] && archs=90 level=0 check_only=ON device_level="-Xcicc -O0 -Xptxas -O0"
  # PRECIS_TEST_PCH off: the one C++ test unit built here (test_cuda_host) would not repay it.
  configure build/cuda g++ Release -DPRECIS_WERROR=ON -DPRECIS_CUDA=ON -DPRECIS_BITS_PROBE=OFF \
    -DPRECIS_TEST_PCH=OFF \
    -DPRECIS_CUDA_CHECK_ONLY=$check_only \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-$archs}" \
    -DCMAKE_CXX_FLAGS_RELEASE="-O$level -DNDEBUG" \
    -DCMAKE_CUDA_FLAGS_RELEASE="-O$level -DNDEBUG${device_level:+ $device_level}"
  # Host-only targets are the test stage's (same compiler, same flags): this stage builds
  # what nvcc compiles or what links precis::cuda (precis_device_targets: one target, so that
  # make builds its units two at a time), and runs their tests and the CUDA compile-fail tests.
  grep -q '/precis_device_targets\.dir$' build/cuda/CMakeFiles/TargetDirectories.txt ||
    die "the CUDA build defines no precis_device_targets (is CUDA found?)"
  build build/cuda --target precis_device_targets
  run_ctest build/cuda -R '^(test_cuda_|test_numeric_device$|compile_fail_cuda_|example_[a-z]*_cuda$)'
}

cmd_docs() {
  python3 docs/tools/check_docs.py
}

cmd_package() {
  local prefix="$ROOT/build/install-prefix"
  log "install to $prefix"
  rm -rf "$prefix" build/consumer
  configure build/package g++ Release -DPRECIS_CUDA=OFF -DPRECIS_BUILD_TESTS=OFF \
    -DPRECIS_BUILD_BENCH=OFF -DPRECIS_BUILD_EXAMPLES=OFF -DPRECIS_INSTALL=ON
  cmake --install build/package --prefix "$prefix"

  log "tests/consumer against the installed tree"
  cmake -S tests/consumer -B build/consumer -DCMAKE_CXX_COMPILER=g++ \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
  grep -q "^precis_DIR:PATH=$prefix/" build/consumer/CMakeCache.txt ||
    die "tests/consumer found a precis other than the one in $prefix"
  build build/consumer
  run_ctest build/consumer

  log "conan create (boost and xtensor from the system)"
  install_conan
  # A Conan home of its own keeps CI independent of the user's profiles and cache.
  export CONAN_HOME="$ROOT/build/conan-home"
  conan profile detect --exist-ok
  # --no-remote: everything comes from this checkout and the system.
  conan create . -pr:a cmake/conan/system-profile --build=missing --no-remote \
    -c tools.build:jobs="$JOBS"
}

cmd_ci() {
  local stages=(docs test clang cuda package) i=0 t
  ci_start=$SECONDS ci_stage=""
  trap '[[ $? -eq 0 ]] || printf "\n\033[1m==== %s FAILED (%ds into ci) ====\033[0m\n" \
    "$ci_stage" $((SECONDS - ci_start)) >&2' EXIT
  for ci_stage in "${stages[@]}"; do
    i=$((i + 1))
    printf '\n\033[1m==== [%d/%d] %s ====\033[0m\n' "$i" "${#stages[@]}" "$ci_stage"
    t=$SECONDS
    "cmd_$ci_stage"
    printf '\033[1m==== %s passed in %ds ====\033[0m\n' "$ci_stage" $((SECONDS - t))
  done
  printf '\n\033[1m==== ci passed: %s in %dm%02ds ====\033[0m\n' "${stages[*]}" \
    $(((SECONDS - ci_start) / 60)) $(((SECONDS - ci_start) % 60))
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

command="${1:-}"
case "$command" in
  test | demo | clang | cuda | package | docs | ci)
    shift
    install_packages
    "cmd_$command" "$@"
    ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
