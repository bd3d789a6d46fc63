"""Cold start: the quick suite's CPU time with an empty numba cache, how much of it is numba compiling, and which
kernels cost it (not a test).

``attnflow check`` (the quick settings, seed 0) runs twice in fresh processes that share a new, empty numba cache
directory: first cold (every kernel compiles and is written to the cache), then warm (every kernel loads). The cold
process records numba's compile events: a kernel's compile time is the time of its top-level event, callees
included, and a kernel compiled for more than one signature (a read-only or differently ordered array is another
signature, DESIGN.md "Writing kernels that compile quickly") is listed with its signatures. CPU time is process time
of the child, after its imports, with single-threaded BLAS.

``--repeats`` is accepted, as by every benchmark, and ignored: one cold start is one run of the suite.

Ratios (``--json``), lower is better: ``compile_over_target`` = compile CPU / 20 s and
``cold_suite_over_target`` = cold CPU / 100 s (the targets of the cold-start work; 1 meets them),
``cold_over_warm`` = cold CPU / warm CPU (what an empty cache costs), and ``kernels_compiled_twice`` (a count:
attnflow kernels compiled for more than one signature).

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cold_start.py [--json] [--top 15] [NAMES ...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from _common import emit, parser

COMPILE_TARGET = 20.0
COLD_SUITE_TARGET = 100.0


def _child(names: list[str], out_path: str) -> None:
    """Run the check in this process and write the CPU time and the compile events to ``out_path``."""
    import contextlib
    import io
    import time

    from numba.core import event

    from attnflow.validation import cli

    compiles = []

    class Recorder(event.Listener):
        def __init__(self):
            self.stack = []

        def on_start(self, ev):
            self.stack.append((ev.data["dispatcher"], str(ev.data.get("args")), time.process_time()))

        def on_end(self, ev):
            dispatcher, args, start = self.stack.pop()
            if not self.stack:  # top level: callees are inside their caller's time
                function = getattr(dispatcher, "py_func", dispatcher)
                name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', str(function))}"
                compiles.append((name, args, time.process_time() - start))

    event.register("numba:compile", Recorder())
    start = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(["check", "--jobs", "1", "--no-store", "--no-progress", *names])
    total = time.process_time() - start
    with open(out_path, "w") as out:
        json.dump(dict(status=status, total=total, compiles=compiles), out)


def _short(signature: str) -> str:
    """numba's argument types, abbreviated: Array(float64, 2, 'C', True, aligned=True) -> float64[2C, read-only]."""
    return re.sub(r"Array\((\w+), (\d), '(\w)', (True|False), aligned=True\)",
                  lambda m: f"{m[1]}[{m[2]}{m[3]}{', read-only' if m[4] == 'True' else ''}]", signature)


def run_check(names: list[str], cache: str) -> dict:
    """One ``attnflow check`` in a fresh process using the numba cache directory ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out_path = handle.name
    try:
        subprocess.run([sys.executable, __file__, "--child", out_path, *names], env=env, check=True)
        with open(out_path) as result:
            return json.load(result)
    finally:
        os.unlink(out_path)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("names", nargs="*", help="systems or claims to check (default: all, as `attnflow check`)")
    p.add_argument("--top", type=int, default=15, help="how many of the costliest kernels to list")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.names, args.child)
        return
    with tempfile.TemporaryDirectory(prefix="attnflow-cold-") as cache:
        cold = run_check(args.names, cache)
        warm = run_check(args.names, cache)
    compile_total = sum(seconds for _, _, seconds in cold["compiles"])
    by_kernel: dict[str, list] = {}
    for name, signature, seconds in cold["compiles"]:
        by_kernel.setdefault(name, []).append((signature, seconds))
    costliest = sorted(by_kernel.items(), key=lambda item: -sum(s for _, s in item[1]))[:args.top]
    twice = {name: entries for name, entries in by_kernel.items() if len(entries) > 1 and name.startswith("attnflow")}
    rows = [["cold suite (empty cache)", cold["total"], ""], ["  of which numba compiling", compile_total,
                                                              f"{len(cold['compiles'])} top-level compiles"],
            ["warm suite (cache loaded)", warm["total"], ""]]
    rows += [[f"  {name}", sum(s for _, s in entries), f"{len(entries)} signature(s)"] for name, entries in costliest]
    rows += [[f"  compiled twice: {name}", sum(s for _, s in entries), " | ".join(_short(sig) for sig, _ in entries)]
             for name, entries in twice.items()]
    ratios = dict(compile_over_target=compile_total / COMPILE_TARGET,
                  cold_suite_over_target=cold["total"] / COLD_SUITE_TARGET,
                  cold_over_warm=cold["total"] / warm["total"], kernels_compiled_twice=float(len(twice)))
    emit(f"cold start of `attnflow check` (targets: compile <= {COMPILE_TARGET:g} s, cold suite <= "
         f"{COLD_SUITE_TARGET:g} s CPU)", ["", "CPU s", "note"], rows, ratios, args.json)
    if cold["status"] != 0 or warm["status"] != 0:
        raise SystemExit(f"attnflow check exited with {cold['status']} (cold) and {warm['status']} (warm)")


if __name__ == "__main__":
    main()
