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
    the running task that is done."""

    def __init__(self, enabled: bool, *, total: int | None = None, desc: str = "", unit: str = "task"):
        self.enabled = enabled
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled, leave=False,
                         dynamic_ncols=True)
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

    def advance(self) -> None:
        self._bar.update(1)

    def _listen(self, done: float, total: float) -> None:
        self._fraction = done / total

    def _redraw(self) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self._started
        share = "" if self._fraction is None else f" {self._fraction:4.0%}"
        self._bar.set_postfix_str(f"{self._task}{share} {elapsed:.0f}s", refresh=True)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self._redraw()
