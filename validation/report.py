"""Presenting CheckResults: a terminal table, JSON with a shipped JSON Schema, and a report in Markdown and HTML.

Both reports hold the same content: a summary of every claim, then per claim its reference, statement, measured
beside predicted (human labels), tolerance and basis, the nominal false-FAIL rate, the registered finding, notes,
the figure and the docs section holding its derivation. Each figure is drawn once: the PNG file the Markdown links
and the base64 ``data:`` URI the self-contained HTML page embeds are the same bytes.
"""
from __future__ import annotations

import base64
import functools
import html
import io
import json
import math
import platform as _platform
import re
import shutil
import textwrap
from importlib import metadata, resources
from pathlib import Path

from .claims import CheckResult

JSON_SCHEMA = "attnflow.check/2"
SCHEMAS = ("check", "solve", "simulate", "list", "calibrate")  # the documents described by validation/schemas/<name>.schema.json
STATUSES = ("PASS", "FAIL", "FINDING", "ERROR")
FIGURE_DPI = 110
DERIVATION = re.compile(r"docs/(?P<system>[a-z][a-z0-9_]*)\.md,?\s+§(?P<section>\d+(?:\.\d+)*)")


@functools.lru_cache(maxsize=1)
def version() -> str:
    try:
        return metadata.version("attnflow")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


@functools.lru_cache(maxsize=None)
def platform() -> str:
    """What the last bits of the numbers depend on besides attnflow and the seed: the machine and the CPU that
    numba compiles for (numpy's SIMD loops and OpenBLAS pick their kernels by it too), and the versions of Python
    and of the numerical libraries (numpy and scipy bring their own OpenBLAS). The same seed on the same platform
    gives the same numbers bit for bit."""
    import llvmlite
    import numba
    import numpy
    import scipy
    from llvmlite import binding

    return (f"{_platform.machine()} {binding.get_host_cpu_name()}, Python {_platform.python_version()}, "
            f"numpy {numpy.__version__}, scipy {scipy.__version__}, numba {numba.__version__}, "
            f"llvmlite {llvmlite.__version__}")


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of a ``--json`` document: ``check``, ``solve``, ``simulate`` or ``list``.

    The files ship inside the package (``attnflow/validation/schemas/<name>.schema.json``)."""
    if name not in SCHEMAS:
        raise ValueError(f"no JSON schema {name!r}; there are {', '.join(SCHEMAS)}")
    text = resources.files("attnflow.validation").joinpath("schemas", f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)


def format_number(value) -> str:
    """A number as tables and reports show it (six significant digits, integers whole); a vector as
    ``[a, b, c]``, a matrix as nested brackets (as in JSON); anything else as its text."""
    if hasattr(value, "tolist") and not isinstance(value, (bool, int, float)):  # numpy array or scalar
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_number(v) for v in value) + "]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return str(value)
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.6g}"


def label(result: CheckResult, key: str) -> str:
    """What a reader sees for a measured/predicted id: its label, or the id itself."""
    return str(result.labels.get(key, key))


def value_rows(result: CheckResult) -> list[tuple[str, str, str]]:
    """(label, measured, predicted) per id, measured ids first; an id on one side only leaves the other blank."""
    keys = dict.fromkeys((*result.measured, *result.predicted))
    return [(label(result, key), format_number(result.measured[key]) if key in result.measured else "",
             format_number(result.predicted[key]) if key in result.predicted else "") for key in keys]


def derivation(result: CheckResult) -> tuple[str, str] | None:
    """(docs page, section) of the first ``docs/<system>.md §k`` cited in the reference, else in the notes."""
    match = DERIVATION.search(result.reference) or DERIVATION.search(result.notes)
    return (f"docs/{match['system']}.md", match["section"]) if match else None


def _pairs(result: CheckResult, values: dict) -> list[str]:
    return [f"{label(result, key)} = {format_number(value)}" for key, value in values.items()]


def summary_counts(results: list[CheckResult]) -> dict:
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    return dict(total=len(results), passed=counts["PASS"], failed=counts["FAIL"], findings=counts["FINDING"],
                errors=counts["ERROR"], as_registered=sum(r.as_registered for r in results),
                seconds=round(sum(r.seconds for r in results), 2))


def summary_line(results: list[CheckResult]) -> str:
    s = summary_counts(results)
    return (f"{s['passed']} of {s['total']} claims passed, {s['findings']} registered findings reproduced, "
            f"{s['failed']} failed, {s['errors']} errors ({s['seconds']:.1f} s)")


# ----------------------------------------------------------------------------------------------------------------
# Terminal table
# ----------------------------------------------------------------------------------------------------------------

SIDE_BY_SIDE_WIDTH = 110  # below this, measured and predicted stack under the claim instead of sharing a row
MIN_WIDTH = 40


def _wrap(text: str, width: int, indent: str = "", subsequent: str | None = None) -> list[str]:
    subsequent = indent if subsequent is None else subsequent
    lines = []
    for paragraph in str(text).splitlines() or [""]:
        lines += textwrap.wrap(paragraph, width, initial_indent=indent, subsequent_indent=subsequent,
                               break_on_hyphens=False) or [indent.rstrip()]
        indent = subsequent
    return lines


def _first_lines(result: CheckResult) -> list[str]:
    """What the table shows as 'measured' for an ERROR: the first line of its message, then any values it has."""
    if result.status != "ERROR":
        return _pairs(result, result.measured)
    first = result.notes.splitlines()[0] if result.notes else "error"
    return [first, *_pairs(result, result.measured)]


def table_width(width: int | None = None) -> int:
    """The width tables are laid out in: ``width``, else the terminal's (``COLUMNS``), at least ``MIN_WIDTH``."""
    if width is None:
        width = shutil.get_terminal_size((100, 40)).columns
    return max(MIN_WIDTH, width)


