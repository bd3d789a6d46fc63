"""Every public function of closed_forms and dynamics, driven from its entry in the domain tables
(closed_forms/domains.py, dynamics/domains.py):

* every public function has an entry, so a new function without a stated domain fails here;
* inside the domain (values drawn within each Parameter's bounds, the Problem from ``Problem.PARAMETERS`` as the
  command line builds it) the output is finite, or one of the named outcomes the entry lists;
* outside it (one parameter past its bounds, of the wrong type or non-finite, one array non-finite or mis-shaped) the
  call raises a ValueError naming that parameter, never a numba typing error, an IndexError, a LinAlgError, a
  ZeroDivisionError, a MemoryError or a NaN.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import numbers
import pkgutil
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnflow import closed_forms, dynamics
from attnflow.closed_forms import domains as cf_domains
from attnflow.dynamics import domains as dyn_domains
from attnflow.validation import systems

ENTRIES = {entry.name: entry for entry in (*cf_domains.DOMAINS, *dyn_domains.DOMAINS)}
PROBLEMS = cf_domains.PROBLEMS  # system key -> (Problem class, largest values drawn)
INSIDE = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
TABLE_MODULES = ("domains", "domain_table")  # the tables themselves
# The deep tier's JAX functions are traced inside jit, where a value cannot be checked; their boundary is the claim
# settings (validation/deep.py) and GPTConfig, tested in tests/test_deep.py.
OPTIONAL_MODULES = ("deep",)
# Compile-time code of the integrators: numba overloads and intrinsics that exist only inside a compiled function
# (tests/test_numba_compat.py, tests/test_tableaus.py and tests/test_integrate.py test them through the integrators).
COMPILE_TIME_MODULES = ("numba_compat", "rk_kernels", "rk_kernels_generated")


def _public_functions() -> list[str]:
    names = []
    for layer in (closed_forms, dynamics):
        for info in pkgutil.iter_modules(layer.__path__):
            if info.name in TABLE_MODULES + OPTIONAL_MODULES + COMPILE_TIME_MODULES:
                continue
            module = importlib.import_module(f"{layer.__name__}.{info.name}")
            for name, value in vars(module).items():
                function = getattr(value, "py_func", value)
                if (not name.startswith("_") and inspect.isfunction(function)
                        and function.__module__ == module.__name__):
                    names.append(f"{module.__name__.removeprefix('attnflow.')}.{name}")
    return sorted(names)


def test_every_public_function_has_a_domain():
    missing = [name for name in _public_functions() if name not in ENTRIES]
    assert not missing, "public functions without an entry in a domain table:\n" + "\n".join(missing)


def test_every_entry_is_a_public_function():
    assert len(ENTRIES) == len(cf_domains.DOMAINS) + len(dyn_domains.DOMAINS), "a function has two entries"
    stale = sorted(set(ENTRIES) - set(_public_functions()))
    assert not stale, f"entries for functions that are not public: {stale}"


# ---- building arguments ------------------------------------------------------------------------------------------

def _bounds(spec, cap=None) -> tuple[float, float]:
    """The range drawn: the record's bounds, narrowed by the entry's ``draws`` (a largest value or a (low, high))."""
    low = spec.minimum if spec.minimum is not None else -100
    high = spec.maximum if spec.maximum is not None else max(low, 0) + 100
    if isinstance(cap, tuple):
        return max(low, cap[0]), min(high, cap[1])
    return low, high if cap is None else min(high, cap)


def _strategy(spec, cap=None):
    if spec.kind == "integer":
        low, high = _bounds(spec, cap)
        return st.integers(int(math.floor(low)) + (1 if spec.strict and float(low).is_integer() else 0),
                           int(high))
    if spec.kind == "real":
        low, high = _bounds(spec, cap)
        return st.floats(low, high, exclude_min=spec.strict, allow_nan=False)
    if spec.kind == "choice":
        return st.sampled_from(cap if cap is not None else spec.choices)
    if spec.kind == "boolean":
        return st.booleans()
    return st.just(spec.default)  # vectors and matrices of a Problem: the default (their shape follows d)


def _cheap(spec, cap=None):
    """A valid value that is cheap to run: the default brought under the cap, or the smallest allowed."""
    if spec.kind in ("vector", "matrix"):
        return spec.default
    if spec.kind in ("choice", "boolean"):
        return spec.default if spec.default is not None else (spec.choices[0] if spec.choices else False)
    low, high = _bounds(spec, cap)
    value = spec.default if spec.default is not None else low
    value = min(max(value, low), high)
    if spec.strict and value == low:
        value = min(low + 1, high) if spec.kind == "integer" else low + 0.5 * (high - low)
    return int(value) if spec.kind == "integer" else float(value)


def _outside(spec) -> list:
    """Values of ``spec`` past its bounds or of the wrong type."""
    if spec.kind == "choice":
        return ["not_a_choice"]
    if spec.kind == "boolean":
        return [float("nan"), "maybe"]
    bad = [float("nan"), "x"] + ([2.5] if spec.kind == "integer" else [float("inf")])
    if spec.minimum is not None:
        bad.append(spec.minimum if spec.strict else spec.minimum - 1)
    if spec.maximum is not None:
        bad.append(spec.maximum + 1 if spec.kind == "integer" else 2 * spec.maximum + 1)
    return bad


_PROBLEMS: dict = {}


def _problem(system: str, values: tuple):
    """The Problem at ``values``, built once per distinct values (a Problem is immutable)."""
    key = (system, repr(values))
    if key not in _PROBLEMS:
        problem_class, _ = PROBLEMS[system]
        _PROBLEMS[key] = problem_class.from_params(dict(values))
    return _PROBLEMS[key]


def _takes_problem(entry) -> bool:
    parameters = list(inspect.signature(getattr(entry.function, "py_func", entry.function)).parameters)
    return bool(parameters) and parameters[0] == "problem"


def _needs_problem(entry) -> bool:
    """A problem is drawn for an entry of a system: passed when the function takes one, else to build arguments."""
    return entry.system_key in PROBLEMS


def _arguments(entry, problem, values: dict, rng) -> dict:
    """Valid keyword arguments for every argument of ``entry.function`` that has no default or that the entry names."""
    signature = inspect.signature(getattr(entry.function, "py_func", entry.function))
    system_arrays = cf_domains.ARRAYS.get(entry.system_key, {}) | dyn_domains.ARRAYS.get(entry.system_key, {})
    built = entry.build(problem, rng) if entry.build is not None else {}
    arguments = {}
    for name, parameter in signature.parameters.items():
        if name == "problem" and problem is not None and _takes_problem(entry):
            continue
        required = parameter.default is inspect.Parameter.empty and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if name in entry.fixed:
            arguments[name] = entry.fixed[name]
        elif name in values:
            arguments[name] = values[name]
        elif name in entry.arrays:
            arguments[name] = entry.arrays[name].valid(problem, rng)
        elif name in built:
            arguments[name] = built[name]
        elif name == "rng":
            arguments[name] = rng
        elif required and name in system_arrays:
            arguments[name] = system_arrays[name].valid(problem, rng)
        elif required:
            raise AssertionError(f"the table gives no value for the argument {name} of {entry.name}")
    return arguments


def _call(entry, problem, arguments: dict):
    function = entry.function
    if problem is not None and _takes_problem(entry):
        return function(problem, **arguments)
    if entry.checked_by:  # numba kernels take their arguments by position
        order = list(inspect.signature(getattr(function, "py_func", function)).parameters)
        return function(*[arguments[name] for name in order if name in arguments])
    return function(**arguments)


# ---- finiteness --------------------------------------------------------------------------------------------------

def _non_finite(value, allow_inf: bool, path: str = "output", depth: int = 0) -> list[str]:
    if depth > 6 or value is None or isinstance(value, (str, bool, np.bool_, type)) or callable(value):
        return []
    if isinstance(value, numbers.Number):
        number = complex(value)
        if math.isnan(number.real) or math.isnan(number.imag):
            return [f"{path} is NaN"]
        if not allow_inf and (math.isinf(number.real) or math.isinf(number.imag)):
            return [f"{path} is infinite"]
        return []
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            if np.isnan(value).any():
                return [f"{path} has NaN entries"]
            if not allow_inf and np.isinf(value).any():
                return [f"{path} has infinite entries"]
            return []
        if value.dtype.kind == "O":
            return [problem for k, item in enumerate(value.ravel()[:50])
                    for problem in _non_finite(item, allow_inf, f"{path}[{k}]", depth + 1)]
        return []
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _non_finite(item, allow_inf, f"{path}[{key!r}]", depth + 1)]
    if isinstance(value, (list, tuple)):
        return [p for k, item in enumerate(value[:200]) for p in _non_finite(item, allow_inf, f"{path}[{k}]", depth + 1)]
    if dataclasses.is_dataclass(value):
        return [p for f in dataclasses.fields(value)
                for p in _non_finite(getattr(value, f.name), allow_inf, f"{path}.{f.name}", depth + 1)]
    return []


# ---- the two properties ------------------------------------------------------------------------------------------

def _known(name: str, check: str) -> list:
    """The strict expected-failure mark of an entry's known, unfixed finding for ``check`` (inside/outside)."""
    reason = ENTRIES[name].known.get(check)
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_known(n, "inside")) for n in sorted(ENTRIES)])
def test_inside_the_domain_the_output_is_finite(name):
    entry = ENTRIES[name]
    outcomes = tuple(entry.raises)

    @INSIDE
    @given(st.data())
    def check(data):
        problem = None
        if _needs_problem(entry):
            problem_class, caps = PROBLEMS[entry.system_key]
            values = tuple((spec.name, entry.given[spec.name] if spec.name in entry.given else
                            data.draw(_strategy(spec, caps.get(spec.name)), label=spec.name))
                           for spec in problem_class.PARAMETERS)
            try:
                problem = _problem(entry.system_key, values)
            except ValueError:
                return  # a combination the Problem refuses by name (test_fuzz holds it to that)
        values = {spec.name: data.draw(_strategy(spec, entry.draws.get(spec.name)), label=spec.name)
                  for spec in entry.all_parameters}
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        arguments = _arguments(entry, problem, values, rng)
        try:
            output = _call(entry, problem, arguments)
        except outcomes:
            return
        except ValueError as error:
            if any(refusal in str(error) for refusal in (*entry.refusals, *cf_domains.REFUSALS.get(entry.system_key, ()))):
                return
            raise
        bad = [b for b in _non_finite(output, entry.limits) if not any(key in b for key in entry.undefined)]
        assert not bad, f"{name} at {values}: " + "; ".join(bad[:5])

    check()


