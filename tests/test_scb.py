"""Sparse Contextual Bigram: validation, closed forms against brute-force Monte Carlo, minibatch invariants."""
import math

import numpy as np
import pytest

from attnflow.closed_forms import scb as cf
from attnflow.closed_forms.scb import SCBProblem
from attnflow.dynamics import scb as dyn
from attnflow.dynamics.integrate import DivergenceError
from tests.conftest import assert_within_standard_errors

EXAMPLE = SCBProblem.random(5, 8, 2, seed=0)


def _bad_inputs():
    P, Q = EXAMPLE.P.copy(), EXAMPLE.Q_star.copy()
    not_stochastic = P.copy()
    not_stochastic[0, 0] += 0.1
    reducible = np.eye(3)  # every distribution is stationary
    dense = np.full((8, 5), 1 / 8)
    negative = Q.copy()
    negative[:, 0] = 0.0
    negative[0, 0], negative[1, 0] = 1.5, -0.5
    return [
        ((not_stochastic, Q, 2), "P must be column-stochastic"),
        ((reducible, np.full((4, 3), 0.25), 4), "unique stationary law"),
        ((P, dense, 2), "at most sparsity = 2 nonzeros"),
        ((P, negative, 2), "Q_star columns must lie in the simplex"),
        ((P, Q[:1], 2), "T \\(the rows of Q_star\\) must be >= sparsity"),
        ((P, Q, 0), "sparsity must be >= 1"),
        ((P[:, :4], Q, 2), "P must be square"),
        ((np.where(P > 0, np.nan, 0), Q, 2), "P must be finite"),
    ]


@pytest.mark.parametrize("args, message", _bad_inputs())
def test_problem_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        SCBProblem(*args)


def test_bad_steps_and_batches_are_refused():
    with pytest.raises(ValueError, match="batch must be >= 1"):
        dyn.StageSettings(10, 0, 0.25)
    with pytest.raises(ValueError, match="eta must be > 0"):
        dyn.StageSettings(10, 100, 0.0)
    # no unbounded run: a stage that would stream for days is refused before any work, naming the bound
    with pytest.raises(ValueError, match="batch must be <= 10000000 samples per step"):
        dyn.StageSettings(10, dyn.MAX_STAGE_BATCH + 1, 0.25)
    with pytest.raises(ValueError, match="steps must be <= 10000000"):
        dyn.StageSettings(10**9, 100, 0.25)
    with pytest.raises(ValueError, match="V must have shape"):
        cf.population_risk(EXAMPLE, np.eye(4), EXAMPLE.Q_star)


def test_random_instance_satisfies_assumption_2_1():
    p = SCBProblem.random(7, 20, 3, seed=4, C=2.0)
    assert np.allclose(p.P @ p.mu, p.mu) and p.mu.min() > 0
    nonzero = p.Q_star[p.Q_star > 0]
    assert nonzero.min() >= 1 / (2 * 3) - 1e-15 and np.all((p.Q_star > 0).sum(axis=0) == 3)
    assert p.K_P >= 0 and p.K_Q > 0


def test_risk_and_gradients_match_monte_carlo_at_a_generic_point():
    rng = np.random.default_rng(3)
    V, Q = rng.normal(size=(5, 5)), rng.normal(size=(8, 5))
    from attnflow.validation.scb import standardised_error
    draws = [dyn.minibatch_gradients(EXAMPLE, V, Q, 4000, seed=s) for s in range(50)]
    grad_V, grad_Q = cf.raw_gradients(EXAMPLE, V, Q)
    G_V, G_Q = cf.preconditioned_gradients(EXAMPLE, V, Q)
    for name, exact in (("loss", cf.population_risk(EXAMPLE, V, Q)), ("grad_V", grad_V), ("grad_Q", grad_Q),
                        ("G_V", G_V), ("G_Q", G_Q)):
        values = np.array([d[name] for d in draws])
        # whole-matrix 4-SE test: ‖mean − exact‖²/ΣSE² < 16 (weighted χ² tail bound, validation/scb.py)
        assert standardised_error(values.mean(axis=0), values.std(axis=0, ddof=1) / math.sqrt(50), exact) < 16
    # and a biased closed form is caught: shift G_V by a tenth of its scale
    values = np.array([d["G_V"] for d in draws])
    assert standardised_error(values.mean(axis=0), values.std(axis=0, ddof=1) / math.sqrt(50),
                              G_V + 0.1 * np.abs(G_V).mean()) > 16


