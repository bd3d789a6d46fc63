"""Linear attention and H3 as one-step (weighted) preconditioned GD (Li, Rawat & Oymak, NeurIPS 2024).

Paper: Y. Li, A. S. Rawat, S. Oymak, *Fine-grained Analysis of In-context Linear Estimation: Data, Architecture,
and Beyond*, NeurIPS 2024, arXiv:2407.10005. The derivations are in docs/linear_attention_h3.md; every function
cites its section.

Data (docs/linear_attention_h3.md §1): features x_i, x ~ N(0, H), task β ~ N(0, Ψ), labels y_i = x_iᵀ(β + δ_i) + ξ_i
with position-dependent noise ξ_i ~ N(0, σ_i²) and drift Cov(δ_i, δ_j) = C_ij Δ; the query label y_q = xᵀβ + ξ.
Two correlated designs (§1.3, §1.4) replace the independence of the features: retrieval (RAG) and task–feature
alignment (TFA), both with H = Ψ = I.

Predictors (§2): PGD ŷ = xᵀWXᵀy and WPGD ŷ = xᵀWXᵀ(ω ⊙ y); linear attention reduces to PGD and H3 to WPGD (§3).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from . import checks as check
from .linalg import psd_eigh, psd_power
from .linear_icl import omega_matrix, optimal_step_matrix, preconditioned_gd_risk, spectral_optimal_risk
from .parameters import Parameter, parse_parameters, square_matrix

__all__ = [
    "DESIGNS",
    "H3Problem",
    "random_walk_drift",
    "MAX_DRIFT_N",
    "gradient_second_moment",
    "wpgd_risk",
    "pgd_risk",
    "pgd_excess_risk",
    "optimal_preconditioner",
    "optimal_risk",
    "optimal_weighted_preconditioner",
    "optimal_risk_for_weights",
    "low_rank_preconditioner",
    "low_rank_optimal_risk",
    "lora_optimal_risk",
    "lora_optimal_update",
    "isotropic_weight_matrix",
    "h3_optimum",
    "attention_optimum",
    "heteroscedastic_optima",
    "CorrelatedMoments",
    "correlated_moments",
    "correlated_optimum",
    "isotropic_correlated_moments",
    "isotropic_correlated_optimum",
    "isotropic_effective_sample_size",
    "alignment_multiplier",
    "effective_sample_size",
    "rag_risk_floor",
    "attention_effective_preconditioner",
    "h3_effective_parameters",
    "pgd_risk_gradient",
    "preconditioner_flow_rhs",
    "preconditioner_flow_rhs_into",
    "pack_flow_params",
    "golden_setting_a",
    "golden_setting_d",
]

DESIGNS = ("iid", "rag", "tfa")


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


# Largest n of a drift covariance built from (n, ρ²): an n × n matrix (200 MB here); beyond it a typo.
MAX_DRIFT_N = 5000


def random_walk_drift(n: int, rho2: float) -> np.ndarray:
    """C_ij = ρ²(n + 1 − max(i, j)) (i, j = 1..n): the drift covariance of a task that walks back from the query,
    β_{n+1} = β, β_i = β_{i+1} + η_i, η_i ~ N(0, ρ²I) (docs/linear_attention_h3.md §1.2)."""
    n = check.integer(n, "n", minimum=1)
    if n > MAX_DRIFT_N:
        raise ValueError(f"n must be <= {MAX_DRIFT_N} for a random-walk drift (an n x n covariance), got {n}")
    rho2 = check.real(rho2, "rho2", minimum=0.0)
    index = np.arange(1, n + 1)
    return rho2 * (n + 1 - np.maximum.outer(index, index)).astype(float)


def _check_magnitude(value, name: str) -> None:
    """The risks are quartic in the covariances: beyond 1e75 an intermediate overflows."""
    size = 0.0 if value is None else float(np.max(np.abs(value), initial=0.0))
    if size > 1e75:
        raise ValueError(f"{name} has entries of size {size:.3g}; at most 1e75 keeps the fourth moments finite")


@dataclass(frozen=True)
class H3Problem:
    """In-context linear estimation with the designs of docs/linear_attention_h3.md §1.

    Parameters
    ----------
    H : array_like, shape (d, d)   feature covariance, symmetric positive definite
    Psi : array_like, shape (d, d) task covariance Ψ, symmetric PSD
    sigma2 : float                 the paper's label-noise variance σ² (§1.1): the query's σ_q², and every
                                   example's σ_i² unless ``noise`` is given (one σ² for all, the IID design);
                                   ``query_noise`` and ``example_noise`` read the two roles
    n : int                        number of in-context examples
    noise : array_like, shape (n,), optional   per-position noise variances σ_i² (heteroscedastic design)
    drift : array_like, shape (n, n), optional PSD drift covariance C (Cov(δ_i, δ_j) = C_ij Δ)
    Delta : array_like, shape (d, d), optional PSD drift direction covariance Δ (default I)
    design : "iid", "rag" or "tfa"
    alpha : float in [0, 1]        retrieval/alignment strength of the correlated designs
    """

    H: np.ndarray
    Psi: np.ndarray
    sigma2: float
    n: int
    noise: np.ndarray | None = None
    drift: np.ndarray | None = None
    Delta: np.ndarray | None = None
    design: str = "iid"
    alpha: float = 0.0

    def __post_init__(self):
        H = check.symmetric_psd(self.H, "H")
        d = H.shape[0]
        _check_magnitude(H, "H")
        if d < 1:
            raise ValueError("H must be at least 1x1 (d >= 1)")
        if np.linalg.eigvalsh(H).min() <= check.PSD_TOLERANCE * max(1.0, np.abs(H).max()):
            raise ValueError("H must be positive definite (the preconditioner acts on its inverse)")
        object.__setattr__(self, "H", H)
        object.__setattr__(self, "Psi", check.symmetric_psd(self.Psi, "Psi", size=d))
        object.__setattr__(self, "sigma2", check.real(self.sigma2, "sigma2", minimum=0.0))
        n = check.integer(self.n, "n", minimum=1)
        object.__setattr__(self, "n", n)
        if self.noise is not None:
            noise = check.finite_array(self.noise, "noise", shape=(n,))
            if noise.min() < 0:
                raise ValueError(f"noise must hold variances >= 0, got minimum {noise.min():g}")
            object.__setattr__(self, "noise", noise)
        if self.drift is not None:
            object.__setattr__(self, "drift", check.symmetric_psd(self.drift, "drift", size=n))
        Delta = np.eye(d) if self.Delta is None else self.Delta
        object.__setattr__(self, "Delta", check.symmetric_psd(Delta, "Delta", size=d))
        for name in ("Psi", "Delta", "drift", "noise", "sigma2"):
            _check_magnitude(getattr(self, name), name)
        if self.design not in DESIGNS:
            raise ValueError(f"design must be one of {DESIGNS}, got {self.design!r}")
        object.__setattr__(self, "alpha", check.real(self.alpha, "alpha", minimum=0.0, maximum=1.0))
        if self.design != "iid":
            identity = np.eye(d)
            if not (np.allclose(H, identity) and np.allclose(self.Psi, identity)):
                raise ValueError(f"H and Psi must be the identity in the {self.design} design (docs §1.3-1.4)")
            if self.noise is not None or self.drift is not None:
                raise ValueError(f"noise and drift must be absent in the {self.design} design")
        if self.sigma2 == 0 and np.trace(H @ self.Psi) == 0:
            raise ValueError("sigma2 must be > 0 when tr(H Psi) = 0: the optimal preconditioner is undefined")

    PARAMETERS = (
        Parameter("d", "integer", None, "dimension (default 3, or the size of H or Psi)", minimum=1, maximum=500),
        Parameter("n", "integer", 8, "in-context examples", minimum=1, maximum=100_000),
        Parameter("sigma2", "real", 0.25, "label-noise variance σ² (query, and examples unless noise is given)",
                  minimum=0.0),
        Parameter("H", "matrix", 1.0, "feature covariance: a scalar (·I), a comma list (diagonal) or rows 'a,b;c,d'"),
        Parameter("Psi", "matrix", 1.0, "task covariance Ψ, in the same forms as H"),
        Parameter("noise", "vector", None, "per-example noise variances σ_i² as a comma list of n values",
                  minimum=0.0),
        Parameter("rho2", "real", 0.0, "random-walk task drift per step ρ² (Δ = I)", minimum=0.0),
        Parameter("design", "choice", "iid", "data design", choices=DESIGNS),
        Parameter("alpha", "real", 0.0, "retrieval / alignment strength α of the rag and tfa designs",
                  minimum=0.0, maximum=1.0),
    )

    @classmethod
    def from_params(cls, values) -> "H3Problem":
        """A problem from named text or values (``PARAMETERS``)."""
        p = parse_parameters(cls.PARAMETERS, values, owner="linear_attention_h3")
        sizes = [np.shape(p[k])[0] for k in ("H", "Psi") if np.ndim(p[k]) > 0]
        d = p["d"] if p["d"] is not None else (sizes[0] if sizes else 3)

        drift = random_walk_drift(p["n"], p["rho2"]) if p["rho2"] > 0 else None
        return cls(H=square_matrix(p["H"], "H", d), Psi=square_matrix(p["Psi"], "Psi", d), sigma2=p["sigma2"],
                   n=p["n"], noise=p["noise"], drift=drift,
                   design=p["design"], alpha=p["alpha"])

    def replace(self, **changes) -> "H3Problem":
        fields = dict(H=self.H, Psi=self.Psi, sigma2=self.sigma2, n=self.n, noise=self.noise, drift=self.drift,
                      Delta=self.Delta, design=self.design, alpha=self.alpha)
        fields.update(changes)
        return H3Problem(**fields)

    # ---- derived quantities ----------------------------------------------------------------------------------
    @property
    def d(self) -> int:
        return self.H.shape[0]

    @property
    def homogeneous(self) -> bool:
        """Exchangeable examples with the query's noise: the IID design of §1.1."""
        return self.noise is None and self.drift is None

    @property
    def query_noise(self) -> float:
        """σ_q², the variance of the query's label noise ξ (§1.1-1.2): ``sigma2``."""
        return self.sigma2

    @cached_property
    def example_noise(self) -> np.ndarray:
        """σ_i², i = 1..n: ``noise`` (§1.2), or ``sigma2`` for every example (§1.1)."""
        return _read_only(np.full(self.n, self.sigma2) if self.noise is None else np.array(self.noise))

    @cached_property
    def drift_matrix(self) -> np.ndarray:
        return _read_only(np.zeros((self.n, self.n)) if self.drift is None else np.array(self.drift))

    @cached_property
    def H_half(self) -> np.ndarray:
        return _read_only(psd_power(self.H, 0.5))

    @cached_property
    def H_half_inv(self) -> np.ndarray:
        return _read_only(psd_power(self.H, -0.5))

    @cached_property
    def Psi_half(self) -> np.ndarray:
        return _read_only(psd_power(self.Psi, 0.5))

    @cached_property
    def Psi_tilde(self) -> np.ndarray:
        """Ψ̃ = H^{1/2}ΨH^{1/2} (§1)."""
        return _read_only(self.H_half @ self.Psi @ self.H_half)

    @cached_property
    def whitened_eigen(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues ψ₁ >= … >= ψ_d of Ψ̃ and their eigenvectors (columns)."""
        values, vectors = psd_eigh(self.Psi_tilde)
        return _read_only(values[::-1].copy()), _read_only(vectors[:, ::-1].copy())

    @property
    def psi(self) -> np.ndarray:
        return self.whitened_eigen[0]

    @property
    def s(self) -> float:
        """s = tr(HΨ) + σ² (§1): a homogeneous-design quantity (every example's noise is σ²); the closed forms that
        use it refuse ``noise`` and ``drift``."""
        return float(np.trace(self.Psi_tilde) + self.sigma2)

    @cached_property
    def M(self) -> np.ndarray:
        """M = E[Xᵀyyᵀ X] = n(n+1)HΨH + nsH in the IID design (§4)."""
        return _read_only(gradient_second_moment(self, np.ones(self.n)))


# ==================================================================================================================
# WPGD / PGD risk (§4, §6.1)
# ==================================================================================================================


def _check_weights(problem: H3Problem, omega) -> np.ndarray:
    return check.finite_array(omega, "omega", shape=(problem.n,))


def _check_preconditioner(problem: H3Problem, W) -> np.ndarray:
    W = check.finite_array(W, "W")
    _check_magnitude(W, "W")
    if W.ndim < 2 or W.shape[-2:] != (problem.d, problem.d):
        raise ValueError(f"W must have shape (..., {problem.d}, {problem.d}), got {W.shape}")
    return W


def _require_iid(problem: H3Problem, what: str) -> None:
    if problem.design != "iid":
        raise ValueError(f"design must be iid for {what}; the {problem.design} design has its own closed forms (§7)")


def gradient_second_moment(problem: H3Problem, omega) -> np.ndarray:
    """M_ω = E[Xᵀ(ω⊙y)(ω⊙y)ᵀX] (docs/linear_attention_h3.md §6.1):

    M_ω = (1ᵀω)² HΨH + (ωᵀCω) HΔH + Σᵢ ωᵢ² [H(Ψ + C_ii Δ)H + (tr HΨ + C_ii tr HΔ + σᵢ²) H]."""
    _require_iid(problem, "the WPGD moments")
    omega = _check_weights(problem, omega)
    H, Psi, Delta, C = problem.H, problem.Psi, problem.Delta, problem.drift_matrix
    HPsiH, HDeltaH = H @ Psi @ H, H @ Delta @ H
    tr_HPsi, tr_HDelta = float(np.trace(H @ Psi)), float(np.trace(H @ Delta))
    w2 = omega * omega
    diagonal = np.diag(C)
    return (omega.sum() ** 2 * HPsiH + (omega @ C @ omega) * HDeltaH + w2.sum() * HPsiH + (w2 @ diagonal) * HDeltaH
            + (w2.sum() * tr_HPsi + (w2 @ diagonal) * tr_HDelta + w2 @ problem.example_noise) * H)


def wpgd_risk(problem: H3Problem, W, omega) -> np.ndarray:
    """R(W, ω) = E(xᵀWXᵀ(ω⊙y) − y_q)² = tr(HΨ) + σ_q² − 2(1ᵀω) tr(HWHΨ) + tr(WᵀHWM_ω) (§6.1).

    W : shape (..., d, d), leading axes broadcast; returns shape (...)."""
    W = _check_preconditioner(problem, W)
    omega = _check_weights(problem, omega)
    H, Psi = problem.H, problem.Psi
    M = gradient_second_moment(problem, omega)
    HW = H @ W
    return (np.trace(H @ Psi) + problem.sigma2 - 2 * omega.sum() * np.trace(HW @ H @ Psi, axis1=-2, axis2=-1)
            + np.trace(np.swapaxes(W, -1, -2) @ HW @ M, axis1=-2, axis2=-1))


def pgd_risk(problem: H3Problem, W) -> np.ndarray:
    """R(W) = σ² + tr(HΨ) − 2n tr(HWHΨ) + tr(WᵀHWM), M = n(n+1)HΨH + nsH (§4): one GD step with step matrix
    Γ = nW (the shared formula of :mod:`attnflow.closed_forms.linear_icl`); with heterogeneous noise or drift it is
    the WPGD risk at ω = 1."""
    W = _check_preconditioner(problem, W)
    _require_iid(problem, "the PGD risk")
    if not problem.homogeneous:
        return wpgd_risk(problem, W, np.ones(problem.n))
    return preconditioned_gd_risk(problem.H, problem.Psi, problem.sigma2, problem.n, problem.n * W)


def optimal_preconditioner(problem: H3Problem) -> np.ndarray:
    """W* = Ψ((n+1)HΨ + sI)⁻¹ = H^{-1/2}Ψ̃((n+1)Ψ̃ + sI)⁻¹H^{-1/2} (§4.2), the Γ*/n of the shared formula."""
    _require_iid(problem, "W*")
    if not problem.homogeneous:
        return optimal_weighted_preconditioner(problem, np.ones(problem.n))
    n = problem.n
    Omega = omega_matrix(problem.Psi_tilde, problem.sigma2, n)
    return optimal_step_matrix(problem.H_half_inv, problem.Psi_tilde, Omega) / n


def optimal_risk(problem: H3Problem) -> float:
    """L* = σ² + Σᵢ ψᵢ(ψᵢ + s)/((n+1)ψᵢ + s) (§4.2)."""
    _require_iid(problem, "L*")
    if not problem.homogeneous:
        return optimal_risk_for_weights(problem, np.ones(problem.n))
    return spectral_optimal_risk(problem.psi, problem.sigma2, problem.n)


def pgd_excess_risk(problem: H3Problem, W) -> np.ndarray:
    """R(W) − L* = ‖H^{1/2}(W − W*)M^{1/2}‖²_F (§4.2), IID design."""
    W = _check_preconditioner(problem, W)
    D = problem.H_half @ (W - optimal_preconditioner(problem)) @ psd_power(problem.M, 0.5)
    return np.sum(D * D, axis=(-2, -1))


def optimal_weighted_preconditioner(problem: H3Problem, omega) -> np.ndarray:
    """W*(ω) = (1ᵀω) ΨH M_ω⁻¹, the minimiser of R(·, ω) (§6.1)."""
    omega = _check_weights(problem, omega)
    return omega.sum() * problem.Psi @ problem.H @ np.linalg.inv(gradient_second_moment(problem, omega))


def optimal_risk_for_weights(problem: H3Problem, omega) -> float:
    """min_W R(W, ω) = tr(HΨ) + σ_q² − (1ᵀω)² tr(M_ω⁻¹ HΨHΨH) (§6.1)."""
    omega = _check_weights(problem, omega)
    H, Psi = problem.H, problem.Psi
    HPsiH = H @ Psi @ H
    M = gradient_second_moment(problem, omega)
    return float(np.trace(H @ Psi) + problem.sigma2 - omega.sum() ** 2 * np.trace(np.linalg.solve(M, HPsiH) @ Psi @ H))


# ==================================================================================================================
# Low rank and LoRA (§5)
# ==================================================================================================================


def _check_rank(problem: H3Problem, r, name: str = "r") -> int:
    r = check.integer(r, name, minimum=0)
    if r > problem.d:
        raise ValueError(f"{name} must be <= d = {problem.d}, got {r}")
    return r


def low_rank_preconditioner(problem: H3Problem, r: int) -> np.ndarray:
    """W*_r = H^{-1/2} U_r diag(ψᵢ/((n+1)ψᵢ + s))_{i<=r} U_rᵀ H^{-1/2}: the best preconditioner of rank <= r keeps
    the top r eigen-directions of Ψ̃ (§5.1)."""
    _require_homogeneous(problem, "the low-rank optimum (§5.1)")
    r = _check_rank(problem, r)
    psi, U = problem.whitened_eigen
    gains = psi[:r] / ((problem.n + 1) * psi[:r] + problem.s)
    return problem.H_half_inv @ (U[:, :r] * gains) @ U[:, :r].T @ problem.H_half_inv


def low_rank_optimal_risk(problem: H3Problem, r: int) -> float:
    """L*_r = L* + Σ_{i>r} nψᵢ²/((n+1)ψᵢ + s) (§5.1): s keeps the full trace, the dropped directions act as noise."""
    _require_homogeneous(problem, "the low-rank optimum (§5.1)")
    r = _check_rank(problem, r)
    psi = problem.psi[r:]
    return optimal_risk(problem) + float(np.sum(problem.n * psi**2 / ((problem.n + 1) * psi + problem.s)))


def _require_homogeneous(problem: H3Problem, what: str) -> None:
    """The closed forms written with s = tr(HΨ) + σ²: every example's noise is the query's σ², no drift."""
    _require_iid(problem, what)
    if not problem.homogeneous:
        raise ValueError(f"noise and drift must be absent for {what}: it assumes every example's noise is sigma2")


def _lora_residual(problem: H3Problem, W0) -> tuple[np.ndarray, np.ndarray]:
    _require_homogeneous(problem, "the LoRA closed form (§5.2)")
    W0 = check.finite_array(W0, "W0", shape=(problem.d, problem.d))
    M_half = psd_power(problem.M, 0.5)
    return problem.H_half @ (optimal_preconditioner(problem) - W0) @ M_half, M_half


def lora_optimal_risk(problem: H3Problem, W0, r: int) -> float:
    """min_{rank Δ <= r} R(W0 + Δ) = L* + Σ_{i>r} σᵢ²(H^{1/2}(W* − W0)M^{1/2}) (§5.2, Eckart–Young on the excess
    form)."""
    r = _check_rank(problem, r)
    E, _ = _lora_residual(problem, W0)
    singular = np.linalg.svd(E, compute_uv=False)
    return optimal_risk(problem) + float(np.sum(singular[r:] ** 2))


def lora_optimal_update(problem: H3Problem, W0, r: int) -> np.ndarray:
    """The minimising update Δ = H^{-1/2} [E]_r M^{-1/2}, [E]_r the best rank-r part of E = H^{1/2}(W* − W0)M^{1/2}."""
    r = _check_rank(problem, r)
    E, M_half = _lora_residual(problem, W0)
    U, singular, Vt = np.linalg.svd(E)
    E_r = (U[:, :r] * singular[:r]) @ Vt[:r]
    return problem.H_half_inv @ E_r @ np.linalg.inv(M_half)


# ==================================================================================================================
# Sample weighting: H3 against linear attention (§6.2, §6.3)
# ==================================================================================================================


def isotropic_weight_matrix(problem: H3Problem) -> np.ndarray:
    """𝕄 = 11ᵀ + C + diag((d+1)(1 + C_ii) + σᵢ²) for H = Ψ = Δ = I: R(cI, ω) = d + σ_q² − 2d 1ᵀv + d vᵀ𝕄v with
    v = cω (§6.2)."""
    _require_iid(problem, "the isotropic weighting")
    identity = np.eye(problem.d)
    if not all(np.allclose(m, identity) for m in (problem.H, problem.Psi, problem.Delta)):
        raise ValueError("H, Psi and Delta must be the identity for the isotropic weighting closed forms (§6.2)")
    C, d = problem.drift_matrix, problem.d
    return np.ones((problem.n, problem.n)) + C + np.diag((d + 1) * (1 + np.diag(C)) + problem.example_noise)


def h3_optimum(problem: H3Problem) -> tuple[float, np.ndarray]:
    """(L*_H3, v*) = (d + σ_q² − d 1ᵀ𝕄⁻¹1, 𝕄⁻¹1): the best WPGD, hence H3, in the isotropic design (§6.2)."""
    Mbb = isotropic_weight_matrix(problem)
    v = np.linalg.solve(Mbb, np.ones(problem.n))
    return float(problem.d + problem.sigma2 - problem.d * v.sum()), v


def attention_optimum(problem: H3Problem) -> tuple[float, float]:
    """(L*_ATT, c) = (d + σ_q² − d n²/1ᵀ𝕄1, n/1ᵀ𝕄1): uniform weights, the best PGD (§6.2)."""
    total = float(isotropic_weight_matrix(problem).sum())
    return problem.d + problem.sigma2 - problem.d * problem.n**2 / total, problem.n / total


def heteroscedastic_optima(problem: H3Problem) -> dict:
    """Without drift (C = 0), with tᵢ = d + 1 + σᵢ², S = Σ1/tᵢ, T = Σtᵢ (§6.3, Sherman–Morrison):
    L*_H3 = σ_q² + d/(1 + S), L*_ATT = σ_q² + d/(1 + n²/T), ω*ᵢ ∝ 1/tᵢ."""
    if problem.drift is not None and np.any(problem.drift_matrix):
        raise ValueError("drift must be absent for the heteroscedastic closed forms (§6.3)")
    isotropic_weight_matrix(problem)  # validates the design
    t = problem.d + 1 + problem.example_noise
    S, T = float(np.sum(1 / t)), float(np.sum(t))
    return dict(h3=problem.sigma2 + problem.d / (1 + S), attention=problem.sigma2 + problem.d / (1 + problem.n**2 / T),
                weights=(1 / t) / np.sum(1 / t))


# ==================================================================================================================
# Correlated designs: RAG and task-feature alignment (§7)
# ==================================================================================================================


@dataclass(frozen=True)
class CorrelatedMoments:
    """R(cI) = E y_q² − 2cA + c²B with A = E[y_q u], B = E u², u = xᵀXᵀy (§7.1); D1, D2 the diagonal and
    off-diagonal parts of B = nD₁ + n(n−1)D₂."""

    A: float
    B: float
    query_second_moment: float
    D1: float
    D2: float


def _chi2_moments(d: int) -> tuple[float, float]:
    """μ₂ = E r², μ₃ = E r³ for r ~ χ²_d."""
    return float(d * (d + 2)), float(d * (d + 2) * (d + 4))


def correlated_moments(problem: H3Problem) -> CorrelatedMoments:
    """The moments of §7.1 for the rag and tfa designs of ``problem`` (H = Ψ = I)."""
    if problem.design == "iid":
        raise ValueError("design must be rag or tfa for the correlated moments (§7)")
    return isotropic_correlated_moments(problem.design, problem.d, problem.n, problem.alpha, problem.sigma2)


def isotropic_correlated_moments(design: str, d: int, n: int, alpha: float, sigma2: float) -> CorrelatedMoments:
    """The moments of §7.1 from the sizes alone (no d×d matrix is formed, so d = 10⁴ costs nothing):
    γ² = 1 − α², κ̄ = 1 + α²(d+1), μ_k = E r^k for r ~ χ²_d, A = ndκ̄ and

    D₂ = α⁴μ₃ + 2α²γ²μ₂ + γ⁴d,
    D₁(rag) = α⁴μ₃ + α²μ₂(σ² + γ²(d+5)) + γ²d(σ² + γ²(d+2)),
    D₁(tfa) = 3α⁴μ₃ + α²γ²(d+5)μ₂ + γ⁴μ₂ + σ²d."""
    if design not in ("rag", "tfa"):
        raise ValueError(f"design must be rag or tfa, got {design!r}")
    d, n = check.integer(d, "d", minimum=1), check.integer(n, "n", minimum=1)
    a2 = check.real(alpha, "alpha", minimum=0.0, maximum=1.0) ** 2
    s2 = check.real(sigma2, "sigma2", minimum=0.0)
    g2 = 1 - a2
    mu2, mu3 = _chi2_moments(d)
    kappa_bar = 1 + a2 * (d + 1)
    D2 = a2 * a2 * mu3 + 2 * a2 * g2 * mu2 + g2 * g2 * d
    if design == "rag":
        D1 = a2 * a2 * mu3 + a2 * mu2 * (s2 + g2 * (d + 5)) + g2 * d * (s2 + g2 * (d + 2))
    else:
        D1 = 3 * a2 * a2 * mu3 + a2 * g2 * (d + 5) * mu2 + g2 * g2 * mu2 + s2 * d
    return CorrelatedMoments(A=n * d * kappa_bar, B=n * D1 + n * (n - 1) * D2, query_second_moment=d + s2, D1=D1, D2=D2)


def correlated_optimum(problem: H3Problem) -> tuple[float, float]:
    """(L*, c*) = (E y_q² − A²/B, A/B): the best linear attention / H3 / PGD in the rag or tfa design (§7.1), where
    W = cI is optimal by rotation invariance."""
    m = correlated_moments(problem)
    return m.query_second_moment - m.A**2 / m.B, m.A / m.B


def isotropic_correlated_optimum(design: str, d: int, n: int, alpha: float, sigma2: float) -> tuple[float, float]:
    """:func:`correlated_optimum` from the sizes alone (§7.1)."""
    m = isotropic_correlated_moments(design, d, n, alpha, sigma2)
    return m.query_second_moment - m.A**2 / m.B, m.A / m.B


def alignment_multiplier(d: int, alpha: float) -> float:
    """κ = α²d + 1, the paper's sample-size multiplier of aligned designs (§7.2)."""
    d = check.integer(d, "d", minimum=1)
    return check.real(alpha, "alpha", minimum=0.0, maximum=1.0) ** 2 * d + 1


def effective_sample_size(problem: H3Problem, risk: float) -> float:
    """n_eff: the IID context length whose isotropic optimum σ² + d(d+1+σ²)/(n+d+1+σ²) equals ``risk`` (§7.2)."""
    return isotropic_effective_sample_size(problem.d, problem.sigma2, risk)


def isotropic_effective_sample_size(d: int, sigma2: float, risk: float) -> float:
    """n_eff = d(d+1+σ²)/(risk − σ²) − (d+1+σ²) (§7.2)."""
    d = check.integer(d, "d", minimum=1)
    sigma2 = check.real(sigma2, "sigma2", minimum=0.0)
    risk = check.real(risk, "risk", minimum=sigma2, strict=True)
    return d * (d + 1 + sigma2) / (risk - sigma2) - (d + 1 + sigma2)


def rag_risk_floor(problem: H3Problem) -> float:
    """lim_{n→∞} L*_RAG = d + σ² − d²κ̄²/D₂ > σ² (§7.3): a fixed step cannot undo the random gain α²‖x‖² + γ²."""
    m = correlated_moments(problem)
    kappa_bar = 1 + problem.alpha**2 * (problem.d + 1)
    return problem.d + problem.sigma2 - problem.d**2 * kappa_bar**2 / m.D2


# ==================================================================================================================
# The architectures' reductions (§3)
# ==================================================================================================================


def attention_effective_preconditioner(Wq, Wk, v, n: int) -> np.ndarray:
    """W_eff = (v_y W_xx + w_xy v_xᵀ)/n with [W_xx, w_xy] the top d rows of W_qW_kᵀ (§3.2): the odd part of linear
    attention is the PGD predictor xᵀW_eff Xᵀy. Shapes: Wq, Wk (d+1, d_k), v (d+1,)."""
    Wq, Wk, v = (check.finite_array(a, name) for a, name in ((Wq, "Wq"), (Wk, "Wk"), (v, "v")))
    n = check.integer(n, "n", minimum=1)
    if Wq.ndim != 2 or Wk.shape != Wq.shape or v.shape != (Wq.shape[0],):
        raise ValueError(f"Wq, Wk must share a shape (d+1, d_k) and v have shape (d+1,); got {Wq.shape}, {Wk.shape}, "
                         f"{v.shape}")
    d = Wq.shape[0] - 1
    W = Wq @ Wk.T
    return (v[d] * W[:d, :d] + np.outer(W[:d, d], v[:d])) / n


def h3_effective_parameters(Wq, Wk, Wv, f) -> tuple[np.ndarray, np.ndarray]:
    """(W_H, ω) with W_H = (1/n)Σ_j q_{j,x}(v_{j,y}k_{j,x} + k_{j,y}v_{j,x})ᵀ and ωᵢ = f_{n+1−i} (§3.3): the odd part of
    the H3 layer is the WPGD predictor xᵀW_H Xᵀ(ω⊙y). Shapes: Wq, Wk, Wv (d+1, m), f (n+1,)."""
    Wq, Wk, Wv, f = (check.finite_array(a, name) for a, name in ((Wq, "Wq"), (Wk, "Wk"), (Wv, "Wv"), (f, "f")))
    if f.ndim != 1 or f.size < 2:
        raise ValueError(f"f must be a vector of n + 1 >= 2 filter taps, got shape {f.shape}")
    if Wq.ndim != 2 or Wk.shape != Wq.shape or Wv.shape != Wq.shape:
        raise ValueError(f"Wq, Wk, Wv must share a shape (d+1, m) and f be a vector; got {Wq.shape}, {Wk.shape}, "
                         f"{Wv.shape}, {f.shape}")
    d, n = Wq.shape[0] - 1, f.size - 1
    W_H = (Wq[:d] @ (Wk[:d] * Wv[d] + Wv[:d] * Wk[d]).T) / n
    return W_H, f[n:0:-1].copy()


# ==================================================================================================================
# Gradient flow of the risk in the preconditioner (§4.4)
# ==================================================================================================================


def pgd_risk_gradient(problem: H3Problem, W, omega=None) -> np.ndarray:
    """∇_W R(W, ω) = −2(1ᵀω)HΨH + 2HWM_ω (§4.4); ω = 1 by default."""
    omega = np.ones(problem.n) if omega is None else _check_weights(problem, omega)
    W = _check_preconditioner(problem, W)
    H = problem.H
    return -2 * omega.sum() * H @ problem.Psi @ H + 2 * H @ W @ gradient_second_moment(problem, omega)


@njit(cache=True)
def preconditioner_flow_rhs_into(t, y, params, out):
    """Ẇ = −∇R = 2a HΨH − 2HWM (§4.4) on y = vec W (row-major), params = (d, a, vec HΨH, vec H, vec M), written into
    ``out`` (the integrator's calling convention) from views of ``params`` and ``y``, with one d × d work matrix."""
    d = int(params[0])
    a = params[1]
    size = d * d
    HPsiH = params[2:2 + size].reshape((d, d))
    H = params[2 + size:2 + 2 * size].reshape((d, d))
    M = params[2 + 2 * size:2 + 3 * size].reshape((d, d))
    W = y.reshape((d, d))
    dW = out.reshape((d, d))
    WM = np.zeros((d, d))
    for i in range(d):
        for k in range(d):
            w = W[i, k]
            for j in range(d):
                WM[i, j] += w * M[k, j]
    for i in range(d):
        for j in range(d):
            dW[i, j] = 2.0 * a * HPsiH[i, j]
        for k in range(d):
            h = 2.0 * H[i, k]
            for j in range(d):
                dW[i, j] -= h * WM[k, j]


@njit(cache=True)
def preconditioner_flow_rhs(t, y, params):
    """Ẇ = −∇R = 2a HΨH − 2HWM (§4.4) as a new vector: :func:`preconditioner_flow_rhs_into`."""
    out = np.empty(y.size)
    preconditioner_flow_rhs_into(t, y, params, out)
    return out


def pack_flow_params(problem: H3Problem, omega=None) -> np.ndarray:
    """Flat parameters of :func:`preconditioner_flow_rhs`: (d, 1ᵀω, vec HΨH, vec H, vec M_ω)."""
    omega = np.ones(problem.n) if omega is None else _check_weights(problem, omega)
    H = problem.H
    return np.concatenate([[problem.d, omega.sum()], (H @ problem.Psi @ H).ravel(), H.ravel(),
                           gradient_second_moment(problem, omega).ravel()])


# ==================================================================================================================
# Golden settings (§4.3, §5.3)
# ==================================================================================================================


def golden_setting_a() -> H3Problem:
    """Setting A of §4.3: d = 3, n = 8, σ² = 0.25, a correlated H and Ψ."""
    H = np.array([[1, .3, 0], [.3, .8, .2], [0, .2, .5]])
    Psi = np.array([[1, -.2, .1], [-.2, .6, 0], [.1, 0, .3]])
    return H3Problem(H=H, Psi=Psi, sigma2=0.25, n=8)


def golden_setting_d() -> H3Problem:
    """Setting D of §5.3: d = 4, n = 10, σ² = 0.1, Ψ = diag(2, 1, .5, .25)."""
    H = np.array([[1, .2, 0, 0], [.2, .8, 0, .1], [0, 0, .6, 0], [0, .1, 0, 1.2]])
    return H3Problem(H=H, Psi=np.diag([2, 1, .5, .25]), sigma2=0.1, n=10)
