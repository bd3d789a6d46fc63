"""1-NN numerics: prompt sampling, brute-force Monte Carlo of the loss and gradient, reduced GD on (ξ₁, ξ₂),
full-matrix GD on W with fresh minibatches, and test loss under distribution shift.

The mathematics (the quadrature of L and ∇L) lives in :mod:`attnflow.closed_forms.one_nn`.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from numba import njit

from attnflow.closed_forms import one_nn as cf
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.one_nn import OneNNProblem

from .integrate import DivergenceError, iterate_map, rk4_loop, solve_rk4
from attnflow.seeding import SeedLike, generators
from attnflow.closed_forms.parameters import Parameter, takes_options

from . import progress
from .montecarlo import MAX_RECORDS, MAX_SAMPLES, MonteCarloMean, Trajectory, check_batch_size, check_count, check_run_length, log_grid

__all__ = ["POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "Prompts", "sample_prompts", "token_matrices", "manifold_weight", "per_prompt_loss_and_gradient",
           "monte_carlo_loss", "reduced_trajectory", "flow_trajectory", "full_gd_trajectory",
           "sample_shifted_prompts", "shifted_test_loss", "population", "minibatch"]


@dataclass(frozen=True)
class Prompts:
    """n prompts: X (n, N, d) on the sphere, x_query (n, d), labels y (n, N)."""

    X: np.ndarray
    x_query: np.ndarray
    y: np.ndarray


def _sphere(rng, shape):
    g = rng.standard_normal(shape)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def sample_prompts(problem: OneNNProblem, n: int, rng: np.random.Generator) -> Prompts:
    """x_j, x_q uniform on S^{d−1}; labels i.i.d. Rademacher (docs/one_nn.md §1 default)."""
    n = check_count(n, "n")
    X = _sphere(rng, (n, problem.N, problem.d))
    x_query = _sphere(rng, (n, problem.d))
    y = rng.choice(np.array([-1.0, 1.0]), size=(n, problem.N))
    return Prompts(X=X, x_query=x_query, y=y)


def token_matrices(prompts: Prompts) -> np.ndarray:
    """H = [[x_1 … x_N, x_q], [y_1 … y_N, 0], [0 … 0, 1]] ∈ R^{(d+2)×(N+1)} per prompt (docs/one_nn.md §2)."""
    n, N, d = prompts.X.shape
    H = np.zeros((n, d + 2, N + 1))
    H[:, :d, :N] = np.swapaxes(prompts.X, 1, 2)
    H[:, d, :N] = prompts.y
    H[:, :d, N] = prompts.x_query
    H[:, d + 1, N] = 1.0
    return H


def manifold_weight(d: int, xi1: float, xi2: float) -> np.ndarray:
    """W = diag(ξ₁ I_d, 0, −ξ₂) (docs/one_nn.md §4). Finite values only: the raw model multiplies W by zeros."""
    d = check.integer(d, "d", minimum=1)
    # a 0-d array (one entry of a recorded trajectory) is a number too
    xi1, xi2 = (check.real(x.item() if isinstance(x, np.ndarray) and x.ndim == 0 else x, name)
                for x, name in ((xi1, "xi1"), (xi2, "xi2")))
    return np.diag(np.concatenate([np.full(d, xi1), [0.0, -xi2]]))


def per_prompt_loss_and_gradient(prompts: Prompts, W: np.ndarray):
    """Raw definitions (docs/one_nn.md §2-3): logits z = HᵀWh_q over all N+1 columns, S = softmax(z), f = [y, 0]·S,
    loss = ½(f − y_{i*})², and ∂loss/∂W = Σ_m g_m h_m h_qᵀ with g_m = (f − y_{i*}) S_m (y_m − f), y_q = 0.

    Returns (loss (n,), gradient (n, d+2, d+2)).
    """
    H = token_matrices(prompts)
    h_q = H[:, :, -1]
    z = np.einsum("nkm,kl,nl->nm", H, W, h_q)
    z -= z.max(axis=1, keepdims=True)  # log-sum-exp shift
    S = np.exp(z)
    S /= S.sum(axis=1, keepdims=True)
    values = np.concatenate([prompts.y, np.zeros((len(prompts.y), 1))], axis=1)
    f = np.einsum("nm,nm->n", S, values)
    nearest = np.argmax(np.einsum("njd,nd->nj", prompts.X, prompts.x_query), axis=1)
    target = prompts.y[np.arange(len(nearest)), nearest]
    residual = f - target
    g = residual[:, None] * S * (values - f[:, None])
    gradient = np.einsum("nm,nkm,nl->nkl", g, H, h_q)
    return 0.5 * residual**2, gradient


def monte_carlo_loss(problem: OneNNProblem, xi1: float, xi2: float, n: int, *, seed: SeedLike,
                     chunk: int = 20_000) -> dict[str, MonteCarloMean]:
    """Brute-force MC of L, ∂L/∂ξ₁ = tr(∂L/∂W₁₁) and ∂L/∂ξ₂ = −∂L/∂W₃₃ at W = diag(ξ₁I, 0, −ξ₂) (docs/one_nn.md §4)."""
    n = check.integer(n, "n", minimum=2)
    if n > MAX_SAMPLES:
        raise ValueError(f"n must be <= {MAX_SAMPLES:.0e} samples, got {n}")
    d = problem.d
    W = manifold_weight(d, xi1, xi2)
    powers = np.zeros((3, 3))  # sums of values, squares and cubes of the three quantities
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    for rng, size in zip(generators(seed, len(sizes)), sizes):
        loss, grad = per_prompt_loss_and_gradient(sample_prompts(problem, size, rng), W)
        values = np.stack([loss, np.trace(grad[:, :d, :d], axis1=1, axis2=2), -grad[:, d + 1, d + 1]])
        powers += np.stack([values.sum(axis=1), (values**2).sum(axis=1), (values**3).sum(axis=1)])
    means, second, third = powers / n
    variances = np.maximum(second - means**2, 0.0)
    ses = np.sqrt(variances * n / (n - 1) / n)
    # Skewness of one prompt's value: at large ξ the gradient comes from rare prompts, and the mean of a few
    # thousand is far from normal (docs/one_nn.md §10).
    central_third = third - 3 * means * second + 2 * means**3
    skews = [float(c / v**1.5) if v > 0 else 0.0 for c, v in zip(central_third, variances)]
    return {name: MonteCarloMean(float(m), float(s), n, skew)
            for name, m, s, skew in zip(("loss", "d_xi1", "d_xi2"), means, ses, skews)}


# ==================================================================================================
# Reduced dynamics on (ξ₁, ξ₂) through the integrator engine
# ==================================================================================================


@njit(cache=True)
def _reduced_flow_rk4(y0, t0, dt, n_steps, record_steps, params, blowup):
    return rk4_loop(cf.reduced_flow_rhs, y0, t0, dt, n_steps, record_steps, params, blowup)


# Relative gradient error of the dynamics quadrature above which a trajectory warns (see cf.Resolution).
GRID_ERROR_WARNING = 0.01


def _warn_if_grid_too_coarse(problem, states, resolution) -> float:
    """Compare the dynamics' gradient at the last state with the refined quadrature; warn above 1%.

    The quadrature's cost and error grow with ξ₁ (docs/one_nn.md), and the last state has the largest ξ₁.
    """
    xi1, xi2 = states[-1]
    _, g1, g2 = cf.reduced_loss_adaptive(problem, xi1, xi2, resolution)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        refined = cf.reduced_loss(problem, xi1, xi2, rtol=1e-3)
    error = math.hypot(g1 - refined.d_xi1, g2 - refined.d_xi2) / max(math.hypot(refined.d_xi1, refined.d_xi2), 1e-300)
    if error > GRID_ERROR_WARNING:
        warnings.warn(f"the trajectory reached (xi1, xi2) = ({xi1:.4g}, {xi2:.4g}), where the quadrature resolution "
                      f"{resolution} has a {error:.1%} gradient error: use a finer grid", RuntimeWarning, stacklevel=3)
    return error


def _with_losses(problem, times, states, resolution, info):
    below = np.flatnonzero(states[:, 0] < 0)
    if below.size:  # e.g. σ = 0, N = 1: ∂L/∂ξ₁ > 0 at ξ₁ = 0, so descent leaves the reduced loss's domain at once
        raise DivergenceError(f"the reduced dynamics left ξ₁ >= 0, where the reduced loss is defined (docs/one_nn.md "
                              f"§4), by step {times[below[0]]:g} (ξ₁ = {states[below[0], 0]:.3g}): at this problem "
                              f"(N = {problem.N}, σ = {problem.sigma:g}) descent moves ξ₁ below 0")
    info["final_gradient_error"] = _warn_if_grid_too_coarse(problem, states, resolution)
    values = np.array([cf.reduced_loss_adaptive(problem, x1, x2, resolution) for x1, x2 in states])
    return Trajectory(times=times, states=dict(xi1=states[:, 0], xi2=states[:, 1]),
                      metrics=dict(loss=values[:, 0], d_xi1=values[:, 1], d_xi2=values[:, 2]), info=info)


def reduced_trajectory(problem: OneNNProblem, eta: float, steps: int, *, n_records: int = 100,
                       resolution: cf.Resolution = cf.DYNAMICS_RESOLUTION) -> Trajectory:
    """Reduced GD (docs/one_nn.md §4) from (ξ₁, ξ₂) = (0, σ) for ``steps`` steps of size η, recorded at ``n_records``
    log-spaced steps; the loss and gradient at the recorded points come from the same quadrature, whose grid
    grows with ξ₁ (:class:`attnflow.closed_forms.one_nn.Resolution`)."""
    steps, n_records = check_run_length(steps, n_records, min_records=2)
    record = log_grid(steps, n_records)
    sol = iterate_map(cf.reduced_gd_step, [0.0, problem.sigma], steps,
                      cf.pack_reduced_params(problem, eta, resolution), record_steps=record)
    return _with_losses(problem, sol.t, sol.y, resolution, dict(eta=eta, resolution=resolution))


def flow_trajectory(problem: OneNNProblem, eta: float, steps: int, *, dt_steps: float = 0.5, n_records: int = 50,
                    resolution: cf.Resolution = cf.DYNAMICS_RESOLUTION) -> Trajectory:
    """The gradient-flow limit of reduced GD (RK4 in τ = ηk, step ``dt_steps`` GD steps), on the GD step axis."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    steps, n_records = check_run_length(steps, n_records, min_records=2)
    n = max(1, int(round(steps / dt_steps)))
    if not eta * steps / n > 0:
        raise ValueError(f"eta = {eta:g} is too small: the flow's time step η·{steps}/{n} underflows to 0")
    sol = solve_rk4(cf.reduced_flow_rhs, [0.0, problem.sigma], (0.0, eta * steps), eta * steps / n,
                    cf.pack_reduced_params(problem, eta, resolution), record_every=max(1, n // n_records),
                    loop=_reduced_flow_rk4)
    return _with_losses(problem, sol.t / eta, sol.y, resolution, dict(eta=eta, resolution=resolution))


# ==================================================================================================
# Full-matrix GD on W with fresh Monte-Carlo minibatches
# ==================================================================================================


def _manifold_projection(W: np.ndarray, d: int) -> np.ndarray:
    return manifold_weight(d, np.trace(W[:d, :d]) / d, -W[d + 1, d + 1])


def full_gd_trajectory(problem: OneNNProblem, eta: float, steps: int, batch_size: int, *, seed: SeedLike,
                       n_records: int = 50) -> Trajectory:
    """GD on the full W ∈ R^{(d+2)×(d+2)} from diag(0, …, 0, −σ), each step on a fresh batch of prompts.

    Records ξ₁ = tr(W₁₁)/d, ξ₂ = −W₃₃, the distance from the manifold ‖W − P(W)‖_F (P: projection onto
    diag(ξ₁I, 0, −ξ₂)) and the label→indicator entry W[d, d+1] whose instability docs/one_nn.md §4 describes;
    ``final["W"]`` is the last W. Raises DivergenceError naming the step if W stops being finite.
    """
    d = problem.d
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    steps, n_records = check_run_length(steps, n_records, min_records=2)
    batch_size = check_batch_size(batch_size)
    (rng,) = generators(seed, 1)
    W = manifold_weight(d, 0.0, problem.sigma)
    record = set(np.linspace(0, steps, n_records + 1).round().astype(int).tolist())
    times, xi1, xi2, off, label_entry, losses = [], [], [], [], [], []
    for step in range(steps + 1):
        progress.report(step, steps)
        loss, grad = per_prompt_loss_and_gradient(sample_prompts(problem, batch_size, rng), W)
        if step in record:
            times.append(step)
            xi1.append(np.trace(W[:d, :d]) / d)
            xi2.append(-W[d + 1, d + 1])
            off.append(np.linalg.norm(W - _manifold_projection(W, d)))
            label_entry.append(W[d, d + 1])
            losses.append(loss.mean())
        if step == steps:
            break
        W = W - eta * grad.mean(axis=0)
        if not np.all(np.isfinite(W)) or np.abs(W).max() > 1e12:
            raise DivergenceError(f"diverged at step {step + 1}: W is no longer finite (lower eta={eta})")
    return Trajectory(times=np.array(times, float), states=dict(xi1=np.array(xi1), xi2=np.array(xi2)),
                      metrics=dict(off_manifold=np.array(off), label_indicator=np.array(label_entry),
                                   batch_loss=np.array(losses)),
                      final=dict(W=W), info=dict(eta=eta, batch_size=batch_size))


# ==================================================================================================
# Distribution shift (docs/one_nn.md §8-9)
# ==================================================================================================


def sample_shifted_prompts(problem: OneNNProblem, n: int, delta: float, rng) -> tuple[Prompts, np.ndarray]:
    """The shifted test recipe of docs/one_nn.md §9: x_i uniform, y_i ~ N(0, 1); i* uniform in [N], x_q = x_{i*}; every
    other x_j with ‖x_j − x_q‖² <= δ is replaced by −x_j, so all of them satisfy the margin
    ‖x_j − x_q‖² >= ‖x_{i*} − x_q‖² + δ. Returns the prompts and i*."""
    n = check_count(n, "n")
    delta = check.real(delta, "delta", minimum=0.0, strict=True)
    if delta >= 2.0:
        raise ValueError(f"delta must be < 2 (the flip only guarantees ||x_j - x_q||^2 >= 2), got {delta}")
    X = _sphere(rng, (n, problem.N, problem.d))
    nearest = rng.integers(0, problem.N, size=n)
    x_query = X[np.arange(n), nearest].copy()
    t = np.einsum("njd,nd->nj", X, x_query)
    too_close = (2 - 2 * t <= delta)
    too_close[np.arange(n), nearest] = False
    X[too_close] *= -1
    return Prompts(X=X, x_query=x_query, y=rng.standard_normal((n, problem.N))), nearest


def shifted_test_loss(problem: OneNNProblem, xi1: float, xi2: float, n: int, delta: float, *, seed: SeedLike):
    """Test loss ½E(f − y_{i*})² on shifted prompts at W = diag(ξ₁I, 0, −ξ₂), and the mean of the per-prompt
    mechanism bound ½(e^{−ξ₁δ/2} Σ_{j≠i*}|y_j − y_{i*}| + e^{−ξ₂}|y_{i*}|)² (docs/one_nn.md §8: S_j/S_{i*} <= e^{−ξ₁δ/2}
    for j ≠ i*, S_q/S_{i*} = e^{−ξ₂}). Returns (loss, bound) as MonteCarloMeans."""
    n = check.integer(n, "n", minimum=2)  # a standard error needs two prompts
    (rng,) = generators(seed, 1)
    prompts, nearest = sample_shifted_prompts(problem, n, delta, rng)
    loss, _ = per_prompt_loss_and_gradient(prompts, manifold_weight(problem.d, xi1, xi2))
    # per_prompt_loss_and_gradient targets argmax t_j, which is i* here (t_{i*} = 1 > others by the margin).
    y_star = prompts.y[np.arange(n), nearest]
    spread = np.abs(prompts.y - y_star[:, None]).sum(axis=1)
    bound = 0.5 * (np.exp(-xi1 * delta / 2) * spread + np.exp(-xi2) * np.abs(y_star)) ** 2

    def mean(values):
        return MonteCarloMean(float(values.mean()), float(values.std(ddof=1) / np.sqrt(n)), n)

    return mean(loss), mean(bound)


# ==================================================================================================
# The System contract: population(problem, **options) and minibatch(problem, *, seed, **options)
# ==================================================================================================


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("eta", "real", 200.0, "GD step size η", minimum=0.0, strict=True),
    Parameter("steps", "integer", 300, "GD steps", minimum=1, maximum=10_000_000),
    Parameter("n_records", "integer", 100, "recorded steps (log-spaced)", minimum=2, maximum=MAX_RECORDS),
)
MINIBATCH_OPTIONS = (
    Parameter("eta", "real", 1.5, "GD step size η", minimum=0.0, strict=True),
    Parameter("steps", "integer", 60, "GD steps", minimum=1, maximum=10_000_000),
    Parameter("batch_size", "integer", 256, "fresh prompts per step", minimum=1, maximum=1_000_000),
    Parameter("n_records", "integer", 50, "recorded steps", minimum=2, maximum=MAX_RECORDS),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: OneNNProblem, *, eta: float, steps: int, n_records: int) -> Trajectory:
    """Reduced GD on (ξ₁, ξ₂) with quadrature expectations: :func:`reduced_trajectory`."""
    return reduced_trajectory(problem, eta, steps, n_records=n_records)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: OneNNProblem, *, seed: SeedLike, eta: float, steps: int, batch_size: int,
              n_records: int) -> Trajectory:
    """GD on the full W with a fresh batch of prompts per step: :func:`full_gd_trajectory`."""
    return full_gd_trajectory(problem, eta, steps, batch_size, seed=seed, n_records=n_records)