def test_bayes_risk_is_the_monte_carlo_risk_at_the_ground_truth():
    losses = np.array([dyn.minibatch_gradients(EXAMPLE, EXAMPLE.P, EXAMPLE.Q_star, 20_000, seed=s)["loss"] for s in range(10)])
    assert_within_standard_errors(losses.mean(), losses.std(ddof=1) / math.sqrt(10), EXAMPLE.bayes_risk)
    assert EXAMPLE.initial_risk - EXAMPLE.bayes_risk == pytest.approx(0.5 * EXAMPLE.kappa * EXAMPLE.K_P)
    V0, Q0 = EXAMPLE.initial_point()
    assert cf.population_risk(EXAMPLE, V0, Q0) == pytest.approx(EXAMPLE.initial_risk, abs=1e-14)


def test_preconditioned_gradients_are_the_preconditioned_raw_gradients():
    rng = np.random.default_rng(5)
    V, Q = rng.normal(size=(5, 5)), rng.normal(size=(8, 5))
    grad_V, grad_Q = cf.raw_gradients(EXAMPLE, V, Q)
    G_V, G_Q = cf.preconditioned_gradients(EXAMPLE, V, Q)
    D_inv = np.diag(1 / EXAMPLE.mu)
    np.testing.assert_allclose(G_V, grad_V @ (D_inv - np.ones((5, 5))), atol=1e-13)
    np.testing.assert_allclose(G_Q, (np.eye(8) - np.ones((8, 8)) / 8) @ grad_Q @ D_inv, atol=1e-13)


def test_raw_gradient_is_the_gradient_of_the_risk():
    rng = np.random.default_rng(6)
    V, Q = rng.normal(size=(5, 5)), rng.normal(size=(8, 5))
    grad_V, grad_Q = cf.raw_gradients(EXAMPLE, V, Q)
    h = 1e-6
    for (i, j) in ((0, 0), (3, 1)):
        E = np.zeros((5, 5))
        E[i, j] = h
        fd = (cf.population_risk(EXAMPLE, V + E, Q) - cf.population_risk(EXAMPLE, V - E, Q)) / (2 * h)
        assert grad_V[i, j] == pytest.approx(fd, rel=1e-6)
    for (t, k) in ((0, 0), (7, 4)):
        E = np.zeros((8, 5))
        E[t, k] = h
        fd = (cf.population_risk(EXAMPLE, V, Q + E) - cf.population_risk(EXAMPLE, V, Q - E)) / (2 * h)
        assert grad_Q[t, k] == pytest.approx(fd, rel=1e-6)


def test_closure_map_reduces_to_the_line_map_on_the_line():
    x = np.array([0.3, 0.2, 0.0, 0.0])
    params = cf.pack_line_params(EXAMPLE, 0.25 / EXAMPLE.K_Q, 0.25 / EXAMPLE.K_P)
    for k in range(20):
        line = cf.line_map_step(k, x[:2], params)
        x = cf.closure_map_step(k, x, params)
        np.testing.assert_allclose(x[:2], line, rtol=1e-14)
        assert x[2] == 0 and x[3] == 0


def test_minibatch_algorithm_keeps_the_invariants_and_is_reproducible():
    stages = (dyn.StageSettings(10, 2000, 0.25), dyn.StageSettings(20, 1000, 0.25, lam=0.01),
              dyn.StageSettings(10, 1000, 0.25))
    a = dyn.run_algorithm1(EXAMPLE, *stages, seed=3)
    b = dyn.run_algorithm1(EXAMPLE, *stages, seed=3)
    assert np.array_equal(a.final["V"], b.final["V"]) and np.array_equal(a.final["Q"], b.final["Q"])
    for name in ("colsum_V", "stationarity_V", "colsum_Q"):
        assert a.metrics[name].max() < 1e-12
    assert a.info["samples"] == 10 * 2000 + 20 * 1000 + 10 * 1000


