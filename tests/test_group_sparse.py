"""Group-sparse classification: the closed forms against brute-force Monte Carlo of the raw transformer."""
import math

import numpy as np
import pytest

from attnflow.closed_forms import group_sparse as cf
from attnflow.closed_forms.group_sparse import GroupSparseProblem
from attnflow.dynamics import group_sparse as dyn
from tests.conftest import assert_within_standard_errors

EXAMPLE = GroupSparseProblem.standard(4, 6)


@pytest.mark.parametrize("args, message", [
    ((0, 6, 2, np.ones(0)), "d must be >= 1"), ((4, 1, 1, np.ones(4)), "D must be >= 2"),
    ((4, 6, 7, np.ones(4)), "j_star must be in 1..D"), ((4, 6, 0, np.ones(4)), "j_star must be >= 1"),
    ((4, 6, 2, np.zeros(4)), "v_star must be non-zero"), ((4, 6, 2, np.ones(3)), "v_star must have shape"),
    ((4, 6, 2, [1.0, np.nan, 0, 0]), "v_star must be finite"),
])
def test_problem_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        GroupSparseProblem(*args)
    with pytest.raises(ValueError, match="sigma_x must be > 0"):
        GroupSparseProblem(4, 6, 2, np.ones(4), sigma_x=0.0)


def test_v_star_is_normalised():
    assert np.linalg.norm(GroupSparseProblem(2, 3, 1, [3.0, 4.0]).v_star) == pytest.approx(1.0)


def test_raw_gradient_equals_finite_differences_of_the_raw_loss():
    rng = np.random.default_rng(0)
    X, y = dyn.sample_data(EXAMPLE, 50, rng)
    v = rng.normal(0, 0.5, 10)
    W = rng.normal(0, 0.5, (10, 10))
    _, grad_v, grad_W = dyn.loss_and_gradient(EXAMPLE, X, y, v, W)
    h = 1e-6
    for i in (0, 3, 5, 9):
        e = np.zeros(10)
        e[i] = h
        fd = (dyn.loss_and_gradient(EXAMPLE, X, y, v + e, W)[0] - dyn.loss_and_gradient(EXAMPLE, X, y, v - e, W)[0]) / (2 * h)
        assert grad_v[i] == pytest.approx(fd, rel=1e-6, abs=1e-9)
    for a, b in ((0, 0), (2, 7), (6, 1), (8, 9)):
        E = np.zeros((10, 10))
        E[a, b] = h
        fd = (dyn.loss_and_gradient(EXAMPLE, X, y, v, W + E)[0] - dyn.loss_and_gradient(EXAMPLE, X, y, v, W - E)[0]) / (2 * h)
        assert grad_W[a, b] == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_first_step_closed_form_matches_monte_carlo():
    """v⁽¹⁾ = −η∇_v L at zero; its Monte-Carlo estimate from raw per-sample gradients, 4 SE per coordinate."""
    problem = GroupSparseProblem(3, 4, 3, [1.0, -2.0, 0.5], sigma_x=1.5)
    X, y = dyn.sample_data(problem, 60_000, np.random.default_rng(1))
    zero_v, zero_W = np.zeros(7), np.zeros((7, 7))
    chunks = np.array([-0.7 * dyn.loss_and_gradient(problem, X[part], y[part], zero_v, zero_W)[1]
                       for part in np.array_split(np.arange(60_000), 30)])
    closed = cf.first_step_v(problem, 0.7)
    for i in range(7):
        assert_within_standard_errors(chunks[:, i].mean(), chunks[:, i].std(ddof=1) / math.sqrt(30) + 1e-15, closed[i])
    _, _, grad_W = dyn.loss_and_gradient(problem, X[:100], y[:100], zero_v, zero_W)
    assert np.all(grad_W == 0)


