"""The DBNet example's model and loss in PyTorch, for the side-by-side speed comparison.

    torch_reference.py time [--width 16 --inner 64 --size 256 --batch 8] [--threads 2]
                            [--steps 10] [--precision fp32|bf16|both]

The model is examples/dbnet/model.hpp's: ResNet-18's layout with `width` channels in the
first stage (7x7/2 stem, BN, ReLU, 3x3/2 max pool; four stages of two basic blocks, a 1x1/2
projection with BN where the width or resolution changes), an FPN neck (1x1 laterals to
`inner` channels, nearest 2x upsampling added top-down, 3x3 smoothing to inner / 4, upsampled
to 1/4 and concatenated finest first) and two heads (3x3 conv, BN, ReLU, 2x2/2 transposed
conv, BN, ReLU, 2x2/2 transposed conv to one channel; the threshold head ends in a sigmoid).
The loss is examples/dbnet/loss.hpp's (MhLiao's L1BalanceCELoss): 5 x balanced BCE with
logits and hard negatives (at most 3 per positive, top-k over the batch), 1 x dice on
B = 1 / (1 + exp(-50 (sigmoid(logits) - T))), 10 x masked L1 on T.

A training step is forward, loss, backward and AdamW (weight decay 1e-4), as the example's.
bf16 runs the model under torch.autocast('cpu', dtype=torch.bfloat16) and the loss in float
(the outputs cast to float, as the example's rules do), as PyTorch users train in mixed
precision on the CPU. The inputs are random images and targets with a tenth of the pixels
text (the step's time does not depend on the values). Prints one line per precision: the
best and the median ms per step of `steps` timed steps after 3 warm-up steps, with the
torch version and the ISA PyTorch reports.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv_a = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn_a = nn.BatchNorm2d(cout)
        self.conv_b = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn_b = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn_b(self.conv_b(F.relu(self.bn_a(self.conv_a(x)))))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


def head(inner):
    q = inner // 4
    return nn.Sequential(nn.Conv2d(inner, q, 3, padding=1, bias=False), nn.BatchNorm2d(q), nn.ReLU(),
                         nn.ConvTranspose2d(q, q, 2, 2), nn.BatchNorm2d(q), nn.ReLU(),
                         nn.ConvTranspose2d(q, 1, 2, 2))


class DBNet(nn.Module):
    def __init__(self, width=16, inner=64):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.stages = nn.ModuleList([
            nn.Sequential(BasicBlock(w, w, 1), BasicBlock(w, w, 1)),
            nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w, 1)),
            nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w, 1)),
            nn.Sequential(BasicBlock(4 * w, 8 * w, 2), BasicBlock(8 * w, 8 * w, 1)),
        ])
        self.laterals = nn.ModuleList([nn.Conv2d(c, inner, 1, bias=False) for c in (w, 2 * w, 4 * w, 8 * w)])
        self.smooth = nn.ModuleList([nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False) for _ in range(4)])
        self.prob = head(inner)
        self.thresh = head(inner)

    def forward(self, x):
        x = self.stem(x)
        levels = []
        for s in self.stages:
            x = s(x)
            levels.append(x)
        p = [lat(c) for lat, c in zip(self.laterals, levels)]
        for i in (2, 1, 0):
            p[i] = p[i] + F.interpolate(p[i + 1], scale_factor=2, mode="nearest")
        fused = torch.cat([F.interpolate(sm(pi), scale_factor=2 ** i, mode="nearest") if i else sm(pi)
                           for i, (sm, pi) in enumerate(zip(self.smooth, p))], dim=1)
        return self.prob(fused), torch.sigmoid(self.thresh(fused))


def db_loss(logits, t, gt, mask, tmap, tmask):
    bce = F.binary_cross_entropy_with_logits(logits, gt, reduction="none")
    pos, neg = gt * mask, (1 - gt) * mask
    pc = int(pos.sum())
    nc = min(int(neg.sum()), pc * 3)
    hard, _ = (bce * neg).view(-1).topk(nc)
    balance = ((bce * pos).sum() + hard.sum()) / (pc + nc + 1e-6)
    b = torch.reciprocal(1 + torch.exp(-50 * (torch.sigmoid(logits) - t)))
    dice = 1 - 2 * (b * gt * mask).sum() / ((b * mask).sum() + (gt * mask).sum() + 1e-6)
    l1 = (torch.abs(t - tmap) * tmask).sum() / tmask.sum()
    return 5 * balance + dice + 10 * l1


def time_steps(args, precision):
    torch.manual_seed(0)
    model = DBNet(args.width, args.inner)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    n, s = args.batch, args.size
    x = torch.randn(n, 3, s, s)
    gt = (torch.rand(n, 1, s, s) < 0.1).float()
    mask = (torch.rand(n, 1, s, s) < 0.95).float()
    tmap = 0.3 + 0.4 * torch.rand(n, 1, s, s)
    tmask = (torch.rand(n, 1, s, s) < 0.3).float()

    def step():
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, t = model(x)
            loss = db_loss(logits.float(), t.float(), gt, mask, tmap, tmask)
        else:
            logits, t = model(x)
            loss = db_loss(logits, t, gt, mask, tmap, tmask)
        loss.backward()
        opt.step()

    for _ in range(3):
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
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--inner", type=int, default=64)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    isa = torch.backends.cpu.get_cpu_capability()
    for precision in (["fp32", "bf16"] if args.precision == "both" else [args.precision]):
        best, median = time_steps(args, precision)
        print(f"torch {torch.__version__} ({isa}) {precision}: width {args.width} inner {args.inner} size {args.size} "
              f"batch {args.batch} threads {args.threads}: best {best:.1f} ms/step, median {median:.1f} ms/step",
              flush=True)


if __name__ == "__main__":
    main()
