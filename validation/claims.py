"""Claims: each theorem, lemma or figure of a paper as a named, runnable check.

A claim is a function registered under a dotted name (``gd_beta.optimal_parameters``) with its paper
reference and statement. It receives a ``numpy.random.SeedSequence`` and its settings (``quick`` for the
everyday suite, ``full`` for paper scale) and returns an :class:`Outcome`: what was measured, what theory
predicts, the tolerance and its statistical basis, and whether it passed. :func:`run_claim` adds the
metadata, the timing and the safety net (a non-finite number, or a measured/predicted key that is not a stable
snake_case id, is an ERROR, never a silent PASS).
"""
from __future__ import annotations

import enum
import inspect
import math
import re
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from attnflow import seeding

__all__ = ["Outcome", "Status", "CheckResult", "Claim", "claim", "run_claim", "ScalingLaw", "Observable", "observable",
           "registered_claims", "registered_observables", "to_jsonable", "STABLE_ID", "TIERS"]

TIERS = ("core", "deep")  # which suite a claim belongs to; `attnflow check` runs "core" unless --tier says otherwise
STABLE_ID = re.compile(r"^[a-z][a-z0-9_]*$")  # a measured/predicted key: what JSON readers and tests key on

_REGISTRY: dict[str, "Claim"] = {}
_OBSERVABLES: dict[str, "Observable"] = {}


class Status(str, enum.Enum):
    """A claim's verdict. A member equals its name as text (records, JSON and the command line keep "PASS") and
    carries what it means (``Status.FINDING.meaning``)."""

    PASS = "PASS"
    FAIL = "FAIL"
    FINDING = "FINDING"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def meaning(self) -> str:
        return _STATUS_MEANINGS[self]

    @property
    def as_registered(self) -> bool:
        """The outcome the claim registers: PASS, or its registered FINDING reproduced."""
        return self in (Status.PASS, Status.FINDING)


_STATUS_MEANINGS = {
    Status.PASS: "the paper's statement held as checked, within the stated tolerance",
    Status.FAIL: "the statement did not hold (or a registered finding did not reproduce): a chance failure at the "
                 "nominal rate, or a defect to look at",
    Status.FINDING: "a registered finding reproduced: the paper's statement is known not to hold as stated",
    Status.ERROR: "no verdict: the claim raised, or its outcome was malformed (non-finite, unnamed, no tolerance)",
}


@dataclass
class Outcome:
    """What a claim function returns.

    measured / predicted : id -> number (the headline comparison; shown in the table and JSON). Ids are stable
        snake_case names (``gap_largest_beta``); what a reader sees is in ``labels``.
    labels : id -> human label with notation (``"gap at largest ‖β*‖"``); an id without a label shows as itself.
    tolerance : the acceptance rule in words and numbers, e.g. "|z| < 4".
    basis : where the tolerance comes from, e.g. "4 Monte-Carlo standard errors (two-sided p ≈ 6e-5)".
    passed : the verdict.
    details : rows of a table with everything measured (one dict per configuration).
    figure : a zero-argument callable returning a matplotlib Figure, drawn only when a report asks for it.
    notes : anything a reader needs to interpret the numbers.
    false_fail_rate : the nominal probability that the check FAILs when the theory holds (from the tolerance's
        statistical basis). None when no chance failure is allowed: an identity to round-off or solver tolerance,
        or a threshold the theorem says holds on every instance; a calibration (docs/calibration.md) then counts
        any failure against a rate of 0.
    rule : a :class:`attnflow.validation.rules.Rule`, which gives ``passed``, ``tolerance``, ``basis`` and
        ``false_fail_rate`` from the same numbers (then none of the four is given by hand).
    """

    measured: dict
    predicted: dict
    tolerance: str = ""
    basis: str = ""
    passed: bool | None = None
    details: list = field(default_factory=list)
    figure: Callable | None = None
    notes: str = ""
    labels: dict = field(default_factory=dict)
    false_fail_rate: float | None = None
    rule: object = None

    def __post_init__(self):
        if self.rule is not None:
            if self.passed is not None or self.tolerance or self.basis or self.false_fail_rate is not None:
                raise ValueError("an Outcome with a rule takes its verdict, tolerance, basis and false-FAIL rate from "
                                 "the rule: give none of them by hand")
            self.passed, self.tolerance = self.rule.passed, self.rule.tolerance
            self.basis, self.false_fail_rate = self.rule.basis, self.rule.false_fail_rate
        elif self.passed is None:
            raise ValueError("an Outcome needs a rule, or passed with its tolerance and basis")