def test_position_only_gradient_equals_finite_differences_and_vanishing_beta_gives_log2():
    for beta, alpha in ((1.0, 1.0), (4.0, 6.0), (0.5, -1.0)):
        L, d_beta, d_alpha = cf.position_only_terms(EXAMPLE, beta, alpha)
        h = 1e-5
        fd_beta = (cf.position_only_terms(EXAMPLE, beta + h, alpha)[0] - cf.position_only_terms(EXAMPLE, beta - h, alpha)[0]) / (2 * h)
        fd_alpha = (cf.position_only_terms(EXAMPLE, beta, alpha + h)[0] - cf.position_only_terms(EXAMPLE, beta, alpha - h)[0]) / (2 * h)
        assert d_beta == pytest.approx(fd_beta, rel=1e-5)
        assert d_alpha == pytest.approx(fd_alpha, rel=1e-5, abs=1e-10)
    assert cf.position_only_terms(EXAMPLE, 0.0, 2.0)[0] == pytest.approx(math.log(2), rel=1e-12)


def test_position_only_loss_approaches_its_asymptote():
    """L·Dβσ_x → √(2/π)π²/12 as β, α → ∞ (docs/group_sparse.md §6)."""
    L = cf.position_only_terms(EXAMPLE, 200.0, 30.0)[0]
    assert L * 6 * 200.0 / cf.asymptotic_loss_constant() == pytest.approx(1.0, abs=2e-4)


def _skew_normal_definition(beta, alpha, D=6, sigma_x=1.0):
    """(L, ∂L/∂β, ∂L/∂α) straight from the definition of docs/group_sparse.md §6, by scipy's adaptive quadrature
    against the skew-normal density 2φ(x)Φ(λx): L = E[l(κωX)], ∂L/∂β = Dσ_x E[l'(κU)U],
    ∂L/∂α = κ[(1 − s*)E[l'(κU)U] − b²κE[l''(κU)]], with the integration range split at the scales 1/(κω) and 1/λ
    where the integrands turn over."""
    import warnings

    from scipy.integrate import IntegrationWarning, quad
    from scipy.special import expit, log_ndtr

    e = math.exp(alpha)
    s_star, s_o = e / (e + D - 1), 1.0 / (e + D - 1)
    a, b = s_star, s_o * math.sqrt(D - 1)
    omega, lam, kappa = math.hypot(a, b), a / b, D * beta * sigma_x
    density = lambda x: 2.0 * math.exp(-0.5 * x * x + log_ndtr(lam * x)) / math.sqrt(2.0 * math.pi)  # noqa: E731
    scales = [1.0 / lam] + ([1.0 / abs(kappa * omega)] if kappa else [])
    cuts = sorted({0.0, *(sign * k * s for s in scales for k in (1.0, 4.0, 16.0, 40.0) for sign in (-1.0, 1.0)
                          if k * s < 12.0)} | {-12.0, 12.0})

    def integrate(f):
        with warnings.catch_warnings():  # round-off warnings come only from segments holding ~1e-16 of the total
            warnings.simplefilter("ignore", IntegrationWarning)
            return sum(quad(lambda x: f(x) * density(x), lo, hi, epsabs=0.0, epsrel=1e-12, limit=200)[0]
                       for lo, hi in zip(cuts[:-1], cuts[1:]))

    m = lambda x: kappa * omega * x  # noqa: E731
    loss = integrate(lambda x: np.logaddexp(0.0, -m(x)))
    E_dlU = integrate(lambda x: -expit(-m(x)) * omega * x)
    E_d2l = integrate(lambda x: expit(m(x)) * expit(-m(x)))
    return loss, D * sigma_x * E_dlU, kappa * ((1 - s_star) * E_dlU - b * b * kappa * E_d2l)


@pytest.mark.parametrize("beta, alpha", [(0.3, 0.0), (2.0, 3.0), (4.0, 6.0), (50.0, 9.0), (200.0, 12.0),
                                         (1000.0, 16.0), (-1.5, 2.0), (1.0, -3.0)])
def test_position_only_terms_equal_the_skew_normal_definition(beta, alpha):
    """The closed-form skew part and the one-dimensional rules of docs/group_sparse.md §6 against adaptive
    quadrature of the defining integrals (which the former three-grid trapezoid missed by up to 2e-4 at β = 200)."""
    reference = _skew_normal_definition(beta, alpha)
    np.testing.assert_allclose(cf.position_only_terms(EXAMPLE, beta, alpha), reference, rtol=1e-10, atol=0)


