"""Every system's reduced ODE solve: attnflow's DOPRI5 against numbalsoda's DOP853 and scipy's solve_ivp (not a test).

For each system whose population dynamics is an ODE solved by ``solve_dopri5`` (gd_beta's gradient flow at d = 20
and d = 5, SCB's normalised flow, CCMC's fluid limit, linear_attention_h3's preconditioner flow, group_sparse's
position-only flow) the same right-hand side — the numba kernel attnflow integrates — is solved at
rtol = atol = 1e-8 by

* attnflow: ``solve_dopri5`` as the system calls it (adaptive Dormand–Prince 5(4), dense output at the times);
* attnflow's ``solve_dop853`` (Dormand–Prince 8(5,3) on the same engine, dense output of order 7) on the same kernel;
* numbalsoda's ``dop853`` with a numba ``cfunc`` wrapping the same kernel (a benchmark-only extra: skipped, with a
  message, when numbalsoda is not installed);
* scipy's ``solve_ivp`` with DOP853 and RK45, calling the same kernel from Python.

Equal tolerances are not equal accuracy: at rtol = atol = 1e-8 a DOP853 solve can be hundreds of times more
accurate than a DOPRI5 one. Every contender's final state is compared with a reference (scipy DOP853 at
rtol = atol = 1e-13) in units of the tolerance, ``max |y − y_ref| / (atol + rtol |y_ref|)``, and printed; and the
compiled contenders are also timed side by side over a sweep of tolerances, rtol = atol = 1e-3 … 1e-11 in half
decades (a work–precision diagram, ``--plot``), with the error taken over every output time, since the systems
read their flows' dense output. A contender's time *at equal accuracy* is read off its sweep at the error
attnflow's solve reaches at 1e-8: interpolated in log–log between the two points of its Pareto front that
bracket that error (``_common.seconds_at_accuracy``). The sweep runs only compiled solvers, in random order, so
its times are warmer than those of the first table, where a solve may follow a scipy one.

For gd_beta at d = 20 the floor is the time the right-hand side's linear algebra needs at the machine's GEMM rate
at the d × d × d shape: (three d × d × d products, 6d³ flops, plus eight matrix–vector products, 16d²) × the number
of evaluations attnflow's solve used. Two rates: ``_common.gemm_rate`` (numpy's matmul called from Python: at
d = 20 mostly numpy's per-call overhead, a lenient floor) and the rate of ``np.dot`` inside compiled code (strict).

Ratios (``--json``): ``<system>_vs_numbalsoda_dop853`` = numbalsoda time / attnflow time (>= 1: attnflow at least
as fast), ``..._vs_scipy_dop853``, ``..._vs_scipy_rk45`` and ``..._vs_attnflow_dop853`` likewise,
``<system>_dop853_vs_numbalsoda_dop853`` = numbalsoda time / attnflow DOP853 time (the same method at the same
tolerance; compare the error column), ``<system>_vs_<contender>_at_equal_accuracy`` = the contender's time at
the error of attnflow's solve / that solve's time (from the sweep; >= 1: attnflow's solve at least as fast
at equal accuracy), ``<system>_dop853_vs_numbalsoda_dop853_at_equal_accuracy``
likewise at the error of attnflow's DOP853 at 1e-8, ``gd_beta_d20_over_floor`` = attnflow time /
floor (lower is better; ``gd_beta_d20_over_kernel_floor`` against the strict floor). ``--compile`` also measures, in fresh processes, the first solve's CPU time with an empty
numba cache (``<system>_cold_first_call_seconds``) and in a second process reading that cache
(``<system>_cached_first_call_seconds``).

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/bench_reduced_solves.py [--repeats 5] [--json] [--compile]
        [--plot work_precision.png]
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, gemm_rate, parser, seconds_at_accuracy, side_by_side  # noqa: E402

from attnflow.dynamics.integrate import solve_dop853, solve_dopri5  # noqa: E402

RTOL = ATOL = 1e-8
REFERENCE_TOL = 1e-13
SWEEP = tuple(10.0 ** -np.arange(3.0, 11.01, 0.5))  # tolerances of the work–precision sweep
SYSTEMS = ("gd_beta_d20", "gd_beta_d5", "scb_flow", "ccmc_fluid", "linear_attention_h3_flow", "group_sparse_flow")


@dataclass
class Case:
    name: str
    rhs: object          # the numba right-hand side attnflow integrates
    y0: np.ndarray
    t_eval: np.ndarray   # output times; t_eval[0] is the initial time
    params: np.ndarray
    solve: object        # attnflow's solve, as the system calls it: (rtol, atol) -> Solution


def _in_place(rhs) -> bool:
    """Whether the kernel is ``rhs(t, y, params, out)`` (writes dy/dt into ``out``) or returns dy/dt."""
    return len(inspect.signature(rhs.py_func).parameters) == 4


def _as_system_solves(closed_forms, rhs, bound_loop):
    """(right-hand side, loop) as the system's own solve passes them to ``solve_dopri5``: the in-place kernel
    ``<rhs>_into`` where the closed forms have one (no bound loop), else the kernel and the system's bound loop."""
    into = getattr(closed_forms, rhs.__name__ + "_into", None)
    return (into, None) if into is not None else (rhs, bound_loop)


