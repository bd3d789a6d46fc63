"""A one-layer transformer learning optimal variable selection in group-sparse classification.

Paper: C. Zhang, X. Meng, Y. Cao, *Transformer Learns Optimal Variable Selection in Group-Sparse Classification*,
ICLR 2025 (arXiv:2504.08638). "docs/group_sparse.md §k" numbers the derivation notes behind this module; docs/group_sparse.md holds
the derivations, which come from the model definition, not from the paper.

Data (docs/group_sparse.md §1): X = [x_1 … x_D] ∈ R^{d×D}, x_j ~ N(0, σ_x² I_d) i.i.d., y = sign(<x_{j*}, v*>), ‖v*‖ = 1. Tokens
h_j = [x_j; e_j]. Model (docs/group_sparse.md §2): f = Σ_j vᵀH softmax(HᵀW h_j), logistic loss, GD from v = 0, W = 0.

What is exact here:
* the symmetry invariants of GD from zero (docs/group_sparse.md §5: v₂ = 0, W₁₂ = W₂₁ = 0, W₂₂ column sums 0, v₁ ∥ v*), and the
  six scalars they leave (:func:`symmetric_coordinates`);
* the first GD step (docs/group_sparse.md §5): v₁⁽¹⁾ = (η/2)σ_x√(2/π)v*, W⁽¹⁾ = 0;
* the position-only sub-model (W₁₁ frozen at 0; docs/group_sparse.md §6): two scalars (β, α) whose loss and gradient are
  expectations under a skew-normal law; the skew part is in closed form and one Gaussian integral of the scale
  c = κω is left for each, computed by a geometrically convergent rule (:func:`position_only_terms`); and its GD map.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import checks as check
from .parameters import Parameter, parse_parameters

__all__ = ["GroupSparseProblem", "first_step_v", "attention_weights", "position_only_terms",
           "position_only_loss", "position_only_step", "position_only_flow_rhs", "position_only_flow_rhs_into",
           "pack_position_only_params", "asymptotic_loss_constant", "symmetric_coordinates"]


@dataclass(frozen=True)
class GroupSparseProblem:
    """d >= 1 features per group, D >= 2 groups, relevant group ``j_star`` ∈ {1, …, D} (1-based, as in the paper's
    j* = 2), direction ``v_star`` ∈ R^d (normalised to unit norm, docs/group_sparse.md §1) and feature scale σ_x > 0."""

    d: int
    D: int
    j_star: int
    v_star: np.ndarray
    sigma_x: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "d", check.integer(self.d, "d", minimum=1))
        object.__setattr__(self, "D", check.integer(self.D, "D", minimum=2))
        j_star = check.integer(self.j_star, "j_star", minimum=1)
        if j_star > self.D:
            raise ValueError(f"j_star must be in 1..D = 1..{self.D}, got {j_star}")
        object.__setattr__(self, "j_star", j_star)
        v = check.finite_array(self.v_star, "v_star", shape=(self.d,))
        norm = float(np.linalg.norm(v))
        if norm == 0.0:
            raise ValueError("v_star must be non-zero (the label is sign(<x_j*, v_star>))")
        v = v / norm
        v.setflags(write=False)
        object.__setattr__(self, "v_star", v)
        object.__setattr__(self, "sigma_x", check.real(self.sigma_x, "sigma_x", minimum=0.0, strict=True))

    @classmethod
    def standard(cls, d: int, D: int, j_star: int = 2, sigma_x: float = 1.0) -> "GroupSparseProblem":
        """v* = e₁ (any unit vector is equivalent by rotation invariance of the data law)."""
        v = np.zeros(check.integer(d, "d", minimum=1))
        v[0] = 1.0
        return cls(d, D, j_star, v, sigma_x)

    PARAMETERS = (
        Parameter("d", "integer", 4, "features per group", minimum=1, maximum=10_000),
        Parameter("D", "integer", 6, "groups", minimum=2, maximum=10_000),
        Parameter("j_star", "integer", 2, "the relevant group (1-based)", minimum=1),
        Parameter("sigma_x", "real", 1.0, "feature scale σ_x", minimum=0.0, strict=True),
    )

    @classmethod
    def from_params(cls, values) -> "GroupSparseProblem":
        """The standard problem (v* = e₁) from named text or values (``PARAMETERS``)."""
        return cls.standard(**parse_parameters(cls.PARAMETERS, values, owner="group_sparse"))

    @property
    def star(self) -> int:
        """0-based index of the relevant group."""
        return self.j_star - 1


def first_step_v(problem: GroupSparseProblem, eta: float) -> np.ndarray:
    """v⁽¹⁾ = [(η/2)σ_x√(2/π) v*; 0_D] (docs/group_sparse.md §5): at v = 0, W = 0 the attention is uniform, l'(0) = −½ and
    E[y x_{j*}] = σ_x√(2/π) v*. W⁽¹⁾ = 0 because ∇_W vanishes at v = 0."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    return np.concatenate([eta / 2 * problem.sigma_x * math.sqrt(2 / math.pi) * problem.v_star, np.zeros(problem.D)])


