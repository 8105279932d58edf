"""`modgate deploy …`: the deploy commands, registered in cli/main.py (`app.add_typer`)."""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from deploy.check import (
    CheckReport,
    Finding,
    Location,
    UnreadableInputError,
    check_deploy,
    find_compose_files,
)

deploy_app = typer.Typer(
    name="deploy",
    help="Check and operate the DGX Spark deployment.",
    no_args_is_help=True,
    add_completion=False,
)

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}

# The compose files both `deploy check` and `deploy predict` read, named the same way.
ComposePaths = Annotated[
    list[Path] | None,
    typer.Argument(
        help="Compose files or folders holding one, merged in order like `docker compose -f a -f b`. "
        "Default: the current folder.",
        show_default=False,
    ),
]


class OutputFormat(StrEnum):
    """How `deploy check` prints its findings."""

    text = "text"
    json = "json"


@deploy_app.callback()
def _deploy() -> None:
    """Check and operate the DGX Spark deployment."""


@deploy_app.command("check")
def check(
    paths: ComposePaths = None,
    env_file: Annotated[
        Path | None,
        typer.Option(
            "--env-file",
            help="The .env to resolve ${VAR} from. Default: .env beside the first compose file, "
            "else .env.example there.",
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="text or json.")
    ] = OutputFormat.text,
    skip_compose_config: Annotated[
        bool,
        typer.Option("--skip-compose-config", help="Do not run `docker compose config -q`."),
    ] = False,
) -> None:
    """Check compose files and .env against the deploy rules; exit 1 on errors, 2 on unreadable input."""
    try:
        files = find_compose_files(paths or [Path.cwd()])
        report = check_deploy(
            files, env_file=env_file, environ=os.environ, compose_config=not skip_compose_config
        )
    except UnreadableInputError as exc:
        if output_format is OutputFormat.json:
            sys.stdout.write(json.dumps({"error": str(exc)}) + "\n")
        else:
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                Text(f"modgate deploy check: {exc}", style="bold red")
            )
        raise typer.Exit(2) from exc
    if output_format is OutputFormat.json:
        sys.stdout.write(json.dumps(report_as_json(report), indent=2) + "\n")
    else:
        print_report(report, Console(highlight=False, soft_wrap=True))
    raise typer.Exit(1 if report.errors else 0)


@deploy_app.command("predict")
def predict_command(
    paths: ComposePaths = None,
    env_file: Annotated[
        Path | None,
        typer.Option("--env-file", help="The .env to resolve ${VAR} from (as for `deploy check`)."),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="text or json.")
    ] = OutputFormat.text,
) -> None:
    """Predict keyframes/min, TTFT and end to end of the engine's flags, beside the tuned baseline."""
    from deploy.predict import predict, prediction_as_json  # the simulator loads only for this command

    try:
        files = find_compose_files(paths or [Path.cwd()])
        predictions = predict(files, env_file=env_file, environ=os.environ)
    except UnreadableInputError as exc:
        if output_format is OutputFormat.json:
            sys.stdout.write(json.dumps({"error": str(exc)}) + "\n")
        else:
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                Text(f"modgate deploy predict: {exc}", style="bold red")
            )
        raise typer.Exit(2) from exc
    if output_format is OutputFormat.json:
        sys.stdout.write(json.dumps([prediction_as_json(p) for p in predictions], indent=2) + "\n")
        return
    console = Console(highlight=False, soft_wrap=True)
    for prediction in predictions:
        print_prediction(prediction_as_json(prediction), console)


