"""CCMC (Ildiz et al., ICML 2024): closed forms against the raw attention layer and brute-force Monte Carlo,
input validation, reproducibility, and the claims (they pass at quick settings and can fail)."""
import numpy as np
import pytest

import attnflow.closed_forms.ccmc as cf
import attnflow.dynamics.ccmc as dyn
from attnflow import run_claim, select
from attnflow.closed_forms.ccmc import CCMCProblem
from attnflow.dynamics.errors import DivergenceError
from attnflow.validation import ccmc as claims

from .conftest import assert_figure_is_clean, assert_within_standard_errors


def _attention(K=5, d=7, seed=0, scale=1.0):
    E = dyn.random_embeddings(K, d, seed=seed)
    W = scale * np.random.default_rng(seed + 1).standard_normal((d, d))
    return E, W, cf.chain_from_logits(dyn.attention_logits(E, W))


# ---- the law ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("query", cf.QUERY_VARIANTS)
def test_ccmc_law_is_the_raw_layer_output(query):
    E, W, P = _attention()
    prompts = np.random.default_rng(3).integers(0, 5, size=(200, 9))
    assert np.abs(dyn.attention_output(E, W, prompts, query) - cf.ccmc_law(P, prompts, query)).max() < 1e-12


def test_ccmc_law_by_hand():
    P = cf.GOLDEN_P
    law = cf.ccmc_law(P, [2, 0, 0, 1])[0]  # counts (2, 1, 1, 0), last token 1: weights 2·.1, .4, .3
    assert np.allclose(law, np.array([0.2, 0.4, 0.3, 0.0]) / 0.9)
    law = cf.ccmc_law(P, [2, 0, 0, 1], "exclude")[0]  # keys (2, 0, 0): weights 2·.1, 0, .3
    assert np.allclose(law, np.array([0.2, 0.0, 0.3, 0.0]) / 0.5)


def test_sampled_tokens_follow_the_law():
    E, W, P = _attention()
    prompt = np.array([0, 2, 2, 4, 1, 2])
    draws = 100_000
    tokens = dyn.sample_raw_outputs(E, W, prompt, draws, seed=5)[0]
    law = cf.ccmc_law(P, prompt)[0]
    frequencies = np.bincount(tokens, minlength=5) / draws
    keep = law > 0
    assert frequencies[~keep].sum() == 0
    assert_within_standard_errors(frequencies[keep], np.sqrt(law[keep] * (1 - law[keep]) / draws), law[keep])


def test_positional_law_is_the_raw_layer_output():
    K, d, d_p = 4, 6, 8
    E = dyn.random_embeddings(K, d, seed=2)
    rng = np.random.default_rng(4)
    W = 0.7 * rng.standard_normal((d + d_p, d + d_p))
    positions = rng.standard_normal((15, d_p))
    for L in (1, 5, 15):
        prompt = rng.integers(0, K, size=L)
        a = prompt[-1]
        base = E @ W[:d, :d] @ E[a] + E @ W[:d, d:] @ positions[L - 1]
        log_omega = positions[:L] @ W[d:, :d] @ E[a] + positions[:L] @ W[d:, d:] @ positions[L - 1]
        raw = dyn.positional_attention_output(E, positions, W, prompt)
        assert np.abs(raw - cf.positional_law(base, prompt, log_omega)).max() < 1e-12


@pytest.mark.parametrize("query", cf.QUERY_VARIANTS)
def test_nll_gradient_is_the_derivative_and_matches_the_raw_model(query):
    E, W, P = _attention(scale=0.5)
    Theta = dyn.attention_logits(E, W)
    prompts = np.random.default_rng(6).integers(0, 5, size=(300, 6))
    y = dyn.sample_raw_outputs(E, W, prompts, 1, seed=7, query=query)[:, 0]
    grad = cf.nll_gradient_theta(Theta, prompts, y, query)
    step = 1e-6
    for a, k in [(0, 0), (1, 3), (4, 2)]:
        shift = np.zeros_like(Theta)
        shift[a, k] = step
        numeric = (cf.nll_theta(Theta + shift, prompts, y, query) - cf.nll_theta(Theta - shift, prompts, y, query)) / (2 * step)
        assert abs(numeric - grad[a, k]) < 1e-8
    value, raw_grad = dyn.raw_nll_and_gradient(E, W, prompts, y, query)
    counts = cf.key_counts(prompts, 5, query)
    assert abs(value - cf.nll_theta(Theta, prompts, y, query) + np.log(counts[np.arange(300), y]).mean()) < 1e-12
    assert np.abs(raw_grad - E.T @ grad.T @ E).max() < 1e-12


