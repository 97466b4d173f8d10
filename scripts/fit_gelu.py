#!/usr/bin/env python3
"""Fits the polynomial of src/model/gelu.cc's normal tail and prints its coefficients as C++.

    .venv/bin/python scripts/fit_gelu.py    (numpy and mpmath: scripts/python-env.sh --test)

gelu.cc computes the lower tail of the standard normal, Φ(−a) for a = |x| in [0, kTailEnd], as

    Φ(−a) = e^(−a²/2) · t · P(t − kCentre),   t = 1 / (1 + kScale·a)

where t·P(t − kCentre) stands for ½·erfcx(a/√2) (erfcx(z) = e^(z²)·erfc(z)), a smooth function
that falls like 1/a, so that P is smooth over t in (0, 1]. This script fits P, of degree DEGREE in
u = t − kCentre, by weighted least squares with relative error weights (mpmath gives the reference
to 40 digits), reweighted Lawson-style towards the minimax fit, rounding the coefficients to f32
one at a time (refitting the rest), and reports the fit's relative error over a dense grid of a
with them (t exact): the error of the formula itself, before f32 arithmetic adds its roundings
(tests/gelu_test.cc measures the whole of it against std::erfc).
"""
import mpmath
import numpy as np

SCALE = float(np.float32(0.5 / np.sqrt(2.0)))  # kScale, as the f32 constant the C++ uses
TAIL_END = 14.0  # beyond a = 14, Φ(−a) < 1e-44: below f32's smallest subnormal but one
DEGREE = 11
NODES = 1500
ROUNDS = 80

mpmath.mp.dps = 40


def half_erfcx(a):
    z = mpmath.mpf(a) / mpmath.sqrt(2)
    return float(mpmath.erfc(z) * mpmath.exp(z * z) / 2)


def fit():
    t_low, t_high = 1 / (1 + SCALE * TAIL_END), 1.0
    centre = float(np.float32((t_low + t_high) / 2))
    nodes = np.arange(NODES)
    t = (t_low + t_high) / 2 + (t_high - t_low) / 2 * np.cos(np.pi * (nodes + 0.5) / NODES)
    target = np.array([half_erfcx((1 / v - 1) / SCALE) for v in t]) / t
    powers = np.vander(t - centre, DEGREE + 1, increasing=True)
    # Rounding all coefficients to f32 at the end would add their rounding errors (about one ulp of
    # the result) to the fit's: round them one at a time, lowest first, refitting the rest.
    fixed = []
    for _ in range(DEGREE + 1):
        rest = target - powers[:, : len(fixed)] @ np.array(fixed, dtype=np.float64)
        free = powers[:, len(fixed) :]
        weights = np.ones(NODES)
        for _ in range(ROUNDS):
            coefficients, *_ = np.linalg.lstsq(
                free * (weights / target)[:, None], rest * weights / target, rcond=None)
            error = np.abs((free @ coefficients - rest) / target)
            weights = weights * np.sqrt(error / error.max()) + 1e-12
            weights /= weights.max()
        fixed.append(float(np.float32(coefficients[0])))
    return centre, np.array(fixed, dtype=np.float32)


def main():
    centre, coefficients = fit()
    a = np.linspace(0.0, TAIL_END, 30001)
    t = 1 / (1 + SCALE * a)
    value = t * np.polynomial.polynomial.polyval(t - centre, coefficients.astype(np.float64))
    reference = np.array([half_erfcx(v) for v in a])
    error = np.max(np.abs(value / reference - 1))
    print(f"// Fit relative error with these f32 coefficients: {error:.2e}")
    print(f"constexpr float kScale = {SCALE!r}f;")
    print(f"constexpr float kCentre = {float(centre)!r}f;")
    print("constexpr float kTail[] = {" + ", ".join(f"{float(c)!r}f" for c in coefficients) + "};")


if __name__ == "__main__":
    main()
