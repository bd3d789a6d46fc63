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
DEEP_CLAIMS = ["gd_beta.deep_mlp_table1"]


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
        def loss(p):
            return jnp.mean((deep.gpt_predict(p, tokens, config) - target) ** 2)

        grads = [np.asarray(g) for g in jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(params))]
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


SMOKE = {"gd_beta.deep_mlp_table1": dict(d=2, N=6, layers=1, heads=1, width=8, batch=16, steps=60, lr=3e-3,
                                         test_prompts=400)}


@needs_jax
@pytest.mark.parametrize("name", DEEP_CLAIMS)
def test_the_smoke_setting_of_each_deep_claim_runs_and_draws(name):
    """The claims' machinery at a few seconds' size: every number finite, the figure drawn. Verdicts at this size
    mean nothing, so they are not asserted."""
    result = run_claim(systems.select([name])[0], seed=0, **SMOKE[name])
    assert result.status in ("PASS", "FAIL", "FINDING"), result.notes
    figure = result.figure()
    assert figure.axes
