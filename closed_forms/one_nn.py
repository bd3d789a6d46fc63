"""One-layer softmax attention learning one-nearest-neighbour in context.

Paper: Z. Li, Y. Cao, C. Gao, Y. He, H. Liu, J. M. Klusowski, J. Fan, M. Wang, *One-Layer Transformer Provably
Learns One-Nearest Neighbor In Context*, NeurIPS 2024, arXiv:2411.10830. "spec §k" refers to
``shared/theory/one_nn.md``.

Data (spec §1): x₁…x_N, x_q uniform on S^{d−1}, labels ±1 with E[y_i y_j | x] = δ_ij and sign symmetry; the
target is the label of the nearest neighbour i* = argmax_j t_j, t_j = <x_j, x_q>. The model (spec §2) predicts
f = [y, 0]·softmax(HᵀWh_q). Gradient descent from W = diag(0, …, 0, −σ) stays on W = diag(ξ₁I_d, 0, −ξ₂)
(spec §4), where the context logits are ξ₁t_j and the query's is ξ₁ − ξ₂ (shifted: ξ₁(t_j − 1) and −ξ₂).

The population loss L(ξ₁, ξ₂) = ½E[(1 − S_{i*})² + Σ_{j≠i*} S_j²] is an N-dimensional expectation; spec §6 reduces
it and its gradient to one- and two-dimensional integrals over t = cos θ and a Laplace variable λ, computed here
by quadrature (:func:`reduced_loss`).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy import integrate, special
from scipy import stats as scipy_stats

from . import validation as check

__all__ = ["OneNNProblem", "t_density", "ReducedLoss", "reduced_loss", "reduced_loss_on_grid",
           "reduced_gd_step", "reduced_flow_rhs", "pack_reduced_params", "gap_density_at_zero",
           "asymptotic_loss_constant", "DEFAULT_GRID", "DYNAMICS_GRID"]

# (n_theta, n_lambda) to start refining from: ~1e-3 relative error for ξ₁ <= 40 (spec §6).
DEFAULT_GRID = (500, 300)
# Fixed grid of the reduced dynamics, one quadrature per step (~1.5 ms). Relative error of L and ∇L against
# rtol-1e-7 references (d = 4, N = 16): 1e-4 at ξ = (3, 4), 7e-4 at (12, 10), 7e-3 at (40, 35), but 5% at
# (100, 80): the θ grid does not resolve the nearest-neighbour scale at large ξ₁. Runs that reach ξ₁ >> 40
# need a finer grid (or reduced_loss with refinement); see docs/one_nn.md.
DYNAMICS_GRID = (300, 180)
_MAX_GRID = (8000, 2400)


@dataclass(frozen=True)
class OneNNProblem:
    """d >= 2 (sphere S^{d−1}), context length N >= 1, initial query mask σ >= 0 (W⁽⁰⁾ = diag(0, …, 0, −σ))."""

    d: int
    N: int
    sigma: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "d", check.integer(self.d, "d", minimum=2))
        object.__setattr__(self, "N", check.integer(self.N, "N", minimum=1))
        object.__setattr__(self, "sigma", check.real(self.sigma, "sigma", minimum=0.0))


def _log_B(d: int) -> float:
    """log B_d, B_d = √π Γ((d−1)/2) / Γ(d/2), the normaliser of sin^{d−2}θ on [0, π]."""
    return 0.5 * math.log(math.pi) + math.lgamma((d - 1) / 2) - math.lgamma(d / 2)


def t_density(d: int, t) -> np.ndarray:
    """Density of t = <x, x_q> on [−1, 1] (spec §1): Γ(d/2)/(√π Γ((d−1)/2)) (1 − t²)^{(d−3)/2}."""
    d = check.integer(d, "d", minimum=2)
    t = np.asarray(t, float)
    with np.errstate(divide="ignore"):
        return np.where(np.abs(t) < 1, np.exp(-_log_B(d) + (d - 3) / 2 * np.log1p(-t * t)), 0.0)


# ==================================================================================================
# The quadrature kernel (spec §6)
# ==================================================================================================


@njit(cache=True)
def _theta_grid(d, log_B, n_theta):
    """Nodes t_k = cos θ_k, θ_k = π x_k^{1.5} (dense near t = 1, spec §6) and trapezoid weights in x times the
    density, normalised to sum to 1 so the discrete law is exactly a probability."""
    t = np.empty(n_theta)
    w = np.empty(n_theta)
    h = 1.0 / (n_theta - 1)
    total = 0.0
    for k in range(n_theta):
        x = k * h
        theta = math.pi * x**1.5
        jacobian = 1.5 * math.pi * math.sqrt(x)
        s = math.sin(theta)
        density = math.exp((d - 2) * math.log(s) - log_B) if s > 0 else (1.0 / math.pi if d == 2 else 0.0)
        weight = h * jacobian * density
        if k == 0 or k == n_theta - 1:
            weight *= 0.5
        t[k] = math.cos(theta)
        w[k] = weight
        total += weight
    for k in range(n_theta):
        w[k] /= total
    return t, w


_LOG2 = math.log(2.0)


@njit(cache=True)
def _signed_exp(log_magnitude, factor):
    """factor·exp(log_magnitude) computed as sign(factor)·exp(log_magnitude + log|factor|): no inf·0."""
    if factor == 0.0:
        return 0.0
    value = math.exp(log_magnitude + math.log(abs(factor)))
    return value if factor > 0.0 else -value


@njit(cache=True)
def _quadrature(xi1, xi2, d, log_B, N, n_theta, n_lam):
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) at (ξ₁, ξ₂) by the formulas of spec §6 (ξ₂ = inf allowed: the query fully masked).

    With u = exp(ξ₁(t − 1)), r = t − 1, a = exp(−ξ₂), Z' = a + Σu_j, and 1/Z'^m = ∫ λ^{m−1}/(m−1)! e^{−λZ'} dλ:
      L       = ½ − Max[u;1] + ½ Sum[u²;2]
      ∂L/∂ξ₂  = −a Max[u;2] + a Sum[u²;3]
      ∂L/∂ξ₁  = Max[u²r;2] + MaxPair[u, ur;2] + Sum[u²r;2] − Sum[u³r;3] − Pair[u², ur;3] − Max[ur;1]
    Sum/Pair factorise over the i.i.d. t_j; Max/MaxPair condition on the nearest neighbour's value s = t_{i*}
    (the others i.i.d. below s). λ = e^w on a uniform w grid; every λ-integrand is assembled in log space.
    """
    t, w = _theta_grid(d, log_B, n_theta)
    u = np.exp(xi1 * (t - 1.0))
    log_wu = np.empty(n_theta)  # log(w_k u_k), once per call: the Max terms are assembled in log space
    for k in range(n_theta):
        log_wu[k] = math.log(w[k]) + xi1 * (t[k] - 1.0) if w[k] > 0.0 else -np.inf
    r = t - 1.0
    a = math.exp(-xi2) if np.isfinite(xi2) else 0.0
    # Lower cut-off: the m = 1 integrands vanish only like λ, so a cut-off at ε/(a + N) loses a relative ~ε of
    # them (spec §6 used ε = 1e-5, a 1e-5 bias invisible to grid refinement); ε = 1e-14 is below round-off.
    w_lo = math.log(1e-14 / (a + N))
    w_hi = math.log(80.0 / (a + N * math.exp(-2.0 * xi1)))
    dw = (w_hi - w_lo) / (n_lam - 1)
    # Accumulators: Max[u;1], Max[u;2], Max[u²r;2], Max[ur;1], MaxPair[u,ur;2], Sum[u²;2], Sum[u²;3],
    # Sum[u²r;2], Sum[u³r;3], Pair[u²,ur;3].
    acc = np.zeros(10)
    expm = np.empty(n_theta)  # 1 − e^{−λu}
    tail_psi = np.empty(n_theta)  # E[(1 − e^{−λu}) 1{t < s_k}] (cumulative trapezoid, half weight at k)
    tail_ur = np.empty(n_theta)  # E[u r e^{−λu} 1{t < s_k}]
    tail_F = np.empty(n_theta)  # P(t < s_k)
    for i in range(n_lam):
        wi = w_lo + i * dw
        lam = math.exp(wi)
        quad_w = dw * (0.5 if i == 0 or i == n_lam - 1 else 1.0)
        psi = 0.0
        Phi_u2 = 0.0
        Phi_u2r = 0.0
        Phi_u3r = 0.0
        Phi_ur = 0.0
        for k in range(n_theta):
            expm[k] = -math.expm1(-lam * u[k])  # 1 − e^{−λu}, accurate when λu is small
            e = 1.0 - expm[k]
            psi += w[k] * expm[k]
            Phi_u2 += w[k] * u[k] * u[k] * e
            Phi_u2r += w[k] * u[k] * u[k] * r[k] * e
            Phi_u3r += w[k] * u[k] * u[k] * u[k] * r[k] * e
            Phi_ur += w[k] * u[k] * r[k] * e
        log_phi = math.log1p(-psi) if psi < 1.0 else -np.inf
        # --- Sum and Pair terms: N ∫ K_m e^{−λa} Φ_h φ^{N−1} dλ, N(N−1) ∫ K_m e^{−λa} Φ_h Φ_g φ^{N−2} dλ,
        # each assembled as sign·exp(m·w − λa + (N−1)log φ + log|Φ|): λ^m alone overflows at large ξ.
        base = -lam * a + (N - 1) * log_phi if N > 1 else -lam * a
        acc[5] += quad_w * N * _signed_exp(2.0 * wi + base, Phi_u2)
        acc[6] += quad_w * N * _signed_exp(3.0 * wi + base - _LOG2, Phi_u2)
        acc[7] += quad_w * N * _signed_exp(2.0 * wi + base, Phi_u2r)
        acc[8] += quad_w * N * _signed_exp(3.0 * wi + base - _LOG2, Phi_u3r)
        if N > 1 and log_phi > -np.inf and Phi_u2 != 0.0:
            acc[9] += quad_w * N * (N - 1) * _signed_exp(3.0 * wi + base - _LOG2 - log_phi + math.log(Phi_u2), Phi_ur)
        # --- Max and MaxPair terms: cumulative sums over t < s_k, i.e. over θ-nodes beyond k
        run_psi = 0.0
        run_ur = 0.0
        run_F = 0.0
        for k in range(n_theta - 1, -1, -1):
            tail_psi[k] = run_psi + 0.5 * w[k] * expm[k]
            tail_ur[k] = run_ur + 0.5 * w[k] * u[k] * r[k] * (1.0 - expm[k])
            tail_F[k] = run_F + 0.5 * w[k]
            run_psi += w[k] * expm[k]
            run_ur += w[k] * u[k] * r[k] * (1.0 - expm[k])
            run_F += w[k]
        for k in range(n_theta):
            if w[k] == 0.0:
                continue
            phi_s = tail_F[k] - tail_psi[k]
            if N > 1 and phi_s <= 0.0:
                continue
            log_term = -lam * (a + u[k])
            if N > 1:
                log_term += (N - 1) * math.log(phi_s)
            if log_wu[k] == -np.inf:
                continue  # every Max term carries a factor w_k u(s_k)
            log_term += log_wu[k]
            k1 = math.exp(wi + log_term)  # m = 1, times w_k u_k
            k2s = k1 * lam  # m = 2 (k1 <= ~e^{ξ₂}, so this stays finite for ξ₂ below ~350)
            acc[0] += quad_w * N * k1
            acc[1] += quad_w * N * k2s
            acc[2] += quad_w * N * u[k] * r[k] * k2s
            acc[3] += quad_w * N * r[k] * k1
            if N > 1:
                acc[4] += quad_w * N * (N - 1) * _signed_exp(2.0 * wi + log_term - math.log(phi_s), tail_ur[k])
    loss = 0.5 - acc[0] + 0.5 * acc[5]
    d_xi2 = -a * acc[1] + a * acc[6]
    d_xi1 = acc[2] + acc[4] + acc[7] - acc[8] - acc[9] - acc[3]
    return loss, d_xi1, d_xi2