def format_table(results: list[CheckResult], *, width: int | None = None) -> str:
    """One block per claim: status, name and time, measured and predicted (labels), then the tolerance.

    ``width`` defaults to the terminal's width; every line fits in it. From 110 columns measured and predicted
    stand side by side; narrower, they stack under the claim."""
    table = Table([r.name for r in results], width)
    body = table.header() + [line for r in results for line in table.block(r)]
    return "\n".join(body + _wrap(summary_line(results), table.width))


class Table:
    """The terminal table, a block at a time, so that ``attnflow check`` prints each claim as it finishes.

    ``names`` are the claims it will show (their longest name sets the claim column)."""

    def __init__(self, names: list[str], width: int | None = None):
        self.width = table_width(width)
        self.wide = self.width >= SIDE_BY_SIDE_WIDTH
        claim = min(42, max([len("CLAIM"), *(len(n) for n in names)]) + 2)
        side = (self.width - 8 - claim - 8) // 2
        self.columns = (8, claim, side, side, 8)

    def _row(self, cells) -> list[str]:
        wrapped = [sum((_wrap(line, w - 2) for line in cell), []) for cell, w in zip(cells, self.columns)]
        height = max(len(lines) for lines in wrapped)
        return ["".join((lines[i] if i < len(lines) else "").ljust(w)
                        for lines, w in zip(wrapped, self.columns)).rstrip() for i in range(height)]

    def header(self) -> list[str]:
        if not self.wide:
            return []
        return self._row([["STATUS"], ["CLAIM"], ["MEASURED"], ["PREDICTED"], ["TIME"]]) + ["-" * sum(self.columns)]

    def block(self, r: CheckResult) -> list[str]:
        return self._wide_block(r) if self.wide else self._narrow_block(r)

    def _wide_block(self, r: CheckResult) -> list[str]:
        row = self._row
        lines = row([[r.status], [r.name], _first_lines(r), _pairs(r, r.predicted), [f"{r.seconds:.1f}s"]])
        if r.tolerance:
            lines += row([[""], [""], [f"tolerance: {r.tolerance}"], [f"basis: {r.basis}"], [""]])
        if r.finding:
            lines += row([[""], [""], [f"registered finding: {r.finding}"], [""], [""]])
        return lines + [""]

    def _narrow_block(self, r: CheckResult) -> list[str]:
        width, indent = self.width, " " * 4
        lines = []
        seconds = f"{r.seconds:.1f}s"
        head = f"{r.status:<8}{r.name}"
        if len(head) + 1 + len(seconds) <= width:
            lines.append(head + seconds.rjust(width - len(head)))
        else:
            lines += _wrap(f"{head} {seconds}", width, subsequent=" " * 8)
        for title, entries in (("measured", _first_lines(r)), ("predicted", _pairs(r, r.predicted))):
            for i, entry in enumerate(entries):
                lines += _wrap(entry, width, indent + (f"{title}: " if i == 0 else " " * (len(title) + 2)),
                               indent + " " * (len(title) + 4))
        if r.tolerance:
            lines += _wrap(f"tolerance: {r.tolerance}", width, indent, indent + "  ")
            lines += _wrap(f"basis: {r.basis}", width, indent, indent + "  ")
        if r.finding:
            lines += _wrap(f"registered finding: {r.finding}", width, indent, indent + "  ")
        return lines + [""]


