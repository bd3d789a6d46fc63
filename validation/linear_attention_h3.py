"""Claims of Li, Rawat & Oymak (NeurIPS 2024): linear attention and H3 as one-step (weighted) preconditioned GD, with
retrieval, task–feature alignment, low rank and LoRA (derivations: docs/linear_attention_h3.md).

Closed forms are checked against brute-force Monte Carlo of the raw definitions (|z| < Z_TOLERANCE), against
optimisation of the closed-form risk (optimiser tolerance) or as exact identities (round-off). Trained models are
compared with the closed-form optima by paired Monte Carlo: the gap to the optimal predictor on the same prompts.
"""
from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import minimize

from attnflow import seeding
from attnflow.closed_forms import linear_attention_h3 as cf
from attnflow.closed_forms.linear_attention_h3 import H3Problem
from attnflow.dynamics import linear_attention_h3 as dyn
from attnflow.dynamics.montecarlo import monte_carlo_mean

from . import plots, rules
from .claims import Outcome, claim
from .rules import all_of
from .stats import Z_TOLERANCE, fit_exponential_rate, two_sided_p
from .systems import System

PAPER = "Li, Rawat & Oymak, NeurIPS 2024 (arXiv:2407.10005)"
DOCS = "docs/linear_attention_h3.md"
from attnflow.closed_forms.certificates import ROUND_OFF  # exact identities computed two ways in float64
OPTIMISER = 1e-8             # BFGS on a smooth closed form, gradient tolerance 1e-12
ALPHA = two_sided_p(Z_TOLERANCE)
# A trained model is accepted within this fraction of the optimum (optimisation error of a finite run) plus
# Z_TOLERANCE paired standard errors (§8.1).
TRAINING_ALLOWANCE = 0.01
# Every trained model's learning rate decays by a cosine to 2% of its initial value (the protocol of §8.1).
DECAY = dyn.PROTOCOL_FINAL_FRACTION
IDENTITY_BASIS = "exact identity; float64 round-off only"
WOODBURY_BASIS = "deterministic identity (Woodbury); float64 round-off"
FLOW_BASIS = "deterministic: DOPRI5 with rtol 1e-10 on a linear ODE"
BFGS_BASIS = "deterministic: BFGS gradient tolerance 1e-12"
TRAINING_BASIS = (f"{TRAINING_ALLOWANCE:.0%} of the optimum (finite training) + {Z_TOLERANCE:g} paired Monte-Carlo "
                  f"standard errors (false-FAIL ≤ {ALPHA:.1g} once training is within the allowance)")

FINDINGS = {
    "linear_attention_h3.alignment_multiplier_fixed_alpha":
        "At fixed α the usable-sample multiplier is not α²d + 1: at d = 20, α = 0.5 it is 6.8, 6.1 and 5.1 at "
        "n = 5, 10, 20 against κ = 6, and n_eff/(κn) stays off 1 as d grows (1.14 at n = d/4, 0.80 at n = d); the "
        "rule holds only in the proportional limit α²d fixed (docs/linear_attention_h3.md §7.2).",
}


def _mc(problem, predict, count, seed):
    return dyn.monte_carlo_risk(problem, predict, count, seed=seed)


def _z_outcome_rows(rows):
    return max(abs(r["z"]) for r in rows)


def _z_rule(rows, what: str) -> rules.Rule:
    """|z| < Z_TOLERANCE for each row's Monte-Carlo comparison."""
    return rules.z_test([r["z"] for r in rows], what=what)


def _random_preconditioner(rng, problem, scale=1.0):
    return scale * rng.standard_normal((problem.d, problem.d)) / (problem.n * problem.d)


def _ids(values):
    return {f"z_{i + 1}": float(v) for i, v in enumerate(values)}


def _z_figure(rows, title, xlabel="configuration"):
    """Closed form against Monte Carlo per configuration (bars: the |z| < 4 tolerance), and beside it the relative
    error on a log axis against the tolerance 4·SE/closed form: the agreement is far below what a linear risk axis
    can show."""
    def figure():
        fig, (ax, ax_rel) = plots.figure(ncols=2)
        x = np.arange(len(rows))
        predicted = np.array([r["predicted"] for r in rows])
        measured = np.array([r["measured"] for r in rows])
        se = np.array([r["standard_error"] for r in rows])
        plots.theory_line(ax, x, predicted, label="closed form", marker="_", markersize=14, linestyle="none")
        plots.simulation_points(ax, x, measured, se, k=Z_TOLERANCE, label=f"Monte Carlo (±{Z_TOLERANCE:g} SE)")
        ax_rel.plot(x, np.abs(measured - predicted) / np.abs(predicted), "o", color="tab:blue",
                    label="|Monte Carlo − closed form| / closed form")
        ax_rel.plot(x, Z_TOLERANCE * se / np.abs(predicted), "_", markersize=22, markeredgewidth=2.5,
                    color="tab:green", label=f"tolerance: {Z_TOLERANCE:g} SE / closed form")
        for axis, heading, ylabel in ((ax, title, "risk"), (ax_rel, "Relative error against the tolerance",
                                                             "relative error")):
            axis.set_xticks(x, [r["label"] for r in rows], fontsize=8)
            axis.set_xlim(-0.5, len(rows) - 0.5)
            plots.finish(axis, heading, xlabel, ylabel, logy=axis is ax_rel)
            plots.legend_below(axis)
        return fig
    return figure


def _mc_row(label, mc, predicted):
    return dict(label=label, measured=mc.mean, standard_error=mc.standard_error, predicted=float(predicted),
                z=mc.z_score(predicted))


# ==================================================================================================================
# §4: PGD risk and optimum (setting A)
# ==================================================================================================================


@claim(
    "linear_attention_h3.pgd_risk_formula",
    reference=f"{PAPER}: risk of one-step preconditioned GD ({DOCS} §4.1)",
    statement="R_PGD(W) = σ² + tr(HΨ) − 2n tr(HWHΨ) + tr(WᵀHWM), M = n(n+1)HΨH + nsH, equals the Monte-Carlo risk of "
              "ŷ = xᵀWXᵀy at random W (setting A).",
    quick=dict(n_prompts=100_000),
    full=dict(n_prompts=1_000_000),
)
def pgd_risk_formula(seed, n_prompts):
    problem = cf.golden_setting_a()
    rng = np.random.default_rng(seeding.spawn(seed, 1)[0])
    rows = []
    for i, mc_seed in enumerate(seeding.spawn(seeding.named(seed, "mc"), 3)):
        W = _random_preconditioner(rng, problem, scale=2.0) + cf.optimal_preconditioner(problem)
        mc = _mc(problem, lambda p, W=W: dyn.pgd_predict(p, W), n_prompts, mc_seed)
        rows.append(_mc_row(f"W #{i + 1}", mc, cf.pgd_risk(problem, W)))
    return Outcome(measured=_ids(r["z"] for r in rows), predicted={f"z_{i + 1}": 0.0 for i in range(3)},
                   labels={f"z_{i + 1}": f"z at random W #{i + 1}" for i in range(3)},
                   rule=_z_rule(rows, "Monte-Carlo PGD risk − closed form at each random W"),
                   details=rows, figure=_z_figure(rows, "PGD risk: closed form against Monte Carlo (setting A)"))


@claim(
    "linear_attention_h3.optimal_preconditioner",
    reference=f"{PAPER}: Theorem 1's PGD optimum ({DOCS} §4.2)",
    statement="W* = Ψ((n+1)HΨ + sI)⁻¹ minimises R_PGD and L* = σ² + Σψᵢ(ψᵢ+s)/((n+1)ψᵢ+s); BFGS on the closed form "
              "from random starts finds neither a lower value nor another minimiser.",
    quick=dict(starts=3),
    full=dict(starts=20),
)
def optimal_preconditioner(seed, starts):
    problem = cf.golden_setting_a()
    d = problem.d
    W_star, L_star = cf.optimal_preconditioner(problem), cf.optimal_risk(problem)
    rng = np.random.default_rng(seed)
    best, worst_argmin = np.inf, 0.0
    for _ in range(starts):
        result = minimize(lambda w: float(cf.pgd_risk(problem, w.reshape(d, d))), rng.standard_normal(d * d) / d,
                          jac=lambda w: cf.pgd_risk_gradient(problem, w.reshape(d, d)).ravel(), method="BFGS",
                          options=dict(gtol=1e-12))
        best = min(best, result.fun)
        worst_argmin = max(worst_argmin, float(np.abs(result.x.reshape(d, d) - W_star).max()))
    identity_gap = abs(float(cf.pgd_risk(problem, W_star)) - L_star)
    gradient = float(np.abs(cf.pgd_risk_gradient(problem, W_star)).max())
    return Outcome(measured=dict(bfgs_minimum=best, argmin_distance=worst_argmin, risk_at_w_star=L_star + identity_gap,
                                 gradient_at_w_star=gradient),
                   predicted=dict(optimal_risk=L_star, argmin_distance=0.0, spectral_optimal_risk=L_star,
                                  gradient=0.0),
                   labels=dict(bfgs_minimum="BFGS minimum of R_PGD", argmin_distance="max |W_BFGS − W*|",
                               risk_at_w_star="R_PGD(W*)", gradient_at_w_star="max |∇R(W*)|",
                               optimal_risk="L* (spectral)", spectral_optimal_risk="L* (spectral)"),
                   rule=all_of(rules.at_least(best, L_star - OPTIMISER, what=f"BFGS minimum (bound: L* − {OPTIMISER:g})",
                                              basis=BFGS_BASIS + " on a strictly convex quadratic"),
                               rules.at_most(worst_argmin, 1e-6, strict=True, what="max |W_BFGS − W*|",
                                             basis=BFGS_BASIS + " on a strictly convex quadratic"),
                               rules.round_off(identity_gap, ROUND_OFF, what="|R(W*) − L*|", basis=IDENTITY_BASIS),
                               rules.at_most(gradient, 1e-10, strict=True, what="max |∇R(W*)|", basis=IDENTITY_BASIS)),
                   notes="An identity between closed forms checked by optimisation; the Monte-"
                   "Carlo side is pgd_risk_formula and optimal_risk_monte_carlo, so no figure.")


def _risk_curve_figure(ns, theory_by_label, points_by_label, title, xlabel="context length $n$", logx=True):
    def figure():
        fig, ax = plots.figure()
        for (label, (xs, ys)), color in zip(theory_by_label.items(), ("C0", "C1", "C2", "C3", "C4")):
            plots.theory_line(ax, xs, ys, label=f"{label}: theory", color=color)
            if label in points_by_label:
                px, pm, pse = points_by_label[label]
                plots.simulation_points(ax, px, pm, pse, k=Z_TOLERANCE, color=color,
                                        label=f"{label}: simulation (±{Z_TOLERANCE:g} SE, the tolerance)")
        plots.finish(ax, title, xlabel, "risk", logx=logx)
        return fig
    return figure


