"""The ``iotfraud`` command tree: global options on every command in both positions, the settings
file, one error format, exit codes (0 ok, 1 runtime failure, 2 usage or configuration)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from infra import commandline
from infra.settings import CommonSettings, load_settings
from iotfraud.cli import COMMANDS, cli, main

ROOT = Path(__file__).resolve().parents[2]


def command_paths(group: click.Group, prefix: list[str], ctx: click.Context) -> Iterator[list[str]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"{' '.join([*prefix, name])}: listed but missing"
        yield [*prefix, name]
        if isinstance(command, click.Group):
            yield from command_paths(command, [*prefix, name], ctx)


# Every command and subcommand of the tree (the root is the empty path).
PATHS = [[], *command_paths(cli, [], click.Context(cli))]


@pytest.fixture(autouse=True)
def quiet_logging(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test in its own folder (no .env of the repository; the log file under tmp_path)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IOT_STACK_STATE_DIR", str(tmp_path / "state"))


def test_the_tree_has_every_command_of_the_table() -> None:
    assert [path[0] for path in PATHS if len(path) == 1] == list(COMMANDS)
    assert ["registry", "create"] in PATHS and ["dashboard", "hash-password"] in PATHS
    assert ["models", "promote"] in PATHS and ["stack", "up"] in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "iotfraud")
@pytest.mark.parametrize(
    "option", [["-v"], ["--verbose"], ["--lake-root", "/x/lake"], ["--env-file", "dot.env"]]
)
def test_global_options_before_and_after_the_command_name(
    path: list[str], option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    Path("dot.env").write_text("IOT_TOPIC=from.file\n")
    # `iotfraud -v simulate --help`, `iotfraud simulate -v --help`, and so on down the tree.
    for position in range(len(path) + 1):
        argv = [*path[:position], *option, *path[position:], "--help"]
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert out.startswith("usage:"), (argv, out[:200])


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "iotfraud")
def test_version_on_every_command(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*path, "--version"]) == 0
    assert capsys.readouterr().out == f"iotfraud {importlib.metadata.version('iotfraud')}\n"


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [(["-v", "probe"], True), (["probe", "--verbose"], True), (["probe"], False)],
)
def test_verbose_reaches_the_command_from_either_position(argv: list[str], verbose: bool) -> None:
    seen = []

    @commandline.command("probe")
    def probe() -> None:
        seen.append(commandline.invocation().verbose)

    assert commandline.run(commandline.Group("iotfraud", commands=[probe]), argv) == 0
    assert seen == [verbose]


def probe_group(seen: dict[str, str]) -> click.Group:
    """A group with one command that records the lake root and the topic it would use."""

    @commandline.command("probe")
    def probe() -> None:
        settings = load_settings(CommonSettings)
        seen.update(lake_root=settings.lake_root, topic=settings.topic)

    return commandline.Group("iotfraud", commands=[probe])


def test_dot_env_is_read_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".env").write_text("IOT_TOPIC=from.file\nIOT_LAKE_ROOT=/file/lake\n")
    monkeypatch.setenv("IOT_LAKE_ROOT", "/env/lake")
    monkeypatch.delenv("IOT_TOPIC", raising=False)
    seen: dict[str, str] = {}
    assert commandline.run(probe_group(seen), ["probe"]) == 0
    assert seen == {"lake_root": "/env/lake", "topic": "from.file"}
    # The run leaves the process's environment as it found it.
    assert "IOT_TOPIC" not in os.environ and os.environ["IOT_LAKE_ROOT"] == "/env/lake"


def test_env_file_names_another_file_and_lake_root_wins_over_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Path(".env").write_text("IOT_TOPIC=from.dot.env\n")
    Path("other.env").write_text("IOT_TOPIC=from.other\nIOT_LAKE_ROOT=/file/lake\n")
    monkeypatch.setenv("IOT_LAKE_ROOT", "/env/lake")
    monkeypatch.delenv("IOT_TOPIC", raising=False)
    seen: dict[str, str] = {}
    assert commandline.run(probe_group(seen), ["--env-file", "other.env", "probe"]) == 0
    assert seen == {"lake_root": "/env/lake", "topic": "from.other"}
    assert commandline.run(probe_group(seen), ["probe", "--lake-root", "/flag/lake"]) == 0
    assert seen == {"lake_root": "/flag/lake", "topic": "from.dot.env"}
    assert os.environ["IOT_LAKE_ROOT"] == "/env/lake"


def test_a_missing_env_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--env-file", "missing.env"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iotfraud config: error: ")
    assert "missing.env" in err and "does not exist" in err


@pytest.mark.parametrize(
    ("argv", "prefix"),
    [
        (["nonsense"], "iotfraud: error: No such command 'nonsense'"),
        (["simulate", "--frobnicate"], "iotfraud simulate: error: No such option '--frobnicate'"),
        (["-v", "registry", "create", "--frob"], "iotfraud registry create: error: No such option"),
        (["simulate", "--devices", "0"], "iotfraud simulate: error: Invalid value for '--devices'"),
        (["models", "promote"], "iotfraud models promote: error: Missing argument 'VERSION'"),
    ],
)
def test_usage_errors_have_one_prefix_and_exit_2(
    argv: list[str], prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(prefix)


def test_a_bad_setting_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IOT_SIM_RATE", "fast")
    assert main(["registry", "create", "--devices", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iotfraud registry create: error: Invalid configuration")
    assert "IOT_SIM_RATE" in err and "valid number" in err


def test_a_bad_setting_from_the_file_says_where_it_is_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("IOT_STACK_KAFKA_HEAP", raising=False)
    Path(".env").write_text("IOT_STACK_KAFKA_HEAP=lots\n")
    assert main(["stack", "status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iotfraud stack status: error: ")
    assert "IOT_STACK_KAFKA_HEAP" in err and "(IOT_STACK_KAFKA_HEAP is set in .env)" in err


def test_a_runtime_failure_exits_1_with_the_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    @commandline.command("boom")
    def boom() -> None:
        raise RuntimeError("the disk is full")

    assert commandline.run(commandline.Group("iotfraud", commands=[boom]), ["boom"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("iotfraud boom: error: RuntimeError: the disk is full\n")
    assert "the traceback is in" in err


def test_a_setting_option_is_derived_from_its_field() -> None:
    from simulator.cli import simulate
    from simulator.settings import SimulatorSettings

    options = {p.name: p for p in simulate.params if isinstance(p, commandline.SettingOption)}
    devices = options["devices"]
    field = SimulatorSettings.model_fields["devices"]
    assert devices.opts == ["--devices"]
    assert devices.help == f"{field.description} (IOT_SIM_DEVICES)"
    assert devices.default == field.default
    assert isinstance(devices.type, click.IntRange)
    assert (devices.type.min, devices.type.max) == (1, 1_000_000)


def test_only_options_given_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.settings import SimulatorSettings

    seen: list[SimulatorSettings] = []

    @commandline.command("probe")
    @commandline.setting(SimulatorSettings, "devices")
    @commandline.setting(SimulatorSettings, "seed")
    def probe(**_options: object) -> None:
        seen.append(commandline.settings_from(SimulatorSettings))

    monkeypatch.setenv("IOT_SIM_DEVICES", "77")
    monkeypatch.setenv("IOT_SIM_SEED", "5")
    assert commandline.run(probe, ["--seed", "9"]) == 0
    assert (seen[0].devices, seen[0].seed) == (77, 9)


def test_the_installed_command_and_python_m_agree(tmp_path: Path) -> None:
    """Real processes: `iotfraud -v simulate` and `python -m simulator simulate -v` both run."""
    env = {**os.environ, "IOT_STACK_STATE_DIR": str(tmp_path / "state")}
    common = ["--devices", "5", "--count", "10", "--start-time", "2026-01-05T00:00:00Z"]
    runs = {
        "iotfraud": [str(Path(sys.executable).parent / "iotfraud"), "-v", "simulate"],
        "python -m simulator": [sys.executable, "-m", "simulator", "simulate", "-v"],
    }
    for name, argv in runs.items():
        out = tmp_path / name.replace(" ", "_")
        result = subprocess.run(
            [*argv, *common, "--out", str(out), "--lake-root", str(out / "lake")],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        assert "wrote 1 JSON-lines files" in result.stdout
        assert "DEBUG" in result.stderr  # -v reached the command
        assert (out / "lake" / "devices").is_dir()
    bad = subprocess.run(
        [str(Path(sys.executable).parent / "iotfraud"), "simulate", "-v", "--nope"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith("iotfraud simulate: error: No such option '--nope'")
