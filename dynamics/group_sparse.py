"""Group-sparse classification: full-model GD on Monte-Carlo samples, and the position-only (β, α) map.

Full model (docs/group_sparse.md §2): v ∈ R^{d+D}, W ∈ R^{(d+D)×(d+D)}, tokens h_j = [x_j; e_j]. Per sample (docs/group_sparse.md §5):
u_k = vᵀh_k, S_{kj} = softmax_k(h_kᵀWh_j), c_k = Σ_j S_{kj}, f = Σ_k c_k u_k, q = −yσ(−yf),
∇_v l = q Σ_k c_k h_k, ∇_W l = Σ_{k,j} A_{kj} h_k h_jᵀ with A_{kj} = q S_{kj}(u_k − ū_j), ū_j = Σ_m S_{mj}u_m.
``symmetrise`` adds the sign-flipped copy (−X, −y) of every sample, which makes v₂ = 0, W₁₂ = W₂₁ = 0 and the
W₂₂ column sums hold to round-off (docs/group_sparse.md §5).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from attnflow.closed_forms import group_sparse as cf
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.group_sparse import GroupSparseProblem

from .integrate import DivergenceError, iterate_map, solve_dopri5
from attnflow.seeding import SeedLike, as_seed_sequence
from attnflow.closed_forms.parameters import Parameter, takes_options

from .montecarlo import MAX_RECORDS, Trajectory, check_count, check_run_length, log_grid

__all__ = ["sample_downstream", "fine_tune", "transformer_error", "logistic_regression", "linear_error", "POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "sample_data", "loss_and_gradient", "full_gd_trajectory", "position_only_trajectory", "position_only_flow", "attention_on_star",
           "attention_matrix", "population", "minibatch"]


def sample_data(problem: GroupSparseProblem, n: int, rng: np.random.Generator, *, symmetrise: bool = False):
    """X (n, d, D) with i.i.d. N(0, σ_x²) entries and y = sign(<x_{j*}, v*>) ∈ {±1}; with ``symmetrise`` the
    sign-flipped copies (−X, −y) are appended (2n samples)."""
    n = check_count(n, "n")
    symmetrise = _flag(symmetrise, "symmetrise")
    X = problem.sigma_x * rng.standard_normal((n, problem.d, problem.D))
    y = np.where(X[:, :, problem.star] @ problem.v_star >= 0, 1.0, -1.0)
    if symmetrise:
        X, y = np.concatenate([X, -X]), np.concatenate([y, -y])
    return X, y


@njit(cache=True)
def _attention_scores(x, W, S):
    """S (key k, query j) = softmax_k(h_kᵀWh_j) for one sample x (d, D), with h_j = [x_j; e_j], into ``S``.

    Loops over the token structure (Wh_j = W[:, :d]x_j + W[:, d + j]) instead of matrix products: the sizes are
    small, and loops compile in a fraction of the time of numba's matmul variants."""
    d, D = x.shape
    Wh = np.empty(d + D)
    for j in range(D):
        for p in range(d + D):
            acc = W[p, d + j]
            for q in range(d):
                acc += W[p, q] * x[q, j]
            Wh[p] = acc
        top = -np.inf
        for k in range(D):
            z = Wh[d + k]
            for p in range(d):
                z += x[p, k] * Wh[p]
            S[k, j] = z
            top = max(top, z)
        total = 0.0
        for k in range(D):
            S[k, j] = math.exp(S[k, j] - top)
            total += S[k, j]
        for k in range(D):
            S[k, j] /= total


