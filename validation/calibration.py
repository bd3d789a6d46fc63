"""Calibration: how often a claim FAILs over many seeds when the theory holds, against the rate it states.

A stochastic claim states its nominal false-FAIL rate (``Outcome.false_fail_rate``, from its tolerance's
statistical basis). Run over N independent seeds (replicate i takes child i of the calibration seed, on the sweep
machinery, so the run is resumable and parallel with joblib or Dask), the number of outcomes that are not the
registered one is Binomial(N, rate). The exact Clopper–Pearson interval for that rate is set against the
nominal one: a claim is calibrated when the interval does not lie wholly above the nominal rate and the point
estimate is at most the nominal rate or 1%, whichever is larger (a rate far below 1% cannot be resolved by a few
hundred seeds, so 1% is the resolution asked of them). An ERROR is counted as a false alarm and listed.
"""
from __future__ import annotations

from dataclasses import dataclass

from attnflow import seeding

from . import sweep, systems
from .stats import clopper_pearson

__all__ = ["Calibration", "calibrate", "RESOLUTION"]

RESOLUTION = 0.01  # the smallest false-FAIL rate a calibration is asked to resolve
LEVEL = 0.95


@dataclass(frozen=True)
class Calibration:
    claim: str
    seeds: int
    alarms: int  # outcomes other than the registered one (FAIL, ERROR, or a finding that did not reproduce)
    errors: int
    nominal: float | None  # the claim's stated false-FAIL rate; None for a deterministic check
    low: float
    high: float
    computed: int
    reused: int

    @property
    def rate(self) -> float:
        return self.alarms / self.seeds

    @property
    def calibrated(self) -> bool:
        nominal = self.nominal or 0.0
        return self.low <= nominal and self.rate <= max(nominal, RESOLUTION)

    def as_dict(self) -> dict:
        return dict(claim=self.claim, seeds=self.seeds, alarms=self.alarms, errors=self.errors, rate=self.rate,
                    interval=[self.low, self.high], level=LEVEL, nominal=self.nominal, calibrated=self.calibrated,
                    computed=self.computed, reused=self.reused)


def calibrate(claim: str, *, seeds: int, master_seed: seeding.SeedLike, store=None, n_jobs: int = -1,
              scheduler: str | None = None, progress: bool = False) -> Calibration:
    """Run ``claim`` at its quick setting over ``seeds`` seeds and compare its false-FAIL rate with its nominal one.

    Finished replicates go to ``store`` as they complete (see :func:`attnflow.validation.sweep.run_sweep`)."""
    if isinstance(seeds, bool) or int(seeds) != seeds or seeds < 1:
        raise ValueError(f"seeds must be a positive integer, got {seeds}")
    selected = systems.select([claim])
    if len(selected) != 1 or selected[0].name != claim.replace("-", "_"):
        raise ValueError(f"calibrate one claim, not {claim!r} ({len(selected)} claims)")
    found = selected[0]
    result = sweep.run_replicates(found.name, {}, master_seed=master_seed, seeds=int(seeds), store=store,
                                  n_jobs=n_jobs, scheduler=scheduler, progress=progress)
    statuses = [r["result"]["status"] for r in result.records]
    registered = {"FINDING"} if found.finding else {"PASS"}
    alarms = sum(status not in registered for status in statuses)
    rates = {r["result"].get("false_fail_rate") for r in result.records} - {None}
    if len(rates) > 1:
        raise ValueError(f"{found.name} stated different nominal rates across seeds: {sorted(rates)}")
    low, high = clopper_pearson(alarms, len(statuses), LEVEL)
    return Calibration(claim=found.name, seeds=len(statuses), alarms=alarms,
                       errors=sum(status == "ERROR" for status in statuses), nominal=rates.pop() if rates else None,
                       low=low, high=high, computed=result.computed, reused=result.reused)
