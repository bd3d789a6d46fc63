"""Tolerances from standard errors, and rate fits.

A check compares a measurement with a prediction in units of its standard error; ``Z_TOLERANCE`` standard
errors is the default acceptance band (two-sided false-alarm probability ≈ 6·10⁻⁵ per comparison for a
Gaussian estimate, so a suite of a few hundred comparisons raises a false alarm about 1% of the time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

from attnflow import seeding

__all__ = ["Z_TOLERANCE", "z_basis", "two_sided_p", "ratio_standard_error", "clopper_pearson", "ClusteredInterval",
           "clustered_clopper_pearson", "sign_test_threshold", "RateFit",
           "fit_exponential_rate", "fit_power_law", "satterthwaite_df", "variance_ratio_interval",
           "widen_for_prediction_error", "welch_df",
           "Extrapolation", "richardson_in_batch", "ExponentFit", "fit_exponent_t", "fit_exponent_difference", "fit_exponent"]

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


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided binomial (Clopper–Pearson) interval for ``k`` successes in ``n`` trials at ``level``."""
    if not (0 <= k <= n) or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k = {k}, n = {n}")
    alpha = 1 - level
    low = 0.0 if k == 0 else float(_scipy_stats.beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(_scipy_stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class ClusteredInterval:
    """A proportion's interval from clustered trials: ``low``, ``high`` and the effective number of independent
    trials it stands for (``n_effective``, at most the number of trials)."""
    low: float
    high: float
    n_effective: float


def clustered_clopper_pearson(successes, trials, level: float = 0.95) -> ClusteredInterval:
    """Clopper–Pearson interval for a proportion whose trials come in clusters that share a random cause
    (sequences scored by one trained matrix), by Korn & Graubard's effective sample size (Survey Methodology
    24:193, 1998).

    ``successes[i]`` of ``trials[i]`` trials in cluster i. The pooled p̂ = Σsᵢ/Σnᵢ has the cluster-robust variance
    v = m/(m − 1)·Σ(sᵢ − p̂nᵢ)²/(Σnᵢ)² over m clusters; the effective sample size p̂(1 − p̂)/v, scaled by
    (t_{N−1}/t_{m−1})² for the m − 1 degrees of freedom v rests on, replaces N = Σnᵢ in the exact binomial interval
    (Beta quantiles at non-integer counts). Choice: the design effect is floored at 1 (n_effective ≤ N before the
    degrees-of-freedom factor), so clustered trials never count as more informative than independent ones; with
    v = 0 (every cluster at p̂, as when all trials succeed) it is 1. The interval is an approximation, not exact:
    its one-sided coverage is measured in tests/test_stats.py."""
    s, n = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
    if s.ndim != 1 or s.shape != n.shape:
        raise ValueError(f"successes and trials must be 1-d of one length, got shapes {s.shape} and {n.shape}")
    if s.size < 2:
        raise ValueError(f"need at least 2 clusters, got {s.size}")
    if not (np.all(np.isfinite(n)) and np.all(n >= 0) and np.all((0 <= s) & (s <= n))):
        raise ValueError("need 0 <= successes[i] <= trials[i] in every cluster")
    if not (0 < level < 1):
        raise ValueError(f"level must lie in (0, 1), got {level}")
    total = n.sum()
    if total < 2:
        raise ValueError(f"need at least 2 trials in all, got {total:g}")
    p = s.sum() / total
    m = s.size
    variance = m / (m - 1) * np.sum((s - p * n) ** 2) / total**2
    design_effect = max(1.0, variance / (p * (1 - p) / total)) if 0 < p < 1 else 1.0
    alpha = 1 - level
    n_effective = total / design_effect * (_scipy_stats.t.ppf(alpha / 2, total - 1)
                                           / _scipy_stats.t.ppf(alpha / 2, m - 1)) ** 2
    x = n_effective * p
    low = 0.0 if p == 0 else float(_scipy_stats.beta.ppf(alpha / 2, x, n_effective - x + 1))
    high = 1.0 if p == 1 else float(_scipy_stats.beta.ppf(1 - alpha / 2, x + 1, n_effective - x))
    return ClusteredInterval(low, high, float(n_effective))


def sign_test_threshold(n: int, alpha: float) -> tuple[int, float]:
    """The exact one-sided sign test of "the population median is at most a level" on ``n`` independent values.

    Returns the smallest count k of values above the level at which the test rejects at ``alpha``, and its exact
    false-alarm probability P(Binomial(n, ½) ≥ k) ≤ ``alpha`` when the median equals the level (smaller when it is
    below). It is distribution-free: only P(value > level) ≤ ½ is assumed. ``(n + 1, 0.0)`` when no count
    rejects, which happens for n < log₂(1/alpha).

    A PASS means "not shown to exceed", and with few values the test has little power near the level: with
    n = 10 it rejects only when all ten are above, so it catches a population with P(value > level) = 0.9 in 35%
    of runs and one at 0.97 in 74%. Claims that use it report that power."""
    if isinstance(n, bool) or not (isinstance(n, (int, np.integer)) and n >= 0):
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if not (0 < alpha < 1):
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    for k in range(n + 1):
        rate = float(_scipy_stats.binom.sf(k - 1, n, 0.5))
        if rate <= alpha:
            return k, rate
    return n + 1, 0.0


def satterthwaite_df(covariance, n_samples: int) -> float:
    """Degrees of freedom ν of tr Ĉ for the sample covariance Ĉ of ``n_samples`` Gaussian vectors with covariance
    C: (n − 1)tr Ĉ is Σλᵢχ²_{n−1} (λ the eigenvalues of C), matched in mean and variance by tr C·χ²_ν/ν with
    ν = (n − 1)(Σλ)²/Σλ² (Satterthwaite 1946)."""
    eigenvalues = np.clip(np.linalg.eigvalsh(np.asarray(covariance, float)), 0.0, None)
    if n_samples < 2 or eigenvalues.sum() <= 0:
        raise ValueError("need n_samples >= 2 and a non-zero covariance")
    return float((n_samples - 1) * eigenvalues.sum() ** 2 / np.sum(eigenvalues**2))


def variance_ratio_interval(df1: float, df2: float | None, alpha: float) -> tuple[float, float]:
    """Two-sided 1 − α acceptance interval of a ratio of variance estimates whose true ratio is 1: χ²_ν/ν for an
    estimate against an exact variance (``df2`` None), the F(ν₁, ν₂) distribution for two independent estimates."""
    if df2 is None:
        dist = _scipy_stats.chi2(df1)
        return float(dist.ppf(alpha / 2) / df1), float(dist.ppf(1 - alpha / 2) / df1)
    dist = _scipy_stats.f(df1, df2)
    return float(dist.ppf(alpha / 2)), float(dist.ppf(1 - alpha / 2))


def widen_for_prediction_error(low: float, high: float, relative_se: float, df: float, alpha: float) -> tuple:
    """An acceptance interval [low, high] for measured/predicted, widened for a prediction that is itself an
    estimate, P̂ = P(1 + δ) with δ/``relative_se`` Student-t with ``df`` degrees of freedom: with |δ| <= t·r
    (probability 1 − α), measured/P̂ lies in [low/(1 + t·r), high/(1 − t·r)]. Spending α here and the interval's own
    level elsewhere, the two add (Bonferroni). When t·r >= 1 the prediction may be zero at that level and the
    upper end is unbounded (inf): the comparison can then only fail from below."""
    widen = float(_scipy_stats.t.isf(alpha / 2, df)) * relative_se
    return low / (1 + widen), (high / (1 - widen) if widen < 1 else float("inf"))


def welch_df(se_a: float, df_a: float, se_b: float, df_b: float) -> float:
    """Welch–Satterthwaite degrees of freedom of a difference of two independent estimates with standard errors
    se_a, se_b on df_a, df_b degrees of freedom."""
    total = se_a**2 + se_b**2
    parts = (se_a**4 / df_a if se_a else 0.0) + (se_b**4 / df_b if se_b else 0.0)
    return float(total**2 / parts) if parts > 0 else float("inf")


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


# ==================================================================================================
# Minibatch bias: extrapolation in the batch size
# ==================================================================================================

@dataclass(frozen=True)
class Extrapolation:
    """A seed-mean extrapolated to B → ∞ from batch sizes B and 2B, with its Student-t reference."""

    estimate: float
    standard_error: float
    df: float  # Welch–Satterthwaite degrees of freedom
    mean_at_B: float
    mean_at_2B: float

    def critical(self, two_sided_rate: float) -> float:
        """|t| above which the estimate is refused at the two-sided false-alarm probability ``two_sided_rate``."""
        return float(_scipy_stats.t.isf(two_sided_rate / 2, self.df))

    def t(self, predicted: float) -> float:
        return (self.estimate - predicted) / self.standard_error


def richardson_in_batch(at_B, at_2B) -> Extrapolation:
    """Extrapolate a minibatch seed-mean whose bias is c/B to B → ∞: 2·mean(2B) − mean(B) (Richardson in 1/B; what
    is left is O(1/B²)).

    Minibatch GD's mean iterate drifts from the population map by a term of order η²·Var(noise) ∝ 1/B, the same
    in expectation for every seed; independent seeds at B and 2B remove it. The two samples have different
    variances, so the standard error is Welch's and the reference a Student t with Welch–Satterthwaite degrees of
    freedom."""
    at_B, at_2B = np.asarray(at_B, float), np.asarray(at_2B, float)
    if at_B.ndim != 1 or at_2B.ndim != 1 or at_B.size < 2 or at_2B.size < 2:
        raise ValueError("at_B and at_2B must each hold at least 2 seeds' values")
    if not (np.all(np.isfinite(at_B)) and np.all(np.isfinite(at_2B))):
        raise ValueError("at_B and at_2B must be finite")
    var_B = at_B.var(ddof=1) / at_B.size
    var_2B = 4 * at_2B.var(ddof=1) / at_2B.size
    total = var_B + var_2B
    if total <= 0:
        raise ValueError("the seeds' values do not vary: no standard error to test against")
    df = total**2 / (var_B**2 / (at_B.size - 1) + var_2B**2 / (at_2B.size - 1))
    return Extrapolation(estimate=float(2 * at_2B.mean() - at_B.mean()), standard_error=float(np.sqrt(total)),
                         df=float(df), mean_at_B=float(at_B.mean()), mean_at_2B=float(at_2B.mean()))


# ==================================================================================================
# Scaling laws across a sweep: exponent fits with bootstrap intervals over seeds
# ==================================================================================================

FIT_KINDS = ("loglog", "semilog")


@dataclass(frozen=True)
class ExponentFit:
    """A scaling exponent with an interval over seeds: an expanded-percentile bootstrap (Hesterberg, "What teachers
    should know about the bootstrap", Am. Stat. 69, 2015; ``n_boot`` resamples) or a delta-method Student-t
    interval (``n_boot = 0``, ``method`` says which).

    ``kind="loglog"``: y ≈ C·x^p, ``estimate`` = p. ``kind="semilog"``: y ≈ C·exp(p·x) (so p = −c for exp(−cx)).
    The interval resamples whole seeds (columns), keeping each seed's values at all x together (paired design).
    """

    kind: str
    estimate: float
    low: float
    high: float
    level: float
    n_boot: int
    n_seeds: int
    method: str = "expanded-percentile bootstrap over seeds"

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def _slopes(x, log_means):
    """Least-squares slopes of each row of ``log_means`` (…, n_x) on x (n_x,)."""
    xc = x - x.mean()
    return (log_means - log_means.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)


def _expanded_alpha(level: float, n_seeds: int) -> float:
    """Expanded percentile level (Hesterberg 2015): the plain percentile bootstrap under-covers with few seeds
    (0.91 at nominal 0.95 with 12 seeds); widening α by the t quantile and sqrt(n/(n−1)) fixes that."""
    alpha = (1 - level) / 2
    return float(_scipy_stats.norm.cdf(np.sqrt(n_seeds / (n_seeds - 1)) * _scipy_stats.t.ppf(alpha, n_seeds - 1)))


def _exponent_estimate(x, y, kind, level, quantile=None):
    """Checked inputs of an exponent fit and its point estimate: (x, xs = log x or x, y, slope of the log seed
    statistic on xs). Raises ValueError naming what is wrong."""
    if kind not in FIT_KINDS:
        raise ValueError(f"kind must be one of {FIT_KINDS}, got {kind!r}")
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if y.ndim != 2 or y.shape[0] != x.size:
        raise ValueError(f"y must have shape (len(x), n_seeds) = ({x.size}, …), got {y.shape}")
    if np.unique(x).size < 3:
        raise ValueError("x must hold at least 3 distinct grid values")
    if y.shape[1] < 2:
        raise ValueError("an interval over seeds needs at least 2 seeds")
    if not (0 < level < 1):
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if not np.all(np.isfinite(y)) or not np.all(np.isfinite(x)):
        raise ValueError("x and y must be finite")
    if kind == "loglog" and np.any(x <= 0):
        raise ValueError("x must be > 0 for a log-log fit")
    xs = np.log(x) if kind == "loglog" else x
    if quantile is not None and not (0 < quantile < 1):
        raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
    means = _seed_statistic(y, quantile)
    if np.any(means <= 0):
        raise ValueError("the seed statistic of y must be > 0 at every grid value to take logs")
    return x, xs, y, float(_slopes(xs, np.log(means)))


def _delta_scores(xs, y):
    """Per-seed scores z_i = Σ_k c_k y_ki/m_k of the delta method (see :func:`fit_exponent_t`)."""
    weights = (xs - xs.mean()) / np.sum((xs - xs.mean()) ** 2)
    return (weights / y.mean(axis=1)) @ y


def _student_t_fit(kind, estimate, scores, level) -> ExponentFit:
    n_seeds = scores.size
    if not np.ptp(scores) > 0:
        raise ValueError("the per-seed scores do not vary: the seeds give no interval")
    half = float(_scipy_stats.t.ppf(0.5 + level / 2, n_seeds - 1) * scores.std(ddof=1) / np.sqrt(n_seeds))
    return ExponentFit(kind=kind, estimate=estimate, low=estimate - half, high=estimate + half,
                       level=level, n_boot=0, n_seeds=n_seeds,
                       method=f"delta method over seeds, Student t with {n_seeds - 1} degrees of freedom")


def fit_exponent_t(x, y, *, kind: str = "loglog", level: float = 0.95) -> ExponentFit:
    """The exponent of the seed-mean of ``y`` against ``x`` with a delta-method Student-t interval over seeds.

    The estimate is the least-squares slope p̂ = Σ_k c_k log m_k of the log seed-means m_k on (log) x, with
    c_k = (x_k − x̄)/Σ(x − x̄)². To first order p̂ − p = Σ_k c_k (m_k − μ_k)/μ_k = mean over seeds i of
    z_i = Σ_k c_k y_ki/m_k (up to a constant), so its standard error is sd(z)/√n, taken over whole seeds: a seed's
    values at every x stay together, which keeps the correlation of a paired design (one seed's draws shared by
    every grid value). The reference is Student's t with n − 1 degrees of freedom. Unlike a percentile bootstrap
    of a few seeds, it does not shrink with the sample when a skewed mean comes out low."""
    x, xs, y, estimate = _exponent_estimate(x, y, kind, level)
    return _student_t_fit(kind, estimate, _delta_scores(xs, y), level)


def fit_exponent_difference(x, y_a, y_b, *, kind: str = "loglog", level: float = 0.95) -> ExponentFit:
    """Exponent of ``y_a`` minus exponent of ``y_b`` (both (n_x, n_seeds), seed i of each measured on the same
    data), with the delta-method Student-t interval of :func:`fit_exponent_t` applied to the per-seed differences
    of scores z_i^a − z_i^b: pairing the seeds keeps their correlation, so the interval is narrower than comparing
    two separate intervals. The t reference with n − 1 degrees of freedom is approximate: the suite measures
    coverage 0.94–0.95 at nominal 0.95 with 12 seeds of mildly skewed data; heavy skew lowers it."""
    _, xs, y_a, estimate_a = _exponent_estimate(x, y_a, kind, level)
    _, _, y_b, estimate_b = _exponent_estimate(x, y_b, kind, level)
    if y_a.shape != y_b.shape:
        raise ValueError(f"y_a and y_b must have the same shape, got {y_a.shape} and {y_b.shape}")
    return _student_t_fit(kind, estimate_a - estimate_b, _delta_scores(xs, y_a) - _delta_scores(xs, y_b), level)


def _seed_statistic(y, quantile):
    """The seed-mean of ``y`` (…, n_seeds), or its ``quantile`` as an order statistic (numpy's inverted CDF: the
    smallest value at least that fraction of seeds reach)."""
    if quantile is None:
        return y.mean(axis=-1)
    return np.quantile(y, quantile, axis=-1, method="inverted_cdf")


def fit_exponent(x, y, *, seed, kind: str = "loglog", n_boot: int = 2000, level: float = 0.95,
                 quantile: float | None = None) -> ExponentFit:
    """Fit the exponent of the seed-mean of ``y`` (or of its ``quantile`` over seeds) against ``x`` with a
    bootstrap interval over seeds.

    Parameters
    ----------
    x : array_like, shape (n_x,)
        Grid values (> 0 for ``loglog``), at least 3 distinct.
    y : array_like, shape (n_x, n_seeds)
        One measurement per grid value and seed; seed-means must be > 0.
    kind : "loglog" or "semilog"
    n_boot : int
        Bootstrap resamples of the seeds.
    level : float
        Two-sided interval level in (0, 1).
    seed : int or SeedSequence
        Seed of the bootstrap resampling (required: a claim passes a child of its own seed).
    quantile : float in (0, 1), optional
        Fit this quantile over seeds instead of the mean (e.g. 0.9 for a critical batch that 90% of seeds reach).
    """
    x, xs, y, estimate = _exponent_estimate(x, y, kind, level, quantile)
    rng = np.random.default_rng(seeding.as_seed_sequence(seed))
    n_seeds = y.shape[1]
    columns = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    boot_means = _seed_statistic(y[:, columns], quantile).T  # (n_boot, n_x)
    valid = np.all(boot_means > 0, axis=1)
    slopes = _slopes(xs, np.log(boot_means[valid]))
    expanded = _expanded_alpha(level, n_seeds)
    low, high = np.quantile(slopes, [expanded, 1 - expanded])
    return ExponentFit(kind=kind, estimate=estimate, low=float(low), high=float(high), level=level,
                       n_boot=int(valid.sum()), n_seeds=n_seeds)
