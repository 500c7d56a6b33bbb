"""`deltaferry stream`'s pieces that need no cluster: signals turned into a stop request, and
the per-batch progress lines (each batch logged once, idle triggers not at all)."""

import json
import os
import signal
import threading

from deltaferry.spark.ingest.progress import StreamProgress
from deltaferry.steps import stop_on_signals


def test_sigterm_and_sigint_set_the_stop_event_instead_of_ending_the_process():
    before = signal.getsignal(signal.SIGTERM)
    for number in (signal.SIGTERM, signal.SIGINT):
        stop = threading.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), number)  # a real signal to this process
            assert stop.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def progress(batch_id: int, rows: int, end: dict) -> dict:
    return {"batchId": batch_id, "numInputRows": rows, "sources": [{"endOffset": end}],
            "durationMs": {"triggerExecution": 1200}}


def test_each_batch_with_messages_is_taken_once_and_counted():
    batches = StreamProgress("t", keep=2)
    first = [progress(0, 10, {"t": {"0": 10}}), progress(1, 0, {"t": {"0": 10}})]  # 1: idle
    assert [b["batch_id"] for b in batches.add(first)] == [0]
    later = [*first, progress(1, 5, {"t": {"0": 15, "1": 3}})]
    (batch,) = batches.add(later)
    assert (batch["batch_id"], batch["input_rows"], batch["offsets"]) == (1, 5, {"0": 15, "1": 3})
    assert batches.add(later) == []
    batches.add([progress(2, 7, {"t": {"0": 22, "1": 3}})])
    assert (batches.messages, batches.batches) == (22, 3)
    assert [b["batch_id"] for b in batches.latest] == [1, 2]  # only the latest `keep`


class SessionConf:
    """A Spark session's settings as `spark.conf` offers them."""

    def __init__(self, settings: dict):
        self.settings = settings

    def get(self, key, default=None):
        return self.settings.get(key, default)


class Session:
    def __init__(self, settings: dict):
        self.conf = SessionConf(settings)


def test_the_connect_batch_function_is_plain_data_and_reads_the_sessions_storage(tmp_path):
    """What a Spark Connect client pickles to the server for the ingest query (`RemoteBatches`)
    holds no writer (made in the server's worker), keeps the fence of the run's lock, and the
    worker's S3 settings are the session's own (`s3_env_of_session`) as `connect_settings`
    gave them; the worker's recorded report goes back into the client's, its run's figures
    only."""
    import pickle

    from deltaferry.config import Settings, TopicConfig
    from deltaferry.context import TopicContext
    from deltaferry.lock import Fence
    from deltaferry.paths import TopicPaths
    from deltaferry.reports import IngestReport
    from deltaferry.schema.store import SchemaStore
    from deltaferry.spark.ingest.remote import (
        RemoteBatches,
        merge_results,
        read_results,
        results_uri,
    )
    from deltaferry.spark.session import (
        connect_settings,
        registry_env_of_session,
        s3_env_of_session,
    )
    from deltaferry.storage import LocalStorage

    paths = TopicPaths.for_topic(str(tmp_path), "orders")
    ctx = TopicContext(TopicConfig("orders"), Settings(str(tmp_path), "127.0.0.1:1"), paths,
                       SchemaStore(paths.schema))
    fence = Fence(paths.lock, "orders", 7)
    batches = RemoteBatches(ctx, "run1", fence, IngestReport)  # a class, pickled by name
    batches._writer = object()  # as in a worker after its first batch
    copy = pickle.loads(pickle.dumps(batches))
    assert copy._writer is None and copy.fence == fence and copy.paths == paths
    assert copy.make is IngestReport

    env = {"DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "key",
           "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "eu-west-3",
           "DELTAFERRY_S3_RETRIES": "4"}
    assert s3_env_of_session(Session(connect_settings(env=env))) == env
    # the registry too, its CA bundle's text written to a file of the worker's own
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    registry = {"DELTAFERRY_SCHEMA_REGISTRY_URL": "https://registry:8081",
                "DELTAFERRY_SCHEMA_REGISTRY_USER": "u",
                "DELTAFERRY_SCHEMA_REGISTRY_PASSWORD": "p",
                "DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE": str(ca)}
    given = registry_env_of_session(Session(connect_settings(env={**env, **registry})))
    worker_ca = given.pop("DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE")
    assert worker_ca != str(ca) and open(worker_ca).read() == ca.read_text()
    assert os.stat(worker_ca).st_mode & 0o077 == 0
    os.unlink(worker_ca)
    assert given == {k: v for k, v in registry.items() if not k.endswith("CA_BUNDLE")}
    assert registry_env_of_session(Session(connect_settings(env=env))) == {}

    storage = LocalStorage()
    worker = IngestReport("orders", inserted=3, quarantined=2, messages_read=999,
                          phases={"merge": 1.5})
    storage.write(results_uri(paths, "run1"), json.dumps(
        {"report": worker.as_dict(), "batches": [0, 1], "failure": None}).encode())
    data = read_results(storage, paths, "run1")
    assert read_results(storage, paths, "run1") is None  # read once: the file is gone
    mine = IngestReport("orders", messages_read=40)
    merge_results(mine, data)
    assert (mine.inserted, mine.quarantined, mine.phases) == (3, 2, {"merge": 1.5})
    assert mine.messages_read == 40  # the client's own, from the query's progress


