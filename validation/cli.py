"""The ``attnflow`` command line.

    attnflow list
    attnflow check [NAMES…] [--full] [--json] [--seed S] [--report DIR]
    attnflow solve SYSTEM [--param k=v …] [--plot FILE] [--json] [--latex]
    attnflow sweep TARGET --grid NAME=v1,v2 [--seeds K] [--jobs J] [--scheduler ADDRESS] [--store DIR] [--plot FILE]

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

    sweep = sub.add_parser("sweep", help="run an observable or claim over a grid × seeds; resumable")
    sweep.add_argument("target", nargs="?", help="observable or claim (attnflow sweep --list)")
    sweep.add_argument("--list", action="store_true", help="list the sweepable observables and their laws")
    sweep.add_argument("--grid", action="append", default=[], metavar="NAME=v1,v2,…", help="repeatable")
    sweep.add_argument("--seeds", type=int, default=8, help="replicates per grid point (default 8)")
    sweep.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    sweep.add_argument("--jobs", type=int, default=-1, help="joblib workers (default: all cores)")
    sweep.add_argument("--scheduler", metavar="ADDRESS", help="dask.distributed scheduler address")
    sweep.add_argument("--store", metavar="DIR", default="attnflow-sweeps", help="result store (default attnflow-sweeps)")
    sweep.add_argument("--plot", metavar="FILE", help="scaling plot with the fitted and the theorem's line")
    sweep.add_argument("--json", action="store_true", help="print the records and the fit as JSON")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")

    solve = sub.add_parser("solve", help="closed forms and the population dynamics of one system")
    solve.add_argument("system", help="system key, e.g. gd-beta")
    solve.add_argument("--param", action="append", default=[], metavar="K=V",
                       help="problem parameter (repeatable); see docs/cli.md")
    solve.add_argument("--plot", metavar="FILE", help="write a PNG figure")
    solve.add_argument("--json", action="store_true", help="print JSON")
    solve.add_argument("--latex", action="store_true", help="print the sympy derivation of the reduced system")
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


def _command_sweep(args) -> int:
    from . import plots, sweep

    if args.list:
        for obs in claims_module.observables().values():
            law = f"\n    law: {obs.law.y} ~ {obs.law.x}^{obs.law.exponent:g} ({obs.law.kind})" if obs.law else ""
            print(f"{obs.name}\n    {obs.reference}\n    {obs.description}\n    parameters: {obs.defaults}{law}")
        return 0
    if not args.target:
        raise ValueError("give a TARGET to sweep (attnflow sweep --list shows the observables)")
    grid = sweep.parse_grid(args.grid)
    store = f"{args.store.rstrip('/')}/{args.target.replace('-', '_')}"
    result = sweep.run_sweep(args.target, grid, seeds=args.seeds, master_seed=args.seed, store=store,
                             n_jobs=args.jobs, scheduler=args.scheduler, progress=not args.no_progress)
    fit, passed = None, True
    if result.law is not None and set(grid) == {result.law.x} and len(grid[result.law.x]) >= 3 and args.seeds >= 2:
        fit = sweep.scaling_fit(result)
        passed = fit.contains(result.law.exponent)
    if args.json:
        document = dict(schema="attnflow.sweep/1", target=result.target, grid=grid, seeds=args.seeds,
                        master_seed=args.seed, computed=result.computed, reused=result.reused,
                        records=result.records, fit=None if fit is None else vars(fit),
                        law=None if result.law is None else vars(result.law))
        print(json.dumps(claims_module.to_jsonable(document), indent=2, ensure_ascii=False))
    else:
        print(_sweep_table(result))
        if fit is not None:
            verdict = "PASS" if passed else "FAIL"
            print(f"\nscaling law {result.law.y} ~ {result.law.x}^p: p = {fit.estimate:.4g}, {fit.level:.0%} interval "
                  f"[{fit.low:.4g}, {fit.high:.4g}] over {fit.n_seeds} seeds; theorem p = {result.law.exponent:g}: "
                  f"{verdict}")
    print(f"computed {result.computed} tasks, reused {result.reused} from {store} ({result.seconds:.1f} s)",
          file=sys.stderr)
    if args.plot:
        if fit is None:
            raise ValueError("--plot needs a target with a scaling law swept over its x parameter alone")
        x, y = result.values(result.law.y, result.law.x)
        plots.scaling_figure(x, y, fit, result.law, result.target).savefig(args.plot, dpi=110)
        print(f"figure written to {args.plot}", file=sys.stderr)
    return 0 if passed else 1


def _sweep_table(result) -> str:
    """Mean ± SE over seeds of every numeric metric, one row per grid point."""
    groups: dict[tuple, list] = {}
    for r in result.records:
        groups.setdefault(tuple(tuple(p) for p in r["params"]), []).append(r["result"])
    lines = []
    for params, results in groups.items():
        label = ", ".join(f"{k}={report.format_number(v)}" for k, v in params)
        cells = []
        for metric in results[0]:
            values = np.array([res[metric] for res in results if isinstance(res.get(metric), (int, float))], float)
            if values.size == 0:
                continue
            se = values.std(ddof=1) / np.sqrt(values.size) if values.size > 1 else float("nan")
            cells.append(f"{metric} = {values.mean():.6g} ± {se:.2g}")
        lines.append(f"{label}:  " + ";  ".join(cells))
    return "\n".join(lines)


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
    from . import gd_beta, scb

    return {"gd_beta": gd_beta.solve, "scb": scb.solve}


def _command_solve(args) -> int:
    key = args.system.replace("-", "_")
    if args.latex:
        from closed_forms import symbolic

        print(symbolic.latex(key))
        return 0
    solvers = _solvers()
    if key not in solvers:
        raise ValueError(f"unknown system {args.system!r} for solve (available: {', '.join(sorted(solvers))})")
    summary, figure = solvers[key](parse_params(args.param), want_figure=bool(args.plot))
    if args.json:
        print(json.dumps(claims_module.to_jsonable(summary), indent=2, ensure_ascii=False))
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
        command = {"list": _command_list, "check": _command_check, "solve": _command_solve,
                   "sweep": _command_sweep}[args.command]
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
