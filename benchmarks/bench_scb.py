"""SCB: minibatch throughput of the numba Algorithm-1 step against a straightforward vectorised numpy step (not a
test). Both draw a fresh batch from the data model (docs/scb.md §2) and take one preconditioned step (docs/scb.md §5, eq. 4);
samples per second are measured side by side in this process.

    python benchmarks/bench_scb.py [--batch 4096] [--steps 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from attnflow.closed_forms import scb as cf
from attnflow.dynamics import scb as dyn


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"one preconditioned minibatch step, batch {args.batch}, {args.steps} steps each (median of 3 repeats)")
    print(f"{'N':>5s} {'T':>5s} {'numba samples/s':>16s} {'numpy samples/s':>16s} {'ratio':>7s}")
    for N, T in ((20, 64), (50, 128), (100, 256)):
        problem = cf.SCBProblem.random(N, T, 4, seed=0)
        stage = dyn.StageSettings(args.steps, args.batch, 0.25)
        dyn.run_stage(problem, problem.initial_point(), dyn.StageSettings(1, 16, 0.25), seed=0)  # compile or load
        numba_times, numpy_times = [], []
        for repeat in range(3):
            start = time.perf_counter()
            dyn.run_stage(problem, problem.initial_point(), stage, seed=repeat, record_every=args.steps)
            numba_times.append(time.perf_counter() - start)
            V, Q = (np.array(m) for m in problem.initial_point())
            rng = np.random.default_rng(repeat)
            start = time.perf_counter()
            for _ in range(args.steps):
                numpy_step(problem, V, Q, args.batch, rng, 0.25 / problem.K_Q, 0.25 / problem.K_P)
            numpy_times.append(time.perf_counter() - start)
        samples = args.steps * args.batch
        a, b = samples / np.median(numba_times), samples / np.median(numpy_times)
        print(f"{N:5d} {T:5d} {a:16.3g} {b:16.3g} {a / b:6.1f}x")
    print("Target: >= 10x at both sizes.")


if __name__ == "__main__":
    main()
