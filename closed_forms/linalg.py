"""Linear algebra of PSD matrices with an explicit numerical-rank cut-off.

docs/gd_beta.md §11.9: a spurious 1e-17 eigenvalue of a rank-deficient matrix blows up any inverse, so every
eigenvalue below ``RANK_CUTOFF * lambda_max`` is treated as exactly zero before taking roots or inverses.
"""
from __future__ import annotations

import numpy as np

RANK_CUTOFF = 1e-12


def psd_eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending, numerically-zero ones set to 0) and eigenvectors of a symmetric PSD matrix."""
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    top = values.max(initial=0.0)
    values = np.where(values > RANK_CUTOFF * max(top, 0.0), values, 0.0)
    return values, vectors


def psd_power(matrix: np.ndarray, power: float) -> np.ndarray:
    """``M^power`` on the range of M and 0 on its null space (power < 0 gives the pseudo-inverse power)."""
    values, vectors = psd_eigh(matrix)
    positive = values > 0
    powered = np.zeros_like(values)
    powered[positive] = values[positive] ** power
    return (vectors * powered) @ vectors.T


def range_projector(matrix: np.ndarray) -> np.ndarray:
    """Orthogonal projector onto the range of a symmetric PSD matrix."""
    values, vectors = psd_eigh(matrix)
    basis = vectors[:, values > 0]
    return basis @ basis.T


def range_basis(matrix: np.ndarray) -> np.ndarray:
    """Orthonormal basis (columns) of the range of a symmetric PSD matrix."""
    values, vectors = psd_eigh(matrix)
    return vectors[:, values > 0]


def numerical_rank(matrix: np.ndarray) -> int:
    return int(np.count_nonzero(psd_eigh(matrix)[0]))
