"""Random walk on a circle: closed forms against exact enumeration and brute-force Monte Carlo of the raw model."""
import math
from fractions import Fraction

import numpy as np
import pytest

from attnflow.closed_forms import random_walk as cf
from attnflow.closed_forms.random_walk import RandomWalkProblem
from attnflow.dynamics import random_walk as dyn
from attnflow.dynamics.integrate import DivergenceError
from tests.conftest import assert_within_standard_errors


@pytest.mark.parametrize("kwargs, message", [
    (dict(K=2, N=5, p=0.5), "K must be >= 3"), (dict(K=5, N=1, p=0.5), "N must be >= 2"),
    (dict(K=5, N=5, p=1.5), "p must be <= 1"), (dict(K=5, N=5, p=-0.1), "p must be >= 0"),
    (dict(K=5, N=5, p=float("nan")), "p must be finite"), (dict(K=5, N=5, p=0.5, eps=0.0), "eps must be > 0"),
    (dict(K=5, N=5, p=0.5, eta=-1.0), "eta must be > 0"), (dict(K=5, N=50, p=0.5, M=40), "M must be >= 51"),
])
def test_problem_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandomWalkProblem(**kwargs)


def test_enumeration_refuses_too_many_paths_but_not_deterministic_walks():
    with pytest.raises(ValueError, match="N must be <= 21"):
        cf.enumerate_paths(RandomWalkProblem(K=5, N=40, p=0.5))
    paths = cf.enumerate_paths(RandomWalkProblem(K=20, N=101, p=1.0))
    assert paths.weights.tolist() == [1.0]
    assert paths.displacements[0].tolist() == [(101 - k) % 20 for k in range(1, 101)]


def test_enumerated_paths_match_sampled_path_frequencies():
    problem = RandomWalkProblem(K=5, N=9, p=0.7)
    exact = cf.enumerate_paths(problem)
    assert exact.weights.sum() == pytest.approx(1.0, abs=1e-14)
    sampled = dyn.sample_paths(problem, 200_000, np.random.default_rng(0))
    for k in (0, 4, 7):  # displacement laws at three positions
        for c in range(5):
            p_exact = exact.weights[exact.displacements[:, k] == c].sum()
            hits = (sampled.displacements[:, k] == c).astype(float)
            if p_exact == 0:  # wrong parity: unreachable
                assert hits.sum() == 0
                continue
            assert_within_standard_errors(hits.mean(), hits.std(ddof=1) / math.sqrt(hits.size), p_exact)


def test_positional_embeddings_are_orthogonal_with_norm_M_over_2():
    P = cf.positional_embeddings(13, 40)
    np.testing.assert_allclose(P.T @ P, 20 * np.eye(13), atol=1e-12)


def _raw_model(problem, v, z, n, rng):
    """Per-sequence loss and correctness from raw sequences, token matrices and a W realising logits z."""
    K, N = problem.K, problem.N
    P = cf.positional_embeddings(N, problem.M)
    W = np.zeros((K + problem.M, K + problem.M))
    W[K:, K:] = np.outer(P @ z / problem.P_norm, P[:, N - 1]) / problem.P_norm  # W x̃_N = [0; Σ z_j p_j / P_norm]
    V = cf.circulant(v)
    s = np.empty((n, N), int)
    s[:, 0] = rng.integers(K, size=n)
    for i in range(1, N):
        s[:, i] = (s[:, i - 1] + np.where(rng.random(n) < problem.p, 1, -1)) % K
    X = np.zeros((n, K, N))
    X[np.arange(n)[:, None], s[:, :-1], np.arange(N - 1)[None, :]] = 1.0
    tokens = np.concatenate([X, np.broadcast_to(P, (n, problem.M, N))], axis=1)
    query = np.concatenate([np.zeros(K), P[:, N - 1]])
    logits = np.einsum("nit,i->nt", tokens, W @ query)
    S = np.exp(logits - logits.max(axis=1, keepdims=True))
    S /= S.sum(axis=1, keepdims=True)
    f = np.einsum("ij,njt,nt->ni", V, X, S)
    y = s[:, -1]
    loss = -np.log(f[np.arange(n), y] + problem.eps)
    predicted = np.argmax(f, axis=1)  # the first maximiser: ties go to the smallest label
    return loss, (predicted == y).astype(float)


