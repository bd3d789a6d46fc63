"""Parameter sweeps that survive interruption: a grid × seeds of tasks, run by the engine
(:mod:`attnflow.validation.engine`: joblib locally or a Dask cluster), each finished task written to a plain-file
result store as it completes.

A task is (target, parameters, seed). The target is a registered observable (``attnflow.validation.claims.observable``)
or a claim, whose settings the grid overrides. The store holds one JSON file per finished task, named by a
content hash of (target, parameters, seed, attnflow version, code fingerprint) and written atomically, so a sweep killed at any
point loses at most the tasks that were still running, and a rerun computes only what is missing. Loading never
unpickles anything. The code fingerprint (:mod:`attnflow.validation.fingerprint`) hashes the source of the
target's module and of everything it imports within attnflow and its own package, so a record computed by code
that has since been edited is not found under the new key and is computed afresh.

Replicate i of a sweep uses child i of the sweep's seed (:func:`attnflow.seeding.child`) at every grid point (a
paired design: common random numbers across the grid make slope estimates less noisy), so the numbers do not
depend on the number of workers or on the order in which tasks finish. The SeedSequence itself is stored in the
task's record (its entropy and spawn key), never an integer drawn from it; the bootstrap of a scaling fit takes
the sweep seed's child named "bootstrap".
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from dataclasses import dataclass, field
import numpy as np

from attnflow import seeding

from . import claims as claims_module
from . import systems
from .fingerprint import module_fingerprint
from .claims import ScalingLaw
from .engine import RUN_ID, ResultStore, run_tasks
from .report import version
from .stats import ExponentFit, fit_exponent

__all__ = ["Task", "ResultStore", "result_store", "SweepResult", "parse_grid", "replicate_seed", "run_seed", "run_sweep", "run_replicates",
           "execute_task", "scaling_fit",
           "target_fingerprint", "target_law"]

# ==================================================================================================
# Tasks and their keys
# ==================================================================================================


def replicate_seed(master_seed: seeding.SeedLike, replicate: int) -> np.random.SeedSequence:
    """The seed of replicate ``replicate``: child ``replicate`` of the sweep's seed."""
    return seeding.child(master_seed, replicate)


def _canonical(value):
    """JSON-stable form of a parameter value (numpy scalars → Python, tuples → lists)."""
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True, eq=False)  # the seed record is a dict: tasks are compared by key, not hashed
class Task:
    target: str
    params: tuple  # sorted (name, value) pairs
    seed: dict  # the replicate's SeedSequence as a record (attnflow.seeding.to_record)
    replicate: int
    code: str  # fingerprint of the source that computes the target
    setting: str = "quick"  # a claim's setting; "full" runs it at paper scale

    @property
    def key(self) -> str:
        fields = dict(target=self.target, params=[[k, _canonical(v)] for k, v in self.params], seed=self.seed,
                      version=version(), code=self.code)
        if self.setting != "quick":  # quick keys stay those of stores written before settings were keyed
            fields["setting"] = self.setting
        payload = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def as_dict(self) -> dict:
        return dict(self.params)

    def run(self) -> dict:
        return execute_task(self)


def parse_grid(specs: list[str]) -> dict:
    """``["N=10,20,40", "lr=0.1"]`` → ``{"N": [10, 20, 40], "lr": [0.1]}`` (ints stay ints)."""
    grid = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise ValueError(f"--grid takes NAME=v1,v2,…, got {spec!r}")
        parsed = []
        for text in values.split(","):
            text = text.strip()
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"grid values for {name} must be numbers, got {text!r}") from None
            if not math.isfinite(number):
                raise ValueError(f"grid values for {name} must be finite, got {text!r}")
            parsed.append(int(number) if number.is_integer() and "." not in text and "e" not in text.lower()
                          else number)
        if name in grid:
            raise ValueError(f"--grid names {name} twice")
        if len(set(parsed)) != len(parsed):
            raise ValueError(f"--grid gives a value of {name} twice: {values.strip()!r}")
        grid[name] = parsed
    return grid


def target_fingerprint(target: str) -> str:
    """The code fingerprint of the module that defines an observable's or a claim's function."""
    obs = systems.find_observable(target)
    function = obs.function if obs is not None else systems.select([target])[0].function
    return module_fingerprint(function.__module__)


def run_seed(first_seed: int, replicate: int) -> np.random.SeedSequence:
    """The seed of replicate ``replicate`` when replicates are independent runs: exactly what
    ``attnflow check --seed first_seed + replicate`` uses, random instance included."""
    return seeding.as_seed_sequence(first_seed + replicate, "seed")


def _tasks(target: str, grid: dict, seeds: int, master_seed, runs: bool, setting: str = "quick") -> list[Task]:
    names = sorted(grid)
    code = target_fingerprint(target)
    seed_of = (lambda i: run_seed(master_seed, i)) if runs else (lambda i: replicate_seed(master_seed, i))
    tasks = []
    for values in itertools.product(*(grid[n] for n in names)):
        params = tuple(zip(names, values))
        for i in range(seeds):
            tasks.append(Task(target, params, seeding.to_record(seed_of(i)), i, code, setting))
    return tasks


