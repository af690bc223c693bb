"""The ``iotfraud`` command: every subcommand it lists exists and answers --help."""

from __future__ import annotations

import importlib

import pytest

from iotfraud.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_listed_command_has_an_entry_point(command: str) -> None:
    module_name, prefix, _ = COMMANDS[command]
    module = importlib.import_module(module_name)
    assert callable(module.main)
    with pytest.raises(SystemExit) as exit_info:
        module.main([*prefix, "--help"])
    assert exit_info.value.code == 0


def test_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
