"""Claims of Li, Huang, Ildiz, Rawat & Oymak, *Mechanics of Next Token Prediction with Self-Attention* (AISTATS
2024): GD on the next-token log-loss converges to W = R·W^svm + W^fin, where W^svm is the Graph-SVM of the
token-priority graphs' SCCs and W^fin the minimiser of the loss restricted to the cycles (docs/next_token_scc.md,
§8 lists the claims).

The theory side is convex (SCCs, the Graph-SVM, W^fin); the simulation side is GD or normalised GD on the exact
empirical loss of the same data set. The ensembles (random data sets and initialisations) are drawn from the run's
instance seed (:func:`attnflow.seeding.instance`) and computed once per run, so the claims of one run share them.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as scipy_stats

from attnflow import seeding
from attnflow.closed_forms import certificates
from attnflow.closed_forms import next_token_scc as cf
from attnflow.closed_forms.next_token_scc import NTPProblem
from attnflow.dynamics import next_token_scc as dyn
from attnflow.dynamics.montecarlo import Trajectory

from . import plots, rules, stats
from .claims import Outcome, claim
from .rules import all_of
from .systems import System

PAPER = "Li, Huang, Ildiz, Rawat & Oymak, AISTATS 2024 (arXiv:2403.08081)"
LEVEL = 0.95
from attnflow.closed_forms.certificates import ACCUMULATED_ROUND_OFF as ROUND_OFF  # identities of the exact solvers (NNLS, SVD), relative to O(1) quantities
CONFIGS = ("paper", "mixed")
GD_QUICK = dict(instances=10, steps=20000)
GD_FULL = dict(instances=100, steps=100000)
NGD_PAPER_QUICK = dict(instances=10, steps=4000)
NGD_PAPER_FULL = dict(instances=100, steps=4000)
NGD_STALL_QUICK = dict(instances=10, steps=8000)
NGD_STALL_FULL = dict(instances=100, steps=16000)


def _fraction(k: int, n: int) -> str:
    low, high = stats.clopper_pearson(k, n, LEVEL)
    return f"{k}/{n} (95% CP [{low:.2f}, {high:.2f}])"


def _make(config: str, seed) -> NTPProblem:
    return NTPProblem.paper(seed=seed) if config == "paper" else NTPProblem.mixed(seed=seed)


def _records(steps: int) -> np.ndarray:
    return np.unique(np.concatenate([dyn.record_steps(steps, 40), [steps // 4, steps // 2, steps]])).astype(np.int64)


@functools.lru_cache(maxsize=8)
def _ensemble_cached(entropy, config, algorithm, instances, steps, eta):
    root = seeding.named(np.random.SeedSequence(entropy), f"next_token_scc.{config}")
    record = _records(steps)
    out = []
    for j in range(instances):
        parts = seeding.spawn(seeding.child(root, j), 2)
        problem = _make(config, parts[0])
        ref = dyn.reference(problem)
        W0 = np.zeros((problem.d, problem.d)) if algorithm == "gd" else dyn.initial_W(problem, seed=parts[1])
        run = dyn.train(problem, W0, eta=eta, normalise=algorithm == "ngd", record=record)
        out.append(dict(problem=problem, ref=ref, run=run, m=dyn.metrics(run, ref), W0=W0))
    return out


def ensemble(seed, config: str, algorithm: str, instances: int, steps: int, eta: float) -> list[dict]:
    """``instances`` random data sets of ``config`` (paper or mixed, docs/next_token_scc.md §7) with their theory
    objects and a GD (from 0) or NGD (from the default init) run; cached per run seed."""
    return _ensemble_cached(seeding.instance(seed).entropy, config, algorithm, instances, steps, eta)


def _at(runs, key, step):
    """Metric ``key`` of every run at record ``step``."""
    return np.array([e["m"][key][np.searchsorted(e["run"].times, step)] for e in runs])


def _slope(runs, key, steps):
    """Per-run log-log slope of metric ``key`` between steps/4 and steps."""
    return np.log(_at(runs, key, steps) / _at(runs, key, steps // 4)) / np.log(4.0)


RATE_WINDOW = (-1.3, -0.7)  # a 1/τ law: ±0.3 about −1 allows the next-order terms over one quadrupling (§6.1)


def _median_rate(rows, what: str, basis: str) -> rules.Rule:
    """Each configuration's median log-log slope of ``what`` over [τ/4, τ] strictly inside RATE_WINDOW."""
    return all_of(*(rules.within(r["median_slope"], *RATE_WINDOW, strict=True,
                                 what=f"{r['config']}: median log-log slope of {what} over [τ/4, τ]", basis=basis)
                    for r in rows))


def _median_figure(groups, key, title, ylabel, *, theory=None, level=None):
    """Median over runs of metric ``key`` against the step (markers), one series per (label, runs); ``theory``:
    (label, function of k) drawn as a line through the last median; ``level``: (label, value) drawn across."""
    def draw():
        fig, ax = plots.figure()
        for j, ((label, runs), marker) in enumerate(zip(groups, "os^v")):
            t = runs[0]["run"].times[1:]
            y = np.median([e["m"][key][1:] for e in runs], axis=0)
            ax.plot(t, np.maximum(y, 1e-300), marker, ms=3, color=f"C{j}", label=f"{label} (median over {len(runs)})")
            if theory is not None:  # drawn over the last two decades, where the asymptotic law applies
                late = t >= t[-1] / 100
                line = theory[1](t[late])
                plots.theory_line(ax, t[late], line * y[-1] / line[-1], color=f"C{j}", label=f"{theory[0]} ({label})")
        if level is not None:
            ax.axhline(level[1], color="gray", ls=":", label=level[0])
        plots.finish(ax, title, "step $\\tau$", ylabel, logx=True, logy=True)
        if level is not None:  # five entries would cover the curves
            plots.legend_below(ax, ncols=2)
        return fig
    return draw


# ==================================================================================================
# X1: fully cyclic data
# ==================================================================================================


CYCLIC_LIMIT = ("GD on a strictly convex problem restricted to S_all converges linearly (docs/next_token_scc.md "
                "§6.2); 3000 steps put it at round-off; deterministic")


@functools.lru_cache(maxsize=2)
def _toy_run(entropy, steps):
    seed = np.random.SeedSequence(entropy)
    problem = NTPProblem.cyclic_toy(seed=seeding.named(seed, "toy"))
    W0 = dyn.initial_W(problem, seed=seeding.named(seed, "init"))
    return problem, W0, dyn.train(problem, W0, eta=1.0, steps=steps, records=30)


@claim("next_token_scc.cyclic_finite_limit",
       reference=f"{PAPER}: global convergence theorem, the case with no strict priority; docs/next_token_scc.md §6.2",
       statement="When every token-priority graph is strongly connected (the fully cyclic toy), W^svm = 0 and GD "
                 "converges to a finite point: the attention equals the label frequencies (1/6, 1/3, 1/2) and the loss "
                 "the label entropy.",
       quick=dict(steps=3000), full=dict(steps=20000))
