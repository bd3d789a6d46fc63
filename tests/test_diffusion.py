"""The diffusion tier (docs/diffusion.md): the LNA recursion, the Gaussian-noise sampler, and GD-β's gradient-noise
covariance (docs/gd_beta.md §12) against brute force."""
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

import attnflow.closed_forms.gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem
from attnflow.dynamics import gd_beta as dyn
from attnflow.dynamics.diffusion import gaussian_noise_paths, linear_noise
from attnflow.dynamics.errors import DivergenceError
from attnflow.dynamics.optimizers import SGD, cosine_schedule
from attnflow.validation.stats import satterthwaite_df, variance_ratio_interval

from .conftest import assert_within_standard_errors

# A quadratic risk R = ½θᵀHθ with a constant noise covariance: the LNA is exact for it.
HESSIAN = np.array([[2.0, 0.5], [0.5, 1.0]])
SIGMA = np.array([[1.0, -0.3], [-0.3, 0.5]])


def _quadratic(theta):
    return HESSIAN @ theta


def _constant_noise(theta):
    return SIGMA[None]


def test_the_lna_is_the_exact_covariance_recursion_of_a_quadratic():
    """Exact identity: for R = ½θᵀHθ and constant Σ, Cov θ_K = Σ_k (Π_{j>k} A_j)(η_k²/B)Σ(Π_{j>k} A_j)ᵀ."""
    rates = cosine_schedule(0.3, 40)
    band = linear_noise(np.array([1.0, -1.0]), rates, 8, gradient=_quadratic, hessian=lambda t: HESSIAN,
                        noise_covariance=_constant_noise)
    expected = np.zeros((2, 2))
    for eta in rates:
        A = np.eye(2) - eta * HESSIAN
        expected = A @ expected @ A.T + eta**2 / 8 * SIGMA
    np.testing.assert_allclose(band.covariance[-1], expected, rtol=1e-12)
    mean = np.array([1.0, -1.0])
    for eta in rates:
        mean = mean - eta * HESSIAN @ mean
    np.testing.assert_allclose(band.mean[-1], mean, rtol=1e-12)
    assert band.n_batches == 1 and np.all(band.total_variance()[1] == 0)


def test_gaussian_noise_paths_have_the_lna_covariance_on_a_quadratic():
    """On a quadratic with constant Σ the sampler is a linear Gaussian recursion: its sample covariance is the LNA's,
    within the χ²_ν/ν interval of its path count (two-sided, 1e-4)."""
    rates = np.full(30, 0.2)
    band = linear_noise(np.zeros(2), rates, 4, gradient=_quadratic, hessian=lambda t: HESSIAN,
                        noise_covariance=_constant_noise)
    paths = gaussian_noise_paths(np.zeros(2), rates, 4, gradient=_quadratic, noise_covariance=_constant_noise,
                                 n_paths=2000, seed=5)
    ratio = np.sum(paths[:, -1].var(axis=0, ddof=1)) / np.trace(band.covariance[-1])
    low, high = variance_ratio_interval(satterthwaite_df(band.covariance[-1], 2000), None, 1e-4)
    assert low <= ratio <= high
    assert_within_standard_errors(paths[:, -1].mean(axis=0), paths[:, -1].std(axis=0, ddof=1) / np.sqrt(2000),
                                  band.mean[-1])


def test_gaussian_noise_paths_are_reproducible_and_each_path_is_its_own():
    kwargs = dict(gradient=_quadratic, noise_covariance=_constant_noise, seed=11)
    few = gaussian_noise_paths(np.zeros(2), np.full(5, 0.1), 2, n_paths=3, **kwargs)
    many = gaussian_noise_paths(np.zeros(2), np.full(5, 0.1), 2, n_paths=6, **kwargs)
    np.testing.assert_array_equal(few, many[:3])
    np.testing.assert_array_equal(few, gaussian_noise_paths(np.zeros(2), np.full(5, 0.1), 2, n_paths=3, **kwargs))