def _system_solve(rhs, y0, t_eval, params, loop):
    def solve(rtol=RTOL, atol=ATOL):
        return solve_dopri5(rhs, y0, t_eval, params, t0=float(t_eval[0]), rtol=rtol, atol=atol, loop=loop,
                            max_steps=10**7)
    return solve


def make_case(name: str) -> Case:
    if name.startswith("gd_beta"):
        import attnflow.closed_forms.gd_beta as cf
        import attnflow.dynamics.gd_beta as dy
        d = 20 if name.endswith("d20") else 5
        problem = cf.GDBetaProblem.random(d, 40, seed=0, sigma2=0.5)
        rhs, y0, params = cf.gradient_flow_rhs, np.zeros(d + d * d), cf.pack_flow_params(problem)
        t_eval = np.linspace(0.0, 30.0, 50)
        loop = getattr(dy, "flow_dopri5", None)
    elif name == "scb_flow":
        import attnflow.closed_forms.scb as cf
        import attnflow.dynamics.scb as dy
        problem = cf.SCBProblem.random(8, 64, 3, seed=0)
        # as validation.scb's crossing time: from (0, 0), dense output on a fine grid
        rhs, y0, params = cf.normalised_flow_rhs, np.zeros(2), np.array([problem.epsilon])
        t_eval = np.linspace(0.0, 60.0, 6001)
        loop = getattr(dy, "_flow_dopri5", None)
    elif name == "ccmc_fluid":
        import attnflow.closed_forms.ccmc as cf
        import attnflow.dynamics.ccmc as dy
        rhs, params = cf.fluid_rhs, cf.pack_fluid_params(cf.CYCLE_P)
        y0 = np.random.default_rng(0).dirichlet(np.ones(4))
        t_eval = np.linspace(0.0, 40.0, 121)
        loop = getattr(dy, "fluid_dopri5", None)
    elif name == "linear_attention_h3_flow":
        import attnflow.closed_forms.linear_attention_h3 as cf
        import attnflow.dynamics.linear_attention_h3 as dy
        problem = cf.golden_setting_d()
        rhs, params, y0 = cf.preconditioner_flow_rhs, cf.pack_flow_params(problem), np.zeros(problem.d ** 2)
        t_end = 30.0 / dy.flow_rate(problem)
        t_eval = np.concatenate([[0.0], np.geomspace(t_end * 1e-4, t_end, 199)])
        loop = getattr(dy, "flow_dopri5", None)
    elif name == "group_sparse_flow":
        import attnflow.closed_forms.group_sparse as cf
        import attnflow.dynamics.group_sparse as dy
        problem = cf.GroupSparseProblem.standard(4, 6)
        rhs, params, y0 = cf.position_only_flow_rhs, cf.pack_position_only_params(problem, 1.0), np.zeros(2)
        t_eval = np.concatenate([[0.0], np.geomspace(1.0, 1e5, 200)])
        loop = getattr(dy, "_position_only_dopri5", None)
    else:
        raise ValueError(name)
    if name != "scb_flow" or not hasattr(dy, "_flow_dopri5"):  # dynamics.scb binds the kernel in its own loop
        rhs, loop = _as_system_solves(cf, rhs, loop)
    return Case(name, rhs, y0, t_eval, params, _system_solve(rhs, y0, t_eval, params, loop))