def cyclic_finite_limit(seed, steps):
    problem, W0, run = _toy_run(seeding.instance(seed).entropy, steps)
    svm = cf.graph_svm(problem)
    s = cf.attention(problem, run.final["W"])
    # the label frequencies among the sequences with the same last token: (1/6, 1/3, 1/2) in each group
    target = np.array([[np.mean(problem.labels[problem.last == problem.last[i]] == a) for a in range(3)]
                       for i in range(problem.n)])
    per_token = np.array([[s[i, problem.ids[i] == a].sum() for a in range(3)] for i in range(problem.n)])
    attention_error = float(np.abs(per_token - target).max())
    entropy = float(-(target[0] * np.log(target[0])).sum())
    loss_error = abs(run.metrics["loss"][-1] - entropy)
    predicted_error = float(np.abs(cf.predicted_attention(problem) - s).max())

    def figure():
        fig, ax = plots.figure()
        ax.plot(run.times[1:], np.maximum(run.metrics["loss"][1:] - entropy, 1e-17), "o", ms=3,
                label="GD: $L(W_\\tau) - H(y)$ (round-off: at most $10^{-17}$ drawn there)")
        ax.axhline(1e-10, color="tab:red", ls=":", label="tolerance on $|L - H(y)|$ at the end: $10^{-10}$")
        plots.finish(ax, "fully cyclic toy: loss against the label entropy", "step $\\tau$",
                     "$L(W_\\tau) - H(y)$", logx=True, logy=True)
        plots.legend_below(ax)
        return fig
    return Outcome(measured=dict(svm_norm=svm.value, attention_error=attention_error, loss_error=loss_error,
                                 predicted_attention_error=predicted_error, strict_edges=len(svm.strict)),
                   predicted=dict(svm_norm=0.0, attention_error=0.0, loss_error=0.0, strict_edges=0),
                   labels=dict(svm_norm="‖W^svm‖", attention_error="max |s − (1/6, 1/3, 1/2)|",
                               loss_error="|L(W_τ) − H(y)|", predicted_attention_error="max |s − softmax(l^fin)|",
                               strict_edges="strict edges"),
                   rule=all_of(rules.condition(svm.value == 0, "‖W^svm‖ = 0 exactly", basis=CYCLIC_LIMIT),
                               rules.at_most([attention_error, predicted_error], 1e-6, strict=True,
                                             what="both attention errors", basis=CYCLIC_LIMIT),
                               rules.at_most(loss_error, 1e-10, strict=True, what="|L(W_τ) − H(y)|",
                                             basis=CYCLIC_LIMIT)),
                   figure=figure)


@claim("next_token_scc.frozen_component",
       reference=f"{PAPER}: §2 of docs/next_token_scc.md (the gradient lies in S_all); docs/next_token_scc.md §2.2",
       statement="The component of W outside S_all = span{(e_a − e_b)e_k^T : a, b co-occur in a sequence ending in k} "
                 "never moves under GD.",
       quick=dict(steps=3000), full=dict(steps=20000))
def frozen_component(seed, steps):
    problem, W0, run = _toy_run(seeding.instance(seed).entropy, steps)
    rows = [np.kron(problem.E[a] - problem.E[b], problem.E[k]) for i in range(problem.n)
            for k in [problem.last[i]] for a in problem.ids[i] for b in problem.ids[i] if a != b]
    _, sv, Vt = np.linalg.svd(np.array(rows))
    outside = Vt[int(np.sum(sv > 1e-12 * sv.max())):]
    moved = float(np.abs(outside @ (run.final["W"] - W0).ravel()).max())
    return Outcome(measured=dict(outside_change=moved, dim_outside=outside.shape[0]),
                   predicted=dict(outside_change=0.0),
                   labels=dict(outside_change="max |Π_{S_all^⊥}(W_τ − W_0)|", dim_outside="dim S_all^⊥"),
                   rule=rules.round_off(moved, 1e-10, what="max |Π_{S_all^⊥}(W_τ − W_0)|",
                                        basis="exact identity (∇L ∈ S_all); round-off accumulated over the steps"),
                   notes="A pure identity: a figure would show a flat line at round-off.")


# ==================================================================================================
# X2: structure, and GD against the theory
# ==================================================================================================


SOLVER_IDENTITIES = "exact identities of the solvers (NNLS, SVD); deterministic"


@claim("next_token_scc.graph_svm_structure",
       reference=f"{PAPER}: Graph-SVM definition; docs/next_token_scc.md §4.1–§4.2",
       statement="The Graph-SVM is feasible, W^svm ⟂ S_fin, and the span of its equality rows is S_fin, on 10 "
                 "instances of each configuration (paper, mixed).",
       quick=dict(instances=10), full=dict(instances=100))
def graph_svm_structure(seed, instances):
    rows = []
    for config in CONFIGS:
        root = seeding.named(seeding.instance(seed), f"structure.{config}")
        for j in range(instances):
            problem = _make(config, seeding.child(root, j))
            graphs = cf.priority_graphs(problem)
            sol = cf.graph_svm(problem, graphs=graphs)
            basis = cf.sfin_basis(problem, graphs)
            orth = float(np.abs(basis.T @ sol.W.ravel()).max()) if basis.size else 0.0
            # span(A) = S_fin: same rank, and A lies in S_fin
            rank_A = int(np.linalg.matrix_rank(sol.A)) if len(sol.A) else 0
            residual = float(np.abs(sol.A - (sol.A @ basis) @ basis.T).max()) if len(sol.A) else 0.0
            margin = float(sol.margins.min() - 1) if len(sol.margins) else 0.0
            kkt = float(np.abs(sol.W.ravel() - sol.G.T @ sol.lam - sol.A.T @ sol.mu).max())
            rows.append(dict(config=config, strict=len(sol.strict), equalities=len(sol.equalities),
                             dim_sfin=basis.shape[1], rank_equalities=rank_A, orthogonality=orth,
                             span_residual=residual, min_margin_minus_1=margin, kkt=kkt))
    worst = max(max(r["orthogonality"], r["span_residual"], -r["min_margin_minus_1"], r["kkt"]) for r in rows)
    same_rank = all(r["dim_sfin"] == r["rank_equalities"] for r in rows)
    return Outcome(measured=dict(worst_identity=worst, ranks_equal=same_rank,
                                 median_dim_sfin_mixed=float(np.median([r["dim_sfin"] for r in rows
                                                                        if r["config"] == "mixed"]))),
                   predicted=dict(worst_identity=0.0, ranks_equal=True),
                   labels=dict(worst_identity="max of |<W^svm, S_fin>|, span residual, margin deficit, KKT residual",
                               ranks_equal="rank(equality rows) = dim S_fin",
                               median_dim_sfin_mixed="median dim S_fin (mixed)"),
                   rule=all_of(rules.round_off(worst, ROUND_OFF, what="largest |<W^svm, S_fin>|, span residual, "
                                               "margin deficit or KKT residual", basis=SOLVER_IDENTITIES),
                               rules.condition(same_rank, "rank(equality rows) = dim S_fin in every instance",
                                               basis=SOLVER_IDENTITIES)),
                   details=rows,
                   notes="Identities to round-off; no figure adds to the table.")


def _gd(seed, config, instances, steps):
    return ensemble(seed, config, "gd", instances, steps, 1.0)


# The population median of 1 − corr at τ = 2·10⁴ is tested at this level by an exact one-sided sign test, per
# configuration at DIRECTION_ALPHA (docs/next_token_scc.md §6.1).
DIRECTION_LEVEL = 0.03
DIRECTION_ALPHA = 1e-3
DIRECTION_TREND = ("1 − corr ≈ ‖W_⊥‖²/(2‖W^svm‖² log²τ) (docs/next_token_scc.md §6.1) with ‖W_⊥‖ ≲ ‖W^svm‖ gives "
                   "≈ 0.005–0.03 at τ = 2·10⁴, but no bound on a random instance")


@claim("next_token_scc.gd_direction",
       reference=f"{PAPER}: global convergence theorem (hard retrieval); docs/next_token_scc.md §5, §6.1",
       statement="GD (η = 1, W_0 = 0): 1 − corr(W_τ, W^svm) decreases — the median over instances at every record "
                 f"past τ = 100, every instance over [τ/4, τ] — and the median over random instances is not shown to "
                 f"exceed {DIRECTION_LEVEL} at τ (an exact sign test at {DIRECTION_ALPHA:g} per configuration, a "
                 "detector of gross failure: little power near the level with 10 instances).",
       quick=GD_QUICK, full=GD_FULL)
