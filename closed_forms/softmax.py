"""Scalar-loop softmax kernels shared by the systems' compiled code.

numpy's ``e = np.exp(z - z.max()); e / e.sum()`` inside a numba kernel compiles several times more slowly than the
same arithmetic in loops (DESIGN.md, "Writing kernels that compile quickly"). These loops do the same operations in
the same order: the maximum propagates a NaN as numpy's does, and the sum runs left to right as numba's does, so the
results are bitwise those of the array expressions.
"""
from __future__ import annotations

import math

from numba import njit

__all__ = ["max_propagating_nan", "softmax_into"]


@njit(cache=True)
def max_propagating_nan(x):
    """``x.max()`` of a non-empty 1-d array: a NaN anywhere gives NaN, as in NumPy."""
    m = x[0]
    if math.isnan(m):
        return m
    for k in range(1, x.size):
        v = x[k]
        if math.isnan(v):
            return v
        if v > m:
            m = v
    return m


@njit(cache=True)
def softmax_into(z, out):
    """out = exp(z − max z) / Σ exp(z − max z); ``out`` may be ``z`` itself (in place)."""
    top = max_propagating_nan(z)
    total = 0.0
    for j in range(z.size):
        out[j] = math.exp(z[j] - top)
        total += out[j]
    for j in range(z.size):
        out[j] /= total
