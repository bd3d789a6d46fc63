"""Li, Rawat & Oymak (NeurIPS 2024): every closed form against brute-force Monte Carlo of its raw definition (or an
exact identity), input validation, the models' gradients, reproducibility, and the claims (they pass at quick
settings and fail when the theory is broken)."""
import dataclasses

import numpy as np
import pytest

import attnflow.closed_forms.linear_attention_h3 as cf
import attnflow.dynamics.linear_attention_h3 as dyn
from attnflow import run_claim, select
from attnflow.closed_forms.linear_attention_h3 import H3Problem
from attnflow.validation import linear_attention_h3 as claims

from .conftest import assert_figure_is_clean, assert_within_standard_errors

N_PROMPTS = 200_000


def _mc(problem, predict, seed, count=N_PROMPTS):
    return dyn.monte_carlo_risk(problem, predict, count, seed=seed)


def _heteroscedastic_drift_problem(rng, d=3, n=6):
    def psd(size):
        A = rng.standard_normal((size, size))
        return A @ A.T / size + 0.3 * np.eye(size)

    return H3Problem(H=psd(d), Psi=psd(d), sigma2=0.2, n=n, noise=rng.uniform(0.1, 2, n), drift=0.2 * psd(n),
                     Delta=psd(d))


# ---- golden constants (docs/linear_attention_h3.md §4.3, §5.3, §6.4, §7.4) -----------------------------------------

def test_golden_setting_a():
    problem = cf.golden_setting_a()
    assert np.allclose(problem.psi, [0.939736, 0.449442, 0.120822], atol=1e-6)
    assert cf.optimal_risk(problem) == pytest.approx(0.7491710, abs=1e-7)
    assert cf.low_rank_optimal_risk(problem, 1) == pytest.approx(1.0685641, abs=1e-7)
    assert cf.low_rank_optimal_risk(problem, 2) == pytest.approx(0.7901852, abs=1e-7)
    assert np.allclose(cf.optimal_preconditioner(problem), [[.102680, -.035019, .011561], [-.035019, .110816, -.018728],
                                                            [.011561, -.018728, .097995]], atol=1e-6)


def test_golden_low_rank_lora_weighting_and_correlated():
    problem = cf.golden_setting_d()
    assert np.allclose([cf.low_rank_optimal_risk(problem, r) for r in range(5)],
                       [3.5, 1.874800, 1.402650, 1.270297, 1.141575], atol=1e-6)
    old = H3Problem(H=np.eye(4), Psi=np.diag([1, 1, .5, .5]), sigma2=0.1, n=10)
    W0 = cf.optimal_preconditioner(old)
    new = old.replace(Psi=np.diag([1, 1, .5, 1.5]))
    assert np.allclose([cf.lora_optimal_risk(new, W0, r) for r in (1, 2, 3, 4)],
                       [1.433030, 1.429509, 1.426178, 1.422847], atol=1e-6)
    het = H3Problem(H=np.eye(4), Psi=np.eye(4), sigma2=0.1, n=10, noise=[10.0] * 5 + [0.1] * 5)
    assert cf.h3_optimum(het)[0] == pytest.approx(1.8288136, abs=1e-7)
    assert cf.attention_optimum(het)[0] == pytest.approx(2.1049875, abs=1e-7)
    drift = H3Problem(H=np.eye(4), Psi=np.eye(4), sigma2=0.1, n=10, drift=cf.random_walk_drift(10, 0.3))
    assert cf.h3_optimum(drift)[0] == pytest.approx(2.7466044, abs=1e-7)
    rag = H3Problem(H=np.eye(5), Psi=np.eye(5), sigma2=0.2, n=10, design="rag", alpha=0.5)
    assert cf.correlated_moments(rag).B == pytest.approx(4281.25)
    assert cf.correlated_optimum(rag)[0] == pytest.approx(1.5503650, abs=1e-7)
    assert cf.correlated_optimum(rag.replace(design="tfa"))[0] == pytest.approx(1.8469957, abs=1e-7)


# ---- closed forms against Monte Carlo of the raw definitions -----------------------------------------------------

def test_pgd_risk_matches_monte_carlo():
    problem = cf.golden_setting_a()
    W = cf.optimal_preconditioner(problem) + np.random.default_rng(1).standard_normal((3, 3)) / 20
    mc = _mc(problem, lambda p: dyn.pgd_predict(p, W), seed=2)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.pgd_risk(problem, W))


