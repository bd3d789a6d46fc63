"""``attnflow check`` on the engine: one task per claim, its whole outcome stored the moment it finishes.

A claim's task is keyed by what determines its numbers: the claim, its setting (quick or full), the master seed,
the fingerprint of the code that computes it (:mod:`attnflow.validation.fingerprint`), the attnflow version and
the versions of the numerical libraries. Its record holds the claim's full outcome (the ``attnflow check --json``
entry), its figure as PNG when one was asked for, the platform that computed it and its time. Every path goes
through the record, in this process as in a worker, so ``--jobs 1``, ``--jobs N`` and a Dask cluster give the
same JSON bit for bit: a claim's randomness derives from the master seed and its name alone
(:meth:`attnflow.validation.claims.Claim.seed_sequence`) and BLAS runs on one thread in every task
(:func:`attnflow.validation.engine.one_blas_thread`).

Claims start longest first, by the durations in ``durations.json`` (measured on one core; a claim missing there is
assumed to take the median), so the wall time approaches max(total / workers, longest claim); on several
workers, short claims of one system run together (:func:`batches`).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import platform as _platform
import re
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from importlib import resources

from . import engine, report, systems
from .claims import CheckResult, Claim, run_claim
from .fingerprint import module_fingerprint

__all__ = ["ClaimTask", "ClaimBatch", "batches", "CheckRun", "RECORD_FIELDS", "run_checks", "result_from_record", "figure_from_record",
           "figure_files_from_record", "tasks_for",
           "expected_seconds", "match_expression", "library_versions", "store_for", "stored_results",
           "systems_with_cold_kernels"]

RECORD_FIELDS = ("key", "kind", "claim", "setting", "seed", "version", "libraries", "code", "platform", "result",
                 "figure", "figure_drawn", "seconds", "run_id")
KIND = "check"


@functools.lru_cache(maxsize=1)
def library_versions() -> str:
    """The versions whose change may move a number's last bits (the CPU is recorded with each result instead: a
    cluster's workers may differ from the machine that computes the keys)."""
    import llvmlite
    import numba
    import numpy
    import scipy

    return (f"Python {_platform.python_version()}, numpy {numpy.__version__}, scipy {scipy.__version__}, "
            f"numba {numba.__version__}, llvmlite {llvmlite.__version__}")


