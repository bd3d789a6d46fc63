"""A toy paper, packaged as a plugin would be: scalar least squares trained by gradient descent.

Model: x ~ N(0, 1), y = a·x + s·ε, loss ½(θx − y)². The population gradient is θ − a, so gradient descent with step
η from θ₀ = 0 gives E θ_k = a(1 − (1 − η)^k) exactly, also on fresh minibatches (each step's batch is independent
of θ_k and E x² = 1). The tests register this module under the entry-point group ``attnflow.systems`` without
touching attnflow, and use it through every command.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from attnflow import seeding
from attnflow import Parameter, System, Trajectory, claim, observable
from attnflow.closed_forms.parameters import parse_parameters
from attnflow.validation.claims import Outcome


@dataclass(frozen=True)
class ToyProblem:
    a: float = 1.0
    s: float = 0.5

    PARAMETERS = (Parameter("a", "real", 1.0, "the true slope"),
                  Parameter("s", "real", 0.5, "noise scale", minimum=0.0))

    @classmethod
    def from_params(cls, values) -> "ToyProblem":
        return cls(**parse_parameters(cls.PARAMETERS, values, owner="toy"))


def expected_theta(problem: ToyProblem, eta: float, steps) -> np.ndarray:
    return problem.a * (1 - (1 - eta) ** np.asarray(steps, float))


def population(problem: ToyProblem, *, eta: float = 0.1, steps: int = 50) -> Trajectory:
    k = np.arange(steps + 1, dtype=float)
    theta = expected_theta(problem, eta, k)
    return Trajectory(times=k, states=dict(theta=theta), metrics=dict(error=np.abs(theta - problem.a)))


def minibatch(problem: ToyProblem, *, seed, eta: float = 0.1, steps: int = 50, batch_size: int = 32) -> Trajectory:
    rng = np.random.default_rng(seeding.as_seed_sequence(seed))
    theta = np.zeros(steps + 1)
    for k in range(steps):
        x = rng.standard_normal(batch_size)
        y = problem.a * x + problem.s * rng.standard_normal(batch_size)
        theta[k + 1] = theta[k] - eta * np.mean((theta[k] * x - y) * x)
    return Trajectory(times=np.arange(steps + 1, dtype=float), states=dict(theta=theta),
                      metrics=dict(error=np.abs(theta - problem.a)))


@claim("toy.mean_matches_population", reference="a toy paper for the plugin tests",
       statement="The seed-mean of θ_k on minibatches equals a(1 − (1 − η)^k) within 4 standard errors.",
       quick=dict(seeds=64, steps=20), full=dict(seeds=256, steps=50))
def mean_matches_population(seed, seeds, steps):
    problem = ToyProblem()
    finals = np.array([minibatch(problem, seed=s, steps=steps).states["theta"][-1] for s in seed.spawn(seeds)])
    predicted = float(expected_theta(problem, 0.1, steps))
    z = (finals.mean() - predicted) / (finals.std(ddof=1) / np.sqrt(seeds))
    return Outcome(measured={"mean_theta": float(finals.mean()), "z": float(z)}, predicted={"mean_theta": predicted},
                   labels={"mean_theta": "seed-mean of θ_k / a(1 − (1 − η)^k)"},
                   tolerance="|z| < 4", basis=f"4 standard errors over {seeds} seeds (t with {seeds - 1} df)",
                   false_fail_rate=2 * float(stats.t.sf(4.0, seeds - 1)), passed=bool(abs(z) < 4))


@observable("toy.final_error", reference="a toy paper for the plugin tests", description="|θ_k − a| after k steps",
            defaults=dict(batch_size=32, steps=20))
def final_error(seed, batch_size, steps):
    return dict(error=float(minibatch(ToyProblem(), seed=seed, steps=int(steps),
                                      batch_size=int(batch_size)).metrics["error"][-1]))


SYSTEM = System(key="toy", title="Scalar least squares (a toy plugin)", reference="a toy paper for the plugin tests",
                problem=ToyProblem, population=population, minibatch=minibatch,
                population_options=(Parameter("eta", "real", 0.1, "step size", minimum=0.0, strict=True),
                                    Parameter("steps", "integer", 50, "steps", minimum=1, maximum=100_000)),
                minibatch_options=(Parameter("eta", "real", 0.1, "step size", minimum=0.0, strict=True),
                                   Parameter("steps", "integer", 50, "steps", minimum=1, maximum=100_000),
                                   Parameter("batch_size", "integer", 32, "samples per step", minimum=1,
                                             maximum=1_000_000)))
