"""``iotfraud sql "SELECT ..."``: Spark SQL over the lake's tables, each registered by its name.

Every Delta table under the lake root (telemetry, alerts, features, devices, ...) is a view named
after its folder, so analysts write ``SELECT * FROM alerts`` against a local folder or object
storage alike. The result is printed as a table, or written as CSV or Parquet.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import click

from infra import lake
from infra.commandline import command, run
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


@command(
    "sql",
    epilog=f"Tables: {', '.join(lake.TABLES)} (those that exist under the lake root).",
)
@click.argument("query")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="table (default); csv or parquet with --output (default: the output's extension).",
)
@click.option("--output", help="Write the result to this folder instead of printing it.")
@click.option(
    "--max-rows", type=click.IntRange(min=1), default=100, show_default=True, help="Rows printed."
)
def sql(query: str, fmt: str | None, output: str | None, max_rows: int) -> None:
    """Run Spark SQL over the lake's tables, each a view named after it, e.g.
    iotfraud sql "SELECT alert_type, count(*) FROM alerts GROUP BY 1"."""
    from pyspark.errors import AnalysisException, ParseException

    from infra.spark import build_spark_session

    try:
        fmt = output_format(output, fmt)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    common = load_settings(CommonSettings)
    spark = build_spark_session("iotfraud-sql", load_settings(SparkSettings))
    tables = register_tables(spark, common.lake_root)
    try:
        result = spark.sql(query)
        if output is None:
            click.echo(format_rows(result, max_rows))
        else:
            write_result(result, output, fmt)
            click.echo(f"wrote {fmt} to {output}", err=True)
    except (AnalysisException, ParseException) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise click.BadParameter(
            f"{first_line}\ntables in {common.lake_root}: {', '.join(tables) or '(none yet)'}",
            param_hint="QUERY",
        ) from None


def main(argv: list[str] | None = None) -> int:
    """``iotfraud sql``."""
    return run(sql, argv, prog="iotfraud sql")
