"""What the Airflow UI plugin (``plugins/deltaferry_ui.py``) shows, gathered without Airflow or a
JVM: the topics overview (`topics`), a topic's schema history (`schema_history`), its quarantine
(`quarantine`) and its table's health (`health`), read through delta-rs and the storage layer;
`web` renders them as HTML pages of a FastAPI app whose authentication the plugin supplies."""
