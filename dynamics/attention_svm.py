"""Training one-layer attention on a finite data set, and its regularisation path (docs/attention_svm.md).

The papers' algorithms run on the whole finite data set at every step (there is no sampling: the only randomness
is the initialisation and the random instance), so ``minibatch`` here is full-batch training, one step per
epoch. Every kernel uses the log-scaled gradient of :func:`attnflow.closed_forms.attention_svm.log_scaled_logit_gradient`
(§2.3 of the docs), so normalised steps stay exact at any ||θ||.

* :func:`train` — GD (``gd``) or normalised GD (``ngd``) on θ = p or vec(W) (§2.4);
* :func:`train_kq` — (K, Q) with W = K Q^T, each factor's gradient normalised (``kq``) or both jointly
  (``kq_joint``);
* :func:`train_relu_head` — normalised GD on W with the nonlinear head ``1^T ReLU(V^T X^T s)`` (§7.7);
* :func:`train_joint` — joint (v, p) training of the prompt model, each gradient normalised;
* :func:`regularisation_path` — θ_R = argmin_{||θ|| ≤ R} L(θ) (Theorem T1 of §5), the theory side.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from scipy import optimize

from attnflow import seeding
from attnflow.closed_forms import attention_svm as cf
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.attention_svm import AttentionSVMProblem, log_scaled_logit_gradient
from attnflow.closed_forms.softmax import max_propagating_nan
from attnflow.closed_forms.parameters import Parameter, takes_options

from .errors import DivergenceError
from .montecarlo import MAX_RECORDS, MAX_STEPS, Trajectory, log_spaced_steps

__all__ = ["MAX_ETA", "POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "ALGORITHMS", "record_steps", "train", "train_kq", "train_joint", "train_relu_head", "initial_theta", "regularisation_path",
           "population", "minibatch", "MAX_STEPS"]

ALGORITHMS = ("ngd", "gd", "kq", "kq_joint", "joint")


def record_steps(steps: int, records: int = 60) -> np.ndarray:
    """About ``records`` log-spaced steps in [0, steps] (always 0 and ``steps``)."""
    return log_spaced_steps(steps, records)


# The kernels spell out copies, norms, softmaxes and vector updates as scalar loops, in the order of numba's array
# API (so the numbers are the same bit for bit): numba compiles array expressions and numpy calls several times more
# slowly. The matrix products stay BLAS calls (a loop would round differently), written np.dot(A, B, out): ``A @ B``
# is that same call on a fresh ``out``, but compiles about three times more slowly.


@njit(cache=True)
def _linear_kernel(phi, a, Y, loss_code, theta0, eta, steps, normalise, record):
    n, T, P = phi.shape
    R = record.size
    thetas = np.empty((R, P))
    norms = np.empty(R)
    unsats = np.empty(R)
    losses = np.empty(R)
    theta = np.empty(P)
    for q in range(P):
        theta[q] = theta0[q]
    logit = np.empty((n, T))
    g = np.empty(P)
    r = 0
    for k in range(steps + 1):
        for i in range(n):
            for t in range(T):
                s = 0.0
                for q in range(P):
                    s += phi[i, t, q] * theta[q]
                logit[i, t] = s
        D, c, loss, _, unsat = log_scaled_logit_gradient(logit, a, Y, loss_code)
        if r < R and record[r] == k:
            s = 0.0
            for q in range(P):
                thetas[r, q] = theta[q]
                s += theta[q] * theta[q]
            norms[r] = np.sqrt(s)
            unsats[r] = unsat
            losses[r] = loss
            r += 1
        if k == steps:
            break
        for q in range(P):
            g[q] = 0.0
        for i in range(n):
            for t in range(T):
                if D[i, t] != 0.0:
                    for q in range(P):
                        g[q] += D[i, t] * phi[i, t, q]
        if normalise:
            s = 0.0
            for q in range(P):
                s += g[q] * g[q]
            gn = np.sqrt(s)
            if gn == 0.0:
                return thetas, norms, unsats, losses, 2, k
            for q in range(P):
                theta[q] -= eta * g[q] / gn
        else:
            scale = eta * np.exp(c)
            for q in range(P):
                theta[q] -= scale * g[q]
        for q in range(P):
            if not np.isfinite(theta[q]):
                return thetas, norms, unsats, losses, 1, k + 1
    return thetas, norms, unsats, losses, 0, steps


@njit(cache=True)
def _kq_kernel(X, Z, a, Y, loss_code, K0, Q0, eta, steps, joint, record):
    n, T, d = X.shape
    m = K0.shape[1]
    R = record.size
    Ws = np.empty((R, d, d))
    knorm = np.empty(R)
    qnorm = np.empty(R)
    unsats = np.empty(R)
    losses = np.empty(R)
    K = np.empty((d, m))
    Q = np.empty((d, m))
    for p in range(d):
        for q in range(m):
            K[p, q] = K0[p, q]
            Q[p, q] = Q0[p, q]
    W = np.empty((d, d))
    Wz = np.empty(d)
    logit = np.empty((n, T))
    G = np.empty((d, d))
    xd = np.empty(d)
    gK = np.empty((d, m))
    gQ = np.empty((d, m))
    r = 0
    for k in range(steps + 1):
        np.dot(K, Q.T, W)  # W = K Q^T
        for i in range(n):
            np.dot(W, Z[i], Wz)
            for t in range(T):
                s = 0.0
                for q in range(d):
                    s += X[i, t, q] * Wz[q]
                logit[i, t] = s
        D, c, loss, _, unsat = log_scaled_logit_gradient(logit, a, Y, loss_code)
        if r < R and record[r] == k:
            for p in range(d):
                for q in range(d):
                    Ws[r, p, q] = W[p, q]
            sK = 0.0
            sQ = 0.0
            for p in range(d):
                for q in range(m):
                    sK += K[p, q] * K[p, q]
                    sQ += Q[p, q] * Q[p, q]
            knorm[r] = np.sqrt(sK)
            qnorm[r] = np.sqrt(sQ)
            unsats[r] = unsat
            losses[r] = loss
            r += 1
        if k == steps:
            break
        # ∇_W L up to the factor e^c: G = Σ_i (X_i^T D_i) z_i^T
        for p in range(d):
            for q in range(d):
                G[p, q] = 0.0
        for i in range(n):
            np.dot(X[i].T, D[i], xd)
            for p in range(d):
                for q in range(d):
                    G[p, q] += xd[p] * Z[i, q]
        np.dot(G, Q, gK)
        np.dot(G.T, K, gQ)
        sK = 0.0
        sQ = 0.0
        for p in range(d):
            for q in range(m):
                sK += gK[p, q] * gK[p, q]
        for p in range(d):
            for q in range(m):
                sQ += gQ[p, q] * gQ[p, q]
        nK = np.sqrt(sK)
        nQ = np.sqrt(sQ)
        if joint:
            both = np.sqrt(nK * nK + nQ * nQ)
            if both == 0.0:
                return Ws, knorm, qnorm, unsats, losses, 2, k
            for p in range(d):
                for q in range(m):
                    K[p, q] -= eta * gK[p, q] / both
                    Q[p, q] -= eta * gQ[p, q] / both
        else:
            if nK > 0.0:
                for p in range(d):
                    for q in range(m):
                        K[p, q] -= eta * gK[p, q] / nK
            if nQ > 0.0:
                for p in range(d):
                    for q in range(m):
                        Q[p, q] -= eta * gQ[p, q] / nQ
            if nK == 0.0 and nQ == 0.0:
                return Ws, knorm, qnorm, unsats, losses, 2, k
        for p in range(d):
            for q in range(m):
                if not (np.isfinite(K[p, q]) and np.isfinite(Q[p, q])):
                    return Ws, knorm, qnorm, unsats, losses, 1, k + 1
    return Ws, knorm, qnorm, unsats, losses, 0, steps


@njit(cache=True)
def _relu_head_kernel(X, Z, V, Y, loss_code, W0, eta, steps, record):
    # f_i = Σ_j ReLU(h_ij), h_i = V^T X_i^T s_i: df_i/ds_it = a_it = x_it^T V 1[h_i > 0], so the logit gradient is
    # that of a linear head with token values a (the ReLU's kink is taken as 0), in log scale (§2.3)
    n, T, d = X.shape
    m = V.shape[1]
    R = record.size
    Ws = np.empty((R, d, d))
    unsats = np.empty(R)
    losses = np.empty(R)
    XV = np.empty((n, T, m))
    for i in range(n):
        for t in range(T):
            np.dot(X[i, t], V, XV[i, t])
    W = np.empty((d, d))
    for p in range(d):
        for q in range(d):
            W[p, q] = W0[p, q]
    Wz = np.empty(d)
    logit = np.empty((n, T))
    a = np.empty((n, T))
    e = np.empty(T)
    h = np.empty(m)
    G = np.empty((d, d))
    xd = np.empty(d)
    r = 0
    for k in range(steps + 1):
        for i in range(n):
            np.dot(W, Z[i], Wz)
            for t in range(T):
                acc = 0.0
                for q in range(d):
                    acc += X[i, t, q] * Wz[q]
                logit[i, t] = acc
            mx = max_propagating_nan(logit[i])
            total = 0.0
            for t in range(T):
                e[t] = np.exp(logit[i, t] - mx)
                total += e[t]
            for j in range(m):
                h[j] = 0.0
            for t in range(T):
                s_t = e[t] / total
                for j in range(m):
                    h[j] += s_t * XV[i, t, j]
            for t in range(T):
                acc = 0.0
                for j in range(m):
                    if h[j] > 0.0:
                        acc += XV[i, t, j]
                a[i, t] = acc
        D, c, loss, _, unsat = log_scaled_logit_gradient(logit, a, Y, loss_code)
        if r < R and record[r] == k:
            for p in range(d):
                for q in range(d):
                    Ws[r, p, q] = W[p, q]
            unsats[r] = unsat
            losses[r] = loss
            r += 1
        if k == steps:
            break
        for p in range(d):
            for q in range(d):
                G[p, q] = 0.0
        for i in range(n):
            np.dot(X[i].T, D[i], xd)
            for p in range(d):
                for q in range(d):
                    G[p, q] += xd[p] * Z[i, q]
        sG = 0.0
        for p in range(d):
            for q in range(d):
                sG += G[p, q] * G[p, q]
        gn = np.sqrt(sG)
        if gn == 0.0:
            return Ws, unsats, losses, 2, k
        for p in range(d):
            for q in range(d):
                W[p, q] -= eta * G[p, q] / gn
        for p in range(d):
            for q in range(d):
                if not np.isfinite(W[p, q]):
                    return Ws, unsats, losses, 1, k + 1
    return Ws, unsats, losses, 0, steps


@njit(cache=True)
def _joint_kernel(X, keys, Y, loss_code, p0, v0, eta, steps, record):
    n, T, d = X.shape
    R = record.size
    ps = np.empty((R, d))
    vs = np.empty((R, d))
    unsats = np.empty(R)
    losses = np.empty(R)
    p = np.empty(d)
    v = np.empty(d)
    for q in range(d):
        p[q] = p0[q]
        v[q] = v0[q]
    logit = np.empty((n, T))
    a = np.empty((n, T))
    gp = np.empty(d)
    gv = np.empty(d)
    lw = np.empty(n)
    sm = np.empty((n, T))
    r = 0
    for k in range(steps + 1):
        for i in range(n):
            for t in range(T):
                sl = 0.0
                sa = 0.0
                for q in range(d):
                    sl += keys[i, t, q] * p[q]
                    sa += X[i, t, q] * v[q]
                logit[i, t] = sl
                a[i, t] = sa
        D, c, loss, _, unsat = log_scaled_logit_gradient(logit, a, Y, loss_code)
        if r < R and record[r] == k:
            for q in range(d):
                ps[r, q] = p[q]
                vs[r, q] = v[q]
            unsats[r] = unsat
            losses[r] = loss
            r += 1
        if k == steps:
            break
        for q in range(d):
            gp[q] = 0.0
        for i in range(n):
            for t in range(T):
                for q in range(d):
                    gp[q] += D[i, t] * keys[i, t, q]
        # ∇_v L = (1/n) Σ ℓ'(u_i) Y_i X_i^T s_i, with |ℓ'(u_i)| in log scale (§2.3)
        for i in range(n):
            m = max_propagating_nan(logit[i])
            total = 0.0
            for t in range(T):
                sm[i, t] = np.exp(logit[i, t] - m)
                total += sm[i, t]
            f = 0.0
            for t in range(T):
                sm[i, t] = sm[i, t] / total
                f += sm[i, t] * a[i, t]
            u = Y[i] * f
            if loss_code == 0:
                lw[i] = -np.logaddexp(0.0, u)
            elif loss_code == 1:
                lw[i] = 0.0
            else:
                lw[i] = -u
        cv = max_propagating_nan(lw)
        for q in range(d):
            gv[q] = 0.0
        for i in range(n):
            w = -Y[i] * np.exp(lw[i] - cv) / n
            for t in range(T):
                ws = w * sm[i, t]
                for q in range(d):
                    gv[q] += ws * X[i, t, q]
        sp = 0.0
        sv = 0.0
        for q in range(d):
            sp += gp[q] * gp[q]
            sv += gv[q] * gv[q]
        npn = np.sqrt(sp)
        nvn = np.sqrt(sv)
        if npn > 0.0:
            for q in range(d):
                p[q] -= eta * gp[q] / npn
        if nvn > 0.0:
            for q in range(d):
                v[q] -= eta * gv[q] / nvn
        if npn == 0.0 and nvn == 0.0:
            return ps, vs, unsats, losses, 2, k
        for q in range(d):
            if not (np.isfinite(p[q]) and np.isfinite(v[q])):
                return ps, vs, unsats, losses, 1, k + 1
    return ps, vs, unsats, losses, 0, steps


def _check_status(status: int, step: int, what: str) -> dict:
    if status == 1:
        raise DivergenceError(f"{what} left the finite region at step {step}")
    return dict(stopped_at=int(step), stationary=status == 2)


def _steps_eta(steps, eta, records, record):
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    if record is None:
        record = record_steps(steps, records)
    else:
        record = np.unique(np.asarray(record, dtype=np.int64))
        if record.size < 1 or record[0] < 0:
            raise ValueError("record must hold non-negative steps")
        steps = int(record[-1])
        if steps > MAX_STEPS or record.size > MAX_RECORDS:
            raise ValueError(f"record: at most {MAX_RECORDS} steps up to {MAX_STEPS}")
    return int(record[-1]), eta, record


def train(problem: AttentionSVMProblem, theta0, *, eta: float = 0.1, steps: int = 2000, normalise: bool = True,
          records: int = 60, record=None) -> Trajectory:
    """GD (θ ← θ − η∇L) or normalised GD (θ ← θ − η∇L/||∇L||) on θ = p or W (§2.4) from ``theta0``.

    The Trajectory records θ_k (``states["theta"]``, ``final["theta"]`` the last) at log-spaced k with ``norm``
    ||θ_k||, ``unsat`` max_i(1 − max_t s_it) and ``loss``. A step that leaves the finite region raises
    DivergenceError."""
    steps, eta, record = _steps_eta(steps, eta, records, record)
    theta0 = check.finite_array(theta0, "theta0", shape=problem.theta_shape())
    a = problem.X @ problem.v
    thetas, norms, unsat, loss, status, step = _linear_kernel(
        problem.features, a, cf.kernel_labels(problem), cf.LOSS_CODE[problem.loss], theta0.ravel().copy(), eta, steps,
        check.boolean(normalise, "normalise"), record)
    info = _check_status(status, step, "GD" if not normalise else "normalised GD")
    kept = record <= info["stopped_at"] if info["stationary"] else np.ones(record.size, bool)
    return Trajectory(times=record[kept].astype(float),
                      states={"theta": thetas[kept].reshape(-1, *problem.theta_shape())},
                      metrics={"norm": norms[kept], "unsat": unsat[kept], "loss": loss[kept]},
                      info=dict(info, algorithm="ngd" if normalise else "gd", eta=eta),
                      final={"theta": thetas[kept][-1].reshape(problem.theta_shape())})


def train_kq(problem: AttentionSVMProblem, K0, Q0, *, eta: float = 0.1, steps: int = 2000, joint: bool = False,
             records: int = 60, record=None) -> Trajectory:
    """(K, Q) training with W = K Q^T (§2.4): ∇_K = G Q, ∇_Q = G^T K (G = ∇_W L), each normalised separately
    (the papers' choice) or jointly. Records θ_k = vec W_k as ``states["theta"]`` (shape (d, d), the key of every
    run here, §2.1), ``norm`` ||W_k||, ``K_norm``, ``Q_norm``, ``unsat`` and ``loss``; ``final["theta"]`` is the last
    W."""
    if problem.Z is None:
        raise ValueError("problem: (K, Q) training needs the cross-attention model (Z given)")
    steps, eta, record = _steps_eta(steps, eta, records, record)
    joint = check.boolean(joint, "joint")
    d = problem.d
    K0 = check.finite_array(K0, "K0", ndim=2)
    Q0 = check.finite_array(Q0, "Q0", shape=K0.shape)
    if K0.shape[0] != d:
        raise ValueError(f"K0 must have {d} rows, got shape {K0.shape}")
    a = problem.X @ problem.v
    Ws, kn, qn, unsat, loss, status, step = _kq_kernel(
        problem.X, problem.Z, a, cf.kernel_labels(problem), cf.LOSS_CODE[problem.loss], K0.copy(), Q0.copy(), eta, steps,
        bool(joint), record)
    info = _check_status(status, step, "(K, Q) training")
    kept = record <= info["stopped_at"] if info["stationary"] else np.ones(record.size, bool)
    return Trajectory(times=record[kept].astype(float), states={"theta": Ws[kept]},
                      metrics={"norm": np.linalg.norm(Ws[kept], axis=(1, 2)), "K_norm": kn[kept],
                               "Q_norm": qn[kept], "unsat": unsat[kept], "loss": loss[kept]},
                      info=dict(info, algorithm="kq_joint" if joint else "kq", eta=eta),
                      final={"theta": Ws[kept][-1]})


def train_relu_head(problem: AttentionSVMProblem, V, W0, *, eta: float = 0.1, steps: int = 2000, records: int = 60,
                    record=None) -> Trajectory:
    """Normalised GD on W for the nonlinear head f_i = 1^T ReLU(V^T X_i^T s_i), s_i = S(X_i W z_i) (§7.7); the loss is
    the problem's. V : (d, m). Records θ_k = W_k (``states["theta"]``, ``final["theta"]`` the last), ``norm``,
    ``unsat`` and ``loss``; stops early (``stationary``) at a zero gradient."""
    if problem.Z is None:
        raise ValueError("problem: the nonlinear head needs the cross-attention model (Z given)")
    steps, eta, record = _steps_eta(steps, eta, records, record)
    V = check.finite_array(V, "V", ndim=2)
    if V.shape[0] != problem.d:
        raise ValueError(f"V must have {problem.d} rows, got shape {V.shape}")
    W0 = check.finite_array(W0, "W0", shape=problem.theta_shape())
    # X and V writable: their product x_itᵀV is then the np.dot other kernels compile too (read-only is another type)
    Ws, unsat, loss, status, step = _relu_head_kernel(
        np.array(problem.X, order="C"), problem.Z, np.array(V, order="C"), cf.kernel_labels(problem),
        cf.LOSS_CODE[problem.loss], W0.copy(), eta, steps, record)
    info = _check_status(status, step, "normalised GD (nonlinear head)")
    kept = record <= info["stopped_at"] if info["stationary"] else np.ones(record.size, bool)
    return Trajectory(times=record[kept].astype(float), states={"theta": Ws[kept]},
                      metrics={"norm": np.linalg.norm(Ws[kept], axis=(1, 2)), "unsat": unsat[kept],
                               "loss": loss[kept]},
                      info=dict(info, algorithm="ngd_relu_head", eta=eta), final={"theta": Ws[kept][-1]})


def train_joint(problem: AttentionSVMProblem, p0, v0, *, eta: float = 0.1, steps: int = 1000, records: int = 60,
                record=None) -> Trajectory:
    """Joint (v, p) training of the prompt model (§2.4): NGD on p and on v, each gradient normalised. Records
    θ_k = p_k (``states["theta"]``) and v_k (``states["v"]``); ``final`` holds the last of each under the same keys."""
    if problem.Z is not None:
        raise ValueError("problem: joint (v, p) training needs the prompt model (Z = None)")
    steps, eta, record = _steps_eta(steps, eta, records, record)
    p0 = check.finite_array(p0, "p0", shape=(problem.d,))
    v0 = check.finite_array(v0, "v0", shape=(problem.d,))
    ps, vs, unsat, loss, status, step = _joint_kernel(
        problem.X, problem.features, cf.kernel_labels(problem), cf.LOSS_CODE[problem.loss], p0.copy(), v0.copy(), eta, steps,
        record)
    info = _check_status(status, step, "joint training")
    kept = record <= info["stopped_at"] if info["stationary"] else np.ones(record.size, bool)
    return Trajectory(times=record[kept].astype(float), states={"theta": ps[kept], "v": vs[kept]},
                      metrics={"norm": np.linalg.norm(ps[kept], axis=1), "v_norm": np.linalg.norm(vs[kept], axis=1),
                               "unsat": unsat[kept], "loss": loss[kept]},
                      info=dict(info, algorithm="joint", eta=eta), final={"theta": ps[kept][-1], "v": vs[kept][-1]})


def initial_theta(problem: AttentionSVMProblem, *, seed: seeding.SeedLike, scale: float = 1.0) -> np.ndarray:
    """θ_0 with entries U(−scale/√d, scale/√d) (the default of a torch linear layer at scale 1, §2.4)."""
    scale = check.real(scale, "scale", minimum=0.0)
    rng = np.random.default_rng(seeding.as_seed_sequence(seed))
    bound = scale / np.sqrt(problem.d)
    return rng.uniform(-bound, bound, size=problem.theta_shape())


# ==================================================================================================
# The regularisation path (theory side)
# ==================================================================================================


def _log_excess_loss_and_gradient(x, problem):
    """log(L − L*) and its gradient ∇L/(L − L*), L* = (1/n)Σ ℓ(γ_{i,opt}) the infimum of L (§5.1).

    With a linear head L does not vanish at infinity, so log L flattens out; the excess L − L* decays like
    e^{−margin} and its logarithm is well scaled. δ_i = γ_{i,opt} − u_i = Σ_{t≠opt} s_it(γ_{i,opt} − γ_it) is formed
    in log scale, then Δ_i = ℓ(u_i) − ℓ(γ_{i,opt}) exactly (logistic: log1p(e^{−γ} expm1(δ)/(1 + e^{−γ})))."""
    logit = problem.features @ x
    a = problem.X @ problem.v
    D, c, _, _, _ = log_scaled_logit_gradient(logit, a, cf.kernel_labels(problem), cf.LOSS_CODE[problem.loss])
    g = np.einsum("it,itp->p", D, problem.features)
    logs = logit - np.logaddexp.reduce(logit, axis=1, keepdims=True)
    opt = problem.opt
    gamma = problem.scores
    top = gamma[np.arange(problem.n), opt]
    gaps = top[:, None] - gamma
    mask = np.ones_like(gaps, bool)
    mask[np.arange(problem.n), opt] = False
    log_delta = np.logaddexp.reduce(np.where(mask, logs + np.log(np.where(mask, gaps, 1.0)), -np.inf), axis=1)
    delta = np.exp(log_delta)
    if problem.loss == "linear":
        log_excess = log_delta
    else:
        # ℓ(u) − ℓ(γ) = |ℓ'(γ)|·δ·(1 + O(δ)); exact where δ is representable
        approx = cf.log_abs_loss_derivative(top, problem.loss) + log_delta
        with np.errstate(divide="ignore"):  # the exact branch is used only where δ is representable
            if problem.loss == "logistic":
                exact = np.log(np.log1p(np.exp(-top) * np.expm1(delta) / (1 + np.exp(-top))))
            else:
                exact = np.log(np.exp(-top) * np.expm1(delta))
        log_excess = np.where(delta > 1e-200, exact, approx)
    log_total = np.logaddexp.reduce(log_excess) - np.log(problem.n)
    return log_total, g * np.exp(c - log_total)


def regularisation_path(problem: AttentionSVMProblem, radii, *, alpha=None, theta_start=None) -> Trajectory:
    """θ_R = argmin_{||θ|| ≤ R} L(θ) for each R in ``radii`` (Theorem T1, §5), by SLSQP on log(L − L*) (the
    same minimiser, well scaled however small the excess loss), warm-started from the previous radius. Metrics: ``corr`` with
    θ^mm_α (Frobenius), ``norm``, ``loss``, ``unsat``."""
    radii = np.asarray(radii, float)
    if radii.ndim != 1 or radii.size < 1 or np.any(radii <= 0) or np.any(np.diff(radii) <= 0) or radii.size > 200:
        raise ValueError("radii must be 1 to 200 increasing positive numbers")
    sol = cf.frobenius_svm(problem, alpha)
    direction = sol.theta.ravel() / np.linalg.norm(sol.theta) if sol.feasible else None
    x = (direction * radii[0] * 0.5 if direction is not None else np.zeros(problem.P)) if theta_start is None \
        else check.finite_array(theta_start, "theta_start", shape=problem.theta_shape()).ravel()
    thetas, corrs, norms, losses, unsats = [], [], [], [], []
    for R in radii:
        starts = [x * min(1.0, R / max(np.linalg.norm(x), 1e-300)) * 0.99]
        if direction is not None:
            starts.append(0.99 * R * direction)
        best = None
        for start in starts:
            result = optimize.minimize(_log_excess_loss_and_gradient, start, args=(problem,), jac=True, method="SLSQP",
                                       constraints=[dict(type="ineq", fun=lambda y, R=R: R * R - y @ y,
                                                         jac=lambda y: -2 * y)],
                                       options=dict(maxiter=2000, ftol=1e-14))
            if best is None or result.fun < best.fun:
                best = result
        x = best.x
        out = cf.loss_and_gradient(problem, x.reshape(problem.theta_shape()))
        thetas.append(x.reshape(problem.theta_shape()))
        corrs.append(x @ direction / np.linalg.norm(x) if direction is not None else np.nan)
        norms.append(np.linalg.norm(x))
        losses.append(out["loss"])
        unsats.append(out["unsat"])
    return Trajectory(times=radii, states={"theta": np.array(thetas)},
                      metrics={"one_minus_corr": 1 - np.array(corrs), "norm": np.array(norms),
                               "loss": np.array(losses), "unsat": np.array(unsats)},
                      info=dict(svm_feasible=sol.feasible, what="regularisation path θ_R, R = the times"))


# ==================================================================================================
# The System contract
# ==================================================================================================


MAX_ETA = 1e6  # the largest step and initialisation scale of a public run (the first step overflows beyond)

# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("R_max", "real", 64.0, "largest radius of the regularisation path", minimum=0.0, strict=True,
              maximum=1e4),
    Parameter("points", "integer", 7, "radii R_max·2^-j, j < points", minimum=1, maximum=60),
)
MINIBATCH_OPTIONS = (
    Parameter("algorithm", "choice", "ngd", "ngd, gd, kq (per-factor), kq_joint, joint (v, p)",
              choices=ALGORITHMS),
    Parameter("eta", "real", 0.1, "step size η", minimum=0.0, strict=True, maximum=MAX_ETA),
    Parameter("steps", "integer", 2000, "training steps", minimum=1, maximum=MAX_STEPS),
    Parameter("init_scale", "real", 1.0, "initialisation U(−s/√d, s/√d)", minimum=0.0, strict=True, maximum=MAX_ETA),
    Parameter("records", "integer", 60, "log-spaced records", minimum=2, maximum=MAX_RECORDS),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: AttentionSVMProblem, *, R_max: float, points: int) -> Trajectory:
    """The theory side: the regularisation path θ_R on R = R_max·2^{−(points−1)}, …, R_max (Theorem T1, §5),
    whose direction tends to the max-margin SVM θ^mm/||θ^mm||."""
    R_max = check.real(R_max, "R_max", minimum=0.0, strict=True, maximum=1e4)
    points = check.integer(points, "points", minimum=1)
    if points > 60:
        raise ValueError(f"points must be <= 60, got {points}")
    return regularisation_path(problem, R_max * 2.0 ** -np.arange(points - 1, -1, -1))




def _step_and_scale(eta, init_scale) -> tuple[float, float]:
    """The step and the initialisation scale of a public run: positive and at most 1e6 (beyond it the first step
    already overflows the norms); the scale > 0 because 1 − corr is undefined at θ = 0."""
    return (check.real(eta, "eta", minimum=0.0, strict=True, maximum=MAX_ETA),
            check.real(init_scale, "init_scale", minimum=0.0, strict=True, maximum=MAX_ETA))


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: AttentionSVMProblem, *, seed: seeding.SeedLike, algorithm: str, eta: float,
              steps: int, init_scale: float, records: int) -> Trajectory:
    """The papers' training algorithm on the whole finite data set (one step per epoch; §2.4), from a random
    initialisation U(−s/√d, s/√d) drawn from ``seed``. Adds ``one_minus_corr`` with the Frobenius SVM of opt
    (W, p) or the nuclear SVM (K, Q) when it is feasible."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    eta, init_scale = _step_and_scale(eta, init_scale)
    parts = seeding.spawn(seed, 2)
    if algorithm in ("ngd", "gd"):
        run = train(problem, initial_theta(problem, seed=parts[0], scale=init_scale), eta=eta, steps=steps,
                    normalise=algorithm == "ngd", records=records)
    elif algorithm in ("kq", "kq_joint"):
        if problem.Z is None:
            raise ValueError("algorithm: kq needs a cross-attention problem (model=cross)")
        K0 = initial_theta(problem, seed=parts[0], scale=init_scale)
        Q0 = initial_theta(problem, seed=parts[1], scale=init_scale)
        run = train_kq(problem, K0, Q0, eta=eta, steps=steps, joint=algorithm == "kq_joint", records=records)
    else:
        if problem.Z is not None:
            raise ValueError("algorithm: joint needs a prompt problem (model=prompt or a toy)")
        v0 = initial_theta(problem, seed=parts[1], scale=init_scale)
        run = train_joint(problem, initial_theta(problem, seed=parts[0], scale=init_scale), v0, eta=eta,
                          steps=steps, records=records)
    try:
        sol = cf.svm(problem, None, "nuc" if algorithm.startswith("kq") else "fro") if algorithm != "joint" else None
    except ValueError:
        sol = None
    if sol is not None and sol.feasible:
        target = sol.theta.ravel() / np.linalg.norm(sol.theta)
        flat = run.states["theta"].reshape(len(run.times), -1)
        norms = np.linalg.norm(flat, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            metric = np.where(norms > 0, 1 - flat @ target / norms, np.nan)
        run.metrics["one_minus_corr"] = metric
    return run
