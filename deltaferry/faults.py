"""Named points of a run where the crash tests stop it, to kill its process group there.

Unset in every real run: `point` then returns at once. With DELTAFERRY_CRASH_POINT=NAME, the
run reaching the point NAME writes NAME to the file DELTAFERRY_CRASH_MARK and stops there (it
sleeps until killed); NAME@N stops the (N+1)-th time the process reaches it (the third batch for
@2); NAME:continue writes the file and goes on (to be killed somewhere inside the work that
follows); NAME:pause writes the file and waits until it is deleted, then goes on (the outage
tests stop a service of the stack meanwhile). `tests/integration/test_crash.py` kills a run at
each point and checks the table and the quarantine after the next runs;
`tests/integration/test_outages.py` stops the broker, the S3 server or the registry at one;
`tests/integration/test_replay.py` kills a replay at its own point.
"""

from __future__ import annotations

import os
import time

POINT_VAR = "DELTAFERRY_CRASH_POINT"
MARK_VAR = "DELTAFERRY_CRASH_MARK"
#: How often a paused run looks whether its mark is gone (seconds).
PAUSE_POLL_S = 0.1
#: The points, in the order a run reaches them.
POINTS = ("quarantine-written", "batch-written", "optimized-table", "optimized-quarantine")
#: The point of `quarantine replay`: its table commit done, its quarantine rows not marked.
REPLAY_POINTS = ("replay-landed",)
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
    mark = os.environ[MARK_VAR]
    with open(mark, "w", encoding="utf-8") as handle:
        handle.write(name)
    if mode == "pause":
        while os.path.exists(mark):
            time.sleep(PAUSE_POLL_S)
        return
    while mode != "continue":
        time.sleep(60)
