"""Telemetry simulator: Faker fleet, scenarios with ground truth, Kafka producer, replay."""