def recap(results: list[CheckResult], *, width: int | None = None) -> str:
    """What needs a reader's eye, one line each: every FAIL, ERROR and FINDING with its nominal false-FAIL rate
    and where its derivation is; empty when every claim passed."""
    width = table_width(width)
    lines = []
    for status in ("FAIL", "ERROR", "FINDING"):
        for r in (r for r in results if r.status == status):
            rate = ("no chance failure allowed" if r.false_fail_rate is None
                    else f"nominal false-FAIL rate {format_number(r.false_fail_rate)}")
            found = derivation(r)
            where = f"; derivation {found[0]} §{found[1]}" if found else ""
            why = f": {r.notes.splitlines()[0]}" if status == "ERROR" and r.notes else ""
            lines += _wrap(f"{status:<8}{r.name} ({rate}{where}){why}", width, subsequent=" " * 8)
    if not lines:
        return ""
    title = " FAIL, ERROR and FINDING "
    return "\n".join([title.center(min(width, 80), "="), *lines])


# ----------------------------------------------------------------------------------------------------------------
# JSON
# ----------------------------------------------------------------------------------------------------------------

def to_json(results: list[CheckResult], *, seed: int, setting: str, interrupted: bool = False) -> str:
    """The stable ``--json`` document (schema ``attnflow.check/2``: validation/schemas/check.schema.json); an
    interrupted run's document holds the claims that finished and says ``"interrupted": true``."""
    document = dict(schema=JSON_SCHEMA, attnflow_version=version(), platform=platform(), seed=seed, setting=setting,
                    summary=summary_counts(results), results=[r.to_dict() for r in results])
    if interrupted:
        document["interrupted"] = True
    return json.dumps(document, indent=2, ensure_ascii=False)


# ----------------------------------------------------------------------------------------------------------------
# Figures: drawn once for both reports
# ----------------------------------------------------------------------------------------------------------------

def render_figures(results: list[CheckResult], *, dpi: int = FIGURE_DPI) -> dict[str, bytes | str]:
    """Claim name -> PNG bytes, or the error message of a figure that could not be drawn (the numbers of every
    other claim must not be lost to one broken plot). Claims without a figure are absent."""
    rendered = {}
    for r in results:
        if r.figure is None:
            continue
        try:
            buffer = io.BytesIO()
            r.figure().savefig(buffer, format="png", dpi=dpi)
            rendered[r.name] = buffer.getvalue()
        except Exception as error:
            rendered[r.name] = f"{type(error).__name__}: {error}"
    return rendered


# ----------------------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------------------

# Characters Markdown would act on inside a line; ``_`` only at a word's edge (inside a word it is literal).
_MARKDOWN_SPECIAL = re.compile(r"([\\`*<>|]|(?<![^\W_])_|_(?![^\W_]))")


