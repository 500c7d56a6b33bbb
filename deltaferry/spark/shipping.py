"""deltaferry's own code for the executors of a cluster.

On a `local[*]` master the executors are threads of the driver's JVM and their Python workers run
the driver's interpreter, so they import the driver's deltaferry. On a cluster (a ``spark://``
master) the Python workers run on other machines, in the interpreter PYSPARK_PYTHON names there;
a UDF of deltaferry (protobuf decoding) pickles references to deltaferry's modules, which they
must import. `package_zip` builds the running deltaferry as a zip that Spark ships with the job
(``--py-files`` under spark-submit, ``SparkContext.addPyFile`` in-process), so the executors run
exactly the driver's deltaferry; their Python needs only deltaferry's requirements (pyarrow and
protobuf for protobuf topics).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import deltaferry
from deltaferry import runtime

PACKAGE_DIR = Path(deltaferry.__file__).resolve().parent


def is_local(master: str | None) -> bool:
    """True for a local master (executors in the driver's JVM): `local`, `local[*]`, ..."""
    return (master or "local").startswith("local")


def package_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The package's Python files, sorted (no caches)."""
    return sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)


def package_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """A short digest of the package's files and their paths: a new zip when the code changes."""
    digest = hashlib.sha256()
    for path in package_files(package_dir):
        digest.update(str(path.relative_to(package_dir)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def package_zip(folder: Path | None = None, package_dir: Path = PACKAGE_DIR) -> Path:
    """The zip of deltaferry (``deltaferry/...`` at its root) in `folder` (default: a folder of
    this user's own, `runtime.private_dir`: a zip found there runs on the executors, so a
    folder another user made or could write into is refused), built once per version of the
    code."""
    if folder is None:
        folder = runtime.private_dir("deltaferry-py")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"deltaferry-{package_digest(package_dir)}.zip"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".zip.tmp")
    os.close(fd)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in package_files(package_dir):
            archive.write(path, Path(package_dir.name) / path.relative_to(package_dir))
    os.replace(tmp, target)  # a concurrent builder writes the same bytes
    return target
