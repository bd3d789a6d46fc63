"""A one-layer transformer learning a random walk on a circle: the exact reduced dynamics.

Paper: W. Shi, Y. Cao, *Towards Understanding Transformers in Learning Random Walks*, NeurIPS 2025
(arXiv:2511.23239). "docs/random_walk.md §k" numbers the derivation notes; docs/random_walk.md holds the derivations.

Data (docs/random_walk.md §1): K nodes on a circle, s₁ uniform, each step +1 with probability p and −1 otherwise; the tokens are
x_i = e_{s_i} for i < N and the target is y = s_N. Model (docs/random_walk.md §2): f = V X softmax(X̃ᵀ W x̃_N) with positional
embeddings [p_i]_k = sin(π i k / M), ‖p_i‖² = M/2 =: P_norm; loss −log(f_y + ε); GD from V = 0, W = 0.

Reduction (docs/random_walk.md §4): only W x̃_N matters and, by rotation symmetry, V is circulant, V_{y,s} = v[(y − s) mod K], and
the attention S = softmax(z) ∈ Δ^N is the same for every sequence. The state is (v ∈ R^K, z ∈ R^N); expectations
run over the displacements d_k = (y − s_k) mod K (the sum of the N − k steps after position k), either by
enumerating the 2^{N−1} step paths exactly (:func:`enumerate_paths`) or by Monte Carlo over paths
(``attnflow.dynamics.random_walk.sample_paths``; sampling lives in dynamics).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import checks as check
from .parameters import Parameter, parse_parameters
from .softmax import max_propagating_nan, softmax_into

__all__ = ["RandomWalkProblem", "Paths", "enumerate_paths", "displacements_from_steps", "positional_embeddings", "circulant",
           "pack_reduced_params", "reduced_step", "reduced_loss", "accuracy", "reduced_losses", "accuracies", "step_one_v", "one_hot_map",
           "deterministic_closure", "direction_error", "claim3_direction", "sqrt_law_direction",
           "direction_plateau", "walk_distribution", "MAX_ENUMERATED_STEPS", "MAX_WALK_STEPS", "MAX_MAP_STEPS",
           "TIE_TOLERANCE"]

# Two scores closer than this, relative to the largest weight, are one score computed in two orders: a tie that
# the smallest-label rule breaks. Round-off in a score is about N·1e-16 of it; real gaps are far above 1e-12.
TIE_TOLERANCE = 1e-12

# 2^20 paths (~170 MB of displacements at N = 21) is the largest exact enumeration we allow.
MAX_ENUMERATED_STEPS = 20
MAX_WALK_STEPS = 100_000  # the longest walk whose law walk_distribution computes (the Problem's N is at most 10^5)
MAX_MAP_STEPS = 10_000_000  # the longest run of a scalar map here: (steps + 1) recorded rows


@dataclass(frozen=True)
class RandomWalkProblem:
    """K >= 3 nodes, sequence length N >= 2 (N − 1 tokens and the target), positional dimension M > N,
    step probability p ∈ [0, 1], loss offset ε > 0 and step size η > 0 (docs/random_walk.md §1–2; defaults are the paper's)."""

    K: int
    N: int
    p: float
    M: int = 1000
    eps: float = 0.1
    eta: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "K", check.integer(self.K, "K", minimum=3))
        object.__setattr__(self, "N", check.integer(self.N, "N", minimum=2))
        # <p_i, p_j> = (M/2)δ_ij needs 1 <= i, j <= M − 1, i.e. N < M.
        object.__setattr__(self, "M", check.integer(self.M, "M", minimum=self.N + 1))
        object.__setattr__(self, "p", check.real(self.p, "p", minimum=0.0, maximum=1.0))
        object.__setattr__(self, "eps", check.real(self.eps, "eps", minimum=0.0, strict=True))
        object.__setattr__(self, "eta", check.real(self.eta, "eta", minimum=0.0, strict=True))

    PARAMETERS = (
        Parameter("K", "integer", 6, "nodes on the circle", minimum=3, maximum=10_000),
        Parameter("N", "integer", 13, "sequence length (N − 1 tokens and the target)", minimum=2, maximum=100_000),
        Parameter("p", "real", 0.7, "probability of a step forward", minimum=0.0, maximum=1.0),
        Parameter("M", "integer", 1000, "positional dimension (> N)", minimum=3, maximum=1_000_000),
        Parameter("eps", "real", 0.1, "loss offset ε", minimum=0.0, strict=True),
        Parameter("eta", "real", 1.0, "GD step size η", minimum=0.0, strict=True),
    )

    @classmethod
    def from_params(cls, values) -> "RandomWalkProblem":
        """A problem from named text or values (``PARAMETERS``)."""
        return cls(**parse_parameters(cls.PARAMETERS, values, owner="random_walk"))

    @property
    def P_norm(self) -> float:
        """‖p_i‖² = M/2, the only property of the positional embeddings the dynamics see (docs/random_walk.md §4)."""
        return self.M / 2

    def transition_matrix(self) -> np.ndarray:
        """Π with π_ij = p·1{j = i+1} + (1 − p)·1{j = i−1} (mod K), docs/random_walk.md §1."""
        index = np.arange(self.K)
        Pi = np.zeros((self.K, self.K))
        Pi[index, (index + 1) % self.K] += self.p
        Pi[index, (index - 1) % self.K] += 1 - self.p
        return Pi

    @property
    def optimal_accuracy(self) -> float:
        """max(p, 1 − p), the Bayes accuracy of predicting s_N from s_{N−1} (docs/random_walk.md §1)."""
        return max(self.p, 1 - self.p)

    @property
    def failure_case(self) -> bool:
        """The failure theorem's setting (docs/random_walk.md §3): p ∈ {0, 1} and N = rK + 1."""
        return self.p in (0.0, 1.0) and (self.N - 1) % self.K == 0


