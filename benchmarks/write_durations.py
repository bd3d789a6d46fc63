"""Write the claims' measured times into ``validation/durations.json``, from which ``attnflow check`` starts the
longest claims first and estimates the time left (not a test).

Each argument is an ``attnflow check --json`` document (or a folder of them, one per claim, as a campaign of
single-claim runs leaves); a claim's time is taken from the last document that holds it, at that document's
setting. Claims the documents do not hold keep their time in the table. Times should be measured on one core with
a warm numba cache, so that a claim's time is its own work and not the kernels it happens to compile first.

    attnflow check --json --jobs 1 > quick.json
    python benchmarks/write_durations.py quick.json full-runs/
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import check_documents

TABLE = Path(__file__).resolve().parent.parent / "validation" / "durations.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("documents", nargs="+", help="check --json documents, or folders of them")
    args = p.parse_args()
    table = json.loads(TABLE.read_text(encoding="utf-8"))
    for document in check_documents(args.documents):
        for result in document["results"]:
            table.setdefault(document["setting"], {})[result["name"]] = round(result["seconds"], 3)
    table = {setting: dict(sorted(times.items())) for setting, times in sorted(table.items())}
    TABLE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"{TABLE}: " + ", ".join(f"{len(times)} {setting} times" for setting, times in table.items()))


if __name__ == "__main__":
    main()
