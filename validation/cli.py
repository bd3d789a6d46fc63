"""The ``attnflow`` command line.

    attnflow list
    attnflow check [NAMES…] [-k EXPR] [--full] [--json] [--seed S] [--report DIR] [--jobs N] [--scheduler ADDRESS]
                   [--store DIR | --no-store] [--rerun]
    attnflow report STORE [NAMES…] [--out DIR] [--full] [--seed S] [--json] [--figure-format F,…]
    attnflow diff A.json B.json [--rtol R] [--json]
    attnflow solve SYSTEM [--param K=V …] [--seed S] [--json] [--plot FILE] [--latex] [--describe]
    attnflow simulate SYSTEM [--param K=V …] [--seed S] [--json] [--plot FILE] [--compare | --no-compare] [--describe]
    attnflow sweep TARGET --grid NAME=v1,v2 [--seeds K] [--jobs J] [--scheduler ADDRESS] [--store DIR] [--plot FILE]
    attnflow calibrate CLAIM [--seeds N] [--jobs J] [--scheduler ADDRESS] [--store DIR] [--json]
    attnflow calibrate --table FILE.md [CLAIM or SYSTEM ...] [--seeds N] [--verify | --rewitness] ...

``solve`` and ``simulate`` work for every registered system (attnflow.validation.systems): ``--param`` takes the
Problem's parameters and the options of the population dynamics (solve) or of the minibatch algorithm
(simulate); ``--describe`` lists what each command accepts. ``simulate --compare`` runs the population prediction
of the same quantities beside the minibatch run (attnflow.validation.compare). Exit codes: 0 every claim's outcome is the registered one (PASS, or a documented FINDING reproduced) or the
command succeeded; 1 a claim failed or errored, or a finding stopped reproducing (with ``--strict`` findings count
as failures too), or ``diff`` found a claim that differs; 2 bad input (one line on stderr); 130 interrupted.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

from attnflow import seeding
from attnflow.dynamics.errors import BudgetExceeded, DivergenceError, StageFailure

from . import claim_runs, engine, report, systems
from . import claims as claims_module
from .live import LiveBar, wanted


AUTO_PARALLEL_SECONDS = 20.0  # below this (expected on one core) starting workers costs more than it saves
FULL_STORE = "attnflow-full"  # where --full keeps its outcomes unless told otherwise: hours of work are not lost


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message):
        raise ValueError(message)


def _add_system_command(sub, name: str, help_text: str):
    command = sub.add_parser(name, help=help_text)
    command.add_argument("system", help="system key, e.g. gd-beta (attnflow list)")
    command.add_argument("--param", action="append", default=[], metavar="K=V",
                         help="a problem parameter or an option (repeatable); --describe lists them")
    command.add_argument("--seed", type=int, default=0, help="seed of every random quantity (default 0)")
    command.add_argument("--plot", metavar="FILE", help="write a PNG of the trajectory's metrics")
    command.add_argument("--json", action="store_true", help="print JSON (docs/cli.md)")
    command.add_argument("--describe", action="store_true",
                         help=f"list every parameter {name} accepts, with its kind, bounds, default and meaning")
    command.add_argument("--no-progress", action="store_true", help="no progress bar")
    if name == "simulate":
        command.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                             help="run the population prediction of the same quantities too: print it beside the "
                                  "run and draw it in --plot (default: on with --plot, for a system that has one)")
    return command


def _build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="attnflow", description="Check theorems about how one-layer transformers learn.")
    parser.add_argument("--version", action="version", version=f"attnflow {report.version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    listing = sub.add_parser("list", help="list the registered systems and claims")
    listing.add_argument("systems", nargs="*", help="only these systems (default: all)")
    listing.add_argument("--json", action="store_true", help="print JSON (schema attnflow.list/1)")
    _add_tier(listing)

    check = sub.add_parser("check", help="run claims (all by default) and report PASS/FAIL with numbers")
    check.add_argument("names", nargs="*", help="systems (gd_beta or gd-beta) or claims (gd_beta.lsa_gap)")
    check.add_argument("-k", metavar="EXPRESSION", dest="keyword",
                       help="only claims whose names match, as pytest's -k: words are substrings, with and/or/not "
                            "(-k 'svm and not rank')")
    check.add_argument("--full", action="store_true", help="paper-scale settings (default: quick)")
    _add_tier(check)
    check.add_argument("--json", action="store_true",
                       help="print the JSON document (schema attnflow.check/2) instead of the table")
    check.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    check.add_argument("--report", metavar="DIR",
                       help="write DIR/report.md (figures in DIR/figures) and the self-contained DIR/report.html")
    _add_figure_format(check)
    check.add_argument("--strict", action="store_true", help="count registered findings as failures (exit 1)")
    check.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="worker processes (default: every core when the claims are expected to take over "
                            f"{AUTO_PARALLEL_SECONDS:g} s on one, else this process; -1: every core)")
    check.add_argument("--scheduler", metavar="ADDRESS", help="run the claims on this dask.distributed scheduler")
    check.add_argument("--store", metavar="DIR",
                       help=f"keep each finished claim's outcome in DIR and reuse those whose code is unchanged "
                            f"(default with --full: {FULL_STORE})")
    check.add_argument("--no-store", action="store_true", help="keep nothing (also with --full)")
    check.add_argument("--rerun", action="store_true", help="recompute claims even when the store holds them")
    check.add_argument("--no-progress", action="store_true", help="no progress bar")

    rebuild = sub.add_parser("report", help="rebuild report.md / report.html from a store, computing nothing")
    rebuild.add_argument("store", metavar="STORE", help="the folder given to check --store")
    rebuild.add_argument("names", nargs="*", help="systems or claims (default: all)")
    rebuild.add_argument("-k", metavar="EXPRESSION", dest="keyword", help="only claims whose names match (as check)")
    _add_tier(rebuild)
    rebuild.add_argument("--out", metavar="DIR", help="write DIR/report.md and DIR/report.html")
    rebuild.add_argument("--full", action="store_true", help="the outcomes of a --full run (default: quick)")
    rebuild.add_argument("--seed", type=int, default=0, help="the master seed of the run (default 0)")
    rebuild.add_argument("--json", action="store_true", help="print the check JSON document of the stored outcomes")
    _add_figure_format(rebuild)

    compare = sub.add_parser("diff", help="the claims whose verdict or numbers changed between two check --json runs")
    compare.add_argument("run_a", metavar="A.json", help="a document written by attnflow check --json")
    compare.add_argument("run_b", metavar="B.json", help="another one")
    compare.add_argument("--rtol", type=float, default=0.0,
                         help="ignore numbers that moved by at most this, relative (default 0: any change)")
    compare.add_argument("--json", action="store_true", help="print JSON (schema attnflow.diff/1)")

    calibrate = sub.add_parser("calibrate", help="a claim's false-FAIL rate over many seeds against its nominal rate")
    calibrate.add_argument("claims", nargs="*", metavar="CLAIM",
                           help="one claim, e.g. gd_beta.risk_formula; with --table, claims or systems (default all)")
    calibrate.add_argument("--table", metavar="FILE.md",
                           help="calibrate every claim named that depends on its seed (others are skipped) and keep the "
                                "rows in this Markdown table and its .json twin, rewritten after every claim")
    calibrate.add_argument("--full", action="store_true",
                           help="calibrate at the full (paper-scale) setting; a table holds rows of one setting")
    calibrate.add_argument("--seeds", type=int, help="independent seeds (default 200)")
    calibrate.add_argument("--seed", type=int, help="first seed: replicate i is the run --seed SEED + i (default 0)")
    calibrate.add_argument("--jobs", type=int, default=-1, help="joblib workers (default: all cores)")
    calibrate.add_argument("--scheduler", metavar="ADDRESS", help="a dask.distributed scheduler to run on")
    calibrate.add_argument("--store", default="attnflow-calibration",
                           help="folder for finished replicates, so a rerun resumes (default attnflow-calibration)")
    calibrate.add_argument("--verify", action="store_true",
                           help="with --table: rerun only the witness seeds of each stale row and carry the row "
                                "forward to the current code if they reproduce bit for bit (exit 1 if a row stays "
                                "stale or is not calibrated)")
    calibrate.add_argument("--rewitness", action="store_true",
                           help="with --table: for each row whose code is current, rerun its witness seeds and record "
                                "their digests for this platform (CPU and library versions), which --verify then "
                                "compares here (exit 1 if a row is refused)")
    calibrate.add_argument("--json", action="store_true", help="print JSON (schema attnflow.calibrate/1)")
    calibrate.add_argument("--no-progress", action="store_true", help="no progress bar")

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

    bench = sub.add_parser("bench", help="run the speed benchmarks (benchmarks/ of a source checkout): named ratios")
    bench.add_argument("names", nargs="*", help="only these benchmarks, e.g. scb one_nn (default: all)")
    bench.add_argument("--repeats", type=int, help="interleaved repeats per contender (default: each script's own)")
    bench.add_argument("--json", action="store_true", help="print one JSON object: benchmark → named ratios")

    solve = _add_system_command(sub, "solve", "closed forms and the population dynamics of one system")
    solve.add_argument("--latex", action="store_true", help="print the symbolic derivation of the reduced system")
    _add_system_command(sub, "simulate", "the paper's minibatch training algorithm on one system")
    return parser


def _add_tier(command) -> None:
    command.add_argument("--tier", default="core", choices=systems.TIER_CHOICES,
                         help="which claims: core (default, the one-layer theory), deep (trained multi-layer models "
                              "in JAX, needs attnflow[deep]; docs/deep.md) or all")


def _add_figure_format(command) -> None:
    command.add_argument("--figure-format", metavar="F,…", default="png",
                         help="with a report: also save each figure in these formats, for a paper (png, pdf, svg; "
                              "default png)")


def _figure_formats(text: str) -> tuple:
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in report.FIGURE_FORMATS]
    if not formats or unknown:
        raise ValueError(f"--figure-format: {(unknown or [text])[0]!r} is not one of "
                         f"{', '.join(report.FIGURE_FORMATS)}")
    return formats


def _check_output_file(path: str | None, option: str) -> None:
    """Refuse an output file that cannot be written, before any work starts."""
    if path is None:
        return
    if not path.strip():
        raise ValueError(f"{option} needs a file name")
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise ValueError(f"{option}: {path!r} is a directory")
    if not parent.is_dir():
        raise ValueError(f"{option}: the folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"{option}: cannot write {path!r}")
    if not target.exists():  # a probe: permission bits do not tell (root in /proc), creating the file does
        try:
            target.open("xb").close()
        except OSError as error:
            raise ValueError(f"{option}: cannot write {path!r} ({error.strerror or error})") from None
        target.unlink()


def _check_plot_file(path: str | None) -> None:
    """``--plot``: a writable file whose suffix names a format matplotlib writes, refused before any work starts."""
    _check_output_file(path, "--plot")
    if path is None:
        return
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in formats:
        raise ValueError(f"--plot: {path!r} must end in one of {', '.join('.' + f for f in sorted(formats))}")


def _check_output_folder(path: str | None, option: str) -> None:
    if path is None:
        return
    if not path.strip():
        raise ValueError(f"{option} needs a folder name")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{option}: cannot create {path!r} ({error.strerror or error})") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"{option}: cannot write into {path!r}")


def _check_seed(seed: int) -> np.random.SeedSequence:
    if seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {seed}")
    return seeding.as_seed_sequence(seed, "--seed")


def _command_list(args) -> int:
    chosen = [systems.get_system(key) for key in args.systems] if args.systems else systems.all_systems()
    if args.tier != "core":
        systems.select([], tier=args.tier)  # registers the tier's claims
        if args.tier == "deep":  # only the systems that have claims in the tier
            chosen = [s for s in chosen if any(c.tier == "deep" for c in s.claims())]
    if args.json:
        document = dict(schema="attnflow.list/1", attnflow_version=report.version(), systems=[
            dict(key=s.key, title=s.title, reference=s.reference, docs=s.docs,
                 claims=[dict(name=c.name, reference=c.reference, statement=c.statement, finding=c.finding,
                             tier=c.tier) for c in s.claims() if systems.in_tier(c, args.tier)])
            for s in chosen])
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return 0
    for system in chosen:
        print(f"{system.key}: {system.title}\n    {system.reference}")
        for c in system.claims():
            if systems.in_tier(c, args.tier):
                tier = f"  [{c.tier} tier]" if c.tier != "core" else ""
                print(f"  {c.name}{'  [registered finding]' if c.finding else ''}{tier}\n      {c.statement}")
    return 0


def _selected_claims(args) -> list:
    selected = systems.select(args.names, tier=getattr(args, "tier", "core"))
    if args.keyword is not None:
        matches = claim_runs.match_expression(args.keyword)
        selected = [c for c in selected if matches(c.name)]
        if not selected:
            raise ValueError(f"-k {args.keyword!r} matches no claim (attnflow list shows them)")
    return selected


def _check_store(args) -> str | None:
    if args.no_store and args.store:
        raise ValueError("give --store DIR or --no-store, not both")
    if args.no_store:
        return None
    store = args.store if args.store is not None else FULL_STORE if args.full else None
    _check_output_folder(store, "--store")
    return store


def _check_jobs(args, selected: list, setting: str) -> int:
    if args.jobs is not None:
        if args.jobs == 0 or args.jobs < -1:
            raise ValueError(f"--jobs must be a number of workers >= 1, or -1 for every core; got {args.jobs}")
        return args.jobs
    expected = sum(claim_runs.expected_seconds(c.name, setting) for c in selected)
    return -1 if expected > AUTO_PARALLEL_SECONDS else 1


def _command_check(args) -> int:
    _check_seed(args.seed)
    _check_output_folder(args.report, "--report")
    figure_formats = _figure_formats(args.figure_format)
    store = _check_store(args)
    selected = _selected_claims(args)
    if any(c.tier == "deep" for c in selected):
        from . import deep

        deep.require_installed()
    setting = "full" if args.full else "quick"
    n_jobs = _check_jobs(args, selected, setting)
    workers = 1 if args.scheduler else engine.worker_count(n_jobs, len(selected))
    if store is not None and not args.json:
        print(f"attnflow: outcomes are kept in {store}/ as they finish: the same command resumes, --rerun recomputes",
              file=sys.stderr)
    table = None if args.json else report.Table([c.name for c in selected])
    if table is not None:
        _print_lines(table.header())
    expected = {c.name: claim_runs.expected_seconds(c.name, setting) for c in selected}
    with LiveBar(wanted(quiet=args.no_progress or args.json), total=len(selected), desc="claims", unit="claim",
                 expected=expected, workers=workers) as live:
        def finished(result, reused):
            if table is not None:
                _print_lines(table.block(result), above=live)
            live.advance(result.name, None if reused else result.seconds)

        run = claim_runs.run_checks(selected, setting=setting, seed=args.seed, n_jobs=n_jobs,
                                    scheduler=args.scheduler, store=store, rerun=args.rerun,
                                    draw_figures=bool(args.report or store), figure_formats=figure_formats,
                                    on_result=finished,
                                    on_start=lambda task: live.start(task.claim))
    results = run.results
    if args.json:
        print(report.to_json(results, seed=args.seed, setting=setting, interrupted=run.interrupted))
    else:
        closing = report.recap(results)
        _print_lines(([closing] if closing else []) + report.summary_line(results).splitlines())
    for line in run.quarantined:
        print(f"attnflow: a stored outcome could not be used and was recomputed: {line}", file=sys.stderr)
    if store is not None:
        print(f"computed {run.computed} claims, reused {run.reused} from {store}", file=sys.stderr)
    if args.report and results:
        path = report.write_report(results, args.report, seed=args.seed, setting=setting, figures=run.figures,
                                   figure_files=run.figure_files, figure_formats=figure_formats)
        print(f"report written to {path} and {path.with_suffix('.html')}", file=sys.stderr)
    if run.failure:
        print(f"attnflow: error: the run stopped ({run.failure}); {len(results)} of {len(selected)} claims finished"
              + (f" and are kept in {store}: the same command resumes" if store is not None else ""), file=sys.stderr)
        return 1
    if run.interrupted:
        print(f"attnflow: interrupted; {len(results)} of {len(selected)} claims finished"
              + (f" and are kept in {store}" if store is not None else ""), file=sys.stderr)
        return 130
    if args.strict:
        return 0 if all(r.passed for r in results) else 1
    return 0 if all(r.as_registered for r in results) else 1


def _print_lines(lines: list[str], above: LiveBar | None = None) -> None:
    """Print and flush at once, so a pipe or a log sees each claim as it finishes (above the bar, if one is
    drawn)."""
    text = "\n".join(lines)
    if above is not None and above.enabled:
        above.write(text)
    else:
        print(text, flush=True)


def _command_report(args) -> int:
    _check_seed(args.seed)
    if not Path(args.store).is_dir():
        raise ValueError(f"STORE: {args.store!r} is not a folder (give the one check --store wrote)")
    if not args.out and not args.json:
        raise ValueError("give --out DIR (the report) or --json")
    _check_output_folder(args.out, "--out")
    figure_formats = _figure_formats(args.figure_format)
    selected = _selected_claims(args)
    setting = "full" if args.full else "quick"
    run = claim_runs.stored_results(selected, args.store, setting=setting, seed=args.seed)
    if args.json:
        print(report.to_json(run.results, seed=args.seed, setting=setting))
    for line in run.quarantined:
        print(f"attnflow: a stored outcome could not be used: {line}", file=sys.stderr)
    if run.missing:
        shown = ", ".join(run.missing[:5]) + (f" and {len(run.missing) - 5} more" if len(run.missing) > 5 else "")
        print(f"attnflow: {len(run.missing)} claims have no outcome of the current code at setting {setting}, "
              f"seed {args.seed} in {args.store}: {shown}", file=sys.stderr)
    if args.out and run.results:
        path = report.write_report(run.results, args.out, seed=args.seed, setting=setting, figures=run.figures,
                                   figure_files=run.figure_files, figure_formats=figure_formats)
        absent = sorted({name for name in run.figures if isinstance(run.figures[name], bytes)
                         for form in figure_formats if form not in run.figure_files.get(name, {})})
        if absent:
            print(f"attnflow: {len(absent)} stored figures were not saved as {','.join(figure_formats)}: "
                  f"rerun check with --figure-format {','.join(figure_formats)} to store them", file=sys.stderr)
        print(f"report of {len(run.results)} stored claims written to {path} and {path.with_suffix('.html')}",
              file=sys.stderr)
    return 1 if run.missing else 0


def _command_diff(args) -> int:
    from . import rundiff

    difference = rundiff.diff_runs(rundiff.load_run(args.run_a), rundiff.load_run(args.run_b), rtol=args.rtol)
    print(json.dumps(difference.to_dict(), indent=2, ensure_ascii=False) if args.json else difference.text())
    return 1 if difference.changes else 0


def _command_calibrate(args) -> int:
    from . import calibration

    rerun = "--verify" if args.verify else "--rewitness" if args.rewitness else None
    if args.verify and args.rewitness:
        raise ValueError("give --verify or --rewitness, not both")
    if rerun and (args.seeds is not None or args.seed is not None):
        raise ValueError(f"{rerun} reruns each row's own witness seeds: --seeds and --seed do not apply")
    args.seeds = 200 if args.seeds is None else args.seeds
    args.seed = 0 if args.seed is None else args.seed
    _check_seed(args.seed)
    _check_output_folder(args.store, "--store")
    if args.table is not None:
        return _calibrate_table(args)
    if rerun:
        raise ValueError(f"{rerun} checks the rows of a table: give --table FILE.md")
    if len(args.claims) != 1:
        raise ValueError("calibrate one claim (e.g. gd_beta.risk_formula), or several with --table FILE.md")
    claim = args.claims[0]
    store = f"{args.store.rstrip('/')}/{claim.replace('-', '_')}"
    found = calibration.calibrate(claim, seeds=args.seeds, first_seed=args.seed, store=store,
                                  n_jobs=args.jobs, scheduler=args.scheduler,
                                  progress=wanted(quiet=args.no_progress or args.json), full=args.full)
    if args.json:
        print(json.dumps(claims_module.to_jsonable(dict(schema="attnflow.calibrate/1",
                                                        attnflow_version=report.version(), seed=args.seed,
                                                        **found.as_dict())), indent=2))
    else:
        print(_calibration_line(found))
    print(f"computed {found.computed} seeds, reused {found.reused} from {store}", file=sys.stderr)
    return 0 if found.calibrated else 1


def _calibration_line(found) -> str:
    from . import calibration

    nominal = "none stated (must not fail)" if found.nominal is None else f"{found.nominal:.3g}"
    verdict = found.verdict
    if verdict == "too few seeds":
        verdict += (f" (the interval reaches {calibration.CEILING:.0%} or more; "
                    f"{calibration.seeds_needed(found.alarms)} seeds tell)")
    return (f"{found.claim}: {found.alarms} of {found.seeds} seeds not as registered ({found.errors} errors); "
            f"false-FAIL rate {found.rate:.3g}, {calibration.LEVEL:.0%} Clopper–Pearson [{found.low:.3g}, "
            f"{found.high:.3g}]; nominal {nominal}: {verdict}")


def _calibrate_table(args) -> int:
    """Calibrate each stochastic claim named and merge its row into the table as soon as it is done."""
    from . import calibration

    if args.json:
        raise ValueError(f"--json prints one claim's calibration; the table's JSON twin is written beside {args.table}")
    _check_output_file(args.table, "--table")
    rows = calibration.read_table(args.table)  # an unreadable table stops here, before any work
    setting = "full" if args.full else "quick"
    if args.verify or args.rewitness:
        if args.full:
            raise ValueError("--verify and --rewitness rerun each row at the setting it was calibrated at: drop --full")
        return _verify_table(args, rows)
    other = sorted(name for name, row in rows.items() if row.get("setting", "quick") != setting)
    if other:
        raise ValueError(f"{args.table} holds rows of the {'quick' if args.full else 'full'} setting ({other[0]}, …): "
                         f"a table holds one setting; give another --table for --{setting}")
    chosen = systems.select(args.claims or None)
    all_calibrated = True
    for claim in chosen:
        store = f"{args.store.rstrip('/')}/{claim.name}"
        options = dict(first_seed=args.seed, store=store, n_jobs=args.jobs, scheduler=args.scheduler, full=args.full)
        # Two seeds say whether the claim depends on its seed at all; the store keeps them for the full run.
        if not calibration.depends_on_seed(claim.name, **options):
            dropped = calibration.drop_from_table(args.table, claim.name)
            print(f"{claim.name}: deterministic (the same numbers at two seeds), not calibrated"
                  + (f"; its old row is removed from {args.table}" if dropped else ""), file=sys.stderr)
            continue
        found = calibration.calibrate(claim.name, seeds=args.seeds, progress=wanted(quiet=args.no_progress),
                                      **options)
        calibration.update_table(args.table, calibration.table_entry(found, seed=args.seed))
        all_calibrated &= found.calibrated
        print(_calibration_line(found), flush=True)
    return 0 if all_calibrated else 1


def _verify_table(args, rows) -> int:
    """``calibrate --table FILE --verify`` (or ``--rewitness``): the rows named (a claim by name, a system by the
    rows it has; default every row) checked against the current code (or given this platform's witnesses)."""
    from . import calibration

    if not rows:
        raise ValueError(f"there is no calibration table at {args.table} to "
                         + ("verify" if args.verify else "record witnesses for"))
    names = []
    for name in args.claims or sorted(rows):
        claims = systems.select([name])
        if systems.normalise_key(name) not in systems.system_keys() and claims[0].name not in rows:
            raise ValueError(f"no row in {args.table} for {claims[0].name}")
        names += [c.name for c in claims if c.name in rows and c.name not in names]  # a system: the rows it has
    check, fine = ((calibration.verify_row, ("current", "carried")) if args.verify
                   else (calibration.rewitness_row, ("recorded", "already recorded")))
    if args.rewitness:
        print(f"this platform: {calibration.platform()}", file=sys.stderr)
    failing = 0
    for name in names:
        verdict = check(args.table, name, store=f"{args.store.rstrip('/')}/{name}", n_jobs=args.jobs,
                        scheduler=args.scheduler)
        good = verdict in fine
        row = calibration.read_table(args.table)[name]
        found = calibration.verdict(row["alarms"], row["seeds"], row["nominal"])  # by the current rule
        failing += not (good and found == "calibrated")
        advice = "" if good or "recalibrate" in verdict else ": recalibrate"
        print(f"{name}: {verdict}{advice}" + ("" if found == "calibrated" else f" ({found})"), flush=True)
    return 0 if not failing else 1


def _command_sweep(args) -> int:
    from . import plots, sweep

    if args.list:
        for obs in systems.observables().values():
            law = f"\n    law: {obs.law.y} ~ {obs.law.x}^{obs.law.exponent:g} ({obs.law.kind})" if obs.law else ""
            print(f"{obs.name}\n    {obs.reference}\n    {obs.description}\n    parameters: {obs.defaults}{law}")
        return 0
    if not args.target:
        raise ValueError("give a TARGET to sweep (attnflow sweep --list shows the observables)")
    _check_seed(args.seed)
    _check_plot_file(args.plot)
    _check_output_folder(args.store, "--store")
    grid = sweep.parse_grid(args.grid)
    if args.plot:  # refused before the work, not after it
        law = sweep.target_law(args.target)
        if law is None or set(grid) != {law.x}:
            raise ValueError("--plot needs a target with a scaling law, swept over its x parameter alone")
        if len(grid[law.x]) < 3 or args.seeds < 2:
            raise ValueError(f"--plot fits the scaling law: it needs at least 3 values of {law.x} and --seeds 2")
    store = f"{args.store.rstrip('/')}/{args.target.replace('-', '_')}"
    result = sweep.run_sweep(args.target, grid, seeds=args.seeds, master_seed=args.seed, store=store,
                             n_jobs=args.jobs, scheduler=args.scheduler, progress=not args.no_progress)
    fit, passed = None, True
    if result.law is not None and set(grid) == {result.law.x} and len(grid[result.law.x]) >= 3 and args.seeds >= 2:
        fit = sweep.scaling_fit(result)
        passed = fit.contains(result.law.exponent)
    errors = [r for r in result.records if r["result"].get("status") == "ERROR"]
    if errors:  # a claim that crashed at some grid point is not a measurement: say so, and fail the sweep
        passed = False
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
    for line in result.extra.get("quarantined", []):
        print(f"attnflow: a stored record could not be used and was recomputed: {line}", file=sys.stderr)
    if errors:
        first = errors[0]
        where = ", ".join(f"{k}={report.format_number(v)}" for k, v in first["params"])
        print(f"attnflow: error: {len(errors)} of {len(result.records)} runs ended in ERROR; the first, at {where} "
              f"(replicate {first['replicate']}): {first['result'].get('error', 'no message stored')}",
              file=sys.stderr)
    if args.plot:
        x, y = result.values(result.law.y, result.law.x)
        figure = plots.scaling_figure(x, y, fit, result.law, result.target)
        if result.law.kind == "loglog":  # the grid's own values: matplotlib's minor labels overlap within a decade
            from matplotlib.ticker import NullFormatter

            figure.axes[0].set_xticks(x, [f"{value:g}" for value in x])
            figure.axes[0].xaxis.set_minor_formatter(NullFormatter())
        _save(figure, args.plot)
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
        statuses = [res["status"] for res in results if "status" in res]
        if statuses:  # a claim swept: its verdicts, counted
            cells.append("status " + ", ".join(f"{s} {statuses.count(s)}/{len(statuses)}"
                                               for s in dict.fromkeys(statuses)))
        for metric in results[0]:
            values = np.array([res[metric] for res in results if isinstance(res.get(metric), (int, float))], float)
            if values.size == 0:
                continue
            se = f" ± {values.std(ddof=1) / np.sqrt(values.size):.2g}" if values.size > 1 else ""
            cells.append(f"{metric} = {values.mean():.6g}{se}")
        lines.append(f"{label}:  " + ";  ".join(cells))
    return "\n".join(lines)


def parse_params(pairs: list[str]) -> dict[str, str]:
    """``["N=10", "H=1,0;0,2"]`` → ``{"N": "10", "H": "1,0;0,2"}``; the System parses the values."""
    params = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--param takes K=V, got {pair!r}")
        if key in params:
            raise ValueError(f"--param {key} is given twice")
        params[key] = text.strip()
    return params


def parse_system_parameters(system: systems.System, command: str, params: dict) -> tuple[object, dict]:
    """The Problem and each option group's checked values for ``attnflow solve/simulate`` (``command``), from
    ``--param`` texts: everything ``--describe`` lists for the command is accepted, anything else refused."""
    problem_values, options = system.split_parameters(command, params)
    problem = system.problem_from_params(problem_values)
    parse = {"population options": system.population_options_from, "summary options": system.summary_options_from,
             "minibatch options": system.minibatch_options_from}
    return problem, {group: parse[group](values) for group, values in options.items()}


def _trajectory_summary(trajectory) -> dict:
    out = {"records": len(trajectory.times), "final time": float(trajectory.times[-1])}
    for name, values in trajectory.metrics.items():  # the last recorded value (a record may be empty: nan)
        finite = np.asarray(values, float)[np.isfinite(values)]
        out[f"final {name}"] = float(finite[-1]) if finite.size else float("nan")
    for name, value in trajectory.info.items():
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            out[name] = value
    return out


def _print_values(values: dict) -> None:
    for name, value in values.items():
        if isinstance(value, (list, np.ndarray)) and np.ndim(value) == 2:
            rows = "\n".join("    " + "  ".join(f"{v: .6g}" for v in row) for row in np.asarray(value))
            print(f"{name}:\n{rows}")
        elif isinstance(value, (list, np.ndarray)):
            print(f"{name}: " + ", ".join(report.format_number(v) for v in np.ravel(value)))
        else:
            print(f"{name}: {report.format_number(value)}")


def _save(figure, path: str) -> None:
    if not path.strip():
        raise ValueError("--plot needs a file name")
    from . import figure_check

    # rendered in memory, then written and closed here: a failed write (a full device) raises on close, which
    # matplotlib's own file handling does not report
    buffer = io.BytesIO()
    figure_check.save(figure, buffer, dpi=110, format=Path(path).suffix.lstrip(".").lower(), name=path)
    try:
        with open(path, "wb") as handle:
            handle.write(buffer.getvalue())
    except OSError as error:
        raise ValueError(f"--plot: cannot write {path!r} ({error.strerror or error})") from None
    print(f"figure written to {path}", file=sys.stderr)


def _wants_comparison(args, system: systems.System) -> bool:
    """--compare: on when asked, off with --no-compare; by default on with --plot when the system has one."""
    if args.compare is None:
        return bool(args.plot) and system.compare is not None
    if args.compare and system.compare is None:
        raise ValueError(f"system {system.key} declares no population prediction to compare (System.compare)")
    return args.compare


def _run_system_command(args, *, simulate: bool) -> int:
    command = "simulate" if simulate else "solve"
    system = systems.get_system(args.system)
    if args.describe:
        print(system.describe(command))
        return 0
    seed = _check_seed(args.seed)
    _check_plot_file(args.plot)
    params = parse_params(args.param)
    problem, options = parse_system_parameters(system, command, params)
    comparing = simulate and _wants_comparison(args, system)
    values: dict = {}
    comparison = None
    kind = "minibatch" if simulate else "population"
    with LiveBar(wanted(quiet=args.no_progress or args.json), total=1 + comparing, desc=args.command,
                 unit="run") as live:
        live.start(system.key)
        if simulate:
            trajectory = system.minibatch(problem, seed=seed, **options["minibatch options"])
        else:
            if system.summary is not None:
                values.update(system.summary(problem, seed=seed, **options["summary options"]))
            trajectory = system.population(problem, **options["population options"])
        live.advance()
        if comparing:
            from .compare import NoPrediction

            live.start(f"{system.key} prediction")
            try:
                comparison = system.compare(problem, trajectory, seed=seeding.named(seed, "compare"),
                                            **options["minibatch options"])
            except NoPrediction as reason:
                if args.compare:  # asked for by name: not having one is an error, exit 2
                    raise
                print(f"attnflow: note: no prediction drawn: {reason}", file=sys.stderr)
            live.advance()
    values.update({f"{kind}: {k}": v for k, v in _trajectory_summary(trajectory).items()})
    if comparison is not None:
        values.update({f"prediction: final {k}": v for k, v in comparison.final_values().items()})
        if comparison.note:
            values["prediction: note"] = comparison.note
    if args.json:
        document = dict(schema=f"attnflow.{command}/1", attnflow_version=report.version(), system=system.key,
                        seed=args.seed, parameters=params, values=values,
                        trajectory=dict(times=trajectory.times, metrics=trajectory.metrics))
        if comparison is not None:
            document["comparison"] = _comparison_document(comparison)
        print(json.dumps(claims_module.to_jsonable(document), indent=2, ensure_ascii=False))
    else:
        _print_values(values)
    if args.plot:
        from . import plots

        time_label = system.minibatch_time if simulate else system.population_time
        if comparison is not None:
            from .compare import comparison_figure

            figure = comparison_figure(comparison, f"{system.key}: the run beside its prediction", time_label,
                                       labels=system.labels)
        elif simulate:
            figure = plots.trajectory_figure(trajectory, f"{system.key}: minibatch run", time_label,
                                             labels=system.labels)
        else:
            draw = system.population_figure or plots.trajectory_figure
            figure = draw(trajectory, f"{system.key}: population dynamics", time_label, labels=system.labels)
        _save(figure, args.plot)
    return 0


def _comparison_document(comparison) -> dict:
    """The prediction of ``--compare --json``: what it is, the note, and its compared metrics at its times."""
    prediction = comparison.prediction
    shown = [] if prediction is None else [m for m in comparison.metrics if m in prediction.metrics]
    return dict(prediction=comparison.label, note=comparison.note, metrics=list(comparison.metrics),
                times=[] if prediction is None else prediction.times,
                values={m: prediction.metrics[m] for m in shown},
                bands={m: dict(times=t, low=low, high=high) for m, (t, low, high) in comparison.bands.items()},
                levels={m: value for m, (value, _) in comparison.levels.items()})


def _command_solve(args) -> int:
    if args.latex:
        ignored = [option for option, given in (("--param", args.param), ("--plot", args.plot), ("--json", args.json))
                   if given]
        if ignored:  # the derivation is symbolic: a value given beside it would be silently dropped
            raise ValueError(f"--latex prints the symbolic derivation and takes no {ignored[0]}")
        system = systems.get_system(args.system)
        if system.latex is None:
            raise ValueError(f"system {system.key} has no symbolic derivation (--latex)")
        print(system.latex())
        return 0
    return _run_system_command(args, simulate=False)


def _command_simulate(args) -> int:
    return _run_system_command(args, simulate=True)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_sigterm() -> None:
    """SIGTERM (a scheduler's or `kill`'s request) stops the run the way Ctrl-C does: results finished so far are
    kept, workers are stopped, exit code 130."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


def benchmark_scripts() -> dict[str, Path]:
    """The benchmark scripts of the source checkout this package runs from, by name (bench_scb.py → scb)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    return {path.stem.removeprefix("bench_"): path for path in sorted(folder.glob("bench_*.py"))}


def _command_bench(args) -> int:
    """Each benchmark runs in its own process with single-threaded BLAS (the ratios compare one core with one
    core) and prints its table to stderr and its named ratios as JSON; this gathers them."""
    scripts = benchmark_scripts()
    if not scripts:
        raise ValueError("no benchmarks found: they ship with a source checkout (benchmarks/), not with the wheel")
    unknown = [name for name in args.names if name not in scripts]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; available: {', '.join(scripts)}")
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    results, failed = {}, []
    for name in args.names or scripts:
        command = [sys.executable, str(scripts[name]), "--json"]
        if args.repeats is not None:
            command += ["--repeats", str(args.repeats)]
        if not args.json:
            print(f"attnflow bench: {name} …", file=sys.stderr, flush=True)
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=None if not args.json else subprocess.DEVNULL,
                              text=True, env=env)
        try:
            results[name] = json.loads(done.stdout)["ratios"] if done.returncode == 0 else None
        except (json.JSONDecodeError, KeyError, TypeError):
            results[name] = None
        if results[name] is None:
            failed.append(name)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"{'benchmark':14s} {'ratio':52s} {'value':>10s}")
        for name, ratios in results.items():
            for key, value in (ratios or {"(failed: see its output above)": float("nan")}).items():
                print(f"{name:14s} {key:52s} {value:10.3g}")
    if failed:
        print(f"attnflow: error: benchmark(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = _build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # a bare `attnflow` shows what it can do
        parser.print_help()
        return 0
    _stop_on_sigterm()
    try:
        return _run(parser, argv)
    except KeyboardInterrupt:
        print("attnflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (attnflow list | head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(parser, argv) -> int:
    """Parse and run one command. Numerical warnings (an overflow in an intermediate, a mean of an empty slice)
    are collected, not printed as they happen: a command that fails reports its error in one line, and one that
    succeeds lists each distinct warning once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            args = parser.parse_args(argv)
            command = {"list": _command_list, "check": _command_check, "report": _command_report,
                       "solve": _command_solve,
                       "simulate": _command_simulate, "sweep": _command_sweep,
                       "calibrate": _command_calibrate, "bench": _command_bench, "diff": _command_diff}[args.command]
            code = command(args)
        except (ValueError, DivergenceError, StageFailure, BudgetExceeded) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            print(f"attnflow: error: {message}", file=sys.stderr)
            return 2
    for message in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught
                                 if issubclass(w.category, RuntimeWarning)):
        print(f"attnflow: warning: {message}", file=sys.stderr)
    for w in caught:  # anything else is passed on as it would have been
        if not issubclass(w.category, RuntimeWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return code


if __name__ == "__main__":
    sys.exit(main())
