"""Numerics of Li, Rawat & Oymak (NeurIPS 2024): prompt sampling in the four designs, Monte-Carlo risks, the real
models (linear attention, H3 with a learned filter, rank-r attention, a LoRA adapter) trained with Adam or SGD on
fresh prompts, and the gradient flow of the PGD risk in the preconditioner.

The mathematics lives in :mod:`attnflow.closed_forms.linear_attention_h3` (docs/linear_attention_h3.md); this module
draws data and runs algorithms. The models are vectorised numpy with hand-written gradients: at d <= 20 and a few
hundred prompts per batch a step costs well under a millisecond.
"""
from __future__ import annotations


import numpy as np
from numba import njit

from attnflow.closed_forms import checks as check
from attnflow.closed_forms import linear_attention_h3 as cf
from attnflow.closed_forms.linear_attention_h3 import H3Problem
from attnflow.closed_forms.linalg import psd_power
from attnflow.seeding import SeedLike, generators
from attnflow.closed_forms.parameters import Parameter, takes_options

from .errors import DivergenceError
from .integrate import dopri5_loop, solve_dopri5
from .montecarlo import (MAX_BATCH, MAX_POINTS, MonteCarloMean, RegressionPrompts, Trajectory, check_batch_size,
                         check_count, check_run_length, flow_times, monte_carlo_mean, MAX_SAMPLES,
                         prompt_risk)
from .optimizers import FINAL_FRACTION, OPTIMIZERS

__all__ = ["flow_dopri5", "POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "flow_rate", "Prompts", "sample_prompts",
           "token_matrices", "monte_carlo_risk", "paired_risk_difference", "bounded_chunk", "CHUNK_FLOATS",
           "pgd_predict", "wpgd_predict", "attention_forward", "h3_forward", "pgd_batch_gradient",
           "attention_batch_gradient", "h3_batch_gradient", "MODELS", "VALUE_INITS", "MAX_RANK", "make_model", "train",
           "trained_predictor", "PARAMETER_NAMES", "PROTOCOL_FINAL_FRACTION", "population_trajectory",
           "correlated_population_trajectory", "population", "minibatch"]

# The protocol of docs/linear_attention_h3.md §8.1 decays the learning rate to 2% of its initial value; the claims and
# minibatch pass it to train, whose default is the optimisers' shared FINAL_FRACTION.
PROTOCOL_FINAL_FRACTION = 0.02


# ==================================================================================================================
# Sampling (docs/linear_attention_h3.md §1)
# ==================================================================================================================


Prompts = RegressionPrompts  # the batch type of sample_prompts, shared by the in-context regression papers


def sample_prompts(problem: H3Problem, count: int, rng: np.random.Generator) -> Prompts:
    """``count`` i.i.d. prompts of the problem's design (§1.1-1.4)."""
    count = check_count(count, "count")
    d, n, s2 = problem.d, problem.n, problem.sigma2
    query_noise = np.sqrt(s2) * rng.standard_normal(count)
    if problem.design == "iid":
        beta = rng.standard_normal((count, d)) @ problem.Psi_half
        # 2-D products: a (count·n, d) @ (d, d) is many times faster than the batched 3-D matmul.
        X = (rng.standard_normal((count * n, d)) @ problem.H_half).reshape(count, n, d)
        x = rng.standard_normal((count, d)) @ problem.H_half
        y = np.sum(X * beta[:, None, :], axis=2)
        if problem.drift is not None:
            C_half = psd_power(problem.drift, 0.5)
            Delta_half = psd_power(problem.Delta, 0.5)
            drift = np.einsum("ij,bjk->bik", C_half, rng.standard_normal((count, n, d))) @ Delta_half
            y += np.sum(X * drift, axis=2)
        y += np.sqrt(problem.example_noise) * rng.standard_normal((count, n))
    else:
        a, gamma = problem.alpha, np.sqrt(1 - problem.alpha**2)
        beta = rng.standard_normal((count, d))
        x = rng.standard_normal((count, d))
        g = rng.standard_normal((count, n, d))
        if problem.design == "rag":  # retrieved examples scatter around the query
            X = a * x[:, None, :] + gamma * g
        else:  # aligned examples: Cov(x_i | β) = γ²I + α²ββᵀ, the query independent of β
            X = gamma * g + a * rng.standard_normal((count, n, 1)) * beta[:, None, :]
        y = np.sum(X * beta[:, None, :], axis=2) + np.sqrt(s2) * rng.standard_normal((count, n))
    c = np.ascontiguousarray
    return Prompts(X=c(X), y=c(y), x_query=c(x), y_query=np.sum(x * beta, axis=1) + query_noise, beta=beta)


