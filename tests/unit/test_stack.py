"""The local stack without a JVM: broker config rendering, the state file, stale-state detection,
and the up/down/status orchestration and process helpers driven with tiny Python processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

import deltaferry_dev.stack as stack
from deltaferry.errors import StackError
from deltaferry_dev.stack import kafka, process
from deltaferry_dev.stack.process import ManagedProcess, Service


def parse_properties(text: str) -> dict[str, str]:
    pairs = [ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert all(len(p) == 2 for p in pairs)
    return {k: v for k, v in pairs}


def test_broker_properties_single_kraft_node(tmp_path):
    props = parse_properties(kafka.broker_properties(19092, 19093, tmp_path / "data"))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert "controller.quorum.voters" not in props  # --standalone forbids it
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["auto.create.topics.enable"] == "false"
    # ACLs enforced; the PLAINTEXT listener's ANONYMOUS principal is a super user
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert (props["super.users"], props["allow.everyone.if.no.acl.found"]) == (
        "User:ANONYMOUS", "true")
    for key in ("num.partitions", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor", "transaction.state.log.min.isr"):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_broker_properties_with_a_scram_listener_hold_no_credential(tmp_path):
    props = parse_properties(kafka.broker_properties(19092, 19093, tmp_path / "data",
                                                     sasl_port=19094))
    client = "PLAINTEXT://127.0.0.1:19092,SASL://127.0.0.1:19094"
    assert props["listeners"] == client + ",CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == client
    assert props["listener.security.protocol.map"] == (
        "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.name.sasl.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    jaas = props["listener.name.sasl.scram-sha-512.sasl.jaas.config"]
    assert jaas == "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def test_sasl_password_is_fresh_and_the_client_config_uses_it():
    assert len({kafka.new_password() for _ in range(20)}) == 20
    assert len(kafka.new_password()) >= 32
    assert kafka.sasl_client_config("u", "p") == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "u", "sasl.password": "p"}


def test_cluster_id_is_a_base64url_uuid():
    ids = {kafka.random_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cid in ids:
        assert len(cid) == 22 and not cid.startswith("-")
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_commands(tmp_path):
    p, log4j = tmp_path / "server.properties", tmp_path / "log4j2.properties"
    fmt = kafka.format_command("java", "/jars/*", p, log4j, "CID")
    assert fmt[fmt.index("kafka.tools.StorageTool"):] == [
        "kafka.tools.StorageTool", "format", "--config", str(p), "--cluster-id", "CID", "--standalone"]
    run = kafka.broker_command("java", "/jars/*", p, log4j, tmp_path / "logs")
    assert run[:2] == ["java", "-Xmx1g"] and run[-2:] == ["kafka.Kafka", str(p)]
    assert f"-Dlog4j2.configurationFile={log4j}" in run
    assert f"-Dkafka.logs.dir={tmp_path / 'logs'}" in run
    assert run[run.index("-cp") + 1] == "/jars/*"


def test_java_missing_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="JAVA_HOME .* no `java` is on PATH"):
        kafka.java_executable()


def test_stack_dir_from_argument_env_or_repo(monkeypatch, tmp_path):
    monkeypatch.delenv("DELTAFERRY_STACK_DIR", raising=False)
    assert stack.resolve_stack_dir() == stack.REPO_ROOT.resolve() / ".stack"
    monkeypatch.setenv("DELTAFERRY_STACK_DIR", str(tmp_path / "env"))
    assert stack.resolve_stack_dir() == tmp_path / "env"
    assert stack.resolve_stack_dir(tmp_path / "arg") == tmp_path / "arg"


# --- state file and stale detection -------------------------------------------------------------

def this_process(tmp_path) -> ManagedProcess:
    return ManagedProcess(os.getpid(), psutil.Process().create_time(), tmp_path / "x.log")


def a_dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def service(proc: ManagedProcess, port: int, tmp_path: Path, name="kafka") -> Service:
    return Service(
        name=name, title=f"{name} thing", process=proc, host="127.0.0.1",
        ports={"main": port}, assignments={f"VAR_{name.upper()}": f"127.0.0.1:{port}"},
        paths=[str(tmp_path / name / "data")], extra={"cluster_id": "abc"},
    )


@pytest.fixture
def listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_state_file_round_trip(tmp_path):
    services = [service(this_process(tmp_path), 1234, tmp_path, "zeta"),
                service(this_process(tmp_path), 5678, tmp_path, "alpha")]
    stack.write_state(tmp_path, stack.make_state(services, ready=True))
    state = stack.read_state(tmp_path)
    assert stack.services_of(state) == services
    assert list(state["assignments"].items()) == [  # order kept: as services were started
        ("VAR_ZETA", "127.0.0.1:1234"), ("VAR_ALPHA", "127.0.0.1:5678")]
    assert not list(tmp_path.glob("*.tmp"))


def test_unreadable_or_missing_state_is_none(tmp_path):
    assert stack.read_state(tmp_path) is None
    (tmp_path / "state.json").write_text("{not json")
    assert stack.read_state(tmp_path) is None
    (tmp_path / "state.json").write_text('{"version": 999}')
    assert stack.read_state(tmp_path) is None


def test_live_only_if_pid_alive_and_ports_accept(tmp_path, listening):
    me = this_process(tmp_path)
    assert stack.is_live(stack.make_state([service(me, listening, tmp_path)], ready=True))
    # not yet ready (an `up` still waiting, or interrupted)
    assert not stack.is_live(stack.make_state([service(me, listening, tmp_path)], ready=False))
    # the pid is not running
    dead = ManagedProcess(a_dead_pid(), me.started, me.log)
    assert not stack.is_live(stack.make_state([service(dead, listening, tmp_path)], ready=True))
    # the pid runs but is another program (a reused pid): its start time differs
    reused = ManagedProcess(me.pid, me.started - 3600, me.log)
    assert not stack.is_live(stack.make_state([service(reused, listening, tmp_path)], ready=True))
    # alive, but the port is closed
    closed = process.free_ports(1)[0]
    assert not stack.is_live(stack.make_state([service(me, closed, tmp_path)], ready=True))
    assert not stack.is_live(None)


def test_status_and_down_with_stale_state(tmp_path, listening):
    dead = ManagedProcess(a_dead_pid(), time.time(), tmp_path / "x.log")
    svc = service(dead, listening, tmp_path)
    Path(svc.paths[0]).mkdir(parents=True)
    stack.write_state(tmp_path, stack.make_state([svc], ready=True))
    assert stack.status(tmp_path) == {}
    lines = stack.down(tmp_path)
    assert lines == [f"kafka thing (pid {dead.pid}) was not running"]
    assert not (tmp_path / "state.json").exists() and not Path(svc.paths[0]).exists()
    assert stack.down(tmp_path)[0].startswith("stack: not running")
    assert stack.down(tmp_path / "never")[0].startswith("stack: not running")


# --- orchestration with a stand-in service (a Python process listening on a port) --------------

LISTENER = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
while True:
    time.sleep(1)
"""