def attention_weights(alpha: float, D: int) -> tuple[float, float]:
    """(s*, s_o) = (e^α, 1)/(e^α + D − 1): the position-only attention on j* and on each other position."""
    alpha = check.real(alpha, "alpha")
    D = check.integer(D, "D", minimum=2)
    return _attention(alpha, D)


# ==================================================================================================
# Position-only sub-model (docs/group_sparse.md §6)
# ==================================================================================================

_SQRT_2PI = math.sqrt(2.0 * math.pi)


@njit(cache=True)
def _attention(alpha, D):
    """(s*, s_o) without overflow: e^{−|α|} is the only exponential."""
    e = math.exp(-abs(alpha))
    if alpha > 0:
        return 1.0 / (1.0 + (D - 1) * e), e / (1.0 + (D - 1) * e)
    return e / (e + D - 1), 1.0 / (e + D - 1)


@njit(cache=True)
def _logistic_moments(c, with_softplus):
    """(F, H, F₀) = (E[σ(cN)σ(−cN)], E[|N|σ(−|cN|)], E[log(1 + e^{−|cN|})]), N ~ N(0, 1) (docs/group_sparse.md §6,
    "Quadrature"); F₀ only when ``with_softplus`` (the loss; 0 otherwise).

    F = ∫ σσ(cx)φ(x)dx. For |c| > 1, H = 1/√(2π) − |c|F is computed as ∫ |c|σσ(cx)(φ(0) − φ(x))dx (Stein's identity
    and ∫|c|σσ(cx)dx = 1), free of the cancellation of the difference. F₀ = E[g(cN)] − |c|H with the even, analytic
    g(m) = log(1 + e^{−|m|}) + |m|σ(−|m|) = log(2cosh(m/2)) − (m/2)tanh(m/2). All integrands are even and analytic in
    the strip |Im x| < π/|c|, so the trapezoid rule on the whole line converges geometrically: step
    h = 1/(1.6 + 2.1|c|), nodes out to where the integrands fall below e^{−38} of their scale (at most 156 on the
    half-line), relative error <= 4e-15. The nodes are uniform, so e^{−|c|kh} and e^{−(kh)²/2} are running products
    and 1 − e^{−(kh)²/2} a running sum of positive terms.
    """
    c = abs(c)
    h = 1.0 / (1.6 + 2.1 * c)
    far = math.sqrt(c * c + 76.0) - c  # |c|x + x²/2 = 38
    if c > 1.0:
        far = max(far, 42.0 / c)  # |c|σσ(cx)φ(0) and g(cx) below e^{−38} of their scale
    n = int(far / h) + 1
    ratio = math.exp(-c * h)
    gauss_step = math.exp(-0.5 * h * h)  # r_k = e^{−(2k−1)h²/2}: e^{−(kh)²/2} = r_1 ⋯ r_k
    gauss_step_ratio = math.exp(-h * h)
    step_gap = -math.expm1(-0.5 * h * h)  # 1 − r_k, kept by sums of positive terms (no cancellation)
    ratio_gap = -math.expm1(-h * h)
    e = 1.0
    gauss = 1.0
    gauss_gap = 0.0  # 1 − e^{−(kh)²/2}
    total_F = 0.125  # half the k = 0 node: σσ(0) = 1/4
    total_H = 0.0  # φ(0) − φ(0) = 0 at k = 0
    total_G = 0.5 * math.log(2.0)  # g(0) = log 2
    for k in range(1, n + 1):
        e *= ratio
        gauss_gap += gauss * step_gap
        gauss *= gauss_step
        step_gap += gauss_step * ratio_gap
        gauss_step *= gauss_step_ratio
        s = e / ((1.0 + e) * (1.0 + e))
        total_F += s * gauss
        total_H += s * gauss_gap
        if with_softplus:
            total_G += (math.log1p(e) + c * k * h * e / (1.0 + e)) * gauss
    F = 2.0 * h * total_F / _SQRT_2PI
    H = 2.0 * h * c * total_H / _SQRT_2PI if c > 1.0 else 1.0 / _SQRT_2PI - c * F
    softplus = 2.0 * h * total_G / _SQRT_2PI - c * H if with_softplus else 0.0
    return F, H, softplus