def test_position_only_terms_match_monte_carlo_of_the_raw_margin():
    """U = s*|G| + s_o·Σ_{k≠j*} Z_k sampled as it is defined (D − 1 separate irrelevant tokens, no skew-normal law,
    no Stein identity): L = E[l(κU)], ∂L/∂β = E[l'(κU)Dσ_x U], ∂L/∂α = E[l'(κU)κ ∂U/∂α], within 4 standard errors."""
    D, beta, alpha = 5, 1.3, 1.7
    problem = GroupSparseProblem.standard(3, D, sigma_x=0.8)
    s_star, s_o = cf.attention_weights(alpha, D)
    rng = np.random.default_rng(7)
    n = 400_000
    G = np.abs(rng.standard_normal(n))
    Z = rng.standard_normal((n, D - 1)).sum(axis=1)
    U = s_star * G + s_o * Z
    kappa = D * beta * problem.sigma_x
    dl = -1.0 / (1.0 + np.exp(kappa * U))  # l'(κU) = −σ(−κU)
    dU_dalpha = s_star * (1.0 - s_star) * G - s_star * s_o * Z  # ds*/dα = s*(1 − s*), ds_o/dα = −s*s_o
    samples = {"loss": np.logaddexp(0.0, -kappa * U), "d_beta": dl * D * problem.sigma_x * U,
               "d_alpha": dl * kappa * dU_dalpha}
    closed = dict(zip(("loss", "d_beta", "d_alpha"), cf.position_only_terms(problem, beta, alpha)))
    for name, values in samples.items():
        assert_within_standard_errors(values.mean(), values.std(ddof=1) / math.sqrt(n), closed[name])


def test_position_only_loss_takes_arrays_and_agrees_with_the_terms():
    betas, alphas = np.array([[0.0, 0.5], [3.0, 40.0]]), np.array([[1.0, -2.0], [4.0, 9.0]])
    losses = cf.position_only_loss(EXAMPLE, betas, alphas)
    assert losses.shape == (2, 2)
    for i in np.ndindex(2, 2):
        assert losses[i] == cf.position_only_terms(EXAMPLE, betas[i], alphas[i])[0]
    assert cf.position_only_loss(EXAMPLE, 0.0, 1.0) == pytest.approx(math.log(2), rel=1e-14)
    with pytest.raises(ValueError, match="alpha must have the shape of beta"):
        cf.position_only_loss(EXAMPLE, np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="beta must be finite"):
        cf.position_only_loss(EXAMPLE, np.array([np.nan]), np.ones(1))


def test_position_only_gradient_of_the_raw_model_is_the_W22_block_of_the_full_one():
    rng = np.random.default_rng(5)
    X, y = dyn.sample_data(EXAMPLE, 40, rng)
    v, W = rng.normal(0, 0.5, 10), rng.normal(0, 0.5, (10, 10))
    loss, grad_v, grad_W = dyn.loss_and_gradient(EXAMPLE, X, y, v, W)
    loss_p, grad_v_p, grad_W_p = dyn.loss_and_gradient(EXAMPLE, X, y, v, W, position_only=True)
    assert loss_p == loss and np.array_equal(grad_v_p, grad_v)
    np.testing.assert_array_equal(grad_W_p[4:, 4:], grad_W[4:, 4:])
    assert not grad_W_p[:4].any() and not grad_W_p[:, :4].any()


def test_attention_weights_are_a_distribution_at_extreme_alpha():
    for alpha in (-800.0, -3.0, 0.0, 5.0, 800.0):
        s_star, s_o = cf.attention_weights(alpha, 6)
        assert s_star + 5 * s_o == pytest.approx(1.0, abs=1e-15)
        assert 0 <= s_o and 0 <= s_star
        if alpha >= 0:
            assert s_o <= s_star


def test_symmetric_coordinates_recover_a_symmetric_point():
    problem = GroupSparseProblem.standard(3, 4, j_star=2)
    u = problem.v_star
    W = np.zeros((7, 7))
    W[:3, :3] = 0.4 * np.outer(u, u) - 0.1 * (np.eye(3) - np.outer(u, u))
    v = np.concatenate([2.0 * u, np.zeros(4)])
    coords = cf.symmetric_coordinates(problem, v, W)
    assert coords["beta"] == pytest.approx(2.0) and coords["c_par"] == pytest.approx(0.4)
    assert coords["c_perp"] == pytest.approx(-0.1) and coords["W11_off_model"] < 1e-15


