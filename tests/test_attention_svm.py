"""attention_svm: the SVM solvers against independent methods, the log-scaled loss against finite differences and
high-precision brute force, Problem validation, reproducibility, every claim at quick settings, and claims that can
fail."""
import mpmath
import numpy as np
import pytest
from scipy import optimize

from attnflow import seeding
from attnflow.closed_forms import attention_svm as cf
from attnflow.closed_forms.attention_svm import AttentionSVMProblem
from attnflow.dynamics import attention_svm as dyn
from attnflow.dynamics.errors import DivergenceError
from attnflow.validation import attention_svm as claims
from attnflow.validation.claims import run_claim
from attnflow.validation.systems import get_system
from tests.conftest import assert_figure_is_clean

P = AttentionSVMProblem


def _slsqp_svm(M, h):
    """min ½||x||² s.t. M x ≥ h by SLSQP from a feasible start: an independent solver for the Frobenius SVM."""
    x0 = np.linalg.lstsq(M, h, rcond=None)[0]
    x0 = x0 / max(min(np.min(M @ x0 / np.where(h > 0, h, 1)), 1), 1e-3) * 1.5
    return optimize.minimize(lambda x: 0.5 * x @ x, x0, jac=lambda x: x, method="SLSQP",
                             constraints=[dict(type="ineq", fun=lambda x: M @ x - h, jac=lambda x: M)],
                             options=dict(ftol=1e-15, maxiter=1000))


def _dual_svm(M, h):
    """The dual max_{λ≥0} h^T λ − ½||M^T λ||² by L-BFGS-B with bounds (θ = M^T λ): a second independent solver."""
    G = M @ M.T
    result = optimize.minimize(lambda lam: (0.5 * lam @ G @ lam - h @ lam, G @ lam - h), np.zeros(len(h)), jac=True,
                               method="L-BFGS-B", bounds=[(0, None)] * len(h),
                               options=dict(ftol=1e-15, gtol=1e-13, maxiter=20000))
    return M.T @ result.x


@pytest.mark.parametrize("model, n, T, d", [("prompt", 4, 3, 5), ("cross", 3, 4, 3), ("cross", 6, 8, 10)])
def test_frobenius_svm_matches_slsqp_and_kkt(model, n, T, d):
    problem = P.random(n, T, d, seed=7, model=model)
    sol = cf.frobenius_svm(problem)
    assert sol.feasible
    x = sol.theta.ravel()
    slack = sol.rows @ x - 1
    assert np.abs(x - sol.rows.T @ sol.lam).max() < 1e-9          # stationarity
    assert slack.min() > -1e-9 and sol.lam.min() >= 0              # primal and dual feasibility
    assert np.abs(sol.lam * slack).max() < 1e-9                    # complementary slackness
    reference = _dual_svm(sol.rows, np.ones(len(sol.rows)))
    assert np.abs(reference - x).max() < 1e-6 * max(1, np.abs(x).max())
    primal = _slsqp_svm(sol.rows, np.ones(len(sol.rows)))
    if primal.success:  # SLSQP sometimes stops early on the larger instances; the dual check stands alone then
        assert np.abs(primal.x - x).max() < 1e-6 * max(1, np.abs(x).max())


def test_infeasible_svm_has_a_farkas_certificate():
    found = 0
    for s in range(10):
        problem = P.random(5, 5, 2, seed=s)
        sol = cf.frobenius_svm(problem)
        if sol.feasible:
            continue
        found += 1
        u = sol.certificate
        assert u.min() >= 0 and abs(u.sum() - 1) < 1e-9          # h = 1: h^T u = 1
        assert np.abs(sol.rows.T @ u).max() < 1e-7                 # G^T u = 0: no θ can satisfy G θ ≥ 1
        with pytest.raises(ValueError, match="infeasible"):
            cf.offset_prediction(problem)
        with pytest.raises(ValueError, match="infeasible"):
            cf.support_tokens(problem)
        assert not cf.is_locally_optimal(problem)
    assert found >= 3


