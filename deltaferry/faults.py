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

The variable is a test setting, and an environment that keeps it by mistake reaches every run
(the Airflow operator copies its environment): a run that reaches the point says so in a WARNING
naming the variable, and waits at most `WAIT_LIMIT_S` for a test to kill it (or to delete the
mark), then fails with FaultPointError instead of holding its topic's lock forever. A value
naming no point, or set without DELTAFERRY_CRASH_MARK, is refused at the first point reached.
"""

from __future__ import annotations

import logging
import os
import time

from deltaferry import env as envvars
from deltaferry.errors import ConfigError, DeltaferryError

log = logging.getLogger(__name__)

POINT_VAR = envvars.CRASH_POINT.name
MARK_VAR = envvars.CRASH_MARK.name
#: How often a stopped or paused run looks whether its mark is gone or its time is up (seconds).
PAUSE_POLL_S = 0.1
#: The longest a run stays stopped or paused at a point; the tests kill or resume it in seconds.
WAIT_LIMIT_S = 600.0
#: The points, in the order a run reaches them.
POINTS = ("quarantine-written", "batch-written", "optimized-table", "optimized-quarantine")
MODES = ("", "continue", "pause")
#: The point of `quarantine replay`: its table commit done, its quarantine rows not marked.
REPLAY_POINTS = ("replay-landed",)
_reached: dict[str, int] = {}


class FaultPointError(DeltaferryError):
    """A run stopped at a crash point longer than WAIT_LIMIT_S: DELTAFERRY_CRASH_POINT was left
    set outside the crash tests."""


def reset() -> None:
    """Forget how often each point was reached: the next run counts from zero (a warm driver's
    next step, as a new process would)."""
    _reached.clear()


def wanted() -> tuple[str, int, str] | None:
    """(point, times to pass it first, mode) that DELTAFERRY_CRASH_POINT asks for, or None when
    unset; ConfigError naming the variable if it names no point or mode, or if
    DELTAFERRY_CRASH_MARK is not set beside it."""
    value = envvars.CRASH_POINT.value()
    if not value:
        return None
    target, _, mode = value.partition(":")
    target, _, nth = target.partition("@")
    if target not in POINTS + REPLAY_POINTS or mode not in MODES or not (nth or "0").isdigit():
        raise ConfigError(POINT_VAR, f"{value!r} is not NAME[@N][:continue|:pause] with NAME one "
                          f"of {', '.join(POINTS + REPLAY_POINTS)}; it is a crash-test setting: "
                          "unset it")
    if not envvars.CRASH_MARK.raw():
        raise ConfigError(POINT_VAR, f"{value!r} is set without {MARK_VAR}; it is a crash-test "
                          "setting: unset it")
    return target, int(nth or 0), mode


def point(name: str) -> None:
    """Nothing unless DELTAFERRY_CRASH_POINT asks for `name`; then mark it and stop, go on or
    pause as the module's docstring says, saying so in a WARNING, for at most WAIT_LIMIT_S
    (FaultPointError after that)."""
    asked = wanted()
    if asked is None or asked[0] != name:
        return
    _, nth, mode = asked
    times = _reached[name] = _reached.get(name, 0) + 1
    if times <= nth:
        return
    mark = envvars.CRASH_MARK.raw() or ""
    with open(mark, "w", encoding="utf-8") as handle:
        handle.write(name)
    if mode == "continue":
        log.warning("%s=%s: crash point %s reached, mark %s written; this is a crash-test "
                    "setting, unset it outside the tests", POINT_VAR, envvars.CRASH_POINT.raw(),
                    name, mark)
        return
    log.warning("%s=%s: this run stops at crash point %s (mark %s) for up to %g s, %s; this is "
                "a crash-test setting, unset it outside the tests", POINT_VAR,
                envvars.CRASH_POINT.raw(), name, mark, WAIT_LIMIT_S,
                "until the mark is deleted" if mode == "pause" else "to be killed")
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        if mode == "pause" and not os.path.exists(mark):
            return
        time.sleep(PAUSE_POLL_S)
    raise FaultPointError(
        f"{POINT_VAR}={envvars.CRASH_POINT.raw()}: this run stopped at crash point {name} for "
        f"{WAIT_LIMIT_S:g} s and no test {'resumed' if mode == 'pause' else 'killed'} it; it "
        "is a crash-test setting (tests/integration/test_crash.py): unset it")
