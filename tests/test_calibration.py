"""`attnflow calibrate`: a claim's false-FAIL rate over seeds, with its exact interval, against its nominal rate."""
import json

import jsonschema
import pytest

import attnflow.closed_forms.gd_beta as cf
from attnflow.validation import calibration, report
from attnflow.validation.calibration import Calibration
from attnflow.validation.cli import main
from attnflow.validation.stats import clopper_pearson

CLAIM = "gd_beta.risk_formula"  # stochastic (Monte Carlo against the closed form), about a second per seed


def _found(alarms, seeds, nominal):
    low, high = clopper_pearson(alarms, seeds)
    return Calibration("x.y", seeds, alarms, 0, nominal, low, high, seeds, 0)


def _verdict(alarms, seeds, nominal):
    return _found(alarms, seeds, nominal).calibrated


@pytest.fixture
def few_seeds_tell(monkeypatch):
    """The table's mechanics (resuming, carrying, witnesses) are exercised on 2 or 3 seeds, which the verdict rightly
    calls too few; these tests lift the ceiling so that such a row counts as calibrated."""
    monkeypatch.setattr(calibration, "CEILING", 1.0)


@pytest.mark.parametrize("alarms, seeds, nominal, verdict", [
    (0, 200, 6.3e-5, "calibrated"),      # nothing to see at the resolution of 200 seeds
    (2, 200, 6.3e-5, "MISCALIBRATED"),   # [0.0012, 0.036] lies wholly above 6.3e-5
    (1, 200, 6.3e-5, "MISCALIBRATED"),   # [1.3e-4, 0.028] lies above 6.3e-5: one alarm in 200 has probability 1.3%
    (1, 200, 0.01, "calibrated"),        # [1.3e-4, 0.028] covers 1%, and 0.5% is below it
    (12, 200, 0.05, "MISCALIBRATED"),    # 6% is more than the nominal 5% although the interval [3.1%, 10.2%] covers it
    (9, 200, 0.05, "calibrated"),
    (136, 1526, 0.05, "MISCALIBRATED"),  # the rate measured for a miscalibrated claim: 8.9%, [7.5%, 10.4%]
    (0, 50, None, "calibrated"),         # a deterministic check that never fails
    (1, 50, None, "MISCALIBRATED"),      # … and one that did
    (0, 6, 1e-3, "too few seeds"),       # [0, 46%]: six clean seeds cannot tell 0.1% from 40%
    (0, 6, None, "too few seeds"),
    (0, 20, 1e-3, "calibrated"),         # [0, 16.8%]: the fewest seeds a published row may rest on
    (1, 20, 0.05, "too few seeds"),      # [0.13%, 24.9%] covers 5%, and 5% is not above it, but reaches 20%
    (3, 6, 1e-3, "MISCALIBRATED"),       # what few seeds show is shown: [12%, 88%] lies above 0.1%
])
def test_the_verdict_follows_the_stated_rule(alarms, seeds, nominal, verdict):
    found = _found(alarms, seeds, nominal)
    assert found.verdict == verdict and found.calibrated is (verdict == "calibrated")
    assert found.as_dict()["seeds_needed"] == (calibration.seeds_needed(alarms) if verdict == "too few seeds"
                                              else None)


def test_too_few_seeds_names_how_many_would_tell():
    """Without a failure the exact upper end is 1 − (α/2)^(1/n): it falls below 20% from n = 17 on (16 seeds:
    1 − 0.025^(1/16) = 20.6%, 17: 19.5%). With one failure in n it is the (1 − α/2) quantile of Beta(2, n − 1),
    whose tail 1 − F(x) = (1 − x)^(n−1) (1 + (n − 1) x) is ≤ 2.5% at x = 20% from n = 26 on."""
    assert [1 - 0.025 ** (1 / n) < calibration.CEILING for n in (16, 17)] == [False, True]
    assert calibration.seeds_needed(0) == 17
    tail = [(1 - 0.2) ** (n - 1) * (1 + (n - 1) * 0.2) for n in (25, 26)]
    assert tail[0] > 0.025 >= tail[1] and calibration.seeds_needed(1) == 26
    assert _found(0, 6, 1e-3).verdict == "too few seeds" and _found(0, 17, 1e-3).verdict == "calibrated"
    assert _found(0, 200, 1e-3).verdict == "calibrated"


