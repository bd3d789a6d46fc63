"""Theory beside simulation (`attnflow simulate --compare`), what `--describe` lists, and the printed summaries.

The figures are inspected through the command that builds them (its `_save` is wrapped), not read back from the
PNG: every panel must hold the run and a theory artist. The pieces the predictions rest on are checked against
independent computations: the exact-gradient optimiser path against the linear-noise approximation's mean path
(an identity), the second-order spread of a metric against Gaussian samples, the fluid limit's tangent
eigenvalues against the fluid ODE itself."""
import contextlib
import io
import math
import re

import numpy as np
import pytest

from attnflow.validation import cli, systems
from attnflow.validation.compare import Comparison, NoPrediction, comparison_figure

from .conftest import assert_within_standard_errors

# small runs of every built-in system: seconds each once the kernels are compiled
SMALL_RUNS = {
    "gd_beta": ["steps=40", "optimizer=sgd", "batch_size=32"],
    "scb": ["stage1_steps=5", "stage1_batch=400", "stage2_steps=5", "stage2_batch=400", "stage3_steps=5",
            "stage3_batch=400"],
    "one_nn": ["steps=4", "batch_size=32"],
    "random_walk": ["N=7", "steps=20", "n_sequences=100"],
    "group_sparse": ["steps=3", "batch_size=200"],
    "attention_svm": ["n=3", "T=3", "d=3", "steps=50", "records=10"],
    "next_token_scc": ["steps=100", "records=10"],
    "linear_attention_h3": ["model=pgd", "optimizer=sgd", "steps=50", "batch_size=32"],
    "ccmc": ["steps=1000", "runs=4", "n_records=10"],
}


def run(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*args, "--no-progress"])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures the command writes, kept as it writes them."""
    figures = []
    original = cli._save

    def keep(figure, path):
        figures.append(figure)
        original(figure, path)

    monkeypatch.setattr(cli, "_save", keep)
    return figures


def artist_kinds(ax) -> set:
    return {artist.get_gid() for artist in [*ax.get_lines(), *ax.collections]} - {None}


def test_every_built_in_system_is_compared():
    assert sorted(SMALL_RUNS) == systems.system_keys()
    assert all(systems.get_system(key).compare is not None for key in SMALL_RUNS)


@pytest.mark.parametrize("system", sorted(SMALL_RUNS))
def test_simulate_compare_draws_the_prediction_beside_the_run(system, saved_figures, tmp_path):
    key = systems.get_system(system)
    path = tmp_path / "f.png"
    code, out, err = run(["simulate", system, *sum((["--param", p] for p in SMALL_RUNS[system]), []), "--compare",
                          "--plot", str(path)])
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "prediction: " in out
    (figure,) = saved_figures
    panels = [ax for ax in figure.axes if ax.get_visible() and ax.get_gid()]
    assert panels
    for ax in panels:
        kinds = artist_kinds(ax)
        assert "simulation" in kinds and kinds & {"prediction", "band"}, (ax.get_gid(), kinds)
        # titled by a readable label, not the record key
        assert ax.get_title() == key.label(ax.get_gid()) != ax.get_gid(), ax.get_title()


@pytest.mark.parametrize("system", ["gd_beta", "scb"])
def test_the_diffusion_band_is_drawn_where_the_system_has_one(system, saved_figures, tmp_path):
    code, _, err = run(["simulate", system, *sum((["--param", p] for p in SMALL_RUNS[system]), []),
                        "--plot", str(tmp_path / "f.png")])  # --compare is the default with --plot
    assert code == 0, err
    assert any("band" in artist_kinds(ax) for ax in saved_figures[0].axes)


def test_the_plot_says_why_ccmc_runs_leave_the_fluid_limit(saved_figures, tmp_path):
    """The default chain's uniform start is an unstable equilibrium of the fluid limit: the note says so."""
    code, out, err = run(["simulate", "ccmc", *sum((["--param", p] for p in SMALL_RUNS["ccmc"]), []),
                          "--plot", str(tmp_path / "f.png")])
    assert code == 0, err
    assert "unstable" in saved_figures[0].get_suptitle() and "unstable" in out


