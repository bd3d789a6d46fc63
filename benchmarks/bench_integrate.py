"""attnflow's DOPRI5 against scipy.integrate.solve_ivp, side by side in one process (not a test).

Two problems: the GD-β gradient flow at d = 20 and d = 5 (state of size d + d²) and the 2-D Van der Pol
oscillator. scipy runs RK45 and DOP853, each with a pure-Python (numpy) right-hand side and with the numba
right-hand side that attnflow uses. All at rtol = atol = 1e-8. Compile time is excluded from the ratios
(every function is called once first; the cold start is printed separately). Timings are median CPU times of
``--repeats`` interleaved runs (``_common.side_by_side``); ``--json`` prints the ratios (scipy time / attnflow time)
as one JSON object. benchmarks/bench_reduced_solves.py compares every system's flow with numbalsoda too.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_integrate.py [--repeats 5] [--json]
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
from numba import njit
from scipy.integrate import solve_ivp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, parser, side_by_side  # noqa: E402

import attnflow.closed_forms.gd_beta as cf  # noqa: E402
from attnflow.closed_forms.gd_beta import GDBetaProblem  # noqa: E402
from attnflow.dynamics.integrate import solve_dopri5  # noqa: E402

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


def van_der_pol_numpy(mu):
    return lambda t, y: np.array([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


def contenders(rhs_numba, params, numpy_rhs, y0, t_eval):
    """attnflow's solve and scipy's, the latter with the numba kernel (called from Python) and a numpy one."""
    span = (t_eval[0], t_eval[-1])
    n = y0.size
    if rhs_numba.py_func.__code__.co_argcount == 4:  # rhs(t, y, params, out)
        def numba_from_python(t, y):
            out = np.empty(n)
            rhs_numba(t, y, params, out)
            return out
    else:
        def numba_from_python(t, y):
            return rhs_numba(t, y, params)
    out = {"attnflow": lambda: solve_dopri5(rhs_numba, y0, t_eval, params, rtol=RTOL, atol=ATOL)}
    for method in ("RK45", "DOP853"):
        for label, f in (("python_rhs", numpy_rhs), ("numba_rhs", numba_from_python)):
            out[f"scipy_{method.lower()}_{label}"] = (
                lambda f=f, method=method: solve_ivp(f, span, y0, method=method, t_eval=t_eval, rtol=RTOL, atol=ATOL))
    return out


def main():
    args = parser(__doc__).parse_args()
    rows, ratios = [], {}
    problems = []
    for d in (20, 5):
        problem = GDBetaProblem.random(d, 40, seed=0, sigma2=0.5)
        y0, params, t_eval = np.zeros(d + d * d), cf.pack_flow_params(problem), np.linspace(0.0, 30.0, 50)
        start = time.process_time()
        solve_dopri5(cf.gradient_flow_rhs_into, y0, t_eval, params, rtol=RTOL, atol=ATOL)
        print(f"first GD-β solve at d = {d} (compile or cache load): {time.process_time() - start:.2f} s CPU",
              file=sys.stderr)
        problems.append((f"gd_beta_d{d}", contenders(cf.gradient_flow_rhs_into, params, gd_beta_numpy_rhs(problem),
                                                      y0, t_eval)))
    problems.append(("van_der_pol", contenders(van_der_pol_rhs, np.array([1.0]), van_der_pol_numpy(1.0),
                                               np.array([2.0, 0.0]), np.linspace(0.0, 20.0, 200))))
    for name, cases in problems:
        times = side_by_side(cases, args.repeats)
        for label, seconds in times.items():
            rows.append([name, label, seconds * 1e3, seconds / times["attnflow"]])
            if label != "attnflow":
                ratios[f"{name}_vs_{label}"] = seconds / times["attnflow"]
    emit("attnflow DOPRI5 vs scipy solve_ivp, rtol = atol = 1e-8", ["problem", "contender", "ms (CPU)",
         "attnflow speed-up"], rows, ratios, args.json)


if __name__ == "__main__":
    main()
