import json
import os

import pytest

from deltaferry.errors import SchemaStoreError, VersionConflictError
from deltaferry.schema.store import SchemaStore

S1 = {"type": "struct", "fields": [{"name": "a", "type": "long", "nullable": True, "metadata": {}}]}
S2 = {"type": "struct", "fields": S1["fields"] + [
    {"name": "b", "type": "string", "nullable": True, "metadata": {}}]}


def test_empty_store(tmp_path):
    store = SchemaStore(str(tmp_path / "_schema"))
    assert store.latest() is None and store.versions() == [] and store.covered() == {}


def test_versions_are_kept_with_their_offsets(tmp_path):
    store = SchemaStore(str(tmp_path / "_schema"))
    v1 = store.write_version(S1, {0: 5, 1: 3}, "first")
    store.set_covered({0: 5, 1: 3}, 1)
    v2 = store.write_version(S2, {0: 9, 1: 3}, "added: b")
    assert (v1.version, v2.version) == (1, 2)
    assert store.versions() == [1, 2]
    assert store.read(1).schema == S1 and store.read(1).offsets == {0: 5, 1: 3}
    assert store.latest().schema == S2 and store.latest().changes == "added: b"
    assert sorted(os.listdir(store.location)) == ["covered.json", "v000001.json", "v000002.json"]


def test_covered_only_moves_forward(tmp_path):
    store = SchemaStore(str(tmp_path))
    store.set_covered({0: 10, 1: 4}, 1)
    store.set_covered({0: 7, 2: 1}, 1)
    assert store.covered() == {0: 10, 1: 4, 2: 1}


def test_a_version_number_cannot_be_written_twice(tmp_path):
    store = SchemaStore(str(tmp_path))
    store.write_version(S1, {}, "")
    racing = SchemaStore(str(tmp_path))
    racing.versions = lambda: []  # a run that listed the folder before the first write landed
    with pytest.raises(VersionConflictError, match="version 1 was written by another run"):
        racing.write_version(S2, {}, "")
    assert store.read(1).schema == S1
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp")] == []


def test_unreadable_version_names_the_file(tmp_path):
    (tmp_path / "v000001.json").write_text("{not json")
    with pytest.raises(SchemaStoreError, match="v000001.json is not a schema version"):
        SchemaStore(str(tmp_path)).latest()


def test_version_file_is_plain_json(tmp_path):
    SchemaStore(str(tmp_path)).write_version(S1, {2: 7}, "first")
    data = json.loads((tmp_path / "v000001.json").read_text())
    assert data["offsets"] == {"2": 7} and data["schema"] == S1 and data["version"] == 1