def test_ldp_matches_slsqp_with_zero_margins():
    problem = P.joint_relaxed()
    sol = cf.relaxed_svm(problem, np.array([1, 1, 1]))
    h = np.array([1.0, 1.0, 0.0])
    reference = _slsqp_svm(sol.rows, h)
    assert np.allclose(sol.theta, reference.x, atol=1e-7)
    assert np.allclose(sol.theta, [1, 0], atol=1e-12)


def test_nuclear_svm_matches_burer_monteiro():
    problem = P.random(3, 3, 3, seed=2)
    nuc = cf.nuclear_svm(problem)
    assert nuc.feasible and nuc.gap <= 1e-8
    d, M = problem.d, nuc.rows
    rng = np.random.default_rng(0)
    best = None
    for _ in range(4):  # nonconvex: a few starts, keep the best
        x0 = rng.normal(size=2 * d * d) * 3

        def W(x):
            return x[: d * d].reshape(d, d) @ x[d * d:].reshape(d, d).T

        result = optimize.minimize(lambda x: 0.5 * x @ x, x0, jac=lambda x: x, method="SLSQP",
                                   constraints=[dict(type="ineq", fun=lambda x: M @ W(x).ravel() - 1)],
                                   options=dict(ftol=1e-13, maxiter=2000))
        if result.success and (best is None or result.fun < best.fun):
            best = result
    assert best is not None
    assert abs(best.fun - nuc.value) < 1e-5 * nuc.value                   # min ½(||K||² + ||Q||²) = ||W||_*
    Wbm = best.x[: d * d].reshape(d, d) @ best.x[d * d:].reshape(d, d).T
    assert cf.corr(Wbm, nuc.theta) > 1 - 1e-5
    assert nuc.value <= cf.frobenius_svm(problem).value * np.sqrt(d) + 1e-9
    assert np.linalg.svd(nuc.theta, compute_uv=False).sum() <= np.linalg.svd(
        cf.frobenius_svm(problem).theta, compute_uv=False).sum() + 1e-9


@pytest.mark.parametrize("loss", cf.LOSSES)
@pytest.mark.parametrize("model", ["prompt", "cross"])
def test_gradient_matches_finite_differences(loss, model):
    problem = P.random(3, 4, 3, seed=11, model=model, loss=loss)
    theta = np.random.default_rng(1).normal(size=problem.theta_shape())
    out = cf.loss_and_gradient(problem, theta)
    numeric = np.zeros(theta.size)
    for k in range(theta.size):
        e = np.zeros(theta.size)
        e[k] = 1e-6
        plus = cf.loss_and_gradient(problem, theta + e.reshape(theta.shape))["loss"]
        minus = cf.loss_and_gradient(problem, theta - e.reshape(theta.shape))["loss"]
        numeric[k] = (plus - minus) / 2e-6
    assert np.allclose(out["gradient"].ravel(), numeric, atol=1e-8, rtol=1e-6)
    # brute force: naive softmax and loss
    s = np.exp(cf.logits(problem, theta))
    s /= s.sum(axis=1, keepdims=True)
    u = problem.Y * np.sum(s * (problem.X @ problem.v), axis=1)
    ell = {"logistic": np.log1p(np.exp(-u)), "linear": -u, "exp": np.exp(-u)}[loss]
    assert abs(out["loss"] - ell.mean()) < 1e-12


def _mpmath_gradient(problem, theta, digits=300):
    """∇L of the logistic loss from the raw definitions (softmax, head, loss) in ``digits``-digit arithmetic."""
    mpmath.mp.dps = digits
    phi, a, Y, n = problem.features, problem.X @ problem.v, problem.Y, problem.n
    P_ = phi.shape[-1]
    grad = [mpmath.mpf(0)] * P_
    for i in range(n):
        logit = [mpmath.fsum(mpmath.mpf(float(phi[i, t, q])) * mpmath.mpf(float(theta[q])) for q in range(P_))
                 for t in range(problem.T)]
        e = [mpmath.exp(x) for x in logit]
        Z = mpmath.fsum(e)
        s = [x / Z for x in e]
        f = mpmath.fsum(s[t] * mpmath.mpf(float(a[i, t])) for t in range(problem.T))
        lprime = -1 / (1 + mpmath.exp(Y[i] * f))
        for t in range(problem.T):
            w = lprime * Y[i] * s[t] * (mpmath.mpf(float(a[i, t])) - f) / n
            for q in range(P_):
                grad[q] += w * mpmath.mpf(float(phi[i, t, q]))
    return grad


