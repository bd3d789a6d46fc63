"""The documentation holds to the code: every `attnflow` command the README and docs/ print runs as printed, every
number they state about the registry or the calibration is the one computed from it, every § reference is a link
that lands on its section, and docs/index.md lists every page."""
import json
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from attnflow.validation import calibration, cli, report, systems

from .conftest import plugin_environment
from .printed_numbers import same_printed_numbers

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "DESIGN.md", *sorted(DOCS.glob("*.md"))]
# Written by code from the claims' own text and the calibration data, not by hand: their links come from there.
GENERATED = {"calibration.md", "calibration-full.md", "paper-scale.md"}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                "ten": 10, "eleven": 11, "twelve": 12}


def _number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBER_WORDS[word.lower()]


# ==================================================================================================
# Every command printed runs as printed
# ==================================================================================================

# Commands that run for minutes, or need what a test machine does not have, are parsed as the command line would
# parse them (their names and grid resolved too) instead of run. Every other printed command runs.
EXPENSIVE = {
    "attnflow check gd-beta --json": "gd_beta's 13 quick claims: 45 s of CPU",
    "attnflow solve attention_svm": "the default random instance's SVMs: 17 s of CPU",
    "attnflow sweep gd_beta.lsa_gap --grid N=10,20 --seeds 2": "four runs of a 5 s claim: 28 s of CPU",
    "attnflow check attention_svm": "its 22 quick claims: 11 s of CPU (tests/test_attention_svm.py runs each)",
    "attnflow check --full --store attnflow-full": "the whole suite at paper scale: about an hour of one core",
    "attnflow report attnflow-full --full --out full-report": "reads the store the paper-scale run fills",
    "attnflow check --tier deep --full": "the deep tier at the papers' model size: hours of CPU",
}
# A printed command known not to run as printed, kept visible until the page or the command is fixed.
KNOWN_BROKEN = {}
# A printed command whose documented exit code is not 0 (the page says so beside it).
EXIT_CODE = {
    "attnflow diff before.json after.json": 1,  # two seeds' numbers differ: diff exits 1, as docs/cli.md says
}
# A synopsis, not a command: optional parts in brackets, an ellipsis, or a placeholder in capitals.
SYNOPSIS = re.compile(r"\[|…|\.\.\.|\b[A-Z]{3,}\b")
# The page that adds a paper runs its commands after `pip install -e .` of the plugin: the toy plugin stands in.
PLUGIN_PAGES = {"adding-a-paper.md"}
TOY = Path(__file__).parent / "toy_plugin"


def _code_blocks(page: Path) -> list[str]:
    return FENCE.findall(page.read_text(encoding="utf-8"))


def _units(block: str) -> list[str]:
    """The shell commands of a code block: a line with its backslash continuations and its here-document."""
    lines, units = block.splitlines(), []
    while lines:
        unit = lines.pop(0)
        while unit.rstrip().endswith("\\") and lines:
            unit = unit.rstrip()[:-1] + " " + lines.pop(0).strip()
        here = re.search(r"<<\s*'?(\w+)'?", unit)
        if here:
            while lines:
                line = lines.pop(0)
                unit += "\n" + line
                if line.strip() == here.group(1):
                    break
        units.append(unit)
    return units


def _printed_commands() -> list[tuple[str, int, list[str]]]:
    """(page, block number, its attnflow commands in order) for every code block that prints one."""
    found = []
    for page in PAGES:
        for number, block in enumerate(_code_blocks(page)):
            commands = [unit for unit in _units(block) if unit.startswith("attnflow ")]
            if any(not SYNOPSIS.search(_plain(unit)) for unit in commands):  # a block of synopses runs nothing
                found.append((str(page.relative_to(ROOT)), number, commands))
    return found


def _plain(unit: str) -> str:
    """A command as written, its comment and the spaces before it dropped."""
    return re.sub(r"\s+#.*$", "", unit.splitlines()[0]).strip() if "#" in unit else unit.strip()


