"""How long each deltaferry page of the Airflow UI takes (issue 17's budget: under 2 s each on
the demo data, on a 2-core machine), and two fleet figures of issue 32: the topics page of a
200-topic file (<= 2 s, sorted and filtered) and the dag-processor's parse of a 500-topic file
(<= 10 s).

With a running local Airflow (`make demo` or `make airflow`), the pages are fetched from its
api-server over HTTP as the UI loads them, logged in as admin (authentication, Airflow's
metadata database, the plugin, the reads). Without one, the pages' app is run in this process
on the demo's warehouse and the local stack (the same reads and rendering, no Airflow). Prints
each page's first (cold) time and the median and slowest of the next requests. Not a test: it
prints figures.

    make bench-ui                 # or: .venv/bin/python bench/bench_ui.py [--repeat 5]
    .venv/bin/python bench/bench_ui.py --fleet 200 [--fleet-warehouse s3|local]
    .venv/bin/python bench/bench_ui.py --parse 500

``--fleet N``: N topics on the local stack's broker (2 partitions, a few messages each; made
once, kept), of which `FLEET_WITH_DATA` (or ``--with-data``) have a table, a quarantine, a
schema and a committed
checkpoint (written with delta-rs, no Spark) in a warehouse in the stack's S3 server (or a
folder); last runs of mixed states stand in for Airflow's. The topics page's app in this process
(the plugin's own check of the topics file, the reads, the rendering; no Airflow) is asked for
the page plain, sorted and filtered: the first (cold) request and the median and slowest of the
next ones.

``--parse N``: a file of N topics, and for each DAG file of dags/ what the dag-processor's
parsing child does with it, timed in a fresh process that has imported what the dag-processor
has (Airflow; not deltaferry): import the file (building the DAGs), then serialize them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from deltaferry.config import load_topics

LIMIT_S = 2.0


def pages(topics: list[str]) -> list[str]:
    paths = ["/"]
    for topic in topics:
        paths += [f"/topics/{topic}/{page}" for page in ("schema", "quarantine", "health")]
    return paths


def measure(get, paths: list[str], repeat: int) -> bool:
    within = True
    for path in paths:
        times, status = [], None
        for _ in range(repeat + 1):
            started = time.perf_counter()
            answer = get(path)
            times.append(time.perf_counter() - started)
            status = answer.status_code
        rest = times[1:] or times
        slowest = max(times)
        within &= slowest <= LIMIT_S and status == 200
        print(f"  {path:<44} HTTP {status}  first {times[0] * 1000:7.0f} ms  median "
              f"{statistics.median(rest) * 1000:7.0f} ms  slowest {slowest * 1000:7.0f} ms"
              f"{'' if slowest <= LIMIT_S else '  OVER ' + str(LIMIT_S) + ' s'}")
    return within


#: Topics of the --fleet file with data in the warehouse (the others were never ingested).
FLEET_WITH_DATA = 5
FLEET_PREFIX = "fleet_ui_"
PARSE_LIMIT_S = 10.0
OUT = Path(__file__).resolve().parent / "out"


def fleet_names(count: int) -> list[str]:
    return [f"{FLEET_PREFIX}{i:03d}" for i in range(count)]


def topics_file(count: int) -> Path:
    """A topics file of `count` topics with the default settings."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"topics-{count}.yaml"
    path.write_text("topics:\n" + "".join(f"  - name: {n}\n" for n in fleet_names(count)))
    return path


