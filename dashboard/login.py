"""The sign-in gate: with ``IOT_DASH_AUTH_FILE`` set, nothing but the sign-in form is rendered
until an analyst listed in that file signs in; then the sidebar shows who and a sign-out button.

A sign-in lasts for the browser session (reloading the page asks again). The user file is read
on every run, so removing an analyst from it signs them out at their next interaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import streamlit as st

from dashboard import auth
from dashboard.settings import DashboardSettings

log = logging.getLogger(__name__)

USER_KEY = "signed_in_analyst"
FAILED = "Sign-in failed: unknown user name or wrong password."
THROTTLED = "Too many failed sign-ins with this user name. Try again in a few minutes."
# One per server process: failures count across browser sessions.
THROTTLE = auth.LoginThrottle()


def signed_in_analyst() -> str | None:
    """The name of the analyst signed in to this session, if any."""
    name = st.session_state.get(USER_KEY)
    return name if isinstance(name, str) else None


def require_sign_in(settings: DashboardSettings, url_paths: Sequence[str]) -> str | None:
    """The signed-in analyst; with sign-in off, None. Otherwise shows the form and stops the run.

    ``url_paths`` are the app's pages (the first is the default): until an analyst signs in,
    each of them is the sign-in form, so that a bookmarked page asks for a sign-in and then
    opens, rather than being "not found".
    """
    if settings.auth_file is None:
        return None
    try:
        users = auth.read_users(settings.auth_file)
    except auth.AuthFileError as exc:
        log.error("sign-in unavailable: %s", exc)
        st.error("Sign-in is unavailable: the dashboard's user file cannot be read.")
        st.stop()
    name = signed_in_analyst()
    if name is not None and name in users:
        return name
    if name is not None:
        log.warning("analyst %s is no longer in the user file: signed out", name)
        st.session_state.clear()

    def sign_in() -> None:
        _sign_in_form(users)

    # This navigation also replaces the page list a browser may still show from before.
    pages = [
        st.Page(sign_in, title="Sign in", url_path=path, default=i == 0)
        for i, path in enumerate(url_paths)
    ]
    st.navigation(pages, position="hidden").run()
    st.stop()


def _sign_in_form(users: dict[str, auth.PasswordHash]) -> None:
    _, middle, _ = st.columns([1, 2, 1])
    with middle:
        st.title("IoT fraud detection")
        st.caption("Sign in with your analyst account.")
        with st.form("sign_in", clear_on_submit=True):
            name = st.text_input("User name", max_chars=64, autocomplete="username")
            password = st.text_input(
                "Password", type="password", max_chars=256, autocomplete="current-password"
            )
            submitted = st.form_submit_button("Sign in", type="primary")
        if not submitted:
            return
        name = (name or "").strip()
        if THROTTLE.blocked(name):
            log.warning("sign-in refused for user name %r: too many failures", name)
            st.error(THROTTLED)
            return
        if auth.authenticate(users, name, password or ""):
            THROTTLE.succeeded(name)
            log.info("analyst %s signed in", name)
            st.session_state[USER_KEY] = name
            st.rerun()
        THROTTLE.failed(name)
        log.warning("failed sign-in for user name %r", name)
        st.error(FAILED)


def sign_out_button(name: str) -> None:
    """Who is signed in, and the button that ends the session's sign-in (and its state)."""
    # The name is shown as text: it comes from the user file, not from Markdown.
    st.sidebar.text(f"Signed in as {name}")
    if st.sidebar.button("Sign out", icon=":material/logout:"):
        log.info("analyst %s signed out", name)
        st.session_state.clear()
        st.rerun()
