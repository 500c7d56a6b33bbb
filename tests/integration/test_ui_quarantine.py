"""The quarantine page as a search tool, its replay button, and the pages in Airflow's look, in
a real browser against a real Airflow.

One Airflow (the project's launcher; the one shared with other files, `airflow_shared`) whose
``[core] default_timezone`` is Asia/Kolkata (IST,
UTC+05:30, never summer time) and whose auth manager restricts a second user, ``reader``
(Airflow's viewer role: may read, may not trigger), to the topic's DAG. A JSON topic with a
small ``max_value_bytes`` is ingested by the scheduler: three values too large, twelve that are
not JSON and one that is not UTF-8 land in the quarantine. Headless chromium then searches the
quarantine by reason, partition and key, pages through it (bounds refused or clamped, said on
the page), reads binary values as hex with their text beside them, and checks that keys do not
wrap. After the topic's max_value_bytes is raised, the admin replays two of the large values
through the page's button (a confirm step, then a signed form POST): a DAG run with the
``replay`` param lands exactly those in the table, read back with delta-rs, and the quarantine
marks them. The reader sees no button and gets 403 on the POST. The pages follow Airflow's
theme, light and dark (Airflow's own setting, and the system's), show every time in one format
in IST, and the DAG page's tabs fit one line at 1400 px. Screenshots go to artifacts/ui/.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import httpx
import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.rest import AirflowClient, wait_until

from .airflow_shared import READER, ZONE
from .test_ui import browser, run_to_success, shot, text_of  # noqa: F401 - the browser fixture
from .test_ui_access import sign_in

pytestmark = pytest.mark.integration

#: Values longer than this are quarantined, until the topics file raises it.
SMALL = 128
LONG_KEY = "customer-0042-eu-west-1a"
BIG_KEYS = (LONG_KEY, "big-1", "big-2")
NOT_JSON = 12
BINARY = b"\xff\xfe\x00<b>binary-payload\x01\x02"
TOO_LARGE = "over the topic's max_value_bytes"


def messages():
    for i in range(4):
        yield f"k{i}", {"id": i, "note": "ok"}
    for i, key in enumerate(BIG_KEYS):
        yield key, {"id": 10 + i, "note": "x" * 300}     # too large: quarantined, replayable
    for i in range(NOT_JSON):
        yield f"bad-{i:02d}", f"{{not json {i}".encode()  # stays
    yield "bin", BINARY                                   # not UTF-8: stays


def topic_entry(topic: str, max_value_bytes: int) -> str:
    return f"  - name: {topic}\n    retries: 0\n    max_value_bytes: {max_value_bytes}\n"


@pytest.fixture(scope="module")
def quarantine_airflow(shared_airflow, stack_env):
    """The shared Airflow (in IST) hosting the topic, whose reader may read the topic's DAG and
    not trigger it; the topic's first run done by the scheduler."""
    topic = f"uiq-{uuid.uuid4().hex[:8]}"
    bootstrap = stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    create_topic(bootstrap, topic, partitions=2)
    dag_id = f"ingest_{topic}"
    with shared_airflow.hosting(topic_entry(topic, SMALL), access={READER: [dag_id]}):
        running = shared_airflow.running
        client = running.client()
        produce(bootstrap, topic, list(messages()))
        client.set_paused(dag_id, False)
        scheduled = wait_until(lambda: client.runs(dag_id), 120, interval=1.0,
                               what="a scheduled run")[0]
        run_to_success(client, dag_id, scheduled["dag_run_id"])
        yield running, topic, shared_airflow, shared_airflow.warehouse, running.home


def read(uri) -> list[dict]:
    from deltalake import DeltaTable

    return DeltaTable(str(uri)).to_pyarrow_table().to_pylist()


def bearer(running, user: str = services.USER) -> dict[str, str]:
    client = AirflowClient(running.url, user, running.password(user))
    return client._headers()


