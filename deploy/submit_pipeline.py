"""The pipeline's entry point for ``spark-submit``, which runs a Python file rather than a module.

``spark-submit [options] deploy/submit_pipeline.py run`` is ``iotfraud pipeline run`` (the
arguments after the file go to ``iotfraud pipeline``; none means ``run``). The job reads its
settings from the environment as usual; set ``IOT_SPARK_RESOLVE_JARS=false`` (spark-submit's
``--packages`` provides the Kafka and Delta jars) and ``IOT_SPARK_MASTER`` to the ``--master``
given here, because the session builder sets the master itself.
"""

from __future__ import annotations

import sys

from iotfraud.cli import main


def run(argv: list[str]) -> int:
    """``iotfraud pipeline <argv>``: a bad setting ends with its message and exit status 2."""
    return main(["pipeline", *(argv or ["run"])])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