def fleet_broker(bootstrap: str, names: list[str]) -> None:
    """Every topic of `names` on the broker, 2 partitions, 3 messages (the missing ones made)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    missing = [n for n in names if n not in admin.list_topics(timeout=30).topics]
    if not missing:
        return
    for future in admin.create_topics([NewTopic(n, 2, 1) for n in missing]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for name in missing:
        for i in range(3):
            producer.produce(name, key=f"k{i}", value=json.dumps({"id": i}))
    producer.flush(60)


def fleet_warehouse(warehouse: str, env: dict, names: list[str]) -> None:
    """A table of 3 rows, a quarantine of 1, a schema version and a committed checkpoint batch
    (2 of the 3 messages) for each topic of `names`, unless it has them already."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltaferry.lake import delta_rs_uri, is_delta_table, storage_options
    from deltaferry.paths import TopicPaths
    from deltaferry.schema.store import SchemaStore
    from deltaferry.storage import join, storage_for

    storage = storage_for(warehouse, env)
    schema = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    for name in names:
        paths = TopicPaths.for_topic(warehouse, name)
        if is_delta_table(paths.table, env):
            continue
        options = storage_options(paths.table, env)
        write_deltalake(delta_rs_uri(paths.table), pa.table({"kafka_key": ["k0", "k1", "k2"],
                                                             "id": [0, 1, 2]}),
                        storage_options=options)
        write_deltalake(delta_rs_uri(paths.quarantine), pa.table({"reason": ["not JSON"]}),
                        storage_options=options)
        SchemaStore(paths.schema, storage).write_version(schema, {0: 1, 1: 2}, "initial")
        offsets = json.dumps({name: {"0": 1, "1": 1}})
        storage.write(join(paths.checkpoint, "offsets", "0"), f"v1\n{{}}\n{offsets}".encode())
        storage.write(join(paths.checkpoint, "commits", "0"), b"v1\n{}")


def fleet_runs(names: list[str]) -> dict:
    """Last runs of mixed states (by DAG id): every 7th failed, every 11th running, every 5th
    never ran, the rest succeeded; last successes spread over two days."""
    from datetime import UTC, datetime, timedelta

    from deltaferry.ui.topics import LastRun

    now = datetime.now(UTC)
    runs = {}
    for i, name in enumerate(names):
        if i % 5 == 4:
            continue
        state = "failed" if i % 7 == 3 else "running" if i % 11 == 2 else "success"
        runs[f"ingest_{name}"] = LastRun(f"scheduled__{i}", state, "", {"summary": "ingest"},
                                         last_success=now - timedelta(minutes=17 * i))
    return runs


def fleet(count: int, where: str, repeat: int, with_data: int = FLEET_WITH_DATA) -> bool:
    """The topics page of a `count`-topic file against the local stack; within LIMIT_S?"""
    from fastapi.testclient import TestClient

    from deltaferry.airflow.ui import checked_topics
    from deltaferry.ui.web import create_app
    from deltaferry_dev.airflow import services

    env = services.local_env({k: v for k, v in os.environ.items()
                              if k != "DELTAFERRY_KAFKA_BOOTSTRAP"})
    names = fleet_names(count)
    path = topics_file(count)
    if where == "s3":
        from deltaferry.storage import S3Settings

        client = S3Settings.from_env(env).client()
        if "deltaferry-bench" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket="deltaferry-bench")
        warehouse = "s3://deltaferry-bench/fleet-ui"
    else:
        warehouse = str(OUT / "fleet-ui-warehouse")
    env.update({"DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_TOPICS": str(path)})
    started = time.perf_counter()
    fleet_broker(env["DELTAFERRY_KAFKA_BOOTSTRAP"], names)
    fleet_warehouse(warehouse, env, names[:with_data])
    print(f"fleet of {count} topics ({with_data} with data) on the broker at "
          f"{env['DELTAFERRY_KAFKA_BOOTSTRAP']}, warehouse {warehouse} "
          f"(set up in {time.perf_counter() - started:.1f} s)")
    os.environ.update(env)
    runs = fleet_runs(names)
    app = TestClient(create_app(lambda: "bench", env=lambda: env, topics_file=str(path),
                                load=checked_topics,
                                runs=lambda dag_ids: {d: runs[d] for d in dag_ids if d in runs}))
    started = time.perf_counter()
    import airflow.sdk  # noqa: F401 - loaded in the api-server long before a page is asked

    print(f"  Airflow imported in {time.perf_counter() - started:.1f} s (as in the api-server)")
    started = time.perf_counter()
    first = app.get("/")
    cold = time.perf_counter() - started
    shown = first.text.count("<tr data-topic=")
    print(f"  the page shows {shown} topics; its very first request took {cold * 1000:.0f} ms "
          "(cold: with the plugin's check of the file's schedules, once per version of the "
          "file, and the first clients)")
    ok = cold <= LIMIT_S
    paths = ["/", "/?sort=lag&order=desc", "/?sort=state", "/?sort=last_success",
             "/?state=failed", f"/?q={FLEET_PREFIX}01", "/?min_lag=3&sort=lag",
             "/?stale_hours=24&sort=last_success"]
    return measure(app.get, paths, repeat) and shown == count and ok


