"""The domain of every public function of dynamics, one :class:`Domain` each (closed_forms/domain_table.py says how
an entry reads); tests/test_domains.py checks each function inside and outside it.

A system's ``population`` and ``minibatch`` take the option records of the command line (``POPULATION_OPTIONS``,
``MINIBATCH_OPTIONS`` of each dynamics module, which the System records read), so ``attnflow solve/simulate --param``
and this table state one domain. ``draws`` keeps each call cheap (a few steps, small batches); the records' maxima
stay the stated bounds. Adding a function is one line: ``domain(module.function, integer("steps", 1, MAX_STEPS))``.
"""
from __future__ import annotations

import math

import numpy as np

from attnflow.closed_forms import ccmc as ccmc_cf
from attnflow.closed_forms import one_nn as nn_cf
from attnflow.closed_forms import scb as scb_cf
from attnflow.closed_forms.domain_table import Array, choice, domain, flag, integer, real
from attnflow.closed_forms.domains import stochastic
from attnflow.dynamics import attention_svm as svm
from attnflow.dynamics import ccmc, diffusion, errors, gd_beta, group_sparse, integrate, montecarlo, one_nn
from attnflow.dynamics import linear_attention_h3 as h3
from attnflow.dynamics import next_token_scc as ntp
from attnflow.dynamics import optimizers, progress, random_walk, sampling, scb

__all__ = ["ARRAYS", "DOMAINS", "CHEAP_RUNS"]

MAX_STEPS, MAX_POINTS = montecarlo.MAX_STEPS, montecarlo.MAX_POINTS
OUTCOMES = (errors.DivergenceError, errors.StageFailure, errors.BudgetExceeded)
# Named refusals inside the records' bounds: a flow time whose first record t_end·1e-4 underflows, a learning rate
# whose cosine decay underflows to a zero step, a minibatch loss before the first minibatch (documented NaN).
TINY_T_END, TINY_LR, NO_BATCH_YET = ("t_end must be >= 1e-300",), ("learning_rates must be",), ("['batch_loss']",)
# 1 − corr(W, ·) is undefined (NaN, as ntp.metrics documents) where W^svm = 0 or the compared W is 0
NTP_DIRECTIONAL = ("one_minus_corr",)
# Undefined by design (scb.run_stage documents it): the loss at a stage's last record, and dist_Q_normalised where
# the Stage-3 normalisation is undefined (α_Q <= 0 at Q₀, or a column it would empty)
SCB_UNDEFINED = ("['loss']", "['dist_Q_normalised']")
NO_PERPENDICULAR = ("['c_perp']",)  # group_sparse's c_perp: no direction ⊥ v* at d = 1 (documented NaN)

# The largest values drawn of the run-length options: the cost of a call, not its domain.
CHEAP_RUNS = {"steps": 6, "n_records": 4, "records": 4, "n_points": 6, "batch_size": 16, "batch": 64, "t_end": 3.0,
              "n_sequences": 40, "runs": 3, "points": 3, "R_max": 64.0, "rank": 4, "lr": 0.5, "eta": 2.0,
              "init_scale": 3.0, "lam": 0.5, "n": 50, "count": 50, "n_contexts": 64, "n_paths": 3, "draws": 20,
              **{f"stage{k}_steps": 3 for k in (1, 2, 3)}, **{f"stage{k}_batch": 64 for k in (1, 2, 3)}}


def _cheap(**more) -> dict:
    return CHEAP_RUNS | more


ARRAYS = {
    "gd_beta": {"beta0": Array(lambda p: (p.d,)), "Gamma": Array(lambda p: (p.d, p.d), scale=0.2)},
    "linear_attention_h3": {"W": Array(lambda p: (p.d, p.d), scale=0.2)},
    "scb": {"V": Array(lambda p: (p.N, p.N)), "Q": Array(lambda p: (p.T, p.N), make=lambda z, p: stochastic(z.T).T),
            "P_tilde": Array(lambda p: (p.N, p.N), make=lambda z, p: p.P)},
    "next_token_scc": {"W0": Array(lambda p: (p.d, p.d))},
    "attention_svm": {"theta0": Array(lambda p: p.theta_shape())},
    "group_sparse": {"v": Array(lambda p: (p.d + p.D,)), "W": Array(lambda p: (p.d + p.D, p.d + p.D))},
}


# ---- builders of structured arguments ----------------------------------------------------------------------------

def _gd_prompts(problem, rng):
    return {"prompts": gd_beta.sample_prompts(problem, 4, rng)}


def _h3_prompts(problem, rng):
    return {"prompts": h3.sample_prompts(problem, 4, rng)}


def _nn_prompts(problem, rng):
    return {"prompts": one_nn.sample_prompts(problem, 4, rng)}


