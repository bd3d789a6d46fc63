"""Training one self-attention layer for next-token prediction on a finite data set (docs/next_token_scc.md).

The paper's algorithms use the whole data set at every step, so ``minibatch`` is full-batch training (one step per
epoch); the only randomness is the instance and the initialisation. Kernels use the cancellation-free gradient of
:func:`attnflow.closed_forms.attention_svm.log_scaled_logit_gradient` (docs/next_token_scc.md §2.2).

* :func:`train` — GD (W ← W − η∇L) or normalised GD (W ← W − η∇L/||∇L||) on the log-loss with the identity head;
* :func:`train_general_head` — normalised GD on the nonconvex model of the local-convergence experiment (head E,
  softmax over the vocabulary, squared loss; docs/next_token_scc.md §5.3);
* :func:`metrics` — the comparison of docs/next_token_scc.md §8.1 on recorded iterates.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from attnflow import seeding
from attnflow.closed_forms import checks as check
from attnflow.closed_forms import next_token_scc as cf
from attnflow.closed_forms.logit_losses import LOG_LOSS_CODE, log_scaled_logit_gradient
from attnflow.closed_forms.next_token_scc import NTPProblem
from attnflow.closed_forms.softmax import softmax_into
from attnflow.closed_forms.parameters import Parameter, takes_options

from .errors import DivergenceError
from .montecarlo import MAX_RECORDS, MAX_STEPS, Trajectory, log_spaced_steps

__all__ = ["MAX_ETA", "POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "ALGORITHMS", "MAX_STEPS", "record_steps", "initial_W", "train", "train_general_head", "Reference",
           "reference", "metrics", "population", "minibatch"]

ALGORITHMS = ("gd", "ngd")
LINEAR_LOSS_CODE = 1  # ℓ(u) = −u in the shared kernel: dL/dl = (1/n) s (a − s^T a) for token values −a


def record_steps(steps: int, records: int = 40) -> np.ndarray:
    """About ``records`` log-spaced steps in [0, steps] (always 0 and ``steps``)."""
    return log_spaced_steps(steps, records)


@njit(cache=True)
def _logits(E, W, ids, last, EW, Z, out):
    """out[i, t] = Z[x_it, k_i] with Z = E W Eᵀ (Z[a, k] = e_aᵀ W e_k), through the work arrays EW (K × d) and
    Z (K × K)."""
    np.dot(E, W, EW)  # the products of E @ W @ E.T, into buffers: the same BLAS calls, compiled in less time
    np.dot(EW, E.T, Z)
    n, T = ids.shape
    for i in range(n):
        for t in range(T):
            out[i, t] = Z[ids[i, t], last[i]]


@njit(cache=True)
def _pull_back(E, D, ids, last, GZ, EtG, g):
    """g = ∇_W = Eᵀ G_Z E with G_Z[a, k] = Σ_{x_it = a, k_i = k} D_it (docs/next_token_scc.md §2.2); GZ (K × K) and
    EtG (d × K) are work arrays."""
    n, T = ids.shape
    for a in range(GZ.shape[0]):
        for k in range(GZ.shape[1]):
            GZ[a, k] = 0.0
    for i in range(n):
        for t in range(T):
            GZ[ids[i, t], last[i]] += D[i, t]
    np.dot(E.T, GZ, EtG)
    np.dot(EtG, E, g)


# Kernels are written with scalar loops rather than array expressions and numpy reductions: the loops compile several
# times faster and do the same floating-point operations in the same order (numba's sum and max are left-to-right).
# The shared log-scaled kernel gets its loss code as np.int64 (a bare global would be typed as a literal and compile
# one specialisation per code) and writable arrays, so every call here shares one compiled version.


@njit(cache=True)
def _train_kernel(E, ids, last, label_mask, W0, eta, steps, normalise, record):
    n = ids.shape[0]
    R = record.size
    d = E.shape[1]
    Ws = np.empty((R, d, d))
    losses = np.empty(R)
    log_losses = np.empty(R)
    ones = np.ones(n)
    code = np.int64(LOG_LOSS_CODE)
    W = np.empty((d, d))
    for p in range(d):
        for q in range(d):
            W[p, q] = W0[p, q]
    K = E.shape[0]
    EW, Z, logit = np.empty((K, d)), np.empty((K, K)), np.empty(ids.shape)
    GZ, EtG, g = np.empty((K, K)), np.empty((d, K)), np.empty((d, d))
    r = 0
    for k in range(steps + 1):
        _logits(E, W, ids, last, EW, Z, logit)
        D, c, loss, log_loss, _ = log_scaled_logit_gradient(logit, label_mask, ones, code)
        if r < R and record[r] == k:
            for p in range(d):
                for q in range(d):
                    Ws[r, p, q] = W[p, q]
            losses[r] = loss
            log_losses[r] = log_loss
            r += 1
        if k == steps:
            break
        _pull_back(E, D, ids, last, GZ, EtG, g)
        if normalise:
            gn = 0.0
            for p in range(d):
                for q in range(d):
                    gn += g[p, q] * g[p, q]
            gn = np.sqrt(gn)
            if gn == 0.0:
                return Ws, losses, log_losses, 2, k
            for p in range(d):
                for q in range(d):
                    W[p, q] = W[p, q] - eta * g[p, q] / gn
        else:
            step = eta * np.exp(c)
            for p in range(d):
                for q in range(d):
                    W[p, q] = W[p, q] - step * g[p, q]
        for p in range(d):
            for q in range(d):
                if not np.isfinite(W[p, q]):
                    return Ws, losses, log_losses, 1, k + 1
    return Ws, losses, log_losses, 0, steps


@njit(cache=True)
def _general_head_kernel(E, ids, last, labels, W0, eta, steps, record):
    # h_i = E X_i^T s_i = Σ_t s_it Γ[:, x_it] (Γ = E E^T), p_i = softmax(h_i), loss (1 − p_{i,y_i})²;
    # dloss/dh = −2(1 − p_y) p_y (e_y − p), so dloss/ds_it = a_it = (dloss/dh)·Γ[:, x_it]: a linear head in s
    n, T = ids.shape
    K, d = E.shape
    R = record.size
    Gram = np.empty((K, K))
    np.dot(E, E.T, Gram)
    Ws = np.empty((R, d, d))
    losses = np.empty(R)
    ones = np.ones(n)
    code = np.int64(LINEAR_LOSS_CODE)
    W = np.empty((d, d))
    for p in range(d):
        for q in range(d):
            W[p, q] = W0[p, q]
    EW, Z, logit = np.empty((K, d)), np.empty((K, K)), np.empty((n, T))
    GZ, EtG, g = np.empty((K, K)), np.empty((d, K)), np.empty((d, d))
    r = 0
    a = np.empty((n, T))
    s = np.empty(T)
    h = np.empty(K)
    prob = np.empty(K)
    u = np.empty(K)
    for k in range(steps + 1):
        _logits(E, W, ids, last, EW, Z, logit)
        loss = 0.0
        for i in range(n):
            softmax_into(logit[i], s)
            for b in range(K):
                h[b] = 0.0
            for t in range(T):
                for b in range(K):
                    h[b] += s[t] * Gram[b, ids[i, t]]
            softmax_into(h, prob)
            py = prob[labels[i]]
            loss += (1.0 - py) ** 2 / n
            coef = 2.0 * (1.0 - py) * py
            for b in range(K):
                u[b] = coef * prob[b]  # −dloss/dh off the label …
            u[labels[i]] -= coef  # … and on it
            for t in range(T):
                # token value for the shared kernel's linear loss ℓ(f) = −f: minus dloss/ds_it
                acc = 0.0
                for b in range(K):
                    acc += u[b] * Gram[b, ids[i, t]]
                a[i, t] = -acc
        D, c, _, _, _ = log_scaled_logit_gradient(logit, a, ones, code)
        if r < R and record[r] == k:
            for p in range(d):
                for q in range(d):
                    Ws[r, p, q] = W[p, q]
            losses[r] = loss
            r += 1
        if k == steps:
            break
        _pull_back(E, D, ids, last, GZ, EtG, g)
        gn = 0.0
        for p in range(d):
            for q in range(d):
                gn += g[p, q] * g[p, q]
        gn = np.sqrt(gn)
        if gn == 0.0:
            return Ws, losses, 2, k
        for p in range(d):
            for q in range(d):
                W[p, q] = W[p, q] - eta * g[p, q] / gn
        for p in range(d):
            for q in range(d):
                if not np.isfinite(W[p, q]):
                    return Ws, losses, 1, k + 1
    return Ws, losses, 0, steps


def _record(steps, records, record):
    if record is None:
        return record_steps(steps, records)
    record = np.unique(np.asarray(record, dtype=np.int64))
    if record.size < 1 or record[0] < 0 or record[-1] > MAX_STEPS or record.size > MAX_RECORDS:
        raise ValueError(f"record must hold at most {MAX_RECORDS} steps in [0, {MAX_STEPS}]")
    return record


def _status(status: int, step: int, what: str) -> dict:
    if status == 1:
        raise DivergenceError(f"{what} left the finite region at step {step}")
    return dict(stopped_at=int(step), stationary=status == 2)


def _writable(E) -> np.ndarray:
    """The embeddings as a writable C-ordered copy: the kernels' products E W Eᵀ and Eᵀ G_Z E then share numba's
    compiled np.dot with the other kernels (a read-only operand is another signature, and so another compile)."""
    return np.array(E, order="C")


def initial_W(problem: NTPProblem, *, seed: seeding.SeedLike, scale: float = 1.0) -> np.ndarray:
    """W_0 with entries U(−scale/√d, scale/√d): a torch linear layer's default at scale 1 (§2.3)."""
    scale = check.real(scale, "scale", minimum=0.0)
    bound = scale / np.sqrt(problem.d)
    return np.random.default_rng(seeding.as_seed_sequence(seed)).uniform(-bound, bound, size=(problem.d, problem.d))


