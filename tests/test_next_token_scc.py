"""next_token_scc: SCCs against brute-force reachability, the Graph-SVM against its KKT conditions and an independent
solver, the loss and gradient against finite differences and high-precision arithmetic, W^fin against stationarity
and its closed forms, the official code's outputs (golden file), bad inputs, reproducibility, every claim at quick
settings, and claims that fail when the theory is broken."""
import json
from pathlib import Path

import mpmath
import numpy as np
import pytest
from scipy import optimize

from attnflow.closed_forms import next_token_scc as cf
from attnflow.closed_forms.certificates import ROUND_OFF, rank_decision
from attnflow.closed_forms.next_token_scc import NTPProblem
from attnflow.dynamics import next_token_scc as dyn
from attnflow.validation import next_token_scc as claims
from attnflow.validation.claims import registered_claims, run_claim
from attnflow.validation.systems import get_system
from tests.conftest import assert_figure_is_clean

GOLDEN = Path(__file__).parent / "test_golden" / "next_token_scc_official.json"


def _instances():
    return [NTPProblem.paper(seed=s) for s in range(3)] + [NTPProblem.mixed(seed=s) for s in range(3)] + \
        [NTPProblem.random(8, 5, 7, 9, seed=s, require="any") for s in range(3)] + \
        [NTPProblem.paper(seed=5, require="acyclic"), NTPProblem.cyclic_toy(seed=0)]


# ---- graphs and SCCs ------------------------------------------------------------------------------------------


def _reachability(adjacency):
    """Transitive closure by Warshall's algorithm, reflexive."""
    R = adjacency.copy() | np.eye(len(adjacency), dtype=bool)
    for m in range(len(R)):
        R |= R[:, [m]] & R[[m], :]
    return R


@pytest.mark.parametrize("problem", _instances(), ids=lambda p: p.name)
def test_scc_equals_mutual_reachability(problem):
    graphs = cf.priority_graphs(problem)
    for k in range(problem.K):
        R = _reachability(graphs.adjacency[k])
        mutual = R & R.T
        comp = graphs.components[k]
        assert np.array_equal(mutual, comp[:, None] == comp[None, :])


@pytest.mark.parametrize("problem", _instances()[:6], ids=lambda p: p.name)
def test_edges_and_high_priority_sets_from_the_definitions(problem):
    graphs = cf.priority_graphs(problem)
    expected = np.zeros_like(graphs.adjacency)
    for i in range(problem.n):
        for j in problem.ids[i]:
            if j != problem.labels[i]:
                expected[problem.last[i], problem.labels[i], j] = True
    assert np.array_equal(graphs.adjacency, expected)
    O = cf.high_priority_mask(problem, graphs)
    for i in range(problem.n):
        R = _reachability(graphs.adjacency[problem.last[i]])
        y = problem.labels[i]
        for t, a in enumerate(problem.ids[i]):
            assert O[i, t] == (R[y, a] and R[a, y])
            if not O[i, t]:  # the label's SCC is a source among the sequence's tokens (§3)
                assert graphs.adjacency[problem.last[i], y, a]


# ---- the Graph-SVM -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("problem", _instances(), ids=lambda p: p.name)
def test_graph_svm_kkt(problem):
    sol = cf.graph_svm(problem)
    w = sol.W.ravel()
    if len(sol.strict) == 0:
        assert np.all(sol.W == 0)
        return
    assert np.abs(sol.A @ w).max(initial=0) < 1e-10                          # equalities
    slack = sol.G @ w - 1
    assert slack.min() > -1e-10 and sol.lam.min() >= 0                      # primal and dual feasibility
    assert np.abs(sol.lam * slack).max() < 1e-9                             # complementary slackness
    assert np.abs(w - sol.G.T @ sol.lam - sol.A.T @ sol.mu).max() < 1e-9    # stationarity


def test_graph_svm_matches_an_interior_point_solver():
    problem = NTPProblem.paper(seed=1)
    sol = cf.graph_svm(problem)
    A, G = sol.A, sol.G
    constraints = [optimize.LinearConstraint(G, 1.0, np.inf), optimize.LinearConstraint(A, 0.0, 0.0)]
    result = optimize.minimize(lambda x: 0.5 * x @ x, np.zeros(G.shape[1]), jac=lambda x: x,
                               hess=lambda x: np.eye(x.size), method="trust-constr", constraints=constraints,
                               options=dict(gtol=1e-12, xtol=1e-14, maxiter=5000))
    assert result.constr_violation < 1e-8
    assert np.abs(result.x - sol.W.ravel()).max() < 1e-5 * max(1.0, np.abs(sol.W).max())


