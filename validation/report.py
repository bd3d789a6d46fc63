"""Presenting CheckResults: a terminal table, stable JSON, and a Markdown report with PNG figures."""
from __future__ import annotations

import functools
import math
import json
import shutil
import textwrap
from importlib import metadata
from pathlib import Path

from .claims import CheckResult

JSON_SCHEMA = "attnflow.check/1"


@functools.lru_cache(maxsize=1)
def version() -> str:
    try:
        return metadata.version("attnflow")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def format_number(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return str(value)
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.6g}"


def _pairs(values: dict) -> list[str]:
    return [f"{name} = {format_number(value)}" for name, value in values.items()]


def summary_counts(results: list[CheckResult]) -> dict:
    counts = {status: sum(r.status == status for r in results) for status in ("PASS", "FAIL", "FINDING", "ERROR")}
    return dict(total=len(results), passed=counts["PASS"], failed=counts["FAIL"], findings=counts["FINDING"],
                errors=counts["ERROR"], as_registered=sum(r.as_registered for r in results),
                seconds=round(sum(r.seconds for r in results), 2))


def summary_line(results: list[CheckResult]) -> str:
    s = summary_counts(results)
    return (f"{s['passed']} of {s['total']} claims passed, {s['findings']} registered findings reproduced, "
            f"{s['failed']} failed, {s['errors']} errors ({s['seconds']:.1f} s)")


def format_table(results: list[CheckResult], *, width: int | None = None) -> str:
    """One block per claim: status, name and time, then measured beside predicted, then the tolerance.

    ``width`` defaults to the terminal's width (at least 110 columns).
    """
    if width is None:
        width = max(110, shutil.get_terminal_size((150, 40)).columns)
    side = (width - 8 - 42 - 8) // 2
    columns = (8, 42, side, side, 8)
    header = ("STATUS", "CLAIM", "MEASURED", "PREDICTED", "TIME")

    def row(cells):
        wrapped = [sum((textwrap.wrap(line, w - 2) or [""] for line in cell), []) for cell, w in zip(cells, columns)]
        height = max(len(lines) for lines in wrapped)
        return [
            "".join((lines[i] if i < len(lines) else "").ljust(w) for lines, w in zip(wrapped, columns)).rstrip()
            for i in range(height)
        ]

    lines = row([[h] for h in header])
    lines.append("-" * min(width, sum(columns)))
    for r in results:
        measured = _pairs(r.measured) if r.status != "ERROR" else [r.notes.splitlines()[0] if r.notes else "error"]
        lines += row([[r.status], [r.name], measured, _pairs(r.predicted), [f"{r.seconds:.1f}s"]])
        if r.tolerance:
            lines += row([[""], [""], [f"tolerance: {r.tolerance}"], [f"basis: {r.basis}"], [""]])
        if r.finding:
            lines += row([[""], [""], [f"registered finding: {r.finding}"], [""], [""]])
        lines.append("")
    lines.append(summary_line(results))
    return "\n".join(lines)


def to_json(results: list[CheckResult], *, seed: int, setting: str) -> str:
    """The stable ``--json`` document (schema ``attnflow.check/1``, documented in docs/cli.md)."""
    document = dict(schema=JSON_SCHEMA, attnflow_version=version(), seed=seed, setting=setting,
                    summary=summary_counts(results), results=[r.to_dict() for r in results])
    return json.dumps(document, indent=2, ensure_ascii=False)


def _markdown_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(format_number(row.get(k, "")) for k in keys) + " |")
    return lines


def write_report(results: list[CheckResult], directory, *, seed: int, setting: str) -> Path:
    """Write ``directory/report.md`` and ``directory/figures/<claim>.png``; returns the report's path."""
    directory = Path(directory)
    figures = directory / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    s = summary_counts(results)
    lines = [
        "# attnflow check report",
        "",
        f"attnflow {version()}, setting `{setting}`, seed {seed}: **{summary_line(results)}**. A FINDING is a paper "
        "statement that, checked as stated, does not hold here, as documented; it is the registered outcome.",
        "",
        "| claim | status | time |",
        "|---|---|---|",
    ]
    lines += [f"| [{r.name}](#{r.name.replace('.', '')}) | {r.status} | {r.seconds:.1f} s |" for r in results]
    for r in results:
        lines += ["", f"## {r.name}", "", f"**{r.status}** — {r.reference}", "", f"> {r.statement}", ""]
        if r.measured or r.predicted:
            lines += ["| | value |", "|---|---|"]
            lines += [f"| measured: {k} | {format_number(v)} |" for k, v in r.measured.items()]
            lines += [f"| predicted: {k} | {format_number(v)} |" for k, v in r.predicted.items()]
            lines += ["", f"Tolerance: {r.tolerance}.", "", f"Basis: {r.basis}.", ""]
        if r.finding:
            lines += [f"Registered finding: {r.finding}", ""]
        lines += _markdown_table(r.details)
        if r.notes:
            lines += ["", "```" if r.status == "ERROR" else "", r.notes, "```" if r.status == "ERROR" else ""]
        if r.figure is not None:
            path = figures / f"{r.name}.png"
            try:
                r.figure().savefig(path, dpi=110)
                lines += ["", f"![{r.name}](figures/{path.name})"]
            except Exception as error:  # a broken plot must not lose the numbers of every other claim
                lines += ["", f"*The figure could not be drawn: {type(error).__name__}: {error}*"]
    report = directory / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
