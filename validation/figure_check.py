"""Layout defects a reader of a saved figure would trip over, found after the figure is drawn.

Three are checked: text (a title, an axis label, a tick number, a legend, an annotation) that reaches past the
canvas and is cut in the saved image; a log axis numbered at fewer than :data:`MIN_LOG_TICK_LABELS` places (major
and minor tick labels that are drawn and not empty), on which no value can be read; and a legend that names two
entries alike. The report's figures and ``--plot`` files are written by :func:`save`, which warns of each defect
(the test suite turns the warning into an error); :func:`figure_defects` lists them without writing anything.
"""
from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager

from matplotlib.text import Text

__all__ = ["FigureDefectWarning", "figure_defects", "save", "defects", "MIN_LOG_TICK_LABELS"]

MIN_LOG_TICK_LABELS = 3
SLACK_PIXELS = 1.0  # antialiasing may put a glyph's edge a pixel past its nominal box


class FigureDefectWarning(UserWarning):
    """A saved figure has a layout defect (:func:`figure_defects` says which)."""


def figure_defects(fig, dpi: float | None = None) -> list[str]:
    """Every defect of ``fig`` drawn as :func:`save` draws it at ``dpi`` (default: the figure's own), one sentence
    each; [] when none. Nothing is rasterised, and nothing is warned."""
    found: list[str] = []
    with _at_dpi(fig, dpi):
        fig.draw_without_rendering()  # the settling draw of save()
        with _checked_draw(fig, found):
            fig.draw_without_rendering()
    return found


def save(fig, target, *, dpi: float | None = None, format: str = "png", name: str = "figure") -> list[str]:
    """``fig.savefig(target)`` with its layout settled first, checked as saved: warn
    (:class:`FigureDefectWarning`) naming ``name`` and each defect; return the defects.

    A constrained layout is computed from the sizes of tick labels and legends that the layout itself changes
    (an axes that grows gets other ticks), so the first draw of a figure can leave an axis label past the canvas
    that a second draw brings back: one draw at the saving dpi settles it. The check reads the positions of the
    draw that wrote the file (its ``draw_event``), so it sees what the file shows."""
    dpi = fig.dpi if dpi is None else dpi
    found: list[str] = []
    with _at_dpi(fig, dpi):
        fig.draw_without_rendering()
    with _checked_draw(fig, found):
        fig.savefig(target, dpi=dpi, format=format)
    if found:
        warnings.warn(f"figure {name}: " + "; ".join(found), FigureDefectWarning, stacklevel=2)
    return found


@contextmanager
def _at_dpi(fig, dpi):
    original = fig.dpi
    fig.dpi = original if dpi is None else dpi
    try:
        yield
    finally:
        fig.dpi = original


@contextmanager
def _checked_draw(fig, found: list):
    """Fill ``found`` with the defects of the next draw of ``fig`` (from its ``draw_event``)."""
    def check(event):
        found[:] = defects(fig, event.renderer)

    connection = fig.canvas.mpl_connect("draw_event", check)
    try:
        yield
    finally:
        fig.canvas.mpl_disconnect(connection)


def defects(fig, renderer) -> list[str]:
    """The defects of ``fig`` as last drawn by ``renderer``."""
    return [*_text_outside_canvas(fig, renderer), *_sparse_log_axes(fig), *_duplicate_legend_labels(fig)]


def _axes_name(ax) -> str:
    title = ax.get_title() or ax.get_title("left") or ax.get_ylabel()
    return f"panel {title!r}" if title else "a panel"


def _drawn_ticks(axis):
    """The ticks an axis drew (inside its view interval), major and minor."""
    return axis._update_ticks()  # matplotlib's own list of the ticks a draw shows


def _texts(fig):
    """(description, artist) of every text-bearing artist a draw shows: figure texts and legends, and per visible
    panel its titles, axis labels, offset texts, tick labels, texts and legend."""
    for text in (getattr(fig, "_suptitle", None), getattr(fig, "_supxlabel", None),
                 getattr(fig, "_supylabel", None), *fig.texts):
        if text is not None:
            yield "figure text", text
    for legend in fig.legends:
        yield "figure legend", legend
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        where = _axes_name(ax)
        for title in (ax._left_title, ax.title, ax._right_title):
            yield f"title {title.get_text()!r}", title
        for axis, letter in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if not axis.get_visible():
                continue
            yield f"{letter} label of {where}", axis.label
            yield f"{letter} offset text of {where}", axis.offsetText
            for tick in _drawn_ticks(axis):
                for label in (tick.label1, tick.label2):
                    yield f"{letter} tick label of {where}", label
        for text in ax.texts:
            yield f"text of {where}", text
        if ax.get_legend() is not None:
            yield f"legend of {where}", ax.get_legend()


def _text_outside_canvas(fig, renderer) -> list[str]:
    canvas = fig.bbox
    defects = []
    for description, artist in _texts(fig):
        if not artist.get_visible() or (isinstance(artist, Text) and not artist.get_text().strip()):
            continue
        box = artist.get_window_extent(renderer)
        if box.width == 0 and box.height == 0:
            continue
        overshoot = max(canvas.x0 - box.x0, box.x1 - canvas.x1, canvas.y0 - box.y0, box.y1 - canvas.y1)
        if overshoot > SLACK_PIXELS:
            if isinstance(artist, Text) and not description.startswith("title"):
                description = description.replace(" of ", f" {artist.get_text()!r} of ", 1)
            defects.append(f"{description} reaches {overshoot:.0f} px past the canvas")
    return defects


def _sparse_log_axes(fig) -> list[str]:
    defects = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis, letter in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if not axis.get_visible() or axis.get_scale() not in ("log", "symlog", "logit"):
                continue
            labels = [label.get_text() for tick in _drawn_ticks(axis)
                      for label, on in ((tick.label1, tick.label1.get_visible()), (tick.label2, tick.label2.get_visible()))
                      if on and label.get_text().strip()]
            if len(set(labels)) < MIN_LOG_TICK_LABELS:
                defects.append(f"log {letter} axis of {_axes_name(ax)} is numbered at {len(set(labels))} place(s) "
                               f"{labels}, fewer than {MIN_LOG_TICK_LABELS}")
    return defects


def _duplicate_legend_labels(fig) -> list[str]:
    legends = [("figure legend", legend) for legend in fig.legends]
    legends += [(f"legend of {_axes_name(ax)}", ax.get_legend()) for ax in fig.axes
                if ax.get_visible() and ax.get_legend() is not None]
    defects = []
    for description, legend in legends:
        counts = Counter(text.get_text() for text in legend.get_texts())
        repeated = sorted(label for label, n in counts.items() if n > 1)
        if repeated:
            defects.append(f"{description} names {repeated} more than once")
    return defects
