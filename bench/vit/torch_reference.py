"""The example's Vision Transformer in PyTorch: the side-by-side speed comparison, and the
weights and logits that tests/examples/test_vit_torch.cpp checks precis against.

    torch_reference.py time [--width 64 --heads 4 --depth 4 --patch 4 --batch 128]
                            [--threads 2] [--steps 20] [--precision fp32|bf16|both|LIST]
                            [--device cpu|cuda] [--compile [MODE]] [--image 28 --channels 1 --classes 10]
                            [--clip X] [--warmup 5]
    torch_reference.py export [--out tests/data/vit_torch] [--width 32 --heads 2 --depth 2]
                              [--steps 300] [--images 32] [--seed 1]
    torch_reference.py evaluate --weights vit_output/weights_fp32.safetensors [--threads 2]

The model is examples/vit/model.hpp's: patchify + linear patch embedding, a learned class
token, learned positions, `depth` pre-norm blocks (layer norm, multi-head self-attention,
residual, layer norm, GELU (erf) MLP of ratio 4, residual), final layer norm, a linear head
on the class token, on 28 x 28 one-channel images and 10 classes. A training step is
forward, cross-entropy, backward and AdamW, as the example's; bf16 runs under
torch.autocast('cpu', dtype=torch.bfloat16), as PyTorch users train in mixed precision on
the CPU. Prints one line per precision: the best and the median ms per step of `steps`
timed steps after 5 warm-up steps, with the torch version and the ISA oneDNN reports, and a
`RESULT,precision,compiled,median_ms,peak_mib` line for scripts. On `--device cuda`: autocast
on the GPU (bf16; fp16 with a GradScaler), tf32 as TF32 matmuls, the device synchronised
around each timed step, the peak of torch.cuda.max_memory_reserved(); `--compile [MODE]` times
the model under torch.compile in MODE (default, reduce-overhead or max-autotune:
bench/torch_compile.py), and `compiled` in the RESULT line is the mode, or 0 for eager.

`export` trains a small ViT for `steps` AdamW steps on Fashion-MNIST (Debian's
dataset-fashion-mnist, normalised with the training set's mean and standard deviation, as the
example does), saves its weights with the safetensors package as F32 and as BF16
(vit_f32.safetensors, vit_bf16.safetensors; the sizes, the normalisation and the seed in
the metadata), and writes logits.csv: for the first `images` test images, the logits in
float64 (the reference), in float32, and under torch.autocast('cpu', dtype=torch.bfloat16).
The parameter names are this module's ("blocks.0.qkv.weight"); examples/vit/model.hpp's
vit::torch_name maps precis's paths onto them.

`evaluate` loads weights that example_vit wrote (--out DIR: weights_<policy>.safetensors,
its sizes and normalisation in the metadata) into this module and prints PyTorch's float32
test accuracy on the same test images beside the accuracy precis measured.
"""
import argparse
import gc
import gzip
import os
import statistics
import sys
import time

import numpy as np

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_compile  # noqa: E402 (bench/torch_compile.py)


