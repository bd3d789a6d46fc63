"""Named parameters given as text (``--param N=10``) or as Python values, parsed and checked in one place.

A system declares its parameters as :class:`Parameter` records: the Problem's in ``Problem.PARAMETERS`` (read by
``Problem.from_params``), its dynamics' options in the System record. :func:`parse_parameters` turns a mapping of
names to text or numbers into checked values, refusing unknown names the same way for every system, so the
command line and the Python API accept exactly the same inputs. Every error is a ``ValueError`` naming the
parameter. :func:`takes_options` makes a function's keyword options read their defaults and bounds from the same
records, so an option is declared once.

Text forms: an integer or real (``10``, ``0.25``, ``1e3``), a vector as a comma list (``2,0``), a matrix as
rows separated by ``;`` (``1,.3;.3,.6``), a boolean as ``true``/``false``, a choice as one of its words.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Mapping

import numpy as np

__all__ = ["Parameter", "parse_parameters", "describe", "square_matrix", "takes_options"]

KINDS = ("integer", "real", "vector", "matrix", "boolean", "choice")


@dataclass(frozen=True)
class Parameter:
    """One named parameter.

    name : the key (``N``, ``sigma2``).
    kind : ``integer``, ``real``, ``vector`` (1-D), ``matrix`` (a scalar, a vector or a 2-D array: the system
        decides what each form means), ``boolean`` or ``choice``.
    default : the value when the parameter is not given (``None``: the system derives it or it is optional).
    help : one line for ``attnflow solve/simulate --describe`` and the docs.
    minimum, maximum : bounds for numbers (and for every entry of a vector or matrix); ``strict`` makes the
        minimum exclusive. The maximum keeps sizes that would exhaust memory or time from reaching a kernel.
    choices : the allowed words of a ``choice``.
    """

    name: str
    kind: str
    default: object = None
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False
    choices: tuple = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"parameter {self.name}: kind must be one of {KINDS}, got {self.kind!r}")

    def parse(self, value):
        """The checked value of ``value`` (text or a Python value)."""
        parse = getattr(self, f"_parse_{self.kind}")
        return parse(value)

    def signature(self) -> str:
        """The kind with its bounds or choices: ``integer >= 1, <= 1000000``, ``real > 0``, ``choice: adam | sgd``."""
        if self.kind == "choice":
            return "choice: " + " | ".join(self.choices)
        bounds = []
        if self.minimum is not None:
            bounds.append(f"{'>' if self.strict else '>='} {_number_text(self.minimum)}")
        if self.maximum is not None:
            bounds.append(f"<= {_number_text(self.maximum)}")
        entries = " each entry" if self.kind in ("vector", "matrix") and bounds else ""
        return self.kind + (f",{entries} " + ", ".join(bounds) if bounds else "")

    def default_text(self) -> str:
        """The default as ``--param`` would take it (``derived`` when the system derives it)."""
        return "derived" if self.default is None else self.text(self.default)

    def text(self, value) -> str:
        """``value`` in the text form :meth:`parse` reads: ``true``, ``0.25``, ``2,0``, ``1,0.3;0.3,0.6``."""
        if isinstance(value, (bool, np.bool_)):
            return "true" if value else "false"
        if isinstance(value, str):
            return value
        array = np.asarray(value)
        if array.ndim == 0:
            return _number_text(array.item())
        if array.ndim == 1:
            return ",".join(_number_text(v) for v in array.tolist())
        return ";".join(",".join(_number_text(v) for v in row) for row in array.tolist())

    # ---- kinds -----------------------------------------------------------------------------------------------

    def _number(self, value, what: str) -> float:
        if isinstance(value, str):
            text = value.strip()
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"parameter {self.name} must be {what}, got {value!r}") from None
        elif isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_)):
            number = float(value)
        else:
            raise ValueError(f"parameter {self.name} must be {what}, got {value!r}")
        if not math.isfinite(number):
            raise ValueError(f"parameter {self.name} must be finite, got {value!r}")
        return number

    def _bounded(self, number: float) -> None:
        if self.minimum is not None and (number < self.minimum or (self.strict and number == self.minimum)):
            relation = ">" if self.strict else ">="
            raise ValueError(f"parameter {self.name} must be {relation} {self.minimum:g}, got {number:g}")
        if self.maximum is not None and number > self.maximum:
            raise ValueError(f"parameter {self.name} must be <= {self.maximum:g}, got {number:g}")

    def _parse_integer(self, value) -> int:
        number = self._number(value, "an integer")
        if not number.is_integer():
            raise ValueError(f"parameter {self.name} must be an integer, got {value!r}")
        self._bounded(number)
        return int(number)

    def _parse_real(self, value) -> float:
        number = self._number(value, "a real number")
        self._bounded(number)
        return number

    def _array(self, value) -> np.ndarray:
        if isinstance(value, str):
            rows = [row.split(",") for row in value.split(";")] if ";" in value else [value.split(",")]
            if len({len(row) for row in rows}) != 1:
                raise ValueError(f"parameter {self.name}: every row of a matrix needs the same number of entries, "
                                 f"got {value!r}")
            array = np.array([[self._number(entry, "a list of numbers") for entry in row] for row in rows])
            array = array if ";" in value else array[0]
            if array.size == 1 and ";" not in value and "," not in value:
                array = array.reshape(())
        else:
            try:
                array = np.array(value, dtype=float)
            except (TypeError, ValueError):
                raise ValueError(f"parameter {self.name} must be numeric, got {value!r}") from None
            if not np.all(np.isfinite(array)):
                raise ValueError(f"parameter {self.name} must be finite, got {value!r}")
        for entry in np.ravel(array):
            self._bounded(float(entry))
        return array

    def _parse_vector(self, value) -> np.ndarray:
        array = np.atleast_1d(self._array(value))
        if array.ndim != 1:
            raise ValueError(f"parameter {self.name} must be a comma list, got shape {array.shape}")
        return array

    def _parse_matrix(self, value) -> np.ndarray:
        array = self._array(value)
        if array.ndim > 2:
            raise ValueError(f"parameter {self.name} must be a number, a comma list or ;-separated rows")
        return array

    def _parse_boolean(self, value) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.strip().lower() in ("true", "1", "yes")
        raise ValueError(f"parameter {self.name} must be true or false, got {value!r}")

    def _parse_choice(self, value) -> str:
        text = str(value).strip()
        if text not in self.choices:
            raise ValueError(f"parameter {self.name} must be one of {', '.join(self.choices)}; got {value!r}")
        return text


def parse_parameters(specs, values: Mapping, *, owner: str) -> dict:
    """Checked values for ``values`` (name → text or value) under ``specs``; absent ones take their defaults.

    Unknown names are refused with a ``ValueError`` listing the known ones, for ``owner`` (e.g. ``gd_beta``).
    A default of ``None`` stays ``None``: the caller derives the value.
    """
    known = {spec.name: spec for spec in specs}
    unknown = [name for name in values if name not in known]
    if unknown:
        raise ValueError(f"unknown {owner} parameter(s) {sorted(unknown)}; known: {', '.join(known) or 'none'}")
    parsed = {}
    for name, spec in known.items():
        if name in values and values[name] is not None:
            parsed[name] = spec.parse(values[name])
        else:
            parsed[name] = spec.default
    return parsed


def takes_options(*specs: Parameter):
    """Declare a function's keyword options once, as :class:`Parameter` records: each record gives the keyword its
    default (the signature names the option without one) and its type, bounds and choices, checked on every call as
    ``--param`` checks them, so the function, the command line, ``--describe`` and the domain tables cannot drift.
    An option whose record defaults to None also accepts None (the function derives the value). The records are
    the wrapper's ``options``."""

    def decorate(function):
        signature = inspect.signature(function)
        for spec in specs:
            parameter = signature.parameters.get(spec.name)
            if parameter is None or parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise TypeError(f"{function.__qualname__}: option {spec.name} must be a keyword-only argument")
            if parameter.default is not inspect.Parameter.empty:
                raise TypeError(f"{function.__qualname__}: option {spec.name} has a default in its signature; "
                                "its record is its one declaration")
        function.__kwdefaults__ = {**(function.__kwdefaults__ or {}), **{spec.name: spec.default for spec in specs}}

        @functools.wraps(function)
        def with_checked_options(*args, **kwargs):
            for spec in specs:
                if spec.name in kwargs and not (kwargs[spec.name] is None and spec.default is None):
                    kwargs[spec.name] = spec.parse(kwargs[spec.name])
            return function(*args, **kwargs)

        with_checked_options.options = specs
        return with_checked_options

    return decorate


