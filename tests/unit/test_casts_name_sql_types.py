"""Every cast in deltaferry's Spark code names its type in SQL (`deltaferry.spark.table.sql_type`),
never as a pyspark `DataType`: over Spark Connect a `DataType` reaches the server with every
string collated (``string collate UTF8_BINARY``), Delta writes that type for a column or field a
batch adds, and delta-rs then refuses the whole table. Only the Connect suite's read-backs
would see it; this check finds the cast where it is written.

A cast's type is accepted when it is plain SQL text: a string or f-string, a `sql_type(...)`
call, an argument-less ``StructType()`` (an empty struct holds no string), a module constant
that is a string, or a name the enclosing function binds to one of those (an assignment, or
the target of a loop over a constant of strings)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The code that builds Spark columns: the library, the spark-submit entry points, the DAG and
#: plugin files.
FOLDERS = ("deltaferry", "spark_jobs", "dags", "plugins")


def module_of(path: Path):
    """The imported module of a file of the deltaferry package, else None."""
    relative = path.relative_to(ROOT).with_suffix("")
    if relative.parts[0] != "deltaferry":
        return None
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return importlib.import_module(".".join(parts))


def all_strings(value) -> bool:
    """Whether `value` is a string, or made of strings only (nested tuples and lists)."""
    if isinstance(value, str):
        return True
    return isinstance(value, tuple | list) and bool(value) and all(map(all_strings, value))


class Casts(ast.NodeVisitor):
    """The casts of one file whose type is not plain SQL text: (line, source)."""

    def __init__(self, source: str, module) -> None:
        self.source, self.module = source, module
        self.scopes: list[ast.AST] = []
        self.casts = 0  # every cast read, SQL text or not
        self.found: list[tuple[int, str]] = []

    def visit_FunctionDef(self, node) -> None:  # noqa: N802 - ast's visitor names
        self.scopes.append(node)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("cast", "try_cast"):
            self.casts += 1
            if node.args and not self.sql_text(node.args[0]):
                self.found.append((node.lineno,
                                   ast.get_source_segment(self.source, node) or ""))
        self.generic_visit(node)

    def sql_text(self, node: ast.AST, depth: int = 0) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        if isinstance(node, ast.JoinedStr):
            return True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            return name == "sql_type" or (name == "StructType" and not node.args
                                          and not node.keywords)
        if isinstance(node, ast.Name) and depth < 3:
            return self.constant(node.id) or self.bound_to_sql(node.id, depth)
        return False

    def constant(self, name: str) -> bool:
        return self.module is not None and all_strings(getattr(self.module, name, None))

    def bound_to_sql(self, name: str, depth: int) -> bool:
        """Whether the enclosing function binds `name` only to SQL text."""
        if not self.scopes:
            return False
        values, loops = [], []
        for node in ast.walk(self.scopes[-1]):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                values.append(node.value)
            elif isinstance(node, ast.For | ast.comprehension) and any(
                    isinstance(t, ast.Name) and t.id == name for t in ast.walk(node.target)):
                loops.append(node.iter)
        if not values and not loops:
            return False
        return (all(self.sql_text(v, depth + 1) for v in values)
                and all(isinstance(i, ast.Name) and self.constant(i.id) for i in loops))


def casts_in(source: str, module=None) -> Casts:
    """The casts of `source` (a file's text; `module`, its imported module for its constants)."""
    visitor = Casts(source, module)
    visitor.visit(ast.parse(source))
    return visitor


def test_every_cast_names_its_type_in_sql():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 50, files  # the check reads the code it is meant to
    found, casts = [], 0
    for path in files:
        visitor = casts_in(path.read_text(), module_of(path))
        casts += visitor.casts
        found += [f"{path.relative_to(ROOT)}:{line}: {text}" for line, text in visitor.found]
    assert casts > 30  # the code casts; a rename of the method would make this check empty
    assert not found, "cast to a pyspark DataType (use deltaferry.spark.table.sql_type):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("code", [
    "def f(c, field):\n    return c.cast(field.dataType)",
    "def f(c):\n    return c.try_cast(StringType())",
    "def f(c, t):\n    wide = parse(t)\n    return c.cast(wide)",
    "def f(c, fields):\n    return [c.cast(t) for n, t in fields]",
])
def test_a_cast_to_a_datatype_is_found(code):
    assert len(casts_in(code).found) == 1, code


@pytest.mark.parametrize("code", [
    "def f(c):\n    return c.cast('string')",
    "def f(c, t):\n    return c.cast(sql_type(t))",
    "def f(c, t):\n    to = sql_type(t)\n    return c.cast(to)",
    "def f(c):\n    return c.cast(StructType())",
    "def f(c, s):\n    return c.try_cast(f'decimal(38,{s})')",
])
def test_a_cast_to_sql_text_is_accepted(code):
    assert casts_in(code).found == [], code
