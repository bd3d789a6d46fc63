"""Numba integrators shared by every system.

One engine, written once, for every reduced ODE and discrete-time map in attnflow:

* :func:`solve_rk4` — classical fixed-step Runge–Kutta 4.
* :func:`solve_dopri5` — adaptive Dormand–Prince 5(4) with local-extrapolation, PI-free standard step
  control (as in Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.4) and Hairer's 4th-order dense output at
  the requested times.
* :func:`iterate_map` — iteration of a discrete-time map ``x_{k+1} = F(k, x_k)`` (the papers' gradient
  descent has a finite step η, so its reduced dynamics is a map, not an ODE).

Every right-hand side is an ``@njit`` function ``rhs(t, y, params) -> dy/dt`` and every map is an ``@njit``
function ``step_map(k, x, params) -> x_next``; ``params`` is a flat float64 array into which each system
packs its parameters. Numba specialises each integrator loop once per right-hand side.

**Caching.** Numba's on-disk cache cannot serve a function that receives another jitted function as an
argument: the cache key contains the argument's memory address, which changes with every process (seen with
numba 0.68). So the generic loops :func:`rk4_loop`, :func:`dopri5_loop` and :func:`map_loop` are compiled in
memory, and a system that wants its integrator cached binds its right-hand side in a small
``@njit(cache=True)`` function whose arguments are plain arrays and numbers, then passes it as ``loop=``.
Every function that receives the right-hand side is ``inline='always'``, so after inlining the right-hand
side is a plain global call and the bound function is cacheable::

    @njit(cache=True)
    def _flow_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
        return dopri5_loop(flow_rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)

    solve_dopri5(flow_rhs, y0, t_eval, params, loop=_flow_dopri5)

Numba's cache does not notice edits to *other* files a cached function calls; after changing
``integrate.py`` clear ``__pycache__`` (``find . -name '*.nb[ic]' -delete``). Setting ``NUMBA_DISABLE_JIT=1`` runs the same loops as plain Python, for debugging and coverage.

All loops stop at the first non-finite state or a state whose largest entry exceeds ``blowup``, and the
wrappers raise :class:`DivergenceError` naming the step (and time) where it happened.

References
----------
J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae", J. Comput. Appl. Math. 6 (1980).
E. Hairer, S. P. Nørsett, G. Wanner, *Solving Ordinary Differential Equations I*, 2nd ed., Springer (1993):
§II.4 (automatic step size control, starting step size) and §II.6 (dense output of DOPRI5).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .errors import BudgetExceeded, DivergenceError

__all__ = [
    "DivergenceError",
    "Solution",
    "solve_rk4",
    "solve_dopri5",
    "iterate_map",
    "rk4_loop",
    "dopri5_loop",
    "map_loop",
]

# Status codes returned by the compiled loops.
_OK = 0
_NONFINITE = 1
_BLOWUP = 2
_MAX_STEPS = 3
_STEP_TOO_SMALL = 4

# Step-size controller constants (scipy.integrate uses the same values).
SAFETY = 0.9
MIN_FACTOR = 0.2
MAX_FACTOR = 10.0
DEFAULT_BLOWUP = 1e12

# Dormand–Prince 5(4) tableau (row 7 = the 5th-order weights: first-same-as-last).
_DP_C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
# (Tuples, not arrays: numba freezes tuples into the machine code, while global arrays block caching.)
_DP_A = (
    (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    (1 / 5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    (3 / 40, 9 / 40, 0.0, 0.0, 0.0, 0.0, 0.0),
    (44 / 45, -56 / 15, 32 / 9, 0.0, 0.0, 0.0, 0.0),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0.0, 0.0, 0.0),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0.0, 0.0),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0),
)
# Error weights: 5th-order minus embedded 4th-order solution.
_DP_E = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)
# Hairer's dense-output coefficients for DOPRI5 (the order-4 interpolant's fifth term).
_DP_D = (
    -12715105075 / 11282082432,
    0.0,
    87487479700 / 32700410799,
    -10690763975 / 1880347072,
    701980252875 / 199316789632,
    -1453857185 / 822651844,
    69997945 / 29380423,
)


@dataclass(frozen=True)
class Solution:
    """What an integrator returns.

    Attributes
    ----------
    t : ndarray, shape (n_t,)
        Recorded times (for :func:`iterate_map`, the recorded step indices as floats).
    y : ndarray, shape (n_t, n)
        State at the recorded times.
    n_steps : int
        Accepted steps (map iterations).
    n_rejected : int
        Rejected steps (adaptive solver only).
    n_rhs_evals : int
        Right-hand-side (or map) evaluations: the solver's cost, used by tests as a budget.
    """

    t: np.ndarray
    y: np.ndarray
    n_steps: int
    n_rejected: int
    n_rhs_evals: int


# --------------------------------------------------------------------------------------------------
# compiled loops
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def _state_status(y, blowup):
    for v in y:
        if not np.isfinite(v):
            return _NONFINITE
        if abs(v) > blowup:
            return _BLOWUP
    return _OK


@njit(cache=True)
def _rms(v):
    return np.sqrt(np.mean(v * v))


@njit(inline='always')
def rk4_loop(rhs, y0, t0, dt, n_steps, record_steps, params, blowup):
    """Fixed-step RK4; records the state after each step listed in ``record_steps`` (sorted, may hold 0)."""
    ys = np.empty((record_steps.size, y0.size))
    y = y0.copy()
    j = 0
    while j < record_steps.size and record_steps[j] == 0:
        ys[j] = y
        j += 1
    for step in range(1, n_steps + 1):
        t = t0 + (step - 1) * dt
        k1 = rhs(t, y, params)
        k2 = rhs(t + 0.5 * dt, y + 0.5 * dt * k1, params)
        k3 = rhs(t + 0.5 * dt, y + 0.5 * dt * k2, params)
        k4 = rhs(t + dt, y + dt * k3, params)
        y = y + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        status = _state_status(y, blowup)
        if status != _OK:
            return ys, status, step
        while j < record_steps.size and record_steps[j] == step:
            ys[j] = y
            j += 1
    return ys, _OK, n_steps


@njit(inline='always')
def map_loop(step_map, x0, n_steps, record_steps, params, blowup):
    """Iterates ``x <- step_map(k, x, params)`` for k = 0..n_steps-1; records after the listed steps."""
    xs = np.empty((record_steps.size, x0.size))
    x = x0.copy()
    j = 0
    while j < record_steps.size and record_steps[j] == 0:
        xs[j] = x
        j += 1
    for k in range(n_steps):
        x = step_map(k, x, params)
        status = _state_status(x, blowup)
        if status != _OK:
            return xs, status, k + 1
        while j < record_steps.size and record_steps[j] == k + 1:
            xs[j] = x
            j += 1
    return xs, _OK, n_steps


@njit(inline='always')
def _initial_step(rhs, t0, y0, f0, params, rtol, atol, t_span):
    """Starting step size, Hairer–Nørsett–Wanner §II.4 (the algorithm scipy also uses); order 5."""
    scale = atol + rtol * np.abs(y0)
    d0 = _rms(y0 / scale)
    d1 = _rms(f0 / scale)
    if d0 < 1e-5 or d1 < 1e-5:
        h0 = 1e-6
    else:
        h0 = 0.01 * d0 / d1
    h0 = min(h0, t_span)
    y1 = y0 + h0 * f0
    f1 = rhs(t0 + h0, y1, params)
    d2 = _rms((f1 - f0) / scale) / h0
    if d1 <= 1e-15 and d2 <= 1e-15:
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = (0.01 / max(d1, d2)) ** (1.0 / 5.0)
    return min(100.0 * h0, h1, t_span)


@njit(inline='always')
def _dopri5_stages(rhs, t, y, h, K, params):
    """Stages 2..7 of one DOPRI5 step into ``K`` (``K[0]`` holds f(t, y)); returns the 5th-order y_new."""
    n = y.size
    y_stage = np.empty(n)
    for s in range(1, 7):
        for i in range(n):
            acc = 0.0
            for r in range(s):
                acc += _DP_A[s][r] * K[r, i]
            y_stage[i] = y[i] + h * acc
        K[s] = rhs(t + _DP_C[s] * h, y_stage, params)
    return y_stage  # row 7 of the tableau is the 5th-order solution (FSAL)


@njit
def _dopri5_error(y, y_new, h, K, rtol, atol):
    """RMS of the embedded error estimate in units of ``atol + rtol * max(|y|, |y_new|)``."""
    total = 0.0
    for i in range(y.size):
        e = 0.0
        for s in range(7):
            e += _DP_E[s] * K[s, i]
        scale = atol + rtol * max(abs(y[i]), abs(y_new[i]))
        total += (h * e / scale) ** 2
    return np.sqrt(total / y.size)


@njit
def _dopri5_dense(y, y_new, h, K, theta, out):
    """Hairer's DOPRI5 interpolant at ``t + theta * h`` (order 4), written into ``out``."""
    theta1 = 1.0 - theta
    for i in range(y.size):
        ydiff = y_new[i] - y[i]
        bspl = h * K[0, i] - ydiff
        r4 = ydiff - h * K[6, i] - bspl
        r5 = 0.0
        for s in range(7):
            r5 += _DP_D[s] * K[s, i]
        out[i] = y[i] + theta * (ydiff + theta1 * (bspl + theta * (r4 + theta1 * h * r5)))