def train(problem: NTPProblem, W0, *, eta: float = 1.0, steps: int = 2000, normalise: bool = False,
          records: int = 40, record=None) -> Trajectory:
    """GD or normalised GD on the exact log-loss (§2.3) from ``W0``. Records W_k (``states["W"]``), ``loss`` and
    ``log_loss`` at log-spaced k (or at ``record``); a step that leaves the finite region raises DivergenceError."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    record = _record(steps, records, record)
    W0 = check.finite_array(W0, "W0", shape=(problem.d, problem.d))
    Ws, loss, log_loss, status, step = _train_kernel(_writable(problem.E), problem.ids, problem.last,
                                                     np.array(problem.label_mask),  # writable: see the kernels
                                                     W0.copy(), eta, int(record[-1]),
                                                     check.boolean(normalise, "normalise"), record)
    info = _status(status, step, "normalised GD" if normalise else "GD")
    kept = record <= info["stopped_at"]
    return Trajectory(times=record[kept].astype(float), states={"W": Ws[kept]},
                      metrics={"loss": loss[kept], "log_loss": log_loss[kept]},
                      info=dict(info, algorithm="ngd" if normalise else "gd", eta=eta), final={"W": Ws[kept][-1]})


def train_general_head(problem: NTPProblem, W0, *, eta: float = 0.1, steps: int = 2000, records: int = 40,
                       record=None) -> Trajectory:
    """Normalised GD on the local-convergence experiment's model (§5.3): logits h_i = E X_i^T s_i over the
    vocabulary, loss (1/n) Σ_i (1 − softmax(h_i)_{y_i})². Records W_k and ``loss``."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    record = _record(steps, records, record)
    W0 = check.finite_array(W0, "W0", shape=(problem.d, problem.d))
    Ws, loss, status, step = _general_head_kernel(_writable(problem.E), problem.ids, problem.last, problem.labels,
                                                  W0.copy(), eta, int(record[-1]), record)
    info = _status(status, step, "normalised GD (general head)")
    kept = record <= info["stopped_at"]
    return Trajectory(times=record[kept].astype(float), states={"W": Ws[kept]}, metrics={"loss": loss[kept]},
                      info=dict(info, algorithm="ngd_general_head", eta=eta), final={"W": Ws[kept][-1]})