# ---- Fisher information, rank, asymptotic constants ------------------------------------------------------------

def test_fisher_information_is_the_covariance_of_the_score():
    P = cf.GOLDEN_P
    n = 200_000
    rng = np.random.default_rng(8)
    prompts = rng.integers(0, 4, size=(n, 5))
    law = cf.ccmc_law(P, prompts)
    y = (law.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    score = np.eye(4)[y] - law  # ∂ log p(y|X)/∂Θ_{a,·} for a = x_L
    F = cf.fisher_information(P, cf.all_prompts(4, 5))
    for a in range(4):
        rows = prompts[:, -1] == a
        products = np.where(rows[:, None, None], score[:, :, None] * score[:, None, :], 0.0).reshape(n, 16)
        assert_within_standard_errors(products.mean(axis=0), products.std(axis=0, ddof=1) / np.sqrt(n) + 1e-15,
                                      F[a].ravel())


def test_golden_asymptotic_constants_and_rank():
    F = cf.fisher_information(cf.GOLDEN_P, cf.all_prompts(4, 6))
    constants = cf.asymptotic_constants(cf.GOLDEN_P, F)
    assert constants["theta"] == pytest.approx(328.584, abs=1e-3)
    assert constants["chain"] == pytest.approx(14.537, abs=1e-3)
    assert cf.fisher_rank(F) == 12


@pytest.mark.parametrize("query", cf.QUERY_VARIANTS)
def test_predicted_rank_matches_the_numerical_rank_on_random_supports(query):
    rng = np.random.default_rng(9)
    for _ in range(20):
        prompts = rng.integers(0, 5, size=(rng.integers(1, 12), rng.integers(2, 5)))
        F = cf.fisher_information(cf.chain_from_logits(rng.standard_normal((5, 5))), prompts, query)
        assert cf.fisher_rank(F) == cf.predicted_fisher_rank(prompts, 5, query)


def test_fisher_rank_is_read_only_from_a_certified_decision():
    """The rank's certificate: on the enumerated golden support the eigenvalues not counted are round-off (≤ 1e-12
    of the largest) and the ones counted far above the cut; a block with an eigenvalue between round-off and the cut
    (1e-10 of the largest, a genuine value the cut would drop) makes the rank undecided, refused with the value, and
    so is the pseudo-inverse of the asymptotic constants at its own cut."""
    decision = cf.fisher_rank_decision(cf.fisher_information(cf.GOLDEN_P, cf.all_prompts(4, 5)))
    assert decision.certified and decision.rank == 12
    assert decision.largest_dropped <= 1e-12 and decision.smallest_kept > 1e3 * cf.FISHER_RANK_CUT
    rotation = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))[0]
    F = np.array([rotation @ np.diag(values) @ rotation.T for values in
                  ([1.0, 0.5, 1e-10, 0.0], [0.8, 0.3, 0.2, 0.0], [0.7, 0.2, 0.1, 0.0], [0.6, 0.4, 0.3, 0.0])])
    undecided = cf.fisher_rank_decision(F)
    assert not undecided.certified and undecided.rank == 11
    assert undecided.largest_dropped == pytest.approx(1e-10, rel=1e-4)
    with pytest.raises(cf.UncertifiedSolution, match="undecided") as refused:
        cf.fisher_rank(F)
    assert refused.value.certificate == undecided.largest_dropped
    assert cf.fisher_rank(F, relative_tolerance=1e-11) == 12  # a cut below the value counts it: certified
    F[0] = rotation @ np.diag([1.0, 0.5, 1e-11, 0.0]) @ rotation.T  # between round-off and the pseudo-inverse's cut
    with pytest.raises(cf.UncertifiedSolution, match="pseudo-inverse"):
        cf.asymptotic_constants(cf.GOLDEN_P, F)


