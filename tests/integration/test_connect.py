"""Steps on a Spark Connect server (issue 47): the local stack's server (`stack up --connect`:
the server JVM behind a TLS front with the stack's CA, a token it checks itself), reached as a
remote one is, through DELTAFERRY_SPARK_REMOTE and DELTAFERRY_SPARK_REMOTE_CA_BUNDLE.

The server is added to the session's stack only when a test of this module asks for it (a JVM
of its own: the rest of the suite does not pay for it), and stopped with the stack.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from deltaferry.storage import S3Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def connect_env(stack_dir, stack_env) -> dict[str, str]:
    """The session stack's assignments with its Spark Connect server started."""
    from deltaferry_dev import stack

    return stack.up(stack_dir, connect=True)


def remote_env(connect_env: dict[str, str], **changes: str) -> dict[str, str]:
    """What a user exports to run steps on the stack's server, with `changes`."""
    names = ("DELTAFERRY_SPARK_REMOTE", "DELTAFERRY_SPARK_REMOTE_CA_BUNDLE",
             "DELTAFERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    return {**{n: connect_env[n] for n in names}, **changes}


def new_bucket(env: dict[str, str]) -> str:
    """A new bucket on the stack's S3 server."""
    bucket = f"connect-{uuid.uuid4().hex[:10]}"
    S3Settings.from_env(env).client().create_bucket(Bucket=bucket)
    return bucket


def test_server_asks_for_its_token_over_tls_and_restarts_in_place(connect_env, stack_dir):
    """A session with the printed URL and the stack's CA runs SQL; one with another token, or
    one that does not trust the stack's CA, is refused; `stack stop|start spark-connect` stops
    the server and starts it again on the same port with the same token."""
    from deltaferry.errors import ConfigError
    from deltaferry.spark.session import connect_session
    from deltaferry_dev import stack

    env = remote_env(connect_env)
    assert env["DELTAFERRY_SPARK_REMOTE"].startswith("sc://localhost:")
    assert ";use_ssl=true;token=" in env["DELTAFERRY_SPARK_REMOTE"]
    spark = connect_session("token-check", env=env)
    assert spark.sql("SELECT 41 + 1 AS answer").first()["answer"] == 42
    spark.stop()
    # pyspark's Connect mode ends with the session: this process's classic Spark (and the
    # processes it starts) build classic columns again
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ

    url, token = env["DELTAFERRY_SPARK_REMOTE"].split(";token=")
    wrong = remote_env(connect_env, DELTAFERRY_SPARK_REMOTE=f"{url};token=not-{token}")
    with pytest.raises(ConfigError) as refused:  # at once, not after pyspark's retries
        connect_session("wrong-token", env=wrong)
    assert "DELTAFERRY_SPARK_REMOTE" in str(refused.value)
    assert "UNAUTHENTICATED" in str(refused.value), refused.value
    assert token not in str(refused.value)

    untrusting = {k: v for k, v in env.items() if k != "DELTAFERRY_SPARK_REMOTE_CA_BUNDLE"}
    with pytest.raises(ConfigError) as untrusted:
        connect_session("no-ca", env=untrusting)
    assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value), untrusted.value

    assert "stopped" in stack.stop_service("spark-connect", stack_dir)
    assert "started" in stack.start_service("spark-connect", stack_dir)
    spark = connect_session("after-restart", env=env)
    assert spark.sql("SELECT 7 AS n").first()["n"] == 7
    spark.stop()


def test_sessions_on_one_server_keep_their_own_s3_credentials(connect_env):
    """Two sessions on one server, the second with another (wrong) S3 secret: the second
    cannot read the table the first wrote and read, though the server's Hadoop caches a file
    system per bucket (the sessions' file systems are their own), and neither session's
    credentials are the server's: the server holds none."""
    from pyspark.errors import PySparkException

    from deltaferry.spark.session import connect_session

    env = remote_env(connect_env)
    bucket = new_bucket(env)
    path = f"s3a://{bucket}/table"
    first = connect_session("first", env=env)
    first.range(5).write.format("delta").save(path)
    assert first.read.format("delta").load(path).count() == 5

    other = remote_env(connect_env, AWS_SECRET_ACCESS_KEY="not-the-secret")
    second = connect_session("second", env=other)
    with pytest.raises(PySparkException) as refused:
        second.read.format("delta").load(path).count()
    assert "403" in str(refused.value) or "Forbidden" in str(refused.value)
    assert second.conf.get("fs.s3a.secret.key") == "not-the-secret"
    assert first.conf.get("fs.s3a.secret.key") == env["AWS_SECRET_ACCESS_KEY"]
    first.stop()
    second.stop()


