#!/bin/sh
# usage: no_contraction.sh OBJDUMP FAST OFF
# FAST and OFF are one translation unit (bits_probe.cpp) built with the same compiler and
# -march=native, with -ffp-contract=fast and with -ffp-contract=off. A fused multiply-add
# that is in FAST's machine code and not in OFF's is one the compiler fused on its own: a
# result that would change with the flags. Every function must have the same count of
# fused instructions in both (those written as std::fma or intrinsics are in both).
set -eu
objdump=$1
fused() {
  "$objdump" -d --no-show-raw-insn -C "$1" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; sub(/^[0-9a-f]+ /, "", fn); next }
    /[ \t]v?f(n)?m(add|sub)[0-9a-z]*[ \t]/ { count[fn]++ }
    END { for (f in count) print count[f] "\t" f }' | sort
}
fused "$2" > "$2.fused"
fused "$3" > "$3.fused"
if ! diff "$2.fused" "$3.fused" > "$2.fused.diff"; then
  echo "fused multiply-adds the compiler made under -ffp-contract=fast ('<': $2, '>': $3):"
  cat "$2.fused.diff"
  exit 1
fi
echo "no contracted products: $(wc -l < "$2.fused") functions with fused multiply-adds, the same in both builds"
