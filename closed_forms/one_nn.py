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
from dataclasses import dataclass, replace

import numpy as np
from numba import njit
from scipy import integrate, special
from scipy import stats as scipy_stats

from . import checks as check
from .parameters import Parameter, parse_parameters

__all__ = ["OneNNProblem", "t_density", "ReducedLoss", "reduced_loss", "reduced_loss_on_grid",
           "reduced_loss_adaptive", "reduced_gd_step", "reduced_flow_rhs", "pack_reduced_params",
           "gap_density_at_zero", "asymptotic_loss_constant", "Resolution", "DEFAULT_GRID", "MAX_GRID", "DYNAMICS_RESOLUTION"]

# (n_theta, n_lambda) to start refining from: ~1e-3 relative error for ξ₁ <= 40 (docs/one_nn.md §6).
DEFAULT_GRID = (500, 300)


@dataclass(frozen=True)
class Resolution:
    """How the reduced dynamics choose their quadrature grid at each (ξ₁, ξ₂), see :func:`_adaptive_quadrature` and
    docs/one_nn.md §6 ("The dynamics' quadrature").

    Nodes uniform in v = ξ₁(1 − t) with spacing h = 2/theta_per_xi1 (so theta_per_xi1·ξ₁ nodes over all of t ∈ [−1, 1]),
    at least theta_min of them; w = log λ on a grid of spacing m·h ≈ dw with m odd, aligned with the v nodes so that
    e^{−λu} is read from a table. Richardson-extrapolated against the every-other-node subgrid. With the default
    (h = 0.2, dw = 0.3) the error of ∇L is <= 2e-5 of ‖∇L‖ for d >= 3 at the points checked (ξ₁ up to 200, N <= 16;
    3e-5 at N = 64, measured 2.5e-5; docs/one_nn.md §6), about 1e-3 for d = 2. dw = 0.6 left an absolute error of 5e-5 in ∂L/∂ξ₁ at ξ₁ <= 1, where
    every reduced-GD run starts. The nearest neighbour's range in t shrinks like N^{−2/(d−1)}: theta_min is the
    count at N <= THETA_MIN_CONTEXT, scaled by (N / THETA_MIN_CONTEXT)^{2/(d−1)} beyond (:meth:`for_context`).
    """

    theta_min: int = 151
    theta_per_xi1: float = 10.0
    dw: float = 0.3

    def for_context(self, d: int, N: int) -> "Resolution":
        """This resolution with theta_min scaled for context length N on S^{d−1} (at least this theta_min)."""
        scale = max(1.0, N / THETA_MIN_CONTEXT) ** (2.0 / (d - 1))
        return replace(self, theta_min=max(self.theta_min, int(math.ceil(self.theta_min * scale - 1e-9))))

    def __post_init__(self):
        object.__setattr__(self, "theta_min", check.integer(self.theta_min, "theta_min", minimum=17))
        object.__setattr__(self, "theta_per_xi1", check.real(self.theta_per_xi1, "theta_per_xi1", minimum=0.0))
        object.__setattr__(self, "dw", check.real(self.dw, "dw", minimum=0.0, strict=True, maximum=2.0))


# theta_min nodes resolve the nearest neighbour's peak up to this context length (the error budget of Resolution).
THETA_MIN_CONTEXT = 16
DYNAMICS_RESOLUTION = Resolution()
# reduced_loss refines until the next doubling would exceed this (n_theta, n_lambda): it stops at 7985 × 4785.
MAX_GRID = (8000, 2400)


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
    t = check.finite_array(t, "t")
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


# λu above which e^{−λu} counts as 0 (e^{−40} = 4e-18) in both kernels.
X_HIGH = 40.0


@njit(cache=True)
def _ipow(x, n):
    """x**n for an integer n >= 0 by repeated squaring: a few products instead of a log and an exp per cell."""
    result = 1.0
    while n > 0:
        if n & 1:
            result *= x
        x *= x
        n >>= 1
    return result