@pytest.mark.parametrize("p", [0.3, 0.5, 1.0])
def test_reduced_loss_and_accuracy_match_monte_carlo_of_the_raw_model(p):
    problem = RandomWalkProblem(K=5, N=9, p=p, M=20)
    rng = np.random.default_rng(1)
    v = rng.uniform(0.1, 1.0, 5) if p != 1.0 else np.full(5, 0.4)  # constant v: every f_j ties
    z = rng.normal(0, 1.5, 9)
    loss, correct = _raw_model(problem, v, z, 40_000, np.random.default_rng(2))
    paths = cf.enumerate_paths(problem)
    round_off = 1e-12  # at p = 1 with constant v both are deterministic and the SE is 0
    assert_within_standard_errors(loss.mean(), loss.std(ddof=1) / math.sqrt(loss.size) + round_off,
                                  cf.reduced_loss(problem, paths, v, z))
    assert_within_standard_errors(correct.mean(), correct.std(ddof=1) / math.sqrt(correct.size) + round_off,
                                  cf.accuracy(problem, paths, v, z))


def test_step_one_closed_form_matches_monte_carlo_and_enumeration():
    problem = RandomWalkProblem(K=5, N=8, p=0.7, M=20)
    closed = cf.step_one_v(problem)
    reduced = cf.reduced_step(0, np.zeros(13), cf.pack_reduced_params(problem, cf.enumerate_paths(problem)))
    np.testing.assert_allclose(reduced[:5], closed, rtol=1e-13)
    # brute force: V⁽¹⁾ = −η∇_V L at zero = η/(εN) E[e_y Σ_k e_{s_k}ᵀ]; its circulant entry c is row y, column y − c
    seqs = dyn.sample_sequences(problem, 100_000, np.random.default_rng(3))
    y = seqs.states[:, -1]
    counts = np.zeros((y.size, 5))
    for k in range(problem.N - 1):
        np.add.at(counts, (np.arange(y.size), (y - seqs.states[:, k]) % 5), 1.0)
    # averaging the K circulant rows: v[c] = η/(εNK) E[#{k : (y − s_k) mod K = c}]
    samples = problem.eta / (problem.eps * problem.N * problem.K) * counts
    for c in range(5):
        assert_within_standard_errors(samples[:, c].mean(), samples[:, c].std(ddof=1) / math.sqrt(y.size), closed[c])


def test_one_hot_map_is_the_reduced_map_under_one_hot_attention_and_grows_like_sqrt_t():
    problem = RandomWalkProblem(K=5, N=9, p=0.7, M=20)
    z = np.zeros(9)
    z[7] = 1e3  # S = e_{N−1} to round-off, and its logit update cannot move it
    run = dyn.reduced_trajectory(problem, cf.enumerate_paths(problem), 30, x0=np.concatenate([np.zeros(5), z]))
    closed = cf.one_hot_map(problem, 0.0, 0.0, 30)
    np.testing.assert_allclose(run.states["v"][:, 1], closed[:, 0], rtol=1e-12)
    np.testing.assert_allclose(run.states["v"][:, 4], closed[:, 1], rtol=1e-12)
    assert np.all(run.states["v"][:, [0, 2, 3]] == 0)
    late = cf.one_hot_map(problem, 0.0, 0.0, 200_000)[-1]
    assert (late[0] + problem.eps) ** 2 / (2 * problem.eta * 0.7 * 200_000 / 5) == pytest.approx(1.0, rel=2e-3)


