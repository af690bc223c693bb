"""Column names the pipeline adds on top of the contract, in one place."""

from __future__ import annotations

from infra import contract as c

# Raw records, whatever the source: the Kafka source's shape.
KEY = "key"
VALUE = "value"
TOPIC = "topic"
PARTITION = "partition"
OFFSET = "offset"
TIMESTAMP = "timestamp"

# Where a bronze row came from (telemetry and quarantine columns), in copy order.
BRONZE_COORDS = ("kafka_topic", "kafka_partition", "kafka_offset")

# Parsing
REASON = "reason"
DETAIL = "detail"

# Window features
WINDOW_START = "window_start"
WINDOW_END = "window_end"
EVENT_COUNT = "event_count"
DUPLICATE_COUNT = "duplicate_count"
# feature_changes: the detection batch that wrote the row (the latest row of a window is its state)
BATCH_ID = "batch_id"
# Per alert type raised from a quarantined reading (c.QUARANTINE_ALERT_TYPES): the window column
# counting such readings.
FLAG_COUNTS = {kind: f"{kind}_count" for kind in c.QUARANTINE_ALERT_TYPES.values()}
