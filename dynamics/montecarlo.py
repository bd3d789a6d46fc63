"""Monte-Carlo means and the Trajectory record shared by every system's simulator.

Seeds come from :mod:`attnflow.seeding`; a chunk, replicate or worker gets its own child SeedSequence, so results
do not depend on how work is split.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnflow.closed_forms import checks as check
from attnflow.dynamics import progress
from attnflow.seeding import SeedLike, generators

__all__ = ["MonteCarloMean", "monte_carlo_mean", "RegressionPrompts", "prompt_risk", "log_spaced_steps", "log_grid", "check_run_length", "MAX_STEPS", "MAX_RECORDS", "MAX_POINTS", "MAX_BATCH", "flow_times", "check_batch_size", "check_count", "MAX_PROMPTS",
           "Trajectory"]


@dataclass(frozen=True)
class MonteCarloMean:
    """A sample mean with its standard error and sample count (and, where computed, the samples' skewness)."""

    mean: float
    standard_error: float
    n: int
    skewness: float | None = None  # of one sample; the mean's is skewness/√n

    def z_score(self, predicted: float) -> float:
        """(mean − predicted) / SE; ±inf when SE = 0 and they differ."""
        diff = self.mean - predicted
        if self.standard_error == 0:
            return 0.0 if diff == 0 else np.copysign(np.inf, diff)
        return diff / self.standard_error


def monte_carlo_mean(draw, n: int, *, seed: SeedLike, chunk: int = 50_000) -> MonteCarloMean:
    """Mean and standard error of ``draw(rng, m) -> ndarray (m,)`` over ``n`` samples, in chunks of ``chunk``.

    Chunk i uses generator i spawned from ``seed`` so memory stays bounded and results are reproducible.
    """
    n = check.integer(n, "n", minimum=2)
    chunk = check.integer(chunk, "chunk", minimum=1)
    if n > MAX_SAMPLES:
        raise ValueError(f"n must be <= {MAX_SAMPLES:.0e} samples (a larger mean is a typo, not an experiment), "
                         f"got {n}")
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    total = total_sq = 0.0
    for index, (rng, size) in enumerate(zip(generators(seed, len(sizes)), sizes)):
        progress.report(index, len(sizes))
        values = np.asarray(draw(rng, size), dtype=float)
        if not np.all(np.isfinite(values)):
            raise FloatingPointError("Monte-Carlo draw produced a non-finite value")
        total += values.sum()
        total_sq += np.square(values).sum()
    mean = total / n
    variance = max(total_sq / n - mean * mean, 0.0) * n / (n - 1)
    return MonteCarloMean(mean=float(mean), standard_error=float(np.sqrt(variance / n)), n=n)


@dataclass(frozen=True)
class RegressionPrompts:
    """A batch of B in-context linear-regression prompts: examples X (B, n, d) with labels y (B, n), the query
    x_query (B, d) with its label y_query (B,), and each prompt's task vector beta (B, d)."""

    X: np.ndarray
    y: np.ndarray
    x_query: np.ndarray
    y_query: np.ndarray
    beta: np.ndarray


def prompt_risk(sample_prompts, predict, n: int, *, seed: SeedLike, chunk: int = 50_000) -> MonteCarloMean:
    """Brute-force in-context risk E(ŷ − y_q)² of ``predict(prompts) -> (m,)`` over ``n`` fresh prompts drawn by
    ``sample_prompts(rng, m)`` (anything with a ``y_query`` array), in bounded chunks."""

    def squared_errors(rng, m):
        prompts = sample_prompts(rng, m)
        return (predict(prompts) - prompts.y_query) ** 2

    return monte_carlo_mean(squared_errors, n, seed=seed, chunk=chunk)


MAX_STEPS = 10_000_000  # bounds on recorded training runs: beyond them a typo, not an experiment
MAX_SAMPLES = 10**9  # bound on a Monte-Carlo mean's samples, for the same reason
MAX_RECORDS = 2000
MAX_POINTS = 100_000  # recorded times of a population flow
MAX_BATCH = 1_000_000  # prompts in one minibatch (a batch of d-dimensional prompts is held in memory at once)


def flow_times(t_end, n_points) -> np.ndarray:
    """0 and ``n_points`` − 1 log-spaced times from t_end·10⁻⁴ to ``t_end``: the record of a population flow, resolving
    the transient and the exponential tail. ``t_end`` must leave t_end·10⁻⁴ a positive float (t_end >= 1e-300)."""
    t_end = check.real(t_end, "t_end", minimum=0.0, strict=True)
    if t_end * 1e-4 == 0.0:
        raise ValueError(f"t_end must be >= 1e-300 (its first recorded time t_end·1e-4 underflows), got {t_end:g}")
    n_points = check.integer(n_points, "n_points", minimum=2)
    if n_points > MAX_POINTS:
        raise ValueError(f"n_points must be <= {MAX_POINTS}, got {n_points}")
    return np.concatenate([[0.0], np.geomspace(t_end * 1e-4, t_end, n_points - 1)])


MAX_PROMPTS = 10**7  # prompts sampled in one call (held in memory at once; Monte-Carlo means sample in chunks)


def check_count(n, name: str, maximum: int = MAX_PROMPTS) -> int:
    """A number of things to sample or run: an integer in [1, maximum]."""
    n = check.integer(n, name, minimum=1)
    if n > maximum:
        raise ValueError(f"{name} must be <= {maximum:.0e}, got {n}")
    return n


def check_batch_size(batch_size) -> int:
    """Prompts per step: an integer in [1, MAX_BATCH]."""
    batch_size = check.integer(batch_size, "batch_size", minimum=1)
    if batch_size > MAX_BATCH:
        raise ValueError(f"batch_size must be <= {MAX_BATCH}, got {batch_size}")
    return batch_size


def check_run_length(steps, n_records, *, min_records: int = 1, optional_records: bool = False,
                     max_steps: int = MAX_STEPS) -> tuple[int, int | None]:
    """A recorded run's ``steps`` in [1, max_steps] and ``n_records`` in [min_records, MAX_RECORDS] (``None`` kept
    when ``optional_records``), checked before any allocation; ValueError naming the parameter otherwise."""
    steps = check.integer(steps, "steps", minimum=1)
    if steps > max_steps:
        raise ValueError(f"steps must be <= {max_steps} (a longer run is a typo, not an experiment), got {steps}")
    if n_records is None and optional_records:
        return steps, None
    n_records = check.integer(n_records, "n_records", minimum=min_records)
    if n_records > MAX_RECORDS:
        raise ValueError(f"n_records must be <= {MAX_RECORDS}, got {n_records}")
    return steps, n_records


def log_spaced_steps(steps: int, records: int) -> np.ndarray:
    """About ``records`` log-spaced steps in [0, steps] (always 0 and ``steps``): where power-law and logarithmic
    rates are read off a training run."""
    steps = check.integer(steps, "steps", minimum=1)
    if steps > MAX_STEPS:
        raise ValueError(f"steps must be <= {MAX_STEPS}, got {steps}")
    records = check.integer(records, "records", minimum=2)
    if records > MAX_RECORDS:
        raise ValueError(f"records must be <= {MAX_RECORDS}, got {records}")
    return log_grid(steps, records - 1)


def log_grid(steps: int, n_log: int) -> np.ndarray:
    """Step 0 and the ``n_log`` log-spaced points 1 … ``steps``, rounded to whole steps, repeats removed (int64): the
    one record grid of every training loop (callers validate ``steps`` and ``n_log``)."""
    return np.unique(np.concatenate([[0], np.geomspace(1, steps, n_log).round()])).astype(np.int64)


@dataclass(frozen=True)
class Trajectory:
    """A recorded run: times (or steps), the state at those times and named metrics.

    Attributes
    ----------
    times : ndarray, shape (n_t,)
        Continuous time for flows, step index for discrete algorithms.
    states : dict[str, ndarray]
        Parameters or reduced coordinates, each with leading axis n_t (e.g. ``beta0`` (n_t, d)), keyed by the
        symbol the system's page gives them, in ASCII (``W``, ``theta`` for θ, ``xi1`` for ξ₁).
    metrics : dict[str, ndarray]
        Named scalar series of shape (n_t,) (loss, distance to the optimum, …), snake_case names of what they
        measure.
    final : dict[str, ndarray]
        The parameters at the end of the run (SCB's (V, Q) after Algorithm 1, a trained model's weights), under the
        key ``states`` uses for the same quantity.
    info : dict
        Anything else worth keeping (solver cost, stage boundaries, samples used, settings).
    """

    times: np.ndarray
    states: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    final: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.times)
        for kind in (self.states, self.metrics):
            for name, values in kind.items():
                if len(values) != n:
                    raise ValueError(f"{name} has {len(values)} records, expected {n}")

    def last(self, metric: str) -> float:
        """The final value of a metric; an unknown name is a ``ValueError`` listing the recorded ones."""
        if metric not in self.metrics:
            raise ValueError(f"no metric {metric!r} in this trajectory (it records {sorted(self.metrics)})")
        return float(self.metrics[metric][-1])
