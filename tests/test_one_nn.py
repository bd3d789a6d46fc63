"""1-NN: the quadrature against brute-force Monte Carlo and exact special cases, the dynamics against the reference
trajectory of docs/one_nn.md §7, the shifted test set, and bad input."""
import math
import warnings

import numpy as np
import pytest

from attnflow.closed_forms import one_nn as cf
from attnflow.closed_forms.one_nn import OneNNProblem
from attnflow.dynamics import one_nn as dyn
from attnflow.dynamics.integrate import DivergenceError

from .conftest import assert_within_standard_errors


@pytest.mark.parametrize("kwargs, message", [
    (dict(d=1, N=4), "d must be >= 2"), (dict(d=3, N=0), "N must be >= 1"),
    (dict(d=3, N=4, sigma=-1.0), "sigma must be >= 0"), (dict(d=3, N=4, sigma=float("nan")), "sigma must be finite"),
    (dict(d=2.5, N=4), "d must be an integer"),
])
def test_bad_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OneNNProblem(**kwargs)


@pytest.mark.parametrize("call, message", [
    (lambda p: cf.reduced_loss(p, -1.0, 1.0), "xi1 must be >= 0"),
    (lambda p: cf.reduced_loss(p, 1.0, float("nan")), "xi2 must be a real number or"),
    (lambda p: cf.reduced_loss(p, 1.0, 1.0, rtol=0.0), "rtol must be > 0"),
    (lambda p: cf.reduced_loss_on_grid(p, 1.0, 1.0, grid=(4, 4)), "grid must be >= 16"),
    (lambda p: cf.gap_density_at_zero(2, 5), "d must be >= 3"),
    (lambda p: dyn.reduced_trajectory(p, -1.0, 10), "eta must be > 0"),
    (lambda p: dyn.full_gd_trajectory(p, 1.0, 10, 0, seed=0), "batch_size must be >= 1"),
    (lambda p: dyn.shifted_test_loss(p, 1.0, 1.0, 10, 2.5, seed=0), "delta must be < 2"),
    (lambda p: dyn.monte_carlo_loss(p, 1.0, math.inf, 10, seed=0), "xi2 must be finite"),
    (lambda p: dyn.monte_carlo_loss(p, float("nan"), 1.0, 10, seed=0), "xi1 must be finite"),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call(OneNNProblem(4, 8))


def test_t_density_integrates_to_one():
    from scipy.integrate import quad
    for d in (2, 3, 4, 10):
        assert quad(lambda t: cf.t_density(d, t), -1, 1)[0] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("d, N, xi1, xi2", [(4, 16, 3.0, 4.0), (4, 16, 40.0, 35.0), (2, 8, 30.0, 20.0),
                                            (8, 4, 10.0, 5.0), (3, 1, 5.0, 2.0)])
def test_quadrature_matches_brute_force_monte_carlo(d, N, xi1, xi2):
    problem = OneNNProblem(d, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        quad = cf.reduced_loss(problem, xi1, xi2, rtol=1e-4)
    mc = dyn.monte_carlo_loss(problem, xi1, xi2, 60_000, seed=5)
    for name, value, error in (("loss", quad.loss, quad.loss_error), ("d_xi1", quad.d_xi1, quad.gradient_error),
                               ("d_xi2", quad.d_xi2, quad.gradient_error)):
        assert_within_standard_errors(mc[name].mean, math.hypot(mc[name].standard_error, error), value)


@pytest.mark.parametrize("N, xi2", [(16, 10.0), (5, 0.5), (1, 2.0), (16, math.inf)])
def test_uniform_attention_at_xi1_zero_is_exact(N, xi2):
    """ξ₁ = 0: every context weight is 1/(N + a), so L = ½[(1 − S)² + (N − 1)S²] and ∂L/∂ξ₂ = −a²/(N + a)³.
    (At ξ₂ = ∞ this is docs/one_nn.md §5's special value (1 − 1/N)/2.) The quadrature must meet its requested accuracy."""
    a = math.exp(-xi2)
    S = 1 / (N + a)
    result = cf.reduced_loss(OneNNProblem(4, N), 0.0, xi2, rtol=1e-6)
    exact = 0.5 * ((1 - S) ** 2 + (N - 1) * S**2)
    assert abs(result.loss - exact) <= max(result.loss_error, 1e-6 * exact)
    assert abs(result.d_xi2 + a**2 / (N + a) ** 3) <= max(result.gradient_error, 1e-15)


def test_single_neighbour_with_masked_query_is_always_right():
    assert cf.reduced_loss_on_grid(OneNNProblem(4, 1), 7.0, math.inf)[0] == pytest.approx(0.0, abs=1e-12)


def test_gradient_matches_finite_differences_of_the_quadrature():
    """The loss is assembled from sign-definite terms and the gradient from its own formulas (docs/one_nn.md §6), so on
    a grid they agree up to the grid's error: a fine fixed grid keeps that below the tolerances."""
    problem = OneNNProblem(4, 16)
    grid = (1600, 960)
    _, g1, g2 = cf.reduced_loss_on_grid(problem, 12.0, 10.0, grid)
    h = 1e-4
    fd1 = (cf.reduced_loss_on_grid(problem, 12.0 + h, 10.0, grid)[0] - cf.reduced_loss_on_grid(problem, 12.0 - h, 10.0, grid)[0]) / (2 * h)
    fd2 = (cf.reduced_loss_on_grid(problem, 12.0, 10.0 + h, grid)[0] - cf.reduced_loss_on_grid(problem, 12.0, 10.0 - h, grid)[0]) / (2 * h)
    assert g1 == pytest.approx(fd1, rel=1e-5)
    assert g2 == pytest.approx(fd2, rel=1e-4)


def test_reference_constants():
    assert cf.asymptotic_loss_constant(4, 16) == pytest.approx(1.1130, abs=5e-5)  # docs/one_nn.md §7
    # docs/one_nn.md §6 quotes 0.09649 from a first fixed-grid quadrature (~1e-3 relative; converged: 0.0964838)
    assert cf.reduced_loss(OneNNProblem(4, 16), 12.0, 10.0).loss == pytest.approx(0.09649, rel=1e-3)


def test_unreachable_accuracy_warns_with_the_achieved_error():
    with pytest.warns(RuntimeWarning, match="reached relative errors"):
        result = cf.reduced_loss(OneNNProblem(4, 16), 60.0, 40.0, rtol=1e-12, max_grid=(1000, 600))
    assert np.isfinite(result.loss) and result.loss_error > 0


def test_reduced_gd_reproduces_the_reference_trajectory():
    """docs/one_nn.md §7: d = 4, N = 16, σ = 10, η = 200."""
    run = dyn.reduced_trajectory(OneNNProblem(4, 16, 10.0), 200.0, 300)
    at = {int(t): (a, b, c) for t, a, b, c in zip(run.times, run.states["xi1"], run.states["xi2"], run.metrics["loss"])}
    for step, (xi1, xi2, loss) in {5: (8.7, 10.0, 0.131), 20: (14.8, 10.9, 0.079), 100: (25.1, 18.2, 0.046),
                                   300: (35.8, 27.0, 0.032)}.items():
        assert at[step][0] == pytest.approx(xi1, abs=0.06)  # docs/one_nn.md §7 quotes one decimal
        assert at[step][1] == pytest.approx(xi2, abs=0.06)
        assert at[step][2] == pytest.approx(loss, abs=6e-4)


def test_gradient_flow_limit_agrees_with_small_step_gd():
    problem = OneNNProblem(4, 16, 10.0)
    gd = dyn.reduced_trajectory(problem, 2.0, 200, n_records=5)
    flow = dyn.flow_trajectory(problem, 2.0, 200, dt_steps=1.0)
    assert flow.states["xi1"][-1] == pytest.approx(gd.states["xi1"][-1], rel=2e-2)  # O(η) discretisation gap


def test_full_gd_is_reproducible_and_diverges_with_a_named_step():
    problem = OneNNProblem(4, 8, 2.0)
    a = dyn.full_gd_trajectory(problem, 1.0, 5, 64, seed=3)
    b = dyn.full_gd_trajectory(problem, 1.0, 5, 64, seed=3)
    np.testing.assert_array_equal(a.states["xi1"], b.states["xi1"])
    with pytest.raises(DivergenceError, match=r"diverged at step \d+"):
        dyn.full_gd_trajectory(problem, 1e14, 50, 64, seed=0)


def test_full_matrix_gradient_has_the_manifold_structure_in_expectation():
    """docs/one_nn.md §4: at diagonal W the gradient's W₁₁ block is a multiple of I, forbidden blocks vanish (z-tests)."""
    problem = OneNNProblem(3, 6)
    W = dyn.manifold_weight(3, 5.0, 2.0)
    _, grad = dyn.per_prompt_loss_and_gradient(dyn.sample_prompts(problem, 100_000, np.random.default_rng(1)), W)
    mean, se = grad.mean(axis=0), grad.std(axis=0, ddof=1) / np.sqrt(len(grad))
    forbidden = np.ones((5, 5), bool)
    forbidden[np.diag_indices(3)] = False
    forbidden[4, 4] = False
    forbidden[:, 3] = False  # the y-column: exactly zero gradient (h_q has 0 there)
    assert np.all(grad[:, :, 3] == 0)
    assert_within_standard_errors(mean[forbidden], se[forbidden], 0.0)


def test_shifted_prompts_have_the_margin():
    problem = OneNNProblem(4, 16)
    prompts, nearest = dyn.sample_shifted_prompts(problem, 2000, 0.1, np.random.default_rng(0))
    distances = 2 - 2 * np.einsum("njd,nd->nj", prompts.X, prompts.x_query)
    others = np.ones_like(distances, bool)
    others[np.arange(2000), nearest] = False
    assert np.all(distances[np.arange(2000), nearest] < 1e-12)
    assert distances[others].min() > 0.1 - 1e-12


def test_trajectory_warns_when_it_outruns_its_quadrature_grid():
    problem = OneNNProblem(4, 16, 10.0)
    with pytest.warns(RuntimeWarning, match="gradient error: use a finer grid"):
        coarse = cf.Resolution(theta_min=31, theta_per_xi1=0.0, dw=1.5)
        run = dyn.reduced_trajectory(problem, 2000.0, 60, resolution=coarse)  # large ξ₁ on a coarse fixed grid
    assert run.info["final_gradient_error"] > 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ok = dyn.reduced_trajectory(problem, 2000.0, 60)  # the same run at the default resolution
    assert ok.info["final_gradient_error"] < 0.01


def _sampled_t(d, n, N, seed):
    """t_j = <x_j, x_q> from raw samples on the sphere, shape (n, N)."""
    prompts = dyn.sample_prompts(OneNNProblem(d, N), n, np.random.default_rng(seed))
    return np.einsum("njd,nd->nj", prompts.X, prompts.x_query)


@pytest.mark.parametrize("d", [2, 3, 4, 9])
def test_t_density_matches_sampled_inner_products(d):
    """The CDF of t from the density (docs/one_nn.md §1) against the empirical CDF of raw sphere samples (binomial SE)."""
    from scipy.integrate import quad

    t = _sampled_t(d, 50_000, 4, d).ravel()
    for s in (-0.8, -0.3, 0.0, 0.4, 0.9):
        predicted = quad(lambda v: cf.t_density(d, v), -1, s)[0]
        hits = t < s
        assert_within_standard_errors(hits.mean(), hits.std(ddof=1) / np.sqrt(hits.size), predicted)


@pytest.mark.parametrize("d, N", [(4, 16), (3, 5)])
def test_gap_density_at_zero_matches_monte_carlo(d, N):
    """f_gap(0) (docs/one_nn.md §7) against raw samples: the density of t₍₁₎ − t₍₂₎ at 0 by the estimator
    (2·1{gap < ε} − ½·1{gap < 2ε})/ε, whose O(ε) bias cancels (Richardson); its SE comes from the samples."""
    t = np.sort(_sampled_t(d, 200_000, N, 11), axis=1)
    gap = t[:, -1] - t[:, -2]
    eps = 0.01
    values = (2.0 * (gap < eps) - 0.5 * (gap < 2 * eps)) / eps
    assert_within_standard_errors(values.mean(), values.std(ddof=1) / np.sqrt(values.size),
                                  cf.gap_density_at_zero(d, N))


@pytest.mark.parametrize("xi", [(3.0, 4.0), (40.0, 35.0), (100.0, 80.0)])
def test_dynamics_quadrature_keeps_its_documented_accuracy_at_large_xi1(xi):
    """The grid of the dynamics grows with ξ₁ (cf.Resolution): 1e-3 relative at ξ₁ = 100, where the former fixed
    300×180 grid was 5% off. Reference: the self-refining quadrature at rtol 1e-4 (itself checked against MC)."""
    problem = OneNNProblem(4, 16)
    loss, g1, g2 = cf.reduced_loss_adaptive(problem, *xi)
    reference = cf.reduced_loss(problem, *xi, rtol=1e-4)
    assert abs(loss - reference.loss) <= 2e-3 * reference.loss
    assert math.hypot(g1 - reference.d_xi1, g2 - reference.d_xi2) <= 2e-3 * np.linalg.norm(reference.gradient)


@pytest.mark.parametrize("N", [1, 2, 16, 64])
@pytest.mark.parametrize("xi", [(0.0, 10.0), (0.3, 3.0), (1.0, 10.0)])
def test_dynamics_quadrature_is_accurate_where_every_run_starts(N, xi):
    """Small ξ₁ (every reduced-GD run starts at ξ₁ = 0): with a λ spacing of 0.6 the kernel's ∂L/∂ξ₁ was off by
    5e-5 absolute (−5.05e-5 at N = 1, ξ = (0, 10), where the value is +2.06e-9), and with 151 θ nodes at N = 64 by
    1.3e-3 of ‖∇L‖. Reference: the self-refining quadrature at rtol 1e-8. Bound: the documented accuracy of
    cf.Resolution, 2e-5 of ‖∇L‖ at N <= 16 and 3e-5 at N = 64 (measured 2.5e-5; docs/one_nn.md §6), plus 1e-10 for
    gradients that are themselves ~1e-9."""
    problem = OneNNProblem(3, N)
    _, g1, g2 = cf.reduced_loss_adaptive(problem, *xi)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference may stop at its largest grid, still far finer
        reference = cf.reduced_loss(problem, *xi, rtol=1e-8)
    bound = (2e-5 if N <= 16 else 3e-5) * np.linalg.norm(reference.gradient) + 1e-10
    assert abs(g1 - reference.d_xi1) <= bound and abs(g2 - reference.d_xi2) <= bound


def test_the_reference_quadrature_stays_finite_when_every_weight_vanishes():
    """d = 3, N = 2 at ξ = (0, 10) on the 1997 × 1197 grid: once every e^{−λu} is 0 the node weights' sum, 1 up to an
    ulp, made log1p(−ψ) NaN; the refining quadrature then failed at rtol 1e-6."""
    values = cf.reduced_loss(OneNNProblem(3, 2), 0.0, 10.0, rtol=1e-7)
    assert values.d_xi1 == pytest.approx(-0.166662883, rel=1e-8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(theta_min=3), "theta_min must be >= 17"), (dict(theta_per_xi1=-1.0), "theta_per_xi1 must be >= 0"),
    (dict(dw=0.0), "dw must be > 0"), (dict(dw=5.0), "dw must be <= 2"),
])
def test_resolution_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cf.Resolution(**kwargs)


def test_degenerate_but_valid_points_get_their_limit_values_and_huge_grids_are_refused():
    problem = cf.OneNNProblem(3, 2, 5.0)
    near = cf.reduced_loss_adaptive(problem, 5.0, -700.0)
    for xi2 in (-710.0, -1e4):  # the query's weight e^{−ξ₂} overflows: L = ½ and ∇L = 0 to double precision
        assert cf.reduced_loss_adaptive(problem, 5.0, xi2) == (0.5, 0.0, 0.0)
        assert cf.reduced_loss_on_grid(problem, 0.0, xi2) == (0.5, 0.0, 0.0)
    # continuous with the limit: the loss to the λ-trapezoid's ~1e-5 (docs/one_nn.md §6), the gradient to 1e-300
    assert near[0] == pytest.approx(0.5, rel=1e-4) and abs(near[1]) < 1e-300 and abs(near[2]) < 1e-300
    with pytest.raises(ValueError, match=r"xi1 = 1e\+08 needs a quadrature grid .*MAX_THETA_NODES"):
        cf.reduced_loss_adaptive(problem, 1e8, 0.0)


def test_monte_carlo_moments_equal_those_of_the_prompts_themselves():
    """Mean, standard error and skewness from the running sums equal numpy/scipy on the same per-prompt values."""
    from scipy import stats as scipy_stats

    from attnflow import seeding

    problem = OneNNProblem(4, 16)
    mc = dyn.monte_carlo_loss(problem, 12.0, 10.0, 4000, seed=3, chunk=4000)
    (rng,) = seeding.generators(3, 1)
    loss, grad = dyn.per_prompt_loss_and_gradient(dyn.sample_prompts(problem, 4000, rng),
                                                  dyn.manifold_weight(4, 12.0, 10.0))
    values = {"loss": loss, "d_xi1": np.trace(grad[:, :4, :4], axis1=1, axis2=2), "d_xi2": -grad[:, 5, 5]}
    for name, v in values.items():
        assert mc[name].mean == pytest.approx(v.mean(), rel=1e-12)
        assert mc[name].standard_error == pytest.approx(v.std(ddof=1) / math.sqrt(v.size), rel=1e-9)
        assert mc[name].skewness == pytest.approx(scipy_stats.skew(v), rel=1e-6)


def test_skewed_points_get_enough_prompts_for_a_normal_mean():
    from attnflow.dynamics.montecarlo import MonteCarloMean
    from attnflow.validation import one_nn as claims

    mild = [MonteCarloMean(0.0, 1.0, 100, skewness=s) for s in (0.5, -2.0)]
    assert claims.prompts_for_normal_mean(mild, 30_000) == 30_000  # (2/0.1)² = 400 < 30 000
    heavy = [MonteCarloMean(0.0, 1.0, 100, skewness=-76.0)]
    assert claims.prompts_for_normal_mean(heavy, 30_000) == math.ceil((76 / claims.MAX_MEAN_SKEWNESS) ** 2)
    extreme = [MonteCarloMean(0.0, 1.0, 100, skewness=1e6)]
    assert claims.prompts_for_normal_mean(extreme, 30_000) == claims.MAX_PROMPTS


@pytest.mark.parametrize("xi", [(8.7, 10.0), (25.1, 18.2), (35.8, 27.0), (113.0, 95.0), (200.0, 168.0), (200.0, math.inf)])
def test_dynamics_gradient_within_1e_3_of_the_refining_reference_along_the_path_and_at_xi1_200(xi):
    """The v-grid quadrature of the dynamics (docs/one_nn.md §6) against the independent self-refining θ × λ
    quadrature at rtol 1e-5: points of the reference trajectory of docs/one_nn.md §7, the end of a 10⁴-step run
    (ξ₁ ≈ 113) and ξ₁ = 200 with the query partly and fully masked."""
    problem = OneNNProblem(4, 16, 10.0)
    loss, g1, g2 = cf.reduced_loss_adaptive(problem, *xi)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        reference = cf.reduced_loss(problem, *xi, rtol=1e-5)
    assert abs(loss - reference.loss) <= 1e-3 * reference.loss
    assert math.hypot(g1 - reference.d_xi1, g2 - reference.d_xi2) <= 1e-3 * np.linalg.norm(reference.gradient)


def test_loss_is_positive_and_right_at_large_xi_with_a_masked_query_for_one_neighbour():
    """N = 1: S_{i*} = u/(a + u), so L = ½E[(a/(a + u))²] = ½∫ p_d(t) σ(−ξ₂ − ξ₁(t − 1))² dt exactly — a
    one-dimensional integral (scipy) independent of the quadratures. At (ξ₁, ξ₂) = (200, 400) the loss was negative
    before (u², u³ underflowed in the λ-transforms, docs/one_nn.md §6)."""
    from scipy import integrate, special

    d, xi1, xi2 = 3, 200.0, 400.0
    exact = integrate.quad(lambda t: 0.5 * cf.t_density(d, t) * special.expit(-xi2 - xi1 * (t - 1.0)) ** 2, -1.0,
                           -0.9, epsabs=0.0, epsrel=1e-10, limit=200)[0]
    exact += integrate.quad(lambda t: 0.5 * cf.t_density(d, t) * special.expit(-xi2 - xi1 * (t - 1.0)) ** 2, -0.9,
                            1.0, epsabs=0.0, epsrel=1e-10, limit=200)[0]
    problem = OneNNProblem(d, 1)
    assert cf.reduced_loss_adaptive(problem, xi1, xi2)[0] == pytest.approx(exact, rel=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert cf.reduced_loss(problem, xi1, xi2, rtol=1e-4).loss == pytest.approx(exact, rel=1e-3)


def test_loss_at_large_xi_with_two_neighbours_matches_monte_carlo():
    """(d, N) = (2, 2) at (200, 400), where the loss came out negative before: both quadratures against brute-force
    Monte Carlo of the raw model (4 standard errors)."""
    problem = OneNNProblem(2, 2)
    mc = dyn.monte_carlo_loss(problem, 200.0, 400.0, 400_000, seed=2)
    assert_within_standard_errors(mc["loss"].mean, mc["loss"].standard_error,
                                  cf.reduced_loss_adaptive(problem, 200.0, 400.0)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        reference = cf.reduced_loss(problem, 200.0, 400.0, rtol=1e-4)
    assert reference.loss > 0
    assert_within_standard_errors(mc["loss"].mean, mc["loss"].standard_error, reference.loss)


def test_the_masked_query_loss_resolves_large_xi1_beyond_the_default_largest_grid():
    """At ξ₁ = 100 the default largest grid (7985 × 4785) leaves a relative error of 5.7e-5; one_nn.asymptotic_constant
    multiplies it by ξ₁, and at --full (ξ₁ up to 200) its error bars swallowed the increments they bound, a FAIL.
    The claim's quadrature doubles the grid per doubling of ξ₁ beyond 50, which quarters the second-order error."""
    from attnflow.validation.one_nn import masked_query_loss

    problem = OneNNProblem(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # neither meets rtol 1e-5 exactly; the sizes are the point
        default = cf.reduced_loss(problem, 100.0, math.inf, rtol=1e-5)
        grown = masked_query_loss(problem, 100.0)
    assert default.grid == (7985, 4785) and grown.grid[0] > default.grid[0]
    assert grown.loss_error / grown.loss < 2e-5 < default.loss_error / default.loss
    assert abs(grown.loss - default.loss) < 3 * default.loss_error  # the same value, known more precisely
