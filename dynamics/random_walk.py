"""Random-walk transformer: the reduced map through the integrator engine, and full (V, W) gradient descent.

The reduced map (docs/random_walk.md §4) runs on (v, z) with expectations over step paths (exact enumeration or Monte Carlo);
the full model trains V ∈ R^{K×K} and W ∈ R^{(K+M)×(K+M)} on explicit token sequences with weights: all K·2^{N−1}
sequences with their probabilities (the exact population gradient) or n sampled sequences (a training set).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from attnflow.closed_forms import random_walk as cf
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.random_walk import Paths, RandomWalkProblem
from attnflow.closed_forms.softmax import max_propagating_nan, softmax_into

from .integrate import DivergenceError, iterate_map
from attnflow.seeding import SeedLike, as_seed_sequence, spawn
from attnflow.closed_forms.parameters import Parameter, takes_options

from .montecarlo import MAX_RECORDS, MAX_STEPS, Trajectory, check_count, check_run_length, log_grid

__all__ = ["POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "sample_paths", "reduced_trajectory", "Sequences", "population_sequences", "sample_sequences",
           "full_gd_trajectory", "full_accuracy", "population", "minibatch"]


def sample_paths(problem: RandomWalkProblem, n: int, rng: np.random.Generator) -> Paths:
    """``n`` i.i.d. step paths (Monte Carlo over paths, for large N), equal weights."""
    n = check_count(n, "n")
    steps = np.where(rng.random((n, problem.N - 1)) < problem.p, 1, -1)
    return Paths(cf.displacements_from_steps(steps, problem.K), np.full(n, 1.0 / n), exact=False)


def _record_steps(steps: int, n_records: int | None) -> np.ndarray:
    steps, n_records = check_run_length(steps, n_records, min_records=2, optional_records=True)
    if n_records is None or n_records >= steps + 1:
        return np.arange(steps + 1)
    return log_grid(steps, n_records)


def reduced_trajectory(problem: RandomWalkProblem, paths: Paths, steps: int, *, n_records: int | None = None,
                       eval_paths: Paths | None = None, x0=None, record_steps=None) -> Trajectory:
    """Reduced GD (docs/random_walk.md §4) from v = 0, z = 0 (or ``x0`` = (v, z)); expectations over ``paths``.

    Records v, z, the loss, the parent attention S_{N−1}, the query weight S_N and the accuracy (on
    ``eval_paths``, by default the training paths) at every step, at ``n_records`` log-spaced steps, or at the
    given ``record_steps``.
    """
    steps = check.integer(steps, "steps", minimum=0)
    params = cf.pack_reduced_params(problem, paths)
    x0 = np.zeros(problem.K + problem.N) if x0 is None else check.finite_array(x0, "x0", shape=(problem.K + problem.N,))
    record = _record_steps(steps, n_records) if record_steps is None else record_steps
    sol = iterate_map(cf.reduced_step, x0, steps, params, record_steps=record)
    v, z = sol.y[:, :problem.K], sol.y[:, problem.K:]
    S = np.exp(z - z.max(axis=1, keepdims=True))
    S /= S.sum(axis=1, keepdims=True)
    return Trajectory(
        times=sol.t, states=dict(v=v, z=z),
        metrics=dict(loss=cf.reduced_losses(problem, paths, sol.y),  # one call per metric: the paths are packed once
                     parent_attention=S[:, problem.N - 2], query_attention=S[:, problem.N - 1],
                     accuracy=cf.accuracies(problem, eval_paths or paths, sol.y)),
        info=dict(exact=paths.exact, n_paths=paths.weights.size))


# ==================================================================================================
# The full model on explicit sequences
# ==================================================================================================


class Sequences:
    """Token sequences ``states`` (n, N) of node indices 0..K−1 (the last column is the target y) with weights."""

    def __init__(self, states: np.ndarray, weights: np.ndarray):
        self.states = np.ascontiguousarray(states, dtype=np.int64)
        self.weights = np.ascontiguousarray(weights, dtype=float)


def _sequences_from_paths(problem: RandomWalkProblem, paths: Paths, starts: np.ndarray) -> np.ndarray:
    """States s_k = (y − d_k) mod K for k < N and s_N = y, for each path and target y in ``starts``."""
    y = starts[:, None]
    return np.concatenate([np.mod(y - paths.displacements, problem.K), y], axis=1)


def population_sequences(problem: RandomWalkProblem) -> Sequences:
    """All K·2^{N−1} sequences with their probabilities: full GD on them is GD on the population loss."""
    paths = cf.enumerate_paths(problem)
    n = paths.weights.size
    targets = np.repeat(np.arange(problem.K), n)
    states = _sequences_from_paths(problem, Paths(np.tile(paths.displacements, (problem.K, 1)), None, True), targets)
    return Sequences(states, np.tile(paths.weights, problem.K) / problem.K)


def sample_sequences(problem: RandomWalkProblem, n: int, rng: np.random.Generator) -> Sequences:
    """``n`` sequences from the data model (s₁ uniform), equal weights."""
    paths = sample_paths(problem, n, rng)
    return Sequences(_sequences_from_paths(problem, paths, rng.integers(problem.K, size=n)), np.full(n, 1.0 / n))


@njit(cache=True)
def _full_step(states, weights, V, W_right, P, eta, eps, update):
    """One GD step of the full model in place; returns (loss, mean attention (N,)) before the step, or loss = inf
    when some f_y + ε <= 0. ∇_W l = Σ_j g_j x̃_j x̃_Nᵀ with x̃_N = [0; p_N]: only W_right = W[:, K:] (the columns
    multiplying p_N) moves and matters, so the kernel keeps it as its own contiguous array; g_j = l'S_j(u_j − f_y)."""
    n, N = states.shape
    K = V.shape[0]
    M = P.shape[0]
    p_N = np.empty(M)
    for b in range(M):
        p_N[b] = P[b, N - 1]
    # BLAS products into preallocated outputs: np.dot(A, x, out) is the BLAS call A @ x makes, without its wrapper
    h = np.empty(K + M)
    np.dot(W_right, p_N, h)  # W x̃_N, the same for every sequence
    q = np.empty(N)
    np.dot(P.T, h[K:], q)  # positional part of the logits
    grad_V = np.zeros((K, K))
    c_x = np.zeros(K + M)
    g_pos = np.zeros(N)
    mean_S = np.zeros(N)
    z = np.empty(N)
    S = np.empty(N)
    loss = 0.0
    for i in range(n):
        y = states[i, N - 1]
        for j in range(N - 1):
            z[j] = h[states[i, j]] + q[j]
        z[N - 1] = q[N - 1]
        softmax_into(z, S)
        f_y = 0.0
        for j in range(N - 1):
            f_y += S[j] * V[y, states[i, j]]
        if f_y + eps <= 0.0:
            return np.inf, mean_S
        dl = -1.0 / (f_y + eps)
        w = weights[i]
        loss -= w * math.log(f_y + eps)
        for j in range(N - 1):
            s = states[i, j]
            grad_V[y, s] += w * dl * S[j]
            g = dl * S[j] * (V[y, s] - f_y)
            c_x[s] += w * g
            g_pos[j] += w * g
        g_pos[N - 1] += -w * dl * S[N - 1] * f_y
        for j in range(N):
            mean_S[j] += w * S[j]
    if not update:
        return loss, mean_S
    positional = np.empty(M)
    np.dot(P, g_pos, positional)
    for b in range(M):
        c_x[K + b] += positional[b]
    for a in range(K + M):
        for b in range(M):
            W_right[a, b] -= eta * c_x[a] * p_N[b]
    for a in range(K):
        for b in range(K):
            V[a, b] -= eta * grad_V[a, b]
    return loss, mean_S