@njit(cache=True)
def _position_only_gradient(beta, alpha, D, sigma_x):
    """(∂L/∂β, ∂L/∂α) of docs/group_sparse.md §6 with the skew part in closed form.

    U = a|G| + bZ with a = s*, b = s_o√(D − 1), ω = √(a² + b²), κ = Dβσ_x, c = κω, and (F, H) of
    :func:`_logistic_moments`:
        E[l''(κU)] = F,   E[l'(κU)U] = −a/√(2π) + κω²F = (ω − a)/√(2π) − ωH   (κ >= 0; −(ω + a)/√(2π) + ωH else),
        ∂L/∂β = Dσ_x E[l'(κU)U],   ∂L/∂α = κ[(1 − s*)E[l'(κU)U] − b²κE[l''(κU)]].
    """
    s_star, s_o = _attention(alpha, D)
    b = s_o * math.sqrt(D - 1)
    omega = math.sqrt(s_star * s_star + b * b)
    kappa = D * beta * sigma_x
    F, H, _ = _logistic_moments(kappa * omega, D < 0)  # D < 0 is False: a run-time flag, one compiled signature
    if kappa >= 0:
        E_dlU = b * b / (omega + s_star) / _SQRT_2PI - omega * H
    else:
        E_dlU = -(omega + s_star) / _SQRT_2PI + omega * H
    return D * sigma_x * E_dlU, kappa * ((D - 1) * s_o * E_dlU - b * b * kappa * F)


@njit(cache=True)
def _position_only_loss(beta, alpha, D, sigma_x):
    """L = (|κ|ω − κa)/√(2π) + E[log(1 + e^{−|c|·|N|})], c = κω (docs/group_sparse.md §6)."""
    s_star, s_o = _attention(alpha, D)
    b = s_o * math.sqrt(D - 1)
    omega = math.sqrt(s_star * s_star + b * b)
    kappa = D * beta * sigma_x
    softplus = _logistic_moments(kappa * omega, D > 0)[2]  # D > 0 is True: a run-time flag, one compiled signature
    skew = kappa * b * b / (omega + s_star) if kappa >= 0 else -kappa * (omega + s_star)  # |κ|ω − κa
    return skew / _SQRT_2PI + softplus


@njit(cache=True)
def _position_only_losses(beta, alpha, D, sigma_x):
    out = np.empty(beta.size)
    for i in range(beta.size):
        out[i] = _position_only_loss(beta[i], alpha[i], D, sigma_x)
    return out


def position_only_terms(problem: GroupSparseProblem, beta: float, alpha: float):
    """(L, ∂L/∂β, ∂L/∂α) of the position-only sub-model at (β, α) (docs/group_sparse.md §6); d does not enter."""
    beta = check.real(beta, "beta")
    alpha = check.real(alpha, "alpha")
    loss = _position_only_loss(beta, alpha, problem.D, problem.sigma_x)
    return (loss, *_position_only_gradient(beta, alpha, problem.D, problem.sigma_x))


def position_only_loss(problem: GroupSparseProblem, beta, alpha) -> float | np.ndarray:
    """L(β, α) of the position-only sub-model (docs/group_sparse.md §6) at points given as two arrays of one shape (a
    float for scalars)."""
    beta = np.ascontiguousarray(check.finite_array(beta, "beta"), dtype=float)
    alpha = np.ascontiguousarray(check.finite_array(alpha, "alpha"), dtype=float)
    if beta.shape != alpha.shape:
        raise ValueError(f"alpha must have the shape of beta {beta.shape}, got {alpha.shape}")
    losses = _position_only_losses(beta.ravel(), alpha.ravel(), problem.D, problem.sigma_x)
    return float(losses[0]) if beta.ndim == 0 else losses.reshape(beta.shape)


@njit(cache=True)
def position_only_step(k, x, params):
    """GD on (β, α): β ← β − η∂L/∂β, α ← α − (η/(D − 1))∂L/∂α (docs/group_sparse.md §6); params = (D, σ_x, η)."""
    D = int(params[0])
    d_beta, d_alpha = _position_only_gradient(x[0], x[1], D, params[1])
    out = np.empty(2)
    out[0] = x[0] - params[2] * d_beta
    out[1] = x[1] - params[2] / (D - 1) * d_alpha
    return out


