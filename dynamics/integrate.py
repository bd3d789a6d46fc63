"""Numba integrators shared by every system.

One engine, written once, for every reduced ODE and discrete-time map in attnflow:

* :func:`solve_rk4` — classical fixed-step Runge–Kutta 4.
* :func:`solve_dopri5` — adaptive Dormand–Prince 5(4) with local-extrapolation, PI-free standard step
  control (as in Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.4) and Hairer's 4th-order dense output at
  the requested times.
* :func:`solve_dop853` — adaptive Dormand–Prince 8(5,3) with its 7th-order dense output, on the same engine (the
  section "adaptive DOP853" below).
* :func:`iterate_map` — iteration of a discrete-time map ``x_{k+1} = F(k, x_k)`` (the papers' gradient
  descent has a finite step η, so its reduced dynamics is a map, not an ODE).

Every right-hand side is an ``@njit`` function, either ``rhs(t, y, params, out)`` writing dy/dt into ``out`` (no
allocation per evaluation; the systems' flows use this form, named ``..._into``) or ``rhs(t, y, params) -> dy/dt``;
every map is an ``@njit`` function ``step_map(k, x, params) -> x_next``. ``params`` is a flat float64 array into which
each system packs its parameters.

**Caching and compile time.** Numba's on-disk cache cannot serve a function that receives another jitted function
as an argument: that argument's type holds the function object's address, which changes with every process (numba
0.68). The adaptive loop therefore takes the right-hand side as a numba *first-class function*, whose type is only
its signature: ``_dopri5_core`` is compiled once per calling convention (two in all), for every right-hand side
of attnflow, and cached. :func:`solve_dopri5` looks up the address of the right-hand side's compiled code once
per process (compiling it, or loading it from its own cache) and passes it to one of two cached entry points as an
integer, so a new right-hand side costs only its own compilation. For callers inside compiled code,
:func:`dopri5_loop` remains: binding it to a right-hand side in a small ``@njit(cache=True)`` function also caches
(the right-hand side is cast to the first-class type without the Python object's address), but every such binding
links and re-optimises the whole loop, so plain ``solve_dopri5(rhs, ...)`` is cheaper::

    solve_dopri5(flow_rhs_into, y0, t_eval, params)          # preferred: the shared cached loop

    @njit(cache=True)                                         # inside compiled code
    def _flow_dopri5(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
        return dopri5_loop(flow_rhs_into, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)

:func:`iterate_map` does the same for maps: one cached loop (``_map_loop_at``) calls ``step_map`` by its compiled
address. A loop bound to a map in its own ``@njit(cache=True)`` function (``loop=``, :func:`map_loop`) links the
map's code and optimises it again, which cost the reduced 1-NN and random-walk dynamics about 0.6 and 1.4 s of
compilation each; the states are the same to the bit. The fixed-step :func:`rk4_loop` is still an
``inline='always'`` generic loop bound the same way (``loop=``).

Numba's cache does not notice edits to *other* files a cached function calls; after changing
``integrate.py`` clear ``__pycache__`` (``find . -name '*.nb[ic]' -delete``). Setting ``NUMBA_DISABLE_JIT=1`` runs the
same loops as plain Python, for debugging and coverage.

All loops stop at the first non-finite state or a state whose largest entry exceeds ``blowup``, and the
wrappers raise :class:`DivergenceError` naming the step (and time) where it happened. A loop reports how it ended as
a :class:`Status`, whose members carry their meaning and the error the wrappers raise for them.

References
----------
J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae", J. Comput. Appl. Math. 6 (1980).
E. Hairer, S. P. Nørsett, G. Wanner, *Solving Ordinary Differential Equations I*, 2nd ed., Springer (1993):
§II.4 (automatic step size control, starting step size) and §II.6 (dense output of DOPRI5).
"""
from __future__ import annotations

import enum
import inspect
import math
from dataclasses import dataclass

import numpy as np
from numba import config, njit, types

from . import numba_compat as compat
from .errors import BudgetExceeded, DivergenceError
from .tableaus import DOP853, DOPRI5

__all__ = [
    "DivergenceError",
    "Solution",
    "solve_rk4",
    "solve_dopri5",
    "iterate_map",
    "rk4_loop",
    "dopri5_loop",
    "map_loop",
    "solve_dop853",
]



class Status(enum.IntEnum):
    """How a compiled loop ended; each member carries what it means (``Status.BLOWUP.message``) and the exception a
    wrapper raises for it (``.error``; None for ``SUCCESS``). The loops return the member, an integer to numba."""

    SUCCESS = 0, "the loop reached its last step or output time", None
    NONFINITE = 1, "the state is no longer finite (NaN/inf)", DivergenceError
    BLOWUP = 2, "the state exceeds the blow-up bound", DivergenceError
    MAX_STEPS = 3, "too stiff at these parameters for an explicit method", BudgetExceeded
    STEP_TOO_SMALL = 4, "the step size fell below machine precision", DivergenceError
    WRONG_SIZE = 5, "step_map returned a state of another size than x0", ValueError

    def __new__(cls, code: int, message: str, error):
        member = int.__new__(cls, code)
        member._value_ = code
        member.message = message
        member.error = error
        return member


# Step-size controller constants (scipy.integrate uses the same values).
SAFETY = 0.9
MIN_FACTOR = 0.2
MAX_FACTOR = 10.0
DEFAULT_BLOWUP = 1e12
_EPS = float(np.finfo(np.float64).eps)

