#!/usr/bin/env python3
"""Where the CI test stage's build time goes: seconds per translation unit.

Configures a build tree with the flags `./run.sh test` uses under CI (g++, -O2, the unit
tests at -Og, the examples at -O1, warnings as errors, CUDA off, benchmarks only checked),
with a compiler launcher that logs each compilation's wall time, builds it with 2 jobs, and
prints the CPU model, the total, the build's wall time, the seconds by group (tests, with
their precompiled headers; examples, header checks, bits_probe, bench) and the slowest units
(a precompiled header's unit is its .gch).
Run it on an otherwise idle machine: the figures are wall times of single compilations.

    python3 bench/build_times.py [--build build/build-times] [--jobs 2] [--top 20]
                                 [--test-optimization=-Og] [--example-optimization=-O1]
                                 [--test-pch ON|OFF]

(The two optimisation options take their values after "=", since a value starts with a dash.)

The build tree is new or reused; a reused tree is rebuilt from clean so that every unit is
timed.
"""
import argparse
import collections
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LAUNCHER = """#!/bin/sh
# Runs a compilation and appends "seconds object" to {log}.
start=$(date +%s.%N)
"$@"
rc=$?
end=$(date +%s.%N)
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "$(echo "$end - $start" | bc) $out" >> {log}
exit $rc
"""


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def group_of(target):
    if target.startswith(("example_", "precis_demo")):
        return "examples"
    if target.startswith("bench"):
        return "bench (checked only)"
    if target.startswith("bits_probe"):
        return "bits_probe"
    if target.startswith("test_headers_standalone"):
        return "header checks"
    if target.startswith(("test_", "precis_test_pch")):
        return "tests"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "build-times"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--test-optimization", default="-Og",
                    help="PRECIS_TEST_OPTIMIZATION, the unit tests' -O flag (CI's: -Og; '' for -O2)")
    ap.add_argument("--example-optimization", default="-O1",
                    help="PRECIS_EXAMPLE_OPTIMIZATION, the examples' -O flag (CI's: -O1; '' for -O2)")
    ap.add_argument("--test-pch", choices=["ON", "OFF"], default="ON",
                    help="PRECIS_TEST_PCH, the unit and compile-fail tests' precompiled headers (CI's: ON)")
    args = ap.parse_args()
    if shutil.which("bc") is None:
        sys.exit("bench/build_times.py: needs bc (apt-get install bc)")
    build = os.path.abspath(args.build)
    os.makedirs(build, exist_ok=True)
    log = os.path.join(build, "compile_times.txt")
    launcher = os.path.join(build, "time_compile.sh")
    with open(launcher, "w") as f:
        f.write(LAUNCHER.format(log=log))
    os.chmod(launcher, os.stat(launcher).st_mode | stat.S_IXUSR)
    subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_CXX_COMPILER=g++",
                    "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG",
                    "-DPRECIS_WERROR=ON", "-DPRECIS_CUDA=OFF", "-DPRECIS_BENCH_CHECK_ONLY=ON",
                    f"-DPRECIS_TEST_OPTIMIZATION={args.test_optimization}",
                    f"-DPRECIS_EXAMPLE_OPTIMIZATION={args.example_optimization}",
                    f"-DPRECIS_TEST_PCH={args.test_pch}",
                    f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", "clean"], check=True,
                   stdout=subprocess.DEVNULL)
    if os.path.exists(log):
        os.remove(log)
    start = time.monotonic()
    subprocess.run(["cmake", "--build", build, "--parallel", str(args.jobs)], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    units = []
    with open(log) as f:
        for line in f:
            seconds, obj = line.split(maxsplit=1)
            m = re.search(r"CMakeFiles/([^/]+)\.dir/(.*?)(\.o)?$", obj.strip())
            target, source = (m.group(1), m.group(2)) if m else ("?", obj.strip())
            units.append((float(seconds), target, source))
    groups = collections.defaultdict(lambda: [0.0, 0])
    for seconds, target, _ in units:
        g = groups[group_of(target)]
        g[0] += seconds
        g[1] += 1
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.jobs} jobs; "
          f"unit tests at {args.test_optimization or '-O2'}, "
          f"examples at {args.example_optimization or '-O2'}, "
          f"precompiled headers {args.test_pch}")
    print(f"total: {sum(u[0] for u in units):.0f} s of compilation in {len(units)} units; "
          f"the build took {wall:.0f} s")
    print("seconds,units,group")
    for name, (seconds, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        print(f"{seconds:.0f},{n},{name}")
    print("seconds,target,source")
    for seconds, target, source in sorted(units, reverse=True)[:args.top]:
        print(f"{seconds:.1f},{target},{source}")


if __name__ == "__main__":
    main()
