"""closed_forms/lapack.py: LAPACK's dgesv called directly gives np.linalg.solve's solution bit for bit (numba's
np.linalg.solve makes the same call), and fails as it does."""
import numpy as np
import pytest
from numba import njit

from attnflow.closed_forms.lapack import DGESV, solve_into


@njit(cache=True)
def _numba_solve(A, b):
    return np.linalg.solve(A, b)


def _solve(A, b):
    n = b.size
    x = np.empty(n)
    solve_into(DGESV, A, b, np.empty(n * n), np.empty(n, np.int32), x)
    return x


def test_solution_is_np_linalg_solve_bit_for_bit():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 8, 17):
        for _ in range(20):
            A = rng.normal(size=(n, n)) * rng.lognormal(sigma=3.0, size=(n, 1))  # badly scaled rows: pivoting
            b = rng.normal(size=n)
            x = _solve(A, b)
            assert np.array_equal(x, _numba_solve(A, b))
            np.testing.assert_allclose(A @ x, b, rtol=1e-6, atol=1e-6 * np.abs(A).max() * np.abs(x).max())


def test_inputs_are_left_untouched():
    rng = np.random.default_rng(1)
    A, b = rng.normal(size=(4, 4)), rng.normal(size=4)
    A0, b0 = A.copy(), b.copy()
    _solve(A, b)
    assert np.array_equal(A, A0) and np.array_equal(b, b0)


def test_singular_and_non_finite_systems_raise_as_numba_does():
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        _solve(np.ones((3, 3)), np.ones(3))
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        _numba_solve(np.ones((3, 3)), np.ones(3))
    with pytest.raises(np.linalg.LinAlgError, match="infs or NaNs"):
        _solve(np.array([[1.0, np.nan], [0.0, 1.0]]), np.ones(2))
    with pytest.raises(np.linalg.LinAlgError, match="infs or NaNs"):
        _solve(np.eye(2), np.array([1.0, np.inf]))
