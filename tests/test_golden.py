"""Golden theorem constants for three fixed configurations (pytest-regressions): a change in any of them
fails CI. Regenerate deliberately with ``pytest tests/test_golden.py --force-regen`` and say why in the commit.

The first configuration's R*, Γ*, GD-0 and LSA values are also checked against the spec's independent
numbers in test_gd_beta_closed_forms.py; these files guard the rest (rates, anisotropic cases)."""
import numpy as np
import pytest

import closed_forms.gd_beta as cf
from closed_forms.gd_beta import GDBetaProblem
from validation.gd_beta import COROLLARY_H, COROLLARY_PSI, example_problem

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
