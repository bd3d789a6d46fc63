"""1-NN: 10⁴ reduced-GD steps from the claims' start (d = 4, N = 16, σ = 10, η = 200) on the dynamics' quadrature
against a baseline, the gradient's accuracy along that path, and (``--mc``) the refining quadrature against Monte
Carlo at 1e-4 relative error. A script, not a test.

Contenders, side by side in this process (CPU time, ``OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1``):
  * attnflow: ``dynamics.one_nn.reduced_trajectory`` (the v-grid quadrature of docs/one_nn.md §6, one numba map).
  * baseline: the former dynamics quadrature, reimplemented here from public pieces — a θ grid of max(151, 4ξ₁) odd
    nodes Richardson-extrapolated against its every-other-node subgrid, λ spacing 0.4 over the same range, each
    evaluated by ``closed_forms.one_nn.reduced_loss_on_grid`` — iterated by the same GD map in Python.
Accuracy: the relative error |∇L − ∇L_ref|/|∇L_ref| at points of the path and at ξ₁ = 200, the reference being the
self-refining ``reduced_loss(rtol=1e-5)`` (an independent θ × λ quadrature, itself checked against Monte Carlo).

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/bench_one_nn.py [--steps 10000] [--json] [--mc]
"""
from __future__ import annotations

import math
import time
import warnings

import numpy as np

from attnflow.closed_forms import one_nn as cf
from attnflow.dynamics import one_nn as dyn

from _common import cpu_seconds, emit, parser

TARGET_SECONDS = 10.0
MC_TARGET = 1e-4
PROBLEM = cf.OneNNProblem(4, 16, 10.0)
ETA = 200.0


def baseline_gradient(problem: cf.OneNNProblem, xi1: float, xi2: float) -> tuple[float, float]:
    """The former dynamics quadrature: θ grid max(151, ⌈4ξ₁⌉) nodes (odd) and its subgrid, λ spacing 0.4."""
    n_fine = max(151, int(math.ceil(4.0 * xi1)))
    n_fine += 1 - n_fine % 2
    a = math.exp(-xi2)
    w_lo = math.log(1e-14 / (a + problem.N))
    w_hi = math.log(80.0 / (a + problem.N * math.exp(-2.0 * xi1)))
    n_lam = max(17, int(math.ceil((w_hi - w_lo) / 0.4)) + 1)
    fine = cf.reduced_loss_on_grid(problem, xi1, xi2, (n_fine, n_lam))
    coarse = cf.reduced_loss_on_grid(problem, xi1, xi2, ((n_fine + 1) // 2, n_lam))
    return fine[1] + (fine[1] - coarse[1]) / 3, fine[2] + (fine[2] - coarse[2]) / 3


def baseline_trajectory(problem: cf.OneNNProblem, eta: float, steps: int) -> np.ndarray:
    x = np.array([0.0, problem.sigma])
    for _ in range(steps):
        g1, g2 = baseline_gradient(problem, x[0], x[1])
        x = np.array([x[0] - eta / problem.d * g1, x[1] - eta * g2])
    return x


def reference_error(gradient, xi1: float, xi2: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = cf.reduced_loss(PROBLEM, xi1, xi2, rtol=1e-5)
    return math.hypot(gradient[0] - ref.d_xi1, gradient[1] - ref.d_xi2) / math.hypot(ref.d_xi1, ref.d_xi2)


def monte_carlo_rows(n_prompts: int) -> list[list[object]]:
    """The refining quadrature at 1e-4 against the Monte Carlo time extrapolated to the same standard error."""
    rows = []
    for xi1, xi2 in ((3.0, 4.0), (12.0, 10.0), (40.0, 35.0)):
        t_quad = cpu_seconds(lambda: cf.reduced_loss(PROBLEM, xi1, xi2, rtol=MC_TARGET))
        start = time.process_time()
        mc = dyn.monte_carlo_loss(PROBLEM, xi1, xi2, n_prompts, seed=0)
        t_mc = time.process_time() - start
        rel = max(mc["loss"].standard_error / mc["loss"].mean,
                  math.hypot(mc["d_xi1"].standard_error, mc["d_xi2"].standard_error)
                  / math.hypot(mc["d_xi1"].mean, mc["d_xi2"].mean))
        t_needed = t_mc * (rel / MC_TARGET) ** 2
        rows.append([f"MC vs quadrature at ξ = ({xi1:g}, {xi2:g}), 1e-4", t_needed, t_quad, t_needed / t_quad])
    return rows


def main():
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--path-points", type=int, default=10, help="path points checked against the reference")
    p.add_argument("--mc", action="store_true", help="also time Monte Carlo against the refining quadrature")
    p.add_argument("--mc-prompts", type=int, default=100_000)
    args = p.parse_args()

    start = time.process_time()
    dyn.reduced_trajectory(PROBLEM, ETA, 2, n_records=2)  # compile or cache load, not counted
    cold = time.process_time() - start
    baseline_trajectory(PROBLEM, ETA, 2)

    runs = {}
    t_new = cpu_seconds(lambda: runs.setdefault("new", dyn.reduced_trajectory(PROBLEM, ETA, args.steps,
                                                                                n_records=args.path_points)))
    t_base = cpu_seconds(lambda: runs.setdefault("baseline", baseline_trajectory(PROBLEM, ETA, args.steps)))
    run = runs["new"]
    end_new = (run.states["xi1"][-1], run.states["xi2"][-1])
    end_base = runs["baseline"]

    path = [(a, b) for a, b in zip(run.states["xi1"], run.states["xi2"]) if a > 0]
    checks = path + [(200.0, 0.84 * 200.0), (200.0, math.inf)]
    errors = [reference_error(cf.reduced_loss_adaptive(PROBLEM, a, b)[1:], a, b) for a, b in checks]
    path_error = max(errors[:-2])
    far_error = max(errors[-2:])
    base_errors = [reference_error(baseline_gradient(PROBLEM, a, b), a, b) for a, b in path[-3:]]

    rows = [
        [f"{args.steps} reduced-GD steps (CPU s)", t_base, t_new, t_base / t_new],
        ["end of the path ξ₁ (baseline / attnflow)", end_base[0], end_new[0], end_base[0] / end_new[0]],
        ["end of the path ξ₂ (baseline / attnflow)", end_base[1], end_new[1], end_base[1] / end_new[1]],
        [f"max |∇L error| on {len(path)} path points (baseline: last 3)", max(base_errors), path_error, ""],
        ["max |∇L error| at ξ₁ = 200 (ξ₂ = 168, ∞)", "", far_error, ""],
        ["cold start of the kernels (compile or cache load, CPU s)", "", cold, ""],
    ]
    if args.mc:
        rows += monte_carlo_rows(args.mc_prompts)
    ratios = {"one_nn_speedup_vs_baseline": t_base / t_new,
              "one_nn_1e4_steps_over_10s_target": t_new * (10_000 / args.steps) / TARGET_SECONDS,
              "one_nn_gradient_rel_error_path_over_1e-3": path_error / 1e-3,
              "one_nn_gradient_rel_error_xi1_200_over_1e-3": far_error / 1e-3}
    emit("one_nn reduced GD (d = 4, N = 16, σ = 10, η = 200)", ["quantity", "baseline", "attnflow", "ratio"], rows,
         ratios, args.json)


if __name__ == "__main__":
    main()
