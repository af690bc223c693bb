"""Pipeline settings refused at start, with what to fix."""

from __future__ import annotations

import pytest

from infra.errors import ConfigError
from infra.settings import load_settings
from pipeline.settings import PipelineSettings


def test_a_dedup_horizon_shorter_than_the_watermark_is_refused() -> None:
    # Detection drops copies within the watermark; bronze must call the same rows copies.
    with pytest.raises(ConfigError, match="dedup_horizon '10 minutes' must be at least"):
        load_settings(PipelineSettings, watermark="10 minutes", dedup_horizon="10 minutes")
    settings = load_settings(PipelineSettings, watermark="10 minutes", dedup_horizon="11 minutes")
    assert settings.dedup_horizon == "11 minutes"


def test_live_batches_are_bounded_by_default_above_what_5000_events_per_s_need() -> None:
    # 5,000 events/s with 25,000 devices: batches of 12-20 s on two cores (docs/PERFORMANCE.md).
    assert 5000 * 20 <= PipelineSettings().max_offsets_per_trigger < 1_000_000


def test_a_query_triggered_less_often_than_the_ingest_takes_more_a_batch() -> None:
    # The silence query runs every minute: 300,000 messages wait at 5,000 events/s, and a bound
    # of 250,000 a batch left it further behind at every trigger.
    settings = PipelineSettings()
    assert settings.offsets_per_trigger(settings.ingest_trigger_interval) == 250_000
    assert settings.offsets_per_trigger(settings.trigger_interval) == 250_000  # detection: 1 s
    minute = settings.offsets_per_trigger(settings.silence_trigger_interval)
    assert minute == 250_000 * 12  # twelve 5-second ingest intervals
    assert minute / 60 == settings.max_offsets_per_trigger / 5  # the same events/s as the ingest
    assert minute > 5000 * 60  # a minute at 5,000 events/s
    slower_ingest = PipelineSettings(ingest_trigger_interval="20 seconds")
    assert slower_ingest.offsets_per_trigger("1 minute") == 750_000
    assert PipelineSettings(max_offsets_per_trigger=0).offsets_per_trigger("1 minute") == 0
    back_to_back = PipelineSettings(ingest_trigger_interval="0 seconds")
    assert back_to_back.offsets_per_trigger("1 minute") == 250_000 * 60


def test_the_falling_behind_warning_knows_each_query_s_bound() -> None:
    from pipeline.job import batch_bounds

    assert batch_bounds(PipelineSettings()) == {
        "ingest": 250_000, "detection": 250_000, "silence": 3_000_000
    }  # fmt: skip
    assert batch_bounds(PipelineSettings(source="files")) == {}  # files, not messages
    # A bound follows its query's trigger: detection every minute takes a minute's messages.
    slow_detection = PipelineSettings(trigger_interval="1 minute")
    assert batch_bounds(slow_detection)["detection"] == 3_000_000


def test_each_query_runs_on_its_own_setting_s_interval() -> None:
    from pipeline.job import trigger_interval

    settings = PipelineSettings(
        trigger_interval="2 seconds", ingest_trigger_interval="3 seconds",
        silence_trigger_interval="4 minutes", firmware_trigger_interval="5 seconds",
        fast_path_log_interval="6 seconds",
    )  # fmt: skip
    intervals = {
        query: trigger_interval(settings, query)
        for query in ("detection", "ingest", "silence", "firmware_ingest", "firmware", "fast_log")
    }
    assert intervals == {
        "detection": "2 seconds", "ingest": "3 seconds", "silence": "4 minutes",
        "firmware_ingest": "5 seconds", "firmware": "5 seconds", "fast_log": "6 seconds",
    }  # fmt: skip


def test_a_webhook_needs_the_alerts_topic_and_an_http_url() -> None:
    with pytest.raises(ConfigError, match="IOT_PIPELINE_WEBHOOK_URL relays the alerts topic"):
        load_settings(PipelineSettings, webhook_url="https://pager.example/hook", alerts_topic="")
    with pytest.raises(ConfigError, match="http:// or https://") as refused:
        load_settings(PipelineSettings, webhook_url="htps://pager.example/hook/S3CRET")
    assert "S3CRET" not in str(refused.value)  # the path can hold a token
    with pytest.raises(ConfigError, match="no spaces"):
        load_settings(PipelineSettings, webhook_url="https://pager.example/hook/S3CRET x")
    with pytest.raises(ConfigError, match="dead letters would be relayed again"):
        load_settings(PipelineSettings, webhook_url="https://pager.example/hook",
                      webhook_dead_letter_topic="iot.alerts")  # fmt: skip
    with pytest.raises(ConfigError, match="is an input topic"):
        load_settings(PipelineSettings, alerts_topic="iot.telemetry")
    settings = load_settings(PipelineSettings, webhook_url="https://pager.example/hook?k=1")
    assert settings.alerts_topic == "iot.alerts"
    assert "pager.example" not in repr(settings)  # a URL can hold a token
