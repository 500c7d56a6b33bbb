"""The versioned schema cache of one topic, in ``<warehouse>/<topic>/_schema/``.

* ``v000001.json``, ``v000002.json``, ...: one immutable file per schema change, holding the
  schema (Spark's JSON form), the offsets the inference had covered, when, and what changed.
* ``covered.json``: the offsets every inference so far has read (next offset per partition), so
  the next inference reads only what came after.
* ``modes.json``: each change of the topic's ``schema:`` mode its runs saw (`record_mode`), with
  when and the schema version then, for the schema-history page.

A version file is created whole or not at all, and only if its name is free: on a local folder
it is written under a temporary name and linked to its final name (the link fails if the name
exists); on S3 it is one conditional PUT (``If-None-Match: *``; the store answers 412 if the key
exists, and a PUT is never visible half-written). So a reader never sees half a version and two
racing runs cannot both write version N (the loser gets VersionConflictError and retries on top
of the winner). ``covered.json`` is replaced whole (rename locally, a plain PUT on S3).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from deltaferry.errors import SchemaStoreError, VersionConflictError
from deltaferry.lock import ensure_held
from deltaferry.storage import Storage, join, storage_for

_VERSION_FILE = re.compile(r"^v(\d{6})\.json$")
COVERED_FILE = "covered.json"
MODES_FILE = "modes.json"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SchemaVersion:
    """One stored schema version."""

    version: int
    schema: dict
    offsets: dict[int, int]
    created_at: str = field(default_factory=_now)
    changes: str = ""

    def to_json(self) -> str:
        """The file content of this version."""
        return json.dumps(
            {
                "version": self.version,
                "created_at": self.created_at,
                "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
                "changes": self.changes,
                "schema": self.schema,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> SchemaVersion:
        """Parse a version file."""
        data = json.loads(text)
        return cls(
            version=int(data["version"]),
            schema=data["schema"],
            offsets={int(p): int(o) for p, o in data.get("offsets", {}).items()},
            created_at=data.get("created_at", ""),
            changes=data.get("changes", ""),
        )


class SchemaStore:
    """Read and write the schema versions of one topic, in a local folder or under an S3 prefix."""

    def __init__(self, location: str, storage: Storage | None = None):
        self.location = location
        self.storage = storage or storage_for(location)

    def _path(self, name: str) -> str:
        return join(self.location, name)

    def versions(self) -> list[int]:
        """The stored version numbers, ascending."""
        found = (_VERSION_FILE.match(n) for n in self.storage.list(self.location))
        return sorted(int(m.group(1)) for m in found if m)

    def read(self, version: int) -> SchemaVersion:
        """One version; SchemaStoreError if it is missing or unreadable."""
        path = self._path(f"v{version:06d}.json")
        try:
            return SchemaVersion.from_json(self.storage.read(path).decode("utf-8"))
        except FileNotFoundError:
            raise SchemaStoreError(self.location, f"version {version} does not exist") from None
        except (ValueError, KeyError) as exc:
            raise SchemaStoreError(self.location,
                                   f"{path} is not a schema version: {exc}") from None

    def latest(self) -> SchemaVersion | None:
        """The newest version, or None when nothing is cached yet."""
        versions = self.versions()
        return self.read(versions[-1]) if versions else None

    def covered(self) -> dict[int, int]:
        """Next offset per partition that inference has not read yet ({} if none)."""
        try:
            data = json.loads(self.storage.read(self._path(COVERED_FILE)))
        except FileNotFoundError:
            latest = self.latest()
            return dict(latest.offsets) if latest else {}
        return {int(p): int(o) for p, o in data["offsets"].items()}

    def write_version(self, schema: dict, offsets: dict[int, int], changes: str) -> SchemaVersion:
        """Store `schema` as the next version; VersionConflictError if another run took it."""
        latest = self.versions()
        version = SchemaVersion(
            version=(latest[-1] + 1) if latest else 1,
            schema=schema,
            offsets=dict(offsets),
            changes=changes,
        )
        final = self._path(f"v{version.version:06d}.json")
        ensure_held(self.location, f"writing schema version {version.version} to {final}")
        if not self.storage.put_if_absent(final, version.to_json().encode("utf-8")):
            raise VersionConflictError(
                self.location, f"version {version.version} was written by another run"
            )
        return version

    def set_covered(self, offsets: dict[int, int], version: int) -> None:
        """Record that inference has read every offset below `offsets` (replaced whole)."""
        merged = self.covered()
        for partition, offset in offsets.items():
            merged[partition] = max(offset, merged.get(partition, offset))
        text = json.dumps(
            {
                "version": version,
                "updated_at": _now(),
                "offsets": {str(p): o for p, o in sorted(merged.items())},
            },
            indent=2,
        )
        ensure_held(self.location, f"writing {self._path(COVERED_FILE)}")
        self.storage.write(self._path(COVERED_FILE), text.encode("utf-8"))

    def modes(self) -> list[dict]:
        """The ``schema:`` modes the topic's runs saw, oldest first, each ``{"mode", "at",
        "schema_version"}`` from when a run first saw it ([] before the first record)."""
        try:
            data = json.loads(self.storage.read(self._path(MODES_FILE)))
        except FileNotFoundError:
            return []
        return list(data.get("modes") or []) if isinstance(data, dict) else []

    def record_mode(self, mode: str) -> bool:
        """Record that the topic's runs now use the ``schema:`` `mode` (a run holding the
        topic's lock), when it is not the mode recorded last; whether it was recorded."""
        found = self.modes()
        if found and found[-1].get("mode") == mode:
            return False
        latest = self.versions()
        found.append({"mode": str(mode), "at": _now(),
                      "schema_version": latest[-1] if latest else None})
        ensure_held(self.location, f"writing {self._path(MODES_FILE)}")
        self.storage.write(self._path(MODES_FILE),
                           json.dumps({"modes": found}, indent=2).encode("utf-8"))
        return True
