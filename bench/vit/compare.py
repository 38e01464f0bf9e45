"""precis against PyTorch on the same CPU: ms per ViT training step, fp32 and bf16.

    python3 bench/vit/compare.py --bench build/gcc/bench/bench_vit_step [--threads 2]
                                 [--steps 20] [--out bench/results/vit/torch_comparison.csv] [--append]

Runs, one after the other on an otherwise idle machine, precis's bench_vit_step and
torch_reference.py's `time` for each configuration (the example's: width 64, 4 heads,
depth 4, patch 4, batch 128; ViT-Ti's width: 192, 3 heads, depth 6, patch 4, batch 128;
and the same with patch 2, batch 64), in fp32 and in bf16 (precis: bf16_mixed; torch:
autocast to bfloat16), and precis's fp32_hardware (fp32 with oneDNN's float products, the
kernels torch's float32 runs on) against torch's fp32. Each side reports the median of
`steps` timed steps after 5 warm-up steps. Writes the CSV with the header
precision,threads,batch,precis_ms_per_step,torch_ms_per_step,ratio,cpu,torch_version,config
where ratio = torch / precis (above 1: precis is faster) and a bf16 row compares with the
faster of torch's fp32 and bf16 steps (its config column says which).
"""
import argparse
import csv
import os
import re
import subprocess
import sys

CONFIGS = [  # name, bench_vit_step arguments, torch_reference arguments, batch
    ("width64-heads4-depth4-patch4", ["--config", "small", "--patch", "4", "--batch", "128"],
     ["--width", "64", "--heads", "4", "--depth", "4", "--patch", "4", "--batch", "128"], 128),
    ("width192-heads3-depth6-patch4", ["--config", "ti", "--patch", "4", "--batch", "128"],
     ["--width", "192", "--heads", "3", "--depth", "6", "--patch", "4", "--batch", "128"], 128),
    ("width192-heads3-depth6-patch2", ["--config", "ti", "--patch", "2", "--batch", "64"],
     ["--width", "192", "--heads", "3", "--depth", "6", "--patch", "2", "--batch", "64"], 64),
]
LINE = re.compile(r"^(precis|torch \S+ \((\S+)\)) (fp32|fp32_hardware|bf16): .* median ([0-9.]+) ms/step")


def cpu_description():
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    isa = [n for n, f in (("AVX-512", "avx512f"), ("AVX512-BF16", "avx512_bf16"), ("AVX512-FP16", "avx512_fp16"),
                          ("AMX-BF16", "amx_bf16")) if f in flags] or (["AVX2"] if "avx2" in flags else [])
    return f"{model} ({' '.join(isa)})"


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out, end="", flush=True)
    found, version = {}, ""
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            found[m.group(3)] = float(m.group(4))
            if m.group(1).startswith("torch"):
                version = m.group(1).split()[1] + " (" + m.group(2) + ")"
    return found, version


def comparison_rows(name, threads, batch, p, t, cpu, version):
    """The rows of one configuration: p and t map 'fp32' and 'bf16' (p also 'fp32_hardware') to
    precis's and torch's ms per step; fp32_hardware compares with torch's fp32, and the bf16 row
    with the faster of torch's two."""
    faster = "bf16" if t["bf16"] < t["fp32"] else "fp32"
    rows = [["fp32", threads, batch, p["fp32"], t["fp32"], t["fp32"] / p["fp32"], cpu, version, name]]
    if "fp32_hardware" in p:
        rows.append(["fp32_hardware", threads, batch, p["fp32_hardware"], t["fp32"],
                     t["fp32"] / p["fp32_hardware"], cpu, version, f"{name}; torch fp32"])
    rows.append(["bf16", threads, batch, p["bf16"], t[faster], t[faster] / p["bf16"], cpu, version,
                 f"{name}; torch {faster} (faster)"])
    return rows


HEADER = ["precision", "threads", "batch", "precis_ms_per_step", "torch_ms_per_step", "ratio", "cpu",
          "torch_version", "config"]


def write_comparison(out, rows, append=False):
    """Writes the rows atomically under the comparison's CSV header and prints them; with
    append, after the rows already in `out` (another machine's), whose header must match."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    kept = []
    if append and os.path.exists(out):
        with open(out, newline="") as f:
            kept = list(csv.reader(f))
        if not kept or kept[0] != HEADER:
            sys.exit(f"{out} does not start with the header {','.join(HEADER)}; not appending")
        kept = kept[1:]
    tmp = out + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(kept)
        for r in rows:
            w.writerow([r[0], r[1], r[2], f"{r[3]:.1f}", f"{r[4]:.1f}", f"{r[5]:.2f}", r[6], r[7], r[8]])
    os.replace(tmp, out)
    print("wrote", out)
    for r in rows:
        print(f"{r[8]:<60} {r[0]}: precis {r[3]:7.1f} ms, torch {r[4]:7.1f} ms, torch/precis {r[5]:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of precis's bench_vit_step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="bench/results/vit/torch_comparison.csv")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in --out (another machine's) and add these")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    cpu = cpu_description()
    print("CPU:", cpu, flush=True)
    rows = []
    for name, precis_args, torch_args, batch in CONFIGS:
        common = ["--threads", str(args.threads), "--steps", str(args.steps)]
        p, _ = run([args.bench, "--precision", "all"] + precis_args + common)
        t, version = run([sys.executable, os.path.join(here, "torch_reference.py"), "time"] + torch_args + common)
        rows += comparison_rows(name, args.threads, batch, p, t, cpu, version)
    write_comparison(args.out, rows, args.append)


if __name__ == "__main__":
    main()