@dataclass
class CheckResult:
    name: str
    system: str
    reference: str
    statement: str
    status: str  # a Status (equal to its text: "PASS", "FAIL", "FINDING" or "ERROR")
    measured: dict
    predicted: dict
    tolerance: str
    basis: str
    details: list
    notes: str
    setting: str
    seed: int | dict  # the --seed integer, or the record of a SeedSequence (a sweep replicate's)
    seconds: float
    figure: Callable | None = None
    finding: str = ""  # the registered finding, for a claim whose paper statement is known not to hold
    labels: dict = field(default_factory=dict)
    false_fail_rate: float | None = None

    @property
    def passed(self) -> bool:
        """The paper's statement held as checked."""
        return self.status == Status.PASS

    @property
    def as_registered(self) -> bool:
        """The outcome is the registered one: PASS, or the registered FINDING reproduced."""
        return Status(self.status).as_registered

    def to_dict(self) -> dict:
        """JSON-ready: the documented, stable schema of ``attnflow check --json`` (docs/cli.md)."""
        return dict(
            name=self.name, system=self.system, reference=self.reference, statement=self.statement,
            status=self.status, passed=self.passed, as_registered=self.as_registered, finding=self.finding,
            measured=to_jsonable(self.measured),
            predicted=to_jsonable(self.predicted), tolerance=self.tolerance, basis=self.basis,
            labels={key: self.labels.get(key, key) for key in (*self.measured, *self.predicted)},
            false_fail_rate=self.false_fail_rate,
            details=to_jsonable(self.details), notes=self.notes, setting=self.setting, seed=self.seed,
            seconds=round(self.seconds, 3),
        )


@dataclass(frozen=True)
class Claim:
    name: str
    reference: str
    statement: str
    function: Callable
    quick: dict
    full: dict
    finding: str = ""
    tier: str = "core"  # "core": the everyday suite; "deep": trained multi-layer models (attnflow[deep], docs/deep.md)

    @property
    def system(self) -> str:
        return self.name.split(".", 1)[0]

    def seed_sequence(self, seed: seeding.SeedLike) -> np.random.SeedSequence:
        """Seed for this claim: derived from (seed, claim name), so selecting a subset changes no numbers."""
        return seeding.named(seed, self.name)


def claim(name: str, *, reference: str, statement: str, quick: dict, full: dict, finding: str = "",
          tier: str = "core"):
    """Register ``function(seed_sequence, **settings) -> Outcome`` as the claim ``name``.

    ``tier`` is ``core`` (the everyday suite) or ``deep`` (trained multi-layer models, run by ``attnflow check
    --tier deep``, docs/deep.md).

    ``finding`` registers a documented finding: the paper's statement, checked as stated, is known not to hold
    (one sentence and the docs section that explains it). Such a claim reports FINDING when its check fails as
    documented, and FAIL if the statement starts to hold (the finding no longer reproduces)."""

    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")

    def register(function):
        _check_declaration(name, reference, statement, function, quick, full, finding)
        earlier = _REGISTRY.get(name)
        if earlier is not None and _origin(earlier.function) != _origin(function):
            raise ValueError(f"claim {name!r} is registered twice: by {_origin(earlier.function)} and by "
                             f"{_origin(function)}")
        # the same function registered again (its module imported a second time) replaces itself
        _REGISTRY[name] = Claim(name, reference, statement, function, dict(quick), dict(full), finding, tier)
        return function

    return register


CLAIM_NAME = re.compile(r"^[a-z][a-z0-9_]*\.[A-Za-z][A-Za-z0-9_]*$")  # a system key, then the claim


