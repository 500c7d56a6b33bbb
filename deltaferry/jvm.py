"""Where the JVM libraries resolved by `make setup` live, and how Spark is pointed at them.

Maven resolves `jvm/spark/pom.xml` and `jvm/kafka/pom.xml` into `<deps>/jars/spark` and
`<deps>/jars/kafka`; `<deps>` is `DELTAFERRY_DEPS`, else `.deps` in the current directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.errors import SetupError

_VERSION_SUFFIX = re.compile(r"-\d[\w.]*(-\d+)?\.jar$")


def deps_dir() -> Path:
    """The folder `make setup` resolves JVM libraries (and other binaries) into:
    DELTAFERRY_DEPS, else ``.deps`` in the current directory."""
    return Path(envvars.DEPS.value() or ".deps").resolve()


def jars_in(kind: str) -> list[Path]:
    """The jars resolved for `kind` ('spark' or 'kafka'); a clear error if setup has not run."""
    folder = deps_dir() / "jars" / kind
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        raise SetupError(
            f"no {kind} jars in {folder}: run `make setup` (it resolves jvm/{kind}/pom.xml "
            f"from Maven Central), or point DELTAFERRY_DEPS at a folder that holds jars/{kind}"
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
    """The jars folder of the installed pyspark, found without importing pyspark (~0.3 s: an
    Airflow task asks for the driver's options without needing pyspark itself)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError("pyspark is not installed: run `make setup`")
    return Path(spec.origin).resolve().parent / "jars"


def main() -> None:
    """`python -m deltaferry.jvm prune`: drop resolved Spark jars that pyspark already ships."""
    folder = deps_dir() / "jars" / "spark"
    removed = prune_shipped(folder, pyspark_jars_dir())
    kept = sorted(p.name for p in folder.glob("*.jar"))
    print(f"spark jars: kept {len(kept)} ({', '.join(kept)}); {len(removed)} already in pyspark")


if __name__ == "__main__":
    main()
