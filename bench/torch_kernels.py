#!/usr/bin/env python3
"""precis's CPU kernels against PyTorch's on the same CPU, same shapes, same thread count.

Runs bench_torch_kernels (precis's side) for each thread count, times the same operation in
PyTorch (from PyPI, in a virtual environment: never a dependency of precis) the same way
(warm-up of at least 50 ms, then best of N), and writes one CSV row per kernel, shape,
dtype and thread count:

    kernel,shape,dtype,threads,precis_ms,torch_ms,ratio,cpu,isa

ratio = torch_ms / precis_ms: above 1, precis is faster. For conv2d (precis's NCHW images)
PyTorch runs NCHW and channels-last and its faster time is kept (its best layout); for
conv2d_nhwc (precis's channels-last images) PyTorch runs channels-last. The max pooling
rows take PyTorch's faster layout too (its NCHW max pooling is much the slower one):
max_pool2d is the pooling alone, max_pool2d_indices the training forward pass that also
keeps each maximum's index (torch's max_pool2d_with_indices), and max_pool2d_backward the
backward pass from those indices on both sides (max_pool2d_with_indices_backward), as a
training step runs them. adamw is one optimizer step
over R tensors of C float weights against torch.optim.AdamW with its defaults.
conv2d_backward and conv2d_nhwc_backward time both backward passes (dx and dw) against
torch.ops.aten.convolution_backward, as autograd calls it, in the same layouts. dtype float32 is precis's
exact fp32 (the reference), float32_hardware its fp32_hardware (oneDNN's float products,
gemm and conv2d only), both against torch's float32. --append keeps the rows already in
the CSV (another machine's), replacing those of the same kernel, shape, dtype, thread
count, CPU and isa; --kernels limits a run to some kernels. `isa` is what precis's kernels
were compiled for, the engine of bf16_mixed's hardware products, the instruction set
torch's kernels dispatched to, and ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS where
they are set. An AVX2 machine's paths can be measured on an AVX-512 one: precis built with
-march=x86-64-v3 and PRECIS_NATIVE=OFF, and both run under ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 (torch's float matmul is MKL's,
which the first two do not limit).

    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy
    /tmp/torchenv/bin/python bench/torch_kernels.py \\
        --precis build/gcc/bench/bench_torch_kernels --csv bench/results/cpu/torch_kernels.csv
"""
import argparse
import csv
import os
import re
import subprocess
import sys
import time


