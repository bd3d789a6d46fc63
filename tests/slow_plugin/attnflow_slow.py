"""A plugin whose claims only take time: each sleeps, then reports a number drawn from its own seed. The tests of
``attnflow check``'s runner use it to stop runs part-way, resume them and compare backends without waiting for
real claims."""
from __future__ import annotations

import os
import time

import numpy as np

from attnflow import Parameter, System, Trajectory, claim
from attnflow.validation import plots
from attnflow.validation.claims import Outcome

CLAIMS = 6


class SlowProblem:
    PARAMETERS = (Parameter("steps", "integer", 3, "records", minimum=1, maximum=100),)

    @classmethod
    def from_params(cls, values) -> "SlowProblem":
        return cls()


def _trajectory(problem, **options) -> Trajectory:
    return Trajectory(times=np.arange(3.0), states={}, metrics=dict(value=np.zeros(3)))


def _register(index: int) -> None:
    @claim(f"slow.claim_{index}", reference="a plugin for the runner's tests",
           statement="A number drawn from the claim's seed lies in [0, 1).",
           quick=dict(seconds=0.01 * (index + 1)), full=dict(seconds=0.4 * (index + 1)))
    def sleeps(seed, seconds):
        time.sleep(seconds)
        if os.environ.get("ATTNFLOW_SLOW_CRASH") == f"slow.claim_{index}":
            os._exit(3)  # a worker that dies as one killed for its memory would
        value = float(np.random.default_rng(seed).random())

        def figure():
            fig, ax = plots.figure()
            ax.plot([0, 1], [value, value], label="value")
            ax.legend()
            return fig

        return Outcome(measured={"value": value, "sleep": seconds}, predicted={"upper": 1.0}, tolerance="0 <= value < 1",
                       basis="a uniform draw", passed=0.0 <= value < 1.0, figure=figure if index == 0 else None)


for _index in range(CLAIMS):
    _register(_index)

SYSTEM = System(key="slow", title="Claims that take time (a test plugin)", reference="a plugin for the runner's tests",
                problem=SlowProblem, population=_trajectory, minibatch=lambda problem, *, seed, **o: _trajectory(problem))