def test_a_connect_runs_progress_lines_are_said_once_and_killed_runs_files_removed(
        tmp_path, caplog):
    """The client logs the batches' progress lines its worker recorded as they come (each
    once, whether seen while the query runs or at its end), and once its query ended removes
    the results files other runs left, never its own."""
    import logging

    from deltaferry.paths import TopicPaths
    from deltaferry.spark.ingest.remote import (
        peek_results,
        remove_left_behind,
        results_uri,
        say_lines,
    )
    from deltaferry.storage import LocalStorage

    paths = TopicPaths.for_topic(str(tmp_path), "orders")
    storage = LocalStorage()
    assert peek_results(storage, paths, "run2") is None and say_lines(None, 0) == 0
    storage.write(results_uri(paths, "run2"), json.dumps({"lines": ["batch 0"]}).encode())
    with caplog.at_level(logging.INFO, logger="deltaferry.spark.ingest.remote"):
        said = say_lines(peek_results(storage, paths, "run2"), 0)
        storage.write(results_uri(paths, "run2"),
                      json.dumps({"lines": ["batch 0", "batch 1", "batch 2"]}).encode())
        said = say_lines(peek_results(storage, paths, "run2"), said)
        said = say_lines(peek_results(storage, paths, "run2"), said)
    assert said == 3
    assert [r.getMessage() for r in caplog.records] == ["batch 0", "batch 1", "batch 2"]

    storage.write(results_uri(paths, "killed"), b"{}")
    assert remove_left_behind(storage, paths, "run2") == ["killed.json"]
    assert peek_results(storage, paths, "killed") is None
    assert peek_results(storage, paths, "run2") is not None  # its own: read_results' to delete


def test_progress_lines_of_a_long_stream_are_said_once_from_the_newest_kept(caplog):
    """The worker keeps only the newest lines of a stream (`KEPT_LINES`) with the count said in
    all: the client logs each line it has not logged yet once, those no longer kept skipped."""
    import logging

    from deltaferry.spark.ingest.remote import say_lines

    with caplog.at_level(logging.INFO, logger="deltaferry.spark.ingest.remote"):
        assert say_lines({"lines": ["b1", "b2"], "said": 2}, 0) == 2
        assert say_lines({"lines": ["b2", "b3", "b4"], "said": 4}, 2) == 4
        assert say_lines({"lines": ["b7", "b8"], "said": 8}, 4) == 8  # b5, b6 gone: skipped
        assert say_lines({"lines": ["b7", "b8"], "said": 8}, 8) == 8
        assert say_lines(None, 8) == 8
    assert [r.getMessage() for r in caplog.records] == ["b1", "b2", "b3", "b4", "b7", "b8"]


def test_a_connect_query_whose_results_cannot_be_read_fails_naming_the_warehouse(tmp_path):
    """A query over Spark Connect that failed while the storage is down (its worker's recorded
    results cannot be read: here a folder where the file should be) fails the run in one line
    naming the warehouse and the results file, not with the storage client's traceback."""
    import pytest

    from deltaferry.config import Settings, TopicConfig
    from deltaferry.errors import WarehouseError
    from deltaferry.paths import TopicPaths
    from deltaferry.reports import IngestReport
    from deltaferry.spark.ingest.remote import results_uri
    from deltaferry.spark.ingest.stream import IngestStream

    class Failed:
        def awaitTermination(self, timeout):
            raise RuntimeError("StreamingQueryException: the foreachBatch worker went away")

    ingest = IngestStream.__new__(IngestStream)  # its query and worker stood in for
    ingest.topic, ingest.settings = TopicConfig("orders"), Settings(str(tmp_path), "k:9092")
    ingest.paths = TopicPaths.for_topic(str(tmp_path), "orders")
    ingest.report, ingest.writer = IngestReport("orders"), None
    ingest.remote = type("Remote", (), {"run_id": "run1"})()
    os.makedirs(results_uri(ingest.paths, "run1"))  # unreadable, and not missing
    with pytest.raises(WarehouseError) as failed:
        ingest.await_end(Failed())
    line = str(failed.value)
    assert line.startswith(f"warehouse {tmp_path}: topic 'orders': its ingest query on the "
                           "Spark Connect server failed"), line
    assert results_uri(ingest.paths, "run1") in line, line
    assert "(the storage: IsADirectoryError" in line, line