def test_nuclear_graph_svm_certified_and_below_frobenius():
    problem = NTPProblem.paper(seed=2)
    fro, nuc = cf.graph_svm(problem), cf.graph_svm(problem, "nuc")
    assert nuc.gap <= 1e-8
    assert np.abs(nuc.A @ nuc.W.ravel()).max() < 1e-10 and nuc.margins.min() > 1 - 1e-10
    assert nuc.value <= np.linalg.svd(fro.W, compute_uv=False).sum() + 1e-9


def _burer_monteiro_nuclear_graph_svm(sol, d, starts=3, seed=0):
    """min ½(‖U‖² + ‖V‖²) s.t. <G_j, UVᵀ> ≥ 1, <A_j, UVᵀ> = 0 by SLSQP from random starts: at a minimiser ‖UVᵀ‖_*
    equals the objective, an independent route to the nuclear Graph-SVM (U, V full d × d). The equality rows are
    replaced by an orthonormal basis of their span (SLSQP needs independent equalities)."""
    rng = np.random.default_rng(seed)
    _, sv, Vt = np.linalg.svd(sol.A) if len(sol.A) else (None, np.zeros(0), np.zeros((0, d * d)))
    A = Vt[:int(np.sum(sv > 1e-10 * sv.max(initial=0.0)))]

    def product(x):
        return (x[:d * d].reshape(d, d) @ x[d * d:].reshape(d, d).T).ravel()

    def jacobian(x, rows):  # d<R, UVᵀ>/dU = R V, d/dV = Rᵀ U
        U, V, R = x[:d * d].reshape(d, d), x[d * d:].reshape(d, d), rows.reshape(-1, d, d)
        return np.hstack([(R @ V).reshape(len(rows), -1), (np.transpose(R, (0, 2, 1)) @ U).reshape(len(rows), -1)])

    constraints = [dict(type="ineq", fun=lambda x: sol.G @ product(x) - 1, jac=lambda x: jacobian(x, sol.G))]
    if len(A):
        constraints.append(dict(type="eq", fun=lambda x: A @ product(x), jac=lambda x: jacobian(x, A)))
    best = None
    for _ in range(starts):
        result = optimize.minimize(lambda x: 0.5 * x @ x, 2 * rng.normal(size=2 * d * d), jac=lambda x: x,
                                   method="SLSQP", constraints=constraints, options=dict(maxiter=5000, ftol=1e-15))
        W = product(result.x)
        feasible = (sol.G @ W).min() > 1 - 1e-9 and (not len(A) or np.abs(A @ W).max() < 1e-9)
        if feasible and (best is None or result.fun < best.fun):
            best = result
    return product(best.x).reshape(d, d)


def test_nuclear_graph_svm_decisions_are_read_only_from_a_certified_solution():
    """Stopped early the nuclear Graph-SVM says it is not certified and certified_graph_svm refuses it with the gap
    reached; the certified solution's value and active strict edges are those of an independent Burer–Monteiro solve,
    and its multipliers vanish off the active edges (complementary slackness)."""
    problem = NTPProblem.paper(seed=2)
    early = cf.graph_svm(problem, "nuc", max_iterations=25)
    assert not early.certified and early.gap > cf.NUC_GAP and early.iterations == 25
    with pytest.raises(cf.UncertifiedSolution, match="duality gap") as refused:
        cf.certified_graph_svm(problem, "nuc", max_iterations=25)
    assert refused.value.gap == early.gap
    sol = cf.certified_graph_svm(problem, "nuc")
    assert sol.certified and sol.gap <= cf.NUC_GAP and cf.graph_svm(problem).certified
    independent = _burer_monteiro_nuclear_graph_svm(sol, problem.d)
    assert np.linalg.svd(independent, compute_uv=False).sum() == pytest.approx(sol.value, rel=1e-6)
    active = np.abs(sol.margins - 1) <= 1e-4
    assert (np.abs(sol.G @ independent.ravel() - 1) <= 1e-4).tolist() == active.tolist()
    assert np.all(sol.lam[~active] <= 1e-6 * sol.lam.max())
    # its rank is read at the accuracy the gap certifies, and agrees with the independent solution's
    values = np.linalg.svd(sol.W, compute_uv=False)
    decision = rank_decision(values, 1e-5, max(ROUND_OFF, sol.accuracy))
    assert decision.certified and sol.accuracy >= sol.gap
    # (SLSQP solves to about 1e-7: its zeros are read at 1e-6)
    assert decision.rank == rank_decision(np.linalg.svd(independent, compute_uv=False), 1e-5, 1e-6).rank
    with pytest.raises(ValueError, match="max_iterations"):
        cf.graph_svm(problem, "nuc", max_iterations=0)