def _parse_only(command: str) -> None:
    """What the command line checks before any work: the arguments, the claims or systems named, a sweep's grid."""
    arguments = cli._build_parser().parse_args(shlex.split(command, comments=True)[1:])
    if getattr(arguments, "names", None) is not None and arguments.command in ("check", "report"):
        systems.select(arguments.names)
    if arguments.command == "sweep":
        from attnflow.validation import sweep

        sweep.parse_grid(arguments.grid)


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    """A folder holding an `attnflow` that runs this checkout with this interpreter, to put first on PATH."""
    folder = tmp_path_factory.mktemp("bin")
    for name, module in (("attnflow", "-m attnflow.validation.cli"), ("python", "")):
        script = folder / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {module} "$@"\n')
        script.chmod(0o755)
    return folder


def _outputs(command: str) -> list[str]:
    """Files and folders a command says it writes: --plot FILE, --out DIR, > FILE."""
    words = shlex.split(command, comments=True)
    written = [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--plot", "--out", ">")]
    return written


def _run_block(page: str, commands: list[str], shim: Path, folder: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run a block's commands in ``folder``; the known broken ones must still fail (else they leave the list)."""
    environment = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "120"}
    if Path(page).name in PLUGIN_PAGES:
        site = folder / "site-packages"
        site.mkdir()
        environment = {**plugin_environment(site, "attnflow_toy", "toy = attnflow_toy:SYSTEM", TOY),
                       "PATH": environment["PATH"], "COLUMNS": "120"}
    done, broken = {}, []
    for unit in commands:
        plain = _plain(unit)
        if SYNOPSIS.search(plain):
            continue
        if plain in EXPENSIVE:
            _parse_only(plain)
            continue
        result = subprocess.run(["bash", "-c", unit], capture_output=True, text=True, cwd=folder, env=environment,
                                timeout=900)
        if plain in KNOWN_BROKEN:
            assert result.returncode != 0, f"{page}: `{plain}` runs now: take it out of KNOWN_BROKEN"
            broken.append(f"`{plain}` exits {result.returncode}: {KNOWN_BROKEN[plain]}")
            continue
        expected = EXIT_CODE.get(plain, 0)
        assert result.returncode == expected, (f"{page}: `{plain}` exited {result.returncode}, not {expected}:\n"
                                               f"{result.stderr[-2000:]}")
        for written in _outputs(plain):
            assert (folder / written).exists(), f"{page}: `{plain}` did not write {written}"
        done[plain] = result
    if broken:
        pytest.xfail(f"{page}: " + "; ".join(broken))
    return done


@pytest.mark.parametrize("page, block, commands", _printed_commands(),
                         ids=[f"{page}#{block}" for page, block, _ in _printed_commands()])
def test_every_printed_command_runs_as_printed(page, block, commands, shim, tmp_path):
    """Each code block that prints `attnflow` commands is run in a fresh folder, its commands in order (a report
    reads the store the command before it filled), as a shell runs them; each must exit 0 and write the files it
    names."""
    done = _run_block(page, commands, shim, tmp_path)
    if page == "docs/sweeps.md" and block == 0:
        _the_sweeps_output_is_the_one_printed(done)


def _the_sweeps_output_is_the_one_printed(done: dict) -> None:
    """docs/sweeps.md prints the output of its scaling-law sweep, in the block after the commands: the same lines,
    the same numbers; the timing at the end of the last line aside."""
    command = next(c for c in done if c.startswith("attnflow sweep gd_beta.minibatch_gradient_deviation"))
    printed = _code_blocks(DOCS / "sweeps.md")[1].rstrip("\n")
    result = done[command]
    fresh = result.stdout.rstrip("\n") + "\n" + result.stderr.splitlines()[0]
    timing = re.compile(r" \(\d+(?:\.\d+)? s\)$")
    assert same_printed_numbers(timing.sub("", printed), timing.sub("", fresh)), (printed, fresh)
    assert "theorem p = -1: PASS" in fresh


def test_the_commands_set_aside_are_still_printed():
    """An entry for a command no page prints any more is removed, not kept."""
    printed = {_plain(unit) for _, _, commands in _printed_commands() for unit in commands}
    assert set(EXPENSIVE) <= printed and set(KNOWN_BROKEN) <= printed and set(EXIT_CODE) <= printed
    for command in EXPENSIVE:
        _parse_only(command)


def test_the_readme_starts_with_its_title_and_the_two_commands():
    """The README opens with the title, then the two commands: the main job on the built-in defaults, and the test
    suite, which CI runs as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    title, rest = readme.split("\n", 1)
    assert title == "# attnflow"
    first = _code_blocks(ROOT / "README.md")[0]
    assert rest.lstrip("\n").startswith("```\n" + first)
    main_job, tests = first.strip().splitlines()
    assert main_job == "pip install -e . && attnflow check --report attnflow-report"
    assert tests == "pip install -e '.[test,dask,deep]' && pytest"
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


# ==================================================================================================
# Counts and rates written in the docs are the registry's and the calibration's
# ==================================================================================================

@pytest.fixture(scope="module")
def listing():
    done = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", "list", "--json"], capture_output=True,
                          text=True, check=True, timeout=300)
    document = json.loads(done.stdout)
    return {s["key"]: s["claims"] for s in document["systems"]}


def _findings(listing) -> set:
    return {c["name"] for claims in listing.values() for c in claims if c["finding"]}


def test_the_readme_counts_systems_claims_and_findings_as_registered(listing):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    claims, papers = re.search(r"It\s+checks\s+(\d+)\s+claims\s+of\s+(\w+)\s+papers", readme).groups()
    assert (int(claims), _number(papers)) == (sum(map(len, listing.values())), len(listing))
    statements = re.search(r"(\w+)\s+paper\s+statements\s+do\s+not\s+hold\s+as\s+stated(.*?)A\s+reproduced\s+finding",
                           readme, re.S)
    assert _number(statements.group(1)) == len(_findings(listing))
    assert set(re.findall(r"`(\w+\.\w+)`", statements.group(2))) == _findings(listing)
    rows = re.findall(r"^\| `(\w+)` \|.*\| (\d+) claims(?:, (\w+) (?:a )?registered findings?)?", readme, re.M)
    assert {key for key, *_ in rows} == set(listing)
    for key, count, findings in rows:
        assert int(count) == len(listing[key]), key
        assert (_number(findings) if findings else 0) == sum(bool(c["finding"]) for c in listing[key]), key


def test_the_cli_docs_count_claims_systems_and_findings_as_registered(listing):
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    claims, names = re.search(r"all\s+(\d+)\s+claims\s+of\s+the\s+(\w+)\s+systems", text).groups()
    assert (int(claims), _number(names)) == (sum(map(len, listing.values())), len(listing))
    count, named = re.search(r"On\s+the\s+built-in\s+defaults\s+there\s+are\s+(\w+):(.*?)\.\n", text, re.S).groups()
    assert _number(count) == len(_findings(listing))
    assert set(re.findall(r"`(\w+\.\w+)`", named)) == _findings(listing)


def test_each_system_page_counts_its_claims_as_registered(listing):
    """`attnflow check SYSTEM … N claims` and `validation/SYSTEM.py` (N claims …) on the systems' own pages."""
    stated = []
    for key, claims in listing.items():
        text = (DOCS / f"{key}.md").read_text(encoding="utf-8")
        spelled = f"(?:{key}|{key.replace('_', '-')})"
        found = re.findall(rf"(?:attnflow check {spelled}\b|validation/{key}\.py`)[^.;|]{{0,80}}?\b(\d+) claims",
                           text)
        stated += [(key, int(n), len(claims)) for n in found]
    assert len(stated) >= 4 and all(n == registered for _, n, registered in stated), stated


def test_the_chance_of_exit_1_at_another_seed_is_the_calibrations():
    """README.md and docs/cli.md state how often a correct installation's quick suite exits 1 at a seed other than
    the default, as computed from docs/calibration.json; and the default seed is not among the failing ones."""
    rows = calibration.read_table(DOCS / "calibration.md").values()
    suite = calibration.suite_alarm_rate(rows)
    last = suite.first_seed + suite.seeds - 1
    measured = (f"{len(suite.failing_seeds)} of {suite.seeds} seeds ({suite.rate:.1%}; 95% interval "
                f"{100 * suite.low:.1f}–{100 * suite.high:.1f}%)")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    text = " ".join((DOCS / "cli.md").read_text(encoding="utf-8").split())
    assert f"over the seeds {suite.first_seed}–{last} of" in readme and measured in readme
    assert f"{suite.rows} of its rows ran on the seeds {suite.first_seed}–{last}, and at {measured}" in text
    seeds = [str(s) for s in suite.failing_seeds]
    assert f"(seeds {', '.join(seeds[:-1])} and {seeds[-1]}; the other {len(rows) - suite.rows} rows" in text
    assert f"1 − Π(1 − rᵢ) = {suite.independent:.1%}" in text
    assert f"1 − Π(1 − rᵢ) = {suite.nominal:.0%}" in text
    assert suite.first_seed == 0 and 0 not in suite.failing_seeds  # the default seed exits 0


def test_printed_numbers_agree_within_their_last_digit():
    assert same_printed_numbers("p = -0.9393, [-1.125, -0.7661] over 16 seeds",
                                "p = -0.9394, [-1.125, -0.7661] over 16 seeds")
    assert not same_printed_numbers("p = -0.9393", "p = -0.9395")  # two units of the last digit
    assert not same_printed_numbers("over 16 seeds", "over 17 seeds")  # counts are exact
    assert not same_printed_numbers("PASS at 1.5", "FAIL at 1.5")
    assert same_printed_numbers("rate 1.3e-05", "rate 1.4e-05") and not same_printed_numbers("1.3e-05", "1.5e-05")
    assert same_printed_numbers("2e-06 left", "3e-06 left") and not same_printed_numbers("2e-06", "2e-05")


def test_the_suite_rate_is_the_union_of_the_failing_seeds():
    """A synthetic table: two claims on seeds 0–99 failing at {3, 7} and {7, 50}, one on seeds 100–199 failing at
    none. The suite fails at 3 of 100 shared seeds; under independence 1 − 0.98·0.98·1."""
    def row(claim, seed, failing, nominal):
        return dict(claim=claim, seed=seed, seeds=100, alarms=len(failing), failing_seeds=failing, nominal=nominal)

    suite = calibration.suite_alarm_rate([row("a.x", 0, [3, 7], 0.01), row("a.y", 0, [7, 50], None),
                                          row("b.z", 100, [], 0.05)])
    assert (suite.first_seed, suite.seeds, suite.rows, suite.failing_seeds) == (0, 100, 2, (3, 7, 50))
    assert suite.rate == 0.03 and suite.independent == pytest.approx(1 - 0.98 * 0.98)
    assert suite.nominal == pytest.approx(1 - 0.99 * 0.95)
    assert suite.low < 0.03 < suite.high


# ==================================================================================================
# § references are links that land; the index lists every page
# ==================================================================================================

LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]*)\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, without punctuation, symbols and other numbers (a
    hyphen, an underscore and the space kept), spaces turned into hyphens."""
    text = LINK.sub(lambda m: m.group("text"), heading).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LM"
                   or unicodedata.category(c) in ("Nd", "Nl", "Pc"))
    return kept.replace(" ", "-")


def _anchors(page: Path) -> dict[str, str]:
    """anchor -> heading text of every heading of a page, repeated headings numbered as GitHub numbers them."""
    seen, found = {}, {}
    for match in HEADING.finditer(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = _slug(match.group(2))
        found[base if base not in seen else f"{base}-{seen[base]}"] = match.group(2)
        seen[base] = seen.get(base, 0) + 1
    return found


def _prose(page: Path) -> str:
    """A page without its code: fenced blocks and inline code spans blanked, so positions stay where they were."""
    text = page.read_text(encoding="utf-8")
    for pattern in (FENCE, INLINE_CODE):
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return text


def test_the_slug_is_githubs():
    """Examples of GitHub's anchors for headings of this kind."""
    assert _slug("`attnflow bench`") == "attnflow-bench"
    assert _slug("2. Data model (eq. 1) and Assumption 2.1") == "2-data-model-eq-1-and-assumption-21"
    assert _slug("12. Findings — what fails") == "12-findings--what-fails"
    assert _slug("4. W = diag(ξ₁I_d, 0, ξ₂)") == "4-w--diagξi_d-0-ξ"
    assert _slug("Speed [derived]: 10⁻³ and ½") == "speed-derived-10-and-"
    # the report's copies of these pages give their headings the same anchors
    headings = [m.group(0).lstrip("#").strip() for page in DOCS.glob("*.md")
                for m in HEADING.finditer(FENCE.sub("", page.read_text(encoding="utf-8")))]
    assert [report.heading_anchor(h) for h in headings] == [_slug(h) for h in headings]


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in GENERATED], ids=lambda p: p.name)
def test_every_section_reference_is_a_link_to_its_heading(page):
    """Every `§k` in prose is the text of a link (`[§4.2](#42-…)`, `[docs/scb.md §10](scb.md#10-…)`) whose page
    exists and has a heading with that anchor, and that heading is numbered k."""
    text = _prose(page)
    links = [m for m in LINK.finditer(text)]
    inside = [(m.start("text"), m.end("text")) for m in links]
    loose = [text[max(0, m.start() - 30):m.end()].replace("\n", " ") for m in SECTION.finditer(text)
             if not any(a <= m.start() < b for a, b in inside)]
    assert not loose, f"{page.name}: § references that are not links:\n" + "\n".join(loose)
    for link in links:
        numbers = SECTION.findall(link.group("text"))
        if not numbers:
            continue
        path, _, anchor = link.group("target").partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{page.name}: {link.group(0)} points to a missing page"
        headings = _anchors(target)
        assert anchor in headings, f"{page.name}: {link.group(0)} points to no heading of {target.name}"
        assert re.match(rf"{re.escape(numbers[0])}\.?\s", headings[anchor]), (
            f"{page.name}: {link.group(0)} lands on '{headings[anchor]}', not §{numbers[0]}")


