"""Matplotlib figures shared by claims, the report and the notebooks.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state, no GUI backend), so they work the same
in a terminal, in CI and in a notebook (where a Figure displays itself).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter, LogLocator, MaxNLocator, NullFormatter

THEORY = dict(color="black", linestyle="--", linewidth=1.4)
SIMULATION = dict(marker="o", linestyle="none", markersize=4, capsize=3)


def figure(ncols: int = 1, nrows: int = 1, width: float = 4.8, height: float = 3.6):
    """A Figure and its axes (a single Axes when 1×1, else a flat array)."""
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    return fig, (axes[0] if axes.size == 1 else axes)


def theory_line(ax, x, y, label="theory", **style):
    aliases = {"ls": "linestyle", "lw": "linewidth", "c": "color"}  # so a short name overrides THEORY's long one
    ax.plot(x, y, label=label, **{**THEORY, **{aliases.get(k, k): v for k, v in style.items()}})


def simulation_points(ax, x, mean, standard_error=None, label="simulation", *, k: float = 2.0, **style):
    """Measured means with ±k SE bars: k = 2 (≈95% intervals) where no test is made on the points, the claim's
    own multiple where it is (|z| < 4: k = 4, so a bar that misses the prediction is a FAIL)."""
    yerr = None if standard_error is None else k * np.asarray(standard_error)
    ax.errorbar(x, mean, yerr=yerr, label=label, **{**SIMULATION, **style})


TOLERANCE = dict(color="tab:green", alpha=0.18, linewidth=0)


def tolerance_band(ax, x, predicted, half_width, *, label="tolerance", discrete: bool = False, width: float = 0.6,
                   **style):
    """What a claim accepts around its prediction, predicted ± half_width, shaded: a measured value inside passes.

    Along an ordered x it is one band (linear between the points); with ``discrete`` (a categorical axis) a box of
    ``width`` around each x. ``half_width`` is the claim's tolerance at each point (k·SE for |z| < k)."""
    x, predicted, half_width = np.broadcast_arrays(*(np.asarray(v, float) for v in (x, predicted, half_width)))
    style = {**TOLERANCE, **style}
    if not discrete:
        ax.fill_between(x, predicted - half_width, predicted + half_width, label=label, **style)
        return
    for j, (xj, pj, hj) in enumerate(zip(x, predicted, half_width)):
        ax.fill_between([xj - width / 2, xj + width / 2], pj - hj, pj + hj, label=label if j == 0 else None, **style)


def residual_panel(ax, x, z, bound: float, title: str, xlabel: str, *, ylabel: str = "$z$ = (measured − predicted) / SE",
                   label: str = "measured", symbol: str = "z", logx: bool = False, **style):
    """Standardised residuals against the claim's bound |z| < ``bound`` (shaded): where a comparison is too tight to
    see on the scale of the values, this shows it. A marker outside the band is a FAIL. ``symbol`` names the
    statistic in the band's label (z, t); ``x=None`` when the caller draws the markers (several series), z then only
    sets the range."""
    z = np.asarray(z, float)
    ax.axhspan(-bound, bound, label=f"tolerance $|{symbol}| < {bound:.3g}$", **TOLERANCE)
    ax.axhline(0.0, color="black", linewidth=0.8)
    if x is not None:
        ax.plot(x, z, **{**dict(marker="o", linestyle="none", markersize=5), **style}, label=label)
    reach = max(1.25 * bound, 1.1 * float(np.nanmax(np.abs(z), initial=0.0)))
    ax.set_ylim(-reach, reach)
    finish(ax, title, xlabel, ylabel, logx=logx)


