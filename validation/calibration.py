"""Calibration: how often a claim FAILs over many seeds when the theory holds, against the rate it states.

A stochastic claim states its nominal false-FAIL rate (``Outcome.false_fail_rate``, from its tolerance's
statistical basis). Run over N independent runs (replicate i is exactly ``attnflow check CLAIM --seed s + i``,
random instance included, so a failing seed can be replayed; on the sweep machinery, so the run is resumable and
parallel with joblib or Dask), the number of outcomes that are not the registered one is Binomial(N, rate) (when
the stated rate depends on the random instance, the nominal rate is its mean over the seeds: the probability that
a random seed fails). The exact Clopper–Pearson interval for that rate is set against the nominal one: a claim is
calibrated when the interval does not lie wholly above the nominal rate, the point estimate is at most the nominal
rate or 1%, whichever is larger (a rate far below 1% cannot be resolved by a few hundred seeds, so 1% is the
resolution asked of them), and the interval lies below 20%: with fewer seeds than that takes (17 without a
failure) the interval cannot tell a calibrated claim from one that fails one run in five, and the verdict is "too
few seeds", with the number needed. An ERROR is counted as a false alarm and listed.

:func:`suite_alarm_rate` reads the table the other way: how often a correct installation's ``attnflow check``
exits 1 at a seed other than the default, because some claim failed by chance.

A calibration table (docs/calibration.md, with its machine-readable twin docs/calibration.json) collects one
entry per stochastic claim; :func:`write_table` rewrites both after every claim, so a long run loses nothing.

Each row keeps the fingerprint of the code that computed it and the status and measured-value digest of its first
seeds (its *witnesses*). After an edit elsewhere in attnflow changes a claim's fingerprint, :func:`verify_row` reruns
only the witness seeds: if they reproduce bit for bit, the row is carried forward to the new fingerprint (and keeps
the one that computed it); if not, the numbers changed and the claim must be recalibrated.

The bits also depend on the *platform* (:func:`platform`): the CPU, which numba compiles for and by which numpy's
SIMD loops and the BLAS choose their kernels, and the versions of Python and of the numerical libraries. A digest
recorded on one platform says nothing about an edit rerun on another, so each row names the platform of its
witnesses and may keep the same seeds' digests for other platforms. :func:`rewitness_row` records them on this
platform for a row whose code is current (the code that computed the row, so only the platform differs), provided
each seed keeps its status; a row's statistics are not tied to the last bits, but a seed whose verdict differs on
this platform means the row must be recalibrated here.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

try:  # POSIX advisory locks; without them (Windows) calibrations into one table must not run side by side
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

from . import engine, sweep, systems
from .report import platform
from .stats import clopper_pearson

__all__ = ["Calibration", "calibrate", "depends_on_seed", "RESOLUTION", "CEILING", "verdict", "seeds_needed",
           "SuiteAlarmRate", "suite_alarm_rate", "TABLE_SCHEMA", "read_table", "write_table",
           "update_table", "table_entry", "render_table", "verify_row", "rewitness_row", "platform",
           "claim_source_digest", "WITNESSES",
           "witness", "witnesses_here", "assertion_digest", "drop_from_table"]

RESOLUTION = 0.01  # the smallest false-FAIL rate a calibration is asked to resolve
# The rate a calibration must exclude to say anything: the interval's upper end must lie below 20%, a check that
# fails one run in five. Zero failures in 6 seeds leave [0, 46%], which cannot tell a calibrated claim from a
# broken one; 17 clean seeds reach 19.5%, 26 seeds with one failure 19.6%.
CEILING = 0.2
# The fewest seeds a row of the published table may rest on: 200 for every claim that costs under a second or so
# per seed, fewer for the slow ones (the row states its count, and its interval is correspondingly wider).
MIN_TABLE_SEEDS = 20
LEVEL = 0.95
# Seeds whose (status, measured digest) a row keeps, so a later edit can be checked by rerunning them alone.
WITNESSES = 2


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
    seconds: float = 0.0  # mean wall time of one seed
    code: str = ""  # fingerprint of the code that computed the seeds (validation/fingerprint.py)
    failing_seeds: tuple = ()  # the --seed of every run not as registered
    witnesses: tuple = ()  # (seed, status, measured digest) of the first WITNESSES seeds
    setting: str = "quick"  # the claim's setting the seeds ran at

    @property
    def rate(self) -> float:
        return self.alarms / self.seeds

    @property
    def verdict(self) -> str:
        return verdict(self.alarms, self.seeds, self.nominal)

    @property
    def calibrated(self) -> bool:
        return self.verdict == "calibrated"

    def as_dict(self) -> dict:
        return dict(claim=self.claim, seeds=self.seeds, alarms=self.alarms, errors=self.errors, rate=self.rate,
                    interval=[self.low, self.high], level=LEVEL, nominal=self.nominal, calibrated=self.calibrated,
                    verdict=self.verdict,
                    seeds_needed=seeds_needed(self.alarms) if self.verdict == "too few seeds" else None,
                    computed=self.computed, reused=self.reused, seconds_per_seed=round(self.seconds, 3),
                    failing_seeds=list(self.failing_seeds), setting=self.setting)


def verdict(alarms: int, seeds: int, nominal: float | None) -> str:
    """"MISCALIBRATED" when ``alarms`` in ``seeds`` show a false-FAIL rate above the nominal one (the exact interval
    lies wholly above it, or the measured rate exceeds the nominal rate or RESOLUTION, whichever is larger);
    otherwise "too few seeds" when the interval reaches CEILING or beyond, so that the seeds cannot tell; otherwise
    "calibrated". A claim that states no rate (None) is held to 0."""
    low, high = clopper_pearson(alarms, seeds, LEVEL)
    nominal = nominal or 0.0
    if low > nominal or alarms / seeds > max(nominal, RESOLUTION):
        return "MISCALIBRATED"
    return "too few seeds" if high >= CEILING else "calibrated"


def seeds_needed(alarms: int) -> int:
    """The fewest seeds whose interval, with ``alarms`` among them, lies below CEILING: how far a calibration with
    too few seeds must be extended if none of the new seeds fails."""
    seeds = max(alarms, 1)
    while clopper_pearson(alarms, seeds, LEVEL)[1] >= CEILING:
        seeds += 1
    return seeds


def calibrate(claim: str, *, seeds: int, first_seed: int, store=None, n_jobs: int = -1,
              scheduler: str | None = None, progress: bool = False, full: bool = False) -> Calibration:
    """Run ``claim`` at its quick (or, with ``full``, its full) setting over ``seeds`` seeds and compare its
    false-FAIL rate with its nominal one.

    Finished replicates go to ``store`` as they complete (see :func:`attnflow.validation.sweep.run_sweep`)."""
    if isinstance(seeds, bool) or int(seeds) != seeds or seeds < 1:
        raise ValueError(f"seeds must be a positive integer, got {seeds}")
    selected = systems.select([claim])
    if len(selected) != 1 or selected[0].name != claim.replace("-", "_"):
        raise ValueError(f"calibrate one claim, not {claim!r} ({len(selected)} claims)")
    found = selected[0]
    result = sweep.run_replicates(found.name, {}, master_seed=first_seed, seeds=int(seeds), store=store, runs=True,
                                  n_jobs=n_jobs, scheduler=scheduler, progress=progress, full=full)
    statuses = [r["result"]["status"] for r in result.records]
    registered = {"FINDING"} if found.finding else {"PASS"}
    alarms = sum(status not in registered for status in statuses)
    # An ERROR states no rate; it counts as an alarm, and the rate comes from the seeds that ran to a verdict.
    rates = [r["result"].get("false_fail_rate") for r in result.records if r["result"]["status"] != "ERROR"]
    stated = [rate for rate in rates if rate is not None]
    if stated and len(stated) != len(rates):
        raise ValueError(f"{found.name} stated a nominal rate at some seeds and none at others")
    # A claim whose number of tests depends on its random instance states a rate per seed; the probability that
    # a random seed fails is then the mean of those rates.
    nominal = sum(stated) / len(stated) if stated else None
    low, high = clopper_pearson(alarms, len(statuses), LEVEL)
    first = sorted(result.records, key=lambda r: r["replicate"])[:WITNESSES]
    return Calibration(claim=found.name, seeds=len(statuses), alarms=alarms,
                       errors=sum(status == "ERROR" for status in statuses), nominal=nominal,
                       low=low, high=high, computed=result.computed, reused=result.reused,
                       seconds=sum(r["seconds"] for r in result.records) / len(result.records),
                       code=result.records[0]["code"],
                       failing_seeds=tuple(first_seed + r["replicate"] for r, status in zip(result.records, statuses)
                                           if status not in registered),
                       witnesses=tuple(witness(r, first_seed) for r in first), setting="full" if full else "quick")


def witness(record: dict, first_seed: int) -> tuple:
    """(seed, status, measured digest) of a stored replicate of a calibration from ``first_seed``."""
    return first_seed + record["replicate"], record["result"]["status"], record["result"].get("measured_digest")


def depends_on_seed(claim: str, *, first_seed: int, store=None, n_jobs: int = -1,
                    scheduler: str | None = None, full: bool = False) -> bool:
    """Whether ``claim`` measures different numbers at the first two seeds of a calibration (a check that does
    not is deterministic and has no false-FAIL rate to measure). The two seeds are the calibration's own seeds 0
    and 1, so with a store a later calibration reuses them."""
    result = sweep.run_replicates(claim, {}, master_seed=first_seed, seeds=2, store=store, runs=True, n_jobs=n_jobs,
                                  scheduler=scheduler, full=full)
    first, second = (record["result"] for record in result.records)  # status, rate and measured numbers
    # A claim that crashed is calibrated (its ERRORs count as alarms), never taken for deterministic.
    return first != second or "ERROR" in (first["status"], second["status"])


# ==================================================================================================
# The calibration table
# ==================================================================================================

TABLE_SCHEMA = "attnflow.calibration-table/1"


def table_entry(found: Calibration, *, seed: int) -> dict:
    """One row of the table: the calibration, the seed it ran from, and the fingerprint of the code that ran it
    (the claim's module and what it imports from attnflow; see :mod:`attnflow.validation.fingerprint`)."""
    entry = found.as_dict()
    for transient in ("computed", "reused"):
        entry.pop(transient)
    return dict(entry, seed=seed, code=found.code, witnesses=[list(w) for w in found.witnesses], platform=platform(),
                claim_source=claim_source_digest(found.claim))


def witnesses_here(row: dict) -> list | None:
    """The row's witnesses recorded on this platform, or None when there are none (the row's own witnesses were
    recorded elsewhere, or before rows named their platform)."""
    here = platform()
    if row.get("platform") == here:
        return row.get("witnesses")
    return (row.get("platform_witnesses") or {}).get(here)


def claim_source_digest(claim: str) -> str:
    """16 hex digits of what the claim asserts: its own source, its decorator (statement, settings) included, so an
    edit to what the claim asserts changes it even when its measured numbers stay the same. Left out: how it draws
    its figure (the functions it hands its Outcome as ``figure=``, which are called only to draw) and comments and
    layout (the digest is of the parsed source, written back out)."""
    return assertion_digest(inspect.getsource(systems.select([claim])[0].function))


def assertion_digest(source: str) -> str:
    """:func:`claim_source_digest` of a claim function's source text."""
    tree = _without_figures(ast.parse(textwrap.dedent(source)))
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:16]


