#!/usr/bin/env python3
"""Compile-time cost of precis's policy maps and models.

Compiles pairs of sources with each compiler, several times, and prints the best wall
time and peak compiler memory of each and the difference:
- bench/compile_time/baseline.cpp (the policy headers alone) against
  bench/compile_time/policy_map_64.cpp (64 layer overrides, every layer resolved);
- bench/compile_time/nn_baseline.cpp (all of precis, no model) against
  bench/compile_time/vit_b_blueprint.cpp (a 12-block ViT-B blueprint built from a map
  with a dozen layer overrides), in three stages: nn::build alone; with describe; with
  describe and one forward and backward pass.

    python3 bench/compile_time.py [--runs 3] [--compiler g++ --compiler clang++] [--csv out.csv]
"""
import argparse
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def compile_once(compiler, source, flags=()):
    start = time.perf_counter()
    proc = subprocess.run(
        [compiler, "-std=c++20", "-O2", "-c", "-I", os.path.join(ROOT, "include"), *flags,
         source, "-o", os.devnull],
        capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{compiler} failed on {source}:\n{proc.stderr}")
    # ru_maxrss of children is the largest child's peak, in KiB on Linux; measure() runs
    # each compile from a fresh interpreter, so it is this compile's peak.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return elapsed, peak


def measure(compiler, source, runs, flags=()):
    # A fresh interpreter per measurement, so ru_maxrss is this compile's alone.
    code = ("import sys; sys.path.insert(0, %r); import compile_time as c; "
            "t, m = c.compile_once(%r, %r, %r); print(t, m)") % (HERE, compiler, source, tuple(flags))
    best_t, best_m = float("inf"), None
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split()
        t, m = float(out[0]), int(out[1])
        if t < best_t:
            best_t, best_m = t, m
    return best_t, best_m


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--compiler", action="append")
    parser.add_argument("--csv")
    args = parser.parse_args()
    compilers = args.compiler or ["g++", "clang++"]
    pairs = [("policy_map_64_layers", "baseline.cpp", "policy_map_64.cpp", ()),
             ("vit_b16_build", "nn_baseline.cpp", "vit_b_blueprint.cpp", ("-DPRECIS_BENCH_STAGE=1",)),
             ("vit_b16_build_describe", "nn_baseline.cpp", "vit_b_blueprint.cpp", ("-DPRECIS_BENCH_STAGE=2",)),
             ("vit_b16_build_describe_step", "nn_baseline.cpp", "vit_b_blueprint.cpp",
              ("-DPRECIS_BENCH_STAGE=3",))]
    rows = []
    for cxx in compilers:
        baselines = {}
        for what, base, case, flags in pairs:
            if base not in baselines:
                baselines[base] = measure(cxx, os.path.join(HERE, "compile_time", base), args.runs)
            base_t, base_m = baselines[base]
            case_t, case_m = measure(cxx, os.path.join(HERE, "compile_time", case), args.runs, flags)
            rows.append((cxx, what, base_t, case_t, case_t - base_t, base_m / 1024, case_m / 1024))
    print(f"{'compiler':10} {'case':30} {'baseline s':>10} {'case s':>8} {'extra s':>8} "
          f"{'baseline MiB':>12} {'case MiB':>9}")
    for cxx, what, bt, ct, dt, bm, cm in rows:
        print(f"{cxx:10} {what:30} {bt:10.2f} {ct:8.2f} {dt:8.2f} {bm:12.0f} {cm:9.0f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("compiler,case,baseline_s,case_s,extra_s,baseline_mib,case_mib\n")
            for r in rows:
                f.write(",".join(str(v) for v in r) + "\n")


if __name__ == "__main__":
    main()
