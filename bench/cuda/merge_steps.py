"""Merges precis's step times on a GPU with PyTorch's into the tables of bench/results/cuda/.

    merge_steps.py vit PRECIS_CSV TORCH_LOG OUT      (run_vit_on_gpu.sh: vit_gpu.csv)
    merge_steps.py dbnet PRECIS_CSV TORCH_LOG OUT    (run_dbnet_on_gpu.sh: dbnet_gpu.csv)
    merge_steps.py --self-test

PRECIS_CSV is bench_vit_gpu's or bench_dbnet_gpu's --csv (config,policy,precis_ms,
precis_peak_mib,gpu, ...). TORCH_LOG holds the `RESULT,config,precision,compiled,median_ms,
peak_mib` lines of the torch_reference.py runs (the run scripts put the config after RESULT),
where `compiled` is 0 for an eager step and otherwise torch.compile's mode ("default",
"reduce-overhead", "max-autotune"; 1, from older logs, is "default").

Each precis row gets torch's step under the same map: fp32 and tf32 as such, bf16_mixed (and
the ViT's bf16_mixed_pieces and fp8_hybrid, torch having no float8 step here) as AMP bf16,
fp16_mixed (and DBNet's fp16_fp32_head) as AMP fp16. A policy with `_graph` appended (precis's
step as a CUDA graph) takes its map's torch figures, as does DBNet's `_nhwc` (channels-last),
from torch's channels_last runs (precision `-nhwc`). torch_compile_ms is the fastest of the
compiled modes that ran; every compiled mode's time is written beside OUT as
`<OUT without .csv>_compile_modes.csv` (config,precision,mode,median_ms) and the mode chosen
for each row is printed, so that a table says which torch.compile it was measured against.
torch_peak_mib is the eager step's. A figure that was not measured is left empty.
"""
import csv
import os
import sys
import tempfile

HEADERS = {
    "vit": ["config", "policy", "precis_ms", "torch_eager_ms", "torch_compile_ms", "precis_peak_mib", "torch_peak_mib",
            "gpu"],
    "dbnet": ["config", "policy", "precis_ms", "torch_ms", "torch_compile_ms", "lightning_ms", "precis_peak_mib",
              "torch_peak_mib", "gpu"],
}
TORCH_NAME = {
    "vit": {"fp32": "fp32", "tf32": "tf32", "bf16_mixed": "bf16", "bf16_mixed_pieces": "bf16", "fp16_mixed": "fp16",
            "fp8_hybrid": "bf16"},
    "dbnet": {"fp32": "fp32", "tf32": "tf32", "bf16_mixed": "bf16", "fp16_mixed": "fp16", "fp16_fp32_head": "fp16"},
}
LIGHTNING_NAME = {"fp32": "lightning-32-true", "bf16_mixed": "lightning-bf16-mixed",
                  "fp16_mixed": "lightning-16-mixed", "fp16_fp32_head": "lightning-16-mixed"}


def read_torch(lines):
    """{(config, precision): {"eager": (ms, peak), "modes": {mode: ms}}} from the RESULT lines."""
    found = {}
    for line in lines:
        if not line.startswith("RESULT,"):
            continue
        fields = line.strip().split(",")
        if len(fields) != 6:  # a run cut off mid-line: its other lines still count
            print(f"merge_steps.py: skipped a RESULT line of {len(fields)} fields, not 6: {line.strip()}",
                  file=sys.stderr)
            continue
        _, config, precision, compiled, ms, peak = fields
        entry = found.setdefault((config, precision), {"eager": None, "modes": {}})
        if compiled == "0":
            entry["eager"] = (ms, peak)
        else:
            entry["modes"]["default" if compiled == "1" else compiled] = ms
    return found


def fastest(modes):
    """The mode with the smallest time, and its time; ("", "") where none ran."""
    if not modes:
        return "", ""
    mode = min(modes, key=lambda m: float(modes[m]))
    return mode, modes[mode]


