"""Presenting CheckResults: a terminal table, JSON with a shipped JSON Schema, and a report in Markdown and HTML.

Both reports hold the same content: a summary of every claim, then per claim its reference, statement, measured
beside predicted (human labels), tolerance and basis, the nominal false-FAIL rate, the registered finding, notes,
the figure and the docs section holding its derivation. Each figure is drawn once: the PNG file the Markdown links
and the base64 ``data:`` URI the self-contained HTML page embeds are the same bytes.
"""
from __future__ import annotations

import base64
import csv
import functools
import html
import io
import json
import math
import platform as _platform
import re
import shutil
import subprocess
import textwrap
import unicodedata
from importlib import metadata, resources
from pathlib import Path

from attnflow.closed_forms.certificates import ROUND_OFF
from . import notation
from .claims import CheckResult

JSON_SCHEMA = "attnflow.check/2"
SCHEMAS = ("check", "solve", "simulate", "list", "calibrate")  # the documents described by validation/schemas/<name>.schema.json
STATUSES = ("PASS", "FAIL", "FINDING", "ERROR")
FIGURE_DPI = 110
FIGURE_FORMATS = ("png", "pdf", "svg")  # PNG is always drawn (the reports embed it); PDF and SVG for a paper
GLANCE_WIDTH = 240  # characters of a registered finding shown in the at-a-glance list
ROUND_OFF_ZERO = ROUND_OFF  # a headline value this close to 0 is shown as 0 with its size: float64 round-off of O(1)
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


@functools.lru_cache(maxsize=1)
def provenance() -> dict:
    """What a run was computed with, for a paper: the git commit of the source tree attnflow runs from (with
    ``git_dirty`` when it has uncommitted edits; both null for an installed copy outside git) and the version of
    every library whose change may move a number or a figure."""
    import llvmlite
    import matplotlib
    import numba
    import numpy
    import scipy
    import sympy

    root = Path(__file__).resolve().parents[1]
    commit = dirty = None
    if (root / ".git").exists() and shutil.which("git"):
        try:
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                    timeout=10, check=True).stdout.strip() or None
            status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10, check=True).stdout
            dirty = bool(status.strip())
        except (OSError, subprocess.SubprocessError):
            commit = dirty = None
    versions = dict(attnflow=version(), python=_platform.python_version(), numpy=numpy.__version__,
                    scipy=scipy.__version__, numba=numba.__version__, llvmlite=llvmlite.__version__,
                    sympy=sympy.__version__, matplotlib=matplotlib.__version__)
    return dict(git_commit=commit, git_dirty=dirty, versions=versions)


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


def format_value(value) -> str:
    """A headline number as reports show it: as :func:`format_number`, except that a nonzero value within
    ``ROUND_OFF_ZERO`` of 0 reads ``≈0 (1.57e-16)``: the size of a round-off difference is information, but it
    is not a value to compare digits with."""
    if isinstance(value, float) and value != 0 and abs(value) < ROUND_OFF_ZERO:
        return f"≈0 ({value:.3g})"
    return format_number(value)


def raw_label(result: CheckResult, key: str) -> str:
    """The label as the claim wrote it (``$…$`` TeX math allowed, as in its figure)."""
    return str(result.labels.get(key, key))


def label(result: CheckResult, key: str) -> str:
    """What a reader sees for a measured/predicted id: its label (TeX math as Unicode text), or the id itself."""
    return notation.plain(raw_label(result, key))


def value_rows(result: CheckResult) -> list[tuple[str, str, str]]:
    """(label, measured, predicted) per id, measured ids first; an id on one side only leaves the other blank."""
    keys = dict.fromkeys((*result.measured, *result.predicted))
    return [(label(result, key), format_value(result.measured[key]) if key in result.measured else "",
             format_value(result.predicted[key]) if key in result.predicted else "") for key in keys]


def headline(result: CheckResult) -> str:
    """The claim's first comparison in one line: ``label: measured (predicted …)``, or an ERROR's message."""
    if result.status == "ERROR":
        return result.notes.splitlines()[0] if result.notes else "error"
    for key in result.measured:
        text = f"{label(result, key)}: {format_value(result.measured[key])}"
        return text + (f" (predicted {format_value(result.predicted[key])})" if key in result.predicted else "")
    return ""