def test_one_attention_step_from_the_ground_truth_adds_eta_q_squared_over_b_times_the_off_support_noise():
    """At (P, Q*) the mean gradient vanishes, so one λ = 0 step on a batch of B with V held spreads the off-support
    entries by η_Q²/B·n_off in expectation (docs/scb.md §9): simulated steps against off_support_noise."""
    problem, batch, eta = EXAMPLE, 32, 0.25
    start = (problem.P, problem.Q_star)
    spreads = np.array([cf.off_support_spread(problem, dyn.run_stage(
        problem, start, dyn.StageSettings(1, batch, eta, eta_V=0.0), seed=s, record_every=1).final["Q"])
        for s in range(800)])
    n_off, n_off_se = dyn.off_support_noise(problem, *start, batch=batch, n_batches=800, seed=20261123)
    factor = (eta / problem.K_P) ** 2 / batch
    assert_within_standard_errors(spreads.mean(), math.hypot(spreads.std(ddof=1) / math.sqrt(spreads.size),
                                                             factor * n_off_se), factor * n_off)
    with pytest.raises(ValueError, match="n_batches"):
        dyn.off_support_noise(problem, *start, n_batches=1, seed=0)


def test_divergence_names_the_step():
    with pytest.raises(DivergenceError, match="diverged at step"):
        dyn.run_sgd(EXAMPLE, dyn.StageSettings(50, 100, 1e6), seed=0)


def test_least_squares_V_minimises_the_risk_over_V():
    _, Q = cf.line_point(EXAMPLE, 0.0, 0.7)
    V_ls = cf.least_squares_V(EXAMPLE, Q)
    grad_V, _ = cf.raw_gradients(EXAMPLE, V_ls, Q)
    assert np.abs(grad_V).max() < 1e-14


def test_quick_claims_pass_and_draw_their_figures():
    from attnflow import run_claim, select
    from tests.conftest import assert_figure_is_clean
    results = [run_claim(c, seed=0) for c in select(["scb"])]
    assert {r.name: r.status for r in results} == {c.name: "PASS" for c in select(["scb"])}
    for r in results:
        assert_figure_is_clean(r)


def test_sympy_derivation_equals_the_kernels():
    import sympy as sp

    from attnflow.closed_forms import symbolic
    s = symbolic.scb_line_system()
    sym = s["symbols"]
    step = sp.lambdify([sym["alpha_V"], sym["alpha_Q"], sym["K_P"], sym["K_Q"], sym["T"], sym["eta_V"], sym["eta_Q"]],
                       s["map"])
    flow = sp.lambdify([sym["alpha_V"], sym["alpha_Q"], sym["epsilon"]], s["flow"])
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.uniform(-0.5, 1.5, 2)
        eta_V, eta_Q = rng.uniform(0.1, 2.0, 2)
        params = cf.pack_line_params(EXAMPLE, eta_V, eta_Q)
        np.testing.assert_allclose(step(*x, EXAMPLE.K_P, EXAMPLE.K_Q, EXAMPLE.T, eta_V, eta_Q),
                                   cf.line_map_step(0, x, params), rtol=1e-13)
        np.testing.assert_allclose(flow(*x, EXAMPLE.epsilon), cf.normalised_flow_rhs(0.0, x, np.array([EXAMPLE.epsilon])),
                                   rtol=1e-13, atol=1e-15)


def test_cli_solve_scb_and_latex(capsys):
    from attnflow.validation.cli import main
    assert main(["solve", "scb", "--param", "T=16"]) == 0
    assert "K_Q" in capsys.readouterr().out
    assert main(["solve", "scb", "--latex"]) == 0
    assert r"\alpha_V^{+}" in capsys.readouterr().out
    assert main(["solve", "gd-beta", "--latex"]) == 2
    assert "no symbolic derivation" in capsys.readouterr().err


