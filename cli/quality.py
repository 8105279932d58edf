"""`modgate quality …`: offline A/B runs and the weekly report."""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from contracts.records import (
    JsonlRecordStore,
    MirroredRecordStore,
    RecordStore,
    RedisRecordStore,
    format_iso_week,
    iso_week_of,
    parse_iso_week,
    week_bounds,
)
from contracts.summaries import EngineKind
from gateway.renamed_settings import option_envvars, warn_if_read_by_old_name
from gateway.state import RedisUrlError, check_redis_url, open_redis
from quality.runner import (
    DatasetError,
    ProgressEvent,
    RunSummary,
    load_dataset,
    load_labels,
    parse_arms,
    run_offline,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from contracts.decisions import DecisionRow
    from quality.report import ReportPolicy, WeekSummary

__all__ = ["quality_app"]

DEFAULT_RECORDS = Path("var/quality/records")
DEFAULT_REPORTS = Path("var/quality/reports")
REDIS_URL = "MODGATE_REDIS__URL"

quality_app = typer.Typer(
    help="Measure what turning thinking off costs in verdicts: offline A/B runs and weekly reports.",
    no_args_is_help=True,
)
console = Console(stderr=True)


class SourceFilter(StrEnum):
    all = "all"
    shadow = "shadow"
    offline = "offline"


def previous_week(now: datetime | None = None) -> str:
    """The last complete ISO week (UTC): what a Monday-morning schedule reports on."""
    moment = (now or datetime.now(UTC)) - timedelta(days=7)
    return format_iso_week(*iso_week_of(moment))


def resolve_week(text: str, now: datetime | None = None) -> str:
    if text.strip().lower() in ("last", "previous"):
        return previous_week(now)
    if text.strip().lower() in ("current", "this"):
        return format_iso_week(*iso_week_of(now or datetime.now(UTC)))
    return format_iso_week(*parse_iso_week(text))


@asynccontextmanager
async def open_store(
    records: Path | None, redis_url: str | None, *, mirror: bool
) -> AsyncIterator[RecordStore]:
    """Files in `records`, Redis at `redis_url`, or both (`mirror`: write to both, read the files).

    `redis_url` is read as `modgate serve` reads MODGATE_REDIS__URL (gateway/state.py): redis://, rediss://,
    unix://, or redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB] (the primary found through Sentinel).
    """
    # A report reads a week's stream in pages: a slower read than a request's is fine, a dead Redis is not.
    client = open_redis(redis_url, socket_connect_timeout=2.0, socket_timeout=30.0) if redis_url else None
    store: RecordStore
    if client is not None and records is not None and mirror:
        store = MirroredRecordStore(JsonlRecordStore(records), RedisRecordStore(client))
    elif records is not None:
        store = JsonlRecordStore(records)
    elif client is not None:
        store = RedisRecordStore(client)
    else:
        store = JsonlRecordStore(DEFAULT_RECORDS)
    try:
        yield store
    finally:
        await store.aclose()
        if client is not None:
            await client.aclose()


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def _check_redis_url(redis_url: str | None) -> None:
    """Refuse a Redis URL `modgate serve` would refuse, with its reason (exit 2)."""
    if redis_url:
        try:
            check_redis_url(redis_url)
        except RedisUrlError as exc:
            raise _fail(str(exc)) from exc


# What the `quality` extra brings (pyproject.toml), by import name: `pip install .` leaves them out.
QUALITY_EXTRA_MODULES = (
    "scipy", "sklearn", "statsmodels", "matplotlib", "duckdb", "threadpoolctl"
)


def _require_quality_extra() -> None:
    """Stop with the install command when the report's packages are missing, before any import fails."""
    missing = [name for name in QUALITY_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise _fail(
            f"this command needs the quality extra ({', '.join(missing)} not installed): "
            "pip install 'modgate[quality]'"
        )


@quality_app.command()
def run(
    dataset: Annotated[
        Path, typer.Argument(help="A folder of keyframes (jpg/png/webp) or a CSV/JSONL manifest.")
    ],
    arms: Annotated[
        str, typer.Option(help="Comma-separated arms: thinking_on, thinking_off, thinking_on_rerun.")
    ] = "thinking_on,thinking_off",
    gateway_url: Annotated[
        str, typer.Option(envvar="MODGATE_GATEWAY_URL", help="Base URL of the gateway.")
    ] = "http://127.0.0.1:8080",
    api_key: Annotated[
        str | None, typer.Option(envvar="MODGATE_QUALITY_API_KEY", help="Bearer key the gateway expects.")
    ] = None,
    model: Annotated[
        str, typer.Option(help="The `model` field of each moderation request.")
    ] = "modgate-moderation",
    tenant: Annotated[str, typer.Option(help="Tenant recorded on each verdict.")] = "offline",
    out: Annotated[Path, typer.Option(help="Directory of weekly JSONL record files.")] = DEFAULT_RECORDS,
    redis_url: Annotated[
        str | None,
        typer.Option(envvar=option_envvars(REDIS_URL), callback=warn_if_read_by_old_name(REDIS_URL),
                     help="Also append records to this Redis stream."),
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="Human labels CSV: path or frame_sha256, and label or flagged.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Frames in flight at once.")] = 4,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for one verdict.")] = 300.0,
    engine: Annotated[
        EngineKind, typer.Option(help="The kind of engine behind --gateway-url (recorded on each verdict).")
    ] = EngineKind.vllm,
    second_gateway_url: Annotated[
        str | None,
        typer.Option(help="A gateway in front of a second engine: every frame and arm is judged there too."),
    ] = None,
    second_engine: Annotated[
        EngineKind, typer.Option(help="The kind of engine behind --second-gateway-url.")
    ] = EngineKind.llamacpp,
) -> None:
    """Send every keyframe through the gateway under each arm and record paired verdicts.

    With `--second-gateway-url` the engine is an arm too: the same frames and arms go to a second
    gateway (in front of, say, llama.cpp), and the weekly report compares the engines.
    Interrupt it at any time: running the same command again skips what is already recorded.
    """
    _check_redis_url(redis_url)
    try:
        chosen_arms = parse_arms(arms)
        keyframes = load_dataset(dataset)
        label_table = load_labels(labels) if labels is not None else None
    except DatasetError as exc:
        raise _fail(str(exc)) from exc
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if second_gateway_url is not None and second_engine is engine:
        raise _fail(f"both gateways are named {engine.value}: give --second-engine the other engine's kind")
    engines = 1 if second_gateway_url is None else 2

    async def main() -> RunSummary:
        async with (
            open_store(out, redis_url, mirror=True) as store,
            httpx.AsyncClient(base_url=gateway_url, headers=headers, timeout=timeout) as client,
            httpx.AsyncClient(
                base_url=second_gateway_url or gateway_url, headers=headers, timeout=timeout
            ) as second,
        ):
            with Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
            ) as progress:
                task = progress.add_task(
                    f"{len(keyframes):,} frames × {len(chosen_arms)} arms × {engines} engines",
                    total=len(keyframes) * len(chosen_arms) * engines,
                    status="",
                )
                counts = {"sent": 0, "skipped": 0, "failed": 0}

                def on_progress(event: ProgressEvent) -> None:
                    counts[event.outcome] += 1
                    status = f"sent {counts['sent']:,} · skipped {counts['skipped']:,}"
                    if counts["failed"]:
                        status += f" · [red]failed {counts['failed']:,}[/]"
                    progress.update(task, advance=1, status=status)

                return await run_offline(
                    keyframes,
                    chosen_arms,
                    client=client,
                    store=store,
                    model=model,
                    tenant=tenant,
                    labels=label_table,
                    concurrency=concurrency,
                    on_progress=on_progress,
                    engine=engine.value,
                    other_engines=[(second_engine.value, second)] if second_gateway_url else [],
                )

    try:
        summary = asyncio.run(main())
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: recorded verdicts are kept; run the same command to continue.")
        raise typer.Exit(130) from None
    sent, skipped = sum(summary.sent.values()), sum(summary.skipped.values())
    per_arm = ", ".join(f"{arm} {n:,}" for arm, n in summary.sent.items()) or "none"
    console.print(
        f"recorded {sent:,} verdicts ({per_arm}), "
        f"skipped {skipped:,} already recorded, {summary.labelled:,} with human labels → {out}"
    )
    if summary.total_failed:
        for error in summary.errors:
            console.print(f"  [red]failed[/] {error}")
        raise _fail(f"{summary.total_failed:,} verdicts failed; run again to retry them", code=1)