@njit(cache=True)
def _full_loop(states, weights, V, W_right, P, eta, eps, record_steps):
    n_records = record_steps.size
    K, N = V.shape[0], states.shape[1]
    V_rec = np.empty((n_records, K, K))
    S_rec = np.empty((n_records, N))
    loss_rec = np.empty(n_records)
    V_before = np.empty((K, K))
    j = 0
    last = record_steps[-1]
    for t in range(last + 1):
        # Element loops instead of V.copy(), np.all(np.isfinite(V)) and row assignments: those compile far slower.
        for a in range(K):
            for b in range(K):
                V_before[a, b] = V[a, b]
        loss, mean_S = _full_step(states, weights, V, W_right, P, eta, eps, t < last)  # state t, then step t → t + 1
        finite = math.isfinite(loss)
        for a in range(K):
            for b in range(K):
                finite = finite and math.isfinite(V[a, b])
        if not finite:
            return V_rec, S_rec, loss_rec, t
        if j < n_records and record_steps[j] == t:
            for a in range(K):
                for b in range(K):
                    V_rec[j, a, b] = V_before[a, b]
            for b in range(N):
                S_rec[j, b] = mean_S[b]
            loss_rec[j] = loss
            j += 1
    return V_rec, S_rec, loss_rec, -1


@njit(cache=True)
def _full_accuracy_kernel(states, V, W_right, P):
    n, N = states.shape
    K = V.shape[0]
    M = P.shape[0]
    p_N = np.empty(M)
    for b in range(M):
        p_N[b] = P[b, N - 1]
    h = np.empty(K + M)
    np.dot(W_right, p_N, h)  # as in _full_step
    q = np.empty(N)
    np.dot(P.T, h[K:], q)
    z = np.empty(N)
    S = np.empty(N)
    f = np.empty(K)
    tie = cf.TIE_TOLERANCE * np.abs(V).max()
    correct = 0
    for i in range(n):
        for j in range(N - 1):
            z[j] = h[states[i, j]] + q[j]
        z[N - 1] = q[N - 1]
        softmax_into(z, S)
        for a in range(K):
            f[a] = 0.0
        for j in range(N - 1):
            s = states[i, j]
            for a in range(K):
                f[a] += S[j] * V[a, s]
        # the smallest label within cf.TIE_TOLERANCE·max|V| of the top score (an exact tie up to round-off)
        top = max_propagating_nan(f)
        best = 0
        for a in range(K):
            if not f[a] < top - tie:  # the first score at the top, or the first NaN
                best = a
                break
        correct += int(best == states[i, N - 1])
    return correct / n


