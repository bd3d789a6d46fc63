"""Write docs/paper-scale.md: every claim's verdict at ``--full``, with its headline numbers, the settings it ran
at, its wall time and the fingerprint of the code that computed it (not a test).

The input is ``attnflow check --full --json`` documents: the one ``attnflow report STORE --full --json`` prints
for a store, or a folder of one document per claim, each written ``PATH@COMMIT`` to name the commit that computed
it (a later document's outcome of a claim replaces an earlier one's). The code column is the fingerprint of the
source this script runs against: what ``attnflow check --full`` keys its stored outcomes by now.

    attnflow check --full --store attnflow-full
    attnflow report attnflow-full --full --json > full.json
    python benchmarks/paper_scale.py "full.json@$(git rev-parse --short HEAD)" --out docs/paper-scale.md
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _common import check_documents

from attnflow.validation import report, systems
from attnflow.validation.fingerprint import module_fingerprint

HEADER = """# The paper-scale verdicts

Every claim of every built-in paper at its `--full` setting (the paper's own scale), seed 0. Each row gives the
verdict, the headline number measured beside the one theory predicts (the first quantity the claim reports on
both sides; `attnflow check CLAIM --full` shows them all, with tolerances), the settings the claim ran at, its wall
time on one core, the commit that computed it, and the fingerprint of the claim's code at the commit of this page
(its module and everything it imports within attnflow, as in the result store's keys).
"""


def headline(result: dict) -> tuple[str, str, str]:
    """(label, measured, predicted) of the first id reported on both sides, else of the first measured id."""
    measured, predicted = result["measured"], result["predicted"]
    shared = [key for key in measured if key in predicted]
    key = shared[0] if shared else next(iter(measured), None)
    if key is None:
        return "", "", ""
    label = result["labels"].get(key, key)
    return label, report.format_number(measured[key]), report.format_number(predicted.get(key, ""))


def settings(claim) -> str:
    return ", ".join(f"{name}={report.format_number(value)}" for name, value in claim.full.items())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("documents", nargs="+", help="check --full --json documents, or folders of them, as PATH@COMMIT")
    p.add_argument("--platform", default="", help="the machine that computed them (default: this one's)")
    p.add_argument("--out", default="docs/paper-scale.md")
    p.add_argument("--append", default="", help="a Markdown file whose text follows the table (diagnoses, figures)")
    args = p.parse_args()
    results, commits = {}, {}
    for argument in args.documents:
        path, _, commit = argument.partition("@")
        for document in check_documents([path]):
            if document["setting"] != "full":
                raise SystemExit("paper_scale.py takes --full documents only")
            for result in document["results"]:
                results[result["name"]], commits[result["name"]] = result, commit or "?"
    claims = systems.select([])
    counts = {status: sum(r["status"] == status for r in results.values()) for status in report.STATUSES}
    lines = [HEADER, f"Computed on {args.platform or report.platform()}: **{len(results)} of {len(claims)} claims**: {counts['PASS']} PASS, {counts['FINDING']} registered "
             f"FINDING, {counts['FAIL']} FAIL, {counts['ERROR']} ERROR; "
             f"{sum(r['seconds'] for r in results.values()) / 3600:.2f} hours of one core in all.", ""]
    for system in systems.all_systems():
        lines += [f"## {system.key}", "", "| claim | verdict | headline | measured | predicted | full settings | "
                  "time | commit | code |", "|---|---|---|---|---|---|---|---|---|"]
        for claim in system.claims():
            result = results.get(claim.name)
            code = module_fingerprint(claim.function.__module__)
            if result is None:
                lines.append(f"| `{claim.name}` | not yet run | | | | {report.markdown_cell(settings(claim))} | | | "
                             f"`{code}` |")
                continue
            label, measured, predicted = headline(result)
            cells = [f"`{claim.name}`", f"**{result['status']}**", label, measured, predicted, settings(claim),
                     f"{result['seconds']:.1f} s", f"`{commits[claim.name]}`", f"`{code}`"]
            lines.append("| " + " | ".join(report.markdown_cell(c) if not c.startswith(("`", "**")) else c
                                            for c in cells) + " |")
        lines.append("")
    if args.append:
        lines.append(Path(args.append).read_text(encoding="utf-8"))
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(results)} of {len(claims)} claims")


if __name__ == "__main__":
    main()
