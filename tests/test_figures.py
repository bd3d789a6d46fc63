"""The figures claims draw: the layout check of attnflow.validation.figure_check on deliberately bad figures, the
save path that applies it to every report figure and --plot file, and the figure of every claim.

Most systems' figures are checked where their claims already run at quick settings (each system's test module calls
``assert_figure_is_clean`` on the results it has); gd_beta's and one_nn's claims have no such test, so their figures
are drawn here from small settings (a figure's layout does not depend on how many samples made its points)."""
import io
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from attnflow import Outcome, run_claim, select
from attnflow.validation import claim_runs, figure_check, plots, report, systems
from attnflow.validation.claims import Claim
from tests.conftest import assert_figure_is_clean, small_figure


def _defects(fig):
    return figure_check.figure_defects(fig, dpi=report.FIGURE_DPI)


def test_a_clean_figure_has_no_defect():
    assert _defects(small_figure()) == []


def test_a_title_wider_than_the_canvas_is_a_defect():
    fig, ax = plots.figure()
    ax.plot([0, 1], [0, 1])
    plots.finish(ax, "a title far too long for a figure this narrow " * 3, "x", "y")
    found = _defects(fig)
    assert len(found) == 1 and found[0].startswith("title 'a title far too long") and "past the canvas" in found[0]


def test_a_legend_beside_axes_that_fill_the_canvas_is_a_defect():
    fig, ax = plots.figure()
    fig.set_layout_engine(None)  # no layout to make room for it
    ax.plot([0, 1], [0, 1], label="a line")
    plots.finish(ax, "legend outside", "x", "y")
    plots.legend_outside(ax)
    assert any(d.startswith("legend of panel 'legend outside' reaches") for d in _defects(fig))


def test_an_axis_label_cut_at_the_edge_is_a_defect():
    fig, ax = plots.figure()
    fig.set_layout_engine(None)
    fig.subplots_adjust(left=0.02)  # the y label and tick numbers fall left of the canvas
    ax.plot([0, 1], [0, 100])
    ax.set_ylabel("a y label")
    found = _defects(fig)
    assert any(d.startswith("y label 'a y label'") for d in found), found
    assert any(d.startswith("y tick label") for d in found), found


def test_a_log_axis_with_two_numbers_is_a_defect():
    fig, ax = plots.figure()
    ax.plot([1, 2], [0.8, 30])
    ax.set_yscale("log")  # matplotlib alone numbers 0.8-30 at 1 and 10 only
    ax.set_title("log axis")
    found = _defects(fig)
    assert len(found) == 1 and found[0].startswith("log y axis of panel 'log axis' is numbered at 2 place(s)")


def test_a_legend_naming_two_entries_alike_is_a_defect():
    fig, ax = plots.figure()
    ax.plot([0, 1], [0, 1], label="theory")
    ax.plot([0, 1], [1, 0], label="theory")
    ax.legend()
    assert _defects(fig) == ["legend of a panel names ['theory'] more than once"]


@pytest.mark.parametrize("low, high", [(1.9, 3.4), (0.57, 1.75), (4.5e-4, 1.95e-3), (8e-5, 1.7e-3), (0.8, 30.0),
                                       (1.0, 1.02), (1e-300, 10.0), (3.0, 3e6)])
def test_finish_numbers_every_log_axis_at_three_places_or_more(low, high):
    fig, ax = plots.figure()
    ax.plot([low, high], [low, high])
    plots.finish(ax, "log-log", "x", "y", logx=True, logy=True)
    assert _defects(fig) == []


def test_save_warns_of_a_defect_and_writes_the_figure():
    fig, ax = plots.figure()
    ax.plot([0, 1], [0, 1], label="a")
    ax.plot([0, 1], [1, 0], label="a")
    ax.legend()
    buffer = io.BytesIO()
    with pytest.warns(figure_check.FigureDefectWarning, match=r"figure demo: legend of a panel names \['a'\]"):
        found = figure_check.save(fig, buffer, dpi=report.FIGURE_DPI, name="demo")
    assert found and buffer.getvalue().startswith(b"\x89PNG")


def test_save_settles_the_layout_before_the_drawing_it_writes():
    """A constrained layout placed from tick labels it then changes: the first draw of this figure puts the y
    label past the left edge (the defect found in ccmc.mle_asymptotic_error's report figure); save draws it once
    more first, and checks the draw that writes the file."""
    counts = [6, 8, 2, 13, 13, 19, 12, 9, 12, 11, 9, 3, 7, 4, 7, 5, 3]  # that figure's tallest bin: 19

    def figure():
        fig, axes = plots.figure(ncols=2)
        for ax in axes:
            ax.bar(np.arange(len(counts)), counts, label="150 data sets")
            ax.errorbar([5], [0.9 * ax.get_ylim()[1]], xerr=[2], fmt="o", label="mean ± 4.12 SE")
            ax.axvline(6, label="theory constant")
            plots.finish(ax, "MLE error at n = 8000 (K = 4, L = 6)", "scaled error", "data sets")
            plots.legend_below(ax)
        return fig

    first_draw = []
    fig = figure()
    with figure_check._checked_draw(fig, first_draw):
        fig.savefig(io.BytesIO(), dpi=report.FIGURE_DPI)  # matplotlib's own save: one draw
    with warnings.catch_warnings():
        warnings.simplefilter("error", figure_check.FigureDefectWarning)
        assert figure_check.save(figure(), io.BytesIO(), dpi=report.FIGURE_DPI) == []
    assert _defects(figure()) == []
    assert any(d.startswith("y label 'data sets'") for d in first_draw), first_draw