def test_no_compare_draws_the_run_alone_and_a_missing_prediction_is_explained(saved_figures, tmp_path):
    args = ["simulate", "group_sparse", "--param", "steps=3", "--param", "batch_size=200"]
    code, out, _ = run([*args, "--no-compare", "--plot", str(tmp_path / "f.png")])
    assert code == 0 and "prediction" not in out
    assert not any("prediction" in artist_kinds(ax) for ax in saved_figures[0].axes)
    joint = ["simulate", "attention_svm", "--param", "model=prompt", "--param", "algorithm=joint", "--param", "n=3",
             "--param", "T=3", "--param", "d=3", "--param", "steps=20", "--param", "records=5"]
    code, _, err = run([*joint, "--plot", str(tmp_path / "g.png")])
    assert code == 0 and "attnflow: note: no prediction drawn: algorithm joint" in err
    code, _, err = run([*joint, "--compare"])
    assert code == 2 and err.count("\n") == 1 and "algorithm joint" in err


def test_a_system_without_a_prediction_refuses_compare_by_name(monkeypatch):
    import dataclasses

    plain = dataclasses.replace(systems.get_system("group_sparse"), compare=None)
    monkeypatch.setattr(systems, "get_system", lambda key: plain)
    code, _, err = run(["simulate", "group_sparse", "--param", "steps=3", "--param", "batch_size=200", "--compare"])
    assert code == 2 and "declares no population prediction" in err


def test_a_comparison_refuses_a_panel_without_theory():
    from attnflow.dynamics.montecarlo import Trajectory

    runs = Trajectory(times=np.arange(3.0), metrics=dict(loss=np.ones(3)))
    with pytest.raises(ValueError, match="no prediction, band, level or rate"):
        Comparison(runs, ("loss",))
    with pytest.raises(ValueError, match="not recorded by the run"):
        Comparison(runs, ("risk",), levels={"risk": (0.0, "zero")})
    assert issubclass(NoPrediction, ValueError)


def test_a_power_law_rate_makes_its_panel_log_log_and_a_constant_keeps_its_numbers():
    from attnflow.dynamics.montecarlo import Trajectory

    k = np.arange(0, 101, 10.0)  # evenly spaced: the rate alone asks for the log axes
    runs = Trajectory(times=k, metrics=dict(error=1 / (1 + k) ** 2, share=np.full(k.size, 0.25)))
    prediction = Trajectory(times=k, metrics=dict(share=np.full(k.size, 0.25) + 1e-13))
    figure = comparison_figure(Comparison(runs, ("error", "share"), prediction,
                                          rates={"error": ("power", -2.0, "k^-2")}), "t", "step")
    error, share = (ax for ax in figure.axes if ax.get_gid())
    assert error.get_xscale() == error.get_yscale() == "log"
    assert share.get_xscale() == share.get_yscale() == "linear"
    low, high = share.get_ylim()
    assert low < 0.25 * 0.96 and high > 0.25 * 1.04  # ±5% around a constant, not its round-off magnified
    assert not share.yaxis.get_major_formatter().get_useOffset()


def test_log_spaced_records_are_recognised():
    from attnflow.validation.plots import log_spaced

    def geometric(steps, n):
        return np.unique(np.concatenate([[0], np.geomspace(1, steps, n).round()]))

    assert log_spaced(geometric(300, 100)) and log_spaced(np.r_[0.0, np.geomspace(1e-3, 60, 199)])
    assert not log_spaced(np.arange(0, 1001, 10.0)) and not log_spaced(geometric(20, 30))


# ---- the pieces the predictions rest on ----------------------------------------------------------------------


def test_sgd_on_the_exact_gradient_is_the_linear_noise_mean_path():
    """gd_beta's prediction of an SGD run is the same optimiser on the exact gradient; the LNA's θ̄ is defined by
    the same recursion, so the two agree to round-off."""
    from attnflow.closed_forms import gd_beta as cf
    from attnflow.dynamics import gd_beta as dyn
    from attnflow.dynamics.optimizers import exact_gradient_path
    from attnflow.validation.gd_beta import GDBetaProblem

    problem = GDBetaProblem.from_params({"d": "2", "H": "1,0.5"})
    pool = dyn.context_pool(problem, 64, seed=1, n_batches=2)
    band = dyn.sgd_linear_noise(problem, 16, 30, 0.05, pool, record_every=3)
    path = exact_gradient_path([np.zeros(2), np.zeros((2, 2))], lambda p: list(cf.risk_gradient(problem, *p)), "sgd",
                               0.05, 30, band.steps)
    assert np.allclose([cf.flow_state(*p) for p in path], band.mean, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="record must be increasing"):
        exact_gradient_path([np.zeros(2)], lambda p: [p[0]], "sgd", 0.1, 5, [3, 2])


