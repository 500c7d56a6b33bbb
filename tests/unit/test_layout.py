"""The library's import graph holds no development harness: no module of deltaferry outside
deltaferry/dev imports it, except the command line's `stack` and `airflow` commands (the doors
into the harness), and importing the library's modules loads none of it."""

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import deltaferry

PACKAGE = Path(deltaferry.__file__).parent
#: The command line dispatches `deltaferry stack` and `deltaferry airflow` to the harness.
DOORS = {"deltaferry.cli"}


def library_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages([str(PACKAGE)], "deltaferry.")]
    return sorted(n for n in names if not n.startswith("deltaferry.dev"))


def imported_modules(module: str) -> set[str]:
    source = Path(importlib.util.find_spec(module).origin).read_text()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_library_module_imports_the_harness():
    offenders = {m: sorted(i for i in imported_modules(m) if i.startswith("deltaferry.dev"))
                 for m in library_modules() if m not in DOORS}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_importing_the_library_loads_no_harness_module():
    code = ("import importlib, sys\n"
            f"for name in {library_modules()!r}:\n"
            "    if name.startswith(('deltaferry.spark_jobs',)): continue\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('deltaferry.dev')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_no_import_cycle_among_the_packages_modules():
    """Imports between deltaferry's modules form no cycle, whether at the top level or inside
    functions (an import deferred into a function is still a dependency: spark/class_archive
    and spark/session imported each other that way)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):  # top level and inside functions
            if isinstance(node, ast.ImportFrom) and node.module:
                deps |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = deps
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for dep in graph[start]:
            if dep == target or (dep not in seen and not seen.add(dep)
                                 and reaches(dep, target, seen)):
                return True
        return False

    assert [m for m in graph if reaches(m, m, set())] == []
