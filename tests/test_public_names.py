"""Every module's ``__all__`` names what it defines in public, and every name the docs import from attnflow is
there: a function a page recommends (``fit_exponent``) cannot be missing from its module's public surface."""
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import attnflow.closed_forms
import attnflow.dynamics
import attnflow.validation

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"attnflow.dynamics.deep": "jax"}  # modules of an optional extra


def _modules():
    for package in (attnflow.closed_forms, attnflow.dynamics, attnflow.validation):
        for found in pkgutil.iter_modules(package.__path__):
            yield f"{package.__name__}.{found.name}"


def _import(name):
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    return importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_all_lists_every_public_definition(name):
    module = _import(name)
    if not hasattr(module, "__all__"):  # a system's claims, the command line: registered, not imported by name
        return
    defined = [n for n, obj in vars(module).items() if not n.startswith("_")
               and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == name]
    assert not [n for n in defined if n not in module.__all__]
    assert not [n for n in module.__all__ if not hasattr(module, n)]


DOC_IMPORT = re.compile(r"from (attnflow(?:\.[a-z_]+)*) import ([A-Za-z_][A-Za-z0-9_, ]*)")


def test_every_name_the_docs_import_is_public():
    pages = [ROOT / "README.md", ROOT / "DESIGN.md", *sorted((ROOT / "docs").glob("*.md"))]
    imported = {(module, name.strip()) for page in pages for module, names in DOC_IMPORT.findall(page.read_text())
                for name in names.split(",") if name.strip() and name.strip() != "as"}
    assert len(imported) > 10  # the pages' examples import from attnflow
    missing = []
    for module_name, name in sorted(imported):
        module = _import(module_name) if module_name not in OPTIONAL else None
        if module is None:
            continue
        if hasattr(module, "__all__") and name not in module.__all__ and not inspect.ismodule(getattr(module, name, None)):
            missing.append(f"{module_name}.{name}")
    assert not missing
