"""Pipeline settings (prefix ``IOT_PIPELINE_``), validated at start."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from infra.kafka_client import java_client_options
from infra.settings import CommonSettings
from pipeline.profiles import ProfileSpec

if TYPE_CHECKING:
    from pipeline.silence import SilenceSpec

_DURATION = re.compile(r"^\d+ (second|minute|hour)s?$")


class PipelineSettings(CommonSettings):
    """How the streaming job reads, windows, scores and writes."""

    model_config = SettingsConfigDict(env_prefix="IOT_PIPELINE_", extra="ignore")

    source: Literal["kafka", "files"] = Field(
        default="kafka", description="Read the Kafka topic or a landing folder of JSON-lines files"
    )
    landing_dir: str = Field(
        default=".iotfraud/landing", description="Folder of JSON-lines files (source=files)"
    )
    starting_offsets: str = Field(
        default="earliest", description="Kafka startingOffsets for a new checkpoint"
    )
    max_offsets_per_trigger: int = Field(
        default=250_000,
        ge=0,
        description="Kafka maxOffsetsPerTrigger: most messages one micro-batch takes, so a "
        "backlog (a restart, an outage) is worked off in several batches instead of one during "
        "which no alert is written; keep it above the event rate times a batch's duration, or "
        "the pipeline falls behind (5,000 events/s and 20-second batches take 100,000); a "
        "query triggered less often than the ingest (the silence query) takes it once per "
        "ingest trigger interval in its own; 0 means no limit",
    )
    max_files_per_trigger: int = Field(
        default=100, ge=1, description="maxFilesPerTrigger for the files source"
    )
    kafka_options: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description='Extra Kafka source options as JSON, e.g. {"kafka.security.protocol": '
        '"SASL_SSL"}; keys must start with "kafka."; they win over IOT_KAFKA_*',
    )
    checkpoint_root: str = Field(
        default=".iotfraud/checkpoints", description="One checkpoint folder per query under it"
    )
    trigger: Literal["processing", "available_now"] = Field(
        default="processing", description="processing: live micro-batches; available_now: catch up"
    )
    trigger_interval: str = Field(default="1 second", description="processingTime interval")
    ingest_trigger_interval: str = Field(
        default="5 seconds",
        description="processingTime interval of the ingest (telemetry, quarantine). Detection "
        "reads Kafka itself and no alert waits for the ingest; between its batches the driver "
        "is detection's, so a shorter one makes alerts later on a small machine",
    )
    firmware_trigger_interval: str = Field(
        default="30 seconds",
        description="processingTime interval of the firmware check; its alerts wait for the "
        "watermark anyway, so a slower trigger leaves the cores to ingest and detection",
    )
    window: str = Field(default="10 minutes", description="Sliding window length")
    slide: str = Field(
        default="5 minutes",
        description="Sliding window step: each event updates window/slide windows (2 by default)",
    )
    watermark: str = Field(
        default="5 minutes", description="How late an event may be and still update its windows"
    )
    max_clock_ahead: str = Field(
        default="1 minute",
        description="How far an event_time may be ahead of its message's Kafka timestamp; later "
        "ones are quarantined (clock_ahead, which raises a clock_ahead alert) so a fast device "
        "clock cannot move the watermark",
    )
    dedup_horizon: str = Field(
        default="10 minutes",
        description="How long after an event reached Kafka a copy of it (same event_id and "
        "event_time) is still recognised as one; the ids are held in memory (24 bytes each: 72 MB "
        "at 5,000 events/s for 10 minutes)",
    )
    app_id: str = Field(
        default="iotfraud", description="Delta txnAppId prefix for idempotent appends"
    )
    firmware_grace: str = Field(
        default="24 hours",
        description="How long an authorized firmware update covers a device's reports of that "
        "firmware (update the registry's expected firmware within this time)",
    )
    model_name: str = Field(
        default="iot-fraud", validation_alias="IOT_MODEL_NAME", description="Registered model name"
    )
    model_alias: str = Field(
        default="champion", description="Registry alias the pipeline scores with"
    )
    status_interval_s: float = Field(default=5.0, gt=0, description="Seconds between status lines")
    profile_span: str = Field(
        default="2 hours",
        description="How far back each device's own normal reaches (its closed windows)",
    )
    profile_min_windows: int = Field(
        default=3,
        ge=1,
        description="Cold start: closed windows of a device's own history before the model "
        "scores it (rules run from its first event)",
    )
    maintenance_interval: str = Field(
        default="1 hour",
        description="How often the running pipeline compacts its tables, trims the feature "
        "changelog and VACUUMs (iotfraud maintain does it on demand); 0 seconds switches it off",
    )
    vacuum_retention: str = Field(
        default="168 hours",
        description="VACUUM deletes replaced files older than this: readers and time travel "
        "within it keep working (Delta's default, 7 days)",
    )
    delta_checkpoint_interval: int = Field(
        default=100,
        ge=1,
        description="Commits between checkpoints of a table's Delta log. The commit that "
        "reaches one writes it, inside a micro-batch (seconds on a busy machine); readers "
        "replay the commits since the last (Delta's default: 10)",
    )
    alerts_topic: str = Field(
        default="iot.alerts",
        description="Kafka topic every alert change is published to (JSON, keyed by device_id; "
        "README: alerts topic), created at start if absent; empty: none. Kafka source only",
    )
    fast_path: bool = Field(
        default=True,
        description="Run the per-event checks (rogue_device, firmware_mismatch, "
        "impossible_reading, clock_ahead) in a Real-time Mode query that publishes to the alerts "
        "topic within milliseconds (README: fast path); live runs with an alerts topic only",
    )
    fast_path_checkpoint_interval: str = Field(
        default="5 minutes",
        description="How often the fast path commits its Kafka offsets (a restart publishes again "
        "what it read since); Real-time Mode's batch duration",
    )
    fast_path_log_interval: str = Field(
        default="1 minute",
        description="processingTime interval of the query that records fast-path alerts in the "
        "fast_alerts table (what the dashboard compares with the windowed path; the alerts "
        "themselves are on the topic already, and fewer batches leave the cores to detection)",
    )
    silence: bool = Field(
        default=True,
        description="Run the silence query: device_silent when a registered device stops "
        "reporting, late_burst when its readings arrive far behind the stream (README: silent "
        "devices)",
    )
    silence_trigger_interval: str = Field(
        default="1 minute",
        description="processingTime interval of the silence query: how often it reads the "
        "topic (a silence takes minutes to be one; fewer batches leave the cores to the others)",
    )
    silence_k: float = Field(
        default=5.0,
        gt=1,
        description="A device is silent once this many of its expected intervals (learned from "
        "its own readings) pass with no reading",
    )
    silence_prior_interval: str = Field(
        default="60 seconds",
        description="Expected reporting interval of a device whose own is not learned yet",
    )
    silence_type_intervals: dict[str, float] = Field(
        default_factory=dict,
        description="Expected reporting interval per device type in seconds, as JSON, where "
        'known better than IOT_PIPELINE_SILENCE_PRIOR_INTERVAL, e.g. {"gps_tracker": 15}',
    )
    silence_watermark: str = Field(
        default="10 seconds",
        description="How far behind the newest event time read from its Kafka partition a "
        "reading may arrive and still count as on time for the silence query; later ones are "
        "late (late_burst). Silences are raised this much after they are due",
    )
    late_burst_min: int = Field(
        default=10, ge=1, description="Late readings in a row from one device that raise late_burst"
    )
    webhook_url: SecretStr = Field(
        default=SecretStr(""),
        description="POST every message of the alerts topic to this http(s) URL (README: "
        "webhook); empty: off. Logs show its host only",
    )
    webhook_attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Tries per alert before it goes to the dead-letter topic",
    )
    webhook_first_retry_s: float = Field(
        default=1.0, gt=0, le=60, description="Wait before the second try; it doubles, up to 60 s"
    )
    webhook_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="Seconds a POST may wait for each answer"
    )
    webhook_dead_letter_topic: str = Field(
        default="iot.alerts.dead-letter",
        description="Topic of the alerts the webhook could not deliver: the alert, the tries, "
        "the last error",
    )
    rule_thresholds: str = Field(
        default="",
        description='Rule thresholds per device type as JSON, e.g. {"*": {"flood_factor": 4}, '
        '"gps_tracker": {"max_speed_kmh": 300}}; "*" changes the default (README: rules)',
    )

    @field_validator("kafka_options")
    @classmethod
    def _kafka_prefixed(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.startswith("kafka.")]
        if bad:
            raise ValueError(f"Kafka source options must start with 'kafka.': {bad}")
        return value

    @field_validator(
        "trigger_interval",
        "ingest_trigger_interval",
        "firmware_trigger_interval",
        "fast_path_checkpoint_interval",
        "fast_path_log_interval",
        "window",
        "slide",
        "watermark",
        "dedup_horizon",
        "firmware_grace",
        "max_clock_ahead",
        "profile_span",
        "maintenance_interval",
        "vacuum_retention",
        "silence_prior_interval",
        "silence_watermark",
        "silence_trigger_interval",
    )
    @classmethod
    def _duration(cls, value: str) -> str:
        if not _DURATION.match(value.strip()):
            raise ValueError(
                f"expected a duration like '10 minutes' or '30 seconds', got {value!r}"
            )
        return value.strip()

    @field_validator("silence_type_intervals")
    @classmethod
    def _positive_intervals(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"reporting intervals must be more than 0 seconds: {bad}")
        return value

    @field_validator("silence_prior_interval")
    @classmethod
    def _some_interval(cls, value: str) -> str:
        if _DURATION.match(value.strip()) and seconds(value) <= 0:
            raise ValueError(f"the prior interval must be more than 0 seconds, got {value!r}")
        return value

    @field_validator("rule_thresholds")
    @classmethod
    def _rule_thresholds(cls, value: str) -> str:
        from pipeline.rules import RuleThresholds

        RuleThresholds.parse(value)  # a ValueError names what is wrong
        return value

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        if url:
            try:
                parts = urlsplit(url)
                parts.port  # noqa: B018 (raises on a port that is not a number)
            except ValueError:
                raise ValueError("not a URL") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("expected an http:// or https:// URL with a host")
            if any(ch.isspace() or ord(ch) < 32 for ch in url):
                raise ValueError("a URL holds no spaces or control characters (encode them)")
        return value

    @model_validator(mode="after")
    def _topics_apart(self) -> PipelineSettings:
        if self.alerts_topic and self.alerts_topic in (self.topic, self.firmware_topic):
            raise ValueError(
                f"IOT_PIPELINE_ALERTS_TOPIC {self.alerts_topic!r} is an input topic: give alerts "
                "a topic of their own"
            )
        if self.webhook_url.get_secret_value():
            if not (self.alerts_topic and self.webhook_dead_letter_topic):
                raise ValueError(
                    "IOT_PIPELINE_WEBHOOK_URL relays the alerts topic: set "
                    "IOT_PIPELINE_ALERTS_TOPIC and IOT_PIPELINE_WEBHOOK_DEAD_LETTER_TOPIC, or "
                    "leave the URL empty"
                )
            if self.webhook_dead_letter_topic in (self.alerts_topic, self.topic):
                raise ValueError(
                    "IOT_PIPELINE_WEBHOOK_DEAD_LETTER_TOPIC must differ from the alerts and "
                    "telemetry topics (dead letters would be relayed again)"
                )
        return self

    @model_validator(mode="after")
    def _with_security_options(self) -> PipelineSettings:
        # Merged here, so every Kafka reader of the job gets them (and the start-up topic check
        # knows the connection is secured).
        secured = {f"kafka.{k}": v for k, v in java_client_options(self).items()}
        self.kafka_options = {**secured, **self.kafka_options}
        return self

    @model_validator(mode="after")
    def _window_is_multiple_of_slide(self) -> PipelineSettings:
        if seconds(self.window) % seconds(self.slide) != 0:
            raise ValueError(f"window {self.window!r} must be a multiple of slide {self.slide!r}")
        if seconds(self.dedup_horizon) < seconds(self.watermark) + seconds(self.max_clock_ahead):
            raise ValueError(
                f"dedup_horizon {self.dedup_horizon!r} must be at least the watermark "
                f"{self.watermark!r} plus max_clock_ahead {self.max_clock_ahead!r}: detection "
                "drops copies within the watermark, and bronze must call the same rows copies"
            )
        if seconds(self.max_clock_ahead) > seconds(self.watermark):
            raise ValueError(
                f"max_clock_ahead {self.max_clock_ahead!r} must not exceed the watermark "
                f"{self.watermark!r}: events that far ahead would make on-time events late"
            )
        return self

    def profile_spec(self) -> ProfileSpec:
        """How each device's own normal is learned (the stream and training share it)."""
        return ProfileSpec(
            window_s=seconds(self.window),
            slide_s=seconds(self.slide),
            span_s=seconds(self.profile_span),
            min_windows=self.profile_min_windows,
        )

    def offsets_per_trigger(self, interval: str) -> int:
        """Kafka maxOffsetsPerTrigger of a query triggered every ``interval`` (0: no bound).

        The setting bounds the batches of the queries that run every few seconds (ingest,
        detection). A query triggered less often (the silence query, every minute) finds its
        whole interval's messages waiting at each trigger: it takes the setting once per ingest
        interval its own holds, so that it keeps up with every rate the ingest keeps up with.
        With the setting alone it fell behind for good at 5,000 events/s (300,000 messages a
        minute against 250,000 a batch; docs/PERFORMANCE.md, session 67).
        """
        bound = self.max_offsets_per_trigger
        # "0 seconds": an ingest that runs batch after batch; counted as one a second.
        ratio = seconds(interval) / max(1, seconds(self.ingest_trigger_interval))
        return max(bound, math.ceil(bound * ratio))

    def silence_spec(self) -> SilenceSpec:
        """When a device is overdue, and what a late burst is (``pipeline.silence``)."""
        from pipeline.silence import SilenceSpec

        return SilenceSpec(
            k=self.silence_k,
            prior_s=float(seconds(self.silence_prior_interval)),
            type_prior_s=dict(self.silence_type_intervals),
            late_burst_min=self.late_burst_min,
            lateness_ms=1000 * seconds(self.silence_watermark),
        )


def seconds(duration: str) -> int:
    """``'10 minutes'`` -> 600."""
    amount, unit = duration.split()
    return int(amount) * {"second": 1, "minute": 60, "hour": 3600}[unit.rstrip("s")]