def positional_embeddings(N: int, M: int) -> np.ndarray:
    """P ∈ R^{M×N}, [p_i]_k = sin(π i k / M) (docs/random_walk.md §2, reconstructed): mutually orthogonal, ‖p_i‖² = M/2 for i < M."""
    N = check.integer(N, "N", minimum=1)
    M = check.integer(M, "M", minimum=N + 1)
    k = np.arange(1, M + 1)[:, None]
    i = np.arange(1, N + 1)[None, :]
    return np.sin(np.pi * i * k / M)


@dataclass(frozen=True)
class Paths:
    """Step paths as displacements d (n, N−1), d_k = (y − s_k) mod K, with probability weights summing to 1."""

    displacements: np.ndarray
    weights: np.ndarray
    exact: bool


def displacements_from_steps(steps: np.ndarray, K: int) -> np.ndarray:
    """d_k = (Σ_{i > k} step_i) mod K for k = 1..N−1, from the N − 1 steps (columns: steps into positions 2..N)."""
    K = check.integer(K, "K", minimum=1)
    steps = np.asarray(steps)
    if steps.ndim != 2 or not np.issubdtype(steps.dtype, np.integer):
        raise ValueError(f"steps must be a 2-D integer array (paths × steps), got {steps.dtype} of shape {steps.shape}")
    tail = np.cumsum(steps[:, ::-1], axis=1)[:, ::-1]  # tail[:, k-1] = Σ_{i >= k} (steps into k+1..N)
    return np.mod(tail, K).astype(np.int64)


def enumerate_paths(problem: RandomWalkProblem) -> Paths:
    """All 2^{N−1} step paths with their probabilities p^{#up}(1 − p)^{#down}; zero-probability paths dropped
    (so p ∈ {0, 1} gives the single deterministic path, for any N)."""
    n_steps = problem.N - 1
    if problem.p in (0.0, 1.0):
        steps = np.full((1, n_steps), 1 if problem.p == 1.0 else -1)
        return Paths(displacements_from_steps(steps, problem.K), np.ones(1), exact=True)
    if n_steps > MAX_ENUMERATED_STEPS:
        raise ValueError(f"N must be <= {MAX_ENUMERATED_STEPS + 1} for exact enumeration (2^(N-1) paths), got "
                         f"{problem.N}; use sample_paths")
    codes = np.arange(2**n_steps)[:, None]
    up = (codes >> np.arange(n_steps)[None, :]) & 1
    n_up = up.sum(axis=1)
    n_down = n_steps - n_up
    keep = ((n_up == 0) | (problem.p > 0)) & ((n_down == 0) | (problem.p < 1))
    # 0·log 0 counts as 0: a path with no down-steps has probability p^{N−1} even at p = 1
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p, log_q = np.log(problem.p), np.log1p(-problem.p)
        log_weight = (np.where(n_up[keep] > 0, n_up[keep] * log_p, 0.0)
                      + np.where(n_down[keep] > 0, n_down[keep] * log_q, 0.0))
    weights = np.exp(log_weight)
    return Paths(displacements_from_steps(2 * up[keep] - 1, problem.K), weights / weights.sum(), exact=True)