def test_the_band_carries_one_covariance_per_batch_and_its_standard_error():
    """C is linear in Σ: two batch estimates Σ ± Δ give C ± D, and the standard error is their spread/√2."""
    delta = np.array([[0.2, 0.0], [0.0, -0.1]])
    band = linear_noise(np.zeros(2), np.full(10, 0.2), 1, gradient=_quadratic, hessian=lambda t: HESSIAN,
                        noise_covariance=lambda t: np.array([SIGMA + delta, SIGMA - delta]))
    exact = linear_noise(np.zeros(2), np.full(10, 0.2), 1, gradient=_quadratic, hessian=lambda t: HESSIAN,
                         noise_covariance=_constant_noise)
    np.testing.assert_allclose(band.covariance, exact.covariance, rtol=1e-12)
    traces, ses = band.total_variance()
    per_batch = np.trace(band.batch_covariances, axis1=2, axis2=3)
    np.testing.assert_allclose(ses, np.abs(per_batch[:, 0] - per_batch[:, 1]) / 2, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="record"):
        linear_noise(np.zeros(2), np.full(10, 0.2), 1, gradient=_quadratic, hessian=lambda t: HESSIAN,
                     noise_covariance=_constant_noise, record=[0, 5, 5])
    with pytest.raises(ValueError, match="record"):
        gaussian_noise_paths(np.zeros(2), np.full(10, 0.2), 1, gradient=_quadratic, noise_covariance=_constant_noise,
                             n_paths=1, seed=0, record=[0, 11])
    with pytest.raises(ValueError, match="noise_covariance"):
        linear_noise(np.zeros(2), np.full(10, 0.2), 1, gradient=_quadratic, hessian=lambda t: HESSIAN,
                     noise_covariance=lambda t: SIGMA)


def test_divergence_names_the_step_and_bad_input_names_the_parameter():
    with pytest.raises(DivergenceError, match="step"):
        linear_noise(np.ones(2), np.full(200, 5.0), 1, gradient=_quadratic, hessian=lambda t: HESSIAN,
                     noise_covariance=_constant_noise)
    with pytest.raises(DivergenceError, match="path 0 diverged at step"):
        gaussian_noise_paths(np.ones(2), np.full(400, 5.0), 1, gradient=_quadratic, noise_covariance=_constant_noise,
                             n_paths=1, seed=0)
    with pytest.raises(ValueError, match="learning_rates"):
        linear_noise(np.ones(2), [0.1, -0.1], 1, gradient=_quadratic, hessian=lambda t: HESSIAN,
                     noise_covariance=_constant_noise)
    with pytest.raises(ValueError, match="batch_size"):
        linear_noise(np.ones(2), [0.1], 0, gradient=_quadratic, hessian=lambda t: HESSIAN,
                     noise_covariance=_constant_noise)
    with pytest.raises(ValueError, match="n_contexts"):
        dyn.context_pool(GDBetaProblem.random(2, 5, seed=0), 3, seed=0)


def test_the_cosine_schedule_is_the_optimisers_own():
    params = [np.zeros(1)]
    sgd = SGD(params, 0.05, 17)
    np.testing.assert_allclose(cosine_schedule(0.05, 17), [sgd.learning_rate() for _ in range(17)], rtol=1e-14)


def test_gradient_noise_covariance_is_the_batch_formula_bit_for_bit():
    """The estimate over all batches at once is Σ̂ = (1/m)Σ_c E[ĝĝᵀ | c] − m̂m̂ᵀ + K̂/m computed batch by batch, to
    the bit."""
    problem = GDBetaProblem.random(3, 5, seed=2, sigma2=0.4)
    pool = dyn.context_pool(problem, 60, seed=5, n_batches=4)
    beta0, Gamma = np.array([0.2, -0.1, 0.4]), np.array([[0.3, 0.1, 0.0], [-0.2, 0.5, 0.1], [0.0, 0.2, 0.1]])
    sums = cf.conditional_gradient_moments_by_batch(problem, pool.X, pool.y, pool.beta, beta0, Gamma, n_batches=4)
    m = 15
    for estimate, (mean_sum, mean_outer, second_sum) in zip(
            dyn.gradient_noise_covariance(problem, beta0, Gamma, pool), zip(*sums)):
        mean = mean_sum / m
        spread = (mean_outer / m - np.outer(mean, mean)) * m / (m - 1)
        np.testing.assert_array_equal(estimate, second_sum / m - np.outer(mean, mean) + spread / m)


