"""The ``attnflow`` command line.

    attnflow list
    attnflow check [NAMES…] [--full] [--json] [--seed S] [--report DIR]
    attnflow solve SYSTEM [--param k=v …] [--plot FILE] [--json]

Exit codes: 0 every claim passed (or the command succeeded), 1 a claim failed or errored, 2 bad input
(one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from dynamics.integrate import DivergenceError

from . import claims as claims_module
from . import report


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message):
        raise ValueError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="attnflow", description="Check theorems about how one-layer transformers learn.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    sub.add_parser("list", help="list the registered claims")

    check = sub.add_parser("check", help="run claims (all by default) and report PASS/FAIL with numbers")
    check.add_argument("names", nargs="*", help="systems (gd_beta or gd-beta) or claims (gd_beta.lsa_gap)")
    check.add_argument("--full", action="store_true", help="paper-scale settings (default: quick)")
    check.add_argument("--json", action="store_true", help="print the stable JSON document instead of the table")
    check.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    check.add_argument("--report", metavar="DIR", help="write DIR/report.md with figures")
    check.add_argument("--no-progress", action="store_true", help="no progress bar")

    solve = sub.add_parser("solve", help="closed forms and the population dynamics of one system")
    solve.add_argument("system", help="system key, e.g. gd-beta")
    solve.add_argument("--param", action="append", default=[], metavar="K=V",
                       help="problem parameter (repeatable); see docs/cli.md")
    solve.add_argument("--plot", metavar="FILE", help="write a PNG figure")
    solve.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _command_list(_args) -> int:
    for c in claims_module.registry().values():
        print(f"{c.name}\n    {c.reference}\n    {c.statement}")
    return 0


def _command_check(args) -> int:
    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    selected = claims_module.select(args.names)
    from tqdm import tqdm

    results = []
    bar = tqdm(selected, desc="claims", unit="claim", disable=True if args.no_progress else None, file=sys.stderr)
    for c in bar:
        bar.set_postfix_str(c.name)
        results.append(claims_module.run_claim(c, full=args.full, seed=args.seed))
    setting = "full" if args.full else "quick"
    if args.json:
        print(report.to_json(results, seed=args.seed, setting=setting))
    else:
        print(report.format_table(results))
    if args.report:
        path = report.write_report(results, args.report, seed=args.seed, setting=setting)
        print(f"report written to {path}", file=sys.stderr)
    return 0 if all(r.passed for r in results) else 1


def _parse_value(key: str, text: str):
    """'3' -> 3.0; '1,0.5' -> vector; '1,.3;.3,.6' -> matrix."""
    try:
        if ";" in text:
            return np.array([[float(v) for v in row.split(",")] for row in text.split(";")])
        if "," in text:
            return np.array([float(v) for v in text.split(",")])
        return float(text)
    except ValueError:
        raise ValueError(f"parameter {key} must be a number, a comma list or a ;-separated matrix, got {text!r}") from None


def parse_params(pairs: list[str]) -> dict:
    params = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param takes K=V, got {pair!r}")
        params[key.strip()] = _parse_value(key.strip(), text.strip())
    return params


def _solvers():
    from . import gd_beta

    return {"gd_beta": gd_beta.solve}


def _command_solve(args) -> int:
    key = args.system.replace("-", "_")
    solvers = _solvers()
    if key not in solvers:
        raise ValueError(f"unknown system {args.system!r} for solve (available: {', '.join(sorted(solvers))})")
    summary, figure = solvers[key](parse_params(args.param), want_figure=bool(args.plot))
    if args.json:
        print(json.dumps(claims_module._jsonable(summary), indent=2, ensure_ascii=False))
    else:
        for name, value in summary.items():
            if isinstance(value, (list, np.ndarray)) and np.ndim(value) == 2:
                rows = "\n".join("    " + "  ".join(f"{v: .6g}" for v in row) for row in np.asarray(value))
                print(f"{name}:\n{rows}")
            elif isinstance(value, (list, np.ndarray)):
                print(f"{name}: " + ", ".join(report.format_number(v) for v in np.ravel(value)))
            else:
                print(f"{name}: {report.format_number(value)}")
    if args.plot:
        figure.savefig(args.plot, dpi=110)
        print(f"figure written to {args.plot}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        command = {"list": _command_list, "check": _command_check, "solve": _command_solve}[args.command]
        return command(args)
    except (ValueError, DivergenceError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"attnflow: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnflow: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
