#!/usr/bin/env python3
"""PyTorch's float32 errors on long rows, the bounds of precis's long-row tests.

For rows of 1024, 4096, 16384 and 50257 columns (16 rows of N(0, 4^2) logits; layer norm
with gamma and beta drawn from N(0, 1)), prints max |y - ref| / max |ref| of torch's
float32 softmax, log_softmax, logsumexp, cross-entropy and layer_norm against the same
functions in float64 on the same inputs. tests/kernels/test_softmax.cpp and test_norm.cpp
check precis against these figures (measured with torch 2.15.0 from PyPI, seed 0).

    /path/to/venv/bin/python bench/row_accuracy.py
"""
import torch


def main():
    torch.manual_seed(0)
    F = torch.nn.functional
    print(f"torch {torch.__version__}")
    for n in (1024, 4096, 16384, 50257):
        x = (torch.randn(16, n) * 4).float()
        xd = x.double()

        def err(y, r):
            return ((y.double() - r).abs().max() / r.abs().max()).item()

        sm = err(torch.softmax(x, -1), torch.softmax(xd, -1))
        lsm = err(torch.log_softmax(x, -1), torch.log_softmax(xd, -1))
        lse = err(torch.logsumexp(x, -1), torch.logsumexp(xd, -1))
        g, b = torch.randn(n), torch.randn(n)
        ln = err(F.layer_norm(x, (n,), g, b), F.layer_norm(xd, (n,), g.double(), b.double()))
        t = torch.randint(0, n, (16,))
        ce = err(F.cross_entropy(x, t), F.cross_entropy(xd, t))
        print(f"{n:6d} softmax {sm:.2e} log_softmax {lsm:.2e} logsumexp {lse:.2e} "
              f"cross_entropy {ce:.2e} layer_norm {ln:.2e}")


if __name__ == "__main__":
    main()
