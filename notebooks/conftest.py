"""The notebooks are stored with the outputs of a run, so that a code host shows their figures and numbers, and
nbmake (``pytest --nbmake``) runs each of them afresh. After that run, what the notebook prints is compared with
what it stores: every code cell's text (printed lines and displayed values, stderr aside) must say the same, each
number within one unit of its last printed digit (tests/printed_numbers.py), and every stored figure must be drawn
again (its pixels are not compared: they depend on matplotlib's version). A notebook whose numbers change is stored
again with its new outputs, so the stored ones never describe code that no longer runs that way."""
import importlib.util
from pathlib import Path

import nbformat
import pytest

# the deep tier's notebook needs the optional attnflow[deep] (JAX, optax): left out where it is not installed, as
# tests/test_deep.py skips
collect_ignore = [] if all(importlib.util.find_spec(name) for name in ("jax", "optax")) else ["deep.ipynb"]

_spec = importlib.util.spec_from_file_location("printed_numbers",
                                               Path(__file__).resolve().parents[1] / "tests" / "printed_numbers.py")
_printed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_printed)


def _shown(cell) -> list[tuple[str, str]]:
    """(kind, text) of what a code cell shows: stdout, and the plain text of displayed values and figures."""
    shown = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream" and output["name"] == "stdout":
            shown.append(("stdout", output["text"]))
        elif output["output_type"] in ("execute_result", "display_data"):
            data = output.get("data", {})
            kind = "figure" if "image/png" in data else "value"
            shown.append((kind, data.get("text/plain", "")))
    return shown


def _merged(shown):
    """Consecutive stdout chunks as one (how a kernel splits printed text is not part of what it says)."""
    merged = []
    for kind, text in shown:
        if merged and kind == "stdout" and merged[-1][0] == "stdout":
            merged[-1] = ("stdout", merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


def differences(stored, fresh) -> list[str]:
    """Where a fresh run of a notebook shows something else than the stored notebook: one line per cell."""
    stored_cells = [c for c in stored.cells if c.cell_type == "code"]
    fresh_cells = [c for c in fresh.cells if c.cell_type == "code"]
    found = []
    for number, (old, new) in enumerate(zip(stored_cells, fresh_cells), start=1):
        before, after = _merged(_shown(old)), _merged(_shown(new))
        if after and not before:
            found.append(f"code cell {number} stores no output: store the notebook with its outputs")
        elif [k for k, _ in before] != [k for k, _ in after] or not all(
                _printed.same_printed_numbers(a, b) for (_, a), (_, b) in zip(before, after)):
            found.append(f"code cell {number} stored {before!r}\n  but a fresh run shows {after!r}")
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Keep the notebook nbmake executes, and after a run without error compare it with the stored one."""
    if not getattr(item, "nbmake", False):
        return (yield)
    from nbmake import nb_run
    from nbmake.nb_result import NotebookError, NotebookResult
    from nbmake.pytest_items import NotebookFailedException

    executed = []
    original = nb_run.NotebookRun.execute

    def execute(run):
        result = original(run)
        executed.append(result.nb)
        return result

    nb_run.NotebookRun.execute = execute
    try:
        outcome = yield
    finally:
        nb_run.NotebookRun.execute = original
    stored = nbformat.read(str(item.fspath), as_version=4)
    found = differences(stored, executed[0])
    if found:
        summary = f"{Path(str(item.fspath)).name}: the stored outputs differ from a fresh run's"
        raise NotebookFailedException(NotebookResult(nb=executed[0], error=NotebookError(
            summary=summary, trace=summary + ":\n" + "\n".join(found), failing_cell_index=0)))
    return outcome
