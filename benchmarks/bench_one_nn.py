"""1-NN: quadrature against Monte Carlo for the population loss + gradient at 1e-4 relative error, and the time
of a 10⁴-step reduced GD trajectory (not a test).

Quadrature: ``reduced_loss(..., rtol=1e-4)``, including its own grid refinement and error estimate. Monte Carlo:
``monte_carlo_loss`` measured at ``--mc-prompts`` prompts; the prompts needed for a 1e-4 relative standard
error (of the loss and of the gradient, relative to its norm) follow from the measured standard errors, and its
time is extrapolated linearly from the measured run (Monte Carlo cost is linear in prompts). Both run in this
process, side by side.

    python benchmarks/bench_one_nn.py [--mc-prompts 100000]
"""
from __future__ import annotations

import argparse
import math
import time

from attnflow.closed_forms import one_nn as cf
from attnflow.dynamics import one_nn as dyn

TARGET = 1e-4


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mc-prompts", type=int, default=100_000)
    args = parser.parse_args()
    problem = cf.OneNNProblem(4, 16, 10.0)
    start = time.perf_counter()
    cf.reduced_loss_on_grid(problem, 1.0, 1.0)
    print(f"cold start of the quadrature kernel (compile or cache load): {time.perf_counter() - start:.2f} s")
    print(f"\nd = {problem.d}, N = {problem.N}; target relative error {TARGET:g} for L and ∇L")
    print(f"{'(ξ₁, ξ₂)':>12s} {'quadrature':>12s} {'achieved':>9s} {'MC prompts needed':>18s} {'MC time':>10s} {'ratio':>9s}")
    for xi1, xi2 in ((3.0, 4.0), (12.0, 10.0), (40.0, 35.0)):
        start = time.perf_counter()
        quad = cf.reduced_loss(problem, xi1, xi2, rtol=TARGET)
        t_quad = time.perf_counter() - start
        achieved = max(quad.loss_error / quad.loss, quad.gradient_error / math.hypot(quad.d_xi1, quad.d_xi2))
        start = time.perf_counter()
        mc = dyn.monte_carlo_loss(problem, xi1, xi2, args.mc_prompts, seed=0)
        t_mc = time.perf_counter() - start
        rel_loss = mc["loss"].standard_error / mc["loss"].mean
        rel_grad = math.hypot(mc["d_xi1"].standard_error, mc["d_xi2"].standard_error) / math.hypot(
            mc["d_xi1"].mean, mc["d_xi2"].mean)
        needed = args.mc_prompts * max(rel_loss, rel_grad) ** 2 / TARGET**2
        t_needed = t_mc * needed / args.mc_prompts
        print(f"{f'({xi1:g}, {xi2:g})':>12s} {t_quad * 1e3:10.1f}ms {achieved:9.1e} {needed:18.3g} {t_needed:9.0f}s "
              f"{t_needed / t_quad:8.3g}x")

    print("\nreduced GD, 10⁴ steps (η = 200), quadrature grid growing with ξ₁ (cf.Resolution):")
    for resolution in (cf.DYNAMICS_RESOLUTION, cf.Resolution(theta_per_xi1=3.0, dw=0.5)):
        start = time.perf_counter()
        run = dyn.reduced_trajectory(problem, 200.0, 10_000, n_records=20, resolution=resolution)
        print(f"  {resolution}: {time.perf_counter() - start:.1f} s (final ξ₁ = {run.states['xi1'][-1]:.2f}, "
              f"loss {run.metrics['loss'][-1]:.5f}, gradient error at the end "
              f"{run.info['final_gradient_error']:.1e})")
    print("Targets: quadrature >= 1000x faster than MC at 1e-4; 10⁴ steps in under 10 s.")


if __name__ == "__main__":
    main()
