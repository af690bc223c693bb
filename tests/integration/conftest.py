"""Integration tests run the silence query only where they test it.

It is on by default (IOT_PIPELINE_SILENCE), and one more streaming query per pipeline run slows
every other one on a two-core machine; tests/integration/test_silence.py and the kill loop switch
it on, and the end-to-end demo (tests/e2e) runs with the defaults.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _silence_query_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_PIPELINE_SILENCE", "false")