@njit(cache=True)
def reduced_gd_step(k, x, params):
    """One step of reduced GD (spec §4): ξ₁ ← ξ₁ − (η/d)∂L/∂ξ₁, ξ₂ ← ξ₂ − η∂L/∂ξ₂.

    ``params`` = (d, log B_d, N, η, n_theta, n_lambda); ``x`` = (ξ₁, ξ₂).
    """
    d = int(params[0])
    _, g1, g2 = _quadrature(x[0], x[1], d, params[1], int(params[2]), int(params[4]), int(params[5]))
    out = np.empty(2)
    out[0] = x[0] - params[3] / d * g1
    out[1] = x[1] - params[3] * g2
    return out


@njit(cache=True)
def reduced_flow_rhs(t, x, params):
    """Gradient-flow limit of reduced GD in time τ = ηk: dξ₁/dτ = −(1/d)∂L/∂ξ₁, dξ₂/dτ = −∂L/∂ξ₂."""
    d = int(params[0])
    _, g1, g2 = _quadrature(x[0], x[1], d, params[1], int(params[2]), int(params[4]), int(params[5]))
    out = np.empty(2)
    out[0] = -g1 / d
    out[1] = -g2
    return out


def pack_reduced_params(problem: "OneNNProblem", eta: float, grid=None) -> np.ndarray:
    """Flat parameters for :func:`reduced_gd_step` / :func:`reduced_flow_rhs`."""
    n_theta, n_lam = (check.integer(n, "grid", minimum=16) for n in (grid or DYNAMICS_GRID))
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    return np.array([problem.d, _log_B(problem.d), problem.N, eta, n_theta, n_lam], dtype=float)