@dataclass(frozen=True)
class ClaimTask:
    """One claim at one setting and seed; ``draw_figure`` and ``expected`` do not change its numbers, so they are
    not part of its key."""

    claim: str
    setting: str  # "quick" or "full"
    seed: int
    code: str  # the fingerprint of the claim's module and what it imports
    libraries: str
    draw_figure: bool = False
    expected: float = 0.0  # seconds, for ordering and the ETA
    figure_formats: tuple = ("png",)  # PNG for the reports, and any of FIGURE_FORMATS for a paper

    @property
    def key(self) -> str:
        payload = json.dumps(dict(kind=KIND, claim=self.claim, setting=self.setting, seed=self.seed,
                                  version=report.version(), code=self.code, libraries=self.libraries), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def run(self) -> dict:
        claim = systems.select([self.claim])[0]
        result = run_claim(claim, seed=self.seed, full=self.setting == "full")
        figure = _render(result, self.figure_formats) if self.draw_figure else None
        return dict(key=self.key, kind=KIND, claim=self.claim, setting=self.setting, seed=self.seed,
                    version=report.version(), libraries=self.libraries, code=self.code, platform=report.platform(),
                    result=result.to_dict(), figure=figure, figure_drawn=self.draw_figure,
                    seconds=round(result.seconds, 3), run_id=engine.RUN_ID)


def _render(result: CheckResult, formats=("png",)) -> dict | None:
    """The claim's figure in each of ``formats`` (PNG always), base64, or why it could not be drawn (its numbers
    are kept either way)."""
    if result.figure is None:
        return None
    try:
        drawn = report.draw_figure(result, formats)  # warns of a layout defect (validation.figure_check)
    except Exception as error:
        return dict(error=f"{type(error).__name__}: {error}")
    return {form: base64.b64encode(data).decode("ascii") for form, data in drawn.items()}


def result_from_record(record: dict) -> CheckResult:
    """The CheckResult a record holds."""
    r = record["result"]
    return CheckResult(name=r["name"], system=r["system"], reference=r["reference"], statement=r["statement"],
                       status=r["status"], measured=r["measured"], predicted=r["predicted"],
                       tolerance=r["tolerance"], basis=r["basis"], details=r["details"], notes=r["notes"],
                       setting=r["setting"], seed=r["seed"], seconds=r["seconds"], finding=r["finding"],
                       labels=r["labels"], false_fail_rate=r["false_fail_rate"])


def figure_from_record(record: dict) -> bytes | str | None:
    """The figure a record holds: PNG bytes, why it could not be drawn, or None (the claim draws none)."""
    figure = record.get("figure")
    if figure is None:
        return None
    return base64.b64decode(figure["png"]) if "png" in figure else figure.get("error", "not drawn")


def figure_files_from_record(record: dict) -> dict:
    """Format -> bytes of every drawing of the figure a record holds (empty when it has none)."""
    figure = record.get("figure") or {}
    return {form: base64.b64decode(figure[form]) for form in report.FIGURE_FORMATS if form in figure}


# ----------------------------------------------------------------------------------------------------------------
# Which claims, in which order
# ----------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _durations() -> dict:
    text = resources.files("attnflow.validation").joinpath("durations.json").read_text("utf-8")
    return json.loads(text)


def expected_seconds(claim: str, setting: str) -> float:
    """A claim's measured time at a setting (one core, warm cache); the median of the table when it is missing."""
    table = _durations().get(setting, {})
    if claim in table:
        return float(table[claim])
    return float(statistics.median(table.values())) if table else 1.0


def tasks_for(claims: list[Claim], *, setting: str, seed: int, draw_figures: bool,
              figure_formats: tuple = ("png",)) -> list[ClaimTask]:
    libraries = library_versions()
    return [ClaimTask(c.name, setting, int(seed), module_fingerprint(c.function.__module__), libraries, draw_figures,
                      expected_seconds(c.name, setting), tuple(figure_formats)) for c in claims]


CLUSTER_WORKERS = 16
MAX_BATCH_SECONDS = 30.0  # a batch's results arrive together: an interrupt loses at most this much finished work


@dataclass(frozen=True)
class ClaimBatch:
    """Claims of one system run one after another in one worker, in the registry's order. Claims of a system
    share what their module computes once (a cached optimum, a trained trajectory) and the kernels a worker
    loads; spread over workers, each worker would compute and load them again (22 s of 139 s CPU for the quick
    suite on two workers, measured). The records come back together when the batch ends."""

    tasks: tuple

    @property
    def expected(self) -> float:
        return sum(t.expected for t in self.tasks)

    def run(self) -> list[dict]:
        return [task.run() for task in self.tasks]


def batches(tasks: list[ClaimTask], workers: int, cold: frozenset = frozenset()) -> list[ClaimBatch]:
    """The tasks in batches for ``workers`` workers, longest batch first.

    One worker runs one claim per batch (each is printed as it finishes). With more, consecutive claims of a
    system share a batch up to max(longest claim, total / (4 · workers)) expected seconds, and never more than
    ``MAX_BATCH_SECONDS`` unless one claim alone takes longer: small enough that longest-first keeps the workers
    evenly loaded, large enough that a system's claims mostly meet in one worker. The claims of a system in
    ``cold`` (its kernels not yet in numba's cache, :func:`systems_with_cold_kernels`) form one batch, so one
    worker compiles its kernels instead of each worker that gets one of its claims."""
    if workers <= 1 or not tasks:  # in the registry's order: one process prints them as they come
        return [ClaimBatch((task,)) for task in tasks]
    total = sum(t.expected for t in tasks)
    cap = min(max(max(t.expected for t in tasks), total / (4 * workers)), MAX_BATCH_SECONDS)
    grouped: list[list[ClaimTask]] = []
    for task in tasks:
        last = grouped[-1] if grouped else None
        system = task.claim.split(".")[0]
        if (last and last[0].claim.split(".")[0] == system
                and (system in cold or sum(t.expected for t in last) + task.expected <= cap)):
            last.append(task)
        else:
            grouped.append([task])
    return sorted((ClaimBatch(tuple(group)) for group in grouped), key=lambda b: -b.expected)


def systems_with_cold_kernels(claims: list[Claim]) -> frozenset:
    """The systems of ``claims`` whose compiled kernels are mostly missing from numba's on-disk cache (a fresh
    clone, an edited kernel): fewer than half of the kernels defined in the claims' modules and the attnflow or
    plugin modules they name have a cache index for the current source. A kernel the quick claims never call has
    none even on a warm cache, hence the majority rule. Unknown (numba's cache layout changed): none is cold."""
    from numba.core.registry import CPUDispatcher

    cold = set()
    for system in {c.system for c in claims}:
        modules = {}
        for c in claims:
            if c.system != system:
                continue
            module = sys.modules.get(c.function.__module__)
            if module is None:
                continue
            root = module.__name__.partition(".")[0]
            modules[module.__name__] = module
            for value in vars(module).values():
                if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] in ("attnflow", root):
                    modules[value.__name__] = value
        kernels = [value for name, module in modules.items() for value in vars(module).values()
                   if isinstance(value, CPUDispatcher) and getattr(value.py_func, "__module__", None) == name]
        try:
            cached = sum(bool(kernel._cache._cache_file._load_index()) for kernel in kernels)
        except (AttributeError, OSError, ValueError):
            return frozenset()
        if kernels and cached < len(kernels) / 2:
            cold.add(system)
    return frozenset(cold)