def finish(ax, title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
        show_all_log_ticks(ax, "x")
    if logy:
        ax.set_yscale("log")
        show_all_log_ticks(ax, "y")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def scaling_figure(x, y, fit, law, title: str):
    """Seed-means (±2 SE) of a sweep, the fitted power/exponential law with its interval, and the theorem's.

    x : (n_x,), y : (n_x, n_seeds); ``fit`` an ExponentFit; ``law`` a ScalingLaw.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    means = y.mean(axis=1)
    ses = y.std(axis=1, ddof=1) / np.sqrt(y.shape[1])
    loglog = law.kind == "loglog"
    xs = np.log(x) if loglog else x

    def line(exponent):
        intercept = np.mean(np.log(means) - exponent * xs)
        return np.exp(intercept + exponent * xs)

    fig, ax = figure()
    simulation_points(ax, x, means, ses, label=f"mean {law.y} over {y.shape[1]} seeds (±2 SE)")
    ax.plot(x, line(fit.estimate), color="tab:blue",
            label=f"fit {fit.estimate:.3f}, {fit.level:.3g} interval [{fit.low:.3f}, {fit.high:.3f}]")
    theory_line(ax, x, line(law.exponent), label=f"theory {law.exponent:g}")
    finish(ax, title, law.x, law.y, logx=loglog, logy=True)
    return fig


def log_spaced(times) -> bool:
    """Whether recorded times are log-spaced (geometric after a possible t = 0, as ``np.geomspace`` records, rounded
    to whole steps or not): the positive times span more than a decade and over a third of them lie in its first
    tenth, where evenly spaced times put a tenth. A log time axis then shows every record; a linear one crowds the
    early ones into its first pixels."""
    t = np.asarray(times, float)
    t = t[np.isfinite(t) & (t > 0)]
    if t.size < 4 or t.max() < 10 * t.min():
        return False
    return np.mean(t < t.max() / 10) > 1 / 3


def spans_decades(values) -> bool:
    """Whether a series belongs on a log axis: positive (but for at most a tenth of its finite values, such as an
    error that reaches exactly 0) and spanning more than two decades in its middle 90%, so that a few values near 0
    at the start (a coordinate that grows from 0 to 1) do not turn its axis logarithmic."""
    values = np.asarray(values, float)
    finite = values[np.isfinite(values)]
    positive = finite[finite > 0]
    if positive.size < 2 or positive.size < 0.9 * max(finite.size, 1):
        return False
    low, high = np.percentile(positive, [5, 95])
    return high > 100 * low


def readable_linear_axis(ax, values) -> None:
    """A linear y axis that shows its numbers as they are: no offset (``1e-13 + 0.25``) and, for a series that is
    constant up to round-off, a range of ±5% around its value rather than one magnified to the round-off."""
    ax.ticklabel_format(axis="y", useOffset=False)
    finite = np.asarray(values, float)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return
    low, high = finite.min(), finite.max()
    scale = max(abs(low), abs(high))
    if high - low <= 1e-9 * scale or scale == 0:
        pad = 0.05 * scale if scale > 0 else 1.0
        ax.set_ylim(low - pad, high + pad)


def label_of(labels, key: str) -> str:
    """The readable label of a record key: its own, or that of its pattern for a numbered key (``share_3`` by
    ``share_{k}``), else the key itself."""
    labels = labels or {}
    if key in labels:
        return labels[key]
    stem, _, number = key.rpartition("_")
    if number.isdigit() and f"{stem}_{{k}}" in labels:
        return labels[f"{stem}_{{k}}"].format(k=number)
    return key


def trajectory_figure(trajectory, title: str, time_label: str, *, labels=None, log_time: bool | None = None,
                      max_panels: int = 6):
    """Every named metric of a Trajectory against time, one panel each (at most ``max_panels``), titled by
    ``labels`` (record key → readable label; the key where none is given).

    The time axis is logarithmic when the records are log-spaced (:func:`log_spaced`; ``log_time`` overrides). A
    metric that :func:`spans_decades` is drawn on a log axis, where exponential convergence is a straight line
    against a linear time axis and a power law one against a log time axis; a narrower span stays linear, so its
    axis keeps readable numbers. Each panel's ``gid`` is its metric's key."""
    names = list(trajectory.metrics)[:max_panels]
    if not names:
        raise ValueError("the trajectory records no metric to plot")
    ncols = min(3, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = figure(ncols=ncols, nrows=nrows, width=3.8, height=3.0)
    axes = np.atleast_1d(axes)
    times = np.asarray(trajectory.times, float)
    logx = log_spaced(times) if log_time is None else bool(log_time)
    shown_times = times > 0 if logx else np.ones(times.size, bool)
    for ax, name in zip(axes, names):
        values = np.asarray(trajectory.metrics[name], float)
        log = spans_decades(values)
        shown = np.where(values > 0, values, np.nan) if log else values
        ax.plot(times[shown_times], shown[shown_times], marker="." if values.size <= 60 else None)
        ax.set_xlim(times[shown_times][0], times[shown_times][-1])
        for boundary in trajectory.info.get("boundaries", ()):  # stages of a multi-stage algorithm
            ax.axvline(boundary, color="gray", linestyle=":", linewidth=1)
        ax.set_gid(name)
        finish(ax, label_of(labels, name), time_label, "", logx=logx, logy=log)
        if not log:
            readable_linear_axis(ax, values)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return fig


# ==================================================================================================
# Helpers for claim figures: legends off the data, predicted rates, two scales on one figure
# ==================================================================================================


def legend_outside(ax, fontsize: float = 8):
    """Put the legend of ``ax`` to the right of its axes, where it cannot cover data (the constrained layout
    shrinks the axes to make room). Call after :func:`finish`, which puts one inside."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def legend_below(ax, fontsize: float = 8, ncols: int = 1):
    """Put the legend of ``ax`` under its axes (for panels side by side, where a legend to the right would sit on
    the next panel). Call after :func:`finish`."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=ncols, frameon=False)


def acceptance_intervals(ax, x, measured, bounds, *, color, marker, label):
    """Measured ratios as markers, each beside the interval that accepts the predicted value (drawn as a bar from
    bounds[:, 0] to bounds[:, 1]; a marker outside its bar is a rejection)."""
    bounds = np.asarray(bounds, float)
    # an unbounded upper end (a prediction too uncertain to bound the ratio) is drawn to twice the largest value
    top = 2 * max(np.max(measured), np.max(bounds[np.isfinite(bounds)], initial=1.0))
    bounds = np.where(np.isfinite(bounds), bounds, top)
    ax.vlines(x, bounds[:, 0], bounds[:, 1], color=color, linewidth=6, alpha=0.25,
              label=f"{label}: acceptance interval")
    ax.plot(x, measured, color=color, marker=marker, linestyle="none", label=f"{label}: measured")


def predicted_rate(ax, x, x0: float, y0: float, exponent: float, label: str, *, kind: str = "power", **style):
    """The predicted rate as a theory line through (x0, y0): y = y0·(x/x0)^exponent (``kind="power"``, a straight
    line of that slope on log-log axes) or y = y0·exp(exponent·(x − x0)) (``"exponential"``, straight on a
    log-y axis against linear x)."""
    x = np.asarray(x, float)
    if kind == "power":
        y = y0 * (x / x0) ** exponent
    elif kind == "exponential":
        y = y0 * np.exp(exponent * (x - x0))
    else:
        raise ValueError(f"kind must be 'power' or 'exponential', got {kind!r}")
    theory_line(ax, x, y, label=label, **style)


def show_all_log_ticks(ax, axis: str = "y"):
    """Numbers a reader can read on a log axis, however little it spans: decades when at least three fall inside
    the view (matplotlib's own choice of which), else ticks at 1, 2, 5 × 10^k or 1, 2, 3, 5 × 10^k if three of
    those do, else (an axis spanning about a decade or less) evenly spaced round numbers. The choice is made at
    every draw, so data drawn later and new limits are followed; :func:`finish` installs it on every log axis.
    Minor ticks stay unlabelled."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(_ReadableLogLocator())
    target.set_major_formatter(_ReadableLogFormatter())
    target.set_minor_formatter(NullFormatter())


LOG_SUBS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0))
MIN_LOG_LABELS = 3


