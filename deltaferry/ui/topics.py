"""The topics page: every topic of the topics file with its format, last run and result, last
success, rows in the table, lag, quarantined messages (last run and total) and schema version;
and the bad entries of the file with their problems. A `TopicsQuery` (the page's query
parameters) filters the topics by name, last run state, lag and last success and sorts them.

Rows and quarantined totals come from the Delta logs (delta-rs, add-action statistics); the lag
is the messages the topic holds past the offsets of the streaming checkpoint's last committed
batch (the watermarks of all topics asked of the broker together, `topics_offsets`); the last
run is what the caller found in Airflow's metadata (`LastRun`). Topics are gathered by a bounded
thread pool, each with short timeouts, so one slow system cannot hold the page; filters that need
no gathering (name, state, last success) are applied first, so only the topics shown are read.
The metrics and `deltaferry status` read the same rows through the same `TopicsReader`
(`all_topic_rows`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from deltaferry import env as envvars
from deltaferry.config import TopicConfig, TopicsFile, parse_kafka_options, warehouse_from_env
from deltaferry.config.topics import OWN_ENTRY
from deltaferry.formats import format_of
from deltaferry.paths import TopicPaths
from deltaferry.state import committed_offsets, lag
from deltaferry.storage import Storage, storage_for

if TYPE_CHECKING:
    from deltaferry.alerts import Alert
    from deltaferry.pause import Paused

#: Seconds the page waits for the broker's watermarks (of all topics together).
WATERMARK_TIMEOUT_S = 3.0
#: Topics read at the same time (Delta logs, schema cache, checkpoint).
GATHER_THREADS = 8
#: Topics on one page: a 200- or 500-topic file is read a page at a time (each topic with a
#: table costs two Delta log reads), so the page answers in the same time whatever the fleet.
PAGE_SIZE = 50
#: What the page can be sorted by (query parameter ``sort``), with the order a first click asks.
SORTS = {"name": "asc", "state": "asc", "lag": "desc", "last_success": "asc"}
#: Last run states in the order a sort by state shows them (ascending: the failed first); any
#: other state after these, topics that never ran last.
STATE_ORDER = ("failed", "upstream_failed", "up_for_retry", "running", "queued", "scheduled",
               "success")
#: The ``state`` filter's value for topics whose DAG never ran.
NO_RUN = "none"
#: Last run states the topics page marks as a problem.
FAILED_STATES = ("failed", "upstream_failed")


@dataclass(frozen=True)
class LastRun:
    """A topic DAG's latest run as Airflow recorded it, with its ingest task's report (the
    task's XCom, None when it has none)."""

    run_id: str
    state: str
    at: str
    ingest: dict | None = None
    #: when the DAG's latest successful run ended (None: it never succeeded)
    last_success: datetime | None = None
    #: when the run started and ended ("" while it has not)
    started: str = ""
    ended: str = ""
    #: the DAG's newest run whose ingest did work (read messages), when it is not this one;
    #: None when this one did, or no recent run did (`work`)
    last_work: LastRun | None = None

    @property
    def at_label(self) -> str:
        """What `at` is: ``ended``, ``started`` (a run still going) or ``queued``."""
        return "ended" if self.ended else "started" if self.started else "queued"

    @property
    def did_work(self) -> bool:
        """Whether its ingest ran (a report that is not a skip, nor an empty topic's)."""
        return (isinstance(self.ingest, dict) and not self.ingest.get("skipped")
                and not self.ingest.get("empty") and self.ingest.get("step") == "ingest")

    @property
    def work(self) -> LastRun | None:
        """The DAG's newest run whose ingest did work: this one, or `last_work`."""
        return self if self.did_work else self.last_work

    @property
    def written(self) -> str:
        """What its ingest wrote, in words (``2 inserted, 1 updated, 0 deleted`` or ``5
        appended``); "" without a report of work."""
        from deltaferry.reports import describe_counts

        if not self.did_work:
            return ""
        assert isinstance(self.ingest, dict)
        return describe_counts(str(self.ingest.get("mode") or "upsert"), self.ingest)

    @property
    def last_success_text(self) -> str:
        """The last success as the page shows it ("" when there was none)."""
        return self.last_success.strftime("%Y-%m-%d %H:%M:%S UTC") if self.last_success else ""

    @property
    def quarantined(self) -> int | None:
        """Messages its ingest quarantined (0 when ingest was skipped; None if unknown)."""
        if not isinstance(self.ingest, dict):
            return None
        if self.ingest.get("skipped"):
            return 0
        value = self.ingest.get("quarantined")
        return int(value) if isinstance(value, int) else None

    @property
    def expectations(self) -> list[tuple[str, int, str]]:
        """(name, records that failed it, what its action did: `EXPECTATION_VERBS`) of each
        expectation its ingest report counts; empty without a report of work or without
        expectations."""
        from deltaferry.reports import EXPECTATION_VERBS

        found = self.ingest.get("expectations") if self.did_work and isinstance(
            self.ingest, dict) else None
        if not isinstance(found, dict):
            return []
        return [(str(name), int(e.get("failed") or 0),
                 EXPECTATION_VERBS.get(str(e.get("action")), str(e.get("action"))))
                for name, e in found.items() if isinstance(e, dict)]

    def per_path(self, key: str) -> dict[str, int]:
        """The per-path counts its ingest report holds under `key`; empty without a report of
        work or without such counts."""
        found = self.ingest.get(key) if self.did_work and isinstance(self.ingest, dict) \
            else None
        if not isinstance(found, dict):
            return {}
        return {str(path): int(n) for path, n in found.items() if isinstance(n, int)}

    @property
    def rescued(self) -> dict[str, int]:
        """Per path its ingest kept in ``_rescued`` (``schema: rescue``), the messages it was
        in; empty without a report of work or without rescued values."""
        return self.per_path("rescued_fields")

    @property
    def discarded(self) -> dict[str, int]:
        """Per field its ingest left out of the rows (``schema: discard_new_fields``), the
        messages it was in; empty without a report of work or without such fields."""
        return self.per_path("discarded_fields")

    @property
    def result(self) -> str:
        """The ingest report's summary line, else the run's state."""
        if isinstance(self.ingest, dict) and self.ingest.get("summary"):
            return str(self.ingest["summary"])
        return self.state

    def figure(self, name: str) -> float | None:
        """The number `name` of its ingest report (``messages_read``, ``seconds``, ``lag``);
        0 for ``seconds`` when ingest was skipped (no Spark ran), None when unknown."""
        if not isinstance(self.ingest, dict):
            return None
        value = self.ingest.get(name)
        if value is None and name == "seconds" and self.ingest.get("skipped"):
            return 0.0
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
            else None

    @property
    def alerts(self) -> list[Alert] | None:
        """The alerts its ingest step raised (`deltaferry.alerts.of` its report), None when
        there is no report listing them (no report, or one from before alerts existed)."""
        from deltaferry import alerts

        if not isinstance(self.ingest, dict) or not isinstance(self.ingest.get(alerts.KEY),
                                                                 list):
            return None
        try:
            return alerts.of(self.ingest)
        except (KeyError, TypeError):  # not an alert's shape: unknown rather than none
            return None


@dataclass
class TopicRow:
    """One line of the topics page."""

    name: str
    format: str
    dag_id: str
    schedule: str | None
    schema_version: str | None = None
    #: the version's number (of the schema cache, or the registry's for registry formats)
    schema_number: int | None = None
    rows: int | None = None
    lag: int | None = None
    quarantined_total: int | None = None
    #: quarantined messages not replayed yet (read only when asked: `TopicsReader.rows`)
    quarantined_waiting: int | None = None
    last_run: LastRun | None = None
    #: what could not be read, said instead of a number
    notes: list[str] = field(default_factory=list)
    #: the topic's alerts.max_lag_messages (None: no threshold)
    max_lag: int | None = None
    #: which entry of the topics file the topic came from (`TopicsFile.entry_of`)
    entry: str = OWN_ENTRY
    #: why its bad messages paused the topic (deltaferry.pause); None: not paused (or unread)
    paused: Paused | None = None
    #: whether its paused state was read (`paused` None is then "not paused")
    paused_read: bool = False

    @property
    def pattern_entry(self) -> str:
        """The pattern entry the topic came from, as `entry` says it; '' for a topic listed by
        name (the page and `status` then say nothing of it)."""
        return "" if self.entry == OWN_ENTRY else self.entry

    @property
    def problems(self) -> dict[str, str]:
        """What needs a look, by what it concerns (``paused``, ``run``, ``lag``,
        ``quarantine``): a topic its bad messages paused, a last run that failed, a lag over
        the topic's alerts.max_lag_messages, messages the last run that did work
        quarantined."""
        found = {}
        if self.paused is not None:
            found["paused"] = (f"paused since {self.paused.since}: {self.paused.why()}; its "
                               "runs are refused until it is resumed")
        run = self.last_run
        if run is not None and run.state in FAILED_STATES:
            found["run"] = f"the last run {run.state.replace('_', ' ')}"
        if self.max_lag is not None and self.lag is not None and self.lag > self.max_lag:
            found["lag"] = (f"lag {self.lag:,} is over the topic's alerts.max_lag_messages "
                            f"({self.max_lag:,})")
        work = run.work if run is not None else None
        if work is not None and work.quarantined:
            found["quarantine"] = (f"the quarantine grew by {work.quarantined:,} in the last "
                                   "run that did work")
        return found

    @property
    def state(self) -> str:
        """The last run's state, `NO_RUN` when the DAG never ran."""
        return self.last_run.state if self.last_run else NO_RUN

    @property
    def last_success(self) -> datetime | None:
        """When the DAG's latest successful run ended (None: never)."""
        return self.last_run.last_success if self.last_run else None

    def lines(self, runs_unknown: str | None = None) -> list[str]:
        """The row as lines for a terminal (`deltaferry status`): what the topics page shows
        of it, and the alerts of its last run where its report lists them. `runs_unknown` says
        why the last run is not known (no Airflow to ask), if it is not."""
        def count(value: int | None) -> str:
            return "unknown" if value is None else f"{value:,}"

        run = self.last_run
        if run is not None:
            last = f"{run.state} ({run.at}): {run.result}"
        else:
            last = f"unknown: {runs_unknown}" if runs_unknown else "no run yet"
        waiting = ("" if self.quarantined_waiting is None
                   else f", {count(self.quarantined_waiting)} not replayed")
        out = [f"{self.name} ({self.format}, DAG {self.dag_id})"]
        if self.pattern_entry:
            out.append(f"  entry          {self.pattern_entry}")
        out.append(f"  last run       {last}")
        if run is not None:
            out.append(f"  last success   {run.last_success_text or 'never'}")
        if self.paused is not None:
            out.append(f"  paused         since {self.paused.since}: {self.paused.why()} "
                       f"(`deltaferry resume {self.name}`)")
        out += [f"  rows           {count(self.rows)}",
                f"  lag            {count(self.lag)}",
                f"  quarantined    {count(run.quarantined if run else None)} last run, "
                f"{count(self.quarantined_total)} total{waiting}",
                f"  schema         {self.schema_version or 'none yet'}"]
        work = run.work if run else None
        if work is not None and work.expectations:
            out.append("  expectations   " + ", ".join(
                f"{name} {failed:,} {verb}" for name, failed, verb in work.expectations)
                + ("" if work is run else " (the last run that read messages)"))
        for label, counts in (("rescued", work.rescued if work else {}),
                              ("left out", work.discarded if work else {})):
            if counts:
                out.append(f"  {label:<15}" + ", ".join(
                    f"{path} {n:,}" for path, n in sorted(counts.items()))
                    + ("" if work is run else " (the last run that read messages)"))
        alerts = run.alerts if run else None
        if alerts is not None:
            out.append(f"  alerts firing  {len(alerts) or 'none'}")
            out += [f"    {a.line()}" for a in alerts]
        out += [f"  not read       {note}" for note in self.notes]
        return out


def _int_or_none(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _hours_or_none(text: str | None) -> float | None:
    try:
        hours = float((text or "").strip())
    except ValueError:
        return None
    return hours if 0 < hours < 1e6 else None


@dataclass(frozen=True)
class TopicsQuery:
    """Which topics the page shows and in which order, from its query parameters.

    Shown: topics whose name contains `q` (ignoring case), whose last run is in `state`
    (`NO_RUN`: never ran; None: any), whose lag is at least `min_lag` (a lag that could not be
    read is not), and, with `stale_hours`, that did not succeed within that many hours (or
    never). Sorted by `sort` (a key of `SORTS`) in `order` (``asc`` or ``desc``), ties by name;
    an unknown lag is last in either order, a topic that never succeeded is the oldest success.
    Parameters that cannot be read are ignored rather than refused.
    """

    sort: str = "name"
    order: str = "asc"
    state: str | None = None
    q: str = ""
    min_lag: int | None = None
    stale_hours: float | None = None
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> TopicsQuery:
        """The query of the page's URL parameters ``sort``, ``order``, ``state``, ``q``,
        ``min_lag``, ``stale_hours`` and ``page`` (from 1)."""
        sort = params.get("sort", "name")
        sort = sort if sort in SORTS else "name"
        order = params.get("order", SORTS[sort])
        state = (params.get("state") or "").strip().lower() or None
        return cls(sort=sort, order=order if order in ("asc", "desc") else SORTS[sort],
                   state=state, q=(params.get("q") or "").strip()[:200],
                   min_lag=_int_or_none(params.get("min_lag")),
                   stale_hours=_hours_or_none(params.get("stale_hours")),
                   page=max(1, _int_or_none(params.get("page")) or 1))

    @property
    def filtered(self) -> bool:
        """Whether any filter is set."""
        return bool(self.state or self.q or self.min_lag is not None
                    or self.stale_hours is not None)

    def params(self, **changes: Any) -> dict[str, str]:
        """The URL parameters of this query with `changes`, defaults left out."""
        query = replace(self, **changes)
        out = {"sort": query.sort if query.sort != "name" else None,
               "order": query.order if query.order != SORTS[query.sort] else None,
               "state": query.state, "q": query.q or None,
               "min_lag": None if query.min_lag is None else str(query.min_lag),
               "stale_hours": None if query.stale_hours is None else f"{query.stale_hours:g}",
               "page": str(query.page) if query.page > 1 else None}
        return {k: v for k, v in out.items() if v is not None}

    def link(self, **changes: Any) -> str:
        """The query string (``?...``, or ``?`` for none) of this query with `changes`; a
        change of anything but the page goes back to the first page."""
        changes.setdefault("page", 1)
        return "?" + urlencode(self.params(**changes))

    def sort_link(self, key: str) -> str:
        """The link that sorts by `key`: the other order if the page is sorted by it already,
        else the key's first order."""
        order = (("desc" if self.order == "asc" else "asc") if key == self.sort
                 else SORTS[key])
        return self.link(sort=key, order=order)

    def shows_run(self, topic: str, run: LastRun | None,
                  now: datetime | None = None) -> bool:
        """Whether the topic `topic` with the last run `run` passes the filters that need no
        reading of the topic (name, state, last success)."""
        if self.q and self.q.lower() not in topic.lower():
            return False
        if self.state and (run.state if run else NO_RUN) != self.state:
            return False
        if self.stale_hours is not None:
            since = (now or datetime.now(UTC)) - timedelta(hours=self.stale_hours)
            success = run.last_success if run else None
            if success is not None and success >= since:
                return False
        return True

    def shows(self, row: TopicRow, now: datetime | None = None) -> bool:
        """Whether the page shows `row` (every filter)."""
        if not self.shows_run(row.name, row.last_run, now):
            return False
        return self.min_lag is None or (row.lag is not None and row.lag >= self.min_lag)

    def arrange(self, rows: list[TopicRow]) -> list[TopicRow]:
        """`rows` in this query's order."""
        by_name = sorted(rows, key=lambda r: r.name)
        descending = self.order == "desc"
        if self.sort == "name":
            return by_name[::-1] if descending else by_name
        if self.sort == "lag":
            known = [r for r in by_name if r.lag is not None]
            known.sort(key=lambda r: r.lag or 0, reverse=descending)
            return known + [r for r in by_name if r.lag is None]
        if self.sort == "state":
            rank = {state: i for i, state in enumerate(STATE_ORDER)}

            def state_key(row: TopicRow) -> int:
                return (len(rank) + 1 if row.last_run is None
                        else rank.get(row.state, len(rank)))

            return sorted(by_name, key=state_key, reverse=descending)
        oldest = datetime.min.replace(tzinfo=UTC)
        return sorted(by_name, key=lambda r: r.last_success or oldest, reverse=descending)


@dataclass
class TopicsPage:
    """The topics page: the topics file, the topics it shows (of the valid ones the user may
    read, `total` of them) and its bad entries; the query that chose and ordered them and the
    number of topics per last run state (before filtering), for the page's controls."""

    topics_file: str
    warehouse: str
    rows: list[TopicRow] = field(default_factory=list)
    bad_entries: list[str] = field(default_factory=list)
    query: TopicsQuery = field(default_factory=TopicsQuery)
    total: int = 0
    states: dict[str, int] = field(default_factory=dict)
    #: the topics the query shows on all its pages, and this page's first one's position (0-)
    matching: int = 0
    first: int = 0
    #: what the page says above the topics (the Airflow pool missing or not fitting the drivers)
    notices: list[str] = field(default_factory=list)

    @property
    def number(self) -> int:
        """This page's number, from 1."""
        return self.first // PAGE_SIZE + 1

    @property
    def pages(self) -> int:
        """How many pages the query's topics fill (at least one)."""
        return max(1, -(-self.matching // PAGE_SIZE))

    @property
    def state_counts(self) -> list[tuple[str, int]]:
        """`states` in the order of `STATE_ORDER`, other states after them, `NO_RUN` last."""
        rank = {state: i for i, state in enumerate(STATE_ORDER)}
        return sorted(self.states.items(), key=lambda item: (
            item[0] == NO_RUN, rank.get(item[0], len(rank)), item[0]))


def kafka_settings(env: Mapping[str, str]) -> tuple[str, dict[str, str]] | None:
    """Brokers and client options from `env`, None when no brokers are configured."""
    bootstrap = envvars.KAFKA_BOOTSTRAP.value(env)
    if not bootstrap:
        return None
    return bootstrap, parse_kafka_options(envvars.KAFKA_OPTIONS.value(env))


def topic_folders(warehouse: str, storage: Storage) -> set[str] | None:
    """The names of the folders directly under `warehouse` (the topics that have anything in
    it), in one listing; None when it cannot be listed."""
    from deltaferry.storage import S3Storage, spark_uri, split_s3_uri

    root = spark_uri(warehouse)
    try:
        if isinstance(storage, S3Storage):
            bucket, key = split_s3_uri(root)
            prefix = f"{key.rstrip('/')}/" if key else ""
            found = set()
            for page in storage.client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=prefix, Delimiter="/"):
                found |= {p["Prefix"][len(prefix):].rstrip("/")
                          for p in page.get("CommonPrefixes", [])}
            return found
        import os

        return {e.name for e in os.scandir(root) if e.is_dir()} if os.path.isdir(root) else set()
    except Exception:  # each topic is then read on its own, and says what fails
        return None


def topic_row(topic: TopicConfig, warehouse: str, env: Mapping[str, str],
              last_run: LastRun | None = None, current: Any = None,
              storage: Storage | None = None, in_warehouse: bool = True,
              lag_only: bool = False, waiting: bool = False) -> TopicRow:
    """Everything the topics page says about one topic (with `lag_only`, its lag alone; with
    `waiting`, also the quarantined messages not replayed, as the quarantine page counts them);
    what cannot be read becomes a note.

    `current` is the topic's watermarks (`TopicOffsets`) as the caller asked them for all
    topics together, or the exception that says why they could not be read; None asks the
    broker for this topic alone. `storage` reads the warehouse (default: one for `warehouse`).
    `in_warehouse` False says the topic has no folder in the warehouse (`topic_folders`): no
    table, quarantine, schema or checkpoint to read, so none is asked for.
    """
    from deltaferry.errors import DeltaferryError
    from deltaferry.kafka import topic_offsets
    from deltaferry.quarantine import counts
    from deltaferry.schema.store import SchemaStore
    from deltaferry.ui.health import table_rows

    row = TopicRow(topic.name, topic.format, topic.dag_id, topic.schedule, last_run=last_run,
                   max_lag=topic.alerts.max_lag_messages)
    cached = format_of(topic).caches_schema
    paths = TopicPaths.for_topic(warehouse, topic.name)
    storage = storage or storage_for(paths.root, env)

    def attempt(what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # one unreadable part is a note, the rest still shows
            row.notes.append(f"{what}: {problem_text(exc)}")

    def schema() -> None:
        versions = SchemaStore(paths.schema, storage).versions()
        row.schema_number = versions[-1] if versions else None
        row.schema_version = f"v{versions[-1]}" if versions else None
        if not cached:  # read with a registered version, not a cached one
            from deltaferry.ui.schema_history import registry_latest

            row.schema_number = registry_latest(topic, env)
            row.schema_version = f"registry v{row.schema_number}"

    def rows() -> None:
        row.rows = table_rows(paths.table, env)
        row.quarantined_total = table_rows(paths.quarantine, env) or 0

    def pause() -> None:
        from deltaferry.pause import paused_state

        row.paused = paused_state(storage, paths.root)
        row.paused_read = True

    def not_replayed() -> None:
        if row.quarantined_total == 0:
            row.quarantined_waiting = 0
            return
        found = counts(paths.quarantine, env)
        if found.problem:
            raise DeltaferryError(found.problem)
        row.quarantined_waiting = found.waiting

    def topic_lag() -> None:
        offsets = current
        if offsets is None:
            kafka = kafka_settings(env)
            if kafka is None:
                row.notes.append("lag: no Kafka brokers configured")
                return
            offsets = topic_offsets(kafka[0], topic.name, kafka[1], timeout=WATERMARK_TIMEOUT_S)
        if isinstance(offsets, BaseException):
            raise offsets
        read = (committed_offsets(storage, paths.checkpoint, topic.name) if in_warehouse
                else None)
        row.lag = lag(offsets, read)

    if lag_only:
        pass
    elif in_warehouse:
        attempt("schema", schema)
        attempt("table", rows)
        attempt("paused state", pause)
        if waiting and row.quarantined_total is not None:
            attempt("quarantine", not_replayed)
    else:
        row.quarantined_total = 0
        row.quarantined_waiting = 0 if waiting else None
        row.paused_read = True  # no folder, so no paused state
        if not cached:
            attempt("schema", schema)
    attempt("lag", topic_lag)
    return row


def fleet_offsets(names: list[str], env: Mapping[str, str]) -> dict[str, Any]:
    """The watermarks of the topics `names` (by name), asked of the broker together: a
    `TopicOffsets`, or the exception that says why a topic's could not be read (every topic
    gets the same one when the broker cannot be reached or none is configured)."""
    from deltaferry.errors import ConfigError, DeltaferryError
    from deltaferry.kafka import topics_offsets

    try:
        kafka = kafka_settings(env)
    except ConfigError as exc:
        return dict.fromkeys(names, exc)
    if kafka is None:
        return dict.fromkeys(names, DeltaferryError("no Kafka brokers configured"))
    if not names:
        return {}
    try:
        return dict(topics_offsets(kafka[0], names, kafka[1], timeout=WATERMARK_TIMEOUT_S))
    except Exception as exc:  # the broker did not answer: said on every row, the rest shows
        return dict.fromkeys(names, exc)


def problem_text(exc: BaseException) -> str:
    """An exception as one short line for the page (its message, cut)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def topics_page(topics: TopicsFile, env: Mapping[str, str] | None = None,
                runs: Mapping[str, LastRun] | None = None,
                visible: Callable[[TopicConfig], bool] = lambda _: True,
                query: TopicsQuery | None = None, now: datetime | None = None) -> TopicsPage:
    """The topics page for the topics file `topics`: of its `visible` topics, those `query`
    shows, in its order, with their last `runs` (by DAG id); and the file's bad entries.

    Only the topics of the query's page (`PAGE_SIZE` of them) are gathered in full: their
    watermarks in one request to the broker, which of them have a folder in the warehouse in one
    listing, and the Delta logs, schema caches and checkpoints of those by `GATHER_THREADS`
    threads sharing one storage client. The page is cut after the filters that need no reads
    (name, state, last success) and the order; a query on lag (its order, or `min_lag`) first
    reads the lag of every topic those filters leave (watermarks and checkpoints only).
    """
    import os

    env = dict(os.environ if env is None else env)
    query = query or TopicsQuery()
    runs = runs or {}
    allowed = [t for t in topics.topics if visible(t)]
    states: dict[str, int] = {}
    for topic in allowed:
        run = runs.get(topic.dag_id)
        state = run.state if run else NO_RUN
        states[state] = states.get(state, 0) + 1
    shown = [t for t in allowed if query.shows_run(t.name, runs.get(t.dag_id), now)]
    reader = TopicsReader.open(shown, env, runs)
    if query.sort == "lag" or query.min_lag is not None:
        candidates = reader.rows(shown, lag_only=True)
    else:
        candidates = [TopicRow(t.name, t.format, t.dag_id, t.schedule,
                               last_run=runs.get(t.dag_id),
                               max_lag=t.alerts.max_lag_messages) for t in shown]
    ordered = query.arrange([r for r in candidates if query.shows(r, now)])
    pages = max(1, -(-len(ordered) // PAGE_SIZE))
    first = (min(query.page, pages) - 1) * PAGE_SIZE
    by_name = {t.name: t for t in shown}
    rows = reader.rows([by_name[r.name] for r in ordered[first:first + PAGE_SIZE]])
    for row in rows:
        row.entry = topics.entry_of(by_name[row.name])
    return TopicsPage(topics.path, reader.warehouse, rows, [str(e) for e in topics.errors],
                      query, len(allowed), states, matching=len(ordered), first=first)


@dataclass
class TopicsReader:
    """What reading many topics at once shares: the warehouse and one storage client for it,
    the topics' watermarks (asked of the broker together), which topics have a folder in the
    warehouse (one listing), and their last runs. `rows` reads topics with it, each as
    `topic_row`, by `GATHER_THREADS` threads; the topics page, the metrics and `deltaferry
    status` all read through it."""

    warehouse: str
    env: Mapping[str, str]
    runs: Mapping[str, LastRun]
    offsets: dict[str, Any]
    storage: Storage
    folders: set[str] | None

    @classmethod
    def open(cls, topics: list[TopicConfig], env: Mapping[str, str],
             runs: Mapping[str, LastRun] | None = None) -> TopicsReader:
        """A reader of `topics` (their watermarks and the warehouse listing read now)."""
        warehouse = warehouse_from_env(env)
        offsets = fleet_offsets([t.name for t in topics], env)
        storage = storage_for(warehouse, env)
        try:  # an S3 client made once here, not by every thread at the same time
            getattr(storage, "client", None)
        except Exception:  # each topic then says what fails
            pass
        folders = topic_folders(warehouse, storage) if topics else set()
        return cls(warehouse, env, runs or {}, offsets, storage, folders)

    def rows(self, chosen: list[TopicConfig], lag_only: bool = False,
             waiting: bool = False) -> list[TopicRow]:
        """The rows of `chosen` (topics this reader was opened for), in their order."""
        with ThreadPoolExecutor(max_workers=max(1, min(GATHER_THREADS, len(chosen)))) as pool:
            return list(pool.map(lambda t: topic_row(
                t, self.warehouse, self.env, self.runs.get(t.dag_id), self.offsets.get(t.name),
                self.storage, in_warehouse=self.folders is None or t.name in self.folders,
                lag_only=lag_only, waiting=waiting), chosen))


def all_topic_rows(topics: list[TopicConfig], env: Mapping[str, str],
                   runs: Mapping[str, LastRun] | None = None) -> list[TopicRow]:
    """Every topic of `topics` read in full, with its quarantined messages not replayed: what
    the metrics and `deltaferry status` show (the topics page's rows, without its pages)."""
    return TopicsReader.open(topics, env, runs).rows(topics, waiting=True)


def report_of(value) -> dict | None:
    """An XCom value (a dict, or its JSON text) as a report dict; None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None
