"""`deltaferry stack up/down` against the real broker: start, reuse, use, stop, nothing left."""

from __future__ import annotations

import uuid

import psutil
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from deltaferry import stack

pytestmark = pytest.mark.integration


def java_processes_mentioning(text: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if text in cmdline and "java" in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p.info["pid"])
    return found


def round_trip(bootstrap: str) -> None:
    """Create a topic, produce one message, consume it back."""
    topic = f"stack-test-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        msg = None
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None, msg and msg.error()
        assert (msg.key(), msg.value()) == (b"k", b"hello")
    finally:
        consumer.close()


def test_up_reuse_use_down(tmp_path):
    stack_dir = tmp_path / "stack"
    try:
        env = stack.up(stack_dir)
        bootstrap = env["DELTAFERRY_KAFKA_BOOTSTRAP"]
        host, port = bootstrap.rsplit(":", 1)
        assert host == "127.0.0.1" and port.isdigit()
        (broker,) = stack.services_of(stack.read_state(stack_dir))
        pid = broker.process.pid

        again = stack.up(stack_dir)
        assert again == env and list(again) == list(env)
        (same,) = stack.services_of(stack.read_state(stack_dir))
        assert same.process.pid == pid
        assert stack.status(stack_dir) == env

        round_trip(bootstrap)
    finally:
        lines = stack.down(stack_dir)

    assert any(f"pid {pid}" in line for line in lines)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert java_processes_mentioning(str(stack_dir)) == []
    assert stack.status(stack_dir) == {}
    assert not (stack_dir / "state.json").exists()
    assert not (stack_dir / "kafka" / "data").exists()