@claim(
    "linear_attention_h3.optimal_risk_monte_carlo",
    reference=f"{PAPER}: Theorem 1 / Proposition 1 risk curves ({DOCS} §4.2, §10)",
    statement="The Monte-Carlo risk of the PGD predictor with W* equals L* at every context length n, for noiseless, "
              "noisy and non-isotropic data, and in setting A (correlated H and Ψ).",
    quick=dict(d=5, ns=(2, 5, 10, 20), n_prompts=20_000),
    full=dict(d=20, ns=(5, 10, 20, 40, 80), n_prompts=400_000),
)
def optimal_risk_monte_carlo(seed, d, ns, n_prompts):
    settings = {"IID, σ² = 0": (np.eye(d), 0.0), "IID, σ² = 0.5": (np.eye(d), 0.5),
                "Ψ = diag(1/k)": (np.diag(1.0 / np.arange(1, d + 1)), 0.5)}
    rows, theory, points = [], {}, {}
    seeds = iter(seeding.spawn(seed, len(settings) * len(ns)))
    for label, (Psi, s2) in settings.items():
        grid = np.arange(1, max(ns) + 1)
        theory[label] = (grid, [cf.optimal_risk(H3Problem(H=np.eye(d), Psi=Psi, sigma2=s2, n=int(n))) for n in grid])
        means, ses = [], []
        for n in ns:
            problem = H3Problem(H=np.eye(d), Psi=Psi, sigma2=s2, n=n)
            W = cf.optimal_preconditioner(problem)
            mc = _mc(problem, lambda p, W=W: dyn.pgd_predict(p, W), n_prompts, next(seeds))
            rows.append(dict(_mc_row(f"{label}, n = {n}", mc, cf.optimal_risk(problem)), n=n))
            means.append(mc.mean)
            ses.append(mc.standard_error)
        points[label] = (list(ns), means, ses)
    golden = cf.golden_setting_a()  # and the correlated H, Ψ of setting A
    W_star = cf.optimal_preconditioner(golden)
    mc = _mc(golden, lambda p: dyn.pgd_predict(p, W_star), 5 * n_prompts, seeding.named(seed, "setting_a"))
    rows.append(dict(_mc_row("setting A, n = 8", mc, cf.optimal_risk(golden)), n=golden.n))
    worst = _z_outcome_rows(rows)
    return Outcome(measured=dict(max_abs_z=worst), predicted=dict(z=0.0), labels=dict(max_abs_z="max |z|"),
                   rule=_z_rule(rows, "Monte-Carlo risk of W* − L* at each n"), details=rows,
                   figure=_risk_curve_figure(ns, theory, points, f"Optimal PGD risk against $n$ ($d = {d}$)"))


# ==================================================================================================================
# §3: the architectures reduce to PGD / WPGD
# ==================================================================================================================


def _random_tokens(rng, d, n, count=50):
    problem = H3Problem(H=np.eye(d), Psi=np.eye(d), sigma2=0.25, n=n)
    return dyn.sample_prompts(problem, count, rng)


def _odd_part(forward, prompts):
    """(f(y) − f(−y))/2: the part of a predictor odd in the labels (§3.1)."""
    flipped = dyn.Prompts(X=prompts.X, y=-prompts.y, x_query=prompts.x_query, y_query=-prompts.y_query,
                          beta=-prompts.beta)
    return (forward(prompts) - forward(flipped)) / 2


@claim(
    "linear_attention_h3.attention_reduces_to_pgd",
    reference=f"{PAPER}: Theorem 1, linear attention implements one step of PGD ({DOCS} §3.2)",
    statement="For any weights, the part of the linear-attention output odd in the labels is exactly the PGD "
              "predictor xᵀW_eff Xᵀy with W_eff = (v_y W_xx + w_xy v_xᵀ)/n, and the even part is "
              "(1/n)[xᵀW_xx(XᵀX + xxᵀ)v_x + v_y xᵀw_xy‖y‖²].",
    quick=dict(trials=5),
    full=dict(trials=50),
)
def attention_reduces_to_pgd(seed, trials):
    rng = np.random.default_rng(seed)
    worst_odd = worst_even = 0.0
    for _ in range(trials):
        d, n, dk = int(rng.integers(2, 6)), int(rng.integers(2, 12)), int(rng.integers(1, 7))
        Wq, Wk, v = rng.standard_normal((d + 1, dk)), rng.standard_normal((d + 1, dk)), rng.standard_normal(d + 1)
        prompts = _random_tokens(rng, d, n)
        forward = lambda p: dyn.attention_forward(dyn.token_matrices(p), Wq, Wk, v)
        W_eff = cf.attention_effective_preconditioner(Wq, Wk, v, n)
        odd = _odd_part(forward, prompts)
        worst_odd = max(worst_odd, float(np.abs(odd - dyn.pgd_predict(prompts, W_eff)).max()))
        W = Wq @ Wk.T
        X, x, y = prompts.X, prompts.x_query, prompts.y
        gram_v = np.einsum("bid,bie,e->bd", X, X, v[:d]) + x * (x @ v[:d])[:, None]
        even = (np.einsum("bd,de,be->b", x, W[:d, :d], gram_v) + v[d] * (x @ W[:d, d]) * np.sum(y * y, 1)) / n
        worst_even = max(worst_even, float(np.abs(forward(prompts) - odd - even).max()))
    return Outcome(measured=dict(odd_part_error=worst_odd, even_part_error=worst_even),
                   predicted=dict(odd_part_error=0.0, even_part_error=0.0),
                   labels=dict(odd_part_error="max |odd part − PGD(W_eff)|",
                               even_part_error="max |even part − formula|"),
                   rule=rules.round_off([worst_odd, worst_even], ROUND_OFF, what="both parts' max deviation",
                                        basis=IDENTITY_BASIS),
                   notes="A pure identity: no figure.")


@claim(
    "linear_attention_h3.h3_reduces_to_wpgd",
    reference=f"{PAPER}: Theorem 1, H3 implements one step of sample-weighted PGD ({DOCS} §3.3)",
    statement="For any weights and filter, the part of the H3 output odd in the labels is exactly the WPGD predictor "
              "xᵀW_H Xᵀ(ω⊙y) with W_H = (1/n)Σ_j q_{j,x}(v_{j,y}k_{j,x} + k_{j,y}v_{j,x})ᵀ and ωᵢ = f_{n+1−i}.",
    quick=dict(trials=5),
    full=dict(trials=50),
)
def h3_reduces_to_wpgd(seed, trials):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d, n, m = int(rng.integers(2, 6)), int(rng.integers(2, 12)), int(rng.integers(1, 7))
        Wq, Wk, Wv = (rng.standard_normal((d + 1, m)) for _ in range(3))
        f = rng.standard_normal(n + 1)
        prompts = _random_tokens(rng, d, n)
        odd = _odd_part(lambda p: dyn.h3_forward(dyn.token_matrices(p), Wq, Wk, Wv, f), prompts)
        W_H, omega = cf.h3_effective_parameters(Wq, Wk, Wv, f)
        worst = max(worst, float(np.abs(odd - dyn.wpgd_predict(prompts, W_H, omega)).max()))
    return Outcome(measured=dict(odd_part_error=worst), predicted=dict(odd_part_error=0.0),
                   labels=dict(odd_part_error="max |odd part − WPGD(W_H, ω)|"),
                   rule=rules.round_off(worst, ROUND_OFF, what="max |odd part − WPGD(W_H, ω)|", basis=IDENTITY_BASIS),
                   notes="A pure identity: no figure.")


@claim(
    "linear_attention_h3.odd_even_split",
    reference=f"{PAPER}: the symmetry behind Theorem 1 ({DOCS} §3.1)",
    statement="Under the sign symmetry of the data, the odd and even parts of the attention output are uncorrelated "
              "with each other and the even part with the label, so R_ATT = R_PGD(W_eff) + E[even²] (setting A, "
              "random weights).",
    quick=dict(n_prompts=100_000),
    full=dict(n_prompts=1_000_000),
)
def odd_even_split(seed, n_prompts):
    problem = cf.golden_setting_a()
    d, n = problem.d, problem.n
    rng = np.random.default_rng(seeding.spawn(seed, 1)[0])
    Wq, Wk = 0.5 * rng.standard_normal((d + 1, d + 1)), 0.5 * rng.standard_normal((d + 1, d + 1))
    v = np.append(0.3 * rng.standard_normal(d), 1.0)
    W_eff = cf.attention_effective_preconditioner(Wq, Wk, v, n)
    forward = lambda p: dyn.attention_forward(dyn.token_matrices(p), Wq, Wk, v)

    def excess(rng_, m):  # (ŷ − y_q)² − (odd − y_q)² − even² = 2 even·(odd − y_q): mean 0 by symmetry
        p = dyn.sample_prompts(problem, m, rng_)
        odd = _odd_part(forward, p)
        even = forward(p) - odd
        return 2 * even * (odd - p.y_query)

    cross = monte_carlo_mean(excess, n_prompts, seed=seeding.named(seed, "mc"))
    z = cross.z_score(0.0)
    odd_mc = _mc(problem, lambda p: dyn.pgd_predict(p, W_eff), n_prompts, seeding.named(seed, "odd"))
    z_odd = odd_mc.z_score(float(cf.pgd_risk(problem, W_eff)))
    return Outcome(measured=dict(z_cross=z, z_odd_risk=z_odd), predicted=dict(z_cross=0.0, z_odd_risk=0.0),
                   labels=dict(z_cross="z of E[2·even·(odd − y_q)]",
                               z_odd_risk="z of the odd part's risk vs R_PGD(W_eff)"),
                   rule=rules.z_test([z, z_odd], what="the cross term and the odd part's risk"),
                   details=[dict(cross_mean=cross.mean, cross_se=cross.standard_error, odd_risk=odd_mc.mean,
                                 odd_risk_se=odd_mc.standard_error, closed_form=float(cf.pgd_risk(problem, W_eff)))],
                   notes="Two z-scores of zero-mean quantities; a figure would show two points at 0.")


# ==================================================================================================================
# §8: training the real models
# ==================================================================================================================


def _training_figure(trajectories, optima, title):
    """Closed-form risk of each run's odd part against step (markers) and the closed-form optima (lines)."""
    def figure():
        fig, ax = plots.figure()
        colors = ("C0", "C1", "C2", "C3", "C4", "C5")
        for (label, trajectory), color in zip(trajectories.items(), colors):
            ax.plot(trajectory.times[1:], trajectory.metrics["risk"][1:], marker="o", markersize=2.5,
                    linestyle="none", color=color, label=f"trained {label}")
        for (label, value), style in zip(optima.items(), ("--", ":", "-.", (0, (5, 1)))):
            plots.theory_line(ax, [1, max(t.times[-1] for t in trajectories.values())], [value, value],
                              label=label, linestyle=style)
        plots.finish(ax, title, "training step", "risk", logx=True, logy=True)
        plots.show_all_log_ticks(ax)
        return fig
    return figure


