"""A JPEG's marker structure, walked by hand: the frame header's size, and the passthrough's bitstream."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Final

# SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
JPEG_FRAME_MARKERS: Final = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE_MARKERS: Final = frozenset(range(0xD0, 0xD8)) | {0x01}
_JPEG_KEPT_MARKERS: Final = frozenset({0xC0, 0xC4, 0xDA, 0xDB, 0xDD, 0xD9})  # SOF0 DHT SOS DQT DRI EOI
# APP0 of exactly 16 bytes: "JFIF\0", version, units, densities, and a 0×0 thumbnail.
_JFIF_WITHOUT_THUMBNAIL: Final = re.compile(rb"\xff+\xe0\x00\x10JFIF\x00.{7}\x00\x00\Z", re.DOTALL)


class MalformedJpeg(Exception):
    """The marker structure of a JPEG is broken."""


@dataclass(frozen=True, slots=True)
class JpegSegment:
    marker: int
    start: int  # offset of the segment's first 0xFF
    end: int  # offset just after it (after the entropy-coded data, for SOS)


def jpeg_segments(data: bytes) -> Iterator[JpegSegment]:
    """Walk a JPEG's marker segments after SOI, up to and including EOI."""
    size = len(data)
    position = 2
    while True:
        if position >= size:
            raise MalformedJpeg("it ends before its end-of-image marker")
        if data[position] != 0xFF:
            raise MalformedJpeg(f"a marker was expected at byte {position:,}")
        start = position
        while position < size and data[position] == 0xFF:  # fill bytes may precede a marker
            position += 1
        if position >= size:
            raise MalformedJpeg("it ends inside a marker")
        marker = data[position]
        position += 1
        if marker == 0xD9 or marker in _JPEG_STANDALONE_MARKERS:
            yield JpegSegment(marker, start, position)
            if marker == 0xD9:
                return
            continue
        if position + 2 > size:
            raise MalformedJpeg("it ends inside a segment length")
        length = int.from_bytes(data[position : position + 2], "big")
        if length < 2 or position + length > size:
            raise MalformedJpeg(f"a segment at byte {start:,} runs past the end of the data")
        position += length
        if marker == 0xDA:
            position = _entropy_coded_end(data, position)
        yield JpegSegment(marker, start, position)


# 0xFF followed by anything but a stuffed zero, an RSTn or another fill 0xFF: the marker after a scan.
_MARKER_AFTER_SCAN: Final = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _entropy_coded_end(data: bytes, position: int) -> int:
    """Offset of the first marker after a scan's entropy-coded data (stuffed 0xFF00 and RSTn belong to it).

    One regular-expression scan at C speed: a 100 KiB scan has hundreds of 0xFF bytes to step over.
    """
    found = _MARKER_AFTER_SCAN.search(data, position)
    if found is None:
        raise MalformedJpeg("its image data runs to the end without an end-of-image marker")
    return found.start()


def eight_bit_three_components(frame_header: bytes) -> bool:
    """Whether a frame header segment (from its marker's 0xFF on) is of 8-bit samples in three components."""
    header = frame_header.lstrip(b"\xff")  # marker, length, precision, height, width, components
    return len(header) >= 9 and header[3] == 8 and header[8] == 3


def baseline_jpeg_stream(data: bytes) -> bytes | None:
    """The JPEG without metadata and trailing bytes, if it is a plain baseline YCbCr JPEG; else None.

    Kept: SOI, a thumbnail-free JFIF APP0 (it fixes the colour space as YCbCr), DQT, SOF0, DHT, DRI, SOS and
    its data, EOI. Dropped: every other APPn (EXIF, XMP, ICC, MPF, ...) and COM, which change no pixel in
    the engine's decoder. Not eligible (None): progressive or other frame types, Adobe APP14 (its colour
    transform flag changes decoding), a JFIF thumbnail, DNL, or any marker structure out of the ordinary.
    """
    kept = [(0, 2)]  # spans of ``data``: SOI, then each segment kept
    frames = scans = 0
    try:
        for segment in jpeg_segments(data):
            marker = segment.marker
            span = (segment.start, segment.end)
            # only the segments read here are copied (not the scan's data, not the metadata dropped)
            body = data[segment.start : segment.end] if marker in (0xE0, 0xC0) else b""
            if marker == 0xE0 and body.lstrip(b"\xff")[3:8] == b"JFIF\x00":
                if not _JFIF_WITHOUT_THUMBNAIL.match(body):
                    return None
                kept.append(span)
            elif marker == 0xEE:
                return None
            elif 0xE0 <= marker <= 0xEF or marker == 0xFE:
                continue
            elif marker not in _JPEG_KEPT_MARKERS:
                return None
            else:
                if marker == 0xC0:
                    frames += 1
                    if not eight_bit_three_components(body):
                        return None
                if marker == 0xDA:
                    scans += 1
                kept.append(span)
    except MalformedJpeg:
        return None
    if frames != 1 or scans < 1:
        return None
    if kept[-1][1] == len(data) and all(end == start for (_, end), (start, _) in pairwise(kept)):
        return data  # nothing dropped: the caller's bytes as they are, not a copy
    return b"".join(data[start:end] for start, end in kept)