# The Dormand–Prince 5(4) tableau (dynamics/tableaus.py) as zero-padded tuples: numba freezes tuples into the machine
# code, while global arrays block caching. Row 6 of _DP_A holds the 5th-order weights (first same as last).
_DP_C = DOPRI5.c
_DP_A = tuple(row + (0.0,) * (7 - len(row)) for row in DOPRI5.a)
_DP_E = DOPRI5.error  # 5th-order minus embedded 4th-order solution
_DP_D = DOPRI5.dense[0]  # Hairer's dense-output coefficients (the order-4 interpolant's fifth term)


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
            return Status.NONFINITE
        if abs(v) > blowup:
            return Status.BLOWUP
    return Status.SUCCESS


@njit(inline='always')
def rk4_loop(rhs, y0, t0, dt, n_steps, record_steps, params, blowup):
    """Fixed-step RK4; records the state after each step listed in ``record_steps`` (sorted, may hold 0)."""
    ys = np.empty((record_steps.size, y0.size))
    y = np.empty(y0.size)
    for i in range(y0.size):  # element loops, not copies or row assignments: those compile numba's shape checks
        y[i] = y0[i]
    j = 0
    while j < record_steps.size and record_steps[j] == 0:
        for i in range(y.size):
            ys[j, i] = y[i]
        j += 1
    for step in range(1, n_steps + 1):
        t = t0 + (step - 1) * dt
        k1 = rhs(t, y, params)
        k2 = rhs(t + 0.5 * dt, y + 0.5 * dt * k1, params)
        k3 = rhs(t + 0.5 * dt, y + 0.5 * dt * k2, params)
        k4 = rhs(t + dt, y + dt * k3, params)
        y = y + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        status = _state_status(y, blowup)
        if status != Status.SUCCESS:
            return ys, status, step
        while j < record_steps.size and record_steps[j] == step:
            for i in range(y.size):
                ys[j, i] = y[i]
            j += 1
    return ys, Status.SUCCESS, n_steps


@njit(inline='always')
def map_loop(step_map, x0, n_steps, record_steps, params, blowup):
    """Iterates ``x <- step_map(k, x, params)`` for k = 0..n_steps-1; records after the listed steps."""
    xs = np.empty((record_steps.size, x0.size))
    x = np.empty(x0.size)
    for i in range(x0.size):  # element loops, not copies or row assignments: those compile numba's shape checks
        x[i] = x0[i]
    j = 0
    while j < record_steps.size and record_steps[j] == 0:
        for i in range(x.size):
            xs[j, i] = x[i]
        j += 1
    for k in range(n_steps):
        x = step_map(k, x, params)
        if x.size != xs.shape[1]:
            return xs, Status.WRONG_SIZE, k + 1
        status = _state_status(x, blowup)
        if status != Status.SUCCESS:
            return xs, status, k + 1
        while j < record_steps.size and record_steps[j] == k + 1:
            for i in range(x.size):
                xs[j, i] = x[i]
            j += 1
    return xs, Status.SUCCESS, n_steps


_MAP_TYPE = types.FunctionType(types.float64[::1](types.int64, types.float64[::1], types.float64[::1]))


_map_at = compat.function_from_address(_MAP_TYPE)  # the compiled map at an address, as a first-class function


@njit(cache=True)
def _map_loop_at(address, x0, n_steps, record_steps, params, blowup):
    """:func:`map_loop` with the map compiled at ``address``: one cached loop for every map (see the module
    docstring, "Caching and compile time")."""
    return map_loop(_map_at(address), x0, n_steps, record_steps, params, blowup)


_MAP_ADDRESSES: dict = {}


def _map_address(step_map) -> int:
    """Address of a jitted map compiled for ``(int64, float64[::1], float64[::1]) -> float64[::1]``, once per
    process (the table keeps the dispatcher, and so the address, alive)."""
    address = _MAP_ADDRESSES.get(step_map)
    if address is None:
        if not hasattr(step_map, "get_compile_result"):
            raise TypeError("step_map must be a numba @njit function")
        arity = len(inspect.signature(step_map.py_func).parameters)
        if arity != 3:
            raise TypeError(f"step_map takes (k, x, params), not {arity} arguments")
        address = _MAP_ADDRESSES[step_map] = compat.compiled_address(step_map, _MAP_TYPE, "step_map")
    return address


# ---- adaptive Dormand–Prince 5(4) ------------------------------------------------------------------------------
#
# One compiled loop serves every right-hand side: ``_dopri5_core`` receives the right-hand side as a numba
# first-class function (``types.FunctionType``), whose type is its signature, not its address, so the loop is compiled
# once per signature and cached on disk. The signatures are the two calling conventions a right-hand side may have:
# ``rhs(t, y, params, out)`` writing dy/dt into ``out`` (no allocation per evaluation) or ``rhs(t, y, params)``
# returning it. ``solve_dopri5`` passes the address of the right-hand side's compiled code to ``_dopri5_into_at`` /
# ``_dopri5_returning_at``, which make the first-class value from it (``numba_compat.function_from_address``); a
# binding in compiled code (``dopri5_loop``) casts the jitted right-hand side with ``_first_class`` and links the cached
# loop.

_F64 = types.float64
_VEC = types.float64[::1]
_RHS_TYPES = {
    4: types.FunctionType(types.none(_F64, _VEC, _VEC, _VEC)),  # rhs(t, y, params, out)
    3: types.FunctionType(_VEC(_F64, _VEC, _VEC)),              # rhs(t, y, params) -> dy/dt
}


def _rhs_arity(rhs) -> int:
    """3 (``rhs(t, y, params) -> dy/dt``) or 4 (``rhs(t, y, params, out)``), for a numba type or a Python function."""
    arity = compat.arity(rhs)
    if arity not in _RHS_TYPES:
        raise TypeError(f"a right-hand side takes (t, y, params) or (t, y, params, out), not {arity} arguments")
    return arity


