#!/usr/bin/env python3
"""Writes the golden trajectories that tests/optim/test_torch_bits.cpp compares precis with.

Runs torch.optim.SGD / torch.optim.AdamW (foreach=True, the default on the CPU for
tensors of one device) and torch's GradScaler update (torch._amp_update_scale_) on float32
tensors and records, for every step, a 64-bit hash of the weights' bits (or the scale's
bits), plus every weight after the last step. Weights and gradients are generated from
an integer hash, as exactly representable floats, by the same formula as the C++ test, so
the files stay small and the tests need no torch.

    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch
    /tmp/torchenv/bin/python tests/data/torch_golden/make_golden.py

It also checks, and writes into each file's header, whether torch's other
implementations (foreach=False, fused=True) give the same bits as the recorded ones.

One of torch's operations is not IEEE arithmetic: torch.sqrt on float32 CPU tensors (2.15,
x86-64 PyPI wheel; neither ATEN_CPU_CAPABILITY=default nor MKL's dispatch variables change
it) differs from the correctly rounded square root by one ulp on about 20% of inputs: it
rounds an approximation that is up to about 0.3 ulp off. AdamW takes the square root of its
second moment, so its trajectory is recorded with torch._foreach_sqrt replaced by the
correctly rounded square root (numpy's), everything else torch's own code; each AdamW
file's header says how far unmodified torch is from it.
"""
import os
import platform
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MASK = (1 << 64) - 1
SIZES = [37, 64]  # one tensor that leaves a scalar tail after the vector loop, one that does not
STEPS = 300