def test_a_context_pool_is_checked_when_made_and_its_parameters_at_each_estimate():
    pool = dyn.context_pool(GDBetaProblem.random(2, 5, seed=0), 32, seed=0)
    assert pool.X.flags.c_contiguous and not pool.X.flags.writeable
    fortran = dyn.ContextPool(X=np.asfortranarray(pool.X), y=np.asfortranarray(pool.y), beta=pool.beta, n_batches=16)
    assert fortran.X.flags.c_contiguous and not fortran.X.flags.writeable and np.array_equal(fortran.X, pool.X)
    X = pool.X.copy()
    X[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="X must be finite"):
        dyn.ContextPool(X=X, y=pool.y, beta=pool.beta, n_batches=16)
    with pytest.raises(ValueError, match="n_batches"):
        dyn.ContextPool(X=pool.X, y=pool.y, beta=pool.beta, n_batches=5)
    with pytest.raises(ValueError, match="y must have shape"):
        dyn.ContextPool(X=pool.X, y=pool.y[:, :-1], beta=pool.beta, n_batches=16)
    with pytest.raises(ValueError, match="pool must hold contexts"):
        dyn.gradient_noise_covariance(GDBetaProblem.random(2, 6, seed=0), np.zeros(2), np.zeros((2, 2)), pool)
    with pytest.raises(ValueError, match="Gamma must have shape"):
        dyn.gradient_noise_covariance(GDBetaProblem.random(2, 5, seed=0), np.zeros(2), np.zeros((3, 3)), pool)
    with pytest.raises(ValueError, match="a single pair"):
        dyn.gradient_noise_covariance(GDBetaProblem.random(2, 5, seed=0), np.zeros((3, 2)), np.zeros((3, 2, 2)), pool)
    with pytest.raises(ValueError, match="Gamma has entries of size 1e"):  # the quartic moments would overflow
        dyn.gradient_noise_covariance(GDBetaProblem.random(2, 5, seed=0), np.zeros(2), np.full((2, 2), 1e100), pool)
    with pytest.raises(ValueError, match="n_batches"):
        dyn.ContextPool(X=pool.X, y=pool.y, beta=pool.beta, n_batches=1)
    with pytest.raises(ValueError, match="n_batches must divide"):  # the kernel refuses what would overrun it
        cf.moment_sums_by_batch(pool.X, pool.y, pool.beta, np.zeros(2), np.zeros((2, 2)), np.eye(2), 0.5, 5)


@pytest.mark.parametrize("kind", ["full rank", "singular H"])
def test_gradient_noise_covariance_matches_brute_force_per_prompt_gradients(kind):
    """Σ from the query-integrated formula (docs/gd_beta.md §12) against the sample covariance of per-prompt
    gradients of the training kernel, every distinct entry within a Bonferroni z bound at family-wise 1e-3."""
    problem = GDBetaProblem.random(2, 6, seed=4, sigma2=0.3, beta_norm=1.0, **({"rank_H": 1} if kind != "full rank" else {}))
    beta0, Gamma = np.array([0.3, -0.4]), np.array([[0.4, 0.1], [-0.2, 0.6]])
    estimates = dyn.gradient_noise_covariance(problem, beta0, Gamma, dyn.context_pool(problem, 16_000, seed=1))
    prompts = dyn.sample_prompts(problem, 30_000, np.random.default_rng(2))
    grads = []
    for i in range(30_000):
        one = slice(i, i + 1)
        _, g_beta, g_Gamma = dyn.minibatch_gradient(problem, dyn.Prompts(
            X=prompts.X[one], y=prompts.y[one], x_query=prompts.x_query[one], y_query=prompts.y_query[one],
            beta=prompts.beta[one]), beta0, Gamma)
        grads.append(np.concatenate([g_beta, g_Gamma.ravel()]))
    grads = np.array(grads)
    centred = grads - grads.mean(axis=0)
    measured = centred.T @ centred / (len(grads) - 1)
    measured_se = (centred[:, :, None] * centred[:, None, :]).std(axis=0, ddof=1) / np.sqrt(len(grads))
    predicted, predicted_se = estimates.mean(axis=0), estimates.std(axis=0, ddof=1) / np.sqrt(len(estimates))
    upper = np.triu_indices(6)
    scale = np.sqrt(measured_se[upper] ** 2 + predicted_se[upper] ** 2)
    keep = scale > 0  # entries that vanish identically (null directions of a singular H) must agree exactly
    np.testing.assert_allclose(measured[upper][~keep], predicted[upper][~keep], atol=1e-12)
    z = (measured - predicted)[upper][keep] / scale[keep]
    assert np.abs(z).max() < scipy_stats.norm.isf(1e-3 / 2 / z.size)
    # Each batch estimate is positive semi-definite.
    assert np.linalg.eigvalsh(estimates).min() > -1e-10 * np.trace(predicted)


