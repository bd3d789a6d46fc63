"""GD-β / LTB / LSA numerics: prompt sampling, Monte-Carlo risks, minibatch training and the gradient flow.

The mathematics lives in :mod:`attnflow.closed_forms.gd_beta`; this module draws data and runs algorithms.
"""
from __future__ import annotations


from dataclasses import dataclass

import numpy as np
from numba import njit

from attnflow.closed_forms import gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem, context_gd_step
from attnflow.closed_forms import checks as check

from .integrate import DivergenceError, dopri5_loop, solve_dopri5
from attnflow.seeding import SeedLike, generators
from attnflow.closed_forms.parameters import Parameter, takes_options

from .montecarlo import (MAX_BATCH, MAX_POINTS, MonteCarloMean, RegressionPrompts, Trajectory, check_batch_size,
                         check_count, check_run_length, flow_times, monte_carlo_mean,
                         prompt_risk)
from .diffusion import NoiseBand, gaussian_noise_paths, linear_noise, pool_size
from .optimizers import OPTIMIZERS, cosine_schedule

__all__ = ["flow_dopri5", "POPULATION_OPTIONS", "MINIBATCH_OPTIONS", 
    "Prompts",
    "sample_prompts",
    "token_matrices",
    "monte_carlo_risk",
    "bayes_risk",
    "population_trajectory",
    "excess_risk",
    "MODELS",
    "make_model",
    "minibatch_gradient",
    "minibatch_trajectory",
 "population", "minibatch",
    "ContextPool",
    "context_pool",
    "gradient_noise_covariance",
    "sgd_linear_noise",
    "sgd_gaussian_noise_paths",
]


# ==================================================================================================
# Sampling (Assumption 3.1)
# ==================================================================================================


Prompts = RegressionPrompts  # the batch type of sample_prompts, shared by the in-context regression papers


def sample_prompts(problem: GDBetaProblem, n: int, rng: np.random.Generator) -> Prompts:
    """n i.i.d. prompts: β = β* + Ψ^{1/2}θ, x = H^{1/2}z, y = <x, β> + ε (works for singular H, Ψ)."""
    n = check_count(n, "n")
    d, N = problem.d, problem.N
    beta = problem.beta_star + rng.standard_normal((n, d)) @ problem.Psi_half
    features = rng.standard_normal((n, N + 1, d)) @ problem.H_half
    noise = np.sqrt(problem.sigma2) * rng.standard_normal((n, N + 1))
    labels = np.einsum("nkd,nd->nk", features, beta) + noise
    # Contiguous copies: the numba kernels index them row by row.
    c = np.ascontiguousarray
    return Prompts(X=c(features[:, :N]), y=c(labels[:, :N]), x_query=c(features[:, N]), y_query=c(labels[:, N]),
                   beta=beta)


def token_matrices(prompts: Prompts) -> np.ndarray:
    """Token matrices E (3.1), shape (n, d+1, N+1): columns (x_i; y_i) and the query (x_q; 0)."""
    n, N, d = prompts.X.shape
    E = np.zeros((n, d + 1, N + 1))
    E[:, :d, :N] = np.swapaxes(prompts.X, 1, 2)
    E[:, d, :N] = prompts.y
    E[:, :d, N] = prompts.x_query
    return E


def monte_carlo_risk(problem: GDBetaProblem, predict, n: int, *, seed: SeedLike, chunk: int = 50_000) -> MonteCarloMean:
    """Brute-force ICL risk E(f(E) − y_q)² (3.5) of ``predict(prompts) -> (m,)`` over n fresh prompts."""
    return prompt_risk(lambda rng, m: sample_prompts(problem, m, rng), predict, n, seed=seed, chunk=chunk)


MAX_BAYES_CONTEXTS = 10**7