def test_deterministic_closure_matches_reduced_map_at_the_papers_size():
    problem = RandomWalkProblem(K=20, N=101, p=1.0)
    run = dyn.reduced_trajectory(problem, cf.enumerate_paths(problem), 50)
    closure = cf.deterministic_closure(problem, 50)
    np.testing.assert_allclose(run.states["v"], np.repeat(closure[:, :1], 20, axis=1), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(run.states["z"][:, 0], closure[:, 1], rtol=1e-12, atol=1e-9)
    assert np.all(run.metrics["accuracy"] == 1 / 20)
    with pytest.raises(ValueError, match="N = rK \\+ 1"):
        cf.deterministic_closure(RandomWalkProblem(K=20, N=100, p=1.0), 5)


def test_direction_plateau_is_the_distance_between_the_two_targets():
    assert cf.direction_plateau(0.5) == pytest.approx(0.0, abs=1e-15)
    a = np.array([0.7, 0.3]) / math.hypot(0.7, 0.3)
    b = np.array([math.sqrt(0.7), math.sqrt(0.3)])
    assert cf.direction_plateau(0.7) == pytest.approx(np.linalg.norm(a - b), rel=1e-14)
    with pytest.raises(ValueError, match="zero vector"):
        cf.direction_error(np.zeros(4), np.ones(4))


def test_divergence_names_the_step():
    problem = RandomWalkProblem(K=5, N=9, p=0.7, M=20)
    x0 = np.concatenate([np.full(5, -1.0), np.zeros(9)])  # f_y + ε < 0: the log loss is undefined
    with pytest.raises(DivergenceError, match="step 1"):
        dyn.reduced_trajectory(problem, cf.enumerate_paths(problem), 5, x0=x0)


def test_sampling_is_reproducible():
    problem = RandomWalkProblem(K=5, N=9, p=0.7)
    a = dyn.sample_paths(problem, 100, np.random.default_rng(7))
    b = dyn.sample_paths(problem, 100, np.random.default_rng(7))
    assert np.array_equal(a.displacements, b.displacements)


def test_quick_claims_pass_except_claim3_which_fails_away_from_p_half():
    from attnflow import run_claim, select
    from tests.test_claim_reporting import assert_reports_by_contract
    results = {c.name: run_claim(c, seed=0) for c in select(["random_walk"])}
    assert {n: r.status for n, r in results.items() if r.status != "PASS"} == {"random_walk.value_direction": "FINDING"}
    for result in results.values():
        assert_reports_by_contract(result)
    rows = {row["p"]: row for row in results["random_walk.value_direction"].details}
    assert rows[0.5]["passed"] and not rows[0.7]["passed"]
    # the plateau is the derived √-law distance, not a slow decay: the last error sits just above it
    assert rows[0.7]["plateau"] < rows[0.7]["claim3_errors"][-1] < rows[0.7]["plateau"] + 0.02


def test_claim3_holds_when_only_p_half_is_checked():
    """At p = ½ the statement holds, so the registered finding does not reproduce: the claim says so as a FAIL."""
    from attnflow import run_claim, select
    result = run_claim(select(["random_walk.value_direction"])[0], seed=0, ps=(0.5,))
    assert result.status == "FAIL" and "did not reproduce" in result.notes


def test_full_gd_refuses_sequences_of_another_problem():
    problem = RandomWalkProblem(K=5, N=11, p=0.7, M=40)
    other = dyn.population_sequences(RandomWalkProblem(K=5, N=9, p=0.7, M=40))
    with pytest.raises(ValueError, match="sequences must hold N = 11 node indices"):
        dyn.full_gd_trajectory(problem, other, 2, seed=0)


def test_one_hot_map_step_matches_monte_carlo_of_the_raw_gradient():
    """One step of the one-hot closed form against the raw-model V-gradient, averaged along the circulant
    diagonals (v[c] ← v[c] − (η/K)·E[Σ_{y − s ≡ c} ∂l/∂V_{y,s}]), from sampled sequences and token matrices."""
    problem = RandomWalkProblem(K=5, N=9, p=0.7, M=20, eta=0.5)
    K, N = problem.K, problem.N
    v = np.array([0.1, 0.3, 0.1, 0.1, 0.2])
    P = cf.positional_embeddings(N, problem.M)
    z = np.zeros(N)
    z[N - 2] = 60.0  # attention one-hot on the parent token to round-off
    W = np.zeros((K + problem.M, K + problem.M))
    W[K:, K:] = np.outer(P @ z / problem.P_norm, P[:, N - 1]) / problem.P_norm
    seqs = dyn.sample_sequences(problem, 40_000, np.random.default_rng(8))
    n = seqs.states.shape[0]
    X = np.zeros((n, K, N))
    X[np.arange(n)[:, None], seqs.states[:, :-1], np.arange(N - 1)[None, :]] = 1.0
    tokens = np.concatenate([X, np.broadcast_to(P, (n, problem.M, N))], axis=1)
    logits = np.einsum("nit,i->nt", tokens, W @ np.concatenate([np.zeros(K), P[:, N - 1]]))
    S = np.exp(logits - logits.max(axis=1, keepdims=True))
    S /= S.sum(axis=1, keepdims=True)
    XS = np.einsum("njt,nt->nj", X, S)
    y = seqs.states[:, -1]
    f_y = np.einsum("nj,nj->n", cf.circulant(v)[y], XS)
    dl = -1.0 / (f_y + problem.eps)
    closed = cf.one_hot_map(problem, v[1], v[-1], 1)[1]
    for c, expected in ((1, closed[0]), (K - 1, closed[1]), (2, v[2])):
        per_sample = v[c] - problem.eta / K * dl * XS[np.arange(n), (y - c) % K]
        assert_within_standard_errors(per_sample.mean(), per_sample.std(ddof=1) / np.sqrt(n) + 1e-15, expected)


def _exact_accuracy_after_one_step(K: int, N: int, p: Fraction) -> Fraction:
    """Accuracy after one GD step from zero, in rational arithmetic (docs/random_walk.md §2, §4).

    From (v, z) = 0 the attention stays uniform and v[c] ∝ E #{k : d_k = c}; the score of relative label r on a path
    is ∝ Σ_k v[(r + d_k) mod K], and a label is predicted when it is the smallest absolute label at the top."""
    paths = []
    for code in range(2 ** (N - 1)):
        steps = [1 if (code >> i) & 1 else -1 for i in range(N - 1)]
        ups = steps.count(1)
        weight = p ** ups * (1 - p) ** (N - 1 - ups)
        if weight:
            paths.append(([sum(steps[k:]) % K for k in range(N - 1)], weight))  # d_k = (y − s_k) mod K
    v = [sum((w * d.count(c) for d, w in paths), Fraction(0)) for c in range(K)]
    total = Fraction(0)
    for d, w in paths:
        g = [sum(v[(r + dk) % K] for dk in d) for r in range(K)]
        top = max(g)
        if g[0] != top:
            continue
        wins = sum(all(not (g[r] == top and (y + r) % K < y) for r in range(1, K)) for y in range(K))
        total += w * Fraction(wins, K)
    return total


@pytest.mark.parametrize("K", [3, 4, 5, 6, 7])
@pytest.mark.parametrize("p", ["1/10", "3/10", "1/2", "7/10", "9/10"])
def test_accuracy_after_one_step_breaks_exact_ties_by_the_smallest_label(K, p):
    """After one step from zero the scores of symmetric labels are equal in exact arithmetic; computed in floating
    point they differ by round-off, which must not decide the prediction (25 (K, p) cases, N = 6)."""
    N, p = 6, Fraction(p)
    problem = RandomWalkProblem(K=K, N=N, p=float(p))
    paths = cf.enumerate_paths(problem)
    state = cf.reduced_step(0, np.zeros(K + N), cf.pack_reduced_params(problem, paths))
    measured = cf.accuracy(problem, paths, state[:K], state[K:])
    assert measured == pytest.approx(float(_exact_accuracy_after_one_step(K, N, p)), abs=1e-12)