def full_accuracy(problem: RandomWalkProblem, sequences: Sequences, V, W) -> float:
    """Fraction of ``sequences`` whose prediction min{j : f_j = max f} equals the target (scores within
    ``TIE_TOLERANCE``·max|V| of the top tie, as in :func:`attnflow.closed_forms.random_walk.accuracy`)."""
    P = _positional_embeddings_cached(problem)
    V = check.finite_array(V, "V", shape=(problem.K, problem.K))
    W = check.finite_array(W, "W", shape=(problem.K + problem.M,) * 2)
    return float(_full_accuracy_kernel(sequences.states, np.ascontiguousarray(V), np.ascontiguousarray(W[:, problem.K:]), P))


_EMBEDDINGS: dict = {}


def _positional_embeddings_cached(problem: RandomWalkProblem) -> np.ndarray:
    key = (problem.N, problem.M)
    if key not in _EMBEDDINGS:
        _EMBEDDINGS[key] = np.ascontiguousarray(cf.positional_embeddings(problem.N, problem.M))
    return _EMBEDDINGS[key]


def full_gd_trajectory(problem: RandomWalkProblem, sequences: Sequences, steps: int, *, init_scale: float = 0.0,
                       seed: SeedLike, n_records: int | None = None) -> Trajectory:
    """GD on the full (V, W) over ``sequences`` (weighted), from zero or N(0, init_scale²) entries.

    Records V (K, K), the weighted mean attention (N,) and the loss before the step at each recorded step; the
    final V and W are ``final['V']`` and ``final['W']``. Stops with :class:`DivergenceError` naming the step if the loss leaves its domain.
    """
    steps = check.integer(steps, "steps", minimum=0)
    init_scale = check.real(init_scale, "init_scale", minimum=0.0)
    states = sequences.states
    if states.ndim != 2 or states.shape[1] != problem.N or states.min() < 0 or states.max() >= problem.K:
        raise ValueError(f"sequences must hold N = {problem.N} node indices in 0..K-1 = 0..{problem.K - 1} per row, "
                         f"got shape {states.shape}")
    if sequences.weights.shape != (states.shape[0],) or np.any(sequences.weights < 0):
        raise ValueError("sequences.weights must be non-negative, one per sequence")
    rng = np.random.default_rng(as_seed_sequence(seed))
    size = problem.K + problem.M
    V = init_scale * rng.standard_normal((problem.K, problem.K))
    W = init_scale * rng.standard_normal((size, size))
    record = _record_steps(steps, n_records)
    W_right = np.ascontiguousarray(W[:, problem.K:])
    V_rec, S_rec, loss_rec, failed = _full_loop(sequences.states, sequences.weights, V, W_right,
                                                _positional_embeddings_cached(problem), problem.eta, problem.eps, record)
    W[:, problem.K:] = W_right
    if failed >= 0:
        raise DivergenceError(f"full GD diverged at step {failed}: f_y + eps <= 0 or a non-finite V")
    return Trajectory(times=record.astype(float), states=dict(V=V_rec, attention=S_rec), metrics=dict(loss=loss_rec),
                      final=dict(V=V, W=W))


# ==================================================================================================
# The System contract: population(problem, **options) and minibatch(problem, *, seed, **options)
# ==================================================================================================


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("steps", "integer", 400, "GD steps", minimum=1, maximum=MAX_STEPS),
    Parameter("n_records", "integer", 60, "recorded steps (log-spaced)", minimum=2, maximum=MAX_RECORDS),
)
MINIBATCH_OPTIONS = (
    Parameter("steps", "integer", 400, "GD steps", minimum=1, maximum=MAX_STEPS),
    Parameter("n_sequences", "integer", 2000, "sampled training sequences", minimum=1, maximum=10_000_000),
    Parameter("init_scale", "real", 0.0, "standard deviation of the initial weights", minimum=0.0),
    Parameter("n_records", "integer", 60, "recorded steps (log-spaced)", minimum=2, maximum=MAX_RECORDS),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: RandomWalkProblem, *, steps: int, n_records: int | None) -> Trajectory:
    """The reduced (v, z) map over every step path, exactly (:func:`attnflow.closed_forms.random_walk.enumerate_paths`,
    N − 1 <= 20 steps): :func:`reduced_trajectory`."""
    return reduced_trajectory(problem, cf.enumerate_paths(problem), steps, n_records=n_records)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: RandomWalkProblem, *, seed: SeedLike, steps: int, n_sequences: int,
              init_scale: float, n_records: int | None) -> Trajectory:
    """GD on the full (V, W) over ``n_sequences`` sampled sequences (the paper's finite training set):
    :func:`full_gd_trajectory`. The sequences and the initialisation take separate children of ``seed``."""
    n_sequences = check_count(n_sequences, "n_sequences")
    data_seed, init_seed = spawn(seed, 2)
    sequences = sample_sequences(problem, n_sequences, np.random.default_rng(data_seed))
    return full_gd_trajectory(problem, sequences, steps, init_scale=init_scale, seed=init_seed, n_records=n_records)
