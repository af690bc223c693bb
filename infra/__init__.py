"""The local stack: Kafka broker, Spark jars and session, MLflow store, lake paths and contracts.

This is the ground floor: every component may import it, it imports no component.
"""
