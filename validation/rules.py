"""Verdict rules: a claim's test as one expression, whose numbers give the decision and its words together.

A :class:`Rule` carries the pass decision, the tolerance sentence, the statistical basis and the nominal false-FAIL
rate, all built from the same numbers, so the sentence in the report cannot say something other than the inequality
that decides. A claim returns ``Outcome(measured=…, predicted=…, rule=…)``; :func:`all_of` joins the rules of a
claim that tests several things (it passes when every part does, and its nominal false-FAIL rate is at most the sum
of the parts', the union bound).

The rules:

* :func:`round_off` — a deterministic identity: the largest deviation is below a round-off level;
* :func:`at_most` / :func:`at_least` — a deterministic bound on a computed quantity (a solver's accuracy, a
  theorem's threshold that holds on every instance);
* :func:`z_test` — |z| below k standard errors in each of ``count`` independent comparisons (normal), or in one
  direction only;
* :func:`t_test` — the same with Student's t at ``df`` degrees of freedom (a seed-mean over few seeds);
  :func:`t_quantile_test` the t quantile of a stated two-sided level per comparison;
* :func:`exponent` — a fitted rate within its tolerance of the predicted one;
* :func:`within` — each value inside its own interval (a confidence interval, a χ²_ν/ν acceptance interval, a
  Student-t bound on each entry's degrees of freedom), at a stated family-wise rate;
* :func:`condition` — a deterministic statement the paper makes on every instance, stated in words with its
  numbers (strictly increasing, every run escaped, …), for what the other rules cannot express.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from .stats import Z_TOLERANCE, two_sided_p

__all__ = ["Rule", "round_off", "at_most", "at_least", "z_test", "t_test", "t_quantile_test", "exponent", "within",
           "condition", "all_of"]


@dataclass(frozen=True)
class Rule:
    """A verdict with its words: ``passed``, the ``tolerance`` sentence, its ``basis`` and the nominal
    ``false_fail_rate`` (None when no chance failure is allowed: an identity, or a statement of every instance)."""

    passed: bool
    tolerance: str
    basis: str
    false_fail_rate: float | None = None

    def __and__(self, other: "Rule") -> "Rule":
        return all_of(self, other)


def _largest(values) -> float:
    values = np.ravel(np.asarray(values, dtype=float))
    return float(np.max(values)) if values.size else -np.inf


def _smallest(values) -> float:
    values = np.ravel(np.asarray(values, dtype=float))
    return float(np.min(values)) if values.size else np.inf


def round_off(deviation, level: float, *, what: str, basis: str) -> Rule:
    """Every ``deviation`` (a number or an array) below ``level``: two computations of one exact quantity that
    only float64 round-off separates."""
    largest = _largest(deviation)
    return Rule(bool(largest < level), f"{what} < {level:g}", basis)


def at_most(value, bound: float, *, what: str, basis: str, strict: bool = False,
            false_fail_rate: float | None = None) -> Rule:
    """Every ``value`` at most ``bound`` (below it when ``strict``): deterministically, or with the nominal
    ``false_fail_rate`` of a bound built from standard errors."""
    largest = _largest(value)
    passed = largest < bound if strict else largest <= bound
    return Rule(bool(passed), f"{what} {'<' if strict else '≤'} {bound:.3g}", basis, false_fail_rate)


def at_least(value, bound: float, *, what: str, basis: str, strict: bool = False,
             false_fail_rate: float | None = None) -> Rule:
    """Every ``value`` at least ``bound`` (above it when ``strict``): deterministically, or with the nominal
    ``false_fail_rate`` of an exact test whose statistic the value is (a confidence bound, say)."""
    smallest = _smallest(value)
    passed = smallest > bound if strict else smallest >= bound
    return Rule(bool(passed), f"{what} {'>' if strict else '≥'} {bound:g}", basis, false_fail_rate)


def z_test(z, *, what: str, k: float = Z_TOLERANCE, one_sided: bool = False,
           errors: str = "Monte-Carlo standard errors", rate_corrections=(), basis_note: str = "") -> Rule:
    """|z| < k in each of the comparisons ``z`` (z < k when ``one_sided``: only an excess is a failure), each z a
    difference over its standard error, normal under the theory. The nominal false-FAIL rate is the union bound
    over the comparisons, each comparison's tail plus its entry of ``rate_corrections`` where given (an Edgeworth
    term for a skewed mean, say); ``basis_note`` adds to the basis."""
    z = np.ravel(np.asarray(z, dtype=float))
    count = z.size
    per = float(scipy_stats.norm.sf(k)) if one_sided else two_sided_p(k)
    passed = bool(np.all(z < k) if one_sided else np.all(np.abs(z) < k))
    where = f" in each of {count} comparisons" if count > 1 else ""
    side = "one-sided" if one_sided else "two-sided"
    statistic = "z" if one_sided else "|z|"
    corrections = list(rate_corrections)
    if corrections and len(corrections) != count:
        raise ValueError(f"rate_corrections: one per comparison ({count}), got {len(corrections)}")
    rate = float(sum(per + c for c in corrections)) if corrections else count * per
    basis = f"{k:g} {errors} ({side} false-alarm probability {per:.1g} per comparison)"
    return Rule(passed, f"{statistic} < {k:g} ({what}){where}", basis + (f"; {basis_note}" if basis_note else ""), rate)


def t_test(t, df: int, *, what: str, k: float = Z_TOLERANCE, errors: str = "standard errors over seeds") -> Rule:
    """|t| < k in each comparison ``t``, Student's t with ``df`` degrees of freedom under the theory (a mean over
    df + 1 seeds)."""
    t = np.ravel(np.asarray(t, dtype=float))
    per = float(2 * scipy_stats.t.sf(k, df))
    where = f" in each of {t.size} comparisons" if t.size > 1 else ""
    return Rule(bool(np.all(np.abs(t) < k)), f"|t| < {k:g} ({what}){where}",
                f"{k:g} {errors} (t with {df} df: two-sided false-alarm probability {per:.1g} per comparison)",
                t.size * per)


def t_quantile_test(t, df: int, per_comparison: float, *, what: str,
                    errors: str = "standard errors over seeds", basis_note: str = "") -> Rule:
    """|t| below the Student-t quantile whose two-sided tail is ``per_comparison`` at ``df`` degrees of freedom, in
    each comparison ``t``: the nominal false-FAIL rate is ``per_comparison`` per comparison (union bound)."""
    t = np.ravel(np.asarray(t, dtype=float))
    bound = float(scipy_stats.t.isf(per_comparison / 2, df))
    where = f" in each of {t.size} comparisons" if t.size > 1 else ""
    return Rule(bool(np.all(np.abs(t) < bound)), f"|t| < {bound:.2f} ({what}){where}",
                f"Student t with {df} d.f. over {errors} at the two-sided level {per_comparison:.1g} per comparison"
                + (f"; {basis_note}" if basis_note else ""), t.size * per_comparison)


def exponent(fitted, predicted: float, tolerance, *, what: str, basis: str,
             false_fail_rate: float | None = None, strict: bool = False) -> Rule:
    """Each ``fitted`` rate within its ``tolerance`` (one number, or one per fit) of the ``predicted`` one (strictly
    inside when ``strict``)."""
    fitted = np.ravel(np.asarray(fitted, dtype=float))
    tolerance = np.broadcast_to(np.asarray(tolerance, dtype=float), fitted.shape)
    deviation = np.abs(fitted - predicted)
    passed = bool(np.all(deviation < tolerance if strict else deviation <= tolerance))
    low, high = float(tolerance.min()), float(tolerance.max())
    bound = f"{high:.3g}" if low == high else f"{low:.3g}–{high:.3g}"
    offset = f"+ {-predicted:g}" if predicted < 0 else f"− {predicted:g}"
    return Rule(passed, f"|{what} {offset}| {'<' if strict else '≤'} {bound}", basis, false_fail_rate)


def within(values, low, high, *, what: str, basis: str, false_fail_rate: float | None = None,
           strict: bool = False) -> Rule:
    """Each of ``values`` inside its interval [``low``, ``high``] (open when ``strict``); ``low`` and ``high`` are a
    number or one per value. ``false_fail_rate`` is the family's: the chance that any value falls outside its
    interval when the theory holds (the basis says how the intervals share it)."""
    values = np.ravel(np.asarray(values, dtype=float))
    low = np.broadcast_to(np.asarray(low, dtype=float), values.shape)
    high = np.broadcast_to(np.asarray(high, dtype=float), values.shape)
    inside = (low < values) & (values < high) if strict else (low <= values) & (values <= high)
    if values.size == 1:
        bracket = "(" if strict else "["
        where = f"in {bracket}{low[0]:.4g}, {high[0]:.4g}{')' if strict else ']'}"
    elif np.array_equal(low, -high):
        where = f"inside its interval in each of {values.size} comparisons (±{_span(high)})"
    else:
        where = (f"inside its interval in each of {values.size} comparisons (lower ends {_span(low)}, upper "
                 f"{_span(high)})")
    return Rule(bool(np.all(inside)), f"{what} {where}", basis, false_fail_rate)


def _span(ends) -> str:
    """The range of interval ends as printed: one number when they agree to the digits shown."""
    low, high = f"{ends.min():.3g}", f"{ends.max():.3g}"
    return low if low == high else f"{low} to {high}"


def condition(holds: bool, statement: str, *, basis: str, false_fail_rate: float | None = None) -> Rule:
    """A statement the check makes in words (with its numbers), decided by ``holds``."""
    return Rule(bool(holds), statement, basis, false_fail_rate)


def all_of(*rules: Rule, independent: bool = False) -> Rule:
    """Every rule passes. The sentences and distinct bases are joined; the nominal false-FAIL rate is the sum of
    the parts' (the union bound), or 1 − Π(1 − rᵢ) when the parts are ``independent`` (they test independent
    samples), None when no part allows a chance failure."""
    if not rules:
        raise ValueError("all_of needs at least one rule")
    bases = list(dict.fromkeys(rule.basis for rule in rules))
    rates = [rule.false_fail_rate for rule in rules if rule.false_fail_rate is not None]
    if not rates:
        rate = None
    elif independent:
        rate = 1 - math.prod(1 - r for r in rates)
    else:
        rate = float(sum(rates))
    return Rule(all(rule.passed for rule in rules), "; ".join(rule.tolerance for rule in rules), "; ".join(bases),
                rate)
