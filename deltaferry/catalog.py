"""Registering a topic's table in a catalog by name (the topic's ``catalog:`` option).

After an ingest run, a topic with ``catalog: {type: hive, schema: S}`` has its Delta table
registered in the Hive Metastore of ``DELTAFERRY_HIVE_METASTORE_URI`` as the external table
``S.<table name>`` (``table_name:``, else the topic's name made a catalog name,
`deltaferry.config.topics.table_name_of`), with its columns (Hive types, the fields' comments)
and a comment saying where it comes from. The entry is the one Spark itself writes for a Delta
table (``USING delta LOCATION ...``): table properties ``spark.sql.sources.provider=delta`` and
the schema (``spark.sql.sources.schema.*``), the table's location in the storage parameter
``path`` (the entry's own location is left to the metastore, which need not reach the
warehouse), so Spark with Hive support, Trino's Delta Lake connector and other readers of
Spark's entries find it by name; the columns are also the entry's Hive columns, for catalogs'
UIs and engines that list them.

Registration runs when the table exists (after its first commit) and changes the entry only
when it differs (the first registration, a schema change, a new comment, a moved table): one
``get_table`` call per run otherwise. It speaks the metastore's Thrift API from this process,
not from the Spark driver's JVM (so a step over Spark Connect registers too), with a timeout,
one connection attempt per URI, no retries. A metastore that is down or does not answer fails
the registration only: the data has landed, the run succeeds, its report and log say so in one
line, and the next run registers the table.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from deltaferry import env as envvars

if TYPE_CHECKING:
    from deltaferry.context import TopicContext

log = logging.getLogger(__name__)

PROVIDER = "delta"
#: Spark splits the schema's JSON into table properties of this many characters.
SCHEMA_PART_CHARS = 4000
#: What Spark writes for a table whose format Hive cannot read itself.
SERDE = "org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe"
INPUT_FORMAT = "org.apache.hadoop.mapred.SequenceFileInputFormat"
OUTPUT_FORMAT = "org.apache.hadoop.hive.ql.io.HiveSequenceFileOutputFormat"


class CatalogError(Exception):
    """A registration that failed; its text is one line."""


def qualified_name(ctx: TopicContext) -> str:
    """``<schema>.<table>`` of the topic's table in its catalog."""
    return f"{ctx.topic.catalog.schema}.{ctx.topic.catalog_table}"


def table_comment(ctx: TopicContext) -> str:
    """The entry's comment: the topic it lands and how."""
    topic = ctx.topic
    kind = f"cdc {topic.cdc}, history {topic.history}" if topic.cdc else f"mode {topic.mode}"
    return f"Kafka topic {topic.name} landed by deltaferry ({kind}, format {topic.format})"


def register(spark: Any, ctx: TopicContext) -> str:
    """Register (or update) the topic's table in its catalog; one line saying what happened
    ('' when the topic has no catalog, the table has no commit yet, or the run is a debug
    run). Never raises for a catalog's failure: the line says it failed (and is logged as a
    warning). `spark` (a session of its own or one over Spark Connect) only reads the
    table's schema; the metastore is reached from this process."""
    from deltaferry.spark.table import is_delta_table

    catalog = ctx.topic.catalog
    if catalog.type is None or ctx.paths.debug:
        return ""
    if not is_delta_table(spark, ctx.paths.table):
        return ""
    name = qualified_name(ctx)
    try:
        uri = envvars.HIVE_METASTORE_URI.value()
        if not uri:
            raise CatalogError(f"{envvars.HIVE_METASTORE_URI.name} is not set")
        schema = spark.read.format("delta").load(ctx.paths.table).schema
        done = HiveRegistration(uri).sync(ctx, schema)
    except CatalogError as exc:
        line = (f"catalog: {name} not registered in hive: {exc}; the data landed, the next "
                "run registers it")
        log.warning("%s", line)
        return line
    line = f"catalog: {name} {done} in hive ({uri})"
    log.info("%s", line)
    return line


