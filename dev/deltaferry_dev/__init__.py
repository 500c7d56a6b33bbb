"""deltaferry's development harness, a project of its own beside the library (`dev/`, installed
editable by `make setup`; the wheel of deltaferry does not carry it): the local stack (`stack`: a
Kafka broker, an S3 server and a Schema Registry on 127.0.0.1), the local Airflow (`airflow`:
its home, its four services, a REST client), `make demo` (`demo`) and the fleet bench (`fleet`).

The library never imports from here; the harness adds `deltaferry stack` and `deltaferry
airflow` to the command line through the `deltaferry.commands` entry points (`cli`).
"""

from pathlib import Path

#: The source checkout the harness lives in (`dev/deltaferry_dev/` under it): its `dags/`,
#: `plugins/`, and the `.stack`, `.airflow` and `warehouse` folders the harness makes there.
REPO_ROOT = Path(__file__).resolve().parents[2]
