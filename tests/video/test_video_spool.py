"""The spool: an upload over the limit is refused as it streams (never read whole), a job whose file cannot be
reached fails with a retryable error (never left running), and files no job waits for are swept."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from litestar.testing import AsyncTestClient

from cli.embedded import ThreadedServer
from deploy.videos import make_video
from gateway.drain import Drain
from gateway.errors import StateUnavailable
from gateway.http.app import create_app
from gateway.http.providers import services_of
from gateway.jobs.spool import SWEEP_GRACE_S, SpooledVideo, VideoSpool, VideoUnavailable
from gateway.settings import Settings
from tests.support import GatewayFactory
from tests.video.test_video_jobs import VIOLENT_MIDDLE, finished

LIMIT = 256 * 1024  # MODGATE_VIDEOS__MAX_BYTES in these tests
PIECE = 16 * 1024  # the client's chunk


class CountingBody:
    """An ASGI app wrapped to count the request body bytes the app itself takes in (``receive``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pieces: list[int] = []  # the size of each piece of body the app took

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            message = await receive()
            if message["type"] == "http.request" and message.get("body"):
                self.pieces.append(len(message["body"]))
            return message

        await self.app(scope, counted if scope["type"] == "http" else receive, send)


async def raw_upload(server: ThreadedServer, total: int, *, declared: bool) -> tuple[int, dict[str, Any]]:
    """POST a multipart job of a ``total``-byte video in pieces, over a bare connection (chunked unless the
    length is ``declared``); stops sending when the server hangs up. The status and the error body."""
    boundary = "modgate-test-boundary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="video"; filename="v.mp4"\r\n'
            "Content-Type: video/mp4\r\n\r\n").encode()
    tail = (f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="job"\r\n\r\n{{"video_id": "big"}}'
            f"\r\n--{boundary}--\r\n").encode()
    framing = f"Content-Length: {len(head) + total + len(tail)}" if declared else "Transfer-Encoding: chunked"
    reader, writer = await asyncio.open_connection(server.host, server.port)

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(f"POST /v1/jobs HTTP/1.1\r\nHost: gateway\r\nContent-Type: multipart/form-data; "
                         f"boundary={boundary}\r\n{framing}\r\n\r\n".encode())
            pieces = [head, *(b"\0" * PIECE for _ in range(total // PIECE)), tail]
            for piece in pieces:
                writer.write(piece if declared else b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            if not declared:
                writer.write(b"0\r\n\r\n")
                await writer.drain()

    sending = asyncio.create_task(send())
    try:
        status_line = await reader.readline()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers["content-length"]))
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return int(status_line.split()[1]), json.loads(body)["error"]


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
async def test_an_upload_over_the_limit_gets_a_413_without_the_gateway_reading_it(
    sim: ThreadedServer, tmp_path: Path, declared: bool
) -> None:
    """Streamed: refused as soon as the video passes the limit; declared too long: before a byte is read.
    Either way nothing stays in the spool."""
    settings = Settings(engine={"url": sim.url}, videos={"max_bytes": LIMIT, "spool_dir": str(tmp_path)})
    app = CountingBody(create_app(settings))
    with ThreadedServer(app) as server:
        status, error = await raw_upload(server, 16 * LIMIT, declared=declared)
    assert (status, error["code"], error["param"]) == (413, "video_too_large", "video")
    if declared:
        assert app.pieces == []
    else:  # nothing more asked for once the piece in hand passed the limit (the part's headers aside)
        assert sum(app.pieces[:-1]) <= LIMIT + 1024 < sum(app.pieces)
        assert sum(app.pieces) < 4 * LIMIT  # of the 16 sent
    assert list(tmp_path.iterdir()) == []


async def post_video(gateway_url: str, video: bytes, video_id: str) -> str:
    """``POST /v1/jobs`` with ``video`` as a multipart upload; the accepted job's id."""
    files = {"video": ("clip.mp4", video, "video/mp4"),
             "job": (None, json.dumps({"video_id": video_id}), "application/json")}
    async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as client:
        accepted = await client.post("/v1/jobs", files=files)
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["id"])


@pytest.mark.parametrize("shared", [True, False], ids=["shared-spool", "own-spool"])
async def test_a_video_whose_receiving_replica_dies_before_the_cut_is_finished_elsewhere_or_fails_retryably(
    sim: ThreadedServer, start_gateway: GatewayFactory, redis_url: str, tmp_path: Path, shared: bool
) -> None:
    """Another replica takes the job over: with the spool shared it cuts and finishes it; with a spool of its
    own the file is out of reach, and the job fails with video_unavailable (a server error: submit again)."""
    received_in, other = tmp_path / "receiving", tmp_path / ("receiving" if shared else "other")
    draining = Drain()
    draining.begin()  # the receiving replica takes no job: it dies before it would have cut the video
    receiving = ThreadedServer(create_app(Settings(
        engine={"url": sim.url}, redis={"url": redis_url}, videos={"spool_dir": str(received_in)}
    ), drain=draining)).start()
    try:
        job_id = await post_video(receiving.url, make_video(VIOLENT_MIDDLE), "orphan-1")
        assert [path.name for path in received_in.iterdir()] == [f"{job_id}.video"]
    finally:
        receiving.stop()
    survivor = start_gateway(engine={"url": sim.url}, redis={"url": redis_url},
                             videos={"spool_dir": str(other)}, jobs={"retry_wait_s": 0.05, "max_attempts": 2})
    async with httpx.AsyncClient(base_url=survivor.url, timeout=30) as client:
        job = await finished(client, job_id)
    if shared:
        assert job["status"] == "succeeded", job
        assert [s["action"] for s in job["result"]["segments"]] == ["allow", "block", "allow"]
        assert list(received_in.iterdir()) == []  # deleted once cut
    else:
        assert job["status"] == "failed", job
        assert (job["error"]["code"], job["error"]["type"]) == ("video_unavailable", "server_error")
        assert "submit it again" in job["error"]["message"]
        assert job["attempts"] == 2  # retried as any server-side failure, then failed: never left running


async def test_a_video_job_queued_by_a_gateway_from_before_the_spool_is_cut_after_the_upgrade(
    sim: ThreadedServer, start_gateway: GatewayFactory, redis_url: str, tmp_path: Path
) -> None:
    """A gateway from before the spool kept a posted video's bytes in the job store (``…:video``) and its
    job no file reference; a gateway of today takes such a job over after an upgrade, spools the bytes and
    cuts them, and drops the key once done (it failed video_unavailable before)."""
    draining = Drain()
    draining.begin()  # the older gateway queues the job and takes no work
    older = ThreadedServer(create_app(Settings(
        engine={"url": sim.url}, redis={"url": redis_url}, videos={"spool_dir": str(tmp_path / "older")}
    ), drain=draining)).start()
    video = make_video(VIOLENT_MIDDLE)
    try:
        job_id = await post_video(older.url, video, "queued-before-upgrade")
    finally:
        older.stop()
    job_key = f"modgate:job:{job_id}"
    store = redis.Redis.from_url(redis_url)
    try:  # as the older gateway left it: the bytes beside the job, no spooled file, no reference
        assert store.hdel(job_key, "video_file") == 1
        store.set(f"{job_key}:video", video)
        for path in (tmp_path / "older").iterdir():
            path.unlink()
        upgraded = start_gateway(engine={"url": sim.url}, redis={"url": redis_url},
                                 videos={"spool_dir": str(tmp_path / "upgraded")},
                                 jobs={"retry_wait_s": 0.05, "max_attempts": 2})
        async with httpx.AsyncClient(base_url=upgraded.url, timeout=30) as client:
            job = await finished(client, job_id)
        assert job["status"] == "succeeded", job
        assert [s["action"] for s in job["result"]["segments"]] == ["allow", "block", "allow"]
        assert store.exists(f"{job_key}:video") == 0  # dropped with the job's work
        assert list((tmp_path / "upgraded").iterdir()) == []  # spooled for the cut, deleted once cut
    finally:
        store.close()


async def test_the_sweep_deletes_what_no_job_waits_for(tmp_path: Path) -> None:
    spool = VideoSpool(tmp_path, max_bytes=LIMIT)
    for job_id in ("job_live", "job_gone", "job_fresh"):
        await spool.keep(job_id, b"video")
    abandoned = tmp_path / "job_upload.0123abcd.part"
    abandoned.write_bytes(b"half an upload")
    stale = 1_000_000.0
    for name in ("job_live.video", "job_gone.video", abandoned.name):
        os.utime(tmp_path / name, (stale, stale))
    asked: list[str] = []

    async def live(job_id: str) -> bool:
        asked.append(job_id)
        return job_id == "job_live"

    swept = await spool.sweep(live, now=stale + SWEEP_GRACE_S + 1)
    assert swept == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job_fresh.video", "job_live.video"]
    assert sorted(asked) == ["job_gone", "job_live"]  # a fresh file's job is not even asked after


async def test_a_spooled_file_that_is_not_the_one_received_is_unavailable(tmp_path: Path) -> None:
    spool = VideoSpool(tmp_path, max_bytes=LIMIT)
    kept = await spool.keep("job_1", b"the video as received")
    assert await spool.reachable(kept) == tmp_path / "job_1.video"
    spool.path("job_1").write_bytes(b"the video as received, changed")
    with pytest.raises(VideoUnavailable):
        await spool.reachable(kept)
    with pytest.raises(VideoUnavailable):
        await spool.reachable(SpooledVideo("job_2", 5, kept.sha256))


async def test_a_multipart_job_whose_store_write_fails_keeps_its_file_and_a_refused_one_keeps_none(
    sim: ThreadedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission the job store could not confirm (503 state_unavailable) may be on the Redis primary all
    the same: its spooled file stays for the sweep to judge. A body refused before it reaches the store (a
    'job' part that is not JSON) leaves no file."""
    spool = tmp_path / "spool"
    app = create_app(Settings(engine={"url": sim.url}, videos={"spool_dir": str(spool)}))
    video = ("clip.mp4", make_video(VIOLENT_MIDDLE), "video/mp4")
    async with AsyncTestClient(app, timeout=30) as client:
        not_json = {"video": video, "job": (None, "{not json", "text/plain")}
        refused = await client.post("/v1/jobs", files=not_json)
        assert refused.status_code == 400, refused.text
        assert list(spool.iterdir()) == []

        async def unconfirmed(*_: object, **__: object) -> None:
            raise StateUnavailable("the job store did not confirm the job")

        monkeypatch.setattr(services_of(app).jobs.store, "submit", unconfirmed)
        job = {"video": video, "job": (None, '{"video_id": "v"}', None)}
        answered = await client.post("/v1/jobs", files=job)
    assert answered.status_code == 503, answered.text
    assert answered.json()["error"]["code"] == "state_unavailable"
    assert [path.suffix for path in spool.iterdir()] == [".video"]  # kept: the job may exist