@njit(inline='always')
def dopri5_loop(rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """Adaptive DOPRI5 with dense output at ``t_eval`` (sorted, all >= t0).

    Returns ``(ys, status, n_accepted, n_rejected, n_evals, t_stop)``. Bind it to a right-hand side inside
    an ``@njit(cache=True)`` function to get an on-disk cached integrator (see the module docstring).
    """
    n_out = t_eval.size
    ys = np.empty((n_out, y0.size))
    j = 0
    while j < n_out and t_eval[j] <= t0:
        ys[j] = y0
        j += 1
    t_end = t_eval[n_out - 1]
    t = t0
    y = y0.copy()
    K = np.empty((7, y0.size))
    K[0] = rhs(t, y, params)
    n_evals = 1
    n_accepted = 0
    n_rejected = 0
    if j == n_out:
        return ys, _OK, n_accepted, n_rejected, n_evals, t
    if first_step > 0.0:
        h = min(first_step, t_end - t0)
    else:
        h = _initial_step(rhs, t0, y0, K[0].copy(), params, rtol, atol, t_end - t0)
        n_evals += 1
    previous_rejected = False
    while j < n_out:
        if n_accepted + n_rejected >= max_steps:
            return ys, _MAX_STEPS, n_accepted, n_rejected, n_evals, t
        clipped = h >= t_end - t
        if clipped:
            h = t_end - t
        if h <= 10.0 * np.finfo(np.float64).eps * max(abs(t), 1.0):
            return ys, _STEP_TOO_SMALL, n_accepted, n_rejected, n_evals, t
        y_new = _dopri5_stages(rhs, t, y, h, K, params)
        n_evals += 6
        err = _dopri5_error(y, y_new, h, K, rtol, atol)
        if not np.isfinite(err):
            # A non-finite stage: shrink hard; if the state itself is the problem the step-size floor stops us.
            h *= MIN_FACTOR
            n_rejected += 1
            previous_rejected = True
            continue
        if err > 1.0:
            h *= max(MIN_FACTOR, SAFETY * err ** -0.2)
            n_rejected += 1
            previous_rejected = True
            continue
        t_new = t_end if clipped else t + h
        while j < n_out and t_eval[j] <= t_new:
            if t_eval[j] == t_new:
                ys[j] = y_new
            else:
                _dopri5_dense(y, y_new, h, K, (t_eval[j] - t) / h, ys[j])
            j += 1
        t = t_new
        y = y_new
        K[0] = K[6]
        n_accepted += 1
        status = _state_status(y, blowup)
        if status != _OK:
            return ys, status, n_accepted, n_rejected, n_evals, t
        factor = MAX_FACTOR if err == 0.0 else min(MAX_FACTOR, SAFETY * err ** -0.2)
        if previous_rejected:
            factor = min(1.0, factor)
        h *= factor
        previous_rejected = False
    return ys, _OK, n_accepted, n_rejected, n_evals, t


# --------------------------------------------------------------------------------------------------
# Python wrappers: validate, call the compiled loop, turn status codes into errors
# --------------------------------------------------------------------------------------------------


def _as_state(y0, name: str) -> np.ndarray:
    y0 = np.array(y0, dtype=np.float64, copy=True)
    if y0.ndim != 1 or y0.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {y0.shape}")
    if not np.all(np.isfinite(y0)):
        raise ValueError(f"{name} must be finite")
    return y0


def _as_params(params) -> np.ndarray:
    if params is None:
        return np.zeros(0)
    params = np.ascontiguousarray(params, dtype=np.float64)
    if params.ndim != 1:
        raise ValueError(f"params must be a flat 1-D float array, got shape {params.shape}")
    if not np.all(np.isfinite(params)):
        raise ValueError("params must be finite")
    return params


def _positive(value, name: str, allow_zero: bool = False) -> float:
    value = float(value)
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return value


def _record_steps(record_steps, n_steps: int) -> np.ndarray:
    if record_steps is None:
        return np.arange(n_steps + 1, dtype=np.int64)
    steps = np.unique(np.asarray(record_steps, dtype=np.int64))
    if steps.size == 0 or steps[0] < 0 or steps[-1] > n_steps:
        raise ValueError(f"record_steps must lie in [0, n_steps={n_steps}]")
    return steps


def _raise_if_diverged(status: int, step: int, where: str) -> None:
    if status == _NONFINITE:
        raise DivergenceError(f"diverged at step {step}{where}: the state is no longer finite (NaN/inf)")
    if status == _BLOWUP:
        raise DivergenceError(f"diverged at step {step}{where}: the state exceeds the blow-up bound")


def solve_rk4(
    rhs, y0, t_span, dt, params=None, record_every: int = 1, blowup: float = DEFAULT_BLOWUP, *, loop=None
):
    """Integrate ``dy/dt = rhs(t, y, params)`` with fixed-step classical RK4.

    Parameters
    ----------
    rhs : numba-compiled function ``(float, ndarray (n,), ndarray (p,)) -> ndarray (n,)``
    y0 : array_like, shape (n,)
    t_span : (float, float)
        Start and end time; ``(t1 - t0) / dt`` is rounded to the nearest whole number of steps.
    dt : float
        Step size, > 0.
    params : array_like, shape (p,), optional
    record_every : int
        Record every this many steps (the final state is always recorded).
    blowup : float
        Divergence bound on ``max |y|``.
    loop : numba function, optional
        ``rk4_loop`` bound to ``rhs`` in an ``@njit(cache=True)`` function taking
        ``(y0, t0, dt, n_steps, record_steps, params, blowup)``; used instead of ``rk4_loop(rhs, ...)``.

    Returns
    -------
    Solution

    Raises
    ------
    ValueError
        For a non-finite or ill-shaped ``y0``/``params``, ``dt <= 0`` or an empty span.
    DivergenceError
        At the first step whose state is not finite or exceeds ``blowup``.
    """
    y0 = _as_state(y0, "y0")
    params = _as_params(params)
    dt = _positive(dt, "dt")
    t0, t1 = (float(t) for t in t_span)
    if not (np.isfinite(t0) and np.isfinite(t1)) or t1 <= t0:
        raise ValueError(f"t_span must be finite with t1 > t0, got {t_span}")
    n_steps = max(1, int(round((t1 - t0) / dt)))
    dt = (t1 - t0) / n_steps
    record_every = int(record_every)
    if record_every < 1:
        raise ValueError(f"record_every must be >= 1, got {record_every}")
    steps = np.unique(np.append(np.arange(0, n_steps + 1, record_every), n_steps)).astype(np.int64)
    blowup = _positive(blowup, "blowup")
    if loop is None:
        ys, status, step = rk4_loop(rhs, y0, t0, dt, n_steps, steps, params, blowup)
    else:
        ys, status, step = loop(y0, t0, dt, n_steps, steps, params, blowup)
    _raise_if_diverged(status, step, f" (t = {t0 + step * dt:.6g})")
    return Solution(t=t0 + steps * dt, y=ys, n_steps=n_steps, n_rejected=0, n_rhs_evals=4 * n_steps)


def solve_dopri5(
    rhs,
    y0,
    t_eval,
    params=None,
    *,
    t0: float | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    first_step: float | None = None,
    max_steps: int = 1_000_000,
    blowup: float = DEFAULT_BLOWUP,
    loop=None,
):
    """Integrate ``dy/dt = rhs(t, y, params)`` with adaptive Dormand–Prince 5(4).

    The local error estimate ``err = rms(E / (atol + rtol * max(|y_n|, |y_{n+1}|)))`` is kept below 1, as in
    ``scipy.integrate.RK45``; outputs between steps come from Hairer's 4th-order dense output, so the
    requested times do not constrain the step size.

    Parameters
    ----------
    rhs : numba-compiled function ``(float, ndarray (n,), ndarray (p,)) -> ndarray (n,)``
    y0 : array_like, shape (n,)
        State at ``t0``.
    t_eval : array_like, shape (n_t,)
        Increasing output times, all ``>= t0``.
    params : array_like, shape (p,), optional
    t0 : float, optional
        Initial time; defaults to ``t_eval[0]``.
    rtol, atol : float
        Relative (> 0) and absolute (>= 0) tolerances.
    first_step : float, optional
        Initial step; chosen automatically (Hairer §II.4) when omitted.
    max_steps : int
        Budget of attempted steps; exceeding it raises :class:`BudgetExceeded` (a ``RuntimeError``).
    blowup : float
        Divergence bound on ``max |y|``.
    loop : numba function, optional
        ``dopri5_loop`` bound to ``rhs`` in an ``@njit(cache=True)`` function taking
        ``(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)``.

    Returns
    -------
    Solution

    Raises
    ------
    ValueError, DivergenceError, BudgetExceeded
    """
    y0 = _as_state(y0, "y0")
    params = _as_params(params)
    t_eval = np.ascontiguousarray(t_eval, dtype=np.float64)
    if t_eval.ndim != 1 or t_eval.size == 0 or not np.all(np.isfinite(t_eval)):
        raise ValueError("t_eval must be a non-empty, finite 1-D array")
    if np.any(np.diff(t_eval) < 0):
        raise ValueError("t_eval must be sorted in increasing order")
    t0 = float(t_eval[0]) if t0 is None else float(t0)
    if not np.isfinite(t0) or t_eval[0] < t0:
        raise ValueError(f"t0 must be finite and <= t_eval[0], got {t0}")
    rtol = _positive(rtol, "rtol")
    atol = _positive(atol, "atol", allow_zero=True)
    if rtol < 100 * np.finfo(float).eps:
        raise ValueError(f"rtol must be at least 100 machine epsilons, got {rtol}")
    first = 0.0 if first_step is None else _positive(first_step, "first_step")
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    args = (y0, t0, t_eval, params, rtol, atol, first, int(max_steps), _positive(blowup, "blowup"))
    ys, status, n_acc, n_rej, n_ev, t_stop = dopri5_loop(rhs, *args) if loop is None else loop(*args)
    _raise_if_diverged(status, n_acc, f" (t = {t_stop:.6g})")
    if status == _MAX_STEPS:
        raise BudgetExceeded(f"solve_dopri5 used its budget of max_steps={max_steps} steps at t = {t_stop:.6g} "
                             "(too stiff at these parameters for an explicit method)")
    if status == _STEP_TOO_SMALL:
        raise DivergenceError(
            f"diverged at step {n_acc} (t = {t_stop:.6g}): the step size fell below machine precision"
        )
    return Solution(t=t_eval.copy(), y=ys, n_steps=n_acc, n_rejected=n_rej, n_rhs_evals=n_ev)


def iterate_map(
    step_map, x0, n_steps: int, params=None, record_steps=None, blowup: float = DEFAULT_BLOWUP, *, loop=None
):
    """Iterate the discrete-time map ``x_{k+1} = step_map(k, x_k, params)`` for ``n_steps`` steps.

    Parameters
    ----------
    step_map : numba-compiled function ``(int, ndarray (n,), ndarray (p,)) -> ndarray (n,)``
    x0 : array_like, shape (n,)
    n_steps : int
        Number of iterations, >= 0.
    params : array_like, shape (p,), optional
    record_steps : array_like of int, optional
        Steps after which to record the state (0 is the initial state); all steps by default. Use
        log-spaced steps for long runs.
    blowup : float
        Divergence bound on ``max |x|``.
    loop : numba function, optional
        ``map_loop`` bound to ``step_map`` in an ``@njit(cache=True)`` function taking
        ``(x0, n_steps, record_steps, params, blowup)``.

    Returns
    -------
    Solution
        ``t`` holds the recorded step indices.
    """
    x0 = _as_state(x0, "x0")
    params = _as_params(params)
    n_steps = int(n_steps)
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0, got {n_steps}")
    steps = _record_steps(record_steps, n_steps)
    blowup = _positive(blowup, "blowup")
    if loop is None:
        xs, status, step = map_loop(step_map, x0, n_steps, steps, params, blowup)
    else:
        xs, status, step = loop(x0, n_steps, steps, params, blowup)
    _raise_if_diverged(status, step, "")
    return Solution(t=steps.astype(np.float64), y=xs, n_steps=n_steps, n_rejected=0, n_rhs_evals=n_steps)
