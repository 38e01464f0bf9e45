# Sourced by the run_*_on_gpu.sh scripts after they set BUILD: a folder staged by
# stage_for_gpu.sh holds its binaries packed (bin.tar.xz), and with DBNET=1 the libraries
# example_dbnet_cuda needs (lib.tar.xz). The binaries are unpacked into BUILD once; the
# libraries into a temporary folder put first on LD_LIBRARY_PATH.
# Without an xz program, Python's tarfile unpacks them (its lzma module). A failure to unpack
# is said, not left to show as missing binaries.
staged_untar() {  # archive, folder
  if command -v xz > /dev/null; then
    tar xJf "$1" -C "$2"
  else
    "${PYTHON:-python3}" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:  # the tar filter where Python has filters (modes kept)
    t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' "$1" "$2"
  fi || { echo "staged.sh: could not unpack $1" >&2; return 1; }
}
if [[ -f "$BUILD/bin.tar.xz" && ! -e "$BUILD/.unpacked" ]]; then
  staged_untar "$BUILD/bin.tar.xz" "$BUILD" && touch "$BUILD/.unpacked"
fi
if [[ -f "$BUILD/lib.tar.xz" ]]; then
  staged_lib="$(mktemp -d)"
  staged_untar "$BUILD/lib.tar.xz" "$staged_lib"
  export LD_LIBRARY_PATH="$staged_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
