"""Per-DAG access to deltaferry's pages, in a real browser against a real Airflow: a user who
may read one topic's DAG and not another's (an auth manager with per-DAG access,
`per_dag_auth`) sees only that topic on the topics page and is refused the other topic's pages
when asking for them by address; the admin sees both."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from deltaferry.kafka import create_topic
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.rest import wait_until
from deltaferry_dev.stack.process import free_ports

from .per_dag_auth import ACCESS_VAR
from .test_ui import browser, text_of  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.integration
READER = "reader"


@pytest.fixture(scope="module")
def access_airflow(stack_env, tmp_path_factory):
    """An Airflow whose user `reader` may read the DAG of topic `mine` only."""
    folder = tmp_path_factory.mktemp("access")
    mine, theirs = (f"acl-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for topic in (mine, theirs):
        create_topic(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=1)
    topics_file = folder / "topics.yaml"
    topics_file.write_text(f"topics:\n  - name: {mine}\n  - name: {theirs}\n")
    (port,) = free_ports(1)
    env = {**os.environ, **stack_env, "DELTAFERRY_TOPICS": str(topics_file),
           "DELTAFERRY_WAREHOUSE": str(folder / "warehouse"), "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__CORE__AUTH_MANAGER": "tests.integration.per_dag_auth.PerDagAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{services.USER}:admin,{READER}:viewer",
           ACCESS_VAR: json.dumps({READER: [f"ingest_{mine}"]}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    running = services.up(folder / "home", env=env)
    try:
        client = running.client()
        wait_until(lambda: client.dag(f"ingest_{mine}") and client.dag(f"ingest_{theirs}"),
                   180, what="both DAGs parsed")
        yield running, mine, theirs
    finally:
        services.down(folder / "home")


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
    assert listed(browser, running) == {mine, theirs}
    browser.get(f"{running.url}/deltaferry/topics/{theirs}/schema")
    assert "Not allowed" not in text_of(browser, "body")
