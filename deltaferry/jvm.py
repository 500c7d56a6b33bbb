"""The driver JVM in one place: where the libraries resolved by `make setup` live, the options
and memory a driver deltaferry starts gets, and the class archive it maps.

Maven resolves `jvm/spark/pom.xml` and `jvm/kafka/pom.xml` into `<deps>/jars/spark` and
`<deps>/jars/kafka`; `<deps>` is `DELTAFERRY_DEPS`, else `.deps` of the checkout deltaferry is
installed from, else `.deps` in the current directory (`deps_dir`). A process that starts
another (a warm driver pool, spark-submit) hands the folder it resolved down explicitly
(`deps_env`), so a child started in another folder finds the same libraries. No Spark import
here: an Airflow task asks for a driver's options without loading pyspark.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.errors import SetupError

_VERSION_SUFFIX = re.compile(r"-\d[\w.]*(-\d+)?\.jar$")


#: The folder name `make setup` fills, at the root of a checkout.
DEPS_FOLDER = ".deps"


def checkout_deps() -> Path:
    """``.deps`` of the checkout this deltaferry package was installed from (an editable
    install, or a checkout on PYTHONPATH); a wheel installed elsewhere has none there."""
    return Path(__file__).resolve().parent.parent / DEPS_FOLDER


def deps_dir(env: Mapping[str, str] | None = None) -> Path:
    """The folder `make setup` resolves JVM libraries (and other binaries) into, absolute:
    DELTAFERRY_DEPS (of `env`, default os.environ), else `checkout_deps` if it exists, else
    ``.deps`` in the current directory (which may not exist: `jars_in` then says where it
    looked)."""
    configured = (envvars.DEPS.raw(env) or "").strip()
    if configured:
        return Path(configured).resolve()
    checkout = checkout_deps()
    # resolved: a worktree whose .deps links to another checkout's names the same jars, and
    # so finds the class archive built for them (`archive_path`)
    return checkout.resolve() if checkout.is_dir() else Path(DEPS_FOLDER).resolve()


def deps_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """DELTAFERRY_DEPS set to `deps_dir` as resolved here: what a process hands the processes
    it starts (a warm driver pool runs in its own folder, spark-submit wherever the task runs),
    so they use the same libraries whatever their current directory."""
    return {envvars.DEPS.name: str(deps_dir(env))}


def jars_in(kind: str) -> list[Path]:
    """The jars resolved for `kind` ('spark' or 'kafka'); a clear error if setup has not run."""
    folder = deps_dir() / "jars" / kind
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        name = envvars.DEPS.name
        where = (name if (envvars.DEPS.raw() or "").strip() else
                 f"no {name}, and no {checkout_deps()} beside the installed package")
        raise SetupError(
            f"no {kind} jars in {folder} ({where}): run `make setup` in the checkout (it "
            f"resolves jvm/{kind}/pom.xml from Maven Central into .deps/), or point "
            f"{name} at a folder that holds jars/{kind}"
        )
    return jars


def artifact_name(jar: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`: the jar's name without its version."""
    return _VERSION_SUFFIX.sub("", jar)


def prune_shipped(folder: Path, shipped: Path) -> list[str]:
    """Remove from `folder` every jar whose artifact `shipped` (pyspark's jars) already has.

    Maven copies the Kafka connector's and Delta's transitive dependencies too; pyspark ships
    newer builds of most of them, and two versions of one library on a classpath is a trap.
    Returns the names removed.
    """
    have = {artifact_name(p.name) for p in shipped.glob("*.jar")}
    removed = []
    for jar in sorted(folder.glob("*.jar")):
        if artifact_name(jar.name) in have:
            jar.unlink()
            removed.append(jar.name)
    return removed


