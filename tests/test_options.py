"""Every system's run options are declared once (takes_options) and hold at their bounds through the command line.

The records give the functions their defaults and are what `--param` and `--describe` read, so a bound cannot be
declared in one place and enforced differently in another: each run below sets options to their declared bounds
(every minimum together; every record count at its maximum) and must exit 0, and one step past a bound exits 2
naming the option.
"""
import contextlib
import inspect
import io

import pytest

from attnflow.closed_forms.parameters import Parameter, takes_options
from attnflow.validation import systems
from attnflow.validation.cli import main

SYSTEMS = systems.system_keys()
RUNS = {"population": "solve", "minibatch": "simulate"}
RECORD_COUNTS = ("n_records", "records", "n_points", "points")
# The most a bound-walk run may cost: run lengths and sample counts are held at these (their minimum is tested).
CHEAP = {"steps": 3, "stage1_steps": 2, "stage2_steps": 2, "stage3_steps": 2, "runs": 2, "batch_size": 4,
         "n_sequences": 8, "stage1_batch": 8, "stage2_batch": 8, "stage3_batch": 8}


def _run(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def _text(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@pytest.mark.parametrize("key", SYSTEMS)
@pytest.mark.parametrize("run", RUNS)
def test_options_are_declared_once_on_the_function(key, run):
    system = systems.get_system(key)
    function = getattr(system, run)
    assert getattr(function, "options", None) is not None, f"{key}.{run} declares no options with takes_options"
    assert getattr(system, f"{run}_options") == tuple(function.options)
    signature = inspect.signature(function)
    for spec in function.options:
        assert signature.parameters[spec.name].default == spec.default or (
            spec.default is None and signature.parameters[spec.name].default is None)


def _bound_runs(options) -> list[tuple[str, dict]]:
    """(what, values): every option at its minimum together; every record count at its maximum."""
    at_minimum = {}
    for spec in options:
        if spec.kind in ("integer", "real") and spec.minimum is not None and not spec.strict:
            at_minimum[spec.name] = spec.minimum
    at_maximum = {spec.name: spec.maximum for spec in options
                  if spec.name in RECORD_COUNTS and spec.maximum is not None}
    cheap = {spec.name: min(CHEAP[spec.name], spec.maximum or CHEAP[spec.name]) for spec in options
             if spec.name in CHEAP}
    runs = [("minimum", {**cheap, **at_minimum})]
    if at_maximum:
        runs.append(("record maximum", {**cheap, **at_minimum, **at_maximum}))
    return runs


@pytest.mark.parametrize("key", SYSTEMS)
@pytest.mark.parametrize("run", RUNS)
def test_the_command_line_runs_at_the_declared_bounds(key, run, tmp_path):
    system = systems.get_system(key)
    options = getattr(system, f"{run}_options")
    for what, values in _bound_runs(options):
        params = [arg for name, value in values.items() for arg in ("--param", f"{name}={_text(value)}")]
        code, err = _run([RUNS[run], key, *params, "--json"])
        assert code == 0, f"{key} {RUNS[run]} with options at their {what} ({values}) exits {code}: {err}"


@pytest.mark.parametrize("key", SYSTEMS)
@pytest.mark.parametrize("run", RUNS)
def test_one_step_past_a_bound_is_refused_by_name(key, run):
    system = systems.get_system(key)
    for spec in getattr(system, f"{run}_options"):
        past = []
        if spec.kind == "integer":
            past += [spec.minimum - 1] if spec.minimum is not None else []
            past += [spec.maximum + 1] if spec.maximum is not None else []
        elif spec.kind == "real":
            past += [spec.minimum if spec.strict else spec.minimum - 1] if spec.minimum is not None else []
            past += [spec.maximum * 2 + 1] if spec.maximum is not None else []
        for value in past:
            code, err = _run([RUNS[run], key, "--param", f"{spec.name}={_text(value)}"])
            assert code == 2 and spec.name in err and err.count("\n") == 1, (key, run, spec.name, value, code, err)


def test_takes_options_refuses_a_second_declaration():
    with pytest.raises(TypeError, match="has a default in its signature"):
        @takes_options(Parameter("steps", "integer", 5, minimum=1))
        def run(problem, *, steps=5):
            return steps


def test_takes_options_checks_python_calls_as_the_command_line_does():
    @takes_options(Parameter("steps", "integer", 5, minimum=1, maximum=10),
                   Parameter("t_end", "real", None, minimum=0.0, strict=True))
    def run(problem, *, steps, t_end):
        return steps, t_end

    assert run(None) == (5, None) and run(None, steps=7.0, t_end=None) == (7, None)
    for bad in ({"steps": 11}, {"steps": 0}, {"steps": 2.5}, {"t_end": 0.0}, {"t_end": float("nan")}):
        with pytest.raises(ValueError, match=f"parameter {next(iter(bad))} must"):
            run(None, **bad)
