#!/usr/bin/env python3
"""The performance tables of the docs, made from the CSVs in bench/results/.

A page holds a table between two markers,

    <!-- generated: NAME -->
    ...
    <!-- end generated -->

and docs/tools/check_docs.py checks that what lies between them is render(NAME) (--fix
writes it). Nothing in a table is typed by hand: a new benchmark run that rewrites a CSV
changes the docs through `check_docs.py --fix`.

    python3 docs/tools/perf_tables.py            the names of the tables
    python3 docs/tools/perf_tables.py NAME       one table, as Markdown
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"

# Where bench/results/README.md records the machine of a CSV that has no column naming it.
EPYC_512 = "2 vCPUs of an AMD EPYC (AVX-512, AVX512-BF16)"
EPYC_AVX2 = "2 vCPUs of an AMD EPYC (AVX2, no AVX-512)"
XEON_SPR = "2 vCPUs of an Intel Xeon (Sapphire Rapids: AVX-512, AMX)"


class TableError(Exception):
    """A table that cannot be made: an unknown name, a missing CSV or column."""


def read(path: str) -> list[dict[str, str]]:
    p = RESULTS / path
    if not p.is_file():
        raise TableError(f"bench/results/{path} does not exist")
    with p.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise TableError(f"bench/results/{path} has no rows")
    return rows


def col(row: dict[str, str], name: str, path: str) -> str:
    if name not in row:
        raise TableError(f"bench/results/{path} has no column '{name}'")
    return row[name]


def markdown(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """A Markdown table; the columns in `right` (default: all but the first) align right."""
    right = set(range(1, len(header))) if right is None else right
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def source(paths: list[str], machine: str | None = None) -> str:
    # Relative to the repository's root; render() makes them relative to the page.
    files = ", ".join(f"[`bench/results/{p}`](bench/results/{p})" for p in paths)
    return f"From {files}" + (f"; {machine}." if machine else ".")


def num(text: str, digits: int) -> str:
    try:
        return f"{float(text):.{digits}f}"
    except ValueError:
        return text


def span(values: list[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else \
        f"{lo:.{digits}f}-{hi:.{digits}f}"


def kib(text: str) -> str:
    return f"{float(text) / 1024:.0f} KiB"


# ---- the tables -------------------------------------------------------------------------


def policy_sweep() -> str:
    path = "policy_sweep/summary.csv"
    rows = [[col(r, "policy", path), num(col(r, "test_loss", path), 4),
             f"{100 * float(col(r, 'test_accuracy', path)):.2f}%", r["skipped_steps"],
             num(r["final_scale"], 0), num(r["ms_per_step"], 2), kib(r["param_bytes"]),
             kib(r["optimizer_bytes"]), kib(r["activation_bytes"])] for r in read(path)]
    return "\n".join([
        markdown(["policy", "test loss", "accuracy", "skipped", "final scale", "ms/step",
                  "params", "optimizer", "activations"], rows),
        "", source([path], EPYC_512 + ", `./run.sh demo`")])


def torch_kernels() -> str:
    path = "cpu/torch_kernels.csv"
    groups: dict[tuple[str, str, str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    shapes: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    for r in read(path):
        key = (col(r, "cpu", path), col(r, "isa", path).split(";")[0], col(r, "kernel", path),
               col(r, "dtype", path))
        groups[key][col(r, "threads", path)].append(float(col(r, "ratio", path)))
        shapes[key].add(col(r, "shape", path))
    rows = []
    for key in sorted(groups):
        cpu, isa, kernel, dtype = key
        t = groups[key]
        rows.append([f"{cpu} ({isa.removeprefix('precis ')})", f"`{kernel}`", dtype,
                     str(len(shapes[key])), span(t["1"]) if "1" in t else "-",
                     span(t["2"]) if "2" in t else "-"])
    return "\n".join([
        markdown(["CPU (precis's kernels)", "kernel", "dtype", "shapes", "1 thread",
                  "2 threads"], rows, right={3, 4, 5}),
        "", "Ratio = torch time / precis time (above 1: precis is faster), lowest-highest over "
        "the shapes; `float32_hardware` is precis's fp32_hardware policy against torch's "
        "float32.", source([path], "torch 2.15 from PyPI on the same CPU, "
                           "`bench/torch_kernels.py`")])


def step_comparison(paths: list[str]) -> str:
    rows = []
    for path in paths:
        for r in read(path):
            rows.append([col(r, "precision", path), col(r, "config", path).split(";")[0],
                         r["threads"], r["batch"], num(r["precis_ms_per_step"], 1),
                         num(r["torch_ms_per_step"], 1), num(r["ratio"], 2),
                         r["cpu"].split(" (")[0]])
    return "\n".join([
        markdown(["policy", "model", "threads", "batch", "precis ms", "torch ms",
                  "torch / precis", "CPU"], rows, right={2, 3, 4, 5, 6}),
        "", source(paths, "torch 2.15 on the same CPU; the bf16 rows are precis's bf16_mixed "
                   "against torch's autocast to bfloat16, fp32_hardware against torch's float32")])


def vit_torch() -> str:
    return step_comparison(["vit/torch_comparison.csv"])


def dbnet_torch() -> str:
    return step_comparison(["dbnet/torch_comparison.csv", "dbnet/torch_comparison_spr.csv"])


def training(paths: list[str], metric: str, label: str) -> str:
    rows = []
    for path in paths:
        for r in read(path):
            rows.append([col(r, "policy", path), r["epochs"],
                         f"{100 * float(col(r, metric, path)):.2f}%", r["skipped_steps"],
                         num(r["final_scale"], 0), num(r["ms_per_step"], 1),
                         num(r["peak_rss_mib"], 0), r["cpu"].split(" (")[0]])
    return "\n".join([
        markdown(["policy", "epochs", label, "skipped steps", "final scale", "ms/step",
                  "peak RSS MiB", "CPU"], rows, right={1, 2, 3, 4, 5, 6}),
        "", source(paths)])


def vit_training() -> str:
    return training(["vit/summary.csv", "vit/spr/summary.csv"], "test_accuracy", "test accuracy")


def dbnet_training() -> str:
    return training(["dbnet/summary.csv", "dbnet/advised/summary.csv"], "hmean", "H-mean")


def gemm() -> str:
    path = "gemm.csv"
    rows = [[r["n"], r["threads"], num(col(r, "precis bf16 GF/s", path), 1),
             num(r["oneDNN bf16 GF/s"], 1), num(r["bf16/oneDNN"], 2), num(r["bf16/fp32"], 2),
             num(r["precis fp32 GF/s"], 1), num(r["sgemm GF/s"], 1), num(r["exact/sgemm"], 2)]
            for r in read(path)]
    return "\n".join([
        markdown(["n (square)", "threads", "bf16 GF/s", "oneDNN bf16 GF/s", "bf16 / oneDNN",
                  "bf16 / fp32", "fp32 GF/s", "OpenBLAS sgemm GF/s", "fp32 / sgemm"], rows),
        "", source([path], EPYC_512 + ", `bench_gemm`")])


def conv() -> str:
    path = "conv.csv"
    rows = [[r["layer"], r["threads"], num(col(r, "precis bf16 GF/s", path), 1),
             num(r["oneDNN bf16 own layouts GF/s"], 1), num(r["bf16/oneDNN own layouts"], 2),
             num(r["bf16/fp32"], 2), num(r["precis fp32 GF/s"], 1), num(r["oneDNN f32 GF/s"], 1),
             num(r["exact/oneDNN f32"], 2)] for r in read(path)]
    return "\n".join([
        markdown(["ResNet-18 layer", "threads", "bf16 GF/s", "oneDNN bf16 GF/s",
                  "bf16 / oneDNN", "bf16 / fp32", "fp32 GF/s", "oneDNN f32 GF/s",
                  "fp32 / oneDNN"], rows, right={1, 2, 3, 4, 5, 6, 7, 8}),
        "", source([path], EPYC_512 + ", batch 2, NCHW, `bench_conv`; oneDNN's bf16 in its "
                   "own blocked layouts")])


def nn_block() -> str:
    path = "nn_block.csv"
    rows = [[col(r, "policy", path), r["batch"], r["threads"], num(r["by_hand_ms"], 2),
             num(r["build_ms"], 2), num(r["ratio"], 3)] for r in read(path)]
    return "\n".join([
        markdown(["policy", "batch", "threads", "by hand ms", "nn::build ms",
                  "by hand / build"], rows),
        "", source([path], EPYC_512 + ", a ResNet-18 basic block forward and backward, "
                   "`bench_nn_block`")])


def convert() -> str:
    path = "convert.csv"
    rows = [[col(r, "conversion", path), num(r["precis ms"], 2), num(r["CUDA host ms"], 2),
             num(r["time / memcpy"], 2)] for r in read(path)]
    return "\n".join([
        markdown(["conversion (16M values)", "precis ms", "CUDA's host functions ms",
                  "precis / memcpy of the floats"], rows),
        "", source([path], EPYC_512 + ", `bench_convert`")])


def unscale() -> str:
    path = "unscale.csv"
    rows = [[col(r, "gradients", path), r["tensors"], r["MiB"], num(r["unscale ms"], 2),
             num(r["memcpy ms"], 2), num(r["fraction of memcpy bandwidth"], 2)]
            for r in read(path)]
    return "\n".join([
        markdown(["gradients", "tensors", "MiB", "unscale ms", "memcpy ms",
                  "fraction of memcpy bandwidth"], rows),
        "", source([path], EPYC_512 + ", `bench_unscale`")])


def compile_time() -> str:
    path = "compile_time.csv"
    rows = [[col(r, "compiler", path), f"`{r['case']}`", num(r["baseline_s"], 2),
             num(r["case_s"], 2), num(r["extra_s"], 2), num(r["case_mib"], 0)]
            for r in read(path)]
    return "\n".join([
        markdown(["compiler", "case", "headers alone s", "with the case s", "extra s",
                  "peak MiB"], rows),
        "", source([path], EPYC_512 + ", `bench/compile_time.py`")])


GPU_DIRS = ["cuda", "cuda/h100", "cuda/h100_rerun"]


def gpu_name(folder: str) -> str:
    p = RESULTS / folder / "device.txt"
    if not p.is_file():
        raise TableError(f"bench/results/{folder}/device.txt does not exist")
    lines = p.read_text(encoding="utf-8").split("\n")
    return lines[1].split(",")[0].strip()


def cuda_table(suffix: str, first: str, columns: list[tuple[str, str, int]],
               folders: list[str] = GPU_DIRS) -> str:
    rows, paths = [], []
    for folder in folders:
        path = f"{folder}/bench_cuda.csv{suffix}"
        paths.append(path)
        for r in read(path):
            rows.append([gpu_name(folder), col(r, first, path)] +
                        [num(col(r, c, path), d) for c, _, d in columns])
    return "\n".join([markdown(["GPU", first] + [h for _, h, _ in columns], rows),
                      "", source(paths, "`bench/cuda/run_on_gpu.sh`")])


def cuda_gemm() -> str:
    return cuda_table("", "product", [("TFLOP/s", "TFLOP/s", 1),
                                      ("vs direct cuBLASLt", "vs cuBLASLt called directly", 3),
                                      ("vs fp32", "vs exact fp32", 2), ("vs tf32", "vs TF32", 2)])


def cuda_bandwidth() -> str:
    # The latest run of every memory-bound kernel (bench/results/cuda/README.md says which
    # commit each folder measured).
    return cuda_table(".bandwidth.csv", "kernel (8192 x 4096)",
                      [("GB/s", "GB/s", 0),
                       ("fraction of copy bandwidth", "fraction of copy bandwidth", 2)],
                      ["cuda/wave3c"])


def cuda_conv() -> str:
    return cuda_table(".conv.csv", "ResNet-18 conv stack (batch 32)",
                      [("ms", "ms", 3), ("vs fp32", "vs exact fp32", 2),
                       ("vs tf32", "vs TF32", 2)])


def cuda_unscale() -> str:
    return cuda_table(".unscale.csv", "gradients",
                      [("MiB", "MiB", 0), ("unscale GB/s", "GB/s", 0),
                       ("fraction of copy bandwidth", "fraction of copy bandwidth", 2)])


TABLES = {f.__name__: f for f in [
    policy_sweep, torch_kernels, vit_torch, dbnet_torch, vit_training, dbnet_training, gemm,
    conv, nn_block, convert, unscale, compile_time, cuda_gemm, cuda_bandwidth, cuda_conv,
    cuda_unscale]}


def render(name: str, page: Path | None = None) -> str:
    """Table `name` as Markdown, its links relative to `page` (a file in the repository;
    None: relative to the repository's root)."""
    if name not in TABLES:
        raise TableError(f"no table '{name}' (docs/tools/perf_tables.py has: "
                         f"{', '.join(TABLES)})")
    up = len(page.resolve().parent.relative_to(ROOT).parts) if page is not None else 0
    return TABLES[name]().replace("](bench/results/", "](" + "../" * up + "bench/results/") + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 1:
        print("\n".join(TABLES))
    else:
        for name in sys.argv[1:]:
            print(render(name))
