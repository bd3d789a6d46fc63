"""The one record grid of the training loops: the same steps, bit for bit, as each loop's own expression gave."""
import numpy as np
import pytest

from attnflow.dynamics.montecarlo import log_grid, log_spaced_steps


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 10, 59, 60, 61, 1000, 123457])
@pytest.mark.parametrize("n", [1, 2, 5, 59, 60, 200])
def test_the_record_grid_is_the_loops_earlier_expressions(steps, n):
    grid = log_grid(steps, n)
    # random_walk, group_sparse, one_nn (n log-spaced points), and ccmc and montecarlo (their n - 1)
    assert np.array_equal(grid, np.unique(np.concatenate([[0], np.geomspace(1, steps, n).round().astype(int)])))
    assert np.array_equal(grid, np.unique(np.concatenate([[0], np.geomspace(1, steps, n).round()]).astype(np.int64)))
    assert np.array_equal(log_spaced_steps(steps, n + 1),
                          np.concatenate([[0], np.unique(np.round(np.geomspace(1, steps, n)).astype(np.int64))]))
    assert grid.dtype == np.int64 and grid[0] == 0 and np.all(np.diff(grid) > 0)
    assert grid[-1] == (steps if n >= 2 else 1)  # one log-spaced point is step 1