# ---- borrowed views --------------------------------------------------------------------------------------------
#
# numba counts references to an array's memory with atomic operations (numba_compat, "Borrowed views"), and on small
# systems those updates cost more than the adaptive loops' arithmetic. The loops therefore work on borrowed views: they
# borrow their arguments and one work array of their own frame, which they hold until the loop has ended.


@njit(cache=True)
def _initial_step(rhs, t0, y0, f0, f1, y1, params, rtol, atol, t_span, exponent):
    """Starting step size, Hairer–Nørsett–Wanner §II.4 (the algorithm scipy also uses); ``exponent`` is
    1/(q + 1) for an error estimator of order q (1/5 for DOPRI5). ``f1`` and ``y1`` are scratch vectors."""
    n = y0.size
    d0 = 0.0
    d1 = 0.0
    for i in range(n):
        scale = atol + rtol * abs(y0[i])
        d0 += (y0[i] / scale) ** 2
        d1 += (f0[i] / scale) ** 2
    d0 = np.sqrt(d0 / n)
    d1 = np.sqrt(d1 / n)
    if d0 < 1e-5 or d1 < 1e-5:
        h0 = 1e-6
    else:
        h0 = 0.01 * d0 / d1
    h0 = min(h0, t_span)
    for i in range(n):
        y1[i] = y0[i] + h0 * f0[i]
    compat.evaluate_into(rhs, t0 + h0, y1, params, f1)
    d2 = 0.0
    for i in range(n):
        d2 += ((f1[i] - f0[i]) / (atol + rtol * abs(y0[i]))) ** 2
    d2 = np.sqrt(d2 / n) / h0
    if d1 <= 1e-15 and d2 <= 1e-15:
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = (0.01 / max(d1, d2)) ** exponent
    return min(100.0 * h0, h1, t_span)


@njit(cache=True)
def _weighted_stages(K, s, coefficients, acc):
    """acc = Σ_{r<s} c_r K[r], summed in the order of ``coefficients`` (zeros skipped); ``K`` holds one stage
    derivative per contiguous row, so each term is one pass over contiguous memory."""
    c = coefficients[0]
    for i in range(acc.size):
        acc[i] = c * K[0, i]
    for r in range(1, s):
        c = coefficients[r]
        if c != 0.0:
            for i in range(acc.size):
                acc[i] += c * K[r, i]


@njit(cache=True)
def _stage_sum(y, h, K, s, coefficients, acc, out):
    """out = y + h Σ_{r<s} a_r K[r] for the tableau's row ``coefficients``."""
    _weighted_stages(K, s, coefficients, acc)
    for i in range(y.size):
        out[i] = y[i] + h * acc[i]


@njit(cache=True)
def _dopri5_stage(s, y, h, K, out):
    """out = y + h Σ_{r<s} a_{sr} K[r] for stage ``s`` (1…6) of the DOPRI5 tableau; s = 6 is the 5th-order solution.

    One pass over the components, each summing the nonzero terms of its row in the tableau's order: the arithmetic
    of term-by-term passes (:func:`_stage_sum`, which DOP853 uses), so the same bits, without a pass over memory per
    term. On the reduced flows' 2–420 components the set-up of those passes, not their flops, was most of a step."""
    n = y.size
    if s == 1:
        a = _DP_A[1]
        for i in range(n):
            out[i] = y[i] + h * (a[0] * K[0, i])
    elif s == 2:
        a = _DP_A[2]
        for i in range(n):
            out[i] = y[i] + h * (a[0] * K[0, i] + a[1] * K[1, i])
    elif s == 3:
        a = _DP_A[3]
        for i in range(n):
            out[i] = y[i] + h * (a[0] * K[0, i] + a[1] * K[1, i] + a[2] * K[2, i])
    elif s == 4:
        a = _DP_A[4]
        for i in range(n):
            out[i] = y[i] + h * (a[0] * K[0, i] + a[1] * K[1, i] + a[2] * K[2, i] + a[3] * K[3, i])
    elif s == 5:
        a = _DP_A[5]
        for i in range(n):
            out[i] = y[i] + h * (a[0] * K[0, i] + a[1] * K[1, i] + a[2] * K[2, i] + a[3] * K[3, i]
                                 + a[4] * K[4, i])
    else:  # a[1] = 0: skipped, as a pass skips a zero coefficient
        a = _DP_A[6]
        for i in range(n):
            out[i] = y[i] + h * (a[0] * K[0, i] + a[2] * K[2, i] + a[3] * K[3, i] + a[4] * K[4, i]
                                 + a[5] * K[5, i])


@njit(cache=True)
def _error_norm(y, y_new, h, K, rtol, atol):
    """RMS of the embedded error estimate h Σ e_s K[s] in units of ``atol + rtol * max(|y|, |y_new|)`` (the terms
    summed as in :func:`_dopri5_stage`; e₁ = 0 is skipped)."""
    n = y.size
    e = _DP_E
    total = 0.0
    for i in range(n):
        scale = atol + rtol * max(abs(y[i]), abs(y_new[i]))
        estimate = (e[0] * K[0, i] + e[2] * K[2, i] + e[3] * K[3, i] + e[4] * K[4, i] + e[5] * K[5, i]
                    + e[6] * K[6, i])
        total += (h * estimate / scale) ** 2
    return np.sqrt(total / n)


