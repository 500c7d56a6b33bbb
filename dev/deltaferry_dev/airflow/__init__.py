"""The local Airflow of the development harness: its home (`home`), its api-server, scheduler,
dag-processor and triggerer (`services`) and a client of its REST API (`rest`)."""
