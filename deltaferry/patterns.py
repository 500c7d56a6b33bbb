"""Topics by pattern: the broker's topics as last listed, which the topics file's pattern
entries (`pattern:`) expand to.

The list is kept in the warehouse (``<warehouse>/_deltaferry/topics.json``: each topic seen,
when first seen, and since when it is gone if the broker stopped listing it) and written only
by `refresh` (the DAG ``deltaferry_refresh_topics`` every ``defaults: refresh_minutes``, or
`deltaferry topics --refresh`). Loading the topics file reads it (one small read), never the
broker: Airflow's dag-processor parses the DAG files every few seconds. A topic that
disappears stays in the list, marked gone: its table is kept, its DAG stays, unscheduled, and
the first run of the refresh DAG that finds it gone has it paused in Airflow
(deltaferry.airflow.gone).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from deltaferry import env as envvars
from deltaferry.storage import join, spark_uri, storage_for

log = logging.getLogger(__name__)

#: The folder of the warehouse's own files, and the list's name in it.
FOLDER = "_deltaferry"
LIST_FILE = "topics.json"


def list_uri(warehouse: str) -> str:
    """Where the broker's topics as last listed are kept in `warehouse`."""
    return join(spark_uri(warehouse), FOLDER, LIST_FILE)


def read_list(warehouse: str, env: Mapping[str, str] | None = None) -> dict:
    """The list kept in `warehouse` (``{"refreshed": ISO time, "topics": {name: {"first_seen",
    "gone_since"}}}``); an empty one if there is none yet. ValueError if it is not such JSON."""
    uri = list_uri(warehouse)
    try:
        document = json.loads(storage_for(uri, env).read(uri))
    except FileNotFoundError:
        return {"refreshed": None, "topics": {}}
    if not isinstance(document, dict) or not isinstance(document.get("topics"), dict):
        raise ValueError(f"{uri} is not deltaferry's list of topics")
    return document


def known_topics(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The broker's topics as last listed in the warehouse (DELTAFERRY_WAREHOUSE): name -> None,
    or since when it is gone. Empty (said in the log) when there is no warehouse setting or the
    list cannot be read: the file's other entries still load."""
    warehouse = envvars.WAREHOUSE.value(env)
    if not warehouse:
        log.warning("pattern entries: %s is not set, so no list of the broker's topics is read "
                    "(their topics are not listed)", envvars.WAREHOUSE.name)
        return {}
    try:
        topics = read_list(warehouse, env)["topics"]
    except Exception as exc:  # storage down, a damaged file: the pattern entries match nothing
        log.warning("pattern entries: the list of the broker's topics in %s cannot be read "
                    "(%s); their topics are not listed until it can", warehouse, exc)
        return {}
    return gone_by_name(topics)


def gone_by_name(topics: Mapping) -> dict[str, str | None]:
    """The list's `topics` (its ``"topics"``) as `known_topics` gives them: name -> None, or
    since when it is gone."""
    return {str(name): (seen or {}).get("gone_since") for name, seen in topics.items()}


def merged(previous: Mapping, listed: list[str], now: str) -> dict:
    """The list after a refresh that found the topics `listed` at `now`: new ones added, every
    one listed present again, the others kept and marked gone since when they were first missed."""
    topics = {}
    for name, seen in (previous.get("topics") or {}).items():
        seen = dict(seen or {})
        if name not in listed and not seen.get("gone_since"):
            seen["gone_since"] = now
        topics[name] = seen
    for name in listed:
        topics[name] = {"first_seen": topics.get(name, {}).get("first_seen") or now,
                        "gone_since": None}
    return {"refreshed": now, "topics": dict(sorted(topics.items()))}


@dataclass(frozen=True)
class Refreshed:
    """What a refresh did: the list it kept (`read_list`'s form), the topics it found new (or
    listed again) and those it found gone (listed before, not now)."""

    document: dict
    new: list[str]
    gone: list[str]


def refresh(env: Mapping[str, str] | None = None) -> Refreshed:
    """List the broker's topics (DELTAFERRY_KAFKA_BOOTSTRAP, its options) and keep the list in
    the warehouse; the new list and what changed, which is said in the log too."""
    from deltaferry.config.settings import Settings
    from deltaferry.kafka import list_topics

    settings = Settings.from_env(env)
    listed = list_topics(settings.kafka_bootstrap, settings.kafka_options)
    previous = read_list(settings.warehouse, env)
    updated = merged(previous, listed, datetime.now(UTC).isoformat(timespec="seconds"))
    before = previous.get("topics") or {}
    new = [n for n in listed if n not in before or before[n].get("gone_since")]
    gone = [n for n, s in updated["topics"].items()
            if s.get("gone_since") and not (before.get(n) or {}).get("gone_since")]
    uri = list_uri(settings.warehouse)
    storage_for(uri, env).write(uri, json.dumps(updated, indent=1).encode("utf-8"))
    log.info("topics refreshed: %d listed by the broker; new: %s; gone: %s", len(listed),
             ", ".join(new) or "none", ", ".join(gone) or "none")
    return Refreshed(updated, new, gone)