def merge(kind, precis_rows, torch):
    """The table's rows (without its header) and, per row, the compile mode chosen."""
    rows, chosen = [], []
    for r in precis_rows:
        base = r["policy"].removesuffix("_graph")
        nhwc = kind == "dbnet" and base.endswith("_nhwc")
        base = base.removesuffix("_nhwc") if nhwc else base
        if base not in TORCH_NAME[kind]:
            raise SystemExit(f"merge_steps.py: no torch counterpart for the map {r['policy']}")
        entry = torch.get((r["config"], TORCH_NAME[kind][base] + ("-nhwc" if nhwc else "")), {})
        eager = entry.get("eager") or ("", "")
        mode, compiled = fastest(entry.get("modes", {}))
        chosen.append(mode)
        if kind == "vit":
            rows.append([r["config"], r["policy"], r["precis_ms"], eager[0], compiled, r["precis_peak_mib"], eager[1],
                         r["gpu"]])
        else:
            lightning = torch.get((r["config"], LIGHTNING_NAME.get(base, "")), {}).get("eager") or ("", "")
            rows.append([r["config"], r["policy"], r["precis_ms"], eager[0], compiled, lightning[0],
                         r["precis_peak_mib"], eager[1], r["gpu"]])
    return rows, chosen


def write(kind, precis_csv, torch_log, out):
    precis_rows, torch, complete = [], {}, True
    # A side whose run failed or was cut off leaves its file missing: the other side's rows
    # are still worth writing (a missing precis CSV gives the table no rows, a missing torch
    # log empty torch columns), and the exit status says so.
    try:
        with open(precis_csv) as f:
            precis_rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"merge_steps.py: no precis rows ({e})", file=sys.stderr)
        complete = False
    try:
        with open(torch_log) as f:
            torch = read_torch(f)
    except OSError as e:
        print(f"merge_steps.py: no torch results ({e})", file=sys.stderr)
        complete = False
    rows, chosen = merge(kind, precis_rows, torch)
    with open(out, "w", newline="") as g:
        w = csv.writer(g)
        w.writerow(HEADERS[kind])
        w.writerows(rows)
    modes_csv = out.removesuffix(".csv") + "_compile_modes.csv"
    with open(modes_csv, "w", newline="") as g:
        w = csv.writer(g)
        w.writerow(["config", "precision", "mode", "median_ms"])
        for (config, precision), entry in sorted(torch.items()):
            for mode, ms in sorted(entry["modes"].items()):
                w.writerow([config, precision, mode, ms])
    with open(out) as f:
        print(f.read(), end="")
    for row, mode in zip(rows, chosen):
        if mode:
            print(f"{row[0]} {row[1]}: torch_compile_ms is torch.compile mode {mode}")
    return complete


