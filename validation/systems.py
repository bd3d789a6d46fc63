"""The System contract every paper follows, and the registry that finds systems through entry points.

A paper is one :class:`System` record, exported by a module and registered under the entry-point group
``attnflow.systems`` (attnflow's own papers register the same way, in setup.cfg)::

    [options.entry_points]
    attnflow.systems =
        my_paper = my_package.attnflow_plugin:SYSTEM

The registry reads the entry points' names from the installed metadata and imports a system's module only when
that system is asked for, so ``attnflow check scb`` imports SCB alone. Importing the module registers its claims
and observables (the ``@claim`` and ``@observable`` decorators); their dotted names start with the system's key.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable, Mapping

from attnflow.closed_forms.parameters import Parameter, describe, parse_parameters

from . import claims as _claims
from .claims import Claim, Observable

__all__ = ["System", "Parameter", "ENTRY_POINT_GROUP", "system_keys", "get_system", "all_systems", "registry",
           "select", "observables", "find_observable", "normalise_key", "TIER_MODULES", "TIER_CHOICES", "in_tier", "check_tier"]

ENTRY_POINT_GROUP = "attnflow.systems"

# Modules that register claims of a tier beyond "core" under the systems' keys (docs/deep.md). They import their
# heavy dependencies inside the claims, so they register without them; they are imported only when a tier other
# than "core" is asked for, or a claim of theirs is named.
TIER_MODULES = ("attnflow.validation.deep",)
TIER_CHOICES = ("core", "deep", "all")


@dataclass(frozen=True)
class System:
    """One paper: what it studies and how to run it.

    Attributes
    ----------
    key : str
        The registry key (``gd_beta``); claim names start with ``key + "."``. ``gd-beta`` is accepted as well.
    title, reference : str
        What the paper is and where it was published.
    problem : type
        The Problem class. It declares ``PARAMETERS`` (a tuple of :class:`Parameter`) and has a classmethod
        ``from_params(values) -> Problem`` that parses and validates text or Python values, refusing unknown
        names.
    population : callable
        ``population(problem, **options) -> Trajectory``: the theory side, the population (closed-form) dynamics.
    minibatch : callable
        ``minibatch(problem, *, seed, **options) -> Trajectory``: the paper's training algorithm on sampled data.
    population_options, minibatch_options : tuple of Parameter
        The options each of them takes (``attnflow solve/simulate --param``). A function decorated with
        ``attnflow.closed_forms.parameters.takes_options`` declares its own, and they are read from it (given
        here too, they must be the same records).
    summary : callable, optional
        ``summary(problem, *, seed, **options) -> dict``: the system's closed-form numbers at a problem, printed
        by ``attnflow solve`` (``seed`` drives any Monte-Carlo quantity in it).
    summary_options : tuple of Parameter
        The options ``summary`` takes.
    latex : callable, optional
        ``latex() -> str``: a symbolic derivation of the reduced system (``attnflow solve SYSTEM --latex``).
    docs : str
        Where the system's derivations are documented (a path in the repository or a URL).
    population_time, minibatch_time : str
        What the trajectories' times are (axis labels): flow time, GD step, …
    population_figure : callable, optional
        ``population_figure(trajectory, title, time_label, labels=None) -> Figure``: the figure of
        ``attnflow solve --plot``, for a system that draws its predicted rates beside the computed trajectory
        (default: every metric against time, ``plots.trajectory_figure``).
    labels : mapping
        A readable label for each metric key its trajectories record (``one_minus_corr`` → "1 − corr(θ, θ^mm)"):
        the panel titles of ``solve``/``simulate --plot``. Numbered keys share a pattern (``share_{k}`` →
        "share of token {k}" labels ``share_0``, ``share_1``, …); a key without a label is shown as it is.
    compare : callable, optional
        ``compare(problem, run, *, seed, **minibatch_options) -> Comparison`` (attnflow.validation.compare): the
        population or reduced prediction of the minibatch ``run`` in its own time units, with the diffusion band
        where the system has one and a note where the two legitimately differ (``attnflow simulate --compare``).
        ``seed`` drives any Monte-Carlo quantity of the prediction (independently of the run's).
    """

    key: str
    title: str
    reference: str
    problem: type
    population: Callable
    minibatch: Callable
    population_options: tuple = ()
    minibatch_options: tuple = ()
    summary: Callable | None = None
    summary_options: tuple = ()
    latex: Callable | None = None
    docs: str = ""
    population_time: str = "step"
    minibatch_time: str = "step"
    population_figure: Callable | None = None
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    compare: Callable | None = None

    def __post_init__(self):
        if not self.key.isidentifier() or self.key != self.key.lower():
            raise ValueError(f"a system key must be a lower-case identifier, got {self.key!r}")
        for name in ("PARAMETERS", "from_params"):
            if not hasattr(self.problem, name):
                raise ValueError(f"system {self.key}: its Problem class {self.problem.__name__} has no {name}")
        for run in ("population", "minibatch"):  # options declared once, on the function (takes_options)
            declared, given = getattr(getattr(self, run), "options", None), getattr(self, f"{run}_options")
            if declared is None:
                continue
            if given and tuple(given) != tuple(declared):
                raise ValueError(f"system {self.key}: {run}_options differ from the records its {run} function "
                                 "declares with takes_options; give them once, on the function")
            object.__setattr__(self, f"{run}_options", tuple(declared))

    def problem_from_params(self, values) -> object:
        """A validated Problem from ``values`` (name → text or value)."""
        return self.problem.from_params(values)

    def population_options_from(self, values) -> dict:
        return parse_parameters(self.population_options, values, owner=f"{self.key} population")

    def summary_options_from(self, values) -> dict:
        return parse_parameters(self.summary_options, values, owner=f"{self.key} summary")

    def minibatch_options_from(self, values) -> dict:
        return parse_parameters(self.minibatch_options, values, owner=f"{self.key} minibatch")

    def command_parameters(self, command: str) -> dict[str, tuple]:
        """What ``attnflow solve`` or ``simulate`` accepts, by group: the problem's parameters and the options of
        what the command runs (solve: the population dynamics and the summary; simulate: the minibatch run)."""
        if command == "solve":
            return {"problem": self.problem.PARAMETERS, "population options": self.population_options,
                    "summary options": self.summary_options}
        if command == "simulate":
            return {"problem": self.problem.PARAMETERS, "minibatch options": self.minibatch_options}
        raise ValueError(f"command must be solve or simulate, got {command!r}")

    def describe(self, command: str) -> str:
        """``attnflow solve/simulate SYSTEM --describe``: every parameter the command accepts, one line each, with
        its kind, bounds or choices, default (as ``--param`` takes it) and meaning."""
        groups = self.command_parameters(command)
        return "\n".join(f"{title}:\n" + "\n".join("  " + line for line in describe(specs))
                         for title, specs in groups.items() if specs)

    def split_parameters(self, command: str, values: Mapping) -> tuple[dict, dict]:
        """``values`` (name → text or value) split into the problem's and each option group's; a name the command
        does not accept is refused, listing those it does. A name of the problem and of an option group goes to
        the problem; a name in two option groups goes to both."""
        groups = self.command_parameters(command)
        problem_names = {p.name for p in groups["problem"]}
        options = {title: {p.name for p in specs} for title, specs in groups.items() if title != "problem"}
        known = problem_names.union(*options.values())
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown {self.key} parameter(s) {unknown}; {command} takes: {', '.join(sorted(known))} "
                             f"(--describe)")
        problem_values = {k: v for k, v in values.items() if k in problem_names}
        return problem_values, {title: {k: v for k, v in values.items() if k in names and k not in problem_names}
                                for title, names in options.items()}

    def label(self, key: str) -> str:
        """The readable label of a metric key (the key itself when the system declares none)."""
        from .plots import label_of

        return label_of(self.labels, key)

    def claims(self) -> list[Claim]:
        """The claims registered under this system's key, in registration order."""
        return [c for c in _claims.registered_claims().values() if c.system == self.key]

    def observables(self) -> dict[str, Observable]:
        return {n: o for n, o in _claims.registered_observables().items() if n.split(".", 1)[0] == self.key}


def normalise_key(name: str) -> str:
    """System keys and claim names are accepted with ``-`` for ``_`` (``gd-beta`` = ``gd_beta``)."""
    return name.strip().replace("-", "_")


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict:
    found = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = normalise_key(entry.name)
        if key in found and found[key].value != entry.value:
            raise ValueError(f"two installed packages register the system {key!r}: {found[key].value} and "
                             f"{entry.value}")
        found[key] = entry
    return found


def system_keys() -> list[str]:
    """The keys of every installed system (from the entry points; nothing is imported)."""
    return sorted(_entry_points())


_LOADED: dict[str, System] = {}


def get_system(key: str) -> System:
    """The System registered as ``key`` (``gd_beta`` or ``gd-beta``), importing its module on first use."""
    key = normalise_key(key)
    if key in _LOADED:
        return _LOADED[key]
    entries = _entry_points()
    if key not in entries:
        known = ", ".join(system_keys()) or "none installed"
        raise ValueError(f"unknown system {key!r} (systems: {known}; see 'attnflow list')")
    system = entries[key].load()
    if not isinstance(system, System):
        raise ValueError(f"the entry point {entries[key].value} of system {key!r} is not an attnflow System")
    if system.key != key:
        raise ValueError(f"the entry point {key!r} points at the system {system.key!r}")
    module = entries[key].value.partition(":")[0]
    strays = [c.name for c in _claims.registered_claims().values()
              if c.function.__module__ == module and c.system != key]
    if strays:  # they would vanish from list and check, which select claims by their system prefix
        raise ValueError(f"the module of system {key!r} registers claims under another system's name: "
                         f"{', '.join(strays)} (a claim is named '{key}.<claim>')")
    _LOADED[key] = system
    return system


def all_systems() -> list[System]:
    return [get_system(key) for key in system_keys()]


def _load_owner(name: str) -> None:
    """Load the system (or diagnostics module) that owns the dotted ``name``, if any."""
    prefix = normalise_key(name).split(".", 1)[0]
    if prefix in _entry_points():
        get_system(prefix)
    elif prefix == "sweep":
        from . import diagnostics  # noqa: F401  (registers the sweep machinery's diagnostic observable)


def _load_tiers() -> None:
    """Register the claims of every tier (TIER_MODULES)."""
    import importlib

    for module in TIER_MODULES:
        importlib.import_module(module)


def check_tier(tier: str) -> str:
    if tier not in TIER_CHOICES:
        raise ValueError(f"--tier must be one of {', '.join(TIER_CHOICES)}, got {tier!r}")
    return tier


def in_tier(claim: Claim, tier: str) -> bool:
    """``tier`` is one of TIER_CHOICES; ``all`` holds every claim."""
    return check_tier(tier) == "all" or claim.tier == tier


def registry() -> dict[str, Claim]:
    """Every claim of every installed system, of every tier."""
    all_systems()
    _load_tiers()
    return _claims.registered_claims()


def select(names=None, tier: str = "core") -> list[Claim]:
    """Claims for NAMES: whole systems (``gd_beta`` or ``gd-beta``) or single claims; all when empty.

    Systems and the empty selection give the claims of ``tier`` (``core``, ``deep`` or ``all``); a claim named
    in full is selected whatever its tier. Only the systems named are imported (and the tier modules, when a
    tier beyond ``core`` or one of their claims is asked for)."""
    if check_tier(tier) != "core":
        _load_tiers()
    if not names:
        all_systems()
        return [c for c in _claims.registered_claims().values() if in_tier(c, tier)]
    chosen: list[Claim] = []
    for raw in names:
        name = normalise_key(raw)
        if name in _entry_points():
            matches = [c for c in get_system(name).claims() if in_tier(c, tier)]
        else:
            _load_owner(name)
            claims = _claims.registered_claims()
            if name not in claims and name.partition(".")[0] in _entry_points():
                _load_tiers()
                claims = _claims.registered_claims()
            if name not in claims:
                known = ", ".join(system_keys())
                raise ValueError(f"unknown claim or system {raw!r} (systems: {known}; see 'attnflow list')")
            matches = [claims[name]]
        chosen.extend(c for c in matches if c not in chosen)
    return chosen


def observables() -> dict[str, Observable]:
    """Every sweepable observable of every installed system, and the sweep machinery's own diagnostics."""
    all_systems()
    _load_owner("sweep.")
    return _claims.registered_observables()


def find_observable(name: str) -> Observable | None:
    """The observable ``name``, loading only its owner; ``None`` if there is none of that name."""
    _load_owner(name)
    return _claims.registered_observables().get(normalise_key(name))
