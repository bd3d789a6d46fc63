"""The CCMC system's numerics: the raw attention layer, sampling, the MLE, Adam on W, and generated trajectories.

The raw model (docs/ccmc.md §2) is computed here from its weights (E, W, tied head C), never through the closed
form, so that the claims compare two independent computations. Generated trajectories use the count-vector
state (a_t, m(t)) of §6, O(K) per step, for many runs at once. Every function that draws takes a keyword-only
``seed`` (a SeedSequence or a non-negative integer); numba kernels get theirs from ``seeding.kernel_seed``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy import optimize

from attnflow import seeding
from attnflow.closed_forms import ccmc as cf
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.ccmc import CCMCProblem
from attnflow.closed_forms.lapack import DGESV, solve_into
from attnflow.closed_forms.softmax import softmax_into
from attnflow.closed_forms.parameters import Parameter, takes_options

from .errors import DivergenceError
from .integrate import dopri5_loop, solve_dopri5
from .montecarlo import MAX_RECORDS, MAX_BATCH, Trajectory, check_count, check_run_length, log_grid

__all__ = ["POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "MAX_RUNS", "random_embeddings", "tied_head", "attention_logits", "attention_output", "positional_attention_output",
           "sample_raw_outputs", "generate_raw", "sample_learning_data", "fit_mle", "raw_nll_and_gradient",
           "adam_raw", "generate_counts", "fluid_dopri5", "fluid_trajectory", "population", "minibatch",
           "identified_groups",
           "MAX_DRAWS"]

# Largest number of draws / runs × records one call may allocate.
MAX_DRAWS = 50_000_000
MAX_ATTENTION_WORK = 10**10  # runs × (context length)² of one generate_raw call: about ten seconds
MAX_RUNS = 100_000  # generated trajectories in one call (each keeps its counts at every record)


def random_embeddings(K: int, d: int, *, seed, orthonormal: bool = False) -> np.ndarray:
    """E ∈ R^{K×d} with i.i.d. N(0, 1/d) entries (full row rank almost surely for d >= K), or with ``orthonormal``
    K orthonormal rows of a Haar-random rotation (EEᵀ = I)."""
    orthonormal = check.boolean(orthonormal, "orthonormal")
    K = check.integer(K, "K", minimum=2)
    d = check.integer(d, "d", minimum=K)
    gaussian = np.random.default_rng(seeding.as_seed_sequence(seed)).standard_normal((K, d)) / math.sqrt(d)
    if not orthonormal:
        return gaussian
    q, r = np.linalg.qr(gaussian.T)
    return np.ascontiguousarray((q * np.sign(np.diag(r))).T)


def tied_head(E) -> np.ndarray:
    """C = (EEᵀ)⁻¹E, so that CEᵀ = I_K (the weight tying of §2)."""
    E = check.finite_array(E, "E", ndim=2)
    if np.linalg.matrix_rank(E) < E.shape[0]:
        raise ValueError("E must have full row rank (d >= K and independent embeddings)")
    return np.linalg.solve(E @ E.T, E)


def attention_logits(E, W) -> np.ndarray:
    """Θ_{a,k} = e_kᵀ W e_a, i.e. Θ = (E W Eᵀ)ᵀ (§1)."""
    E, W, _ = _check_weights(E, W)
    return (E @ W @ E.T).T


# The kernels below are written with scalar loops where numpy calls would cost far more numba compile time; each
# loop does the same operations in the same order as the numpy call it replaces (same numbers). The BLAS products
# (@) stay: a loop would round differently.

@njit(cache=True)
def _attention_output(E, W, C, prompts, exclude):
    n, L = prompts.shape
    K, d = E.shape
    out = np.zeros((n, K))
    keys = L - 1 if exclude else L
    s = np.empty(keys)
    value = np.empty(d)
    q = np.empty(d)
    output = np.empty(K)
    for i in range(n):
        np.dot(W, E[prompts[i, L - 1]], q)  # the BLAS calls of W @ e and C @ value, into buffers
        for j in range(keys):
            s[j] = np.dot(E[prompts[i, j]], q)
        softmax_into(s, s)
        for u in range(d):
            value[u] = 0.0
        for j in range(keys):
            e_j = E[prompts[i, j]]
            for u in range(d):
                value[u] += s[j] * e_j[u]
        np.dot(C, value, output)
        for k in range(K):
            out[i, k] = output[k]
    return out


def _check_weights(E, W):
    """Checked E, W and the tied head C = E as writable C-ordered copies: with writable operands the kernels' products
    share numba's compiled np.dot with the other kernels (a read-only operand is another signature to compile)."""
    E = check.finite_array(E, "E", ndim=2)
    W = check.finite_array(W, f"W (d x d for E of d = {E.shape[1]} columns)", shape=(E.shape[1], E.shape[1]))
    return np.array(E, order="C"), np.array(W, order="C"), np.array(tied_head(E), order="C")