async def _week_input(
    store: RecordStore, directory: Path | None, label: str, scratch: Path
) -> Path | pa.Table | None:
    """A week's records as columns: its Parquet partition (or JSONL file, converted in batches) when the
    records are files, else the store's records (the Redis stream) as an arrow table."""
    from quality.columnar import records_table, week_source, write_week_partition

    year, number = parse_iso_week(label)
    if directory is not None:
        return await asyncio.to_thread(week_source, directory, year, number, scratch / label)
    if isinstance(store, RedisRecordStore):
        # a page of the stream at a time into Parquet: never the whole week as objects
        written = []
        async for page in store.pages(*week_bounds(year, number)):
            if page:
                table = records_table(page)
                written += await asyncio.to_thread(write_week_partition, table, scratch / label)
        return scratch / label if written else None
    records = await store.read_week(year, number)
    return records_table(records) if records else None


async def _trend(
    store: RecordStore,
    directory: Path | None,
    reports: Path,
    week: str,
    weeks: int,
    policy: ReportPolicy,
    scratch: Path,
) -> list[WeekSummary]:
    """Earlier weeks from reports already written; weeks without one are recomputed from the records."""
    from quality.report import build_weekly_report_from, load_previous_summaries

    known = {s.week: s for s in load_previous_summaries(reports, week, limit=weeks)}
    year, number = parse_iso_week(week)
    start, _ = week_bounds(year, number)
    for back in range(1, weeks + 1):
        label = format_iso_week(*iso_week_of(start - timedelta(days=7 * back)))
        if label in known:
            continue
        source = await _week_input(store, directory, label, scratch)
        if source is not None:
            earlier = await asyncio.to_thread(build_weekly_report_from, source, label, policy)
            if earlier.data.records:
                known[label] = earlier.summary()
    return sorted(known.values(), key=lambda s: s.week)[-weeks:]