def system_counts(results: list[CheckResult]) -> dict:
    """System -> {status: count, "total": n, "seconds": s}, in the order the systems first appear."""
    table: dict = {}
    for r in results:
        row = table.setdefault(r.system, {**dict.fromkeys(STATUSES, 0), "total": 0, "seconds": 0.0})
        row[r.status] += 1
        row["total"] += 1
        row["seconds"] += r.seconds
    return table


def needs_a_look(results: list[CheckResult]) -> list[CheckResult]:
    """FAIL, ERROR and FINDING claims, in that order: what a reader looks at first."""
    return [r for status in ("FAIL", "ERROR", "FINDING") for r in results if r.status == status]


def why_it_needs_a_look(result: CheckResult) -> str:
    """One line per FAIL / ERROR / FINDING: the registered finding (shortened to a line), the failing comparison
    with its nominal false-FAIL rate, or the error."""
    if result.status == "FINDING" and result.finding:
        return textwrap.shorten(notation.plain(result.finding), GLANCE_WIDTH, placeholder=" …")
    if result.status == "FAIL":
        rate = ("no chance failure allowed" if result.false_fail_rate is None
                else f"nominal false-FAIL rate {format_number(result.false_fail_rate)}")
        return f"{headline(result)}; tolerance {result.tolerance}; {rate}"
    return headline(result)


def derivation(result: CheckResult) -> tuple[str, str] | None:
    """(docs page, section) of the first ``docs/<system>.md §k`` cited in the reference, else in the notes."""
    match = DERIVATION.search(result.reference) or DERIVATION.search(result.notes)
    return (f"docs/{match['system']}.md", match["section"]) if match else None


DOCS = Path(__file__).resolve().parents[1] / "docs"  # the pages derivations cite, in a source tree


def derivation_text(page: str, section: str, docs: Path = DOCS) -> str | None:
    """The text of ``§section`` of ``page`` (``docs/scb.md``, ``8.4``): from its heading to the next heading of
    the same or a higher level; None when the page or the section is not there (an installed copy has no docs)."""
    path = docs / Path(page).name
    if not path.is_file():
        return None
    lines = path.read_text("utf-8").splitlines()
    heading = re.compile(rf"^(#+)\s+§?{re.escape(section)}\.?(\s|$)")
    for start, line in enumerate(lines):
        match = heading.match(line)
        if match:
            level = len(match[1])
            end = next((i for i in range(start + 1, len(lines))
                        if re.match(r"^(#+)\s", lines[i]) and len(lines[i].split()[0]) <= level), len(lines))
            return "\n".join(lines[start:end]).strip()
    return None


def heading_anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule: a link's text kept, lower case, letters,
    marks, decimal digits, ``-``, ``_`` and spaces kept — so sub/superscript digits go — and spaces to ``-``):
    ``### 8.4 Fixed points`` → ``84-fixed-points``, so the docs' own links work in the report's copy."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", re.sub(r"^#+\s*", "", heading)).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LM"
                   or unicodedata.category(c) in ("Nd", "Nl", "Pc"))
    return kept.replace(" ", "-")


def derivation_href(page: str, section: str, docs: Path = DOCS) -> str:
    """``page#anchor`` of the section's heading, or the page alone when the heading is not found."""
    text = derivation_text(page, section, docs)
    return f"{page}#{heading_anchor(text.splitlines()[0])}" if text else page


def _pairs(result: CheckResult, values: dict) -> list[str]:
    return [f"{label(result, key)} = {format_value(value)}" for key, value in values.items()]


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
    document = dict(schema=JSON_SCHEMA, attnflow_version=version(), platform=platform(), provenance=provenance(),
                    seed=seed, setting=setting, summary=summary_counts(results), results=[r.to_dict() for r in results])
    if interrupted:
        document["interrupted"] = True
    return json.dumps(document, indent=2, ensure_ascii=False)


# ----------------------------------------------------------------------------------------------------------------
# Figures: drawn once for both reports
# ----------------------------------------------------------------------------------------------------------------

