"""One home per concept, checked on the library's source: reports are defined in
deltaferry.reports, a topic's format is told apart only by deltaferry.formats (and the
configuration that declares it). (The quarantine's one reader is checked in test_quarantine.py:
the CLI and the page render the same read.)"""

import ast
from pathlib import Path

import deltaferry

PACKAGE = Path(deltaferry.__file__).parent


def modules() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text())
            for path in sorted(PACKAGE.rglob("*.py"))}


def outside(*homes: str) -> dict[str, ast.Module]:
    return {name: tree for name, tree in modules().items() if not name.startswith(homes)}


def test_every_report_class_is_defined_in_the_reports_module():
    reports = ast.parse((PACKAGE / "reports.py").read_text())
    kinds = {node.name for node in ast.walk(reports) if isinstance(node, ast.ClassDef)}
    assert {"InferReport", "IngestReport", "MaintainReport", "Skip"} <= kinds
    elsewhere = sorted(f"{name}: {node.name}" for name, tree in outside("deltaferry/reports.py").items()
                       for node in ast.walk(tree)
                       if isinstance(node, ast.ClassDef)
                       and (node.name.endswith("Report") or node.name in kinds
                            or any(getattr(b, "id", getattr(b, "attr", None)) == "Report"
                                   for b in node.bases)))
    assert elsewhere == []


def format_tests(tree: ast.Module) -> list[int]:
    """Lines comparing something's `.format` with a value, or naming a Format member."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare)
                and any(isinstance(side, ast.Attribute) and side.attr == "format"
                        for side in (node.left, *node.comparators))):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "Format"):
            lines.append(node.lineno)
    return lines


def test_only_the_formats_package_tells_formats_apart():
    found = {name: format_tests(tree) for name, tree in
             outside("deltaferry/formats/", "deltaferry/config/").items()}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_format_check_sees_a_comparison_and_a_member():
    tree = ast.parse("if topic.format == 'avro': pass\nx = Format.JSON\n")
    assert format_tests(tree) == [1, 2]