def _far_out(problem, radius):
    theta_mm = cf.frobenius_svm(problem).theta
    return radius * theta_mm / np.linalg.norm(theta_mm) + [0.3, -0.2, 0]


def test_normalised_direction_is_exact_far_out():
    """At ||p|| = 400 the naive gradient is lost to round-off; the log-scaled direction matches 300-digit arithmetic."""
    problem = P.multi_input()
    theta = _far_out(problem, 400)
    direction = cf.loss_and_gradient(problem, theta)["direction"]
    grad = _mpmath_gradient(problem, theta)
    norm = mpmath.sqrt(mpmath.fsum(g * g for g in grad))
    exact = np.array([float(g / norm) for g in grad])
    assert np.abs(direction - exact).max() < 1e-12


@pytest.mark.parametrize("loss", cf.LOSSES)
@pytest.mark.parametrize("model", ["prompt", "cross"])
def test_log_gradient_norm_is_the_log_of_the_gradient_norm(loss, model):
    """Where ∇L is representable, log_gradient_norm is log||∇L|| of the gradient (itself checked against finite
    differences above) to round-off."""
    problem = P.random(3, 4, 3, seed=11, model=model, loss=loss)
    theta = np.random.default_rng(1).normal(size=problem.theta_shape())
    direct = np.log(np.linalg.norm(cf.loss_and_gradient(problem, theta)["gradient"]))
    assert cf.log_gradient_norm(problem, theta) == pytest.approx(direct, rel=1e-13, abs=1e-13)


@pytest.mark.parametrize("radius, digits", [(30.0, 300), (400.0, 300), (2000.0, 1500)])
def test_log_gradient_norm_matches_high_precision_where_the_gradient_underflows(radius, digits):
    """Against high-precision arithmetic of the raw definitions: at ||p|| = 30 (representable), 400 (the float
    gradient is round-off) and 2000 (it is exactly 0: ||∇L|| ≈ e^{−2937}, far below the smallest double). The raw
    definitions cancel: a_it − f_i is of the size of ∇L, so the digits must exceed −log₁₀||∇L|| (1276 at 2000)."""
    problem = P.multi_input()
    theta = _far_out(problem, radius)
    grad = _mpmath_gradient(problem, theta, digits)
    exact = float(mpmath.log(mpmath.sqrt(mpmath.fsum(g * g for g in grad))))
    if radius == 2000.0:
        assert not np.any(cf.loss_and_gradient(problem, theta)["gradient"])
    assert cf.log_gradient_norm(problem, theta) == pytest.approx(exact, rel=1e-12)


def test_offset_prediction_two_token_closed_form():
    for loss in cf.LOSSES:
        for C in (1.0, 3.0, 50.0):
            rho = cf.offset_prediction(P.two_token(C, loss))
            assert abs(rho[1] - cf.two_token_offset(C, loss)) < 1e-12 and abs(rho[0]) < 1e-12


def test_measured_offset_is_the_projection_of_section_6_2():
    """ρ = Π_V θ − <θ, θ̂^mm>θ̂^mm against the normal equations of the support rows (an independent projection), with
    ρ ∈ V and ρ ⟂ θ^mm; refused for an infeasible or uncertified SVM and for a θ of the wrong size."""
    problem = P.random(4, 5, 3, seed=2)
    sol = cf.frobenius_svm(problem)
    theta = np.random.default_rng(0).normal(size=problem.theta_shape())
    M = sol.rows[sol.active]
    x = theta.ravel()
    in_V = M.T @ np.linalg.solve(M @ M.T, M @ x)
    hat = sol.theta.ravel() / np.linalg.norm(sol.theta)
    expected = in_V - (x @ hat) * hat
    rho = cf.measured_offset(sol, theta)
    assert rho.shape == theta.shape
    assert np.allclose(rho.ravel(), expected, atol=1e-12)
    assert abs(rho.ravel() @ hat) < 1e-12
    assert np.allclose(M.T @ np.linalg.lstsq(M.T, rho.ravel(), rcond=None)[0], rho.ravel(), atol=1e-12)
    with pytest.raises(ValueError, match="theta"):
        cf.measured_offset(sol, np.zeros(4))
    uncertified = cf.svm(P.random(5, 5, 3, seed=1), norm="nuc", max_iterations=25)
    with pytest.raises(cf.UncertifiedSolution):
        cf.measured_offset(uncertified, np.zeros((3, 3)))


