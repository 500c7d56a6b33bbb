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
``get_table`` call per run otherwise. It goes through the Hive Metastore client that pyspark
ships (Thrift, in the Spark driver), with a timeout, one connection attempt, no retries. A
metastore that is down or does not answer fails the registration only: the data has landed,
the run succeeds, its report and log say so in one line, and the next run registers the table.
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
#: The Hive client's loggers: their connection failures are said once, by `register`.
CLIENT_LOGGERS = ("org.apache.hadoop.hive.metastore", "hive.metastore")


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
    warning)."""
    catalog = ctx.topic.catalog
    if catalog.type is None or ctx.paths.debug:
        return ""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError

    if not DeltaTable.isDeltaTable(spark, ctx.paths.table):
        return ""
    name = qualified_name(ctx)
    try:
        uri = envvars.HIVE_METASTORE_URI.value()
        if not uri:
            raise CatalogError(f"{envvars.HIVE_METASTORE_URI.name} is not set")
        schema = spark.read.format("delta").load(ctx.paths.table).schema
        done = HiveRegistration(spark, uri).sync(ctx, schema)
    except Py4JError as exc:  # e.g. a Spark without pyspark's Hive client (spark-hive jars)
        line = (f"catalog: {name} not registered in hive: this Spark has no Hive Metastore "
                f"client ({str(exc).splitlines()[0][:200]}); the data landed")
        log.warning("%s", line)
        return line
    except CatalogError as exc:
        line = (f"catalog: {name} not registered in hive: {exc}; the data landed, the next "
                "run registers it")
        log.warning("%s", line)
        return line
    line = f"catalog: {name} {done} in hive ({uri})"
    log.info("%s", line)
    return line


class HiveRegistration:
    """A Hive Metastore's Thrift client in the Spark driver's JVM (pyspark's Hive jars)."""

    def __init__(self, spark: Any, uri: str) -> None:
        self.jvm = spark._jvm
        self.uri = uri
        self.api = self.jvm.org.apache.hadoop.hive.metastore.api

    def connect(self) -> Any:
        """A client connected to the metastore: one attempt, the timeout of
        DELTAFERRY_HIVE_METASTORE_TIMEOUT_SECONDS for the connection and each call."""
        jvm = self.jvm
        timeout = envvars.HIVE_METASTORE_TIMEOUT_SECONDS.value()
        try:
            seconds = max(1, round(float(timeout)))
        except ValueError:
            raise CatalogError(f"{envvars.HIVE_METASTORE_TIMEOUT_SECONDS.name}: {timeout!r} is "
                               "not a number of seconds") from None
        level = jvm.org.apache.logging.log4j.Level.OFF
        for logger in CLIENT_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(logger, level)
        conf = jvm.org.apache.hadoop.hive.conf.HiveConf()
        for key, value in {
            "hive.metastore.uris": self.uri,
            "hive.metastore.connect.retries": "1",
            "hive.metastore.failure.retries": "0",
            "hive.metastore.client.socket.timeout": f"{seconds}s",
            "hive.metastore.execute.setugi": "false",
        }.items():
            conf.set(key, value)
        return self._call("connecting", lambda: jvm.org.apache.hadoop.hive.metastore
                          .HiveMetaStoreClient(conf))

    def _call(self, what: str, call: Any) -> Any:
        """`call()`; CatalogError saying `what` failed, in one line, if it raises."""
        from py4j.protocol import Py4JError, Py4JJavaError

        try:
            return call()
        except Py4JJavaError as exc:
            raise CatalogError(f"{what}: {one_line(exc.java_exception)}") from None
        except Py4JError as exc:
            raise CatalogError(f"{what}: {str(exc).splitlines()[0]}") from None

    def sync(self, ctx: TopicContext, schema: Any) -> str:
        """Create or update the entry of `ctx`'s table (and its schema) to `schema`; what was
        done: 'registered', 'updated' or 'up to date'."""
        db, table = ctx.topic.catalog.schema, ctx.topic.catalog_table
        wanted = self.table(ctx, schema)
        client = self.connect()
        try:
            if not self._call("reading the schema", lambda: _exists(
                    lambda: client.getDatabase(db), self.api.NoSuchObjectException)):
                database = self.api.Database()
                database.setName(db)
                database.setDescription("tables landed by deltaferry")
                database.setParameters(self.jvm.java.util.HashMap())
                self._call(f"creating schema {db}", lambda: client.createDatabase(database))
            current = self._call("reading the table", lambda: _exists(
                lambda: client.getTable(db, table), self.api.NoSuchObjectException))
            if current is None:
                self._call("creating the table", lambda: client.createTable(wanted))
                return "registered"
            if same_entry(current, wanted):
                return "up to date"
            # the location the metastore gave the entry stays (it refuses an entry without one)
            wanted.getSd().setLocation(current.getSd().getLocation())
            try:
                self._call("updating the table", lambda: client.alter_table(db, table, wanted))
            except CatalogError as exc:
                if "InvalidOperationException" not in str(exc):
                    raise
                # a metastore that refuses a column's type change (Hive's
                # metastore.disallow.incompatible.col.type.changes: a widened type, a new
                # nested field): the entry is made again; it is external, no data is dropped
                self._call("replacing the table", lambda: client.dropTable(db, table, False,
                                                                           True))
                self._call("replacing the table", lambda: client.createTable(wanted))
            return "updated"
        finally:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def table(self, ctx: TopicContext, schema: Any) -> Any:
        """The Thrift ``Table`` of the topic's Delta table, as Spark writes one."""
        jvm, api = self.jvm, self.api
        columns = jvm.java.util.ArrayList()
        for field in schema.fields:
            columns.add(api.FieldSchema(field.name, hive_type(field.dataType),
                                        field.metadata.get("comment")))
        serde = api.SerDeInfo()
        serde.setSerializationLib(SERDE)
        serde.setParameters(_java_map(jvm, {"path": ctx.paths.table,
                                             "serialization.format": "1"}))
        storage = api.StorageDescriptor()
        storage.setCols(columns)
        storage.setSerdeInfo(serde)
        storage.setInputFormat(INPUT_FORMAT)
        storage.setOutputFormat(OUTPUT_FORMAT)
        storage.setBucketCols(jvm.java.util.ArrayList())
        storage.setSortCols(jvm.java.util.ArrayList())
        storage.setParameters(jvm.java.util.HashMap())
        text = schema.json()
        parts = [text[i:i + SCHEMA_PART_CHARS] for i in range(0, len(text), SCHEMA_PART_CHARS)]
        properties = {"EXTERNAL": "TRUE", "comment": table_comment(ctx),
                      "spark.sql.sources.provider": PROVIDER,
                      "spark.sql.sources.schema.numParts": str(len(parts)),
                      "deltaferry.topic": ctx.topic.name}
        properties.update({f"spark.sql.sources.schema.part.{i}": p for i, p in enumerate(parts)})
        entry = api.Table()
        entry.setDbName(ctx.topic.catalog.schema)
        entry.setTableName(ctx.topic.catalog_table)
        entry.setOwner("deltaferry")
        entry.setTableType("EXTERNAL_TABLE")
        entry.setSd(storage)
        entry.setPartitionKeys(jvm.java.util.ArrayList())
        entry.setParameters(_java_map(jvm, properties))
        return entry


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
        return [(c.getName(), c.getType(), c.getComment()) for c in table.getSd().getCols()]

    def path(table: Any) -> str | None:
        return table.getSd().getSerdeInfo().getParameters().get("path")

    def ours(table: Any) -> dict[str, str]:
        found = dict(table.getParameters())
        return {k: v for k, v in found.items()
                if k.startswith("spark.sql.sources.") or k in ("comment", "EXTERNAL",
                                                                "deltaferry.topic")}

    return (columns(current) == columns(wanted) and path(current) == path(wanted)
            and ours(current) == ours(wanted))


def _exists(get: Any, missing: Any) -> Any:
    """`get()`, or None/False when the JVM says the object is missing (`missing`)."""
    from py4j.protocol import Py4JJavaError

    try:
        return get()
    except Py4JJavaError as exc:
        if exc.java_exception.getClass().getName() == missing._fqn:
            return None
        raise


def _java_map(jvm: Any, values: dict[str, str]) -> Any:
    java = jvm.java.util.HashMap()
    for key, value in values.items():
        java.put(key, value)
    return java


def one_line(java_exception: Any) -> str:
    """A Java exception as one line: its class's simple name and the first line of its message
    (the Hive client puts whole stack traces into some messages), the root cause's too."""
    def said(exc: Any) -> str:
        message = (exc.getMessage() or "").strip().splitlines()
        return f"{exc.getClass().getSimpleName()}: {message[0] if message else ''}".strip(": ")

    text, cause, seen = said(java_exception), java_exception.getCause(), 0
    while cause is not None and cause.getCause() is not None and seen < 10:
        cause, seen = cause.getCause(), seen + 1
    if cause is not None:
        text += f" ({said(cause)})"
    return text[:300]
