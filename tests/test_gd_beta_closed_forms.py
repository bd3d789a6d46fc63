"""GD-β closed forms against brute-force Monte Carlo of the raw definitions, finite differences, and the
independently computed reference values of docs/gd_beta.md §6."""
import numpy as np
import pytest

import attnflow.closed_forms.gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem
from attnflow.dynamics import gd_beta as dyn
from attnflow.dynamics.montecarlo import monte_carlo_mean

from .conftest import assert_within_standard_errors

INSTANCES = {
    "full rank": dict(),
    "singular H": dict(rank_H=2),
    "singular Psi": dict(rank_Psi=1),
}


def random_problem(kind, seed=1, d=3, N=7, **kw):
    return GDBetaProblem.random(d, N, seed=seed, sigma2=0.4, beta_norm=1.3, **INSTANCES[kind], **kw)


# ---- validation ---------------------------------------------------------------------------------------
GOOD = dict(H=np.eye(2), Psi=np.eye(2), beta_star=np.ones(2), sigma2=0.25, N=10)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(H=np.array([[1.0, 0.0], [0.0, -1.0]])), "H must be positive semi-definite"),
        (dict(H=np.array([[1.0, 0.5], [0.0, 1.0]])), "H must be symmetric"),
        (dict(Psi=np.eye(3)), "Psi must be 2x2"),
        (dict(Psi=np.array([[1.0, 2.0], [2.0, 1.0]])), "Psi must be positive semi-definite"),
        (dict(beta_star=np.ones(3)), "beta_star must have shape"),
        (dict(beta_star=np.array([np.nan, 0.0])), "beta_star must be finite"),
        (dict(H=np.array([[np.inf, 0], [0, 1.0]])), "H must be finite"),
        (dict(sigma2=-0.1), "sigma2 must be >= 0"),
        (dict(sigma2=float("nan")), "sigma2 must be finite"),
        (dict(N=0), "N must be >= 1"),
        (dict(N=2.5), "N must be an integer"),
        (dict(H=np.zeros((0, 0)), Psi=np.zeros((0, 0)), beta_star=np.zeros(0)), "d >= 1"),
        (dict(H=np.ones(2)), "H must be 2-dimensional"),
    ],
)
def test_bad_problem_is_a_value_error_naming_the_parameter(change, message):
    with pytest.raises(ValueError, match=message):
        GDBetaProblem(**{**GOOD, **change})


def test_optimum_needs_noise_or_signal():
    problem = GDBetaProblem(**{**GOOD, "Psi": np.zeros((2, 2)), "sigma2": 0.0})
    with pytest.raises(ValueError, match="sigma2 must be > 0"):
        cf.optimal_risk(problem)


def test_random_instances_have_requested_ranks_and_bounded_spectrum():
    problem = GDBetaProblem.random(4, 5, seed=0, rank_H=2, rank_Psi=3, spectrum=(0.5, 2.0))
    eig_H = np.linalg.eigvalsh(problem.H)
    assert np.sum(eig_H > 1e-12) == 2 and eig_H.max() <= 2.0 + 1e-12
    assert np.sum(np.linalg.eigvalsh(problem.Psi) > 1e-12) == 3
    with pytest.raises(ValueError, match="rank_H"):
        GDBetaProblem.random(2, 5, seed=0, rank_H=3)


# ---- §3: the risk -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", INSTANCES)
def test_icl_risk_matches_brute_force_monte_carlo(kind):
    problem = random_problem(kind)
    rng = np.random.default_rng(7)
    beta0, Gamma = rng.normal(size=3), rng.normal(size=(3, 3)) / 3  # Γ need not be symmetric
    mc = dyn.monte_carlo_risk(problem, lambda p: cf.gd_beta_predict(p.X, p.y, p.x_query, beta0, Gamma), 200_000, seed=11)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.icl_risk(problem, beta0, Gamma))