def markdown_text(text) -> str:
    """Text that Markdown shows as written: the characters it would act on backslash-escaped (``max |z|`` cannot
    split a table cell, ``β* … Γ*`` cannot turn italic, ``<x>`` cannot vanish as HTML, ``\\|`` keeps its
    backslash)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", str(text))


def markdown_cell(text) -> str:
    """One table cell: escaped text, line breaks as ``<br>`` (a newline would end the row)."""
    return "<br>".join(markdown_text(line) for line in str(text).splitlines()) if str(text) else ""


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(markdown_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(markdown_cell(cell) for cell in row) + " |" for row in rows]


def _details_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return keys, [[format_number(row.get(k, "")) for k in keys] for row in rows]


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def markdown_report(results: list[CheckResult], figures: dict, *, seed: int, setting: str) -> str:
    """report.md; ``figures`` from :func:`render_figures` (PNG files under ``figures/``)."""
    lines = [
        "# attnflow check report",
        "",
        f"attnflow {version()}, setting `{setting}`, seed {seed}: **{summary_line(results)}**. A FINDING is a paper "
        "statement that, checked as stated, does not hold here, as documented; it is the registered outcome.",
        "",
        f"Platform: {platform()}.",
        "",
        "| claim | status | time |",
        "|---|---|---|",
    ]
    lines += [f"| [{markdown_cell(r.name)}](#{r.name.replace('.', '').lower()}) | {r.status} | {r.seconds:.1f} s |"
              for r in results]
    for r in results:
        lines += ["", f"## {markdown_text(r.name)}", "", f"**{r.status}** — {markdown_text(r.reference)}", "",
                  f"> {markdown_text(r.statement)}", ""]
        if r.measured or r.predicted:
            lines += _markdown_table(["", "measured", "predicted"], [list(row) for row in value_rows(r)])
            lines += ["", f"Tolerance: {markdown_text(r.tolerance)}.", "", f"Basis: {markdown_text(r.basis)}.", ""]
        if r.false_fail_rate is not None:
            lines += [f"Nominal false-FAIL rate: {format_number(r.false_fail_rate)}.", ""]
        if r.finding:
            lines += [f"Registered finding: {markdown_text(r.finding)}", ""]
        found = derivation(r)
        if found:
            lines += [f"Derivation: [{markdown_text(found[0])} §{found[1]}]({found[0]})", ""]
        if r.details:
            lines += _markdown_table(*_details_table(r.details))
        if r.notes:
            if r.status == "ERROR":
                fence = _fence(r.notes)
                lines += ["", fence, r.notes, fence]
            else:
                lines += ["", markdown_text(r.notes)]
        figure = figures.get(r.name)
        if isinstance(figure, bytes):
            lines += ["", f"![{markdown_text(r.name)}](figures/{r.name}.png)"]
        elif isinstance(figure, str):
            lines += ["", f"*The figure could not be drawn: {markdown_text(figure)}*"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# HTML: one self-contained page
# ----------------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 60rem; margin: 2rem auto;
       padding: 0 1rem; color: #1f2328; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.6rem 0; }
th, td { border: 1px solid #d0d7de; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
td.number { font-family: ui-monospace, monospace; text-align: right; white-space: nowrap; }
.status { display: inline-block; min-width: 5.5em; text-align: center; font-weight: bold; border-radius: 3px;
          padding: 0 0.3em; border: 1px solid; }
/* dark text on a light tint: legible on screen, and printed without backgrounds or in black and white */
.PASS { color: #116329; background: #dafbe1; }
.FAIL { color: #a40e26; background: #ffebe9; }
.FINDING { color: #7d4e00; background: #fff1c2; }
.ERROR { color: #424a53; background: #eaeef2; }
section { border-top: 1px solid #d0d7de; margin-top: 2rem; }
blockquote { margin: 0.5rem 0; padding-left: 1rem; border-left: 4px solid #d0d7de; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; }
img { max-width: 100%; }
.finding { border-left: 4px solid #d4a72c; padding-left: 0.6rem; }
@media print { body { max-width: none; } figure { break-inside: avoid; } }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _status(status: str) -> str:
    return f'<span class="status {_e(status)}">{_e(status)}</span>'


def _html_table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset(),
                titles: list[str] | None = None) -> str:
    """A table of escaped text; ``numeric`` columns right-aligned, ``titles`` a tooltip per row (its id)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = ""
    for index, row in enumerate(rows):
        title = f' title="{_e(titles[index])}"' if titles else ""
        body += f"<tr{title}>" + "".join(f'<td class="number">{_e(cell)}</td>' if i in numeric
                                         else f"<td>{_e(cell)}</td>" for i, cell in enumerate(row)) + "</tr>\n"
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def _html_claim(r: CheckResult, figure) -> str:
    parts = [f'<section id="{_e(r.name)}">', f"<h2>{_e(r.name)} {_status(r.status)}</h2>",
             f"<p>{_e(r.reference)}</p>", f"<blockquote>{_e(r.statement)}</blockquote>"]
    if r.measured or r.predicted:
        ids = list(dict.fromkeys((*r.measured, *r.predicted)))
        parts.append(_html_table(["", "measured", "predicted"], [list(row) for row in value_rows(r)], {1, 2}, ids))
        parts.append(f"<p><b>Tolerance:</b> {_e(r.tolerance)}<br><b>Basis:</b> {_e(r.basis)}</p>")
    if r.false_fail_rate is not None:
        parts.append(f"<p><b>Nominal false-FAIL rate:</b> {_e(format_number(r.false_fail_rate))}</p>")
    if r.finding:
        parts.append(f'<p class="finding"><b>Registered finding:</b> {_e(r.finding)}</p>')
    found = derivation(r)
    if found:
        parts.append(f'<p><b>Derivation:</b> <a href="{_e(found[0])}">{_e(found[0])} §{_e(found[1])}</a></p>')
    if r.notes:
        parts.append(f"<pre>{_e(r.notes)}</pre>" if r.status == "ERROR" else f"<p>{_e(r.notes)}</p>")
    if isinstance(figure, bytes):
        data = base64.b64encode(figure).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="figure of {_e(r.name)}"></figure>')
    elif isinstance(figure, str):
        parts.append(f"<p><i>The figure could not be drawn: {_e(figure)}</i></p>")
    if r.details:
        keys, rows = _details_table(r.details)
        parts.append(f"<details><summary>Everything measured ({len(rows)} rows)</summary>"
                     f"{_html_table(keys, rows)}</details>")
    parts.append("</section>")
    return "\n".join(parts)