def attention_output(E, W, prompts, query: str = "self") -> np.ndarray:
    """The raw layer's output C X̄ᵀ softmax(X̄ W e_{x_L}) (§2, eq. 2.1) for each prompt: (n, K), computed from the
    weights position by position. ``query="exclude"`` keeps the last position out of the keys and values."""
    E, W, C = _check_weights(E, W)
    prompts = cf.check_prompts(prompts, E.shape[0], query=query)
    return _attention_output(E, W, C, prompts, query == "exclude")


def positional_attention_output(E, positions, W_full, tokens) -> np.ndarray:
    """The raw layer with concatenated positional encodings x̄_i = (e_{x_i}; p_i), a full attention matrix W_full
    ((d + d_p) square) and head [C, 0] (§4): returns the output (K,) for the prompt ``tokens`` (L,)."""
    E = check.finite_array(E, "E", ndim=2)
    K, d = E.shape
    positions = check.finite_array(positions, "positions", ndim=2)
    tokens = cf.check_prompts(tokens, K, "tokens")[0]
    if positions.shape[0] < tokens.size:
        raise ValueError(f"positions must hold at least L = {tokens.size} encodings, got {positions.shape[0]}")
    W_full = check.finite_array(W_full, "W_full", shape=(d + positions.shape[1],) * 2)
    X = np.hstack([E[tokens], positions[:tokens.size]])
    scores = X @ W_full @ X[-1]
    s = np.exp(scores - scores.max())
    s /= s.sum()
    return tied_head(E) @ (X[:, :d].T @ s)


@njit(cache=True)
def _categorical(p, total):
    u = np.random.random() * total
    acc = 0.0
    for k in range(p.size):
        acc += p[k]
        if u < acc:
            return k
    for k in range(p.size - 1, -1, -1):  # round-off at the top end: the last token with positive weight
        if p[k] > 0:
            return k
    return p.size - 1


@njit(cache=True)
def _sample_rows(probabilities, draws, kernel_seed):
    np.random.seed(kernel_seed)
    n, K = probabilities.shape
    out = np.empty((n, draws), dtype=np.int64)
    for i in range(n):
        total = 0.0
        for k in range(K):
            total += probabilities[i, k]
        for j in range(draws):
            out[i, j] = _categorical(probabilities[i], total)
    return out


def sample_raw_outputs(E, W, prompts, draws: int, *, seed, query: str = "self") -> np.ndarray:
    """``draws`` next tokens per prompt sampled from the raw layer's output (no output softmax, §2): (n, draws)."""
    draws = check.integer(draws, "draws", minimum=1)
    p = attention_output(E, W, prompts, query)
    if p.shape[0] * draws > MAX_DRAWS:
        raise ValueError(f"draws × prompts must be <= {MAX_DRAWS}")
    if np.any(p < -1e-12):
        raise ValueError("the layer's output has negative entries: E and the head are not tied")
    return _sample_rows(np.clip(p, 0.0, None), draws, seeding.kernel_seed(seed))


@njit(cache=True)
def _generate_raw(E, W, C, X0, steps, runs, exclude, kernel_seed):
    np.random.seed(kernel_seed)
    L0 = X0.size
    K, d = E.shape
    out = np.empty((runs, L0 + steps), dtype=np.int64)
    value = np.empty(d)
    p = np.empty(K)
    q = np.empty(d)
    output = np.empty(K)
    scores = np.empty(L0 + steps)  # the attention scores of the longest prompt; each step uses its first `keys`
    for r in range(runs):
        for j in range(L0):
            out[r, j] = X0[j]
        for t in range(steps):
            L = L0 + t
            keys = L - 1 if exclude else L
            np.dot(W, E[out[r, L - 1]], q)  # W @ e and C @ value as np.dot into buffers: the same BLAS calls
            s = scores[:keys]  # a contiguous view, the array type softmax_into is compiled for
            for j in range(keys):
                s[j] = np.dot(E[out[r, j]], q)
            softmax_into(s, s)
            for u in range(d):
                value[u] = 0.0
            for j in range(keys):
                e_j = E[out[r, j]]
                for u in range(d):
                    value[u] += s[j] * e_j[u]
            np.dot(C, value, output)
            total = 0.0
            for k in range(K):  # np.maximum(output, 0.0): a NaN stays NaN
                p[k] = 0.0 if output[k] < 0.0 else output[k]
                total += p[k]
            out[r, L] = _categorical(p, total)
    return out