def test_icl_risk_broadcasts_over_a_trajectory():
    problem = random_problem("full rank")
    rng = np.random.default_rng(3)
    betas, Gammas = rng.normal(size=(5, 3)), rng.normal(size=(5, 3, 3))
    batched = cf.icl_risk(problem, betas, Gammas)
    one_by_one = [cf.icl_risk(problem, b, G) for b, G in zip(betas, Gammas)]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-13)


@pytest.mark.parametrize("kind", INSTANCES)
def test_excess_risk_decomposition_sums_to_the_excess(kind):
    problem = random_problem(kind)
    rng = np.random.default_rng(5)
    beta0, Gamma = rng.normal(size=3), rng.normal(size=(3, 3))
    beta_part, gamma_part = cf.excess_risk_parts(problem, beta0, Gamma)
    excess = cf.icl_risk(problem, beta0, Gamma) - cf.optimal_risk(problem)
    assert beta_part >= 0 and gamma_part >= 0
    assert beta_part + gamma_part == pytest.approx(excess, rel=1e-10)


# ---- Theorem 5.2 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", INSTANCES)
def test_optimal_risk_matrix_and_eigen_forms_agree_and_are_attained(kind):
    problem = random_problem(kind)
    R_star = cf.optimal_risk(problem)
    assert cf.optimal_risk_eigen(problem) == pytest.approx(R_star, rel=1e-12)
    assert cf.icl_risk(problem, problem.beta_star, cf.optimal_gamma(problem)) == pytest.approx(R_star, rel=1e-12)


def test_spec_golden_values_isotropic():
    """docs/gd_beta.md §6: H = Ψ = I₂, σ² = 0.25, N = 10, β* = (1, 0)."""
    problem = GDBetaProblem.isotropic(d=2, N=10, sigma2=0.25, beta_norm=1.0)
    assert cf.optimal_risk(problem) == pytest.approx(0.7405660377, abs=1e-10)
    np.testing.assert_allclose(cf.optimal_gamma(problem), 0.7547169811 * np.eye(2), atol=1e-10)
    assert cf.gd0_optimal_risk(problem) == pytest.approx(0.9640872, abs=1e-7)
    assert cf.optimal_attention_risk(problem, mlp=False).risk == pytest.approx(0.950478, abs=1e-6)
    assert cf.optimal_attention_risk(problem, mlp=True).risk == pytest.approx(0.7405660377, abs=1e-9)


@pytest.mark.parametrize("kind", INSTANCES)
def test_gd0_optimal_risk_is_the_minimum_over_gamma_at_zero_initialisation(kind):
    """GD-0 = GD-β with β₀ fixed at 0: its closed-form optimum equals min_Γ R(0, Γ) of the MC-tested risk."""
    from scipy.optimize import minimize

    problem = random_problem(kind)
    zero = np.zeros(3)

    def objective(g):
        Gamma = g.reshape(3, 3)
        return float(cf.icl_risk(problem, zero, Gamma)), cf.risk_gradient(problem, zero, Gamma)[1].ravel()

    found = minimize(objective, np.zeros(9), jac=True, method="L-BFGS-B", options=dict(gtol=1e-12, ftol=1e-16))
    assert found.fun == pytest.approx(cf.gd0_optimal_risk(problem), rel=1e-9)


def test_spec_gap_scaling_isotropic_large_context():
    """docs/gd_beta.md §6: H = Ψ = I₂, σ² = 0.25, N = 640: N·gap = 0.744, 2.98, 11.9 for ‖β*‖ = 0.5, 1, 2."""
    for norm, expected in [(0.5, 0.744), (1.0, 2.98), (2.0, 11.9)]:
        problem = GDBetaProblem.isotropic(d=2, N=640, sigma2=0.25, beta_norm=norm)
        gap = cf.optimal_attention_risk(problem, mlp=False).risk - cf.optimal_risk(problem)
        assert 640 * gap == pytest.approx(expected, rel=5e-3)  # docs/gd_beta.md §6 quotes 3 significant figures