def fake_service(name: str, delay: float = 0.0, fails: bool = False, seen_env=None):
    """A module-like service for stack.SERVICES that starts a small listener process."""

    def launch(stack_dir: Path, env: dict) -> Service:
        if seen_env is not None:
            seen_env.append(dict(env))
        (port,) = process.free_ports(1)
        argv = [sys.executable, "-c", "import sys; sys.exit(3)"] if fails else \
            [sys.executable, "-c", LISTENER, str(port), str(delay)]
        (stack_dir / name / "data").mkdir(parents=True, exist_ok=True)
        proc = process.start_detached(argv, stack_dir / name / "out.log")
        return Service(name=name, title=f"fake {name}", process=proc, host="127.0.0.1",
                       ports={"main": port}, assignments={f"FAKE_{name.upper()}": str(port)},
                       paths=[str(stack_dir / name / "data")])

    def await_ready(svc: Service) -> float:
        return process.wait_ready(svc.process, lambda: process.port_accepts("127.0.0.1", svc.ports["main"]),
                                  what=svc.title, deadline_s=10, interval=0.05)

    def relaunch(stack_dir: Path, svc: Service) -> Service:
        argv = [sys.executable, "-c", LISTENER, str(svc.ports["main"]), "0"]
        proc = process.start_detached(argv, stack_dir / name / "out.log", append=True)
        return Service(**{**svc.__dict__, "process": proc})

    return SimpleNamespace(NAME=name, launch=launch, await_ready=await_ready, relaunch=relaunch,
                           data_dir=lambda d: d / name / "data")


def test_up_up_status_down(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(stack, "SERVICES", (fake_service("one", 0.3),
                                            fake_service("two", seen_env=seen)))
    env = stack.up(tmp_path)
    assert list(env) == ["FAKE_ONE", "FAKE_TWO"]
    assert seen == [{"FAKE_ONE": env["FAKE_ONE"]}]  # later services see earlier assignments
    pids = [s.process.pid for s in stack.services_of(stack.read_state(tmp_path))]
    assert stack.up(tmp_path) == env and len(seen) == 1  # nothing started the second time
    assert stack.status(tmp_path) == env
    lines = stack.down(tmp_path)
    assert [ln.split(" (")[0] for ln in lines] == ["stopped fake two", "stopped fake one"]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)
    assert stack.status(tmp_path) == {}
    assert not (tmp_path / "one" / "data").exists()


