"""Per-task overhead of the sweep backends on this machine (not a test).

Runs the diagnostic observable ``sweep.sleep`` (zero work, or a fixed sleep) as a sweep in one process, with
joblib on all cores, and on a local Dask cluster, side by side, into throwaway stores. Each backend is warmed
up first (worker start and imports, reported separately); then overhead per task = (wall time − ideal time) /
tasks, where the ideal is the total sleep divided by the number of workers.

    python benchmarks/bench_sweep.py [--tasks 200] [--sleep 0.0]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from attnflow.validation.sweep import run_sweep


def timed(label, tasks, sleep, workers, **kwargs):
    with tempfile.TemporaryDirectory() as store:  # warm-up: start workers, import attnflow in each
        start = time.perf_counter()
        run_sweep("sweep.sleep", {"seconds": [0.0]}, seeds=4 * workers, store=store, master_seed=1, **kwargs)
        print(f"{label:34s} start-up (workers, imports) {time.perf_counter() - start:6.2f} s")
    with tempfile.TemporaryDirectory() as store:
        start = time.perf_counter()
        result = run_sweep("sweep.sleep", {"seconds": [sleep]}, seeds=tasks, store=store, **kwargs)
        wall = time.perf_counter() - start
    assert result.computed == tasks
    overhead = (wall - tasks * sleep / workers) / tasks
    print(f"{label:34s} wall {wall:7.2f} s   overhead per task {overhead * 1e3:8.2f} ms")
    return overhead


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"{args.tasks} tasks of sweep.sleep(seconds={args.sleep}) on {cores} cores, one JSON record each")
    timed("single process (n_jobs=1)", args.tasks, args.sleep, 1, n_jobs=1)
    timed(f"joblib loky (n_jobs={cores})", args.tasks, args.sleep, cores, n_jobs=cores)
    try:
        from dask.distributed import LocalCluster
    except ImportError:
        print("dask not installed: pip install 'attnflow[dask]'")
        return
    start = time.perf_counter()
    with LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        print(f"(local Dask cluster started in {time.perf_counter() - start:.2f} s, excluded below)")
        timed(f"dask LocalCluster ({cores} workers)", args.tasks, args.sleep, cores, scheduler=cluster.scheduler_address)


if __name__ == "__main__":
    main()
