"""What a run reports: stable ids, the JSON documents against their shipped schemas, the Markdown and HTML reports
(every number in both, one inline figure each, nothing outside the page), and a table that fits the terminal."""
import base64
import contextlib
import io
import json
import re
from html.parser import HTMLParser

import jsonschema
import numpy as np
import numba
import pytest

from attnflow import Claim, Outcome, run_claim
from attnflow.validation import notation, report
from attnflow.validation.cli import main

from .conftest import small_figure

CHEAP_CLAIMS = ["gd_beta.risk_formula", "attention_svm.single_input_svm", "ccmc.base_chain_row"]
SMALL_RUNS = {  # two systems, at settings that take seconds
    "gd_beta": (["bayes_contexts=2000", "n_points=20"], ["steps=40", "model=ltb"]),
    "ccmc": (["steps=200", "n_records=10"], ["steps=200", "runs=3", "n_records=10"]),
}
TRICKY_LABELS = {  # what broke the Markdown table or would vanish as markup
    "max_z": "max |z|",
    "grad_norm": "|grad R|\nat the end",
    "optimum_risk": "R* at β* and Γ*",
    "norm_ratio": r"$\|x\|/\|y\|$ <small>",
}


def _fake(function, *, name="fake.claim", reference="nowhere", finding="", quick=None):
    return Claim(name, reference, "a claim for testing", function, quick or {}, {}, finding)


def _validator(name):
    schema = report.json_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _fake_results():
    """One result of every status, with tricky labels, a vector, details, a figure and a sweep replicate's seed."""
    def outcome(passed, **extra):
        return lambda seed: Outcome(
            measured={"max_z": 1.21016, "grad_norm": 3.5e-7, "optimum_risk": 0.74062, "norm_ratio": [0.25, -1.5]},
            predicted={"optimum_risk": 0.74059, "threshold": 4},
            tolerance="|z| < 4", basis="4 standard errors", passed=passed, labels=dict(TRICKY_LABELS),
            details=[{"config": "a | b", "z": 1.21016}, {"config": "c", "z": -0.5}], **extra)

    def crash(seed):
        raise RuntimeError("kaput")

    return [
        run_claim(_fake(outcome(True, figure=small_figure, false_fail_rate=6e-5), name="fake.passes",
                        reference="the identity of docs/ccmc.md §3.1"), seed=0),
        run_claim(_fake(outcome(False, notes="see docs/attention_svm.md §7.2 for why"), name="fake.fails"),
                  seed=np.random.SeedSequence(5, spawn_key=(2,))),
        run_claim(_fake(outcome(False, figure=small_figure), name="fake.finding",
                        finding="it does not hold as stated"), seed=0),
        run_claim(_fake(crash, name="fake.crashes"), seed=0),
        run_claim(_fake(lambda seed: Outcome({"Max |z|": 1.0}, {"nan_value": float("nan")}, "t", "b", passed=True),
                        name="fake.unstable_keys"), seed=0),
    ]


# ---------------------------------------------------------------------------------------------------------------
# Stable ids
# ---------------------------------------------------------------------------------------------------------------

def test_a_key_that_is_not_a_stable_id_is_an_error_naming_it():
    def keyed(*keys):
        return lambda seed: Outcome({key: 1.0 for key in keys}, {"predicted_value": 1.0}, "t", "b", passed=True)

    for bad in ("max |z|", "Gap", "2nd_moment", "gap-largest", "gap\n", "", 3):
        result = run_claim(_fake(keyed("fine_id", bad)), seed=0)
        assert result.status == "ERROR", bad
        assert repr(bad) in result.notes and "fine_id" not in result.notes
        assert result.measured[bad] == 1.0  # the number is kept, not lost
    labelled = run_claim(_fake(lambda seed: Outcome({"max_z": 1.0}, {"z_bound": 4.0}, "t", "b", passed=True,
                                                    labels={"max_z": "max |z|"})), seed=0)
    assert labelled.status == "PASS"
    assert labelled.to_dict()["labels"] == {"max_z": "max |z|", "z_bound": "z_bound"}


# ---------------------------------------------------------------------------------------------------------------
# JSON against the shipped schemas
# ---------------------------------------------------------------------------------------------------------------

def test_every_schema_ships_loads_and_names_its_document():
    for name in report.SCHEMAS:
        schema = report.json_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["properties"]["schema"]["const"].startswith(f"attnflow.{name}/")
    assert report.json_schema("check")["properties"]["schema"]["const"] == report.JSON_SCHEMA == "attnflow.check/2"
    with pytest.raises(ValueError, match="no JSON schema 'sweep'"):
        report.json_schema("sweep")


