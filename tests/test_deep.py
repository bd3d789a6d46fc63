"""The deep tier (docs/deep.md): the JAX decoder against the core's closed forms, its gradients, its seeding, the
tier's selection and the smoke setting of its claims. Skipped only when JAX is not installed (CI installs it)."""
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from attnflow.closed_forms import gd_beta as cf
from attnflow.dynamics import gd_beta as dyn
from attnflow.validation import systems
from attnflow.validation.claims import run_claim

HAVE_JAX = importlib.util.find_spec("jax") is not None and importlib.util.find_spec("optax") is not None
needs_jax = pytest.mark.skipif(not HAVE_JAX, reason="attnflow[deep] (jax, optax) is not installed")
DEEP_CLAIMS = ["gd_beta.deep_mlp_table1", "scb.deep_softmax_stages", "one_nn.deep_trained_attention",
               "one_nn.deep_decoder_under_shift"]


def _lsa_problem():
    H = np.array([[1.0, 0.3], [0.3, 0.6]])
    Psi = np.array([[0.8, -0.2], [-0.2, 0.5]])
    return cf.GDBetaProblem(H=H, Psi=Psi, beta_star=np.array([1.0, -0.5]), sigma2=0.25, N=10)


def _bridge(jax, problem, net):
    """The JAX decoder configured as one block of linear self-attention (3.4), with attnflow's weights."""
    import jax.numpy as jnp

    from attnflow.dynamics import deep

    d = problem.d
    w = dict(zip(net.names, net.params))
    config = deep.GPTConfig(layers=1, heads=1, width=d + 1, mlp=False, attention="linear", layer_norm=False,
                            mask="context", embed=False)
    params = dict(blocks=[dict(wq=jnp.asarray(w["WQ"]), wk=jnp.asarray(w["WK"]), wv=jnp.asarray(w["WV"]),
                               wo=jnp.asarray(w["WP"]))])
    return config, params


@needs_jax
def test_one_linear_attention_block_is_lsa_loss_gradient_and_risk():
    """The bridge between the tiers: in float64, the JAX model's minibatch loss and gradient equal the core's
    (dynamics.gd_beta's LSA in its four weight matrices) to round-off, and its mean squared error over fresh prompts
    equals the closed-form risk (readout_risk, docs/gd_beta.md §6) within 4 Monte-Carlo standard errors."""
    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        import jax.numpy as jnp

        from attnflow.dynamics import deep

        problem = _lsa_problem()
        rng = np.random.default_rng(3)
        net = dyn.make_model("lsa_weights", problem, rng, init_scale=0.5)
        config, params = _bridge(jax, problem, net)
        batch = dyn.sample_prompts(problem, 128, rng)
        tokens = jnp.asarray(np.swapaxes(dyn.token_matrices(batch), 1, 2))

        def loss(p):
            return jnp.mean((deep.gpt_predict(p, tokens, config) - batch.y_query) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        core_loss, core_grads = net.gradient(batch)
        assert float(value) == pytest.approx(core_loss, rel=1e-13, abs=1e-13)
        names = dict(WQ="wq", WK="wk", WV="wv", WP="wo")
        for name, core in zip(net.names, core_grads):
            np.testing.assert_allclose(np.asarray(grads["blocks"][0][names[name]]), core, rtol=1e-11, atol=1e-13)
        test = dyn.sample_prompts(problem, 200_000, rng)
        errors = (np.asarray(deep.gpt_predict(params, jnp.asarray(np.swapaxes(dyn.token_matrices(test), 1, 2)),
                                              config)) - test.y_query) ** 2
        z = (errors.mean() - net.risk()) / (errors.std(ddof=1) / np.sqrt(errors.size))
        assert abs(z) < 4, z
    finally:
        jax.config.update("jax_enable_x64", False)


@needs_jax
@pytest.mark.parametrize("attention, mask, embed", [("softmax", "causal", True), ("linear", "context", False)])
def test_the_decoders_gradient_matches_finite_differences(attention, mask, embed):
    """Central differences in float64 along random directions, for a two-block decoder with MLP and LayerNorm."""
    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        import jax.numpy as jnp

        from attnflow.dynamics import deep

        config = deep.GPTConfig(layers=2, heads=2, width=8, mlp=True, attention=attention, mask=mask, embed=embed,
                                layer_norm=embed)
        params = deep.init_gpt(deep.jax_key(1), config, 4, 6, scale=0.3)
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), params)
        rng = np.random.default_rng(0)
        tokens = jnp.asarray(rng.standard_normal((5, 6, 4)))
        target = jnp.asarray(rng.standard_normal(5))

        @jax.jit
        @jax.value_and_grad
        def loss_and_gradient(p):  # one compiled program for the values and the gradient
            return jnp.mean((deep.gpt_predict(p, tokens, config) - target) ** 2)

        def loss(p):
            return loss_and_gradient(p)[0]

        grads = [np.asarray(g) for g in jax.tree_util.tree_leaves(loss_and_gradient(params)[1])]
        leaves, tree = jax.tree_util.tree_flatten(params)
        leaves = [np.asarray(x) for x in leaves]  # the perturbations in numpy: no op-by-op compiles
        for trial in range(3):
            direction = [rng.standard_normal(np.shape(x)) for x in leaves]
            h = 1e-5
            plus = jax.tree_util.tree_unflatten(tree, [x + h * v for x, v in zip(leaves, direction)])
            minus = jax.tree_util.tree_unflatten(tree, [x - h * v for x, v in zip(leaves, direction)])
            numeric = (float(loss(plus)) - float(loss(minus))) / (2 * h)
            analytic = sum(float(np.vdot(g, v)) for g, v in zip(grads, direction))
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-9)
    finally:
        jax.config.update("jax_enable_x64", False)


