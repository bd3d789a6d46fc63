"""Malformed command lines across all nine systems, generated from the parameters' own declarations.

Every value here is outside what its parameter declares (a bound crossed, a non-number, a word that is no choice),
so the only right answer is exit 2 with one line that names the parameter: no traceback, no silent acceptance.
The edge cases reported by hand (an output path under a file, degenerate limits, a setting of 0) follow, and the
in-domain runs of test_cli.py check that what exits 0 prints only finite numbers."""
import contextlib
import io
import json

import pytest

from attnflow.validation import systems
from attnflow.validation.cli import main

from .conftest import all_finite


def bad_values(parameter) -> list[str]:
    """Texts that the declaration of ``parameter`` refuses: non-numbers, a bound crossed, a word that is no choice."""
    values = ["nan", "inf", "-inf", "abc", ""]
    if parameter.kind == "integer":
        values.append("2.5")
    if parameter.kind in ("integer", "real"):
        low, high = parameter.minimum, parameter.maximum
        if low is not None:
            if parameter.strict:
                values.append(str(low))
            else:
                values.append(str(int(low) - 1) if parameter.kind == "integer" else repr(low - max(1.0, abs(low))))
        if high is not None:
            values.append(str(int(high) + 1) if parameter.kind == "integer" else repr(high * 10 if high > 0 else high + 1))
    if parameter.kind == "choice":
        values.append("not_a_choice")
    if parameter.kind == "boolean":
        values.append("maybe")
    return values


def malformed_calls(key: str) -> list[list[str]]:
    system = systems.get_system(key)
    calls = []
    for command, parameters in (("solve", system.problem.PARAMETERS), ("solve", system.population_options),
                                ("simulate", system.problem.PARAMETERS), ("simulate", system.minibatch_options)):
        for parameter in parameters:
            calls += [[command, key, "--param", f"{parameter.name}={value}"] for value in bad_values(parameter)]
    return calls


def run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--no-progress"])
    return code, out.getvalue(), err.getvalue()


def assert_refused_in_one_line(args: list[str], *named: str) -> None:
    code, _, err = run(args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error:"), (args, code, err)
    assert all(name in lines[0] for name in named), (args, lines[0])


def test_the_fuzz_covers_every_system_with_hundreds_of_calls():
    counts = {key: len(malformed_calls(key)) for key in systems.system_keys()}
    assert len(counts) == 9 and min(counts.values()) >= 20 and sum(counts.values()) >= 300, counts


@pytest.mark.parametrize("key", systems.system_keys())
def test_every_out_of_domain_parameter_is_refused_by_name(key):
    for args in malformed_calls(key):
        assert_refused_in_one_line(args, args[3].partition("=")[0])


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "F"
    path.write_text("a file, not a folder")
    return path


@pytest.mark.parametrize("args, named", [
    (["check", "random_walk.failure_theorem", "--report", "{F}/sub"], "--report"),
    (["solve", "gd-beta", "--plot", "{F}/x.png"], "--plot"),
    (["sweep", "sweep.sleep", "--grid", "seconds=0", "--seeds", "1", "--jobs", "1", "--store", "{F}/s"], "--store"),
    (["sweep", "gd_beta.minibatch_gradient_deviation", "--grid", "batch_size=16,64,256", "--seeds", "2",
      "--jobs", "1", "--store", "{F}/s", "--plot", "{F}/law.png"], "--"),
    (["solve", "scb", "--param", "steps=0"], "steps"),
    (["solve", "scb", "--latex", "--param", "N=nan"], "--latex"),
    (["solve", "scb", "--latex", "--plot", "x.png"], "--latex"),
    (["sweep", "gd_beta.risk_formula", "--grid", "n_prompts=0", "--store", "{F}-never"], "n_prompts"),
    (["sweep", "gd_beta.risk_formula", "--grid", "n_prompts=-5", "--store", "{F}-never"], "n_prompts"),
    (["solve", "gd-beta", "--seed", "-1"], "--seed"),
])
def test_reported_edge_cases_are_refused_before_any_work(args, named, a_file):
    assert_refused_in_one_line([arg.replace("{F}", str(a_file)) for arg in args], named)


@pytest.mark.parametrize("sigma2", ["0", "1e-320"])
def test_noise_free_labels_give_the_closed_forms_limit_not_inf_or_a_traceback(sigma2):
    """σ² → 0: the SNR is said to be infinite in words, the Bayes risk is its exact limit (0 once N ≥ d) and the
    GD-β/Bayes ratio, 0/0 there, is called undefined."""
    # sigma2=0 exactly as docs/gd_beta.md §11.10 prints it
    fast = [] if sigma2 == "0" else ["--param", "bayes_contexts=200", "--param", "n_points=20"]
    code, out, err = run(["solve", "gd-beta", "--param", f"sigma2={sigma2}", *fast, "--json"])
    assert code == 0, err
    values = json.loads(out)["values"]
    assert all_finite(values)
    assert values["SNR tr(HΨ)/σ²"] == "infinite (noise-free labels)"
    assert values["Bayes risk (Lemma 6.1, MC)"] < 1e-300
    assert values["excess ratio GD-β/Bayes (Cor 6.2)"].startswith("undefined")


def test_a_sweep_whose_claim_errors_exits_1_and_says_why(tmp_path, monkeypatch):
    """A grid point at which the claim raises is an ERROR, counted in the table, with its message, and exit 1."""
    from attnflow.validation import gd_beta

    def crash(*args, **kwargs):
        raise ValueError("n_prompts: a crash inside the claim")

    monkeypatch.setattr(gd_beta.dyn, "monte_carlo_risk", crash)
    code, out, err = run(["sweep", "gd_beta.risk_formula", "--grid", "n_prompts=100", "--seeds", "1", "--jobs", "1",
                          "--store", str(tmp_path)])
    assert code == 1
    assert "status ERROR 1/1" in out
    assert "1 of 1 runs ended in ERROR" in err and "a crash inside the claim" in err
