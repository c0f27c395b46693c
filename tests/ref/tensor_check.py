"""NaN-aware error measures for the Python test helpers (compare_runs.py, lora_ref.py).

Every comparison with NaN is false: a check written `if err > tol: fail` passes a NaN error,
and a running maximum (`max(worst, e)`, `if e > worst`) drops it. Here a NaN or Inf on either
side is an infinite error, and callers write their checks as `not err <= tol`.

Two measures of a tensor a against a reference b:
  normwise:    max |a - b| / max |b|; alone it lets a small element be wholly wrong (one
               1e-4 of the tensor's largest, 100% off, passes 1e-4);
  elementwise: max_i |a_i - b_i| / (atol + rtol |b_i|), which passes at <= 1: every element
               within rtol of itself, or atol absolutely (the rounding left on elements near
               zero; the caller states its atol and why).
"""
import math

import numpy as np


def scalar_rel(a, b):
    """|a - b| / |b|; inf when a or b is NaN, Inf or None, or b is 0 and a is not."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else math.inf


def worse(worst, e):
    """The larger error of the two, an infinite one for NaN (max() and `e > worst` drop it)."""
    if math.isnan(e) or math.isnan(worst):
        return math.inf
    return e if e > worst else worst


def errors(a, b, rtol, atol):
    """(normwise, elementwise, i): the two measures above and the element i of the worst
    elementwise error. Both infinite, i the first such element, when a or b holds a NaN or
    an Inf; infinite, i = 0, when their sizes differ."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.size != b.size:
        return math.inf, math.inf, 0
    bad = ~(np.isfinite(a) & np.isfinite(b))
    if bad.any():
        return math.inf, math.inf, int(np.argmax(bad))
    if a.size == 0:
        return 0.0, 0.0, 0
    d = np.abs(a - b)
    norm = float(d.max()) / max(float(np.abs(b).max()), 1e-30)
    bound = atol + rtol * np.abs(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d == 0, 0.0, d / bound)  # d > 0 with a zero bound: inf, fails
    i = int(np.argmax(q))
    return norm, float(q[i]), i


def close(a, b, rtol, atol):
    """errors() within bounds: normwise <= rtol and every element within atol + rtol |b_i|."""
    n, e, _ = errors(a, b, rtol, atol)
    return n <= rtol and e <= 1.0