def _baseline(entry):
    problem = None
    if _needs_problem(entry):
        problem_class, caps = PROBLEMS[entry.system_key]
        problem = _problem(entry.system_key, tuple(
            (spec.name, entry.given.get(spec.name, _cheap(spec, caps.get(spec.name)))) for spec in problem_class.PARAMETERS))
    values = {spec.name: _cheap(spec, entry.draws.get(spec.name)) for spec in entry.all_parameters}
    return problem, values


def _wrong_shape(array: np.ndarray) -> np.ndarray:
    shape = list(np.shape(array)) or [1]
    shape[-1] += 1
    return np.ones(shape)


def _outside_cases(entry, arguments) -> list[tuple[str, object]]:
    cases = [(spec.name, bad) for spec in entry.all_parameters for bad in _outside(spec)
             if not any(bad is ok or bad == ok for ok in entry.accepts.get(spec.name, ()))]
    system_arrays = cf_domains.ARRAYS.get(entry.system_key, {}) | dyn_domains.ARRAYS.get(entry.system_key, {})
    records = system_arrays | dict(entry.arrays)
    for name in arguments:
        if name in records and name not in entry.fixed:
            array = np.array(arguments[name], dtype=float)
            if array.size:
                broken = array.copy()
                broken.flat[0] = np.nan
                cases.append((name, broken))
            if records[name].strict_shape:
                cases.append((name, _wrong_shape(array)))
    return cases