async def _decision_rows(
    archive_dir: Path | None, redis_url: str | None, stream: str, week: str
) -> list[DecisionRow]:
    """The decision log's rows of a week: the archive's days, then the stream's (as the export reads them)."""
    from cli.decisions import decision_rows  # the service's modules: imported late

    year, number = parse_iso_week(week)
    start, end = week_bounds(year, number)
    rows = await decision_rows(redis_url, stream, archive_dir or Path("var/decisions"), start, None)
    return [row for row in rows if row.decided_at < end]


@quality_app.command()
def report(
    week: Annotated[
        str, typer.Option(help="ISO week like 2026-W48, or `last` for the last complete week.")
    ] = "last",
    records: Annotated[
        Path | None,
        typer.Option(
            help=f"Directory of records: Parquet weeks and JSONL files (default {DEFAULT_RECORDS})."
        ),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(envvar=option_envvars(REDIS_URL), callback=warn_if_read_by_old_name(REDIS_URL),
                     help="Read records from this Redis stream."),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Where the HTML, Markdown and JSON reports go.")
    ] = DEFAULT_REPORTS,
    min_agreement: Annotated[float, typer.Option(min=0.0, max=1.0, help="Policy minimum agreement.")] = 0.97,
    min_flagged_agreement: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Policy minimum agreement on flagged frames.")
    ] = 0.90,
    trend_weeks: Annotated[int, typer.Option(min=0, max=52, help="Earlier weeks in the trend chart.")] = 8,
    source: Annotated[SourceFilter, typer.Option(help="Which records count.")] = SourceFilter.all,
    bootstrap: Annotated[int, typer.Option(min=100, help="Bootstrap resamples (whole videos).")] = 2000,
    decisions: Annotated[
        Path | None,
        typer.Option(
            envvar="MODGATE_DECISIONS__ARCHIVE_DIR",
            help="The decision log's daily Parquet folders: its labels score each arm against people, its "
            "decisions give each tenant's block rate (with --decisions-redis-url, the live stream too).",
        ),
    ] = None,
    decisions_redis_url: Annotated[
        str | None, typer.Option(help="The gateways' Redis: decisions and labels not archived yet.")
    ] = None,
    decisions_stream: Annotated[
        str, typer.Option(envvar="MODGATE_DECISIONS__STREAM", help="The decision log's stream.")
    ] = "modgate:decisions",
    min_threshold_labels: Annotated[
        int, typer.Option(min=1, help="Labelled frames judged both ways needed to choose the escalation "
                          "threshold from labels (else: from thinking-on agreement).")
    ] = 200,
) -> None:
    """Write the weekly quality report (HTML, Markdown, JSON), led by a recommendation."""
    _require_quality_extra()
    # matplotlib, scikit-learn and statsmodels take seconds to import: only this command pays for them
    from quality.report import ReportPolicy, build_weekly_report_from, limit_malloc_arenas, write_report

    limit_malloc_arenas()
    _check_redis_url(redis_url)
    try:
        label = resolve_week(week)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if min_agreement <= 0 or min_flagged_agreement <= 0:
        raise _fail("thresholds must be above 0")
    policy = ReportPolicy(
        min_agreement=min_agreement,
        min_flagged_agreement=min_flagged_agreement,
        bootstrap_resamples=bootstrap,
        min_threshold_labels=min_threshold_labels,
    )
    _check_redis_url(decisions_redis_url)
    directory = records if records is not None else (None if redis_url else DEFAULT_RECORDS)

    async def main(scratch: Path) -> tuple[str, str, list[Path]]:
        from quality.columnar import RECORD_SCHEMA

        async with open_store(records, None if records is not None else redis_url, mirror=False) as store:
            week_input = await _week_input(store, directory, label, scratch)
            previous = (
                await _trend(store, directory, out, label, trend_weeks, policy, scratch)
                if trend_weeks
                else []
            )
        logged = (
            await _decision_rows(decisions, decisions_redis_url, decisions_stream, label)
            if decisions is not None or decisions_redis_url
            else None
        )
        built = await asyncio.to_thread(
            build_weekly_report_from,
            week_input if week_input is not None else RECORD_SCHEMA.empty_table(),
            label,
            policy,
            previous,
            only_source=None if source is SourceFilter.all else source.value,
            decisions=logged,
        )
        files = await asyncio.to_thread(write_report, built, out)
        return (
            built.recommendation.title,
            built.recommendation.headline,
            [files.html, files.markdown, files.json],
        )

    with tempfile.TemporaryDirectory(prefix="modgate-quality-") as scratch:
        title, headline, paths = asyncio.run(main(Path(scratch)))
    console.print(f"[bold]{label} · {title}[/]")
    console.print(headline, highlight=False)
    for path in paths:
        typer.echo(str(path))


@quality_app.command()
def convert(
    records: Annotated[
        Path, typer.Option(help="Directory of JSONL record files; Parquet weeks are written beside them.")
    ] = DEFAULT_RECORDS,
    replace: Annotated[
        bool, typer.Option(help="Convert weeks that already have a Parquet partition again.")
    ] = False,
) -> None:
    """Convert the JSONL weeks under a records directory to Parquet partitions (`week=2026-W48/`).

    The JSONL files stay (the gateway appends to them); the report reads a week's Parquet partition when
    it is at least as new as the week's JSONL file.
    """
    _require_quality_extra()
    from quality.columnar import convert_jsonl_weeks

    if not records.is_dir():
        raise _fail(f"{records} is not a directory of quality records")
    converted = convert_jsonl_weeks(records, replace=replace)
    if not converted:
        console.print(f"nothing to convert in {records} (every JSONL week has its Parquet partition)")
    for label, rows in converted.items():
        typer.echo(f"{label}: {rows:,} records → {records / f'week={label}'}")
