"""Topics by pattern against a real broker: `deltaferry topics --refresh` lists the broker's
topics into the warehouse; the DAG factory expands the pattern entry from that list alone (a
topic created after the DAGs were built gets its DAG after the next refresh, not before); a
topic deleted from the broker keeps its DAG, unscheduled, and is marked in `deltaferry status`.
In the shared Airflow (`airflow_shared`): the refresh DAG's run, through the Kafka connection,
gives a topic created after the dag-processor parsed the file its DAG; the run that finds a
topic gone has its DAG paused in Airflow (the plugin's listener), marked on the topics page,
and a person's unpausing is not overruled by the next run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from deltaferry.kafka import create_topic

from .test_cli import CLI

pytestmark = pytest.mark.integration


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the deletion is done
    for future in admin.delete_topics([topic]).values():
        future.result(30)
    deadline = time.monotonic() + 30  # the broker's metadata follows the deletion
    from deltaferry.kafka import list_topics

    while topic in list_topics(bootstrap):
        assert time.monotonic() < deadline, f"{topic} still listed"
        time.sleep(0.5)


def test_a_topic_created_after_the_dags_were_built_gets_its_dag_after_the_refresh(
        kafka_bootstrap, tmp_path, monkeypatch):
    pytest.importorskip("airflow")
    from deltaferry.airflow.factory import REFRESH_DAG_ID, build

    prefix = f"pg.inv{uuid.uuid4().hex[:8]}"
    first, later = f"{prefix}.customers", f"{prefix}.orders"
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {prefix}.customers.manual\n"
                      f"  - pattern: \"{prefix.replace('.', chr(92) * 2 + '.')}\\\\..*\"\n"
                      "    mode: append\n")
    env = {**os.environ, "DELTAFERRY_TOPICS": str(topics),
           "DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"), "DELTAFERRY_KAFKA_BOOTSTRAP":
           kafka_bootstrap}
    for name, value in env.items():
        if name.startswith("DELTAFERRY_"):
            monkeypatch.setenv(name, value)

    def refresh() -> str:
        done = subprocess.run([CLI, "topics", "--refresh"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def dag_ids() -> set[str]:
        built = build(str(topics))
        assert built.errors == []
        return {d for d in built.dags if d.startswith(f"ingest_{prefix}")}

    create_topic(kafka_bootstrap, first, partitions=1)
    said = refresh()
    assert f"{first}\tpattern " in said and f"{prefix}.customers.manual\town entry" in said
    assert dag_ids() == {f"ingest_{first}", f"ingest_{prefix}.customers.manual"}
    assert REFRESH_DAG_ID in build(str(topics)).dags

    create_topic(kafka_bootstrap, later, partitions=1)  # after the DAGs were built
    assert f"ingest_{later}" not in dag_ids()  # parsing asks no broker: not before a refresh
    refresh()
    assert dag_ids() == {f"ingest_{first}", f"ingest_{later}",
                         f"ingest_{prefix}.customers.manual"}
    assert build(str(topics)).dags[f"ingest_{later}"].timetable.expression == "0 * * * *"

    delete_topic(kafka_bootstrap, first)
    refresh()
    dags = build(str(topics)).dags
    assert f"ingest_{first}" in dags and "topic-gone" in dags[f"ingest_{first}"].tags
    assert type(dags[f"ingest_{first}"].timetable).__name__ == "NullTimetable"
    status = subprocess.run([CLI, "status", "--json"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr[-3000:]
    entries = {r["topic"]: r["entry"] for r in json.loads(status.stdout)}
    assert entries[f"{prefix}.customers.manual"] == "own entry"
    assert entries[later].startswith("pattern ") and "gone" not in entries[later]
    assert "gone from the broker since" in entries[first]


def test_in_airflow_the_refresh_dag_brings_new_topics_dags_and_pauses_gone_ones(shared_airflow,
                                                                              stack_env):
    from deltaferry.airflow.factory import REFRESH_DAG_ID
    from deltaferry_dev.airflow.rest import wait_until

    from .test_plain_airflow import page_text

    prefix = f"pgaf{uuid.uuid4().hex[:8]}"
    bootstrap = stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    create_topic(bootstrap, f"{prefix}.before", partitions=1)
    client = shared_airflow.client()
    before, after = f"ingest_{prefix}.before", f"ingest_{prefix}.after"

    def refresh() -> None:
        run = client.trigger(REFRESH_DAG_ID)
        client.set_paused(REFRESH_DAG_ID, False)
        done = client.wait(REFRESH_DAG_ID, run["dag_run_id"], timeout=300)
        assert done["state"] == "success", client.log(REFRESH_DAG_ID, run["dag_run_id"],
                                                      "refresh")[-3000:]
        client.set_paused(REFRESH_DAG_ID, True)

    def tags(dag_id: str) -> list[str]:
        return [t["name"] for t in client.dag(dag_id)["tags"]]

    with shared_airflow.pattern_entry(f"  - pattern: \"{prefix}\\\\..*\"\n"
                                      "    schedule: null\n"):
        wait_until(lambda: client.dag(REFRESH_DAG_ID), 180, what="the refresh DAG parsed")
        # parsed with the entry: no list yet, so no topic of it has a DAG, not even one
        # the broker has (parsing asks no broker)
        assert client.dag(before) is None
        create_topic(bootstrap, f"{prefix}.after", partitions=1)  # after the DAGs loaded
        refresh()
        shared_airflow._reparse()
        wait_until(lambda: client.dag(after) and client.dag(before), 180,
                   what="the matching topics' DAGs parsed after the refresh")
        assert "pattern" in tags(after)

        for dag_id in (before, after):  # as a person turns them on
            client.set_paused(dag_id, False)
        delete_topic(bootstrap, f"{prefix}.before")
        refresh()
        # paused by the run that found its topic gone, committed with the run's success
        assert client.dag(before)["is_paused"] is True
        assert client.dag(after)["is_paused"] is False
        shared_airflow._reparse()
        wait_until(lambda: "topic-gone" in tags(before), 180,
                   what="the gone topic's DAG parsed again")
        assert client.dag(before)["is_paused"] is True  # the parse leaves it paused
        row = page_text(shared_airflow.running).split(f'data-topic="{prefix}.before"')[1]
        row = row.split("<tr")[0]
        assert "gone from the broker since" in row and "its DAG paused" in row, row

        client.set_paused(before, False)  # a person's decision: the next runs keep it
        refresh()
        assert client.dag(before)["is_paused"] is False
