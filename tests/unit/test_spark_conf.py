"""The Spark configuration a session gets from the settings (``infra.spark.spark_conf``)."""

from __future__ import annotations

import pytest

from infra.settings import SparkSettings
from infra.spark import spark_conf


@pytest.mark.parametrize(("cores", "partitions"), [(1, "1"), (2, "1"), (3, "1"), (8, "4")])
def test_unset_shuffle_partitions_are_half_the_cores_and_at_least_one(
    monkeypatch: pytest.MonkeyPatch, cores: int, partitions: str
) -> None:
    """The pipeline's queries share the cores among them: a stateful query's partitions are
    each a task and a state store per micro-batch (docs/PERFORMANCE.md, session 63)."""
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    conf = spark_conf(SparkSettings(master="local[*]", shuffle_partitions=0), [])
    assert conf["spark.sql.shuffle.partitions"] == partitions


def test_shuffle_partitions_set_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    conf = spark_conf(SparkSettings(master="local[*]", shuffle_partitions=3), [])
    assert conf["spark.sql.shuffle.partitions"] == "3"