def self_test():
    log = [
        "== vit-b16-224-b64 --sdpa",
        "RESULT,vit-b16-224-b64,fp32,0,160.0,10000.0",
        "RESULT,vit-b16-224-b64,bf16,0,42.0,9000.0",
        "RESULT,vit-b16-224-b64,bf16,default,30.0,",
        "RESULT,vit-b16-224-b64,bf16,reduce-overhead,28.5,",
        "RESULT,vit-b16-224-b64,bf16,max-autotune,29.0,",
        "RESULT,vit-w192-d6-p4-b128,bf16,1,9.0,",
        "some other line",
    ]
    torch = read_torch(log)
    assert torch[("vit-b16-224-b64", "bf16")]["eager"] == ("42.0", "9000.0")
    assert fastest(torch[("vit-b16-224-b64", "bf16")]["modes"]) == ("reduce-overhead", "28.5")
    assert torch[("vit-w192-d6-p4-b128", "bf16")]["modes"] == {"default": "9.0"}
    assert fastest({}) == ("", "")
    precis = [
        {"config": "vit-b16-224-b64", "policy": "bf16_mixed", "precis_ms": "40", "precis_peak_mib": "8000", "gpu": "H"},
        {"config": "vit-b16-224-b64", "policy": "bf16_mixed_graph", "precis_ms": "38", "precis_peak_mib": "8000",
         "gpu": "H"},
        {"config": "vit-b16-224-b64", "policy": "fp32", "precis_ms": "150", "precis_peak_mib": "20000", "gpu": "H"},
        {"config": "vit-b16-224-b64", "policy": "fp16_mixed", "precis_ms": "41", "precis_peak_mib": "8000", "gpu": "H"},
        {"config": "vit-w192-d6-p4-b128", "policy": "fp8_hybrid", "precis_ms": "5", "precis_peak_mib": "900",
         "gpu": "H"},
    ]
    rows, chosen = merge("vit", precis, torch)
    assert rows[0] == ["vit-b16-224-b64", "bf16_mixed", "40", "42.0", "28.5", "8000", "9000.0", "H"], rows[0]
    assert rows[1][1:5] == ["bf16_mixed_graph", "38", "42.0", "28.5"], rows[1]
    assert rows[2][3:5] == ["160.0", ""] and chosen[2] == "", rows[2]  # fp32: no compiled run
    assert rows[3][3:5] == ["", ""], rows[3]  # fp16: nothing measured, left empty
    assert rows[4][3:5] == ["", "9.0"] and chosen[4] == "default", rows[4]
    dlog = [
        "RESULT,dbnet-r18-640-b16,bf16,0,60.0,12000.0",
        "RESULT,dbnet-r18-640-b16,bf16,reduce-overhead,50.0,",
        "RESULT,dbnet-r18-640-b16,bf16-nhwc,0,45.0,11000.0",
        "RESULT,dbnet-r18-640-b16,lightning-bf16-mixed,0,65.0,12500.0",
        "RESULT,dbnet-r18-640-b16,lightning-16-mixed,0,66.0,12500.0",
    ]
    dprecis = [
        {"config": "dbnet-r18-640-b16", "policy": "bf16_mixed_nhwc_graph", "precis_ms": "40", "precis_peak_mib": "7000",
         "gpu": "H"},
        {"config": "dbnet-r18-640-b16", "policy": "bf16_mixed", "precis_ms": "44", "precis_peak_mib": "7000",
         "gpu": "H"},
        {"config": "dbnet-r18-640-b16", "policy": "fp16_fp32_head", "precis_ms": "47", "precis_peak_mib": "7000",
         "gpu": "H"},
    ]
    drows, _ = merge("dbnet", dprecis, read_torch(dlog))
    assert drows[0] == ["dbnet-r18-640-b16", "bf16_mixed_nhwc_graph", "40", "45.0", "", "65.0", "7000", "11000.0",
                        "H"], drows[0]
    assert drows[1][3:6] == ["60.0", "50.0", "65.0"], drows[1]
    assert drows[2][3:6] == ["", "", "66.0"], drows[2]
    # A line cut off mid-run is skipped; the complete lines around it still count.
    cut = read_torch(["RESULT,a,b,0,1", "RESULT,vit-b16-224-b64,bf16,0,42.0,9000.0"])
    assert cut == {("vit-b16-224-b64", "bf16"): {"eager": ("42.0", "9000.0"), "modes": {}}}, cut
    try:
        merge("vit", [dict(precis[0], policy="fp64")], torch)
    except SystemExit:
        pass
    else:
        raise AssertionError("a map with no torch counterpart was accepted")
    # The whole path through files: the table's header, and the modes written beside it.
    with tempfile.TemporaryDirectory() as d:
        p, t, o = (os.path.join(d, n) for n in ("precis.csv", "torch.txt", "vit_gpu.csv"))
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, ["config", "policy", "precis_ms", "precis_peak_mib", "gpu"])
            w.writeheader()
            w.writerows(precis)
        with open(t, "w") as f:
            f.write("\n".join(log) + "\n")
        assert write("vit", p, t, o)
        with open(o) as f:
            table = list(csv.reader(f))
        assert table[0] == HEADERS["vit"] and len(table) == 1 + len(precis), table
        with open(os.path.join(d, "vit_gpu_compile_modes.csv")) as f:
            modes = list(csv.reader(f))
        assert modes[0] == ["config", "precision", "mode", "median_ms"] and len(modes) == 5, modes
        # torch's run failed: precis's rows with empty torch columns, and an incomplete merge.
        assert not write("vit", p, os.path.join(d, "missing.txt"), o)
        with open(o) as f:
            table = list(csv.reader(f))
        assert len(table) == 1 + len(precis) and table[1][3:5] == ["", ""], table
    print("merge_steps.py: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    if len(sys.argv) != 5 or sys.argv[1] not in HEADERS:
        raise SystemExit("usage: merge_steps.py vit|dbnet PRECIS_CSV TORCH_LOG OUT, or merge_steps.py --self-test")
    sys.exit(0 if write(*sys.argv[1:]) else 1)


if __name__ == "__main__":
    main()
