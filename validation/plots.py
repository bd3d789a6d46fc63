"""Matplotlib figures shared by claims, the report and the notebooks.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state, no GUI backend), so they work the same
in a terminal, in CI and in a notebook (where a Figure displays itself).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

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


def simulation_points(ax, x, mean, standard_error=None, label="simulation", **style):
    """Measured means with ±2 SE bars (≈95% intervals)."""
    yerr = None if standard_error is None else 2 * np.asarray(standard_error)
    ax.errorbar(x, mean, yerr=yerr, label=label, **{**SIMULATION, **style})


def finish(ax, title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    # matplotlib's log formatter labels minor ticks only when the axis spans about a decade or less, so a short
    # log axis keeps its numbers and a long one is not crowded
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
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
            label=f"fit {fit.estimate:.3f}, {fit.level:.0%} CI [{fit.low:.3f}, {fit.high:.3f}]")
    theory_line(ax, x, line(law.exponent), label=f"theory {law.exponent:g}")
    finish(ax, title, law.x, law.y, logx=loglog, logy=True)
    return fig


def trajectory_figure(trajectory, title: str, time_label: str, *, max_panels: int = 6):
    """Every named metric of a Trajectory against time, one panel each (at most ``max_panels``).

    A metric that is positive (but for at most a tenth of its records, such as an error that reaches exactly 0)
    and spans more than two decades is drawn on a log axis, where exponential convergence is a straight line
    against the linear time axis; a narrower span stays linear, so its axis keeps readable numbers."""
    names = list(trajectory.metrics)[:max_panels]
    if not names:
        raise ValueError("the trajectory records no metric to plot")
    ncols = min(3, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = figure(ncols=ncols, nrows=nrows, width=3.8, height=3.0)
    axes = np.atleast_1d(axes)
    for ax, name in zip(axes, names):
        values = np.asarray(trajectory.metrics[name], float)
        finite = values[np.isfinite(values)]
        positive = finite[finite > 0]
        log = positive.size >= 0.9 * max(finite.size, 1) and positive.size > 1 and positive.max() > 100 * positive.min()
        shown = np.where(values > 0, values, np.nan) if log else values
        ax.plot(trajectory.times, shown, marker="." if values.size <= 60 else None)
        ax.set_xlim(trajectory.times[0], trajectory.times[-1])
        for boundary in trajectory.info.get("boundaries", ()):  # stages of a multi-stage algorithm
            ax.axvline(boundary, color="gray", linestyle=":", linewidth=1)
        finish(ax, name, time_label, name, logy=log)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return fig


# ===========================================================================================

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
