"""The docs' configuration reference is generated from the declarations (docs/hooks)."""

import importlib.util
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.config.topics import KNOWN_KEYS

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"


def load_hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_topic_options_marker_becomes_a_table_of_every_option():
    hook = load_hook()
    page = hook.on_page_markdown("# Reference\n\n<!-- deltaferry:topic-options -->\n\nAfter.\n")
    assert "deltaferry:topic-options" not in page and page.endswith("\nAfter.\n")
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    names = [row.split("`")[1] for row in rows]
    assert names == [n for n, *_ in hook.option_rows()]
    assert set(KNOWN_KEYS) | {"defaults.spark_slots", "defaults.refresh_minutes"} == set(names)
    assert all(row.count(" | ") == 3 and not row.endswith("|  |") for row in rows)
    (version,) = [row for row in rows if row.startswith("| `avro.schema_version`")]
    assert "integer or null" in version and "`null`" in version


def test_the_environment_marker_becomes_a_table_of_every_variable():
    page = load_hook().on_page_markdown("<!-- deltaferry:environment -->")
    for variable in envvars.VARIABLES:
        assert f"| `{variable.name}` |" in page
    (password,) = [line for line in page.splitlines()
                   if line.startswith("| `DELTAFERRY_SCHEMA_REGISTRY_PASSWORD`")]
    assert "secret" in password
