#!/usr/bin/env python3
"""Makes the coefficients of log_scaled_erfc in include/precis/kernels/cpu/vec_math.hpp.

With t = 2 / (2 + z) and u = 1 - t = z / (2 + z) (z >= 0 maps to u in [0, 1)), the function
P(u) = log(erfc(z) exp(z^2) / t) is smooth on [0, 1], 0 at u = 0, and tends to
log(1 / (2 sqrt(pi))) as u -> 1. precis evaluates P(u) = u Q(u) with Q a polynomial of
degree 11: a least-squares fit of Q on 800 Chebyshev nodes of [0, 1], the reference in
50-digit arithmetic (mpmath), converted to monomial coefficients and rounded to float.
Prints the coefficients (as C++ hex float literals) and the fit's absolute error in P,
evaluated in float32 by Horner's rule as precis does.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy mpmath
    /tmp/venv/bin/python tests/data/vec_math/fit_erfc.py
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 50


def p_of_u(u):
    u = mp.mpf(u)
    t = 1 - u
    if t == 0:
        return mp.log(1 / (2 * mp.sqrt(mp.pi)))
    z = 2 * (1 / t - 1)
    return mp.log(mp.erfc(z) * mp.exp(z * z) / t)


def q_of_u(u):
    if u == 0:
        return mp.diff(p_of_u, 0)
    return p_of_u(u) / mp.mpf(u)


def fit(degree, nodes=800):
    k = np.arange(nodes)
    s = np.cos(np.pi * (k + 0.5) / nodes)
    us = (s + 1) / 2
    ys = np.array([float(q_of_u(u)) for u in us])
    c = np.polynomial.chebyshev.chebfit(s, ys, degree)
    return np.polynomial.chebyshev.Chebyshev(c, domain=[0, 1]).convert(
        kind=np.polynomial.Polynomial).coef.astype(np.float32)


def main():
    c = fit(11)
    print(", ".join(float.hex(float(v)).replace("0000000p", "p") + "F" for v in c))
    print()
    us = np.linspace(0, 1, 4001, dtype=np.float32)
    acc = np.full_like(us, c[-1])
    for ci in c[-2::-1]:
        acc = (acc * us).astype(np.float32) + ci
    p32 = (acc * us).astype(np.float32)
    ref = np.array([float(p_of_u(float(u))) for u in us])
    print("max |P_float - P| =", np.abs(p32.astype(np.float64) - ref).max())


if __name__ == "__main__":
    main()
