"""The diffusion tier between the population dynamics and minibatch simulation (docs/diffusion.md).

Minibatch SGD with step η_k and batch B is θ_{k+1} = θ_k − η_k ĝ_B(θ_k), where ĝ_B is the mean of B independent
per-sample gradients: an unbiased estimate of ∇R(θ_k) with covariance Σ(θ_k)/B. Two approximations of it need
only ∇R, ∇²R and Σ:

* :func:`linear_noise` — the linear-noise approximation (LNA) of the finite-step algorithm: the population path
  θ̄_{k+1} = θ̄_k − η_k∇R(θ̄_k) and the exact recursion of the covariance of the linearised fluctuations,
  C_{k+1} = A_k C_k A_kᵀ + (η_k²/B) Σ(θ̄_k), A_k = I − η_k∇²R(θ̄_k), C_0 = 0.
* :func:`gaussian_noise_paths` — the Euler–Maruyama discretisation of dθ = −∇R dt + √(ηΣ(θ)/B) dW with the
  algorithm's own steps: θ_{k+1} = θ_k − η_k∇R(θ_k) + (η_k/√B) Σ(θ_k)^{1/2} ξ_k, ξ_k ~ N(0, I). It keeps the
  drift's nonlinearity and the state dependence of Σ, which the LNA drops; it is what "population gradient plus
  Gaussian noise" means when the noise level is the exact Σ.

Both work on a flat parameter vector θ ∈ ℝᵖ and take the system's closed forms as callables. Σ may be an estimate:
``noise_covariance(θ)`` returns a stack of ``n_batches`` independent unbiased estimates (batch means of a Monte-Carlo
pool, or one exact matrix), and because C_k is linear in the Σ's, the LNA carries one covariance per batch and
reports the standard error of C_k that Σ's own Monte-Carlo error causes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from attnflow.closed_forms import checks as check
from attnflow import seeding
from attnflow.seeding import SeedLike

from .errors import DivergenceError
from . import progress

__all__ = ["NoiseBand", "linear_noise", "gaussian_noise_paths", "pool_size", "MAX_PATHS"]


@dataclass(frozen=True)
class NoiseBand:
    """The LNA's prediction at the recorded steps.

    steps : (n,) step indices (0 is the start).
    mean : (n, p) the population path θ̄_k.
    covariance : (n, p, p) C_k, the covariance of θ_k − θ̄_k to leading order in η/B (the mean over batches).
    batch_covariances : (n, n_batches, p, p) C_k from each batch estimate of Σ alone: independent, so their spread
        is the Monte-Carlo error of C_k (one batch, and no error, for an exact Σ).
    """

    steps: np.ndarray
    mean: np.ndarray
    covariance: np.ndarray
    batch_covariances: np.ndarray

    @property
    def n_batches(self) -> int:
        return self.batch_covariances.shape[1]

    def variance(self, direction) -> tuple[np.ndarray, np.ndarray]:
        """Predicted variance of wᵀθ_k (delta method for a smooth metric, with w its gradient) at every recorded
        step, and its standard error from the spread of the batch estimates (0 for a single batch); ``direction``
        is (p,) or (n, p) (a gradient per step)."""
        w = np.broadcast_to(np.asarray(direction, float), self.mean.shape)
        return self._mean_and_se(np.einsum("np,nbpq,nq->nb", w, self.batch_covariances, w))

    def smooth_metric(self, gradients, hessians) -> tuple[np.ndarray, np.ndarray]:
        """How a smooth metric m(θ_k) spreads over the runs, to second order in the fluctuation δ ~ N(0, C_k) (the
        LNA's leading-order law): m(θ̄ + δ) ≈ m(θ̄) + gᵀδ + ½δᵀHδ has mean m(θ̄) + ½tr(HC) and variance
        gᵀCg + ½tr((HC)²). Returns that mean shift and standard deviation at every recorded step; ``gradients``
        (n, p) and ``hessians`` (n, p, p) are m's at θ̄_k. Near an optimum, where g → 0, the second-order terms
        are the whole spread (a risk cannot fall below its minimum)."""
        g = np.asarray(gradients, float).reshape(self.mean.shape)
        H = np.asarray(hessians, float).reshape(self.covariance.shape)
        HC = H @ self.covariance
        shift = 0.5 * np.trace(HC, axis1=1, axis2=2)
        variance = np.einsum("np,npq,nq->n", g, self.covariance, g) + 0.5 * np.einsum("nij,nji->n", HC, HC)
        return shift, np.sqrt(np.clip(variance, 0.0, None))

    def total_variance(self) -> tuple[np.ndarray, np.ndarray]:
        """tr C_k at every recorded step and its standard error (spread of the batch traces)."""
        return self._mean_and_se(np.trace(self.batch_covariances, axis1=2, axis2=3))

    def _mean_and_se(self, per_batch):
        if self.n_batches < 2:
            return per_batch[:, 0], np.zeros(per_batch.shape[0])
        return per_batch.mean(axis=1), per_batch.std(axis=1, ddof=1) / np.sqrt(self.n_batches)


MAX_PATHS = 1_000_000  # sampled paths of gaussian_noise_paths, each recorded at every record step


def pool_size(n_contexts: int, n_batches: int) -> int:
    """The number of contexts of a Monte-Carlo pool for Σ, checked and rounded down to whole batches (at least two
    batches of at least two contexts, so each batch gives an estimate and their spread a standard error)."""
    n_batches = check.integer(n_batches, "n_batches", minimum=2)
    n_contexts = check.integer(n_contexts, "n_contexts", minimum=2 * n_batches)
    return n_contexts - n_contexts % n_batches


def _record(record, n_steps: int) -> np.ndarray:
    """The recorded steps: all of 0..n_steps by default, else unique increasing integers in [0, n_steps]."""
    if record is None:
        return np.arange(n_steps + 1)
    record = np.asarray(record)
    if record.ndim != 1 or record.size == 0 or not np.issubdtype(record.dtype, np.integer):
        raise ValueError("record must be a non-empty sequence of integer steps")
    if np.any(np.diff(record) <= 0) or record[0] < 0 or record[-1] > n_steps:
        raise ValueError(f"record must be increasing steps in [0, {n_steps}], got {record.tolist()}")
    return record.astype(int)


def _noise(noise_covariance, theta, p: int) -> np.ndarray:
    sigma = np.asarray(noise_covariance(theta), float)
    if sigma.ndim != 3 or sigma.shape[1:] != (p, p) or sigma.shape[0] < 1:
        raise ValueError(f"noise_covariance must return shape (n_batches, {p}, {p}), got {sigma.shape}")
    return sigma


def _rates(learning_rates) -> np.ndarray:
    rates = check.finite_array(learning_rates, "learning_rates", ndim=1)
    if rates.size == 0 or np.any(rates <= 0):
        raise ValueError("learning_rates must be a non-empty sequence of positive steps")
    return rates


def linear_noise(theta0, learning_rates, batch_size: int, *, gradient: Callable, hessian: Callable,
                 noise_covariance: Callable, record: np.ndarray | None = None) -> NoiseBand:
    """The LNA of SGD with steps ``learning_rates`` (η_1, …, η_K; step k + 1 uses η_{k+1}) and batch ``batch_size``
    from ``theta0``.

    ``gradient(θ) -> (p,)``, ``hessian(θ) -> (p, p)`` and ``noise_covariance(θ) -> (n_batches, p, p)`` (independent
    unbiased estimates of Σ(θ), or shape (1, p, p) for an exact one). ``record``: the steps to keep (default
    all). Raises :class:`DivergenceError` naming the step if the path or C stops being finite.
    """
    theta = check.finite_array(theta0, "theta0", ndim=1).copy()
    rates = _rates(learning_rates)
    batch_size = check.integer(batch_size, "batch_size", minimum=1)
    record = _record(record, rates.size)
    p = theta.size
    covariances = None
    means, batch_covs = [], []

    def keep():
        means.append(theta.copy())
        batch_covs.append(covariances.copy() if covariances is not None else None)

    wanted = set(record.tolist())
    if 0 in wanted:
        keep()
    identity = np.eye(p)
    for k in range(rates.size):
        progress.report(k, rates.size)
        eta = rates[k]
        sigma = _noise(noise_covariance, theta, p)
        if covariances is None:
            covariances = np.zeros((sigma.shape[0], p, p))
        A = identity - eta * hessian(theta)
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run is named just below
            covariances = A @ covariances @ A.T + (eta**2 / batch_size) * sigma
            theta = theta - eta * gradient(theta)
        if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(covariances))):
            raise DivergenceError(f"the linear-noise approximation diverged at step {k + 1}")
        if k + 1 in wanted:
            keep()
    n_batches = covariances.shape[0]
    batch_covs = np.array([np.zeros((n_batches, p, p)) if c is None else c for c in batch_covs])
    return NoiseBand(steps=record, mean=np.array(means), covariance=batch_covs.mean(axis=1),
                     batch_covariances=batch_covs)


def gaussian_noise_paths(theta0, learning_rates, batch_size: int, *, gradient: Callable, noise_covariance: Callable,
                         n_paths: int, seed: SeedLike, record: np.ndarray | None = None) -> np.ndarray:
    """``n_paths`` runs of θ_{k+1} = θ_k − η_k∇R(θ_k) + (η_k/√B)Σ(θ_k)^{1/2}ξ_k from ``theta0``; returns the states
    at the ``record`` steps, shape (n_paths, n_records, p).

    Σ(θ)^{1/2} is the symmetric square root of the mean of ``noise_covariance(θ)`` (negative eigenvalues of an
    estimate are set to zero). Path i draws its ξ from child i of ``seed``, so a path does not depend on how many
    others run (:func:`attnflow.seeding.child`). Raises :class:`DivergenceError` naming the path and step if a state
    stops being finite.
    """
    theta0 = check.finite_array(theta0, "theta0", ndim=1)
    rates = _rates(learning_rates)
    batch_size = check.integer(batch_size, "batch_size", minimum=1)
    n_paths = check.integer(n_paths, "n_paths", minimum=1)
    if n_paths > MAX_PATHS:
        raise ValueError(f"n_paths must be <= {MAX_PATHS}, got {n_paths}")
    record = _record(record, rates.size)
    record_index = {int(k): i for i, k in enumerate(record)}
    p = theta0.size
    out = np.empty((n_paths, len(record), p))
    for path in range(n_paths):
        progress.report(path, n_paths)
        rng = np.random.default_rng(seeding.child(seed, path))
        theta = theta0.copy()
        if 0 in record_index:
            out[path, record_index[0]] = theta
        for k, eta in enumerate(rates):
            values, vectors = np.linalg.eigh(_noise(noise_covariance, theta, p).mean(axis=0))
            root = (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging path is named just below
                theta = theta - eta * gradient(theta) + (eta / np.sqrt(batch_size)) * (root @ rng.standard_normal(p))
            if not np.all(np.isfinite(theta)):
                raise DivergenceError(f"Gaussian-noise path {path} diverged at step {k + 1}")
            if k + 1 in record_index:
                out[path, record_index[k + 1]] = theta
    return out
