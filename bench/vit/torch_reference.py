"""The example's Vision Transformer in PyTorch, for the side-by-side speed comparison.

    torch_reference.py time [--width 64 --heads 4 --depth 4 --patch 4 --batch 128]
                            [--threads 2] [--steps 20] [--precision fp32|bf16|both]

The model is examples/vit/model.hpp's: patchify + linear patch embedding, a learned class
token, learned positions, `depth` pre-norm blocks (layer norm, multi-head self-attention,
residual, layer norm, GELU (erf) MLP of ratio 4, residual), final layer norm, a linear head
on the class token, on 28 x 28 one-channel images and 10 classes. A training step is
forward, cross-entropy, backward and AdamW, as the example's; bf16 runs under
torch.autocast('cpu', dtype=torch.bfloat16), as PyTorch users train in mixed precision on
the CPU. Prints one line per precision: the best and the median ms per step of `steps`
timed steps after 5 warm-up steps, with the torch version and the ISA oneDNN reports.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        n, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).reshape(n, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, image=28, patch=4, channels=1, width=64, heads=4, depth=4, classes=10):
        super().__init__()
        self.patch = patch
        tokens = (image // patch) ** 2 + 1
        self.patch_embed = nn.Linear(channels * patch * patch, width)
        self.cls = nn.Parameter(torch.empty(1, 1, width).uniform_(-0.02, 0.02))
        self.pos = nn.Parameter(torch.empty(1, tokens, width).uniform_(-0.02, 0.02))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        n, c, hh, ww = x.shape
        p = self.patch
        # [N, C, H, W] -> [N, (H/p)(W/p), C p p], patches in row-major order, (c, i, j) inside.
        x = x.reshape(n, c, hh // p, p, ww // p, p).permute(0, 2, 4, 1, 3, 5).reshape(n, -1, c * p * p)
        x = self.patch_embed(x)
        x = torch.cat([self.cls.expand(n, -1, -1), x], dim=1) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


def time_steps(args, precision):
    torch.manual_seed(0)
    model = ViT(patch=args.patch, width=args.width, heads=args.heads, depth=args.depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(args.batch, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - t0))
    return min(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["time"])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    isa = torch.backends.cpu.get_cpu_capability()
    for precision in (["fp32", "bf16"] if args.precision == "both" else [args.precision]):
        best, median = time_steps(args, precision)
        print(f"torch {torch.__version__} ({isa}) {precision}: width {args.width} heads {args.heads} depth "
              f"{args.depth} patch {args.patch} batch {args.batch} threads {args.threads}: "
              f"best {best:.1f} ms/step, median {median:.1f} ms/step", flush=True)


if __name__ == "__main__":
    main()