def test_transfer_finds_the_supports_in_one_step_and_recovers():
    p = SCBProblem.random(5, 16, 2, seed=0)
    base = np.outer(p.mu, np.ones(5))
    P_tilde = base + 0.6 * (p.P - base)
    run = dyn.run_transfer(p, P_tilde, 0.3, 2000, dyn.StageSettings(150, 8000, 0.25, lam=0.01), seed=0)
    assert abs(run.metrics["alpha_Q"][1] - 1.0) < 0.1  # α_Q(1) = η₀γ<P̃ − μ1ᵀ, P − μ1ᵀ>_μ = 1 up to batch noise
    assert np.array_equal(run.final["Q"] > 0, p.Q_star > 0)
    assert max(dyn.relative_errors(p, run.final["V"], run.final["Q"])) < 0.05
    assert run.info["samples"] == 2000 + 150 * 8000
    with pytest.raises(ValueError, match="stationary law"):
        cf.transfer_start(p, np.full((5, 5), 0.2), 0.3)  # uniform columns: stationary law uniform, not μ


def test_bad_algorithm_settings_are_refused():
    with pytest.raises(ValueError, match="state must have shape"):
        cf.proximal_family_step(EXAMPLE, [1.0, 2.0], 0.1, 0.1, 0.01)
    with pytest.raises(ValueError, match="eta_V must be >= 0"):
        dyn.StageSettings(10, 100, 0.25, eta_V=-1.0)
    with pytest.raises(ValueError, match="x0 must have shape"):
        dyn.line_trajectory(EXAMPLE, 0.1, 0.1, 5, x0=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="theta3 must be > 0"):
        dyn.run_stages_2_3(EXAMPLE, EXAMPLE.initial_point(), dyn.StageSettings(2, 100, 0.25), seed=0, alpha_Q=0.5, theta3=-1.0)


def test_critical_batch_walk_finds_each_seeds_first_success_and_flags_censoring():
    """A synthetic success rule with a known threshold per seed: the walk returns the first grid batch at or
    above it, per criterion, and flags criteria never met below max_batch."""
    from attnflow.validation.batch_search import BATCH_GRID_RATIO, first_successes

    thresholds = {0: 100, 1: 300, 2: 1000}
    seeds = np.random.SeedSequence(5).spawn(3)
    index = {tuple(s.spawn_key): i for i, s in enumerate(seeds)}

    def success(batch, seed):
        need = thresholds[index[tuple(seed.spawn_key[:-1])]]
        return batch >= need, batch >= 2 * need

    first, censored = first_successes(success, seeds, start=64, max_batch=10 ** 6, n_criteria=2)
    grid = np.round(BATCH_GRID_RATIO ** np.arange(12, 60))
    expected = [[grid[grid >= f * need].min() for need in thresholds.values()] for f in (1, 2)]
    assert not censored and np.array_equal(first, expected)
    _, censored = first_successes(success, seeds, start=64, max_batch=1500, n_criteria=2)
    assert censored


def test_grid_slack_is_one_grid_step_over_the_range():
    """Moving the first success at the largest x up by one grid step (a factor √2) changes the exponent through
    the two ends by exactly the slack: log √2 / log(64) = 1/12 over T = 16…1024."""
    from attnflow.validation.batch_search import BATCH_GRID_RATIO, grid_slack

    Ts = [16, 64, 256, 1024]
    assert grid_slack(Ts) == pytest.approx(1 / 12, rel=1e-14)
    batches = np.array([100.0, 1600.0])
    moved = batches * [1.0, BATCH_GRID_RATIO]
    slope = np.diff(np.log(batches)) / math.log(1024 / 16)
    assert np.diff(np.log(moved)) / math.log(1024 / 16) - slope == pytest.approx(grid_slack(Ts), rel=1e-12)