def test_optimal_risk_matches_monte_carlo_and_the_excess_form():
    problem = cf.golden_setting_a()
    W_star = cf.optimal_preconditioner(problem)
    mc = _mc(problem, lambda p: dyn.pgd_predict(p, W_star), seed=3)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.optimal_risk(problem))
    W = W_star + np.random.default_rng(4).standard_normal((3, 3)) / 30
    assert cf.pgd_risk(problem, W) - cf.optimal_risk(problem) == pytest.approx(cf.pgd_excess_risk(problem, W),
                                                                               rel=1e-10)


def test_wpgd_risk_with_drift_and_heteroscedastic_noise_matches_monte_carlo():
    rng = np.random.default_rng(5)
    problem = _heteroscedastic_drift_problem(rng)
    omega = rng.uniform(0.2, 1.5, problem.n)
    W = cf.optimal_weighted_preconditioner(problem, omega) + rng.standard_normal((3, 3)) / 30
    mc = _mc(problem, lambda p: dyn.wpgd_predict(p, W, omega), seed=6)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.wpgd_risk(problem, W, omega))


def test_gradient_second_moment_matches_monte_carlo():
    rng = np.random.default_rng(7)
    problem = _heteroscedastic_drift_problem(rng)
    omega = rng.uniform(0.2, 1.5, problem.n)
    prompts = dyn.sample_prompts(problem, N_PROMPTS, np.random.default_rng(8))
    g = np.einsum("bid,bi,i->bd", prompts.X, prompts.y, omega)
    samples = g[:, :, None] * g[:, None, :]
    assert_within_standard_errors(samples.mean(0), samples.std(0, ddof=1) / np.sqrt(N_PROMPTS),
                                  cf.gradient_second_moment(problem, omega))


def test_optimal_weighted_risk_matches_monte_carlo():
    rng = np.random.default_rng(9)
    problem = _heteroscedastic_drift_problem(rng)
    omega = rng.uniform(0.2, 1.5, problem.n)
    W = cf.optimal_weighted_preconditioner(problem, omega)
    mc = _mc(problem, lambda p: dyn.wpgd_predict(p, W, omega), seed=10)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.optimal_risk_for_weights(problem, omega))


def test_low_rank_optimum_matches_monte_carlo():
    problem = cf.golden_setting_d()
    W = cf.low_rank_preconditioner(problem, 2)
    assert np.linalg.matrix_rank(W, tol=1e-10) == 2
    mc = _mc(problem, lambda p: dyn.pgd_predict(p, W), seed=11)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.low_rank_optimal_risk(problem, 2))


def test_lora_update_attains_the_formula_in_monte_carlo():
    old = H3Problem(H=np.eye(4), Psi=np.diag([1, 1, .5, .5]), sigma2=0.1, n=10)
    new = old.replace(Psi=np.diag([1, 1, .5, 1.5]))
    W0 = cf.optimal_preconditioner(old)
    Delta = cf.lora_optimal_update(new, W0, 1)
    assert np.linalg.matrix_rank(Delta, tol=1e-10) == 1
    mc = _mc(new, lambda p: dyn.pgd_predict(p, W0 + Delta), seed=12)
    assert_within_standard_errors(mc.mean, mc.standard_error, cf.lora_optimal_risk(new, W0, 1))


@pytest.mark.parametrize("noise, rho2", [([10.0] * 3 + [0.1] * 3, 0.0), (None, 0.3)])
def test_h3_and_attention_optima_match_monte_carlo(noise, rho2):
    problem = H3Problem(H=np.eye(3), Psi=np.eye(3), sigma2=0.1, n=6, noise=noise,
                        drift=cf.random_walk_drift(6, rho2) if rho2 else None)
    L_h3, v = cf.h3_optimum(problem)
    L_att, c = cf.attention_optimum(problem)
    h3 = _mc(problem, lambda p: dyn.wpgd_predict(p, np.eye(3), v), seed=13)
    att = _mc(problem, lambda p: dyn.pgd_predict(p, c * np.eye(3)), seed=14)
    assert_within_standard_errors([h3.mean, att.mean], [h3.standard_error, att.standard_error], [L_h3, L_att])
    assert L_h3 < L_att
    # the optimum over general (W, ω) is no lower than the isotropic closed form
    assert cf.optimal_risk_for_weights(problem, v) == pytest.approx(L_h3, rel=1e-12)