def test_the_index_links_every_page_once():
    """docs/index.md has one line per page of docs/, each a link that exists, and the README links the index."""
    index = DOCS / "index.md"
    linked = [m.group("target") for m in LINK.finditer(index.read_text(encoding="utf-8"))
              if not m.group("target").startswith(("#", "http"))]
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    assert sorted(t for t in linked if t.endswith(".md") and "/" not in t) == pages
    assert all((DOCS / t.partition("#")[0]).exists() for t in linked)
    assert "(docs/index.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


# ==================================================================================================
# Notebooks: stored with outputs that a fresh run reproduces
# ==================================================================================================

def _notebook_check():
    """notebooks/conftest.py, which compares a notebook nbmake just ran with the stored one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebook_check", ROOT / "notebooks" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_every_notebook_is_stored_with_its_outputs(notebook):
    """A code host shows a notebook as stored: it stores figures, and every cell that ends by showing a value has
    it stored. (That a fresh run shows what is stored, cell by cell, is checked when nbmake runs the notebook.)"""
    import nbformat

    stored = nbformat.read(str(notebook), as_version=4)
    cells = [cell for cell in stored.cells if cell.cell_type == "code"]
    assert any("image/png" in output.get("data", {}) for cell in cells for output in cell.outputs)
    showing = [cell for cell in cells if re.search(r"^\w+\s*$", cell.source.strip().splitlines()[-1])]
    assert all(cell.outputs for cell in showing), [cell.source[-60:] for cell in showing if not cell.outputs]


def test_a_fresh_run_that_prints_other_numbers_is_caught():
    """The comparison nbmake's run goes through: identical outputs pass; a number two units of its last digit off,
    a figure no longer drawn, or a cell stored without the output it shows are each named."""
    import copy

    import nbformat

    check = _notebook_check()
    stored = nbformat.read(str(ROOT / "notebooks" / "ccmc.ipynb"), as_version=4)
    assert check.differences(stored, copy.deepcopy(stored)) == []
    printing = next(i for i, c in enumerate(stored.cells) if c.cell_type == "code" and "tokens above 1%" in c.source)
    fresh = copy.deepcopy(stored)
    output = next(o for o in fresh.cells[printing].outputs if o.output_type == "stream")
    text = "".join(output.text)
    number = re.search(r"simulation \(mean over runs\) (\d+\.\d\d)", text).group(1)
    output.text = text.replace(number, f"{float(number) + 0.02:.2f}")
    assert len(check.differences(stored, fresh)) == 1
    drawing = next(i for i, c in enumerate(stored.cells) if c.cell_type == "code"
                   and any("image/png" in o.get("data", {}) for o in c.outputs))
    fresh = copy.deepcopy(stored)
    fresh.cells[drawing].outputs = []
    assert len(check.differences(stored, fresh)) == 1
    bare = copy.deepcopy(stored)
    bare.cells[drawing].outputs = []
    assert "stores no output" in check.differences(bare, stored)[0]
