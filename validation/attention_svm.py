"""Claims of Tarzanagh et al., *Max-Margin Token Selection in Attention Mechanism* (NeurIPS 2023) and
*Transformers as Support Vector Machines* (2023): attention trained by (normalised) gradient descent converges in
direction to a max-margin SVM that separates the selected tokens (docs/attention_svm.md, §8 lists the claims).

The theory side is a convex program (the SVM, its support set, multipliers and the offset ρ*); the simulation
side is the papers' training algorithm on the same finite data set. The random instances and initialisations of
the ensemble claims come from the run's instance seed (:func:`attnflow.seeding.instance`), so the claims of one run
share one ensemble, computed once.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as scipy_stats

from attnflow import seeding
from attnflow.closed_forms import attention_svm as cf
from attnflow.closed_forms.attention_svm import AttentionSVMProblem
from attnflow.dynamics import attention_svm as dyn

from . import plots, rules, stats
from .claims import Outcome, claim
from .rules import all_of
from .systems import System

MM = "Tarzanagh, Li, Zhang & Oymak, NeurIPS 2023 (arXiv:2306.13596)"
SVM = "Tarzanagh, Li, Thrampoulidis & Oymak, 2023 (arXiv:2308.16898)"
PAPER = f"{MM}; {SVM}"
ETA = 0.1
LEVEL = 0.95  # Clopper–Pearson level of every reported fraction

# Paper statements that the measurements contradict at the papers' horizons (docs/attention_svm.md §9).
FINDINGS: dict = {}

# Bases shared by the deterministic toy claims: a training run past its transient, compared with its limit.
HORIZON = ("horizon allowance: 1 − corr ≈ ||p_⊥||²/(2η²k²) with ||p_⊥|| ≲ 3 at ηk = 100 gives < 5e-4; "
           "deterministic (no sampling)")
HORIZON_AS_GLOBAL = "horizon allowance as in single_input_global; deterministic"
NNLS_ROUND_OFF = "round-off of the least-distance NNLS (exact in exact arithmetic)"


def _fraction(k: int, n: int) -> str:
    low, high = stats.clopper_pearson(k, n, LEVEL)
    return f"{k}/{n} (95% CP [{low:.2f}, {high:.2f}])"


def _vector(x) -> str:
    return "(" + ", ".join(f"{v:.6g}" for v in np.asarray(x).ravel() + 0.0) + ")"


def _one_minus_corr(thetas, target) -> np.ndarray:
    flat = np.asarray(thetas, float).reshape(len(thetas), -1)
    t = np.asarray(target, float).ravel()
    return 1 - flat @ t / (np.linalg.norm(flat, axis=1) * np.linalg.norm(t))


# ==================================================================================================
# E1: the single-input toy
# ==================================================================================================

SINGLE_INITS = (1.0, 0.5, 0.0, -0.5, -1.0, -1.5)


@claim("attention_svm.single_input_svm",
       reference=f"{MM}: Att-SVM (eq. Att-SVM), single-input figure; docs/attention_svm.md §7.2",
       statement="On the single-input toy the Att-SVM of the optimal token is p^mm = (−0.1, 1, 0)/1.01 with only the "
                 "constraint against token 2 active, and the SVM of token 1 is (1, 0, 0), again with token 2 active.",
       quick={}, full={})
def single_input_svm(seed):
    problem = AttentionSVMProblem.single_global()
    rows = []
    for alpha in (0, 1):
        sol = cf.frobenius_svm(problem, np.array([alpha]))
        rows.append(dict(alpha=alpha, error=float(np.abs(sol.theta - cf.single_input_svm(alpha)).max()),
                         support=cf.support_tokens(problem, np.array([alpha]))[0]))
    worst = max(r["error"] for r in rows)
    return Outcome(measured={"max_svm_error": worst, "support_opt": rows[0]["support"],
                             "support_alpha1": rows[1]["support"]},
                   predicted={"max_svm_error": 0.0, "support_opt": [2], "support_alpha1": [2]},
                   labels={"max_svm_error": "max |p^mm − closed form|", "support_opt": "support(opt)",
                           "support_alpha1": "support(α=1)"},
                   notes="No figure: an exact identity of the SVM solution (its directions are drawn in "
                         "attention_svm.single_input_global and single_input_local).",
                   rule=all_of(
                       rules.round_off(worst, 1e-12, what="max |p^mm − closed form|", basis=NNLS_ROUND_OFF),
                       rules.condition(rows[0]["support"] == [2] and rows[1]["support"] == [2],
                                       f"support sets equal {{2}} (opt: {rows[0]['support']}, α = 1: "
                                       f"{rows[1]['support']})", basis=NNLS_ROUND_OFF)),
                   details=rows)


def _single_runs(problem, steps):
    return [dyn.train(problem, np.array([0.0, c, 0.0]), eta=ETA, steps=steps) for c in SINGLE_INITS]


def _paths_figure(runs, targets, title, upto=200, reach=12.0):
    """NGD paths (markers, the first ``upto`` steps) in the (p₁, p₂) plane and the SVM directions (dashed lines)."""
    def draw():
        fig, ax = plots.figure()
        for j, run in enumerate(runs):
            keep = run.times <= upto
            ax.plot(run.states["theta"][keep, 0], run.states["theta"][keep, 1], color="gray", marker=".", ms=3,
                    lw=0.5, label=f"NGD paths ({len(runs)} starts)" if j == 0 else None)
        for label, target, style in targets:
            direction = np.asarray(target)[:2] / np.linalg.norm(target)
            ax.plot([0, reach * direction[0]], [0, reach * direction[1]], label=label, **{"lw": 1.4, **style})
        plots.finish(ax, title, "$p_1$", "$p_2$")
        plots.legend_below(ax, ncols=3)
        return fig
    return draw


P_OPT = "$p^{mm}(\\mathrm{opt})$"
P_ALPHA1 = "$p^{mm}(\\alpha = 1)$"


@claim("attention_svm.single_input_global",
       reference=f"{MM}: global convergence theorem (equal non-optimal scores), single-input figure; docs/attention_svm.md §5",
       statement="When the non-optimal tokens have equal scores (0.9, 0.9), normalised GD from each of the six paper "
                 "initialisations converges in direction to p^mm(opt).",
       quick=dict(steps=1000), full=dict(steps=4000))
def single_input_global(seed, steps):
    problem = AttentionSVMProblem.single_global()
    runs = _single_runs(problem, steps)
    corrs = [cf.corr(r.final["theta"], cf.single_input_svm(0)) for r in runs]
    threshold = 0.999
    return Outcome(measured={"min_corr": min(corrs)}, predicted={"min_corr": 1.0},
                   labels={"min_corr": "min corr(p_k, p^mm(opt))"},
                   rule=rules.at_least(corrs, threshold, strict=True, what="corr(p_k, p^mm(opt)) of every run",
                                       basis=HORIZON),
                   details=[dict(p0_2=c, corr=x) for c, x in zip(SINGLE_INITS, corrs)],
                   figure=_paths_figure(runs, [(P_OPT, cf.single_input_svm(0), dict(color="red", ls="--"))],
                                        "single input, global case: NGD paths (200 steps)"))


@claim("attention_svm.single_input_local",
       reference=f"{MM}: local convergence theorem, single-input figure (γ₂ = 0); docs/attention_svm.md §5",
       statement="With the third token's score 0, token 1 is locally optimal; every NGD run converges to p^mm(opt) or "
                 "to p^mm(α=1) and to nothing else, and both limits occur.",
       quick=dict(steps=1000), full=dict(steps=4000))
def single_input_local(seed, steps):
    problem = AttentionSVMProblem.single_local()
    local = cf.is_locally_optimal(problem, np.array([1]))
    runs = _single_runs(problem, steps)
    rows = [dict(p0_2=c, corr_opt=cf.corr(r.final["theta"], cf.single_input_svm(0)),
                 corr_local=cf.corr(r.final["theta"], cf.single_input_svm(1))) for c, r in zip(SINGLE_INITS, runs)]
    best = [max(r["corr_opt"], r["corr_local"]) for r in rows]
    n_local = sum(r["corr_local"] > r["corr_opt"] for r in rows)
    return Outcome(measured={"token1_locally_optimal": local, "min_corr": min(best), "runs_to_alpha1": n_local},
                   predicted={"token1_locally_optimal": True, "min_corr": 1.0, "runs_to_alpha1": "between 1 and 5"},
                   labels={"token1_locally_optimal": "token 1 locally optimal",
                           "min_corr": "min corr with the nearer SVM", "runs_to_alpha1": "runs → p^mm(α=1)"},
                   rule=all_of(
                       rules.condition(local, "token 1 locally optimal", basis=HORIZON_AS_GLOBAL),
                       rules.at_least(best, 0.999, strict=True, what="corr with the nearer SVM direction, every run",
                                      basis=HORIZON_AS_GLOBAL),
                       rules.condition(0 < n_local < len(rows), f"both directions reached ({n_local} of {len(rows)} "
                                                                "runs → p^mm(α=1))", basis=HORIZON_AS_GLOBAL)),
                   details=rows,
                   figure=_paths_figure(runs, [(P_OPT, cf.single_input_svm(0), dict(color="red", ls="--")),
                                               (P_ALPHA1, cf.single_input_svm(1), dict(color="blue", ls="--"))],
                                        "single input, local case: NGD paths (200 steps)"))


@claim("attention_svm.escape_not_locally_optimal",
       reference=f"{MM}: local convergence theorem (converse: only locally optimal directions attract); docs/attention_svm.md §5",
       statement="Started deep in the cone of p^mm(α=1) (p₀ = 5(1, ±0.05, 0)), NGD leaves it when token 1 is not "
                 "locally optimal (scores 0.9/0.9) and ends at p^mm(opt); with γ₂ = 0 (locally optimal) it stays.",
       quick=dict(steps=1000, radius=5.0), full=dict(steps=4000, radius=10.0))
def escape_not_locally_optimal(seed, steps, radius):
    rows, runs = [], {}
    for problem in (AttentionSVMProblem.single_global(), AttentionSVMProblem.single_local()):
        for eps in (0.05, -0.05):
            run = dyn.train(problem, radius * np.array([1.0, eps, 0.0]), eta=ETA, steps=steps)
            runs.setdefault(problem.name, []).append(run)
            rows.append(dict(instance=problem.name, eps=eps,
                             locally_optimal=cf.is_locally_optimal(problem, np.array([1])),
                             corr_start=cf.corr(run.states["theta"][0], cf.single_input_svm(1)),
                             corr_opt=cf.corr(run.final["theta"], cf.single_input_svm(0)),
                             corr_alpha1=cf.corr(run.final["theta"], cf.single_input_svm(1))))
    escaped = [r["corr_opt"] > 0.999 for r in rows if not r["locally_optimal"]]
    stayed = [r["corr_alpha1"] > 0.999 for r in rows if r["locally_optimal"]]
    rule = all_of(
        rules.at_least([r["corr_opt"] for r in rows if not r["locally_optimal"]], 0.999, strict=True,
                       what="final corr with p^mm(opt), runs that must escape", basis=HORIZON_AS_GLOBAL),
        rules.at_least([r["corr_alpha1"] for r in rows if r["locally_optimal"]], 0.999, strict=True,
                       what="final corr with p^mm(α=1), runs that must stay", basis=HORIZON_AS_GLOBAL),
        rules.condition(len(escaped) == 2 and len(stayed) == 2,
                        f"two runs of each kind ({len(escaped)} not locally optimal, {len(stayed)} locally optimal)",
                        basis=HORIZON_AS_GLOBAL))
    targets = [(P_OPT, cf.single_input_svm(0), dict(color="red", ls="--")),
               (P_ALPHA1, cf.single_input_svm(1), dict(color="blue", ls="--"))]

    def figure():
        fig, axes = plots.figure(ncols=2)
        for ax, (name, group) in zip(axes, runs.items()):
            for j, run in enumerate(group):
                keep = run.times <= 300
                ax.plot(run.states["theta"][keep, 0], run.states["theta"][keep, 1], color="gray", marker=".", ms=3,
                        lw=0.5, label="NGD paths (300 steps)" if j == 0 else None)
            for label, target, style in targets:
                u = np.asarray(target)[:2] / np.linalg.norm(target)
                ax.plot([0, 30 * u[0]], [0, 30 * u[1]], label=label, lw=1.4, **style)
            plots.finish(ax, f"{name}: start $5(1, \\pm 0.05, 0)$", "$p_1$", "$p_2$")
            plots.legend_below(ax, ncols=2)
        return fig

    return Outcome(measured={"escaped": f"{sum(escaped)}/{len(escaped)}", "stayed": f"{sum(stayed)}/{len(stayed)}",
                             "min_start_corr": min(r["corr_start"] for r in rows)},
                   predicted={"escaped": f"{len(escaped)}/{len(escaped)}", "stayed": f"{len(stayed)}/{len(stayed)}"},
                   labels={"escaped": "escaped (not locally optimal)", "stayed": "stayed (locally optimal)",
                           "min_start_corr": "min start corr with p^mm(α=1)"},
                   figure=figure, rule=rule, details=rows)


# ==================================================================================================
# E2: the multi-input toy (prompt model)
# ==================================================================================================


@functools.lru_cache(maxsize=4)
def _multi_runs(steps_min: int, steps_max: int):
    problem = AttentionSVMProblem.multi_input()
    sol = cf.frobenius_svm(problem)
    nonsupport = sol.margins[~sol.active]
    gap = float(nonsupport.min() - 1.0)
    steps = int(min(steps_max, max(steps_min, 8 * np.linalg.norm(sol.theta) / (ETA * gap))))
    record = np.unique(np.concatenate([dyn.record_steps(steps, 60), np.geomspace(steps / 2, steps, 9).round()]))
    runs = [dyn.train(problem, np.array([c, 0.0, 0.0]), eta=ETA, record=record.astype(np.int64))
            for c in SINGLE_INITS]
    return problem, sol, gap, steps, runs


@claim("attention_svm.multi_input_direction",
       reference=f"{MM}: global convergence, multi-input figure; docs/attention_svm.md §7.3",
       statement="On the multi-input toy NGD from the six paper initialisations converges in direction to p^mm(opt).",
       quick=dict(steps_min=4000, steps_max=20000), full=dict(steps_min=8000, steps_max=40000))
def multi_input_direction(seed, steps_min, steps_max):
    problem, sol, gap, steps, runs = _multi_runs(steps_min, steps_max)
    corrs = [cf.corr(r.final["theta"], sol.theta) for r in runs]
    return Outcome(measured={"min_corr": min(corrs), "steps": steps, "nonsupport_gap": gap},
                   predicted={"min_corr": 1.0},
                   labels={"min_corr": "min corr(p_k, p^mm)", "steps": "steps", "nonsupport_gap": "non-support gap"},
                   rule=rules.at_least(corrs, 0.99999, strict=True, what="corr(p_k, p^mm) of every run",
                                       basis="horizon allowance: steps ≥ 8||p^mm||/(η·gap) puts the run past its "
                                             "transient, where 1 − corr ≈ ||p_⊥||²/(2η²k²) < 1e-5 for ||p_⊥|| < 1.7 "
                                             "at ηk ≥ 400"),
                   details=[dict(p0_1=c, corr=x) for c, x in zip(SINGLE_INITS, corrs)],
                   figure=_paths_figure(runs, [(P_OPT, sol.theta, dict(color="red", ls="--"))],
                                        "multi-input toy: NGD paths (200 steps)"))


@claim("attention_svm.ngd_rate",
       reference=f"{MM}: NGD convergence; the rate is derived in docs/attention_svm.md §6.4",
       statement="Past the transient, NGD's directional error falls like 1 − corr(p_k, p^mm) ∝ k^{−2}.",
       quick=dict(steps_min=4000, steps_max=20000), full=dict(steps_min=8000, steps_max=40000))
def ngd_rate(seed, steps_min, steps_max):
    problem, sol, gap, steps, runs = _multi_runs(steps_min, steps_max)
    times = runs[0].times
    window = times >= steps / 2
    y = np.array([_one_minus_corr(r.states["theta"][window], sol.theta) for r in runs]).T
    fit = stats.fit_exponent(times[window], y, kind="loglog", seed=seeding.named(seed, "bootstrap"))
    early = (times >= 250) & (times <= 1000)
    y_early = np.array([_one_minus_corr(r.states["theta"][early], sol.theta) for r in runs]).T
    early_fit = stats.fit_exponent(times[early], y_early, kind="loglog", seed=seeding.named(seed, "bootstrap-early"))
    allowance = 0.2

    def figure():
        fig, ax = plots.figure()
        all_y = np.array([_one_minus_corr(r.states["theta"][1:], sol.theta) for r in runs])
        ax.plot(times[1:], np.median(all_y, axis=0), "o", ms=3, label="NGD, median over 6 inits")
        k = times[window]
        plots.theory_line(ax, k, np.median(y, axis=1)[-1] * (k / k[-1]) ** -2.0, label="theory $k^{-2}$")
        plots.finish(ax, f"multi-input toy: NGD directional error (fit {fit.estimate:.2f})", "step $k$",
                     r"$1 - \mathrm{corr}(p_k, p^{mm})$", logx=True, logy=True)
        plots.legend_below(ax, ncols=2)
        return fig
    return Outcome(measured={"slope": fit.estimate, "slope_interval": f"[{fit.low:.3f}, {fit.high:.3f}]",
                             "early_slope": early_fit.estimate},
                   predicted={"slope": -2.0},
                   labels={"slope": "slope of 1 − corr on the last doubling", "slope_interval": "95% bootstrap",
                           "early_slope": "slope on [250, 1000]"},
                   rule=rules.within(-2.0, fit.low - allowance, fit.high + allowance,
                                     what=f"the predicted slope −2 (95% bootstrap interval widened by ±{allowance})",
                                     basis="bootstrap over the 6 initialisations (expanded percentile, 95%); ±0.2 "
                                           "allows the O(1/(ηk)) next-order term of docs/attention_svm.md §6.4 "
                                           "(pre-asymptotic slopes are shallower)"),
                   figure=figure,
                   notes="The early slope shows the transient: the asymptotic law holds only past ≈ ||p^mm||/(η·gap) "
                         "steps.")


@claim("attention_svm.ngd_norm_growth",
       reference=f"{MM}: NGD; norm growth derived in docs/attention_svm.md §6.3",
       statement="Normalised GD's norm grows linearly: ||p_k||/(ηk) → 1.",
       quick=dict(steps_min=4000, steps_max=20000), full=dict(steps_min=8000, steps_max=40000))
def ngd_norm_growth(seed, steps_min, steps_max):
    problem, sol, gap, steps, runs = _multi_runs(steps_min, steps_max)
    ratios = [r.last("norm") / (ETA * steps) for r in runs]

    def figure():
        # the deviation from 1 on log axes: ||p_k|| = ηk + O(1) makes it fall like 1/(ηk), and the ±2% tolerance
        # is a horizontal line the last records must end below
        fig, ax = plots.figure(width=6.4)
        for j, run in enumerate(runs):
            k = run.times[1:]
            ax.plot(k, np.abs(run.metrics["norm"][1:] / (ETA * k) - 1), "o", ms=2, color=f"C{j}",
                    label=f"$p_0$ = ({SINGLE_INITS[j]:g}, 0, 0)")
        k = runs[0].times[1:]
        plots.theory_line(ax, k, 8 / (ETA * k), label=r"$8/(\eta k)$: the $O(1)$ bound of §6.3")
        ax.axhline(0.02, color="tab:red", ls=":", label="tolerance 2%")
        plots.finish(ax, "multi-input toy: NGD norm growth", "step $k$", r"$|\,\|p_k\| / (\eta k) - 1\,|$",
                     logx=True, logy=True)
        plots.legend_outside(ax)
        return fig

    return Outcome(measured={"min_norm_ratio": min(ratios), "max_norm_ratio": max(ratios)},
                   predicted={"min_norm_ratio": 1.0, "max_norm_ratio": 1.0},
                   labels={"min_norm_ratio": "min ||p_k||/(ηk)", "max_norm_ratio": "max ||p_k||/(ηk)"},
                   figure=figure,
                   rule=rules.at_most([abs(x - 1) for x in ratios], 0.02, strict=True,
                                      what="|‖p_k‖/(ηk) − 1| of every run",
                                      basis="||p_k|| = ηk + O(1) (docs/attention_svm.md §6.3) with O(1) ≤ ||p_0|| + "
                                            "||p_⊥|| ≲ 8 at ηk ≥ 400"),
                   details=[dict(p0_1=c, ratio=x) for c, x in zip(SINGLE_INITS, ratios)])


# ==================================================================================================
# E2b: the two-token toy, direction vs offset, GD norm law
# ==================================================================================================

TWO_TOKEN_C = (1.0, 2.0, 5.0, 10.0, 100.0)


@claim("attention_svm.two_token_direction_and_offset",
       reference=f"{MM}: loss-comparison figure; offset derived in docs/attention_svm.md §6.2",
       statement="On the two-token toy, NGD converges to the direction (1, 0, 0) for every C and loss (measured on "
                 "the increment p_k − p_{k/2}), and its second coordinate to the finite offset p₂* = ½ log(C|ℓ'(C)|/|ℓ'(1)|); the general offset formula gives "
                 "the same number.",
       quick=dict(steps=3000), full=dict(steps=10000))
def two_token_direction_and_offset(seed, steps):
    rows = []
    for loss in cf.LOSSES:
        for C in TWO_TOKEN_C:
            problem = AttentionSVMProblem.two_token(C, loss)
            run = dyn.train(problem, np.zeros(3), eta=ETA, record=np.array([0, steps // 2, steps]))
            p = run.final["theta"]
            closed = cf.two_token_offset(C, loss)
            # the direction of the path's asymptote: the last increment (the offset is constant by then)
            increment = p - run.states["theta"][np.searchsorted(run.times, steps // 2)]
            rows.append(dict(loss=loss, C=C, corr=cf.corr(increment, [1, 0, 0]), corr_iterate=cf.corr(p, [1, 0, 0]),
                             p2=float(p[1]), p2_star=closed,
                             general=float(cf.offset_prediction(problem)[1])))
    error = max(abs(r["p2"] - r["p2_star"]) for r in rows)
    formula = max(abs(r["general"] - r["p2_star"]) for r in rows)
    corr = min(r["corr"] for r in rows)
    offset = ("both constraints are active and there are no non-support tokens, so the offset converges geometrically "
              "(docs/attention_svm.md §6.2); 1e-6 leaves room for the NGD step's O(η) oscillation. The iterate's own "
              "corr is lower where |p₂*| is large (exp loss, C = 100: p₂* ≈ −47) — that is the offset, 1 − corr ≈ "
              "p₂*²/(2η²k²)")

    def figure():
        fig, ax = plots.figure()
        for loss, marker, color in zip(cf.LOSSES, "osd", ("tab:blue", "tab:orange", "tab:green")):
            sub = [r for r in rows if r["loss"] == loss]
            ax.plot([r["C"] for r in sub], [r["p2"] for r in sub], marker, color=color, label=f"NGD, {loss}")
            Cs = np.geomspace(1, 100, 100)
            plots.theory_line(ax, Cs, [cf.two_token_offset(c, loss) for c in Cs], label=f"theory, {loss}",
                              color=color)
        plots.finish(ax, "two-token toy: offset $p_2$ at the end of NGD", "$C$", "$p_2$", logx=True)
        plots.legend_below(ax, ncols=3)
        return fig
    return Outcome(measured={"min_corr_increment": corr, "max_offset_error": error,
                             "min_corr_iterate": min(r["corr_iterate"] for r in rows),
                             "max_formula_difference": formula},
                   predicted={"min_corr_increment": 1.0, "max_offset_error": 0.0},
                   labels={"min_corr_increment": "min corr(p_k − p_{k/2}, (1,0,0))", "max_offset_error": "max |p₂ − p₂*|",
                           "min_corr_iterate": "min corr(p_k, (1,0,0))",
                           "max_formula_difference": "max |general − toy formula|"},
                   rule=all_of(
                       rules.at_least(corr, 0.9999, strict=True, what="min corr(p_k − p_{k/2}, (1,0,0))", basis=offset),
                       rules.at_most(error, 1e-6, strict=True, what="max |p₂ − p₂*|", basis=offset),
                       rules.round_off(formula, 1e-10, what="max |general − toy offset formula|",
                                       basis="two closed forms of one number")),
                   details=rows, figure=figure)


@claim("attention_svm.gd_log_norm_growth",
       reference=f"{MM}: GD with constant step; the law is derived in docs/attention_svm.md §6.3",
       statement="Plain GD grows like p₁(k) = ||p^mm|| log k − log((1 + e)/η) + o(1) on the two-token toy (C = 1, "
                 "logistic): slope dp₁/dlog k → ||p^mm|| = 1.",
       quick=dict(steps=30000, eta=1.0), full=dict(steps=100000, eta=1.0))
def gd_log_norm_growth(seed, steps, eta):
    problem = AttentionSVMProblem.two_token(1.0, "logistic")
    record = np.unique(np.geomspace(steps / 3, steps, 12).round().astype(np.int64))
    run = dyn.train(problem, np.zeros(3), eta=eta, normalise=False, record=np.concatenate([[0], record]))
    k, p1 = run.times[1:], run.states["theta"][1:, 0]
    fit = stats.fit_power_law(k, np.exp(p1))
    intercept = float(p1[-1] - np.log(k[-1]))
    predicted_intercept = -np.log((1 + np.e) / eta)
    log_growth = ("o(1) corrections of order ||p^mm||/(ηk·gap)·… ≲ 1e-3 at k ≥ 1e4 (docs/attention_svm.md §6.3); "
                  "deterministic")

    def figure():
        fig, ax = plots.figure()
        ax.plot(k, p1, "o", ms=4, label=f"GD, $\\eta$ = {eta:g}")
        grid = np.geomspace(k[0], k[-1], 50)
        plots.theory_line(ax, grid, np.log(grid) + predicted_intercept,
                          label=r"theory $\|p^{mm}\| \log k - \log((1 + e)/\eta)$")
        plots.finish(ax, "two-token toy: GD norm grows like $\\log k$", "step $k$", "$p_1(k)$", logx=True)
        plots.legend_below(ax, ncols=2)
        return fig

    return Outcome(measured={"log_slope": fit.slope, "intercept": intercept},
                   predicted={"log_slope": 1.0, "intercept": predicted_intercept},
                   labels={"log_slope": "dp₁/dlog k (predicted ||p^mm||)", "intercept": "p₁ − log k at the end"},
                   figure=figure,
                   rule=all_of(
                       rules.exponent(fit.slope, 1.0, 0.01, strict=True, what="dp₁/dlog k", basis=log_growth),
                       rules.at_most(abs(intercept - predicted_intercept), 0.01, strict=True,
                                     what="|p₁ − log k + log((1 + e)/η)| at the end", basis=log_growth)),
                   details=[dict(k=int(a), p1=float(b)) for a, b in zip(k, p1)])


# ==================================================================================================
# E3: random cross-attention instances, W against (K, Q)
# ==================================================================================================


@functools.lru_cache(maxsize=2)
def _ensemble_cached(entropy, instances, n, T, d, w_steps, kq_steps):
    root = seeding.named(np.random.SeedSequence(entropy), "attention_svm.ensemble")
    checkpoints = sorted({w_steps // 8, w_steps // 4, w_steps // 2, w_steps, kq_steps // 2, kq_steps})
    w_record = np.unique(np.concatenate([dyn.record_steps(w_steps, 50), checkpoints])).astype(np.int64)
    kq_record = np.unique(np.concatenate([dyn.record_steps(kq_steps, 40), [kq_steps // 2, kq_steps]])).astype(np.int64)
    out = []
    for j in range(instances):
        parts = seeding.spawn(seeding.child(root, j), 4)
        problem = AttentionSVMProblem.random(n, T, d, seed=parts[0])
        W0 = dyn.initial_theta(problem, seed=parts[1])
        w = dyn.train(problem, W0, eta=ETA, record=w_record)
        K0, Q0 = dyn.initial_theta(problem, seed=parts[2]), dyn.initial_theta(problem, seed=parts[3])
        kq = dyn.train_kq(problem, K0, Q0, eta=ETA, record=kq_record)
        entry = dict(problem=problem, w=w, kq=kq, W0=W0)
        for name, run in (("w", w), ("kq", kq)):
            final = run.states["theta"][-1]
            entry[f"alpha_{name}"] = np.argmax(cf.logits(problem, final), axis=1)
        at = int(np.searchsorted(w_record, kq_steps))
        entry["alpha_w_at_kq"] = np.argmax(cf.logits(problem, w.states["theta"][at]), axis=1)
        entry["fro_w"] = cf.frobenius_svm(problem, entry["alpha_w"])
        entry["fro_kq"] = cf.frobenius_svm(problem, entry["alpha_kq"])
        entry["nuc_w"] = cf.nuclear_svm(problem, entry["alpha_w"])
        entry["nuc_kq"] = cf.nuclear_svm(problem, entry["alpha_kq"])
        out.append(entry)
    return out


def ensemble(seed, instances, w_steps, kq_steps, n=6, T=8, d=10) -> list[dict]:
    """The random-instance ensemble of §7.6: per instance the Problem, a W-NGD run (``w``), a (K,Q)-NGD run (``kq``),
    the selected token choices and their Frobenius/nuclear SVMs. Drawn from the run's instance seed and computed
    once per run (cached), so every E3 claim sees the same runs."""
    entropy = seeding.instance(seed).entropy
    return _ensemble_cached(entropy, instances, n, T, d, w_steps, kq_steps)


ENSEMBLE_QUICK = dict(instances=20, w_steps=8000, kq_steps=2000)
ENSEMBLE_FULL = dict(instances=100, w_steps=16000, kq_steps=4000)


@claim("attention_svm.softmax_saturates",
       reference=f"{SVM}: local-convergence figure (softmax probability); docs/attention_svm.md §7.6",
       statement="On random instances (n = 6, T = 8, d = 10) both parameterisations drive the softmax to a single "
                 "token in every input: max_i (1 − max_t s_it) → 0.",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def softmax_saturates(seed, instances, w_steps, kq_steps):
    runs = ensemble(seed, instances, w_steps, kq_steps)
    w = max(e["w"].last("unsat") for e in runs)
    kq = max(e["kq"].last("unsat") for e in runs)

    def figure():
        # the worst instance is what the table reports: its last record is the tabled value (e^{-ηk/||θ^mm||}
        # reaches 1e-92 and below, kept in the log domain by the kernel); a value that underflows float64 to
        # exactly 0 is drawn as a triangle at FLOOR
        floor = 1e-300
        fig, ax = plots.figure(width=6.8)
        for name, color, label in (("w", "tab:blue", "$W$"), ("kq", "tab:red", "$(K, Q)$")):
            t = runs[0][name].times[1:]
            unsat = np.array([e[name].metrics["unsat"][1:] for e in runs])
            worst, median = unsat.max(axis=0), np.median(unsat, axis=0)
            ax.plot(t, np.where(worst > 0, worst, np.nan), "o", ms=3, color=color,
                    label=f"{label}: worst of {len(runs)} instances")
            ax.plot(t, np.where(median > 0, median, np.nan), "-", lw=1, color=color, alpha=0.6,
                    label=f"{label}: median")
            if np.any(worst == 0):
                ax.plot(t[worst == 0], np.full(int(np.sum(worst == 0)), floor), "v", ms=4, color=color,
                        label=f"{label}: worst is 0 in float64, drawn at $10^{{-300}}$")
        ax.axhline(1e-3, color="gray", ls=":", label="tolerance $10^{-3}$")
        plots.finish(ax, "softmax saturation, random instances", "step $k$", r"$\max_i (1 - \max_t s_{it})$",
                     logy=True)
        ax.set_ylim(floor / 30, 10)
        ax.set_yticks([10.0 ** -e for e in range(0, 301, 50)])  # round decades: matplotlib's pick is every 37th
        ax.minorticks_off()
        plots.legend_outside(ax)
        return fig
    return Outcome(measured={"worst_unsat_w": w, "worst_unsat_kq": kq},
                   predicted={"worst_unsat_w": 0.0, "worst_unsat_kq": 0.0},
                   labels={"worst_unsat_w": "worst unsat, W (end)", "worst_unsat_kq": "worst unsat, (K,Q) (end)"},
                   rule=rules.at_most([w, kq], 1e-3, strict=True, what="worst unsat of W and of (K,Q) at the end",
                                      basis="horizon allowance: unsat ≈ e^{−ηk/||θ^mm||} for W (≈ e^{−100} at k = "
                                            "8000); (K,Q) grows faster still; the papers' figure shows > 0.999 by "
                                            "k ≈ 500"),
                   figure=figure)


@claim("attention_svm.selected_tokens_locally_optimal",
       reference=f"{SVM}: local convergence theorem; docs/attention_svm.md §4–§5",
       statement="The token choice α that GD selects is locally optimal: for W in at least 95% of runs (Frobenius "
                 "support), for (K,Q) in at least 90% of runs (nuclear support) at the papers' horizon.",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def selected_tokens_locally_optimal(seed, instances, w_steps, kq_steps):
    runs = ensemble(seed, instances, w_steps, kq_steps)
    w_ok = sum(cf.is_locally_optimal(e["problem"], e["alpha_w"], "fro") for e in runs)
    kq_ok = sum(e["nuc_kq"].feasible and _locally_optimal_from(e["problem"], e["alpha_kq"], e["nuc_kq"]) for e in runs)
    infeasible = sum(not e["fro_w"].feasible for e in runs)
    is_opt = sum(np.array_equal(e["alpha_w"], e["problem"].opt) for e in runs)
    unchanged = sum(np.array_equal(e["alpha_w"], e["alpha_w_at_kq"]) for e in runs)
    n = len(runs)
    w_high = stats.clopper_pearson(w_ok, n, LEVEL)[1]
    kq_high = stats.clopper_pearson(kq_ok, n, LEVEL)[1]
    horizon_fraction = ("the theorem is about the limit; at a finite horizon a run can be in the middle of a late token "
                        "switch (docs/attention_svm.md §6.6), and (K,Q) is short of convergence (§6.5), so the claim is "
                        "the fraction at the horizon, tested exactly (binomial; false-FAIL ≤ 2.5% at the boundary)")

    def figure():
        fig, ax = plots.figure()
        names = ["$W$ locally optimal", "$(K,Q)$ locally optimal", r"$W$: $\alpha$ = opt",
                 rf"$W$: $\alpha$ unchanged after {kq_steps}"]
        counts = [w_ok, kq_ok, is_opt, unchanged]
        for j, k in enumerate(counts):
            low, high = stats.clopper_pearson(k, n, LEVEL)
            ax.errorbar([j], [k / n], yerr=[[k / n - low], [high - k / n]], fmt="o", color="tab:blue", capsize=4,
                        label=f"fraction of {n} runs (95% CP)" if j == 0 else None)
        ax.hlines([0.95, 0.9], [-0.3, 0.7], [0.3, 1.3], **plots.THEORY, label="claimed lower limits 0.95, 0.9")
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=15)
        ax.set_ylim(0, 1.05)
        plots.finish(ax, "token selection on random instances", "", "fraction of runs")
        plots.legend_below(ax, ncols=2)
        return fig

    return Outcome(measured={"w_locally_optimal": _fraction(w_ok, n), "kq_locally_optimal": _fraction(kq_ok, n),
                             "w_svm_infeasible": infeasible, "w_alpha_is_opt": _fraction(is_opt, n),
                             "w_alpha_unchanged": _fraction(unchanged, n)},
                   predicted={"w_locally_optimal": "≥ 95%", "kq_locally_optimal": "≥ 90%"},
                   labels={"w_locally_optimal": "W locally optimal",
                           "kq_locally_optimal": "(K,Q) locally optimal (nuclear)", "w_svm_infeasible": "W SVM infeasible",
                           "w_alpha_is_opt": "W: α = opt", "w_alpha_unchanged": f"W: α unchanged after k = {kq_steps}"},
                   figure=figure,
                   # each bound is a one-sided test at (1 − LEVEL)/2 at its boundary fraction
                   rule=all_of(rules.at_least(w_high, 0.95, what="95% Clopper–Pearson upper bound, W locally optimal",
                                              basis=horizon_fraction, false_fail_rate=(1 - LEVEL) / 2),
                               rules.at_least(kq_high, 0.9, what="95% Clopper–Pearson upper bound, (K,Q) locally "
                                                                 "optimal", basis=horizon_fraction,
                                              false_fail_rate=(1 - LEVEL) / 2)))


def _locally_optimal_from(problem, alpha, sol) -> bool:
    gamma = problem.scores
    return all(gamma[i, alpha[i]] > gamma[i, t] for (i, t), on in zip(sol.index, sol.active) if on)


@claim("attention_svm.w_converges_to_frobenius_svm",
       reference=f"{SVM}: local convergence theorem, local-convergence figure (W); docs/attention_svm.md §7.6",
       statement="W-NGD converges in direction to the Frobenius SVM W^mm_α of its selected α: median 1 − corr < 5e-3 "
                 "at k = 2000 and < 2e-4 at k = 8000, and ≥ 95% of runs end with corr > 0.99.",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def w_converges_to_frobenius_svm(seed, instances, w_steps, kq_steps):
    runs = [e for e in ensemble(seed, instances, w_steps, kq_steps) if e["fro_w"].feasible]
    times = runs[0]["w"].times
    curves = np.array([_one_minus_corr(e["w"].states["theta"][1:], e["fro_w"].theta) for e in runs])
    at = lambda k: float(np.median(curves[:, int(np.searchsorted(times[1:], k))]))  # noqa: E731
    early, late = at(w_steps // 4), at(w_steps)
    good = int(np.sum(curves[:, -1] < 0.01))
    low, high = stats.clopper_pearson(good, len(runs), LEVEL)
    offset_law = "thresholds ≈ 4× the offset law ||ρ*||²/(2η²k²) at the median ||ρ*|| ≈ 8 (docs/attention_svm.md §6.4)"

    def figure():
        fig, ax = plots.figure()
        ax.plot(times[1:], np.median(curves, axis=0), "o", ms=3, label="W-NGD, median over instances")
        ax.fill_between(times[1:], np.quantile(curves, 0.1, axis=0), np.quantile(curves, 0.9, axis=0), alpha=0.2,
                        label="10–90% of instances")
        k = times[1:][times[1:] >= w_steps // 4]
        plots.theory_line(ax, k, late * (k / w_steps) ** -2.0, label="theory $k^{-2}$")
        plots.finish(ax, r"$W$-NGD $\to$ Frobenius SVM", "step $k$", r"$1 - \mathrm{corr}(W_k, W^{mm}_\alpha)$",
                     logx=True, logy=True)
        plots.legend_below(ax, ncols=2)
        return fig
    return Outcome(measured={"median_early": early, "median_end": late, "fraction_aligned": _fraction(good, len(runs))},
                   predicted={"median_early": "< 5e-3", "median_end": "< 2e-4", "fraction_aligned": "≥ 0.95"},
                   labels={"median_early": f"median 1 − corr at {w_steps // 4}",
                           "median_end": f"median 1 − corr at {w_steps}", "fraction_aligned": "corr > 0.99 at the end"},
                   rule=all_of(
                       rules.at_most(early, 5e-3, strict=True, what=f"median 1 − corr at {w_steps // 4}",
                                     basis=offset_law),
                       rules.at_most(late, 2e-4, strict=True, what=f"median 1 − corr at {w_steps}", basis=offset_law),
                       rules.at_least(high, 0.95, what="95% Clopper–Pearson upper bound of the fraction with corr > "
                                                       "0.99 at the end", false_fail_rate=(1 - LEVEL) / 2,
                                      basis="the fraction tested exactly (one-sided binomial at its boundary), "
                                            "leaving room for late token switches (docs/attention_svm.md §6.6)")),
                   figure=figure)


@claim("attention_svm.w_rate",
       reference=f"{SVM}: W-NGD; the rate is derived in docs/attention_svm.md §6.4",
       statement="The median directional error of W-NGD falls like k^{−2} on [k_end/4, k_end].",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def w_rate(seed, instances, w_steps, kq_steps):
    runs = [e for e in ensemble(seed, instances, w_steps, kq_steps) if e["fro_w"].feasible]
    times = runs[0]["w"].times
    window = times >= w_steps // 4
    y = np.array([_one_minus_corr(e["w"].states["theta"][window], e["fro_w"].theta) for e in runs]).T
    fit = stats.fit_exponent(times[window], y, kind="loglog", quantile=0.5, seed=seeding.named(seed, "bootstrap"))
    allowance = 0.3

    def figure():
        fig, ax = plots.figure()
        k = times[window]
        median = np.median(y, axis=1)
        ax.plot(k, median, "o", ms=4, label=f"$W$-NGD, median over {len(runs)} instances (fit {fit.estimate:.2f})")
        plots.theory_line(ax, k, median[-1] * (k / k[-1]) ** -2.0, label="theory $k^{-2}$")
        for slope in (-2 - allowance, -2 + allowance):  # the slopes the tolerance accepts, through the last point
            ax.plot(k, median[-1] * (k / k[-1]) ** slope, color="gray", lw=0.8, ls=":",
                    label=f"tolerance: slopes $-2 \\pm {allowance:g}$" if slope < -2 else None)
        plots.finish(ax, r"$W$-NGD rate on $[k_{end}/4, k_{end}]$", "step $k$",
                     r"$1 - \mathrm{corr}(W_k, W^{mm}_\alpha)$", logx=True, logy=True)
        plots.legend_below(ax)
        return fig

    return Outcome(measured={"slope": fit.estimate, "slope_interval": f"[{fit.low:.3f}, {fit.high:.3f}]"},
                   predicted={"slope": -2.0},
                   labels={"slope": "slope of the median 1 − corr in k", "slope_interval": "95% bootstrap"},
                   figure=figure,
                   rule=rules.exponent(fit.estimate, -2.0, allowance, strict=True,
                                       what="slope of the median 1 − corr in k",
                                       basis="the allowance covers the O(1/(ηk)) next-order term, the transient and "
                                             "late switches (docs/attention_svm.md §6.4; slopes of −1.92 to −2.0 at "
                                             "this horizon); a bootstrap over instances gives the interval shown"))


@claim("attention_svm.offset_matches_prediction",
       reference=f"{SVM}: W-NGD; the offset ρ* is derived in docs/attention_svm.md §6.2",
       statement="The finite part of W_k converges to the closed-form offset ρ*: median ||ρ_k − ρ*||/||ρ*|| < 0.05 "
                 "at the end, over the runs whose selected α admits ρ*.",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def offset_matches_prediction(seed, instances, w_steps, kq_steps):
    runs = ensemble(seed, instances, w_steps, kq_steps)
    rows, skipped = [], []
    for j, e in enumerate(runs):
        try:
            rho_star = cf.offset_prediction(e["problem"], e["alpha_w"]).ravel()
        except ValueError as error:
            skipped.append(f"instance {j}: {error}")
            continue
        rho = cf.measured_offset(e["fro_w"], e["w"].states["theta"][-1]).ravel()
        rows.append(dict(instance=j, rho_star=float(np.linalg.norm(rho_star)),
                         relative_error=float(np.linalg.norm(rho - rho_star) / np.linalg.norm(rho_star))))
    errors = [r["relative_error"] for r in rows]
    median = float(np.median(errors)) if errors else float("nan")

    def figure():
        fig, ax = plots.figure()
        ax.plot([r["rho_star"] for r in rows], errors, "o", ms=4, label="instances")
        ax.axhline(median, color="tab:blue", lw=1, label=f"median {median:.1e}")
        ax.axhline(0.05, color="gray", ls=":", label="tolerance of the median, 0.05")
        plots.finish(ax, r"finite part of $W_k$ against $\rho^*$", r"$\|\rho^*\|$",
                     r"$\|\rho_k - \rho^*\| / \|\rho^*\|$", logy=True)
        plots.legend_below(ax, ncols=3)
        return fig

    return Outcome(measured={"median_relative_error": median, "q90_relative_error": float(np.quantile(errors, 0.9)),
                             "median_rho_norm": float(np.median([r["rho_star"] for r in rows])),
                             "instances_without_rho": len(skipped)},
                   predicted={"median_relative_error": 0.0},
                   labels={"median_relative_error": "median ||ρ_k − ρ*||/||ρ*||", "q90_relative_error": "90% quantile",
                           "median_rho_norm": "median ||ρ*||", "instances_without_rho": "instances without ρ*"},
                   figure=figure,
                   rule=all_of(
                       rules.condition(len(rows) >= len(runs) // 2,
                                       f"ρ* exists for at least half the runs ({len(rows)} of {len(runs)})",
                                       basis="a median over too few runs would say little"),
                       rules.at_most(median, 0.05, strict=True, what="median ||ρ_k − ρ*||/||ρ*||",
                                     basis="the remainder decays as the non-support weights die out "
                                           "(docs/attention_svm.md §6.2); at this horizon the median is 4e-3 to 1e-2 "
                                           "on independent ensembles, so 0.05 allows a 5× slower transient")),
                   details=rows,
                   notes="; ".join(skipped))


# The population median of 1 − corr(KQ^T, W*^mm) at the horizon is tested at this level by an exact one-sided sign
# test (docs/attention_svm.md §6.5).
KQ_LEVEL = 2e-2
KQ_ALPHA = 1e-3


@claim("attention_svm.kq_converges_to_nuclear_svm",
       reference=f"{SVM}: (K,Q) implicit bias (nuclear-norm SVM), local-convergence figure (K,Q); docs/attention_svm.md §6.5",
       statement="(K,Q)-NGD converges in direction to the nuclear-norm SVM W*^mm_α: the median 1 − corr over random "
                 f"instances is not shown to exceed {KQ_LEVEL:g} at the horizon (an exact sign test at {KQ_ALPHA:g}), "
                 "the sample median is lower there than at half the horizon, and the fraction of runs within 5e-2 is "
                 f"not shown to be below 85% (an exact binomial test at {KQ_ALPHA:g}).",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def kq_converges_to_nuclear_svm(seed, instances, w_steps, kq_steps):
    runs = [e for e in ensemble(seed, instances, w_steps, kq_steps) if e["nuc_kq"].feasible]
    times = runs[0]["kq"].times
    curves = np.array([_one_minus_corr(e["kq"].states["theta"][1:], e["nuc_kq"].theta) for e in runs])
    half = int(np.searchsorted(times[1:], kq_steps // 2))
    median_half, median_end = float(np.median(curves[:, half])), float(np.median(curves[:, -1]))
    above = int(np.sum(curves[:, -1] > KQ_LEVEL))
    critical, sign_rate = stats.sign_test_threshold(len(runs), KQ_ALPHA)
    good = int(np.sum(curves[:, -1] < 5e-2))
    # the fraction's test at the same one-sided KQ_ALPHA: FAIL when the one-sided upper confidence bound is < 0.85
    fraction_level = 1 - 2 * KQ_ALPHA
    high = stats.clopper_pearson(good, len(runs), fraction_level)[1]
    failing_counts = [g for g in range(len(runs) + 1) if stats.clopper_pearson(g, len(runs), fraction_level)[1] < 0.85]
    fraction_rate = float(scipy_stats.binom.cdf(max(failing_counts), len(runs), 0.85)) if failing_counts else 0.0
    power = float(scipy_stats.binom.sf(critical - 1, len(runs), 0.9))

    def figure():
        fig, ax = plots.figure()
        fro = np.array([_one_minus_corr(e["kq"].states["theta"][1:], e["fro_kq"].theta) for e in runs
                        if e["fro_kq"].feasible])
        ax.plot(times[1:], np.median(curves, axis=0), "o", ms=3, color="tab:red", label="vs nuclear SVM (median)")
        ax.plot(times[1:], np.median(fro, axis=0), "s", ms=3, color="tab:blue", label="vs Frobenius SVM (median)")
        ax.axhline(KQ_LEVEL, color="gray", ls=":", label="level of the population median, $2 \\cdot 10^{-2}$")
        plots.finish(ax, r"$(K,Q)$-NGD: direction of $KQ^\top$", "step $k$", r"$1 - \mathrm{corr}$", logx=True,
                     logy=True)
        plots.legend_below(ax, ncols=2)
        return fig
    return Outcome(measured={"median_half": median_half, "median_end": median_end,
                             "above_level": f"{above}/{len(runs)}", "fraction_within": _fraction(good, len(runs)),
                             "max_end": float(curves[:, -1].max())},
                   predicted={"median_end": f"population median not above {KQ_LEVEL:g}, decreasing",
                              "fraction_within": "≥ 0.85"},
                   labels={"median_half": f"median 1 − corr at {kq_steps // 2}",
                           "median_end": f"median 1 − corr at {kq_steps}",
                           "above_level": f"runs above {KQ_LEVEL:g} at {kq_steps}", "fraction_within": "within 5e-2",
                           "max_end": "max 1 − corr"},
                   rule=all_of(
                       rules.at_most(above, critical, strict=True, what=f"runs (of {len(runs)}) above {KQ_LEVEL:g}",
                                     false_fail_rate=sign_rate,
                                     basis="(K,Q) converges slowly and no rate bounds a random instance at a finite "
                                           "horizon (docs/attention_svm.md §6.5), so the level is a statement about the "
                                           "population median, tested by the exact one-sided sign test (false alarm "
                                           f"{sign_rate:.1e} when the median equals the level; power {power:.2f} when "
                                           "90% of runs lie above it, a detector of gross failure)"),
                       rules.at_most(median_end, median_half, strict=True,
                                     what=f"sample median at {kq_steps} (its value at half the horizon)",
                                     basis="convergence: the error falls over the second half"),
                       rules.at_least(high, 0.85, what=f"one-sided {1 - KQ_ALPHA:.1%} Clopper–Pearson upper bound of "
                                                       "the fraction within 5e-2",
                                      false_fail_rate=fraction_rate,
                                      basis=f"the exact binomial test (false alarm {fraction_rate:.1e} when the "
                                            "fraction equals 0.85)")),
                   figure=figure)


@claim("attention_svm.parameterisations_differ",
       reference=f"{SVM}: W-SVM vs nuclear W-SVM (the implicit bias depends on the parameterisation); docs/attention_svm.md §3, §6.5",
       statement="Every W-run ends closer to the Frobenius SVM than to the nuclear one, and at least 90% of (K,Q)-runs "
                 "end closer to the nuclear SVM than to the Frobenius one at the papers' horizon.",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def parameterisations_differ(seed, instances, w_steps, kq_steps):
    runs = ensemble(seed, instances, w_steps, kq_steps)
    w_rows, kq_rows = [], []
    for e in runs:
        if e["fro_w"].feasible:
            W = e["w"].states["theta"][-1]
            w_rows.append((cf.corr(W, e["fro_w"].theta), cf.corr(W, e["nuc_w"].theta)))
        if e["fro_kq"].feasible:
            W = e["kq"].states["theta"][-1]
            kq_rows.append((cf.corr(W, e["fro_kq"].theta), cf.corr(W, e["nuc_kq"].theta)))
    w_ok = sum(f > n for f, n in w_rows)
    kq_ok = sum(n > f for f, n in kq_rows)
    kq_high = stats.clopper_pearson(kq_ok, len(kq_rows), LEVEL)[1] if kq_rows else 0.0

    def figure():
        fig, ax = plots.figure()
        for rows_, label, marker, color in ((w_rows, "$W$-runs", "o", "tab:blue"), (kq_rows, "$(K,Q)$-runs", "s", "tab:red")):
            ax.plot([n for _, n in rows_], [f for f, _ in rows_], marker, ms=4, color=color, ls="none", label=label)
        low = min(min(x) for x in w_rows + kq_rows)
        plots.theory_line(ax, [low, 1], [low, 1], label="equally close")
        plots.finish(ax, "which SVM each run ends closer to", r"corr(run, nuclear SVM $W^{*mm}_\alpha$)",
                     r"corr(run, Frobenius SVM $W^{mm}_\alpha$)")
        plots.legend_below(ax, ncols=3)
        return fig

    return Outcome(measured={"w_closer_to_frobenius": f"{w_ok}/{len(w_rows)}",
                             "kq_closer_to_nuclear": _fraction(kq_ok, len(kq_rows)),
                             "mean_corr_w_nuclear": float(np.mean([n for _, n in w_rows])),
                             "mean_corr_kq_frobenius": float(np.mean([f for f, _ in kq_rows]))},
                   predicted={"w_closer_to_frobenius": "all", "kq_closer_to_nuclear": "≥ 90%"},
                   labels={"w_closer_to_frobenius": "W closer to Frobenius", "kq_closer_to_nuclear": "(K,Q) closer to nuclear",
                           "mean_corr_w_nuclear": "mean corr(W-run, nuclear)",
                           "mean_corr_kq_frobenius": "mean corr(KQ-run, Frobenius)"},
                   figure=figure,
                   rule=all_of(
                       rules.condition(w_ok == len(w_rows) and len(w_rows) > 0,
                                       f"every W-run closer to the Frobenius SVM ({w_ok} of {len(w_rows)}, at least one)",
                                       basis="the two SVMs differ by far more than the W horizon error (mean "
                                             "cross-corr ≈ 0.85 against 1 − corr ≲ 1e-2)"),
                       rules.at_least(kq_high, 0.9, what="95% Clopper–Pearson upper bound of the fraction of "
                                                         "(K,Q)-runs closer to the nuclear SVM",
                                      false_fail_rate=(1 - LEVEL) / 2,
                                      basis="a (K,Q) run can still be in transit at k = 2000, near neither SVM "
                                            "(docs/attention_svm.md §6.5), so its part is a fraction tested exactly "
                                            "(one-sided binomial at its boundary)")))


@claim("attention_svm.svm_solvers_certified",
       reference=f"{SVM}: W-SVM and nuclear W-SVM; docs/attention_svm.md §3.1–§3.2",
       statement="On the ensemble's instances the Frobenius SVM satisfies its KKT conditions to round-off and the "
                 "nuclear SVM closes its duality gap; the nuclear solution is feasible and no larger in nuclear norm "
                 "than the Frobenius one.",
       quick=ENSEMBLE_QUICK, full=ENSEMBLE_FULL)
def svm_solvers_certified(seed, instances, w_steps, kq_steps):
    runs = ensemble(seed, instances, w_steps, kq_steps)
    kkt, gaps, feas, order = [], [], [], []
    for e in runs:
        fro, nuc = e["fro_w"], e["nuc_w"]
        if not fro.feasible:
            continue
        x = fro.theta.ravel()
        slack = fro.margins - 1
        kkt.append(max(np.abs(x - fro.rows.T @ fro.lam).max(), np.abs(fro.lam * slack).max(), -slack.min(),
                       -fro.lam.min()))
        gaps.append(nuc.gap)
        feas.append(1 - nuc.margins.min())
        order.append(nuc.value - float(np.linalg.svd(fro.theta, compute_uv=False).sum()))
    certified_gap = "the PDHG stopping rule (certified gap 1e-8)"
    return Outcome(measured={"max_kkt_residual": max(kkt), "max_duality_gap": max(gaps), "max_violation": max(feas),
                             "max_nuclear_excess": max(order)},
                   predicted={"max_kkt_residual": 0.0, "max_duality_gap": 0.0},
                   labels={"max_kkt_residual": "max KKT residual (Frobenius)",
                           "max_duality_gap": "max relative duality gap (nuclear)",
                           "max_violation": "max constraint violation (nuclear)",
                           "max_nuclear_excess": "max (||W*||_* − ||W^mm||_*)"},
                   notes="No figure: solver certificates (KKT residuals, duality gaps) checked to round-off.",
                   rule=all_of(
                       rules.round_off(kkt, 1e-9, what="KKT residual (Frobenius)", basis="round-off of NNLS"),
                       rules.at_most(gaps, 1e-8, what="relative duality gap (nuclear)", basis=certified_gap),
                       rules.at_most(feas, 1e-9, what="constraint violation (nuclear)", basis=certified_gap),
                       rules.at_most(order, 1e-6, what="||W*||_* − ||W^mm||_*", basis=certified_gap)))


# ==================================================================================================
# E4: joint (v, p) training
# ==================================================================================================


def _joint_figure(run, targets, title):
    """Joint (v, p) NGD iterates (markers) and the SVM directions they should reach (dashed lines)."""
    def figure():
        fig, ax = plots.figure()
        ax.plot(run.states["theta"][:, 0], run.states["theta"][:, 1], "o", ms=3, color="tab:red", label="$p_k$")
        ax.plot(run.states["v"][:, 0], run.states["v"][:, 1], "s", ms=3, color="tab:blue", label="$v_k$")
        reach = 1.05 * max(np.abs(run.states["theta"]).max(), np.abs(run.states["v"]).max())
        for label, target, color in targets:
            u = np.asarray(target) / np.linalg.norm(target)
            ax.plot([0, reach * u[0]], [0, reach * u[1]], "--", lw=1.4, color=color, label=label)
        plots.finish(ax, title, "coordinate 1", "coordinate 2")
        plots.legend_below(ax, ncols=4)
        return fig
    return figure


def _joint_run(problem, steps):
    return dyn.train_joint(problem, np.array([0.0, -1.0]), np.array([-1.0, 0.0]), eta=ETA, steps=steps)


@claim("attention_svm.joint_tight",
       reference=f"{MM}: joint (v, p) training theorem, joint-training figure (tight); docs/attention_svm.md §4, §7.5",
       statement="When every input is a support vector of the value SVM, joint NGD converges to (v^mm, p^mm).",
       quick=dict(steps=1000), full=dict(steps=4000))
def joint_tight(seed, steps):
    problem = AttentionSVMProblem.joint_tight()
    alpha = np.array([1, 1, 1])
    run = _joint_run(problem, steps)
    v_mm, p_mm = cf.value_svm(problem, alpha), cf.frobenius_svm(problem, alpha).theta
    cv, cp = cf.corr(run.final["v"], v_mm), cf.corr(run.final["theta"], p_mm)
    return Outcome(measured={"corr_v": cv, "corr_p": cp, "p_mm": _vector(p_mm), "v_mm": _vector(v_mm)},
                   predicted={"corr_v": 1.0, "corr_p": 1.0, "p_mm": "(1.333333, 0.333333)", "v_mm": "(0, 1)"},
                   labels={"corr_v": "corr(v, v^mm)", "corr_p": "corr(p, p^mm)", "p_mm": "p^mm", "v_mm": "v^mm"},
                   figure=_joint_figure(run, [("$p^{mm}$", p_mm, "red"), ("$v^{mm}$", v_mm, "blue")],
                                        "joint training, tight case"),
                   rule=all_of(
                       rules.at_least([cv, cp], 0.999, strict=True, what="corr(v, v^mm) and corr(p, p^mm)",
                                      basis="horizon allowance (ηk = 100); deterministic"),
                       rules.condition(np.allclose(p_mm, [4 / 3, 1 / 3], atol=1e-12)
                                       and np.allclose(v_mm, [0, 1], atol=1e-12),
                                       "p^mm = (4/3, 1/3) and v^mm = (0, 1) to 1e-12 (numpy's allclose)",
                                       basis=NNLS_ROUND_OFF)))


@claim("attention_svm.joint_relaxed",
       reference=f"{MM}: joint (v, p) training theorem (relaxed SVM), joint-training figure (relaxed); docs/attention_svm.md §4, §7.5",
       statement="When input 3 is not a support vector of the value SVM, p converges to the relaxed SVM p^relax = "
                 "(1, 0), not to p^mm = (5/4, 1/4).",
       quick=dict(steps=1000), full=dict(steps=4000))
def joint_relaxed(seed, steps):
    problem = AttentionSVMProblem.joint_relaxed()
    alpha = np.array([1, 1, 1])
    run = _joint_run(problem, steps)
    p_relax, p_mm = cf.relaxed_svm(problem, alpha).theta, cf.frobenius_svm(problem, alpha).theta
    cr, cm = cf.corr(run.final["theta"], p_relax), cf.corr(run.final["theta"], p_mm)
    relaxed = "horizon allowance; the two directions differ by 1 − corr = 0.03, far above it"

    figure = _joint_figure(run, [(r"$p^{relax}$", p_relax, "red"), ("$p^{mm}$", p_mm, "gray")],
                           "joint training, relaxed case")
    return Outcome(measured={"corr_p_relax": cr, "corr_p_mm": cm, "p_relax": _vector(p_relax)},
                   predicted={"corr_p_relax": 1.0, "p_relax": "(1, 0)"},
                   labels={"corr_p_relax": "corr(p, p^relax)", "corr_p_mm": "corr(p, p^mm)", "p_relax": "p^relax"},
                   rule=all_of(
                       rules.at_least(cr, 0.999, strict=True, what="corr(p, p^relax)", basis=relaxed),
                       rules.at_least(cr, cm + 0.01, strict=True, what="corr(p, p^relax) (corr(p, p^mm) + 0.01)",
                                      basis=relaxed),
                       rules.condition(np.allclose(p_relax, [1, 0], atol=1e-12),
                                       "p^relax = (1, 0) to 1e-12 (numpy's allclose)", basis=NNLS_ROUND_OFF)),
                   figure=figure)


# ==================================================================================================
# E5: rank of the nuclear-norm SVM; T1: the regularisation path
# ==================================================================================================


@claim("attention_svm.nuclear_svm_rank",
       reference=f"{SVM}: SVM-rank figure; docs/attention_svm.md §7.8",
       statement="The nuclear-norm SVM has lower rank than the Frobenius SVM (n = T = 5): mean ranks equal or lower "
                 "at every d ≥ 3 and strictly lower at the largest d; infeasible instances are counted.",
       quick=dict(ds=(2, 3, 5, 10, 20), seeds=8, max_iterations=5000),
       full=dict(ds=(1, 2, 3, 4, 5, 10, 15, 20), seeds=100, max_iterations=50000))
def nuclear_svm_rank(seed, ds, seeds, max_iterations):
    rows = []
    for d in ds:
        fro_r, nuc_r, infeasible, uncertified, tied = [], [], 0, 0, 0
        for s in range(seeds):
            problem = AttentionSVMProblem.random(5, 5, d, seed=seeding.child(seeding.named(seed, f"d={d}"), s))
            try:
                fro = cf.frobenius_svm(problem)
            except ValueError as error:  # at d = 1 two tokens can share the top score: no unique token to select
                if "not unique" not in str(error):
                    raise
                tied += 1
                continue
            if not fro.feasible:
                infeasible += 1
                continue
            nuc = cf.nuclear_svm(problem, max_iterations=max_iterations)
            if nuc.gap > 1e-6:
                uncertified += 1
                continue
            try:  # a rank is a decision: certified, or the instance is counted with the uncertified ones
                ranks = cf.rank(fro.theta), cf.rank(nuc.theta, accuracy=nuc.accuracy)
            except cf.UncertifiedSolution:
                uncertified += 1
                continue
            fro_r.append(ranks[0])
            nuc_r.append(ranks[1])
        rows.append(dict(d=d, infeasible=infeasible, uncertified=uncertified, tied=tied, feasible=len(fro_r),
                         rank_fro=float(np.mean(fro_r)) if fro_r else float("nan"),
                         rank_nuc=float(np.mean(nuc_r)) if nuc_r else float("nan"),
                         per_instance_nuc_le_fro=int(sum(a <= b for a, b in zip(nuc_r, fro_r)))))
    checked = [r for r in rows if r["d"] >= 3 and r["feasible"]]
    exact_ranks = ("ranks are exact integers from certified solutions (gap 1e-8, SVT zeros); a comparison of means "
                   "over the same instances")
    rule = all_of(
        rules.condition(bool(checked), f"a feasible instance at some d ≥ 3 ({len(checked)} such d)", basis=exact_ranks),
        rules.at_most([r["rank_nuc"] - r["rank_fro"] for r in checked], 0.0,
                      what="mean nuclear rank − mean Frobenius rank at every d ≥ 3 with a feasible instance",
                      basis=exact_ranks),
        rules.at_least(checked[-1]["rank_fro"] - checked[-1]["rank_nuc"] if checked else math.nan, 0.0, strict=True,
                       what="mean Frobenius rank − mean nuclear rank at the largest d", basis=exact_ranks))

    def figure():
        fig, ax = plots.figure()
        shown = [r for r in rows if r["feasible"]]
        ax.plot([r["d"] for r in shown], [r["rank_fro"] for r in shown], "o-", label="Frobenius SVM")
        ax.plot([r["d"] for r in shown], [r["rank_nuc"] for r in shown], "s-", label="nuclear SVM")
        plots.finish(ax, "rank of the SVM solution ($n = T = 5$)", "$d$", "mean rank")
        plots.legend_below(ax, ncols=2)
        return fig
    def ranks(r):  # no ranked instance at this d: say so rather than print nan/nan
        return f"{r['rank_fro']:.1f}/{r['rank_nuc']:.1f}" if r["feasible"] else "none ranked"

    # the statement's comparison first (the headline of reports), then every d
    largest = f"{ranks(checked[-1])} (d = {checked[-1]['d']})" if checked else "no d ≥ 3 with a ranked instance"
    return Outcome(measured={"rank_order": largest}
                   | {f"ranks_d{r['d']}": f"{ranks(r)} (infeasible {r['infeasible']}, uncertified "
                                          f"{r['uncertified']}, tied optimum {r['tied']} of {seeds})" for r in rows},
                   predicted={"rank_order": "nuclear ≤ Frobenius, strictly at the largest d"},
                   labels={f"ranks_d{r['d']}": f"d={r['d']}: mean rank Frobenius/nuclear" for r in rows}
                   | {"rank_order": "mean rank Frobenius/nuclear at the largest d"},
                   rule=rule, details=rows, figure=figure,
                   notes="Cells read 'Frobenius/nuclear mean rank'; infeasible instances, instances whose nuclear duality "
                         "gap stays above 1e-6 within the iteration cap (near-infeasible, ||W|| ≫ 1), and instances "
                         "whose optimal token is not unique (tied top scores, possible at d = 1) are counted, not used.")


@claim("attention_svm.regularisation_path",
       reference=f"{MM}; {SVM}: regularisation-path theorem; docs/attention_svm.md §5",
       statement="The regularisation path θ_R = argmin_{||θ|| ≤ R} L converges in direction to θ^mm: 1 − corr falls "
                 "faster than 1/R between R_max/4 and R_max (multi-input toy and one random W instance).",
       quick=dict(R_max_p=128.0, R_max_w=32.0, points=6), full=dict(R_max_p=512.0, R_max_w=128.0, points=8))
def regularisation_path(seed, R_max_p, R_max_w, points):
    instance = AttentionSVMProblem.random(6, 8, 10, seed=seeding.named(seeding.instance(seed), "regularisation"))
    rows = []
    for name, problem, R_max in (("multi_input p", AttentionSVMProblem.multi_input(), R_max_p),
                                 ("random W", instance, R_max_w)):
        # The statement is asymptotic: a path that has not yet fallen faster than 1/R at R_max is followed further
        # out (up to 8·R_max) before it is judged, rather than loosening the exponent.
        for extension in range(4):
            run = dyn.population(problem, R_max=R_max * 2**extension, points=points + extension)
            y = run.metrics["one_minus_corr"]
            # local exponents of 1 − corr against R over the last two doublings, and their mean (the tested one: a
            # radius where the path moves between nearby local minimisers makes one doubling flat, the next steep)
            slopes = np.diff(np.log(np.maximum(y[-3:], 1e-300))) / np.diff(np.log(run.times[-3:]))
            if slopes.mean() < -1.0:
                break
        rows.append(dict(instance=name, R=run.times.tolist(), one_minus_corr=y.tolist(), R_judged=float(run.times[-1]),
                         slopes=slopes.tolist(), exponent=float(slopes.mean()), ok=bool(slopes.mean() < -1.0)))
    def figure():
        fig, ax = plots.figure()
        for row, marker in zip(rows, "os"):
            y = np.maximum(row["one_minus_corr"], 1e-16)
            ax.plot(row["R"], y, marker, ls="none", label=f"{row['instance']} (exponent {row['exponent']:.2f})")
            R = np.array(row["R"][-3:], float)
            plots.theory_line(ax, R, y[-1] * (R / R[-1]) ** -2.0, label="theory $R^{-2}$" if marker == "o" else None)
        plots.finish(ax, "regularisation path", "$R$", r"$1 - \mathrm{corr}(\theta_R, \theta^{mm})$", logx=True,
                     logy=True)
        plots.legend_below(ax, ncols=2)
        return fig
    ids = {"multi_input p": "multi_input", "random W": "random_w"}
    measured = {f"one_minus_corr_{ids[r['instance']]}": r["one_minus_corr"][-1] for r in rows}
    measured.update({f"exponent_{ids[r['instance']]}": r["exponent"] for r in rows})
    measured.update({f"slopes_{ids[r['instance']]}": ", ".join(f"{x:.2f}" for x in r["slopes"]) for r in rows})
    labels = {}
    for r in rows:
        labels |= {f"one_minus_corr_{ids[r['instance']]}": f"{r['instance']}: 1 − corr at R_max",
                   f"exponent_{ids[r['instance']]}": f"{r['instance']}: exponent over R_max/4…R_max",
                   f"slopes_{ids[r['instance']]}": f"{r['instance']}: per doubling"}
    return Outcome(measured=measured, predicted={"one_minus_corr": "→ 0, asymptotically like R^-2"},
                   labels=labels | {"one_minus_corr": "1 − corr"},
                   rule=rules.at_most([r["exponent"] for r in rows], -1.0, strict=True,
                                      what="mean exponent of 1 − corr in R over the last two doublings, at R_max or, "
                                           "for a path not yet there, at 2, 4 or 8·R_max",
                                      basis="a bounded perpendicular part gives 1 − corr ∝ R^-2 asymptotically "
                                            "(docs/attention_svm.md §5.1); an exponent below −1 allows the transient "
                                            "(measured −1.5 at R = 16–32 on random W instances) while refusing "
                                            "stagnation at a wrong direction (exponent 0)"),
                   details=rows, figure=figure)


# ==================================================================================================
# SVM-equivalence: the nonlinear head (docs/attention_svm.md §7.7)
# ==================================================================================================

SVMEQ_SELECTED = 1e-3   # O_i = {t : s_it > 1e-3}
SVMEQ_MASKED = 1e-6     # a kept run has no softmax entry in (1e-6, 1e-3] and at least one ≤ 1e-6
SVMEQ_TIE = 1e-9        # |ratio − 1| ≤ this is a tie of the sign test (no finite part: every O_i a single token)
SVMEQ_REFERENCE = 0.8   # the true fraction at which the nominal false-FAIL rate is stated


def _svmeq_runs(seed, d, runs, steps):
    """``runs`` accepted NGD runs of the nonlinear head at n = 3, T = 4 and this d, each scored against W^dir and
    W^SVMeq; rejected (Y all +1), not-kept, stationary and infeasible runs are counted, never dropped silently."""
    base = seeding.named(seed, f"d={d}")
    record = np.unique(np.concatenate([dyn.record_steps(steps, 40), [steps // 2]])).astype(np.int64)
    counts = dict(d=d, accepted=0, rejected=0, stationary=0, not_kept=0, infeasible=0)
    scored = []
    attempt = 0
    while counts["accepted"] < runs:
        if attempt >= 20 * runs:
            raise ValueError(f"runs: fewer than {runs} accepted inputs in {attempt} draws")
        parts = seeding.spawn(seeding.child(base, attempt), 3)
        attempt += 1
        problem = AttentionSVMProblem.random(3, 4, d, seed=parts[0])
        if np.all(problem.Y == 1):
            counts["rejected"] += 1
            continue
        counts["accepted"] += 1
        V = np.random.default_rng(parts[1]).normal(size=(d, d))
        V /= np.linalg.norm(V)
        run = dyn.train_relu_head(problem, V, dyn.initial_theta(problem, seed=parts[2]), eta=ETA, record=record)
        if run.info["stationary"]:
            counts["stationary"] += 1
            continue
        W = run.final["theta"]
        logit = cf.logits(problem, W)
        log_s = logit - np.logaddexp.reduce(logit, axis=1, keepdims=True)
        s = np.exp(log_s)
        if np.any((s > SVMEQ_MASKED) & (s <= SVMEQ_SELECTED)) or not np.any(s <= SVMEQ_MASKED):
            counts["not_kept"] += 1
            continue
        selected = [np.flatnonzero(s[i] > SVMEQ_SELECTED) for i in range(problem.n)]
        sol = cf.selection_svm(problem, selected)
        if not sol.feasible:
            counts["infeasible"] += 1
            continue
        W_fin = cf.selection_offset(problem, log_s, selected)
        R = float(np.sum((W - W_fin) * sol.theta) / np.sum(sol.theta ** 2))
        eq = _one_minus_corr(run.states["theta"], W_fin + R * sol.theta)
        direction = _one_minus_corr(run.states["theta"], sol.theta)
        half = int(np.searchsorted(run.times, steps // 2))
        scored.append(dict(d=d, times=run.times, eq=eq, dir=direction, ratio_half=float(eq[half] / direction[half]),
                           ratio_end=float(eq[-1] / direction[-1]), R=R, fin_norm=float(np.linalg.norm(W_fin)),
                           selected=[len(O) for O in selected]))
    return counts, scored


@claim("attention_svm.svm_equivalence",
       reference=f"{SVM}: multi-token (nonlinear-head) SVM-equivalence figure; docs/attention_svm.md §7.7",
       statement="With the head 1^T ReLU(V^T X^T s) (n = 3, T = 4), NGD runs that end with a clean token selection "
                 "O_i approach W^SVMeq = W^fin + R·W^dir more closely than W^dir alone: the median over runs of "
                 "(1 − corr(W_k, W^SVMeq))/(1 − corr(W_k, W^dir)) is below 1 (tested at k = K/2, R fitted at K).",
       quick=dict(ds=(4, 6), runs=100, steps=2000), full=dict(ds=(4, 6, 8, 10), runs=500, steps=2000))
def svm_equivalence(seed, ds, runs, steps):
    rows, scored = [], []
    for d in ds:
        counts, got = _svmeq_runs(seed, d, runs, steps)
        ratios = np.array([r["ratio_half"] for r in got])
        rows.append(dict(counts, scored=len(got), median_ratio=float(np.median(ratios)) if got else float("nan"),
                         below=int(np.sum(ratios < 1 - SVMEQ_TIE)), ties=int(np.sum(np.abs(ratios - 1) <= SVMEQ_TIE))))
        scored += got
    ratios = np.array([r["ratio_half"] for r in scored])
    untied = ratios[np.abs(ratios - 1) > SVMEQ_TIE]
    below, n = int(np.sum(untied < 1)), len(untied)
    low = stats.clopper_pearson(below, n, LEVEL)[0] if n else 0.0
    # the rule "95% CP lower bound > ½" is a one-sided sign test at 2.5%; the smallest passing count k* gives its
    # false-FAIL rate P(Bin(n, p) < k*) at a true fraction p
    k_star = next((k for k in range(n + 1) if stats.clopper_pearson(k, n, LEVEL)[0] > 0.5), n + 1) if n else 1
    false_fail = float(sum(math.comb(n, k) * SVMEQ_REFERENCE ** k * (1 - SVMEQ_REFERENCE) ** (n - k)
                           for k in range(min(k_star, n + 1))))
    end = [r["ratio_end"] for r in scored]
    sign_test = (f"sign test over independent runs (one-sided, false-PASS ≤ 2.5% when the median ratio is ≥ 1); with "
                 f"{n} untied runs it needs {k_star} below, nominal false-FAIL rate {false_fail:.1e} if the true "
                 f"fraction is {SVMEQ_REFERENCE}. At K the ratio is ≤ 1 for every run by construction (W^SVMeq is a "
                 "least-squares projection of W_K onto a space containing W^dir, docs/attention_svm.md §7.7), so the "
                 "test is at K/2")

    def figure():
        # the two medians nearly coincide on a log axis, so the right panel shows what is tested: each run's ratio
        # of the two errors, below 1 where W^SVMeq is the closer target, at K/2
        fig, (ax, ax_ratio) = plots.figure(ncols=2)
        if scored:
            times = scored[0]["times"][1:]
            for key, label, style in (("dir", "$W^{dir}$", dict(color="tab:blue", marker="o")),
                                      ("eq", r"$W^{SVMeq} = W^{fin} + R\,W^{dir}$", dict(color="tab:red", marker="s"))):
                y = np.median([r[key][1:] for r in scored], axis=0)
                ax.plot(times, np.maximum(y, 1e-16), ms=3, label=label, **style)
            ratio = np.array([r["eq"][1:] / r["dir"][1:] for r in scored])
            ax_ratio.fill_between(times, *np.quantile(ratio, [0.25, 0.75], axis=0), color="tab:red", alpha=0.2,
                                  label="quartiles over runs")
            ax_ratio.plot(times, np.median(ratio, axis=0), "s-", ms=3, color="tab:red", label="median over runs")
            ax_ratio.axhline(1.0, **plots.THEORY, label="equally close")
            ax_ratio.axvline(steps // 2, color="gray", ls=":",
                             label=f"tested at $K/2$: {below}/{n} untied runs below 1")
        plots.finish(ax, f"nonlinear head: median over {len(scored)} kept runs", "step $k$",
                     r"$1 - \mathrm{corr}(W_k, \cdot)$", logx=True, logy=True)
        plots.legend_below(ax, ncols=1)
        plots.finish(ax_ratio, "the ratio the sign test counts", "step $k$",
                     r"$(1 - \mathrm{corr}(W_k, W^{SVMeq})) / (1 - \mathrm{corr}(W_k, W^{dir}))$", logx=True)
        plots.legend_below(ax_ratio, ncols=2)
        return fig
    return Outcome(measured={"runs_below": _fraction(below, n) if n else "0/0",
                             "median_ratio_half": float(np.median(untied)) if n else "no untied run",
                             "median_ratio_end": float(np.median(end)) if end else "no kept run",
                             "median_one_minus_corr_end":
                                 f"{np.median([r['eq'][-1] for r in scored]):.3e} / "
                                 f"{np.median([r['dir'][-1] for r in scored]):.3e}" if scored else "none",
                             "run_counts":
                                 f"{sum(r['accepted'] for r in rows)} / {sum(r['rejected'] for r in rows)} / "
                                 f"{sum(r['stationary'] for r in rows)} / {sum(r['not_kept'] for r in rows)} / "
                                 f"{sum(r['infeasible'] for r in rows)} / {len(ratios) - n}"},
                   predicted={"median_ratio_half": "< 1"},
                   labels={"runs_below": "runs with ratio < 1 at K/2 (ties dropped)",
                           "median_ratio_half": "median ratio at K/2",
                           "median_ratio_end": "median ratio at K (R fitted there, ≤ 1 by construction)",
                           "median_one_minus_corr_end": "median 1 − corr at K: W^SVMeq / W^dir",
                           "run_counts": "accepted / rejected (Y all +1) / stationary / not kept / infeasible W^dir / ties"},
                   rule=all_of(
                       rules.condition(n > 0, f"at least one untied run ({n})", basis=sign_test),
                       rules.at_least(low, 0.5, strict=True, false_fail_rate=false_fail, basis=sign_test,
                                      what="95% Clopper–Pearson lower bound of the fraction of untied runs with "
                                           "ratio < 1 at K/2")),
                   details=[{k: v for k, v in r.items()} for r in rows], figure=figure,
                   notes="Ties (|ratio − 1| ≤ 1e-9) are runs whose O_i are single tokens: then W^fin = 0 and the two "
                         "targets coincide; they are counted and dropped, as in a sign test.")


# ==================================================================================================
# The System record
# ==================================================================================================


def _rank_or_why_not(solution):
    """The certified rank of an SVM solution, or why it is undecided (a decision is read only from a certificate)."""
    if not solution.certified:
        return f"undecided: duality gap {solution.gap:.2g} above {solution.requested_gap:g}"
    try:
        return cf.rank(solution.theta, accuracy=solution.accuracy)
    except cf.UncertifiedSolution as error:
        return f"undecided: {error}"


def summary(problem: AttentionSVMProblem, *, seed) -> dict:
    """The SVM of the optimal tokens (``attnflow solve attention_svm``); ``seed`` is unused (no Monte Carlo)."""
    out = {"instance": problem.name, "model": problem.model, "n, T, d": f"{problem.n}, {problem.T}, {problem.d}",
           "opt": ", ".join(str(t) for t in problem.opt)}
    sol = cf.frobenius_svm(problem)
    out["Frobenius SVM feasible"] = sol.feasible
    if not sol.feasible:
        return out
    support = cf.support_tokens(problem)
    out.update({"||θ^mm||": sol.value, "support tokens": "; ".join(f"input {i}: {ts}" for i, ts in enumerate(support)),
                "locally optimal": cf.is_locally_optimal(problem)})
    if problem.model == "prompt":
        out["p^mm"] = _vector(sol.theta)
    else:
        nuc = cf.nuclear_svm(problem)
        out.update({"rank W^mm": _rank_or_why_not(sol), "rank W*^mm (nuclear)": _rank_or_why_not(nuc),
                    "||W*^mm||_*": nuc.value, "nuclear duality gap": nuc.gap,
                    "corr(W^mm, W*^mm)": cf.corr(sol.theta, nuc.theta)})
    try:
        out["||ρ*||"] = float(np.linalg.norm(cf.offset_prediction(problem)))
    except ValueError as error:
        out["ρ*"] = str(error)
    return out


# ==================================================================================================
# `attnflow solve/simulate attention-svm`: labels and the prediction of a training run
# ==================================================================================================

LABELS = {
    "one_minus_corr": "1 − corr with the max-margin SVM",
    "norm": "‖θ‖ (‖KQᵀ‖ for (K, Q) training)",
    "K_norm": "‖K‖",
    "Q_norm": "‖Q‖",
    "loss": "training loss L(θ)",
    "unsat": "max_i (1 − max_t s_it): softmax short of one-hot",
    "v_norm": "‖v‖ (joint training)",
}

COMPARE_RADII = 12  # radii of the regularisation path drawn beside a run (each one SLSQP solve)


def compare(problem: AttentionSVMProblem, run, *, seed, algorithm: str = "ngd", eta: float = ETA, steps: int = 2000,
            init_scale: float = 1.0, records: int = 60):
    """The prediction of a training run (``attnflow simulate attention-svm --compare``): the regularisation path
    θ_R = argmin_{‖θ‖≤R} L (Theorem T1, docs/attention_svm.md §5) at R = ‖θ_k‖, the run's own norm, at up to
    ``COMPARE_RADII`` of its records: both tend to the max-margin direction, and at equal norm the path has the
    least loss. NGD's directional error falls like k⁻² (§6.4), drawn through its last record. ``seed`` is unused."""
    from attnflow.dynamics.montecarlo import Trajectory

    from .compare import Comparison, NoPrediction

    if "one_minus_corr" not in run.metrics:
        raise NoPrediction(f"algorithm {algorithm} has no SVM direction to converge to here (the joint (v, p) limit "
                           "or an infeasible SVM), and the regularisation path is the attention's alone")
    norms = np.asarray(run.metrics["norm"], float)
    # records where the norm sets a new high, then the first of them past each of COMPARE_RADII log-spaced radii
    increasing = np.flatnonzero((norms > 0) & (norms > np.maximum.accumulate(np.r_[0.0, norms[:-1]])))
    levels = np.geomspace(norms[increasing[0]], norms[increasing[-1]], COMPARE_RADII)
    chosen = np.unique(increasing[np.minimum(np.searchsorted(norms[increasing], levels), increasing.size - 1)])
    path = dyn.regularisation_path(problem, norms[chosen])
    target = "θ^mm (Frobenius SVM)"
    one_minus_corr = path.metrics["one_minus_corr"]
    note = ("The path is drawn at R = ‖θ_k‖, the run's norm at each step: both tend to the max-margin direction, "
            "and on the ball of that radius the path has the least loss, so the run's loss lies on or above it.")
    if algorithm.startswith("kq"):
        nuclear = cf.svm(problem, None, "nuc").theta.ravel()
        flat = path.states["theta"].reshape(len(chosen), -1)
        one_minus_corr = 1 - flat @ nuclear / (np.linalg.norm(flat, axis=1) * np.linalg.norm(nuclear))
        target = "W*^mm (nuclear-norm SVM)"
        note += (" (K, Q) training tends to the nuclear-norm SVM W*^mm, the path of W to the Frobenius one: against "
                 "W*^mm the path levels off at 1 − corr(W^mm, W*^mm) (§6.5).")
    prediction = Trajectory(times=run.times[chosen], metrics=dict(one_minus_corr=one_minus_corr,
                                                                  loss=path.metrics["loss"]))
    rates = {}
    if algorithm == "ngd":
        rates["one_minus_corr"] = ("power", -2.0, "∝ k⁻² (NGD, §6.4)")
        note += " NGD's 1 − corr falls like k⁻² after a transient of about ‖θ^mm‖/(η·gap) steps (§6.4)."
    elif algorithm == "gd":
        note += " GD's 1 − corr falls only like 1/log²k (§6.4)."
    return Comparison(run, ("one_minus_corr", "loss"), prediction,
                      f"regularisation path at R = ‖θ_k‖ (1 − corr against {target})", rates=rates,
                      simulation_label=f"{algorithm} on the whole data set", note=note)


SYSTEM = System(
    key="attention_svm",
    title="Attention as a max-margin token selector: (normalised) GD, (K,Q) and joint training vs the attention SVMs",
    reference=PAPER,
    problem=AttentionSVMProblem,
    population=dyn.population,
    minibatch=dyn.minibatch,
    summary=summary,
    summary_options=(),
    docs="docs/attention_svm.md",
    population_time="radius R of the regularisation path",
    minibatch_time="training step k",
    labels=LABELS,
    compare=compare,
)
