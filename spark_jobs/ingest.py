"""spark-submit entry point: the ingest step of one topic (see deltaferry.jobs)."""

import sys

from deltaferry.jobs import main

if __name__ == "__main__":
    sys.exit(main("ingest"))