@njit(cache=True)
def position_only_flow_rhs_into(t, x, params, out):
    """Gradient-flow limit of :func:`position_only_step` in τ = ηt: dβ/dτ = −∂L/∂β, dα/dτ = −∂L/∂α/(D − 1)
    (docs/group_sparse.md §6), written into ``out`` (the integrator's in-place calling convention)."""
    D = int(params[0])
    d_beta, d_alpha = _position_only_gradient(x[0], x[1], D, params[1])
    out[0] = -d_beta
    out[1] = -d_alpha / (D - 1)


@njit(cache=True)
def position_only_flow_rhs(t, x, params):
    """The position-only flow's right-hand side as a new vector: :func:`position_only_flow_rhs_into`."""
    out = np.empty(2)
    position_only_flow_rhs_into(t, x, params, out)
    return out


def pack_position_only_params(problem: GroupSparseProblem, eta: float) -> np.ndarray:
    """params = (D, σ_x, η) of :func:`position_only_step` and :func:`position_only_flow_rhs`."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    return np.array([problem.D, problem.sigma_x, eta], dtype=float)


def asymptotic_loss_constant() -> float:
    """c = √(2/π)·π²/12: L ≈ c/(Dβσ_x) as s* → 1 and κ → ∞ (docs/group_sparse.md §6)."""
    return math.sqrt(2 / math.pi) * math.pi**2 / 12


# ==================================================================================================
# The symmetric manifold of the full model (docs/group_sparse.md §5)
# ==================================================================================================


def symmetric_coordinates(problem: GroupSparseProblem, v: np.ndarray, W: np.ndarray) -> dict:
    """The six scalars of docs/group_sparse.md §5 and the size of everything the symmetries force to zero.

    Returns β = <v₁, v*>, c_par = v*ᵀW₁₁v*, c_perp = tr((I − v*v*ᵀ)W₁₁)/(d − 1) (nan for d = 1), the W₂₂ entries
    w_** (key j*, query j*), w_*o (key j*, other query), w_o* , and the residuals: ‖v₁ − βv*‖, ‖v₂‖, ‖W₁₂‖, ‖W₂₁‖,
    the largest |column sum| of W₂₂, and ‖W₂₂ − its permutation-symmetric part‖.
    """
    d, D, s = problem.d, problem.D, problem.star
    v = check.finite_array(v, "v", shape=(d + D,))
    W = check.finite_array(W, "W", shape=(d + D, d + D))
    v1, v2 = v[:d], v[d:]
    W11, W12, W21, W22 = W[:d, :d], W[:d, d:], W[d:, :d], W[d:, d:]
    u = problem.v_star
    beta = float(u @ v1)
    c_par = float(u @ W11 @ u)
    projector = np.eye(d) - np.outer(u, u)
    c_perp = float(np.trace(projector @ W11) / (d - 1)) if d > 1 else float("nan")
    others = [j for j in range(D) if j != s]
    w_ss = float(W22[s, s])
    w_so = float(np.mean(W22[s, others]))  # key j*, query other
    w_os = float(np.mean(W22[others, s]))
    w_oo = float(np.mean(W22[others, others]))
    off = [(k, j) for k in others for j in others if k != j]
    w_oo2 = float(np.mean([W22[k, j] for k, j in off])) if off else 0.0
    symmetric = np.full((D, D), w_oo2)
    symmetric[others, others] = w_oo
    symmetric[s, others] = w_so
    symmetric[others, s] = w_os
    symmetric[s, s] = w_ss
    W11_model = c_par * np.outer(u, u) + (c_perp if d > 1 else 0.0) * projector
    return dict(beta=beta, c_par=c_par, c_perp=c_perp, w_star_star=w_ss, w_star_other=w_so, w_other_star=w_os,
                v1_off_direction=float(np.linalg.norm(v1 - beta * u)), v2=float(np.linalg.norm(v2)),
                W12=float(np.linalg.norm(W12)), W21=float(np.linalg.norm(W21)),
                W22_column_sum=float(np.abs(W22.sum(axis=0)).max()),
                W22_asymmetry=float(np.linalg.norm(W22 - symmetric)),
                W11_off_model=float(np.linalg.norm(W11 - W11_model)))
