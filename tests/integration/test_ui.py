"""deltaferry's pages in the Airflow UI, in a real browser against a real Airflow.

One Airflow (the project's launcher: api-server, scheduler, dag-processor, triggerer) runs a JSON
topic whose warehouse is a bucket of the stack's S3 server and whose broker is read through its
SASL listener, so the api-server's environment holds a real S3 secret and SASL password. The
scheduler runs the topic's DAG twice on real messages: the second batch brings a new field
(schema v2) and more bad messages. Then headless chromium (Debian's, through chromium-driver)
logs in on Airflow's login page and opens every page, as a person would: the plugin's entry in
the navigation, the topics table, the schema diff, the quarantine's reasons and escaped
previews, the table's health, and a tab on the DAG's own page. Requests without credentials or
with a bad token are refused; unknown or illegal topic names are 404; no page holds a secret.
Screenshots go to artifacts/ui/.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.home import airflow_env
from deltaferry_dev.airflow.rest import follow, wait_until
from deltaferry_dev.stack.process import free_ports

pytestmark = pytest.mark.integration

ARTIFACTS = REPO_ROOT / "artifacts" / "ui"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
BAD_ENTRY = "bad_entry_schedule"
#: Topics besides the ingested one, never run, with this many messages (their lag).
NEVER_RUN = {"many": 5, "few": 2}
#: Never run, with 5 messages and an alert threshold of 3: its lag is a problem on the page.
LAG_ALERTED = "many"
XSS = "<script>document.title='pwned'</script>"


def first_batch():
    for i in range(5):
        yield f"k{i}", {"id": i, "status": "new"}
    yield "k1", {"id": 1, "status": "paid"}
    yield "xss", XSS.encode()                      # not JSON: quarantined, shown escaped
    yield "bin", b"\xff\xfe\x00<b>binary"          # not UTF-8: quarantined, shown as hex


def second_batch():
    for i in (5, 6, 0):
        yield f"k{i}", {"id": i, "status": "new", "coupon": "SPRING"}
    yield "late", b"{not json"


@pytest.fixture(scope="module")
def ui_airflow(stack_env, tmp_path_factory):
    """A running local Airflow whose tasks and api-server reach the topic through the SASL
    listener and the warehouse in a bucket; its topics file holds the topic and a bad entry."""
    from deltaferry.storage import S3Settings

    folder = tmp_path_factory.mktemp("ui")
    topic = f"ui-{uuid.uuid4().hex[:8]}"
    create_topic(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=2)
    for suffix, count in NEVER_RUN.items():
        create_topic(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], f"{topic}_{suffix}", partitions=2)
        produce(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], f"{topic}_{suffix}",
                [(f"k{i}", {"id": i}) for i in range(count)])
    bucket = f"ui-{uuid.uuid4().hex[:10]}"
    S3Settings.from_env(stack_env).client().create_bucket(Bucket=bucket)
    topics_file = folder / "topics.yaml"
    # daily: the scheduler's next run (nothing new: idle) comes at midnight, not at the next
    # hour, which a slow machine's module could straddle (the tests expect the runs they made)
    topics_file.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n"
                           f"    schedule: \"@daily\"\n"
                           f"  - name: {BAD_ENTRY}\n    schedule: every hour\n"
                           + "".join(f"  - name: {topic}_{suffix}\n"
                                     + (f"    alerts:\n      max_lag_messages: {count - 2}\n"
                                        if suffix == LAG_ALERTED else "")
                                     for suffix, count in NEVER_RUN.items()))
    (port,) = free_ports(1)
    username = stack_env["DELTAFERRY_KAFKA_SASL_USERNAME"]
    password = stack_env["DELTAFERRY_KAFKA_SASL_PASSWORD"]
    env = {**os.environ, **stack_env,
           "DELTAFERRY_KAFKA_BOOTSTRAP": stack_env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"],
           "DELTAFERRY_KAFKA_OPTIONS": json.dumps({
               "security.protocol": "SASL_PLAINTEXT",
               "sasl.mechanism": stack_env["DELTAFERRY_KAFKA_SASL_MECHANISM"],
               "sasl.jaas.config": f'{SCRAM} required username="{username}" '
                                   f'password="{password}";'}),
           "DELTAFERRY_TOPICS": str(topics_file),
           "DELTAFERRY_WAREHOUSE": f"s3://{bucket}/warehouse",
           "DELTAFERRY_SPARK_MASTER": "local[2]", "AIRFLOW__API__PORT": str(port)}
    running = services.up(folder / "home", env=env)
    try:
        yield running, topic, airflow_env(folder / "home", base=env)
    finally:
        services.down(folder / "home")


def run_to_success(client, dag_id, run_id) -> dict:
    run = follow(client, dag_id, run_id, tell=print)
    if run["state"] != "success":
        tasks = client.tasks(dag_id, run_id)
        logs = "\n".join(f"--- {t}\n{client.log(dag_id, run_id, t)[-3000:]}" for t in tasks)
        pytest.fail(f"run {run_id} {run['state']}:\n{logs}")
    return run


@pytest.fixture(scope="module")
def two_runs(ui_airflow, stack_env):
    """The topic's DAG run by the scheduler on the first batch, then triggered on the second."""
    running, topic, _ = ui_airflow
    client = running.client()
    dag_id = f"ingest_{topic}"
    wait_until(lambda: client.dag(dag_id), 180, what=f"{dag_id} parsed")
    produce(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, list(first_batch()))
    client.set_paused(dag_id, False)
    scheduled = wait_until(lambda: client.runs(dag_id), 120, interval=1.0,
                           what="a scheduled run")[0]
    run_to_success(client, dag_id, scheduled["dag_run_id"])
    produce(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, list(second_batch()))
    run = run_to_success(client, dag_id, client.trigger(dag_id)["dag_run_id"])
    return running, topic, run


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through Debian's chromium-driver (no driver download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "run scripts/ensure-browser.sh (make test does)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    session.set_page_load_timeout(60)
    yield session
    session.quit()