def test_heteroscedastic_closed_forms_equal_the_linear_solve():
    problem = H3Problem(H=np.eye(3), Psi=np.eye(3), sigma2=0.2, n=7, noise=np.linspace(0.1, 5, 7))
    forms = cf.heteroscedastic_optima(problem)
    L_h3, v = cf.h3_optimum(problem)
    assert forms["h3"] == pytest.approx(L_h3, rel=1e-12)
    assert forms["attention"] == pytest.approx(cf.attention_optimum(problem)[0], rel=1e-12)
    assert np.allclose(forms["weights"], v / v.sum(), rtol=1e-12)


@pytest.mark.parametrize("design", ["rag", "tfa"])
def test_correlated_moments_match_monte_carlo(design):
    problem = H3Problem(H=np.eye(4), Psi=np.eye(4), sigma2=0.3, n=6, design=design, alpha=0.6)
    moments = cf.correlated_moments(problem)

    def draw(rng, m):
        p = dyn.sample_prompts(problem, m, rng)
        u = dyn.pgd_predict(p, np.eye(4))
        return np.stack([p.y_query * u, u * u, p.y_query**2], axis=1)

    prompts = draw(np.random.default_rng(15), N_PROMPTS)
    assert_within_standard_errors(prompts.mean(0), prompts.std(0, ddof=1) / np.sqrt(N_PROMPTS),
                                  [moments.A, moments.B, moments.query_second_moment])
    L_star, c_star = cf.correlated_optimum(problem)
    mc = _mc(problem, lambda p: dyn.pgd_predict(p, c_star * np.eye(4)), seed=16)
    assert_within_standard_errors(mc.mean, mc.standard_error, L_star)


def test_correlated_designs_reduce_to_iid_at_alpha_zero():
    for design in ("rag", "tfa"):
        problem = H3Problem(H=np.eye(5), Psi=np.eye(5), sigma2=0.4, n=9, design=design, alpha=0.0)
        iid = H3Problem(H=np.eye(5), Psi=np.eye(5), sigma2=0.4, n=9)
        assert cf.correlated_optimum(problem)[0] == pytest.approx(cf.optimal_risk(iid), rel=1e-12)
        assert cf.effective_sample_size(problem, cf.correlated_optimum(problem)[0]) == pytest.approx(9, rel=1e-10)


def test_rag_risk_floor_is_the_large_n_limit():
    problem = H3Problem(H=np.eye(6), Psi=np.eye(6), sigma2=0.1, n=10, design="rag", alpha=0.5)
    far = cf.isotropic_correlated_optimum("rag", 6, 10**8, 0.5, 0.1)[0]
    assert far == pytest.approx(cf.rag_risk_floor(problem), abs=1e-6)
    assert cf.rag_risk_floor(problem) > problem.sigma2 + 0.1


def test_trace_free_shift_gives_a_low_rank_change_of_the_optimum():
    problem = cf.golden_setting_d()
    u, w = np.eye(4)[0] + 0.3, np.eye(4)[2] - 0.2
    shift = 0.05 * (np.outer(u, u) - (u @ problem.H @ u) / (w @ problem.H @ w) * np.outer(w, w))
    new = problem.replace(Psi=problem.Psi + shift)
    singular = np.linalg.svd(cf.optimal_preconditioner(new) - cf.optimal_preconditioner(problem), compute_uv=False)
    assert singular[2] < 1e-12 * singular[0]


# ---- the reductions (exact identities) and the models' gradients -----------------------------------------------------

def test_optimal_attention_construction_is_the_pgd_optimum():
    """W_qW_kᵀ = [[nW*, 0], [0, 0]], v = e_{d+1} gives exactly the PGD predictor with W* (docs/linear_attention_h3.md
    §3.2), and its even part vanishes on every prompt."""
    problem = cf.golden_setting_a()
    d, n = problem.d, problem.n
    W_star = cf.optimal_preconditioner(problem)
    Wq = np.zeros((d + 1, d + 1))
    Wq[:d, :d] = n * W_star
    Wk, v = np.eye(d + 1), np.eye(d + 1)[d]
    prompts = dyn.sample_prompts(problem, 100, np.random.default_rng(17))
    assert np.allclose(dyn.attention_forward(dyn.token_matrices(prompts), Wq, Wk, v),
                       dyn.pgd_predict(prompts, W_star), atol=1e-13)