def test_fake_results_of_every_status_match_the_check_schema():
    results = _fake_results()
    assert [r.status for r in results] == ["PASS", "FAIL", "FINDING", "ERROR", "ERROR"]
    document = json.loads(report.to_json(results, seed=0, setting="quick"))
    _validator("check").validate(document)
    assert document["results"][0]["false_fail_rate"] == 6e-5
    assert document["results"][0]["labels"]["threshold"] == "threshold"  # an unlabelled id shows as itself
    assert document["results"][1]["seed"] == {"entropy": 5, "spawn_key": [2]}


def test_the_check_schema_refuses_what_it_must():
    """Not a schema that accepts anything: a non-id key outside ERROR, a wrong version, an inconsistent verdict."""
    validator = _validator("check")
    document = json.loads(report.to_json(_fake_results()[:1], seed=0, setting="quick"))
    validator.validate(document)
    broken = [
        lambda d: d["results"][0]["measured"].update({"Max |z|": 1.0}),
        lambda d: d.update(schema="attnflow.check/1"),
        lambda d: d["results"][0].update(passed=False),
        lambda d: d["results"][0].update(status="FINDING"),  # a FINDING needs its registered finding
        lambda d: d["results"][0].update(false_fail_rate=1.5),
        lambda d: d["results"][0].update(surprise=1),
        lambda d: d["results"][0].pop("labels"),
    ]
    for breaking in broken:
        copy = json.loads(json.dumps(document))
        breaking(copy)
        assert not validator.is_valid(copy)