def test_rank_is_a_certified_decision():
    """Singular values below the cut must be zeros to the accuracy W is known: round-off by default, a solver's
    certified accuracy when given; a genuine small value (1e-8 of σ_max) under the cut is refused. The certified
    rank is numpy's matrix_rank at the same cut."""
    U, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(4, 4)))
    V, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(4, 4)))
    exact_zeros = (U * [2.0, 1.0, 0.0, 0.0]) @ V.T
    assert cf.rank(exact_zeros) == 2 == np.linalg.matrix_rank(exact_zeros, tol=2e-5)
    small = (U * [2.0, 1.0, 2e-8, 0.0]) @ V.T
    with pytest.raises(cf.UncertifiedSolution, match="undecided"):
        cf.rank(small)
    assert cf.rank(small, accuracy=1e-7) == 2
    assert cf.rank(small, relative=1e-9) == 3 == np.linalg.matrix_rank(small, tol=2e-9)
    with pytest.raises(ValueError, match="accuracy"):
        cf.rank(small, accuracy=-1.0)


def test_local_optimality_and_support_of_the_toys():
    assert cf.support_tokens(P.single_global(), np.array([0])) == [[2]]
    assert not cf.is_locally_optimal(P.single_global(), np.array([1]))
    assert cf.is_locally_optimal(P.single_local(), np.array([1]))
    with pytest.raises(ValueError, match="not locally optimal"):
        cf.offset_prediction(P.single_global(), np.array([1]))


def test_problem_validation():
    X = np.zeros((2, 3, 2))
    with pytest.raises(ValueError, match="Y"):
        P(X, np.array([1.0, 0.5]), np.ones(2))
    with pytest.raises(ValueError, match="Y"):
        P(X, np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="v"):
        P(X, np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="X"):
        P(np.zeros((2, 3)), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="X"):
        P(np.full((2, 3, 2), np.nan), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="Z"):
        P(X, np.ones(2), np.ones(2), Z=np.ones((3, 2)))
    with pytest.raises(ValueError, match="Wk"):
        P(X, np.ones(2), np.ones(2), Z=np.ones((2, 2)), Wk=np.eye(2))
    with pytest.raises(ValueError, match="loss"):
        P(X, np.ones(2), np.ones(2), loss="hinge")
    with pytest.raises(ValueError, match="optimal token is not unique"):
        _ = P(X, np.ones(2), np.ones(2)).opt
    with pytest.raises(ValueError, match="alpha"):
        cf.frobenius_svm(P.multi_input(), np.array([0, 0, 9]))
    with pytest.raises(ValueError, match="d"):
        P.from_params({"d": "100000"})
    with pytest.raises(ValueError, match="unknown"):
        P.from_params({"dd": "3"})
    with pytest.raises(ValueError, match="nuclear"):
        cf.nuclear_svm(P.multi_input())
    assert P.from_params({"instance": "two_token", "C": "2", "loss": "exp"}).X[0, 1, 2] == 2.0


def test_dynamics_validation_and_reproducibility():
    problem = P.random(3, 4, 3, seed=0)
    with pytest.raises(ValueError, match="theta0"):
        dyn.train(problem, np.zeros(3))
    with pytest.raises(ValueError, match="steps"):
        dyn.train(problem, np.zeros((3, 3)), steps=10**9)
    with pytest.raises(ValueError, match="eta"):
        dyn.train(problem, np.zeros((3, 3)), eta=-1)
    with pytest.raises(ValueError, match="algorithm"):
        dyn.minibatch(problem, seed=0, algorithm="joint")
    with pytest.raises(TypeError):
        dyn.minibatch(problem)  # the seed has no default
    a = dyn.minibatch(problem, seed=3, steps=200)
    b = dyn.minibatch(problem, seed=3, steps=200)
    c = dyn.minibatch(problem, seed=4, steps=200)
    assert np.array_equal(a.states["theta"], b.states["theta"])
    assert not np.array_equal(a.states["theta"], c.states["theta"])
    for algorithm in ("gd", "kq", "kq_joint"):
        run = dyn.minibatch(problem, seed=1, algorithm=algorithm, steps=100)
        assert np.all(np.isfinite(run.metrics["loss"]))
    joint = dyn.minibatch(P.joint_tight(), seed=1, algorithm="joint", steps=100)
    assert joint.states["v"].shape == (len(joint.times), 2)


