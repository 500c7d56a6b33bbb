"""The local stack's catalog: a Hive Metastore (the standalone metastore service 3.1.3 from Maven
Central) on a PostgreSQL database (Debian's PostgreSQL), both on 127.0.0.1, free ports. Two
services, started in this order by `stack up --catalog` (added to a running stack if need be;
a plain `stack up` starts neither, so that what does not register tables does not wait for
them):

- ``postgres``: ``initdb`` into ``<stack dir>/postgres/data`` (user ``deltaferry``, a random
  password, scram-sha-256 on TCP, no Unix socket), the database ``metastore`` created in
  single-user mode, then the server on a free port of 127.0.0.1. PostgreSQL refuses to run as
  root: when the stack is started as root it runs as the ``postgres`` system user (Debian's
  package makes it), with its data in a folder of that user's in the temporary folder
  (``data`` is a link to it: the stack folder's parents need not be open to that user).
- ``metastore``: ``<stack dir>/metastore/conf/metastore-site.xml`` (the database's URL, user
  and password: the file is its owner's only, the password is on no command line) read by
  schematool (``-initSchema -dbType postgres``, the first start only) and then by the
  metastore service on a free port; its Thrift URI is printed as
  ``DELTAFERRY_HIVE_METASTORE_URI=thrift://127.0.0.1:PORT``. Its own warehouse folder (the
  default location Hive gives a table registered without one) is
  ``<stack dir>/metastore/warehouse``.

Both stop and start in place (``deltaferry stack stop|start metastore``): same ports, same
database. `stack down` deletes their data.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from xml.sax.saxutils import escape

from deltaferry import env as envvars
from deltaferry.errors import SetupError, StackError
from deltaferry.jvm import deps_dir
from deltaferry_dev.stack.kafka import java_executable
from deltaferry_dev.stack.process import (
    ManagedProcess,
    Service,
    free_ports,
    port_accepts,
    start_detached,
    wait_ready,
)

HOST = "127.0.0.1"
URI_VAR = envvars.HIVE_METASTORE_URI.name
HIVE_VERSION = "3.1.3"
DATABASE = "metastore"
DB_USER = "deltaferry"
#: The system user PostgreSQL runs as when the stack is started as root (Debian's package's).
SYSTEM_USER = "postgres"
READY_DEADLINE_S = 180.0
STOP_GRACE_S = 10.0
#: A small heap (a few tables), the serial collector, C1 only: start-up over peak speed.
JVM_OPTIONS = ("-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Djava.awt.headless=true")
#: What PostgreSQL needs for a metastore of a few tables: little memory, no fsync (the stack's
#: data is thrown away by `stack down`), room for the metastore's connection pools.
PG_SETTINGS = ("listen_addresses=127.0.0.1", "unix_socket_directories=", "fsync=off",
               "synchronous_commit=off", "full_page_writes=off", "shared_buffers=16MB",
               "max_connections=40")


def pg_bin(program: str) -> Path:
    """A program of the newest PostgreSQL server installed from Debian's packages."""
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                      else 0)
    if not versions:
        raise SetupError("no PostgreSQL server (/usr/lib/postgresql/*/bin/postgres): run "
                         "`make setup` (it installs Debian's postgresql)")
    return versions[-1]


def metastore_home() -> Path:
    """The metastore's jars (lib/) and schema scripts (scripts/) that `make setup` resolves."""
    return deps_dir() / "metastore"


def _run_as() -> pwd.struct_passwd | None:
    """The user PostgreSQL runs as: None (this user) unless this is root, then SYSTEM_USER."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise SetupError(f"PostgreSQL refuses to run as root and there is no {SYSTEM_USER!r} "
                         "user: run `make setup` (Debian's postgresql makes it)") from None


def _as_user(user: pwd.struct_passwd | None) -> dict:
    """Popen's arguments that run a child as `user` (none for this user)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


# --- postgres ---------------------------------------------------------------------------------

