"""A diagnostic observable of the sweep machinery itself, ``sweep.sleep``: it measures a backend's per-task
overhead and exercises interruption and resume (docs/sweeps.md).

It lives apart from :mod:`attnflow.validation.sweep` so that loading it (the registry does, for the ``sweep.``
prefix) imports only what it needs: a claim module's code fingerprint follows the registry's imports, and it must
not take in the engine and the reports, which compute none of a claim's numbers.
"""
from __future__ import annotations

import time

import numpy as np

from attnflow.closed_forms import checks as check

from .claims import observable

__all__ = []


@observable(
    "sweep.sleep",
    reference="attnflow diagnostic (no paper)",
    description="Sleeps `seconds` and returns a seeded uniform number: measures per-task overhead of a backend "
                "and exercises interruption and resume.",
    defaults=dict(seconds=0.0, size=1),
)
def _sleep(seed, seconds, size):
    seconds = check.real(seconds, "seconds", minimum=0.0, maximum=3600.0)
    size = check.integer(size, "size", minimum=1)
    if size > 10**7:
        raise ValueError(f"size must be <= 10**7 (a diagnostic draw, not an experiment), got {size}")
    time.sleep(seconds)
    return dict(value=float(np.random.default_rng(seed).random(int(size)).mean()), seconds=float(seconds))
