"""The kernels' sampler (dynamics/sampling.py) and the SCB minibatch kernel built on it, against exact laws and a
brute-force sampler of the raw data model."""
import math

import numpy as np
import pytest
from numba import njit
from scipy import stats

from attnflow.closed_forms import scb as cf
from attnflow.dynamics import sampling
from attnflow.dynamics import scb as dyn
from attnflow.seeding import generator_state

LAW = np.array([0.0, 0.05, 0.3, 0.0, 0.15, 0.4, 0.1, 0.0])  # zeros inside and at the end


@njit(cache=True)
def _alias_sample(state, prob, alias, n):
    u = np.empty(n)
    sampling.fill_uniforms(state, u)
    out = np.empty(n, np.int64)
    for i in range(n):
        out[i] = sampling.alias_pick(u[i], prob, alias)
    return out


@njit(cache=True)
def _guided_picks(u, cdf, guide):
    out = np.empty(u.shape[0], np.int64)
    for i in range(u.shape[0]):
        out[i] = sampling.guided_pick(u[i], cdf, guide)
    return out


def test_uniforms_are_reproducible_uniform_and_independent_of_how_they_are_split():
    whole = np.empty(200_000)
    sampling.fill_uniforms(generator_state(7), whole)
    state = generator_state(7)
    parts = [np.empty(n) for n in (1, 999, 199_000)]
    for part in parts:
        sampling.fill_uniforms(state, part)
    assert np.array_equal(whole, np.concatenate(parts))
    assert whole.min() >= 0.0 and whole.max() < 1.0
    assert stats.kstest(whole, "uniform").pvalue > 1e-4  # nominal false-alarm rate 1e-4
    lag = np.corrcoef(whole[:-1], whole[1:])[0, 1]  # serial correlation: SE 1/sqrt(n)
    assert abs(lag) < 4.5 / math.sqrt(whole.size)
    other = np.empty(1000)
    sampling.fill_uniforms(generator_state(8), other)
    assert not np.array_equal(whole[:1000], other)


def test_alias_table_draws_the_law_and_never_a_zero_probability_category():
    prob, choices = sampling.alias_table(LAW)
    assert choices.shape == (LAW.size, 2) and np.array_equal(choices[:, 1], np.arange(LAW.size))
    alias = choices[:, 0]
    draws = _alias_sample(generator_state(1), prob, choices, 400_000)
    counts = np.bincount(draws, minlength=LAW.size)
    assert counts[LAW == 0].sum() == 0
    support = LAW > 0
    assert stats.chisquare(counts[support], LAW[support] * draws.size).pvalue > 1e-4
    # the table itself is exact: P(i) = (prob[i] + Σ_{j: alias[j] = i} (1 − prob[j])) / n
    exact = prob.copy()
    np.add.at(exact, alias, 1.0 - prob)
    np.testing.assert_allclose(exact / LAW.size, LAW, atol=1e-15)


def test_alias_pick_is_walkers_rule_exactly():
    """The indexed pair gives exactly the textbook choice: column ⌊un⌋ when the fractional part of un is below its
    probability, else its alias (computed in numpy from the same uniforms, and at the edges of [0, 1))."""
    prob, choices = sampling.alias_table(LAW)

    def walker(u):
        scaled = u * LAW.size
        column = scaled.astype(np.int64)
        return np.where(scaled - column < prob[column], column, choices[column, 0])

    u = np.empty(100_000)
    sampling.fill_uniforms(generator_state(3), u)
    assert np.array_equal(_alias_sample(generator_state(3), prob, choices, u.size), walker(u))
    for edge in (0.0, 0.5, 1 - 2**-53):
        assert sampling.alias_pick(edge, prob, choices) == walker(np.array([edge]))[0]
    five = np.array([0.1, 0.0, 0.4, 0.2, 0.3])  # n not a power of two: u·n rounds below n at the top edge too
    prob5, choices5 = sampling.alias_table(five)
    top = sampling.alias_pick(1 - 2**-53, prob5, choices5)
    assert five[top] > 0 and top in (4, choices5[4, 0])


