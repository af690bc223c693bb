"""The dashboard's pages in AppTest on fixture lakes: the numbers shown are the data's."""

from __future__ import annotations

import collections
import itertools
import json
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
import streamlit as st
from deltalake import write_deltalake
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from dashboard import auth, data, login
from infra import contract as c
from infra import lake
from tests.dashboard_fixtures import (
    FAST_ALERT_ID,
    MARKUP_REASON,
    ROGUE,
    SILENT_DEVICE,
    FixtureLake,
    add_fast_alerts,
    add_silences,
    build_lake,
    champion_store,
)

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PAGES = ("overview", "alerts", "map", "device", "health", "model")
TIMEOUT = 60


@pytest.fixture(scope="module")
def fixture_lake(tmp_path_factory: pytest.TempPathFactory) -> FixtureLake:
    return build_lake(str(tmp_path_factory.mktemp("lake")))


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A SQLite MLflow store with a champion; (tracking URI, champion version)."""
    return champion_store(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture(autouse=True)
def no_cached_reads() -> None:
    """The pages' reads are cached in the process, as in a server: each test starts without."""
    st.cache_data.clear()


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """The app's settings come from the environment, as under ``iotfraud dashboard``."""
    monkeypatch.setenv("IOT_STACK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.setenv("IOT_DASH_LOOKBACK_HOURS", "24")
    monkeypatch.delenv("IOT_DASH_AUTH_FILE", raising=False)
    yield monkeypatch


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def listed_alerts(at: AppTest) -> list[str]:
    return list(at.dataframe[0].value["alert_id"])


def click_alert(at: AppTest, alert_id: str, *, on_cell: bool = False) -> AppTest:
    """What the browser sends for a click on the alert's row: its box, or one of its cells."""
    row = listed_alerts(at).index(alert_id)
    selection: dict[str, Any] = {"rows": [], "columns": [], "cells": [[row, "severity"]]}
    if not on_cell:
        selection = {"rows": [row], "columns": [], "cells": []}
    at.session_state["alert_table"] = {"selection": selection}
    return at.run()


def address_alert(at: AppTest) -> str | None:
    """The alert id in the page's address (``?alert=``)."""
    value = at.query_params.get("alert")
    # Older Streamlit releases (1.56) give AppTest's query parameters as lists.
    return value[-1] if isinstance(value, list) else value


def highlighted_alerts(at: AppTest) -> list[str]:
    ids = listed_alerts(at)
    return [ids[row] for row in at.session_state["alert_table"]["selection"]["rows"]]


def data_as_of(at: AppTest) -> str:
    return next(c.value for c in at.caption if c.value.startswith("Data as of "))


def chart_data(at: AppTest, title: str) -> pd.DataFrame:
    """The data a Vega-Lite chart on the page draws."""
    for chart in at.get("vega_lite_chart"):
        if json.loads(chart.proto.spec).get("title") == title:
            return dataframe_util.convert_arrow_bytes_to_pandas_df(
                chart.proto.datasets[0].data.data
            )
    raise AssertionError(f"no chart titled {title!r}")


def append_alerts(root: str, *rows: dict[str, Any]) -> None:
    table = pa.Table.from_pylist(list(rows), schema=c.arrow_schema(c.ALERTS_COLUMNS))
    write_deltalake(lake.table_path(root, lake.ALERTS), table, mode="append")


def test_overview_numbers_equal_the_data(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("overview")
    shown = metrics(at)
    assert shown["Open alerts"] == str(fixture_lake.open_alerts) == "5"
    assert shown["Alerts"] == str(len(fixture_lake.alerts))
    assert shown["Devices reporting"] == str(fixture_lake.devices_reporting)
    assert shown["Quarantined"] == str(sum(fixture_lake.quarantine_by_reason.values()))
    assert shown["Late rows dropped"] == str(fixture_lake.late_rows)
    assert shown["Events/s"] == f"{fixture_lake.ingest_rate_latest:.1f}"
    # A lake without silence alerts (as one written before they existed): none silent.
    assert shown["Silent now"] == "0"
    assert len(at.get("vega_lite_chart")) == 2
    newest = at.dataframe[0].value
    assert len(newest) == 5 and "alert-005" not in set(newest["alert_id"])


def test_custom_dates_bound_the_range(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("overview")
    at.selectbox(key="time_range").select("Custom dates").run()
    # The data spans the hours before ``now``, which cross midnight early in the day.
    first = min(a["window_start"] for a in fixture_lake.alerts).date()
    today = fixture_lake.now.date()
    at.date_input(key="custom_dates").set_value((first, today)).run()
    assert metrics(at)["Alerts"] == str(len(fixture_lake.alerts))
    before = first - timedelta(days=1)
    at.date_input(key="custom_dates").set_value((before, before)).run()
    assert not at.exception
    assert metrics(at)["Alerts"] == "0"
    assert metrics(at)["Devices reporting"] == "0"
    assert at.info, "an empty range shows an empty state"


def test_alert_filters_change_the_rows_shown(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("alerts")
    assert len(at.dataframe[0].value) == len(fixture_lake.alerts)
    at.multiselect(key="f_type").select("model_anomaly").run()
    table = at.dataframe[0].value
    assert sorted(table["alert_id"]) == ["alert-002", "alert-006"]
    assert any("2 alerts, 2 open" in c.value for c in at.caption)
    at.multiselect(key="f_version").select("3").run()
    assert list(at.dataframe[0].value["alert_id"]) == ["alert-002"]
    at.multiselect(key="f_type").unselect("model_anomaly")
    at.multiselect(key="f_version").unselect("3")
    at.selectbox(key="f_status").select("Reviewed").run()
    assert list(at.dataframe[0].value["alert_id"]) == ["alert-005"]
    at.selectbox(key="f_status").select("All")
    at.multiselect(key="f_device").select(ROGUE).run()
    assert list(at.dataframe[0].value["alert_id"]) == ["alert-004"]


def test_withdrawn_alerts_are_hidden_until_asked_for(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    withdrawn = {**fixture.alerts[0], "alert_id": "alert-withdrawn", "status": c.ALERT_WITHDRAWN}
    append_alerts(fixture.root, withdrawn)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    at = open_page("alerts")
    shown = at.dataframe[0].value["alert_id"]
    assert len(shown) == len(fixture.alerts) and "alert-withdrawn" not in list(shown)
    at.selectbox(key="f_status").select("Withdrawn").run()
    assert list(at.dataframe[0].value["alert_id"]) == ["alert-withdrawn"]
    overview = open_page("overview")
    assert metrics(overview)["Alerts"] == str(len(fixture.alerts))


def test_alert_detail_shows_reasons_as_text_and_window_features(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("alerts")
    click_alert(at, "alert-001")
    assert metrics(at)["Type"] == "tampering"
    assert any(MARKUP_REASON in t.value for t in at.text)
    # Never through Markdown (which would render or sanitise the markup).
    assert not any("<b>" in m.value for m in at.markdown)
    features = {row["field"]: row["value"] for row in at.dataframe[2].value.to_dict("records")}
    assert features["power_w_mean"] == "80"
    assert features["device_id"] == "meter-001"

    next(b for b in at.button if b.label == "Open this device").click().run()
    assert not at.exception
    assert at.title[0].value == "Device"
    assert at.selectbox(key="device_id").value == "meter-001"
    assert at.selectbox(key="device_alert_id").value == "alert-001"


def test_feedback_from_the_form_lands_in_alert_feedback(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = str(tmp_path / "lake")
    fixture = build_lake(root)
    app_env.setenv("IOT_LAKE_ROOT", root)
    at = open_page("alerts")
    click_alert(at, "alert-003")
    at.radio[0].set_value("true_positive")
    at.text_area[0].input("confirmed: GPS spoofing, <script>x</script>")
    at.text_input[0].input("ana")
    next(b for b in at.button if b.label == "Save verdict").click().run()
    assert not at.exception
    assert any("True positive saved for alert-003" in t.value for t in at.text)

    saved = data.read_table(root, lake.ALERT_FEEDBACK).filter(pl.col("alert_id") == "alert-003")
    assert saved.select("verdict", "note", "analyst").rows() == [
        ("true_positive", "confirmed: GPS spoofing, <script>x</script>", "ana")
    ]
    table = at.dataframe[0].value
    assert table.loc[table["alert_id"] == "alert-003", "verdict"].tolist() == ["true_positive"]
    at.switch_page("views/overview.py").run()
    assert metrics(at)["Open alerts"] == str(fixture.open_alerts - 1)


def test_a_click_on_an_alert_row_shows_its_detail_and_puts_its_id_in_the_address(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("alerts")
    # Before any click: the newest alert, highlighted in the list.
    newest = listed_alerts(at)[0]
    assert highlighted_alerts(at) == [newest]
    assert at.dataframe[1].value.set_index("field")["value"]["alert_id"] == newest

    click_alert(at, "alert-004", on_cell=True)
    assert not at.exception
    assert metrics(at)["Type"] == "rogue_device"
    assert any("device not in registry" in t.value for t in at.text)
    assert address_alert(at) == "alert-004"
    assert highlighted_alerts(at) == ["alert-004"]

    # A click on the highlighted row's box would clear it: the alert stays shown.
    at.session_state["alert_table"] = {"selection": {"rows": [], "columns": [], "cells": []}}
    at.run()
    assert metrics(at)["Type"] == "rogue_device"
    assert highlighted_alerts(at) == ["alert-004"]


def test_the_highlighted_row_follows_its_alert_when_newer_alerts_arrive(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    at = click_alert(open_page("alerts"), "alert-003")
    assert highlighted_alerts(at) == ["alert-003"]

    newer = {**fixture.alerts[0], "alert_id": "alert-007", "alert_type": "flood",
             "window_start": fixture.now - timedelta(minutes=1)}  # fmt: skip
    append_alerts(fixture.root, newer)
    st.cache_data.clear()  # the refresh interval has passed
    at.run()
    assert listed_alerts(at)[0] == "alert-007"
    assert highlighted_alerts(at) == ["alert-003"]
    assert metrics(at)["Type"] == "impossible_travel"


def test_an_address_with_an_alert_id_opens_that_alert_whatever_the_filters(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    old = {**fixture.alerts[2], "alert_id": "alert-old", "reasons": ["speed 900 km/h"],
           "window_start": fixture.now - timedelta(days=3)}  # fmt: skip
    append_alerts(fixture.root, old)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    at = open_page("overview")
    at.switch_page("views/alerts.py")
    at.query_params["alert"] = "alert-old"
    at.run()
    assert not at.exception
    # Three days ago is outside the last 24 hours: not listed, but shown.
    assert "alert-old" not in listed_alerts(at) and highlighted_alerts(at) == []
    assert metrics(at)["Type"] == "impossible_travel"
    assert any("speed 900 km/h" in t.value for t in at.text)
    assert any("not in the list above" in c.value for c in at.caption)

    at.query_params["alert"] = "<b>no-such-alert</b>"
    at.run()
    assert not at.exception
    assert [w.value for w in at.warning] == ["There is no alert with the id in the page's address:"]
    assert any(t.value == "<b>no-such-alert</b>" for t in at.text)
    assert "Type" not in metrics(at)


def test_alerts_over_time_count_the_alerts_the_filters_select(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("alerts")

    def counts() -> dict[str, int]:
        bars = chart_data(at, "Alerts over time by type")
        return {str(k): int(v) for k, v in bars.groupby("alert_type")["alerts"].sum().items()}

    assert counts() == collections.Counter(a["alert_type"] for a in fixture_lake.alerts)
    at.multiselect(key="f_severity").select("medium").run()
    assert counts() == {"rogue_device": 1, "model_anomaly": 1}
    at.selectbox(key="f_status").select("Reviewed").run()
    assert not at.get("vega_lite_chart") and at.info, "no alerts: an empty state, no chart"
    at.multiselect(key="f_severity").unselect("medium").run()
    assert counts() == {"flood": 1}


def first_by(at: AppTest) -> dict[str, str]:
    """The list's "first by" column, per alert."""
    table = at.dataframe[0].value
    return dict(zip(table["alert_id"], table["first_by"], strict=True))


def first_by_line(at: AppTest) -> str:
    """The detail's line saying which path raised the alert first."""
    lines = [c.value for c in at.caption if c.value.startswith(("Raised ", "Which path"))]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_alerts_page_says_which_path_raised_each_alert_first(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    add_fast_alerts(fixture)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    at = open_page("alerts")
    # The fast alert the windowed path never confirmed is no alert: not listed.
    assert first_by(at) == {
        a["alert_id"]: "fast path" if a["alert_id"] == FAST_ALERT_ID else "windowed"
        for a in fixture.alerts
    }
    click_alert(at, FAST_ALERT_ID)
    assert not at.exception
    assert first_by_line(at) == (
        "Raised first by the fast path, 4.2 s before the windowed path (3 fast messages)"
    )
    click_alert(at, "alert-003")
    assert first_by_line(at) == "Raised by the windowed path (no fast-path message)"

    # Opened by its address while outside the time range, it is read on its own: same line.
    at.selectbox(key="time_range").select("Last 15 minutes")
    at.query_params["alert"] = FAST_ALERT_ID
    at.run()
    assert FAST_ALERT_ID not in listed_alerts(at)
    assert any("not in the list above" in c.value for c in at.caption)
    assert first_by_line(at).startswith("Raised first by the fast path, 4.2 s before")

    at.switch_page("views/overview.py").run()
    at.selectbox(key="time_range").select("Last hour").run()
    assert metrics(at)["Fast path first"] == "1 of 1"


def test_without_a_fast_alerts_table_every_alert_was_raised_by_the_windowed_path(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    """An older lake, or the fast path off."""
    assert not data.table_exists(fixture_lake.root, lake.FAST_ALERTS)
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("alerts")
    assert first_by(at) == {a["alert_id"]: "windowed" for a in fixture_lake.alerts}
    click_alert(at, FAST_ALERT_ID)
    assert not at.exception
    assert first_by_line(at) == "Raised by the windowed path (no fast-path message)"
    overview = open_page("overview")
    assert metrics(overview)["Fast path first"] == "0 of 1"


def counted_reads(app_env: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Tables opened from now on, by name."""
    opened: collections.Counter[str] = collections.Counter()
    open_table = data.open_table

    def counted(lake_root: str, table: str) -> Any:
        opened[table] += 1
        return open_table(lake_root, table)

    app_env.setattr(data, "open_table", counted)
    return opened


def test_reads_are_shared_by_tabs_within_the_refresh_interval(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    app_env.setenv("IOT_DASH_REFRESH_SECONDS", "600")  # longer than the test
    opened = counted_reads(app_env)
    first_tab = open_page("alerts")
    assert opened[lake.ALERTS] > 0
    first_reads = collections.Counter(opened)

    newer = {**fixture.alerts[0], "alert_id": "alert-007",
             "window_start": fixture.now - timedelta(minutes=1)}  # fmt: skip
    append_alerts(fixture.root, newer)
    other_tab = open_page("alerts")
    # The same pages in another tab: no table is read again, and the new alert waits.
    assert opened == first_reads
    assert "alert-007" not in listed_alerts(other_tab)
    assert data_as_of(other_tab) == data_as_of(first_tab), "the time of the reads it shows"


def test_reads_are_renewed_after_the_refresh_interval(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    app_env.setenv("IOT_DASH_REFRESH_SECONDS", "1")
    opened = counted_reads(app_env)
    tab = open_page("alerts")
    first_reads = opened[lake.ALERTS]
    newer = {**fixture.alerts[0], "alert_id": "alert-007",
             "window_start": fixture.now - timedelta(minutes=1)}  # fmt: skip
    append_alerts(fixture.root, newer)
    time.sleep(1.5)  # past the interval: waiting longer cannot make this fail
    tab.run()
    assert opened[lake.ALERTS] > first_reads
    assert listed_alerts(tab)[0] == "alert-007"


def test_a_verdict_is_saved_for_the_alert_the_form_was_shown_for(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The list moves on while an analyst types: the newest open alert (shown without a click)
    is reviewed in another tab meanwhile."""
    fixture = build_lake(str(tmp_path / "lake"))
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    app_env.setenv("IOT_DASH_REFRESH_SECONDS", "1")
    at = open_page("alerts")
    at.selectbox(key="f_status").select("Open").run()
    shown = listed_alerts(at)[0]
    data.write_feedback(fixture.root, shown, "false_positive", note="other tab", analyst="kim")
    time.sleep(1.5)
    at.radio[0].set_value("true_positive")
    at.text_area[0].input("about the alert on screen")
    at.text_input[0].input("ana")
    next(b for b in at.button if b.label == "Save verdict").click().run()
    assert not at.exception
    saved = data.read_table(fixture.root, lake.ALERT_FEEDBACK).filter(
        pl.col("note") == "about the alert on screen"
    )
    assert saved["alert_id"].to_list() == [shown]


def _inside(point: tuple[float, float], geometry: dict[str, Any]) -> bool:
    """Whether (lon, lat) is inside a GeoJSON (multi)polygon's outer rings (ray casting)."""
    x, y = point
    polygons = [geometry["coordinates"]]
    if geometry["type"] == "MultiPolygon":
        polygons = geometry["coordinates"]
    inside = False
    for ring in (polygon[0] for polygon in polygons):
        for (x1, y1), (x2, y2) in itertools.pairwise(ring):
            if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
                inside = not inside
    return inside


def test_the_map_names_devices_with_standing_alerts_over_country_borders(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    # thermo-003's only alert was withdrawn: it stands for nothing, so it is not named.
    withdrawn = {**fixture.alerts[4], "alert_id": "alert-withdrawn", "device_id": "thermo-003",
                 "status": c.ALERT_WITHDRAWN}  # fmt: skip
    append_alerts(fixture.root, withdrawn)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    app_env.setenv("IOT_DASH_MAP_STYLE", "none")
    at = open_page("map")
    charts = at.get("deck_gl_json_chart")
    assert len(charts) == 1
    layers = {layer["@@type"]: layer for layer in json.loads(charts[0].proto.json)["layers"]}
    drawn = {p["device_id"]: (p["lon"], p["lat"]) for p in layers["ScatterplotLayer"]["data"]}
    assert sorted(drawn) == sorted(["meter-001", "tracker-002", "thermo-003", ROGUE])
    named = [label["device_id"] for label in layers["TextLayer"]["data"]]
    assert sorted(named) == sorted(["meter-001", "tracker-002", ROGUE])

    countries = {f["properties"]["name"]: f["geometry"]
                 for f in layers["GeoJsonLayer"]["data"]["features"]}  # fmt: skip
    assert len(countries) == 177
    # The fleet is in Berlin, Munich, Hamburg and Frankfurt: inside Germany's outline.
    for device, position in drawn.items():
        assert _inside(position, countries["Germany"]), device
        assert not _inside(position, countries["France"]), device


def test_the_overview_counts_the_registered_devices_silent_now(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    silent = add_silences(fixture)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    at = open_page("overview")
    # thermo-003 (an ended silence, and one since 26 hours ago) and meter-004 (two open): not
    # the ended, the withdrawn or the unregistered device's.
    assert sorted(silent) == ["meter-004", "thermo-003"]
    assert metrics(at)["Silent now"] == "2"
    help_text = next(m.help for m in at.metric if m.label == "Silent now")
    assert "whatever the time range" in help_text
    # Silent now whatever the range: neither device's silence started in the last 15 minutes.
    at.selectbox(key="time_range").select("Last 15 minutes").run()
    assert metrics(at)["Silent now"] == "2"
    assert metrics(at)["Alerts"] == "2", "alert-001 and alert-002 only, no silence alert"


def test_the_map_rings_and_labels_the_devices_silent_now(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    silent = add_silences(fixture)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    app_env.setenv("IOT_DASH_MAP_STYLE", "none")
    at = open_page("map")
    assert not at.exception
    assert metrics(at)["Silent now"] == "2"
    chart = at.get("deck_gl_json_chart")[0].proto
    layers = {layer["@@type"]: layer for layer in json.loads(chart.json)["layers"]}
    points = {p["device_id"]: p for p in layers["ScatterplotLayer"]["data"]}
    assert sorted(points) == sorted(["meter-001", "tracker-002", "thermo-003", "meter-004", ROGUE])
    # thermo-003's silence began more than 12 hours ago: its date is shown too.
    thermo, meter = silent["thermo-003"], silent[SILENT_DEVICE[0]]
    notes = {device: point["silent_note"] for device, point in points.items()}
    assert notes == {
        "meter-001": "", "tracker-002": "", ROGUE: "",
        "thermo-003": f"; silent since {thermo:%Y-%m-%d %H:%M} UTC",
        "meter-004": f"; silent since {meter:%H:%M} UTC",
    }  # fmt: skip
    ringed = {d for d, p in points.items() if p["line_px"] == 4}
    assert ringed == {"thermo-003", "meter-004"}
    tooltip = json.loads(chart.tooltip)
    assert tooltip["text"].endswith("worst: {worst_severity}{silent_note}")
    labels = {label["device_id"]: label["label"] for label in layers["TextLayer"]["data"]}
    # thermo-003 has no alert in the range, but is silent: named, with since when.
    assert labels["thermo-003"] == f"thermo-003 (silent since {thermo:%Y-%m-%d %H:%M} UTC)"
    assert labels["meter-004"] == f"meter-004 (silent since {meter:%H:%M} UTC)"
    assert labels["tracker-002"] == "tracker-002"
    table = at.dataframe[0].value
    assert dict(zip(table["device_id"], table["silence"], strict=True))["thermo-003"] == (
        f"silent since {thermo:%Y-%m-%d %H:%M} UTC"
    )


def detail_fields(at: AppTest) -> dict[str, str]:
    """The alert detail's field table."""
    return dict(at.dataframe[1].value.set_index("field")["value"])


def test_a_silence_still_on_reads_as_still_silent_and_an_ended_one_as_its_length(
    app_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    silent = add_silences(fixture)
    app_env.setenv("IOT_LAKE_ROOT", fixture.root)
    at = open_page("alerts")
    since = silent[SILENT_DEVICE[0]]
    click_alert(at, "silence-4")
    assert not at.exception
    assert metrics(at)["Type"] == "device_silent"
    lines = [c.value for c in at.caption if c.value.startswith(("Still silent", "Silent for"))]
    assert len(lines) == 1
    assert lines[0].startswith(f"Still silent: no reading since {since:%Y-%m-%d %H:%M:%S} UTC (")
    fields = detail_fields(at)
    assert fields["window_end"] == "still silent"
    assert not any(v in ("None", "NaT", "nan") or "1970" in v for v in fields.values())
    assert any(c.value.startswith("None: this alert is about readings") for c in at.caption)
    assert len(at.dataframe) == 2, "no window features table for a silence"

    click_alert(at, "silence-5")
    lines = [c.value for c in at.caption if c.value.startswith(("Still silent", "Silent for"))]
    ended = next(a for a in fixture.extra["silences"] if a["alert_id"] == "silence-5")
    assert lines == [
        f"Silent for 1 h: no reading from {ended['first_event_time']:%Y-%m-%d %H:%M:%S} "
        f"until {ended['window_end']:%Y-%m-%d %H:%M:%S} UTC"
    ]

    # Opened by its address although it started before the range: still silent too.
    at.query_params["alert"] = "silence-2"
    at.run()
    assert not at.exception
    assert detail_fields(at)["window_end"] == "still silent"

    # The device's telemetry: from 15 minutes before its last reading on, the band up to now.
    at.query_params["alert"] = "silence-4"
    at.run()
    next(b for b in at.button if b.label == "Open this device").click().run()
    assert not at.exception
    assert at.selectbox(key="device_alert_id").value == "silence-4"
    assert any(c.value.startswith("16 events;") for c in at.caption)
    bands = [
        dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data)
        for chart in at.get("vega_lite_chart")
        for d in chart.proto.datasets
    ]
    bands = [b for b in bands if list(b.columns) == ["start", "end"]]
    assert bands, "each chart shades the silence"
    for band in bands:
        assert band["end"].notna().all()
        assert (band["end"] > pd.Timestamp(fixture.now)).all(), "an ongoing silence ends now"


def test_health_charts_leave_missing_watermarks_out(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("health")
    lag = chart_data(at, "Watermark lag")
    # The epoch (and the epoch shifted by an hour) is no watermark: no point, not a lag of
    # half a century that flattens the real two minutes.
    assert len(lag) == 24
    assert lag["watermark_lag_s"].isna().sum() == 3
    assert set(lag["watermark_lag_s"].dropna()) == {120.0}
    latest = at.dataframe[0].value
    assert list(latest.columns) == list(data.LATEST_BATCH_COLUMNS.values())
    assert latest["watermark_lag_s"].notna().all()


def test_health_state_rows_leave_out_the_queries_whose_rows_are_not_counted(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("health")
    rows = chart_data(at, "State rows")
    # Detection's are unknown (RocksDB): no line at 0, no null points.
    assert list(rows["query_name"].unique()) == ["ingest"]
    assert len(rows) == 12
    latest = at.dataframe[0].value
    assert latest.set_index("query")["state_rows"].isna().to_dict() == {
        "detection": True, "ingest": False
    }  # fmt: skip


def test_device_page_shows_telemetry_registry_and_history(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    at = open_page("device")
    at.selectbox(key="device_id").select("meter-001").run()
    at.selectbox(key="device_alert_id").select("alert-001").run()
    assert not at.exception
    # Window 10 minutes ago + margins: the last 25 of meter-001's 60 one-minute readings.
    assert any(c.value.startswith("25 events;") for c in at.caption)
    charts = at.get("vega_lite_chart")
    assert len(charts) == 5  # temperature, voltage, current, power, signal
    firmware = at.dataframe[0].value
    assert firmware[["firmware", "readings", "registry_expects"]].to_dict("records") == [
        {"firmware": "2.1.0", "readings": 25, "registry_expects": True}
    ]
    history = at.dataframe[-1].value
    assert sorted(history["alert_id"]) == ["alert-001", "alert-002", "alert-006"]
    registry = {r["field"]: r["value"] for r in at.dataframe[1].value.to_dict("records")}
    assert registry["site_address"] == "Unter den Linden 1, Berlin"

    at.selectbox(key="device_id").select(ROGUE).run()
    assert any("not in the registry" in w.value for w in at.warning)
    # Its firmware is listed with no verdict: the registry expects none.
    assert at.dataframe[0].value["registry_expects"].isna().all()


def test_map_and_health_numbers(app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("IOT_DASH_MAP_STYLE", "none")
    at = open_page("map")
    assert metrics(at) == {
        "Devices on the map": "4",
        "With alerts": "3",
        "Not in the registry": "1",
        "Alerts in range": "6",
        "Silent now": "0",
    }
    at.switch_page("views/health.py").run()
    shown = metrics(at)
    assert shown["Batches"] == "24"
    assert shown["Watermark lag"] == "120 s"
    assert shown["Late rows dropped"] == "3"
    assert shown["Quarantined"] == "5"
    quarantine = at.dataframe[-1].value
    assert dict(zip(quarantine["reason"], quarantine["records"], strict=True)) == {
        "invalid_json": 3,
        "duplicate": 2,
    }


def test_model_page_shows_champion_and_evaluation(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake, mlflow_store: tuple[str, str]
) -> None:
    uri, version = mlflow_store
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("MLFLOW_TRACKING_URI", uri)
    at = open_page("model")
    shown = metrics(at)
    assert shown["Champion version"] == version == "2"
    assert "champion" in shown["Aliases"]
    training = {r["field"]: r["value"] for r in at.dataframe[0].value.to_dict("records")}
    assert training == {"f1": "0.84", "pr_auc": "0.91"}
    evaluation = at.dataframe[2].value
    assert sorted(evaluation["scenario"]) == ["impossible_travel", "tampering"]
    verdicts = at.dataframe[3].value
    assert verdicts.to_dict("records") == [
        {"model_version": "rules", "reviewed": 1, "true_positive": 0, "precision": 0.0}
    ]


def test_model_page_says_mlflow_is_missing_rather_than_that_there_is_no_champion(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake, tmp_path: Path
) -> None:
    uri, _ = champion_store(tmp_path / "mlflow")
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("MLFLOW_TRACKING_URI", uri)
    # As without the dashboard extra's mlflow: importing it fails.
    app_env.setitem(sys.modules, "mlflow", None)
    at = open_page("model")
    assert [e.value for e in at.error] == [
        "MLflow is not installed, so the champion cannot be read. Install the dashboard's "
        "dependencies: pip install 'iotfraud[dashboard]'."
    ]
    assert not any("No champion model" in i.value for i in at.info)
    assert "Champion version" not in metrics(at)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_has_an_empty_state_on_an_empty_lake(
    app_env: pytest.MonkeyPatch, tmp_path: Path, page: str
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", str(tmp_path / "empty-lake"))
    at = open_page(page)
    assert not at.error
    assert at.info or at.warning or page == "alerts"
    assert not (tmp_path / "empty-lake").exists(), "reading must not create the lake"


# --- sign-in (IOT_DASH_AUTH_FILE) -------------------------------------------------------------

PASSWORD = "correct horse battery"
# What the sign-in page may contain: layout, its title and caption, the form, an error, a note.
SIGN_IN_ELEMENTS = {"SpecialBlock", "Block", "Column", "Title", "Caption", "TextInput", "Button"}


def user_file(folder: Path, *names: str) -> Path:
    path = folder / "dashboard-users"
    hashes = (auth.hash_password(PASSWORD, n=2**10, p=1) for _ in names)
    path.write_text("".join(f"{name}:{h}\n" for name, h in zip(names, hashes, strict=True)))
    return path


def assert_sign_in_form_only(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    kinds = {type(element).__name__ for element in at.main} | {
        type(element).__name__ for element in at.sidebar
    }
    assert kinds - {"Error", "Info"} <= SIGN_IN_ELEMENTS, kinds - SIGN_IN_ELEMENTS
    assert [t.label for t in at.text_input] == ["User name", "Password"]
    assert [b.label for b in at.button] == ["Sign in"]
    assert [t.value for t in at.title] == ["IoT fraud detection"]


def sign_in(at: AppTest, name: str, password: str) -> AppTest:
    at.text_input[0].input(name)
    at.text_input[1].input(password)
    return at.button[0].click().run()


def test_with_sign_in_on_nothing_renders_until_an_analyst_signs_in(
    app_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = str(tmp_path / "lake")
    fixture = build_lake(root)
    app_env.setenv("IOT_LAKE_ROOT", root)
    app_env.setenv("IOT_DASH_AUTH_FILE", str(user_file(tmp_path, "ana", "kim")))
    caplog.set_level("INFO", logger="dashboard")

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert_sign_in_form_only(at)

    for name, password in (("ana", "wrong password"), ("mallory", PASSWORD), ("", "")):
        sign_in(at, name, password)
        assert_sign_in_form_only(at)
        # The same message whichever part was wrong.
        assert [e.value for e in at.error] == [login.FAILED]

    sign_in(at, "ana", PASSWORD)
    assert not at.exception
    assert [t.value for t in at.title] == ["Overview"]
    assert metrics(at)["Open alerts"] == str(fixture.open_alerts)
    assert any(t.value == "Signed in as ana" for t in at.sidebar.text)
    at.switch_page("views/alerts.py").run()
    assert len(at.dataframe[0].value) == len(fixture.alerts)

    # The verdict is recorded under the signed-in name, which the form shows and does not let
    # anyone change.
    click_alert(at, "alert-003")
    analyst = next(t for t in at.text_input if t.label == "Analyst")
    assert (analyst.value, analyst.disabled) == ("ana", True)
    at.radio[0].set_value("true_positive")
    next(b for b in at.button if b.label == "Save verdict").click().run()
    saved = data.read_table(root, lake.ALERT_FEEDBACK).filter(pl.col("alert_id") == "alert-003")
    assert saved["analyst"].to_list() == ["ana"]

    at.switch_page("views/overview.py").run()
    assert metrics(at)["Open alerts"] == str(fixture.open_alerts - 1)

    next(b for b in at.sidebar.button if b.label == "Sign out").click().run()
    assert_sign_in_form_only(at)
    assert not at.error

    messages = caplog.text
    assert "failed sign-in for user name 'mallory'" in messages
    assert "analyst ana signed in" in messages
    assert "analyst ana signed out" in messages
    assert PASSWORD not in messages and "wrong password" not in messages


def test_an_analyst_removed_from_the_user_file_is_signed_out(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake, tmp_path: Path
) -> None:
    users = user_file(tmp_path, "ana", "kim")
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("IOT_DASH_AUTH_FILE", str(users))
    at = sign_in(AppTest.from_file(APP, default_timeout=TIMEOUT).run(), "kim", PASSWORD)
    assert metrics(at)["Open alerts"] == str(fixture_lake.open_alerts)

    user_file(tmp_path, "ana")
    at.run()
    assert_sign_in_form_only(at)


def test_an_idle_session_is_signed_out(
    app_env: pytest.MonkeyPatch,
    fixture_lake: FixtureLake,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("IOT_DASH_AUTH_FILE", str(user_file(tmp_path, "ana")))
    app_env.setenv("IOT_DASH_SESSION_IDLE_MINUTES", "5")
    caplog.set_level("INFO", logger="dashboard")
    at = sign_in(AppTest.from_file(APP, default_timeout=TIMEOUT).run(), "ana", PASSWORD)
    assert [t.value for t in at.title] == ["Overview"]
    assert not at.info

    # Time passes by moving the session's last activity back: 4 minutes idle, then a click.
    at.session_state[login.ACTIVE_KEY] -= 4 * 60
    at.switch_page("views/alerts.py").run()
    assert [t.value for t in at.title] == ["Alerts"], "still signed in"
    # The click counted as activity: 4 more idle minutes are within the 5 again.
    at.session_state[login.ACTIVE_KEY] -= 4 * 60
    at.run()
    assert [t.value for t in at.title] == ["Alerts"]

    at.session_state[login.ACTIVE_KEY] -= 5 * 60
    at.run()
    assert_sign_in_form_only(at)
    assert [i.value for i in at.info] == [login.EXPIRED]
    assert not at.sidebar.text, "no longer shown as signed in"
    assert "analyst ana signed out after 5 minutes idle" in caplog.text

    sign_in(at, "ana", PASSWORD)
    assert [t.value for t in at.title] == ["Alerts"], "back on the page left"


def test_failures_in_one_session_do_not_lock_the_analyst_out_of_another(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake, tmp_path: Path
) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("IOT_DASH_AUTH_FILE", str(user_file(tmp_path, "kim")))
    # On localhost the address is unknown, so each session counts as a client of its own.
    guesser = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    for _ in range(auth.MAX_FAILURES):
        sign_in(guesser, "kim", "a guess")
        assert [e.value for e in guesser.error] == [login.FAILED]
    sign_in(guesser, "kim", PASSWORD)
    assert_sign_in_form_only(guesser)
    assert [e.value for e in guesser.error] == [login.THROTTLED]

    at = sign_in(AppTest.from_file(APP, default_timeout=TIMEOUT).run(), "kim", PASSWORD)
    assert not at.exception
    assert [t.value for t in at.title] == ["Overview"]


def test_a_bad_user_file_shows_no_data(
    app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake, tmp_path: Path
) -> None:
    (tmp_path / "users").write_text("ana:not-a-hash\n")
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("IOT_DASH_AUTH_FILE", str(tmp_path / "users"))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert [e.value for e in at.error] == ["The dashboard's configuration is invalid."]
    assert "IOT_DASH_AUTH_FILE" in at.text[0].value
    assert not at.text_input and not at.metric and not at.dataframe