def bayes_risk(problem: GDBetaProblem, n_contexts: int, *, seed: SeedLike, chunk: int = 20_000) -> MonteCarloMean:
    """Bayes risk σ² + E_X tr(Σ(I + X̃ᵀX̃/σ²)⁻¹) (Lemma 6.1, docs/gd_beta.md §7), averaging over contexts X only.

    The conditional expectation over β, ε, x_q is exact, so the standard error is small (docs/gd_beta.md §7:
    4·10⁴ contexts give ~10⁻³ relative).
    """
    d, N = problem.d, problem.N
    n_contexts = check.integer(n_contexts, "n_contexts", minimum=2)
    if n_contexts > MAX_BAYES_CONTEXTS:
        raise ValueError(f"n_contexts must be <= {MAX_BAYES_CONTEXTS:.0e} (a d × d solve per context; more takes "
                         f"hours), got {n_contexts}")

    def conditional(rng, m):
        X = rng.standard_normal((m, N, d)) @ problem.H_half
        return problem.sigma2 + cf.bayes_conditional_excess(problem, X)

    return monte_carlo_mean(conditional, n_contexts, seed=seed, chunk=chunk)


# ==================================================================================================
# Gradient flow on (β₀, Γ), Theorem 6.3
# ==================================================================================================


FLOW_MAX_STEPS = 1_000_000  # the integrator's step budget for the flow


