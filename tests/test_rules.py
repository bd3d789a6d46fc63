"""Verdict rules: the decision, the sentence and the nominal false-FAIL rate come from the same numbers."""
import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from attnflow.validation import rules
from attnflow.validation.claims import Outcome, Status
from attnflow.validation.stats import two_sided_p


def test_each_rule_decides_at_its_boundary_as_its_sentence_says():
    assert rules.round_off(1e-13, 1e-12, what="gap", basis="b").passed
    assert not rules.round_off([1e-13, 1e-12], 1e-12, what="gap", basis="b").passed  # strict: at the level fails
    assert rules.at_most(0.05, 0.05, what="r", basis="b").passed
    assert not rules.at_most(0.05, 0.05, what="r", basis="b", strict=True).passed
    assert rules.at_least([0.99, 1.0], 0.99, what="s", basis="b").passed
    assert not rules.at_least([0.99, 1.0], 0.99, what="s", basis="b", strict=True).passed
    assert rules.at_least(0.97, 0.95, what="upper bound", basis="b", false_fail_rate=0.025).false_fail_rate == 0.025
    assert rules.exponent([-0.495, -0.515], -0.5, [0.01, 0.02], what="slope", basis="b").passed
    assert not rules.exponent([-0.495, -0.53], -0.5, [0.01, 0.02], what="slope", basis="b").passed
    assert rules.z_test([3.9, -3.9], what="mean").passed and not rules.z_test([4.0], what="mean").passed
    assert rules.z_test([-9.0], what="excess", one_sided=True).passed
    assert not rules.z_test([4.1], what="excess", one_sided=True).passed
    assert rules.at_most(1.0, 2.0, what="gap", basis="b").tolerance == "gap ≤ 2"
    assert rules.round_off(0.0, 1e-9, what="gap", basis="b").tolerance == "gap < 1e-09"
    assert rules.exponent(-0.5, -0.5, 0.05, what="slope", basis="b").tolerance == "|slope + 0.5| ≤ 0.05"


def test_rates_come_from_the_same_k_and_count():
    rule = rules.z_test(np.zeros(3), what="three means", k=3.0)
    assert rule.false_fail_rate == pytest.approx(3 * two_sided_p(3.0))
    assert "each of 3 comparisons" in rule.tolerance and "3 Monte-Carlo standard errors" in rule.basis
    one_sided = rules.z_test(0.0, what="excess", k=3.0, one_sided=True)
    assert one_sided.false_fail_rate == pytest.approx(scipy_stats.norm.sf(3.0))
    t = rules.t_test([0.0, 0.0], 9, what="seed-means", k=4.0)
    assert t.false_fail_rate == pytest.approx(2 * 2 * scipy_stats.t.sf(4.0, 9))
    assert rules.round_off(0.0, 1e-12, what="x", basis="b").false_fail_rate is None
    corrected = rules.z_test([0.0, 0.0], what="skewed means", rate_corrections=[1e-4, 2e-4], basis_note="Edgeworth")
    assert corrected.false_fail_rate == pytest.approx(2 * two_sided_p(4.0) + 3e-4) and "Edgeworth" in corrected.basis
    with pytest.raises(ValueError, match="one per comparison"):
        rules.z_test([0.0, 0.0], what="m", rate_corrections=[1e-4])
    quantile = rules.t_quantile_test([0.0, 0.0], 9, 0.01, what="means")
    assert quantile.false_fail_rate == pytest.approx(0.02)
    bound = scipy_stats.t.isf(0.005, 9)
    assert not rules.t_quantile_test([bound], 9, 0.01, what="m").passed
    assert rules.t_quantile_test([np.nextafter(bound, 0)], 9, 0.01, what="m").passed
    built_from_ses = rules.at_most(0.5, 1.0, what="|gap|", basis="b", strict=True, false_fail_rate=6e-5)
    assert built_from_ses.passed and built_from_ses.false_fail_rate == 6e-5
    assert rules.at_most(0.5, 1.0, what="|gap|", basis="b").false_fail_rate is None
    at_edge = dict(fitted=-0.25, predicted=-0.5, tolerance=0.25, what="s", basis="b")  # |−0.25 + 0.5| = 0.25 exactly
    assert rules.exponent(**at_edge).passed and not rules.exponent(**at_edge, strict=True).passed


def test_the_nominal_rate_of_a_z_test_is_its_failure_rate_when_the_theory_holds():
    """Draw z from the null (standard normal) in many trials: the fraction of FAILs matches the stated rate
    within 4 binomial standard errors (k = 2 keeps the rate measurable: 4.6% per comparison, 3 comparisons)."""
    rng = np.random.default_rng(20261128)
    trials = 20_000
    failures = sum(not rules.z_test(rng.standard_normal(3), what="null", k=2.0).passed for _ in range(trials))
    exact = 1 - (1 - two_sided_p(2.0)) ** 3  # independent comparisons: the union bound is close above it
    assert rules.z_test(np.zeros(3), what="null", k=2.0).false_fail_rate >= exact
    se = np.sqrt(exact * (1 - exact) / trials)
    assert abs(failures / trials - exact) < 4 * se


def test_all_of_joins_decisions_sentences_bases_and_rates():
    exact = rules.round_off(0.0, 1e-12, what="identity", basis="exact")
    sampled = rules.z_test([1.0, 5.0], what="means")
    joined = rules.all_of(exact, sampled)
    assert not joined.passed and joined.tolerance == f"{exact.tolerance}; {sampled.tolerance}"
    assert joined.basis == f"exact; {sampled.basis}" and joined.false_fail_rate == sampled.false_fail_rate
    assert (exact & exact).basis == "exact" and (exact & exact).false_fail_rate is None
    with pytest.raises(ValueError, match="at least one rule"):
        rules.all_of()


