"""The domain of every public function of closed_forms, one :class:`Domain` each (closed_forms/domain_table.py says
how an entry reads); tests/test_domains.py checks each function inside and outside it.

A Problem comes from ``Problem.PARAMETERS`` (the records ``attnflow solve --param`` reads), drawn no larger than
:data:`PROBLEMS` says so that each call is cheap; arrays named alike across a system's functions are in
:data:`ARRAYS`. Adding a function is one line: ``domain(module.function, integer("r", 0, 64))``.
"""
from __future__ import annotations

import numpy as np

from attnflow.closed_forms import attention_svm as svm
from attnflow.closed_forms import ccmc, certificates, checks, gd_beta, group_sparse, lapack, linalg, linear_icl, max_margin
from attnflow.closed_forms import linear_attention_h3 as h3
from attnflow.closed_forms import next_token_scc as ntp
from attnflow.closed_forms import one_nn, parameters, random_walk, scb, softmax, symbolic
from attnflow.closed_forms.domain_table import Array, choice, domain, flag, integer, real

__all__ = ["PROBLEMS", "ARRAYS", "REFUSALS", "DOMAINS", "psd", "stochastic", "problem_only"]

# system -> (Problem class, largest value drawn of each of its parameters — or the (low, high) range, or the choices
# drawn — : the cost of a call, not its domain). An acyclic "mixed" next-token instance (every sequence ends in one
# token) or a cyclic one among few small sequences is found in few draws if ever: NTPProblem.random gives up after
# MAX_TRIES draws (~100 s), so the tests draw require = any.
PROBLEMS = {
    "gd_beta": (gd_beta.GDBetaProblem, {"d": 4, "N": 40, "sigma2": 4.0, "beta_norm": 4.0}),
    "scb": (scb.SCBProblem, {"N": 6, "T": 10, "sparsity": 3, "C": 8.0, "instance_seed": 1000}),
    "one_nn": (one_nn.OneNNProblem, {"d": 6, "N": 40, "sigma": 40.0}),
    "random_walk": (random_walk.RandomWalkProblem, {"K": 8, "N": 9, "M": 40, "eps": 2.0, "eta": 4.0}),
    "group_sparse": (group_sparse.GroupSparseProblem, {"d": 5, "D": 6, "j_star": 6, "sigma_x": 4.0}),
    "attention_svm": (svm.AttentionSVMProblem, {"n": 5, "T": 5, "d": 4, "instance_seed": 1000, "C": 10.0}),
    "next_token_scc": (ntp.NTPProblem, {"n": 6, "T": 4, "K": 5, "d": 6, "instance_seed": 1000,
                                        "require": ("any",)}),
    "linear_attention_h3": (h3.H3Problem, {"d": 4, "n": 30, "sigma2": 4.0, "rho2": 2.0}),
    "ccmc": (ccmc.CCMCProblem, {"L": (2, 6)}),
}


# Named refusals of a drawn instance that its Problem's per-parameter bounds cannot express (documented ValueErrors).
REFUSALS = {
    "attention_svm": ("the optimal token is not unique", "training needs the", "needs the cross-attention model",
                      "needs a cross-attention problem"),
    "linear_attention_h3": ("design must be rag or tfa", "design must be iid for", "must be absent for"),
}


def psd(entries: np.ndarray, problem=None) -> np.ndarray:
    """A symmetric positive semi-definite matrix from square ``entries``: E Eᵀ / size."""
    return entries @ entries.T / entries.shape[0]


