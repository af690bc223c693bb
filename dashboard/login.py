"""The sign-in gate: with ``IOT_DASH_AUTH_FILE`` set, nothing but the sign-in form is rendered
until an analyst listed in that file signs in; then the sidebar shows who and a sign-out button.

A sign-in lasts for the browser session (reloading the page asks again) and ends once the
analyst has not interacted for ``IOT_DASH_SESSION_IDLE_MINUTES``: any full run of the app counts,
the pages' own refreshes do not. The user file is read on every run, so removing an analyst from
it signs them out at their next interaction.

Failed sign-ins are throttled per client, per name and overall (``auth.LoginThrottle``). The
client is the address Streamlit sees (``st.context.ip_address``); where it is unknown (the
browser on this machine, or a proxy on it) the throttle counts the browser session instead.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Sequence

import streamlit as st

from dashboard import auth
from dashboard.settings import DashboardSettings

log = logging.getLogger(__name__)

USER_KEY = "signed_in_analyst"
# The monotonic clock's reading at the session's latest full run while signed in.
ACTIVE_KEY = "sign_in_last_active"
EXPIRED_KEY = "sign_in_expired"
SESSION_KEY = "sign_in_session"
FAILED = "Sign-in failed: unknown user name or wrong password."
# The same whichever limit refused: it says nothing about the name.
THROTTLED = "Too many failed sign-ins. Try again in a few minutes."
EXPIRED = "You were signed out after a period without activity. Sign in again to continue."


@functools.cache
def shared_throttle(global_max_failures: int) -> auth.LoginThrottle:
    """The server process's throttle: failures count across browser sessions."""
    return auth.LoginThrottle(global_max_failures=global_max_failures)


def signed_in_analyst() -> str | None:
    """The name of the analyst signed in to this session, if any."""
    name = st.session_state.get(USER_KEY)
    return name if isinstance(name, str) else None


def session_expired(settings: DashboardSettings) -> bool:
    """True if this session's analyst has not interacted for the idle time allowed."""
    return auth.idle_expired(
        st.session_state.get(ACTIVE_KEY), time.monotonic(), settings.session_idle_minutes * 60
    )


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
    if name is not None:
        if name not in users:
            log.warning("analyst %s is no longer in the user file: signed out", name)
            st.session_state.clear()
        elif session_expired(settings):
            log.info(
                "analyst %s signed out after %g minutes idle", name, settings.session_idle_minutes
            )
            st.session_state.clear()
            st.session_state[EXPIRED_KEY] = True
        else:
            st.session_state[ACTIVE_KEY] = time.monotonic()
            return name

    def sign_in() -> None:
        _sign_in_form(users, shared_throttle(settings.sign_in_global_max_failures))

    # This navigation also replaces the page list a browser may still show from before.
    pages = [
        st.Page(sign_in, title="Sign in", url_path=path, default=i == 0)
        for i, path in enumerate(url_paths)
    ]
    st.navigation(pages, position="hidden").run()
    st.stop()


def _client() -> str:
    # Where the address is unknown, a random name kept in the session's state stands for it.
    session = st.session_state.setdefault(SESSION_KEY, secrets.token_hex(8))
    address = st.context.ip_address
    # Anything but a string (AppTest's runtime gives a stand-in object) is unknown too.
    return auth.client_key(address if isinstance(address, str) else None, session)


def _sign_in_form(users: dict[str, auth.PasswordHash], throttle: auth.LoginThrottle) -> None:
    _, middle, _ = st.columns([1, 2, 1])
    with middle:
        st.title("IoT fraud detection")
        st.caption("Sign in with your analyst account.")
        if st.session_state.pop(EXPIRED_KEY, False):
            st.info(EXPIRED)
        with st.form("sign_in", clear_on_submit=True):
            name = st.text_input("User name", max_chars=64, autocomplete="username")
            password = st.text_input(
                "Password", type="password", max_chars=256, autocomplete="current-password"
            )
            submitted = st.form_submit_button("Sign in", type="primary")
        if not submitted:
            return
        name = (name or "").strip()
        client = _client()
        refused_by = throttle.attempt(client, name)
        if refused_by is not None:
            log.warning(
                "sign-in refused for user name %r from %s: too many failures (%s)",
                name,
                client,
                refused_by,
            )
            st.error(THROTTLED)
            return
        if auth.authenticate(users, name, password or ""):
            throttle.succeeded(client, name)
            log.info("analyst %s signed in", name)
            st.session_state[USER_KEY] = name
            st.session_state[ACTIVE_KEY] = time.monotonic()
            st.rerun()
        log.warning("failed sign-in for user name %r from %s", name, client)
        st.error(FAILED)


def sign_out_button(name: str) -> None:
    """Who is signed in, and the button that ends the session's sign-in (and its state)."""
    # The name is shown as text: it comes from the user file, not from Markdown.
    st.sidebar.text(f"Signed in as {name}")
    if st.sidebar.button("Sign out", icon=":material/logout:"):
        log.info("analyst %s signed out", name)
        st.session_state.clear()
        st.rerun()
