"""``iotfraud sql "SELECT ..."``: Spark SQL over the lake's tables, each registered by its name.

Every Delta table under the lake root (telemetry, alerts, features, devices, ...) is a view named
after its folder, so analysts write ``SELECT * FROM alerts`` against a local folder or object
storage alike. The result is printed as a table, or written as CSV or Parquet.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from infra import lake
from infra.logs import configure_logging
from infra.settings import CommonSettings, SparkSettings, load_settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

FORMATS = ("table", "csv", "parquet")


def register_tables(spark: SparkSession, lake_root: str) -> list[str]:
    """Register each existing lake table as a temporary view named after it; return the names."""
    from delta.tables import DeltaTable

    registered = []
    for table in lake.TABLES:
        path = lake.table_path(lake_root, table)
        if DeltaTable.isDeltaTable(spark, path):
            spark.read.format("delta").load(path).createOrReplaceTempView(table)
            registered.append(table)
    return registered


def format_rows(df: DataFrame, max_rows: int) -> str:
    """At most ``max_rows`` rows as an aligned text table, saying when more were left out."""
    rows = df.limit(max_rows + 1).toPandas()
    if rows.empty:
        return "(no rows)"
    text = rows.head(max_rows).to_string(index=False, max_colwidth=60)
    if len(rows) > max_rows:
        text += f"\n(first {max_rows} rows shown; use --max-rows or --output for more)"
    return text


def write_result(df: DataFrame, output: str, fmt: str) -> None:
    """Write the result with Spark: a folder of part files, local or on object storage."""
    writer = df.write.mode("overwrite")
    if fmt == "csv":
        writer.option("header", True).csv(output)
    else:
        writer.parquet(output)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iotfraud sql",
        description="Run Spark SQL over the lake's tables (telemetry, alerts, features, devices, "
        "quarantine, pipeline_metrics, ground_truth, alert_feedback, evaluation).",
    )
    parser.add_argument("query", help='the SQL, e.g. "SELECT alert_type, count(*) FROM alerts '
                                      'GROUP BY 1"')  # fmt: skip
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="table (default); csv or parquet with --output (default: the output's extension)",
    )
    parser.add_argument("--output", help="write the result to this folder instead of printing")
    parser.add_argument("--max-rows", type=int, default=100, help="rows printed (default 100)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def output_format(output: str | None, fmt: str | None) -> str:
    """The format to use; a clear error when it does not fit the arguments."""
    if output is None:
        if fmt not in (None, "table"):
            raise ValueError(f"--format {fmt} needs --output PATH")
        return "table"
    if fmt in ("csv", "parquet"):
        return fmt
    for candidate in ("csv", "parquet"):
        if output.rstrip("/").endswith("." + candidate):
            return candidate
    raise ValueError("--output needs --format csv or --format parquet (or a .csv/.parquet name)")


def main(argv: list[str] | None = None) -> int:
    from pyspark.errors import AnalysisException, ParseException

    from infra.spark import build_spark_session

    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        fmt = output_format(args.output, args.format)
    except ValueError as exc:
        print(f"iotfraud sql: {exc}", file=sys.stderr)
        return 2
    common = load_settings(CommonSettings)
    spark = build_spark_session("iotfraud-sql", load_settings(SparkSettings))
    tables = register_tables(spark, common.lake_root)
    try:
        result = spark.sql(args.query)
        if fmt == "table":
            print(format_rows(result, args.max_rows))
        else:
            write_result(result, args.output, fmt)
            print(f"wrote {fmt} to {args.output}", file=sys.stderr)
    except (AnalysisException, ParseException) as exc:
        first_line = str(exc).strip().splitlines()[0]
        print(f"iotfraud sql: {first_line}\ntables in {common.lake_root}: "
              f"{', '.join(tables) or '(none yet)'}", file=sys.stderr)  # fmt: skip
        return 2
    return 0
