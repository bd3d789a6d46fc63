import numpy as np
import pytest

from attnflow.validation.stats import Z_TOLERANCE


def assert_within_standard_errors(measured_mean, standard_error, predicted, k=Z_TOLERANCE):
    """|measured − predicted| < k standard errors (elementwise for arrays)."""
    measured_mean, standard_error, predicted = (np.asarray(v, float) for v in (measured_mean, standard_error, predicted))
    z = (measured_mean - predicted) / standard_error
    assert np.all(np.abs(z) < k), f"max |z| = {np.abs(z).max():.2f} >= {k}: measured {measured_mean}, predicted {predicted}"


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)