_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def match_expression(expression: str):
    """A pytest-style ``-k`` expression as a predicate on claim names: words match as case-insensitive substrings,
    combined with ``and``, ``or``, ``not`` and parentheses (``-k "svm and not rank"``)."""
    tokens = _TOKEN.findall(expression)
    if not tokens:
        raise ValueError("-k needs an expression, e.g. -k svm or -k 'gd_beta and not risk'")
    position = 0

    def peek():
        return tokens[position] if position < len(tokens) else None

    def take():
        nonlocal position
        position += 1
        return tokens[position - 1]

    def chain(word, operand, combine):
        """``operand (word operand)*``, folded left with ``combine``."""
        left = operand()
        while peek() == word:
            take()
            left = (lambda a, b: lambda name: combine(a(name), b(name)))(left, operand())
        return left

    def either():
        return chain("or", both, lambda a, b: a or b)

    def both():
        return chain("and", negation, lambda a, b: a and b)

    def negation():
        if peek() == "not":
            take()
            inner = negation()
            return lambda name: not inner(name)
        return atom()

    def atom():
        token = peek()
        if token is None or token in (")", "and", "or"):
            raise ValueError(f"-k: malformed expression {expression!r}")
        take()
        if token == "(":
            inner = either()
            if peek() != ")":
                raise ValueError(f"-k: unbalanced parentheses in {expression!r}")
            take()
            return inner
        word = token.lower().replace("-", "_")
        return lambda name: word in name.lower()

    predicate = either()
    if position != len(tokens):
        raise ValueError(f"-k: malformed expression {expression!r}")
    return predicate


# ----------------------------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------------------------

def store_for(directory) -> engine.ResultStore:
    return engine.ResultStore(directory, fields=RECORD_FIELDS)


@dataclass
class CheckRun:
    """What ``run_checks`` finished: results in the order the claims were given (those that finished)."""

    results: list[CheckResult]
    figures: dict  # claim name -> PNG bytes or an error message
    computed: int
    reused: int
    seconds: float
    interrupted: bool = False
    failure: str = ""  # why the run stopped before every claim finished (a worker that died, a lost cluster)
    quarantined: list = field(default_factory=list)
    missing: list = field(default_factory=list)  # claims that did not finish (an interrupted run)
    figure_files: dict = field(default_factory=dict)  # claim name -> {format: bytes}, every format drawn


def _reusable(record: dict, draw_figures: bool, figure_formats: tuple = ("png",)) -> bool:
    """An ERROR is the check breaking, not a verdict: it runs again. A record without its figure, or without
    one of the formats asked for, runs again when a figure is wanted."""
    if record["result"]["status"] == "ERROR":
        return False
    if not draw_figures:
        return True
    figure = record["figure"]
    return record["figure_drawn"] and (figure is None or "error" in figure or all(f in figure for f in figure_formats))


