"""The dashboard's pages in AppTest on fixture lakes: the numbers shown are the data's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import auth, data, login
from infra import lake
from tests.dashboard_fixtures import (
    MARKUP_REASON,
    ROGUE,
    FixtureLake,
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
    import pyarrow as pa
    from deltalake import write_deltalake

    from infra import contract as c

    fixture = build_lake(str(tmp_path / "lake"))
    withdrawn = {**fixture.alerts[0], "alert_id": "alert-withdrawn", "status": c.ALERT_WITHDRAWN}
    write_deltalake(lake.table_path(fixture.root, lake.ALERTS),
                    pa.Table.from_pylist([withdrawn], schema=c.arrow_schema(c.ALERTS_COLUMNS)),
                    mode="append")  # fmt: skip
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
    at.selectbox(key="alert_id").select("alert-001").run()
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
    at.selectbox(key="alert_id").select("alert-003").run()
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
    history = at.dataframe[-1].value
    assert sorted(history["alert_id"]) == ["alert-001", "alert-002", "alert-006"]
    registry = {r["field"]: r["value"] for r in at.dataframe[0].value.to_dict("records")}
    assert registry["site_address"] == "Unter den Linden 1, Berlin"

    at.selectbox(key="device_id").select(ROGUE).run()
    assert any("not in the registry" in w.value for w in at.warning)


def test_map_and_health_numbers(app_env: pytest.MonkeyPatch, fixture_lake: FixtureLake) -> None:
    app_env.setenv("IOT_LAKE_ROOT", fixture_lake.root)
    app_env.setenv("IOT_DASH_MAP_STYLE", "none")
    at = open_page("map")
    assert metrics(at) == {
        "Devices on the map": "4",
        "With alerts": "3",
        "Not in the registry": "1",
        "Alerts in range": "6",
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
    at.selectbox(key="alert_id").select("alert-003").run()
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