def python_rhs(case: Case):
    """The kernel called from Python, as scipy needs it."""
    rhs, params, n = case.rhs, case.params, case.y0.size
    if _in_place(rhs):
        def f(t, y):
            out = np.empty(n)
            rhs(t, y, params, out)
            return out
        return f
    return lambda t, y: rhs(t, y, params)


def numbalsoda_address(case: Case):
    """A numba cfunc ``(t, u*, du*, p*)`` around the same kernel, for numbalsoda."""
    from numba import carray, cfunc
    from numbalsoda import lsoda_sig

    rhs, n, m = case.rhs, case.y0.size, case.params.size
    rhs = getattr(sys.modules[rhs.py_func.__module__], rhs.__name__ + "_into", rhs)  # the fastest form of the kernel
    if _in_place(rhs):
        @cfunc(lsoda_sig)
        def f(t, u, du, p):
            rhs(t, carray(u, (n,)), carray(p, (m,)), carray(du, (n,)))
    else:
        @cfunc(lsoda_sig)
        def f(t, u, du, p):
            value = rhs(t, carray(u, (n,)), carray(p, (m,)))
            for i in range(n):
                du[i] = value[i]
    return f.address


def solvers(case: Case) -> dict:
    """The compiled contenders as functions of the tolerance (rtol = atol): attnflow's DOPRI5 as the system calls
    it, attnflow's DOP853 on the same kernel and numbalsoda's DOP853 (when installed); each returns the states."""
    out = {"attnflow": lambda tol: case.solve(tol, tol).y,
           "attnflow_dop853": lambda tol: solve_dop853(case.rhs, case.y0, case.t_eval, case.params,
                                                       t0=float(case.t_eval[0]), rtol=tol, atol=tol,
                                                       max_steps=10**7).y}
    try:
        from numbalsoda import dop853
    except ImportError:
        print("numbalsoda is not installed: its contender is skipped (pip install numbalsoda)", file=sys.stderr)
    else:
        address = numbalsoda_address(case)

        def numbalsoda_dop853(tol):
            y, ok = dop853(address, case.y0, case.t_eval, data=case.params, rtol=tol, atol=tol, mxstep=10**8)
            if not ok:
                raise RuntimeError(f"numbalsoda dop853 failed on {case.name} at tolerance {tol:g}")
            return y
        out["numbalsoda_dop853"] = numbalsoda_dop853
    return out


def contenders(case: Case, compiled: dict) -> dict:
    """Every contender at rtol = atol = 1e-8: the compiled ones and scipy's solve_ivp from Python."""
    span = (float(case.t_eval[0]), float(case.t_eval[-1]))
    f = python_rhs(case)
    out = {label: (lambda solve=solve: solve(RTOL)) for label, solve in compiled.items()}
    for method in ("DOP853", "RK45"):
        out[f"scipy_{method.lower()}"] = (lambda method=method: solve_ivp(
            f, span, case.y0, method=method, t_eval=case.t_eval, rtol=RTOL, atol=ATOL).y.T)
    return out


def work_precision(compiled: dict, reference: np.ndarray, repeats: int) -> dict:
    """Each compiled contender's (tolerance, error, CPU seconds) over ``SWEEP``, timed side by side; the error is
    ``max |y − y_ref| / (1 + |y_ref|)`` over every output time (``reference`` holds the states at all of them: the
    systems read their flows' dense output, not only the final state), a measure that does not depend on the
    tolerance asked for."""
    cases = {(label, tol): (lambda solve=solve, tol=tol: solve(tol)) for label, solve in compiled.items()
             for tol in SWEEP}
    errors = {key: relative_error(np.asarray(function()), reference) for key, function in cases.items()}
    times = side_by_side(cases, repeats, warmup=False)  # the error pass above was the warm-up
    return {label: [(tol, errors[label, tol], times[label, tol]) for tol in SWEEP] for label in compiled}


def at_system_tolerance(points: list) -> tuple[float, float]:
    """(error, seconds) of the sweep point at the systems' tolerance RTOL (the nearest of ``SWEEP``)."""
    _, error, seconds = min(points, key=lambda point: abs(math.log(point[0] / RTOL)))
    return error, seconds


