"""The package's architecture as a contract (docs/DESIGN.md, "Layers"), and DESIGN.md naming every module.

import-linter checks the layers (each imports only the ones below it) and that no modules or packages
import each other in a circle; its contracts live in pyproject.toml. What it cannot express is checked
here on the syntax tree: no module takes another's private names, and an import inside a function says
why it is there (it keeps ``import superbpe`` or a command cheap, or loads an optional extra).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "superbpe"
#: The Rust extension's import name: private by Python's convention, public as the crate's face.
EXTENSION = "_native"


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def private_names_taken(source: str) -> list[str]:
    """``superbpe`` names starting with ``_`` that ``source`` imports or reads off an imported module."""
    tree = ast.parse(source)
    modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("superbpe"):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name.startswith("superbpe"))
    for node in ast.walk(tree):
        if _reads_private(node, modules):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def _reads_private(node: ast.AST, modules: set[str]) -> bool:
    """``module._name`` where ``module`` is an imported ``superbpe`` module."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and _private(node.attr)
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != EXTENSION


def unexplained_local_imports(source: str) -> list[int]:
    """Lines of imports inside functions with no comment on that line or the one above."""
    lines = source.splitlines()
    found = []
    for function in _functions(ast.parse(source)):
        for node in ast.walk(function):
            if isinstance(node, ast.Import | ast.ImportFrom):
                here = lines[node.lineno - 1]
                above = lines[node.lineno - 2] if node.lineno > 1 else ""
                if "#" not in here and not above.strip().startswith("#"):
                    found.append(node.lineno)
    return found


def _functions(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_import_linter_contracts_are_kept() -> None:
    # In a process of its own: import-linter configures logging, which would silence this package's logger.
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def offenders(check: Callable[[str], list[Any]]) -> dict[str, list[Any]]:
    """What ``check`` finds in each module of the package, by path (clean modules left out)."""
    found = {str(path.relative_to(ROOT)): check(path.read_text(encoding="utf-8")) for path in package_files()}
    return {path: items for path, items in found.items() if items}


def test_no_module_takes_private_names_of_another() -> None:
    assert offenders(private_names_taken) == {}


def test_imports_inside_functions_give_their_reason() -> None:
    assert offenders(unexplained_local_imports) == {}


def test_the_checks_see_what_they_forbid() -> None:
    taken = private_names_taken(
        "from superbpe.jobs.encode import _workers, encode_corpus\n"
        "from superbpe.engines import native\n"
        "from superbpe import _native\n"
        "native._require_native()\n"
        "native.__name__\n"
    )
    assert taken == ["superbpe.jobs.encode._workers", "native._require_native"]
    local = "def f():\n    import json\n\n    # optional\n    import ray\n    import numpy  # cheap\n"
    assert unexplained_local_imports(local) == [2]


def test_design_names_every_module() -> None:
    """docs/DESIGN.md is the contract between the modules, so a module it does not name is a gap in it."""
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    python = [str(p.relative_to(PACKAGE)) for p in package_files() if p.name != "__init__.py"]
    crate = ROOT / "native" / "src"
    rust = [str(p.relative_to(crate)) for p in sorted(crate.rglob("*.rs"))]
    assert [name for name in python + rust if f"`{name}`" not in design] == []