@pytest.mark.parametrize("norm", [100.0])
def test_lsa_optimum_reaches_the_narrow_valley_at_huge_beta(norm):
    """docs/gd_beta.md §6, §11.11: at ‖β*‖ = 100 the LSA optimum lies near b → 0, where BFGS alone stopped 3.3e-5
    above it. Independent route: the risk is invariant to the scale of (a, b), so fix b = 1 and
    minimise the read-out risk over a ∈ R² by Nelder–Mead from a = −β*/2 and −2β* (from −β* itself it stalls at b = 0's value)."""
    from scipy.optimize import minimize

    problem = GDBetaProblem.isotropic(d=2, N=10, sigma2=0.25, beta_norm=norm)

    def risk(a):
        return cf.optimal_readout_risk(problem, a, 1.0, constant=False)[0]

    independent = min(minimize(risk, -problem.beta_star * t, method="Nelder-Mead",
                               options=dict(xatol=1e-7, fatol=1e-9, maxiter=5_000)).fun for t in (0.5, 2.0))
    assert cf.optimal_attention_risk(problem, mlp=False).risk == pytest.approx(independent, rel=1e-9)


def test_optimal_gamma_special_case_full_rank():
    """docs/gd_beta.md §4: for H, Ψ ≻ 0, Γ* = ((N+1)/N H + (tr(HΨ) + σ²)/N Ψ⁻¹)⁻¹."""
    problem = random_problem("full rank")
    N = problem.N
    expected = np.linalg.inv((N + 1) / N * problem.H
                             + (np.trace(problem.H @ problem.Psi) + problem.sigma2) / N * np.linalg.inv(problem.Psi))
    np.testing.assert_allclose(cf.optimal_gamma(problem), expected, rtol=1e-9)


@pytest.mark.parametrize("kind", INSTANCES)
def test_risk_gradient_matches_finite_differences_and_vanishes_at_the_optimum(kind):
    problem = random_problem(kind)
    rng = np.random.default_rng(2)
    beta0, Gamma = rng.normal(size=3), rng.normal(size=(3, 3))
    g_beta, g_Gamma = cf.risk_gradient(problem, beta0, Gamma)
    h = 1e-6
    for i in range(3):
        e = np.zeros(3)
        e[i] = h
        fd = (cf.icl_risk(problem, beta0 + e, Gamma) - cf.icl_risk(problem, beta0 - e, Gamma)) / (2 * h)
        assert g_beta[i] == pytest.approx(fd, rel=1e-6, abs=1e-8)
        for j in range(3):
            E = np.zeros((3, 3))
            E[i, j] = h
            fd = (cf.icl_risk(problem, beta0, Gamma + E) - cf.icl_risk(problem, beta0, Gamma - E)) / (2 * h)
            assert g_Gamma[i, j] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    g_beta, g_Gamma = cf.risk_gradient(problem, problem.beta_star, cf.optimal_gamma(problem))
    assert np.abs(g_beta).max() < 1e-12 and np.abs(g_Gamma).max() < 1e-12


def test_flow_rhs_is_minus_the_gradient():
    problem = random_problem("singular H")
    rng = np.random.default_rng(4)
    beta0, Gamma = rng.normal(size=3), rng.normal(size=(3, 3))
    rhs = cf.gradient_flow_rhs(0.0, cf.flow_state(beta0, Gamma), cf.pack_flow_params(problem))
    g_beta, g_Gamma = cf.risk_gradient(problem, beta0, Gamma)
    np.testing.assert_allclose(rhs, -cf.flow_state(g_beta, g_Gamma), rtol=1e-13, atol=1e-14)


def test_beta_curvature_is_the_hessian_in_beta0_and_bounded_below():
    problem = random_problem("full rank")
    Gamma = np.random.default_rng(8).normal(size=(3, 3))
    B = cf.beta_curvature(problem, Gamma)
    e = np.array([0.3, -0.2, 0.5])
    # For fixed Γ the risk is (β₀ − β*)ᵀB(β₀ − β*) + const (docs/gd_beta.md §3).
    R = lambda s: cf.icl_risk(problem, problem.beta_star + s * e, Gamma)  # noqa: E731
    assert (R(1.0) + R(-1.0) - 2 * R(0.0)) / 2 == pytest.approx(e @ B @ e, rel=1e-10)
    assert np.linalg.eigvalsh(B - problem.H / (problem.N + 1)).min() > -1e-12


