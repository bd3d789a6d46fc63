"""Sparse Contextual Bigram: a streaming minibatch sampler and Algorithm 1 on real minibatches.

Samples are drawn inside numba kernels by alias and guide tables from a xoshiro256+ generator (:mod:`.sampling`) and consumed
a chunk at a time (docs/scb.md §2: positions x₁…x_T, x_{T+1} i.i.d. ~ μ, s ~ q*⁽ᵏ⁾, o ~ Pe_{x_s}), so memory stays
flat in the batch size and in the number of steps. The generator's state comes from ``numpy.random.SeedSequence``
at the start of every stage, so a run is determined by its seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from attnflow.closed_forms import scb as cf
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.scb import SCBProblem

from attnflow.seeding import SeedLike, generator_state, spawn
from attnflow.closed_forms.parameters import Parameter, takes_options

from .errors import DivergenceError, StageFailure
from .integrate import iterate_map, solve_dopri5
from . import progress, sampling
from .diffusion import pool_size
from .montecarlo import MAX_STEPS, Trajectory

__all__ = ["POPULATION_OPTIONS", "MINIBATCH_OPTIONS", "minibatch_gradients", "line_trajectory", "normalised_flow", "StageSettings", "MAX_STAGE_BATCH", "run_stage", "run_algorithm1",
           "run_sgd", "run_stage1", "run_stages_2_3", "StageFailure", "rounding_threshold", "rounding_finds_supports",
           "transfer_step", "run_transfer", "relative_errors",
           "round_columns", "round_to_supports", "RECORD_NAMES", "BLOWUP", "population", "minibatch", "ETA",
           "ContextSample", "context_sample", "reduced_noise", "ReducedBand", "stage1_noise_band", "offline_errors",
           "off_support_noise"]


def _sampling_tables(problem: SCBProblem):
    """Tables (:mod:`.sampling`) of the three laws the data model draws from: an alias table of μ (N; T + 1 draws per
    sample), and cumulative sums with guide tables of the columns of Q* as laws over the T positions (N × T, row k
    for query k) and of the columns of P as laws over the next token (N × N, row a for attended token a)."""
    mu_prob, mu_choices = sampling.alias_table(problem.mu)
    Qs_cdf, Qs_guide = sampling.guide_tables(problem.Q_star.T)
    P_cdf, P_guide = sampling.guide_tables(problem.P.T)
    return mu_prob, mu_choices, Qs_cdf, Qs_guide, P_cdf, P_guide


CHUNK = 256  # samples per GEMM: large enough to run BLAS near its peak, small enough to stay in cache


@njit(cache=True)
def _add_context(y, x, q):
    """y[x_t] += q_t over t in order: y_b = Σ_t q_t⁽ᵏ⁾ e_{x_t}, added into a zero row."""
    for t in range(x.shape[0]):
        y[x[t]] += q[t]


@njit(cache=True)
def _add_context_pair(y0, x0, q0, y1, x1, q1):
    """:func:`_add_context` for two samples at once, each row's additions in the same order as alone (the same
    bits). When each token recurs many times in a context, an addition waits for the store of the previous one to
    the same entry; two independent rows fill that wait (docs/scb.md §5.1)."""
    for t in range(x0.shape[0]):
        y0[x0[t]] += q0[t]
        y1[x1[t]] += q1[t]


@njit(cache=True)
def _batch_gradients(V, Q, mu, tables, state, batch, chunk):
    """Batch means of the loss, the preconditioned gradients (eq. 4) and the raw ones, from
    ``batch`` fresh samples (Lemma B.3 per sample; docs/scb.md §5's per-sample forms), drawn with the alias and guide
    ``tables`` (:func:`_sampling_tables`) from the generator ``state`` (advanced in place).

    Per sample b: y_b = Σ_t q_t⁽ᵏ⁾ e_{x_t}, r_b = e_o − V y_b, ∇_V = −r_b y_bᵀ (preconditioned:
    −r_b(D⁻¹y_b − (1ᵀy_b)1)ᵀ) and ∇_{q⁽ᵏ⁾} = −XᵀVᵀr_b = −w_b[x_t] with w_b = Vᵀr_b. Samples are taken ``chunk``
    at a time as the rows of dense Y, R and W, so the three products R = E_o − Y Vᵀ, Rᵀ Y and W = R V are GEMMs
    (docs/scb.md §5.1). The draws (x₁…x_T, k, s, o per sample, in that order) do not depend on ``chunk``; the
    sums do only through the order of floating-point additions.
    """
    mu_prob, mu_choices, Qs_cdf, Qs_guide, P_cdf, P_guide = tables
    N, T = V.shape[0], Q.shape[0]
    C = min(chunk, batch)
    u = np.empty(3)  # the uniforms of k, s and o, drawn after those of x₁…x_T
    X = np.empty((C, T), np.uint32)  # token ids: half the memory traffic of int64; unsigned, so no wraparound
    ks = np.empty(C, np.int64)
    labels = np.empty(C, np.int64)
    Y = np.zeros((C, N))
    R = np.empty((C, N))
    W = np.empty((C, N))
    gathered = np.empty(T)  # w_b[x_t] over t, for the centred Q-gradient
    product = np.empty((N, N))
    RtY = np.zeros((N, N))  # Σ_b r_b y_bᵀ
    dense_r = np.zeros(N)  # Σ_b (1ᵀy_b) r_b: the rank-one part of the preconditioned V-gradient
    G_Qt = np.zeros((N, T))  # ∇_Q transposed: row k is the column of query k
    raw_Qt = np.zeros((N, T))
    Vt = V.T
    # Scalar loops rather than array expressions throughout: the same arithmetic, compiled several times faster.
    Qt = np.empty((N, T))  # row k is q⁽ᵏ⁾, read contiguously
    column_sums = np.zeros(N)  # 1ᵀy_b = Σ_t q_t⁽ᵏ⁾
    for k in range(N):
        for t in range(T):
            Qt[k, t] = Q[t, k]
            column_sums[k] += Qt[k, t]
    # Rows are built two at a time when each token recurs about 16 times or more per context (the whole kernel:
    # 13-16% faster at N = 5, T = 256 and 1024; 2-4% slower paired when tokens rarely recur, at N = 20, T = 64 and
    # N = 50, T = 128), one at a time otherwise.
    paired = T >= 16 * N
    loss = 0.0
    done = 0
    while done < batch:
        c = min(C, batch - done)
        for b in range(c):
            x = X[b]
            sampling.alias_picks(state, mu_prob, mu_choices, x)
            sampling.fill_uniforms(state, u)
            k = sampling.alias_pick(u[0], mu_prob, mu_choices)
            s = sampling.guided_pick(u[1], Qs_cdf[k], Qs_guide[k])
            o = sampling.guided_pick(u[2], P_cdf[x[s]], P_guide[x[s]])
            ks[b] = k
            labels[b] = o
            if not paired:
                _add_context(Y[b], x, Qt[k])
        if paired:
            for b in range(0, c - 1, 2):
                _add_context_pair(Y[b], X[b], Qt[ks[b]], Y[b + 1], X[b + 1], Qt[ks[b + 1]])
            if c % 2 == 1:
                _add_context(Y[c - 1], X[c - 1], Qt[ks[c - 1]])
        np.dot(Y[:c], Vt, R[:c])  # (V y_b)ᵀ as rows
        for b in range(c):
            r = R[b]
            total = column_sums[ks[b]]
            for i in range(N):
                r[i] = -r[i]
            r[labels[b]] += 1.0
            for i in range(N):
                loss += 0.5 * r[i] * r[i]
                dense_r[i] += total * r[i]
        np.dot(R[:c].T, Y[:c], product)
        for i in range(N):
            for j in range(N):
                RtY[i, j] += product[i, j]
        np.dot(R[:c], V, W[:c])  # w_bᵀ = r_bᵀ V as rows
        for b in range(c):
            x, w, k = X[b], W[b], ks[b]
            g, raw = G_Qt[k], raw_Qt[k]
            w_mean = 0.0
            for t in range(T):  # the raw gradient needs no mean: it rides on the pass that forms it
                value = w[x[t]]
                gathered[t] = value  # kept for the second pass: a contiguous read instead of a second gather
                w_mean += value
                raw[t] -= value
            w_mean /= T
            inv_mu = 1.0 / mu[k]
            for t in range(T):
                g[t] -= (gathered[t] - w_mean) * inv_mu
            y = Y[b]
            if N < T:  # back to zero for the next chunk: the whole row, or only the entries written
                for i in range(N):
                    y[i] = 0.0
            else:
                for t in range(T):
                    y[x[t]] = 0.0
        done += c
    G_V = np.empty((N, N))
    raw_V = np.empty((N, N))
    for i in range(N):
        for j in range(N):
            G_V[i, j] = (dense_r[i] - RtY[i, j] / mu[j]) / batch
            raw_V[i, j] = -RtY[i, j] / batch
    G_Q = np.empty((T, N))
    raw_Q = np.empty((T, N))
    for t in range(T):
        for k in range(N):
            G_Q[t, k] = G_Qt[k, t] / batch
            raw_Q[t, k] = raw_Qt[k, t] / batch
    return loss / batch, G_V, G_Q, raw_V, raw_Q


def minibatch_gradients(problem: SCBProblem, V, Q, batch: int, *, seed: SeedLike, raw: bool = True,
                        chunk: int = CHUNK) -> dict:
    """Loss and gradients averaged over ``batch`` fresh samples of the raw data model (for tests and diagnostics);
    ``chunk`` samples share each GEMM (it changes the rounding of the sums, never the draws)."""
    V = check.finite_array(V, "V", shape=(problem.N, problem.N))
    Q = check.finite_array(Q, "Q", shape=(problem.T, problem.N))
    raw = check.boolean(raw, "raw")
    batch = check.integer(batch, "batch", minimum=1)
    if batch > MAX_GRADIENT_BATCH:
        raise ValueError(f"batch must be <= {MAX_GRADIENT_BATCH:.0e} samples (about a minute at these kernels' "
                         f"speed; a larger batch is a typo), got {batch}")
    chunk = check.integer(chunk, "chunk", minimum=1)
    with np.errstate(over="ignore"):  # the generator's uint64 arithmetic wraps by design (matters without JIT)
        # writable C-ordered copies: the same argument types as the training kernel's, so one compiled version serves
        loss, G_V, G_Q, raw_V, raw_Q = _batch_gradients(np.array(V, order="C"), np.array(Q, order="C"), problem.mu,
                                                        _sampling_tables(problem), generator_state(seed), batch, chunk)
    out = dict(loss=loss, G_V=G_V, G_Q=G_Q)
    if raw:
        out.update(grad_V=raw_V, grad_Q=raw_Q)
    return out


# ==================================================================================================
# The 2-D line map through the integrator engine
# ==================================================================================================


def line_trajectory(problem: SCBProblem, eta_V: float, eta_Q: float, steps: int, x0=(0.0, 0.0)) -> Trajectory:
    """The population map on the line (eq. 7) from (α_V, α_Q) = x0, every step recorded.

    Metrics ``alpha_V``, ``alpha_Q`` and the reduced ``risk`` (docs/scb.md §8.2) against the step; states ``alpha``
    (steps + 1, 2)."""
    steps = check.integer(steps, "steps", minimum=0)
    if steps > 10**7:
        raise ValueError(f"steps must be at most 10^7 (every step is recorded), got {steps}")
    x0 = check.finite_array(x0, "x0", shape=(2,))
    sol = iterate_map(cf.line_map_step, x0, steps, cf.pack_line_params(problem, eta_V, eta_Q))
    alpha_V, alpha_Q = sol.y[:, 0].copy(), sol.y[:, 1].copy()
    return Trajectory(times=np.arange(steps + 1, dtype=float), states=dict(alpha=sol.y),
                      metrics=dict(alpha_V=alpha_V, alpha_Q=alpha_Q, risk=cf.reduced_risk(problem, alpha_V, alpha_Q)),
                      info=dict(eta_V=float(eta_V), eta_Q=float(eta_Q)))


def normalised_flow(epsilon: float, x0, taus, *, rtol: float = 1e-10, atol: float = 1e-13) -> Trajectory:
    """The normalised gradient flow of docs/scb.md §8.3 from x0 = (α_V, α_Q) at the times ``taus`` (DOPRI5): metrics
    ``alpha_V`` and ``alpha_Q`` against τ, states ``alpha`` (n, 2)."""
    epsilon = check.real(epsilon, "epsilon", minimum=0.0)
    sol = solve_dopri5(cf.normalised_flow_rhs_into, np.asarray(x0, float), taus, [epsilon], t0=0.0, rtol=rtol,
                       atol=atol)
    return Trajectory(times=np.asarray(sol.t, float), states=dict(alpha=sol.y),
                      metrics=dict(alpha_V=sol.y[:, 0].copy(), alpha_Q=sol.y[:, 1].copy()),
                      info=dict(n_rhs_evals=sol.n_rhs_evals))


# ==================================================================================================
# Algorithm 1 on real minibatches (docs/scb.md §6)
# ==================================================================================================


@njit(cache=True)
def _stage_kernel(V, Q, mu, tables, state, P, Q_star, K_P, K_Q, eta_V, eta_Q, lam, batch, steps, train_Q,
                  record_every, blowup, chunk):
    """``steps`` preconditioned minibatch steps in place; λ > 0 adds the soft threshold η_Qλ before the affine
    column projection (eq. 6). Records (α_V, α_Q, ‖V − P‖_μ, ‖Q − Q*‖_μ, max|1ᵀV − 1ᵀ|, max|Vμ − μ|,
    max|1ᵀQ − 1ᵀ|, loss, ‖Q_norm − Q*‖_μ) every ``record_every`` steps and after the last, where Q_norm is Q
    normalised as Stage 3 would at that step (:func:`_normalised_distance`). Returns (records, violations, failed step
    or −1): a step fails when an entry of V or Q is non-finite or beyond ``blowup`` in size."""
    N, T = V.shape[0], Q.shape[0]
    n_rec = steps // record_every + 2
    rec = np.empty((n_rec, 10))
    for i in range(n_rec):
        for m in range(10):
            rec[i, m] = np.nan
    j = 0
    theta = eta_Q * lam
    violations = 0
    for step in range(steps + 1):
        if step % record_every == 0 or step == steps:
            rec[j, 0] = step
            metrics = _metrics(V, Q, mu, P, Q_star, K_P, K_Q)
            for m in range(7):
                rec[j, 1 + m] = metrics[m]
            rec[j, 9] = _normalised_distance(Q, mu, Q_star, rec[j, 2])
            j += 1
        if step == steps:
            break
        loss, G_V, G_Q, _, _ = _batch_gradients(V, Q, mu, tables, state, batch, chunk)
        if step % record_every == 0:
            rec[j - 1, 8] = loss  # the minibatch loss at the recorded state (nan at the final record)
        for a in range(N):
            for b in range(N):
                V[a, b] -= eta_V * G_V[a, b]
        if train_Q:
            for k in range(N):
                column = 0.0
                for t in range(T):
                    value = Q[t, k] - eta_Q * G_Q[t, k]
                    if value > theta:
                        value -= theta
                    elif value < -theta:
                        value += theta
                        violations += 1
                    else:
                        value = 0.0
                    Q[t, k] = value
                    column += value
                shift = (1.0 - column) / T
                for t in range(T):
                    Q[t, k] += shift
        if not _bounded(V, Q, blowup):
            return rec[:j], violations, step + 1
    return rec[:j], violations, -1


@njit(cache=True)
def _bounded(V, Q, blowup):
    """Every entry of V and Q finite and below ``blowup`` in size (the comparison is False for nan)."""
    for a in range(V.shape[0]):
        for b in range(V.shape[1]):
            if not abs(V[a, b]) < blowup:
                return False
    for t in range(Q.shape[0]):
        for k in range(Q.shape[1]):
            if not abs(Q[t, k]) < blowup:
                return False
    return True


@njit(cache=True)
def _metrics(V, Q, mu, P, Q_star, K_P, K_Q):
    """(α_V, α_Q, ‖V − P‖_μ, ‖Q − Q*‖_μ, max|1ᵀV − 1ᵀ|, max|Vμ − μ|, max|1ᵀQ − 1ᵀ|), in plain loops (numpy
    reductions inside a kernel cost seconds of compilation each)."""
    N, T = V.shape[0], Q.shape[0]
    out = np.zeros(7)
    inner_V = 0.0
    inner_Q = 0.0
    dist_V = 0.0
    dist_Q = 0.0
    for k in range(N):
        column_V = 0.0
        column_Q = 0.0
        for i in range(N):
            inner_V += mu[k] * (V[i, k] - mu[i]) * (P[i, k] - mu[i])
            dist_V += mu[k] * (V[i, k] - P[i, k]) ** 2
            column_V += V[i, k]
        for t in range(T):
            inner_Q += mu[k] * (Q[t, k] - 1.0 / T) * (Q_star[t, k] - 1.0 / T)
            dist_Q += mu[k] * (Q[t, k] - Q_star[t, k]) ** 2
            column_Q += Q[t, k]
        out[4] = max(out[4], abs(column_V - 1.0))
        out[6] = max(out[6], abs(column_Q - 1.0))
    for i in range(N):
        image = 0.0
        for k in range(N):
            image += V[i, k] * mu[k]
        out[5] = max(out[5], abs(image - mu[i]))
    out[0] = inner_V / K_P
    out[1] = inner_Q / K_Q
    out[2] = math.sqrt(dist_V)
    out[3] = math.sqrt(dist_Q)
    return out


@njit(cache=True)
def _normalised_distance(Q, mu, Q_star, alpha_Q):
    """‖Q_norm − Q*‖_μ for Q_norm = q·1{q ≥ θ₃}/‖q·1{q ≥ θ₃}‖₁ column by column, θ₃ = ½·α_Q·min q* (the Stage-3
    normalisation of docs/scb.md §6 with the default θ₃ at the current α_Q): the distance Algorithm 1 would reach by
    stopping Stage 2 now. NaN when α_Q <= 0 or a column would be emptied. Reads Q only; changes nothing."""
    N, T = Q.shape[1], Q.shape[0]
    smallest = np.inf
    for k in range(N):
        for t in range(T):
            if Q_star[t, k] > 0 and Q_star[t, k] < smallest:
                smallest = Q_star[t, k]
    threshold = 0.5 * alpha_Q * smallest
    if not threshold > 0:
        return np.nan
    total = 0.0
    for k in range(N):
        norm = 0.0
        for t in range(T):
            if Q[t, k] >= threshold:
                norm += Q[t, k]
        if norm <= 0:
            return np.nan
        for t in range(T):
            kept = Q[t, k] / norm if Q[t, k] >= threshold else 0.0
            total += mu[k] * (kept - Q_star[t, k]) ** 2
    return math.sqrt(total)


BLOWUP = 1e6  # |entries| of V and Q stay O(1) on the stochastic constraint sets; beyond this the run has diverged
RECORD_NAMES = ("step", "alpha_V", "alpha_Q", "dist_V", "dist_Q", "colsum_V", "stationarity_V", "colsum_Q", "loss",
                "dist_Q_normalised")


MAX_STAGE_BATCH = 10_000_000  # largest samples per step of a stage; `attnflow simulate scb` has the same bound
MAX_NOISE_BATCHES = 10_000  # independent batches of off_support_noise (one gradient call each)
MAX_GRADIENT_BATCH = 10**8  # largest batch of one minibatch_gradients call


@dataclass(frozen=True)
class StageSettings:
    """One stage: ``steps`` minibatch steps of size ``batch`` with normalised step η (η_V = η/K_Q, η_Q = η/K_P,
    docs/scb.md §5) and ℓ₁ strength λ; ``train_Q=False`` freezes the attention (Stage 3)."""

    steps: int
    batch: int
    eta: float
    lam: float = 0.0
    train_Q: bool = True
    eta_V: float | None = None  # overrides η/K_Q (Stage 3 of docs/scb.md §11 uses 0.1/K_Q)

    def __post_init__(self):
        object.__setattr__(self, "steps", check.integer(self.steps, "steps", minimum=0))
        object.__setattr__(self, "batch", check.integer(self.batch, "batch", minimum=1))
        # Samples are streamed, so no memory limit binds: these bound the time, refused before any work.
        if self.steps > MAX_STEPS:
            raise ValueError(f"steps must be <= {MAX_STEPS} (a longer stage is a typo, not an experiment), "
                             f"got {self.steps}")
        if self.batch > MAX_STAGE_BATCH:
            raise ValueError(f"batch must be <= {MAX_STAGE_BATCH} samples per step (seconds per step at that size; "
                             f"the bound is attnflow.dynamics.scb.MAX_STAGE_BATCH), got {self.batch}")
        object.__setattr__(self, "eta", check.real(self.eta, "eta", minimum=0.0, strict=True))
        object.__setattr__(self, "lam", check.real(self.lam, "lam", minimum=0.0))
        if self.eta_V is not None:  # 0 freezes V (the transfer step)
            object.__setattr__(self, "eta_V", check.real(self.eta_V, "eta_V", minimum=0.0))


def _as_trajectory(records: np.ndarray, V, Q, *, boundaries, violations: int, samples: int) -> Trajectory:
    """A Trajectory from kernel records (rows of RECORD_NAMES): the step as time, the other columns as named
    metrics, the final (V, Q) in ``final``, and the stage boundaries, soft-threshold violations (entries below
    −η_Qλ, docs/scb.md §13 #4) and samples used in ``info``."""
    return Trajectory(times=records[:, 0].copy(),
                      metrics={name: records[:, i].copy() for i, name in enumerate(RECORD_NAMES) if i},
                      final=dict(V=V, Q=Q),
                      info=dict(boundaries=list(boundaries), violations=int(violations), samples=int(samples)))


def _joined(runs: list[Trajectory], V, Q) -> Trajectory:
    """Consecutive runs as one Trajectory ending at (V, Q)."""
    return Trajectory(times=np.concatenate([r.times for r in runs]),
                      metrics={name: np.concatenate([r.metrics[name] for r in runs]) for name in RECORD_NAMES[1:]},
                      final=dict(V=V, Q=Q),
                      info=dict(boundaries=[b for r in runs for b in r.info["boundaries"]],
                                violations=sum(r.info["violations"] for r in runs),
                                samples=sum(r.info["samples"] for r in runs)))


def _stage_in_place(problem, V, Q, stage: StageSettings, seed, offset, record_every):
    """Run ``stage`` on (V, Q) in place; returns (records, soft-threshold violations)."""
    eta_V = stage.eta_V if stage.eta_V is not None else stage.eta / problem.K_Q
    eta_Q = stage.eta / problem.K_P
    with np.errstate(over="ignore"):  # the generator's uint64 arithmetic wraps by design (matters without JIT)
        rec, violations, failed = _stage_kernel(V, Q, problem.mu, _sampling_tables(problem), generator_state(seed),
                                                problem.P, problem.Q_star, problem.K_P, problem.K_Q, eta_V, eta_Q,
                                                stage.lam, stage.batch, stage.steps, stage.train_Q,
                                                max(1, record_every), BLOWUP, CHUNK)
    if failed >= 0:
        raise DivergenceError(f"minibatch run diverged at step {offset + failed}: an entry of V or Q is non-finite "
                              f"or above {BLOWUP:g} in size (try a smaller step or a larger batch)")
    rec = rec.copy()
    rec[:, 0] += offset
    return rec, violations


def _start_matrices(problem: SCBProblem, start) -> tuple[np.ndarray, np.ndarray]:
    """Fresh C-ordered float copies of ``start`` = (V, Q), checked for shape and finiteness."""
    if not isinstance(start, (tuple, list)) or len(start) != 2:
        raise ValueError("start must be a pair (V, Q)")
    V = np.array(check.finite_array(start[0], "V", shape=(problem.N, problem.N)), dtype=float, order="C")
    Q = np.array(check.finite_array(start[1], "Q", shape=(problem.T, problem.N)), dtype=float, order="C")
    return V, Q


def run_stage(problem: SCBProblem, start, stage: StageSettings, *, seed: SeedLike, offset: int = 0,
              record_every: int = 5) -> Trajectory:
    """One stage of Algorithm 1 (docs/scb.md §6) from ``start`` = (V, Q), which is not modified: ``stage.steps``
    preconditioned minibatch steps, projected, with the soft threshold when λ > 0. Steps are counted from
    ``offset``; the final (V, Q) are in ``final``. The metrics are RECORD_NAMES at every ``record_every`` steps and
    after the last; two are undefined (NaN) at some records: ``loss``, the minibatch loss of the batch drawn at that
    state, at a stage's last record (no batch is drawn after the last step), and ``dist_Q_normalised`` where the
    Stage-3 normalisation is undefined (α_Q <= 0, as at Q₀, or a column it would empty)."""
    V, Q = _start_matrices(problem, start)
    offset = check.integer(offset, "offset", minimum=0)
    record_every = check.integer(record_every, "record_every", minimum=1)
    rec, violations = _stage_in_place(problem, V, Q, stage, seed, offset, record_every)
    return _as_trajectory(rec, V, Q, boundaries=[], violations=violations, samples=stage.steps * stage.batch)


def rounding_threshold(problem: SCBProblem, alpha_Q: float, C: float = 2.0) -> float:
    """θ₁ = (1 − α_Q)/T + α_Q/(2C·sparsity): midway between an off-support entry and the smallest support entry of
    the line point at α_Q (docs/scb.md §13 #10)."""
    alpha_Q = check.real(alpha_Q, "alpha_Q")
    C = check.real(C, "C", minimum=1.0)
    return (1 - alpha_Q) / problem.T + alpha_Q / (2 * C * problem.sparsity)


def rounding_finds_supports(problem: SCBProblem, Q, alpha_Q: float, C: float = 2.0) -> bool:
    """Whether rounding at θ₁ for ``alpha_Q`` keeps exactly the supports of Q* (Lemmas E.1–E.4's success)."""
    Q = check.finite_array(Q, "Q", shape=(problem.T, problem.N))
    return bool(np.array_equal(Q >= rounding_threshold(problem, alpha_Q, C), problem.Q_star > 0))


def _project_columns(Q: np.ndarray) -> np.ndarray:
    """The affine projection onto 1ᵀq = 1, column by column."""
    return Q + (1.0 - Q.sum(axis=0)) / Q.shape[0]


def round_columns(Q: np.ndarray, threshold: float) -> np.ndarray:
    """Zero the entries below ``threshold``, then project every column back to 1ᵀq = 1 (docs/scb.md §6, rounding)."""
    Q = check.finite_array(Q, "Q", ndim=2)
    threshold = check.real(threshold, "threshold")
    return _project_columns(np.where(Q < threshold, 0.0, Q))


def round_to_supports(problem: SCBProblem, Q) -> np.ndarray:
    """Rounding that keeps exactly the supports of Q* (what a successful rounding does, Lemmas E.1–E.4), then the
    column projection: the oracle entry point of Stage 2."""
    Q = check.finite_array(Q, "Q", shape=(problem.T, problem.N))
    return _project_columns(np.where(problem.Q_star > 0, Q, 0.0))


def _normalise_columns(Q: np.ndarray, threshold: float) -> np.ndarray:
    """q ← q·1{q >= θ₃}/‖q·1{q >= θ₃}‖₁ (Stage 3, docs/scb.md §6)."""
    kept = np.where(Q >= threshold, Q, 0.0)
    sums = kept.sum(axis=0)
    if np.any(sums <= 0):
        raise StageFailure(f"Stage-3 normalisation would empty a column: theta_3 = {threshold:g} is above every "
                           "entry of it")
    return kept / sums


def run_algorithm1(problem: SCBProblem, stage1: StageSettings, stage2: StageSettings, stage3: StageSettings, *,
                   seed: SeedLike, c1: float | None = None, C: float = 2.0, theta3: float | None = None,
                   least_squares_V: bool = False, record_every: int = 5) -> Trajectory:
    """Algorithm 1 (docs/scb.md §6) on real minibatches from V₀ = μ1ᵀ, Q₀ = (1/T)11ᵀ.

    Stage 1 (λ = 0) → rounding at θ₁ = (1 − c₁)/T + c₁/(2C·sparsity), with c₁ the α_Q reached (an oracle
    read-out, docs/scb.md §13 #9–10; pass ``c1`` to fix it) → Stage 2 (λ > 0) → normalisation at θ₃ (default
    ½·min nonzero of Q*·α_Q, the docs/scb.md §11 default) → Stage 3 (V alone), or V = V_LS(Q) with ``least_squares_V``.
    The Trajectory's metrics are RECORD_NAMES[1:] against the step; ``info['boundaries']`` marks the stages.
    """
    if c1 is not None:
        c1 = check.real(c1, "c1", minimum=0.0, strict=True)
    seeds = spawn(seed, 3)
    first = run_stage1(problem, stage1, seed=seeds[0], record_every=record_every)
    alpha_Q = first.last("alpha_Q") if c1 is None else c1
    rest = run_stages_2_3(problem, (first.final["V"], first.final["Q"]), stage2, seed=seeds[1], alpha_Q=alpha_Q, C=C,
                          theta3=theta3, least_squares_V=least_squares_V, offset=stage1.steps,
                          record_every=record_every)
    runs = [first, rest]
    if not least_squares_V:
        frozen = StageSettings(stage3.steps, stage3.batch, stage3.eta, 0.0, False, stage3.eta_V)
        runs.append(run_stage(problem, (rest.final["V"], rest.final["Q"]), frozen, seed=seeds[2],
                              offset=stage1.steps + stage2.steps, record_every=record_every))
    return _joined(runs, runs[-1].final["V"], runs[-1].final["Q"])


def run_sgd(problem: SCBProblem, stage: StageSettings, *, seed: SeedLike, start=None, offset: int = 0,
            record_every: int = 5) -> Trajectory:
    """The baseline of docs/scb.md §13 #14: the same preconditioned projected update with λ = 0 and no rounding, from
    (V₀, Q₀) or from ``start`` = (V, Q) (e.g. the state after a shared Stage 1)."""
    plain = StageSettings(stage.steps, stage.batch, stage.eta, 0.0, True, stage.eta_V)
    return run_stage(problem, start or problem.initial_point(), plain, seed=seed, offset=offset,
                     record_every=record_every)


def run_stages_2_3(problem: SCBProblem, start, stage2: StageSettings, *, seed: SeedLike, alpha_Q: float,
                   C: float = 2.0, theta3: float | None = None, least_squares_V: bool = True, offset: int = 0,
                   record_every: int = 5) -> Trajectory:
    """Rounding at θ₁ = (1 − α_Q)/T + α_Q/(2C·sparsity) (for the α_Q reached), proximal Stage 2, normalisation at
    θ₃ (default ½α_Q·min q*, with the α_Q after Stage 2) and, with ``least_squares_V``, V = V_LS(Q) (the paper's
    experiment variant of Stage 3), from ``start`` = (V, Q) after Stage 1."""
    alpha_Q = check.real(alpha_Q, "alpha_Q")
    C = check.real(C, "C", minimum=1.0)
    V, Q = _start_matrices(problem, start)
    Q = round_columns(Q, rounding_threshold(problem, alpha_Q, C))
    run = run_stage(problem, (V, Q), stage2, seed=seed, offset=offset, record_every=record_every)
    V, Q = run.final["V"], run.final["Q"]
    if theta3 is None:
        alpha_Q_end = run.last("alpha_Q")
        if alpha_Q_end <= 0:
            raise StageFailure(f"Stage 2 ended at alpha_Q = {alpha_Q_end:.3g} <= 0, so the default theta_3 = "
                               "½·alpha_Q·min q* is not positive: the run lost the attention signal (batch too small?)")
        theta3 = 0.5 * alpha_Q_end * problem.Q_star[problem.Q_star > 0].min()
    Q = _normalise_columns(Q, check.real(theta3, "theta3", minimum=0.0, strict=True))
    if least_squares_V:
        V = cf.least_squares_V(problem, Q)
    run.info["boundaries"] = [offset + stage2.steps]
    return replace(run, final=dict(V=V, Q=Q))


def run_stage1(problem: SCBProblem, stage1: StageSettings, *, seed: SeedLike, record_every: int = 5) -> Trajectory:
    """Stage 1 alone (λ = 0) from (V₀, Q₀)."""
    run = run_stage(problem, problem.initial_point(), stage1, seed=seed, record_every=record_every)
    run.info["boundaries"] = [stage1.steps]
    return run


def relative_errors(problem: SCBProblem, V, Q) -> tuple[float, float]:
    """(‖V − P‖_μ/√K_P, ‖Q − Q*‖_μ/√K_Q): the distances of docs/scb.md §13 #16."""
    V = check.finite_array(V, "V", shape=(problem.N, problem.N))
    Q = check.finite_array(Q, "Q", shape=(problem.T, problem.N))
    return (math.sqrt(cf.mu_norm2(problem, V - problem.P) / problem.K_P),
            math.sqrt(cf.mu_norm2(problem, Q - problem.Q_star) / problem.K_Q))


def off_support_noise(problem: SCBProblem, V, Q, *, batch: int = 1024, n_batches: int = 100,
                      seed: SeedLike) -> tuple[float, float]:
    """E of the off-support spread (:func:`~attnflow.closed_forms.scb.off_support_spread`) of one sample's
    preconditioned attention gradient at (V, Q), and its standard error: B times the spread of a batch-B gradient,
    averaged over ``n_batches`` independent batches (docs/scb.md §9). At a stationary point such as (P, Q*) at
    λ = 0, where the mean gradient vanishes, one step of η_Q on a batch of B adds η_Q²/B times this to the spread."""
    batch = check.integer(batch, "batch", minimum=1)
    n_batches = check.integer(n_batches, "n_batches", minimum=2)
    if n_batches > MAX_NOISE_BATCHES:
        raise ValueError(f"n_batches must be <= {MAX_NOISE_BATCHES} (one gradient call each), got {n_batches}")
    if batch * n_batches * problem.T > 10**10:
        raise ValueError(f"batch·n_batches·T must be at most 10^10 (run time), got {batch * n_batches * problem.T}")
    values = np.array([batch * cf.off_support_spread(problem, minibatch_gradients(problem, V, Q, batch, seed=child,
                                                                                  raw=False)["G_Q"])
                       for child in spawn(seed, n_batches)])
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n_batches))


