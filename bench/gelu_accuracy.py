#!/usr/bin/env python3
"""PyTorch's float32 GELU (exact erf form, approximate='none') against float64, in ulps.

The kernel comparison (torch_kernels.py) times precis's float GELU at a fraction of
PyTorch's speed. This script shows what PyTorch's speed buys: for 2 million evenly
spaced float32 values in each range (both ends included) it prints the largest error of
torch.nn.functional.gelu in float32 ulps of the float64 value x * erfc(-x / sqrt 2) / 2,
and the largest relative error, where the float64 value is a normal float. precis's
float GELU (kernels/cpu/vec_math.hpp) is within 6 ulps over the whole float range, tails
included: tests/kernels/test_vec_math.cpp checks every bfloat16 and float16 input and a
million random floats, and prints its measured maximum.

    /path/to/venv/bin/python bench/gelu_accuracy.py
"""
import math

import torch


def ulp_of(r):
    """The spacing of float32 values at |r| (float64 tensor of normal float32 magnitudes)."""
    f = r.abs().float()
    return (torch.nextafter(f, torch.tensor(float("inf"))) - f).double()


def main():
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'range of x':>14} {'max ulps':>12} {'max rel. error':>15}  at x")
    for lo, hi in [(-13.0, -5.0), (-5.0, -3.0), (-3.0, -1.0), (-1.0, 0.0), (0.0, 3.0), (3.0, 13.0)]:
        x = torch.linspace(lo, hi, 2_000_001, dtype=torch.float32)
        y = torch.nn.functional.gelu(x).double()
        xd = x.double()
        ref = xd * 0.5 * torch.special.erfc(-xd / math.sqrt(2))
        normal = ref.abs() >= 2.0**-126
        ulps = torch.where(normal, (y - ref).abs() / ulp_of(ref), torch.zeros_like(ref))
        rel = torch.where(normal, (y - ref).abs() / ref.abs(), torch.zeros_like(ref))
        i = int(torch.argmax(ulps))
        print(f"[{lo:5.1f}, {hi:5.1f}) {ulps[i].item():12.4g} {rel.max().item():15.3g}  {x[i].item():.5f}")


if __name__ == "__main__":
    main()
