"""precis against PyTorch on the same CPU: ms per DBNet training step, fp32 and bf16.

    python3 bench/dbnet/compare.py --example build/gcc/examples/example_dbnet [--threads 2]
                                   [--steps 10] [--out bench/results/dbnet/torch_comparison.csv]

Runs, one after the other on an otherwise idle machine, `example_dbnet --time` (policies fp32,
fp32_hardware and bf16_mixed, on a batch of the synthetic set) and torch_reference.py's `time` (the same
model and loss on random data of the same shape; bf16: autocast to bfloat16, the loss in
float) for the example's configuration (width 16, inner 64, 256 x 256 images, batch 8) and
ResNet-18's widths (width 64, inner 256, batch 4). Each side reports the median of `steps`
timed steps after 3 warm-up steps. Writes the CSV with the ViT comparison's header
(bench/vit/compare.py): ratio = torch / precis (above 1: precis is faster); a bf16 row
compares with the faster of torch's fp32 and bf16 steps.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vit"))
from compare import comparison_rows, cpu_description, run, write_comparison  # noqa: E402

from compare_configs import CONFIGS  # noqa: E402  (bench/dbnet/compare_configs.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--example", required=True, help="path of precis's example_dbnet")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="bench/results/dbnet/torch_comparison.csv")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    cpu = cpu_description()
    print("CPU:", cpu, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as data:
        for name, width, inner, size, batch in CONFIGS:
            sizes = ["--width", str(width), "--inner", str(inner), "--size", str(size), "--batch", str(batch),
                     "--threads", str(args.threads)]
            p, _ = run([args.example, "--time", str(args.steps), "--policy", "fp32,fp32_hardware,bf16_mixed", "--train",
                        str(batch), "--val", "1", "--out", data] + sizes)
            t, version = run([sys.executable, os.path.join(here, "torch_reference.py"), "time", "--steps",
                              str(args.steps)] + sizes)
            rows += comparison_rows(name, args.threads, batch, p, t, cpu, version)
    write_comparison(args.out, rows)


if __name__ == "__main__":
    main()
