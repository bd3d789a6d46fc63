"""GD-β numerics: sampler, minibatch gradients, training, gradient flow, reproducibility and divergence."""
import numpy as np
import pytest

import attnflow.closed_forms.gd_beta as cf
from attnflow.closed_forms.gd_beta import GDBetaProblem
from attnflow.dynamics import gd_beta as dyn
from attnflow.dynamics.integrate import DivergenceError
from attnflow.dynamics.montecarlo import monte_carlo_mean

from .conftest import assert_within_standard_errors


@pytest.fixture
def problem():
    return GDBetaProblem.random(2, 5, seed=0, sigma2=0.3, beta_norm=1.2)


def test_sampler_reproduces_the_data_model(problem):
    prompts = dyn.sample_prompts(problem, 200_000, np.random.default_rng(1))
    beta = prompts.beta
    assert_within_standard_errors(beta.mean(0), beta.std(0) / np.sqrt(len(beta)), problem.beta_star)
    x = prompts.x_query
    second = x[:, :, None] * x[:, None, :]
    assert_within_standard_errors(second.mean(0), second.std(0) / np.sqrt(len(x)), problem.H)
    noise = prompts.y_query - np.einsum("nd,nd->n", x, beta)
    assert_within_standard_errors(np.mean(noise**2), np.std(noise**2) / np.sqrt(len(noise)), problem.sigma2)
    assert prompts.X.flags.c_contiguous and prompts.x_query.flags.c_contiguous


def _numpy_batch_loss_gd_beta(p, beta0, Gamma):
    return np.mean((cf.gd_beta_predict(p.X, p.y, p.x_query, beta0, Gamma) - p.y_query) ** 2)


def test_gd_beta_batch_gradient_matches_finite_differences(problem):
    p = dyn.sample_prompts(problem, 64, np.random.default_rng(2))
    rng = np.random.default_rng(3)
    beta0, Gamma = rng.normal(size=2), rng.normal(size=(2, 2))
    loss, g_beta, g_Gamma = dyn._gd_beta_batch_gradient(p.X, p.y, p.x_query, p.y_query, beta0, Gamma)
    assert loss == pytest.approx(_numpy_batch_loss_gd_beta(p, beta0, Gamma), rel=1e-12)
    h = 1e-6
    for i in range(2):
        e = np.zeros(2)
        e[i] = h
        fd = (_numpy_batch_loss_gd_beta(p, beta0 + e, Gamma) - _numpy_batch_loss_gd_beta(p, beta0 - e, Gamma)) / (2 * h)
        assert g_beta[i] == pytest.approx(fd, rel=1e-6, abs=1e-9)
        for j in range(2):
            E = np.zeros((2, 2))
            E[i, j] = h
            fd = (_numpy_batch_loss_gd_beta(p, beta0, Gamma + E) - _numpy_batch_loss_gd_beta(p, beta0, Gamma - E)) / (2 * h)
            assert g_Gamma[i, j] == pytest.approx(fd, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("model", ["ltb", "lsa", "ltb_weights", "lsa_weights"])
def test_attention_gradients_match_finite_differences_of_the_forward_pass(problem, model):
    """Chain rule through the products and the factors, against the full token-matrix forward pass (3.3)."""
    net = dyn.make_model(model, problem, np.random.default_rng(4), 0.5, value_init="random")
    p = dyn.sample_prompts(problem, 32, np.random.default_rng(5))
    E = dyn.token_matrices(p)

    def loss():
        U, V, K = net.products()
        return np.mean((cf.ltb_forward(E, U, V, K, mlp=net.mlp) - p.y_query) ** 2)

    kernel_loss, grads = net.gradient(p)
    assert kernel_loss == pytest.approx(loss(), rel=1e-12)
    h = 1e-6
    for param, grad in zip(net.params, grads):
        for index in np.ndindex(param.shape):
            saved = param[index]
            param[index] = saved + h
            up = loss()
            param[index] = saved - h
            down = loss()
            param[index] = saved
            assert grad[index] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-8)


def test_attention_model_risk_matches_monte_carlo(problem):
    """The exact risk reported during training is the sampled risk of the same parameters."""
    net = dyn.make_model("ltb_weights", problem, np.random.default_rng(6), 0.5)
    U, V, K = net.products()
    mc = dyn.monte_carlo_risk(problem, lambda p: cf.ltb_forward(dyn.token_matrices(p), U, V, K), 100_000, seed=7)
    assert_within_standard_errors(mc.mean, mc.standard_error, net.risk())