def test_the_documented_check_example_matches_the_schema():
    """docs/cli.md's example of `attnflow check --json` is a valid attnflow.check/2 document."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = docs[docs.index("### `--json` (schema `attnflow.check/2`)"):]
    example = re.search(r"```json\n(.*?)\n```", section, re.DOTALL).group(1)
    _validator("check").validate(json.loads(example))


@pytest.fixture(scope="module")
def cheap_check_run(tmp_path_factory):
    """`attnflow check CHEAP_CLAIMS --json --report DIR`, once: its JSON document and the report folder."""
    folder = tmp_path_factory.mktemp("report")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["check", *CHEAP_CLAIMS, "--json", "--report", str(folder), "--no-progress"])
    return json.loads(out.getvalue()), folder


def test_real_claims_json_matches_the_check_schema(cheap_check_run):
    document, _ = cheap_check_run
    _validator("check").validate(document)
    assert [r["name"] for r in document["results"]] == CHEAP_CLAIMS
    # the platform the numbers are bit-exact on: the CPU and the libraries' versions
    assert document["platform"] == report.platform() and f"numba {numba.__version__}" in document["platform"]
    assert all(r["measured"] and r["predicted"] for r in document["results"])


@pytest.mark.parametrize("system", sorted(SMALL_RUNS))
def test_solve_and_simulate_json_match_their_schemas(system, capsys):
    for command, params in zip(("solve", "simulate"), SMALL_RUNS[system]):
        assert main([command, system, *sum((["--param", p] for p in params), []), "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        _validator(command).validate(document)
        assert document["schema"] == f"attnflow.{command}/1" and document["attnflow_version"] == report.version()


def test_list_json_matches_its_schema(capsys):
    assert main(["list", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    _validator("list").validate(document)
    assert {"gd_beta", "attention_svm", "ccmc"} <= {s["key"] for s in document["systems"]}


# ---------------------------------------------------------------------------------------------------------------
# The Markdown and HTML reports
# ---------------------------------------------------------------------------------------------------------------

class _Page(HTMLParser):
    """The text of a page (entities resolved), its ids, and every src/href."""

    def __init__(self):
        super().__init__()
        self.text, self.ids, self.links = [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        self.links += [(tag, name, attrs[name]) for name in ("src", "href") if attrs.get(name) is not None]

    def handle_data(self, data):
        self.text.append(data)


def _page(path):
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    page.text = "".join(page.text)
    return page


def _split_row(line: str) -> list[str]:
    """The cells of a table row, split where Markdown splits them: at a ``|`` that no backslash escapes."""
    cells, cell, i = [], "", 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            cell, i = cell + line[i:i + 2], i + 2
        elif line[i] == "|":
            cells, cell, i = cells + [cell], "", i + 1
        else:
            cell, i = cell + line[i], i + 1
    return cells[1:]


def _markdown_rows(markdown: str) -> list[list[str]]:
    """Table rows of a Markdown file, each cell as a reader sees it (line breaks, then backslash escapes undone)."""
    return [[re.sub(r"\\(.)", r"\1", cell.strip().replace("<br>", "\n")) for cell in _split_row(line)]
            for line in markdown.splitlines() if line.startswith("|") and not re.fullmatch(r"\|(---\|)+", line)]


def _values(result: dict) -> list[str]:
    return [report.format_value(v) for v in (*result["measured"].values(), *result["predicted"].values())]


def _assert_reports_hold_every_number(results: list[dict], folder, n_figures: int):
    page = _page(folder / "report.html")
    markdown = (folder / "report.md").read_text(encoding="utf-8")
    assert f"Platform: {report.platform()}." in markdown and f"Platform: {report.platform()}." in page.text
    md_cells = {cell for row in _markdown_rows(markdown) for cell in row}
    for r in results:
        assert r["name"] in page.ids and ("a", "href", f"#{r['name']}") in page.links
        assert f"{r['status']}" in page.text
        for text in _values(r):
            assert text in page.text, (r["name"], text)
            assert text in md_cells, (r["name"], text)  # a whole cell of the values table: no table was broken
    html_text = (folder / "report.html").read_text(encoding="utf-8")
    assert html_text.count('<img src="data:image/png;base64,') == n_figures
    assert not [link for link in page.links if re.match(r"\s*(https?:)?//", link[2], re.IGNORECASE)]
    assert "<link" not in html_text and "<script" not in html_text and "@import" not in html_text


def test_reports_of_every_status_hold_every_number_label_and_figure(tmp_path):
    calls = []

    def counted_figure():
        calls.append(1)
        return small_figure()

    results = _fake_results()
    results[0].figure = counted_figure
    report.write_report(results, tmp_path, seed=0, setting="quick")
    assert len(calls) == 1  # drawn once for both reports
    documents = [r.to_dict() for r in results]
    _assert_reports_hold_every_number(json.loads(json.dumps(documents)), tmp_path, n_figures=2)

    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    rows = _markdown_rows(markdown)
    shown = {notation.plain(label) for label in TRICKY_LABELS.values()}  # TeX math as Unicode text
    assert r"‖x‖/‖y‖ <small>" in shown
    value_rows = [row for row in rows if row[0] in shown]
    assert {row[0] for row in value_rows} == shown  # labels survive, shown, not ids
    assert all(len(row) == 3 for row in value_rows)  # label | measured | predicted, no cell split off
    assert ["a | b", "1.21016"] in rows
    page = _page(tmp_path / "report.html")
    assert all(label in page.text for label in shown)
    html_text = (tmp_path / "report.html").read_text()
    for status, colour in (("PASS", "#116329"), ("FAIL", "#a40e26"), ("FINDING", "#7d4e00"), ("ERROR", "#424a53")):
        assert f'<span class="status {status}">{status}</span>' in html_text  # the word, coloured by its class
        assert f".{status} {{ color: {colour};" in html_text
    # the same PNG bytes in the file the Markdown links and in the page
    png = (tmp_path / "figures" / "fake.passes.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and base64.b64encode(png).decode() in html_text
    assert "](figures/fake.passes.png)" in markdown
    # what each claim states beside its numbers
    assert "Nominal false-FAIL rate: 6e-05" in page.text and "Registered finding: it does not hold" in page.text
    hrefs = [link[2] for link in page.links if link[:2] == ("a", "href")]
    # from the reference, then from the notes: each to its section's heading in the copy beside the report
    assert any(h.startswith("docs/ccmc.md#31") for h in hrefs) and "docs/ccmc.md §3.1" in page.text
    assert any(h.startswith("docs/attention_svm.md#72") for h in hrefs) and "§7.2" in page.text
    assert "kaput" in page.text and "'Max |z|'" in page.text


def test_real_claims_reports_hold_every_number(cheap_check_run):
    document, folder = cheap_check_run
    with_figure = sum((folder / "figures" / f"{r['name']}.png").exists() for r in document["results"])
    assert with_figure >= 1
    _assert_reports_hold_every_number(document["results"], folder, n_figures=with_figure)


def test_markdown_cells_keep_their_text():
    for text in ["max |z|", "|grad R|", r"\|x\|", "a\\", "β* and Γ*", "<b>x</b>", "`code`", "_x_", "snake_case_id",
                 "two\nlines"]:
        line = f"| {report.markdown_cell(text)} | 1 |"
        assert _markdown_rows(line) == [[text, "1"]], text


# ---------------------------------------------------------------------------------------------------------------
# The terminal table
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [40, 80, 109, 110, 160])
def test_the_table_fits_the_width_and_shows_labels(width):
    results = _fake_results()
    results[1].name = "fake.a_claim_name_long_enough_to_need_more_than_one_line_at_forty_columns"
    table = report.format_table(results, width=width)
    assert max(len(line) for line in table.splitlines()) <= width
    flat = " ".join(table.split())
    for label in ("max |z|", "R* at β* and Γ*"):
        assert label in flat
    assert "max_z" not in flat  # labelled ids show as their labels
    for number in ("1.21016", "3.5e-07", "0.74062", "0.74059", "[0.25, -1.5]"):
        assert number in flat
    assert ("MEASURED" in table) == (width >= 110)  # side by side when wide, stacked under the claim when narrow


def test_the_table_takes_the_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    table = report.format_table(_fake_results())
    assert max(len(line) for line in table.splitlines()) <= 80 and "measured: " in table