def test_risk_hessian_is_the_curvature_of_the_closed_form_risk():
    """vᵀ∇²R v against the second difference of the closed-form risk R itself (tested against Monte Carlo in
    test_gd_beta_closed_forms.py): R is a quartic, so the difference is exact up to O(h²) and round-off."""
    problem = GDBetaProblem.random(2, 6, seed=4, sigma2=0.3, beta_norm=1.0)
    theta = np.array([0.3, -0.4, 0.4, 0.1, -0.2, 0.6])
    hessian = cf.risk_hessian(problem, *cf.unpack_flow_state(theta, 2))
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-12)

    def risk(point):
        return float(cf.icl_risk(problem, *cf.unpack_flow_state(point, 2)))

    h = 1e-3
    for v in np.random.default_rng(3).normal(size=(4, 6)):
        second = (risk(theta + h * v) + risk(theta - h * v) - 2 * risk(theta)) / h**2
        assert v @ hessian @ v == pytest.approx(second, rel=1e-5, abs=1e-7)


# ---- SCB in the reduced coordinates (docs/scb.md §14) ----------------------------------------------------------
from attnflow.closed_forms import scb as scb_cf  # noqa: E402
from attnflow.closed_forms.scb import SCBProblem  # noqa: E402
from attnflow.dynamics import scb as scb_dyn  # noqa: E402


def test_scb_label_integrated_moments_match_the_kernels_per_sample_gradients():
    problem = SCBProblem.random(4, 6, 2, seed=7)
    V, Q = scb_cf.line_point(problem, 0.6, 0.2)
    contexts = scb_dyn.context_sample(problem, 60_000, seed=1)
    sums, squares = scb_cf.label_integrated_noise_sums(problem, contexts.tokens, contexts.last, V, Q)
    n = contexts.tokens.shape[0]
    predicted = sums / n
    predicted_se = np.sqrt((squares / n - predicted**2) / (n - 1))
    dir_V, dir_Q = problem.P - problem.mu[:, None], problem.Q_star - 1.0 / problem.T
    values = []
    for s in range(6000):
        g = scb_dyn.minibatch_gradients(problem, V, Q, 1, seed=s, raw=False)
        n_V, n_Q = scb_cf.mu_inner(problem, g["G_V"], dir_V), scb_cf.mu_inner(problem, g["G_Q"], dir_Q)
        values.append((scb_cf.mu_norm2(problem, g["G_V"]), scb_cf.mu_norm2(problem, g["G_Q"]), n_V, n_Q, n_V**2,
                       n_Q**2, n_V * n_Q))
    values = np.array(values)
    z = (values.mean(axis=0) - predicted) / np.hypot(values.std(axis=0, ddof=1) / np.sqrt(len(values)), predicted_se)
    assert np.abs(z).max() < scipy_stats.norm.isf(1e-3 / 2 / z.size)


def test_scb_band_without_noise_is_the_population_line_map_and_errors_follow_pythagoras():
    """Exact identities: at an infinite batch the band's mean is the line map of docs/scb.md §8.3 and e_V = e_Q = 0;
    a run's off-line errors from its records equal reduced_coordinates on its final state."""
    problem = SCBProblem.random(5, 8, 2, seed=3)
    contexts = scb_dyn.context_sample(problem, 320, seed=0)
    band = scb_dyn.stage1_noise_band(problem, 0.25, math.inf, 12, contexts, record_every=1)
    line = scb_dyn.line_trajectory(problem, 0.25 / problem.K_Q, 0.25 / problem.K_P, 12)
    np.testing.assert_allclose(band.alpha, line.states["alpha"], rtol=1e-10, atol=1e-14)
    assert band.e_V.max() < 1e-12 and band.e_Q.max() < 1e-12
    run = scb_dyn.run_stage1(problem, scb_dyn.StageSettings(7, 50, 0.25), seed=4, record_every=7)
    e_V, e_Q = scb_dyn.offline_errors(problem, run)
    final = scb_cf.reduced_coordinates(problem, run.final["V"], run.final["Q"])
    assert e_V[-1] == pytest.approx(final["e_V"], rel=1e-8, abs=1e-14)
    assert e_Q[-1] == pytest.approx(final["e_Q"], rel=1e-8, abs=1e-14)


def test_scb_noise_inputs_are_checked():
    problem = SCBProblem.random(4, 6, 2, seed=7)
    V, Q = problem.initial_point()
    with pytest.raises(ValueError, match="tokens"):
        scb_cf.label_integrated_noise_sums(problem, np.full((3, 6), 9), np.zeros(3, int), V, Q)
    with pytest.raises(ValueError, match="tokens"):
        scb_cf.label_integrated_noise_sums(problem, np.zeros((3, 5), int), np.zeros(3, int), V, Q)
    with pytest.raises(ValueError, match="batch"):
        scb_dyn.stage1_noise_band(problem, 0.25, 0, 3, scb_dyn.context_sample(problem, 64, seed=0))