@pytest.mark.parametrize("name", [pytest.param(n, marks=_known(n, "outside"))
                                  for n, e in sorted(ENTRIES.items()) if not e.checked_by])
def test_outside_the_domain_a_value_error_names_the_parameter(name):
    entry = ENTRIES[name]
    problem, values = _baseline(entry)
    arguments = _arguments(entry, problem, values, np.random.default_rng(0))
    failures = []
    for argument, bad in _outside_cases(entry, arguments):
        shown = f"{argument}={bad!r}" if not isinstance(bad, np.ndarray) else f"{argument} of shape {bad.shape}"
        try:
            output = _call(entry, problem, {**arguments, argument: bad})
        except ValueError as error:
            if not re.search(rf"(?<![\w.]){re.escape(argument)}(?!\w)", str(error)):
                failures.append(f"{shown}: the ValueError does not name {argument}: {error}")
        except Exception as error:  # noqa: BLE001 - what escapes is the finding
            failures.append(f"{shown}: {type(error).__name__}: {str(error)[:200]}")
        else:
            failures.append(f"{shown}: accepted ({'NaN in output' if _non_finite(output, True) else 'no error'})")
    assert not failures, f"{name}:\n" + "\n".join(failures)


@pytest.mark.parametrize("key", systems.system_keys())
def test_the_command_line_and_the_table_read_one_record(key):
    """A system's --param options are the very Parameter records its population/minibatch entries draw from."""
    system = systems.get_system(key)
    for options, function in ((system.population_options, system.population),
                              (system.minibatch_options, system.minibatch)):
        entry = next(e for e in ENTRIES.values() if e.function is function)
        assert all(any(spec is record for record in entry.parameters) for spec in options), entry.name
