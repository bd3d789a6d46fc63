"""``attnflow check`` in parallel: the quick suite at one and two workers side by side, on a local Dask cluster,
cold and warm, and the ``--full`` suite's projected wall time on many cores (not a test).

Every run is ``attnflow check --json`` in a fresh process on this machine, with a numba cache directory of its own
(``NUMBA_CACHE_DIR``): "cold" starts from an empty cache, "warm" from the one a previous run filled. Wall time is
the process's; CPU time is that of the process and of the workers it started and waited for. The makespan's lower
bound is max(total / N, longest claim), with each claim's time from the one-worker run. The ``--full`` projection
schedules the claims' measured one-core times (``attnflow/validation/durations.json``) longest first onto N cores,
as the runner starts them, and reports the resulting makespan beside its lower bound.

Ratios (``--json``): ``speedup_2_over_1`` = wall at --jobs 1 / wall at --jobs 2 (target >= 1.8 on 2 cores),
``makespan_2_over_bound`` = wall at --jobs 2 / max(total / 2, longest) (target <= 1.15), ``dask_seconds_per_claim``
= (Dask wall - --jobs 2 wall) / claims, ``cold_default_wall_over_target`` = README command 1 (cold, the default
--jobs, with --report) / 90 s,
and ``full_wall_16`` / ``full_wall_64`` = projected hours of the --full suite on 16 and 64 cores.

    python benchmarks/bench_check.py [--json] [--skip-dask] [NAMES ...]
"""
from __future__ import annotations

import heapq
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, parser

COLD_WALL_TARGET = 90.0
DURATIONS = Path(__file__).resolve().parent.parent / "validation" / "durations.json"


def run_check(names: list[str], cache: str, *extra: str) -> dict:
    """One ``attnflow check --json`` in a fresh process: its wall and CPU seconds and its document."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", "check", "--json", "--no-progress",
                           "--no-store", *extra, *names], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"attnflow check {' '.join(extra)} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(wall=wall, cpu=cpu, document=json.loads(done.stdout))


def lower_bound(document: dict, workers: int) -> float:
    seconds = [r["seconds"] for r in document["results"]]
    return max(sum(seconds) / workers, max(seconds))


def longest_first_makespan(seconds: list[float], cores: int) -> float:
    """The makespan of list scheduling, longest first, onto ``cores`` identical cores."""
    finish = [0.0] * cores
    for duration in sorted(seconds, reverse=True):
        heapq.heapreplace(finish, finish[0] + duration)
    return max(finish)


def without_times(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    document["summary"].pop("seconds")
    for result in document["results"]:
        result.pop("seconds")
    return document


def main() -> None:
    p = parser(__doc__)
    p.add_argument("names", nargs="*", help="systems or claims (default: all, as `attnflow check`)")
    p.add_argument("--skip-dask", action="store_true", help="leave out the local Dask cluster")
    args = p.parse_args()
    rows, ratios = [], {}
    with tempfile.TemporaryDirectory(prefix="attnflow-cold-") as cold_one, \
            tempfile.TemporaryDirectory(prefix="attnflow-cold-") as cold_default:
        report = str(Path(cold_default) / "report")
        # README command 1: the default --jobs, figures drawn for the report
        runs = {"cold, --jobs 1": run_check(args.names, cold_one, "--jobs", "1"),
                "cold, default --jobs, --report (README command 1)": run_check(args.names, cold_default,
                                                                               "--report", report)}
        runs["warm, --jobs 1"] = run_check(args.names, cold_one, "--jobs", "1")
        runs["warm, --jobs 2"] = run_check(args.names, cold_one, "--jobs", "2")
        runs["warm, default --jobs"] = run_check(args.names, cold_one)
        if not args.skip_dask:
            from dask.distributed import LocalCluster

            os.environ["NUMBA_CACHE_DIR"] = cold_one  # the cluster's workers are this process's children
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
                runs["warm, Dask (2 workers)"] = run_check(args.names, cold_one, "--scheduler",
                                                           cluster.scheduler_address)
    one, two = runs["warm, --jobs 1"], runs["warm, --jobs 2"]
    claims = len(one["document"]["results"])
    bound = lower_bound(one["document"], 2)
    for label, run in runs.items():
        same = without_times(run["document"]) == without_times(one["document"])
        rows.append([label, run["wall"], run["cpu"], "same JSON as --jobs 1" if same else "JSON DIFFERS"])
    rows.append(["makespan lower bound at 2 workers", bound, "", f"max(total / 2, longest) over {claims} claims"])
    ratios.update(speedup_2_over_1=one["wall"] / two["wall"], makespan_2_over_bound=two["wall"] / bound,
                  cold_default_wall_over_target=runs["cold, default --jobs, --report (README command 1)"]["wall"]
                  / COLD_WALL_TARGET)
    if "warm, Dask (2 workers)" in runs:
        ratios["dask_seconds_per_claim"] = (runs["warm, Dask (2 workers)"]["wall"] - two["wall"]) / claims
    full = json.loads(DURATIONS.read_text())["full"]
    seconds = list(full.values())
    rows.append(["--full suite, one core (measured)", sum(seconds), "", f"{len(seconds)} claims, longest "
                 f"{max(seconds):.0f} s"])
    for cores in (2, 16, 64):
        makespan = longest_first_makespan(seconds, cores)
        rows.append([f"--full suite on {cores} cores (projected)", makespan, "",
                     f"bound {max(sum(seconds) / cores, max(seconds)):.0f} s"])
        if cores > 2:
            ratios[f"full_wall_{cores}"] = makespan / 3600
    emit("attnflow check in parallel (wall and CPU seconds)", ["run", "wall s", "CPU s", "note"], rows, ratios,
         args.json)


if __name__ == "__main__":
    main()
