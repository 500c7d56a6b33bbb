"""The Spark side: session, schema inference, ingest (streaming upsert) and maintenance."""