def _log_subs(low: float, high: float) -> tuple | None:
    """The coarsest of :data:`LOG_SUBS` that puts at least three ticks inside [low, high]; None if none does (an
    axis spanning about a decade or less, better numbered evenly)."""
    decades = np.arange(np.floor(np.log10(low)), np.ceil(np.log10(high)) + 1)
    for subs in LOG_SUBS:
        if sum(low <= m * 10.0**e <= high for e in decades for m in subs) >= MIN_LOG_LABELS:
            return subs
    return None


class _ReadableLogLocator(LogLocator):
    """Major ticks of :func:`show_all_log_ticks`."""

    def __init__(self):
        super().__init__(base=10.0, subs=(1.0,))

    def tick_values(self, vmin, vmax):
        low, high = sorted((vmin, vmax))
        if not (np.isfinite(low) and np.isfinite(high)) or low <= 0 or high <= low:
            return super().tick_values(vmin, vmax)
        subs = _log_subs(low, high)
        if subs is None:  # a decade or less: evenly spaced round numbers, as on a linear axis, cover it best
            for bins in (4, 6, 9, 12):
                ticks = MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
                if np.sum((ticks >= low) & (ticks <= high)) >= MIN_LOG_LABELS:
                    break
            return ticks[ticks > 0]
        if subs == (1.0,):
            return super().tick_values(vmin, vmax)
        decades = np.arange(np.floor(np.log10(low)) - 1, np.ceil(np.log10(high)) + 2)
        return np.array([m * 10.0**e for e in decades for m in subs])