# ==================================================================================================
# Theory against simulation (§8.1)
# ==================================================================================================


class Reference:
    """The theory objects of one problem, computed once: graphs, O_i, W^svm, S_fin, W^fin, the limit attention and
    the limit loss L_red(W^fin)."""

    def __init__(self, problem: NTPProblem):
        self.problem = problem
        self.graphs = cf.priority_graphs(problem)
        self.O = cf.high_priority_mask(problem, self.graphs)
        self.svm = cf.graph_svm(problem, graphs=self.graphs)
        self.W_svm = self.svm.W
        self.basis = cf.sfin_basis(problem, self.graphs)
        self.W_fin = cf.w_fin(problem, graphs=self.graphs)
        self.attention = cf.predicted_attention(problem, self.W_fin, self.graphs)
        self.limit_loss = cf.reduced_loss_and_gradient(problem, self.W_fin, self.O)[0]


def reference(problem: NTPProblem) -> Reference:
    return Reference(problem)


def metrics(run: Trajectory, ref: Reference) -> dict:
    """The comparisons of docs/next_token_scc.md §8.1 at every record: ``one_minus_corr`` 1 − corr(W, W^svm),
    ``one_minus_corr_decomposed`` 1 − corr(W, W^fin + R W^svm) (R fitted per record), ``one_minus_corr_perp``
    1 − corr(W − Π_{S_fin}W, W^svm), ``fin_error`` ||Π_{S_fin}W − W^fin||, ``norm`` ||W||, ``mass_off`` max_i of the
    attention mass outside O_i, ``tv`` max_i TV(attention restricted to O_i, softmax(l^fin)), ``loss_gap``
    L(W) − L_red(W^fin). The directional metrics (``one_minus_corr*``) are NaN where a correlation is undefined:
    everywhere when W^svm = 0 (no strict edge, nothing to align with), and at a record where the compared array is
    0 (the start W₀ = 0, or W with no part off S_fin)."""
    problem = ref.problem
    Ws = run.states["W"]
    flat = Ws.reshape(len(Ws), -1)
    norms = np.linalg.norm(flat, axis=1)
    projected = cf.project_sfin(Ws, ref.basis)
    svm = ref.W_svm.ravel()
    svm_norm = np.linalg.norm(svm)
    out = dict(norm=norms, fin_error=np.linalg.norm((projected - ref.W_fin).reshape(len(Ws), -1), axis=1),
               loss_gap=run.metrics["loss"] - ref.limit_loss)
    nan = np.full(len(Ws), np.nan)
    if svm_norm > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            out["one_minus_corr"] = 1 - flat @ svm / (norms * svm_norm)
            perp = (Ws - projected).reshape(len(Ws), -1)
            out["one_minus_corr_perp"] = 1 - perp @ svm / (np.linalg.norm(perp, axis=1) * svm_norm)
            radius = (flat - ref.W_fin.ravel()) @ svm / svm_norm ** 2
            target = ref.W_fin.ravel()[None, :] + radius[:, None] * svm[None, :]
            out["one_minus_corr_decomposed"] = 1 - np.sum(flat * target, 1) / (norms * np.linalg.norm(target, axis=1))
    else:
        out.update(one_minus_corr=nan, one_minus_corr_perp=nan, one_minus_corr_decomposed=nan)
    mass_off, tv = np.empty(len(Ws)), np.empty(len(Ws))
    for j, W in enumerate(Ws):
        l = cf.logits(problem, W)
        log_s = l - np.logaddexp.reduce(l, axis=1, keepdims=True)
        # mass outside O_i, summed (not 1 − mass on O_i) so that it does not cancel
        off = np.where(ref.O, -np.inf, log_s)
        mass_off[j] = np.exp(np.logaddexp.reduce(off, axis=1)).max()
        inside = np.where(ref.O, l, -np.inf)
        within = np.exp(inside - np.logaddexp.reduce(inside, axis=1, keepdims=True))
        tv[j] = 0.5 * np.abs(within - ref.attention).sum(axis=1).max()
    out.update(mass_off=mass_off, tv=tv)
    return out