def _gd_pool(problem, rng):
    return {"pool": gd_beta.context_pool(problem, 8, seed=0, n_batches=2)}


def _gs_data(problem, rng):
    X, y = group_sparse.sample_data(problem, 6, rng)
    return {"X": X, "y": y}


def _predictors(problem, rng):
    return {"predict": lambda prompts: h3.pgd_predict(prompts, np.zeros((problem.d, problem.d))),
            "reference": lambda prompts: h3.pgd_predict(prompts, 0.1 * np.eye(problem.d))}


def _h3_trajectory(problem, rng):
    return {"trajectory": h3.train(problem, "pgd", seed=0, steps=3, batch_size=4)}


def _rw_paths(problem, rng):
    return {"paths": random_walk.sample_paths(problem, 8, rng)}


def _rw_sequences(problem, rng):
    return {"sequences": random_walk.sample_sequences(problem, 8, rng)}


def _stage(problem, rng, name="stage"):
    return {name: scb.StageSettings(2, 32, 0.25)}


def _stages(problem, rng):
    return {f"stage{k}": scb.StageSettings(2, 32, 0.25, lam=0.01 if k == 2 else 0.0, train_Q=k < 3) for k in (1, 2, 3)}


def _contexts(problem, rng):
    return {"contexts": scb.context_sample(problem, 32, seed=0, n_batches=2)}


def _scb_run(problem, rng):
    return {"run": scb.run_sgd(problem, scb.StageSettings(2, 32, 0.25), seed=0, record_every=1)}


def _ntp_reference(problem, rng):
    reference = ntp.reference(problem)
    return {"ref": reference, "run": ntp.train(problem, np.zeros((problem.d, problem.d)), steps=3, records=2)}


def _ccmc_raw(problem, rng):
    K = problem.P.shape[0]
    E = ccmc.random_embeddings(K, K + 1, seed=0)
    prompts = rng.integers(0, K, size=(5, problem.L))
    return {"E": E, "W": 0.1 * rng.standard_normal((K + 1, K + 1)), "prompts": prompts,
            "y": prompts[:, 0].copy(), "X0": prompts[0], "P": problem.P, "K": K,
            "positions": rng.standard_normal((problem.L, 2)), "W_full": 0.1 * rng.standard_normal((K + 3, K + 3)),
            "tokens": prompts[0], "counts": np.ones((5, K), dtype=np.int64), "last": prompts[:, -1],
            "f0": np.full(K, 1.0 / K), "taus": np.linspace(0.0, 1.0, 4)}


def _diffusion(problem, rng):
    return {"theta0": np.ones(2), "learning_rates": np.full(4, 0.1), "gradient": lambda theta: theta,
            "hessian": lambda theta: np.eye(2), "noise_covariance": lambda theta: np.stack([np.eye(2)] * 3)}


def _drift_rhs(problem, rng):
    return {"rhs": _gd_cf_rhs(), "y0": np.zeros(6), "t_eval": np.linspace(0.0, 1.0, 3), "t_span": (0.0, 1.0),
            "dt": 0.1, "params": _gd_params()}


def _gd_cf_rhs():
    from attnflow.closed_forms import gd_beta as gd_cf
    return gd_cf.gradient_flow_rhs_into


def _gd_params():
    from attnflow.closed_forms import gd_beta as gd_cf
    return gd_cf.pack_flow_params(gd_cf.GDBetaProblem.isotropic(2))


def _map(problem, rng):
    return {"step_map": scb_cf.line_map_step, "x0": np.zeros(2),
            "params": scb_cf.pack_line_params(scb_cf.SCBProblem.from_params({}), 0.1, 0.1)}


def _loop_kernel(kind):
    def build(problem, rng):
        from attnflow.closed_forms import gd_beta as gd_cf
        y0, params = np.zeros(6), _gd_params()
        if kind == "rk4":
            return {"rhs": gd_cf.gradient_flow_rhs, "y0": y0, "t0": 0.0, "dt": 0.1, "n_steps": 3,
                    "record_steps": np.arange(4), "params": params, "blowup": 1e12}
        if kind == "map":
            x = _map(problem, rng)
            return {"step_map": x["step_map"], "x0": x["x0"], "n_steps": 3, "record_steps": np.arange(4),
                    "params": x["params"], "blowup": 1e12}
        return {"rhs": gd_cf.gradient_flow_rhs_into, "y0": y0, "t0": 0.0, "t_eval": np.linspace(0.0, 1.0, 3),
                "params": params, "rtol": 1e-6, "atol": 1e-9, "first_step": 0.0, "max_steps": 10_000,
                "blowup": 1e12}
    return build


