"""attnflow: theorems about how one-layer transformers learn, turned into numbers that can be checked.

Each paper is a *system* (:class:`System`) registered under the entry-point group ``attnflow.systems``: its
Problem, its population dynamics and its minibatch algorithm (both returning a :class:`Trajectory`), and its
claims. The layers are ``attnflow.closed_forms`` (the mathematics), ``attnflow.dynamics`` (integrators and
simulators) and ``attnflow.validation`` (claims, sweeps, reports, the command line); imports flow
validation → dynamics → closed_forms, and every layer takes its seeds from :mod:`attnflow.seeding`.

    >>> import attnflow
    >>> system = attnflow.get_system("gd_beta")
    >>> result = attnflow.run_claim(attnflow.select(["gd_beta.risk_formula"])[0], seed=0)
"""
from __future__ import annotations

from importlib import metadata as _metadata

from attnflow.dynamics.errors import DivergenceError as DivergenceError
from attnflow.dynamics.errors import StageFailure as StageFailure
from attnflow.dynamics.montecarlo import Trajectory as Trajectory
from attnflow.validation.claims import CheckResult as CheckResult
from attnflow.validation.claims import Claim as Claim
from attnflow.validation.claims import Outcome as Outcome
from attnflow.validation.claims import ScalingLaw as ScalingLaw
from attnflow.validation.claims import claim as claim
from attnflow.validation.claims import observable as observable
from attnflow.validation.claims import run_claim as run_claim

from attnflow.validation.systems import Parameter as Parameter
from attnflow.validation.systems import System as System
from attnflow.validation.systems import get_system as get_system
from attnflow.validation.systems import select as select
from attnflow.validation.systems import system_keys as system_keys

try:
    __version__ = _metadata.version("attnflow")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__", "System", "Parameter", "get_system", "system_keys", "Trajectory", "Claim", "CheckResult",
           "Outcome", "ScalingLaw", "claim", "observable", "select", "run_claim", "DivergenceError", "StageFailure"]