def stochastic(entries: np.ndarray, problem=None) -> np.ndarray:
    """A row-stochastic matrix with positive entries from ``entries`` (row softmax)."""
    weights = np.exp(entries - entries.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def problem_only(*functions) -> list:
    """Entries for functions that take a problem and nothing else."""
    return [domain(function) for function in functions]


def _d(problem) -> int:
    return problem.d


def _K(problem) -> int:
    return problem.P.shape[0]


# Arrays named alike across a system's functions: their valid shape at a problem.
ARRAYS = {
    "gd_beta": {"beta0": Array(lambda p: (p.d,)), "Gamma": Array(lambda p: (p.d, p.d), scale=0.2),
                "X": Array(lambda p: (p.N, p.d)), "y": Array(lambda p: (p.N,)), "x_query": Array(lambda p: (p.d,)),
                "a": Array(lambda p: (p.d,)), "beta0_init": Array(lambda p: (p.d,)),
                "Gamma_init": Array(lambda p: (p.d, p.d), scale=0.2)},
    "scb": {"V": Array(lambda p: (p.N, p.N)), "Q": Array(lambda p: (p.T, p.N), make=lambda z, p: stochastic(z.T).T),
            "A": Array(lambda p: (p.T, p.N)), "B": Array(lambda p: (p.T, p.N)),
            "P_tilde": Array(lambda p: (p.N, p.N), make=lambda z, p: p.P)},
    "random_walk": {"v": Array(lambda p: (p.K,), make=lambda z, p: np.abs(z)), "z": Array(lambda p: (p.N,))},
    "group_sparse": {"v": Array(lambda p: (p.d + p.D,)), "W": Array(lambda p: (p.d + p.D, p.d + p.D))},
    "attention_svm": {"theta": Array(lambda p: p.theta_shape())},
    "next_token_scc": {"W": Array(lambda p: (p.d, p.d))},
    "linear_attention_h3": {"W": Array(lambda p: (p.d, p.d), scale=0.2), "W0": Array(lambda p: (p.d, p.d), scale=0.2),
                            "omega": Array(lambda p: (p.n,), make=lambda z, p: np.abs(z) / p.n)},
    "ccmc": {"P": Array(lambda p: (_K(p), _K(p)), make=lambda z, p: stochastic(z)),
             "Theta": Array(lambda p: (_K(p), _K(p))), "f": Array(lambda p: (_K(p),), make=lambda z, p: stochastic(z))},
}


# ---- builders of structured arguments ----------------------------------------------------------------------------

def _prompts(problem, rng, n=12):
    K = _K(problem)
    prompts = rng.integers(0, K, size=(n, problem.L))
    return {"prompts": prompts, "y": prompts[:, 0].copy(), "K": K}  # y must be a key of its prompt


def _ccmc_fisher(problem, rng):
    prompts = ccmc.all_prompts(_K(problem), 2)
    return {"prompts": prompts, "F": ccmc.fisher_information(problem.P, prompts)}


def _paths(problem, rng):
    return {"paths": random_walk.enumerate_paths(problem)}


def _selection(problem, rng):
    theta = rng.standard_normal(problem.theta_shape())
    logits = svm.logits(problem, theta)
    log_s = logits - logits.max(axis=1, keepdims=True)
    log_s -= np.log(np.exp(log_s).sum(axis=1, keepdims=True))
    return {"selected": [[int(t)] for t in rng.integers(0, problem.T, size=problem.n)], "log_s": log_s}


def _ldp(problem, rng, m=4, P=3):
    G = rng.standard_normal((m, P))
    return {"G": G, "h": np.ones(m), "A": rng.standard_normal((1, P)), "P": P}


def _nuclear(problem, rng):
    G = rng.standard_normal((4, 4))
    feasible, x, lam = max_margin.ldp(G, np.ones(4))
    return {"G": G, "shape": (2, 2), "start": x if feasible else np.ones(4), "start_lam": lam if feasible else np.ones(4)}


def _h3_weights(problem, rng):
    m = 3
    return {"Wq": rng.standard_normal((4, m)), "Wk": rng.standard_normal((4, m)), "Wv": rng.standard_normal((4, m)),
            "v": rng.standard_normal(4), "f": rng.standard_normal(6)}


def _scb_noise(problem, rng):
    V, Q = problem.initial_point()
    n = 8
    return {"tokens": rng.integers(0, problem.N, size=(n, problem.T)), "last": rng.integers(0, problem.N, size=n),
            "V": V, "Q": Q}


def _equilibrium(problem, rng):
    """A chain and an equilibrium of its fluid limit (§6.5): on the support {0, 1} where equilibrium_on_support finds
    one, else the vertex e_0 (a single token is always an equilibrium)."""
    P = stochastic(rng.standard_normal((_K(problem), _K(problem))))
    try:
        return {"P": P, "f": ccmc.equilibrium_on_support(P, np.array([0, 1]))}
    except ValueError:
        return {"P": P, "f": np.eye(_K(problem))[0]}


def _kernel_args(params, n):
    """x (n,), params and an out array: the calling convention of an integrator's right-hand side."""
    return lambda problem, rng: {"k": 0, "t": 0.0, "tau": 0.0, "x": 0.1 * np.ones(n), "y": 0.1 * np.ones(n),
                                 "f": np.full(n, 1.0 / n), "params": params(), "out": np.empty(n)}


def _lapack(problem, rng):
    A = np.eye(3) + 0.1 * rng.standard_normal((3, 3))
    return {"address": lapack.DGESV, "A": A, "b": rng.standard_normal(3), "a_work": np.empty(9),
            "ipiv": np.empty(3, dtype=np.int32), "x": np.empty(3)}


def _gd_flow(problem, rng):
    return {"y": gd_beta.flow_state(np.zeros(2), np.zeros((2, 2)))}


# ---- the table ---------------------------------------------------------------------------------------------------

_ALPHA = {"alpha": Array((6,))}
_GD_PROBLEM = gd_beta.GDBetaProblem.isotropic(2)
_H3_PROBLEM = h3.H3Problem.from_params({"d": 2})
_GS_PROBLEM = group_sparse.GroupSparseProblem.standard(3, 4)
_SCB_PROBLEM = scb.SCBProblem.from_params({})
_NN_PROBLEM = one_nn.OneNNProblem.from_params({})

DOMAINS = [
    domain(certificates.check_cut, real("cut", 0.0, 0.5, strict=True), system=None, fixed={"name": "cut"}),
    domain(certificates.rank_decision, real("cut", 0.0, 0.5, strict=True), real("round_off", 0.0), system=None,
           arrays={"values": Array((5,), strict_shape=False)}),
    # attention_svm (docs/attention_svm.md)
    *problem_only(svm.constraint_rows, svm.frobenius_svm, svm.offset_prediction, svm.value_svm, svm.relaxed_svm,
                  svm.kernel_labels),
    domain(svm.nuclear_svm, raises=(svm.UncertifiedSolution,)),
    domain(svm.svm, choice("norm", ("fro", "nuc")), raises=(svm.UncertifiedSolution,)),
    domain(svm.certified_svm, choice("norm", ("fro", "nuc")), raises=(svm.UncertifiedSolution,)),
    domain(svm.support_tokens, choice("norm", ("fro", "nuc")), raises=(svm.UncertifiedSolution,)),
    domain(svm.is_locally_optimal, choice("norm", ("fro", "nuc")), raises=(svm.UncertifiedSolution,)),
    domain(svm.rank, real("relative", 0.0, 0.5, strict=True), real("accuracy", 0.0), system=None,
           arrays={"W": Array((3, 4), strict_shape=False)}, raises=(svm.UncertifiedSolution,)),
    domain(svm.log_abs_loss_derivative, choice("loss", svm.LOSSES), system=None,
           arrays={"u": Array((5,), scale=30.0, strict_shape=False)}),
    domain(svm.two_token_offset, real("C", 0.0, strict=True), choice("loss", svm.LOSSES), system=None,
           draws={"C": 50.0}),
    domain(svm.single_input_svm, integer("alpha", 0, 1), system=None),
    domain(svm.selection_rows, build=_selection),
    domain(svm.selection_svm, build=_selection),
    domain(svm.selection_offset, build=_selection),
    domain(svm.corr, system=None, arrays={"A": Array((3, 2), strict_shape=False), "B": Array((3, 2))}),
    domain(svm.logits),
    domain(svm.loss_and_gradient, limits=True), domain(svm.log_gradient_norm, limits=True),
    # the default instance, whose optimal tokens are unique: the SVM solved in the build has no refusal to give
    domain(svm.measured_offset, raises=(svm.UncertifiedSolution,), refusals=("the SVM is infeasible",),
           given={spec.name: spec.default for spec in svm.AttentionSVMProblem.PARAMETERS}, build=lambda problem, rng: {"solution": svm.svm(problem)}),
    domain(svm.log_scaled_logit_gradient, system=None, checked_by="attention_svm.loss_and_gradient",
           build=lambda problem, rng: {"logit": rng.standard_normal((3, 4)), "a": rng.standard_normal((3, 4)),
                                       "Y": np.array([1.0, -1.0, 1.0]), "loss_code": 0}),
    # ccmc (docs/ccmc.md)
    domain(ccmc.check_chain),
    domain(ccmc.check_prompts, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.centred_logits, arrays={"Theta": Array((3, 4), strict_shape=False)}),
    domain(ccmc.chain_from_logits, arrays={"Theta": Array((3, 4), strict_shape=False)}),
    domain(ccmc.key_counts, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.ccmc_law, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.positional_law, system=None,
           arrays={"base_logits_row": Array((4,), strict_shape=False), "log_position_weights": Array((5,))},
           build=lambda problem, rng: {"tokens": rng.integers(0, 4, size=5)}),
    domain(ccmc.nll_theta, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.nll_gradient_theta, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.nll_and_gradient_kernel, system=None, checked_by="ccmc.nll_theta",
           build=lambda problem, rng: {"Theta": ccmc.read_only_copy(np.zeros((3, 3))),
                                       "counts": np.ones((4, 3), dtype=np.int64),
                                       "last": np.array([0, 1, 2, 0]), "y": np.array([1, 2, 0, 0]),
                                       "weights": ccmc.read_only_copy(np.ones(4))}),
    domain(ccmc.read_only_copy, system=None, checked_by="ccmc.nll_theta", arrays={"values": Array((3,))}),
    domain(ccmc.all_prompts, integer("K", 1), integer("L", 1), system=None, draws={"K": 4, "L": 3},
           refusals=("exceed the enumeration limit",)),
    domain(ccmc.fisher_information, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.fisher_rank, build=_ccmc_fisher),
    domain(ccmc.fisher_rank_decision, real("relative_tolerance", 0.0, 0.5, strict=True), build=_ccmc_fisher),
    domain(ccmc.predicted_fisher_rank, choice("query", ("self", "exclude")), build=_prompts),
    domain(ccmc.jacobians),
    domain(ccmc.asymptotic_constants, build=_ccmc_fisher),
    domain(ccmc.uniform_chain_constant, integer("K", 2, ccmc.MAX_UNIFORM_K), integer("L", 1), system=None,
           draws={"K": 20, "L": 20}),
    domain(ccmc.polya_share_moments, integer("t", 0), system=None,
           build=lambda problem, rng: {"initial_counts": rng.integers(1, 5, size=4).astype(float)}),
    domain(ccmc.rank_one_chain, system=None,
           arrays={"v": Array((4,), make=lambda z, p: np.abs(z) + 0.1, strict_shape=False)}),
    domain(ccmc.diagonal_dominant_chain, integer("K", 2, ccmc.MAX_CHAIN_K), real("diagonal", 0.0, 1.0, strict=True),
           system=None, draws={"K": 20}),
    domain(ccmc.fitness_exponents, system=None,
           arrays={"v": Array((4,), make=lambda z, p: np.abs(z) + 0.1, strict_shape=False)},
           build=lambda problem, rng: {"support": np.array([0, 2, 3])}),
    domain(ccmc.diagonal_loser_exponents, integer("winner", 0, 3)),
    domain(ccmc.stationary_law_of_q), domain(ccmc.invasion_rates), domain(ccmc.pack_fluid_params),
    domain(ccmc.equilibrium_on_support, build=lambda problem, rng: {"support": np.array([0, 1])},
           refusals=("no equilibrium with support",)),
    domain(ccmc.is_transversally_stable, build=_equilibrium, raises=(ccmc.UncertifiedSolution,)),
    domain(ccmc.transversal_stability, real("tolerance", 0.0), build=_equilibrium),
    domain(ccmc.tangent_eigenvalues, real("step", 0.0, 0.5, strict=True), build=_equilibrium, draws={"step": 1e-4},
           refusals=("must be below the smallest share",)),
    domain(ccmc.fluid_rhs_into, system=None, checked_by="dynamics.ccmc.fluid_trajectory",
           build=_kernel_args(lambda: ccmc.pack_fluid_params(stochastic(np.eye(3))), 3)),
    domain(ccmc.fluid_rhs, system=None, checked_by="dynamics.ccmc.fluid_trajectory",
           build=_kernel_args(lambda: ccmc.pack_fluid_params(stochastic(np.eye(3))), 3)),
    # checks (the boundary checks themselves)
    domain(checks.finite_array, system=None, fixed={"name": "value"}, arrays={"value": Array((3,), strict_shape=False)}),
    domain(checks.symmetric_psd, system=None, fixed={"name": "value"},
           arrays={"value": Array((3, 3), make=psd, strict_shape=False)}),
    domain(checks.correlation, system=None, arrays={"A": Array((3, 2), strict_shape=False), "B": Array((3, 2))}),
    domain(checks.integer, integer("value"), system=None, fixed={"name": "value"}),
    domain(checks.boolean, flag("value"), system=None, fixed={"name": "value"}),
    domain(checks.real, real("value"), system=None, fixed={"name": "value"}),
    # gd_beta (docs/gd_beta.md)
    domain(gd_beta.check_parameters), domain(gd_beta.icl_risk),
    *problem_only(gd_beta.omega, gd_beta.optimal_gamma, gd_beta.optimal_risk, gd_beta.optimal_risk_eigen,
                  gd_beta.gd0_optimal_risk, gd_beta.local_rates, gd_beta.flow_curvature, gd_beta.slow_modes,
                  gd_beta.pack_flow_params, gd_beta.excess_risk_sandwich),
    domain(gd_beta.snr, limits=True), domain(gd_beta.large_context_ratio_limit, limits=True),
    domain(gd_beta.excess_risk_parts), domain(gd_beta.bayes_estimate),
    domain(gd_beta.bayes_conditional_excess, arrays={"X": Array(lambda p: (3, p.N, p.d))}),
    domain(gd_beta.gd_beta_predict, system=None,
           arrays={"X": Array((6, 3)), "y": Array((6,)), "x_query": Array((3,)), "beta0": Array((3,)),
                   "Gamma": Array((3, 3))}),
    domain(gd_beta.ltb_embedding, system=None, arrays={"beta0": Array((3,)), "Gamma": Array((3, 3))}),
    domain(gd_beta.ltb_forward, flag("mlp"), system=None,
           arrays={"E": Array((2, 4, 5), strict_shape=False), "U": Array((4, 4)), "V": Array((4, 4)),
                   "K": Array((4, 4))}),
    domain(gd_beta.ltb_reduced_coordinates, flag("mlp"), system=None,
           arrays={"U": Array((4, 4)), "V": Array((4, 4)), "K": Array((4, 4))}),
    domain(gd_beta.ltb_reduced_predict, system=None,
           arrays={"X": Array((6, 3)), "y": Array((6,)), "x_query": Array((3,)), "c": Array((3,)), "a": Array((3,)),
                   "Q": Array((3, 3)), "q": Array((3,))}, fixed={"b": 0.5}),
    domain(gd_beta.readout_moments, real("b"), flag("constant"), draws={"b": (-10, 10)}),
    domain(gd_beta.readout_risk, real("b"), flag("constant"), draws={"b": (-10, 10)},
           build=lambda problem, rng: {"W": gd_beta.optimal_readout_risk(problem, np.ones(problem.d), 0.5,
                                                                         constant=True)[1]}, fixed={"constant": True}),
    domain(gd_beta.optimal_readout_risk, real("b"), flag("constant"), draws={"b": (-10, 10)}),
    domain(gd_beta.optimal_attention_risk, flag("mlp")),
    domain(gd_beta.beta_curvature), domain(gd_beta.risk_gradient), domain(gd_beta.flow_limit),
    domain(gd_beta.risk_hessian),
    domain(gd_beta.flow_state, system=None, arrays={"beta0": Array((3,)), "Gamma": Array((3, 3))}),
    domain(gd_beta.unpack_flow_state, integer("d", 1, 1000), system=None,
           build=lambda problem, rng: {"y": np.zeros(6)}, fixed={"d": 2}),
    domain(gd_beta.gamma_response, real("amplitude"), draws={"amplitude": (-10, 10)}, arrays={"times": Array((5,), strict_shape=False,
                                                                                      make=lambda z, p: np.abs(z))}),
    domain(gd_beta.conditional_gradient_moments,
           arrays={"X": Array(lambda p: (5, p.N, p.d)), "y": Array(lambda p: (5, p.N)), "beta": Array(lambda p: (5, p.d))}),
    domain(gd_beta.conditional_gradient_moments_by_batch, integer("n_batches", 1), draws={"n_batches": 6},
           arrays={"X": Array(lambda p: (6, p.N, p.d)), "y": Array(lambda p: (6, p.N)), "beta": Array(lambda p: (6, p.d))},
           refusals=("n_batches must divide",)),
    domain(gd_beta.gradient_flow_rhs_into, system=None, checked_by="dynamics.gd_beta.population_trajectory",
           build=lambda problem, rng: {**_kernel_args(lambda: gd_beta.pack_flow_params(_GD_PROBLEM), 6)(problem, rng),
                                       **_gd_flow(problem, rng)}),
    domain(gd_beta.gradient_flow_rhs, system=None, checked_by="dynamics.gd_beta.population_trajectory",
           build=lambda problem, rng: {**_kernel_args(lambda: gd_beta.pack_flow_params(_GD_PROBLEM), 6)(problem, rng),
                                       **_gd_flow(problem, rng)}),
    domain(gd_beta.context_gd_step, system=None, checked_by="dynamics.gd_beta.minibatch_gradient",
           build=lambda problem, rng: {"X": rng.standard_normal((2, 5, 3)), "y": rng.standard_normal((2, 5)), "c": 1,
                                       "beta0": rng.standard_normal(3), "g": np.empty(3)}),
    domain(gd_beta.moment_sums_by_batch, system=None, checked_by="gd_beta.conditional_gradient_moments_by_batch",
           build=lambda problem, rng: {"X": rng.standard_normal((4, 5, 2)), "y": rng.standard_normal((4, 5)),
                                       "beta": rng.standard_normal((4, 2)), "beta0": np.zeros(2),
                                       "Gamma": np.eye(2), "H": np.eye(2), "sigma2": 0.25, "n_batches": 2}),
    # group_sparse (docs/group_sparse.md)
    domain(group_sparse.first_step_v, real("eta", 0.0, None, strict=True)),
    domain(group_sparse.attention_weights, real("alpha"), integer("D", 2), system=None,
           draws={"alpha": (-50, 50), "D": 100}),
    domain(group_sparse.position_only_terms, real("beta"), real("alpha"), draws={"beta": (-20, 20), "alpha": (-20, 20)}),
    domain(group_sparse.position_only_loss, arrays={"beta": Array((3,), strict_shape=False),
                                                    "alpha": Array((3,), strict_shape=False)}),
    domain(group_sparse.pack_position_only_params, real("eta", 0.0, None, strict=True)),
    domain(group_sparse.asymptotic_loss_constant, system=None),
    domain(group_sparse.symmetric_coordinates, undefined=("['c_perp']",)),  # c_perp: no direction ⊥ v* at d = 1
    domain(group_sparse.position_only_step, system=None, checked_by="dynamics.group_sparse.position_only_trajectory",
           build=_kernel_args(lambda: group_sparse.pack_position_only_params(_GS_PROBLEM, 1.0), 2)),
    domain(group_sparse.position_only_flow_rhs_into, system=None, checked_by="dynamics.group_sparse.position_only_flow",
           build=_kernel_args(lambda: group_sparse.pack_position_only_params(_GS_PROBLEM, 1.0), 2)),
    domain(group_sparse.position_only_flow_rhs, system=None, checked_by="dynamics.group_sparse.position_only_flow",
           build=_kernel_args(lambda: group_sparse.pack_position_only_params(_GS_PROBLEM, 1.0), 2)),
    # lapack, linalg, linear_icl, softmax: numerics behind checked closed forms
    domain(lapack.solve_into, system=None, checked_by="dynamics.gd_beta.population_trajectory", build=_lapack),
    *[domain(function, system=None, checked_by="the Problems' symmetric_psd checks",
             arrays={"matrix": Array((3, 3), make=psd)}) for function in
      (linalg.psd_eigh, linalg.range_projector, linalg.range_basis, linalg.numerical_rank)],
    domain(linalg.psd_power, real("power", -2, 2), system=None, checked_by="the Problems' symmetric_psd checks",
           arrays={"matrix": Array((3, 3), make=psd)}),
    domain(linear_icl.gaussian_fourth_moment, system=None, checked_by="gd_beta and linear_attention_h3 Problems",
           arrays={"H": Array((3, 3), make=psd), "A": Array((3, 3))}),
    domain(linear_icl.preconditioned_gd_risk, real("sigma2", 0, 10), integer("N", 1, 100), system=None,
           checked_by="gd_beta and linear_attention_h3 Problems",
           arrays={"H": Array((3, 3), make=psd), "S": Array((3, 3), make=psd), "Gamma": Array((3, 3))}),
    domain(linear_icl.omega_matrix, real("sigma2", 0, 10), integer("N", 1, 100), system=None,
           checked_by="gd_beta and linear_attention_h3 Problems", arrays={"S_tilde": Array((3, 3), make=psd)}),
    domain(linear_icl.optimal_step_matrix, system=None, checked_by="gd_beta and linear_attention_h3 Problems",
           build=lambda problem, rng: {"H_half_pinv": np.eye(3), "Psi_tilde": np.eye(3),
                                       "Omega": linear_icl.omega_matrix(np.eye(3), 0.25, 10)}),
    domain(linear_icl.spectral_optimal_risk, real("sigma2", 0, 10), integer("N", 1, 100), system=None,
           checked_by="gd_beta and linear_attention_h3 Problems",
           arrays={"psi": Array((3,), make=lambda z, p: np.abs(z))}),
    domain(softmax.max_propagating_nan, system=None, checked_by="the loss kernels",
           build=lambda problem, rng: {"x": rng.standard_normal(4)}),
    domain(softmax.softmax_into, system=None, checked_by="the loss kernels",
           build=lambda problem, rng: {"z": rng.standard_normal(4), "out": np.empty(4)}),
    # linear_attention_h3 (docs/linear_attention_h3.md)
    domain(h3.random_walk_drift, integer("n", 1, h3.MAX_DRIFT_N), real("rho2", 0.0, None), system=None,
           draws={"n": 50}),
    domain(h3.gradient_second_moment), domain(h3.wpgd_risk), domain(h3.pgd_risk), domain(h3.pgd_excess_risk),
    *problem_only(h3.optimal_preconditioner, h3.optimal_risk, h3.isotropic_weight_matrix, h3.h3_optimum,
                  h3.attention_optimum, h3.heteroscedastic_optima, h3.correlated_moments, h3.correlated_optimum,
                  h3.rag_risk_floor, h3.pack_flow_params),
    domain(h3.optimal_weighted_preconditioner), domain(h3.optimal_risk_for_weights),
    domain(h3.low_rank_preconditioner, integer("r", 0, 4)), domain(h3.low_rank_optimal_risk, integer("r", 0, 4)),
    domain(h3.lora_optimal_risk, integer("r", 0, 4)), domain(h3.lora_optimal_update, integer("r", 0, 4)),
    domain(h3.isotropic_correlated_moments, choice("design", ("rag", "tfa")), integer("d", 1), integer("n", 1),
           real("alpha", 0, 1), real("sigma2", 0, None), system=None),
    domain(h3.isotropic_correlated_optimum, choice("design", ("rag", "tfa")), integer("d", 1), integer("n", 1),
           real("alpha", 0, 1), real("sigma2", 0, None), system=None),
    domain(h3.alignment_multiplier, integer("d", 1), real("alpha", 0, 1), system=None),
    domain(h3.effective_sample_size, build=lambda problem, rng: {"risk": h3.optimal_risk(problem) + 1.0}),
    domain(h3.isotropic_effective_sample_size, integer("d", 1), real("sigma2", 0), system=None, draws={"sigma2": 10},
           build=lambda problem, rng: {"risk": 11.0}, refusals=("risk must be >",)),
    domain(h3.attention_effective_preconditioner, integer("n", 1), system=None, build=_h3_weights),
    domain(h3.h3_effective_parameters, system=None, build=_h3_weights),
    domain(h3.pgd_risk_gradient),
    domain(h3.golden_setting_a, system=None), domain(h3.golden_setting_d, system=None),
    domain(h3.preconditioner_flow_rhs_into, system=None, checked_by="dynamics.linear_attention_h3.population_trajectory",
           build=_kernel_args(lambda: h3.pack_flow_params(_H3_PROBLEM), 4)),
    domain(h3.preconditioner_flow_rhs, system=None, checked_by="dynamics.linear_attention_h3.population_trajectory",
           build=_kernel_args(lambda: h3.pack_flow_params(_H3_PROBLEM), 4)),
    # max_margin (docs/attention_svm.md §3)
    domain(max_margin.ldp, system=None, build=_ldp),
    domain(max_margin.null_space_basis, system=None, build=_ldp),
    domain(max_margin.equality_ldp, system=None, build=_ldp),
    domain(max_margin.nuclear_program, system=None, build=_nuclear),
    # next_token_scc (docs/next_token_scc.md)
    *problem_only(ntp.priority_graphs, ntp.high_priority_mask, ntp.sfin_basis, ntp.w_fin, ntp.predicted_attention),
    domain(ntp.graph_svm, choice("norm", ("fro", "nuc"))),
    domain(ntp.certified_graph_svm, choice("norm", ("fro", "nuc")), raises=(ntp.UncertifiedSolution,)),
    domain(ntp.log_gradient_norm, limits=True),
    domain(ntp.svm_logits), domain(ntp.logits), domain(ntp.loss_and_gradient), domain(ntp.reduced_loss_and_gradient),
    domain(ntp.attention),
    domain(ntp.project_sfin, system=None, arrays={"W": Array((3, 3))},
           build=lambda problem, rng: {"basis": np.linalg.qr(rng.standard_normal((9, 2)))[0]}),
    domain(ntp.corr, system=None, arrays={"A": Array((3, 2), strict_shape=False), "B": Array((3, 2))}),
    domain(ntp.fit_radius, system=None, arrays={"W": Array((3, 3)), "W_fin": Array((3, 3)),
                                                "W_svm": Array((3, 3), strict_shape=False)}),
    # one_nn (docs/one_nn.md)
    domain(one_nn.t_density, integer("d", 2), system=None, draws={"d": 1000},
           arrays={"t": Array((5,), make=lambda z, p: np.tanh(z), strict_shape=False)}),
    domain(one_nn.pack_reduced_params, real("eta", 0.0, None, strict=True)),
    domain(one_nn.reduced_loss_on_grid, real("xi1", 0.0, one_nn.XI1_OVERFLOW), real("xi2"), accepts={"xi2": (np.inf,)},
           draws={"xi1": 50, "xi2": (-50, 50)}, fixed={"grid": (40, 30)}),
    domain(one_nn.reduced_loss_adaptive, real("xi1", 0.0, one_nn.XI1_OVERFLOW), real("xi2"), accepts={"xi2": (np.inf,)},
           draws={"xi1": 50, "xi2": (-50, 50)}),
    domain(one_nn.reduced_loss, real("xi1", 0.0), real("xi2"), accepts={"xi2": (np.inf,)},
           draws={"xi1": 50, "xi2": (-50, 50)}, fixed={"grid": (40, 30)}),
    domain(one_nn.gap_density_at_zero, integer("d", 3), integer("N", 2), system=None, draws={"d": 1000, "N": 10**5}),
    domain(one_nn.asymptotic_loss_constant, integer("d", 3), integer("N", 2), system=None,
           draws={"d": 1000, "N": 10**5}),
    domain(one_nn.reduced_gd_step, system=None, checked_by="dynamics.one_nn.reduced_trajectory",
           build=_kernel_args(lambda: one_nn.pack_reduced_params(_NN_PROBLEM, 1.0), 2)),
    domain(one_nn.reduced_flow_rhs, system=None, checked_by="dynamics.one_nn.flow_trajectory",
           build=_kernel_args(lambda: one_nn.pack_reduced_params(_NN_PROBLEM, 1.0), 2)),
    # parameters (the records themselves)
    domain(parameters.parse_parameters, system=None, fixed={"owner": "test"},
           build=lambda problem, rng: {"specs": (integer("n", 1, 5),), "values": {"n": "3"}}),
    # a decorator, applied at import to each system's population and minibatch (tests/test_options.py)
    domain(parameters.takes_options, system=None, checked_by="the systems' population and minibatch, at import",
           build=lambda problem, rng: {"specs": integer("n", 1, 5)}),
    domain(parameters.describe, system=None, build=lambda problem, rng: {"specs": (integer("n", 1, 5),)}),
    domain(parameters.square_matrix, integer("d", 1), system=None, fixed={"name": "value"}, draws={"d": 3},
           build=lambda problem, rng: {"value": 1.5}),
    # random_walk (docs/random_walk.md)
    domain(random_walk.positional_embeddings, integer("N", 1), system=None, draws={"N": 20},
           build=lambda problem, rng: {"M": 40}, refusals=("M must be >=",)),
    domain(random_walk.displacements_from_steps, integer("K", 1), system=None,
           build=lambda problem, rng: {"steps": rng.choice([-1, 1], size=(4, 5))}),
    domain(random_walk.enumerate_paths), domain(random_walk.step_one_v),
    domain(random_walk.circulant, system=None, arrays={"v": Array((5,), strict_shape=False)}),
    domain(random_walk.pack_reduced_params, build=_paths),
    domain(random_walk.reduced_losses, build=lambda problem, rng: {
        **_paths(problem, rng), "states": np.hstack([np.abs(rng.standard_normal((2, problem.K))),
                                                     rng.standard_normal((2, problem.N))])}),
    domain(random_walk.accuracies, build=lambda problem, rng: {
        **_paths(problem, rng), "states": np.hstack([np.abs(rng.standard_normal((2, problem.K))),
                                                     rng.standard_normal((2, problem.N))])}),
    domain(random_walk.reduced_loss, build=_paths), domain(random_walk.accuracy, build=_paths),
    domain(random_walk.walk_distribution, integer("m", 0, random_walk.MAX_WALK_STEPS), draws={"m": 12}),
    domain(random_walk.one_hot_map, real("v_plus"), real("v_minus"), integer("steps", 0, random_walk.MAX_MAP_STEPS),
           draws={"steps": 50, "v_plus": (0, 10), "v_minus": (0, 10)}),
    domain(random_walk.deterministic_closure, integer("steps", 0, random_walk.MAX_MAP_STEPS), draws={"steps": 50},
           system=None, build=lambda problem, rng: {
               "problem": random_walk.RandomWalkProblem.from_params({"K": 3, "N": 7, "p": 1.0, "M": 8})}),
    domain(random_walk.claim3_direction, integer("K", 3), real("p", 0, 1), system=None, draws={"K": 30}),
    domain(random_walk.sqrt_law_direction, integer("K", 3), real("p", 0, 1), system=None, draws={"K": 30}),
    domain(random_walk.direction_error, system=None, arrays={"v": Array((5,)), "target": Array((5,))}),
    domain(random_walk.direction_plateau, real("p", 0, 1), system=None),
    domain(random_walk.reduced_step, system=None, checked_by="dynamics.random_walk.reduced_trajectory",
           build=lambda problem, rng: (lambda p: {
               "k": 0, "x": np.concatenate([np.ones(p.K), np.zeros(p.N)]),
               "params": random_walk.pack_reduced_params(p, random_walk.enumerate_paths(p))})(
               random_walk.RandomWalkProblem.from_params({"N": 5}))),
    # scb (docs/scb.md)
    domain(scb.mu_inner), domain(scb.mu_norm2), domain(scb.attention_statistics), domain(scb.value_statistics),
    domain(scb.population_risk), domain(scb.raw_gradients), domain(scb.preconditioned_gradients),
    domain(scb.reduced_coordinates), domain(scb.least_squares_V), domain(scb.off_support_spread),
    domain(scb.line_point, real("alpha_V"), real("alpha_Q"), draws={"alpha_V": (-10, 10), "alpha_Q": (-10, 10)}),
    domain(scb.pack_line_params, real("eta_V", 0, None, strict=True), real("eta_Q", 0, None, strict=True)),
    domain(scb.reduced_risk, real("alpha_V"), real("alpha_Q"), real("e_V", 0), real("e_Q", 0),
           draws={"alpha_V": (-10, 10), "alpha_Q": (-10, 10), "e_V": 10, "e_Q": 10}),
    domain(scb.related_transition, real("rho", 0, 1, strict=True), real("noise", 0, None)),
    domain(scb.stage1_duration, real("eta", 0, None, strict=True), real("c", 0, 1, strict=True)),
    *problem_only(scb.slow_mode_rate),
    domain(scb.population_map_step, real("eta_V", 0, strict=True), real("eta_Q", 0, strict=True), real("lam", 0),
           draws={"eta_V": 10, "eta_Q": 10}, raises=(FloatingPointError,)),
    domain(scb.population_map, real("eta_V", 0, strict=True), real("eta_Q", 0, strict=True), real("lam", 0),
           integer("steps", 0, scb.MAX_MAP_STEPS), draws={"steps": 20, "eta_V": 10, "eta_Q": 10},
           raises=(FloatingPointError,)),
    domain(scb.relative_distance, build=lambda problem, rng: {"state": problem.initial_point(),
                                                              "reference": (problem.P, problem.Q_star)}),
    domain(scb.transfer_start, real("gamma", 0, 1, strict=True)),
    domain(scb.transfer_overlap), domain(scb.transfer_step_size, real("gamma", 0, 1, strict=True)),
    domain(scb.proximal_family_step, real("eta_V", 0, strict=True), real("eta_Q", 0, strict=True), real("lam", 0),
           draws={"eta_V": 10, "eta_Q": 10, "lam": 1}, build=lambda problem, rng: {"state": np.array([0.5, 0.5, 0.0, 0.1])},
           refusals=("sparsity", "threshold")),
    domain(scb.label_integrated_noise_sums, build=_scb_noise),
    domain(scb.line_map_step, system=None, checked_by="dynamics.scb.line_trajectory",
           build=_kernel_args(lambda: scb.pack_line_params(_SCB_PROBLEM, 0.1, 0.1), 2)),
    domain(scb.closure_map_step, system=None, checked_by="dynamics.scb.population",
           build=_kernel_args(lambda: scb.pack_line_params(_SCB_PROBLEM, 0.1, 0.1), 4)),
    domain(scb.normalised_flow_rhs_into, system=None, checked_by="dynamics.scb.normalised_flow",
           build=_kernel_args(lambda: np.array([0.1]), 2)),
    domain(scb.normalised_flow_rhs, system=None, checked_by="dynamics.scb.normalised_flow",
           build=_kernel_args(lambda: np.array([0.1]), 2)),
    domain(scb.soft_threshold, system=None, checked_by="scb.population_map_step",
           build=lambda problem, rng: {"x": rng.standard_normal(4), "theta": 0.1}),
    # symbolic
    domain(symbolic.scb_line_system, system=None), domain(symbolic.scb_latex, system=None),
]
