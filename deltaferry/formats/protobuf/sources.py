"""Where the writer schemas of a protobuf topic come from, and its infer step.

* `ProtoFileSchemas`: a topic without a registry (plain protobuf bodies, no frame) names a
  ``.proto`` file of the repository's ``schemas/`` folder (``proto_file:``) and the message
  (``message:``). The file is compiled at run time by the ``protoc`` that grpcio-tools bundles,
  with the well-known ``google/protobuf/*.proto`` files on its include path.
* `RegistrySchemas`: framed values name their schema id; each id's schema is fetched once per
  run. Apicurio (and confluent-kafka's serializer) store a protobuf schema as a base64
  FileDescriptorProto; Confluent's registry answers ``.proto`` text: both are accepted. Imports
  are resolved through the schema's references (subject and version), the well-known types from
  the ones bundled with the protobuf package.

`infer_protobuf` is the infer step of a protobuf topic: no Spark; the union of the Spark types of
every registered version (or of the file) is merged into the topic's schema cache, so the table
has every column from the first run. Ingest grows it further when a new version appears
(deltaferry.formats.protobuf); under a schema contract neither grows it after its first
version.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from deltaferry.config import SchemaMode, TopicConfig
from deltaferry.errors import ConfigError, DeltaferryError, VersionConflictError
from deltaferry.formats.contract import registry_writer
from deltaferry.formats.protobuf.wire import (
    REASON_CLASH,
    REASON_INDEX,
    REASON_UNKNOWN_ID,
    MessagePlan,
    PlanKey,
    WriterFile,
    descriptor_set,
    spark_type,
    well_known_file,
)
from deltaferry.registry import (
    BATCH_NOT_COMMITTED,
    RegistryError,
    RegistrySettings,
    subject_name,
    subject_version,
    unanswered,
)
from deltaferry.reports import ProtobufSchemaReport
from deltaferry.schema.merge import describe, describe_conflict, merge_schemas
from deltaferry.schema.store import SchemaStore, SchemaVersion

log = logging.getLogger(__name__)

#: References nested deeper than this are a cycle, not a real schema.
MAX_REFERENCE_DEPTH = 32
COMMIT_ATTEMPTS = 5


class ProtoSchemaError(DeltaferryError):
    """A .proto schema (a file of schemas/ or a registered one) cannot be used."""


def protoc_include() -> str:
    """The folder of the well-known .proto files that grpcio-tools bundles."""
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def compile_proto(sources: dict[str, str], main: str, what: str) -> WriterFile:
    """Compile the .proto texts `sources` (import name -> text) with protoc into the
    WriterFile of `main`; ProtoSchemaError with protoc's own message (naming `what`)."""
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory(prefix="deltaferry-proto-") as tmp:
        for name, text in sources.items():
            path = Path(tmp, name)
            if not path.resolve().is_relative_to(Path(tmp).resolve()):
                raise ProtoSchemaError(f"{what}: import name {name!r} leaves its folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out = Path(tmp, "descriptor-set.pb")
        # protoc in a child process: grpc_tools.protoc.main exits the interpreter on some
        # errors, and its messages go to the process's stderr, which we want in ours.
        result = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{protoc_include()}",
             f"--descriptor_set_out={out}", "--include_imports", main],
            cwd=tmp, capture_output=True, text=True, check=False,
        )
        if result.returncode != 0 or not out.exists():
            problem = (result.stderr or result.stdout).strip().replace(tmp + os.sep, "")
            raise ProtoSchemaError(f"{what}: protoc cannot compile it: {problem}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return WriterFile(main, descriptor_set(files), what)


@lru_cache(maxsize=32)
def _compiled(name: str, text: str, origin: str) -> WriterFile:
    """`compile_proto` of one file, once per (name, text, origin): a micro-batch asks again."""
    return compile_proto({name: text}, name, origin)


def _as_descriptor(schema_str: str):
    """The FileDescriptorProto a base64 schema string holds, or None for .proto text."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        raw = base64.b64decode(schema_str.strip(), validate=True)
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    return proto if proto.name else None


@dataclass(frozen=True)
class ProtoFileSchemas:
    """The writer schema of a topic without a registry: `message` of a .proto file."""

    path: str
    message: str
    framed: bool = False

    def writer_file(self) -> WriterFile:
        """The compiled file (ProtoSchemaError if it does not compile or lacks the message);
        compiled once per content of the file."""
        path = Path(self.path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProtoSchemaError(f"{self.path}: cannot read it: {exc.strerror}") from None
        file = _compiled(path.name, text, self.path)
        try:
            file.message_named(self.message)
        except KeyError:
            raise ProtoSchemaError(
                f"{self.path}: has no message {self.message!r} (messages: "
                f"{', '.join(file.message_names()) or 'none'}; give the full name, "
                "package.Message)") from None
        return file

    def plans(self, keys=()) -> dict[PlanKey, MessagePlan]:
        """The one plan of an unframed topic (key None)."""
        return {None: MessagePlan(self.writer_file(), self.message)}

    def versions(self) -> list[tuple[str, MessagePlan | None]]:
        """What the infer step merges: the file's message."""
        return [(self.path, MessagePlan(self.writer_file(), self.message))]

    def describe(self) -> str:
        return f"{self.message} of {self.path}"

    def writer_named(self, plan: MessagePlan) -> str:
        """The writer of `plan` as reasons name it: the message of the file."""
        return f"writer schema {self.message} of {self.path}"


class RegistrySchemas:
    """Writer schemas of framed values, by schema id, fetched from the registry once per run."""

    def __init__(self, topic: TopicConfig, settings: RegistrySettings | None = None,
                 client=None):
        self.topic = topic
        self.settings = settings or RegistrySettings.from_env()
        self.client = client or self.settings.client()
        self.url = self.settings.safe_url
        self.subject = subject_name(topic.name, topic.avro.subject_strategy, topic.avro.record_name)
        self.framed = True
        self._files: dict[int, WriterFile | None] = {}

    def _fail(self, what: str, exc) -> RegistryError:
        return RegistryError(self.url, f"topic {self.topic.name!r}: cannot read {what}: {exc}",
                             self.subject)

    def _resolve(self, schema, name: str, what: str, depth: int = 0) -> list:
        """The FileDescriptorProtos of `schema` (a registry Schema) and everything it imports,
        dependencies first; its own file named `name` if it is .proto text."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if depth > MAX_REFERENCE_DEPTH:
            raise ProtoSchemaError(f"{what}: references nest deeper than {MAX_REFERENCE_DEPTH}")
        if schema.schema_type not in (None, "PROTOBUF"):
            raise ProtoSchemaError(f"{what} is {schema.schema_type}, not PROTOBUF")
        imported = []
        sources: dict[str, str] = {}
        references = {r.name: r for r in (schema.references or [])}
        for ref in references.values():
            try:
                found = self.client.get_version(ref.subject, ref.version)
            except SchemaRegistryError as exc:
                raise self._fail(f"reference {ref.name!r} (subject {ref.subject!r} version "
                                 f"{ref.version}) of {what}", exc) from None
            except Exception as exc:  # the HTTP client's: the registry did not answer at all
                raise unanswered(self.url, f"reference {ref.name!r} of {what}", exc,
                                 self.subject) from None
            files = self._resolve(found.schema, ref.name, f"reference {ref.name!r}", depth + 1)
            imported.extend(files)
            if _as_descriptor(found.schema.schema_str) is None:
                sources[ref.name] = found.schema.schema_str
        own = _as_descriptor(schema.schema_str)
        if own is None:  # .proto text (Confluent's registry): compile it with its imports
            compiled = compile_proto({**sources, name: schema.schema_str}, name, what)
            from google.protobuf import descriptor_pb2

            return list(descriptor_pb2.FileDescriptorSet.FromString(
                compiled.descriptor_set).file)
        known = {f.name for f in imported}
        for dependency in own.dependency:
            if dependency in known:
                continue
            bundled = well_known_file(dependency)
            if bundled is None:
                raise ProtoSchemaError(f"{what} imports {dependency!r}, which is neither a "
                                       "reference of the schema nor a well-known type")
            imported.append(bundled)
            known.add(dependency)
        return [*imported, own]

    def writer_file(self, schema_id: int) -> WriterFile | None:
        """The schema `schema_id` (None if the registry does not know it)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id not in self._files:
            try:
                schema = self.client.get_schema(schema_id)
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise self._fail(f"schema id {schema_id}", exc) from None
                log.warning("schema id %d is unknown to %s; its messages go to quarantine",
                            schema_id, self.url)
                self._files[schema_id] = None
                return None
            except Exception as exc:  # the HTTP client's: the registry did not answer at all
                raise unanswered(self.url, f"schema id {schema_id} of topic {self.topic.name!r}",
                                 exc, self.subject, then=BATCH_NOT_COMMITTED) from None
            files = self._resolve(schema, f"schema-{schema_id}.proto", f"schema id {schema_id}")
            self._files[schema_id] = WriterFile(files[-1].name, descriptor_set(files),
                                                f"schema id {schema_id}")
        return self._files[schema_id]

    def plan(self, schema_id: int, indexes: tuple[int, ...]) -> MessagePlan:
        """How values of `schema_id` with message `indexes` decode (`message:` of the topic
        stands for the shorthand [0] when it is set)."""
        file = self.writer_file(schema_id)
        if file is None:
            return MessagePlan(None, None, schema_id, REASON_UNKNOWN_ID.format(id=schema_id))
        if indexes == (0,) and self.topic.protobuf.message:
            try:
                return MessagePlan(file, file.message_named(self.topic.protobuf.message).full_name,
                                   schema_id)
            except KeyError:
                return MessagePlan(None, None, schema_id,
                                   f"schema id {schema_id} ({file.name}) has no message "
                                   f"{self.topic.protobuf.message!r} (the topic's message)")
        try:
            return MessagePlan(file, file.message(indexes).full_name, schema_id)
        except IndexError:
            return MessagePlan(None, None, schema_id, REASON_INDEX.format(
                indexes=list(indexes), id=schema_id, file=file.name))

    def plans(self, keys) -> dict[PlanKey, MessagePlan]:
        """A plan for every (schema id, message indexes) in `keys`."""
        return {key: self.plan(*key) for key in keys if key is not None}

    def versions(self) -> list[tuple[str, MessagePlan | None]]:
        """What the infer step merges: the topic's `message` in each registered version of its
        subject (no plan without `message`: which message the frames name is known only
        from the frames, so ingest grows the schema from them)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            numbers = self.client.get_versions(self.subject)
        except SchemaRegistryError as exc:
            raise self._fail("its versions (is the subject right? set subject_strategy and "
                             "record_name)", exc) from None
        found: list[tuple[str, MessagePlan | None]] = []
        for number in sorted(numbers):
            if not self.topic.protobuf.message:
                found.append((f"version {number}", None))
                continue
            try:
                registered = self.client.get_version(self.subject, number)
            except SchemaRegistryError as exc:
                raise self._fail(f"version {number}", exc) from None
            found.append((f"version {number}", self.plan(registered.schema_id, (0,))))
        return found

    def describe(self) -> str:
        return f"subject {self.subject!r} at {self.url}"

    def writer_named(self, plan: MessagePlan) -> str:
        """The writer of `plan` as reasons name it: its schema id's version of the subject
        (``writer schema orders-value version 2, id 7``), and its message unless it is the
        topic's (``message``)."""
        assert plan.schema_id is not None  # every plan of a framed value has its schema id
        named = registry_writer(self.subject, subject_version(self.client, self.url,
                                                              plan.schema_id, self.subject),
                                plan.schema_id)
        return named if plan.message == self.topic.protobuf.message else \
            f"{named}, message {plan.message}"


def schemas_for(topic: TopicConfig):
    """The writer schemas of a protobuf topic: its .proto file, or the registry."""
    if topic.protobuf.proto_file:
        if not topic.protobuf.message:
            raise ConfigError(topic.name, "proto_file needs message (the full name)")
        return ProtoFileSchemas(topic.protobuf.proto_file, topic.protobuf.message)
    return RegistrySchemas(topic)


@dataclass
class Union:
    """The table schema grown by writer messages: what `grow` did."""

    version: SchemaVersion
    changed: bool
    changes: str
    clashes: dict = field(default_factory=dict)
    #: The stored schema grown by the writers that do not clash, stored or not (a topic
    #: under a schema contract decodes into it, then reads its rows without the new fields).
    grown: dict = field(default_factory=dict)


def grow(store: SchemaStore, plans: dict[PlanKey, MessagePlan], evolve: bool = True) -> Union:
    """Merge the Spark types of the writer messages of `plans` into the topic's newest stored
    schema and store a new version if it grew (without `evolve`, a topic under a schema
    contract, only a first version with fields is stored: the schema never grows after it; an
    infer step that knew no message, `message` unset, stores one without fields). A message
    that clashes with it (a field of another type, or under a contract one that would widen
    a field's type) is not merged: its plan key maps to the reason in `clashes`."""
    for _ in range(COMMIT_ATTEMPTS):
        cached = store.latest()
        schema = cached.schema if cached else None
        changes, clashes = [], {}
        version_number = (cached.version if cached else 0) + 1
        for key, plan in sorted(plans.items(), key=lambda kv: (kv[1].schema_id or 0, str(kv[0]))):
            if plan.problem is not None or plan.file is None or plan.message is None:
                continue
            writer = spark_type(plan.file.message_named(plan.message))
            result = merge_schemas(schema, writer)
            # under a contract a column's type is held too: a writer that would widen it clashes
            held = [] if evolve or cached is None else merge_schemas(cached.schema,
                                                                    writer).widened
            if result.conflicts or held:
                clashes[key] = REASON_CLASH.format(
                    id=plan.schema_id, message=plan.message,
                    version=cached.version if cached else version_number,
                    conflicts=", ".join([*(describe_conflict(c) for c in result.conflicts),
                                         *(f"{w.path} ({w.from_type} vs {w.to_type})"
                                           for w in held)]))
                continue
            if result.changed:
                changes.append(f"{plan.message} (schema id {plan.schema_id}): "
                               f"{describe(result)}" if plan.schema_id is not None
                               else f"{plan.message}: {describe(result)}")
            schema = result.schema
        if schema is None:
            schema = {"type": "struct", "fields": []}
        if cached is not None and not changes:
            return Union(cached, False, "no change", clashes, schema)
        if cached is not None and not evolve and cached.schema.get("fields"):
            return Union(cached, False, "no change (schema contract)", clashes, schema)
        try:
            version = store.write_version(schema, {}, "; ".join(changes) or "no fields")
        except VersionConflictError:
            continue
        return Union(version, True, version.changes, clashes, schema)
    raise VersionConflictError(store.location, f"gave up after {COMMIT_ATTEMPTS} racing writes")


def infer_protobuf(topic: TopicConfig, store: SchemaStore) -> ProtobufSchemaReport:
    """The infer step of a protobuf topic: every writer version's message into the cache."""
    started = time.monotonic()
    schemas = schemas_for(topic)
    versions = schemas.versions()
    problems = [f"{name}: {plan.problem}" for name, plan in versions if plan and plan.problem]
    for problem in problems:
        log.warning("infer %s: %s", topic.name, problem)
    if versions and all(plan is None for _, plan in versions):
        log.info("infer %s: no message set for the topic; ingest takes each frame's message "
                 "and grows the schema from it", topic.name)
    union = grow(store, {(i, ()): plan for i, (_, plan) in enumerate(versions)
                         if plan is not None}, evolve=topic.schema == SchemaMode.EVOLVE)
    report = ProtobufSchemaReport(
        topic.name, schemas.describe(), [name for name, _ in versions], union.version.version,
        union.changed, union.changes, [*problems, *union.clashes.values()],
        time.monotonic() - started)
    log.info(report.summary())
    return report
