"""How long each deltaferry page of the Airflow UI takes (issue 17's budget: under 2 s each on
the demo data, on a 2-core machine).

With a running local Airflow (`make demo` or `make airflow`), the pages are fetched from its
api-server over HTTP as the UI loads them, logged in as admin (authentication, Airflow's
metadata database, the plugin, the reads). Without one, the pages' app is run in this process
on the demo's warehouse and the local stack (the same reads and rendering, no Airflow). Prints
each page's first (cold) time and the median and slowest of the next requests. Not a test: it
prints figures.

    make bench-ui                 # or: .venv/bin/python bench/bench_ui.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="requests per page after the first")
    args = parser.parse_args()

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