def test_the_second_order_spread_of_a_metric_matches_gaussian_samples(rng):
    """m(θ̄ + δ) = gᵀδ + ½δᵀHδ with δ ~ N(0, C): the mean ½tr(HC) and the variance gᵀCg + ½tr((HC)²) against
    200 000 samples, within 4 standard errors (of the mean, and of the variance by the delta method)."""
    from attnflow.dynamics.diffusion import NoiseBand

    p = 3
    A = rng.normal(size=(p, p))
    C = A @ A.T / p
    g = rng.normal(size=p)
    B = rng.normal(size=(p, p))
    H = (B + B.T) / 2
    band = NoiseBand(steps=np.array([0]), mean=np.zeros((1, p)), covariance=C[None], batch_covariances=C[None, None])
    shift, sd = band.smooth_metric(g[None], H[None])
    delta = rng.multivariate_normal(np.zeros(p), C, size=200_000)
    m = delta @ g + 0.5 * np.einsum("np,pq,nq->n", delta, H, delta)
    n = m.size
    assert_within_standard_errors(m.mean(), m.std(ddof=1) / math.sqrt(n), shift[0])
    centred = (m - m.mean()) ** 2
    assert_within_standard_errors(centred.mean(), centred.std(ddof=1) / math.sqrt(n), sd[0] ** 2)


def test_tangent_eigenvalues_are_the_growth_rates_of_the_fluid_ode():
    """Near an equilibrium a small tangent perturbation of the fluid limit grows (or decays) like e^{λτ}: the
    ODE itself, integrated from f* + εv, against the eigenvalue along v (docs/ccmc.md §6.4–6.5)."""
    from attnflow.closed_forms import ccmc as cf
    from attnflow.dynamics.ccmc import fluid_trajectory

    P = 0.55 * np.eye(4) + 0.15 * (np.ones((4, 4)) - np.eye(4))
    uniform = np.full(4, 0.25)
    assert np.allclose(cf.tangent_eigenvalues(P, uniform), 0.4, atol=1e-8)  # §6.4: +0.4, three-fold
    v = np.array([1.0, -1.0, 0.0, 0.0]) * 1e-7
    tau = 2.0
    f = fluid_trajectory(P, uniform + v, [0.0, tau], rtol=1e-12, atol=1e-16)[-1]
    assert (f - uniform)[0] / v[0] == pytest.approx(math.exp(0.4 * tau), rel=1e-4)
    cycle = cf.equilibrium_on_support(cf.CYCLE_P, [0, 1, 2])  # the stable three-token cycle of §6.5
    rates = cf.tangent_eigenvalues(cf.CYCLE_P, cycle)
    assert rates.size == 2 and np.all(rates.real < 0)
    end = fluid_trajectory(cf.CYCLE_P, cycle + np.array([1e-6, -1e-6, 0, 0]), [0.0, 5.0], rtol=1e-12, atol=1e-16)
    assert np.abs(end[-1] - cycle).max() < 1e-6 * math.exp(5.0 * rates.real.max()) * 3


# ---- --describe: what each command lists is what it accepts -----------------------------------------------------

DESCRIBED = re.compile(r"^  (\w+) \((.*), default (.*?)\): ")


def described(system: str, command: str) -> dict:
    code, out, err = run([command, system, "--describe"])
    assert code == 0, err
    lines = [DESCRIBED.match(line) for line in out.splitlines() if line.startswith("  ")]
    assert all(lines), out
    return {m.group(1): (m.group(2), m.group(3)) for m in lines}