PUBLIC_GRADIENTS = {"attention": dyn.attention_batch_gradient, "h3": dyn.h3_batch_gradient,
                    "pgd": lambda prompts, W: (lambda out: (out[0], (out[1],)))(dyn.pgd_batch_gradient(prompts, W))}


@pytest.mark.parametrize("model", ["attention", "h3", "pgd"])
def test_minibatch_gradients_are_the_derivatives_of_the_loss(model):
    """The public minibatch gradients (the ones train steps on) against central differences of the minibatch loss
    computed from the forward passes."""
    problem = cf.golden_setting_a()
    rng = np.random.default_rng(18)
    prompts = dyn.sample_prompts(problem, 9, rng)
    Z = dyn.token_matrices(prompts)
    net = dyn.make_model(model, problem, rng)
    if model == "pgd":
        net.params[0][:] = rng.standard_normal((3, 3)) / 10
    loss, grads = PUBLIC_GRADIENTS[model](prompts, *net.params)
    model_loss, model_grads = net.gradient(prompts, Z)
    assert loss == model_loss and all(np.array_equal(a, b) for a, b in zip(grads, model_grads))
    forward = {"attention": lambda ps: dyn.attention_forward(Z, *ps), "h3": lambda ps: dyn.h3_forward(Z, *ps),
               "pgd": lambda ps: dyn.pgd_predict(prompts, ps[0])}[model]
    assert loss == pytest.approx(np.mean((forward(net.params) - prompts.y_query) ** 2), rel=1e-12)
    for k, grad in enumerate(grads):
        for index in [tuple(rng.integers(0, s) for s in grad.shape) for _ in range(3)]:
            step = np.zeros_like(net.params[k])
            step[index] = 1e-6
            plus = [p + step if j == k else p for j, p in enumerate(net.params)]
            minus = [p - step if j == k else p for j, p in enumerate(net.params)]
            numeric = (np.mean((forward(plus) - prompts.y_query) ** 2)
                       - np.mean((forward(minus) - prompts.y_query) ** 2)) / 2e-6
            assert grad[index] == pytest.approx(numeric, rel=1e-5, abs=1e-8)


def test_public_minibatch_gradients_refuse_bad_shapes():
    problem = cf.golden_setting_a()
    prompts = dyn.sample_prompts(problem, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="W must have shape"):
        dyn.pgd_batch_gradient(prompts, np.zeros((4, 4)))
    with pytest.raises(ValueError, match="Wk must have shape"):
        dyn.attention_batch_gradient(prompts, np.zeros((4, 4)), np.zeros((4, 3)), np.zeros(4))
    with pytest.raises(ValueError, match="f must have shape"):
        dyn.h3_batch_gradient(prompts, *(np.zeros((4, 4)),) * 3, np.zeros(3))
    with pytest.raises(ValueError, match="prompts.y_query"):
        dyn.pgd_batch_gradient(dataclasses.replace(prompts, y_query=np.zeros(3)), np.zeros((3, 3)))


@pytest.mark.parametrize("model, optimizer, final_fraction", [("attention", "adam", None), ("h3", "sgd", 0.02),
                                                               ("pgd", "adam", 0.02)])
def test_a_train_run_is_reproduced_by_hand_from_the_documented_seed_split(model, optimizer, final_fraction):
    """docs/linear_attention_h3.md §8.1: the seed's two children (spawn keys (0,) and (1,) of an integer seed) seed the
    initial weights (§8.2) and the batches, one sample_prompts per step, each step the optimiser's on the public
    minibatch gradient; train's default decay is the optimisers' FINAL_FRACTION. The run is rebuilt bit for bit."""
    from attnflow.dynamics.optimizers import FINAL_FRACTION, OPTIMIZERS
    problem = cf.golden_setting_a()
    seed, steps, batch_size, lr = 7, 15, 32, 0.02 if optimizer == "adam" else 0.002
    options = {} if final_fraction is None else dict(final_fraction=final_fraction)
    run = dyn.train(problem, model, seed=seed, steps=steps, batch_size=batch_size, lr=lr, optimizer=optimizer,
                    **options)
    init_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    data_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    D, n = problem.d + 1, problem.n
    if model == "pgd":
        params = [np.zeros((problem.d, problem.d))]
    elif model == "attention":  # W_q, W_k ~ 0.3·N(0, 1), v = (0.1·N(0, I_d), 1)
        params = [0.3 * init_rng.standard_normal((D, D)), 0.3 * init_rng.standard_normal((D, D)),
                  0.1 * init_rng.standard_normal(D)]
        params[2][-1] = 1.0
    else:  # W_q, W_k, W_v ~ 0.3·N(0, 1), f = 0.3 + 0.01·N(0, I_{n+1})
        params = [0.3 * init_rng.standard_normal((D, D)) for _ in range(3)]
        params.append(0.3 + 0.01 * init_rng.standard_normal(n + 1))
    opt = OPTIMIZERS[optimizer](params, lr, steps, final_fraction if final_fraction is not None else FINAL_FRACTION)
    for _ in range(steps):
        _, grads = PUBLIC_GRADIENTS[model](dyn.sample_prompts(problem, batch_size, data_rng), *params)
        opt.step(list(grads))
    for name, value in zip(dyn.PARAMETER_NAMES[model], params):
        assert np.array_equal(run.final[name], value), name
    if final_fraction is None:  # the default really is the shared constant: another fraction gives other weights
        other = dyn.train(problem, model, seed=seed, steps=steps, batch_size=batch_size, lr=lr, optimizer=optimizer,
                          final_fraction=0.02)
        assert not np.array_equal(other.final["Wq"], run.final["Wq"])