def render_figures(results: list[CheckResult], *, dpi: int = FIGURE_DPI, formats: tuple = ("png",)):
    """(claim name -> PNG bytes, or the error message of a figure that could not be drawn; claim name ->
    {format: bytes} of every format in ``formats``). The numbers of every other claim must not be lost to one
    broken plot; claims without a figure are absent. Each figure is built once and saved in every format."""
    rendered, files = {}, {}
    for r in results:
        if r.figure is None:
            continue
        try:
            drawn = draw_figure(r, formats, dpi=dpi)
            rendered[r.name], files[r.name] = drawn["png"], drawn
        except Exception as error:
            rendered[r.name] = f"{type(error).__name__}: {error}"
    return rendered, files


def draw_figure(result: CheckResult, formats: tuple = ("png",), *, dpi: int = FIGURE_DPI) -> dict[str, bytes]:
    """The claim's figure, built once, saved as PNG and in each of ``formats``: format -> bytes. Each drawing is
    checked for layout defects (:func:`attnflow.validation.figure_check.save` warns of them)."""
    from . import figure_check

    figure = result.figure()
    drawn = {}
    for form in dict.fromkeys(("png", *formats)):
        buffer = io.BytesIO()
        figure_check.save(figure, buffer, dpi=dpi, format=form, name=result.name)
        drawn[form] = buffer.getvalue()
    return drawn


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


def _md_anchor(name: str) -> str:
    return name.replace(".", "").lower()


def _commit_sentence() -> str:
    p = provenance()
    if not p["git_commit"]:
        return ""
    return f" Commit {p['git_commit'][:12]}{' with uncommitted edits' if p['git_dirty'] else ''}."


