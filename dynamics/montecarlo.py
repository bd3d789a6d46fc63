"""Seeding, Monte-Carlo means and the Trajectory record shared by every system's simulator.

Every random quantity flows from an explicit seed through ``numpy.random.SeedSequence``: a replicate,
worker or task gets ``SeedSequence(seed).spawn(k)[i]``, so results do not depend on how work is split.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["SeedLike", "seed_sequence", "generators", "MonteCarloMean", "monte_carlo_mean", "Trajectory"]

SeedLike = int | np.random.SeedSequence | None


def seed_sequence(seed: SeedLike) -> np.random.SeedSequence:
    """A SeedSequence from an int (>= 0) or a SeedSequence; ``None`` is refused (results must be reproducible)."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if seed is None or isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or a numpy SeedSequence, got {seed!r}")
    return np.random.SeedSequence(int(seed))


def generators(seed: SeedLike, count: int) -> list[np.random.Generator]:
    """``count`` independent generators spawned from ``seed`` (replicate i always gets child i)."""
    return [np.random.default_rng(child) for child in seed_sequence(seed).spawn(count)]


@dataclass(frozen=True)
class MonteCarloMean:
    """A sample mean with its standard error and sample count."""

    mean: float
    standard_error: float
    n: int

    def z_score(self, predicted: float) -> float:
        """(mean − predicted) / SE; ±inf when SE = 0 and they differ."""
        diff = self.mean - predicted
        if self.standard_error == 0:
            return 0.0 if diff == 0 else np.copysign(np.inf, diff)
        return diff / self.standard_error


def monte_carlo_mean(draw, n: int, seed: SeedLike, chunk: int = 50_000) -> MonteCarloMean:
    """Mean and standard error of ``draw(rng, m) -> ndarray (m,)`` over ``n`` samples, in chunks of ``chunk``.

    Chunk i uses generator i spawned from ``seed`` so memory stays bounded and results are reproducible.
    """
    if n < 2:
        raise ValueError(f"n must be >= 2 for a standard error, got {n}")
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    total = total_sq = 0.0
    for rng, size in zip(generators(seed, len(sizes)), sizes):
        values = np.asarray(draw(rng, size), dtype=float)
        if not np.all(np.isfinite(values)):
            raise FloatingPointError("Monte-Carlo draw produced a non-finite value")
        total += values.sum()
        total_sq += np.square(values).sum()
    mean = total / n
    variance = max(total_sq / n - mean * mean, 0.0) * n / (n - 1)
    return MonteCarloMean(mean=float(mean), standard_error=float(np.sqrt(variance / n)), n=n)


@dataclass(frozen=True)
class Trajectory:
    """A recorded run: times (or steps), the state at those times and named metrics.

    Attributes
    ----------
    times : ndarray, shape (n_t,)
        Continuous time for flows, step index for discrete algorithms.
    states : dict[str, ndarray]
        Parameters or reduced coordinates, each with leading axis n_t (e.g. ``beta0`` (n_t, d)).
    metrics : dict[str, ndarray]
        Named scalar series of shape (n_t,) (loss, distance to the optimum, …).
    info : dict
        Anything else worth keeping (solver cost, seed, settings).
    """

    times: np.ndarray
    states: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.times)
        for kind in (self.states, self.metrics):
            for name, values in kind.items():
                if len(values) != n:
                    raise ValueError(f"{name} has {len(values)} records, expected {n}")