def test_cli_maintains_a_table_and_streams_a_topic_over_spark_connect(connect_env, new_topic,
                                                                      tmp_path):
    """`deltaferry run --steps optimize,vacuum` with DELTAFERRY_SPARK_REMOTE compacts and
    vacuums the topic's table on the stack's server (delta-rs reads the OPTIMIZE in its
    history and the rows unchanged in one file; the replaced files are gone from the bucket).
    `deltaferry stream` of a second topic (the core scenario, 100 messages a micro-batch) runs
    on the server: it lands the messages sent before it started and those sent while it runs,
    logs each micro-batch's progress line (the server's worker wrote them), and SIGTERM stops
    it between micro-batches (exit 0, its lock released): the table holds the latest valid
    value of every key, each batch's write once, the quarantine every bad message once, and
    the stop request and results files are gone. No line of either run holds the token."""
    import signal
    import subprocess
    import time

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths
    from deltaferry.state import committed_offsets
    from deltaferry.storage import storage_for

    from .test_cli import CLI
    from .test_crash import messages

    env = remote_env(connect_env)
    bootstrap = connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    warehouse = f"s3://{new_bucket(env)}/wh"
    topic, streamed = new_topic("connect"), new_topic("connect-stream", partitions=3)
    table = delta_rs_uri(TopicPaths.for_topic(warehouse, topic).table)
    options = storage_options(table, env)
    for n in range(3):  # three small files: optimize_min_files is 2
        write_deltalake(table, pa.table({"id": [n]}), mode="append", storage_options=options)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    optimize_min_files: 2\n"
                      "    vacuum_retention_hours: 0\n"
                      f"  - name: {streamed}\n    max_offsets_per_trigger: 100\n"
                      "    trigger_interval: 1 second\n")
    full = {**os.environ, **env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap}
    done = subprocess.run([CLI, "run", topic, "--steps", "optimize,vacuum"], env=full,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    history = [c["operation"] for c in DeltaTable(table, storage_options=options).history()]
    assert history.count("OPTIMIZE") == 1, history
    after = DeltaTable(table, storage_options=options)
    assert sorted(after.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2]
    assert len(after.file_uris()) == 1
    # VACUUM (retention 0 h) deleted the three files OPTIMIZE replaced: one data file is left
    bucket, prefix = table[len("s3://"):].split("/", 1)
    listed = S3Settings.from_env(env).client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    data = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".parquet")
            and "/_delta_log/" not in o["Key"]]
    assert len(data) == 1, data

    paths = TopicPaths.for_topic(warehouse, streamed)
    sent = messages()[:200]  # 100 before the stream starts, 100 while it runs
    produce(bootstrap, streamed, sent[:100])
    stream = subprocess.Popen([CLI, "stream", streamed], env=full, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_batch(stream, full, paths.checkpoint, 0, "the stream")
        produce(bootstrap, streamed, sent[100:])
        checkpoint = storage_for(paths.checkpoint, full)
        deadline = time.monotonic() + 600
        while sum((committed_offsets(checkpoint, paths.checkpoint, streamed) or {}).values()
                  ) < len(sent):  # every message committed: the stream then waits for more
            assert stream.poll() is None, stream.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the stream never read every message"
            time.sleep(0.5)
        stream.send_signal(signal.SIGTERM)
        out, err = stream.communicate(timeout=300)
    finally:
        if stream.poll() is None:
            os.killpg(stream.pid, signal.SIGKILL)
    assert stream.returncode == 0, err[-3000:]
    assert "SIGTERM received: stopping after the current micro-batch" in err, err[-3000:]
    assert f"stream {streamed}: stopping between micro-batches" in err, err[-3000:]
    lines = [line for line in err.splitlines()
             if f"ingest {streamed} batch " in line and " messages, " in line]
    tags = [c["tag"] for c in landed(delta_rs_uri(paths.table), options, sent)]
    assert len(tags) == len(set(tags)) >= 2, tags  # 200 messages, at most 100 a batch
    assert len(lines) == len(tags), err[-3000:]  # each batch written said once
    quarantined(delta_rs_uri(paths.quarantine), options, sent)
    bucket, prefix = paths.root[len("s3a://"):].split("/", 1)
    left = S3Settings.from_env(env).client().list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/_state/connect/").get("Contents", [])
    assert not left, [o["Key"] for o in left]
    token = env["DELTAFERRY_SPARK_REMOTE"].split(";token=")[1]
    assert token not in done.stdout + done.stderr + out + err


def test_columns_a_json_topic_grows_over_spark_connect_stay_plain_strings(connect_env,
                                                                         new_topic, tmp_path):
    """A JSON topic's ingest over Spark Connect appends its first micro-batch to the empty
    table, the new columns added by that append, then MERGEs a second one that brings a new
    top-level column and a new nested field (the schema grown in the batch: the infer step
    saw neither). Each string column and field reaches the Delta log as `string` (a type Spark
    Connect's proto form of a cast made `string collate UTF8_BINARY`, which delta-rs refuses:
    the table could no longer be read), and delta-rs reads the latest value of every key."""
    import json
    import subprocess

    from deltalake import DeltaTable

    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths

    from .test_cli import CLI

    env = remote_env(connect_env)
    bootstrap = connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    warehouse = f"s3://{new_bucket(env)}/wh"
    topic = new_topic("connect-grows")
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    max_offsets_per_trigger: 12\n")
    full = {**os.environ, **env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap}

    def run(steps: str) -> None:
        done = subprocess.run([CLI, "run", topic, "--steps", steps], env=full,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    produce(bootstrap, topic, [(f"k{i % 4}", {"id": i % 4, "name": f"n{i}",
                                              "address": {"city": f"c{i}"}})
                               for i in range(12)])
    run("infer")
    produce(bootstrap, topic, [("k1", {"id": 1, "name": "later", "note": "new",
                                       "address": {"city": "x", "zip": "1234"}})])
    run("ingest")  # two micro-batches: the 12 appended, then the one MERGEd

    table = delta_rs_uri(TopicPaths.for_topic(warehouse, topic).table)
    delta = DeltaTable(table, storage_options=storage_options(table, env))  # refused collation
    operations = [c["operation"] for c in delta.history()]
    assert "MERGE" in operations and "WRITE" in operations, operations
    schema = json.dumps(delta.schema().to_json())
    assert "collat" not in schema.lower(), schema
    rows = {r["kafka_key"]: (r["name"], r["note"], r["address"])
            for r in delta.to_pyarrow_table().to_pylist()}
    assert rows == {"k0": ("n8", None, {"city": "c8", "zip": None}),
                    "k1": ("later", "new", {"city": "x", "zip": "1234"}),
                    "k2": ("n10", None, {"city": "c10", "zip": None}),
                    "k3": ("n11", None, {"city": "c11", "zip": None})}


def test_cli_replays_the_quarantine_over_spark_connect_exactly_once(connect_env, new_topic,
                                                                     tmp_path):
    """test_replay.py's scenario on the stack's server: schema v1 (a: long) quarantines the
    values with decimals at ingest (`deltaferry run --steps ingest`); with v2 (a: double),
    `deltaferry quarantine replay --reason "does not fit"` lands the newest of them (the older
    one never overwrites a newer row: delta-rs reads the table) and marks its rows replayed
    (its claim and mark are SQL MERGEs on the server); a second replay claims nothing more."""
    import subprocess

    from deltalake import DeltaTable

    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri
    from deltaferry.paths import TopicPaths
    from deltaferry.schema.store import SchemaStore

    from .test_cli import CLI
    from .test_replay import MESSAGES, pin

    env = remote_env(connect_env)
    topic = new_topic("connect-replay", partitions=1)
    produce(connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, MESSAGES)
    warehouse = tmp_path / "wh"  # the server is on this machine: a folder it reads too
    paths = TopicPaths.for_topic(str(warehouse), topic)
    store = SchemaStore(paths.schema)
    pin(store, "long", len(MESSAGES))
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n")
    full = {**os.environ, **env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": str(warehouse),
            "DELTAFERRY_KAFKA_BOOTSTRAP": connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]}
    done = subprocess.run([CLI, "run", topic, "--steps", "ingest"], env=full,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    def table() -> dict:
        rows = DeltaTable(delta_rs_uri(paths.table)).to_pyarrow_table().to_pylist()
        return {r["kafka_key"]: (r["a"], r["kafka_offset"]) for r in rows}

    assert table() == {"k": (3, 2), "n": (5, 4)}
    pin(store, "double", len(MESSAGES))
    replays = [subprocess.run([CLI, "quarantine", "replay", topic, "--reason", "does not fit"],
                              env=full, capture_output=True, text=True, timeout=900)
               for _ in range(2)]
    for replay in replays:
        assert replay.returncode == 0, replay.stderr[-3000:]
    assert table() == {"k": (3.0, 2), "m": (4.5, 3), "n": (6.5, 5)}
    quarantine = DeltaTable(delta_rs_uri(paths.quarantine)).to_pyarrow_table().to_pylist()
    replayed = sorted(r["kafka_offset"] for r in quarantine if r["replayed_at"] is not None)
    assert replayed == [1, 3, 5] and len(quarantine) == 5  # marked, nothing deleted
    assert len({r["replay_id"] for r in quarantine if r["replayed_at"] is not None}) == 1
    token = env["DELTAFERRY_SPARK_REMOTE"].split(";token=")[1]
    assert not [r for r in [done, *replays] if token in r.stdout + r.stderr]


def test_topics_of_two_s3_identities_and_every_format_ingest_on_one_server(
        connect_env, stack_dir, new_topic, tmp_path):
    """Two topics, each with a warehouse in a bucket of its own and S3 credentials allowed
    only that bucket (two identities of the stack's S3 server, each refused the other's
    bucket), run `deltaferry run` (infer, ingest) at the same time on the one Connect server:
    both land every message, each bucket holds its own topics' files only (the server's
    sessions, file systems and foreachBatch workers each used their run's credentials), and a
    run given one topic's credentials and the other's warehouse is refused in one line naming
    that warehouse. No line of a run holds a secret.

    More topics follow on the same server, one run at a time, each path once: the second
    topic's table is laid out by `cluster_by: [id]` and an append topic's by `partition_by:
    [day(kafka_timestamp)]` (its generated column included) as their first batch finds them
    empty (Delta's SQL: no DeltaTable API over Spark Connect); an avro topic's run is given
    the Schema Registry over HTTPS with the stack's CA (the server's worker reads writer
    schemas with the session's registry settings: the server's environment names none), and
    the latest record of every key lands, the second schema version's field included; a
    registry-backed protobuf topic, run beside it, lands its two writer versions' latest
    message of every key as a driver of its own does (its bodies decoded in the server's
    Python workers) and quarantines a frame that is no frame, an unknown schema id and a
    body that does not decode, each with its reason. Two
    `cdc: debezium` topics (history current and scd2) land Debezium's events as a driver of
    their own lands them (their MERGEs, the remembered deletes' table and its MERGE in Delta's
    SQL): each live key's newest event, every version with its start and end, deleted keys
    remembered."""
    import json
    import subprocess

    from botocore.exceptions import ClientError
    from deltalake import DeltaTable

    from deltaferry.formats.protobuf.wire import encode_frame
    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths
    from deltaferry_dev import stack
    from deltaferry_dev.debezium_events import expected_rows
    from deltaferry_dev.debezium_events import messages as debezium_messages

    from .test_cdc import at, expected_versions, first_run
    from .test_cli import CLI
    from .test_crash import messages
    from .test_outages import avro_messages
    from .test_protobuf import V1, V2, Writer

    env = remote_env(connect_env)
    bootstrap = connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    buckets = [new_bucket(env), new_bucket(env)]
    identities = [stack.add_s3_identity([bucket], stack_dir) for bucket in buckets]
    for (key, secret), other in zip(identities, reversed(buckets), strict=True):
        scoped = S3Settings(env["DELTAFERRY_S3_ENDPOINT"], key, secret).client()
        with pytest.raises(ClientError):  # what makes the two runs' credentials differ
            scoped.list_objects_v2(Bucket=other, MaxKeys=1)
    sent = messages()[:120]  # 120 keys, tombstones, bad messages
    topics = [new_topic("connect-s3a"), new_topic("connect-s3b")]
    topics_file = tmp_path / "topics.yaml"
    avro, cdc, scd2 = new_topic("connect-avro"), new_topic("connect-cdc"), new_topic("connect-scd2")
    daily, proto = new_topic("connect-daily"), new_topic("connect-proto", partitions=1)
    topics_file.write_text(f"topics:\n  - name: {topics[0]}\n"
                           f"  - name: {topics[1]}\n    cluster_by: [id]\n"
                           f"  - name: {avro}\n    format: avro\n"
                           f"  - name: {proto}\n    format: protobuf\n"
                           f"  - name: {cdc}\n    cdc: debezium\n"
                           f"  - name: {scd2}\n    cdc: debezium\n    history: scd2\n"
                           f"  - name: {daily}\n    mode: append\n"
                           "    partition_by: [day(kafka_timestamp)]\n")
    avro_sent = avro_messages(bootstrap, connect_env["DELTAFERRY_SCHEMA_REGISTRY_URL"], avro)
    v1, v2 = (Writer(text, connect_env["DELTAFERRY_SCHEMA_REGISTRY_URL"], proto)
              for text in (V1, V2))
    good = v1(id="o1", quantity=2, tags=["a"], attributes={"gift": "yes"},
              lines=[{"sku": "s1", "count": 2}])
    schema_v1 = int.from_bytes(good[1:5], "big")
    produce(bootstrap, proto, [
        ("k1", good), ("k2", v1(id="o2")), ("k2", None), ("k3", v1(id="o3", quantity=1)),
        ("k3", v2(id="o3", quantity=3, note="v2 update")),
        ("k1", b"\x01not a frame"),                              # bad magic byte
        ("k3", encode_frame(999_999) + b"\x0a\x01x"),              # unknown schema id
        ("k1", encode_frame(schema_v1, (1,)) + b"\xff\xff\xff")])  # undecodable body

    def run_env(bucket: str, identity: tuple[str, str]) -> dict[str, str]:
        return {**os.environ, **env, "AWS_ACCESS_KEY_ID": identity[0],
                "AWS_SECRET_ACCESS_KEY": identity[1], "DELTAFERRY_TOPICS": str(topics_file),
                "DELTAFERRY_WAREHOUSE": f"s3://{bucket}/wh",
                "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap}

    registry = {  # over HTTPS, the stack's CA: the client's file, its text to the worker
        "DELTAFERRY_SCHEMA_REGISTRY_URL": connect_env["DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL"],
        "DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE": connect_env["DELTAFERRY_TLS_CA_FILE"]}
    for topic in topics:
        produce(bootstrap, topic, sent)
    for name in (cdc, scd2):
        produce(bootstrap, name, debezium_messages(first_run(), True))
    produce(bootstrap, daily, [(None, {"seq": n}) for n in range(20)])
    # the two identities at once, then the formats one at a time: a busy 2-core server starts
    # the foreachBatch worker of more queries at once late (it has 10 s to connect back)
    waves = [[(topics[0], 0, {}), (topics[1], 1, {})], [(avro, 0, registry), (proto, 0, registry)],
             [(daily, 1, {})],
             [(cdc, 1, {})], [(scd2, 1, {})]]
    said = []
    for wave in waves:
        runs = [subprocess.Popen([CLI, "run", name, "--steps", "infer,ingest"],
                                 env={**run_env(buckets[n], identities[n]), **extra},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name, n, extra in wave]
        ended = [run.communicate(timeout=900) for run in runs]
        for run, (_, err) in zip(runs, ended, strict=True):
            assert run.returncode == 0, err[-3000:]
        said += ended

    admin = S3Settings.from_env(env).client()
    for topic, bucket in zip(topics, buckets, strict=True):
        table = delta_rs_uri(TopicPaths.for_topic(f"s3://{bucket}/wh", topic).table)
        landed(table, storage_options(table, env), sent)
        listed = admin.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert listed and {o["Key"].split("/")[1] for o in listed} == (
            {topic, avro, proto} if bucket == buckets[0] else {topic, daily, cdc, scd2}), bucket
        logged = [json.loads(line) for o in listed if o["Key"].endswith(".json")
                  and f"/{topic}/table/_delta_log/" in o["Key"]
                  for line in admin.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                  .decode().splitlines()]
        domains = [e["domainMetadata"] for e in logged if "domainMetadata" in e
                   and e["domainMetadata"]["domain"] == "delta.clustering"]
        if topic == topics[1]:  # clustered by id: Delta's clustering domain names it
            assert domains and json.loads(domains[-1]["configuration"])[
                "clusteringColumns"] == [["id"]], domains
        else:
            assert not domains, domains

    table = delta_rs_uri(TopicPaths.for_topic(f"s3://{buckets[0]}/wh", avro).table)
    rows = DeltaTable(table, storage_options=storage_options(table, env)
                      ).to_pyarrow_table().to_pylist()
    assert {r["kafka_key"]: (r["id"], r["note"]) for r in rows} == {
        key: (payload["id"], payload.get("note")) for key, payload in avro_sent}
    assert len(rows) == 30 and any(r["note"] for r in rows)

    uri = delta_rs_uri(TopicPaths.for_topic(f"s3://{buckets[0]}/wh", proto).table)
    rows = DeltaTable(uri, storage_options=storage_options(uri, env)).to_pyarrow_table().to_pylist()
    latest = {r["kafka_key"]: r for r in rows}
    assert {key: (r["id"], r["quantity"], r["note"]) for key, r in latest.items()} == {
        "k1": ("o1", 2, None), "k3": ("o3", 3, "v2 update")}
    assert (latest["k1"]["tags"], latest["k1"]["lines"]) == (["a"], [{"sku": "s1", "count": 2}])
    uri = delta_rs_uri(TopicPaths.for_topic(f"s3://{buckets[0]}/wh", proto).quarantine)
    bad = DeltaTable(uri, storage_options=storage_options(uri, env)).to_pyarrow_table().to_pylist()
    assert [(r["kafka_key"], r["reason"]) for r in sorted(bad, key=lambda r: r["kafka_offset"])
            ] == [("k1", "not Confluent wire format for protobuf: magic byte is 0x01, not 0x00"),
                  ("k3", "schema id 999999 is not known to the schema registry"),
                  ("k1", f"protobuf body does not decode as shop.Order (schema id {schema_v1}): "
                         "Error parsing message with type 'shop.Order': Wire format was corrupt")]

    def read(name: str) -> list[dict]:
        uri = delta_rs_uri(TopicPaths.for_topic(f"s3://{buckets[1]}/wh", name).table)
        return DeltaTable(uri, storage_options=storage_options(uri, env)
                          ).to_pyarrow_table().to_pylist()

    assert sorted(r["seq"] for r in read(daily)) == list(range(20))
    uri = delta_rs_uri(TopicPaths.for_topic(f"s3://{buckets[1]}/wh", daily).table)
    partitions = DeltaTable(uri, storage_options=storage_options(uri, env)
                            ).metadata().partition_columns
    assert partitions == ["kafka_timestamp_day"], partitions
    events = first_run()
    assert {r["id"]: (r["__op"], r["__source_lsn"]) for r in read(cdc)} == {
        key: (event.op, event.lsn) for key, event in expected_rows(events).items()}
    versions = {(r["id"], r["__start_at"].replace(tzinfo=None),
                 r["__end_at"] and r["__end_at"].replace(tzinfo=None)): r["__source_lsn"]
                for r in read(scd2)}
    assert versions == {(key, at(start), at(end)): event.lsn
                        for key, kept in expected_versions(events).items()
                        for start, end, event in kept}
    for name in (cdc, scd2):  # 1002 deleted for good: remembered with its delete's position
        uri = delta_rs_uri(TopicPaths.for_topic(f"s3://{buckets[1]}/wh", name).deletes)
        remembered = DeltaTable(uri, storage_options=storage_options(uri, env)
                                ).to_pyarrow_table().to_pylist()
        assert 1002 in {r["id"] for r in remembered}, (name, remembered)

    refused = subprocess.run([CLI, "run", topics[1], "--steps", "ingest"],
                             env=run_env(buckets[1], identities[0]), capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    last = [line for line in refused.stderr.splitlines() if line.strip()][-1]
    assert f"s3://{buckets[1]}/wh" in last and "access denied" in last, refused.stderr
    secrets = [env["DELTAFERRY_SPARK_REMOTE"].split(";token=")[1],
               *(secret for _, secret in identities)]
    outputs = [out + err for out, err in said] + [refused.stdout + refused.stderr]
    assert not [s for s in secrets for text in outputs if s in text]


def landed(table: str, options: dict[str, str] | None, sent) -> list[dict]:
    """Reads the Delta table at `table` (a delta-rs URI) with delta-rs, asserts that it holds
    the latest valid value of each key of `sent` (`expected_state`), one row per key, and
    returns the commits that wrote a micro-batch, newest first, each with its batch's "tag"
    (its userMetadata without the attempt)."""
    from deltalake import DeltaTable

    from .test_pipeline import expected_state

    delta = DeltaTable(table, storage_options=options)
    rows = delta.to_pyarrow_table().to_pylist()
    state = {r["kafka_key"]: {"id": r["id"], "version": r["version"], "tag": r["tag"]}
             for r in rows}
    assert len(state) == len(rows), "more than one row for a key"
    assert state == expected_state(sent)
    return [{**c, "tag": c["userMetadata"].split(" attempt ")[0]} for c in delta.history()
            if " batch " in (c.get("userMetadata") or "")]


def quarantined(quarantine: str, options: dict[str, str] | None, sent) -> list[dict]:
    """The rows of the quarantine table at `quarantine` (a delta-rs URI), read by delta-rs,
    asserted to hold the raw value of every bad message of `sent` once (`bad_values`)."""
    from deltalake import DeltaTable

    from .test_crash import bad_values

    bad = DeltaTable(quarantine, storage_options=options).to_pyarrow_table().to_pylist()
    assert sorted(bytes(r["raw_value"]) for r in bad) == bad_values(sent)
    return bad


def committed_batches(env: dict[str, str], checkpoint: str) -> set[int]:
    """The micro-batches the streaming checkpoint at `checkpoint` (s3a://) has committed."""
    bucket, prefix = checkpoint[len("s3a://"):].split("/", 1)
    listed = S3Settings.from_env(env).client().list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/commits/")
    return {int(o["Key"].rsplit("/", 1)[1]) for o in listed.get("Contents", [])
            if o["Key"].rsplit("/", 1)[1].isdigit()}


def wait_for_batch(run, env: dict[str, str], checkpoint: str, batch: int, what: str) -> None:
    """Wait until the checkpoint committed micro-batch `batch` while `run` (a Popen) runs."""
    import time

    deadline = time.monotonic() + 900
    while batch not in committed_batches(env, checkpoint):
        if run.poll() is not None:
            raise AssertionError(f"{what} ended (exit {run.returncode}) before batch {batch} "
                                 f"was committed: {run.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: batch {batch} never committed"
        time.sleep(0.3)


def test_ingest_over_spark_connect_lands_every_message_once_across_a_killed_client_and_a_restarted_server(  # noqa: E501
        connect_env, stack_dir, new_topic, tmp_path):
    """The core scenario (versions per key over 3 partitions, tombstones, bad messages) through
    the stack's Connect server, `deltaferry run` with DELTAFERRY_SPARK_REMOTE: the first run
    (infer, then ingest) is SIGKILLed once its query committed a micro-batch (its query lives
    on in the server, fenced by the lock the next run takes over); more messages are sent; the
    second run's server is restarted under it once it committed a micro-batch of its own: it
    fails in one line, no traceback; the third run lands the rest. The table is then the latest
    valid value of every key, each micro-batch's write was applied once (one commit per batch
    tag), the quarantine holds every bad message once, and the third run's report has the
    counts its batches committed (the MERGEs' metrics, the quarantine rows it appended), which
    the server's Python worker wrote for it. No line of any run holds the token."""
    import json
    import subprocess
    import time

    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths
    from deltaferry_dev import stack

    from .test_cli import CLI
    from .test_crash import kill_group, messages

    env = remote_env(connect_env)
    bootstrap = connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    warehouse = f"s3://{new_bucket(env)}/wh"
    topic = new_topic("connect-ingest", partitions=3)
    paths = TopicPaths.for_topic(warehouse, topic)
    sent = messages()[:300]  # 150, then 150 more
    produce(bootstrap, topic, sent[:150])
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    max_offsets_per_trigger: 50\n")
    full = {**os.environ, **env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap}
    said = []

    first = subprocess.Popen([CLI, "run", topic, "--steps", "infer,ingest"], env=full,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    wait_for_batch(first, full, paths.checkpoint, 0, "the first run")
    kill_group(first, "first run")
    said.append(first.stdout.read() + first.stderr.read())

    produce(bootstrap, topic, sent[150:])
    second = subprocess.Popen([CLI, "run", topic, "--steps", "ingest"], env=full,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_batch(second, full, paths.checkpoint, 3, "the second run")  # past the first 150
    assert "stopped" in stack.stop_service("spark-connect", stack_dir)
    assert "started" in stack.start_service("spark-connect", stack_dir)
    out, err = second.communicate(timeout=600)
    said.append(out + err)
    assert second.returncode != 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert "Spark Connect" in last and topic in last, err[-3000:]

    started_ms = time.time() * 1000
    report_file = tmp_path / "report.json"
    third = subprocess.run([CLI, "run", topic, "--steps", "ingest", "--report",
                            str(report_file)], env=full, capture_output=True, text=True,
                           timeout=900)
    said.append(third.stdout + third.stderr)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "taking over the lock" not in third.stderr  # the second run released its own

    table_uri = delta_rs_uri(paths.table)
    options = storage_options(table_uri, full)
    batches = landed(table_uri, options, sent)
    tags = [c["tag"] for c in batches]
    assert len(tags) == len(set(tags)) >= 6, tags  # 300 messages, 50 a batch: each once

    bad = quarantined(delta_rs_uri(paths.quarantine), options, sent)
    positions = [(r["kafka_partition"], r["kafka_offset"]) for r in bad]
    assert len(positions) == len(set(positions))

    [report] = json.loads(report_file.read_text())
    mine = [c for c in batches if c["timestamp"] >= started_ms]
    assert report["batches"] >= 1 and mine, (report, mine)
    metrics = [c["operationMetrics"] for c in mine]
    for name, metric in (("inserted", "numTargetRowsInserted"),
                         ("updated", "numTargetRowsUpdated"),
                         ("deleted", "numTargetRowsDeleted")):
        assert report[name] == sum(int(m.get(metric, 0)) for m in metrics), (name, report)
    assert report["inserted"] + report["updated"] + report["deleted"] > 0, report
    appended = [r for r in bad if r["quarantined_at"].timestamp() * 1000 >= started_ms]
    assert report["quarantined"] == len(appended), report
    assert f"ingest {topic}:" in third.stdout
    # the batches' own progress lines, which the server's worker wrote, in the run's log
    lines = [line for line in third.stderr.splitlines()
             if f"ingest {topic} batch " in line and " messages, " in line]
    assert len(lines) == report["batches"], third.stderr[-3000:]
    # the killed first run's results file is gone, the third run's own too
    bucket, prefix = paths.root[len("s3a://"):].split("/", 1)
    left = S3Settings.from_env(env).client().list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/_state/connect/").get("Contents", [])
    assert not left, [o["Key"] for o in left]
    assert "left behind by a killed run" in third.stderr

    token = env["DELTAFERRY_SPARK_REMOTE"].split(";token=")[1]
    assert not [text for text in said if token in text]
    assert token not in (stack_dir / "connect" / "server.log").read_text()


def test_s3_stopped_during_an_ingest_over_spark_connect_leaves_no_lock_behind(
        connect_env, stack_dir, new_topic, tmp_path):
    """The core scenario through the stack's Connect server, the warehouse on the stack's S3
    server: once the run's query committed a micro-batch, the S3 server is stopped (really:
    `stack stop s3`); the run fails in one line naming the warehouse and S3, no traceback, and
    cannot release its lock. Once S3 is back (the same data, identity and port), the next run
    is not locked out (it takes the failed run's lock over) and lands every message exactly
    once: delta-rs reads the latest valid value of every key, one commit per batch tag, every
    bad message quarantined once."""
    import subprocess

    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths
    from deltaferry_dev import stack

    from .test_cli import CLI
    from .test_crash import messages

    env = remote_env(connect_env)
    bootstrap = connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    warehouse = f"s3://{new_bucket(env)}/wh"
    topic = new_topic("connect-s3-out", partitions=3)
    paths = TopicPaths.for_topic(warehouse, topic)
    sent = messages()[:200]
    produce(bootstrap, topic, sent)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    max_offsets_per_trigger: 50\n")
    full = {**os.environ, **env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap}

    first = subprocess.Popen([CLI, "run", topic, "--steps", "infer,ingest"], env=full,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_batch(first, full, paths.checkpoint, 0, "the first run")  # 1 of 4 batches
        assert "stopped" in stack.stop_service("s3", stack_dir)
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
        stack.start_service("s3", stack_dir)  # the same data, identity and port
    assert first.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith(f"deltaferry: error: warehouse {warehouse}: "), err[-3000:]
    assert "S3" in last and topic in last, last
    assert "could not release the lock" in err, err[-3000:]

    second = subprocess.run([CLI, "run", topic, "--steps", "ingest"], env=full,
                            capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "taking over the lock of pid" in second.stderr, second.stderr[-3000:]

    table_uri = delta_rs_uri(paths.table)
    options = storage_options(table_uri, full)
    tags = [c["tag"] for c in landed(table_uri, options, sent)]
    assert len(tags) == len(set(tags)) >= 4, tags  # 200 messages, 50 a batch: each once
    quarantined(delta_rs_uri(paths.quarantine), options, sent)
    token = env["DELTAFERRY_SPARK_REMOTE"].split(";token=")[1]
    assert token not in out + err + second.stdout + second.stderr


def test_dag_run_over_a_spark_connect_connection_lands_the_core_scenario(
        connect_env, shared_airflow, kafka_bootstrap, new_topic):
    """A topic's DAG in the shared Airflow, its ``spark_default`` the stack's server as `airflow
    up --connect` defines it (type spark_connect: host, port, the token, TLS with the stack's
    CA): a run triggered through the REST API runs infer, ingest, optimize and vacuum on the
    server. delta-rs reads the latest valid value of every key and a VACUUM in the table's
    history, every bad message in the quarantine and its OPTIMIZE; the ingest's XCom says it
    ran over Spark Connect with every message read, its log each batch's progress line while
    the query ran; no task's log holds the token. What the task makes of the report is what
    it makes of a driver's own: its alert (`max_quarantined_ratio`, action warn) is posted to
    the topic's notify webhook with the run's ratio, and the ingest's OpenLineage COMPLETE
    event reads the topic's messages and writes the table and the quarantine, with their
    counts."""
    from datetime import datetime
    from functools import partial

    from deltalake import DeltaTable

    from deltaferry.kafka import produce
    from deltaferry.lake import delta_rs_uri
    from deltaferry_dev.airflow.rest import wait_until
    from deltaferry_dev.stack import connect

    from .test_airflow import finished_run
    from .test_alerts import lineage_event, posts_for
    from .test_crash import bad_values, messages

    token = connect_env["DELTAFERRY_SPARK_REMOTE"].split(";token=")[1]
    topic = new_topic("connect-dag", partitions=3)
    sent = messages()[:240]  # two versions of each of 120 keys, tombstones, bad messages
    produce(kafka_bootstrap, topic, sent)
    client = shared_airflow.client()
    client.set_connection("spark_default", connect.airflow_connection(connect_env))
    client.set_connection("connect_hook", shared_airflow.receiver.connection())
    try:
        with shared_airflow.hosting(f"  - name: {topic}\n    schedule: null\n    retries: 0\n"
                                    "    max_offsets_per_trigger: 120\n"
                                    "    optimize_min_files: 2\n"
                                    "    vacuum_retention_hours: 0\n"
                                    "    alerts: {max_quarantined_ratio: 0.01}\n"
                                    "    notify: [connect_hook]\n"):
            dag_id = f"ingest_{topic}"
            client.set_paused(dag_id, False)
            run, states = finished_run(client, dag_id, client.trigger(dag_id)["dag_run_id"])
            logs = {task: client.log(dag_id, run["dag_run_id"], task) for task in states}
            ingest = client.result(dag_id, run["dag_run_id"], "ingest")
    finally:
        client.call("DELETE", "/connections/spark_default")
        client.call("DELETE", "/connections/connect_hook")
    assert states == {"infer_schema": "success", "ingest": "success", "optimize": "success",
                      "vacuum": "success"}, states
    paths = shared_airflow.paths(topic)
    batches = landed(delta_rs_uri(paths.table), None, sent)
    table = DeltaTable(delta_rs_uri(paths.table))
    assert "VACUUM END" in [c["operation"] for c in table.history()]
    quarantine = DeltaTable(delta_rs_uri(paths.quarantine))
    assert "OPTIMIZE" in [c["operation"] for c in quarantine.history()]  # two appends, one file
    bad = quarantine.to_pyarrow_table().to_pylist()
    assert sorted(bytes(r["raw_value"]) for r in bad) == bad_values(sent)
    assert ingest["task"]["driver"] == "spark-connect", ingest["task"]
    assert (ingest["messages_read"], ingest["quarantined"]) == (len(sent), len(bad_values(sent)))
    assert "a Spark Connect server (Airflow connection 'spark_default')" in logs["ingest"]
    # each batch's progress line logged while the query ran: the first before the last
    # batch's commit
    lines = [line for line in logs["ingest"].splitlines()
             if f"ingest {topic} batch " in line and " messages, " in line]
    assert len(lines) == ingest["batches"] >= 2, logs["ingest"][-3000:]
    said_ms = datetime.strptime(lines[0][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
    committed_ms = max(c["timestamp"] for c in batches)
    assert said_ms < committed_ms, (lines[0], committed_ms)
    assert not [task for task, text in logs.items() if token in text]

    ratio = round(len(bad_values(sent)) / len(sent), 4)
    (body,) = wait_until(lambda: posts_for(shared_airflow.receiver, topic), 30, interval=0.5,
                         what="the alert's POST")
    assert (body["alert"], body["value"], body["threshold"], body["action"]) == (
        "max_quarantined_ratio", ratio, 0.01, "warn"), body
    assert (body["dag_id"], body["run_id"], body["task_id"]) == (
        dag_id, run["dag_run_id"], "ingest")
    event = wait_until(partial(lineage_event, shared_airflow.receiver, dag_id, "ingest",
                               "COMPLETE"), 60, interval=0.5, what="the ingest's COMPLETE event")
    (source,) = event["inputs"]
    assert (source["name"], source["inputFacets"]["inputStatistics"]["rowCount"]) == (
        topic, len(sent))
    written, quarantined = event["outputs"]
    assert written["name"] == str(Path(paths.table).resolve())
    assert written["outputFacets"]["outputStatistics"]["rowCount"] == (
        ingest["inserted"] + ingest["updated"]) > 0
    assert {"kafka_key", "id", "version", "tag"} <= {
        c["name"] for c in written["facets"]["schema"]["fields"]}
    assert quarantined["outputFacets"]["outputStatistics"]["rowCount"] == len(bad_values(sent))