def test_transversal_stability_carries_its_margin_and_refuses_a_tie():
    """The margin 1 − max_{k∉S} λ_k(f) against the closed forms of §6.3–6.4 (losers of a diagonal vertex grow like
    t^{P_wk/P_ww}, the fitness urn's like t^{v_k/v_w}); the neutral Pólya urn has λ ≡ 1, a tie that is refused; a
    point that is not an equilibrium is refused as such."""
    P = cf.diagonal_dominant_chain(4, 0.55)
    verdict = cf.transversal_stability(P, [1.0, 0, 0, 0])
    assert verdict.margin == pytest.approx(1 - cf.diagonal_loser_exponents(P, 0)[1:].max(), abs=1e-14)
    assert verdict.decided and verdict.stable and verdict.residual < 1e-14
    v = np.array([0.4, 1.0, 0.7])
    unstable = cf.transversal_stability(cf.rank_one_chain(v), [1.0, 0, 0])  # token 1 is fitter than the vertex
    assert unstable.margin == pytest.approx(1 - v.max() / v[0], abs=1e-13) and not unstable.stable
    assert not cf.is_transversally_stable(cf.rank_one_chain(v), [1.0, 0, 0])
    f_star = cf.equilibrium_on_support(cf.CYCLE_P, [0, 1, 2])
    assert cf.transversal_stability(cf.CYCLE_P, f_star).margin == pytest.approx(1 - 0.471810, abs=1e-6)
    tie = cf.transversal_stability(np.full((4, 4), 0.25), [0.5, 0.5, 0, 0])
    assert not tie.decided and abs(tie.margin) <= cf.EQUILIBRIUM_TOLERANCE
    with pytest.raises(cf.UncertifiedSolution, match="not decided"):
        cf.is_transversally_stable(np.full((4, 4), 0.25), [0.5, 0.5, 0, 0])
    with pytest.raises(ValueError, match="not an equilibrium"):
        cf.transversal_stability(cf.CYCLE_P, [0.5, 0.25, 0.25, 0])


def test_uniform_chain_constant_is_the_enumerated_value():
    for K, L in ((3, 6), (4, 5)):
        P = np.full((K, K), 1.0 / K)
        enumerated = cf.asymptotic_constants(P, cf.fisher_information(P, cf.all_prompts(K, L)))["chain"]
        assert cf.uniform_chain_constant(K, L) == pytest.approx(enumerated, rel=1e-10)
    assert cf.uniform_chain_constant(12) == 132
    assert cf.uniform_chain_constant(6, 60_000) == pytest.approx(30, rel=1e-3)


def test_mle_newton_and_lbfgs_agree_and_are_stationary():
    problem = CCMCProblem(cf.GOLDEN_P)
    prompts, y = dyn.sample_learning_data(problem, 3000, seed=10)
    newton = dyn.fit_mle(problem, prompts, y)
    lbfgs = dyn.fit_mle(problem, prompts, y, method="lbfgs")
    assert np.abs(newton - lbfgs).max() < 1e-5
    assert np.abs(cf.nll_gradient_theta(newton, prompts, y)).max() < 1e-10
    # L-BFGS's writable iterates and nll_gradient_theta's read-only copies reach one compiled kernel, not two, even
    # from read-only labels
    read_only_y = np.array(y)
    read_only_y.setflags(write=False)
    dyn.fit_mle(problem, prompts, read_only_y, method="lbfgs")
    assert len(cf._nll_and_gradient.signatures) == 1


def test_mle_returns_logits_the_data_cannot_fix_as_zero_and_centres_each_identified_group():
    """Row 0 sees keys {1, 2} together and 3 only alone; row 1 sees {0, 2} and {2, 3}; rows 2 and 3 no data. The
    convention (docs/ccmc.md §5.1): each group centred, every unidentified logit exactly 0, whichever optimiser."""
    problem = CCMCProblem(np.full((4, 4), 0.25), L=3, X0=(0, 1, 2), query="exclude")
    prompts = np.array([[1, 2, 0]] * 3 + [[3, 3, 0]] + [[0, 2, 1]] * 3 + [[2, 3, 1]] * 2)
    y = np.array([1, 1, 2, 3, 0, 0, 2, 3, 2])
    groups = dyn.identified_groups(cf.key_counts(prompts, 4, "exclude"), prompts[:, -1], 4)
    assert (groups[0] >= 0).tolist() == [False, True, True, False] and groups[0, 1] == groups[0, 2]
    assert (groups[1] >= 0).tolist() == [True, False, True, True] and len(set(groups[1, [0, 2, 3]])) == 1
    assert (groups[2:] == -1).all()
    for method in ("newton", "lbfgs"):
        Theta = dyn.fit_mle(problem, prompts, y, method=method)
        assert Theta[groups < 0].tolist() == [0.0] * int((groups < 0).sum())
        # the empirical odds: θ₁ − θ₂ = log 2 in row 0; θ₀ − θ₂ = log 2 and θ₃ = θ₂ in row 1; each group centred
        log2 = np.log(2)
        assert Theta[0, [1, 2]] == pytest.approx([log2 / 2, -log2 / 2], abs=1e-6)
        assert Theta[1, [0, 2, 3]] == pytest.approx([2 * log2 / 3, -log2 / 3, -log2 / 3], abs=1e-6)
        assert np.abs(cf.nll_gradient_theta(Theta, prompts, y, "exclude")).max() < 1e-6