def _paired_gap(problem, trajectory, reference, n_prompts, seed, W0=None):
    return dyn.paired_risk_difference(problem, dyn.trained_predictor(trajectory, W0), reference, n_prompts, seed=seed)


def _training_rule(gap, optimum, what: str) -> rules.Rule:
    """|paired gap| < TRAINING_ALLOWANCE·optimum + Z_TOLERANCE SE (§8.1), the verdict of every training claim."""
    return rules.at_most(abs(gap.mean), TRAINING_ALLOWANCE * optimum + Z_TOLERANCE * gap.standard_error, strict=True,
                         what=f"|{what}| ({TRAINING_ALLOWANCE:.0%} of the optimum + {Z_TOLERANCE:g} SE)",
                         basis=TRAINING_BASIS, false_fail_rate=ALPHA)


@claim(
    "linear_attention_h3.trained_attention_reaches_optimum",
    reference=f"{PAPER}: Theorem 1, the optimal linear attention is the optimal PGD ({DOCS} §3.2, §8)",
    statement="Linear attention trained with Adam on fresh prompts (value initialised to read the label) reaches the "
              "PGD optimum L* and its effective preconditioner W_eff reaches W* (setting A).",
    # 800 steps left W_eff more than 5% from W* in 17 of 200 seeds (errors 0.05–0.41: the slow directions of the
    # factorised model); from those same seeds 2000 steps reach 0.005–0.03.
    quick=dict(steps=2000, batch_size=256, n_prompts=50_000),
    full=dict(steps=4000, batch_size=512, n_prompts=1_000_000),
)
def trained_attention_reaches_optimum(seed, steps, batch_size, n_prompts):
    problem = cf.golden_setting_a()
    L_star, W_star = cf.optimal_risk(problem), cf.optimal_preconditioner(problem)
    run = dyn.train(problem, "attention", seed=seeding.named(seed, "train"), steps=steps, batch_size=batch_size,
                    final_fraction=DECAY)
    gap = _paired_gap(problem, run, lambda p: dyn.pgd_predict(p, W_star), n_prompts, seeding.named(seed, "mc"))
    error = float(np.linalg.norm(run.states["W"][-1] - W_star) / np.linalg.norm(W_star))
    return Outcome(measured=dict(risk_gap=gap.mean, relative_w_error=error),
                   predicted=dict(risk_gap=0.0, relative_w_error=0.0),
                   labels=dict(risk_gap="paired MC R(trained) − L*", relative_w_error="‖W_eff − W*‖/‖W*‖"),
                   rule=all_of(_training_rule(gap, L_star, "paired R(trained) − L*"),
                               rules.at_most(error, 0.05, strict=True, what="‖W_eff − W*‖/‖W*‖", basis=TRAINING_BASIS)),
                   details=[dict(gap=gap.mean, gap_se=gap.standard_error, L_star=L_star,
                                 final_odd_risk=run.last("risk"))],
                   figure=_training_figure({"attention": run}, {"$L^*$": L_star}, "Linear attention, setting A"))


def _branch_point(problem):
    """Weights on the branch v_y = 0, W_xx = 0 whose effective preconditioner is the rank-one optimum W*_1 (§8.3)."""
    d, n = problem.d, problem.n
    W1 = cf.low_rank_preconditioner(problem, 1)
    values, vectors = np.linalg.eigh((W1 + W1.T) / 2)
    b = vectors[:, -1] * np.sqrt(values[-1])
    product = np.zeros((d + 1, d + 1))
    product[:d, d] = n * b                       # w_xy
    return np.eye(d + 1), product.T.copy(), np.append(b, 0.0)   # W_q W_kᵀ = product; v = (b, 0)


