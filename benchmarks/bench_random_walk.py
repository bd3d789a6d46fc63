"""Random walk, K = 20, N = 101: the reduced map with Monte-Carlo path expectations against full (V, W) GD on
sampled sequences, at the same statistical accuracy (not a test).

Both start from zero and take ``--steps`` GD steps, p = 0.5 (the paper's setting, M = 1000). Accuracy is the
relative Frobenius error of V after the last step against a reference reduced run on ``--reference`` paths. With
n samples the error of each method scales like n^{-1/2}, so the samples the full model needs to match the reduced
map's error at n are n·(e_full/e_reduced)², and its time scales linearly in samples (both costs are O(n·N) per
step plus the full model's O((K + M)·M) W update). Everything runs in this process, side by side.

    python benchmarks/bench_random_walk.py [--samples 20000] [--steps 10] [--reference 400000]
"""
from __future__ import annotations

import time

import numpy as np
from _common import emit, parser

from attnflow.closed_forms import random_walk as cf
from attnflow.dynamics import random_walk as dyn


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reference", type=int, default=400_000)
    p.set_defaults(repeats=3)
    args = p.parse_args(argv)
    problem = cf.RandomWalkProblem(K=20, N=101, p=0.5)
    seeds = np.random.SeedSequence(0).spawn(2 * args.repeats + 1)
    reference_paths = dyn.sample_paths(problem, args.reference, np.random.default_rng(seeds[-1]))
    reference = cf.circulant(dyn.reduced_trajectory(problem, reference_paths, args.steps, n_records=2).states["v"][-1])

    def error(V):
        return np.linalg.norm(V - reference) / np.linalg.norm(reference)

    # warm-up (compile or cache load) outside the timings
    small = dyn.sample_paths(problem, 10, np.random.default_rng(1))
    dyn.reduced_trajectory(problem, small, 1)
    dyn.full_gd_trajectory(problem, dyn.sample_sequences(problem, 10, np.random.default_rng(1)), 1, seed=0)

    times = {"reduced": [], "full": []}
    errors = {"reduced": [], "full": []}
    for r in range(args.repeats):
        paths = dyn.sample_paths(problem, args.samples, np.random.default_rng(seeds[2 * r]))
        start = time.perf_counter()
        run = dyn.reduced_trajectory(problem, paths, args.steps, n_records=2)
        times["reduced"].append(time.perf_counter() - start)
        errors["reduced"].append(error(cf.circulant(run.states["v"][-1])))
        sequences = dyn.sample_sequences(problem, args.samples, np.random.default_rng(seeds[2 * r + 1]))
        start = time.perf_counter()
        full = dyn.full_gd_trajectory(problem, sequences, args.steps, seed=0, n_records=2)
        times["full"].append(time.perf_counter() - start)
        errors["full"].append(error(full.final["V"]))
    # the reduced trajectory also evaluates accuracy at its records; time only the map for a fair comparison
    params = cf.pack_reduced_params(problem, dyn.sample_paths(problem, args.samples, np.random.default_rng(seeds[0])))
    start = time.perf_counter()
    x = np.zeros(problem.K + problem.N)
    for k in range(args.steps):
        x = cf.reduced_step(k, x, params)
    t_map = time.perf_counter() - start

    e_red, e_full = np.sqrt(np.mean(np.square(errors["reduced"]))), np.sqrt(np.mean(np.square(errors["full"])))
    t_full = float(np.median(times["full"]))
    needed = args.samples * (e_full / e_red) ** 2
    t_reduced = float(np.median(times["reduced"]))
    equal_accuracy = t_full * needed / args.samples / t_map
    emit(f"random walk K = 20, N = 101, M = 1000, p = 0.5, {args.steps} steps, {args.samples:,} samples "
         f"(target: >= 10x at equal accuracy)",
         ["contender", "seconds", "relative error of V", "samples for the reduced map's error"],
         [["reduced map (map alone)", t_map, e_red, args.samples],
          ["reduced map with accuracy records", t_reduced, e_red, args.samples],
          ["full (V, W) GD", t_full, e_full, round(needed)]],
         {"random_walk_reduced_vs_full_equal_accuracy": equal_accuracy,
          "random_walk_reduced_vs_full_equal_samples": t_full / t_map}, args.json)

if __name__ == "__main__":
    main()
