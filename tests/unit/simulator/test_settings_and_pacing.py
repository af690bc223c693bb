"""Settings from the environment, clear errors, secret redaction, token bucket and clock start."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from infra.errors import ConfigError
from infra.settings import load_settings
from simulator.producer import (
    TokenBucket,
    default_start,
    producer_config,
    runs_ahead_of_wall_clock,
)
from simulator.settings import SimulatorSettings, redact


def test_environment_lists_dicts_and_kafka_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_SIM_SCENARIOS", "tampering, flood")
    monkeypatch.setenv("IOT_SIM_SCENARIO_RATES", '{"flood": 12}')
    monkeypatch.setenv("IOT_SIM_KAFKA_OPTIONS", '{"security.protocol": "SASL_SSL", '
                       '"sasl.password": "s3cret", "linger.ms": "5"}')  # fmt: skip
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9093")
    settings = load_settings(SimulatorSettings)
    assert settings.scenarios == ["tampering", "flood"]
    assert settings.rate_of("flood") == 12 and settings.rate_of("tampering") == 6.0
    assert settings.rate_of("spike") == 0.0
    conf = producer_config(settings)
    assert conf["bootstrap.servers"] == "broker:9093"
    assert conf["security.protocol"] == "SASL_SSL" and conf["linger.ms"] == "5"
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["logger"].name == "librdkafka"  # its lines go to the log file, not the terminal
    assert redact(settings.kafka_options)["sasl.password"] == "***"
    assert "s3cret" not in repr(redact(settings.kafka_options))


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_SIM_SCENARIOS", "tampering,teleport")
    with pytest.raises(ConfigError, match=r"IOT_SIM_SCENARIOS.*teleport"):
        load_settings(SimulatorSettings)
    monkeypatch.delenv("IOT_SIM_SCENARIOS")
    monkeypatch.setenv("IOT_SIM_DEVICES", "0")
    with pytest.raises(ConfigError, match="IOT_SIM_DEVICES"):
        load_settings(SimulatorSettings)


@pytest.mark.parametrize("value", ['{"sasl.password": s3cret', ""])
def test_option_maps_that_are_not_json_name_the_variable_without_the_value(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("IOT_SIM_KAFKA_OPTIONS", value)
    with pytest.raises(ConfigError, match="IOT_SIM_KAFKA_OPTIONS: not valid JSON") as raised:
        load_settings(SimulatorSettings)
    assert "s3cret" not in str(raised.value)


def test_every_setting_is_described() -> None:
    assert all(f.description for f in SimulatorSettings.model_fields.values())


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_token_bucket_holds_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)
    for _ in range(600):
        bucket.acquire(100)
        clock.now += 0.001  # the work of sending
    assert 60_000 / clock.now == pytest.approx(1000.0, rel=0.01)
    clock.now += 0.3  # the process was paused: the saved-up tokens make up for it
    for _ in range(600):
        bucket.acquire(100)
    assert 120_000 / clock.now == pytest.approx(1000.0, rel=0.01)


def test_token_bucket_holds_the_rate_when_sleeps_overrun() -> None:
    # On a busy machine a sleep ends late; the time overslept must count as sending time, or
    # the rate falls short by the overrun (a 1 ms overrun per 20 ms step lost 5 %).
    clock = FakeClock()
    bucket = TokenBucket(5000.0, clock=clock, sleep=lambda s: clock.sleep(s + 0.001))
    for _ in range(3000):
        bucket.acquire(100)
    assert 300_000 / clock.now == pytest.approx(5000.0, rel=0.01)


def test_runs_with_a_known_end_reach_the_wall_clock_when_they_end() -> None:
    now = datetime(2026, 3, 1, tzinfo=timezone.utc)
    assert default_start(SimulatorSettings(), 50.0, now) == now
    # 60 s at 3600x simulate 60 h: start 60 h minus the minute the run takes before now.
    fast = SimulatorSettings(accelerate=3600, duration=60)
    assert default_start(fast, 50.0, now) == now - timedelta(hours=60) + timedelta(seconds=60)
    # 180,000 events at 1,000/s take 180 s and simulate 3,600 s of a fleet sending 50/s.
    counted = SimulatorSettings(rate=1000, count=180_000)
    assert default_start(counted, 50.0, now) == now - timedelta(seconds=3600 - 180)
    # Paced at the fleet's own rate for 30 minutes: a real-time clock, so it starts now (it
    # started 30 minutes in the past, and a device whose clock ran 20 minutes ahead then passed
    # the pipeline's clock check and moved the watermark).
    real_time = SimulatorSettings(rate=50, duration=1800)
    assert default_start(real_time, 50.0, now) == now
    slower = SimulatorSettings(rate=25, duration=1800)  # the clock runs at half speed
    assert default_start(slower, 50.0, now) == now
    as_fast_as_possible = SimulatorSettings(accelerate=0, count=180_000)
    assert default_start(as_fast_as_possible, 50.0, now) == now - timedelta(seconds=3600)
    fixed = SimulatorSettings(start_time=datetime(2026, 1, 1))
    assert default_start(fixed, 50.0, now) == datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("settings", "ahead"),
    [
        # Full speed for a wall-clock duration: how much it simulates is not known in advance.
        (SimulatorSettings(accelerate=0, duration=30), True),
        (SimulatorSettings(accelerate=10), True),
        (SimulatorSettings(rate=1000), True),
        (SimulatorSettings(accelerate=0, count=180_000), False),
        (SimulatorSettings(accelerate=10, duration=30), False),
        (SimulatorSettings(rate=1000, duration=30), False),
        (SimulatorSettings(accelerate=0, duration=30, start_time=datetime(2026, 1, 1)), False),
        (SimulatorSettings(), False),
        (SimulatorSettings(rate=25), False),
        (SimulatorSettings(rate=25, accelerate=10), False),  # the rate sets the pace
        (SimulatorSettings(accelerate=0.5), False),
    ],
)
def test_the_runs_whose_clock_passes_the_wall_clock_are_told_apart(
    settings: SimulatorSettings, ahead: bool
) -> None:
    assert runs_ahead_of_wall_clock(settings, natural_rate=50.0) is ahead
