"""Progress of long computations, reported to whoever listens.

Loops that can run for long (Monte-Carlo chunks, training steps run from Python, seeds of a search) call
:func:`report` with how much is done. Nothing happens unless a caller has installed a listener with
:func:`listening`: the command line installs one that draws a bar on a terminal, while a library user, a test or a
sweep worker sees nothing and pays one context-variable lookup. A context variable holds the listener, so nested
computations and threads do not mix their reports.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

__all__ = ["report", "listening"]

_LISTENER: contextvars.ContextVar[Callable[[float, float], None] | None] = contextvars.ContextVar(
    "attnflow_progress_listener", default=None)


def report(done: float, total: float) -> None:
    """Tell the listener, if any, that ``done`` of ``total`` units of the current computation are finished."""
    listener = _LISTENER.get()
    if listener is not None and total > 0:
        listener(min(float(done), float(total)), float(total))


@contextlib.contextmanager
def listening(callback: Callable[[float, float], None]) -> Iterator[None]:
    """Within the block, :func:`report` calls ``callback(done, total)``."""
    token = _LISTENER.set(callback)
    try:
        yield
    finally:
        _LISTENER.reset(token)
