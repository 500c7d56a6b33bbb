"""One run per topic at a time, on the real services: `deltaferry run` and the spark job refuse
while another process holds the topic, naming it, before any JVM; once that holder is killed its
lock is taken over; on S3 (the stack's SeaweedFS, conditional PUT) racing takers get one winner
and a holder whose heartbeat stopped is taken over."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from deltaferry import steps
from deltaferry.kafka import produce
from deltaferry.lock import Holder, TopicLock
from deltaferry.paths import TopicPaths
from deltaferry.storage import storage_for

from .test_cli import CLI

pytestmark = pytest.mark.integration

HOLD = """
import sys, time
from deltaferry.lock import TopicLock
from deltaferry.storage import storage_for
lock = TopicLock(storage_for(sys.argv[1]), sys.argv[1], sys.argv[2], "a manual run")
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_naming_the_holder_until_it_dies(
        kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("locked", partitions=1)
    produce(kafka_bootstrap, topic, [("a", {"n": 1})])
    warehouse = tmp_path / "wh"
    paths = TopicPaths.for_topic(str(warehouse), topic)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n")
    env = {**os.environ, "DELTAFERRY_TOPICS": str(topics), "DELTAFERRY_KAFKA_BOOTSTRAP":
           kafka_bootstrap, "DELTAFERRY_WAREHOUSE": str(warehouse)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, paths.lock, topic],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        job = str(steps.get("ingest").script)
        for command in ([CLI, "run", topic], [sys.executable, job, topic]):
            started = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
            assert done.returncode == 2, done.stderr
            assert (f"deltaferry: error: topic '{topic}' is already being run by pid "
                    f"{holder.pid} on {socket.gethostname()} (a manual run, since ") in done.stderr
            assert time.monotonic() - started < 30  # refused before any JVM started
        waited = subprocess.run([CLI, "run", topic, "--wait", "3"], capture_output=True,
                                text=True, env=env, timeout=120)
        assert waited.returncode == 2 and "after waiting 3 s" in waited.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the holder dies without releasing
        holder.wait()
    taker = TopicLock(storage_for(paths.lock), paths.lock, topic, "the next run")
    with taker.hold():  # at once: the holder's process is gone
        assert taker.holder is not None


def test_on_s3_racing_takers_get_one_winner_and_a_silent_holder_is_taken_over(s3_warehouse):
    folder = f"{s3_warehouse}/orders/_lock"
    storage = storage_for(folder)
    winners: list[TopicLock] = []
    barrier = threading.Barrier(6)

    def take() -> None:
        candidate = TopicLock(storage_for(folder), folder, "orders", "racer")
        barrier.wait()
        if candidate.try_acquire() is None:
            winners.append(candidate)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    winners[0].release()

    # a holder on another host whose heartbeat stopped: refused while fresh, then taken over
    generation, _ = TopicLock(storage, folder, "orders", "x").newest()
    now = time.time()
    assert storage.put_if_absent(f"{folder}/{generation + 1:012d}.json", Holder(
        "t", "airflow-worker-7", 4242, None, "ingest job", now - 5, now - 5).to_bytes())
    fresh = TopicLock(storage, folder, "orders", "cli", lease=60)
    assert fresh.try_acquire().host == "airflow-worker-7"
    later = TopicLock(storage, folder, "orders", "cli", lease=60, clock=lambda: now + 120)
    assert later.try_acquire() is None and later.generation == generation + 2
    later.release()
