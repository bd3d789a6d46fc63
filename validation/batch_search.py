"""The critical batch: per seed, the smallest batch on a geometric grid at which a run succeeds.

A theorem that says "a batch of order f(T) suffices" is checked by walking each seed up the grid round(√2^k)
until its run succeeds; the critical batch at T is a quantile of those first successes over seeds, and its growth
in T is fitted with :func:`attnflow.validation.stats.fit_exponent`. The search is generic: ``success(batch, seed)``
returns a tuple of booleans (one per criterion), and a run that diverges or cannot go on (``DivergenceError``,
``StageFailure``) counts as a failure of every criterion.
"""
from __future__ import annotations

import math

import numpy as np

from attnflow import seeding
from attnflow.dynamics import progress
from attnflow.dynamics.errors import DivergenceError, StageFailure

__all__ = ["BATCH_GRID_RATIO", "grid_slack", "first_successes", "critical_batch_curve"]

BATCH_GRID_RATIO = math.sqrt(2)  # the ascending batch grid of the critical-batch search


def grid_slack(xs) -> float:
    """How far the grid's quantisation alone can move a fitted exponent of batch in x: a first success is known only
    up to one grid step (a factor ``BATCH_GRID_RATIO``), which over the range of ``xs`` is a change of slope of
    log(ratio) / log(max x / min x). Exponent intervals are widened by it on both sides."""
    return math.log(BATCH_GRID_RATIO) / math.log(max(xs) / min(xs))


def first_successes(success, seeds, start: int, max_batch: int, n_criteria: int = 1) -> tuple[np.ndarray, bool]:
    """Per seed, the first batch on the ascending grid round(√2^k) (from ``start``) at which each criterion of
    ``success(batch, seed) -> tuple[bool, ...]`` (``n_criteria`` of them) holds; the walk stops once all have held.

    Returns (first successes, shape (n_criteria, n_seeds), censored): a criterion never met up to ``max_batch`` is
    recorded one grid step above it and flags the result as censored. A run that diverges or loses the signal
    counts as a failure. Grid point k of a seed draws from that seed's child k (:func:`attnflow.seeding.child`),
    so a batch's outcome does not depend on where the walk started."""
    k0 = math.floor(math.log(start) / math.log(BATCH_GRID_RATIO) + 1e-9)
    first = []
    censored = False
    seeds = list(seeds)
    for index, seed in enumerate(seeds):
        progress.report(index, len(seeds))
        found: list[float | None] = [None] * n_criteria
        k = k0
        while True:
            batch = int(round(BATCH_GRID_RATIO ** k))
            if batch > max_batch:
                censored = True
                found = [batch if f is None else f for f in found]
                break
            try:
                outcome = success(batch, seeding.child(seed, k))
            except (DivergenceError, StageFailure):  # a run that blows up or loses the signal has failed
                outcome = (False,) * n_criteria
            if len(outcome) != n_criteria:
                raise ValueError(f"success returned {len(outcome)} criteria, expected n_criteria = {n_criteria}")
            found = [batch if (f is None and ok) else f for f, ok in zip(found, outcome)]
            if all(f is not None for f in found):
                break
            k += 1
        first.append(found)
    return np.array(first, float).T, censored


def critical_batch_curve(make_success, xs, seed, n_seeds, start, max_batch, quantile, n_criteria=1):
    """First successes (n_criteria, len(xs), n_seeds) over a grid ``xs`` (e.g. context lengths T), where
    ``make_success(x)`` gives the success function at x. Each x's walk starts two grid steps below the previous
    x's smallest first success, and restarts 4× lower whenever the ``quantile`` sits at the walk's start (the
    critical batch could then be lower still). Returns (first successes, censored)."""
    results = []
    censored = False
    for x, child in zip(xs, seed.spawn(len(xs))):
        success = make_success(x)
        seeds = child.spawn(n_seeds)
        while True:
            first, cut = first_successes(success, seeds, start, max_batch, n_criteria)
            critical = np.quantile(first, quantile, axis=1, method="inverted_cdf")
            if start <= 16 or np.all(critical > start * BATCH_GRID_RATIO ** 0.5):
                break
            start = max(16, start // 4)
        censored |= cut
        results.append(first)
        start = max(16, int(first.min() / BATCH_GRID_RATIO ** 2))
    return np.stack(results, axis=1), censored