def test_protocol_decay_is_what_minibatch_runs():
    problem = cf.golden_setting_a()
    a = dyn.minibatch(problem, seed=3, steps=10, batch_size=16)
    b = dyn.train(problem, "attention", seed=3, steps=10, batch_size=16, final_fraction=dyn.PROTOCOL_FINAL_FRACTION)
    assert all(np.array_equal(a.final[k], b.final[k]) for k in a.final)


def test_sigma2_is_the_query_noise_and_the_default_example_noise():
    """sigma2 is σ_q² always and every σ_i² in the homogeneous design; the closed forms written with s refuse
    per-example noise (they would silently use sigma2 for the examples)."""
    iid = cf.golden_setting_a()
    assert iid.query_noise == iid.sigma2 and np.all(iid.example_noise == iid.sigma2)
    hetero = iid.replace(noise=np.linspace(0.1, 2.0, iid.n))
    assert hetero.query_noise == iid.sigma2 and np.array_equal(hetero.example_noise, np.linspace(0.1, 2.0, iid.n))
    for function in (cf.low_rank_optimal_risk, cf.low_rank_preconditioner):
        with pytest.raises(ValueError, match="noise and drift must be absent"):
            function(hetero, 1)


def test_risk_gradient_is_the_derivative_of_the_risk():
    rng = np.random.default_rng(19)
    problem = _heteroscedastic_drift_problem(rng)
    omega, W = rng.uniform(0.2, 1.5, problem.n), rng.standard_normal((3, 3)) / 10
    gradient = cf.pgd_risk_gradient(problem, W, omega)
    for index in [(0, 0), (1, 2), (2, 1)]:
        step = np.zeros((3, 3))
        step[index] = 1e-6
        numeric = (cf.wpgd_risk(problem, W + step, omega) - cf.wpgd_risk(problem, W - step, omega)) / 2e-6
        assert gradient[index] == pytest.approx(numeric, rel=1e-6)


def test_flow_reaches_the_optimum_at_the_predicted_rate():
    problem = cf.golden_setting_a()
    run = dyn.population_trajectory(problem)
    assert run.last("distance") < 1e-9
    assert np.all(np.diff(run.metrics["risk"]) <= 1e-12)
    assert run.info["n_steps"] < 2000  # a linear ODE: a solver-cost budget that catches a slowdown


def test_correlated_flow_is_the_exact_scalar_flow():
    problem = H3Problem(H=np.eye(4), Psi=np.eye(4), sigma2=0.2, n=6, design="rag", alpha=0.5)
    run = dyn.population(problem)
    m = cf.correlated_moments(problem)
    from scipy.integrate import solve_ivp
    ode = solve_ivp(lambda _, c: 2 * m.A - 2 * m.B * c, (0, run.times[-1]), [0.0], t_eval=run.times, rtol=1e-10,
                    atol=1e-14, method="LSODA")  # stiff: the rate 2B is large
    assert np.allclose(run.states["c"], ode.y[0], rtol=1e-6, atol=1e-12)
    assert run.last("excess_risk") < 1e-12