def transfer_step(problem: SCBProblem, P_tilde, gamma: float, batch0: int, *, seed: SeedLike) -> Trajectory:
    """The first move of transfer learning (Theorem 4.1, docs/scb.md §6): from the pretrained value layer, one Q-step of
    size η₀ (:func:`attnflow.closed_forms.scb.transfer_step_size`) on a batch of ``batch0`` with V untouched (in the population it lands
    exactly at α_Q = 1). Returns the one-step Trajectory; (V, Q) after it are in ``final``."""
    batch0 = check.integer(batch0, "batch0", minimum=1)
    if batch0 > MAX_STAGE_BATCH:
        raise ValueError(f"batch0 must be <= {MAX_STAGE_BATCH}, got {batch0}")
    start = cf.transfer_start(problem, P_tilde, gamma)
    eta0 = cf.transfer_step_size(problem, P_tilde, gamma)
    step = StageSettings(1, batch0, eta0 * problem.K_P, 0.0, True, eta_V=0.0)  # η_Q = η₀; V is not moved
    return run_stage(problem, start, step, seed=seed, record_every=1)


def run_transfer(problem: SCBProblem, P_tilde, gamma: float, batch0: int, stage2: StageSettings, *, seed: SeedLike,
                 C: float = 2.0, record_every: int = 5) -> Trajectory:
    """Transfer learning (Theorem 4.1, docs/scb.md §6) on minibatches: :func:`transfer_step`, then round, Stage 2,
    normalise and V_LS (:func:`run_stages_2_3`). ``info['samples']`` counts every sample used."""
    first, second = spawn(seed, 2)
    step = transfer_step(problem, P_tilde, gamma, batch0, seed=first)
    rest = run_stages_2_3(problem, (step.final["V"], step.final["Q"]), stage2, seed=second,
                          alpha_Q=step.last("alpha_Q"), C=C, offset=1, record_every=record_every)
    return _joined([step, rest], rest.final["V"], rest.final["Q"])


