"""``iotfraud train``, ``iotfraud models list | promote VERSION | rollback``, ``iotfraud eval``.

Training needs a history source (``models.dataset.HistorySource``): ``iotfraud train``
(``iotfraud.training``) passes the simulator in.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import click

from infra.commandline import PROG, Group, command, group, run, setting, settings_from
from infra.errors import ConfigError
from infra.mlflow_store import tracking_uri
from infra.settings import load_settings
from models.settings import ModelSettings

if TYPE_CHECKING:
    from models.dataset import HistorySource

log = logging.getLogger(__name__)


def train_command(history_source: HistorySource | None) -> click.Command:
    """``train``, training on the history ``history_source`` makes (``iotfraud train`` passes the
    simulator in; without one the command says so)."""

    @command(
        "train",
        epilog="Other settings: the IOT_MODEL_* variables (iotfraud config).",
    )
    @setting(ModelSettings, "devices")
    @setting(ModelSettings, "hours")
    @setting(ModelSettings, "holdout_hours")
    @setting(ModelSettings, "seed")
    def train(**_options: object) -> int:
        """Train on simulated history, register, promote if better than the champion."""
        if history_source is None:
            raise click.UsageError(
                "this entry point has no history to train on: run `iotfraud train` (it trains "
                "on the simulator's)"
            )
        return run_train(settings_from(ModelSettings), history_source)

    return train


def run_train(settings: ModelSettings, history_source: HistorySource) -> int:
    from infra.settings import SparkSettings
    from infra.spark import build_spark_session
    from models.live_eval import format_table
    from models.train import train
    from pipeline.settings import PipelineSettings

    pipeline = load_settings(PipelineSettings)
    uri = tracking_uri(settings.mlflow_tracking_uri)
    spark = build_spark_session("iotfraud-train", load_settings(SparkSettings))
    result = train(
        spark,
        settings,
        uri,
        window=pipeline.window,
        slide=pipeline.slide,
        spec=pipeline.profile_spec(),
        history_source=history_source,
    )
    print("Held-out fleet, rules and model together:")
    print(format_table(result.report))
    print(f"false alerts per 10,000 clean device-windows: "
          f"{result.metrics['holdout_false_alerts_per_10k_clean_windows']:.2f}")  # fmt: skip
    previous = result.champion_score
    champion = "none" if previous is None else f"F1 {previous.f1:.3f}, PR-AUC {previous.pr_auc:.3f}"
    print(f"model {settings.name} version {result.version}: held-out F1 {result.score.f1:.3f}, "
          f"PR-AUC {result.score.pr_auc:.3f} (champion: {champion}) -> "
          f"{'champion' if result.promoted else 'challenger'}")  # fmt: skip
    return 0


@group("models")
def models() -> None:
    """Registered models: list, promote, roll back, sign."""


def _registry() -> tuple[Any, str]:
    """The registry's client and the model's name."""
    from models import registry

    settings = load_settings(ModelSettings)
    return registry.client(tracking_uri(settings.mlflow_tracking_uri)), settings.name


@models.command("list")
def list_versions() -> None:
    """Versions with their aliases and held-out scores."""
    from models import registry

    client, name = _registry()
    rows = registry.versions(client, name)
    if not rows:
        click.echo(f"no versions of {name}: run `iotfraud train`")
    for row in rows:
        f1 = "n/a" if row["holdout_f1"] is None else f"{row['holdout_f1']:.3f}"
        auc = "n/a" if row["holdout_pr_auc"] is None else f"{row['holdout_pr_auc']:.3f}"
        click.echo(f"{name} v{row['version']:<4} {row['aliases'] or '-':<22} "
                   f"F1 {f1:<6} PR-AUC {auc:<6} {row['created']:%Y-%m-%d %H:%M}")  # fmt: skip


@models.command()
@click.argument("version")
def promote(version: str) -> None:
    """Make VERSION the champion."""
    from models import registry

    client, name = _registry()
    try:
        old = registry.promote(client, name, version)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="VERSION") from None
    click.echo(f"{name}: champion is version {version} (was {old or 'none'})")


@models.command()
def rollback() -> None:
    """Make the previous champion the champion again."""
    from models import registry

    client, name = _registry()
    try:
        back, demoted = registry.rollback(client, name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(f"{name}: champion is version {back} again (version {demoted} is previous)")


@models.command(
    epilog="For a version registered without `iotfraud train`: loading a model runs its code, so "
    "the pipeline loads only versions whose files match a recorded digest (signed with "
    "IOT_MODEL_SIGNING_KEY when set). Check the files first."
)
@click.argument("version")
def sign(version: str) -> None:
    """Record the digest of VERSION's files, so that the pipeline loads it."""
    from infra.model_trust import sign_version
    from models import registry

    client, name = _registry()
    try:
        registry.check_version(client, name, version)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="VERSION") from None
    digest = sign_version(client, name, version, load_settings(ModelSettings).signing_key())
    click.echo(f"{name}: version {version} signed ({digest.split(':')[0]})")


@command("eval")
def evaluate() -> None:
    """Score the live alerts against ground_truth; write the evaluation table."""
    from infra.settings import CommonSettings
    from models.live_eval import evaluate_lake, format_table, write_evaluation

    lake_root = load_settings(CommonSettings).lake_root
    try:
        result = evaluate_lake(lake_root)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(format_table(result.table))
    left_out = result.left_out_line()
    if left_out:
        click.echo(left_out)
    write_evaluation(lake_root, result.table)
    click.echo(f"written to the evaluation table under {lake_root}")


def commands(history_source: HistorySource | None) -> Group:
    """The models' commands in one group: ``python -m models``, and ``iotfraud.training``."""
    cli = Group(PROG)
    for each in (train_command(history_source), models, evaluate):
        cli.add_command(each)
    return cli


def main(argv: list[str] | None = None, *, history_source: HistorySource | None = None) -> int:
    """``train | models ... | eval``; ``train`` needs ``history_source``."""
    return run(commands(history_source), argv)
