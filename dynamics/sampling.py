"""Fast seeded sampling inside numba kernels: the xoshiro256+ generator and guide tables for inverse-CDF draws.

A categorical draw by inverse CDF with numba's Mersenne Twister and a binary search costs about 45 ns at N = 100.
With a guide table (Chen & Asau 1974) the search starts next to the answer and takes about one comparison, and a
xoshiro256+ double costs about a nanosecond: a few nanoseconds per draw, whatever the number of categories. The
draw is still the exact inverse CDF of the uniform (the same category a full binary search would return), so the
law is the data model's own up to float64 rounding of the cumulative sums; the tests check frequencies by a χ²
test and the gradients against the closed forms. Guide tables are built with numpy (no kernel to compile), which
is why they serve the many laws drawn from a few times per sample (a column of P, a column of Q*). The one law drawn
from T times per sample (μ, the context tokens) gets an alias table (Walker 1977): one uniform, one compare, no
search at all. The compare's outcome indexes a pair (alias, column) instead of choosing between them: LLVM compiles
``i if keep else alias[i]`` (and its arithmetic or bit-mask rewrites) to a branch, which a law that is not uniform
mispredicts about as often as it keeps; measured on one core at N = 5 with a Dirichlet(1) law, 9.1 ns per draw
(a uniform and a pick) against 1.6 ns for the indexed pair, with the same draws. With unsigned indices a pick alone
takes 0.92 ns (:func:`alias_pick`), and :func:`alias_picks` takes each uniform straight to its pick.

The generator's 256-bit state is a ``uint64[4]`` array made by :func:`attnflow.seeding.generator_state` from the
run's SeedSequence and advanced in place, so a kernel's draws are a function of its seed only.

xoshiro256+ (Blackman & Vigna 2018) is the variant meant for floating point: its weak low bits are discarded
when the top 53 bits become a double in [0, 1).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from attnflow.closed_forms import checks as check

__all__ = ["fill_uniforms", "alias_picks", "guided_pick", "guide_tables", "alias_pick", "alias_table",
           "MAX_ALIAS_CATEGORIES"]

MAX_ALIAS_CATEGORIES = 2**13  # alias_pick's uniform keeps >= 40 random bits for its comparison up to this size

_TWO_POW_MINUS_53 = 1.0 / 9007199254740992.0


@njit(cache=True)
def _rotate_left(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True)
def _next_uniform(s0, s1, s2, s3):
    """One xoshiro256+ step from the state (s0, s1, s2, s3): the uniform double in [0, 1) made of the output's top
    53 bits, and the next state."""
    result = s0 + s3
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotate_left(s3, 45)
    return (result >> np.uint64(11)) * _TWO_POW_MINUS_53, s0, s1, s2, s3


@njit(cache=True)
def fill_uniforms(state, out):
    """Fill the 1-D array ``out`` with uniform doubles in [0, 1), the top 53 bits of successive xoshiro256+
    outputs, and advance ``state``. The state lives in registers for the whole loop (about a nanosecond per
    double), which is why draws take their uniforms many at a time, from this loop or from :func:`alias_picks`,
    rather than from one call per uniform."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for n in range(out.shape[0]):
        out[n], s0, s1, s2, s3 = _next_uniform(s0, s1, s2, s3)
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


