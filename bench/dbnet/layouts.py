"""precis's DBNet training step with NCHW and with channels-last (NHWC) images on the same CPU.

    python3 bench/dbnet/layouts.py --example build/gcc/examples/example_dbnet [--threads 2]
                                   [--steps 10] [--out bench/results/dbnet/layout_cpu.csv]

Runs, one after the other on an otherwise idle machine, `example_dbnet --time` with
`--layout nchw` and `--layout nhwc` (policies fp32, fp32_hardware and bf16_mixed, on a batch
of the synthetic set) for the configurations of compare.py: the example's (width 16, inner
64, 256 x 256 images, batch 8) and ResNet-18's widths (width 64, inner 256, batch 4). Each
reports the median of `steps` timed steps after 3 warm-up steps. Writes
config,policy,nchw_ms,nhwc_ms,nchw_over_nhwc,threads,cpu (nchw_over_nhwc above 1: channels-last
is faster).
"""
import argparse
import csv
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vit"))
from compare import cpu_description, run  # noqa: E402

from compare_configs import CONFIGS  # noqa: E402  (bench/dbnet/compare_configs.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--example", required=True, help="path of precis's example_dbnet")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="bench/results/dbnet/layout_cpu.csv")
    args = ap.parse_args()
    cpu = cpu_description()
    print("CPU:", cpu, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as data:
        for name, width, inner, size, batch in CONFIGS:
            sizes = ["--width", str(width), "--inner", str(inner), "--size", str(size), "--batch", str(batch),
                     "--threads", str(args.threads)]
            ms = {}
            for layout in ("nchw", "nhwc"):
                ms[layout], _ = run([args.example, "--time", str(args.steps), "--policy",
                                     "fp32,fp32_hardware,bf16_mixed", "--train", str(batch), "--val", "1", "--out",
                                     data, "--layout", layout] + sizes)
            for policy in ("fp32", "fp32_hardware", "bf16"):
                a, b = ms["nchw"][policy], ms["nhwc"][policy]
                rows.append([name, "bf16_mixed" if policy == "bf16" else policy, f"{a:.1f}", f"{b:.1f}",
                             f"{a / b:.2f}", args.threads, cpu])
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "policy", "nchw_ms", "nhwc_ms", "nchw_over_nhwc", "threads", "cpu"])
        w.writerows(rows)
    print(open(args.out).read(), end="")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
