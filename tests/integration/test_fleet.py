"""A fleet through a real Airflow: more topics than the pool has slots, every DAG unpaused at
once (the top of the hour). Every task must succeed on its first attempt (retries are off, so a
herd failure fails the run); the Airflow pool (made smaller than the warm driver pool, which
the topics file sizes) bounds the tasks that run at once, counted from Airflow's own start and
end times, and the plugin leaves an existing pool's size alone; every Spark task runs in the
deltaferry pool, a spread topic's DAG has its moved schedule, and every table holds each key
once, read back with delta-rs."""

from __future__ import annotations

import os

import pytest

from deltaferry import fleet as fleet_settings
from deltaferry_dev import fleet
from deltaferry_dev.airflow import services
from deltaferry_dev.stack.process import free_ports

pytestmark = pytest.mark.integration

#: SLOTS warm drivers (spark_slots), an Airflow pool of AIRFLOW_SLOTS: tasks wait in Airflow.
TOPICS, MESSAGES, KEYS, SLOTS, AIRFLOW_SLOTS = 4, 300, 40, 2, 1


def test_a_fleet_due_at_once_queues_in_the_pool_and_succeeds_first_time(
        stack_env, kafka_bootstrap, tmp_path):
    topics_file, names = fleet.make_fleet(
        kafka_bootstrap, tmp_path, TOPICS, MESSAGES, size=300, keys=KEYS,
        prefix=f"fleet{os.getpid()}", extra=f"spark_slots: {SLOTS}\nretries: 0")
    spread = names[0]
    text = topics_file.read_text().replace(f"  - name: {spread}\n",
                                           f"  - name: {spread}\n    start_spread_minutes: 30\n")
    topics_file.write_text(text)
    warehouse = tmp_path / "warehouse"
    (port,) = free_ports(1)
    env = {**os.environ, **stack_env, "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "DELTAFERRY_TOPICS": str(topics_file), "DELTAFERRY_WAREHOUSE": str(warehouse),
           "DELTAFERRY_SPARK_MASTER": "local[2]", "AIRFLOW__API__PORT": str(port)}
    running = services.up(tmp_path / "home", env=env, create_pool=False)
    try:
        client = running.client()
        client.call("POST", "/pools", json={"name": fleet_settings.DEFAULT_POOL,
                                            "slots": AIRFLOW_SLOTS, "include_deferred": False})
        result = fleet.run_fleet(client, [f"ingest_{n}" for n in names], topics_file,
                                  timeout=900)
        offset = fleet_settings.spread_offset(spread, 30)
        spread_dag = client.dag(f"ingest_{spread}")
        assert f"{offset} * * * *" in str(spread_dag.get("timetable_summary")), spread_dag
        assert client.dag(f"ingest_{names[1]}")["timetable_summary"] in ("@hourly", "0 * * * *")
        pools = {ti["pool"] for dag_id, run in result.runs.items()
                 for ti in client.tasks(dag_id, client.runs(dag_id)[-1]["dag_run_id"]).values()}
        pool_slots = client.call("GET", f"/pools/{fleet_settings.DEFAULT_POOL}")["slots"]
    finally:
        services.down(tmp_path / "home")
    assert result.runs == {f"ingest_{n}": "success" for n in names}
    assert not result.retried and all(t.tries == 1 for t in result.tasks)
    assert pool_slots == AIRFLOW_SLOTS  # the plugin creates a missing pool, never resizes one
    # Airflow ran no more tasks at once than its pool's slots, though SLOTS drivers were free
    assert result.peak_running == AIRFLOW_SLOTS, result.peak_running
    assert 1 <= result.peak_drivers <= SLOTS, result.peak_drivers
    assert pools == {fleet_settings.DEFAULT_POOL}
    ran = [t for t in result.tasks if t.task_id == "ingest"]
    assert all(t.report and t.report["messages_read"] == MESSAGES for t in ran)
    from deltalake import DeltaTable

    for name in names:
        keys = DeltaTable(str(warehouse / name / "table")).to_pyarrow_table(
            columns=["kafka_key"]).column("kafka_key").to_pylist()
        assert sorted(keys) == sorted(f"{name}-{k}" for k in range(KEYS))