def test_an_outcome_takes_its_verdict_from_its_rule_or_by_hand_never_both():
    rule = rules.z_test(1.0, what="mean")
    outcome = Outcome({"z": 1.0}, {"z": 0.0}, rule=rule)
    assert (outcome.passed, outcome.tolerance, outcome.basis, outcome.false_fail_rate) == (
        rule.passed, rule.tolerance, rule.basis, rule.false_fail_rate)
    with pytest.raises(ValueError, match="give none of them by hand"):
        Outcome({"z": 1.0}, {"z": 0.0}, passed=True, rule=rule)
    with pytest.raises(ValueError, match="needs a rule"):
        Outcome({"z": 1.0}, {"z": 0.0}, tolerance="|z| < 4", basis="4 SE")


def test_statuses_are_their_text_and_carry_their_meaning():
    assert Status.PASS == "PASS" and f"{Status.FINDING}" == "FINDING" and json.dumps([Status.ERROR]) == '["ERROR"]'
    assert Status("FAIL") is Status.FAIL and Status.FINDING.as_registered and not Status.FAIL.as_registered
    assert all(status.meaning for status in Status)


def test_within_decides_each_value_against_its_own_interval():
    rule = rules.within([0.9, 1.2], [0.8, 0.7], [1.1, 1.2], what="ratio", basis="b", false_fail_rate=1e-3)
    assert rule.passed and rule.false_fail_rate == 1e-3  # the family's rate, as given
    assert rule.tolerance == ("ratio inside its interval in each of 2 comparisons (lower ends 0.7 to 0.8, upper "
                              "1.1 to 1.2)")
    shared = rules.within([0.9, 1.0], [-1e-8, -1e-8], [2.0, 2.0], what="gap", basis="b")
    assert shared.tolerance == "gap inside its interval in each of 2 comparisons (lower ends -1e-08, upper 2)"
    assert not rules.within([0.9, 1.2], [0.8, 0.7], [1.1, 1.2], what="ratio", basis="b", strict=True).passed
    symmetric = rules.within([0.5, -3.0], [-2.0, -4.0], [2.0, 4.0], what="z", basis="b", strict=True)
    assert symmetric.passed and symmetric.tolerance == "z inside its interval in each of 2 comparisons (±2 to 4)"
    single = rules.within(-1.0, -1.2, -0.9, what="exponent", basis="b")
    assert single.passed and single.tolerance == "exponent in [-1.2, -0.9]"
    assert not rules.within(np.nan, -1.0, 1.0, what="z", basis="b").passed


def test_independent_parts_combine_their_rates_exactly():
    """Parts testing independent samples fail together with probability 1 − Π(1 − rᵢ): checked by simulation
    against the union bound, which overstates it."""
    p = 0.2
    parts = [rules.condition(True, "x", basis="b", false_fail_rate=p) for _ in range(3)]
    assert rules.all_of(*parts, independent=True).false_fail_rate == pytest.approx(1 - 0.8**3)
    assert rules.all_of(*parts).false_fail_rate == pytest.approx(0.6)
    draws = np.random.default_rng(3).random((200_000, 3)) < p
    assert draws.any(axis=1).mean() == pytest.approx(1 - 0.8**3, abs=4 * np.sqrt(0.488 * 0.512 / 200_000))
    assert rules.all_of(rules.round_off(0.0, 1e-12, what="g", basis="b"), independent=True).false_fail_rate is None


def test_a_lower_bound_carries_the_rate_of_its_exact_test():
    """A confidence bound tested against a level: deterministic given the data, its rate is the test's."""
    bound = rules.at_least(0.91, 0.9, what="CP lower bound", basis="b", false_fail_rate=4e-11)
    assert bound.passed and bound.false_fail_rate == 4e-11 and bound.tolerance == "CP lower bound ≥ 0.9"
    assert not rules.at_least(0.9, 0.9, what="CP lower bound", basis="b", strict=True, false_fail_rate=4e-11).passed
    assert rules.at_least(0.91, 0.9, what="s", basis="b").false_fail_rate is None
    assert rules.all_of(bound, rules.condition(True, "x", basis="b")).false_fail_rate == 4e-11


HAND_WRITTEN = ("passed", "tolerance", "basis", "false_fail_rate")


def _hand_written_verdicts(source: str) -> list[int]:
    """Lines of the ``Outcome(...)`` calls in ``source`` that give any of HAND_WRITTEN by hand."""
    import ast

    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Outcome"
            and any(keyword.arg in HAND_WRITTEN for keyword in node.keywords)]


def test_the_scan_finds_a_verdict_written_by_hand():
    assert _hand_written_verdicts("Outcome(measured={}, predicted={}, passed=True, tolerance='t', basis='b')") == [1]
    assert _hand_written_verdicts("claims.Outcome(measured={},\n predicted={}, false_fail_rate=0.1)") == [1]
    assert _hand_written_verdicts("Outcome(measured={}, predicted={}, rule=rule)") == []


def test_every_built_in_claim_says_its_verdict_as_rules():
    """No built-in paper writes a pass decision, tolerance, basis or rate by hand: each comes from a rule (a plugin
    still may, see docs/adding-a-paper.md)."""
    import inspect
    from pathlib import Path

    from attnflow.validation import systems

    modules = {Path(inspect.getsourcefile(claim.function)) for claim in systems.registry().values()
               if claim.function.__module__.startswith("attnflow.")}
    found = {path.name: _hand_written_verdicts(path.read_text(encoding="utf-8")) for path in sorted(modules)}
    assert len(found) == len(systems.system_keys()) + 1  # each paper's module and the deep tier's
    assert {name: lines for name, lines in found.items() if lines} == {}
