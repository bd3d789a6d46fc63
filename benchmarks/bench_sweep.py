"""Per-task overhead of the sweep backends on this machine (not a test).

Runs the diagnostic observable ``sweep.sleep`` (zero work, or a fixed sleep) as a sweep in one process, with
joblib on all cores, and on a local Dask cluster, side by side, into throwaway stores. Each backend is warmed
up first (worker start and imports, reported separately); then overhead per task = (wall time − ideal time) /
tasks, where the ideal is the total sleep divided by the number of workers.

    python benchmarks/bench_sweep.py [--tasks 200] [--sleep 0.0]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

from _common import emit, parser

from attnflow.validation.sweep import run_sweep


def timed(label, tasks, sleep, workers, **kwargs):
    with tempfile.TemporaryDirectory() as store:  # warm-up: start workers, import attnflow in each
        start = time.perf_counter()
        run_sweep("sweep.sleep", {"seconds": [0.0]}, seeds=4 * workers, store=store, master_seed=1, **kwargs)
        startup = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as store:
        start = time.perf_counter()
        result = run_sweep("sweep.sleep", {"seconds": [sleep]}, seeds=tasks, store=store, master_seed=2, **kwargs)
        wall = time.perf_counter() - start
    assert result.computed == tasks
    overhead = (wall - tasks * sleep / workers) / tasks
    return [label, startup, wall, overhead * 1e3]


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    rows = [timed("single process (n_jobs=1)", args.tasks, args.sleep, 1, n_jobs=1),
            timed(f"joblib loky (n_jobs={cores})", args.tasks, args.sleep, cores, n_jobs=cores)]
    try:
        from dask.distributed import LocalCluster
    except ImportError:
        print("dask not installed (pip install 'attnflow[dask]'): its row is skipped", file=sys.stderr)
    else:
        with LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            rows.append(timed(f"dask LocalCluster ({cores} workers)", args.tasks, args.sleep, cores,
                              scheduler=cluster.scheduler_address))
    # not speed-ups: per-task overhead relative to one sweep task run in-process (lower is better)
    ratios = {f"sweep_overhead_{key}_over_single_process": row[3] / rows[0][3]
              for key, row in zip(("joblib", "dask"), rows[1:])}
    emit(f"{args.tasks} tasks of sweep.sleep(seconds={args.sleep}) on {cores} cores, one JSON record each",
         ["backend", "start-up s", "wall s", "overhead ms/task"], rows, ratios, args.json)

if __name__ == "__main__":
    main()