def markdown_report(results: list[CheckResult], figures: dict, *, seed: int, setting: str) -> str:
    """report.md; ``figures`` from :func:`render_figures` (PNG files under ``figures/``)."""
    lines = [
        "# attnflow check report",
        "",
        f"attnflow {version()}, setting `{setting}`, seed {seed}: **{summary_line(results)}**. A FINDING is a paper "
        "statement that, checked as stated, does not hold here, as documented; it is the registered outcome.",
        "",
        f"Platform: {platform()}.{_commit_sentence()}",
        "",
        *_markdown_table(["system", "claims", *STATUSES, "time"],
                         [[system, str(row["total"]), *(str(row[s]) for s in STATUSES), f"{row['seconds']:.1f} s"]
                          for system, row in system_counts(results).items()]),
        "",
    ]
    attention = needs_a_look(results)
    if attention:
        lines += ["**Needs a look** (FAIL, ERROR, FINDING):", ""]
        lines += [f"- **{r.status}** [{markdown_text(r.name)}](#{_md_anchor(r.name)}): "
                  f"{markdown_text(why_it_needs_a_look(r))}" for r in attention]
        lines.append("")
    ordered = attention + [r for r in results if r not in attention]
    lines += ["| claim | status | headline | time |", "|---|---|---|---|"]
    lines += [f"| [{markdown_cell(r.name)}](#{_md_anchor(r.name)}) | {r.status} | {markdown_cell(headline(r))} | "
              f"{r.seconds:.1f} s |" for r in ordered]
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
            lines += [f"Derivation: [{markdown_text(found[0])} §{found[1]}]({derivation_href(*found)})", ""]
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
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 64rem; margin: 2rem auto;
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
td.zero { color: #8c959f; }
section { border-top: 1px solid #d0d7de; margin-top: 2rem; }
blockquote { margin: 0.5rem 0; padding-left: 1rem; border-left: 4px solid #d0d7de; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; }
img { max-width: 100%; }
.finding { border-left: 4px solid #d4a72c; padding-left: 0.6rem; }
ul.attention { padding-left: 1.2rem; } ul.attention li { margin: 0.3rem 0; }
/* the filter: radio buttons (no script), each group hides what does not match its choice */
input.filter { position: absolute; opacity: 0; pointer-events: none; }
.filters { margin: 1rem 0; } .filters span { margin-right: 0.4rem; color: #57606a; }
.filters label { display: inline-block; border: 1px solid #d0d7de; border-radius: 1rem; padding: 0 0.6rem;
                 margin: 0.15rem; cursor: pointer; }
@media print { body { max-width: none; } figure { break-inside: avoid; } .filters { display: none; } }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _status(status: str) -> str:
    return f'<span class="status {_e(status)}">{_e(status)}</span>'


def _id(text: str) -> str:
    """An id/class-safe form of a system key (plugins may use any text)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", str(text))


def _html_table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset(),
                titles: list[str] | None = None, markup: set[int] = frozenset()) -> str:
    """A table of escaped text; ``numeric`` columns right-aligned, ``titles`` a tooltip per row (its id),
    ``markup`` columns already HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = ""
    for index, row in enumerate(rows):
        title = f' title="{_e(titles[index])}"' if titles else ""
        cells = ""
        for i, cell in enumerate(row):
            text = cell if i in markup else _e(cell)
            css = "number" + (" zero" if str(cell).startswith("≈0") else "") if i in numeric else ""
            cells += f'<td class="{css}">{text}</td>' if css else f"<td>{text}</td>"
        body += f"<tr{title}>{cells}</tr>\n"
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def _value_rows_html(r: CheckResult) -> list[list[str]]:
    return [[notation.html(raw_label(r, key)), measured, predicted]
            for key, (_, measured, predicted) in zip(dict.fromkeys((*r.measured, *r.predicted)), value_rows(r))]


def _html_claim(r: CheckResult, figure, derivations: Path | None) -> str:
    parts = [f'<section id="{_e(r.name)}" data-system="{_id(r.system)}" data-status="{_e(r.status)}">',
             f"<h2>{_e(r.name)} {_status(r.status)}</h2>",
             f"<p>{_e(r.reference)}</p>", f"<blockquote>{_e(r.statement)}</blockquote>"]
    if r.measured or r.predicted:
        ids = list(dict.fromkeys((*r.measured, *r.predicted)))
        parts.append(_html_table(["", "measured", "predicted"], _value_rows_html(r), {1, 2}, ids, markup={0}))
        parts.append(f"<p><b>Tolerance:</b> {_e(r.tolerance)}<br><b>Basis:</b> {_e(r.basis)}</p>")
    if r.false_fail_rate is not None:
        parts.append(f"<p><b>Nominal false-FAIL rate:</b> {_e(format_number(r.false_fail_rate))}</p>")
    if r.finding:
        parts.append(f'<p class="finding"><b>Registered finding:</b> {_e(r.finding)}</p>')
    found = derivation(r)
    if found:
        href = derivation_href(*found)
        parts.append(f'<p><b>Derivation:</b> <a href="{_e(href)}">{_e(found[0])} §{_e(found[1])}</a></p>')
        text = derivation_text(*found) if derivations is not None else None
        if text:
            parts.append(f"<details><summary>The derivation, {_e(found[0])} §{_e(found[1])}</summary>"
                         f"<pre>{_e(text)}</pre></details>")
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


def _filters(results: list[CheckResult]) -> tuple[str, str, str]:
    """The radio buttons, their labels and the CSS rules of the filter by system and by status."""
    systems = list(system_counts(results))
    groups = (("system", systems, "data-system"), ("status", list(STATUSES), "data-status"))
    inputs, labels, rules = [], [], []
    for group, values, attribute in groups:
        inputs.append(f'<input class="filter" type="radio" name="{group}" id="{group}-all" checked>')
        labels.append(f'<span>{group}:</span><label for="{group}-all">all</label>')
        rules.append(f"#{group}-all:checked ~ .filters label[for={group}-all] {{ background: #ddf4ff; }}")
        for value in values:
            key = f"{group}-{_id(value)}"
            inputs.append(f'<input class="filter" type="radio" name="{group}" id="{key}">')
            labels.append(f'<label for="{key}">{_e(value)}</label>')
            rules.append(f"#{key}:checked ~ main [{attribute}]:not([{attribute}=\"{_id(value) if group == 'system' else value}\"]) "
                         f"{{ display: none; }}\n#{key}:checked ~ .filters label[for={key}] {{ background: #ddf4ff; }}")
        labels.append("<br>")
    return "\n".join(inputs), f'<div class="filters">{"".join(labels)}</div>', "\n".join(rules)


def html_report(results: list[CheckResult], figures: dict, *, seed: int, setting: str,
                derivations: Path | None = DOCS) -> str:
    """report.html: one page with nothing outside it (CSS inline, figures as ``data:`` URIs, no script), every
    text escaped. At the top: per-system totals, what needs a look (FAIL, ERROR, FINDING) one line each, and a
    filter by system and status; then every claim. ``derivations``: where the cited docs pages are read from, to
    show each cited section inline (None: links only)."""
    counts = system_counts(results)
    system_rows = "".join(
        f'<tr><td><label for="system-{_id(system)}">{_e(system)}</label></td><td class="number">{row["total"]}</td>'
        + "".join(f'<td class="number">{row[s] or ""}</td>' for s in STATUSES)
        + f'<td class="number">{row["seconds"]:.1f} s</td></tr>\n' for system, row in counts.items())
    attention = needs_a_look(results)
    attention_items = "".join(
        f'<li>{_status(r.status)} <a href="#{_e(r.name)}">{_e(r.name)}</a>: {_e(why_it_needs_a_look(r))}</li>\n'
        for r in attention)
    ordered = attention + [r for r in results if r not in attention]
    claim_rows = "".join(
        f'<tr data-system="{_id(r.system)}" data-status="{_e(r.status)}"><td><a href="#{_e(r.name)}">{_e(r.name)}</a>'
        f'</td><td>{_status(r.status)}</td><td>{_e(headline(r))}</td><td class="number">{r.seconds:.1f} s</td></tr>\n'
        for r in ordered)
    inputs, filter_bar, filter_css = _filters(results)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>attnflow check report: {_e(summary_line(results))}</title>",
        f"<style>{_CSS}\n{filter_css}</style></head>",
        "<body>",
        "<h1>attnflow check report</h1>",
        f"<p>attnflow {_e(version())}, setting <code>{_e(setting)}</code>, seed {_e(seed)}: "
        f"<b>{_e(summary_line(results))}</b>. A FINDING is a paper statement that, checked as stated, does not hold "
        "here, as documented; it is the registered outcome.</p>",
        f"<p>Platform: {_e(platform())}.{_e(_commit_sentence())}</p>",
        "<table><thead><tr><th>system</th><th>claims</th>" + "".join(f"<th>{_status(s)}</th>" for s in STATUSES)
        + "<th>time</th></tr></thead><tbody>",
        system_rows + "</tbody></table>",
        (f"<h2>Needs a look</h2>\n<ul class=\"attention\">\n{attention_items}</ul>" if attention
         else "<p>Every claim passed.</p>"),
        inputs,
        filter_bar,
        "<main>",
        "<table><thead><tr><th>claim</th><th>status</th><th>headline</th><th>time</th></tr></thead><tbody>",
        claim_rows + "</tbody></table>",
        *(_html_claim(r, figures.get(r.name), derivations) for r in results),
        "</main>",
        "</body></html>",
        "",
    ])


def write_report(results: list[CheckResult], directory, *, seed: int, setting: str, figures: dict | None = None,
                 figure_files: dict | None = None, figure_formats: tuple = ("png",)) -> Path:
    """Write the report folder and return the Markdown report's path:

    - ``report.md`` with ``figures/<claim>.png``, and the self-contained ``report.html``;
    - ``figures/<claim>.<format>`` for every other format of ``figure_formats`` (PDF, SVG for a paper);
    - ``claims.csv`` and ``claims.tex``: every claim's measured beside predicted values, one row per id;
    - ``docs/<page>.md``: the docs pages the claims cite, so that the derivation links work from the folder.

    What an earlier report left in ``figures/`` and ``docs/`` and this one did not write is removed: the folder
    shows one run. ``figures`` (claim name -> PNG bytes or an error message) and ``figure_files`` (claim name ->
    {format: bytes}) are figures already drawn, for results that came from a store; by default they are drawn
    here."""
    unknown = [f for f in figure_formats if f not in FIGURE_FORMATS]
    if unknown:
        raise ValueError(f"figure format {unknown[0]!r} is not one of {', '.join(FIGURE_FORMATS)}")
    directory = Path(directory)
    figures_folder, docs_folder = directory / "figures", directory / "docs"
    figures_folder.mkdir(parents=True, exist_ok=True)
    if figures is None:
        figures, figure_files = render_figures(results, formats=figure_formats)
    figure_files = figure_files or {}
    written = set()
    for name, png in figures.items():
        if isinstance(png, bytes):
            written.add(_write(figures_folder / f"{name}.png", png))
        for form in figure_formats:
            drawn = figure_files.get(name, {}).get(form)
            if form != "png" and drawn is not None:
                written.add(_write(figures_folder / f"{name}.{form}", drawn))
    pages = {found[0] for r in results if (found := derivation(r))}
    for page in sorted(pages):
        source = DOCS / Path(page).name
        if source.is_file():
            docs_folder.mkdir(exist_ok=True)
            written.add(_write(docs_folder / source.name, source.read_bytes()))
    for folder in (figures_folder, docs_folder):
        for stale in folder.glob("*") if folder.is_dir() else ():
            if stale.is_file() and stale not in written:
                stale.unlink()
    (directory / "report.html").write_text(html_report(results, figures, seed=seed, setting=setting),
                                           encoding="utf-8")
    (directory / "claims.csv").write_text(csv_table(results), encoding="utf-8")
    (directory / "claims.tex").write_text(latex_table(results, seed=seed, setting=setting), encoding="utf-8")
    report = directory / "report.md"
    report.write_text(markdown_report(results, figures, seed=seed, setting=setting), encoding="utf-8")
    return report


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------------------------------------------
# Exports for a paper: CSV and LaTeX
# ----------------------------------------------------------------------------------------------------------------

CSV_COLUMNS = ("claim", "system", "status", "id", "label", "measured", "predicted", "tolerance",
               "false_fail_rate")


def value_records(results: list[CheckResult]) -> list[dict]:
    """One record per claim and measured/predicted id (a claim without values gives one record with its
    status): the rows of ``claims.csv`` and ``claims.tex``. Numbers are full precision (``repr``); a vector or
    matrix is its JSON text."""
    def number(value):
        if value is None:
            return ""
        if isinstance(value, float):
            return repr(value)
        if hasattr(value, "tolist") or isinstance(value, (list, tuple)):
            return json.dumps(getattr(value, "tolist", lambda: value)())
        return str(value)

    records = []
    for r in results:
        common = dict(claim=r.name, system=r.system, status=r.status, tolerance=r.tolerance,
                      false_fail_rate=number(r.false_fail_rate))
        keys = list(dict.fromkeys((*r.measured, *r.predicted))) or [None]
        for key in keys:
            records.append(dict(common, id=key or "", label=label(r, key) if key else "",
                                measured=number(r.measured.get(key)) if key else "",
                                predicted=number(r.predicted.get(key)) if key else ""))
    return records


def csv_table(results: list[CheckResult]) -> str:
    """``claims.csv``: every claim's measured beside predicted values (:func:`value_records`), UTF-8."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(value_records(results))
    return buffer.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_text(text) -> str:
    """Text for a LaTeX document: ``$…$`` math kept as written, everything else escaped. Greek letters and other
    Unicode stay as they are: the table is for a Unicode engine (LuaLaTeX, XeLaTeX), or pdfLaTeX with a
    package that declares them."""
    text, out, end = str(text), "", 0
    for match in re.finditer(r"(?<!\\)\$(.+?)(?<!\\)\$", text):
        out += "".join(_LATEX_SPECIAL.get(c, c) for c in text[end:match.start()]) + match[0]
        end = match.end()
    return out + "".join(_LATEX_SPECIAL.get(c, c) for c in text[end:])


def latex_table(results: list[CheckResult], *, seed: int, setting: str) -> str:
    """``claims.tex``: a ``longtable`` (packages longtable and booktabs) of every claim's status and its
    measured beside predicted values, numbers as the report shows them, labels with their TeX math."""
    lines = [f"% attnflow {version()}, setting {setting}, seed {seed}: {summary_line(results)}",
             "% \\usepackage{longtable,booktabs}; Unicode labels need LuaLaTeX or XeLaTeX",
             r"\begin{longtable}{llllr}", r"\toprule",
             r"claim & status & quantity & measured & predicted \\", r"\midrule", r"\endhead"]
    for r in results:
        rows = value_rows(r) or [("", "", "")]
        keys = list(dict.fromkeys((*r.measured, *r.predicted))) or [None]
        for i, (key, (_, measured, predicted)) in enumerate(zip(keys, rows)):
            name = latex_text(r.name) if i == 0 else ""
            status = r.status if i == 0 else ""
            quantity = latex_text(raw_label(r, key)) if key else ""
            lines.append(f"{name} & {status} & {quantity} & {latex_text(measured)} & {latex_text(predicted)} \\\\")
        lines.append(r"\midrule")
    lines[-1] = r"\bottomrule"
    lines.append(r"\end{longtable}")
    return "\n".join(lines) + "\n"