def equal_accuracy_rows(name: str, curves: dict, ratios: dict) -> list[list]:
    """Table rows and ratios comparing contenders at equal accuracy: a contender's time to reach the error of
    attnflow's solve at 1e-8 (DOPRI5, as the system calls it), read off its sweep, over that solve's time; and
    numbalsoda's time to reach the error of attnflow's DOP853 at 1e-8, over that solve's time. The error column
    of these rows is the sweep's (every output time), in units of the tolerance 1e-8."""
    rows = []
    comparisons = [("attnflow", label) for label in curves if label != "attnflow"]
    if "numbalsoda_dop853" in curves:
        comparisons.append(("attnflow_dop853", "numbalsoda_dop853"))
    for ours, theirs in comparisons:
        error, seconds = at_system_tolerance(curves[ours])
        needed, how = seconds_at_accuracy([(e, t) for _, e, t in curves[theirs]], error)
        prefix = name if ours == "attnflow" else f"{name}_dop853"
        ratios[f"{prefix}_vs_{theirs}_at_equal_accuracy"] = needed / seconds
        rows.append([name, f"{theirs} at the error of {ours} (1e-8), {how}", needed * 1e3, needed / seconds,
                     error / RTOL, ""])
    return rows


def relative_error(ys, reference) -> float:
    """max |y − y_ref| / (1 + |y_ref|): :func:`final_error`'s measure without the tolerance's units."""
    return final_error(ys, reference, atol=1.0, rtol=1.0)


def plot_work_precision(curves: dict, targets: dict, path: str) -> None:
    """One log–log panel per system: CPU time against the error (every output time) for each compiled contender over the
    tolerance sweep, with the system's own solve (DOPRI5 at 1e-8) marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    names = list(curves)
    columns = min(3, len(names))
    rows = -(-len(names) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.9 * rows), squeeze=False)
    styles = {"attnflow": ("C0", "o", "attnflow DOPRI5"), "attnflow_dop853": ("C2", "s", "attnflow DOP853"),
              "numbalsoda_dop853": ("C3", "^", "numbalsoda DOP853")}
    for axis, name in zip(axes.flat, names):
        for label, points in curves[name].items():
            color, marker, text = styles[label]
            axis.loglog([max(e, 1e-17) for _, e, _ in points], [t * 1e3 for _, _, t in points], marker=marker,
                        color=color, label=text, markersize=4, linewidth=1)
        error, seconds = targets[name]
        axis.loglog([error], [seconds * 1e3], marker="*", color="k", markersize=13, linestyle="none",
                    label="the system's solve (1e-8)")
        axis.axvline(error, color="k", linewidth=0.6, linestyle=":")
        axis.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        axis.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
        axis.set_title(name, fontsize=10)
        axis.set_xlabel("error  max over outputs |y − y_ref| / (1 + |y_ref|)")
        axis.set_ylabel("CPU ms per solve")
        axis.grid(True, which="major", linewidth=0.4, alpha=0.5)
    for axis in axes.flat[len(names):]:
        axis.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    figure.suptitle("Work–precision of the reduced solves: rtol = atol from 1e-3 to 1e-11 (lower left is better)")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise SystemExit(f"--plot: cannot write {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)


def final_error(y_final, reference, atol: float = ATOL, rtol: float = RTOL) -> float:
    """max |y − y_ref| / (atol + rtol |y_ref|): the error in units of the tolerance."""
    return float(np.max(np.abs(y_final - reference) / (atol + rtol * np.abs(reference))))


def gd_beta_flops(d: int) -> float:
    """Flops of one evaluation of the flow's right-hand side: three d × d × d products and eight matrix–vector
    products (the elementwise work is not counted)."""
    return 6.0 * d**3 + 16.0 * d**2


def gd_beta_floor(n_evals: int, d: int = 20) -> float:
    """Seconds the flow's linear algebra needs at ``_common.gemm_rate`` (numpy's matmul called from Python, so at
    d = 20 the rate includes numpy's per-call overhead)."""
    return n_evals * gd_beta_flops(d) / gemm_rate(d, d, d)