# ==================================================================================================
# The diffusion tier in the reduced coordinates (docs/scb.md §14, docs/diffusion.md)
# ==================================================================================================


@dataclass(frozen=True)
class ContextSample:
    """Contexts (x_1..x_T, k) drawn from the data model, in ``n_batches`` equal batches, on which the
    label-integrated noise moments are averaged; reused at every step (common random numbers)."""

    tokens: np.ndarray
    last: np.ndarray
    n_batches: int


def context_sample(problem: SCBProblem, n_contexts: int, *, seed: SeedLike, n_batches: int = 16) -> ContextSample:
    n_contexts = pool_size(n_contexts, n_batches)
    if n_contexts * problem.T > 10**9:
        raise ValueError(f"n_contexts·T must be at most 10^9 (memory), got {n_contexts * problem.T}")
    rng = np.random.default_rng(spawn(seed, 1)[0])
    return ContextSample(tokens=rng.choice(problem.N, size=(n_contexts, problem.T), p=problem.mu),
                         last=rng.choice(problem.N, size=n_contexts, p=problem.mu), n_batches=n_batches)


def reduced_noise(problem: SCBProblem, alpha_V: float, alpha_Q: float, contexts: ContextSample) -> dict:
    """The per-sample gradient noise at the line point (α_V, α_Q), in the reduced coordinates, one unbiased
    estimate per batch of ``contexts`` (arrays of length n_batches; docs/scb.md §14):

    ``cov`` (n_batches, 2, 2): Cov of (n_V/K_P, n_Q/K_Q), the noise of one sample along the two lines;
    ``perp_V``, ``perp_Q``: E‖ξ_⊥‖²_μ, the noise off the lines, which feeds e_V and e_Q;
    ``total_V``, ``total_Q``: E‖ξ‖²_μ = tr Cov_μ of the preconditioned per-sample gradient."""
    V, Q = cf.line_point(problem, alpha_V, alpha_Q)
    G_V, G_Q = cf.preconditioned_gradients(problem, V, Q)
    dir_V = problem.P - problem.mu[:, None]
    dir_Q = problem.Q_star - 1.0 / problem.T
    g = np.array([cf.mu_inner(problem, G_V, dir_V), cf.mu_inner(problem, G_Q, dir_Q)])
    m = contexts.tokens.shape[0] // contexts.n_batches
    out = dict(cov=[], perp_V=[], perp_Q=[], total_V=[], total_Q=[])
    scale = np.array([problem.K_P, problem.K_Q])
    for b in range(contexts.n_batches):
        part = slice(b * m, (b + 1) * m)
        sums, _ = cf.label_integrated_noise_sums(problem, contexts.tokens[part], contexts.last[part], V, Q)
        mean = dict(zip(cf.NOISE_MOMENT_NAMES, sums / m))
        second = np.array([[mean["n_v2"], mean["n_vq"]], [mean["n_vq"], mean["n_q2"]]])
        cov = second - np.outer(g, g)  # the conditional means average to the closed-form ⟨G, dir⟩_μ
        total_V = mean["norm2_v"] - cf.mu_norm2(problem, G_V)
        total_Q = mean["norm2_q"] - cf.mu_norm2(problem, G_Q)
        out["cov"].append(cov / np.outer(scale, scale))
        out["total_V"].append(total_V)
        out["total_Q"].append(total_Q)
        out["perp_V"].append(total_V - cov[0, 0] / problem.K_P)
        out["perp_Q"].append(total_Q - cov[1, 1] / problem.K_Q)
    return {key: np.array(value) for key, value in out.items()}


