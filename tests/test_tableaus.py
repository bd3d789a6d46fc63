"""The embedded Runge–Kutta pairs as data (dynamics/tableaus.py): the vendored coefficients are scipy's floats bit
for bit, they satisfy the pairs' order conditions, and the kernels written out from them are current."""
import numpy as np
import pytest
from scipy.integrate import RK45

from attnflow.dynamics import rk_kernels
from attnflow.dynamics.tableaus import DOP853, DOPRI5, METHODS


def _square(rows, size):
    matrix = np.zeros((size, size))
    for s, row in enumerate(rows):
        matrix[s, :len(row)] = row
    return matrix


def _same_bits(ours, theirs):
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours.view(np.uint64), theirs.view(np.uint64))


def test_dop853_is_scipys_dop853_bit_for_bit():
    """The vendored DOP853 coefficients against scipy's own (a private module: read here only, to check the copy)."""
    from scipy.integrate._ivp import dop853_coefficients as scipy_dop853

    assert DOP853.n_stages == scipy_dop853.N_STAGES + 1  # scipy counts the first-same-as-last stage apart
    assert len(DOP853.c) == scipy_dop853.N_STAGES_EXTENDED
    assert len(DOP853.dense) == scipy_dop853.INTERPOLATOR_POWER - 3
    _same_bits(DOP853.c, scipy_dop853.C)
    _same_bits(_square(DOP853.a, 16), scipy_dop853.A)
    _same_bits(DOP853.b, scipy_dop853.B)
    _same_bits(DOP853.error, scipy_dop853.E5)
    _same_bits(DOP853.error_3, scipy_dop853.E3)
    _same_bits(DOP853.dense, scipy_dop853.D)


def test_dopri5_is_scipys_rk45_bit_for_bit():
    """scipy's RK45 is the same Dormand–Prince pair; its error weights are ours with the sign flipped."""
    _same_bits(DOPRI5.c[:6], RK45.C)
    _same_bits(_square(DOPRI5.a, 7)[:6, :5], RK45.A)
    _same_bits(DOPRI5.b, RK45.B)
    _same_bits(np.negative(DOPRI5.error) + 0.0, RK45.E)  # + 0.0: the zero weight as +0.0


@pytest.mark.parametrize("pair", METHODS, ids=lambda pair: pair.name)
def test_order_conditions(pair):
    """Row sums equal the nodes (Σ_r a_sr = c_s); the weights of the solution sum to 1 and those of every error
    estimate (a difference of two solutions) to 0; the quadrature conditions Σ b_s c_s^(k−1) = 1/k hold up to the
    pair's order. A mistyped coefficient breaks one of them far above round-off."""
    a = _square(pair.a, len(pair.c))
    c = np.array(pair.c)
    np.testing.assert_allclose(a.sum(axis=1), c, rtol=0, atol=1e-14)
    b = np.array(pair.b + (0.0,) * (pair.n_stages - len(pair.b)))
    for k in range(1, pair.order + 1):
        assert b @ c[:pair.n_stages] ** (k - 1) == pytest.approx(1.0 / k, abs=1e-13), k
    for weights in (pair.error, pair.error_3):
        if weights is not None:
            assert abs(np.sum(weights)) < 1e-14
    assert pair.b == pair.a[pair.n_stages - 1] and pair.c[pair.n_stages - 1] == 1.0  # first same as last


def test_the_written_out_kernels_are_current():
    """dynamics/rk_kernels_generated.py is what ``python -m attnflow.dynamics.rk_kernels`` writes from the tables."""
    assert rk_kernels.GENERATED.read_text() == rk_kernels.source(), \
        "regenerate with: python -m attnflow.dynamics.rk_kernels"