def mix(x):
    """splitmix64's finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def value(seed, step, tensor, index, max_exp):
    """A float32 value: 0 with probability 1/64, else m * 2^-(23 + e), |m| < 2^23, e < max_exp."""
    h = mix(mix(mix(seed + step) + tensor) + index)
    if (h >> 4) & 63 == 0:
        return 0.0
    m = (h >> 40) - (1 << 23)
    e = h % max_exp
    return m * 2.0 ** -(23 + e)


def tensors(seed, step, max_exp):
    return [torch.tensor([value(seed, step, t, i, max_exp) for i in range(n)], dtype=torch.float32)
            for t, n in enumerate(SIZES)]


def fnv(words, h=0xCBF29CE484222325):
    for w in words:
        h = ((h ^ w) * 0x100000001B3) & MASK
    return h


def bits(ts):
    out = []
    for t in ts:
        out += t.contiguous().view(torch.int32).tolist()
    return [w & 0xFFFFFFFF for w in out]


# name, optimizer, hyperparameters (Python floats, as a PyTorch user writes them), which
# tensors take weight decay, seed
CONFIGS = [
    ("adamw_defaults", "adamw", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), [1, 1], 11),
    ("adamw_custom", "adamw", dict(lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1), [1, 0], 12),
    ("adamw_large_lr", "adamw", dict(lr=0.05, betas=(0.5, 0.9), eps=1e-4, weight_decay=0.3), [0, 1], 13),
    ("sgd_plain", "sgd", dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False), [1, 1], 21),
    ("sgd_momentum", "sgd", dict(lr=0.01, momentum=0.9, dampening=0.0, weight_decay=1e-4, nesterov=False), [1, 0], 22),
    ("sgd_nesterov", "sgd", dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=5e-4, nesterov=True), [1, 1], 23),
    ("sgd_dampening", "sgd", dict(lr=0.03, momentum=0.7, dampening=0.1, weight_decay=0.01, nesterov=False), [0, 1], 24),
]


def ieee_sqrt(ts):
    """The correctly rounded square root of each float32 tensor (numpy's sqrt is IEEE)."""
    return [torch.from_numpy(np.sqrt(t.detach().numpy())) for t in ts]


def torch_sqrt_error():
    """How many float32 square roots torch gets wrong, over 2^20 values in [0, 16)."""
    x = torch.rand(1 << 20, generator=torch.Generator().manual_seed(0)) * 16
    return int((torch.sqrt(x).numpy() != np.sqrt(x.numpy())).sum()), x.numel()


def run(kind, hp, decay, seed, **impl):
    params = [torch.nn.Parameter(t) for t in tensors(seed, 0, 4)]
    groups = [{"params": [p], "weight_decay": hp["weight_decay"] if d else 0.0} for p, d in zip(params, decay)]
    rest = {k: v for k, v in hp.items() if k != "weight_decay"}
    opt = (torch.optim.AdamW if kind == "adamw" else torch.optim.SGD)(groups, **rest, **impl)
    hashes = []
    for step in range(1, STEPS + 1):
        for p, g in zip(params, tensors(seed, step, 20)):
            p.grad = g
        opt.step()
        hashes.append(fnv(bits([p.detach() for p in params])))
    return hashes, bits([p.detach() for p in params])


def hexf(x):
    return float(x).hex()


def write(name, lines):
    with open(os.path.join(HERE, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def header():
    return [f"# written by tests/data/torch_golden/make_golden.py with torch {torch.__version__}",
            f"# on {platform.machine()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}"]


def optimizers():
    for name, kind, hp, decay, seed in CONFIGS:
        notes = []
        if kind == "adamw":
            # The golden trajectory: torch's AdamW code with an IEEE square root.
            original = torch._foreach_sqrt
            torch._foreach_sqrt = ieee_sqrt
            try:
                hashes, final = run(kind, hp, decay, seed, foreach=True)
            finally:
                torch._foreach_sqrt = original
            wrong, total = torch_sqrt_error()
            notes.append(f"# recorded with torch._foreach_sqrt replaced by an IEEE square root (torch.sqrt is "
                         f"not correctly rounded on {wrong} of {total} float32 values in [0, 16) here)")
            others = (("unmodified foreach=True", dict(foreach=True)), ("foreach=False", dict(foreach=False)),
                      ("fused=True", dict(fused=True)))
        else:
            hashes, final = run(kind, hp, decay, seed, foreach=True)
            others = (("foreach=False", dict(foreach=False)), ("fused=True", dict(fused=True)))
        for label, impl in others:
            try:
                other, _ = run(kind, hp, decay, seed, **impl)
                same = sum(a == b for a, b in zip(hashes, other))
                notes.append(f"# torch {label}: {'same bits at every step' if same == STEPS else f'same bits at {same} of {STEPS} steps'}")
            except (RuntimeError, TypeError, ValueError) as e:  # an implementation this build lacks
                notes.append(f"# torch {label}: not available ({str(e).splitlines()[0]})")
        lines = header() + notes + [f"optimizer {kind}", f"seed {seed}", f"steps {STEPS}",
                                    "sizes " + " ".join(map(str, SIZES)), "decay " + " ".join(map(str, decay))]
        if kind == "adamw":
            lines += [f"lr {hexf(hp['lr'])}", f"beta1 {hexf(hp['betas'][0])}", f"beta2 {hexf(hp['betas'][1])}",
                      f"eps {hexf(hp['eps'])}", f"weight_decay {hexf(hp['weight_decay'])}"]
        else:
            lines += [f"lr {hexf(hp['lr'])}", f"momentum {hexf(hp['momentum'])}",
                      f"dampening {hexf(hp['dampening'])}", f"weight_decay {hexf(hp['weight_decay'])}",
                      f"nesterov {int(hp['nesterov'])}"]
        lines += [f"hash {h:016x}" for h in hashes]
        lines += ["final " + " ".join(f"{w:08x}" for w in final)]
        write(name, lines)
        print(name, *[n[2:] for n in notes])


# GradScaler's update: name, init scale, growth factor, backoff factor, growth interval, seed,
# and how rarely a step finds an inf (one in N, from the hash), so the scale moves both ways.
SCALERS = [
    ("scaler_defaults", 65536.0, 2.0, 0.5, 20, 31, 16),
    ("scaler_inexact_factors", 1000.3, 1.5, 0.7, 3, 32, 4),
    ("scaler_tenth", 3.0e5, 1.1, 0.1, 1, 33, 32),
]
SCALER_STEPS = 400


def scalers():
    for name, init, growth, backoff, interval, seed, one_in in SCALERS:
        scale = torch.tensor([init], dtype=torch.float32)
        tracker = torch.zeros(1, dtype=torch.int32)
        lines = header() + [f"init_scale {hexf(torch.tensor(init).float().item())}", f"growth_factor {hexf(growth)}",
                            f"backoff_factor {hexf(backoff)}", f"growth_interval {interval}", f"seed {seed}",
                            f"inf_one_in {one_in}", f"steps {SCALER_STEPS}"]
        for step in range(1, SCALER_STEPS + 1):
            found = 1.0 if mix(seed + step) % one_in == 0 else 0.0
            torch._amp_update_scale_(scale, tracker, torch.tensor([found]), growth, backoff, interval)
            lines.append(f"scale {int(found)} {scale.view(torch.int32).item() & 0xFFFFFFFF:08x}")
        write(name, lines)
        print(name)


if __name__ == "__main__":
    torch.set_num_threads(1)
    optimizers()
    scalers()
    sys.exit(0)
