"""The certificate rule shared by every routine that returns a decision (an active set, a rank, a stability verdict)
read off a numerical answer (DESIGN.md, Numerics): the certificate (a duality gap, a margin, a residual) travels
with the result, and a decision whose certificate did not reach its level is refused with what it reached.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import checks as check

__all__ = ["UncertifiedSolution", "RankDecision", "rank_decision", "check_cut", "ROUND_OFF", "ACCUMULATED_ROUND_OFF"]

# An eigenvalue or singular value at most this fraction of the largest is round-off of an exact zero: in float64 a
# product or sum of a few hundred terms carries relative errors of about 1e-15 (measured: ≤ 1.1e-15 on the
# enumerated Fisher informations of ccmc), and genuine small values of the problems here are above 1e-10.
ROUND_OFF = 1e-12
# The same for a quantity carried through many float64 operations — thousands of steps of an iterated map, an exact
# solver's identities (NNLS, SVD) — relative to O(1): ~1e-15 per step over up to 1e5 steps, with room to spare.
ACCUMULATED_ROUND_OFF = 1e-9


class UncertifiedSolution(RuntimeError):
    """A decision was asked of a numerical answer whose certificate did not reach the level that makes it
    trustworthy. ``certificate`` is the value reached (a relative duality gap, a margin, a relative eigenvalue);
    ``gap`` is the same number, the name the SVM solvers' callers use."""

    def __init__(self, message: str, certificate: float):
        super().__init__(message)
        self.certificate = certificate

    @property
    def gap(self) -> float:
        return self.certificate


@dataclass(frozen=True)
class RankDecision:
    """A numerical rank with its certificate: ``rank`` values above ``cut`` (relative to the largest), the smallest
    value counted (``smallest_kept``) and the largest not counted (``largest_dropped``), both relative to the
    largest. The rank is certified when every value not counted is round-off of an exact zero
    (``largest_dropped`` ≤ ``round_off``): a value between round-off and the cut would be a genuine small value
    read as zero."""

    rank: int
    cut: float
    smallest_kept: float
    largest_dropped: float
    round_off: float = ROUND_OFF

    @property
    def certified(self) -> bool:
        return self.largest_dropped <= self.round_off

    def require(self, what: str) -> int:
        """The rank, or :class:`UncertifiedSolution` naming ``what`` with the value that sits between round-off and
        the cut."""
        if not self.certified:
            raise UncertifiedSolution(
                f"{what}: a value {self.largest_dropped:.2g} of the largest is below the rank cut {self.cut:g} but "
                f"above round-off ({self.round_off:g}); the rank is undecided at this cut", self.largest_dropped)
        return self.rank


def check_cut(cut, name: str) -> float:
    """A relative rank cut in (0, 1): at 1 or above not even the largest value would count."""
    cut = check.real(cut, name, minimum=0.0, strict=True)
    if cut >= 1.0:
        raise ValueError(f"{name} must be < 1 (a cut relative to the largest value), got {cut}")
    return cut


def rank_decision(values, cut: float, round_off: float = ROUND_OFF) -> RankDecision:
    """The rank of ``values`` (eigenvalues of a PSD matrix or singular values, any shape) at ``cut`` relative to the
    largest magnitude, with its certificate (:class:`RankDecision`). All values zero: rank 0, certified."""
    values = np.ravel(check.finite_array(values, "values"))
    cut = check_cut(cut, "cut")
    round_off = check.real(round_off, "round_off", minimum=0.0)
    largest = float(np.abs(values).max(initial=0.0))
    if largest == 0.0:
        return RankDecision(0, cut, float("nan"), 0.0, round_off)
    kept = values > cut * largest  # a negative eigenvalue of a PSD matrix is round-off: never counted
    return RankDecision(int(kept.sum()), cut, float(values[kept].min(initial=np.inf) / largest),
                        float(np.abs(values[~kept]).max(initial=0.0) / largest), round_off)
