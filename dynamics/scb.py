"""Sparse Contextual Bigram: a streaming minibatch sampler and Algorithm 1 on real minibatches.

Samples are drawn inside numba kernels from the seeded numba generator and consumed at once (spec §2: positions
x₁…x_T, x_{T+1} i.i.d. ~ μ, s ~ q*⁽ᵏ⁾, o ~ Pe_{x_s}), so memory stays flat in the batch size and in the number of
steps. The numba generator is seeded from ``numpy.random.SeedSequence`` at the start of every stage, so a run is
determined by its seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from closed_forms import scb as cf
from closed_forms import validation as check
from closed_forms.scb import SCBProblem

from .integrate import DivergenceError, dopri5_loop, iterate_map, map_loop, solve_dopri5
from .montecarlo import SeedLike, seed_sequence

__all__ = ["minibatch_gradients", "line_trajectory", "normalised_flow", "StageSettings", "AlgorithmRun", "run_algorithm1",
           "run_sgd", "run_stage1", "run_stages_2_3", "StageFailure", "rounding_threshold", "rounding_finds_supports",
           "transfer_start", "transfer_step", "run_transfer", "kernel_seed", "relative_errors"]


def kernel_seed(seed: SeedLike) -> int:
    """A 63-bit seed for numba's generator, drawn from a SeedSequence (reproducible, worker-independent)."""
    return int(seed_sequence(seed).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def _cdfs(problem: SCBProblem):
    """Cumulative laws for inverse-CDF sampling: μ (N), and, one per row, the columns of Q* (N × T) and of P (N × N)."""
    mu_cdf = np.cumsum(problem.mu)
    mu_cdf[-1] = 1.0
    Qs_cdf = np.cumsum(problem.Q_star, axis=0)
    Qs_cdf[-1, :] = 1.0
    P_cdf = np.cumsum(problem.P, axis=0)
    P_cdf[-1, :] = 1.0
    return mu_cdf, np.ascontiguousarray(Qs_cdf.T), np.ascontiguousarray(P_cdf.T)


@njit(cache=True)
def _draw(cdf):
    return np.searchsorted(cdf, np.random.random(), side="right")


@njit(cache=True)
def _batch_gradients(V, Q, mu, mu_cdf, Qs_cdf, P_cdf, batch, want_raw):
    """Batch means of the loss, the preconditioned gradients (eq. 4) and, if ``want_raw``, the raw ones, from
    ``batch`` fresh samples (Lemma B.3 per sample; spec §5's per-sample forms).

    Per sample: r = e_o − Vy over the tokens present in the context, ∇_V = −r yᵀ (preconditioned:
    −r(D⁻¹y − (1ᵀy)1)ᵀ) and ∇_{q⁽ᵏ⁾} = −XᵀVᵀr = −w[x_t] with w = Vᵀr. The kernel works on Vᵀ and accumulates
    ∇_Vᵀ so every inner loop runs over contiguous memory.
    """
    N, T = V.shape[0], Q.shape[0]
    Vt = np.ascontiguousarray(V.T)
    G_Vt = np.zeros((N, N))
    G_Q = np.zeros((T, N))
    raw_Vt = np.zeros((N, N)) if want_raw else np.zeros((1, 1))
    raw_Q = np.zeros((T, N)) if want_raw else np.zeros((1, 1))
    dense_r = np.zeros(N)  # Σ (1ᵀy) r: the rank-one part of the preconditioned V-gradient
    x = np.empty(T, np.int64)
    y = np.zeros(N)
    seen = np.zeros(N, np.bool_)
    present = np.empty(N, np.int64)  # the distinct tokens of the context: y is supported on them
    r = np.empty(N)
    w = np.empty(N)
    loss = 0.0
    for _ in range(batch):
        for t in range(T):
            x[t] = _draw(mu_cdf)
        k = _draw(mu_cdf)
        s = _draw(Qs_cdf[k])
        o = _draw(P_cdf[x[s]])
        n_present = 0
        for t in range(T):
            token = x[t]
            if not seen[token]:
                seen[token] = True
                present[n_present] = token
                n_present += 1
            y[token] += Q[t, k]
        total = 0.0
        r[:] = 0.0
        for m in range(n_present):
            j = present[m]
            total += y[j]
            yj = y[j]
            row = Vt[j]
            for i in range(N):
                r[i] -= row[i] * yj
        r[o] += 1.0
        for i in range(N):
            loss += 0.5 * r[i] * r[i]
            dense_r[i] += total * r[i]
        for m in range(n_present):
            j = present[m]
            scale = y[j] / mu[j]
            row = G_Vt[j]
            for i in range(N):
                row[i] -= r[i] * scale
        if want_raw:
            for m in range(n_present):
                j = present[m]
                for i in range(N):
                    raw_Vt[j, i] -= r[i] * y[j]
        # Q column k: −μ_k⁻¹(I − 11ᵀ/T)XᵀVᵀr, i.e. the centred −w[x_t]
        for j in range(N):
            acc = 0.0
            row = Vt[j]
            for i in range(N):
                acc += row[i] * r[i]
            w[j] = acc
        w_mean = 0.0
        for t in range(T):
            w_mean += w[x[t]]
        w_mean /= T
        inv_mu = 1.0 / mu[k]
        for t in range(T):
            G_Q[t, k] -= (w[x[t]] - w_mean) * inv_mu
        if want_raw:
            for t in range(T):
                raw_Q[t, k] -= w[x[t]]
        for m in range(n_present):
            y[present[m]] = 0.0
            seen[present[m]] = False
    G_V = np.ascontiguousarray(G_Vt.T)
    for i in range(N):
        for j in range(N):
            G_V[i, j] += dense_r[i]
    raw_V = np.ascontiguousarray(raw_Vt.T)
    return loss / batch, G_V / batch, G_Q / batch, raw_V / batch, raw_Q / batch


def minibatch_gradients(problem: SCBProblem, V, Q, batch: int, seed: SeedLike, *, raw: bool = True) -> dict:
    """Loss and gradients averaged over ``batch`` fresh samples of the raw data model (for tests and diagnostics)."""
    V = check.finite_array(V, "V", shape=(problem.N, problem.N))
    Q = check.finite_array(Q, "Q", shape=(problem.T, problem.N))
    batch = check.integer(batch, "batch", minimum=1)
    mu_cdf, Qs_cdf, P_cdf = _cdfs(problem)
    _seed_numba(kernel_seed(seed))
    loss, G_V, G_Q, raw_V, raw_Q = _batch_gradients(np.ascontiguousarray(V), np.ascontiguousarray(Q), problem.mu,
                                                    mu_cdf, Qs_cdf, P_cdf, batch, raw)
    out = dict(loss=loss, G_V=G_V, G_Q=G_Q)
    if raw:
        out.update(grad_V=raw_V, grad_Q=raw_Q)
    return out


@njit(cache=True)
def _seed_numba(seed):
    np.random.seed(seed)


# ==================================================================================================
# The 2-D line map through the integrator engine
# ==================================================================================================


@njit(cache=True)
def _line_loop(x0, n_steps, record_steps, params, blowup):
    return map_loop(cf.line_map_step, x0, n_steps, record_steps, params, blowup)


def line_trajectory(problem: SCBProblem, eta_V: float, eta_Q: float, steps: int, x0=(0.0, 0.0)):
    """The population map on the line (eq. 7) from (α_V, α_Q) = x0, every step recorded: returns (steps+1, 2)."""
    steps = check.integer(steps, "steps", minimum=0)
    x0 = check.finite_array(x0, "x0", shape=(2,))
    sol = iterate_map(cf.line_map_step, x0, steps, cf.pack_line_params(problem, eta_V, eta_Q),
                      loop=_line_loop)
    return sol.y


@njit(cache=True)
def _flow_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    return dopri5_loop(cf.normalised_flow_rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def normalised_flow(epsilon: float, x0, taus, *, rtol: float = 1e-10, atol: float = 1e-13) -> np.ndarray:
    """The normalised gradient flow of spec §8.3 from x0 = (α_V, α_Q), at the times ``taus`` (DOPRI5); (n, 2)."""
    epsilon = check.real(epsilon, "epsilon", minimum=0.0)
    return solve_dopri5(cf.normalised_flow_rhs, np.asarray(x0, float), taus, [epsilon], t0=0.0, rtol=rtol, atol=atol,
                        loop=_flow_dopri5).y


# ==================================================================================================
# Algorithm 1 on real minibatches (spec §6)
# ==================================================================================================


@njit(cache=True)
def _stage_kernel(V, Q, mu, mu_cdf, Qs_cdf, P_cdf, P, Q_star, K_P, K_Q, eta_V, eta_Q, lam, batch, steps,
                  train_Q, record_every, blowup):
    """``steps`` preconditioned minibatch steps in place; λ > 0 adds the soft threshold η_Qλ before the affine
    column projection (eq. 6). Records (α_V, α_Q, ‖V − P‖_μ, ‖Q − Q*‖_μ, max|1ᵀV − 1ᵀ|, max|Vμ − μ|,
    max|1ᵀQ − 1ᵀ|, loss) every ``record_every`` steps and after the last. Returns (records, violations, failed step
    or −1): a step fails when an entry of V or Q is non-finite or beyond ``blowup`` in size."""
    N, T = V.shape[0], Q.shape[0]
    n_rec = steps // record_every + 2
    rec = np.full((n_rec, 9), np.nan)
    j = 0
    theta = eta_Q * lam
    violations = 0
    for step in range(steps + 1):
        if step % record_every == 0 or step == steps:
            rec[j, 0] = step
            rec[j, 1:8] = _metrics(V, Q, mu, P, Q_star, K_P, K_Q)
            j += 1
        if step == steps:
            break
        loss, G_V, G_Q, _, _ = _batch_gradients(V, Q, mu, mu_cdf, Qs_cdf, P_cdf, batch, False)
        if step % record_every == 0:
            rec[j - 1, 8] = loss  # the minibatch loss at the recorded state (nan at the final record)
        for a in range(N):
            for b in range(N):
                V[a, b] -= eta_V * G_V[a, b]
        if train_Q:
            for k in range(N):
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
                shift = (1.0 - Q[:, k].sum()) / T
                for t in range(T):
                    Q[t, k] += shift
        if not (np.abs(V).max() < blowup and np.abs(Q).max() < blowup):  # also catches nan and inf
            return rec[:j], violations, step + 1
    return rec[:j], violations, -1


@njit(cache=True)
def _metrics(V, Q, mu, P, Q_star, K_P, K_Q):
    N, T = V.shape[0], Q.shape[0]
    out = np.empty(7)
    inner_V = 0.0
    inner_Q = 0.0
    dist_V = 0.0
    dist_Q = 0.0
    for k in range(N):
        for i in range(N):
            inner_V += mu[k] * (V[i, k] - mu[i]) * (P[i, k] - mu[i])
            dist_V += mu[k] * (V[i, k] - P[i, k]) ** 2
        for t in range(T):
            inner_Q += mu[k] * (Q[t, k] - 1.0 / T) * (Q_star[t, k] - 1.0 / T)
            dist_Q += mu[k] * (Q[t, k] - Q_star[t, k]) ** 2
    out[0] = inner_V / K_P
    out[1] = inner_Q / K_Q
    out[2] = math.sqrt(dist_V)
    out[3] = math.sqrt(dist_Q)
    out[4] = np.abs(V.sum(axis=0) - 1.0).max()
    out[5] = np.abs(V @ mu - mu).max()
    out[6] = np.abs(Q.sum(axis=0) - 1.0).max()
    return out


BLOWUP = 1e6  # |entries| of V and Q stay O(1) on the stochastic constraint sets; beyond this the run has diverged
RECORD_NAMES = ("step", "alpha_V", "alpha_Q", "dist_V", "dist_Q", "colsum_V", "stationarity_V", "colsum_Q", "loss")


@dataclass(frozen=True)
class StageSettings:
    """One stage: ``steps`` minibatch steps of size ``batch`` with normalised step η (η_V = η/K_Q, η_Q = η/K_P,
    spec §5) and ℓ₁ strength λ; ``train_Q=False`` freezes the attention (Stage 3)."""

    steps: int
    batch: int
    eta: float
    lam: float = 0.0
    train_Q: bool = True
    eta_V: float | None = None  # overrides η/K_Q (Stage 3 of spec §11 uses 0.1/K_Q)

    def __post_init__(self):
        object.__setattr__(self, "steps", check.integer(self.steps, "steps", minimum=0))
        object.__setattr__(self, "batch", check.integer(self.batch, "batch", minimum=1))
        object.__setattr__(self, "eta", check.real(self.eta, "eta", minimum=0.0, strict=True))
        object.__setattr__(self, "lam", check.real(self.lam, "lam", minimum=0.0))
        if self.eta_V is not None:  # 0 freezes V (the transfer step)
            object.__setattr__(self, "eta_V", check.real(self.eta_V, "eta_V", minimum=0.0))


@dataclass
class AlgorithmRun:
    """Records of every stage (rows of RECORD_NAMES, step counted from the start of the run), the final (V, Q),
    the stage boundaries and the count of soft-threshold violations (entries below −η_Qλ, spec §13 #4)."""

    records: np.ndarray
    V: np.ndarray
    Q: np.ndarray
    boundaries: list = field(default_factory=list)
    violations: int = 0
    samples: int = 0

    def series(self, name: str) -> np.ndarray:
        return self.records[:, RECORD_NAMES.index(name)]


def _run_stage(problem, V, Q, stage: StageSettings, seed, offset, record_every):
    mu_cdf, Qs_cdf, P_cdf = _cdfs(problem)
    eta_V = stage.eta_V if stage.eta_V is not None else stage.eta / problem.K_Q
    eta_Q = stage.eta / problem.K_P
    _seed_numba(kernel_seed(seed))
    rec, violations, failed = _stage_kernel(V, Q, problem.mu, mu_cdf, Qs_cdf, P_cdf, problem.P, problem.Q_star,
                                            problem.K_P, problem.K_Q, eta_V, eta_Q, stage.lam, stage.batch,
                                            stage.steps, stage.train_Q, max(1, record_every), BLOWUP)
    if failed >= 0:
        raise DivergenceError(f"minibatch run diverged at step {offset + failed}: an entry of V or Q is non-finite "
                              f"or above {BLOWUP:g} in size (try a smaller step or a larger batch)")
    rec = rec.copy()
    rec[:, 0] += offset
    return rec, violations


def rounding_threshold(problem: SCBProblem, alpha_Q: float, C: float = 2.0) -> float:
    """θ₁ = (1 − α_Q)/T + α_Q/(2C·sparsity): midway between an off-support entry and the smallest support entry of
    the line point at α_Q (spec §13 #10)."""
    return (1 - alpha_Q) / problem.T + alpha_Q / (2 * C * problem.sparsity)


def rounding_finds_supports(problem: SCBProblem, Q, alpha_Q: float, C: float = 2.0) -> bool:
    """Whether rounding at θ₁ for ``alpha_Q`` keeps exactly the supports of Q* (Lemmas E.1–E.4's success)."""
    return bool(np.array_equal(np.asarray(Q) >= rounding_threshold(problem, alpha_Q, C), problem.Q_star > 0))


def _round_columns(Q: np.ndarray, threshold: float) -> np.ndarray:
    """Zero the entries below ``threshold``, then project every column back to 1ᵀq = 1 (spec §6, rounding)."""
    Q = np.where(Q < threshold, 0.0, Q)
    return Q + (1.0 - Q.sum(axis=0)) / Q.shape[0]


class StageFailure(RuntimeError):
    """A run ended in a state the next stage cannot start from (it lost the attention signal): not a bad input,
    an outcome — the critical-batch search counts it as a failure at that batch."""


def _normalise_columns(Q: np.ndarray, threshold: float) -> np.ndarray:
    """q ← q·1{q >= θ₃}/‖q·1{q >= θ₃}‖₁ (Stage 3, spec §6)."""
    kept = np.where(Q >= threshold, Q, 0.0)
    sums = kept.sum(axis=0)
    if np.any(sums <= 0):
        raise StageFailure(f"Stage-3 normalisation would empty a column: theta_3 = {threshold:g} is above every "
                           "entry of it")
    return kept / sums


def run_algorithm1(problem: SCBProblem, stage1: StageSettings, stage2: StageSettings, stage3: StageSettings, seed,
                   *, c1: float | None = None, C: float = 2.0, theta3: float | None = None,
                   least_squares_V: bool = False, record_every: int = 5) -> AlgorithmRun:
    """Algorithm 1 (spec §6) on real minibatches from V₀ = μ1ᵀ, Q₀ = (1/T)11ᵀ.

    Stage 1 (λ = 0) → rounding at θ₁ = (1 − c₁)/T + c₁/(2C·sparsity), with c₁ the α_Q reached (an oracle
    read-out, spec §13 #9–10; pass ``c1`` to fix it) → Stage 2 (λ > 0) → normalisation at θ₃ (default
    ½·min nonzero of Q*·α_Q, the spec §11 default) → Stage 3 (V alone), or V = V_LS(Q) with ``least_squares_V``.
    """
    if c1 is not None:
        c1 = check.real(c1, "c1", minimum=0.0, strict=True)
    seeds = seed_sequence(seed).spawn(3)
    first = run_stage1(problem, stage1, seeds[0], record_every=record_every)
    alpha_Q = float(first.records[-1, 2]) if c1 is None else c1
    rest = run_stages_2_3(problem, (first.V, first.Q), stage2, seeds[1], alpha_Q=alpha_Q, C=C, theta3=theta3,
                          least_squares_V=least_squares_V, offset=stage1.steps, record_every=record_every)
    records = [first.records, rest.records]
    samples = first.samples + rest.samples
    V, Q = rest.V, rest.Q
    if not least_squares_V:
        frozen = StageSettings(stage3.steps, stage3.batch, stage3.eta, 0.0, False, stage3.eta_V)
        rec, _ = _run_stage(problem, V, Q, frozen, seeds[2], stage1.steps + stage2.steps, record_every)
        records.append(rec)
        samples += stage3.steps * stage3.batch
    return AlgorithmRun(records=np.concatenate(records), V=V, Q=Q, boundaries=first.boundaries + rest.boundaries,
                        violations=first.violations + rest.violations, samples=samples)


def run_sgd(problem: SCBProblem, stage: StageSettings, seed, *, start=None, offset: int = 0,
            record_every: int = 5) -> AlgorithmRun:
    """The baseline of spec §13 #14: the same preconditioned projected update with λ = 0 and no rounding, from
    (V₀, Q₀) or from ``start`` = (V, Q) (e.g. the state after a shared Stage 1)."""
    V, Q = (np.array(m, dtype=float, order="C") for m in (start or problem.initial_point()))
    plain = StageSettings(stage.steps, stage.batch, stage.eta, 0.0, True, stage.eta_V)
    rec, vio = _run_stage(problem, V, Q, plain, seed, offset, record_every)
    return AlgorithmRun(records=rec, V=V, Q=Q, boundaries=[], violations=vio, samples=stage.steps * stage.batch)


def run_stages_2_3(problem: SCBProblem, start, stage2: StageSettings, seed, *, alpha_Q: float, C: float = 2.0,
                   theta3: float | None = None, least_squares_V: bool = True, offset: int = 0,
                   record_every: int = 5) -> AlgorithmRun:
    """Rounding at θ₁ = (1 − α_Q)/T + α_Q/(2C·sparsity) (for the α_Q reached), proximal Stage 2, normalisation at
    θ₃ (default ½α_Q·min q*, with the α_Q after Stage 2) and, with ``least_squares_V``, V = V_LS(Q) (the paper's
    experiment variant of Stage 3), from ``start`` = (V, Q) after Stage 1."""
    alpha_Q = check.real(alpha_Q, "alpha_Q")
    C = check.real(C, "C", minimum=1.0)
    V, Q = (np.array(m, dtype=float, order="C") for m in start)
    Q[:] = _round_columns(Q, rounding_threshold(problem, alpha_Q, C))
    rec, vio = _run_stage(problem, V, Q, stage2, seed, offset, record_every)
    if theta3 is None:
        alpha_Q_end = float(rec[-1, 2])
        if alpha_Q_end <= 0:
            raise StageFailure(f"Stage 2 ended at alpha_Q = {alpha_Q_end:.3g} <= 0, so the default theta_3 = "
                               "½·alpha_Q·min q* is not positive: the run lost the attention signal (batch too small?)")
        theta3 = 0.5 * alpha_Q_end * problem.Q_star[problem.Q_star > 0].min()
    Q[:] = _normalise_columns(Q, check.real(theta3, "theta3", minimum=0.0, strict=True))
    if least_squares_V:
        V[:] = cf.least_squares_V(problem, Q)
    return AlgorithmRun(records=rec, V=V, Q=Q, boundaries=[offset + stage2.steps], violations=vio,
                        samples=stage2.steps * stage2.batch)


def run_stage1(problem: SCBProblem, stage1: StageSettings, seed, *, record_every: int = 5) -> AlgorithmRun:
    """Stage 1 alone (λ = 0) from (V₀, Q₀)."""
    V, Q = (np.ascontiguousarray(m) for m in problem.initial_point())
    rec, vio = _run_stage(problem, V, Q, stage1, seed, 0, record_every)
    return AlgorithmRun(records=rec, V=V, Q=Q, boundaries=[stage1.steps], violations=vio,
                        samples=stage1.steps * stage1.batch)


def relative_errors(problem: SCBProblem, V, Q) -> tuple[float, float]:
    """(‖V − P‖_μ/√K_P, ‖Q − Q*‖_μ/√K_Q): the distances of spec §13 #16."""
    return (math.sqrt(cf.mu_norm2(problem, np.asarray(V) - problem.P) / problem.K_P),
            math.sqrt(cf.mu_norm2(problem, np.asarray(Q) - problem.Q_star) / problem.K_Q))


def transfer_start(problem: SCBProblem, P_tilde, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(V₀, Q₀) = (μ1ᵀ + γ(P̃ − μ1ᵀ), (1/T)11ᵀ): the transfer initialisation of spec §6 (needs P̃μ = μ)."""
    P_tilde = check.finite_array(P_tilde, "P_tilde", shape=(problem.N, problem.N))
    if np.abs(P_tilde @ problem.mu - problem.mu).max() > 1e-9:
        raise ValueError("P_tilde must have the task's stationary law: P_tilde @ mu == mu")
    gamma = check.real(gamma, "gamma", minimum=0.0, strict=True, maximum=1.0)
    base = np.outer(problem.mu, np.ones(problem.N))
    return base + gamma * (P_tilde - base), np.full((problem.T, problem.N), 1.0 / problem.T)


def transfer_step(problem: SCBProblem, P_tilde, gamma: float, batch0: int, seed):
    """The first move of transfer learning (Theorem 4.1, spec §6): from the pretrained value layer, one Q-step of
    size η₀ = 1/(γ<P̃ − μ1ᵀ, P − μ1ᵀ>_μ) on a batch of ``batch0`` with V untouched (in the population it lands
    exactly at α_Q = 1). Returns (V, Q, records of the step)."""
    batch0 = check.integer(batch0, "batch0", minimum=1)
    V, Q = transfer_start(problem, P_tilde, gamma)
    V, Q = np.ascontiguousarray(V), np.ascontiguousarray(Q)
    base = np.outer(problem.mu, np.ones(problem.N))
    overlap = cf.mu_inner(problem, np.asarray(P_tilde) - base, problem.P - base)
    if overlap <= 0:
        raise ValueError("P_tilde must be positively correlated with P (<P_tilde − μ1ᵀ, P − μ1ᵀ>_μ > 0)")
    eta0 = 1.0 / (gamma * overlap)
    step = StageSettings(1, batch0, eta0 * problem.K_P, 0.0, True, eta_V=0.0)  # η_Q = η₀; V is not moved
    rec, _ = _run_stage(problem, V, Q, step, seed, 0, 1)
    return V, Q, rec


def run_transfer(problem: SCBProblem, P_tilde, gamma: float, batch0: int, stage2: StageSettings, seed, *,
                 C: float = 2.0, record_every: int = 5) -> AlgorithmRun:
    """Transfer learning (Theorem 4.1, spec §6) on minibatches: :func:`transfer_step`, then round, Stage 2,
    normalise and V_LS (:func:`run_stages_2_3`). ``samples`` counts every sample used."""
    first, second = seed_sequence(seed).spawn(2)
    V, Q, rec = transfer_step(problem, P_tilde, gamma, batch0, first)
    run = run_stages_2_3(problem, (V, Q), stage2, second, alpha_Q=float(rec[-1, 2]), C=C, offset=1,
                         record_every=record_every)
    run.records = np.concatenate([rec, run.records])
    run.samples += batch0
    return run