def test_symmetrised_full_gd_keeps_the_invariants_and_reproduces():
    a = dyn.full_gd_trajectory(EXAMPLE, 1.0, 15, batch_size=200, seed=4, n_records=4)
    b = dyn.full_gd_trajectory(EXAMPLE, 1.0, 15, batch_size=200, seed=4, n_records=4)
    for name in ("v2", "W12", "W21", "W22_column_sum"):
        assert np.abs(a.metrics[name]).max() < 1e-13
    assert np.array_equal(a.states["W"], b.states["W"])
    unsymmetrised = dyn.full_gd_trajectory(EXAMPLE, 1.0, 15, batch_size=200, seed=4, symmetrise=False, n_records=4)
    assert unsymmetrised.metrics["v2"][-1] > 1e-6  # the invariants need the symmetrised batches


def test_quick_claims_pass_except_the_D_exponent_of_the_time_to_loss():
    from attnflow import run_claim, select
    from tests.test_claim_reporting import assert_reports_by_contract
    results = {c.name: run_claim(c, seed=0) for c in select(["group_sparse"])}
    assert {n: r.status for n, r in results.items() if r.status != "PASS"} == {
        "group_sparse.time_to_loss_submodel": "FINDING"}
    for result in results.values():
        assert_reports_by_contract(result)
    measured = results["group_sparse.time_to_loss_submodel"].measured
    assert measured["epsilon_exponent"] == pytest.approx(-3.0, abs=0.02)  # the ε law holds
    assert measured["group_count_exponent"] == pytest.approx(-2.0, abs=0.05)  # D^-2 (derived), not the stated D^-3


def test_position_only_flow_follows_the_gd_map():
    gd = dyn.position_only_trajectory(EXAMPLE, 1.0, 2000, record_steps=[500, 2000])
    flow = dyn.position_only_flow(EXAMPLE, np.array([500.0, 2000.0]))
    np.testing.assert_allclose(flow.states["beta"], gd.states["beta"], rtol=2e-3)
    np.testing.assert_allclose(flow.metrics["loss"], gd.metrics["loss"], rtol=2e-3)


def test_downstream_data_have_the_margin_and_the_stated_law():
    problem = GroupSparseProblem.standard(3, 5)
    u = np.array([1.0, 2.0, -2.0])
    X, y = dyn.sample_downstream(problem, u, 0.4, 50_000, np.random.default_rng(2))
    margin = y * (X[:, :, problem.star] @ (u / 3.0))
    assert margin.min() >= 0.4 - 1e-12
    assert_within_standard_errors(y.mean(), y.std(ddof=1) / math.sqrt(y.size), 0.0)
    others = X[:, :, [0, 2, 3, 4]].ravel()  # the irrelevant groups stay N(0, σ_x²)
    assert_within_standard_errors(others.mean(), others.std(ddof=1) / math.sqrt(others.size), 0.0)
    squares = others**2
    assert_within_standard_errors(squares.mean(), squares.std(ddof=1) / math.sqrt(squares.size), 1.0)
    with pytest.raises(ValueError, match="u_star must be non-zero"):
        dyn.sample_downstream(problem, np.zeros(3), 0.4, 10, np.random.default_rng(0))


def test_fine_tuning_trains_v_alone_unless_asked_and_learns_the_task():
    problem = GroupSparseProblem.standard(4, 6)
    from attnflow.validation.group_sparse import pretrained_position_only_W
    W = pretrained_position_only_W(problem, 216)
    rng = np.random.default_rng(3)
    u = rng.standard_normal(4)
    X, y = dyn.sample_downstream(problem, u, 0.3, 256, rng)
    X_test, y_test = dyn.sample_downstream(problem, u, 0.3, 4000, rng)
    v, W_tuned = dyn.fine_tune(problem, W, X, y)
    assert np.array_equal(W_tuned, W)
    assert dyn.transformer_error(X_test, y_test, v, W_tuned) < 0.05
    assert not np.array_equal(dyn.fine_tune(problem, W, X, y, eta=0.1, train_W=True)[1], W)
    assert dyn.linear_error(X_test, y_test, dyn.logistic_regression(X, y)) < 0.05