# ==================================================================================================
# Executing one task (top-level, so joblib and Dask workers can import it)
# ==================================================================================================


def _numbers_only(values: dict) -> dict:
    out = {}
    for k, v in values.items():
        if isinstance(v, (bool, np.bool_)):
            out[k] = bool(v)
        elif isinstance(v, (int, float, np.integer, np.floating)):
            out[k] = float(v) if math.isfinite(float(v)) else str(float(v))
    return out


def execute_task(task: Task) -> dict:
    """Run one task and return its record (what the store writes)."""
    started = time.perf_counter()
    seed = seeding.from_record(task.seed)
    obs = systems.find_observable(task.target)
    if obs is not None:
        result = _numbers_only(obs.measure(seed, **task.as_dict()))
    else:
        claim = systems.select([task.target])[0]
        outcome = claims_module.run_claim(claim, seed=seed, full=task.setting == "full", **task.as_dict())
        # The digest covers what the numbers leave out (text such as "17/20 (95% CP …)"), so two runs that
        # measured anything differently are told apart.
        measured = json.dumps(claims_module.to_jsonable(outcome.measured), sort_keys=True, default=str)
        result = dict(status=outcome.status, false_fail_rate=outcome.false_fail_rate,
                      measured_digest=hashlib.sha256(measured.encode()).hexdigest()[:16],
                      **_numbers_only(outcome.measured))
        if outcome.status == "ERROR":  # the message, so the sweep can say why without rerunning
            result["error"] = outcome.notes.splitlines()[0] if outcome.notes else ""
    return dict(key=task.key, target=task.target, params=[[k, _canonical(v)] for k, v in task.params],
                seed=task.seed, replicate=task.replicate, version=version(), code=task.code, result=result,
                seconds=round(time.perf_counter() - started, 6), run_id=RUN_ID)


# ==================================================================================================
# The store
# ==================================================================================================


RECORD_FIELDS = ("key", "target", "params", "seed", "replicate", "version", "code", "result", "seconds", "run_id")


def result_store(directory=None) -> ResultStore:
    """The store of sweep records (:class:`attnflow.validation.engine.ResultStore` checking their fields)."""
    return ResultStore(directory, fields=RECORD_FIELDS)


# ==================================================================================================
# Running a sweep
# ==================================================================================================


