"""The commit-msg hook `make setup` installs holds subjects to `area: summary` in 72 characters."""

import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("message", [
    "quarantine: one reader for the CLI and the UI\n",
    "spark/warm: stop idle pools\n\nWhy: an idle pool held 1 GB.\n",
    "Merge branch 'r29-docs'\n",
    "# a comment git strips\nfleet: spread the schedules\n",
])
def test_a_conventional_subject_is_accepted(tmp_path, message):
    assert check(tmp_path, message).returncode == 0


@pytest.mark.parametrize(("message", "said"), [
    ("fleet: " + "x" * 66 + "\n", "73 characters"),
    ("Fixed the fleet\n", "'area: summary'"),
    ("fleet: spread\nthe body right away\n", "second line blank"),
])
def test_a_subject_off_the_convention_is_refused_saying_why(tmp_path, message, said):
    done = check(tmp_path, message)
    assert done.returncode == 1
    assert said in done.stderr
