"""Tolerances from standard errors, and rate fits.

A check compares a measurement with a prediction in units of its standard error; ``Z_TOLERANCE`` standard
errors is the default acceptance band (two-sided false-alarm probability ≈ 6·10⁻⁵ per comparison for a
Gaussian estimate, so a suite of a few hundred comparisons raises a false alarm about 1% of the time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

__all__ = ["Z_TOLERANCE", "z_basis", "two_sided_p", "ratio_standard_error", "RateFit", "fit_exponential_rate",
           "fit_power_law"]

Z_TOLERANCE = 4.0


def two_sided_p(z: float) -> float:
    """P(|Z| > z) for a standard normal Z."""
    return float(2 * _scipy_stats.norm.sf(abs(z)))


def z_basis(k: float = Z_TOLERANCE, what: str = "Monte-Carlo standard errors") -> str:
    """Human-readable basis for a ``|z| < k`` rule."""
    return f"{k:g} {what} (two-sided false-alarm probability {two_sided_p(k):.1g} per comparison)"


def ratio_standard_error(numerator: float, denominator: float, se_denominator: float) -> float:
    """Delta-method SE of numerator/denominator when only the denominator is random."""
    return abs(numerator) * se_denominator / denominator**2


@dataclass(frozen=True)
class RateFit:
    """Least-squares fit of log y = intercept + slope · x over the chosen points."""

    slope: float
    intercept: float
    standard_error: float
    n_points: int
    x_range: tuple


def _fit(x, log_y) -> RateFit:
    x = np.asarray(x, float)
    log_y = np.asarray(log_y, float)
    if x.size < 3:
        raise ValueError(f"a rate fit needs at least 3 points, got {x.size}")
    result = _scipy_stats.linregress(x, log_y)
    return RateFit(slope=float(result.slope), intercept=float(result.intercept),
                   standard_error=float(result.stderr), n_points=int(x.size), x_range=(float(x.min()), float(x.max())))


def fit_exponential_rate(t, y, window: tuple[float, float]) -> RateFit:
    """Decay rate λ of y ≈ C·exp(−λt), fitted on the points whose y/y(0) lies in ``window`` (e.g. (1e-10, 1e-4)):
    late enough that faster modes have died out, early enough to be above the integrator's error floor.

    Returns the fit of log y on t; the *rate* is ``-fit.slope``.
    """
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    relative = y / y[0]
    keep = (relative >= window[0]) & (relative <= window[1]) & (y > 0)
    return _fit(t[keep], np.log(y[keep]))


def fit_power_law(x, y) -> RateFit:
    """Exponent p of y ≈ C·x^p: the slope of log y on log x."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    return _fit(np.log(x), np.log(y))
