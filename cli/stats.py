"""``modgate stats``: the gateway's recent window (``GET /stats``) as a table."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from cli.gateway_url import DEFAULT_GATEWAY_URL, GatewayUrl, OldUrl, gateway_url
from gateway.telemetry.windows import LATENCIES

_LATENCY_NAMES = {
    "end_to_end": "end to end",
    "ttft": "time to first token",
    "queue_wait": "queue wait",
    "shaping": "shaping",
    "decode": "decode",
}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _percent(value: float | None) -> str:
    return "– (nothing measured)" if value is None else f"{100 * value:.1f} %"


def render_stats(document: dict[str, Any], console: Console) -> None:
    """Print the ``GET /stats`` document: a latency table, then throughput, thinking and cache rates."""
    window = document["window_s"]
    covered = document["covered_s"]
    title = f"last {window:g} s" if covered >= window else f"last {covered:,.0f} s (window {window:g} s)"
    table = Table(title=f"modgate latency, {title}")
    table.add_column("latency (ms)")
    for column in ("count", "p50", "p95", "p99"):
        table.add_column(column, justify="right")
    for name in LATENCIES:
        row = document["latency_ms"][name]
        figures = (_ms(row[q]) for q in ("p50", "p95", "p99"))
        table.add_row(_LATENCY_NAMES[name], f"{row['count']:,}", *figures)
    console.print(table)
    cache = document["cache"]
    block = cache.get("engine_block_size")
    facts = Table(show_header=False, box=None)
    facts.add_column()
    facts.add_column(justify="right")
    facts.add_row("keyframes", f"{document['keyframes']:,}")
    facts.add_row("keyframes per minute", f"{document['keyframes_per_minute']:,.1f}")
    facts.add_row("thinking on (share of engine calls)", _percent(document["thinking_share"]))
    facts.add_row("verdicts reused", _percent(document.get("reused_share")))
    facts.add_row("cached / prompt tokens, gateway's calls", _percent(cache["gateway_cached_share"]))
    facts.add_row("engine prefix-cache hit rate, window", _percent(cache["engine_window_hit_rate"]))
    if block is not None:
        facts.add_row("engine KV block", f"{block:,} tokens")
    elif cache.get("engine_block_note"):
        facts.add_row("engine KV block", f"none: {cache['engine_block_note']}")
    else:
        facts.add_row("engine KV block", "unknown")
    if "inflight" in document:
        facts.add_row("in flight / queued", f"{document['inflight']} / {document['queued']}")
    if "thinking_default" in document:
        facts.add_row("thinking policy default", str(document["thinking_default"]))
    console.print(facts)
    if cache.get("engine_scrape_error"):
        console.print(f"engine /metrics unreadable: {cache['engine_scrape_error']}")
    if document.get("tenants"):
        render_tenants(document["tenants"], console)


def render_tenants(rows: list[dict[str, Any]], console: Console) -> None:
    """One line per tenant: keyframes, the verdicts it got (after its moderation policy), its p95."""
    table = Table(title="by tenant")
    for column in ("tenant", "keyframes", "per minute", "block", "review", "thinking on", "e2e p95 ms"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for row in rows:
        table.add_row(
            row["tenant"], f"{row['keyframes']:,}", f"{row['keyframes_per_minute']:,.1f}",
            _percent(row.get("block_share")), _percent(row.get("review_share")),
            _percent(row.get("thinking_share")), _ms(row["latency_ms"]["end_to_end"]["p95"]),
        )
    console.print(table)


def stats(
    url: GatewayUrl = DEFAULT_GATEWAY_URL,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw GET /stats document.")] = False,
    old_url: OldUrl = None,
) -> None:
    """Latency percentiles, keyframes per minute, thinking share and cache hit rates over recent minutes."""
    url = gateway_url(url, old_url)
    try:
        response = httpx.get(f"{url.rstrip('/')}/stats", timeout=10.0)
        response.raise_for_status()
        document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        typer.secho(f"cannot read {url}/stats: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    render_stats(document, Console(width=100))