def test_every_trainer_names_a_quantity_by_one_key():
    """The naming rule of DESIGN.md: θ (and v) under the same key in ``states`` and ``final``, ``final`` the last
    record, for every training algorithm."""
    problem = P.random(3, 4, 3, seed=0)
    W0 = dyn.initial_theta(problem, seed=1)
    runs = [dyn.train(problem, W0, steps=50), dyn.train_kq(problem, W0, W0.T.copy(), steps=50),
            dyn.train_relu_head(problem, np.eye(3) / np.sqrt(3), W0, steps=50),
            dyn.train_joint(P.joint_tight(), np.zeros(2), np.ones(2), steps=50)]
    for run in runs:
        assert "theta" in run.final and set(run.final) <= set(run.states)
        for key, value in run.final.items():
            assert np.array_equal(value, run.states[key][-1])


def test_divergence_is_reported_with_the_step():
    problem = P.random(3, 4, 3, seed=0)
    with pytest.raises(DivergenceError, match="step 1"):
        dyn.train(problem, np.full((3, 3), 1e308), eta=1e308, steps=5, normalise=True)


def test_regularisation_path_approaches_the_svm():
    run = dyn.population(P.multi_input(), R_max=64, points=4)
    assert np.all(np.diff(run.metrics["one_minus_corr"]) < 0)
    assert np.allclose(run.metrics["norm"], run.times, rtol=1e-6)


def test_system_is_registered():
    system = get_system("attention_svm")
    assert system.problem is P
    assert len(system.claims()) >= 19


def test_every_claim_passes_at_quick_settings():
    system = get_system("attention_svm")
    results = [run_claim(c, seed=0) for c in system.claims()]
    bad = [(r.name, r.status, r.measured, r.notes[:300]) for r in results
           if r.status != "PASS" and r.name not in claims.FINDINGS]
    assert not bad, bad
    for result in results:
        assert_figure_is_clean(result)


def _run(name):
    return run_claim(get_system("attention_svm").claims()[[c.name for c in get_system("attention_svm").claims()]
                                                          .index(name)], seed=0)


def test_claims_can_fail(monkeypatch):
    true_offset = cf.two_token_offset
    monkeypatch.setattr(cf, "two_token_offset", lambda C, loss: true_offset(C, loss) + 1e-4)
    assert _run("attention_svm.two_token_direction_and_offset").status == "FAIL"
    monkeypatch.undo()
    true_svm = cf.single_input_svm
    monkeypatch.setattr(cf, "single_input_svm", lambda alpha: true_svm(alpha) * (1 + 1e-9))
    assert _run("attention_svm.single_input_svm").status == "FAIL"
    monkeypatch.undo()
    true_prediction = cf.offset_prediction
    monkeypatch.setattr(cf, "offset_prediction", lambda problem, alpha=None: 1.1 * true_prediction(problem, alpha))
    assert _run("attention_svm.offset_matches_prediction").status == "FAIL"


@pytest.mark.parametrize("above, status", [(20, "FAIL"), (18, "FAIL"), (17, "PASS")])
def test_kq_direction_claim_tests_the_population_median_by_the_sign_test(monkeypatch, above, status):
    """Runs decreasing and within 5e-2 but ending above the level 2e-2: 18 or more of 20 above rejects "population
    median ≤ 2e-2" (P(Binomial(20, ½) ≥ 18) = 2.0e-4 ≤ 1e-3), 17 of 20 does not (P(≥ 17) = 1.3e-3); the 1 − corr
    curves are replaced, the ensemble is the real one."""
    calls = []

    def synthetic(thetas, target):
        calls.append(1)
        end = 0.03 if len(calls) <= above else 0.01
        return np.linspace(0.045, end, len(thetas))
    monkeypatch.setattr(claims, "_one_minus_corr", synthetic)
    result = _run("attention_svm.kq_converges_to_nuclear_svm")
    assert result.measured["above_level"] == f"{above}/20"
    assert result.status == status


