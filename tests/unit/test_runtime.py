"""This user's runtime folders (deltaferry.runtime): made 0700, under XDG_RUNTIME_DIR when set;
one that another user owns, others can write, or that is a symbolic link is refused with one
line naming it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from deltaferry.runtime import RuntimeDirError, private_dir


@pytest.fixture
def run_user(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "run-user"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def test_a_missing_folder_is_made_for_this_user_only(run_user):
    made = private_dir("deltaferry-things")
    assert made == run_user / "deltaferry-things"
    assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.getuid()
    assert private_dir("deltaferry-things") == made  # found again


def test_without_xdg_runtime_dir_the_folder_is_the_users_in_the_temporary_folder(monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    made = private_dir("deltaferry-test-runtime")
    made.rmdir()
    assert made == Path(tempfile.gettempdir()) / f"deltaferry-test-runtime-{os.getuid()}"


def test_a_folder_others_can_write_is_refused(run_user):
    (run_user / "open").mkdir()
    os.chmod(run_user / "open", 0o777)
    with pytest.raises(RuntimeDirError) as caught:
        private_dir("open")
    assert str(caught.value).startswith(
        f"runtime folder {run_user / 'open'} can be written by other users (mode 777)")


def test_a_symbolic_link_is_refused(run_user, tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (run_user / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RuntimeDirError, match="linked is a symbolic link: not used"):
        private_dir("linked")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_folder_is_refused(run_user):
    (run_user / "theirs").mkdir(mode=0o700)
    os.chown(run_user / "theirs", 65534, -1)
    with pytest.raises(RuntimeDirError, match="theirs is owned by uid 65534, not by this user"):
        private_dir("theirs")


def test_the_tls_stores_and_the_executors_zip_refuse_a_folder_another_user_could_fill(
        run_user):
    """A PKCS#12 keystore written into, or a package zip found in, a folder others can write
    would be read or run as this user's: both folders are `private_dir`s."""
    from deltaferry import tls
    from deltaferry.spark.shipping import package_zip

    for name in ("deltaferry-tls", "deltaferry-py"):
        (run_user / name).mkdir()
        os.chmod(run_user / name, 0o777)
    with pytest.raises(RuntimeDirError, match="deltaferry-tls can be written by other users"):
        tls.private_dir()
    with pytest.raises(RuntimeDirError, match="deltaferry-py can be written by other users"):
        package_zip()
    for name in ("deltaferry-tls", "deltaferry-py"):
        os.chmod(run_user / name, 0o700)
    assert tls.private_dir() == run_user / "deltaferry-tls"
    assert package_zip().parent == run_user / "deltaferry-py"
