# Sourced by the run_*_on_gpu.sh scripts after they set BUILD: a folder staged by
# stage_for_gpu.sh holds its binaries packed (bin.tar.xz), and with DBNET=1 the libraries
# example_dbnet_cuda needs (lib.tar.xz). The binaries are unpacked into BUILD once; the
# libraries into a temporary folder put first on LD_LIBRARY_PATH.
if [[ -f "$BUILD/bin.tar.xz" && ! -e "$BUILD/.unpacked" ]]; then
  tar xJf "$BUILD/bin.tar.xz" -C "$BUILD" && touch "$BUILD/.unpacked"
fi
if [[ -f "$BUILD/lib.tar.xz" ]]; then
  staged_lib="$(mktemp -d)"
  tar xJf "$BUILD/lib.tar.xz" -C "$staged_lib"
  export LD_LIBRARY_PATH="$staged_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
