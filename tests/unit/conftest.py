"""Unit tests' shared fixtures."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

import pytest

OTHER_USER = "deltaferry-other"


@pytest.fixture(scope="session")
def other_user() -> pwd.struct_passwd:
    """A second local user (made with useradd when missing): needs root to act as it."""
    if os.geteuid() != 0:
        pytest.skip("acting as a second local user needs root")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("no useradd to make a second local user")
    subprocess.run(["useradd", "-m", OTHER_USER], check=True, capture_output=True)
    return pwd.getpwnam(OTHER_USER)