def circulant(v) -> np.ndarray:
    """V with V_{y,s} = v[(y − s) mod K]."""
    v = check.finite_array(v, "v", ndim=1)
    K = v.size
    return v[(np.arange(K)[:, None] - np.arange(K)[None, :]) % K]


# ==================================================================================================
# The reduced map (docs/random_walk.md §4) as a numba kernel; params = (K, N, η, ε, P_norm, n, weights, displacements)
# ==================================================================================================


def pack_reduced_params(problem: RandomWalkProblem, paths: Paths) -> np.ndarray:
    """Flat float parameters for :func:`reduced_step` (the integrator engine takes one float array)."""
    if paths.displacements.shape[1] != problem.N - 1:
        raise ValueError(f"paths must have N - 1 = {problem.N - 1} displacements per path, got "
                         f"{paths.displacements.shape[1]}")
    n = paths.weights.size
    head = [problem.K, problem.N, problem.eta, problem.eps, problem.P_norm, n]
    return np.concatenate([head, paths.weights, paths.displacements.ravel().astype(float)])


@njit(cache=True)
def _unpack(params):
    K, N, n = int(params[0]), int(params[1]), int(params[5])
    weights = params[6:6 + n]
    d = params[6 + n:6 + n + n * (N - 1)]
    return K, N, params[2], params[3], params[4], n, weights, d


@njit(cache=True)
def _softmax(z):
    """softmax(z), shifted by max z (:func:`softmax_into`), as a new array."""
    e = np.empty(z.size)
    softmax_into(z, e)
    return e


@njit(cache=True)
def _population_terms(v, z, params):
    """(loss, E[l'·Σ_k S_k 1{d_k = c}] per c, E[g_k] per k) at the state (v, z), docs/random_walk.md §4."""
    K, N, eta, eps, P_norm, n, weights, d = _unpack(params)
    S = _softmax(z)
    grad_v = np.zeros(K)
    mean_g = np.zeros(N)
    loss = 0.0
    for i in range(n):
        row = i * (N - 1)
        f_y = 0.0
        for k in range(N - 1):
            f_y += S[k] * v[int(d[row + k])]
        margin = f_y + eps
        if margin <= 0.0:
            return np.inf, grad_v, mean_g  # −log of a non-positive number: the caller reports divergence
        dl = -1.0 / margin
        loss -= weights[i] * math.log(margin)
        for k in range(N - 1):
            c = int(d[row + k])
            grad_v[c] += weights[i] * dl * S[k]
            mean_g[k] += weights[i] * dl * S[k] * (v[c] - f_y)
        mean_g[N - 1] += -weights[i] * dl * S[N - 1] * f_y
    return loss, grad_v, mean_g


@njit(cache=True)
def reduced_step(k, x, params):
    """One GD step on x = (v, z) (docs/random_walk.md §4):
        v[c] ← v[c] − (η/K) E[l' Σ_k S_k 1{d_k = c}],
        z_k  ← z_k − η P_norm² E[g_k] + (η P_norm/K) E[g_N]  (k < N),   z_N ← z_N − η P_norm² E[g_N].
    A non-positive f_y + ε (log undefined) returns NaN so the engine stops and names the step."""
    K, N = int(params[0]), int(params[1])
    eta, P_norm = params[2], params[4]
    v = x[:K]
    z = x[K:]
    loss, grad_v, mean_g = _population_terms(v, z, params)
    out = np.empty(K + N)
    if not math.isfinite(loss):
        for j in range(K + N):
            out[j] = np.nan
        return out
    for c in range(K):
        out[c] = v[c] - eta / K * grad_v[c]
    for j in range(N - 1):
        out[K + j] = z[j] - eta * P_norm**2 * mean_g[j] + eta * P_norm / K * mean_g[N - 1]
    out[K + N - 1] = z[N - 1] - eta * P_norm**2 * mean_g[N - 1]
    return out


@njit(cache=True)
def _losses_kernel(states, params):
    out = np.empty(states.shape[0])
    K = int(params[0])
    for i in range(states.shape[0]):
        out[i] = _population_terms(states[i, :K], states[i, K:], params)[0]
    return out


