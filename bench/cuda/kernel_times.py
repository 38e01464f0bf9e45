#!/usr/bin/env python3
"""Where a GPU step's time goes, kernel by kernel, from Nsight Compute's CSV.

    python3 bench/cuda/kernel_times.py NCU_CSV [--csv OUT] [--top N]
    python3 bench/cuda/kernel_times.py --self-test

NCU_CSV is what `ncu --csv --print-units base --metrics gpu__time_duration.sum` printed
(bench/cuda/profile_on_gpu.sh runs it on one step of a step benchmark). Each kernel's
duration is summed by family: the kernel's name without its template arguments and
parameters (precis's kernels by their function, cuBLASLt's and cuDNN's by their own names).
Prints the families by total time, each with its launches, total and mean microseconds and
share of the step, then the same by instantiation (template arguments kept: which
elementwise body, which types), and the longest single launches; --csv writes the families as
family,launches,total_us,mean_us,share. The total is the kernels' time alone: a step's wall
time also holds the gaps between launches.
"""

import argparse
import csv
import io
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"
UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


NAMESPACES = ("precis::detail::cuda::", "precis::nn::detail::", "precis::detail::", "precis::")


def family(name, fine=False):
    """The kernel's name without `void` and its parameters; without its template arguments,
    or (fine) with them, precis's namespaces left out: one row per instantiation."""
    n = name.strip()
    if n.startswith("void "):
        n = n[len("void "):]
    depth = 0
    out = []
    for ch in n:
        if ch == "<":
            depth += 1
            if fine:
                out.append(ch)
        elif ch == ">":
            depth -= 1
            if fine:
                out.append(ch)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0 or fine:
            out.append(ch)
    f = "".join(out).strip() or name.strip()
    if fine:
        for ns in NAMESPACES:
            f = f.replace(ns, "")
    return f


def read_launches(text):
    """(kernel name, nanoseconds) per launch from ncu's CSV, skipping its ==PROF== lines."""
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("==")]
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"') or l.startswith("ID,")), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    launches = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != METRIC:
            continue
        unit = row.get("Metric Unit", "nsecond").strip()
        if unit not in UNIT_NS:
            raise ValueError(f"unknown unit {unit!r} for {METRIC}")
        value = float(row["Metric Value"].replace(",", ""))
        launches.append((row["Kernel Name"], value * UNIT_NS[unit]))
    return launches


def summarise(launches, fine=False):
    """Families sorted by total time: (family, launches, total_ns)."""
    total = defaultdict(float)
    count = defaultdict(int)
    for name, ns in launches:
        f = family(name, fine)
        total[f] += ns
        count[f] += 1
    return sorted(((f, count[f], total[f]) for f in total), key=lambda r: (-r[2], r[0]))


def report(launches, top, out=sys.stdout):
    rows = summarise(launches)
    whole = sum(ns for _, ns in launches)
    print(f"{len(launches)} launches, {whole / 1e3:.1f} us of kernel time", file=out)
    print(f"{'family':<70} {'launches':>8} {'total us':>10} {'mean us':>9} {'share':>6}", file=out)
    for f, n, ns in rows[:top]:
        print(f"{f[:70]:<70} {n:>8} {ns / 1e3:>10.1f} {ns / n / 1e3:>9.2f} {ns / whole:>6.3f}", file=out)
    if len(rows) > top:
        rest = sum(ns for _, _, ns in rows[top:])
        print(f"{'(' + str(len(rows) - top) + ' more families)':<70} {'':>8} {rest / 1e3:>10.1f}", file=out)
    print("by instantiation:", file=out)
    for f, n, ns in summarise(launches, fine=True)[:top]:
        print(f"  {ns / 1e3:>10.1f} us {n:>6} x  {f[:110]}", file=out)
    print("longest launches:", file=out)
    for name, ns in sorted(launches, key=lambda l: -l[1])[: min(top, 10)]:
        print(f"  {ns / 1e3:>9.1f} us  {name[:110]}", file=out)
    return rows, whole


def write_csv(rows, whole, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["family", "launches", "total_us", "mean_us", "share"])
        for fam, n, ns in rows:
            w.writerow([fam, n, f"{ns / 1e3:.3f}", f"{ns / n / 1e3:.3f}", f"{ns / whole:.4f}"])


SAMPLE = """==PROF== Connected to process 1 (bench_vit_gpu)
==PROF== Profiling "softmax_resident": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","bench_vit_gpu","127.0.0.1","void precis::detail::cuda::softmax_resident<precis::detail::cuda::warp_per_row, float, float, (bool)0, (int)8, (int)8, precis::bfloat16, precis::bfloat16>(const T7 *, T8 *, unsigned long, unsigned long, bool)","1","7","(256, 1, 1)","(100, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,500"
"1","1","bench_vit_gpu","127.0.0.1","nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","40000"
"2","1","bench_vit_gpu","127.0.0.1","void precis::detail::cuda::softmax_resident<precis::detail::cuda::block_per_row, float, float, (bool)1, (int)8, (int)16, precis::bfloat16, precis::bfloat16>(const T7 *, T8 *, unsigned long, unsigned long, bool)","1","7","(256, 1, 1)","(100, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.5"
"2","1","bench_vit_gpu","127.0.0.1","void precis::detail::cuda::softmax_resident<precis::detail::cuda::block_per_row, float, float, (bool)1, (int)8, (int)16, precis::bfloat16, precis::bfloat16>(const T7 *, T8 *, unsigned long, unsigned long, bool)","1","7","(256, 1, 1)","(100, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum","byte","1000"
"""


def self_test():
    launches = read_launches(SAMPLE)
    assert len(launches) == 3, launches
    assert family(launches[0][0]) == "precis::detail::cuda::softmax_resident", family(launches[0][0])
    assert family("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN") == "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN"
    assert family("void f<(a<b)>(int)") != ""
    assert family(launches[2][0], fine=True).startswith("softmax_resident<block_per_row, float"), family(
        launches[2][0], fine=True)
    assert len(summarise(launches, fine=True)) == 3
    rows = summarise(launches)
    assert rows[0] == ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN", 1, 40000.0), rows
    assert rows[1] == ("precis::detail::cuda::softmax_resident", 2, 4000.0), rows  # 1,500 ns + 2.5 us
    sink = io.StringIO()
    _, whole = report(launches, 5, sink)
    assert whole == 44000.0 and "44.0 us of kernel time" in sink.getvalue(), sink.getvalue()
    try:
        read_launches("no header here\n")
    except ValueError:
        pass
    else:
        raise AssertionError("a file without ncu's header was accepted")
    print("kernel_times.py: self-test passed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ncu_csv", nargs="?")
    p.add_argument("--csv", help="write the families here")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.ncu_csv:
        p.error("give ncu's CSV (or --self-test)")
    with open(a.ncu_csv) as f:
        launches = read_launches(f.read())
    if not launches:
        print(f"kernel_times.py: no {METRIC} rows in {a.ncu_csv} (did ncu profile any kernel?)", file=sys.stderr)
        return 1
    rows, whole = report(launches, a.top)
    if a.csv:
        write_csv(rows, whole, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