@njit(cache=True)
def _lambda_range(xi1, xi2, N):
    """[w_lo, w_hi] of w = log λ. Below: the m = 1 integrands vanish only like λ, so a cut-off at ε/(a + N) loses a
    relative ~ε of them (a first choice ε = 1e-5 gave a bias invisible to grid refinement, docs/one_nn.md §6);
    ε = 1e-14 is below round-off. Above: e^{−λZ'} < e^{−80} for every Z' >= a + N e^{−2ξ₁}, a = e^{−ξ₂}; the upper end
    is computed as log 80 − log(e^{−ξ₂} + e^{log N − 2ξ₁}) so that it stays finite for ξ₁ beyond ~350 and ξ₂ = ∞."""
    log_a = -xi2 if math.isfinite(xi2) else -np.inf
    log_floor = math.log(N) - 2.0 * xi1
    top = max(log_a, log_floor)
    log_lower = top + math.log1p(math.exp(min(log_a, log_floor) - top))
    return math.log(1e-14) - (max(log_a, math.log(N)) + math.log1p(math.exp(-abs(log_a - math.log(N))))), \
        math.log(80.0) - log_lower


@njit(cache=True)
def _quadrature(xi1, xi2, d, log_B, N, n_theta, n_lam):
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) at (ξ₁, ξ₂) on a θ × λ grid by the formulas of docs/one_nn.md §6 (ξ₂ = inf allowed: the
    query fully masked). The reference quadrature of :func:`reduced_loss` and :func:`reduced_loss_on_grid`.

    With u = exp(ξ₁(t − 1)), r = t − 1, a = exp(−ξ₂), Z' = a + Σu_j, and 1/Z'^m = ∫ λ^{m−1}/(m−1)! e^{−λZ'} dλ:
      L       = ½E[(a² + 2aR + 2Σ_{j≠i*}u_j² + Σ_{j≠k≠i*}u_j u_k)/Z'²],  R = Σ_{j≠i*}u_j   (every term >= 0)
      ∂L/∂ξ₂  = −a Max[u;2] + a Sum[u²;3]
      ∂L/∂ξ₁  = Max[u²r;2] + MaxPair[u, ur;2] + Sum[u²r;2] − Sum[u³r;3] − Pair[u², ur;3] − Max[ur;1]
    Sum/Pair factorise over the i.i.d. t_j; Max/MaxPair condition on the nearest neighbour's value s = t_{i*}
    (the others i.i.d. below s). λ = e^w on a uniform w grid. Every transform is carried in the scaled form
    λ^m Φ_h = E[(λu)^m … e^{−λu}], a bounded number, and every integrand is a plain product of bounded factors:
    nothing underflows where it matters (docs/one_nn.md §6, "The sign of the loss").
    """
    if xi2 < XI2_QUERY_DOMINATES:
        return 0.5, 0.0, 0.0
    t, w = _theta_grid(d, log_B, n_theta)
    r = np.empty(n_theta)  # t − 1
    log_u = np.empty(n_theta)
    u = np.empty(n_theta)
    for k in range(n_theta):  # scalar loops: array expressions compile several times slower
        r[k] = t[k] - 1.0
        log_u[k] = xi1 * r[k]
        u[k] = math.exp(log_u[k])
    a = math.exp(-xi2) if math.isfinite(xi2) else 0.0
    w_lo, w_hi = _lambda_range(xi1, xi2, N)
    dw = (w_hi - w_lo) / (n_lam - 1)
    # Accumulators: a·Max[u;2], Max[u²r;2], Max[ur;1], MaxPair[u,ur;2], a·Sum[u²;3], Sum[u²r;2], Sum[u³r;3],
    # Pair[u²,ur;3], and the loss.
    acc = np.zeros(9)
    x = np.empty(n_theta)  # λu
    e = np.empty(n_theta)  # e^{−λu}
    phi_floor = math.exp(-700.0 / max(N - 1, 1))
    for i in range(n_lam):
        wi = w_lo + i * dw
        lam = math.exp(wi)
        lam_a = math.exp(wi - xi2) if a > 0.0 else 0.0  # λa
        ea = math.exp(-lam_a)
        quad_w = dw * (0.5 if i == 0 or i == n_lam - 1 else 1.0)
        psi = 0.0  # E[1 − e^{−λu}]
        A2 = 0.0  # λ²Φ_{u²}
        A2r = 0.0  # λ²Φ_{u²r}
        A3r = 0.0  # λ³Φ_{u³r}
        A1r = 0.0  # λΦ_{ur}
        for k in range(n_theta):
            xk = lam * u[k] if log_u[k] > -700.0 else math.exp(wi + log_u[k])  # u alone may underflow
            x[k] = xk
            wk = w[k]
            if xk > X_HIGH:  # e^{−λu} = 0 to double precision (and (λu)³ may overflow)
                x[k] = 0.0
                e[k] = 0.0
                psi += wk
                continue
            ek = math.exp(-xk)
            e[k] = ek
            psi += wk * -math.expm1(-xk)
            A2 += wk * xk * xk * ek
            A2r += wk * r[k] * xk * xk * ek
            A3r += wk * r[k] * xk * xk * xk * ek
            A1r += wk * r[k] * xk * ek
        # the node weights sum to 1 only up to round-off: once every e^{−λu} is 0, psi may exceed 1 by an ulp,
        # and log1p(−psi) would be NaN where (1 − psi)^m is 0
        log_phi = math.log1p(-psi) if psi < 1.0 else -np.inf
        phi_N1 = math.exp((N - 1) * log_phi) if N > 1 else 1.0
        phi_N2 = math.exp((N - 2) * log_phi) if N > 2 else 1.0
        c = quad_w * N * ea
        acc[4] += c * 0.5 * lam_a * A2 * phi_N1
        acc[5] += c * A2r * phi_N1
        acc[6] += c * 0.5 * A3r * phi_N1
        if N > 1:
            acc[7] += c * (N - 1) * 0.5 * A2 * A1r * phi_N2
        # --- Max and MaxPair terms: cumulative sums over t < s_k (θ-nodes beyond k), half weight at k
        run_F = 0.0
        run_u = 0.0
        run_u2 = 0.0
        run_ur = 0.0
        M0 = 0.0
        M2 = 0.0
        M3 = 0.0
        M4 = 0.0
        La = 0.0
        Lb = 0.0
        Lc = 0.0
        Ld = 0.0
        for k in range(n_theta - 1, -1, -1):
            wk = w[k]
            xk = x[k]
            ek = e[k]
            phi_s = run_F + 0.5 * wk * ek  # E[e^{−λu} 1{t < s_k}]
            cu = run_u + 0.5 * wk * xk * ek  # λΦ_{u,s}
            cu2 = run_u2 + 0.5 * wk * xk * xk * ek  # λ²Φ_{u²,s}
            cur = run_ur + 0.5 * wk * r[k] * xk * ek  # λΦ_{ur,s}
            run_F += wk * ek
            run_u += wk * xk * ek
            run_u2 += wk * xk * xk * ek
            run_ur += wk * r[k] * xk * ek
            if wk == 0.0 or (N > 1 and phi_s <= phi_floor):
                continue
            p3 = _ipow(phi_s, N - 3) if N > 2 else 0.0
            p2 = p3 * phi_s if N > 2 else (1.0 if N == 2 else 0.0)
            p1 = p2 * phi_s if N > 1 else 1.0
            g = wk * ek
            M0 += g * xk * p1
            M2 += g * xk * xk * r[k] * p1
            M3 += g * xk * r[k] * p1
            M4 += g * xk * cur * p2
            La += g * p1
            Lb += g * cu * p2
            Lc += g * cu2 * p2
            Ld += g * cu * cu * p3
        acc[0] += c * lam_a * M0
        acc[1] += c * M2
        acc[2] += c * M3
        acc[3] += c * (N - 1) * M4
        acc[8] += 0.5 * c * (lam_a * lam_a * La + (N - 1) * (2.0 * lam_a * Lb + 2.0 * Lc + (N - 2) * Ld))
    loss = acc[8]
    d_xi2 = -acc[0] + acc[4]
    d_xi1 = acc[1] + acc[3] + acc[5] - acc[6] - acc[7] - acc[2]
    return loss, d_xi1, d_xi2


# Past this many θ nodes (16 MB per work array, about a second per evaluation) the adaptive grid is refused: the
# nearest neighbour's range shrinks like 1/ξ₁, and ξ₁ in the millions would ask for gigabytes.
MAX_THETA_NODES = 1_000_001

# Below ξ₂ = −709 the query's own weight a = e^{−ξ₂} overflows. There every term of L but ½ and every gradient entry
# carries a factor N/a < 1e-307 (docs/one_nn.md §6): (½, 0, 0) is the value to double precision.
XI2_QUERY_DOMINATES = -709.0


def _theta_nodes(xi1: float, resolution: "Resolution") -> int:
    """Nodes of the adaptive θ grid at ξ₁, refused (ValueError naming xi1) past :data:`MAX_THETA_NODES`."""
    n_fine = max(resolution.theta_min, int(math.ceil(resolution.theta_per_xi1 * xi1)))
    if n_fine > MAX_THETA_NODES:
        raise ValueError(f"xi1 = {xi1:g} needs a quadrature grid of {n_fine} θ nodes, more than the budget of "
                         f"{MAX_THETA_NODES} (attnflow.closed_forms.one_nn.MAX_THETA_NODES); the large-ξ₁ "
                         f"asymptotics of docs/one_nn.md §7 apply there")
    return n_fine


# Gauss–Legendre nodes and weights on [−1, 1] (3 points) for the node weights of the v grid.
_GL3_X = math.sqrt(0.6)
_GL3_W0 = 5.0 / 9.0
_GL3_W1 = 8.0 / 9.0
# The v-grid kernel treats λu > X_HIGH as e^{−λu} = 0 and a node more than V_BELOW past the row's λ (λu < e^{−28}
# relative to the row's largest) as e^{−λu} = 1: both errors are below 1e-12 relative (docs/one_nn.md §6).
V_BELOW = 28.0


@njit(cache=True)
def _v_weights(d, log_B, K, h_t):
    """Weights of the nodes t_k = 1 − (K − k)·h_t, k = 0, …, K (ascending t; t_0 >= −1): the integral of
    the density p_d against each node's hat function (linear in t), by 3-point Gauss–Legendre in θ = arccos t on every
    cell (no endpoint singularity in θ, docs/one_nn.md §1). Returns (W, far), far = P(t < t_0); when the grid reaches
    t = −1 the weights are normalised to sum to 1 (the discrete law is exactly a probability)."""
    n = K + 1
    s = np.empty(n)  # 1 − t
    theta = np.empty(n)
    for j in range(n):
        s[j] = min((K - j) * h_t, 2.0)
        theta[j] = 2.0 * math.asin(math.sqrt(0.5 * s[j]))
    W = np.zeros(n)
    total = 0.0
    for j in range(n - 1):
        half = 0.5 * (theta[j] - theta[j + 1])
        mid = 0.5 * (theta[j] + theta[j + 1])
        for g in range(3):
            th = mid + half * (_GL3_X if g == 2 else (-_GL3_X if g == 0 else 0.0))
            sn = math.sin(th)
            if d == 2:
                density = math.exp(-log_B)
            else:
                density = math.exp((d - 2) * math.log(sn) - log_B) if sn > 0.0 else 0.0
            weight = (_GL3_W1 if g == 1 else _GL3_W0) * half * density
            sh = math.sin(0.5 * th)
            frac = (s[j] - 2.0 * sh * sh) / (s[j] - s[j + 1])  # 0 at t_j, 1 at t_{j+1}
            W[j] += weight * (1.0 - frac)
            W[j + 1] += weight * frac
            total += weight
    if s[0] >= 2.0:
        for j in range(n):
            W[j] /= total
        return W, 0.0
    return W, max(0.0, 1.0 - total)


@njit(cache=True)
def _v_row(N, D, E, T1, T2, T3, base, step, k0, k1, W, r, below, above, phi_floor, with_loss, out):
    """One λ-row of the v-grid quadrature on the nodes k0..k1 (weights W, r = t − 1; table entries base + k·step):
    the Sum transforms and the Max sums of docs/one_nn.md §6 as plain products. ``below``/``above``: the mass of the
    nodes past the window (e^{−λu} = 1 / 0 there). out = (psi, λ²Φ_{u²}, λ²Φ_{u²r}, λ³Φ_{u³r}, λΦ_{ur}, M0, M2, M3,
    M4, La, Lb, Lc, Ld)."""
    psi = above
    A2 = 0.0
    A2r = 0.0
    A3r = 0.0
    run_F = below
    run_u = 0.0
    run_u2 = 0.0
    run_ur = 0.0
    M0 = 0.0
    M2 = 0.0
    M3 = 0.0
    M4 = 0.0
    La = 0.0
    Lb = 0.0
    Lc = 0.0
    Ld = 0.0
    for k in range(k0, k1 + 1):
        q = base + k * step
        wk = W[k]
        rk = r[k]
        ek = E[q]
        t1 = T1[q]  # λu e^{−λu}
        t2 = T2[q]  # (λu)² e^{−λu}
        we = wk * ek
        wt1 = wk * t1
        wt2 = wk * t2
        psi += wk * D[q]
        A2 += wt2
        A2r += rk * wt2
        A3r += rk * wk * T3[q]
        phi_s = run_F + 0.5 * we  # E[e^{−λu} 1{t < s_k}], half weight at the node
        cu = run_u + 0.5 * wt1  # λΦ_{u,s}
        cu2 = run_u2 + 0.5 * wt2  # λ²Φ_{u²,s}
        cur = run_ur + 0.5 * rk * wt1  # λΦ_{ur,s}
        run_F += we
        run_u += wt1
        run_u2 += wt2
        run_ur += rk * wt1
        if N > 1 and phi_s <= phi_floor:
            continue
        p3 = _ipow(phi_s, N - 3) if N > 2 else 0.0
        p2 = p3 * phi_s if N > 2 else (1.0 if N == 2 else 0.0)
        p1 = p2 * phi_s if N > 1 else 1.0
        M0 += wt1 * p1
        M2 += rk * wt2 * p1
        M3 += rk * wt1 * p1
        M4 += wt1 * cur * p2
        if not with_loss:
            continue
        La += we * p1
        Lb += we * cu * p2
        Lc += we * cu2 * p2
        Ld += we * cu * cu * p3
    out[0] = psi
    out[1] = A2
    out[2] = A2r
    out[3] = A3r
    out[4] = run_ur
    out[5] = M0
    out[6] = M2
    out[7] = M3
    out[8] = M4
    out[9] = La
    out[10] = Lb
    out[11] = Lc
    out[12] = Ld


@njit(cache=True)
def _v_table(x, D, E, T1, T2, T3, q):
    """1 − e^{−x}, e^{−x}, x e^{−x}, x² e^{−x}, x³ e^{−x} at x = λu into entry q (e^{−x} = 0 past X_HIGH)."""
    if x > X_HIGH:
        D[q] = 1.0
        E[q] = 0.0
        T1[q] = 0.0
        T2[q] = 0.0
        T3[q] = 0.0
    else:
        e = math.exp(-x)
        D[q] = -math.expm1(-x)
        E[q] = e
        T1[q] = x * e
        T2[q] = x * x * e
        T3[q] = x * x * x * e


@njit(cache=True)
def _adaptive_quadrature(xi1, xi2, d, log_B, N, theta_min, theta_per_xi1, dw_target, with_loss):
    """(L, ∂L/∂ξ₁, ∂L/∂ξ₂) as the reduced dynamics evaluate them (:class:`Resolution`): on a grid uniform in
    v = ξ₁(1 − t) of spacing h = 2/theta_per_xi1 (at least theta_min nodes) with λ spacing ≈ dw_target, and on its
    every-other-node subgrid, Richardson-extrapolated fine + (fine − coarse)/3 (docs/one_nn.md §6, "The dynamics'
    quadrature"). A grid past MAX_THETA_NODES gives NaN (the dynamics then stop with a DivergenceError naming the
    step).

    λu_k = e^{w − v_k}: with w on a grid of spacing m·h (m odd) aligned with the v nodes, λu takes only the values
    e^{w_lo − Kh + qh}, so e^{−λu} and its companions are read from one table instead of computed per cell. Each
    λ-row visits only the nodes where e^{−λu} is neither 0 nor 1 to double precision (a window of ~50 in v). Small
    ξ₁, where the v range is shorter than theta_min·h, uses theta_min nodes uniform in t and computes e^{−λu} per
    cell.

    One function, not a v-grid kernel under a Richardson wrapper: numba compiles a callee's code again into each
    caller.
    """
    if xi2 < XI2_QUERY_DOMINATES:
        return 0.5, 0.0, 0.0
    if max(theta_min, int(math.ceil(theta_per_xi1 * xi1))) > MAX_THETA_NODES:
        return np.nan, np.nan, np.nan
    h_target = 2.0 / theta_per_xi1 if theta_per_xi1 > 0.0 else np.inf
    a = math.exp(-xi2) if math.isfinite(xi2) else 0.0
    w_lo, w_hi = _lambda_range(xi1, xi2, N)
    v_max = min(2.0 * xi1, max(w_hi, 0.0) + V_BELOW)  # beyond: e^{−λu} = 1 at every λ of the grid
    K = max(theta_min, int(math.ceil(v_max / h_target)))
    K += K % 2
    s_max = v_max / xi1 if xi1 > 0.0 else 2.0  # the grid's range in 1 − t
    h_t = s_max / K
    h = xi1 * h_t
    W, far = _v_weights(d, log_B, K, h_t)
    # The every-other-node subgrid: K/2 cells of 2h_t, the same nodes to the bit (doubling is exact). A stride
    # argument would be a literal here, and numba compiles _v_weights once per literal value.
    Wc, far_c = _v_weights(d, log_B, K // 2, 2.0 * h_t)
    n = K + 1
    nc = K // 2 + 1
    r = np.empty(n)
    for k in range(n):
        r[k] = -min((K - k) * h_t, 2.0)
    rc = np.empty(nc)
    for k in range(nc):
        rc[k] = r[2 * k]
    mass = np.empty(n + 1)  # far + Σ_{j<k} W_j
    mass[0] = far
    for k in range(n):
        mass[k + 1] = mass[k] + W[k]
    mass_c = np.empty(nc + 1)
    mass_c[0] = far_c
    for k in range(nc):
        mass_c[k + 1] = mass_c[k] + Wc[k]
    aligned = False
    m = 1
    n_w = 2
    dw = dw_target
    if h > 0.0:
        m = max(1, int(round(dw_target / h)))
        m += 1 - m % 2  # odd: the coarse nodes (spacing 2h) then alternate between two phases along w
        dw = m * h
        n_w = max(17, int(math.ceil((w_hi - w_lo) / dw)) + 1)
        aligned = m * (n_w - 1) + n <= n_w * n
    if not aligned:
        n_w = max(17, int(math.ceil((w_hi - w_lo) / dw_target)) + 1)
        dw = (w_hi - w_lo) / (n_w - 1)
    size = m * (n_w - 1) + n if aligned else n
    D = np.empty(size)
    E = np.empty(size)
    T1 = np.empty(size)
    T2 = np.empty(size)
    T3 = np.empty(size)
    if aligned:
        for q in range(size):
            _v_table(math.exp(w_lo - K * h + q * h), D, E, T1, T2, T3, q)
    log_u = np.empty(n)
    for k in range(n):
        log_u[k] = -(K - k) * h
    phi_floor = math.exp(-700.0 / max(N - 1, 1))
    acc = np.zeros(18)
    out = np.empty(13)
    for i in range(n_w):
        wi = w_lo + i * dw
        lam_a = math.exp(wi - xi2) if a > 0.0 else 0.0
        c = dw * (0.5 if i == 0 or i == n_w - 1 else 1.0) * N * math.exp(-lam_a)
        if h > 0.0:
            k0 = max(0, int(math.ceil(K - (max(wi, 0.0) + V_BELOW) / h)))
            k1 = min(K, int(math.floor(K - (wi - math.log(X_HIGH)) / h)))
        else:
            k0 = 0
            k1 = K
        base = m * i if aligned else 0
        if not aligned:
            for k in range(k0, k1 + 1):
                _v_table(math.exp(wi + log_u[k]), D, E, T1, T2, T3, k)
        for grid in range(2):
            if grid == 0:
                lo, hi, stride, w, rr, mm, top = k0, k1, 1, W, r, mass, n
            else:
                lo, hi, stride, w, rr, mm, top = (k0 + 1) // 2, k1 // 2, 2, Wc, rc, mass_c, nc
            if hi < lo:
                for q in range(1, out.size):
                    out[q] = 0.0
                out[0] = mm[top] - mm[max(hi + 1, 0)]
            else:
                _v_row(N, D, E, T1, T2, T3, base, stride, lo, hi, w, rr, mm[lo], mm[top] - mm[hi + 1], phi_floor,
                       with_loss, out)
            psi = out[0]
            log_phi = math.log1p(-psi) if psi < 1.0 else -np.inf
            phi_N1 = math.exp((N - 1) * log_phi) if N > 1 else 1.0
            phi_N2 = math.exp((N - 2) * log_phi) if N > 2 else 1.0
            j = 9 * grid
            acc[j] += c * lam_a * out[5]  # a·Max[u;2]
            acc[j + 1] += c * out[6]  # Max[u²r;2]
            acc[j + 2] += c * out[7]  # Max[ur;1]
            acc[j + 3] += c * (N - 1) * out[8]  # MaxPair[u, ur;2]
            acc[j + 4] += c * 0.5 * lam_a * out[1] * phi_N1  # a·Sum[u²;3]
            acc[j + 5] += c * out[2] * phi_N1  # Sum[u²r;2]
            acc[j + 6] += c * 0.5 * out[3] * phi_N1  # Sum[u³r;3]
            if N > 1:
                acc[j + 7] += c * (N - 1) * 0.5 * out[1] * out[4] * phi_N2  # Pair[u², ur;3]
            # nodes below the window (e^{−λu} = 1) as the nearest neighbour: Σ W (C + W/2)^{N−1} = C^N/N, C their mass
            La = out[9] + _ipow(mm[min(lo, top)], N) / N
            acc[j + 8] += 0.5 * c * (lam_a * lam_a * La + (N - 1) * (2.0 * lam_a * out[10] + 2.0 * out[11]
                                                                       + (N - 2) * out[12]))
    v = np.empty(6)  # (L, ∂L/∂ξ₁, ∂L/∂ξ₂) on the fine grid, then on the coarse one
    for grid in range(2):
        j = 9 * grid
        v[3 * grid] = acc[j + 8]
        v[3 * grid + 1] = acc[j + 1] + acc[j + 3] + acc[j + 5] - acc[j + 6] - acc[j + 7] - acc[j + 2]
        v[3 * grid + 2] = -acc[j] + acc[j + 4]
    return (v[0] + (v[0] - v[3]) / 3, v[1] + (v[1] - v[4]) / 3, v[2] + (v[2] - v[5]) / 3)


# The step and the flow call the quadrature themselves, with_loss = params[4] < 0.0 (False: theta_min >= 17; not a
# literal, so one compiled signature): numba compiles the quadrature's code again into every @njit level in between.


@njit(cache=True)
def reduced_gd_step(k, x, params):
    """One step of reduced GD (docs/one_nn.md §4): ξ₁ ← ξ₁ − (η/d)∂L/∂ξ₁, ξ₂ ← ξ₂ − η∂L/∂ξ₂ (``params``: see
    :func:`pack_reduced_params`)."""
    _, g1, g2 = _adaptive_quadrature(x[0], x[1], int(params[0]), params[1], int(params[2]), int(params[4]),
                                     params[5], params[6], params[4] < 0.0)
    out = np.empty(2)
    out[0] = x[0] - params[3] / params[0] * g1
    out[1] = x[1] - params[3] * g2
    return out


@njit(cache=True)
def reduced_flow_rhs(t, x, params):
    """Gradient-flow limit of reduced GD in time τ = ηk: dξ₁/dτ = −(1/d)∂L/∂ξ₁, dξ₂/dτ = −∂L/∂ξ₂."""
    _, g1, g2 = _adaptive_quadrature(x[0], x[1], int(params[0]), params[1], int(params[2]), int(params[4]),
                                     params[5], params[6], params[4] < 0.0)
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
    resolution = resolution.for_context(problem.d, problem.N)
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
    resolution = resolution.for_context(problem.d, problem.N)
    _theta_nodes(xi1, resolution)
    _check_overflow(xi1)
    return _adaptive_quadrature(xi1, xi2, problem.d, _log_B(problem.d), problem.N, resolution.theta_min,
                                resolution.theta_per_xi1, resolution.dw, True)


def reduced_loss(problem: OneNNProblem, xi1: float, xi2: float, *, rtol: float = 1e-4,
                 grid=DEFAULT_GRID, max_grid=MAX_GRID) -> ReducedLoss:
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