def frame_in(driver, title: str):
    """Switch into the UI's plugin frame titled `title`, once it is there."""
    from selenium.webdriver.common.by import By

    frame = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR,
                                                     f"iframe[title='{title}']"),
                       60, interval=0.5, what=f"the frame {title!r}")[0]
    driver.switch_to.frame(frame)


def colours(driver) -> dict[str, tuple[int, ...]]:
    """The computed text colour of the page's body and the background of its first header
    cell, as RGB."""
    found = driver.execute_script(
        "const th = document.querySelector('th');"
        "return [getComputedStyle(document.body).color,"
        "        th ? getComputedStyle(th).backgroundColor : ''];")
    return {name: tuple(int(n) for n in re.findall(r"\d+", value)[:3])
            for name, value in zip(("text", "header"), found, strict=True)}


def is_dark(rgb: tuple[int, ...]) -> bool:
    return sum(rgb) / 3 < 100


def lines_of(driver, element) -> int:
    """How many lines the text of `element` takes on screen."""
    return driver.execute_script(
        "const r = document.createRange(); r.selectNodeContents(arguments[0]);"
        "const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top)));"
        "return tops.size;", element)


def click_and_wait(driver, css: str) -> None:
    """Click the element `css` and wait for the page it opens."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "h1")
    driver.find_element(By.CSS_SELECTOR, css).click()
    WebDriverWait(driver, 60).until(ec.staleness_of(old))


def shown(driver) -> list[dict]:
    from selenium.webdriver.common.by import By

    text_of(driver, "table#messages")
    rows = driver.find_elements(By.CSS_SELECTOR, "table#messages > tbody > tr")[1:]
    out = []
    for row in rows:
        cells = row.find_elements(By.XPATH, "./td")
        out.append({"position": cells[0].text, "key": cells[1].get_attribute("title"),
                    "reason": cells[3].text, "quarantined": cells[5].text})
    return out


def test_the_quarantine_page_searches_pages_and_previews(quarantine_airflow, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    running, topic, _, warehouse, _ = quarantine_airflow
    base = f"{running.url}/deltaferry/topics/{topic}/quarantine"
    rows = read(warehouse / topic / "_quarantine")
    assert len(rows) == len(BIG_KEYS) + NOT_JSON + 1
    sign_in(browser, running, services.USER)

    # every message, newest first, 50 a page: all 16 on one page
    browser.get(base)
    assert text_of(browser, "#shown").startswith("1–16 of 16 message(s)")
    # paging: 5 a page, the next link, the last page; a page past the end is the last, said
    browser.get(base + "?size=5")
    assert text_of(browser, "#shown").startswith("1–5 of 16 message(s)")
    assert "page 1 of 4" in text_of(browser, "#pager")
    click_and_wait(browser, "#page-next")
    assert text_of(browser, "#shown").startswith("6–10 of 16")
    browser.get(base + "?size=5&page=99")
    assert "There is no page 99: 16 message(s) match, 4 page(s) of 5; the last page is shown." \
        in text_of(browser, "p.notice")
    assert text_of(browser, "#shown").startswith("16–16 of 16")
    browser.get(base + "?latest=999999")                 # the old parameter: clamped, said
    assert "A page lists at most 500 messages; 999,999 asked, 500 shown." in \
        text_of(browser, "p.notice")
    for bad, said in (("size=-5", "size='-5': must be a whole number >= 1"),
                      ("latest=-5", "latest='-5': must be a whole number >= 1"),
                      ("page=0", "page='0': must be a whole number >= 1"),
                      ("partition=x", "partition='x': must be a whole number >= 0")):
        answer = httpx.get(f"{base}?{bad}", headers=bearer(running), timeout=60)
        assert answer.status_code == 400, bad
        assert said in html.unescape(answer.text), bad

    # search: by reason (the form), by key, by partition (each as delta-rs counts them)
    browser.get(base)
    browser.find_element(By.CSS_SELECTOR, "#filter-reason").send_keys(TOO_LARGE)
    click_and_wait(browser, "#filter-apply")
    assert text_of(browser, "#shown").startswith("1–3 of 3 message(s) where reason contains")
    assert {r["key"] for r in shown(browser)} == {repr(k) for k in BIG_KEYS}
    assert all(TOO_LARGE in r["reason"] for r in shown(browser))
    browser.get(base + "?key=bad-0")
    assert {r["key"] for r in shown(browser)} == {f"'bad-0{i}'" for i in range(10)}
    partition = rows[0]["kafka_partition"]
    browser.get(f"{base}?partition={partition}&size=500")
    in_partition = [r for r in rows if r["kafka_partition"] == partition]
    assert len(shown(browser)) == len(in_partition) > 0
    assert all(r["position"].startswith(f"p{partition}@") for r in shown(browser))
    browser.get(base + "?reason=no+such+reason")
    assert text_of(browser, "#shown").startswith("No message where reason contains")

    # binary as hex with its text beside it; keys on one line; no server path in a reason
    browser.get(base + "?key=bin")
    hex_row = browser.find_element(By.CSS_SELECTOR, "table.hex tr")
    hex_cell, text_cell = hex_row.find_elements(By.TAG_NAME, "td")
    assert hex_cell.text == BINARY[:16].hex(" ")
    assert text_cell.text == "...<b>binary-pay"
    assert text_cell.rect["x"] > hex_cell.rect["x"] + hex_cell.rect["width"] - 1
    assert abs(text_cell.rect["y"] - hex_cell.rect["y"]) < 2
    assert browser.find_elements(By.TAG_NAME, "script") == []
    browser.get(base + f"?key={LONG_KEY}")
    key_cell = browser.find_element(By.CSS_SELECTOR, "table#messages td.key")
    assert key_cell.text == repr(LONG_KEY) and lines_of(browser, key_cell) == 1
    browser.get(base)
    assert str(warehouse) not in browser.page_source
    assert f"{topic}/_quarantine" in text_of(browser, "p.sub")
    shot(browser, "quarantine-search")


def test_times_are_in_airflow_time_zone_in_one_format(quarantine_airflow, browser):  # noqa: F811
    running, topic, _, _, _ = quarantine_airflow
    sign_in(browser, running, services.USER)
    now = datetime.now(ZoneInfo(ZONE))
    one_format = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} IST$")

    def recent(text: str) -> bool:
        assert one_format.match(text), text
        moment = datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S").replace(
            tzinfo=ZoneInfo(ZONE))
        return abs(moment - now) < timedelta(minutes=30)

    base = f"{running.url}/deltaferry/topics/{topic}"
    browser.get(f"{base}/quarantine")
    assert all(recent(r["quarantined"]) for r in shown(browser))
    browser.get(f"{base}/health")
    assert recent(text_of(browser, "table.history tr:nth-child(2) td:nth-child(2)"))
    browser.get(f"{base}/schema")
    assert recent(text_of(browser, "#versions tr:nth-child(2) td:nth-child(2)"))
    browser.get(f"{base}/runs")
    assert recent(text_of(browser, "#runs tr:nth-child(2) td:nth-child(3)"))
    browser.get(f"{running.url}/deltaferry/")
    assert recent(text_of(browser, f"tr[data-topic='{topic}'] td.last-success"))


def test_the_pages_follow_airflow_light_and_dark_theme(quarantine_airflow, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    running, topic, _, _, _ = quarantine_airflow
    sign_in(browser, running, services.USER)
    tab = f"{running.url}/dags/ingest_{topic}/plugin/deltaferry-quarantine"
    try:
        # light: Airflow's default theme follows the system, light here
        browser.get(tab)
        frame_in(browser, "Quarantine")
        text_of(browser, "table#messages")
        light = colours(browser)
        assert not is_dark(light["header"]) and is_dark(light["text"])
        keys = browser.find_elements(By.CSS_SELECTOR, "table#messages td.key")
        assert len(keys) == 16 and [lines_of(browser, k) for k in keys] == [1] * 16
        browser.switch_to.default_content()
        shot(browser, "quarantine-light")

        # dark chosen in Airflow (its theme setting), the system still light
        browser.execute_script("localStorage.setItem('theme', 'dark')")
        browser.get(tab)
        frame_in(browser, "Quarantine")
        text_of(browser, "table#messages")
        dark = colours(browser)
        assert is_dark(dark["header"]) and not is_dark(dark["text"]), dark
        browser.switch_to.default_content()
        shot(browser, "quarantine-dark")
        browser.get(f"{running.url}/plugin/deltaferry")
        frame_in(browser, "deltaferry")
        text_of(browser, "table#topics")
        assert not is_dark(colours(browser)["text"])
        browser.switch_to.default_content()
        shot(browser, "topics-dark")

        # Airflow on "system" with a dark system: dark again
        browser.execute_script("localStorage.removeItem('theme')")
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        browser.get(f"{running.url}/dags/ingest_{topic}/plugin/deltaferry-health")
        frame_in(browser, "Health")
        click_and_wait(browser, "a#runs-link")
        text_of(browser, "svg#chart-messages")
        assert not is_dark(colours(browser)["text"])
        browser.switch_to.default_content()
        shot(browser, "runs-dark")
    finally:
        browser.switch_to.default_content()
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        browser.execute_script("localStorage.removeItem('theme')")


def test_the_dag_page_tabs_fit_one_line_at_1400_px(quarantine_airflow, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    running, topic, _, _, _ = quarantine_airflow
    sign_in(browser, running, services.USER)
    assert browser.get_window_size()["width"] == 1400
    browser.get(f"{running.url}/dags/ingest_{topic}")
    ours = wait_until(lambda: browser.find_elements(
        By.CSS_SELECTOR, "a[href*='/plugin/deltaferry-']"), 60, interval=0.5,
        what="the DAG page's deltaferry tabs")
    assert [a.text for a in ours] == ["Schema", "Quarantine", "Health"]
    # the tab bar: the smallest box around our first tab that holds Airflow's tabs too; each
    # tab's label on one line (a crowded bar wraps labels: "Audit" over "Log"), all on one row
    tabs = browser.execute_script(
        "let bar = arguments[0];"
        "while (bar && bar.querySelectorAll('a').length < 8) bar = bar.parentElement;"
        "return [...bar.querySelectorAll('a')].filter(e => e.offsetParent !== null)"
        "  .map(e => { const lines = new Set(), texts = document.createTreeWalker(e, 4);"
        "    for (let t = texts.nextNode(); t; t = texts.nextNode()) {"
        "      if (!t.textContent.trim()) continue;"
        "      const r = document.createRange(); r.selectNodeContents(t);"
        "      for (const x of r.getClientRects()) lines.add(Math.round(x.top)); }"
        "    return [e.textContent, Math.round(e.getBoundingClientRect().top), lines.size]; });",
        ours[0])
    shot(browser, "dag-tabs")
    assert len(tabs) >= 11 and "Audit Log" in [label for label, _, _ in tabs], tabs
    assert len({top for _, top, _ in tabs}) == 1, tabs
    assert {lines for _, _, lines in tabs} == {1}, tabs
    width = browser.execute_script("return document.documentElement.clientWidth")
    assert ours[-1].rect["x"] + ours[-1].rect["width"] <= width, (tabs, width)


def test_replay_from_the_page_lands_what_now_parses(quarantine_airflow, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    running, topic, shared, warehouse, home = quarantine_airflow
    dag_id = f"ingest_{topic}"
    client = running.client()
    base = f"{running.url}/deltaferry/topics/{topic}/quarantine"

    # the reader may read the DAG, not trigger it: no button, and the POST is refused
    sign_in(browser, running, READER)
    browser.get(base)
    text_of(browser, "table#messages")
    assert browser.find_elements(By.CSS_SELECTOR, "#replay-button") == []
    assert f"permission to trigger {dag_id}" in text_of(browser, "#replay-cli")
    shot(browser, "quarantine-reader")
    reader = bearer(running, READER)
    assert httpx.get(f"{base}/replay", headers=reader, timeout=60).status_code == 403
    refused = httpx.post(f"{base}/replay", headers=reader, timeout=60,
                         data={"reason": TOO_LARGE, "form_token": "1.x"})
    assert refused.status_code == 403 and "may not trigger" in refused.text
    admin = bearer(running)
    forged = httpx.post(f"{base}/replay", headers=admin, timeout=60,
                        data={"reason": TOO_LARGE, "form_token": "1700000000.abc"})
    assert forged.status_code == 403 and "Not this page's form" in html.unescape(forged.text)
    runs_before = len(client.runs(dag_id))

    # the fix: the topic takes larger values; the admin replays two of the three large ones
    shared.add_topics(topic_entry(topic, 2**20))
    sign_in(browser, running, services.USER)
    browser.get(f"{base}?reason={TOO_LARGE.replace(' ', '+')}&key=big-")
    assert text_of(browser, "#replay-button") == "Replay 2 message(s)…"
    click_and_wait(browser, "#replay-button")
    assert "not replayed yet: 2 now" in text_of(browser, "#replay-what")
    shot(browser, "quarantine-replay-confirm")
    click_and_wait(browser, "#replay-confirm-button")
    started = text_of(browser, "#replay-started")
    run_id = browser.find_element(By.CSS_SELECTOR, "#replay-run").text
    assert run_id in started
    href = browser.find_element(By.CSS_SELECTOR, "#replay-run").get_attribute("href")
    assert href.endswith(f"/dags/{dag_id}/runs/{run_id.replace('+', '%2B').replace(':', '%3A')}")
    shot(browser, "quarantine-replay-started")
    assert len(client.runs(dag_id)) == runs_before + 1

    run = run_to_success(client, dag_id, run_id)
    assert run["conf"] == {"replay": {"reason": TOO_LARGE, "key": "big-"}}
    assert "asked by admin" in (run.get("note") or "")
    result = client.result(dag_id, run_id, "ingest")
    assert result["step"] == "replay" and result["landed"] == 2, result

    # the table holds exactly those two; the quarantine marks them and keeps the third
    table = {r["kafka_key"]: r for r in read(warehouse / topic / "table")}
    assert {"big-1", "big-2"} <= set(table) and LONG_KEY not in table
    assert table["big-1"]["note"] == "x" * 300
    marked = {r["kafka_key"]: r["replayed_at"] for r in read(warehouse / topic / "_quarantine")}
    assert marked["big-1"] and marked["big-2"] and marked[LONG_KEY] is None
    assert all(marked[f"bad-{i:02d}"] is None for i in range(NOT_JSON))
    browser.get(f"{base}?reason={TOO_LARGE.replace(' ', '+')}")
    assert "1 of them not replayed" in text_of(browser, "#shown")
    assert text_of(browser, "#replay-button") == "Replay 1 message(s)…"

    # logged: who, which topic, what filter (the api-server's log and Airflow's audit log)
    log = (home / "logs" / "services" / "api-server.log").read_text(errors="replace")
    assert re.search(rf"deltaferry replay: admin started run {re.escape(run_id)} of {dag_id} "
                     rf"to replay the quarantine of {topic} \(reason contains", log)
    events = client.call("GET", f"/eventLogs?event=deltaferry.replay&dag_id={dag_id}")
    [event] = events["event_logs"]
    assert event["owner"] == services.USER and event["run_id"] == run_id
    assert json.loads(event["extra"]) == {"replay": {"reason": TOO_LARGE, "key": "big-"}}