class Block(nn.Module):
    # --sdpa: attention through F.scaled_dot_product_attention (flash attention on a GPU for
    # bf16 and fp16), as timm's ViT runs it; else the three steps written out.
    sdpa = False

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
        if Block.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
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
    """Best and median ms per step of `args.steps` timed steps after warm-up, and the peak
    device memory in MiB (None on the CPU). On cuda: autocast on the device for bf16 and
    fp16 (fp16 with a GradScaler, unscaled before clipping), TF32 matmuls for tf32, exact
    float for fp32; torch.cuda.synchronize() around each timed step. --compile wraps the
    model in torch.compile (its compilation in the warm-up steps)."""
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        # The caching allocator keeps what the previous precision's run reserved: released
        # here, each eager precision's peak is its own (the private pools of torch.compile's
        # CUDA graphs, mode reduce-overhead, outlive this).
        gc.collect()
        torch.cuda.empty_cache()
    model = ViT(image=args.image, patch=args.patch, channels=args.channels, width=args.width, heads=args.heads,
                depth=args.depth, classes=args.classes).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    run = torch_compile.compiled(model, args.compile)
    x = torch.randn(args.batch, args.channels, args.image, args.image, device=dev)
    y = torch.randint(0, args.classes, (args.batch,), device=dev)
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def step():
        torch_compile.begin_step(args.compile)
        opt.zero_grad(set_to_none=True)
        if autocast is not None:
            with torch.autocast(dev.type, dtype=autocast):
                loss = F.cross_entropy(run(x), y)
        else:
            loss = F.cross_entropy(run(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(1000 * (time.perf_counter() - t0))
    peak = torch.cuda.max_memory_reserved() / 2**20 if dev.type == "cuda" else None
    return min(times), statistics.median(times), peak


FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def read_idx(name):
    with gzip.open(os.path.join(FASHION_MNIST, name), "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def export(args):
    from safetensors.torch import save_file

    torch.manual_seed(args.seed)
    train_x = read_idx("train-images-idx3-ubyte.gz").astype(np.float64) / 255.0
    train_y = read_idx("train-labels-idx1-ubyte.gz").astype(np.int64)
    test_x = read_idx("t10k-images-idx3-ubyte.gz").astype(np.float64) / 255.0
    mean, sd = train_x.mean(), train_x.std()
    norm = lambda a: torch.tensor((a - mean) / sd, dtype=torch.float32).unsqueeze(1)
    model = ViT(patch=args.patch, width=args.width, heads=args.heads, depth=args.depth)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    for step in range(args.steps):
        lo = (step * args.batch) % (len(train_x) - args.batch)
        x, y = norm(train_x[lo:lo + args.batch]), torch.tensor(train_y[lo:lo + args.batch])
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step + 1 == args.steps:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"image": "28", "patch": str(args.patch), "channels": "1", "width": str(args.width),
            "heads": str(args.heads), "depth": str(args.depth), "classes": "10",
            "mean": repr(float(mean)), "std": repr(float(sd)), "seed": str(args.seed),
            "steps": str(args.steps), "torch": torch.__version__}
    save_file(state, os.path.join(args.out, "vit_f32.safetensors"), metadata=meta)
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()},
              os.path.join(args.out, "vit_bf16.safetensors"), metadata=meta)

    x = norm(test_x[:args.images])
    model.eval()
    with torch.no_grad():
        rows = {"float64": model.double()(x.double()).numpy()}
        model.float()
        rows["float32"] = model(x).numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rows["bf16_autocast"] = model(x).float().numpy()
    with open(os.path.join(args.out, "logits.csv"), "w") as f:
        f.write("image,kind," + ",".join(f"l{i}" for i in range(10)) + "\n")
        for i in range(args.images):
            for kind, v in rows.items():
                f.write(f"{i},{kind}," + ",".join(repr(float(a)) for a in v[i]) + "\n")
    print(f"wrote {args.out}/vit_f32.safetensors, vit_bf16.safetensors, logits.csv "
          f"(torch {torch.__version__})")