def test_fused_alias_picks_are_the_picks_of_the_uniforms_in_order():
    """alias_picks draws each uniform and picks at once: the same picks as alias_pick on fill_uniforms' uniforms,
    and the generator left where fill_uniforms leaves it, however the draws are split."""
    prob, choices = sampling.alias_table(LAW)
    expected = _alias_sample(generator_state(4), prob, choices, 10_001)
    state = generator_state(4)
    parts = [np.empty(n, np.uint32) for n in (1, 5_000, 5_000)]
    for part in parts:
        sampling.alias_picks(state, prob, choices, part)
    assert np.array_equal(np.concatenate(parts), expected)
    after = np.empty(1)
    sampling.fill_uniforms(state, after)
    reference = np.empty(10_002)
    sampling.fill_uniforms(generator_state(4), reference)
    assert after[0] == reference[-1]


def test_guide_table_pick_is_the_inverse_cdf_exactly():
    laws = np.stack([LAW, np.full(8, 1 / 8), np.eye(8)[3]])
    cdf, guide = sampling.guide_tables(laws)
    u = np.random.default_rng(2).random(50_000)
    u[:4] = (0.0, 0.05, 0.35, 1 - 2**-53)  # boundaries of the cumulative sums and the largest uniform
    for row in range(laws.shape[0]):
        picks = _guided_picks(u, cdf[row], guide[row])
        assert np.array_equal(picks, np.searchsorted(cdf[row], u, side="right"))
        assert laws[row][picks].min() > 0  # trailing zero categories are cut off by setting their cdf to 1


