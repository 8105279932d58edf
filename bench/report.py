"""A benchmark's report: its tables printed, in Markdown too with ``--markdown``, as JSON with ``--json``."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

Report = dict[str, Any]


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--markdown``, the last of a benchmark's options."""
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--markdown", action="store_true", help="also print the table in Markdown")


def machine_load() -> str:
    """The machine the figures come from, for the first line a benchmark prints."""
    return f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"


def load_average() -> list[float]:
    """The machine's load averages over 1, 5 and 15 minutes, for the report's setup."""
    return [round(x, 2) for x in os.getloadavg()]


def publish(
    report: Report,
    args: argparse.Namespace,
    print_tables: Callable[[Report], None],
    print_markdown: Callable[[Report], None],
) -> None:
    """Print the tables, then the Markdown if asked; write the JSON if asked."""
    print_tables(report)
    if args.markdown:
        print_markdown(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
