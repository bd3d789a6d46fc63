"""The shared scalar-loop softmax kernels give the numbers of the array expressions they replace inside compiled
code, bit for bit (the reason they exist)."""
import numpy as np
from numba import njit

from attnflow.closed_forms.softmax import max_propagating_nan, softmax_into


@njit
def _array_expression_softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def test_softmax_into_is_the_compiled_array_expression_bit_for_bit():
    # The reference is the array expression compiled by numba, not numpy called from Python: numpy's exp is a SIMD
    # loop chosen by the CPU (on AVX-512 it differs from libm's exp by an ulp), and numpy's sum is pairwise, where
    # numba calls libm's exp and sums left to right.
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50):
        z = rng.normal(scale=30.0, size=n)
        out = np.empty(n)
        softmax_into(z, out)
        np.testing.assert_array_equal(out, _array_expression_softmax(z))
        softmax_into(z, z)  # in place
        np.testing.assert_array_equal(z, out)


def test_a_nan_wins_the_maximum_and_the_softmax():
    z = np.array([1.0, np.nan, 3.0])
    assert np.isnan(max_propagating_nan(z))
    assert max_propagating_nan(np.array([1.0, 3.0, 2.0])) == 3.0
    out = np.empty(3)
    softmax_into(z, out)
    assert np.all(np.isnan(out))