class Postgres:
    """The ``postgres`` service (see the module's doc)."""

    NAME = "postgres"
    TITLE = "PostgreSQL (the metastore's database)"

    @staticmethod
    def home(stack_dir: Path) -> Path:
        return stack_dir / "postgres"

    @classmethod
    def data_dir(cls, stack_dir: Path) -> Path:
        """What `stack down` deletes (the data folder itself, when elsewhere, is in the
        service's paths)."""
        return cls.home(stack_dir)

    @classmethod
    def launch(cls, stack_dir: Path, env: dict[str, str]) -> Service:
        """initdb, the metastore's database, then the server; returns once it is started."""
        server = pg_bin("postgres")
        user = _run_as()
        folder = cls.home(stack_dir)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if user is None:
            private = folder / "cluster"
            private.mkdir(mode=0o700)
        else:  # root: a folder of SYSTEM_USER's, reached through a link in the stack folder
            private = Path(tempfile.mkdtemp(prefix="deltaferry-postgres-"))
            os.chown(private, user.pw_uid, user.pw_gid)
            (folder / "cluster").symlink_to(private)
        data = private / "data"
        password = secrets.token_urlsafe(24)
        pwfile = private / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
        if user is not None:
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        log = folder / "postgres.log"
        print(f"initialising {cls.TITLE} in {data} ...", file=sys.stderr)
        try:
            _checked([str(pg_bin("initdb")), "-D", str(data), "-U", DB_USER,
                      f"--pwfile={pwfile}", "--auth=scram-sha-256", "--no-sync",
                      "--encoding=UTF8", "--locale=C"], log, user, "initdb")
        finally:
            pwfile.unlink(missing_ok=True)
        _checked([str(server), "--single", "-D", str(data), "postgres"], log, user,
                 "creating the metastore's database", stdin=f"CREATE DATABASE {DATABASE};\n")
        port = free_ports(1, HOST)[0]
        print(f"starting {cls.TITLE} on {HOST}:{port} ...", file=sys.stderr)
        proc = cls._start(data, port, log, user)
        return Service(
            name=cls.NAME, title=cls.TITLE, process=proc, host=HOST, ports={"sql": port},
            assignments={}, paths=[str(folder), str(private)],
            extra={"stop_grace_s": str(STOP_GRACE_S), "stop_signal": "SIGINT",
                   "password": password, "data": str(data),
                   "jdbc_url": f"jdbc:postgresql://{HOST}:{port}/{DATABASE}"},
        )

    @staticmethod
    def _start(data: Path, port: int, log: Path, user: pwd.struct_passwd | None,
               append: bool = True) -> ManagedProcess:
        command = [str(pg_bin("postgres")), "-D", str(data), "-p", str(port)]
        for setting in PG_SETTINGS:
            command += ["-c", setting]
        return start_detached(command, log, cwd=data.parent, append=append, **_as_user(user))

    @classmethod
    def relaunch(cls, stack_dir: Path, service: Service) -> Service:
        """Start a stopped server again on its data and port; returns at once."""
        data = Path(service.extra["data"])
        print(f"starting {cls.TITLE} again on {HOST}:{service.ports['sql']} ...",
              file=sys.stderr)
        return replace(service, process=cls._start(data, service.ports["sql"],
                                                   cls.home(stack_dir) / "postgres.log",
                                                   _run_as()))

    @classmethod
    def await_ready(cls, service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
        """Wait until the server accepts connections; seconds taken."""
        seconds = wait_ready(service.process, lambda: port_accepts(HOST, service.ports["sql"]),
                             what=f"{cls.TITLE} (pid {service.process.pid})",
                             deadline_s=deadline_s)
        print(f"{cls.TITLE} ready in {seconds:.1f} s", file=sys.stderr)
        return seconds


def _checked(command: list[str], log: Path, user: pwd.struct_passwd | None, what: str,
             stdin: str | None = None) -> None:
    """Run `command` (as `user`) to its end, its output into `log`; StackError naming `what`
    with the log's tail if it fails."""
    with open(log, "ab") as out:
        done = subprocess.run(command, input=stdin.encode() if stdin else None,
                              stdout=out, stderr=subprocess.STDOUT, check=False,
                              cwd="/", **_as_user(user))
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise StackError(f"{what} failed (exit {done.returncode}); last lines of {log}:\n{tail}")


# --- metastore --------------------------------------------------------------------------------

class Metastore:
    """The ``metastore`` service (see the module's doc)."""

    NAME = "metastore"
    TITLE = f"Hive Metastore {HIVE_VERSION}"

    @staticmethod
    def home(stack_dir: Path) -> Path:
        return stack_dir / "metastore"

    @classmethod
    def data_dir(cls, stack_dir: Path) -> Path:
        return cls.home(stack_dir)

    @classmethod
    def launch(cls, stack_dir: Path, env: dict[str, str]) -> Service:
        """Write the configuration, then run schematool and the service (one process: the
        schema's creation is part of the first start); returns at once. The database is the
        stack's ``postgres`` service (its state: the password is in no assignment)."""
        from deltaferry_dev.stack import read_state, services_of

        lib = metastore_home() / "lib"
        if not lib.is_dir():
            raise SetupError(f"no Hive Metastore in {metastore_home()}: run `make setup`")
        pg = {s.name: s for s in services_of(read_state(stack_dir))}.get(Postgres.NAME)
        if pg is None:
            raise StackError("the metastore needs the stack's PostgreSQL: `deltaferry stack up "
                             "--catalog` starts both")
        java = java_executable()
        folder = cls.home(stack_dir)
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "conf").mkdir(parents=True)
        (folder / "warehouse").mkdir()
        port = free_ports(1, HOST)[0]
        write_site(folder / "conf" / "metastore-site.xml", pg.extra["jdbc_url"],
                   pg.extra["password"], port, folder / "warehouse")
        classpath = f"{folder / 'conf'}:{lib}/*"
        schematool = [java, *JVM_OPTIONS, "-cp", classpath,
                      "org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool",
                      "-initSchema", "-dbType", "postgres"]
        print(f"starting {cls.TITLE} on {HOST}:{port} (its schema first) ...", file=sys.stderr)
        # schematool, then `exec` the service: the recorded pid is the service's
        script = (f"{_quote(schematool)} || exit 1\n"
                  f"exec {_quote(cls.command(java, classpath))}\n")
        proc = start_detached(["/bin/sh", "-c", script], folder / "metastore.log", cwd=folder,
                              env=cls.environment())
        return Service(
            name=cls.NAME, title=cls.TITLE, process=proc, host=HOST, ports={"thrift": port},
            assignments={URI_VAR: f"thrift://{HOST}:{port}"}, paths=[str(folder)],
            extra={"stop_grace_s": str(STOP_GRACE_S), "classpath": classpath},
        )

    @staticmethod
    def command(java: str, classpath: str) -> list[str]:
        return [java, *JVM_OPTIONS, "-cp", classpath,
                "org.apache.hadoop.hive.metastore.HiveMetaStore"]

    @staticmethod
    def environment() -> dict[str, str]:
        """The service's environment: schematool finds the schema scripts through
        METASTORE_HOME."""
        return {**os.environ, "METASTORE_HOME": str(metastore_home())}

    @classmethod
    def relaunch(cls, stack_dir: Path, service: Service) -> Service:
        """Start a stopped metastore again on its database (its schema is there) and port."""
        print(f"starting {cls.TITLE} again on {service.assignments[URI_VAR]} ...",
              file=sys.stderr)
        proc = start_detached(cls.command(java_executable(), service.extra["classpath"]),
                              cls.home(stack_dir) / "metastore.log", cwd=cls.home(stack_dir),
                              env=cls.environment(), append=True)
        return replace(service, process=proc)

    @classmethod
    def await_ready(cls, service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
        """Wait until the Thrift port accepts connections (the service opens it once its
        database is read); seconds taken."""
        seconds = wait_ready(service.process,
                             lambda: port_accepts(HOST, service.ports["thrift"]),
                             what=f"the {cls.TITLE} (pid {service.process.pid})",
                             deadline_s=deadline_s)
        print(f"{cls.TITLE} ready in {seconds:.1f} s", file=sys.stderr)
        return seconds


def _quote(command: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(part) for part in command)


def write_site(path: Path, jdbc_url: str, password: str, port: int, warehouse: Path) -> None:
    """The metastore's configuration (``metastore-site.xml``), its owner's only: it holds the
    database's password."""
    settings = {
        "javax.jdo.option.ConnectionURL": jdbc_url,
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": DB_USER,
        "javax.jdo.option.ConnectionPassword": password,
        "metastore.thrift.port": str(port),
        "metastore.warehouse.dir": warehouse.as_uri(),
        "metastore.schema.verification": "true",
        # the standalone service's own (the defaults name Hive's query engine's classes)
        "metastore.expression.proxy":
            "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
        "metastore.task.threads.always":
            "org.apache.hadoop.hive.metastore.events.EventCleanerTask",
        # small connection pools: one client at a time here
        "datanucleus.connectionPool.maxPoolSize": "4",
    }
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
                   for k, v in settings.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"<?xml version=\"1.0\"?>\n<configuration>\n{body}</configuration>\n")


CATALOG = (Postgres, Metastore)
