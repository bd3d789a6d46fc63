"""SCB: the minibatch Algorithm-1 step against a vectorised numpy step and against the machine's GEMM floor.

Both contenders draw fresh batches from the data model (docs/scb.md §2) and take preconditioned steps
(docs/scb.md §5, eq. 4); CPU time per sample is measured side by side in this process. The floor is the step's
GEMM flops at the GEMM rate measured on this core at the kernel's shapes (the sampling is not counted in it). A
second floor adds the draws themselves: T + 3 draws per sample (docs/scb.md §2) at the rate of the kernel's own
sampler (xoshiro256+ uniforms and alias picks from the instance's μ, timed alone in a compiled loop), the least
any exact sampler of this data model built from those draws costs. The last size, N = 5 and T = 1024, is the shape
of the SCB claims (docs/scb.md §11 at the largest context), where the draws and the O(T) passes, not the GEMMs, set
the cost.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_scb.py [--batch 4096] [--steps 5] [--json]
"""
from __future__ import annotations

import numpy as np
from _common import emit, gemm_rate, parser, side_by_side
from numba import njit

from attnflow.closed_forms import scb as cf
from attnflow.dynamics import scb as dyn
from attnflow.dynamics import sampling
from attnflow.seeding import generator_state

# (N, T, sparsity): three sizes of growing N, then the shape of the SCB claims
SIZES = ((20, 64, 4), (50, 128, 4), (100, 256, 4), (5, 1024, 2))


def numpy_step(problem, V, Q, batch, rng, eta_V, eta_Q):
    """The baseline: one preconditioned step (λ = 0) with the batch held in (B, T) / (B, N) arrays."""
    N, T, mu = problem.N, problem.T, problem.mu
    x = rng.choice(N, size=(batch, T), p=mu)
    k = rng.choice(N, size=batch, p=mu)
    s = (rng.random(batch)[:, None] > np.cumsum(problem.Q_star[:, k].T, axis=1)).sum(axis=1)
    s = np.minimum(s, T - 1)
    attended = x[np.arange(batch), s]
    o = (rng.random(batch)[:, None] > np.cumsum(problem.P[:, attended].T, axis=1)).sum(axis=1)
    o = np.minimum(o, N - 1)
    weights = Q[:, k].T  # (B, T): q_t^(k_b)
    Y = np.zeros((batch, N))
    np.add.at(Y, (np.repeat(np.arange(batch), T), x.ravel()), weights.ravel())
    R = -Y @ V.T
    R[np.arange(batch), o] += 1.0
    Y_pre = Y / mu - Y.sum(axis=1, keepdims=True)
    G_V = -(R.T @ Y_pre) / batch
    W = R @ V  # (B, N): (Vᵀr)
    g = W[np.arange(batch)[:, None], x]  # (B, T)
    g = -(g - g.mean(axis=1, keepdims=True)) / mu[k][:, None]
    G_Q = np.zeros((T, N))
    np.add.at(G_Q.T, k, g)
    G_Q /= batch
    V -= eta_V * G_V
    Q -= eta_Q * G_Q


def gemm_floor_seconds_per_sample(N: int) -> float:
    """The machine's limit for one sample: the step's three products (R = E_o − YVᵀ, RᵀY, W = RV; 2N² flops each
    per sample, docs/scb.md §5.1) at the GEMM rate measured on this core at the kernel's shapes (chunk × N × N)."""
    rate = min(gemm_rate(dyn.CHUNK, N, N), gemm_rate(N, dyn.CHUNK, N))
    return 6.0 * N * N / rate


@njit(cache=True)
def _draw_only(state, picks, prob, choices, rounds):
    """``rounds`` × len(picks) alias picks of fresh uniforms, drawn as the kernel draws a context's tokens
    (:func:`attnflow.dynamics.sampling.alias_picks`): the sampler's cost with nothing else."""
    total = 0
    for _ in range(rounds):
        sampling.alias_picks(state, prob, choices, picks)
        total += picks[0]
    return total


def seconds_per_draw(mu, repeats: int) -> float:
    """CPU seconds of one uniform plus one alias pick from the law ``mu`` (the instance's own: a uniform law would
    hide the cost of an unpredictable choice), the median of ``repeats`` timings."""
    prob, choices = sampling.alias_table(mu)
    picks = np.empty(4096, np.uint32)
    rounds = 256
    with np.errstate(over="ignore"):
        state = generator_state(0)
        times = side_by_side({"draws": lambda: _draw_only(state, picks, prob, choices, rounds)}, repeats)
    return times["draws"] / (rounds * picks.size)


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    rows, ratios = [], {}
    for N, T, sparsity in SIZES:
        problem = cf.SCBProblem.random(N, T, sparsity, seed=0)
        stage = dyn.StageSettings(args.steps, args.batch, 0.25)
        state = {"numpy": 0}

        def kernel():
            dyn.run_stage(problem, problem.initial_point(), stage, seed=0, record_every=args.steps)

        def vectorised():
            V, Q = (np.array(m) for m in problem.initial_point())
            rng = np.random.default_rng(state["numpy"])
            state["numpy"] += 1
            for _ in range(args.steps):
                numpy_step(problem, V, Q, args.batch, rng, 0.25 / problem.K_Q, 0.25 / problem.K_P)

        times = side_by_side({"kernel": kernel, "numpy": vectorised}, args.repeats)
        samples = args.steps * args.batch
        per_kernel, per_numpy = times["kernel"] / samples, times["numpy"] / samples
        floor = gemm_floor_seconds_per_sample(N)
        with_draws = floor + (T + 3) * seconds_per_draw(problem.mu, args.repeats)
        rows.append([N, T, per_kernel * 1e6, per_numpy * 1e6, per_numpy / per_kernel, floor * 1e6,
                     per_kernel / floor, with_draws * 1e6, per_kernel / with_draws])
        ratios[f"scb_kernel_vs_numpy_N{N}_T{T}"] = per_numpy / per_kernel
        ratios[f"scb_kernel_over_gemm_floor_N{N}_T{T}"] = per_kernel / floor
        ratios[f"scb_kernel_over_gemm_and_draw_floor_N{N}_T{T}"] = per_kernel / with_draws
    emit(f"SCB minibatch step, batch {args.batch}, {args.steps} steps, median CPU of {args.repeats} "
         "(targets: >= 10x numpy, <= 1.5x the GEMM floor)",
         ["N", "T", "kernel µs/sample", "numpy µs/sample", "vs numpy", "GEMM floor µs", "kernel/GEMM floor",
          "GEMM + draws µs", "kernel/(GEMM + draws)"],
         rows, ratios, args.json)


if __name__ == "__main__":
    main()
