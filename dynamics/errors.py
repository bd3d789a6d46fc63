"""The ways a simulation can end other than by finishing: outcomes to report, not bad input."""
from __future__ import annotations

__all__ = ["DivergenceError", "StageFailure", "BudgetExceeded"]


class DivergenceError(FloatingPointError):
    """An integration or simulation left the finite, bounded region; the message names the step."""


class StageFailure(RuntimeError):
    """A run ended in a state the next stage cannot start from (SCB: it lost the attention signal): not a bad
    input, an outcome — the critical-batch search counts it as a failure at that batch."""


class BudgetExceeded(RuntimeError):
    """An adaptive integration used its budget of steps before the end time: the system is too stiff for the step
    control at these parameters (an explicit method needs steps of order 1/(largest rate)). The message names the
    time reached."""
