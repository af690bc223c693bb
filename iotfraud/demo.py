"""``iotfraud demo``: bring the local stack up and report it healthy.

Later stages (simulator, pipeline, model, dashboard) join the demo as they land.
"""

from __future__ import annotations

import argparse

from infra import stack
from infra.logs import configure_logging
from infra.settings import CommonSettings, StackSettings, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iotfraud demo", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    status = stack.up(load_settings(StackSettings), load_settings(CommonSettings))
    print("\n".join(status.lines()))
    print("stack healthy" if status.healthy else "stack NOT healthy")
    return 0 if status.healthy else 1
