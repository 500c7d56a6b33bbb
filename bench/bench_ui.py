"""How long each deltaferry page of the Airflow UI takes (issue 17's budget: under 2 s each on
the demo data, on a 2-core machine), and the dag-processor's parse of a 500-topic file (issue 32:
<= 10 s).

With a running local Airflow (`make demo` or `make airflow`), the pages are fetched from its
api-server over HTTP as the UI loads them, logged in as admin (authentication, Airflow's
metadata database, the plugin, the reads). Without one, the pages' app is run in this process
on the demo's warehouse and the local stack (the same reads and rendering, no Airflow). Prints
each page's first (cold) time and the median and slowest of the next requests. Not a test: it
prints figures.

    make bench-ui                 # or: .venv/bin/python bench/bench_ui.py [--repeat 5]
    .venv/bin/python bench/bench_ui.py --parse 500

``--parse N``: a file of N topics, and for each DAG file of dags/ what the dag-processor's
parsing child does with it, timed in a fresh process that has imported what the dag-processor
has (Airflow; not deltaferry): import the file (building the DAGs), then serialize them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from deltaferry.config import load_topics

LIMIT_S = 2.0


def pages(topics: list[str]) -> list[str]:
    paths = ["/"]
    for topic in topics:
        paths += [f"/topics/{topic}/{page}" for page in ("schema", "quarantine", "health")]
    return paths


def measure(get, paths: list[str], repeat: int) -> bool:
    within = True
    for path in paths:
        times, status = [], None
        for _ in range(repeat + 1):
            started = time.perf_counter()
            answer = get(path)
            times.append(time.perf_counter() - started)
            status = answer.status_code
        rest = times[1:] or times
        slowest = max(times)
        within &= slowest <= LIMIT_S and status == 200
        print(f"  {path:<40} HTTP {status}  first {times[0] * 1000:7.0f} ms  median "
              f"{statistics.median(rest) * 1000:7.0f} ms  slowest {slowest * 1000:7.0f} ms"
              f"{'' if slowest <= LIMIT_S else '  OVER ' + str(LIMIT_S) + ' s'}")
    return within


PARSE_LIMIT_S = 10.0
OUT = Path(__file__).resolve().parent / "out"


def topics_file(count: int) -> Path:
    """A topics file of `count` topics with the default settings."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"topics-{count}.yaml"
    path.write_text("topics:\n" + "".join(f"  - name: fleet_ui_{i:03d}\n" for i in range(count)))
    return path


def parse(count: int) -> bool:
    """Each DAG file parsed as the dag-processor does with a `count`-topic file; within
    PARSE_LIMIT_S together?"""
    import subprocess
    import sys
    import tempfile

    path = topics_file(count)
    dags = Path(__file__).resolve().parents[1] / "dags"
    child = """
import os, sys, time
from airflow.dag_processing.dagbag import BundleDagBag
from airflow.dag_processing.processor import _serialize_dags
import structlog
path = sys.argv[1]
started = time.perf_counter()
bag = BundleDagBag(dag_folder=path, bundle_path=os.path.dirname(path), bundle_name="dags-folder",
                   load_op_links=False)
parsed = time.perf_counter()
serialized, errors = _serialize_dags(bag, structlog.get_logger())
done = time.perf_counter()
print(len(serialized), len(bag.import_errors) + len(errors), parsed - started, done - parsed)
"""
    print(f"dag-processor parse of a {count}-topic file (each DAG file in a fresh process that "
          "has imported Airflow, as the dag-processor's parsing child has):")
    total = 0.0
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DELTAFERRY_TOPICS": str(path), "AIRFLOW_HOME": home,
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
               "DELTAFERRY_WAREHOUSE": str(OUT / "parse-warehouse")}
        for dag_file in sorted(dags.glob("*.py")):
            done = subprocess.run([sys.executable, "-c", child, str(dag_file)], env=env,
                                  capture_output=True, text=True, check=True)
            n_dags, n_errors, parsed, serialized = done.stdout.split()[-4:]
            seconds = float(parsed) + float(serialized)
            total += seconds
            print(f"  {dag_file.name:<30} {int(n_dags):4d} DAGs, {n_errors} import errors: "
                  f"import and build {float(parsed):5.2f} s, serialize {float(serialized):5.2f} s"
                  f", {seconds:5.2f} s")
    print(f"  all DAG files {total:.2f} s (the dag-processor parses them in parallel; "
          f"limit {PARSE_LIMIT_S:g} s)")
    return total <= PARSE_LIMIT_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="requests per page after the first")
    parser.add_argument("--parse", type=int, metavar="N",
                        help="instead: the dag-processor's parse of an N-topic file "
                        "(issue 32: 500)")
    args = parser.parse_args()
    if args.parse:
        print(f"within {PARSE_LIMIT_S:g} s: {'yes' if parse(args.parse) else 'NO'}")
        return

    from deltaferry.dev.airflow import services

    running = services.status()
    if running is not None:
        import httpx

        client = running.client()
        headers = client._headers()
        topics = load_topics().names()
        print(f"deltaferry pages of the running Airflow at {running.url} ({', '.join(topics)}):")
        ok = measure(lambda p: httpx.get(f"{running.url}/deltaferry{p}", headers=headers,
                                         timeout=60), pages(topics), args.repeat)
    else:
        from fastapi.testclient import TestClient

        from deltaferry.ui.web import create_app

        env = services.local_env()
        env.setdefault("DELTAFERRY_WAREHOUSE", str(services.LOCAL_WAREHOUSE))
        os.environ.update(env)
        topics = load_topics().names()
        app = TestClient(create_app(lambda: "bench", env=lambda: env))
        print(f"no local Airflow runs: the pages' app in this process, warehouse "
              f"{env['DELTAFERRY_WAREHOUSE']} ({', '.join(topics)}):")
        ok = measure(app.get, pages(topics), args.repeat)
    print(f"every page within {LIMIT_S:g} s: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
