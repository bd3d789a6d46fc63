"""The report at a glance (per-system totals, what needs a look first, a filter without script), labels written in
TeX shown as text, round-off shown as such, a report folder that holds one run, and the exports for a paper:
figures as PDF/SVG, claims.csv, claims.tex, the JSON's provenance and ``attnflow diff``."""
import ast
import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from attnflow import Claim, Outcome, run_claim
from attnflow.validation import notation, report, rundiff
from attnflow.validation.cli import main

from .conftest import small_figure

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tex, text, markup", [
    (r"$L^*_{\rm LoRA}(1)$", "L*_LoRA(1)", "L<sup>*</sup><sub>LoRA</sub>(1)"),
    (r"paired R − $L^*_{H3}$", "paired R − L*_H3", "paired R − L<sup>*</sup><sub>H3</sub>"),
    (r"floor $\mathcal{L}_\infty$", "floor ℒ_∞", "floor ℒ<sub>∞</sub>"),
    (r"$\rho^2 = 0.3$", "ρ² = 0.3", "ρ<sup>2</sup> = 0.3"),
    (r"$n_{\rm eff}/n$ at n = 5", "n_eff/n at n = 5", "n<sub>eff</sub>/n at n = 5"),
    (r"$L^*_1$ (branch)", "L*₁ (branch)", "L<sup>*</sup><sub>1</sub> (branch)"),
    (r"$\omega^* \propto 1/(d+1+\sigma_i^2)$", "ω* ∝ 1/(d+1+σᵢ²)",
     "ω<sup>*</sup> ∝ 1/(d+1+σ<sub>i</sub><sup>2</sup>)"),
    ("no math: x_1 < y, costs \\$5", "no math: x_1 < y, costs $5", "no math: x_1 &lt; y, costs $5"),
])
def test_tex_labels_read_as_text_and_as_html(tex, text, markup):
    assert notation.plain(tex) == text
    assert notation.html(tex) == markup


def test_no_claim_label_shows_tex_once_converted():
    """Every label of every registered claim's last quick run would show as text (checked on the labels the
    claims declare in their source: a ``$`` or a backslash left after conversion is raw TeX on screen)."""
    from attnflow.validation import systems

    raw = set()
    for path in {Path(claim.function.__code__.co_filename) for claim in systems.select([])}:
        tree = ast.parse(path.read_text("utf-8"))
        pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        raw |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in pieces
                and isinstance(node.value, str) and re.search(r"\$.+\$", node.value)}
    assert raw, "the claims' sources hold TeX labels to convert"
    assert not [label for label in raw if "$" in notation.plain(label) or "\\" in notation.plain(label)]


def test_values_within_round_off_of_zero_show_as_such():
    assert report.format_value(1.57e-16) == "≈0 (1.57e-16)"
    assert report.format_value(-2.2e-14) == "≈0 (-2.2e-14)"
    assert report.format_value(0.0) == "0" and report.format_value(3.4e-12) == "3.4e-12"
    assert report.format_value(0.25) == "0.25" and report.format_value(7) == "7"


def _claim(name, passed=True, *, finding="", crash=False, figure=True, reference="docs/ccmc.md §3.1"):
    def function(seed):
        if crash:
            raise RuntimeError("the solver gave up")
        return Outcome({"max_error": 2.5e-16, "slope": -1.98}, {"slope": -2.0}, "|slope + 2| < 0.05",
                       "4 standard errors", passed=passed, labels={"slope": r"slope of $L^*_{\rm LoRA}$"},
                       figure=small_figure if figure else None, false_fail_rate=6e-5)
    return run_claim(Claim(name, reference, "a claim for testing", function, {}, {}, finding), seed=0)


def _results():
    return [_claim("alpha.one"), _claim("alpha.two", passed=False), _claim("beta.one", passed=False, finding="it does not hold"),
            _claim("beta.two", crash=True), _claim("beta.three", figure=False)]


