"""What changed between two ``attnflow check --json`` documents: ``attnflow diff A.json B.json``.

Claims are matched by name. A claim is listed when it is in one run only, when its status changed, or when one
of its measured or predicted numbers moved by more than ``rtol`` relative to the larger of the two (``rtol = 0``:
any change of a bit). Vectors and matrices compare entry by entry; non-finite numbers (written ``"nan"``,
``"inf"`` in JSON) compare as equal to themselves.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .report import format_number

__all__ = ["ClaimChange", "RunDiff", "load_run", "diff_runs"]

SCHEMA_PREFIX = "attnflow.check/"


@dataclass
class ClaimChange:
    """One claim that differs: its status in each run (None where it is absent) and every number that moved,
    as (side, id, value in A, value in B, relative change)."""

    claim: str
    status_a: str | None
    status_b: str | None
    numbers: list = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.status_a is None:
            return [f"+ {self.claim}: only in B ({self.status_b})"]
        if self.status_b is None:
            return [f"- {self.claim}: only in A ({self.status_a})"]
        head = (f"{self.claim}: {self.status_a} → {self.status_b}" if self.status_a != self.status_b
                else f"{self.claim}: {self.status_a}, numbers moved")
        return [head] + [f"    {side} {key}: {format_number(a)} → {format_number(b)}"
                         + (f" (relative {rel:.2g})" if rel is not None and math.isfinite(rel) else "")
                         for side, key, a, b, rel in self.numbers]

    def to_dict(self) -> dict:
        return dict(claim=self.claim, status_a=self.status_a, status_b=self.status_b,
                    numbers=[dict(side=side, id=key, a=a, b=b, relative=rel) for side, key, a, b, rel in self.numbers])


@dataclass
class RunDiff:
    """The header facts of both runs (seed, setting, version, commit) and the claims that differ."""

    a: dict
    b: dict
    changes: list
    unchanged: int

    def text(self) -> str:
        header = []
        for key in ("setting", "seed", "attnflow_version"):
            if self.a.get(key) != self.b.get(key):
                header.append(f"{key}: {self.a.get(key)} → {self.b.get(key)}")
        commits = [(doc.get("provenance") or {}).get("git_commit") for doc in (self.a, self.b)]
        if commits[0] != commits[1]:
            header.append(f"commit: {(commits[0] or 'unknown')[:12]} → {(commits[1] or 'unknown')[:12]}")
        body = [line for change in self.changes for line in change.lines()]
        count = len(self.changes)
        summary = (f"{count} claim{' differs' if count == 1 else 's differ'}, {self.unchanged} unchanged" if self.changes
                   else f"no claim differs ({self.unchanged} compared)")
        return "\n".join(header + body + [summary])

    def to_dict(self) -> dict:
        return dict(schema="attnflow.diff/1", changes=[c.to_dict() for c in self.changes], unchanged=self.unchanged)


def load_run(path) -> dict:
    """A check document, refused with a ValueError naming the file when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a file (give two files written by attnflow check --json)")
    try:
        document = json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not JSON ({error})") from None
    if not isinstance(document, dict) or not str(document.get("schema", "")).startswith(SCHEMA_PREFIX):
        raise ValueError(f"{str(path)!r} is not an attnflow check --json document (no schema {SCHEMA_PREFIX}…)")
    if not isinstance(document.get("results"), list):
        raise ValueError(f"{str(path)!r} has no results list")
    return document


def _flat(value) -> list:
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return [float(value)]
    return [value]


def _moved(a, b, rtol: float) -> float | None:
    """None when ``a`` and ``b`` are the same within ``rtol``, else their largest relative change (inf for a
    change of shape, kind or finiteness)."""
    fa, fb = _flat(a), _flat(b)
    if len(fa) != len(fb):
        return math.inf
    largest = 0.0
    for x, y in zip(fa, fb):
        if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, (int, float)) \
                or not isinstance(y, (int, float)):
            if x != y:
                return math.inf
            continue
        if x == y or (math.isnan(x) and math.isnan(y)):
            continue
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        largest = max(largest, abs(x - y) / max(abs(x), abs(y)))
    return largest if largest > rtol else None


def diff_runs(a: dict, b: dict, *, rtol: float = 0.0) -> RunDiff:
    """The claims of check documents ``a`` and ``b`` that differ (in A's order, then those only in B)."""
    if not (isinstance(rtol, (int, float)) and math.isfinite(rtol) and rtol >= 0):
        raise ValueError(f"rtol must be a finite number >= 0, got {rtol!r}")
    in_a = {r["name"]: r for r in a["results"]}
    in_b = {r["name"]: r for r in b["results"]}
    changes, unchanged = [], 0
    for name in [*in_a, *(n for n in in_b if n not in in_a)]:
        ra, rb = in_a.get(name), in_b.get(name)
        if ra is None or rb is None:
            changes.append(ClaimChange(name, ra and ra["status"], rb and rb["status"]))
            continue
        numbers = []
        for side in ("measured", "predicted"):
            va, vb = ra.get(side, {}), rb.get(side, {})
            for key in dict.fromkeys((*va, *vb)):
                if key not in va or key not in vb:
                    numbers.append((side, key, va.get(key), vb.get(key), None))
                    continue
                moved = _moved(va[key], vb[key], rtol)
                if moved is not None:
                    numbers.append((side, key, va[key], vb[key], moved))
        if numbers or ra["status"] != rb["status"]:
            changes.append(ClaimChange(name, ra["status"], rb["status"], numbers))
        else:
            unchanged += 1
    return RunDiff(a, b, changes, unchanged)