def test_training_is_reproducible_and_reaches_the_optimum(problem):
    a = dyn.minibatch_trajectory(problem, "gd_beta", 64, 300, seed=5)
    b = dyn.minibatch_trajectory(problem, "gd_beta", 64, 300, seed=5)
    c = dyn.minibatch_trajectory(problem, "gd_beta", 64, 300, seed=6)
    np.testing.assert_array_equal(a.metrics["risk"], b.metrics["risk"])
    assert not np.array_equal(a.metrics["risk"], c.metrics["risk"])
    assert a.metrics["risk"][-1] < 1.02 * cf.optimal_risk(problem)
    assert a.states["Gamma"].shape == (len(a.times), 2, 2)


def test_training_divergence_names_the_step(problem):
    with pytest.raises(DivergenceError, match=r"diverged at step \d+"):
        dyn.minibatch_trajectory(problem, "gd_beta", 8, 200, seed=0, lr=1e6, optimizer="sgd")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="mlp"), "model must be one of"),
        (dict(optimizer="lbfgs"), "optimizer must be one of"),
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(steps=-1), "steps must be >= 1"),
        (dict(lr=0.0), "lr must be > 0"),
        (dict(value_init="ones"), "value_init must be one of"),
        (dict(seed=-3), "seed must be a non-negative integer"),
    ],
)
def test_training_bad_input(problem, kwargs, message):
    args = dict(model="ltb", batch_size=8, steps=5, seed=0) | kwargs
    with pytest.raises(ValueError, match=message):
        dyn.minibatch_trajectory(problem, **args)


@pytest.mark.parametrize("rank_H", [3, 2])
def test_gradient_flow_reaches_the_theorem_6_3_limit(rank_H):
    problem = GDBetaProblem.random(3, 8, seed=9, sigma2=0.5, rank_H=rank_H)
    rng = np.random.default_rng(10)
    beta0, Gamma = rng.normal(size=3), rng.normal(size=(3, 3))
    run = dyn.population_trajectory(problem, beta0, Gamma)
    beta_inf, Gamma_inf = cf.flow_limit(problem, beta0, Gamma)
    np.testing.assert_allclose(run.states["beta0"][-1], beta_inf, atol=1e-8)
    np.testing.assert_allclose(run.states["Gamma"][-1], Gamma_inf, atol=1e-8)
    assert np.max(np.diff(run.metrics["risk"])) <= 1e-12
    assert run.metrics["excess_risk"][-1] == pytest.approx(0.0, abs=1e-10)


def test_gradient_flow_matches_scipy_lsoda():
    """Differential test of the whole pipeline (packing, kernel, engine) against scipy's LSODA."""
    from scipy.integrate import solve_ivp

    problem = GDBetaProblem.random(2, 6, seed=3)
    params = cf.pack_flow_params(problem)
    run = dyn.population_trajectory(problem, t_end=20.0, n_points=20)
    ref = solve_ivp(lambda t, y: cf.gradient_flow_rhs(t, y, params), (0, 20.0), np.zeros(6), method="LSODA",
                    t_eval=run.times, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(np.concatenate([run.states["beta0"], run.states["Gamma"].reshape(20, 4)], axis=1),
                               ref.y.T, atol=1e-7)


def test_gradient_flow_bad_start(problem):
    with pytest.raises(ValueError, match="beta0 must have shape"):
        dyn.population_trajectory(problem, beta0=np.zeros(3))
    with pytest.raises(ValueError, match="t_end must be > 0"):
        dyn.population_trajectory(problem, t_end=-1.0)


def test_monte_carlo_mean_is_reproducible_and_unbiased():
    draw = lambda rng, m: rng.normal(2.0, 1.0, size=m)  # noqa: E731
    a = monte_carlo_mean(draw, 10_000, seed=3, chunk=3000)
    b = monte_carlo_mean(draw, 10_000, seed=3, chunk=3000)
    assert a == b
    assert_within_standard_errors(a.mean, a.standard_error, 2.0)
    assert a.standard_error == pytest.approx(0.01, rel=0.05)