def generate_raw(E, W, X0, steps: int, runs: int, *, seed, query: str = "self") -> np.ndarray:
    """Autoregressive generation with the raw layer and a growing context (§6): (runs, L₀ + steps) tokens."""
    E, W, C = _check_weights(E, W)
    X0 = cf.check_prompts(X0, E.shape[0], "X0", query=query)[0]
    steps = check.integer(steps, "steps", minimum=0)
    runs = check_count(runs, "runs", MAX_RUNS)
    if runs * (X0.size + steps) > MAX_DRAWS:
        raise ValueError(f"runs × (L0 + steps) must be <= {MAX_DRAWS}")
    if runs * (X0.size + steps) ** 2 > MAX_ATTENTION_WORK:  # each step attends over the whole growing context
        raise ValueError(f"steps: runs × (L0 + steps)² must be <= {MAX_ATTENTION_WORK:.0e} (the attention's work), "
                         f"got {runs} × {X0.size + steps}²")
    return _generate_raw(E, W, C, X0, steps, runs, query == "exclude", seeding.kernel_seed(seed))


# ---------------------------------------------------------------------------------------------------------------
# Learning from i.i.d. prompts (§5)
# ---------------------------------------------------------------------------------------------------------------

def sample_learning_data(problem: CCMCProblem, n: int, *, seed) -> tuple[np.ndarray, np.ndarray]:
    """n i.i.d. uniform prompts of length L and labels y ~ CCMC(P) (teacher–student, §5): ((n, L), (n,))."""
    n = check.integer(n, "n", minimum=1)
    if n * problem.L > MAX_DRAWS:
        raise ValueError(f"n × L must be <= {MAX_DRAWS}")
    prompt_seed, label_seed = seeding.spawn(seed, 2)
    prompts = np.random.default_rng(prompt_seed).integers(0, problem.K, size=(n, problem.L))
    probabilities = cf.ccmc_law(problem.P, prompts, problem.query)
    return prompts, _sample_rows(probabilities, 1, seeding.kernel_seed(label_seed))[:, 0]


@njit(cache=True)
def _largest_magnitude(x):
    """``np.abs(x).max()``: a NaN propagates."""
    top = abs(x[0])
    for k in range(1, x.size):
        if math.isnan(top):
            break
        if math.isnan(x[k]) or abs(x[k]) > top:
            top = abs(x[k])
    return top


@njit(cache=True)
def _newton_mle(counts, last, y, weights, K, max_iterations, tolerance, dgesv):
    """Row-wise damped Newton on ℓ̂_n + ½(Σ_k Θ_{a,k})² per row: the penalty fixes the row-shift gauge and is 0 at
    the centred minimiser (the gradient of ℓ̂_n sums to 0 along each row). Each Newton step is LAPACK's dgesv at the
    address ``dgesv`` (:mod:`attnflow.closed_forms.lapack`: np.linalg.solve's own call, compiled in a fraction of its time). Returns
    (Θ̂, iterations, converged)."""
    Theta = np.zeros((K, K))
    n = y.size
    p = np.empty(K)
    theta = np.empty(K)
    grad = np.empty(K)
    hess = np.empty((K, K))
    step = np.empty(K)
    lu = np.empty(K * K)
    pivots = np.empty(K, np.int32)
    worst = 0
    converged = True
    for a in range(K):
        for k in range(K):
            theta[k] = 0.0
        done = False
        for iteration in range(max_iterations):
            theta_sum = 0.0
            for k in range(K):
                theta_sum += theta[k]
            for k in range(K):  # grad = Σ_k θ_k 1, hess = 11ᵀ + 10⁻¹² I
                grad[k] = theta_sum
                for j in range(K):
                    hess[k, j] = 1.0 + (1e-12 if j == k else 0.0)
            value = 0.5 * theta_sum ** 2
            for i in range(n):
                if last[i] != a:
                    continue
                shift = -np.inf
                for k in range(K):
                    if counts[i, k] > 0 and theta[k] > shift:
                        shift = theta[k]
                z = 0.0
                for k in range(K):
                    p[k] = counts[i, k] * math.exp(theta[k] - shift) if counts[i, k] > 0 else 0.0
                    z += p[k]
                w = weights[i]
                value += w * (math.log(z) + shift - theta[y[i]])
                for k in range(K):
                    p[k] /= z
                for k in range(K):
                    grad[k] += w * p[k]
                    for j in range(K):
                        hess[k, j] -= w * p[k] * p[j]
                    hess[k, k] += w * p[k]
                grad[y[i]] -= w
            if _largest_magnitude(grad) < tolerance:
                done = True
                worst = max(worst, iteration)
                break
            solve_into(dgesv, hess, grad, lu, pivots, step)
            largest = _largest_magnitude(step)
            if largest > 5.0:  # damped: toward a logit at −∞ (no finite MLE) the full step overshoots
                scale = 5.0 / largest
                for k in range(K):
                    step[k] *= scale
            for k in range(K):
                theta[k] -= step[k]
        converged = converged and done
        for k in range(K):
            Theta[a, k] = theta[k]
    return Theta, worst, converged