def kernel_gemm_rate(d: int, calls: int = 20000, repeats: int = 7) -> float:
    """The d × d × d GEMM rate inside compiled code (np.dot into a preallocated result, as the kernel calls it): the
    stricter floor, without numpy's per-call overhead."""
    from numba import njit

    @njit
    def products(a, b, out, calls):
        for _ in range(calls):
            np.dot(a, b, out)
            a[0, 0] += 1e-300  # keep the calls from being folded
        return out[0, 0]

    rng = np.random.default_rng(0)
    a, b, out = rng.standard_normal((d, d)), rng.standard_normal((d, d)), np.empty((d, d))
    products(a, b, out, 1)
    best = min(_seconds(lambda: products(a, b, out, calls)) for _ in range(repeats))
    return 2.0 * d**3 * calls / best


def _seconds(function) -> float:
    start = time.process_time()
    function()
    return time.process_time() - start


def child(name: str) -> None:
    """In a fresh process: the CPU time of the first solve (compile, or load from NUMBA_CACHE_DIR)."""
    case = make_case(name)
    start = time.process_time()
    case.solve()
    print(json.dumps({"first_call": time.process_time() - start}))


def first_call_seconds(name: str, cache_dir: str) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name], env=env, check=True,
                            capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["first_call"]


def main():
    p = parser(__doc__)
    p.add_argument("--compile", action="store_true", help="also time cold and cached first calls in fresh processes")
    p.add_argument("--systems", nargs="*", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--plot", metavar="PNG", help="write the work–precision diagram of the sweep to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        p.error(f"--plot: no directory {os.path.dirname(os.path.abspath(args.plot))}")  # before the runs, not after
    rows, ratios, curves, targets = [], {}, {}, {}
    for name in args.systems:
        case = make_case(name)
        compiled = solvers(case)
        cases = contenders(case, compiled)
        reference = solve_ivp(python_rhs(case), (case.t_eval[0], case.t_eval[-1]), case.y0, method="DOP853",
                              t_eval=case.t_eval, rtol=REFERENCE_TOL, atol=REFERENCE_TOL).y.T  # every output time
        errors = {label: final_error(np.asarray(fn())[-1], reference[-1]) for label, fn in cases.items()}
        times = side_by_side(cases, args.repeats)
        n_evals = case.solve().n_rhs_evals
        ours = times["attnflow"]
        for label, seconds in times.items():
            speedup = seconds / ours
            rows.append([name, label, seconds * 1e3, speedup, errors[label], n_evals if label == "attnflow" else ""])
            if label != "attnflow":
                ratios[f"{name}_vs_{label}"] = speedup
        if "numbalsoda_dop853" in times:  # the same method at the same tolerance (compare the error column)
            ratios[f"{name}_dop853_vs_numbalsoda_dop853"] = times["numbalsoda_dop853"] / times["attnflow_dop853"]
        curves[name] = work_precision(compiled, reference, args.repeats)
        rows.extend(equal_accuracy_rows(name, curves[name], ratios))
        targets[name] = at_system_tolerance(curves[name]["attnflow"])
        if name == "gd_beta_d20":
            floor = gd_beta_floor(n_evals)
            rows.append([name, "floor (_common.gemm_rate)", floor * 1e3, floor / ours, "", ""])
            ratios["gd_beta_d20_over_floor"] = ours / floor
            kernel_floor = n_evals * gd_beta_flops(20) / kernel_gemm_rate(20)
            rows.append([name, "floor (GEMM rate in compiled code)", kernel_floor * 1e3, kernel_floor / ours, "", ""])
            ratios["gd_beta_d20_over_kernel_floor"] = ours / kernel_floor
        if args.compile:
            with tempfile.TemporaryDirectory() as cache:
                ratios[f"{name}_cold_first_call_seconds"] = first_call_seconds(name, cache)
                ratios[f"{name}_cached_first_call_seconds"] = first_call_seconds(name, cache)
            rows.append([name, "first call: cold / cached (s)", ratios[f"{name}_cold_first_call_seconds"],
                         ratios[f"{name}_cached_first_call_seconds"], "", ""])
    if args.plot:
        plot_work_precision(curves, targets, args.plot)
    emit("reduced ODE solves, rtol = atol = 1e-8; 'equal accuracy' rows from the sweep 1e-3 ... 1e-11",
         ["system", "contender", "ms (CPU)", "attnflow speed-up", "error / tol", "RHS evals"], rows, ratios,
         args.json)


if __name__ == "__main__":
    main()
