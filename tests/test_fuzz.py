"""Property-based fuzzing of the boundary: every system's Problem built from parameters, as the command line and
the Python API give them, and the command line itself.

The only way to refuse an input is a ValueError that names the parameter; nothing else may escape (no
ZeroDivisionError, no numba error, no MemoryError), and nothing is accepted that a Problem then cannot hold."""
import contextlib
import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnflow.validation import systems
from attnflow.validation.cli import main

SYSTEMS = systems.system_keys()
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)  # the same examples on every run: CI is reproducible, a failure can be replayed

NUMBERS = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([0, 1, 2, -1, 0.5, 1e-300, 1e300, -1e300, 2.5, 1e6, 1e12, float("nan"), float("inf"),
                     -float("inf")]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
)


def _text(value) -> str:
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else str(value)


TEXT_VALUES = st.one_of(
    NUMBERS.map(_text),
    st.lists(NUMBERS, min_size=1, max_size=4).map(lambda xs: ",".join(map(_text, xs))),
    st.lists(st.lists(NUMBERS, min_size=1, max_size=3), min_size=1, max_size=3)
    .map(lambda rows: ";".join(",".join(map(_text, row)) for row in rows)),
    st.sampled_from(["", " ", "true", "false", "abc", "1,,2", ";", "1;2,3", "0x10", "1e", "--1"]),
)


@st.composite
def parameter_sets(draw, system):
    names = [p.name for p in system.problem.PARAMETERS] + ["not_a_parameter"]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    return {name: draw(TEXT_VALUES) for name in chosen}


@pytest.mark.parametrize("key", SYSTEMS)
def test_problems_take_any_text_or_refuse_it_by_name(key):
    system = systems.get_system(key)

    @FUZZ
    @given(parameter_sets(system))
    def check(values):
        try:
            problem = system.problem_from_params(values)
        except ValueError as error:
            message = str(error)
            assert message and "\n" not in message.strip()
            named = [name for name in values if name in message]
            assert named or "parameter" in message or "not_a_parameter" in values, message
            return
        assert problem is not None

    check()


@FUZZ
@given(st.lists(st.sampled_from(["--param", "N=2.5", "N=inf", "N=1,2", "seed=1.5", "--seed", "-1", "1e3",
                                 "d=0", "d=1e9", "sigma2=-1", "=", "--json", "--plot", "", "x=1", "--bogus"]),
                max_size=6))
def test_the_command_line_refuses_malformed_invocations_in_one_line(tokens):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["solve", "gd-beta", *[t for t in tokens if t != "--plot"]])
    assert code in (0, 2), err.getvalue()
    if code == 2:
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnflow: error:"), err.getvalue()