# ==================================================================================================
# The System contract
# ==================================================================================================


MAX_ETA = 1e6  # the largest step and initialisation scale of a public run (the first step overflows the logits beyond)


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("eta", "real", 1.0, "GD step size η", minimum=0.0, strict=True, maximum=MAX_ETA),
    Parameter("steps", "integer", 20000, "GD steps", minimum=1, maximum=MAX_STEPS),
    Parameter("records", "integer", 40, "log-spaced records", minimum=2, maximum=MAX_RECORDS),
)
MINIBATCH_OPTIONS = (
    Parameter("algorithm", "choice", "ngd", "ngd (the paper's experiments) or gd", choices=ALGORITHMS),
    Parameter("eta", "real", 0.01, "step size η", minimum=0.0, strict=True, maximum=MAX_ETA),
    Parameter("steps", "integer", 4000, "training steps", minimum=1, maximum=MAX_STEPS),
    Parameter("init_scale", "real", 1.0, "initialisation U(−s/√d, s/√d)", minimum=0.0, strict=True, maximum=MAX_ETA),
    Parameter("records", "integer", 40, "log-spaced records", minimum=2, maximum=MAX_RECORDS),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: NTPProblem, *, eta: float, steps: int, records: int) -> Trajectory:
    """The theorem's algorithm: GD with constant step η from W_0 = 0 on the exact loss (§2.3), with the
    comparison metrics of §8.1 against W^svm, W^fin and the limit attention."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True, maximum=MAX_ETA)
    run = train(problem, np.zeros((problem.d, problem.d)), eta=eta, steps=steps, records=records)
    return Trajectory(times=run.times, states=run.states, metrics={**run.metrics, **metrics(run, Reference(problem))},
                      info=run.info, final=run.final)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: NTPProblem, *, seed: seeding.SeedLike, algorithm: str, eta: float,
              steps: int, init_scale: float, records: int) -> Trajectory:
    """The paper's experiment: full-batch (normalised) GD from the default initialisation U(−s/√d, s/√d) drawn from
    ``seed`` (§2.3), with the metrics of §8.1."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    # positive and at most 1e6 (beyond it the first step overflows the logits); the scale > 0 because 1 − corr is
    # undefined at W = 0
    eta = check.real(eta, "eta", minimum=0.0, strict=True, maximum=MAX_ETA)
    init_scale = check.real(init_scale, "init_scale", minimum=0.0, strict=True, maximum=MAX_ETA)
    W0 = initial_W(problem, seed=seed, scale=init_scale)
    run = train(problem, W0, eta=eta, steps=steps, normalise=algorithm == "ngd", records=records)
    return Trajectory(times=run.times, states=run.states, metrics={**run.metrics, **metrics(run, Reference(problem))},
                      info=run.info, final=run.final)
