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
* the position-only sub-model (W₁₁ frozen at 0; docs/group_sparse.md §6): two scalars (β, α) whose loss and gradient are 1-D
  integrals against a skew-normal law, computed by quadrature (:func:`position_only_terms`), and its GD map.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import checks as check
from .parameters import Parameter, parse_parameters

__all__ = ["GroupSparseProblem", "first_step_v", "attention_weights", "position_only_terms",
           "position_only_step", "position_only_flow_rhs", "pack_position_only_params", "asymptotic_loss_constant", "symmetric_coordinates"]


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
    if alpha > 0:
        s_o = math.exp(-alpha) / (1 + (D - 1) * math.exp(-alpha))
        return 1 - (D - 1) * s_o, s_o
    denominator = math.exp(alpha) + D - 1
    return math.exp(alpha) / denominator, 1 / denominator


# ==================================================================================================
# Position-only sub-model (docs/group_sparse.md §6)
# ==================================================================================================


@njit(cache=True)
def _log1pexp(x):
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


@njit(cache=True)
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@njit(cache=True)
def _position_only_kernel(beta, alpha, D, sigma_x, n_nodes):
    """(L, ∂L/∂β, ∂L/∂α) by trapezoid over x against the skew-normal density 2φ(x)Φ(λx) (docs/group_sparse.md §6).

    U = s*|G| + s_o√(D−1)Z = ω·X, X skew-normal(λ), a = s*, b = s_o√(D−1), ω = √(a² + b²), λ = a/b, κ = Dβσ_x:
        L = E[l(κU)],  ∂L/∂β = Dσ_x E[l'(κU)U],  ∂L/∂α = κ[(1 − s*)E[l'(κU)U] − b²κE[l''(κU)]],
    l(m) = log(1 + e^{−m}). Nodes: a uniform grid on [−14, 14] merged with grids of half-width min(14, 60/(κω))
    (where l(κωx) turns over when κ is large) and min(14, 60/λ) (where Φ(λx) steps up when s* → 1).
    """
    if alpha > 0:
        s_o = math.exp(-alpha) / (1.0 + (D - 1) * math.exp(-alpha))
        s_star = 1.0 - (D - 1) * s_o
    else:
        s_star = math.exp(alpha) / (math.exp(alpha) + D - 1)
        s_o = 1.0 / (math.exp(alpha) + D - 1)
    a = s_star
    b = s_o * math.sqrt(D - 1)
    omega = math.sqrt(a * a + b * b)
    lam = a / b
    kappa = D * beta * sigma_x
    half_loss = min(14.0, 60.0 / max(kappa * omega, 1e-300))
    half_skew = min(14.0, 60.0 / lam) if lam > 0.0 else 14.0  # s* underflows to 0 below α ≈ −745: Φ(0x) is flat
    x = np.concatenate((np.linspace(-14.0, 14.0, n_nodes), np.linspace(-half_loss, half_loss, n_nodes),
                        np.linspace(-half_skew, half_skew, n_nodes)))
    x.sort()
    E_l = 0.0
    E_dlU = 0.0
    E_d2l = 0.0
    for i in range(x.size - 1):
        for end in range(2):
            xi = x[i + end]
            weight = 0.5 * (x[i + 1] - x[i])
            density = 2.0 * math.exp(-0.5 * xi * xi) / math.sqrt(2.0 * math.pi) * 0.5 * math.erfc(-lam * xi / math.sqrt(2.0))
            U = omega * xi
            m = kappa * U
            E_l += weight * density * _log1pexp(-m)
            E_dlU += weight * density * (-_sigmoid(-m)) * U
            E_d2l += weight * density * _sigmoid(m) * _sigmoid(-m)
    d_beta = D * sigma_x * E_dlU
    d_alpha = kappa * ((1.0 - s_star) * E_dlU - b * b * kappa * E_d2l)
    return E_l, d_beta, d_alpha


# Nodes per grid of the position-only quadrature. Relative change against 4x the nodes: <= 3e-6 at the points of
# docs/group_sparse.md §6, 2e-5 at (β, α) = (50, 9), 2e-4 at (200, 12) (second order where the grids change spacing).
POSITION_ONLY_NODES = 1501


def position_only_terms(problem: GroupSparseProblem, beta: float, alpha: float, n_nodes: int = POSITION_ONLY_NODES):
    """(L, ∂L/∂β, ∂L/∂α) of the position-only sub-model at (β, α) (docs/group_sparse.md §6); d does not enter."""
    beta = check.real(beta, "beta")
    alpha = check.real(alpha, "alpha")
    n_nodes = check.integer(n_nodes, "n_nodes", minimum=101)
    return _position_only_kernel(beta, alpha, problem.D, problem.sigma_x, n_nodes)


@njit(cache=True)
def position_only_step(k, x, params):
    """GD on (β, α): β ← β − η∂L/∂β, α ← α − (η/(D − 1))∂L/∂α (docs/group_sparse.md §6); params = (D, σ_x, η, n_nodes)."""
    D = int(params[0])
    _, d_beta, d_alpha = _position_only_kernel(x[0], x[1], D, params[1], int(params[3]))
    out = np.empty(2)
    out[0] = x[0] - params[2] * d_beta
    out[1] = x[1] - params[2] / (D - 1) * d_alpha
    return out


@njit(cache=True)
def position_only_flow_rhs(t, x, params):
    """Gradient-flow limit of :func:`position_only_step` in τ = ηt: dβ/dτ = −∂L/∂β, dα/dτ = −∂L/∂α/(D − 1)."""
    D = int(params[0])
    _, d_beta, d_alpha = _position_only_kernel(x[0], x[1], D, params[1], int(params[3]))
    out = np.empty(2)
    out[0] = -d_beta
    out[1] = -d_alpha / (D - 1)
    return out


def pack_position_only_params(problem: GroupSparseProblem, eta: float, n_nodes: int = POSITION_ONLY_NODES) -> np.ndarray:
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    n_nodes = check.integer(n_nodes, "n_nodes", minimum=101)
    return np.array([problem.D, problem.sigma_x, eta, n_nodes], dtype=float)


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
