"""What users read stays what it promises: a README that is a front page, a documentation site
whose every page is reachable, and no tracker numbers. The strict build itself (broken links
and anchors) is `make docs`, part of `make test`."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: "issue 14", "#29", "seed 004" / "seed-004" / "seed004", "main at bd30599", "commit 1a2b3c4".
TRACKER = re.compile(
    r"\bissues?\s*#?\d+|(?<![\w/&])#\d+\b|\bseed[\s_-]?\d+"
    r"|\b(?:main|master|commit)\s+(?:at\s+)?[0-9a-f]{7,40}\b",
    re.IGNORECASE,
)


def user_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def nav_pages(entries) -> list[str]:
    """The page paths of an mkdocs `nav`, at any depth."""
    found: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found += nav_pages(value)
        elif isinstance(value, str) and not value.startswith(("http://", "https://")):
            found.append(value)
    return found


def site_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_the_readme_is_a_front_page_of_at_most_150_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


def test_no_page_users_read_names_a_tracker_number():
    hits = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for page in user_pages()
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in TRACKER.finditer(line)
    ]
    assert not hits, "tracker numbers in what users read:\n" + "\n".join(hits)


def test_the_tracker_pattern_catches_the_forms_it_is_for():
    for text in ("issue 14", "issue #29", "seed 004", "seed-004", "seed004_port",
                 "main at bd30599", "(#32)"):
        assert TRACKER.search(text), text
    for text in ("p0: 72816", "replay 20261123T155740Z-67c1dd42", "[x](#exactly-once)",
                 "a committed batch"):
        assert not TRACKER.search(text), text


def test_every_page_of_the_docs_is_in_the_site_navigation_and_every_entry_exists():
    listed = nav_pages(site_config()["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed)), "a page is listed twice"


def test_the_readme_links_only_to_files_that_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_reference_pages_hold_the_markers_the_generator_fills():
    for page, marker in (("reference/topics-file.md", "<!-- deltaferry:topic-options -->"),
                         ("reference/environment.md", "<!-- deltaferry:environment -->")):
        assert marker in (DOCS / page).read_text().splitlines(), f"{page}: {marker} on its own line"


def test_make_test_builds_the_docs_in_strict_mode():
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*\n(?:\t.*\n)*)", makefile, re.MULTILINE)
    assert test_rule and "docs" in test_rule.group(1).split()  # a prerequisite or sub-make
    docs_rule = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert docs_rule and "mkdocs build --strict" in docs_rule.group(1)
