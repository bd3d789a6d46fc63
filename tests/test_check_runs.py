"""``attnflow check`` on the engine: parallel and distributed runs give the same JSON, outcomes are stored as they
finish, an interrupted or killed run keeps them and resumes, and a report is rebuilt from the store alone."""
import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnflow.validation import claim_runs, systems

from .conftest import plugin_environment

PLUGINS = Path(__file__).parent / "slow_plugin"
SLOW = [f"slow.claim_{i}" for i in range(6)]
# Fast claims of seven systems, one of them a registered finding (a few seconds together on one core).
REAL = ["gd_beta.risk_formula", "gd_beta.bayes_factor_needs_bounded_snr", "one_nn.context_length",
        "random_walk.failure_theorem", "ccmc.base_chain_row", "group_sparse.time_to_loss_submodel",
        "linear_attention_h3.lora_trace_free_exact", "scb.stage1_duration"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of a process that sees the slow plugin as an installed distribution."""
    return plugin_environment(tmp_path_factory.mktemp("site"), "attnflow_slow", "slow = attnflow_slow:SYSTEM", PLUGINS)


def attnflow(env, *args, expect=0):
    result = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", *args], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == expect, result.stderr
    return result


def start(env, *args):
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: give the run the default
    # disposition a terminal's Ctrl-C meets, whatever started the test run.
    return subprocess.Popen([sys.executable, "-m", "attnflow.validation.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def without_times(document: str) -> dict:
    """A check document without its wall times, the one thing a rerun may change."""
    document = json.loads(document)
    document["summary"].pop("seconds")
    for result in document["results"]:
        result.pop("seconds")
    return document


def wait_for_records(store: Path, count: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(store.glob("*.json"))) < count:
        time.sleep(0.05)
    assert len(list(store.glob("*.json"))) >= count, "the run stored too few outcomes in time"


# ----------------------------------------------------------------------------------------------------------------
# Selection and order
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression, expected", [
    ("svm", ["attention_svm.rank", "attention_svm.x"]),
    ("svm and not rank", ["attention_svm.x"]),
    ("rank or gd", ["attention_svm.rank", "gd_beta.risk"]),
    ("not (svm or gd)", ["scb.stage"]),
    ("GD-BETA", ["gd_beta.risk"]),
])
def test_k_selects_like_pytest(expression, expected):
    names = ["attention_svm.rank", "attention_svm.x", "gd_beta.risk", "scb.stage"]
    matches = claim_runs.match_expression(expression)
    assert [n for n in names if matches(n)] == expected


@pytest.mark.parametrize("expression", ["", "and", "svm and", "(svm", "svm )", "not"])
def test_a_malformed_k_is_a_value_error(expression):
    with pytest.raises(ValueError, match="-k"):
        claim_runs.match_expression(expression)


def test_claims_start_longest_first_by_their_measured_times():
    tasks = claim_runs.tasks_for(systems.select(["random_walk"]), setting="quick", seed=0, draw_figures=False)
    ordered = claim_runs.batches(tasks, 2)
    assert sorted(t.claim for b in ordered for t in b.tasks) == sorted(t.claim for t in tasks)
    assert [b.expected for b in ordered] == sorted((b.expected for b in ordered), reverse=True)
    assert ordered[0].expected > ordered[-1].expected  # the table tells the claims apart


def test_every_built_in_claim_has_measured_times_at_both_settings():
    names = {c.name for c in systems.select([])}
    table = claim_runs._durations()
    assert names <= set(table["quick"]) and names <= set(table["full"])


def test_the_key_follows_what_determines_the_numbers_and_nothing_else():
    task = claim_runs.tasks_for(systems.select(["gd_beta.risk_formula"]), setting="quick", seed=0,
                                draw_figures=False)[0]
    same = [claim_runs.ClaimTask(**{**vars(task), "draw_figure": True}),
            claim_runs.ClaimTask(**{**vars(task), "expected": 99.0})]
    other = [claim_runs.ClaimTask(**{**vars(task), field: value})
             for field, value in (("seed", 1), ("setting", "full"), ("code", "0" * 16), ("libraries", "numpy 0"),
                                  ("claim", "gd_beta.lsa_gap"))]
    assert {t.key for t in same} == {task.key}
    assert len({task.key, *(t.key for t in other)}) == 1 + len(other)


# ----------------------------------------------------------------------------------------------------------------
# The same numbers on every backend
# ----------------------------------------------------------------------------------------------------------------

def test_one_worker_two_workers_and_a_dask_cluster_give_the_same_json(tmp_path):
    from dask.distributed import LocalCluster

    one = attnflow(os.environ, "check", *REAL, "--json", "--jobs", "1", "--no-progress").stdout
    two = attnflow(os.environ, "check", *REAL, "--json", "--jobs", "2", "--no-progress").stdout
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        dask = attnflow(os.environ, "check", *REAL, "--json", "--scheduler", cluster.scheduler_address,
                        "--no-progress").stdout
    assert [r["name"] for r in json.loads(two)["results"]] == [c.name for c in systems.select(REAL)]
    assert without_times(one) == without_times(two) == without_times(dask)
    assert json.loads(one)["summary"]["findings"] == 1  # the finding's record travels like any other


# ----------------------------------------------------------------------------------------------------------------
# Stored as they finish; resumed; rebuilt
# ----------------------------------------------------------------------------------------------------------------

def test_a_killed_full_run_resumes_without_recomputing_what_finished(env, tmp_path):
    store = tmp_path / "store"
    command = ["check", "slow", "--full", "--store", str(store), "--jobs", "1", "--json", "--no-progress"]
    process = start(env, *command)
    wait_for_records(store, 2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = {p.name: p.read_text() for p in store.glob("*.json")}
    assert 2 <= len(before) < 6, len(before)

    rerun = attnflow(env, *command)
    assert f"computed {6 - len(before)} claims, reused {len(before)} from {store}" in rerun.stderr
    after = {p.name: p.read_text() for p in store.glob("*.json")}
    assert len(after) == 6 and all(after[name] == text for name, text in before.items())
    assert len({json.loads(text)["run_id"] for text in after.values()}) == 2  # the killed run's and the rerun's
    assert not list(store.glob(".tmp-*"))
    fresh = attnflow(env, "check", "slow", "--full", "--no-store", "--json", "--jobs", "1", "--no-progress")
    assert without_times(rerun.stdout) == without_times(fresh.stdout)  # reused outcomes are the computed ones


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_within_two_seconds_and_keeps_every_finished_claim(env, tmp_path, jobs):
    store = tmp_path / "store"
    process = start(env, "check", "slow", "--full", "--store", str(store), "--jobs", jobs, "--no-progress")
    wait_for_records(store, 1)
    stopped = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - stopped < 2.0 + 1.0  # 2 s to stop, 1 s for the interpreter to exit on a busy machine
    assert process.returncode == 130
    kept = len(list(store.glob("*.json")))
    assert 1 <= kept < 6
    assert f"interrupted; {kept} of 6 claims finished and are kept in {store}" in err
    assert "Traceback" not in err
    assert out.count("PASS    slow.claim_") == kept  # each finished claim's block was printed, none lost
    assert f"{kept} of {kept} claims passed" in out


def test_an_interrupted_json_run_prints_the_claims_that_finished(env, tmp_path):
    store = tmp_path / "store"
    process = start(env, "check", "slow", "--full", "--store", str(store), "--jobs", "1", "--json", "--no-progress")
    wait_for_records(store, 2)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    document = json.loads(out)
    assert process.returncode == 130 and document["interrupted"] is True
    assert len(document["results"]) == len(list(store.glob("*.json"))) >= 2


def test_each_claim_is_printed_as_it_finishes_also_into_a_pipe(env):
    process = start(env, "check", "slow", "--full", "--no-store", "--jobs", "1", "--no-progress")
    first = ""
    while "PASS" not in first:
        first = process.stdout.readline()
        assert first, "the run ended without printing a claim"
    assert "slow.claim_" in first and process.poll() is None  # printed while the others still run
    process.communicate(timeout=60)
    assert process.returncode == 0


def test_the_report_is_rebuilt_from_the_store_alone(env, tmp_path):
    store, direct, rebuilt = tmp_path / "store", tmp_path / "direct", tmp_path / "rebuilt"
    attnflow(env, "check", "slow", "--store", str(store), "--report", str(direct), "--no-progress")
    result = attnflow(env, "report", str(store), "slow", "--out", str(rebuilt))
    assert "report of 6 stored claims" in result.stderr
    assert (rebuilt / "figures" / "slow.claim_0.png").read_bytes() == (direct / "figures" / "slow.claim_0.png").read_bytes()
    assert (rebuilt / "report.md").read_text() == (direct / "report.md").read_text()
    document = json.loads(attnflow(env, "report", str(store), "slow", "--json").stdout)
    assert [r["name"] for r in document["results"]] == SLOW
    missing = attnflow(env, "report", str(store), "slow", "--full", "--out", str(tmp_path / "none"), expect=1)
    assert "6 claims have no outcome of the current code at setting full" in missing.stderr


def test_a_store_without_figures_is_recomputed_when_a_report_wants_them(env, tmp_path):
    store = tmp_path / "store"
    attnflow(env, "check", "slow", "--store", str(store), "--no-progress")  # a store draws figures
    again = attnflow(env, "check", "slow", "--store", str(store), "--report", str(tmp_path / "r"), "--no-progress")
    assert "computed 0 claims, reused 6" in again.stderr
    forced = attnflow(env, "check", "slow.claim_1", "--store", str(store), "--rerun", "--no-progress")
    assert "computed 1 claims, reused 0" in forced.stderr


def test_a_corrupt_stored_outcome_is_named_and_recomputed(env, tmp_path):
    store = tmp_path / "store"
    first = attnflow(env, "check", "slow", "--store", str(store), "--json", "--no-progress")
    victim = sorted(store.glob("*.json"))[0]
    victim.write_text(victim.read_text()[:100])
    again = attnflow(env, "check", "slow", "--store", str(store), "--json", "--no-progress")
    assert "could not be used and was recomputed" in again.stderr and victim.name in again.stderr
    assert "computed 1 claims, reused 5" in again.stderr
    assert without_times(again.stdout) == without_times(first.stdout)
    assert len(list((store / "corrupt").iterdir())) == 1


@pytest.mark.parametrize("args, message", [
    (["check", "slow", "-k", "nothing_matches"], "matches no claim"),
    (["check", "slow", "--jobs", "0"], "--jobs must be"),
    (["check", "slow", "--store", "s", "--no-store"], "not both"),
    (["report", "no-such-store", "--out", "x"], "is not a folder"),
])
def test_bad_check_and_report_input_is_one_line_and_exit_2(env, tmp_path, args, message):
    result = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", *args], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_batches_keep_a_systems_short_claims_together_and_start_longest_first():
    def task(name, seconds):
        return claim_runs.ClaimTask(name, "quick", 0, "code", "libraries", expected=seconds)

    tasks = [task("a.one", 1), task("a.two", 1), task("a.three", 9), task("b.one", 2), task("b.two", 2),
             task("c.one", 40), task("c.two", 1)]
    alone = claim_runs.batches(tasks, 1)
    assert [b.tasks for b in alone] == [(t,) for t in tasks]  # one worker: every claim printed as it finishes
    grouped = claim_runs.batches(tasks, 2)  # cap: max(40, 56 / 8) capped at 30 s, but a 40 s claim stands alone
    assert [[t.claim for t in b.tasks] for b in grouped] == [
        ["c.one"], ["a.one", "a.two", "a.three"], ["b.one", "b.two"], ["c.two"]]
    assert sorted(t.claim for b in grouped for t in b.tasks) == sorted(t.claim for t in tasks)
    short = claim_runs.batches([task(f"a.{i}", 10) for i in range(8)], 2)  # cap max(10, 80 / 8) = 10
    assert [len(b.tasks) for b in short] == [1] * 8
    # a system whose kernels are not compiled yet runs in one worker, whatever the cap: it compiles them once
    cold = claim_runs.batches([task(f"a.{i}", 10) for i in range(8)] + [task("b.one", 5)], 2, frozenset({"a"}))
    assert [[t.claim for t in b.tasks] for b in cold] == [[f"a.{i}" for i in range(8)], ["b.one"]]


def test_an_empty_numba_cache_makes_every_system_cold_and_a_filled_one_none(tmp_path):
    """The cold-cache detector reads numba's cache index of each system's kernels: none in a new cache folder;
    after the quick claims of random_walk ran there, random_walk is warm."""
    probe = ("from attnflow.validation import claim_runs, systems; "
             "print(sorted(claim_runs.systems_with_cold_kernels(systems.select([]))))")
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def cold() -> list:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=environment,
                              check=True)
        return ast.literal_eval(done.stdout.strip())

    assert cold() == sorted(systems.system_keys())
    subprocess.run([sys.executable, "-m", "attnflow.validation.cli", "check", "random-walk", "--jobs", "1",
                    "--no-store", "--no-progress"], capture_output=True, env=environment, check=True)
    assert cold() == sorted(set(systems.system_keys()) - {"random_walk"})


def test_a_worker_that_dies_ends_the_run_in_one_line_and_keeps_what_finished(env, tmp_path):
    store = tmp_path / "store"
    # the plugin's claims have no measured times, so they start in the registry's order: claim_5 starts last
    crashing = {**env, "ATTNFLOW_SLOW_CRASH": "slow.claim_5"}
    result = attnflow(crashing, "check", "slow", "--full", "--store", str(store), "--jobs", "2", "--no-progress",
                      expect=1)
    error = [line for line in result.stderr.splitlines() if line.startswith("attnflow: error:")]
    assert len(error) == 1 and "the run stopped" in error[0] and "Traceback" not in result.stderr
    kept = len(list(store.glob("*.json")))
    assert 1 <= kept <= 5 and f"{kept} of 6 claims finished and are kept in {store}" in error[0]
    resumed = attnflow(env, "check", "slow", "--full", "--store", str(store), "--jobs", "2", "--no-progress")
    assert f"computed {6 - kept} claims, reused {kept}" in resumed.stderr


def test_calibrate_full_runs_the_full_setting_and_keeps_its_rows_apart(env, tmp_path):
    table, store = tmp_path / "calibration-full.md", tmp_path / "store"
    single = json.loads(attnflow(env, "calibrate", "slow.claim_0", "--full", "--seeds", "3", "--jobs", "2",
                                 "--store", str(store), "--json", "--no-progress", expect=1).stdout)
    assert single["setting"] == "full" and single["seeds"] == 3 and single["alarms"] == 0
    assert single["verdict"] == "too few seeds"  # three seeds cannot tell; the table's twenty below can
    attnflow(env, "calibrate", "--full", "--table", str(table), "slow.claim_0", "--seeds", "20", "--jobs", "2",
             "--store", str(store), "--no-progress")
    rows = json.loads(table.with_suffix(".json").read_text())["claims"]
    assert [(r["claim"], r["setting"], r["seeds"]) for r in rows] == [("slow.claim_0", "full", 20)]
    assert "attnflow check CLAIM --full --seed s + i" in table.read_text()
    mixed = attnflow(env, "calibrate", "--table", str(table), "slow.claim_0", "--seeds", "20", expect=2)
    assert "a table holds one setting" in mixed.stderr
    # a stale row is carried only if its witnesses reproduce, rerun at the row's own (full) setting
    document = json.loads(table.with_suffix(".json").read_text())
    document["claims"][0]["code"] = "0" * 16
    table.with_suffix(".json").write_text(json.dumps(document))
    verified = attnflow(env, "calibrate", "--table", str(table), "--verify", "--jobs", "1", "--store",
                        str(tmp_path / "verify"), "--no-progress")
    assert "slow.claim_0: carried" in verified.stdout


def test_the_paper_scale_page_lists_every_claim_with_a_verdict_and_its_figures_exist():
    docs = Path(__file__).parent.parent / "docs"
    page = (docs / "paper-scale.md").read_text()
    for claim in systems.select([]):
        row = next((line for line in page.splitlines() if line.startswith(f"| `{claim.name}` |")), None)
        assert row is not None, claim.name
        assert row.split("|")[2].strip() in ("**PASS**", "**FINDING**"), row
        assert ("FINDING" in row) == bool(claim.finding), row  # findings are exactly the registered ones
    figures = [line.split("](")[1].split(")")[0] for line in page.splitlines() if "![](" in line
               for line in line.split("| ") if "![](" in line]
    assert figures and all((docs / figure).is_file() for figure in figures)