@njit(cache=True)
def _accuracy_kernel(x, params):
    """P(Pred(f) = y), ties to the smallest label (docs/random_walk.md §2), averaged exactly over y uniform.
    Scores equal up to TIE_TOLERANCE relative to max|v| count as tied.

    For target y and path d, f_{(y + r) mod K} = g[r] = Σ_k S_k v[(r + d_k) mod K]; relative label 0 is predicted
    iff it attains the max and y is the smallest absolute label (y + r) mod K among the maximisers r.
    """
    K, N, _, _, _, n, weights, d = _unpack(params)
    v, z = x[:K], x[K:]
    S = _softmax(z)
    g = np.empty(K)
    # g is a convex combination of entries of v: scores within TIE_TOLERANCE·max|v| of the top are exact ties
    # whose computed values differ by round-off only (after one step from zero, symmetric entries of v do)
    tie = TIE_TOLERANCE * np.abs(v).max()
    total = 0.0
    for i in range(n):
        row = i * (N - 1)
        for r in range(K):
            acc = 0.0
            for k in range(N - 1):
                acc += S[k] * v[(r + int(d[row + k])) % K]
            g[r] = acc
        top = max_propagating_nan(g)
        if not g[0] >= top - tie:  # also false for a NaN
            continue
        wins = 0
        for y in range(K):
            smallest = True
            for r in range(1, K):
                if g[r] >= top - tie and (y + r) % K < y:
                    smallest = False
                    break
            if smallest:
                wins += 1
        total += weights[i] * wins / K
    return total


@njit(cache=True)
def _accuracies_kernel(states, params):
    out = np.empty(states.shape[0])
    for i in range(states.shape[0]):
        out[i] = _accuracy_kernel(states[i], params)
    return out


def _check_states(problem: RandomWalkProblem, states) -> np.ndarray:
    """Finite states with K + N columns, as a writable copy: the kernels then see the array type of the reduced map's
    state, and numba compiles :func:`_population_terms` once instead of again for read-only arrays."""
    states = check.finite_array(states, "states", ndim=2)
    if states.shape[1] != problem.K + problem.N:
        raise ValueError(f"states must have K + N = {problem.K + problem.N} columns (v, z), got {states.shape[1]}")
    return states.copy()


def reduced_losses(problem: RandomWalkProblem, paths: Paths, states) -> np.ndarray:
    """E[−log(f_y + ε)] over the paths at each reduced state (v, z) (rows of ``states``), packing the paths once."""
    return _losses_kernel(_check_states(problem, states), pack_reduced_params(problem, paths))


def accuracies(problem: RandomWalkProblem, paths: Paths, states) -> np.ndarray:
    """Accuracy of argmax_j f_j (ties to the smallest label) at each reduced state (rows of ``states``)."""
    return _accuracies_kernel(_check_states(problem, states), pack_reduced_params(problem, paths))


def reduced_loss(problem: RandomWalkProblem, paths: Paths, v, z) -> float:
    """E[−log(f_y + ε)] over the paths at the reduced state (v, z)."""
    v = check.finite_array(v, "v", shape=(problem.K,))
    z = check.finite_array(z, "z", shape=(problem.N,))
    return float(reduced_losses(problem, paths, np.concatenate([v, z])[None, :])[0])


def accuracy(problem: RandomWalkProblem, paths: Paths, v, z) -> float:
    """Accuracy of the prediction argmax_j f_j (ties to the smallest label) at the reduced state (v, z)."""
    v = check.finite_array(v, "v", shape=(problem.K,))
    z = check.finite_array(z, "z", shape=(problem.N,))
    return float(accuracies(problem, paths, np.concatenate([v, z])[None, :])[0])


# ==================================================================================================
# Closed forms (docs/random_walk.md §5, §6)
# ==================================================================================================


def walk_distribution(problem: RandomWalkProblem, m: int) -> np.ndarray:
    """P(S_m = c), c ∈ [K], for a walk of m steps started at 0."""
    m = check.integer(m, "m", minimum=0)
    if m > MAX_WALK_STEPS:
        raise ValueError(f"m must be <= {MAX_WALK_STEPS}, got {m}")
    law = np.zeros(problem.K)
    law[0] = 1.0
    for _ in range(m):
        law = problem.p * np.roll(law, 1) + (1 - problem.p) * np.roll(law, -1)
    return law


def step_one_v(problem: RandomWalkProblem) -> np.ndarray:
    """v⁽¹⁾[c] = η/(εNK) Σ_{m=1}^{N−1} P(S_m = c) (docs/random_walk.md §5; V⁽¹⁾ = η/(εNK) Σ_i (Πᵀ)^{N−i}, W⁽¹⁾ = 0)."""
    total = sum(walk_distribution(problem, m) for m in range(1, problem.N))
    return problem.eta / (problem.eps * problem.N * problem.K) * total


def _map_steps(steps) -> int:
    steps = check.integer(steps, "steps", minimum=0)
    if steps > MAX_MAP_STEPS:
        raise ValueError(f"steps must be <= {MAX_MAP_STEPS:.0e}, got {steps}")
    return steps