@njit(cache=True)
def _accumulate_sample(x, y, v, W, position_only, S, grad_v, grad_W):
    """Adds ∇_v l and ∇_W l of one sample to ``grad_v``, ``grad_W`` (only the W₂₂ block when ``position_only``)
    and returns its loss (docs/group_sparse.md §5); ``S`` is scratch (D, D)."""
    d, D = x.shape
    _attention_scores(x, W, S)
    u = np.empty(D)  # u_k = vᵀh_k
    c = np.zeros(D)  # c_k = Σ_j S_kj
    for k in range(D):
        acc = v[d + k]
        for p in range(d):
            acc += v[p] * x[p, k]
        u[k] = acc
        for j in range(D):
            c[k] += S[k, j]
    f = 0.0
    for k in range(D):
        f += c[k] * u[k]
    margin = y * f
    loss = math.log1p(math.exp(-margin)) if margin > 0 else -margin + math.log1p(math.exp(margin))  # log(1 + e^{−yf})
    # −y·σ(−margin); e^{margin} overflows past 709 (an OverflowError without numba), where σ(−m) = e^{−m} to round-off
    if margin >= 700:
        q = -y * math.exp(-margin)
    else:
        q = -y / (1.0 + math.exp(margin)) if margin > -700 else -y
    for k in range(D):  # ∇_v l = q Σ_k c_k h_k
        grad_v[d + k] += q * c[k]
        for p in range(d):
            grad_v[p] += q * c[k] * x[p, k]
    A = np.empty((D, D))  # A_kj = q S_kj (u_k − ū_j), ū_j = Σ_m S_mj u_m
    for j in range(D):
        u_bar = 0.0
        for m in range(D):
            u_bar += S[m, j] * u[m]
        for k in range(D):
            A[k, j] = q * S[k, j] * (u[k] - u_bar)
    for k in range(D):  # ∇_W l = Σ_kj A_kj h_k h_jᵀ: the W₂₂ block is A itself (h_k's position part is e_k)
        for j in range(D):
            grad_W[d + k, d + j] += A[k, j]
    if not position_only:
        xA = np.zeros((d, D))  # x A: the W₁₂ block, and x A xᵀ the W₁₁ block
        for p in range(d):
            for j in range(D):
                acc = 0.0
                for k in range(D):
                    acc += x[p, k] * A[k, j]
                xA[p, j] = acc
                grad_W[p, d + j] += acc
        for k in range(D):  # A xᵀ: the W₂₁ block
            for p in range(d):
                acc = 0.0
                for j in range(D):
                    acc += A[k, j] * x[p, j]
                grad_W[d + k, p] += acc
        for p in range(d):
            for r in range(d):
                acc = 0.0
                for j in range(D):
                    acc += xA[p, j] * x[r, j]
                grad_W[p, r] += acc
    return loss


@njit(cache=True)
def _batch_terms(X, y, v, W, position_only):
    """Mean loss, ∇_v and ∇_W over the samples."""
    n, d, D = X.shape
    loss = 0.0
    grad_v = np.zeros(d + D)
    grad_W = np.zeros((d + D, d + D))
    S = np.empty((D, D))
    for i in range(n):
        loss += _accumulate_sample(X[i], y[i], v, W, position_only, S, grad_v, grad_W)
    for p in range(d + D):  # loops, not grad / n: array expressions compile several times slower
        grad_v[p] /= n
        for r in range(d + D):
            grad_W[p, r] /= n
    return loss / n, grad_v, grad_W


def _writable(array: np.ndarray) -> np.ndarray:
    """A C-contiguous writable copy: every kernel then sees one array type (numba compiles read-only arrays, which
    ``check.finite_array`` returns, as a separate signature)."""
    return np.array(array, dtype=np.float64, order="C")


def _check_samples(X, y=None, groups: tuple | None = None):
    """X (n, d, D) finite, optionally of the given (d, D), and labels y ∈ {±1}ⁿ: contiguous writable copies."""
    X = _writable(check.finite_array(X, "X", ndim=3))
    if groups is not None and X.shape[1:] != tuple(groups):
        raise ValueError(f"X must have shape (n, {groups[0]}, {groups[1]}), got {X.shape}")
    if y is None:
        return X
    y = _writable(check.finite_array(y, "y", shape=(X.shape[0],)))
    if not np.all(np.abs(y) == 1):
        raise ValueError("y must hold labels ±1")
    return X, y


def _check_weights(v, W, n_tokens: int):
    return (_writable(check.finite_array(v, "v", shape=(n_tokens,))),
            _writable(check.finite_array(W, "W", shape=(n_tokens, n_tokens))))


def loss_and_gradient(problem: GroupSparseProblem, X, y, v, W, *, position_only: bool = False):
    """Mean loss and gradient (∇_v, ∇_W) of the raw model over the samples (X, y)."""
    v, W = _check_weights(v, W, problem.d + problem.D)
    X, y = _check_samples(X, y, (problem.d, problem.D))
    return _batch_terms(X, y, v, W, _flag(position_only, "position_only"))


@njit(cache=True)
def _mean_attention(X, W):
    """Mean over samples of the attention matrix S (key k, query j)."""
    n, d, D = X.shape
    mean = np.zeros((D, D))
    S = np.empty((D, D))
    for i in range(n):
        _attention_scores(X[i], W, S)
        for k in range(D):
            for j in range(D):
                mean[k, j] += S[k, j]
    for k in range(D):
        for j in range(D):
            mean[k, j] /= n
    return mean


