"""DOP853 on the shared engine: exact solutions (errors in tolerance units, dense output included), scipy's
DOP853 step for step, and the engine's errors."""
import numpy as np
import pytest
from numba import njit
from scipy.integrate import DOP853, solve_ivp

from attnflow.dynamics.integrate import solve_dop853
from attnflow.dynamics.errors import BudgetExceeded, DivergenceError

from .test_integrate import PROBLEMS, _scipy_rhs, blowup_rhs, decay_rhs, nan_rhs, oscillator_rhs_into


@pytest.mark.parametrize("name", PROBLEMS)
@pytest.mark.parametrize("rtol", [1e-6, 1e-10])
def test_error_in_tolerance_units_at_steps_and_between_them(name, rtol):
    """Against the exact solution at 41 times, most of them inside steps (the order-7 dense output)."""
    rhs, exact, y0, params, t_end = PROBLEMS[name]
    atol = rtol * 1e-2
    t_eval = np.linspace(0.0, t_end, 41)
    sol = solve_dop853(rhs, y0, t_eval, params, rtol=rtol, atol=atol)
    truth = exact(t_eval, y0, params)
    units = np.abs(sol.y - truth) / (atol + rtol * np.abs(truth).max(axis=0))
    assert units.max() < 25, units.max()  # the same allowance as DOPRI5's test (tests/test_integrate.py)


@pytest.mark.parametrize("name", PROBLEMS)
def test_takes_the_steps_scipys_dop853_takes(name):
    """Same coefficients, error norm, controller and starting step: the same accepted and rejected steps as scipy's
    DOP853 stepped one step at a time, and the same values to round-off."""
    rhs, _, y0, params, t_end = PROBLEMS[name]
    rtol, atol = 1e-8, 1e-11
    stepper = DOP853(_scipy_rhs(rhs, params), 0.0, y0, t_end, rtol=rtol, atol=atol)
    accepted = 0
    while stepper.status == "running":
        stepper.step()
        accepted += 1
    t_eval = np.linspace(0.0, t_end, 17)
    ours = solve_dop853(rhs, y0, t_eval, params, rtol=rtol, atol=atol)
    ref = solve_ivp(_scipy_rhs(rhs, params), (0.0, t_end), y0, method="DOP853", t_eval=t_eval, rtol=rtol, atol=atol)
    assert ours.n_steps == accepted
    # scipy's evaluations without dense output: one at t0, one for the starting step, 12 per attempted step (the
    # 13th stage is the next step's first): so the rejected steps agree too
    assert stepper.nfev == 2 + 12 * (ours.n_steps + ours.n_rejected)
    np.testing.assert_allclose(ours.y, ref.y.T, rtol=1e-10, atol=1e-13)


@njit(cache=True)
def oscillator_rhs_returning(t, y, p):
    out = np.empty(2)
    oscillator_rhs_into(t, y, p, out)
    return out


def test_both_calling_conventions_give_identical_results():
    t_eval = np.linspace(0.0, 10.0, 11)
    a = solve_dop853(oscillator_rhs_into, [1.0, 0.5], t_eval, [2.0], rtol=1e-9)
    b = solve_dop853(oscillator_rhs_returning, [1.0, 0.5], t_eval, [2.0], rtol=1e-9)
    assert np.array_equal(a.y, b.y) and a.n_rhs_evals == b.n_rhs_evals


def test_divergence_budget_and_bad_input():
    with pytest.raises(DivergenceError, match=r"diverged at step \d+ \(t = 0?\.?9?\d*"):
        solve_dop853(blowup_rhs, [1.0], [0.0, 2.0])  # y = 1/(1 − t)
    with pytest.raises(DivergenceError, match="diverged at step"):
        solve_dop853(nan_rhs, [1.0], [0.0, 1.0])
    rhs, _, y0, params, _ = PROBLEMS["oscillator"]
    with pytest.raises(BudgetExceeded, match="solve_dop853 used its budget of max_steps=5"):
        solve_dop853(rhs, y0, [0.0, 100.0], params, rtol=1e-10, max_steps=5)
    for kwargs, message in ((dict(y0=[np.nan]), "y0 must be finite"),
                            (dict(t_eval=[1.0, 0.0]), "t_eval must be sorted"),
                            (dict(rtol=0.0), "rtol"), (dict(params=[np.inf]), "params must be finite")):
        call = dict(y0=[1.0], t_eval=[0.0, 1.0], params=[1.0]) | kwargs
        with pytest.raises(ValueError, match=message):
            solve_dop853(decay_rhs, **call)
    with pytest.raises(TypeError, match="numba @njit"):
        solve_dop853(lambda t, y, p: y, [1.0], [0.0, 1.0])
