"""Per-DAG access to deltaferry's pages, in a real browser against a real Airflow: a user who
may read one topic's DAG and not another's (an auth manager with per-DAG access,
`per_dag_auth`) sees only that topic on the topics page and is refused the other topic's pages
when asking for them by address; the admin sees both. The Airflow is the one shared with
other files (`airflow_shared`)."""

from __future__ import annotations

import uuid

import pytest

from deltaferry.kafka import create_topic
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.rest import wait_until

from .airflow_shared import KEEPER, READER
from .test_ui import browser, text_of  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def access_airflow(shared_airflow, stack_env):
    """The shared Airflow, whose user `reader` may read the DAG of topic `mine` only."""
    mine, theirs = (f"acl-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for topic in (mine, theirs):
        create_topic(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=1)
    with shared_airflow.hosting(f"  - name: {mine}\n  - name: {theirs}\n",
                                access={READER: [f"ingest_{mine}"]}):
        yield shared_airflow.running, mine, theirs


def sign_in(browser, running, user: str) -> None:  # noqa: F811 - the fixture's browser
    """Sign in as `user` on Airflow's login page, after signing out whoever was."""
    from selenium.webdriver.common.by import By

    browser.get(running.url + "/")
    browser.delete_all_cookies()
    browser.get(running.url + "/")
    text_of(browser, "input[name=username]")
    browser.find_element(By.CSS_SELECTOR, "input[name=username]").send_keys(user)
    browser.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(
        running.password(user))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_until(lambda: any(c["name"] == "_token" for c in browser.get_cookies()), 30,
               interval=0.5, what=f"{user}'s session cookie")


def listed(browser, running) -> set[str]:  # noqa: F811
    import re

    browser.get(f"{running.url}/deltaferry/")
    text_of(browser, "#topics")
    return set(re.findall(r'<tr data-topic="([^"]+)"', browser.page_source))


def test_a_user_sees_only_the_topics_whose_dags_they_may_read(access_airflow, browser):  # noqa: F811
    running, mine, theirs = access_airflow
    sign_in(browser, running, READER)
    assert listed(browser, running) == {mine}
    # the topic links to its DAG in Airflow, as for the admin
    assert f'href="/dags/ingest_{mine}"' in browser.page_source
    assert f"ingest_{theirs}" not in browser.page_source
    for page in ("schema", "quarantine", "health"):
        browser.get(f"{running.url}/deltaferry/topics/{theirs}/{page}")
        assert "Not allowed" in text_of(browser, "body"), page
        assert f"You may not read the DAG ingest_{theirs}" in browser.page_source
        browser.get(f"{running.url}/deltaferry/topics/{mine}/{page}")
        assert "Not allowed" not in text_of(browser, "body"), page
    browser.get(f"{running.url}/deltaferry/dags/ingest_{theirs}/health")
    assert "Not allowed" in text_of(browser, "body")
    sign_in(browser, running, services.USER)
    assert listed(browser, running) == {mine, theirs, KEEPER}  # KEEPER: the shared Airflow's
    browser.get(f"{running.url}/deltaferry/topics/{theirs}/schema")
    assert "Not allowed" not in text_of(browser, "body")
