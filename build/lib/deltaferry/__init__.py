"""deltaferry: land Kafka topics in Delta Lake tables, one DAG per topic."""

__version__ = "0.1.0"
