"""What the terminal shows while the command line works: a bar over claims (or one task), the running task's
name and elapsed seconds, and how far it is when its loops report (:mod:`attnflow.dynamics.progress`).

It is silent unless both stdout and stderr are terminals, so ``--json``, a pipe, a file and CI stay clean.
"""
from __future__ import annotations

import sys
import threading
import time

from tqdm import tqdm

from attnflow.dynamics import progress

__all__ = ["LiveBar", "wanted"]

TICK_SECONDS = 0.5  # how often the elapsed time is redrawn while a task runs without reporting


def wanted(*, quiet: bool = False) -> bool:
    """Draw progress only for a person at a terminal."""
    return not quiet and sys.stdout.isatty() and sys.stderr.isatty()


class LiveBar:
    """``with LiveBar(enabled, total=n, desc="claims") as live:`` then ``live.start(name)`` before each task and
    ``live.advance()`` after it; inside the block, :func:`attnflow.dynamics.progress.report` updates the share of
    the running task that is done.

    ``expected`` (task name -> seconds) turns the time left into an estimate from the tasks' expected times,
    scaled by how fast the finished ones went and shared among ``workers``; pass the name to ``advance``."""

    def __init__(self, enabled: bool, *, total: int | None = None, desc: str = "", unit: str = "task",
                 expected: dict | None = None, workers: int = 1):
        self.enabled = enabled
        self._expected = dict(expected or {})
        self._workers = max(1, workers)
        self._done_expected = self._done_actual = 0.0
        self._run_started = time.monotonic()
        bar_format = None if expected is None else "{n_fmt}/{total_fmt} {unit}s |{bar}| {elapsed}{postfix}"
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled, leave=False,
                         dynamic_ncols=True, bar_format=bar_format)
        self._task = ""
        self._started = time.monotonic()
        self._fraction: float | None = None
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._listening = progress.listening(self._listen)

    def __enter__(self) -> "LiveBar":
        self._listening.__enter__()
        if self.enabled:
            self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._ticker.is_alive():
            self._ticker.join(timeout=2 * TICK_SECONDS)
        self._listening.__exit__(*exc)
        self._bar.close()

    def start(self, task: str) -> None:
        self._task, self._started, self._fraction = task, time.monotonic(), None
        self._redraw()

    def advance(self, name: str | None = None, seconds: float | None = None) -> None:
        """One task done (``name`` and its ``seconds`` refine the estimate of the time left)."""
        if name in self._expected:
            expected = self._expected.pop(name)
            self._done_expected += expected
            self._done_actual += expected if seconds is None else seconds
        self._bar.update(1)
        self._redraw()

    def remaining_seconds(self) -> float | None:
        """The estimated wall time left: the work done plus the expected seconds of the tasks not done (scaled by
        how much longer than expected the finished ones took), over the workers, less the time already spent;
        None without expected times."""
        if not self._expected and not self._done_expected:
            return None
        pace = self._done_actual / self._done_expected if self._done_expected > 0 else 1.0
        work = self._done_actual + sum(self._expected.values()) * min(max(pace, 0.25), 4.0)
        return max(work / self._workers - (time.monotonic() - self._run_started), 1.0)

    def write(self, text: str) -> None:
        """Print ``text`` on stdout above the bar."""
        self._bar.write(text, file=sys.stdout)
        sys.stdout.flush()

    def _listen(self, done: float, total: float) -> None:
        self._fraction = done / total

    def _redraw(self) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self._started
        share = "" if self._fraction is None else f" {self._fraction:4.0%}"
        task = f"{self._task}{share} {elapsed:.0f}s" if self._task else ""
        left = self.remaining_seconds()
        eta = "" if left is None else f"ETA {_duration(left)}"
        self._bar.set_postfix_str(", ".join(part for part in (task, eta) if part), refresh=True)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self._redraw()


def _duration(seconds: float) -> str:
    """``75`` → ``1m15s``; ``4000`` → ``1h07m``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