def test_local_rates_are_the_eigenvalues_of_the_linearised_flow():
    """Differential test: the slowest decay rates of the numerically linearised flow at the fixed point."""
    problem = random_problem("full rank")
    d = problem.d
    params = cf.pack_flow_params(problem)
    y_star = cf.flow_state(problem.beta_star, cf.optimal_gamma(problem))
    h = 1e-6
    J = np.column_stack([(cf.gradient_flow_rhs(0.0, y_star + h * e, params)
                          - cf.gradient_flow_rhs(0.0, y_star - h * e, params)) / (2 * h) for e in np.eye(d + d * d)])
    rates = cf.local_rates(problem)
    beta_block = -np.linalg.eigvals(J[:d, :d]).real
    gamma_block = -np.linalg.eigvals(J[d:, d:]).real
    assert np.abs(J[d:, :d]).max() < 1e-6  # block-diagonal at the fixed point (docs/gd_beta.md §9)
    assert beta_block.min() == pytest.approx(rates.beta, rel=1e-6)
    assert gamma_block.min() == pytest.approx(rates.gamma_mode, rel=1e-6)


@pytest.mark.parametrize("kind", ["full rank", "singular H"])
def test_flow_curvature_is_the_largest_eigenvalue_of_the_risk_hessian_at_the_optimum(kind):
    """Exact identity: the closed-form max(2λ_max(B), 2λ_max(H)λ_max(K)) against the spectrum of ∇²R (central
    differences of the closed-form gradient) at (β*, Γ*)."""
    problem = random_problem(kind)
    hessian = cf.risk_hessian(problem, problem.beta_star, cf.optimal_gamma(problem))
    assert cf.flow_curvature(problem) == pytest.approx(np.linalg.eigvalsh(hessian).max(), rel=1e-8)


@pytest.mark.parametrize("kind", ["full rank", "singular H"])
def test_slow_modes_are_eigenvectors_of_the_linearised_flow(kind):
    """Exact identities (docs/gd_beta.md §9 item 4): B(Γ*)v = (r/2)v and −2H(uwᵀ)K = −γ·uwᵀ, both on range(H)."""
    problem = random_problem(kind)
    rates, modes = cf.local_rates(problem), cf.slow_modes(problem)
    B = cf.beta_curvature(problem, cf.optimal_gamma(problem))
    K = problem.H_half @ cf.omega(problem) @ problem.H_half
    np.testing.assert_allclose(B @ modes.beta, rates.beta / 2 * modes.beta, atol=1e-12)
    np.testing.assert_allclose(problem.H_range_projector @ modes.beta, modes.beta, atol=1e-12)
    np.testing.assert_allclose(2 * problem.H @ modes.gamma @ K, rates.gamma_mode * modes.gamma, atol=1e-12)
    assert np.linalg.norm(modes.gamma) == pytest.approx(1.0)


def test_gamma_response_matches_an_independent_integration_of_the_flow():
    """Γ − Γ* from (β* + a·v, Γ*) against scipy's DOP853 on the raw field (risk_gradient): the neglected terms are
    O(a²) relative, so halving a quarters the deviation (a ≥ 0.05 keeps it above the integrator floor)."""
    from scipy.integrate import solve_ivp

    problem = random_problem("full rank")
    d, v = problem.d, cf.slow_modes(problem).beta
    gamma_star = cf.optimal_gamma(problem)
    times = np.linspace(0.0, 10.0 / cf.local_rates(problem).gamma_tail, 60)[1:]

    def field(t, y):
        g_beta, g_gamma = cf.risk_gradient(problem, y[:d], y[d:].reshape(d, d))
        return -np.concatenate([g_beta, g_gamma.ravel()])

    deviations = []
    for a in (1e-1, 5e-2):
        y0 = np.concatenate([problem.beta_star + a * v, gamma_star.ravel()])
        sol = solve_ivp(field, (0.0, times[-1]), y0, method="DOP853", t_eval=times, rtol=1e-13, atol=1e-16)
        D = sol.y[d:].T.reshape(-1, d, d) - gamma_star
        predicted = cf.gamma_response(problem, a, times)
        deviations.append(np.max(np.linalg.norm(D - predicted, axis=(1, 2)) / np.linalg.norm(predicted, axis=(1, 2))))
    assert deviations[0] < 1e-2
    assert deviations[1] / deviations[0] == pytest.approx(0.25, rel=0.1)


