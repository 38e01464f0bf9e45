#!/usr/bin/env bash
# A dry run of the GPU session scripts on a machine without a GPU (a CTest,
# bench_gpu_session_dry_run): they run only when a GPU is lent, so what can be checked without
# one is checked here.
# 1. Every script under bench/cuda parses (bash -n).
# 2. gpu_session.sh's tests phase on a staged folder of stub device tests that pass: the
#    phase passes, session.txt says so, and the archive holds the tests' summary.
# 3. The same with a stub that never ends, stopped by a TERM to gpu_session.sh: session.txt
#    says so, the archive is written, and no process of the phase is left running.
# Exit status 0 when all hold; each failure is printed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
failures=0
fail() {
  echo "FAILED: $*"
  failures=$((failures + 1))
}

for s in bench/cuda/*.sh; do
  bash -n "$s" || fail "$s does not parse"
done

tmp="$(mktemp -d)"
trap 'pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
stage() {  # folder, then the body of each stub test
  mkdir -p "$1/tests/cuda" "$1/tests/numeric"
  printf '#!/bin/sh\n%s\n' "$2" > "$1/tests/cuda/test_cuda_stub"
  printf '#!/bin/sh\necho passed\n' > "$1/tests/numeric/test_numeric_device"
  chmod +x "$1/tests/cuda/test_cuda_stub" "$1/tests/numeric/test_numeric_device"
}
archive_lists() {  # out folder, then a pattern the archive must list
  local a
  a="$(ls "$1"/results.tar.* 2>/dev/null | head -n 1)"
  # grep without -q reads the whole list: tar is never cut off by a closed pipe (pipefail)
  [[ -n "$a" ]] && tar tf "$a" | grep "$2" > /dev/null
}

# 2. A phase that passes.
stage "$tmp/pass" 'echo "stub test ran"; exit 0'
BUILD="$tmp/pass" OUT="$tmp/out_pass" PHASES=tests bash bench/cuda/gpu_session.sh > "$tmp/pass.log" 2>&1
rc=$?
((rc == 0)) || fail "gpu_session.sh on passing stubs: exit $rc (log: $(tail -n 5 "$tmp/pass.log"))"
grep -q '^tests: exit 0' "$tmp/out_pass/session.txt" 2>/dev/null || fail "session.txt does not say the tests passed"
archive_lists "$tmp/out_pass" 'tests/tests.txt' || fail "the archive does not hold tests/tests.txt"

# 3. A phase that never ends, stopped from outside.
stage "$tmp/hang" 'while :; do sleep 1; done'
BUILD="$tmp/hang" OUT="$tmp/out_hang" PHASES=tests bash bench/cuda/gpu_session.sh > "$tmp/hang.log" 2>&1 &
session=$!
sleep 4
kill -TERM "$session"
wait "$session"
rc=$?
((rc == 124)) || fail "gpu_session.sh stopped by TERM: exit $rc, not 124"
grep -q 'stopped by a signal' "$tmp/out_hang/session.txt" 2>/dev/null || fail "session.txt does not say it was stopped"
archive_lists "$tmp/out_hang" 'session.txt' || fail "no archive after the stop"
sleep 1
pgrep -f "$tmp/hang/" > /dev/null && fail "a process of the stopped phase is still running"

if ((failures == 0)); then
  echo "session_dry_run.sh: the session scripts parse, a passing phase passes, a stopped call packs and stops its phase"
fi
exit $((failures != 0))