# ---- inputs ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    (dict(Psi=np.array([[1.0, 2.0], [2.0, 1.0]])), "Psi must be positive semi-definite"),
    (dict(H=np.array([[1.0, 0.0], [0.0, -1.0]])), "H must be positive semi-definite"),
    (dict(H=np.array([[1.0, 0.0], [0.0, 0.0]])), "H must be positive definite"),
    (dict(sigma2=-0.1), "sigma2 must be >= 0"),
    (dict(Psi=np.eye(3)), "Psi must be 2x2"),
    (dict(noise=[0.1, 0.2]), r"noise must have shape \(4,\)"),
    (dict(noise=[0.1, -0.2, 0.1, 0.1]), "noise must hold variances >= 0"),
    (dict(drift=np.eye(3)), "drift must be 4x4"),
    (dict(design="retrieval"), "design must be one of"),
    (dict(design="rag", alpha=1.5), "alpha must be <= 1"),
    (dict(design="rag", H=np.diag([1.0, 2.0])), "H and Psi must be the identity"),
    (dict(n=0), "n must be >= 1"),
])
def test_bad_inputs_are_refused_naming_the_parameter(changes, message):
    fields = dict(H=np.eye(2), Psi=np.eye(2), sigma2=0.1, n=4)
    fields.update(changes)
    with pytest.raises(ValueError, match=message):
        H3Problem(**fields)


def test_bad_ranks_and_shapes_are_refused():
    problem = cf.golden_setting_a()
    with pytest.raises(ValueError, match="r must be <= d = 3"):
        cf.low_rank_optimal_risk(problem, 4)
    with pytest.raises(ValueError, match="r must be <= d = 3"):
        cf.lora_optimal_risk(problem, np.zeros((3, 3)), 5)
    with pytest.raises(ValueError, match=r"W0 must have shape \(3, 3\)"):
        cf.lora_optimal_risk(problem, np.zeros((2, 2)), 1)
    with pytest.raises(ValueError, match="W must have shape"):
        cf.pgd_risk(problem, np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"omega must have shape \(8,\)"):
        cf.wpgd_risk(problem, np.zeros((3, 3)), np.ones(3))
    with pytest.raises(ValueError, match="W must be finite"):
        cf.pgd_risk(problem, np.full((3, 3), np.nan))


def test_from_params_parses_text_and_refuses_bad_values():
    problem = H3Problem.from_params({"H": "1,.3;.3,.8", "Psi": "1,0.5", "n": "6", "sigma2": "0.1", "rho2": "0.2"})
    assert problem.d == 2 and problem.n == 6 and problem.drift[0, 0] == pytest.approx(0.2 * 6)
    assert H3Problem.from_params({"design": "rag", "alpha": "0.4", "d": "5"}).alpha == 0.4
    for values, message in [({"sigma2": "-1"}, "sigma2 must be >= 0"), ({"n": "2.5"}, "n must be an integer"),
                            ({"H": "1,2;2,1"}, "H must be positive semi-definite"),
                            ({"d": "3", "Psi": "1,2"}, "Psi must have d = 3 diagonal entries"),
                            ({"noise": "1,2", "n": "3"}, r"noise must have shape \(3,\)"),
                            ({"design": "x"}, "design must be one of"), ({"bogus": "1"}, "unknown")]:
        with pytest.raises(ValueError, match=message):
            H3Problem.from_params(values)


def test_training_refuses_bad_options_and_reports_divergence():
    problem = cf.golden_setting_a()
    with pytest.raises(ValueError, match="must be one of"):
        dyn.train(problem, "mamba", seed=0, steps=2)
    with pytest.raises(ValueError, match="W0 must be given"):
        dyn.train(problem, "lora", seed=0, steps=2)
    from attnflow.dynamics.errors import DivergenceError
    with pytest.raises(DivergenceError, match="diverged at step"):
        dyn.train(problem, "pgd", seed=0, steps=200, lr=1e3, optimizer="sgd")


# ---- reproducibility -------------------------------------------------------------------------------------------------

def test_same_seed_same_numbers():
    problem = cf.golden_setting_a()
    a = dyn.train(problem, "h3", seed=3, steps=20)
    b = dyn.train(problem, "h3", seed=3, steps=20)
    c = dyn.train(problem, "h3", seed=4, steps=20)
    assert np.array_equal(a.metrics["risk"], b.metrics["risk"]) and not np.array_equal(a.metrics["risk"],
                                                                                         c.metrics["risk"])
    c1 = select(["linear_attention_h3.pgd_risk_formula"])[0]
    assert run_claim(c1, seed=5, n_prompts=2000).measured == run_claim(c1, seed=5, n_prompts=2000).measured