def pyspark_jars_dir() -> Path:
    """The jars folder of the installed pyspark, found without importing pyspark (an Airflow
    task asks for the driver's options without needing pyspark itself)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError("pyspark is not installed: run `make setup`")
    return Path(spec.origin).resolve().parent / "jars"


#: JVM options of a driver deltaferry starts for one run (`deltaferry run`, a spark-submit): C1
#: compilation only (a run is short and the machine small: C2's compiler threads cost more CPU
#: than its faster code saves; see bench/RESULTS.md). C1 alone gets a 48 MB code cache, which a
#: driver fills early ("CodeCache is full. Compiler has been disabled": everything after runs
#: interpreted), so it gets the 240 MB tiered compilation would have.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
#: JVM options of a warm driver (`deltaferry.spark.warm`): the JVM's own tiered compilation (C1,
#: then C2 for hot code, in its default 240 MB code cache). A warm driver runs step after step
#: for up to an hour idle, so C2's compilations pay: a 210,000-message backlog's decode 3.3-3.8 s
#: with C1 only, 1.5-2.0 s once C2 has compiled it (bench/RESULTS.md).
WARM_DRIVER_JAVA_OPTIONS = ""


def driver_java_options(env: Mapping[str, str] | None = None, warm: bool = False) -> str:
    """The driver JVM's options: DELTAFERRY_DRIVER_JAVA_OPTIONS, else WARM_DRIVER_JAVA_OPTIONS
    for a `warm` driver and DRIVER_JAVA_OPTIONS for any other, with the class archive `make
    setup` built for this JVM and jars, if there is one."""
    if envvars.DRIVER_JAVA_OPTIONS.is_set(env):
        return (envvars.DRIVER_JAVA_OPTIONS.raw(env) or "").strip()
    options = WARM_DRIVER_JAVA_OPTIONS if warm else DRIVER_JAVA_OPTIONS
    return f"{options} {archive_option(env)}".strip()


def driver_memory(env: Mapping[str, str] | None = None) -> str:
    """The driver's heap (spark.driver.memory): DELTAFERRY_DRIVER_MEMORY, else its default."""
    return envvars.DRIVER_MEMORY.value(env)


# --- the class archive (dynamic CDS), built by deltaferry.spark.class_archive -------------------

#: Where the archives live, under the deps folder `make setup` fills.
ARCHIVE_FOLDER = "cds"


def java_binary(env: Mapping[str, str] | None = None) -> Path | None:
    """The `java` a driver PySpark launches runs: JAVA_HOME's, else the one on PATH."""
    home = envvars.JAVA_HOME.raw(env)
    if home and (Path(home) / "bin" / "java").exists():
        return (Path(home) / "bin" / "java").resolve()
    found = shutil.which("java", path=(os.environ if env is None else env).get("PATH"))
    return Path(found).resolve() if found else None


#: The archive's training (deltaferry.spark.class_archive, read as text: no Spark import here),
#: part of its key: a new training, or a driver class path laid out anew (which comes with
#: one), makes a new archive, where an old one would not map (its class path no longer the
#: driver's) or would miss the classes the new training loads.
TRAINING_SOURCE = Path(__file__).resolve().parent / "spark" / "class_archive.py"


def archive_key(java: Path, jars: list[Path], training: Path = TRAINING_SOURCE) -> str:
    """A digest of what makes an archive valid: the JVM binary (path, size, mtime), the jars
    on the driver's class path (names and sizes) and the training that made it (its text)."""
    digest = hashlib.sha256(training.read_bytes())
    for path in [java, *sorted(jars)]:
        stat = path.stat()
        digest.update(f"{path}|{stat.st_size}|{int(stat.st_mtime)}\n".encode())
    return digest.hexdigest()[:16]


def driver_jars() -> list[Path]:
    """The jars a driver deltaferry starts loads classes from: pyspark's and the resolved
    Spark-side ones."""
    spark = deps_dir() / "jars" / "spark"
    return sorted(pyspark_jars_dir().glob("*.jar")) + sorted(spark.glob("*.jar"))


def archive_path(env: Mapping[str, str] | None = None) -> Path | None:
    """Where the archive for this JVM and these jars is (or would be); None without a java."""
    java = java_binary(env)
    if java is None:
        return None
    return deps_dir() / ARCHIVE_FOLDER / f"driver-{archive_key(java, driver_jars())}.jsa"


def archive_option(env: Mapping[str, str] | None = None) -> str:
    """``-XX:SharedArchiveFile=<archive>`` when the archive for this JVM and jars exists, else
    "" (the driver starts without one)."""
    try:
        path = archive_path(env)
    except OSError:
        return ""
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def main() -> None:
    """`python -m deltaferry.jvm prune`: drop resolved Spark jars that pyspark already ships."""
    folder = deps_dir() / "jars" / "spark"
    removed = prune_shipped(folder, pyspark_jars_dir())
    kept = sorted(p.name for p in folder.glob("*.jar"))
    print(f"spark jars: kept {len(kept)} ({', '.join(kept)}); {len(removed)} already in pyspark")


if __name__ == "__main__":
    main()
