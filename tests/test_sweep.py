"""Sweeps: identical results on every backend, kill-and-resume, the result store, and rate fits with honest
bootstrap intervals."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats
import pytest

import attnflow.closed_forms.gd_beta as cf
from attnflow.validation import engine, sweep
from attnflow import run_claim, select
from attnflow.validation import stats
from attnflow.validation.stats import fit_exponent

GRID = {"batch_size": [8, 32, 128]}
TARGET = "gd_beta.minibatch_gradient_deviation"


def _results(result):
    return [(tuple(map(tuple, r["params"])), r["seed"], r["result"]) for r in result.records]


def test_parse_grid():
    assert sweep.parse_grid(["N=10,20,40", "lr=0.1,1e-3"]) == {"N": [10, 20, 40], "lr": [0.1, 0.001]}
    assert sweep.parse_grid(["x=2.0"]) == {"x": [2.0]}
    for bad, message in [(["N"], "NAME=v1"), (["N=a,b"], "must be numbers"), (["N=1", "N=2"], "twice")]:
        with pytest.raises(ValueError, match=message):
            sweep.parse_grid(bad)


def test_single_process_and_joblib_give_bitwise_identical_results(tmp_path):
    single = sweep.run_sweep(TARGET, GRID, seeds=4, master_seed=7, n_jobs=1)
    parallel = sweep.run_sweep(TARGET, GRID, seeds=4, master_seed=7, n_jobs=2, store=tmp_path)
    assert _results(single) == _results(parallel)
    assert single.computed == 12 and parallel.computed == 12


def test_dask_local_cluster_gives_bitwise_identical_results(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    single = sweep.run_sweep(TARGET, GRID, seeds=3, master_seed=7, n_jobs=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask = sweep.run_sweep(TARGET, GRID, seeds=3, master_seed=7, store=tmp_path,
                                  scheduler=cluster.scheduler_address)
    assert _results(single) == _results(on_dask)


def test_rerun_reuses_the_store_and_changing_anything_recomputes(tmp_path):
    first = sweep.run_sweep(TARGET, GRID, seeds=2, store=tmp_path, n_jobs=1, master_seed=0)
    again = sweep.run_sweep(TARGET, GRID, seeds=2, store=tmp_path, n_jobs=1, master_seed=0)
    assert (first.computed, again.computed, again.reused) == (6, 0, 6)
    assert _results(first) == _results(again)
    more = sweep.run_sweep(TARGET, {"batch_size": [8, 32, 128, 512]}, seeds=3, store=tmp_path, n_jobs=1,
                           master_seed=0)
    assert (more.computed, more.reused) == (6, 6)  # the new grid value and the new seed
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 12 and all(f.endswith(".json") for f in files)  # no temporary files left behind
    record = json.loads((tmp_path / files[0]).read_text())
    assert set(record) >= {"key", "target", "params", "seed", "version", "code", "result", "seconds", "run_id"}


def test_killed_sweep_resumes_with_every_task_computed_exactly_once(tmp_path):
    store = tmp_path / "store"
    command = [sys.executable, "-m", "attnflow.validation.cli", "sweep", "sweep.sleep", "--grid", "seconds=0.25",
               "--grid", "size=1,2,3,4,5,6", "--seeds", "2", "--jobs", "1", "--store", str(store), "--no-progress"]
    target_dir = store / "sweep.sleep"
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: give the sweep the default
    # disposition a terminal's Ctrl-C meets, whatever started the test run.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and len(list(target_dir.glob("*.json"))) < 3:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = {p.name: p.read_text() for p in target_dir.glob("*.json")}
    assert 3 <= len(before) < 12, len(before)

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"computed {12 - len(before)} tasks, reused {len(before)}" in rerun.stderr
    after = {p.name: p.read_text() for p in target_dir.glob("*.json")}
    assert len(after) == 12
    assert all(after[name] == text for name, text in before.items())  # finished tasks were not recomputed
    run_ids = {json.loads(text)["run_id"] for text in after.values()}
    assert len(run_ids) == 2  # the killed run's and the rerun's, nothing else
    assert not list(target_dir.glob(".tmp-*"))  # the kill could not leave a half-written record


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pids) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _start_parallel_sweep(tmp_path):
    store = tmp_path / "store"
    command = [sys.executable, "-m", "attnflow.validation.cli", "sweep", "sweep.sleep", "--grid", "seconds=3",
               "--grid", "size=1,2,3,4,5,6,7,8", "--seeds", "2", "--jobs", "2", "--store", str(store),
               "--no-progress"]
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: give the sweep the default
    # disposition a terminal's Ctrl-C meets, whatever started the test run.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list((store / "sweep.sleep").glob("*.json")):
        time.sleep(0.05)
    workers = _children(process.pid)
    assert workers, "the sweep started no worker processes"
    return process, workers, store / "sweep.sleep"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_stopped_sweep_leaves_no_worker_behind_and_keeps_its_records(tmp_path, stop):
    process, workers, records = _start_parallel_sweep(tmp_path)
    finished = len(list(records.glob("*.json")))
    stopped_at = time.monotonic()
    process.send_signal(stop)
    code = process.wait(timeout=60)
    exited_after = time.monotonic() - stopped_at
    assert code == (-signal.SIGKILL if stop == signal.SIGKILL else 130)
    deadline = time.monotonic() + 30
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(workers), f"workers {sorted(_alive(workers))} outlived the sweep"
    assert len(list(records.glob("*.json"))) >= finished  # what was finished is kept
    if stop != signal.SIGKILL:
        assert process.stderr.read().strip() == "attnflow: interrupted"  # one line, no traceback from the pool
        # the running 3 s tasks are killed, not waited for (2 s is typical; the bound allows for a loaded machine)
        assert exited_after < 10, exited_after


CORRUPTIONS = {
    "truncated": lambda path, other: path.write_text(path.read_text()[:40]),
    "empty": lambda path, other: path.write_text(""),
    "an empty object": lambda path, other: path.write_text("{}"),
    "a list": lambda path, other: path.write_text("[1, 2]"),
    "another task's record": lambda path, other: path.write_text(other.read_text()),
    "an edited number": lambda path, other: path.write_text(path.read_text().replace('"replicate": 0',
                                                                                     '"replicate": 1')),
    "a directory": lambda path, other: (path.unlink(), path.mkdir()),
    "not UTF-8": lambda path, other: path.write_bytes(b"\xff\xfe\x00"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_record_is_named_moved_aside_and_recomputed(tmp_path, corruption):
    first = sweep.run_sweep(TARGET, {"batch_size": [8]}, seeds=2, store=tmp_path, n_jobs=1, master_seed=0)
    paths = sorted(tmp_path.glob("*.json"), key=lambda p: json.loads(p.read_text())["replicate"])
    CORRUPTIONS[corruption](paths[0], paths[1])
    (tmp_path / ".tmp-old.json").write_text("half a rec")
    os.utime(tmp_path / ".tmp-old.json", (0, 0))  # a temporary file left by a writer that died long ago
    again = sweep.run_sweep(TARGET, {"batch_size": [8]}, seeds=2, store=tmp_path, n_jobs=1, master_seed=0)
    assert (again.computed, again.reused) == (1, 1)
    assert _results(again) == _results(first)
    assert len(again.extra["quarantined"]) == 1 and paths[0].name in again.extra["quarantined"][0]
    assert len(list((tmp_path / "corrupt").iterdir())) == 1
    assert not (tmp_path / ".tmp-old.json").exists()


def test_non_finite_grid_values_and_unwritable_stores_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must be finite"):
        sweep.parse_grid(["batch_size=nan"])
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot write the result store"):
        sweep.ResultStore(tmp_path / "file" / "store")
    with pytest.raises(ValueError, match="non-empty path"):
        sweep.ResultStore("")


def test_bad_sweeps_are_value_errors():
    with pytest.raises(ValueError, match="unknown claim or system"):
        sweep.run_sweep("nope.nothing", GRID, master_seed=0)
    with pytest.raises(ValueError, match="has no parameter"):
        sweep.run_sweep(TARGET, {"lr": [1, 2]}, master_seed=0)
    with pytest.raises(ValueError, match="seeds must be a positive integer"):
        sweep.run_sweep(TARGET, GRID, seeds=0, master_seed=0)
    with pytest.raises(ValueError, match="grid is empty"):
        sweep.run_sweep(TARGET, {}, master_seed=0)
    with pytest.raises(ValueError, match="not the system"):
        sweep.run_sweep("gd_beta", {"seeds": [1, 2]}, master_seed=0)


def test_a_claim_can_be_swept():
    result = sweep.run_sweep("gd_beta.bayes_factor_needs_bounded_snr", {"n_contexts": [500, 1000]}, seeds=2, n_jobs=1,
                             master_seed=0)
    assert [r["result"]["status"] for r in result.records] == ["PASS"] * 4
    assert all("ratio_at_smallest_sigma2" in r["result"] for r in result.records)


# ---- rate fits ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, exponent", [("loglog", -0.5), ("semilog", -0.7)])
def test_bootstrap_interval_covers_the_true_exponent_at_its_level(kind, exponent):
    """Synthetic laws with log-normal noise: over 300 experiments the 95% interval covers the truth in a
    fraction within 4 binomial standard errors of 0.95 (sd = 0.0126)."""
    rng = np.random.default_rng(2026)
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    covered, estimates = 0, []
    for experiment in range(300):
        law = x**exponent if kind == "loglog" else np.exp(exponent * x)
        y = 3.0 * law[:, None] * np.exp(0.3 * rng.normal(size=(x.size, 10)))
        fit = fit_exponent(x, y, kind=kind, n_boot=1000, seed=experiment)
        covered += fit.contains(exponent)
        estimates.append(fit.estimate)
    assert abs(covered / 300 - 0.95) < 4 * 0.0126, covered / 300
    assert abs(np.mean(estimates) - exponent) < 0.02  # the seed-mean fit is unbiased here


def test_delta_t_interval_covers_the_true_exponent_at_its_level():
    """A paired design with skewed (gamma) noise shared by every grid value of a seed, 8 seeds: over 2000
    experiments the 95% delta-method t interval covers the truth in a fraction within 4 binomial standard errors
    of 0.95 (sd = 0.0049), and the 99.9% one misses at most 6 times (expected 2; P(more) < 0.5%)."""
    rng = np.random.default_rng(11)
    x = np.array([256.0, 1024.0, 4096.0])
    covered, missed_999 = 0, 0
    for _ in range(2000):
        shared = rng.gamma(20.0, 1 / 20.0, size=8)  # the seed's common factor (paired)
        y = x[:, None] ** -1.0 * shared * rng.gamma(20.0, 1 / 20.0, size=(3, 8))
        covered += stats.fit_exponent_t(x, y, level=0.95).contains(-1.0)
        missed_999 += not stats.fit_exponent_t(x, y, level=0.999).contains(-1.0)
    assert abs(covered / 2000 - 0.95) < 4 * 0.0049, covered / 2000
    assert missed_999 <= 6, missed_999


def test_sign_test_threshold_matches_the_binomial_tail_counted_exactly():
    """Against the raw definition: of the 2^n equally likely sign patterns (the median exactly at the level), the
    fraction with at least k values above, counted with integer binomial coefficients, is the stated rate; k is the
    smallest count whose rate is <= alpha; too few values give no critical count."""
    import math
    for n, alpha in ((0, 0.5), (6, 0.05), (9, 1e-3), (10, 1e-3), (12, 1e-2), (20, 1e-3), (40, 1e-3)):
        tail = [sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n for k in range(n + 2)]
        expected = next(((k, tail[k]) for k in range(n + 1) if tail[k] <= alpha), (n + 1, 0.0))
        k, rate = stats.sign_test_threshold(n, alpha)
        assert k == expected[0] and rate == pytest.approx(expected[1], rel=1e-12, abs=0.0)
    assert stats.sign_test_threshold(10, 1e-3) == (10, pytest.approx(2.0**-10))
    assert stats.sign_test_threshold(9, 1e-3) == (10, 0.0)
    for bad in (dict(n=-1, alpha=0.1), dict(n=2.5, alpha=0.1), dict(n=True, alpha=0.1), dict(n=5, alpha=0.0),
                dict(n=5, alpha=1.0)):
        with pytest.raises(ValueError, match="n must|alpha must"):
            stats.sign_test_threshold(**bad)


def test_richardson_extrapolation_removes_a_bias_linear_in_one_over_b():
    """Exact on data with mean μ + c/B: 2·mean(2B) − mean(B) = μ; Welch's standard error and degrees of freedom
    from their formulas; refuses samples without spread or too small."""
    at_B = np.array([1.0, 1.2, 0.8, 1.0]) + 0.5  # mean 1.5 = μ + c/B with μ = 1, c/B = 0.5
    at_2B = np.array([1.3, 1.2, 1.25, 1.25])       # mean 1.25 = μ + c/(2B)
    limit = stats.richardson_in_batch(at_B, at_2B)
    assert limit.estimate == pytest.approx(1.0)
    v1, v2 = at_B.var(ddof=1) / 4, 4 * at_2B.var(ddof=1) / 4
    assert limit.standard_error == pytest.approx(np.sqrt(v1 + v2))
    assert limit.df == pytest.approx((v1 + v2) ** 2 / (v1**2 / 3 + v2**2 / 3))
    assert limit.t(1.0) == pytest.approx(0.0, abs=1e-12)
    assert limit.critical(0.05) == pytest.approx(scipy_stats.t.isf(0.025, limit.df))
    for bad in ([1.0], [np.nan, 1.0]):
        with pytest.raises(ValueError):
            stats.richardson_in_batch(bad, at_2B)
    with pytest.raises(ValueError, match="do not vary"):
        stats.richardson_in_batch(np.ones(3), np.ones(3))


def test_quantile_fit_recovers_the_exponent_of_an_order_statistic():
    """A law whose seeds scatter multiplicatively: every quantile scales like x^0.8, so the median and the 90%
    fits both find 0.8 and their intervals cover it."""
    rng = np.random.default_rng(7)
    x = np.array([16.0, 64.0, 256.0])
    y = x[:, None] ** 0.8 * np.exp(0.2 * rng.normal(size=(3, 40)))
    for q in (0.5, 0.9):
        fit = fit_exponent(x, y, quantile=q, seed=1)
        assert fit.contains(0.8) and abs(fit.estimate - 0.8) < 0.1
        assert fit.estimate == pytest.approx(np.polyfit(np.log(x), np.log(np.quantile(y, q, axis=1,
                                                                                      method="inverted_cdf")), 1)[0])
    with pytest.raises(ValueError, match="quantile"):
        fit_exponent(x, y, quantile=1.0, seed=0)


def test_fit_exponent_bad_input():
    x = np.array([1.0, 2.0, 4.0])
    for args, message in [((x, np.ones((3, 1))), "at least 2 seeds"), ((x[:2], np.ones((2, 4))), "3 distinct"),
                          ((x, -np.ones((3, 4))), "must be > 0"), ((x, np.ones((4, 4))), "must have shape")]:
        with pytest.raises(ValueError, match=message):
            fit_exponent(*args, seed=0)
    with pytest.raises(ValueError, match="kind"):
        fit_exponent(x, np.ones((3, 4)), kind="loglin", seed=0)


def test_scaling_claim_fails_for_a_biased_gradient(monkeypatch):
    """If the closed-form gradient were off, the deviation would plateau at ‖bias‖² and the exponent leave −1.

    The claim's power depends on the gradient noise of its instance, so the bias is sized against it: a systematic
    error whose squared norm is five times the mean squared deviation at the largest batch must be caught."""
    scaling = select(["gd_beta.minibatch_gradient_scaling"])[0]
    noise_at_largest_batch = run_claim(scaling, seed=0).details[-1]["mean_squared_deviation"]
    real = cf.risk_gradient
    shift = np.sqrt(5 * noise_at_largest_batch / 3)  # d = 3 entries of g_beta

    def biased(problem, beta0, Gamma):
        g_beta, g_Gamma = real(problem, beta0, Gamma)
        return g_beta + shift, g_Gamma

    monkeypatch.setattr(cf, "risk_gradient", biased)
    assert run_claim(select(["gd_beta.minibatch_gradient_scaling"])[0], seed=0).status == "FAIL"


def test_clopper_pearson_interval_at_the_edges_has_its_closed_form():
    """With k = 0 (or k = n) the exact interval's far end solves (1 − p)^n = α/2 (or p^n = α/2)."""
    from attnflow.validation.stats import clopper_pearson

    low, high = clopper_pearson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-12)
    low, high = clopper_pearson(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10), rel=1e-12)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_an_edited_module_changes_the_fingerprint_of_what_imports_it(tmp_path, monkeypatch):
    from attnflow.validation import fingerprint
    package = tmp_path / "fp_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernel.py").write_text("def rate():\n    return 1.0\n")
    (package / "unrelated.py").write_text("X = 1\n")
    (package / "claims.py").write_text("from fp_probe.kernel import rate\nfrom . import kernel\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def fresh(name):
        fingerprint.module_fingerprint.cache_clear()
        return fingerprint.module_fingerprint(name)

    before = fresh("fp_probe.claims")
    (package / "unrelated.py").write_text("X = 2\n")
    assert fresh("fp_probe.claims") == before  # not imported: not part of it
    (package / "kernel.py").write_text("def rate():\n    return 2.0\n")
    assert fresh("fp_probe.claims") != before
    with pytest.raises(ValueError, match="no Python source"):
        fresh("fp_probe.absent")


def test_records_of_edited_code_are_not_reused(tmp_path, monkeypatch):
    first = sweep.run_sweep(TARGET, {"batch_size": [8]}, seeds=2, store=tmp_path, n_jobs=1, master_seed=0)
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["code"] == sweep.target_fingerprint(TARGET)
    monkeypatch.setattr(sweep, "target_fingerprint", lambda target: "0" * 16)  # as after an edited kernel
    edited = sweep.run_sweep(TARGET, {"batch_size": [8]}, seeds=2, store=tmp_path, n_jobs=1, master_seed=0)
    assert (first.computed, edited.computed, edited.reused) == (2, 2, 0)


def test_the_resource_trackers_warnings_are_filtered_in_the_processes_the_pool_starts():
    """loky's resource tracker is started with this process's -W options; after the pool's setup they drop its
    'resource_tracker: …' warnings (which could follow a failing task's one-line error) and nothing else."""
    from multiprocessing import util

    engine._quiet_resource_tracker()
    flags = util._args_from_interpreter_flags()
    code = ("import warnings; warnings.warn('resource_tracker: /loky-1-abc: FileNotFoundError(2)'); "
            "warnings.warn('resource_tracker: There appear to be 1 leaked semlock objects'); warnings.warn('other')")
    result = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=60)
    assert "resource_tracker" not in result.stderr and "UserWarning: other" in result.stderr