def parse(count: int) -> bool:
    """Each DAG file parsed as the dag-processor does with a `count`-topic file; within
    PARSE_LIMIT_S together?"""
    import subprocess
    import sys
    import tempfile

    path = topics_file(count)
    dags = Path(__file__).resolve().parents[1] / "dags"
    child = """
import os, sys, time
from airflow.dag_processing.dagbag import BundleDagBag
from airflow.dag_processing.processor import _serialize_dags
import structlog
path = sys.argv[1]
started = time.perf_counter()
bag = BundleDagBag(dag_folder=path, bundle_path=os.path.dirname(path), bundle_name="dags-folder",
                   load_op_links=False)
parsed = time.perf_counter()
serialized, errors = _serialize_dags(bag, structlog.get_logger())
done = time.perf_counter()
print(len(serialized), len(bag.import_errors) + len(errors), parsed - started, done - parsed)
"""
    print(f"dag-processor parse of a {count}-topic file (each DAG file in a fresh process that "
          "has imported Airflow, as the dag-processor's parsing child has):")
    total = 0.0
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DELTAFERRY_TOPICS": str(path), "AIRFLOW_HOME": home,
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
               "DELTAFERRY_WAREHOUSE": str(OUT / "parse-warehouse")}
        for dag_file in sorted(dags.glob("*.py")):
            done = subprocess.run([sys.executable, "-c", child, str(dag_file)], env=env,
                                  capture_output=True, text=True, check=True)
            n_dags, n_errors, parsed, serialized = done.stdout.split()[-4:]
            seconds = float(parsed) + float(serialized)
            total += seconds
            print(f"  {dag_file.name:<30} {int(n_dags):4d} DAGs, {n_errors} import errors: "
                  f"import and build {float(parsed):5.2f} s, serialize {float(serialized):5.2f} s"
                  f", {seconds:5.2f} s")
    print(f"  all DAG files {total:.2f} s (the dag-processor parses them in parallel; "
          f"limit {PARSE_LIMIT_S:g} s)")
    return total <= PARSE_LIMIT_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="requests per page after the first")
    parser.add_argument("--fleet", type=int, metavar="N",
                        help="instead: the topics page of an N-topic file (issue 32: 200)")
    parser.add_argument("--fleet-warehouse", choices=("s3", "local"), default="s3",
                        help="--fleet's warehouse: a bucket of the stack's S3 server or a folder")
    parser.add_argument("--with-data", type=int, default=FLEET_WITH_DATA, metavar="N",
                        help="--fleet's topics with a table (the first N; kept for later runs)")
    parser.add_argument("--parse", type=int, metavar="N",
                        help="instead: the dag-processor's parse of an N-topic file "
                        "(issue 32: 500)")
    args = parser.parse_args()
    if args.parse:
        print(f"within {PARSE_LIMIT_S:g} s: {'yes' if parse(args.parse) else 'NO'}")
        return
    if args.fleet:
        ok = fleet(args.fleet, args.fleet_warehouse, args.repeat, args.with_data)
        print(f"every page within {LIMIT_S:g} s: {'yes' if ok else 'NO'}")
        return

    from deltaferry_dev.airflow import services

    running = services.status()
    if running is not None:
        import httpx

        client = running.client()
        headers = client._headers()
        topics = load_topics().names()
        print(f"deltaferry pages of the running Airflow at {running.url} ({', '.join(topics)}):")
        ok = measure(lambda p: httpx.get(f"{running.url}/deltaferry{p}", headers=headers,
                                         timeout=60), pages(topics), args.repeat)
    else:
        from fastapi.testclient import TestClient

        from deltaferry.ui.web import create_app

        env = services.local_env()
        env.setdefault("DELTAFERRY_WAREHOUSE", str(services.LOCAL_WAREHOUSE))
        os.environ.update(env)
        topics = load_topics().names()
        app = TestClient(create_app(lambda: "bench", env=lambda: env))
        print(f"no local Airflow runs: the pages' app in this process, warehouse "
              f"{env['DELTAFERRY_WAREHOUSE']} ({', '.join(topics)}):")
        ok = measure(app.get, pages(topics), args.repeat)
    print(f"every page within {LIMIT_S:g} s: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