def evaluate(args):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(args.weights, "pt") as f:
        meta = f.metadata()
    n = lambda k: int(meta[k])
    if (n("image"), n("channels"), n("classes")) != (28, 1, 10):
        raise SystemExit(f"{args.weights}: not a Fashion-MNIST ViT (image {meta['image']}, "
                         f"channels {meta['channels']}, classes {meta['classes']})")
    model = ViT(patch=n("patch"), width=n("width"), heads=n("heads"), depth=n("depth"))
    # precis keeps the class token as [D] and the positions as [T, D] where this module has
    # [1, 1, D] and [1, T, D]: shapes that differ only in axes of size 1 hold the same data
    # (the rule nn::load_safetensors applies the other way).
    state, own = load_file(args.weights), model.state_dict()
    squeeze = lambda shape: [d for d in shape if d != 1]
    for k, v in state.items():
        if k in own and v.shape != own[k].shape and squeeze(v.shape) == squeeze(own[k].shape):
            state[k] = v.reshape(own[k].shape)
    model.load_state_dict(state, strict=True)
    model.eval()
    mean, sd = float(meta["mean"]), float(meta["std"])
    images = n("test_images")
    test_x = read_idx("t10k-images-idx3-ubyte.gz")[:images].astype(np.float64) / 255.0
    test_y = torch.tensor(read_idx("t10k-labels-idx1-ubyte.gz")[:images].astype(np.int64))
    x = torch.tensor((test_x - mean) / sd, dtype=torch.float32).unsqueeze(1)
    with torch.no_grad():
        correct = sum(int((model(x[i:i + 500]).argmax(1) == test_y[i:i + 500]).sum())
                      for i in range(0, images, 500))
    print(f"{args.weights}: policy {meta.get('policy', '?')}, {images} test images: PyTorch {torch.__version__} "
          f"float32 accuracy {correct / images:.4f}, precis measured {float(meta['test_accuracy']):.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["time", "export", "evaluate"])
    ap.add_argument("--weights", help="evaluate: a weights_<policy>.safetensors that example_vit wrote")
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--out", default="tests/data/vit_torch")
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--precision", default="both",
                    help="fp32, tf32, bf16, fp16, a comma-separated list of them, or both (fp32,bf16)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    torch_compile.add_option(ap)
    ap.add_argument("--sdpa", action="store_true",
                    help="attention through F.scaled_dot_product_attention (fused on a GPU)")
    ap.add_argument("--image", type=int, default=28)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--clip", type=float, default=None,
                    help="time: clip the gradient norm to this, as the example (default 1 on cuda; 0, no "
                         "clipping, on the cpu, as the recorded CPU comparisons ran)")
    ap.add_argument("--warmup", type=int, default=5, help="time: untimed steps first")
    args = ap.parse_args()
    Block.sdpa = args.sdpa
    torch.set_num_threads(args.threads)
    small = args.command == "export"
    for name, timing, exporting in (("width", 64, 32), ("heads", 4, 2), ("depth", 4, 2), ("steps", 20, 300)):
        if getattr(args, name) is None:
            setattr(args, name, exporting if small else timing)
    if small:
        export(args)
        return
    if args.command == "evaluate":
        if not args.weights:
            raise SystemExit("evaluate needs --weights FILE")
        evaluate(args)
        return
    if args.clip is None:
        args.clip = 1.0 if args.device == "cuda" else 0.0
    precisions = ["fp32", "bf16"] if args.precision == "both" else args.precision.split(",")
    for p in precisions:
        if p not in ("fp32", "tf32", "bf16", "fp16"):
            raise SystemExit(f"--precision: unknown precision {p}")
        if p in ("tf32", "fp16") and args.device != "cuda":
            raise SystemExit(f"--precision {p} is timed on --device cuda")
    where = (torch.cuda.get_device_name() if args.device == "cuda" else torch.backends.cpu.get_cpu_capability())
    for precision in precisions:
        best, median, peak = time_steps(args, precision)
        memory = f", peak {peak:.0f} MiB" if peak is not None else ""
        compiled_tag = f" compiled ({args.compile})" if args.compile else ""
        print(f"torch {torch.__version__} ({where}) {precision}{compiled_tag}: image "
              f"{args.image} width {args.width} heads {args.heads} depth {args.depth} patch {args.patch} batch "
              f"{args.batch} threads {args.threads}: best {best:.2f} ms/step, median {median:.2f} ms/step{memory}",
              flush=True)
        print(f"RESULT,{precision},{args.compile or 0},{median:.4f},{'' if peak is None else f'{peak:.1f}'}", flush=True)


if __name__ == "__main__":
    main()
