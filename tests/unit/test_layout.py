"""The library's import graph holds no development harness: no module of deltaferry imports
deltaferry_dev (at the top or inside a function; the command line reaches it through entry
points), importing the library's modules loads none of it, and the wheel does not carry it.
The spark-submit entry points sit at the top of the checkout (spark_jobs/) and the wheel carries
them inside the package."""

import ast
import importlib
import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import deltaferry
from deltaferry import steps

PACKAGE = Path(deltaferry.__file__).parent
HARNESS = "deltaferry_dev"
JOBS = PACKAGE.parent / "spark_jobs"


def library_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(PACKAGE)], "deltaferry."))


def imported_modules(module: str) -> set[str]:
    """Every module `module` imports, wherever the import statement is (ast.walk: inside
    functions and branches too)."""
    source = Path(importlib.util.find_spec(module).origin).read_text()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def is_harness(module: str) -> bool:
    return module == HARNESS or module.startswith(f"{HARNESS}.")


def test_no_library_module_imports_the_harness():
    offenders = {m: sorted(i for i in imported_modules(m) if is_harness(i))
                 for m in library_modules()}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_the_import_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    (tmp_path / "late.py").write_text("def f():\n    if True:\n"
                                      "        from deltaferry_dev.stack import up\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "deltaferry_dev.stack.up" in imported_modules("late")


def test_importing_the_library_loads_no_harness_module():
    code = ("import importlib, sys\n"
            f"for name in {library_modules()!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == {HARNESS!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_the_wheel_carries_the_library_and_not_the_harness(tmp_path):
    """Builds the wheel as `pip install .` would (setuptools' build backend, the project's
    pyproject.toml) from a copy of the library, its entry points and the harness beside them,
    as in the checkout: every Python file of deltaferry/ is in it, spark_jobs/ as
    deltaferry/spark_jobs/ (a subpackage pyproject.toml does not list would be missing)."""
    root = PACKAGE.parent
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copy(root / "pyproject.toml", tmp_path)
    for folder in ("deltaferry", "spark_jobs", "dev"):
        shutil.copytree(root / folder, tmp_path / folder, ignore=ignore)
    built = subprocess.run(
        [sys.executable, "-c", "from setuptools import build_meta; "
         "print(build_meta.build_wheel('dist'))"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    wheel = tmp_path / "dist" / built.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    library = {f"deltaferry/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py")
               if "__pycache__" not in p.parts}
    jobs = {f"deltaferry/spark_jobs/{p.name}" for p in JOBS.glob("*.py")}
    assert "deltaferry/cli.py" in library and "deltaferry/spark_jobs/ingest.py" in jobs
    assert sorted((library | jobs) - set(names)) == []
    assert [n for n in names if n.startswith("spark_jobs/")] == []
    assert [n for n in names if HARNESS in n or n.startswith(("deltaferry/dev/", "dev/"))] == []


def test_the_spark_submit_entry_points_sit_at_the_top_of_the_checkout():
    """One thin script per spark-submit step in the top-level spark_jobs/ (none left inside
    the package's folder), and every step's script, the one the operator submits, is there."""
    assert sorted(p.name for p in JOBS.glob("*.py")) == [
        "__init__.py", "infer_schema.py", "ingest.py", "maintain.py", "optimize.py",
        "replay.py", "vacuum.py"]
    assert not (PACKAGE / "spark_jobs" / "__init__.py").exists()
    assert {name: steps.job(name).script for name in steps.JOBS} == {
        "infer": JOBS / "infer_schema.py", "ingest": JOBS / "ingest.py",
        "optimize": JOBS / "optimize.py", "vacuum": JOBS / "vacuum.py",
        "maintain": JOBS / "maintain.py", "replay": JOBS / "replay.py"}


def test_an_installed_package_takes_its_own_entry_points_and_a_checkout_the_top_level_ones(
        tmp_path):
    """The wheel's layout (site-packages/deltaferry/spark_jobs/__init__.py) wins; a checkout's
    leftover deltaferry/spark_jobs/ holding only caches (what git leaves of the old layout)
    does not hide the top-level folder."""
    installed = tmp_path / "site-packages" / "deltaferry"
    (installed / "spark_jobs").mkdir(parents=True)
    (installed / "spark_jobs" / "__init__.py").write_text("")
    assert steps.jobs_dir(installed) == installed / "spark_jobs"
    checkout = tmp_path / "checkout" / "deltaferry"
    (checkout / "spark_jobs" / "__pycache__").mkdir(parents=True)
    assert steps.jobs_dir(checkout) == tmp_path / "checkout" / "spark_jobs"


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


def test_every_import_of_the_library_resolves_even_inside_functions():
    """An import inside a function is only tried when the function runs (and mypy, told to
    ignore missing imports, does not see a moved module): every `from deltaferry... import x`
    anywhere in the library names a module and a name that exist."""
    missing = []
    for module in library_modules():
        source = Path(importlib.util.find_spec(module).origin).read_text()
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "deltaferry"):
                continue
            target = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(target, alias.name) and importlib.util.find_spec(
                        f"{node.module}.{alias.name}") is None:
                    missing.append(f"{module}:{node.lineno} {node.module}.{alias.name}")
    assert missing == []