# ---- docs/gd_beta.md §6: LSA / LTB read-out moments ------------------------------------------------------------------
def _features(problem, prompts, a, b, constant):
    N = problem.N
    v = prompts.X @ a + b * prompts.y
    g = np.einsum("nkd,nk->nd", prompts.X, v) / N
    r = np.einsum("nk,nk->n", prompts.y, v) / N
    phi = np.column_stack([g, r])
    return np.column_stack([np.ones(len(r)), phi]) if constant else phi


@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("kind", ["full rank", "singular Psi"])
def test_readout_moments_match_monte_carlo(constant, kind):
    problem = GDBetaProblem.random(2, 5, seed=3, sigma2=0.3, beta_norm=1.0, **({"rank_Psi": 1} if kind != "full rank" else {}))
    a, b = np.array([0.4, -0.7]), 0.8
    P, C, Xi = cf.readout_moments(problem, a, b, constant=constant)
    prompts = dyn.sample_prompts(problem, 400_000, np.random.default_rng(17))
    phi = _features(problem, prompts, a, b, constant)
    for samples, predicted in ((phi[:, :, None] * phi[:, None, :], P), (prompts.beta[:, :, None] * phi[:, None, :], C)):
        mean = samples.mean(axis=0)
        se = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
        constant_entries = se == 0  # the 1·1 entry has no variance
        np.testing.assert_allclose(mean[constant_entries], predicted[constant_entries], rtol=1e-12)
        assert_within_standard_errors(mean[~constant_entries], se[~constant_entries], predicted[~constant_entries])
    np.testing.assert_allclose(Xi, problem.Psi + np.outer(problem.beta_star, problem.beta_star))


def test_readout_risk_matches_monte_carlo():
    problem = GDBetaProblem.random(2, 6, seed=4, sigma2=0.3, beta_norm=1.5)
    rng = np.random.default_rng(9)
    c, a, b, Q, q = rng.normal(size=2), rng.normal(size=2), 0.7, rng.normal(size=(2, 2)), rng.normal(size=2) / 3
    W = np.column_stack([c, Q.T, q])
    exact = cf.readout_risk(problem, a, b, W, constant=True)
    mc = dyn.monte_carlo_risk(problem, lambda p: cf.ltb_reduced_predict(p.X, p.y, p.x_query, c, a, b, Q, q), 300_000, seed=2)
    assert_within_standard_errors(mc.mean, mc.standard_error, exact)


@pytest.mark.parametrize("mlp", [True, False])
def test_ltb_forward_pass_equals_its_reduction(mlp):
    """docs/gd_beta.md §2.1: the full token-matrix forward pass depends on (U, V, K) only through (c, a, b, Q, q)."""
    problem = GDBetaProblem.random(3, 6, seed=2)
    rng = np.random.default_rng(12)
    U, V, K = (rng.normal(size=(4, 4)) for _ in range(3))
    prompts = dyn.sample_prompts(problem, 50, rng)
    full = cf.ltb_forward(dyn.token_matrices(prompts), U, V, K, mlp=mlp)
    reduced = cf.ltb_reduced_predict(prompts.X, prompts.y, prompts.x_query, *cf.ltb_reduced_coordinates(U, V, K, mlp=mlp))
    np.testing.assert_allclose(full, reduced, rtol=1e-11, atol=1e-11)