def html_report(results: list[CheckResult], figures: dict, *, seed: int, setting: str) -> str:
    """report.html: one page with nothing outside it (CSS inline, figures as ``data:`` URIs), every text escaped."""
    summary_rows = "".join(
        f'<tr><td><a href="#{_e(r.name)}">{_e(r.name)}</a></td><td>{_status(r.status)}</td>'
        f'<td class="number">{r.seconds:.1f} s</td></tr>\n' for r in results)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>attnflow check report: {_e(summary_line(results))}</title>",
        f"<style>{_CSS}</style></head>",
        "<body>",
        "<h1>attnflow check report</h1>",
        f"<p>attnflow {_e(version())}, setting <code>{_e(setting)}</code>, seed {_e(seed)}: "
        f"<b>{_e(summary_line(results))}</b>. A FINDING is a paper statement that, checked as stated, does not hold "
        "here, as documented; it is the registered outcome.</p>",
        f"<p>Platform: {_e(platform())}.</p>",
        "<table><thead><tr><th>claim</th><th>status</th><th>time</th></tr></thead><tbody>",
        summary_rows + "</tbody></table>",
        *(_html_claim(r, figures.get(r.name)) for r in results),
        "</body></html>",
        "",
    ])


def write_report(results: list[CheckResult], directory, *, seed: int, setting: str, figures: dict | None = None) -> Path:
    """Write ``directory/report.md`` with ``directory/figures/<claim>.png``, and the self-contained
    ``directory/report.html``; returns the Markdown report's path. ``figures`` (claim name -> PNG bytes or an error
    message) are figures already drawn, for results that came from a store; by default they are drawn here."""
    directory = Path(directory)
    figures_folder = directory / "figures"
    figures_folder.mkdir(parents=True, exist_ok=True)
    figures = render_figures(results) if figures is None else figures
    for name, png in figures.items():
        if isinstance(png, bytes):
            (figures_folder / f"{name}.png").write_bytes(png)
    (directory / "report.html").write_text(html_report(results, figures, seed=seed, setting=setting),
                                           encoding="utf-8")
    report = directory / "report.md"
    report.write_text(markdown_report(results, figures, seed=seed, setting=setting), encoding="utf-8")
    return report
