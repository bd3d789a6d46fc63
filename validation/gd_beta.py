"""Claims of Zhang, Wu & Bartlett (NeurIPS 2024) on GD-β, the LTB and LSA (derivations: docs/gd_beta.md)."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.ticker import NullFormatter
from scipy import stats as scipy_stats
from scipy.optimize import minimize

from attnflow import seeding
from attnflow.closed_forms.certificates import ROUND_OFF
from attnflow.closed_forms import checks as check
from attnflow.closed_forms import gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem
from attnflow.dynamics import gd_beta as dyn
from attnflow.dynamics.montecarlo import Trajectory

from . import plots, rules, stats
from .claims import Outcome, ScalingLaw, claim, observable
from .rules import all_of
from .systems import Parameter, System
from .stats import Z_TOLERANCE, fit_exponential_rate, ratio_standard_error

PAPER = "Zhang, Wu & Bartlett, NeurIPS 2024 (arXiv:2402.14951)"

# The worked example of docs/gd_beta.md §6 (and §10): anisotropic H and Ψ, σ² = 0.25, N = 10.
EXAMPLE_H = np.array([[1.0, 0.3], [0.3, 0.6]])
EXAMPLE_PSI = np.array([[0.8, -0.2], [-0.2, 0.5]])
# Corollary 6.2 example (docs/gd_beta.md §8): SNR = tr(HΨ)/σ² = 0.6125.
COROLLARY_H = np.diag([1.0, 0.5, 0.25, 0.125])
COROLLARY_PSI = np.diag([0.4, 0.3, 0.2, 0.1])


def example_problem(beta_norm_H: float, N: int = 10, sigma2: float = 0.25) -> GDBetaProblem:
    """The docs/gd_beta.md §6 example with β* along e₁ scaled to ‖β*‖_H = ``beta_norm_H``.

    (The gap depends on the direction of β*, not only on ‖β*‖_H; the direction e₁ is a choice,
    docs/gd_beta.md §6.)
    """
    direction = np.array([1.0, 0.0]) / np.sqrt(EXAMPLE_H[0, 0])
    return GDBetaProblem(H=EXAMPLE_H, Psi=EXAMPLE_PSI, beta_star=beta_norm_H * direction, sigma2=sigma2, N=N)


def _gd_beta_predictor(beta0, Gamma):
    return lambda p: cf.gd_beta_predict(p.X, p.y, p.x_query, beta0, Gamma)


# ==================================================================================================
# §3: the closed-form risk
# ==================================================================================================


@claim(
    "gd_beta.risk_formula",
    reference=f"{PAPER}: ICL risk (3.5) of GD-β (5.1); closed form of docs/gd_beta.md §3",
    statement="The closed-form ICL risk R(β₀, Γ) equals the brute-force Monte-Carlo risk of GD-β at random "
              "(β₀, Γ), for full-rank and rank-deficient H and Ψ.",
    quick=dict(n_prompts=100_000, d=3, N=8),
    full=dict(n_prompts=2_000_000, d=5, N=12),
)
def risk_formula(seed, n_prompts, d, N):
    configs = [("full rank", {}), ("singular H", dict(rank_H=d - 1)), ("singular Psi", dict(rank_Psi=1))]
    rows = []
    for (label, ranks), child in zip(configs, seed.spawn(len(configs))):
        problem_seed, parameter_seed, mc_seed = child.spawn(3)
        problem = GDBetaProblem.random(d, N, seed=problem_seed, sigma2=0.5, beta_norm=1.0, **ranks)
        rng = np.random.default_rng(parameter_seed)
        beta0, Gamma = rng.normal(size=d), rng.normal(size=(d, d)) / d
        predicted = float(cf.icl_risk(problem, beta0, Gamma))
        mc = dyn.monte_carlo_risk(problem, _gd_beta_predictor(beta0, Gamma), n_prompts, seed=mc_seed)
        rows.append(dict(config=label, closed_form=predicted, monte_carlo=mc.mean,
                         standard_error=mc.standard_error, z=mc.z_score(predicted)))
    worst = max(rows, key=lambda r: abs(r["z"]))

    def figure():
        # the values, and beside them the test: each z against |z| < 4 (the SEs are invisible on the risk's scale)
        fig, (ax, ax_z) = plots.figure(ncols=2)
        x = np.arange(len(rows))
        ax.plot(x, [r["monte_carlo"] for r in rows], "o", color="tab:blue", label=f"Monte Carlo ({n_prompts:,} prompts)")
        ax.plot(x, [r["closed_form"] for r in rows], "k_", markersize=22, markeredgewidth=1.6,
                label="closed form (docs/gd_beta.md §3)")
        plots.residual_panel(ax_z, x, [r["z"] for r in rows], Z_TOLERANCE, "Monte Carlo against the closed form",
                             "configuration", label="Monte Carlo")
        for axis in (ax, ax_z):
            axis.set_xticks(x, [r["config"] for r in rows])
            axis.set_xlim(-0.5, len(rows) - 0.5)
        plots.finish(ax, r"GD-$\beta$ risk at random $(\beta_0, \Gamma)$", "configuration",
                     r"ICL risk $R(\beta_0, \Gamma)$")
        plots.legend_below(ax)
        plots.legend_below(ax_z, ncols=2)
        return fig

    return Outcome(
        measured={"risk_worst_config": worst["monte_carlo"], "max_abs_z": abs(worst["z"])},
        predicted={"risk_worst_config": worst["closed_form"]},
        labels={"risk_worst_config": "ICL risk (worst config): Monte Carlo / closed form", "max_abs_z": "max |z|"},
        rule=rules.z_test([r["z"] for r in rows], what="Monte Carlo − closed form, one per configuration"),
        details=rows, figure=figure)


# ==================================================================================================
# Theorem 5.2: the optimal GD-β
# ==================================================================================================


@claim(
    "gd_beta.optimal_parameters",
    reference=f"{PAPER}: Theorem 5.2, eqs. (5.2)-(5.3)",
    statement="(β₀, Γ) = (β*, Γ*) with Γ* = H^{+1/2}Ψ̃Ω⁻¹H^{+1/2} minimises the GD-β risk and attains "
              "R* = σ² + tr Ψ̃ − tr(Ψ̃Ω⁻¹Ψ̃); moving away from it raises the sampled risk by the closed-form amount.",
    quick=dict(d=3, N=10, n_starts=4, n_prompts=60_000),
    full=dict(d=6, N=20, n_starts=12, n_prompts=1_000_000),
)
def optimal_parameters(seed, d, N, n_starts, n_prompts):
    problem_seed, start_seed, direction_seed, mc_seed = seed.spawn(4)
    problem = GDBetaProblem.random(d, N, seed=problem_seed, sigma2=0.5, beta_norm=1.5)
    R_star, R_eigen = cf.optimal_risk(problem), cf.optimal_risk_eigen(problem)
    beta_star, Gamma_star = problem.beta_star, cf.optimal_gamma(problem)
    grad_beta, grad_Gamma = cf.risk_gradient(problem, beta_star, Gamma_star)
    grad_norm = float(np.sqrt(np.sum(grad_beta**2) + np.sum(grad_Gamma**2)))

    def objective(theta):
        beta0, Gamma = cf.unpack_flow_state(theta, d)
        gb, gG = cf.risk_gradient(problem, beta0, Gamma)
        return float(cf.icl_risk(problem, beta0, Gamma)), cf.flow_state(gb, gG)

    rng = np.random.default_rng(start_seed)
    best = None
    for _ in range(n_starts):
        start = rng.normal(size=d + d * d)
        result = minimize(objective, start, jac=True, method="L-BFGS-B",
                          options=dict(gtol=1e-13, ftol=1e-16, maxiter=20_000))
        if best is None or result.fun < best.fun:
            best = result
    found_beta, found_Gamma = cf.unpack_flow_state(best.x, d)
    argmin_error = float(np.linalg.norm(found_beta - beta_star) + np.linalg.norm(found_Gamma - Gamma_star))

    # Paired Monte Carlo (common prompts): R(optimum + s·Δ) − R(optimum) along a random direction Δ.
    drng = np.random.default_rng(direction_seed)
    d_beta, d_Gamma = drng.normal(size=d), drng.normal(size=(d, d))
    scale = 0.5 / np.sqrt(np.sum(d_beta**2) + np.sum(d_Gamma**2))
    d_beta, d_Gamma = scale * d_beta, scale * d_Gamma
    rows = []
    for s, child in zip((-1.0, -0.5, 0.5, 1.0), mc_seed.spawn(4)):
        moved = (beta_star + s * d_beta, Gamma_star + s * d_Gamma)

        def increase(rng, m, moved=moved):
            p = dyn.sample_prompts(problem, m, rng)
            base = cf.gd_beta_predict(p.X, p.y, p.x_query, beta_star, Gamma_star)
            other = cf.gd_beta_predict(p.X, p.y, p.x_query, *moved)
            return (other - p.y_query) ** 2 - (base - p.y_query) ** 2

        mc = dyn.monte_carlo_mean(increase, n_prompts, seed=child)
        exact = float(cf.icl_risk(problem, *moved) - R_star)
        rows.append(dict(step=s, closed_form_increase=exact, monte_carlo_increase=mc.mean,
                         standard_error=mc.standard_error, z=mc.z_score(exact)))

    risk_tol, grad_tol, argmin_tol = 1e-9, 1e-9, 1e-4
    optimisation = "L-BFGS-B at gtol 1e-13 (round-off level for a smooth quartic)"
    rule = all_of(
        rules.at_most(abs(R_eigen - R_star), 1e-12 * R_star, what="|R* (eigen form) − R*|",
                      basis="two closed forms of one number: float64 round-off"),
        rules.at_most(grad_norm, grad_tol * (1 + R_star), what=f"|∇R| at (β*, Γ*) ({grad_tol:g}·(1 + R*))",
                      basis=optimisation),
        rules.at_least(best.fun, R_star * (1 - 1e-12), what="L-BFGS minimum (never below R*)", basis=optimisation),
        rules.at_most(best.fun - R_star, risk_tol * R_star, what=f"L-BFGS minimum − R* ({risk_tol:g}·R*)",
                      basis=optimisation),
        rules.at_most(argmin_error, argmin_tol, what="argmin error", basis=optimisation),
        rules.at_least([r["closed_form_increase"] for r in rows], 0.0, strict=True,
                       what="closed-form increase along Δ", basis="R* is the strict minimum"),
        rules.z_test([r["z"] for r in rows], what="paired Monte Carlo − closed-form increase"))

    def figure():
        fig, ax = plots.figure()
        s_grid = np.linspace(-1.1, 1.1, 101)
        curve = [cf.icl_risk(problem, beta_star + s * d_beta, Gamma_star + s * d_Gamma) - R_star for s in s_grid]
        plots.theory_line(ax, s_grid, curve, label=r"closed form $R - R^*$")
        plots.simulation_points(ax, [r["step"] for r in rows], [r["monte_carlo_increase"] for r in rows],
                                [r["standard_error"] for r in rows], k=Z_TOLERANCE,
                                label=f"paired Monte Carlo (±{Z_TOLERANCE:g} SE: the tolerance)")
        plots.finish(ax, r"Risk along a line through $(\beta^*, \Gamma^*)$ (Thm 5.2)", r"step $s$ along $\Delta$",
                     r"$R - R^*$")
        return fig

    return Outcome(
        measured={"optimal_risk": float(best.fun), "gradient_norm_at_optimum": grad_norm,
                  "argmin_error": argmin_error, "max_abs_z_paired": max(abs(r["z"]) for r in rows)},
        predicted={"optimal_risk": R_star, "optimal_risk_eigen_form": R_eigen, "gradient_norm_at_optimum": 0.0},
        labels={"optimal_risk": "min over L-BFGS starts / R* (5.2)", "optimal_risk_eigen_form": "R* eigen form",
                "gradient_norm_at_optimum": "|grad R| at (β*, Γ*)", "argmin_error": "argmin error",
                "max_abs_z_paired": "max |z| paired MC"},
        rule=rule, details=rows, figure=figure)


# ==================================================================================================
# Theorem 5.3 and Lemma 5.1: LTB = GD-β at the optimum
# ==================================================================================================


@claim(
    "gd_beta.ltb_equals_gd_beta",
    reference=f"{PAPER}: Theorem 5.3 and Lemma 5.1",
    statement="The optimal LTB risk equals the optimal GD-β risk R* for every β*, and GD-β embeds in the LTB "
              "exactly (the full token-matrix forward pass reproduces GD-β's predictions).",
    quick=dict(d=2, N=10, beta_norms=(0.0, 1.0, 3.0), n_prompts=2_000),
    full=dict(d=3, N=20, beta_norms=(0.0, 0.5, 1.0, 2.0, 4.0, 8.0), n_prompts=20_000),
)
def ltb_equals_gd_beta(seed, d, N, beta_norms, n_prompts):
    problem_seed, prompt_seed = seed.spawn(2)
    base = GDBetaProblem.random(d, N, seed=problem_seed, sigma2=0.5, beta_norm=1.0)
    rows = []
    for norm in beta_norms:
        problem = base.replace(beta_star=base.beta_star * norm / base.beta_norm_H)
        R_star = cf.optimal_risk(problem)
        ltb = cf.optimal_attention_risk(problem, mlp=True)
        rows.append(dict(beta_norm_H=norm, R_star=R_star, inf_LTB=ltb.risk, relative_gap=(ltb.risk - R_star) / R_star))

    # Lemma 5.1 at (β₀, Γ) = (β*, Γ*).
    problem = base
    beta0, Gamma = problem.beta_star, cf.optimal_gamma(problem)
    U, V, K = cf.ltb_embedding(beta0, Gamma)
    prompts = dyn.sample_prompts(problem, n_prompts, np.random.default_rng(prompt_seed))
    ltb_out = cf.ltb_forward(dyn.token_matrices(prompts), U, V, K)
    gd_out = cf.gd_beta_predict(prompts.X, prompts.y, prompts.x_query, beta0, Gamma)
    embedding_error = float(np.max(np.abs(ltb_out - gd_out)) / np.max(np.abs(gd_out)))

    optimiser_tol, embedding_tol = 1e-7, 1e-12
    worst = max(abs(r["relative_gap"]) for r in rows)

    def figure():
        fig, ax = plots.figure(width=6.6)
        norms = np.array([r["beta_norm_H"] for r in rows])
        gaps = np.maximum(np.abs([r["relative_gap"] for r in rows]), 1e-17)  # an exact 0 sits at the float floor
        plots.simulation_points(ax, norms, gaps, label=r"$|\inf\,\mathrm{LTB} - R^*|\,/\,R^*$ (optimised LTB)")
        plots.theory_line(ax, norms, np.full(norms.size, optimiser_tol), color="tab:red", linestyle=":",
                          label=f"tolerance {optimiser_tol:g} (optimiser)")
        plots.finish(ax, r"Optimal LTB risk $= R^*$ for every $\beta^*$ (Thm 5.3)", r"$\|\beta^*\|_H$",
                     "relative gap (theory: 0)", logy=True)
        plots.legend_outside(ax)
        return fig

    return Outcome(
        measured={"max_relative_ltb_gap": worst, "embedding_relative_error": embedding_error},
        predicted={"max_relative_ltb_gap": 0.0, "embedding_relative_error": 0.0},
        labels={"max_relative_ltb_gap": "max |inf LTB − R*| / R*", "embedding_relative_error": "embedding relative error"},
        figure=figure,
        rule=all_of(
            rules.at_most(worst, optimiser_tol, what="max |inf LTB − R*|/R*",
                          basis="the read-out is solved exactly, the value direction by BFGS at gtol 1e-12 (risk "
                                "error ~ gtol²/curvature)"),
            rules.at_most(embedding_error, embedding_tol, what="embedding relative error",
                          basis="the embedding is exact up to float64 round-off")),
        details=rows)


# ==================================================================================================
# Theorem 4.1: the LSA approximation gap
# ==================================================================================================


def lsa_gap_figure(beta_norms, gaps, N: int):
    """The LSA gap inf LSA − R* at ``beta_norms`` (markers, the exact reduction) in the docs/gd_beta.md §6 example
    beside the GD-0 upper bound and its first-order form (d+1)‖β*‖²_H/N (lines)."""
    fig, ax = plots.figure(width=6.4)
    plots.simulation_points(ax, beta_norms, gaps, label=r"$\inf\,\mathrm{LSA} - R^*$ (exact reduction)")
    grid = np.linspace(0.0, max(beta_norms), 41)
    gd0 = [cf.gd0_optimal_risk(example_problem(g, N=N)) - cf.optimal_risk(example_problem(g, N=N)) for g in grid]
    plots.theory_line(ax, grid, gd0, label="GD-0 upper bound")
    plots.theory_line(ax, grid, (EXAMPLE_H.shape[0] + 1) * grid**2 / N,
                      label=r"$(d+1)\|\beta^*\|_H^2/N$ (first order)", linestyle=":", color="gray")
    plots.finish(ax, f"LSA approximation gap (Thm 4.1), $N = {N}$", r"$\|\beta^*\|_H$", "risk gap")
    plots.legend_outside(ax)
    return fig


@claim(
    "gd_beta.lsa_gap",
    reference=f"{PAPER}: Theorem 4.1; exact LSA reduction and GD-0 sandwich of docs/gd_beta.md §6",
    statement="inf LSA − inf LTB is zero at β* = 0 and positive, growing with ‖β*‖_H, between 0 and the GD-0 "
              "bound; R* does not depend on β*; the exact LSA optimum matches its sampled risk.",
    quick=dict(beta_norms=(0.0, 0.5, 1.0, 2.0, 4.0), N=10, n_prompts=100_000),
    full=dict(beta_norms=(0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0), N=10, n_prompts=1_000_000),
)
def lsa_gap(seed, beta_norms, N, n_prompts):
    rows = []
    for norm in beta_norms:
        problem = example_problem(norm, N=N)
        R_star = cf.optimal_risk(problem)
        lsa = cf.optimal_attention_risk(problem, mlp=False)
        rows.append(dict(beta_norm_H=norm, R_star=R_star, inf_LSA=lsa.risk, gap=lsa.risk - R_star,
                         gd0_gap=cf.gd0_optimal_risk(problem) - R_star,
                         first_order_gd0=(problem.d + 1) * norm**2 / N))
    # Sample the optimal LSA at the largest ‖β*‖ (the loop's last problem and optimum): closed-form reduction vs
    # brute force.
    d = problem.d
    Q, q = lsa.W[:, :d].T, lsa.W[:, d]
    mc = dyn.monte_carlo_risk(
        problem, lambda p: cf.ltb_reduced_predict(p.X, p.y, p.x_query, np.zeros(d), lsa.a, lsa.b, Q, q), n_prompts, seed=seed)
    z = mc.z_score(lsa.risk)

    gaps = np.array([r["gap"] for r in rows])
    R_stars = np.array([r["R_star"] for r in rows])
    zero_tol = 1e-8
    at_zero = [r["gap"] for r in rows if r["beta_norm_H"] == 0.0]
    reduction = "exact reduction (BFGS on the value direction, gtol 1e-12)"
    rule = all_of(
        rules.at_most(np.abs(at_zero), zero_tol, what="|gap| at β* = 0", basis=reduction),
        rules.at_least(np.diff(gaps), 0.0, strict=True, what="increase of the gap between successive ‖β*‖",
                       basis=reduction),
        rules.within(gaps, -zero_tol, [r["gd0_gap"] + zero_tol for r in rows],
                     what=f"gap (interval [−{zero_tol:g}, GD-0 gap + {zero_tol:g}])", basis=reduction),
        rules.at_most(np.ptp(R_stars), 1e-12 * R_stars.max(), what="spread of R* over ‖β*‖ (1e-12 relative)",
                      basis="R* does not depend on β*: float64 round-off"),
        rules.z_test(z, what="sampled − exact optimal-LSA risk"))

    def figure():
        return lsa_gap_figure([r["beta_norm_H"] for r in rows], gaps, N)

    return Outcome(
        measured={"gap_at_largest_beta_norm": float(gaps[-1]),
                  "gap_at_zero_beta": float(at_zero[0]) if at_zero else 0.0,
                  "optimal_lsa_risk": mc.mean, "z_sampled_vs_exact": z},
        predicted={"gap_at_zero_beta": 0.0, "gd0_bound_at_largest_beta_norm": rows[-1]["gd0_gap"],
                   "optimal_lsa_risk": lsa.risk},
        labels={"gap_at_largest_beta_norm": "gap at largest ‖β*‖", "gap_at_zero_beta": "gap at β* = 0",
                "optimal_lsa_risk": "optimal-LSA risk: sampled / exact", "z_sampled_vs_exact": "z (sampled vs exact)",
                "gd0_bound_at_largest_beta_norm": "GD-0 bound at largest ‖β*‖"},
        rule=rule, details=rows, figure=figure)


# ==================================================================================================
# Lemma 6.1 / Corollary 6.2: GD-β vs Bayes
# ==================================================================================================


def _bayes_ratios(problem_at, N_values, n_contexts, seed):
    rows = []
    for N, child in zip(N_values, seed.spawn(len(N_values))):
        problem = problem_at(N)
        R_star = cf.optimal_risk(problem)
        bayes = dyn.bayes_risk(problem, n_contexts, seed=child)
        excess_gd, excess_bayes = R_star - problem.sigma2, bayes.mean - problem.sigma2
        lower, upper = cf.excess_risk_sandwich(problem)
        rows.append(dict(N=N, sigma2=problem.sigma2, snr=cf.snr(problem), R_star=R_star, bayes=bayes.mean,
                         bayes_se=bayes.standard_error, ratio=excess_gd / excess_bayes,
                         ratio_se=ratio_standard_error(excess_gd, excess_bayes, bayes.standard_error),
                         sandwich_lower=lower, sandwich_upper=upper, excess_gd=excess_gd))
    return rows


@claim(
    "gd_beta.bayes_constant_factor",
    reference=f"{PAPER}: Lemma 6.1 and Corollary 6.2 (explicit constants of docs/gd_beta.md §8)",
    statement="At bounded SNR the optimal GD-β excess risk is within a constant factor of the Bayes excess risk: "
              "1 <= (R* − σ²)/(R_Bayes − σ²) <= 1 + 2·SNR for every N, and "
              "½Σmin(ψᵢ, σ²/(N+1)) <= R* − σ² <= 2(1+SNR)Σmin(ψᵢ, σ²/N).",
    quick=dict(N_values=(2, 5, 10, 20, 50, 100, 200), n_contexts=20_000),
    full=dict(N_values=(2, 5, 10, 20, 50, 100, 200, 500, 1000), n_contexts=200_000),
)
def bayes_constant_factor(seed, N_values, n_contexts):
    def problem_at(N):
        return GDBetaProblem(H=COROLLARY_H, Psi=COROLLARY_PSI, beta_star=np.ones(4), sigma2=1.0, N=N)

    rows = _bayes_ratios(problem_at, N_values, n_contexts, seed)
    reference = problem_at(N_values[0])
    bound = 1 + 2 * cf.snr(reference)
    limit = cf.large_context_ratio_limit(reference)
    ratios, ratio_ses = np.array([r["ratio"] for r in rows]), np.array([r["ratio_se"] for r in rows])
    # one one-sided 4-SE bound per N can be near its limit (the two bounds are far apart): one comparison per N
    per_N = float(scipy_stats.norm.sf(Z_TOLERANCE))
    rule = all_of(
        rules.within(ratios, 1 - Z_TOLERANCE * ratio_ses, bound + Z_TOLERANCE * ratio_ses,
                     what=f"ratio (interval [1 − {Z_TOLERANCE:g} SE, 1 + 2·SNR + {Z_TOLERANCE:g} SE])",
                     false_fail_rate=len(rows) * per_N,
                     basis=f"{Z_TOLERANCE:g} standard errors of the Bayes-risk Monte Carlo (delta method for the "
                           f"ratio), one-sided at the nearer bound (false-alarm probability {per_N:.1g} per N)"),
        rules.within([r["excess_gd"] for r in rows], [r["sandwich_lower"] for r in rows],
                     [r["sandwich_upper"] for r in rows],
                     what="R* − σ² (interval: the sandwich ½Σmin(ψᵢ, σ²/(N+1)) to 2(1+SNR)Σmin(ψᵢ, σ²/N))",
                     basis="exact: closed forms on both sides"))

    def figure():
        fig, ax = plots.figure(width=6.6)
        Ns = [r["N"] for r in rows]
        plots.simulation_points(ax, Ns, [r["ratio"] for r in rows], [r["ratio_se"] for r in rows], k=Z_TOLERANCE,
                                label=f"Bayes risk by Monte Carlo (±{Z_TOLERANCE:g} SE: the tolerance)")
        plots.theory_line(ax, Ns, [limit] * len(Ns), label=rf"$N \to \infty$ limit {limit:.3f}")
        plots.theory_line(ax, Ns, [bound] * len(Ns), label=rf"upper bound $1 + 2\,\mathrm{{SNR}}$ = {bound:.3f}",
                          color="tab:red", linestyle=":")
        plots.theory_line(ax, Ns, [1.0] * len(Ns), label="lower bound 1", color="gray", linestyle=":")
        plots.finish(ax, f"GD-$\\beta$ vs Bayes at SNR = {cf.snr(reference):.4g} (Cor 6.2)", "$N$",
                     r"$(R^* - \sigma^2)\,/\,(R_{\mathrm{Bayes}} - \sigma^2)$", logx=True)
        plots.legend_outside(ax)
        return fig

    largest = max(rows, key=lambda r: r["ratio"])
    return Outcome(
        measured={"largest_ratio": largest["ratio"], "context_length_of_largest_ratio": largest["N"],
                  "smallest_ratio": min(r["ratio"] for r in rows)},
        predicted={"upper_bound": bound, "lower_bound": 1.0, "large_context_limit": limit},
        labels={"largest_ratio": "largest ratio", "context_length_of_largest_ratio": "at N", "smallest_ratio": "smallest ratio",
                "upper_bound": "upper bound 1 + 2·SNR", "lower_bound": "lower bound", "large_context_limit": "N → ∞ limit"},
        rule=rule, details=rows, figure=figure,
        notes="docs/gd_beta.md §8 reports ratios 1.047, 1.130, 1.241, 1.367, 1.507, 1.589, 1.654 at N = 2…200.")


@claim(
    "gd_beta.bayes_factor_needs_bounded_snr",
    reference=f"{PAPER}: Corollary 6.2's SNR condition (negative control, docs/gd_beta.md §8)",
    statement="Negative control: without bounded SNR the GD-β/Bayes factor is not uniform: as σ² → 0 at fixed N "
              "the ratio grows without bound, exceeding the bounded-SNR constant 1 + 2·SNR(σ² = 1).",
    quick=dict(sigma2_values=(1.0, 0.1, 0.01, 0.001), N=50, n_contexts=10_000),
    full=dict(sigma2_values=(1.0, 0.1, 0.01, 0.001, 0.0001), N=50, n_contexts=100_000),
)
def bayes_factor_needs_bounded_snr(seed, sigma2_values, N, n_contexts):
    rows = []
    for sigma2, child in zip(sigma2_values, seed.spawn(len(sigma2_values))):
        rows.extend(_bayes_ratios(
            lambda n, s=sigma2: GDBetaProblem(H=COROLLARY_H, Psi=COROLLARY_PSI, beta_star=np.ones(4), sigma2=s, N=n),
            (N,), n_contexts, child))
    bounded_constant = 1 + 2 * rows[0]["snr"]
    ratios = np.array([r["ratio"] for r in rows])
    ses = np.array([r["ratio_se"] for r in rows])
    effect = (f"an effect the negative control predicts, resolved at {Z_TOLERANCE:g} standard errors of the "
              "Bayes-risk Monte Carlo: a requirement on power, not a chance alarm at a stated rate")
    rule = all_of(
        rules.at_least(np.diff(ratios) / np.hypot(ses[1:], ses[:-1]), Z_TOLERANCE, strict=True,
                       what="rise of the ratio as σ² falls / combined SE", basis=effect),
        rules.at_least((ratios[-1] - bounded_constant) / ses[-1], Z_TOLERANCE, strict=True,
                       what="(last ratio − bounded-SNR constant)/SE", basis=effect))

    def figure():
        fig, ax = plots.figure(width=6.6)
        plots.simulation_points(ax, [r["snr"] for r in rows], ratios, ses, k=Z_TOLERANCE,
                                label=rf"GD-$\beta$/Bayes excess ratio (±{Z_TOLERANCE:g} SE: the tolerance)")
        snrs = np.geomspace(min(r["snr"] for r in rows), max(r["snr"] for r in rows), 50)
        plots.theory_line(ax, snrs, 1 + 2 * snrs, label=r"$1 + 2\,\mathrm{SNR}$ (bound at each SNR)")
        plots.theory_line(ax, snrs, [bounded_constant] * len(snrs), color="tab:red", linestyle=":",
                          label=rf"bounded-SNR constant at $\sigma^2 = 1$: {bounded_constant:.3f}")
        plots.finish(ax, rf"The factor blows up as $\sigma^2 \to 0$ ($N = {N}$)",
                     r"$\mathrm{SNR} = \mathrm{tr}(H\Psi)/\sigma^2$",
                     r"$(R^* - \sigma^2)\,/\,(R_{\mathrm{Bayes}} - \sigma^2)$", logx=True, logy=True)
        plots.legend_outside(ax)
        return fig

    return Outcome(
        measured={"ratio_at_smallest_sigma2": float(ratios[-1]), "ratio_at_unit_sigma2": float(ratios[0])},
        predicted={"bounded_snr_constant": bounded_constant},
        labels={"ratio_at_smallest_sigma2": "ratio at smallest σ²", "ratio_at_unit_sigma2": "ratio at σ² = 1",
                "bounded_snr_constant": "bounded-SNR constant (to be exceeded)"},
        rule=rule, details=rows, figure=figure,
        notes="docs/gd_beta.md §8: ratio ≈ 560 at σ² = 1e-3, N = 50.")


# ==================================================================================================
# Theorem 6.3: gradient flow
# ==================================================================================================


@claim(
    "gd_beta.gradient_flow_converges",
    reference=f"{PAPER}: Lemma G.2 and Theorem 6.3 (rates of docs/gd_beta.md §9)",
    statement="Gradient flow on (β₀, Γ) converges to (β*, Γ*) (plus the unmoved null-space parts for singular H) "
              "from zero and random starts, with non-increasing risk, ‖P_R(β₀ − β*)‖² <= e^{−4λ₊t/(N+1)}‖·‖₀² "
              "along the path, and local rates 2λ_min(B(Γ*)) for β₀ and 2λ₊(H)λ₊(H^{1/2}ΩH^{1/2}) for Γ; β₀'s "
              "error drives Γ at second order, so Γ's tail decays at min(Γ rate, 2·β rate).",
    quick=dict(d=3, N=10, n_random_starts=2),
    full=dict(d=6, N=20, n_random_starts=8),
)
def gradient_flow_converges(seed, d, N, n_random_starts):
    problem_seed, singular_seed, start_seed = seed.spawn(3)
    full_rank = GDBetaProblem.random(d, N, seed=problem_seed, sigma2=0.5, beta_norm=1.0)
    singular = GDBetaProblem.random(d, N, seed=singular_seed, sigma2=0.5, beta_norm=1.0, rank_H=d - 1)
    rng = np.random.default_rng(start_seed)
    starts = [("full rank", full_rank, "zero", np.zeros(d), np.zeros((d, d)))]
    for k in range(n_random_starts):
        starts.append(("full rank", full_rank, f"random {k + 1}", rng.normal(size=d), rng.normal(size=(d, d)) / d))
    starts.append(("singular H", singular, "random", rng.normal(size=d), rng.normal(size=(d, d)) / d))

    # The integrator (rtol 1e-10) resolves a state of size ~1 to ~1e-9 absolute: the β₀ bound is checked above
    # that floor, as its square.
    converge_tol, monotone_tol, bound_floor = 1e-7, 1e-10, 1e-9
    rows, zero_run = [], None
    for label, problem, start, beta0, Gamma in starts:
        run = dyn.population_trajectory(problem, beta0, Gamma)
        m, rates = run.metrics, run.info["rates"]
        initial = m["beta_error"][0] + m["gamma_error"][0]
        final = m["beta_error"][-1] + m["gamma_error"][-1]
        e_range = (run.states["beta0"] - problem.beta_star) @ problem.H_range_projector.T
        sq = np.sum(e_range**2, axis=1)
        bound = np.exp(-rates.beta_uniform * run.times) * sq[0]
        floor = (bound_floor * (1 + np.linalg.norm(problem.beta_star))) ** 2
        rows.append(dict(problem=label, start=start, initial_error=initial, final_error=final,
                         max_risk_increase=float(np.max(np.diff(m["risk"]))),
                         beta_bound_violation=float(np.max(sq - bound - floor)),
                         converged=final <= converge_tol * (1 + initial)))
        if label == "full rank" and start == "zero":
            zero_run = run
    rates = zero_run.info["rates"]

    # Each local rate is measured on a run that excites only its own eigenmode of the linearised flow
    # (docs/gd_beta.md §9 item 4), so no slower or faster mode biases a finite-window fit:
    # from (β* + a·v, Γ*) the β₀ error stays along v and decays at 2λ_min(B(Γ*)) up to O(a²);
    # from (β*, Γ* + uwᵀ) β₀ never moves and Γ's equation is linear, so ‖Γ − Γ*‖_F decays at the Γ rate exactly.
    # The Γ error of the first run is second order in a: it must follow the closed-form linear response, whose
    # tail rate is min(Γ rate, 2·β rate).
    modes = cf.slow_modes(full_rank)
    a = 1e-2 * max(1.0, float(np.linalg.norm(full_rank.beta_star)))
    precise = dict(rtol=1e-12, atol=1e-15)
    gamma_star = cf.optimal_gamma(full_rank)
    beta_run = dyn.population_trajectory(full_rank, full_rank.beta_star + a * modes.beta, gamma_star, **precise)
    gamma_run = dyn.population_trajectory(full_rank, full_rank.beta_star, gamma_star + modes.gamma, **precise)
    beta_component = np.abs((beta_run.states["beta0"] - full_rank.beta_star) @ modes.beta)
    window, rate_tol, response_tol, response_floor = (1e-8, 1e-1), 1e-3, 1e-2, 1e-9
    fits = [
        ("β₀ slow-mode component", beta_run.times, beta_component, rates.beta),
        ("‖Γ − Γ*‖_F from the slow Γ mode", gamma_run.times, gamma_run.metrics["gamma_error"], rates.gamma_mode),
    ]
    rate_rows, rate_fits = [], []
    for quantity, t, y, predicted in fits:
        fit = fit_exponential_rate(t, y, window)
        rate_fits.append(fit)
        rate_rows.append(dict(quantity=quantity, fitted=-fit.slope, predicted=predicted,
                              relative_error=abs(-fit.slope - predicted) / predicted))
    response = np.linalg.norm(cf.gamma_response(full_rank, a, beta_run.times), axis=(-2, -1))
    observed = beta_run.metrics["gamma_error"]
    resolved = response >= response_floor
    response_error = float(np.max(np.abs(observed[resolved] - response[resolved]) / response[resolved]))
    tail_fit = fit_exponential_rate(beta_run.times[resolved][-20:], observed[resolved][-20:], (0.0, np.inf))
    risk0 = zero_run.metrics["risk"][0]
    flow = "deterministic ODE (rtol 1e-10)"
    single_mode = (f"single-mode starts of amplitude a = {a:.2g} (rtol 1e-12), so the neglected terms are O(a²) = "
                   f"{a * a:.0e} relative; docs/gd_beta.md §9")
    rule = all_of(
        rules.condition(all(r["converged"] for r in rows),
                        f"final error ≤ {converge_tol:g}·(1 + initial) by t = 30/rate from every start (largest "
                        f"final error {max(r['final_error'] for r in rows):.2g})", basis=flow),
        rules.at_most([r["max_risk_increase"] for r in rows], monotone_tol * risk0,
                      what=f"largest risk increase along a path ({monotone_tol:g}·R(0))", basis=flow),
        rules.at_most([r["beta_bound_violation"] for r in rows], 0.0,
                      what=f"‖P_R(β₀ − β*)‖² − its bound − the integrator floor ({bound_floor:g}(1 + ‖β*‖))²",
                      basis=flow),
        rules.at_most([r["relative_error"] for r in rate_rows], rate_tol,
                      what=f"relative error of each rate fitted on error/error(0) ∈ {window}", basis=single_mode),
        rules.at_most(response_error, response_tol,
                      what=f"Γ's relative deviation from its linear response where that exceeds {response_floor:g}",
                      basis=single_mode))
    details = rows + rate_rows + [dict(quantity="‖Γ − Γ*‖_F driven by the β₀ mode", max_relative_deviation=response_error,
                                       points_compared=int(resolved.sum()), tail_slope_last_points=-tail_fit.slope,
                                       asymptotic_tail_rate=rates.gamma_tail)]

    def figure():
        fig, ax = plots.figure(width=6.8, height=5.0)
        labels = (r"$|v^\top(\beta_0 - \beta^*)|$ from $(\beta^* + a v, \Gamma^*)$",
                  r"$\|\Gamma - \Gamma^*\|_F$ from $(\beta^*, \Gamma^* + u w^\top)$")
        for (_, t, y, rate), fit, label, color, marker in zip(fits, rate_fits, labels, ("tab:blue", "tab:orange"), "os"):
            ax.plot(t, y, color=color, marker=marker, markersize=4, linestyle="none", markerfacecolor="none",
                    label=f"{label} (ODE)")
            plots.predicted_rate(ax, t, t[0], y[0], -rate, None, kind="exponential", color=color)
        ax.plot(beta_run.times, observed, color="tab:green", marker="D", markersize=3, linestyle="none",
                markerfacecolor="none", label=r"$\|\Gamma - \Gamma^*\|_F$ from $(\beta^* + a v, \Gamma^*)$ (ODE)")
        plots.theory_line(ax, beta_run.times[1:], response[1:], label=None, color="tab:green")
        ax.plot([], [], **plots.THEORY, label=r"theory: $e^{-\lambda t}$ at the local rates; linear response of $\Gamma$")
        plots.finish(ax, "Gradient flow (Thm 6.3): local rates, one mode at a time", "flow time $t$", "error",
                     logy=True)
        ax.set_ylim(1e-13, 10)
        plots.legend_below(ax)
        return fig

    return Outcome(
        measured={"beta_rate": rate_rows[0]["fitted"], "gamma_mode_rate": rate_rows[1]["fitted"],
                  "gamma_response_deviation": response_error,
                  "max_final_error": max(r["final_error"] for r in rows),
                  "max_risk_increase": max(r["max_risk_increase"] for r in rows)},
        predicted={"beta_rate": rates.beta, "gamma_mode_rate": rates.gamma_mode, "gamma_response_deviation": 0.0,
                   "max_final_error": 0.0},
        labels={"beta_rate": "β rate 2λ_min(B(Γ*))", "gamma_mode_rate": "Γ mode rate",
                "gamma_response_deviation": "Γ vs its linear response (tail min(Γ rate, 2β rate)), max rel. dev.",
                "max_final_error": "max final error", "max_risk_increase": "max risk increase"},
        rule=rule, details=details, figure=figure)


# ==================================================================================================
# SGD on sampled prompts reaches each class's optimum
# ==================================================================================================


# A run that does not reach its class optimum: the LTB's value row can be drawn into the spurious minimum of
# gd_beta.ltb_spurious_minimum even from the label copy (4 of 150 runs of the quick setting, 95% Clopper–Pearson
# upper bound 6.7%), and LSA runs whose value row crosses b = 0 converge slowly (1 of 150). The claim judges the
# median seed, so it fails only when half the seeds or more miss; the nominal rate is that binomial tail at
# STALL_RATE, an upper bound on the per-run rate (docs/gd_beta.md §10).
STALL_RATE = 0.08


@claim(
    "gd_beta.sgd_reaches_optimum",
    reference=f"{PAPER}: Theorems 4.1, 5.2, 5.3 under training (docs/gd_beta.md §10)",
    statement="Adam on freshly sampled prompts trains GD-β and the full LTB to R* and LSA to its (larger) "
              "exact optimum: the median seed's exact risk ends within 1% of the class optimum (value row "
              "initialised at the label copy b = 1), and no seed beats it.",
    quick=dict(beta_norm_H=2.0, seeds=3, steps=2000, batch_size=128, lr=0.05),
    full=dict(beta_norm_H=2.0, seeds=8, steps=6000, batch_size=512, lr=0.05),
)
def sgd_reaches_optimum(seed, beta_norm_H, seeds, steps, batch_size, lr):
    problem = example_problem(beta_norm_H)
    R_star = cf.optimal_risk(problem)
    optima = dict(gd_beta=R_star, ltb=R_star, lsa=cf.optimal_attention_risk(problem, mlp=False).risk)
    allowance = 0.01
    # GD-β has no spurious minimum; LTB and LSA stall: the median fails when at least half the seeds miss (for even
    # seeds, the two middle ones straddle at worst), a binomial tail at STALL_RATE per model.
    misses_to_fail = (seeds + 1) // 2
    per_model = float(scipy_stats.binom.sf(misses_to_fail - 1, seeds, STALL_RATE))
    training = ("the trained risk is evaluated exactly (closed form), so only training remains: 1% is the allowance "
                "for a finite number of steps (good runs end 0.03–0.3% above); the median fails only if half the "
                f"seeds stall, a binomial tail at a per-run stall rate ≤ {STALL_RATE:g} for LTB and LSA, whose seeds "
                "are independent (docs/gd_beta.md §10)")
    rows, curves, parts = [], {}, []
    for model, child in zip(optima, seed.spawn(len(optima))):
        runs = [dyn.minibatch_trajectory(problem, model, batch_size, steps, seed=s, lr=lr) for s in child.spawn(seeds)]
        finals = np.array([run.metrics["risk"][-1] for run in runs])
        optimum = optima[model]
        reached = finals <= (1 + allowance) * optimum
        model_rule = all_of(
            rules.at_most(np.median(finals), (1 + allowance) * optimum,
                          what=f"{model}: median trained risk ((1 + {allowance:g})·optimum)", basis=training,
                          false_fail_rate=None if model == "gd_beta" else per_model),
            rules.at_least(finals.min(), optimum * (1 - 1e-9), what=f"{model}: best seed's risk (the optimum)",
                           basis=training))
        parts.append(model_rule)
        rows.append(dict(model=model, median_risk=float(np.median(finals)), optimum=optimum,
                         median_excess=float(np.median(finals) - optimum), seeds_within_1pct=int(reached.sum()),
                         seeds=seeds, best_seed=float(finals.min()), worst_seed=float(finals.max()),
                         passed=model_rule.passed))
        curves[model] = (runs[0].times, np.median([run.metrics["risk"] for run in runs], axis=0))

    def figure():
        fig, ax = plots.figure(width=6.8)
        for (model, (t, risk)), color, marker in zip(curves.items(), ("tab:blue", "tab:orange", "tab:green"), "osD"):
            ax.plot(t, risk, color=color, linewidth=0.8, marker=marker, markersize=4, markevery=max(1, t.size // 25),
                    label=f"{model}: Adam, median of {seeds} seeds")
            plots.theory_line(ax, t, np.full(t.size, optima[model]), label=None, color=color)
        ax.plot([], [], **plots.THEORY, label="closed-form optimum (same colour)")
        plots.finish(ax, rf"Training on fresh prompts, $\|\beta^*\|_H = {beta_norm_H:g}$", "training step",
                     "population risk (exact)", logy=True)
        plots.legend_outside(ax)
        return fig

    return Outcome(
        measured={f"{r['model']}_risk": r["median_risk"] for r in rows},
        predicted={f"{r['model']}_risk": r["optimum"] for r in rows},
        labels={f"{r['model']}_risk": f"{r['model']} risk: median trained / optimum" for r in rows},
        rule=all_of(*parts, independent=True), details=rows, figure=figure,
        notes="The LSA optimum exceeds R* by the Theorem 4.1 gap: no amount of training closes it. LTB and LSA "
              "train in the reduced coordinates (c, a, b, Q, q) as in docs/gd_beta.md §10, from the label-copy value row; "
              "a few runs even from there (and more from a random value row) end in the spurious minimum of "
              "gd_beta.ltb_spurious_minimum, which is why the median seed is judged.")


# ==================================================================================================
# Beyond the paper: the LTB's value-direction landscape has a spurious local minimum
# ==================================================================================================


@claim(
    "gd_beta.ltb_spurious_minimum",
    reference=f"{PAPER}: Theorem 5.3 concerns the infimum only; this landscape property is attnflow's finding",
    statement="Beyond the paper: on the b = 0 equator of the value direction (the attention ignores labels in its "
              "values) the optimal-read-out LTB risk has a strict local minimum above R*; Adam from a random value "
              "row ends there for some seeds and at R* for the others — nowhere else.",
    quick=dict(beta_norm_H=2.0, seeds=6, steps=2000, batch_size=128, lr=0.05),
    full=dict(beta_norm_H=2.0, seeds=24, steps=4000, batch_size=256, lr=0.05),
)
def ltb_spurious_minimum(seed, beta_norm_H, seeds, steps, batch_size, lr):
    problem = example_problem(beta_norm_H)
    d = problem.d
    R_star = cf.optimal_risk(problem)

    def on_sphere(a_direction, b):
        a = a_direction / np.linalg.norm(a_direction) * np.sqrt(1 - b * b)
        return cf.optimal_readout_risk(problem, a, b, constant=True)[0]

    starts = [np.eye(d)[i] for i in range(d)]
    equator = min((minimize(lambda x: on_sphere(x, 0.0), s, method="BFGS", options=dict(gtol=1e-12))
                   for s in starts), key=lambda r: r.fun)
    R_local = float(equator.fun)
    h = 1e-3
    curvature = min(on_sphere(equator.x, h), on_sphere(equator.x, -h)) - R_local  # > 0: minimum across b = 0
    finals = np.array([dyn.minibatch_trajectory(problem, "ltb", batch_size, steps, seed=s, lr=lr, value_init="random")
                       .metrics["risk"][-1] for s in seed.spawn(seeds)])
    near_global = np.abs(finals - R_star) <= 0.01 * R_star
    near_local = np.abs(finals - R_local) <= 0.01 * R_local
    rows = [dict(seed=i, final_risk=r, ends_at="R*" if g else ("b = 0 minimum" if l else "elsewhere"))
            for i, (r, g, l) in enumerate(zip(finals, near_global, near_local))]
    landscape = "deterministic landscape (BFGS at gtol 1e-12, second difference at h = 1e-3 well above round-off)"
    rule = all_of(
        rules.at_least(R_local, R_star * 1.01, strict=True, what="equator minimum (1.01·R*)", basis=landscape),
        rules.at_least(curvature, 0.0, strict=True, what="risk rise at b = ±1e-3", basis=landscape),
        rules.condition(bool(np.all(near_global | near_local)),
                        f"every seed within 1% of R* or of the equator minimum ({int(near_global.sum())} at R*, "
                        f"{int(near_local.sum())} at the equator, {int(np.sum(~(near_global | near_local)))} elsewhere)",
                        basis="training endpoints within the same 1% optimisation allowance as "
                              "gd_beta.sgd_reaches_optimum"))

    def figure():
        fig, (ax_path, ax_seeds) = plots.figure(ncols=2, width=4.4)
        u = equator.x / np.linalg.norm(equator.x)
        theta = np.linspace(-np.pi / 2, np.pi / 2, 121)
        landscape = [cf.optimal_readout_risk(problem, np.cos(t) * u, np.sin(t), constant=True)[0] for t in theta]
        plots.theory_line(ax_path, theta, landscape, label="min over read-outs (closed form)")
        for ax in (ax_path, ax_seeds):
            ax.axhline(R_star, color="tab:green", linestyle=":", label=r"$R^*$")
            ax.axhline(R_local, color="tab:red", linestyle=":", label=f"equator minimum {R_local:.4f}")
        plots.finish(ax_path, "LTB risk on a great circle of value directions", r"$\theta$ ($b = \sin\theta$)",
                     "risk")
        plots.simulation_points(ax_seeds, np.arange(seeds), finals, label="Adam from a random value row")
        plots.finish(ax_seeds, f"Where {seeds} training runs end", "seed", "final population risk")
        ax_seeds.set_xticks(np.arange(seeds))
        plots.legend_outside(ax_seeds)
        ax_path.get_legend().remove()
        return fig

    return Outcome(
        measured={"equator_minimum_risk": R_local, "risk_rise_off_equator": float(curvature),
                  "seeds_at_equator_minimum": int(near_local.sum()), "seeds_at_global_minimum": int(near_global.sum())},
        predicted={"global_minimum_risk": R_star, "risk_rise_off_equator": "> 0"},
        labels={"equator_minimum_risk": "equator minimum risk", "risk_rise_off_equator": "risk rise at b = ±1e-3",
                "seeds_at_equator_minimum": "seeds at the b = 0 minimum", "seeds_at_global_minimum": "seeds at R*",
                "global_minimum_risk": "R* (global)"},
        figure=figure,
        rule=rule, details=rows,
        notes="From the label-copy initialisation (b = 1) every seed reaches R* (gd_beta.sgd_reaches_optimum).")


# ==================================================================================================
# `attnflow solve gd-beta`
# ==================================================================================================

def summary(problem: GDBetaProblem, *, seed, bayes_contexts: int = 20_000) -> dict:
    """Every closed form of the system at one problem, and the Bayes risk by Monte Carlo (``attnflow solve``)."""
    R_star = cf.optimal_risk(problem)
    lsa = cf.optimal_attention_risk(problem, mlp=False)
    ltb = cf.optimal_attention_risk(problem, mlp=True)
    bayes = dyn.bayes_risk(problem, bayes_contexts, seed=seed)
    rates = cf.local_rates(problem)
    bayes_excess = bayes.mean - problem.sigma2
    # With Ψ̃ = 0 (or vanishing) neither risk exceeds σ²: the ratio of Corollary 6.2 is 0/0, not a number.
    ratio = (R_star - problem.sigma2) / bayes_excess if bayes_excess > 1e-300 else "undefined (Bayes excess risk 0)"
    return {
        "d": problem.d, "N": problem.N, "sigma2": problem.sigma2,
        # σ² = 0, or so small that tr(HΨ)/σ² overflows: noise-free labels, said in words rather than as inf
        "SNR tr(HΨ)/σ²": snr if math.isfinite(snr := cf.snr(problem)) else "infinite (noise-free labels)",
        "‖β*‖_H": problem.beta_norm_H,
        "R* optimal GD-β risk (Thm 5.2)": R_star,
        "β₀* = β*": problem.beta_star,
        "Γ* (5.3)": cf.optimal_gamma(problem),
        "inf LTB risk (Thm 5.3, = R*)": ltb.risk,
        "inf LSA risk (docs/gd_beta.md §6)": lsa.risk,
        "LSA gap inf LSA − R* (Thm 4.1)": lsa.risk - R_star,
        "optimal GD-0 risk (LSA upper bound)": cf.gd0_optimal_risk(problem),
        "Bayes risk (Lemma 6.1, MC)": bayes.mean,
        "Bayes risk standard error": bayes.standard_error,
        "excess ratio GD-β/Bayes (Cor 6.2)": ratio,
        "local rate β₀": rates.beta,
        "local rate Γ": rates.gamma_mode,
    }


def population_figure(trajectory, title: str, time_label: str, labels=None):
    """The gradient flow's metrics (``attnflow solve gd-beta --plot``) with the local rates of Theorem 6.3 drawn
    beside them (docs/gd_beta.md §9): ‖β₀ − β*‖ at 2λ_min(B(Γ*)), ‖Γ − Γ*‖_F at the tail rate min(Γ rate, 2·β rate),
    and R − R*, quadratic in both errors near the optimum, at twice the slower of the two."""
    rates = trajectory.info["rates"]
    slowest = min(rates.beta, rates.gamma_tail)
    return plots.trajectory_figure_with_rates(trajectory, title, time_label, {
        "beta_error": (rates.beta, rf"predicted $e^{{-{rates.beta:.3g}\,t}}$"),
        "gamma_error": (rates.gamma_tail, rf"predicted $e^{{-{rates.gamma_tail:.3g}\,t}}$"),
        "excess_risk": (2 * slowest, rf"predicted $e^{{-{2 * slowest:.3g}\,t}}$"),
    }, labels=labels)


LABELS = {
    "risk": "population risk R(β₀, Γ)",
    "excess_risk": "excess risk R − R*",
    "beta_error": "‖β₀ − β₀(∞)‖",
    "gamma_error": "‖Γ − Γ(∞)‖_F",
    "batch_loss": "minibatch loss",
}

COMPARE_CONTEXTS = 4000  # contexts of the Monte-Carlo pool for Σ of the SGD band (16 batches of 250)


def compare(problem: GDBetaProblem, run, *, seed, model: str = "gd_beta", batch_size: int = 128, steps: int = 1000,
            lr: float = 0.05, optimizer: str = "adam"):
    """The prediction of a minibatch run (``attnflow simulate gd-beta --compare``).

    GD-β: the same optimiser, schedule and start (0, 0) on the exact population gradient (G.4, G.5), recorded at
    the run's steps; with SGD also the linear-noise band of docs/gd_beta.md §12 (docs/diffusion.md) on the risk,
    mean ½tr(∇²R·C) above the path and ±2 sd of gᵀCg + ½tr((∇²R·C)²), Σ estimated on ``COMPARE_CONTEXTS`` contexts
    drawn from ``seed``. The other models have no closed-form path in their coordinates: their class's optimal risk
    is drawn (inf LTB = R*, Thm 5.3; inf LSA, docs/gd_beta.md §6)."""
    from attnflow.dynamics.optimizers import exact_gradient_path

    from .compare import Comparison

    R_star = cf.optimal_risk(problem)
    if model != "gd_beta":
        mlp = model.startswith("ltb")
        optimum = R_star if mlp else cf.optimal_attention_risk(problem, mlp=False).risk
        name = "inf LTB risk = R* (Thm 5.3)" if mlp else "inf LSA risk (docs/gd_beta.md §6)"
        return Comparison(run, ("risk",), levels={"risk": (optimum, name)},
                          note=f"{model} has no closed-form population path in its own coordinates: the dotted line "
                               f"is the optimal risk of its class, which training should approach.")
    record = run.times.astype(int)
    path = exact_gradient_path([np.zeros(problem.d), np.zeros((problem.d, problem.d))],
                               lambda params: list(cf.risk_gradient(problem, *params)), optimizer, lr, steps, record)
    betas = np.array([b for b, _ in path])
    Gammas = np.array([G for _, G in path])
    risk = cf.icl_risk(problem, betas, Gammas)
    prediction = Trajectory(times=run.times.copy(),
                            metrics=dict(risk=risk, excess_risk=dyn.excess_risk(problem, betas, Gammas)))
    simulation = Trajectory(times=run.times, states=run.states, info=run.info, metrics={
        **run.metrics, "excess_risk": dyn.excess_risk(problem, run.states["beta0"], run.states["Gamma"])})
    label = f"{optimizer} on the population gradient (same steps and schedule)"
    if optimizer != "sgd":
        return Comparison(simulation, ("risk", "excess_risk"), prediction, label, levels={"risk": (R_star, "R* (Thm 5.2)")},
                          note=f"The linear-noise band is derived for SGD (docs/diffusion.md); {optimizer} rescales "
                               f"each coordinate's noise by its own running moments, so none is drawn.")
    pool = dyn.context_pool(problem, COMPARE_CONTEXTS, seed=seed)
    band = dyn.sgd_linear_noise(problem, batch_size, steps, lr, pool, record_every=max(1, steps // 100))
    if not np.array_equal(band.steps, record):  # the same recorded steps as minibatch_trajectory
        raise RuntimeError(f"the band records steps {band.steps[:3]}…, the run {record[:3]}…")
    gradients = np.array([cf.flow_state(*cf.risk_gradient(problem, b, G)) for b, G in zip(betas, Gammas)])
    hessians = np.array([cf.risk_hessian(problem, b, G) for b, G in zip(betas, Gammas)])
    shift, sd = band.smooth_metric(gradients, hessians)
    bands = {name: (run.times, values + shift - 2 * sd, values + shift + 2 * sd)
             for name, values in prediction.metrics.items()}
    return Comparison(simulation, ("risk", "excess_risk"), prediction, label, bands=bands,
                      band_label=f"linear-noise band at B = {batch_size} (±2 sd)",
                      levels={"risk": (R_star, "R* (Thm 5.2)")})


# ==================================================================================================
# A scaling law run as a sweep: minibatch gradient vs population gradient
# ==================================================================================================

GRADIENT_LAW = ScalingLaw(
    x="batch_size", y="squared_deviation", exponent=-1.0,
    statement="E‖ĝ_B − ∇R‖² = tr Cov(per-prompt gradient)/B exactly, for an unbiased minibatch gradient")


@observable(
    "gd_beta.minibatch_gradient_deviation",
    reference=f"{PAPER}: the population gradient of Lemma G.2 (docs/gd_beta.md §9) against its minibatch estimate",
    description="‖ĝ_B − ∇R‖² at a fixed (β₀, Γ): the squared distance between the minibatch gradient on B fresh "
                "prompts and the closed-form population gradient. The random instance and parameter come from "
                "the run's instance seed (the same at every replicate); the replicate's seed draws only the batch.",
    defaults=dict(batch_size=64, d=3, N=10),
    law=GRADIENT_LAW,
)
def minibatch_gradient_deviation(seed, batch_size, d, N):
    batch_size = check.integer(batch_size, "batch_size", minimum=1)
    d, N = check.integer(d, "d", minimum=1), check.integer(N, "N", minimum=1)
    # memory before any allocation: the batch is sampled at once, and the instance holds d × d matrices
    if batch_size * (N + 1) * d > 10**8:
        raise ValueError(f"batch_size {batch_size} at N = {N}, d = {d} would sample "
                         f"{8 * batch_size * (N + 1) * d / 1e9:.1f} GB at once (at most 0.8 GB)")
    if d > 2000:
        raise ValueError(f"d must be <= 2000 here (its d × d matrices), got {d}")
    problem_seed, parameter_seed = seeding.spawn(seeding.instance(seed), 2)
    problem = GDBetaProblem.random(d, N, seed=problem_seed, sigma2=0.5)
    rng = np.random.default_rng(parameter_seed)
    beta0, Gamma = rng.normal(size=problem.d), rng.normal(size=(problem.d, problem.d)) / problem.d
    prompts = dyn.sample_prompts(problem, batch_size, np.random.default_rng(seed))
    loss, g_beta, g_Gamma = dyn.minibatch_gradient(problem, prompts, beta0, Gamma)
    p_beta, p_Gamma = cf.risk_gradient(problem, beta0, Gamma)
    return dict(squared_deviation=float(np.sum((g_beta - p_beta) ** 2) + np.sum((g_Gamma - p_Gamma) ** 2)),
                batch_loss=float(loss), population_risk=float(cf.icl_risk(problem, beta0, Gamma)))


# Two-sided level of the exponent interval of minibatch_gradient_scaling: nominal false-FAIL rate 1e-3.
SCALING_LEVEL = 0.999


@claim(
    "gd_beta.minibatch_gradient_scaling",
    reference=f"{PAPER}: population gradient flow (Lemma G.2) as the limit of minibatch training",
    statement="The minibatch gradient on B fresh prompts is an unbiased estimate of the closed-form population "
              "gradient: its mean squared deviation scales as B^-1 (deviation ∝ B^-1/2), fitted over a sweep in B "
              "with a delta-method Student-t interval over seeds.",
    quick=dict(batch_sizes=(256, 1024, 4096), seeds=32),
    full=dict(batch_sizes=(256, 1024, 4096, 16384), seeds=128),
)
def minibatch_gradient_scaling(seed, batch_sizes, seeds):
    # The squared deviation is a heavy-tailed quadratic in the prompts (eighth moments of Gaussians), so at small B
    # its seed-mean is skewed: a percentile bootstrap over 16 seeds at B = 16…1024 failed 8.9% of seeds against a
    # stated 5%, the interval above −1 when the small-B mean came out low. From B = 256 the mean is near-normal and
    # the delta-method t interval over paired seeds is calibrated (docs/gd_beta.md §9).
    from .sweep import run_sweep

    result = run_sweep("gd_beta.minibatch_gradient_deviation", {"batch_size": list(batch_sizes)}, seeds=seeds,
                       master_seed=seed, n_jobs=1)
    x, y = result.values("squared_deviation", "batch_size")
    fit = stats.fit_exponent_t(x, y, level=SCALING_LEVEL)
    means, ses = y.mean(axis=1), y.std(axis=1, ddof=1) / np.sqrt(seeds)

    def figure():
        fig = plots.scaling_figure(x, y, fit, GRADIENT_LAW, "Minibatch gradient deviation (sweep over $B$)")
        ax = fig.axes[0]
        ax.set_xlabel("batch size $B$")
        ax.set_ylabel(r"$\|\hat g_B - \nabla R\|^2$")
        ax.set_xticks(x, [f"{b:g}" for b in x])  # the measured batch sizes; no crowded minor labels
        ax.xaxis.set_minor_formatter(NullFormatter())
        fig.set_size_inches(7.4, 3.6)
        plots.legend_outside(ax)
        return fig

    return Outcome(
        measured={"exponent": fit.estimate, "interval_low": fit.low, "interval_high": fit.high},
        predicted={"exponent": GRADIENT_LAW.exponent},
        labels={"exponent": "exponent of E‖ĝ_B − ∇R‖² in B: fitted / theorem",
                "interval_low": f"{fit.level:.1%} interval low", "interval_high": f"{fit.level:.1%} interval high"},
        rule=rules.within(GRADIENT_LAW.exponent, fit.low, fit.high,
                          what=f"the theorem's exponent {GRADIENT_LAW.exponent:g} (fitted {fit.level:.1%} interval)",
                          basis=f"{fit.method} ({seeds} seeds, each drawing the batch at every B: a paired design)",
                          false_fail_rate=1 - fit.level),
        details=[dict(batch_size=int(b), mean_squared_deviation=m, standard_error=s) for b, m, s in zip(x, means, ses)],
        figure=figure)


# ==================================================================================================
# The diffusion tier: gradient noise, the linear-noise approximation, Gaussian-noise paths (docs/gd_beta.md §12)
# ==================================================================================================

# Family-wise nominal false-FAIL rate of each diffusion-tier claim, split by Bonferroni over its comparisons.
DIFFUSION_FAMILY_RATE = 1e-3
# ROUND_OFF (closed_forms.certificates): the same float64 arithmetic in two orders, relative to the gradient's size


def _sgd_paths(problem, batch_size, steps, lr, seed, runs, record_every):
    """Parameters of ``runs`` SGD runs at the recorded steps, (runs, n_records, p)."""
    paths = [dyn.minibatch_trajectory(problem, "gd_beta", batch_size, steps, seed=s, lr=lr, optimizer="sgd",
                                      record_every=record_every) for s in seeding.spawn(seed, runs)]
    return np.array([cf.flow_state(run.states["beta0"], run.states["Gamma"]) for run in paths])


def _checkpoints(band, steps, count=3):
    """Indices into the band's records of the last recorded steps at or before steps/2^(count−1), …, steps/2,
    steps (the runs record the same steps)."""
    if steps < 2 ** (count - 1):
        raise ValueError(f"steps must be >= {2 ** (count - 1)} for {count} distinct checkpoints, got {steps}")
    wanted = [steps // 2 ** (count - 1 - k) for k in range(count)]
    return sorted({max(0, int(np.searchsorted(band.steps, w, side="right")) - 1) for w in wanted} - {0})


def _per_prompt_gradients(prompts, beta0, Gamma) -> np.ndarray:
    """Per-prompt gradients of the squared loss of GD-β (5.1) in (β₀, vec Γ), from the raw definition in numpy:
    ŷ = x_qᵀ(β₀ + Γg₀), g₀ = Xᵀ(y − Xβ₀)/N, ∂ŷ/∂β₀ = x_q − ĤΓᵀx_q (Ĥ = XᵀX/N), ∂ŷ/∂Γ = x_q g₀ᵀ. Shape (n, d + d²)."""
    X, x_q = prompts.X, prompts.x_query
    N = X.shape[1]
    g0 = np.einsum("nkd,nk->nd", X, prompts.y - X @ beta0) / N
    residual = np.einsum("nd,nd->n", x_q, beta0 + g0 @ Gamma.T) - prompts.y_query
    d_beta0 = x_q - np.einsum("nkd,nk->nd", X, np.einsum("nkd,nd->nk", X, x_q @ Gamma)) / N
    d_Gamma = x_q[:, :, None] * g0[:, None, :]
    return 2.0 * residual[:, None] * np.concatenate([d_beta0, d_Gamma.reshape(len(x_q), -1)], axis=1)


def _kernel_disagreement(problem, prompts, grads, beta0, Gamma, count: int) -> float:
    """Largest relative difference between ``grads`` and the training kernel's gradients on batches of one, over the
    first ``count`` prompts."""
    worst = 0.0
    for i in range(min(count, len(grads))):
        one = slice(i, i + 1)
        _, g_beta, g_Gamma = dyn.minibatch_gradient(problem, dyn.Prompts(
            X=prompts.X[one], y=prompts.y[one], x_query=prompts.x_query[one], y_query=prompts.y_query[one],
            beta=prompts.beta[one]), beta0, Gamma)
        kernel = np.concatenate([g_beta, g_Gamma.ravel()])
        worst = max(worst, float(np.abs(kernel - grads[i]).max() / (np.abs(grads[i]).max() + 1.0)))
    return worst


PROMPT_CHUNK = 100_000  # prompts per brute-force chunk: bounded memory whatever n_prompts


@claim(
    "gd_beta.gradient_noise_covariance",
    reference=f"{PAPER}: the per-prompt gradient of the squared loss (5.1); docs/gd_beta.md §12",
    statement="The covariance Σ(β₀, Γ) of the per-prompt gradient, with the query integrated in closed form "
              "(E[ĝĝᵀ | context] = 4L[(uᵀHu + σ²)H + 2Hu uᵀH]Lᵀ) and the context averaged, equals the covariance of "
              "brute-force per-prompt gradients, entry by entry; the brute-force gradients equal the training "
              "kernel's on batches of one.",
    # 10⁶ prompts: the products of gradient entries are degree-8 polynomials of Gaussians (skewness up to about
    # 100), and a mean of 4·10⁴ of them was too skewed for a normal tail at |z| ≈ 4 (docs/gd_beta.md §12).
    quick=dict(d=2, N=10, n_contexts=256_000, n_prompts=1_000_000, kernel_prompts=1000),
    full=dict(d=3, N=20, n_contexts=256_000, n_prompts=4_000_000, kernel_prompts=1000),
)
def gradient_noise_covariance(seed, d, N, n_contexts, n_prompts, kernel_prompts):
    n_prompts = check.integer(n_prompts, "n_prompts", minimum=2)
    kernel_prompts = check.integer(kernel_prompts, "kernel_prompts", minimum=1)
    problem_seed, point_seed, pool_seed, prompt_seed = seed.spawn(4)
    problem = GDBetaProblem.random(d, N, seed=problem_seed, sigma2=0.5, beta_norm=1.0)
    rng = np.random.default_rng(point_seed)
    beta0, Gamma = rng.normal(size=d) / 2, rng.normal(size=(d, d)) / d
    pool = dyn.context_pool(problem, n_contexts, seed=pool_seed)
    estimates = dyn.gradient_noise_covariance(problem, beta0, Gamma, pool)
    predicted = estimates.mean(axis=0)
    predicted_se = estimates.std(axis=0, ddof=1) / np.sqrt(len(estimates))
    p = d + d * d
    upper = np.triu_indices(p)
    # Brute force in chunks, centred at the exact ∇R (the sample mean differs by O(n^{-1/2})): the sums of
    # c, ccᵀ and of the squared products give the sample covariance and the standard error of each entry.
    gradient = cf.flow_state(*cf.risk_gradient(problem, beta0, Gamma))
    prompt_rng = np.random.default_rng(prompt_seed)
    sum_c, sum_cc, sum_squares = np.zeros(p), np.zeros((p, p)), np.zeros(len(upper[0]))
    for start in range(0, n_prompts, PROMPT_CHUNK):
        prompts = dyn.sample_prompts(problem, min(PROMPT_CHUNK, n_prompts - start), prompt_rng)
        grads = _per_prompt_gradients(prompts, beta0, Gamma)
        if start == 0:  # the training kernel on batches of one gives the same gradients
            kernel_error = _kernel_disagreement(problem, prompts, grads, beta0, Gamma, kernel_prompts)
        c = grads - gradient
        sum_c += c.sum(axis=0)
        sum_cc += c.T @ c
        sum_squares += ((c[:, upper[0]] * c[:, upper[1]]) ** 2).sum(axis=0)
    shift = sum_c / n_prompts  # the sample mean minus ∇R
    measured = (sum_cc - n_prompts * np.outer(shift, shift)) / (n_prompts - 1)
    measured_se = np.sqrt(np.maximum(sum_squares / n_prompts - measured[upper] ** 2, 0.0) / n_prompts)
    entry_se = predicted_se[upper]
    z = (measured - predicted)[upper] / np.hypot(measured_se, entry_se)
    comparisons = z.size + p  # the entries of Σ and of the mean gradient
    alpha = DIFFUSION_FAMILY_RATE / comparisons
    # Σ̂'s error bar rests on len(estimates) batches: Student t on the Welch–Satterthwaite degrees of freedom
    dfs = np.array([stats.welch_df(a, n_prompts - 1, b, len(estimates) - 1) for a, b in zip(measured_se, entry_se)])
    thresholds = scipy_stats.t.isf(alpha / 2, dfs)
    mean_se = np.sqrt(np.diag(measured) / n_prompts)
    mean_z = shift / mean_se
    mean_threshold = float(scipy_stats.norm.isf(alpha / 2))
    worst = int(np.argmax(np.abs(z) / thresholds))
    bonferroni = f"Bonferroni at family-wise rate {DIFFUSION_FAMILY_RATE:g} over {comparisons} comparisons"
    rule = all_of(
        rules.within(z, -thresholds, thresholds, strict=True, false_fail_rate=DIFFUSION_FAMILY_RATE,
                     what="z of each distinct entry of Σ (interval: ± its Student-t bound)",
                     basis=f"z from the standard errors of both estimates (brute force: SE of the products over "
                           f"{n_prompts} prompts; closed form: spread of {len(estimates)} batch estimates, hence "
                           f"Student t on the Welch–Satterthwaite degrees of freedom, {dfs.min():.0f}–"
                           f"{dfs.max():.0f}); {bonferroni}, the {p} entries of the mean gradient included"),
        rules.within(mean_z, -mean_threshold, mean_threshold, strict=True,
                     what="z of each entry of the mean gradient against ∇R (interval: ± the normal bound)",
                     basis=f"normal: {n_prompts} prompts; the same {bonferroni}"),
        rules.round_off(kernel_error, ROUND_OFF, what="training kernel − raw gradient (relative)",
                        basis="the same float64 arithmetic in two orders"))
    return Outcome(
        measured={"max_abs_z": float(np.abs(z).max()), "trace_sigma": float(np.trace(measured)),
                  "max_abs_z_mean": float(np.abs(mean_z).max()), "kernel_relative_error": kernel_error},
        predicted={"max_abs_z": 0.0, "trace_sigma": float(np.trace(predicted)), "max_abs_z_mean": 0.0,
                   "kernel_relative_error": 0.0},
        labels={"max_abs_z": f"max |z| over the {z.size} entries of Σ", "trace_sigma": "tr Σ",
                "max_abs_z_mean": "max |z|, mean gradient vs closed-form ∇R",
                "kernel_relative_error": f"training kernel vs raw gradient ({kernel_prompts} prompts)"},
        rule=rule,
        details=[dict(entry=str(tuple(int(i) for i in (upper[0][worst], upper[1][worst]))),
                      measured=float(measured[upper][worst]), predicted=float(predicted[upper][worst]),
                      z=float(z[worst]), bound=float(thresholds[worst]), welch_df=float(dfs[worst]),
                      relative_se_of_prediction=float(np.trace(predicted_se) / np.trace(predicted)))])


@claim(
    "gd_beta.lna_matches_sgd_spread",
    reference=f"{PAPER}: SGD on GD-β (5.1) around its population path; docs/gd_beta.md §12 and docs/diffusion.md",
    statement="The linear-noise approximation C_{k+1} = A_k C_k A_kᵀ + (η_k²/B)Σ(θ̄_k) predicts the spread of "
              "minibatch SGD over seeds: the total parameter variance of real runs over its prediction is 1 "
              "within the seed-count interval, at each batch size and checkpoint.",
    quick=dict(beta_norm_H=2.0, batch_sizes=(128, 512), runs=64, steps=100, lr=0.05, n_contexts=8000),
    full=dict(beta_norm_H=2.0, batch_sizes=(128, 512, 2048), runs=128, steps=200, lr=0.05, n_contexts=32_000),
)
def lna_matches_sgd_spread(seed, beta_norm_H, batch_sizes, runs, steps, lr, n_contexts):
    problem = example_problem(beta_norm_H)
    pool_seed, *run_seeds = seed.spawn(1 + len(batch_sizes))
    pool = dyn.context_pool(problem, n_contexts, seed=pool_seed)
    record_every = max(1, steps // 20)
    results = []
    for B, run_seed in zip(batch_sizes, run_seeds):
        band = dyn.sgd_linear_noise(problem, B, steps, lr, pool, record_every=record_every)
        results.append((B, band, _sgd_paths(problem, B, steps, lr, run_seed, runs, record_every)))
    checkpoints = _checkpoints(results[0][1], steps)
    comparisons = len(batch_sizes) * len(checkpoints)
    # Each comparison spends half its share on the runs' sampling and half on the LNA's own Monte-Carlo error.
    alpha = DIFFUSION_FAMILY_RATE / comparisons
    rows = []
    for B, band, paths in results:
        traces, trace_ses = band.total_variance()
        for i in checkpoints:
            predicted = float(traces[i])
            relative_se = float(trace_ses[i] / predicted)
            measured = float(np.sum(paths[:, i].var(axis=0, ddof=1)))
            df = stats.satterthwaite_df(band.covariance[i], runs)
            low, high = stats.variance_ratio_interval(df, None, alpha / 2)
            low, high = stats.widen_for_prediction_error(low, high, relative_se, band.n_batches - 1, alpha / 2)
            ratio = measured / predicted
            rows.append(dict(batch_size=B, step=int(band.steps[i]), sgd_variance=measured, lna_variance=predicted,
                             ratio=ratio, interval_low=low, interval_high=high, satterthwaite_df=df,
                             lna_relative_se=relative_se, passed=bool(low <= ratio <= high)))

    def figure():
        fig, (ax, ax_ratio) = plots.figure(ncols=2, width=5.2, height=4.2)
        B, band, paths = results[0]
        deviation = paths[:, :, 0] - band.mean[:, 0]
        for run in deviation[:40]:
            ax.plot(band.steps, run, color="tab:gray", linewidth=0.4, alpha=0.6)
        ax.plot([], [], color="tab:gray", linewidth=0.6, label=f"SGD runs, B = {B} (40 of {runs})")
        sd = np.sqrt(band.covariance[:, 0, 0])
        ax.fill_between(band.steps, -2 * sd, 2 * sd, color="tab:blue", alpha=0.25, label="LNA band ± 2 sd")
        plots.theory_line(ax, band.steps, 2 * sd, label="LNA ± 2 sd", color="tab:blue")
        plots.theory_line(ax, band.steps, -2 * sd, label=None, color="tab:blue")
        plots.finish(ax, r"$\beta_{0,1}$ around the population GD path", "SGD step",
                     r"$\beta_{0,1} - \bar\beta_{0,1}$")
        plots.legend_below(ax, ncols=1)
        offsets = np.linspace(-0.02, 0.02, len(results)) * steps
        for (B, _, _), color, marker, offset in zip(results, ("tab:blue", "tab:orange", "tab:green"), "osD", offsets):
            mine = [r for r in rows if r["batch_size"] == B]
            plots.acceptance_intervals(ax_ratio, np.array([r["step"] for r in mine]) + offset,
                                       np.array([r["ratio"] for r in mine]),
                                       np.array([(r["interval_low"], r["interval_high"]) for r in mine]),
                                       color=color, marker=marker, label=f"B = {B}: SGD / LNA")
        ax_ratio.axhline(1.0, **plots.THEORY, label="LNA exact (ratio 1)")
        plots.finish(ax_ratio, "Total parameter variance: SGD over LNA", "SGD step", "variance ratio", logy=True)
        plots.legend_below(ax_ratio)
        return fig

    worst = max(rows, key=lambda r: abs(np.log(r["ratio"])))
    return Outcome(
        measured={f"ratio_b{r['batch_size']}_step{r['step']}": r["ratio"] for r in rows},
        predicted={f"ratio_b{r['batch_size']}_step{r['step']}": 1.0 for r in rows},
        labels={f"ratio_b{r['batch_size']}_step{r['step']}": f"Var SGD / Var LNA, B = {r['batch_size']}, step {r['step']}"
                for r in rows},
        rule=rules.within(
            [r["ratio"] for r in rows], [r["interval_low"] for r in rows], [r["interval_high"] for r in rows],
            what=f"Var SGD / Var LNA (two-sided χ²_ν/ν intervals at level {alpha:.1g} each; worst: B = "
                 f"{worst['batch_size']}, step {worst['step']}: {worst['ratio']:.3f} in "
                 f"[{worst['interval_low']:.3f}, {worst['interval_high']:.3f}])",
            basis=f"{runs} independent SGD runs: the sum of sample variances is tr C·χ²_ν/ν with Satterthwaite's ν "
                  f"from the LNA's eigenvalues; widened by the LNA's own Monte-Carlo error (Σ from {n_contexts} "
                  f"contexts in {results[0][1].n_batches} batches: Student t on the spread of the batch traces), half "
                  f"of each comparison's share to each; Bonferroni at family-wise rate {DIFFUSION_FAMILY_RATE:g} over "
                  f"{comparisons} comparisons", false_fail_rate=DIFFUSION_FAMILY_RATE),
        details=rows, figure=figure,
        notes="The LNA drops terms of relative order η·tr Σ/B; at B = 128 they show as a ratio slightly above 1 early "
              "in training, within the interval at this number of runs (docs/gd_beta.md §12).")


@claim(
    "gd_beta.gaussian_noise_proxy",
    reference=f"{PAPER}: SGD on GD-β (5.1); the 'population gradient + Gaussian noise' proxy; docs/gd_beta.md §12",
    statement="With the gradient-noise covariance Σ(θ) (estimated, docs/gd_beta.md §12), the Gaussian-noise proxy θ ← θ − η∇R(θ) + "
              "(η/√B)Σ(θ)^{1/2}ξ has the spread the LNA predicts at a small batch (its linearisation) once past the "
              "early transient (asserted at steps/2 and steps; at steps/4 the LNA's second-order error is reported), "
              "while real minibatch SGD is reported beside both: where the Gaussian description fails and by how much.",
    quick=dict(beta_norm_H=2.0, batch_size=32, runs=128, paths=64, steps=100, lr=0.05, n_contexts=2000),
    full=dict(beta_norm_H=2.0, batch_size=32, runs=512, paths=256, steps=200, lr=0.05, n_contexts=8000),
)
def gaussian_noise_proxy(seed, beta_norm_H, batch_size, runs, paths, steps, lr, n_contexts):
    problem = example_problem(beta_norm_H)
    pool_seed, proxy_seed, sgd_seed = seed.spawn(3)
    pool = dyn.context_pool(problem, n_contexts, seed=pool_seed)
    record_every = max(1, steps // 20)
    band = dyn.sgd_linear_noise(problem, batch_size, steps, lr, pool, record_every=record_every)
    proxy = dyn.sgd_gaussian_noise_paths(problem, batch_size, steps, lr, pool, n_paths=paths, seed=proxy_seed,
                                         record_every=record_every)
    sgd = _sgd_paths(problem, batch_size, steps, lr, sgd_seed, runs, record_every)
    checkpoints = _checkpoints(band, steps)
    # The first checkpoint (steps/4) is reported, not asserted: there the LNA's second-order error, from the drift's
    # nonlinearity, is +3.4% ± 0.7% of the spread over 200 pools (docs/gd_beta.md §12), 0.4 of this test's sd.
    asserted = checkpoints[1:]
    alpha = DIFFUSION_FAMILY_RATE / len(asserted)
    traces, trace_ses = band.total_variance()
    rows = []
    for i in checkpoints:
        predicted = float(traces[i])
        relative_se = float(trace_ses[i] / predicted)
        proxy_variance = float(np.sum(proxy[:, i].var(axis=0, ddof=1)))
        sgd_variance = float(np.sum(sgd[:, i].var(axis=0, ddof=1)))
        df_proxy = stats.satterthwaite_df(band.covariance[i], paths)
        df_sgd = stats.satterthwaite_df(band.covariance[i], runs)
        # The proxy and the LNA use the same Σ estimate, so to first order only the proxy's sampling enters its
        # interval; real SGD sees the true Σ, so its interval is widened for the estimate's error.
        low, high = stats.variance_ratio_interval(df_proxy, None, alpha)
        sgd_low, sgd_high = stats.widen_for_prediction_error(*stats.variance_ratio_interval(df_sgd, None, alpha / 2),
                                                             relative_se, band.n_batches - 1, alpha / 2)
        f_low, f_high = stats.widen_for_prediction_error(*stats.variance_ratio_interval(df_sgd, df_proxy, alpha / 2),
                                                         relative_se, band.n_batches - 1, alpha / 2)
        rows.append(dict(step=int(band.steps[i]), lna_variance=predicted, proxy_variance=proxy_variance,
                         sgd_variance=sgd_variance, proxy_over_lna=proxy_variance / predicted,
                         interval_low=low, interval_high=high, sgd_over_lna=sgd_variance / predicted,
                         sgd_interval=(sgd_low, sgd_high),
                         sgd_over_proxy=sgd_variance / proxy_variance, f_interval=(f_low, f_high),
                         asserted=i in asserted, passed=bool(low <= proxy_variance / predicted <= high)))
    for row in rows:
        row["sgd_outside_lna_interval"] = not (row["sgd_interval"][0] <= row["sgd_over_lna"] <= row["sgd_interval"][1])
        row["sgd_outside_proxy_interval"] = not (row["f_interval"][0] <= row["sgd_over_proxy"] <= row["f_interval"][1])

    def figure():
        fig, ax = plots.figure(width=6.4, height=4.2)
        x = np.array([r["step"] for r in rows], float)
        dx = 0.015 * steps
        for key, interval, label, color, marker, shift in (
                ("proxy_over_lna", lambda r: (r["interval_low"], r["interval_high"]), "Gaussian-noise proxy / LNA",
                 "tab:blue", "o", -dx),
                ("sgd_over_lna", lambda r: r["sgd_interval"], "minibatch SGD / LNA", "tab:red", "s", dx)):
            bounds = np.array([interval(r) for r in rows])
            plots.acceptance_intervals(ax, x + shift, np.array([r[key] for r in rows]), bounds, color=color,
                                       marker=marker, label=label)
        ax.axhline(1.0, **plots.THEORY, label="LNA (ratio 1)")
        first_asserted = min(r["step"] for r in rows if r["asserted"])
        ax.axvspan(0, 0.5 * (x[0] + first_asserted), color="0.92", zorder=0,
                   label="early transient: proxy / LNA reported, not asserted")
        ax.set_xlim(0, 1.05 * steps)
        plots.finish(ax, f"Spread at B = {batch_size}, η = {lr:g}: total parameter variance over the LNA's",
                     "SGD step", "variance ratio", logy=True)
        plots.legend_below(ax)
        return fig

    first = rows[0]
    return Outcome(
        measured={**{f"proxy_over_lna_step{r['step']}": r["proxy_over_lna"] for r in rows},
                  **{f"sgd_over_lna_step{r['step']}": r["sgd_over_lna"] for r in rows}},
        predicted={f"proxy_over_lna_step{r['step']}": 1.0 for r in rows},
        labels={**{f"proxy_over_lna_step{r['step']}": f"Var proxy / Var LNA, step {r['step']}"
                   + ("" if r["asserted"] else " (reported: the LNA's early second-order error)") for r in rows},
                **{f"sgd_over_lna_step{r['step']}": f"Var SGD / Var LNA, step {r['step']} (reported)" for r in rows}},
        rule=rules.within(
            [r["proxy_over_lna"] for r in rows if r["asserted"]], [r["interval_low"] for r in rows if r["asserted"]],
            [r["interval_high"] for r in rows if r["asserted"]],
            what=f"Var proxy / Var LNA at steps {', '.join(str(r['step']) for r in rows if r['asserted'])} "
                 f"(two-sided χ²_ν/ν intervals at level {alpha:.1g} each; step {first['step']} and SGD are reported "
                 "with their own intervals, not asserted)",
            basis=f"{paths} proxy paths and {runs} SGD runs; Satterthwaite's ν from the LNA's eigenvalues; Bonferroni "
                  f"at family-wise rate {DIFFUSION_FAMILY_RATE:g} over {len(asserted)} checkpoints",
            false_fail_rate=DIFFUSION_FAMILY_RATE),
        details=rows, figure=figure,
        notes=f"At step {first['step']} the proxy's spread is {first['proxy_over_lna']:.2f}× the LNA's (reported: the "
              "LNA drops terms of relative order η·tr Σ/B, measured at +3.4% here on average). "
              f"Real SGD spreads {first['sgd_over_lna']:.2f}× the LNA variance "
              f"({'outside' if first['sgd_outside_lna_interval'] else 'inside'} its interval "
              f"[{first['sgd_interval'][0]:.2f}, {first['sgd_interval'][1]:.2f}]), the Gaussian proxy "
              f"{first['proxy_over_lna']:.2f}×: Gaussian noise of the same covariance "
              f"{'misses' if first['sgd_outside_proxy_interval'] else 'does not miss'} what the heavy-tailed "
              "minibatch noise does to the early, non-convex part of the path (docs/gd_beta.md §12).")


SYSTEM = System(
    key="gd_beta",
    title="LSA vs the Linear Transformer Block: one step of GD with a learnable initialisation (GD-β)",
    reference=PAPER,
    problem=GDBetaProblem,
    population=dyn.population,
    minibatch=dyn.minibatch,
    summary=summary,
    summary_options=(
        Parameter("bayes_contexts", "integer", 20_000, "Monte-Carlo contexts for the Bayes risk", minimum=2,
                  maximum=100_000_000),
    ),
    docs="docs/gd_beta.md",
    population_time="flow time t",
    minibatch_time="training step",
    population_figure=population_figure,
    labels=LABELS,
    compare=compare,
)