def best_ms(f, reps):
    """As precis_bench::best_ms: settle, warm up for 50 ms, then the best of reps calls."""
    time.sleep(0.3)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        f()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def torch_time(torch, kernel, shape, dtype, reps):
    F = torch.nn.functional
    # float32_hardware: precis's fp32_hardware (oneDNN's float products) against torch's float32.
    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float32_hardware": torch.float32}[dtype]
    g = torch.Generator().manual_seed(11)

    def rand(*s):
        return (torch.rand(*s, generator=g) * 2 - 1).to(dt)

    with torch.no_grad():
        if kernel == "gemm":
            m, n, k = (int(v) for v in shape.split("x"))
            a, b = rand(m, k), rand(k, n)
            return best_ms(lambda: torch.mm(a, b), reps)
        if kernel in ("conv2d", "conv2d_nhwc", "conv2d_backward", "conv2d_nhwc_backward"):
            d = {k: int(v) for k, v in re.findall(r"([a-z]+)(\d+)", shape)}
            x = rand(d["n"], d["c"], d["h"], d["h"])
            w = rand(d["co"], d["c"], d["k"], d["k"])
            st, pad = [d["s"]] * 2, [d["p"]] * 2

            def timed(layout):
                xl, wl = x.contiguous(memory_format=layout), w.contiguous(memory_format=layout)
                if not kernel.endswith("_backward"):
                    return best_ms(lambda: F.conv2d(xl, wl, stride=st, padding=pad), reps)
                y = F.conv2d(xl, wl, stride=st, padding=pad)
                dy = rand(*y.shape).contiguous(memory_format=layout)
                # dx and dw, as autograd asks for them (no bias).
                back = torch.ops.aten.convolution_backward
                return best_ms(lambda: back(dy, xl, wl, None, st, pad, [1, 1], False, [0, 0], 1,
                                            [True, True, False]), reps)

            last = timed(torch.channels_last)
            if "nhwc" in kernel:
                return last
            return min(timed(torch.contiguous_format), last)
        if kernel in ("max_pool2d", "max_pool2d_indices", "max_pool2d_backward"):
            d = {k: int(v) for k, v in re.findall(r"([a-z]+)(\d+)", shape)}
            args = ([d["k"]] * 2, [d["s"]] * 2, [d["p"]] * 2)
            times = []
            for layout in (torch.contiguous_format, torch.channels_last):  # its best layout
                x = rand(d["n"], d["c"], d["h"], d["h"]).contiguous(memory_format=layout)
                if kernel == "max_pool2d":
                    times.append(best_ms(lambda: F.max_pool2d(x, *args), reps))
                    continue
                with_indices = torch.ops.aten.max_pool2d_with_indices
                if kernel == "max_pool2d_indices":
                    times.append(best_ms(lambda: with_indices(x, *args), reps))
                    continue
                # Training keeps the forward pass's indices: the backward pass only scatters.
                y, idx = with_indices(x, *args)
                dy = rand(*y.shape).contiguous(memory_format=layout)
                back = torch.ops.aten.max_pool2d_with_indices_backward
                times.append(best_ms(lambda: back(dy, x, *args, [1, 1], False, idx), reps))
            return min(times)
        r, c = (int(v) for v in shape.split("x"))
        if kernel == "adamw":
            # torch.optim.AdamW as constructed by default (on the CPU its for-loop form).
            params = [torch.nn.Parameter(rand(c)) for _ in range(r)]
            for p in params:
                p.grad = rand(c) * 1e-2
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
            return best_ms(opt.step, reps)
        x = rand(r, c)
        if kernel == "softmax":
            return best_ms(lambda: torch.softmax(x, -1), reps)
        if kernel == "layer_norm":
            gamma, beta = rand(c), rand(c)
            return best_ms(lambda: F.layer_norm(x, (c,), gamma, beta), reps)
        if kernel == "gelu":
            return best_ms(lambda: F.gelu(x), reps)
        if kernel == "cross_entropy":
            t = torch.arange(r, dtype=torch.int64) * 7 % c  # as bench_torch_kernels
            return best_ms(lambda: F.cross_entropy(x, t), reps)
    raise ValueError(f"unknown kernel {kernel}")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precis", required=True, help="path of the bench_torch_kernels executable")
    ap.add_argument("--csv", help="where to write the CSV (default: print only)")
    ap.add_argument("--append", action="store_true",
                    help="add the rows to an existing --csv (another CPU's, say) instead of replacing it")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--quick", action="store_true", help="a few small shapes only")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--kernels", help="only these kernels, comma-separated (gemm, conv2d, softmax, ...)")
    args = ap.parse_args()
    import torch  # after argument parsing: --help works without torch

    rows = []
    isa_line = ""
    for threads in (int(t) for t in args.threads.split(",")):
        cmd = [args.precis, "--threads", str(threads)] + (["--quick"] if args.quick else [])
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stderr}")
        isa_line = run.stderr.strip()
        torch.set_num_threads(threads)
        for line in run.stdout.splitlines():
            kernel, shape, dtype, t, precis_ms = line.split(",")
            if args.kernels and kernel not in args.kernels.split(","):
                continue
            torch_ms = torch_time(torch, kernel, shape, dtype, args.reps)
            rows.append([kernel, shape, dtype, t, float(precis_ms), torch_ms])
            print(f"{kernel:10} {shape:32} {dtype:8} threads {t}: precis {float(precis_ms):9.4f} ms"
                  f"  torch {torch_ms:9.4f} ms  torch/precis {torch_ms / float(precis_ms):5.2f}",
                  flush=True)
    # "CPU: ...; precis kernels compiled for X; hardware products: Y" from precis's side.
    m = re.search(r"compiled for (.*?); hardware products: (.*)$", isa_line)
    isa = f"precis {m.group(1)}; products {m.group(2)}" if m else isa_line
    # torch's kernels by the instruction set it dispatched to (ATEN_CPU_CAPABILITY can lower
    # it, and ONEDNN_MAX_CPU_ISA its oneDNN's, to measure an AVX2 machine's paths).
    isa += f"; torch {torch.backends.cpu.get_cpu_capability()}"
    for var in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        if os.environ.get(var):
            isa += f"; {var}={os.environ[var]}"
    cpu = cpu_model()
    print(f"CPU: {cpu}; {isa}; torch {torch.__version__}")
    if args.csv:
        header = ["kernel", "shape", "dtype", "threads", "precis_ms", "torch_ms", "ratio", "cpu", "isa"]
        kept = []
        if args.append and os.path.exists(args.csv):
            with open(args.csv, newline="") as f:
                kept = list(csv.reader(f))
            if not kept or kept[0] != header:
                sys.exit(f"{args.csv} does not start with the header {','.join(header)}; not appending")
            # Rows measured again (same kernel, shape, dtype, threads, CPU and isa) are replaced.
            cpu_isa = [cpu, isa]
            again = {tuple(r[:4]) for r in rows}
            kept = [r for r in kept[1:] if not (tuple(r[:4]) in again and r[7:9] == cpu_isa)]
        tmp = args.csv + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(kept)
            for k, s, d, t, p, q in rows:
                w.writerow([k, s, d, t, f"{p:.4f}", f"{q:.4f}", f"{q / p:.3f}", cpu, isa])
        os.replace(tmp, args.csv)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
