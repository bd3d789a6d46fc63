"""Numba integrators shared by every system.

One engine, written once, for every reduced ODE and discrete-time map in attnflow:

* :func:`solve_rk4` — classical fixed-step Runge–Kutta 4.
* :func:`solve_dopri5` — adaptive Dormand–Prince 5(4) with local extrapolation, the standard step control of
  Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.4, and Hairer's 4th-order dense output at the requested times.
* :func:`solve_dop853` — adaptive Dormand–Prince 8(5,3) with its 7th-order dense output.
* :func:`iterate_map` — iteration of a discrete-time map ``x_{k+1} = F(k, x_k)`` (the papers' gradient
  descent has a finite step η, so its reduced dynamics is a map, not an ODE).

The two adaptive methods are one loop (``_adaptive_generic``, the section "adaptive Runge–Kutta" below) fed by a
method's coefficient tables, :data:`~attnflow.dynamics.tableaus.DOPRI5` or :data:`~attnflow.dynamics.tableaus.DOP853`
(``dynamics/tableaus.py``), as scipy's ``RungeKutta`` is by its subclasses'; the arithmetic on the coefficients is
written out from the tables in ``dynamics/rk_kernels_generated.py`` (``dynamics/rk_kernels.py`` says why). The loops
report how they ended with a :class:`Status`, which the wrappers turn into errors.

Every right-hand side is an ``@njit`` function, either ``rhs(t, y, params, out)`` writing dy/dt into ``out`` (no
allocation per evaluation; the systems' flows use this form, named ``..._into``) or ``rhs(t, y, params) -> dy/dt``;
every map is an ``@njit`` function ``step_map(k, x, params) -> x_next``. ``params`` is a flat float64 array into which
each system packs its parameters.

**Caching and compile time.** Numba's on-disk cache cannot serve a function that receives another jitted function
as an argument (``dynamics/numba_compat.py`` says why). The adaptive loop therefore takes the right-hand side as a
numba *first-class function*, whose type is only its signature: it is compiled once per method and calling
convention, for every right-hand side of attnflow, and cached. :func:`solve_dopri5` and :func:`solve_dop853` look up
the address of the right-hand side's compiled code once per process (compiling it, or loading it from its own cache)
and pass it to a cached entry point as an integer, so a new right-hand side costs only its own compilation. For
callers inside compiled code,
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

Numba's cache does not notice edits to *other* files a cached function calls; after changing ``integrate.py``,
``rk_kernels_generated.py`` or ``numba_compat.py`` clear ``__pycache__`` (``find . -name '*.nb[ic]' -delete``).
Setting ``NUMBA_DISABLE_JIT=1`` runs the same loops as plain Python, for debugging and coverage.

All loops stop at the first non-finite state or a state whose largest entry exceeds ``blowup``, and the
wrappers raise :class:`DivergenceError` naming the step (and time) where it happened.

References
----------
J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae", J. Comput. Appl. Math. 6 (1980).
E. Hairer, S. P. Nørsett, G. Wanner, *Solving Ordinary Differential Equations I*, 2nd ed., Springer (1993):
§II.4 (automatic step size control, starting step size), §II.6 (dense output) and §II.10 (DOP853).
"""
from __future__ import annotations

import enum
import inspect
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import config, njit, types

from attnflow.closed_forms import checks as check

from . import numba_compat as compat
from .errors import BudgetExceeded, DivergenceError
from .rk_kernels_generated import dense_coefficients as _dense_coefficients
from .rk_kernels_generated import error_norm as _error_norm
from .rk_kernels_generated import interpolate as _interpolate
from .rk_kernels_generated import stage_sum as _stage_sum
from .tableaus import DOP853, DOPRI5, METHODS, EmbeddedPair

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
    "Status",
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
MAX_MAP_STEPS = 10_000_000  # iterations of one iterate_map call (every step may be recorded)
DEFAULT_BLOWUP = 1e12
_EPS = float(np.finfo(np.float64).eps)


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


