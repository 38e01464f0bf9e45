"""precis against PyTorch on the same CPU: ms per DBNet training step, fp32 and bf16; or, with
--layouts, precis's step with NCHW against channels-last (NHWC) images.

    python3 bench/dbnet/compare.py --example build/gcc/examples/example_dbnet [--threads 2]
                                   [--steps 10] [--out bench/results/dbnet/torch_comparison.csv]
    python3 bench/dbnet/compare.py --example build/gcc/examples/example_dbnet --layouts
                                   [--out bench/results/dbnet/layout_cpu.csv]

Runs, one after the other on an otherwise idle machine, `example_dbnet --time` (policies fp32,
fp32_hardware and bf16_mixed, on a batch of the synthetic set) and torch_reference.py's `time` (the same
model and loss on random data of the same shape; bf16: autocast to bfloat16, the loss in
float) for the example's configuration (width 16, inner 64, 256 x 256 images, batch 8) and
ResNet-18's widths (width 64, inner 256, batch 4). Each side reports the median of `steps`
timed steps after 3 warm-up steps. Writes the CSV with the ViT comparison's header
(bench/vit/compare.py): ratio = torch / precis (above 1: precis is faster); a bf16 row
compares with the faster of torch's fp32 and bf16 steps.

--layouts runs `example_dbnet --time` with `--layout nchw` and with `--layout nhwc` instead (no
torch) and writes config,policy,nchw_ms,nhwc_ms,nchw_over_nhwc,threads,cpu (nchw_over_nhwc
above 1: channels-last is faster).
"""
import argparse
import csv
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vit"))
from compare import comparison_rows, cpu_description, run, write_comparison  # noqa: E402

CONFIGS = [  # name, width, inner, size, batch
    ("width16-inner64-256px", 16, 64, 256, 8),
    ("width64-inner256-256px", 64, 256, 256, 4),
]
POLICIES = "fp32,fp32_hardware,bf16_mixed"


def layout_rows(name, threads, nchw, nhwc, cpu):
    """One row per policy: the median step with NCHW and with NHWC images."""
    rows = []
    for policy in ("fp32", "fp32_hardware", "bf16"):
        a, b = nchw[policy], nhwc[policy]
        rows.append([name, "bf16_mixed" if policy == "bf16" else policy, f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}",
                     threads, cpu])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--example", required=True, help="path of precis's example_dbnet")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layouts", action="store_true", help="NCHW against NHWC instead of precis against torch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or ("bench/results/dbnet/layout_cpu.csv" if args.layouts
                       else "bench/results/dbnet/torch_comparison.csv")
    here = os.path.dirname(os.path.abspath(__file__))
    cpu = cpu_description()
    print("CPU:", cpu, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as data:
        for name, width, inner, size, batch in CONFIGS:
            sizes = ["--width", str(width), "--inner", str(inner), "--size", str(size), "--batch", str(batch),
                     "--threads", str(args.threads)]
            example = [args.example, "--time", str(args.steps), "--policy", POLICIES, "--train", str(batch), "--val",
                       "1", "--out", data] + sizes
            if args.layouts:
                nchw, _ = run(example + ["--layout", "nchw"])
                nhwc, _ = run(example + ["--layout", "nhwc"])
                rows += layout_rows(name, args.threads, nchw, nhwc, cpu)
                continue
            p, _ = run(example)
            t, version = run([sys.executable, os.path.join(here, "torch_reference.py"), "time", "--steps",
                              str(args.steps)] + sizes)
            rows += comparison_rows(name, args.threads, batch, p, t, cpu, version)
    if args.layouts:
        with open(out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["config", "policy", "nchw_ms", "nhwc_ms", "nchw_over_nhwc", "threads", "cpu"])
            w.writerows(rows)
        print(open(out).read(), end="")
        print("wrote", out)
    else:
        write_comparison(out, rows)


if __name__ == "__main__":
    main()