def attention_matrix(problem: GroupSparseProblem, X, W) -> np.ndarray:
    """The attention map S (rows: keys, columns: queries) averaged over the samples X (the paper's heat-map)."""
    W = _writable(check.finite_array(W, "W", shape=(problem.d + problem.D,) * 2))
    return _mean_attention(_check_samples(X, groups=(problem.d, problem.D)), W)


def attention_on_star(problem: GroupSparseProblem, X, W) -> float:
    """Mean attention S_{j*, j} over samples and queries (the bright row of the paper's attention map)."""
    return float(attention_matrix(problem, X, W)[problem.star].mean())


def _flag(value, name: str) -> bool:
    """A true/false option: a bool (numpy's included), refused otherwise (NaN is not a truth value)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def full_gd_trajectory(problem: GroupSparseProblem, eta: float, steps: int, *, batch_size: int, seed: SeedLike,
                       fresh: bool = True, symmetrise: bool = True, position_only: bool = False,
                       n_records: int = 30, n_eval: int = 2000) -> Trajectory:
    """GD on (v, W) from zero with Monte-Carlo samples: a fresh batch every step (``fresh``: stochastic
    approximation of population GD) or one fixed training set of ``batch_size`` samples (the paper's finite-n
    runs). ``position_only`` trains v and W₂₂ only (docs/group_sparse.md §6's sub-model).

    Records at ``n_records`` log-spaced steps: β = <v₁, v*>, cos(v₁, v*), the training loss, the mean attention on
    j* over a held-out set of ``n_eval`` samples, and the symmetry residuals of docs/group_sparse.md §5.
    """
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    steps, n_records = check_run_length(steps, n_records, min_records=2)
    batch_size = check_count(batch_size, "batch_size")
    fresh = _flag(fresh, "fresh")
    position_only = _flag(position_only, "position_only")
    root = as_seed_sequence(seed)
    data_seed, eval_seed = root.spawn(2)
    rng = np.random.default_rng(data_seed)
    X_eval, _ = sample_data(problem, check.integer(n_eval, "n_eval", minimum=1), np.random.default_rng(eval_seed))
    d, D = problem.d, problem.D
    v = np.zeros(d + D)
    W = np.zeros((d + D, d + D))
    record = set(log_grid(steps, n_records).tolist())
    if not fresh:
        X, y = sample_data(problem, batch_size, rng, symmetrise=symmetrise)
    rows = []
    for t in range(steps + 1):
        if fresh:
            X, y = sample_data(problem, batch_size, rng, symmetrise=symmetrise)
        loss, grad_v, grad_W = _batch_terms(X, y, v, W, bool(position_only))
        if t in record:
            coords = cf.symmetric_coordinates(problem, v, W)
            norm = float(np.linalg.norm(v[:d]))
            rows.append(dict(step=t, loss=loss, cos=float(v[:d] @ problem.v_star / norm) if norm > 0 else 0.0,
                             attention=attention_on_star(problem, X_eval, W), v=v.copy(), W=W.copy(), **coords))
        if t == steps:
            break
        v = v - eta * grad_v
        W = W - eta * grad_W
        if not (np.all(np.isfinite(v)) and np.all(np.isfinite(W))):
            raise DivergenceError(f"full GD diverged at step {t + 1}: non-finite weights")
    names = [k for k in rows[0] if k not in ("step", "v", "W")]
    return Trajectory(times=np.array([r["step"] for r in rows], float),
                      states=dict(v=np.array([r["v"] for r in rows]), W=np.array([r["W"] for r in rows])),
                      metrics={k: np.array([r[k] for r in rows]) for k in names},
                      info=dict(eta=eta, batch_size=batch_size, fresh=fresh, symmetrise=symmetrise,
                                position_only=position_only))


def position_only_trajectory(problem: GroupSparseProblem, eta: float, steps: int, *, n_records: int = 60,
                             record_steps=None) -> Trajectory:
    """The (β, α) map of docs/group_sparse.md §6 from (0, 0) through the integrator engine; records β, α, s*, L."""
    steps, n_records = check_run_length(steps, n_records, min_records=2)
    record = log_grid(steps, n_records) if record_steps is None else np.asarray(record_steps, int)
    sol = iterate_map(cf.position_only_step, [0.0, 0.0], steps, cf.pack_position_only_params(problem, eta),
                      record_steps=record)
    beta, alpha = sol.y[:, 0], sol.y[:, 1]
    loss = cf.position_only_loss(problem, beta, alpha)
    s_star = np.array([cf.attention_weights(a, problem.D)[0] for a in alpha])
    return Trajectory(times=sol.t, states=dict(beta=beta, alpha=alpha), metrics=dict(loss=loss, s_star=s_star),
                      info=dict(eta=eta))


def position_only_flow(problem: GroupSparseProblem, times, *, rtol: float = 1e-8, atol: float = 1e-12) -> Trajectory:
    """The gradient flow of the (β, α) sub-model from (0, 0) in τ = η·steps (adaptive Dormand–Prince,
    docs/group_sparse.md §6); at late times its steps grow with τ, so τ = 10⁶ costs ~10³ evaluations where the map
    needs 10⁶. Records β, α and the loss at ``times``."""
    times = np.array(check.finite_array(times, "times", ndim=1))  # writable: one array type for the compiled loop
    sol = solve_dopri5(cf.position_only_flow_rhs_into, [0.0, 0.0], times, cf.pack_position_only_params(problem, 1.0),
                       t0=0.0, rtol=rtol, atol=atol)  # the shared loop, compiled once for every system
    beta, alpha = sol.y[:, 0], sol.y[:, 1]
    loss = cf.position_only_loss(problem, beta, alpha)
    return Trajectory(times=sol.t, states=dict(beta=beta, alpha=alpha), metrics=dict(loss=loss),
                      info=dict(n_rhs_evals=sol.n_rhs_evals))


# ==================================================================================================
# Downstream fine-tuning (docs/group_sparse.md §4)
# ==================================================================================================


def sample_downstream(problem: GroupSparseProblem, u_star, gamma: float, n: int, rng: np.random.Generator):
    """Downstream data (docs/group_sparse.md §4): x_j ~ N(0, σ_x²I_d), except that the relevant group's component along u* is
    drawn from N(0, σ_x²) conditioned on |t| >= γ; the label is sign(t), so y<u*, x_{j*}> >= γ almost surely."""
    from scipy.special import ndtr, ndtri

    u = check.finite_array(u_star, "u_star", shape=(problem.d,))
    if np.linalg.norm(u) == 0:
        raise ValueError("u_star must be non-zero")
    u = u / np.linalg.norm(u)
    gamma = check.real(gamma, "gamma", minimum=0.0)
    n = check_count(n, "n")
    X = problem.sigma_x * rng.standard_normal((n, problem.d, problem.D))
    t_old = X[:, :, problem.star] @ u
    tail = ndtr(gamma / problem.sigma_x)
    magnitude = problem.sigma_x * ndtri(tail + rng.random(n) * (1 - tail))  # |t| from the truncated half-normal
    t_new = np.where(rng.random(n) < 0.5, -1.0, 1.0) * magnitude
    X[:, :, problem.star] += np.outer(t_new - t_old, u)
    return X, np.sign(t_new)


@njit(cache=True)
def _predict(X, v, W):
    """f = Σ_j vᵀH softmax(HᵀWh_j) = Σ_k c_k u_k for every sample."""
    n, d, D = X.shape
    f = np.empty(n)
    S = np.empty((D, D))
    for i in range(n):
        _attention_scores(X[i], W, S)
        total = 0.0
        for k in range(D):
            u = v[d + k]
            for p in range(d):
                u += v[p] * X[i, p, k]
            for j in range(D):
                total += S[k, j] * u
        f[i] = total
    return f


@njit(cache=True)
def _online_sgd(X, y, v, W, eta, train_W):
    n, d, D = X.shape
    S = np.empty((D, D))
    grad_v = np.empty(d + D)
    grad_W = np.empty((d + D, d + D))
    for i in range(n):
        for p in range(d + D):
            grad_v[p] = 0.0
            for r in range(d + D):
                grad_W[p, r] = 0.0
        _accumulate_sample(X[i], y[i], v, W, not train_W, S, grad_v, grad_W)  # W₂₂ block only when W stays
        for p in range(d + D):
            v[p] -= eta * grad_v[p]
        if train_W:
            for p in range(d + D):
                for r in range(d + D):
                    W[p, r] -= eta * grad_W[p, r]
    return v, W


def fine_tune(problem: GroupSparseProblem, W_pretrained, X, y, eta: float = 1.0, *, train_W: bool = False):
    """One pass of online SGD over (X, y) from v = 0 and the pre-trained W (docs/group_sparse.md §4); returns (v, W).

    Which parameters the paper fine-tunes is unverified. We train v alone by default: the model is then linear in
    its d + D parameters, the count in the theorem's O((d + D)/n) bound. ``train_W=True`` also moves W; with a
    constant step that destabilises the pre-trained selection as n grows (η = 0.1: test error 0.01 at n = 64 but
    0.19 at n = 256, d = 4, D = 8; η = 1: 0.48), so it is not the default.
    """
    train_W = _flag(train_W, "train_W")
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    W = check.finite_array(W_pretrained, "W_pretrained", shape=(problem.d + problem.D,) * 2).copy()
    X, y = _check_samples(X, y, (problem.d, problem.D))
    v, W = _online_sgd(X, y, np.zeros(problem.d + problem.D), W, eta, bool(train_W))
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(W))):
        raise DivergenceError("fine-tuning diverged: non-finite weights after online SGD")
    return v, W


def transformer_error(X, y, v, W) -> float:
    """Test error P(y f <= 0) of the transformer (v, W) on (X, y)."""
    X, y = _check_samples(X, y)
    v, W = _check_weights(v, W, X.shape[1] + X.shape[2])
    return float(np.mean(y * _predict(X, v, W) <= 0))


def logistic_regression(X, y, ridge: float = 1e-4) -> np.ndarray:
    """The baseline: ridge-regularised logistic regression on vec(X) ∈ R^{dD} (no intercept: the data are
    sign-symmetric), fitted to convergence by L-BFGS."""
    from scipy.optimize import minimize

    X, y = _check_samples(X, y)
    Z = X.reshape(len(X), -1) * y[:, None]
    ridge = check.real(ridge, "ridge", minimum=0.0, strict=True)

    def objective(w):
        m = Z @ w
        loss = np.mean(np.logaddexp(0.0, -m)) + 0.5 * ridge * w @ w
        grad = -(Z.T @ (0.5 * (1 - np.tanh(0.5 * m)))) / len(m) + ridge * w
        return loss, grad

    return minimize(objective, np.zeros(Z.shape[1]), jac=True, method="L-BFGS-B").x


def linear_error(X, y, w) -> float:
    """Test error of the linear classifier sign(<w, vec(X)>)."""
    X, y = _check_samples(X, y)
    w = check.finite_array(w, "w", shape=(X.shape[1] * X.shape[2],))
    return float(np.mean(y * (X.reshape(len(X), -1) @ w) <= 0))


# ==================================================================================================
# The System contract: population(problem, **options) and minibatch(problem, *, seed, **options)
# ==================================================================================================


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("eta", "real", 1.0, "GD step size η", minimum=0.0, strict=True),
    Parameter("steps", "integer", 6000, "steps of the (β, α) map", minimum=1, maximum=100_000_000),
    Parameter("n_records", "integer", 60, "recorded steps (log-spaced)", minimum=2, maximum=MAX_RECORDS),
)
MINIBATCH_OPTIONS = (
    Parameter("eta", "real", 1.0, "GD step size η", minimum=0.0, strict=True),
    Parameter("steps", "integer", 20, "GD steps", minimum=1, maximum=10_000_000),
    Parameter("batch_size", "integer", 3000, "fresh samples per step", minimum=1, maximum=10_000_000),
    Parameter("position_only", "boolean", False, "train v and W₂₂ only (the sub-model)"),
    Parameter("n_records", "integer", 30, "recorded steps (log-spaced)", minimum=2, maximum=MAX_RECORDS),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: GroupSparseProblem, *, eta: float, steps: int, n_records: int) -> Trajectory:
    """The position-only (β, α) map of docs/group_sparse.md §6 from (0, 0): :func:`position_only_trajectory`."""
    return position_only_trajectory(problem, eta, steps, n_records=n_records)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: GroupSparseProblem, *, seed: SeedLike, eta: float, steps: int,
              batch_size: int, position_only: bool, n_records: int) -> Trajectory:
    """GD on (v, W) with a fresh symmetrised batch per step: :func:`full_gd_trajectory`."""
    return full_gd_trajectory(problem, eta, steps, batch_size=batch_size, seed=seed, position_only=position_only,
                              n_records=n_records)