def test_critical_batch_counts_a_diverged_run_as_a_failure_of_every_criterion():
    from attnflow.validation.batch_search import first_successes

    def success(batch, seed):
        if batch < 200:
            dyn.run_sgd(EXAMPLE, dyn.StageSettings(50, 100, 1e6), seed=0)  # diverges
        return True, batch >= 362

    first, _ = first_successes(success, np.random.SeedSequence(0).spawn(2), start=64, max_batch=10 ** 4,
                                 n_criteria=2)
    assert first.shape == (2, 2) and np.all(first[0] == 256) and np.all(first[1] == 362)
    with pytest.raises(ValueError, match="n_criteria"):
        first_successes(success, np.random.SeedSequence(0).spawn(1), start=256, max_batch=10 ** 4)


def _synthetic_transfer_verdicts(exponent, reps, max_batch=2 ** 20):
    """The transfer check's verdict on a success law with a known growth: p(B, T) = Φ((log B − log B₅₀(T))/w_T),
    B₅₀(T) = 4807·(T/16)^exponent and widths narrowing with T as measured on the example instance (docs/scb.md
    §10.4), walked by the claim's own search."""
    from scipy.stats import norm

    from attnflow.validation import batch_search
    from attnflow.validation.scb import transfer_growth_verdict

    Ts, widths = (16, 64, 256, 1024), (0.49, 0.41, 0.33, 0.25)

    def make_success(T):
        log_b50, width = math.log(4807 * (T / 16) ** exponent), widths[Ts.index(T)]
        return lambda batch, seed: (np.random.default_rng(seed).uniform() < norm.cdf((math.log(batch) - log_b50) / width),)

    verdicts = []
    for rep in reps:
        seed = np.random.SeedSequence([rep, 777])
        first, _ = batch_search.critical_batch_curve(make_success, Ts, seed, 12, 64, max_batch, 0.9)
        verdicts.append(transfer_growth_verdict(Ts, first[0], max_batch, seed=seed.spawn(1)[0]) | {"first": first[0]})
    return verdicts


def test_transfer_check_passes_log_like_growth_and_fails_a_poly_T_factor():
    """The typical instance's growth (T^0.27 at the median) passes; ∝ T (vanilla Stage 2's law) and T^0.75 fail.
    Over 300 repetitions each: 0, 300 and 295 FAILs (docs/scb.md §10.4); a few of them here."""
    assert all(v["passed"] for v in _synthetic_transfer_verdicts(0.27, range(10)))
    assert not any(v["passed"] for v in _synthetic_transfer_verdicts(1.0, range(5)))
    assert sum(v["passed"] for v in _synthetic_transfer_verdicts(0.75, range(10))) <= 1


def test_transfer_check_at_its_boundary_fails_at_most_at_the_stated_rate():
    """At B ∝ √T exactly, the one-sided test (stated 2.5%) does not FAIL: 0 of 300 in docs/scb.md §10.4."""
    assert all(v["passed"] for v in _synthetic_transfer_verdicts(0.5, range(10)))


def test_transfer_check_fails_only_when_the_median_is_censored():
    """A cap that censors one walk of 12 at T = 1024 leaves the median measured (PASS); one that censors 7 of 12
    leaves the exponent unmeasured (FAIL)."""
    minority, majority = _synthetic_transfer_verdicts(0.27, (1, 2), max_batch=16384)
    assert np.sum(minority["first"] > 16384) == 1 and not minority["median_censored"] and minority["passed"]
    assert np.sum(majority["first"] > 16384) == 7 and majority["median_censored"] and not majority["passed"]


@pytest.mark.parametrize("max_batch", [0, -1, 2.5, True])
def test_transfer_verdict_refuses_a_bad_budget(max_batch):
    from attnflow.validation.scb import transfer_growth_verdict

    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        transfer_growth_verdict((16, 64, 256), np.full((3, 12), 100.0), max_batch, seed=0)


def test_stage_2_that_loses_the_signal_is_a_stage_failure_not_a_crash():
    start = cf.line_point(EXAMPLE, 0.0, -0.5)  # α_Q < 0: normalisation at ½α_Q·min q* is impossible
    with pytest.raises(dyn.StageFailure, match="lost the attention signal"):
        dyn.run_stages_2_3(EXAMPLE, start, dyn.StageSettings(0, 100, 0.25), seed=0, alpha_Q=0.5)


