"""mkdocs hook: the configuration reference, generated from the declarations.

In a page, the line ``<!-- deltaferry:topic-options -->`` becomes the table of the topics file's
options (deltaferry.config.topics) and ``<!-- deltaferry:environment -->`` the table of the
environment variables (deltaferry.env), so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from pydantic_core import PydanticUndefined

from deltaferry import env as envvars
from deltaferry.config.topics import NESTED, FileOptions, TopicConfig

TOPIC_OPTIONS = "<!-- deltaferry:topic-options -->"
ENVIRONMENT = "<!-- deltaferry:environment -->"
_TYPE_NAMES = {str: "text", int: "integer", float: "number", bool: "boolean",
               type(None): "null"}


def _type_name(annotation: Any, shown: str | None = None) -> str:
    """A field's type as the reference says it (``integer or null``)."""
    if shown:
        return shown
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if dataclasses.is_dataclass(annotation):
        return "mapping"
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(info: Any) -> str:
    if info.default is PydanticUndefined:
        return "required" if info.default_factory is None else ""
    value = info.default
    if value is None or value == ():
        return "`null`" if value is None else "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`" if not isinstance(value, str) else f'`"{value}"`'


def _cell(text: str) -> str:
    """`text` safe in a table cell: no column break, no HTML tag (``<topic>`` stays text)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|") \
        .replace("\n", " ")


def option_rows() -> list[tuple[str, str, str, str]]:
    """(name, type, default, doc) of every topic option (a format's as section.key) and of
    ``defaults.spark_slots``, in declaration order."""
    rows = []
    for prefix, cls in (("", TopicConfig), *((f"{s}.", c) for s, c in NESTED.items()),
                        ("defaults.", FileOptions)):
        for name, info in cls.__pydantic_fields__.items():
            if prefix == "" and name in NESTED:
                continue
            shown = (info.json_schema_extra or {}).get("shown") \
                if isinstance(info.json_schema_extra, dict) else None
            rows.append((f"{prefix}{name}", _type_name(info.annotation, shown), _default(info),
                         info.description or ""))
    return rows


def topic_options_table() -> str:
    """The Markdown table of the topic options."""
    lines = ["| Option | Type | Default | What it does |", "| --- | --- | --- | --- |"]
    lines += [f"| `{n}` | {_cell(t)} | {_cell(d)} | {_cell(doc)} |"
              for n, t, d, doc in option_rows()]
    return "\n".join(lines)


def environment_table() -> str:
    """The Markdown table of the environment variables."""
    lines = ["| Variable | Type | Default | What it sets |", "| --- | --- | --- | --- |"]
    for v in envvars.VARIABLES:
        default = f"`{v.default}`" if v.default else (v.default_doc or "unset")
        notes = [v.doc] + (["secret: never on a command line or in a log"] if v.secret else []) \
            + (["set by deltaferry or the crash tests, not by hand"] if v.internal else [])
        lines.append(f"| `{v.name}` | {_cell(v.type)} | {_cell(default)} | "
                     f"{_cell('; '.join(notes))} |")
    return "\n".join(lines)


def render(markdown: str) -> str:
    """`markdown` with each marker line replaced by its table."""
    tables = {TOPIC_OPTIONS: topic_options_table, ENVIRONMENT: environment_table}
    return "\n".join(tables[line.strip()]() if line.strip() in tables else line
                     for line in markdown.split("\n"))


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None,
                     **kwargs: Any) -> str:
    """mkdocs' hook: the page's Markdown with the reference tables in place of their markers."""
    return render(markdown)