# ---- generation ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("query", cf.QUERY_VARIANTS)
def test_count_generator_first_step_is_the_ccmc_law(query):
    X0 = (0, 2, 2, 1, 3)
    runs = 100_000
    counts = dyn.generate_counts(cf.CYCLE_P, X0, seed=11, runs=runs, record_steps=[0, 1], query=query)["counts"]
    first = (counts[:, 1] - counts[:, 0]).argmax(axis=1)
    law = cf.ccmc_law(cf.CYCLE_P, X0, query)[0]
    frequencies = np.bincount(first, minlength=4) / runs
    keep = law > 0
    assert frequencies[~keep].sum() == 0
    assert_within_standard_errors(frequencies[keep], np.sqrt(law[keep] * (1 - law[keep]) / runs), law[keep])


def test_count_generator_matches_raw_generation_in_distribution():
    """Two steps of raw-layer generation and of the count generator give the same law of the count vector."""
    E, W, P = _attention(K=4, d=6)
    X0 = (0, 1, 1, 3)
    runs = 60_000
    raw = dyn.generate_raw(E, W, X0, 2, runs, seed=12)[:, 4:]
    counts = dyn.generate_counts(P, X0, seed=13, runs=runs, record_steps=[2])["counts"][:, 0]
    raw_counts = np.array([np.bincount(r, minlength=4) for r in raw]) + np.bincount(X0, minlength=4)
    for k in range(4):
        a, b = raw_counts[:, k], counts[:, k]
        se = np.sqrt(a.var(ddof=1) / runs + b.var(ddof=1) / runs) + 1e-15
        assert_within_standard_errors(a.mean(), se, b.mean())


def test_polya_moments_against_simulation():
    X0 = (0, 1, 1, 1)
    counts = dyn.generate_counts(np.full((2, 2), 0.5), X0, seed=14, runs=20_000, record_steps=[50])["counts"][:, 0]
    f = counts[:, 0] / counts.sum(axis=1)
    mean, variance = cf.polya_share_moments([1, 3], 50)
    n = f.size
    assert_within_standard_errors(f.mean(), f.std(ddof=1) / np.sqrt(n), mean[0])
    squared = (f - mean[0]) ** 2
    assert_within_standard_errors(squared.mean(), squared.std(ddof=1) / np.sqrt(n), variance[0])


def test_invasion_rates_special_cases_and_golden_equilibrium():
    v = np.array([1.0, 0.7, 0.4])
    assert np.allclose(cf.invasion_rates([1.0, 0, 0], cf.rank_one_chain(v)), v / v[0])
    assert np.allclose(cf.fitness_exponents(v, [0, 1, 2]), v / v[0])
    P = cf.diagonal_dominant_chain(4, 0.55)
    assert np.allclose(cf.invasion_rates([0, 0, 1.0, 0], P), P[2] / P[2, 2])
    f_star = cf.equilibrium_on_support(cf.CYCLE_P, [0, 1, 2])
    assert np.allclose(f_star, [0.350449, 0.302077, 0.347474, 0.0], atol=1e-6)
    assert cf.invasion_rates(f_star, cf.CYCLE_P)[3] == pytest.approx(0.471810, abs=1e-6)
    assert cf.is_transversally_stable(cf.CYCLE_P, f_star)