def secrets(stack_env) -> dict[str, str]:
    return {name: stack_env[name] for name in ("AWS_SECRET_ACCESS_KEY",
                                               "DELTAFERRY_KAFKA_SASL_PASSWORD")}


def shot(browser, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    browser.save_screenshot(str(path))
    return path


def text_of(browser, css: str, timeout: float = 30.0) -> str:
    """The visible text of the first element matching `css`, once it is there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout).until(
        ec.visibility_of_element_located((By.CSS_SELECTOR, css))).text


def log_in(browser, running) -> None:
    """Log in on Airflow's own login page (once per browser session)."""
    from selenium.webdriver.common.by import By

    if any(c["name"] == "_token" for c in browser.get_cookies()):
        return
    browser.get(running.url + "/")
    text_of(browser, "input[name=username]")
    browser.find_element(By.CSS_SELECTOR, "input[name=username]").send_keys(services.USER)
    browser.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(running.password())
    shot(browser, "0-login")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_until(lambda: any(c["name"] == "_token" for c in browser.get_cookies()), 30,
               interval=0.5, what="the login's session cookie")


def test_requests_without_a_valid_airflow_login_are_refused(ui_airflow):
    running, topic, _ = ui_airflow
    base = f"{running.url}/deltaferry"
    for path in ("/", f"/topics/{topic}/schema", f"/topics/{topic}/quarantine",
                 f"/topics/{topic}/health", f"/dags/ingest_{topic}/health",
                 f"/topics/{topic}/runs", "/metrics"):
        assert httpx.get(base + path).status_code == 401, path
        bad = httpx.get(base + path, headers={"Authorization": "Bearer not-a-token"})
        assert bad.status_code in (401, 403), (path, bad.status_code)
        forged = httpx.get(base + path, cookies={"_token": "eyJhbGciOiJIUzUxMiJ9.e30.x"})
        assert forged.status_code in (401, 403), (path, forged.status_code)
        assert topic not in bad.text and topic not in forged.text


def test_pages_in_a_real_browser(two_runs, browser, stack_env):
    from selenium.webdriver.common.by import By

    running, topic, last_run = two_runs
    client = running.client()

    # The REST API's bearer token opens the pages too; names are checked; no page has a secret.
    token = {"Authorization": f"Bearer {client._headers()['Authorization'].split()[1]}"}
    base = f"{running.url}/deltaferry"
    pages = {path: httpx.get(base + path, headers=token, timeout=60) for path in (
        "/", f"/topics/{topic}/schema", f"/topics/{topic}/quarantine", f"/topics/{topic}/health",
        f"/dags/ingest_{topic}/schema")}
    for path, answer in pages.items():
        assert answer.status_code == 200, (path, answer.text[:500])
        for name, value in secrets(stack_env).items():
            assert value not in answer.text, f"{name} on {path}"
    for path in ("/topics/no_such_topic/schema", f"/topics/{BAD_ENTRY}/schema",
                 "/topics/..%2F..%2Fetc/schema", "/topics/a%20b/health", "/dags/other_dag/health",
                 f"/topics/{topic}/..%2F_lock"):
        assert httpx.get(base + path, headers=token).status_code == 404, path

    # Log in on Airflow's own login page.
    log_in(browser, running)

    # The plugin's entry is in the navigation; it shows the topics page in the UI.
    entry = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR,
                                                     "a[href$='plugin/deltaferry']"), 60,
                       interval=0.5, what="the deltaferry entry in the navigation")
    entry[0].click()
    frame = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "iframe[title=deltaferry]"),
                       30, interval=0.5, what="the topics page's frame")[0]
    browser.switch_to.frame(frame)
    row = f"tr[data-topic='{topic}']"
    assert text_of(browser, f"{row} td.rows") == "7"       # k0..k6, from the Delta log
    assert text_of(browser, f"{row} td.lag").startswith("0")  # watermarks vs the checkpoint
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, f"{row} td")]
    assert cells[1] == "json" and "success" in text_of(browser, f"{row} td.state")
    success = text_of(browser, f"{row} td.last-success")
    assert success.startswith("20") and success.endswith("UTC")
    assert text_of(browser, f"{row} td.work-quarantined") == "1"   # the last run's
    assert text_of(browser, f"{row} td.quarantined-total") == "3"
    assert text_of(browser, f"{row} td.schema") == "v2"
    assert text_of(browser, f"{row} td.work-read") == "4"  # the last run's ingest read
    assert BAD_ENTRY in text_of(browser, "li.bad-entry")
    assert "every hour" in text_of(browser, "li.bad-entry")
    browser.switch_to.default_content()
    shot(browser, "1-topics")

    # Schema history: both versions, the added field in the infer step's words, the tree.
    browser.get(f"{base}/topics/{topic}/schema")
    versions = text_of(browser, "table#versions")
    assert "v2" in versions and "v1" in versions
    changes = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#versions td.changes")]
    assert changes[0] == "added: coupon"
    assert changes[1].startswith("initial schema, 2 fields: ")
    assert "coupon string" in text_of(browser, "#tree")
    shot(browser, "2-schema")

    # Quarantine: counts per reason, the reason text, the bad value escaped, binary as hex.
    browser.get(f"{base}/topics/{topic}/quarantine")
    reasons = text_of(browser, "table#reasons")
    assert "value is not valid JSON" in reasons
    assert "value is not valid UTF-8 text" in reasons
    messages = text_of(browser, "table#messages")
    assert XSS in messages                                 # shown as text...
    assert browser.find_elements(By.TAG_NAME, "script") == []  # ...never run
    assert browser.title != "pwned"
    assert "not UTF-8:\nff fe 00 3c 62 3e 62 69 6e 61 72 79 ...<b>binary" in messages
    assert "p" in messages and "late" in messages
    shot(browser, "3-quarantine")

    # Table health: the Delta version, the rows, the history.
    browser.get(f"{base}/topics/{topic}/health")
    assert text_of(browser, "#facts-table dd.rows") == "7"
    assert int(text_of(browser, "#facts-table dd.version")) >= 2
    assert "MERGE" in text_of(browser, "table.history")
    shot(browser, "4-health")

    # The tab on the DAG's own page: its sandboxed frame loads the page with the session.
    browser.get(f"{running.url}/dags/ingest_{topic}/plugin/deltaferry-quarantine")
    frame = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "iframe[title=Quarantine]"),
                       30, interval=0.5, what="the DAG page's quarantine tab")[0]
    browser.switch_to.frame(frame)
    assert "value is not valid JSON" in text_of(browser, "table#reasons")
    browser.switch_to.default_content()
    shot(browser, "5-dag-tab")
    for name, value in secrets(stack_env).items():
        assert value not in browser.page_source, name
    assert last_run["state"] == "success"


