"""Theory beside simulation: what ``attnflow simulate SYSTEM --compare`` draws.

A system's ``compare`` (the System contract, attnflow.validation.systems) turns one minibatch run into a
:class:`Comparison`: the run, the population (or reduced) prediction of the same quantities in the run's own time
units, the diffusion band where the system has one, limits and predicted rates, and a note where the two
legitimately differ. :func:`comparison_figure` draws it, one panel per compared quantity.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import numpy as np

from attnflow.dynamics.montecarlo import Trajectory

from . import plots

__all__ = ["Comparison", "NoPrediction", "comparison_figure", "RATE_KINDS"]

RATE_KINDS = ("power", "exponential")
SIMULATION_STYLE = dict(color="tab:blue", marker=".", markersize=5, linewidth=0.8)
BAND_STYLE = dict(color="gray", alpha=0.3, linewidth=0)
LEVEL_STYLE = dict(color="tab:red", linestyle=":", linewidth=1.4)
RATE_STYLE = dict(color="tab:orange", linestyle="-.", linewidth=1.4)
SPARSE_PREDICTION = 30  # a prediction of at most this many points is drawn with its points marked


class NoPrediction(ValueError):
    """Raised by a system's ``compare`` for a run the theory has no prediction of (an algorithm without a
    population counterpart); the message says why. ``simulate --plot`` then draws the run alone and says so."""


@dataclass
class Comparison:
    """A minibatch run and the theory's prediction of it.

    simulation : the run, with any metric the comparison derives from its states (ξ₁ from W, α from (V, Q), …).
    metrics : the quantities compared, one panel each, in order; every one is a metric of ``simulation`` and has at
        least one theory artist (a prediction, a band, a level or a rate).
    prediction : the population or reduced dynamics in the run's time units, its metrics named as the run's (None
        when the theory predicts only limits or rates).
    label : the prediction's legend entry (what it is: "population GD at the run's η", …).
    bands : metric → (times, low, high), the diffusion band of the runs around the prediction.
    levels : metric → (value, label), a predicted limit drawn as a horizontal line.
    rates : metric → (kind, exponent, label), a predicted rate drawn through the run's last record: ``power``
        y ∝ t^exponent (the panel becomes log-log) or ``exponential`` y ∝ e^{exponent·t} (log y, linear t).
    note : why the two differ where they legitimately do, or what the prediction leaves out.
    simulation_label : the run's legend entry.
    """

    simulation: Trajectory
    metrics: tuple
    prediction: Trajectory | None = None
    label: str = "population prediction"
    bands: dict = field(default_factory=dict)
    band_label: str = "diffusion band (±2 sd)"
    levels: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)
    note: str = ""
    simulation_label: str = "minibatch run"

    def __post_init__(self):
        self.metrics = tuple(self.metrics)
        if not self.metrics:
            raise ValueError("a comparison needs at least one compared metric")
        predicted = self.prediction.metrics if self.prediction is not None else {}
        for name in self.metrics:
            if name not in self.simulation.metrics:
                raise ValueError(f"compared metric {name!r} is not recorded by the run ({sorted(self.simulation.metrics)})")
            if not (name in predicted or name in self.bands or name in self.levels or name in self.rates):
                raise ValueError(f"compared metric {name!r} has no prediction, band, level or rate")
        for name, (kind, _, _) in self.rates.items():
            if kind not in RATE_KINDS:
                raise ValueError(f"rate of {name!r}: kind must be one of {RATE_KINDS}, got {kind!r}")

    def final_values(self) -> dict:
        """The prediction's value at the run's last recorded time, per compared metric that has one."""
        out = {}
        if self.prediction is None:
            return out
        t_end = float(self.simulation.times[-1])
        times = np.asarray(self.prediction.times, float)
        for name in self.metrics:
            if name in self.prediction.metrics and times[0] <= t_end <= times[-1]:
                out[name] = float(np.interp(t_end, times, np.asarray(self.prediction.metrics[name], float)))
        return out


def _positive_times(times, logx: bool) -> np.ndarray:
    times = np.asarray(times, float)
    return times > 0 if logx else np.ones(times.size, bool)


def _draw_rate(ax, times, values, kind, exponent, label):
    """The predicted rate through the run's last finite (and, for the log axis it implies, positive) record."""
    usable = np.flatnonzero(np.isfinite(values) & (values > 0) & (times > 0 if kind == "power" else True))
    if usable.size < 2:
        return
    anchor = usable[-1]
    shown = times[usable]
    plots.predicted_rate(ax, shown, times[anchor], values[anchor], exponent, label, kind=kind, **RATE_STYLE)
    ax.get_lines()[-1].set_gid("prediction")


