"""The records a domain table is written in: what a public function accepts, and how to build valid arguments.

One :class:`Domain` per public function (``closed_forms/domains.py``, ``dynamics/domains.py``). Its arguments come
from four places, filled in this order for every argument without a default (and every one named in the entry):

* ``fixed``: values passed as they are;
* ``parameters``: scalar, boolean or choice arguments as :class:`Parameter` records, the same records the command
  line reads where the argument is a command-line option. Their bounds are the function's domain; the maximum of a
  size is its stated allocation bound;
* ``arrays`` (the entry's, then the system's :data:`ARRAYS`-style table): arrays of a shape set by the problem,
  valid when finite and of that shape;
* ``build(problem, rng)``: structured arguments (paths, prompts, a stochastic matrix) made from the problem.

A ``seed`` argument is drawn as :data:`SEED` unless the entry fixes it; an ``rng`` argument is a generator.

A function whose first argument is ``problem`` takes the system's Problem, built by ``Problem.from_params`` from
values inside ``Problem.PARAMETERS``, the records of ``--param`` (``given`` fixes some of them, as a function that
needs the prompt model does). Inside the domain a function returns finite values
(infinite ones only where ``limits`` says the closed form's limit is infinite, NaN only in an output the docstring
calls undefined there and ``undefined`` names), or raises one of the named outcomes in
``raises``, or a ValueError carrying one of ``refusals`` (a combination the per-parameter bounds cannot express, such
as an SVM that is infeasible on the drawn data). Outside it — one parameter past its bounds or of the wrong type, one
array non-finite or mis-shaped — it raises a ValueError naming that parameter.

``draws`` narrows what the tests draw (a largest value, or a (low, high) range) so each call is cheap, never the
domain; ``accepts`` lists values past a record's bounds that the function takes on purpose (ξ₂ = +∞ in one_nn).

``known`` records a finding not fixed yet: ``{"inside": why}`` or ``{"outside": why}`` marks that check as an
expected failure (strict: once fixed, the entry must drop it).

A numba kernel or an internal helper (``checked_by`` set) is reached only through the wrapper named there, which checks its inputs; the
table gives one valid argument set for it and nothing is pushed outside.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from attnflow.closed_forms.parameters import Parameter

__all__ = ["Domain", "Array", "SEED", "domain", "integer", "real", "choice", "flag"]

# Every random quantity flows from a seed: a non-negative integer (or a SeedSequence, which the table does not draw).
SEED = Parameter("seed", "integer", minimum=0)


@dataclass(frozen=True)
class Array:
    """An array argument of shape ``shape(problem)`` (a tuple, or a callable of the problem), entries standard normal
    times ``scale`` passed through ``make(entries, problem)`` when given (to make it symmetric, stochastic, …).
    ``strict_shape``: another shape is refused (False where any shape is an input, as for a batch)."""

    shape: Callable | tuple
    make: Callable | None = None
    scale: float = 1.0
    strict_shape: bool = True

    def shape_at(self, problem) -> tuple:
        return tuple(self.shape(problem) if callable(self.shape) else self.shape)

    def valid(self, problem, rng: np.random.Generator) -> np.ndarray:
        entries = self.scale * rng.standard_normal(self.shape_at(problem))
        return entries if self.make is None else self.make(entries, problem)


@dataclass(frozen=True)
class Domain:
    """The domain of one public function (see the module docstring)."""

    function: Callable
    system: str | None = "auto"
    parameters: tuple = ()
    arrays: Mapping[str, Array] = field(default_factory=dict)
    build: Callable | None = None
    fixed: Mapping = field(default_factory=dict)
    raises: tuple = ()
    refusals: tuple = ()
    limits: bool = False
    undefined: tuple = ()
    draws: Mapping[str, float | tuple] = field(default_factory=dict)
    accepts: Mapping[str, tuple] = field(default_factory=dict)
    checked_by: str = ""
    given: Mapping = field(default_factory=dict)
    known: Mapping[str, str] = field(default_factory=dict)

    @property
    def all_parameters(self) -> tuple:
        """``parameters``, and :data:`SEED` when the function takes a ``seed`` the entry does not fix."""
        function = getattr(self.function, "py_func", self.function)
        takes_seed = "seed" in inspect.signature(function).parameters
        declared = {spec.name for spec in self.parameters} | set(self.fixed)
        return self.parameters + ((SEED,) if takes_seed and "seed" not in declared else ())

    @property
    def module(self) -> str:
        function = getattr(self.function, "py_func", self.function)
        return function.__module__

    @property
    def name(self) -> str:
        """``closed_forms.gd_beta.icl_risk``: the module path below attnflow and the function's name."""
        function = getattr(self.function, "py_func", self.function)
        return f"{self.module.removeprefix('attnflow.')}.{function.__name__}"

    @property
    def system_key(self) -> str | None:
        """The system whose Problem the function takes (by default its module's name, when it takes a problem)."""
        return self.module.rsplit(".", 1)[1] if self.system == "auto" else self.system


def domain(function, *parameters: Parameter, **fields) -> Domain:
    """One entry in one line: ``domain(cf.icl_risk)``, ``domain(cf.t_density, integer("d", 2, 1000))``."""
    return Domain(function, parameters=tuple(parameters), **fields)


def integer(name: str, minimum: int | None = None, maximum: int | None = None) -> Parameter:
    """An integer argument in [minimum, maximum] (the maximum of a size is its allocation bound)."""
    return Parameter(name, "integer", minimum=minimum, maximum=maximum)


def real(name: str, minimum: float | None = None, maximum: float | None = None, *, strict: bool = False) -> Parameter:
    """A finite real argument, ``> minimum`` when ``strict``."""
    return Parameter(name, "real", minimum=minimum, maximum=maximum, strict=strict)


def choice(name: str, choices) -> Parameter:
    return Parameter(name, "choice", choices=tuple(choices))


def flag(name: str) -> Parameter:
    """A boolean argument that is checked to be True or False."""
    return Parameter(name, "boolean")
