"""The Spark side: session, ingest (streaming upsert), replay and maintenance; the formats'
schema inference and decoders are in deltaferry.formats."""
