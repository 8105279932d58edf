"""Where a video waits until it is cut: a file in ``MODGATE_VIDEOS__SPOOL_DIR``, named by its job.

A posted video (a multipart file, or a ``data:`` URL's bytes) is written there at submission and probed from
there; a URL's video is fetched there by the worker. It is written once, in large pieces on a thread, hashed
as it goes, and refused the moment it passes ``MODGATE_VIDEOS__MAX_BYTES`` (the partial file deleted). The
job store holds a reference only (:class:`SpooledVideo`: the job that names the file, its size and SHA-256),
never the bytes. The file is deleted once the cut frames are kept with the job, when the job finishes, and
by the sweep (:meth:`VideoSpool.sweep`) when neither happened (its replica died, the upload broke off).

With several replicas the directory is a volume they all mount: any replica's worker may take the job. A
file that is not there, or not the one received (its size or hash differ), fails the job with the
retryable ``video_unavailable``: never a job left running.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Final

from gateway.errors import PayloadTooLarge, ServerSideError

WRITE_PIECE: Final = 1 << 20  # bytes gathered before each write on a thread: bounded memory, few thread hops
HASH_PIECE: Final = 1 << 20  # bytes read at a time when a spooled file's hash is checked
SUFFIX: Final = ".video"
PARTIAL: Final = ".part"  # a file still being written: ``<job id>.<random>.part``, renamed when complete
SWEEP_GRACE_S: Final = 15 * 60  # a file untouched this long whose job is gone or finished is swept


class VideoUnavailable(ServerSideError):
    """The job's spooled video cannot be read here (another replica's disk, deleted, or not the file
    received): retried as any server-side failure is, then the job fails; the caller submits it again."""

    status = 503
    default_code = "video_unavailable"


class SpoolFailed(ServerSideError):
    """The spool directory cannot be written (full, read-only, not mounted): try again later."""

    status = 503
    default_code = "video_spool_failed"


@dataclass(frozen=True, slots=True)
class SpooledVideo:
    """What the job store keeps of a spooled video: its job (the file's name), size and SHA-256."""

    job_id: str
    size: int
    sha256: str

    def dumps(self) -> str:
        """The reference as the job record's field."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> SpooledVideo:
        """A reference read back from the job record."""
        return cls(**json.loads(text))


def too_large(max_bytes: int) -> PayloadTooLarge:
    """The 413 of a video past the limit."""
    return PayloadTooLarge(f"the video is over the {max_bytes:,}-byte limit (MODGATE_VIDEOS__MAX_BYTES)",
                           code="video_too_large", param="video")


@dataclass
class SpoolWriter:
    """One video streaming into the spool (see the module's docstring); an async context manager that
    deletes the partial file unless :meth:`finish` completed it."""

    spool: VideoSpool
    job_id: str
    size: int = 0
    _pending: list[bytes] = field(default_factory=list)
    _pending_size: int = 0
    _file: IO[bytes] | None = None
    _hash: hashlib._Hash = field(default_factory=hashlib.sha256)
    _partial: Path | None = None
    _done: bool = False

    async def __aenter__(self) -> SpoolWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.abort()

    async def abort(self) -> None:
        """Delete the partial file, unless :meth:`finish` completed it."""
        if not self._done:
            self._done = True
            if self._partial is not None:  # nothing was written: no file to delete
                await asyncio.to_thread(self._abort)

    async def write(self, chunk: bytes) -> None:
        """Take the next bytes: over the limit they are refused at once (nothing more need be read)."""
        self.size += len(chunk)
        if self.size > self.spool.max_bytes:
            raise too_large(self.spool.max_bytes)
        self._pending.append(chunk)
        self._pending_size += len(chunk)
        if self._pending_size >= WRITE_PIECE:
            await self._flush()

    async def finish(self) -> SpooledVideo:
        """Write what is left, close the file and give it its name; the reference the job keeps."""
        await self._flush()
        await asyncio.to_thread(self._complete)
        self._done = True
        return SpooledVideo(self.job_id, self.size, self._hash.hexdigest())

    async def _flush(self) -> None:
        piece, self._pending, self._pending_size = b"".join(self._pending), [], 0
        await asyncio.to_thread(self._write, piece)

    def _write(self, piece: bytes) -> None:
        try:
            if self._file is None:
                self.spool.directory.mkdir(parents=True, exist_ok=True)
                self._partial = self.spool.directory / f"{self.job_id}.{uuid.uuid4().hex[:8]}{PARTIAL}"
                self._file = self._partial.open("xb")
            self._file.write(piece)
        except OSError as exc:
            raise SpoolFailed(f"the video could not be written to the spool ({exc.strerror})") from exc
        self._hash.update(piece)  # hashlib lets other threads run while it hashes a large piece

    def _complete(self) -> None:
        if self._file is None:  # an empty video: an empty file (the probe refuses it, saying so)
            self._write(b"")
        assert self._file is not None
        assert self._partial is not None
        try:
            self._file.close()
            self._partial.replace(self.spool.path(self.job_id))  # whole, or not there at all
        except OSError as exc:
            raise SpoolFailed(f"the video could not be kept in the spool ({exc.strerror})") from exc

    def _abort(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._partial is not None:
            self._partial.unlink(missing_ok=True)


@dataclass
class VideoSpool:
    """The directory videos wait in until they are cut (see the module's docstring)."""

    directory: Path
    max_bytes: int

    def path(self, job_id: str) -> Path:
        """Where the job's video waits."""
        return self.directory / f"{job_id}{SUFFIX}"

    def writer(self, job_id: str) -> SpoolWriter:
        """A writer of the job's video, as its bytes stream in."""
        return SpoolWriter(self, job_id)

    async def keep(self, job_id: str, data: bytes) -> SpooledVideo:
        """A video already in memory (a ``data:`` URL's bytes, decoded) written to the spool."""
        async with self.writer(job_id) as writer:
            await writer.write(data)
            return await writer.finish()

    async def reachable(self, video: SpooledVideo) -> Path:
        """The job's spooled file, once it is found to be the one received; :class:`VideoUnavailable`
        when it is not here (another replica's disk, deleted) or differs."""
        path = self.path(video.job_id)
        try:
            size, digest = await asyncio.to_thread(_measure, path)
        except FileNotFoundError as exc:
            raise VideoUnavailable(
                "the job's video is not in this gateway's spool (MODGATE_VIDEOS__SPOOL_DIR): the replica "
                "that received it is gone and the spool is not shared, or it was deleted; submit it again",
                param="video",
            ) from exc
        except OSError as exc:
            raise VideoUnavailable(f"the job's video could not be read ({exc.strerror}); submit it again",
                                   param="video") from exc
        if (size, digest) != (video.size, video.sha256):
            raise VideoUnavailable("the job's spooled video is not the one received (its size or hash "
                                   "differ); submit it again", param="video")
        return path

    async def discard(self, job_id: str) -> None:
        """Delete the job's video, if it is here."""
        await asyncio.to_thread(self.path(job_id).unlink, missing_ok=True)

    async def sweep(self, live: Callable[[str], Awaitable[bool]], *, now: float | None = None) -> int:
        """Delete what no job waits for: a partial file or a video untouched for ``SWEEP_GRACE_S`` whose
        job is gone or finished (``live`` False); how many were deleted. A fresh file is left alone: its
        job may not be stored yet (the upload is being probed)."""
        entries = await asyncio.to_thread(self._entries)
        cutoff = (time.time() if now is None else now) - SWEEP_GRACE_S
        swept = 0
        for path, job_id, touched in entries:
            if touched > cutoff or (path.name.endswith(SUFFIX) and await live(job_id)):
                continue
            await asyncio.to_thread(path.unlink, missing_ok=True)
            swept += 1
        return swept

    def _entries(self) -> list[tuple[Path, str, float]]:
        """The spool's files: each with the job it belongs to and when it was last written."""
        found = []
        try:
            paths = list(self.directory.iterdir())
        except FileNotFoundError:
            return []
        for path in paths:
            if not path.name.endswith((SUFFIX, PARTIAL)):
                continue
            try:
                found.append((path, path.name.split(".", 1)[0], path.stat().st_mtime))
            except FileNotFoundError:  # deleted meanwhile (its job finished, another replica swept it)
                continue
        return found


def _measure(path: Path) -> tuple[int, str]:
    """A file's size and SHA-256, read in pieces."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while piece := file.read(HASH_PIECE):
            digest.update(piece)
            size += len(piece)
    return size, digest.hexdigest()
