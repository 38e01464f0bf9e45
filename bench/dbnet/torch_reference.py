"""The DBNet example's model and loss in PyTorch (and Lightning), for the side-by-side speed
comparison on the CPU and on a GPU.

    torch_reference.py time [--width 16 --inner 64 --size 256 --batch 8] [--threads 2]
                            [--steps 10] [--warmup 3] [--precision fp32|bf16|both|LIST]
                            [--device cpu|cuda] [--compile [MODE]] [--channels-last]
    torch_reference.py lightning [the same sizes] [--steps 20] [--warmup 5]
                                 [--precision 32-true|bf16-mixed|16-mixed|LIST]

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
On the CPU, bf16 runs the model under torch.autocast('cpu', dtype=torch.bfloat16) and the
loss in float (the outputs cast to float, as the example's rules do). On `--device cuda`:
autocast on the GPU for bf16 and fp16 (fp16 with a GradScaler), TF32 convolutions and
matmuls for tf32, exact float for fp32, the loss in float; the hard negatives are taken
without a host synchronisation (the negatives' terms sorted on the device and the first
min(negatives, 3 positives) summed, where the reference reads the counts on the host with
int()); the device synchronised around each timed step; the peak of
torch.cuda.max_memory_reserved() (run one precision per process for a per-precision
figure: the caching allocator keeps what an earlier run reserved). `--compile [MODE]` times the
model under torch.compile in MODE (default, reduce-overhead or max-autotune:
bench/torch_compile.py; `compiled` in the RESULT line is the mode, or 0 for eager);
`--channels-last` puts the model and the images in
torch.channels_last (NHWC), PyTorch's layout for tensor-core convolutions, and names the
precision with `-nhwc` appended in its lines. The inputs are random images and targets with a tenth of the
pixels text (the step's time does not depend on the values). Prints one line per precision:
the best and the median ms per step of `steps` timed steps after the warm-up steps, with the
torch version and the ISA or GPU, and a `RESULT,precision,compiled,median_ms,peak_mib` line
for scripts.

`lightning` trains the same model and loss as a LightningModule with Lightning's Trainer on
one GPU under `precision` ("32-true", "bf16-mixed", "16-mixed": the seed's own system), on
one batch kept on the device, and times each training step between the batch hooks, the
device synchronised, after the warm-up steps; it prints the same lines, the precision named
`lightning-<precision>`.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_compile  # noqa: E402 (bench/torch_compile.py)


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


def db_loss_device(logits, t, gt, mask, tmap, tmask):
    """db_loss without a host synchronisation: the hard negatives are the first
    min(negatives, 3 positives) of the negatives' terms sorted on the device (the other pixels'
    terms are 0 there and sort after them, adding nothing)."""
    bce = F.binary_cross_entropy_with_logits(logits, gt, reduction="none")
    pos, neg = gt * mask, (1 - gt) * mask
    pc = pos.sum()
    nc = torch.minimum(neg.sum(), pc * 3)
    ranked, _ = (bce * neg).view(-1).sort(descending=True)
    kept = torch.arange(ranked.numel(), device=ranked.device) < nc
    balance = ((bce * pos).sum() + (ranked * kept).sum()) / (pc + nc + 1e-6)
    b = torch.reciprocal(1 + torch.exp(-50 * (torch.sigmoid(logits) - t)))
    dice = 1 - 2 * (b * gt * mask).sum() / ((b * mask).sum() + (gt * mask).sum() + 1e-6)
    l1 = (torch.abs(t - tmap) * tmask).sum() / tmask.sum()
    return 5 * balance + dice + 10 * l1


def batch_of(args, dev):
    n, s = args.batch, args.size
    x = torch.randn(n, 3, s, s, device=dev)
    gt = (torch.rand(n, 1, s, s, device=dev) < 0.1).float()
    mask = (torch.rand(n, 1, s, s, device=dev) < 0.95).float()
    tmap = 0.3 + 0.4 * torch.rand(n, 1, s, s, device=dev)
    tmask = (torch.rand(n, 1, s, s, device=dev) < 0.3).float()
    return x, gt, mask, tmap, tmask


def set_tf32(allowed):
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed


def time_steps(args, precision):
    """Best and median ms per step and the peak device memory in MiB (None on the CPU)."""
    torch.manual_seed(0)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        set_tf32(precision == "tf32")
    model = DBNet(args.width, args.inner).to(dev)
    x, gt, mask, tmap, tmask = batch_of(args, dev)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    run = torch_compile.compiled(model, args.compile)
    loss_of = db_loss_device if cuda else db_loss
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def step():
        torch_compile.begin_step(args.compile)
        opt.zero_grad(set_to_none=True)
        if autocast is not None:
            with torch.autocast(dev.type, dtype=autocast):
                logits, t = run(x)
            loss = loss_of(logits.float(), t.float(), gt, mask, tmap, tmask)
        else:
            logits, t = run(x)
            loss = loss_of(logits, t, gt, mask, tmap, tmask)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(1000 * (time.perf_counter() - t0))
    peak = torch.cuda.max_memory_reserved() / 2**20 if cuda else None
    return min(times), statistics.median(times), peak


def time_lightning(args, precision):
    """Lightning's Trainer on one GPU under `precision`: best and median ms per step, the
    peak device memory in MiB."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    torch.manual_seed(0)
    set_tf32(False)
    dev = torch.device("cuda")
    batch = batch_of(args, dev)

    class System(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = DBNet(args.width, args.inner)

        def training_step(self, b, _):
            x, gt, mask, tmap, tmask = b
            logits, t = self.model(x)
            return db_loss_device(logits.float(), t.float(), gt, mask, tmap, tmask)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=1e-4)

    class OneBatch(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                yield batch

    class Timer(pl.Callback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_train_batch_start(self, trainer, module, b, i):
            torch.cuda.synchronize()
            if i == args.warmup:
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, module, out, b, i):
            torch.cuda.synchronize()
            if i >= args.warmup:
                self.times.append(1000 * (time.perf_counter() - self.t0))

    timer = Timer()
    trainer = pl.Trainer(accelerator="gpu", devices=1, precision=precision, max_steps=args.warmup + args.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[timer])
    loader = torch.utils.data.DataLoader(OneBatch(), batch_size=None)
    trainer.fit(System(), loader)
    return min(timer.times), statistics.median(timer.times), torch.cuda.max_memory_reserved() / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["time", "lightning"])
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--inner", type=int, default=64)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--precision", default=None,
                    help="time: fp32, tf32, bf16, fp16, both (fp32,bf16) or a list; lightning: 32-true, "
                         "bf16-mixed, 16-mixed or a list")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    torch_compile.add_option(ap)
    ap.add_argument("--channels-last", action="store_true",
                    help="time: the model and images in torch.channels_last (NHWC)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == "lightning":
        for precision in (args.precision or "32-true,bf16-mixed,16-mixed").split(","):
            if precision not in ("32-true", "bf16-mixed", "16-mixed"):
                raise SystemExit(f"--precision: Lightning's 32-true, bf16-mixed or 16-mixed, not {precision}")
            best, median, peak = time_lightning(args, precision)
            print(f"lightning {pl_version()} torch {torch.__version__} ({torch.cuda.get_device_name()}) {precision}: "
                  f"width {args.width} inner {args.inner} size {args.size} batch {args.batch}: best {best:.2f} "
                  f"ms/step, median {median:.2f} ms/step, peak {peak:.0f} MiB", flush=True)
            print(f"RESULT,lightning-{precision},0,{median:.4f},{peak:.1f}", flush=True)
        return
    precisions = ["fp32", "bf16"] if args.precision in (None, "both") else args.precision.split(",")
    for p in precisions:
        if p not in ("fp32", "tf32", "bf16", "fp16"):
            raise SystemExit(f"--precision: unknown precision {p}")
        if p in ("tf32", "fp16") and args.device != "cuda":
            raise SystemExit(f"--precision {p} is timed on --device cuda")
    where = torch.cuda.get_device_name() if args.device == "cuda" else torch.backends.cpu.get_cpu_capability()
    for precision in precisions:
        best, median, peak = time_steps(args, precision)
        memory = f", peak {peak:.0f} MiB" if peak is not None else ""
        compiled_tag = f" compiled ({args.compile})" if args.compile else ""
        digits = 2 if args.device == "cuda" else 1
        if args.channels_last:
            precision += "-nhwc"
        print(f"torch {torch.__version__} ({where}) {precision}{compiled_tag}: width "
              f"{args.width} inner {args.inner} size {args.size} batch {args.batch} threads {args.threads}: best "
              f"{best:.{digits}f} ms/step, median {median:.{digits}f} ms/step{memory}", flush=True)
        print(f"RESULT,{precision},{args.compile or 0},{median:.4f},{'' if peak is None else f'{peak:.1f}'}",
              flush=True)


def pl_version():
    try:
        import lightning
        return lightning.__version__
    except ImportError:
        import pytorch_lightning
        return pytorch_lightning.__version__


if __name__ == "__main__":
    main()