def _origin(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def _check_declaration(name, reference, statement, function, quick, full, finding) -> None:
    """Refuse a claim declaration that could only fail later (under ``--full``, in ``list``, in a report): a name
    that is not ``system.claim``, an empty reference or statement, settings the function does not take or
    settings that leave one of its parameters unset."""
    if not isinstance(name, str) or not CLAIM_NAME.fullmatch(name):
        raise ValueError(f"claim name {name!r} must be 'system.claim': a system key, then letters, digits and _ "
                         "(e.g. 'gd_beta.risk_formula')")
    for field_name, text in (("reference", reference), ("statement", statement)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"claim {name}: the {field_name} must be a non-empty text")
    if not isinstance(finding, str):
        raise ValueError(f"claim {name}: finding must be a text (empty when the statement is expected to hold)")
    parameters = list(inspect.signature(function).parameters.values())
    if not parameters or parameters[0].kind not in (parameters[0].POSITIONAL_ONLY, parameters[0].POSITIONAL_OR_KEYWORD):
        raise ValueError(f"claim {name}: its function must take the seed as its first argument")
    takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters)
    named = {p.name: p for p in parameters[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {n for n, p in named.items() if p.default is p.empty}
    for setting, values in (("quick", quick), ("full", full)):
        if not isinstance(values, dict):
            raise ValueError(f"claim {name}: {setting} must be a dict of settings")
        unknown = sorted(set(values) - set(named)) if not takes_any else []
        if unknown:
            raise ValueError(f"claim {name}: {setting} settings {unknown} are not parameters of "
                             f"{function.__qualname__} (it takes {sorted(named)})")
        missing = sorted(required - set(values))
        if missing:
            raise ValueError(f"claim {name}: {setting} settings leave {missing} unset")


@dataclass(frozen=True)
class ScalingLaw:
    """What a theorem predicts for an observable across a sweep: ``y`` ∝ x^exponent (``loglog``) or
    ∝ exp(exponent·x) (``semilog``), where ``x`` is a swept parameter and ``y`` a returned metric."""

    x: str
    y: str
    exponent: float
    kind: str = "loglog"
    statement: str = ""


@dataclass(frozen=True)
class Observable:
    """A measurement to sweep: ``function(seed_sequence, **params) -> {metric: number}``."""

    name: str
    reference: str
    description: str
    function: Callable
    defaults: dict
    law: ScalingLaw | None = None

    def measure(self, seed: np.random.SeedSequence, **params) -> dict:
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(f"{self.name} has no parameter(s) {sorted(unknown)}; it takes {sorted(self.defaults)}")
        return self.function(seed, **{**self.defaults, **params})


def observable(name: str, *, reference: str, description: str, defaults: dict, law: ScalingLaw | None = None):
    """Register ``function(seed_sequence, **params) -> dict`` as the sweepable observable ``name``."""

    def register(function):
        if name in _OBSERVABLES or name in _REGISTRY:
            raise ValueError(f"{name!r} is registered twice")
        _OBSERVABLES[name] = Observable(name, reference, description, function, dict(defaults), law)
        return function

    return register


def registered_claims() -> dict[str, Claim]:
    """The claims registered so far (``attnflow.validation.systems.registry`` loads every system first)."""
    return dict(_REGISTRY)


def registered_observables() -> dict[str, Observable]:
    return dict(_OBSERVABLES)


def _all_finite(values) -> bool:
    if isinstance(values, dict):
        return all(_all_finite(v) for v in values.values())
    if isinstance(values, (list, tuple)):
        return all(_all_finite(v) for v in values)
    if isinstance(values, (bool, str)) or values is None:
        return True
    return bool(np.all(np.isfinite(np.asarray(values, dtype=float))))


def to_jsonable(value):
    """numpy scalars/arrays → Python; non-finite floats → strings (JSON has no inf/nan)."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    return value


def _caused_by_interrupt(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def run_claim(c: Claim, *, seed: seeding.SeedLike, full: bool = False, **overrides) -> CheckResult:
    """Run one claim at its quick (default) or full setting; ``overrides`` replace single settings.

    ``seed`` is the run's seed (``--seed``) or a SeedSequence (a sweep replicate's); the claim receives the child
    :func:`attnflow.seeding.named` derives for its name."""
    claim_seed = c.seed_sequence(seed)
    settings = dict(c.full if full else c.quick)
    unknown = set(overrides) - set(settings)
    if unknown:
        raise ValueError(f"{c.name} has no setting(s) {sorted(unknown)}; it takes {sorted(settings)}")
    settings.update(overrides)
    started = time.perf_counter()
    common = dict(name=c.name, system=c.system, reference=c.reference, statement=c.statement,
                  setting="full" if full else "quick", finding=c.finding,
                  seed=seed if not isinstance(seed, np.random.SeedSequence) else seeding.to_record(seed))
    try:
        outcome = c.function(claim_seed, **settings)
    except Exception as error:  # a claim that crashes is reported, not hidden, and the others still run
        if _caused_by_interrupt(error):  # Ctrl-C inside a compiled kernel surfaces as SystemError: stop, as asked
            raise KeyboardInterrupt from error
        return CheckResult(**common, status=Status.ERROR, measured={}, predicted={}, tolerance="", basis="",
                           details=[], notes=f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}",
                           seconds=time.perf_counter() - started)
    status = Status.PASS if outcome.passed else Status.FAIL
    notes = outcome.notes
    if c.finding:
        status = Status.FAIL if outcome.passed else Status.FINDING
        if outcome.passed:
            notes = (notes + " " if notes else "") + ("The registered finding did not reproduce: the paper's "
                                                      f"statement held this time. Finding: {c.finding}")
    if (outcome.measured or outcome.predicted) and not (str(outcome.tolerance).strip() and str(outcome.basis).strip()):
        status = Status.ERROR
        notes = (notes + " " if notes else "") + ("A verdict needs its tolerance and its basis; this outcome "
                                                  "leaves one of them empty.")
    if not (_all_finite(outcome.measured) and _all_finite(outcome.predicted)):
        status = Status.ERROR
        notes = (notes + " " if notes else "") + "A measured or predicted value is not finite."
    unstable = [key for key in dict.fromkeys((*outcome.measured, *outcome.predicted))
                if not (isinstance(key, str) and STABLE_ID.fullmatch(key))]
    if unstable:  # the values stay, so the numbers are not lost; the verdict cannot stand on unnamed keys
        status = Status.ERROR
        notes = (notes + " " if notes else "") + ("Measured/predicted keys must be snake_case ids "
                                                  f"(^[a-z][a-z0-9_]*$, labels go in Outcome.labels): {unstable!r}.")
    return CheckResult(**common, status=status, measured=outcome.measured, predicted=outcome.predicted,
                       tolerance=outcome.tolerance, basis=outcome.basis, details=outcome.details, notes=notes,
                       seconds=time.perf_counter() - started, figure=outcome.figure, labels=dict(outcome.labels),
                       false_fail_rate=outcome.false_fail_rate)