def shown_topics(browser) -> list[str]:
    """The topics of the topics table, in the order the page shows them."""
    from selenium.webdriver.common.by import By

    text_of(browser, "table#topics")
    return [r.get_attribute("data-topic")
            for r in browser.find_elements(By.CSS_SELECTOR, "table#topics tr[data-topic]")]


def click(browser, css: str) -> None:
    """Click the element `css` and wait for the page it opens."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    old = browser.find_element(By.CSS_SELECTOR, "table#topics")
    browser.find_element(By.CSS_SELECTOR, css).click()
    WebDriverWait(browser, 30).until(ec.staleness_of(old))


def test_topics_page_sorts_and_filters_by_clicks(two_runs, browser):
    """The topics page's header controls, clicked in the topics page's frame in the UI: sort by
    lag (a second click turns the order), by state, filter by state, by name and lag (the
    form), by last success; the rows shown are the ones asked for, in that order."""
    from selenium.webdriver.common.by import By

    running, topic, _ = two_runs
    many, few = f"{topic}_many", f"{topic}_few"   # never run: lag 5 and 2; the topic's lag 0
    log_in(browser, running)
    browser.get(running.url + "/plugin/deltaferry")
    frame = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "iframe[title=deltaferry]"),
                       30, interval=0.5, what="the topics page's frame")[0]
    browser.switch_to.frame(frame)
    assert shown_topics(browser) == sorted([topic, many, few])      # by name at first

    click(browser, "a#sort-lag")                                     # biggest lag first
    assert shown_topics(browser) == [many, few, topic]
    assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, "td.lag")] == ["5", "2", "0"]
    click(browser, "a#th-sort-lag")                                  # the column: turned round
    assert shown_topics(browser) == [topic, few, many]

    click(browser, "a#sort-state")                                   # runs first, no run last
    assert shown_topics(browser)[0] == topic

    click(browser, "a#state-none")                                   # never ran, still by state
    assert shown_topics(browser) == [few, many]
    click(browser, "a#sort-lag")                                     # the filter is kept
    assert shown_topics(browser) == [many, few]
    assert text_of(browser, "#shown").startswith("2 of 3 ")

    click(browser, "a#state-success")
    assert shown_topics(browser) == [topic]
    assert text_of(browser, f"tr[data-topic='{topic}'] td.last-success")[:2] == "20"

    click(browser, "a#state-all")                                    # the form: name and lag
    query = browser.find_element(By.CSS_SELECTOR, "#filter-q")
    query.clear()
    query.send_keys("_")
    browser.find_element(By.CSS_SELECTOR, "#filter-min-lag").send_keys("3")
    click(browser, "#filter-apply")
    assert shown_topics(browser) == [many]

    click(browser, "a#filter-clear")
    click(browser, "a#sort-last_success")                            # never succeeded: oldest
    assert shown_topics(browser) == [few, many, topic]
    browser.switch_to.default_content()
    shot(browser, "6-topics-sorted")


def bearer(running) -> dict[str, str]:
    """The REST API's bearer token of the UI's user, as a header."""
    return {"Authorization": running.client()._headers()["Authorization"]}


def test_metrics_equal_the_table_and_quarantine_read_with_delta_rs(two_runs, ui_airflow,
                                                                    stack_env):
    from datetime import UTC, datetime

    from deltalake import DeltaTable
    from prometheus_client.parser import text_string_to_metric_families

    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths

    running, topic, _ = two_runs
    env = ui_airflow[2]
    answer = httpx.get(f"{running.url}/deltaferry/metrics", headers=bearer(running), timeout=60)
    assert answer.status_code == 200, answer.text[:500]
    assert answer.headers["content-type"].startswith("text/plain; version=")
    values = {(s.name, s.labels["topic"]): s.value
              for family in text_string_to_metric_families(answer.text)
              for s in family.samples}
    assert {s.labels["format"] for family in text_string_to_metric_families(answer.text)
            for s in family.samples} == {"json"}

    paths = TopicPaths.for_topic(env["DELTAFERRY_WAREHOUSE"], topic)

    def read(uri: str):
        return DeltaTable(delta_rs_uri(uri),
                          storage_options=storage_options(uri, env)).to_pyarrow_table()

    table, quarantine = read(paths.table), read(paths.quarantine)
    waiting = quarantine.column("replayed_at").null_count
    assert values[("deltaferry_table_rows", topic)] == table.num_rows == 7
    assert values[("deltaferry_quarantined_rows", topic)] == quarantine.num_rows == 3
    assert values[("deltaferry_quarantined_not_replayed_rows", topic)] == waiting == 3
    assert values[("deltaferry_lag_messages", topic)] == 0
    assert values[("deltaferry_schema_version", topic)] == 2
    assert values[("deltaferry_last_run_messages", topic)] == 4      # the second batch
    assert values[("deltaferry_last_run_quarantined", topic)] == 1
    assert values[("deltaferry_last_run_failed", topic)] == 0
    assert values[("deltaferry_last_ingest_seconds", topic)] > 0
    success = values[("deltaferry_last_success_timestamp_seconds", topic)]
    assert 0 < datetime.now(UTC).timestamp() - success < 3600
    # the topics never run: their lag, nothing quarantined, no table to count
    for suffix, count in NEVER_RUN.items():
        assert values[("deltaferry_lag_messages", f"{topic}_{suffix}")] == count
        assert values[("deltaferry_quarantined_rows", f"{topic}_{suffix}")] == 0
        assert ("deltaferry_table_rows", f"{topic}_{suffix}") not in values
    assert not any(name == "deltaferry_table_rows" and t == BAD_ENTRY for name, t in values)
    for name, value in secrets(stack_env).items():
        assert value not in answer.text, name


def test_run_history_charts_in_a_real_browser(two_runs, browser):
    from selenium.webdriver.common.by import By

    running, topic, _ = two_runs
    log_in(browser, running)
    browser.get(f"{running.url}/deltaferry/topics/{topic}/runs")
    text_of(browser, "svg#chart-messages")
    charts = {key: browser.find_element(By.CSS_SELECTOR, f"svg#chart-{key}")
              for key in ("messages", "seconds", "lag", "quarantined")}
    for key, chart in charts.items():   # both runs reported: a mark each, drawn on screen
        assert chart.get_attribute("data-points") == "2", key
        assert chart.size["width"] > 300 and chart.size["height"] > 100, key
    first, second = charts["messages"].find_elements(By.CSS_SELECTOR, "rect.bar")
    assert "8 messages" in first.get_attribute("textContent")        # the first batch
    assert "4 messages" in second.get_attribute("textContent")
    assert float(first.get_attribute("height")) > float(second.get_attribute("height")) > 0
    assert first.rect["x"] < second.rect["x"]                         # oldest on the left
    phases = charts["seconds"].find_elements(By.CSS_SELECTOR, "rect.bar")
    assert len(phases) >= 4 and all(p.rect["height"] >= 0 for p in phases)
    assert "kafka read" in text_of(browser, "p.legend")
    assert len(charts["lag"].find_elements(By.CSS_SELECTOR, "circle.point")) == 2
    assert len(charts["lag"].find_elements(By.CSS_SELECTOR, "polyline.line")) == 1
    quarantined = charts["quarantined"].find_elements(By.CSS_SELECTOR, "rect.bar")
    assert [q.get_attribute("textContent").split(": ")[-1] for q in quarantined] == [
        "2 messages", "1 messages"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "table#runs tr")) == 3
    assert browser.find_elements(By.TAG_NAME, "script") == []
    shot(browser, "7-runs")

    # On the DAG's own page: the Health tab's link, the charts in its sandboxed frame.
    browser.get(f"{running.url}/dags/ingest_{topic}/plugin/deltaferry-health")
    frame = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR,
                                                     "iframe[title='Health']"),
                       30, interval=0.5, what="the DAG page's health tab")[0]
    browser.switch_to.frame(frame)
    browser.find_element(By.CSS_SELECTOR, "a#runs-link").click()
    text_of(browser, "svg#chart-lag")
    lag = browser.find_element(By.CSS_SELECTOR, "svg#chart-lag")
    assert len(lag.find_elements(By.CSS_SELECTOR, "circle.point")) == 2
    assert lag.size["width"] > 300
    browser.switch_to.default_content()
    shot(browser, "8-runs-dag-tab")


def test_status_prints_what_the_topics_page_shows(two_runs, ui_airflow):
    """`deltaferry status` in a shell of the Airflow's host: the same rows, lag, quarantine
    and schema as the page, the last run from the Airflow's metadata database."""
    import subprocess
    import sys

    running, topic, _ = two_runs
    env = ui_airflow[2]

    def status(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "deltaferry.cli", "status", *args],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    lines = status(topic).splitlines()
    assert lines[0] == f"{topic} (json, DAG ingest_{topic})"
    assert lines[1].startswith("  last run       success (20")
    assert f"ingest {topic}: 4 messages" in lines[1]
    assert lines[3:7] == ["  rows           7", "  lag            0",
                          "  quarantined    1 last run, 3 total, 3 not replayed",
                          "  schema         v2"]
    listed = json.loads(status("--json"))
    by_topic = {t["topic"]: t for t in listed}
    assert set(by_topic) == {topic, *(f"{topic}_{s}" for s in NEVER_RUN)}
    assert by_topic[f"{topic}_many"]["lag"] == 5 and by_topic[f"{topic}_many"]["last_run"] is None
    assert by_topic[topic]["last_run"]["state"] == "success"