def print_prediction(document: dict[str, Any], console: Console) -> None:
    """The figures beside the baseline, the verdict, and which flags were modelled or ignored."""
    shape = document["request_shape"]
    llamacpp = document.get("engine") == "llamacpp"
    law = "llama.cpp's server law, beside the tuned vLLM" if llamacpp else "the step model's clock"
    console.print(Text(
        f"engine service `{document['service']}`: the seed's request ({shape['prompt_tokens']:,} prompt "
        f"tokens, ~{shape['output_tokens']} output, thinking on), {document['in_flight']} in flight "
        f"(the gateway's cap), simulated on {law}", style="bold"))
    _print_figures(document["predicted"], document["baseline"], console)
    if llamacpp:
        off = document["thinking_off"]
        console.print(Text(f"  thinking off ({off['request_shape']['output_tokens']} output tokens, compact "
                           "verdict):", style="bold"))
        _print_figures(off["predicted"], off["baseline"], console)
        reused = document["reused_prompt_tokens_per_request"]
        console.print(f"  prompt tokens its cache reused, per keyframe: {reused['on']:.0f} thinking on, "
                      f"{reused['off']:.0f} off, of {shape['prompt_tokens']:,}")
    style = {"better": "green", "worse": "bold red", "same": "yellow"}[document["verdict"]]
    console.print(Text(f"  predicted: {document['verdict']} than the tuned baseline"
                       if document["verdict"] != "same" else "  predicted: the same as the tuned baseline",
                       style=style))
    console.print(f"  models:  {', '.join(document['modelled']) or 'none of its flags'}")
    if document["ignored_knobs"]:
        console.print(Text(f"  ignores, with no mechanism for them (the prediction may be optimistic): "
                           f"{', '.join(document['ignored_knobs'])}", style="yellow"))
    ignored = ", ".join(document["ignored"]) or "nothing"
    console.print(f"  ignores, as costing nothing in the model: {ignored}")
    strategies = document.get("prefix_strategies") or []
    if strategies:
        console.print(Text("  prefix strategies on this engine (prefill tokens per keyframe, thinking on):",
                           style="bold"))
        console.print(f"  {'strategy':<16}{'prompt':>8}{'cached':>8}{'computed':>10}{'saved':>8}"
                      f"{'keyframes/min':>15}  note")
        for row in strategies:
            rate = "refused" if row["keyframes_per_min"] is None else f"{row['keyframes_per_min']:.1f}"
            console.print(f"  {row['strategy']:<16}{row['prompt_tokens']:>8,}{row['cached_tokens']:>8,}"
                          f"{row['computed_tokens']:>10,}{row['prefill_tokens_saved']:>8,}{rate:>15}  "
                          f"{row['note']}")
    for assumption in document.get("assumptions", []):
        console.print(Text(f"  assumes: {assumption}", style="dim"))
    for caveat in document["caveats"]:
        console.print(Text(f"  note: {caveat}", style="dim"))


def _print_figures(mine: dict[str, float], base: dict[str, float], console: Console) -> None:
    console.print(f"  {'figure':<26}{'this compose':>14}{'tuned baseline':>16}{'change':>9}")
    for key, label, digits in (
        ("keyframes_per_min", "keyframes/min", 1),
        ("ttft_mean_s", "TTFT mean (s)", 3),
        ("e2e_mean_s", "end to end mean (s)", 2),
        ("generation_tokens_per_s", "generation (tokens/s)", 1),
        ("forward_passes_per_request", "forward passes/keyframe", 1),
    ):
        console.print(f"  {label:<26}{mine[key]:>14.{digits}f}{base[key]:>16.{digits}f}"
                      f"{(mine[key] / base[key] - 1):>+9.0%}")


def _shown_path(path: Path) -> str:
    """A path relative to the current folder where it lies under it (as an operator typed it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _shown_location(location: Location) -> str:
    shown = _shown_path(location.file)
    return f"{shown}:{location.line}" if location.line is not None else shown


def _finding_line(finding: Finding) -> Text:
    line = Text()
    line.append(_shown_location(finding.location), style="bold")
    line.append("  ")
    line.append(finding.severity, style=_SEVERITY_STYLE[finding.severity])
    line.append("  ")
    line.append(finding.rule, style="cyan")
    line.append("  ")
    line.append(finding.message)
    if finding.related:
        line.append(f"  (see {', '.join(_shown_location(place) for place in finding.related)})", style="dim")
    return line


def print_report(report: CheckReport, console: Console) -> None:
    """file:line  severity  rule  message, one finding a line, then the compose-config note and a summary."""
    for finding in report.findings:
        console.print(_finding_line(finding))
    console.print(Text(f"docker compose config: {report.compose_config}", style="dim"))
    checked = [_shown_path(path) for path in report.compose_files]
    if report.env_file is not None:
        checked.append(_shown_path(report.env_file))
    errors = f"{report.errors} error{'s' if report.errors != 1 else ''}"
    warnings = f"{report.warnings} warning{'s' if report.warnings != 1 else ''}"
    console.print(
        Text(f"{errors}, {warnings} in {', '.join(checked)}", style="bold red" if report.errors else "green")
    )


def report_as_json(report: CheckReport) -> dict[str, Any]:
    """The report as one JSON document (paths as given, lines 1-based or null)."""

    def place(location: Location) -> dict[str, Any]:
        return {"file": str(location.file), "line": location.line}

    return {
        "compose_files": [str(path) for path in report.compose_files],
        "env_file": str(report.env_file) if report.env_file is not None else None,
        "compose_config": report.compose_config,
        "errors": report.errors,
        "warnings": report.warnings,
        "findings": [
            {
                **place(finding.location),
                "severity": finding.severity,
                "rule": finding.rule,
                "message": finding.message,
                "related": [place(location) for location in finding.related],
            }
            for finding in report.findings
        ],
    }


if __name__ == "__main__":  # `python -m deploy.cli check …` before the `modgate` console script exists
    deploy_app()