def test_claim_seeds_give_other_ensembles():
    a = claims.ensemble(seeding.named(0, "x"), 2, 200, 100)
    b = claims.ensemble(seeding.named(1, "x"), 2, 200, 100)
    assert not np.array_equal(a[0]["problem"].X, b[0]["problem"].X)


def test_selection_svm_and_offset_satisfy_kkt_and_identities():
    problem = P.random(3, 4, 4, seed=5)
    selected = [[0, 2], [1], [1, 3]]
    sol = cf.selection_svm(problem, selected)
    assert sol.feasible
    A, G = sol.equalities, sol.margins_rows
    w = sol.theta.ravel()
    slack = G @ w - 1
    assert len(A) == 2 and len(G) == 11
    assert np.abs(w - G.T @ sol.lam - A.T @ sol.mu).max() < 1e-9   # stationarity
    assert np.abs(A @ w).max() < 1e-9                               # equalities
    assert slack.min() > -1e-9 and sol.lam.min() >= 0               # primal and dual feasibility
    assert np.abs(sol.lam * slack).max() < 1e-9                     # complementary slackness
    assert sol.lam.max() > 0
    # W^fin from the softmax of an arbitrary W: it meets the log-ratio equalities, lies in the row space of A (minimum
    # norm), is the projection of W onto that space, and is orthogonal to W^dir
    W = np.random.default_rng(0).normal(size=(4, 4)) * 3
    logit = cf.logits(problem, W)
    log_s = logit - np.logaddexp.reduce(logit, axis=1, keepdims=True)
    fin = cf.selection_offset(problem, log_s, selected).ravel()
    b = [log_s[0, 2] - log_s[0, 0], log_s[2, 3] - log_s[2, 1]]
    assert np.abs(A @ fin - b).max() < 1e-9
    c = np.linalg.lstsq(A.T, fin, rcond=None)[0]
    assert np.abs(A.T @ c - fin).max() < 1e-9
    assert np.abs(A @ (W.ravel() - fin)).max() < 1e-9
    assert abs(fin @ w) < 1e-9
    with pytest.raises(ValueError, match="selected"):
        cf.selection_svm(problem, [[0], [1]])
    with pytest.raises(ValueError, match="selected"):
        cf.selection_svm(problem, [[0], [], [1]])
    with pytest.raises(ValueError, match="selected"):
        cf.selection_svm(problem, [[0, 1, 2, 3]] * 3)
    with pytest.raises(ValueError, match="log_s"):
        cf.selection_offset(problem, np.zeros((3, 3)), selected)


