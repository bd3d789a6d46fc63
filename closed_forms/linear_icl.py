"""In-context linear regression with Gaussian data: the mathematics several systems share.

A prompt draws a task β with second moment S = E[ββᵀ], features x_1..x_N, x_q ~ N(0, H) and labels
y = ⟨x, β⟩ + ε, ε ~ N(0, σ²). One step of preconditioned gradient descent from zero predicts
ŷ = x_qᵀ Γ Xᵀy / N. Its risk follows from the Gaussian fourth moment E[x xᵀA x xᵀ] = H(A + Aᵀ)H + tr(AH)H, which
for the sample covariance Ĥ = XᵀX/N gives the Wishart moment E[ĤAĤ] = (N+1)/N·HAH + tr(AH)H/N (A symmetric).
Derivations: docs/gd_beta.md (GD-β with β₀ ≠ 0, where S = Ψ + (β* − β₀)(β* − β₀)ᵀ) and docs/linear_attention_h3.md §4
(one-step preconditioned GD, S = Ψ). Used by :mod:`attnflow.closed_forms.gd_beta` and
:mod:`attnflow.closed_forms.linear_attention_h3`.
"""
from __future__ import annotations

import numpy as np

__all__ = ["gaussian_fourth_moment", "preconditioned_gd_risk", "omega_matrix", "optimal_step_matrix",
           "spectral_optimal_risk"]


def gaussian_fourth_moment(H: np.ndarray, A: np.ndarray) -> np.ndarray:
    """E[x xᵀ A x xᵀ] = H(A + Aᵀ)H + tr(AH) H for x ~ N(0, H) (Isserlis), any square A of H's size."""
    return H @ (A + A.T) @ H + np.trace(A @ H) * H


def preconditioned_gd_risk(H: np.ndarray, S: np.ndarray, sigma2: float, N: int, Gamma: np.ndarray) -> np.ndarray:
    """Risk E(x_qᵀ(β₀ + ΓXᵀ(y − Xβ₀)/N) − y_q)² of one preconditioned GD step, S = E[(β − β₀)(β − β₀)ᵀ]:

    R = σ² + tr(HS) − 2 tr(HΓHS) + (N+1)/N tr(ΓᵀHΓ HSH) + (tr(HS) + σ²)/N tr(ΓᵀHΓH),

    the Wishart moment E[ĤAĤ] applied to the error (I − ΓĤ)(β − β₀) − ΓXᵀε/N (docs/linear_attention_h3.md §4).

    Parameters
    ----------
    H : ndarray, shape (d, d)
    S : ndarray, shape (..., d, d)     second moment of the task error
    Gamma : ndarray, shape (..., d, d) leading axes broadcast with S's

    Returns
    -------
    ndarray, shape (...)
    """
    HS = H @ S
    tr_HS = np.trace(HS, axis1=-2, axis2=-1)
    HG = H @ Gamma
    GtHG = np.swapaxes(Gamma, -1, -2) @ HG
    return (
        sigma2
        + tr_HS
        - 2 * np.trace(HG @ HS, axis1=-2, axis2=-1)
        + (N + 1) / N * np.trace(GtHG @ HS @ H, axis1=-2, axis2=-1)
        + (tr_HS + sigma2) / N * np.trace(GtHG @ H, axis1=-2, axis2=-1)
    )


def omega_matrix(S_tilde: np.ndarray, sigma2: float, N: int) -> np.ndarray:
    """Ω(S̃) = (N+1)/N S̃ + (tr S̃ + σ²)/N I: the whitened second moment of Ĥ-weighted labels, so that the risk is
    quadratic in Γ̃ = H^{1/2}ΓH^{1/2} with curvature Ω (docs/linear_attention_h3.md §4)."""
    return (N + 1) / N * S_tilde + (np.trace(S_tilde) + sigma2) / N * np.eye(S_tilde.shape[0])


def optimal_step_matrix(H_half_pinv: np.ndarray, Psi_tilde: np.ndarray, Omega: np.ndarray) -> np.ndarray:
    """Γ* = H^{+1/2} Ψ̃ Ω⁻¹ H^{+1/2}, the minimiser of the risk above (symmetric; Ψ̃ and Ω commute)."""
    Gamma = H_half_pinv @ (Psi_tilde @ np.linalg.inv(Omega)) @ H_half_pinv
    return (Gamma + Gamma.T) / 2


def spectral_optimal_risk(psi: np.ndarray, sigma2: float, N: int) -> float:
    """min_Γ R = σ² + Σᵢ ψᵢ(ψᵢ + s) / ((N+1)ψᵢ + s), s = Σψ + σ², ψ the eigenvalues of Ψ̃ = H^{1/2}ΨH^{1/2}
    (docs/linear_attention_h3.md §4.2)."""
    psi = np.asarray(psi, float)
    s = psi.sum() + sigma2
    return float(sigma2 + np.sum(psi * (psi + s) / ((N + 1) * psi + s)))