def test_a_sound_claim_is_calibrated_and_a_broken_one_is_not(tmp_path, monkeypatch):
    sound = calibration.calibrate(CLAIM, seeds=3, first_seed=0, store=tmp_path / "sound", n_jobs=1)
    assert (sound.seeds, sound.alarms, sound.errors, sound.verdict) == (3, 0, 0, "too few seeds")  # [0, 71%]
    again = calibration.calibrate(CLAIM, seeds=3, first_seed=0, store=tmp_path / "sound", n_jobs=1)
    assert (again.computed, again.reused) == (0, 3)  # resumable: finished seeds are not run twice
    real = cf.icl_risk
    monkeypatch.setattr(cf, "icl_risk", lambda *args: 1.05 * real(*args))
    broken = calibration.calibrate(CLAIM, seeds=3, first_seed=0, store=None, n_jobs=1)
    assert (broken.alarms, broken.verdict) == (3, "MISCALIBRATED")


def test_cli_prints_the_rate_and_exits_by_the_verdict(tmp_path, capsys):
    code = main(["calibrate", CLAIM, "--seeds", "2", "--jobs", "1", "--store", str(tmp_path), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and document["schema"] == "attnflow.calibrate/1"  # two seeds cannot tell
    jsonschema.validate(document, report.json_schema("calibrate"))
    assert document["seeds"] == 2 and document["alarms"] == 0 and document["interval"][0] == 0.0
    assert (document["calibrated"], document["verdict"], document["seeds_needed"]) == (False, "too few seeds", 17)
    assert main(["calibrate", CLAIM, "--seeds", "2", "--jobs", "1", "--store", str(tmp_path)]) == 1
    assert "nominal 0.00019: too few seeds (the interval reaches 20% or more; 17 seeds tell)" in capsys.readouterr().out
    assert main(["calibrate", "gd_beta", "--seeds", "2"]) == 2  # a system is not one claim
    assert main(["calibrate", CLAIM, "--seeds", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err


def test_table_keeps_a_row_per_stochastic_claim_and_skips_deterministic_ones(tmp_path, capsys):
    table = tmp_path / "calibration.md"
    arguments = ["calibrate", "--table", str(table), CLAIM, "attention_svm.single_input_svm", "--seeds", "2",
                 "--jobs", "1", "--store", str(tmp_path / "store"), "--no-progress"]
    assert main(arguments) == 1  # two seeds are too few to call the row calibrated
    captured = capsys.readouterr()
    assert "attention_svm.single_input_svm: deterministic" in captured.err
    rows = calibration.read_table(table)
    assert list(rows) == [CLAIM]
    row = rows[CLAIM]
    assert (row["seeds"], row["alarms"], row["calibrated"], row["verdict"], row["seed"]) == (2, 0, False,
                                                                                               "too few seeds", 0)
    assert row["nominal"] > 0 and len(row["code"]) == 16
    text = table.read_text()
    assert f"| `{CLAIM}` | 2 | 0 | 0 | [0, 84%] | 0.00019 | **too few seeds** (17 needed) |" in text
    assert "0 of 1 claims calibrated" in text
    assert main(arguments) == 1  # a rerun resumes from the store and rewrites the same row
    assert calibration.read_table(table) == rows
    # a row left by a claim that has since become deterministic is removed, and the rerun says so
    calibration.update_table(table, dict(row, claim="attention_svm.single_input_svm"))
    assert main(arguments) == 1
    assert "its old row is removed" in capsys.readouterr().err
    assert calibration.read_table(table) == rows and "0 of 1 claims calibrated" in table.read_text()


def _table_of_three_seeds(tmp_path):
    """A table with one row, CLAIM over seeds 0–2, and the store that holds those seeds: (table, store, row)."""
    table = tmp_path / "calibration.md"
    store = str(tmp_path / "store")
    assert main(["calibrate", "--table", str(table), CLAIM, "--seeds", "3", "--jobs", "1", "--store", store,
                 "--no-progress"]) == 0
    return table, store, calibration.read_table(table)[CLAIM]


def test_verify_carries_a_row_forward_only_when_its_witness_seeds_reproduce(tmp_path, capsys, few_seeds_tell):
    table, store, row = _table_of_three_seeds(tmp_path)
    assert [w[0] for w in row["witnesses"]] == [0, 1] and all(w[1] == "PASS" for w in row["witnesses"])
    verify = ["calibrate", "--table", str(table), "--verify", "--jobs", "1", "--store", str(tmp_path / "fresh")]
    capsys.readouterr()
    assert main(verify) == 0 and f"{CLAIM}: current" in capsys.readouterr().out
    assert len(row["claim_source"]) == 16
    # a row computed by other code whose witness seeds reproduce is carried forward, naming the code that computed it
    calibration.update_table(table, dict(row, code="0" * 16))
    # the witness seeds' records may come from a store written by the calibration itself (other replicate indices)
    verify_in_store = ["calibrate", "--table", str(table), "--verify", "--jobs", "1", "--store", store]
    assert main(verify_in_store + ["gd_beta"]) == 0 and f"{CLAIM}: carried" in capsys.readouterr().out  # a system
    carried = calibration.read_table(table)[CLAIM]
    assert carried == dict(row, computed_by="0" * 16)
    assert f"`{row['code'][:8]}` (`00000000`)" in table.read_text()
    # … but not when what the claim asserts was edited, even if its numbers are the same
    calibration.update_table(table, dict(row, code="0" * 16, claim_source="e" * 16))
    assert main(verify) == 1 and "the claim's own source changed: recalibrate" in capsys.readouterr().out
    # a witness that does not reproduce, or none at all, leaves the row stale and says so
    changed = dict(row, code="1" * 16, witnesses=[row["witnesses"][0], [1, "PASS", "f" * 16]])
    calibration.update_table(table, changed)
    assert main(verify) == 1 and f"{CLAIM}: changed at seed 1: recalibrate" in capsys.readouterr().out
    assert calibration.read_table(table)[CLAIM] == changed
    for missing in ([], [[0, "PASS", None], [1, "PASS", None]], [[0, "PASS"]]):  # none, no digest, malformed
        calibration.update_table(table, dict(changed, witnesses=missing))
        assert main(verify) == 1 and "no witnesses: recalibrate" in capsys.readouterr().out
    # a current row that is not calibrated is reported and fails the command
    calibration.update_table(table, dict(row, alarms=3, rate=1.0, interval=[0.292, 1.0], calibrated=False,
                                         failing_seeds=[0, 1, 2]))
    assert main(verify) == 1 and f"{CLAIM}: current (MISCALIBRATED)" in capsys.readouterr().out
    assert main(["calibrate", CLAIM, "--verify"]) == 2
    assert main(verify + ["gd_beta.lsa_gap"]) == 2 and "no row" in capsys.readouterr().err
    assert main(verify + ["--seeds", "5"]) == 2 and "--seeds and --seed do not apply" in capsys.readouterr().err
    assert main(["calibrate", "--table", str(tmp_path / "none.md"), "--verify"]) == 2
    assert "no calibration table" in capsys.readouterr().err


def test_witnesses_are_kept_per_platform_and_recorded_only_with_the_code_that_computed_the_row(tmp_path, capsys,
                                                                                               few_seeds_tell):
    import numpy

    table, store, row = _table_of_three_seeds(tmp_path)
    here = calibration.platform()
    assert row["platform"] == here and f"numpy {numpy.__version__}" in here
    options = ["--table", str(table), "--jobs", "1", "--store", store]
    verify, rewitness = ["calibrate", "--verify", *options], ["calibrate", "--rewitness", *options]
    # a row whose witnesses were recorded elsewhere: a mismatch here may be the platform's, and the line says so
    elsewhere = dict(row, platform="elsewhere", witnesses=[[0, "PASS", "a" * 16], [1, "PASS", "b" * 16]])
    calibration.update_table(table, dict(elsewhere, code="0" * 16))
    capsys.readouterr()
    assert main(verify) == 1
    line = capsys.readouterr().out.strip()
    assert line == (f"{CLAIM}: changed at seed 0, against witnesses recorded on another platform (elsewhere): "
                    "record this platform's with --rewitness at the code that computed the row, or recalibrate")
    # this platform's witnesses are recorded only with the code that computed the row, never across an edit
    assert main(rewitness) == 1
    assert (f"{CLAIM}: stale: record its witnesses with the code that computed the row, or recalibrate"
            in capsys.readouterr().out)
    calibration.update_table(table, elsewhere)  # the current code
    assert main(rewitness) == 0 and f"{CLAIM}: recorded" in capsys.readouterr().out
    recorded = calibration.read_table(table)[CLAIM]
    assert recorded == dict(elsewhere, platform_witnesses={here: row["witnesses"]})  # the calibration's own seeds
    assert main(rewitness) == 0 and f"{CLAIM}: already recorded" in capsys.readouterr().out
    # … after which an edit is verified here against this platform's witnesses
    calibration.update_table(table, dict(recorded, code="1" * 16))
    assert main(verify) == 0 and f"{CLAIM}: carried" in capsys.readouterr().out
    carried = calibration.read_table(table)[CLAIM]
    assert carried["platform_witnesses"] == {here: row["witnesses"]} and carried["computed_by"] == "1" * 16
    changed = dict(recorded, code="1" * 16, platform_witnesses={here: [row["witnesses"][0], [1, "PASS", "f" * 16]]})
    calibration.update_table(table, changed)
    assert main(verify) == 1 and f"{CLAIM}: changed at seed 1: recalibrate" in capsys.readouterr().out
    # a witness seed whose verdict differs on this platform refuses the record: the row's counts may differ too
    flipped = dict(elsewhere, witnesses=[[0, "FAIL", "a" * 16], [1, "PASS", "b" * 16]])
    calibration.update_table(table, flipped)
    assert main(rewitness) == 1
    assert f"{CLAIM}: seed 0 is PASS on this platform and was FAIL: recalibrate here" in capsys.readouterr().out
    assert calibration.read_table(table)[CLAIM] == flipped
    calibration.update_table(table, dict(elsewhere, claim_source="e" * 16))
    assert main(rewitness) == 1 and "the claim's own source changed: recalibrate" in capsys.readouterr().out
    assert main(rewitness + ["--verify"]) == 2 and "not both" in capsys.readouterr().err
    assert main(rewitness + ["--seed", "3"]) == 2 and "--rewitness reruns" in capsys.readouterr().err
    assert main(["calibrate", CLAIM, "--rewitness"]) == 2 and "give --table" in capsys.readouterr().err


def test_an_unreadable_table_is_named_and_left_alone(tmp_path, capsys):
    table = tmp_path / "calibration.md"
    table.with_suffix(".json").write_text("{truncated")
    assert main(["calibrate", "--table", str(table), CLAIM, "--seeds", "2", "--store", str(tmp_path)]) == 2
    assert "calibration.json cannot be read" in capsys.readouterr().err
    assert table.with_suffix(".json").read_text() == "{truncated"
    assert main(["calibrate", "--table", str(table), "--json", CLAIM]) == 2
    assert main(["calibrate", CLAIM, "gd_beta.lsa_gap"]) == 2  # several claims need a table


@pytest.mark.parametrize("name, setting", [("calibration", "quick"), ("calibration-full", "full")])
def test_the_published_table_is_in_sync_with_its_json_and_names_real_claims(name, setting):
    """docs/calibration.md (quick) and docs/calibration-full.md (full) are generated from their JSON twins; every row
    names a registered claim, ran at the table's setting and at least calibration.MIN_TABLE_SEEDS seeds, and its
    interval and verdict follow from its counts by the stated rule."""
    from pathlib import Path

    from attnflow import select

    table = Path(__file__).resolve().parents[1] / "docs" / f"{name}.md"
    rows = calibration.read_table(table)
    assert rows, f"docs/{name}.json holds no calibration"
    assert {row.get("setting", "quick") for row in rows.values()} == {setting}
    assert table.read_text(encoding="utf-8") == calibration.render_table([rows[name] for name in sorted(rows)])
    for name, row in rows.items():
        assert select([name])[0].name == name
        assert row["seeds"] >= calibration.MIN_TABLE_SEEDS and 0 <= row["alarms"] <= row["seeds"]
        low, high = row["interval"]
        assert (low, high) == pytest.approx(clopper_pearson(row["alarms"], row["seeds"], calibration.LEVEL))
        assert row["calibrated"] is _verdict(row["alarms"], row["seeds"], row["nominal"])
        assert len(row["failing_seeds"]) == row["alarms"]


def test_a_replicate_is_the_run_with_that_seed_and_failing_seeds_are_listed(monkeypatch):
    """Replicate i of a calibration from --seed s is `attnflow check CLAIM --seed s + i`, random instance included
    (the scaling claim draws its instance from the run's seed), so a listed failing seed replays the failure."""
    from attnflow import run_claim, select
    from attnflow.validation import sweep

    claim = "gd_beta.minibatch_gradient_scaling"  # draws its instance from the run's instance seed
    result = sweep.run_replicates(claim, {}, master_seed=7, seeds=2, runs=True, n_jobs=1)
    for i, record in enumerate(result.records):
        direct = run_claim(select([claim])[0], seed=7 + i)
        assert record["result"]["exponent"] == direct.measured["exponent"]
    assert result.records[0]["result"]["exponent"] != result.records[1]["result"]["exponent"]
    real = cf.icl_risk
    monkeypatch.setattr(cf, "icl_risk", lambda *args: 1.05 * real(*args))
    found = calibration.calibrate(CLAIM, seeds=2, first_seed=40, store=None, n_jobs=1)
    assert found.failing_seeds == (40, 41) and found.alarms == 2
    with pytest.raises(ValueError, match="non-negative integer"):
        sweep.run_replicates(claim, {}, master_seed=-1, seeds=1, runs=True, n_jobs=1)


def test_merging_a_row_keeps_the_others_and_the_table_is_readable_by_all(tmp_path):
    table = tmp_path / "calibration.md"
    row = dict(claim="x.first", seeds=200, alarms=0, errors=0, rate=0.0, interval=[0.0, 0.018], level=0.95,
               nominal=1e-3, calibrated=True, seconds_per_seed=1.0, failing_seeds=[], seed=0, code="0" * 16)
    calibration.update_table(table, row)
    calibration.update_table(table, dict(row, claim="x.second", alarms=200, rate=1.0, interval=[0.98, 1.0],
                                         calibrated=False, failing_seeds=list(range(200))))
    rows = calibration.read_table(table)
    assert sorted(rows) == ["x.first", "x.second"]
    text = table.read_text()
    assert "| `x.second` | 200 | 200 | 100% | [98%, 100%] |" in text and "0, 1, 2, 3, 4 … (+195)" in text
    assert table.stat().st_mode & 0o044  # readable by others (mkstemp alone gives 0600)
    table.with_suffix(".json").write_text('{"schema": "attnflow.calibration-table/1", "claims": [{"no": 1}]}')
    with pytest.raises(ValueError, match="not a calibration table"):
        calibration.read_table(table)


CLAIM_SOURCE = '''
@claim("toy.rate", "ref", "statement", quick=dict(n=10))
def rate(seed, n):
    estimate = n * 0.5  # the estimate
    def figure():
        fig, ax = plots.figure()
        ax.plot([1, 2], [estimate, estimate])
        return fig
    return Outcome({"e": estimate}, {"e": 5.0}, "|z| < 4", "4 SE", passed=abs(estimate - 5) < 4, figure=figure)
'''


@pytest.mark.parametrize("edit, carries", [
    (("ax.plot([1, 2], [estimate, estimate])", "ax.semilogy([1, 2], [estimate, estimate], label='e')"), True),
    (("  # the estimate", "  # the estimate, halved"), True),          # a comment
    (("abs(estimate - 5) < 4", "abs(estimate - 5) < 3"), False),         # what it asserts
    (('"|z| < 4"', '"|z| < 3"'), False),
    (("quick=dict(n=10)", "quick=dict(n=20)"), False),                   # its settings
    (("n * 0.5", "n * 0.25"), False),                                   # what it measures
])
def test_the_claim_source_digest_ignores_only_how_a_claim_draws(edit, carries):
    """A row carries across an edit to the figure (the closure handed to ``figure=``) or to comments; any edit to
    what the claim measures, asserts or is set to changes the digest, so the row must be recalibrated."""
    edited = CLAIM_SOURCE.replace(*edit)
    assert edited != CLAIM_SOURCE
    assert (calibration.assertion_digest(edited) == calibration.assertion_digest(CLAIM_SOURCE)) == carries


def test_a_figure_given_as_a_lambda_is_left_out_too():
    source = CLAIM_SOURCE.replace("figure=figure)", "figure=lambda: plots.curve(estimate))")
    drawn_otherwise = source.replace("plots.curve(estimate)", "plots.curve(estimate, log=True)")
    assert calibration.assertion_digest(source) == calibration.assertion_digest(drawn_otherwise)


def test_a_record_reused_from_another_calibration_takes_its_place_in_this_one(tmp_path, monkeypatch, few_seeds_tell):
    """The store keys a run by its seed, not by its place in a calibration: `--seed 1`'s record written as
    replicate 0 of a calibration from seed 1 is replicate 1 of one from seed 0, and its witness and failing seed are
    seed 1's."""
    store = tmp_path / "store"
    real = cf.icl_risk
    monkeypatch.setattr(cf, "icl_risk", lambda *args: 1.05 * real(*args))  # every seed fails: seeds are listed
    later = calibration.calibrate(CLAIM, seeds=1, first_seed=1, store=store, n_jobs=1)
    assert later.failing_seeds == (1,) and later.witnesses[0][0] == 1
    found = calibration.calibrate(CLAIM, seeds=2, first_seed=0, store=store, n_jobs=1)
    assert (found.computed, found.reused) == (1, 1)
    assert found.failing_seeds == (0, 1)
    assert [w[0] for w in found.witnesses] == [0, 1] and found.witnesses[1] == later.witnesses[0]
