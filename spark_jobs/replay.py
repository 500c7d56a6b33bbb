"""spark-submit entry point: a replay of one topic's quarantine, the ingest task of a DAG run
with the ``replay`` param (see deltaferry.jobs)."""

import sys

from deltaferry.jobs import main

if __name__ == "__main__":
    sys.exit(main("replay"))