# ---- adaptive Runge–Kutta -----------------------------------------------------------------------------------------
#
# One loop serves both methods and every right-hand side. It receives the right-hand side as a numba first-class
# function (``types.FunctionType``), whose type is its signature, not its address, so it is compiled once per method
# and signature and cached on disk. The signatures are the two calling conventions a right-hand side may have:
# ``rhs(t, y, params, out)`` writing dy/dt into ``out`` (no allocation per evaluation) or ``rhs(t, y, params)``
# returning it. ``solve_dopri5``/``solve_dop853`` pass the address of the right-hand side's compiled code to an entry
# point (``_dopri5_into_at`` …), which makes the first-class value from it; a binding in compiled code
# (``dopri5_loop``) casts the jitted right-hand side with ``_first_class`` and links the cached loop. What differs
# between methods is the arithmetic on their coefficients (``rk_kernels_generated``, written out from the tables of
# ``tableaus``) and a few numbers (``_Shape``).
#
# The loop works on borrowed views (``numba_compat``, "Borrowed views"): it borrows its arguments and the rows of one
# work array of its own frame, which it holds until it has ended.

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


class _Shape(NamedTuple):
    """What the adaptive loop reads of a method besides its kernels (``rk_kernels``)."""

    nodes: np.ndarray       # c: every stage's node, the dense output's extra stages last
    n_stages: int           # stages of a step; the last is f(t + h, y_new), first same as last
    n_interpolant: int      # coefficient vectors of the interpolant
    start_exponent: float   # 1/(q + 1), q the error estimator's order: the starting-step rule's exponent
    step_exponent: float    # −1/(q + 1): the step-size factor's exponent


def _shape(pair: EmbeddedPair) -> _Shape:
    return _Shape(nodes=np.array(pair.c), n_stages=pair.n_stages, n_interpolant=3 + len(pair.dense),
                  start_exponent=1.0 / (pair.error_order + 1), step_exponent=-1.0 / (pair.error_order + 1))


# The methods, by their index in tableaus.METHODS: their tables (dynamics/tableaus.py), some numbers read by the loop
# and their arithmetic, written out from the tables in dynamics/rk_kernels_generated.py.
_DOPRI5, _DOP853 = METHODS.index(DOPRI5), METHODS.index(DOP853)
_SHAPES = tuple(_shape(pair) for pair in METHODS)  # numba freezes these arrays into the compiled loop


def _work_rows(shape: _Shape) -> int:
    """Rows of the adaptive loop's work array: the stages, y, y_new, y_stage and the interpolant's coefficients."""
    return shape.nodes.size + 3 + shape.n_interpolant


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