@pytest.mark.parametrize("make, message", [
    (lambda: cf.SCBProblem.random(5, 1, 1, seed=0), "Q_star must differ from uniform attention"),
    (lambda: cf.SCBProblem(np.full((3, 3), 1 / 3), np.eye(3)[:, [0, 1, 2]], 1), "P must differ from mu"),
])
def test_a_problem_without_signal_is_refused_with_the_reason(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_related_transition_keeps_the_stationary_law_and_column_sums():
    P_tilde = cf.related_transition(EXAMPLE, 0.6, seed=3)
    assert np.allclose(P_tilde @ EXAMPLE.mu, EXAMPLE.mu, atol=1e-13)
    assert np.allclose(P_tilde.sum(axis=0), 1.0, atol=1e-13)
    base = np.outer(EXAMPLE.mu, np.ones(EXAMPLE.N))
    exact = cf.related_transition(EXAMPLE, 0.6, seed=3, noise=0.0)
    assert cf.mu_inner(EXAMPLE, exact - base, EXAMPLE.P - base) == pytest.approx(0.6 * EXAMPLE.K_P, rel=1e-12)
    for kwargs, message in [(dict(rho=0.0), "rho"), (dict(rho=1.5), "rho"), (dict(rho=0.5, noise=-1.0), "noise")]:
        with pytest.raises(ValueError, match=message):
            cf.related_transition(EXAMPLE, seed=0, **kwargs)


def test_rounding_threshold_sits_midway_on_the_line_and_finds_the_supports_there():
    _, Q = cf.line_point(EXAMPLE, 0.0, 0.6)
    theta = dyn.rounding_threshold(EXAMPLE, 0.6)
    q_min = EXAMPLE.Q_star[EXAMPLE.Q_star > 0].min()
    assert 0.4 / EXAMPLE.T < theta < 0.6 * q_min + 0.4 / EXAMPLE.T
    assert dyn.rounding_finds_supports(EXAMPLE, Q, 0.6)
    assert not dyn.rounding_finds_supports(EXAMPLE, np.full_like(Q, 1 / EXAMPLE.T), 0.6)


def test_critical_batch_refuses_a_stage1_exit_level_the_line_never_reaches():
    from attnflow import run_claim, select

    result = run_claim(select(["scb.critical_batch"])[0], seed=0, c1=1.5)
    assert result.status == "ERROR" and "c1 must lie in (0, 1)" in result.notes


@pytest.mark.parametrize("epsilon", [1e-4, 1e-6])
def test_stage1_duration_is_the_flows_crossing_time_as_epsilon_vanishes(epsilon):
    """τ₁ = log(2c/ε) − ½ log(1 − c²) against the normalised flow itself (DOPRI5 from the origin, crossing found on
    a dense grid): they agree to O(ε/c), and the linear phase's log(2c/ε) alone is late by ½ log(1 − c²)·(−1),
    0.005 at c = 0.1, which the --full setting of scb.stage1_duration exposed."""
    from types import SimpleNamespace

    c = 0.1
    predicted = cf.stage1_duration(SimpleNamespace(epsilon=epsilon, T=1, K_Q=1 / epsilon), 0.25, c)["tau"]
    taus = np.linspace(predicted - 0.5, predicted + 0.5, 20001)
    top = dyn.normalised_flow(epsilon, [0.0, 0.0], np.concatenate([[0.0], taus]),
                              rtol=1e-12, atol=1e-16).states["alpha"][1:].max(axis=1)
    i = int(np.argmax(top >= c))
    crossing = float(np.interp(c, top[i - 1:i + 1], taus[i - 1:i + 1]))
    assert abs(crossing - predicted) < 2 * epsilon / c
    assert abs(crossing - math.log(2 * c / epsilon) + 0.5 * math.log1p(-c * c)) < 2 * epsilon / c
    assert crossing - math.log(2 * c / epsilon) > 0.9 * (-0.5 * math.log1p(-c * c))


def test_stage1_duration_refuses_a_level_at_or_past_the_fixed_point():
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="c must be"):
        cf.stage1_duration(SimpleNamespace(epsilon=1e-3, T=1, K_Q=1e3), 0.25, 1.0)
