"""The command line end to end, in subprocesses as a user runs it."""
import json
import os
import subprocess
import sys

import pytest

from attnflow.validation import systems

from .conftest import all_finite

FAST_CLAIMS = ["gd_beta.risk_formula", "gd-beta.bayes_factor_needs_bounded_snr"]


def attnflow(*args, check_exit=None):
    result = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", *args], capture_output=True, text=True,
                            timeout=600)
    if check_exit is not None:
        assert result.returncode == check_exit, result.stderr
    return result


def test_check_json_is_stable_and_parsable():
    result = attnflow("check", *FAST_CLAIMS, "--json", "--seed", "3", "--no-progress", check_exit=0)
    document = json.loads(result.stdout)
    assert document["schema"] == "attnflow.check/2"
    assert document["seed"] == 3 and document["setting"] == "quick"
    assert document["summary"] == dict(total=2, passed=2, failed=0, findings=0, errors=0, as_registered=2,
                                       seconds=document["summary"]["seconds"])
    names = [r["name"] for r in document["results"]]
    assert names == ["gd_beta.risk_formula", "gd_beta.bayes_factor_needs_bounded_snr"]
    for r in document["results"]:
        assert set(r) >= {"name", "system", "reference", "statement", "status", "passed", "as_registered", "finding",
                          "measured", "predicted",
                          "tolerance", "basis", "details", "notes", "setting", "seed", "seconds"}
        assert r["status"] == "PASS" and r["tolerance"] and r["basis"]


def test_check_table_and_report(tmp_path):
    result = attnflow("check", FAST_CLAIMS[0], "--report", str(tmp_path / "out"), "--no-progress", check_exit=0)
    assert "PASS" in result.stdout and "gd_beta.risk_formula" in result.stdout
    assert "1 of 1 claims passed, 0 registered findings reproduced" in result.stdout
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## gd_beta.risk_formula" in report and "figures/gd_beta.risk_formula.png" in report
    png = tmp_path / "out" / "figures" / "gd_beta.risk_formula.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_reproduced_finding_exits_0_and_strict_counts_it_as_a_failure():
    result = attnflow("check", "random_walk.value_direction", "--json", "--no-progress", check_exit=0)
    document = json.loads(result.stdout)
    assert document["summary"]["findings"] == 1 and document["results"][0]["status"] == "FINDING"
    assert document["results"][0]["finding"] and document["results"][0]["as_registered"]
    attnflow("check", "random_walk.value_direction", "--strict", "--no-progress", check_exit=1)


def test_list_filters_by_system_and_speaks_json():
    document = json.loads(attnflow("list", "scb", "random-walk", "--json", check_exit=0).stdout)
    assert document["schema"] == "attnflow.list/1"
    assert [s["key"] for s in document["systems"]] == ["scb", "random_walk"]
    findings = [c["name"] for s in document["systems"] for c in s["claims"] if c["finding"]]
    assert findings == ["random_walk.value_direction"]
    assert "unknown system 'nope'" in attnflow("list", "nope", check_exit=2).stderr


def test_bare_command_prints_help_and_version_is_reported():
    assert "usage: attnflow" in attnflow(check_exit=0).stdout
    assert attnflow("--version", check_exit=0).stdout.startswith("attnflow ")


def test_list_names_every_claim():
    from attnflow.validation.systems import registry

    out = attnflow("list", "--tier", "all", check_exit=0).stdout
    for name in registry():
        assert name in out