@pytest.mark.parametrize("N, T", [(4, 6), (2, 40)])  # rows of Y built one at a time, and in pairs (T >= 16N)
def test_minibatch_kernel_matches_a_brute_force_sampler_of_the_raw_data_model(N, T):
    """Per-sample gradients from numpy's inverse-CDF sampler (rng.choice on μ, q*⁽ᵏ⁾ and Pe_{x_s}) and the raw
    definitions (r = e_o − Vy, ∇_V = −r yᵀ, ∇_{q⁽ᵏ⁾} = −XᵀVᵀr), against the kernel's batch means: every entry within
    a Bonferroni z bound at family-wise level 1e-3, with a variance ratio check, and a biased sampler caught."""
    problem = cf.SCBProblem.random(N, T, 2, seed=5)
    V = np.random.default_rng(0).normal(size=(N, N))
    Q = np.random.default_rng(1).dirichlet(np.ones(T), size=N).T
    n = 60_000
    reference = _brute_force_gradients(problem, V, Q, n, np.random.default_rng(11))
    batches = 60
    kernel = np.array([np.concatenate([g["grad_V"].ravel(), g["grad_Q"].ravel(), [g["loss"]]])
                       for g in (dyn.minibatch_gradients(problem, V, Q, n // batches, seed=s) for s in range(batches))])
    mean_ref, se_ref = reference.mean(axis=0), reference.std(axis=0, ddof=1) / math.sqrt(n)
    mean_k, se_k = kernel.mean(axis=0), kernel.std(axis=0, ddof=1) / math.sqrt(batches)
    z = (mean_k - mean_ref) / np.hypot(se_k, se_ref)
    bound = stats.norm.isf(1e-3 / 2 / z.size)
    assert np.abs(z).max() < bound
    # spread: batch means of n/batches samples have variance σ²/(n/batches); ratio ~ F(batches − 1, n − 1)
    ratio = kernel.var(axis=0, ddof=1) * (n // batches) / reference.var(axis=0, ddof=1)
    low, high = stats.f.ppf([1e-3 / 2 / z.size, 1 - 1e-3 / 2 / z.size], batches - 1, n - 1)
    assert np.all((ratio > low) & (ratio < high))
    biased = _brute_force_gradients(problem, V, Q, n, np.random.default_rng(12), mu=np.roll(problem.mu, 1))
    z_biased = (mean_k - biased.mean(axis=0)) / np.hypot(se_k, biased.std(axis=0, ddof=1) / math.sqrt(n))
    assert np.abs(z_biased).max() > bound


def _brute_force_gradients(problem, V, Q, n, rng, mu=None):
    mu = problem.mu if mu is None else mu
    N, T = problem.N, problem.T
    out = np.empty((n, N * N + T * N + 1))
    x = rng.choice(N, size=(n, T), p=mu)
    k = rng.choice(N, size=n, p=mu)
    for b in range(n):
        s = rng.choice(T, p=problem.Q_star[:, k[b]])
        o = rng.choice(N, p=problem.P[:, x[b, s]])
        X = np.eye(N)[x[b]]  # T × N one-hot rows
        y = X.T @ Q[:, k[b]]
        r = np.eye(N)[o] - V @ y
        grad_Q = np.zeros((T, N))
        grad_Q[:, k[b]] = -X @ (V.T @ r)
        out[b] = np.concatenate([(-np.outer(r, y)).ravel(), grad_Q.ravel(), [0.5 * r @ r]])
    return out


@pytest.mark.parametrize("N, T", [(6, 10), (2, 40)])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_minibatch_kernel_draws_do_not_depend_on_the_chunk(chunk, N, T):
    """The draws are the same whatever the chunk; only the order of additions in the sums changes. An odd chunk
    leaves one row to build alone where rows are built in pairs (T >= 16N)."""
    problem = cf.SCBProblem.random(N, T, 2, seed=1)
    V, Q = cf.line_point(problem, 0.4, 0.3)
    ref = dyn.minibatch_gradients(problem, V, Q, 500, seed=4)
    other = dyn.minibatch_gradients(problem, V, Q, 500, seed=4, chunk=chunk)
    for name in ("loss", "G_V", "G_Q", "grad_V", "grad_Q"):
        np.testing.assert_allclose(other[name], ref[name], rtol=1e-12, atol=1e-14)
    again = dyn.minibatch_gradients(problem, V, Q, 500, seed=4)
    assert all(np.array_equal(again[name], ref[name]) for name in ref)


def test_rows_built_in_pairs_are_the_rows_built_alone():
    """y_b = Σ_t q_t e_{x_t}, two rows at once: the same additions in the same order, so the same bits, including
    rows with repeated tokens and rows that share their token list."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3, size=(2, 257)).astype(np.uint32)  # the kernel's token type
    q = rng.normal(size=(2, 257))
    alone = np.zeros((2, 3))
    for b in range(2):
        dyn._add_context(alone[b], x[b], q[b])
    paired = np.zeros((2, 3))
    dyn._add_context_pair(paired[0], x[0], q[0], paired[1], x[1], q[1])
    assert np.array_equal(paired, alone)
    assert np.array_equal(alone[0], [q[0][x[0] == i].cumsum()[-1] for i in range(3)])  # the sum in the order of t
    shared = np.zeros((2, 3))
    dyn._add_context_pair(shared[0], x[0], q[0], shared[1], x[0], q[1])
    expected = np.zeros((2, 3))
    dyn._add_context(expected[0], x[0], q[0])
    dyn._add_context(expected[1], x[0], q[1])
    assert np.array_equal(shared, expected)


@pytest.mark.parametrize("law", [[0.5, np.nan], [-0.1, 1.1], [], [0.0, 0.0], [[0.5, 0.5]], ["a", "b"],
                                 np.ones(sampling.MAX_ALIAS_CATEGORIES + 1)])
def test_alias_table_refuses_what_is_not_a_probability_vector(law):
    with pytest.raises(ValueError, match="^p must"):
        sampling.alias_table(law)
