"""The claims framework: selection, seeding, the ERROR safety net, and claims that can fail."""
import numpy as np
import pytest

import attnflow.closed_forms.gd_beta as cf
from attnflow import Claim, Outcome, run_claim, select
from attnflow.validation import systems


def _fake(function, quick=None, finding=""):
    return Claim("fake.claim", "nowhere", "a claim for testing", function, quick or {}, {}, finding)


def test_select_systems_claims_and_aliases():
    everything = select([])
    system = select(["gd-beta"])
    assert [c.name for c in system] == [c.name for c in select(["gd_beta"])]
    assert {c.name for c in system} <= {c.name for c in everything}
    assert [c.name for c in select(["gd_beta.lsa_gap", "gd-beta.lsa_gap"])] == ["gd_beta.lsa_gap"]
    with pytest.raises(ValueError, match="unknown claim or system 'scb.nope'"):
        select(["scb.nope"])


def test_every_claim_states_its_reference_and_has_both_settings():
    """Both settings name the same knobs; a deterministic check on a fixed toy may have none (nothing to scale)."""
    for c in systems.registry().values():
        assert c.reference and c.statement, c.name
        assert isinstance(c.quick, dict) and isinstance(c.full, dict), c.name
        assert set(c.quick) == set(c.full), c.name


def test_a_non_finite_measurement_is_an_error_not_a_pass():
    result = run_claim(_fake(lambda seed: Outcome({"x": float("nan")}, {"x": 1.0}, "t", "b", passed=True)), seed=0)
    assert result.status == "ERROR" and "not finite" in result.notes


def test_a_crashing_claim_is_reported():
    def boom(seed):
        raise RuntimeError("kaput")

    result = run_claim(_fake(boom), seed=0)
    assert result.status == "ERROR" and "kaput" in result.notes


def test_a_registered_finding_is_its_own_outcome():
    """A claim whose paper statement is known not to hold: FINDING while it fails as documented, FAIL if the
    statement starts to hold, ERROR still wins over both."""
    def outcome(passed, x=1.0):
        return lambda seed: Outcome({"x": x}, {"x": 1.0}, "t", "b", passed=passed)

    found = run_claim(_fake(outcome(False), finding="it does not hold; docs §1"), seed=0)
    assert found.status == "FINDING" and found.as_registered and not found.passed
    assert found.to_dict()["finding"] == "it does not hold; docs §1"
    gone = run_claim(_fake(outcome(True), finding="it does not hold; docs §1"), seed=0)
    assert gone.status == "FAIL" and not gone.as_registered and "did not reproduce" in gone.notes
    broken = run_claim(_fake(outcome(False, x=float("nan")), finding="f"), seed=0)
    assert broken.status == "ERROR"


def test_an_interrupt_inside_a_kernel_stops_the_run_instead_of_becoming_an_error():
    """numba turns Ctrl-C inside compiled code into a SystemError whose context is the KeyboardInterrupt."""
    def interrupted(seed):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("<built-in function kernel> returned a result with an exception set")

    with pytest.raises(KeyboardInterrupt):
        run_claim(_fake(interrupted), seed=0)


def test_unknown_override_is_rejected():
    with pytest.raises(ValueError, match="has no setting"):
        run_claim(_fake(lambda seed, n: None, quick=dict(n=1)), seed=0, m=2)


def test_claim_seed_depends_on_seed_and_name_only():
    c = select(["gd_beta.risk_formula"])[0]
    assert c.seed_sequence(3).generate_state(2).tolist() == c.seed_sequence(3).generate_state(2).tolist()
    assert c.seed_sequence(3).generate_state(2).tolist() != c.seed_sequence(4).generate_state(2).tolist()


def test_same_seed_same_numbers():
    c = select(["gd_beta.bayes_factor_needs_bounded_snr"])[0]
    a, b = run_claim(c, seed=5, n_contexts=2000), run_claim(c, seed=5, n_contexts=2000)
    assert a.measured == b.measured and a.details == b.details


# ---- claims can fail: break the closed form, the claim must notice --------------------------------------
def test_risk_claim_fails_when_the_closed_form_is_wrong(monkeypatch):
    real = cf.icl_risk
    monkeypatch.setattr(cf, "icl_risk", lambda *args: 1.05 * real(*args))
    result = run_claim(select(["gd_beta.risk_formula"])[0], seed=0)
    assert result.status == "FAIL"


def test_optimum_claim_fails_when_gamma_star_is_wrong(monkeypatch):
    real = cf.optimal_gamma
    monkeypatch.setattr(cf, "optimal_gamma", lambda problem: 0.98 * real(problem))
    result = run_claim(select(["gd_beta.optimal_parameters"])[0], seed=0, n_starts=1, n_prompts=2000)
    assert result.status == "FAIL"


def test_flow_claim_fails_when_the_predicted_rate_is_wrong(monkeypatch):
    real = cf.local_rates

    def off(problem):
        rates = real(problem)
        return cf.LocalRates(beta=1.1 * rates.beta, gamma_mode=rates.gamma_mode, gamma_tail=rates.gamma_tail,
                             beta_uniform=rates.beta_uniform)

    monkeypatch.setattr(cf, "local_rates", off)
    assert run_claim(select(["gd_beta.gradient_flow_converges"])[0], seed=0, n_random_starts=0).status == "FAIL"