def _without_figures(tree: ast.Module) -> ast.Module:
    """``tree`` without the nested functions passed as ``figure=NAME`` and with ``figure=lambda: …`` emptied."""
    drawn = set()
    for node in ast.walk(tree):
        for keyword in getattr(node, "keywords", ()):
            if keyword.arg == "figure" and isinstance(keyword.value, ast.Name):
                drawn.add(keyword.value.id)
            elif keyword.arg == "figure" and isinstance(keyword.value, ast.Lambda):
                keyword.value = ast.Constant(None)
    top = tree.body[0]
    for node in ast.walk(top):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [child for child in body if not (isinstance(child, ast.FunctionDef) and child is not top
                                                          and child.name in drawn)] or [ast.Pass()]
    return tree


def _sidecar(markdown: Path) -> Path:
    return markdown.with_suffix(".json")


def read_table(markdown) -> dict[str, dict]:
    """The entries (claim -> row) of the table at ``markdown``, read from its JSON twin; empty when there is none.

    A twin that cannot be read is an error naming the file, never an empty table written over it."""
    path = _sidecar(Path(markdown))
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"the calibration table {path} cannot be read ({type(error).__name__}: {error}); "
                         "move it aside to start a new one") from None
    if not isinstance(document, dict) or document.get("schema") != TABLE_SCHEMA \
            or not isinstance(document.get("claims"), list) \
            or not all(isinstance(entry, dict) and isinstance(entry.get("claim"), str) for entry in document["claims"]):
        raise ValueError(f"{path} is not a calibration table (schema {TABLE_SCHEMA}); move it aside")
    return {entry["claim"]: entry for entry in document["claims"]}


