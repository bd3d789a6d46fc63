"""What every benchmark script shares: CPU timing of contenders run side by side, the machine's GEMM rate (the
floor every kernel is compared with), and the output convention (a table, or with ``--json`` one JSON object of
named ratios on stdout with the table moved to stderr).

A ratio is always "how many times faster attnflow is" (> 1 is better for attnflow) unless its name says
otherwise, e.g. ``..._over_floor`` (time / floor time: 1 is the machine's limit, lower is better).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Callable

import numpy as np

from attnflow.validation.report import platform


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with the flags every benchmark takes."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print a JSON object of named ratios (table on stderr)")
    p.add_argument("--repeats", type=_at_least_one, default=5,
                   help="interleaved repeats per contender (median CPU time)")
    return p


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def cpu_seconds(function: Callable[[], object]) -> float:
    """CPU time of one call: process time, so a busy neighbour core does not count against the contender."""
    start = time.process_time()
    function()
    return time.process_time() - start


def side_by_side(cases: dict[str, Callable[[], object]], repeats: int, warmup: bool = True) -> dict[str, float]:
    """Median CPU seconds per contender. Every contender is called once first (compile or cache load, not
    counted), then the contenders take turns ``repeats`` times, so drifts of the machine hit all alike. Each round
    takes them in a new random order (seeded: the same orders every run): a call runs slower after one that filled
    the caches with its own code and data, and in a fixed order, or a rotation of it, each contender would always
    follow the same neighbour (the first of a table, say, always the scipy solve at its end)."""
    if warmup:
        for function in cases.values():
            function()
    labels = list(cases)
    orders = np.random.default_rng(np.random.SeedSequence(0))
    timings: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(repeats):
        for index in orders.permutation(len(labels)):
            timings[labels[index]].append(cpu_seconds(cases[labels[index]]))
    return {label: statistics.median(values) for label, values in timings.items()}


def gemm_rate(m: int, k: int, n: int, repeats: int = 7, dtype=np.float64) -> float:
    """Measured GEMM rate (flop/s, float64 unless ``dtype`` says otherwise) of an (m, k) @ (k, n) product on this
    core: 2mkn flops per call, with as many calls per timing as make it last about 20 ms."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype)
    np.matmul(a, b, out=out)
    calls = max(1, int(2e7 / max(2.0 * m * k * n, 1.0)))
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            np.matmul(a, b, out=out)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2.0 * m * k * n / best


def seconds_at_accuracy(points: list[tuple[float, float]], target: float) -> tuple[float, str]:
    """The CPU time a solver needs to reach error ``target``, read off its work–precision points ``(error,
    seconds)`` (one per tolerance of a sweep): interpolated linearly in (log error, log seconds) between the two
    points of the Pareto front (no other point both more accurate and faster) that bracket ``target``.

    Returns ``(seconds, how)``: ``how`` is ``"interpolated"``, ``"not reached"`` (nan: no point is as accurate as
    ``target``) or ``"loosest"`` (every point of the front is more accurate than ``target``: the time of the
    front's fastest point, an upper bound on the time needed, so a ratio against it favours the other solver).
    """
    if not points or not target > 0.0:
        raise ValueError("points must be non-empty and target > 0")
    front = []  # error increasing, time decreasing
    for error, seconds in sorted((max(e, 1e-300), s) for e, s in points):
        if not front or seconds < front[-1][1]:
            front.append((error, seconds))
    if target < front[0][0]:
        return math.nan, "not reached"
    if target >= front[-1][0]:
        return front[-1][1], "loosest"
    for (e1, t1), (e2, t2) in zip(front, front[1:]):
        if e1 <= target <= e2:
            weight = math.log(target / e1) / math.log(e2 / e1)
            return math.exp(math.log(t1) + weight * math.log(t2 / t1)), "interpolated"
    raise AssertionError("unreachable: the front brackets the target")


def emit(title: str, header: list[str], rows: list[list[object]], ratios: dict[str, float], as_json: bool) -> None:
    """Print the table (stdout, or stderr under --json) and, under --json, the named ratios as one JSON object."""
    stream = sys.stderr if as_json else sys.stdout
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    print(f"== {title} ==", file=stream)
    print(f"platform: {platform()}", file=stream)  # ratios against baselines depend on the CPU and the libraries
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)), file=stream)
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=stream)
    if as_json:
        print(json.dumps({"benchmark": title, "platform": platform(), "ratios": {k: float(v) for k, v in ratios.items()}},
                         indent=1))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def check_documents(paths: list[str]):
    """The ``attnflow check --json`` documents in ``paths``: files, or folders of them (one per claim, as a
    campaign of single-claim runs leaves, or a ``check --store`` folder, whose records each hold one claim's
    entry); empty files (a run still going) are skipped."""
    from pathlib import Path

    for path in map(Path, paths):
        for file in sorted(path.glob("*.json")) if path.is_dir() else [path]:
            text = file.read_text(encoding="utf-8").strip()
            if not text:
                continue
            document = json.loads(text)
            if document.get("kind") == "check":  # a stored outcome
                document = dict(setting=document["setting"], results=[document["result"]])
            yield document