def fit_mle(problem: CCMCProblem, prompts, y, *, method: str = "newton", tolerance: float = 1e-9) -> np.ndarray:
    """The MLE Θ̂ (K, K), row-centred, of the convex ℓ̂_n(Θ) of §5.1 with its exact gradient.

    ``method="lbfgs"``: scipy's L-BFGS on all of Θ from 0. ``method="newton"`` (default): Newton's method row by
    row (ℓ̂_n separates over the last token), to the same minimiser in a few iterations; the tests check that
    the two agree. ``tolerance`` bounds the gradient's largest entry. When no finite maximiser exists (small n:
    a logit runs to −∞), Newton hands over to L-BFGS, whose iterate at the tolerance has P̂ near the boundary
    limit.

    Identification: ℓ̂_n fixes only differences of logits of keys that meet in a prompt of the row. In row a,
    tokens linked by co-occurring among the keys of a prompt that ends in a (two distinct keys or more) form
    groups; each group's logits are returned centred (mean 0 over the group), and a logit the data cannot fix —
    a token that never appears as a key of the row, or only alone — is exactly 0. When the whole row is one
    group this is the ordinary row centring (:func:`identified_groups`, docs/ccmc.md §5.1)."""
    K = problem.K
    counts = cf.key_counts(prompts, K, problem.query)
    prompts = np.asarray(prompts)
    last = np.ascontiguousarray(prompts[:, -1], dtype=np.int64)
    y = np.array(y, dtype=np.int64)  # a writable copy, as nll_theta passes: one compiled kernel for both
    if y.shape != last.shape or np.any(counts[np.arange(y.size), y] == 0):
        raise ValueError("y must hold one key token of its prompt per prompt")
    if method not in ("newton", "lbfgs"):
        raise ValueError(f"method must be 'newton' or 'lbfgs', got {method!r}")
    weights = np.full(y.size, 1.0 / y.size)
    if method == "newton":
        Theta, iterations, converged = _newton_mle(counts, last, y, weights, K, 200, min(tolerance, 1e-12), DGESV)
        if converged and np.all(np.isfinite(Theta)):
            return _centre_identified(Theta, identified_groups(counts, last, K))
        # No finite maximiser (a key token of some row is never its label, so that logit runs to −∞, typical at
        # small n): Newton creeps along the unbounded direction; L-BFGS below stops at its tolerance instead.

    sample_weights = cf.read_only_copy(weights * y.size)

    def objective(theta):
        value, gradient = cf.nll_and_gradient_kernel(theta.reshape(K, K), counts, last, y, sample_weights)
        return value, gradient.ravel()

    result = optimize.minimize(objective, np.zeros(K * K), jac=True, method="L-BFGS-B",
                               options=dict(maxiter=2000, gtol=tolerance, ftol=1e-13))
    if not np.all(np.isfinite(result.x)):
        raise DivergenceError(f"the MLE left the finite region after {result.nit} L-BFGS iterations")
    return _centre_identified(result.x.reshape(K, K), identified_groups(counts, last, K))