def write_table(markdown, entries: dict[str, dict]) -> None:
    """Write the table (Markdown) and its JSON twin, rows sorted by claim, each file replaced atomically."""
    markdown = Path(markdown)
    rows = [entries[name] for name in sorted(entries)]
    engine.write_atomically(_sidecar(markdown), json.dumps(dict(schema=TABLE_SCHEMA, claims=rows), indent=1,
                                                     allow_nan=False) + "\n")
    engine.write_atomically(markdown, render_table(rows))


def _edit_table(markdown, edit) -> bool:
    """Apply ``edit(entries) -> changed`` to the table on disk under an exclusive lock, so calibrations of
    different claims may run side by side into one table; write it only if something changed."""
    markdown = Path(markdown)
    with open(markdown.with_suffix(".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        entries = read_table(markdown)
        changed = edit(entries)
        if changed:
            write_table(markdown, entries)
        return changed


def update_table(markdown, entry: dict) -> None:
    """Merge one row into the table on disk: read, replace the claim's row, write."""

    def replace_row(entries):
        entries[entry["claim"]] = entry
        return True

    _edit_table(markdown, replace_row)


def drop_from_table(markdown, claim: str) -> bool:
    """Remove a claim's row (one found deterministic is not listed); True if there was one. A table that does not
    exist yet is left alone."""
    if not _sidecar(Path(markdown)).exists():
        return False
    return _edit_table(markdown, lambda entries: entries.pop(claim, None) is not None)


def _valid_witness(witness) -> bool:
    return (isinstance(witness, (list, tuple)) and len(witness) == 3 and isinstance(witness[0], int)
            and not isinstance(witness[0], bool) and witness[0] >= 0 and isinstance(witness[1], str)
            and isinstance(witness[2], str))


def _row(markdown, claim: str) -> dict:
    entries = read_table(markdown)
    if claim not in entries:
        raise ValueError(f"{claim} has no row in {markdown}")
    return entries[claim]


def _unusable(row: dict, claim: str, witnesses: list) -> str | None:
    """Why a row's ``witnesses`` cannot vouch for it (none, or from code that stored no digest; or the claim's own
    source changed), or None."""
    if not witnesses or not all(_valid_witness(w) for w in witnesses):
        return "no witnesses"
    if row.get("claim_source") != claim_source_digest(claim):
        return "the claim's own source changed" if row.get("claim_source") else "no claim source digest"
    return None


def verify_row(markdown, claim: str, *, store=None, n_jobs: int = -1, scheduler: str | None = None) -> str:
    """Check a row against the current code: "current" when its fingerprint is the current one; otherwise rerun its
    witness seeds and, if each reproduces its status and measured digest bit for bit and the claim's own source is
    the one that was calibrated, carry the row forward to the current fingerprint ("carried"; the row keeps the
    fingerprint that computed it as ``computed_by``). Anything else leaves the row stale, and the answer says why:
    recalibrate it. Two seeds that reproduce show that the edit did not touch the arithmetic those seeds run
    through; an edit confined to a branch they never take would pass unseen, and an edit to what the claim asserts
    is caught by the claim's source digest, not by its numbers. The witnesses compared are this platform's when the
    row has them; otherwise its own, and a mismatch then says that the platform may be the cause."""
    row = _row(markdown, claim)
    current = sweep.target_fingerprint(claim)
    if row["code"] == current:
        return "current"
    here = witnesses_here(row)
    witnesses = (row.get("witnesses") if here is None else here) or []
    refused = _unusable(row, claim, witnesses)
    if refused:
        return refused
    for expected in witnesses:
        status, digest = _rerun(claim, expected[0], store=store, n_jobs=n_jobs, scheduler=scheduler,
                                full=row.get("setting") == "full")
        if [status, digest] != list(expected[1:]):
            if here is None:  # the bits may differ through the platform alone
                return (f"changed at seed {expected[0]}, against witnesses recorded on another platform "
                        f"({row.get('platform') or 'not named'}): record this platform's with --rewitness at the "
                        "code that computed the row, or recalibrate")
            return f"changed at seed {expected[0]}"

    def carry(entries):
        entry = entries.get(claim)
        if entry is None or entry["code"] != row["code"]:  # rewritten meanwhile by another process
            return False
        entries[claim] = dict(entry, code=current, computed_by=entry.get("computed_by", entry["code"]))
        return True

    if _edit_table(markdown, carry):
        return "carried"
    return "current" if read_table(markdown).get(claim, {}).get("code") == current else "rewritten meanwhile"


def _rerun(claim: str, seed: int, *, store, n_jobs: int, scheduler: str | None,
           full: bool = False) -> tuple[str, str | None]:
    """(status, measured digest) of ``attnflow check CLAIM --seed seed`` (``--full``), possibly reused from
    ``store``."""
    result = sweep.run_replicates(claim, {}, master_seed=seed, seeds=1, store=store, runs=True, n_jobs=n_jobs,
                                  scheduler=scheduler, full=full)
    record = result.records[0]  # possibly reused from the store, where it may carry another replicate index
    return record["result"]["status"], record["result"].get("measured_digest")


def rewitness_row(markdown, claim: str, *, store=None, n_jobs: int = -1, scheduler: str | None = None) -> str:
    """Record a row's witnesses on this platform: rerun its witness seeds with the code that computed the row (its
    fingerprint must be the current one) and keep their digests under :func:`platform` ("recorded"; "already
    recorded" when this platform has them). Refused, with the reason, for a stale row, an edited claim, or a seed
    whose status differs from the one recorded: that seed's verdict depends on the platform, so the row's counts
    may too, and it must be recalibrated here."""
    row = _row(markdown, claim)
    if row["code"] != sweep.target_fingerprint(claim):
        return "stale: record its witnesses with the code that computed the row, or recalibrate"
    if witnesses_here(row) is not None:
        return "already recorded"
    witnesses = row.get("witnesses") or []
    refused = _unusable(row, claim, witnesses)
    if refused:
        return refused
    recorded = []
    for seed, status, _ in witnesses:
        status_here, digest = _rerun(claim, seed, store=store, n_jobs=n_jobs, scheduler=scheduler,
                                     full=row.get("setting") == "full")
        if status_here != status:
            return f"seed {seed} is {status_here} on this platform and was {status}: recalibrate here"
        recorded.append([seed, status, digest])

    def record(entries):
        entry = entries.get(claim)
        if entry is None or entry["code"] != row["code"]:  # rewritten meanwhile by another process
            return False
        entries[claim] = dict(entry, platform_witnesses={**(entry.get("platform_witnesses") or {}),
                                                         platform(): recorded})
        return True

    return "recorded" if _edit_table(markdown, record) else "rewritten meanwhile"


def _seed_list(seeds, shown: int = 5) -> str:
    more = f" … (+{len(seeds) - shown})" if len(seeds) > shown else ""
    return ", ".join(str(s) for s in seeds[:shown]) + more


def _percent(value: float) -> str:
    if not value:
        return "0"
    percent = 100 * value
    return f"{percent:.2g}%" if percent < 10 else f"{percent:.0f}%"


def _code(row: dict) -> str:
    computed_by = row.get("computed_by")
    return f"`{row['code'][:8]}`" + (f" (`{computed_by[:8]}`)" if computed_by and computed_by != row["code"] else "")


def render_table(rows: list[dict]) -> str:
    """docs/calibration.md: how the table is made, then one row per stochastic claim."""
    verdicts = [verdict(row["alarms"], row["seeds"], row["nominal"]) for row in rows]
    calibrated = verdicts.count("calibrated")
    full = any(row.get("setting") == "full" for row in rows)
    setting, table = ("full", "docs/calibration-full.md") if full else ("quick", "docs/calibration.md")
    lines = [
        "# Calibration: how often each stochastic claim fails when the theory holds",
        "",
        "Every claim whose verdict depends on its seed states a nominal false-FAIL rate (`false_fail_rate` in",
        "`attnflow check --json`), derived from its tolerance's statistical basis. Each row below ran that claim at",
        f"its {setting} setting as independent runs, replicate i of a calibration from seed s being exactly",
        f"`attnflow check CLAIM{' --full' if full else ''} --seed s + i` (its random instance included), and counts the seeds whose outcome was not the registered one: FAIL, ERROR, or a",
        "registered finding that did not reproduce; the first of them are listed, so each can be replayed. The count is Binomial(seeds, rate); the interval is the exact",
        f"{LEVEL:.0%} Clopper–Pearson interval. A claim is **calibrated** when that interval does not lie wholly",
        f"above its nominal rate, the measured rate is at most the nominal rate or {RESOLUTION:.0%}, whichever is",
        "larger (a few hundred seeds cannot resolve rates far below 1%), and the interval lies below",
        f"{CEILING:.0%}: seeds whose interval reaches {CEILING:.0%} cannot tell a calibrated claim from one that fails one",
        f"run in five, and the row says **too few seeds** with the number needed ({seeds_needed(0)} without a failure,",
        f"{seeds_needed(1)} with one). A claim that states no rate (`—`: a",
        "threshold on a random instance that the paper says holds on every instance) is calibrated only when none of",
        "its seeds fails. A claim that measures the same at its first two seeds is deterministic and not listed.",
        "The `seeds` column gives each row's count, and its range when it did not start at seed 0 (a table may hold rows of at least",
        f"{MIN_TABLE_SEEDS}); no failure in n seeds bounds the rate by 1 − 0.025^{{1/n}} at 95%: 1.8% at 200",
        "seeds, 7.1% at 50 and 16.8% at 20.",
        "",
        "Regenerate a row (or the whole table, without names) with",
        "",
        "```",
        f"attnflow calibrate{' --full' if full else ''} --table {table} [CLAIM or SYSTEM ...] --seeds {20 if full else 200}",
        "```",
        "",
        f"which resumes from its store after an interruption and rewrites this file and {table[:-3]}.json after",
        "every claim. `code` is the fingerprint of the source that computed the row (the claim's module and the",
        "attnflow modules it imports): a row whose fingerprint differs from the current code's is stale. Each row also",
        f"keeps the status and measured-value digest of its first {WITNESSES} seeds; `attnflow calibrate --table",
        f"{table} --verify` reruns only those seeds for every stale row and, when they reproduce bit for",
        "bit and the claim's own source (its digest is kept too) is unchanged, carries the row forward to the",
        "current fingerprint, showing in brackets the one that computed it. Those bits depend on the platform too",
        "(the CPU, Python, numpy, scipy, numba): the digests are kept per platform, and `--rewitness` records this",
        "platform's for rows whose fingerprint is current, when each witness seed keeps its status.",
        "",
        f"{calibrated} of {len(rows)} claims calibrated.",
        "",
        "| claim | seeds | not as registered | rate | 95% interval | nominal | verdict | s / seed | code | failing seeds |",
        "|---|---:|---:|---:|---|---:|---|---:|---|---|",
    ]
    for row, found in zip(rows, verdicts):
        low, high = row["interval"]
        errors = f" ({row['errors']} ERROR)" if row["errors"] else ""
        nominal = "—" if row["nominal"] is None else f"{row['nominal']:.2g}"
        shown = {"calibrated": "calibrated", "MISCALIBRATED": "**MISCALIBRATED**",
                 "too few seeds": f"**too few seeds** ({seeds_needed(row['alarms'])} needed)"}[found]
        first = row.get("seed", 0)
        seeds = f"{row['seeds']} (seeds {first}–{first + row['seeds'] - 1})" if first else f"{row['seeds']}"
        lines.append(f"| `{row['claim']}` | {seeds} | {row['alarms']}{errors} | {_percent(row['rate'])} | "
                     f"[{_percent(low)}, {_percent(high)}] | {nominal} | {shown} | {row['seconds_per_seed']:.3g} | "
                     f"{_code(row)} | {_seed_list(row['failing_seeds'])} |")
    return "\n".join(lines) + "\n"


# ==================================================================================================
# The suite read from the table: how often a correct installation exits 1 at another seed
# ==================================================================================================

@dataclass(frozen=True)
class SuiteAlarmRate:
    first_seed: int  # the seeds first_seed … first_seed + seeds − 1 that most rows share
    seeds: int
    rows: int  # rows calibrated on those seeds
    failing_seeds: tuple  # the seeds among them at which at least one of those rows was not as registered
    low: float  # exact interval of len(failing_seeds) / seeds at LEVEL
    high: float
    independent: float  # 1 − Π(1 − alarms/seeds) over every row: the rows' measured rates, assumed independent
    nominal: float  # 1 − Π(1 − nominal) over every row: what the claims' stated rates allow

    @property
    def rate(self) -> float:
        return len(self.failing_seeds) / self.seeds


def suite_alarm_rate(rows) -> SuiteAlarmRate:
    """How often ``attnflow check`` (every claim at its quick setting) exits 1 at a random seed although the theory
    holds, from the rows of a calibration table.

    Replicate i of a row is ``attnflow check CLAIM --seed s + i``, and the whole suite at ``--seed s + i`` runs every
    claim exactly so, so on the seeds most rows share the suite fails at the union of their failing seeds: a
    measured rate, with its exact interval, that assumes nothing about how the claims' failures depend on each
    other (the few rows calibrated on other seeds do not enter it). Beside it, the same probability from each
    row's measured rate, and from each claim's nominal rate, under independence: 1 − Π(1 − rate_i). Deterministic
    claims have no row: they fail at no seed."""
    rows = list(rows)
    if not rows:
        raise ValueError("the calibration table has no rows")
    ranges = [(row.get("seed", 0), row["seeds"]) for row in rows]
    first, seeds = max(sorted(set(ranges)), key=ranges.count)
    shared = [row for row, span in zip(rows, ranges) if span == (first, seeds)]
    failing = tuple(sorted({seed for row in shared for seed in row["failing_seeds"]}))
    low, high = clopper_pearson(len(failing), seeds, LEVEL)
    independent = nominal = 1.0
    for row in rows:
        independent *= 1 - row["alarms"] / row["seeds"]
        nominal *= 1 - (row["nominal"] or 0.0)
    return SuiteAlarmRate(first_seed=first, seeds=seeds, rows=len(shared), failing_seeds=failing, low=low, high=high,
                          independent=1 - independent, nominal=1 - nominal)
