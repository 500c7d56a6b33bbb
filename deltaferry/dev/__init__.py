"""The development harness, apart from the library: the local stack (`stack`: a Kafka broker,
an S3 server and a Schema Registry on 127.0.0.1), the local Airflow (`airflow`: its home, its
four services, a REST client) and `make demo` (`demo`).

The library (every other module of deltaferry) never imports from here, so an installed
deltaferry on a real cluster carries none of it into its jobs; `deltaferry stack` and
`deltaferry airflow` on the command line are the only doors in.
"""

from pathlib import Path

#: The source checkout the harness runs from (the library itself assumes none).
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