def test_sfin_is_orthonormal_and_spans_every_scc_pair():
    problem = NTPProblem.mixed(seed=3)
    graphs = cf.priority_graphs(problem)
    B = cf.sfin_basis(problem, graphs)
    assert np.abs(B.T @ B - np.eye(B.shape[1])).max() < 1e-12
    pairs = [np.kron(problem.E[a] - problem.E[b], problem.E[k]) for k in np.unique(problem.last)
             for a in range(problem.K) for b in range(problem.K)
             if a != b and graphs.components[k, a] == graphs.components[k, b]]
    pairs = np.array(pairs)
    assert np.abs(pairs - pairs @ B @ B.T).max() < 1e-12
    assert np.linalg.matrix_rank(pairs) == B.shape[1]


# ---- the golden file of the official code -------------------------------------------------------------------


def test_official_code_gives_the_same_sccs_and_svm_direction():
    """SCCs and Graph-SVM of the official code (cvxpy/CLARABEL), generated once as described in the file's note."""
    golden = json.loads(GOLDEN.read_text())
    assert len(golden["cases"]) == 8
    for case in golden["cases"]:
        problem = NTPProblem(np.array(case["ids"]), np.array(case["labels"]), np.array(case["E"]))
        graphs = cf.priority_graphs(problem)
        for k, official in enumerate(case["scc_official"]):
            if official:
                a = np.array(official)
                assert np.array_equal(a[:, None] == a[None, :], graphs.components[k][:, None] == graphs.components[k])
        W_official = np.array(case["W_svm_official"])
        W = cf.graph_svm(problem, graphs=graphs).W
        assert 1 - cf.corr(W, W_official) < 1e-9, case["name"]
        assert np.abs(W - W_official).max() < 1e-4, case["name"]        # the interior-point solver's tolerance


# ---- loss, gradient, W^fin ------------------------------------------------------------------------------------


def _loss_direct(problem, W, mask=None):
    l = cf.logits(problem, W)
    if mask is not None:
        l = np.where(mask, l, -np.inf)
    log_s = l - np.logaddexp.reduce(l, axis=1, keepdims=True)
    lab = np.where(problem.label_mask > 0, log_s, -np.inf)
    return -np.mean(np.logaddexp.reduce(lab, axis=1))


@pytest.mark.parametrize("reduced", [False, True])
def test_gradient_matches_finite_differences(reduced):
    problem = NTPProblem.mixed(seed=4)
    mask = cf.high_priority_mask(problem) if reduced else None
    W = np.random.default_rng(0).normal(size=(problem.d, problem.d))
    out = cf.loss_and_gradient(problem, W, mask=mask)
    assert abs(out["loss"] - _loss_direct(problem, W, mask)) < 1e-12
    numeric = np.zeros(W.size)
    for q in range(W.size):
        e = np.zeros(W.size)
        e[q] = 1e-6
        numeric[q] = (_loss_direct(problem, W + e.reshape(W.shape), mask)
                      - _loss_direct(problem, W - e.reshape(W.shape), mask)) / 2e-6
    assert np.abs(numeric - out["gradient"].ravel()).max() < 1e-7


def test_loss_is_cancellation_free_far_out():
    """At W = 40 W^svm the loss is ~e^{-40}: compare with 50-digit arithmetic on the raw definition."""
    problem = NTPProblem.paper(seed=6, require="acyclic")
    W = 40 * cf.graph_svm(problem).W
    out = cf.loss_and_gradient(problem, W)
    l = cf.logits(problem, W)
    mpmath.mp.dps = 50
    total = mpmath.mpf(0)
    for i in range(problem.n):
        num = mpmath.fsum(mpmath.exp(mpmath.mpf(x)) for x, m in zip(l[i], problem.label_mask[i]) if m)
        den = mpmath.fsum(mpmath.exp(mpmath.mpf(x)) for x in l[i])
        total -= mpmath.log(num / den)
    exact = float(total / problem.n)
    assert 0 < exact < 1e-12
    assert abs(out["loss"] - exact) < 1e-10 * exact
    assert abs(out["log_loss"] - np.log(exact)) < 1e-9