def one_hot_map(problem: RandomWalkProblem, v_plus: float, v_minus: float, steps: int) -> np.ndarray:
    """v[±1] under one-hot parent attention S = e_{N−1} (docs/random_walk.md §5): v[1] ← v[1] + (η/K)p/(v[1] + ε),
    v[−1] ← v[−1] + (η/K)(1 − p)/(v[−1] + ε); returns (steps + 1, 2). (v[±1] + ε)² ≈ 2ηp_± t/K for large t."""
    steps = _map_steps(steps)
    out = np.empty((steps + 1, 2))
    out[0] = check.real(v_plus, "v_plus"), check.real(v_minus, "v_minus")
    rate = problem.eta / problem.K
    for t in range(steps):
        a, b = out[t]
        out[t + 1] = a + rate * problem.p / (a + problem.eps), b + rate * (1 - problem.p) / (b + problem.eps)
    return out


def deterministic_closure(problem: RandomWalkProblem, steps: int) -> np.ndarray:
    """The 3-scalar closure (c, ζ, ζ_N) of the failure case p ∈ {0, 1}, N = rK + 1, from zero (docs/random_walk.md §5):
    v = c·1, z_k = ζ (k < N), z_N = ζ_N, so f_y = (N − 1)s·c for every sequence; returns (steps + 1, 3)."""
    if not problem.failure_case:
        raise ValueError(f"the closure needs p in {{0, 1}} and N = rK + 1, got p={problem.p}, N={problem.N}, "
                         f"K={problem.K}")
    steps = _map_steps(steps)
    r = (problem.N - 1) // problem.K
    eta, eps, P = problem.eta, problem.eps, problem.P_norm
    out = np.zeros((steps + 1, 3))
    for t in range(steps):
        c, zeta, zeta_N = out[t]
        shift = max(zeta, zeta_N)
        denominator = (problem.N - 1) * math.exp(zeta - shift) + math.exp(zeta_N - shift)
        s, S_N = math.exp(zeta - shift) / denominator, math.exp(zeta_N - shift) / denominator
        f = (problem.N - 1) * s * c
        g_o = -s * (c - f) / (f + eps)
        g_N = S_N * f / (f + eps)
        out[t + 1] = (c + eta / problem.K * s * r / (f + eps), zeta - eta * P**2 * g_o + eta * P / problem.K * g_N,
                      zeta_N - eta * P**2 * g_N)
    return out


def _unit(x):
    x = np.asarray(x, float)
    norm = np.linalg.norm(x)
    if norm == 0:
        raise ValueError("the direction of a zero vector is undefined")
    return x / norm


def _direction_arguments(K, p) -> tuple[int, float]:
    """K >= 3 states (v[1] and v[−1] distinct) and a probability p."""
    return check.integer(K, "K", minimum=3), check.real(p, "p", minimum=0.0, maximum=1.0)


def claim3_direction(K: int, p: float) -> np.ndarray:
    """v of Πᵀ: v[1] = p, v[−1] = 1 − p (the target of the paper's claim 3, docs/random_walk.md §3)."""
    K, p = _direction_arguments(K, p)
    v = np.zeros(K)
    v[1], v[-1] = p, 1 - p
    return v


def sqrt_law_direction(K: int, p: float) -> np.ndarray:
    """v[1] = √p, v[−1] = √(1 − p): the direction V actually converges to (docs/random_walk.md §6, derived)."""
    K, p = _direction_arguments(K, p)
    v = np.zeros(K)
    v[1], v[-1] = math.sqrt(p), math.sqrt(1 - p)
    return v


def direction_error(v, target) -> float:
    """‖V/‖V‖_F − T/‖T‖_F‖_F for circulant V, T; equals ‖v/‖v‖ − t/‖t‖‖ since ‖circ(x)‖_F = √K‖x‖."""
    v = check.finite_array(v, "v", ndim=1)
    target = check.finite_array(target, f"target (the shape of v, {v.shape})", shape=v.shape)
    return float(np.linalg.norm(_unit(v) - _unit(target)))


def direction_plateau(p: float) -> float:
    """The limit of the claim-3 error when V follows the √p-law: ‖Πᵀ/‖Πᵀ‖ − √-law‖ (0 only at p ∈ {0, ½, 1})."""
    p = check.real(p, "p", minimum=0.0, maximum=1.0)
    return direction_error(sqrt_law_direction(3, p), claim3_direction(3, p))
