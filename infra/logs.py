"""Logging set-up for the command-line entry points (library code only calls getLogger)."""

from __future__ import annotations

import logging
import os


def configure_logging(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else getattr(logging, os.environ.get("IOT_LOG_LEVEL", "INFO"))
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", force=True
    )
    for noisy in ("py4j", "urllib3", "alembic", "mlflow.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