def test_the_page_opens_on_totals_then_what_needs_a_look(tmp_path):
    results = _results()
    assert [r.status for r in results] == ["PASS", "FAIL", "FINDING", "ERROR", "PASS"]
    report.write_report(results, tmp_path, seed=0, setting="quick")
    page = (tmp_path / "report.html").read_text("utf-8")
    totals = page.index("<th>system</th>")
    look = page.index("<h2>Needs a look</h2>")
    first_claim = page.index('<section id="alpha.one"')
    assert totals < look < first_claim
    # one line each, FAIL then ERROR then FINDING, with the failing comparison and its chance
    items = re.findall(r'<li><span class="status (\w+)">.*?</li>', page[look:first_claim])
    assert items == ["FAIL", "ERROR", "FINDING"]
    assert "nominal false-FAIL rate 6e-05" in page[look:first_claim]
    assert "the solver gave up" in page[look:first_claim] and "it does not hold" in page[look:first_claim]
    # per-system totals: alpha 2 claims (1 PASS, 1 FAIL); beta 3 (1 PASS, 1 FINDING, 1 ERROR)
    rows = re.findall(r'<tr><td><label for="system-(\w+)">\w+</label></td>((?:<td class="number">[^<]*</td>)+)',
                      page)
    cells = {system: re.findall(r">([^<]*)<", row)[::2] for system, row in rows}
    assert cells["alpha"][:5] == ["2", "1", "1", "", ""] and cells["beta"][:5] == ["3", "1", "", "1", "1"]
    # the filter: a radio button per system and status, CSS rules that hide the rest; no script
    for key in ("system-alpha", "system-beta", "status-PASS", "status-FAIL", "status-FINDING", "status-ERROR"):
        assert f'id="{key}"' in page and f"#{key}:checked ~ main" in page
    assert 'data-system="beta" data-status="ERROR"' in page
    assert "<script" not in page
    # labels written in TeX are shown as HTML, round-off as such
    assert "slope of L<sup>*</sup><sub>LoRA</sub>" in page and "≈0 (2.5e-16)" in page


def test_the_markdown_report_opens_on_totals_and_the_terminal_shows_text():
    results = _results()
    markdown = report.markdown_report(results, {}, seed=0, setting="quick")
    head = markdown[:markdown.index("\n## alpha.one")]
    assert "| alpha | 2 | 1 | 1 | 0 | 0 |" in head and "| beta | 3 | 1 | 0 | 1 | 1 |" in head
    assert head.index("**FAIL** [alpha.two]") < head.index("**ERROR** [beta.two]") < head.index("**FINDING**")
    table = report.format_table(results, width=120)
    assert "slope of L*_LoRA = -1.98" in table and "$" not in table


def test_a_report_folder_holds_one_run_and_its_derivations(tmp_path):
    results = _results()
    report.write_report(results, tmp_path, seed=0, setting="quick", figure_formats=("png", "svg", "pdf"))
    figures = tmp_path / "figures"
    assert sorted(p.name for p in figures.iterdir()) == sorted(
        f"{name}.{form}" for name in ("alpha.one", "alpha.two", "beta.one") for form in ("png", "svg", "pdf"))
    assert (figures / "alpha.one.pdf").read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in (figures / "alpha.one.svg").read_bytes()[:600]
    # the cited page is copied beside the report, and the link's anchor is a heading of it
    copied = tmp_path / "docs" / "ccmc.md"
    assert copied.read_bytes() == (REPOSITORY / "docs" / "ccmc.md").read_bytes()
    href = re.search(r'<a href="(docs/ccmc\.md#[^"]+)">', (tmp_path / "report.html").read_text("utf-8"))[1]
    anchors = {report.heading_anchor(line) for line in copied.read_text("utf-8").splitlines() if line.startswith("#")}
    assert href.split("#")[1] in anchors
    assert "<summary>The derivation, docs/ccmc.md §3.1</summary>" in (tmp_path / "report.html").read_text("utf-8")
    # a second report into the same folder, of fewer claims: nothing of the first is left
    (tmp_path / "notes.txt").write_text("mine")
    report.write_report(results[:1], tmp_path, seed=0, setting="quick")
    assert sorted(p.name for p in figures.iterdir()) == ["alpha.one.png"]
    assert (tmp_path / "notes.txt").read_text() == "mine"  # what the report never writes is left alone
    with pytest.raises(ValueError, match="figure format 'gif'"):
        report.write_report(results, tmp_path, seed=0, setting="quick", figure_formats=("gif",))


def test_csv_and_latex_exports_hold_every_number(tmp_path):
    results = _results()
    report.write_report(results, tmp_path, seed=0, setting="quick")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "claims.csv").read_text("utf-8"))))
    assert [r["claim"] for r in rows] == ["alpha.one"] * 2 + ["alpha.two"] * 2 + ["beta.one"] * 2 + ["beta.two"] \
        + ["beta.three"] * 2
    slope = next(r for r in rows if r["claim"] == "alpha.two" and r["id"] == "slope")
    assert float(slope["measured"]) == -1.98 and float(slope["predicted"]) == -2.0  # full precision
    assert slope["label"] == "slope of L*_LoRA" and slope["status"] == "FAIL" and float(slope["false_fail_rate"]) == 6e-5
    tiny = next(r for r in rows if r["claim"] == "alpha.one" and r["id"] == "max_error")
    assert float(tiny["measured"]) == 2.5e-16 and tiny["predicted"] == ""
    tex = (tmp_path / "claims.tex").read_text("utf-8")
    assert r"\begin{longtable}" in tex and r"\end{longtable}" in tex
    # the claim named on its first row; text escaped, TeX math kept, numbers as the report shows them
    assert "alpha.two & FAIL & max\\_error & ≈0 (2.5e-16) &  \\\\\n &  & slope of $L^*_{\\rm LoRA}$ & -1.98 & -2 \\\\" in tex
    body = re.sub(r"\$[^$]*\$", "", re.sub(r"\\[{}]", "", tex))
    assert body.count("{") == body.count("}")
    assert report.latex_text("50% of a_b & {c} #1 ~ ^") == r"50\% of a\_b \& \{c\} \#1 \textasciitilde{} \textasciicircum{}"