class HiveRegistration:
    """A Hive Metastore's Thrift API (``thrift://host:port``, plain binary protocol, no SASL),
    called from this process with the Python Thrift client of the metastore's IDL that
    pymetastore ships: no JVM, so a step over Spark Connect registers as one with a driver of
    its own does."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.addresses: list[tuple[str, int]] = []
        for one in (part.strip() for part in uri.split(",")):
            host, _, port = one.removeprefix("thrift://").rpartition(":")
            if not one.startswith("thrift://") or not host or not port.isdigit():
                raise CatalogError(f"{envvars.HIVE_METASTORE_URI.name}: {one!r} is not "
                                   "thrift://host:port")
            self.addresses.append((host.strip("[]"), int(port)))

    def connect(self) -> Any:
        """A client connected to the metastore: one attempt per URI, in turn, the timeout of
        DELTAFERRY_HIVE_METASTORE_TIMEOUT_SECONDS for the connection and each call."""
        from pymetastore.hive_metastore import ThriftHiveMetastore
        from thrift.protocol.TBinaryProtocol import TBinaryProtocol
        from thrift.transport import TSocket, TTransport

        timeout = envvars.HIVE_METASTORE_TIMEOUT_SECONDS.value()
        try:
            seconds = max(1.0, float(timeout))
        except ValueError:
            raise CatalogError(f"{envvars.HIVE_METASTORE_TIMEOUT_SECONDS.name}: {timeout!r} is "
                               "not a number of seconds") from None
        # Thrift's socket logs each refused connection as an error; `register` says it once
        logging.getLogger("thrift.transport.TSocket").setLevel(logging.CRITICAL)
        failures = []
        for host, port in self.addresses:
            socket = TSocket.TSocket(host, port)
            socket.setTimeout(seconds * 1000)
            transport = TTransport.TBufferedTransport(socket)
            try:
                transport.open()
            except Exception as exc:  # noqa: BLE001 - said below, in one line
                failures.append(f"{host}:{port}: {one_line(getattr(exc, 'inner', None) or exc)}")
                continue
            client = ThriftHiveMetastore.Client(TBinaryProtocol(transport))
            client.close = transport.close
            return client
        raise CatalogError(f"connecting: {'; '.join(failures)}")

    def _call(self, what: str, call: Any) -> Any:
        """`call()`; CatalogError saying `what` failed, in one line, if it raises."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - Thrift's, the socket's: said in one line
            raise CatalogError(f"{what}: {one_line(exc)}") from None

    def sync(self, ctx: TopicContext, schema: Any) -> str:
        """Create or update the entry of `ctx`'s table (and its schema) to `schema`; what was
        done: 'registered', 'updated' or 'up to date'."""
        from pymetastore.hive_metastore.ttypes import (
            Database,
            InvalidOperationException,
            NoSuchObjectException,
        )

        db, table = ctx.topic.catalog.schema, ctx.topic.catalog_table
        wanted = self.table(ctx, schema)
        client = self.connect()
        try:
            if self._call("reading the schema", lambda: _exists(
                    lambda: client.get_database(db), NoSuchObjectException)) is None:
                database = Database(name=db, description="tables landed by deltaferry",
                                    parameters={})
                self._call(f"creating schema {db}", lambda: client.create_database(database))
            current = self._call("reading the table", lambda: _exists(
                lambda: client.get_table(db, table), NoSuchObjectException))
            if current is None:
                self._call("creating the table", lambda: client.create_table(wanted))
                return "registered"
            if same_entry(current, wanted):
                return "up to date"
            # the location the metastore gave the entry stays (it refuses an entry without one)
            wanted.sd.location = current.sd.location
            try:
                client.alter_table(db, table, wanted)
            except InvalidOperationException:
                # a metastore that refuses a column's type change (Hive's
                # metastore.disallow.incompatible.col.type.changes: a widened type, a new
                # nested field): the entry is made again; it is external, no data is dropped
                self._call("replacing the table", lambda: _exists(
                    lambda: client.drop_table(db, table, False), NoSuchObjectException))
                self._call("replacing the table", lambda: client.create_table(wanted))
            except Exception as exc:  # noqa: BLE001 - said in one line
                raise CatalogError(f"updating the table: {one_line(exc)}") from None
            return "updated"
        finally:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def table(self, ctx: TopicContext, schema: Any) -> Any:
        """The Thrift ``Table`` of the topic's Delta table, as Spark writes one."""
        from pymetastore.hive_metastore.ttypes import (
            FieldSchema,
            SerDeInfo,
            StorageDescriptor,
            Table,
        )

        columns = [FieldSchema(name=field.name, type=hive_type(field.dataType),
                               comment=field.metadata.get("comment"))
                   for field in schema.fields]
        serde = SerDeInfo(serializationLib=SERDE,
                          parameters={"path": ctx.paths.table, "serialization.format": "1"})
        storage = StorageDescriptor(cols=columns, serdeInfo=serde, inputFormat=INPUT_FORMAT,
                                    outputFormat=OUTPUT_FORMAT, compressed=False, numBuckets=-1,
                                    bucketCols=[], sortCols=[], parameters={})
        text = schema.json()
        parts = [text[i:i + SCHEMA_PART_CHARS] for i in range(0, len(text), SCHEMA_PART_CHARS)]
        properties = {"EXTERNAL": "TRUE", "comment": table_comment(ctx),
                      "spark.sql.sources.provider": PROVIDER,
                      "spark.sql.sources.schema.numParts": str(len(parts)),
                      "deltaferry.topic": ctx.topic.name}
        properties.update({f"spark.sql.sources.schema.part.{i}": p for i, p in enumerate(parts)})
        return Table(dbName=ctx.topic.catalog.schema, tableName=ctx.topic.catalog_table,
                     owner="deltaferry", tableType="EXTERNAL_TABLE", sd=storage,
                     partitionKeys=[], parameters=properties)