# ---- Lemma 6.1: Bayes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["full rank", "singular Psi"])
def test_bayes_risk_semi_analytic_matches_brute_force(kind):
    problem = GDBetaProblem.random(2, 6, seed=5, sigma2=0.3, **({"rank_Psi": 1} if kind != "full rank" else {}))
    semi = dyn.bayes_risk(problem, 40_000, seed=1)

    def squared_error(rng, m):
        p = dyn.sample_prompts(problem, m, rng)
        return (np.einsum("nd,nd->n", p.x_query, cf.bayes_estimate(problem, p.X, p.y)) - p.y_query) ** 2

    brute = monte_carlo_mean(squared_error, 200_000, seed=2)
    assert_within_standard_errors(brute.mean - semi.mean, np.hypot(brute.standard_error, semi.standard_error), 0.0)


def test_bayes_golden_value_isotropic():
    """docs/gd_beta.md §6: Bayes = 0.31785 ± 0.00005 for H = Ψ = I₂, σ² = 0.25, N = 10."""
    semi = dyn.bayes_risk(GDBetaProblem.isotropic(), 100_000, seed=3)
    assert_within_standard_errors(semi.mean, np.hypot(semi.standard_error, 5e-5), 0.31785)


def test_bayes_is_exact_interpolation_without_noise():
    """σ² = 0 and N >= rank Σ: the posterior mean recovers β exactly (docs/gd_beta.md §11.10)."""
    problem = GDBetaProblem(H=np.eye(2), Psi=np.diag([1.0, 0.0]), beta_star=np.ones(2), sigma2=0.0, N=3)
    X = np.random.default_rng(0).normal(size=(4, 3, 2))
    np.testing.assert_allclose(cf.bayes_conditional_excess(problem, X), 0.0, atol=1e-12)


@pytest.mark.parametrize("N", [2, 5])
def test_bayes_excess_is_continuous_down_to_noise_free_labels(N):
    """With Σ = I the conditional excess is Σ_k σ²/(σ² + λ_k) over the eigenvalues λ_k of X̃ᵀX̃, exactly 0 for a
    zero eigenvalue's term at σ² = 0 and 1 for it at σ² > 0. Both sides of the switch to the eigen-form
    (σ² = EIGEN_FORM_BELOW·N‖Σ‖) and the limit σ² → 0 follow it: d − N at N = 2 < d = 3 for every σ² down to 0, and
    exactly 0 at σ² = 0 when N ≥ d."""
    X = np.random.default_rng(1).normal(size=(6, N, 3))
    lam = np.linalg.eigvalsh(np.swapaxes(X, 1, 2) @ X)
    lam[lam < 1e-12 * lam.max()] = 0.0  # the exact zero eigenvalues of a rank-N Gram matrix
    for s2 in (1e-3, 1e-6, 1e-7 * N, 1e-9, 1e-90, 1e-320, 0.0):
        excess = cf.bayes_conditional_excess(GDBetaProblem.isotropic(d=3, N=N, sigma2=s2), X)
        expected = (lam == 0).sum(axis=1) if s2 == 0 else (s2 / (s2 + lam)).sum(axis=1)
        np.testing.assert_allclose(excess, expected, rtol=1e-9, atol=1e-300, err_msg=f"sigma2={s2}")
    assert N < 3 or np.all(cf.bayes_conditional_excess(GDBetaProblem.isotropic(d=3, N=N, sigma2=0.0), X) == 0.0)


# ---- Corollary 6.2 ------------------------------------------------------------------------------------------
def test_large_context_ratio_limit_and_sandwich():
    problem = GDBetaProblem(H=np.diag([1, 0.5, 0.25, 0.125]), Psi=np.diag([0.4, 0.3, 0.2, 0.1]),
                            beta_star=np.zeros(4), sigma2=1.0, N=10)
    assert cf.snr(problem) == pytest.approx(0.6125)
    assert cf.large_context_ratio_limit(problem) == pytest.approx(1.765625)  # docs/gd_beta.md §8 table: 1.766
    lower, upper = cf.excess_risk_sandwich(problem)
    assert lower <= cf.optimal_risk(problem) - problem.sigma2 <= upper