def test_stationary_law_of_the_fast_chain_by_power_iteration():
    f = np.array([0.5, 0.2, 0.3, 0.0])
    P = cf.CYCLE_P
    Q = f[None, :] * P
    Q /= Q.sum(axis=1, keepdims=True)
    pi = np.full(4, 0.25)
    for _ in range(5000):
        pi = pi @ Q
    assert np.allclose(cf.stationary_law_of_q(f, P), pi, atol=1e-12)


def test_fluid_limit_reaches_the_equilibrium_and_keeps_the_simplex():
    f = dyn.fluid_trajectory(cf.CYCLE_P, [0.25] * 4, np.linspace(0, 40, 5))
    assert np.allclose(f.sum(axis=1), 1)
    assert np.abs(f[-1] - cf.equilibrium_on_support(cf.CYCLE_P, [0, 1, 2])).max() < 1e-6


# ---- validation, reproducibility -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    (dict(P=[[0.5, 0.6], [0.5, 0.5]]), "P"),
    (dict(P=[[1.0, 0.0], [0.5, 0.5]]), "P"),
    (dict(P=[[0.5, 0.5, 0.0]]), "P"),
    (dict(P=cf.GOLDEN_P, X0=(0, 7)), "X0"),
    (dict(P=cf.GOLDEN_P, X0=()), "X0"),
    (dict(P=cf.GOLDEN_P, L=0), "L"),
    (dict(P=cf.GOLDEN_P, query="both"), "query"),
    (dict(P=cf.GOLDEN_P, X0=(1,), query="exclude"), "X0"),
])
def test_problem_refuses_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name) as error:
        CCMCProblem(**kwargs)
    assert "\n" not in str(error.value)


def test_functions_refuse_bad_prompts():
    with pytest.raises(ValueError, match="prompts"):
        cf.ccmc_law(cf.GOLDEN_P, [[0, 4]])
    with pytest.raises(ValueError, match="prompts"):
        cf.ccmc_law(cf.GOLDEN_P, np.zeros((0, 3), int))
    with pytest.raises(ValueError, match="prompts"):
        cf.ccmc_law(cf.GOLDEN_P, [[0.5, 1]])
    with pytest.raises(ValueError, match="P"):
        cf.ccmc_law([[0.2, 0.2], [0.5, 0.5]], [[0, 1]])
    with pytest.raises(ValueError, match="level_token"):
        dyn.generate_counts(cf.GOLDEN_P, (0, 1), seed=0, runs=2, level_token=3, levels=[10])
    with pytest.raises(ValueError, match="runs"):
        dyn.generate_counts(cf.GOLDEN_P, (0, 1), seed=0, runs=10**9, record_steps=[10**6])


def test_from_params_parses_text_and_names_bad_parameters():
    problem = CCMCProblem.from_params({"P": "0.5,0.5;0.2,0.8", "X0": "0,1,1", "query": "exclude", "L": "3"})
    assert problem.K == 2 and problem.X0 == (0, 1, 1) and problem.query == "exclude"
    with pytest.raises(ValueError, match="X0"):
        CCMCProblem.from_params({"X0": "0,1.5"})
    with pytest.raises(ValueError, match="unknown"):
        CCMCProblem.from_params({"K": "3"})


def test_same_seed_same_numbers():
    problem = CCMCProblem(cf.GOLDEN_P)
    a = dyn.generate_counts(cf.CYCLE_P, (0, 1, 2, 3), seed=15, runs=5, record_steps=[10, 100])
    b = dyn.generate_counts(cf.CYCLE_P, (0, 1, 2, 3), seed=15, runs=5, record_steps=[10, 100])
    assert np.array_equal(a["counts"], b["counts"]) and np.array_equal(a["fisher"], b["fisher"])
    x1, y1 = dyn.sample_learning_data(problem, 50, seed=np.random.SeedSequence(3))
    x2, y2 = dyn.sample_learning_data(problem, 50, seed=np.random.SeedSequence(3))
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    r1 = dyn.adam_raw(problem, seed=4, steps=20, batch=16)
    r2 = dyn.adam_raw(problem, seed=4, steps=20, batch=16)
    assert np.array_equal(r1.final["W"], r2.final["W"])
    assert not np.array_equal(r1.final["W"], dyn.adam_raw(problem, seed=5, steps=20, batch=16).final["W"])


def test_seeds_are_required():
    with pytest.raises(TypeError):
        dyn.minibatch(CCMCProblem(cf.GOLDEN_P))  # the seed is keyword-only, without a default