def test_sgd_claim_fails_when_training_is_too_short():
    result = run_claim(select(["gd_beta.sgd_reaches_optimum"])[0], seed=0, steps=20, seeds=2)
    assert result.status == "FAIL"
    assert all(np.isfinite(v) for v in result.measured.values())


def test_gradient_noise_claim_fails_when_sigma_is_three_percent_off(monkeypatch):
    """Σ's entries have relative standard errors of about 0.5% at the quick setting: a 3% error is six of them."""
    import attnflow.dynamics.gd_beta as dyn
    real = dyn.gradient_noise_covariance
    monkeypatch.setattr(dyn, "gradient_noise_covariance", lambda *args: 1.03 * real(*args))
    result = run_claim(select(["gd_beta.gradient_noise_covariance"])[0], seed=0)
    assert result.status == "FAIL"
    assert result.measured["kernel_relative_error"] < 1e-12


def test_gradient_noise_claim_fails_when_the_raw_gradient_disagrees_with_the_kernel(monkeypatch):
    import attnflow.dynamics.gd_beta as dyn
    real = dyn.minibatch_gradient

    def off(*args):
        loss, g_beta, g_Gamma = real(*args)
        return loss, g_beta * (1 + 1e-9), g_Gamma

    monkeypatch.setattr(dyn, "minibatch_gradient", off)
    result = run_claim(select(["gd_beta.gradient_noise_covariance"])[0], seed=0, n_prompts=100_000,
                       n_contexts=32_000, kernel_prompts=10)
    assert result.status == "FAIL" and result.measured["kernel_relative_error"] > 1e-12


def test_gaussian_proxy_claim_fails_when_the_proxy_spreads_a_third_too_wide(monkeypatch):
    """The proxy's paths pushed 1.3× away from their mean (variance ×1.69) fail at the asserted checkpoints; the
    first checkpoint, the LNA's early transient, is reported and not asserted."""
    import attnflow.dynamics.gd_beta as dyn
    real = dyn.sgd_gaussian_noise_paths

    def wide(*args, **kwargs):
        paths = real(*args, **kwargs)
        return paths.mean(axis=0) + 1.3 * (paths - paths.mean(axis=0))

    monkeypatch.setattr(dyn, "sgd_gaussian_noise_paths", wide)
    result = run_claim(select(["gd_beta.gaussian_noise_proxy"])[0], seed=0, runs=4, paths=32, n_contexts=1000)
    assert result.status == "FAIL"
    assert [row["asserted"] for row in result.details] == [False, True, True]
    assert all(not row["passed"] for row in result.details[1:])
    too_short = run_claim(select(["gd_beta.gaussian_noise_proxy"])[0], seed=0, steps=2, runs=4, paths=8,
                          n_contexts=1000)
    assert too_short.status == "ERROR" and "ValueError: steps must be >= 4" in too_short.notes


def test_algorithm1_claim_fails_at_a_tiny_budget_and_scales_its_batches_with_the_instance():
    c = select(["scb.algorithm1_recovers_ground_truth"])[0]
    small = dict(stage1=(40, 2000), stage2=(150, 500), stage3=(80, 1000))
    result = run_claim(c, seed=0, **small)
    assert result.status == "FAIL"
    assert result.measured["relative_error_q"] > 0.05 or result.measured["relative_error_v"] > 0.05
    # λ and the batches follow K_P: λ = 0.01·K_P/0.1, and the samples are the scaled batches times the steps
    scale = 0.1 / result.measured["k_p"]
    assert result.measured["lambda"] == pytest.approx(0.01 / scale, rel=1e-12)
    expected = sum(steps * round(batch * scale) for steps, batch in small.values())
    assert abs(result.measured["samples"] - expected) <= 3


def test_proximal_claim_fails_when_stage2_is_too_short_and_scales_batch_and_lambda_with_the_instance():
    """Three Stage-2 steps leave SGD no time to drift away from Stage 1's point, so the proximal route does not win."""
    result = run_claim(select(["scb.proximal_beats_sgd"])[0], seed=0, steps=3)
    assert result.status == "FAIL"
    scale = 0.1 / result.measured["k_p"]
    assert result.measured["batch"] == round(1000 * scale)
    assert result.measured["lambda"] == pytest.approx(0.005 / scale, rel=1e-12)


def test_gradient_noise_claim_refuses_bad_settings_naming_them():
    c = select(["gd_beta.gradient_noise_covariance"])[0]
    for settings, name in ((dict(n_prompts=1), "n_prompts must be >= 2"), (dict(n_prompts=2.5), "n_prompts must be an integer"),
                           (dict(kernel_prompts=0), "kernel_prompts must be >= 1")):
        result = run_claim(c, seed=0, n_contexts=16_000, **settings)
        assert result.status == "ERROR" and f"ValueError: {name}" in result.notes
