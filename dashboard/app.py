"""The Streamlit entry script: page set-up, the shared sidebar and the navigation.

Run with ``iotfraud dashboard`` (or ``streamlit run dashboard/app.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import streamlit as st

from dashboard import login, ui
from infra.errors import ConfigError
from infra.logs import configure_logging

log = logging.getLogger(__name__)

VIEWS = Path(__file__).parent / "views"
PAGES = (
    ("overview.py", "Overview", ":material/dashboard:"),
    ("alerts.py", "Alerts", ":material/notifications:"),
    ("map.py", "Map", ":material/map:"),
    ("device.py", "Device", ":material/sensors:"),
    ("health.py", "Pipeline health", ":material/monitor_heart:"),
    ("model.py", "Model", ":material/model_training:"),
)


def main() -> None:
    if not logging.getLogger().handlers:
        # Under ``streamlit run`` nothing has set logging up: sign-ins go to the server's log.
        configure_logging()
    st.set_page_config(
        page_title="IoT fraud detection", page_icon=":material/shield:", layout="wide"
    )
    try:
        settings = ui.get_settings()
    except ConfigError as exc:
        st.error("The dashboard's configuration is invalid.")
        st.text(str(exc))
        st.stop()
        return
    # With sign-in on, no page content and no data is sent before an analyst has signed in.
    analyst = login.require_sign_in(settings, [Path(name).stem for name, _, _ in PAGES])
    pages = [st.Page(VIEWS / name, title=title, icon=icon) for name, title, icon in PAGES]
    page = st.navigation(pages)
    st.sidebar.caption("IoT fraud detection")
    ui.range_picker(settings)
    st.sidebar.caption(f"Lake: `{settings.lake_root}`")
    if analyst is not None:
        login.sign_out_button(analyst)
    page.run()


main()
