"""The local broker's cluster id: the storage tool must never read it as an option."""

from __future__ import annotations

import base64
from pathlib import Path

from infra.kafka import KafkaBroker, new_cluster_id


def test_new_cluster_ids_are_uuids_that_never_start_with_a_dash() -> None:
    # 1 random id in 64 starts with "-": 5,000 draws include one with near certainty.
    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert {len(base64.urlsafe_b64decode(i + "==")) for i in ids} == {16}


def test_a_saved_id_starting_with_a_dash_is_replaced_and_a_good_one_kept(tmp_path: Path) -> None:
    broker = KafkaBroker(home=tmp_path, cache_dir=tmp_path / "cache")
    (tmp_path / "cluster.id").write_text("-Hh7dFJ6RxqA1mBvA2b3cQ")
    replaced = broker._cluster_id()
    assert not replaced.startswith("-")
    assert broker._cluster_id() == replaced  # kept from then on