def describe(specs) -> list[str]:
    """One line per parameter: name, kind, bounds or choices, default (in the text form ``--param`` takes) and help
    (``attnflow solve SYSTEM --describe``)."""
    return [f"{spec.name} ({spec.signature()}, default {spec.default_text()}): {spec.help}" for spec in specs]


def _number_text(value) -> str:
    """A number as the shortest text that reads back to it (``10``, ``0.25``, ``1e-06``)."""
    if isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    return repr(float(value))


def square_matrix(value, name: str, d: int) -> np.ndarray:
    """A parsed ``matrix`` parameter as a d×d matrix: a scalar c means c·I, a vector the diagonal, a matrix itself
    (the forms ``--param H=1``, ``H=1,2,3``, ``H=1,.3;.3,.6``). Wrong sizes are a ValueError naming ``name``."""
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"d must be a positive integer (the size of {name}), got {d!r}")
    value = np.asarray(value, dtype=float)
    if value.ndim == 0:
        return float(value) * np.eye(d)
    if value.ndim == 1:
        if value.size != d:
            raise ValueError(f"{name} must have d = {d} diagonal entries, got {value.size}")
        return np.diag(value)
    if value.shape != (d, d):
        raise ValueError(f"{name} must be {d}x{d}, got shape {value.shape}")
    return value