# ---- the claims ------------------------------------------------------------------------------------------------

def test_every_claim_holds_at_quick_settings():
    results = [run_claim(c, seed=0) for c in select(["linear_attention_h3"])]
    assert len(results) >= 20
    assert all(r.as_registered for r in results), [(r.name, r.status, r.notes[:200]) for r in results
                                                   if not r.as_registered]
    assert {r.name for r in results if r.status == "FINDING"} == set(claims.FINDINGS)
    for result in results:
        assert_figure_is_clean(result)


def test_risk_claim_fails_when_the_closed_form_is_wrong(monkeypatch):
    real = cf.pgd_risk
    monkeypatch.setattr(cf, "pgd_risk", lambda problem, W: 1.05 * real(problem, W))
    assert run_claim(select(["linear_attention_h3.pgd_risk_formula"])[0], seed=0).status == "FAIL"


def test_h3_claim_fails_when_the_weighting_optimum_is_wrong(monkeypatch):
    real = cf.h3_optimum
    monkeypatch.setattr(cf, "h3_optimum", lambda problem: (real(problem)[0] * 0.97, real(problem)[1]))
    assert run_claim(select(["linear_attention_h3.heteroscedastic_optima"])[0], seed=0).status == "FAIL"


def test_low_rank_claim_fails_when_the_spectral_formula_is_wrong(monkeypatch):
    real = cf.low_rank_optimal_risk
    monkeypatch.setattr(cf, "low_rank_optimal_risk", lambda problem, r: real(problem, r) - 1e-3)
    assert run_claim(select(["linear_attention_h3.low_rank_optimum"])[0], seed=0).status == "FAIL"


def test_rag_claim_fails_when_a_moment_is_wrong(monkeypatch):
    real = cf.correlated_moments

    def off(problem):
        m = real(problem)
        return cf.CorrelatedMoments(A=m.A, B=1.03 * m.B, query_second_moment=m.query_second_moment, D1=m.D1, D2=m.D2)

    monkeypatch.setattr(cf, "correlated_moments", off)
    assert run_claim(select(["linear_attention_h3.rag_moments"])[0], seed=0).status == "FAIL"


def test_kappa_finding_turns_to_fail_if_the_multiplier_held(monkeypatch):
    """If the exact effective sample size were κn the registered finding would no longer reproduce: FAIL."""
    monkeypatch.setattr(cf, "effective_sample_size",
                        lambda problem, risk: cf.alignment_multiplier(problem.d, problem.alpha) * problem.n)
    assert run_claim(select(["linear_attention_h3.alignment_multiplier_fixed_alpha"])[0], seed=0).status == "FAIL"


def test_training_claim_fails_when_training_is_too_short():
    result = run_claim(select(["linear_attention_h3.trained_attention_reaches_optimum"])[0], seed=0, steps=30)
    assert result.status == "FAIL"


def test_monte_carlo_chunks_are_bounded_in_memory_and_unchanged_where_they_fit():
    """A chunk of prompts holds at most CHUNK_FLOATS example numbers: at n = 2000, d = 20 (rag_risk_floor --full)
    the old 50 000-prompt chunk asked for 16 GB per array and the run was killed at 24 GB. Where a chunk fits (every
    quick setting) it is the one asked for, so the generators and the numbers are those of before."""
    big = H3Problem(H=np.eye(20), Psi=np.eye(20), sigma2=0.2, n=2000)
    small = H3Problem(H=np.eye(5), Psi=np.eye(5), sigma2=0.2, n=200)
    assert dyn.bounded_chunk(big, 50_000) == 1250 and 1250 * 2000 * 20 <= dyn.CHUNK_FLOATS
    assert dyn.bounded_chunk(small, 50_000) == 50_000
    from attnflow.dynamics.montecarlo import prompt_risk

    predict = lambda p: dyn.pgd_predict(p, np.eye(5) / 200)  # noqa: E731
    bounded = dyn.monte_carlo_risk(small, predict, 3000, seed=1, chunk=1000)
    direct = prompt_risk(lambda rng, m: dyn.sample_prompts(small, m, rng), predict, 3000, seed=1, chunk=1000)
    assert bounded == direct  # a chunk that fits is passed through as asked: the same generators, the same bits