def comparison_figure(comparison: Comparison, title: str, time_label: str, *, labels=None):
    """One panel per compared metric: the run (blue markers), the prediction (black dashes, its points marked when
    there are few), the band (grey), limits (red dots) and predicted rates (orange dash-dots through the run's last
    record), one legend for the figure and the note under the title.

    The time axis is logarithmic when the run's records are log-spaced or a power-law rate is drawn; a panel's y
    axis is logarithmic when what it shows spans more than two decades or a rate is drawn (linear time for an
    exponential one). Artists carry a ``gid``: ``simulation``, ``prediction`` or ``band``."""
    names = list(comparison.metrics)
    ncols = min(3, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = plots.figure(ncols=ncols, nrows=nrows, width=max(4.0, 6.5 / ncols), height=3.1)
    axes = np.atleast_1d(axes)
    run = comparison.simulation
    run_times = np.asarray(run.times, float)
    prediction = comparison.prediction
    for ax, name in zip(axes, names):
        rate = comparison.rates.get(name)
        logx = (rate[0] == "power") if rate else plots.log_spaced(run_times)
        values = np.asarray(run.metrics[name], float)
        drawn = [values]  # every series on the panel; the first one or two (run, prediction) choose the y scale
        leading = 1
        keep = _positive_times(run_times, logx)
        line, = ax.plot(run_times[keep], values[keep], label=comparison.simulation_label, **SIMULATION_STYLE)
        line.set_gid("simulation")
        if prediction is not None and name in prediction.metrics:
            p_times = np.asarray(prediction.times, float)
            p_values = np.asarray(prediction.metrics[name], float)
            p_keep = _positive_times(p_times, logx)
            marks = dict(marker="x", markersize=5) if p_times.size <= SPARSE_PREDICTION else {}
            plots.theory_line(ax, p_times[p_keep], p_values[p_keep], label=comparison.label, **marks)
            ax.get_lines()[-1].set_gid("prediction")
            drawn.append(p_values)
            leading = 2
        band = comparison.bands.get(name)
        if band is not None:
            band = tuple(np.asarray(a, float) for a in band)
            drawn += [band[2]]
        if name in comparison.levels:
            value, level_label = comparison.levels[name]
            ax.axhline(value, label=level_label, **LEVEL_STYLE).set_gid("prediction")
            drawn.append(np.array([value]))
        everything = np.concatenate([np.ravel(d) for d in drawn])
        finite = everything[np.isfinite(everything)]
        # a log y axis when the run or the prediction spans decades (a band's lower edge may reach 0 or below: it
        # then runs to the axis' bottom), or a rate is drawn, which is straight only there
        logy = any(plots.spans_decades(d) for d in drawn[:leading]) or (rate is not None and finite.size > 0
                                                                   and np.mean(finite > 0) >= 0.9)
        if band is not None:
            b_times, low, high = band
            b_keep = _positive_times(b_times, logx)
            if logy:  # an edge at or below 0 runs to the bottom of the axis
                positive = everything[np.isfinite(everything) & (everything > 0)]
                low = np.where(low > 0, low, positive.min() / 10 if positive.size else np.nan)
            ax.fill_between(b_times[b_keep], low[b_keep], high[b_keep], label=comparison.band_label,
                            **BAND_STYLE).set_gid("band")
        if rate is not None:
            data_range = None
            if logy:
                positive = everything[np.isfinite(everything) & (everything > 0)]
                data_range = (positive.min() / 1.5, positive.max() * 1.5) if positive.size else None
            _draw_rate(ax, run_times, values, *rate)
            if data_range:
                ax.set_ylim(*data_range)  # the data's range: a rate line may run far past it
        if logy:  # values <= 0 cannot be drawn on a log axis: hidden, not clipped to the axis' edge
            for artist in ax.get_lines():
                y = np.asarray(artist.get_ydata(), float)
                artist.set_ydata(np.where(y > 0, y, np.nan))
        visible_times = run_times[keep]
        if visible_times.size > 1:
            ax.set_xlim(visible_times[0], visible_times[-1])
        for boundary in run.info.get("boundaries", ()):  # stages of a multi-stage algorithm
            ax.axvline(boundary, color="gray", linestyle=":", linewidth=1)
        ax.set_gid(name)
        plots.finish(ax, plots.label_of(labels, name), time_label, "", logx=logx, logy=logy)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        if not logy:
            plots.readable_linear_axis(ax, everything)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    handles = {}
    for ax in axes[:len(names)]:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(ncols, 2, len(handles))
               if ncols < 3 else min(3, len(handles)),
               fontsize=8, frameon=False)
    width = int(12 * fig.get_figwidth())  # characters of the note per line at its font size
    heading = title if not comparison.note else title + "\n" + "\n".join(textwrap.wrap(comparison.note, width))
    fig.suptitle(heading, fontsize=9 if comparison.note else 11)
    return fig
