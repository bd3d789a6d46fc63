"""The boundary of the public functions: each input that once failed deep inside (a TypeError, an IndexError, a
hang, a silent NaN) is now a ValueError naming the parameter, raised before any work."""
import numpy as np
import pytest

from attnflow.closed_forms import attention_svm as svm_cf
from attnflow.closed_forms import ccmc as ccmc_cf
from attnflow.closed_forms import gd_beta as gd_cf
from attnflow.closed_forms import group_sparse as gs_cf
from attnflow.closed_forms import linear_attention_h3 as h3_cf
from attnflow.closed_forms import next_token_scc as ntp_cf
from attnflow.closed_forms import one_nn as nn_cf
from attnflow.closed_forms import random_walk as rw_cf
from attnflow.closed_forms import scb as scb_cf
from attnflow.dynamics import attention_svm as svm_dyn
from attnflow.dynamics import ccmc as ccmc_dyn
from attnflow.dynamics import gd_beta as gd_dyn
from attnflow.dynamics import group_sparse as gs_dyn
from attnflow.dynamics import linear_attention_h3 as h3_dyn
from attnflow.dynamics import montecarlo
from attnflow.dynamics import next_token_scc as ntp_dyn
from attnflow.dynamics import one_nn as nn_dyn
from attnflow.dynamics import random_walk as rw_dyn
from attnflow.dynamics import scb as scb_dyn

GD = gd_cf.GDBetaProblem.random(3, 5, seed=0)
SCB = scb_cf.SCBProblem.random(8, 16, 3, seed=0)
H3 = h3_cf.H3Problem(H=np.eye(3), Psi=np.eye(3), sigma2=0.25, n=8)
NTP = ntp_cf.NTPProblem.paper(seed=0)
NAN, INF = float("nan"), float("inf")

CASES = {
    "bayes_risk, fractional contexts": (lambda: gd_dyn.bayes_risk(GD, 2.5, seed=0), "n_contexts must be an integer"),
    "bayes_risk, 1e13 contexts": (lambda: gd_dyn.bayes_risk(GD, 10**13, seed=0), "n_contexts must be <= 1e+07"),
    "gd_beta training, 1e300 steps": (lambda: gd_dyn.minibatch(GD, seed=0, steps=1e300), "steps must be <= "),
    "h3 training, 1e300 steps": (lambda: h3_dyn.minibatch(H3, seed=0, steps=1e300), "steps must be <= "),
    "scb gradients, 1e13 samples": (lambda: scb_dyn.minibatch_gradients(SCB, *SCB.initial_point(), 10**13, seed=0),
                                    "batch must be <= "),
    "monte-carlo mean, fractional n": (lambda: montecarlo.monte_carlo_mean(lambda r, m: r.random(m), 2.5, seed=0),
                                       "n must be an integer"),
    "one_nn, NaN records": (lambda: nn_dyn.population(nn_cf.OneNNProblem(3, 2, 5.0), n_records=NAN),
                            "n_records must be finite"),
    "one_nn, 1e300 steps": (lambda: nn_dyn.population(nn_cf.OneNNProblem(3, 2, 5.0), steps=1e300),
                            "steps must be <= "),
    "random_walk, inf records": (lambda: rw_dyn.population(rw_cf.RandomWalkProblem.from_params({}), n_records=INF),
                                 "n_records must be finite"),
    "group_sparse, text records": (lambda: gs_dyn.population(gs_cf.GroupSparseProblem.standard(4, 6), n_records="x"),
                                   "n_records must be an integer"),
    "group_sparse, NaN flag": (lambda: gs_dyn.minibatch(gs_cf.GroupSparseProblem.standard(4, 6), seed=0,
                                                        position_only=NAN), "position_only must be true or false"),
    "ccmc, 1e9 records": (lambda: ccmc_dyn.population(ccmc_cf.CCMCProblem.from_params({}), n_records=10**9),
                          "n_records must be <= "),
    "random_walk direction, K = 0": (lambda: rw_cf.claim3_direction(0, 0.7), "K must be >= 3"),
    "random_walk direction, NaN p": (lambda: rw_cf.claim3_direction(6, NAN), "p must be finite"),
    "correlation with zero": (lambda: svm_cf.corr(np.zeros(3), np.ones(3)), "correlation of a zero array"),
    "correlation with NaN": (lambda: ntp_cf.corr([NAN, 1.0], [1.0, 1.0]), "A must be finite"),
    "radius along a zero SVM": (lambda: ntp_cf.fit_radius(np.ones((2, 2)), np.zeros((2, 2)), np.zeros((2, 2))),
                                "W_svm is zero"),
    "next-token loss at 1e300": (lambda: ntp_cf.loss_and_gradient(NTP, 1e300 * np.ones((NTP.d, NTP.d))),
                                 "W has entries of size"),
    "two-token offset, NaN C": (lambda: svm_cf.two_token_offset(NAN, "logistic"), "C must be finite"),
    "two-token offset, negative C": (lambda: svm_cf.two_token_offset(-1.0, "logistic"), "C must be > 0"),
    "scb line point, NaN": (lambda: scb_cf.line_point(SCB, NAN, 0.0), "alpha_V must be finite"),
    "scb reduced risk, inf": (lambda: scb_cf.reduced_risk(SCB, INF, 0.0), "alpha_V must be finite"),
    "scb rounding, NaN": (lambda: scb_dyn.round_columns(np.full((3, 3), NAN), 0.1), "Q must be finite"),
    "h3 effective sample size, NaN risk": (lambda: h3_cf.isotropic_effective_sample_size(3, 0.25, NAN),
                                           "risk must be finite"),
    "h3 PGD risk, 1e300": (lambda: h3_cf.pgd_risk(H3, 1e300 * np.eye(H3.d)), "W has entries of size"),
    "h3 problem, 1e300 covariance": (lambda: h3_cf.H3Problem(H=1e300 * np.eye(3), Psi=np.eye(3), sigma2=0.25, n=8), "H has entries of size"),
    "h3 attention, NaN prompt": (lambda: h3_dyn.attention_forward(np.full((1, 4, 4), NAN), np.eye(4), np.eye(4),
                                                                  np.ones(4)), "Z must be finite"),
    "ccmc centring, inf": (lambda: ccmc_cf.centred_logits([[INF, 0.0], [0.0, 0.0]]), "Theta must be finite"),
    "ccmc softmax, NaN": (lambda: ccmc_cf.chain_from_logits([[NAN, 0.0], [0.0, 0.0]]), "Theta must be finite"),
    "attention_svm run, eta 1e300": (lambda: svm_dyn.minibatch(svm_cf.AttentionSVMProblem.single_global(), seed=0,
                                                                eta=1e300), "eta must be <= 1e"),
    "attention_svm run from zero": (lambda: svm_dyn.minibatch(svm_cf.AttentionSVMProblem.single_global(), seed=0,
                                                               init_scale=0.0), "init_scale must be > 0"),
    "next-token run, eta 1e300": (lambda: ntp_dyn.minibatch(NTP, seed=0, eta=1e300), "eta must be <= 1e"),
    "next-token run from zero": (lambda: ntp_dyn.minibatch(NTP, seed=0, init_scale=0.0), "init_scale must be > 0"),
    "gd_beta prediction, NaN": (lambda: gd_cf.gd_beta_predict(np.full((5, 3), NAN), np.ones(5), np.ones(3),
                                                              np.zeros(3), np.eye(3)), "X must be finite"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_a_value_error_naming_the_parameter(name):
    call, message = CASES[name]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        call()
