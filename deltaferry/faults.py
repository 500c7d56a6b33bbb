"""Named points of a run where the crash tests stop it, to kill its process group there.

Unset in every real run: `point` then returns at once. With DELTAFERRY_CRASH_POINT=NAME, the
run reaching the point NAME writes NAME to the file DELTAFERRY_CRASH_MARK and stops there (it
sleeps until killed); NAME@N stops the (N+1)-th time the process reaches it (the third batch for
@2); NAME:continue writes the file and goes on (to be killed somewhere inside the work that
follows). `tests/integration/test_crash.py` kills a run at each point and
checks the table and the quarantine after the next runs.
"""

from __future__ import annotations

import os
import time

POINT_VAR = "DELTAFERRY_CRASH_POINT"
MARK_VAR = "DELTAFERRY_CRASH_MARK"
#: The points, in the order a run reaches them.
POINTS = ("quarantine-written", "batch-written", "optimized-table", "optimized-quarantine")
_reached: dict[str, int] = {}


def point(name: str) -> None:
    """Stop here if the crash tests asked for `name` (see the module's docstring)."""
    wanted = os.environ.get(POINT_VAR)
    if not wanted:
        return
    target, _, mode = wanted.partition(":")
    target, _, nth = target.partition("@")
    if target != name:
        return
    times = _reached[name] = _reached.get(name, 0) + 1
    if times <= int(nth or 0):
        return
    with open(os.environ[MARK_VAR], "w", encoding="utf-8") as handle:
        handle.write(name)
    while mode != "continue":
        time.sleep(60)
