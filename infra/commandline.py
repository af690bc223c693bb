"""What every command of the ``iotfraud`` tree shares, built on Click.

- Global options on every command and group, before or after a subcommand's name: ``-v``,
  ``--version``, ``--lake-root``, ``--env-file``.
- Options that set a settings field are derived from it (``setting``): name, type, range, help
  and default come from the field; given on the command line, the value wins over its variable.
- One runner (``run``): a ``.env`` file feeds the environment (variables already set win, as with
  compose and pydantic-settings), logging is configured once, every error reads
  ``iotfraud <command>: error: ...``, and the exit status is 0 (ok), 1 (the command failed while
  running) or 2 (a usage error or a bad setting: the message says what to fix).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import re
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types
import click
from click.core import ParameterSource
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from infra.errors import SetupError
from infra.logs import configure_logging
from infra.settings import (
    CommonSettings,
    config_error,
    load_settings,
    read_env_file,
    variable_name,
)

log = logging.getLogger(__name__)

PROG = "iotfraud"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
ENV_FILE = Path(".env")
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# Click 8.2+ raises it for a group run without its subcommand (8.1 shows the help and exits 0).
_NO_ARGS_IS_HELP: tuple[type[Exception], ...] = tuple(
    getattr(click.exceptions, name)
    for name in ("NoArgsIsHelpError",)
    if hasattr(click.exceptions, name)
)

S = TypeVar("S", bound=BaseSettings)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Invocation:
    """One run of a command: what the global options asked for, and the environment variables
    ``prepare`` set (``run`` puts the previous values back at the end)."""

    verbose: bool = False
    lake_root: str | None = None
    env_file: Path | None = None
    command_path: str = PROG
    log_file: Path | None = None
    prepared: bool = False
    from_file: dict[str, Path] = field(default_factory=dict)  # variable -> the file that set it
    saved: dict[str, str | None] = field(default_factory=dict)

    def setenv(self, name: str, value: str) -> None:
        self.saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def restore(self) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.saved.clear()


def invocation(ctx: click.Context | None = None) -> Invocation:
    """The current run's ``Invocation`` (inside a command)."""
    return (ctx or click.get_current_context()).ensure_object(Invocation)


def version() -> str:
    try:
        return importlib.metadata.version("iotfraud")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


# --- options derived from settings --------------------------------------------------------------


def click_type(info: FieldInfo) -> click.ParamType[Any]:
    """The Click type of a settings field: a choice for a Literal, a range for bounded numbers,
    else a string that pydantic parses as it parses the variable (lists, times, JSON)."""
    annotation = info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Literal:
        return click.Choice([str(choice) for choice in get_args(annotation)])
    if annotation is bool:
        return click.BOOL
    if annotation is Path:
        return click.Path(path_type=Path)
    if annotation not in (int, float):
        return click.STRING
    bounds: dict[str, Any] = {}
    for rule in info.metadata:
        if isinstance(rule, annotated_types.Ge):
            bounds["min"] = rule.ge
        elif isinstance(rule, annotated_types.Gt):
            bounds.update(min=rule.gt, min_open=True)
        elif isinstance(rule, annotated_types.Le):
            bounds["max"] = rule.le
        elif isinstance(rule, annotated_types.Lt):
            bounds.update(max=rule.lt, max_open=True)
    if annotation is int:
        return click.IntRange(**bounds) if bounds else click.INT
    return click.FloatRange(**bounds) if bounds else click.FLOAT


class SettingOption(click.Option):
    """An option that sets one settings field: ``--field-name``, typed, described and defaulted
    by the field, its help naming the variable it overrides."""

    def __init__(
        self,
        param_decls: Sequence[str] | None = None,
        *,
        settings_class: type[BaseSettings],
        field: str,
        name: str | None = None,
        **attrs: Any,
    ) -> None:
        info = settings_class.model_fields[field]
        decls = list(param_decls or []) or [f"--{field.replace('_', '-')}"]
        attrs.setdefault("type", click_type(info))
        attrs.setdefault("help", f"{info.description} ({variable_name(settings_class, field)})")
        # The field's own default, shown in the help; only a value given on the command line
        # is passed on (given_settings), so the variable still wins over this default.
        if info.default_factory is None and info.default not in (None, ""):
            attrs.setdefault("default", info.default)
            attrs.setdefault("show_default", True)
        super().__init__([*decls, name or field], **attrs)
        self.settings_class = settings_class
        self.field = field


def setting(settings_class: type[BaseSettings], field: str, *decls: str) -> Callable[[F], F]:
    """The decorator that adds the option for ``settings_class.field`` to a command."""
    return click.option(*decls, cls=SettingOption, settings_class=settings_class, field=field)


def given_settings(ctx: click.Context, cls: type[BaseSettings]) -> dict[str, Any]:
    """The fields of ``cls`` that the command line set through the command's setting options."""
    return {
        param.field: ctx.params[param.name]
        for param in ctx.command.params
        if isinstance(param, SettingOption)
        and param.name in ctx.params
        and issubclass(cls, param.settings_class)
        and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
    }


def settings_from(cls: type[S], **overrides: Any) -> S:
    """Settings ``cls`` from the environment, with what the command line set on top, then
    ``overrides``; a bad value raises ConfigError naming the variable."""
    return load_settings(cls, **{**given_settings(click.get_current_context(), cls), **overrides})


# --- global options --------------------------------------------------------------------------


def _verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        invocation(ctx).verbose = True