def test_log_gradient_norm_is_the_log_of_the_gradient_norm():
    """Where ∇L is representable (with and without the O_i mask), log_gradient_norm is log||∇L||_F of the gradient
    checked against finite differences above."""
    problem = NTPProblem.mixed(seed=4)
    W = np.random.default_rng(0).normal(size=(problem.d, problem.d))
    for mask in (None, cf.high_priority_mask(problem)):
        direct = np.log(np.linalg.norm(cf.loss_and_gradient(problem, W, mask=mask)["gradient"]))
        assert cf.log_gradient_norm(problem, W, mask=mask) == pytest.approx(direct, rel=1e-13)


def _mpmath_log_gradient_norm(problem, W, digits=60):
    """log||∇L||_F from the raw definitions in ``digits``-digit arithmetic: dL/dl_it = (s_it − 1{x_it = y_i} s_it/u_i)/n
    with u_i the label mass; on label positions s_it(1 − 1/u_i) = −s_it(1 − u_i)/u_i, 1 − u_i summed over the other
    positions, so nothing cancels; ∇L = E^T G_Z E."""
    mpmath.mp.dps = digits
    l = cf.logits(problem, W)
    G = mpmath.zeros(problem.K, problem.K)
    for i in range(problem.n):
        e = [mpmath.exp(mpmath.mpf(float(x))) for x in l[i]]
        Z = mpmath.fsum(e)
        s = [x / Z for x in e]
        label = problem.label_mask[i] > 0
        miss = mpmath.fsum(s[t] for t in range(problem.T) if not label[t])
        u = mpmath.fsum(s[t] for t in range(problem.T) if label[t])
        for t in range(problem.T):
            g = -s[t] * miss / u if label[t] else s[t]
            G[int(problem.ids[i, t]), int(problem.last[i])] += g / problem.n
    E = mpmath.matrix(problem.E.tolist())
    grad = E.T * G * E
    return float(mpmath.log(mpmath.sqrt(mpmath.fsum(x * x for x in grad))))


@pytest.mark.parametrize("radius", [5.0, 400.0, 2000.0])
def test_log_gradient_norm_matches_high_precision_where_the_gradient_underflows(radius):
    """Along W = R·W^svm of an acyclic instance ||∇L|| ~ e^{−R}: representable at R = 5, exactly 0 in floating point
    at R = 2000, and log_gradient_norm equals the high-precision value at each."""
    problem = NTPProblem.paper(seed=6, require="acyclic")
    W = radius * cf.graph_svm(problem).W
    if radius == 2000.0:
        assert not np.any(cf.loss_and_gradient(problem, W)["gradient"])
    assert cf.log_gradient_norm(problem, W) == pytest.approx(_mpmath_log_gradient_norm(problem, W), rel=1e-11)


@pytest.mark.parametrize("problem", [NTPProblem.mixed(seed=s) for s in range(3)], ids=lambda p: p.name)
def test_w_fin_is_the_stationary_point_on_sfin(problem):
    graphs = cf.priority_graphs(problem)
    B = cf.sfin_basis(problem, graphs)
    W_fin = cf.w_fin(problem, graphs=graphs)
    assert np.abs(W_fin.ravel() - B @ (B.T @ W_fin.ravel())).max() < 1e-12     # in S_fin
    _, grad = cf.reduced_loss_and_gradient(problem, W_fin)
    assert np.abs(B.T @ grad.ravel()).max() < 1e-9                              # stationary on S_fin
    # strictly convex: any move within S_fin raises the reduced loss
    base = cf.reduced_loss_and_gradient(problem, W_fin)[0]
    for v in np.random.default_rng(1).normal(size=(5, B.shape[1])):
        moved = W_fin + 1e-2 * (B @ v).reshape(W_fin.shape)
        assert cf.reduced_loss_and_gradient(problem, moved)[0] > base