def test_adam_divergence_names_the_step():
    with pytest.raises(DivergenceError, match="step"):
        dyn.adam_raw(CCMCProblem(cf.GOLDEN_P), seed=0, steps=200, batch=8, lr=1e6)


def test_population_and_minibatch_contract():
    problem = CCMCProblem(cf.CYCLE_P)
    population = dyn.population(problem, steps=10_000, n_records=12)
    minibatch = dyn.minibatch(problem, seed=1, steps=10_000, runs=20, n_records=12)
    assert np.array_equal(population.times, minibatch.times)
    assert population.metrics["share_3"][-1] < 0.05 and population.metrics["tokens_above_1pct"][-1] == 3
    assert np.allclose(population.states["shares"].sum(axis=1), 1)


# ---- the claims ------------------------------------------------------------------------------------------------

def test_every_quick_claim_passes_or_is_a_registered_finding():
    results = {c.name: run_claim(c, seed=0) for c in select(["ccmc"])}
    assert len(results) >= 16
    failing = {n: r.status for n, r in results.items() if r.status != "PASS"}
    assert failing == {n: "FAIL" for n in claims.FINDINGS}, {n: results[n].notes or results[n].measured for n in failing}
    for result in results.values():
        assert_figure_is_clean(result)


def _run(name, **overrides):
    return run_claim(select([name])[0], seed=0, **overrides)


def test_the_law_claim_fails_for_a_slightly_wrong_law(monkeypatch):
    true_law = cf.ccmc_law
    monkeypatch.setattr(cf, "ccmc_law", lambda P, prompts, query="self": true_law(P, prompts, query) * (1 + 1e-9))
    assert _run("ccmc.raw_attention_law").status == "FAIL"


def test_the_polya_claim_fails_for_a_slightly_wrong_variance(monkeypatch):
    true_moments = cf.polya_share_moments
    monkeypatch.setattr(cf, "polya_share_moments", lambda m0, t: (true_moments(m0, t)[0], 1.1 * true_moments(m0, t)[1]))
    assert _run("ccmc.polya_urn", runs=20000).status == "FAIL"


def test_the_fitness_claim_fails_for_slightly_wrong_exponents(monkeypatch):
    true_exponents = cf.fitness_exponents
    monkeypatch.setattr(cf, "fitness_exponents", lambda v, support: true_exponents(v, support) + 0.05)
    assert _run("ccmc.fitness_urn_exponents").status == "FAIL"


def test_the_mle_claim_fails_for_a_slightly_wrong_constant(monkeypatch):
    true_constants = cf.asymptotic_constants
    monkeypatch.setattr(cf, "asymptotic_constants",
                        lambda P, F: {k: 1.3 * v for k, v in true_constants(P, F).items()})
    assert _run("ccmc.mle_asymptotic_error").status == "FAIL"


def test_the_equilibrium_claim_fails_for_a_slightly_wrong_equilibrium(monkeypatch):
    true_equilibrium = cf.equilibrium_on_support
    monkeypatch.setattr(cf, "equilibrium_on_support",
                        lambda P, S: true_equilibrium(P, S) + np.array([0.01, -0.01, 0.0, 0.0]))
    assert _run("ccmc.fluid_equilibrium").status == "FAIL"


def test_a_chain_is_checked_into_one_read_only_c_ordered_copy():
    """Whatever the input's layout, the kernels get one kind of array (a second would be a second compile)."""
    fortran = np.asfortranarray(cf.CYCLE_P)
    P = cf.check_chain(fortran)
    assert P.flags.c_contiguous and not P.flags.writeable and np.array_equal(P, cf.CYCLE_P)
    np.testing.assert_array_equal(cf.stationary_law_of_q(np.full(4, 0.25), fortran),
                                  cf.stationary_law_of_q(np.full(4, 0.25), cf.CYCLE_P))


@pytest.mark.parametrize("K", [2, 3, 4, 6])
def test_the_default_initial_prompt_is_valid_for_every_chain_size(K):
    """X0 defaults to the first min(K, 4) tokens: a K < 4 chain needs no X0 even where none is used."""
    problem = CCMCProblem(np.full((K, K), 1 / K))
    assert problem.X0 == tuple(range(min(K, 4)))
    values = {"P": ";".join(",".join([str(1 / K)] * K) for _ in range(K))}
    assert CCMCProblem.from_params(values).X0 == problem.X0