def identified_groups(counts, last, K: int) -> np.ndarray:
    """(K, K) integer labels: entry (a, k) is the group of token k in row a, −1 where the data cannot fix Θ_{a,k}.

    Two keys of one prompt ending in a fix the difference of their logits in row a; the groups are the connected
    components of that relation, and a token that is never a key of the row, or only the sole key of its prompts,
    is unidentified (−1)."""
    from scipy.sparse.csgraph import connected_components

    counts = np.asarray(counts)
    last = np.asarray(last)
    groups = np.full((K, K), -1, dtype=np.int64)
    for a in range(K):
        present = counts[last == a] > 0
        present = present[present.sum(axis=1) >= 2].astype(np.int64)  # a lone key's logit cancels in the softmax
        linked = present.T @ present > 0
        n_groups, labels = connected_components(linked, directed=False)
        seen = np.diag(linked)
        groups[a, seen] = labels[seen]
    return groups


def _centre_identified(Theta, groups) -> np.ndarray:
    """Θ centred per identified group, 0 where unidentified; a row that is one group covering every token gets the
    ordinary row centring, computed as :func:`attnflow.closed_forms.ccmc.centred_logits` does."""
    centred = cf.centred_logits(Theta)
    for a in range(Theta.shape[0]):
        row = groups[a]
        if np.all(row == row[0]) and row[0] >= 0:
            continue
        centred[a] = 0.0
        for group in np.unique(row[row >= 0]):
            members = row == group
            centred[a, members] = Theta[a, members] - Theta[a, members].mean()
    return centred


@njit(cache=True)
def _raw_nll_and_gradient(E, W, prompts, y, exclude):
    n, L = prompts.shape
    K, d = E.shape
    keys = L - 1 if exclude else L
    grad = np.zeros((d, d))
    value = 0.0
    s = np.empty(keys)
    q = np.empty(d)
    for i in range(n):
        e_a = E[prompts[i, L - 1]]
        np.dot(W, e_a, q)
        for j in range(keys):
            s[j] = np.dot(E[prompts[i, j]], q)
        softmax_into(s, s)
        p_y = 0.0
        for j in range(keys):
            if prompts[i, j] == y[i]:
                p_y += s[j]
        value -= math.log(p_y)
        # ∂(−log Σ_{j: x_j = y} s_j)/∂score_j = s_j − 1{x_j = y} s_j / p_y, and ∂score_j/∂W = e_{x_j} e_aᵀ
        for j in range(keys):
            g = s[j] - (s[j] / p_y if prompts[i, j] == y[i] else 0.0)
            e_j = E[prompts[i, j]]
            for u in range(d):
                for v in range(d):
                    grad[u, v] += g * e_j[u] * e_a[v]
    for u in range(d):
        for v in range(d):
            grad[u, v] /= n
    return value / n, grad


def raw_nll_and_gradient(E, W, prompts, y, query: str = "self") -> tuple[float, np.ndarray]:
    """The raw layer's mean negative log-likelihood −mean log p(y|X) and its gradient in W (d, d), by the chain
    rule through every attention score (§5.2)."""
    E, W, _ = _check_weights(E, W)
    prompts = cf.check_prompts(prompts, E.shape[0], query=query)
    y = np.asarray(y, dtype=np.int64)
    if y.shape != (prompts.shape[0],):
        raise ValueError("y must hold one token per prompt")
    value, grad = _raw_nll_and_gradient(E, W, prompts, y, query == "exclude")
    if not np.isfinite(value):
        raise ValueError("some y is not a key token of its prompt (probability 0)")
    return float(value), grad