def test_w_fin_closed_forms():
    # (a) same token set in every sequence of each group: the limit attention is the label frequency
    toy = NTPProblem.cyclic_toy(seed=3)
    s = cf.predicted_attention(toy)
    assert np.allclose(s[0], [1 / 6, 1 / 3, 1 / 2], atol=1e-9) and np.allclose(s[6], [1 / 6, 1 / 3, 1 / 2], atol=1e-9)  # positions of [2, 1, 0]
    # (b) a symmetric 2-cycle: two sequences [a, b, k] with labels a and b give W^fin = 0
    E = np.linalg.qr(np.random.default_rng(0).normal(size=(5, 5)))[0][:3]
    pair = NTPProblem(np.array([[0, 1, 2], [1, 0, 2]]), np.array([0, 1]), E)
    assert cf.sfin_basis(pair).shape[1] == 1
    assert np.abs(cf.w_fin(pair)).max() < 1e-10


def test_fitted_radius_leaves_a_residual_orthogonal_to_w_svm():
    problem = NTPProblem.mixed(seed=2)
    W_svm, W_fin = cf.graph_svm(problem).W, cf.w_fin(problem)
    W = np.random.default_rng(3).normal(size=W_svm.shape)
    R = cf.fit_radius(W, W_fin, W_svm)
    assert abs(np.sum((W - W_fin - R * W_svm) * W_svm)) < 1e-12 * np.sum(W ** 2)


# ---- dynamics ------------------------------------------------------------------------------------------------


def test_gd_kernel_equals_numpy_steps():
    problem = NTPProblem.paper(seed=0)
    W = dyn.initial_W(problem, seed=3)
    run = dyn.train(problem, W, eta=0.7, record=np.arange(6))
    ngd = dyn.train(problem, W, eta=0.05, normalise=True, record=np.arange(6))
    V, U = W.copy(), W.copy()
    for k in range(6):
        assert np.abs(run.states["W"][k] - V).max() < 1e-12
        assert np.abs(ngd.states["W"][k] - U).max() < 1e-12
        V = V - 0.7 * cf.loss_and_gradient(problem, V)["gradient"]
        g = cf.loss_and_gradient(problem, U)["gradient"]
        U = U - 0.05 * g / np.linalg.norm(g)


def test_general_head_step_follows_its_loss_gradient():
    problem = NTPProblem.paper(seed=2)
    W = dyn.initial_W(problem, seed=4)
    run = dyn.train_general_head(problem, W, eta=1e-3, record=np.array([0, 1]))
    Gram = problem.E @ problem.E.T

    def loss(W):
        s = cf.attention(problem, W)
        total = 0.0
        for i in range(problem.n):
            h = sum(s[i, t] * Gram[:, problem.ids[i, t]] for t in range(problem.T))
            p = np.exp(h - np.logaddexp.reduce(h))
            total += (1 - p[problem.labels[i]]) ** 2
        return total / problem.n
    assert abs(run.metrics["loss"][0] - loss(W)) < 1e-13
    numeric = np.zeros(W.size)
    for q in range(W.size):
        e = np.zeros(W.size)
        e[q] = 1e-6
        numeric[q] = (loss(W + e.reshape(W.shape)) - loss(W - e.reshape(W.shape))) / 2e-6
    step = (W - run.states["W"][1]).ravel() / 1e-3
    assert np.abs(step - numeric / np.linalg.norm(numeric)).max() < 1e-6


def test_population_and_minibatch_follow_the_contract():
    problem = NTPProblem.paper(seed=0)
    a = dyn.minibatch(problem, seed=5, steps=50)
    b = dyn.minibatch(problem, seed=5, steps=50)
    c = dyn.minibatch(problem, seed=6, steps=50)
    assert np.array_equal(a.states["W"], b.states["W"]) and not np.array_equal(a.states["W"], c.states["W"])
    with pytest.raises(TypeError):
        dyn.minibatch(problem, steps=5)
    with pytest.raises(ValueError, match="seed"):
        dyn.minibatch(problem, seed=None, steps=5)
    pop = dyn.population(problem, steps=100)
    assert {"one_minus_corr", "fin_error", "mass_off", "tv", "loss_gap", "norm"} <= set(pop.metrics)
    assert np.all(np.diff(pop.metrics["loss"]) <= 1e-15)                     # GD with η = 1 decreases the loss


def test_generator_is_reproducible_and_meets_its_requirements():
    assert np.array_equal(NTPProblem.paper(seed=9).ids, NTPProblem.paper(seed=9).ids)
    assert cf.priority_graphs(NTPProblem.paper(seed=9)).cyclic
    assert not cf.priority_graphs(NTPProblem.paper(seed=9, require="acyclic")).cyclic
    mixed = NTPProblem.mixed(seed=1)
    assert np.all(mixed.last == 0)
    assert all(len(set(row)) == mixed.T for row in mixed.ids.tolist())
    assert np.allclose(np.linalg.norm(mixed.E, axis=1), 1)