# ==================================================================================================
# Python wrappers
# ==================================================================================================


@dataclass(frozen=True)
class ReducedLoss:
    """L(ξ₁, ξ₂) and its gradient, with error bounds |fine − coarse|/3 (those of the fine grid; the returned values
    are Richardson-extrapolated and usually far more accurate)."""

    loss: float
    d_xi1: float
    d_xi2: float
    loss_error: float
    gradient_error: float
    grid: tuple

    @property
    def gradient(self) -> np.ndarray:
        return np.array([self.d_xi1, self.d_xi2])


def _check_point(xi1, xi2):
    xi1 = check.real(xi1, "xi1", minimum=0.0)
    if isinstance(xi2, bool) or not isinstance(xi2, (int, float, np.integer, np.floating)) or np.isnan(xi2) \
            or xi2 == -np.inf:
        raise ValueError(f"xi2 must be a real number or +inf, got {xi2!r}")
    return xi1, float(xi2)


def reduced_loss_on_grid(problem: OneNNProblem, xi1: float, xi2: float, grid=DEFAULT_GRID) -> tuple:
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) on one fixed (n_theta, n_lambda) grid, no error estimate (what the dynamics use)."""
    xi1, xi2 = _check_point(xi1, xi2)
    n_theta, n_lam = (check.integer(n, "grid", minimum=16) for n in grid)
    return _quadrature(xi1, xi2, problem.d, _log_B(problem.d), problem.N, n_theta, n_lam)


def reduced_loss(problem: OneNNProblem, xi1: float, xi2: float, *, rtol: float = 1e-4,
                 grid=DEFAULT_GRID, max_grid=_MAX_GRID) -> ReducedLoss:
    """L(ξ₁, ξ₂) and ∇L by quadrature (spec §6) to a requested relative accuracy.

    Returns the Richardson extrapolation L_fine + (L_fine − L_coarse)/3 of the second-order scheme. The grid
    doubles until the fine grid's error estimate |L_fine − L_coarse|/3 is below
    ``rtol·|L|`` (and likewise for the gradient, relative to its norm). If ``max_grid`` is reached first a
    ``RuntimeWarning`` states the accuracy achieved; the result is never NaN.

    ξ₂ = +inf is allowed (query fully masked). Raises ``ValueError`` for ξ₁ < 0, a NaN, or rtol <= 0.
    """
    xi1, xi2 = _check_point(xi1, xi2)
    rtol = check.real(rtol, "rtol", minimum=0.0, strict=True)
    n_theta, n_lam = (check.integer(n, "grid", minimum=16) for n in grid)
    log_B = _log_B(problem.d)
    coarse = _quadrature(xi1, xi2, problem.d, log_B, problem.N, n_theta, n_lam)
    while True:
        n_theta, n_lam = 2 * n_theta - 1, 2 * n_lam - 1
        fine = _quadrature(xi1, xi2, problem.d, log_B, problem.N, n_theta, n_lam)
        loss_error = abs(fine[0] - coarse[0]) / 3
        gradient_error = math.hypot(fine[1] - coarse[1], fine[2] - coarse[2]) / 3
        scale = math.hypot(fine[1], fine[2])
        done = loss_error <= rtol * abs(fine[0]) and gradient_error <= rtol * max(scale, 1e-300)
        if done or n_theta > max_grid[0] or n_lam > max_grid[1]:
            break
        coarse = fine
    if not done:
        warnings.warn(f"reduced_loss at (xi1={xi1}, xi2={xi2}) reached relative errors "
                      f"{loss_error / abs(fine[0]):.2g} (loss) and {gradient_error / max(scale, 1e-300):.2g} "
                      f"(gradient), not rtol={rtol:g}, on the largest grid {n_theta}x{n_lam}", RuntimeWarning,
                      stacklevel=2)
    if not all(np.isfinite(fine)):
        raise FloatingPointError(f"quadrature produced a non-finite value at (xi1={xi1}, xi2={xi2})")
    # Richardson extrapolation of the second-order scheme; the reported errors stay those of the fine grid
    # (conservative: measured against exact values they match the fine grid's true error to ~6 digits).
    value = [f + (f - c) / 3 for f, c in zip(fine, coarse)]
    return ReducedLoss(loss=value[0], d_xi1=value[1], d_xi2=value[2], loss_error=loss_error,
                       gradient_error=gradient_error, grid=(n_theta, n_lam))


# ==================================================================================================
# Asymptotics (spec §7)
# ==================================================================================================


def gap_density_at_zero(d: int, N: int) -> float:
    """f_gap(0) = N(N−1) ∫ p_d(s)² F(s)^{N−2} ds: the density at 0 of the gap between the two largest t_j.

    d = 2 is refused: p_2 is not square-integrable (the gap density diverges at 0; a log correction appears).
    """
    d = check.integer(d, "d", minimum=3)
    N = check.integer(N, "N", minimum=2)
    shape = (d - 1) / 2
    beta = scipy_stats.beta(shape, shape)  # t = 2B − 1
    value, _ = integrate.quad(lambda b: 0.5 * beta.pdf(b) ** 2 * special.betainc(shape, shape, b) ** (N - 2),
                              0.0, 1.0, limit=200, epsabs=0.0, epsrel=1e-12)
    return N * (N - 1) * value


def asymptotic_loss_constant(d: int, N: int) -> float:
    """C = (ln 2 − ½) f_gap(0): L(ξ₁, ∞) ≈ C/ξ₁ as ξ₁ → ∞ (spec §7; 1.1130 at d = 4, N = 16)."""
    return (math.log(2.0) - 0.5) * gap_density_at_zero(d, N)
