"""GD-β, the linear transformer block (LTB) and linear self-attention (LSA) for in-context linear regression.

Paper: R. Zhang, J. Wu, P. L. Bartlett, *In-Context Learning of a Linear Transformer Block: Benefits of the
MLP Component and One-Step GD Initialization*, NeurIPS 2024, arXiv:2402.14951. Section numbers "docs/gd_beta.md §k"
number the derivation notes that restore the paper's stripped mathematics; docs/gd_beta.md holds the derivations.

Data (Assumption 3.1): β ~ N(β*, Ψ); x_1..x_N, x_q ~ N(0, H); y_i = <x_i, β> + ε_i, ε ~ N(0, σ²).
GD-β (5.1): ŷ = x_qᵀ β̂ with β̂ = β₀ − (1/N) Γ Xᵀ(Xβ₀ − y).
LTB (3.3) in reduced coordinates (docs/gd_beta.md §2.1): ŷ = x_qᵀ [c + Qᵀ g + q r], with g = Xᵀ(Xa + b y)/N and
r = yᵀ(Xa + b y)/N. LSA (3.4) is the LTB without the MLP: c = 0.

Conventions (docs/gd_beta.md §11): context length N; Γ acts as in (5.1) (not transposed); gradient flow on the risk with
no factor ½; singular H, Ψ handled with pseudo-inverse square roots.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit
from scipy.optimize import minimize

from . import checks as check
from .parameters import Parameter, parse_parameters, square_matrix
from .linalg import numerical_rank, psd_eigh, psd_power, range_basis
from .linear_icl import omega_matrix, optimal_step_matrix, preconditioned_gd_risk, spectral_optimal_risk

__all__ = ["ltb_embedding", "context_gd_step", 
    "GDBetaProblem",
    "icl_risk",
    "excess_risk_parts",
    "omega",
    "optimal_gamma",
    "optimal_risk",
    "optimal_risk_eigen",
    "gd0_optimal_risk",
    "bayes_conditional_excess",
    "bayes_estimate",
    "gd_beta_predict",
    "ltb_forward",
    "ltb_reduced_coordinates",
    "ltb_reduced_predict",
    "readout_moments",
    "readout_risk",
    "optimal_readout_risk",
    "OptimalReadout",
    "optimal_attention_risk",
    "beta_curvature",
    "risk_gradient",
    "gradient_flow_rhs",
    "gradient_flow_rhs_into",
    "pack_flow_params",
    "flow_state",
    "unpack_flow_state",
    "flow_limit",
    "LocalRates",
    "local_rates",
    "flow_curvature",
    "SlowModes",
    "slow_modes",
    "gamma_response",
    "risk_hessian",
    "conditional_gradient_moments",
    "conditional_gradient_moments_by_batch",
    "moment_sums_by_batch",
    "check_parameters",
    "snr",
    "excess_risk_sandwich",
    "large_context_ratio_limit",
           "ltb_embedding"]


# ==================================================================================================
# Problem
# ==================================================================================================


def _read_only(array: np.ndarray) -> np.ndarray:
    """Cached arrays are shared by every caller, so none of them may write into one."""
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class GDBetaProblem:
    """In-context linear regression with a non-zero-mean task prior (Assumption 3.1).

    Parameters
    ----------
    H : array_like, shape (d, d)
        Feature covariance, symmetric PSD (rank-deficient allowed).
    Psi : array_like, shape (d, d)
        Task covariance Ψ, symmetric PSD.
    beta_star : array_like, shape (d,)
        Task mean β*.
    sigma2 : float
        Label-noise variance σ² >= 0.
    N : int
        Context length, >= 1.
    """

    H: np.ndarray
    Psi: np.ndarray
    beta_star: np.ndarray
    sigma2: float
    N: int

    def __post_init__(self):
        H = check.symmetric_psd(self.H, "H")
        d = H.shape[0]
        if d < 1:
            raise ValueError("H must be at least 1x1 (d >= 1)")
        object.__setattr__(self, "H", H)
        object.__setattr__(self, "Psi", check.symmetric_psd(self.Psi, "Psi", size=d))
        object.__setattr__(self, "beta_star", check.finite_array(self.beta_star, "beta_star", shape=(d,)))
        object.__setattr__(self, "sigma2", check.real(self.sigma2, "sigma2", minimum=0.0))
        object.__setattr__(self, "N", check.integer(self.N, "N", minimum=1))
        # The closed forms multiply up to four of these (fourth moments): beyond 1e75 an intermediate overflows.
        for name in ("H", "Psi", "beta_star", "sigma2"):
            size = float(np.max(np.abs(getattr(self, name)))) if np.size(getattr(self, name)) else 0.0
            if size > 1e75:
                raise ValueError(f"{name} has entries of size {size:.3g}; at most 1e75 keeps the fourth moments finite")

    # ---- constructors ----------------------------------------------------------------------------
    @classmethod
    def isotropic(cls, d: int = 2, N: int = 10, sigma2: float = 0.25, beta_norm: float = 1.0,
                  psi: float = 1.0, h: float = 1.0) -> "GDBetaProblem":
        """H = h·I, Ψ = ψ·I, β* = beta_norm · e_1 (docs/gd_beta.md §6 golden configuration at the defaults)."""
        d = check.integer(d, "d", minimum=1)
        beta_star = np.zeros(d)
        beta_star[0] = check.real(beta_norm, "beta_norm")
        return cls(H=h * np.eye(d), Psi=psi * np.eye(d), beta_star=beta_star, sigma2=sigma2, N=N)

    @classmethod
    def random(cls, d: int, N: int, *, seed, sigma2: float = 0.5, beta_norm: float = 1.0,
               rank_H: int | None = None, rank_Psi: int | None = None,
               spectrum: tuple[float, float] = (0.25, 1.0)) -> "GDBetaProblem":
        """A random instance: H and Ψ with eigenvalues uniform in ``spectrum`` under independent random
        rotations (so the condition number is bounded by construction), the smallest ``d − rank`` eigenvalues
        set to 0 for the given ranks (full by default), and β* uniform on the sphere of radius ``beta_norm``.

        ``seed`` is anything ``numpy.random.default_rng`` accepts (an int or a ``SeedSequence``). Randomness is
        confined to this constructor; the closed forms themselves are deterministic.
        """
        d = check.integer(d, "d", minimum=1)
        rank_H = d if rank_H is None else check.integer(rank_H, "rank_H", minimum=0)
        rank_Psi = d if rank_Psi is None else check.integer(rank_Psi, "rank_Psi", minimum=0)
        if rank_H > d or rank_Psi > d:
            raise ValueError(f"rank_H and rank_Psi must be <= d = {d}")
        low, high = (check.real(v, "spectrum", minimum=0.0, strict=True) for v in spectrum)
        if low > high:
            raise ValueError(f"spectrum must be (low, high) with low <= high, got {spectrum}")
        rng = np.random.default_rng(seed)

        def random_psd(rank):
            rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
            eigenvalues = np.sort(rng.uniform(low, high, size=d))[::-1]
            eigenvalues[rank:] = 0.0
            matrix = (rotation * eigenvalues) @ rotation.T
            return (matrix + matrix.T) / 2

        direction = rng.normal(size=d)
        beta_star = beta_norm * direction / np.linalg.norm(direction)
        return cls(H=random_psd(rank_H), Psi=random_psd(rank_Psi), beta_star=beta_star, sigma2=sigma2, N=N)

    PARAMETERS = (
        Parameter("d", "integer", None, "dimension (default 2, or the size of H or Psi)", minimum=1, maximum=1000),
        Parameter("N", "integer", 10, "context length", minimum=1, maximum=100_000),
        Parameter("sigma2", "real", 0.25, "noise variance σ²", minimum=0.0),
        Parameter("H", "matrix", 1.0, "feature covariance: a scalar (·I), a comma list (diagonal) or rows 'a,b;c,d'"),
        Parameter("Psi", "matrix", 1.0, "task covariance Ψ, in the same forms as H"),
        Parameter("beta_star", "vector", None, "task mean β* as a comma list (default beta_norm·e₁)"),
        Parameter("beta_norm", "real", 1.0, "‖β*‖ when beta_star is not given", minimum=0.0),
    )

    @classmethod
    def from_params(cls, values) -> "GDBetaProblem":
        """A problem from named text or values (``PARAMETERS``): H and Ψ as a scalar multiple of I, a diagonal
        or a full matrix; β* given, or beta_norm·e₁."""
        p = parse_parameters(cls.PARAMETERS, values, owner="gd_beta")
        sizes = [np.shape(p[k])[0] for k in ("H", "Psi") if np.ndim(p[k]) > 0]
        if p["beta_star"] is not None:
            sizes.append(p["beta_star"].size)
        d = p["d"] if p["d"] is not None else (sizes[0] if sizes else 2)

        if p["beta_star"] is not None:
            beta_star = p["beta_star"]
        else:
            beta_star = np.zeros(d)
            beta_star[0] = p["beta_norm"]
        return cls(H=square_matrix(p["H"], "H", d), Psi=square_matrix(p["Psi"], "Psi", d), beta_star=beta_star,
                   sigma2=p["sigma2"], N=p["N"])

    def replace(self, **changes) -> "GDBetaProblem":
        fields = dict(H=self.H, Psi=self.Psi, beta_star=self.beta_star, sigma2=self.sigma2, N=self.N)
        fields.update(changes)
        return GDBetaProblem(**fields)

    # ---- derived quantities (computed once) --------------------------------------------------------
    @property
    def d(self) -> int:
        return self.H.shape[0]

    @cached_property
    def H_half(self) -> np.ndarray:
        """H^{1/2}."""
        return psd_power(self.H, 0.5)

    @cached_property
    def H_half_pinv(self) -> np.ndarray:
        """H^{+1/2} = (H^{1/2})⁺ (docs/gd_beta.md §4)."""
        return psd_power(self.H, -0.5)

    @cached_property
    def Psi_half(self) -> np.ndarray:
        return psd_power(self.Psi, 0.5)

    @cached_property
    def Psi_tilde(self) -> np.ndarray:
        """Whitened task covariance Ψ̃ = H^{1/2} Ψ H^{1/2} (docs/gd_beta.md §1)."""
        return self.H_half @ self.Psi @ self.H_half

    @cached_property
    def psi(self) -> np.ndarray:
        """Eigenvalues ψ₁ >= … >= ψ_d >= 0 of Ψ̃."""
        return psd_eigh(self.Psi_tilde)[0][::-1].copy()

    @cached_property
    def H_range_basis(self) -> np.ndarray:
        """Orthonormal basis (columns) of range(H), with the one rank cut-off of :mod:`linalg`."""
        return _read_only(range_basis(self.H))

    @cached_property
    def H_range_projector(self) -> np.ndarray:
        """P_R, the orthogonal projector onto range(H)."""
        return _read_only(self.H_range_basis @ self.H_range_basis.T)

    @cached_property
    def Omega(self) -> np.ndarray:
        """Ω = (N+1)/N Ψ̃ + (tr Ψ̃ + σ²)/N I (docs/gd_beta.md §3, probably the paper's (A.3))."""
        return _read_only(_omega_of(self, self.Psi_tilde))

    @cached_property
    def Gamma_star(self) -> np.ndarray:
        """Γ* = H^{+1/2} Ψ̃ Ω⁻¹ H^{+1/2}, Theorem 5.2 eq. (5.3)."""
        self.require_optimum_defined()
        return _read_only(optimal_step_matrix(self.H_half_pinv, self.Psi_tilde, self.Omega))

    @property
    def beta_norm_H(self) -> float:
        """‖β*‖_H = sqrt(β*ᵀ H β*)."""
        return float(np.sqrt(max(self.beta_star @ self.H @ self.beta_star, 0.0)))

    def require_optimum_defined(self) -> None:
        """The optimal formulas need Ω invertible: σ² > 0 or tr(HΨ) > 0 (docs/gd_beta.md §1)."""
        if self.sigma2 == 0.0 and np.trace(self.Psi_tilde) <= 0.0:
            raise ValueError("sigma2 must be > 0 when tr(H Psi) = 0: the optimal GD-beta risk is undefined")


# ==================================================================================================
# ICL risk of GD-β and its optimum (docs/gd_beta.md §3-4)
# ==================================================================================================


def _omega_of(problem: GDBetaProblem, S_tilde: np.ndarray) -> np.ndarray:
    """Ω(S̃) = (N+1)/N S̃ + (tr S̃ + σ²)/N I (docs/gd_beta.md §3)."""
    return omega_matrix(S_tilde, problem.sigma2, problem.N)


def check_parameters(problem: GDBetaProblem, beta0, Gamma) -> tuple[np.ndarray, np.ndarray]:
    """A single (β₀, Γ), shapes (d,) and (d, d), checked as every closed form checks its parameters (finite, and
    at most 1e75 in size so that the quartic terms stay finite); read-only C-ordered copies."""
    beta0, Gamma = _gd_beta_parameters(problem, beta0, Gamma, order="C")
    if beta0.ndim != 1 or Gamma.ndim != 2:
        raise ValueError(f"beta0 and Gamma must be a single pair, shapes ({problem.d},) and ({problem.d}, "
                         f"{problem.d}), not a batch: got {beta0.shape} and {Gamma.shape}")
    return beta0, Gamma


def _gd_beta_parameters(problem: GDBetaProblem, beta0, Gamma, order: str = "K") -> tuple[np.ndarray, np.ndarray]:
    """Validated read-only copies of (β₀, Γ) (C-ordered with ``order="C"``): finite, shapes (..., d) and
    (..., d, d)."""
    d = problem.d
    beta0 = check.finite_array(beta0, "beta0", order=order)
    Gamma = check.finite_array(Gamma, "Gamma", order=order)
    if beta0.ndim < 1 or beta0.shape[-1] != d:
        raise ValueError(f"beta0 must have shape (..., {d}), got {beta0.shape}")
    if Gamma.ndim < 2 or Gamma.shape[-2:] != (d, d):
        raise ValueError(f"Gamma must have shape (..., {d}, {d}), got {Gamma.shape}")
    for name, value in (("beta0", beta0), ("Gamma", Gamma)):
        if value.size and float(np.max(np.abs(value))) > 1e75:  # the risk is a quartic: its terms must stay finite
            raise ValueError(f"{name} has entries of size {float(np.max(np.abs(value))):.3g}; at most 1e75 keeps "
                             "the risk's fourth-order terms finite")
    return beta0, Gamma


def icl_risk(problem: GDBetaProblem, beta0, Gamma) -> np.ndarray:
    """Closed-form ICL risk R(β₀, Γ) of GD-β, docs/gd_beta.md §3 (boxed), any PSD H, Ψ and any Γ.

    R = σ² + tr(HS) − 2 tr(HΓHS) + (N+1)/N tr(ΓᵀHΓ HSH) + (tr(HS) + σ²)/N tr(ΓᵀHΓH),
    S = Ψ + (β* − β₀)(β* − β₀)ᵀ.

    Parameters
    ----------
    beta0 : array_like, shape (..., d)
    Gamma : array_like, shape (..., d, d)
        Leading axes broadcast (a whole trajectory at once).

    Returns
    -------
    ndarray, shape (...)
    """
    H, N, sigma2 = problem.H, problem.N, problem.sigma2
    beta0, Gamma = _gd_beta_parameters(problem, beta0, Gamma)
    e = problem.beta_star - beta0
    S = problem.Psi + e[..., :, None] * e[..., None, :]
    return preconditioned_gd_risk(H, S, sigma2, N, Gamma)


def omega(problem: GDBetaProblem) -> np.ndarray:
    """Ω = (N+1)/N Ψ̃ + (tr Ψ̃ + σ²)/N I (docs/gd_beta.md §3, probably the paper's (A.3)); cached on the problem."""
    return problem.Omega


def optimal_gamma(problem: GDBetaProblem) -> np.ndarray:
    """Γ* = H^{+1/2} Ψ̃ Ω⁻¹ H^{+1/2}, Theorem 5.2 eq. (5.3); symmetric PSD. Together with β₀* = β*.
    Cached on the problem (read-only)."""
    return problem.Gamma_star


def optimal_risk(problem: GDBetaProblem) -> float:
    """R* = σ² + tr Ψ̃ − tr(Ψ̃ Ω⁻¹ Ψ̃), Theorem 5.2 eq. (5.2), matrix form."""
    problem.require_optimum_defined()
    Pt = problem.Psi_tilde
    return float(problem.sigma2 + np.trace(Pt) - np.trace(Pt @ np.linalg.solve(omega(problem), Pt)))


def optimal_risk_eigen(problem: GDBetaProblem) -> float:
    """R* = σ² + Σᵢ ψᵢ(ψᵢ + s) / ((N+1)ψᵢ + s), s = tr Ψ̃ + σ², eq. (5.2), eigenvalue form."""
    problem.require_optimum_defined()
    return spectral_optimal_risk(problem.psi, problem.sigma2, problem.N)


def excess_risk_parts(problem: GDBetaProblem, beta0, Gamma) -> tuple[float, float]:
    """The two terms of R − R* (Corollary G.1, docs/gd_beta.md §3): (μ̃ᵀA(Γ̃)μ̃, ‖(Γ̃ − Γ̃*)Ω^{1/2}‖²_F).

    The first is the only place β₀ enters; for fixed Γ it is a strongly convex quadratic in H^{1/2}β₀.
    """
    problem.require_optimum_defined()
    d, N = problem.d, problem.N
    beta0, Gamma = _gd_beta_parameters(problem, beta0, Gamma)
    Hh = problem.H_half
    mu = Hh @ (problem.beta_star - beta0)
    Gt = Hh @ Gamma @ Hh
    Om = omega(problem)
    I_minus = np.eye(d) - Gt
    A = I_minus.T @ I_minus + Gt.T @ Gt / N + np.sum(Gt * Gt) / N * np.eye(d)
    diff = Gt - problem.Psi_tilde @ np.linalg.inv(Om)
    return float(mu @ A @ mu), float(np.trace(diff @ Om @ diff.T))


def gd0_optimal_risk(problem: GDBetaProblem) -> float:
    """Optimal GD-0 risk (β₀ fixed at 0): the upper end of the LSA sandwich, docs/gd_beta.md §6.

    R*_GD0 = σ² + tr S̃₀ − tr(S̃₀ Ω(S̃₀)⁻¹ S̃₀), S̃₀ = H^{1/2}(Ψ + β*β*ᵀ)H^{1/2}.
    """
    problem.require_optimum_defined()
    S0 = problem.H_half @ (problem.Psi + np.outer(problem.beta_star, problem.beta_star)) @ problem.H_half
    return float(problem.sigma2 + np.trace(S0) - np.trace(S0 @ np.linalg.solve(_omega_of(problem, S0), S0)))


# ==================================================================================================
# Bayes (Lemma 6.1, docs/gd_beta.md §7)
# ==================================================================================================


def _check_contexts(problem: GDBetaProblem, X, y) -> tuple[np.ndarray, np.ndarray]:
    """Contexts X (..., N, d) and labels y (..., N), finite and of matching shapes."""
    X = check.finite_array(X, "X")
    if X.ndim < 2 or X.shape[-2:] != (problem.N, problem.d):
        raise ValueError(f"X must have shape (..., N, d) = (..., {problem.N}, {problem.d}), got {X.shape}")
    y = check.finite_array(y, "y", shape=X.shape[:-1])
    return X, y


def bayes_estimate(problem: GDBetaProblem, X, y) -> np.ndarray:
    """Posterior mean β̂ = β* + ΨXᵀ(XΨXᵀ + σ²I)⁺(y − Xβ*) (Lemma 6.1; pseudo-inverse covers σ² = 0).

    X : shape (..., N, d); y : shape (..., N). Returns shape (..., d).
    """
    X, y = _check_contexts(problem, X, y)
    resid = y - X @ problem.beta_star
    Xt = np.swapaxes(X, -1, -2)
    gram = X @ problem.Psi @ Xt + problem.sigma2 * np.eye(X.shape[-2])
    weights = np.linalg.pinv(gram, hermitian=True) @ resid[..., None]
    return problem.beta_star + (problem.Psi @ Xt @ weights)[..., 0]


def bayes_conditional_excess(problem: GDBetaProblem, X) -> np.ndarray:
    """E[excess risk | X] of the posterior mean, docs/gd_beta.md §7: tr(Σ (I + X̃ᵀX̃/σ²)⁻¹), X̃ = XΨ^{1/2}.

    Averaging this over X ~ N(0, H)^N gives R_Bayes − σ² with far smaller variance than sampling whole
    prompts. For σ² = 0 it is tr(Σ P⊥) with P⊥ the projector on the null space of X̃ (docs/gd_beta.md §11.10).
    X : shape (n, N, d). Returns shape (n,).

    Once σ² is below EIGEN_FORM_BELOW·N‖Σ‖ (the scale of G = X̃ᵀX̃), a null direction of G, computed at round-off
    ~1e-16·N‖Σ‖ instead of 0, would get the weight σ²/(σ² + round-off) instead of 1 (and G/σ² overflows below
    ~1e-300): there (I + G/σ²)⁻¹ = V diag(σ²/(σ² + λ)) Vᵀ from the eigenpairs of G, eigenvalues at round-off level
    (below d·N·ε·λ_max) set to exactly 0. The limit σ² → 0 is then exact: the projector on the null space, and
    exactly 0 when G has full rank.
    """
    X = check.finite_array(X, "X", ndim=3)
    if X.shape[1:] != (problem.N, problem.d):
        raise ValueError(f"X must have shape (n, N, d) = (n, {problem.N}, {problem.d}), got {X.shape}")
    Ph = problem.Psi_half
    Sigma = Ph @ problem.H @ Ph
    Xt = X @ Ph
    G = np.swapaxes(Xt, -1, -2) @ Xt
    sigma2 = problem.sigma2
    if sigma2 >= EIGEN_FORM_BELOW * problem.N * np.linalg.norm(Sigma, 2):
        M = np.linalg.inv(np.eye(problem.d) + G / sigma2)
    else:
        lam, V = np.linalg.eigh(G)
        round_off = problem.d * problem.N * np.finfo(float).eps * np.maximum(lam[..., -1:], 0.0)
        lam = np.where(lam > round_off, lam, 0.0)
        weight = (lam == 0).astype(float) if sigma2 == 0 else sigma2 / (sigma2 + lam)
        M = (V * weight[..., None, :]) @ np.swapaxes(V, -1, -2)
    return np.einsum("ij,nji->n", Sigma, M)


# Below this noise variance, relative to the scale N‖Σ‖ of X̃ᵀX̃, the Bayes formula switches to its eigen-form:
# (I + G/σ²)⁻¹ would weigh a null direction's round-off (~1e-16 of the scale) against σ².
EIGEN_FORM_BELOW = 1e-8


# ==================================================================================================
# Predictors (the models as functions of a prompt)
# ==================================================================================================


def _check_prompt(X, y, x_query, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A prompt (or a batch): X (..., N, d), y (..., N), x_query (..., d), finite and of matching shapes."""
    X = check.finite_array(X, "X")
    if X.ndim < 2 or X.shape[-1] != d:
        raise ValueError(f"X must have shape (..., N, d) with d = {d} (the size of beta0, a), got {X.shape}")
    y = check.finite_array(y, "y", shape=X.shape[:-1])
    x_query = check.finite_array(x_query, "x_query", shape=X.shape[:-2] + (d,))
    return X, y, x_query


def gd_beta_predict(X, y, x_query, beta0, Gamma) -> np.ndarray:
    """GD-β prediction (5.1): x_qᵀ[β₀ − (1/N)ΓXᵀ(Xβ₀ − y)]. X (..., N, d), y (..., N), x_query (..., d)."""
    beta0 = check.finite_array(beta0, "beta0", ndim=1)
    d = beta0.size
    Gamma = check.finite_array(Gamma, "Gamma (d x d for beta0 of size d)", shape=(d, d))
    X, y, x_query = _check_prompt(X, y, x_query, d)
    N = X.shape[-2]
    grad = np.einsum("...nd,...n->...d", X, X @ beta0 - y) / N
    beta_hat = beta0 - grad @ np.asarray(Gamma).T
    return np.einsum("...d,...d->...", x_query, beta_hat)


def ltb_embedding(beta0, Gamma) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lemma 5.1: the LTB weights that compute GD-β with (β₀, Γ): U = e_{d+1}(β₀ᵀ, 0), V = e_{d+1}(−β₀ᵀ, 1),
    K = [[Γᵀ, 0], [0, 0]], each (d+1) × (d+1); ``ltb_forward`` with them equals ``gd_beta_predict``."""
    beta0 = check.finite_array(beta0, "beta0", ndim=1)
    d = beta0.size
    Gamma = check.finite_array(Gamma, "Gamma (d x d for beta0 of size d)", shape=(d, d))
    U, V, K = (np.zeros((d + 1, d + 1)) for _ in range(3))
    U[d, :d] = beta0
    V[d, :d], V[d, d] = -beta0, 1.0
    K[:d, :d] = Gamma.T
    return U, V, K


def _check_ltb_weights(U, V, K, size: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(U, V, K), each finite and (d+1) × (d+1) (of the size of K, or ``size``)."""
    K = check.finite_array(K, "K", ndim=2)
    size = K.shape[0] if size is None else size
    if K.shape != (size, size) or size < 2:
        raise ValueError(f"K must be (d+1) x (d+1) = {size} x {size} with d >= 1, got {K.shape}")
    return (check.finite_array(U, "U", shape=(size, size)), check.finite_array(V, "V", shape=(size, size)), K)


def ltb_forward(E, U, V, K, *, mlp: bool = True) -> np.ndarray:
    """Full LTB forward pass (3.3) on token matrices: the bottom-right entry of
    (I + U)(E + (1/N) V E M Eᵀ K E), with U = W₂ᵀW₁, V = W^P W^V, K = W^{K⊤}W^Q and mask M = diag(I_N, 0).

    ``mlp=False`` gives LSA (3.4) (U = 0). E : shape (..., d+1, N+1). Returns shape (...).
    """
    E = check.finite_array(E, "E")
    if E.ndim < 2 or E.shape[-1] < 2:
        raise ValueError(f"E must have shape (..., d+1, N+1) with N >= 1, got {E.shape}")
    U, V, K = _check_ltb_weights(U, V, K, E.shape[-2])
    mlp = check.boolean(mlp, "mlp")
    N = E.shape[-1] - 1
    context = E[..., :, :N]
    attention = V @ (context @ np.swapaxes(context, -1, -2)) @ K @ E / N
    Z = E + attention
    if mlp:
        Z = (np.eye(E.shape[-2]) + U) @ Z
    return Z[..., -1, -1]


def ltb_reduced_coordinates(U, V, K, *, mlp: bool = True):
    """(c, a, b, Q, q) of docs/gd_beta.md §2.1: what of (U, V, K) reaches the output.

    c: first d entries of the last row of I + U (0 without MLP); (aᵀ, b): last row of (I + U)V;
    (Q; qᵀ): the first d columns of K.
    """
    U, V, K = _check_ltb_weights(U, V, K)
    mlp = check.boolean(mlp, "mlp")
    D = K.shape[0]
    d = D - 1
    IU = np.eye(D) + (U if mlp else 0.0)
    c = IU[-1, :d] if mlp else np.zeros(d)
    row = (IU @ V)[-1]
    return c, row[:d], row[d], K[:d, :d], K[d, :d]


def ltb_reduced_predict(X, y, x_query, c, a, b, Q, q) -> np.ndarray:
    """Reduced LTB prediction x_qᵀ[c + Qᵀg + q r], g = Xᵀ(Xa + by)/N, r = yᵀ(Xa + by)/N (docs/gd_beta.md §2.1)."""
    a = check.finite_array(a, "a", ndim=1)
    d = a.size
    X, y, x_query = _check_prompt(X, y, x_query, d)
    b = check.real(b, "b")
    c = check.finite_array(c, "c", shape=(d,))
    Q = check.finite_array(Q, "Q", shape=(d, d))
    q = check.finite_array(q, "q", shape=(d,))
    N = X.shape[-2]
    v = X @ a + b * y
    g = np.einsum("...nd,...n->...d", X, v) / N
    r = np.einsum("...n,...n->...", y, v) / N
    return np.einsum("...d,...d->...", x_query, c + g @ Q + q * r[..., None])


# ==================================================================================================
# Exact LSA / LTB risk for a linear read-out of φ = (1; g; r) (docs/gd_beta.md §6)
# ==================================================================================================


def _quadratic_product_mean(Psi, A1, v1, c1, A2, v2, c2) -> float:
    """E[(ξᵀA₁ξ + v₁ᵀξ + c₁)(ξᵀA₂ξ + v₂ᵀξ + c₂)] for ξ ~ N(0, Ψ), A₁, A₂ symmetric (docs/gd_beta.md §6)."""
    t1, t2 = np.trace(A1 @ Psi), np.trace(A2 @ Psi)
    return float(t1 * t2 + 2 * np.trace(A1 @ Psi @ A2 @ Psi) + c1 * t2 + c2 * t1 + v1 @ Psi @ v2 + c1 * c2)


def readout_moments(problem: GDBetaProblem, a, b: float, *, constant: bool):
    """Closed-form moments of the feature φ that an LSA/LTB reads out linearly (docs/gd_beta.md §6).

    φ = (g; r) for LSA and (1; g; r) for LTB (``constant=True``), with g = Xᵀ(Xa + by)/N, r = yᵀ(Xa + by)/N.

    Returns
    -------
    P : ndarray, shape (p, p)   E[φφᵀ]
    C : ndarray, shape (d, p)   E[βφᵀ]
    Xi : ndarray, shape (d, d)  E[ββᵀ] = Ψ + β*β*ᵀ
    """
    H, Psi, bs, N, s2 = problem.H, problem.Psi, problem.beta_star, problem.N, problem.sigma2
    d = problem.d
    a = check.finite_array(a, "a", shape=(d,))
    b = check.real(b, "b")
    constant = check.boolean(constant, "constant")
    Xi = Psi + np.outer(bs, bs)
    w0 = a + b * bs
    S_w = np.outer(w0, w0) + b * b * Psi
    t_psi = float(np.trace(H @ Psi))
    a2b = a + 2 * b * bs

    E_g = H @ w0
    E_r = w0 @ H @ bs + b * (t_psi + s2)
    E_beta_g = np.outer(bs, a) @ H + b * Xi @ H
    E_beta_r = Xi @ H @ a + b * (bs * (bs @ H @ bs + t_psi + s2) + 2 * Psi @ H @ bs)
    E_gg = (N + 1) / N * H @ S_w @ H + (np.trace(H @ S_w) + b * b * s2) / N * H
    E_gr = (
        (N + 1) / N * H @ (w0 * (w0 @ H @ bs) + b * t_psi * w0 + b * Psi @ H @ w0 + b * b * Psi @ H @ bs)
        + H @ ((w0 @ H @ w0 + b * b * t_psi) * bs + 2 * b * Psi @ H @ w0) / N
        + b * s2 / N * H @ a2b
        + b * s2 * H @ w0
    )
    # Products of Gaussian quadratic forms in ξ = β − β*: w = a + bβ.
    wHbeta = (b * H, H @ (w0 + b * bs), w0 @ H @ bs)
    wHw = (b * b * H, 2 * b * H @ w0, w0 @ H @ w0)
    betaHbeta = (H, 2 * H @ bs, bs @ H @ bs)
    E_r2 = (
        (N + 1) / N * _quadratic_product_mean(Psi, *wHbeta, *wHbeta)
        + _quadratic_product_mean(Psi, *wHw, *betaHbeta) / N
        + s2 / N * (a2b @ H @ a2b + 4 * b * b * t_psi)
        + b * b * s2 * s2 * (1 + 2 / N)
        + 2 * b * s2 * (b * t_psi + w0 @ H @ bs)
    )
    P = np.empty((d + 1, d + 1))
    P[:d, :d] = E_gg
    P[:d, d] = P[d, :d] = E_gr
    P[d, d] = E_r2
    C = np.column_stack([E_beta_g, E_beta_r])
    if constant:
        mean = np.append(E_g, E_r)
        P = np.block([[np.ones((1, 1)), mean[None, :]], [mean[:, None], P]])
        C = np.column_stack([bs, C])
    return (P + P.T) / 2, C, Xi


def readout_risk(problem: GDBetaProblem, a, b: float, W, *, constant: bool) -> float:
    """Exact risk of the read-out ŷ = x_qᵀ W φ: σ² + tr(H(Ξ − WCᵀ − CWᵀ + WPWᵀ)) (docs/gd_beta.md §6).

    W : shape (d, d+2) = [c, Qᵀ, q] for LTB (``constant=True``) or (d, d+1) = [Qᵀ, q] for LSA.
    """
    P, C, Xi = readout_moments(problem, a, b, constant=constant)
    W = check.finite_array(W, "W", shape=C.shape)
    return float(problem.sigma2 + np.trace(problem.H @ (Xi - W @ C.T - C @ W.T + W @ P @ W.T)))


def optimal_readout_risk(problem: GDBetaProblem, a, b: float, *, constant: bool) -> tuple[float, np.ndarray]:
    """min over W of the read-out risk for fixed value direction (a, b): σ² + tr(H(Ξ − CP⁺Cᵀ)); and the W."""
    P, C, Xi = readout_moments(problem, a, b, constant=constant)
    W = C @ np.linalg.pinv(P, rcond=1e-12, hermitian=True)
    return float(problem.sigma2 + np.trace(problem.H @ (Xi - W @ C.T))), W


@dataclass(frozen=True)
class OptimalReadout:
    """The infimum of a model class's risk and a parameter attaining it: value direction (a, b), read-out W."""

    risk: float
    a: np.ndarray
    b: float
    W: np.ndarray


def _sphere_starts(problem: GDBetaProblem) -> list[np.ndarray]:
    """Deterministic starting directions on S^d: GD-β's (−β*, 1), GD-0's (0, 1), ±coordinate axes and a
    golden-ratio (Kronecker) sequence; no random module in closed_forms."""
    d = problem.d
    starts = [np.append(-problem.beta_star, 1.0), np.append(np.zeros(d), 1.0)]
    for i in range(d + 1):
        for sign in (1.0, -1.0):
            axis = np.zeros(d + 1)
            axis[i] = sign
            starts.append(axis)
    alphas = np.mod(np.sqrt(np.arange(2, 2 + d + 1) + 0.5), 1.0)
    for k in range(1, 3):
        starts.append(np.tan(np.pi * (np.mod(k * alphas, 1.0) - 0.5)))
    return starts


# The Nelder–Mead polish of optimal_attention_risk must lower the risk by more than this, relative, to be taken:
# far above the objective's round-off (~1e-15) and Nelder–Mead's own jitter at its tolerances.
POLISH_GAIN = 1e-12


def optimal_attention_risk(problem: GDBetaProblem, *, mlp: bool, gtol: float = 1e-12) -> OptimalReadout:
    """inf over the LTB (``mlp=True``) or LSA (``mlp=False``) of the ICL risk, docs/gd_beta.md §6 (boxed).

    For a fixed value direction (a, b) the prediction is linear in the read-out, so the read-out is optimised
    in closed form and only (a, b) ∈ S^d remains: a smooth non-convex problem in d+1 dimensions, minimised by
    BFGS from 2d + 6 deterministic starts and polished by Nelder–Mead from the best (docs/gd_beta.md §11.11). Theorem 5.3 says the LTB value equals R* (optimal GD-β); Theorem 4.1
    that LSA's exceeds it when β* ≠ 0.
    """
    mlp = check.boolean(mlp, "mlp")
    problem.require_optimum_defined()
    d = problem.d

    def objective(direction):
        # The risk is invariant to the scale of (a, b); the penalty pins ‖x‖ = 1 so the optimiser has no flat
        # direction to wander along, and leaves the minimum unchanged.
        norm = np.linalg.norm(direction)
        if norm == 0 or not np.isfinite(norm):
            return np.inf
        u = direction / norm
        return optimal_readout_risk(problem, u[:d], u[d], constant=mlp)[0] + (norm * norm - 1.0) ** 2

    best = None
    for start in _sphere_starts(problem):
        result = minimize(objective, start / np.linalg.norm(start), method="BFGS", options=dict(gtol=gtol))
        if best is None or result.fun < best.fun:
            best = result
    # When ‖β*‖_H is large against the problem's scale the minimum lies in a narrow, curved valley near b → 0
    # where BFGS stops on precision loss (3e-5 above the minimum at ‖β*‖ = 100, docs/gd_beta.md §11.11); a
    # Nelder–Mead polish from its answer walks the valley. It replaces BFGS's answer only when it is lower by more
    # than round-off, so a well-conditioned minimum keeps BFGS's digits.
    # Tolerances well above the objective's round-off: at 1e-14 of the risk Nelder–Mead chased round-off for 1e5
    # evaluations (32 s); at these it stops in 50–650 (≤ 0.2 s) and reaches the valley's minimum just the same.
    polished = minimize(objective, best.x, method="Nelder-Mead",
                        options=dict(xatol=1e-9, fatol=1e-13 * abs(best.fun), maxiter=4_000))
    if polished.fun < best.fun - POLISH_GAIN * abs(best.fun):
        best = polished
    u = best.x / np.linalg.norm(best.x)
    risk, W = optimal_readout_risk(problem, u[:d], u[d], constant=mlp)
    return OptimalReadout(risk=risk, a=u[:d], b=float(u[d]), W=W)


# ==================================================================================================
# Gradient flow on (β₀, Γ) (Lemma G.2, Theorem 6.3; docs/gd_beta.md §9)
# ==================================================================================================


def beta_curvature(problem: GDBetaProblem, Gamma) -> np.ndarray:
    """B(Γ) = (I − HΓᵀ)H(I − ΓH) + (1/N)HΓᵀHΓH + (1/N)tr(ΓᵀHΓH) H (docs/gd_beta.md §3): for fixed Γ the risk is
    (β₀ − β*)ᵀB(Γ)(β₀ − β*) plus terms free of β₀, and B(Γ) ⪰ H/(N+1)."""
    H, N = problem.H, problem.N
    Gamma = check.finite_array(Gamma, "Gamma", shape=(problem.d, problem.d))
    GH = Gamma @ H
    M = np.eye(problem.d) - GH
    return M.T @ H @ M + GH.T @ H @ GH / N + np.trace(Gamma.T @ H @ GH) / N * H


def risk_gradient(problem: GDBetaProblem, beta0, Gamma) -> tuple[np.ndarray, np.ndarray]:
    """(∇_{β₀} R, ∇_Γ R) in closed form (G.4, G.5): (2B(Γ)(β₀ − β*), −2HSH + 2HΓ[(N+1)/N HSH + (tr HS + σ²)/N H])."""
    H, Psi = problem.H, problem.Psi
    beta0, Gamma = _gd_beta_parameters(problem, beta0, Gamma)
    if beta0.ndim != 1:
        raise ValueError("risk_gradient takes a single (beta0, Gamma), not a batch")
    # writable C-ordered operands: the kernel's products are then the np.dot other kernels compile too (a read-only
    # operand is another type, and so another compile)
    dbeta, dGamma = _flow_field(np.array(beta0, order="C"), np.array(Gamma, order="C"), np.array(H, order="C"),
                                H @ Psi @ H, float(np.trace(H @ Psi)), problem.beta_star,
                                problem.sigma2, float(problem.N))
    return -dbeta, -dGamma


@njit(cache=True)
def _flow_field(beta0, Gamma, H, HPsiH, tr_HPsi, beta_star, sigma2, N):
    """−∇R at (β₀, Γ), docs/gd_beta.md §9 (boxed):
    β̇₀ = −2B(Γ)(β₀ − β*), B(Γ) = (I − HΓᵀ)H(I − ΓH) + (1/N)HΓᵀHΓH + (1/N)tr(ΓᵀHΓH) H,
    Γ̇ = 2HSH − 2HΓ[(N+1)/N HSH + (tr(HS) + σ²)/N H],  S = Ψ + (β₀ − β*)(β₀ − β*)ᵀ.

    Cost: three d×d products. HSH = HΨH + (He)(He)ᵀ and tr(HS) = tr(HΨ) + eᵀHe with HΨH, tr(HΨ) precomputed;
    B(Γ)e by matrix-vector products; tr(ΓᵀHΓH) = Σ (HΓ) ∘ (ΓH).

    The products are the BLAS calls of ``A @ B``, made as ``np.dot(A, B, out)`` into buffers (the same call, much
    cheaper to compile); the elementwise algebra around them is written as loops, which give the same numbers.
    """
    d = beta0.size
    e = np.empty(d)
    for i in range(d):
        e[i] = beta0[i] - beta_star[i]
    He = np.empty(d)
    np.dot(H, e, He)
    HG = np.empty((d, d))
    GH = np.empty((d, d))
    np.dot(H, Gamma, HG)
    np.dot(Gamma, H, GH)
    tr_GtHGH = 0.0
    for i in range(d):
        for j in range(d):
            tr_GtHGH += HG[i, j] * GH[i, j]
    GHe = np.empty(d)
    np.dot(Gamma, He, GHe)
    Me = np.empty(d)
    for i in range(d):
        Me[i] = e[i] - GHe[i]  # (I − ΓH)e
    # B e = (I − HΓᵀ) H (I − ΓH) e + (1/N) H Γᵀ H Γ H e + (1/N) tr(ΓᵀHΓH) H e
    HMe = np.empty(d)
    np.dot(H, Me, HMe)
    v = np.empty(d)  # Γᵀ(·), reused
    HGtHMe = np.empty(d)
    np.dot(Gamma.T, HMe, v)
    np.dot(H, v, HGtHMe)
    HGHe = np.empty(d)
    HGtHGHe = np.empty(d)
    np.dot(H, GHe, HGHe)
    np.dot(Gamma.T, HGHe, v)
    np.dot(H, v, HGtHGHe)
    dbeta = np.empty(d)  # −2 B e
    for i in range(d):
        dbeta[i] = -2.0 * (HMe[i] - HGtHMe[i] + HGtHGHe[i] / N + tr_GtHGH / N * He[i])
    # Γ̇ = 2HSH − (2HΓ)[(N+1)/N HSH + (tr(HS) + σ²)/N H]
    tr_HS = tr_HPsi + e @ He
    a = (N + 1.0) / N
    b = (tr_HS + sigma2) / N
    HSH = np.empty((d, d))
    inner = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            HSH[i, j] = HPsiH[i, j] + He[i] * He[j]
            inner[i, j] = a * HSH[i, j] + b * H[i, j]
            HG[i, j] *= 2.0  # HΓ -> 2HΓ
    dGamma = np.empty((d, d))
    np.dot(HG, inner, dGamma)
    for i in range(d):
        for j in range(d):
            dGamma[i, j] = 2.0 * HSH[i, j] - dGamma[i, j]
    return dbeta, dGamma


@njit(cache=True)
def gradient_flow_rhs_into(t, y, params, out):
    """Right-hand side of the gradient flow (6.1)/(G.2), written into ``out`` (the integrator's calling convention).

    y = (β₀, vec Γ) of size d + d² (Γ row-major); ``params`` from :func:`pack_flow_params`. The algebra of
    :func:`_flow_field` (docs/gd_beta.md §9, boxed) on views of ``y``, ``params`` and ``out`` (no copies), arranged
    for three d × d products and six matrix–vector products, with one work allocation per call:
    HΓ, (HΓ)H (which gives tr(ΓᵀHΓH) = Σ Γ ∘ HΓH) and (HΓ)(HΨH) written straight into ``out``'s Γ block, then
    Γ̇ = 2HSH − 2[(N+1)/N (HΓ)HSH + (tr(HS) + σ²)/N HΓH] with HSH = HΨH + (He)(He)ᵀ, (HΓ)(He)(He)ᵀ rank one;
    β̇₀ = −2B(Γ)e = −2[HMe + H Γᵀ((HΓHe)/N − HMe) + tr(ΓᵀHΓH)/N He], Me = e − ΓHe.
    """
    d = int(params[0])
    N = params[1]
    sigma2 = params[2]
    tr_HPsi = params[3]
    size = d * d
    H = params[4:4 + size].reshape((d, d))
    HPsiH = params[4 + size:4 + 2 * size].reshape((d, d))
    beta_star = params[4 + 2 * size:4 + 2 * size + d]
    Gamma = y[d:].reshape((d, d))
    dGamma = out[d:].reshape((d, d))
    work = np.empty(2 * size + 6 * d)  # HΓ, HΓH and six d-vectors
    HG = work[:size].reshape((d, d))
    HGH = work[size:2 * size].reshape((d, d))
    vectors = work[2 * size:].reshape((6, d))
    e, He, v, Me, w, Gtw = vectors[0], vectors[1], vectors[2], vectors[3], vectors[4], vectors[5]
    for i in range(d):
        e[i] = y[i] - beta_star[i]
    _matvec(H, e, He)
    tr_HS = tr_HPsi
    for i in range(d):
        tr_HS += e[i] * He[i]
    _matmul(H, Gamma, HG)
    _matmul(HG, H, HGH)
    _matmul(HG, HPsiH, dGamma)
    tr_GtHGH = 0.0
    for i in range(d):
        for j in range(d):
            tr_GtHGH += Gamma[i, j] * HGH[i, j]
    _matvec(HG, He, v)                  # HΓHe
    _matvec(Gamma, He, Me)
    for i in range(d):
        Me[i] = e[i] - Me[i]            # (I − ΓH)e
    a = (N + 1.0) / N
    b = (tr_HS + sigma2) / N
    for i in range(d):
        he_i = He[i]
        av_i = a * v[i]
        for j in range(d):
            dGamma[i, j] = 2.0 * (HPsiH[i, j] + he_i * He[j]) - 2.0 * (a * dGamma[i, j] + av_i * He[j] + b * HGH[i, j])
    beta_dot = out[:d]
    _matvec(H, Me, beta_dot)            # HMe, for now
    for i in range(d):
        w[i] = v[i] / N - beta_dot[i]
    for k in range(d):                  # Γᵀw
        Gtw[k] = 0.0
    for i in range(d):
        w_i = w[i]
        for k in range(d):
            Gtw[k] += Gamma[i, k] * w_i
    c = tr_GtHGH / N
    for i in range(d):
        acc = 0.0
        for k in range(d):
            acc += H[i, k] * Gtw[k]
        beta_dot[i] = -2.0 * (beta_dot[i] + acc + c * He[i])


@njit(cache=True)
def _matvec(A, x, out):
    """out = A x for a small dense A (rows contiguous)."""
    n, m = A.shape
    for i in range(n):
        acc = 0.0
        for k in range(m):
            acc += A[i, k] * x[k]
        out[i] = acc


@njit(cache=True)
def _matmul(A, B, out):
    """out = A B: BLAS from d = 12 on, below it a plain i-k-j loop (a BLAS call costs more than the product there)."""
    n = A.shape[0]
    if n >= 12:
        np.dot(A, B, out)
        return
    for i in range(n):
        for j in range(n):
            out[i, j] = 0.0
        for k in range(n):
            a = A[i, k]
            for j in range(n):
                out[i, j] += a * B[k, j]


@njit(cache=True)
def gradient_flow_rhs(t, y, params):
    """Right-hand side of the gradient flow (6.1)/(G.2) as a new vector: :func:`gradient_flow_rhs_into`.

    y = (β₀, vec Γ) of size d + d² (Γ row-major); ``params`` from :func:`pack_flow_params`.
    """
    out = np.empty(y.size)
    gradient_flow_rhs_into(t, y, params, out)
    return out


def pack_flow_params(problem: GDBetaProblem) -> np.ndarray:
    """Flat parameter array for :func:`gradient_flow_rhs`: (d, N, σ², tr(HΨ), vec H, vec HΨH, β*)."""
    H = problem.H
    return np.concatenate([[problem.d, problem.N, problem.sigma2, np.trace(H @ problem.Psi)], H.ravel(),
                           (H @ problem.Psi @ H).ravel(), problem.beta_star])


def flow_state(beta0, Gamma) -> np.ndarray:
    """(β₀, Γ) -> flat state (β₀, vec Γ); batches (..., d), (..., d, d) -> (..., d + d²), the inverse of
    :func:`unpack_flow_state`."""
    beta0 = check.finite_array(beta0, "beta0")
    if beta0.ndim < 1:
        raise ValueError(f"beta0 must have shape (..., d), got {beta0.shape}")
    d = beta0.shape[-1]
    Gamma = check.finite_array(Gamma, f"Gamma (shape beta0.shape + (d,) for beta0 of shape {beta0.shape})",
                               shape=beta0.shape + (d,))
    return np.concatenate([beta0, Gamma.reshape(Gamma.shape[:-2] + (-1,))], axis=-1)


def unpack_flow_state(y, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat state(s) of shape (..., d + d²) -> β₀ (..., d), Γ (..., d, d)."""
    d = check.integer(d, "d", minimum=1)
    y = check.finite_array(y, "y")
    if y.ndim < 1 or y.shape[-1] != d + d * d:
        raise ValueError(f"y must have shape (..., d + d^2) = (..., {d + d * d}) for d = {d}, got {y.shape}")
    return y[..., :d], y[..., d:].reshape(y.shape[:-1] + (d, d))


def flow_limit(problem: GDBetaProblem, beta0_init, Gamma_init) -> tuple[np.ndarray, np.ndarray]:
    """Limit of the flow, Theorem 6.3 (docs/gd_beta.md §9): the null-space parts never move,
    β₀(∞) = P_R β* + P_N β₀(0), Γ(∞) = Γ* + (Γ(0) − P_R Γ(0) P_R), with P_R the projector on range(H)."""
    beta0_init = check.finite_array(beta0_init, "beta0_init", shape=(problem.d,))
    G0 = check.finite_array(Gamma_init, "Gamma_init", shape=(problem.d, problem.d))
    P_R = problem.H_range_projector
    P_N = np.eye(problem.d) - P_R
    return P_R @ problem.beta_star + P_N @ beta0_init, optimal_gamma(problem) + G0 - P_R @ G0 @ P_R


@dataclass(frozen=True)
class LocalRates:
    """Exponential rates of the gradient flow (docs/gd_beta.md §9 "Rates", ours, verified).

    beta : exact local rate of ‖β₀ − β*‖, 2 λ_min⁺(B(Γ*)) on range(H).
    gamma_mode : exact local rate of the Γ block, 2 λ₊(H) λ₊(H^{1/2}ΩH^{1/2}).
    gamma_tail : observed tail rate of ‖Γ − Γ*‖_F, min(gamma_mode, 2·beta): β₀'s error drives Γ at second order.
    beta_uniform : rate of the bound ‖P_R(β₀(t) − β*)‖² <= exp(−beta_uniform·t)‖P_R(β₀(0) − β*)‖², 4λ₊/(N+1),
        valid along the whole path from any start.
    """

    beta: float
    gamma_mode: float
    gamma_tail: float
    beta_uniform: float


def _linearisation(problem: GDBetaProblem) -> tuple[np.ndarray, np.ndarray]:
    """(orthonormal basis of range(H), B(Γ*)): what the flow's linearisation at (β*, Γ*) is built from."""
    problem.require_optimum_defined()
    basis = problem.H_range_basis
    if basis.shape[1] == 0:
        raise ValueError("H must be non-zero for the gradient flow to move")
    return basis, beta_curvature(problem, optimal_gamma(problem))


def local_rates(problem: GDBetaProblem) -> LocalRates:
    basis, B = _linearisation(problem)
    B_range = basis.T @ ((B + B.T) / 2) @ basis
    rate_beta = 2 * float(np.linalg.eigvalsh(B_range).min())
    H_range = np.linalg.eigvalsh(basis.T @ problem.H @ basis)
    K = problem.H_half @ omega(problem) @ problem.H_half
    K_range = np.linalg.eigvalsh(basis.T @ K @ basis)
    rate_gamma = 2 * float(H_range.min() * K_range.min())
    return LocalRates(beta=rate_beta, gamma_mode=rate_gamma, gamma_tail=min(rate_gamma, 2 * rate_beta),
                      beta_uniform=4 * float(H_range.min()) / (problem.N + 1))


def flow_curvature(problem: GDBetaProblem) -> float:
    """λ_max(∇²R) at (β*, Γ*): the fastest local rate of the flow, which bounds an explicit integrator's step there.
    The linearisation is block-diagonal (docs/gd_beta.md §9 "Rates"), with spectrum {2 eig B(Γ*)} ∪ {2hᵢkⱼ} on
    range(H) (hᵢ, kⱼ the eigenvalues of H and K = H^{1/2}ΩH^{1/2}), so the largest is
    max(2 λ_max(B(Γ*)), 2 λ_max(H) λ_max(K))."""
    basis, B = _linearisation(problem)

    def top(M):
        return float(np.linalg.eigvalsh(basis.T @ ((M + M.T) / 2) @ basis).max())

    return max(2 * top(B), 2 * top(problem.H) * top(problem.H_half @ omega(problem) @ problem.H_half))


@dataclass(frozen=True)
class SlowModes:
    """Eigen-directions of the linearised flow at (β*, Γ*) on range(H) (docs/gd_beta.md §9 "Rates", item 4).

    beta : unit v with B(Γ*)v = (rate/2)v for the β₀ rate of :func:`local_rates`.
    gamma : unit-Frobenius u wᵀ with Hu = λ₊(H)u and Kw = λ₊(K)w, K = H^{1/2}ΩH^{1/2}; the linear Γ field maps it to
        −2H(uwᵀ)K = −gamma_mode · uwᵀ.
    H_eig, K_eig : (eigenvalues, eigenvectors as columns) of H and K restricted to range(H), in ambient coordinates.
    """

    beta: np.ndarray
    gamma: np.ndarray
    H_eig: tuple[np.ndarray, np.ndarray]
    K_eig: tuple[np.ndarray, np.ndarray]


def slow_modes(problem: GDBetaProblem) -> SlowModes:
    basis, B = _linearisation(problem)

    def range_eigh(M):
        values, vectors = np.linalg.eigh(basis.T @ ((M + M.T) / 2) @ basis)
        return values, basis @ vectors

    _, B_vectors = range_eigh(B)
    h, U = range_eigh(problem.H)
    k, W = range_eigh(problem.H_half @ omega(problem) @ problem.H_half)
    return SlowModes(beta=B_vectors[:, 0], gamma=np.outer(U[:, 0], W[:, 0]), H_eig=(h, U), K_eig=(k, W))


def gamma_response(problem: GDBetaProblem, amplitude: float, times) -> np.ndarray:
    """Γ(t) − Γ* to second order in a, for the flow started at (β* + a·v, Γ*) with v the slow β₀ mode
    (docs/gd_beta.md §9 "Rates", item 4). Returns an array (len(times), d, d).

    To first order e(t) = β₀ − β* = a e^{−rt}v with r the β₀ rate; Γ* zeroes the field at e = 0, so D = Γ − Γ* obeys
    Ḋ = −2HDK + a²e^{−2rt}F, F = 2Hvvᵀ H − 2HΓ*[(N+1)/N · Hvvᵀ H + (vᵀHv)/N · H],
    up to O(a⁴). In the eigenbases H = Σ hᵢuᵢuᵢᵀ, K = Σ kⱼwⱼwⱼᵀ, with F̃ᵢⱼ = uᵢᵀFwⱼ and γᵢⱼ = 2hᵢkⱼ,
    D̃ᵢⱼ(t) = a²F̃ᵢⱼ (e^{−2rt} − e^{−γᵢⱼt}) / (γᵢⱼ − 2r)   (a²F̃ᵢⱼ t e^{−2rt} when γᵢⱼ = 2r),
    so the tail decays at min(γ₁₁, 2r) = ``LocalRates.gamma_tail``.
    """
    times = check.finite_array(times, "times")
    amplitude = check.real(amplitude, "amplitude")
    modes = slow_modes(problem)
    r = local_rates(problem).beta
    H, N, v = problem.H, problem.N, modes.beta
    Hv = H @ v
    F = 2 * np.outer(Hv, Hv) - 2 * H @ optimal_gamma(problem) @ ((N + 1) / N * np.outer(Hv, Hv) + (v @ Hv) / N * H)
    (h, U), (k, W) = modes.H_eig, modes.K_eig
    F_tilde = U.T @ F @ W
    gamma = 2 * np.outer(h, k)
    t = times[:, None, None]
    gap = gamma - 2 * r
    resonant = np.abs(gap) <= 1e-9 * gamma
    safe_gap = np.where(resonant, 1.0, gap)
    profile = np.where(resonant, t * np.exp(-2 * r * t), (np.exp(-2 * r * t) - np.exp(-gamma * t)) / safe_gap)
    return amplitude**2 * U @ (F_tilde * profile) @ W.T


# ==================================================================================================
# Corollary 6.2: GD-β vs Bayes (docs/gd_beta.md §8)
# ==================================================================================================


def snr(problem: GDBetaProblem) -> float:
    """Signal-to-noise ratio tr(HΨ)/σ² (inf when σ² = 0)."""
    t = float(np.trace(problem.Psi_tilde))
    return np.inf if problem.sigma2 == 0 else t / problem.sigma2


def excess_risk_sandwich(problem: GDBetaProblem) -> tuple[float, float]:
    """Explicit constants for Corollary 6.2 (docs/gd_beta.md §8, ours), with κ = SNR:
    ½ Σ min(ψᵢ, σ²/(N+1)) <= R* − σ² <= 2(1 + κ) Σ min(ψᵢ, σ²/N)."""
    psi, N, s2 = problem.psi, problem.N, problem.sigma2
    lower = 0.5 * np.minimum(psi, s2 / (N + 1)).sum()
    if s2 == 0:  # the limit σ² → 0 of 2(1 + tr Ψ̃/σ²) Σ min(ψᵢ, σ²/N): 2 tr Ψ̃ · r/N, r = rank Ψ̃ (κ = ∞, ∞·0 below)
        return float(lower), 2.0 * float(np.trace(problem.Psi_tilde)) * numerical_rank(problem.Psi_tilde) / N
    upper = 2 * (1 + snr(problem)) * np.minimum(psi, s2 / N).sum()
    return float(lower), float(upper)


def large_context_ratio_limit(problem: GDBetaProblem) -> float:
    """lim_{N→∞} (R* − σ²)/(R_Bayes − σ²) = 1 + (r+1)/r · SNR, r = rank Ψ̃ (docs/gd_beta.md §8; r = d there)."""
    r = numerical_rank(problem.Psi_tilde)
    if r == 0:
        raise ValueError("Psi must satisfy tr(H Psi) > 0 for the GD-beta/Bayes ratio")
    return 1 + (r + 1) / r * snr(problem)


# ==================================================================================================
# Gradient noise: moments of the per-prompt gradient (docs/gd_beta.md §12)
# ==================================================================================================


def risk_hessian(problem: GDBetaProblem, beta0, Gamma, step: float = 1e-5) -> np.ndarray:
    """∇²R at (β₀, Γ) in the flat coordinates (β₀, vec Γ) of :func:`flow_state`, by central differences of the
    closed-form gradient (G.4, G.5). R is a polynomial of degree 4, so the error is O(step²·‖∇⁴R‖), about 1e-10."""
    d = problem.d
    theta = flow_state(*check_parameters(problem, beta0, Gamma))
    step = check.real(step, "step", minimum=0.0, strict=True)
    columns = []
    for k in range(theta.size):
        offset = np.zeros(theta.size)
        offset[k] = step
        plus = flow_state(*risk_gradient(problem, *unpack_flow_state(theta + offset, d)))
        minus = flow_state(*risk_gradient(problem, *unpack_flow_state(theta - offset, d)))
        columns.append((plus - minus) / (2 * step))
    hessian = np.column_stack(columns)
    return (hessian + hessian.T) / 2


@njit(cache=True)
def context_gd_step(X, y, c, beta0, g):
    """g ← Xᵀ(y − Xβ₀)/N for context c of the batch (X (n, N, d), y (n, N)): one GD step's direction from β₀,
    the g₀ of (5.1), written into ``g`` (d,). Shared by the closed-form noise moments and the training kernel."""
    N, d = X.shape[1], X.shape[2]
    for j in range(d):
        g[j] = 0.0
    for k in range(N):
        r = y[c, k]
        for j in range(d):
            r -= X[c, k, j] * beta0[j]
        for j in range(d):
            g[j] += X[c, k, j] * r / N


@njit(cache=True)
def moment_sums_by_batch(X, y, beta, beta0, Gamma, H, sigma2, n_batches):
    """Σ_c E[ĝ | c], Σ_c E[ĝ | c]E[ĝ | c]ᵀ and Σ_c E[ĝĝᵀ | c] over contexts c = (X, y, β), integrating the query
    (x_q, ε_q) exactly (docs/gd_beta.md §12): ĝ = 2rLx_q with r = x_qᵀu − ε_q, u = β₀ + Γg − β,
    g = Xᵀ(y − Xβ₀)/N and L = [P; x ↦ vec(x gᵀ)], P = I − ŜΓᵀ, Ŝ = XᵀX/N, so E[ĝ | c] = 2LHu and
    E[ĝĝᵀ | c] = 4LMLᵀ, M = (uᵀHu + σ²)H + 2Hu uᵀH. In blocks, LMLᵀ = [[PMPᵀ, PM ⊗ gᵀ], [·, M ⊗ ggᵀ]] with
    Γ-index (j, l) ↦ d + jd + l; scalar loops, O(Nd² + d⁴) per context, no temporaries.

    The sums are taken separately over each of ``n_batches`` equal consecutive batches of the contexts and
    returned stacked, (n_batches, p), (n_batches, p, p) and (n_batches, p, p): one call for all the batches (the
    noise covariance of an SGD path needs them at every step), and one level of compiled calls rather than a
    batch loop around a kernel, which numba would compile and optimise again. Inputs are checked by the callers
    (:func:`conditional_gradient_moments_by_batch`, ``dynamics.gd_beta.ContextPool`` with
    ``gradient_noise_covariance``), which pass read-only C-ordered arrays: one compiled signature."""
    n, N, d = X.shape
    if n_batches < 1 or n % n_batches:  # the batch index below would run past the outputs
        raise ValueError("n_batches must divide the number of contexts")
    p = d + d * d
    size = n // n_batches
    mean_sums = np.zeros((n_batches, p))
    mean_outers = np.zeros((n_batches, p, p))
    second_sums = np.zeros((n_batches, p, p))
    g = np.empty(d)
    u = np.empty(d)
    Hu = np.empty(d)
    S = np.empty((d, d))
    P = np.empty((d, d))
    M = np.empty((d, d))
    PM = np.empty((d, d))
    m = np.empty(p)
    for c in range(n):
        batch = c // size
        context_gd_step(X, y, c, beta0, g)
        for j in range(d):
            for l in range(d):
                S[j, l] = 0.0
        for k in range(N):
            for j in range(d):
                for l in range(d):
                    S[j, l] += X[c, k, j] * X[c, k, l] / N
        for j in range(d):
            acc = beta0[j] - beta[c, j]
            for l in range(d):
                acc += Gamma[j, l] * g[l]
            u[j] = acc
        uHu = 0.0
        for j in range(d):
            acc = 0.0
            for l in range(d):
                acc += H[j, l] * u[l]
            Hu[j] = acc
            uHu += u[j] * acc
        for j in range(d):
            for l in range(d):
                M[j, l] = (uHu + sigma2) * H[j, l] + 2.0 * Hu[j] * Hu[l]
                acc = 1.0 if j == l else 0.0
                for k in range(d):
                    acc -= S[j, k] * Gamma[l, k]
                P[j, l] = acc
        for j in range(d):
            for l in range(d):
                acc = 0.0
                for k in range(d):
                    acc += P[j, k] * M[k, l]
                PM[j, l] = acc
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc += P[j, k] * Hu[k]
            m[j] = 2.0 * acc
            for l in range(d):
                m[d + j * d + l] = 2.0 * Hu[j] * g[l]
        for a in range(p):
            mean_sums[batch, a] += m[a]
            for b in range(p):
                mean_outers[batch, a, b] += m[a] * m[b]
        for a in range(d):
            for b in range(d):
                acc = 0.0
                for k in range(d):
                    acc += PM[a, k] * P[b, k]
                second_sums[batch, a, b] += 4.0 * acc
            for j in range(d):
                for l in range(d):
                    value = 4.0 * PM[a, j] * g[l]
                    second_sums[batch, a, d + j * d + l] += value
                    second_sums[batch, d + j * d + l, a] += value
        for j in range(d):
            for l in range(d):
                for j2 in range(d):
                    for l2 in range(d):
                        second_sums[batch, d + j * d + l, d + j2 * d + l2] += 4.0 * M[j, j2] * g[l] * g[l2]
    return mean_sums, mean_outers, second_sums


def conditional_gradient_moments(problem: GDBetaProblem, X, y, beta, beta0, Gamma):
    """Sums over the contexts (X, y, β) — arrays (n, N, d), (n, N), (n, d) — of the per-prompt gradient's
    conditional mean, its outer product, and its conditional second moment, the query integrated exactly
    (docs/gd_beta.md §12). Returns (mean_sum (p,), mean_outer_sum (p, p), second_sum (p, p)), p = d + d²."""
    sums = conditional_gradient_moments_by_batch(problem, X, y, beta, beta0, Gamma, n_batches=1)
    return tuple(s[0] for s in sums)


def conditional_gradient_moments_by_batch(problem: GDBetaProblem, X, y, beta, beta0, Gamma, *, n_batches: int):
    """:func:`conditional_gradient_moments` of each of ``n_batches`` equal consecutive batches of the contexts,
    stacked: arrays (n_batches, p), (n_batches, p, p), (n_batches, p, p). The inputs are checked once, not once per
    batch (the noise covariance of an SGD path needs it at every step)."""
    d, N = problem.d, problem.N
    # read-only C-ordered copies, as a context pool holds: one compiled signature of the kernel
    X = check.finite_array(X, "X", ndim=3, order="C")
    if X.shape[1:] != (N, d):
        raise ValueError(f"X must have shape (n, {N}, {d}), got {X.shape}")
    y = check.finite_array(y, "y", shape=X.shape[:2], order="C")
    beta = check.finite_array(beta, "beta", shape=(X.shape[0], d), order="C")
    beta0, Gamma = check_parameters(problem, beta0, Gamma)
    n_batches = check.integer(n_batches, "n_batches", minimum=1)
    if X.shape[0] % n_batches:
        raise ValueError(f"n_batches must divide the number of contexts {X.shape[0]}, got {n_batches}")
    H = np.ascontiguousarray(problem.H)  # the problem's read-only array
    return moment_sums_by_batch(X, y, beta, beta0, Gamma, H, float(problem.sigma2), n_batches)