def hrefs(browser, css: str) -> list[str]:
    """The links' targets (absolute URLs) of the elements matching `css`."""
    from selenium.webdriver.common.by import By

    return [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, css)]


def background(browser, css: str) -> str:
    """The computed background colour of the first element matching `css`."""
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, css).value_of_css_property("background-color")


def dark(browser, on: bool) -> None:
    """Ask the pages for the dark colour scheme (as an OS or Airflow in dark mode would)."""
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [
        {"name": "prefers-color-scheme", "value": "dark" if on else "light"}]})


def test_pages_link_to_the_runs_that_made_each_number(two_runs, browser, ui_airflow):
    """After an idle run (nothing new: ingest skipped), the topics page still shows the run
    that did work, in columns, beside the idle run's own state; the topic, each run and each
    ingest log are links into Airflow, as are the commits of the table-health page, each to
    the run and task that wrote it (read back from the Delta log's userMetadata); problems are
    marked, in light and dark mode; the odd facts of the health page are explained."""
    from urllib.parse import quote

    from selenium.webdriver.common.by import By

    running, topic, worked = two_runs
    client = running.client()
    dag_id = f"ingest_{topic}"
    idle = run_to_success(client, dag_id, client.trigger(dag_id)["dag_run_id"])
    assert client.tasks(dag_id, idle["dag_run_id"])["ingest"]["state"] == "skipped"
    worked_id, idle_id = worked["dag_run_id"], idle["dag_run_id"]
    ui = running.url

    def run_href(run_id: str) -> str:
        return f"{ui}/dags/{dag_id}/runs/{quote(run_id, safe='')}"

    log_in(browser, running)
    for theme in ("light", "dark"):
        dark(browser, theme == "dark")
        browser.get(ui + "/plugin/deltaferry")
        frame = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR,
                                                         "iframe[title=deltaferry]"),
                           30, interval=0.5, what="the topics page's frame")[0]
        browser.switch_to.frame(frame)
        row = f"tr[data-topic='{topic}']"
        text_of(browser, row)
        assert hrefs(browser, f"{row} a.dag") == [f"{ui}/dags/{dag_id}"]
        assert hrefs(browser, f"{row} td.state a.run") == [run_href(idle_id)]
        assert hrefs(browser, f"{row} td.state a.log") == [run_href(idle_id) + "/tasks/ingest"]
        assert text_of(browser, f"{row} td.state .when").startswith("ended 20")
        # the idle run does not hide the run that read and quarantined
        assert text_of(browser, f"{row} td.work-read") == "4"
        assert text_of(browser, f"{row} td.work-written") == "2 inserted, 1 updated, 0 deleted"
        assert text_of(browser, f"{row} td.work-quarantined") == "1"
        assert float(text_of(browser, f"{row} td.work-seconds")) > 0
        assert hrefs(browser, f"{row} a.work-link") == [run_href(worked_id)]
        assert hrefs(browser, f"{row} a.work-log") == [run_href(worked_id) + "/tasks/ingest"]
        assert "skipped" not in text_of(browser, row)       # no raw log line
        # problems: the quarantine grew; the lag over its topic's threshold
        assert "problem" in browser.find_element(By.CSS_SELECTOR, f"{row} td.work-quarantined"
                                                 ).get_attribute("class")
        alerted = f"tr[data-topic='{topic}_{LAG_ALERTED}']"
        assert "problem" in browser.find_element(By.CSS_SELECTOR, f"{alerted} td.lag"
                                                 ).get_attribute("class")
        assert background(browser, f"{alerted} td.lag") != background(browser, f"{alerted} td.rows")
        assert "over the topic's alerts.max_lag_messages (3)" in browser.page_source
        browser.switch_to.default_content()
        shot(browser, f"9-topics-links-{theme}")
    dark(browser, False)

    # The ingest log link opens that task instance's page (its log) in Airflow.
    browser.get(run_href(worked_id) + "/tasks/ingest")
    wait_until(lambda: worked_id in browser.find_element(By.TAG_NAME, "body").text, 90,
               interval=1.0, what="the ingest task's page in Airflow's UI")
    assert "Page Not Found" not in browser.find_element(By.TAG_NAME, "body").text

    # Table health: each commit names the run and task that made it; the odd facts explained.
    for url, framed in ((f"{ui}/deltaferry/topics/{topic}/health", False),
                        (f"{ui}/dags/{dag_id}/plugin/deltaferry-health", True)):
        browser.get(url)
        if framed:  # the DAG's own tab links alike
            frame = wait_until(lambda: browser.find_elements(  # by its page, not its label
                By.CSS_SELECTOR, "iframe[src*='/health']"), 30, interval=0.5,
                what="the DAG page's table-health tab")[0]
            browser.switch_to.frame(frame)
        history = text_of(browser, "#history-table")
        commits = commit_rows(browser, "table")
        merges = [r for op, r in commits  # the first batch is appended to the empty table
                  if op == "MERGE" or (op == "WRITE" and "appended by a micro-batch" in r.text)]
        assert len(merges) >= 2, history         # a micro-batch each at least
        assert merges[0].find_element(By.CSS_SELECTOR, "a.by-run").get_attribute("href") == (
            run_href(worked_id))
        assert merges[-1].find_element(By.CSS_SELECTOR, "a.by-run").get_attribute("href") == (
            run_href(two_runs_first(client, dag_id)))
        assert merges[0].find_element(By.CSS_SELECTOR, "a.by-task").get_attribute("href") == (
            run_href(worked_id) + "/tasks/ingest?try_number=1")
        newest = commits[0][1].find_element(By.CSS_SELECTOR, "a.by-run").text
        assert newest in (worked_id, idle_id)
        assert text_of(browser, "#facts-table dd.last-by").startswith(newest)
        evolution = [r for op, r in commits if op == "WRITE" and "numOutputRows=0" in r.text]
        # coupon's alone: the first batch's append added its columns with its rows
        assert len(evolution) == 1, history
        assert all("schema evolution" in r.text and r.find_elements(By.CSS_SELECTOR, "a.by-run")
                   for r in evolution), history
        quarantine = text_of(browser, "#history-quarantine")
        writes = [r.text for op, r in commit_rows(browser, "quarantine")
                  if op == "WRITE" and "numOutputRows=0" not in r.text]
        assert len(writes) >= 2, quarantine      # the first batch's 2 messages, then 1
        assert all("numFiles=1" in w and "quarantined by a micro-batch in 1 file" in w
                   for w in writes), quarantine
        assert text_of(browser, "dd.next-optimize").startswith("not due: ")
        assert "vacuum_interval_hours" in text_of(browser, "dd.next-vacuum") or \
            "retention" in text_of(browser, "dd.next-vacuum")
        browser.switch_to.default_content()
        shot(browser, "10-health-links" + ("-dag-tab" if framed else ""))

    # The run history links each run and its ingest log.
    browser.get(f"{ui}/deltaferry/topics/{topic}/runs")
    text_of(browser, "table#runs")
    assert run_href(worked_id) in hrefs(browser, "table#runs a.run")
    assert run_href(idle_id) + "/tasks/ingest" in hrefs(browser, "table#runs a.log")


def commit_rows(browser, table: str) -> list:
    """The commits listed for `table` (``table`` or ``quarantine``), newest first: (operation,
    row element)."""
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, f"#history-{table} tr[data-version]")
    return [(r.find_element(By.CSS_SELECTOR, "td.operation").text.splitlines()[0], r)
            for r in rows]


def two_runs_first(client, dag_id: str) -> str:
    """The run id of the DAG's first run (the scheduled one, on the first batch)."""
    return client.runs(dag_id)[-1]["dag_run_id"]
