"""``iotfraud train``, ``iotfraud models list | promote VERSION | rollback``, ``iotfraud eval``.

Training needs a history source (``models.dataset.HistorySource``): ``iotfraud train``
(``iotfraud.training``) passes the simulator in.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

from infra.logs import configure_logging
from infra.mlflow_store import tracking_uri
from infra.settings import load_settings

if TYPE_CHECKING:
    from models.dataset import HistorySource

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iotfraud", description="Train, promote and evaluate.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="train on simulated history, register, promote if better than the champion",
        description="Settings come from IOT_MODEL_* variables; these flags override them.",
    )
    train.add_argument("--devices", type=int, help="fleet size of the simulated history")
    train.add_argument("--hours", type=float, help="simulated hours to train on")
    train.add_argument("--holdout-hours", type=float, help="simulated hours held out")
    train.add_argument("--seed", type=int, help="seed of the training fleet")
    # Also after the subcommand, as `iotfraud train -v` passes it.
    train.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    models = sub.add_parser("models", help="list | promote VERSION | rollback | sign VERSION")
    action = models.add_subparsers(dest="action", required=True)
    action.add_parser("list", help="versions with their aliases and held-out scores")
    promote = action.add_parser("promote", help="make VERSION the champion")
    promote.add_argument("version")
    action.add_parser("rollback", help="make the previous champion the champion again")
    sign = action.add_parser(
        "sign",
        help="record the digest of VERSION's files, so that the pipeline loads it",
        description="For a version registered without `iotfraud train`: loading a model runs its "
        "code, so the pipeline loads only versions whose files match a recorded digest (signed "
        "with IOT_MODEL_SIGNING_KEY when set). Check the files first.",
    )
    sign.add_argument("version")
    sub.add_parser("eval", help="score the live alerts against ground_truth; write evaluation")
    return parser


def run_train(args: argparse.Namespace, history_source: HistorySource) -> int:
    from infra.settings import SparkSettings
    from infra.spark import build_spark_session
    from models.live_eval import format_table
    from models.settings import ModelSettings
    from models.train import train
    from pipeline.settings import PipelineSettings

    overrides: dict[str, Any] = {k: v for k, v in {
        "devices": args.devices, "hours": args.hours, "holdout_hours": args.holdout_hours,
        "seed": args.seed}.items() if v is not None}  # fmt: skip
    settings = load_settings(ModelSettings, **overrides)
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


def run_models(args: argparse.Namespace) -> int:
    from infra.model_trust import sign_version
    from models import registry
    from models.settings import ModelSettings

    settings = load_settings(ModelSettings)
    client = registry.client(tracking_uri(settings.mlflow_tracking_uri))
    name = settings.name
    try:
        if args.action == "promote":
            old = registry.promote(client, name, args.version)
            print(f"{name}: champion is version {args.version} (was {old or 'none'})")
        elif args.action == "sign":
            registry.check_version(client, name, args.version)
            digest = sign_version(client, name, args.version, settings.signing_key())
            print(f"{name}: version {args.version} signed ({digest.split(':')[0]})")
        elif args.action == "rollback":
            back, demoted = registry.rollback(client, name)
            print(f"{name}: champion is version {back} again (version {demoted} is previous)")
        else:
            rows = registry.versions(client, name)
            if not rows:
                print(f"no versions of {name}: run `iotfraud train`")
            for row in rows:
                f1 = "n/a" if row["holdout_f1"] is None else f"{row['holdout_f1']:.3f}"
                auc = "n/a" if row["holdout_pr_auc"] is None else f"{row['holdout_pr_auc']:.3f}"
                print(f"{name} v{row['version']:<4} {row['aliases'] or '-':<22} "
                      f"F1 {f1:<6} PR-AUC {auc:<6} {row['created']:%Y-%m-%d %H:%M}")  # fmt: skip
    except ValueError as exc:
        print(f"iotfraud models {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0


def run_eval() -> int:
    from infra.settings import CommonSettings
    from models.live_eval import evaluate_lake, format_table, write_evaluation

    lake_root = load_settings(CommonSettings).lake_root
    try:
        result = evaluate_lake(lake_root)
    except FileNotFoundError as exc:
        print(f"iotfraud eval: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    write_evaluation(lake_root, result)
    print(f"written to the evaluation table under {lake_root}")
    return 0


def main(argv: list[str] | None = None, *, history_source: HistorySource | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    if args.command == "train":
        if history_source is None:
            print("training needs the simulator's history: run `iotfraud train`", file=sys.stderr)
            return 2
        return run_train(args, history_source)
    if args.command == "models":
        return run_models(args)
    return run_eval()