def _flow_loop(problem, rng, K=3, d=2):
    from attnflow.closed_forms import linear_attention_h3 as h3_cf
    return {"gd": _gd_params(), "h3": h3_cf.pack_flow_params(h3_cf.H3Problem.from_params({"d": d})),
            "ccmc": ccmc_cf.pack_fluid_params(stochastic(np.eye(K)))}


def _flow_kernel(which, n):
    return lambda problem, rng: {"y0": np.full(n, 1.0 / n) if which == "ccmc" else np.zeros(n), "t0": 0.0,
                                 "t_eval": np.linspace(0.0, 1.0, 3), "params": _flow_loop(problem, rng)[which],
                                 "rtol": 1e-6, "atol": 1e-9, "first_step": 0.0, "max_steps": 10_000, "blowup": 1e12}


def _sampling(problem, rng):
    prob, choices = sampling.alias_table(np.array([0.2, 0.3, 0.5]))
    cdf, guide = sampling.guide_tables(np.array([0.2, 0.3, 0.5]))
    state = np.array([1, 2, 3, 4], dtype=np.uint64)
    return {"state": state, "out": np.empty(4), "prob": prob, "choices": choices, "u": 0.3, "cdf": cdf, "guide": guide}


# ---- the table ---------------------------------------------------------------------------------------------------

