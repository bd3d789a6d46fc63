"""The shared scalar-loop softmax kernels give numpy's numbers bit for bit (the reason they exist)."""
import numpy as np

from attnflow.closed_forms.softmax import max_propagating_nan, softmax_into


def test_softmax_into_is_numpys_arithmetic_bit_for_bit():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50):
        z = rng.normal(scale=30.0, size=n)
        e = np.exp(z - z.max())
        out = np.empty(n)
        softmax_into(z, out)
        # numpy's sum is pairwise; the kernel adds left to right, as numba's sum does
        total = 0.0
        for v in e:
            total += v
        np.testing.assert_array_equal(out, e / total)
        softmax_into(z, z)  # in place
        np.testing.assert_array_equal(z, out)


def test_a_nan_wins_the_maximum_and_the_softmax():
    z = np.array([1.0, np.nan, 3.0])
    assert np.isnan(max_propagating_nan(z))
    assert max_propagating_nan(np.array([1.0, 3.0, 2.0])) == 3.0
    out = np.empty(3)
    softmax_into(z, out)
    assert np.all(np.isnan(out))