def test_up_with_more_services_adds_them_to_the_running_stack(monkeypatch, tmp_path):
    """`stack up --cluster` on a running stack starts only the cluster's services."""
    seen = []
    monkeypatch.setattr(stack, "SERVICES", (fake_service("one"),))
    monkeypatch.setattr(stack, "CLUSTER", (fake_service("extra", seen_env=seen),))
    first = stack.up(tmp_path)
    (one,) = stack.services_of(stack.read_state(tmp_path))
    both = stack.up(tmp_path, cluster=True)
    assert list(both) == ["FAKE_ONE", "FAKE_EXTRA"] and both["FAKE_ONE"] == first["FAKE_ONE"]
    assert seen == [first]  # the added service sees the running stack's assignments
    running = stack.services_of(stack.read_state(tmp_path))
    assert [s.name for s in running] == ["one", "extra"]
    assert running[0].process.pid == one.process.pid  # the broker etc. kept running
    assert stack.up(tmp_path, cluster=True) == both and len(seen) == 1
    assert [ln.split(" (")[0] for ln in stack.down(tmp_path)] == ["stopped fake extra",
                                                                   "stopped fake one"]


def test_up_replaces_a_stack_whose_process_died(monkeypatch, tmp_path):
    monkeypatch.setattr(stack, "SERVICES", (fake_service("one"),))
    first = stack.up(tmp_path)
    (old,) = stack.services_of(stack.read_state(tmp_path))
    os.kill(old.process.pid, signal.SIGKILL)
    while process.is_alive(old.process):
        time.sleep(0.05)
    assert stack.status(tmp_path) == {}
    second = stack.up(tmp_path)
    (new,) = stack.services_of(stack.read_state(tmp_path))
    assert new.process.pid != old.process.pid and stack.status(tmp_path) == second
    assert list(second) == list(first)
    stack.down(tmp_path)


def test_a_failing_service_stops_those_started_before_it(monkeypatch, tmp_path):
    monkeypatch.setattr(stack, "SERVICES", (fake_service("one"), fake_service("bad", fails=True)))
    with pytest.raises(StackError, match="fake bad exited with code 3 before it was ready"):
        stack.up(tmp_path)
    assert stack.read_state(tmp_path) is None
    assert not (tmp_path / "one" / "data").exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if LISTENER in (p.info["cmdline"] or [])]


# --- process helpers ------------------------------------------------------------------------------

def test_wait_ready_deadline_stops_the_process_and_shows_the_log(tmp_path):
    proc = process.start_detached(
        [sys.executable, "-c", "import time; print('booting', flush=True); time.sleep(60)"],
        tmp_path / "p.log")
    with pytest.raises(StackError) as err:
        process.wait_ready(proc, lambda: False, what="the thing", deadline_s=0.5, interval=0.1)
    assert "the thing not ready after 0.5 s" in str(err.value) and "booting" in str(err.value)
    assert not process.is_alive(proc)


def test_stop_kills_what_ignores_sigterm(tmp_path):
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)")
    proc = process.start_detached([sys.executable, "-c", code], tmp_path / "p.log")
    process.wait_ready(proc, lambda: "up" in proc.log.read_text(), what="p", deadline_s=10,
                       interval=0.05)
    assert process.stop(proc, grace=0.5) == "SIGKILL after 0.5 s"
    assert not process.is_alive(proc)
    assert process.stop(proc) == "not running"


def test_detached_process_has_its_own_session(tmp_path):
    proc = process.start_detached([sys.executable, "-c", "import time; time.sleep(30)"],
                                  tmp_path / "p.log")
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        assert process.is_alive(proc)
    finally:
        process.stop(proc)


def test_a_service_stopped_and_started_in_place_keeps_its_data_port_and_assignments(
        monkeypatch, tmp_path):
    monkeypatch.setattr(stack, "SERVICES", (fake_service("one"), fake_service("two")))
    env = stack.up(tmp_path)
    (tmp_path / "two" / "data" / "kept").write_text("still here")
    _, old = stack.services_of(stack.read_state(tmp_path))
    assert stack.stop_service("two", tmp_path).startswith("stopped fake two")
    assert not process.is_alive(old.process) and stack.status(tmp_path) == {}
    assert "starts it again" not in stack.stop_service("two", tmp_path)  # was not running
    assert stack.start_service("two", tmp_path).startswith("started fake two again")
    _, new = stack.services_of(stack.read_state(tmp_path))
    assert new.process.pid != old.process.pid and new.ports == old.ports
    assert stack.status(tmp_path) == env  # the same assignments: clients still work
    assert (tmp_path / "two" / "data" / "kept").read_text() == "still here"
    assert "already runs" in stack.start_service("two", tmp_path)
    with pytest.raises(StackError, match="no service 'three'.*one, two"):
        stack.stop_service("three", tmp_path)
    stack.down(tmp_path)
    with pytest.raises(StackError, match="no stack started"):
        stack.start_service("two", tmp_path)


def test_the_cli_names_the_stacks_services():
    from deltaferry_dev.cli import SERVICE_NAMES
    from deltaferry_dev.stack import CATALOG, CONNECT, SERVICES

    assert SERVICE_NAMES == tuple(m.NAME for m in SERVICES + CATALOG + CONNECT)