def test_solve_gd_beta_json_and_plot(tmp_path):
    out = attnflow("solve", "gd-beta", "--param", "N=10", "--param", "sigma2=0.25", "--param", "bayes_contexts=2000",
                   "--json", "--plot", str(tmp_path / "f.png"), check_exit=0).stdout
    document = json.loads(out)
    assert document["schema"] == "attnflow.solve/1" and document["system"] == "gd_beta"
    assert document["values"]["R* optimal GD-β risk (Thm 5.2)"] == pytest.approx(0.7405660377, abs=1e-9)
    assert document["values"]["population: final excess_risk"] < 1e-8
    assert (tmp_path / "f.png").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["check", "nope"], "unknown claim or system 'nope'"),
        (["check", "--seed", "-1"], "--seed must be a non-negative integer"),
        (["solve", "gd-beta", "--param", "H=1,-1"], "H must be positive semi-definite"),
        (["solve", "gd-beta", "--param", "N=0"], "N must be >= 1"),
        (["solve", "gd-beta", "--param", "sigma2=abc"], "parameter sigma2 must be a real number"),
        (["solve", "gd-beta", "--param", "colour=3"], "unknown gd_beta parameter(s) ['colour']"),
        (["simulate", "scb", "--param", "steps=3"], "unknown scb parameter(s) ['steps']"),
        (["solve", "gd-beta", "--param", "N=2.5"], "parameter N must be an integer"),
        (["solve", "gd-beta", "--param", "N=inf"], "parameter N must be finite"),
        (["solve", "gd-beta", "--param", "N=3", "--param", "N=4"], "--param N is given twice"),
        (["solve", "one-nn", "--latex"], "system one_nn has no symbolic derivation"),
        (["solve", "nope"], "unknown system 'nope'"),
        (["solve", "gd-beta", "--plot", ""], "--plot needs a file name"),
        (["solve", "gd-beta", "--plot", "/nonexistent-folder/f.png"], "does not exist"),
        (["check", "gd_beta.risk_formula", "--report", "/proc/attnflow"], "--report: cannot create"),
        (["frobnicate"], "invalid choice"),
        (["solve", "gd-beta", "--param", "H=1e-300"], "H: the flow's slowest local rate is 0"),
        (["solve", "gd-beta", "--param", "sigma2=1e300"], "sigma2 has entries of size 1e+300"),
        (["bench", "nosuch"], "unknown benchmark 'nosuch'; available:"),
        (["bench", "scb", "--repeats", "0"], "--repeats must be >= 1"),
        (["sweep", "gd_beta.minibatch_gradient_deviation", "--grid", "batch_size=1e9", "--seeds", "2", "--store",
          "/tmp/attnflow-never-written"], "would sample 264.0 GB at once"),
        (["solve", "gd-beta", "--plot", "figure.txt"], "--plot: 'figure.txt' must end in one of"),
        (["sweep", "gd_beta.minibatch_gradient_deviation", "--grid", "batch_size=16,64,256", "--seeds", "2",
          "--store", "/tmp/attnflow-never-written", "--plot", "/proc/attnflow.png"], "--plot: cannot write"),
        (["sweep", "sweep.sleep", "--grid", "seconds=0", "--store", ""], "--store needs a folder name"),
        (["sweep", "sweep.sleep", "--grid", "seconds=1e300", "--store", "/tmp/attnflow-never-written"],
         "seconds must be <= 3600"),
        (["sweep", "sweep.sleep", "--grid", "seconds=-1", "--store", "/tmp/attnflow-never-written"],
         "seconds must be >= 0"),
        (["sweep", "sweep.sleep", "--grid", "size=1e12", "--store", "/tmp/attnflow-never-written"],
         "size must be <= 10**7"),
        (["sweep", "gd_beta.minibatch_gradient_deviation", "--grid", "batch_size=2.5", "--store",
          "/tmp/attnflow-never-written"], "batch_size must be an integer, got 2.5"),
        (["sweep", "gd_beta.minibatch_gradient_deviation", "--grid", "batch_size=16,16", "--store",
          "/tmp/attnflow-never-written"], "--grid gives a value of batch_size twice"),
        (["sweep", "sweep.sleep", "--grid", "seconds=0", "--seeds", "2", "--store", "/tmp/attnflow-never-written",
          "--plot", "/tmp/attnflow-never-written.png"], "--plot needs a target with a scaling law"),
        (["sweep", "gd_beta.minibatch_gradient_deviation", "--grid", "batch_size=16,64", "--seeds", "2", "--store",
          "/tmp/attnflow-never-written", "--plot", "/tmp/attnflow-never-written.png"], "needs at least 3 values"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    result = attnflow(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_figure_that_fails_is_noted_and_the_report_still_written(tmp_path):
    from attnflow.validation.claims import CheckResult
    from attnflow.validation.report import write_report

    def broken():
        raise TypeError("bad plot")

    result = CheckResult("fake.claim", "fake", "nowhere", "a statement", "PASS", {"x": 1.0}, {"x": 1.0}, "exact",
                         "none", [], "", "quick", 0, 0.1, figure=broken)
    report = write_report([result], tmp_path, seed=0, setting="quick").read_text()
    assert "## fake.claim" in report and "could not be drawn: TypeError: bad plot" in report


SMALL = {
    "gd_beta": (["bayes_contexts=2000", "n_points=20"], ["steps=40", "model=ltb"]),
    "one_nn": (["steps=20"], ["steps=4", "batch_size=32"]),
    "random_walk": (["N=7", "steps=20"], ["N=7", "steps=20", "n_sequences=100"]),
    "group_sparse": (["steps=200"], ["steps=3", "batch_size=200"]),
    "scb": (["steps=30"], ["stage1_steps=5", "stage1_batch=400", "stage2_steps=5", "stage2_batch=400",
                           "stage3_steps=5", "stage3_batch=400"]),
    "attention_svm": (["n=3", "T=3", "d=3", "points=3"], ["n=3", "T=3", "d=3", "steps=50", "records=10"]),
    "ccmc": (["steps=1000", "n_records=10"], ["steps=1000", "runs=4", "n_records=10"]),
    "next_token_scc": (["steps=200", "records=10"], ["steps=100", "records=10"]),
    "linear_attention_h3": (["n_points=20"], ["steps=50", "batch_size=32"]),
}



def test_the_generic_commands_are_exercised_on_every_built_in_system():
    assert sorted(SMALL) == sorted(systems.system_keys())


@pytest.mark.parametrize("system", sorted(SMALL))
def test_solve_and_simulate_run_for_every_built_in_system(system, capsys, tmp_path):
    """The generic commands (in process): the population and the minibatch run, their JSON and their figure; what
    exits 0 prints only finite numbers (a limit that is not a number is said in words)."""
    from attnflow.validation.cli import main

    for command, params in zip(("solve", "simulate"), SMALL[system]):
        args = [command, system.replace("_", "-"), *sum((["--param", p] for p in params), []), "--json",
                "--plot", str(tmp_path / f"{command}.png")]
        assert main(args) == 0, capsys.readouterr().err
        document = json.loads(capsys.readouterr().out)
        assert document["schema"] == f"attnflow.{command}/1" and document["system"] == system
        kind = "population" if command == "solve" else "minibatch"
        assert document["values"][f"{kind}: records"] == len(document["trajectory"]["times"]) >= 2
        assert document["trajectory"]["metrics"]
        unlabelled = [m for m in document["trajectory"]["metrics"] if systems.get_system(system).label(m) == m]
        assert not unlabelled, f"{command} records metrics with no readable label: {unlabelled}"
        assert all_finite(document["values"]), document["values"]
        assert (tmp_path / f"{command}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["solve", system, "--describe"]) == 0
    assert "problem:" in capsys.readouterr().out


def test_a_vanishing_task_covariance_gives_an_undefined_ratio_not_a_traceback():
    result = attnflow("solve", "gd-beta", "--param", "Psi=0", "--json")
    assert result.returncode == 0, result.stderr
    assert "undefined (Bayes excess risk 0)" in result.stdout


def test_warnings_are_collected_so_an_error_stays_one_line(monkeypatch, capsys):
    """A RuntimeWarning raised on the way to an error does not add lines; on success each distinct one is listed."""
    import warnings

    from attnflow.validation import cli

    def warn_then(outcome):
        def command(args):
            warnings.warn("overflow encountered in multiply", RuntimeWarning)
            warnings.warn("overflow encountered in multiply", RuntimeWarning)
            if outcome == "fail":
                raise ValueError("parameter x is bad")
            return 0
        return command

    monkeypatch.setattr(cli, "_command_list", warn_then("fail"))
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err == "attnflow: error: parameter x is bad\n"
    monkeypatch.setattr(cli, "_command_list", warn_then("pass"))
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().err == "attnflow: warning: RuntimeWarning: overflow encountered in multiply\n"


def test_bench_runs_a_script_in_its_own_process_and_gathers_its_named_ratios(tmp_path, monkeypatch):
    """`attnflow bench` reads each script's --json ratios; a script that fails is named and makes the exit 1."""
    from attnflow.validation import cli
    good, bad = tmp_path / "bench_good.py", tmp_path / "bench_bad.py"
    good.write_text("import json, os, sys\nassert '--json' in sys.argv and os.environ['OPENBLAS_NUM_THREADS'] == '1'\n"
                    "print(json.dumps({'benchmark': 'good', 'ratios': {'good_speedup': 12.5}}))\n")
    bad.write_text("raise SystemExit(3)\n")
    monkeypatch.setattr(cli, "benchmark_scripts", lambda: {"good": good, "bad": bad})
    assert cli.main(["bench", "good", "--json"]) == 0
    assert cli.main(["bench"]) == 1


def test_bench_finds_the_checkout_benchmarks():
    from attnflow.validation import cli
    assert {"scb", "one_nn", "group_sparse", "reduced_solves"} <= set(cli.benchmark_scripts())


def test_time_at_equal_accuracy_is_read_off_the_pareto_front_in_log_log():
    """On a power law t = e^(-1/8) (DOP853's cost against its error) the interpolation is exact; dominated points
    (slower and less accurate) are ignored; targets off the sweep are said to be so."""
    import importlib.util

    from attnflow.validation import cli
    spec = importlib.util.spec_from_file_location("bench_common", cli.benchmark_scripts()["scb"].parent / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    points = [(e, e ** -0.125) for e in (1e-12, 1e-10, 1e-8, 1e-6)] + [(1e-7, 100.0), (1e-9, 1e3)]
    for target in (3e-11, 1e-8, 2e-7):
        seconds, how = common.seconds_at_accuracy(points, target)
        assert how == "interpolated" and seconds == pytest.approx(target ** -0.125, rel=1e-12)
    assert common.seconds_at_accuracy(points, 1e-13)[1] == "not reached"
    assert common.seconds_at_accuracy(points, 1e-3) == (pytest.approx(1e-6 ** -0.125), "loosest")
    with pytest.raises(ValueError):
        common.seconds_at_accuracy(points, 0.0)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_figure_that_cannot_be_written_is_an_error_not_a_success(tmp_path):
    """A full device accepts the open and fails on the write: the command says so in one line, exit 2."""
    target = tmp_path / "figure.png"
    target.symlink_to("/dev/full")
    result = attnflow("solve", "gd-beta", "--param", "t_end=1", "--param", "n_points=5", "--plot", str(target))
    assert result.returncode == 2 and "--plot: cannot write" in result.stderr and "figure written" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
