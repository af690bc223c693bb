"""The real dashboard server in a real headless Chromium: every page renders without an error box.

Starts ``python -m dashboard`` on a free port against a fixture lake and a fixture MLflow store,
with sign-in on (``IOT_DASH_AUTH_FILE``): signs in through the form, walks through every page with
the sidebar navigation, signs out, and saves a screenshot of the sign-in page and of each page
under ``artifacts/screenshots/`` (kept by CI). Chromium is Debian's (``scripts/system-deps.sh``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import auth, login, ui
from infra.ports import free_port
from tests.dashboard_fixtures import MARKUP_REASON, FixtureLake, build_lake, champion_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
REFRESH_S = 2
ROW_PX = ui.ROW_HEIGHT  # a table's rows and its header
USER, PASSWORD = "ana", "correct horse battery"
# (navigation label, title on the page, texts the page must show)
PAGES = (
    ("Overview", "Overview", ("Open alerts", "Devices reporting", "Alerts by severity")),
    (
        "Alerts",
        "Alerts",
        ("Alerts over time by type", "Alert detail", "Reasons", "Window features", "Save verdict"),
    ),
    ("Map", "Map", ("Devices on the map", "Not in the registry")),
    ("Device", "Device", ("Telemetry", "Registry entry", "Alert history")),
    ("Pipeline health", "Pipeline health", ("Watermark lag", "Quarantine by reason")),
    ("Model", "Model", ("Champion version", "Detection quality against ground truth")),
)


@pytest.fixture(scope="module")
def fixture_lake(tmp_path_factory: pytest.TempPathFactory) -> FixtureLake:
    return build_lake(str(tmp_path_factory.mktemp("lake")))


@pytest.fixture(scope="module")
def server(fixture_lake: FixtureLake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m dashboard`` on a free port; yields its URL."""
    state = tmp_path_factory.mktemp("state")
    uri, _ = champion_store(state / "mlflow")
    users = state / "dashboard-users"
    users.write_text(f"{USER}:{auth.hash_password(PASSWORD)}\n")
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "IOT_LAKE_ROOT": fixture_lake.root,
            "MLFLOW_TRACKING_URI": uri,
            "IOT_STACK_STATE_DIR": str(state),
            "IOT_DASH_REFRESH_SECONDS": str(REFRESH_S),
            # The test machine has no internet: no basemap tiles to wait for.
            "IOT_DASH_MAP_STYLE": "none",
            "IOT_DASH_AUTH_FILE": str(users),
        }
    )
    log = (state / "dashboard.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "dashboard", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dashboard did not start:\n{(state / 'dashboard.log').read_text()}")
            time.sleep(0.3)
        yield url
    finally:
        # The CLI runs streamlit as a child: stop the whole session we started.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def test_every_page_renders_without_errors(server: str, fixture_lake: FixtureLake) -> None:
    from playwright.sync_api import Page, sync_playwright

    # The Alerts page lists the alerts newest window first.
    order = sorted(
        fixture_lake.alerts,
        key=lambda a: (a["window_start"], a["detected_at"], a["alert_id"]),
        reverse=True,
    )
    listed = [a["alert_id"] for a in order]
    alerts = {a["alert_id"]: a for a in fixture_lake.alerts}

    assert Path(CHROMIUM).exists(), "Chromium is missing: run scripts/system-deps.sh"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def settle(page: Page) -> None:
        """Wait until the script run is over and the charts have drawn."""
        page.wait_for_selector('[data-testid="stApp"]')
        page.wait_for_function(
            "() => !document.querySelector('[data-testid=\"stStatusWidget\"] button')",
            timeout=30_000,
        )
        page.wait_for_timeout(1000)

    def click_alert_row(page: Page, alert_id: str) -> None:
        """A click on a cell of the alert's row in the list shows that alert's detail."""
        row = listed.index(alert_id)
        table = page.locator('[data-testid="stDataFrame"]').first.bounding_box()
        assert table is not None
        page.mouse.click(table["x"] + 200, table["y"] + ROW_PX * (row + 1) + ROW_PX / 2)
        page.wait_for_url(f"**/alerts?alert={alert_id}", timeout=30_000)
        alert = alerts[alert_id]
        detail = page.locator('[data-testid="stMetric"]', has_text="Type").first
        detail.filter(has_text=alert["alert_type"]).wait_for(timeout=30_000)
        page.locator('[data-testid="stText"]', has_text=alert["reasons"][0]).wait_for()

    def assert_no_error(page: Page, name: str) -> None:
        errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
        assert errors.count() == 0, f"{name}: {errors.all_inner_texts()}"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1800})
            page.goto(server, wait_until="domcontentloaded")
            nav = page.locator('[data-testid="stSidebarNav"]')

            def sign_in(password: str) -> None:
                page.get_by_label("User name").fill(USER)
                page.get_by_label("Password", exact=True).fill(password)
                page.get_by_role("button", name="Sign in").click()

            # Signed out, the server sends the sign-in form and nothing else: no navigation,
            # no data.
            page.get_by_role("button", name="Sign in").wait_for(timeout=30_000)
            settle(page)
            assert nav.count() == 0
            assert (
                page.locator('[data-testid="stMetric"], [data-testid="stDataFrame"]').count() == 0
            )
            page.screenshot(path=str(SCREENSHOTS / "00-sign-in.png"), full_page=True)
            # A page's own address (a bookmark, here of one alert) gets the same form, then that
            # page.
            page.goto(f"{server}/alerts?alert=alert-001", wait_until="domcontentloaded")
            page.get_by_role("button", name="Sign in").wait_for(timeout=30_000)
            settle(page)
            assert nav.count() == 0
            assert page.get_by_role("heading", name="Alerts").count() == 0
            sign_in("wrong password")
            page.get_by_text(login.FAILED, exact=True).wait_for(timeout=30_000)
            assert nav.count() == 0
            sign_in(PASSWORD)
            page.get_by_role("heading", name="Alerts", exact=True).wait_for(timeout=30_000)
            nav.wait_for()
            page.get_by_text(f"Signed in as {USER}", exact=True).wait_for()
            # The bookmarked alert is shown. Field values are text: the markup in its reason is
            # shown, not rendered.
            page.locator('[data-testid="stText"]', has_text=MARKUP_REASON).first.wait_for()
            assert page.locator("b", has_text="power_w_mean").count() == 0

            for number, (label, title, texts) in enumerate(PAGES, start=1):
                page.locator('[data-testid="stSidebarNav"]').get_by_text(label, exact=True).click()
                page.get_by_role("heading", name=title, exact=True).wait_for(timeout=30_000)
                for text in texts:
                    page.get_by_text(text, exact=True).first.wait_for(timeout=30_000)
                settle(page)
                assert_no_error(page, title)
                metrics = page.locator('[data-testid="stMetric"]').all_inner_texts()
                if label == "Overview":
                    assert any("Open alerts" in m and "5" in m for m in metrics), metrics
                if label == "Alerts":
                    click_alert_row(page, "alert-004")
                    assert_no_error(page, "Alerts after a click on a row")
                if label == "Model":
                    assert any("Champion version" in m and "2" in m for m in metrics), metrics
                page.screenshot(
                    path=str(SCREENSHOTS / f"{number:02d}-{label.lower().replace(' ', '-')}.png"),
                    full_page=True,
                )

            # The pages refresh themselves (a fragment rerun) and stay error-free.
            page.locator('[data-testid="stSidebarNav"]').get_by_text("Overview").click()
            caption = page.get_by_text("Data as of", exact=False).first
            caption.wait_for()
            before = caption.inner_text()
            page.wait_for_function(
                "(before) => [...document.querySelectorAll('[data-testid=\"stCaptionContainer\"]')]"
                ".some(e => e.innerText.startsWith('Data as of') && e.innerText !== before)",
                arg=before,
                timeout=(REFRESH_S + 10) * 1000,
            )
            assert_no_error(page, "Overview after refresh")

            page.get_by_role("button", name="Sign out").click()
            page.get_by_role("button", name="Sign in").wait_for(timeout=30_000)
            assert nav.count() == 0
        finally:
            browser.close()