@dataclass(frozen=True)
class ReducedBand:
    """The diffusion tier's prediction for Stage 1 at the recorded steps (docs/scb.md §14).

    alpha (n, 2): mean (α_V, α_Q); alpha_cov (n, 2, 2): their covariance; e_V, e_Q (n,): the mean off-line errors
    E‖ΔV‖²_μ, E‖ΔQ‖²_μ; each with a standard error (``*_se``) from the Monte-Carlo error of the noise moments.
    paper_e_V (n,): E‖ΔV‖²_μ when the whole tr Cov_μ(∇̃_Vℓ) is fed into ΔV, as docs/scb.md §8.2 states the paper's
    "population gradient + Gaussian noise" recursion."""

    steps: np.ndarray
    alpha: np.ndarray
    alpha_cov: np.ndarray
    alpha_cov_se: np.ndarray
    e_V: np.ndarray
    e_V_se: np.ndarray
    e_Q: np.ndarray
    e_Q_se: np.ndarray
    paper_e_V: np.ndarray


def stage1_noise_band(problem: SCBProblem, eta: float, batch: int, steps: int, contexts: ContextSample, *,
                      record_every: int = 5) -> ReducedBand:
    """Stage 1 (λ = 0) on batches of ``batch`` from (V₀, Q₀), in the reduced coordinates: the closure map of
    docs/scb.md §8.2 for the means, driven by the noise of :func:`reduced_noise` (docs/scb.md §14):

        e_V⁺ = (1 − η_V a)²e_V + (η_V²/B)E‖ξ_V⊥‖²_μ,   e_Q⁺ = (1 − η_Q A_V)²e_Q + (η_Q²/B)E‖ξ_Q⊥‖²_μ,
        C⁺ = J C Jᵀ + (1/B)·diag(η_V, η_Q)·Cov(n_V/K_P, n_Q/K_Q)·diag(η_V, η_Q),

    J the Jacobian of the (α_V, α_Q) part of the closure map. The noise is evaluated on the line at the mean α.
    ``batch = math.inf`` is the noiseless limit: the line map itself, with C = e_V = e_Q = 0."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    if not (isinstance(batch, float) and batch == math.inf):
        batch = check.integer(batch, "batch", minimum=1)
        if batch > MAX_STAGE_BATCH:
            raise ValueError(f"batch must be <= {MAX_STAGE_BATCH} (or math.inf, the noiseless limit), got {batch}")
    steps = check.integer(steps, "steps", minimum=1)
    if steps > MAX_STEPS:
        raise ValueError(f"steps must be <= {MAX_STEPS:.0e}, got {steps}")
    record_every = check.integer(record_every, "record_every", minimum=1)
    # numpy scalars: an overflow gives inf (caught below and named), not a Python OverflowError
    eta_V, eta_Q = np.float64(eta / problem.K_Q), np.float64(eta / problem.K_P)
    K_P, K_Q, T = problem.K_P, problem.K_Q, problem.T
    params = cf.pack_line_params(problem, eta_V, eta_Q)
    step_sizes = np.diag([eta_V, eta_Q])
    n_b = contexts.n_batches
    alpha = np.zeros(2)
    C = np.zeros((n_b, 2, 2))
    e_V, e_Q, paper_e_V = np.zeros(n_b), np.zeros(n_b), 0.0
    rows = []

    def keep(step):
        rows.append((step, alpha.copy(), C.mean(axis=0), C.std(axis=0, ddof=1) / np.sqrt(n_b), e_V.mean(),
                     e_V.std(ddof=1) / np.sqrt(n_b), e_Q.mean(), e_Q.std(ddof=1) / np.sqrt(n_b), paper_e_V))

    keep(0)
    for step in range(1, steps + 1):
        progress.report(step - 1, steps)
        noise = reduced_noise(problem, alpha[0], alpha[1], contexts)
        a_V, a_Q = alpha
        e_V_mean, e_Q_mean = e_V.mean(), e_Q.mean()
        a = 1.0 / T + a_Q**2 * K_Q + e_Q_mean  # the closure map's a and A_V: the contractions of e_V, e_Q and J
        A_V = a_V**2 * K_P + e_V_mean
        J = np.array([[1 - eta_V * a, -eta_V * K_Q * (2 * a_Q * a_V - 1)],
                      [-eta_Q * K_P * (2 * a_V * a_Q - 1), 1 - eta_Q * A_V]])
        C = J @ C @ J.T + step_sizes @ noise["cov"] @ step_sizes / batch
        e_V = (1 - eta_V * a) ** 2 * e_V + eta_V**2 * noise["perp_V"] / batch
        e_Q = (1 - eta_Q * A_V) ** 2 * e_Q + eta_Q**2 * noise["perp_Q"] / batch
        paper_e_V = (1 - eta_V * a) ** 2 * paper_e_V + eta_V**2 * noise["total_V"].mean() / batch
        alpha = cf.closure_map_step(step, np.array([a_V, a_Q, e_V_mean, e_Q_mean]), params)[:2]  # the mean path
        if not (np.all(np.isfinite(alpha)) and np.all(np.isfinite(C)) and np.all(np.isfinite(e_V))
                and np.all(np.isfinite(e_Q)) and np.all(np.abs(alpha) < BLOWUP)):
            raise DivergenceError(f"the reduced noise band diverged at step {step} (try a smaller eta)")
        if step % record_every == 0 or step == steps:
            keep(step)
    columns = list(zip(*rows))
    return ReducedBand(steps=np.array(columns[0]), alpha=np.array(columns[1]), alpha_cov=np.array(columns[2]),
                       alpha_cov_se=np.array(columns[3]), e_V=np.array(columns[4]), e_V_se=np.array(columns[5]),
                       e_Q=np.array(columns[6]), e_Q_se=np.array(columns[7]), paper_e_V=np.array(columns[8]))


def offline_errors(problem: SCBProblem, run: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """e_V, e_Q along a recorded minibatch run, from its α's and distances by Pythagoras in the μ-norm:
    ‖V − P‖²_μ = (α_V − 1)²K_P + e_V and ‖Q − Q*‖²_μ = (α_Q − 1)²K_Q + e_Q (docs/scb.md §8.1)."""
    m = run.metrics
    return (m["dist_V"] ** 2 - (m["alpha_V"] - 1) ** 2 * problem.K_P,
            m["dist_Q"] ** 2 - (m["alpha_Q"] - 1) ** 2 * problem.K_Q)


# ==================================================================================================
# The System contract: population(problem, **options) and minibatch(problem, *, seed, **options)
# ==================================================================================================

ETA = 0.25  # the normalised step of docs/scb.md §11


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("eta", "real", ETA, "normalised step η (η_V = η/K_Q, η_Q = η/K_P)", minimum=0.0, strict=True),
    Parameter("steps", "integer", 100, "population steps on the line", minimum=1, maximum=10_000_000),
)
MINIBATCH_OPTIONS = (
    Parameter("eta", "real", ETA, "normalised step η", minimum=0.0, strict=True),
    Parameter("lam", "real", 0.01, "ℓ₁ strength λ of Stage 2", minimum=0.0),
    *(Parameter(f"stage{k}_{what}", "integer", default, f"Stage {k}: {label}", minimum=1, maximum=maximum)
      for k, steps, batch in ((1, 40, 8000), (2, 150, 2000), (3, 80, 4000))
      for what, default, label, maximum in (("steps", steps, "steps", MAX_STEPS),
                                            ("batch", batch, "samples per step", MAX_STAGE_BATCH))),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: SCBProblem, *, eta: float, steps: int) -> Trajectory:
    """The population map on the line (eq. 7) with η_V = η/K_Q, η_Q = η/K_P: :func:`line_trajectory`."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    if check.integer(steps, "steps", minimum=1) > MAX_STEPS:  # the option's bounds (POPULATION_OPTIONS)
        raise ValueError(f"steps must be <= {MAX_STEPS:.0e}, got {steps}")
    return line_trajectory(problem, eta / problem.K_Q, eta / problem.K_P, steps)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: SCBProblem, *, seed: SeedLike, eta: float, lam: float, stage1_steps: int, stage1_batch: int,
              stage2_steps: int, stage2_batch: int, stage3_steps: int, stage3_batch: int) -> Trajectory:
    """Algorithm 1 on fresh minibatches (:func:`run_algorithm1`), Stage 3 with η_V = 0.1/K_Q as in docs/scb.md §11.
    The options, their defaults and bounds are MINIBATCH_OPTIONS, the records of ``attnflow simulate scb --param``."""
    return run_algorithm1(problem, StageSettings(stage1_steps, stage1_batch, eta),
                          StageSettings(stage2_steps, stage2_batch, eta, lam=lam),
                          StageSettings(stage3_steps, stage3_batch, eta, eta_V=0.1 / problem.K_Q),
                          seed=seed)
