"""The package's shape: one namespace, imports that flow one way, nothing private crossing modules.

These are lint rules run as tests, so CI refuses a short import (``import validation…``) or an upward import as
soon as one is written, in code, tests, notebooks or docs alike."""
import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("closed_forms", "dynamics", "validation")
SHORT_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:closed_forms|dynamics|validation)\b|-m\s+(?:closed_forms|"
                          r"dynamics|validation)\.", re.MULTILINE)


def _tracked(*patterns) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:  # not a git checkout: every file
        return [p for pattern in patterns for p in ROOT.rglob(pattern)]
    return [ROOT / line for line in listed.stdout.splitlines() if (ROOT / line).exists()]


def _text(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n".join("".join(cell["source"]) for cell in cells)
    return path.read_text()


def test_no_short_imports_anywhere():
    offenders = [f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
                 for path in _tracked("*.py", "*.ipynb", "*.md", "*.cfg", "*.toml")
                 for match in SHORT_IMPORT.finditer(_text(path))]
    assert not offenders, "import through the attnflow namespace (attnflow.validation…):\n" + "\n".join(offenders)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names imported from it) for every import in ``path``, relative ones resolved."""
    package = "attnflow." + path.parent.name if path.parent.name in LAYERS else "attnflow"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([module] if module
                                                                                                 else []))
            found.append((module, [alias.name for alias in node.names]))
    return found


@pytest.mark.parametrize("layer, forbidden", [("closed_forms", ("attnflow.dynamics", "attnflow.validation")),
                                              ("dynamics", ("attnflow.validation",))])
def test_imports_flow_one_way(layer, forbidden):
    offenders = [f"{path.name} imports {module}" for path in (ROOT / layer).glob("*.py")
                 for module, _ in _imports(path) if module.startswith(forbidden)]
    assert not offenders, offenders


def test_nothing_private_crosses_modules():
    """``from attnflow.x import _name`` and ``module._name`` of another attnflow module are refused."""
    offenders = []
    for path in [p for folder in (*LAYERS, "attnflow", "benchmarks") for p in (ROOT / folder).glob("*.py")]:
        for module, names in _imports(path):
            if module.startswith("attnflow") or not module:
                offenders += [f"{path.name}: from {module} import {n}" for n in names if n.startswith("_")
                              and n != "__version__"]
        tree = ast.parse(path.read_text())
        aliases = {a.asname or a.name for node in ast.walk(tree) for a in getattr(node, "names", ())
                   if isinstance(node, ast.Import) and a.name.startswith("attnflow")
                   or isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("attnflow"))}
        for node in ast.walk(tree):  # attnflow modules only: os._exit is public API of the standard library
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases):
                offenders.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not offenders, offenders


def test_the_wheel_holds_the_attnflow_namespace_alone():
    from setuptools.config.setupcfg import read_configuration

    options = read_configuration(ROOT / "setup.cfg")["options"]
    assert all(p == "attnflow" or p.startswith("attnflow.") for p in options["packages"])
    assert {options["package_dir"][f"attnflow.{layer}"] for layer in LAYERS} == set(LAYERS)


def test_the_front_door():
    import attnflow

    assert attnflow.__version__ and attnflow.__version__ != "0+unknown"
    assert set(attnflow.__all__) <= set(dir(attnflow))
    from importlib import metadata

    # every system attnflow's own setup.cfg registers is found by the front door
    own = {e.name for e in metadata.entry_points(group="attnflow.systems") if e.value.startswith("attnflow.")}
    assert len(own) == 9 and own <= set(attnflow.system_keys())


CITATION = re.compile(r"docs/(?P<doc>[a-z0-9_]+)\.md,?\s+§(?P<first>\d+(?:\.\d+)*)(?:\s*[–-]\s*(?:§)?(?P<last>\d+(?:\.\d+)*))?")
BARE_CITATION = re.compile(r"(?<!md )(?<!md, )§(?P<first>\d+(?:\.\d+)*)(?:\s*[–-]\s*(?:§)?(?P<last>\d+(?:\.\d+)*))?")
HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
LINKED_CITATION = re.compile(r"\[§(?P<first>\d+(?:\.\d+)*)\]\((?P<doc>[a-z0-9_]+)\.md#[^)]*\)")  # [§k](page.md#…)


def _sections(doc: Path) -> set[str]:
    return set(HEADING.findall(doc.read_text())) if doc.exists() else set()


def test_every_section_cited_exists():
    """``docs/<system>.md §k`` in code, tests, notebooks and docs (and a bare ``§k`` inside docs/<system>.md) names
    a numbered heading of that page: the derivations live in the repository, and a citation cannot dangle."""
    dangling = []
    for path in _tracked("*.py", "*.ipynb", "*.md"):
        text = _text(path)
        cited = [(m.group("doc"), m.group("first"), m.group("last")) for m in CITATION.finditer(text)]
        if path.parent.name == "docs" and path.suffix == ".md":
            cited += [(m.group("doc"), m.group("first"), None) for m in LINKED_CITATION.finditer(text)]
            text = LINKED_CITATION.sub("", text)  # a link to another page cites that page, not this one
            cited += [(path.stem, m.group("first"), m.group("last")) for m in BARE_CITATION.finditer(text)]
        for doc, *numbers in cited:
            sections = _sections(ROOT / "docs" / f"{doc}.md")
            dangling += [f"{path.relative_to(ROOT)}: docs/{doc}.md §{number}" for number in numbers
                         if number and number not in sections]
    assert not dangling, "cited sections with no heading:\n" + "\n".join(sorted(set(dangling)))


def test_no_citation_outside_the_repository():
    offenders = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in _tracked("*.py", "*.ipynb", "*.md")
                 for m in re.finditer(r"\bspec[ ]§\S+|\.\./shared\S*", _text(path))]
    assert not offenders, "\n".join(offenders)