@dataclass
class SweepResult:
    target: str
    grid: dict
    seeds: int
    records: list  # in grid order, seeds innermost
    computed: int
    reused: int
    seconds: float
    master_seed: np.random.SeedSequence | None = None
    law: ScalingLaw | None = None
    fit: ExponentFit | None = None
    extra: dict = field(default_factory=dict)

    def values(self, metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
        """(x values, metric array of shape (n_x, seeds)) for a one-parameter sweep over ``x``."""
        if set(self.grid) != {x}:
            raise ValueError(f"a scaling fit needs a sweep over {x!r} alone, got grid {sorted(self.grid)}")
        xs = np.array(self.grid[x], float)
        ys = np.empty((xs.size, self.seeds))
        for r in self.records:
            i = self.grid[x].index(dict(r["params"])[x])
            value = r["result"].get(metric)
            if value is None:
                raise ValueError(f"{self.target} did not return metric {metric!r} (it returns {sorted(r['result'])})")
            ys[i, r["replicate"]] = float(value)
        return xs, ys


def target_law(target: str) -> ScalingLaw | None:
    """The scaling law an observable states (None for a claim or an observable without one)."""
    obs = systems.find_observable(target)
    return obs.law if obs is not None else None


def _validate_target(target: str, grid: dict, full: bool = False) -> None:
    obs = systems.find_observable(target)
    if obs is not None:
        defaults = obs.defaults
        unknown = set(grid) - set(defaults)
        if unknown:
            raise ValueError(f"{target} has no parameter(s) {sorted(unknown)}; it takes {sorted(defaults)}")
    else:
        claim = systems.select([target])[0]  # raises ValueError for an unknown name
        if claim.name != target.replace("-", "_"):
            raise ValueError(f"sweep a single claim or observable, not the system {target!r}")
        defaults = claim.full if full else claim.quick
        unknown = set(grid) - set(defaults)
        if unknown:
            raise ValueError(f"{target} has no setting(s) {sorted(unknown)}; it takes {sorted(defaults)}")
    for name, values in grid.items():  # a parameter whose default is a whole number takes whole numbers only
        default = defaults[name]
        if isinstance(default, int) and not isinstance(default, bool):
            bad = [v for v in values if not float(v).is_integer()]
            if bad:
                raise ValueError(f"{name} must be an integer, got {bad[0]!r}")
            # A positive whole-number setting is a size or a count (prompts, dimensions, steps): 0 or fewer
            # would run nothing, or crash inside the claim after the work has started.
            if default >= 1 and min(values) < 1:
                raise ValueError(f"{name} must be >= 1 (a size or count), got {min(values)!r}")


def run_sweep(target: str, grid: dict, *, master_seed: seeding.SeedLike, seeds: int = 8, store=None,
              n_jobs: int = -1, scheduler: str | None = None, progress: bool = False) -> SweepResult:
    """Run ``target`` over the product of ``grid`` × ``seeds`` replicates, skipping tasks already in ``store``.

    Parameters
    ----------
    target : str
        A registered observable or claim (``attnflow sweep --list`` shows the observables).
    grid : dict[str, list]
        Parameter values; the product is swept.
    master_seed : int or SeedSequence
        The sweep's seed; replicate i takes its child i.
    seeds : int
        Replicates per grid point (>= 1; >= 8 for a trustworthy bootstrap interval).
    store : path, ResultStore or None
        Where finished tasks go; ``None`` keeps them in memory.
    n_jobs : int
        joblib workers (``-1``: all cores; ``1``: in this process).
    scheduler : str, optional
        Address of a ``dask.distributed`` scheduler; when given, Dask runs the tasks instead of joblib.
    progress : bool
        Show a tqdm bar over tasks.
    """
    if not grid:
        raise ValueError("the grid is empty: give at least one --grid NAME=v1,v2")
    return run_replicates(target, grid, master_seed=master_seed, seeds=seeds, store=store, n_jobs=n_jobs,
                          scheduler=scheduler, progress=progress)


def run_replicates(target: str, grid: dict, *, master_seed: seeding.SeedLike, seeds: int = 8, store=None,
                   n_jobs: int = -1, scheduler: str | None = None, progress: bool = False,
                   runs: bool = False, full: bool = False) -> SweepResult:
    """:func:`run_sweep` without the requirement of a grid: with ``grid = {}`` the target runs at its own
    settings over ``seeds`` replicates (what calibration needs).

    ``runs=True`` makes replicate i the independent run ``--seed master_seed + i`` (:func:`run_seed`), with its
    own random instance; by default replicates are children of ``master_seed`` and share the run's instance.
    ``full=True`` runs a claim at its full (paper-scale) setting."""
    target = target.replace("-", "_") if "." in target else target
    if isinstance(n_jobs, bool) or int(n_jobs) != n_jobs or not (n_jobs == -1 or n_jobs >= 1):
        raise ValueError(f"n_jobs (--jobs) must be a number of workers >= 1, or -1 for every core; got {n_jobs}")
    if isinstance(seeds, bool) or int(seeds) != seeds or seeds < 1:
        raise ValueError(f"seeds must be a positive integer, got {seeds}")
    if runs and (isinstance(master_seed, (bool, np.bool_)) or not isinstance(master_seed, (int, np.integer))
                 or master_seed < 0):
        raise ValueError(f"with independent runs the seed must be a non-negative integer, got {master_seed!r}")
    first = int(master_seed) if runs else None
    master_seed = seeding.as_seed_sequence(master_seed, "master_seed")
    if full and systems.find_observable(target) is not None:
        raise ValueError(f"{target} is an observable: it has no full setting (sweep its parameters instead)")
    _validate_target(target, grid, full)
    store = store if isinstance(store, ResultStore) else result_store(store)
    tasks = _tasks(target, grid, int(seeds), first if runs else master_seed, runs, "full" if full else "quick")
    pending = [t for t in tasks if not store.has(t.key)]
    started = time.perf_counter()
    from tqdm import tqdm

    bar = tqdm(total=len(tasks), initial=len(tasks) - len(pending), desc=target, unit="task",
               disable=not progress or None)
    try:
        for record in run_tasks(pending, n_jobs=n_jobs, scheduler=scheduler):
            store.write(record)
            bar.update(1)
    finally:
        bar.close()
    # A key names a run, not its place in this sweep: the record of `--seed 1` written by another calibration (or
    # a verification) as its replicate 0 is this one's replicate 1. Each record takes its task's place.
    records = [dict(store.load(t.key), replicate=t.replicate) for t in tasks]
    extra = dict(quarantined=list(store.quarantined)) if store.quarantined else {}
    law = target_law(target)
    return SweepResult(target=target, grid=grid, seeds=int(seeds), records=records, computed=len(pending),
                       reused=len(tasks) - len(pending), seconds=time.perf_counter() - started,
                       master_seed=master_seed, law=law, extra=extra)


def scaling_fit(result: SweepResult, *, n_boot: int = 2000, level: float = 0.95) -> ExponentFit:
    """The target's scaling law fitted on a finished sweep (bootstrap over seeds, seeded by the sweep)."""
    if result.law is None:
        raise ValueError(f"{result.target} declares no scaling law to fit")
    x, y = result.values(result.law.y, result.law.x)
    result.fit = fit_exponent(x, y, kind=result.law.kind, n_boot=n_boot, level=level,
                              seed=seeding.named(result.master_seed, "bootstrap"))
    return result.fit