@njit(cache=True)
def _adam_loop(E, W, P, L, steps, batch, lr, beta1, beta2, eps, average_from, exclude, record_every, kernel_seed):
    np.random.seed(kernel_seed)
    K, d = E.shape
    keys = L - 1 if exclude else L
    W_in = W
    W = np.empty((d, d))  # updated in place; the caller's W is left alone
    for u in range(d):
        for w in range(d):
            W[u, w] = W_in[u, w]
    m = np.zeros((d, d))
    v = np.zeros((d, d))
    average = np.zeros((d, d))
    grad = np.empty((d, d))
    n_avg = 0
    prompt = np.empty(L, dtype=np.int64)
    weights = np.empty(K)
    s = np.empty(keys)
    q = np.empty(d)
    n_records = steps // record_every
    losses = np.empty(n_records)
    failed = -1
    for step in range(steps):
        for u in range(d):
            for w in range(d):
                grad[u, w] = 0.0
        loss = 0.0
        for b in range(batch):
            for j in range(L):
                prompt[j] = np.random.randint(0, K)
            a = prompt[L - 1]
            # teacher label from the CCMC law with P (§3; equal to the raw teacher by claim 1a)
            for k in range(K):
                weights[k] = 0.0
            for j in range(keys):
                weights[prompt[j]] += P[a, prompt[j]]
            total = 0.0
            for k in range(K):
                total += weights[k]
            y = _categorical(weights, total)
            e_a = E[a]
            np.dot(W, e_a, q)
            for j in range(keys):
                s[j] = np.dot(E[prompt[j]], q)
            softmax_into(s, s)
            p_y = 0.0
            for j in range(keys):
                if prompt[j] == y:
                    p_y += s[j]
            if not p_y > 0.0:  # the attention underflowed onto other tokens: the loss is infinite
                failed = step
                break
            loss -= math.log(p_y)
            for j in range(keys):
                g = s[j] - (s[j] / p_y if prompt[j] == y else 0.0)
                e_j = E[prompt[j]]
                for u in range(d):
                    for w in range(d):
                        grad[u, w] += g * e_j[u] * e_a[w]
        if failed >= 0:
            break
        loss /= batch
        finite = math.isfinite(loss)
        for u in range(d):
            for w in range(d):
                grad[u, w] /= batch
                finite = finite and math.isfinite(grad[u, w])
        if not finite:
            failed = step
            break
        bias1 = 1 - beta1 ** (step + 1)
        bias2 = 1 - beta2 ** (step + 1)
        for u in range(d):
            for w in range(d):
                g = grad[u, w]
                m[u, w] = beta1 * m[u, w] + (1 - beta1) * g
                v[u, w] = beta2 * v[u, w] + (1 - beta2) * g * g
                m_hat = m[u, w] / bias1
                v_hat = v[u, w] / bias2
                W[u, w] = W[u, w] - lr * m_hat / (math.sqrt(v_hat) + eps)
                if step >= average_from:
                    average[u, w] += W[u, w]
        if step >= average_from:
            n_avg += 1
        if (step + 1) % record_every == 0:
            losses[(step + 1) // record_every - 1] = loss
    if n_avg > 0:
        for u in range(d):
            for w in range(d):
                average[u, w] /= n_avg
    return W, average, losses, failed


def adam_raw(problem: CCMCProblem, *, seed, d: int = 6, steps: int = 3000, batch: int = 512, lr: float = 0.02,
             average_from: float = 0.5, n_records: int = 30) -> Trajectory:
    """Adam on the raw key–query matrix W (d × d, from 0; orthonormal random embeddings E, tied head) with fresh
    i.i.d. prompts each step and labels from the teacher P (§5.7); Polyak averaging of W over the steps after
    ``average_from`` × steps.

    Returns a Trajectory of the minibatch NLL; ``final`` holds W, the averaged W̄, E and the learned chain
    P̂ = rowsoftmax(Θ(W̄)). Raises DivergenceError naming the step if the loss or gradient stops being finite."""
    d = check.integer(d, "d", minimum=problem.K)
    steps, _ = check_run_length(steps, n_records)
    batch = check.integer(batch, "batch", minimum=1)
    if batch > MAX_BATCH:
        raise ValueError(f"batch must be <= {MAX_BATCH}, got {batch}")
    if steps * batch > MAX_DRAWS:
        raise ValueError(f"steps × batch must be <= {MAX_DRAWS}")
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    average_from = check.real(average_from, "average_from", minimum=0.0, maximum=1.0)
    n_records = min(check.integer(n_records, "n_records", minimum=1), steps)
    record_every = max(1, steps // n_records)
    embedding_seed, run_seed = seeding.spawn(seed, 2)
    # Orthonormal embeddings: by (5.2) gradient steps on W are steps on Θ in the metric (EEᵀ)⊗(EEᵀ), so a random
    # Gaussian E with a small singular value (common at d close to K) leaves some logits almost untrained.
    E = random_embeddings(problem.K, d, seed=embedding_seed, orthonormal=True)
    W, average, losses, failed = _adam_loop(E, np.zeros((d, d)), np.ascontiguousarray(problem.P), problem.L, steps,
                                            batch, lr, 0.9, 0.999, 1e-8, int(average_from * steps),
                                            problem.query == "exclude", record_every, seeding.kernel_seed(run_seed))
    if failed >= 0:
        raise DivergenceError(f"Adam on W diverged at step {failed}: non-finite loss or gradient")
    P_hat = cf.chain_from_logits(attention_logits(E, average))
    times = record_every * np.arange(1, losses.size + 1, dtype=float)
    return Trajectory(times=times, metrics=dict(nll=losses), final=dict(W=W, W_average=average, E=E, P_hat=P_hat),
                      info=dict(samples=steps * batch, d=d, lr=lr))


# ---------------------------------------------------------------------------------------------------------------
# Generated trajectories as count vectors (§6)
# ---------------------------------------------------------------------------------------------------------------

@njit(cache=True)
def _count_runs(P, m0, a0, runs, record_steps, level_token, levels, exclude, kernel_seed):
    """One kernel for both recording modes: at fixed steps (level_token < 0) or when m_{level_token} first
    reaches each level. Records counts (runs, n_rec, K), the observed Fisher diagonal Σ_t p_k(1 − p_k)
    (runs, n_rec, K) and the step (runs, n_rec)."""
    np.random.seed(kernel_seed)
    K = m0.size
    by_level = level_token >= 0
    n_rec = levels.size if by_level else record_steps.size
    last_step = record_steps[-1] if not by_level else -1
    counts_out = np.zeros((runs, n_rec, K), dtype=np.int64)
    fisher_out = np.zeros((runs, n_rec, K))
    step_out = np.zeros((runs, n_rec), dtype=np.int64)
    w = np.empty(K)
    m = np.empty(K, dtype=np.int64)
    fisher = np.empty(K)
    for r in range(runs):
        for k in range(K):
            m[k] = m0[k]
            fisher[k] = 0.0
        a = a0
        j = 0
        t = 0
        while j < n_rec:
            while j < n_rec and (m[level_token] >= levels[j] if by_level else record_steps[j] == t):
                for k in range(K):
                    counts_out[r, j, k] = m[k]
                    fisher_out[r, j, k] = fisher[k]
                step_out[r, j] = t
                j += 1
            if j >= n_rec or (not by_level and t >= last_step):
                break
            total = 0.0
            for k in range(K):
                keys = m[k] - 1 if (exclude and k == a) else m[k]
                w[k] = keys * P[a, k]
                total += w[k]
            for k in range(K):
                p = w[k] / total
                fisher[k] += p * (1.0 - p)
            y = _categorical(w, total)
            m[y] += 1
            a = y
            t += 1
    return counts_out, fisher_out, step_out


def generate_counts(P, X0, *, seed, runs: int, record_steps=None, level_token: int | None = None, levels=None,
                    query: str = "self") -> dict:
    """Many generated trajectories from the prompt X0 under the CCMC with base chain P, as count vectors (§6).

    Records either at the steps ``record_steps`` (sorted, >= 0) or, with ``level_token``, when that token's count
    first reaches each of ``levels`` (a stopping time; the run continues until the last level). Returns a dict of
    ``counts`` (runs, n_rec, K), ``fisher`` (runs, n_rec, K) — the observed Fisher information Σ_t p_{t,k}(1 − p_{t,k})
    of each column, summed over rows — and ``steps`` (runs, n_rec)."""
    P = cf.check_chain(P)
    K = P.shape[0]
    X0 = cf.check_prompts(X0, K, "X0", query=query)[0]
    runs = check_count(runs, "runs", MAX_RUNS)
    m0 = np.bincount(X0, minlength=K).astype(np.int64)
    if level_token is None:
        if record_steps is None:
            raise ValueError("give record_steps or level_token with levels")
        record_steps = np.asarray(record_steps, dtype=np.int64)
        if record_steps.ndim != 1 or record_steps.size == 0 or record_steps.min() < 0 or \
                np.any(np.diff(record_steps) <= 0):
            raise ValueError("record_steps must be a non-empty increasing list of steps >= 0")
        if runs * int(record_steps[-1]) > 20 * MAX_DRAWS:
            raise ValueError(f"runs × steps must be <= {20 * MAX_DRAWS}")
        n_rec, token, level_array = record_steps.size, -1, np.zeros(1, dtype=np.int64)
    else:
        token = check.integer(level_token, "level_token", minimum=0)
        if token >= K or m0[token] == 0:
            raise ValueError("level_token must be a token of X0 (a token absent from X0 never appears, §6.1)")
        level_array = np.asarray(levels, dtype=np.int64)
        if level_array.ndim != 1 or level_array.size == 0 or np.any(np.diff(level_array) <= 0):
            raise ValueError("levels must be a non-empty increasing list of counts")
        if runs * int(level_array[-1]) > 20 * MAX_DRAWS:
            raise ValueError(f"runs × levels[-1] must be <= {20 * MAX_DRAWS}")
        n_rec, record_steps = level_array.size, np.zeros(1, dtype=np.int64)
    if runs * n_rec * K > MAX_DRAWS:
        raise ValueError(f"runs × records × K must be <= {MAX_DRAWS}")
    counts, fisher, steps = _count_runs(np.ascontiguousarray(P), m0, int(X0[-1]), runs, record_steps, token,
                                        level_array, query == "exclude", seeding.kernel_seed(seed))
    return dict(counts=counts, fisher=fisher, steps=steps)


@njit(cache=True)
def fluid_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """The DOPRI5 loop bound to the fluid limit of §6.5, for compiled callers; :func:`fluid_trajectory` calls
    ``solve_dopri5(cf.fluid_rhs_into, ...)``, which shares one cached loop among all systems (DESIGN.md)."""
    return dopri5_loop(cf.fluid_rhs_into, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def fluid_trajectory(P, f0, taus, *, rtol: float = 1e-9, atol: float = 1e-12):
    """The fluid limit df/dτ = π(f) − f (§6.5) from the shares f0 at the times τ (sorted, from 0): (n_τ, K)."""
    P = cf.check_chain(P)
    f0 = check.finite_array(f0, "f0", shape=(P.shape[0],))
    if np.any(f0 < 0) or abs(f0.sum() - 1) > 1e-8:
        raise ValueError("f0 must be a probability vector")
    solution = solve_dopri5(cf.fluid_rhs_into, f0, taus, cf.pack_fluid_params(P), t0=0.0, rtol=rtol, atol=atol)
    return solution.y


# ---------------------------------------------------------------------------------------------------------------
# The System contract
# ---------------------------------------------------------------------------------------------------------------

def _log_steps(steps: int, n_records: int) -> np.ndarray:
    return log_grid(steps, n_records - 1)


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("steps", "integer", 100_000, "generated tokens t at the end", minimum=1, maximum=100_000_000),
    Parameter("n_records", "integer", 60, "recorded times (log-spaced)", minimum=3, maximum=MAX_RECORDS),
)
MINIBATCH_OPTIONS = (
    Parameter("steps", "integer", 100_000, "generated tokens per run", minimum=1, maximum=10_000_000),
    Parameter("runs", "integer", 50, "independent generated trajectories", minimum=1, maximum=MAX_RUNS),
    Parameter("n_records", "integer", 60, "recorded times (log-spaced)", minimum=3, maximum=MAX_RECORDS),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: CCMCProblem, *, steps: int, n_records: int) -> Trajectory:
    """The theory side of a generated trajectory: the fluid limit of §6.5 from the shares of X0, in τ = log(t/L₀ + 1)
    and reported at the generated-token counts t. Metrics: each token's share, the number of tokens with share
    above 1%, and the largest invasion rate among tokens with share below 1% (< 1: none can come back)."""
    steps, n_records = check_run_length(steps, n_records, min_records=3, max_steps=100_000_000)
    t = _log_steps(steps, n_records).astype(float)
    L0 = len(problem.X0)
    f0 = problem.initial_counts / L0
    shares = fluid_trajectory(problem.P, f0, np.log1p(t / L0))
    metrics = {f"share_{k}": shares[:, k] for k in range(problem.K)}
    metrics["tokens_above_1pct"] = (shares > 0.01).sum(axis=1).astype(float)
    return Trajectory(times=t, states=dict(shares=shares), metrics=metrics,
                      info=dict(initial_shares=f0, tau=np.log1p(t / L0)))


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: CCMCProblem, *, seed, steps: int, runs: int,
              n_records: int) -> Trajectory:
    """Generation by the CCMC from X0 (the model sampling its own growing context, §6), ``runs`` trajectories as
    count vectors. Metrics: the run-mean share of each token, the run-mean number of tokens with share above
    1%, and the run-mean largest share. ``states['shares']`` holds every run (n_t, runs, K)."""
    steps, n_records = check_run_length(steps, n_records, min_records=3)
    runs = check_count(runs, "runs", MAX_RUNS)
    record = _log_steps(steps, n_records)
    result = generate_counts(problem.P, problem.X0, seed=seed, runs=runs, record_steps=record, query=problem.query)
    counts = result["counts"]
    shares = counts / counts.sum(axis=2, keepdims=True)
    metrics = {f"share_{k}": shares[:, :, k].mean(axis=0) for k in range(problem.K)}
    metrics["tokens_above_1pct"] = (shares > 0.01).sum(axis=2).mean(axis=0).astype(float)
    metrics["largest_share"] = shares.max(axis=2).mean(axis=0)
    return Trajectory(times=record.astype(float), states=dict(shares=np.transpose(shares, (1, 0, 2))),
                      metrics=metrics, info=dict(runs=runs))