def gd_direction(seed, instances, steps):
    rows, groups, parts = [], [], []
    for config in CONFIGS:
        runs = [e for e in _gd(seed, config, instances, steps) if e["ref"].svm.value > 0]
        groups.append((config, runs))
        t = runs[0]["run"].times
        med = np.median([e["m"]["one_minus_corr"] for e in runs], axis=0)
        late = t >= 100
        monotone = bool(np.all(np.diff(med[late]) < 0))
        end = _at(runs, "one_minus_corr", steps)
        decreasing = int(np.sum(end < _at(runs, "one_minus_corr", steps // 4)))
        above = int(np.sum(end > DIRECTION_LEVEL))
        critical, rate = stats.sign_test_threshold(len(runs), DIRECTION_ALPHA)
        power = float(scipy_stats.binom.sf(critical - 1, len(runs), 0.9))
        # the sign tests' rates are the only chance failures: their sum is the claim's nominal rate
        parts += [rules.condition(monotone, f"{config}: median strictly decreasing at every record past τ = 100",
                                  basis=DIRECTION_TREND),
                  rules.condition(decreasing == len(runs), f"{config}: every instance lower at τ than at τ/4",
                                  basis=DIRECTION_TREND),
                  rules.at_most(above, critical, strict=True,
                                what=f"{config}: count above {DIRECTION_LEVEL} among {len(runs)} instances",
                                basis="the level is a statement about the population median, tested by the exact "
                                      f"one-sided sign test (distribution-free): false alarm ≤ {DIRECTION_ALPHA:g} per "
                                      f"configuration when the median equals the level; power {power:.2f} with "
                                      f"{len(runs)} instances when 90% of them lie above it",
                                false_fail_rate=rate)]
        rows.append(dict(config=config, median_at_100=float(med[np.searchsorted(t, 100)]), median_end=float(med[-1]),
                         worst_end=float(end.max()), median_monotone=monotone,
                         decreasing=f"{decreasing}/{len(runs)}", above_level=f"{above}/{len(runs)}",
                         instances=len(runs), fails_from=critical, power_at_90_percent_above=power))
    return Outcome(measured={f"median_end_{r['config']}": r["median_end"] for r in rows} |
                   {f"worst_end_{r['config']}": r["worst_end"] for r in rows} |
                   {f"above_level_{r['config']}": r["above_level"] for r in rows},
                   predicted=dict(median_end=f"population median not above {DIRECTION_LEVEL}, decreasing like "
                                             "1/log²τ"),
                   labels={f"median_end_{c}": f"median 1 − corr(W_τ, W^svm), {c}" for c in CONFIGS} |
                   {f"worst_end_{c}": f"worst 1 − corr(W_τ, W^svm), {c}" for c in CONFIGS} |
                   {f"above_level_{c}": f"instances above {DIRECTION_LEVEL}, {c}" for c in CONFIGS},
                   rule=all_of(*parts), details=rows,
                   notes="; ".join(f"{r['config']}: {r['instances']} instances with W^svm ≠ 0, too few for the "
                                   f"sign test to reject at {DIRECTION_ALPHA:g}: only the decrease is tested there"
                                   for r in rows if r["fails_from"] > r["instances"]),
                   figure=_median_figure(groups, "one_minus_corr", "GD: direction", "$1-\\mathrm{corr}(W_\\tau, W^{svm})$",
                                         theory=("$\\propto 1/\\log^2\\tau$", lambda k: 1 / np.log(k) ** 2),
                                         level=(f"level of the population median, {DIRECTION_LEVEL}", DIRECTION_LEVEL)))


SAME_RUNS = "a comparison on the same runs (equal up to round-off when W^fin = 0); deterministic given the ensemble"


def _no_worse(value, reference, what: str, reference_what: str) -> rules.Rule:
    """``value`` at most ``reference`` + ROUND_OFF: two errors of the same runs, which coincide when W^fin = 0."""
    return rules.at_most(value, reference + ROUND_OFF, what=f"{what} (bound: {reference_what} + {ROUND_OFF:g})",
                         basis=SAME_RUNS)


@claim("next_token_scc.gd_decomposition",
       reference=f"{PAPER}: W(τ) ≈ R(τ)·W^svm + W^fin; docs/next_token_scc.md §5, §6.1",
       statement="Removing the finite part never hurts and helps when W^fin ≠ 0: median 1 − corr(W, W^fin + R W^svm) ≤ "
                 "median 1 − corr(W, W^svm), and worst 1 − corr(W − Π_{S_fin}W, W^svm) ≤ worst 1 − corr(W, W^svm), "
                 "at τ in both configurations.",
       quick=GD_QUICK, full=GD_FULL)
def gd_decomposition(seed, instances, steps):
    rows, parts = [], []
    for config in CONFIGS:
        runs = [e for e in _gd(seed, config, instances, steps) if e["ref"].svm.value > 0]
        plain = _at(runs, "one_minus_corr", steps)
        decomposed = _at(runs, "one_minus_corr_decomposed", steps)
        perp = _at(runs, "one_minus_corr_perp", steps)
        parts += [_no_worse(np.median(decomposed), np.median(plain),
                            f"{config}: median 1 − corr(W, W^fin + R W^svm)", "median 1 − corr(W, W^svm)"),
                  _no_worse(perp.max(), plain.max(), f"{config}: worst 1 − corr(W − Π_{{S_fin}}W, W^svm)",
                            "worst 1 − corr(W, W^svm)")]
        rows.append(dict(config=config, median_plain=float(np.median(plain)),
                         median_decomposed=float(np.median(decomposed)), worst_plain=float(plain.max()),
                         worst_perp=float(perp.max()),
                         nonzero_fin=int(sum(np.linalg.norm(e["ref"].W_fin) > 0.1 for e in runs))))
    measured = {}
    for r in rows:
        measured |= {f"median_decomposed_{r['config']}": r["median_decomposed"],
                     f"median_plain_{r['config']}": r["median_plain"]}
    groups = [(c, [e for e in _gd(seed, c, instances, steps) if e["ref"].svm.value > 0]) for c in ("mixed",)]

    def figure():
        fig, ax = plots.figure()
        runs = groups[0][1]
        t = runs[0]["run"].times[1:]
        for key, label, marker in (("one_minus_corr", "$W^{svm}$", "o"),
                                   ("one_minus_corr_decomposed", "$W^{fin} + R\\,W^{svm}$", "s")):
            ax.plot(t, np.median([e["m"][key][1:] for e in runs], axis=0), marker, ms=3, label=f"target {label}")
        plots.finish(ax, "GD, mixed: median $1-$corr with each target", "step $\\tau$", "$1-\\mathrm{corr}$",
                     logx=True, logy=True)
        return fig
    return Outcome(measured=measured, predicted=dict(ordering="decomposed ≤ plain"),
                   labels={k: k.replace("_", " ") for k in measured},
                   rule=all_of(*parts), details=rows, figure=figure)


@claim("next_token_scc.gd_log_norm_growth",
       reference=f"{PAPER}: ‖W(τ)‖ → ∞; the rate is derived in docs/next_token_scc.md §6.1",
       statement="Under GD ‖W_τ‖ ≈ ‖W^svm‖ log τ + O(1): the growth per e-fold over [τ/4, τ], divided by ‖W^svm‖, "
                 "has median within ±15% of 1 in each configuration.",
       quick=GD_QUICK, full=GD_FULL)
def gd_log_norm_growth(seed, instances, steps):
    rows, groups = [], []
    for config in CONFIGS:
        runs = [e for e in _gd(seed, config, instances, steps) if e["ref"].svm.value > 0]
        groups.append((config, runs))
        growth = (_at(runs, "norm", steps) - _at(runs, "norm", steps // 4)) / np.log(4.0)
        ratio = growth / np.array([e["ref"].svm.value for e in runs])
        rows.append(dict(config=config, median=float(np.median(ratio)), low=float(ratio.min()), high=float(ratio.max())))

    def figure():
        fig, ax = plots.figure()
        for j, ((config, runs), marker, row) in enumerate(zip(groups, "os", rows)):
            t = runs[0]["run"].times[1:]
            y = np.median([e["m"]["norm"][1:] / e["ref"].svm.value for e in runs], axis=0)
            ax.plot(t, y, marker, ms=3, color=f"C{j}", label=f"{config}: median $\\|W_\\tau\\|/\\|W^{{svm}}\\|$")
            plots.theory_line(ax, t, np.log(t) + y[-1] - np.log(t[-1]), color=f"C{j}",
                              label=f"{config}: slope 1 in $\\log\\tau$; median slope on the window {row['median']:.3f}")
        ax.axvspan(steps / 4, steps, color="gray", alpha=0.15, label=r"window $[\tau/4, \tau]$: slope within 1 ± 15%")
        plots.finish(ax, "GD: logarithmic norm growth", "step $\\tau$", "$\\|W_\\tau\\| / \\|W^{svm}\\|$", logx=True)
        plots.legend_below(ax)
        return fig
    return Outcome(measured={f"growth_ratio_{r['config']}": r["median"] for r in rows},
                   predicted={f"growth_ratio_{c}": 1.0 for c in CONFIGS},
                   labels={f"growth_ratio_{c}": f"median (d‖W‖/d log τ)/‖W^svm‖, {c}" for c in CONFIGS},
                   rule=rules.exponent([r["median"] for r in rows], 1.0, 0.15, strict=True,
                                       what="each configuration's median (d‖W‖/d log τ)/‖W^svm‖",
                                       basis="the O(1) term's drift and the 1/log τ correction of the direction over "
                                             "one quadrupling (docs/next_token_scc.md §6.1); deterministic given the "
                                             "ensemble"),
                   details=rows, figure=figure)


FINITE_PART_RATE = ("the coupling to the diverging part decays like e^{−R/‖W^svm‖} ∝ 1/τ (docs/next_token_scc.md "
                    "§6.1); ±0.3 allows the next-order 1/(τ log τ) terms over one quadrupling; deterministic given the "
                    "ensemble")


@claim("next_token_scc.gd_finite_part",
       reference=f"{PAPER}: global convergence theorem (soft composition, Π_{{S_fin}}W → W^fin); rate derived in "
                 "docs/next_token_scc.md §6.1",
       statement="Under GD the finite part converges to W^fin like 1/τ: median ‖Π_{S_fin}W_τ − W^fin‖ < 2e-2 at τ, "
                 "and the median log-log slope over [τ/4, τ] lies in (−1.3, −0.7).",
       quick=GD_QUICK, full=GD_FULL)
def gd_finite_part(seed, instances, steps):
    rows, groups = [], []
    for config in CONFIGS:
        runs = [e for e in _gd(seed, config, instances, steps) if e["ref"].basis.shape[1] > 0]
        groups.append((config, runs))
        slope = _slope(runs, "fin_error", steps)
        rows.append(dict(config=config, instances=len(runs), median_end=float(np.median(_at(runs, "fin_error", steps))),
                         median_slope=float(np.median(slope)), slopes=slope.tolist()))
    rule = all_of(rules.at_most([r["median_end"] for r in rows], 2e-2, strict=True,
                                what="each configuration's median ‖Π_{S_fin}W_τ − W^fin‖", basis=FINITE_PART_RATE),
                  _median_rate(rows, "‖Π_{S_fin}W_τ − W^fin‖", FINITE_PART_RATE))
    measured = {}
    for r in rows:
        measured |= {f"median_error_{r['config']}": r["median_end"], f"slope_{r['config']}": r["median_slope"]}
    return Outcome(measured=measured, predicted={f"slope_{c}": -1.0 for c in CONFIGS},
                   labels={k: ("median ‖Π W_τ − W^fin‖, " if k.startswith("median") else "median slope, ") +
                           k.split("_")[-1] for k in measured},
                   rule=rule, details=rows,
                   figure=_median_figure(groups, "fin_error", "GD: finite part",
                                         "$\\|\\Pi_{S_{fin}} W_\\tau - W^{fin}\\|$",
                                         theory=("$\\propto\\tau^{-1}$", lambda k: 1 / k)))


ATTENTION_RATE = ("mass outside O_i ≈ Σ e^{−margin·log τ} ∝ 1/τ for the tightest strict edges (margin 1 in units of "
                  "W^svm, docs/next_token_scc.md §6.1): ≈ 1e-3 at τ = 2·10⁴; a slowly converging instance (large "
                  "‖W^fin‖) may sit above 1e-2 at a finite τ, and its slope approaches −1 only like its finite part "
                  "converges (−0.46 over [5·10³, 2·10⁴] and −0.88 over [4.5·10⁵, 6.4·10⁵] in one of 4000 instances, "
                  "§6.1), so every instance must fall and the median rate is tested; ±0.3 as for the finite part; "
                  "deterministic given the ensemble")


@claim("next_token_scc.gd_attention_limit",
       reference=f"{PAPER}: consequence of the global convergence theorem for attention; docs/next_token_scc.md §5.1",
       statement="Under GD the attention leaves the low-priority tokens (mass outside O_i → 0, like 1/τ) and inside O_i "
                 "tends to softmax(l^fin): the medians over instances of max_i (mass outside O_i) and of max_i "
                 "TV(within-O_i attention, softmax(l^fin)) are below 1e-2 at τ, every instance's mass outside O_i "
                 "falls over [τ/4, τ] (log-log slope < 0), and the median slope lies in (−1.3, −0.7).",
       quick=GD_QUICK, full=GD_FULL)
def gd_attention_limit(seed, instances, steps):
    rows, groups = [], []
    for config in CONFIGS:
        runs = [e for e in _gd(seed, config, instances, steps) if e["ref"].svm.value > 0]
        groups.append((config, runs))
        off, tv = _at(runs, "mass_off", steps), _at(runs, "tv", steps)
        slope = _slope(runs, "mass_off", steps)
        rows.append(dict(config=config, median_off=float(np.median(off)), worst_off=float(off.max()),
                         median_tv=float(np.median(tv)), worst_tv=float(tv.max()), worst_slope=float(slope.max()),
                         median_slope=float(np.median(slope))))
    rule = all_of(rules.at_most([r[key] for r in rows for key in ("median_off", "median_tv")], 1e-2, strict=True,
                                what="each configuration's medians of max_i mass outside O_i and of max_i TV",
                                basis=ATTENTION_RATE),
                  rules.at_most([r["worst_slope"] for r in rows], 0.0, strict=True,
                                what="every instance's log-log slope of the mass outside O_i over [τ/4, τ]",
                                basis=ATTENTION_RATE),
                  _median_rate(rows, "the mass outside O_i", ATTENTION_RATE))
    measured = {}
    for r in rows:
        c = r["config"]
        measured |= {f"median_mass_off_{c}": r["median_off"], f"median_tv_{c}": r["median_tv"],
                     f"median_slope_{c}": r["median_slope"], f"worst_slope_{c}": r["worst_slope"]}
    return Outcome(measured=measured, predicted=dict(mass_off=0.0, tv=0.0, slope=-1.0),
                   labels={k: k.replace("_", " ") for k in measured},
                   rule=rule, details=rows,
                   figure=_median_figure(groups, "mass_off", "GD: attention outside $O_i$",
                                         "$\\max_i$ mass outside $O_i$", theory=("$\\propto\\tau^{-1}$", lambda k: 1 / k)))


@claim("next_token_scc.gd_loss_limit",
       reference=f"{PAPER}: the limit loss is the reduced loss at W^fin; docs/next_token_scc.md §4.2, §6.1",
       statement="Under GD L(W_τ) → L_red(W^fin) from above: the gap is positive at every record and its median falls "
                 "below 1e-2 at τ.",
       quick=GD_QUICK, full=GD_FULL)
def gd_loss_limit(seed, instances, steps):
    rows, groups = [], []
    for config in CONFIGS:
        runs = _gd(seed, config, instances, steps)
        groups.append((config, runs))
        gaps = np.array([e["m"]["loss_gap"] for e in runs])
        rows.append(dict(config=config, min_gap=float(gaps.min()), median_end=float(np.median(gaps[:, -1])),
                         worst_end=float(gaps[:, -1].max())))
    rule = all_of(rules.at_least([r["min_gap"] for r in rows], 0.0, strict=True,
                                 what="L(W_τ) − L_red(W^fin) at every record",
                                 basis="L ≥ inf L = L_red(W^fin) (docs/next_token_scc.md §4.2) makes the sign exact"),
                  rules.at_most([r["median_end"] for r in rows], 1e-2, strict=True,
                                what="each configuration's median L(W_τ) − L_red(W^fin) at τ",
                                basis="the level follows from mass outside O_i ≈ 1e-3; deterministic given the "
                                      "ensemble"))
    return Outcome(measured={f"median_gap_{r['config']}": r["median_end"] for r in rows} |
                   {f"min_gap_{r['config']}": r["min_gap"] for r in rows},
                   predicted=dict(gap="→ 0⁺"), labels={f"median_gap_{c}": f"median L(W_τ) − L_red(W^fin), {c}"
                                                       for c in CONFIGS} |
                   {f"min_gap_{c}": f"smallest gap over records, {c}" for c in CONFIGS},
                   rule=rule, details=rows,
                   figure=_median_figure(groups, "loss_gap", "GD: loss above its infimum",
                                         "$L(W_\\tau) - L_{red}(W^{fin})$",
                                         theory=("$\\propto\\tau^{-1}$", lambda k: 1 / k)))


# ==================================================================================================
# X3: the paper's normalised GD
# ==================================================================================================


def _ngd_paper(seed, instances, steps):
    return ensemble(seed, "paper", "ngd", instances, steps, 0.01)


PAPER_CORRELATION = ("the paper's figure and its printed values 0.976–0.993 over 10 instances; the finite part "
                     "(‖W^fin‖ + the offset in S_all) at ‖W‖ ≈ 25 bounds 1 − corr by ≈ 0.03 (docs/next_token_scc.md "
                     "§6.4)")


@claim("next_token_scc.ngd_paper_correlation",
       reference=f"{PAPER}: global-convergence figure (NGD, η = 0.01, 4000 steps, n = 6, T = 4, K = 6, d = 8); "
                 "docs/next_token_scc.md §6.4, §7",
       statement="In the paper's setting NGD reaches the paper's correlations with W^svm: median corr(W, W^svm) > 0.97 "
                 "and every instance > 0.9 after 4000 steps.",
       quick=NGD_PAPER_QUICK, full=NGD_PAPER_FULL)
def ngd_paper_correlation(seed, instances, steps):
    runs = [e for e in _ngd_paper(seed, instances, steps) if e["ref"].svm.value > 0]
    corr = 1 - _at(runs, "one_minus_corr", steps)

    def figure():
        fig, ax = plots.figure()
        t = runs[0]["run"].times[1:]
        for e in runs:
            ax.plot(t, 1 - e["m"]["one_minus_corr"][1:], color="tab:blue", alpha=0.4, lw=1)
        ax.plot(t, 1 - np.median([e["m"]["one_minus_corr"][1:] for e in runs], axis=0), "o", ms=3, color="tab:red",
                label="median over instances")
        ax.axhline(0.97, color="black", ls="--", lw=1, label="0.97")
        plots.finish(ax, "NGD, paper setting", "step $k$", "$\\mathrm{corr}(W_k, W^{svm})$", logx=True)
        return fig
    return Outcome(measured=dict(median_corr=float(np.median(corr)), min_corr=float(corr.min())),
                   predicted=dict(median_corr="> 0.97", min_corr="> 0.9"),
                   labels=dict(median_corr="median corr(W, W^svm)", min_corr="min corr(W, W^svm)"),
                   rule=all_of(rules.at_least(np.median(corr), 0.97, strict=True, what="median corr(W, W^svm)",
                                              basis=PAPER_CORRELATION),
                               rules.at_least(corr, 0.9, strict=True, what="every instance's corr(W, W^svm)",
                                              basis=PAPER_CORRELATION)),
                   details=[dict(corr=float(c), fin_norm=float(np.linalg.norm(e["ref"].W_fin))) for c, e in zip(corr, runs)],
                   figure=figure)


@claim("next_token_scc.ngd_decomposition",
       reference=f"{PAPER}: W ≈ W^fin + R W^svm in the global-convergence figure; docs/next_token_scc.md §6.4",
       statement="In the paper's NGD setting W^fin + R W^svm (R fitted by least squares) is at least as close to W as "
                 "W^svm in median 1 − corr.",
       quick=NGD_PAPER_QUICK, full=NGD_PAPER_FULL)
def ngd_decomposition(seed, instances, steps):
    runs = [e for e in _ngd_paper(seed, instances, steps) if e["ref"].svm.value > 0]
    plain = _at(runs, "one_minus_corr", steps)
    decomposed = _at(runs, "one_minus_corr_decomposed", steps)
    return Outcome(measured=dict(median_decomposed=float(np.median(decomposed)), median_plain=float(np.median(plain)),
                                 nonzero_fin=int(sum(np.linalg.norm(e["ref"].W_fin) > 0.1 for e in runs))),
                   predicted=dict(ordering="decomposed ≤ plain"),
                   labels=dict(median_decomposed="median 1 − corr(W, W^fin + R W^svm)",
                               median_plain="median 1 − corr(W, W^svm)", nonzero_fin="instances with ‖W^fin‖ > 0.1"),
                   rule=_no_worse(np.median(decomposed), np.median(plain), "median 1 − corr(W, W^fin + R W^svm)",
                                  "median 1 − corr(W, W^svm)"),
                   details=[dict(plain=float(a), decomposed=float(b)) for a, b in zip(plain, decomposed)],
                   notes="No figure of its own: in paper-size instances W^fin = 0 in most draws (symmetric 2-cycles, "
                         "docs/next_token_scc.md §4.2), where the two targets coincide and the curves overlap; the "
                         "figure of gd_decomposition shows the mixed case, where they separate.")


def _ngd_stall(seed, instances, steps):
    return ensemble(seed, "mixed", "ngd", instances, steps, 0.1)


@claim("next_token_scc.ngd_finite_part",
       reference=f"{PAPER}: soft composition Π_{{S_fin}}W → W^fin, as the paper's NGD figure presents it; "
                 "docs/next_token_scc.md §6.3, §9",
       statement="Under normalised GD (η = 0.1, mixed configuration) the finite part converges to W^fin: the median "
                 "‖Π_{S_fin}W_k − W^fin‖ falls below 0.2 η.",
       quick=NGD_STALL_QUICK, full=NGD_STALL_FULL,
       finding="under NGD the finite part stalls on a period-2 orbit at ≈ η/2 from W^fin (measured 0.49–0.51 η): "
               "normalised steps of fixed length cannot settle in a strictly convex valley — docs/next_token_scc.md §9")
def ngd_finite_part(seed, instances, steps):
    eta = 0.1
    runs = [e for e in _ngd_stall(seed, instances, steps) if np.linalg.norm(e["ref"].W_fin) > 0.1]
    ratio = _at(runs, "fin_error", steps) / eta
    half = _at(runs, "fin_error", steps // 2) / eta

    def figure():
        fig, ax = plots.figure()
        t = runs[0]["run"].times[1:]
        for e in runs:
            ax.plot(t, e["m"]["fin_error"][1:] / eta, color="tab:blue", alpha=0.5, lw=1)
        ax.axhline(0.5, color="black", ls="--", label="derived stall $\\eta/2$")
        ax.axhline(0.2, color="tab:red", ls=":", label="claim threshold $0.2\\,\\eta$")
        plots.finish(ax, "NGD ($\\eta=0.1$), mixed: finite-part error", "step $k$",
                     "$\\|\\Pi_{S_{fin}} W_k - W^{fin}\\| / \\eta$", logx=True, logy=True)
        return fig
    return Outcome(measured=dict(median_ratio=float(np.median(ratio)), min_ratio=float(ratio.min()),
                                 max_ratio=float(ratio.max()), median_ratio_half=float(np.median(half))),
                   predicted=dict(paper="→ 0", derived=0.5),
                   labels=dict(median_ratio="median ‖Π W_k − W^fin‖/η at k = K", min_ratio="min over instances",
                               max_ratio="max over instances", median_ratio_half="median at k = K/2", paper="paper",
                               derived="derived stall (η/2)"),
                   rule=rules.at_most(np.median(ratio), 0.2, strict=True,
                                      what="median ‖Π_{S_fin}W_K − W^fin‖/η (the paper's statement)",
                                      basis="the period-2 orbit of normalised steps on the strictly convex L_red has "
                                            "its points at η/2 from the minimiser (docs/next_token_scc.md §6.3); "
                                            "deterministic given the ensemble"),
                   details=[dict(ratio=float(r)) for r in ratio], figure=figure)


NGD_LOG_GROWTH = ("the radial step shrinks to ≈ 2ε/λ once the finite part oscillates (docs/next_token_scc.md §6.3); "
                  "a linear law would give a ratio ≈ ηK/(‖W^svm‖ log 4) ≫ 3; deterministic")


@claim("next_token_scc.ngd_log_norm",
       reference=f"{PAPER}: NGD experiments; the rate is derived in docs/next_token_scc.md §6.3",
       statement="Once cycles exist, NGD's norm grows like ‖W^svm‖ log k, not ηk: the growth per e-fold over "
                 "[K/4, K], divided by ‖W^svm‖, has median below 3, and every ‖W_K‖ < 0.25 ηK.",
       quick=NGD_STALL_QUICK, full=NGD_STALL_FULL)
def ngd_log_norm(seed, instances, steps):
    eta = 0.1
    runs = [e for e in _ngd_stall(seed, instances, steps) if np.linalg.norm(e["ref"].W_fin) > 0.1]
    growth = (_at(runs, "norm", steps) - _at(runs, "norm", steps // 4)) / np.log(4.0)
    ratio = growth / np.array([e["ref"].svm.value for e in runs])
    final = _at(runs, "norm", steps)

    def figure():
        fig, ax = plots.figure()
        t = runs[0]["run"].times[1:]
        y = np.median([e["m"]["norm"][1:] for e in runs], axis=0)
        ax.plot(t, y, "o", ms=3, label="NGD: median $\\|W_k\\|$")
        plots.theory_line(ax, t, eta * t, label="$\\eta k$ (no cycles)")
        w = np.median([e["ref"].svm.value for e in runs])
        plots.theory_line(ax, t, w * np.log(t) + y[-1] - w * np.log(t[-1]), label="$\\|W^{svm}\\|\\log k$",
                          color="tab:red")
        plots.finish(ax, "NGD ($\\eta = 0.1$), mixed: norm", "step $k$", "$\\|W_k\\|$", logx=True, logy=True)
        return fig
    return Outcome(measured=dict(median_growth_ratio=float(np.median(ratio)), median_norm=float(np.median(final)),
                                 linear_norm=eta * steps),
                   predicted=dict(median_growth_ratio=1.0, linear_norm="‖W‖ ≪ ηK"),
                   labels=dict(median_growth_ratio="median (d‖W‖/d log k)/‖W^svm‖", median_norm="median ‖W_K‖",
                               linear_norm="ηK"),
                   rule=all_of(rules.at_most(np.median(ratio), 3, strict=True,
                                             what="median (d‖W‖/d log k)/‖W^svm‖", basis=NGD_LOG_GROWTH),
                               rules.at_most(final, 0.25 * eta * steps, strict=True,
                                             what="every instance's ‖W_K‖ (bound 0.25 ηK)", basis=NGD_LOG_GROWTH)),
                   details=[dict(ratio=float(r), norm=float(n)) for r, n in zip(ratio, final)], figure=figure)


# ==================================================================================================
# Local convergence (nonconvex head) and test-time retrieval
# ==================================================================================================

SELECTED = 1e-2   # a token whose collapsed attention exceeds this is selected
AMBIGUOUS = 9e-3  # (9e-3, 1e-2]: neither selected nor a target of an edge
LOCAL_SLOW_RATE = 0.213  # upper 97.5% bound on P(corr_local < 0.99 at 2000 steps) per instance (see local_convergence)


@claim("next_token_scc.local_convergence",
       reference=f"{PAPER}: local-convergence figure (head E, softmax over the vocabulary, squared loss, NGD η = 0.1, "
                 "2000 steps); docs/next_token_scc.md §5.3",
       statement="With the nonconvex head, NGD converges in direction to the Graph-SVM of the graphs built from the "
                 "tokens it selects: median corr(W, W^svm_local) > 0.99, and the local SVM is at least as close as "
                 "the global one in every instance.",
       quick=dict(instances=30, steps=2000), full=dict(instances=100, steps=2000))
def local_convergence(seed, instances, steps):
    # The corr is a snapshot of a direction that converges like 1/log²t, and some instances are slow: at 2000 steps
    # 69 of 400 instances (seed 1000) had corr < 0.99, rate ≤ LOCAL_SLOW_RATE at 97.5% (Clopper–Pearson). The median
    # of n instances falls below 0.99 only if at least n/2 do, which bounds the claim's chance FAIL rate. The paper
    # drew 10 instances (chance rate up to 4%); the quick setting draws 30 (4e-4).
    root = seeding.named(seeding.instance(seed), "local")
    rows = []
    for j in range(instances):
        parts = seeding.spawn(seeding.child(root, j), 2)
        problem = NTPProblem.paper(seed=parts[0])
        run = dyn.train_general_head(problem, dyn.initial_W(problem, seed=parts[1]), eta=0.1, steps=steps, records=30)
        W = run.final["W"]
        s = cf.attention(problem, W)
        sources, excluded = [], []
        for i in range(problem.n):
            mass = {int(a): float(s[i, problem.ids[i] == a].sum()) for a in np.unique(problem.ids[i])}
            sources.append([a for a, m in mass.items() if m > SELECTED])
            excluded.append([a for a, m in mass.items() if AMBIGUOUS < m <= SELECTED])
        local_graphs = cf.priority_graphs(problem, sources, excluded)
        local = cf.graph_svm(problem, graphs=local_graphs)
        glob = cf.graph_svm(problem)
        rows.append(dict(corr_local=cf.corr(W, local.W) if local.value > 0 else float("nan"),
                         corr_global=cf.corr(W, glob.W), selected=sum(len(c) for c in sources),
                         label_selected=int(sum(int(y) in c for y, c in zip(problem.labels, sources)))))
    kept = [r for r in rows if np.isfinite(r["corr_local"])]
    nominal = float(scipy_stats.binom.sf(math.ceil(len(kept) / 2) - 1, len(kept), LOCAL_SLOW_RATE)) if kept else 1.0
    local_corr = np.array([r["corr_local"] for r in kept])
    global_corr = np.array([r["corr_global"] for r in kept])

    def figure():
        fig, ax = plots.figure()
        x = np.arange(len(kept))
        ax.plot(x, local_corr, "o", label="local Graph-SVM")
        ax.plot(x, global_corr, "s", label="global Graph-SVM")
        ax.axhline(np.median(local_corr), color="tab:blue", lw=1, ls="--", label="median, local")
        ax.axhline(0.99, color="black", lw=1, ls=":", label="0.99 (the median must lie above)")
        plots.finish(ax, "nonconvex head: corr of $W_K$ with each SVM", "instance", "corr", logx=False)
        plots.legend_below(ax, ncols=2)
        return fig
    return Outcome(measured=dict(median_corr_local=float(np.median(local_corr)), min_corr_local=float(local_corr.min()),
                                 median_corr_global=float(np.median(global_corr)), kept=f"{len(kept)}/{len(rows)}"),
                   predicted=dict(median_corr_local="> 0.99", ordering="local ≥ global in every instance"),
                   labels=dict(median_corr_local="median corr(W, W^svm_local)", min_corr_local="min corr(W, W^svm_local)",
                               median_corr_global="median corr(W, W^svm_global)",
                               kept="instances with a strict local edge"),
                   rule=all_of(rules.condition(np.all(local_corr >= global_corr - 1e-12),
                                               "corr(W, W^svm_local) ≥ corr(W, W^svm_global) − 1e-12 in every kept "
                                               "instance", basis="the paper's printed values (local 0.992–0.9995, "
                                               "global 0.26–0.95, 10 instances)"),
                               rules.at_least(np.median(local_corr), 0.99, strict=True,
                                              what="median corr(W, W^svm_local)", false_fail_rate=nominal,
                                              basis=f"the median of {len(kept)} random instances, each below 0.99 at "
                                                    f"2000 steps with probability at most {LOCAL_SLOW_RATE:g}: P(at "
                                                    f"least half below) = {nominal:.1g}")),
                   details=rows, figure=figure)


def _fewest_hits_passing(n: int, level: float) -> int:
    """The smallest k whose 95% Clopper–Pearson lower bound over n trials is at least ``level`` (n + 1 if none):
    the bound increases with k, so bisect."""
    low, high = 0, n + 1
    while low < high:
        k = (low + high) // 2
        if stats.clopper_pearson(k, n, LEVEL)[0] >= level:
            high = k
        else:
            low = k + 1
    return low


@claim("next_token_scc.test_time_retrieval",
       reference=f"{PAPER}: consequence for new sequences (hard retrieval of the highest-priority SCC present); "
                 "docs/next_token_scc.md §5.2",
       statement="On new sequences ending in the query token 0 (mixed configuration, GD-trained W), attention "
                 "concentrates on the present tokens that maximise e_j^T W^svm e_0: among sequences whose top SVM "
                 "logit beats the next by ≥ 1/2, the attention's argmax token is in that top set in ≥ 95% "
                 "(Clopper–Pearson lower bound ≥ 0.9, counting sequences that share a trained W as clustered).",
       quick=dict(instances=10, steps=20000, sequences=200), full=dict(instances=100, steps=100000, sequences=1000))
def test_time_retrieval(seed, instances, steps, sequences):
    runs = _gd(seed, "mixed", instances, steps)
    rng = np.random.default_rng(seeding.named(seed, "new sequences"))
    hits_per_W, decided_per_W, total, masses = [], [], 0, []
    for e in runs:
        hits, decided = 0, 0
        problem, W = e["problem"], e["run"].final["W"]
        graph_tokens = np.flatnonzero(e["ref"].graphs.adjacency[0].any(0) | e["ref"].graphs.adjacency[0].any(1))
        candidates = graph_tokens[graph_tokens != 0]
        z_svm = cf.svm_logits(problem, e["ref"].W_svm)[:, 0]
        z = cf.svm_logits(problem, W)[:, 0]
        for _ in range(sequences):
            size = min(problem.T - 1, candidates.size)
            tokens = np.append(rng.choice(candidates, size=size, replace=False), 0)
            total += 1
            scores = z_svm[tokens]
            order = np.sort(np.unique(np.round(scores, 9)))[::-1]
            if order.size < 2 or order[0] - order[1] < 0.5:
                continue
            decided += 1
            top = set(tokens[scores >= order[0] - 1e-9].tolist())
            l = z[tokens]
            s = np.exp(l - np.logaddexp.reduce(l))
            hits += int(tokens[np.argmax(l)] in top)
            masses.append(float(s[np.isin(tokens, list(top))].sum()))
        hits_per_W.append(hits)
        decided_per_W.append(decided)
    hits, decided = sum(hits_per_W), sum(decided_per_W)
    # the sequences scored by one trained W share it, so they are not independent trials: the interval counts
    # them at the clustered effective size (docs/next_token_scc.md §5.2); low is 0 with too few to score, a FAIL
    interval = (stats.clustered_clopper_pearson(hits_per_W, decided_per_W, LEVEL) if decided >= 2
                else stats.ClusteredInterval(0.0, 1.0, 0.0))
    low, n_effective = interval.low, int(interval.n_effective)
    # nominal false-FAIL rate: P(CP lower bound < 0.9) at the effective size if the true hit rate were 0.95 (the
    # stated prediction)
    false_fail = (float(scipy_stats.binom.cdf(_fewest_hits_passing(n_effective, 0.9) - 1, n_effective, 0.95))
                  if n_effective else 1.0)

    def figure():
        # the attention left outside the top set, on a log axis: on a histogram of the mass itself every sequence
        # but a few falls in the last bin and the tail is invisible; 1 − mass below float64's resolution (exactly 0)
        # is counted at 1e-16
        fig, ax = plots.figure(width=5.6)
        outside = np.maximum(1 - np.array(masses), 1e-16)
        ax.hist(outside, bins=np.geomspace(1e-17, 1.0, 35), color="tab:blue", label=f"{decided} decided sequences")
        ax.axvline(0.5, color="tab:red", ls=":", label="half the attention outside")
        plots.finish(ax, f"new sequences: argmax in the top set in {hits}/{decided}\n"
                         f"(clustered 95% CP lower bound {low:.3f}, tested ≥ 0.9)",
                     "attention outside the predicted top set, 1 − mass", "sequences", logx=True)
        plots.legend_below(ax, ncols=2)
        return fig
    hit_fraction = f"{hits}/{decided} (clustered 95% CP [{low:.6g}, {interval.high:.6g}])"
    return Outcome(measured=dict(argmax_in_top=hit_fraction,
                                 decided=f"{decided}/{total}",
                                 effective_sequences=round(interval.n_effective, 1),
                                 median_mass=float(np.median(masses)) if masses else 0.0),
                   predicted=dict(argmax_in_top="≥ 95%", median_mass="→ 1"),
                   labels=dict(argmax_in_top="argmax attention in the top SVM set", decided="decided sequences",
                               effective_sequences="effective independent sequences (Korn–Graubard)",
                               median_mass="median attention mass on the top set"),
                   rule=rules.at_least(low, 0.9, what="clustered 95% Clopper–Pearson lower bound of the hit fraction",
                                       false_fail_rate=false_fail,
                                       basis=f"at τ = {steps:,} the logits are ≈ log τ·Z^svm + O(1), so a gap ≥ 1/2 is "
                                             f"≥ {np.log(steps) / 2:.1f} nats; binomial interval over the decided "
                                             "sequences at Korn–Graubard's "
                                             f"effective size ({interval.n_effective:.0f}), since sequences scored by "
                                             f"one of the {len(runs)} trained W share it; the false-FAIL rate is the "
                                             "binomial one at that size"),
                   figure=figure,
                   notes="Tokens are drawn among those with an edge in G^(0); sequences whose top two SVM logits are "
                         "closer than 1/2 are counted, not scored (their order is set by the O(1) part).")


NUCLEAR_CERTIFICATE = "certified primal–dual bounds of the shared nuclear solver; deterministic"


@claim("next_token_scc.nuclear_graph_svm",
       reference=f"{PAPER}: the (K,Q) model's Graph-SVM in the nuclear norm; docs/next_token_scc.md §4.3",
       statement="The nuclear-norm Graph-SVM is certified (relative duality gap ≤ 1e-6), satisfies the equalities and "
                 "margins, and has nuclear norm at most that of the Frobenius solution, on 5 paper-size instances.",
       quick=dict(instances=5), full=dict(instances=20))
def nuclear_graph_svm(seed, instances):
    root = seeding.named(seeding.instance(seed), "nuclear")
    rows = []
    for j in range(instances):
        problem = NTPProblem.paper(seed=seeding.child(root, j))
        fro = cf.graph_svm(problem)
        nuc = cf.graph_svm(problem, "nuc")
        fro_nuc = float(np.linalg.svd(fro.W, compute_uv=False).sum())
        sv_nuc, sv_fro = (np.linalg.svd(W, compute_uv=False) for W in (nuc.W, fro.W))
        rows.append(dict(gap=nuc.gap, certified=nuc.certified, iterations=nuc.iterations,
                         equality=float(np.abs(nuc.A @ nuc.W.ravel()).max()) if len(nuc.A) else 0.0,
                         margin_deficit=float(max(0.0, 1 - nuc.margins.min())), nuclear=nuc.value,
                         frobenius_nuclear=fro_nuc, rank_nuc=int(np.sum(sv_nuc > 1e-5)), rank_fro=int(np.sum(sv_fro > 1e-5)),
                         # the ranks are decisions: every value below the cut must be a zero to the accuracy the
                         # solution is known (round-off, or the nuclear solution's certified gap)
                         ranks_certified=bool(all(
                             np.all(sv[sv <= 1e-5] <= max(certificates.ROUND_OFF, sol.accuracy) * sv.max())
                             for sv, sol in ((sv_nuc, nuc), (sv_fro, fro))))))
    # the certificate: lower bound = ‖W*‖_*(1 − gap) ≤ optimum ≤ ‖W^svm_F‖_* (a feasible point); where the
    # Frobenius solution is itself nuclear-optimal, ‖W*‖_* exceeds it by up to the certified gap
    certified = all(r["nuclear"] * (1 - r["gap"]) <= r["frobenius_nuclear"] for r in rows)
    rule = all_of(rules.at_most([r["gap"] for r in rows], 1e-6, what="relative duality gap", basis=NUCLEAR_CERTIFICATE),
                  rules.at_most([r[key] for r in rows for key in ("equality", "margin_deficit")], 1e-9, strict=True,
                                what="equality residuals and margin deficits", basis=NUCLEAR_CERTIFICATE),
                  rules.condition(certified, "‖W*‖_*(1 − gap) ≤ ‖W^svm_F‖_* in every instance (the certified lower "
                                  "bound on the optimum below the Frobenius solution's nuclear norm)",
                                  basis=NUCLEAR_CERTIFICATE))
    return Outcome(measured=dict(max_gap=max(r["gap"] for r in rows), max_equality=max(r["equality"] for r in rows),
                                 mean_rank_nuc=float(np.mean([r["rank_nuc"] for r in rows])),
                                 mean_rank_fro=float(np.mean([r["rank_fro"] for r in rows]))),
                   predicted=dict(max_gap="≤ 1e-6", max_equality=0.0),
                   labels=dict(max_gap="max relative duality gap", max_equality="max |equality residual|",
                               mean_rank_nuc="mean rank, nuclear", mean_rank_fro="mean rank, Frobenius"),
                   rule=rule, details=rows, notes="A certificate, not a trend: the table says everything.")


# ==================================================================================================
# The System record
# ==================================================================================================


def summary(problem: NTPProblem, *, seed) -> dict:
    """The theory objects of the data set (``attnflow solve next_token_scc``); ``seed`` is unused (no Monte Carlo)."""
    ref = dyn.reference(problem)
    sizes = [int(np.bincount(c).max()) for c in ref.graphs.components[np.unique(problem.last)]]
    return {"instance": problem.name, "n, T, K, d": f"{problem.n}, {problem.T}, {problem.K}, {problem.d}",
            "largest SCC per query": ", ".join(map(str, sizes)), "strict edges": len(ref.svm.strict),
            "equality edges": len(ref.svm.equalities), "‖W^svm‖": ref.svm.value, "dim S_fin": ref.basis.shape[1],
            "‖W^fin‖": float(np.linalg.norm(ref.W_fin)), "L_red(W^fin) (limit loss)": ref.limit_loss}


# ==================================================================================================
# `attnflow solve/simulate next-token-scc`: labels and the prediction of a training run
# ==================================================================================================

LABELS = {
    "loss": "training loss L(W)",
    "log_loss": "log L(W)",
    "norm": "‖W‖",
    "fin_error": "distance of the finite part to W^fin",
    "loss_gap": "L(W) − L_red(W^fin)",
    "one_minus_corr": "1 − corr(W, W^svm)",
    "one_minus_corr_perp": "1 − corr(W minus its finite part, W^svm)",
    "one_minus_corr_decomposed": "1 − corr(W, W^fin + R·W^svm)",
    "mass_off": "attention mass off the high-priority tokens",
    "tv": "TV(attention on them, its limit)",
}


def compare(problem: NTPProblem, run, *, seed, algorithm: str = "ngd", eta: float = 0.01, steps: int = 4000,
            init_scale: float = 1.0, records: int = 40):
    """The prediction of a training run (``attnflow simulate next-token-scc --compare``): the same algorithm on the
    same exact loss from the theorem's start W₀ = 0 (§2.3), at the run's recorded steps, and the limits of the
    theorem: the loss tends to L_red(W^fin) (§4), the direction to W^svm. ``seed`` is unused."""
    from .compare import Comparison

    ref = dyn.reference(problem)
    theory = dyn.train(problem, np.zeros((problem.d, problem.d)), eta=eta, steps=steps,
                       normalise=algorithm == "ngd", record=run.times.astype(np.int64))
    prediction = Trajectory(times=theory.times, states=theory.states,
                            metrics={**theory.metrics, **dyn.metrics(theory, ref)})
    note = ("No sampling here: the run and the prediction are the same algorithm on the same exact loss, from a "
            "random W₀ and from 0. The part of W₀ outside S_all never moves (§2.2): it adds to the run's "
            "directional error, less as ‖W‖ grows.")
    if algorithm == "ngd":
        note += " NGD's finite part cycles at ±η/2 about W^fin (§6.3), so its error stalls near η/2."
    panels = ("loss", "one_minus_corr", "fin_error", "mass_off") if np.linalg.norm(ref.W_svm) > 0 else \
        ("loss", "fin_error", "mass_off")
    return Comparison(run, panels, prediction, f"{algorithm} from W₀ = 0, η = {eta:g}",
                      levels={"loss": (ref.limit_loss, "limit L_red(W^fin) (§4)")},
                      simulation_label=f"{algorithm} from a random W₀", note=note)


SYSTEM = System(
    key="next_token_scc",
    title="Next-token prediction with self-attention: token-priority graphs, SCCs, W = R·W^svm + W^fin",
    reference=PAPER,
    problem=NTPProblem,
    population=dyn.population,
    minibatch=dyn.minibatch,
    summary=summary,
    summary_options=(),
    docs="docs/next_token_scc.md",
    population_time="GD step τ",
    minibatch_time="training step k",
    labels=LABELS,
    compare=compare,
)
