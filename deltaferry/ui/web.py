"""The pages as a FastAPI app: ``/`` (topics; sorted and filtered by its query parameters, see
`deltaferry.ui.topics.TopicsQuery`), ``/topics/<topic>/schema|quarantine|health|runs`` and the
same pages by DAG id, ``/dags/<dag_id>/<page>``, for the tabs on a topic DAG's page; and
``/metrics``, the topics' numbers in Prometheus' text format (`deltaferry.ui.metrics`).

Nothing here imports Airflow: `create_app` is given the user dependency (the plugin passes
Airflow's own, which accepts the UI's session cookie and the REST API's bearer token and answers
401/403 otherwise), a check of whether that user may read a DAG, where the last runs come from
and the environment (the settings the tasks get, connections resolved). Every route depends on
the user, so no page answers without one.

The quarantine page lists the messages its query asks (`deltaferry.quarantine.QuarantineQuery`:
reason, partition, key, page; a bad number is a 400 saying so). A user who may trigger the
topic's DAG (`may_trigger`) also gets a replay button: a GET to ``.../quarantine/replay`` shows
what will be replayed and a form; its POST, signed for that user and DAG (`form_token`: a
cross-site form cannot forge it, and the session cookie is SameSite=Lax), starts a run of the
DAG with the ``replay`` param (`trigger`) and links to it; who asked, for which topic and what
is logged here and in Airflow's audit log. Without trigger permission there is no button and
the POST answers 403. A topic its bad messages paused (deltaferry.pause) has a Resume button on
the topics page for the same users: a POST to ``/topics/<topic>/resume`` with a form signed
the same way (for ``resume:<dag id>``) deletes its paused state; who resumed it is logged.

Topic names from the URL must be topics of the topics file (names Kafka allows, which
`deltaferry.config` validated), so no URL reaches outside the topic's folders; anything else is
404. Pages are autoescaped HTML; known secret values of the environment are blanked out of every
page as a last guard, and the answers forbid caching, sniffing, scripts and foreign framing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, tzinfo
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response

from deltaferry import env as envvars
from deltaferry import steps
from deltaferry.config import TopicConfig, TopicsFile, load_topics, validate_topic_name
from deltaferry.errors import ConfigError
from deltaferry.ui import links

log = logging.getLogger(__name__)
PAGES = (("schema", "Schema history"), ("quarantine", "Quarantine"), ("health", "Table health"),
         ("runs", "Run history"))
#: The pages that are tabs on a topic DAG's page, beside Airflow's eight, and their labels:
#: short, and three, so that the tab bar holds on one line at 1400 px with the grid open (a
#: fourth tab does not fit whatever its label); the DAG's Health tab links to its ingest runs.
DAG_TABS = {"schema": "Schema", "quarantine": "Quarantine", "health": "Health"}
#: Seconds a replay form stays valid.
FORM_TTL_S = 3600
#: What Airflow's audit log calls a replay asked on the quarantine page.
REPLAY_EVENT = "deltaferry.replay"
#: Environment variables whose names say they hold secrets (their values never reach a page).
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|JAAS|CREDENTIAL|PRIVATE|FERNET", re.I)
#: Values shorter than this are not blanked (they would match ordinary words).
_MIN_SECRET_LEN = 6
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "frame-ancestors 'self'; base-uri 'none'; form-action 'self'",
    "Referrer-Policy": "same-origin",
}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of `env` that are secrets: variables named like one, and the secret
    properties inside DELTAFERRY_KAFKA_OPTIONS (longest first, for blanking)."""
    from deltaferry.airflow.connections import is_secret_property
    from deltaferry.config import parse_kafka_options

    found = {v for k, v in env.items() if _SECRET_NAME.search(k) and v}
    try:
        options = parse_kafka_options(envvars.KAFKA_OPTIONS.value(env))
    except ConfigError:
        options = {}
    found |= {v for k, v in options.items() if is_secret_property(k) and v}
    for value in list(found):  # a JAAS line's password, as it would be quoted
        found |= set(re.findall(r'password\s*=\s*"((?:[^"\\]|\\.)*)"', value))
    return sorted((v for v in found if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """`text` with every secret value replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def count_text(value) -> str:
    """A count with thousands separators; an en dash when unknown."""
    return "–" if value is None else f"{int(value):,}"


def bytes_text(value) -> str:
    """A size in B, KiB, MiB, GiB."""
    size = float(value or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def user_name(who) -> str:
    """The signed-in user's name (Airflow's users have `get_name`)."""
    name = getattr(who, "get_name", None)
    return str(name() if callable(name) else who)


def form_token(key: bytes, who: str, scope: str, issued: int) -> str:
    """A form's token: when it was made (`issued`, seconds since the epoch) and a MAC of the
    user `who`, the `scope` (the DAG it triggers) and that time under `key`."""
    mac = hmac.new(key, f"{who}\n{scope}\n{issued}".encode(), hashlib.sha256).hexdigest()
    return f"{issued}.{mac}"


def form_token_ok(key: bytes, who: str, scope: str, token: str, now: float) -> bool:
    """Whether `token` is one `form_token` made for `who` and `scope` less than FORM_TTL_S
    ago."""
    issued, _, _ = (token or "").partition(".")
    if not issued.isdigit() or not 0 <= now - int(issued) <= FORM_TTL_S:
        return False
    return hmac.compare_digest(form_token(key, who, scope, int(issued)), token)


def resume_scope(dag_id: str) -> str:
    """The scope of a resume form's token (`form_token`) for the topic of `dag_id`: not the
    DAG id alone, so that a replay's form cannot resume and a resume's cannot replay."""
    return f"resume:{dag_id}"


def environment() -> Mapping[str, str]:
    """The default environment: this process's."""
    return os.environ


def find_topic(topics: TopicsFile, name: str) -> TopicConfig | None:
    """The valid topic called `name`, None for any other name (illegal, unknown, bad entry)."""
    try:
        validate_topic_name(name)
    except ConfigError:
        return None
    return next((t for t in topics.topics if t.name == name), None)


def find_dag_topic(topics: TopicsFile, dag_id: str) -> TopicConfig | None:
    """The valid topic whose DAG is `dag_id`, None if no topic has that DAG."""
    return next((t for t in topics.topics if t.dag_id == dag_id), None)


def create_app(user: Callable[..., Any],
               authorize: Callable[[Any, str], bool] = lambda _user, _dag_id: True,
               runs: Callable[[list[str]], Mapping] = lambda _dag_ids: {},
               env: Callable[[], Mapping[str, str]] = environment,
               history: Callable[[str, int], Sequence] = lambda _dag_id, _limit: [],
               topics_file: str | None = None,
               load: Callable[[str | None], TopicsFile] = load_topics,
               may_trigger: Callable[[Any, str], bool] = lambda _user, _dag_id: False,
               trigger: Callable[[Any, str, dict, str, str], str] | None = None,
               zone: Callable[[], tzinfo] = lambda: UTC,
               form_key: bytes | None = None,
               mount: str = "/deltaferry",
               pool: Callable[[TopicsFile], str | None] = lambda _topics: None):
    """The pages' FastAPI app. `user` is a FastAPI dependency returning the signed-in user (it
    raises 401/403 itself); `authorize(user, dag_id)` says whether that user may read a topic
    DAG; `runs(dag_ids)` gives the last run of each (`deltaferry.ui.topics.LastRun`);
    `history(dag_id, limit)` a DAG's latest `limit` runs, newest first (LastRun each); `env()`
    the settings to read the warehouse, Kafka and the registry with; `load(topics_file)` the
    topics file with its bad entries (the plugin's also has those Airflow refuses);
    `may_trigger(user, dag_id)` whether the user may trigger a DAG, and `trigger(user,
    dag_id, conf, note, event)` starts a run of it, returning its id (ValueError saying why
    not); `zone()` the time zone of the pages' times; `form_key` signs the replay form
    (default: a key of this process). `mount` is where Airflow mounts the app: the pages'
    links to Airflow's own pages (a DAG, a run, a task's log) are the root path without it.
    `pool(topics)` says what is wrong with the Airflow pool of the topics' tasks (None: nothing),
    shown above the topics."""
    from jinja2 import DictLoader, Environment, select_autoescape

    from deltaferry.quarantine import MAX_LATEST
    from deltaferry.ui.clock import times_in_text
    from deltaferry.ui.templates import TEMPLATES

    key = form_key or os.urandom(32)
    jinja = Environment(loader=DictLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    jinja.filters["count_text"] = count_text
    jinja.filters["bytes_text"] = bytes_text
    jinja.globals.update(dag_url=links.dag_url, run_url=links.run_url, task_url=links.task_url,
                         ingest_task=steps.get("ingest").task_id)
    jinja.filters["when"] = lambda value: times_in_text(value, zone())
    jinja.globals["max_size"] = MAX_LATEST
    app = FastAPI(title="deltaferry", dependencies=[Depends(user)], docs_url=None,
                  redoc_url=None, openapi_url=None)

    def html(request: Request, template: str, status_code: int = 200, **values) -> HTMLResponse:
        values.setdefault("show_tabs", True)
        root = request.scope.get("root_path", "")
        text = jinja.get_template(template).render(
            root=root, airflow=links.airflow_base(root, mount), pages=PAGES, **values)
        return HTMLResponse(redact(text, secret_values(env())), status_code=status_code,
                            headers=HEADERS)

    def refuse(request: Request, status: int, title: str, message: str,
               show_tabs: bool = True) -> HTMLResponse:
        return html(request, "error.html", status, status=status, title=title, message=message,
                    show_tabs=show_tabs)

    def here_of(request: Request, topic: TopicConfig, show_tabs: bool) -> str:
        """The quarantine page's address, as the user opened it (by topic or by DAG)."""
        root = request.scope.get("root_path", "")
        return (f"{root}/topics/{quote(topic.name, safe='')}/quarantine" if show_tabs
                else f"{root}/dags/{quote(topic.dag_id, safe='')}/quarantine")

    def allowed(request: Request, who, topic: TopicConfig | None, show_tabs: bool,
                what: str) -> HTMLResponse | None:
        """The refusal of `topic`'s pages to `who` (404: not a topic; 403: may not read its
        DAG), None when they may read them."""
        if topic is None:
            return refuse(request, 404, "Not a deltaferry topic",
                          f"{what} is not a topic of the topics file.", show_tabs)
        if not authorize(who, topic.dag_id):
            return refuse(request, 403, "Not allowed",
                          f"You may not read the DAG {topic.dag_id}.", show_tabs)
        return None

    def topic_page(request: Request, who, topic: TopicConfig | None, page: str,
                   show_tabs: bool, what: str) -> HTMLResponse:
        refused = allowed(request, who, topic, show_tabs, what)
        if refused is not None or topic is None:
            return refused or refuse(request, 404, "Not a deltaferry topic", what, show_tabs)
        context = dict(topic=topic.name, page=page, show_tabs=show_tabs,
                       here=here_of(request, topic, show_tabs), dag_id=topic.dag_id)
        try:
            if page == "quarantine":
                return quarantine_view(request, who, topic, context)
            return render_topic_page(request, topic, page, context)
        except Exception as exc:  # a system that does not answer: say which, not a traceback
            from deltaferry.ui.topics import problem_text

            problem = redact(problem_text(exc), secret_values(env()))
            log.warning("deltaferry %s page of %s: %s: %s", page, topic.name,
                        type(exc).__name__, problem)
            return refuse(request, 503, "Cannot read it now", problem, show_tabs)

    def render_topic_page(request: Request, topic: TopicConfig, page: str,
                          context: dict) -> HTMLResponse:
        settings = env()
        show_tabs = context["show_tabs"]
        if page == "schema":
            return html(request, "schema.html", h=schema_of(topic, settings), **context)
        if page == "health":
            from deltaferry.state import SMALL_FILE_BYTES

            return html(request, "health.html", tables=health_of(topic, settings),
                        due=maintenance_due(topic, settings), small_file_bytes=SMALL_FILE_BYTES,
                        optimize_min_files=topic.optimize_min_files, **context)
        if page == "runs":
            from deltaferry.ui.runs import RUNS_SHOWN, runs_page

            return html(request, "runs.html",
                        r=runs_page(topic.dag_id, history(topic.dag_id, RUNS_SHOWN)), **context)
        return refuse(request, 404, "No such page",
                      f"There is no page {page!r}; the pages are "
                      f"{', '.join(key for key, _ in PAGES)}.", show_tabs)

    def quarantine_view(request: Request, who, topic: TopicConfig, context: dict
                        ) -> HTMLResponse:
        from deltaferry.quarantine import PageParameterError, QuarantineQuery

        try:
            query = QuarantineQuery.from_params(request.query_params)
        except PageParameterError as exc:
            return refuse(request, 400, "Bad page parameter",
                          f"{exc}; the page's parameters are reason, partition, key (the "
                          f"messages to list), page (from 1) and size (1 to {MAX_LATEST}).",
                          context["show_tabs"])
        return html(request, "quarantine.html", q=quarantine_of(topic, env(), query),
                    can_replay=may_trigger(who, topic.dag_id), **context)

    def replay_request(request: Request, who, topic: TopicConfig | None, show_tabs: bool,
                       what: str, fields: Mapping[str, str]) -> dict | HTMLResponse:
        """The replay's topic, filter and page context for `who`, or the refusal: 404/403 as
        the pages, 403 without trigger permission, 400 for a bad filter."""
        from deltaferry.quarantine import PageParameterError, QuarantineQuery

        refused = allowed(request, who, topic, show_tabs, what)
        if refused is not None or topic is None:
            return refused or refuse(request, 404, "Not a deltaferry topic", what, show_tabs)
        if not may_trigger(who, topic.dag_id):
            return refuse(request, 403, "Not allowed",
                          f"You may not trigger the DAG {topic.dag_id}, whose runs replay the "
                          "quarantine.", show_tabs)
        try:
            query = QuarantineQuery.from_params(fields)
        except PageParameterError as exc:
            return refuse(request, 400, "Bad replay filter", str(exc), show_tabs)
        return dict(topic=topic.name, page="quarantine", show_tabs=show_tabs,
                    here=here_of(request, topic, show_tabs), dag_id=topic.dag_id,
                    which=query.filter, back=query.link(page=1))

    def replay_confirm(request: Request, who, topic: TopicConfig | None, show_tabs: bool,
                       what: str) -> HTMLResponse:
        from deltaferry.quarantine import QuarantineQuery

        context = replay_request(request, who, topic, show_tabs, what, request.query_params)
        if not isinstance(context, dict):
            return context
        assert topic is not None
        try:
            found = quarantine_of(topic, env(), QuarantineQuery(context["which"], size=1))
        except Exception as exc:  # as the pages: say which system does not answer
            from deltaferry.ui.topics import problem_text

            return refuse(request, 503, "Cannot read it now",
                          redact(problem_text(exc), secret_values(env())), show_tabs)
        token = form_token(key, user_name(who), topic.dag_id, int(time.time()))
        return html(request, "replay.html", waiting=found.matching_waiting, form_token=token,
                    **context)

    def replay_start(request: Request, who, topic: TopicConfig | None, show_tabs: bool,
                     what: str, fields: Mapping[str, str]) -> HTMLResponse:
        context = replay_request(request, who, topic, show_tabs, what, fields)
        if not isinstance(context, dict):
            return context
        assert topic is not None
        name = user_name(who)
        if not form_token_ok(key, name, topic.dag_id, fields.get("form_token", ""),
                             time.time()):
            return refuse(request, 403, "Not this page's form",
                          "The replay form was not made for you by this page, or is over an "
                          "hour old: open the quarantine page again.", show_tabs)
        if trigger is None:
            return refuse(request, 503, "No Airflow to run it",
                          "Replaying from the page needs Airflow; run deltaferry quarantine "
                          f"replay {topic.name}.", show_tabs)
        which = context["which"]
        note = (f"Replay of the quarantine of {topic.name} ({which.text()}), asked by {name} "
                "on deltaferry's quarantine page.")
        try:
            run_id = trigger(who, topic.dag_id, {"replay": which.as_param()}, note,
                             REPLAY_EVENT)
        except ValueError as exc:
            return refuse(request, 409, "The replay did not start", str(exc), show_tabs)
        log.info("deltaferry replay: %s started run %s of %s to replay the quarantine of %s "
                 "(%s)", name, run_id, topic.dag_id, topic.name, which.text())
        root = request.scope.get("root_path", "")
        ui_root = root.rsplit("/", 1)[0]  # the app is mounted one level below Airflow's UI
        run_url = (f"{ui_root}/dags/{quote(topic.dag_id, safe='')}/runs/"
                   f"{quote(run_id, safe='')}")
        return html(request, "replay.html", run_id=run_id, run_url=run_url, **context)

    @app.get("/topics/{topic}/quarantine/replay", response_class=HTMLResponse)
    def replay_form_by_topic(request: Request, topic: str, who=Depends(user)):
        return replay_confirm(request, who, find_topic(load(topics_file), topic), True, "This")

    @app.get("/dags/{dag_id}/quarantine/replay", response_class=HTMLResponse)
    def replay_form_by_dag(request: Request, dag_id: str, who=Depends(user)):
        return replay_confirm(request, who, find_dag_topic(load(topics_file), dag_id), False,
                              "The DAG's topic")

    @app.post("/topics/{topic}/quarantine/replay", response_class=HTMLResponse)
    async def replay_by_topic(request: Request, topic: str, who=Depends(user)):
        fields = {k: str(v) for k, v in (await request.form()).items()}
        return await run_in_threadpool(
            lambda: replay_start(request, who, find_topic(load(topics_file), topic), True,
                                 "This", fields))

    @app.post("/dags/{dag_id}/quarantine/replay", response_class=HTMLResponse)
    async def replay_by_dag(request: Request, dag_id: str, who=Depends(user)):
        fields = {k: str(v) for k, v in (await request.form()).items()}
        return await run_in_threadpool(
            lambda: replay_start(request, who, find_dag_topic(load(topics_file), dag_id),
                                 False, "The DAG's topic", fields))

    @app.get("/", response_class=HTMLResponse)
    def topics_index(request: Request, who=Depends(user)):
        from deltaferry.ui.topics import TopicsQuery, topics_page

        try:
            topics = load(topics_file)
        except ConfigError as exc:  # the file itself is unreadable: say so, as the DAGs do
            topics = TopicsFile(str(topics_file or envvars.TOPICS.value()),
                                errors=[exc])
        allowed = [t for t in topics.topics if authorize(who, t.dag_id)]
        names = {t.name for t in allowed}
        page = topics_page(topics, env(), runs([t.dag_id for t in allowed]),
                           visible=lambda t: t.name in names,
                           query=TopicsQuery.from_params(request.query_params))
        page.notices += filter(None, [pool(topics)])
        issued = int(time.time())
        return html(request, "topics.html", page=page,
                    can_resume=lambda dag_id: may_trigger(who, dag_id),
                    resume_token=lambda dag_id: form_token(key, user_name(who),
                                                           resume_scope(dag_id), issued))

    def resume_start(request: Request, who, topic: TopicConfig | None,
                     fields: Mapping[str, str]) -> HTMLResponse:
        """Resume a paused topic (deltaferry.pause.resume) for `who`, who may trigger its DAG,
        with the form the topics page signed for them; 404/403 as the replay."""
        from deltaferry.pause import resume
        from deltaferry.storage import storage_for

        refused = allowed(request, who, topic, True, "This")
        if refused is not None or topic is None:
            return refused or refuse(request, 404, "Not a deltaferry topic", "This")
        if not may_trigger(who, topic.dag_id):
            return refuse(request, 403, "Not allowed",
                          f"You may not trigger the DAG {topic.dag_id}, so you may not resume "
                          "its topic.")
        name = user_name(who)
        if not form_token_ok(key, name, resume_scope(topic.dag_id),
                             fields.get("form_token", ""), time.time()):
            return refuse(request, 403, "Not this page's form",
                          "The resume form was not made for you by the topics page, or is over "
                          "an hour old: open the topics page again.")
        settings = env()
        root = paths_of(topic, settings).root
        try:
            paused = resume(storage_for(root, settings), root)
        except Exception as exc:  # the warehouse does not answer: say so, not a traceback
            from deltaferry.ui.topics import problem_text

            return refuse(request, 503, "Cannot resume it now",
                          redact(problem_text(exc), secret_values(settings)))
        log.info("deltaferry resume: %s resumed topic %s (%s)", name, topic.name,
                 f"paused since {paused.since}: {paused.why()}" if paused else "not paused")
        return html(request, "resumed.html", topic=topic.name, paused=paused)

    @app.post("/topics/{topic}/resume", response_class=HTMLResponse)
    async def resume_by_topic(request: Request, topic: str, who=Depends(user)):
        fields = {k: str(v) for k, v in (await request.form()).items()}
        return await run_in_threadpool(
            lambda: resume_start(request, who, find_topic(load(topics_file), topic), fields))

    @app.get("/metrics")
    def metrics(who=Depends(user)) -> Response:
        """Every topic the user may read, as Prometheus' text format; 503 naming the file when
        the topics file cannot be read (a scrape that fails, rather than no topics)."""
        from deltaferry.ui.metrics import CONTENT_TYPE, exposition
        from deltaferry.ui.topics import all_topic_rows

        try:
            topics = load(topics_file)
        except ConfigError as exc:
            log.warning("deltaferry metrics: %s", exc)
            return Response(redact(str(exc), secret_values(env())) + "\n", 503,
                            media_type="text/plain", headers=HEADERS)
        allowed = [t for t in topics.topics if authorize(who, t.dag_id)]
        settings = env()
        body = exposition(all_topic_rows(allowed, settings, runs([t.dag_id for t in allowed])))
        return Response(redact(body.decode(), secret_values(settings)), media_type=CONTENT_TYPE,
                        headers=HEADERS)

    @app.get("/topics/{topic}/{page}", response_class=HTMLResponse)
    def by_topic(request: Request, topic: str, page: str, who=Depends(user)):
        return topic_page(request, who, find_topic(load(topics_file), topic), page, True,
                          "This")

    @app.get("/dags/{dag_id}/{page}", response_class=HTMLResponse)
    def by_dag(request: Request, dag_id: str, page: str, who=Depends(user)):
        return topic_page(request, who, find_dag_topic(load(topics_file), dag_id), page,
                          False, "The DAG's topic")

    def schema_of(topic: TopicConfig, settings: Mapping[str, str]):
        from deltaferry.schema.store import SchemaStore
        from deltaferry.storage import storage_for
        from deltaferry.ui.schema_history import schema_history

        paths = paths_of(topic, settings)
        return schema_history(topic, SchemaStore(paths.schema, storage_for(paths.schema,
                                                                           settings)), settings,
                              table=paths.table, root=paths.root)

    def quarantine_of(topic: TopicConfig, settings: Mapping[str, str], query):
        from deltaferry.config import warehouse_from_env
        from deltaferry.quarantine import quarantine_page

        return quarantine_page(paths_of(topic, settings).quarantine, query, settings,
                               warehouse=warehouse_from_env(settings))

    def health_of(topic: TopicConfig, settings: Mapping[str, str]):
        from deltaferry.state import maintenance_record
        from deltaferry.storage import storage_for
        from deltaferry.ui.health import table_health

        paths = paths_of(topic, settings)
        vacuumed = maintenance_record(storage_for(paths.root, settings), paths.root).get(
            "last_vacuum")
        return [table_health("table", paths.table, settings,
                             f"{vacuumed} (deltaferry's record)" if vacuumed else None),
                table_health("quarantine", paths.quarantine, settings)]

    return app


def maintenance_due(topic: TopicConfig, settings: Mapping[str, str]) -> dict[str, str]:
    """When the topic's next OPTIMIZE and VACUUM are due (``optimize``, ``vacuum``), in the
    words of the rules the DAG's maintenance tasks decide by (`deltaferry.plan`): due at the
    DAG's next run, or why not yet."""
    from deltaferry.plan import optimize_skip, vacuum_skip
    from deltaferry.state import existing_tables, last_vacuum
    from deltaferry.storage import storage_for

    paths = paths_of(topic, settings)
    tables = existing_tables(paths, settings)
    next_run = f"at the DAG's next run ({topic.schedule or 'as scheduled'})"
    optimize = optimize_skip(topic, tables)
    vacuum = vacuum_skip(topic, tables, last_vacuum(storage_for(paths.root, settings),
                                                    paths.root))
    return {
        "optimize": (f"due {next_run}: a table has {topic.optimize_min_files} small files or "
                     "more (optimize_min_files)") if optimize is None
        else f"not due: {optimize.reason}",
        "vacuum": f"due {next_run}" if vacuum is None else f"not due: {vacuum.reason}",
    }


def paths_of(topic: TopicConfig, settings: Mapping[str, str]):
    """The topic's locations under the warehouse `settings` name."""
    from deltaferry.config import warehouse_from_env
    from deltaferry.paths import TopicPaths

    return TopicPaths.for_topic(warehouse_from_env(settings), topic.name)
