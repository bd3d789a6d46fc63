"""The shared integrator engine: exact solutions (errors in tolerance units), scipy differential tests,
order of accuracy, cost budgets, divergence and bad input."""
import numpy as np
import pytest
from numba import literally, njit
from scipy.integrate import solve_ivp

from attnflow.dynamics import integrate
from attnflow.dynamics.integrate import (
    DivergenceError,
    dopri5_loop,
    iterate_map,
    map_loop,
    solve_dop853,
    solve_dopri5,
    solve_rk4,
)


# ---- problems with exact solutions: (rhs, exact(t, y0, params), y0, params, t_end) -------------------
@njit
def decay_rhs(t, y, p):
    return -p[0] * y


def decay_exact(t, y0, p):
    return np.outer(np.exp(-p[0] * t), y0)


@njit
def oscillator_rhs(t, y, p):
    out = np.empty(2)
    out[0] = y[1]
    out[1] = -p[0] ** 2 * y[0]
    return out


def oscillator_exact(t, y0, p):
    w = p[0]
    return np.stack([y0[0] * np.cos(w * t) + y0[1] / w * np.sin(w * t),
                     -y0[0] * w * np.sin(w * t) + y0[1] * np.cos(w * t)], axis=1)


@njit
def nonautonomous_rhs(t, y, p):
    return np.cos(t) * y


def nonautonomous_exact(t, y0, p):
    return np.outer(np.exp(np.sin(t)), y0)


@njit
def logistic_rhs(t, y, p):
    return p[0] * y * (1.0 - y)


def logistic_exact(t, y0, p):
    return (1.0 / (1.0 + (1.0 / y0[0] - 1.0) * np.exp(-p[0] * t)))[:, None]


PROBLEMS = {
    "decay": (decay_rhs, decay_exact, np.array([1.0, -2.0, 0.5]), np.array([0.7]), 5.0),
    "oscillator": (oscillator_rhs, oscillator_exact, np.array([1.0, 0.5]), np.array([2.0]), 10.0),
    "nonautonomous": (nonautonomous_rhs, nonautonomous_exact, np.array([1.0]), np.zeros(0), 12.0),
    "logistic": (logistic_rhs, logistic_exact, np.array([0.01]), np.array([1.5]), 10.0),
}


def _scipy_rhs(rhs, params):
    return lambda t, y: rhs(t, np.asarray(y, dtype=float), params)


@pytest.mark.parametrize("name", PROBLEMS)
@pytest.mark.parametrize("rtol", [1e-4, 1e-8])
def test_dopri5_error_in_tolerance_units(name, rtol):
    rhs, exact, y0, params, t_end = PROBLEMS[name]
    atol = rtol * 1e-2
    t_eval = np.linspace(0.0, t_end, 41)
    sol = solve_dopri5(rhs, y0, t_eval, params, rtol=rtol, atol=atol)
    truth = exact(t_eval, y0, params)
    # Units of the tolerance at the solution's scale (its amplitude), so zero crossings do not divide by ~0.
    error_units = np.abs(sol.y - truth) / (atol + rtol * np.abs(truth).max(axis=0))
    # Local error per step is < 1 tolerance unit; the global error accumulates over O(10) time units.
    # scipy's own tests allow 5-15 units for its problems; dense output adds no more than the step error.
    assert error_units.max() < 25, error_units.max()


