"""A fingerprint of the code that computes a claim or an observable, so stored results notice an edited kernel.

The fingerprint of a module is the SHA-256 of its source and of the source of every module it imports, followed
transitively within the packages that matter: ``attnflow`` and the module's own top-level package (a plugin's).
The import graph is read from the source (``ast``), not from ``sys.modules``, so the fingerprint is the same
whatever else the process happened to import. numpy or numba upgrades are outside it: the attnflow version in
the record covers releases, and the fingerprint covers edits in an editable install.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util

__all__ = ["module_fingerprint"]


def _source_path(name: str) -> str | None:
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a name that is an attribute, not a module (``from x import function``)
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    return found.origin


def _imports(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Absolute names of the modules (and candidate submodules) a module's source imports."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # ``from pkg import submodule``
    return found


@functools.lru_cache(maxsize=None)
def module_fingerprint(name: str) -> str:
    """16 hex digits identifying the source of module ``name`` and of what it imports within its packages."""
    roots = {"attnflow", name.partition(".")[0]}
    sources = {}
    seen, pending = set(), [name]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        path = _source_path(current)
        if path is None:
            continue
        with open(path, "rb") as handle:
            source = handle.read()
        sources[current] = hashlib.sha256(source).hexdigest()
        tree = ast.parse(source, filename=path)
        for imported in sorted(_imports(tree, current, path.endswith("__init__.py"))):
            # the bare ``attnflow`` front door only re-exports; what it names is followed where it is used
            if imported.partition(".")[0] in roots and imported != "attnflow" and imported not in seen:
                pending.append(imported)
    if name not in sources:
        raise ValueError(f"no Python source found for module {name!r}")
    listing = "\n".join(f"{module} {digest}" for module, digest in sorted(sources.items()))
    return hashlib.sha256(listing.encode()).hexdigest()[:16]