@claim(
    "linear_attention_h3.attention_spurious_branch",
    reference=f"{PAPER}: the optimisation landscape of the factorised attention ({DOCS} §8.3; beyond the paper)",
    statement="The factorised linear attention has a stationary branch v_y = 0, W_xx = 0 on which it is a rank-one "
              "PGD with risk L*_1 > L*: the population gradient vanishes there, and runs from a small random "
              "initialisation end at L* or at L*_1.",
    # At 800 steps a run from a random value initialisation had reached neither L* nor L*_1 in 15 of 200
    # calibration seeds; from those seeds every run has settled at one of the two by step 2000.
    quick=dict(n_prompts=100_000, seeds=2, steps=2000),
    full=dict(n_prompts=2_000_000, seeds=8, steps=4000),
)
def attention_spurious_branch(seed, n_prompts, seeds, steps):
    problem = cf.golden_setting_a()
    L_star, L_one = cf.optimal_risk(problem), cf.low_rank_optimal_risk(problem, 1)
    Wq, Wk, v = _branch_point(problem)
    chunks, chunk = [], 10_000
    for rng in seeding.generators(seeding.named(seed, "gradient"), max(2, n_prompts // chunk)):
        batch = dyn.sample_prompts(problem, chunk, rng)
        net = dyn.make_model("attention", problem, rng)
        net.params[:] = [Wq.copy(), Wk.copy(), v.copy()]
        loss, grads = net.gradient(batch, dyn.token_matrices(batch))
        chunks.append(np.concatenate([g.ravel() for g in grads] + [[loss]]))
    chunks = np.array(chunks)
    mean, se = chunks.mean(0), chunks.std(0, ddof=1) / np.sqrt(len(chunks))
    df = len(chunks) - 1
    t_bound = float(scipy_stats.t.isf(ALPHA / 2 / (mean.size - 1), df))   # Bonferroni over the coordinates
    moving = se[:-1] > 1e-14
    t_gradient = float(np.max(np.abs(mean[:-1][moving] / se[:-1][moving])))
    t_risk = float((mean[-1] - L_one) / se[-1])
    finals = []
    for k in range(seeds):
        run = dyn.train(problem, "attention", seed=seeding.child(seeding.named(seed, "runs"), k), steps=steps,
                        value_init="random", final_fraction=DECAY)
        finals.append(run)
    ends = [t.last("risk") for t in finals]
    at_optimum = [abs(r - L_star) < TRAINING_ALLOWANCE * L_star for r in ends]
    at_branch = [abs(r - L_one) < TRAINING_ALLOWANCE * L_one for r in ends]
    branch_basis = f"t over {len(chunks)} independent batches of {chunk} prompts"
    rule = all_of(rules.condition(t_gradient < t_bound and abs(t_risk) < t_bound,
                                  f"|t| < {t_bound:.2f} for the branch's gradient and risk (Student t, {df} d.f., "
                                  f"Bonferroni over {mean.size - 1} coordinates)", basis=branch_basis,
                                  false_fail_rate=2 * ALPHA),
                  rules.condition(all(a or b for a, b in zip(at_optimum, at_branch)),
                                  f"each run within {TRAINING_ALLOWANCE:.0%} of L* or L*_1",
                                  basis="training allowance as in the other training claims"),
                  rules.at_least(L_one, L_star, strict=True, what="L*_1 (the branch)", basis=IDENTITY_BASIS))
    return Outcome(measured=dict(max_gradient_t=t_gradient, branch_risk_t=t_risk, runs_at_optimum=sum(at_optimum),
                                 runs_at_branch=sum(at_branch)),
                   predicted=dict(gradient_t=0.0, branch_risk_t=0.0, runs=seeds),
                   labels=dict(max_gradient_t="max |t| of the gradient on the branch",
                               branch_risk_t="t of the branch risk against $L^*_1$",
                               runs_at_optimum="runs ending at $L^*$", runs_at_branch="runs ending at $L^*_1$",
                               runs="runs ending at one of the two"),
                   rule=rule,
                   details=[dict(L_star=L_star, L_one=L_one, final_risks=ends)],
                   notes="The branch is stationary by the sign symmetry (§8.3); which runs reach it depends on the "
                         "initialisation, so the count is reported, not tested.",
                   figure=_training_figure({f"seed {k}": t for k, t in enumerate(finals)},
                                           {"$L^*$": L_star, "$L^*_1$ (branch)": L_one},
                                           "Attention from a random value initialisation"))


# ==================================================================================================================
# §6: sample weighting, WPGD and H3
# ==================================================================================================================


def _random_psd(rng, size, scale=1.0):
    A = rng.standard_normal((size, size))
    return scale * (A @ A.T / size + 0.2 * np.eye(size))


@claim(
    "linear_attention_h3.wpgd_risk_formula",
    reference=f"{PAPER}: WPGD risk with heteroscedastic noise and task drift ({DOCS} §6.1)",
    statement="R(W, ω) = tr(HΨ) + σ_q² − 2(1ᵀω)tr(HWHΨ) + tr(WᵀHWM_ω) equals the Monte-Carlo risk of "
              "xᵀWXᵀ(ω⊙y) at random W, ω with general H, Ψ, Δ, a random drift covariance C and per-position noise.",
    quick=dict(n_prompts=50_000),
    full=dict(n_prompts=1_000_000),
)
def wpgd_risk_formula(seed, n_prompts):
    rng = np.random.default_rng(seeding.spawn(seed, 1)[0])
    d, n = 4, 10
    rows = []
    for i, mc_seed in enumerate(seeding.spawn(seeding.named(seed, "mc"), 3)):
        problem = H3Problem(H=_random_psd(rng, d), Psi=_random_psd(rng, d), sigma2=0.3, n=n,
                            noise=rng.uniform(0.1, 3, n), drift=_random_psd(rng, n, 0.1), Delta=_random_psd(rng, d))
        omega = rng.uniform(0.2, 1.5, n)
        W = cf.optimal_weighted_preconditioner(problem, omega) + _random_preconditioner(rng, problem)
        mc = _mc(problem, lambda p, W=W, omega=omega: dyn.wpgd_predict(p, W, omega), n_prompts, mc_seed)
        rows.append(_mc_row(f"instance {i + 1}", mc, cf.wpgd_risk(problem, W, omega)))
    return Outcome(measured=_ids(r["z"] for r in rows), predicted={f"z_{i + 1}": 0.0 for i in range(3)},
                   labels={f"z_{i + 1}": f"z, random instance {i + 1}" for i in range(3)},
                   rule=_z_rule(rows, "Monte-Carlo WPGD risk − closed form at each instance"), details=rows,
                   figure=_z_figure(rows, "WPGD risk with drift and heteroscedastic noise"))


@claim(
    "linear_attention_h3.uniform_weights_optimal_iid",
    reference=f"{PAPER}: Theorem 1, with exchangeable examples H3 is no better than linear attention ({DOCS} §3.4)",
    statement="In the IID design the best sample weighting is uniform: min over ω of min_W R(W, ω) equals L*_PGD, "
              "and the minimising ω is constant (setting A).",
    quick=dict(starts=3),
    full=dict(starts=20),
)
def uniform_weights_optimal_iid(seed, starts):
    problem = cf.golden_setting_a()
    L_star = cf.optimal_risk(problem)
    rng = np.random.default_rng(seed)
    best, spread = np.inf, 0.0
    for _ in range(starts):
        result = minimize(lambda w: cf.optimal_risk_for_weights(problem, w), rng.uniform(0.2, 2, problem.n),
                          method="BFGS", options=dict(gtol=1e-12))
        best = min(best, result.fun)
        spread = max(spread, float(np.ptp(result.x) / np.abs(result.x).mean()))
    return Outcome(measured=dict(best_wpgd_risk=best, weight_spread=spread),
                   predicted=dict(best_wpgd_risk=L_star, weight_spread=0.0),
                   labels=dict(best_wpgd_risk="min_ω min_W R(W, ω)", weight_spread="(max ω − min ω)/mean ω"),
                   rule=all_of(rules.at_least(best, L_star - OPTIMISER, what=f"BFGS minimum (bound: L* − {OPTIMISER:g})",
                                              basis=BFGS_BASIS + " on a smooth closed form"),
                               rules.at_most(abs(best - L_star), OPTIMISER, strict=True, what="|min − L*|",
                                             basis=BFGS_BASIS + " on a smooth closed form"),
                               rules.at_most(spread, 1e-4, strict=True, what="weight spread (max ω − min ω)/mean ω",
                                             basis=BFGS_BASIS + " on a smooth closed form")),
                   notes="An optimisation of closed forms; a figure would show constant weights.")


def _heteroscedastic_problem():
    """§6.4: d = 4, n = 10, old noisy examples (σ² = 10) and recent clean ones (σ² = 0.1), σ_q² = 0.1."""
    return H3Problem(H=np.eye(4), Psi=np.eye(4), sigma2=0.1, n=10, noise=[10.0] * 5 + [0.1] * 5)


def _drift_problem():
    """§6.4: random-walk drift ρ² = 0.3, σ² = 0.1 everywhere."""
    return H3Problem(H=np.eye(4), Psi=np.eye(4), sigma2=0.1, n=10, drift=cf.random_walk_drift(10, 0.3))


def _weighting_rows(problem, n_prompts, seed):
    L_h3, v = cf.h3_optimum(problem)
    L_att, c = cf.attention_optimum(problem)
    identity = np.eye(problem.d)
    h3_seed, att_seed = seeding.spawn(seed, 2)
    h3 = _mc(problem, lambda p: dyn.wpgd_predict(p, identity, v), n_prompts, h3_seed)
    att = _mc(problem, lambda p: dyn.pgd_predict(p, c * identity), n_prompts, att_seed)
    return [_mc_row("H3 optimum (v*)", h3, L_h3), _mc_row("attention optimum (c·I)", att, L_att)], L_h3, L_att, v


@claim(
    "linear_attention_h3.heteroscedastic_optima",
    reference=f"{PAPER}: H3's sample weighting outperforms linear attention ({DOCS} §6.3)",
    statement="With per-position noise and H = Ψ = I: L*_H3 = σ_q² + d/(1 + Σ1/tᵢ) < L*_ATT = σ_q² + d/(1 + n²/Σtᵢ), "
              "tᵢ = d + 1 + σᵢ², with optimal weights ωᵢ ∝ 1/tᵢ; the Monte-Carlo risks of both optimal predictors "
              "match, and no weighting (BFGS over ω) beats L*_H3.",
    quick=dict(n_prompts=100_000),
    full=dict(n_prompts=1_000_000),
)
def heteroscedastic_optima(seed, n_prompts):
    problem = _heteroscedastic_problem()
    forms = cf.heteroscedastic_optima(problem)
    rows, L_h3, L_att, v = _weighting_rows(problem, n_prompts, seed)
    identity_gap = max(abs(forms["h3"] - L_h3), abs(forms["attention"] - L_att),
                       float(np.abs(v / v.sum() - forms["weights"]).max()))
    result = minimize(lambda w: cf.optimal_risk_for_weights(problem, w), np.ones(problem.n), method="BFGS",
                      options=dict(gtol=1e-12))
    return Outcome(measured=dict(z_h3=rows[0]["z"], z_attention=rows[1]["z"], closed_form_gap=identity_gap,
                                 bfgs_weighted_minimum=float(result.fun)),
                   predicted=dict(z_h3=0.0, z_attention=0.0, closed_form_gap=0.0, h3_optimum=L_h3,
                                  attention_optimum=L_att),
                   labels=dict(z_h3="z of the H3 optimum's risk", z_attention="z of the attention optimum's risk",
                               closed_form_gap="|Sherman–Morrison − linear solve|",
                               bfgs_weighted_minimum="BFGS min over ω of min_W R", h3_optimum="$L^*_{H3}$",
                               attention_optimum="$L^*_{ATT}$"),
                   rule=all_of(_z_rule(rows, "Monte-Carlo risk of each optimum − its closed form"),
                               rules.round_off(identity_gap, ROUND_OFF, what="|Sherman–Morrison − linear solve|",
                                               basis=IDENTITY_BASIS),
                               rules.at_least(float(result.fun), L_h3 - OPTIMISER,
                                              what=f"BFGS min over ω (bound: L*_H3 − {OPTIMISER:g})", basis=BFGS_BASIS),
                               rules.at_least(L_att, L_h3, strict=True, what="L*_ATT (above L*_H3)",
                                              basis=IDENTITY_BASIS)),
                   details=rows,
                   figure=_z_figure(rows, "Heteroscedastic noise: optimal H3 and attention risks"))


@claim(
    "linear_attention_h3.drift_optima",
    reference=f"{PAPER}: H3 under a non-stationary task ({DOCS} §6.2, §6.4)",
    statement="Under random-walk task drift the optimal WPGD weights v* = 𝕄⁻¹1 increase towards the query and "
              "L*_H3 = d + σ_q² − d1ᵀ𝕄⁻¹1 < L*_ATT; both optimal predictors' Monte-Carlo risks match.",
    quick=dict(n_prompts=50_000),
    full=dict(n_prompts=1_000_000),
)
def drift_optima(seed, n_prompts):
    problem = _drift_problem()
    rows, L_h3, L_att, v = _weighting_rows(problem, n_prompts, seed)
    monotone = bool(np.all(np.diff(v) > 0))

    def figure():
        fig, axes = plots.figure(ncols=2)
        positions = np.arange(1, problem.n + 1)
        plots.theory_line(axes[0], positions, v / v.max(), label="$v^*/v^*_{\\max}$ (closed form)")
        plots.finish(axes[0], "Optimal H3 weights, random-walk drift $\\rho^2 = 0.3$", "example position $i$",
                     "relative weight")
        x = np.arange(len(rows))
        plots.theory_line(axes[1], x, [r["predicted"] for r in rows], label="closed form", marker="_",
                          markersize=14, linestyle="none")
        plots.simulation_points(axes[1], x, [r["measured"] for r in rows], [r["standard_error"] for r in rows],
                                k=Z_TOLERANCE, label=f"Monte Carlo (±{Z_TOLERANCE:g} SE, the tolerance)")
        axes[1].set_xticks(x, [r["label"] for r in rows], fontsize=8)
        axes[1].set_xlim(-0.5, len(rows) - 0.5)
        plots.finish(axes[1], "Optimal risks under drift", "predictor", "risk")
        return fig

    return Outcome(measured=dict(z_h3=rows[0]["z"], z_attention=rows[1]["z"], weights_increasing=monotone),
                   predicted=dict(z_h3=0.0, z_attention=0.0, h3_optimum=L_h3, attention_optimum=L_att),
                   labels=dict(z_h3="z of the H3 optimum's risk", z_attention="z of the attention optimum's risk",
                               weights_increasing="v* increasing towards the query", h3_optimum="$L^*_{H3}$",
                               attention_optimum="$L^*_{ATT}$"),
                   rule=all_of(_z_rule(rows, "Monte-Carlo risk of each optimum − its closed form"),
                               rules.condition(monotone, "v* strictly increasing towards the query", basis=IDENTITY_BASIS),
                               rules.at_least(L_att, L_h3, strict=True, what="L*_ATT (above L*_H3)",
                                              basis=IDENTITY_BASIS)),
                   details=rows, figure=figure)


@claim(
    "linear_attention_h3.trained_h3_beats_attention",
    reference=f"{PAPER}: H3 implements sample weighting and outperforms linear attention ({DOCS} §6.3, §8)",
    statement="Under heteroscedastic noise, H3 trained with Adam reaches L*_H3 with a learned filter ∝ 1/(d+1+σᵢ²), "
              "and trained linear attention reaches the larger L*_ATT.",
    quick=dict(steps=800, batch_size=256, n_prompts=50_000),
    full=dict(steps=4000, batch_size=512, n_prompts=1_000_000),
)
def trained_h3_beats_attention(seed, steps, batch_size, n_prompts):
    problem = _heteroscedastic_problem()
    L_h3, v = cf.h3_optimum(problem)
    L_att, c = cf.attention_optimum(problem)
    identity = np.eye(problem.d)
    runs = {model: dyn.train(problem, model, seed=seeding.named(seed, model), steps=steps, batch_size=batch_size,
                             final_fraction=DECAY)
            for model in ("h3", "attention")}
    gap_h3 = _paired_gap(problem, runs["h3"], lambda p: dyn.wpgd_predict(p, identity, v), n_prompts,
                         seeding.named(seed, "mc_h3"))
    gap_att = _paired_gap(problem, runs["attention"], lambda p: dyn.pgd_predict(p, c * identity), n_prompts,
                          seeding.named(seed, "mc_att"))
    learned = runs["h3"].states["omega"][-1]
    filter_error = float(np.abs(learned / learned.sum() - v / v.sum()).max() / (v / v.sum()).max())

    def figure():
        fig, axes = plots.figure(ncols=2)
        positions = np.arange(1, problem.n + 1)
        plots.theory_line(axes[0], positions, v / v.sum(), label="$\\omega^* \\propto 1/(d+1+\\sigma_i^2)$")
        plots.simulation_points(axes[0], positions, learned / learned.sum(), label="learned filter")
        plots.finish(axes[0], "H3 filter (normalised)", "example position $i$", "weight")
        for (label, run), color, optimum in zip(runs.items(), ("C0", "C1"), (L_h3, L_att)):
            axes[1].plot(run.times[1:], run.metrics["risk"][1:], marker="o", markersize=2.5, linestyle="none",
                         color=color, label=f"trained {label}")
            plots.theory_line(axes[1], [1, run.times[-1]], [optimum, optimum], color=color,
                              label=f"$L^*$ {label}")
        plots.finish(axes[1], "Risk during training", "training step", "risk", logx=True, logy=True)
        plots.show_all_log_ticks(axes[1])
        return fig

    return Outcome(measured=dict(h3_gap=gap_h3.mean, attention_gap=gap_att.mean, filter_error=filter_error),
                   predicted=dict(h3_gap=0.0, attention_gap=0.0, filter_error=0.0, h3_optimum=L_h3,
                                  attention_optimum=L_att),
                   labels=dict(h3_gap="paired R(trained H3) − $L^*_{H3}$",
                               attention_gap="paired R(trained ATT) − $L^*_{ATT}$",
                               filter_error="max |learned − optimal| / max optimal weight",
                               h3_optimum="$L^*_{H3}$", attention_optimum="$L^*_{ATT}$"),
                   rule=all_of(_training_rule(gap_h3, L_h3, "paired R(trained H3) − L*_H3"),
                               _training_rule(gap_att, L_att, "paired R(trained ATT) − L*_ATT"),
                               rules.at_most(filter_error, 0.1, strict=True,
                                             what="max |learned − optimal filter| / max optimal weight",
                                             basis=TRAINING_BASIS)),
                   figure=figure,
                   details=[dict(h3_gap=gap_h3.mean, h3_se=gap_h3.standard_error, attention_gap=gap_att.mean,
                                 attention_se=gap_att.standard_error)])


# ==================================================================================================================
# §7: retrieval and alignment
# ==================================================================================================================


def _correlated_problem(design, d=5, n=10, alpha=0.5, sigma2=0.2):
    return H3Problem(H=np.eye(d), Psi=np.eye(d), sigma2=sigma2, n=n, design=design, alpha=alpha)


def _correlated_moment_claim(seed, design, n_prompts):
    problem = _correlated_problem(design)
    moments = cf.correlated_moments(problem)
    L_star, c_star = cf.correlated_optimum(problem)
    a_seed, b_seed, risk_seed = seeding.spawn(seed, 3)

    def statistic(which):
        def draw(rng, m):
            p = dyn.sample_prompts(problem, m, rng)
            u = dyn.pgd_predict(p, np.eye(problem.d))
            return p.y_query * u if which == "A" else u * u
        return draw

    A = monte_carlo_mean(statistic("A"), n_prompts, seed=a_seed)
    B = monte_carlo_mean(statistic("B"), n_prompts, seed=b_seed)
    risk = _mc(problem, lambda p: dyn.pgd_predict(p, c_star * np.eye(problem.d)), n_prompts, risk_seed)
    rows = [_mc_row("A = E[y_q u]", A, moments.A), _mc_row("B = E[u²]", B, moments.B),
            _mc_row("risk of c*·I", risk, L_star)]

    def figure():
        fig, ax = plots.figure()
        x = np.arange(3)
        ratio = [r["measured"] / r["predicted"] for r in rows]
        plots.theory_line(ax, [-0.3, 2.3], [1, 1], label="closed form")
        plots.simulation_points(ax, x, ratio, [r["standard_error"] / r["predicted"] for r in rows], k=Z_TOLERANCE,
                                label=f"Monte Carlo / closed form (±{Z_TOLERANCE:g} SE, the tolerance)")
        ax.set_xticks(x, [r["label"] for r in rows], fontsize=8)
        plots.finish(ax, f"{design.upper()} design, $d = 5$, $n = 10$, $\\alpha = 0.5$", "moment", "ratio")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
        return fig

    return Outcome(measured={f"z_{k}": r["z"] for k, r in zip(("a", "b", "risk"), rows)},
                   predicted=dict(moment_a=moments.A, moment_b=moments.B, optimal_risk=L_star),
                   labels=dict(z_a="z of A", z_b="z of B", z_risk="z of the optimal risk", moment_a="A",
                               moment_b="B", optimal_risk="$L^*$"),
                   rule=_z_rule(rows, "Monte Carlo − closed form of each moment"),
                   details=rows, figure=figure)


@claim(
    "linear_attention_h3.rag_moments",
    reference=f"{PAPER}: retrieval-augmented examples ({DOCS} §7.1)",
    statement="With retrieved examples x_i = αx + √(1−α²)g_i, A = nd(1 + α²(d+1)), B = nD₁ + n(n−1)D₂ and "
              "L*_RAG = d + σ² − A²/B match Monte Carlo.",
    quick=dict(n_prompts=100_000),
    full=dict(n_prompts=1_000_000),
)
def rag_moments(seed, n_prompts):
    return _correlated_moment_claim(seed, "rag", n_prompts)


@claim(
    "linear_attention_h3.tfa_moments",
    reference=f"{PAPER}: task–feature alignment ({DOCS} §7.1)",
    statement="With aligned examples x_i | β ~ N(0, (1−α²)I + α²ββᵀ) and an independent query, A, B and L*_TFA of "
              "the closed form match Monte Carlo.",
    quick=dict(n_prompts=100_000),
    full=dict(n_prompts=1_000_000),
)
def tfa_moments(seed, n_prompts):
    return _correlated_moment_claim(seed, "tfa", n_prompts)


def _multiplier(design, d, n, alpha, sigma2=0.0):
    risk = cf.isotropic_correlated_optimum(design, d, n, alpha, sigma2)[0]
    return cf.isotropic_effective_sample_size(d, sigma2, risk) / n


@claim(
    "linear_attention_h3.alignment_multiplier_proportional",
    reference=f"{PAPER}: alignment increases the usable sample size by κ = α²d + 1 ({DOCS} §7.2)",
    statement="In the proportional limit (α²d = c fixed, n = ρd, d → ∞) the effective sample size of the RAG and TFA "
              "optima is n_eff = (1 + α²d) n: at d = 1000 within 2% for c ∈ {1, 3}, ρ ∈ {0.1, 0.5, 1, 2}.",
    quick=dict(d=1000),
    full=dict(d=4000),
)
def alignment_multiplier_proportional(seed, d):
    rows = []
    for design in ("rag", "tfa"):
        for c in (1.0, 3.0):
            for rho in (0.1, 0.5, 1.0, 2.0):
                ratio = _multiplier(design, d, int(round(rho * d)), np.sqrt(c / d))
                rows.append(dict(design=design, c=c, rho=rho, ratio=ratio, kappa=1 + c,
                                 deviation=abs(ratio / (1 + c) - 1)))
    worst = max(r["deviation"] for r in rows)

    def figure():
        fig, ax = plots.figure()
        rhos = np.geomspace(0.05, 4, 25)
        for (design, c), color in zip([("rag", 1.0), ("rag", 3.0), ("tfa", 1.0), ("tfa", 3.0)],
                                      ("C0", "C1", "C2", "C3")):
            for dd, style in ((50, ":"), (d, "-")):
                ratios = [_multiplier(design, dd, max(1, int(round(r * dd))), np.sqrt(c / dd)) for r in rhos]
                ax.plot(rhos, ratios, linestyle=style, color=color,
                        label=f"{design.upper()}, $\\alpha^2 d = {c:g}$, $d = {dd}$")
            ax.axhline(1 + c, color="black", linewidth=0.8, linestyle="--")
        plots.finish(ax, "Effective sample size: exact against $\\kappa = \\alpha^2 d + 1$ (dashed)",
                     "$\\rho = n/d$", "$n_{\\rm eff}/n$", logx=True)
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
        return fig

    return Outcome(measured=dict(max_relative_deviation=worst), predicted=dict(max_relative_deviation=0.0),
                   labels=dict(max_relative_deviation="max |n_eff/n ÷ κ − 1|"),
                   rule=rules.at_most(worst, 0.02, strict=True, what="max |n_eff/n ÷ κ − 1|",
                                      basis="deterministic closed forms; 2% is the finite-d bias at d = 1000 (O(1/d) "
                                            "and O(ρ/d))"),
                   details=rows, figure=figure)


@claim(
    "linear_attention_h3.alignment_multiplier_fixed_alpha",
    reference=f"{PAPER}: alignment increases the usable sample size by κ = α²d + 1 ({DOCS} §7.2)",
    statement="At fixed α and finite d the RAG optimum's effective sample size is κn = (α²d + 1)n (d = 20, α = 0.5, "
              "κ = 6; within 5%).",
    quick=dict(ns=(5, 10, 20), n_prompts=20_000),
    full=dict(ns=(2, 5, 10, 20, 40, 80), n_prompts=400_000),
    finding=FINDINGS["linear_attention_h3.alignment_multiplier_fixed_alpha"],
)
def alignment_multiplier_fixed_alpha(seed, ns, n_prompts):
    d, alpha = 20, 0.5
    kappa = cf.alignment_multiplier(d, alpha)
    rows = []
    for n, mc_seed in zip(ns, seeding.spawn(seed, len(ns))):
        problem = _correlated_problem("rag", d=d, n=n, alpha=alpha, sigma2=0.0)
        L_star, c_star = cf.correlated_optimum(problem)
        mc = _mc(problem, lambda p, c=c_star: dyn.pgd_predict(p, c * np.eye(d)), n_prompts, mc_seed)
        n_eff = cf.effective_sample_size(problem, mc.mean)
        # delta method: d n_eff / dL = −d(d+1)/L² at σ² = 0
        se = d * (d + 1) / mc.mean**2 * mc.standard_error / n
        rows.append(dict(n=n, exact=cf.effective_sample_size(problem, L_star) / n, measured=n_eff / n,
                         standard_error=se, z_risk=mc.z_score(L_star), kappa=kappa))
    worst = max(abs(r["exact"] / kappa - 1) for r in rows)
    consistent = max(abs(r["z_risk"]) for r in rows) < Z_TOLERANCE
    # Against d at the same fixed α: n_eff/(κn) settles to a ρ-dependent constant, not to 1 (§7.2).
    dims = (20, 50, 100, 200, 1000)
    against_d = {rho: [_multiplier("rag", dd, max(1, int(rho * dd)), alpha) / cf.alignment_multiplier(dd, alpha)
                       for dd in dims] for rho in (0.25, 1.0)}

    def figure():
        fig, axes = plots.figure(ncols=2)
        ax = axes[0]
        grid = np.arange(1, max(ns) * 2 + 1)
        plots.theory_line(ax, grid, [_multiplier("rag", d, int(n), alpha) for n in grid],
                          label="exact $n_{\\rm eff}/n$ (closed form)")
        ax.axhline(kappa, color="C3", linestyle=":", label=f"$\\kappa = \\alpha^2 d + 1 = {kappa:g}$")
        plots.simulation_points(ax, [r["n"] for r in rows], [r["measured"] for r in rows],
                                [r["standard_error"] for r in rows], k=Z_TOLERANCE,
                                label=f"Monte Carlo (±{Z_TOLERANCE:g} SE)")
        plots.finish(ax, f"RAG at fixed $\\alpha = {alpha}$, $d = {d}$", "context length $n$", "$n_{\\rm eff}/n$",
                     logx=True)
        for (rho, values), color in zip(against_d.items(), ("C0", "C1")):
            plots.theory_line(axes[1], dims, values, color=color,
                              label=f"$n = {rho:g}\\,d$ (closed form)")
        axes[1].axhline(1.0, color="C3", linestyle=":", label="$n_{\\rm eff} = \\kappa n$")
        plots.finish(axes[1], f"Against $d$ at fixed $\\alpha = {alpha}$", "dimension $d$",
                     "$n_{\\rm eff}/(\\kappa n)$", logx=True)
        return fig

    measured = {f"ratio_n{r['n']}": r["exact"] for r in rows}
    measured.update(ratio_over_kappa_d1000_quarter=against_d[0.25][-1], ratio_over_kappa_d1000_equal=against_d[1.0][-1])
    return Outcome(measured=dict(measured, max_relative_deviation=worst),
                   predicted=dict(kappa=kappa, max_relative_deviation=0.0, ratio_over_kappa=1.0),
                   labels={**{f"ratio_n{r['n']}": f"$n_{{\\rm eff}}/n$ at n = {r['n']}" for r in rows},
                           "kappa": "κ = α²d + 1", "max_relative_deviation": "max |ratio/κ − 1|",
                           "ratio_over_kappa_d1000_quarter": "n_eff/(κn) at d = 1000, n = d/4",
                           "ratio_over_kappa_d1000_equal": "n_eff/(κn) at d = 1000, n = d",
                           "ratio_over_kappa": "n_eff/(κn) if the rule held"},
                   rule=all_of(rules.at_most(worst, 0.05, strict=True, what="max |ratio/κ − 1|",
                                             basis="deterministic closed form, confirmed by Monte Carlo of the optimal "
                                                   "predictor"),
                               rules.condition(consistent, f"the Monte-Carlo risks within {Z_TOLERANCE:g} SE of the "
                                               "closed form", basis="deterministic closed form, confirmed by Monte "
                                                                    "Carlo of the optimal predictor")),
                   figure=figure,
                   notes="Measured with σ² = 0. The Monte-Carlo risks agree with the closed form "
                         f"({'yes' if consistent else 'NO'}), so the gap to κ is real, not a closed-form error. "
                         "Against d at the same α, n_eff/(κn) does not tend to 1 but to a constant that depends on "
                         "n/d (about 1.14 at n = d/4 and 0.80 at n = d): only α²d fixed gives κ.",
                   details=rows + [dict(d=dd, rho=rho, ratio_over_kappa=v) for rho, values in against_d.items()
                                   for dd, v in zip(dims, values)])


@claim(
    "linear_attention_h3.trained_attention_rag",
    reference=f"{PAPER}: linear attention on retrieved examples ({DOCS} §7.1, §8)",
    statement="Linear attention trained on RAG prompts reaches L*_RAG = min_c R(cI): a scaled identity is the optimal "
              "preconditioner in the correlated design.",
    # 800 steps left 3 of 200 calibration seeds short of the optimum (risk gap 0.05–0.14, W_eff 21–35% off cI);
    # from those seeds 2000 steps reach gaps of 3e-4–2e-3 and 2.5–4% off cI.
    quick=dict(steps=2000, batch_size=256, n_prompts=50_000),
    full=dict(steps=4000, batch_size=512, n_prompts=1_000_000),
)
def trained_attention_rag(seed, steps, batch_size, n_prompts):
    problem = _correlated_problem("rag")
    L_star, c_star = cf.correlated_optimum(problem)
    run = dyn.train(problem, "attention", seed=seeding.named(seed, "train"), steps=steps, batch_size=batch_size,
                    final_fraction=DECAY)
    gap = _paired_gap(problem, run, lambda p: dyn.pgd_predict(p, c_star * np.eye(problem.d)), n_prompts,
                      seeding.named(seed, "mc"))
    W = run.states["W"][-1]
    off_identity = float(np.linalg.norm(W - np.trace(W) / problem.d * np.eye(problem.d)) / np.linalg.norm(W))

    def figure():
        fig, ax = plots.figure()
        ax.plot(run.times[1:], run.metrics["batch_loss"][1:], marker="o", markersize=2.5, linestyle="none",
                label="trained attention: minibatch loss")
        plots.theory_line(ax, [1, run.times[-1]], [L_star, L_star], label="$L^*_{\\rm RAG}$")
        plots.finish(ax, "Linear attention on RAG prompts ($d = 5$, $n = 10$, $\\alpha = 0.5$)", "training step",
                     "risk", logx=True, logy=True)
        plots.show_all_log_ticks(ax)
        return fig

    return Outcome(measured=dict(risk_gap=gap.mean, off_identity=off_identity),
                   predicted=dict(risk_gap=0.0, optimal_risk=L_star),
                   labels=dict(risk_gap="paired R(trained) − $L^*_{\\rm RAG}$",
                               off_identity="‖W_eff − (tr W_eff/d)I‖/‖W_eff‖", optimal_risk="$L^*_{\\rm RAG}$"),
                   rule=_training_rule(gap, L_star, "paired R(trained) − L*_RAG"), figure=figure,
                   details=[dict(gap=gap.mean, gap_se=gap.standard_error)])


@claim(
    "linear_attention_h3.rag_risk_floor",
    reference=f"{PAPER}: the RAG risk as n grows ({DOCS} §7.3; beyond the paper)",
    statement="The optimal RAG risk does not fall to σ² as n → ∞ but to the floor d + σ² − d²κ̄²/D₂ > σ²; at large n "
              "the Monte-Carlo risk of the optimal predictor matches the closed form, above the floor.",
    quick=dict(d=5, n=200, n_prompts=10_000),
    full=dict(d=20, n=2000, n_prompts=100_000),
)
def rag_risk_floor(seed, d, n, n_prompts):
    alpha, sigma2 = 0.5, 0.2
    problem = _correlated_problem("rag", d=d, n=n, alpha=alpha, sigma2=sigma2)
    floor = cf.rag_risk_floor(problem)
    L_star, c_star = cf.correlated_optimum(problem)
    mc = _mc(problem, lambda p: dyn.pgd_predict(p, c_star * np.eye(d)), n_prompts, seed)
    far = cf.isotropic_correlated_optimum("rag", d, 10**7, alpha, sigma2)[0]
    z = mc.z_score(L_star)
    floor_basis = "closed forms of the RAG risk (deterministic)"
    rule = all_of(rules.z_test(z, what=f"Monte-Carlo optimal risk at n = {n} − L*"),
                  rules.at_least(floor, sigma2 + 0.1, strict=True, what="floor (bound: σ² + 0.1)", basis=floor_basis),
                  rules.condition(0 <= far - floor < 1e-4, "L*(10⁷) within 1e-4 above the floor", basis=floor_basis),
                  rules.at_least(L_star, floor, strict=True, what=f"L* at n = {n} (above the floor)", basis=floor_basis))

    def figure():
        fig, ax = plots.figure()
        grid = np.unique(np.geomspace(1, 1e5, 60).astype(int))
        curve = [cf.isotropic_correlated_optimum("rag", d, int(k), alpha, sigma2)[0] for k in grid]
        iid = [cf.isotropic_correlated_optimum("rag", d, int(k), 0.0, sigma2)[0] for k in grid]  # α = 0 is IID
        plots.theory_line(ax, grid, curve, label="$L^*_{\\rm RAG}(n)$")
        plots.theory_line(ax, grid, iid, label="$L^*_{\\rm IID}(n)$", color="gray", linestyle=":")
        ax.axhline(floor, color="C3", linestyle="-.", label="RAG floor")
        ax.axhline(sigma2, color="C2", linestyle=(0, (1, 3)), label="$\\sigma^2$")
        plots.simulation_points(ax, [n], [mc.mean], [mc.standard_error], k=Z_TOLERANCE,
                                label=f"Monte Carlo (±{Z_TOLERANCE:g} SE, the tolerance)")
        plots.finish(ax, f"RAG risk floor ($d = {d}$, $\\alpha = {alpha}$)", "context length $n$", "risk",
                     logx=True, logy=True)
        plots.show_all_log_ticks(ax)
        return fig

    return Outcome(measured=dict(z_risk=z, risk_at_n=mc.mean, risk_at_1e7=far),
                   predicted=dict(z_risk=0.0, risk_at_n=L_star, floor=floor, noise=sigma2),
                   labels=dict(z_risk=f"z of the optimal risk at n = {n}", risk_at_n=f"MC risk at n = {n}",
                               risk_at_1e7="closed-form $L^*$ at n = 10⁷", floor="floor $\\mathcal{L}_\\infty$",
                               noise="σ²"),
                   rule=rule, figure=figure)


# ==================================================================================================================
# §5: low rank and LoRA
# ==================================================================================================================


def _factored_minimum(problem, W0, r, starts, rng):
    """min over U, V (d×r) of R(W0 + UVᵀ) by BFGS with the exact gradient (∇_U = GV, ∇_V = GᵀU, G = ∇_W R)."""
    d = problem.d

    def objective(x):
        U, V = x[:d * r].reshape(d, r), x[d * r:].reshape(d, r)
        W = W0 + U @ V.T
        G = cf.pgd_risk_gradient(problem, W)
        return float(cf.pgd_risk(problem, W)), np.concatenate([(G @ V).ravel(), (G.T @ U).ravel()])

    best = np.inf
    for _ in range(starts):
        result = minimize(objective, 0.3 * rng.standard_normal(2 * d * r), jac=True, method="BFGS",
                          options=dict(gtol=1e-12))
        best = min(best, result.fun)
    return best


@claim(
    "linear_attention_h3.low_rank_optimum",
    reference=f"{PAPER}: low-rank attention and the covariance spectrum ({DOCS} §5.1)",
    statement="The best preconditioner of rank r keeps the top r eigen-directions of Ψ̃: L*_r = L* + Σ_{i>r} "
              "nψᵢ²/((n+1)ψᵢ + s); BFGS over factorised W = UVᵀ finds the same minimum (setting D, r = 1, 2, 3).",
    quick=dict(starts=3),
    full=dict(starts=12),
)
def low_rank_optimum(seed, starts):
    problem = cf.golden_setting_d()
    rng = np.random.default_rng(seed)
    rows = []
    for r in (1, 2, 3):
        best = _factored_minimum(problem, np.zeros((problem.d, problem.d)), r, starts, rng)
        predicted = cf.low_rank_optimal_risk(problem, r)
        rows.append(dict(r=r, bfgs=best, closed_form=predicted,
                         at_formula_w=float(cf.pgd_risk(problem, cf.low_rank_preconditioner(problem, r)))))
    worst = max(max(abs(row["bfgs"] - row["closed_form"]), abs(row["at_formula_w"] - row["closed_form"]))
                for row in rows)

    def figure():
        fig, ax = plots.figure()
        ranks = np.arange(problem.d + 1)
        plots.theory_line(ax, ranks, [cf.low_rank_optimal_risk(problem, int(r)) for r in ranks],
                          label="$L^*_r$ (spectral formula)", marker="_")
        plots.simulation_points(ax, [row["r"] for row in rows], [row["bfgs"] for row in rows],
                                label="BFGS over $W = UV^\\top$")
        ax.set_xticks(ranks)  # ranks are integers
        plots.finish(ax, "Low-rank optimum, setting D", "rank $r$", "risk")
        return fig

    return Outcome(measured={f"bfgs_r{row['r']}": row["bfgs"] for row in rows},
                   predicted={f"closed_form_r{row['r']}": row["closed_form"] for row in rows},
                   labels={**{f"bfgs_r{row['r']}": f"BFGS minimum, r = {row['r']}" for row in rows},
                           **{f"closed_form_r{row['r']}": f"$L^*_{row['r']}$" for row in rows}},
                   rule=rules.at_most(worst, OPTIMISER, strict=True, what="max |BFGS − L*_r| and |R(W*_r) − L*_r|",
                                      basis=BFGS_BASIS + " from several random starts"),
                   details=rows, figure=figure)


@claim(
    "linear_attention_h3.trained_low_rank_attention",
    reference=f"{PAPER}: low-rank attention ({DOCS} §3.2, §5.1, §8)",
    statement="Linear attention with key/query width d_k = r, trained with Adam, reaches L*_r (setting D, r = 1, 2).",
    # 800 steps left 16 of 200 calibration seeds short of L*_r; from those seeds 2000 steps all reach it.
    quick=dict(steps=2000, batch_size=256, n_prompts=50_000),
    full=dict(steps=4000, batch_size=512, n_prompts=1_000_000),
)
def trained_low_rank_attention(seed, steps, batch_size, n_prompts):
    problem = cf.golden_setting_d()
    runs, rows, parts = {}, [], []
    for r in (1, 2):
        run = dyn.train(problem, "attention", seed=seeding.named(seed, f"r{r}"), steps=steps, batch_size=batch_size,
                        rank=r, final_fraction=DECAY)
        runs[f"$d_k = {r}$"] = run
        W_r = cf.low_rank_preconditioner(problem, r)
        L_r = cf.low_rank_optimal_risk(problem, r)
        gap = _paired_gap(problem, run, lambda p, W=W_r: dyn.pgd_predict(p, W), n_prompts,
                          seeding.named(seed, f"mc{r}"))
        rows.append(dict(r=r, gap=gap.mean, gap_se=gap.standard_error, L_r=L_r, odd_risk=run.last("risk")))
        parts.append(_training_rule(gap, L_r, f"paired R(trained, d_k = {r}) − L*_{r}"))
    return Outcome(measured={f"gap_r{row['r']}": row["gap"] for row in rows},
                   predicted={**{f"gap_r{row['r']}": 0.0 for row in rows},
                              **{f"optimum_r{row['r']}": row["L_r"] for row in rows}},
                   labels={**{f"gap_r{row['r']}": f"paired R(trained) − $L^*_{row['r']}$" for row in rows},
                           **{f"optimum_r{row['r']}": f"$L^*_{row['r']}$" for row in rows}},
                   rule=all_of(*parts), details=rows,
                   figure=_training_figure(runs, {f"$L^*_{row['r']}$": row["L_r"] for row in rows},
                                           "Low-rank attention, setting D"))


def _lora_problems():
    """§5.3: H = I, n = 10, σ² = 0.1, Ψ_old = diag(1, 1, .5, .5); (i) a trace-preserving rank-2 shift, (ii) a
    trace-changing rank-1 shift."""
    old = H3Problem(H=np.eye(4), Psi=np.diag([1.0, 1.0, 0.5, 0.5]), sigma2=0.1, n=10)
    return old, {"trace-preserving": old.replace(Psi=np.diag([0.5, 1.0, 0.5, 1.0])),
                 "trace-changing": old.replace(Psi=np.diag([1.0, 1.0, 0.5, 1.5]))}


@claim(
    "linear_attention_h3.lora_formula",
    reference=f"{PAPER}: LoRA adaptation to a new task covariance ({DOCS} §5.2)",
    statement="min_{rank Δ ≤ r} R_new(W₀ + Δ) = L*_new + Σ_{i>r} σᵢ²(H^{1/2}(W*_new − W₀)M^{1/2}); BFGS over Δ = UVᵀ "
              "finds the same minimum (a trace-preserving and a trace-changing shift, r = 1..3).",
    quick=dict(starts=3),
    full=dict(starts=12),
)
def lora_formula(seed, starts):
    old, problems = _lora_problems()
    W0 = cf.optimal_preconditioner(old)
    rng = np.random.default_rng(seed)
    rows = []
    for label, problem in problems.items():
        for r in (1, 2, 3):
            best = _factored_minimum(problem, W0, r, starts, rng)
            rows.append(dict(shift=label, r=r, bfgs=best, closed_form=cf.lora_optimal_risk(problem, W0, r)))
    worst = max(abs(row["bfgs"] - row["closed_form"]) for row in rows)

    def figure():
        fig, ax = plots.figure()
        for (label, problem), color in zip(problems.items(), ("C0", "C1")):
            ranks = np.arange(problem.d + 1)
            plots.theory_line(ax, ranks, [cf.lora_optimal_risk(problem, W0, int(r)) for r in ranks], color=color,
                              label=f"{label}: formula")
            picked = [row for row in rows if row["shift"] == label]
            plots.simulation_points(ax, [row["r"] for row in picked], [row["bfgs"] for row in picked], color=color,
                                    label=f"{label}: BFGS")
        ax.set_xticks(ranks)  # ranks are integers
        plots.finish(ax, "LoRA from $W^*_{\\rm old}$", "adapter rank $r$", "risk on the new task")
        return fig

    return Outcome(measured=dict(max_abs_difference=worst), predicted=dict(max_abs_difference=0.0),
                   labels=dict(max_abs_difference="max |BFGS − formula|"),
                   rule=rules.at_most(worst, OPTIMISER, strict=True, what="max |BFGS − formula|",
                                      basis=BFGS_BASIS + " from several random starts"),
                   details=rows, figure=figure)


@claim(
    "linear_attention_h3.lora_trace_free_exact",
    reference=f"{PAPER}: when LoRA is exact ({DOCS} §5.2; beyond the paper)",
    statement="If Ψ_new = Ψ_old + Δ with rank Δ = 2 and tr(HΔ) = 0, then rank(W*_new − W*_old) ≤ 2 and rank-2 LoRA "
              "from W*_old attains L*_new exactly, even for Δ that commutes with neither H nor Ψ (setting D).",
    quick=dict(trials=3),
    full=dict(trials=30),
)
def lora_trace_free_exact(seed, trials):
    problem = cf.golden_setting_d()
    rng = np.random.default_rng(seed)
    W_old = cf.optimal_preconditioner(problem)
    worst_rank, worst_residual, changing = 0.0, 0.0, np.inf
    for _ in range(trials):
        u, w = rng.standard_normal((2, problem.d))
        u, w = u / np.linalg.norm(u), w / np.linalg.norm(w)
        # A rank-2 shift uuᵀ − b·wwᵀ with tr(HΔ) = 0 (b = uᵀHu/wᵀHw), small enough to keep Ψ_new PSD.
        shift = 0.05 * (np.outer(u, u) - (u @ problem.H @ u) / (w @ problem.H @ w) * np.outer(w, w))
        new = problem.replace(Psi=problem.Psi + shift)
        singular = np.linalg.svd(cf.optimal_preconditioner(new) - W_old, compute_uv=False)
        worst_rank = max(worst_rank, float(singular[2] / singular[0]))
        worst_residual = max(worst_residual, cf.lora_optimal_risk(new, W_old, 2) - cf.optimal_risk(new))
        moved = problem.replace(Psi=problem.Psi + 0.1 * np.outer(u, u))   # a trace-changing rank-1 control
        changing = min(changing, cf.lora_optimal_risk(moved, W_old, 1) - cf.optimal_risk(moved))
    return Outcome(measured=dict(sigma3_over_sigma1=worst_rank, lora_residual=worst_residual,
                                 trace_changing_residual=changing),
                   predicted=dict(sigma3_over_sigma1=0.0, lora_residual=0.0),
                   labels=dict(sigma3_over_sigma1="σ₃/σ₁ of W*_new − W*_old",
                               lora_residual="rank-2 LoRA risk − L*_new",
                               trace_changing_residual="rank-1 LoRA residual, trace-changing control (> 0)"),
                   rule=all_of(rules.at_most(worst_rank, 1e-10, strict=True, what="σ₃/σ₁ of W*_new − W*_old",
                                             basis=WOODBURY_BASIS),
                               rules.round_off(worst_residual, ROUND_OFF, what="rank-2 LoRA risk − L*_new",
                                               basis=WOODBURY_BASIS),
                               rules.at_least(changing, 1e-6, strict=True,
                                              what="rank-1 residual of the trace-changing control", basis=WOODBURY_BASIS)),
                   notes="An exact rank identity: no figure.")


@claim(
    "linear_attention_h3.trained_lora",
    reference=f"{PAPER}: LoRA ({DOCS} §5.2, §8)",
    statement="A rank-1 LoRA adapter W₀ + UVᵀ trained with Adam from W₀ = W*_old reaches the LoRA optimum L*_LoRA(1) "
              "on the trace-changing shift (within 0.5%).",
    quick=dict(steps=800, batch_size=256),
    full=dict(steps=4000, batch_size=512),
)
def trained_lora(seed, steps, batch_size):
    old, problems = _lora_problems()
    problem = problems["trace-changing"]
    W0 = cf.optimal_preconditioner(old)
    target = cf.lora_optimal_risk(problem, W0, 1)
    run = dyn.train(problem, "lora", seed=seed, steps=steps, batch_size=batch_size, rank=1, W0=W0, lr=0.01,
                    final_fraction=DECAY)
    final = run.last("risk")
    relative = (final - target) / target
    return Outcome(measured=dict(final_risk=final, relative_excess=relative),
                   predicted=dict(lora_optimum=target, start_risk=float(cf.pgd_risk(problem, W0)),
                                  new_optimum=cf.optimal_risk(problem)),
                   labels=dict(final_risk="exact risk after training", relative_excess="(R − L*_LoRA)/L*_LoRA",
                               lora_optimum="$L^*_{\\rm LoRA}(1)$", start_risk="$R_{\\rm new}(W_0)$",
                               new_optimum="$L^*_{\\rm new}$"),
                   rule=rules.condition(-1e-9 < relative < 0.005, "−1e-9 < (R − L*_LoRA)/L*_LoRA < 0.5%",
                                        basis="the recorded risk is the exact closed form of the trained W₀ + UVᵀ, so "
                                              "only the optimisation error is tested (no sampling error); it cannot "
                                              "fall below the optimum"),
                   figure=_training_figure({"LoRA, r = 1": run}, {"$L^*_{\\rm LoRA}(1)$": target,
                                                                 "$L^*_{\\rm new}$": cf.optimal_risk(problem)},
                                           "Rank-1 LoRA, trace-changing shift"))


# ==================================================================================================================
# §4.4: the gradient flow of the risk in the preconditioner
# ==================================================================================================================


@claim(
    "linear_attention_h3.gradient_flow_converges",
    reference=f"{PAPER}: the landscape in the preconditioner ({DOCS} §4.4)",
    statement="The gradient flow Ẇ = −∇R(W) from W = 0 decreases the risk monotonically to L* and converges to W* at "
              "the exponential rate 2λ_min(H)λ_min(M) (setting A; the heteroscedastic WPGD flow at fixed ω as well).",
    quick=dict(n_points=200),
    full=dict(n_points=2000),
)
def gradient_flow_converges(seed, n_points):
    rows, trajectories = [], {}
    het = _heteroscedastic_problem()
    for label, problem, omega in (("setting A", cf.golden_setting_a(), None),
                                  ("heteroscedastic, ω = v*", het, cf.h3_optimum(het)[1])):
        run = dyn.population_trajectory(problem, omega=omega, n_points=n_points)
        fit = fit_exponential_rate(run.times, run.metrics["distance"], window=(1e-9, 1e-3))
        monotone = bool(np.all(np.diff(run.metrics["risk"]) <= 1e-12))
        rows.append(dict(setting=label, rate=-fit.slope, predicted=run.info["rate"],
                         final_excess=run.last("excess_risk"), final_distance=run.last("distance"), monotone=monotone))
        trajectories[label] = run
    worst_rate = max(abs(r["rate"] / r["predicted"] - 1) for r in rows)

    def figure():
        fig, ax = plots.figure()
        for (label, run), row, color in zip(trajectories.items(), rows, ("C0", "C1")):
            keep = run.times > 0
            ax.plot(run.times[keep], run.metrics["distance"][keep], marker="o", markersize=2, linestyle="none",
                    color=color, label=f"{label}: flow")
            t = run.times[keep]
            anchor = run.metrics["distance"][keep][len(t) // 2] * np.exp(row["predicted"] * t[len(t) // 2])
            plots.theory_line(ax, t, anchor * np.exp(-row["predicted"] * t), color=color,
                              label=f"rate $2\\lambda_{{\\min}}(H)\\lambda_{{\\min}}(M)$ = {row['predicted']:.3g}")
        ax.set_ylim(1e-12, 10)
        plots.finish(ax, "Gradient flow in the preconditioner", "flow time $t$", "$\\|W - W^*\\|_F$", logy=True)
        return fig

    return Outcome(measured={f"rate_{i + 1}": r["rate"] for i, r in enumerate(rows)},
                   predicted={f"predicted_rate_{i + 1}": r["predicted"] for i, r in enumerate(rows)},
                   labels={**{f"rate_{i + 1}": f"fitted rate, {r['setting']}" for i, r in enumerate(rows)},
                           **{f"predicted_rate_{i + 1}": f"2λ_min(H)λ_min(M), {r['setting']}" for i, r in
                              enumerate(rows)}},
                   rule=all_of(rules.at_most(worst_rate, 0.01, strict=True, what="max |fitted rate / predicted − 1|",
                                             basis=FLOW_BASIS),
                               rules.condition(all(r["monotone"] for r in rows), "risk non-increasing", basis=FLOW_BASIS),
                               rules.at_most([r["final_distance"] for r in rows], 1e-8, strict=True,
                                             what="‖W − W*‖ at the end", basis=FLOW_BASIS)),
                   details=rows,
                   figure=figure)


# ==================================================================================================================
# The System record
# ==================================================================================================================


# ==================================================================================================
# `attnflow solve/simulate linear-attention-h3`: labels and the prediction of a minibatch run
# ==================================================================================================

LABELS = {
    "risk": "risk of the model's (W)PGD predictor",
    "excess_risk": "excess risk R − L*",
    "distance": "distance to the optimum W*",
    "batch_loss": "minibatch loss",
}


def population_figure(trajectory, title: str, time_label: str, labels=None):
    """The gradient flow's metrics (``attnflow solve linear-attention-h3 --plot``) with the rate of §4.4 drawn
    beside them: the flow is linear, so ‖W − W*‖_F decays at its slowest rate 2λ_min(H)λ_min(M) (2B in the rag and
    tfa designs, §7.1) and the excess risk, quadratic in W − W*, at twice that."""
    rate = trajectory.info["rate"]
    return plots.trajectory_figure_with_rates(trajectory, title, time_label, {
        "distance": (rate, rf"predicted $e^{{-{rate:.3g}\,t}}$"),
        "excess_risk": (2 * rate, rf"predicted $e^{{-{2 * rate:.3g}\,t}}$"),
    }, labels=labels)


def compare(problem: H3Problem, run, *, seed, model: str = "attention", steps: int = 2000, batch_size: int = 256,
            lr: float = 0.01, optimizer: str = "adam", rank: int | None = None):
    """The prediction of training on fresh prompts (``attnflow simulate linear-attention-h3 --compare``). PGD: the
    same optimiser, schedule and start W = 0 on the exact risk gradient (§4.4), recorded at the run's steps, and
    the optimum L* (§4.2). Attention and H3 have no closed-form path in their own weights: their optimal risk is
    drawn, L* (or L*_r below full rank, §5.1) and L*_H3 (§6.2). The rag and tfa designs record the batch loss
    only: the optimum of §7.1 is drawn beside it. ``seed`` is unused."""
    from attnflow.dynamics.montecarlo import Trajectory
    from attnflow.dynamics.optimizers import exact_gradient_path

    from .compare import Comparison, NoPrediction

    if problem.design != "iid":
        L_star, _ = cf.correlated_optimum(problem)
        return Comparison(run, ("batch_loss",), levels={"batch_loss": (L_star, "optimal risk L* (§7.1)")},
                          note=f"The {problem.design} design has no closed-form risk along training: the minibatch "
                               "loss scatters about the risk, which training brings down to the optimum L*.")
    L_star = cf.optimal_risk(problem)
    if model == "pgd":
        path = exact_gradient_path([np.zeros((problem.d, problem.d))],
                                   lambda params: [cf.pgd_risk_gradient(problem, params[0])], optimizer, lr, steps,
                                   run.times.astype(int), final_fraction=0.02)
        risk = cf.pgd_risk(problem, np.array([W for W, in path]))
        prediction = Trajectory(times=run.times, metrics=dict(risk=risk, excess_risk=risk - L_star))
        simulation = Trajectory(times=run.times, states=run.states, info=run.info, final=run.final,
                                metrics={**run.metrics, "excess_risk": run.metrics["risk"] - L_star})
        return Comparison(simulation, ("risk", "excess_risk"), prediction, f"{optimizer} on the exact risk gradient (same schedule)",
                          levels={"risk": (L_star, "L* (§4.2)")},
                          note="This system has no diffusion band: the run scatters about the exact-gradient path by "
                               "its minibatch noise.")
    if model == "attention":
        width = problem.d + 1 if rank is None else rank
        if width >= problem.d:
            optimum, name = L_star, "L* (§4.2, d_k ≥ d)"
        elif problem.homogeneous:
            optimum, name = cf.low_rank_optimal_risk(problem, width), f"L*_r at rank r = {width} (§5.1)"
        else:
            raise NoPrediction(f"the rank-{width} optimum is in closed form only for homogeneous covariances (§5.1)")
    else:
        if not all(np.allclose(m, np.eye(problem.d)) for m in (problem.H, problem.Psi, problem.Delta)):
            raise NoPrediction("the H3 optimum is in closed form only for H = Ψ = Δ = I (§6.2)")
        optimum, name = cf.h3_optimum(problem)[0], "L*_H3 (§6.2)"
    return Comparison(run, ("risk",), levels={"risk": (optimum, name)},
                      note=f"The {model} model has no closed-form training path in its own weights: the dotted line "
                           f"is its optimal risk, which training should approach.")


def summary(problem: H3Problem, *, seed) -> dict:
    """The system's closed forms at one problem (``attnflow solve linear_attention_h3``)."""
    out = {"d": problem.d, "n": problem.n, "sigma2": problem.sigma2, "design": problem.design}
    if problem.design != "iid":
        L_star, c_star = cf.correlated_optimum(problem)
        out.update({"alpha": problem.alpha, "optimal risk L* (§7.1)": L_star, "optimal step c* (W = c*·I)": c_star,
                    "κ = α²d + 1 (§7.2)": cf.alignment_multiplier(problem.d, problem.alpha),
                    "effective sample size n_eff / n": cf.effective_sample_size(problem, L_star) / problem.n})
        if problem.design == "rag":
            out["RAG risk floor as n → ∞ (§7.3)"] = cf.rag_risk_floor(problem)
        return out
    out["optimal PGD / attention risk L* (§4.2)"] = cf.optimal_risk(problem)
    out["W* (§4.2)"] = cf.optimal_preconditioner(problem)
    if problem.homogeneous:
        out["ψ, eigenvalues of H^½ΨH^½"] = problem.psi
        out["rank-r optima L*_r, r = 0..d (§5.1)"] = np.array([cf.low_rank_optimal_risk(problem, r)
                                                              for r in range(problem.d + 1)])
    identity = np.eye(problem.d)
    if all(np.allclose(m, identity) for m in (problem.H, problem.Psi, problem.Delta)):
        L_h3, v = cf.h3_optimum(problem)
        out["optimal H3 / WPGD risk L*_H3 (§6.2)"] = L_h3
        out["optimal weights v* (normalised)"] = v / v.sum()
    out["gradient-flow rate 2λ_min(H)λ_min(M) (§4.4)"] = dyn.flow_rate(problem)
    return out


SYSTEM = System(
    key="linear_attention_h3",
    title="Linear attention and H3 as one-step (weighted) preconditioned GD: RAG, alignment, low rank, LoRA",
    reference=PAPER,
    problem=H3Problem,
    population=dyn.population,
    minibatch=dyn.minibatch,
    summary=summary,
    docs=DOCS,
    population_time="flow time t",
    minibatch_time="training step",
    population_figure=population_figure,
    labels=LABELS,
    compare=compare,
)
