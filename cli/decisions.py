"""``modgate decisions export``: the decision log from a time on, as JSON lines or Parquet."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from contracts.decisions import (
    DecisionRow,
    archive_missing,
    day_partitions,
    decision_schema,
    tenant_decisions,
)
from gateway.renamed_settings import option_envvars, warn_if_read_by_old_name

REDIS_URL = "MODGATE_REDIS__URL"

decisions_app = typer.Typer(help="The decision log: every verdict answered, for an auditor.",
                            no_args_is_help=True)


def _since(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO 8601 time: {value!r} (e.g. 2026-12-03 or 2026-12-03T08:00Z)",
                                 param_hint="--since") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # a time without a zone is UTC


async def decision_rows(redis_url: str | None, stream: str, archive_dir: Path, since: datetime,
                tenant: str | None) -> list[DecisionRow]:
    from gateway.decisions.log import RedisDecisionLog, export_rows  # the service's modules: imported late
    from gateway.http.services import redis_client
    from gateway.settings import DecisionSettings

    if day_partitions(archive_dir) and (missing := archive_missing()) is not None:
        raise typer.BadParameter(missing, param_hint="--archive-dir")  # files another install archived
    if redis_url is None:
        return await export_rows(None, archive_dir, since, tenant)
    client = redis_client(redis_url)
    try:
        live = RedisDecisionLog(client, DecisionSettings(stream=stream, archive_dir=archive_dir))
        return await export_rows(live, archive_dir, since, tenant)
    finally:
        await client.aclose()


def write_export(rows: list[DecisionRow], out_format: Literal["jsonl", "parquet"], out: Path | None) -> None:
    """JSON lines (to ``out`` or standard output) or one Parquet file (``out`` required)."""
    if out_format == "parquet":
        if out is None:
            raise typer.BadParameter("--format parquet needs --out FILE", param_hint="--out")
        if (missing := archive_missing()) is not None:
            raise typer.BadParameter(missing, param_hint="--format")
        import pyarrow as pa  # the archive extra (checked above)
        import pyarrow.parquet as pq

        dumped = [row.model_dump(mode="python") for row in rows]
        table = pa.Table.from_pylist(dumped, schema=decision_schema())
        pq.write_table(table, out, compression="zstd")
        return
    lines = "".join(row.model_dump_json() + "\n" for row in rows)
    if out is None:
        sys.stdout.write(lines)
    else:
        out.write_text(lines, encoding="utf-8")


@decisions_app.command("export")
def export(
    since: Annotated[str, typer.Option("--since", help="From this ISO 8601 time on (UTC without a zone).")],
    tenant: Annotated[str | None, typer.Option("--tenant", help="This tenant's decisions only.")] = None,
    out_format: Annotated[
        Literal["jsonl", "parquet"], typer.Option("--format", help="jsonl (a JSON object a line) or parquet.")
    ] = "jsonl",
    out: Annotated[Path | None, typer.Option("--out", help="The file to write (jsonl: else stdout).")] = None,
    redis_url: Annotated[str | None, typer.Option(
        "--redis-url", envvar=option_envvars(REDIS_URL), callback=warn_if_read_by_old_name(REDIS_URL),
        help="The gateways' Redis (decisions not archived yet).",
    )] = None,
    stream: Annotated[str, typer.Option("--stream", envvar="MODGATE_DECISIONS__STREAM")] = (
        "modgate:decisions"
    ),
    archive_dir: Annotated[Path, typer.Option(
        "--archive-dir", envvar="MODGATE_DECISIONS__ARCHIVE_DIR", help="The daily Parquet folders."
    )] = Path("var/decisions"),
) -> None:
    """Write one row per decision from ``--since`` on: the archive's days, then what Redis still holds."""
    rows = asyncio.run(decision_rows(redis_url or None, stream, archive_dir, _since(since), tenant))
    write_export(rows, out_format, out)
    if out is not None:
        typer.echo(f"{len(rows)} decision(s) written to {out}", err=True)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


@decisions_app.command("summary")
def summary(
    since: Annotated[str, typer.Option("--since", help="From this ISO 8601 time on (UTC without a zone).")],
    tenant: Annotated[str | None, typer.Option("--tenant", help="This tenant only.")] = None,
    redis_url: Annotated[str | None, typer.Option(
        "--redis-url", envvar=option_envvars(REDIS_URL), callback=warn_if_read_by_old_name(REDIS_URL)
    )] = None,
    stream: Annotated[str, typer.Option("--stream", envvar="MODGATE_DECISIONS__STREAM")] = (
        "modgate:decisions"
    ),
    archive_dir: Annotated[Path, typer.Option("--archive-dir", envvar="MODGATE_DECISIONS__ARCHIVE_DIR")] = (
        Path("var/decisions")
    ),
) -> None:
    """Per tenant: decisions, block and review shares, verdicts its policy changed, and people's agreement."""
    rows = asyncio.run(decision_rows(redis_url or None, stream, archive_dir, _since(since), tenant))
    table = Table(title=f"decisions since {since}")
    for column in ("tenant", "decisions", "block", "review", "changed by policy", "engine failures",
                   "labelled", "label agrees"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for figures in tenant_decisions(rows):
        table.add_row(
            figures.tenant, f"{figures.decisions:,}", _share(figures.block_share),
            _share(figures.review_share), f"{figures.changed_by_policy:,}", f"{figures.engine_failures:,}",
            f"{figures.labelled:,}",
            _share(figures.label_agreement),
        )
    Console(width=120).print(table)
