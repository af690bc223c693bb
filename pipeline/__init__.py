"""The Spark Structured Streaming job: ingest, quarantine, dedup, features, detection."""