def test_the_json_says_which_commit_and_versions_computed_it(capsys):
    assert main(["check", "gd_beta.risk_formula", "--json", "--no-progress", "--no-store"]) == 0
    document = json.loads(capsys.readouterr().out)
    provenance = document["provenance"]
    assert provenance["versions"]["attnflow"] == report.version()
    import numpy
    assert provenance["versions"]["numpy"] == numpy.__version__
    if (REPOSITORY / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert provenance["git_commit"] == head and isinstance(provenance["git_dirty"], bool)


def _document(results, **extra):
    return json.loads(report.to_json(results, seed=0, setting="quick")) | extra


def test_diff_lists_what_changed_between_two_runs(tmp_path, capsys):
    before = _document(_results())
    after = json.loads(json.dumps(before))
    after["results"][1]["status"] = "PASS"                       # alpha.two: a verdict changed
    after["results"][0]["measured"]["slope"] = -1.98 * (1 + 1e-9)  # alpha.one: a number moved a little
    del after["results"][4]                                       # beta.three: only in A
    after["results"].append(dict(after["results"][0], name="gamma.new"))  # only in B
    difference = rundiff.diff_runs(before, after)
    assert [(c.claim, c.status_a, c.status_b) for c in difference.changes] == [
        ("alpha.one", "PASS", "PASS"), ("alpha.two", "FAIL", "PASS"), ("beta.three", "PASS", None),
        ("gamma.new", None, "PASS")]
    moved = difference.changes[0].numbers
    assert moved[0][:4] == ("measured", "slope", -1.98, -1.98 * (1 + 1e-9)) and moved[0][4] == pytest.approx(1e-9)
    assert difference.unchanged == 2
    assert [c.claim for c in rundiff.diff_runs(before, after, rtol=1e-6).changes] == [
        "alpha.two", "beta.three", "gamma.new"]
    assert rundiff.diff_runs(before, before).changes == []
    # the command: exit 1 when something differs, 0 when nothing does, 2 on a file that is not a run
    a, b, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    a.write_text(json.dumps(before)), b.write_text(json.dumps(after)), bad.write_text("{}")
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "alpha.two: FAIL → PASS" in out and "- beta.three: only in A" in out and "4 claims differ" in out
    assert main(["diff", str(a), str(a), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == []
    for args in ([str(a), str(bad)], [str(a), str(tmp_path / "missing.json")], [str(a), str(b), "--rtol", "-1"]):
        assert main(["diff", *args]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_check_and_report_save_figures_for_a_paper(tmp_path, capsys):
    store, first, rebuilt = tmp_path / "store", tmp_path / "first", tmp_path / "rebuilt"
    claim = "ccmc.sampled_frequencies"  # a claim with a figure, in a fraction of a second
    assert main(["check", claim, "--store", str(store), "--report", str(first), "--figure-format", "png,svg",
                 "--no-progress"]) == 0
    assert (first / "figures" / f"{claim}.svg").exists() and (first / "claims.csv").exists()
    assert main(["report", str(store), claim, "--out", str(rebuilt), "--figure-format", "svg"]) == 0
    assert (rebuilt / "figures" / f"{claim}.svg").read_bytes() == (first / "figures" / f"{claim}.svg").read_bytes()
    capsys.readouterr()
    assert main(["report", str(store), claim, "--out", str(rebuilt), "--figure-format", "pdf"]) == 0
    assert "rerun check with --figure-format pdf" in capsys.readouterr().err  # not stored: said, not invented
    assert main(["check", claim, "--figure-format", "gif", "--no-store"]) == 2


def test_the_diff_example_of_the_cli_docs_runs_as_printed(tmp_path):
    text = (REPOSITORY / "docs" / "cli.md").read_text("utf-8")
    block = re.search(r"```\n(attnflow check [^\n]*> before\.json\n.*?)```", text, re.S)[1]
    done = subprocess.run(["bash", "-c", block.replace("attnflow ", "python -m attnflow.validation.cli ")],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr  # the seeds differ, so the Monte-Carlo numbers do
    assert "gd_beta.risk_formula: PASS, numbers moved" in done.stdout and "1 claim differs" in done.stdout
