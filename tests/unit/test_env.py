"""The environment variables are declared once (deltaferry/env.py) and read through their
declarations: no module of the library spells a variable's name itself."""

import ast
import re
from pathlib import Path

import pytest

import deltaferry
from deltaferry import env as envvars

PACKAGE = Path(deltaferry.__file__).parent
#: Markers a warm driver prints, not variables.
NOT_VARIABLES: set[str] = set()
#: delta-rs storage options, named like the AWS variables but not read from the environment.
OWN_KEYS = {"lake.py"}


def library_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py")
            if p.relative_to(PACKAGE).parts[0] not in ("dev", "env.py", *OWN_KEYS)]


def string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_no_library_module_spells_a_variables_name():
    declared = {v.name for v in envvars.VARIABLES}
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} {text}"
                 for path in library_files() for line, text in string_literals(path)
                 if text in declared
                 or re.fullmatch(r"DELTAFERRY_[A-Z_]+", text) and text not in NOT_VARIABLES]
    assert offenders == []


def test_every_variable_is_declared_once_with_a_doc():
    names = [v.name for v in envvars.VARIABLES]
    assert len(names) == len(set(names))
    assert all(v.doc and v.type for v in envvars.VARIABLES)


def test_the_secret_variables_are_marked():
    assert set(envvars.SECRET_NAMES) >= {"AWS_SECRET_ACCESS_KEY", "DELTAFERRY_KAFKA_OPTIONS",
                                         "DELTAFERRY_SCHEMA_REGISTRY_PASSWORD"}


def test_a_variable_reads_the_mapping_it_is_given_else_its_default(monkeypatch):
    monkeypatch.setenv("DELTAFERRY_POOL", "from-os")
    assert envvars.POOL.value() == "from-os"
    assert envvars.POOL.value({"DELTAFERRY_POOL": " mine "}) == "mine"
    assert envvars.POOL.value({"DELTAFERRY_POOL": ""}) == "deltaferry"
    assert envvars.POOL.raw({}) is None and not envvars.POOL.is_set({})


def test_no_default_assumes_a_source_checkout(tmp_path, monkeypatch):
    from deltaferry import jvm
    from deltaferry.config import topics_path, warehouse_from_env

    for variable in (envvars.TOPICS, envvars.WAREHOUSE, envvars.DEPS):
        monkeypatch.delenv(variable.name, raising=False)
    monkeypatch.chdir(tmp_path)
    # a package installed without a checkout beside it: the current directory's .deps
    monkeypatch.setattr(jvm, "checkout_deps", lambda: tmp_path / "no-checkout" / ".deps")
    assert jvm.deps_dir() == tmp_path.resolve() / ".deps"
    assert warehouse_from_env() == str(tmp_path / "warehouse")
    assert topics_path() == str(tmp_path / "topics.yaml")
    # a relative folder is the current directory's (Delta would take it for a table's name)
    assert warehouse_from_env({"DELTAFERRY_WAREHOUSE": "lake/"}) == str(tmp_path / "lake")
    assert warehouse_from_env({"DELTAFERRY_WAREHOUSE": "s3://b/wh/"}) == "s3://b/wh"
    assert not hasattr(__import__("deltaferry.jvm").jvm, "REPO_ROOT")


def test_the_jars_are_found_from_any_folder_and_handed_down_resolved(tmp_path, monkeypatch):
    """A process started in another folder (a warm pool in its runtime folder, a task in
    Airflow's) finds the jars `make setup` resolved in the checkout, without DELTAFERRY_DEPS,
    and hands the absolute folder to its children."""
    from deltaferry import jvm
    from deltaferry.airflow.connections import KafkaAccess
    from deltaferry.airflow.operators import child_environment
    from deltaferry.spark import warm

    checkout = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("DELTAFERRY_DEPS", raising=False)
    monkeypatch.chdir(tmp_path)  # no .deps here
    assert jvm.checkout_deps() == checkout / ".deps"
    deps = (checkout / ".deps").resolve()  # a worktree's link to another checkout's: that
    assert jvm.deps_dir() == deps
    assert jvm.jars_in("spark")[0].parent == deps / "jars" / "spark"
    handed = {"DELTAFERRY_DEPS": str(deps)}
    assert warm.driver_env({"PATH": "/bin"}).items() >= handed.items()
    kafka = KafkaAccess(bootstrap="k:9092", options={}, source="test")
    assert child_environment({}, kafka, "local[1]").items() >= handed.items()
    # a relative DELTAFERRY_DEPS is this process's folder, handed down absolute
    (tmp_path / "mine").mkdir()
    assert warm.driver_env({"DELTAFERRY_DEPS": "mine"})["DELTAFERRY_DEPS"] == str(
        tmp_path / "mine")


def test_no_jars_anywhere_is_one_clear_error(tmp_path, monkeypatch):
    from deltaferry import jvm
    from deltaferry.errors import SetupError

    monkeypatch.delenv("DELTAFERRY_DEPS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jvm, "checkout_deps", lambda: tmp_path / "pkg" / ".deps")
    with pytest.raises(SetupError) as caught:
        jvm.jars_in("spark")
    message = str(caught.value)
    assert str(tmp_path / ".deps" / "jars" / "spark") in message
    assert str(tmp_path / "pkg" / ".deps") in message
    assert "make setup" in message and "DELTAFERRY_DEPS" in message
    monkeypatch.setenv("DELTAFERRY_DEPS", str(tmp_path / "set"))
    with pytest.raises(SetupError, match=r"set/jars/spark \(DELTAFERRY_DEPS\)"):
        jvm.jars_in("spark")