def test_exponent_difference_interval_covers_the_true_difference_at_its_level():
    """Paired lognormal data, 12 seeds, a noise factor shared by both methods: over 2000 experiments the 95%
    paired delta-method t interval covers the true difference 0.7 in a fraction within 4 binomial standard errors
    (sd 0.0049) of 0.95, and is narrower than the unpaired interval √(w_a² + w_b²) built from the two separate
    ones in at least 99% of them (the shared factor cancels)."""
    from attnflow.validation.stats import fit_exponent_difference, fit_exponent_t
    x = np.array([4.0, 8.0, 16.0, 32.0])
    rng = np.random.default_rng(0)
    covered, narrower = 0, 0
    for trial in range(2000):
        noise = rng.lognormal(0, 0.3, (4, 12))
        a = x[:, None] ** 1.0 * noise * rng.lognormal(0, 0.2, (4, 12))
        b = x[:, None] ** 0.3 * noise  # correlated with a through the shared noise: the paired design
        fit = fit_exponent_difference(x, a, b)
        covered += fit.contains(0.7)
        widths = [f.high - f.low for f in (fit_exponent_t(x, a), fit_exponent_t(x, b))]
        narrower += (fit.high - fit.low) < np.hypot(*widths)
    assert abs(covered / 2000 - 0.95) < 4 * 0.0049, covered / 2000
    assert narrower >= 0.99 * 2000, narrower
    with pytest.raises(ValueError, match="same shape"):
        fit_exponent_difference(x, np.ones((4, 3)), np.ones((4, 4)))
    same = rng.lognormal(0, 0.3, (4, 12))
    with pytest.raises(ValueError, match="do not vary"):  # y_a ∝ y_b at every grid value: zero-width interval
        fit_exponent_difference(x, 2.0 * same, same)


@pytest.mark.parametrize("call, message", [
    (lambda: dyn.fine_tune(EXAMPLE, np.zeros((10, 10)), np.zeros((5, 3, 6)), np.ones(5)), "X must have shape"),
    (lambda: dyn.transformer_error(np.zeros((5, 4, 6)), np.ones(5), np.zeros(9), np.zeros((10, 10))), "v must have shape"),
    (lambda: dyn.logistic_regression(np.zeros((5, 4, 6)), np.ones(4)), "y must have shape"),
    (lambda: dyn.linear_error(np.zeros((5, 4, 6)), np.zeros(5), np.zeros(24)), "y must hold labels"),
    (lambda: dyn.full_gd_trajectory(EXAMPLE, 1.0, 2, batch_size=10, seed=0, n_eval=0), "n_eval must be >= 1"),
])
def test_downstream_and_training_refuse_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_attention_far_from_the_signal_position_keeps_its_limit_value():
    """α ≪ 0: s* = e^α/(e^α + D − 1) underflows to 0 below α ≈ −745, where the loss and ∂L/∂β no longer depend
    on α (the attention is uniform over the D − 1 other positions): the values there equal those at α = −100."""
    problem = cf.GroupSparseProblem.from_params({})
    reference = cf.position_only_terms(problem, 1.0, -100.0)
    for alpha in (-745.0, -800.0, -1e4):
        loss, d_beta, d_alpha = cf.position_only_terms(problem, 1.0, alpha)
        assert loss == pytest.approx(reference[0], rel=1e-12) and d_beta == pytest.approx(reference[1], rel=1e-12)
        assert abs(d_alpha) < 1e-12
    with pytest.raises(ValueError, match="alpha"):
        cf.attention_weights(float("nan"), 2)
    with pytest.raises(ValueError, match="D"):
        cf.attention_weights(0.0, 1)


def test_time_to_loss_runs_the_flow_past_its_first_horizon_when_epsilon_asks_for_it():
    """The full setting's smallest ε at D = 4 is reached near τ ≈ 3.7·10⁷, past the first horizon (10⁷): it used to
    end the claim in an ERROR. Halving ε multiplies the time by about 2³ (T_ε ∝ ε^{-3}, the claim's ε law)."""
    from attnflow.validation import group_sparse as claims

    times = claims._time_to_loss(GroupSparseProblem.standard(4, 4), (0.00125, 0.000625))
    assert times[1] > claims.HORIZONS[0]
    assert 7.5 < times[1] / times[0] < 8.5