@njit(cache=True)
def _dense_coefficients(y, y_new, h, K, dense):
    """The four coefficient vectors of Hairer's order-4 DOPRI5 interpolant on the step [t, t + h] (rows of ``dense``):
    y(t + θh) = y + θ(c₀ + (1 − θ)(c₁ + θ(c₂ + (1 − θ)c₃))) (the last summed as in :func:`_dopri5_stage`; d₁ = 0 is
    skipped)."""
    n = y.size
    d = _DP_D
    for i in range(n):
        ydiff = y_new[i] - y[i]
        bspl = h * K[0, i] - ydiff
        dense[0, i] = ydiff
        dense[1, i] = bspl
        dense[2, i] = ydiff - h * K[6, i] - bspl
        dense[3, i] = h * (d[0] * K[0, i] + d[2] * K[2, i] + d[3] * K[3, i] + d[4] * K[4, i] + d[5] * K[5, i]
                           + d[6] * K[6, i])


_DOPRI5_WORK_ROWS = 14  # the loop's work array: K (7 rows), y, y_new, y_stage and the interpolant (4)


def _dopri5_generic(rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """Adaptive DOPRI5 with dense output at ``t_eval``; the body of ``_dopri5_core`` (see :func:`dopri5_loop`).

    Work arrays are allocated once, as the rows of one array that the loop holds to its end and uses through
    borrowed views (the section "borrowed views" above). The seven stage derivatives are the rows of ``K``; every
    stage sum, the error estimate and the dense output is one pass over the components with the tableau's
    coefficients written out (:func:`_dopri5_stage`), in small compiled helpers shared by every right-hand side (the
    loop itself stays small to compile). The 5th-order solution is taken over by swapping references; Hairer's
    interpolant is evaluated from its coefficients, computed once per step that has outputs.
    """
    n = y0.size
    n_out = t_eval.size
    ys = np.empty((n_out, n))
    j = 0
    while j < n_out and t_eval[j] <= t0:
        for i in range(n):  # element loops, not slice assignments: those compile numba's shape-error formatting
            ys[j, i] = y0[i]
        j += 1
    t_end = t_eval[n_out - 1]
    t = t0
    # One work array, held to the end; the loop uses borrowed views of it (see "borrowed views" above)
    work = np.empty((_DOPRI5_WORK_ROWS, n))
    K = compat.borrowed_rows(work, 0, 7)
    y = compat.borrowed_row(work, 7)
    y_new = compat.borrowed_row(work, 8)
    y_stage = compat.borrowed_row(work, 9)
    dense = compat.borrowed_rows(work, 10, _DOPRI5_WORK_ROWS)
    params = compat.borrowed(params)
    for i in range(n):
        y[i] = y0[i]
    compat.evaluate_into(rhs, t, y, params, compat.borrowed_row(K, 0))
    n_evals = 1
    n_accepted = 0
    n_rejected = 0
    if j == n_out:
        return ys, Status.SUCCESS, n_accepted, n_rejected, n_evals, t
    if first_step > 0.0:
        h = min(first_step, t_end - t0)
    else:
        h = _initial_step(rhs, t0, y, compat.borrowed_row(K, 0), compat.borrowed_row(K, 1), y_stage, params, rtol, atol, t_end - t0, 1.0 / 5.0)
        n_evals += 1
    tiny = 10.0 * _EPS
    previous_rejected = False
    while j < n_out:
        if n_accepted + n_rejected >= max_steps:
            return ys, Status.MAX_STEPS, n_accepted, n_rejected, n_evals, t
        clipped = h >= t_end - t
        if clipped:
            h = t_end - t
        if h <= tiny * max(abs(t), 1.0):
            return ys, Status.STEP_TOO_SMALL, n_accepted, n_rejected, n_evals, t
        for s in range(1, 7):
            # row 7 of the tableau is the 5th-order solution (c = 1), and its derivative is the next step's first
            # stage (first same as last); one call site per helper keeps each compiled once, for a plain int s
            stage = y_new if s == 6 else y_stage
            _dopri5_stage(s, y, h, K, stage)
            compat.evaluate_into(rhs, t + _DP_C[s] * h, stage, params, compat.borrowed_row(K, s))
        n_evals += 6
        err = _error_norm(y, y_new, h, K, rtol, atol)
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
        if j < n_out and t_eval[j] < t_new:
            _dense_coefficients(y, y_new, h, K, dense)
        while j < n_out and t_eval[j] <= t_new:
            if t_eval[j] == t_new:
                for i in range(n):
                    ys[j, i] = y_new[i]
            else:
                theta = (t_eval[j] - t) / h
                theta1 = 1.0 - theta
                for i in range(n):
                    ys[j, i] = y[i] + theta * (dense[0, i] + theta1 * (dense[1, i] + theta * (
                        dense[2, i] + theta1 * dense[3, i])))
            j += 1
        t = t_new
        y, y_new = y_new, y
        for i in range(n):  # first same as last
            K[0, i] = K[6, i]
        n_accepted += 1
        status = _state_status(y, blowup)
        if status != Status.SUCCESS:
            return ys, status, n_accepted, n_rejected, n_evals, t
        factor = MAX_FACTOR if err == 0.0 else min(MAX_FACTOR, SAFETY * err ** -0.2)
        if previous_rejected:
            factor = min(1.0, factor)
        h *= factor
        previous_rejected = False
    compat.keep_alive(work)
    return ys, Status.SUCCESS, n_accepted, n_rejected, n_evals, t


_dopri5_core = njit(cache=True)(_dopri5_generic)  # compiled once per first-class right-hand-side type


_rhs_into_at = compat.function_from_address(_RHS_TYPES[4])
_rhs_returning_at = compat.function_from_address(_RHS_TYPES[3])


@njit(cache=True)
def _dopri5_into_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOPRI5 with the right-hand side ``rhs(t, y, params, out)`` compiled at ``address``."""
    return _dopri5_core(_rhs_into_at(address), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


@njit(cache=True)
def _dopri5_returning_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOPRI5 with the right-hand side ``rhs(t, y, params) -> dy/dt`` compiled at ``address``."""
    return _dopri5_core(_rhs_returning_at(address), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


_ADDRESSES: dict = {}


def _rhs_address(rhs) -> tuple[int, int]:
    """(calling convention, address of the compiled code) of a jitted right-hand side, compiled (or loaded from its
    own on-disk cache) for the integrator's argument types on first use in a process. The address is valid while the
    dispatcher lives; the table keeps it alive."""
    found = _ADDRESSES.get(rhs)
    if found is None:
        if not hasattr(rhs, "get_compile_result"):
            raise TypeError("rhs must be a numba @njit function")
        arity = _rhs_arity(rhs)
        found = _ADDRESSES[rhs] = (arity, compat.compiled_address(rhs, _RHS_TYPES[arity],
                                                                  f"rhs with {arity} arguments"))
    return found


# A cast of a jitted right-hand side to its first-class type that holds no per-process address (numba_compat).
_first_class = compat.first_class_cast(lambda rhs: _RHS_TYPES[_rhs_arity(rhs)])


@njit(inline='always')
def dopri5_loop(rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """Adaptive DOPRI5 with dense output at ``t_eval`` (sorted, all >= t0).

    ``rhs`` is ``rhs(t, y, params, out)`` (writes dy/dt into ``out``: no allocation per evaluation, preferred) or
    ``rhs(t, y, params) -> dy/dt`` (a C-contiguous float64 vector). ``y0``, ``t_eval`` and ``params`` are contiguous
    float64 vectors. Returns ``(ys, status, n_accepted, n_rejected, n_evals, t_stop)``. Bind it to a right-hand side
    inside an ``@njit(cache=True)`` function to get an on-disk cached integrator (see the module docstring); the
    loop itself is compiled once per calling convention and shared by every right-hand side.
    """
    return _dopri5_core(_first_class(rhs), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)




# ---- adaptive DOP853 ---------------------------------------------------------------------------------------------
#
# The method (Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.10, and Hairer's ``dop853.f``):
#
# * 12 stages of an explicit Runge–Kutta pair of order 8, first same as last (stage 13 is f at the new point);
# * the error estimate combines the embedded 5th- and 3rd-order differences,
#   ``err = |h| ‖e₅‖² / √(n (‖e₅‖² + 0.01 ‖e₃‖²))`` with ``eᵢ = Σ_s E_i[s] K_s / (atol + rtol max(|y|, |y_new|))``;
# * the step-size factor is ``0.9 err^(−1/8)`` within [0.2, 10], the starting step Hairer's §II.4 rule for order 7;
# * outputs between steps come from the 7th-order dense output, which costs three more evaluations in the steps
#   that hold an output time.
#
# The coefficients are those of ``dop853.f`` (``dynamics/tableaus.py``, checked there against scipy's bit for bit),
# read once at import into tuples, which numba freezes into the machine code. With the same tolerances this loop takes
# the steps scipy's ``solve_ivp(method="DOP853")`` takes (the suite checks the step counts), in compiled code.

_DOP853_STAGES = DOP853.n_stages - 1  # 12; stage 12 (0-based) is f(t + h, y_new)
_DOP853_EXTENDED = len(DOP853.c)      # 16: three more stages for the dense output
_DOP853_ESTIMATE_ORDER = 7


def _dop853_row(values) -> tuple:
    """A coefficient row as a tuple of 16 floats (zero-padded): one type, so one compiled stage helper for all."""
    padded = np.zeros(_DOP853_EXTENDED)
    padded[:len(values)] = values
    return tuple(float(v) for v in padded)


_DOP853_A = tuple(_dop853_row(row) for row in DOP853.a)    # stage s uses _DOP853_A[s][:s]
_DOP853_C = _dop853_row(DOP853.c)
_DOP853_B = _dop853_row(DOP853.b)                           # 8th-order weights of stages 0..11
_DOP853_E3 = _dop853_row(DOP853.error_3)                    # over stages 0..12
_DOP853_E5 = _dop853_row(DOP853.error)
_DOP853_D = tuple(_dop853_row(row) for row in DOP853.dense)  # dense-output rows over stages 0..15
_DOP853_EXPONENT = -1.0 / (_DOP853_ESTIMATE_ORDER + 1)
_DOP853_WORK_ROWS = _DOP853_EXTENDED + 12  # K, then y, y_new, y_stage, two accumulators and the interpolant (7)


@njit(cache=True)
def _dop853_error_norm(y, y_new, h, K, acc, acc3, rtol, atol):
    """DOP853's combined error norm |h| ‖e₅‖² / √(n (‖e₅‖² + 0.01‖e₃‖²)), scaled by atol + rtol max(|y|, |y_new|)."""
    n = y.size
    _weighted_stages(K, _DOP853_STAGES + 1, _DOP853_E5, acc)
    _weighted_stages(K, _DOP853_STAGES + 1, _DOP853_E3, acc3)
    err5 = 0.0
    err3 = 0.0
    for i in range(n):
        scale = atol + rtol * max(abs(y[i]), abs(y_new[i]))
        err5 += (acc[i] / scale) ** 2
        err3 += (acc3[i] / scale) ** 2
    if err5 == 0.0 and err3 == 0.0:
        return 0.0
    return abs(h) * err5 / np.sqrt((err5 + 0.01 * err3) * n)


@njit(cache=True)
def _dop853_dense_coefficients(y, y_new, h, K, acc, dense):
    """The seven coefficient vectors F₀…F₆ of the order-7 interpolant on [t, t + h] (rows of ``dense``):
    y(t + θh) = y + θ(F₀ + (1 − θ)(F₁ + θ(F₂ + (1 − θ)(F₃ + θ(F₄ + (1 − θ)(F₅ + θF₆))))))."""
    n = y.size
    for i in range(n):
        dy = y_new[i] - y[i]
        dense[0, i] = dy
        dense[1, i] = h * K[0, i] - dy
        dense[2, i] = 2.0 * dy - h * (K[_DOP853_STAGES, i] + K[0, i])
    for r in range(4):
        _weighted_stages(K, _DOP853_EXTENDED, _DOP853_D[r], acc)
        for i in range(n):
            dense[3 + r, i] = h * acc[i]


@njit(cache=True)
def _dop853_interpolate(y, dense, theta, ys, j):
    """Evaluate the dense output at θ ∈ (0, 1) into row ``j`` of ``ys`` (Horner form of
    :func:`_dop853_dense_coefficients`)."""
    theta1 = 1.0 - theta
    for i in range(y.size):
        value = dense[6, i]
        value = value * theta + dense[5, i]
        value = value * theta1 + dense[4, i]
        value = value * theta + dense[3, i]
        value = value * theta1 + dense[2, i]
        value = value * theta + dense[1, i]
        value = value * theta1 + dense[0, i]
        ys[j, i] = y[i] + theta * value


def _dop853_generic(rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """Adaptive DOP853 with dense output at ``t_eval``; returns ``(ys, status, n_accepted, n_rejected, n_evals,
    t_stop)`` like the DOPRI5 loop. Stage derivatives are the contiguous rows of ``K`` (16 × n)."""
    n = y0.size
    n_out = t_eval.size
    ys = np.empty((n_out, n))
    j = 0
    while j < n_out and t_eval[j] <= t0:
        for i in range(n):
            ys[j, i] = y0[i]
        j += 1
    t_end = t_eval[n_out - 1]
    t = t0
    # One work array, held to the end; the loop uses borrowed views of it (see "borrowed views" above)
    work = np.empty((_DOP853_WORK_ROWS, n))
    K = compat.borrowed_rows(work, 0, _DOP853_EXTENDED)
    y = compat.borrowed_row(work, _DOP853_EXTENDED)
    y_new = compat.borrowed_row(work, _DOP853_EXTENDED + 1)
    y_stage = compat.borrowed_row(work, _DOP853_EXTENDED + 2)
    acc = compat.borrowed_row(work, _DOP853_EXTENDED + 3)
    acc3 = compat.borrowed_row(work, _DOP853_EXTENDED + 4)
    dense = compat.borrowed_rows(work, _DOP853_EXTENDED + 5, _DOP853_WORK_ROWS)
    params = compat.borrowed(params)
    for i in range(n):
        y[i] = y0[i]
    compat.evaluate_into(rhs, t, y, params, compat.borrowed_row(K, 0))
    n_evals = 1
    n_accepted = 0
    n_rejected = 0
    if j == n_out:
        return ys, Status.SUCCESS, n_accepted, n_rejected, n_evals, t
    if first_step > 0.0:
        h = min(first_step, t_end - t0)
    else:
        h = _initial_step(rhs, t0, y, compat.borrowed_row(K, 0), compat.borrowed_row(K, 1), y_stage, params, rtol, atol, t_end - t0,
                          1.0 / (_DOP853_ESTIMATE_ORDER + 1))
        n_evals += 1
    tiny = 10.0 * _EPS
    previous_rejected = False
    while j < n_out:
        if n_accepted + n_rejected >= max_steps:
            return ys, Status.MAX_STEPS, n_accepted, n_rejected, n_evals, t
        clipped = h >= t_end - t
        if clipped:
            h = t_end - t
        if h <= tiny * max(abs(t), 1.0):
            return ys, Status.STEP_TOO_SMALL, n_accepted, n_rejected, n_evals, t
        for s in range(1, _DOP853_STAGES):
            _stage_sum(y, h, K, s, _DOP853_A[s], acc, y_stage)
            compat.evaluate_into(rhs, t + _DOP853_C[s] * h, y_stage, params, compat.borrowed_row(K, s))
        _stage_sum(y, h, K, _DOP853_STAGES, _DOP853_B, acc, y_new)
        compat.evaluate_into(rhs, t + h, y_new, params, compat.borrowed_row(K, _DOP853_STAGES))
        n_evals += _DOP853_STAGES
        err = _dop853_error_norm(y, y_new, h, K, acc, acc3, rtol, atol)
        if not np.isfinite(err):
            h *= MIN_FACTOR
            n_rejected += 1
            previous_rejected = True
            continue
        if err > 1.0:
            h *= max(MIN_FACTOR, SAFETY * err ** _DOP853_EXPONENT)
            n_rejected += 1
            previous_rejected = True
            continue
        t_new = t_end if clipped else t + h
        if j < n_out and t_eval[j] < t_new:
            for s in range(_DOP853_STAGES + 1, _DOP853_EXTENDED):  # the interpolant's three extra stages
                _stage_sum(y, h, K, s, _DOP853_A[s], acc, y_stage)
                compat.evaluate_into(rhs, t + _DOP853_C[s] * h, y_stage, params, compat.borrowed_row(K, s))
            n_evals += _DOP853_EXTENDED - _DOP853_STAGES - 1
            _dop853_dense_coefficients(y, y_new, h, K, acc, dense)
        while j < n_out and t_eval[j] <= t_new:
            if t_eval[j] == t_new:
                for i in range(n):
                    ys[j, i] = y_new[i]
            else:
                _dop853_interpolate(y, dense, (t_eval[j] - t) / h, ys, j)
            j += 1
        t = t_new
        y, y_new = y_new, y
        for i in range(n):  # first same as last
            K[0, i] = K[_DOP853_STAGES, i]
        n_accepted += 1
        status = _state_status(y, blowup)
        if status != Status.SUCCESS:
            return ys, status, n_accepted, n_rejected, n_evals, t
        factor = MAX_FACTOR if err == 0.0 else min(MAX_FACTOR, SAFETY * err ** _DOP853_EXPONENT)
        if previous_rejected:
            factor = min(1.0, factor)
        h *= factor
        previous_rejected = False
    compat.keep_alive(work)
    return ys, Status.SUCCESS, n_accepted, n_rejected, n_evals, t


_dop853_core = njit(cache=True)(_dop853_generic)  # compiled once per first-class right-hand-side type


@njit(cache=True)
def _dop853_into_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOP853 with the right-hand side ``rhs(t, y, params, out)`` compiled at ``address``."""
    return _dop853_core(_rhs_into_at(address), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


@njit(cache=True)
def _dop853_returning_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOP853 with the right-hand side ``rhs(t, y, params) -> dy/dt`` compiled at ``address``."""
    return _dop853_core(_rhs_returning_at(address), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def solve_dop853(rhs, y0, t_eval, params=None, *, t0: float | None = None, rtol: float = 1e-6, atol: float = 1e-9,
                 first_step: float | None = None, max_steps: int = 1_000_000,
                 blowup: float = DEFAULT_BLOWUP) -> Solution:
    """Integrate ``dy/dt = rhs(t, y, params)`` with adaptive DOP853 (the section "adaptive DOP853" of this module).

    Parameters, returns and errors are those of :func:`~attnflow.dynamics.integrate.solve_dopri5` (without
    ``loop``). On smooth flows at tight tolerances an 8th-order step is more accurate than DOPRI5's for a similar
    number of right-hand-side evaluations, so at equal accuracy it can run at a looser tolerance;
    ``benchmarks/bench_reduced_solves.py`` measures both on every system's reduced flow.
    """
    args = _adaptive_arguments(y0, t_eval, params, t0, rtol, atol, first_step, max_steps, blowup)
    if config.DISABLE_JIT:
        ys, status, n_acc, n_rej, n_ev, t_stop = _dop853_generic(rhs, *args)
    else:
        arity, address = _rhs_address(rhs)
        core = _dop853_into_at if arity == 4 else _dop853_returning_at
        ys, status, n_acc, n_rej, n_ev, t_stop = core(address, *args)
    if status:
        _raise_for_status(status, n_acc, t_stop, "solve_dop853", max_steps)
    return Solution(t=args[2].copy(), y=ys, n_steps=n_acc, n_rejected=n_rej, n_rhs_evals=n_ev)


# --------------------------------------------------------------------------------------------------
# Python wrappers: validate, call the compiled loop, turn a Status into an error
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
    params = np.array(params, dtype=np.float64, order="C")  # a fresh writable copy: the type the loops compile for
    if params.ndim != 1:
        raise ValueError(f"params must be a flat 1-D float array, got shape {params.shape}")
    if not np.all(np.isfinite(params)):
        raise ValueError("params must be finite")
    return params


_MIN_RTOL = 100 * np.finfo(float).eps


@njit(cache=True)
def _first_input_problem(y0, t_eval, params):
    """0 if every entry is usable, else 1: y0 not finite, 2: t_eval not finite, 3: t_eval not sorted, 4: params not
    finite (the order in which :func:`solve_dopri5` reports them)."""
    for v in y0:
        if not np.isfinite(v):
            return 1
    for v in t_eval:
        if not np.isfinite(v):
            return 2
    for i in range(1, t_eval.size):
        if t_eval[i] < t_eval[i - 1]:
            return 3
    for v in params:
        if not np.isfinite(v):
            return 4
    return 0


def _real(value, name: str) -> float:
    """``value`` as a float; a ValueError naming ``name`` when it is not a real number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None


def _positive(value, name: str, allow_zero: bool = False) -> float:
    value = _real(value, name)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
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


def _raise_for_status(status: int, step: int, t: float | None = None, solver: str = "", max_steps=None) -> None:
    """The error a loop's :class:`Status` stands for (none for ``SUCCESS``), at the step ``step`` and time ``t`` (none
    for a map); ``solver`` and ``max_steps`` name the budget that ran out."""
    status = Status(status)
    where = "" if t is None else f" (t = {t:.6g})"
    if status.error is DivergenceError:
        raise DivergenceError(f"diverged at step {step}{where}: {status.message}")
    if status is Status.WRONG_SIZE:
        raise ValueError(f"{status.message} at step {step}{where}")
    if status is Status.MAX_STEPS:
        raise BudgetExceeded(f"{solver} used its budget of max_steps={max_steps} steps at t = {t:.6g} "
                             f"({status.message})")


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
    _raise_for_status(status, step, t0 + step * dt)
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
    rhs : numba-compiled function ``rhs(t, y, params, out)`` writing dy/dt into ``out``, or ``rhs(t, y, params)``
        returning it (a C-contiguous float64 vector); ``t`` a float, the vectors C-contiguous float64.
    y0 : array_like, shape (n,)
        State at ``t0``.
    t_eval : array_like, shape (n_t,)
        Increasing output times, all ``>= t0``.
    params : array_like, shape (p,), optional
        Passed to ``rhs`` without a copy when it is a writable C-contiguous float64 vector: ``rhs`` must not write
        to it (nor to ``y``).
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
        ``(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)``. Not needed: without it the shared
        cached loop calls ``rhs`` by its compiled address (the module docstring, "Caching and compile time").

    Returns
    -------
    Solution

    Raises
    ------
    ValueError, DivergenceError, BudgetExceeded
    TypeError
        If ``rhs`` is not a numba function of one of the two forms.
    """
    args = _adaptive_arguments(y0, t_eval, params, t0, rtol, atol, first_step, max_steps, blowup)
    if loop is not None:
        ys, status, n_acc, n_rej, n_ev, t_stop = loop(*args)
    elif config.DISABLE_JIT:
        ys, status, n_acc, n_rej, n_ev, t_stop = _dopri5_generic(rhs, *args)
    else:
        arity, address = _rhs_address(rhs)
        core = _dopri5_into_at if arity == 4 else _dopri5_returning_at
        ys, status, n_acc, n_rej, n_ev, t_stop = core(address, *args)
    if status:
        _raise_for_status(status, n_acc, t_stop, "solve_dopri5", max_steps)
    return Solution(t=args[2].copy(), y=ys, n_steps=n_acc, n_rejected=n_rej, n_rhs_evals=n_ev)


def _adaptive_arguments(y0, t_eval, params, t0, rtol, atol, first_step, max_steps, blowup) -> tuple:
    """The checked arguments ``(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)`` of an adaptive
    loop (see :func:`solve_dopri5`); raises ValueError naming the parameter."""
    # The shapes here, the values in one compiled pass (numpy's checks cost more than a small solve). A solve's
    # Python path is most of its cost when the caches are cold, so the common case (float64 vectors) copies nothing.
    y0 = _float_vector(y0, "y0")
    if y0.ndim != 1 or y0.size == 0:
        raise ValueError(f"y0 must be a non-empty 1-D array, got shape {y0.shape}")
    params = _NO_PARAMS if params is None else _float_vector(params, "params")
    if params.ndim != 1:
        raise ValueError(f"params must be a flat 1-D float array, got shape {params.shape}")
    t_eval = _float_vector(t_eval, "t_eval")
    if t_eval.ndim != 1 or t_eval.size == 0:
        raise ValueError("t_eval must be a non-empty, finite 1-D array")
    problem = _first_input_problem(y0, t_eval, params)
    if problem:
        raise ValueError(("y0 must be finite", "t_eval must be a non-empty, finite 1-D array",
                          "t_eval must be sorted in increasing order", "params must be finite")[problem - 1])
    t0 = float(t_eval[0]) if t0 is None else _real(t0, "t0")
    if not math.isfinite(t0) or t_eval[0] < t0:
        raise ValueError(f"t0 must be finite and <= t_eval[0], got {t0}")
    # The usual options are accepted by conversions and comparisons alone (calls cost when the caches are cold);
    # anything else goes to _checked_options, which reports the first bad option by name, in the order listed.
    try:
        values = float(rtol), float(atol), 0.0 if first_step is None else float(first_step), int(max_steps), \
            float(blowup)
    except (TypeError, ValueError):
        values = None
    if values is not None and _MIN_RTOL <= values[0] < math.inf and 0.0 <= values[1] < math.inf and \
            (first_step is None or 0.0 < values[2] < math.inf) and values[3] >= 1 and 0.0 < values[4] < math.inf:
        return (y0, t0, t_eval, params, *values)
    return (y0, t0, t_eval, params, *_checked_options(rtol, atol, first_step, max_steps, blowup))


def _checked_options(rtol, atol, first_step, max_steps, blowup) -> tuple:
    """(rtol, atol, first_step, max_steps, blowup) of an adaptive solve, checked one by one; raises ValueError naming
    the first that is not a number of its kind and range."""
    rtol = _positive(rtol, "rtol")
    atol = _positive(atol, "atol", allow_zero=True)
    if rtol < _MIN_RTOL:
        raise ValueError(f"rtol must be at least 100 machine epsilons, got {rtol}")
    first = 0.0 if first_step is None else _positive(first_step, "first_step")
    try:
        steps = int(max_steps)
    except (TypeError, ValueError):
        steps = 0
    if steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    return rtol, atol, first, steps, _positive(blowup, "blowup")


_FLOAT64 = np.dtype(np.float64)
_NO_PARAMS = np.zeros(0)  # shared: nothing can be written into an empty vector


def _float_vector(values, name: str) -> np.ndarray:
    """``values`` as a float64 array of the one type the compiled loops are compiled for (writable, aligned,
    C-contiguous): the array itself when it already is one, else a fresh copy (a read-only or strided input would
    otherwise be a second type, and so a second compile of the loop). The loops copy ``y0`` and only read
    ``t_eval``; ``params`` reaches the right-hand side as given, which must not write to it."""
    if type(values) is np.ndarray and values.dtype == _FLOAT64:
        flags = values.flags
        if flags.c_contiguous and flags.writeable and flags.aligned:
            return values
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of real numbers, got {values!r}") from None


def iterate_map(
    step_map, x0, n_steps: int, params=None, record_steps=None, blowup: float = DEFAULT_BLOWUP, *, loop=None
):
    """Iterate the discrete-time map ``x_{k+1} = step_map(k, x_k, params)`` for ``n_steps`` steps.

    Parameters
    ----------
    step_map : numba-compiled function ``(int, ndarray (n,), ndarray (p,)) -> ndarray (n,)``
        It returns a new C-contiguous float64 vector (it is compiled for ``(int64, float64[::1], float64[::1]) ->
        float64[::1]``; another return type is a TypeError naming ``step_map``).
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
        ``(x0, n_steps, record_steps, params, blowup)``. Not needed: without it one shared cached loop calls
        ``step_map`` by its compiled address, so a map costs only its own compilation.

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
    if loop is not None:
        xs, status, step = loop(x0, n_steps, steps, params, blowup)
    elif config.DISABLE_JIT:
        xs, status, step = map_loop(step_map, x0, n_steps, steps, params, blowup)
    else:
        xs, status, step = _map_loop_at(_map_address(step_map), x0, n_steps, steps, params, blowup)
    _raise_for_status(status, step)
    return Solution(t=steps.astype(np.float64), y=xs, n_steps=n_steps, n_rejected=0, n_rhs_evals=n_steps)
