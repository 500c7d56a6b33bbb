"""Many topics on one Airflow: the pool that bounds Spark drivers, its slots, and the optional
spread of a fleet's start times inside the hour.

* Every Spark task of the topic DAGs runs in the Airflow pool `POOL` (``deltaferry``, or
  ``DELTAFERRY_POOL``), so past its slots tasks queue instead of starting drivers together.
* Its slots (`slots`): the topics file's ``defaults: spark_slots`` if given, else what the
  machine holds: one per core, and no more than fit in its memory beside `RESERVE_BYTES` for
  Airflow and the system, at the driver memory (``DELTAFERRY_DRIVER_MEMORY``, 2g) plus
  `DRIVER_OVERHEAD_BYTES` of JVM and Python outside the heap each.
* `spread_schedule`: with ``start_spread_minutes``, an ``@hourly`` (``@daily``, or cron with a
  fixed minute) topic starts at a stable offset derived from its name, so a fleet's load is flat
  instead of all due at the top of the hour.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

from deltaferry import env as envvars
from deltaferry.errors import ConfigError

#: The Airflow pool of every Spark task of the topic DAGs (DELTAFERRY_POOL overrides it).
DEFAULT_POOL = envvars.POOL.default
POOL_VAR = envvars.POOL.name
POOL_DESCRIPTION = "deltaferry: Spark drivers of the topic DAGs (one slot per driver)"
#: Memory left to Airflow, the brokers' clients and the system when slots are derived.
RESERVE_BYTES = 4 * 2**30
#: A driver's memory outside its heap: JVM metaspace, code cache, threads, the Python side.
DRIVER_OVERHEAD_BYTES = 1 * 2**30
DEFAULT_DRIVER_MEMORY = envvars.DRIVER_MEMORY.default
_MEMORY_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def pool_name(env: Mapping[str, str] | None = None) -> str:
    """The Airflow pool of the topic DAGs' Spark tasks: DELTAFERRY_POOL, else ``deltaferry``."""
    return envvars.POOL.value(env)


def memory_bytes(text: str, what: str = envvars.DRIVER_MEMORY.name) -> int:
    """A JVM memory size ("2g", "1536m", "512M") in bytes; ConfigError naming `what` if not."""
    match = _MEMORY_RE.match(text or "")
    if not match:
        raise ConfigError(what, f"{text!r} is not a memory size such as 2g or 1536m")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def machine_memory_bytes() -> int:
    """The machine's memory (MemTotal of /proc/meminfo; sysconf where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def derived_slots(cores: int, memory: int, driver_memory: int) -> int:
    """Drivers a worker holds: one per core, as many as fit in `memory` beside RESERVE_BYTES at
    `driver_memory` + DRIVER_OVERHEAD_BYTES each; at least one."""
    fit = (memory - RESERVE_BYTES) // (driver_memory + DRIVER_OVERHEAD_BYTES)
    return max(1, min(cores, fit))


def slots(configured: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """The pool's slots: `configured` (the topics file's ``defaults: spark_slots``) if given,
    else `derived_slots` of this machine and DELTAFERRY_DRIVER_MEMORY."""
    if configured:
        return configured
    driver = memory_bytes(envvars.DRIVER_MEMORY.raw(env) or DEFAULT_DRIVER_MEMORY)
    return derived_slots(machine_cores(), machine_memory_bytes(), driver)


def pool_command(name: str, count: int) -> str:
    """The command that creates (or resizes) the pool `name` with `count` slots."""
    return f'airflow pools set {name} {count} "{POOL_DESCRIPTION}"'


def pool_problem(existing: int | None, wanted: int,
                 env: Mapping[str, str] | None = None) -> str | None:
    """One line saying what is wrong with the Airflow pool that has `existing` slots (None: it
    does not exist) when the drivers want `wanted` (deltaferry.airflow.pool.wanted_slots);
    None when it matches."""
    name = pool_name(env)
    fix = f"`{pool_command(name, wanted)}`"
    if existing is None:
        return (f"the Airflow pool {name!r} does not exist: the topic DAGs' tasks do not start "
                f"without it (the deltaferry plugin creates it when a topic's run starts; or "
                f"create it: {fix})")
    if existing < wanted:
        return (f"the Airflow pool {name!r} has {existing} slot(s), fewer than the {wanted} "
                f"Spark drivers a worker runs (defaults: spark_slots, or derived from the "
                f"machine): {wanted - existing} stay idle; resize it: {fix}")
    if existing > wanted:
        return (f"the Airflow pool {name!r} has {existing} slot(s), more than the {wanted} "
                f"Spark drivers a worker runs: the tasks past {wanted} wait for a driver "
                f"instead of in the pool; resize it: {fix}")
    return None


def spread_offset(name: str, minutes: int) -> int:
    """A topic's start offset in [0, minutes): stable (from its name), the same on every
    machine and in every process (not Python's salted hash)."""
    if minutes <= 1:
        return 0
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") % minutes


_FIXED_MINUTE_CRON = re.compile(r"^\s*(\d{1,2})(\s+\S+){4}\s*$")


def spread_schedule(schedule: str | None, name: str, minutes: int) -> str | None:
    """`schedule` moved by the topic's stable offset inside `minutes`: ``@hourly`` becomes
    ``M * * * *`` (minutes <= 60), ``@daily`` ``M H * * *`` (minutes <= 1440), a cron expression
    with a fixed minute gets that minute moved (minutes <= 60, wrapping inside the hour).
    `schedule` as it is when `minutes` is 0; ConfigError for any other schedule."""
    if not minutes or schedule is None:
        return schedule
    where = f"topic {name!r}"
    offset = spread_offset(name, minutes)
    text = schedule.strip()
    if text in ("@hourly", "0 * * * *"):
        if minutes > 60:
            raise ConfigError(where, f"start_spread_minutes: {minutes} is more than the hour "
                              "an @hourly schedule repeats in (at most 60)")
        return f"{offset} * * * *"
    if text in ("@daily", "@midnight", "0 0 * * *"):
        if minutes > 1440:
            raise ConfigError(where, f"start_spread_minutes: {minutes} is more than the day "
                              "a @daily schedule repeats in (at most 1440)")
        return f"{offset % 60} {offset // 60} * * *"
    match = _FIXED_MINUTE_CRON.match(text)
    if match and int(match.group(1)) < 60:
        if minutes > 60:
            raise ConfigError(where, f"start_spread_minutes: {minutes} is more than a cron "
                              "schedule's minute can move (at most 60)")
        fields = text.split()
        fields[0] = str((int(fields[0]) + offset) % 60)
        return " ".join(fields)
    raise ConfigError(where, f"start_spread_minutes spreads @hourly, @daily or a cron "
                      f"expression with a fixed minute, not schedule {schedule!r}")