def hive_type(datatype: Any) -> str:
    """A Spark type in Hive's spelling (Spark's own, but for the types Hive does not have:
    timestamp_ntz is Hive's timestamp; variant and void columns are listed as string)."""
    def hive(found: re.Match) -> str:
        return "timestamp" if found.group(1) == "timestamp_ntz" else "string"

    # a type, not a struct field's name: a name is followed by ':'
    return re.sub(r"(?:(?<=[:<,])|^)(timestamp_ntz|variant|void)(?=[>,]|$)", hive,
                  datatype.simpleString())


def same_entry(current: Any, wanted: Any) -> bool:
    """Whether the metastore's entry `current` already says what `wanted` says: the same
    columns, location, provider, schema and comment (the metastore adds its own
    properties, which are not compared)."""
    def columns(table: Any) -> list[tuple]:
        return [(c.name, c.type, c.comment) for c in table.sd.cols or []]

    def path(table: Any) -> str | None:
        return (table.sd.serdeInfo.parameters or {}).get("path")

    def ours(table: Any) -> dict[str, str]:
        found = dict(table.parameters or {})
        return {k: v for k, v in found.items()
                if k.startswith("spark.sql.sources.") or k in ("comment", "EXTERNAL",
                                                                "deltaferry.topic")}

    return (columns(current) == columns(wanted) and path(current) == path(wanted)
            and ours(current) == ours(wanted))


def _exists(get: Any, missing: type[Exception]) -> Any:
    """`get()`, or None when the metastore says the object is missing (`missing`)."""
    try:
        return get()
    except missing:
        return None


def one_line(exc: BaseException) -> str:
    """A Thrift or socket error as one line: its class's name and the first line of its
    message (a metastore puts whole stack traces into some messages)."""
    message = (getattr(exc, "message", None) or str(exc) or "").strip().splitlines()
    return f"{type(exc).__name__}: {message[0] if message else ''}".strip(": ")[:300]
