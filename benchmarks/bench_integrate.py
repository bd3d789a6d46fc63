"""attnflow's DOPRI5 against scipy.integrate.solve_ivp, side by side in one process (not a test).

Two problems: the GD-β gradient flow at d = 20 (state of size d + d² = 420) and the 2-D Van der Pol
oscillator. scipy runs RK45 and DOP853, each with a pure-Python (numpy) right-hand side and with the numba
right-hand side that attnflow uses. All at rtol = atol = 1e-8. Compile time is excluded from the ratios
(every function is called once first) and reported separately. Each timing is the best of ``--repeats``
runs, interleaved, so a noisy neighbour slows every contender alike.

    python benchmarks/bench_integrate.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit
from scipy.integrate import solve_ivp

import attnflow.closed_forms.gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem
from attnflow.dynamics.gd_beta import flow_dopri5
from attnflow.dynamics.integrate import dopri5_loop, solve_dopri5

RTOL = ATOL = 1e-8


# ---- the GD-β flow: an independent numpy right-hand side (docs/gd_beta.md §9) --------------------------------------
def gd_beta_numpy_rhs(problem):
    """The same algebra as the numba kernel (precomputed HΨH and tr(HΨ), matrix-vector products for B(Γ)e),
    so the comparison measures the integrator and the language, not a cleverer formula."""
    H, bs, s2, N = problem.H, problem.beta_star, problem.sigma2, problem.N
    d = problem.d
    HPsiH, tr_HPsi = H @ problem.Psi @ H, np.trace(H @ problem.Psi)

    def rhs(t, y):
        beta0, Gamma = y[:d], y[d:].reshape(d, d)
        e = beta0 - bs
        He = H @ e
        HSH = HPsiH + np.outer(He, He)
        HG, GH = H @ Gamma, Gamma @ H
        GHe = Gamma @ He
        HMe = H @ (e - GHe)
        Be = HMe - H @ (Gamma.T @ HMe) + H @ (Gamma.T @ (H @ GHe)) / N + np.sum(HG * GH) / N * He
        dGamma = 2 * HSH - 2 * HG @ ((N + 1) / N * HSH + (tr_HPsi + e @ He + s2) / N * H)
        return np.concatenate([-2 * Be, dGamma.ravel()])

    return rhs


# ---- Van der Pol ------------------------------------------------------------------------------------------
@njit(cache=True)
def van_der_pol_rhs(t, y, p):
    out = np.empty(2)
    out[0] = y[1]
    out[1] = p[0] * (1.0 - y[0] * y[0]) * y[1] - y[0]
    return out


@njit(cache=True)
def _van_der_pol_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    return dopri5_loop(van_der_pol_rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def van_der_pol_numpy(mu):
    return lambda t, y: np.array([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


def best_time(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def contenders(rhs_numba, params, numpy_rhs, y0, t_eval, loop):
    span = (t_eval[0], t_eval[-1])
    numba_from_python = lambda t, y: rhs_numba(t, y, params)  # noqa: E731
    ours = lambda: solve_dopri5(rhs_numba, y0, t_eval, params, rtol=RTOL, atol=ATOL, loop=loop)  # noqa: E731
    out = {"attnflow DOPRI5 (numba loop)": ours}
    for method in ("RK45", "DOP853"):
        for label, f in (("Python RHS", numpy_rhs), ("numba RHS", numba_from_python)):
            out[f"scipy {method}, {label}"] = (
                lambda f=f, method=method: solve_ivp(f, span, y0, method=method, t_eval=t_eval, rtol=RTOL, atol=ATOL))
    return out


def run(name, cases, repeats):
    print(f"\n== {name} ==")
    compile_start = time.perf_counter()
    for function in cases.values():  # warm-up: compile (or load from cache) everything first
        function()
    print(f"first calls (compile or cache load, all contenders): {time.perf_counter() - compile_start:.2f} s")
    timings = {label: [] for label in cases}
    for _ in range(repeats):  # interleaved
        for label, function in cases.items():
            timings[label].append(best_time(function, 1))
    ours = min(timings["attnflow DOPRI5 (numba loop)"])
    print(f"{'contender':38s} {'best time':>12s} {'attnflow speed-up':>18s}")
    for label, values in timings.items():
        print(f"{label:38s} {min(values) * 1e3:10.2f}ms {min(values) / ours:17.1f}x")
    return {label: min(values) / ours for label, values in timings.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    start = time.perf_counter()
    flows = {}
    for d in (20, 5):
        problem = GDBetaProblem.random(d, 40, seed=0, sigma2=0.5)
        y0 = np.zeros(d + d * d)
        params = cf.pack_flow_params(problem)
        t_eval = np.linspace(0.0, 30.0, 50)
        sol = solve_dopri5(cf.gradient_flow_rhs, y0, t_eval, params, rtol=RTOL, atol=ATOL, loop=flow_dopri5)
        if d == 20:
            print(f"cold start of the GD-β flow kernel (compile or cache load): {time.perf_counter() - start:.2f} s")
        flows[d] = run(f"GD-β gradient flow, d = {d} ({d + d * d} states), t ∈ [0, 30], "
                       f"{sol.n_rhs_evals} RHS evaluations",
                       contenders(cf.gradient_flow_rhs, params, gd_beta_numpy_rhs(problem), y0, t_eval, flow_dopri5),
                       args.repeats)
    vdp = run("Van der Pol, μ = 1 (2 states), t ∈ [0, 20]",
              contenders(van_der_pol_rhs, np.array([1.0]), van_der_pol_numpy(1.0), np.array([2.0, 0.0]),
                         np.linspace(0.0, 20.0, 200), _van_der_pol_dopri5), args.repeats)
    print("\nTargets: >= 50x vs scipy with a Python RHS, >= 5x vs scipy with a numba RHS.")
    for name, r in (("GD-β flow d = 20", flows[20]), ("GD-β flow d = 5", flows[5]), ("Van der Pol", vdp)):
        python = min(v for k, v in r.items() if "Python RHS" in k)
        numba = min(v for k, v in r.items() if "numba RHS" in k)
        print(f"{name}: worst case {python:.1f}x vs Python RHS, {numba:.1f}x vs numba RHS")


if __name__ == "__main__":
    main()
