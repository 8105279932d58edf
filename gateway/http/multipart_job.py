"""A multipart job's body read as it streams: the ``video`` file part straight into the spool, the ``job``
part (the JSON of the job's other fields) in memory, capped; any other part refused as its headers arrive.

Litestar's own ``request.form()`` streams too, through the same parser (``multipart``'s
``PushMultipartParser``), but into an anonymous temporary file (rolled to disk past 1 MB), bounded only by
the whole body's limit (``MODGATE_SHAPING__MAX_BODY_BYTES``, sized for a JSON body's base64) and read to the
end before any part can be refused; the file would then be copied into the spool. Here the video is written
once, where it waits for its cut, and ``MODGATE_VIDEOS__MAX_BYTES`` holds as the bytes come: past it, a 413
at once and nothing more of the body is read.
"""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Final

from litestar import Request
from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.jobs.spool import SpooledVideo, SpoolWriter, VideoSpool, too_large

JOB_PARTS: Final = ("video", "job")  # a multipart job's parts; the OpenAPI document names these and no others
MAX_JOB_PART: Final = 64 * 1024  # the 'job' part: a few hundred bytes of JSON in practice
ENVELOPE: Final = 16 * 1024  # boundaries and part headers (the parser caps each header line at 4 KB)


@dataclass
class MultipartJob:
    """What a multipart job's body held, taken event by event from the parser: its ``job`` part's text and
    its ``video``, spooled by ``writer`` as its bytes come."""

    writer: SpoolWriter
    fields: str | None = None  # None: no 'job' part
    video: SpooledVideo | None = None  # None: no 'video' part
    _seen: set[str] = field(default_factory=set)
    _text: bytearray = field(default_factory=bytearray)
    _segment: MultipartSegment | None = None  # the part being read

    async def take(self, event: MultipartSegment | bytes | None) -> None:
        """One parser event: a part's headers, a piece of its body, or its end (None)."""
        if isinstance(event, MultipartSegment):
            self._segment = self.begin(event)
        elif event is None:
            if self._segment is not None and self._segment.name == "video":
                self.video = await self.writer.finish()
            elif self._segment is not None:
                self.end_text(self._segment)
            self._segment = None
        elif self._segment is not None and self._segment.name == "video":
            await self.writer.write(bytes(event))
        else:
            self.add_text(event)

    def begin(self, segment: MultipartSegment) -> MultipartSegment:
        """A part's headers have come: it must be one of the job's parts, each once, the video a file."""
        name = segment.name or ""
        if name not in JOB_PARTS:  # never dropped in silence: a job's other fields go in its 'job' part
            raise InvalidRequest(f"unknown part {name[:100]!r}: a multipart job has a 'video' file part and "
                                 "a 'job' part, the JSON object of its other fields", param=name[:100])
        if name in self._seen:
            raise InvalidRequest(f"the {name!r} part comes twice", param=name)
        if name == "video" and not segment.filename:
            raise InvalidRequest("a multipart job needs a 'video' file part (a filename in its "
                                 "Content-Disposition)", param="video")
        self._seen.add(name)
        return segment

    def add_text(self, piece: bytes) -> None:
        """More of the 'job' part."""
        self._text += piece
        if len(self._text) > MAX_JOB_PART:
            raise PayloadTooLarge(f"the 'job' part is over {MAX_JOB_PART:,} bytes", param="job")

    def end_text(self, segment: MultipartSegment) -> None:
        """The 'job' part is complete."""
        try:
            self.fields = self._text.decode(segment.charset or "utf-8")
        except (UnicodeDecodeError, LookupError) as exc:
            raise InvalidRequest("the 'job' part is not UTF-8 text", param="job") from exc


async def read_multipart_job(request: Request[Any, Any, Any], spool: VideoSpool, job_id: str) -> MultipartJob:
    """Read the body as it streams (see the module's docstring); the video spooled under ``job_id``. On any
    failure nothing stays in the spool."""
    _, options = request.content_type
    boundary = options.get("boundary")
    if not boundary:
        raise InvalidRequest("multipart boundary missing in Content-Type")
    declared = request.content_length
    if declared is not None and declared > spool.max_bytes + MAX_JOB_PART + ENVELOPE:
        raise too_large(spool.max_bytes)  # said before the first byte is read
    received = MultipartJob(spool.writer(job_id))
    try:
        with PushMultipartParser(boundary.encode("latin-1")) as parser:
            async with aclosing(request.stream()) as chunks:
                async for chunk in chunks:
                    for event in parser.parse(chunk):
                        await received.take(event)
                    if parser.closed:
                        break
    except (ParserError, ParserLimitReached) as exc:
        await spool.discard(job_id)
        raise InvalidRequest(f"invalid multipart/form-data: {exc}") from exc
    except BaseException:
        await spool.discard(job_id)
        raise
    finally:
        await received.writer.abort()  # broken off mid-video: its partial file goes (once whole: nothing)
    return received