def run_checks(claims: list[Claim], *, setting: str = "quick", seed: int = 0, n_jobs: int = 1,
               scheduler: str | None = None, store=None, rerun: bool = False, draw_figures: bool = False,
               figure_formats: tuple = ("png",), on_result=None, on_start=None) -> CheckRun:
    """Run ``claims`` through the engine, reusing the sound stored records whose key still matches.

    ``on_result(result, reused)`` is called as each claim finishes (stored ones first), ``on_start(task)`` before
    a claim starts in this process. Ctrl-C stops the run; what finished is returned with ``interrupted=True``
    (and is already in the store). ``figure_formats`` (with ``draw_figures``): the formats each figure is saved
    in besides PNG, for a paper (``report.FIGURE_FORMATS``)."""
    started = time.perf_counter()
    store = store if isinstance(store, engine.ResultStore) else store_for(store)
    tasks = tasks_for(claims, setting=setting, seed=seed, draw_figures=draw_figures, figure_formats=figure_formats)
    records: dict[str, dict] = {}
    pending = []
    for task in tasks:
        if not rerun and store.has(task.key) and _reusable(store.load(task.key), draw_figures, task.figure_formats):
            records[task.claim] = store.load(task.key)
        else:
            pending.append(task)
    reused = len(records)
    if on_result is not None:
        for task in tasks:
            if task.claim in records:
                on_result(result_from_record(records[task.claim]), True)
    interrupted, failure = False, ""
    try:
        # a cluster's size is not known before it runs: its batches are cut as for CLUSTER_WORKERS workers
        workers = CLUSTER_WORKERS if scheduler is not None else engine.worker_count(n_jobs, len(pending))
        # on a cluster each worker has its own cache, so nothing is known about it here
        cold = frozenset() if scheduler is not None or workers <= 1 else systems_with_cold_kernels(
            [c for c in claims if c.name in {t.claim for t in pending}])
        for batch in engine.run_tasks(batches(pending, workers, cold), n_jobs=n_jobs, scheduler=scheduler,
                                      on_start=None if on_start is None else lambda b: on_start(b.tasks[0])):
            for record in batch:
                store.write(record)
                records[record["claim"]] = record
                if on_result is not None:
                    on_result(result_from_record(record), False)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as error:  # a worker killed (out of memory, a crash in compiled code) or a cluster lost
        failure = f"{type(error).__name__}: {error}".splitlines()[0]
    finished = [records[t.claim] for t in tasks if t.claim in records]
    results, figures = _results_and_figures(finished)
    return CheckRun(results=results, figures=figures, computed=len(records) - reused, reused=reused,
                    seconds=time.perf_counter() - started, interrupted=interrupted, failure=failure,
                    quarantined=list(store.quarantined), missing=[t.claim for t in tasks if t.claim not in records],
                    figure_files=_figure_files(finished))


def _results_and_figures(records: list[dict]) -> tuple[list[CheckResult], dict]:
    """The records' results in order, and their figures by claim name (claims without one left out)."""
    figures = {record["claim"]: figure_from_record(record) for record in records}
    return [result_from_record(record) for record in records], {k: v for k, v in figures.items() if v is not None}


def _figure_files(records: list[dict]) -> dict:
    return {record["claim"]: files for record in records if (files := figure_files_from_record(record))}


def stored_results(claims: list[Claim], store, *, setting: str, seed: int) -> CheckRun:
    """The stored outcomes of ``claims`` whose key matches the current code, without computing anything; the
    claims without one are listed in ``missing``."""
    store = store if isinstance(store, engine.ResultStore) else store_for(store)
    tasks = tasks_for(claims, setting=setting, seed=seed, draw_figures=True)
    missing = [task.claim for task in tasks if not store.has(task.key)]
    stored = [store.load(t.key) for t in tasks if t.claim not in missing]
    results, figures = _results_and_figures(stored)
    return CheckRun(results=results, figures=figures, computed=0, reused=len(results), seconds=0.0,
                    quarantined=list(store.quarantined), missing=missing, figure_files=_figure_files(stored))