def _lake_root(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if param.name and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
        invocation(ctx).lake_root = value


def _env_file(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        invocation(ctx).env_file = value


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"{PROG} {version()}")
        ctx.exit(EXIT_OK)


def global_options() -> list[click.Parameter]:
    """The options every command and group takes (new objects for each)."""
    return [
        click.Option(
            ["-v", "--verbose", "global_verbose"],
            is_flag=True,
            expose_value=False,
            callback=_verbose,
            help="Show everything on the terminal: debug lines and the libraries' logs "
            "(Spark, MLflow), which otherwise go to the log file only.",
        ),
        SettingOption(
            settings_class=CommonSettings,
            field="lake_root",
            name="global_lake_root",
            expose_value=False,
            callback=_lake_root,
        ),
        click.Option(
            ["--env-file", "global_env_file"],
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            expose_value=False,
            callback=_env_file,
            help=f"Read settings from this file instead of {ENV_FILE}; variables already set in "
            "the environment win over it.",
        ),
        click.Option(
            ["--version", "global_version"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_version,
            help="Print the version and exit.",
        ),
    ]


def prepare(ctx: click.Context) -> None:
    """Before a command runs (once): the settings file into the environment, ``--lake-root``,
    then logging."""
    current = invocation(ctx)
    if current.prepared:
        return
    current.prepared = True
    current.command_path = ctx.command_path
    env_file = current.env_file or (ENV_FILE if ENV_FILE.is_file() else None)
    if env_file is not None:
        for name, value in read_env_file(env_file).items():
            if name not in os.environ:
                current.setenv(name, value)
                current.from_file[name] = env_file
    if current.lake_root is not None:
        current.setenv("IOT_LAKE_ROOT", current.lake_root)
    current.log_file = configure_logging(current.verbose)


# --- commands and groups ---------------------------------------------------------------------


def _with_context_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        **kwargs,
        "context_settings": {**CONTEXT_SETTINGS, **kwargs.get("context_settings", {})},
    }


class Command(click.Command):
    """A command with the global options; it prepares the run before its body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_with_context_settings(kwargs))
        self.params.extend(global_options())

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        pieces = self.collect_usage_pieces(ctx)
        formatter.write_usage(ctx.command_path, " ".join(pieces), prefix="usage: ")

    def invoke(self, ctx: click.Context) -> Any:
        prepare(ctx)
        return super().invoke(ctx)


class Group(click.Group):
    """A group with the global options; its subcommands and subgroups are of this module's
    classes. A group that runs without a subcommand (``invoke_without_command``) prepares the
    run as a command does."""

    command_class = Command
    group_class = type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_with_context_settings(kwargs))
        self.params.extend(global_options())
        if self.invoke_without_command and self.callback is not None:
            self.callback = _prepared_without_subcommand(self.callback)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        pieces = self.collect_usage_pieces(ctx)
        formatter.write_usage(ctx.command_path, " ".join(pieces), prefix="usage: ")


def _prepared_without_subcommand(callback: F) -> F:
    @functools.wraps(callback)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if ctx.invoked_subcommand is None:
            prepare(ctx)
        return callback(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def command(name: str | None = None, **attrs: Any) -> Callable[[Callable[..., Any]], Command]:
    """``click.command`` with this module's ``Command``."""
    return click.command(name, cls=Command, **attrs)


def group(name: str | None = None, **attrs: Any) -> Callable[[Callable[..., Any]], Group]:
    """``click.group`` with this module's ``Group``."""
    return click.group(name, cls=Group, **attrs)


# --- running a command -----------------------------------------------------------------------


def error(message: str) -> None:
    """Print ``message`` as the running command's error: ``iotfraud <command>: error: ...``."""
    _say(invocation().command_path, message)


def _say(path: str, message: str) -> None:
    click.echo(f"{path}: error: {message}", err=True)


def run(cli: click.Command, argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run ``cli`` on ``argv`` (default: the process's arguments); the exit status.

    Environment variables the run set (from the settings file, ``--lake-root``) are put back
    afterwards, so that commands run in one process (tests) do not leak into each other.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    current = Invocation(command_path=prog)
    try:
        with cli.make_context(prog, args, obj=current) as ctx:
            result = cli.invoke(ctx)
        return EXIT_OK if result is None else int(result)
    except click.exceptions.Exit as exc:  # --help, --version
        return exc.exit_code
    except click.UsageError as exc:
        if isinstance(exc, _NO_ARGS_IS_HELP):  # a group without its subcommand: its help
            click.echo(exc.format_message(), err=True)
            return EXIT_USAGE
        path = exc.ctx.command_path if exc.ctx is not None else current.command_path
        _say(path, exc.format_message())
        click.echo(f"Try '{path} --help' for help.", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:  # a runtime failure the command explains
        _say(current.command_path, exc.format_message())
        return exc.exit_code
    except click.Abort:
        return EXIT_FAILURE
    except (SetupError, ValidationError) as exc:
        message = str(config_error(exc) if isinstance(exc, ValidationError) else exc)
        _say(current.command_path, message + _set_in_file(message, current))
        return EXIT_USAGE
    except BrokenPipeError:
        # Whoever read our output has gone (`iotfraud demo | head`); the command's `finally`
        # blocks have stopped its children. Nothing more to print, and nowhere to print it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except SystemExit as exc:  # a command, or a library it calls, that exits on its own
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_FAILURE
    except Exception as exc:
        _say(current.command_path, f"{type(exc).__name__}: {exc}")
        if current.log_file is None:
            traceback.print_exc()
        else:
            log.info("%s failed", current.command_path, exc_info=True)
            if not current.verbose:
                click.echo(f"(the traceback is in {current.log_file}; -v shows it here)", err=True)
        return EXIT_FAILURE
    finally:
        current.restore()


def _set_in_file(message: str, current: Invocation) -> str:
    """Where the variables the message names were set, for those a settings file set."""
    return "".join(
        f"\n  ({name} is set in {path})"
        for name, path in current.from_file.items()
        if re.search(rf"\b{name}\b", message)
    )
