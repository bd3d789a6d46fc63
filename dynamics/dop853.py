"""Adaptive Dormand–Prince 8(5,3) — DOP853 — on the engine of :mod:`attnflow.dynamics.integrate`.

The same right-hand sides, calling conventions, checks, status codes and errors as
:func:`~attnflow.dynamics.integrate.solve_dopri5`, and the same compile-once design: the loop takes the right-hand
side as a numba first-class function, called through the address of its compiled code, so it is compiled once per
calling convention and cached on disk.

The method (Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.10, and Hairer's ``dop853.f``):

* 12 stages of an explicit Runge–Kutta pair of order 8, first same as last (stage 13 is f at the new point);
* the error estimate combines the embedded 5th- and 3rd-order differences,
  ``err = |h| ‖e₅‖² / √(n (‖e₅‖² + 0.01 ‖e₃‖²))`` with ``eᵢ = Σ_s E_i[s] K_s / (atol + rtol max(|y|, |y_new|))``;
* the step-size factor is ``0.9 err^(−1/8)`` within [0.2, 10], the starting step Hairer's §II.4 rule for order 7;
* outputs between steps come from the 7th-order dense output, which costs three more evaluations in the steps
  that hold an output time.

The coefficients are scipy's (``scipy.integrate._ivp.dop853_coefficients``, transcribed there from ``dop853.f``),
read once at import into tuples, which numba freezes into the machine code. With the same tolerances this loop takes
the steps scipy's ``solve_ivp(method="DOP853")`` takes (the suite checks the step counts), in compiled code.
"""
from __future__ import annotations

import numpy as np
from numba import config, njit
from scipy.integrate._ivp import dop853_coefficients as _coefficients

from .integrate import (
    _EPS, _MAX_STEPS, _OK, _STEP_TOO_SMALL, MAX_FACTOR, MIN_FACTOR, SAFETY, Solution, _adaptive_arguments, _evaluate,
    _function_at, _initial_step, _raise_for_adaptive_status, _rhs_address, _stage_sum, _state_status,
    _weighted_stages,
)

__all__ = ["solve_dop853"]

_STAGES = _coefficients.N_STAGES             # 12; stage 12 (0-based) is f(t + h, y_new)
_EXTENDED = _coefficients.N_STAGES_EXTENDED  # 16: three more stages for the dense output
_ORDER_OF_ESTIMATE = 7


def _row(values) -> tuple:
    """A coefficient row as a tuple of _EXTENDED floats (zero-padded): one type, so one compiled helper for all."""
    padded = np.zeros(_EXTENDED)
    padded[:len(values)] = values
    return tuple(float(v) for v in padded)


_A = tuple(_row(row) for row in _coefficients.A)   # stage s uses _A[s][:s]
_C = _row(_coefficients.C)
_B = _row(_coefficients.B)                          # 8th-order weights of stages 0..11
_E3 = _row(_coefficients.E3)                        # over stages 0..12
_E5 = _row(_coefficients.E5)
_D = tuple(_row(row) for row in _coefficients.D)   # dense-output rows over stages 0..15
_EXPONENT = -1.0 / (_ORDER_OF_ESTIMATE + 1)


@njit(cache=True)
def _error_norm(y, y_new, h, K, acc, acc3, rtol, atol):
    """DOP853's combined error norm |h| ‖e₅‖² / √(n (‖e₅‖² + 0.01‖e₃‖²)), scaled by atol + rtol max(|y|, |y_new|)."""
    n = y.size
    _weighted_stages(K, _STAGES + 1, _E5, acc)
    _weighted_stages(K, _STAGES + 1, _E3, acc3)
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
def _dense_coefficients(y, y_new, h, K, acc, dense):
    """The seven coefficient vectors F₀…F₆ of the order-7 interpolant on [t, t + h] (rows of ``dense``):
    y(t + θh) = y + θ(F₀ + (1 − θ)(F₁ + θ(F₂ + (1 − θ)(F₃ + θ(F₄ + (1 − θ)(F₅ + θF₆))))))."""
    n = y.size
    for i in range(n):
        dy = y_new[i] - y[i]
        dense[0, i] = dy
        dense[1, i] = h * K[0, i] - dy
        dense[2, i] = 2.0 * dy - h * (K[_STAGES, i] + K[0, i])
    for r in range(4):
        _weighted_stages(K, _EXTENDED, _D[r], acc)
        for i in range(n):
            dense[3 + r, i] = h * acc[i]


