"""What the claims of gd_beta, one_nn, random_walk and group_sparse report: stable ids with human labels apart, a
nominal false-FAIL rate that follows from the tolerance, and a figure (or a note saying why there is none)."""
import re

import pytest
from scipy import stats

from attnflow import run_claim, select
from attnflow.validation import gd_beta, one_nn
from attnflow.validation.stats import Z_TOLERANCE
from tests.conftest import assert_figure_is_clean

STABLE_ID = re.compile(r"^[a-z][a-z0-9_]*$")


def assert_reports_by_contract(result):
    """Ids are snake_case; every id has a label; a rate is a probability; the figure draws without a layout
    defect."""
    ids = [*result.measured, *result.predicted]
    assert ids and all(STABLE_ID.match(key) for key in ids), (result.name, ids)
    assert set(ids) <= set(result.labels), (result.name, set(ids) - set(result.labels))
    assert result.false_fail_rate is None or 0 < result.false_fail_rate < 1, result.name
    if result.figure is None:
        assert "No figure" in result.notes, result.name
    else:
        assert_figure_is_clean(result)
    document = result.to_dict()
    assert set(document["labels"]) == set(ids)


@pytest.mark.parametrize("name, overrides", [
    ("gd_beta.bayes_factor_needs_bounded_snr", dict(n_contexts=2000)),
    ("gd_beta.minibatch_gradient_scaling", dict(batch_sizes=(16, 64, 256), seeds=4)),
    ("one_nn.full_gd_tracks_reduced", dict(steps=10, batch_size=64, seeds=3)),
    ("one_nn.context_length", dict(steps=10)),
    ("one_nn.distribution_shift", dict(checkpoints=(10, 30), n_prompts=2000)),
    ("random_walk.optimal_accuracy", dict(ps=(0.7,), steps=10)),
    ("random_walk.reduced_equals_full_gd", dict(steps=2, ps=(0.7,))),
    ("group_sparse.reduced_matches_full_gd", dict(steps=3, batch_size=500, seeds=2)),
])
def test_cheap_claims_report_by_contract(name, overrides):
    assert_reports_by_contract(run_claim(select([name])[0], seed=0, **overrides))


def test_false_fail_rates_follow_the_tolerance():
    """|z| < 4 over k normal comparisons: at most k·P(|Z| > 4); a z over s seeds: t with s − 1 degrees of freedom;
    a t-test at its own quantile: the rate it was set at; a 99.9% interval that must contain the theorem's value:
    0.1%;
    a deterministic identity: none."""
    per_comparison = 2 * stats.norm.sf(Z_TOLERANCE)
    risk = run_claim(select(["gd_beta.risk_formula"])[0], seed=0, n_prompts=2000)
    assert risk.false_fail_rate == pytest.approx(3 * per_comparison)
    tracks = run_claim(select(["one_nn.full_gd_tracks_reduced"])[0], seed=0, steps=10, batch_size=64, seeds=3)
    assert tracks.false_fail_rate == pytest.approx(one_nn.TRACKING_FAMILY_RATE)  # two t-tests at half of it
    assert all(row["critical"] == pytest.approx(stats.t.isf(one_nn.TRACKING_FAMILY_RATE / 4, row["df"]))
               for row in tracks.details)
    scaling = run_claim(select(["gd_beta.minibatch_gradient_scaling"])[0], seed=0, batch_sizes=(16, 64, 256), seeds=4)
    assert scaling.false_fail_rate == pytest.approx(1 - gd_beta.SCALING_LEVEL) == pytest.approx(1e-3)
    identity = run_claim(select(["random_walk.reduced_equals_full_gd"])[0], seed=0, steps=2, ps=(0.7,))
    assert identity.false_fail_rate is None


def test_the_solve_figure_of_gd_beta_draws_each_predicted_rate_beside_its_metric():
    from attnflow.dynamics import gd_beta as dyn
    from attnflow.validation.gd_beta import SYSTEM, example_problem

    flow = dyn.population_trajectory(example_problem(2.0), n_points=60)
    figure = SYSTEM.population_figure(flow, "gradient flow", "t")
    rates = flow.info["rates"]
    drawn = {ax.get_title(): [line.get_label() for line in ax.get_lines() if line.get_linestyle() == "--"]
             for ax in figure.axes}
    assert drawn["beta_error"] == [rf"predicted $e^{{-{rates.beta:.3g}\,t}}$"]
    assert drawn["gamma_error"] == [rf"predicted $e^{{-{rates.gamma_tail:.3g}\,t}}$"]
    assert len(drawn["excess_risk"]) == 1 and not drawn["risk"]