class _ReadableLogFormatter(Formatter):
    """Labels of :func:`show_all_log_ticks`: 10^k when every tick in view is a decade, else :func:`_log_tick_label`."""

    decades_only = True

    def set_locs(self, locs):
        super().set_locs(locs)
        low, high = sorted(self.axis.get_view_interval()) if self.axis is not None else (-np.inf, np.inf)
        inside = [v for v in locs if v > 0 and low <= v <= high]
        self.decades_only = all(abs(np.log10(v) - np.round(np.log10(v))) < 1e-9 for v in inside)

    def __call__(self, value, position=None):
        if value <= 0:
            return ""
        if self.decades_only:
            return rf"$\mathdefault{{10^{{{int(np.round(np.log10(value)))}}}}}$"
        return _log_tick_label(value)


def _log_tick_label(value: float, _position=None) -> str:
    """A tick number: plain between 10⁻⁴ and 10⁵ (0.0005, 200), else in mathtext (6×10⁵)."""
    if value <= 0:
        return ""
    if 1e-4 <= value < 1e5:
        return f"{value:g}"
    exponent = int(np.floor(np.log10(value) + 1e-9))
    mantissa = value / 10.0**exponent
    if abs(mantissa - 1) < 1e-9:
        return rf"$10^{{{exponent}}}$"
    return rf"${mantissa:g}\times10^{{{exponent}}}$"


def trajectory_figure_with_rates(trajectory, title: str, time_label: str, rates: dict, *, labels=None,
                                 window: float = 1e-4):
    """:func:`trajectory_figure` with each predicted exponential rate drawn beside its metric, against linear time
    (where an exponential rate is a straight line on the metric's log axis).

    rates : metric name -> (rate λ, label): a theory line ∝ exp(−λt) on that metric's panel, anchored at the first
        record where the metric has fallen to ``window`` times its initial value (past the transient, where the
        local rate governs), or at the last record if it never does. The computed trajectory becomes markers."""
    fig = trajectory_figure(trajectory, title, time_label, labels=labels, log_time=False)
    panels = {ax.get_gid(): ax for ax in fig.axes if ax.get_visible()}
    times = np.asarray(trajectory.times, float)
    for name, (rate, label) in rates.items():
        ax = panels.get(name)
        if ax is None:
            continue
        values = np.asarray(trajectory.metrics[name], float)
        for line in ax.get_lines():  # the computed trajectory: markers, so the theory line stands apart
            line.set_marker(".")
            line.set_linestyle("none")
            line.set_label("computed")
        below = np.flatnonzero((values > 0) & (values <= window * values[0]))
        anchor = below[0] if below.size else values.size - 1
        shown = times >= times[anchor] - 0.15 * (times[-1] - times[anchor])
        data_range = ax.get_ylim()
        predicted_rate(ax, times[shown], times[anchor], values[anchor], -rate, label, kind="exponential")
        ax.set_ylim(*data_range)  # keep the data's range: the line may run past it
        ax.legend(fontsize=7, loc="upper right")
    return fig


def stage_boundaries(ax, boundaries, names=None):
    """Dotted vertical lines at the stage boundaries of a multi-stage run, with the stage names along the top."""
    boundaries = list(boundaries)
    for boundary in boundaries:
        ax.axvline(boundary, color="gray", linestyle=":", linewidth=1)
    if names:
        left, right = ax.get_xlim()
        edges = [left, *boundaries, right]
        for name, a, b in zip(names, edges, edges[1:]):
            ax.text((a + b) / 2, 0.98, name, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=7, color="dimgray")
