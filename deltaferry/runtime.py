"""Folders of this user's own for the files deltaferry keeps while it runs (the lock tokens of
running steps): `private_dir` makes or finds one, and refuses a folder another local user could
have planted or could write into.

The folder is ``$XDG_RUNTIME_DIR/<name>`` when XDG_RUNTIME_DIR is set (a per-user tmpfs that
only its user can enter), else ``<tmp>/<name>-<uid>``, whose name anyone can predict: whoever
creates it first owns it, so an existing one is used only if it is a real folder (not a
symbolic link), owned by this user and writable by nobody else.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.errors import DeltaferryError


class RuntimeDirError(DeltaferryError):
    """A runtime folder that is not this user's own: another user's, open to others, a link."""


def private_dir(name: str, env: Mapping[str, str] | None = None, override: str | None = None,
                setting: str | None = None) -> Path:
    """The folder `name` of this user's runtime files: `override` when given (a setting such as
    DELTAFERRY_WARM_DIR), else under XDG_RUNTIME_DIR (from `env`, default os.environ) when set,
    else ``<tmp>/<name>-<uid>``; made (0700) if missing. RuntimeDirError (one line: the path,
    what is wrong and `setting`, the variable that moves it) if it cannot be made or is not
    this user's own (`check_private`)."""
    setting = setting or envvars.RUNTIME_DIR.name
    base = envvars.RUNTIME_DIR.value(env)
    if override:
        folder = Path(override)
    else:
        folder = (Path(base) / name if base
                  else Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, parents=bool(override))
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeDirError(f"runtime folder {folder}: cannot be made ({exc.strerror or exc});"
                              f" set {setting} to a folder of your own") from None
    check_private(folder, setting)
    return folder


def check_private(folder: Path, setting: str | None = None) -> None:
    """Nothing if `folder` is a folder (not a symbolic link) owned by this user that no other
    user can write into; RuntimeDirError naming the folder, what is wrong and `setting` (the
    variable that moves it; XDG_RUNTIME_DIR by default) otherwise."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise RuntimeDirError(f"runtime folder {folder}: {exc.strerror or exc}") from None
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.getuid():
        problem = f"is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        problem = f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        raise RuntimeDirError(f"runtime folder {folder} {problem}: not used; remove it or set "
                              f"{setting or envvars.RUNTIME_DIR.name} to a folder of your own")