@pytest.mark.parametrize("system", sorted(SMALL_RUNS))
def test_describe_lists_exactly_what_each_command_accepts(system):
    key = systems.get_system(system)
    listed = {command: described(system, command) for command in ("solve", "simulate")}
    assert listed["solve"] != listed["simulate"]
    for command, names in listed.items():
        other = "simulate" if command == "solve" else "solve"
        for name, (kind, default) in names.items():
            if default != "derived":  # the default, as printed, is accepted by this command's parsing
                cli.parse_system_parameters(key, command, {name: default})
            if kind.startswith("choice: "):
                for word in kind.removeprefix("choice: ").split(" | "):
                    cli.parse_system_parameters(key, command, {name: word})
        for name in set(listed[other]) - set(names):  # and a name only the other command takes is refused
            with pytest.raises(ValueError, match=f"unknown {system} parameter"):
                cli.parse_system_parameters(key, command, {name: listed[other][name][1]})
        accepted = {p.name for specs in key.command_parameters(command).values() for p in specs}
        assert set(names) == accepted


def test_describe_shows_bounds_and_choices():
    names = described("gd_beta", "simulate")
    assert names["optimizer"] == ("choice: adam | sgd", "adam")
    assert names["batch_size"][0] == "integer, >= 1, <= 1000000"
    assert "model" not in described("gd_beta", "solve")
    code, _, err = run(["solve", "gd_beta", "--param", "model=ltb"])
    assert code == 2 and "solve takes:" in err


# ---- printed quantities stay inside their meaning --------------------------------------------------------------


def test_scb_prints_the_stage1_time_as_defined_and_its_formula_only_where_it_holds():
    """τ₁ is the first time max(α_V, α_Q) reaches c on the normalised flow, so positive; its closed form is the
    ε ≪ c limit, negative at the default T = 8 (ε = 0.31 > 2c). Printed: the measured τ₁, and the formula only for
    ε < c, where it is within its O(ε/c) corrections of the measurement."""
    from attnflow.validation import scb

    problem = scb.SCBProblem.from_params({})
    values = scb.summary(problem, seed=0)
    tau = values["Stage-1 time τ₁ (max α = 0.1, normalised flow)"]
    formula = values["τ₁ ≈ log(2c/ε) − ½ log(1 − c²) (ε ≪ c limit)"]
    assert problem.epsilon > 0.2 and tau > 0
    assert isinstance(formula, str) and formula.startswith("not predicted")
    assert scb.cf.stage1_duration(problem, 0.25, 0.1)["tau"] < 0  # what used to be printed
    large = scb.SCBProblem.from_params({"T": "256"})
    values = scb.summary(large, seed=0)
    tau = values["Stage-1 time τ₁ (max α = 0.1, normalised flow)"]
    formula = values["τ₁ ≈ log(2c/ε) − ½ log(1 − c²) (ε ≪ c limit)"]
    assert large.epsilon < 0.1 and formula > 0 and abs(tau - formula) < 2 * large.epsilon / 0.1
    code, out, _ = run(["solve", "scb"])
    assert code == 0 and "-0.4" not in out and "not predicted" in out


@pytest.mark.parametrize("system", ["gd_beta", "ccmc"])
def test_compare_json_matches_the_simulate_schema(system):
    import json

    import jsonschema

    from attnflow.validation.report import json_schema

    code, out, err = run(["simulate", system, *sum((["--param", p] for p in SMALL_RUNS[system]), []), "--compare",
                          "--json"])
    assert code == 0, err
    document = json.loads(out)
    jsonschema.Draft202012Validator(json_schema("simulate")).validate(document)
    comparison = document["comparison"]
    assert comparison["metrics"] and set(comparison["values"]) <= set(comparison["metrics"])
    assert len(comparison["times"]) == len(next(iter(comparison["values"].values())))


def test_the_gd_beta_excess_risk_is_never_negative_and_is_accurate_near_the_optimum():
    """R − R* as the two non-negative terms of Corollary G.1: the flow's excess risk stays >= 0 where the difference
    of two risks cancels to round-off (and printed −2e-16), and equals that difference where it is resolved."""
    from attnflow.closed_forms import gd_beta as cf
    from attnflow.dynamics import gd_beta as dyn
    from attnflow.validation.gd_beta import GDBetaProblem

    problem = GDBetaProblem.from_params({})
    flow = dyn.population_trajectory(problem, n_points=40)
    excess = flow.metrics["excess_risk"]
    difference = flow.metrics["risk"] - cf.optimal_risk(problem)
    assert np.all(excess >= 0) and excess[-1] < 1e-15
    resolved = difference > 1e-8
    assert resolved.sum() > 10 and np.allclose(excess[resolved], difference[resolved], rtol=1e-7)
