import os

import numpy as np
import pytest

from attnflow.validation.stats import Z_TOLERANCE


def all_finite(values) -> bool:
    """Every float in a nested dict/list of printed values is finite (text such as "undefined" is allowed)."""
    if isinstance(values, dict):
        return all(all_finite(v) for v in values.values())
    if isinstance(values, (list, tuple)):
        return all(all_finite(v) for v in values)
    return not isinstance(values, float) or np.isfinite(values)


def assert_within_standard_errors(measured_mean, standard_error, predicted, k=Z_TOLERANCE):
    """|measured − predicted| < k standard errors (elementwise for arrays)."""
    measured_mean, standard_error, predicted = (np.asarray(v, float) for v in (measured_mean, standard_error, predicted))
    z = (measured_mean - predicted) / standard_error
    assert np.all(np.abs(z) < k), f"max |z| = {np.abs(z).max():.2f} >= {k}: measured {measured_mean}, predicted {predicted}"


def assert_figure_is_clean(result):
    """The claim's figure, drawn as the report saves it, has no layout defect (attnflow.validation.figure_check): no
    text past the canvas, every log axis numbered at three places or more, no legend naming two entries alike."""
    if result.figure is None:
        return
    from attnflow.validation import figure_check, report

    defects = figure_check.figure_defects(result.figure(), dpi=report.FIGURE_DPI)
    assert not defects, (result.name, defects)


def small_figure(title: str = "a test figure"):
    """A small clean figure (one theory line, labelled axes) for tests of what is done with a figure."""
    from attnflow.validation import plots

    fig, ax = plots.figure()
    plots.theory_line(ax, [1, 2, 3], [1, 4, 9])
    plots.finish(ax, title, "$x$", "$x^2$")
    return fig


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


def plugin_environment(site, distribution: str, entry_point: str, source) -> dict:
    """The environment of a process that sees ``source`` as an installed distribution registering ``entry_point``
    (``"toy = attnflow_toy:SYSTEM"``) under ``attnflow.systems``: its metadata in the folder ``site``."""
    info = site / f"{distribution}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[attnflow.systems]\n{entry_point}\n")
    path = os.pathsep.join([str(site), str(source), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}