# ---- bad parameters and a property test ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: cf.icl_risk(p, [np.nan, 0.0], np.eye(2)), "beta0 must be finite"),
        (lambda p: cf.icl_risk(p, np.zeros(3), np.eye(2)), r"beta0 must have shape \(\.\.\., 2\)"),
        (lambda p: cf.icl_risk(p, np.zeros(2), np.eye(3)), r"Gamma must have shape"),
        (lambda p: cf.risk_gradient(p, np.zeros(2), [[np.inf, 0], [0, 1]]), "Gamma must be finite"),
        (lambda p: cf.readout_moments(p, [1.0], 1.0, constant=True), "a must have shape"),
        (lambda p: cf.readout_risk(p, [1.0, 0.0], 1.0, np.ones((2, 3)), constant=True), "W must have shape"),
    ],
)
def test_bad_parameters_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(GDBetaProblem.isotropic())


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_entries = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(beta0=st.lists(_entries, min_size=3, max_size=3), gamma=st.lists(_entries, min_size=9, max_size=9),
       kind=st.sampled_from(sorted(INSTANCES)))
def test_no_parameter_beats_the_optimal_risk(beta0, gamma, kind):
    """Theorem 5.2 as a property: R(β₀, Γ) >= R* for every (β₀, Γ), and the decomposition is exact."""
    problem = random_problem(kind)
    Gamma = np.reshape(gamma, (3, 3))
    risk = float(cf.icl_risk(problem, beta0, Gamma))
    R_star = cf.optimal_risk(problem)
    assert risk >= R_star - 1e-10 * max(1.0, risk)
    assert sum(cf.excess_risk_parts(problem, beta0, Gamma)) == pytest.approx(risk - R_star, rel=1e-8, abs=1e-10)


def test_lemma_5_1_embedding_makes_the_ltb_compute_gd_beta():
    """Exact identity: the LTB with the weights of Lemma 5.1 outputs the GD-β prediction, prompt by prompt."""
    problem = GDBetaProblem.random(3, 7, seed=12, sigma2=0.5)
    rng = np.random.default_rng(13)
    beta0, Gamma = rng.normal(size=3), rng.normal(size=(3, 3))
    prompts = dyn.sample_prompts(problem, 500, rng)
    U, V, K = cf.ltb_embedding(beta0, Gamma)
    ltb = cf.ltb_forward(dyn.token_matrices(prompts), U, V, K)
    gd = cf.gd_beta_predict(prompts.X, prompts.y, prompts.x_query, beta0, Gamma)
    assert np.max(np.abs(ltb - gd)) <= 1e-12 * np.max(np.abs(gd))
    with pytest.raises(ValueError, match="Gamma"):
        cf.ltb_embedding(beta0, np.eye(2))


def test_moments_by_batch_are_the_per_batch_moments_exactly():
    p = GDBetaProblem.isotropic(d=2, N=4, sigma2=0.25, beta_norm=1.0)
    pool = dyn.context_pool(p, 12, seed=3, n_batches=3)
    beta0, Gamma = np.array([0.1, -0.2]), np.array([[0.3, 0.05], [0.0, 0.2]])
    stacked = cf.conditional_gradient_moments_by_batch(p, pool.X, pool.y, pool.beta, beta0, Gamma, n_batches=3)
    for b in range(3):
        part = slice(4 * b, 4 * b + 4)
        single = cf.conditional_gradient_moments(p, pool.X[part], pool.y[part], pool.beta[part], beta0, Gamma)
        for s, one in zip(stacked, single):
            np.testing.assert_array_equal(s[b], one)
    with pytest.raises(ValueError, match="n_batches"):
        cf.conditional_gradient_moments_by_batch(p, pool.X, pool.y, pool.beta, beta0, Gamma, n_batches=5)
