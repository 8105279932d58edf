"""``modgate video moderate FILE|URL``: post a video job, follow its progress, print its segments."""

from __future__ import annotations

import json
import mimetypes
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

video_app = typer.Typer(help="Videos as jobs: the gateway cuts the keyframes and answers segments.",
                        no_args_is_help=True)


def is_url(source: str) -> bool:
    """An http(s) URL the gateway fetches, rather than a file posted with the job."""
    return source.lower().startswith(("http://", "https://"))


def submit(client: httpx.Client, source: str, fields: dict[str, Any]) -> httpx.Response:
    """Post the job: a URL in its JSON body; a file as ``multipart/form-data``, read from disk as it is sent
    (never base64, never whole in memory on either side)."""
    if is_url(source):
        return client.post("/v1/jobs", json={**fields, "video": {"url": source}})
    path = Path(source)
    mime = mimetypes.guess_type(path.name)[0] or "video/mp4"
    with path.open("rb") as file:
        return client.post("/v1/jobs", files={
            "video": (path.name, file, mime if mime.startswith("video/") else "video/mp4"),
            "job": (None, json.dumps(fields), "application/json"),
        })


def render_segments(job: dict[str, Any], console: Console) -> None:
    """The finished job's segments as a table, then the video's verdict."""
    result = job["result"]
    table = Table(title=f"{job['video_id']}: {len(result['frames'])} frames judged")
    for column in ("start", "end", "action", "categories", "frames", "confidence"):
        table.add_column(column, justify="right" if column in ("start", "end", "confidence") else "left")
    for segment in result["segments"]:
        confidence = segment["confidence"]
        table.add_row(
            f"{segment['start_ms'] / 1000:.1f} s", f"{segment['end_ms'] / 1000:.1f} s", segment["action"],
            ", ".join(segment["categories"]) or "–", ", ".join(map(str, segment["frames"])),
            "–" if confidence is None else f"{confidence:.3f}",
        )
    console.print(table)
    console.print(f"video verdict: {result['verdict']['action']}")


@video_app.command("moderate")
def moderate(
    source: Annotated[str, typer.Argument(help="A video file, or an https:// URL the gateway may fetch.")],
    gateway_url: Annotated[
        str, typer.Option(envvar="MODGATE_GATEWAY_URL", help="The gateway, e.g. http://127.0.0.1:8080.")
    ] = "http://127.0.0.1:8080",
    api_key: Annotated[str | None, typer.Option(envvar="MODGATE_API_KEY", help="A business API key.")] = None,
    video_id: Annotated[str | None, typer.Option(help="The video's id (default: the file's name).")] = None,
    max_fps: Annotated[float | None, typer.Option(help="Shot changes taken per second at most.")] = None,
    max_gap_s: Annotated[
        float | None, typer.Option(help="A judged frame in every stretch this long (a sparser sample).")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="How long to wait for the job.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the finished job's JSON.")] = False,
) -> None:
    """Post a video job, show its progress, and print its segments (or the job as JSON)."""
    name = video_id or "".join(c if c.isalnum() or c in "._:-" else "-" for c in Path(source).name)[:200]
    body: dict[str, Any] = {"video_id": name or "video"}
    sampling = {"max_fps": max_fps, "max_gap_s": max_gap_s}
    if any(value is not None for value in sampling.values()):
        body["sampling"] = {name: value for name, value in sampling.items() if value is not None}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=gateway_url.rstrip("/"), headers=headers, timeout=60) as client:
        accepted = submit(client, source, body)
        if accepted.status_code != 202:
            typer.secho(f"the gateway refused the video ({accepted.status_code}): {accepted.text}",
                        fg="red", err=True)
            raise typer.Exit(1)
        job = follow(client, accepted.json()["id"], timeout_s, quiet=as_json)
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    elif job["status"] == "failed":
        typer.secho(f"the job failed: {job['error']['message']} ({job['error']['code']})", fg="red", err=True)
    else:
        render_segments(job, Console(width=120))
    if job["status"] == "failed":
        raise typer.Exit(1)


def follow(client: httpx.Client, job_id: str, timeout_s: float, *, quiet: bool) -> Any:
    """Poll the job until it has finished, a progress bar of its frames meanwhile."""
    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=quiet, console=Console(stderr=True)) as progress:
        task = progress.add_task("cutting", total=None)
        while time.monotonic() < deadline:
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job.get("progress"):
                done, total = job["progress"]["frames_done"], job["progress"]["frames_total"]
                progress.update(task, description="judging", completed=done, total=total)
            if job["status"] in ("succeeded", "failed"):
                return job
            time.sleep(0.2)
    typer.secho(f"job {job_id} did not finish within {timeout_s:g} s", fg="red", err=True)
    raise typer.Exit(1)
