"""One-layer softmax attention learning one-nearest-neighbour in context.

Paper: Z. Li, Y. Cao, C. Gao, Y. He, H. Liu, J. M. Klusowski, J. Fan, M. Wang, *One-Layer Transformer Provably
Learns One-Nearest Neighbor In Context*, NeurIPS 2024, arXiv:2411.10830. docs/one_nn.md holds the derivations;
"docs/one_nn.md §k" cites its sections.

Data (docs/one_nn.md §1): x₁…x_N, x_q uniform on S^{d−1}, labels ±1 with E[y_i y_j | x] = δ_ij and sign symmetry; the
target is the label of the nearest neighbour i* = argmax_j t_j, t_j = <x_j, x_q>. The model (docs/one_nn.md §2) predicts
f = [y, 0]·softmax(HᵀWh_q). Gradient descent from W = diag(0, …, 0, −σ) stays on W = diag(ξ₁I_d, 0, −ξ₂)
(docs/one_nn.md §4), where the context logits are ξ₁t_j and the query's is ξ₁ − ξ₂ (shifted: ξ₁(t_j − 1) and −ξ₂).

The population loss L(ξ₁, ξ₂) = ½E[(1 − S_{i*})² + Σ_{j≠i*} S_j²] is an N-dimensional expectation; docs/one_nn.md §6 reduces
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

from . import checks as check
from .parameters import Parameter, parse_parameters

__all__ = ["OneNNProblem", "t_density", "ReducedLoss", "reduced_loss", "reduced_loss_on_grid",
           "reduced_loss_adaptive", "reduced_gd_step", "reduced_flow_rhs", "pack_reduced_params",
           "gap_density_at_zero", "asymptotic_loss_constant", "Resolution", "DEFAULT_GRID", "DYNAMICS_RESOLUTION"]

# (n_theta, n_lambda) to start refining from: ~1e-3 relative error for ξ₁ <= 40 (docs/one_nn.md §6).
DEFAULT_GRID = (500, 300)


@dataclass(frozen=True)
class Resolution:
    """How the reduced dynamics choose their quadrature grid at each (ξ₁, ξ₂), see :func:`_adaptive_quadrature`.

    The θ grid has max(theta_min, theta_per_xi1·ξ₁) nodes (odd), and the value is Richardson-extrapolated from it
    and its every-other-node subgrid: the Max terms have features of width ~1/ξ₁ in t wherever the nearest
    neighbour can lie, so a fixed θ grid loses accuracy like (ξ₁·Δt)². The λ = e^w grid has a fixed spacing
    ``dw`` over a range that grows with ξ₁ and ξ₂. Its trapezoid rule converges geometrically on a well-resolved θ
    grid (dw = 0.7 gives ~1e-6), but on the coarse Richardson subgrid the λ-integrand is a train of bumps
    ξ₁Δt apart in w, so dw must stay well below that spacing: dw = 0.7 left 1.5% gradient errors at ξ₁ = 100.
    Relative error of L and ∇L (d = 4, N = 16) with the default, against 16001×1201-node references:
    ≤ 2e-6 at ξ = (3, 4) and (12, 10), 6e-4 at (40, 35), 1e-3 at (100, 80), 5e-4 at (200, 150) —
    at 0.8, 1.1, 4.4 and 16 ms per evaluation (docs/one_nn.md).
    """

    theta_min: int = 151
    theta_per_xi1: float = 4.0
    dw: float = 0.4

    def __post_init__(self):
        object.__setattr__(self, "theta_min", check.integer(self.theta_min, "theta_min", minimum=17))
        object.__setattr__(self, "theta_per_xi1", check.real(self.theta_per_xi1, "theta_per_xi1", minimum=0.0))
        object.__setattr__(self, "dw", check.real(self.dw, "dw", minimum=0.0, strict=True, maximum=2.0))


DYNAMICS_RESOLUTION = Resolution()
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

    PARAMETERS = (
        Parameter("d", "integer", 4, "dimension of the sphere S^{d−1} the tokens live on", minimum=2, maximum=1000),
        Parameter("N", "integer", 16, "context length", minimum=1, maximum=100_000),
        Parameter("sigma", "real", 10.0, "initial query mask σ (W⁽⁰⁾ = diag(0, …, 0, −σ))", minimum=0.0),
    )

    @classmethod
    def from_params(cls, values) -> "OneNNProblem":
        """A problem from named text or values (``PARAMETERS``)."""
        return cls(**parse_parameters(cls.PARAMETERS, values, owner="one_nn"))


def _log_B(d: int) -> float:
    """log B_d, B_d = √π Γ((d−1)/2) / Γ(d/2), the normaliser of sin^{d−2}θ on [0, π]."""
    return 0.5 * math.log(math.pi) + math.lgamma((d - 1) / 2) - math.lgamma(d / 2)


def t_density(d: int, t) -> np.ndarray:
    """Density of t = <x, x_q> on [−1, 1] (docs/one_nn.md §1): Γ(d/2)/(√π Γ((d−1)/2)) (1 − t²)^{(d−3)/2}."""
    d = check.integer(d, "d", minimum=2)
    t = np.asarray(t, float)
    with np.errstate(divide="ignore"):
        return np.where(np.abs(t) < 1, np.exp(-_log_B(d) + (d - 3) / 2 * np.log1p(-t * t)), 0.0)


# ==================================================================================================
# The quadrature kernel (docs/one_nn.md §6)
# ==================================================================================================


@njit(cache=True)
def _theta_grid(d, log_B, n_theta):
    """Nodes t_k = cos θ_k, θ_k = π x_k^{1.5} (dense near t = 1, docs/one_nn.md §6) and trapezoid weights in x times the
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
def _lambda_range(xi1, a, N):
    """[w_lo, w_hi] of w = log λ. Below: the m = 1 integrands vanish only like λ, so a cut-off at ε/(a + N) loses a
    relative ~ε of them (a first choice ε = 1e-5 gave a bias invisible to grid refinement, docs/one_nn.md §6);
    ε = 1e-14 is below round-off. Above: e^{−λZ'} < e^{−80} for every Z' >= a + N e^{−2ξ₁}."""
    return math.log(1e-14 / (a + N)), math.log(80.0 / (a + N * math.exp(-2.0 * xi1)))


