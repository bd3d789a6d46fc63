"""Boundary checks shared by every system's Problem: each raises ``ValueError`` naming the parameter.

They run in ``__post_init__`` and in the thin wrappers around numba kernels, so bad input never reaches
compiled code (where it would surface as a deep traceback or a silent NaN).
"""
from __future__ import annotations

import numbers

import numpy as np

# Relative tolerance for symmetry and for the smallest admissible eigenvalue of a "PSD" matrix.
PSD_TOLERANCE = 1e-10


def finite_array(value, name: str, *, ndim: int | None = None, shape: tuple | None = None,
                 order: str = "K") -> np.ndarray:
    """A read-only float64 copy of ``value``, checked to be finite and of the given shape; ``order="C"`` makes the
    copy C-ordered whatever the input's layout (a numba kernel compiles once per layout it is given)."""
    try:
        array = np.array(value, dtype=np.float64, copy=True, order=order)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be a numeric array ({error})") from None
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {array.shape}")
    if shape is not None and array.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    array.setflags(write=False)
    return array


def symmetric_psd(value, name: str, size: int | None = None) -> np.ndarray:
    """A finite, square, symmetric positive semi-definite matrix (rank-deficient allowed)."""
    matrix = finite_array(value, name, ndim=2)
    if matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{name} must be square, got shape {matrix.shape}")
    if size is not None and matrix.shape[0] != size:
        raise ValueError(f"{name} must be {size}x{size}, got {matrix.shape}")
    scale = max(1.0, float(np.abs(matrix).max(initial=0.0)))
    if np.abs(matrix - matrix.T).max(initial=0.0) > PSD_TOLERANCE * scale:
        raise ValueError(f"{name} must be symmetric")
    # eigenvalues of the matrix divided by its scale: LAPACK fails to converge on entries near the overflow limit
    smallest = scale * float(np.linalg.eigvalsh(matrix / scale).min(initial=0.0))
    if smallest < -PSD_TOLERANCE * scale:
        raise ValueError(f"{name} must be positive semi-definite (smallest eigenvalue {smallest:.3g})")
    return matrix


def correlation(A, B) -> float:
    """corr(A, B) = <A, B>_F/(‖A‖_F ‖B‖_F) of two finite arrays of the same size, neither zero (undefined there)."""
    A = finite_array(A, "A").ravel()
    B = finite_array(B, "B").ravel()
    if A.size != B.size:
        raise ValueError(f"A and B must have the same number of entries, got {A.size} and {B.size}")
    norm_A, norm_B = np.linalg.norm(A), np.linalg.norm(B)
    if norm_A == 0 or norm_B == 0:
        raise ValueError("the correlation of a zero array is undefined (A or B is zero)")
    return float(A @ B / (norm_A * norm_B))


def integer(value, name: str, minimum: int | None = None) -> int:
    """A whole number (bools refused) at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def boolean(value, name: str) -> bool:
    """True or False (a numpy bool too); anything else — 0, 1, "yes", NaN — is refused, since its truth value would
    silently pick a branch."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def real(value, name: str, *, minimum: float | None = None, strict: bool = False,
         maximum: float | None = None) -> float:
    """A finite real number, optionally ``>= minimum`` (or ``> minimum`` when ``strict``) and ``<= maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be {relation} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value