def _claim_with_a_bad_figure():
    def bad():
        fig, ax = plots.figure()
        ax.plot([0, 1], [0, 1], label="x")
        ax.plot([0, 1], [1, 0], label="x")
        ax.legend()
        return fig

    claim = Claim("fake.bad_figure", "nowhere", "a claim with a bad figure",
                  lambda seed: Outcome(measured={"x": 1.0}, predicted={"x": 1.0}, tolerance="none", basis="none",
                                       passed=True, figure=bad), {}, {})
    return run_claim(claim, seed=0)


def test_the_claim_figure_check_fails_on_a_bad_figure():
    with pytest.raises(AssertionError, match="fake.bad_figure"):
        assert_figure_is_clean(_claim_with_a_bad_figure())


def test_a_report_figure_with_a_defect_warns_naming_the_claim():
    result = _claim_with_a_bad_figure()
    with pytest.warns(figure_check.FigureDefectWarning, match="figure fake.bad_figure: legend"):
        record = claim_runs._render(result)
    assert "png" in record  # a user still gets the figure; the suite (setup.cfg) makes the warning an error
    with warnings.catch_warnings():
        warnings.simplefilter("error", figure_check.FigureDefectWarning)
        assert claim_runs._render(result)["error"].startswith("FigureDefectWarning: figure fake.bad_figure")


def test_the_suite_turns_a_figure_defect_into_an_error():
    with pytest.raises(figure_check.FigureDefectWarning):
        warnings.warn("a defect", figure_check.FigureDefectWarning)


# ---- every claim's figure --------------------------------------------------------------------------------------

# Systems whose test module runs every claim at quick settings and checks each figure there.
CHECKED_WITH_THEIR_CLAIMS = ("attention_svm", "ccmc", "group_sparse", "linear_attention_h3", "next_token_scc",
                             "random_walk", "scb")
# The claims of the other systems, at settings small enough to draw all of them in seconds.
SMALL_SETTINGS = {
    "gd_beta.risk_formula": dict(n_prompts=2000),
    "gd_beta.optimal_parameters": dict(n_starts=2, n_prompts=4000),
    "gd_beta.ltb_equals_gd_beta": dict(beta_norms=(0.0, 3.0), n_prompts=500),
    "gd_beta.lsa_gap": dict(beta_norms=(0.0, 1.0, 4.0), n_prompts=5000),
    "gd_beta.bayes_constant_factor": dict(n_contexts=2000),
    "gd_beta.bayes_factor_needs_bounded_snr": dict(n_contexts=2000),
    "gd_beta.gradient_flow_converges": {},
    "gd_beta.sgd_reaches_optimum": dict(seeds=2, steps=300),
    "gd_beta.ltb_spurious_minimum": dict(seeds=3, steps=300),
    "gd_beta.minibatch_gradient_scaling": dict(seeds=8),
    "gd_beta.gradient_noise_covariance": dict(n_contexts=16_000, n_prompts=50_000, kernel_prompts=200),
    "gd_beta.lna_matches_sgd_spread": dict(runs=16, steps=40, n_contexts=2000),
    "gd_beta.gaussian_noise_proxy": dict(runs=32, paths=16, steps=40, n_contexts=1000),
    "one_nn.quadrature_matches_monte_carlo": dict(n_prompts=3000, points=((4, 16, 0.0, 10.0), (4, 16, 3.0, 4.0),
                                                                          (2, 8, 5.0, 3.0))),
    "one_nn.loss_to_zero": dict(steps=100),
    "one_nn.asymptotic_constant": dict(xi1_values=(6.25, 12.5, 25.0)),
    "one_nn.full_gd_tracks_reduced": dict(steps=10, batch_size=64, seeds=3),
    "one_nn.full_gd_leaves_manifold_above_stability_limit": {},
    "one_nn.distribution_shift": dict(checkpoints=(10, 30), n_prompts=2000),
    "one_nn.context_length": dict(steps=10),
}


def test_every_claims_figure_is_checked_somewhere():
    """Each system's figures are checked by its own every-claim test, or its claims are listed here."""
    tests = Path(__file__).parent
    here = {name.split(".")[0] for name in SMALL_SETTINGS}
    assert set(systems.system_keys()) == here | set(CHECKED_WITH_THEIR_CLAIMS)
    assert {c.name for c in select(sorted(here))} == set(SMALL_SETTINGS)
    for system in CHECKED_WITH_THEIR_CLAIMS:
        text = (tests / f"test_{system}.py").read_text()
        assert re.search(r"assert_figure_is_clean|assert_reports_by_contract", text), system


@pytest.mark.parametrize("name", sorted(SMALL_SETTINGS))
def test_the_figure_of(name):
    result = run_claim(select([name])[0], seed=0, **SMALL_SETTINGS[name])
    assert result.status != "ERROR", result.notes
    assert_figure_is_clean(result)