@needs_jax
def test_training_is_reproducible_from_its_seed():
    from attnflow.validation import deep

    problem = deep.regression_problem(2, 6, 0.1, 1.0)
    config = deep._regression_config("label_slot", True, 1, 1, 8, 2)
    first, second, other = (deep.train_regression(problem, config, seed=seed, steps=40, batch=16, lr=1e-2, chunk=20)
                            for seed in (5, 5, 6))
    assert np.array_equal(first.losses, second.losses)
    leaves = [np.asarray(x) for x in __import__("jax").tree_util.tree_leaves(first.params)]
    again = [np.asarray(x) for x in __import__("jax").tree_util.tree_leaves(second.params)]
    assert all(np.array_equal(a, b) for a, b in zip(leaves, again))
    assert not np.array_equal(first.losses, other.losses)


def test_the_deep_claims_register_without_running_and_stay_out_of_the_default_suite():
    core = {c.name for c in systems.select([])}
    deep = {c.name for c in systems.select([], tier="deep")}
    assert set(DEEP_CLAIMS) <= deep and not deep & core
    assert {c.name for c in systems.select(["gd_beta"])} <= core
    assert [c.name for c in systems.select(["gd_beta.deep_mlp_table1"])] == ["gd_beta.deep_mlp_table1"]
    assert {c.name for c in systems.select([], tier="all")} == core | deep
    with pytest.raises(ValueError, match="--tier must be one of"):
        systems.select([], tier="shallow")