DOMAINS = [
    # attention_svm (docs/attention_svm.md)
    domain(svm.record_steps, integer("steps", 1, svm.MAX_STEPS), integer("records", 2, svm.MAX_RECORDS), system=None,
           draws=_cheap()),
    domain(svm.train, real("eta", 0, strict=True), integer("steps", 1, svm.MAX_STEPS),
           integer("records", 2, svm.MAX_RECORDS), flag("normalise"), draws=_cheap(), raises=OUTCOMES),
    domain(svm.train_kq, real("eta", 0, strict=True), integer("steps", 1, svm.MAX_STEPS), flag("joint"),
           integer("records", 2, svm.MAX_RECORDS), draws=_cheap(), raises=OUTCOMES,
           build=lambda p, rng: {"K0": 0.3 * rng.standard_normal((p.d, 2)), "Q0": 0.3 * rng.standard_normal((p.d, 2))},
           given={"model": "cross"}),
    domain(svm.train_relu_head, real("eta", 0, strict=True), integer("steps", 1, svm.MAX_STEPS),
           integer("records", 2, svm.MAX_RECORDS), draws=_cheap(), raises=OUTCOMES,
           build=lambda p, rng: {"V": rng.standard_normal((p.d, 2)), "W0": 0.3 * rng.standard_normal(p.theta_shape())}),
    domain(svm.train_joint, real("eta", 0, strict=True), integer("steps", 1, svm.MAX_STEPS),
           integer("records", 2, svm.MAX_RECORDS), draws=_cheap(), raises=OUTCOMES,
           build=lambda p, rng: {"p0": 0.3 * rng.standard_normal(p.d), "v0": 0.3 * rng.standard_normal(p.d)},
           given={"model": "prompt"}),
    domain(svm.initial_theta, real("scale", 0), draws={"scale": 10}),
    domain(svm.regularisation_path, build=lambda p, rng: {"radii": np.array([0.5, 1.0, 2.0])}, raises=OUTCOMES),
    domain(svm.population, *svm.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    domain(svm.minibatch, *svm.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    # ccmc (docs/ccmc.md)
    domain(ccmc.random_embeddings, integer("K", 2), flag("orthonormal"), system=None, draws={"K": 6},
           build=lambda p, rng: {"d": 8}, refusals=("d must be >=",)),
    domain(ccmc.tied_head, system=None, arrays={"E": Array((4, 6))}),
    domain(ccmc.attention_logits, system=None, arrays={"E": Array((4, 6)), "W": Array((6, 6))}),
    domain(ccmc.attention_output, choice("query", ("self", "exclude")), system="ccmc", build=_ccmc_raw),
    domain(ccmc.positional_attention_output, system="ccmc", build=_ccmc_raw),
    domain(ccmc.sample_raw_outputs, integer("draws", 1, ccmc.MAX_DRAWS), choice("query", ("self", "exclude")),
           system="ccmc", build=_ccmc_raw, draws=_cheap()),
    domain(ccmc.generate_raw, integer("steps", 0, MAX_STEPS), integer("runs", 1, ccmc.MAX_RUNS),
           choice("query", ("self", "exclude")), system="ccmc", build=_ccmc_raw, draws=_cheap()),
    domain(ccmc.sample_learning_data, integer("n", 1, MAX_STEPS), draws=_cheap()),
    domain(ccmc.fit_mle, choice("method", ("newton", "lbfgs")),
           build=lambda p, rng: (lambda raw: {**raw, "y": raw["prompts"][:, 0].copy()})(_ccmc_raw(p, rng)), raises=OUTCOMES,
           refusals=("not identified", "identif")),
    domain(ccmc.identified_groups, system="ccmc", build=_ccmc_raw),
    domain(ccmc.raw_nll_and_gradient, choice("query", ("self", "exclude")), system="ccmc", build=_ccmc_raw),
    domain(ccmc.adam_raw, integer("steps", 1, MAX_STEPS), integer("batch", 1, 1_000_000),
           real("lr", 0, None, strict=True), real("average_from", 0, 1), integer("n_records", 1, montecarlo.MAX_RECORDS),
           draws=_cheap(), build=lambda p, rng: {"d": p.P.shape[0]}, raises=OUTCOMES),
    domain(ccmc.generate_counts, integer("runs", 1, ccmc.MAX_RUNS), system="ccmc", draws=_cheap(),
           build=lambda p, rng: {**_ccmc_raw(p, rng), "record_steps": np.array([0, 2, 5])}),
    domain(ccmc.fluid_trajectory, system="ccmc", build=_ccmc_raw, raises=OUTCOMES),
    domain(ccmc.population, *ccmc.POPULATION_OPTIONS, draws=_cheap(steps=200), raises=OUTCOMES),
    domain(ccmc.minibatch, *ccmc.MINIBATCH_OPTIONS, draws=_cheap(steps=200), raises=OUTCOMES),
    domain(ccmc.fluid_dopri5, system=None, checked_by="ccmc.fluid_trajectory", build=_flow_kernel("ccmc", 3)),
    # diffusion (docs/diffusion.md)
    domain(diffusion.pool_size, integer("n_batches", 2), system=None, draws={"n_batches": 20},
           build=lambda p, rng: {"n_contexts": 100}, refusals=("n_contexts must be >=",)),
    domain(diffusion.linear_noise, integer("batch_size", 1), system=None, build=_diffusion),
    domain(diffusion.gaussian_noise_paths, integer("batch_size", 1), integer("n_paths", 1, diffusion.MAX_PATHS),
           system=None, build=_diffusion, draws=_cheap()),
    # gd_beta (docs/gd_beta.md)
    domain(gd_beta.sample_prompts, integer("n", 1, 10**7), draws=_cheap()),
    domain(gd_beta.token_matrices, build=_gd_prompts),
    domain(gd_beta.monte_carlo_risk, integer("n", 2, montecarlo.MAX_SAMPLES), draws=_cheap(),
           build=lambda p, rng: {"predict": lambda prompts: np.zeros(len(prompts.y_query))}),
    domain(gd_beta.bayes_risk, integer("n_contexts", 2, gd_beta.MAX_BAYES_CONTEXTS), draws=_cheap()),
    domain(gd_beta.population_trajectory, real("t_end", 0, None, strict=True), integer("n_points", 2, MAX_POINTS),
           draws=_cheap(), raises=OUTCOMES, refusals=TINY_T_END),
    domain(gd_beta.minibatch_gradient, build=_gd_prompts),
    domain(gd_beta.excess_risk, build=lambda p, rng: {"betas": rng.standard_normal((3, p.d)),
                                                      "Gammas": 0.2 * rng.standard_normal((3, p.d, p.d))}),
    domain(gd_beta.make_model, choice("name", gd_beta.MODELS), real("init_scale", 0, None), draws=_cheap(),
           build=lambda p, rng: {"problem": p}),
    domain(gd_beta.minibatch_trajectory, choice("model", gd_beta.MODELS), integer("batch_size", 1, 1_000_000),
           integer("steps", 1, MAX_STEPS), real("lr", 0, None, strict=True),
           choice("optimizer", tuple(optimizers.OPTIMIZERS)), draws=_cheap(), raises=OUTCOMES, undefined=NO_BATCH_YET),
    domain(gd_beta.context_pool, integer("n_contexts", 4, 10**7), draws=_cheap(), fixed={"n_batches": 2}),
    domain(gd_beta.gradient_noise_covariance, build=_gd_pool),
    domain(gd_beta.sgd_linear_noise, integer("batch_size", 1), integer("steps", 1, MAX_STEPS),
           real("lr", 0, None, strict=True), build=_gd_pool, draws=_cheap(), raises=OUTCOMES, refusals=TINY_LR),
    domain(gd_beta.sgd_gaussian_noise_paths, integer("batch_size", 1), integer("steps", 1, MAX_STEPS),
           real("lr", 0, None, strict=True), integer("n_paths", 1, diffusion.MAX_PATHS), build=_gd_pool, draws=_cheap(),
           raises=OUTCOMES, refusals=TINY_LR),
    domain(gd_beta.population, *gd_beta.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES, refusals=TINY_T_END),
    domain(gd_beta.minibatch, *gd_beta.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES, undefined=NO_BATCH_YET),
    domain(gd_beta.flow_dopri5, system=None, checked_by="gd_beta.population_trajectory", build=_flow_kernel("gd", 6)),
    # group_sparse (docs/group_sparse.md)
    domain(group_sparse.sample_data, integer("n", 1, 10**7), flag("symmetrise"), draws=_cheap()),
    domain(group_sparse.loss_and_gradient, flag("position_only"), build=_gs_data),
    domain(group_sparse.attention_matrix, build=_gs_data), domain(group_sparse.attention_on_star, build=_gs_data),
    domain(group_sparse.full_gd_trajectory, real("eta", 0, None, strict=True), integer("steps", 1, MAX_STEPS),
           integer("batch_size", 1, 10_000_000), flag("fresh"), flag("symmetrise"), flag("position_only"),
           integer("n_records", 2, montecarlo.MAX_RECORDS), draws=_cheap(), fixed={"n_eval": 20}, raises=OUTCOMES,
           undefined=NO_PERPENDICULAR),
    domain(group_sparse.position_only_trajectory, real("eta", 0, None, strict=True), integer("steps", 1, MAX_STEPS),
           integer("n_records", 2, montecarlo.MAX_RECORDS), draws=_cheap(), raises=OUTCOMES),
    domain(group_sparse.position_only_flow, arrays={"times": Array((4,), make=lambda z, p: np.sort(np.abs(z)),
                                                                   strict_shape=False)}, raises=OUTCOMES),
    domain(group_sparse.sample_downstream, real("gamma", 0, None), integer("n", 1, 10**7), draws=_cheap(),
           arrays={"u_star": Array(lambda p: (p.d,), make=lambda z, p: z / np.linalg.norm(z))}),
    domain(group_sparse.fine_tune, real("eta", 0, None, strict=True), flag("train_W"), draws=_cheap(),
           build=lambda p, rng: {**_gs_data(p, rng), "W_pretrained": np.zeros((p.d + p.D,) * 2)}),
    domain(group_sparse.transformer_error, system="group_sparse",
           build=lambda p, rng: {**_gs_data(p, rng), "v": np.ones(p.d + p.D), "W": np.zeros((p.d + p.D,) * 2)}),
    domain(group_sparse.logistic_regression, real("ridge", 0, None, strict=True), system="group_sparse",
           build=_gs_data),
    domain(group_sparse.linear_error, system="group_sparse",
           build=lambda p, rng: (lambda data: {**data, "w": np.ones(data["X"][0].size)})(_gs_data(p, rng))),
    domain(group_sparse.population, *group_sparse.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    domain(group_sparse.minibatch, *group_sparse.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES,
           undefined=NO_PERPENDICULAR),
    # integrate (the engine: the systems' wrappers check what they pass)
    domain(integrate.solve_dop853, system=None, build=_drift_rhs, raises=OUTCOMES),
    domain(integrate.solve_dopri5, system=None, build=_drift_rhs, raises=OUTCOMES),
    domain(integrate.solve_rk4, system=None, build=lambda p, rng: {**_drift_rhs(p, rng), "rhs": _rk4_rhs()},
           raises=OUTCOMES),
    domain(integrate.iterate_map, integer("n_steps", 0, MAX_STEPS), system=None, build=_map, draws=_cheap(n_steps=5),
           raises=OUTCOMES),
    domain(integrate.rk4_loop, system=None, checked_by="integrate.solve_rk4", build=_loop_kernel("rk4")),
    domain(integrate.map_loop, system=None, checked_by="integrate.iterate_map", build=_loop_kernel("map")),
    domain(integrate.dopri5_loop, system=None, checked_by="integrate.solve_dopri5", build=_loop_kernel("dopri5")),
    # linear_attention_h3 (docs/linear_attention_h3.md)
    domain(h3.sample_prompts, integer("count", 1, 10**7), draws=_cheap()),
    domain(h3.token_matrices, build=_h3_prompts),
    domain(h3.bounded_chunk, integer("chunk", 1, None)),
    domain(h3.monte_carlo_risk, integer("count", 2, montecarlo.MAX_SAMPLES), draws=_cheap(), build=_predictors),
    domain(h3.paired_risk_difference, integer("count", 2, montecarlo.MAX_SAMPLES), draws=_cheap(), build=_predictors),
    domain(h3.pgd_predict, build=_h3_prompts),
    domain(h3.pgd_batch_gradient, build=_h3_prompts),
    domain(h3.attention_batch_gradient, build=lambda p, rng: {**_h3_prompts(p, rng), "Wq": rng.standard_normal((p.d + 1, 3)),
           "Wk": rng.standard_normal((p.d + 1, 3)), "v": rng.standard_normal(p.d + 1)}),
    domain(h3.h3_batch_gradient, build=lambda p, rng: {**_h3_prompts(p, rng), **{name: rng.standard_normal((p.d + 1, 3))
           for name in ("Wq", "Wk", "Wv")}, "f": rng.standard_normal(p.n + 1)}),
    domain(h3.wpgd_predict, build=lambda p, rng: {**_h3_prompts(p, rng), "omega": np.ones(p.n)}),
    domain(h3.attention_forward, system=None,
           arrays={"Z": Array((2, 5, 4), strict_shape=False), "Wq": Array((4, 3)), "Wk": Array((4, 3)),
                   "v": Array((4,))}),
    domain(h3.h3_forward, system=None,
           arrays={"Z": Array((2, 5, 4)), "Wq": Array((4, 3)), "Wk": Array((4, 3)), "Wv": Array((4, 3)),
                   "f": Array((5,))}),
    domain(h3.make_model, choice("name", h3.MODELS), real("init_scale", 0, None), draws=_cheap(),
           build=lambda p, rng: {"problem": p}),
    domain(h3.trained_predictor, system="linear_attention_h3", build=_h3_trajectory),
    domain(h3.train, choice("model", h3.MODELS), integer("steps", 1, MAX_STEPS), integer("batch_size", 1, 1_000_000),
           real("lr", 0, None, strict=True), choice("optimizer", ("adam", "sgd")), draws=_cheap(), raises=OUTCOMES,
           undefined=NO_BATCH_YET),
    domain(h3.population_trajectory, real("t_end", 0, None, strict=True), integer("n_points", 2, MAX_POINTS),
           draws=_cheap(), raises=OUTCOMES, refusals=TINY_T_END),
    domain(h3.flow_rate),
    domain(h3.correlated_population_trajectory, real("t_end", 0, None, strict=True), integer("n_points", 2, MAX_POINTS),
           draws=_cheap(), raises=OUTCOMES, refusals=TINY_T_END, given={"design": "rag"}),
    domain(h3.population, *h3.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES, refusals=TINY_T_END),
    domain(h3.minibatch, *h3.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES, undefined=NO_BATCH_YET),
    domain(h3.flow_dopri5, system=None, checked_by="linear_attention_h3.population_trajectory",
           build=_flow_kernel("h3", 4)),
    # montecarlo
    domain(montecarlo.monte_carlo_mean, integer("n", 2, montecarlo.MAX_SAMPLES), system=None, draws=_cheap(),
           build=lambda p, rng: {"draw": lambda generator, m: generator.random(m)}),
    domain(montecarlo.prompt_risk, integer("n", 2, montecarlo.MAX_SAMPLES), system=None, draws=_cheap(),
           build=lambda p, rng: {"sample_prompts": lambda generator, m: gd_beta.sample_prompts(_GD, m, generator),
                                 "predict": lambda prompts: np.zeros(len(prompts.y_query))}),
    domain(montecarlo.check_run_length, integer("steps", 1, MAX_STEPS), integer("n_records", 1, montecarlo.MAX_RECORDS),
           system=None),
    domain(montecarlo.flow_times, real("t_end", 0, strict=True), integer("n_points", 2, MAX_POINTS), system=None,
           draws=_cheap(), refusals=TINY_T_END),
    domain(montecarlo.check_batch_size, integer("batch_size", 1, montecarlo.MAX_BATCH), system=None),
    domain(montecarlo.check_count, integer("n", 1, montecarlo.MAX_PROMPTS), system=None, fixed={"name": "n"}),
    domain(montecarlo.log_grid, integer("steps", 1, MAX_STEPS), integer("n_log", 1, montecarlo.MAX_RECORDS),
           system=None, draws={"steps": 1000}, checked_by="montecarlo.check_run_length"),
    domain(montecarlo.log_spaced_steps, integer("steps", 1, MAX_STEPS), integer("records", 2, montecarlo.MAX_RECORDS),
           system=None, draws={"records": 50}),
    # next_token_scc (docs/next_token_scc.md)
    domain(ntp.record_steps, integer("steps", 1, ntp.MAX_STEPS), integer("records", 2, 2000), system=None,
           draws={"records": 50}),
    domain(ntp.initial_W, real("scale", 0), draws={"scale": 10}),
    domain(ntp.train, real("eta", 0, strict=True), integer("steps", 1, ntp.MAX_STEPS), flag("normalise"),
           integer("records", 2, 2000), draws=_cheap(), raises=OUTCOMES),
    domain(ntp.train_general_head, real("eta", 0, strict=True), integer("steps", 1, ntp.MAX_STEPS),
           integer("records", 2, 2000), draws=_cheap(), raises=OUTCOMES),
    domain(ntp.reference),
    domain(ntp.metrics, system="next_token_scc", build=_ntp_reference, undefined=NTP_DIRECTIONAL),
    domain(ntp.population, *ntp.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES, undefined=NTP_DIRECTIONAL),
    domain(ntp.minibatch, *ntp.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES, undefined=NTP_DIRECTIONAL),
    # one_nn (docs/one_nn.md)
    domain(one_nn.sample_prompts, integer("n", 1, 10**7), draws=_cheap()),
    domain(one_nn.token_matrices, build=_nn_prompts),
    domain(one_nn.manifold_weight, integer("d", 1), real("xi1"), real("xi2"), system=None,
           draws={"d": 50, "xi1": (-50, 50), "xi2": (-50, 50)}),
    domain(one_nn.per_prompt_loss_and_gradient, build=lambda p, rng: {**_nn_prompts(p, rng),
                                                                      "W": one_nn.manifold_weight(p.d, 1.0, 0.5)}),
    domain(one_nn.monte_carlo_loss, real("xi1"), real("xi2"), integer("n", 2, montecarlo.MAX_SAMPLES),
           draws=_cheap(xi1=(0, 50), xi2=(-50, 50))),
    domain(one_nn.reduced_trajectory, real("eta", 0, None, strict=True), integer("steps", 1, MAX_STEPS),
           integer("n_records", 2, montecarlo.MAX_RECORDS), draws=_cheap(), raises=OUTCOMES,
           fixed={"resolution": nn_cf.Resolution(31, 2.0, 0.5)}),
    domain(one_nn.flow_trajectory, real("eta", 0, None, strict=True), integer("steps", 1, MAX_STEPS),
           integer("n_records", 2, montecarlo.MAX_RECORDS), draws=_cheap(), raises=OUTCOMES,
           fixed={"resolution": nn_cf.Resolution(31, 2.0, 0.5)}, refusals=("is too small: the flow's time step",)),
    domain(one_nn.full_gd_trajectory, real("eta", 0, None, strict=True), integer("steps", 1, MAX_STEPS),
           integer("batch_size", 1, montecarlo.MAX_BATCH), integer("n_records", 2, montecarlo.MAX_RECORDS), draws=_cheap(),
           raises=OUTCOMES),
    domain(one_nn.sample_shifted_prompts, integer("n", 1, montecarlo.MAX_PROMPTS), real("delta", 0, 2, strict=True),
           draws=_cheap(delta=(0, 1.99))),  # δ < 2: the flip guarantees a margin of 2 at most
    domain(one_nn.shifted_test_loss, real("xi1"), real("xi2"), integer("n", 2, montecarlo.MAX_PROMPTS),
           real("delta", 0, 2, strict=True), draws=_cheap(xi1=(0, 50), xi2=(-50, 50), delta=(0, 1.99))),
    domain(one_nn.population, *one_nn.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    domain(one_nn.minibatch, *one_nn.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    # optimizers, progress
    domain(optimizers.exact_gradient_path, choice("optimizer", tuple(optimizers.OPTIMIZERS)),
           real("lr", 0, None, strict=True), integer("steps", 1, MAX_STEPS), system=None, draws={"steps": 20, "lr": 1.0},
           build=lambda problem, rng: {"params": [rng.standard_normal(3)], "gradient": lambda params: [0.5 * params[0]],
                                       "record": np.array([0, 1])}),
    domain(optimizers.cosine_schedule, real("lr", 0, None, strict=True), integer("steps", 1, MAX_STEPS),
           real("final_fraction", 0, 1), system=None, draws=_cheap()),
    domain(progress.report, system=None, checked_by="the long loops that report their progress",
           build=lambda p, rng: {"done": 1.0, "total": 2.0}),
    domain(progress.listening, system=None, checked_by="the command line's progress display",
           build=lambda p, rng: {"callback": lambda done, total: None}),
    # random_walk (docs/random_walk.md)
    domain(random_walk.sample_paths, integer("n", 1, 10**7), draws=_cheap()),
    domain(random_walk.reduced_trajectory, integer("steps", 1, MAX_STEPS), build=_rw_paths, draws=_cheap(),
           raises=OUTCOMES),
    domain(random_walk.population_sequences),
    domain(random_walk.sample_sequences, integer("n", 1, 10**7), draws=_cheap()),
    domain(random_walk.full_accuracy, build=lambda p, rng: {**_rw_sequences(p, rng), "V": np.eye(p.K),
                                                            "W": np.zeros((p.K + p.M,) * 2)}),
    domain(random_walk.full_gd_trajectory, integer("steps", 1, MAX_STEPS), real("init_scale", 0, None),
           build=_rw_sequences, draws=_cheap(), raises=OUTCOMES),
    domain(random_walk.population, *random_walk.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    domain(random_walk.minibatch, *random_walk.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    # sampling (kernels behind the samplers of ccmc and scb)
    domain(sampling.guide_tables, system=None, arrays={"laws": Array((2, 3), make=lambda z, p: stochastic(z),
                                                                     strict_shape=False)}),
    domain(sampling.alias_table, system=None, arrays={"p": Array((4,), make=lambda z, p: np.abs(z) + 0.01,
                                                                 strict_shape=False)}),
    domain(sampling.fill_uniforms, system=None, checked_by="the samplers of ccmc and scb", build=_sampling),
    domain(sampling.alias_picks, system=None, checked_by="the samplers of ccmc and scb",
           build=lambda p, rng: {**_sampling(p, rng), "out": np.empty(4, dtype=np.int64)}),
    domain(sampling.guided_pick, system=None, checked_by="the samplers of ccmc and scb", build=_sampling),
    domain(sampling.alias_pick, system=None, checked_by="the samplers of ccmc and scb", build=_sampling),
    # scb (docs/scb.md)
    domain(scb.minibatch_gradients, integer("batch", 1, scb.MAX_GRADIENT_BATCH), flag("raw"), draws=_cheap()),
    domain(scb.line_trajectory, real("eta_V", 0, strict=True), real("eta_Q", 0, strict=True),
           integer("steps", 0, MAX_STEPS), draws=_cheap(eta_V=10, eta_Q=10), raises=OUTCOMES),
    domain(scb.normalised_flow, real("epsilon", 0), system=None, raises=OUTCOMES, draws={"epsilon": 1},
           build=lambda p, rng: {"x0": np.array([0.1, 0.1]), "taus": np.linspace(0.0, 2.0, 4)}),
    domain(scb.run_stage, build=lambda p, rng: {**_stage(p, rng), "start": p.initial_point()}, raises=OUTCOMES,
           undefined=SCB_UNDEFINED),
    domain(scb.rounding_threshold, real("alpha_Q"), real("C", 1), draws={"alpha_Q": (-10, 10), "C": 10}),
    domain(scb.rounding_finds_supports, real("alpha_Q"), real("C", 1), draws={"alpha_Q": (-10, 10), "C": 10}),
    domain(scb.round_columns, real("threshold"), system=None, arrays={"Q": Array((4, 3), strict_shape=False)},
           draws={"threshold": (-1, 1)}),
    domain(scb.round_to_supports),
    domain(scb.run_algorithm1, build=_stages, raises=OUTCOMES, undefined=SCB_UNDEFINED),
    domain(scb.run_sgd, build=_stage, raises=OUTCOMES, undefined=SCB_UNDEFINED),
    domain(scb.run_stages_2_3, real("alpha_Q"), build=lambda p, rng: {**_stage(p, rng, "stage2"),
                                                                   "start": p.initial_point()},
           draws={"alpha_Q": (0.1, 10)}, raises=OUTCOMES, undefined=SCB_UNDEFINED),
    domain(scb.run_stage1, build=lambda p, rng: _stage(p, rng, "stage1"), raises=OUTCOMES,
           undefined=SCB_UNDEFINED),
    domain(scb.relative_errors),
    domain(scb.off_support_noise, integer("batch", 1, scb.MAX_GRADIENT_BATCH),
           integer("n_batches", 2, scb.MAX_NOISE_BATCHES),
           draws=_cheap(n_batches=3)),
    domain(scb.transfer_step, real("gamma", 0, 1, strict=True), integer("batch0", 1, scb.MAX_STAGE_BATCH),
           draws={"batch0": 64}, raises=OUTCOMES, undefined=SCB_UNDEFINED),
    domain(scb.run_transfer, real("gamma", 0, 1, strict=True), integer("batch0", 1, scb.MAX_STAGE_BATCH),
           draws={"batch0": 64}, build=lambda p, rng: _stage(p, rng, "stage2"), raises=OUTCOMES),
    domain(scb.context_sample, integer("n_contexts", 4), draws=_cheap(), fixed={"n_batches": 2}),
    domain(scb.reduced_noise, real("alpha_V"), real("alpha_Q"), build=_contexts,
           draws={"alpha_V": (-2, 2), "alpha_Q": (-2, 2)}),
    domain(scb.stage1_noise_band, real("eta", 0, None, strict=True), integer("batch", 1, scb.MAX_STAGE_BATCH),
           integer("steps", 1, MAX_STEPS), build=_contexts, draws=_cheap(), raises=OUTCOMES,
           accepts={"batch": (math.inf,)}),
    domain(scb.offline_errors, build=_scb_run),
    domain(scb.population, *scb.POPULATION_OPTIONS, draws=_cheap(), raises=OUTCOMES),
    domain(scb.minibatch, *scb.MINIBATCH_OPTIONS, draws=_cheap(), raises=OUTCOMES),
]


def _rk4_rhs():
    from attnflow.closed_forms import gd_beta as gd_cf
    return gd_cf.gradient_flow_rhs


_GD = gd_beta.GDBetaProblem.isotropic(2)