def _adaptive_generic(rhs, method, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """Adaptive embedded Runge–Kutta with dense output at ``t_eval``, the method ``tableaus.METHODS[method]``; the
    body of ``_adaptive_core`` (see :func:`dopri5_loop`). Returns ``(ys, status, n_accepted, n_rejected, n_evals,
    t_stop)``.

    The stage derivatives are the rows of ``K``; the work vectors are rows of one array, used through borrowed views
    (the section "adaptive Runge–Kutta" above). The new state is taken over by swapping references, and its
    derivative, the step's last stage, is the next step's first (first same as last). The interpolant's coefficients
    (and the extra stages some methods need for them) are computed once per step that holds output times.
    """
    shape = _SHAPES[method]
    nodes = shape.nodes
    last = shape.n_stages - 1
    stages = nodes.size
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
    work = np.empty((stages + 3 + shape.n_interpolant, n))  # rows as in _work_rows
    K = compat.borrowed_rows(work, 0, stages)
    y = compat.borrowed_row(work, stages)
    y_new = compat.borrowed_row(work, stages + 1)
    y_stage = compat.borrowed_row(work, stages + 2)
    dense = compat.borrowed_rows(work, stages + 3, work.shape[0])
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
        h = _initial_step(rhs, t0, y, compat.borrowed_row(K, 0), compat.borrowed_row(K, 1), y_stage, params, rtol,
                          atol, t_end - t0, shape.start_exponent)
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
        for s in range(1, last + 1):
            stage = y_new if s == last else y_stage  # the last stage is f at the new state (c = 1)
            _stage_sum(method, s, y, h, K, stage)
            compat.evaluate_into(rhs, t + nodes[s] * h, stage, params, compat.borrowed_row(K, s))
        n_evals += last
        err = _error_norm(method, y, y_new, h, K, rtol, atol)
        if not np.isfinite(err):
            # A non-finite stage: shrink hard; if the state itself is the problem the step-size floor stops us.
            h *= MIN_FACTOR
            n_rejected += 1
            previous_rejected = True
            continue
        if err > 1.0:
            h *= max(MIN_FACTOR, SAFETY * err ** shape.step_exponent)
            n_rejected += 1
            previous_rejected = True
            continue
        t_new = t_end if clipped else t + h
        if j < n_out and t_eval[j] < t_new:
            for s in range(last + 1, stages):  # the dense output's extra stages (DOP853: three)
                _stage_sum(method, s, y, h, K, y_stage)
                compat.evaluate_into(rhs, t + nodes[s] * h, y_stage, params, compat.borrowed_row(K, s))
            n_evals += stages - last - 1
            _dense_coefficients(method, y, y_new, h, K, dense)
        while j < n_out and t_eval[j] <= t_new:
            if t_eval[j] == t_new:
                for i in range(n):
                    ys[j, i] = y_new[i]
            else:
                _interpolate(method, y, dense, (t_eval[j] - t) / h, ys, j)
            j += 1
        t = t_new
        y, y_new = y_new, y
        for i in range(n):  # first same as last
            K[0, i] = K[last, i]
        n_accepted += 1
        status = _state_status(y, blowup)
        if status != Status.SUCCESS:
            return ys, status, n_accepted, n_rejected, n_evals, t
        factor = MAX_FACTOR if err == 0.0 else min(MAX_FACTOR, SAFETY * err ** shape.step_exponent)
        if previous_rejected:
            factor = min(1.0, factor)
        h *= factor
        previous_rejected = False
    compat.keep_alive(work)
    return ys, Status.SUCCESS, n_accepted, n_rejected, n_evals, t


# Compiled once per method and calling convention: every caller passes the method's index as a constant, which numba
# types as a literal, so in each compilation the method's numbers are constants and only its own kernels are compiled
# (numba_compat.choose).
_adaptive_core = njit(cache=True)(_adaptive_generic)
_rhs_into_at = compat.function_from_address(_RHS_TYPES[4])
_rhs_returning_at = compat.function_from_address(_RHS_TYPES[3])
_first_class = compat.first_class_cast(lambda rhs: _RHS_TYPES[_rhs_arity(rhs)])


@njit(cache=True)
def _dopri5_into_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOPRI5 with the right-hand side ``rhs(t, y, params, out)`` compiled at ``address``."""
    return _adaptive_core(_rhs_into_at(address), _DOPRI5, y0, t0, t_eval, params, rtol, atol, first_step, max_steps,
                          blowup)


@njit(cache=True)
def _dopri5_returning_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOPRI5 with the right-hand side ``rhs(t, y, params) -> dy/dt`` compiled at ``address``."""
    return _adaptive_core(_rhs_returning_at(address), _DOPRI5, y0, t0, t_eval, params, rtol, atol, first_step,
                          max_steps, blowup)


@njit(cache=True)
def _dop853_into_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOP853 with the right-hand side ``rhs(t, y, params, out)`` compiled at ``address``."""
    return _adaptive_core(_rhs_into_at(address), _DOP853, y0, t0, t_eval, params, rtol, atol, first_step, max_steps,
                          blowup)


@njit(cache=True)
def _dop853_returning_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOP853 with the right-hand side ``rhs(t, y, params) -> dy/dt`` compiled at ``address``."""
    return _adaptive_core(_rhs_returning_at(address), _DOP853, y0, t0, t_eval, params, rtol, atol, first_step,
                          max_steps, blowup)


# The entry point by (method, calling convention).
_ENTRY_POINTS = {(_DOPRI5, 4): _dopri5_into_at, (_DOPRI5, 3): _dopri5_returning_at,
                 (_DOP853, 4): _dop853_into_at, (_DOP853, 3): _dop853_returning_at}


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


@njit(inline='always')
def dopri5_loop(rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """Adaptive DOPRI5 with dense output at ``t_eval`` (sorted, all >= t0).

    ``rhs`` is ``rhs(t, y, params, out)`` (writes dy/dt into ``out``: no allocation per evaluation, preferred) or
    ``rhs(t, y, params) -> dy/dt`` (a C-contiguous float64 vector). ``y0``, ``t_eval`` and ``params`` are contiguous
    float64 vectors. Returns ``(ys, status, n_accepted, n_rejected, n_evals, t_stop)``, ``status`` a
    :class:`Status`. Bind it to a right-hand side inside an ``@njit(cache=True)`` function to get an on-disk cached
    integrator (see the module docstring); the loop itself is compiled once per calling convention and shared by
    every right-hand side.
    """
    return _adaptive_core(_first_class(rhs), _DOPRI5, y0, t0, t_eval, params, rtol, atol, first_step, max_steps,
                          blowup)


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
    return _adaptive_solve(rhs, _DOPRI5, args, "solve_dopri5", max_steps, loop)


def _adaptive_solve(rhs, method: int, args: tuple, solver: str, max_steps, loop=None) -> Solution:
    """Run the adaptive loop for the method ``tableaus.METHODS[method]`` on checked arguments
    (:func:`_adaptive_arguments`) and raise what its status stands for; ``solver`` and ``max_steps`` (as given) are
    quoted in errors."""
    if loop is not None:
        ys, status, n_acc, n_rej, n_ev, t_stop = loop(*args)
    elif config.DISABLE_JIT:
        ys, status, n_acc, n_rej, n_ev, t_stop = _adaptive_generic(rhs, method, *args)
    else:
        arity, address = _rhs_address(rhs)
        ys, status, n_acc, n_rej, n_ev, t_stop = _ENTRY_POINTS[method, arity](address, *args)
    if status:
        _raise_for_status(status, n_acc, t_stop, solver, max_steps)
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
    n_steps = check.integer(n_steps, "n_steps", minimum=0)
    if n_steps > MAX_MAP_STEPS:
        raise ValueError(f"n_steps must be <= {MAX_MAP_STEPS:.0e}, got {n_steps}")
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


def solve_dop853(rhs, y0, t_eval, params=None, *, t0: float | None = None, rtol: float = 1e-6, atol: float = 1e-9,
                 first_step: float | None = None, max_steps: int = 1_000_000,
                 blowup: float = DEFAULT_BLOWUP) -> Solution:
    """Integrate ``dy/dt = rhs(t, y, params)`` with adaptive DOP853: Dormand–Prince 8(5,3), the combined 5th/3rd-order
    error estimate and the 7th-order dense output (:data:`~attnflow.dynamics.tableaus.DOP853`), on DOPRI5's loop.

    Parameters, returns and errors are those of :func:`~attnflow.dynamics.integrate.solve_dopri5` (without
    ``loop``). With the same tolerances it takes the steps scipy's ``solve_ivp(method="DOP853")`` takes. On smooth
    flows at tight tolerances an 8th-order step is more accurate than DOPRI5's for a similar number of
    right-hand-side evaluations, so at equal accuracy it can run at a looser tolerance;
    ``benchmarks/bench_reduced_solves.py`` measures both on every system's reduced flow.
    """
    args = _adaptive_arguments(y0, t_eval, params, t0, rtol, atol, first_step, max_steps, blowup)
    return _adaptive_solve(rhs, _DOP853, args, "solve_dop853", max_steps)