def test_list_and_check_select_the_tier():
    run = [sys.executable, "-m", "attnflow.validation.cli"]
    listed = subprocess.run([*run, "list", "--tier", "deep", "--json"], capture_output=True, text=True, check=True)
    names = [c["name"] for s in json.loads(listed.stdout)["systems"] for c in s["claims"]]
    assert set(names) == set(DEEP_CLAIMS)
    default = subprocess.run([*run, "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in default for name in DEEP_CLAIMS)


def test_a_deep_claim_without_jax_is_a_one_line_error():
    """JAX hidden from the interpreter: `attnflow check --tier deep` says how to install the extra, exit 2."""
    code = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda name, *a: None if name in ('jax', 'optax') else real(name, *a); "
            "from attnflow.validation.cli import main; sys.exit(main(['check', '--tier', 'deep', '--no-store', "
            "'--no-progress']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "attnflow: error: attnflow[deep] is not installed: pip install -e '.[deep]'"


ONE_NN_SMOKE = dict(d=3, N=4, sigma=3.0, eta=1.5, batch=32, steps=40, checkpoints=(20, 40), delta=0.1,
                    test_prompts=300)
SMOKE = {"gd_beta.deep_mlp_table1": dict(d=2, N=6, layers=1, heads=1, width=8, batch=16, steps=60, lr=3e-3,
                                         test_prompts=400, architectures=("label_slot",)),
         "scb.deep_softmax_stages": dict(N=4, sparsity=2, Ts=(8, 16), softmax_step=16.0, batch=256, steps=30),
         "one_nn.deep_trained_attention": ONE_NN_SMOKE,
         "one_nn.deep_decoder_under_shift": dict(ONE_NN_SMOKE, layers=1, heads=1, width=8, lr=3e-3)}


@needs_jax
@pytest.mark.parametrize("name", DEEP_CLAIMS)
def test_the_smoke_setting_of_each_deep_claim_runs_and_draws(name):
    """The claims' machinery at a few seconds' size: every number finite, the figure drawn. Verdicts at this size
    mean nothing, so they are not asserted."""
    result = run_claim(systems.select([name])[0], seed=0, **SMOKE[name])
    assert result.status in ("PASS", "FAIL", "FINDING"), result.notes
    figure = result.figure()
    assert figure.axes


@needs_jax
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_scb_model_loss_and_preconditioned_gradients_match_the_closed_forms(attention):
    """Brute force of the raw data model (1) through the JAX model (2): the mean minibatch loss equals the population
    risk (docs/scb.md §4) and the mean preconditioned gradients equal (4) of the closed forms (Lemma B.8; for softmax
    the chain rule through the softmax's Jacobian, docs/deep.md §3), each within 4.5 standard errors of the
    batch-to-batch spread (60 batches, t with 59 degrees of freedom, Bonferroni over ≤ 49 entries: nominal
    false-fail rate about 2e-3)."""
    import jax.numpy as jnp

    from attnflow.closed_forms import scb as cf_scb
    from attnflow.closed_forms.scb import SCBProblem
    from attnflow.dynamics import deep

    problem = SCBProblem.random(4, 8, 2, seed=1)
    rng = np.random.default_rng(2)
    V0, Q0 = problem.initial_point()
    V = V0 + 0.6 * (problem.P - V0) + 0.05 * (np.eye(4) - 0.25)  # a generic point off the line
    Q = Q0 + 0.4 * (problem.Q_star - Q0)
    if attention == "softmax":
        A = np.log(Q) + rng.standard_normal(Q.shape) * 0.1
        Q = deep.softmax_columns(A)
    else:
        A = Q
    G_V, G_Q = cf_scb.preconditioned_gradients(problem, V, Q)
    if attention == "softmax":
        _, grad_Q = cf_scb.raw_gradients(problem, V, Q)
        G_Q = Q * (grad_Q - (Q * grad_Q).sum(axis=0, keepdims=True)) / problem.mu
    mu = jnp.asarray(problem.mu, jnp.float32)
    values, gradients_V, gradients_A = [], [], []
    for _ in range(60):
        batch = {k: jnp.asarray(v) for k, v in deep.scb_samples(problem, 4000, rng).items()}
        value, g_V, g_A = deep.scb_preconditioned_gradients(jnp.asarray(V, jnp.float32), jnp.asarray(A, jnp.float32),
                                                             batch, mu, attention)
        values.append(float(value))
        gradients_V.append(np.asarray(g_V))
        gradients_A.append(np.asarray(g_A))
    for samples, exact in ((np.array(values), cf_scb.population_risk(problem, V, Q)), (np.array(gradients_V), G_V),
                           (np.array(gradients_A), G_Q)):
        se = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
        z = (samples.mean(axis=0) - exact) / np.maximum(se, 1e-7)
        assert np.max(np.abs(z)) < 4.5, (np.max(np.abs(z)), exact)


@needs_jax
def test_scb_training_follows_the_population_map_with_a_large_batch():
    """One trained path per attention at T = 8 on the same batches: its excess risk stays within 0.05 of the
    population map's, which goes below 0.5. The minibatch deviation is O(B^{-1/2}) (docs/scb.md C10): 0.010 (linear)
    and 0.008 (softmax) at this seed, so the bound is a smoke check of the plumbing, not a calibrated test; the
    gradients' unbiasedness is the calibrated test above."""
    from attnflow.closed_forms.scb import SCBProblem
    from attnflow.dynamics import deep
    from attnflow.validation.deep import _excess_and_alpha, _replay

    problem = SCBProblem.random(4, 8, 2, seed=1)
    rng = np.random.default_rng(4)
    batch, steps = 4000, 20
    samples = deep.scb_samples(problem, steps * batch, rng)
    V0, Q0 = problem.initial_point()
    for attention, A0, scale in (("linear", Q0, 1.0), ("softmax", np.zeros_like(Q0), 16.0)):
        eta_V, eta_A = 0.25 / problem.K_Q, scale * 0.25 / problem.K_P
        run = deep.scb_train(V0, A0, _replay(samples, batch), steps, mu=problem.mu, eta_V=eta_V, eta_A=eta_A,
                             attention=attention)
        Q_run = run["A"] if attention == "linear" else deep.softmax_columns(run["A"])
        population = deep.scb_population_path(problem, attention, steps, eta_V=eta_V, eta_A=eta_A)
        trained, _ = _excess_and_alpha(problem, run["V"], Q_run)
        theory, _ = _excess_and_alpha(problem, population["V"], population["Q"])
        assert theory[-1] < 0.5 and np.max(np.abs(trained - theory)) < 0.05, (attention, trained, theory)