@njit(cache=True)
def _quadrature(xi1, xi2, d, log_B, N, n_theta, n_lam):
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) at (ξ₁, ξ₂) by the formulas of docs/one_nn.md §6 (ξ₂ = inf allowed: the query fully masked).

    With u = exp(ξ₁(t − 1)), r = t − 1, a = exp(−ξ₂), Z' = a + Σu_j, and 1/Z'^m = ∫ λ^{m−1}/(m−1)! e^{−λZ'} dλ:
      L       = ½ − Max[u;1] + ½ Sum[u²;2]
      ∂L/∂ξ₂  = −a Max[u;2] + a Sum[u²;3]
      ∂L/∂ξ₁  = Max[u²r;2] + MaxPair[u, ur;2] + Sum[u²r;2] − Sum[u³r;3] − Pair[u², ur;3] − Max[ur;1]
    Sum/Pair factorise over the i.i.d. t_j; Max/MaxPair condition on the nearest neighbour's value s = t_{i*}
    (the others i.i.d. below s). λ = e^w on a uniform w grid; every λ-integrand is assembled in log space.
    """
    if xi2 < XI2_QUERY_DOMINATES:
        return 0.5, 0.0, 0.0
    t, w = _theta_grid(d, log_B, n_theta)
    u = np.exp(xi1 * (t - 1.0))
    log_wu = np.empty(n_theta)  # log(w_k u_k), once per call: the Max terms are assembled in log space
    for k in range(n_theta):
        log_wu[k] = math.log(w[k]) + xi1 * (t[k] - 1.0) if w[k] > 0.0 else -np.inf
    r = t - 1.0
    a = math.exp(-xi2) if np.isfinite(xi2) else 0.0
    w_lo, w_hi = _lambda_range(xi1, a, N)
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
        scale = wi - lam * a  # log(λ e^{−λa}), shared by every Max node at this λ
        for k in range(n_theta):
            if log_wu[k] == -np.inf:
                continue  # every Max term carries a factor w_k u(s_k)
            phi_s = tail_F[k] - tail_psi[k]
            if N > 1 and phi_s <= 0.0:
                continue
            log_term = scale + log_wu[k]
            if N > 1:
                log_term += (N - 1) * math.log(phi_s)
            k1 = math.exp(log_term) * (1.0 - expm[k])  # m = 1 times w_k u_k; e^{−λu_k} = 1 − expm[k]
            k2s = k1 * lam  # m = 2 (k1 <= ~e^{ξ₂}, so this stays finite for ξ₂ below ~350)
            acc[0] += quad_w * N * k1
            acc[1] += quad_w * N * k2s
            acc[2] += quad_w * N * u[k] * r[k] * k2s
            acc[3] += quad_w * N * r[k] * k1
            if N > 1:
                # |tail_ur/φ_s| <= max|u r| <= 2, so the product stays finite where k2s does
                acc[4] += quad_w * N * (N - 1) * k2s * (tail_ur[k] / phi_s)
    loss = 0.5 - acc[0] + 0.5 * acc[5]
    d_xi2 = -a * acc[1] + a * acc[6]
    d_xi1 = acc[2] + acc[4] + acc[7] - acc[8] - acc[9] - acc[3]
    return loss, d_xi1, d_xi2


# Past this many θ nodes (16 MB per work array, about a second per evaluation) the adaptive grid is refused: the
# nearest neighbour's range shrinks like 1/ξ₁, and ξ₁ in the millions would ask for gigabytes.
MAX_THETA_NODES = 1_000_001

# Below ξ₂ = −709 the query's own weight a = e^{−ξ₂} overflows. There every term of L but ½ and every gradient entry
# carries a factor N/a < 1e-307 (docs/one_nn.md §6): (½, 0, 0) is the value to double precision.
XI2_QUERY_DOMINATES = -709.0


def theta_nodes(xi1: float, resolution: "Resolution") -> int:
    """Nodes of the adaptive θ grid at ξ₁, refused (ValueError naming xi1) past :data:`MAX_THETA_NODES`."""
    n_fine = max(resolution.theta_min, int(math.ceil(resolution.theta_per_xi1 * xi1)))
    if n_fine > MAX_THETA_NODES:
        raise ValueError(f"xi1 = {xi1:g} needs a quadrature grid of {n_fine} θ nodes, more than the budget of "
                         f"{MAX_THETA_NODES} (attnflow.closed_forms.one_nn.MAX_THETA_NODES); the large-ξ₁ "
                         f"asymptotics of docs/one_nn.md §7 apply there")
    return n_fine


@njit(cache=True)
def _adaptive_quadrature(xi1, xi2, d, log_B, N, theta_min, theta_per_xi1, dw):
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) on the grid :class:`Resolution` prescribes at (ξ₁, ξ₂): Richardson extrapolation
    fine + (fine − coarse)/3 over a θ grid of n nodes and its (n + 1)/2-node subgrid, on one λ grid of spacing dw.
    A grid past MAX_THETA_NODES gives NaN (the dynamics then stop with a DivergenceError naming the step)."""
    if xi2 < XI2_QUERY_DOMINATES:
        return 0.5, 0.0, 0.0
    n_fine = max(theta_min, int(math.ceil(theta_per_xi1 * xi1)))
    if n_fine > MAX_THETA_NODES:
        return np.nan, np.nan, np.nan
    n_fine += 1 - n_fine % 2  # odd, so the coarse grid is every other node
    w_lo, w_hi = _lambda_range(xi1, math.exp(-xi2) if np.isfinite(xi2) else 0.0, N)
    n_lam = max(17, int(math.ceil((w_hi - w_lo) / dw)) + 1)
    fine = _quadrature(xi1, xi2, d, log_B, N, n_fine, n_lam)
    coarse = _quadrature(xi1, xi2, d, log_B, N, (n_fine + 1) // 2, n_lam)
    return (fine[0] + (fine[0] - coarse[0]) / 3, fine[1] + (fine[1] - coarse[1]) / 3,
            fine[2] + (fine[2] - coarse[2]) / 3)


@njit(cache=True)
def _params_gradient(x, params):
    """∇L at x = (ξ₁, ξ₂); ``params`` = (d, log B_d, N, η, theta_min, theta_per_xi1, dw)."""
    _, g1, g2 = _adaptive_quadrature(x[0], x[1], int(params[0]), params[1], int(params[2]), int(params[4]),
                                     params[5], params[6])
    return g1, g2


@njit(cache=True)
def reduced_gd_step(k, x, params):
    """One step of reduced GD (docs/one_nn.md §4): ξ₁ ← ξ₁ − (η/d)∂L/∂ξ₁, ξ₂ ← ξ₂ − η∂L/∂ξ₂ (``params``: see
    :func:`pack_reduced_params`)."""
    g1, g2 = _params_gradient(x, params)
    out = np.empty(2)
    out[0] = x[0] - params[3] / params[0] * g1
    out[1] = x[1] - params[3] * g2
    return out


@njit(cache=True)
def reduced_flow_rhs(t, x, params):
    """Gradient-flow limit of reduced GD in time τ = ηk: dξ₁/dτ = −(1/d)∂L/∂ξ₁, dξ₂/dτ = −∂L/∂ξ₂."""
    g1, g2 = _params_gradient(x, params)
    out = np.empty(2)
    out[0] = -g1 / params[0]
    out[1] = -g2
    return out


def pack_reduced_params(problem: "OneNNProblem", eta: float, resolution: Resolution = DYNAMICS_RESOLUTION) -> np.ndarray:
    """Flat parameters (d, log B_d, N, η, theta_min, theta_per_xi1, dw) for :func:`reduced_gd_step` /
    :func:`reduced_flow_rhs`."""
    if not isinstance(resolution, Resolution):
        raise ValueError(f"resolution must be a one_nn.Resolution, got {resolution!r}")
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    return np.array([problem.d, _log_B(problem.d), problem.N, eta, resolution.theta_min, resolution.theta_per_xi1,
                     resolution.dw], dtype=float)


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


XI1_OVERFLOW = 700.0  # e^{ξ₁t} overflows float64 beyond ~709.8: the quadrature's weights must stay finite


def _check_overflow(xi1: float) -> None:
    if xi1 > XI1_OVERFLOW:
        raise ValueError(f"xi1 = {xi1:g} is above {XI1_OVERFLOW:g}, where the quadrature's exponentials overflow")


def reduced_loss_on_grid(problem: OneNNProblem, xi1: float, xi2: float, grid=DEFAULT_GRID) -> tuple:
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) on one fixed (n_theta, n_lambda) grid, no error estimate (what the dynamics use).
    The fixed grid does not adapt to ξ₁: far out (ξ₁ in the hundreds) it under-resolves the peak of the
    nearest-neighbour weight; :func:`reduced_loss_adaptive` does not."""
    xi1, xi2 = _check_point(xi1, xi2)
    _check_overflow(xi1)
    n_theta, n_lam = (check.integer(n, "grid", minimum=16) for n in grid)
    if max(n_theta, n_lam) > MAX_THETA_NODES:
        raise ValueError(f"grid {grid} is larger than the budget of {MAX_THETA_NODES} nodes per axis "
                         "(attnflow.closed_forms.one_nn.MAX_THETA_NODES)")
    return _quadrature(xi1, xi2, problem.d, _log_B(problem.d), problem.N, n_theta, n_lam)


def reduced_loss_adaptive(problem: OneNNProblem, xi1: float, xi2: float,
                          resolution: Resolution = DYNAMICS_RESOLUTION) -> tuple:
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) exactly as the reduced dynamics evaluate them (:class:`Resolution`)."""
    xi1, xi2 = _check_point(xi1, xi2)
    if not isinstance(resolution, Resolution):
        raise ValueError(f"resolution must be a one_nn.Resolution, got {resolution!r}")
    theta_nodes(xi1, resolution)
    _check_overflow(xi1)
    return _adaptive_quadrature(xi1, xi2, problem.d, _log_B(problem.d), problem.N, resolution.theta_min,
                                resolution.theta_per_xi1, resolution.dw)


def reduced_loss(problem: OneNNProblem, xi1: float, xi2: float, *, rtol: float = 1e-4,
                 grid=DEFAULT_GRID, max_grid=_MAX_GRID) -> ReducedLoss:
    """L(ξ₁, ξ₂) and ∇L by quadrature (docs/one_nn.md §6) to a requested relative accuracy.

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
# Asymptotics (docs/one_nn.md §7)
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
    """C = (ln 2 − ½) f_gap(0): L(ξ₁, ∞) ≈ C/ξ₁ as ξ₁ → ∞ (docs/one_nn.md §7; 1.1130 at d = 4, N = 16)."""
    return (math.log(2.0) - 0.5) * gap_density_at_zero(d, N)
