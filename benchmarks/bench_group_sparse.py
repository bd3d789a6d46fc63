"""Group-sparse position-only gradient flow (docs/group_sparse.md §6): attnflow against scipy and numbalsoda, side
by side in one process (not a test).

The problem is the one of ``group_sparse.time_to_loss_submodel``: the (β, α) flow at d = 4, D = 6, σ_x = 1 from
(0, 0) to τ = 10⁷, recorded at 200 log-spaced times. Contenders, all at rtol = atol = 1e-8:

* attnflow: ``dynamics.group_sparse.position_only_flow`` (the whole public call: validation, the flow, and the loss
  at the 200 recorded times);
* scipy ``solve_ivp`` RK45 with a numpy right-hand side written here, independently of attnflow's kernels;
* numbalsoda ``dop853`` (Hairer's DOP853 in C) with a numba ``cfunc`` right-hand side written here, and once more
  with a cfunc that calls attnflow's own public ``position_only_flow_rhs`` (the same right-hand side, so only the
  integrators and their overheads differ). numbalsoda is a benchmark-only extra: without it those rows are skipped.

Each baseline gets two right-hand sides:

* "reduced": the closed form of docs/group_sparse.md §6 (the skew part of U in closed form, one Gaussian integral
  E[σ(cN)σ(−cN)] left), the integral by 128-node Gauss–Legendre on [0, x_max(c)], accurate to ~1e-13;
* "3-grid": the quadrature attnflow used before the reduction (the trapezoid rule against the skew-normal
  density on the union of three grids of 1501 nodes), each node evaluated once; its error is ~1e-4 at late times,
  so it does not agree with an accurate flow to 1e-6 at τ = 10⁷ and its rows are not "equal accuracy".

The headline ratios compare attnflow with the "reduced" baselines, which compute the same integrals to the same
accuracy; the final states are checked to agree to 1e-6 (relative). Ratios are baseline time / attnflow time (> 1:
attnflow is faster). First-call compile times of every group_sparse kernel are measured in a fresh process with an
empty numba cache (CPU time of each public call's first invocation).

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/bench_group_sparse.py [--repeats 5] [--json]
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from numba import njit
from scipy.integrate import solve_ivp
from scipy.special import expit, ndtr

from attnflow.closed_forms import group_sparse as cf
from attnflow.closed_forms.group_sparse import GroupSparseProblem
from attnflow.dynamics import group_sparse as dyn

from _common import emit, parser, side_by_side

RTOL = ATOL = 1e-8
D, SIGMA_X = 6, 1.0
TIMES = np.geomspace(1.0, 1e7, 200)
AGREEMENT = 1e-6
SQRT_2PI = math.sqrt(2.0 * math.pi)
GL_T, GL_W = np.polynomial.legendre.leggauss(128)
GL_T, GL_W = 0.5 * (GL_T + 1.0), 0.5 * GL_W  # on [0, 1]
GRID_NODES = 1501


# ---- the right-hand side written independently (docs/group_sparse.md §6) -------------------------------------------
def _shape(beta, alpha, D, sigma_x):
    """(s*, a, b, ω, κ): attention on j*, U = a|G| + bZ, ω = √(a² + b²), κ = Dβσ_x."""
    e = math.exp(-abs(alpha))
    s_star = 1.0 / (1.0 + (D - 1) * e) if alpha > 0 else e / (e + D - 1)
    s_o = e / (1.0 + (D - 1) * e) if alpha > 0 else 1.0 / (e + D - 1)
    a, b = s_star, s_o * math.sqrt(D - 1)
    return s_star, a, b, math.hypot(a, b), D * beta * sigma_x


def _flow_from(s_star, a, b, omega, kappa, E_d2l, E_dlU, D, sigma_x):
    d_beta = D * sigma_x * E_dlU
    d_alpha = kappa * ((1.0 - s_star) * E_dlU - b * b * kappa * E_d2l)
    return -d_beta, -d_alpha / (D - 1)


def reduced_numpy_rhs(t, y):
    """E[ℓ''(κU)] = F(c) = E[σ(cN)σ(−cN)] with c = κω, E[ℓ'(κU)U] = −a/√(2π) + κω²F(c)."""
    s_star, a, b, omega, kappa = _shape(y[0], y[1], D, SIGMA_X)
    c = kappa * omega
    x_max = math.sqrt(c * c + 90.0) - c  # c·x + x²/2 = 45
    x = x_max * GL_T
    e = np.exp(-c * x)
    F = 2.0 * x_max * np.dot(GL_W, e / (1.0 + e) ** 2 * np.exp(-0.5 * x * x)) / SQRT_2PI
    return np.array(_flow_from(s_star, a, b, omega, kappa, F, -a / SQRT_2PI + kappa * omega**2 * F, D, SIGMA_X))


def grid_numpy_rhs(t, y):
    """The former rule: trapezoid against 2φ(x)Φ(λx) on the union of three uniform grids."""
    s_star, a, b, omega, kappa = _shape(y[0], y[1], D, SIGMA_X)
    lam = a / b
    half_loss = min(14.0, 60.0 / max(kappa * omega, 1e-300))
    half_skew = min(14.0, 60.0 / lam) if lam > 0 else 14.0
    x = np.sort(np.concatenate([np.linspace(-14.0, 14.0, GRID_NODES), np.linspace(-half_loss, half_loss, GRID_NODES),
                                np.linspace(-half_skew, half_skew, GRID_NODES)]))
    w = np.zeros_like(x)
    dx = 0.5 * np.diff(x)
    w[:-1] += dx
    w[1:] += dx
    density = w * 2.0 * np.exp(-0.5 * x * x) / SQRT_2PI * ndtr(lam * x)
    U = omega * x
    s_neg = expit(-kappa * U)
    E_dlU = -np.dot(density, s_neg * U)
    E_d2l = np.dot(density, s_neg * (1.0 - s_neg))
    return np.array(_flow_from(s_star, a, b, omega, kappa, E_d2l, E_dlU, D, SIGMA_X))


@njit(cache=False)
def _shape_nb(beta, alpha, D, sigma_x):
    e = math.exp(-abs(alpha))
    if alpha > 0:
        s_star, s_o = 1.0 / (1.0 + (D - 1) * e), e / (1.0 + (D - 1) * e)
    else:
        s_star, s_o = e / (e + D - 1), 1.0 / (e + D - 1)
    a, b = s_star, s_o * math.sqrt(D - 1)
    return s_star, a, b, math.sqrt(a * a + b * b), D * beta * sigma_x


@njit(cache=False)
def _reduced_nb(beta, alpha, D, sigma_x, t_nodes, w_nodes):
    s_star, a, b, omega, kappa = _shape_nb(beta, alpha, D, sigma_x)
    c = kappa * omega
    x_max = math.sqrt(c * c + 90.0) - c
    F = 0.0
    for i in range(t_nodes.size):
        x = x_max * t_nodes[i]
        e = math.exp(-c * x)
        F += w_nodes[i] * e / ((1.0 + e) * (1.0 + e)) * math.exp(-0.5 * x * x)
    F *= 2.0 * x_max / math.sqrt(2.0 * math.pi)
    E_dlU = -a / math.sqrt(2.0 * math.pi) + kappa * omega * omega * F
    return -D * sigma_x * E_dlU, -kappa * ((1.0 - s_star) * E_dlU - b * b * kappa * F) / (D - 1)


@njit(cache=False)
def _grid_nb(beta, alpha, D, sigma_x, n):
    """Three sorted uniform grids merged in one pass; each node evaluated once (2 exps and an erfc)."""
    s_star, a, b, omega, kappa = _shape_nb(beta, alpha, D, sigma_x)
    lam = a / b
    halves = (14.0, min(14.0, 60.0 / max(kappa * omega, 1e-300)), min(14.0, 60.0 / lam) if lam > 0 else 14.0)
    idx = [0, 0, 0]
    E_dlU = 0.0
    E_d2l = 0.0
    previous = 0.0
    previous_terms = (0.0, 0.0)
    for k in range(3 * n):
        best = -1
        x = 0.0
        for g in range(3):
            if idx[g] < n:
                xg = -halves[g] + 2.0 * halves[g] * idx[g] / (n - 1)
                if best < 0 or xg < x:
                    best, x = g, xg
        idx[best] += 1
        density = 2.0 * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * 0.5 * math.erfc(-lam * x / math.sqrt(2.0))
        m = kappa * omega * x
        e = math.exp(-abs(m))
        s_neg = e / (1.0 + e) if m >= 0 else 1.0 / (1.0 + e)
        terms = (-density * s_neg * omega * x, density * e / ((1.0 + e) * (1.0 + e)))
        if k > 0:
            h = 0.5 * (x - previous)
            E_dlU += h * (terms[0] + previous_terms[0])
            E_d2l += h * (terms[1] + previous_terms[1])
        previous, previous_terms = x, terms
    d_beta = D * sigma_x * E_dlU
    d_alpha = kappa * ((1.0 - s_star) * E_dlU - b * b * kappa * E_d2l)
    return -d_beta, -d_alpha / (D - 1)


def numbalsoda_contenders():
    """numbalsoda's DOP853 with cfunc right-hand sides, or {} when numbalsoda is not installed."""
    try:
        import numbalsoda
    except ImportError:
        print("numbalsoda is not installed: its rows are skipped (pip install numbalsoda)", file=sys.stderr)
        return {}, {}
    from numba import cfunc, carray

    t_nodes, w_nodes = GL_T.copy(), GL_W.copy()

    @cfunc(numbalsoda.lsoda_sig)
    def reduced_cfunc(t, u, du, p):
        d_beta, d_alpha = _reduced_nb(u[0], u[1], int(p[0]), p[1], t_nodes, w_nodes)
        du[0] = d_beta
        du[1] = d_alpha
        p[4] += 1.0

    @cfunc(numbalsoda.lsoda_sig)
    def grid_cfunc(t, u, du, p):
        d_beta, d_alpha = _grid_nb(u[0], u[1], int(p[0]), p[1], GRID_NODES)
        du[0] = d_beta
        du[1] = d_alpha
        p[4] += 1.0

    rhs = cf.position_only_flow_rhs  # attnflow's own public right-hand side: the integrators alone differ

    @cfunc(numbalsoda.lsoda_sig)
    def attnflow_cfunc(t, u, du, p):
        out = rhs(t, carray(u, 2), carray(p, 3))
        du[0] = out[0]
        du[1] = out[1]
        p[3] += 1.0

    t_eval = np.concatenate([[0.0], TIMES])
    counters = {}

    def solver(address, label):
        def run():
            data = np.array([float(D), SIGMA_X, 1.0, 0.0, 0.0])  # (D, σ_x, η) and evaluation counters
            y, ok = numbalsoda.dop853(address, np.zeros(2), t_eval, data=data, rtol=RTOL, atol=ATOL,
                                      mxstep=1_000_000)
            if not ok:
                raise RuntimeError(f"{label} failed")
            counters[label] = int(data[3] + data[4])
            return y[1:]
        return run

    cfuncs = {"numbalsoda DOP853, reduced cfunc RHS": reduced_cfunc,
              "numbalsoda DOP853, attnflow's RHS kernel": attnflow_cfunc,
              "numbalsoda DOP853, 3-grid cfunc RHS": grid_cfunc}
    cases = {label: solver(function.address, label) for label, function in cfuncs.items()}
    return cases, counters


def scipy_contender(rhs):
    def run():
        sol = solve_ivp(rhs, (0.0, TIMES[-1]), np.zeros(2), method="RK45", t_eval=TIMES, rtol=RTOL, atol=ATOL)
        if not sol.success:
            raise RuntimeError(sol.message)
        run.n_evals = sol.nfev
        return sol.y.T
    return run


def attnflow_contender(problem):
    accepts_atol = "atol" in inspect.signature(dyn.position_only_flow).parameters
    options = dict(rtol=RTOL, atol=ATOL) if accepts_atol else dict(rtol=RTOL)

    def run():
        flow = dyn.position_only_flow(problem, TIMES, **options)
        run.n_evals = flow.info["n_rhs_evals"]
        return np.column_stack([flow.states["beta"], flow.states["alpha"]])
    run.atol = ATOL if accepts_atol else 1e-12
    return run


# ---- cold compile times, measured in a fresh process with an empty numba cache ------------------------------------
COLD_SCRIPT = r"""
import json, time
import numpy as np
from numba import njit
from attnflow.closed_forms import group_sparse as cf
from attnflow.dynamics import group_sparse as dyn

@njit
def _warm(x):
    return x + 1.0
_warm(1.0)  # numba's own start-up, not counted against any kernel

p = cf.GroupSparseProblem.standard(4, 6)
rng = np.random.default_rng(0)
X, y = dyn.sample_data(p, 8, rng)
v, W = np.zeros(10), np.zeros((10, 10))
calls = [
    ("position_only_terms", lambda: cf.position_only_terms(p, 1.0, 1.0)),
    ("position_only_trajectory (GD map)", lambda: dyn.position_only_trajectory(p, 1.0, 5)),
    ("position_only_flow (DOPRI5)", lambda: dyn.position_only_flow(p, np.array([1.0, 10.0]))),
    ("loss_and_gradient (_batch_terms)", lambda: dyn.loss_and_gradient(p, X, y, v, W)),
    ("attention_matrix", lambda: dyn.attention_matrix(p, X, W)),
    ("fine_tune (online SGD)", lambda: dyn.fine_tune(p, W, X, y)),
    ("transformer_error (predict)", lambda: dyn.transformer_error(X, y, v, W)),
]
out = {}
for name, call in calls:
    start = time.process_time()
    call()
    out[name] = time.process_time() - start
print(json.dumps(out))
"""


def cold_compile_times() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, "-c", COLD_SCRIPT], env=env, capture_output=True, text=True,
                              check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    args = parser(__doc__).parse_args()
    problem = GroupSparseProblem.standard(4, D, sigma_x=SIGMA_X)
    cold = cold_compile_times()

    ours = attnflow_contender(problem)
    cases = {"attnflow position_only_flow (DOPRI5)": ours,
             "scipy RK45, reduced numpy RHS": scipy_contender(reduced_numpy_rhs),
             "scipy RK45, 3-grid numpy RHS": scipy_contender(grid_numpy_rhs)}
    extra, counters = numbalsoda_contenders()
    cases.update(extra)

    finals = {label: np.asarray(run())[-1] for label, run in cases.items()}  # also the warm-up (compile) call
    evals = {label: getattr(run, "n_evals", counters.get(label)) for label, run in cases.items()}
    timings = side_by_side(cases, args.repeats, warmup=False)

    reference = finals["attnflow position_only_flow (DOPRI5)"]
    mine = timings["attnflow position_only_flow (DOPRI5)"]
    rows, ratios = [], {}
    for label, seconds in timings.items():
        gap = float(np.max(np.abs(finals[label] - reference) / np.abs(reference)))
        rows.append([label, seconds * 1e3, evals[label], seconds / mine, f"{gap:.1e}",
                     "yes" if gap <= AGREEMENT else "NO"])
    names = {"scipy RK45, reduced numpy RHS": "group_sparse_flow_vs_scipy_rk45_numpy",
             "numbalsoda DOP853, reduced cfunc RHS": "group_sparse_flow_vs_numbalsoda_dop853",
             "numbalsoda DOP853, attnflow's RHS kernel": "group_sparse_flow_vs_numbalsoda_dop853_same_rhs",
             "scipy RK45, 3-grid numpy RHS": "group_sparse_flow_vs_scipy_rk45_numpy_3grid",
             "numbalsoda DOP853, 3-grid cfunc RHS": "group_sparse_flow_vs_numbalsoda_dop853_3grid"}
    for label, name in names.items():
        if label in timings:
            ratios[name] = timings[label] / mine
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        emit("first-call CPU time with an empty numba cache (compile)", ["public call", "CPU s"],
             [[name, seconds] for name, seconds in cold.items()] + [["total", sum(cold.values())]], {}, False)
        print(f"final (β, α) of attnflow: ({reference[0]:.10g}, {reference[1]:.10g})")
    ratios["group_sparse_cold_compile_cpu_seconds"] = sum(cold.values())
    emit(f"group_sparse position-only flow, D = {D}, τ ∈ [0, 1e7], rtol = {RTOL:g}, atol = {ATOL:g} "
         f"(attnflow atol = {ours.atol:g})",
         ["contender", "CPU ms", "RHS evals", "baseline/attnflow", "max rel. gap of final (β, α)",
          f"agrees to {AGREEMENT:g}"], rows, ratios, args.json)

if __name__ == "__main__":
    main()
