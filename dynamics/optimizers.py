"""Optimisers for the minibatch simulators: in-place steps on a list of arrays, with a cosine learning-rate decay.

Shared by every system that trains a model on sampled prompts (gd_beta, linear_attention_h3), and by their
population predictions: the same optimiser on the exact gradient (:func:`exact_gradient_path`).
"""
from __future__ import annotations

import numpy as np

from attnflow.closed_forms import checks as check

from .montecarlo import MAX_STEPS

__all__ = ["Optimizer", "SGD", "Adam", "OPTIMIZERS", "cosine_schedule", "FINAL_FRACTION", "exact_gradient_path"]

# The default end of every cosine decay here (and of the trainers that use these optimisers): the learning rate
# falls to this fraction of its initial value at the last step.
FINAL_FRACTION = 0.01


def cosine_schedule(lr: float, steps: int, final_fraction: float = FINAL_FRACTION) -> np.ndarray:
    """The learning rates η₁, …, η_steps of every optimiser here: a cosine decay from ``lr`` to
    ``lr * final_fraction`` (step k uses progress k/steps)."""
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    steps = check.integer(steps, "steps", minimum=1)
    if steps > MAX_STEPS:
        raise ValueError(f"steps must be <= {MAX_STEPS:.0e}, got {steps}")
    final_fraction = check.real(final_fraction, "final_fraction", minimum=0.0, maximum=1.0)
    return _cosine(lr, np.minimum(np.arange(1, steps + 1) / steps, 1.0), final_fraction)


def _cosine(lr, progress, final_fraction):
    return lr * (final_fraction + (1 - final_fraction) * 0.5 * (1 + np.cos(np.pi * progress)))


class Optimizer:
    """A step on a list of arrays in place, with the learning rates of :func:`cosine_schedule`."""

    def __init__(self, params, lr, steps, final_fraction=FINAL_FRACTION):
        self.params, self.lr, self.steps, self.final = params, lr, steps, final_fraction
        self.k = 0

    def learning_rate(self):
        self.k += 1
        return _cosine(self.lr, min(self.k / self.steps, 1.0), self.final)


class SGD(Optimizer):
    def step(self, grads):
        lr = self.learning_rate()
        for p, g in zip(self.params, grads):
            p -= lr * g


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) with the default β₁ = 0.9, β₂ = 0.999, ε = 1e-8."""

    beta1, beta2, eps = 0.9, 0.999, 1e-8

    def __init__(self, params, lr, steps, final_fraction=FINAL_FRACTION):
        super().__init__(params, lr, steps, final_fraction)
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads):
        lr = self.learning_rate()
        c1, c2 = 1 - self.beta1**self.k, 1 - self.beta2**self.k
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= self.beta1
            m += (1 - self.beta1) * g
            v *= self.beta2
            v += (1 - self.beta2) * g * g
            p -= lr * (m / c1) / (np.sqrt(v / c2) + self.eps)


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


def exact_gradient_path(params, gradient, optimizer: str, lr: float, steps: int, record, *,
                        final_fraction: float = FINAL_FRACTION) -> list[list[np.ndarray]]:
    """The optimiser's path with the exact (population) gradient in place of the minibatch one: what a minibatch
    run would do without its sampling noise, from the same start with the same steps and schedule.

    ``params``: the starting arrays (copied); ``gradient(params) -> list of arrays``; ``record``: increasing steps
    in [0, steps]. Returns copies of the parameters at each recorded step."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    steps = check.integer(steps, "steps", minimum=1)
    if steps > MAX_STEPS:
        raise ValueError(f"steps must be <= {MAX_STEPS}, got {steps}")
    if not callable(gradient):
        raise ValueError("gradient must be a function of the parameters")
    record = check.finite_array(record, "record", ndim=1)
    if np.any(record != np.round(record)) or record.size == 0 or np.any(np.diff(record) <= 0) or record[0] < 0 or record[-1] > steps:
        raise ValueError(f"record must be increasing steps in [0, {steps}]")
    params = [np.array(check.finite_array(p, f"params[{k}]"), dtype=float) for k, p in enumerate(params)]
    opt = OPTIMIZERS[optimizer](params, lr, steps, final_fraction)
    wanted = set(int(k) for k in record)
    path = [[p.copy() for p in params]] if 0 in wanted else []
    for step in range(1, int(record[-1]) + 1):
        opt.step(gradient(params))
        if step in wanted:
            path.append([p.copy() for p in params])
    return path