def token_matrices(prompts: Prompts) -> np.ndarray:
    """Z (B, n+1, d+1) with rows z_i = (x_i, y_i) and the query row (x, 0) (§1.5)."""
    B, n, d = prompts.X.shape
    Z = np.zeros((B, n + 1, d + 1))
    Z[:, :n, :d] = prompts.X
    Z[:, :n, d] = prompts.y
    Z[:, n, :d] = prompts.x_query
    return Z


CHUNK_FLOATS = 50_000_000  # a chunk's examples X hold at most this many numbers (400 MB; a prompt holds n·d)


def bounded_chunk(problem: H3Problem, chunk: int) -> int:
    """``chunk`` prompts, or fewer when their examples would exceed ``CHUNK_FLOATS`` numbers: at n = 2000, d = 20 a
    chunk of 50 000 prompts asked for 16 GB per array and the process was killed for its memory. The chunks of
    every quick setting are unchanged (the chunk size picks the generators, so it is part of the numbers)."""
    return max(1, min(check.integer(chunk, "chunk", minimum=1), CHUNK_FLOATS // (problem.n * problem.d)))


def _check_samples(count) -> int:
    count = check.integer(count, "count", minimum=2)
    if count > MAX_SAMPLES:
        raise ValueError(f"count must be <= {MAX_SAMPLES:.0e} samples, got {count}")
    return count


def monte_carlo_risk(problem: H3Problem, predict, count: int, *, seed: SeedLike, chunk: int = 50_000) -> MonteCarloMean:
    """Brute-force risk E(ŷ − y_q)² of ``predict(prompts) -> (B,)`` over ``count`` fresh prompts."""
    count = _check_samples(count)
    return prompt_risk(lambda rng, m: sample_prompts(problem, m, rng), predict, count, seed=seed,
                       chunk=bounded_chunk(problem, chunk))


def paired_risk_difference(problem: H3Problem, predict, reference, count: int, *, seed: SeedLike,
                           chunk: int = 50_000) -> MonteCarloMean:
    """E[(ŷ − y_q)² − (ŷ_ref − y_q)²] on the same prompts: the risk gap to a reference predictor with the common
    noise cancelled (a much smaller standard error than two separate risks)."""

    def differences(rng, m):
        prompts = sample_prompts(problem, m, rng)
        return (predict(prompts) - prompts.y_query) ** 2 - (reference(prompts) - prompts.y_query) ** 2

    count = _check_samples(count)
    return monte_carlo_mean(differences, count, seed=seed, chunk=bounded_chunk(problem, chunk))


def pgd_predict(prompts: Prompts, W) -> np.ndarray:
    """ŷ = xᵀWXᵀy (§2.1)."""
    W = check.finite_array(W, "W", shape=(prompts.X.shape[2],) * 2)
    gradient = np.einsum("bid,bi->bd", prompts.X, prompts.y)
    return np.einsum("bd,de,be->b", prompts.x_query, W, gradient)


def wpgd_predict(prompts: Prompts, W, omega) -> np.ndarray:
    """ŷ = xᵀWXᵀ(ω⊙y) (§2.2)."""
    W = check.finite_array(W, "W", shape=(prompts.X.shape[2],) * 2)
    omega = check.finite_array(omega, "omega", shape=(prompts.X.shape[1],))
    weighted = np.einsum("bid,bi,i->bd", prompts.X, prompts.y, omega)
    return np.einsum("bd,de,be->b", prompts.x_query, W, weighted)


# ==================================================================================================================
# The models and their gradients (§2.3-2.6)
# ==================================================================================================================


def _attention_parts(Z, Wq, Wk, v):
    n = Z.shape[1] - 1
    u = Z @ v                                   # (B, n+1): z_iᵀv
    Gv = np.einsum("bi,bik->bk", u, Z)           # Σ_i z_i z_iᵀ v
    a = Z[:, n] @ Wq                             # W_qᵀ z_q
    b = Gv @ Wk                                  # W_kᵀ G v
    return np.einsum("bj,bj->b", a, b) / n, a, b, Gv


def attention_forward(Z, Wq, Wk, v) -> np.ndarray:
    """ŷ = (1/n) z_qᵀ W_qW_kᵀ (Σ_{i<=n+1} z_iz_iᵀ) v, the bottom-right entry of one linear-attention layer (§2.3)."""
    Z, D, Wq, Wk = _check_layer(Z, Wq, Wk)
    v = check.finite_array(v, "v", shape=(D,))
    return _attention_prediction(Z, Wq, Wk, v)


def _check_layer(Z, Wq, Wk):
    """Token matrices Z and the query/key projections W_q, W_k (d + 1 rows, one shape) of a layer's forward pass:
    (Z, d + 1, W_q, W_k) checked."""
    Z = check.finite_array(Z, "Z")
    D = _check_tokens(Z)
    Wq = check.finite_array(Wq, "Wq", ndim=2)
    if Wq.shape[0] != D:
        raise ValueError(f"Wq must have d + 1 = {D} rows (the size of Z's tokens), got shape {Wq.shape}")
    return Z, D, Wq, check.finite_array(Wk, "Wk (the shape of Wq)", shape=Wq.shape)


def _check_tokens(Z) -> int:
    """Token matrices Z (B, n+1, d+1) with n >= 1; returns d + 1."""
    if Z.ndim != 3 or Z.shape[1] < 2:
        raise ValueError(f"Z must have shape (B, n+1, d+1) with n >= 1, got {Z.shape}")
    return Z.shape[2]


def _attention_prediction(Z, Wq, Wk, v) -> np.ndarray:
    """:func:`attention_forward` without the checks, for the training loop: parameters that stop being finite there
    are a divergence, which the loop reports naming the step."""
    return _attention_parts(Z, Wq, Wk, v)[0]


def _h3_parts(Z, Wq, Wk, Wv, f):
    n = Z.shape[1] - 1
    token_weights = f[::-1]                      # token i (1-based) gets f_{n+1-i}
    q = Z[:, n] @ Wq
    K, V = Z @ Wk, Z @ Wv
    P = np.einsum("p,bpm,bpm->bm", token_weights, K, V)
    return np.einsum("bm,bm->b", q, P) / n, q, K, V, P, token_weights


def h3_forward(Z, Wq, Wk, Wv, f) -> np.ndarray:
    """ŷ = (1/n) Σ_j [ZW_q]_{n+1,j} Σ_i f_{n+1-i}[ZW_k]_{ij}[ZW_v]_{ij}: one H3-like layer with a shared causal filter
    f = (f_0..f_n) and a channel sum (§2.4)."""
    Z, D, Wq, Wk = _check_layer(Z, Wq, Wk)
    Wv = check.finite_array(Wv, "Wv (the shape of Wq)", shape=Wq.shape)
    f = check.finite_array(f, "f (one tap per token of Z)", shape=(Z.shape[1],))
    return _h3_parts(Z, Wq, Wk, Wv, f)[0]


@njit(cache=True)
def _pgd_batch_gradient(X, y, x_query, y_query, W):
    """Mean squared loss of ŷ = xᵀWXᵀy on a batch and its gradient in W (∂ŷ/∂W = x (Xᵀy)ᵀ)."""
    B, n, d = X.shape
    loss = 0.0
    dW = np.zeros((d, d))
    g = np.empty(d)
    xW = np.empty(d)
    for b in range(B):
        for j in range(d):
            acc = 0.0
            for i in range(n):
                acc += X[b, i, j] * y[b, i]
            g[j] = acc
        np.dot(x_query[b], W, xW)  # the BLAS call of x_query[b] @ W, cheaper to compile
        prediction = xW @ g
        residual = prediction - y_query[b]
        loss += residual * residual
        r = 2.0 * residual / B
        for j in range(d):
            for k in range(d):
                dW[j, k] += r * x_query[b, j] * g[k]
    return loss / B, dW


@njit(cache=True)
def _attention_batch_gradient(Z, y_query, Wq, Wk, v):
    """Mean squared loss of linear attention (§2.3) and its gradient in (W_q, W_k, v). Per prompt, with
    a = W_qᵀz_q and b = W_kᵀGv (G = Σ z_iz_iᵀ): ŷ = aᵀb/n, ∂ŷ/∂W_q = z_q bᵀ/n, ∂ŷ/∂W_k = Gv aᵀ/n,
    ∂ŷ/∂v = G W_k a/n."""
    B, T, D = Z.shape
    n = T - 1
    loss = 0.0
    dWq = np.zeros(Wq.shape)
    dWk = np.zeros(Wk.shape)
    dv = np.zeros(D)
    Gv = np.empty(D)
    # Buffers for the BLAS products: np.dot(A, B, out) is the call A @ B makes, and much cheaper to compile.
    a = np.empty(Wq.shape[1])
    bb = np.empty(Wk.shape[1])
    w = np.empty(D)
    for b in range(B):
        for k in range(D):
            Gv[k] = 0.0
        for i in range(T):
            u = 0.0
            for k in range(D):
                u += Z[b, i, k] * v[k]
            for k in range(D):
                Gv[k] += u * Z[b, i, k]
        zq = Z[b, n]
        np.dot(zq, Wq, a)
        np.dot(Gv, Wk, bb)
        residual = (a @ bb) / n - y_query[b]
        loss += residual * residual
        r = 2.0 * residual / (B * n)
        # The outer-product updates as loops (cheaper to compile than array expressions, same numbers).
        for j in range(D):
            for k in range(bb.size):
                dWq[j, k] += r * (zq[j] * bb[k])
                dWk[j, k] += r * (Gv[j] * a[k])
        np.dot(Wk, a, w)
        for i in range(T):
            t = 0.0
            for k in range(D):
                t += Z[b, i, k] * w[k]
            for k in range(D):
                dv[k] += r * t * Z[b, i, k]
    return loss / B, dWq, dWk, dv


@njit(cache=True)
def _h3_batch_gradient(Z, y_query, Wq, Wk, Wv, f):
    """Mean squared loss of the H3 layer (§2.4) and its gradient in (W_q, W_k, W_v, f). Per prompt, with q = W_qᵀz_q,
    K_p = W_kᵀz_p, V_p = W_vᵀz_p and P = Σ_p f_{n−p} K_p∘V_p (p = 0..n): ŷ = qᵀP/n."""
    B, T, D = Z.shape
    n = T - 1
    m = Wq.shape[1]
    loss = 0.0
    dWq = np.zeros(Wq.shape)
    dWk = np.zeros(Wk.shape)
    dWv = np.zeros(Wv.shape)
    df = np.zeros(T)
    K = np.empty((T, m))
    V = np.empty((T, m))
    P = np.empty(m)
    q = np.empty(m)
    for b in range(B):
        # The BLAS products Z[b] @ W_k etc. as np.dot(A, B, out): the same call, much cheaper to compile.
        np.dot(Z[b], Wk, K)
        np.dot(Z[b], Wv, V)
        for j in range(m):
            P[j] = 0.0
        for p in range(T):
            for j in range(m):
                P[j] += f[n - p] * K[p, j] * V[p, j]
        zq = Z[b, n]
        np.dot(zq, Wq, q)
        residual = (q @ P) / n - y_query[b]
        loss += residual * residual
        r = 2.0 * residual / (B * n)
        for k in range(D):  # dWq += r zq Pᵀ, as a loop (cheaper to compile, same numbers)
            for j in range(m):
                dWq[k, j] += r * (zq[k] * P[j])
        for p in range(T):
            for j in range(m):
                dP = r * q[j]
                grad_k = dP * f[n - p] * V[p, j]
                grad_v = dP * f[n - p] * K[p, j]
                df[n - p] += dP * K[p, j] * V[p, j]
                for k in range(D):
                    dWk[k, j] += Z[b, p, k] * grad_k
                    dWv[k, j] += Z[b, p, k] * grad_v
    return loss / B, dWq, dWk, dWv, df


def _check_batch(prompts: Prompts):
    X = check.finite_array(prompts.X, "prompts.X", ndim=3)
    B, n, d = X.shape
    for name, shape in (("y", (B, n)), ("x_query", (B, d)), ("y_query", (B,))):
        check.finite_array(getattr(prompts, name), f"prompts.{name}", shape=shape)
    return B, n, d


def _check_weights(arrays, names, shapes):
    out = []
    for array, name, shape in zip(arrays, names, shapes):
        array = check.finite_array(array, name)
        if array.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
        out.append(np.array(array, dtype=float, order="C"))  # writable and contiguous: the kernels' one signature
    return out


def pgd_batch_gradient(prompts: Prompts, W) -> tuple[float, np.ndarray]:
    """The minibatch loss (1/B) Σ_b (ŷ_b − y_q,b)² of PGD, ŷ = xᵀWXᵀy (§2.1), and its gradient in W, the step
    :func:`train` takes for ``pgd`` (and, through W = W₀ + UVᵀ, for ``lora``; §8.1). Returns (loss, ∂loss/∂W)."""
    _, _, d = _check_batch(prompts)
    (W,) = _check_weights([W], ["W"], [(d, d)])
    return _pgd_batch_gradient(prompts.X, prompts.y, prompts.x_query, prompts.y_query, W)


def attention_batch_gradient(prompts: Prompts, Wq, Wk, v) -> tuple[float, tuple[np.ndarray, ...]]:
    """The minibatch loss (1/B) Σ_b (ŷ_b − y_q,b)² of one linear-attention layer (§2.3; W_q, W_k of shape
    (d+1, d_k), the value column v of length d+1) and its gradient, the step :func:`train` takes for ``attention``
    (§8.1). Returns (loss, (∂/∂W_q, ∂/∂W_k, ∂/∂v))."""
    _, _, d = _check_batch(prompts)
    width = np.shape(Wq)[-1] if np.ndim(Wq) == 2 else 0
    Wq, Wk, v = _check_weights([Wq, Wk, v], ["Wq", "Wk", "v"], [(d + 1, width), (d + 1, width), (d + 1,)])
    loss, dWq, dWk, dv = _attention_batch_gradient(token_matrices(prompts), prompts.y_query, Wq, Wk, v)
    return loss, (dWq, dWk, dv)


def h3_batch_gradient(prompts: Prompts, Wq, Wk, Wv, f) -> tuple[float, tuple[np.ndarray, ...]]:
    """The minibatch loss (1/B) Σ_b (ŷ_b − y_q,b)² of the H3 layer (§2.4; W_q, W_k, W_v of shape (d+1, m), the
    filter f = (f_0..f_n)) and its gradient, the step :func:`train` takes for ``h3`` (§8.1). Returns
    (loss, (∂/∂W_q, ∂/∂W_k, ∂/∂W_v, ∂/∂f))."""
    _, n, d = _check_batch(prompts)
    width = np.shape(Wq)[-1] if np.ndim(Wq) == 2 else 0
    Wq, Wk, Wv, f = _check_weights([Wq, Wk, Wv, f], ["Wq", "Wk", "Wv", "f"],
                                   [(d + 1, width), (d + 1, width), (d + 1, width), (n + 1,)])
    loss, dWq, dWk, dWv, df = _h3_batch_gradient(token_matrices(prompts), prompts.y_query, Wq, Wk, Wv, f)
    return loss, (dWq, dWk, dWv, df)
MAX_RANK = 1000  # the widest low-rank factor (a d × rank matrix per parameter)


def _check_rank(rank) -> int:
    rank = check.integer(rank, "rank", minimum=1)
    if rank > MAX_RANK:
        raise ValueError(f"rank must be <= {MAX_RANK}, got {rank}")
    return rank


class _PGDModel:
    """ŷ = xᵀWXᵀy with W trained directly, or W = W₀ + UVᵀ with W₀ frozen (a LoRA adapter of rank r, §2.6)."""

    def __init__(self, problem, rng, init_scale, rank, W0):
        d = problem.d
        self.problem = problem
        self.W0 = None if W0 is None else check.finite_array(W0, "W0", shape=(d, d))
        if self.W0 is None:
            self.params = [np.zeros((d, d))]
        else:
            rank = _check_rank(rank)
            # U starts at 0 so W starts at W₀; V random so the gradient in U is not zero.
            self.params = [np.zeros((d, rank)), init_scale * rng.standard_normal((d, rank))]

    def preconditioner(self):
        return self.params[0] if self.W0 is None else self.W0 + self.params[0] @ self.params[1].T

    def gradient(self, batch, Z):
        loss, dW = _pgd_batch_gradient(batch.X, batch.y, batch.x_query, batch.y_query, self.preconditioner())
        if self.W0 is None:
            return loss, [dW]
        U, V = self.params
        return loss, [dW @ V, dW.T @ U]

    def effective(self):
        return self.preconditioner(), None


class _AttentionModel:
    """Linear attention (§2.3) with W_q, W_k of shape (d+1, d_k) and the value's last column v; d_k = ``rank``
    (default d+1) gives the low-rank attention of §2.5."""

    def __init__(self, problem, rng, init_scale, rank, value_init):
        D = problem.d + 1
        width = D if rank is None else _check_rank(rank)
        self.problem = problem
        self.params = [init_scale * rng.standard_normal((D, width)), init_scale * rng.standard_normal((D, width)),
                       (init_scale if value_init == "random" else 0.1) * rng.standard_normal(D)]
        if value_init == "label_copy":  # v ≈ e_{d+1}: the value reads the label slot (§8.2)
            self.params[2][-1] = 1.0

    def gradient(self, batch, Z):
        loss, dWq, dWk, dv = _attention_batch_gradient(Z, batch.y_query, *self.params)
        return loss, [dWq, dWk, dv]

    def effective(self):
        return cf.attention_effective_preconditioner(*self.params, self.problem.n), None

    def predict(self, prompts):
        return _attention_prediction(token_matrices(prompts), *self.params)


class _H3Model:
    """The H3-like layer (§2.4) with m = d+1 channels and a learned filter f = (f_0..f_n)."""

    def __init__(self, problem, rng, init_scale):
        D, n = problem.d + 1, problem.n
        self.problem = problem
        self.params = [init_scale * rng.standard_normal((D, D)) for _ in range(3)]
        self.params.append(0.3 + 0.01 * rng.standard_normal(n + 1))

    def gradient(self, batch, Z):
        loss, dWq, dWk, dWv, df = _h3_batch_gradient(Z, batch.y_query, *self.params)
        return loss, [dWq, dWk, dWv, df]

    def effective(self):
        return cf.h3_effective_parameters(*self.params)

    def predict(self, prompts):
        return h3_forward(token_matrices(prompts), *self.params)


MODELS = ("pgd", "attention", "h3", "lora")
PARAMETER_NAMES = dict(pgd=("W",), lora=("U", "V"), attention=("Wq", "Wk", "v"), h3=("Wq", "Wk", "Wv", "f"))
VALUE_INITS = ("label_copy", "random")


def make_model(name: str, problem: H3Problem, rng, *, init_scale: float = 0.3, rank: int | None = None, W0=None,
               value_init: str = "label_copy"):
    """A trainable model: ``params``, ``gradient(batch, Z) -> (loss, grads)``, ``effective() -> (W, ω or None)``.

    Initial weights (§8.2), drawn from ``rng`` in this order by ``rng.standard_normal``: ``pgd`` none (W = 0);
    ``lora`` U = 0 and then V = init_scale·N(0, 1) of shape (d, r); ``attention`` W_q, then W_k, each
    init_scale·N(0, 1) of shape (d+1, d_k), then v = s·N(0, I_{d+1}) with s = init_scale for ``value_init="random"``
    and s = 0.1 with its last entry set to 1 for ``"label_copy"``; ``h3`` W_q, W_k, W_v, each init_scale·N(0, 1) of
    shape (d+1, d+1), then f = 0.3 + 0.01·N(0, I_{n+1})."""
    if name not in MODELS:
        raise ValueError(f"name (the model) must be one of {MODELS}, got {name!r}")
    if value_init not in VALUE_INITS:
        raise ValueError(f"value_init must be one of {VALUE_INITS}, got {value_init!r}")
    init_scale = check.real(init_scale, "init_scale", minimum=0.0)
    if name == "pgd":
        return _PGDModel(problem, rng, init_scale, None, None)
    if name == "lora":
        if W0 is None:
            raise ValueError("W0 must be given for a LoRA adapter (the frozen pretrained preconditioner)")
        return _PGDModel(problem, rng, init_scale, 1 if rank is None else rank, W0)
    if name == "attention":
        return _AttentionModel(problem, rng, init_scale, rank, value_init)
    return _H3Model(problem, rng, init_scale)


def trained_predictor(trajectory: Trajectory, W0=None):
    """``predict(prompts) -> ŷ`` of the model a :func:`train` run ended with (its ``final`` weights)."""
    model, w = trajectory.info["model"], trajectory.final
    if model == "attention":
        return lambda prompts: _attention_prediction(token_matrices(prompts), w["Wq"], w["Wk"], w["v"])
    if model == "h3":
        return lambda prompts: h3_forward(token_matrices(prompts), w["Wq"], w["Wk"], w["Wv"], w["f"])
    W = w["W"] if model == "pgd" else W0 + w["U"] @ w["V"].T
    return lambda prompts: pgd_predict(prompts, W)


def _odd_part_risk(problem: H3Problem, W, omega) -> float:
    """The exact risk of the model's odd part: the PGD (ω None) or WPGD predictor it reduces to (§3)."""
    if omega is None:
        return float(cf.pgd_risk(problem, W))
    return float(cf.wpgd_risk(problem, W, omega))


def train(problem: H3Problem, model: str, *, seed: SeedLike, steps: int = 2000, batch_size: int = 256,
          lr: float = 0.01, optimizer: str = "adam", init_scale: float = 0.3, rank: int | None = None, W0=None,
          value_init: str = "label_copy", record_every: int | None = None,
          final_fraction: float = FINAL_FRACTION) -> Trajectory:
    """Train ``model`` on fresh prompts, one new batch per step, with a cosine decay of ``lr`` to ``final_fraction``
    (default the optimisers' shared FINAL_FRACTION = 0.01; the protocol of docs/linear_attention_h3.md §8.1, which
    the claims and :func:`minibatch` run, passes PROTOCOL_FINAL_FRACTION = 0.02).

    Models: ``pgd`` (W), ``attention`` (W_q, W_k, v; ``rank`` = d_k), ``h3`` (W_q, W_k, W_v, f), ``lora``
    (W = W₀ + UVᵀ, ``rank`` = r). In the iid design the metric ``risk`` is the *exact* closed-form risk of the model's
    odd part, the PGD/WPGD predictor it reduces to (§3), which is the model's risk whenever its even part vanishes
    (as at every optimum); ``batch_loss`` is the minibatch loss (NaN at step 0: no batch yet). The rag and tfa designs
    record ``batch_loss`` only.
    ``states`` hold the effective preconditioner ``W`` (and the weights ``omega`` of H3); ``final`` the model's
    weights. Raises ``DivergenceError`` naming the step when the loss or a parameter stops being finite.

    Randomness (docs/linear_attention_h3.md §8.1): ``seed`` is split by ``seeding.spawn(seed, 2)`` into its next two
    children (for an integer s: SeedSequence(s, spawn_key=(0,)) and (1,)). The first seeds the generator of the
    initial weights, drawn by :func:`make_model` in the order of §8.2; the second the generator of the data, from
    which step k = 1, …, ``steps`` draws its batch ``sample_prompts(problem, batch_size, rng)`` in turn. Each step
    is the optimiser's (``OPTIMIZERS[optimizer](params, lr, steps, final_fraction)``) on the minibatch gradient
    (:func:`pgd_batch_gradient`, :func:`attention_batch_gradient`, :func:`h3_batch_gradient`).
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
    steps, _ = check_run_length(steps, None, optional_records=True)
    batch_size = check_batch_size(batch_size)
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    init_scale = check.real(init_scale, "init_scale", minimum=0.0)
    record_every = max(1, steps // 100) if record_every is None else check.integer(record_every, "record_every", 1)
    init_rng, data_rng = generators(seed, 2)
    net = make_model(model, problem, init_rng, init_scale=init_scale, rank=rank, W0=W0, value_init=value_init)
    opt = OPTIMIZERS[optimizer](net.params, lr, steps, final_fraction)
    exact = problem.design == "iid"

    def record(step, loss):
        W, omega = net.effective()
        times.append(step)
        losses.append(loss)
        Ws.append(W.copy())
        omegas.append(np.ones(problem.n) if omega is None else omega.copy())
        if exact:
            risk = _odd_part_risk(problem, W, omega)
            if not np.isfinite(risk) or risk > 1e12:
                raise DivergenceError(f"diverged at step {step}: the risk is {risk:.3g} (lower lr={lr})")
            risks.append(risk)

    times, losses, Ws, omegas, risks = [], [], [], [], []
    record(0, np.nan)
    for step in range(1, steps + 1):
        batch = sample_prompts(problem, batch_size, data_rng)
        loss, grads = net.gradient(batch, token_matrices(batch) if model in ("attention", "h3") else None)
        if not np.isfinite(loss) or not all(np.all(np.isfinite(g)) for g in grads):
            raise DivergenceError(f"diverged at step {step}: the minibatch loss or gradient is not finite "
                                  f"(lower lr={lr})")
        opt.step(grads)
        if step % record_every == 0 or step == steps:
            record(step, loss)
    metrics = dict(batch_loss=np.array(losses))
    if exact:
        metrics["risk"] = np.array(risks)
    return Trajectory(times=np.array(times, float), states=dict(W=np.array(Ws), omega=np.array(omegas)),
                      metrics=metrics, final=dict(zip(PARAMETER_NAMES[model], (p.copy() for p in net.params))),
                      info=dict(model=model, optimizer=optimizer, lr=lr, batch_size=batch_size, steps=steps,
                                value_init=value_init, init_scale=init_scale, rank=rank))


# ==================================================================================================================
# Gradient flow of the risk in the preconditioner (§4.4)
# ==================================================================================================================


@njit(cache=True)
def flow_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """The DOPRI5 loop bound to Ẇ = −∇R(W, ω), for compiled callers; :func:`population_trajectory` calls
    ``solve_dopri5(cf.preconditioner_flow_rhs_into, ...)``, which shares one cached loop among all systems."""
    return dopri5_loop(cf.preconditioner_flow_rhs_into, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def population_trajectory(problem: H3Problem, W=None, omega=None, *, t_end: float | None = None,
                          n_points: int = 200, rtol: float = 1e-10, atol: float = 1e-13) -> Trajectory:
    """Gradient flow Ẇ = −∇R(W, ω) of the (W)PGD risk from ``W`` (default 0), weights ``omega`` fixed (default 1).

    The flow is linear, Ẇ = 2a HΨH − 2HWM_ω, so its error decays at the slowest rate 2λ_min(H)λ_min(M_ω) (§4.4);
    ``t_end`` defaults to 30 over that rate. Metrics: ``risk`` (closed form), ``excess_risk`` (R − min_W R(·, ω)) and
    ``distance`` ‖W − W*(ω)‖_F.
    """
    d = problem.d
    omega = np.ones(problem.n) if omega is None else check.finite_array(omega, "omega", shape=(problem.n,))
    W = np.zeros((d, d)) if W is None else check.finite_array(W, "W", shape=(d, d))
    rate = flow_rate(problem, omega)
    times = flow_times(30.0 / rate if t_end is None else t_end, n_points)
    solution = solve_dopri5(cf.preconditioner_flow_rhs_into, W.ravel(), times, cf.pack_flow_params(problem, omega),
                            rtol=rtol, atol=atol)
    Ws = solution.y.reshape(-1, d, d)
    W_star = cf.optimal_weighted_preconditioner(problem, omega)
    risk = cf.wpgd_risk(problem, Ws, omega)
    return Trajectory(times=times, states=dict(W=Ws),
                      metrics=dict(risk=risk, excess_risk=risk - cf.optimal_risk_for_weights(problem, omega),
                                   distance=np.linalg.norm(Ws - W_star, axis=(-2, -1))),
                      info=dict(rate=rate, limit=W_star, n_rhs_evals=solution.n_rhs_evals, n_steps=solution.n_steps))


def flow_rate(problem: H3Problem, omega=None) -> float:
    """2 λ_min(H) λ_min(M_ω): the slowest decay rate of the linear flow (§4.4)."""
    omega = np.ones(problem.n) if omega is None else omega
    M = cf.gradient_second_moment(problem, omega)
    return 2 * float(np.linalg.eigvalsh(problem.H).min() * np.linalg.eigvalsh((M + M.T) / 2).min())


# ==================================================================================================================
# The System contract
# ==================================================================================================================


def correlated_population_trajectory(problem: H3Problem, *, t_end: float | None = None,
                                    n_points: int = 200) -> Trajectory:
    """The rag and tfa designs: W = cI is optimal (§7.1), and the flow ċ = −dR/dc = 2A − 2Bc of
    R(cI) = E y_q² − 2cA + c²B from c = 0 is solved exactly, c(t) = c*(1 − exp(−2Bt)); its rate is 2B."""
    moments = cf.correlated_moments(problem)
    L_star, c_star = cf.correlated_optimum(problem)
    rate = 2 * moments.B
    times = flow_times(30.0 / rate if t_end is None else t_end, n_points)
    c = c_star * -np.expm1(-rate * times)
    risk = moments.query_second_moment - 2 * c * moments.A + c * c * moments.B
    return Trajectory(times=times, states=dict(c=c), metrics=dict(risk=risk, excess_risk=risk - L_star,
                                                                  distance=np.abs(c - c_star)),
                      info=dict(rate=rate, limit=c_star))


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("t_end", "real", None, "flow time (default 30 over the slowest rate)", minimum=0.0, strict=True),
    Parameter("n_points", "integer", 200, "recorded times (log-spaced)", minimum=2, maximum=MAX_POINTS),
)
MINIBATCH_OPTIONS = (
    Parameter("model", "choice", "attention", "trained model", choices=("pgd", "attention", "h3")),
    Parameter("steps", "integer", 2000, "training steps", minimum=1, maximum=10_000_000),
    Parameter("batch_size", "integer", 256, "fresh prompts per step", minimum=1, maximum=MAX_BATCH),
    Parameter("lr", "real", 0.01, "initial learning rate (cosine decay to 2%)", minimum=0.0, strict=True),
    Parameter("optimizer", "choice", "adam", "the optimiser", choices=("adam", "sgd")),
    Parameter("rank", "integer", None, "key/query width d_k of the attention (default d + 1)", minimum=1,
              maximum=MAX_RANK),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: H3Problem, *, t_end: float | None, n_points: int) -> Trajectory:
    """The gradient flow of the PGD risk from W = 0 (:func:`population_trajectory`); in the rag and tfa designs the
    exact flow of R(cI) (:func:`correlated_population_trajectory`)."""
    if problem.design != "iid":
        return correlated_population_trajectory(problem, t_end=t_end, n_points=n_points)
    return population_trajectory(problem, t_end=t_end, n_points=n_points)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: H3Problem, *, seed: SeedLike, model: str, steps: int,
              batch_size: int, lr: float, optimizer: str, rank: int | None) -> Trajectory:
    """Training on fresh prompts, one batch per step, by the protocol of docs/linear_attention_h3.md §8.1
    (:func:`train` with the learning rate decaying to PROTOCOL_FINAL_FRACTION = 2%)."""
    return train(problem, model, seed=seed, steps=steps, batch_size=batch_size, lr=lr, optimizer=optimizer, rank=rank,
                 final_fraction=PROTOCOL_FINAL_FRACTION)
