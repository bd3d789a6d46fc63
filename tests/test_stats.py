"""The clustered Clopper–Pearson interval: an exact identity, and its one-sided coverage by simulation."""
import numpy as np
import pytest

from attnflow.validation.stats import clopper_pearson, clustered_clopper_pearson

LEVEL = 0.95
REPLICATES = 2000


def lower_bound_coverage(seed, clusters, trials_per_cluster, beta_a, beta_b):
    """How often the clustered and the pooled (independent-trials) 95% lower bounds lie below the true mean, when
    cluster i's success probability is drawn from Beta(a, b) and its trials are Bernoulli given it."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    mean = beta_a / (beta_a + beta_b)
    trials = np.full(clusters, trials_per_cluster)
    clustered = pooled = 0
    for _ in range(REPLICATES):
        successes = rng.binomial(trials, rng.beta(beta_a, beta_b, clusters))
        clustered += clustered_clopper_pearson(successes, trials, LEVEL).low <= mean
        pooled += clopper_pearson(int(successes.sum()), int(trials.sum()), LEVEL)[0] <= mean
    return clustered / REPLICATES, pooled / REPLICATES


def test_one_trial_per_cluster_counts_as_n_minus_one_independent_trials():
    # with nᵢ = 1 the cluster-robust variance is p̂(1 − p̂)/(m − 1) exactly, so the design effect is m/(m − 1) and
    # the effective size m − 1; the degrees-of-freedom factor is 1 (N − 1 = m − 1)
    successes = np.array([1] * 37 + [0] * 13)
    interval = clustered_clopper_pearson(successes, np.ones(50), LEVEL)
    assert interval.n_effective == pytest.approx(49, rel=1e-12)


def test_all_successes_give_an_upper_bound_of_one_and_a_design_effect_of_one():
    # every cluster at p̂ = 1 has v = 0: n_effective is N scaled only by (t_{N−1}/t_{m−1})², and the lower bound is
    # the exact binomial one at that size, (α/2)^{1/n}
    from scipy import stats as scipy_stats
    interval = clustered_clopper_pearson([200] * 10, [200] * 10, LEVEL)
    factor = (scipy_stats.t.ppf(0.025, 1999) / scipy_stats.t.ppf(0.025, 9)) ** 2
    assert interval.n_effective == pytest.approx(2000 * factor, rel=1e-12)
    assert interval.high == 1.0
    assert interval.low == pytest.approx(0.025 ** (1 / interval.n_effective), rel=1e-12)


@pytest.mark.parametrize("clusters, trials_per_cluster, beta_a, beta_b", [
    (100, 20, 9.0, 1.0),   # strongly clustered: the cluster rates spread over [0.6, 1]
    (10, 200, 1e6, 1e6 / 9),   # nearly independent trials: every cluster at 0.9
])
def test_lower_bound_covers_the_mean_at_its_nominal_one_sided_level(clusters, trials_per_cluster, beta_a, beta_b):
    clustered, pooled = lower_bound_coverage(0, clusters, trials_per_cluster, beta_a, beta_b)
    nominal = 1 - (1 - LEVEL) / 2
    standard_error = np.sqrt(nominal * (1 - nominal) / REPLICATES)
    assert clustered >= nominal - 4 * standard_error
    if beta_a < 100:
        # the same test catches an interval that ignores the clusters: pooled coverage is far below nominal
        assert pooled < nominal - 4 * standard_error


@pytest.mark.parametrize("bad, match", [
    (dict(successes=[1, 2], trials=[2]), "one length"),
    (dict(successes=[1], trials=[2]), "at least 2 clusters"),
    (dict(successes=[3, 0], trials=[2, 2]), "successes"),
    (dict(successes=[0, 0], trials=[1, 0]), "at least 2 trials"),
    (dict(successes=[1, 1], trials=[2, 2], level=1.0), "level"),
])
def test_bad_input_is_refused_naming_the_parameter(bad, match):
    with pytest.raises(ValueError, match=match):
        clustered_clopper_pearson(**bad)


def test_few_widely_spread_clusters_cover_as_docs_next_token_scc_says():
    # docs/next_token_scc.md §5.2: 10 clusters of 200 trials, rates from Beta(9, 1): 95.8% (pooled 65%)
    clustered, pooled = lower_bound_coverage(0, 10, 200, 9.0, 1.0)
    standard_error = np.sqrt(0.958 * 0.042 / REPLICATES)
    assert abs(clustered - 0.958) <= 4 * standard_error
    assert abs(pooled - 0.65) <= 4 * np.sqrt(0.65 * 0.35 / REPLICATES)