def test_relu_head_training_validation():
    problem = P.random(3, 4, 3, seed=0)
    W0 = np.zeros((3, 3))
    with pytest.raises(ValueError, match="V"):
        dyn.train_relu_head(problem, np.ones((2, 3)), W0)
    with pytest.raises(ValueError, match="W0"):
        dyn.train_relu_head(problem, np.ones((3, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="problem"):
        dyn.train_relu_head(P.multi_input(), np.ones((3, 3)), W0)
    run = dyn.train_relu_head(problem, np.eye(3) / np.sqrt(3), W0, steps=50)
    assert np.all(np.isfinite(run.metrics["loss"])) and run.final["theta"].shape == (3, 3)


def test_svm_equivalence_passes_and_can_fail(monkeypatch):
    assert _run("attention_svm.svm_equivalence").status == "PASS"
    # without the finite part the two targets coincide: every run is a tie, the sign test has nothing to count
    monkeypatch.setattr(cf, "selection_offset", lambda problem, log_s, selected: np.zeros(problem.theta_shape()))
    assert _run("attention_svm.svm_equivalence").status == "FAIL"
    monkeypatch.undo()
    # a wrong finite part (its sign flipped) moves the target away from the iterates: the sign test itself fails
    true_offset = cf.selection_offset
    monkeypatch.setattr(cf, "selection_offset", lambda problem, log_s, selected: -true_offset(problem, log_s, selected))
    assert _run("attention_svm.svm_equivalence").status == "FAIL"


def _burer_monteiro_nuclear_svm(rows, d, starts=4, seed=0):
    """min ½(‖U‖² + ‖V‖²) s.t. <M_j, UVᵀ> ≥ 1 by SLSQP from random starts: at a minimiser ‖UVᵀ‖_* equals the
    objective, so this solves the nuclear SVM by an independent route (U and V full d × d). SLSQP ends on its line
    search at round-off ("positive directional derivative"), so a start counts when its iterate is feasible."""
    rng = np.random.default_rng(seed)
    M = rows.reshape(-1, d, d)

    def margins(x):
        return np.einsum("jab,ab->j", M, x[:d * d].reshape(d, d) @ x[d * d:].reshape(d, d).T) - 1

    best = None
    for _ in range(starts):
        result = optimize.minimize(lambda x: 0.5 * x @ x, 3 * rng.normal(size=2 * d * d), jac=lambda x: x,
                                   method="SLSQP", constraints=[dict(type="ineq", fun=margins)],
                                   options=dict(maxiter=5000, ftol=1e-15))
        if margins(result.x).min() > -1e-9 and (best is None or result.fun < best.fun):
            best = result
    return best.x[:d * d].reshape(d, d) @ best.x[d * d:].reshape(d, d).T


def test_nuclear_support_tokens_are_read_only_from_a_certified_solution():
    """A near-infeasible instance (n = T = 5, d = 3): at 20 000 iterations the duality gap is still ~1e-6 and the
    decision is refused with the gap; run on, the certified active set is the one an independent Burer–Monteiro
    solve finds, and the multipliers vanish off it (complementary slackness)."""
    problem = AttentionSVMProblem.random(5, 5, 3, seed=1)
    with pytest.raises(cf.UncertifiedSolution, match="duality gap") as refused:
        cf.support_tokens(problem, norm="nuc", max_iterations=20_000)
    assert refused.value.gap > cf.NUC_GAP
    sol = cf.certified_svm(problem, norm="nuc")
    assert sol.certified and sol.gap <= cf.NUC_GAP
    found = cf.support_tokens(problem, norm="nuc")
    assert sum(map(len, found)) == int(sol.active.sum())
    independent = _burer_monteiro_nuclear_svm(sol.rows, problem.d)
    assert np.linalg.svd(independent, compute_uv=False).sum() == pytest.approx(sol.value, rel=1e-6)
    independent_active = np.abs(sol.rows @ independent.ravel() - 1) <= cf.ACTIVE_TOL_NUC
    assert independent_active.tolist() == sol.active.tolist()
    assert np.all(sol.lam[~sol.active] <= 1e-6 * sol.lam.max())
    assert isinstance(cf.is_locally_optimal(problem, norm="nuc"), bool)
    with pytest.raises(ValueError, match="max_iterations"):
        cf.support_tokens(problem, norm="nuc", max_iterations=0)


def test_a_duality_gap_below_zero_by_round_off_is_an_exact_solution():
    """The nuclear solver's relative gap (upper − lower)/upper reaches −1e-16 at convergence (weak duality holds
    exactly; the sign is round-off): its accuracy is 0 and the rank is read at round-off, as at gap 0."""
    import dataclasses
    sol = cf.certified_svm(P.random(5, 5, 3, seed=1), norm="nuc")
    s = np.linalg.svd(sol.theta, compute_uv=False)
    assert sol.accuracy == pytest.approx(max(sol.gap, 0.0) * s.sum() / s[0], rel=1e-12, abs=0)
    converged = dataclasses.replace(sol, gap=-1.138e-16)
    assert converged.accuracy == 0.0 and dataclasses.replace(sol, gap=0.0).accuracy == 0.0
    assert cf.rank(converged.theta, accuracy=converged.accuracy) == cf.rank(sol.theta, accuracy=0.0)