@njit(cache=True)
def _interpolate(y, dense, theta, out_row):
    """Evaluate the dense output at θ ∈ (0, 1) into ``out_row`` (Horner form of :func:`_dense_coefficients`)."""
    theta1 = 1.0 - theta
    for i in range(y.size):
        value = dense[6, i]
        value = value * theta + dense[5, i]
        value = value * theta1 + dense[4, i]
        value = value * theta + dense[3, i]
        value = value * theta1 + dense[2, i]
        value = value * theta + dense[1, i]
        value = value * theta1 + dense[0, i]
        out_row[i] = y[i] + theta * value


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
    y = y0.copy()
    y_new = np.empty(n)
    y_stage = np.empty(n)
    acc = np.empty(n)
    acc3 = np.empty(n)
    K = np.empty((_EXTENDED, n))
    dense = np.empty((7, n))
    _evaluate(rhs, t, y, params, K[0])
    n_evals = 1
    n_accepted = 0
    n_rejected = 0
    if j == n_out:
        return ys, _OK, n_accepted, n_rejected, n_evals, t
    if first_step > 0.0:
        h = min(first_step, t_end - t0)
    else:
        h = _initial_step(rhs, t0, y, K[0], K[1], y_stage, params, rtol, atol, t_end - t0,
                          1.0 / (_ORDER_OF_ESTIMATE + 1))
        n_evals += 1
    tiny = 10.0 * _EPS
    previous_rejected = False
    while j < n_out:
        if n_accepted + n_rejected >= max_steps:
            return ys, _MAX_STEPS, n_accepted, n_rejected, n_evals, t
        clipped = h >= t_end - t
        if clipped:
            h = t_end - t
        if h <= tiny * max(abs(t), 1.0):
            return ys, _STEP_TOO_SMALL, n_accepted, n_rejected, n_evals, t
        for s in range(1, _STAGES):
            _stage_sum(y, h, K, s, _A[s], acc, y_stage)
            _evaluate(rhs, t + _C[s] * h, y_stage, params, K[s])
        _stage_sum(y, h, K, _STAGES, _B, acc, y_new)
        _evaluate(rhs, t + h, y_new, params, K[_STAGES])
        n_evals += _STAGES
        err = _error_norm(y, y_new, h, K, acc, acc3, rtol, atol)
        if not np.isfinite(err):
            h *= MIN_FACTOR
            n_rejected += 1
            previous_rejected = True
            continue
        if err > 1.0:
            h *= max(MIN_FACTOR, SAFETY * err ** _EXPONENT)
            n_rejected += 1
            previous_rejected = True
            continue
        t_new = t_end if clipped else t + h
        if j < n_out and t_eval[j] < t_new:
            for s in range(_STAGES + 1, _EXTENDED):  # the interpolant's three extra stages
                _stage_sum(y, h, K, s, _A[s], acc, y_stage)
                _evaluate(rhs, t + _C[s] * h, y_stage, params, K[s])
            n_evals += _EXTENDED - _STAGES - 1
            _dense_coefficients(y, y_new, h, K, acc, dense)
        while j < n_out and t_eval[j] <= t_new:
            if t_eval[j] == t_new:
                for i in range(n):
                    ys[j, i] = y_new[i]
            else:
                _interpolate(y, dense, (t_eval[j] - t) / h, ys[j])
            j += 1
        t = t_new
        y, y_new = y_new, y
        for i in range(n):  # first same as last
            K[0, i] = K[_STAGES, i]
        n_accepted += 1
        status = _state_status(y, blowup)
        if status != _OK:
            return ys, status, n_accepted, n_rejected, n_evals, t
        factor = MAX_FACTOR if err == 0.0 else min(MAX_FACTOR, SAFETY * err ** _EXPONENT)
        if previous_rejected:
            factor = min(1.0, factor)
        h *= factor
        previous_rejected = False
    return ys, _OK, n_accepted, n_rejected, n_evals, t


_dop853_core = njit(cache=True)(_dop853_generic)  # compiled once per first-class right-hand-side type


@njit(cache=True)
def _dop853_into_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOP853 with the right-hand side ``rhs(t, y, params, out)`` compiled at ``address``."""
    return _dop853_core(_function_at(address, 4), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


@njit(cache=True)
def _dop853_returning_at(address, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    """DOP853 with the right-hand side ``rhs(t, y, params) -> dy/dt`` compiled at ``address``."""
    return _dop853_core(_function_at(address, 3), y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def solve_dop853(rhs, y0, t_eval, params=None, *, t0: float | None = None, rtol: float = 1e-6, atol: float = 1e-9,
                 first_step: float | None = None, max_steps: int = 1_000_000, blowup: float = 1e12) -> Solution:
    """Integrate ``dy/dt = rhs(t, y, params)`` with adaptive DOP853 (the module docstring).

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
    _raise_for_adaptive_status(status, n_acc, t_stop, "solve_dop853", max_steps)
    return Solution(t=args[2].copy(), y=ys, n_steps=n_acc, n_rejected=n_rej, n_rhs_evals=n_ev)
