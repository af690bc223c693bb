"""The alerts topic's message: every contract column of the alert row, read back unchanged."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from infra import contract as c
from pipeline.alerts import as_written, records
from pipeline.publish import alert_message, read_alert_message
from tests.unit.pipeline.test_alerts import NOW, alerts


def test_a_message_holds_every_column_of_the_row_and_reads_back_equal() -> None:
    row = records(as_written(alerts(("d1", 0.75, "40 events")), 12, NOW))[0]
    # As the table gives a row back (toPandas): reasons a numpy array, the score a numpy float.
    row["reasons"], row["score"] = np.array(["40 events"]), np.float64(0.75)
    value = json.loads(alert_message(row))
    assert list(value) == [*c.column_names(c.ALERTS_COLUMNS), "path"]
    assert value["path"] == "windowed"
    assert value["window_start"] == "2026-11-25T08:00:00.000000Z"
    assert value["detected_at"] == "2026-11-25T08:04:30.123456Z"
    assert value["model_name"] is None and value["status"] == "raised"
    back = read_alert_message(alert_message(row))
    assert back["detected_at"] == datetime(2026, 11, 25, 8, 4, 30, 123456, tzinfo=timezone.utc)
    assert back["reasons"] == ["40 events"] and back["score"] == 0.75 and back["batch_id"] == 12


def test_missing_values_are_null_not_a_value() -> None:
    row = records(as_written(alerts(("d1", 0.5, "x")), 1, NOW))[0]
    row["score"], row["first_event_time"] = float("nan"), pd.NaT
    value = json.loads(alert_message(row))
    assert value["score"] is None and value["first_event_time"] is None


def test_alerts_the_broker_does_not_acknowledge_fail_the_batch_with_the_topic_named() -> None:
    import pytest

    from infra.ports import free_port
    from pipeline.publish import AlertPublisher, AlertPublishError

    nobody = f"127.0.0.1:{free_port()}"  # no broker: nothing is ever acknowledged
    publish = AlertPublisher({"bootstrap.servers": nobody, "log_level": 0}, "alerts", timeout_s=11)
    rows = as_written(alerts(("d1", 0.5, "x"), ("d2", 0.5, "x")), 1, NOW)
    with pytest.raises(AlertPublishError, match="2 of 2 alerts not published to topic 'alerts'"):
        publish(rows)