@njit(cache=True)
def flow_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """The DOPRI5 loop bound to the GD-β flow (6.1), for compiled callers; :func:`population_trajectory` calls
    ``solve_dopri5(cf.gradient_flow_rhs_into, ...)``, which shares one cached loop among all systems (DESIGN.md)."""
    return dopri5_loop(cf.gradient_flow_rhs_into, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def excess_risk(problem: GDBetaProblem, betas, Gammas) -> np.ndarray:
    """R − R* along a path of (β₀, Γ) (stacks (n, d), (n, d, d)), as the sum of the two non-negative terms of
    Corollary G.1 (``cf.excess_risk_parts``): accurate to relative precision near the optimum, where R − R* formed
    as a difference of two risks cancels to round-off and may come out negative."""
    betas = check.finite_array(betas, "betas", ndim=2)
    n, d = betas.shape
    Gammas = check.finite_array(Gammas, "Gammas", shape=(n, problem.d, problem.d))
    if d != problem.d:
        raise ValueError(f"betas must have shape (n, {problem.d}), got {betas.shape}")
    return np.array([sum(cf.excess_risk_parts(problem, b, G)) for b, G in zip(betas, Gammas)])


def population_trajectory(problem: GDBetaProblem, beta0=None, Gamma=None, *, t_end: float | None = None,
                          n_points: int = 200, rtol: float = 1e-10, atol: float = 1e-13) -> Trajectory:
    """Gradient flow (6.1) on the population risk from (β₀, Γ) (default (0, 0): GD-0 with zero step).

    ``t_end`` defaults to 30 / (slowest local rate) (docs/gd_beta.md §10: long enough to converge to ~1e-8). Output at
    ``n_points`` times, log-spaced after t = 0 so both the transient and the exponential tail are resolved.

    Metrics: ``risk`` (closed form), ``excess_risk`` (R − R*, :func:`excess_risk`), ``beta_error`` ‖β₀ − β₀(∞)‖ and
    ``gamma_error`` ‖Γ − Γ(∞)‖_F (the limits of Theorem 6.3, null-space parts included).
    """
    d = problem.d
    beta0 = np.zeros(d) if beta0 is None else check.finite_array(beta0, "beta0", shape=(d,))
    Gamma = np.zeros((d, d)) if Gamma is None else check.finite_array(Gamma, "Gamma", shape=(d, d))
    rates = cf.local_rates(problem)
    if t_end is None:
        slowest = min(rates.beta, rates.gamma_tail)
        if not (slowest > 0 and np.isfinite(30.0 / slowest)):
            raise ValueError(f"H: the flow's slowest local rate is {slowest:.3g}, too small for the default t_end = "
                             "30 / rate (H's nonzero eigenvalues are too small); give t_end")
        t_end = 30.0 / slowest
    times = flow_times(t_end, n_points)
    t_end = float(times[-1])
    # DOPRI5 is explicit: near the optimum its step is at most ≈ 3.3/λ_max(∇²R), and the flow ends there, so a run
    # to t_end needs at least t_end·λ_max/3.3 steps. Refuse at once what the step budget cannot reach.
    curvature = cf.flow_curvature(problem)
    if t_end * curvature / 3.3 > FLOW_MAX_STEPS:
        raise ValueError(f"t_end = {t_end:.3g} needs more than {FLOW_MAX_STEPS:.0e} integrator steps near the optimum "
                         f"(largest curvature {curvature:.3g}); choose t_end <= {3.3 * FLOW_MAX_STEPS / curvature:.3g}")
    sol = solve_dopri5(cf.gradient_flow_rhs_into, cf.flow_state(beta0, Gamma), times, cf.pack_flow_params(problem),
                       rtol=rtol, atol=atol, max_steps=FLOW_MAX_STEPS)
    betas, Gammas = cf.unpack_flow_state(sol.y, d)
    beta_inf, Gamma_inf = cf.flow_limit(problem, beta0, Gamma)
    risk = cf.icl_risk(problem, betas, Gammas)
    return Trajectory(
        times=times,
        states=dict(beta0=betas, Gamma=Gammas),
        metrics=dict(
            risk=risk,
            excess_risk=excess_risk(problem, betas, Gammas),
            beta_error=np.linalg.norm(betas - beta_inf, axis=-1),
            gamma_error=np.linalg.norm(Gammas - Gamma_inf, axis=(-2, -1)),
        ),
        info=dict(rates=rates, n_rhs_evals=sol.n_rhs_evals, n_steps=sol.n_steps, limit=(beta_inf, Gamma_inf)),
    )


# ==================================================================================================
# Minibatch training on freshly sampled prompts
# ==================================================================================================


@njit(cache=True)
def _gd_beta_batch_gradient(X, y, x_query, y_query, beta0, Gamma):
    """Mean squared loss of GD-β (5.1) on a batch and its gradient in (β₀, Γ).

    ŷ = x_qᵀβ₀ + x_qᵀΓg₀ with g₀ = Xᵀ(y − Xβ₀)/N, so ∂ŷ/∂β₀ = x_q − ĤΓᵀx_q (Ĥ = XᵀX/N), ∂ŷ/∂Γ = x_q g₀ᵀ.
    Scalar loops, no temporaries: the batch is the hot path.
    """
    n, N, d = X.shape
    loss = 0.0
    g_beta = np.zeros(d)
    g_Gamma = np.zeros((d, d))
    g0 = np.empty(d)
    Gt_xq = np.empty(d)
    for i in range(n):
        context_gd_step(X, y, i, beta0, g0)
        prediction = 0.0
        for j in range(d):
            acc = 0.0
            for l in range(d):
                acc += Gamma[j, l] * g0[l]
            prediction += x_query[i, j] * (beta0[j] + acc)
        residual = prediction - y_query[i]
        loss += residual * residual
        weight = 2.0 * residual / n
        for l in range(d):
            acc = 0.0
            for j in range(d):
                acc += Gamma[j, l] * x_query[i, j]
            Gt_xq[l] = acc
        for j in range(d):
            g_beta[j] += weight * x_query[i, j]
            for l in range(d):
                g_Gamma[j, l] += weight * x_query[i, j] * g0[l]
        for k in range(N):
            s = 0.0
            for l in range(d):
                s += X[i, k, l] * Gt_xq[l]
            for j in range(d):
                g_beta[j] -= weight * X[i, k, j] * s / N
    return loss / n, g_beta, g_Gamma


@njit(cache=True)
def _ltb_batch_gradient(X, y, x_query, y_query, U, V, K, mlp):
    """Mean squared loss of the LTB (3.3) (LSA (3.4) when ``mlp`` is False) and its gradient in the products
    U = W₂ᵀW₁, V = W^PW^V, K = W^{K⊤}W^Q.

    Per prompt, with G = Σ_i z_i z_iᵀ (z_i = (x_i; y_i)) and e_q = (x_q; 0): z_q = e_q + V G K e_q / N and
    ŷ = u·z_q with u = e_{d+1} + (last row of U). Then ∂ŷ/∂U[last] = z_q, ∂ŷ/∂V = u (GKe_q)ᵀ/N and
    ∂ŷ/∂K = (G Vᵀu) e_qᵀ/N. Scalar loops, no temporaries: the batch is the hot path.
    """
    n, N, d = X.shape
    D = d + 1
    loss = 0.0
    gU = np.zeros((D, D))
    gV = np.zeros((D, D))
    gK = np.zeros((D, D))
    u = np.zeros(D)
    u[d] = 1.0
    if mlp:
        for j in range(D):
            u[j] += U[d, j]
    Vt_u = np.empty(D)
    np.dot(V.T, u, Vt_u)  # the BLAS call of V.T @ u, cheaper to compile
    G = np.empty((D, D))
    z = np.empty(D)
    Keq = np.empty(D)
    m = np.empty(D)
    zq = np.empty(D)
    G_Vt_u = np.empty(D)
    for i in range(n):
        for j in range(D):
            for l in range(D):
                G[j, l] = 0.0
        for k in range(N):
            for j in range(d):
                z[j] = X[i, k, j]
            z[d] = y[i, k]
            for j in range(D):
                for l in range(j + 1):
                    G[j, l] += z[j] * z[l]
        for j in range(D):
            for l in range(j):
                G[l, j] = G[j, l]
        for j in range(D):
            acc = 0.0
            for l in range(d):
                acc += K[j, l] * x_query[i, l]
            Keq[j] = acc
        for j in range(D):
            acc = 0.0
            acc2 = 0.0
            for l in range(D):
                acc += G[j, l] * Keq[l]
                acc2 += G[j, l] * Vt_u[l]
            m[j] = acc
            G_Vt_u[j] = acc2
        prediction = 0.0
        for j in range(D):
            acc = x_query[i, j] if j < d else 0.0
            for l in range(D):
                acc += V[j, l] * m[l] / N
            zq[j] = acc
            prediction += u[j] * acc
        residual = prediction - y_query[i]
        loss += residual * residual
        weight = 2.0 * residual / n
        for j in range(D):
            if mlp:
                gU[d, j] += weight * zq[j]
            for l in range(D):
                gV[j, l] += weight / N * u[j] * m[l]
            for l in range(d):
                gK[j, l] += weight / N * G_Vt_u[j] * x_query[i, l]
    return loss / n, gU, gV, gK


def minibatch_gradient(problem: GDBetaProblem, prompts: Prompts, beta0, Gamma):
    """Mean squared loss of GD-β on ``prompts`` and its gradient (β₀, Γ): an unbiased estimate of
    (R, ∇R) of :func:`attnflow.closed_forms.gd_beta.icl_risk` / :func:`attnflow.closed_forms.gd_beta.risk_gradient`."""
    d = problem.d
    # Writable copies, like the training model's parameters: a read-only array is another signature to compile.
    beta0 = np.array(check.finite_array(beta0, "beta0", shape=(d,)), order="C")
    Gamma = np.array(check.finite_array(Gamma, "Gamma", shape=(d, d)), order="C")
    return _gd_beta_batch_gradient(prompts.X, prompts.y, prompts.x_query, prompts.y_query, beta0, Gamma)


class _GDBetaModel:
    """GD-β (5.1) with parameters (β₀, Γ), initialised at (0, 0)."""

    def __init__(self, problem):
        self.problem = problem
        self.params = [np.zeros(problem.d), np.zeros((problem.d, problem.d))]

    def gradient(self, batch: Prompts):
        loss, gb, gG = _gd_beta_batch_gradient(batch.X, batch.y, batch.x_query, batch.y_query, *self.params)
        return loss, [gb, gG]

    def risk(self):
        return float(cf.icl_risk(self.problem, *self.params))

    def state(self):
        return dict(beta0=self.params[0].copy(), Gamma=self.params[1].copy())


class _AttentionModel:
    """The full LTB (3.3) with weights W₁, W₂ (d_f×D), W^P (D×d_v), W^V (d_v×D), W^K, W^Q (d_k×D), D = d+1,
    or LSA (3.4) without W₁, W₂. Widths d_k = d_v = d_f = ``width`` (default D, which satisfies the
    Theorem 5.3 size condition d_k >= d). Small random initialisation: zero weights are a saddle."""

    def __init__(self, problem, rng, init_scale, width, mlp):
        D = problem.d + 1
        width = D if width is None else check.integer(width, "width", minimum=1)
        shapes = [(width, D), (width, D), (D, width), (width, D), (width, D), (width, D)]
        names = ["W1", "W2", "WP", "WV", "WK", "WQ"]
        if not mlp:
            shapes, names = shapes[2:], names[2:]
        self.problem, self.mlp, self.names = problem, mlp, names
        self.params = [init_scale * rng.standard_normal(shape) for shape in shapes]

    def products(self):
        w = dict(zip(self.names, self.params))
        D = self.problem.d + 1
        U = w["W2"].T @ w["W1"] if self.mlp else np.zeros((D, D))
        return U, w["WP"] @ w["WV"], w["WK"].T @ w["WQ"]

    def gradient(self, batch: Prompts):
        U, V, K = self.products()
        loss, gU, gV, gK = _ltb_batch_gradient(batch.X, batch.y, batch.x_query, batch.y_query, U, V, K, self.mlp)
        w = dict(zip(self.names, self.params))
        grads = dict(WP=gV @ w["WV"].T, WV=w["WP"].T @ gV, WK=w["WQ"] @ gK.T, WQ=w["WK"] @ gK)
        if self.mlp:
            grads.update(W1=w["W2"] @ gU, W2=w["W1"] @ gU.T)
        return loss, [grads[name] for name in self.names]

    def reduced(self):
        return cf.ltb_reduced_coordinates(*self.products(), mlp=self.mlp)

    def risk(self):
        c, a, b, Q, q = self.reduced()
        W = np.column_stack([c, Q.T, q]) if self.mlp else np.column_stack([Q.T, q])
        return cf.readout_risk(self.problem, a, b, W, constant=self.mlp)

    def state(self):
        c, a, b, Q, q = self.reduced()
        return dict(c=c, a=a, b=np.array(b), Q=Q.copy(), q=q)


class _ReducedAttentionModel(_AttentionModel):
    """The LTB (LSA without c) in its reduced coordinates (c, a, b, Q, q) of docs/gd_beta.md §2.1: everything of the block
    that reaches the output, as in the reference training run of docs/gd_beta.md §10. It is the factorised model with
    U = e_{d+1}(cᵀ, 0), V = e_{d+1}(aᵀ, b), K = [[Q, ·], [qᵀ, ·]], so the same gradient kernel serves."""

    def __init__(self, problem, rng, init_scale, mlp, value_init):
        d = problem.d
        self.problem, self.mlp, self.label_copy_init = problem, mlp, value_init == "label_copy"
        self.names = (["c"] if mlp else []) + ["a", "b", "Q", "q"]
        shapes = dict(c=(d,), a=(d,), b=(1,), Q=(d, d), q=(d,))
        # c starts at 0; a zero (a, b, Q, q) is a saddle, so those start small and random. The value row starts
        # at the label copy (a, b) = (0, 1) plus noise: GD-0 with a random step, inside GD-β ⊂ LTB. From a
        # purely random value row some seeds fall into the LTB's spurious minimum at b = 0 (docs/gd_beta.md).
        self.params = [np.zeros(d) if n == "c" else init_scale * rng.standard_normal(shapes[n]) for n in self.names]
        if self.label_copy_init:
            self.params[self.names.index("b")] += 1.0

    def products(self):
        d = self.problem.d
        w = dict(zip(self.names, self.params))
        U, V, K = np.zeros((d + 1, d + 1)), np.zeros((d + 1, d + 1)), np.zeros((d + 1, d + 1))
        if self.mlp:
            U[d, :d] = w["c"]
        V[d, :d], V[d, d] = w["a"], w["b"][0]
        K[:d, :d], K[d, :d] = w["Q"], w["q"]
        return U, V, K

    def gradient(self, batch: Prompts):
        d = self.problem.d
        U, V, K = self.products()
        loss, gU, gV, gK = _ltb_batch_gradient(batch.X, batch.y, batch.x_query, batch.y_query, U, V, K, self.mlp)
        grads = dict(c=gU[d, :d], a=gV[d, :d], b=gV[d, d:], Q=gK[:d, :d], q=gK[d, :d])
        return loss, [grads[name] for name in self.names]


MODELS = ("gd_beta", "ltb", "lsa", "ltb_weights", "lsa_weights")


def make_model(name: str, problem: GDBetaProblem, rng, init_scale: float = 0.3, width: int | None = None,
               value_init: str = "label_copy"):
    """A trainable model (see :func:`minibatch_trajectory`): ``params``, ``gradient(batch)``, ``risk()``."""
    if name not in MODELS:
        raise ValueError(f"name must be one of {MODELS}, got {name!r}")
    init_scale = check.real(init_scale, "init_scale", minimum=0.0)
    if name == "gd_beta":
        return _GDBetaModel(problem)
    mlp = name.startswith("ltb")
    if name.endswith("_weights"):
        return _AttentionModel(problem, rng, init_scale, width, mlp)
    return _ReducedAttentionModel(problem, rng, init_scale, mlp, value_init)


VALUE_INITS = ("label_copy", "random")


def minibatch_trajectory(problem: GDBetaProblem, model: str, batch_size: int, steps: int, *, seed: SeedLike,
                         lr: float = 0.05, optimizer: str = "adam", record_every: int | None = None,
                         init_scale: float = 0.3, width: int | None = None,
                         value_init: str = "label_copy") -> Trajectory:
    """Train ``model`` on fresh prompts: one new batch per step.

    Models: ``gd_beta`` (β₀, Γ); ``ltb`` / ``lsa`` in the reduced coordinates (c, a, b, Q, q) of docs/gd_beta.md §2.1;
    ``ltb_weights`` / ``lsa_weights`` with the six (four) weight matrices of (3.3) themselves. The factorised
    parameterisation is non-convex in a way the reduced one is not: from small random initialisations some
    seeds stall near b ≈ 0 (the value row stops reading the labels), see docs/gd_beta.md.

    Initialisation: β₀ = Γ = 0 for GD-β and c = 0 for the LTB. The other reduced coordinates start at
    N(0, init_scale²); with ``value_init="label_copy"`` (default) the value row starts at (a, b) = (0, 1) plus that
    noise (GD-0 with a random step). From ``value_init="random"`` a fraction of seeds converges to the LTB's
    spurious local minimum on b = 0 (claim ``gd_beta.ltb_spurious_minimum``). Factorised weights start at
    N(0, init_scale²) entrywise.

    The paper's experiment trains with Adam on a fresh batch of tasks every step (docs/gd_beta.md §10); plain SGD is
    available as ``optimizer="sgd"``. The learning rate decays by a cosine to 1% of ``lr``. The recorded
    ``risk`` is the *exact* population risk of the current parameters (closed form, docs/gd_beta.md §3 and §6), so the
    only randomness in it is that of training; ``batch_loss`` is the minibatch loss (NaN at step 0: no batch yet).

    Raises ``DivergenceError`` naming the step if the loss or a parameter stops being finite.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    if value_init not in VALUE_INITS:
        raise ValueError(f"value_init must be one of {VALUE_INITS}, got {value_init!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
    batch_size = check_batch_size(batch_size)
    steps, _ = check_run_length(steps, None, optional_records=True)
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    init_scale = check.real(init_scale, "init_scale", minimum=0.0)
    record_every = max(1, steps // 100) if record_every is None else check.integer(record_every, "record_every", 1)
    init_rng, data_rng = generators(seed, 2)
    net = make_model(model, problem, init_rng, init_scale, width, value_init)
    opt = OPTIMIZERS[optimizer](net.params, lr, steps)
    times, risks, losses, states = [0], [net.risk()], [np.nan], [net.state()]
    for step in range(1, steps + 1):
        loss, grads = net.gradient(sample_prompts(problem, batch_size, data_rng))
        if not np.isfinite(loss) or not all(np.all(np.isfinite(g)) for g in grads):
            raise DivergenceError(f"diverged at step {step}: the minibatch loss or gradient is not finite "
                                  f"(lower lr={lr})")
        opt.step(grads)
        if step % record_every == 0 or step == steps:
            risk = net.risk()
            if not np.isfinite(risk) or risk > 1e12:
                raise DivergenceError(f"diverged at step {step}: the population risk is {risk:.3g} (lower lr={lr})")
            times.append(step)
            risks.append(risk)
            losses.append(loss)
            states.append(net.state())
    stacked = {name: np.array([s[name] for s in states]) for name in states[0]}
    return Trajectory(times=np.array(times, float), states=stacked,
                      metrics=dict(risk=np.array(risks), batch_loss=np.array(losses)),
                      info=dict(model=model, optimizer=optimizer, lr=lr, batch_size=batch_size, steps=steps,
                                value_init=value_init, init_scale=init_scale))


# ==================================================================================================
# The diffusion tier: gradient noise, the linear-noise approximation and Gaussian-noise paths of SGD
# (docs/gd_beta.md §12, docs/diffusion.md)
# ==================================================================================================


@dataclass(frozen=True)
class ContextPool:
    """Fixed contexts (X, y, β) on which Σ(β₀, Γ) is estimated, split into ``n_batches`` equal batches; the same
    pool at every step makes Σ̂ a smooth function of the parameters (common random numbers)."""

    X: np.ndarray
    y: np.ndarray
    beta: np.ndarray
    n_batches: int

    def __post_init__(self):
        # Checked once here, not at each of the thousands of Σ̂ evaluations an SGD path makes; kept as read-only
        # C-ordered copies, the one kind of array the noise kernel is compiled for.
        X = check.finite_array(self.X, "X", ndim=3, order="C")
        n = X.shape[0]
        n_batches = check.integer(self.n_batches, "n_batches", minimum=2)  # their spread is the standard error
        if n % n_batches or n // n_batches < 2:
            raise ValueError(f"n_batches must divide the number of contexts {n} into batches of at least 2, "
                             f"got {n_batches}")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", check.finite_array(self.y, "y", shape=X.shape[:2], order="C"))
        object.__setattr__(self, "beta", check.finite_array(self.beta, "beta", shape=(n, X.shape[2]), order="C"))
        object.__setattr__(self, "n_batches", n_batches)


def context_pool(problem: GDBetaProblem, n_contexts: int, *, seed: SeedLike, n_batches: int = 16) -> ContextPool:
    if check.integer(n_contexts, "n_contexts", minimum=2) > 10_000_000:
        raise ValueError(f"n_contexts must be at most 10^7 (memory), got {n_contexts}")
    n_contexts = pool_size(n_contexts, n_batches)
    prompts = sample_prompts(problem, n_contexts, generators(seed, 1)[0])
    return ContextPool(X=prompts.X, y=prompts.y, beta=prompts.beta, n_batches=n_batches)


def gradient_noise_covariance(problem: GDBetaProblem, beta0, Gamma, pool: ContextPool) -> np.ndarray:
    """Σ(β₀, Γ) = Cov of the per-prompt gradient of the squared loss, in the flat coordinates (β₀, vec Γ): one
    unbiased estimate per batch of ``pool``, shape (n_batches, p, p), p = d + d² (docs/gd_beta.md §12).

    Each batch of m contexts gives Σ̂ = (1/m)Σ_c E[ĝĝᵀ | c] − m̂m̂ᵀ + K̂/m, with m̂ the mean of the conditional
    means E[ĝ | c] and K̂ their sample covariance: E[m̂m̂ᵀ] = ∇R∇Rᵀ + Cov(E[ĝ | c])/m, so the last term removes the
    bias of m̂m̂ᵀ and Σ̂ stays positive semi-definite."""
    d = problem.d
    if pool.X.shape[1:] != (problem.N, d):
        raise ValueError(f"pool must hold contexts of shape ({problem.N}, {d}), got {pool.X.shape[1:]}")
    beta0, Gamma = cf.check_parameters(problem, beta0, Gamma)
    H = np.ascontiguousarray(problem.H)  # the problem's read-only array, C-ordered as the pool's
    mean_sums, mean_outers, second_sums = cf.moment_sums_by_batch(
        pool.X, pool.y, pool.beta, beta0, Gamma, H, float(problem.sigma2), pool.n_batches)
    m = pool.X.shape[0] // pool.n_batches
    # All the batches at once, elementwise: the same operations, in the same order, as batch by batch.
    mean = mean_sums / m
    outer = mean[:, :, None] * mean[:, None, :]
    spread = (mean_outers / m - outer) * m / (m - 1)
    return second_sums / m - outer + spread / m


def _flat_closed_forms(problem: GDBetaProblem, pool: ContextPool):
    d = problem.d

    def gradient(theta):
        return cf.flow_state(*cf.risk_gradient(problem, *cf.unpack_flow_state(theta, d)))

    def hessian(theta):
        return cf.risk_hessian(problem, *cf.unpack_flow_state(theta, d))

    def noise(theta):
        return gradient_noise_covariance(problem, *cf.unpack_flow_state(theta, d), pool)

    return gradient, hessian, noise


def _sgd_schedule(steps, lr, record_every):
    """(η_1, …, η_steps) of minibatch_trajectory's SGD, and its recorded steps."""
    steps, _ = check_run_length(steps, None, optional_records=True)
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    record_every = max(1, steps // 100) if record_every is None else check.integer(record_every, "record_every", 1)
    return cosine_schedule(lr, steps), np.unique(np.append(np.arange(0, steps + 1, record_every), steps))


def sgd_linear_noise(problem: GDBetaProblem, batch_size: int, steps: int, lr: float, pool: ContextPool, *,
                     record_every: int | None = None) -> NoiseBand:
    """The LNA (docs/diffusion.md) of SGD on GD-β from (0, 0) — :func:`minibatch_trajectory` with
    ``optimizer="sgd"`` and its cosine steps — recorded at the same steps as that trajectory."""
    rates, record = _sgd_schedule(steps, lr, record_every)
    gradient, hessian, noise = _flat_closed_forms(problem, pool)
    return linear_noise(np.zeros(problem.d + problem.d**2), rates, batch_size,
                        gradient=gradient, hessian=hessian, noise_covariance=noise, record=record)


def sgd_gaussian_noise_paths(problem: GDBetaProblem, batch_size: int, steps: int, lr: float, pool: ContextPool, *,
                             n_paths: int, seed: SeedLike, record_every: int | None = None) -> np.ndarray:
    """SGD on GD-β with each minibatch gradient replaced by ∇R + Gaussian noise of covariance Σ(θ)/B
    (:func:`gaussian_noise_paths`); states (n_paths, n_records, d + d²) at the steps of :func:`sgd_linear_noise`."""
    rates, record = _sgd_schedule(steps, lr, record_every)
    gradient, _, noise = _flat_closed_forms(problem, pool)
    return gaussian_noise_paths(np.zeros(problem.d + problem.d**2), rates, batch_size,
                                gradient=gradient, noise_covariance=noise, n_paths=n_paths, seed=seed, record=record)


# ==================================================================================================
# The System contract: population(problem, **options) and minibatch(problem, *, seed, **options)
# ==================================================================================================


# The options of population and minibatch: the records `attnflow solve/simulate --param` reads and the domain
# table (dynamics/domains.py) draws from, one record each so the two cannot drift.
POPULATION_OPTIONS = (
    Parameter("t_end", "real", None, "flow time (default 30 / slowest local rate)", minimum=0.0, strict=True),
    Parameter("n_points", "integer", 200, "recorded times", minimum=2, maximum=MAX_POINTS),
)
MINIBATCH_OPTIONS = (
    Parameter("model", "choice", "gd_beta", "the trained model", choices=MODELS),
    Parameter("batch_size", "integer", 128, "prompts per step", minimum=1, maximum=MAX_BATCH),
    Parameter("steps", "integer", 1000, "training steps", minimum=1, maximum=10_000_000),
    Parameter("lr", "real", 0.05, "learning rate", minimum=0.0, strict=True),
    Parameter("optimizer", "choice", "adam", "the optimiser", choices=tuple(OPTIMIZERS)),
)


@takes_options(*POPULATION_OPTIONS)
def population(problem: GDBetaProblem, *, t_end: float | None, n_points: int) -> Trajectory:
    """The gradient flow (6.1) from (0, 0): :func:`population_trajectory`."""
    return population_trajectory(problem, t_end=t_end, n_points=n_points)


@takes_options(*MINIBATCH_OPTIONS)
def minibatch(problem: GDBetaProblem, *, seed: SeedLike, model: str, batch_size: int,
              steps: int, lr: float, optimizer: str) -> Trajectory:
    """Training on fresh prompts, one batch per step: :func:`minibatch_trajectory`."""
    return minibatch_trajectory(problem, model, batch_size, steps, seed=seed, lr=lr, optimizer=optimizer)