@pytest.mark.parametrize("name", PROBLEMS)
def test_dopri5_matches_scipy_rk45_step_for_step(name):
    """Same tableau, same controller, same starting step: the same number of evaluations and the same values."""
    rhs, _, y0, params, t_end = PROBLEMS[name]
    t_eval = np.linspace(0.0, t_end, 23)
    ours = solve_dopri5(rhs, y0, t_eval, params, rtol=1e-7, atol=1e-10)
    ref = solve_ivp(_scipy_rhs(rhs, params), (0.0, t_end), y0, method="RK45", t_eval=t_eval,
                    rtol=1e-7, atol=1e-10)
    assert ours.n_rhs_evals == ref.nfev
    np.testing.assert_allclose(ours.y, ref.y.T, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", PROBLEMS)
def test_dopri5_agrees_with_scipy_dop853(name):
    """Against an independent, higher-order method: the difference is within a few tolerance units."""
    rhs, _, y0, params, t_end = PROBLEMS[name]
    t_eval = np.linspace(0.0, t_end, 17)
    rtol, atol = 1e-9, 1e-12
    ours = solve_dopri5(rhs, y0, t_eval, params, rtol=rtol, atol=atol)
    ref = solve_ivp(_scipy_rhs(rhs, params), (0.0, t_end), y0, method="DOP853", t_eval=t_eval,
                    rtol=1e-13, atol=1e-15)
    units = np.abs(ours.y - ref.y.T) / (atol + rtol * np.abs(ref.y.T))
    assert units.max() < 25


def test_dopri5_cost_budget():
    """Catches a controller regression without timing: decay at rtol 1e-6 needs few evaluations."""
    rhs, _, y0, params, _ = PROBLEMS["decay"]
    sol = solve_dopri5(rhs, y0, [0.0, 5.0], params, rtol=1e-6, atol=1e-9)
    assert sol.n_rhs_evals < 150
    assert sol.n_rejected <= 2


def test_dopri5_output_before_first_step_and_start_time():
    rhs, exact, y0, params, _ = PROBLEMS["decay"]
    sol = solve_dopri5(rhs, y0, [1.0, 2.0], params, t0=0.0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.y, exact(np.array([1.0, 2.0]), y0, params), rtol=1e-8)
    only_start = solve_dopri5(rhs, y0, [0.0], params)
    np.testing.assert_array_equal(only_start.y[0], y0)


@njit(cache=True)
def _bound_oscillator(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    return dopri5_loop(oscillator_rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def test_bound_cached_loop_gives_identical_results():
    rhs, _, y0, params, t_end = PROBLEMS["oscillator"]
    t_eval = np.linspace(0, t_end, 11)
    a = solve_dopri5(rhs, y0, t_eval, params, rtol=1e-8, atol=1e-10)
    b = solve_dopri5(rhs, y0, t_eval, params, rtol=1e-8, atol=1e-10, loop=_bound_oscillator)
    np.testing.assert_array_equal(a.y, b.y)
    assert a.n_rhs_evals == b.n_rhs_evals


@pytest.mark.parametrize("name", ["oscillator", "nonautonomous"])
def test_rk4_is_fourth_order(name):
    rhs, exact, y0, params, t_end = PROBLEMS[name]
    errors = []
    for dt in (0.02, 0.01):
        sol = solve_rk4(rhs, y0, (0.0, t_end), dt, params, record_every=10)
        errors.append(np.abs(sol.y[-1] - exact(np.array([t_end]), y0, params)[0]).max())
    ratio = errors[0] / errors[1]
    assert 14.0 < ratio < 18.0, ratio  # 2**4 = 16 for a 4th-order method


def test_rk4_records_requested_steps_and_final_state():
    rhs, exact, y0, params, _ = PROBLEMS["decay"]
    sol = solve_rk4(rhs, y0, (0.0, 1.0), 0.03, params, record_every=7)
    assert sol.t[0] == 0.0 and sol.t[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(sol.y, exact(sol.t, y0, params), rtol=1e-6)


@njit
def blowup_rhs(t, y, p):
    return y * y  # y(t) = 1 / (1 - t): finite-time blow-up at t = 1


@njit
def nan_rhs(t, y, p):
    out = y.copy()
    if t > 0.5:
        out[0] = np.nan
    return out


def test_divergence_names_the_step():
    with pytest.raises(DivergenceError, match=r"diverged at step \d+ \(t = 0?\.?9?\d*"):
        solve_dopri5(blowup_rhs, [1.0], [0.0, 2.0])
    with pytest.raises(DivergenceError, match=r"diverged at step 10\d \(t = 1\.0"):
        solve_rk4(blowup_rhs, [1.0], (0.0, 2.0), 0.01)
    with pytest.raises(DivergenceError, match=r"diverged at step 6 \(t = 0.6\): the state is no longer finite"):
        solve_rk4(nan_rhs, [1.0], (0.0, 1.0), 0.1)
    with pytest.raises(DivergenceError, match="diverged at step"):
        solve_dopri5(nan_rhs, [1.0], [0.0, 1.0])


@pytest.mark.parametrize("status, run", [
    ("NONFINITE", lambda: solve_rk4(nan_rhs, [1.0], (0.0, 1.0), 0.1)),
    ("BLOWUP", lambda: solve_dop853(blowup_rhs, [1.0], [0.0, 2.0])),
    ("MAX_STEPS", lambda: solve_dopri5(oscillator_rhs, [1.0, 0.5], [0.0, 100.0], [2.0], rtol=1e-10, max_steps=5)),
    ("STEP_TOO_SMALL", lambda: solve_dopri5(nan_rhs, [1.0], [0.0, 1.0])),
    ("WRONG_SIZE", lambda: iterate_map(growing_map, [1.0, 2.0], 3)),
])
def test_every_way_a_loop_ends_raises_its_status_error_with_its_message(status, run):
    status = integrate.Status[status]
    with pytest.raises(status.error) as raised:
        run()
    assert status.message in str(raised.value)


def test_the_loops_return_statuses_that_carry_their_meaning():
    y0, params = np.array([1.0, 0.5]), np.array([2.0])
    _, status, *_ = _bound_oscillator(y0, 0.0, np.linspace(0.0, 1.0, 3), params, 1e-8, 1e-10, 0.0, 10**6, 1e12)
    assert status is integrate.Status.SUCCESS and status == 0 and status.error is None
    _, status, *_ = _bound_oscillator(y0, 0.0, np.array([0.0, 100.0]), params, 1e-10, 1e-10, 0.0, 5, 1e12)
    assert status is integrate.Status.MAX_STEPS and issubclass(status.error, RuntimeError)
    assert len({s.message for s in integrate.Status}) == len(integrate.Status)


def test_max_steps_budget():
    rhs, _, y0, params, _ = PROBLEMS["oscillator"]
    with pytest.raises(RuntimeError, match="max_steps=5"):
        solve_dopri5(rhs, y0, [0.0, 100.0], params, rtol=1e-10, max_steps=5)


@njit
def logistic_map(k, x, p):
    return p[0] * x * (1.0 - x)


@njit
def doubling_map(k, x, p):
    return 2.0 * x


@njit
def growing_map(k, x, p):
    return np.concatenate((x, x))


def test_iterate_map_refuses_a_map_that_changes_the_state_size():
    with pytest.raises(ValueError, match="another size than x0 at step 1"):
        iterate_map(growing_map, [1.0, 2.0], 3)


@njit(cache=True)
def _bound_logistic(x0, n_steps, record_steps, params, blowup):
    return map_loop(logistic_map, x0, n_steps, record_steps, params, blowup)


def test_the_shared_map_loop_is_the_bound_loop_to_the_bit():
    """Without ``loop=`` the map is called through its compiled address by one cached loop; the states are those of
    the loop compiled around the map."""
    shared = iterate_map(logistic_map, [0.2], 500, [3.7], record_steps=np.arange(0, 501, 7))
    bound = iterate_map(logistic_map, [0.2], 500, [3.7], record_steps=np.arange(0, 501, 7), loop=_bound_logistic)
    np.testing.assert_array_equal(shared.y, bound.y)
    with pytest.raises(TypeError, match="step_map must be a numba @njit function"):
        iterate_map(lambda k, x, p: x, [0.2], 3)
    with pytest.raises(TypeError, match="step_map must take .* and return array"):
        iterate_map(_scalar_map, [0.2], 3)
    with pytest.raises(TypeError, match="step_map takes \\(k, x, params\\), not 2 arguments"):
        iterate_map(_two_argument_map, [0.2], 3)
    frozen = np.array([3.7])
    frozen.setflags(write=False)  # read-only parameters are copied, not a second type to compile
    np.testing.assert_array_equal(iterate_map(logistic_map, [0.2], 500, frozen).y, iterate_map(
        logistic_map, [0.2], 500, [3.7]).y)


@njit
def _scalar_map(k, x, p):
    return x[0]


@njit
def _two_argument_map(k, x):
    return x


def test_iterate_map_fixed_point_and_recording():
    sol = iterate_map(logistic_map, [0.2], 200, [2.5], record_steps=[0, 1, 200])
    np.testing.assert_allclose(sol.t, [0, 1, 200])
    assert sol.y[1, 0] == pytest.approx(2.5 * 0.2 * 0.8)
    assert sol.y[-1, 0] == pytest.approx(1 - 1 / 2.5, abs=1e-12)  # fixed point 1 - 1/r
    with pytest.raises(DivergenceError, match="diverged at step 40:"):
        iterate_map(doubling_map, [1.0], 100)  # 2**39 < 1e12 < 2**40


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: solve_dopri5(decay_rhs, [np.nan], [0.0, 1.0], [1.0]), "y0 must be finite"),
        (lambda: solve_dopri5(decay_rhs, [1.0], [1.0, 0.0], [1.0]), "t_eval must be sorted"),
        (lambda: solve_dopri5(decay_rhs, [1.0], [0.0, 1.0], [1.0], rtol=0.0), "rtol"),
        (lambda: solve_dopri5(decay_rhs, [1.0], [0.0, 1.0], [1.0], atol=-1.0), "atol"),
        (lambda: solve_dopri5(decay_rhs, [1.0], [0.0, 1.0], [np.inf]), "params must be finite"),
        (lambda: solve_dopri5(decay_rhs, [[1.0]], [0.0, 1.0], [1.0]), "y0 must be a non-empty 1-D"),
        (lambda: solve_rk4(decay_rhs, [1.0], (0.0, 1.0), -0.1, [1.0]), "dt must be"),
        (lambda: solve_rk4(decay_rhs, [1.0], (1.0, 0.0), 0.1, [1.0]), "t_span"),
        (lambda: iterate_map(logistic_map, [0.2], -1, [2.5]), "n_steps"),
        (lambda: iterate_map(logistic_map, [0.2], 5, [2.5], record_steps=[9]), "record_steps"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- the in-place calling convention rhs(t, y, params, out) ---------------------------------------------------------
@njit(cache=True)
def oscillator_rhs_into(t, y, p, out):
    out[0] = y[1]
    out[1] = -p[0] ** 2 * y[0]


@njit(cache=True)
def _bound_oscillator_into(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
    return dopri5_loop(oscillator_rhs_into, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)


def test_in_place_rhs_gives_the_same_solution_as_the_returning_one():
    _, exact, y0, params, t_end = PROBLEMS["oscillator"]
    t_eval = np.linspace(0, t_end, 11)
    returning = solve_dopri5(oscillator_rhs, y0, t_eval, params, rtol=1e-8, atol=1e-10)
    for loop in (None, _bound_oscillator_into):
        into = solve_dopri5(oscillator_rhs_into, y0, t_eval, params, rtol=1e-8, atol=1e-10, loop=loop)
        np.testing.assert_array_equal(into.y, returning.y)
        assert into.n_rhs_evals == returning.n_rhs_evals
    np.testing.assert_allclose(returning.y, exact(t_eval, y0, params), atol=1e-6)


def test_dopri5_leaves_its_inputs_alone():
    rhs, _, y0, params, t_end = PROBLEMS["decay"]
    y0_copy, params_copy = y0.copy(), params.copy()
    t_eval = np.linspace(0.0, t_end, 5)
    sol = solve_dopri5(rhs, y0, t_eval, params)
    np.testing.assert_array_equal(y0, y0_copy)
    np.testing.assert_array_equal(params, params_copy)
    np.testing.assert_array_equal(sol.y[0], y0)
    assert sol.t is not t_eval


@pytest.mark.parametrize("solver", [solve_dopri5, solve_dop853])
def test_inputs_of_every_kind_reach_one_compiled_loop(solver):
    """A float64 vector is passed to the loop as it is (nothing to copy: the loop only reads it); a read-only, strided,
    integer or list input is copied into one, so every kind gives the same bits and no second compile of the loop."""
    rhs, _, y0, params, t_end = PROBLEMS["oscillator"]
    t_eval = np.linspace(0.0, t_end, 9)
    assert integrate._float_vector(t_eval, "t_eval") is t_eval
    reference = solver(rhs, y0, t_eval, params, rtol=1e-8, atol=1e-10)
    frozen = t_eval.copy()
    frozen.setflags(write=False)
    strided = np.repeat(t_eval, 2)[::2]
    core = integrate._dopri5_returning_at if solver is solve_dopri5 else integrate._dop853_returning_at
    compiled = len(core.signatures)
    for times in (frozen, strided, list(t_eval)):
        copied = integrate._float_vector(times, "t_eval")
        assert copied is not times and copied.flags.writeable and copied.flags.c_contiguous
        np.testing.assert_array_equal(solver(rhs, y0, times, params, rtol=1e-8, atol=1e-10).y, reference.y)
    np.testing.assert_array_equal(solver(rhs, [int(v) for v in y0], t_eval, params, rtol=1e-8, atol=1e-10).y,
                                  solver(rhs, np.array([int(v) for v in y0], float), t_eval, params, rtol=1e-8,
                                         atol=1e-10).y)
    assert len(core.signatures) == compiled


@pytest.mark.parametrize("option, value", [("rtol", 1e-17), ("rtol", np.nan), ("atol", np.inf), ("blowup", 0.0),
                                           ("blowup", np.inf), ("first_step", -1.0), ("max_steps", 0),
                                           ("rtol", "x"), ("atol", None), ("first_step", "a"), ("max_steps", "many"),
                                           ("max_steps", None), ("blowup", [1.0, 2.0]), ("t0", "zero")])
@pytest.mark.parametrize("solver", [solve_dopri5, solve_dop853])
def test_adaptive_options_out_of_range_or_not_numbers_name_themselves(solver, option, value):
    with pytest.raises(ValueError, match=f"^{option} must"):
        solver(decay_rhs, [1.0], [0.0, 1.0], [1.0], **{option: value})


@pytest.mark.parametrize("argument", ["y0", "t_eval", "params"])
def test_adaptive_arrays_that_are_not_numbers_name_themselves(argument):
    arguments = dict(y0=[1.0], t_eval=[0.0, 1.0], params=[1.0]) | {argument: ["one"]}
    with pytest.raises(ValueError, match=f"^{argument} must be an array of real numbers"):
        solve_dopri5(decay_rhs, **arguments)


def test_adaptive_options_are_checked_in_order_and_quoted_as_given():
    with pytest.raises(ValueError, match="rtol must be finite and > 0"):
        solve_dopri5(decay_rhs, [1.0], [0.0, 1.0], [1.0], rtol=-1.0, atol=None)
    with pytest.raises(ValueError, match="atol must be finite"):
        solve_dopri5(decay_rhs, [1.0], [0.0, 1.0], [1.0], rtol=1e-17, atol=-1.0)
    with pytest.raises(ValueError, match="got 0.5"):
        solve_dopri5(decay_rhs, [1.0], [0.0, 1.0], [1.0], max_steps=0.5)


def test_rhs_of_the_wrong_form_is_a_type_error():
    @njit
    def two_arguments(t, y):
        return y

    @njit
    def returns_a_matrix(t, y, p):
        return np.outer(y, y)

    with pytest.raises(TypeError, match="takes"):
        solve_dopri5(two_arguments, [1.0], [0.0, 1.0])
    with pytest.raises(TypeError, match="and return array"):
        solve_dopri5(returns_a_matrix, [1.0], [0.0, 1.0])  # typing fails: a 2-D result where a vector is due


def test_bound_dopri5_loops_load_from_the_cache_in_a_new_process(tmp_path):
    """A binding of the loop to a right-hand side, and the loop itself, are served from numba's on-disk cache by a
    second process (the first compiles): none of them holds a per-process address."""
    import subprocess
    import sys
    import textwrap

    module = tmp_path / "bound_module.py"
    module.write_text(textwrap.dedent('''
        import numpy as np
        from numba import njit
        from attnflow.dynamics.integrate import dopri5_loop, solve_dopri5

        @njit(cache=True)
        def rhs(t, y, p, out):
            out[0] = -p[0] * y[0]

        @njit(cache=True)
        def bound(y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup):
            return dopri5_loop(rhs, y0, t0, t_eval, params, rtol, atol, first_step, max_steps, blowup)

        a = solve_dopri5(rhs, [1.0], [0.0, 1.0], [2.0], loop=bound)
        b = solve_dopri5(rhs, [1.0], [0.0, 1.0], [2.0])
        assert abs(a.y[-1, 0] - np.exp(-2.0)) < 1e-6 and a.y[-1, 0] == b.y[-1, 0]
        print(sum(bound.stats.cache_hits.values()), sum(bound.stats.cache_misses.values()))

        @njit(cache=True)
        def halve(k, x, p):
            return p[0] * x

        from attnflow.dynamics.integrate import _map_loop_at, iterate_map
        assert iterate_map(halve, [1.0], 3, [0.5]).y[-1, 0] == 0.125
        print(sum(_map_loop_at.stats.cache_hits.values()), sum(_map_loop_at.stats.cache_misses.values()))
    '''))
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-W", "error::numba.NumbaWarning", "-c", "import bound_module"], env=env,
                           capture_output=True, text=True, timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split() == ["0", "1", "0", "1"]  # compiled: the binding, then the shared map loop
    assert runs[1].stdout.split() == ["1", "0", "1", "0"]  # both loaded from the cache


# ---- the loops' borrowed views (dynamics/numba_compat.py, "Borrowed views") -----------------------------------------
WORK_ROWS = tuple(integrate._work_rows(shape) for shape in integrate._SHAPES)


@njit
def oscillator_rhs_scribbling(t, y, p, out):
    """oscillator_rhs_into, after filling freshly allocated blocks the size of the loops' work arrays with NaN: had
    a loop released its work array while still using views of it, these blocks would land in it."""
    for rows in WORK_ROWS:
        junk = np.empty((rows, y.size))
        junk[:] = np.nan
    out[0] = y[1]
    out[1] = -p[0] ** 2 * y[0]


@njit
def oscillator_rhs_into_plain(t, y, p, out):
    out[0] = y[1]
    out[1] = -p[0] ** 2 * y[0]


@pytest.mark.parametrize("solve", [solve_dopri5, solve_dop853])
def test_the_loops_hold_their_work_array_while_they_use_it(solve):
    t_eval = np.linspace(0.0, 10.0, 21)
    plain = solve(oscillator_rhs_into_plain, [1.0, 0.5], t_eval, [2.0], rtol=1e-9, atol=1e-12)
    scribbled = solve(oscillator_rhs_scribbling, [1.0, 0.5], t_eval, [2.0], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(scribbled.y, plain.y)
    assert scribbled.n_rhs_evals == plain.n_rhs_evals


@pytest.mark.parametrize("solve", [solve_dopri5, solve_dop853])
def test_the_loops_release_what_they_allocate(solve):
    from numba.core.runtime import _nrt_python as nrt

    t_eval = np.linspace(0.0, 10.0, 21)
    solve(oscillator_rhs_into_plain, [1.0, 0.5], t_eval, [2.0])  # compiled or loaded outside the count
    was_enabled = nrt.memsys_stats_enabled()
    nrt.memsys_enable_stats()
    try:
        before = (nrt.memsys_get_stats_alloc(), nrt.memsys_get_stats_free())
        for _ in range(3):
            solution = solve(oscillator_rhs_into_plain, [1.0, 0.5], t_eval, [2.0])
            del solution
        allocated = nrt.memsys_get_stats_alloc() - before[0]
        freed = nrt.memsys_get_stats_free() - before[1]
    finally:
        if not was_enabled:
            nrt.memsys_disable_stats()
    assert allocated >= 3 * 2  # the output and the work array of each solve
    assert freed == allocated


def _term_by_term(weights, count, K):
    """Σ_{r<count} w_r K[r] as one pass over the vector per term: the first term, then the nonzero ones, in order."""
    total = weights[0] * K[0]
    for r in range(1, count):
        if weights[r] != 0.0:
            total = total + weights[r] * K[r]
    return total


@njit
def _compiled_stage_sum(method, s, y, h, K, out):
    literally(method)  # the loop passes the method as a constant: compile for it as a literal too
    integrate._stage_sum(method, s, y, h, K, out)


@njit
def _compiled_error_norm(method, y, y_new, h, K, rtol, atol):
    literally(method)
    return integrate._error_norm(method, y, y_new, h, K, rtol, atol)


@njit
def _compiled_dense_coefficients(method, y, y_new, h, K, dense):
    literally(method)
    integrate._dense_coefficients(method, y, y_new, h, K, dense)


@njit
def _compiled_interpolate(method, y, dense, theta, ys, j):
    literally(method)
    integrate._interpolate(method, y, dense, theta, ys, j)


KERNELS = {
    "compiled": (_compiled_stage_sum, _compiled_error_norm, _compiled_dense_coefficients, _compiled_interpolate),
    "python": (integrate._stage_sum, integrate._error_norm, integrate._dense_coefficients, integrate._interpolate),
}


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("method", [0, 1], ids=["DOPRI5", "DOP853"])
@pytest.mark.parametrize("n", [3, 50])
def test_the_written_out_sums_are_the_term_by_term_passes_to_the_bit(method, n, kernels):
    """The kernels sum a tableau row one component at a time with its terms written out (dynamics/rk_kernels.py);
    the arithmetic is that of one pass over the vector per term, so the bits are the same: stages, error norm,
    interpolant coefficients and interpolant."""
    stage_sum, error_norm, dense_coefficients, interpolate = KERNELS[kernels]
    pair = integrate.METHODS[method]
    stages, last = len(pair.c), pair.n_stages - 1
    rng = np.random.default_rng(n)
    K, y, y_new = rng.normal(size=(stages, n)), rng.normal(size=n), rng.normal(size=n)
    h, rtol, atol = 0.37, 1e-6, 1e-9
    for s in range(1, stages):
        out = np.empty(n)
        stage_sum(method, s, y, h, K, out)
        np.testing.assert_array_equal(out, y + h * _term_by_term(pair.a[s], s, K))

    scale = atol + rtol * np.maximum(np.abs(y), np.abs(y_new))
    estimate = _term_by_term(pair.error, pair.n_stages, K)
    if pair.error_3 is not None:  # DOP853
        e5, e3 = estimate / scale, _term_by_term(pair.error_3, pair.n_stages, K) / scale
        err5 = err3 = 0.0
        for i in range(n):  # the norm's own sums, left to right
            err5 += e5[i] * e5[i]
            err3 += e3[i] * e3[i]
        expected = abs(h) * err5 / np.sqrt((err5 + 0.01 * err3) * n)
    else:
        scaled, total = h * estimate / scale, 0.0
        for i in range(n):
            total += scaled[i] * scaled[i]
        expected = np.sqrt(total / n)
    assert error_norm(method, y, y_new, h, K, rtol, atol) == expected

    dense = np.empty((3 + len(pair.dense), n))
    dense_coefficients(method, y, y_new, h, K, dense)
    delta = y_new - y
    slope_term = h * K[0] - delta
    third = 2.0 * delta - h * (K[last] + K[0]) if pair.hermite_as_scipy else delta - h * K[last] - slope_term
    rows = [delta, slope_term, third] + [h * _term_by_term(d, stages, K) for d in pair.dense]
    np.testing.assert_array_equal(dense, np.array(rows))

    theta = 0.3
    ys = np.empty((1, n))
    interpolate(method, y, dense, theta, ys, 0)
    nested = rows[-1]
    for k in range(len(rows) - 2, -1, -1):  # y + θ(F₀ + (1 − θ)(F₁ + θ(F₂ + (1 − θ)(F₃ + …)))), from the inside
        nested = rows[k] + ((1.0 - theta) if k % 2 == 0 else theta) * nested
    np.testing.assert_array_equal(ys[0], y + theta * nested)