@njit(cache=True)
def alias_picks(state, prob, choices, out):
    """Fill the 1-D array ``out`` with :func:`alias_pick` of successive uniforms of ``state`` (the uniforms
    :func:`fill_uniforms` would give, in the same order, so the same picks) and advance ``state``. Each uniform
    goes from register to pick without a trip through memory, and the picks' work overlaps the generator's chain
    of dependent steps: 3-10% faster than filling a buffer and picking from it, over the whole SCB kernel."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for n in range(out.shape[0]):
        u, s0, s1, s2, s3 = _next_uniform(s0, s1, s2, s3)
        out[n] = alias_pick(u, prob, choices)
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


@njit(cache=True)
def guided_pick(u, cdf, guide):
    """The category of the uniform ``u`` under the law with cumulative sums ``cdf`` (``cdf[-1]`` = 1): the first i
    with cdf[i] > u, exactly ``searchsorted(cdf, u, side="right")``. The guide table starts the search at the
    answer for ⌊u·m⌋/m, so the loop takes at most a few steps on average."""
    i = guide[int(u * guide.shape[0])]
    while cdf[i] <= u:
        i += 1
    return i


def guide_tables(laws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative sums and guide tables (Chen & Asau 1974) of the probability vectors in the last axis of ``laws``:
    ``guide[..., j]`` is the first index whose cumulative sum exceeds j/m, with m the number of categories. The
    cumulative sum at the last category of positive probability (and beyond) is set to exactly 1, so every search
    ends inside the table and never on a category of probability zero. Built with numpy, no kernel."""
    laws = check.finite_array(laws, "laws")
    if laws.ndim < 1 or laws.shape[-1] < 1 or np.any(laws < 0) or np.any(laws.sum(axis=-1) <= 0):
        raise ValueError(f"laws must hold non-negative probability vectors in the last axis, got shape {laws.shape}")
    m = laws.shape[-1]
    flat_laws = laws.reshape(-1, m)
    flat = np.cumsum(flat_laws, axis=-1)
    last_positive = m - 1 - np.argmax(flat_laws[:, ::-1] > 0, axis=1)
    flat[np.arange(m) >= last_positive[:, None]] = 1.0  # trailing zero-probability categories are never drawn
    points = np.arange(m) / m
    guide = np.array([np.searchsorted(row, points, side="right") for row in flat], dtype=np.int64)
    return np.ascontiguousarray(flat.reshape(laws.shape)), guide.reshape(laws.shape)


@njit(cache=True)
def alias_pick(u, prob, choices):
    """The category of the uniform ``u`` under the law encoded by :func:`alias_table`: column i = ⌊u·n⌋, kept when
    the fractional part of u·n is below ``prob[i]``, else its alias. One uniform serves both choices (its fractional
    part keeps ≥ 40 random bits for up to 2¹³ categories); the comparison indexes ``choices[i]`` = (alias, i), so
    there is no branch to mispredict (module docstring). The indices are unsigned (0 <= u·n < n), so numba adds no
    wraparound for negative ones: a third fewer instructions per pick, and 0.92 ns per pick instead of 1.33 on one
    Zen 4 core, with the same picks."""
    u = u * prob.shape[0]
    i = np.uint64(u)
    return choices[i, np.uint64(u - i < prob[i])]


def alias_table(p) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias table (Walker 1977; Vose 1991) of the probability vector ``p``: ``prob[i]`` is the chance of
    keeping column i, ``choices[i] = (alias[i], i)`` (n × 2) the category taken otherwise and column i itself, the
    layout :func:`alias_pick` indexes. Exact up to float64 rounding; a category of probability zero is never drawn.
    Built in Python, O(n): meant for one law drawn from very often (μ). ``p`` need not sum to 1 (it is normalised),
    but must be finite and non-negative with a positive sum, and have at most ``MAX_ALIAS_CATEGORIES`` entries
    (beyond, the fractional part of u·n that :func:`alias_pick` compares keeps too few random bits)."""
    try:
        p = np.asarray(p, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"p must be a probability vector, got {p!r}") from None
    n = p.size
    if p.ndim != 1 or not 1 <= n <= MAX_ALIAS_CATEGORIES:
        raise ValueError(f"p must be a 1-D vector of 1 to {MAX_ALIAS_CATEGORIES} probabilities, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or not p.sum() > 0:
        raise ValueError("p must be finite and non-negative, with a positive sum")
    scaled = (p * (n / p.sum())).tolist()
    prob, alias = [1.0] * n, list(range(n))
    small = [i for i, v in enumerate(scaled) if v < 1.0]
    large = [i for i, v in enumerate(scaled) if v >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        prob[s], alias[s] = scaled[s], g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        (small if scaled[g] < 1.0 else large).append(g)
    for i in small:  # left only by rounding: their mass is 1 up to an ulp, unless it is a zero-probability column
        if p[i] == 0.0:
            raise ValueError("alias_table: rounding left a zero-probability category unpaired")
    return np.array(prob), np.stack([np.array(alias, dtype=np.int64), np.arange(n, dtype=np.int64)], axis=1)