# ---- bad inputs ----------------------------------------------------------------------------------------------


def test_bad_inputs_name_the_parameter():
    E = np.eye(4)
    ids = np.array([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match="labels"):
        NTPProblem(ids, np.array([3, 1]), E)                     # label 3 not in sequence 0
    with pytest.raises(ValueError, match="ids"):
        NTPProblem(np.array([[0, 1, 7]]), np.array([0]), E)
    with pytest.raises(ValueError, match="ids"):
        NTPProblem(np.array([0, 1, 2]), np.array([0]), E)
    with pytest.raises(ValueError, match="labels"):
        NTPProblem(ids, np.array([0]), E)
    with pytest.raises(ValueError, match="E"):
        NTPProblem(ids, np.array([0, 1]), np.ones((4, 4)))
    with pytest.raises(ValueError, match="E"):
        NTPProblem(ids, np.array([0, 1]), np.full((4, 4), np.nan))
    with pytest.raises(ValueError, match="T"):
        NTPProblem.random(3, 5, 4, 6, seed=0)
    with pytest.raises(ValueError, match="K"):
        NTPProblem.random(3, 3, 8, 6, seed=0)
    with pytest.raises(ValueError, match="require"):
        NTPProblem.random(3, 3, 4, 6, seed=0, require="sometimes")
    with pytest.raises(ValueError, match="norm"):
        cf.graph_svm(NTPProblem.paper(seed=0), norm="spectral")
    with pytest.raises(ValueError, match="W0"):
        dyn.train(NTPProblem.paper(seed=0), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="eta"):
        dyn.train(NTPProblem.paper(seed=0), np.zeros((8, 8)), eta=-1)
    with pytest.raises(ValueError, match="algorithm"):
        dyn.minibatch(NTPProblem.paper(seed=0), seed=0, algorithm="adam")
    with pytest.raises(ValueError):
        NTPProblem.from_params({"instance": "paper", "bogus": 1})


def test_from_params_builds_each_instance():
    assert NTPProblem.from_params({"instance": "cyclic_toy"}).name == "cyclic_toy"
    assert NTPProblem.from_params({"instance": "mixed", "instance_seed": "2"}).n == 10
    p = NTPProblem.from_params({"instance": "random", "n": "5", "T": "3", "K": "4", "d": "6", "require": "any"})
    assert (p.n, p.T, p.K, p.d) == (5, 3, 4, 6)


# ---- claims --------------------------------------------------------------------------------------------------

NAMES = sorted(n for n in registered_claims() if n.startswith("next_token_scc."))


def test_system_is_registered_with_enough_claims():
    system = get_system("next_token_scc")
    assert system.problem is NTPProblem
    assert len(NAMES) >= 14


@pytest.mark.parametrize("name", NAMES)
def test_every_claim_holds_as_registered_at_quick_settings(name):
    result = run_claim(registered_claims()[name], seed=0)
    assert result.as_registered, (result.status, result.measured, result.notes)
    expected = "FINDING" if registered_claims()[name].finding else "PASS"
    assert result.status == expected
    assert_figure_is_clean(result)


def test_same_seed_same_numbers():
    c = registered_claims()["next_token_scc.local_convergence"]
    assert run_claim(c, seed=3).measured == run_claim(c, seed=3).measured


@pytest.fixture
def fresh_ensembles():
    claims._ensemble_cached.cache_clear()
    yield
    claims._ensemble_cached.cache_clear()


def test_finite_part_claim_fails_when_w_fin_is_wrong(monkeypatch, fresh_ensembles):
    monkeypatch.setattr(cf, "w_fin", lambda problem, graphs=None, **_: np.zeros((problem.d, problem.d)))
    result = run_claim(registered_claims()["next_token_scc.gd_finite_part"], seed=0, instances=4, steps=4000)
    assert result.status == "FAIL"


def test_direction_claim_fails_when_the_svm_is_wrong(monkeypatch, fresh_ensembles):
    original = cf.graph_svm

    def rotated(problem, norm="fro", **kwargs):
        sol = original(problem, norm, **kwargs)
        noise = np.random.default_rng(0).normal(size=sol.W.shape)
        return type(sol)(**{**sol.__dict__, "W": sol.W + 0.5 * np.linalg.norm(sol.W) * noise / np.linalg.norm(noise)})
    monkeypatch.setattr(cf, "graph_svm", rotated)
    # ten instances: with fewer the sign test of the median level cannot reject at 1e-3 (2⁻ⁿ > 1e-3)
    result = run_claim(registered_claims()["next_token_scc.gd_direction"], seed=0, instances=10, steps=4000)
    assert result.status == "FAIL"
    assert result.measured["above_level_paper"] == "10/10"


@pytest.mark.parametrize("above, status", [(10, "FAIL"), (9, "PASS")])
def test_direction_claim_tests_the_population_median_by_the_sign_test(monkeypatch, fresh_ensembles, above, status):
    """Every instance decreasing like 1/log²τ, ``above`` of the 10 `paper` instances ending above the level 0.03:
    10 of 10 rejects "population median ≤ 0.03" at 1e-3 (P = 2⁻¹⁰), 9 of 10 does not."""
    original, calls = dyn.metrics, []

    def level(run, ref):
        out = original(run, ref)
        calls.append(1)
        scale = 3.0 if len(calls) <= above else 1.0  # at τ = 4000: 0.044 or 0.015
        out["one_minus_corr"] = scale / np.log(np.maximum(run.times, 2.0)) ** 2
        return out
    monkeypatch.setattr(dyn, "metrics", level)
    result = run_claim(registered_claims()["next_token_scc.gd_direction"], seed=0, instances=10, steps=4000)
    assert result.measured["above_level_paper"] == f"{above}/10"
    assert result.status == status


@pytest.mark.parametrize("exponent", [-0.5, 0.1])
def test_attention_limit_claim_fails_at_the_wrong_rate_or_when_the_mass_grows(monkeypatch, fresh_ensembles, exponent):
    """Mass outside O_i falling like τ^{-1/2} on every instance (median slope outside −1 ± 0.3), or growing: FAIL."""
    original = dyn.metrics

    def wrong_rate(run, ref):
        out = original(run, ref)
        out["mass_off"] = 1e-3 * np.maximum(run.times, 1.0) ** exponent
        return out
    monkeypatch.setattr(dyn, "metrics", wrong_rate)
    result = run_claim(registered_claims()["next_token_scc.gd_attention_limit"], seed=0, instances=4, steps=4000)
    assert result.status == "FAIL"
    assert result.measured["median_slope_paper"] == pytest.approx(exponent)


def test_attention_limit_claim_fails_when_one_instance_stops_falling(monkeypatch, fresh_ensembles):
    """Every instance must fall: one growing instance fails the claim though the median rate is −1."""
    original, calls = dyn.metrics, []

    def one_grows(run, ref):
        out = original(run, ref)
        calls.append(1)
        out["mass_off"] = 1e-3 * np.maximum(run.times, 1.0) ** (0.05 if len(calls) == 1 else -1.0)
        return out
    monkeypatch.setattr(dyn, "metrics", one_grows)
    result = run_claim(registered_claims()["next_token_scc.gd_attention_limit"], seed=0, instances=4, steps=4000)
    assert result.status == "FAIL"
    assert result.measured["median_slope_paper"] == pytest.approx(-1.0)
    assert result.measured["worst_slope_paper"] == pytest.approx(0.05)


def test_cyclic_claim_fails_when_the_limit_attention_is_wrong(monkeypatch):
    monkeypatch.setattr(cf, "predicted_attention", lambda problem, *a, **k: np.full((problem.n, problem.T), 1 / 3))
    assert run_claim(registered_claims()["next_token_scc.cyclic_finite_limit"], seed=0).status == "FAIL"


def test_the_ngd_finding_stops_reproducing_if_ngd_settles(monkeypatch, fresh_ensembles):
    """If NGD's finite part did converge (here: a run that returns W^fin's projection exactly), the finding would
    no longer reproduce and the claim reports FAIL."""
    original = dyn.metrics

    def settled(run, ref):
        out = original(run, ref)
        out["fin_error"] = out["fin_error"] * 0 + 1e-6
        return out
    monkeypatch.setattr(dyn, "metrics", settled)
    result = run_claim(registered_claims()["next_token_scc.ngd_finite_part"], seed=0, instances=3, steps=800)
    assert result.status == "FAIL"
