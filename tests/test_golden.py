"""Golden theorem constants for three fixed configurations (pytest-regressions): a change in any of them
fails CI. Regenerate deliberately with ``pytest tests/test_golden.py --force-regen`` and say why in the commit.

The first configuration's R*, Γ*, GD-0 and LSA values are also checked against the independent reference
numbers of docs/gd_beta.md §6 in test_gd_beta_closed_forms.py; these files guard the rest (rates, anisotropic
cases)."""
import numpy as np
import pytest

import attnflow.closed_forms.gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem
from attnflow.validation.gd_beta import COROLLARY_H, COROLLARY_PSI, example_problem

CONFIGURATIONS = {
    "isotropic_d2_N10": lambda: GDBetaProblem.isotropic(d=2, N=10, sigma2=0.25, beta_norm=1.0),
    "spec_example_beta2_N10": lambda: example_problem(2.0, N=10),
    "corollary_N20": lambda: GDBetaProblem(H=COROLLARY_H, Psi=COROLLARY_PSI, beta_star=np.full(4, 0.5), sigma2=1.0, N=20),
}


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_golden_constants(name, num_regression):
    problem = CONFIGURATIONS[name]()
    R_star = cf.optimal_risk(problem)
    lsa = cf.optimal_attention_risk(problem, mlp=False).risk
    rates = cf.local_rates(problem)
    constants = {
        "R_star": R_star,
        "gd0_risk": cf.gd0_optimal_risk(problem),
        "lsa_gap": lsa - R_star,
        "rate_beta": rates.beta,
        "rate_gamma": rates.gamma_mode,
        "ratio_limit": cf.large_context_ratio_limit(problem),
    }
    constants.update({f"Gamma_star_{i}{j}": g for (i, j), g in np.ndenumerate(cf.optimal_gamma(problem))})
    # Closed forms are exact to round-off; the LSA optimum comes from BFGS at gtol 1e-12.
    num_regression.check({k: np.array([v]) for k, v in constants.items()},
                         default_tolerance=dict(rtol=1e-9, atol=1e-12))


ONE_NN_POINTS = {"d4_N16": (4, 16), "d2_N8": (2, 8), "d8_N4": (8, 4)}


@pytest.mark.parametrize("name", ONE_NN_POINTS)
def test_one_nn_golden_constants(name, num_regression):
    """1-NN: the quadrature (Richardson-extrapolated, rtol 1e-6) at fixed points and the asymptotic constant."""
    import math
    import warnings

    from attnflow.closed_forms import one_nn

    d, N = ONE_NN_POINTS[name]
    problem = one_nn.OneNNProblem(d, N)
    constants = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for xi1, xi2 in ((3.0, 4.0), (12.0, 10.0)):
            r = one_nn.reduced_loss(problem, xi1, xi2, rtol=1e-6)
            constants.update({f"L_{xi1:g}_{xi2:g}": r.loss, f"dxi1_{xi1:g}_{xi2:g}": r.d_xi1,
                              f"dxi2_{xi1:g}_{xi2:g}": r.d_xi2})
    constants["L_0_inf"] = one_nn.reduced_loss_on_grid(problem, 0.0, math.inf)[0]
    if d >= 3:
        constants["C"] = one_nn.asymptotic_loss_constant(d, N)
    num_regression.check({k: np.array([v]) for k, v in constants.items()}, default_tolerance=dict(rtol=1e-7, atol=1e-12))


RANDOM_WALK_POINTS = {"K6_N13_p07": (6, 13, 0.7), "K6_N13_p05": (6, 13, 0.5), "K5_N11_p03": (5, 11, 0.3)}


@pytest.mark.parametrize("name", RANDOM_WALK_POINTS)
def test_random_walk_golden_constants(name, num_regression):
    """Random walk: v⁽¹⁾, the exact reduced state after 50 steps (exact enumeration), the √-law plateau."""
    from attnflow.closed_forms import random_walk
    from attnflow.dynamics import random_walk as dyn

    K, N, p = RANDOM_WALK_POINTS[name]
    problem = random_walk.RandomWalkProblem(K=K, N=N, p=p)
    run = dyn.reduced_trajectory(problem, random_walk.enumerate_paths(problem), 50, n_records=3)
    constants = {f"v1_{c}": value for c, value in enumerate(random_walk.step_one_v(problem))}
    constants.update({f"v50_{c}": value for c, value in enumerate(run.states["v"][-1])})
    constants.update(loss50=run.metrics["loss"][-1], plateau=random_walk.direction_plateau(p))
    num_regression.check({k: np.array([v]) for k, v in constants.items()}, default_tolerance=dict(rtol=1e-9, atol=1e-12))


def test_group_sparse_golden_constants(num_regression):
    """Group sparse: the position-only quadrature at the docs/group_sparse.md §6 points and the asymptotic constant."""
    from attnflow.closed_forms import group_sparse

    problem = group_sparse.GroupSparseProblem.standard(4, 6)
    constants = {"c": group_sparse.asymptotic_loss_constant()}
    for beta, alpha in ((0.3, 0.0), (1.0, 1.0), (2.0, 3.0), (4.0, 6.0)):
        for name, value in zip(("L", "dbeta", "dalpha"), group_sparse.position_only_terms(problem, beta, alpha)):
            constants[f"{name}_{beta:g}_{alpha:g}"] = value
    num_regression.check({k: np.array([v]) for k, v in constants.items()}, default_tolerance=dict(rtol=1e-9, atol=1e-12))


@pytest.mark.parametrize("name, args", [("N5_T8_Q2", (5, 8, 2)), ("N20_T64_Q4", (20, 64, 4))])
def test_scb_golden_constants(name, args, num_regression):
    """SCB: K_P, K_Q, R*, R₀, the predicted Stage-1 duration and slow-mode rate for fixed seeded instances."""
    from attnflow.closed_forms import scb

    problem = scb.SCBProblem.random(*args, seed=0)
    duration = scb.stage1_duration(problem, 0.25, 0.1)
    constants = dict(K_P=problem.K_P, K_Q=problem.K_Q, kappa=problem.kappa, R_star=problem.bayes_risk,
                     R_0=problem.initial_risk, tau1=duration["tau"], t1_steps=duration["steps"],
                     slow_rate=scb.slow_mode_rate(problem))
    num_regression.check({k: np.array([v]) for k, v in constants.items()}, default_tolerance=dict(rtol=1e-10, atol=1e-14))
